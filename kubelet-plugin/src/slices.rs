//! The node's ResourceSlice, built from its GPU inventory. Pure: JSON in, JSON out.
//!
//! One slice per node, `<node>-<driver>`, with one pool named after the node and owned by
//! the Node object. Per healthy GPU a device `gpu-<minor>` with attributes `type`, `uuid`,
//! `productName`, `architecture`, `cudaComputeCapability` and `driverVersion` (versions),
//! `index`, `numaNode`, `resource.kubernetes.io/pcieRoot`, `resource.kubernetes.io/pciBusID`,
//! `enforcement` (`driver` where the node's driver limits each share's memory, else `shim`),
//! and capacities `memory` (bytes) and `cores` (100).
//!
//! An unhealthy GPU is published with a device taint ([`DeviceTaint`], key
//! `fgpu.dev/unhealthy`, value the fault, effect by severity) where the API server keeps
//! taints (DRADeviceTaints: GA in 1.37, gated before); where it drops them
//! ([`kept_taints`] reads the stored slice back), and when no taint is given for it, the
//! GPU is left out so that nothing new is allocated on it.
//!
//! With consumable capacity (1.34+ API server with `DRAConsumableCapacity`), each device
//! also carries `allowMultipleAllocations: true` and request policies: `memory` default the
//! whole GPU, at least 256Mi in steps of 1Mi; `cores` default 0, 0 to 100 in steps of 1. A
//! request without capacity (the whole-GPU class) thus takes all memory and leaves no room
//! for shares; quota requests share the card. The API server silently drops fields of a
//! disabled gate, so whether it kept them is read back from the stored slice
//! ([`kept_consumable_capacity`]).

use std::collections::BTreeMap;

use fgpu_api::names::{DriverName, attr, capacity};
use fgpu_api::quantity::format_u64;
use fgpu_driver::device::{Gpu, NodeInventory};
use serde_json::{Map, Value, json};

use crate::edits::device_name;

/// Smallest memory share a request can get.
pub const MIN_MEMORY_SHARE: u64 = 256 << 20;
/// Granularity of memory shares.
pub const MEMORY_STEP: u64 = 1 << 20;

/// The `resource.k8s.io` versions the plugin speaks, newest first.
pub use fgpu_api::dra::ApiVersion;

/// Semantic version for a version attribute: `9.0` → `9.0.0`, `535.104.05` → `535.104.5`
/// (leading zeros are not allowed in semver). `None` if the parts are not numbers.
pub fn semver(text: &str) -> Option<String> {
    let parts: Vec<u64> = text
        .trim()
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    match parts.as_slice() {
        [major] => Some(format!("{major}.0.0")),
        [major, minor] => Some(format!("{major}.{minor}.0")),
        [major, minor, patch] => Some(format!("{major}.{minor}.{patch}")),
        _ => None,
    }
}

/// A taint on one device of the slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTaint {
    /// Qualified key ([`fgpu_api::names::taint::UNHEALTHY`]).
    pub key: String,
    /// A label value naming the cause.
    pub value: String,
    /// `None`, `NoSchedule` or `NoExecute`.
    pub effect: &'static str,
    /// RFC 3339, seconds: when the GPU turned unhealthy (set by the plugin, so that a
    /// rebuilt slice compares equal to the stored one).
    pub time_added: String,
}

