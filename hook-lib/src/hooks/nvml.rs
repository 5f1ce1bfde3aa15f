//! NVML: `nvmlDeviceGetMemoryInfo[_v2]` report the quota as the device's memory.

use std::ffi::{c_char, c_int, c_uint};

use super::charge::{get, pools_idle, put, refresh_all};
use crate::boundary::guard;
use crate::ffi::*;
use crate::process::{self, config};
use crate::real;

/// The CUDA ordinal this process would use for an NVML device, and its UUID.
fn nvml_ordinal(dev: NvmlDevice) -> Option<(c_int, [u8; 16])> {
    let mut buf = [0 as c_char; 96];
    let f = real::nvmlDeviceGetUUID()?;
    // SAFETY: buf holds 96 bytes, as told.
    if unsafe { f(dev, buf.as_mut_ptr(), buf.len() as c_uint) } != NVML_SUCCESS {
        return None;
    }
    // SAFETY: NVML wrote a NUL-terminated string into buf.
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .ok()?
        .to_string();
    let uuid = parse_uuid(&s)?;
    let mut index: c_uint = 0;
    let idx_ok = real::nvmlDeviceGetIndex()
        // SAFETY: index is a valid out-pointer.
        .map(|g| unsafe { g(dev, &mut index) } == NVML_SUCCESS)
        .unwrap_or(false);
    let ord = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(str::trim).position(|e| {
            if let Ok(n) = e.parse::<c_uint>() {
                idx_ok && n == index
            } else {
                !e.is_empty() && s.starts_with(e)
            }
        })? as c_int,
        _ if idx_ok => index as c_int,
        _ => return None,
    };
    Some((ord, uuid))
}

/// (quota, the claim's usage) for an NVML device.
fn nvml_quota(dev: NvmlDevice) -> Option<(u64, u64)> {
    if !config().enabled {
        return None;
    }
    let (ord, uuid) = nvml_ordinal(dev)?;
    let limit = config().limit(ord)?;
    let p = process::get();
    if pools_idle() {
        refresh_all(p);
    }
    let used = p.acct.find_device(&uuid).map_or(0, |i| p.acct.used(i));
    Some((limit, used))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(dev: NvmlDevice, mem: *mut NvmlMemory) -> c_int {
    guard(NVML_ERROR_UNKNOWN, || {
        let Some(f) = real::nvmlDeviceGetMemoryInfo() else {
            return NVML_ERROR_LIBRARY_NOT_FOUND;
        };
        // SAFETY: the caller's arguments, forwarded.
        let r = unsafe { f(dev, mem) };
        if r == NVML_SUCCESS
            && let (Some(m), Some((limit, used))) = (get(mem), nvml_quota(dev))
        {
            let total = m.total.min(limit);
            let used = used.min(total);
            put(
                mem,
                NvmlMemory {
                    total,
                    free: total - used,
                    used,
                },
            );
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: NvmlDevice,
    mem: *mut NvmlMemoryV2,
) -> c_int {
    guard(NVML_ERROR_UNKNOWN, || {
        let Some(f) = real::nvmlDeviceGetMemoryInfo_v2() else {
            return NVML_ERROR_LIBRARY_NOT_FOUND;
        };
        // SAFETY: the caller's arguments, forwarded.
        let r = unsafe { f(dev, mem) };
        if r == NVML_SUCCESS
            && let (Some(m), Some((limit, used))) = (get(mem), nvml_quota(dev))
        {
            let total = m.total.min(limit);
            let used = used.min(total);
            put(
                mem,
                NvmlMemoryV2 {
                    version: m.version,
                    total,
                    reserved: 0,
                    free: total - used,
                    used,
                },
            );
        }
        r
    })
}
