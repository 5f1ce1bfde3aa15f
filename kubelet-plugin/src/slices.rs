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
//! ([`kept_consumable_capacity`], [`kept_consumable_in`]).
//!
//! Per GPU mode ([`crate::gpu_mode`]): a `shared` GPU is the device above; a `whole` GPU
//! the same device without consumable capacity (only whole allocations); both carry the
//! attribute `mode` (`shared` or `whole`), by which the controller keeps shares off a
//! `whole` GPU where no GPU has consumable capacity; a `mig` GPU
//! placement devices of type `mig`, with a counter set where the API server keeps
//! partitionable devices ([`kept_counters`]), else the admin's fixed layout
//! ([`crate::mig_slice`]). A node with MIG counters has several slices in one pool
//! ([`build_node_slices`]); one without has one, as before.
//!
//! Per research tier ([`crate::tier`]): every GPU device carries the attribute `tier`,
//! `production`, or `research` on a GPU the admin gave an oversubscription ratio; a
//! research GPU's `memory` capacity (and its request policy's default) is its physical
//! memory times the ratio, and it also carries `physicalMemory` (bytes) and
//! `oversubscribeRatio`. The scheduler and the controller pack against the capacity; the
//! classes keep production claims off research GPUs by the `tier` attribute.

use std::collections::BTreeMap;

use fgpu_api::names::{DriverName, attr, capacity};
use fgpu_api::quantity::format_u64;
use fgpu_driver::device::{Gpu, GpuMode, NodeInventory, TierRatio};
use serde_json::{Map, Value, json};

use crate::device_attrs::{put, put_gpu_attributes};
use crate::edits::device_name;
use crate::gpu_mode::FixedLayouts;
use crate::mig_slice::mig_part;

/// Smallest memory share a request can get.
pub const MIN_MEMORY_SHARE: u64 = 256 << 20;
/// Granularity of memory shares.
pub const MEMORY_STEP: u64 = 1 << 20;

/// The `resource.k8s.io` versions the plugin speaks, newest first.
pub use fgpu_api::dra::ApiVersion;

pub use crate::device_attrs::semver;

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

/// A device's `taints`: the one taint `t`.
fn taint_json(t: &DeviceTaint) -> Value {
    json!([{"key": t.key, "value": t.value, "effect": t.effect, "timeAdded": t.time_added}])
}

fn device_json(
    gpu: &Gpu,
    (mode, tier): (GpuMode, TierRatio),
    api: ApiVersion,
    consumable: bool,
    taint: Option<&DeviceTaint>,
) -> Value {
    let mut attributes = Map::new();
    put(&mut attributes, attr::TYPE, "string", json!(attr::TYPE_GPU));
    let mode = match mode {
        GpuMode::Whole => attr::MODE_WHOLE,
        GpuMode::Shared | GpuMode::Mig => attr::MODE_SHARED,
    };
    put(&mut attributes, attr::MODE, "string", json!(mode));
    put(&mut attributes, attr::UUID, "string", json!(gpu.uuid));
    put_gpu_attributes(&mut attributes, gpu);
    put(
        &mut attributes,
        attr::PCI_BUS_ID,
        "string",
        json!(gpu.pci_bus_id),
    );
    put(
        &mut attributes,
        attr::ENFORCEMENT,
        "string",
        json!(gpu.enforcement.as_str()),
    );
    if tier.is_tier() {
        put(
            &mut attributes,
            attr::TIER,
            "string",
            json!(attr::TIER_RESEARCH),
        );
        put(
            &mut attributes,
            attr::PHYSICAL_MEMORY,
            "int",
            json!(gpu.memory_bytes),
        );
        put(
            &mut attributes,
            attr::OVERSUBSCRIBE_RATIO,
            "string",
            json!(tier.to_string()),
        );
    } else {
        put(
            &mut attributes,
            attr::TIER,
            "string",
            json!(attr::TIER_PRODUCTION),
        );
    }

    let memory = format_u64(tier.capacity(gpu.memory_bytes));
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
        body.insert("taints".into(), taint_json(t));
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
    let modes = BTreeMap::new();
    let tiers = BTreeMap::new();
    let fixed = FixedLayouts::default();
    let publish = Publish {
        consumable,
        taints,
        modes: &modes,
        tiers: &tiers,
        partitionable: false,
        fixed: &fixed,
    };
    let mut built = build_node_slices(driver, inventory, node_uid, generation, api, &publish);
    built.slices.swap_remove(0)
}

