//! Per-process state: the configuration (read once, on the first CUDA call), the
//! account, the allocation trackers and the memory pools. Rebuilt in a forked child.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use crate::claims::{CLAIMS_DIR, View};
use crate::config::{Config, DEFAULT_LIMITS_FILE, MAX_DEVICES};
use crate::ffi::*;
use crate::real;
use crate::state::Account;
use crate::track::Tracker;

/// The configuration, read on first use (never at load time).
pub fn config() -> &'static Config {
    static CFG: OnceLock<Config> = OnceLock::new();
    CFG.get_or_init(|| {
        if let Some(view) = read_claims() {
            let mut cfg = Config::from_claims(view, &|k| std::env::var(k).ok());
            cfg.uuid_of = Some(device_uuid_strict);
            for w in &cfg.warnings {
                crate::debug!("{w}");
            }
            return cfg;
        }
        let path = std::env::var("FGPU_LIMITS_FILE")
            .ok()
            .filter(|p| !p.is_empty());
        let file = match &path {
            Some(p) => match std::fs::read_to_string(p) {
                Ok(t) => Some(t),
                Err(e) => {
                    crate::debug!("limits file {p}: {e}; using the environment");
                    None
                }
            },
            None => std::fs::read_to_string(DEFAULT_LIMITS_FILE).ok(),
        };
        let cfg = Config::from_sources(file.as_deref(), &|k| std::env::var(k).ok());
        for w in &cfg.warnings {
            crate::debug!("{w}");
        }
        crate::debug!(
            "quota from {:?}: default {:?}, per device {:?}, account {:?}",
            cfg.source,
            cfg.default_limit,
            cfg.limits,
            cfg.state_path
        );
        cfg
    })
}

/// Claim mode: the limits files under [`CLAIMS_DIR`], each with whether it is trusted
/// (a mount point) and its text. `None`: the directory does not exist (env mode).
fn read_claims() -> Option<View> {
    let dir = std::path::Path::new(CLAIMS_DIR);
    // symlink_metadata: a directory the workload replaced by a symlink still counts as
    // present (claim mode), and is then found to hold no trusted file.
    std::fs::symlink_metadata(dir).ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut names: Vec<_> = rd.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for n in names {
            let path = dir.join(n).join("limits");
            if std::fs::symlink_metadata(&path).is_err() {
                continue;
            }
            let trusted = is_mount_point(&mounts, &path);
            let text = std::fs::read_to_string(&path).map_err(|e| e.to_string());
            found.push((path, trusted, text));
        }
    }
    Some(View::build(found))
}

/// Whether `path` is a mount point according to `/proc/self/mountinfo` (field 5, with
/// the kernel's octal escapes of space, tab, newline and backslash).
pub fn is_mount_point(mountinfo: &str, path: &std::path::Path) -> bool {
    let want = path.as_os_str().as_encoded_bytes();
    mountinfo.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|m| unescape_mount(m) == want)
    })
}

