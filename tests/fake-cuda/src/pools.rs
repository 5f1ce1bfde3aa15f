//! Stream-ordered memory pools, synchronisation, contexts and context limits: the device
//! memory a real driver takes and gives back without a `cuMemAlloc`/`cuMemFree` pair.
//!
//! * **Pools** keep freed memory reserved. At every stream, event or context
//!   synchronisation a pool gives back to the device its idle reserved memory above its
//!   release threshold (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, default 0 for the default
//!   pool and for new pools), so `cuMemGetInfo` shows it free afterwards, as the CUDA
//!   driver API documents; `cuMemPoolTrimTo` gives back idle memory down to a floor. The
//!   attributes follow the driver's rules: `RESERVED_MEM_CURRENT` and `USED_MEM_CURRENT`
//!   are read-only, the two high watermarks can only be reset (set to 0), the three reuse
//!   flags and the threshold can be set.
//! * **Contexts** take `FAKE_CUDA_CONTEXT_MEMORY` bytes of device memory each (default 0):
//!   a primary context on its first retain (given back when its last retain is released
//!   or it is reset), a created one from `cuCtxCreate*` to `cuCtxDestroy`. Creating one
//!   on a full device fails with `CUDA_ERROR_OUT_OF_MEMORY`.
//! * **Context limits** (`cuCtxSetLimit`): the malloc heap and the printf FIFO take their
//!   size, the stack takes its per-thread size times the resident threads of the device
//!   (`SM count x max threads per SM`, the device attributes 16 and 39); what a limit
//!   takes beyond its default is device memory of the context, refused with
//!   `CUDA_ERROR_OUT_OF_MEMORY` when the device cannot give it (the limit is then
//!   unchanged), given back when the limit is lowered or the context ends.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::*;

/// `CUmemPool_attribute`.
pub const ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: c_int = 1;
pub const ATTR_REUSE_ALLOW_OPPORTUNISTIC: c_int = 2;
pub const ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: c_int = 3;
pub const ATTR_RELEASE_THRESHOLD: c_int = 4;
pub const ATTR_RESERVED_MEM_CURRENT: c_int = 5;
pub const ATTR_RESERVED_MEM_HIGH: c_int = 6;
pub const ATTR_USED_MEM_CURRENT: c_int = 7;
pub const ATTR_USED_MEM_HIGH: c_int = 8;

/// `CUlimit` values that take device memory, and the number of limits the fake knows.
pub const LIMIT_STACK_SIZE: c_int = 0;
pub const LIMIT_PRINTF_FIFO_SIZE: c_int = 1;
pub const LIMIT_MALLOC_HEAP_SIZE: c_int = 2;
const LIMITS: usize = 7;
/// The driver's defaults: stack 1 KiB per thread, printf FIFO 1 MiB, heap 8 MiB, device
/// runtime sync depth 2, pending launches 2048, L2 fetch granularity and persisting L2 0.
pub const LIMIT_DEFAULTS: [u64; LIMITS] = [1024, 1 << 20, 8 << 20, 2, 2048, 0, 0];
pub const CUDA_ERROR_UNSUPPORTED_LIMIT: CUresult = 215;

/// SM count and resident threads per SM the fake reports (`cuDeviceGetAttribute`).
pub const SM_COUNT: u64 = 132;
pub const THREADS_PER_SM: u64 = 2048;

pub struct Pool {
    pub dev: usize,
    pub reserved: u64,
    pub used: u64,
    pub destroyed: bool,
    /// Idle memory above this is given back to the device at synchronisation (the
    /// real default is 0).
    pub threshold: u64,
    pub reserved_high: u64,
    pub used_high: u64,
    /// The three reuse policies (attributes 1-3), all on by default.
    pub reuse: [bool; 3],
}

impl Pool {
    pub fn new(dev: usize) -> Pool {
        Pool {
            dev,
            reserved: 0,
            used: 0,
            destroyed: false,
            threshold: 0,
            reserved_high: 0,
            used_high: 0,
            reuse: [true; 3],
        }
    }
}

