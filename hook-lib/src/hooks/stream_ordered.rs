//! Stream-ordered allocation: `cuMemAllocAsync`, memory pools and what they hold.

use std::ffi::c_int;

use super::charge::{charged, get, oom, refresh_pools, uncharged};
use crate::boundary::{forward, guard, in_driver, nested};
use crate::ffi::*;
use crate::process::{self, Quota, config, quota_of};
use crate::real;
use crate::track::Rec;

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
