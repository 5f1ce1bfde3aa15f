//! How a standby judges that another replica's lease ran out: by its own monotonic clock,
//! never by comparing the holder's `renewTime` with its own wall clock.
//!
//! The standby remembers the record it last read (holder, `renewTime`, `resourceVersion`)
//! and the local [`Instant`] it first saw that record. The lease has expired only when the
//! same record has stayed unchanged for the lease's `leaseDurationSeconds` of local time. A
//! holder that keeps renewing changes the record each time, so it is respected whatever its
//! clock says; a holder that stopped is taken over one lease after the standby first saw
//! its last record, whatever the timestamps in it. This is how client-go's
//! `leaderelection` judges expiry (its `observedTime`).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::time::{Duration, Instant};

use super::LEASE_SECONDS;

/// What identifies one renewal of a lease: any change means the holder is alive.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: String,
    renew_time: Option<Timestamp>,
    resource_version: Option<String>,
}

/// A standby's memory of the lease it reads: the last record and when it was first seen.
#[derive(Debug, Default)]
pub struct Observer {
    seen: Option<(Record, Instant)>,
}

impl Observer {
    /// An observer that has seen nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `me` may take (or keep) `lease`, read at the local instant `now`.
    ///
    /// Free (no lease, no holder, an empty holder) or held by `me`: yes. Held by another:
    /// only when this observer has seen the very same record for at least the lease's
    /// `leaseDurationSeconds` ([`LEASE_SECONDS`] when absent) up to `now`.
    pub fn may_lead(&mut self, lease: Option<&Lease>, me: &str, now: Instant) -> bool {
        let spec = lease.and_then(|l| l.spec.as_ref());
        let holder = spec.and_then(|s| s.holder_identity.as_deref());
        let holder = match holder {
            None | Some("") => {
                self.seen = None;
                return true;
            }
            Some(h) if h == me => {
                self.seen = None;
                return true;
            }
            Some(h) => h,
        };
        let record = Record {
            holder: holder.to_owned(),
            renew_time: spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|MicroTime(t)| *t),
            resource_version: lease.and_then(|l| l.metadata.resource_version.clone()),
        };
        let first_seen = match &self.seen {
            Some((r, at)) if *r == record => *at,
            _ => {
                self.seen = Some((record, now));
                now
            }
        };
        now.saturating_duration_since(first_seen) >= duration_of(spec)
    }
}

/// The lease's `leaseDurationSeconds` as a duration ([`LEASE_SECONDS`] when absent; a
/// negative value counts as 0).
fn duration_of(spec: Option<&LeaseSpec>) -> Duration {
    let secs = spec
        .and_then(|s| s.lease_duration_seconds)
        .unwrap_or(LEASE_SECONDS);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::SignedDuration;

    const LEASE: Duration = Duration::from_secs(LEASE_SECONDS as u64);

    /// A lease held by `who`, renewed at `renewed` (wall clock), at `rv`.
    fn held(who: &str, renewed: Timestamp, rv: u64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(rv.to_string()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(who.into()),
                lease_duration_seconds: Some(LEASE_SECONDS),
                renew_time: Some(MicroTime(renewed)),
                ..Default::default()
            }),
        }
    }

    fn wall(offset_secs: i64) -> Timestamp {
        Timestamp::now()
            .checked_add(SignedDuration::from_secs(offset_secs))
            .unwrap()
    }

    #[test]
    fn free_or_own_leases_may_be_taken_at_once() {
        let now = Instant::now();
        let mut o = Observer::new();
        assert!(o.may_lead(None, "a", now));
        assert!(o.may_lead(Some(&Lease::default()), "a", now));
        let mut released = held("b", wall(0), 1);
        released.spec.as_mut().unwrap().holder_identity = Some(String::new());
        assert!(o.may_lead(Some(&released), "a", now));
        assert!(o.may_lead(Some(&held("a", wall(0), 1)), "a", now));
    }

    /// The holder's clock an hour behind or ahead: its lease holds while it renews, whatever
    /// the timestamps say (the old wall-clock comparison took the first at once and
    /// respected the second for an hour).
    #[test]
    fn a_renewing_holder_is_respected_whatever_its_clock_says() {
        for skew in [-3600, 3600, 0] {
            let mut o = Observer::new();
            let start = Instant::now();
            // 100 renewals, one every 4 s: 400 s, far past one lease
            for i in 0..100u64 {
                let now = start + Duration::from_secs(4 * i);
                let lease = held("b", wall(skew + 4 * i as i64), i + 1);
                assert!(
                    !o.may_lead(Some(&lease), "a", now),
                    "skew {skew}, renewal {i}"
                );
            }
        }
    }

    #[test]
    fn an_unchanged_record_expires_after_one_lease_of_local_time() {
        for skew in [-3600, 3600, 0] {
            let mut o = Observer::new();
            let lease = held("b", wall(skew), 7);
            let start = Instant::now();
            assert!(!o.may_lead(Some(&lease), "a", start), "first sight");
            assert!(!o.may_lead(Some(&lease), "a", start + LEASE - Duration::from_millis(1)));
            assert!(o.may_lead(Some(&lease), "a", start + LEASE), "skew {skew}");
        }
    }

    #[test]
    fn any_change_of_the_record_restarts_the_wait() {
        let mut o = Observer::new();
        let start = Instant::now();
        let t = wall(0);
        assert!(!o.may_lead(Some(&held("b", t, 1)), "a", start));
        // same renewTime, new resourceVersion (an update the holder made): alive
        let later = start + LEASE - Duration::from_secs(1);
        assert!(!o.may_lead(Some(&held("b", t, 2)), "a", later));
        assert!(!o.may_lead(Some(&held("b", t, 2)), "a", start + LEASE));
        // another holder: alive too
        assert!(!o.may_lead(Some(&held("c", t, 2)), "a", later + LEASE));
        assert!(o.may_lead(Some(&held("c", t, 2)), "a", later + LEASE + LEASE));
    }

    #[test]
    fn the_holders_lease_duration_counts() {
        let mut o = Observer::new();
        let mut lease = held("b", wall(0), 1);
        lease.spec.as_mut().unwrap().lease_duration_seconds = Some(30);
        let start = Instant::now();
        assert!(!o.may_lead(Some(&lease), "a", start));
        assert!(!o.may_lead(Some(&lease), "a", start + LEASE));
        assert!(o.may_lead(Some(&lease), "a", start + Duration::from_secs(30)));
    }
}
