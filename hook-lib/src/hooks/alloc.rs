//! Plain allocations: `cuMemAlloc`, managed and pitched memory, `cuMemFree`.
//!
//! Research tier (a limits file with `gpu.<UUID>.physical=`): a `cuMemAlloc` that fits the
//! grant but would take the claim's device use past the physical part is served by
//! `cuMemAllocManaged(…, CU_MEM_ATTACH_GLOBAL)` instead (the pointer works the same in
//! kernels and copies; its pages spill to host memory). Only `cuMemAlloc` is replaced so:
//! a pitched allocation has its own layout, arrays and VMM handles are not pointers, and
//! stream-ordered allocations belong to pools. Managed memory the program asks for itself
//! is counted as managed too.

use std::ffi::c_uint;

use super::charge::{MANAGED, charged_spilling, get, oom, put, reserve, uncharged};
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
        charged_spilling(
            q,
            size as u64,
            "cuMemAlloc",
            || forward!(cuMemAlloc_v2(dptr, size)),
            || forward!(cuMemAllocManaged(dptr, size, CU_MEM_ATTACH_GLOBAL)),
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
        let size = size as u64;
        if !reserve(&q, size) {
            return oom(&q, size, "cuMemAllocManaged");
        }
        let r = in_driver(|| forward!(cuMemAllocManaged(dptr, size as usize, flags)));
        if r != CUDA_SUCCESS {
            q.proc.acct.release(q.dev, size);
            return r;
        }
        q.proc.acct.note_managed(q.dev, size, true);
        q.proc.ptrs.insert(
            get(dptr).unwrap_or(0),
            Rec {
                size,
                dev: q.dev,
                pool: MANAGED,
            },
        );
        r
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
