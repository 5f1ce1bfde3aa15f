//! The core (SM) limiter and task priority. See README.md, "Core quota".
//!
//! Per (claim, GPU), in the claim's file `fgpu-core.state`:
//! * a **GCRA token bucket** in GPU time: each launch costs `units × k` GPU-nanoseconds
//!   (`units` = thread blocks of a kernel, [`GRAPH_UNITS`] for a graph) and pushes the
//!   bucket's theoretical arrival time `tat` forward by `cost / quota` wall-nanoseconds;
//!   a launch waits (sleeps) until `tat` is at most [`BURST_NS`] ahead of now. One CAS,
//!   no lock: a process killed anywhere leaves at most its own reservation behind. A
//!   thread takes bucket time in small leases and batches its units per coarse tick
//!   ([`reserve`], [`count`]), so most launches do not write the shared line.
//! * a **feedback loop** that keeps `k` (GPU-ns per unit) equal to the measured cost:
//!   every [`PERIOD_NS`] one launching thread (elected by CAS, any process) reads the
//!   claim's GPU time from NVML (`nvmlDeviceGetProcessUtilization`, summed over the
//!   claim's processes) and the units launched in the period, and folds them into
//!   exponentially weighted sums; `k = busy / units` ([`Estimate`], convergence argued
//!   there and in README.md).
//!
//! Priority: a high-priority process stamps `last_high_ns` in the GPU's file in
//! `FGPU_GPU_DIR` on every launch; a low-priority launch sleeps while the stamp is
//! younger than [`QUIET_NS`].
//!
//! The pure parts ([`admit`], [`Estimate`]) take time as a parameter and are tested with
//! a simulated GPU below.

use std::ffi::{CString, c_int, c_uint, c_void};
use std::path::Path;
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::boundary::Batch;
use crate::config::{CorePolicy, MAX_DEVICES, Priority};
use crate::ffi::*;
use crate::process::config;
use crate::real;
use crate::{feed, identity};

/// Control period of the feedback loop.
pub const PERIOD_NS: u64 = 100_000_000;
/// How far (wall time) the bucket may run ahead of now: absorbs wake-up jitter.
pub const BURST_NS: u64 = 20_000_000;
/// Weight of the newest period in the controller's sums.
pub const ALPHA: f64 = 0.3;
/// First guess of GPU-ns per unit, before any measurement.
pub const K0: f64 = 1000.0;
pub const K_MIN: f64 = 0.5;
pub const K_MAX: f64 = 1e9;
/// Units of one graph launch (its real cost is learnt by the feedback like any other).
pub const GRAPH_UNITS: u64 = 1024;
/// A low-priority launch waits while a high-priority launch happened this recently.
pub const QUIET_NS: u64 = 40_000_000;
const PRIO_POLL_NS: u64 = 5_000_000;
/// Longest single wait of a launch (bounds the damage of a corrupted file).
const MAX_WAIT_NS: u64 = 1_000_000_000;
/// An unidentified process launching this recently makes NVML's samples unusable.
const UNKNOWN_NS: u64 = 1_000_000_000;

// ------------------------------------------------------------ pure parts

/// GCRA admission of a launch costing `inc` wall-ns of bucket time at `now`:
/// (new theoretical arrival time, how long the launch must wait).
#[inline]
pub fn admit(tat: u64, now: u64, inc: u64, burst: u64) -> (u64, u64) {
    let start = tat.max(now);
    (
        start.saturating_add(inc),
        start.saturating_sub(now.saturating_add(burst)),
    )
}

/// The controller's state: exponentially weighted sums of the GPU time measured
/// (`busy`) and of the units launched (`units`) per period; `k = busy / units`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub busy: f64,
    pub units: f64,
}

impl Estimate {
    pub const NONE: Estimate = Estimate {
        busy: 0.0,
        units: 0.0,
    };

    /// GPU-ns per unit; [`K0`] before any measurement.
    pub fn k(&self) -> f64 {
        if self.units <= 0.0 {
            K0
        } else {
            (self.busy / self.units).clamp(K_MIN, K_MAX)
        }
    }

    /// One control step with the last period's launched `units` and measured `busy_ns`.
    /// The first measurement is taken whole; then each period weighs [`ALPHA`].
    /// Why it converges: over any interval, the GPU time of the claim's work equals the
    /// cost of the units it launched, give or take the work in flight at the two ends
    /// (bounded by the burst and the device queue). The weighted sums therefore tend to
    /// `c · Σw·units` (c = true mean cost per unit) with an error that shrinks as
    /// 1/(number of periods in the filter's memory), so `k → c`; with `k = c` the bucket
    /// grants `q·T/k` units per period, whose GPU time is `q·T`: utilisation → quota.
    /// A change of cost is followed geometrically, by a factor `(1-α)` per period.
    pub fn step(self, units: u64, busy_ns: f64) -> Estimate {
        if units == 0 && busy_ns <= 0.0 {
            return self; // nothing launched, nothing ran: no information
        }
        if self.units <= 0.0 {
            return Estimate {
                busy: busy_ns,
                units: units as f64,
            };
        }
        Estimate {
            busy: (1.0 - ALPHA) * self.busy + ALPHA * busy_ns,
            units: (1.0 - ALPHA) * self.units + ALPHA * units as f64,
        }
    }
}

/// Wall-ns of bucket time for `units` at estimate `k` and quota `pct` (the reference
/// for [`increment_fp`], which the launch path uses).
#[inline]
pub fn increment(units: u64, k: f64, pct: u32) -> u64 {
    (units as f64 * k * 100.0 / pct.max(1) as f64) as u64
}

/// Fraction bits of [`k_fixed`].
const K_FRAC: u32 = 16;
/// Fraction bits of [`quota_scale`].
const SCALE_FRAC: u32 = 32;

/// `k` (GPU-ns per unit) in fixed point, as the control step publishes it in the entry
/// (`k_fp`): the launch path then needs no float and no division. Never 0 (0 in the
/// entry means "not published yet").
#[inline]
pub fn k_fixed(k: f64) -> u64 {
    ((k.clamp(K_MIN, K_MAX) * (1u64 << K_FRAC) as f64).round() as u64).max(1)
}

/// `100 / pct` in fixed point, computed once per device.
#[inline]
pub fn quota_scale(pct: u32) -> u64 {
    ((100u64 << SCALE_FRAC) / pct.max(1) as u64).max(1)
}

/// Bucket time per unit, `k_fp · scale` (48 fraction bits), if it fits in a `u64`: what
/// a thread caches for its launches within a clock tick ([`increment_at`]). It fits
/// while a unit costs less than 2^16 ns of bucket time; a costlier unit is more than a
/// whole lease ([`LEASE_MAX_NS`]), so its launches take the full path anyway.
#[inline]
pub fn unit_rate(k_fp: u64, scale: u64) -> Option<u64> {
    u64::try_from(k_fp as u128 * scale as u128).ok()
}

/// [`increment_fp`] from a [`unit_rate`]: one multiply. The same integer (the product is
/// associative and both drop the fraction only at the end), not saturated: a result
/// above `u64::MAX` stays above (the caller compares it with a lease).
#[inline(always)]
pub fn increment_at(units: u64, rate: u64) -> u128 {
    (units as u128 * rate as u128) >> (K_FRAC + SCALE_FRAC)
}

/// [`increment`] with `k = k_fp / 2^16` and `100 / pct = scale / 2^32`: two integer
/// multiplies; saturates like the float cast.
#[inline]
pub fn increment_fp(units: u64, k_fp: u64, scale: u64) -> u64 {
    // units < 2^64 and k_fp <= K_MAX·2^16 < 2^46: the first product fits in a u128;
    // both fractions are dropped only at the end (a launch of 1 block at k = 0.5 costs
    // 1 ns at 50 %, not 0).
    let cost = units as u128 * k_fp as u128;
    match cost.checked_mul(scale as u128) {
        Some(x) => u64::try_from(x >> (K_FRAC + SCALE_FRAC)).unwrap_or(u64::MAX),
        None => u64::MAX,
    }
}

// ------------------------------------------------------------ the claim's file

