//! A `resource.k8s.io` ResourceClaim, typed and tolerant: what the controller and the
//! kubelet plugin read of one. `metadata` (identity, finalizers, timestamps),
//! `spec.devices` (requests, constraints, configuration: what the controller allocates
//! from) and `status` (the allocation, `reservedFor`, `status.devices`: what the node side
//! prepares from and the controller counts).
//!
//! Minimal serde structs rather than `k8s-openapi` types: the fields used here have the same
//! JSON shape in `v1`, `v1beta2` and `v1beta1` (1.32+) but for one difference, which
//! [`DeviceRequest::exact`] hides (`v1beta1` requests carry their fields directly instead of
//! under `exactly`); and the crate does not have to compile the whole Kubernetes API for a
//! few paths. Tolerant: unknown fields are ignored, absent ones take their default, and a
//! field of the wrong JSON type reads as absent ([`super::tolerant`]), so any JSON object
//! reads as a claim and the code that uses a field says what is wrong with it. Where the
//! controller's message about a bad field quotes its JSON (`count`, `deviceClassName`,
//! `capacity.requests`, a constraint's `requests`) the field stays a `serde_json::Value`.
//! Quantities stay strings; their readers parse them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::tolerant;

/// A ResourceClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaim {
    /// Identity, finalizers and timestamps.
    #[serde(default, deserialize_with = "tolerant::object")]
    pub metadata: ObjectMeta,
    /// What the claim asks for.
    #[serde(
        default,
        deserialize_with = "tolerant::object",
        skip_serializing_if = "ClaimSpec::is_empty"
    )]
    pub spec: ClaimSpec,
    /// The claim's status; `None` before the API server or an allocator set one.
    #[serde(default, deserialize_with = "tolerant::opt_object")]
    pub status: Option<ClaimStatus>,
}

impl ResourceClaim {
    /// `namespace/name`, the way messages name the claim.
    pub fn key(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// The allocation's device part, if the claim is allocated.
    pub fn allocation(&self) -> Option<&DeviceAllocation> {
        self.status.as_ref()?.allocation.as_ref()?.devices.as_ref()
    }

    /// `status.allocation`, if set.
    pub fn allocation_status(&self) -> Option<&Allocation> {
        self.status.as_ref()?.allocation.as_ref()
    }

    /// Whether `status.allocation` is set (possibly without devices).
    pub fn is_allocated(&self) -> bool {
        self.allocation_status().is_some()
    }

    /// Whether `status.reservedFor` names a consumer.
    pub fn is_reserved(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| !s.reserved_for.is_empty())
    }
}

/// `metadata`: identity, finalizers and timestamps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// `metadata.name`.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub name: String,
    /// `metadata.generateName` (a template's claims are named from it).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub generate_name: Option<String>,
    /// `metadata.namespace`.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub namespace: String,
    /// `metadata.uid`.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub uid: String,
    /// `metadata.resourceVersion` ("" when absent).
    #[serde(
        default,
        deserialize_with = "tolerant::string",
        skip_serializing_if = "String::is_empty"
    )]
    pub resource_version: String,
    /// `metadata.creationTimestamp` (RFC 3339).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub creation_timestamp: Option<String>,
    /// `metadata.deletionTimestamp`: set once the object is being deleted.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub deletion_timestamp: Option<String>,
    /// `metadata.finalizers`.
    #[serde(
        default,
        deserialize_with = "tolerant::strings",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub finalizers: Vec<String>,
}

/// `spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSpec {
    /// `spec.devices`.
    #[serde(default, deserialize_with = "tolerant::object")]
    pub devices: DeviceClaim,
}

impl ClaimSpec {
    /// Whether it asks for nothing (left out when a claim is written).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// `spec.devices` of a claim (`spec.spec.devices` of a template): the requests, the
/// constraints between them and their configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClaim {
    /// `requests`.
    #[serde(default, deserialize_with = "tolerant::list")]
    pub requests: Vec<DeviceRequest>,
    /// `constraints`.
    #[serde(default, deserialize_with = "tolerant::list")]
    pub constraints: Vec<DeviceConstraint>,
    /// `config`.
    #[serde(default, deserialize_with = "tolerant::list")]
    pub config: Vec<DeviceClaimConfiguration>,
}