fn unescape_mount(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The GPU's UUID from the driver; `None` when the driver cannot say (claim mode never
/// guesses: limits are keyed by UUID).
fn device_uuid_strict(ord: c_int) -> Option<[u8; 16]> {
    let mut dev: CUdevice = ord;
    let get = real::cuDeviceGet()?;
    // SAFETY: dev is a valid out-pointer.
    let mut r = unsafe { get(&mut dev, ord) };
    if r == CUDA_ERROR_NOT_INITIALIZED
        && let Some(init) = real::cuInit()
    {
        // An NVML-only program (nvidia-smi) asks before anyone initialised CUDA;
        // cuInit creates no context.
        // SAFETY: cuInit(0) may be called any number of times.
        unsafe { init(0) };
        // SAFETY: as above.
        r = unsafe { get(&mut dev, ord) };
    }
    if r != CUDA_SUCCESS {
        return None;
    }
    let mut u = [0u8; 16];
    let f = real::cuDeviceGetUuid_v2().or_else(real::cuDeviceGetUuid)?;
    // SAFETY: u is a 16-byte out-buffer (CUuuid).
    (unsafe { f(&mut u, dev) } == CUDA_SUCCESS && u != [0; 16]).then_some(u)
}

/// Memory charged to one pool (see README: pools keep freed memory until trimmed).
#[derive(Debug, Default, Clone, Copy)]
pub struct PoolState {
    /// Device entry and limit; `None` for pools we do not count (host pools).
    pub dev: Option<(usize, u64)>,
    pub charged: u64,
    pub in_use: u64,
    pub destroyed: bool,
}

pub struct Proc {
    pub acct: Account,
    /// CUDA ordinal → device entry + 1 (0: not resolved yet).
    dev_index: [AtomicU32; MAX_DEVICES],
    /// Device pointers: cuMemAlloc, pitch, managed, async and pool allocations.
    pub ptrs: Tracker,
    /// CUarray and CUmipmappedArray handles.
    pub arrays: Tracker,
    /// CUmemGenericAllocationHandle (virtual memory management).
    pub vmm: Tracker,
    pub pools: Mutex<HashMap<u64, PoolState>>,
}

static PROC: AtomicPtr<Proc> = AtomicPtr::new(std::ptr::null_mut());
/// Fork generation of PROC; compared with FORK_GEN (bumped in the child after fork).
static PROC_GEN: AtomicU64 = AtomicU64::new(0);
static FORK_GEN: AtomicU64 = AtomicU64::new(0);
static INIT_LOCK: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_child() {
    // Async-signal-safe: only atomic stores. The child builds a new Proc (new slot,
    // nothing counted) on its next CUDA call; the parent's is left untouched.
    FORK_GEN.fetch_add(1, Ordering::Relaxed);
    INIT_LOCK.store(false, Ordering::Release);
}

/// This process's state, if it was already built (and not inherited through fork).
#[inline]
pub fn existing() -> Option<&'static Proc> {
    let p = PROC.load(Ordering::Acquire);
    if p.is_null() || PROC_GEN.load(Ordering::Relaxed) != FORK_GEN.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: PROC points to a leaked Box<Proc>, never freed.
    Some(unsafe { &*p })
}

/// This process's state, built on first use.
#[inline]
pub fn get() -> &'static Proc {
    match existing() {
        Some(p) => p,
        None => build(),
    }
}

#[cold]
fn build() -> &'static Proc {
    static ATFORK: Once = Once::new();
    ATFORK.call_once(|| {
        // SAFETY: registering a handler that only touches atomics.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    });
    while INIT_LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::yield_now();
    }
    // Released on every exit, a panic included.
    struct Unlock;
    impl Drop for Unlock {
        fn drop(&mut self) {
            INIT_LOCK.store(false, Ordering::Release);
        }
    }
    let _unlock = Unlock;
    match existing() {
        Some(p) => p,
        None => {
            let cfg = config();
            let proc = Box::leak(Box::new(Proc {
                acct: open_account(cfg),
                dev_index: Default::default(),
                ptrs: Tracker::default(),
                arrays: Tracker::default(),
                vmm: Tracker::default(),
                pools: Mutex::new(HashMap::new()),
            }));
            PROC_GEN.store(FORK_GEN.load(Ordering::Relaxed), Ordering::Relaxed);
            PROC.store(proc, Ordering::Release);
            proc
        }
    }
}

/// The process's account: claim mode, one part per claim (the plugin's files, never
/// created); env mode, `FGPU_STATE_DIR`'s file (created), or none configured (local).
fn open_account(cfg: &'static Config) -> Account {
    match &cfg.claims {
        Some(view) => {
            let paths: Vec<&std::path::Path> = view
                .claims
                .iter()
                .map(|c| c.memory_account.as_path())
                .collect();
            Account::open_claims(&paths, |uuid| cfg.claim_of(uuid))
        }
        None => Account::open(cfg.state_path.as_deref()),
    }
}

