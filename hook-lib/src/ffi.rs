//! Our own declarations of the CUDA driver and NVML types we touch (from the public
//! API documentation; no NVIDIA header is needed to build).
#![allow(dead_code)]

use std::ffi::{c_int, c_uint, c_void};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUstream = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUmemoryPool = u64;
pub type CUcontext = *mut c_void;
pub type NvmlDevice = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

pub const NVML_SUCCESS: c_int = 0;
pub const NVML_ERROR_INVALID_ARGUMENT: c_int = 2;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: c_int = 12;
pub const NVML_ERROR_UNKNOWN: c_int = 999;
pub const NVML_ERROR_NOT_FOUND: c_int = 6;

pub type CUgraphExec = *mut c_void;

/// `nvmlUtilization_t`: the device's utilisation in percent over NVML's last sample period.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlUtilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct NvmlProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: u64,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

/// `cuGetProcAddress` flags.
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUmemLocationType`: device memory.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CUmemPool_attribute`: bytes the pool holds from the device now.
pub const CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;
/// `cuMemAllocManaged` flag: the memory is accessible from any stream on any device.
pub const CU_MEM_ATTACH_GLOBAL: c_uint = 1;

/// `CUlimit` values that take device memory.
pub const CU_LIMIT_STACK_SIZE: c_int = 0;
pub const CU_LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
pub const CU_LIMIT_MALLOC_HEAP_SIZE: c_int = 2;
/// `CUdevice_attribute`: SM count, resident threads per SM.
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: c_int = 39;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDesc {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3dDesc {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocationProp {
    pub kind: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32: *mut c_void,
    pub flags: [u8; 8],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemPoolProps {
    pub alloc_type: c_int,
    pub handle_types: c_int,
    pub location: MemLocation,
    pub win32: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub reserved: [u8; 54],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlMemory {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// Bytes per element of a `CUarray_format`; unknown formats count as 16 (the widest),
/// so that the quota errs on the safe side.
pub fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // (un)signed int8
        0x02 | 0x09 | 0x10 => 2, // (un)signed int16, half
        0x03 | 0x0a | 0x20 => 4, // (un)signed int32, float
        _ => 16,
    }
}

/// Size of a `width × height × depth` array of `channels` elements of `format`.
pub fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> u64 {
    (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(u64::from(channels.max(1)))
        .saturating_mul(format_bytes(format))
}

/// Size of a mipmapped array: the sum of its levels.
pub fn mipmapped_bytes(desc: &Array3dDesc, levels: c_uint) -> u64 {
    let mut size = 0u64;
    for l in 0..levels.clamp(1, 32) {
        let dim = |x: usize| if x == 0 { 0 } else { (x >> l).max(1) };
        size = size.saturating_add(array_bytes(
            dim(desc.width),
            dim(desc.height),
            dim(desc.depth),
            desc.format,
            desc.channels,
        ));
    }
    size
}

/// Parses NVML's `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` into the 16 UUID bytes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = s
        .strip_prefix("GPU-")
        .or_else(|| s.strip_prefix("MIG-"))
        .unwrap_or(s)
        .bytes()
        .filter(|b| *b != b'-')
        .collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let s = std::str::from_utf8(&hex[2 * i..2 * i + 2]).ok()?;
        *o = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_uuids() {
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4), 16 << 20);
        let d = Array3dDesc {
            width: 8,
            height: 8,
            depth: 0,
            format: 0x01,
            channels: 1,
            flags: 0,
        };
        assert_eq!(mipmapped_bytes(&d, 4), 64 + 16 + 4 + 1);
        assert_eq!(
            parse_uuid("GPU-fa4ec0da-0000-0000-8000-000000000001"),
            Some([
                0xfa, 0x4e, 0xc0, 0xda, 0, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 1
            ])
        );
        assert_eq!(parse_uuid("GPU-12"), None);
        assert_eq!(std::mem::size_of::<MemPoolProps>(), 88);
        assert_eq!(std::mem::size_of::<NvmlMemoryV2>(), 40);
    }
}