impl State {
    pub(crate) fn pool_alloc(&mut self, pool: u64, size: u64) -> Result<u64, CUresult> {
        if size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (dev, idle) = match self.pools.get(&pool) {
            Some(p) if !p.destroyed => (p.dev, p.reserved - p.used),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        let grow = size.saturating_sub(idle);
        self.take(dev, grow)?;
        let p = self.pools.get_mut(&pool).expect("checked above");
        p.reserved += grow;
        p.used += size;
        p.reserved_high = p.reserved_high.max(p.reserved);
        p.used_high = p.used_high.max(p.used);
        let a = self.address(dev, size);
        self.ptrs.insert(a, (dev, size, pool));
        Ok(a)
    }

    /// Synchronisation: every pool gives its idle memory above its release threshold
    /// back to the device.
    pub(crate) fn sync(&mut self) {
        let mut give = Vec::new();
        for p in self.pools.values_mut() {
            let release = (p.reserved - p.used).min(p.reserved.saturating_sub(p.threshold));
            p.reserved -= release;
            give.push((p.dev, release));
        }
        for (d, n) in give {
            self.give(d, n);
        }
    }
}

/// `cuMemPoolGetAttribute`: the value of `attr` (a `cuuint64_t` or an `int`).
pub(crate) fn get_attribute(st: &State, pool: u64, attr: c_int, value: *mut c_void) -> CUresult {
    let Some(p) = st.pools.get(&pool) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    let v = match attr {
        ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            let on = p.reuse[(attr - 1) as usize];
            return if put(value as *mut c_int, c_int::from(on)) {
                CUDA_SUCCESS
            } else {
                CUDA_ERROR_INVALID_VALUE
            };
        }
        ATTR_RELEASE_THRESHOLD => p.threshold,
        ATTR_RESERVED_MEM_CURRENT => p.reserved,
        ATTR_RESERVED_MEM_HIGH => p.reserved_high,
        ATTR_USED_MEM_CURRENT => p.used,
        ATTR_USED_MEM_HIGH => p.used_high,
        _ => return CUDA_ERROR_INVALID_VALUE,
    };
    if put(value as *mut u64, v) {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_INVALID_VALUE
    }
}

/// `cuMemPoolSetAttribute`: the reuse flags and the threshold are set; a high watermark
/// can only be reset (value 0; it then starts again from the current value); the
/// current amounts cannot be set.
pub(crate) fn set_attribute(
    st: &mut State,
    pool: u64,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    let Some(p) = st.pools.get_mut(&pool) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    match attr {
        ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            let Some(v) = get(value as *const c_int) else {
                return CUDA_ERROR_INVALID_VALUE;
            };
            p.reuse[(attr - 1) as usize] = v != 0;
        }
        ATTR_RELEASE_THRESHOLD => {
            let Some(v) = get(value as *const u64) else {
                return CUDA_ERROR_INVALID_VALUE;
            };
            p.threshold = v;
        }
        ATTR_RESERVED_MEM_HIGH | ATTR_USED_MEM_HIGH => match get(value as *const u64) {
            Some(0) if attr == ATTR_RESERVED_MEM_HIGH => p.reserved_high = p.reserved,
            Some(0) => p.used_high = p.used,
            _ => return CUDA_ERROR_INVALID_VALUE,
        },
        _ => return CUDA_ERROR_INVALID_VALUE,
    }
    CUDA_SUCCESS
}

// ---------------------------------------------------------------- contexts

/// Device memory of one context (`FAKE_CUDA_CONTEXT_MEMORY`, default 0).
pub fn context_memory() -> u64 {
    static V: OnceLock<u64> = OnceLock::new();
    *V.get_or_init(|| {
        std::env::var("FAKE_CUDA_CONTEXT_MEMORY")
            .ok()
            .and_then(|v| parse_bytes(&v))
            .unwrap_or(0)
    })
}

struct Ctx {
    dev: usize,
    /// Retains of a primary context (1 for a created one).
    refs: u32,
    limits: [u64; LIMITS],
}

