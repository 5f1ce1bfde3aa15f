//! Leader election with a `coordination.k8s.io/v1` Lease, so that of several replicas one
//! allocates (all serve the webhooks).
//!
//! The leader renews every [`RENEW`]; the lease is held for [`LEASE_SECONDS`] after the last
//! renewal; a standby retries every [`RETRY`], so it takes over at most
//! `LEASE_SECONDS + RETRY` (14 s) after the leader's last renewal. Every write is a replace
//! conditional on the lease's `resourceVersion`: two candidates never both win. A leader
//! that cannot renew before its lease runs out stops ([`Elector::hold`] returns), and the
//! process exits so that it restarts as a standby. On shutdown the leader clears the holder
//! so that a standby takes over at once.
//!
//! kube-rs has no leader election; this is the client-go `leaderelection` protocol reduced
//! to what one Deployment needs (no `preferredHolder`, no `strategy`).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};

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
    pub renew: Duration,
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
}

/// Whether `me` may take (or keep) the lease `spec` at `now`.
pub fn may_lead(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> bool {
    let Some(spec) = spec else { return true };
    match spec.holder_identity.as_deref() {
        None | Some("") => true,
        Some(h) if h == me => true,
        Some(_) => {
            let secs = spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS);
            match &spec.renew_time {
                Some(MicroTime(t)) => t
                    .saturating_add(SignedDuration::from_secs(i64::from(secs)))
                    .is_ok_and(|end| end <= now),
                None => true,
            }
        }
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
    /// Another replica holds the lease now.
    #[error("lost the lease {0} to another replica")]
    Lost(String),
    /// The lease could not be renewed before it ran out.
    #[error("could not renew the lease {lease} for {seconds}s")]
    NotRenewed { lease: String, seconds: u64 },
}

/// One candidate.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    /// This replica's identity.
    pub me: String,
    timings: Timings,
}

impl Elector {
    /// A candidate for the lease `namespace/name`.
    pub fn new(client: kube::Client, namespace: &str, name: &str, me: String) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            me,
            timings: Timings::default(),
        }
    }

    /// The same candidate with other timings.
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }

    /// One attempt to take or renew the lease; true when held now.
    async fn try_once(&self) -> Result<bool, LeaderError> {
        let now = Timestamp::now();
        let what = |source| LeaderError::Kube {
            lease: self.name.clone(),
            source,
        };
        match self.api.get_opt(&self.name).await.map_err(what)? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(next_spec(None, &self.me, now, self.timings.lease_seconds)),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_conflict() => {
                        Ok(false)
                    }
                    Err(e) => Err(what(e)),
                }
            }
            Some(mut lease) => {
                if !may_lead(lease.spec.as_ref(), &self.me, now) {
                    return Ok(false);
                }
                lease.spec = Some(next_spec(
                    lease.spec.as_ref(),
                    &self.me,
                    now,
                    self.timings.lease_seconds,
                ));
                match self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
                    Err(e) => Err(what(e)),
                }
            }
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) {
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

    /// Renews until the lease is lost; returns why.
    pub async fn hold(&self) -> LeaderError {
        let mut last = tokio::time::Instant::now();
        let Timings {
            lease_seconds,
            renew,
            retry,
        } = self.timings;
        let lease = Duration::from_secs(lease_seconds.max(0) as u64);
        loop {
            tokio::time::sleep(renew).await;
            match self.try_once().await {
                Ok(true) => last = tokio::time::Instant::now(),
                Ok(false) => {
                    return LeaderError::Lost(self.name.clone());
                }
                Err(e) => tracing::warn!("renewing the lease: {e}"),
            }
            if last.elapsed() >= lease.saturating_sub(retry) {
                return LeaderError::NotRenewed {
                    lease: self.name.clone(),
                    seconds: last.elapsed().as_secs(),
                };
            }
        }
    }

    /// Gives the lease up (on shutdown), so that a standby takes over at once.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await
            && lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(&self.me)
        {
            if let Some(s) = lease.spec.as_mut() {
                s.holder_identity = None;
            }
            let _ = self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await;
        }
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
    fn who_may_lead() {
        assert!(may_lead(None, "a", at(0)));
        assert!(may_lead(Some(&LeaseSpec::default()), "a", at(0)));
        let b = held_by("b", 100);
        assert!(
            may_lead(Some(&held_by("a", 100)), "a", at(101)),
            "own lease"
        );
        assert!(
            !may_lead(Some(&b), "a", at(100 + i64::from(LEASE_SECONDS) - 1)),
            "still b's"
        );
        assert!(
            may_lead(Some(&b), "a", at(100 + i64::from(LEASE_SECONDS))),
            "expired"
        );
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
}
