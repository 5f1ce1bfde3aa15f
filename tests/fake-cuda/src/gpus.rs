//! The GPU directory: which row of the shared tables belongs to which GPU.
//!
//! The shared tables (`$FAKE_CUDA_STATE` timeline, `.procs`, `.limits`) have one row per
//! device. A process names its devices by *local* ordinals (the order of its
//! `FAKE_CUDA_UUIDS`), and containers of different claims list different GPUs (a claim on
//! the node's second GPU sees it as its device 0), so rows are keyed by **UUID**: the
//! file `$FAKE_CUDA_STATE.gpus` holds a version word and [`ENTRIES`] UUIDs, and a device's
//! row (its *slot*) is the index of its UUID there. An entry is claimed by
//! compare-and-swap on first use and never freed (a node's GPUs do not change).
//!
//! Each process resolves local ordinal → UUID → slot for all its devices once, when a
//! table is first used ([`slot`]). When the directory is full, of another layout, or
//! cannot be mapped, the process says so on stderr (once) and keeps **all** its tables
//! private, as without `FAKE_CUDA_STATE` (nobody else sees it; it sees nobody). Without
//! `FAKE_CUDA_STATE` a slot is the local ordinal.
//!
//! Entry states (the `state` word): 0 free; [`READY`] holds a UUID; anything else is
//! being written by the process of that key (`pidns::key`). A claimer stores its key by
//! CAS, writes the UUID, then publishes [`READY`]; a process meeting an entry being
//! written waits for it (it may be the UUID it is looking for), and resets it when its
//! writer died mid-claim. So an entry is always claimed before any higher one is looked
//! at, and one UUID never gets two entries.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Entries of the directory (the fake's device limit).
pub const ENTRIES: usize = 16;
/// No slot (a device the process does not have).
pub const NONE: usize = ENTRIES;
/// `state` of an entry holding a UUID.
pub const READY: u64 = u64::MAX;
/// The directory's version word ("FGPUDIR1").
pub const MAGIC: u64 = u64::from_le_bytes(*b"FGPUDIR1");
/// How long a claim waits for an entry another live process is writing.
const CLAIM_WAIT: Duration = Duration::from_secs(2);

#[repr(C)]
pub struct Entry {
    state: AtomicU64,
    uuid: [AtomicU64; 2],
}

/// The file's layout: version word, then the entries. All zero: a new, empty directory.
#[repr(C)]
pub struct Dir {
    magic: AtomicU64,
    entries: [Entry; ENTRIES],
}

pub const DIR_SIZE: usize = std::mem::size_of::<Dir>();

/// Why a process cannot have shared rows.
#[derive(Debug, PartialEq, Eq)]
pub enum NoSlot {
    /// Every entry holds another UUID.
    Full,
    /// The file has another layout (version word).
    Layout(u64),
    /// An entry stayed in the middle of a live process's claim for [`CLAIM_WAIT`].
    Stuck,
}

fn halves(u: &[u8; 16]) -> [u64; 2] {
    let (a, b) = u.split_at(8);
    [
        u64::from_le_bytes(a.try_into().unwrap_or_default()),
        u64::from_le_bytes(b.try_into().unwrap_or_default()),
    ]
}

