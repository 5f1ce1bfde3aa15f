//! CUDA arrays: 2D, 3D and mipmapped, counted at the size their format implies.

use std::ffi::c_uint;

use super::charge::{charged, get, uncharged};
use crate::boundary::{forward, guard};
use crate::ffi::*;
use crate::process::current_quota;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayCreate_v2(arr: *mut u64, desc: *const ArrayDesc) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let (Some(q), Some(d), false) = (current_quota(), get(desc), arr.is_null()) else {
            return forward!(cuArrayCreate_v2(arr, desc));
        };
        let size = array_bytes(d.width, d.height, 1, d.format, d.channels);
        charged(
            q,
            size,
            &q.proc.arrays,
            "cuArrayCreate",
            || forward!(cuArrayCreate_v2(arr, desc)),
            || get(arr).unwrap_or(0),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArray3DCreate_v2(arr: *mut u64, desc: *const Array3dDesc) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let (Some(q), Some(d), false) = (current_quota(), get(desc), arr.is_null()) else {
            return forward!(cuArray3DCreate_v2(arr, desc));
        };
        let size = array_bytes(d.width, d.height, d.depth, d.format, d.channels);
        charged(
            q,
            size,
            &q.proc.arrays,
            "cuArray3DCreate",
            || forward!(cuArray3DCreate_v2(arr, desc)),
            || get(arr).unwrap_or(0),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    arr: *mut u64,
    desc: *const Array3dDesc,
    levels: c_uint,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let (Some(q), Some(d), false) = (current_quota(), get(desc), arr.is_null()) else {
            return forward!(cuMipmappedArrayCreate(arr, desc, levels));
        };
        charged(
            q,
            mipmapped_bytes(&d, levels),
            &q.proc.arrays,
            "cuMipmappedArrayCreate",
            || forward!(cuMipmappedArrayCreate(arr, desc, levels)),
            || get(arr).unwrap_or(0),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuArrayDestroy(arr: u64) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        uncharged(|p| &p.arrays, arr, || forward!(cuArrayDestroy(arr)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMipmappedArrayDestroy(arr: u64) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        uncharged(
            |p| &p.arrays,
            arr,
            || forward!(cuMipmappedArrayDestroy(arr)),
        )
    })
}