const MAGIC: u64 = u64::from_le_bytes(*b"FGPUCOR1");
const PIDS: usize = 32;
const FLAG_ALONE: u32 = 2;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: u32,
    entry_size: u32,
    _reserved: [u64; 6],
}

/// One (claim, GPU) limiter; 256 bytes.
#[repr(C)]
pub struct Entry {
    /// The GPU's UUID (16 bytes), written before `state` is published.
    uuid: [AtomicU64; 2],
    /// 0 free, 2 being claimed, 1 in use.
    state: AtomicU32,
    flags: AtomicU32,
    tat: AtomicU64,
    est_busy: AtomicU64,
    est_units: AtomicU64,
    units: AtomicU64,
    next_ctrl: AtomicU64,
    last_ctrl_us: AtomicU64,
    /// NVML PIDs of the claim's identified processes (host PIDs; 0 free). A PID that
    /// is not in the device's running-process list any more is free for reuse.
    pids: [AtomicU32; PIDS],
    /// Last launch (`CLOCK_MONOTONIC_COARSE` ns) of a process of the claim that could
    /// not identify itself: while recent, NVML's samples cannot tell the claim's work.
    unknown_ns: AtomicU64,
    /// [`k_fixed`] of the estimate, published by the control step after `est_*`
    /// (0: not yet; the launch derives it from `est_*`).
    k_fp: AtomicU64,
    /// Bumped after a PID in `pids` is replaced: every process then checks that its own
    /// is still there (a process left out would have its work counted as another's).
    pids_gen: AtomicU64,
    /// Wall time the claim's launches waited for the bucket, in ns (informational: the
    /// node's metrics read it; a tenant can write it, nothing enforces by it).
    throttled_ns: AtomicU64,
    _reserved: [u64; 3],
}

const HEADER_SIZE: usize = 64;
const ENTRY_SIZE: usize = 256;
/// Size of a core account (`core.state`): the plugin creates it zero-filled at this size.
pub const FILE_SIZE: usize = HEADER_SIZE + MAX_DEVICES * ENTRY_SIZE;
const _: () = assert!(std::mem::size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<Entry>() == ENTRY_SIZE);
// The fields the node's plugin reads back (docs/shim-contract.md, "The accounts").
const _: () = assert!(std::mem::offset_of!(Entry, state) == 16);
const _: () = assert!(std::mem::offset_of!(Entry, throttled_ns) == 224);

fn private_map(size: usize) -> *mut u8 {
    // SAFETY: anonymous zeroed mapping.
    let m = unsafe {
        libc::mmap(
            null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if m == libc::MAP_FAILED {
        Box::leak(vec![0u64; size / 8].into_boxed_slice()).as_mut_ptr() as *mut u8
    } else {
        m as *mut u8
    }
}

/// How a shared file is opened.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    /// Env mode: created if missing (mode given), grown to the size.
    Create(libc::c_uint),
    /// Claim mode: the plugin's file, read-write, never created, exactly the size.
    Existing,
    /// Claim mode, read only (a priority file of a claim that is not high priority).
    ReadOnly,
}

/// Maps `path` shared. Never follows a symlink; only a regular file; `Err` says why.
fn map_file(path: &Path, size: usize, how: Open) -> Result<*mut u8, String> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    let (flags, mode) = match how {
        Open::Create(m) => (libc::O_RDWR | libc::O_CREAT, m),
        Open::Existing => (libc::O_RDWR, 0),
        Open::ReadOnly => (libc::O_RDONLY, 0),
    };
    // SAFETY: c is a valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: st is written by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is ours. Growing a file zero-fills it; two processes growing it to the
    // same size concurrently is harmless.
    let checked = unsafe {
        if libc::fstat(fd, &mut st) != 0 {
            Err(std::io::Error::last_os_error().to_string())
        } else if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            Err("not a regular file".to_string())
        } else {
            match how {
                // A hard link planted to another file: refused (it would be stamped).
                Open::Create(_) if st.st_nlink != 1 => Err("has other hard links".to_string()),
                Open::Create(m) => {
                    // Only a file of our own making is opened up to other claims.
                    if st.st_uid == libc::geteuid() {
                        libc::fchmod(fd, m as libc::mode_t);
                    }
                    if (st.st_size as usize) >= size
                        || libc::ftruncate(fd, size as libc::off_t) == 0
                    {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error().to_string())
                    }
                }
                _ if (st.st_size as usize) < size => {
                    Err(format!("size {}, expected at least {size}", st.st_size))
                }
                _ => Ok(()),
            }
        }
    };
    let prot = if how == Open::ReadOnly {
        libc::PROT_READ
    } else {
        libc::PROT_READ | libc::PROT_WRITE
    };
    // SAFETY: shared mapping of a file at least `size` long.
    let m =
        checked.map(|()| unsafe { libc::mmap(null_mut(), size, prot, libc::MAP_SHARED, fd, 0) });
    // SAFETY: fd is ours; the mapping outlives it.
    unsafe { libc::close(fd) };
    match m {
        Ok(m) if m != libc::MAP_FAILED => Ok(m as *mut u8),
        Ok(_) => Err(std::io::Error::last_os_error().to_string()),
        Err(e) => Err(e),
    }
}

struct CoreFile {
    base: *mut u8,
    /// Configured but unusable: the claim's quota cannot be shared, so its devices are
    /// held to the smallest quota (fail closed).
    broken: bool,
}

// SAFETY: the mapping is only accessed through atomics.
unsafe impl Sync for CoreFile {}
// SAFETY: as above.
unsafe impl Send for CoreFile {}

impl CoreFile {
    /// The claim's limiter file. Env mode creates it; claim mode needs the plugin's
    /// file with a zero or valid header. Unusable: `broken` (the caller fails closed).
    fn open(path: Option<&Path>, claim_mode: bool) -> CoreFile {
        let Some(p) = path else {
            return CoreFile {
                base: private_map(FILE_SIZE),
                broken: false,
            };
        };
        match Self::map_shared(p, claim_mode) {
            Ok(base) => CoreFile {
                base,
                broken: false,
            },
            Err(e) => {
                crate::log::always(format_args!(
                    "core account {}: {e}; launches limited to 1% until it is fixed",
                    p.display()
                ));
                CoreFile {
                    base: private_map(FILE_SIZE),
                    broken: true,
                }
            }
        }
    }
    /// Maps the limiter file at `p` shared and checks its size (claim mode) and header.
    fn map_shared(p: &Path, claim_mode: bool) -> Result<*mut u8, String> {
        let how = if claim_mode {
            Open::Existing
        } else {
            Open::Create(0o660)
        };
        let exact = match std::fs::symlink_metadata(p) {
            Ok(m) if claim_mode && m.len() != FILE_SIZE as u64 => Err(format!(
                "size {}, expected exactly {FILE_SIZE} (core::FILE_SIZE)",
                m.len()
            )),
            _ => Ok(()),
        };
        exact
            .and_then(|()| map_file(p, FILE_SIZE, how))
            .and_then(|base| {
                // SAFETY: base maps FILE_SIZE bytes; Header is atomics + plain integers.
                let h = unsafe { &*(base as *const Header) };
                match h.magic.load(Ordering::Acquire) {
                    // All-zero is a valid empty state; the header only names the format.
                    0 => {
                        let _ =
                            h.magic
                                .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire);
                        Ok(base)
                    }
                    MAGIC => Ok(base),
                    _ => {
                        // SAFETY: unmapping what map_file mapped; not used afterwards.
                        unsafe { libc::munmap(base as *mut c_void, FILE_SIZE) };
                        Err("unknown magic".to_string())
                    }
                }
            })
    }

    fn entry(&self, i: usize) -> &Entry {
        // SAFETY: i < MAX_DEVICES; entries lie inside the mapping.
        unsafe { &*(self.base.add(HEADER_SIZE + i * ENTRY_SIZE) as *const Entry) }
    }
    /// The entry of GPU `uuid`, claimed if new.
    fn entry_for(&self, uuid: &[u8; 16]) -> Option<usize> {
        let lo = u64::from_le_bytes(uuid[..8].try_into().expect("8 bytes"));
        let hi = u64::from_le_bytes(uuid[8..].try_into().expect("8 bytes"));
        // Entries are claimed in order, first free first: two processes registering the
        // same GPU race for the same entry and the loser then finds the winner's. An
        // entry left half-claimed (state 2) by a process killed in between is waited
        // for a while, then passed over.
        for attempt in 0..2000 {
            let mut claiming = false;
            for i in 0..MAX_DEVICES {
                let e = self.entry(i);
                match e.state.load(Ordering::Acquire) {
                    1 if e.uuid[0].load(Ordering::Relaxed) == lo
                        && e.uuid[1].load(Ordering::Relaxed) == hi =>
                    {
                        return Some(i);
                    }
                    2 => claiming = true,
                    0 if !claiming || attempt >= 1000 => {
                        if e.state
                            .compare_exchange(0, 2, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                        {
                            e.uuid[0].store(lo, Ordering::Relaxed);
                            e.uuid[1].store(hi, Ordering::Relaxed);
                            e.state.store(1, Ordering::Release);
                            return Some(i);
                        }
                        break; // lost the race: scan again
                    }
                    _ => {}
                }
            }
            std::thread::yield_now();
        }
        None
    }
}

