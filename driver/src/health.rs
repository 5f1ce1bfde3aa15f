//! Device health: what a check found wrong with a GPU ([`Fault`]), how bad it is under the
//! admin's policy ([`HealthPolicy`]), and the per-GPU state machine ([`HealthTracker`]) that
//! turns a stream of checks into transitions.
//!
//! The rules, in one place:
//!
//! * A fault the policy ignores (application XIDs such as 13, 31, 43, 45, 68) changes nothing.
//! * Any other fault makes the GPU unhealthy at once: [`Severity::Fatal`] for a lost GPU,
//!   a double-bit ECC error and the XIDs listed as fatal (48, 79, 95 … by default),
//!   [`Severity::Degraded`] for the rest (other XIDs, pages pending retirement, a
//!   temperature near the shutdown limit). A worse fault while unhealthy escalates.
//! * Recovery is never sticky and never hasty: an unhealthy GPU becomes healthy again after
//!   `recovery_checks` consecutive checks that found nothing (any fault restarts the count).
//!
//! Pure: the caller passes the time of each check, so tests inject the clock.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::SystemTime;

/// One thing a health check found wrong with a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// An XID error the driver reported (NVML's critical-XID event).
    Xid(u32),
    /// An uncorrectable (double-bit) ECC error.
    DoubleBitEcc,
    /// The GPU no longer answers or is no longer enumerated (fallen off the bus).
    Lost(String),
    /// Memory pages wait for retirement (a reset is needed before they are retired).
    RetiredPagesPending,
    /// The temperature is within the margin below the shutdown limit.
    Temperature {
        /// The GPU's temperature, °C.
        celsius: u32,
        /// The driver's shutdown temperature, °C.
        shutdown: u32,
    },
    /// A probe failed in a way that says nothing more specific.
    Probe(String),
}

impl Fault {
    /// Reads a fault from the words the fake backend and `Health::Unhealthy` reasons use:
    /// `xid 79` (any case, optional `:` and text after), `ecc`, `lost`, `retired-pages`,
    /// `temperature 95`; anything else is a [`Fault::Probe`] with the text as its detail.
    pub fn parse(text: &str) -> Fault {
        let text = text.trim();
        let lower = text.to_ascii_lowercase();
        let mut words = lower
            .split(|c: char| c.is_whitespace() || c == ':')
            .filter(|w| !w.is_empty());
        let first = words.next().unwrap_or("");
        let number = || -> Option<u32> {
            lower
                .split_whitespace()
                .nth(1)?
                .trim_end_matches(':')
                .parse()
                .ok()
        };
        match first {
            "xid" => match number() {
                Some(n) => Fault::Xid(n),
                None => Fault::Probe(text.to_owned()),
            },
            "ecc" => Fault::DoubleBitEcc,
            "lost" => Fault::Lost(text.to_owned()),
            "retired-pages" => Fault::RetiredPagesPending,
            "temperature" => match number() {
                Some(celsius) => Fault::Temperature {
                    celsius,
                    shutdown: celsius,
                },
                None => Fault::Probe(text.to_owned()),
            },
            _ => Fault::Probe(text.to_owned()),
        }
    }

    /// A short label-value form for the device taint's value: `xid-79`, `ecc-double-bit`,
    /// `lost`, `retired-pages`, `temperature`, `probe-failed`.
    pub fn slug(&self) -> String {
        match self {
            Fault::Xid(n) => format!("xid-{n}"),
            Fault::DoubleBitEcc => "ecc-double-bit".into(),
            Fault::Lost(_) => "lost".into(),
            Fault::RetiredPagesPending => "retired-pages".into(),
            Fault::Temperature { .. } => "temperature".into(),
            Fault::Probe(_) => "probe-failed".into(),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Xid(n) => write!(f, "XID {n}"),
            Fault::DoubleBitEcc => f.write_str("double-bit ECC error"),
            Fault::Lost(detail) if detail.is_empty() => f.write_str("GPU lost"),
            Fault::Lost(detail) => write!(f, "GPU lost: {detail}"),
            Fault::RetiredPagesPending => f.write_str("memory pages pending retirement"),
            Fault::Temperature { celsius, shutdown } => {
                write!(f, "temperature {celsius} °C (shutdown at {shutdown} °C)")
            }
            Fault::Probe(detail) => write!(f, "health probe failed: {detail}"),
        }
    }
}