#[derive(Default)]
struct Contexts {
    by_handle: HashMap<usize, Ctx>,
    events: HashSet<u64>,
}

fn contexts() -> MutexGuard<'static, Contexts> {
    static C: OnceLock<Mutex<Contexts>> = OnceLock::new();
    C.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Device memory a limit of `value` takes beyond the limit's default.
pub fn limit_extra(limit: c_int, value: u64) -> u64 {
    let bytes = |v: u64| match limit {
        LIMIT_STACK_SIZE => v.saturating_mul(SM_COUNT * THREADS_PER_SM),
        LIMIT_PRINTF_FIFO_SIZE | LIMIT_MALLOC_HEAP_SIZE => v,
        _ => 0,
    };
    bytes(value).saturating_sub(bytes(LIMIT_DEFAULTS[limit as usize]))
}

fn ctx_footprint(c: &Ctx) -> u64 {
    (0..LIMITS as c_int).fold(context_memory(), |a, l| {
        a.saturating_add(limit_extra(l, c.limits[l as usize]))
    })
}

fn new_ctx(dev: usize) -> Result<Ctx, CUresult> {
    state().take(dev, context_memory())?;
    Ok(Ctx {
        dev,
        refs: 1,
        limits: LIMIT_DEFAULTS,
    })
}

/// The primary context's handle of device `d` (serial 0).
fn primary(d: usize) -> usize {
    CTX_TAG | d
}

