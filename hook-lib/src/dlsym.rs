//! Our `dlsym` and `dlvsym`: programs that look CUDA up themselves
//! (`dlopen("libcuda.so.1")` + `dlsym` or `dlvsym`) get our wrappers when a quota is
//! set; everything else is glibc's answer. Asked for `dlsym` or `dlvsym` themselves (by
//! any handle: `dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34")`, `dlsym(libc, "dlsym")`), they
//! answer with ours, so the real lookup functions — whose CUDA answers are the
//! unwrapped driver — cannot be reached by name.
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

/// Our answer for `name`, or null to let glibc answer.
fn ours(handle: *mut c_void, name: *const c_char, what: &str) -> *mut c_void {
    if name.is_null() {
        return null_mut();
    }
    // SAFETY: dlsym's contract: name is a NUL-terminated string.
    let n = unsafe { CStr::from_ptr(name) }.to_bytes();
    // The lookup functions themselves, by any handle (RTLD_NEXT included: ours forward
    // to glibc's with the caller preserved, so an interposer chaining to them loses
    // nothing).
    let lookup = match n {
        b"dlsym" => Some(dlsym as *const () as usize),
        b"dlvsym" => Some(dlvsym as *const () as usize),
        _ => None,
    };
    if let Some(p) = lookup {
        return if crate::process::config().hooked() {
            crate::debug!("{what}({}) -> ours", String::from_utf8_lossy(n));
            p as *mut c_void
        } else {
            null_mut()
        };
    }
    if handle == libc::RTLD_NEXT {
        return null_mut();
    }
    match crate::procaddr::wrapper_for_name(n) {
        Some(w) => {
            crate::debug!("{what}({}) -> wrapper", String::from_utf8_lossy(n));
            w as *mut c_void
        }
        None => null_mut(),
    }
}

/// Called by the `dlsym` stub: our wrapper for `name`, or null to let glibc answer.
/// Also makes sure the real `dlsym` is resolved before the stub jumps to it.
extern "C" fn fgpu_dlsym_hook(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        real::real_dlsym_ptr();
        ours(handle, name, "dlsym")
    }))
    .unwrap_or(null_mut())
}

/// Called by the `dlvsym` stub: as [`fgpu_dlsym_hook`] (a CUDA library's symbols are not
/// versioned, so the version asked for does not change our answer).
extern "C" fn fgpu_dlvsym_hook(
    handle: *mut c_void,
    name: *const c_char,
    _version: *const c_char,
) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        real::real_dlvsym_ptr();
        ours(handle, name, "dlvsym")
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
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 3f",
        // x16: a BTI 'c' landing pad accepts a `br` through it.
        "br x16",
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

/// The exported `dlvsym` (see the module doc): the same stub with a third argument.
///
/// # Safety
/// dlvsym's contract: `name` and `version` are NUL-terminated strings; `handle` a dlopen
/// handle or a pseudo-handle.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    // Three pushes keep the stack 16-byte aligned at the call (8 mod 16 on entry).
    std::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "call {hook}",
        "pop rdx",
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
        hook = sym fgpu_dlvsym_hook,
        real = sym real::FGPU_REAL_DLVSYM,
    )
}

/// The exported `dlvsym` (see the module doc).
///
/// # Safety
/// As above.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlvsym(
    handle: *mut c_void,
    name: *const c_char,
    version: *const c_char,
) -> *mut c_void {
    std::arch::naked_asm!(
        "stp x29, x30, [sp, #-48]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "str x2, [sp, #32]",
        "bl {hook}",
        "mov x9, x0",
        "ldp x0, x1, [sp, #16]",
        "ldr x2, [sp, #32]",
        "ldp x29, x30, [sp], #48",
        "cbnz x9, 2f",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 3f",
        // x16: a BTI 'c' landing pad accepts a `br` through it.
        "br x16",
        "2:",
        "mov x0, x9",
        "ret",
        "3:",
        "mov x0, xzr",
        "ret",
        hook = sym fgpu_dlvsym_hook,
        real = sym real::FGPU_REAL_DLVSYM,
    )
}