impl DeviceClaim {
    /// The device class names of the requests, in order: each request's (`exactly`, or
    /// `v1beta1`'s flat field) and each of its `firstAvailable` sub-requests'.
    pub fn class_names(&self) -> Vec<&str> {
        let mut out = Vec::new();
        for r in &self.requests {
            out.extend(r.exactly.as_ref().and_then(|e| e.class_name()));
            out.extend(r.flat.class_name());
            for s in r.first_available.iter().flatten() {
                out.extend(s.exact.class_name());
            }
        }
        out
    }
}

/// `spec.devices.requests[i]`: one request, in any served version.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequest {
    /// `name`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    /// `exactly` (`v1`, `v1beta2`).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub exactly: Option<ExactDeviceRequest>,
    /// `firstAvailable`: alternatives, the first that can be allocated wins. `Some` when
    /// the field is there at all (an empty list or another type reads as `Some(empty)`).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_list",
        skip_serializing_if = "Option::is_none"
    )]
    pub first_available: Option<Vec<DeviceSubRequest>>,
    /// `v1beta1`'s fields of the request itself (empty in later versions).
    #[serde(flatten)]
    pub flat: ExactDeviceRequest,
}

impl DeviceRequest {
    /// The "exact" body whichever the version: `exactly` where the request has it, else
    /// the request's own fields (`v1beta1`).
    pub fn exact(&self) -> &ExactDeviceRequest {
        self.exactly.as_ref().unwrap_or(&self.flat)
    }
}

/// `firstAvailable[j]`: one alternative of a request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSubRequest {
    /// `name`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    /// Its other fields, those of an exact request.
    #[serde(flatten)]
    pub exact: ExactDeviceRequest,
}

/// The body of a request (`exactly`, a sub-request, or a `v1beta1` request).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExactDeviceRequest {
    /// `deviceClassName`, as written (messages quote it).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub device_class_name: Value,
    /// `selectors`.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub selectors: Vec<DeviceSelector>,
    /// `allocationMode` (`ExactCount` when absent).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub allocation_mode: Option<String>,
    /// `count`, as written (1 when absent; messages quote a bad one).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub count: Value,
    /// `adminAccess: true`.
    #[serde(
        default,
        deserialize_with = "tolerant::flag",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub admin_access: bool,
    /// `tolerations` of device taints.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tolerations: Vec<DeviceToleration>,
    /// `capacity`.
    #[serde(
        default,
        deserialize_with = "tolerant::object",
        skip_serializing_if = "CapacityRequirements::is_empty"
    )]
    pub capacity: CapacityRequirements,
    /// `derivedAttributes` (1.36+), as written.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub derived_attributes: Vec<Value>,
}

impl ExactDeviceRequest {
    /// `deviceClassName` when it is a string.
    pub fn class_name(&self) -> Option<&str> {
        self.device_class_name.as_str()
    }
}

/// `capacity` of a request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRequirements {
    /// `capacity.requests`: quantities by capacity name, as written; `None` when absent
    /// or not an object.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub requests: Option<serde_json::Map<String, Value>>,
}

impl CapacityRequirements {
    /// Whether it requests nothing.
    pub fn is_empty(&self) -> bool {
        self.requests.is_none()
    }
}

/// `selectors[j]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSelector {
    /// `cel`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub cel: Option<CelDeviceSelector>,
}

/// `selectors[j].cel`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CelDeviceSelector {
    /// `expression`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub expression: Option<String>,
}

/// `tolerations[i]` of a request: a device taint it tolerates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceToleration {
    /// `key` ("" when absent).
    #[serde(default, deserialize_with = "tolerant::string")]
    pub key: String,
    /// `operator` (`Equal` when absent).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub operator: Option<String>,
    /// `value`.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub value: String,
    /// `effect` ("" = every effect).
    #[serde(default, deserialize_with = "tolerant::string")]
    pub effect: String,
}

/// `spec.devices.constraints[i]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceConstraint {
    /// `requests`, as written (messages quote a bad entry).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub requests: Value,
    /// `matchAttribute`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub match_attribute: Option<String>,
    /// Every other field (`distinctAttribute`, ...), as written, in the order a JSON
    /// object keeps its keys.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// `spec.devices.config[i]`: configuration for some (no `requests`: all) requests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClaimConfiguration {
    /// The requests (`<req>` or `<req>/<sub>`) it applies to; empty = all.
    #[serde(default, deserialize_with = "tolerant::strings")]
    pub requests: Vec<String>,
    /// Opaque, driver-specific parameters.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub opaque: Option<OpaqueConfig>,
}

