//! How programs reach our wrappers when they do not link `libcuda.so.1` directly:
//! `cuGetProcAddress[_v2]` (libcudart ≥ 11.3, hence PyTorch) and `dlsym`.
//!
//! `cuGetProcAddress`: the real driver answers first, so the version and flag
//! semantics (which `_v2`/`_v3`, which `_ptsz` variant, "version not sufficient") are
//! exactly the driver's. If the address it returns is that of a function we wrap, we
//! hand out our wrapper instead. If the driver returns a private address (not its
//! exported symbol), a name table maps (base name, version, per-thread flag) to our
//! wrapper, the way CUDA's headers map names to versions.
//!
//! The exported `cuGetProcAddress[_v2]` live here, not in [`crate::hooks`]: they answer
//! from the hook table, and the table lists them, so they belong with it (hooks then
//! never needs this module, which is above it).

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::boundary::{forward, guard};
use crate::ffi::{
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CUresult,
};
use crate::hooks::*;
use crate::process::config;
use crate::real::{self, Lib};

pub struct Hook {
    /// Exported name of the wrapped function.
    pub name: &'static CStr,
    /// Base name as given to cuGetProcAddress.
    pub base: &'static str,
    /// CUDA version (1000 × major + 10 × minor) that introduced this variant.
    pub since: c_int,
    /// The per-thread-default-stream variant of its base name.
    pub ptsz: bool,
    pub lib: Lib,
    pub wrapper: usize,
}

macro_rules! hook_table {
    ($( $name:ident, $base:literal, $since:literal, $ptsz:literal, $lib:ident; )*) => {
        fn build() -> Vec<Hook> {
            vec![ $( Hook {
                // SAFETY: NUL-terminated by concat!.
                name: unsafe { CStr::from_bytes_with_nul_unchecked(concat!(stringify!($name), "\0").as_bytes()) },
                base: $base,
                since: $since,
                ptsz: $ptsz,
                lib: Lib::$lib,
                wrapper: $name as *const () as usize,
            }, )* ]
        }
    };
}

hook_table! {
    cuMemAlloc_v2, "cuMemAlloc", 3020, false, Cuda;
    cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, false, Cuda;
    cuMemAllocManaged, "cuMemAllocManaged", 6000, false, Cuda;
    cuMemFree_v2, "cuMemFree", 3020, false, Cuda;
    cuArrayCreate_v2, "cuArrayCreate", 3020, false, Cuda;
    cuArray3DCreate_v2, "cuArray3DCreate", 3020, false, Cuda;
    cuArrayDestroy, "cuArrayDestroy", 2000, false, Cuda;
    cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, false, Cuda;
    cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, false, Cuda;
    cuMemCreate, "cuMemCreate", 10020, false, Cuda;
    cuMemRelease, "cuMemRelease", 10020, false, Cuda;
    cuMemAllocAsync, "cuMemAllocAsync", 11020, false, Cuda;
    cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, true, Cuda;
    cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, false, Cuda;
    cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, true, Cuda;
    cuMemFreeAsync, "cuMemFreeAsync", 11020, false, Cuda;
    cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, true, Cuda;
    cuMemPoolCreate, "cuMemPoolCreate", 11020, false, Cuda;
    cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, false, Cuda;
    cuDeviceGetMemPool, "cuDeviceGetMemPool", 11020, false, Cuda;
    cuMemPoolTrimTo, "cuMemPoolTrimTo", 11020, false, Cuda;
    cuMemPoolDestroy, "cuMemPoolDestroy", 11020, false, Cuda;
    cuCtxSynchronize, "cuCtxSynchronize", 2000, false, Cuda;
    // Its own name for cuGetProcAddress (never chosen for "cuCtxSynchronize" by version):
    // a wrong guess at the version that maps the one name to the other would hand a
    // no-argument caller a one-argument function.
    cuCtxSynchronize_v2, "cuCtxSynchronize_v2", 12090, false, Cuda;
    cuStreamSynchronize, "cuStreamSynchronize", 2000, false, Cuda;
    cuStreamSynchronize_ptsz, "cuStreamSynchronize", 2000, true, Cuda;
    cuEventSynchronize, "cuEventSynchronize", 2000, false, Cuda;
    cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, false, Cuda;
    cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, false, Cuda;
    cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, false, Cuda;
    cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, false, Cuda;
    cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, false, Cuda;
    cuCtxCreate_v2, "cuCtxCreate", 3020, false, Cuda;
    cuCtxCreate_v3, "cuCtxCreate", 11040, false, Cuda;
    cuCtxCreate_v4, "cuCtxCreate", 12050, false, Cuda;
    cuCtxDestroy_v2, "cuCtxDestroy", 4000, false, Cuda;
    cuCtxSetLimit, "cuCtxSetLimit", 3010, false, Cuda;
    cuMemGetInfo_v2, "cuMemGetInfo", 3020, false, Cuda;
    cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, false, Cuda;
    cuLaunchKernel, "cuLaunchKernel", 4000, false, Cuda;
    cuLaunchKernel_ptsz, "cuLaunchKernel", 4000, true, Cuda;
    cuLaunchKernelEx, "cuLaunchKernelEx", 11060, false, Cuda;
    cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, true, Cuda;
    cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, false, Cuda;
    cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, true, Cuda;
    cuGraphLaunch, "cuGraphLaunch", 10000, false, Cuda;
    cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, true, Cuda;
    cuGetProcAddress, "cuGetProcAddress", 11030, false, Cuda;
    cuGetProcAddress_v2, "cuGetProcAddress", 12000, false, Cuda;
    nvmlDeviceGetMemoryInfo, "", 0, false, Nvml;
    nvmlDeviceGetMemoryInfo_v2, "", 0, false, Nvml;
}