/// How bad an unhealthy GPU is. Ordered: `Degraded < Fatal`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Still running, but nothing new should be placed on it.
    Degraded,
    /// Its work is lost or wrong: nothing should run on it.
    Fatal,
}

impl Severity {
    /// `degraded` or `fatal`, for metrics and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Degraded => "degraded",
            Severity::Fatal => "fatal",
        }
    }
}

/// XIDs caused by applications (illegal address, page fault in a kernel, a reset channel
/// …), not by the device: ignored by default. NVIDIA's XID catalogue lists 13 (graphics
/// engine exception), 31 (GPU memory page fault), 43 (GPU stopped processing, a user
/// application fault), 45 (preemptive cleanup after an application error) and 68 (video
/// processor exception) as application-induced.
pub const DEFAULT_IGNORED_XIDS: [u32; 5] = [13, 31, 43, 45, 68];

/// XIDs after which the GPU's work cannot be trusted: 48 (double-bit ECC), 62 (internal
/// micro-controller halt), 64 (ECC page retirement or row remapping failure), 74 (NVLink
/// error), 79 (fallen off the bus), 95 (uncontained ECC error), 119 and 120 (GSP errors).
pub const DEFAULT_FATAL_XIDS: [u32; 8] = [48, 62, 64, 74, 79, 95, 119, 120];

/// The admin's health policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthPolicy {
    /// XIDs that are not device faults.
    pub ignored_xids: BTreeSet<u32>,
    /// XIDs that make a GPU [`Severity::Fatal`]; other XIDs degrade it.
    pub fatal_xids: BTreeSet<u32>,
    /// Consecutive clean checks before an unhealthy GPU is healthy again (at least 1).
    pub recovery_checks: u32,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            ignored_xids: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            fatal_xids: DEFAULT_FATAL_XIDS.into_iter().collect(),
            recovery_checks: 3,
        }
    }
}

impl HealthPolicy {
    /// How bad `fault` is; `None` if the policy ignores it.
    pub fn classify(&self, fault: &Fault) -> Option<Severity> {
        match fault {
            Fault::Xid(n) if self.ignored_xids.contains(n) => None,
            Fault::Xid(n) if self.fatal_xids.contains(n) => Some(Severity::Fatal),
            Fault::Xid(_) => Some(Severity::Degraded),
            Fault::DoubleBitEcc | Fault::Lost(_) => Some(Severity::Fatal),
            Fault::RetiredPagesPending | Fault::Temperature { .. } | Fault::Probe(_) => {
                Some(Severity::Degraded)
            }
        }
    }
}

/// What the tracker holds for one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// Usable.
    Healthy,
    /// Not usable for new work (and, when fatal, for running work).
    Unhealthy(Unhealthy),
}

impl Condition {
    /// Whether this is [`Condition::Healthy`].
    pub fn is_healthy(&self) -> bool {
        matches!(self, Condition::Healthy)
    }

    /// `healthy`, `degraded` or `fatal`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Condition::Healthy => "healthy",
            Condition::Unhealthy(u) => u.severity.as_str(),
        }
    }
}

/// Why and since when a GPU is unhealthy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    /// The worst fault seen since the GPU turned unhealthy.
    pub fault: Fault,
    /// Its severity under the policy.
    pub severity: Severity,
    /// When the GPU turned unhealthy (or escalated to this severity).
    pub since: SystemTime,
    /// Clean checks in a row since the last fault.
    pub clean_checks: u32,
}

/// A change of a GPU's condition, to be told (an Event, a metric, a taint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The GPU.
    pub uuid: String,
    /// Its condition before.
    pub from: Condition,
    /// Its condition now.
    pub to: Condition,
}

impl Transition {
    /// One line for logs and Events: `unhealthy (fatal): XID 79`, `healthy again after 3
    /// clean checks`, `degraded -> fatal: double-bit ECC error`.
    pub fn message(&self, recovery_checks: u32) -> String {
        match (&self.from, &self.to) {
            (_, Condition::Healthy) => {
                format!("healthy again after {recovery_checks} clean checks in a row")
            }
            (Condition::Healthy, Condition::Unhealthy(u)) => {
                format!("unhealthy ({}): {}", u.severity.as_str(), u.fault)
            }
            (Condition::Unhealthy(a), Condition::Unhealthy(b)) => {
                format!(
                    "{} -> {}: {}",
                    a.severity.as_str(),
                    b.severity.as_str(),
                    b.fault
                )
            }
        }
    }
}

