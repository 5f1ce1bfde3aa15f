//! Booking shared by the allocation entry points: take from the quota, call the
//! driver, track what it produced, and give it back when it is freed.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::boundary::{in_driver, nested};
use crate::ffi::*;
use crate::process::{self, Quota, config};
use crate::real;
use crate::track::{Rec, Tracker};

/// Writes through a caller's out-pointer if it is not null.
pub(super) fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: a non-null out-pointer from the caller points to a writable T.
        unsafe { p.write(v) }
    }
}

/// Reads through a caller's in-pointer if it is not null.
pub(super) fn get<T: Copy>(p: *const T) -> Option<T> {
    // SAFETY: a non-null in-pointer from the caller points to a readable T.
    (!p.is_null()).then(|| unsafe { p.read() })
}

pub(super) fn oom(q: &Quota, size: u64, what: &str) -> CUresult {
    q.proc.acct.count_refusal(q.dev);
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
pub(super) fn reserve(q: &Quota, size: u64) -> bool {
    q.proc.acct.try_reserve(q.dev, size, q.limit)
        || (refresh_pools(q.proc, q.dev) && q.proc.acct.try_reserve(q.dev, size, q.limit))
}

/// The `pool` of a tracked allocation that is managed memory (no pool has this handle).
pub(super) const MANAGED: u64 = u64::MAX;

/// Research tier: whether an allocation just reserved in the grant takes the claim's
/// device use (what it uses, this allocation included, less its managed part) past the
/// physical part of the grant, so that managed memory must serve it.
pub(super) fn past_physical(q: &Quota) -> bool {
    let Some(physical) = q.physical else {
        return false;
    };
    let used = q.proc.acct.used(q.dev);
    used.saturating_sub(q.proc.acct.managed(q.dev)) > physical
}

/// Like [`charged`], for an allocation the driver serves with managed memory when it
/// would take the claim past its physical part (research tier): `alloc` is the device
/// allocation, `managed` the managed one. Managed bytes are counted as such in the
/// account and given back as such when freed.
pub(super) fn charged_spilling(
    q: Quota,
    size: u64,
    what: &str,
    alloc: impl FnOnce() -> CUresult,
    managed: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> u64,
) -> CUresult {
    if !reserve(&q, size) {
        return oom(&q, size, what);
    }
    let spill = past_physical(&q);
    let r = if spill {
        in_driver(managed)
    } else {
        in_driver(alloc)
    };
    if r != CUDA_SUCCESS {
        q.proc.acct.release(q.dev, size);
        return r;
    }
    if spill {
        q.proc.acct.note_managed(q.dev, size, true);
        crate::debug!(
            "{what}: {size} bytes past the physical part of the grant on device entry {}: served by managed memory",
            q.dev
        );
    }
    let pool = if spill { MANAGED } else { 0 };
    q.proc.ptrs.insert(
        key(),
        Rec {
            size,
            dev: q.dev,
            pool,
        },
    );
    r
}

/// Reserve `size`, call `alloc`, then track the key it produced (or undo).
pub(super) fn charged(
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
pub(super) fn uncharged(
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

pub(super) fn give_back(p: &process::Proc, rec: Rec) {
    if rec.pool == 0 {
        p.acct.release(rec.dev, rec.size);
        return;
    }
    if rec.pool == MANAGED {
        p.acct.note_managed(rec.dev, rec.size, false);
        p.acct.release(rec.dev, rec.size);
        return;
    }
    let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(st) = pools.get_mut(&rec.pool) {
        st.in_use = st.in_use.saturating_sub(rec.size);
        if st.charged > st.in_use {
            POOLS_IDLE.store(true, Ordering::Relaxed);
        }
        if st.destroyed && st.in_use == 0 {
            if let Some((dev, _)) = st.dev {
                p.acct.release(dev, st.charged);
            }
            pools.remove(&rec.pool);
        }
    }
}

/// Set when a pool may hold charged memory nothing uses (freed into it, or kept by a
/// trim): the driver may give it back at the next synchronisation. Written under the
/// pools lock, read without it: a synchronisation with no such pool costs one load.
static POOLS_IDLE: AtomicBool = AtomicBool::new(false);

/// Notes that a pool may now hold idle charged memory (call with the pools lock held).
pub(super) fn mark_idle() {
    POOLS_IDLE.store(true, Ordering::Relaxed);
}

/// Whether a pool may hold idle charged memory (see [`POOLS_IDLE`]).
#[inline(always)]
pub(super) fn pools_idle() -> bool {
    POOLS_IDLE.load(Ordering::Relaxed)
}

/// Refreshes what pools on device entry `dev` hold from the driver (a pool with a low
/// release threshold gives memory back at synchronisation without telling us).
/// Returns whether anything was given back.
pub(super) fn refresh_pools(p: &process::Proc, dev: usize) -> bool {
    refresh(p, Some(dev))
}

/// After a synchronisation (or before telling the process what is free): every pool of
/// this process charged for more than the driver says it holds is charged what it holds
/// (never less than what is in use). Returns whether anything was given back.
pub(super) fn refresh_all(p: &process::Proc) -> bool {
    refresh(p, None)
}

fn refresh(p: &process::Proc, only: Option<usize>) -> bool {
    let Some(get_attr) = real::cuMemPoolGetAttribute() else {
        return false;
    };
    let mut released = false;
    let mut idle = false;
    let mut pools = p.pools.lock().unwrap_or_else(|e| e.into_inner());
    for (&h, st) in pools.iter_mut() {
        let Some((dev, _)) = st.dev else {
            continue;
        };
        if only.is_some_and(|d| d != dev) || st.charged <= st.in_use {
            idle |= st.charged > st.in_use;
            continue;
        }
        let mut reserved: u64 = 0;
        // SAFETY: the attribute is a cuuint64_t written into `reserved`.
        let r = in_driver(|| unsafe {
            get_attr(
                h,
                CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&mut reserved as *mut u64).cast(),
            )
        });
        if r == CUDA_SUCCESS && reserved < st.charged {
            let keep = reserved.max(st.in_use);
            p.acct.release(dev, st.charged - keep);
            st.charged = keep;
            released = true;
        }
        idle |= st.charged > st.in_use;
    }
    if only.is_none() {
        POOLS_IDLE.store(idle, Ordering::Relaxed);
    }
    released
}
