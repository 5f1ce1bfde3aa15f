//! The fake GPU's virtual timeline, shared by every process that uses the fake driver.
//!
//! Each launch carries a simulated duration. A device executes the launches of all
//! processes in arrival order: a launch starts at `max(now, busy_until)` and ends
//! `duration` later; `busy_until` is advanced with a compare-and-swap, so processes
//! need no lock. When more than `queue_cap` nanoseconds of work are queued, a launch
//! waits (a real GPU's launch queue is bounded too).
//!
//! Busy time is recorded in rings of 1 ms buckets, one ring per device and one per
//! process on it, so NVML can answer "utilisation over the window since T" for any
//! window up to 2 s. Each bucket is one `u64` packing (bucket number << 24 | busy ns),
//! updated by CAS, so a bucket is reset and added to atomically.
//!
//! Time is a parameter of every method (`now`, nanoseconds of `CLOCK_MONOTONIC`), so
//! the logic is tested with an injected clock; `mapped()` is the process's shared
//! instance (the file `FAKE_CUDA_STATE`, or private memory when that is unset). Its
//! `dev` arguments are rows (`gpus::slot` of a device ordinal: GPUs by UUID).
//! All-zero bytes are a valid empty timeline: a new file needs no initialisation.

use std::sync::atomic::{AtomicU64, Ordering};

/// Devices with a timeline.
pub const TL_DEVICES: usize = 16;
/// Processes per device with their own utilisation ring.
pub const TL_PROCS: usize = 64;
pub const RING: usize = 2048;
pub const BUCKET_NS: u64 = 1_000_000;
const BUSY_BITS: u32 = 24;
const BUSY_MASK: u64 = (1 << BUSY_BITS) - 1;

#[repr(C)]
pub struct Ring {
    b: [AtomicU64; RING],
}

impl Ring {
    fn add_bucket(&self, bucket: u64, ns: u64) {
        let cell = &self.b[(bucket % RING as u64) as usize];
        let mut v = cell.load(Ordering::Relaxed);
        loop {
            let tag = v >> BUSY_BITS;
            let new = if tag == bucket {
                (v & !BUSY_MASK) | ((v & BUSY_MASK) + ns).min(BUSY_MASK)
            } else if tag < bucket {
                (bucket << BUSY_BITS) | ns.min(BUSY_MASK)
            } else {
                return; // the cell already holds a newer bucket
            };
            match cell.compare_exchange_weak(v, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(x) => v = x,
            }
        }
    }

    /// Records busy time over `[start, end)`.
    pub fn add(&self, start: u64, end: u64) {
        let mut t = start;
        while t < end {
            let bucket = t / BUCKET_NS;
            let stop = ((bucket + 1) * BUCKET_NS).min(end);
            self.add_bucket(bucket, stop - t);
            t = stop;
        }
    }

    /// Busy nanoseconds in `[a, b)` (edge buckets pro rata). Windows longer than the ring
    /// are cut to its length.
    pub fn busy(&self, a: u64, b: u64) -> u64 {
        if b <= a {
            return 0;
        }
        let a = a.max(b.saturating_sub((RING as u64 - 2) * BUCKET_NS));
        let mut total = 0u128;
        let mut bucket = a / BUCKET_NS;
        while bucket * BUCKET_NS < b {
            let v = self.b[(bucket % RING as u64) as usize].load(Ordering::Acquire);
            if v >> BUSY_BITS == bucket {
                let lo = (bucket * BUCKET_NS).max(a);
                let hi = ((bucket + 1) * BUCKET_NS).min(b);
                total += (v & BUSY_MASK) as u128 * (hi - lo) as u128 / BUCKET_NS as u128;
            }
            bucket += 1;
        }
        total as u64
    }
}

#[repr(C)]
pub struct ProcSlot {
    /// The process's key (`pidns::key`: PID-namespace inode and PID there); 0 = free.
    pub key: AtomicU64,
    /// Busy time of every launch of this process so far (queued work included).
    pub total: AtomicU64,
    pub ring: Ring,
}

#[repr(C)]
pub struct DeviceTimeline {
    pub busy_until: AtomicU64,
    pub total: AtomicU64,
    pub ring: Ring,
    pub procs: [ProcSlot; TL_PROCS],
}

#[repr(C)]
pub struct Timeline {
    pub devs: [DeviceTimeline; TL_DEVICES],
}

pub const TIMELINE_SIZE: usize = std::mem::size_of::<Timeline>();

/// Where a launch was placed, or how long to wait before trying again.
#[derive(Debug, PartialEq, Eq)]
pub enum Enqueue {
    Placed { start: u64, end: u64 },
    Wait(u64),
}

impl Timeline {
    /// Places a launch of `dur` ns on device `dev` at time `now`, unless more than
    /// `cap` ns of work are queued. `key`: the launching process (`pidns::key`).
    pub fn enqueue(&self, dev: usize, key: u64, dur: u64, now: u64, cap: u64) -> Enqueue {
        let Some(d) = self.devs.get(dev) else {
            // A device without a timeline: the launch takes no time.
            return Enqueue::Placed {
                start: now,
                end: now,
            };
        };
        let mut bu = d.busy_until.load(Ordering::Acquire);
        let (start, end) = loop {
            if bu > now.saturating_add(cap) {
                return Enqueue::Wait(bu - now - cap);
            }
            let start = bu.max(now);
            let end = start + dur;
            match d
                .busy_until
                .compare_exchange_weak(bu, end, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break (start, end),
                Err(x) => bu = x,
            }
        };
        d.total.fetch_add(dur, Ordering::Relaxed);
        d.ring.add(start, end);
        if let Some(p) = self.proc_slot(dev, key, true) {
            p.total.fetch_add(dur, Ordering::Relaxed);
            p.ring.add(start, end);
        }
        Enqueue::Placed { start, end }
    }

