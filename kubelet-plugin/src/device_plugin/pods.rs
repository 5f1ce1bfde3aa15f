//! Which pod and container an `Allocate` is for.
//!
//! The kubelet's `Allocate` names only device ids, not the pod. The extender records its
//! decision on the pod (`<driver>/assigned-devices`) before it creates the Binding, so every
//! pod the kubelet can be admitting on this node already carries its grant. [`choose`] picks:
//!
//! 1. among the pods of this node ([`PodSource::pods_on_node`], a fresh list at each
//!    `Allocate`: the API server answers it after the Binding the kubelet reacts to) that
//!    are not terminated nor being deleted and carry a decision for this node;
//! 2. their containers that are not yet *allocated* — a container is allocated once the
//!    plugin has prepared its claim `<pod uid>-<container>` (recorded in the checkpoint, so
//!    the record survives a restart of the plugin in the same boot), in `index` order (the
//!    kubelet allocates containers in `spec.containers` order);
//! 3. the first container of each pod, if it asks for as many GPUs as the `Allocate` has
//!    device ids;
//! 4. the pod the kubelet is admitting, when the kubelet's pod resources view is at hand
//!    ([`choose_with`], [`super::podresources`]);
//! 5. else the pod bound first (PodScheduled's `lastTransitionTime`, else the creation
//!    time; then the creation time, then `namespace/name`).
//!
//! The earliest-bind rule alone is a guess: the kubelet admits a batch of pods sorted by
//! creation time (one-second resolution, ties in no defined order), so two pods bound to
//! one node within the same second whose next containers ask for the same number of GPUs
//! can get each other's grants — seen on a real kubelet with four pods
//! (`tests/e2e/52-legacy-burst`). The kubelet's view removes the guess; the rule remains
//! the fallback (see `docs/device-plugin.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::annotations::{AssignmentError, ContainerAssignment, PodAssignment};
use super::podresources::KubeletPods;

/// What the device plugin reads of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.nodeName`.
    pub node_name: String,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`).
    pub phase: String,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.creationTimestamp`, seconds since the epoch.
    pub created: i64,
    /// When the pod was bound: the PodScheduled condition's `lastTransitionTime`, seconds.
    pub bound: Option<i64>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// Who wrote each annotation: the field managers that `metadata.managedFields` records
    /// for it (the Volcano mode trusts an allocation only from Volcano's scheduler).
    pub annotation_managers: BTreeMap<String, BTreeSet<String>>,
    /// `spec.containers`, in order.
    pub containers: Vec<ContainerInfo>,
}

/// What the device plugin reads of a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    /// `name`.
    pub name: String,
    /// `resources.limits`, as written (quantities).
    pub limits: BTreeMap<String, String>,
}

impl PodInfo {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the pod has ended (its containers will not start again).
    pub fn terminated(&self) -> bool {
        self.phase == "Succeeded" || self.phase == "Failed"
    }
}

/// The pods could not be listed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot list the pods of node {node}: {detail}")]
pub struct PodSourceError {
    /// The node.
    pub node: String,
    /// The cause.
    pub detail: String,
}

/// A pod's annotation could not be written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: cannot set annotation {annotation}: {detail}")]
pub struct PodPatchError {
    /// `namespace/name`.
    pub pod: String,
    /// The annotation.
    pub annotation: String,
    /// The cause.
    pub detail: String,
}

/// Where pods come from: the API server in production, a list in tests.
pub trait PodSource: Send + Sync + 'static {
    /// Every pod whose `spec.nodeName` is `node`.
    fn pods_on_node(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Vec<PodInfo>, PodSourceError>> + Send;

    /// Sets one annotation of pod `namespace/name` (the Volcano mode's bind phase).
    fn set_annotation(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), PodPatchError>> + Send;
}

/// A [`PodSource`] over an in-memory list.
#[derive(Debug, Default)]
pub struct MapPodSource {
    pods: Mutex<BTreeMap<String, PodInfo>>,
}

impl MapPodSource {
    /// The map, also after a panic while it was held: each use is a single map operation,
    /// so the map is never left half-changed.
    fn pods(&self) -> MutexGuard<'_, BTreeMap<String, PodInfo>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds or replaces a pod (by its UID).
    pub fn insert(&self, pod: PodInfo) {
        self.pods().insert(pod.uid.clone(), pod);
    }

