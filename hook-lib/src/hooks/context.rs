//! Device memory that contexts take: a configurable charge per context
//! (`Config::context_overhead`) and what `cuCtxSetLimit` makes the driver reserve (the
//! malloc heap, the printf FIFO, the stack of every resident thread).
//!
//! * A context is charged when it is created: a primary context on the retain that
//!   makes it active (`cuDevicePrimaryCtxGetState` says it was not), a created one in
//!   `cuCtxCreate_v2/v3/v4`. Past the quota the creation is refused with
//!   `CUDA_ERROR_OUT_OF_MEMORY`, as the driver refuses a context it has no memory for.
//!   The charge goes back when the context ends: `cuCtxDestroy`, the release of a
//!   primary context's last retain, a primary context's reset.
//! * `cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE | CU_LIMIT_PRINTF_FIFO_SIZE, n)` takes `n`
//!   bytes, `CU_LIMIT_STACK_SIZE` takes `n x SM count x resident threads per SM`; raising
//!   a limit charges the growth over the current value (refused with
//!   `CUDA_ERROR_OUT_OF_MEMORY`, the driver's error, past the quota), lowering it gives
//!   back what raising it charged. Charged to the context, and given back with it.
//!
//! Context calls are rare: one short lock on a small map, never on the launch or
//! allocation path.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

use super::charge::{get, oom, reserve};
use crate::boundary::{forward, guard, in_driver, nested};
use crate::ffi::*;
use crate::process::{self, config, current_ordinal, quota_of};
use crate::real;

/// What one context is charged.
#[derive(Clone, Copy, Default)]
struct Charge {
    /// Account device entry.
    dev: usize,
    /// The primary context of this CUDA ordinal (`None`: a created context).
    primary: Option<CUdevice>,
    overhead: u64,
    /// Growth charged for the stack, printf FIFO and heap limits.
    limits: [u64; 3],
}

impl Charge {
    fn total(&self) -> u64 {
        self.limits
            .iter()
            .fold(self.overhead, |a, l| a.saturating_add(*l))
    }
}

/// Context handle -> charge, for the process that built it (a forked child starts
/// empty: its account slot is new and it inherits no context).
static CHARGES: Mutex<(usize, Vec<(usize, Charge)>)> = Mutex::new((0, Vec::new()));

fn with_charges<R>(p: &process::Proc, f: impl FnOnce(&mut Vec<(usize, Charge)>) -> R) -> R {
    let mut g = CHARGES.lock().unwrap_or_else(|e| e.into_inner());
    let owner = p as *const process::Proc as usize;
    if g.0 != owner {
        *g = (owner, Vec::new());
    }
    f(&mut g.1)
}

/// Adds `charge` for context `ctx` (merging with one already there).
fn record(p: &process::Proc, ctx: usize, charge: Charge) {
    with_charges(p, |v| match v.iter_mut().find(|(h, _)| *h == ctx) {
        Some((_, c)) => {
            c.overhead += charge.overhead;
            for i in 0..3 {
                c.limits[i] += charge.limits[i];
            }
        }
        None => v.push((ctx, charge)),
    });
}

/// Removes what `pick` selects and gives it back.
fn forget(p: &process::Proc, pick: impl Fn(&(usize, Charge)) -> bool) {
    let gone: Vec<Charge> = with_charges(p, |v| {
        let (gone, keep): (Vec<_>, Vec<_>) = v.drain(..).partition(|e| pick(e));
        *v = keep;
        gone.into_iter().map(|(_, c)| c).collect()
    });
    for c in gone {
        p.acct.release(c.dev, c.total());
    }
}

/// Whether `dev`'s primary context is active (`None`: the driver cannot say).
fn primary_active(dev: CUdevice) -> Option<bool> {
    let f = real::cuDevicePrimaryCtxGetState()?;
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: both are valid out-pointers.
    (in_driver(|| unsafe { f(dev, &mut flags, &mut active) }) == CUDA_SUCCESS)
        .then_some(active != 0)
}

/// A context creation charged with the per-context overhead. Primary contexts are
/// recorded even without an overhead, so that limits charged to them go back with them.
fn create(
    dev: CUdevice,
    primary: bool,
    what: &str,
    pctx: *mut CUcontext,
    call: impl FnOnce() -> CUresult,
) -> CUresult {
    if !config().enabled || nested() {
        return call();
    }
    let Some(q) = quota_of(dev) else {
        return call();
    };
    let mut overhead = config().context_overhead;
    if primary && overhead > 0 && primary_active(dev) != Some(false) {
        overhead = 0; // already made (or unknown): this retain makes nothing new
    }
    if overhead > 0 && !reserve(&q, overhead) {
        return oom(&q, overhead, what);
    }
    let r = in_driver(call);
    match (r, get(pctx)) {
        (CUDA_SUCCESS, Some(ctx)) if !ctx.is_null() => {
            let charge = Charge {
                dev: q.dev,
                primary: primary.then_some(dev),
                overhead,
                limits: [0; 3],
            };
            // Two threads retaining an inactive primary context at once both charged
            // it; only the first keeps its charge.
            let dup = primary
                && overhead > 0
                && with_charges(q.proc, |v| {
                    v.iter().any(|(h, c)| *h == ctx as usize && c.overhead > 0)
                });
            if dup {
                q.proc.acct.release(q.dev, overhead);
            } else if overhead > 0 || primary {
                record(q.proc, ctx as usize, charge);
            }
        }
        (CUDA_SUCCESS, _) => {}
        _ => q.proc.acct.release(q.dev, overhead),
    }
    r
}

