//! The fake NVML's view of processes: host-style PIDs and the running-process list.
//!
//! A real NVML reports *host* PIDs; a process in a container sees its own PID
//! namespace, so `getpid()` never matches what NVML says. The fake models that with an
//! offset: every PID the fake's NVML returns is the process's PID plus
//! `FAKE_CUDA_NVML_PID_OFFSET` (default [`DEFAULT_OFFSET`], non-zero so every test runs
//! hostile unless it opts out with 0), and, for a process outside the initial PID
//! namespace, plus a multiple of 2^22 drawn from its namespace (see [`nvml_pid`]). Host
//! PIDs are unique on a node, so the fake's must be too: two containers' PID 1 are two
//! processes to NVML, whoever asks.
//!
//! A process appears in a device's running-process list
//! (`nvmlDeviceGetComputeRunningProcesses[_v2|_v3]`) only once it has a context on that
//! device, as on real NVML, with the device memory it holds (`usedGpuMemory`). The list
//! is shared by every process naming the same `FAKE_CUDA_STATE` (file
//! `$FAKE_CUDA_STATE.procs`), else private to the process; its rows are GPUs by UUID
//! (`gpus::slot`: the public functions take the caller's device ordinal). A slot names its process by
//! its key (PID-namespace inode and PID there, `pidns.rs`), so two containers' PID 1 are
//! two processes, and records its start time and cgroup beside it; dead processes drop
//! out of the list (`pidns::alive_since`: `kill(pid, 0)` or the reader's `/proc`, with
//! the start time, else the liveness lock).
//!
//! With `FAKE_CUDA_NVML_HOST=1` (a host-side reader such as the node monitor) the PIDs
//! are those of the reader's namespace (`pidns::host_pids`) and the offset is not added.

use std::ffi::c_uint;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use crate::pidns;

/// Offset added to every PID the fake's NVML reports, unless configured.
pub const DEFAULT_OFFSET: u32 = 400_000;
/// Devices with a process list.
pub const DEVICES: usize = 16;
/// Processes per device in the list.
pub const SLOTS: usize = 64;

#[repr(C)]
pub struct Slot {
    /// The process's key: PID-namespace inode << 32 | its own PID (as `getpid()` sees
    /// it); 0 = free.
    key: AtomicU64,
    used: AtomicU64,
}

#[repr(C)]
pub struct Table {
    devs: [[Slot; SLOTS]; DEVICES],
    /// The cgroup of each slot's process (the limits table's cgroup id; 0 = unknown), written when
    /// it takes the slot. After `devs`, so a file of the earlier layout only grows.
    cgroups: [[AtomicU64; SLOTS]; DEVICES],
    /// Each slot's process start time (`pidns::own_start`; 0 = unknown), written with it.
    starts: [[AtomicU64; SLOTS]; DEVICES],
}

const TABLE_SIZE: usize = std::mem::size_of::<Table>();

/// The configured offset (`FAKE_CUDA_NVML_PID_OFFSET`).
pub fn offset() -> u32 {
    static OFF: OnceLock<u32> = OnceLock::new();
    *OFF.get_or_init(|| {
        std::env::var("FAKE_CUDA_NVML_PID_OFFSET")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_OFFSET)
    })
}

/// The inode of the initial PID namespace (the kernel's `PROC_PID_INIT_INO`).
pub const INIT_PID_NS: u32 = 0xEFFF_FFFC;
/// Namespaces told apart in the reported PID (a prime: inodes come in runs).
const NS_CLASSES: u32 = 1021;

/// The PID NVML reports for process `key` (without `FAKE_CUDA_NVML_HOST`), the same for
/// every reader: the process's own PID plus the offset, and, outside the initial PID
/// namespace, plus `(1 + inode % 1021) << 22` (PIDs are below 2^22), so two namespaces'
/// processes of one PID are two PIDs, as host PIDs are (two namespaces whose inodes
/// agree modulo 1021 still collide; a test uses a few). Offset 0 opts out of the
/// disguise altogether: the process's own PID, whatever its namespace.
pub fn nvml_pid(key: u64) -> u32 {
    let (ns, pid) = (pidns::key_ns(key), pidns::key_pid(key));
    let off = offset();
    if off == 0 {
        return pid;
    }
    let class = if ns == INIT_PID_NS || ns == 0 {
        0
    } else {
        (1 + ns % NS_CLASSES) << pidns::PID_BITS
    };
    pid.wrapping_add(off).wrapping_add(class)
}