impl Proc {
    /// The account's device entry of CUDA ordinal `ord` (keyed by the GPU's UUID, so
    /// processes with different `CUDA_VISIBLE_DEVICES` book on the same entry).
    pub fn device(&self, ord: c_int) -> Option<usize> {
        let o = usize::try_from(ord).ok().filter(|&o| o < MAX_DEVICES)?;
        let v = self.dev_index[o].load(Ordering::Relaxed);
        if v != 0 {
            return Some(v as usize - 1);
        }
        let uuid = device_uuid(ord)?;
        let i = self.acct.device_index(&uuid, ord)?;
        self.dev_index[o].store(i as u32 + 1, Ordering::Relaxed);
        Some(i)
    }
}

/// The GPU's UUID from the driver, or a stand-in naming the ordinal; `None` when the
/// driver says there is no such device (the call is then left to the driver to refuse).
pub fn device_uuid(ord: c_int) -> Option<[u8; 16]> {
    let mut u = [0u8; 16];
    let mut dev: CUdevice = ord;
    if let Some(get) = real::cuDeviceGet() {
        // SAFETY: dev is a valid out-pointer.
        if unsafe { get(&mut dev, ord) } != CUDA_SUCCESS {
            return None;
        }
    }
    let getter = real::cuDeviceGetUuid_v2().or_else(real::cuDeviceGetUuid);
    if let Some(f) = getter
        // SAFETY: u is a 16-byte out-buffer (CUuuid).
        && unsafe { f(&mut u, dev) } == CUDA_SUCCESS
        && u != [0; 16]
    {
        return Some(u);
    }
    let mut u = *b"fgpu-ordinal\0\0\0\0";
    u[12..16].copy_from_slice(&(ord as u32).to_le_bytes());
    Some(u)
}

/// The device of the calling thread's current context.
#[inline]
pub fn current_ordinal() -> Option<c_int> {
    let f = real::cuCtxGetDevice()?;
    let mut d: CUdevice = -1;
    // SAFETY: d is a valid out-pointer.
    (unsafe { f(&mut d) } == CUDA_SUCCESS).then_some(d)
}

/// A quota that applies to an allocation.
#[derive(Clone, Copy)]
pub struct Quota {
    pub proc: &'static Proc,
    pub dev: usize,
    pub limit: u64,
    /// Research tier: the part of `limit` device memory backs (see
    /// [`crate::config::Config::physical`]).
    pub physical: Option<u64>,
}

/// The quota of ordinal `ord`, if one is set.
#[inline]
pub fn quota_of(ord: c_int) -> Option<Quota> {
    if crate::boundary::nested() {
        return None;
    }
    let limit = config().limit(ord)?;
    let proc = get();
    let dev = proc.device(ord)?;
    let physical = config().physical(ord);
    Some(Quota {
        proc,
        dev,
        limit,
        physical,
    })
}

/// The quota of the current context's device, if one is set.
#[inline]
pub fn current_quota() -> Option<Quota> {
    if !config().enabled {
        return None;
    }
    quota_of(current_ordinal()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn mount_points_come_from_mountinfo_with_escapes() {
        let mi = "22 1 0:21 / / rw - overlay overlay rw\n\
                  67 66 0:39 /lim /etc/fgpu/claims/u1/limits ro,relatime - tmpfs tmpfs rw\n\
                  68 66 0:39 /x /etc/fgpu/claims/a\\040b/limits ro - tmpfs tmpfs rw\n";
        assert!(is_mount_point(mi, Path::new("/etc/fgpu/claims/u1/limits")));
        assert!(is_mount_point(mi, Path::new("/etc/fgpu/claims/a b/limits")));
        assert!(!is_mount_point(mi, Path::new("/etc/fgpu/claims/u2/limits")));
        // A root (field 4) that names the path is not a mount point of it.
        assert!(!is_mount_point(mi, Path::new("/lim")));
    }
}
