//! What the process is told: the quota as the device's total memory.

use super::charge::{get, pools_idle, put, refresh_all};
use crate::boundary::{forward, guard};
use crate::ffi::*;
use crate::process::{config, current_quota};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(q) = current_quota() else {
            return forward!(cuMemGetInfo_v2(free, total));
        };
        // What pools gave back at a synchronisation we did not see is free again.
        if pools_idle() {
            refresh_all(q.proc);
        }
        // Real values first (into our own variables: either pointer may be null).
        let (mut f, mut t) = (0usize, 0usize);
        let r = forward!(cuMemGetInfo_v2(&mut f, &mut t));
        if r != CUDA_SUCCESS {
            return r;
        }
        let tot = (t as u64).min(q.limit);
        let fr = (f as u64).min(tot.saturating_sub(q.proc.acct.used(q.dev)));
        put(free, fr as usize);
        put(total, tot as usize);
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuDeviceTotalMem_v2(bytes, dev));
        if r == CUDA_SUCCESS
            && let (Some(limit), Some(b)) = (config().limit(dev), get(bytes))
        {
            put(bytes, (b as u64).min(limit) as usize);
        }
        r
    })
}
