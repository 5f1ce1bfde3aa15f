//! From the driver's per-GPU processes to a per-claim, per-GPU view (pure).
//!
//! A process belongs to a claim when its cgroup names a pod the claim serves and the claim
//! holds the GPU the process runs on. A pod can hold several claims on one GPU (two
//! requests of one claim are one claim; two claims are not): the driver cannot tell which of
//! them a process uses, so such a process is counted for the first of them (by UID) and
//! marked *ambiguous*: it is reported, never killed.

use std::collections::{BTreeMap, HashMap};

use fgpu_driver::backend::GpuUsage;

use super::cgroup::PodCgroup;

/// A pod a claim serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// What the plugin granted a claim on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuGrant {
    /// The GPU.
    pub gpu_uuid: String,
    /// Granted memory in bytes (summed over the claim's shares of this GPU).
    pub memory_bytes: u64,
    /// Granted cores in percent (0: not throttled).
    pub cores: u32,
}

/// A prepared claim as the monitor sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    /// UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Pods the claim serves (empty while unknown).
    pub pods: Vec<PodRef>,
    /// Per GPU it holds.
    pub grants: Vec<GpuGrant>,
}

/// One process of a claim on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimProcess {
    /// Host PID.
    pub pid: u32,
    /// Device memory it holds (0 where the driver does not say).
    pub used_memory: u64,
    /// SM utilisation in percent, if sampled.
    pub sm_percent: Option<u32>,
    /// The pod it runs in.
    pub pod: PodRef,
    /// Its container's runtime id.
    pub container_id: String,
    /// The pod holds several claims on this GPU (see the module documentation).
    pub ambiguous: bool,
}

/// One claim's use of one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimGpuUsage {
    /// The grant it is measured against.
    pub grant: GpuGrant,
    /// Its processes on the GPU.
    pub processes: Vec<ClaimProcess>,
    /// Whether the driver gave a memory figure for every process.
    pub memory_known: bool,
}

impl ClaimGpuUsage {
    /// Device memory of all its processes.
    pub fn used_memory(&self) -> u64 {
        self.processes.iter().map(|p| p.used_memory).sum()
    }

    /// SM utilisation of all its processes, in percent (can pass 100 only through rounding
    /// in the driver's figures; capped).
    pub fn sm_percent(&self) -> u32 {
        self.processes
            .iter()
            .filter_map(|p| p.sm_percent)
            .sum::<u32>()
            .min(100)
    }
}

/// One claim's use of its GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimUsage {
    /// UID.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// One entry per GPU the claim holds, in grant order.
    pub gpus: Vec<ClaimGpuUsage>,
}

/// The per-claim view of one pass, and what could not be attributed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    /// Every prepared claim, used or not.
    pub claims: Vec<ClaimUsage>,
    /// Per GPU, processes whose cgroup names no pod of a claim holding that GPU (other
    /// workloads, system processes, processes that exited before their cgroup was read).
    pub unattributed: BTreeMap<String, u32>,
}