exports! {
    fn cuDevicePrimaryCtxRetain(ctx: *mut usize, dev: CUdevice) {
        let d = tri!(check_dev(dev));
        if ctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let mut cs = contexts();
        match cs.by_handle.get_mut(&primary(d)) {
            Some(c) => c.refs += 1,
            None => {
                let c = tri!(new_ctx(d));
                cs.by_handle.insert(primary(d), c);
            }
        }
        crate::procs::has_context(d, crate::limits::own_cgroup().id());
        // The context's memory, taken before the process had its slot.
        crate::procs::set_used(d, state().devs[d].used);
        put(ctx, primary(d));
        CUDA_SUCCESS
    }

    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        let d = tri!(check_dev(dev));
        let mut cs = contexts();
        let Some(c) = cs.by_handle.get_mut(&primary(d)) else { return CUDA_ERROR_INVALID_CONTEXT };
        c.refs -= 1;
        if c.refs == 0 {
            let c = cs.by_handle.remove(&primary(d)).expect("present");
            state().give(d, ctx_footprint(&c));
        }
        CUDA_SUCCESS
    }

    fn cuDevicePrimaryCtxRelease(dev: CUdevice) {
        // SAFETY: same contract.
        unsafe { cuDevicePrimaryCtxRelease_v2(dev) }
    }

    fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) {
        let d = tri!(check_dev(dev));
        if let Some(c) = contexts().by_handle.remove(&primary(d)) {
            state().give(d, ctx_footprint(&c));
        }
        CUDA_SUCCESS
    }

    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let d = tri!(check_dev(dev));
        if flags.is_null() || active.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let on = contexts().by_handle.contains_key(&primary(d));
        put(flags, 0);
        put(active, c_int::from(on));
        CUDA_SUCCESS
    }

    fn cuCtxCreate_v2(ctx: *mut usize, _flags: c_uint, dev: CUdevice) {
        let d = tri!(check_dev(dev));
        if ctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let c = tri!(new_ctx(d));
        let serial = CTX_SERIAL.fetch_add(1, Ordering::Relaxed) as usize & 0xFF_FFFF;
        let h = CTX_TAG | (serial << 8) | d;
        contexts().by_handle.insert(h, c);
        crate::procs::has_context(d, crate::limits::own_cgroup().id());
        // The context's memory, taken before the process had its slot.
        crate::procs::set_used(d, state().devs[d].used);
        CURRENT.with(|x| x.set(h));
        put(ctx, h);
        CUDA_SUCCESS
    }

    fn cuCtxCreate_v3(ctx: *mut usize, _params: *mut c_void, _n: c_int, flags: c_uint, dev: CUdevice) {
        // SAFETY: same contract (the execution-affinity parameters are not modelled).
        unsafe { cuCtxCreate_v2(ctx, flags, dev) }
    }

    fn cuCtxCreate_v4(ctx: *mut usize, _params: *mut c_void, flags: c_uint, dev: CUdevice) {
        // SAFETY: as above (CUctxCreateParams are not modelled).
        unsafe { cuCtxCreate_v2(ctx, flags, dev) }
    }

    fn cuCtxDestroy_v2(ctx: usize) {
        let Some(d) = ctx_device(ctx) else { return CUDA_ERROR_INVALID_CONTEXT };
        if ctx == primary(d) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        let Some(c) = contexts().by_handle.remove(&ctx) else { return CUDA_ERROR_INVALID_CONTEXT };
        state().give(d, ctx_footprint(&c));
        CURRENT.with(|x| if x.get() == ctx { x.set(0) });
        CUDA_SUCCESS
    }

    fn cuCtxSetLimit(limit: c_int, value: usize) {
        tri!(current_device());
        if !(0..LIMITS as c_int).contains(&limit) {
            return CUDA_ERROR_UNSUPPORTED_LIMIT;
        }
        let h = CURRENT.with(|x| x.get());
        let mut cs = contexts();
        let Some(c) = cs.by_handle.get_mut(&h) else { return CUDA_ERROR_INVALID_CONTEXT };
        let (old, new) = (limit_extra(limit, c.limits[limit as usize]), limit_extra(limit, value as u64));
        if new > old {
            tri!(state().take(c.dev, new - old));
        } else {
            state().give(c.dev, old - new);
        }
        c.limits[limit as usize] = value as u64;
        CUDA_SUCCESS
    }

    fn cuCtxGetLimit(value: *mut usize, limit: c_int) {
        tri!(current_device());
        if !(0..LIMITS as c_int).contains(&limit) {
            return CUDA_ERROR_UNSUPPORTED_LIMIT;
        }
        let h = CURRENT.with(|x| x.get());
        let cs = contexts();
        let Some(c) = cs.by_handle.get(&h) else { return CUDA_ERROR_INVALID_CONTEXT };
        if put(value, c.limits[limit as usize] as usize) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_VALUE }
    }

    // ------------------------------------------------------------ synchronisation

    fn cuCtxSynchronize() {
        tri!(current_device());
        wait_own_work();
        state().sync();
        CUDA_SUCCESS
    }

    fn cuCtxSynchronize_v2(ctx: usize) {
        // The context given (null: the current one), as CUDA 12.9+ defines it.
        if ctx != 0 && ctx_device(ctx).is_none() {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        tri!(current_device());
        wait_own_work();
        state().sync();
        CUDA_SUCCESS
    }

    fn cuStreamSynchronize(_stream: usize) {
        tri!(current_device());
        wait_own_work();
        state().sync();
        CUDA_SUCCESS
    }

    fn cuStreamSynchronize_ptsz(stream: usize) {
        // SAFETY: same contract.
        unsafe { cuStreamSynchronize(stream) }
    }

    fn cuEventCreate(ev: *mut u64, _flags: c_uint) {
        tri!(current_device());
        if ev.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let h = state().handle();
        contexts().events.insert(h);
        put(ev, h);
        CUDA_SUCCESS
    }

    fn cuEventRecord(ev: u64, _stream: usize) {
        tri!(current_device());
        if contexts().events.contains(&ev) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_HANDLE }
    }

    fn cuEventRecord_ptsz(ev: u64, stream: usize) {
        // SAFETY: same contract.
        unsafe { cuEventRecord(ev, stream) }
    }

    fn cuEventQuery(ev: u64) {
        if contexts().events.contains(&ev) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_HANDLE }
    }

    fn cuEventSynchronize(ev: u64) {
        tri!(current_device());
        if !contexts().events.contains(&ev) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        wait_own_work();
        state().sync();
        CUDA_SUCCESS
    }

    fn cuEventDestroy_v2(ev: u64) {
        if contexts().events.remove(&ev) { CUDA_SUCCESS } else { CUDA_ERROR_INVALID_HANDLE }
    }

    fn cuMemPoolSetAttribute(pool: u64, attr: c_int, value: *mut c_void) {
        set_attribute(&mut state(), pool, attr, value)
    }
}

