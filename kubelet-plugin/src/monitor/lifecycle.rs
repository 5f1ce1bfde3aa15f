//! What happened to the node's claims between two monitor passes, as lifecycle Events.
//!
//! From one pass to the next (pure: [`Lifecycle::step`]):
//! * a claim prepared since the last pass: `GpuClaimPrepared` on the claim; one no longer
//!   prepared: `GpuClaimUnprepared`;
//! * a container seen on a claim's GPU for the first time: `GpuContainerStarted` on its
//!   pod; one whose processes are all gone: `GpuContainerExited`;
//! * the shim's count of allocations refused past the grant went up:
//!   `GpuAllocationRefused` on the claim's pods, at most once per claim per `repeat`
//!   (the count since the last Event in the note).
//!
//! The first pass only learns what is there (a restarted plugin does not announce every
//! claim again). Each happening is also logged as one line (JSON with `--log-format json`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::attribute::{Attribution, PodRef};

/// One thing that happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Happening {
    /// A claim was prepared on the node.
    Prepared(ClaimId),
    /// A claim was unprepared.
    Unprepared(ClaimId),
    /// A container's first process on a claim's GPU.
    ContainerStarted(ContainerOnGpu),
    /// A container's last process on a claim's GPU is gone.
    ContainerExited(ContainerOnGpu),
    /// The shim refused allocations of the claim past its grant.
    Refused {
        /// The claim.
        claim: ClaimId,
        /// The GPU.
        gpu_uuid: String,
        /// Refusals since the last Event about it.
        count: u64,
        /// The pods the claim serves.
        pods: Vec<PodRef>,
    },
}

/// A claim.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimId {
    /// UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// A container on one claim's GPU.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ContainerOnGpu {
    /// The claim.
    pub claim: ClaimId,
    /// The GPU.
    pub gpu_uuid: String,
    /// Its pod.
    pub pod: PodKey,
    /// The container's runtime id.
    pub container_id: String,
}

/// A pod, ordered (for sets).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl Happening {
    /// The Event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Prepared(_) => "GpuClaimPrepared",
            Self::Unprepared(_) => "GpuClaimUnprepared",
            Self::ContainerStarted(_) => "GpuContainerStarted",
            Self::ContainerExited(_) => "GpuContainerExited",
            Self::Refused { .. } => "GpuAllocationRefused",
        }
    }

    /// The Event's note.
    pub fn note(&self) -> String {
        match self {
            Self::Prepared(c) => format!("claim {}/{} prepared on this node", c.namespace, c.name),
            Self::Unprepared(c) => format!("claim {}/{} unprepared", c.namespace, c.name),
            Self::ContainerStarted(x) => x.note("started on"),
            Self::ContainerExited(x) => x.note("has no process left on"),
            Self::Refused {
                claim,
                gpu_uuid,
                count,
                ..
            } => format!(
                "{count} device memory allocation(s) on GPU {gpu_uuid} refused: claim {}/{} has used up its grant",
                claim.namespace, claim.name
            ),
        }
    }
}

