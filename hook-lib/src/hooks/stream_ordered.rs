//! Stream-ordered allocation: `cuMemAllocAsync`, memory pools and what they hold.

use std::ffi::c_int;

use super::charge::{charged, get, mark_idle, oom, refresh_pools, uncharged};
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
    let (dev, need) = match book_or_refresh(p, pool, ord, size) {
        Ok(Some(booked)) => booked,
        Ok(None) => return alloc(),
        Err(q) => return oom(&q, size, what),
    };
    let r = in_driver(alloc);
    if r != CUDA_SUCCESS {
        unbook(p, pool, dev, need, size);
        return r;
    }
    p.ptrs
        .insert(get(dptr).unwrap_or(0), Rec { size, dev, pool });
    r
}

/// An allocation from a pool would pass the quota of its device.
struct OverQuota;

/// Books `size` bytes in `pool` (reusing its idle memory, charging the rest): the device
/// entry and the bytes newly charged, or `None` when the pool's device has no quota.
fn book(
    p: &process::Proc,
    pool: CUmemoryPool,
    ord: Option<c_int>,
    size: u64,
) -> Result<Option<(usize, u64)>, OverQuota> {
    let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
    let st = pools.entry(pool).or_insert_with(|| pool_state(ord));
    let Some((dev, limit)) = st.dev else {
        return Ok(None);
    };
    let need = size.saturating_sub(st.charged.saturating_sub(st.in_use));
    if need > 0 && !p.acct.try_reserve(dev, need, limit) {
        return Err(OverQuota);
    }
    st.charged += need;
    st.in_use += size;
    Ok(Some((dev, need)))
}

/// [`book`]; when refused, once more after taking back what the device's pools gave
/// back at synchronisation. Still refused (or nothing came back): the quota that
/// refused it.
fn book_or_refresh(
    p: &'static process::Proc,
    pool: CUmemoryPool,
    ord: Option<c_int>,
    size: u64,
) -> Result<Option<(usize, u64)>, Quota> {
    if let Ok(booked) = book(p, pool, ord, size) {
        return Ok(booked);
    }
    // What the device's pools gave back at synchronisation may make room.
    let dev = p
        .pools
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&pool)
        .and_then(|st| st.dev);
    let Some((dev, limit)) = dev else {
        return Ok(None);
    };
    let refused = Quota {
        proc: p,
        dev,
        limit,
        physical: None,
    };
    if !refresh_pools(p, dev) {
        return Err(refused);
    }
    book(p, pool, ord, size).map_err(|OverQuota| refused)
}

/// Undoes [`book`] after the driver refused the allocation.
fn unbook(p: &process::Proc, pool: CUmemoryPool, dev: usize, need: u64, size: u64) {
    let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(st) = pools.get_mut(&pool) {
        st.charged = st.charged.saturating_sub(need);
        st.in_use = st.in_use.saturating_sub(size);
    }
    drop(pools);
    p.acct.release(dev, need);
}

/// The state of a pool first seen now: on the device of `ord`, if that has a quota.
fn pool_state(ord: Option<c_int>) -> process::PoolState {
    let dev = ord.and_then(|o| quota_of(o).map(|q| (q.dev, q.limit)));
    process::PoolState {
        dev,
        ..Default::default()
    }
}

/// `cuMemAllocAsync`: from the current device's default pool, or counted like
/// `cuMemAlloc` when the device has none.
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

/// A pool handed out for device `dev`: known from now on to be on that device, so that
/// allocations from it are charged there whatever the current context's device.
fn note_pool(pool: *mut CUmemoryPool, dev: c_int) {
    if !config().enabled || nested() {
        return;
    }
    if let Some(h) = get(pool).filter(|&h| h != 0) {
        let st = pool_state(Some(dev));
        process::get()
            .pools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(h)
            .or_insert(st);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut CUmemoryPool,
    dev: c_int,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuDeviceGetDefaultMemPool(pool, dev));
        if r == CUDA_SUCCESS {
            note_pool(pool, dev);
        }
        r
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: c_int) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuDeviceGetMemPool(pool, dev));
        if r == CUDA_SUCCESS {
            note_pool(pool, dev);
        }
        r
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
            let st = pool_state(ord);
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
                if new > st.in_use {
                    mark_idle();
                }
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