/// `status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    /// `status.allocation`.
    #[serde(default, deserialize_with = "tolerant::opt_object")]
    pub allocation: Option<Allocation>,
    /// `status.reservedFor`: the consumers (pods) the claim is reserved for. The node
    /// monitor maps a process's pod to its claims through it.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub reserved_for: Vec<ConsumerReference>,
    /// `status.devices`: what the drivers report per allocated device.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub devices: Vec<AllocatedDeviceStatus>,
}

/// One entry of `status.reservedFor`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerReference {
    /// API group of the consumer; empty for core (pods).
    #[serde(default, deserialize_with = "tolerant::string")]
    pub api_group: String,
    /// `pods` for a pod.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub resource: String,
    /// The consumer's name (in the claim's namespace).
    #[serde(default, deserialize_with = "tolerant::string")]
    pub name: String,
    /// The consumer's UID.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub uid: String,
}

/// One entry of `status.devices`: a driver's report on one allocated device. What
/// identifies the device is read ([`super::same_device`] matches it to its result), and of
/// `data` what fgpu's node monitor reports of the load (`docs/node-monitor.md`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedDeviceStatus {
    /// The driver.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub driver: String,
    /// The pool.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub pool: String,
    /// The device.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub device: String,
    /// The share, for a device with several allocations.
    #[serde(
        default,
        rename = "shareID",
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub share_id: Option<String>,
    /// `data`, as fgpu's node monitor writes it; `None` when absent or not an object.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub data: Option<DeviceStatusData>,
}

/// What is read of `status.devices[i].data`: the measured load. Other fields (granted and
/// used memory, processes, ...) are not read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatusData {
    /// `smUtilizationPercent`: the claim's SM utilisation on the GPU; `None` when absent
    /// or not an integer.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_int",
        skip_serializing_if = "Option::is_none"
    )]
    pub sm_utilization_percent: Option<i64>,
    /// `sampledAt` (RFC 3339): when it was measured; `None` when absent or not a string.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub sampled_at: Option<String>,
}

/// `status.allocation`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// `status.allocation.devices`.
    #[serde(default, deserialize_with = "tolerant::opt_object")]
    pub devices: Option<DeviceAllocation>,
    /// `status.allocation.nodeSelector`: where the claim's devices are.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub node_selector: Option<NodeSelector>,
    /// `status.allocation.allocationTimestamp` (1.34+).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub allocation_timestamp: Option<String>,
}

impl Allocation {
    /// The node the allocation is bound to: the first `matchFields` requirement on
    /// `metadata.name` of the node selector, its first value.
    pub fn node_name(&self) -> Option<&str> {
        self.node_selector
            .as_ref()?
            .node_selector_terms
            .iter()
            .flat_map(|t| &t.match_fields)
            .find(|f| f.key == "metadata.name")?
            .values
            .first()
            .map(String::as_str)
    }
}

/// A node selector (`status.allocation.nodeSelector`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelector {
    /// `nodeSelectorTerms`: any may match.
    #[serde(default, deserialize_with = "tolerant::list")]
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

/// One term of a [`NodeSelector`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    /// `matchFields`: requirements on the node object's fields.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub match_fields: Vec<NodeSelectorRequirement>,
}

/// One requirement of a [`NodeSelectorTerm`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorRequirement {
    /// The field (`metadata.name`).
    #[serde(default, deserialize_with = "tolerant::string")]
    pub key: String,
    /// `In`, `NotIn`, ...
    #[serde(default, deserialize_with = "tolerant::string")]
    pub operator: String,
    /// The values.
    #[serde(default, deserialize_with = "tolerant::strings")]
    pub values: Vec<String>,
}

/// `status.allocation.devices`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAllocation {
    /// One entry per allocated device (or share of one).
    #[serde(default, deserialize_with = "tolerant::list")]
    pub results: Vec<DeviceResult>,
    /// Class and claim configuration copied in by the allocator, class entries first.
    #[serde(default, deserialize_with = "tolerant::list")]
    pub config: Vec<AllocationConfig>,
}