/// The PIDs NVML reports for `procs` (`(key, start time)`, in order; None: left out).
/// Host mode: as the reader's namespace sees them, live ones only. Otherwise own PID +
/// offset; `live_only` drops the dead (the running-process list does, utilisation
/// samples do not).
pub fn nvml_pids(procs: &[(u64, u64)], live_only: bool) -> Vec<Option<u32>> {
    if pidns::host_mode() {
        return pidns::host_pids(procs);
    }
    procs
        .iter()
        .map(|&(k, st)| (!live_only || pidns::alive_since(k, st)).then(|| nvml_pid(k)))
        .collect()
}

/// The start time recorded with process `key` on `dev` (0: not in the list).
pub fn start_of(dev: usize, key: u64) -> u64 {
    let dev = crate::gpus::slot(dev);
    let t = table();
    let (Some(d), Some(st)) = (t.devs.get(dev), t.starts.get(dev)) else {
        return 0;
    };
    d.iter()
        .zip(st)
        .find(|(s, _)| s.key.load(Ordering::Acquire) == key)
        .map_or(0, |(_, st)| st.load(Ordering::Relaxed))
}

fn map(path: Option<&str>) -> *mut u8 {
    if let Some(m) = path.and_then(|p| crate::shm::map_shared(&format!("{p}.procs"), TABLE_SIZE)) {
        return m;
    }
    // SAFETY: anonymous zeroed mapping.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            TABLE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert!(
        m != libc::MAP_FAILED,
        "fake-cuda: cannot map the process list"
    );
    m as *mut u8
}

fn table() -> &'static Table {
    static T: OnceLock<usize> = OnceLock::new();
    let p = *T.get_or_init(|| map(crate::gpus::shared_path()) as usize);
    // SAFETY: a live mapping of TABLE_SIZE bytes, never unmapped; all-zero is a valid
    // table (atomics only).
    unsafe { &*(p as *const Table) }
}

impl Table {
    fn slot(&self, dev: usize, key: u64, create: bool) -> Option<&Slot> {
        let d = self.devs.get(dev)?;
        if let Some(s) = d.iter().find(|s| s.key.load(Ordering::Acquire) == key) {
            return Some(s);
        }
        if !create {
            return None;
        }
        d.iter().find(|s| {
            let cur = s.key.load(Ordering::Acquire);
            // Reused only when dead by PID alone: the start time recorded beside the key
            // is written after it, so it may still be the previous owner's (reporting
            // uses it; stealing a slot just claimed must not).
            (cur == 0 || !pidns::alive(cur))
                && s.key
                    .compare_exchange(cur, key, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                && {
                    s.used.store(0, Ordering::Relaxed);
                    true
                }
        })
    }

    /// The start time recorded for slot `s` of `dev`.
    fn start_at(&self, dev: usize, s: &Slot) -> u64 {
        let i = (s as *const Slot as usize - self.devs[dev].as_ptr() as usize)
            / std::mem::size_of::<Slot>();
        self.starts[dev][i].load(Ordering::Relaxed)
    }

    /// (key, start time, used bytes) of every process with a context on `dev` (dead ones
    /// included: the reader judges them, in its namespace).
    fn running(&self, dev: usize) -> Vec<(u64, u64, u64)> {
        let Some(d) = self.devs.get(dev) else {
            return Vec::new();
        };
        d.iter()
            .filter_map(|s| {
                let k = s.key.load(Ordering::Acquire);
                (k != 0).then(|| (k, self.start_at(dev, s), s.used.load(Ordering::Relaxed)))
            })
            .collect()
    }
}

/// This process's slot per device (null: no context there yet). Cleared in a forked
/// child, which is another process.
static OWN: [AtomicPtr<Slot>; DEVICES] = [const { AtomicPtr::new(std::ptr::null_mut()) }; DEVICES];

extern "C" fn forget_own() {
    for o in &OWN {
        o.store(std::ptr::null_mut(), Ordering::Relaxed);
    }
}

/// The calling process, in the cgroup of id `cgroup` (the limits table's id of its own
/// cgroup), now has a context on `dev`.
pub fn has_context(dev: usize, cgroup: u64) {
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| {
        // SAFETY: registering a handler that only stores atomics.
        unsafe { libc::pthread_atfork(None, None, Some(forget_own)) };
    });
    // Alive for the others before the key is in the table.
    pidns::register(true);
    let t = table();
    let row = crate::gpus::slot(dev);
    if let (Some(s), Some(o)) = (t.slot(row, pidns::own_key(), true), OWN.get(dev)) {
        let i = (s as *const Slot as usize - t.devs[row].as_ptr() as usize)
            / std::mem::size_of::<Slot>();
        t.cgroups[row][i].store(cgroup, Ordering::Relaxed);
        t.starts[row][i].store(pidns::own_start(), Ordering::Relaxed);
        o.store(s as *const Slot as *mut Slot, Ordering::Relaxed);
    }
}

