//! A fake CUDA driver (`libcuda.so.1`) and NVML (`libnvidia-ml.so.1`) for tests.
//!
//! One cdylib exports both the `cu*` and the `nvml*` entry points; the test harness
//! (`mk/hook.mk`) copies it into a directory as `libcuda.so.1` and `libnvidia-ml.so.1`
//! and puts that directory on `LD_LIBRARY_PATH`. See `README.md`.
//!
//! Simulated GPUs: `FAKE_CUDA_GPUS` (default 1), each with `FAKE_CUDA_MEMORY_<i>` or
//! `FAKE_CUDA_MEMORY` bytes (suffixes `Ki Mi Gi Ti`, `K M G T`; default `80Gi`). A device
//! named by a `MIG-` UUID in `FAKE_CUDA_UUIDS` is a MIG instance: NVML gives its UUID in
//! that form, `CUDA_VISIBLE_DEVICES` selects it by it, and its memory is the instance's
//! (`FAKE_CUDA_MEMORY_<i>`, else the `memoryBytes` the fake backend's MIG state file at
//! `FAKE_CUDA_MIG_STATE` records for it), as a real driver reports an instance's memory
//! as the device's total.
//! Memory is accounted per process: allocations past a device's size fail with
//! `CUDA_ERROR_OUT_OF_MEMORY`. No memory is really taken: device pointers are addresses
//! from a per-device bump allocator. Managed memory (`cuMemAllocManaged`) is resident in
//! host memory, as a real driver's is once the device is full: it takes no device memory
//! (`cuMemGetInfo`'s free and NVML's figures are unchanged by it) and is counted apart
//! (`fakeCudaManagedBytes`).
//!
//! `cuGetProcAddress[_v2]` resolves base names (`cuMemAlloc`) by the requested CUDA
//! version and the per-thread-default-stream flag, like the real driver. With
//! `FAKE_CUDA_PROC_INTERNAL=1` it hands out internal entry points whose addresses differ
//! from the exported symbols (as a driver with private thunks would), which exercises
//! the shim's name-based fallback.
//!
//! Test-only exports (never part of CUDA): `fakeCudaUsedBytes(dev)`, `fakeCudaManagedBytes(dev)`,
//! `fakeCudaLaunchCount()`, `fakeCudaLiveAllocations()`, `fakeCudaBusyNs(dev, pid)`.
//!
//! Launches carry simulated durations and run on a virtual timeline shared by all
//! processes (`timeline.rs`; `FAKE_CUDA_BLOCK_NS`, `FAKE_CUDA_GRAPH_NS`,
//! `FAKE_CUDA_STATE`), from which fake NVML reports per-process and device utilisation.
//!
//! Processes are named across PID namespaces by (namespace inode, PID) and, for a
//! host-side reader (`FAKE_CUDA_NVML_HOST=1`), reported by their PIDs there (`pidns.rs`).
//! Driver-native per-cgroup memory limits (`nvmlDeviceSetMemoryLimits_v1`, with
//! `FAKE_CUDA_MEMORY_LIMITS=1`) are enforced in every allocation (`limits.rs`).
//! Device faults injected in the file `FAKE_CUDA_FAULTS` names (the fake backend's
//! `<profile>.faults.json`) reach NVML's event sets and health probes (`faults.rs`).
#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

pub mod faults;
pub mod gpus;
pub mod limits;
pub mod pidns;
pub mod procs;
pub mod shm;
pub mod timeline;

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_UNINITIALIZED: c_int = 1;
const NVML_ERROR_INVALID_ARGUMENT: c_int = 2;
const NVML_ERROR_INSUFFICIENT_SIZE: c_int = 7;

/// Most devices the fake simulates.
const MAX_GPUS: usize = 16;
const PTR_ALIGN: u64 = 512;

// ---------------------------------------------------------------- configuration

/// Parses `80Gi`, `1024Mi`, `10G`, `4096` (bytes).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suf) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mul: u64 = match suf {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(mul)
}

struct Config {
    sizes: Vec<u64>,
    /// `FAKE_CUDA_UUIDS`: the devices' UUIDs, in order (absent: [`default_uuid`]).
    uuids: Vec<[u8; 16]>,
    /// Which of `uuids` were given as `MIG-…`: MIG instances.
    mig: Vec<bool>,
    internal_proc: bool,
    reenter: bool,
    /// Simulated duration of one thread block of a kernel (ns); 0 = launches take no time.
    block_ns: u64,
    /// Simulated duration of one `cuGraphLaunch` (ns).
    graph_ns: u64,
    /// Most work (ns) queued on a device before a launch waits.
    queue_ns: u64,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn config() -> &'static Config {
    static CFG: OnceLock<Config> = OnceLock::new();
    CFG.get_or_init(|| {
        // `FAKE_CUDA_UUIDS=GPU-…,GPU-…` names the devices (as a node's plugin tells the fake
        // in a container which GPUs the claim holds); a malformed entry ends the list.
        let named: Vec<([u8; 16], bool)> = std::env::var("FAKE_CUDA_UUIDS")
            .ok()
            .map(|v| {
                v.split(',')
                    .map_while(|u| parse_device_uuid(u.trim()))
                    .take(MAX_GPUS)
                    .collect()
            })
            .unwrap_or_default();
        let (uuids, mig): (Vec<[u8; 16]>, Vec<bool>) = named.into_iter().unzip();
        let mig_memory = mig_state_memory(std::env::var_os("FAKE_CUDA_MIG_STATE"));
        let n = std::env::var("FAKE_CUDA_GPUS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(if uuids.is_empty() { 1 } else { uuids.len() })
            .min(MAX_GPUS);
        let default = std::env::var("FAKE_CUDA_MEMORY")
            .ok()
            .and_then(|v| parse_bytes(&v))
            .unwrap_or(80 << 30);
        let sizes = (0..n)
            .map(|i| {
                let instance = || {
                    let u = uuids.get(i).filter(|_| mig.get(i) == Some(&true))?;
                    mig_memory.get(&uuid_string(u)[4..]).copied()
                };
                std::env::var(format!("FAKE_CUDA_MEMORY_{i}"))
                    .ok()
                    .and_then(|v| parse_bytes(&v))
                    .or_else(instance)
                    .unwrap_or(default)
            })
            .collect();
        let internal_proc = std::env::var("FAKE_CUDA_PROC_INTERNAL").is_ok_and(|v| v == "1");
        let reenter = std::env::var("FAKE_CUDA_REENTER").is_ok_and(|v| v == "1");
        Config {
            sizes,
            uuids,
            mig,
            internal_proc,
            reenter,
            block_ns: env_u64("FAKE_CUDA_BLOCK_NS", 0),
            graph_ns: env_u64("FAKE_CUDA_GRAPH_NS", 0),
            queue_ns: env_u64("FAKE_CUDA_QUEUE_NS", 50_000_000),
        }
    })
}

/// The 16-byte UUID of simulated device `i` (the NVML string is its `GPU-` form): the
/// `i`-th of `FAKE_CUDA_UUIDS`, else [`default_uuid`].
pub fn device_uuid(i: usize) -> [u8; 16] {
    config()
        .uuids
        .get(i)
        .copied()
        .unwrap_or_else(|| default_uuid(i))
}

/// The NVML UUID string of simulated device `i`: `MIG-…` for a MIG instance, else `GPU-…`.
pub fn device_uuid_string(i: usize) -> String {
    let s = uuid_string(&device_uuid(i));
    if config().mig.get(i) == Some(&true) {
        format!("MIG-{}", &s[4..])
    } else {
        s
    }
}

/// The instances' memory in the fake backend's MIG state file at `path`
/// (`{"gpus": {"GPU-…": [{"uuid": "MIG-…", "memoryBytes": N, …}]}}`), by the UUID's hex
/// part in lower case; nothing when unset or unreadable.
fn mig_state_memory(path: Option<std::ffi::OsString>) -> HashMap<String, u64> {
    let Some(text) = path.and_then(|p| std::fs::read(p).ok()) else {
        return HashMap::new();
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return HashMap::new();
    };
    v["gpus"]
        .as_object()
        .into_iter()
        .flat_map(|g| g.values())
        .filter_map(|l| l.as_array())
        .flatten()
        .filter_map(|i| {
            let uuid = i["uuid"]
                .as_str()?
                .strip_prefix("MIG-")?
                .to_ascii_lowercase();
            Some((uuid, i["memoryBytes"].as_u64()?))
        })
        .collect()
}

/// `GPU-fa4ec0da-0000-0000-8000-0000000000<i>`.
fn default_uuid(i: usize) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..4].copy_from_slice(&[0xfa, 0x4e, 0xc0, 0xda]);
    u[15] = i as u8;
    u[8] = 0x80;
    u
}