/// After a primary context's release or reset: if it is gone, so is its charge.
fn primary_maybe_gone(dev: CUdevice, r: CUresult) -> CUresult {
    if r == CUDA_SUCCESS
        && config().enabled
        && !nested()
        && let Some(p) = process::existing()
        && primary_active(dev) == Some(false)
    {
        forget(p, |(_, c)| c.primary == Some(dev));
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        create(dev, true, "cuDevicePrimaryCtxRetain", pctx, || {
            forward!(cuDevicePrimaryCtxRetain(pctx, dev))
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        primary_maybe_gone(dev, forward!(cuDevicePrimaryCtxRelease(dev)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        primary_maybe_gone(dev, forward!(cuDevicePrimaryCtxRelease_v2(dev)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        primary_maybe_gone(dev, forward!(cuDevicePrimaryCtxReset(dev)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        primary_maybe_gone(dev, forward!(cuDevicePrimaryCtxReset_v2(dev)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        create(dev, false, "cuCtxCreate", pctx, || {
            forward!(cuCtxCreate_v2(pctx, flags, dev))
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    n: c_int,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        create(dev, false, "cuCtxCreate", pctx, || {
            forward!(cuCtxCreate_v3(pctx, params, n, flags, dev))
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        create(dev, false, "cuCtxCreate", pctx, || {
            forward!(cuCtxCreate_v4(pctx, params, flags, dev))
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let r = forward!(cuCtxDestroy_v2(ctx));
        if r == CUDA_SUCCESS
            && config().enabled
            && !nested()
            && let Some(p) = process::existing()
        {
            forget(p, |(h, c)| *h == ctx as usize && c.primary.is_none());
        }
        r
    })
}

/// Device bytes a context limit of `value` takes on `dev` (0: the limit takes none).
fn limit_bytes(limit: c_int, value: u64, dev: CUdevice) -> Option<u64> {
    match limit {
        CU_LIMIT_PRINTF_FIFO_SIZE | CU_LIMIT_MALLOC_HEAP_SIZE => Some(value),
        CU_LIMIT_STACK_SIZE => {
            let attr = |a: c_int| -> Option<u64> {
                let f = real::cuDeviceGetAttribute()?;
                let mut v: c_int = 0;
                // SAFETY: v is a valid out-pointer.
                let ok = in_driver(|| unsafe { f(&mut v, a, dev) }) == CUDA_SUCCESS;
                (ok && v > 0).then_some(v as u64)
            };
            let threads = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
                .saturating_mul(attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?);
            Some(value.saturating_mul(threads))
        }
        _ => None,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetLimit(limit: c_int, value: usize) -> CUresult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let call = || forward!(cuCtxSetLimit(limit, value));
        if !config().enabled || nested() || !(0..3).contains(&limit) {
            return call();
        }
        let (Some(ord), Some(get_limit), Some(get_ctx)) = (
            current_ordinal(),
            real::cuCtxGetLimit(),
            real::cuCtxGetCurrent(),
        ) else {
            return call();
        };
        let Some(q) = quota_of(ord) else {
            return call();
        };
        let (mut old, mut ctx): (usize, CUcontext) = (0, std::ptr::null_mut());
        // SAFETY: valid out-pointers.
        let known = in_driver(|| unsafe { get_limit(&mut old, limit) }) == CUDA_SUCCESS
            && in_driver(|| unsafe { get_ctx(&mut ctx) }) == CUDA_SUCCESS
            && !ctx.is_null();
        let (Some(old_b), Some(new_b), true) = (
            limit_bytes(limit, old as u64, ord),
            limit_bytes(limit, value as u64, ord),
            known,
        ) else {
            // Not measurable: a larger limit cannot be judged, so it is refused.
            return if value > old {
                oom(&q, value as u64, "cuCtxSetLimit")
            } else {
                call()
            };
        };
        let slot = limit as usize;
        if new_b > old_b {
            let grow = new_b - old_b;
            if !reserve(&q, grow) {
                return oom(&q, grow, "cuCtxSetLimit");
            }
            let r = in_driver(call);
            if r != CUDA_SUCCESS {
                q.proc.acct.release(q.dev, grow);
                return r;
            }
            let mut limits = [0; 3];
            limits[slot] = grow;
            record(
                q.proc,
                ctx as usize,
                Charge {
                    dev: q.dev,
                    limits,
                    ..Default::default()
                },
            );
            return r;
        }
        let r = in_driver(call);
        if r == CUDA_SUCCESS {
            let back = with_charges(q.proc, |v| {
                v.iter_mut()
                    .find(|(h, _)| *h == ctx as usize)
                    .map_or(0, |(_, c)| {
                        let b = c.limits[slot].min(old_b - new_b);
                        c.limits[slot] -= b;
                        b
                    })
            });
            q.proc.acct.release(q.dev, back);
        }
        r
    })
}