/// Most devices in one slice.
pub const MAX_DEVICES: usize = 128;
/// Most devices in one slice when one of them has taints or consumes counters.
pub const MAX_DEVICES_WITH_COUNTERS: usize = 64;
/// Most counter sets in one slice.
pub const MAX_COUNTER_SETS: usize = 8;

/// How the node's GPUs are published.
#[derive(Clone, Copy, Debug)]
pub struct Publish<'a> {
    /// Shared-mode GPUs are shareable (consumable capacity).
    pub consumable: bool,
    /// Taints of unhealthy GPUs by UUID; `None`: unhealthy GPUs are left out.
    pub taints: Option<&'a BTreeMap<String, DeviceTaint>>,
    /// Each GPU's mode by UUID; a GPU not in it is `shared`.
    pub modes: &'a BTreeMap<String, GpuMode>,
    /// Each research-tier GPU's ratio by UUID; a GPU not in it is off the tier.
    pub tiers: &'a BTreeMap<String, TierRatio>,
    /// MIG-mode GPUs as partitionable devices (counters); else their fixed layout.
    pub partitionable: bool,
    /// The fixed MIG layouts (`--mig-fixed-layout`).
    pub fixed: &'a FixedLayouts,
}

/// What the admin set per GPU (by UUID) that shapes its devices: the mode and the
/// research tier's ratio.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuSettings {
    /// Modes; a GPU not in it is `shared`.
    pub modes: BTreeMap<String, GpuMode>,
    /// Ratios; a GPU not in it is off the tier.
    pub tiers: BTreeMap<String, TierRatio>,
}

impl From<BTreeMap<String, GpuMode>> for GpuSettings {
    /// Modes alone, no GPU on the research tier.
    fn from(modes: BTreeMap<String, GpuMode>) -> Self {
        Self {
            modes,
            tiers: BTreeMap::new(),
        }
    }
}

/// The node's slices and what could not be published.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSlices {
    /// The slices, the first named [`slice_name`]; all of one pool generation.
    pub slices: Vec<Value>,
    /// What could not be published (a MIG-mode GPU of unknown model, a fixed-layout
    /// profile that does not fit), naming the GPU.
    pub errors: Vec<String>,
}