/// `GPU-…` or `MIG-…` (32 hex digits with dashes, either case) → its 16 bytes, and
/// whether it names a MIG instance.
fn parse_device_uuid(s: &str) -> Option<([u8; 16], bool)> {
    let (rest, mig) = match s.strip_prefix("MIG-") {
        Some(r) => (r, true),
        None => (s.strip_prefix("GPU-")?, false),
    };
    Some((parse_uuid(&format!("GPU-{rest}"))?, mig))
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (either case) → its 16 bytes.
fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s
        .strip_prefix("GPU-")?
        .bytes()
        .filter(|&b| b != b'-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut u = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        u[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(u)
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (lower case), as NVML and `nvidia-smi` write it.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let mut s = String::from("GPU-");
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

// ---------------------------------------------------------------- state

struct Device {
    size: u64,
    used: u64,
    /// Managed memory of this process on the device (host-resident: not in `used`).
    managed: u64,
    next: u64,
}

/// The `pool` of a pointer that is managed memory (no pool has this handle).
const MANAGED: u64 = u64::MAX;

struct State {
    devs: Vec<Device>,
    /// device pointer -> (device, size, pool handle or 0)
    ptrs: HashMap<u64, (usize, u64, u64)>,
    /// array / mipmapped array / VMM handle -> (device, size)
    handles: HashMap<u64, (usize, u64)>,
    pools: HashMap<u64, pools::Pool>,
    current_pool: Vec<u64>,
    next_handle: u64,
}

impl State {
    fn new() -> State {
        let sizes = &config().sizes;
        let mut st = State {
            devs: sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| Device {
                    size,
                    used: 0,
                    managed: 0,
                    next: (i as u64 + 1) << 44,
                })
                .collect(),
            ptrs: HashMap::new(),
            handles: HashMap::new(),
            pools: HashMap::new(),
            current_pool: Vec::new(),
            next_handle: 0x5000,
        };
        for d in 0..sizes.len() {
            let h = st.handle();
            st.pools.insert(h, pools::Pool::new(d));
            st.current_pool.push(h);
        }
        st
    }

    fn handle(&mut self) -> u64 {
        self.next_handle += 16;
        self.next_handle
    }

    /// A new handle owning `size` bytes already taken on `dev` (arrays, VMM allocations).
    fn hold(&mut self, dev: usize, size: u64) -> u64 {
        let h = self.handle();
        self.handles.insert(h, (dev, size));
        h
    }

    /// Takes `size` bytes of device memory (no pointer), or OOM.
    fn take(&mut self, dev: usize, size: u64) -> Result<(), CUresult> {
        let d = self.devs.get_mut(dev).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        match d.used.checked_add(size) {
            // The cgroup's driver-native limit, if any, and the process table's figure.
            Some(n) if n <= d.size => match limits::charge(dev, d.used, n) {
                Ok(()) => {
                    d.used = n;
                    Ok(())
                }
                Err(limits::OverLimit) => Err(CUDA_ERROR_OUT_OF_MEMORY),
            },
            _ => Err(CUDA_ERROR_OUT_OF_MEMORY),
        }
    }

    fn give(&mut self, dev: usize, size: u64) {
        if let Some(d) = self.devs.get_mut(dev) {
            d.used = d.used.saturating_sub(size);
            procs::set_used(dev, d.used);
        }
    }

    fn address(&mut self, dev: usize, size: u64) -> u64 {
        let d = &mut self.devs[dev];
        let p = d.next;
        d.next += size.div_ceil(PTR_ALIGN).max(1) * PTR_ALIGN;
        p
    }

    fn alloc(&mut self, dev: usize, size: u64) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        self.take(dev, size)?;
        let p = self.address(dev, size);
        self.ptrs.insert(p, (dev, size, 0));
        Ok(p)
    }

    /// A managed allocation: an address, no device memory taken.
    fn alloc_managed(&mut self, dev: usize, size: u64) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let d = self.devs.get_mut(dev).ok_or(CUDA_ERROR_INVALID_DEVICE)?;
        d.managed = d.managed.saturating_add(size);
        let p = self.address(dev, size);
        self.ptrs.insert(p, (dev, size, MANAGED));
        Ok(p)
    }

    fn free(&mut self, ptr: u64) -> CUresult {
        let Some((dev, size, pool)) = self.ptrs.remove(&ptr) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        if pool == 0 {
            self.give(dev, size);
            return CUDA_SUCCESS;
        }
        if pool == MANAGED {
            if let Some(d) = self.devs.get_mut(dev) {
                d.managed = d.managed.saturating_sub(size);
            }
            return CUDA_SUCCESS;
        }
        // Pool memory goes back to the pool (kept reserved until trimmed or destroyed).
        let mut release = 0;
        let mut remove = false;
        if let Some(p) = self.pools.get_mut(&pool) {
            p.used = p.used.saturating_sub(size);
            if p.destroyed && p.used == 0 {
                release = p.reserved;
                remove = true;
            }
        }
        if remove {
            self.pools.remove(&pool);
        }
        self.give(dev, release);
        CUDA_SUCCESS
    }
}

fn state() -> MutexGuard<'static, State> {
    static ST: OnceLock<Mutex<State>> = OnceLock::new();
    ST.get_or_init(|| Mutex::new(State::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static LAUNCHES: AtomicU64 = AtomicU64::new(0);
/// End of this process's last launch on the timeline (what synchronisation waits for).
static LAST_END: AtomicU64 = AtomicU64::new(0);

/// Puts a launch of `dur` ns on the current device's timeline (waiting while the
/// device's queue is full) and counts it.
fn launch_on_timeline(dur: u64) -> CUresult {
    let dev = match current_device() {
        Ok(d) => d,
        Err(e) => return e,
    };
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    if dur == 0 {
        return CUDA_SUCCESS;
    }
    let tl = timeline::mapped();
    // Alive for the others before the key is on the timeline.
    pidns::register(false);
    let key = pidns::own_key();
    loop {
        match tl.enqueue(
            gpus::slot(dev),
            key,
            dur,
            timeline::monotonic_ns(),
            config().queue_ns,
        ) {
            timeline::Enqueue::Placed { end, .. } => {
                LAST_END.fetch_max(end, Ordering::Relaxed);
                return CUDA_SUCCESS;
            }
            timeline::Enqueue::Wait(ns) => timeline::sleep_ns(ns.min(5_000_000)),
        }
    }
}

/// Synchronisation: wait until this process's launches have run.
fn wait_own_work() {
    loop {
        let now = timeline::monotonic_ns();
        let end = LAST_END.load(Ordering::Relaxed);
        if end <= now {
            return;
        }
        timeline::sleep_ns(end - now);
    }
}

fn kernel_ns(gx: c_uint, gy: c_uint, gz: c_uint) -> u64 {
    (gx as u64 * gy as u64 * gz as u64).saturating_mul(config().block_ns)
}

/// `CUlaunchConfig` (the fields the fake reads).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub stream: usize,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

// Contexts are encoded handles: CTX_TAG | serial << 8 | device. The primary context of
// device d has serial 0.
const CTX_TAG: usize = 0xC7C7_0000_0000;
static CTX_SERIAL: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn ctx_device(ctx: usize) -> Option<usize> {
    if ctx & 0xFFFF_0000_0000 != CTX_TAG {
        return None;
    }
    let d = ctx & 0xff;
    (d < config().sizes.len()).then_some(d)
}

fn current_device() -> Result<usize, CUresult> {
    if !INITIALIZED.load(Ordering::Relaxed) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    ctx_device(CURRENT.with(|c| c.get())).ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

fn visible() -> &'static [usize] {
    procs::visible(config().sizes.len(), device_uuid_string)
}

fn check_dev(dev: CUdevice) -> Result<usize, CUresult> {
    if !INITIALIZED.load(Ordering::Relaxed) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    // The ordinal as the process sees it (after CUDA_VISIBLE_DEVICES) → the device.
    visible()
        .get(usize::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_DEVICE)
}

/// Writes `v` through `p` if it is not null.
fn put<T>(p: *mut T, v: T) -> bool {
    if p.is_null() {
        return false;
    }
    // SAFETY: the caller of the C API passed a pointer to a writable T; null is refused.
    unsafe { p.write(v) };
    true
}

/// Reads a `T` from `p` if it is not null.
fn get<T: Copy>(p: *const T) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passed a pointer to a readable T; null is refused.
    Some(unsafe { p.read() })
}

macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return e,
        }
    };
}