/// The calling process holds `bytes` of device memory on `dev` (after any change):
/// one load and one store (the allocation path of the bare fake stays cheap).
pub fn set_used(dev: usize, bytes: u64) {
    let s = OWN
        .get(dev)
        .map_or(std::ptr::null_mut(), |o| o.load(Ordering::Relaxed));
    if !s.is_null() {
        // SAFETY: a slot of the table's mapping, never unmapped.
        unsafe { &*s }.used.store(bytes, Ordering::Relaxed);
    }
}

/// Device memory on `dev` of the live processes whose cgroup id is `cgroup` (without the
/// caller's own when `exclude_own`).
pub fn cgroup_used(dev: usize, cgroup: u64, exclude_own: bool) -> u64 {
    let dev = crate::gpus::slot(dev);
    let t = table();
    let (Some(d), Some(c)) = (t.devs.get(dev), t.cgroups.get(dev)) else {
        return 0;
    };
    let me = pidns::own_key();
    d.iter()
        .zip(c)
        .filter(|(_, c)| c.load(Ordering::Relaxed) == cgroup)
        .filter_map(|(s, _)| {
            let k = s.key.load(Ordering::Acquire);
            (k != 0 && !(exclude_own && k == me) && pidns::alive_since(k, t.start_at(dev, s)))
                .then(|| s.used.load(Ordering::Relaxed))
        })
        .sum()
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
}

/// `nvmlProcessInfo_t` (= `_v2`), what `_v2` and `_v3` fill.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfoV2 {
    pub pid: c_uint,
    pub used_gpu_memory: u64,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// NVML's `0xFFFFFFFF`: no MIG instance.
const NO_INSTANCE: c_uint = u32::MAX;

/// NVML's `NVML_VALUE_NOT_AVAILABLE` for `usedGpuMemory`.
pub const VALUE_NOT_AVAILABLE: u64 = u64::MAX;

/// `FAKE_CUDA_NVML_HIDE_MEMORY=1`: the list reports no per-process memory (as NVML
/// does on some configurations), so nobody can recognise itself in it.
fn hide_memory() -> bool {
    static H: OnceLock<bool> = OnceLock::new();
    *H.get_or_init(|| std::env::var("FAKE_CUDA_NVML_HIDE_MEMORY").is_ok_and(|v| v == "1"))
}

/// The list NVML reports for `dev`: (NVML PID, used bytes) of the live processes.
pub fn reported(dev: usize) -> Vec<(u32, u64)> {
    let running = table().running(crate::gpus::slot(dev));
    let keys: Vec<(u64, u64)> = running.iter().map(|&(k, st, _)| (k, st)).collect();
    nvml_pids(&keys, true)
        .into_iter()
        .zip(running)
        .filter_map(|(pid, (_, _, used))| {
            Some((
                pid?,
                if hide_memory() {
                    VALUE_NOT_AVAILABLE
                } else {
                    used
                },
            ))
        })
        .collect()
}

/// CUDA ordinal → simulated device, from `CUDA_VISIBLE_DEVICES` as the real driver
/// reads it (indices or `GPU-` / `MIG-` UUID prefixes; the list stops at the first entry that
/// matches nothing). `n` = simulated devices; `uuid(i)` = device i's NVML UUID.
/// NVML is not affected (as on a real node).
pub fn visible(n: usize, uuid: impl Fn(usize) -> String) -> &'static [usize] {
    static V: OnceLock<Vec<usize>> = OnceLock::new();
    V.get_or_init(|| match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) => parse_visible(&v, n, uuid),
        Err(_) => (0..n).collect(),
    })
}

pub fn parse_visible(v: &str, n: usize, uuid: impl Fn(usize) -> String) -> Vec<usize> {
    let mut out = Vec::new();
    for e in v.split(',').map(str::trim) {
        let d = match e.parse::<usize>() {
            Ok(i) if i < n => Some(i),
            Ok(_) => None,
            Err(_) if !e.is_empty() => (0..n).find(|&i| uuid(i).starts_with(e)),
            Err(_) => None,
        };
        match d {
            Some(d) if !out.contains(&d) => out.push(d),
            _ => break,
        }
    }
    out
}