impl Dir {
    /// Checks (or, in a new file, writes) the version word.
    pub fn check_layout(&self) -> Result<(), NoSlot> {
        match self
            .magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(m) if m == MAGIC => Ok(()),
            Err(m) => Err(NoSlot::Layout(m)),
        }
    }

    /// The slot of `uuid`, claimed when absent. `me`: the caller's key (non-zero, not
    /// [`READY`]); `alive`: whether the process of a key is alive.
    pub fn claim(
        &self,
        uuid: &[u8; 16],
        me: u64,
        alive: impl Fn(u64) -> bool,
    ) -> Result<usize, NoSlot> {
        let want = halves(uuid);
        let deadline = Instant::now() + CLAIM_WAIT;
        'scan: loop {
            for (i, e) in self.entries.iter().enumerate() {
                let s = e.state.load(Ordering::Acquire);
                if s == READY {
                    if e.uuid[0].load(Ordering::Relaxed) == want[0]
                        && e.uuid[1].load(Ordering::Relaxed) == want[1]
                    {
                        return Ok(i);
                    }
                    continue;
                }
                if s == 0 {
                    if e.state
                        .compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        e.uuid[0].store(want[0], Ordering::Relaxed);
                        e.uuid[1].store(want[1], Ordering::Relaxed);
                        e.state.store(READY, Ordering::Release);
                        return Ok(i);
                    }
                    continue 'scan; // someone else is claiming it: look again
                }
                // Being written by process `s`: wait (it may be our UUID), or free it
                // when that process died mid-claim.
                if s != me && !alive(s) {
                    let _ = e
                        .state
                        .compare_exchange(s, 0, Ordering::AcqRel, Ordering::Relaxed);
                } else if Instant::now() >= deadline {
                    return Err(NoSlot::Stuck);
                } else {
                    std::thread::sleep(Duration::from_micros(200));
                }
                continue 'scan;
            }
            return Err(NoSlot::Full);
        }
    }

    /// The UUIDs of the entries in use, in slot order (for tests and debugging).
    pub fn uuids(&self) -> Vec<Option<[u64; 2]>> {
        self.entries
            .iter()
            .map(|e| {
                (e.state.load(Ordering::Acquire) == READY).then(|| {
                    [
                        e.uuid[0].load(Ordering::Relaxed),
                        e.uuid[1].load(Ordering::Relaxed),
                    ]
                })
            })
            .collect()
    }
}

/// `path` mapped shared, created and grown to [`DIR_SIZE`] as needed (zero-filled).
fn map_file(path: &str) -> Option<&'static Dir> {
    let m = crate::shm::map_shared(path, DIR_SIZE)?;
    // SAFETY: a live shared mapping of DIR_SIZE bytes, never unmapped; any bytes are a
    // valid Dir (atomics only).
    Some(unsafe { &*(m as *const Dir) })
}

struct Resolved {
    /// `FAKE_CUDA_STATE` when this process's rows are shared.
    shared: Option<String>,
    /// Slot of each local ordinal (shared mode).
    slots: Vec<usize>,
}

fn resolved() -> &'static Resolved {
    static R: OnceLock<Resolved> = OnceLock::new();
    R.get_or_init(|| {
        let Some(path) = std::env::var("FAKE_CUDA_STATE")
            .ok()
            .filter(|p| !p.is_empty())
        else {
            return Resolved {
                shared: None,
                slots: Vec::new(),
            };
        };
        let file = format!("{path}.gpus");
        let n = crate::config().sizes.len();
        // Alive for the others before our key is in an entry being written.
        crate::pidns::register(false);
        let me = crate::pidns::own_key();
        let slots = match map_file(&file) {
            None => Err(format!("cannot map {file}")),
            Some(d) => d
                .check_layout()
                .and_then(|()| {
                    (0..n)
                        .map(|i| d.claim(&crate::device_uuid(i), me, crate::pidns::alive))
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(|e| match e {
                    NoSlot::Full => {
                        format!("the GPU directory {file} is full ({ENTRIES} other GPUs)")
                    }
                    NoSlot::Layout(m) => {
                        format!("{file} has another layout (version word {m:#x})")
                    }
                    NoSlot::Stuck => format!("an entry of {file} stayed half-written"),
                }),
        };
        match slots {
            Ok(slots) => Resolved {
                shared: Some(path),
                slots,
            },
            Err(why) => {
                eprintln!(
                    "fake-cuda: {why}; this process keeps its GPU tables private \
                     (other processes and NVML readers do not see it, nor it them)"
                );
                Resolved {
                    shared: None,
                    slots: Vec::new(),
                }
            }
        }
    })
}

/// `FAKE_CUDA_STATE` when the process's tables are shared (set, and every device has a
/// slot in the directory); None: private tables.
pub fn shared_path() -> Option<&'static str> {
    resolved().shared.as_deref()
}

