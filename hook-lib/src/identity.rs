//! The process's own NVML PID, found without `getpid()`.
//!
//! NVML reports host PIDs; a process in a container sees only its own PID namespace,
//! so `getpid()` says nothing about which of NVML's samples are ours. The shim finds
//! out by a **memory fingerprint**: it reads the device's running-process list
//! (`nvmlDeviceGetComputeRunningProcesses_v3`/`_v2`/v1, with each process's device
//! memory), allocates a probe of a size nobody is likely to allocate at that instant
//! (a multiple of 2 MiB between 34 and 62 MiB, drawn per attempt), reads the list
//! again, frees the probe and reads it a third time. Ours is the one PID whose memory
//! rose by exactly the probe size and fell back by exactly that size.
//!
//! Why not "the PID that appears around our first context creation" (HAMi-core)? The
//! shim first runs when the application already has a context on the device (a
//! directly linked program's first hooked call is an allocation or a launch), so the
//! list would not change. The fingerprint works at any time.
//!
//! Ambiguity rule: zero or several matching PIDs (another process changed its memory by
//! the same amount at the same moment, or NVML does not report memory) → try again
//! with another size, at most [`PROBES`] times per attempt; an unidentified process
//! stays unidentified (the limiter then keeps its last estimate and never relaxes, see
//! `core.rs`) and tries again on later control periods, at most [`ATTEMPTS`] times.
//!
//! The probe is not charged to the quota: it lives for three NVML calls.

use std::ffi::{c_uint, c_void};

use crate::ffi::*;
use crate::real::{self, Lib};

/// Probes (allocation sizes) per attempt.
pub const PROBES: u32 = 4;
/// Attempts per process and device (the first at the device's first launch, then one
/// per control period).
pub const ATTEMPTS: u32 = 8;
const MIB2: u64 = 2 << 20;

/// `nvmlProcessInfo_t` (the `_v2` / `_v3` layout).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfo {
    pid: c_uint,
    used: u64,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProcessInfoV1 {
    pid: c_uint,
    used: u64,
}

type ListFn<T> = unsafe extern "C" fn(NvmlDevice, *mut c_uint, *mut T) -> i32;

fn call<T: Copy + Default>(
    f: ListFn<T>,
    dev: NvmlDevice,
    pid_used: fn(&T) -> (u32, u64),
) -> Option<Vec<(u32, u64)>> {
    let mut buf = [T::default(); 128];
    let mut n: c_uint = buf.len() as c_uint;
    // SAFETY: buf holds n elements of the layout the function fills.
    let r = unsafe { f(dev, &mut n, buf.as_mut_ptr()) };
    (r == NVML_SUCCESS).then(|| {
        buf[..(n as usize).min(buf.len())]
            .iter()
            .map(pid_used)
            .collect()
    })
}

/// The device's running compute processes: (NVML PID, device memory in bytes).
pub fn running(dev: NvmlDevice) -> Option<Vec<(u32, u64)>> {
    for name in [
        c"nvmlDeviceGetComputeRunningProcesses_v3",
        c"nvmlDeviceGetComputeRunningProcesses_v2",
    ] {
        let p = real::lookup(Lib::Nvml, name);
        if !p.is_null() {
            // SAFETY: both versions take (device, count, nvmlProcessInfo_t*).
            let f = unsafe { std::mem::transmute::<*mut c_void, ListFn<ProcessInfo>>(p) };
            return call(f, dev, |i| (i.pid, i.used));
        }
    }
    let p = real::lookup(Lib::Nvml, c"nvmlDeviceGetComputeRunningProcesses");
    if p.is_null() {
        return None;
    }
    // SAFETY: v1 takes (device, count, nvmlProcessInfo_v1_t*).
    let f = unsafe { std::mem::transmute::<*mut c_void, ListFn<ProcessInfoV1>>(p) };
    call(f, dev, |i| (i.pid, i.used))
}

/// The PIDs whose memory changed by exactly `delta` between `a` and `b` (a PID absent
/// from `a` counts as 0 there).
pub fn changed_by(a: &[(u32, u64)], b: &[(u32, u64)], delta: i64) -> Vec<u32> {
    b.iter()
        .filter(|(pid, used)| {
            let before = a.iter().find(|x| x.0 == *pid).map_or(0, |x| x.1);
            *used as i64 - before as i64 == delta
        })
        .map(|x| x.0)
        .collect()
}

