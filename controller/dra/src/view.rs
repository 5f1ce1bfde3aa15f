//! What one pass of [`crate::reconcile`] reads of each claim and pod, as small typed
//! records instead of whole JSON objects.
//!
//! A `serde_json::Value` costs a B-tree node (about 630 bytes) per JSON object in it, so a
//! pass that held every claim, pod and slice as a `Value` grew with the cluster: about
//! 13 KiB per allocated claim. A [`ClaimView`] is a few hundred bytes and a [`PodView`]
//! less. The daemon computes a view once per object version (and, for claims, per
//! inventory: the grant depends on the devices' sizes) and keeps it between passes; the
//! whole object is parsed again only for what needs it: turning a pending claim into
//! engine requests and the writes themselves.
//!
//! A claim's view is read from the typed claim ([`fgpu_api::dra::claim`]), parsed straight
//! from its text ([`ClaimView::of_text`]); the typed claim is dropped once the view is
//! made. A text that does not read as a claim still gets a view, which names it and whose
//! grant is the error.

use std::collections::BTreeMap;

use fgpu_api::dra::claim::ResourceClaim;
use fgpu_api::names::DriverName;
use fgpu_driver::engine::Inventory;
use fgpu_driver::ledger::Grant;
use serde_json::Value;

use crate::claim_key;
use crate::load::{self, DeviceLoad};
use crate::objects::{self, ObjectId};
use crate::usage::{self, UsageError};

/// One allocation result of a claim that names a MIG placement device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigResult {
    /// Its index in `status.allocation.devices.results`.
    pub index: usize,
    /// `pool` (the node).
    pub node: String,
    /// `device`, e.g. `gpu-0-mig-1g10gb-6`.
    pub device: String,
}

/// The results of `driver` in `claim`'s allocation whose device is a MIG placement
/// ([`fgpu_driver::mig::parse_device_name`]).
fn mig_results(claim: &ResourceClaim, driver: &DriverName) -> Vec<MigResult> {
    let Some(alloc) = claim.allocation() else {
        return Vec::new();
    };
    alloc
        .results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.driver == driver.as_str())
        .filter(|(_, r)| fgpu_driver::mig::parse_device_name(&r.device).is_some())
        .map(|(index, r)| MigResult {
            index,
            node: r.pool.clone(),
            device: r.device.clone(),
        })
        .collect()
}

/// What a pass reads of one ResourceClaim.
#[derive(Clone, Debug)]
pub struct ClaimView {
    pub id: ObjectId,
    /// `namespace/name`.
    pub key: String,
    /// It carries this controller's finalizer.
    pub ours: bool,
    /// `status.allocation` is set.
    pub allocated: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `status.reservedFor` is not empty.
    pub reserved: bool,
    /// One of its requests asks for the shared or the MIG class: the controller allocates
    /// it.
    pub shared: bool,
    /// One of its requests asks for the MIG class: it is placed on a MIG placement.
    pub mig: bool,
    /// Its results of this driver that name MIG placement devices: they are not in the
    /// ledger, but in the MIG placements taken ([`crate::mig`]).
    pub mig_results: Vec<MigResult>,
    /// `status.allocation.allocationTimestamp` ("" when absent).
    pub allocated_at: String,
    /// The node of its allocation (the node selector's `metadata.name`).
    pub node: Option<String>,
    /// Its grant in the ledger ([`usage::claim_grant`] over the inventory it was read with).
    pub grant: Result<Option<Grant>, UsageError>,
    /// `metadata.creationTimestamp` in Unix seconds (0 when absent or unreadable): when the
    /// request arrived, for the workload model.
    pub created: i64,
    /// What the node monitor measured of it per GPU of its grant ([`load::claim_loads`];
    /// empty when the grant is not valid or nothing was measured).
    pub load: Vec<DeviceLoad>,
}

