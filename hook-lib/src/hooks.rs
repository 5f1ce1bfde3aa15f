//! The exported CUDA driver entry points. Each checks the quota (when one is set),
//! forwards to the real driver, and books the result. Panics never cross the boundary:
//! every body runs in `guard`.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void};

pub use crate::boundary::guard;
use crate::boundary::{forward, in_driver, nested};
use crate::ffi::*;
use crate::process::{self, Quota, config, current_quota, quota_of};
use crate::real;
use crate::track::{Rec, Tracker};

/// Writes through a caller's out-pointer if it is not null.
fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: a non-null out-pointer from the caller points to a writable T.
        unsafe { p.write(v) }
    }
}

fn get<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: a non-null in-pointer from the caller points to a readable T.
    (!p.is_null()).then(|| unsafe { p.read() })
}

fn oom(q: &Quota, size: u64, what: &str) -> CUresult {
    crate::debug!(
        "{what}: {size} bytes refused on device entry {}: {} of {} in use",
        q.dev,
        q.proc.acct.used(q.dev),
        q.limit
    );
    CUDA_ERROR_OUT_OF_MEMORY
}

/// Takes `size` from the quota; before refusing, takes back what the device's pools no
/// longer hold (dead processes are reclaimed inside `try_reserve`).
fn reserve(q: &Quota, size: u64) -> bool {
    q.proc.acct.try_reserve(q.dev, size, q.limit)
        || (refresh_pools(q.proc, q.dev) && q.proc.acct.try_reserve(q.dev, size, q.limit))
}

/// Reserve `size`, call `alloc`, then track the key it produced (or undo).
fn charged(
    q: Quota,
    size: u64,
    map: &Tracker,
    what: &str,
    alloc: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
) -> CUresult {
    if !reserve(&q, size) {
        return oom(&q, size, what);
    }
    let r = in_driver(alloc);
    if r != CUDA_SUCCESS {
        q.proc.acct.release(q.dev, size);
        return r;
    }
    map.insert(
        key(),
        Rec {
            size,
            dev: q.dev,
            pool: 0,
        },
    );
    r
}

/// Untrack `key`, call `free`; re-track if the driver refused.
fn uncharged(
    map: fn(&process::Proc) -> &Tracker,
    key: u64,
    free: impl FnOnce() -> CUresult,
) -> CUresult {
    let Some(p) = (if config().enabled && !nested() {
        process::existing()
    } else {
        None
    }) else {
        return free();
    };
    let tracker = map(p);
    let Some(rec) = tracker.remove(key) else {
        return free();
    };
    let r = in_driver(free);
    if r == CUDA_SUCCESS {
        give_back(p, rec);
    } else {
        tracker.insert(key, rec);
    }
    r
}

fn give_back(p: &process::Proc, rec: Rec) {
    if rec.pool == 0 {
        p.acct.release(rec.dev, rec.size);
        return;
    }
    let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(st) = pools.get_mut(&rec.pool) {
        st.in_use = st.in_use.saturating_sub(rec.size);
        if st.destroyed && st.in_use == 0 {
            if let Some((dev, _)) = st.dev {
                p.acct.release(dev, st.charged);
            }
            pools.remove(&rec.pool);
        }
    }
}

// ------------------------------------------------------------ plain allocations

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

// ------------------------------------------------------------ arrays

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

// ------------------------------------------------------------ virtual memory management

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

// ------------------------------------------------------------ stream-ordered allocation