/// The node's slices: shared-mode GPUs as today's devices, whole-mode GPUs as devices
/// without consumable capacity, MIG-mode GPUs by [`crate::mig_slice`]. Without MIG counters
/// and with at most [`MAX_DEVICES`] devices, one slice ([`build_slice_with_taints`]'s).
/// Otherwise the devices are split over slices `<node>-<driver>`, `<node>-<driver>-<n>`
/// (at most [`MAX_DEVICES_WITH_COUNTERS`] each when counters or taints are used), and
/// the counter sets go to slices `<node>-<driver>-counters-<n>` of their own (since 1.35 a
/// slice holds devices or counter sets, not both; at most [`MAX_COUNTER_SETS`] each).
pub fn build_node_slices(
    driver: &DriverName,
    inventory: &NodeInventory,
    node_uid: &str,
    generation: i64,
    api: ApiVersion,
    publish: &Publish<'_>,
) -> NodeSlices {
    let mut devices = Vec::new();
    let mut counter_sets = Vec::new();
    let mut errors = Vec::new();
    for g in &inventory.gpus {
        let mode = publish.modes.get(&g.uuid).copied().unwrap_or_default();
        let consumable = publish.consumable && mode == GpuMode::Shared;
        let tier = publish.tiers.get(&g.uuid).copied().unwrap_or_default();
        match mode {
            GpuMode::Shared | GpuMode::Whole => {
                if g.is_healthy() {
                    devices.push(device_json(g, (mode, tier), api, consumable, None));
                } else if let Some(taint) = publish.taints.and_then(|t| t.get(&g.uuid)) {
                    let settings = (mode, tier);
                    devices.push(device_json(g, settings, api, consumable, Some(taint)));
                }
            }
            GpuMode::Mig => {
                let taints = publish.taints.and_then(|t| t.get(&g.uuid)).map(taint_json);
                let part = mig_part(
                    g,
                    api,
                    publish.partitionable,
                    publish.fixed,
                    taints.as_ref(),
                );
                devices.extend(part.devices);
                counter_sets.extend(part.counter_sets);
                errors.extend(part.errors);
            }
        }
    }
    let heavy = !counter_sets.is_empty()
        || devices.iter().any(|d| {
            d.get("taints").is_some()
                || d.get("consumesCounters").is_some()
                || d["basic"].get("consumesCounters").is_some()
        });
    let limit = if heavy {
        MAX_DEVICES_WITH_COUNTERS
    } else {
        MAX_DEVICES
    };
    let mut device_chunks: Vec<Vec<Value>> = devices.chunks(limit).map(<[Value]>::to_vec).collect();
    if device_chunks.is_empty() {
        device_chunks.push(Vec::new());
    }
    let counter_chunks: Vec<Vec<Value>> = counter_sets
        .chunks(MAX_COUNTER_SETS)
        .map(<[Value]>::to_vec)
        .collect();
    let count = (device_chunks.len() + counter_chunks.len()) as i64;
    let base = slice_name(&inventory.node, driver);
    let head = |name: String, field: &str, items: Vec<Value>| {
        json!({
            "apiVersion": api.api_version(),
            "kind": "ResourceSlice",
            "metadata": {
                "name": name,
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": inventory.node, "uid": node_uid,
                    "controller": true,
                }],
            },
            "spec": {
                "driver": driver.as_str(),
                "nodeName": inventory.node,
                "pool": {"name": inventory.node, "generation": generation, "resourceSliceCount": count},
                field: items,
            }
        })
    };
    let mut slices: Vec<Value> = device_chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let name = if i == 0 {
                base.clone()
            } else {
                format!("{base}-{i}")
            };
            head(name, "devices", chunk)
        })
        .collect();
    slices.extend(
        counter_chunks
            .into_iter()
            .enumerate()
            .map(|(i, chunk)| head(format!("{base}-counters-{i}"), "sharedCounters", chunk)),
    );
    NodeSlices { slices, errors }
}

/// Whether the node's slices differ in what consumers see: their names, devices, counter
/// sets or count (ignoring the pool generation).
pub fn slices_changed(old: &[Value], new: &[Value]) -> bool {
    let key = |s: &Value| s["metadata"]["name"].as_str().map(str::to_owned);
    let mut old: Vec<&Value> = old.iter().collect();
    let mut new: Vec<&Value> = new.iter().collect();
    old.sort_by_key(|s| key(s));
    new.sort_by_key(|s| key(s));
    old.len() != new.len()
        || old.iter().zip(&new).any(|(a, b)| {
            key(a) != key(b)
                || devices_changed(a, b)
                || a["spec"]["sharedCounters"] != b["spec"]["sharedCounters"]
                || a["spec"]["pool"]["resourceSliceCount"]
                    != b["spec"]["pool"]["resourceSliceCount"]
        })
}

/// How many devices of `slice` satisfy `has` (checked directly and under `basic`).
fn count_devices(slice: &Value, has: impl Fn(&Value) -> bool) -> usize {
    slice["spec"]["devices"].as_array().map_or(0, |ds| {
        ds.iter().filter(|d| has(d) || has(&d["basic"])).count()
    })
}

