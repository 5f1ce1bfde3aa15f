//! What the controller keeps of the objects it watches.
//!
//! The daemon's mirrors ([`crate::mirror`]) hold every ResourceClaim, every pod that matters
//! to [`plan`] and every ResourceSlice of this driver. A
//! `serde_json::Value` object costs a B-tree node (about 630 bytes) however few its keys, so
//! a whole pod (spec, status, `managedFields`) is tens of kilobytes and a slice of eight
//! devices about seventy. The functions here run on each watched object before the
//! mirror keeps it (claims and slices as text, pods as a view read from the result) and
//! leave only what the controller reads:
//!
//! * **claims** ([`claim`]): everything but `metadata.managedFields`. The daemon writes a
//!   claim's status back whole (`replace_status` of the object it planned from), so spec and
//!   status stay as the API server sent them; an update without `managedFields` leaves the
//!   server's unchanged.
//! * **pods** ([`pod`]): only pods with `spec.resourceClaims` or this driver's scheduling gate
//!   ([`pod_matters`]); of those, `metadata` name, namespace, uid, resourceVersion,
//!   creationTimestamp, deletionTimestamp and annotations (less kubectl's
//!   `last-applied-configuration`), `spec.schedulingGates`, `spec.resourceClaims`,
//!   `spec.nodeName`, `status.phase`, `status.resourceClaimStatuses`. The controller writes
//!   pods only by merge patch (the gates), never whole.
//! * **slices** ([`slice`]): what the typed model `fgpu_api::dra::slice::ResourceSlice`
//!   reads, and so all that [`crate::inventory`] can see: `metadata` name, uid,
//!   resourceVersion; `spec.driver`, `spec.nodeName`, `spec.pool`, and per device (also
//!   under v1beta1's `basic`) `name`, `allowMultipleAllocations`, every attribute (CEL
//!   selectors may read any, [`crate::selector`]), the `value` of every capacity, and the
//!   `taints`. A slice is read into the model and written back, so the model's fields are
//!   the list: a field of the wrong type that the inventory reports is kept as it came,
//!   and devices keep their order, so errors name the same field and index.
//!
//! Whoever makes [`plan`] (or [`crate::request`], [`crate::usage`]) read another field of
//! a pod adds it here; one of a slice, to the typed model. The test
//! `plan_is_the_same_on_slim_objects` compares plans over whole and slim objects.
//!
//! [`plan`]: crate::reconcile::plan

use fgpu_api::dra::slice::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The annotation `kubectl apply` writes: the whole manifest again, read by no one here.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Keeps only `keys` of `obj` when it is a JSON object; other values stay as they are.
fn retain(obj: &mut Value, keys: &[&str]) {
    if let Value::Object(m) = obj {
        m.retain(|k, _| keys.contains(&k.as_str()));
    }
}

/// Keeps only `keys` of the object under `field` of `obj`, when there is one.
fn retain_in(obj: &mut Value, field: &str, keys: &[&str]) {
    if let Some(v) = obj.get_mut(field) {
        retain(v, keys);
    }
}

/// A claim as the controller keeps it: without `managedFields`.
pub fn claim(obj: &mut DynamicObject) {
    obj.metadata.managed_fields = None;
}

/// Whether [`reconcile::plan`](crate::reconcile::plan) can act on or because of the pod: it
/// references claims (`spec.resourceClaims` not empty) or carries `gate`. A pod without
/// either is neither allocated for, nor ungated, nor keeps a claim in use. Neither field
/// can be added to an existing pod (claims are immutable, gates can only be removed), so a
/// pod that does not matter never starts to.
pub fn pod_matters(obj: &DynamicObject, gate: &str) -> bool {
    let spec = &obj.data["spec"];
    spec["resourceClaims"]
        .as_array()
        .is_some_and(|c| !c.is_empty())
        || spec["schedulingGates"]
            .as_array()
            .is_some_and(|g| g.iter().any(|e| e["name"].as_str() == Some(gate)))
}