/// Refreshes what pools on device entry `dev` hold from the driver (a pool with a low
/// release threshold gives memory back at synchronisation without telling us).
/// Returns whether anything was given back.
fn refresh_pools(p: &process::Proc, dev: usize) -> bool {
    let Some(get_attr) = real::cuMemPoolGetAttribute() else {
        return false;
    };
    let mut released = false;
    let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
    for (&h, st) in pools.iter_mut() {
        if st.dev.map(|d| d.0) != Some(dev) {
            continue;
        }
        let mut reserved: u64 = 0;
        // SAFETY: the attribute is a cuuint64_t written into `reserved`.
        let r = unsafe {
            get_attr(
                h,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut reserved as *mut u64).cast(),
            )
        };
        if r == CUDA_SUCCESS && reserved < st.charged {
            let keep = reserved.max(st.in_use);
            p.acct.release(dev, st.charged - keep);
            st.charged = keep;
            released = true;
        }
    }
    released
}

/// Allocation from `pool` (on the device of `ord` unless the pool is known).
/// The pools lock is never held across the driver call.
fn pool_alloc(
    pool: CUmemoryPool,
    ord: Option<c_int>,
    dptr: *mut CUdeviceptr,
    size: usize,
    what: &str,
    alloc: impl FnOnce() -> CUresult,
) -> CUresult {
    if !config().enabled || nested() || dptr.is_null() || size == 0 {
        return alloc();
    }
    let p = process::get();
    let size = size as u64;
    // Book the allocation in the pool first (reusing its idle memory, charging the rest).
    let book = || -> Result<Option<(usize, u64)>, ()> {
        let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
        let st = pools
            .entry(pool)
            .or_insert_with(|| PoolStateInit::for_ordinal(ord));
        let Some((dev, limit)) = st.dev else {
            return Ok(None);
        };
        let need = size.saturating_sub(st.charged.saturating_sub(st.in_use));
        if need > 0 && !p.acct.try_reserve(dev, need, limit) {
            return Err(());
        }
        st.charged += need;
        st.in_use += size;
        Ok(Some((dev, need)))
    };
    let booked = match book() {
        Ok(b) => b,
        Err(()) => {
            // What the device's pools gave back at synchronisation may make room.
            let dev = p
                .pools
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&pool)
                .and_then(|st| st.dev);
            match dev {
                Some((d, limit)) if refresh_pools(p, d) => match book() {
                    Ok(b) => b,
                    Err(()) => {
                        return oom(
                            &Quota {
                                proc: p,
                                dev: d,
                                limit,
                            },
                            size,
                            what,
                        );
                    }
                },
                Some((d, limit)) => {
                    return oom(
                        &Quota {
                            proc: p,
                            dev: d,
                            limit,
                        },
                        size,
                        what,
                    );
                }
                None => None,
            }
        }
    };
    let Some((dev, need)) = booked else {
        return alloc();
    };
    let r = in_driver(alloc);
    if r != CUDA_SUCCESS {
        let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(st) = pools.get_mut(&pool) {
            st.charged = st.charged.saturating_sub(need);
            st.in_use = st.in_use.saturating_sub(size);
        }
        drop(pools);
        p.acct.release(dev, need);
        return r;
    }
    p.ptrs
        .insert(get(dptr).unwrap_or(0), Rec { size, dev, pool });
    r
}

struct PoolStateInit;
impl PoolStateInit {
    fn for_ordinal(ord: Option<c_int>) -> process::PoolState {
        let dev = ord.and_then(|o| quota_of(o).map(|q| (q.dev, q.limit)));
        process::PoolState {
            dev,
            ..Default::default()
        }
    }
}

