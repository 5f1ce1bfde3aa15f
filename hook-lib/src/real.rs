//! The real driver: `libcuda.so.1` and `libnvidia-ml.so.1`, opened on first use, and the
//! real `dlsym` and `dlvsym` (we export our own).
//!
//! Each entry point is cached in a static `AtomicPtr` after its first lookup, so a
//! forwarded call costs one atomic load and an indirect call.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::ffi::*;

pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The real `dlsym`, read by the assembly stub in `dlsym.rs`.
pub static FGPU_REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
/// The real `dlvsym`, read by the other stub in `dlsym.rs`.
pub static FGPU_REAL_DLVSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

pub type DlvsymFn = unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;

/// glibc's `dlvsym` behind ours. We export `dlvsym` too, so no call of ours by that
/// name reaches glibc: the address is read from the C library's own symbol table
/// ([`crate::elf::find_default`]).
pub fn real_dlvsym_ptr() -> *mut c_void {
    let p = FGPU_REAL_DLVSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let p = crate::elf::find_default(c"dlvsym");
    if !p.is_null() {
        FGPU_REAL_DLVSYM.store(p, Ordering::Release);
    }
    p
}

/// glibc's `dlsym` behind ours, found through the real `dlvsym`.
pub fn real_dlsym_ptr() -> *mut c_void {
    let p = FGPU_REAL_DLSYM.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    let dlvsym = real_dlvsym_ptr();
    if dlvsym.is_null() {
        return null_mut();
    }
    // SAFETY: dlvsym is glibc's (signature DlvsymFn).
    let dlvsym = unsafe { std::mem::transmute::<*mut c_void, DlvsymFn>(dlvsym) };
    for v in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17", c"GLIBC_2.0"] {
        // SAFETY: valid C strings; RTLD_NEXT from this object finds libc's definition.
        let p = unsafe { dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
        if !p.is_null() {
            FGPU_REAL_DLSYM.store(p, Ordering::Release);
            return p;
        }
    }
    null_mut()
}

/// Calls the real `dlsym`.
pub(crate) fn dlsym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    let p = real_dlsym_ptr();
    if p.is_null() {
        return null_mut();
    }
    // SAFETY: p is glibc's dlsym; name is NUL-terminated.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p)(handle, name.as_ptr()) }
}

#[derive(Clone, Copy)]
pub enum Lib {
    Cuda,
    Nvml,
}

fn handle(lib: Lib) -> *mut c_void {
    static CUDA: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    static NVML: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let (cell, name) = match lib {
        Lib::Cuda => (&CUDA, c"libcuda.so.1"),
        Lib::Nvml => (&NVML, c"libnvidia-ml.so.1"),
    };
    let h = cell.load(Ordering::Acquire);
    if !h.is_null() {
        return h;
    }
    // SAFETY: dlopen with a valid name; the handle is kept for the life of the process.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NODELETE) };
    if h.is_null() {
        crate::debug!("cannot open {:?}", name);
    } else {
        cell.store(h, Ordering::Release);
    }
    h
}

/// Address of `name` in the real library (null if absent).
pub fn lookup(lib: Lib, name: &CStr) -> *mut c_void {
    let h = handle(lib);
    if h.is_null() {
        return null_mut();
    }
    dlsym(h, name)
}

macro_rules! real_fns {
    ($lib:expr; $( $name:ident ( $($t:ty),* ) -> $r:ty ; )*) => {
        $(
            #[allow(non_snake_case)]
            #[inline]
            pub fn $name() -> Option<unsafe extern "C" fn($($t),*) -> $r> {
                static P: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
                let mut p = P.load(Ordering::Acquire);
                if p.is_null() {
                    // SAFETY: the literal is NUL-terminated by concat!.
                    let name = unsafe {
                        CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes())
                    };
                    p = lookup($lib, name);
                    if p.is_null() {
                        return None;
                    }
                    P.store(p, Ordering::Release);
                }
                // SAFETY: p is the driver's entry point of this name, whose C signature
                // is the one declared here.
                Some(unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($t),*) -> $r>(p) })
            }
        )*
    };
}