/// Fills a caller's buffer as `nvmlDeviceGetComputeRunningProcesses*` do: `*count` in =
/// capacity, out = the number of processes; too small (or null with processes) →
/// `NVML_ERROR_INSUFFICIENT_SIZE` (7).
///
/// # Safety
/// `count` must be valid; `infos`, when not null, must hold `*count` elements.
pub unsafe fn fill<T>(
    dev: usize,
    count: *mut c_uint,
    infos: *mut T,
    make: fn(u32, u64) -> T,
) -> i32 {
    if count.is_null() {
        return 2; // NVML_ERROR_INVALID_ARGUMENT
    }
    let list = reported(dev);
    // SAFETY: count is valid (caller contract, checked non-null).
    let cap = unsafe { *count } as usize;
    // SAFETY: as above.
    unsafe { *count = list.len() as c_uint };
    if list.is_empty() {
        return 0;
    }
    if infos.is_null() || cap < list.len() {
        return 7;
    }
    for (i, &(pid, used)) in list.iter().enumerate() {
        // SAFETY: infos holds cap >= list.len() elements (caller contract).
        unsafe { infos.add(i).write(make(pid, used)) };
    }
    0
}

pub fn v1(pid: u32, used: u64) -> ProcessInfoV1 {
    ProcessInfoV1 {
        pid,
        used_gpu_memory: used,
    }
}

pub fn v2(pid: u32, used: u64) -> ProcessInfoV2 {
    ProcessInfoV2 {
        pid,
        used_gpu_memory: used,
        gpu_instance_id: NO_INSTANCE,
        compute_instance_id: NO_INSTANCE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_listed_once_it_has_a_context_with_its_memory() {
        let t = table();
        let me = pidns::own_key();
        assert!(t.running(3).iter().all(|&(p, _, _)| p != me));
        t.slot(3, me, true);
        if let Some(s) = t.slot(3, me, false) {
            s.used.store(4096, Ordering::Relaxed);
        }
        assert!(t.running(3).contains(&(me, 0, 4096)));
        // Another device is independent.
        assert!(t.running(4).iter().all(|&(p, _, _)| p != me));
        // A dead PID's slot (of this namespace) is not reported and is reused.
        let d = &t.devs[5];
        let dead = pidns::key(pidns::own_ns(), 4_194_303);
        d[0].key.store(dead, Ordering::Relaxed);
        assert_eq!(t.running(5), vec![(dead, 0, 0)]);
        assert_eq!(
            nvml_pids(&[(dead, 0), (me, 0)], true),
            vec![None, Some(nvml_pid(me))]
        );
        // Utilisation samples of a dead process are still reported (offset mode).
        assert_eq!(nvml_pids(&[(dead, 0)], false), vec![Some(nvml_pid(dead))]);
        // A live PID with another start time is a later process: the slot's is dead.
        let init = pidns::key(pidns::own_ns(), 1);
        assert_eq!(nvml_pids(&[(init, 1)], true), vec![None]);
        assert_eq!(nvml_pids(&[(init, 0)], true), vec![Some(nvml_pid(init))]);
        t.slot(5, me, true);
        assert_eq!(d[0].key.load(Ordering::Relaxed), me);
        // Two namespaces' processes with the same PID are two slots.
        let a = pidns::key(7, 1);
        let b = pidns::key(8, 1);
        t.slot(6, a, true);
        t.slot(6, b, true);
        assert_eq!(t.running(6), vec![(a, 0, 0), (b, 0, 0)]);
    }

    #[test]
    fn visible_devices_like_the_driver() {
        let u = |i: usize| format!("GPU-{i}abc");
        assert_eq!(parse_visible("1,0", 2, u), vec![1, 0]);
        assert_eq!(parse_visible("GPU-1,0", 2, u), vec![1, 0]);
        assert_eq!(parse_visible("0,7,1", 2, u), vec![0]);
        assert_eq!(parse_visible("", 2, u), Vec::<usize>::new());
    }

    #[test]
    fn reported_pids_are_offset_and_unique_across_namespaces() {
        let off = offset();
        assert_ne!(off, 0, "FAKE_CUDA_NVML_PID_OFFSET=0 set for the unit tests");
        assert_eq!(nvml_pid(pidns::key(INIT_PID_NS, 10)), 10 + off);
        // Two containers' PID 1 (namespace inodes as the kernel hands them out).
        let a = nvml_pid(pidns::key(4_026_532_900, 1));
        let b = nvml_pid(pidns::key(4_026_532_901, 1));
        assert_ne!(a, b);
        // Neither is any host process's: both are past every PID (2^22).
        assert!(
            a >= 1 << pidns::PID_BITS && b >= 1 << pidns::PID_BITS,
            "{a} {b}"
        );
        // The largest key does not wrap around.
        let (ns, pid) = (u32::MAX, (1u32 << pidns::PID_BITS) - 1);
        let want = u64::from(pid) + u64::from(off) + (u64::from(1 + ns % NS_CLASSES) << 22);
        assert_eq!(u64::from(nvml_pid(pidns::key(ns, pid))), want);
    }
}