/// The one PID in both lists, if exactly one.
pub fn unique(up: &[u32], down: &[u32]) -> Option<u32> {
    let both: Vec<u32> = up.iter().copied().filter(|p| down.contains(p)).collect();
    match both[..] {
        [p] => Some(p),
        _ => None,
    }
}

/// Probe size of attempt `i` (distinct per attempt, varied between processes by `salt`).
pub fn probe_size(i: u32, salt: u64) -> u64 {
    (17 + ((salt + i as u64 * 4) % 15)) * MIB2
}

/// One identification attempt on NVML device `dev`, from a thread whose current
/// context is on that device. `None`: not identified this time.
pub fn identify(dev: NvmlDevice, salt: u64) -> Option<u32> {
    let _relaxed = RelaxedCapture::enter();
    let alloc = real::cuMemAlloc_v2()?;
    let free = real::cuMemFree_v2()?;
    for i in 0..PROBES {
        let size = probe_size(i, salt);
        let before = running(dev)?;
        let mut p: CUdeviceptr = 0;
        // SAFETY: p is a valid out-pointer; the real driver, not our wrapper.
        if unsafe { alloc(&mut p, size as usize) } != CUDA_SUCCESS {
            return None;
        }
        let during = running(dev);
        // SAFETY: freeing what we just allocated.
        unsafe { free(p) };
        let after = running(dev)?;
        let during = during?;
        let up = changed_by(&before, &during, size as i64);
        let down = changed_by(&during, &after, -(size as i64));
        if let Some(pid) = unique(&up, &down) {
            crate::debug!("identity: NVML pid {pid} (probe of {} MiB)", size >> 20);
            return Some(pid);
        }
        crate::debug!(
            "identity: probe of {} MiB ambiguous (up {up:?}, down {down:?})",
            size >> 20
        );
    }
    None
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_RELAXED: i32 = 2;
type ExchangeFn = unsafe extern "C" fn(*mut i32) -> CUresult;

/// The calling thread's stream-capture mode set to relaxed while the probe runs: a
/// `cuMemAlloc` during another capture (global mode) would otherwise invalidate the
/// application's graph capture. Restored on drop.
struct RelaxedCapture {
    prev: Option<(ExchangeFn, i32)>,
}

impl RelaxedCapture {
    fn enter() -> RelaxedCapture {
        let p = real::lookup(Lib::Cuda, c"cuThreadExchangeStreamCaptureMode");
        if p.is_null() {
            return RelaxedCapture { prev: None };
        }
        // SAFETY: cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode).
        let f = unsafe { std::mem::transmute::<*mut c_void, ExchangeFn>(p) };
        let mut mode = CAPTURE_RELAXED;
        // SAFETY: mode is a valid in/out pointer.
        let ok = unsafe { f(&mut mode) } == CUDA_SUCCESS;
        RelaxedCapture {
            prev: ok.then_some((f, mode)),
        }
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        if let Some((f, mut mode)) = self.prev {
            // SAFETY: as in `enter`; puts the thread's previous mode back.
            unsafe { f(&mut mode) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_picks_the_one_pid_that_moved_by_the_probe() {
        let a = [(10, 100), (11, 500)];
        let b = [(10, 100 + 40), (11, 500), (12, 40)];
        assert_eq!(changed_by(&a, &b, 40), vec![10, 12]);
        let c = [(10, 100), (11, 500), (12, 40)];
        assert_eq!(changed_by(&b, &c, -40), vec![10]);
        assert_eq!(unique(&[10, 12], &[10]), Some(10));
        // Two processes moving by the same amount both ways: ambiguous.
        assert_eq!(unique(&[10, 12], &[10, 12]), None);
        assert_eq!(unique(&[], &[10]), None);
    }

    #[test]
    fn probe_sizes_differ_between_attempts() {
        let s: Vec<u64> = (0..PROBES).map(|i| probe_size(i, 7)).collect();
        for (i, x) in s.iter().enumerate() {
            assert_eq!(x % MIB2, 0);
            assert!(s[i + 1..].iter().all(|y| y != x), "{s:?}");
        }
    }
}