/// Whether the API server kept the partitionable-device fields of a slice written with
/// some: the counter sets and every device's `consumesCounters`. `None` if `written` has
/// neither. The fields are dropped where DRAPartitionableDevices is off (alpha before 1.36).
pub fn kept_counters(written: &Value, stored: &Value) -> Option<bool> {
    let has = |d: &Value| {
        d["consumesCounters"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    };
    let sets = |s: &Value| s["spec"]["sharedCounters"].as_array().map_or(0, Vec::len);
    let want = (count_devices(written, has), sets(written));
    (want != (0, 0)).then(|| (count_devices(stored, has), sets(stored)) == want)
}

/// Whether the API server kept `allowMultipleAllocations` on the devices of a slice
/// written with some (whole-mode and MIG devices never carry it). `None` if `written` has
/// none.
pub fn kept_consumable_in(written: &Value, stored: &Value) -> Option<bool> {
    let has = |d: &Value| d["allowMultipleAllocations"] == json!(true);
    let want = count_devices(written, has);
    (want > 0).then(|| count_devices(stored, has) == want)
}

/// Adds to `want` an empty slice (no devices) for each slice of `old` it does not name, and
/// counts them all in `resourceSliceCount`: the plugin may not delete slices, so one no
/// longer needed (a GPU left MIG mode) is emptied, in the same pool generation.
pub fn keep_names(want: &mut Vec<Value>, old: &[Value]) {
    let Some(first) = want.first().cloned() else {
        return;
    };
    for o in old {
        let name = &o["metadata"]["name"];
        if want.iter().any(|w| w["metadata"]["name"] == *name) {
            continue;
        }
        let mut empty = first.clone();
        empty["metadata"]["name"] = name.clone();
        empty["spec"]["devices"] = json!([]);
        if let Some(spec) = empty["spec"].as_object_mut() {
            spec.remove("sharedCounters");
        }
        want.push(empty);
    }
    let count = want.len();
    for w in want.iter_mut() {
        w["spec"]["pool"]["resourceSliceCount"] = json!(count);
    }
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
        assert_eq!(a["mode"], json!({"string": "shared"}));
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

    static NO_TIERS: BTreeMap<String, TierRatio> = BTreeMap::new();

    /// A node with a shared GPU 0 and a MIG-mode H100 as GPU 1.
    fn mixed() -> (NodeInventory, BTreeMap<String, GpuMode>) {
        let g0 = gpu(0, "0000:1b:00.0");
        let mut g1 = gpu(1, "0000:2b:00.0");
        g1.mig_capable = true;
        let modes = BTreeMap::from([(g1.uuid.clone(), GpuMode::Mig)]);
        (NodeInventory::new("node-a", vec![g0, g1]), modes)
    }

    fn publish<'a>(
        modes: &'a BTreeMap<String, GpuMode>,
        partitionable: bool,
        fixed: &'a FixedLayouts,
    ) -> Publish<'a> {
        Publish {
            consumable: true,
            taints: None,
            modes,
            tiers: &NO_TIERS,
            partitionable,
            fixed,
        }
    }

    /// The v1 slices of `inv` for node UID `u` and the default driver.
    fn node_slices(inv: &NodeInventory, generation: i64, publish: &Publish<'_>) -> NodeSlices {
        build_node_slices(
            &DriverName::default(),
            inv,
            "u",
            generation,
            ApiVersion::V1,
            publish,
        )
    }

    #[test]
    fn a_research_tier_gpu_grants_physical_times_ratio_and_says_so() {
        let inv = NodeInventory::new(
            "node-a",
            vec![gpu(0, "0000:1b:00.0"), gpu(1, "0000:2b:00.0")],
        );
        let tiers = BTreeMap::from([(inv.gpus[0].uuid.clone(), "1.5".parse().unwrap())]);
        let (modes, fixed) = (BTreeMap::new(), FixedLayouts::default());
        let publish = Publish {
            tiers: &tiers,
            ..publish(&modes, false, &fixed)
        };
        let built = node_slices(&inv, 1, &publish);
        let devices = built.slices[0]["spec"]["devices"].as_array().unwrap();
        let (research, production) = (&devices[0], &devices[1]);
        // 80 GiB at 1.5: 120 GiB to pack against, also as the whole-GPU default.
        let granted = "120Gi";
        assert_eq!(research["capacity"]["memory"]["value"], json!(granted));
        assert_eq!(
            research["capacity"]["memory"]["requestPolicy"]["default"],
            json!(granted)
        );
        let a = &research["attributes"];
        assert_eq!(a["tier"], json!({"string": "research"}));
        assert_eq!(a["physicalMemory"], json!({"int": 80u64 << 30}));
        assert_eq!(a["oversubscribeRatio"], json!({"string": "1.5"}));
        assert_eq!(production["capacity"]["memory"]["value"], json!("80Gi"));
        let a = &production["attributes"];
        assert_eq!(a["tier"], json!({"string": "production"}));
        assert!(a.get("physicalMemory").is_none() && a.get("oversubscribeRatio").is_none());
    }

    #[test]
    fn a_mig_gpu_is_partitionable_devices_and_a_counter_slice() {
        let d = DriverName::default();
        let (inv, modes) = mixed();
        let fixed = FixedLayouts::default();
        let built = node_slices(&inv, 4, &publish(&modes, true, &fixed));
        assert!(built.errors.is_empty(), "{:?}", built.errors);
        let s = &built.slices;
        assert_eq!(s.len(), 2);
        assert_eq!(s[0]["metadata"]["name"], "node-a-gpu.fgpu.dev");
        assert_eq!(s[1]["metadata"]["name"], "node-a-gpu.fgpu.dev-counters-0");
        for x in s {
            assert_eq!(
                x["spec"]["pool"],
                json!({"name": "node-a", "generation": 4, "resourceSliceCount": 2})
            );
            assert_eq!(x["metadata"]["ownerReferences"][0]["uid"], "u");
        }
        // Devices and counter sets in different slices (1.35+).
        assert!(s[0]["spec"].get("sharedCounters").is_none());
        assert!(s[1]["spec"].get("devices").is_none());
        assert_eq!(s[1]["spec"]["sharedCounters"][0]["name"], "gpu-1-counters");
        let devices = s[0]["spec"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1 + 25);
        // The shared GPU's device is today's, byte for byte.
        let today = build_slice(
            &d,
            &NodeInventory::new("node-a", vec![inv.gpus[0].clone()]),
            "u",
            4,
            ApiVersion::V1,
            true,
        );
        assert_eq!(devices[0], today["spec"]["devices"][0]);
        assert!(
            devices[1..]
                .iter()
                .all(|x| x["attributes"]["type"] == json!({"string": "mig"})
                    && x["consumesCounters"][0]["counterSet"] == "gpu-1-counters")
        );
        assert_eq!(kept_counters(&s[0], &s[0]), Some(true));
        assert_eq!(kept_counters(&s[1], &s[1]), Some(true));
        // The API server dropping the fields is seen, on either slice.
        let mut stored = s[0].clone();
        for x in stored["spec"]["devices"].as_array_mut().unwrap() {
            x.as_object_mut().unwrap().remove("consumesCounters");
        }
        assert_eq!(kept_counters(&s[0], &stored), Some(false));
        let mut stored = s[1].clone();
        stored["spec"]
            .as_object_mut()
            .unwrap()
            .remove("sharedCounters");
        assert_eq!(kept_counters(&s[1], &stored), Some(false));
        // A node without MIG tells nothing; consumable capacity is judged on the shared
        // device alone (MIG devices never carry it).
        assert_eq!(kept_counters(&today, &today), None);
        assert_eq!(kept_consumable_in(&s[0], &s[0]), Some(true));
        // Nine MIG-mode H100s: 64 devices a slice, 8 counter sets a slice.
        let mut many = Vec::new();
        let mut modes = BTreeMap::new();
        for i in 0..9 {
            let mut g = gpu(i, "0000:1b:00.0");
            g.mig_capable = true;
            modes.insert(g.uuid.clone(), GpuMode::Mig);
            many.push(g);
        }
        let built = node_slices(
            &NodeInventory::new("n", many),
            1,
            &publish(&modes, true, &fixed),
        );
        let names: Vec<&str> = built
            .slices
            .iter()
            .map(|x| x["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "n-gpu.fgpu.dev",
                "n-gpu.fgpu.dev-1",
                "n-gpu.fgpu.dev-2",
                "n-gpu.fgpu.dev-3",
                "n-gpu.fgpu.dev-counters-0",
                "n-gpu.fgpu.dev-counters-1"
            ]
        );
        let sizes: Vec<usize> = built
            .slices
            .iter()
            .map(|x| {
                x["spec"]["devices"]
                    .as_array()
                    .or(x["spec"]["sharedCounters"].as_array())
                    .unwrap()
                    .len()
            })
            .collect();
        assert_eq!(sizes, [64, 64, 64, 33, 8, 1]);
        assert!(
            built
                .slices
                .iter()
                .all(|x| x["spec"]["pool"]["resourceSliceCount"] == 6)
        );
    }

    #[test]
    fn without_partitionable_devices_the_fixed_layout_is_published_in_one_slice() {
        let (inv, modes) = mixed();
        let fixed: FixedLayouts = "1=3g.40gb*2".parse().unwrap();
        let built = node_slices(&inv, 2, &publish(&modes, false, &fixed));
        assert!(built.errors.is_empty(), "{:?}", built.errors);
        assert_eq!(built.slices.len(), 1);
        let s = &built.slices[0];
        assert_eq!(s["spec"]["pool"]["resourceSliceCount"], 1);
        let names: Vec<&str> = s["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["gpu-0", "gpu-1-mig-3g40gb-4", "gpu-1-mig-3g40gb-0"]);
        assert!(s["spec"]["devices"][1].get("consumesCounters").is_none());
        assert_eq!(kept_counters(s, s), None);
        // No layout for the MIG GPU: the shared GPU alone, and an error naming the GPU.
        let none = FixedLayouts::default();
        let built = node_slices(&inv, 2, &publish(&modes, false, &none));
        assert_eq!(
            built.slices[0]["spec"]["devices"].as_array().unwrap().len(),
            1
        );
        assert!(
            built.errors[0].starts_with("GPU 1 (GPU-00000001-"),
            "{:?}",
            built.errors
        );
    }

    #[test]
    fn a_whole_gpu_is_not_shareable_and_an_unknown_mig_model_publishes_nothing() {
        let (mut inv, mut modes) = mixed();
        modes.insert(inv.gpus[0].uuid.clone(), GpuMode::Whole);
        inv.gpus[1].product_name = "NVIDIA H100 NVL".into();
        inv.gpus[1].memory_bytes = 94 << 30;
        let fixed = FixedLayouts::default();
        let built = node_slices(&inv, 1, &publish(&modes, true, &fixed));
        assert_eq!(built.slices.len(), 1);
        let devices = built.slices[0]["spec"]["devices"].as_array().unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0]["name"], "gpu-0");
        assert!(devices[0].get("allowMultipleAllocations").is_none());
        assert_eq!(
            devices[0]["attributes"]["mode"],
            json!({"string": "whole"}),
            "the controller keeps shares off a whole-mode GPU by this attribute"
        );
        assert_eq!(devices[0]["capacity"]["memory"], json!({"value": "80Gi"}));
        assert_eq!(built.errors.len(), 1);
        assert!(
            built.errors[0].contains("no MIG profile table for \"NVIDIA H100 NVL\""),
            "{}",
            built.errors[0]
        );
        assert_eq!(kept_consumable_in(&built.slices[0], &built.slices[0]), None);
    }

    #[test]
    fn slices_no_longer_needed_are_emptied_and_counted() {
        let d = DriverName::default();
        let (inv, modes) = mixed();
        let fixed = FixedLayouts::default();
        let before = node_slices(&inv, 1, &publish(&modes, true, &fixed)).slices;
        // GPU 1 back to shared: one slice of devices, and the counters slice emptied.
        let mut after = build_slice_with_taints(&d, &inv, "u", 2, ApiVersion::V1, true, None);
        let mut want = vec![after.clone()];
        keep_names(&mut want, &before);
        assert_eq!(want.len(), 2);
        assert_eq!(
            want[1]["metadata"]["name"],
            "node-a-gpu.fgpu.dev-counters-0"
        );
        assert_eq!(want[1]["spec"]["devices"], json!([]));
        assert!(want[1]["spec"].get("sharedCounters").is_none());
        assert!(want.iter().all(|x| x["spec"]["pool"]
            == json!({"name": "node-a", "generation": 2, "resourceSliceCount": 2})));
        assert!(slices_changed(&before, &want));
        assert!(!slices_changed(&want, &want.clone()));
        // Nothing to keep: unchanged.
        after["spec"]["pool"]["resourceSliceCount"] = json!(1);
        let mut alone = vec![after.clone()];
        keep_names(&mut alone, std::slice::from_ref(&after));
        assert_eq!(alone, vec![after]);
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
