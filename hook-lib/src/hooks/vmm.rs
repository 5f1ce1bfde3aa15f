//! Virtual memory management: `cuMemCreate` physical allocations and their release.

use super::charge::{charged, get, uncharged};
use crate::boundary::{forward, guard};
use crate::ffi::*;
use crate::process::{config, quota_of};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const MemAllocationProp,
    flags: u64,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        // Only device memory counts; host and NUMA locations pass through.
        let q = match get(prop) {
            Some(p) if p.location.kind == CU_MEM_LOCATION_TYPE_DEVICE && config().enabled => {
                quota_of(p.location.id)
            }
            _ => None,
        };
        let (Some(q), false, true) = (q, handle.is_null(), size > 0) else {
            return forward!(cuMemCreate(handle, size, prop, flags));
        };
        charged(
            q,
            size as u64,
            &q.proc.vmm,
            "cuMemCreate",
            || forward!(cuMemCreate(handle, size, prop, flags)),
            || get(handle).unwrap_or(0),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        uncharged(|p| &p.vmm, handle, || forward!(cuMemRelease(handle)))
    })
}
