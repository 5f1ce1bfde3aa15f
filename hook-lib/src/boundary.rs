//! What every exported entry point runs inside: the panic guard, the re-entrancy flag
//! and the forwarding call to the real driver.
//!
//! Low in the module graph (it uses only `real` and `ffi`): the limiter
//! ([`crate::core`]), the per-process state ([`crate::process`]) and the entry points
//! ([`crate::hooks`], [`crate::procaddr`]) all ask `nested`, so the flag lives below all
//! of them.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The shim's per-thread state: one thread-local, so a launch looks it up once (in a
/// shared object each lookup is a call to `__tls_get_addr`).
pub(crate) struct Thread {
    /// Set while this thread is inside a driver call made by the shim.
    pub(crate) in_driver: Cell<bool>,
    /// The core limiter's units and lease of this thread ([`crate::core`]).
    pub(crate) launch: crate::core::Batch,
}

thread_local! {
    static THREAD: Thread = const {
        Thread { in_driver: Cell::new(false), launch: crate::core::Batch::new() }
    };
}

/// This thread's state.
#[inline(always)]
pub(crate) fn with_thread<R>(f: impl FnOnce(&Thread) -> R) -> R {
    THREAD.with(f)
}

/// Runs a driver call on behalf of a counted operation. If the driver calls its own
/// exported entry points meanwhile (they resolve to ours), those nested calls are
/// forwarded uncounted: no double counting, no re-entered lock.
#[inline]
pub(crate) fn in_driver<R>(f: impl FnOnce() -> R) -> R {
    let prev = THREAD.with(|t| t.in_driver.replace(true));
    let r = f();
    THREAD.with(|t| t.in_driver.set(prev));
    r
}

/// Whether this thread is inside a driver call made by the shim (see [`in_driver`]).
#[inline]
pub(crate) fn nested() -> bool {
    THREAD.with(|t| t.in_driver.get())
}

/// Runs `f`, turning a panic into `err`.
#[inline(always)]
pub fn guard<R>(err: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(err)
}

/// Calls the real entry point, or answers `CUDA_ERROR_NOT_INITIALIZED` with no driver.
macro_rules! forward {
    ($name:ident ( $($a:expr),* )) => {
        match $crate::real::$name() {
            // SAFETY: the driver's function, called with the caller's own arguments.
            Some(f) => unsafe { f($($a),*) },
            None => $crate::ffi::CUDA_ERROR_NOT_INITIALIZED,
        }
    };
}
pub(crate) use forward;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_driver_sets_the_flag_for_its_call_only() {
        assert!(!nested());
        assert!(in_driver(nested));
        assert!(in_driver(|| in_driver(nested) && nested()));
        assert!(!nested());
    }

    #[test]
    fn guard_turns_a_panic_into_the_error() {
        assert_eq!(guard(7, || 1), 1);
        assert_eq!(guard(7, || panic!("boom")), 7);
    }
}