/// A pod as the controller keeps it (see the module's documentation).
pub fn pod(obj: &mut DynamicObject) {
    let m = std::mem::take(&mut obj.metadata);
    let annotations = m.annotations.map(|mut a| {
        a.remove(LAST_APPLIED);
        a
    });
    obj.metadata = ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        annotations,
        ..ObjectMeta::default()
    };
    retain(&mut obj.data, &["spec", "status"]);
    pod_body(&mut obj.data);
}

/// The pod's fields besides `metadata` that the controller reads.
fn pod_body(obj: &mut Value) {
    retain_in(
        obj,
        "spec",
        &["schedulingGates", "resourceClaims", "nodeName"],
    );
    retain_in(obj, "status", &["phase", "resourceClaimStatuses"]);
}

/// An object the daemon wrote (the API server's answer), trimmed like the reflectors' copy
/// of it: without `managedFields`, and a pod as [`pod`] keeps it.
pub fn written(obj: &mut Value) {
    if obj["kind"] == "Pod" {
        retain(obj, &["apiVersion", "kind", "metadata", "spec", "status"]);
        retain_in(
            obj,
            "metadata",
            &[
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "deletionTimestamp",
                "annotations",
            ],
        );
        if let Some(Value::Object(a)) = obj.pointer_mut("/metadata/annotations") {
            a.remove(LAST_APPLIED);
        }
        pod_body(obj);
    } else if let Some(Value::Object(m)) = obj.get_mut("metadata") {
        m.remove("managedFields");
    }
}

/// A slice as the controller keeps it: read into the typed model and written back (see
/// the module's documentation). The object stays as it was in the one case the model's
/// JSON does not make an object again (never seen: the model writes strings and numbers
/// only where it read them).
pub fn slice(obj: &mut DynamicObject) {
    through::<ResourceSlice>(obj);
}