/// Fuzzing only (`fuzz/`, `tests/fuzz-targets`): maps the claim-mode limiter file at
/// `path` as the shim does, finds or claims the entry of GPU `uuid`, then unmaps it (the
/// shim never does). `Err` says why the file was refused; `Ok` is the entry, if any.
#[doc(hidden)]
pub fn fuzz_core_file(path: &Path, uuid: &[u8; 16]) -> Result<Option<usize>, String> {
    let file = CoreFile {
        base: CoreFile::map_shared(path, true)?,
        broken: false,
    };
    let entry = file.entry_for(uuid);
    // SAFETY: map_shared mapped FILE_SIZE bytes at base; `file` is not used afterwards.
    unsafe { libc::munmap(file.base as *mut c_void, FILE_SIZE) };
    Ok(entry)
}

// ------------------------------------------------------------ per process

struct Dev {
    /// Index of the claim's file in [`CoreProc::files`].
    file: usize,
    entry: usize,
    priority: Priority,
    policy: CorePolicy,
    pct: Option<u32>,
    /// [`quota_scale`] of `pct`.
    scale: u64,
    nvml: usize,
    prio: *const AtomicU64,
    uuid: [u8; 16],
    /// This process's NVML PID on the device (0: not identified).
    nvml_pid: AtomicU32,
    /// Identification attempts made (at most [`identity::ATTEMPTS`]).
    attempts: AtomicU32,
    /// The entry's `pids_gen` when this process last found its PID in `pids`
    /// ([`UNREGISTERED`]: not yet, or a fork made it another process).
    registered_gen: AtomicU64,
    /// No slot of `pids` was free: this process's launches count as an unidentified
    /// process's (see [`Entry::unknown_ns`]) until one is.
    overflow: AtomicBool,
}

/// [`Dev::registered_gen`] of a process not registered in the entry.
const UNREGISTERED: u64 = u64::MAX;

struct CoreProc {
    /// One limiter file per claim (env mode: one).
    files: Vec<CoreFile>,
    /// CUDA ordinal → leaked `Dev` (null: not resolved yet).
    devs: [AtomicPtr<Dev>; MAX_DEVICES],
}

static REGISTERED_RESET: AtomicU32 = AtomicU32::new(0);

extern "C" fn core_after_fork_child() {
    // An atomic store. The child registers its own pid again.
    REGISTERED_RESET.store(1, Ordering::Relaxed);
    // The forking thread's pending units are the parent's, which counts them: the child
    // drops its copy (plain stores into this thread's own TLS block).
    crate::boundary::with_thread(|t| t.launch.clear());
}

fn core_proc() -> &'static CoreProc {
    static P: OnceLock<CoreProc> = OnceLock::new();
    P.get_or_init(|| {
        // SAFETY: registering a handler that only stores an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(core_after_fork_child)) };
        find_vdso_clock();
        CoreProc {
            files: match &config().claims {
                Some(view) if view.refuse_all.is_none() => view
                    .claims
                    .iter()
                    .map(|c| CoreFile::open(c.core_account.as_deref(), true))
                    .collect(),
                Some(_) => vec![CoreFile::open(None, true)],
                None => vec![CoreFile::open(config().core_state_path.as_deref(), false)],
            },
            devs: Default::default(),
        }
    })
}

use crate::claims::uuid_string;

fn nvml_handle(uuid: &[u8; 16]) -> usize {
    static INIT: OnceLock<bool> = OnceLock::new();
    let ok = *INIT.get_or_init(|| {
        // SAFETY: nvmlInit_v2 has no arguments; NVML counts initialisations.
        real::nvmlInit_v2().is_some_and(|f| unsafe { f() } == NVML_SUCCESS)
    });
    let Some(f) = real::nvmlDeviceGetHandleByUUID().filter(|_| ok) else {
        return 0;
    };
    let Ok(s) = CString::new(uuid_string(uuid)) else {
        return 0;
    };
    let mut h: NvmlDevice = null_mut();
    // SAFETY: s is NUL-terminated; h is a valid out-pointer.
    if unsafe { f(s.as_ptr(), &mut h) } == NVML_SUCCESS {
        h as usize
    } else {
        0
    }
}

impl CoreProc {
    #[cold]
    fn resolve(&self, ord: c_int) -> Option<&'static Dev> {
        let o = usize::try_from(ord).ok().filter(|&o| o < MAX_DEVICES)?;
        let cur = self.devs[o].load(Ordering::Acquire);
        if !cur.is_null() {
            // SAFETY: a leaked Box<Dev>, never freed.
            return Some(unsafe { &*cur });
        }
        let uuid = crate::process::device_uuid(ord)?;
        let cfg = config();
        let (claim, priority, policy, prio_file) = match &cfg.claims {
            Some(view) => {
                let c = cfg.claim_of(&uuid);
                let (prio, path) = cfg.priority_of(&uuid);
                let policy = c.map_or(CorePolicy::Limit, |c| view.claims[c].core_policy);
                (
                    c.unwrap_or(0),
                    prio,
                    policy,
                    path.map(|p| (p.to_path_buf(), false)),
                )
            }
            None => (
                0,
                cfg.priority,
                cfg.core_policy,
                cfg.gpu_dir
                    .as_ref()
                    .map(|d| (d.join(format!("{}.priority", uuid_string(&uuid))), true)),
            ),
        };
        let file = claim.min(self.files.len() - 1);
        let prio = match (prio_file, priority) {
            (Some((path, env_mode)), Priority::High | Priority::Low) => {
                let how = match (env_mode, priority) {
                    (true, _) => Open::Create(0o666),
                    (false, Priority::High) => Open::Existing,
                    (false, _) => Open::ReadOnly,
                };
                match map_file(&path, 64, how) {
                    Ok(m) => m as *const AtomicU64,
                    Err(e) => {
                        crate::log::always(format_args!(
                            "priority file {}: {e}; priority ignored on this GPU",
                            path.display()
                        ));
                        std::ptr::null()
                    }
                }
            }
            _ => std::ptr::null(),
        };
        let pct = if self.files[file].broken {
            Some(1)
        } else {
            cfg.core_limit(ord)
        };
        let dev = Box::leak(Box::new(Dev {
            file,
            entry: self.files[file].entry_for(&uuid)?,
            priority,
            policy,
            pct,
            scale: quota_scale(pct.unwrap_or(100)),
            nvml: nvml_handle(&uuid),
            prio,
            uuid,
            nvml_pid: AtomicU32::new(0),
            attempts: AtomicU32::new(0),
            registered_gen: AtomicU64::new(UNREGISTERED),
            overflow: AtomicBool::new(false),
        }));
        if dev.pct.is_some() {
            try_identify(dev);
        }
        crate::debug!(
            "core: device {ord} quota {:?} policy {:?} priority {:?} nvml {}",
            dev.pct,
            cfg.core_policy,
            cfg.priority,
            dev.nvml != 0
        );
        match self.devs[o].compare_exchange(null_mut(), dev, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Some(dev),
            // SAFETY: another thread won; its Dev is leaked and valid.
            Err(other) => Some(unsafe { &*other }),
        }
    }

    /// Records this process's NVML PID in the entry, or, while it is unknown (or no slot
    /// is free), that an unidentified process of the claim is launching. Once registered,
    /// one load per call: the PID is looked for again only after the entry's `pids_gen`
    /// moved (some process took a slot it judged dead).
    #[inline]
    fn register(&self, dev: &Dev, now: u64) {
        if REGISTERED_RESET.load(Ordering::Relaxed) == 1
            && REGISTERED_RESET.swap(0, Ordering::Relaxed) == 1
        {
            // A forked child is another process: another NVML PID on every device.
            for d in &self.devs {
                let d = d.load(Ordering::Acquire);
                if !d.is_null() {
                    // SAFETY: a leaked Box<Dev>, never freed.
                    let d = unsafe { &*d };
                    d.nvml_pid.store(0, Ordering::Relaxed);
                    d.attempts.store(0, Ordering::Relaxed);
                    d.registered_gen.store(UNREGISTERED, Ordering::Relaxed);
                    d.overflow.store(false, Ordering::Relaxed);
                }
            }
        }
        let e = self.files[dev.file].entry(dev.entry);
        let me = dev.nvml_pid.load(Ordering::Relaxed);
        if me == 0 || dev.overflow.load(Ordering::Relaxed) {
            e.unknown_ns.store(now, Ordering::Relaxed);
        }
        if me == 0 {
            return;
        }
        // The generation first, then the PIDs: a slot taken after this load bumps the
        // generation after its CAS, so the next call looks again.
        let seen = e.pids_gen.load(Ordering::Acquire);
        if dev.registered_gen.load(Ordering::Relaxed) == seen {
            return;
        }
        if e.pids.iter().any(|p| p.load(Ordering::Acquire) == me) {
            dev.overflow.store(false, Ordering::Relaxed);
            dev.registered_gen.store(seen, Ordering::Relaxed);
            return;
        }
        register_pid(e, dev, me, seen);
    }
}