impl ClaimView {
    /// The view of `claim` for `driver`, its grant sized by `inventory`.
    pub fn of(claim: &ResourceClaim, driver: &DriverName, inventory: &Inventory) -> Self {
        let finalizer = driver.finalizer();
        let meta = &claim.metadata;
        let allocation = claim.allocation_status();
        let grant = usage::claim_grant(claim, driver.as_str(), inventory);
        let load = match &grant {
            Ok(Some(g)) => load::claim_loads(claim, driver.as_str(), g),
            _ => Vec::new(),
        };
        Self {
            id: ObjectId::of_meta(meta),
            key: claim_key(claim),
            ours: meta.finalizers.contains(&finalizer),
            allocated: allocation.is_some(),
            deleting: meta.deletion_timestamp.is_some(),
            reserved: claim.is_reserved(),
            shared: objects::is_shared(claim, driver),
            mig: objects::is_mig(claim, driver),
            mig_results: mig_results(claim, driver),
            allocated_at: allocation
                .and_then(|a| a.allocation_timestamp.clone())
                .unwrap_or_default(),
            node: objects::allocated_node(claim).map(str::to_owned),
            grant,
            created: unix_seconds(meta.creation_timestamp.as_deref()),
            load,
        }
    }

    /// The view of the claim whose JSON text is `text` ([`ClaimView::of`]); `stored` names
    /// it (UID and version) where the text does not read as a claim.
    pub fn of_text(
        text: &[u8],
        stored: ObjectId,
        driver: &DriverName,
        inventory: &Inventory,
    ) -> Self {
        match serde_json::from_slice::<ResourceClaim>(text) {
            Ok(claim) => Self::of(&claim, driver, inventory),
            Err(e) => Self::unreadable(stored, e.to_string()),
        }
    }

    /// The view of the claim `claim` as JSON ([`ClaimView::of`]), for callers that hold
    /// whole objects (tests, tools).
    pub fn of_json(claim: &Value, driver: &DriverName, inventory: &Inventory) -> Self {
        match usage::typed(claim) {
            Ok(c) => Self::of(&c, driver, inventory),
            Err(e) => Self {
                grant: Err(e),
                ..Self::unreadable(ObjectId::of(claim), String::new())
            },
        }
    }

    /// The view of a claim whose text does not read (`problem`): named by `id` (its key,
    /// else its UID), nothing set, its grant the error, so that the pass reports it.
    fn unreadable(id: ObjectId, problem: String) -> Self {
        let key = if id.name.is_empty() {
            id.uid.clone()
        } else {
            id.key()
        };
        Self {
            grant: Err(UsageError::Unreadable {
                claim: key.clone(),
                problem,
            }),
            id,
            key,
            ours: false,
            allocated: false,
            deleting: false,
            reserved: false,
            shared: false,
            mig: false,
            mig_results: Vec::new(),
            allocated_at: String::new(),
            node: None,
            created: 0,
            load: Vec::new(),
        }
    }

    /// The id its grant takes in the ledger: [`usage::grant_id`] of the claim, from the
    /// view (not kept: it is the UID, already in `id`).
    pub fn grant_id(&self) -> String {
        usage::grant_id_of(&self.id.uid, || self.key.clone())
    }
}

/// `t` (RFC 3339) in Unix seconds; 0 when absent or unreadable.
fn unix_seconds(t: Option<&str>) -> i64 {
    t.and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_second())
}

/// What a pass reads of one Pod.
#[derive(Clone, Debug)]
pub struct PodView {
    pub id: ObjectId,
    /// `metadata.creationTimestamp` ("" when absent).
    pub created: String,
    /// Not `Succeeded` or `Failed`.
    pub live: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// It carries this controller's scheduling gate.
    pub gated: bool,
    /// Its other scheduling gates, as written (what an ungate leaves).
    pub other_gates: Vec<Value>,
    /// [`objects::pod_claim_names`].
    pub claims: Vec<Option<String>>,
    /// `spec.nodeName` is set.
    pub bound: bool,
    /// `metadata.annotations` with string values.
    pub annotations: BTreeMap<String, String>,
}

