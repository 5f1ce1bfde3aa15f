//! Synchronisation: stream, event and context. A stream-ordered pool gives its idle
//! memory above its release threshold back to the device here (the driver's rule, with
//! the default threshold 0), so after each of these the pools' charges are brought
//! down to what the driver says they still hold: the account then matches the driver
//! after every synchronisation, for this process and for every other one of the claim.
//!
//! With no pool holding idle charged memory the added cost is one relaxed load.

use super::charge::{pools_idle, refresh_all};
use crate::boundary::{forward, guard, nested};
use crate::ffi::*;
use crate::process::{self, config};

/// After a successful synchronisation: take back what the pools gave to the device.
#[inline(always)]
fn synchronised(r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS && pools_idle() {
        after_sync();
    }
    r
}

#[cold]
fn after_sync() {
    if !config().enabled || nested() {
        return;
    }
    if let Some(p) = process::existing()
        && refresh_all(p)
    {
        crate::debug!("synchronisation: pools gave memory back to the device");
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        synchronised(forward!(cuCtxSynchronize()))
    })
}

/// CUDA 12.9+: the context given (null: the current one).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        synchronised(forward!(cuCtxSynchronize_v2(ctx)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        synchronised(forward!(cuStreamSynchronize(s)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(s: CUstream) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        synchronised(forward!(cuStreamSynchronize_ptsz(s)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(e: *mut std::ffi::c_void) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        synchronised(forward!(cuEventSynchronize(e)))
    })
}
