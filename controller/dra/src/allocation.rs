//! A chosen [`Placement`] → the `status.allocation` to write, and the ledger [`Grant`] it
//! stands for; a claim's chosen MIG placements → its `status.allocation` ([`mig`]).
//!
//! What kube-scheduler would write (reference `dra.md` §4): one result per chosen GPU
//! (`request`, `driver`, `pool` = node, `device`), the class's `spec.config` copied with
//! `source: FromClass` (for the request), the claim's `spec.devices.config` copied
//! with `source: FromClaim`, then one more `FromClaim` entry of this driver with the
//! granted memory and cores (it comes last, so it wins on the node side), and the node
//! selector `matchFields metadata.name In [node]`. With consumable capacity each result also
//! gets a fresh `shareID` (UUID v4) and the full `consumedCapacity` (`memory` and `cores`,
//! zero included), so that kube-scheduler counts it as a share and not as the whole device.
//! The shape is the same in `v1`, `v1beta2` and `v1beta1`.

use fgpu_api::dra::claim::OpaqueConfig;
use fgpu_api::names::capacity;
use fgpu_api::quantity::format_u64;
use fgpu_driver::engine::{GpuShare, Inventory, Placement};
use fgpu_driver::ledger::{DeviceGrant, Grant};
use serde_json::{Value, json};

use crate::ApiVersion;
use crate::request::PendingClaim;

/// The allocation to write for `pending` placed at `placement` on `inventory`.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    /// `status.allocation`.
    pub allocation: Value,
    /// The grant to record in the ledger (id = the claim's UID).
    pub grant: Grant,
}

impl Allocation {
    /// A merge patch of the claim's status carrying the allocation, for `api`.
    pub fn status_patch(&self, api: ApiVersion) -> Value {
        json!({
            "apiVersion": api.api_version(),
            "kind": "ResourceClaim",
            "status": {"allocation": self.allocation},
        })
    }
}

/// Builds the allocation. `consumable`: the cluster has consumable capacity (the slices
/// were kept with `allowMultipleAllocations`).
pub fn build(
    driver: &str,
    inventory: &Inventory,
    pending: &PendingClaim,
    placement: &Placement,
    consumable: bool,
) -> Allocation {
    let grant = Grant::from_placement(pending.id.clone(), inventory, &pending.request, placement);
    let (allocation, devices) = assemble(driver, &[(pending, grant.clone())], consumable);
    debug_assert_eq!(devices, grant.devices);
    Allocation { allocation, grant }
}

/// The allocation of a claim whose requests were placed one by one: `parts` pairs each
/// request (in the claim's order) with its grant, all on one node. Results follow the
/// requests; the configuration is every request's class entries, the claim's entries once,
/// then one granted entry per request. Returns `status.allocation` and the devices of all
/// parts (the claim's grant). `parts` must not be empty.
pub fn assemble(
    driver: &str,
    parts: &[(&PendingClaim, Grant)],
    consumable: bool,
) -> (Value, Vec<DeviceGrant>) {
    let node = parts
        .first()
        .map(|(_, g)| g.node.clone())
        .unwrap_or_default();
    let mut results = Vec::new();
    let mut devices = Vec::new();
    for (pending, grant) in parts {
        for d in &grant.devices {
            let mut r = json!({
                "request": pending.request_name,
                "driver": driver,
                "pool": grant.node,
                "device": d.gpu,
            });
            if consumable {
                r["shareID"] = json!(uuid::Uuid::new_v4().to_string());
                r["consumedCapacity"] = json!({
                    capacity::MEMORY: format_u64(d.memory),
                    capacity::CORES: d.cores.to_string(),
                });
            }
            results.push(r);
            devices.push(d.clone());
        }
    }
    let pendings: Vec<&PendingClaim> = parts.iter().map(|(p, _)| *p).collect();
    let mut config = copied_config(&pendings);
    // Every device of one request gets the same share (the engine places `count` equal
    // shares), so one entry per request carries it. Whole GPUs may differ in size: their
    // entry leaves memory unset, which reads as "all of the device's memory".
    for (pending, grant) in parts {
        let Some(d) = grant.devices.first() else {
            continue;
        };
        let mut granted = pending.config.clone();
        granted.memory = match pending.request.share {
            GpuShare::Whole => None,
            _ => Some(d.memory),
        };
        granted.cores = u8::try_from(d.cores)
            .ok()
            .and_then(fgpu_api::config::CorePercent::new);
        config.push(json!({
            "source": "FromClaim",
            "requests": [pending.request_name],
            "opaque": {"driver": driver, "parameters": granted.to_value()},
        }));
    }
    let allocation = json!({
        "devices": {"results": results, "config": config},
        "nodeSelector": node_selector(&node),
    });
    (allocation, devices)
}

