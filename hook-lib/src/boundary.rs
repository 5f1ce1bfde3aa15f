//! What every exported entry point runs inside: the panic guard, the re-entrancy flag
//! and the forwarding call to the real driver.
//!
//! Low in the module graph (it uses only `real` and `ffi`): the limiter
//! ([`crate::core`]), the per-process state ([`crate::process`]) and the entry points
//! ([`crate::hooks`], [`crate::procaddr`]) all ask `nested`, so the flag lives below all
//! of them.

use std::cell::Cell;
use std::ffi::c_int;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::AtomicU64;

/// The shim's per-thread state: one thread-local, so a launch looks it up once (in a
/// shared object each lookup is a call to `__tls_get_addr`).
pub(crate) struct Thread {
    /// Set while this thread is inside a driver call made by the shim.
    pub(crate) in_driver: Cell<bool>,
    /// The core limiter's units and lease of this thread ([`crate::core`]).
    pub(crate) launch: Batch,
}

/// A thread's launch units not yet added to a core entry's `units`, its lease of that
/// entry's bucket time, and what the limiter read from the device's entry at the last
/// clock tick: the limiter's data ([`crate::core`] reads and writes it), kept here
/// because it lives in the one thread-local, below the modules that use it. All-zero is
/// the empty state (nothing pending, no lease, no cache).
pub(crate) struct Batch {
    /// The entry's `units` counter they belong to (null: none pending).
    pub(crate) to: Cell<*const AtomicU64>,
    pub(crate) units: Cell<u64>,
    /// The coarse clock reading they were counted at.
    pub(crate) tick: Cell<u64>,
    /// The core entry whose bucket time the thread holds (null: none), and how much (ns).
    pub(crate) lease_of: Cell<*const ()>,
    pub(crate) lease: Cell<u64>,
    /// What the next launches on device `ord` may skip, valid while the coarse clock reads
    /// `tick` ([`crate::core`]'s fast path): 0 nothing (take the full path), otherwise the
    /// mode the full path found for the device at that tick.
    pub(crate) mode: Cell<u8>,
    pub(crate) ord: Cell<c_int>,
    /// The device's bucket time per unit at that tick (`k_fp · scale`, 48 fraction bits).
    pub(crate) rate: Cell<u64>,
}

impl Batch {
    // x86_64 Linux starts every thread's batch from zeroed TLS, not from `new`.
    #[cfg_attr(all(target_arch = "x86_64", target_os = "linux"), allow(dead_code))]
    pub(crate) const fn new() -> Batch {
        Batch {
            to: Cell::new(std::ptr::null()),
            units: Cell::new(0),
            tick: Cell::new(0),
            lease_of: Cell::new(std::ptr::null()),
            lease: Cell::new(0),
            mode: Cell::new(0),
            ord: Cell::new(0),
            rate: Cell::new(0),
        }
    }

    /// Forgets everything (a forked child: the parent counts and spends its own).
    pub(crate) fn clear(&self) {
        self.to.set(std::ptr::null());
        self.units.set(0);
        self.lease_of.set(std::ptr::null());
        self.lease.set(0);
        self.mode.set(0);
    }
}

/// The thread's block on x86_64 Linux: a TLS symbol of the initial-exec model, defined
/// and addressed in assembly. Rust's `thread_local!` in a shared object gets the
/// general-dynamic model, a call to `__tls_get_addr` per lookup; initial-exec is the
/// thread pointer (`fs:0`) plus the block's offset, which the dynamic loader writes into
/// the GOT once. That needs the block in the static TLS area, which glibc gives every
/// library loaded at start-up (`LD_PRELOAD`, `/etc/ld.so.preload`: how the shim is
/// loaded) and, from a small reserve, a library `dlopen`ed later. The block is zero at
/// each thread's start, which is `Thread`'s initial state (all flags clear, all
/// counters and pointers zero), and needs no destructor (neither does `Thread`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod block {
    use super::Thread;

    /// Bytes reserved for the block.
    const SIZE: usize = 128;
    const _: () = assert!(std::mem::size_of::<Thread>() <= SIZE);
    const _: () = assert!(std::mem::align_of::<Thread>() <= 64);

    std::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".balign 64",
        ".globl fgpu_thread_block",
        ".hidden fgpu_thread_block",
        ".type fgpu_thread_block,@object",
        ".size fgpu_thread_block,128",
        "fgpu_thread_block:",
        ".zero 128",
        ".popsection",
    );

    /// The calling thread's block.
    #[inline(always)]
    pub(super) fn get() -> *const Thread {
        let p: *const Thread;
        // SAFETY: reads the thread pointer (the TCB's self pointer at fs:0, the x86_64
        // TLS ABI) and adds the block's offset from the GOT (R_X86_64_GOTTPOFF): the
        // address of this thread's copy of the 128-byte, 64-aligned block, valid while
        // the thread lives. No memory is written, no flags outlive the asm.
        unsafe {
            std::arch::asm!(
                "movq %fs:0, {p}",
                "addq fgpu_thread_block@GOTTPOFF(%rip), {p}",
                p = out(reg) p,
                options(att_syntax, nostack, pure, readonly),
            );
        }
        p
    }
}