    /// Removes a pod by UID.
    pub fn remove(&self, uid: &str) {
        self.pods().remove(uid);
    }
}

impl PodSource for MapPodSource {
    async fn pods_on_node(&self, node: &str) -> Result<Vec<PodInfo>, PodSourceError> {
        Ok(self
            .pods()
            .values()
            .filter(|p| p.node_name == node)
            .cloned()
            .collect())
    }

    async fn set_annotation(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), PodPatchError> {
        let mut pods = self.pods();
        let pod = pods
            .values_mut()
            .find(|p| p.namespace == namespace && p.name == name)
            .ok_or_else(|| PodPatchError {
                pod: format!("{namespace}/{name}"),
                annotation: key.to_owned(),
                detail: "not found".into(),
            })?;
        pod.annotations.insert(key.to_owned(), value.to_owned());
        Ok(())
    }
}

impl<T: PodSource> PodSource for Arc<T> {
    fn pods_on_node(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Vec<PodInfo>, PodSourceError>> + Send {
        (**self).pods_on_node(node)
    }

    fn set_annotation(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), PodPatchError>> + Send {
        (**self).set_annotation(namespace, name, key, value)
    }
}

/// The claim UID of one container of a pod: `<pod uid>-<container name>` (letters, digits
/// and `-` when the pod UID is a UUID and the container name a DNS label). It names the
/// claim's CDI spec, its CDI devices and its state directory.
pub fn container_claim_uid(pod_uid: &str, container: &str) -> String {
    format!("{pod_uid}-{container}")
}

/// The pod and container an `Allocate` serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The pod.
    pub pod: PodInfo,
    /// The container's grant.
    pub container: ContainerAssignment,
    /// Whether the kubelet's pod resources view singled this pod out (it is the one being
    /// admitted); `false`: chosen by the earliest-bind rule alone.
    pub kubelet_confirmed: bool,
}

/// No pod matched; says what was seen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "no pod on node {node} waits for a container with {devices} GPU(s) (pods with a decision: {candidates}; already allocated: {allocated}){}",
    if problems.is_empty() { String::new() } else { format!("; unusable decisions: {}", problems.join("; ")) }
)]
pub struct NoMatch {
    /// The node.
    pub node: String,
    /// Device ids in the request.
    pub devices: usize,
    /// Pods with a decision for this node that still wait for a container.
    pub candidates: usize,
    /// Pods whose every GPU container is allocated.
    pub allocated: usize,
    /// Decisions that could not be read (each naming the pod and the field).
    pub problems: Vec<String>,
}

/// Picks the pod and container for an `Allocate` of `devices` device ids on `node` (see the
/// module documentation). `allocated` holds the claim UIDs already prepared.
pub fn choose(
    pods: &[PodInfo],
    node: &str,
    annotation: &str,
    allocated: &BTreeSet<String>,
    devices: usize,
) -> Result<Choice, NoMatch> {
    choose_with(pods, node, annotation, allocated, devices, None)
}

