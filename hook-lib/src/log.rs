//! Logging: off unless `FGPU_LOG=debug`; then one line per event on stderr.

use std::sync::atomic::{AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 off, 2 debug

#[inline]
pub fn enabled() -> bool {
    match LEVEL.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var_os("FGPU_LOG").is_some_and(|v| v.eq_ignore_ascii_case("debug"));
            LEVEL.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        l => l == 2,
    }
}

pub fn write(args: std::fmt::Arguments<'_>) {
    // SAFETY: getpid has no preconditions.
    let line = format!("fgpu[{}]: {args}\n", unsafe { libc::getpid() });
    // SAFETY: writing a valid buffer to fd 2; a failed write is ignored.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// A line written whatever `FGPU_LOG` says: a refusal the workload must see.
pub fn always(args: std::fmt::Arguments<'_>) {
    write(args);
}

/// `debug!("...", args)`: formats only when logging is on.
#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => {
        if $crate::log::enabled() {
            $crate::log::write(format_args!($($t)*));
        }
    };
}