impl PodView {
    /// The view of `pod`, whose gate of interest is `gate`.
    pub fn of(pod: &Value, gate: &str) -> Self {
        let gates = pod["spec"]["schedulingGates"].as_array();
        let named = |g: &Value| g["name"].as_str() == Some(gate);
        Self {
            id: ObjectId::of(pod),
            created: pod["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            live: !matches!(
                pod["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            ),
            deleting: pod["metadata"]["deletionTimestamp"].is_string(),
            gated: gates.is_some_and(|g| g.iter().any(named)),
            other_gates: gates
                .into_iter()
                .flatten()
                .filter(|g| !named(g))
                .cloned()
                .collect(),
            claims: objects::pod_claim_names(pod),
            bound: pod["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty()),
            annotations: pod["metadata"]["annotations"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// `namespace/<claim>` for each claim name the pod uses (generated ones included).
    pub fn claim_keys(&self) -> impl Iterator<Item = String> + '_ {
        self.claims
            .iter()
            .flatten()
            .map(|n| format!("{}/{n}", self.id.namespace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pod_view_reads_gates_claims_and_phase() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "3",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "annotations": {"hami.io/gpu-scheduler-policy": "spread", "n": 1}},
            "spec": {"schedulingGates": [{"name": "gpu.fgpu.dev/allocate"}, {"name": "other"}],
                     "resourceClaims": [{"name": "a", "resourceClaimName": "direct"},
                                        {"name": "b", "resourceClaimTemplateName": "t"}]},
            "status": {"phase": "Pending"}});
        let v = PodView::of(&pod, "gpu.fgpu.dev/allocate");
        assert!(v.gated && v.live && !v.deleting && !v.bound);
        assert_eq!(v.other_gates, vec![json!({"name": "other"})]);
        assert_eq!(v.claims, vec![Some("direct".to_owned()), None]);
        assert_eq!(v.claim_keys().collect::<Vec<_>>(), ["ns/direct"]);
        assert_eq!(v.created, "2026-01-01T00:00:00Z");
        // Non-string annotation values are left out.
        assert_eq!(v.annotations.len(), 1);

        let mut done = pod.clone();
        done["status"]["phase"] = json!("Succeeded");
        done["spec"]["nodeName"] = json!("node-a");
        done["spec"]["schedulingGates"] = json!([]);
        let v = PodView::of(&done, "gpu.fgpu.dev/allocate");
        assert!(!v.gated && !v.live && v.bound);
    }

    #[test]
    fn claim_view_reads_flags_node_and_grant() {
        use fgpu_driver::engine::{Gpu, Node};
        let typed = |c: &Value| usage::typed(c).unwrap();
        let inv = Inventory {
            nodes: vec![Node::new(
                "node-a",
                vec![Gpu::new("gpu-0", "H100", 80 << 30)],
            )],
        };
        let claim = json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "9",
                         "finalizers": ["gpu.fgpu.dev/allocation"]},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "shared.gpu.fgpu.dev"}}]}},
            "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "x"}],
                       "allocation": {
                "allocationTimestamp": "2026-01-01T00:00:01Z",
                "devices": {"results": [{"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-0",
                                          "consumedCapacity": {"memory": "4Gi", "cores": "10"}}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}}});
        let v = ClaimView::of_json(&claim, &DriverName::default(), &inv);
        assert!(v.ours && v.allocated && v.reserved && v.shared && !v.deleting);
        assert_eq!(v.key, "ns/c");
        assert_eq!(v.node.as_deref(), Some("node-a"));
        assert_eq!(v.allocated_at, "2026-01-01T00:00:01Z");
        assert_eq!(v.grant_id(), "u1");
        assert_eq!(v.grant_id(), usage::grant_id(&typed(&claim)));
        let g = v.grant.expect("valid").expect("allocated");
        assert_eq!((g.devices[0].memory, g.devices[0].cores), (4 << 30, 10));

        let mut other = claim.clone();
        other["metadata"]["finalizers"] = json!([]);
        other["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] =
            json!("gpu.fgpu.dev");
        other["status"] = json!({});
        let v = ClaimView::of_json(&other, &DriverName::default(), &inv);
        assert!(!v.ours && !v.allocated && !v.reserved && !v.shared && v.node.is_none());
        assert!(matches!(v.grant, Ok(None)));
        // Without a UID the grant is known by the claim's key, as usage::grant_id says.
        other["metadata"]["uid"] = json!("");
        let v = ClaimView::of_json(&other, &DriverName::default(), &inv);
        assert_eq!(
            (v.grant_id(), usage::grant_id(&typed(&other))),
            ("ns/c".into(), "ns/c".into())
        );
    }
}
