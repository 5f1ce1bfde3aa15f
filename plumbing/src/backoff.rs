//! Retry delays that double: a loop waits longer after each failure in a row, up to a
//! ceiling.

use std::time::Duration;

/// The delay before retry `n` (1-based) of an exponential schedule that starts with
/// `free` retries at no delay, then waits `unit`, `2 unit`, `4 unit`, ... at most
/// `unit * 2^max_doublings`.
pub fn nth_delay(n: u32, free: u32, unit: Duration, max_doublings: u32) -> Duration {
    if n <= free {
        return Duration::ZERO;
    }
    unit * (1u32 << (n - free - 1).min(max_doublings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_delay_has_free_retries_then_doubles() {
        let s = |n| nth_delay(n, 1, Duration::from_secs(1), 8).as_secs();
        assert_eq!([s(0), s(1), s(2), s(3), s(4)], [0, 0, 1, 2, 4]);
        assert_eq!(s(40), 256);
    }
}
