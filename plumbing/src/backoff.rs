//! Retry delays that double: the daemons' loops wait longer after each failure in a row,
//! up to a ceiling, and start over after a success.

use std::time::Duration;

/// A doubling delay between `first` and `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Delays `first`, `2 first`, `4 first`, ... at most `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first.min(max),
        }
    }

    /// The delay to wait now; the one after it is twice as long (at most the ceiling).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// After a success: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.next = self.first.min(self.max);
    }
}

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
    fn doubles_to_the_ceiling_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let got: Vec<u64> = (0..5).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 5, 5]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }

    #[test]
    fn nth_delay_has_free_retries_then_doubles() {
        let s = |n| nth_delay(n, 1, Duration::from_secs(1), 8).as_secs();
        assert_eq!([s(0), s(1), s(2), s(3), s(4)], [0, 0, 1, 2, 4]);
        assert_eq!(s(40), 256);
    }
}
