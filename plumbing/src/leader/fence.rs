//! The leader's validity, shared with whoever writes on its behalf: a deadline by the
//! local monotonic clock, after which a standby may already lead.
//!
//! [`Elector`](super::Elector) moves the deadline on with each successful renewal: the
//! instant the renewal was *sent*, plus the lease, less a safety margin (the retry period).
//! A standby takes over no sooner than one lease after it first saw that renewal (see
//! [`observe`](super::observe)), which is after the renewal was sent; the margin covers a
//! write that is under way when the deadline passes and clocks that run at slightly
//! different rates. A writer calls [`Fence::check`] right before each write, or runs the
//! write through [`Fence::run`], which also ends it at the deadline.
//!
//! What no fence can stop: a request the client gave up on may still reach the API server
//! later (it was already on the wire). Writes conditional on a `resourceVersion` (every
//! allocation write) then fail on a claim the new leader wrote meanwhile.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::{Duration, Instant};

/// Why a write was refused: this replica does not lead, or may no longer.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Fenced {
    /// This replica does not hold the lease (never did, lost it, or gave it up).
    #[error("Lease {lease}: this replica does not lead")]
    NotLeader { lease: String },
    /// The last renewal is too old: a standby may lead by now.
    #[error("Lease {lease}: not renewed in time, a standby may lead by now")]
    Expired { lease: String },
    /// The write was still under way at the deadline (it may or may not have landed).
    #[error("Lease {lease}: the write was still under way when leadership ran out")]
    TimedOut { lease: String },
}

/// A leader's deadline, cheap to clone; all clones see the same one.
#[derive(Clone, Debug)]
pub struct Fence {
    lease: Arc<str>,
    /// `None`: not leading. `Some(t)`: leading until `t` (local monotonic time).
    until: Arc<watch::Sender<Option<Instant>>>,
    /// No leader election: every check passes, nothing is timed out.
    open: bool,
}

impl Fence {
    /// A closed fence for the lease `lease` (refuses until its elector leads).
    pub fn new(lease: &str) -> Self {
        Self {
            lease: lease.into(),
            until: Arc::new(watch::Sender::new(None)),
            open: false,
        }
    }

    /// A fence that never refuses: for a single replica without leader election.
    pub fn open() -> Self {
        Self {
            open: true,
            ..Self::new("")
        }
    }

    /// Leading until `deadline` (a renewal succeeded).
    pub(crate) fn extend(&self, deadline: Instant) {
        self.until.send_replace(Some(deadline));
    }

    /// Not leading any more.
    pub(crate) fn close(&self) {
        self.until.send_replace(None);
    }

    /// The deadline when this replica may write now; `Ok(None)` for an [`Fence::open`]
    /// fence.
    pub fn check(&self) -> Result<Option<Instant>, Fenced> {
        if self.open {
            return Ok(None);
        }
        match *self.until.borrow() {
            None => Err(Fenced::NotLeader {
                lease: self.lease.to_string(),
            }),
            Some(t) if Instant::now() >= t => Err(Fenced::Expired {
                lease: self.lease.to_string(),
            }),
            Some(t) => Ok(Some(t)),
        }
    }

    /// Runs `write` if this replica may write now, cut off at the deadline (an open fence
    /// runs it as it is).
    pub async fn run<F: Future>(&self, write: F) -> Result<F::Output, Fenced> {
        match self.check()? {
            None => Ok(write.await),
            Some(deadline) => {
                tokio::time::timeout_at(deadline, write)
                    .await
                    .map_err(|_| Fenced::TimedOut {
                        lease: self.lease.to_string(),
                    })
            }
        }
    }

    /// Completes once this replica may no longer write: closed, or the deadline passed
    /// without a renewal. Never completes for an open fence.
    pub async fn closed(&self) {
        if self.open {
            return std::future::pending().await;
        }
        let mut rx = self.until.subscribe();
        loop {
            let until = *rx.borrow_and_update();
            let Some(deadline) = until else { return };
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Time left before the deadline; `None` for an open fence, zero when refused.
    pub fn remaining(&self) -> Option<Duration> {
        match self.check() {
            Ok(None) => None,
            Ok(Some(t)) => Some(t.saturating_duration_since(Instant::now())),
            Err(_) => Some(Duration::ZERO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn refuses_until_extended_and_after_the_deadline() {
        let f = Fence::new("ns/l");
        assert_eq!(
            f.check(),
            Err(Fenced::NotLeader {
                lease: "ns/l".into()
            })
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        f.extend(deadline);
        let clone = f.clone();
        assert_eq!(clone.check(), Ok(Some(deadline)));
        assert_eq!(clone.remaining(), Some(Duration::from_secs(10)));
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(clone.check().is_ok());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            clone.check(),
            Err(Fenced::Expired {
                lease: "ns/l".into()
            })
        );
        assert_eq!(clone.remaining(), Some(Duration::ZERO));
        f.extend(Instant::now() + Duration::from_secs(5));
        assert!(clone.check().is_ok(), "renewed again");
        f.close();
        assert!(matches!(clone.check(), Err(Fenced::NotLeader { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn run_cuts_a_write_off_at_the_deadline() {
        let f = Fence::new("l");
        let start = Instant::now();
        f.extend(start + Duration::from_secs(3));
        assert_eq!(f.run(async { 7 }).await, Ok(7));
        let hung = f.run(std::future::pending::<()>()).await;
        assert_eq!(hung, Err(Fenced::TimedOut { lease: "l".into() }));
        assert_eq!(Instant::now() - start, Duration::from_secs(3));
        // refused before it starts: the write never runs
        let mut ran = false;
        let refused = f.run(async { ran = true }).await;
        assert!(matches!(refused, Err(Fenced::Expired { .. })));
        assert!(!ran);
    }

    #[tokio::test(start_paused = true)]
    async fn closed_follows_renewals_and_closing() {
        let f = Fence::new("l");
        let start = Instant::now();
        f.extend(start + Duration::from_secs(3));
        let waiter = tokio::spawn({
            let f = f.clone();
            async move {
                f.closed().await;
                Instant::now()
            }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        f.extend(start + Duration::from_secs(6)); // renewed at 2 s
        let closed_at = waiter.await.unwrap();
        assert_eq!(closed_at - start, Duration::from_secs(6));

        f.extend(Instant::now() + Duration::from_secs(100));
        let waiter = tokio::spawn({
            let f = f.clone();
            async move { f.closed().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        f.close();
        let t = Instant::now();
        waiter.await.unwrap();
        assert_eq!(Instant::now(), t, "closing wakes the waiter at once");
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_fence_never_refuses() {
        let f = Fence::open();
        assert_eq!(f.check(), Ok(None));
        assert_eq!(f.remaining(), None);
        assert_eq!(f.run(async { 1 }).await, Ok(1));
        let closed = tokio::time::timeout(Duration::from_secs(3600), f.closed()).await;
        assert!(closed.is_err());
    }
}