/// Puts `me` in a slot of `e.pids` that is free, or whose PID NVML no longer lists on
/// the device (a dead process's). When NVML cannot list the device's processes, only
/// free slots are taken: a live process's PID must never be dropped, or its work would
/// count as another's. No slot: the process counts as unidentified (`overflow`).
#[cold]
fn register_pid(e: &Entry, dev: &Dev, me: u32, seen: u64) {
    // Liveness that works across PID namespaces: a registered PID is alive while NVML
    // lists it among the device's processes (NVML sees host PIDs).
    let live: Option<Vec<u32>> = crate::boundary::in_driver(|| {
        identity::running(dev.nvml as NvmlDevice).map(|l| l.into_iter().map(|x| x.0).collect())
    });
    let dead = |cur: u32| cur == 0 || live.as_ref().is_some_and(|l| !l.contains(&cur));
    let took = e.pids.iter().any(|p| {
        let cur = p.load(Ordering::Acquire);
        dead(cur)
            && p.compare_exchange(cur, me, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            && {
                if cur != 0 {
                    e.pids_gen.fetch_add(1, Ordering::AcqRel);
                }
                true
            }
    });
    dev.overflow.store(!took, Ordering::Relaxed);
    if !took {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let said = crate::log::always_once(
            &SAID,
            format_args!(
                "core: more than {PIDS} processes of this claim use this GPU, the most the \
                 claim's core file registers; this process counts as unidentified, so the \
                 claim's time on the GPU is bounded by every process's on it (throttled \
                 more, never less) until a slot frees"
            ),
        );
        if !said {
            crate::debug!(
                "core: no free slot among {PIDS} registered processes on this GPU; counted as unidentified"
            );
        }
    }
    dev.registered_gen.store(seen, Ordering::Relaxed);
}

/// One identification attempt for `dev` (see [`identity`]), while attempts remain.
#[cold]
fn try_identify(dev: &Dev) {
    if dev.nvml == 0
        || dev.nvml_pid.load(Ordering::Relaxed) != 0
        || dev.attempts.fetch_add(1, Ordering::Relaxed) >= identity::ATTEMPTS
    {
        return;
    }
    // SAFETY: getpid has no preconditions (only a salt for the probe sizes).
    let salt = unsafe { libc::getpid() } as u64 ^ clock(libc::CLOCK_MONOTONIC);
    if let Some(pid) =
        crate::boundary::in_driver(|| identity::identify(dev.nvml as NvmlDevice, salt))
    {
        dev.nvml_pid.store(pid, Ordering::Relaxed);
    }
}

fn clock(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_ns(ns: u64) {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: valid timespec; an interrupted sleep returns early (the caller re-checks
    // or accepts a shorter wait).
    unsafe { libc::nanosleep(&ts, null_mut()) };
}

/// The claim's measured busy time (ns) over the last `window_us`, and whether any
/// other process used the GPU meanwhile. `None`: NVML cannot tell.
fn measure(e: &Entry, dev: &Dev, last_us: u64, now: u64) -> Option<(f64, bool)> {
    let now_us = clock(libc::CLOCK_REALTIME) / 1000;
    let window_us = now_us.saturating_sub(last_us).clamp(1_000, 1_000_000);
    let nvml = dev.nvml;
    // An unidentified process of the claim is launching: NVML's samples cannot tell
    // the claim's work from others' ("no sample of mine" must never read as "idle").
    let unknown = now.saturating_sub(e.unknown_ns.load(Ordering::Relaxed)) < UNKNOWN_NS;
    let f = real::nvmlDeviceGetProcessUtilization().filter(|_| nvml != 0);
    // Every process of the claim identified: NVML's own samples over exactly this
    // period are the best measure (the node's feed is a second old and covers another
    // window: pairing it with this period's units makes the estimate oscillate).
    if !unknown && let Some(m) = f.and_then(|f| measure_nvml(e, f, nvml, now_us, window_us, false))
    {
        return Some(m);
    }
    // Otherwise the node's feed, when fresh, says the claim's utilisation from the host's
    // view (host PIDs mapped to the claim by the node monitor).
    let from_feed = config()
        .feed_path
        .as_deref()
        .and_then(|p| feed::read(p, now_us / 1000))
        .and_then(|fd| fd.sm_permille(&dev.uuid));
    if let Some(permille) = from_feed {
        let busy = permille as f64 / 1000.0 * window_us as f64 * 1000.0;
        // Whether anyone else is on the card: only NVML can say, and only when the
        // claim's PIDs are all known; otherwise assume someone is (never relax).
        let others = unknown
            || f.is_none()
            || measure_nvml(e, f?, nvml, now_us, window_us, false).is_none_or(|m| m.1);
        return Some((busy, others));
    }
    // With a process of the claim unidentified, every process's work is counted as the
    // claim's: an upper bound (exact alone on the card), so the estimate can only err
    // towards throttling more, never towards failing open.
    measure_nvml(e, f?, nvml, now_us, window_us, unknown).map(|(b, o)| (b, o || unknown))
}

type UtilFn =
    unsafe extern "C" fn(NvmlDevice, *mut NvmlProcessUtilizationSample, *mut c_uint, u64) -> c_int;

fn measure_nvml(
    e: &Entry,
    f: UtilFn,
    nvml: usize,
    now_us: u64,
    window_us: u64,
    all: bool,
) -> Option<(f64, bool)> {
    let mut buf = [NvmlProcessUtilizationSample::default(); 64];
    let mut n: c_uint = buf.len() as c_uint;
    // SAFETY: buf holds n samples.
    let r = unsafe {
        f(
            nvml as NvmlDevice,
            buf.as_mut_ptr(),
            &mut n,
            now_us - window_us,
        )
    };
    if r == NVML_ERROR_NOT_FOUND {
        return Some((0.0, false));
    }
    if r != NVML_SUCCESS {
        return None;
    }
    let mine: Vec<u32> = e.pids.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    // Real NVML may give several samples per process: average each process's.
    let mut per: Vec<(u32, u32, u32)> = Vec::new(); // pid, sum, count
    for s in &buf[..(n as usize).min(buf.len())] {
        match per.iter_mut().find(|p| p.0 == s.pid) {
            Some(p) => {
                p.1 += s.sm_util;
                p.2 += 1;
            }
            None => per.push((s.pid, s.sm_util, 1)),
        }
    }
    let mut pct = 0.0;
    let mut others = false;
    for (pid, sum, cnt) in per {
        let u = sum as f64 / cnt as f64;
        if all || mine.contains(&pid) {
            pct += u;
        } else if u > 0.0 {
            others = true;
        }
    }
    // NVML's samples are whole percents per process: many small processes of one claim
    // (each under 0.5 %) could hide their work in the rounding. Alone on the card, the
    // claim's time is the device's, which NVML gives as one figure: never less than that.
    // Alone means no other process holds a context there (not merely no sample of another
    // in this period: a throttled neighbour's past work would be counted as the claim's,
    // over NVML's longer device window, and the two claims would oscillate).
    if !others
        && (all || only_mine_running(e, nvml))
        && let Some(dev) = device_percent(nvml)
    {
        pct = pct.max(dev);
    }
    Some((pct / 100.0 * window_us as f64 * 1000.0, others))
}

/// Whether every process NVML lists on the device is a registered one of the claim.
fn only_mine_running(e: &Entry, nvml: usize) -> bool {
    let Some(list) = identity::running(nvml as NvmlDevice) else {
        return false;
    };
    list.iter()
        .all(|(pid, _)| e.pids.iter().any(|p| p.load(Ordering::Relaxed) == *pid))
}

/// The device's utilisation in percent (NVML's last sample period), if NVML says.
fn device_percent(nvml: usize) -> Option<f64> {
    let f = real::nvmlDeviceGetUtilizationRates()?;
    let mut u = NvmlUtilization::default();
    // SAFETY: u is a valid out-pointer of the struct's layout.
    (unsafe { f(nvml as NvmlDevice, &mut u) } == NVML_SUCCESS).then_some(f64::from(u.gpu.min(100)))
}

fn load_estimate(e: &Entry) -> Estimate {
    Estimate {
        busy: f64::from_bits(e.est_busy.load(Ordering::Relaxed)),
        units: f64::from_bits(e.est_units.load(Ordering::Relaxed)),
    }
}

/// The control step, run by the one thread that won this period's election.
#[cold]
fn control(e: &Entry, dev: &Dev, now: u64) {
    let now_us = clock(libc::CLOCK_REALTIME) / 1000;
    let last_us = e.last_ctrl_us.swap(now_us, Ordering::AcqRel);
    let units = e.units.swap(0, Ordering::AcqRel);
    if last_us == 0 {
        return; // first period: nothing measured yet
    }
    if dev.nvml_pid.load(Ordering::Relaxed) == 0 {
        try_identify(dev);
    }
    if dev.overflow.load(Ordering::Relaxed) {
        // Without a slot: look for one again at the next launch (a process may be gone).
        dev.registered_gen.store(UNREGISTERED, Ordering::Relaxed);
    }
    let Some((busy, others)) = measure(e, dev, last_us, now) else {
        // Cannot tell: keep the estimate, and never count as alone.
        e.flags.fetch_and(!FLAG_ALONE, Ordering::Relaxed);
        crate::debug!("core: no measurement of the claim this period; estimate kept");
        return;
    };
    if others {
        e.flags.fetch_and(!FLAG_ALONE, Ordering::Relaxed);
    } else {
        e.flags.fetch_or(FLAG_ALONE, Ordering::Relaxed);
    }
    let est = load_estimate(e);
    let k = est.k();
    let new = est.step(units, busy);
    e.est_busy.store(new.busy.to_bits(), Ordering::Relaxed);
    e.est_units.store(new.units.to_bits(), Ordering::Relaxed);
    let nk = new.k();
    e.k_fp.store(k_fixed(nk), Ordering::Relaxed);
    crate::debug!(
        "core: t={}ms units {units} busy {:.1}ms k {k:.1} -> {nk:.1} others {others}",
        now / 1_000_000,
        busy / 1e6
    );
}

/// Waits while a high-priority claim is active on the GPU (low priority), or records
/// activity (high priority).
fn priority(dev: &Dev) {
    if dev.prio.is_null() {
        return;
    }
    // SAFETY: prio points into a live 64-byte shared mapping, never unmapped.
    let stamp = unsafe { &*dev.prio };
    match dev.priority {
        Priority::High => {
            let now = clock(libc::CLOCK_MONOTONIC);
            if now.saturating_sub(stamp.load(Ordering::Relaxed)) > 1_000_000 {
                stamp.store(now, Ordering::Relaxed);
            }
        }
        Priority::Low => {
            // A stamp from the future (forged: the clock is monotonic) is ignored, and one
            // launch never waits longer than MAX_WAIT_NS in all.
            let start = clock(libc::CLOCK_MONOTONIC);
            loop {
                let now = clock(libc::CLOCK_MONOTONIC);
                let last = stamp.load(Ordering::Relaxed);
                if last == 0
                    || now.saturating_sub(last) >= QUIET_NS
                    || last > now + PRIO_POLL_NS
                    || now.saturating_sub(start) >= MAX_WAIT_NS
                {
                    return;
                }
                sleep_ns((last + QUIET_NS - now).min(PRIO_POLL_NS));
            }
        }
        Priority::Normal => {}
    }
}

/// [`Batch::mode`]: the launch must take the full path ([`throttle_in`]).
const FAST_NONE: u8 = 0;
/// The device's launches spend bucket time from the thread's lease.
const FAST_BUCKET: u8 = 1;
/// `share` policy, the claim alone on the card: launches are counted, not throttled.
const FAST_COUNT: u8 = 2;

/// The launch path of a thread that launched on device `ord` before in the same coarse
/// clock tick (`now`): what the full path ([`throttle_in`]) would do then, from the
/// thread's own batch alone. Within a tick the full path's other steps are no-ops or
/// repeat themselves: the registration stamp (`unknown_ns`) would write the same `now`,
/// the control election compares the same `now` with a `next_ctrl` that only grows,
/// and `k_fp` and the `share` flag are re-read at the next tick (1-4 ms later; the
/// control step changes them every 100 ms). So the launch spends its bucket time from
/// the thread's lease (or, `share` and alone, only counts) and adds its units to the
/// batch, exactly as [`reserve`] and [`count`] do with a lease and a batch of this
/// device and tick. Returns false (nothing done) when the full path must run: another
/// tick, another device, a lease too small for the launch, or a device with priority
/// (its stamp is per launch). No shared memory is read or written.
#[inline(always)]
fn fast(b: &Batch, ord: c_int, units: u64, now: u64) -> bool {
    let mode = b.mode.get();
    if mode == FAST_NONE || b.ord.get() != ord || b.tick.get() != now {
        return false;
    }
    if mode == FAST_BUCKET {
        let inc = increment_at(units, b.rate.get());
        let held = b.lease.get();
        if inc > held as u128 {
            return false;
        }
        b.lease.set(held - inc as u64);
    }
    b.units.set(b.units.get().saturating_add(units));
    true
}

/// The limiter, for a launch of `units` on the current context's device.
#[inline(always)]
pub fn throttle(units: u64) {
    crate::boundary::with_thread(|t| {
        if t.in_driver.get() {
            return;
        }
        let Some(ord) = crate::process::current_ordinal() else {
            return;
        };
        let b = &t.launch;
        if b.mode.get() != FAST_NONE && fast(b, ord, units, coarse_now()) {
            return;
        }
        throttle_in(b, ord, units);
    });
}

/// The coarse clock (a few ns, ticks of 1-4 ms): the bucket's long-run rate comes from
/// `tat`'s exact increments, and its 20 ms horizon absorbs the tick. Read through the
/// vDSO's `clock_gettime` directly when [`core_proc`] found it (libc's wrapper adds
/// about 1 ns to the launch path), else through libc's.
#[inline(always)]
fn coarse_now() -> u64 {
    let f = VDSO_CLOCK.load(Ordering::Relaxed);
    if !f.is_null() {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: f is the vDSO's clock_gettime (found by `elf::vdso_function`), whose
        // signature is clock_gettime's (vdso(7)); ts is a valid out-pointer.
        let r = unsafe { std::mem::transmute::<*mut c_void, ClockFn>(f)(CLOCK_COARSE, &mut ts) };
        if r == 0 {
            return ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        }
    }
    clock(CLOCK_COARSE)
}

const CLOCK_COARSE: libc::clockid_t = libc::CLOCK_MONOTONIC_COARSE;
type ClockFn = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> c_int;
/// The vDSO's `clock_gettime` (null: none, libc's is used).
static VDSO_CLOCK: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// Finds the vDSO's `clock_gettime` (vdso(7) names it per architecture).
fn find_vdso_clock() {
    let name = if cfg!(target_arch = "x86_64") {
        c"__vdso_clock_gettime"
    } else if cfg!(target_arch = "aarch64") {
        c"__kernel_clock_gettime"
    } else {
        return;
    };
    VDSO_CLOCK.store(crate::elf::vdso_function(name), Ordering::Relaxed);
}

/// The full launch path: resolves the device, runs priority, registration, the control
/// election and the bucket, and leaves in the batch what lets the thread's next
/// launches in this tick take [`fast`].
#[cold]
#[inline(never)]
fn throttle_in(b: &Batch, ord: c_int, units: u64) {
    b.mode.set(FAST_NONE);
    let p = core_proc();
    let Some(dev) = p.resolve(ord) else {
        return;
    };
    priority(dev);
    if dev.pct.is_none() {
        return;
    }
    let e = p.files[dev.file].entry(dev.entry);
    let now = coarse_now();
    p.register(dev, now);
    let next = e.next_ctrl.load(Ordering::Relaxed);
    if now >= next
        && e.next_ctrl
            .compare_exchange(next, now + PERIOD_NS, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        flush(b);
        control(e, dev, now);
    }
    // A device with priority stamps or checks its priority file on every launch.
    let cache = dev.prio.is_null();
    if dev.policy == CorePolicy::Share && e.flags.load(Ordering::Relaxed) & FLAG_ALONE != 0 {
        count(b, e, units, now);
        if cache {
            b.ord.set(ord);
            b.mode.set(FAST_COUNT);
        }
        return;
    }
    let k_fp = match e.k_fp.load(Ordering::Relaxed) {
        0 => k_fixed(load_estimate(e).k()),
        k => k,
    };
    let inc = increment_fp(units, k_fp, dev.scale);
    let wait = reserve(b, e, inc, now);
    if wait > 0 {
        let t0 = clock(libc::CLOCK_MONOTONIC);
        sleep_ns(wait.min(MAX_WAIT_NS));
        e.throttled_ns.fetch_add(
            clock(libc::CLOCK_MONOTONIC).saturating_sub(t0),
            Ordering::Relaxed,
        );
    }
    // Counted when the launch goes, so the units and the GPU time they cause fall in
    // the same control period.
    count(b, e, units, now);
    // The batch now holds this entry's lease and units at tick `now` (what `fast` needs).
    if cache && let Some(rate) = unit_rate(k_fp, dev.scale) {
        b.ord.set(ord);
        b.rate.set(rate);
        b.mode.set(FAST_BUCKET);
    }
}

/// Most bucket time a thread reserves ahead of its launches (see [`reserve`]).
pub const LEASE_MAX_NS: u64 = 20_000;
/// A lease covers up to this many launches like the one that took it.
const LEASE_LAUNCHES: u64 = 64;

/// Reserves `inc` wall-ns of the entry's bucket for a launch at `now`; returns how long
/// the launch must wait. A thread takes bucket time in leases: the CAS on `tat` that
/// admits a launch reserves, beyond its `inc`, a lease of `min(64·inc, 20 µs)` that
/// the thread's next launches on that entry spend without touching the shared line.
/// What goes is still reserved in `tat` first (the ceiling holds); a lease only lets
/// launches go up to 20 µs of bucket time earlier than their own slot (0.1 % of the
/// 20 ms burst per thread). A lease left when the thread moves to another entry is
/// given back; one lost with its thread or process (killed anywhere) wastes at most
/// 20 µs of the claim's bucket time, throttling more, never less.
#[inline]
fn reserve(b: &Batch, e: &Entry, inc: u64, now: u64) -> u64 {
    let me: *const () = (e as *const Entry).cast();
    {
        let held = b.lease.get();
        // What is left of this entry's lease (less than this launch) is kept with the
        // new one; another entry's is given back.
        let keep = if b.lease_of.get() == me {
            if held >= inc {
                b.lease.set(held - inc);
                return 0;
            }
            held
        } else {
            if held > 0 {
                give_back(b.lease_of.get().cast(), held);
            }
            0
        };
        let lease = inc.saturating_mul(LEASE_LAUNCHES).min(LEASE_MAX_NS);
        let wait = take(e, inc.saturating_add(lease), now);
        b.lease_of.set(me);
        b.lease.set(lease.saturating_add(keep));
        wait
    }
}

/// The GCRA step on the shared `tat`: one CAS (retried on contention).
#[inline]
fn take(e: &Entry, inc: u64, now: u64) -> u64 {
    let mut tat = e.tat.load(Ordering::Relaxed);
    loop {
        let (new, wait) = admit(tat, now, inc, BURST_NS);
        match e
            .tat
            .compare_exchange_weak(tat, new, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => return wait,
            Err(x) => tat = x,
        }
    }
}

/// Returns an unspent lease of `ns` to `entry`'s bucket.
#[cold]
fn give_back(entry: *const Entry, ns: u64) {
    // SAFETY: a lease is only held on an entry of a core file, mapped for the life of the
    // process and never unmapped.
    let e = unsafe { &*entry };
    let _ = e
        .tat
        .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |t| {
            Some(t.saturating_sub(ns))
        });
}

/// Counts `units` launched at coarse time `now`: added to the thread's batch, which goes
/// to the shared counter (one `fetch_add`) at the first launch of the thread after the
/// coarse clock ticked (1-4 ms), or on another entry, or before this thread runs a
/// control step — so the control loop sees a busy thread's units within a tick of their
/// launch, not one locked read-modify-write on the shared line per launch. A thread
/// that stops launching keeps at most one tick's units until its next launch, and a
/// thread that exits or a process killed drops them: the period then counts fewer units
/// for its GPU time, so `k` errs high and the limiter throttles more, never less.
#[inline]
fn count(b: &Batch, e: &Entry, units: u64, now: u64) {
    let to: *const AtomicU64 = &e.units;
    if b.to.get() == to && b.tick.get() == now {
        b.units.set(b.units.get().saturating_add(units));
        return;
    }
    flush(b);
    b.to.set(to);
    b.units.set(units);
    b.tick.set(now);
}

#[inline]
fn flush(b: &Batch) {
    let to = b.to.replace(std::ptr::null());
    if !to.is_null() {
        // SAFETY: `to` is the `units` of an entry in a core file, mapped for the life of
        // the process and never unmapped.
        unsafe { &*to }.fetch_add(b.units.replace(0), Ordering::Relaxed);
    }
}

/// Units of a kernel launch: its thread blocks.
#[inline]
pub fn kernel_units(gx: c_uint, gy: c_uint, gz: c_uint) -> u64 {
    (gx.max(1) as u64) * (gy.max(1) as u64) * (gz.max(1) as u64)
}

/// Units of a `cuLaunchKernelEx` launch (`CUlaunchConfig` starts with the grid).
pub fn ex_units(config: *const c_void) -> u64 {
    if config.is_null() {
        return 1;
    }
    // SAFETY: a non-null CUlaunchConfig (caller contract) starts with 3 unsigned ints.
    let g = unsafe { (config as *const [c_uint; 3]).read() };
    kernel_units(g[0], g[1], g[2])
}

/// A panic in the limiter lets the launch go (it never unwinds into the caller).
#[inline(always)]
fn guarded(units: impl FnOnce() -> u64) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| throttle(units())));
}