/// The configuration every allocation copies: each request's class entries
/// (`FromClass`), then the claim's entries once (`FromClaim`).
fn copied_config(pendings: &[&PendingClaim]) -> Vec<Value> {
    let copy = |opaque: Option<&OpaqueConfig>, source: &str, requests: Value| {
        let mut c = json!({"source": source, "requests": requests});
        if let Some(o) = opaque {
            c["opaque"] = json!(o);
        }
        c
    };
    let mut config: Vec<Value> = Vec::new();
    for pending in pendings {
        config.extend(pending.class_config.iter().map(|e| {
            copy(
                e.opaque.as_ref(),
                "FromClass",
                json!([pending.request_name]),
            )
        }));
    }
    let claim_config = pendings.first().map(|p| p.claim_config.as_slice());
    config.extend(
        claim_config
            .unwrap_or_default()
            .iter()
            .map(|e| copy(e.opaque.as_ref(), "FromClaim", json!(e.requests))),
    );
    config
}

/// `nodeSelector` for an allocation on `node`.
fn node_selector(node: &str) -> Value {
    json!({"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]})
}

/// One MIG placement of a claim's request: the request, the node and the placement
/// device ([`crate::mig::Chosen`]).
pub type MigPart<'p> = (&'p PendingClaim, crate::mig::Chosen);

/// The allocation of a claim of the MIG class placed as `parts` (each request's
/// placements, in the claim's order, all on one node): one result per placement device,
/// the configuration copied as for a share, the node selector. No granted entry and no
/// `consumedCapacity`: a placement is allocated whole, and the instance's memory is its
/// profile's. `parts` must not be empty.
pub fn mig(driver: &str, parts: &[MigPart<'_>]) -> Value {
    let node = parts.first().map(|(_, c)| c.node.as_str()).unwrap_or("");
    let results: Vec<Value> = parts
        .iter()
        .map(|(p, c)| {
            json!({
                "request": p.request_name,
                "driver": driver,
                "pool": c.node,
                "device": c.device,
            })
        })
        .collect();
    let mut pendings: Vec<&PendingClaim> = Vec::new();
    for (p, _) in parts {
        if !pendings.iter().any(|q| q.request_name == p.request_name) {
            pendings.push(p);
        }
    }
    json!({
        "devices": {"results": results, "config": copied_config(&pendings)},
        "nodeSelector": node_selector(node),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::from_claim;
    use crate::usage::claim_grant;
    use fgpu_api::names::DriverName;
    use fgpu_driver::engine::{Gpu, Node, Policy};

    const DRIVER: &str = "gpu.fgpu.dev";

    /// The JSON claim `c` typed, as the daemon reads it.
    fn typed(c: &Value) -> fgpu_api::dra::claim::ResourceClaim {
        crate::usage::typed(c).unwrap()
    }

    fn inventory() -> Inventory {
        Inventory {
            nodes: vec![Node::new(
                "node-a",
                vec![
                    Gpu::new("gpu-0", "H100", 80 << 30),
                    Gpu::new("gpu-1", "A100", 40 << 30),
                ],
            )],
        }
    }

    fn pending(request: Value) -> PendingClaim {
        let c = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}], "config": [
                {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                    "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "priority": "high"}}},
                {"opaque": {"driver": "net.example.com", "parameters": {"mtu": 9000}}}]}}
        });
        from_claim(
            &typed(&c),
            &Default::default(),
            "ns/p",
            &DriverName::default(),
            Policy::BINPACK,
        )
        .unwrap()
    }

    #[test]
    fn class_config_is_copied_from_class_and_counts_in_the_ledger() {
        let class = json!({"metadata": {"name": "shared.gpu.fgpu.dev"}, "spec": {"config": [
            {"opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "cores": 25}}}]}});
        let c = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "shared.gpu.fgpu.dev",
                "capacity": {"requests": {"memory": "3Gi"}}}}]}}
        });
        let class: fgpu_api::dra::class::DeviceClass = serde_json::from_value(class).unwrap();
        let p = crate::request::requests_in_class(
            &typed(&c),
            Some(&class),
            &Default::default(),
            "ns/p",
            &DriverName::default(),
            Policy::BINPACK,
        )
        .unwrap()
        .remove(0);
        let placement = Placement {
            node: 0,
            gpus: vec![0],
            score: 0.0,
        };
        let a = build(DRIVER, &inventory(), &p, &placement, false);
        let config = a.allocation["devices"]["config"].as_array().unwrap();
        assert_eq!(config[0]["source"], "FromClass");
        assert_eq!(config[0]["requests"], json!(["gpu"]));
        assert_eq!(config[0]["opaque"]["parameters"]["cores"], 25);
        let mut claim = c.clone();
        claim["status"]["allocation"] = a.allocation.clone();
        let g = claim_grant(&typed(&claim), DRIVER, &inventory())
            .unwrap()
            .unwrap();
        assert_eq!((g.devices[0].memory, g.devices[0].cores), (3 << 30, 25));
    }

    #[test]
    fn share_with_and_without_consumable_capacity() {
        let p = pending(json!({"deviceClassName": "shared.gpu.fgpu.dev",
            "capacity": {"requests": {"memory": "10Gi", "cores": "30"}}}));
        let placement = Placement {
            node: 0,
            gpus: vec![1],
            score: 0.0,
        };
        for consumable in [false, true] {
            let a = build(DRIVER, &inventory(), &p, &placement, consumable);
            let r = &a.allocation["devices"]["results"][0];
            assert_eq!(
                (&r["request"], &r["driver"], &r["pool"], &r["device"]),
                (
                    &json!("gpu"),
                    &json!(DRIVER),
                    &json!("node-a"),
                    &json!("gpu-1")
                )
            );
            if consumable {
                assert_eq!(
                    r["consumedCapacity"],
                    json!({"memory": "10Gi", "cores": "30"})
                );
                let id = uuid::Uuid::parse_str(r["shareID"].as_str().unwrap()).unwrap();
                assert_eq!(id.get_version_num(), 4);
            } else {
                assert!(
                    r.get("shareID").is_none() && r.get("consumedCapacity").is_none(),
                    "{r}"
                );
            }
            assert_eq!(
                a.allocation["devices"]["config"],
                json!([
                    {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                        "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "priority": "high"}}},
                    {"source": "FromClaim", "requests": [], "opaque": {"driver": "net.example.com", "parameters": {"mtu": 9000}}},
                    {"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                        "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig",
                        "memory": "10Gi", "cores": 30, "priority": "high"}}},
                ])
            );
            assert_eq!(
                a.allocation["nodeSelector"],
                json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]})
            );
            let mut claim = json!({"metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"}});
            claim["status"]["allocation"] = a.allocation.clone();
            assert_eq!(
                claim_grant(&typed(&claim), DRIVER, &inventory()).unwrap(),
                Some(a.grant.clone()),
                "read back"
            );
            assert_eq!(
                a.status_patch(crate::ApiVersion::V1beta1)["apiVersion"],
                "resource.k8s.io/v1beta1"
            );
        }
    }

    #[test]
    fn whole_gpus_of_different_sizes_read_back_whole() {
        let p = pending(json!({"deviceClassName": "shared.gpu.fgpu.dev", "count": 2}));
        let placement = Placement {
            node: 0,
            gpus: vec![0, 1],
            score: 0.0,
        };
        for consumable in [false, true] {
            let a = build(DRIVER, &inventory(), &p, &placement, consumable);
            let sizes: Vec<_> = a
                .grant
                .devices
                .iter()
                .map(|d| (d.memory, d.cores))
                .collect();
            assert_eq!(sizes, [(80 << 30, 100), (40 << 30, 100)]);
            let last = &a.allocation["devices"]["config"][2]["opaque"]["parameters"];
            assert!(last.get("memory").is_none(), "{last}");
            let mut claim = json!({"metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"}});
            claim["status"]["allocation"] = a.allocation.clone();
            assert_eq!(
                claim_grant(&typed(&claim), DRIVER, &inventory()).unwrap(),
                Some(a.grant)
            );
        }
    }
}
