//! A `resource.k8s.io` ResourceClaim, typed and tolerant: identity and allocation, the
//! parts the node side reads (the kubelet plugin prepares claims from it).
//!
//! Minimal serde structs rather than `k8s-openapi` types: the fields used here have the same
//! JSON shape in `v1`, `v1beta2` and `v1beta1` (1.32+), unknown fields are ignored, and the
//! crate does not have to compile the whole Kubernetes API for four paths. Quantities stay
//! strings; the kubelet plugin's `grant` parses them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A ResourceClaim, reduced to identity and allocation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaim {
    /// Name, namespace and UID.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The claim's status; `None` before the API server or an allocator set one.
    #[serde(default)]
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

    /// Whether `status.allocation` is set (possibly without devices).
    pub fn is_allocated(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.allocation.is_some())
    }
}

/// `metadata`: only what identifies the claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// `metadata.name`.
    #[serde(default)]
    pub name: String,
    /// `metadata.namespace`.
    #[serde(default)]
    pub namespace: String,
    /// `metadata.uid`.
    #[serde(default)]
    pub uid: String,
}

/// `status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    /// `status.allocation`.
    #[serde(default)]
    pub allocation: Option<Allocation>,
    /// `status.reservedFor`: the consumers (pods) the claim is reserved for. The node
    /// monitor maps a process's pod to its claims through it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<ConsumerReference>,
}

/// One entry of `status.reservedFor`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerReference {
    /// API group of the consumer; empty for core (pods).
    #[serde(default)]
    pub api_group: String,
    /// `pods` for a pod.
    #[serde(default)]
    pub resource: String,
    /// The consumer's name (in the claim's namespace).
    #[serde(default)]
    pub name: String,
    /// The consumer's UID.
    #[serde(default)]
    pub uid: String,
}

/// `status.allocation`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// `status.allocation.devices`.
    #[serde(default)]
    pub devices: Option<DeviceAllocation>,
}

/// `status.allocation.devices`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceAllocation {
    /// One entry per allocated device (or share of one).
    #[serde(default)]
    pub results: Vec<DeviceResult>,
    /// Class and claim configuration copied in by the allocator, class entries first.
    #[serde(default)]
    pub config: Vec<AllocationConfig>,
}

/// `status.allocation.devices.results[i]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceResult {
    /// The request (`<req>` or `<req>/<subrequest>`).
    #[serde(default)]
    pub request: String,
    /// The driver that owns the device.
    #[serde(default)]
    pub driver: String,
    /// The pool (for fgpu: the node name).
    #[serde(default)]
    pub pool: String,
    /// The device name in the pool (`gpu-<minor>`).
    #[serde(default)]
    pub device: String,
    /// Set for a share of a device that allows multiple allocations (1.34+).
    #[serde(default, rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Capacity taken by this share, quantity strings keyed by capacity name (1.34+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumed_capacity: Option<BTreeMap<String, String>>,
    /// Admin access: the device is reached for monitoring, not allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
}

/// `status.allocation.devices.config[i]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationConfig {
    /// `FromClass` or `FromClaim`.
    #[serde(default)]
    pub source: String,
    /// Requests the entry applies to; empty = all.
    #[serde(default)]
    pub requests: Vec<String>,
    /// Opaque, driver-specific parameters.
    #[serde(default)]
    pub opaque: Option<OpaqueConfig>,
}

/// `source` of configuration copied from the DeviceClass.
pub const SOURCE_FROM_CLASS: &str = "FromClass";
/// `source` of configuration from the claim itself.
pub const SOURCE_FROM_CLAIM: &str = "FromClaim";

/// `opaque`: parameters for one driver.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpaqueConfig {
    /// The driver the parameters are for.
    #[serde(default)]
    pub driver: String,
    /// The parameters, any JSON.
    #[serde(default)]
    pub parameters: serde_json::Value,
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
}
