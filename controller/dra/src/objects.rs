//! What claims and pods say, in every served version: identities ([`ObjectId`]), the
//! classes a claim asks for and the node of its allocation (read from the typed claim,
//! [`fgpu_api::dra::claim`]), the gate and claims of a pod (read from its JSON); and
//! whether slices (typed, [`ResourceSlice`]) kept consumable capacity. Pure functions, used
//! by the views, the cache and the planner alike.

use std::borrow::Borrow;

use fgpu_api::dra::claim::{DeviceClaim, ObjectMeta, ResourceClaim};
use fgpu_api::dra::slice::{Device, ResourceSlice};
use fgpu_api::names::DriverName;
use serde_json::Value;

/// A pod or a claim, as Events and writes name it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectId {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// The resource version the action was planned from.
    pub resource_version: String,
}

impl ObjectId {
    /// The identity of `obj`.
    pub fn of(obj: &Value) -> Self {
        let m = &obj["metadata"];
        let s = |f: &str| m[f].as_str().unwrap_or_default().to_owned();
        Self {
            namespace: s("namespace"),
            name: s("name"),
            uid: s("uid"),
            resource_version: s("resourceVersion"),
        }
    }

    /// The identity of an object with `metadata` `m` (a typed claim's).
    pub fn of_meta(m: &ObjectMeta) -> Self {
        Self {
            namespace: m.namespace.clone(),
            name: m.name.clone(),
            uid: m.uid.clone(),
            resource_version: m.resource_version.clone(),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Whether any of this driver's slices publishes a device with `allowMultipleAllocations`
/// (`v1beta1` devices under `basic`): the API server kept the field, so the cluster has
/// consumable capacity.
pub fn consumable<S: Borrow<ResourceSlice>>(
    driver: &str,
    slices: impl IntoIterator<Item = S>,
) -> bool {
    slices.into_iter().any(|s| {
        let s = s.borrow();
        s.spec.driver.as_deref() == Some(driver)
            && s.devices().iter().any(Device::allows_multiple_allocations)
    })
}

/// The device class names of a claim's (or a template's inner) `spec.devices.requests`,
/// in every served version (`exactly`, `firstAvailable`, or `v1beta1`'s flat fields).
pub fn request_classes(devices: &DeviceClaim) -> Vec<&str> {
    devices.class_names()
}

/// Whether the claim is the controller's to allocate: it asks for the shared class or the
/// MIG class.
pub fn is_shared(claim: &ResourceClaim, driver: &DriverName) -> bool {
    uses_controller_class(&claim.spec.devices, driver)
}

/// Whether the claim asks for the MIG class (`mig.<driver>`): the controller places it on
/// a MIG placement ([`crate::mig`]), not as a share.
pub fn is_mig(claim: &ResourceClaim, driver: &DriverName) -> bool {
    let class = driver.mig_class();
    request_classes(&claim.spec.devices).contains(&class.as_str())
}

/// Whether a claim's (or a template's inner) requests name a class the controller
/// allocates in controller mode: the shared class or the MIG class. The webhook gates the
/// pods of such claims.
pub fn uses_controller_class(devices: &DeviceClaim, driver: &DriverName) -> bool {
    let (shared, mig) = (driver.shared_class(), driver.mig_class());
    request_classes(devices)
        .iter()
        .any(|c| *c == shared || *c == mig)
}

/// Whether the pod carries the scheduling gate `gate`.
pub fn is_gated(pod: &Value, gate: &str) -> bool {
    pod["spec"]["schedulingGates"]
        .as_array()
        .is_some_and(|g| g.iter().any(|e| e["name"].as_str() == Some(gate)))
}

/// The names of the claims a pod uses, in `spec.resourceClaims` order: `Some(name)` for a
/// claim named directly or generated from a template (from `status.resourceClaimStatuses`),
/// `None` for a template claim not generated yet. Entries whose template needs no claim
/// (`resourceClaimName` null in the status) are left out.
pub fn pod_claim_names(pod: &Value) -> Vec<Option<String>> {
    let statuses = pod["status"]["resourceClaimStatuses"].as_array();
    let mut out = Vec::new();
    for rc in pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(n) = rc["resourceClaimName"].as_str() {
            out.push(Some(n.to_owned()));
            continue;
        }
        let Some(entry) = rc["name"].as_str() else {
            continue;
        };
        match statuses.and_then(|s| s.iter().find(|e| e["name"].as_str() == Some(entry))) {
            // No name: the template produced no claim for this pod.
            Some(st) => {
                if let Some(n) = st["resourceClaimName"].as_str() {
                    out.push(Some(n.to_owned()));
                }
            }
            None => out.push(None),
        }
    }
    out
}

/// The node an allocated claim is bound to (its node selector's `metadata.name`).
pub fn allocated_node(claim: &ResourceClaim) -> Option<&str> {
    claim.allocation_status()?.node_name()
}