/// The table row of local device `dev`: its UUID's directory slot with shared tables,
/// `dev` itself with private ones; [`NONE`] for a device the process does not have.
pub fn slot(dev: usize) -> usize {
    let r = resolved();
    if r.shared.is_none() {
        return if dev < ENTRIES { dev } else { NONE };
    }
    r.slots.get(dev).copied().unwrap_or(NONE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> &'static Dir {
        // SAFETY: a zeroed, leaked heap block of Dir's layout is a valid Dir (atomics only).
        unsafe { &*(std::alloc::alloc_zeroed(std::alloc::Layout::new::<Dir>()) as *const Dir) }
    }

    fn uuid(i: u8) -> [u8; 16] {
        let mut u = [0x5a; 16];
        u[15] = i;
        u
    }

    #[test]
    fn slots_follow_uuids_not_the_order_a_process_lists_them() {
        let d = fresh();
        assert_eq!(d.check_layout(), Ok(()));
        assert_eq!(d.check_layout(), Ok(()));
        // Process A lists GPU-1, GPU-0; process B lists GPU-0 only.
        assert_eq!(d.claim(&uuid(1), 7, |_| true), Ok(0));
        assert_eq!(d.claim(&uuid(0), 7, |_| true), Ok(1));
        assert_eq!(d.claim(&uuid(0), 8, |_| true), Ok(1));
        assert_eq!(d.claim(&uuid(1), 8, |_| true), Ok(0));
        assert_eq!(d.uuids()[0], Some(halves(&uuid(1))));
        assert_eq!(d.uuids()[2], None);
    }

    #[test]
    fn a_full_directory_and_another_layout_are_refused() {
        let d = fresh();
        for i in 0..ENTRIES as u8 {
            assert_eq!(d.claim(&uuid(i), 7, |_| true), Ok(i as usize));
        }
        assert_eq!(d.claim(&uuid(3), 7, |_| true), Ok(3));
        assert_eq!(d.claim(&uuid(200), 7, |_| true), Err(NoSlot::Full));
        let other = fresh();
        other.magic.store(42, Ordering::Relaxed);
        assert_eq!(other.check_layout(), Err(NoSlot::Layout(42)));
    }

    #[test]
    fn a_claim_left_half_done_by_a_dead_process_is_taken_over() {
        let d = fresh();
        d.entries[0].state.store(99, Ordering::Relaxed);
        d.entries[0].uuid[0].store(1, Ordering::Relaxed);
        assert_eq!(d.claim(&uuid(4), 7, |k| k != 99), Ok(0));
        assert_eq!(d.uuids()[0], Some(halves(&uuid(4))));
        // A live writer that never finishes: the claim gives up instead of hanging.
        let s = fresh();
        s.entries[0].state.store(99, Ordering::Relaxed);
        let t = Instant::now();
        assert_eq!(s.claim(&uuid(4), 7, |_| true), Err(NoSlot::Stuck));
        assert!(t.elapsed() >= CLAIM_WAIT);
    }

    #[test]
    fn racing_claimers_agree_on_every_slot() {
        for _ in 0..20 {
            let d = fresh();
            let got: Vec<Vec<usize>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..4u64)
                    .map(|t| {
                        s.spawn(move || {
                            // Each thread lists the 6 UUIDs in its own order.
                            (0..6u8)
                                .map(|i| {
                                    let u = (i + t as u8 * 2) % 6;
                                    (u, d.claim(&uuid(u), t + 1, |_| true).unwrap())
                                })
                                .fold(vec![0; 6], |mut v, (u, slot)| {
                                    v[u as usize] = slot;
                                    v
                                })
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(got.iter().all(|g| g == &got[0]), "{got:?}");
            let mut slots = got[0].clone();
            slots.sort();
            assert_eq!(slots, (0..6).collect::<Vec<_>>());
        }
    }
}