/// Bytes per element of a `CUarray_format` (unknown formats count as 16 bytes).
pub fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        0x03 | 0x0a | 0x20 => 4,
        _ => 16,
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3dDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> u64 {
    (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(channels.max(1) as u64)
        .saturating_mul(format_bytes(format))
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocationProp {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32: *mut c_void,
    pub flags: [u8; 8],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

const LOCATION_DEVICE: c_int = 1;

fn error_name(e: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    Some(match e {
        0 => (c"CUDA_SUCCESS", c"no error"),
        1 => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        2 => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        3 => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        101 => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        201 => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        400 => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        500 => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        801 => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        999 => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}

unsafe extern "C" {
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
}

/// The first global definition of `name` (with `FAKE_CUDA_REENTER=1` the `_ptsz`
/// variants call their base function through it, as a driver calling its own exported
/// entry points would — reaching an interposer such as libfgpu.so).
fn exported<F: Copy>(name: &CStr) -> Option<F> {
    // SAFETY: RTLD_DEFAULT (null) lookup of a NUL-terminated name.
    let p = unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: F is a function pointer type of the symbol's signature (caller's choice).
    Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

// ---------------------------------------------------------------- exports
//
// Every entry point is defined once as an exported symbol and once, with the same
// behaviour, in `alt` (not exported) for `FAKE_CUDA_PROC_INTERNAL=1`.

macro_rules! exports {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult $body
        )*
        /// Internal entry points with their own addresses (see the crate doc).
        pub mod alt {
            use super::*;
            $(
                #[inline(never)]
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
                    // SAFETY: same contract as the exported function it forwards to.
                    unsafe { super::$name($($arg),*) }
                }
            )*
        }
        /// (name, exported address, internal address) of every entry point.
        pub(crate) fn entry_points() -> &'static [(&'static str, usize, usize)] {
            static T: OnceLock<Vec<(&'static str, usize, usize)>> = OnceLock::new();
            T.get_or_init(|| vec![
                $( (stringify!($name), $name as *const () as usize, alt::$name as *const () as usize), )*
            ])
        }
    };
}

pub mod pools;

exports! {
    fn cuInit(flags: c_uint) {
        if flags != 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        drop(state());
        INITIALIZED.store(true, Ordering::Relaxed);
        CUDA_SUCCESS
    }

    fn cuDriverGetVersion(v: *mut c_int) {
        if put(v, 12080) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuDeviceGetCount(n: *mut c_int) {
        if !INITIALIZED.load(Ordering::Relaxed) {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        if put(n, visible().len() as c_int) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) {
        tri!(check_dev(ordinal));
        // The handle is the ordinal (every entry point maps it through check_dev).
        if put(dev, ordinal) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        let d = tri!(check_dev(dev));
        if name.is_null() || len <= 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let s = format!("Fake GPU {} ({} MiB)\0", d, config().sizes[d] >> 20);
        let n = s.len().min(len as usize);
        // SAFETY: `name` has room for `len` bytes (caller contract); we write at most that.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, name, n);
            *name.add(n - 1) = 0;
        }
        CUDA_SUCCESS
    }

    fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: CUdevice) {
        tri!(check_dev(dev));
        let val = match attr {
            16 => 132,  // multiprocessor count
            39 => 2048, // max threads per multiprocessor
            75 => 9,    // compute capability major
            76 => 0,    // compute capability minor
            1 => 1024,  // max threads per block
            _ => 0,
        };
        if put(v, val) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) {
        let d = tri!(check_dev(dev));
        if put(uuid, device_uuid(d)) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) {
        // SAFETY: same contract.
        unsafe { cuDeviceGetUuid(uuid, dev) }
    }

    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        let d = tri!(check_dev(dev));
        if put(bytes, config().sizes[d] as usize) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuCtxSetCurrent(ctx: usize) {
        if !INITIALIZED.load(Ordering::Relaxed) {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        if ctx != 0 && ctx_device(ctx).is_none() {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        CURRENT.with(|x| x.set(ctx));
        CUDA_SUCCESS
    }

    fn cuCtxGetCurrent(ctx: *mut usize) {
        if put(ctx, CURRENT.with(|x| x.get())) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuCtxGetDevice(dev: *mut CUdevice) {
        let d = tri!(current_device());
        let ord = visible().iter().position(|&v| v == d).unwrap_or(d);
        if put(dev, ord as CUdevice) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuStreamCreate(stream: *mut usize, _flags: c_uint) {
        tri!(current_device());
        let h = state().handle() as usize;
        if put(stream, h) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuStreamDestroy_v2(_stream: usize) {
        tri!(current_device());
        CUDA_SUCCESS
    }

    fn cuModuleLoadData(module: *mut usize, image: *const c_void) {
        tri!(current_device());
        if image.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let h = state().handle() as usize;
        if put(module, h) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuModuleGetFunction(f: *mut usize, module: usize, name: *const c_char) {
        tri!(current_device());
        if module == 0 || name.is_null() {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        if put(f, module + 1) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuModuleUnload(module: usize) {
        if module == 0 { CUDA_ERROR_INVALID_HANDLE } else { CUDA_SUCCESS }
    }

    fn cuLaunchKernel(
        f: usize, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        _shared: c_uint, _stream: usize, _params: *mut *mut c_void, _extra: *mut *mut c_void,
    ) {
        if f == 0 {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        if gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        launch_on_timeline(kernel_ns(gx, gy, gz))
    }

    fn cuLaunchCooperativeKernel(
        f: usize, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: usize, params: *mut *mut c_void,
    ) {
        // SAFETY: same contract (no `extra`).
        unsafe { cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, std::ptr::null_mut()) }
    }

    fn cuLaunchCooperativeKernel_ptsz(
        f: usize, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: usize, params: *mut *mut c_void,
    ) {
        // SAFETY: same contract.
        unsafe { cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params) }
    }

    fn cuGraphLaunch(exec: usize, _stream: usize) {
        if exec == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        launch_on_timeline(config().graph_ns)
    }

    fn cuGraphLaunch_ptsz(exec: usize, stream: usize) {
        // SAFETY: same contract.
        unsafe { cuGraphLaunch(exec, stream) }
    }

    fn cuLaunchKernel_ptsz(
        f: usize, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: usize, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) {
        // SAFETY: same contract.
        unsafe { cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
    }

    fn cuLaunchKernelEx(config: *const c_void, f: usize, _params: *mut *mut c_void, _extra: *mut *mut c_void) {
        if config.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if f == 0 {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        // SAFETY: config is a CUlaunchConfig (caller contract), checked non-null.
        let c = unsafe { (config as *const LaunchConfig).read() };
        launch_on_timeline(kernel_ns(c.grid[0].max(1), c.grid[1].max(1), c.grid[2].max(1)))
    }

    fn cuLaunchKernelEx_ptsz(config: *const c_void, f: usize, params: *mut *mut c_void, extra: *mut *mut c_void) {
        // SAFETY: same contract.
        unsafe { cuLaunchKernelEx(config, f, params, extra) }
    }

    fn cuGetErrorString(e: CUresult, s: *mut *const c_char) {
        match error_name(e) {
            Some((_, d)) => { put(s, d.as_ptr()); CUDA_SUCCESS }
            None => { put(s, std::ptr::null()); CUDA_ERROR_INVALID_VALUE }
        }
    }

    fn cuGetErrorName(e: CUresult, s: *mut *const c_char) {
        match error_name(e) {
            Some((n, _)) => { put(s, n.as_ptr()); CUDA_SUCCESS }
            None => { put(s, std::ptr::null()); CUDA_ERROR_INVALID_VALUE }
        }
    }

    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        let d = tri!(current_device());
        if free.is_null() || total.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let st = state();
        let dev = &st.devs[d];
        // A hard limit on the process's cgroup is the total it sees.
        let (t, f) = limits::visible_memory(d, dev.size, dev.used);
        put(free, f as usize);
        put(total, t as usize);
        CUDA_SUCCESS
    }

    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) {
        let d = tri!(current_device());
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let p = tri!(state().alloc(d, size as u64));
        put(dptr, p);
        CUDA_SUCCESS
    }

    fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) {
        let d = tri!(current_device());
        if dptr.is_null() || pitch.is_null() || !matches!(elem, 4 | 8 | 16) || width == 0 || height == 0 {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let p = (width as u64).div_ceil(PTR_ALIGN) * PTR_ALIGN;
        let a = tri!(state().alloc(d, p * height as u64));
        put(dptr, a);
        put(pitch, p as usize);
        CUDA_SUCCESS
    }

    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, size: usize, flags: c_uint) {
        let d = tri!(current_device());
        if dptr.is_null() || (flags != 1 && flags != 2) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let p = tri!(state().alloc_managed(d, size as u64));
        put(dptr, p);
        CUDA_SUCCESS
    }

    fn cuMemFree_v2(dptr: CUdeviceptr) {
        tri!(current_device());
        if dptr == 0 {
            return CUDA_SUCCESS;
        }
        state().free(dptr)
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) {
        tri!(current_device());
        let layout = tri!(std::alloc::Layout::from_size_align(size.max(1), 64).map_err(|_| CUDA_ERROR_INVALID_VALUE));
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        state().handles.insert(p as u64, (usize::MAX, size as u64));
        put(pp, p as *mut c_void);
        CUDA_SUCCESS
    }

    fn cuMemFreeHost(p: *mut c_void) {
        let Some((_, size)) = state().handles.remove(&(p as u64)) else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        // SAFETY: p came from cuMemAllocHost_v2 with this layout.
        unsafe { std::alloc::dealloc(p as *mut u8, std::alloc::Layout::from_size_align_unchecked(size.max(1) as usize, 64)) };
        CUDA_SUCCESS
    }

    fn cuArrayCreate_v2(arr: *mut u64, desc: *const ArrayDesc) {
        let d = tri!(current_device());
        let (Some(desc), false) = (get(desc), arr.is_null()) else { return CUDA_ERROR_INVALID_VALUE };
        let size = array_bytes(desc.width, desc.height, 1, desc.format, desc.channels);
        let mut st = state();
        tri!(st.take(d, size));
        let h = st.hold(d, size);
        put(arr, h);
        CUDA_SUCCESS
    }

    fn cuArray3DCreate_v2(arr: *mut u64, desc: *const Array3dDesc) {
        let d = tri!(current_device());
        let (Some(desc), false) = (get(desc), arr.is_null()) else { return CUDA_ERROR_INVALID_VALUE };
        let size = array_bytes(desc.width, desc.height, desc.depth, desc.format, desc.channels);
        let mut st = state();
        tri!(st.take(d, size));
        let h = st.hold(d, size);
        put(arr, h);
        CUDA_SUCCESS
    }

    fn cuArrayDestroy(arr: u64) {
        let mut st = state();
        let Some((d, size)) = st.handles.remove(&arr) else { return CUDA_ERROR_INVALID_HANDLE };
        st.give(d, size);
        CUDA_SUCCESS
    }

    fn cuMipmappedArrayCreate(arr: *mut u64, desc: *const Array3dDesc, levels: c_uint) {
        let d = tri!(current_device());
        let (Some(desc), false) = (get(desc), arr.is_null()) else { return CUDA_ERROR_INVALID_VALUE };
        let mut size = 0u64;
        for l in 0..levels.clamp(1, 32) {
            let dim = |x: usize| if x == 0 { 0 } else { (x >> l).max(1) };
            size = size.saturating_add(array_bytes(dim(desc.width), dim(desc.height), dim(desc.depth), desc.format, desc.channels));
        }
        let mut st = state();
        tri!(st.take(d, size));
        let h = st.hold(d, size);
        put(arr, h);
        CUDA_SUCCESS
    }

    fn cuMipmappedArrayDestroy(arr: u64) {
        // SAFETY: same contract.
        unsafe { cuArrayDestroy(arr) }
    }

    fn cuMemCreate(handle: *mut u64, size: usize, prop: *const MemAllocationProp, flags: u64) {
        if !INITIALIZED.load(Ordering::Relaxed) {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        let (Some(prop), false, 0) = (get(prop), handle.is_null(), flags) else { return CUDA_ERROR_INVALID_VALUE };
        if size == 0 || !size.is_multiple_of(2 << 20) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut st = state();
        let dev = if prop.location.kind == LOCATION_DEVICE {
            let d = tri!(check_dev(prop.location.id));
            tri!(st.take(d, size as u64));
            d
        } else {
            usize::MAX
        };
        let h = st.hold(dev, size as u64);
        put(handle, h);
        CUDA_SUCCESS
    }

    fn cuMemRelease(handle: u64) {
        let mut st = state();
        let Some((d, size)) = st.handles.remove(&handle) else { return CUDA_ERROR_INVALID_VALUE };
        st.give(d, size);
        CUDA_SUCCESS
    }

    fn cuMemGetAllocationGranularity(g: *mut usize, _prop: *const MemAllocationProp, _opt: c_int) {
        if put(g, 2 << 20) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut u64, dev: CUdevice) {
        let d = tri!(check_dev(dev));
        let st = state();
        let h = st.pools.iter().find(|(_, p)| p.dev == d).map(|(h, _)| *h).unwrap_or(0);
        // The default pool is the first pool made for the device (the lowest handle).
        let h = st.pools.iter().filter(|(_, p)| p.dev == d).map(|(h, _)| *h).min().unwrap_or(h);
        if put(pool, h) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuDeviceGetMemPool(pool: *mut u64, dev: CUdevice) {
        let d = tri!(check_dev(dev));
        let h = state().current_pool[d];
        if put(pool, h) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    fn cuDeviceSetMemPool(dev: CUdevice, pool: u64) {
        let d = tri!(check_dev(dev));
        let mut st = state();
        match st.pools.get(&pool) {
            Some(p) if p.dev == d && !p.destroyed => { st.current_pool[d] = pool; CUDA_SUCCESS }
            _ => CUDA_ERROR_INVALID_VALUE,
        }
    }

    fn cuMemPoolCreate(pool: *mut u64, props: *const MemPoolProps) {
        if !INITIALIZED.load(Ordering::Relaxed) {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        let (Some(props), false) = (get(props), pool.is_null()) else { return CUDA_ERROR_INVALID_VALUE };
        if props.location.kind != LOCATION_DEVICE {
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        let d = tri!(check_dev(props.location.id));
        let mut st = state();
        let h = st.handle();
        st.pools.insert(h, pools::Pool::new(d));
        put(pool, h);
        CUDA_SUCCESS
    }

    fn cuMemPoolDestroy(pool: u64) {
        let mut st = state();
        let Some(p) = st.pools.get_mut(&pool) else { return CUDA_ERROR_INVALID_VALUE };
        if p.destroyed {
            return CUDA_ERROR_INVALID_VALUE;
        }
        p.destroyed = true;
        let (d, idle, used) = (p.dev, p.reserved - p.used, p.used);
        p.reserved = p.used;
        if used == 0 {
            st.pools.remove(&pool);
        }
        if st.current_pool.get(d) == Some(&pool) {
            // Falls back to the default pool, as the real driver does.
            let def = st.pools.iter().filter(|(_, q)| q.dev == d && !q.destroyed).map(|(h, _)| *h).min().unwrap_or(0);
            st.current_pool[d] = def;
        }
        st.give(d, idle);
        CUDA_SUCCESS
    }

    fn cuMemPoolTrimTo(pool: u64, keep: usize) {
        let mut st = state();
        let Some(p) = st.pools.get_mut(&pool) else { return CUDA_ERROR_INVALID_VALUE };
        let release = (p.reserved - p.used).min(p.reserved.saturating_sub(keep as u64));
        p.reserved -= release;
        let d = p.dev;
        st.give(d, release);
        CUDA_SUCCESS
    }

    fn cuMemPoolGetAttribute(pool: u64, attr: c_int, value: *mut c_void) {
        pools::get_attribute(&state(), pool, attr, value)
    }

    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, size: usize, _stream: usize) {
        let d = tri!(current_device());
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut st = state();
        let pool = st.current_pool[d];
        let p = tri!(st.pool_alloc(pool, size as u64));
        put(dptr, p);
        CUDA_SUCCESS
    }

    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, stream: usize) {
        if config().reenter {
            type F = unsafe extern "C" fn(*mut CUdeviceptr, usize, usize) -> CUresult;
            if let Some(f) = exported::<F>(c"cuMemAllocAsync") {
                // SAFETY: the global definition of cuMemAllocAsync has this signature.
                return unsafe { f(dptr, size, stream) };
            }
        }
        // SAFETY: same contract.
        unsafe { cuMemAllocAsync(dptr, size, stream) }
    }

    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, size: usize, pool: u64, _stream: usize) {
        tri!(current_device());
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let p = tri!(state().pool_alloc(pool, size as u64));
        put(dptr, p);
        CUDA_SUCCESS
    }

    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, size: usize, pool: u64, stream: usize) {
        // SAFETY: same contract.
        unsafe { cuMemAllocFromPoolAsync(dptr, size, pool, stream) }
    }

    fn cuMemFreeAsync(dptr: CUdeviceptr, _stream: usize) {
        tri!(current_device());
        state().free(dptr)
    }

    fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: usize) {
        if config().reenter {
            type F = unsafe extern "C" fn(CUdeviceptr, usize) -> CUresult;
            if let Some(f) = exported::<F>(c"cuMemFreeAsync") {
                // SAFETY: the global definition of cuMemFreeAsync has this signature.
                return unsafe { f(dptr, stream) };
            }
        }
        // SAFETY: same contract.
        unsafe { cuMemFreeAsync(dptr, stream) }
    }

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
        // SAFETY: same contract; the status pointer may be null.
        unsafe { cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut()) }
    }

    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) {
        if symbol.is_null() || pfn.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: symbol is a NUL-terminated string (caller contract), checked non-null.
        let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
        put(pfn, std::ptr::null_mut());
        match proc_lookup(name, version, flags) {
            Ok(p) => {
                put(pfn, p as *mut c_void);
                put(status, 0);
                CUDA_SUCCESS
            }
            Err(s) => {
                put(status, s);
                CUDA_ERROR_NOT_FOUND
            }
        }
    }

    fn fakeCudaReset() {
        // Test helper: forget every allocation of this process.
        let mut st = state();
        *st = State::new();
        CUDA_SUCCESS
    }
}

/// `(base name, CUDA version that introduced this variant, symbol, per-thread symbol)`.
/// The real driver resolves base names only.
const PROC_TABLE: &[(&str, c_int, &str, Option<&str>)] = &[
    ("cuInit", 2000, "cuInit", None),
    ("cuDriverGetVersion", 2020, "cuDriverGetVersion", None),
    ("cuDeviceGetCount", 2000, "cuDeviceGetCount", None),
    ("cuDeviceGet", 2000, "cuDeviceGet", None),
    ("cuDeviceGetName", 2000, "cuDeviceGetName", None),
    ("cuDeviceGetAttribute", 2000, "cuDeviceGetAttribute", None),
    ("cuDeviceGetUuid", 9020, "cuDeviceGetUuid", None),
    ("cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2", None),
    ("cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", None),
    ("cuCtxSetCurrent", 4000, "cuCtxSetCurrent", None),
    ("cuCtxGetCurrent", 4000, "cuCtxGetCurrent", None),
    ("cuCtxGetDevice", 2000, "cuCtxGetDevice", None),
    ("cuStreamCreate", 2000, "cuStreamCreate", None),
    ("cuStreamDestroy", 4000, "cuStreamDestroy_v2", None),
    ("cuModuleLoadData", 2000, "cuModuleLoadData", None),
    ("cuModuleGetFunction", 2000, "cuModuleGetFunction", None),
    ("cuModuleUnload", 2000, "cuModuleUnload", None),
    (
        "cuLaunchKernel",
        4000,
        "cuLaunchKernel",
        Some("cuLaunchKernel_ptsz"),
    ),
    (
        "cuLaunchKernelEx",
        11060,
        "cuLaunchKernelEx",
        Some("cuLaunchKernelEx_ptsz"),
    ),
    (
        "cuLaunchCooperativeKernel",
        9000,
        "cuLaunchCooperativeKernel",
        Some("cuLaunchCooperativeKernel_ptsz"),
    ),
    (
        "cuGraphLaunch",
        10000,
        "cuGraphLaunch",
        Some("cuGraphLaunch_ptsz"),
    ),
    ("cuGetErrorString", 6000, "cuGetErrorString", None),
    ("cuGetErrorName", 6000, "cuGetErrorName", None),
    ("cuMemGetInfo", 3020, "cuMemGetInfo_v2", None),
    ("cuMemAlloc", 3020, "cuMemAlloc_v2", None),
    ("cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", None),
    ("cuMemAllocManaged", 6000, "cuMemAllocManaged", None),
    ("cuMemFree", 3020, "cuMemFree_v2", None),
    ("cuMemAllocHost", 3020, "cuMemAllocHost_v2", None),
    ("cuMemFreeHost", 2000, "cuMemFreeHost", None),
    ("cuArrayCreate", 3020, "cuArrayCreate_v2", None),
    ("cuArray3DCreate", 3020, "cuArray3DCreate_v2", None),
    ("cuArrayDestroy", 2000, "cuArrayDestroy", None),
    (
        "cuMipmappedArrayCreate",
        5000,
        "cuMipmappedArrayCreate",
        None,
    ),
    (
        "cuMipmappedArrayDestroy",
        5000,
        "cuMipmappedArrayDestroy",
        None,
    ),
    ("cuMemCreate", 10020, "cuMemCreate", None),
    ("cuMemRelease", 10020, "cuMemRelease", None),
    (
        "cuMemGetAllocationGranularity",
        10020,
        "cuMemGetAllocationGranularity",
        None,
    ),
    (
        "cuDeviceGetDefaultMemPool",
        11020,
        "cuDeviceGetDefaultMemPool",
        None,
    ),
    ("cuDeviceGetMemPool", 11020, "cuDeviceGetMemPool", None),
    ("cuDeviceSetMemPool", 11020, "cuDeviceSetMemPool", None),
    ("cuMemPoolCreate", 11020, "cuMemPoolCreate", None),
    ("cuMemPoolDestroy", 11020, "cuMemPoolDestroy", None),
    ("cuMemPoolTrimTo", 11020, "cuMemPoolTrimTo", None),
    (
        "cuMemPoolGetAttribute",
        11020,
        "cuMemPoolGetAttribute",
        None,
    ),
    (
        "cuMemAllocAsync",
        11020,
        "cuMemAllocAsync",
        Some("cuMemAllocAsync_ptsz"),
    ),
    (
        "cuMemAllocFromPoolAsync",
        11020,
        "cuMemAllocFromPoolAsync",
        Some("cuMemAllocFromPoolAsync_ptsz"),
    ),
    (
        "cuMemFreeAsync",
        11020,
        "cuMemFreeAsync",
        Some("cuMemFreeAsync_ptsz"),
    ),
    ("cuGetProcAddress", 11030, "cuGetProcAddress", None),
    ("cuGetProcAddress", 12000, "cuGetProcAddress_v2", None),
];

const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;
const SYMBOL_NOT_FOUND: c_int = 1;
const VERSION_NOT_SUFFICIENT: c_int = 2;

fn proc_lookup(name: &str, version: c_int, flags: u64) -> Result<usize, c_int> {
    let candidates = PROC_TABLE
        .iter()
        .chain(pools::PROC_TABLE)
        .filter(|e| e.0 == name);
    let mut found = false;
    let mut best: Option<&(&str, c_int, &str, Option<&str>)> = None;
    for e in candidates {
        found = true;
        if e.1 <= version && best.is_none_or(|b| e.1 > b.1) {
            best = Some(e);
        }
    }
    let Some(e) = best else {
        return Err(if found {
            VERSION_NOT_SUFFICIENT
        } else {
            SYMBOL_NOT_FOUND
        });
    };
    let sym = match e.3 {
        Some(pt) if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 => pt,
        _ => e.2,
    };
    let internal = config().internal_proc;
    entry_points()
        .iter()
        .chain(pools::entry_points())
        .find(|p| p.0 == sym)
        .map(|p| if internal { p.2 } else { p.1 })
        .ok_or(SYMBOL_NOT_FOUND)
}

// ---------------------------------------------------------------- test-only exports

/// Bytes this process holds on simulated device `dev` (`u64::MAX` if no such device).
#[unsafe(no_mangle)]
pub extern "C" fn fakeCudaUsedBytes(dev: c_int) -> u64 {
    let st = state();
    st.devs.get(dev as usize).map_or(u64::MAX, |d| d.used)
}

/// Bytes of managed memory this process holds on simulated device `dev` (host-resident,
/// not in [`fakeCudaUsedBytes`]; `u64::MAX` if no such device).
#[unsafe(no_mangle)]
pub extern "C" fn fakeCudaManagedBytes(dev: c_int) -> u64 {
    let st = state();
    st.devs.get(dev as usize).map_or(u64::MAX, |d| d.managed)
}

/// Kernel launches seen by this process.
#[unsafe(no_mangle)]
pub extern "C" fn fakeCudaLaunchCount() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// GPU time (ns) of every launch process `pid` (of the caller's PID namespace) made on
/// device `dev` so far, from the shared timeline (queued work included). `pid` 0: all
/// processes.
#[unsafe(no_mangle)]
pub extern "C" fn fakeCudaBusyNs(dev: c_int, pid: c_int) -> u64 {
    let tl = timeline::mapped();
    let d = gpus::slot(dev.max(0) as usize);
    if pid == 0 {
        return tl
            .devs
            .get(d)
            .map_or(0, |t| t.total.load(Ordering::Relaxed));
    }
    tl.proc_slot(d, pidns::key(pidns::own_ns(), pid as u32), false)
        .map_or(0, |p| p.total.load(Ordering::Relaxed))
}

/// Live device allocations (pointers + handles) of this process.
#[unsafe(no_mangle)]
pub extern "C" fn fakeCudaLiveAllocations() -> u64 {
    let st = state();
    (st.ptrs.len() + st.handles.len()) as u64
}

// ---------------------------------------------------------------- NVML

static NVML_INIT: AtomicBool = AtomicBool::new(false);
/// NVML device handles are addresses into this array.
static NVML_DEVICES: [u8; MAX_GPUS] = [0; MAX_GPUS];

fn nvml_device(h: *const u8) -> Option<usize> {
    let base = NVML_DEVICES.as_ptr() as usize;
    let i = (h as usize).wrapping_sub(base);
    (i < config().sizes.len()).then_some(i)
}

#[repr(C)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
pub struct NvmlProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: u64,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct NvmlUtilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

const NVML_ERROR_NOT_FOUND: c_int = 6;
const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
const NVML_ERROR_INSUFFICIENT_RESOURCES: c_int = 23;

/// The utilisation window `[a, b)` on the monotonic timeline for NVML's `lastSeen`
/// (CPU time in µs since the epoch, as real NVML): since `last_seen`, at most 1 s back
/// (and the whole last second when `last_seen` is 0 or in the future); plus now in µs.
fn util_window(last_seen: u64) -> (u64, u64, u64) {
    let now_us = timeline::realtime_us();
    let b = timeline::monotonic_ns();
    let back_us = if last_seen == 0 || last_seen >= now_us {
        1_000_000
    } else {
        (now_us - last_seen).clamp(1_000, 1_000_000)
    };
    (b.saturating_sub(back_us * 1000), b, now_us)
}

/// `nvmlMemory_v2` struct version: size | 2 << 24.
pub const NVML_MEMORY_V2: c_uint = (std::mem::size_of::<NvmlMemoryV2>() as c_uint) | (2 << 24);

macro_rules! nvml_exports {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $body:block )*) => {
        $(
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int $body
        )*
    };
}

fn nvml_ready() -> Result<(), c_int> {
    if NVML_INIT.load(Ordering::Relaxed) {
        Ok(())
    } else {
        Err(NVML_ERROR_UNINITIALIZED)
    }
}

nvml_exports! {
    fn nvmlInit_v2() {
        NVML_INIT.store(true, Ordering::Relaxed);
        NVML_SUCCESS
    }
    fn nvmlInit() {
        NVML_INIT.store(true, Ordering::Relaxed);
        NVML_SUCCESS
    }
    fn nvmlInitWithFlags(_flags: c_uint) {
        NVML_INIT.store(true, Ordering::Relaxed);
        NVML_SUCCESS
    }
    fn nvmlShutdown() {
        NVML_INIT.store(false, Ordering::Relaxed);
        NVML_SUCCESS
    }
    fn nvmlDeviceGetCount_v2(n: *mut c_uint) {
        tri!(nvml_ready());
        if put(n, config().sizes.len() as c_uint) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlDeviceGetCount(n: *mut c_uint) {
        // SAFETY: same contract.
        unsafe { nvmlDeviceGetCount_v2(n) }
    }
    fn nvmlDeviceGetHandleByIndex_v2(i: c_uint, h: *mut *const u8) {
        tri!(nvml_ready());
        if i as usize >= config().sizes.len() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if put(h, NVML_DEVICES[i as usize..].as_ptr()) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlDeviceGetHandleByIndex(i: c_uint, h: *mut *const u8) {
        // SAFETY: same contract.
        unsafe { nvmlDeviceGetHandleByIndex_v2(i, h) }
    }
    fn nvmlDeviceGetIndex(h: *const u8, i: *mut c_uint) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        if put(i, d as c_uint) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlDeviceGetUUID(h: *const u8, buf: *mut c_char, len: c_uint) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        let s = device_uuid_string(d);
        if buf.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if (len as usize) < s.len() + 1 {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        // SAFETY: buf has room for len >= s.len() + 1 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, buf, s.len());
            *buf.add(s.len()) = 0;
        }
        NVML_SUCCESS
    }
    fn nvmlDeviceGetName(h: *const u8, buf: *mut c_char, len: c_uint) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        let s = format!("Fake GPU {d}");
        if buf.is_null() || (len as usize) < s.len() + 1 {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        // SAFETY: buf has room for len >= s.len() + 1 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, buf, s.len());
            *buf.add(s.len()) = 0;
        }
        NVML_SUCCESS
    }
    fn nvmlDeviceGetMemoryInfo(h: *const u8, mem: *mut NvmlMemory) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        tri!(reachable(d));
        let (size, used) = { let st = state(); (st.devs[d].size, st.devs[d].used) };
        let (total, free) = limits::visible_memory(d, size, used);
        if put(mem, NvmlMemory { total, free, used }) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlDeviceGetMemoryInfo_v2(h: *const u8, mem: *mut NvmlMemoryV2) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        let Some(v) = get(mem as *const c_uint) else { return NVML_ERROR_INVALID_ARGUMENT };
        if v != NVML_MEMORY_V2 {
            return 25; // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        }
        tri!(reachable(d));
        let (size, used) = { let st = state(); (st.devs[d].size, st.devs[d].used) };
        let reserved = 512 << 20;
        let (total, free) = limits::visible_memory(d, size, used);
        put(mem, NvmlMemoryV2 { version: v, total, reserved, free: free.saturating_sub(reserved), used });
        NVML_SUCCESS
    }
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, h: *mut *const u8) {
        tri!(nvml_ready());
        if uuid.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: a NUL-terminated string (caller contract), checked non-null.
        let want = unsafe { CStr::from_ptr(uuid) }.to_str().unwrap_or("");
        match (0..config().sizes.len()).find(|&i| device_uuid_string(i).eq_ignore_ascii_case(want)) {
            Some(i) => {
                put(h, NVML_DEVICES[i..].as_ptr());
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    }
    fn nvmlDeviceGetProcessUtilization(h: *const u8, samples: *mut NvmlProcessUtilizationSample, count: *mut c_uint, last_seen: u64) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        let Some(cap) = get(count) else { return NVML_ERROR_INVALID_ARGUMENT };
        let (a, b, now_us) = util_window(last_seen);
        let busy: Vec<(u64, u64)> = timeline::mapped()
            .proc_busy(gpus::slot(d), a, b)
            .into_iter()
            .filter(|&(_, ns)| ns > 0)
            .collect();
        // The PIDs NVML reports (host view: those the reader's namespace sees; the others
        // are left out).
        let keys: Vec<(u64, u64)> = busy.iter().map(|&(k, _)| (k, procs::start_of(d, k))).collect();
        let busy: Vec<(u32, u64)> = procs::nvml_pids(&keys, false)
            .into_iter()
            .zip(busy)
            .filter_map(|(pid, (_, ns))| Some((pid?, ns)))
            .collect();
        if busy.is_empty() {
            put(count, 0);
            return NVML_ERROR_NOT_FOUND;
        }
        put(count, busy.len() as c_uint);
        if samples.is_null() || (cap as usize) < busy.len() {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (i, &(pid, ns)) in busy.iter().enumerate() {
            let sm = ((ns as f64 * 100.0 / (b - a) as f64).round() as c_uint).min(100);
            // SAFETY: the caller's buffer holds `cap` >= busy.len() samples.
            unsafe {
                samples.add(i).write(NvmlProcessUtilizationSample {
                    pid,
                    time_stamp: now_us,
                    sm_util: sm,
                    mem_util: 0,
                    enc_util: 0,
                    dec_util: 0,
                })
            };
        }
        NVML_SUCCESS
    }
    fn nvmlDeviceGetComputeRunningProcesses(h: *const u8, count: *mut c_uint, infos: *mut procs::ProcessInfoV1) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        // SAFETY: the caller's count and buffer, as NVML's contract.
        unsafe { procs::fill(d, count, infos, procs::v1) }
    }
    fn nvmlDeviceGetComputeRunningProcesses_v2(h: *const u8, count: *mut c_uint, infos: *mut procs::ProcessInfoV2) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        // SAFETY: as above.
        unsafe { procs::fill(d, count, infos, procs::v2) }
    }
    fn nvmlDeviceGetComputeRunningProcesses_v3(h: *const u8, count: *mut c_uint, infos: *mut procs::ProcessInfoV2) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        // SAFETY: as above.
        unsafe { procs::fill(d, count, infos, procs::v2) }
    }
    fn nvmlDeviceGetUtilizationRates(h: *const u8, u: *mut NvmlUtilization) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        let (a, b, _) = util_window(0);
        let ns = timeline::mapped().device_busy(gpus::slot(d), a, b);
        let gpu = ((ns as f64 * 100.0 / (b - a) as f64).round() as c_uint).min(100);
        if put(u, NvmlUtilization { gpu, memory: 0 }) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlDeviceSetMemoryLimits_v1(h: *const u8, limits: *const NvmlSetMemoryLimits) {
        if !limits::advertised() {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        let Some(l) = get(limits) else { return NVML_ERROR_INVALID_ARGUMENT };
        let Some(path) = c_path(l.name_space) else { return NVML_ERROR_INVALID_ARGUMENT };
        let Ok(cg) = limits::resolve(&path) else { return NVML_ERROR_NOT_FOUND };
        let clear = l.hard_limit == 0 || (l.hard_limit == limits::LIMIT_MAX && l.soft_limit == 0);
        if !clear && l.hard_limit != limits::LIMIT_MAX && l.soft_limit > l.hard_limit {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let g = limits::table().lock();
        if clear {
            g.clear(d, &cg);
            return NVML_SUCCESS;
        }
        match g.set(d, &cg, &path, l.soft_limit, l.hard_limit) {
            Ok(()) => NVML_SUCCESS,
            Err(limits::TableFull) => NVML_ERROR_INSUFFICIENT_RESOURCES,
        }
    }
    fn nvmlDeviceGetMemoryLimits_v1(h: *const u8, limits: *mut NvmlGetMemoryLimits) {
        if !limits::advertised() {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        let Some(l) = get(limits as *const NvmlGetMemoryLimits) else { return NVML_ERROR_INVALID_ARGUMENT };
        let Some(path) = c_path(l.name_space) else { return NVML_ERROR_INVALID_ARGUMENT };
        let Ok(cg) = limits::resolve(&path) else { return NVML_ERROR_NOT_FOUND };
        let (soft, hard) = limits::table().lock().find(d, &cg).map_or((0, limits::LIMIT_MAX), |e| (e.soft, e.hard));
        put(limits, NvmlGetMemoryLimits {
            name_space: l.name_space,
            soft_limit: soft,
            hard_limit: hard,
            current_used: limits::cgroup_total(d, &cg),
        });
        NVML_SUCCESS
    }
}

/// `nvmlSetMemoryLimits_v1_t` (CUDA 13.4's `nvml.h`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlSetMemoryLimits {
    /// Full sysfs path of the cgroup.
    pub name_space: *const c_char,
    pub soft_limit: u64,
    pub hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlGetMemoryLimits {
    /// [in] Full sysfs path of the cgroup.
    pub name_space: *const c_char,
    pub soft_limit: u64,
    pub hard_limit: u64,
    pub current_used: u64,
}

/// A caller's cgroup path (None: null, not UTF-8, empty or too long to store).
fn c_path(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string (caller contract), checked non-null.
    let s = unsafe { CStr::from_ptr(p) }.to_str().ok()?;
    (!s.is_empty() && s.len() <= limits::PATH_LEN).then(|| s.to_owned())
}

// ------------------------------------------------------- NVML health (faults.rs)

const NVML_ERROR_TIMEOUT: c_int = 10;
const NVML_ERROR_GPU_IS_LOST: c_int = 15;
const NVML_ERROR_UNKNOWN: c_int = 999;

/// `nvmlEventData_t`.
#[repr(C)]
pub struct NvmlEventData {
    pub device: *const u8,
    pub event_type: u64,
    pub event_data: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// The injected faults of device `d`; a fault file that cannot be read is
/// `NVML_ERROR_UNKNOWN` (reported once on stderr per process).
fn injected(d: usize) -> Result<faults::GpuFaults, c_int> {
    match faults::current() {
        Ok(i) => Ok(i.of(&device_uuid_string(d))),
        Err(e) => {
            static SAID: AtomicBool = AtomicBool::new(false);
            if !SAID.swap(true, Ordering::Relaxed) {
                eprintln!("fake NVML: FAKE_CUDA_FAULTS: {e}");
            }
            Err(NVML_ERROR_UNKNOWN)
        }
    }
}

/// `Ok` while device `d` is on the bus; a lost GPU answers `NVML_ERROR_GPU_IS_LOST`.
fn reachable(d: usize) -> Result<faults::GpuFaults, c_int> {
    let f = injected(d)?;
    if f.is_lost() {
        Err(NVML_ERROR_GPU_IS_LOST)
    } else {
        Ok(f)
    }
}

/// Live event sets by handle (handles are these ids, never dereferenced, so a freed or
/// forged handle is refused rather than followed).
fn event_sets() -> MutexGuard<'static, HashMap<usize, faults::EventSet>> {
    static SETS: OnceLock<Mutex<HashMap<usize, faults::EventSet>>> = OnceLock::new();
    SETS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

static NEXT_EVENT_SET: AtomicU64 = AtomicU64::new(1);

nvml_exports! {
    fn nvmlDeviceGetSupportedEventTypes(h: *const u8, types: *mut u64) {
        tri!(nvml_ready());
        if nvml_device(h).is_none() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if put(types, faults::SUPPORTED_EVENTS) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlEventSetCreate(set: *mut usize) {
        tri!(nvml_ready());
        let id = NEXT_EVENT_SET.fetch_add(1, Ordering::Relaxed) as usize;
        if !put(set, id) {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        event_sets().insert(id, faults::EventSet::default());
        NVML_SUCCESS
    }
    fn nvmlDeviceRegisterEvents(h: *const u8, types: u64, set: usize) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        if types & !faults::SUPPORTED_EVENTS != 0 {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let now = tri!(reachable(d));
        match event_sets().get_mut(&set) {
            Some(s) => {
                s.register(d, types, &now);
                NVML_SUCCESS
            }
            None => NVML_ERROR_INVALID_ARGUMENT,
        }
    }
    fn nvmlEventSetWait_v2(set: usize, data: *mut NvmlEventData, timeout_ms: c_uint) {
        tri!(nvml_ready());
        if data.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms.into());
        loop {
            // A GPU whose faults cannot be read raises nothing (its probes say why).
            let next = match event_sets().get_mut(&set) {
                Some(s) => s.next(|d| injected(d).unwrap_or_default()),
                None => return NVML_ERROR_INVALID_ARGUMENT,
            };
            if let Some(ev) = next {
                put(data, NvmlEventData {
                    device: NVML_DEVICES[ev.device..].as_ptr(),
                    event_type: ev.event_type,
                    event_data: ev.data,
                    gpu_instance_id: u32::MAX,
                    compute_instance_id: u32::MAX,
                });
                return NVML_SUCCESS;
            }
            if std::time::Instant::now() >= deadline {
                return NVML_ERROR_TIMEOUT;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    fn nvmlEventSetFree(set: usize) {
        tri!(nvml_ready());
        if event_sets().remove(&set).is_some() { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlDeviceGetTotalEccErrors(h: *const u8, error_type: c_uint, counter_type: c_uint, count: *mut u64) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        // Error types: 0 corrected, 1 uncorrected; counters: 0 volatile, 1 aggregate.
        if error_type > 1 || counter_type > 1 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let f = tri!(reachable(d));
        let n = u64::from(error_type == 1 && f.ecc);
        if put(count, n) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlDeviceGetRetiredPagesPendingStatus(h: *const u8, pending: *mut c_int) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        let f = tri!(reachable(d));
        if put(pending, c_int::from(f.retired_pages)) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlDeviceGetTemperature(h: *const u8, sensor: c_uint, celsius: *mut c_uint) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        if sensor != 0 {
            return NVML_ERROR_INVALID_ARGUMENT; // NVML_TEMPERATURE_GPU only
        }
        let f = tri!(reachable(d));
        if put(celsius, f.celsius.unwrap_or(faults::IDLE_CELSIUS)) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
    fn nvmlDeviceGetTemperatureThreshold(h: *const u8, threshold: c_uint, celsius: *mut c_uint) {
        tri!(nvml_ready());
        let Some(d) = nvml_device(h) else { return NVML_ERROR_INVALID_ARGUMENT };
        tri!(reachable(d));
        // NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0, _SLOWDOWN = 1; no others on the fake.
        let value = match threshold {
            0 => faults::SHUTDOWN_CELSIUS,
            1 => faults::SLOWDOWN_CELSIUS,
            _ => return NVML_ERROR_NOT_SUPPORTED,
        };
        if put(celsius, value) { NVML_SUCCESS } else { NVML_ERROR_INVALID_ARGUMENT }
    }
}

/// `nvmlErrorString` returns a pointer, not a status.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(r: c_int) -> *const c_char {
    match r {
        0 => c"Success".as_ptr(),
        1 => c"Uninitialized".as_ptr(),
        2 => c"Invalid Argument".as_ptr(),
        3 => c"Not Supported".as_ptr(),
        6 => c"Not Found".as_ptr(),
        7 => c"Insufficient Size".as_ptr(),
        10 => c"Timeout".as_ptr(),
        15 => c"GPU is lost".as_ptr(),
        23 => c"Insufficient Resources".as_ptr(),
        _ => c"Unknown Error".as_ptr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managed_memory_takes_no_device_memory_and_is_counted_apart() {
        let mut st = State::new();
        let device = st.alloc(0, 1 << 20).unwrap();
        let managed = st.alloc_managed(0, 3 << 20).unwrap();
        assert_ne!(device, managed);
        assert_eq!((st.devs[0].used, st.devs[0].managed), (1 << 20, 3 << 20));
        assert_eq!(st.free(managed), CUDA_SUCCESS);
        assert_eq!((st.devs[0].used, st.devs[0].managed), (1 << 20, 0));
        assert_eq!(st.free(managed), CUDA_ERROR_INVALID_VALUE, "freed once");
        assert_eq!(st.free(device), CUDA_SUCCESS);
        assert_eq!(st.devs[0].used, 0);
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("80Gi"), Some(80 << 30));
        assert_eq!(parse_bytes("10G"), Some(10_000_000_000));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("1x"), None);
    }

    #[test]
    fn proc_lookup_respects_version_and_flags() {
        let v2 = entry_points()
            .iter()
            .find(|e| e.0 == "cuMemAlloc_v2")
            .unwrap()
            .1;
        assert_eq!(proc_lookup("cuMemAlloc", 12000, 0), Ok(v2));
        assert_eq!(
            proc_lookup("cuMemAlloc", 2000, 0),
            Err(VERSION_NOT_SUFFICIENT)
        );
        assert_eq!(proc_lookup("cuNoSuch", 12000, 0), Err(SYMBOL_NOT_FOUND));
        let ptsz = entry_points()
            .iter()
            .find(|e| e.0 == "cuLaunchKernel_ptsz")
            .unwrap()
            .1;
        assert_eq!(proc_lookup("cuLaunchKernel", 12000, 2), Ok(ptsz));
        let gpa2 = entry_points()
            .iter()
            .find(|e| e.0 == "cuGetProcAddress_v2")
            .unwrap()
            .1;
        assert_eq!(proc_lookup("cuGetProcAddress", 12050, 0), Ok(gpa2));
    }

    #[test]
    fn uuids_parse_back() {
        let u = default_uuid(7);
        assert_eq!(parse_uuid(&uuid_string(&u)), Some(u));
        assert_eq!(
            parse_uuid("GPU-E2E00000-0000-4000-8000-000000000001").map(|u| uuid_string(&u)),
            Some("GPU-e2e00000-0000-4000-8000-000000000001".to_owned())
        );
        assert_eq!(parse_uuid("GPU-e2e0"), None);
        assert_eq!(
            parse_device_uuid("MIG-E2E00000-0000-4000-8000-000000000001"),
            parse_uuid("GPU-e2e00000-0000-4000-8000-000000000001").map(|u| (u, true))
        );
        assert_eq!(parse_device_uuid("GPU-e2e0"), None);
        assert_eq!(parse_uuid("e2e00000-0000-4000-8000-000000000001"), None);
    }

    #[test]
    fn uuid_format() {
        assert_eq!(
            uuid_string(&device_uuid(1)),
            "GPU-fa4ec0da-0000-0000-8000-000000000001"
        );
    }
}