real_fns! { Lib::Cuda;
    cuInit(c_uint) -> CUresult;
    cuDeviceGet(*mut CUdevice, c_int) -> CUresult;
    cuDeviceGetUuid(*mut [u8; 16], CUdevice) -> CUresult;
    cuDeviceGetUuid_v2(*mut [u8; 16], CUdevice) -> CUresult;
    cuCtxGetDevice(*mut CUdevice) -> CUresult;
    cuDeviceTotalMem_v2(*mut usize, CUdevice) -> CUresult;
    cuMemGetInfo_v2(*mut usize, *mut usize) -> CUresult;
    cuMemAlloc_v2(*mut CUdeviceptr, usize) -> CUresult;
    cuMemAllocPitch_v2(*mut CUdeviceptr, *mut usize, usize, usize, c_uint) -> CUresult;
    cuMemAllocManaged(*mut CUdeviceptr, usize, c_uint) -> CUresult;
    cuMemFree_v2(CUdeviceptr) -> CUresult;
    cuArrayCreate_v2(*mut u64, *const ArrayDesc) -> CUresult;
    cuArray3DCreate_v2(*mut u64, *const Array3dDesc) -> CUresult;
    cuArrayDestroy(u64) -> CUresult;
    cuMipmappedArrayCreate(*mut u64, *const Array3dDesc, c_uint) -> CUresult;
    cuMipmappedArrayDestroy(u64) -> CUresult;
    cuMemCreate(*mut u64, usize, *const MemAllocationProp, u64) -> CUresult;
    cuMemRelease(u64) -> CUresult;
    cuMemAllocAsync(*mut CUdeviceptr, usize, CUstream) -> CUresult;
    cuMemAllocAsync_ptsz(*mut CUdeviceptr, usize, CUstream) -> CUresult;
    cuMemAllocFromPoolAsync(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
    cuMemAllocFromPoolAsync_ptsz(*mut CUdeviceptr, usize, CUmemoryPool, CUstream) -> CUresult;
    cuMemFreeAsync(CUdeviceptr, CUstream) -> CUresult;
    cuMemFreeAsync_ptsz(CUdeviceptr, CUstream) -> CUresult;
    cuDeviceGetMemPool(*mut CUmemoryPool, CUdevice) -> CUresult;
    cuDeviceGetDefaultMemPool(*mut CUmemoryPool, CUdevice) -> CUresult;
    cuMemPoolCreate(*mut CUmemoryPool, *const MemPoolProps) -> CUresult;
    cuMemPoolDestroy(CUmemoryPool) -> CUresult;
    cuMemPoolTrimTo(CUmemoryPool, usize) -> CUresult;
    cuMemPoolGetAttribute(CUmemoryPool, c_int, *mut c_void) -> CUresult;
    cuCtxSynchronize() -> CUresult;
    cuCtxSynchronize_v2(CUcontext) -> CUresult;
    cuStreamSynchronize(CUstream) -> CUresult;
    cuStreamSynchronize_ptsz(CUstream) -> CUresult;
    cuEventSynchronize(*mut c_void) -> CUresult;
    cuCtxGetCurrent(*mut CUcontext) -> CUresult;
    cuCtxSetLimit(c_int, usize) -> CUresult;
    cuCtxGetLimit(*mut usize, c_int) -> CUresult;
    cuDeviceGetAttribute(*mut c_int, c_int, CUdevice) -> CUresult;
    cuDevicePrimaryCtxGetState(CUdevice, *mut c_uint, *mut c_int) -> CUresult;
    cuDevicePrimaryCtxRetain(*mut CUcontext, CUdevice) -> CUresult;
    cuDevicePrimaryCtxRelease(CUdevice) -> CUresult;
    cuDevicePrimaryCtxRelease_v2(CUdevice) -> CUresult;
    cuDevicePrimaryCtxReset(CUdevice) -> CUresult;
    cuDevicePrimaryCtxReset_v2(CUdevice) -> CUresult;
    cuCtxCreate_v2(*mut CUcontext, c_uint, CUdevice) -> CUresult;
    cuCtxCreate_v3(*mut CUcontext, *mut c_void, c_int, c_uint, CUdevice) -> CUresult;
    cuCtxCreate_v4(*mut CUcontext, *mut c_void, c_uint, CUdevice) -> CUresult;
    cuCtxDestroy_v2(CUcontext) -> CUresult;
    cuLaunchKernel(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    cuLaunchKernel_ptsz(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    cuLaunchKernelEx(*const c_void, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    cuLaunchKernelEx_ptsz(*const c_void, CUfunction, *mut *mut c_void, *mut *mut c_void) -> CUresult;
    cuLaunchCooperativeKernel(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult;
    cuLaunchCooperativeKernel_ptsz(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void) -> CUresult;
    cuGraphLaunch(CUgraphExec, CUstream) -> CUresult;
    cuGraphLaunch_ptsz(CUgraphExec, CUstream) -> CUresult;
    cuGetProcAddress(*const c_char, *mut *mut c_void, c_int, u64) -> CUresult;
    cuGetProcAddress_v2(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;
}

real_fns! { Lib::Nvml;
    nvmlDeviceGetMemoryInfo(NvmlDevice, *mut NvmlMemory) -> c_int;
    nvmlDeviceGetMemoryInfo_v2(NvmlDevice, *mut NvmlMemoryV2) -> c_int;
    nvmlDeviceGetUUID(NvmlDevice, *mut c_char, c_uint) -> c_int;
    nvmlDeviceGetIndex(NvmlDevice, *mut c_uint) -> c_int;
    nvmlInit_v2() -> c_int;
    nvmlDeviceGetHandleByUUID(*const c_char, *mut NvmlDevice) -> c_int;
    nvmlDeviceGetProcessUtilization(NvmlDevice, *mut NvmlProcessUtilizationSample, *mut c_uint, u64) -> c_int;
    nvmlDeviceGetUtilizationRates(NvmlDevice, *mut NvmlUtilization) -> c_int;
}