fn async_alloc(
    dptr: *mut CUdeviceptr,
    size: usize,
    what: &str,
    alloc: impl FnOnce() -> CUresult,
) -> CUresult {
    if !config().enabled || nested() {
        return alloc();
    }
    let Some(ord) = process::current_ordinal() else {
        return alloc();
    };
    if config().limit(ord).is_none() {
        return alloc();
    }
    let mut pool: CUmemoryPool = 0;
    if let Some(f) = real::cuDeviceGetMemPool() {
        // SAFETY: pool is a valid out-pointer.
        unsafe { f(&mut pool, ord) };
    }
    if pool == 0 {
        // No pool to follow: count it like cuMemAlloc.
        let Some(q) = quota_of(ord) else {
            return alloc();
        };
        return charged(q, size as u64, &q.proc.ptrs, what, alloc, || {
            get(dptr).unwrap_or(0)
        });
    }
    pool_alloc(pool, Some(ord), dptr, size, what, alloc)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        async_alloc(dptr, size, "cuMemAllocAsync", || {
            forward!(cuMemAllocAsync(dptr, size, s))
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    s: CUstream,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        async_alloc(dptr, size, "cuMemAllocAsync", || {
            forward!(cuMemAllocAsync_ptsz(dptr, size, s))
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        pool_alloc(
            pool,
            process::current_ordinal(),
            dptr,
            size,
            "cuMemAllocFromPoolAsync",
            || forward!(cuMemAllocFromPoolAsync(dptr, size, pool, s)),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: CUmemoryPool,
    s: CUstream,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        pool_alloc(
            pool,
            process::current_ordinal(),
            dptr,
            size,
            "cuMemAllocFromPoolAsync",
            || forward!(cuMemAllocFromPoolAsync_ptsz(dptr, size, pool, s)),
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        uncharged(|p| &p.ptrs, dptr, || forward!(cuMemFreeAsync(dptr, s)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, s: CUstream) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        uncharged(|p| &p.ptrs, dptr, || forward!(cuMemFreeAsync_ptsz(dptr, s)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    props: *const MemPoolProps,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuMemPoolCreate(pool, props));
        if r == CUDA_SUCCESS && config().enabled {
            let ord = get(props)
                .filter(|p| p.location.kind == CU_MEM_LOCATION_TYPE_DEVICE)
                .map(|p| p.location.id);
            let st = PoolStateInit::for_ordinal(ord);
            if let Some(h) = get(pool) {
                let p = process::get();
                p.pools
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(h, st);
            }
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuMemPoolTrimTo(pool, keep));
        if let (CUDA_SUCCESS, Some(p)) = (r, process::existing()) {
            let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(st) = pools.get_mut(&pool)
                && let Some((dev, _)) = st.dev
            {
                let new = st.charged.min(keep as u64).max(st.in_use);
                p.acct.release(dev, st.charged - new);
                st.charged = new;
            }
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuMemPoolDestroy(pool));
        if let (CUDA_SUCCESS, Some(p)) = (r, process::existing()) {
            let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(st) = pools.get_mut(&pool) {
                // Idle memory goes back now; memory still in use when it is freed.
                if let Some((dev, _)) = st.dev {
                    p.acct.release(dev, st.charged - st.in_use);
                }
                st.charged = st.in_use;
                st.destroyed = true;
                if st.in_use == 0 {
                    pools.remove(&pool);
                }
            }
        }
        r
    })
}

// ------------------------------------------------------------ what the process is told

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(q) = current_quota() else {
            return forward!(cuMemGetInfo_v2(free, total));
        };
        // Real values first (into our own variables: either pointer may be null).
        let (mut f, mut t) = (0usize, 0usize);
        let r = forward!(cuMemGetInfo_v2(&mut f, &mut t));
        if r != CUDA_SUCCESS {
            return r;
        }
        let tot = (t as u64).min(q.limit);
        let fr = (f as u64).min(tot.saturating_sub(q.proc.acct.used(q.dev)));
        put(free, fr as usize);
        put(total, tot as usize);
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuDeviceTotalMem_v2(bytes, dev));
        if r == CUDA_SUCCESS
            && let (Some(limit), Some(b)) = (config().limit(dev), get(bytes))
        {
            put(bytes, (b as u64).min(limit) as usize);
        }
        r
    })
}

// ------------------------------------------------------------ launches
//
// Every way work reaches the GPU passes the core limiter (`crate::core`): with no core
// quota and no priority it costs one atomic load.

use crate::core::{GRAPH_UNITS, before_launch, ex_units, kernel_units};

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

// ------------------------------------------------------------ NVML

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