/// [`choose`], narrowed by the kubelet's own view when there is one: among the matching
/// containers, those the kubelet shows waiting for devices (the pod it is admitting, see
/// [`super::podresources`]) win over the earliest-bind order. When none of them is waiting
/// (the view is stale or the kubelet is older), the earliest-bind rule decides alone.
pub fn choose_with(
    pods: &[PodInfo],
    node: &str,
    annotation: &str,
    allocated: &BTreeSet<String>,
    devices: usize,
    kubelet: Option<&KubeletPods>,
) -> Result<Choice, NoMatch> {
    let mut problems = Vec::new();
    let (mut candidates, mut done) = (0, 0);
    let mut best: Option<(&PodInfo, ContainerAssignment)> = None;
    let mut best_waiting: Option<(&PodInfo, ContainerAssignment)> = None;
    let order = |p: &PodInfo| (p.bound.unwrap_or(p.created), p.created, p.key());
    for pod in pods {
        if pod.node_name != node || pod.terminated() || pod.deleting {
            continue;
        }
        let Some(value) = pod.annotations.get(annotation) else {
            continue;
        };
        let a = match PodAssignment::parse(&pod.key(), annotation, value) {
            Ok(a) => a,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        if a.node != node {
            problems.push(
                AssignmentError {
                    pod: pod.key(),
                    annotation: annotation.to_owned(),
                    problem: format!("node: {:?}, but the pod is bound to {node}", a.node),
                }
                .to_string(),
            );
            continue;
        }
        let mut containers = a.containers;
        containers.sort_by_key(|c| c.index);
        let Some(next) = containers
            .into_iter()
            .find(|c| !allocated.contains(&container_claim_uid(&pod.uid, &c.name)))
        else {
            done += 1;
            continue;
        };
        candidates += 1;
        if next.devices.len() != devices {
            continue;
        }
        if kubelet.is_some_and(|k| k.waiting(&pod.key(), &next.name))
            && best_waiting
                .as_ref()
                .is_none_or(|(b, _)| order(pod) < order(b))
        {
            best_waiting = Some((pod, next.clone()));
        }
        if best.as_ref().is_none_or(|(b, _)| order(pod) < order(b)) {
            best = Some((pod, next));
        }
    }
    let kubelet_confirmed = best_waiting.is_some();
    best_waiting
        .or(best)
        .map(|(pod, container)| Choice {
            pod: pod.clone(),
            container,
            kubelet_confirmed,
        })
        .ok_or(NoMatch {
            node: node.to_owned(),
            devices,
            candidates,
            allocated: done,
            problems,
        })
}

/// [`PodSource`] through the API server: `GET pods?fieldSelector=spec.nodeName=<node>`.
#[derive(Clone)]
pub struct KubePodSource {
    client: kube::Client,
}

impl KubePodSource {
    /// A source using `client`.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

/// The parts of a pod the device plugin reads.
pub fn pod_info(pod: &k8s_openapi::api::core::v1::Pod) -> PodInfo {
    let m = &pod.metadata;
    let status = pod.status.as_ref();
    PodInfo {
        namespace: m.namespace.clone().unwrap_or_default(),
        name: m.name.clone().unwrap_or_default(),
        uid: m.uid.clone().unwrap_or_default(),
        node_name: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        deleting: m.deletion_timestamp.is_some(),
        created: m.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
        bound: status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "True")
            })
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.as_second()),
        annotations: m.annotations.clone().unwrap_or_default(),
        annotation_managers: annotation_managers(m.managed_fields.as_deref().unwrap_or_default()),
        containers: pod
            .spec
            .as_ref()
            .map(|s| {
                s.containers
                    .iter()
                    .map(|c| ContainerInfo {
                        name: c.name.clone(),
                        limits: c
                            .resources
                            .as_ref()
                            .and_then(|r| r.limits.as_ref())
                            .map(|l| l.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// Per annotation key, the field managers that own it in `managed` (an entry's
/// `fieldsV1` names `f:metadata` → `f:annotations` → `f:<key>`).
pub fn annotation_managers(
    managed: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry],
) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for e in managed {
        let Some(manager) = e.manager.as_ref() else {
            continue;
        };
        let Some(fields) = e.fields_v1.as_ref() else {
            continue;
        };
        let Some(annotations) = fields.0["f:metadata"]["f:annotations"].as_object() else {
            continue;
        };
        for key in annotations.keys().filter_map(|k| k.strip_prefix("f:")) {
            out.entry(key.to_owned())
                .or_default()
                .insert(manager.clone());
        }
    }
    out
}

impl PodSource for KubePodSource {
    async fn pods_on_node(&self, node: &str) -> Result<Vec<PodInfo>, PodSourceError> {
        use k8s_openapi::api::core::v1::Pod;
        let api: kube::Api<Pod> = kube::Api::all(self.client.clone());
        let lp = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = api.list(&lp).await.map_err(|e| PodSourceError {
            node: node.to_owned(),
            detail: e.to_string(),
        })?;
        Ok(list.items.iter().map(pod_info).collect())
    }

    async fn set_annotation(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), PodPatchError> {
        use k8s_openapi::api::core::v1::Pod;
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        api.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|e| PodPatchError {
            pod: format!("{namespace}/{name}"),
            annotation: key.to_owned(),
            detail: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_info_reads_limits_and_who_wrote_each_annotation() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                "annotations": {"volcano.sh/vgpu-ids-new": "GPU-a,NVIDIA,1,0:", "x": "y"},
                "managedFields": [
                    {"manager": "vc-scheduler", "operation": "Update", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:annotations": {"f:volcano.sh/vgpu-ids-new": {}}}}},
                    {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:annotations": {"f:x": {}}}, "f:spec": {}}},
                    {"manager": "kubelet", "operation": "Update", "subresource": "status",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}
                ]},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "side"},
                {"name": "main", "resources": {"limits": {"volcano.sh/vgpu-memory": "20000", "cpu": "1"}}}
            ]}
        }))
        .unwrap();
        let info = pod_info(&pod);
        assert_eq!(
            info.annotation_managers["volcano.sh/vgpu-ids-new"],
            BTreeSet::from(["vc-scheduler".to_owned()])
        );
        assert_eq!(
            info.annotation_managers["x"],
            BTreeSet::from(["kubectl".to_owned()])
        );
        assert_eq!(info.annotation_managers.len(), 2);
        assert_eq!(info.containers.len(), 2);
        assert!(info.containers[0].limits.is_empty());
        assert_eq!(info.containers[1].name, "main");
        assert_eq!(info.containers[1].limits["volcano.sh/vgpu-memory"], "20000");
    }

    const ANN: &str = "gpu.fgpu.dev/assigned-devices";

    fn pod(name: &str, bound: i64, decision: &str) -> PodInfo {
        PodInfo {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            node_name: "n1".into(),
            phase: "Pending".into(),
            created: 100,
            bound: Some(bound),
            annotations: [(ANN.to_owned(), decision.to_owned())].into(),
            ..Default::default()
        }
    }

    fn decision(containers: &[(&str, usize)]) -> String {
        let cs: Vec<String> = containers
            .iter()
            .enumerate()
            .map(|(i, (name, n))| {
                let devs: Vec<String> = (0..*n)
                    .map(|d| {
                        format!(
                            r#"{{"id":"gpu-{d}","uuid":"GPU-{d}","memoryBytes":1024,"cores":10}}"#
                        )
                    })
                    .collect();
                format!(
                    r#"{{"index":{i},"name":"{name}","devices":[{}]}}"#,
                    devs.join(",")
                )
            })
            .collect();
        format!(r#"{{"node":"n1","containers":[{}]}}"#, cs.join(","))
    }

    fn pick(
        pods: &[PodInfo],
        allocated: &[&str],
        devices: usize,
    ) -> Result<(String, String), NoMatch> {
        let allocated = allocated.iter().map(|s| (*s).to_owned()).collect();
        choose(pods, "n1", ANN, &allocated, devices).map(|c| (c.pod.name, c.container.name))
    }

    #[test]
    fn earliest_bound_pending_pod_and_its_next_container() {
        let pods = vec![
            pod("late", 20, &decision(&[("a", 1)])),
            pod("early", 10, &decision(&[("x", 1), ("y", 2)])),
        ];
        assert_eq!(pick(&pods, &[], 1).unwrap(), ("early".into(), "x".into()));
        // x done: early's next container wants 2, so a 1-GPU request is late's.
        assert_eq!(
            pick(&pods, &["uid-early-x"], 1).unwrap(),
            ("late".into(), "a".into())
        );
        assert_eq!(
            pick(&pods, &["uid-early-x"], 2).unwrap(),
            ("early".into(), "y".into())
        );
        let e = pick(&pods, &["uid-early-x", "uid-early-y", "uid-late-a"], 1).unwrap_err();
        assert_eq!((e.candidates, e.allocated), (0, 2));
    }

    /// Four pods bound in the same second, each asking for one GPU: the earliest-bind rule
    /// alone picks "a" for every Allocate; the kubelet's view picks the pod it is admitting.
    #[test]
    fn the_kubelets_view_names_the_pod_being_admitted() {
        use super::super::podresources::KubeletPods;
        use fgpu_api::proto::podresources::v1 as pr;
        let pods: Vec<PodInfo> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| pod(n, 10, &decision(&[("main", 1)])))
            .collect();
        let allocated = BTreeSet::new();
        // The kubelet admitted "c" already, is admitting "b", has not reached "a" and "d".
        let view = |entries: &[(&str, bool)]| {
            KubeletPods::from_response(
                &pr::ListPodResourcesResponse {
                    pod_resources: entries
                        .iter()
                        .map(|(name, has)| pr::PodResources {
                            name: (*name).into(),
                            namespace: "ns".into(),
                            containers: vec![pr::ContainerResources {
                                name: "main".into(),
                                devices: if *has {
                                    vec![pr::ContainerDevices {
                                        resource_name: "nvidia.com/gpu".into(),
                                        device_ids: vec!["GPU-0::1".into()],
                                    }]
                                } else {
                                    vec![]
                                },
                                dynamic_resources: vec![],
                            }],
                        })
                        .collect(),
                },
                "nvidia.com/gpu",
            )
        };
        let k = view(&[("c", true), ("b", false)]);
        let mut pods_left = pods.clone();
        pods_left.retain(|p| p.name != "c");
        let c = choose_with(&pods_left, "n1", ANN, &allocated, 1, Some(&k)).unwrap();
        assert_eq!((c.pod.name.as_str(), c.kubelet_confirmed), ("b", true));
        // Without the view: the earliest bind, then the name.
        let c = choose_with(&pods_left, "n1", ANN, &allocated, 1, None).unwrap();
        assert_eq!((c.pod.name.as_str(), c.kubelet_confirmed), ("a", false));
        // A view that shows no waiting candidate (stale, or an older kubelet): the rule.
        let c = choose_with(
            &pods_left,
            "n1",
            ANN,
            &allocated,
            1,
            Some(&view(&[("c", true)])),
        )
        .unwrap();
        assert_eq!((c.pod.name.as_str(), c.kubelet_confirmed), ("a", false));
        // A waiting pod whose next container asks for another count is not taken.
        let c = choose_with(&pods_left, "n1", ANN, &allocated, 2, Some(&k));
        assert!(c.is_err());
    }

    #[test]
    fn ties_and_fallbacks() {
        // Same bind second: creation time, then the name.
        let mut a = pod("a", 10, &decision(&[("c", 1)]));
        let mut b = pod("b", 10, &decision(&[("c", 1)]));
        assert_eq!(pick(&[b.clone(), a.clone()], &[], 1).unwrap().0, "a");
        b.created = 50;
        assert_eq!(pick(&[a.clone(), b.clone()], &[], 1).unwrap().0, "b");
        // No PodScheduled condition: the creation time stands in for the bind.
        a.bound = None;
        a.created = 5;
        assert_eq!(pick(&[b.clone(), a.clone()], &[], 1).unwrap().0, "a");
    }

    #[test]
    fn skipped_pods() {
        let ok = pod("ok", 30, &decision(&[("c", 1)]));
        let mut done = pod("done", 1, &decision(&[("c", 1)]));
        done.phase = "Succeeded".into();
        let mut gone = pod("gone", 1, &decision(&[("c", 1)]));
        gone.deleting = true;
        let mut elsewhere = pod("elsewhere", 1, &decision(&[("c", 1)]));
        elsewhere.node_name = "n2".into();
        let mut plain = pod("plain", 1, "");
        plain.annotations.clear();
        let other_node = pod(
            "moved",
            1,
            &decision(&[("c", 1)]).replace(r#""node":"n1""#, r#""node":"n9""#),
        );
        let broken = pod("broken", 1, r#"{"node":"n1","containers":[{"index":0}]}"#);
        let pods = vec![done, gone, elsewhere, plain, other_node, broken, ok];
        assert_eq!(pick(&pods, &[], 1).unwrap().0, "ok");
        let e = pick(&pods, &["uid-ok-c"], 1).unwrap_err();
        assert_eq!(e.problems.len(), 2, "{e}");
        let text = e.to_string();
        assert!(
            text.contains("pod ns/moved: annotation gpu.fgpu.dev/assigned-devices: node: \"n9\""),
            "{text}"
        );
        assert!(
            text.contains("pod ns/broken: annotation gpu.fgpu.dev/assigned-devices: missing field"),
            "{text}"
        );
    }
}