impl ContainerOnGpu {
    fn note(&self, what: &str) -> String {
        format!(
            "container {} of pod {} {what} GPU {} (claim {})",
            short(&self.container_id),
            self.pod.name,
            self.gpu_uuid,
            self.claim.name
        )
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// What the last pass saw.
#[derive(Debug, Default)]
pub struct Lifecycle {
    started: bool,
    claims: BTreeMap<String, ClaimId>,
    containers: BTreeSet<ContainerOnGpu>,
    /// Per (claim UID, GPU): the refusal total last told, and when.
    refusals: HashMap<(String, String), (u64, Option<Instant>)>,
}

impl Lifecycle {
    /// The happenings between the last pass and this one: `usage` is this pass's view,
    /// `refusals` the shim's refusal totals per (claim UID, GPU).
    pub fn step(
        &mut self,
        usage: &Attribution,
        pods: &HashMap<String, Vec<PodRef>>,
        refusals: &HashMap<(String, String), u64>,
        now: Instant,
        repeat: Duration,
    ) -> Vec<Happening> {
        let claims: BTreeMap<String, ClaimId> = usage
            .claims
            .iter()
            .map(|c| {
                (
                    c.uid.clone(),
                    ClaimId {
                        uid: c.uid.clone(),
                        namespace: c.namespace.clone(),
                        name: c.name.clone(),
                    },
                )
            })
            .collect();
        let mut containers = BTreeSet::new();
        for c in &usage.claims {
            for g in &c.gpus {
                for p in &g.processes {
                    containers.insert(ContainerOnGpu {
                        claim: claims[&c.uid].clone(),
                        gpu_uuid: g.grant.gpu_uuid.clone(),
                        pod: PodKey {
                            namespace: p.pod.namespace.clone(),
                            name: p.pod.name.clone(),
                            uid: p.pod.uid.clone(),
                        },
                        container_id: p.container_id.clone(),
                    });
                }
            }
        }
        let mut out = Vec::new();
        if self.started {
            for (uid, c) in &claims {
                if !self.claims.contains_key(uid) {
                    out.push(Happening::Prepared(c.clone()));
                }
            }
            for x in containers.difference(&self.containers) {
                out.push(Happening::ContainerStarted(x.clone()));
            }
            for x in self.containers.difference(&containers) {
                out.push(Happening::ContainerExited(x.clone()));
            }
            for (uid, c) in &self.claims {
                if !claims.contains_key(uid) {
                    out.push(Happening::Unprepared(c.clone()));
                }
            }
        }
        for ((uid, gpu), &total) in refusals {
            let Some(claim) = claims.get(uid) else {
                continue;
            };
            let key = (uid.clone(), gpu.clone());
            let (told, at) = self
                .refusals
                .entry(key)
                .or_insert((if self.started { 0 } else { total }, None));
            let due = at.is_none_or(|t| now.duration_since(t) >= repeat);
            if total > *told && due {
                out.push(Happening::Refused {
                    claim: claim.clone(),
                    gpu_uuid: gpu.clone(),
                    count: total - *told,
                    pods: pods.get(uid).cloned().unwrap_or_default(),
                });
                *told = total;
                *at = Some(now);
            }
        }
        self.refusals.retain(|(uid, _), _| claims.contains_key(uid));
        self.claims = claims;
        self.containers = containers;
        self.started = true;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::attribute::{ClaimGpuUsage, ClaimProcess, ClaimUsage, GpuGrant};

    fn pod(n: &str) -> PodRef {
        PodRef {
            namespace: "ml".into(),
            name: n.into(),
            uid: format!("uid-{n}"),
        }
    }

    fn claim(uid: &str, procs: &[(&str, &str)]) -> ClaimUsage {
        ClaimUsage {
            uid: uid.into(),
            namespace: "ml".into(),
            name: format!("c-{uid}"),
            gpus: vec![ClaimGpuUsage {
                grant: GpuGrant {
                    gpu_uuid: "GPU-0".into(),
                    memory_bytes: 1 << 30,
                    cores: 0,
                },
                processes: procs
                    .iter()
                    .enumerate()
                    .map(|(i, (p, c))| ClaimProcess {
                        pid: 100 + i as u32,
                        used_memory: 0,
                        sm_percent: None,
                        pod: pod(p),
                        container_id: (*c).into(),
                        ambiguous: false,
                    })
                    .collect(),
                memory_known: true,
            }],
        }
    }

    fn view(claims: Vec<ClaimUsage>) -> Attribution {
        Attribution {
            claims,
            ..Attribution::default()
        }
    }

    fn reasons(h: &[Happening]) -> Vec<&'static str> {
        h.iter().map(Happening::reason).collect()
    }

    #[test]
    fn claims_and_containers_come_and_go() {
        let mut l = Lifecycle::default();
        let t = Instant::now();
        let r = Duration::from_secs(300);
        let none = HashMap::new();
        let zero = HashMap::new();
        // The first pass learns, says nothing.
        assert!(
            l.step(&view(vec![claim("a", &[("p", "c1")])]), &none, &zero, t, r)
                .is_empty()
        );
        let h = l.step(
            &view(vec![
                claim("a", &[("p", "c1"), ("p", "c1"), ("p", "c2")]),
                claim("b", &[]),
            ]),
            &none,
            &zero,
            t,
            r,
        );
        assert_eq!(
            reasons(&h),
            ["GpuClaimPrepared", "GpuContainerStarted"],
            "{h:?}"
        );
        let Happening::ContainerStarted(x) = &h[1] else {
            unreachable!()
        };
        assert_eq!((x.container_id.as_str(), x.pod.name.as_str()), ("c2", "p"));
        let h = l.step(&view(vec![claim("a", &[("p", "c2")])]), &none, &zero, t, r);
        assert_eq!(
            reasons(&h),
            ["GpuContainerExited", "GpuClaimUnprepared"],
            "{h:?}"
        );
        assert!(h[1].note().contains("c-b"), "{}", h[1].note());
        // Nothing changed: nothing to say.
        assert!(
            l.step(&view(vec![claim("a", &[("p", "c2")])]), &none, &zero, t, r)
                .is_empty()
        );
    }

    #[test]
    fn refusals_are_told_at_most_once_per_repeat_with_the_count_since() {
        let mut l = Lifecycle::default();
        let t = Instant::now();
        let r = Duration::from_secs(300);
        let v = view(vec![claim("a", &[])]);
        let pods = HashMap::from([("a".to_owned(), vec![pod("p")])]);
        let n = |k: u64| HashMap::from([(("a".to_owned(), "GPU-0".to_owned()), k)]);
        // Refusals counted before the first pass are old news.
        assert!(l.step(&v, &pods, &n(4), t, r).is_empty());
        let h = l.step(&v, &pods, &n(6), t + Duration::from_secs(1), r);
        assert_eq!(
            h,
            vec![Happening::Refused {
                claim: ClaimId {
                    uid: "a".into(),
                    namespace: "ml".into(),
                    name: "c-a".into()
                },
                gpu_uuid: "GPU-0".into(),
                count: 2,
                pods: vec![pod("p")],
            }]
        );
        assert!(
            h[0].note().starts_with("2 device memory allocation(s)"),
            "{}",
            h[0].note()
        );
        // More within the repeat window: not yet; after it, the count since the last Event.
        assert!(
            l.step(&v, &pods, &n(9), t + Duration::from_secs(60), r)
                .is_empty()
        );
        let h = l.step(&v, &pods, &n(10), t + Duration::from_secs(302), r);
        assert!(
            matches!(&h[..], [Happening::Refused { count: 4, .. }]),
            "{h:?}"
        );
        // No new refusal: nothing, however long.
        assert!(
            l.step(&v, &pods, &n(10), t + Duration::from_secs(9000), r)
                .is_empty()
        );
    }
}