/// `cuGetProcAddress` entries of this module (see `PROC_TABLE` in the crate root).
pub const PROC_TABLE: &[(&str, c_int, &str, Option<&str>)] = &[
    (
        "cuDevicePrimaryCtxRetain",
        7000,
        "cuDevicePrimaryCtxRetain",
        None,
    ),
    (
        "cuDevicePrimaryCtxRelease",
        7000,
        "cuDevicePrimaryCtxRelease",
        None,
    ),
    (
        "cuDevicePrimaryCtxRelease",
        11000,
        "cuDevicePrimaryCtxRelease_v2",
        None,
    ),
    (
        "cuDevicePrimaryCtxReset",
        11000,
        "cuDevicePrimaryCtxReset_v2",
        None,
    ),
    (
        "cuDevicePrimaryCtxGetState",
        7000,
        "cuDevicePrimaryCtxGetState",
        None,
    ),
    ("cuCtxCreate", 3020, "cuCtxCreate_v2", None),
    ("cuCtxCreate", 11040, "cuCtxCreate_v3", None),
    ("cuCtxCreate", 12050, "cuCtxCreate_v4", None),
    ("cuCtxDestroy", 4000, "cuCtxDestroy_v2", None),
    ("cuCtxSetLimit", 3010, "cuCtxSetLimit", None),
    ("cuCtxGetLimit", 3010, "cuCtxGetLimit", None),
    ("cuCtxSynchronize", 2000, "cuCtxSynchronize", None),
    ("cuCtxSynchronize_v2", 12090, "cuCtxSynchronize_v2", None),
    (
        "cuStreamSynchronize",
        2000,
        "cuStreamSynchronize",
        Some("cuStreamSynchronize_ptsz"),
    ),
    ("cuEventCreate", 2000, "cuEventCreate", None),
    (
        "cuEventRecord",
        2000,
        "cuEventRecord",
        Some("cuEventRecord_ptsz"),
    ),
    ("cuEventQuery", 2000, "cuEventQuery", None),
    ("cuEventSynchronize", 2000, "cuEventSynchronize", None),
    ("cuEventDestroy", 4000, "cuEventDestroy_v2", None),
    (
        "cuMemPoolSetAttribute",
        11020,
        "cuMemPoolSetAttribute",
        None,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_take_memory_beyond_their_defaults() {
        assert_eq!(limit_extra(LIMIT_MALLOC_HEAP_SIZE, 8 << 20), 0);
        assert_eq!(limit_extra(LIMIT_MALLOC_HEAP_SIZE, 40 << 20), 32 << 20);
        assert_eq!(limit_extra(LIMIT_MALLOC_HEAP_SIZE, 1 << 20), 0);
        assert_eq!(
            limit_extra(LIMIT_STACK_SIZE, 2048),
            1024 * SM_COUNT * THREADS_PER_SM
        );
        assert_eq!(limit_extra(3, 100), 0);
    }

    #[test]
    fn sync_gives_back_idle_memory_above_the_threshold() {
        let mut p = Pool::new(0);
        (p.reserved, p.used, p.threshold) = (100, 30, 50);
        let mut st = State::new();
        let h = st.handle();
        st.devs[0].used = 100;
        st.pools.insert(h, p);
        st.sync();
        assert_eq!(st.pools[&h].reserved, 50);
        assert_eq!(st.devs[0].used, 50);
        st.pools.get_mut(&h).unwrap().threshold = 0;
        st.sync();
        assert_eq!((st.pools[&h].reserved, st.devs[0].used), (30, 30));
    }
}