/// Per-GPU health state machine.
#[derive(Clone, Debug)]
pub struct HealthTracker {
    policy: HealthPolicy,
    gpus: BTreeMap<String, Condition>,
}

impl HealthTracker {
    /// A tracker under `policy`; every GPU starts healthy when first seen.
    pub fn new(mut policy: HealthPolicy) -> Self {
        policy.recovery_checks = policy.recovery_checks.max(1);
        Self {
            policy,
            gpus: BTreeMap::new(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &HealthPolicy {
        &self.policy
    }

    /// The condition of `uuid` (healthy if never seen).
    pub fn condition(&self, uuid: &str) -> Condition {
        self.gpus.get(uuid).cloned().unwrap_or(Condition::Healthy)
    }

    /// Every GPU seen, with its condition.
    pub fn conditions(&self) -> impl Iterator<Item = (&str, &Condition)> {
        self.gpus.iter().map(|(u, c)| (u.as_str(), c))
    }

    /// Records one check of `uuid` at `now` that found `faults` (empty: a clean check).
    /// Returns the transition, if the condition changed.
    pub fn observe(&mut self, uuid: &str, faults: &[Fault], now: SystemTime) -> Option<Transition> {
        let worst = faults
            .iter()
            .filter_map(|f| self.policy.classify(f).map(|s| (s, f)))
            .max_by_key(|(s, _)| *s);
        let before = self.condition(uuid);
        let after = match (&before, worst) {
            (Condition::Healthy, None) => Condition::Healthy,
            (Condition::Healthy, Some((severity, fault))) => Condition::Unhealthy(Unhealthy {
                fault: fault.clone(),
                severity,
                since: now,
                clean_checks: 0,
            }),
            (Condition::Unhealthy(u), None) => {
                let clean_checks = u.clean_checks + 1;
                if clean_checks >= self.policy.recovery_checks {
                    Condition::Healthy
                } else {
                    Condition::Unhealthy(Unhealthy {
                        clean_checks,
                        ..u.clone()
                    })
                }
            }
            (Condition::Unhealthy(u), Some((severity, fault))) if severity > u.severity => {
                Condition::Unhealthy(Unhealthy {
                    fault: fault.clone(),
                    severity,
                    since: now,
                    clean_checks: 0,
                })
            }
            (Condition::Unhealthy(u), Some(_)) => Condition::Unhealthy(Unhealthy {
                clean_checks: 0,
                ..u.clone()
            }),
        };
        self.gpus.insert(uuid.to_owned(), after.clone());
        let changed = match (&before, &after) {
            (Condition::Healthy, Condition::Healthy) => false,
            (Condition::Unhealthy(a), Condition::Unhealthy(b)) => a.severity != b.severity,
            _ => true,
        };
        changed.then(|| Transition {
            uuid: uuid.to_owned(),
            from: before,
            to: after,
        })
    }

    /// Forgets GPUs not in `present` (removed from the node for good).
    pub fn retain(&mut self, present: &BTreeSet<String>) {
        self.gpus.retain(|u, _| present.contains(u));
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    fn tracker(recovery: u32) -> HealthTracker {
        HealthTracker::new(HealthPolicy {
            recovery_checks: recovery,
            ..HealthPolicy::default()
        })
    }

    #[test]
    fn parses_the_fake_words_and_free_text() {
        assert_eq!(
            Fault::parse("XID 79: GPU has fallen off the bus"),
            Fault::Xid(79)
        );
        assert_eq!(Fault::parse("xid 48"), Fault::Xid(48));
        assert_eq!(Fault::parse("ecc double-bit"), Fault::DoubleBitEcc);
        assert_eq!(Fault::parse("lost"), Fault::Lost("lost".into()));
        assert_eq!(Fault::parse("retired-pages"), Fault::RetiredPagesPending);
        assert!(matches!(
            Fault::parse("temperature 97"),
            Fault::Temperature { celsius: 97, .. }
        ));
        assert_eq!(Fault::parse("xid"), Fault::Probe("xid".into()));
        assert_eq!(
            Fault::parse("NVML says no"),
            Fault::Probe("NVML says no".into())
        );
        assert_eq!(Fault::Xid(79).slug(), "xid-79");
    }

    #[test]
    fn classifies_by_policy() {
        let p = HealthPolicy::default();
        for xid in DEFAULT_IGNORED_XIDS {
            assert_eq!(p.classify(&Fault::Xid(xid)), None, "XID {xid}");
        }
        assert_eq!(p.classify(&Fault::Xid(79)), Some(Severity::Fatal));
        assert_eq!(p.classify(&Fault::Xid(92)), Some(Severity::Degraded));
        assert_eq!(p.classify(&Fault::DoubleBitEcc), Some(Severity::Fatal));
        assert_eq!(
            p.classify(&Fault::Lost(String::new())),
            Some(Severity::Fatal)
        );
        assert_eq!(
            p.classify(&Fault::RetiredPagesPending),
            Some(Severity::Degraded)
        );
        let custom = HealthPolicy {
            ignored_xids: [79].into(),
            ..HealthPolicy::default()
        };
        assert_eq!(
            custom.classify(&Fault::Xid(79)),
            None,
            "the admin's list wins"
        );
    }

    #[test]
    fn an_ignored_xid_changes_nothing() {
        let mut t = tracker(3);
        assert_eq!(
            t.observe("g", &[Fault::Xid(13), Fault::Xid(43)], at(1)),
            None
        );
        assert!(t.condition("g").is_healthy());
    }

    #[test]
    fn a_fault_turns_unhealthy_at_once_and_recovery_needs_n_clean_checks() {
        let mut t = tracker(3);
        let tr = t
            .observe("g", &[Fault::Xid(79)], at(10))
            .expect("transition");
        assert!(tr.from.is_healthy());
        let Condition::Unhealthy(u) = &tr.to else {
            panic!("{tr:?}")
        };
        assert_eq!((u.severity, u.since), (Severity::Fatal, at(10)));
        assert_eq!(tr.message(3), "unhealthy (fatal): XID 79");
        // Two clean checks: still unhealthy, no transition.
        assert_eq!(t.observe("g", &[], at(11)), None);
        assert_eq!(t.observe("g", &[], at(12)), None);
        assert!(!t.condition("g").is_healthy());
        // A fault restarts the count.
        assert_eq!(t.observe("g", &[Fault::Xid(79)], at(13)), None);
        assert_eq!(t.observe("g", &[], at(14)), None);
        assert_eq!(t.observe("g", &[], at(15)), None);
        let back = t.observe("g", &[], at(16)).expect("recovered");
        assert!(back.to.is_healthy());
        assert_eq!(
            back.message(3),
            "healthy again after 3 clean checks in a row"
        );
        // The time it turned unhealthy is kept while the fault repeats.
        let _ = t
            .observe("g", &[Fault::Xid(31), Fault::Xid(92)], at(20))
            .unwrap();
        let _ = t.observe("g", &[Fault::Xid(92)], at(21));
        let Condition::Unhealthy(u) = t.condition("g") else {
            panic!()
        };
        assert_eq!((u.since, u.severity), (at(20), Severity::Degraded));
    }

    #[test]
    fn a_worse_fault_escalates_a_lesser_one_does_not_downgrade() {
        let mut t = tracker(2);
        t.observe("g", &[Fault::RetiredPagesPending], at(1))
            .unwrap();
        let up = t
            .observe("g", &[Fault::DoubleBitEcc], at(2))
            .expect("escalation");
        assert_eq!(up.message(2), "degraded -> fatal: double-bit ECC error");
        assert_eq!(t.observe("g", &[Fault::RetiredPagesPending], at(3)), None);
        assert_eq!(t.condition("g").as_str(), "fatal");
    }

    #[test]
    fn gpus_are_independent_and_forgotten_when_gone() {
        let mut t = tracker(1);
        t.observe("a", &[Fault::Xid(79)], at(1)).unwrap();
        assert_eq!(t.observe("b", &[], at(1)), None);
        assert!(t.condition("b").is_healthy());
        assert!(
            t.observe("a", &[], at(2)).unwrap().to.is_healthy(),
            "recovery 1"
        );
        t.observe("a", &[Fault::Xid(79)], at(3)).unwrap();
        t.retain(&["b".to_owned()].into());
        assert!(t.condition("a").is_healthy(), "forgotten");
        assert_eq!(t.conditions().count(), 1);
    }

    #[test]
    fn recovery_of_zero_means_one() {
        let mut t = tracker(0);
        t.observe("g", &[Fault::Xid(79)], at(1)).unwrap();
        assert!(t.observe("g", &[], at(2)).unwrap().to.is_healthy());
    }
}
