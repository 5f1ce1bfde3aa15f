//! Logging: off unless `FGPU_LOG=debug`; then one line per event on stderr.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

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

/// [`always`], the first time in this process that `said` is seen unset (it is set then);
/// false, writing nothing, every later time. For a refusal the workload must see once, not
/// at every call.
pub fn always_once(said: &AtomicBool, args: std::fmt::Arguments<'_>) -> bool {
    let first = !said.swap(true, Ordering::Relaxed);
    if first {
        write(args);
    }
    first
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn always_once_writes_the_first_time_only() {
        let said = AtomicBool::new(false);
        assert!(always_once(&said, format_args!("test: first")));
        assert!(!always_once(&said, format_args!("test: second")));
        assert!(said.load(Ordering::Relaxed));
    }
}