/// `status.allocation.devices.results[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceResult {
    /// The request (`<req>` or `<req>/<subrequest>`).
    #[serde(default, deserialize_with = "tolerant::string")]
    pub request: String,
    /// The driver that owns the device.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub driver: String,
    /// The pool (for fgpu: the node name).
    #[serde(default, deserialize_with = "tolerant::string")]
    pub pool: String,
    /// The device name in the pool (`gpu-<minor>`).
    #[serde(default, deserialize_with = "tolerant::string")]
    pub device: String,
    /// Set for a share of a device that allows multiple allocations (1.34+).
    #[serde(
        default,
        rename = "shareID",
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub share_id: Option<String>,
    /// Capacity taken by this share, quantity strings keyed by capacity name (1.34+); a
    /// number is kept as JSON spells it.
    #[serde(
        default,
        deserialize_with = "tolerant::quantities",
        skip_serializing_if = "Option::is_none"
    )]
    pub consumed_capacity: Option<BTreeMap<String, String>>,
    /// Admin access: the device is reached for monitoring, not allocated.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_flag",
        skip_serializing_if = "Option::is_none"
    )]
    pub admin_access: Option<bool>,
}

/// `status.allocation.devices.config[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationConfig {
    /// `FromClass` or `FromClaim`.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub source: String,
    /// Requests the entry applies to; empty = all.
    #[serde(default, deserialize_with = "tolerant::strings")]
    pub requests: Vec<String>,
    /// Opaque, driver-specific parameters.
    #[serde(default, deserialize_with = "tolerant::opt_object")]
    pub opaque: Option<OpaqueConfig>,
}

/// `source` of configuration copied from the DeviceClass.
pub const SOURCE_FROM_CLASS: &str = "FromClass";
/// `source` of configuration from the claim itself.
pub const SOURCE_FROM_CLAIM: &str = "FromClaim";

/// `opaque`: parameters for one driver.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpaqueConfig {
    /// The driver the parameters are for.
    #[serde(default, deserialize_with = "tolerant::string")]
    pub driver: String,
    /// The parameters, any JSON.
    #[serde(default)]
    pub parameters: serde_json::Value,
}

