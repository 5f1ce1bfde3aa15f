//! Leader election with a `coordination.k8s.io/v1` Lease, so that of several replicas one
//! allocates (all serve the webhooks), and a fence that stops the leader's writes before a
//! standby could take over.
//!
//! * The leader renews every [`RENEW`]; the lease is held for [`LEASE_SECONDS`]; a standby
//!   retries every [`RETRY`]. Every write is a replace conditional on the lease's
//!   `resourceVersion`: two candidates never both win.
//! * Expiry ([`observe`]): a standby takes the lease only when it has read the very same
//!   record (holder, `renewTime`, `resourceVersion`) for one lease of its own monotonic
//!   time. Timestamps written by another replica are never compared with this one's wall
//!   clock, so clock skew between replicas neither lets a standby steal a live lease nor
//!   keeps a dead one. A standby takes over at most `LEASE_SECONDS + RETRY` (14 s) after
//!   the leader's last renewal.
//! * The leader's validity ([`fence`]): the instant its last successful renewal was sent,
//!   plus the lease, less the retry period as a safety margin. [`Elector::hold`] returns
//!   before that deadline passes when it could not renew, and the [`Fence`] refuses writes
//!   from then on. Every lease request has a timeout ([`Timings::request_timeout`]): a hung
//!   API server never keeps `hold` from noticing.
//! * [`Elector::lead`] puts it together for a daemon: wait for the lease (or the stop
//!   signal), run the work while leading, give the lease up on the way out, each step
//!   bounded in time.
//!
//! kube-rs has no leader election; this is the client-go `leaderelection` protocol reduced
//! to what one Deployment needs (no `preferredHolder`, no `strategy`).

pub mod fence;
pub mod observe;
#[cfg(all(test, feature = "testing"))]
mod tests_api;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;

pub use fence::{Fence, Fenced};
pub use observe::Observer;

/// Seconds a lease is valid after its last renewal.
pub const LEASE_SECONDS: i32 = 12;
/// How often the leader renews.
pub const RENEW: Duration = Duration::from_secs(4);
/// How often a standby tries.
pub const RETRY: Duration = Duration::from_secs(2);

/// How long a lease holds and how often the leader renews and a standby retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// Seconds a lease is valid after its last renewal (written into the Lease).
    pub lease_seconds: i32,
    /// How often the leader renews.
    pub renew: Duration,
    /// How often a standby tries; also the leader's safety margin ([`Timings::validity`]).
    pub retry: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease_seconds: LEASE_SECONDS,
            renew: RENEW,
            retry: RETRY,
        }
    }
}

/// Timings that cannot work, named by the flag.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TimingsError {
    #[error("--leader-election-lease-seconds {0}: must be at least 2")]
    Lease(i32),
    #[error(
        "--leader-election-renew-seconds {renew}: must be at least 1 and below the lease's {lease} s less the retry's {retry} s, or the leader gives its lease up before renewing"
    )]
    Renew { renew: u64, lease: i32, retry: u64 },
    #[error(
        "--leader-election-retry-seconds {retry}: must be at least 1 and below the lease's {lease} s"
    )]
    Retry { retry: u64, lease: i32 },
}

impl Timings {
    /// Timings from whole seconds, checked: a leader must renew before `hold` would give up
    /// (`lease - retry`), and a standby retry within a lease.
    pub fn new(
        lease_seconds: i32,
        renew_seconds: u64,
        retry_seconds: u64,
    ) -> Result<Self, TimingsError> {
        if lease_seconds < 2 {
            return Err(TimingsError::Lease(lease_seconds));
        }
        let lease = lease_seconds as u64;
        if retry_seconds == 0 || retry_seconds >= lease {
            return Err(TimingsError::Retry {
                retry: retry_seconds,
                lease: lease_seconds,
            });
        }
        if renew_seconds == 0 || renew_seconds >= lease - retry_seconds {
            return Err(TimingsError::Renew {
                renew: renew_seconds,
                lease: lease_seconds,
                retry: retry_seconds,
            });
        }
        Ok(Self {
            lease_seconds,
            renew: Duration::from_secs(renew_seconds),
            retry: Duration::from_secs(retry_seconds),
        })
    }

    /// The lease as a duration.
    pub fn lease(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.lease_seconds).unwrap_or(0))
    }

    /// How long one lease request (get, create, replace) may take: one renewal period, and
    /// no more than the validity left after it, at least a second. A request still
    /// unanswered then is hung; the next attempt starts afresh.
    pub fn request_timeout(&self) -> Duration {
        self.renew
            .min(self.validity().saturating_sub(self.renew))
            .max(Duration::from_secs(1))
    }

    /// How long after its last successful renewal was sent the leader may still write: the
    /// lease less the retry period, the safety margin (see [`fence`]).
    pub fn validity(&self) -> Duration {
        self.lease().saturating_sub(self.retry)
    }
}