/// Keeps of `obj` what the typed model `T` reads (its `metadata` and body); its
/// `apiVersion` and `kind` stay.
fn through<T: DeserializeOwned + Serialize>(obj: &mut DynamicObject) {
    // The body without a copy: `metadata` joins the object's other fields for the read.
    let mut whole = std::mem::take(&mut obj.data);
    if let (Value::Object(m), Ok(meta)) = (&mut whole, serde_json::to_value(&obj.metadata)) {
        m.insert("metadata".into(), meta);
    }
    let kept = T::deserialize(&whole)
        .and_then(|typed| serde_json::to_value(typed))
        .and_then(serde_json::from_value::<DynamicObject>);
    match kept {
        Ok(kept) => {
            obj.metadata = kept.metadata;
            obj.data = kept.data;
        }
        Err(_) => {
            if let Value::Object(m) = &mut whole {
                m.remove("metadata");
            }
            obj.data = whole;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use fgpu_api::names::DriverName;
    use fgpu_driver::engine::Policy;
    use serde_json::json;

    use super::*;
    use crate::reconcile::{self, Action, Settings, Snapshot};

    const GATE: &str = "gpu.fgpu.dev/allocate";
    const FIN: &str = "gpu.fgpu.dev/allocation";

    fn dynamic(v: &Value) -> DynamicObject {
        serde_json::from_value(v.clone()).unwrap()
    }

    fn value(o: &DynamicObject) -> Value {
        serde_json::to_value(o).unwrap()
    }

    use crate::inventory::typed_slices as typed;

    /// What an API server's answer adds to an object: managed fields, labels, owners.
    fn noise(obj: &mut Value, manager: &str) {
        let m = &mut obj["metadata"];
        m["labels"] = json!({"app": "x", "pod-template-hash": "abc"});
        m["generateName"] = json!("x-");
        m["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x", "uid": "o"}]);
        m["managedFields"] = json!([{"manager": manager, "operation": "Update",
            "apiVersion": "v1", "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                         "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}}}}}}]);
    }

    /// One node `node` with GPUs of `gib` GiB each, as the kubelet plugin publishes it (more
    /// attributes and capacity fields than the inventory reads).
    fn slice(node: &str, gib: &[u64], consumable: bool) -> Value {
        let devices: Vec<Value> = gib
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let mem = format!("{g}Gi");
                let mut d = json!({"name": format!("gpu-{i}"),
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": format!("GPU-{node}-{i}")},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                        "index": {"int": i},
                        "numaNode": {"int": i / 2},
                        "driverVersion": {"version": "580.0.0"},
                        "resource.kubernetes.io/pcieRoot": {"string": format!("pci0000:{i:02}")}},
                    "capacity": {
                        "memory": {"value": mem, "requestPolicy": {"default": mem,
                            "validRange": {"min": "268435456", "step": "1048576"}}},
                        "cores": {"value": "100", "requestPolicy": {"default": "0",
                            "validRange": {"min": "0", "max": "100", "step": "1"}}},
                        "other": {"value": "1"}},
                    "bindsToNode": false});
                if consumable {
                    d["allowMultipleAllocations"] = json!(true);
                }
                d
            })
            .collect();
        let mut s = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-gpu.fgpu.dev"), "uid": format!("uid-{node}"),
                         "resourceVersion": "5", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"driver": "gpu.fgpu.dev", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}});
        noise(&mut s, "fgpu-kubelet-plugin");
        s
    }

    fn claim(name: &str, gib: u64) -> Value {
        let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "resourceVersion": "7", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "shared.gpu.fgpu.dev",
                    "allocationMode": "ExactCount", "count": 1}}],
                "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.fgpu.dev", "parameters": {
                    "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig",
                    "memory": format!("{gib}Gi")}}}]}},
            "status": {}});
        noise(&mut c, "kube-controller-manager");
        c
    }

    fn allocated(name: &str, gib: u64, node: &str, device: &str) -> Value {
        let mut c = claim(name, gib);
        c["metadata"]["finalizers"] = json!([FIN]);
        c["status"]["allocation"] = json!({
            "devices": {"results": [{"request": "gpu", "driver": "gpu.fgpu.dev", "pool": node, "device": device}],
                        "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.fgpu.dev",
                            "parameters": {"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": format!("{gib}Gi")}}}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}});
        c
    }

    /// A pod as the API server returns it: containers, volumes, tolerations, conditions.
    fn pod(name: &str, created: &str, gated: bool, claims: &[(&str, Option<&str>)]) -> Value {
        let spec_claims: Vec<Value> = claims
            .iter()
            .map(|(e, _)| json!({"name": e, "resourceClaimTemplateName": "t"}))
            .collect();
        let statuses: Vec<Value> = claims
            .iter()
            .filter_map(|(e, c)| c.map(|c| json!({"name": e, "resourceClaimName": c})))
            .collect();
        let mut gates = vec![json!({"name": "other/gate"})];
        if gated {
            gates.push(json!({"name": GATE}));
        }
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "resourceVersion": "3", "creationTimestamp": created,
                         "annotations": {"hami.io/gpu-scheduler-policy": "spread",
                                         LAST_APPLIED: "{\"apiVersion\":\"v1\",\"kind\":\"Pod\"}"}},
            "spec": {"resourceClaims": spec_claims, "schedulingGates": gates,
                     "containers": [{"name": "c", "image": "img", "resources": {"claims": [{"name": "g"}]},
                                     "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets"}]}],
                     "volumes": [{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
                     "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
                     "restartPolicy": "Always", "schedulerName": "default-scheduler"},
            "status": {"phase": "Pending", "qosClass": "BestEffort", "resourceClaimStatuses": statuses,
                       "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}});
        if claims.is_empty() {
            p["spec"].as_object_mut().unwrap().remove("resourceClaims");
        }
        noise(&mut p, "kubelet");
        p
    }

    /// The objects as the reflectors keep them.
    fn slimmed(claims: &[Value], pods: &[Value], slices: &[Value]) -> [Vec<Value>; 3] {
        let c = claims
            .iter()
            .map(|v| {
                let mut o = dynamic(v);
                super::claim(&mut o);
                value(&o)
            })
            .collect();
        let p = pods
            .iter()
            .map(dynamic)
            .filter(|o| pod_matters(o, GATE))
            .map(|mut o| {
                super::pod(&mut o);
                value(&o)
            })
            .collect();
        let s = slices
            .iter()
            .map(|v| {
                let mut o = dynamic(v);
                super::slice(&mut o);
                value(&o)
            })
            .collect();
        [c, p, s]
    }

    /// `action`, with what legitimately differs between the two runs made equal: fresh
    /// share ids.
    fn normal(action: &Action) -> Action {
        let mut a = action.clone();
        if let Action::Allocate { allocation, .. } = &mut a {
            for r in allocation.allocation["devices"]["results"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                if r.get("shareID").is_some() {
                    r["shareID"] = json!("share");
                }
            }
        }
        a
    }

    /// Plans over the whole objects and over the slim ones; both must be the same.
    fn same_plan(
        claims: &[Value],
        pods: &[Value],
        slices: &[Value],
        avoid: &BTreeMap<String, BTreeSet<String>>,
        allocate: bool,
    ) -> Vec<Action> {
        let settings = Settings {
            driver: DriverName::default(),
            default_policy: Policy::BINPACK,
            workload_half_life: std::time::Duration::from_secs(3600),
            usage_aware: Default::default(),
        };
        let unsettled = BTreeSet::new();
        let snap = |claims, pods, slices| Snapshot {
            claims,
            pods,
            slices,
            avoid,
            unsettled: &unsettled,
            class: None,
        };
        let full = reconcile::plan(snap(claims, pods, slices), &settings, allocate);
        let [c, p, s] = slimmed(claims, pods, slices);
        let slim = reconcile::plan(snap(&c, &p, &s), &settings, allocate);
        let full_actions: Vec<Action> = full.actions.iter().map(normal).collect();
        let slim_actions: Vec<Action> = slim.actions.iter().map(normal).collect();
        assert_eq!(full_actions, slim_actions);
        assert_eq!(full.slice_errors, slim.slice_errors);
        assert_eq!(full.usage_errors, slim.usage_errors);
        assert_eq!(
            (full.consumable, full.gpus, &full.usage),
            (slim.consumable, slim.gpus, &slim.usage)
        );
        assert_eq!(
            reconcile::consumable("gpu.fgpu.dev", typed(slices)),
            reconcile::consumable("gpu.fgpu.dev", typed(&s))
        );
        full_actions
    }

    fn kinds(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                Action::Allocate { claim, .. } => {
                    format!("allocate {}", claim.name)
                }
                Action::Pending { claim, .. } => format!("pending {}", claim.name),
                Action::Rejected { claim, .. } => format!("rejected {}", claim.name),
                Action::Ungate { pod, .. } => format!("ungate {}", pod.name),
                Action::Release { claim, .. } => {
                    format!("release {}", claim.name)
                }
                Action::Revoke { claim, .. } => {
                    format!("revoke {}", claim.name)
                }
            })
            .collect()
    }

    #[test]
    fn plan_is_the_same_on_slim_objects() {
        let mut bad = claim("bad", 4);
        bad["spec"]["devices"]["config"][0]["opaque"]["parameters"]["cores"] = json!(140);
        let mut reserved = allocated("reserved", 4, "node-a", "gpu-0");
        reserved["status"]["reservedFor"] =
            json!([{"resource": "pods", "name": "gone", "uid": "u"}]);
        let mut deleting = allocated("deleting", 4, "node-a", "gpu-1");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut cleared = claim("cleared", 4);
        cleared["metadata"]["finalizers"] = json!([FIN]);
        let claims = [
            allocated("x", 10, "node-a", "gpu-0"),
            allocated("orphan", 4, "node-a", "gpu-0"),
            allocated("done", 4, "node-a", "gpu-1"),
            reserved,
            deleting,
            cleared,
            claim("a", 8),
            claim("b", 6),
            claim("huge", 200),
            bad,
        ];
        let mut finished = pod(
            "finished",
            "2026-01-01T00:00:00Z",
            false,
            &[("g", Some("done"))],
        );
        finished["status"]["phase"] = json!("Succeeded");
        let mut bound = pod("px", "2026-01-01T00:00:00Z", false, &[("g", Some("x"))]);
        bound["spec"]["nodeName"] = json!("node-a");
        let mut going = pod("going", "2026-01-01T00:00:01Z", true, &[("g", Some("a"))]);
        going["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:09Z");
        let pods = [
            bound,
            finished,
            going,
            pod("pb", "2026-01-01T00:00:05Z", true, &[("g", Some("b"))]),
            pod("pa", "2026-01-01T00:00:04Z", true, &[("g", Some("a"))]),
            pod("ph", "2026-01-01T00:00:06Z", true, &[("g", Some("huge"))]),
            pod("pbad", "2026-01-01T00:00:07Z", true, &[("g", Some("bad"))]),
            pod("notyet", "2026-01-01T00:00:08Z", true, &[("g", None)]),
            pod(
                "retry",
                "2026-01-01T00:00:02Z",
                false,
                &[("g", Some("cleared"))],
            ),
            pod("gate-only", "2026-01-01T00:00:03Z", true, &[]),
            pod("unrelated", "2026-01-01T00:00:00Z", false, &[]),
        ];
        let mut avoid = BTreeMap::new();
        avoid.insert(
            "uid-cleared".to_owned(),
            BTreeSet::from(["node-a".to_owned()]),
        );
        for consumable in [false, true] {
            let slices = [
                slice("node-a", &[16, 16], consumable),
                slice("node-b", &[80], consumable),
            ];
            let actions = same_plan(&claims, &pods, &slices, &avoid, true);
            assert_eq!(
                kinds(&actions),
                [
                    "release deleting",
                    "release done",
                    "release orphan",
                    "allocate cleared",
                    "ungate gate-only",
                    "allocate a",
                    "allocate b",
                    "pending huge",
                    "rejected bad"
                ],
                "every kind of action is compared"
            );
            same_plan(&claims, &pods, &slices, &avoid, false);
        }
        // The pods' annotation (spread) decides the placement, so the comparison above
        // covers it: binpack would put a beside x.
        let place = |annotated: bool| {
            let mut p = pod("pa", "2026-01-01T00:00:04Z", true, &[("g", Some("a"))]);
            if !annotated {
                p["metadata"]["annotations"] = json!({});
            }
            let actions = same_plan(
                &[allocated("x", 4, "node-a", "gpu-0"), claim("a", 4)],
                &[p],
                &[slice("node-a", &[16, 16], false)],
                &BTreeMap::new(),
                true,
            );
            let Some(Action::Allocate { allocation, .. }) = actions.last() else {
                panic!("{:?}", kinds(&actions))
            };
            allocation.grant.devices[0].gpu.clone()
        };
        assert_eq!([place(true), place(false)], ["gpu-1", "gpu-0"]);
    }

    #[test]
    fn malformed_slices_report_the_same_errors() {
        let mut s = Vec::new();
        for (i, (path, v)) in [
            ("/spec/devices/1/attributes/uuid", json!({"int": 3})),
            (
                "/spec/devices/0/attributes/numaNode",
                json!({"string": "x"}),
            ),
            ("/spec/devices/1/capacity/memory", json!("80Gi")),
            ("/spec/devices/0/capacity/cores/value", json!("101")),
            ("/spec/devices/1/name", json!("")),
            ("/spec/devices", json!({"not": "a list"})),
            ("/spec/pool/generation", json!("one")),
        ]
        .into_iter()
        .enumerate()
        {
            let mut x = slice(&format!("node-{i}"), &[16, 16], false);
            *x.pointer_mut(path).unwrap() = v;
            s.push(x);
        }
        let mut beta = slice("node-beta", &[16], true);
        let d = beta["spec"]["devices"][0].take();
        beta["spec"]["devices"][0] = json!({"name": d["name"], "basic": d});
        beta["spec"]["devices"][0]["basic"]["attributes"]["productName"] = json!({"int": 1});
        s.push(beta.clone());
        let mut beta_ok = slice("node-beta-ok", &[16], true);
        let d = beta_ok["spec"]["devices"][0].take();
        beta_ok["spec"]["devices"][0] = json!({"name": d["name"], "basic": d});
        s.push(beta_ok);
        let [_, _, slim] = slimmed(&[], &[], &s);
        let full = crate::inventory::from_slices("gpu.fgpu.dev", typed(&s));
        let kept = crate::inventory::from_slices("gpu.fgpu.dev", typed(&slim));
        assert_eq!(full, kept);
        assert_eq!(full.errors.len(), 8, "{:?}", full.errors);
        assert_eq!(full.inventory.nodes.len(), 1);
        assert!(reconcile::consumable("gpu.fgpu.dev", typed(&slim[8..])));
        assert!(!reconcile::consumable("gpu.fgpu.dev", typed(&slim[..1])));
    }

    #[test]
    fn what_a_slim_pod_and_slice_keep() {
        let mut p = dynamic(&pod("p", "2026-01-01T00:00:00Z", true, &[("g", Some("c"))]));
        assert!(pod_matters(&p, GATE));
        super::pod(&mut p);
        let v = value(&p);
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "resourceVersion": "3",
                             "creationTimestamp": "2026-01-01T00:00:00Z",
                             "annotations": {"hami.io/gpu-scheduler-policy": "spread"}},
                "spec": {"resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}],
                         "schedulingGates": [{"name": "other/gate"}, {"name": GATE}]},
                "status": {"phase": "Pending", "resourceClaimStatuses": [{"name": "g", "resourceClaimName": "c"}]}})
        );
        assert!(!pod_matters(
            &dynamic(&pod("q", "2026-01-01T00:00:00Z", false, &[])),
            GATE
        ));
        assert!(pod_matters(
            &dynamic(&pod("q", "2026-01-01T00:00:00Z", true, &[])),
            GATE
        ));

        let mut s = dynamic(&slice("n", &[16], true));
        super::slice(&mut s);
        assert_eq!(
            value(&s),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": "n-gpu.fgpu.dev", "uid": "uid-n", "resourceVersion": "5"},
                "spec": {"driver": "gpu.fgpu.dev", "nodeName": "n",
                         "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                         "devices": [{"name": "gpu-0", "allowMultipleAllocations": true,
                            // Every attribute (selectors read any), every capacity's value.
                            "attributes": {"type": {"string": "gpu"},
                                           "uuid": {"string": "GPU-n-0"},
                                           "productName": {"string": "NVIDIA H100 80GB HBM3"},
                                           "index": {"int": 0},
                                           "numaNode": {"int": 0},
                                           "driverVersion": {"version": "580.0.0"},
                                           "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"}},
                            "capacity": {"memory": {"value": "16Gi"}, "cores": {"value": "100"},
                                         "other": {"value": "1"}}}]}})
        );

        let mut c = dynamic(&allocated("c", 4, "n", "gpu-0"));
        let before = value(&c);
        super::claim(&mut c);
        let mut expected = before;
        expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        assert_eq!(value(&c), expected, "a claim keeps all but managedFields");
    }

    #[test]
    fn packed_objects_read_back_whole_and_written_ones_match_the_mirrors() {
        for v in [
            claim("c", 4),
            pod("p", "2026-01-01T00:00:00Z", true, &[("g", Some("c"))]),
            slice("n", &[16], true),
        ] {
            let mut v = v;
            v["metadata"]["uid"] = json!("u");
            let p = crate::mirror::Packed::of(&dynamic(&v)).expect("uid");
            assert_eq!(p.value().unwrap(), v);
            assert_eq!(p.uid, "u");
        }
        // What the daemon wrote is trimmed as the reflectors trim what they store.
        for (v, trim) in [
            (
                pod("p", "2026-01-01T00:00:00Z", true, &[("g", Some("c"))]),
                super::pod as fn(&mut DynamicObject),
            ),
            (allocated("c", 4, "n", "gpu-0"), super::claim),
        ] {
            let mut stored = dynamic(&v);
            trim(&mut stored);
            let mut w = v.clone();
            written(&mut w);
            assert_eq!(w, value(&stored));
        }
    }
}