    /// The slot of process `key` on `dev` (claimed when `create`; a dead process's slot is
    /// reused).
    pub fn proc_slot(&self, dev: usize, key: u64, create: bool) -> Option<&ProcSlot> {
        let d = self.devs.get(dev)?;
        if let Some(p) = d
            .procs
            .iter()
            .find(|p| p.key.load(Ordering::Acquire) == key)
        {
            return Some(p);
        }
        if !create {
            return None;
        }
        for p in &d.procs {
            let cur = p.key.load(Ordering::Acquire);
            if (cur == 0 || !crate::pidns::alive(cur))
                && p.key
                    .compare_exchange(cur, key, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                p.total.store(0, Ordering::Relaxed);
                for c in &p.ring.b {
                    c.store(0, Ordering::Relaxed);
                }
                return Some(p);
            }
        }
        None
    }

    /// (key, busy ns in `[a, b)`) of every process seen on `dev`.
    pub fn proc_busy(&self, dev: usize, a: u64, b: u64) -> Vec<(u64, u64)> {
        self.devs.get(dev).map_or(Vec::new(), |d| {
            d.procs
                .iter()
                .filter_map(|p| {
                    let k = p.key.load(Ordering::Acquire);
                    (k != 0).then(|| (k, p.ring.busy(a, b)))
                })
                .collect()
        })
    }

    pub fn device_busy(&self, dev: usize, a: u64, b: u64) -> u64 {
        self.devs.get(dev).map_or(0, |d| d.ring.busy(a, b))
    }
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn realtime_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

pub fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: valid timespec; an interrupted sleep just returns early.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// The process's timeline: `FAKE_CUDA_STATE` mapped shared, or private zeroed memory.
pub fn mapped() -> &'static Timeline {
    use std::sync::OnceLock;
    static TL: OnceLock<usize> = OnceLock::new();
    let p = *TL.get_or_init(|| {
        let shared = crate::gpus::shared_path().and_then(map_file);
        shared.unwrap_or_else(|| {
            // SAFETY: anonymous zeroed mapping of TIMELINE_SIZE bytes.
            let m = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    TIMELINE_SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert!(m != libc::MAP_FAILED, "fake-cuda: cannot map the timeline");
            m as usize
        })
    });
    // SAFETY: p is a live mapping of TIMELINE_SIZE bytes, never unmapped; all-zero bytes
    // are a valid Timeline (atomics only).
    unsafe { &*(p as *const Timeline) }
}

fn map_file(path: &str) -> Option<usize> {
    crate::shm::map_shared(path, TIMELINE_SIZE).map(|m| m as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> &'static Timeline {
        let layout = std::alloc::Layout::new::<Timeline>();
        // SAFETY: a zeroed heap block of Timeline's layout (too big for the stack) is a
        // valid Timeline (atomics only); leaked for the test's duration.
        unsafe { &*(std::alloc::alloc_zeroed(layout) as *const Timeline) }
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn launches_of_all_processes_run_in_order() {
        let t = fresh();
        let now = 1000 * MS;
        assert_eq!(
            t.enqueue(0, 10, 2 * MS, now, 50 * MS),
            Enqueue::Placed {
                start: now,
                end: now + 2 * MS
            }
        );
        assert_eq!(
            t.enqueue(0, 11, 3 * MS, now + MS, 50 * MS),
            Enqueue::Placed {
                start: now + 2 * MS,
                end: now + 5 * MS
            }
        );
        // Another device is independent.
        assert_eq!(
            t.enqueue(1, 11, MS, now, 50 * MS),
            Enqueue::Placed {
                start: now,
                end: now + MS
            }
        );
        // The queue is bounded.
        assert_eq!(
            t.enqueue(0, 10, 60 * MS, now + 2 * MS, 50 * MS),
            Enqueue::Placed {
                start: now + 5 * MS,
                end: now + 65 * MS
            }
        );
        assert_eq!(
            t.enqueue(0, 10, MS, now + 5 * MS, 50 * MS),
            Enqueue::Wait(10 * MS)
        );
    }

    #[test]
    fn utilisation_per_process_and_device() {
        let t = fresh();
        let base = 5000 * MS;
        // pid 1: 30 % of every 10 ms over 1 s; pid 2: 20 %.
        for i in 0..100 {
            let now = base + i * 10 * MS;
            t.enqueue(0, 1, 3 * MS, now, 50 * MS);
            t.enqueue(0, 2, 2 * MS, now, 50 * MS);
        }
        let end = base + 1000 * MS;
        let per = t.proc_busy(0, base, end);
        assert!(per.contains(&(1, 300 * MS)), "{per:?}");
        assert!(per.contains(&(2, 200 * MS)), "{per:?}");
        assert_eq!(t.device_busy(0, base, end), 500 * MS);
        // Half a window: pro rata.
        assert_eq!(t.device_busy(0, base, base + 500 * MS), 250 * MS);
        // Future work is not counted as done.
        assert_eq!(t.device_busy(0, end, end + 100 * MS), 0);
    }

    #[test]
    fn the_same_pid_in_two_namespaces_is_two_processes() {
        let t = fresh();
        let (a, b) = (crate::pidns::key(7, 1), crate::pidns::key(8, 1));
        let now = 3000 * MS;
        t.enqueue(2, a, 4 * MS, now, 50 * MS);
        t.enqueue(2, b, MS, now, 50 * MS);
        let mut per = t.proc_busy(2, now, now + 10 * MS);
        per.sort();
        assert_eq!(per, vec![(a, 4 * MS), (b, MS)]);
    }
}
