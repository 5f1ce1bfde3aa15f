//! Which container of a pod a process on a GPU runs in, by name, for the per-container
//! metrics.
//!
//! A process's cgroup names its pod (UID) and its container by the runtime's ID, not by the
//! name the pod spec gives it. On the DRA path the kubelet's pod resources API (`List`,
//! the socket `--pod-resources-socket`, read-only and on the node: no API server rights)
//! says, per pod (namespace and name) and container, the ResourceClaims the container uses.
//! A claim that one container of the pod uses names that container. A claim several
//! containers of one pod share does not tell them apart: their processes count under
//! container `""` (the pod's and the claim's figures stay exact). On the legacy path each
//! claim is one container's, named in the claim (`<pod>/<container>`).
//!
//! The list is read again at most every [`REFRESH`], and sooner (at most every [`RETRY`])
//! when a pass met a pod and claim it does not hold — a container that just started.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fgpu_api::proto::podresources::v1 as pr;

/// The longest time between two reads of the kubelet's list.
pub const REFRESH: Duration = Duration::from_secs(30);
/// The shortest time between two reads when a pass met an unknown pod and claim.
pub const RETRY: Duration = Duration::from_secs(2);

/// (namespace, pod, claim) → the containers of the pod that use the claim.
type Users = HashMap<(String, String, String), Vec<String>>;

/// The containers of each pod by the claims they use, from the kubelet's last list.
#[derive(Debug, Default)]
pub struct ClaimContainers {
    users: Users,
    listed_at: Option<Instant>,
    /// A pass asked for a pod and claim the list does not hold.
    missed: bool,
}

impl ClaimContainers {
    /// The view of one `List` answer, taken at `now`.
    pub fn replace(&mut self, resp: &pr::ListPodResourcesResponse, now: Instant) {
        let mut users: Users = HashMap::new();
        for p in &resp.pod_resources {
            for c in &p.containers {
                for d in &c.dynamic_resources {
                    // A claim is in its pod's namespace; the field may be empty on old kubelets.
                    let ns = if d.claim_namespace.is_empty() {
                        &p.namespace
                    } else {
                        &d.claim_namespace
                    };
                    if ns != &p.namespace {
                        continue;
                    }
                    let names = users
                        .entry((p.namespace.clone(), p.name.clone(), d.claim_name.clone()))
                        .or_default();
                    if !names.contains(&c.name) {
                        names.push(c.name.clone());
                    }
                }
            }
        }
        self.users = users;
        self.listed_at = Some(now);
        self.missed = false;
    }

    /// The list could not be read at `now`: the last view stays, the next try waits
    /// [`REFRESH`] (the failure is logged by the caller).
    pub fn failed(&mut self, now: Instant) {
        self.listed_at = Some(now);
        self.missed = false;
    }

    /// The container of pod `namespace/pod` that uses claim `claim`, when exactly one does.
    /// Notes a miss (the next [`Self::due`] comes sooner) when the list has no such pair.
    pub fn container(&mut self, namespace: &str, pod: &str, claim: &str) -> Option<&str> {
        let key = (namespace.to_owned(), pod.to_owned(), claim.to_owned());
        match self.users.get(&key).map(Vec::as_slice) {
            Some([one]) => Some(one.as_str()),
            Some(_) => None,
            None => {
                self.missed = true;
                None
            }
        }
    }

    /// Whether the list should be read again at `now`.
    pub fn due(&self, now: Instant) -> bool {
        match self.listed_at {
            None => true,
            Some(t) => {
                let age = now.saturating_duration_since(t);
                age >= REFRESH || (self.missed && age >= RETRY)
            }
        }
    }
}

/// The container named by a legacy device-plugin claim (`<pod>/<container>`).
pub fn of_legacy_claim(claim_name: &str) -> Option<&str> {
    claim_name.split_once('/').map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dynamic(claim: &str, ns: &str) -> pr::DynamicResource {
        pr::DynamicResource {
            claim_name: claim.into(),
            claim_namespace: ns.into(),
            claim_resources: vec![],
        }
    }

    /// (namespace, pod, [(container, [claim])]).
    type Pod<'a> = (&'a str, &'a str, &'a [(&'a str, &'a [&'a str])]);

    /// A response of `pods`.
    fn response(pods: &[Pod<'_>]) -> pr::ListPodResourcesResponse {
        pr::ListPodResourcesResponse {
            pod_resources: pods
                .iter()
                .map(|(ns, name, cs)| pr::PodResources {
                    name: (*name).into(),
                    namespace: (*ns).into(),
                    containers: cs
                        .iter()
                        .map(|(c, claims)| pr::ContainerResources {
                            name: (*c).into(),
                            devices: vec![],
                            dynamic_resources: claims.iter().map(|k| dynamic(k, ns)).collect(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    #[test]
    fn names_the_one_container_of_a_claim_and_not_a_shared_one() {
        let mut cc = ClaimContainers::default();
        let t0 = Instant::now();
        cc.replace(
            &response(&[
                ("ml", "p1", &[("train", &["c1"]), ("side", &[])]),
                ("ml", "p2", &[("a", &["c2", "c3"]), ("b", &["c3"])]),
            ]),
            t0,
        );
        assert_eq!(cc.container("ml", "p1", "c1"), Some("train"));
        assert_eq!(cc.container("ml", "p2", "c2"), Some("a"));
        assert_eq!(cc.container("ml", "p2", "c3"), None, "shared by a and b");
        assert!(!cc.due(t0 + RETRY), "every pair asked for is listed");
        // Another namespace's pod of the same name is not this one.
        assert_eq!(cc.container("other", "p1", "c1"), None);
        assert!(cc.due(t0 + RETRY), "a miss reads the list again sooner");
        assert!(!cc.due(t0 + RETRY / 2));
    }

    #[test]
    fn a_claim_of_another_namespace_names_no_container() {
        let mut cc = ClaimContainers::default();
        let mut resp = response(&[("ml", "p", &[("main", &[])])]);
        resp.pod_resources[0].containers[0]
            .dynamic_resources
            .push(dynamic("c", "else"));
        cc.replace(&resp, Instant::now());
        assert_eq!(cc.container("ml", "p", "c"), None);
        assert_eq!(cc.container("else", "p", "c"), None);
    }

    #[test]
    fn refresh_and_failure_timing() {
        let mut cc = ClaimContainers::default();
        let t0 = Instant::now();
        assert!(cc.due(t0), "never listed");
        cc.failed(t0);
        assert!(!cc.due(t0 + RETRY));
        assert!(cc.due(t0 + REFRESH));
    }

    #[test]
    fn legacy_claims_name_their_container() {
        assert_eq!(of_legacy_claim("pod-a/main"), Some("main"));
        assert_eq!(of_legacy_claim("no-slash"), None);
    }
}