/// 0 unknown, 1 off, 2 on.
static STATE: AtomicUsize = AtomicUsize::new(0);

/// Called before every launch: one atomic load when no core quota or priority is set.
#[inline(always)]
pub fn before_launch(units: impl FnOnce() -> u64) {
    match STATE.load(Ordering::Relaxed) {
        1 => {}
        2 => guarded(units),
        _ => {
            let on = config().core_active();
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            if on {
                guarded(units);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_fuzzing_entry_maps_checks_and_claims() {
        let p = std::env::temp_dir().join(format!("fgpu-core-fuzz-{}", std::process::id()));
        std::fs::write(&p, vec![0u8; FILE_SIZE - 1]).unwrap();
        assert!(fuzz_core_file(&p, &[9; 16]).unwrap_err().contains("size"));
        let mut bad = vec![0u8; FILE_SIZE];
        bad[0] = 1;
        std::fs::write(&p, &bad).unwrap();
        assert_eq!(fuzz_core_file(&p, &[9; 16]), Err("unknown magic".into()));
        std::fs::write(&p, vec![0u8; FILE_SIZE]).unwrap();
        assert_eq!(fuzz_core_file(&p, &[9; 16]), Ok(Some(0)));
        assert_eq!(fuzz_core_file(&p, &[8; 16]), Ok(Some(1)));
        assert_eq!(fuzz_core_file(&p, &[9; 16]), Ok(Some(0)));
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn gcra_admits_a_burst_then_paces() {
        let now = 1000 * MS;
        // Idle bucket: go now; tat moves by inc.
        assert_eq!(admit(0, now, 5 * MS, 20 * MS), (now + 5 * MS, 0));
        // Up to the burst ahead: no wait.
        assert_eq!(
            admit(now + 20 * MS, now, 5 * MS, 20 * MS),
            (now + 25 * MS, 0)
        );
        // Beyond: wait the excess.
        assert_eq!(
            admit(now + 30 * MS, now, 5 * MS, 20 * MS),
            (now + 35 * MS, 10 * MS)
        );
        // Idle time is not banked beyond the burst.
        assert_eq!(admit(now - 500 * MS, now, 5 * MS, 20 * MS).0, now + 5 * MS);
    }

    #[test]
    fn estimate_is_the_weighted_ratio() {
        assert_eq!(Estimate::NONE.k(), K0);
        let e = Estimate::NONE.step(100, 500_000.0);
        assert_eq!(e.k(), 5000.0);
        assert_eq!(e.step(0, 0.0), e);
        let e2 = e.step(100, 200_000.0);
        let want = (0.7 * 500_000.0 + 0.3 * 200_000.0) / 100.0;
        assert!((e2.k() - want).abs() < 1e-6, "{}", e2.k());
        assert_eq!(Estimate::NONE.step(100, 0.0).k(), K_MIN);
    }

    #[test]
    fn fixed_point_increment_matches_the_float_one() {
        for pct in [1, 10, 30, 33, 50, 70, 99, 100] {
            for k in [K_MIN, 0.75, 1.0, 12.3, K0, 12_000.0, 3.7e6, K_MAX] {
                for units in [0, 1, 7, 40, 1024, 65_535, 1 << 30] {
                    let want = increment(units, k, pct) as f64;
                    let got = increment_fp(units, k_fixed(k), quota_scale(pct)) as f64;
                    // 2^-16 of k's rounding, plus the truncation of each.
                    let tol = want * 2e-5 + 2.0;
                    assert!(
                        (got - want).abs() <= tol,
                        "{units} x {k} at {pct}%: {got} vs {want}"
                    );
                }
            }
        }
        assert_eq!(
            increment_fp(u64::MAX, k_fixed(K_MAX), quota_scale(1)),
            u64::MAX
        );
        assert_eq!(k_fixed(0.0), k_fixed(K_MIN));
        assert!(k_fixed(K_MIN) > 0);
    }

    #[test]
    fn the_cached_unit_rate_gives_the_same_increment() {
        let mut checked = 0;
        for pct in [1, 10, 30, 33, 50, 70, 99] {
            for k in [K_MIN, 0.75, 1.0, 12.3, K0, 12_000.0, 3.7e6, K_MAX] {
                let (k_fp, scale) = (k_fixed(k), quota_scale(pct));
                let Some(rate) = unit_rate(k_fp, scale) else {
                    // Only a unit of over 2^16 ns of bucket time does not fit: more than
                    // a whole lease, which the fast path could not spend anyway.
                    assert!(k * 100.0 / pct as f64 >= 65_000.0, "{k} at {pct}%");
                    assert!(increment_fp(1, k_fp, scale) > LEASE_MAX_NS);
                    continue;
                };
                for units in [0, 1, 7, 40, 1024, 65_535, 1 << 30] {
                    let want = increment_fp(units, k_fp, scale);
                    let got = increment_at(units, rate);
                    if want < u64::MAX {
                        assert_eq!(got, want as u128, "{units} x {k} at {pct}%");
                        checked += 1;
                    } else {
                        assert!(got >= u64::MAX as u128, "{units} x {k} at {pct}%");
                    }
                }
            }
        }
        assert!(checked > 250, "{checked}");
    }

    /// What the full path leaves in the batch for a launch at `now` (see `throttle_in`).
    fn full(b: &Batch, e: &Entry, ord: c_int, units: u64, now: u64, rate: u64) {
        b.mode.set(FAST_NONE);
        let inc = u64::try_from(increment_at(units, rate)).unwrap();
        assert_eq!(reserve(b, e, inc, now), 0);
        count(b, e, units, now);
        b.ord.set(ord);
        b.rate.set(rate);
        b.mode.set(FAST_BUCKET);
    }

    #[test]
    fn the_fast_path_does_what_the_full_path_would() {
        // Two threads launch the same sequence, one always through the full path's lease
        // and batch (reserve + count), one through `fast` where it can: their leases, their
        // batches and the shared entries must agree after every launch.
        let (ea, eb) = (test_entry(), test_entry());
        let (a, b) = (Batch::new(), Batch::new());
        let rate = unit_rate(k_fixed(3.0), quota_scale(50)).unwrap(); // 6 ns per unit
        let (mut now, mut fast_ones) = (1000 * MS, 0);
        for i in 0..20_000u64 {
            let units = 1 + i % 5;
            if i % 997 == 0 {
                now += 4 * MS; // the coarse clock ticked
            }
            let inc = u64::try_from(increment_at(units, rate)).unwrap();
            assert_eq!(reserve(&a, ea, inc, now), 0);
            count(&a, ea, units, now);
            if fast(&b, 0, units, now) {
                fast_ones += 1;
            } else {
                full(&b, eb, 0, units, now, rate);
            }
            assert_eq!(a.lease.get(), b.lease.get(), "launch {i}");
            assert_eq!(a.units.get(), b.units.get(), "launch {i}");
            assert_eq!(a.tick.get(), b.tick.get(), "launch {i}");
            assert_eq!(
                ea.tat.load(Ordering::Relaxed),
                eb.tat.load(Ordering::Relaxed),
                "launch {i}"
            );
            assert_eq!(
                ea.units.load(Ordering::Relaxed),
                eb.units.load(Ordering::Relaxed),
                "launch {i}"
            );
        }
        // Most launches are fast: one full path per lease (20 µs of 6-30 ns launches) or
        // per tick.
        assert!(fast_ones > 19_000, "{fast_ones}");
    }

    #[test]
    fn the_fast_path_declines_what_it_cannot_know() {
        let e = test_entry();
        let b = Batch::new();
        let now = 1000 * MS;
        let rate = unit_rate(k_fixed(1.0), quota_scale(50)).unwrap(); // 2 ns per unit
        assert!(!fast(&b, 0, 1, now), "nothing cached yet");
        full(&b, e, 3, 1, now, rate);
        let (lease, units, tat) = (b.lease.get(), b.units.get(), e.tat.load(Ordering::Relaxed));
        assert!(lease > 0);
        // Another tick, another device, a launch bigger than the lease: the full path, and
        // nothing changed.
        assert!(!fast(&b, 3, 1, now + 1));
        assert!(!fast(&b, 2, 1, now));
        assert!(!fast(&b, 3, lease / 2 + 1, now));
        assert_eq!((b.lease.get(), b.units.get()), (lease, units));
        // The same device and tick: spent from the lease, counted in the batch, and the
        // shared entry untouched.
        assert!(fast(&b, 3, 4, now));
        assert_eq!((b.lease.get(), b.units.get()), (lease - 8, units + 4));
        assert_eq!(e.tat.load(Ordering::Relaxed), tat);
        assert_eq!(e.units.load(Ordering::Relaxed), 0);
        // Counted only (share, alone): the lease is not spent.
        b.mode.set(FAST_COUNT);
        assert!(fast(&b, 3, 5, now));
        assert_eq!((b.lease.get(), b.units.get()), (lease - 8, units + 9));
        // A forked child's batch takes the full path.
        b.clear();
        assert!(!fast(&b, 3, 1, now));
    }

    #[test]
    fn the_coarse_clock_is_libcs() {
        find_vdso_clock();
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert!(!VDSO_CLOCK.load(Ordering::Relaxed).is_null());
        }
        // Between two readings of libc's coarse clock, every time: the same clock (the
        // precise one runs up to a tick ahead of the coarse one and would not fit).
        for _ in 0..10_000 {
            let (a, b, c) = (clock(CLOCK_COARSE), coarse_now(), clock(CLOCK_COARSE));
            assert!(a <= b && b <= c, "{a} {b} {c}");
        }
    }

    fn test_entry() -> &'static Entry {
        // SAFETY: a zeroed private mapping of one entry, leaked; Entry is atomics only.
        unsafe { &*(private_map(ENTRY_SIZE) as *const Entry) }
    }

    #[test]
    fn what_a_lease_lets_go_was_reserved_in_tat_first() {
        let (a, b) = (test_entry(), test_entry());
        let t = Batch::new();
        let now = 1000 * MS;
        let mut spent = 0;
        for i in 0..10_000u64 {
            let inc = 1 + i % 7;
            assert_eq!(reserve(&t, a, inc, now), 0);
            spent += inc;
            // The ceiling: everything that went is in the bucket, plus at most one lease.
            let tat = a.tat.load(Ordering::Relaxed) - now;
            assert!(tat >= spent, "launch {i}: tat {tat} < spent {spent}");
            assert!(
                tat <= spent + LEASE_MAX_NS,
                "launch {i}: tat {tat}, spent {spent}"
            );
        }
        // A big launch takes at most LEASE_MAX_NS more than itself.
        let before = a.tat.load(Ordering::Relaxed);
        reserve(&t, a, 10 * MS, now);
        assert!(a.tat.load(Ordering::Relaxed) - before <= 10 * MS + LEASE_MAX_NS);
        // Moving to another entry gives the unspent lease back.
        let held = t.lease.get();
        let tat_a = a.tat.load(Ordering::Relaxed);
        reserve(&t, b, 5, now);
        assert_eq!(a.tat.load(Ordering::Relaxed), tat_a - held);
        assert_eq!(t.lease_of.get(), (b as *const Entry).cast());
        // A forked child holds nothing of its parent's.
        t.clear();
        assert_eq!((t.lease.get(), t.units.get()), (0, 0));
    }

    #[test]
    fn units_reach_the_entry_when_the_tick_changes() {
        let e = test_entry();
        let t = Batch::new();
        for _ in 0..100 {
            count(&t, e, 3, 7);
        }
        assert_eq!(e.units.load(Ordering::Relaxed), 0, "batched within a tick");
        count(&t, e, 1, 8);
        assert_eq!(e.units.load(Ordering::Relaxed), 300);
        flush(&t);
        assert_eq!(e.units.load(Ordering::Relaxed), 301);
        flush(&t);
        assert_eq!(e.units.load(Ordering::Relaxed), 301, "flushed once");
    }

    /// A claim on the simulated GPU: an application that launches as fast as the
    /// limiter lets it, mixing kernels and graphs.
    struct Claim {
        pct: u32,
        est: Estimate,
        tat: u64,
        units: u64,
        next: u64,
        pending: Option<(u64, u64)>, // (units, duration) admitted, waiting to launch
        n: u64,
        intervals: Vec<(u64, u64)>,
    }

    /// Simulates claims sharing one FIFO GPU for `secs`, with the controller run every
    /// period on NVML-like measurements (integer percent); returns each claim's share
    /// of GPU time over [warm, secs). `cost(t)` = GPU ns per block at time t.
    fn simulate(pcts: &[u32], secs: u64, warm: u64, cost: impl Fn(u64) -> u64) -> Vec<f64> {
        let s = 1_000_000_000u64;
        let mut claims: Vec<Claim> = pcts
            .iter()
            .map(|&pct| Claim {
                pct,
                est: Estimate::NONE,
                tat: 0,
                units: 0,
                next: 0,
                pending: None,
                n: 0,
                intervals: Vec::new(),
            })
            .collect();
        let mut busy_until = 0u64;
        let cap = 50 * MS;
        let mut next_ctrl = PERIOD_NS;
        let end = secs * s;
        loop {
            let (i, t) = claims
                .iter()
                .enumerate()
                .map(|(i, c)| (i, c.next))
                .min_by_key(|x| x.1)
                .unwrap();
            if t >= end {
                break;
            }
            while next_ctrl <= t {
                for c in claims.iter_mut() {
                    let a = next_ctrl - PERIOD_NS;
                    let busy: u64 = c
                        .intervals
                        .iter()
                        .rev()
                        .take_while(|iv| iv.1 > a.saturating_sub(100 * MS))
                        .map(|&(x, y)| y.min(next_ctrl).saturating_sub(x.max(a)))
                        .sum();
                    let pct = (busy as f64 * 100.0 / PERIOD_NS as f64).round();
                    c.est = c.est.step(c.units, pct / 100.0 * PERIOD_NS as f64);
                    c.units = 0;
                }
                next_ctrl += PERIOD_NS;
            }
            let c = &mut claims[i];
            match c.pending.take() {
                None => {
                    // Admission: every 4th launch a graph (10 ms), else 40 blocks.
                    c.n += 1;
                    let (units, dur) = if c.n.is_multiple_of(4) {
                        (GRAPH_UNITS, 10 * MS)
                    } else {
                        (40, 40 * cost(t))
                    };
                    let inc = increment_fp(units, k_fixed(c.est.k()), quota_scale(c.pct));
                    let (new, wait) = admit(c.tat, t, inc, BURST_NS);
                    c.tat = new;
                    c.pending = Some((units, dur));
                    c.next = t + wait;
                }
                Some((units, dur)) => {
                    if busy_until > t + cap {
                        c.pending = Some((units, dur));
                        c.next = busy_until - cap;
                    } else {
                        let start = busy_until.max(t);
                        busy_until = start + dur;
                        c.intervals.push((start, busy_until));
                        c.units += units;
                        c.next = t + 20_000; // the application's own time per launch
                    }
                }
            }
        }
        claims
            .iter()
            .map(|c| {
                let busy: u64 = c
                    .intervals
                    .iter()
                    .map(|&(x, y)| y.min(end).saturating_sub(x.max(warm * s)))
                    .sum();
                busy as f64 * 100.0 / ((secs - warm) * s) as f64
            })
            .collect()
    }

    #[test]
    fn converges_alone_for_every_quota() {
        for pct in [10, 30, 50, 70] {
            let got = simulate(&[pct], 7, 2, |_| 12_000)[0];
            assert!((got - pct as f64).abs() < 1.0, "quota {pct}: {got:.2}");
        }
    }

    #[test]
    fn converges_when_competing() {
        let got = simulate(&[30, 70], 7, 2, |_| 12_000);
        assert!((got[0] - 30.0).abs() < 1.5, "{got:?}");
        assert!((got[1] - 70.0).abs() < 1.5, "{got:?}");
        let got = simulate(&[10, 20, 40], 7, 2, |_| 3_000);
        for (g, q) in got.iter().zip([10.0, 20.0, 40.0]) {
            assert!((g - q).abs() < 1.0, "{got:?}");
        }
    }

    #[test]
    fn follows_a_change_of_kernel_cost() {
        // The kernels get 4x slower at t = 3 s; by t = 4 s the share is back on quota.
        let got = simulate(
            &[30],
            9,
            4,
            |t| if t < 3_000_000_000 { 5_000 } else { 20_000 },
        );
        assert!((got[0] - 30.0).abs() < 1.0, "{got:?}");
    }
}