fn device_json(gpu: &Gpu, api: ApiVersion, consumable: bool, taint: Option<&DeviceTaint>) -> Value {
    let mut attributes = Map::new();
    let mut put = |name: &str, kind: &str, value: Value| {
        attributes.insert(name.to_owned(), json!({ kind: value }));
    };
    put(attr::TYPE, "string", json!(attr::TYPE_GPU));
    put(attr::UUID, "string", json!(gpu.uuid));
    put(attr::PRODUCT_NAME, "string", json!(gpu.product_name));
    put(
        attr::ARCHITECTURE,
        "string",
        json!(gpu.architecture().as_str()),
    );
    if let Some(v) = semver(&gpu.compute_capability.to_string()) {
        put(attr::CUDA_COMPUTE_CAPABILITY, "version", json!(v));
    }
    if let Some(v) = semver(&gpu.driver_version) {
        put(attr::DRIVER_VERSION, "version", json!(v));
    }
    put(attr::INDEX, "int", json!(gpu.index));
    if let Some(n) = gpu.numa_node {
        put(attr::NUMA_NODE, "int", json!(n));
    }
    if let Some(root) = &gpu.pcie_root {
        put(attr::PCIE_ROOT, "string", json!(root));
    }
    put(attr::PCI_BUS_ID, "string", json!(gpu.pci_bus_id));
    put(attr::ENFORCEMENT, "string", json!(gpu.enforcement.as_str()));

    let memory = format_u64(gpu.memory_bytes);
    let cores = capacity::CORES_PER_GPU.to_string();
    let capacities = if consumable {
        json!({
            capacity::MEMORY: {"value": memory, "requestPolicy": {
                "default": memory,
                "validRange": {"min": format_u64(MIN_MEMORY_SHARE), "step": format_u64(MEMORY_STEP)}}},
            capacity::CORES: {"value": cores, "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": cores, "step": "1"}}},
        })
    } else {
        json!({
            capacity::MEMORY: {"value": memory},
            capacity::CORES: {"value": cores},
        })
    };
    let mut body = Map::new();
    body.insert("attributes".into(), Value::Object(attributes));
    body.insert("capacity".into(), capacities);
    if consumable {
        body.insert("allowMultipleAllocations".into(), json!(true));
    }
    if let Some(t) = taint {
        body.insert(
            "taints".into(),
            json!([{"key": t.key, "value": t.value, "effect": t.effect, "timeAdded": t.time_added}]),
        );
    }
    match api {
        ApiVersion::V1 | ApiVersion::V1beta2 => {
            body.insert("name".into(), json!(device_name(gpu)));
            Value::Object(body)
        }
        ApiVersion::V1beta1 => json!({"name": device_name(gpu), "basic": body}),
    }
}

/// The name of the node's slice: `<node>-<driver>`.
pub fn slice_name(node: &str, driver: &DriverName) -> String {
    format!("{node}-{driver}")
}

/// The node's ResourceSlice in `api`'s shape. `node_uid` makes the Node its owner (the
/// slice goes away with the node); `generation` is the pool generation (bump on change).
/// `consumable` publishes the devices as shareable (consumable capacity).
pub fn build_slice(
    driver: &DriverName,
    inventory: &NodeInventory,
    node_uid: &str,
    generation: i64,
    api: ApiVersion,
    consumable: bool,
) -> Value {
    build_slice_with_taints(
        driver, inventory, node_uid, generation, api, consumable, None,
    )
}

/// [`build_slice`], with `taints` (by GPU UUID) for the unhealthy GPUs: each unhealthy GPU
/// that has one is published with it; the others are left out. `None`: every unhealthy GPU
/// is left out (the API server drops taints).
pub fn build_slice_with_taints(
    driver: &DriverName,
    inventory: &NodeInventory,
    node_uid: &str,
    generation: i64,
    api: ApiVersion,
    consumable: bool,
    taints: Option<&BTreeMap<String, DeviceTaint>>,
) -> Value {
    let devices: Vec<Value> = inventory
        .gpus
        .iter()
        .filter_map(|g| {
            if g.is_healthy() {
                return Some(device_json(g, api, consumable, None));
            }
            let taint = taints?.get(&g.uuid)?;
            Some(device_json(g, api, consumable, Some(taint)))
        })
        .collect();
    json!({
        "apiVersion": api.api_version(),
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(&inventory.node, driver),
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": inventory.node, "uid": node_uid,
                "controller": true,
            }],
        },
        "spec": {
            "driver": driver.as_str(),
            "nodeName": inventory.node,
            "pool": {"name": inventory.node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        }
    })
}

