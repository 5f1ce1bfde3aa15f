//! Our `dlsym`: programs that look CUDA up themselves (`dlopen("libcuda.so.1")` +
//! `dlsym`) get our wrappers when a quota is set; everything else is glibc's answer.
//!
//! The exported `dlsym` is a small assembly stub, not a Rust function, so that glibc's
//! `dlsym` — which looks at its caller's return address for `RTLD_NEXT` and for the
//! caller's namespace — is entered by a tail jump and sees the *original* caller. A
//! library that does `dlsym(RTLD_NEXT, "malloc")` therefore gets the same answer as
//! without the shim. (A plain forwarding function would make every such lookup relative
//! to libfgpu.so, a classic preload bug.)

use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::null_mut;

use crate::real;

/// Called by the stub: our wrapper for `name`, or null to let glibc answer.
/// Also makes sure the real `dlsym` is resolved before the stub jumps to it.
extern "C" fn fgpu_dlsym_hook(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        real::real_dlsym_ptr();
        if handle == libc::RTLD_NEXT || name.is_null() {
            return null_mut();
        }
        // SAFETY: dlsym's contract: name is a NUL-terminated string.
        let n = unsafe { CStr::from_ptr(name) }.to_bytes();
        match crate::procaddr::wrapper_for_name(n) {
            Some(w) => {
                crate::debug!("dlsym({}) -> wrapper", String::from_utf8_lossy(n));
                w as *mut c_void
            }
            None => null_mut(),
        }
    }))
    .unwrap_or(null_mut())
}

/// The exported `dlsym` (see the module doc).
///
/// # Safety
/// dlsym's contract: `name` is a NUL-terminated string; `handle` a dlopen handle or a
/// pseudo-handle.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {hook}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "ret",
        hook = sym fgpu_dlsym_hook,
        real = sym real::FGPU_REAL_DLSYM,
    )
}

/// The exported `dlsym` (see the module doc).
///
/// # Safety
/// As above.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {hook}",
        "mov x9, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbnz x9, 2f",
        "adrp x10, {real}",
        "ldr x10, [x10, :lo12:{real}]",
        "cbz x10, 3f",
        "br x10",
        "2:",
        "mov x0, x9",
        "ret",
        "3:",
        "mov x0, xzr",
        "ret",
        hook = sym fgpu_dlsym_hook,
        real = sym real::FGPU_REAL_DLSYM,
    )
}