/// Elsewhere: Rust's thread-local (one `__tls_get_addr` call per lookup in a shared object).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod block {
    use super::{Batch, Cell, Thread};

    thread_local! {
        static THREAD: Thread = const {
            Thread { in_driver: Cell::new(false), launch: Batch::new() }
        };
    }

    /// The calling thread's block.
    #[inline(always)]
    pub(super) fn get() -> *const Thread {
        THREAD.with(|t| t as *const Thread)
    }
}

/// This thread's state.
#[inline(always)]
pub(crate) fn with_thread<R>(f: impl FnOnce(&Thread) -> R) -> R {
    // SAFETY: the calling thread's block, alive as long as the thread; `Thread` is not
    // `Sync`, so the reference cannot leave the thread, and the closure cannot keep it.
    f(unsafe { &*block::get() })
}

/// Runs a driver call on behalf of a counted operation. If the driver calls its own
/// exported entry points meanwhile (they resolve to ours), those nested calls are
/// forwarded uncounted: no double counting, no re-entered lock.
#[inline]
pub(crate) fn in_driver<R>(f: impl FnOnce() -> R) -> R {
    let prev = with_thread(|t| t.in_driver.replace(true));
    let r = f();
    with_thread(|t| t.in_driver.set(prev));
    r
}

/// Whether this thread is inside a driver call made by the shim (see [`in_driver`]).
#[inline]
pub(crate) fn nested() -> bool {
    with_thread(|t| t.in_driver.get())
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

    /// The fields `core` and this module read before writing (the flag, the batch).
    fn state(t: &Thread) -> (bool, usize, u64, u64, usize, u64, u8, c_int, u64) {
        let b = &t.launch;
        (
            t.in_driver.get(),
            b.to.get() as usize,
            b.units.get(),
            b.tick.get(),
            b.lease_of.get() as usize,
            b.lease.get(),
            b.mode.get(),
            b.ord.get(),
            b.rate.get(),
        )
    }

    #[test]
    fn each_thread_has_its_own_block_and_starts_empty() {
        let empty = state(&Thread {
            in_driver: Cell::new(false),
            launch: Batch::new(),
        });
        let here = with_thread(|t| t as *const Thread as usize);
        assert_eq!(with_thread(|t| t as *const Thread as usize), here);
        with_thread(|t| {
            t.launch.units.set(41);
            t.launch.mode.set(1);
        });
        let (there, fresh) = std::thread::spawn(|| {
            let fresh = with_thread(state);
            with_thread(|t| t.launch.units.set(7));
            (with_thread(|t| t as *const Thread as usize), fresh)
        })
        .join()
        .unwrap();
        assert_ne!(there, here);
        assert_eq!(fresh, empty, "a new thread's block is Batch::new()'s state");
        assert_eq!(
            with_thread(|t| t.launch.units.get()),
            41,
            "untouched by the other"
        );
        with_thread(|t| t.launch.clear());
        assert_eq!(
            with_thread(|t| (t.launch.units.get(), t.launch.mode.get())),
            (0, 0)
        );
    }

    #[test]
    fn guard_turns_a_panic_into_the_error() {
        assert_eq!(guard(7, || 1), 1);
        assert_eq!(guard(7, || panic!("boom")), 7);
    }
}