/// Whether the spec of two slices differs in what consumers see (devices), ignoring the
/// pool generation: a change means the generation must be bumped.
pub fn devices_changed(old: &Value, new: &Value) -> bool {
    old["spec"]["devices"] != new["spec"]["devices"]
        || old["spec"]["nodeName"] != new["spec"]["nodeName"]
}

/// Whether the API server kept consumable capacity in a slice written with it: every
/// device still has `allowMultipleAllocations: true`. `Some(false)` means the gate is off;
/// the plugin then publishes plain devices (for the controller mode). `None`: the slice has
/// no devices, so it cannot tell.
pub fn kept_consumable_capacity(stored: &Value) -> Option<bool> {
    let devices = stored["spec"]["devices"].as_array()?;
    if devices.is_empty() {
        return None;
    }
    Some(devices.iter().all(|d| {
        let flag = |v: &Value| v["allowMultipleAllocations"] == json!(true);
        flag(d) || flag(&d["basic"])
    }))
}

/// Whether the API server kept the device taints of a slice written with some: `None` if
/// `written` has none (nothing to tell by).
pub fn kept_taints(written: &Value, stored: &Value) -> Option<bool> {
    let count = |v: &Value| {
        v["spec"]["devices"].as_array().map_or(0, |ds| {
            ds.iter()
                .filter(|d| {
                    let has = |x: &Value| x["taints"].as_array().is_some_and(|t| !t.is_empty());
                    has(d) || has(&d["basic"])
                })
                .count()
        })
    };
    let want = count(written);
    (want > 0).then(|| count(stored) == want)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::tests::gpu;
    use fgpu_driver::device::Health;

    fn inventory() -> NodeInventory {
        let mut g0 = gpu(0, "0000:1b:00.0");
        g0.pcie_root = Some("pci0000:15".into());
        g0.driver_version = "535.104.05".into();
        let mut g1 = gpu(1, "0000:2b:00.0");
        g1.numa_node = None;
        let mut g2 = gpu(2, "0000:3b:00.0");
        g2.health = Health::Unhealthy {
            reason: "XID 79".into(),
        };
        NodeInventory::new("node-a", vec![g0, g1, g2])
    }

    #[test]
    fn semver_table() {
        let cases = [
            ("9.0", Some("9.0.0")),
            ("12", Some("12.0.0")),
            ("550.54.15", Some("550.54.15")),
            ("535.104.05", Some("535.104.5")),
            ("1.2.3.4", None),
            ("r535", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(semver(input).as_deref(), want, "{input}");
        }
    }

    #[test]
    fn v1_slice_with_consumable_capacity() {
        let s = build_slice(
            &DriverName::default(),
            &inventory(),
            "node-uid",
            3,
            ApiVersion::V1,
            true,
        );
        assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(s["metadata"]["name"], "node-a-gpu.fgpu.dev");
        assert_eq!(
            s["metadata"]["ownerReferences"][0],
            json!({"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid", "controller": true})
        );
        assert_eq!(
            s["spec"]["pool"],
            json!({"name": "node-a", "generation": 3, "resourceSliceCount": 1})
        );
        assert_eq!(s["spec"]["driver"], "gpu.fgpu.dev");
        assert_eq!(s["spec"]["nodeName"], "node-a");
        let devices = s["spec"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 2, "the unhealthy GPU is left out");
        let d0 = &devices[0];
        assert_eq!(d0["name"], "gpu-0");
        assert_eq!(d0["allowMultipleAllocations"], true);
        let a = &d0["attributes"];
        assert_eq!(a["type"], json!({"string": "gpu"}));
        assert_eq!(
            a["uuid"]["string"],
            "GPU-00000000-0000-0000-0000-000000000000"
        );
        assert_eq!(a["productName"]["string"], "NVIDIA H100 80GB HBM3");
        assert_eq!(a["architecture"]["string"], "Hopper");
        assert_eq!(a["cudaComputeCapability"], json!({"version": "9.0.0"}));
        assert_eq!(a["driverVersion"], json!({"version": "535.104.5"}));
        assert_eq!(a["index"], json!({"int": 0}));
        assert_eq!(a["numaNode"], json!({"int": 0}));
        assert_eq!(
            a["resource.kubernetes.io/pcieRoot"],
            json!({"string": "pci0000:15"})
        );
        assert_eq!(
            a["resource.kubernetes.io/pciBusID"],
            json!({"string": "0000:1b:00.0"})
        );
        assert_eq!(
            d0["capacity"],
            json!({
                "memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi",
                    "validRange": {"min": "256Mi", "step": "1Mi"}}},
                "cores": {"value": "100", "requestPolicy": {"default": "0",
                    "validRange": {"min": "0", "max": "100", "step": "1"}}},
            })
        );
        let a1 = &devices[1]["attributes"];
        assert!(
            a1.get("numaNode").is_none() && a1.get("resource.kubernetes.io/pcieRoot").is_none()
        );
        assert_eq!(kept_consumable_capacity(&s), Some(true));
        assert_eq!(a["enforcement"], json!({"string": "shim"}));
        // A GPU whose driver limits memory says so.
        let mut inv = inventory();
        inv.gpus[0].enforcement = fgpu_driver::device::Enforcement::Driver;
        let s = build_slice(&DriverName::default(), &inv, "u", 1, ApiVersion::V1, true);
        let devices = s["spec"]["devices"].as_array().unwrap();
        assert_eq!(
            devices[0]["attributes"]["enforcement"],
            json!({"string": "driver"})
        );
        assert_eq!(
            devices[1]["attributes"]["enforcement"],
            json!({"string": "shim"})
        );
    }

    #[test]
    fn plain_and_v1beta1_slices() {
        let inv = inventory();
        let d = DriverName::default();
        let plain = build_slice(&d, &inv, "u", 1, ApiVersion::V1beta2, false);
        assert_eq!(plain["apiVersion"], "resource.k8s.io/v1beta2");
        let d0 = &plain["spec"]["devices"][0];
        assert!(d0.get("allowMultipleAllocations").is_none());
        assert_eq!(
            d0["capacity"],
            json!({"memory": {"value": "80Gi"}, "cores": {"value": "100"}})
        );
        assert_eq!(kept_consumable_capacity(&plain), Some(false));

        let old = build_slice(&d, &inv, "u", 1, ApiVersion::V1beta1, false);
        let d0 = &old["spec"]["devices"][0];
        assert_eq!(d0["name"], "gpu-0");
        assert_eq!(
            d0["basic"]["attributes"]["uuid"]["string"],
            "GPU-00000000-0000-0000-0000-000000000000"
        );
        assert_eq!(d0["basic"]["capacity"]["memory"]["value"], "80Gi");
        assert!(d0.get("attributes").is_none());

        // The API server dropping the gated field is detected.
        let mut stored = build_slice(&d, &inv, "u", 1, ApiVersion::V1, true);
        stored["spec"]["devices"][1]
            .as_object_mut()
            .unwrap()
            .remove("allowMultipleAllocations");
        assert_eq!(kept_consumable_capacity(&stored), Some(false));
        // No healthy GPU: nothing to tell by.
        let mut none = inv.clone();
        for g in &mut none.gpus {
            g.health = Health::Unhealthy { reason: "x".into() };
        }
        let empty = build_slice(&d, &none, "u", 1, ApiVersion::V1, true);
        assert_eq!(kept_consumable_capacity(&empty), None);
    }

    #[test]
    fn change_detection_ignores_generation() {
        let d = DriverName::default();
        let inv = inventory();
        let a = build_slice(&d, &inv, "u", 1, ApiVersion::V1, true);
        let b = build_slice(&d, &inv, "u", 2, ApiVersion::V1, true);
        assert!(!devices_changed(&a, &b));
        let mut inv2 = inv.clone();
        inv2.gpus[1].health = Health::Unhealthy { reason: "x".into() };
        let c = build_slice(&d, &inv2, "u", 2, ApiVersion::V1, true);
        assert!(devices_changed(&a, &c));
    }
}
