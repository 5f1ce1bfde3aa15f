//! Launches. Every way work reaches the GPU passes the core limiter (`crate::core`):
//! with no core quota and no priority it costs one atomic load.

use std::ffi::{c_uint, c_void};

use crate::boundary::forward;
use crate::core::{GRAPH_UNITS, before_launch, ex_units, kernel_units};
use crate::ffi::*;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    before_launch(|| kernel_units(gx, gy, gz));
    forward!(cuLaunchKernel(
        f, gx, gy, gz, bx, by, bz, shared, stream, params, extra
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    before_launch(|| kernel_units(gx, gy, gz));
    forward!(cuLaunchKernel_ptsz(
        f, gx, gy, gz, bx, by, bz, shared, stream, params, extra
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const c_void,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    before_launch(|| ex_units(config));
    forward!(cuLaunchKernelEx(config, f, params, extra))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const c_void,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    before_launch(|| ex_units(config));
    forward!(cuLaunchKernelEx_ptsz(config, f, params, extra))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    before_launch(|| kernel_units(gx, gy, gz));
    forward!(cuLaunchCooperativeKernel(
        f, gx, gy, gz, bx, by, bz, shared, stream, params
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    before_launch(|| kernel_units(gx, gy, gz));
    forward!(cuLaunchCooperativeKernel_ptsz(
        f, gx, gy, gz, bx, by, bz, shared, stream, params
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    before_launch(|| GRAPH_UNITS);
    forward!(cuGraphLaunch(exec, stream))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    before_launch(|| GRAPH_UNITS);
    forward!(cuGraphLaunch_ptsz(exec, stream))
}