pub fn hooks() -> &'static [Hook] {
    static T: OnceLock<Vec<Hook>> = OnceLock::new();
    T.get_or_init(build)
}

/// (real driver address, our wrapper) of every CUDA hook the driver exports.
fn by_real_address() -> &'static [(usize, usize)] {
    static T: OnceLock<Vec<(usize, usize)>> = OnceLock::new();
    T.get_or_init(|| {
        hooks()
            .iter()
            .filter(|h| matches!(h.lib, Lib::Cuda))
            .filter_map(|h| {
                let p = real::lookup(Lib::Cuda, h.name) as usize;
                (p != 0).then_some((p, h.wrapper))
            })
            .collect()
    })
}

/// Our wrapper for the exported name `name`, when a quota is set.
pub fn wrapper_for_name(name: &[u8]) -> Option<usize> {
    if !(name.starts_with(b"cu") || name.starts_with(b"nvml")) || !config().hooked() {
        return None;
    }
    hooks()
        .iter()
        .find(|h| h.name.to_bytes() == name)
        .map(|h| h.wrapper)
}

/// Name-based answer: the variant of `base` the driver would pick for this version.
pub fn wrapper_for_request(base: &str, version: c_int, flags: u64) -> Option<usize> {
    let ptsz = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let mut best: Option<&Hook> = None;
    for h in hooks()
        .iter()
        .filter(|h| h.base == base && h.since <= version)
    {
        let has_ptsz_variant = hooks().iter().any(|o| o.base == base && o.ptsz);
        let want = ptsz && has_ptsz_variant;
        if h.ptsz != want {
            continue;
        }
        if best.is_none_or(|b| h.since > b.since) {
            best = Some(h);
        }
    }
    best.map(|h| h.wrapper)
}

/// After a successful real `cuGetProcAddress`: replace the answer by our wrapper.
fn substitute(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if pfn.is_null() || symbol.is_null() || !config().hooked() {
        return;
    }
    // SAFETY: the driver filled *pfn (success); pfn is non-null.
    let got = unsafe { *pfn } as usize;
    if got == 0 {
        return;
    }
    let ours = by_real_address()
        .iter()
        .find(|(real, _)| *real == got)
        .map(|(_, w)| *w)
        .or_else(|| {
            // SAFETY: symbol is a NUL-terminated string (caller contract), non-null.
            let name = unsafe { CStr::from_ptr(symbol) }.to_str().ok()?;
            wrapper_for_request(name, version, flags)
        });
    if let Some(w) = ours {
        crate::debug!(
            "cuGetProcAddress({:?}, {version}, {flags}) -> wrapper",
            // SAFETY: as above.
            unsafe { CStr::from_ptr(symbol) }
        );
        // SAFETY: pfn is non-null and writable (caller contract).
        unsafe { *pfn = w as *mut c_void };
    }
}

/// The exported `cuGetProcAddress`: the driver's answer, with our wrapper substituted.
///
/// # Safety
/// The driver's contract: `symbol` is a NUL-terminated string, `pfn` a writable pointer.
#[allow(non_snake_case)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuGetProcAddress(symbol, pfn, version, flags));
        if r == CUDA_SUCCESS {
            substitute(symbol, pfn, version, flags);
        }
        r
    })
}

/// The exported `cuGetProcAddress_v2` (CUDA 12): as [`cuGetProcAddress`].
///
/// # Safety
/// As above; `status` is null or writable.
#[allow(non_snake_case)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuGetProcAddress_v2(symbol, pfn, version, flags, status));
        if r == CUDA_SUCCESS {
            substitute(symbol, pfn, version, flags);
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(name: &str) -> usize {
        hooks()
            .iter()
            .find(|h| h.name.to_str().unwrap() == name)
            .unwrap()
            .wrapper
    }

    #[test]
    fn name_table_follows_versions_and_flags() {
        assert_eq!(
            wrapper_for_request("cuMemAlloc", 12000, 0),
            Some(addr("cuMemAlloc_v2"))
        );
        assert_eq!(wrapper_for_request("cuMemAlloc", 2000, 0), None);
        assert_eq!(
            wrapper_for_request("cuLaunchKernel", 12000, 2),
            Some(addr("cuLaunchKernel_ptsz"))
        );
        assert_eq!(
            wrapper_for_request("cuLaunchKernel", 12000, 1),
            Some(addr("cuLaunchKernel"))
        );
        assert_eq!(
            wrapper_for_request("cuMemAlloc", 12000, 2),
            Some(addr("cuMemAlloc_v2"))
        );
        assert_eq!(
            wrapper_for_request("cuGetProcAddress", 11080, 0),
            Some(addr("cuGetProcAddress"))
        );
        assert_eq!(
            wrapper_for_request("cuGetProcAddress", 13000, 0),
            Some(addr("cuGetProcAddress_v2"))
        );
        assert_eq!(
            wrapper_for_request("cuCtxCreate", 12000, 0),
            Some(addr("cuCtxCreate_v3"))
        );
        assert_eq!(
            wrapper_for_request("cuStreamSynchronize", 12000, 2),
            Some(addr("cuStreamSynchronize_ptsz"))
        );
        assert_eq!(wrapper_for_request("cuCtxGetLimit", 12000, 0), None);
    }
}