/// The spec `me` writes to take or renew `old` at `now`, valid for `lease_seconds`.
pub fn next_spec(
    old: Option<&LeaseSpec>,
    me: &str,
    now: Timestamp,
    lease_seconds: i32,
) -> LeaseSpec {
    let mine = old.and_then(|s| s.holder_identity.as_deref()) == Some(me);
    let transitions = old.and_then(|s| s.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(lease_seconds),
        acquire_time: if mine {
            old.and_then(|s| s.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if mine || old.is_none() {
            transitions
        } else {
            transitions + 1
        }),
        ..Default::default()
    }
}

/// Why leading stopped, or an attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// A read or write of the lease failed.
    #[error("Lease {lease}: {source}")]
    Kube {
        lease: String,
        #[source]
        source: kube::Error,
    },
    /// A read or write of the lease got no answer in time.
    #[error("Lease {lease}: no answer from the API server within {seconds}s")]
    TimedOut { lease: String, seconds: u64 },
    /// Another replica holds the lease now.
    #[error("lost the lease {0} to another replica")]
    Lost(String),
    /// The lease could not be renewed before it ran out.
    #[error("could not renew the lease {lease} for {seconds}s")]
    NotRenewed { lease: String, seconds: u64 },
}

/// The wall clock an elector writes into the lease (`acquireTime`, `renewTime`). Only
/// written, for people and other tools to read; expiry is judged by the monotonic clock.
/// Tests replace it to skew one replica's clock.
pub type WallClock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// How [`Elector::lead`] ended.
#[derive(Debug)]
pub enum Led<T> {
    /// The stop signal came (as standby or leader); the lease was given up if held.
    Stopped,
    /// The work ended on its own while leading.
    Done(T),
    /// Leading stopped: the lease was lost or not renewed in time.
    Lost(LeaderError),
}

/// One candidate.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    /// This replica's identity.
    pub me: String,
    timings: Timings,
    observer: Observer,
    fence: Fence,
    clock: WallClock,
}