/// Attributes each process of `gpus` to the claim it belongs to. `pods_of` gives a host
/// PID's pod and container (`None`: not in a pod, or gone).
pub fn attribute(
    gpus: &[GpuUsage],
    claims: &[ClaimView],
    mut pods_of: impl FnMut(u32) -> Option<PodCgroup>,
) -> Attribution {
    // (pod UID, GPU UUID) -> indices of the claims serving that pod on that GPU.
    let mut owners: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    let mut order: Vec<usize> = (0..claims.len()).collect();
    order.sort_by(|&a, &b| claims[a].uid.cmp(&claims[b].uid));
    for &i in &order {
        for pod in &claims[i].pods {
            for g in &claims[i].grants {
                owners
                    .entry((pod.uid.as_str(), g.gpu_uuid.as_str()))
                    .or_default()
                    .push(i);
            }
        }
    }
    let mut out = Attribution {
        claims: claims
            .iter()
            .map(|c| ClaimUsage {
                uid: c.uid.clone(),
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                gpus: c
                    .grants
                    .iter()
                    .map(|g| ClaimGpuUsage {
                        grant: g.clone(),
                        processes: Vec::new(),
                        memory_known: true,
                    })
                    .collect(),
            })
            .collect(),
        unattributed: BTreeMap::new(),
    };
    for gpu in gpus {
        for p in &gpu.processes {
            let owner = pods_of(p.pid).and_then(|cg| {
                let list = owners.get(&(cg.pod_uid.as_str(), gpu.uuid.as_str()))?;
                let (first, ambiguous) = (list[0], list.len() > 1);
                Some((cg, first, ambiguous))
            });
            let Some((cg, ci, ambiguous)) = owner else {
                *out.unattributed.entry(gpu.uuid.clone()).or_default() += 1;
                continue;
            };
            let claim = &claims[ci];
            let pod = claim
                .pods
                .iter()
                .find(|pr| pr.uid == cg.pod_uid)
                .cloned()
                .unwrap_or_else(|| PodRef {
                    namespace: claim.namespace.clone(),
                    name: String::new(),
                    uid: cg.pod_uid.clone(),
                });
            let usage = &mut out.claims[ci];
            if let Some(g) = usage.gpus.iter_mut().find(|g| g.grant.gpu_uuid == gpu.uuid) {
                g.memory_known &= p.used_memory.is_some();
                g.processes.push(ClaimProcess {
                    pid: p.pid,
                    used_memory: p.used_memory.unwrap_or(0),
                    sm_percent: p.sm_percent,
                    pod,
                    container_id: cg.container_id,
                    ambiguous,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use fgpu_driver::backend::ProcessUsage;

    use super::*;

    fn pod(n: &str, uid: &str) -> PodRef {
        PodRef {
            namespace: "ml".into(),
            name: n.into(),
            uid: uid.into(),
        }
    }

    fn claim(uid: &str, pods: Vec<PodRef>, gpus: &[(&str, u64, u32)]) -> ClaimView {
        ClaimView {
            uid: uid.into(),
            namespace: "ml".into(),
            name: format!("c-{uid}"),
            pods,
            grants: gpus
                .iter()
                .map(|&(g, m, c)| GpuGrant {
                    gpu_uuid: g.into(),
                    memory_bytes: m,
                    cores: c,
                })
                .collect(),
        }
    }

    fn procs(uuid: &str, p: &[(u32, Option<u64>, Option<u32>)]) -> GpuUsage {
        GpuUsage {
            uuid: uuid.into(),
            processes: p
                .iter()
                .map(|&(pid, used_memory, sm_percent)| ProcessUsage {
                    pid,
                    used_memory,
                    sm_percent,
                })
                .collect(),
            error: None,
            sm_error: None,
        }
    }

    fn cg(pod: &str) -> Option<PodCgroup> {
        Some(PodCgroup {
            pod_uid: pod.into(),
            container_id: format!("{pod}-c"),
        })
    }

    #[test]
    fn processes_go_to_the_claim_of_their_pod_on_their_gpu() {
        let claims = vec![
            claim("a", vec![pod("pa", "pod-a")], &[("GPU-0", 4 << 30, 30)]),
            claim(
                "b",
                vec![pod("pb", "pod-b")],
                &[("GPU-0", 8 << 30, 70), ("GPU-1", 1 << 30, 0)],
            ),
        ];
        let gpus = vec![
            procs(
                "GPU-0",
                &[
                    (100, Some(1 << 30), Some(28)),
                    (200, Some(3 << 30), Some(69)),
                    (300, Some(5), None),
                    (400, Some(7), Some(1)),
                ],
            ),
            procs("GPU-1", &[(201, None, Some(5)), (100, Some(9), Some(1))]),
        ];
        let a = attribute(&gpus, &claims, |pid| match pid {
            100 => cg("pod-a"),
            200 | 201 => cg("pod-b"),
            300 => cg("pod-z"), // a pod with no claim here
            _ => None,          // not in a pod
        });
        let ca = &a.claims[0];
        assert_eq!(ca.gpus[0].used_memory(), 1 << 30);
        assert_eq!(ca.gpus[0].sm_percent(), 28);
        assert_eq!(ca.gpus[0].processes[0].pod.name, "pa");
        assert_eq!(ca.gpus[0].processes[0].container_id, "pod-a-c");
        let cb = &a.claims[1];
        assert_eq!(cb.gpus[0].used_memory(), 3 << 30);
        assert_eq!(cb.gpus[0].sm_percent(), 69);
        assert_eq!(cb.gpus[1].processes.len(), 1);
        assert!(!cb.gpus[1].memory_known);
        assert!(cb.gpus[0].memory_known);
        // 300, 400 on GPU-0; 100 on GPU-1 (pod-a's claim does not hold GPU-1).
        assert_eq!(a.unattributed.get("GPU-0"), Some(&2));
        assert_eq!(a.unattributed.get("GPU-1"), Some(&1));
    }

    #[test]
    fn a_pod_with_two_claims_on_one_gpu_is_ambiguous() {
        let p = pod("p", "pod-p");
        let claims = vec![
            claim("z", vec![p.clone()], &[("GPU-0", 1 << 30, 0)]),
            claim("y", vec![p], &[("GPU-0", 2 << 30, 0)]),
        ];
        let a = attribute(&[procs("GPU-0", &[(1, Some(10), None)])], &claims, |_| {
            cg("pod-p")
        });
        // Counted once, for the first claim by UID ("y"), and marked.
        assert!(a.claims[0].gpus[0].processes.is_empty());
        assert_eq!(a.claims[1].gpus[0].processes.len(), 1);
        assert!(a.claims[1].gpus[0].processes[0].ambiguous);
    }

    #[test]
    fn a_claim_without_known_pods_gets_nothing() {
        let claims = vec![claim("a", vec![], &[("GPU-0", 1, 0)])];
        let a = attribute(&[procs("GPU-0", &[(1, Some(10), None)])], &claims, |_| {
            cg("pod-a")
        });
        assert!(a.claims[0].gpus[0].processes.is_empty());
        assert_eq!(a.unattributed.get("GPU-0"), Some(&1));
    }
}
