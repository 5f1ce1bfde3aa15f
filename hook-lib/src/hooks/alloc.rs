//! Plain allocations: `cuMemAlloc`, managed and pitched memory, `cuMemFree`.

use std::ffi::c_uint;

use super::charge::{charged, get, oom, put, reserve, uncharged};
use crate::boundary::{forward, guard, in_driver};
use crate::ffi::*;
use crate::process::current_quota;
use crate::track::Rec;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(q) = current_quota() else {
            return forward!(cuMemAlloc_v2(dptr, size));
        };
        if dptr.is_null() || size == 0 {
            return forward!(cuMemAlloc_v2(dptr, size));
        }
        charged(
            q,
            size as u64,
            &q.proc.ptrs,
            "cuMemAlloc",
            || forward!(cuMemAlloc_v2(dptr, size)),
            || get(dptr).unwrap_or(0),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    size: usize,
    flags: c_uint,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(q) = current_quota() else {
            return forward!(cuMemAllocManaged(dptr, size, flags));
        };
        if dptr.is_null() || size == 0 {
            return forward!(cuMemAllocManaged(dptr, size, flags));
        }
        charged(
            q,
            size as u64,
            &q.proc.ptrs,
            "cuMemAllocManaged",
            || forward!(cuMemAllocManaged(dptr, size, flags)),
            || get(dptr).unwrap_or(0),
        )
    })
}

/// Pitch alignment assumed before the call; corrected with the pitch the driver gives.
const PITCH_ALIGN: u64 = 512;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(q) = current_quota() else {
            return forward!(cuMemAllocPitch_v2(dptr, pitch, width, height, elem));
        };
        if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 {
            return forward!(cuMemAllocPitch_v2(dptr, pitch, width, height, elem));
        }
        let est = (width as u64).div_ceil(PITCH_ALIGN) * PITCH_ALIGN * height as u64;
        if !reserve(&q, est) {
            return oom(&q, est, "cuMemAllocPitch");
        }
        let r = in_driver(|| forward!(cuMemAllocPitch_v2(dptr, pitch, width, height, elem)));
        if r != CUDA_SUCCESS {
            q.proc.acct.release(q.dev, est);
            return r;
        }
        let ptr = get(dptr).unwrap_or(0);
        let actual = get(pitch).unwrap_or(0) as u64 * height as u64;
        let size = if actual > est {
            if !q.proc.acct.try_reserve(q.dev, actual - est, q.limit) {
                q.proc.acct.release(q.dev, est);
                let _ = in_driver(|| forward!(cuMemFree_v2(ptr)));
                put(dptr, 0);
                return oom(&q, actual, "cuMemAllocPitch");
            }
            actual
        } else {
            q.proc.acct.release(q.dev, est - actual);
            actual
        };
        q.proc.ptrs.insert(
            ptr,
            Rec {
                size,
                dev: q.dev,
                pool: 0,
            },
        );
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        uncharged(|p| &p.ptrs, dptr, || forward!(cuMemFree_v2(dptr)))
    })
}