impl Elector {
    /// A candidate for the lease `namespace/name`.
    pub fn new(client: kube::Client, namespace: &str, name: &str, me: String) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            me,
            timings: Timings::default(),
            observer: Observer::new(),
            fence: Fence::new(&format!("{namespace}/{name}")),
            clock: Arc::new(Timestamp::now),
        }
    }

    /// The same candidate with other timings.
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }

    /// The same candidate writing the time of `clock` into the lease.
    pub fn with_clock(mut self, clock: WallClock) -> Self {
        self.clock = clock;
        self
    }

    /// The fence of this candidate's leadership, for its writers.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// `request`, cut off after [`Timings::request_timeout`].
    async fn bounded<T>(
        &self,
        request: impl Future<Output = kube::Result<T>>,
    ) -> Result<kube::Result<T>, LeaderError> {
        let limit = self.timings.request_timeout();
        tokio::time::timeout(limit, request)
            .await
            .map_err(|_| LeaderError::TimedOut {
                lease: self.name.clone(),
                seconds: limit.as_secs(),
            })
    }

    /// One attempt to take or renew the lease; true when held now, and then the fence
    /// extended from the instant the attempt began.
    async fn try_once(&mut self) -> Result<bool, LeaderError> {
        let sent = Instant::now();
        let held = self.attempt().await?;
        if held {
            self.fence.extend(sent + self.timings.validity());
        }
        Ok(held)
    }

    /// Reads the lease, and takes or renews it when this replica may.
    async fn attempt(&mut self) -> Result<bool, LeaderError> {
        let what = |source| LeaderError::Kube {
            lease: self.name.clone(),
            source,
        };
        let now = (self.clock)();
        let read = self.bounded(self.api.get_opt(&self.name)).await?;
        let Some(mut lease) = read.map_err(what)? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(next_spec(None, &self.me, now, self.timings.lease_seconds)),
            };
            return match self
                .bounded(self.api.create(&PostParams::default(), &lease))
                .await?
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_conflict() => Ok(false),
                Err(e) => Err(what(e)),
            };
        };
        if !self
            .observer
            .may_lead(Some(&lease), &self.me, Instant::now())
        {
            return Ok(false);
        }
        lease.spec = Some(next_spec(
            lease.spec.as_ref(),
            &self.me,
            now,
            self.timings.lease_seconds,
        ));
        match self
            .bounded(self.api.replace(&self.name, &PostParams::default(), &lease))
            .await?
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(what(e)),
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&mut self) {
        let mut waiting_logged = false;
        loop {
            match self.try_once().await {
                Ok(true) => {
                    tracing::info!(identity = %self.me, lease = %self.name, "leader");
                    return;
                }
                Ok(false) if !waiting_logged => {
                    tracing::info!(identity = %self.me, lease = %self.name, "standby: another replica leads");
                    waiting_logged = true;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("leader election: {e}"),
            }
            tokio::time::sleep(self.timings.retry).await;
        }
    }

    /// Renews until the lease is lost or could not be renewed in time; returns why, with
    /// the fence closed. Returns before the fence's deadline passes: an attempt still
    /// under way then is dropped.
    pub async fn hold(&mut self) -> LeaderError {
        let e = self.renew_until_lost().await;
        self.fence.close();
        e
    }

    async fn renew_until_lost(&mut self) -> LeaderError {
        let fence = self.fence.clone();
        let not_renewed = |fence: &Fence, name: &str, validity: Duration| {
            let left = fence.remaining().unwrap_or_default();
            LeaderError::NotRenewed {
                lease: name.to_owned(),
                seconds: validity.saturating_sub(left).as_secs(),
            }
        };
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.timings.renew) => {}
                () = fence.closed() => {
                    return not_renewed(&fence, &self.name, self.timings.validity());
                }
            }
            let attempt = tokio::select! {
                r = self.try_once() => r,
                () = fence.closed() => {
                    return not_renewed(&fence, &self.name, self.timings.validity());
                }
            };
            match attempt {
                Ok(true) => {}
                Ok(false) => return LeaderError::Lost(self.name.clone()),
                Err(e) => tracing::warn!("renewing the lease: {e}"),
            }
        }
    }

    /// Gives the lease up (on shutdown), so that a standby takes over at once; each request
    /// bounded by [`Timings::request_timeout`]. Closes the fence first.
    pub async fn release(&mut self) {
        self.fence.close();
        let Ok(Ok(Some(mut lease))) = self.bounded(self.api.get_opt(&self.name)).await else {
            return;
        };
        if lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            != Some(&self.me)
        {
            return;
        }
        if let Some(s) = lease.spec.as_mut() {
            s.holder_identity = None;
        }
        match self
            .bounded(self.api.replace(&self.name, &PostParams::default(), &lease))
            .await
        {
            Ok(Ok(_)) => tracing::info!(lease = %self.name, "lease given up"),
            Ok(Err(e)) => tracing::warn!(lease = %self.name, "giving the lease up: {e}"),
            Err(e) => tracing::warn!("giving the lease up: {e}"),
        }
    }

    /// Runs `work` while this replica leads: waits for the lease (until `stop`), then runs
    /// `work` until it ends, the lease is lost or `stop` completes, then gives the lease up.
    /// `work` is not polled before the lease is held; it writes through [`Elector::fence`].
    /// Every step is bounded: a hung API server delays the return after `stop` by at most
    /// two request timeouts (the release's get and replace).
    pub async fn lead<T>(
        &mut self,
        stop: impl Future<Output = ()>,
        work: impl Future<Output = T>,
    ) -> Led<T> {
        let mut stop = std::pin::pin!(stop);
        tokio::select! {
            () = self.acquire() => {}
            () = &mut stop => return Led::Stopped,
        }
        let led = tokio::select! {
            t = work => Led::Done(t),
            e = self.hold() => Led::Lost(e),
            () = &mut stop => Led::Stopped,
        };
        self.release().await;
        led
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn held_by(who: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(who.into()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(MicroTime(at(renewed))),
            acquire_time: Some(MicroTime(at(0))),
            lease_transitions: Some(3),
            ..Default::default()
        }
    }

    #[test]
    fn takeover_counts_a_transition_renewal_does_not() {
        let renewed = next_spec(Some(&held_by("a", 100)), "a", at(104), LEASE_SECONDS);
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(0))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(104))));
        let taken = next_spec(Some(&held_by("b", 100)), "a", at(120), LEASE_SECONDS);
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(120))));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        assert_eq!(
            next_spec(None, "a", at(1), LEASE_SECONDS).lease_transitions,
            Some(0)
        );
        assert_eq!(
            next_spec(None, "a", at(1), 30).lease_duration_seconds,
            Some(30)
        );
    }

    #[test]
    fn timings_that_cannot_work_are_refused() {
        assert_eq!(Timings::new(12, 4, 2), Ok(Timings::default()));
        assert_eq!(Timings::new(1, 1, 1), Err(TimingsError::Lease(1)));
        assert!(matches!(
            Timings::new(12, 4, 12),
            Err(TimingsError::Retry { .. })
        ));
        assert!(matches!(
            Timings::new(12, 4, 0),
            Err(TimingsError::Retry { .. })
        ));
        // renewing at or after lease - retry: hold() would give the lease up first
        assert!(matches!(
            Timings::new(12, 10, 2),
            Err(TimingsError::Renew { .. })
        ));
        assert!(matches!(
            Timings::new(12, 0, 2),
            Err(TimingsError::Renew { .. })
        ));
        let e = Timings::new(12, 10, 2).unwrap_err().to_string();
        assert!(e.starts_with("--leader-election-renew-seconds 10:"), "{e}");
        assert!(Timings::new(30, 10, 5).is_ok());
    }

    #[test]
    fn the_leader_writes_no_longer_than_the_lease_less_the_margin() {
        let t = Timings::default();
        assert_eq!(t.validity(), Duration::from_secs(10));
        assert_eq!(t.request_timeout(), RENEW);
        // every renewal is due, and its request over, before the validity runs out
        assert!(t.renew + t.request_timeout() < t.validity());
    }
}