impl OpaqueConfig {
    /// Whether parameter `field` is set (present and not `null`).
    pub fn has(&self, field: &str) -> bool {
        self.parameters.get(field).is_some_and(|v| !v.is_null())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_v1_and_v1beta1_shapes_and_ignores_unknown_fields() {
        let v = json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "n1",
                                 "device": "gpu-0", "shareID": "s-1",
                                 "consumedCapacity": {"memory": "10Gi", "cores": "30"},
                                 "tolerations": []}],
                    "config": [{"source": "FromClass", "requests": ["gpu"],
                                "opaque": {"driver": "gpu.fgpu.dev", "parameters": {"a": 1}}}]
                },
                "nodeSelector": {"nodeSelectorTerms": []}
            }, "reservedFor": []}
        });
        let c: ResourceClaim = serde_json::from_value(v).unwrap();
        assert_eq!(c.key(), "ns/c");
        let a = c.allocation().unwrap();
        assert_eq!(a.results[0].share_id.as_deref(), Some("s-1"));
        assert_eq!(
            a.results[0].consumed_capacity.as_ref().unwrap()["cores"],
            "30"
        );
        assert_eq!(a.config[0].source, SOURCE_FROM_CLASS);

        // 1.32 v1beta1: no shareID, no consumedCapacity.
        let old: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "n1", "device": "gpu-1"}]}}}
        }))
        .unwrap();
        assert_eq!(old.allocation().unwrap().results[0].share_id, None);
        let unallocated: ResourceClaim =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "status": {}})).unwrap();
        assert!(!unallocated.is_allocated());
        assert!(unallocated.allocation().is_none());
    }

    #[test]
    fn requests_read_the_same_in_every_version() {
        let v1: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "finalizers": ["f", 3],
                         "deletionTimestamp": "2026-01-01T00:00:00Z", "resourceVersion": "9"},
            "spec": {"devices": {
                "requests": [
                    {"name": "a", "exactly": {"deviceClassName": "x", "count": 2,
                        "capacity": {"requests": {"memory": "1Gi"}},
                        "selectors": [{"cel": {"expression": "true"}}],
                        "tolerations": [{"key": "k", "operator": "Exists"}]}},
                    {"name": "b", "firstAvailable": [{"name": "s", "deviceClassName": "y",
                        "adminAccess": true}]},
                    "not a request"],
                "constraints": [{"requests": ["a"], "matchAttribute": "m",
                                 "distinctAttribute": "d"}],
                "config": [{"requests": ["a"], "opaque": {"driver": "d", "parameters": {"p": 1}}}]
            }}
        }))
        .unwrap();
        assert_eq!(v1.metadata.finalizers, ["f"]);
        assert!(v1.metadata.deletion_timestamp.is_some());
        assert_eq!(v1.metadata.resource_version, "9");
        let d = &v1.spec.devices;
        assert_eq!(d.class_names(), ["x", "y"]);
        let a = d.requests[0].exact();
        assert_eq!((a.count.as_u64(), a.class_name()), (Some(2), Some("x")));
        assert_eq!(a.capacity.requests.as_ref().unwrap()["memory"], "1Gi");
        assert_eq!(a.tolerations[0].operator.as_deref(), Some("Exists"));
        let subs = d.requests[1].first_available.as_ref().unwrap();
        assert!(subs[0].exact.admin_access);
        assert_eq!(d.requests[2], DeviceRequest::default());
        assert_eq!(d.constraints[0].match_attribute.as_deref(), Some("m"));
        assert_eq!(
            d.constraints[0].other.keys().collect::<Vec<_>>(),
            ["distinctAttribute"]
        );
        assert!(d.config[0].opaque.as_ref().unwrap().has("p"));

        // v1beta1: the request's own fields.
        let old: ResourceClaim = serde_json::from_value(json!({"spec": {"devices": {"requests": [
            {"name": "a", "deviceClassName": "x", "allocationMode": "All"}]}}}))
        .unwrap();
        let r = &old.spec.devices.requests[0];
        assert!(r.exactly.is_none() && r.first_available.is_none());
        assert_eq!(r.exact().allocation_mode.as_deref(), Some("All"));
        assert_eq!(old.spec.devices.class_names(), ["x"]);
    }

    #[test]
    fn device_status_reads_the_measured_load_tolerantly() {
        let read = |data: Value| -> Option<DeviceStatusData> {
            let e: AllocatedDeviceStatus = serde_json::from_value(
                json!({"driver": "d", "pool": "n", "device": "gpu-0", "data": data}),
            )
            .unwrap();
            e.data
        };
        let d = read(
            json!({"smUtilizationPercent": 42, "sampledAt": "2026-12-02T07:00:00Z",
                            "usedMemoryBytes": 1}),
        )
        .unwrap();
        assert_eq!(d.sm_utilization_percent, Some(42));
        assert_eq!(d.sampled_at.as_deref(), Some("2026-12-02T07:00:00Z"));
        // Wrong JSON types read as absent; a `data` that is no object reads as none.
        let d = read(json!({"smUtilizationPercent": "42", "sampledAt": 7})).unwrap();
        assert_eq!(d, DeviceStatusData::default());
        assert_eq!(read(json!("x")), None);
    }

    #[test]
    fn status_reads_node_timestamp_and_reservations() {
        let c: ResourceClaim = serde_json::from_value(json!({"status": {
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
            "devices": [{"driver": "d", "pool": "n", "device": "gpu-0", "data": {}}],
            "allocation": {"allocationTimestamp": "2026-01-01T00:00:01Z",
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}}}))
        .unwrap();
        assert!(c.is_allocated() && c.is_reserved());
        let a = c.allocation_status().unwrap();
        assert_eq!(a.node_name(), Some("node-a"));
        assert_eq!(
            a.allocation_timestamp.as_deref(),
            Some("2026-01-01T00:00:01Z")
        );
        assert_eq!(c.status.as_ref().unwrap().devices[0].device, "gpu-0");
        // An empty `data` reads, with nothing in it.
        assert_eq!(
            c.status.as_ref().unwrap().devices[0].data,
            Some(DeviceStatusData::default())
        );
        // A number in consumedCapacity is kept as JSON spells it.
        let n: DeviceResult =
            serde_json::from_value(json!({"consumedCapacity": {"cores": 30}})).unwrap();
        assert_eq!(n.consumed_capacity.unwrap()["cores"], "30");
    }
}
