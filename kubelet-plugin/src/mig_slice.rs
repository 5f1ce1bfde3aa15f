//! A MIG-mode GPU's devices in the node's ResourceSlices. Pure: GPUs in, JSON out.
//!
//! With partitionable devices (the API server keeps `sharedCounters` and
//! `consumesCounters`: 1.36+, or the DRAPartitionableDevices gate), each MIG-mode GPU is
//! one counter set and one device per profile placement ([`fgpu_driver::mig::devices`]),
//! each consuming its memory slices and compute slices; kube-scheduler then allocates only
//! placements that can exist together. Without them, the admin's fixed layout
//! (`--mig-fixed-layout`) is placed by the foundation's rule ([`fgpu_driver::mig::place`],
//! largest profile first) and each instance published as a plain device.
//!
//! Every MIG device has `type` = `mig`, `profile`, `memory` (bytes, also its `memory`
//! capacity), `parentUUID`, and the parent's `productName`, `architecture`,
//! `cudaComputeCapability`, `driverVersion`, `index`, `numaNode` and
//! `resource.kubernetes.io/pcieRoot`. It has no `uuid` (the instance does not exist
//! until a claim is prepared), no `pciBusID` (the parent's, not its own) and no
//! `enforcement` (the hardware isolates it).
//!
//! A MIG-mode GPU whose model has no profile table, or that is not MIG-capable, gets no
//! device: the error names the GPU and its product. An unhealthy one carries its health
//! over to its placements: each is published with the GPU's taint where the API server
//! keeps taints, else none is published (as an unhealthy shared GPU).

use fgpu_api::names::{attr, capacity};
use fgpu_api::quantity::format_u64;
use fgpu_driver::device::Gpu;
use fgpu_driver::mig::{self, CounterSet, MigLayout, PlacementDevice};
use serde_json::{Map, Value, json};

use crate::device_attrs::{put, put_gpu_attributes};
use crate::gpu_mode::FixedLayouts;
use fgpu_api::dra::ApiVersion;

/// A MIG-mode GPU's part of the slices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MigPart {
    /// Counter sets (`sharedCounters` entries), one per GPU; empty without partitionable
    /// devices.
    pub counter_sets: Vec<Value>,
    /// Devices.
    pub devices: Vec<Value>,
    /// What could not be published, naming the GPU.
    pub errors: Vec<String>,
}

/// The devices of the MIG-mode `gpu`: placements with counters when `partitionable`,
/// else the `fixed` layout's instances. An unhealthy `gpu` publishes them with `taints`
/// (its device taints, as the slice writes them), or nothing without.
pub fn mig_part(
    gpu: &Gpu,
    api: ApiVersion,
    partitionable: bool,
    fixed: &FixedLayouts,
    taints: Option<&Value>,
) -> MigPart {
    let mut part = MigPart::default();
    let name = format!("GPU {} ({}, {:?})", gpu.index, gpu.uuid, gpu.product_name);
    if !gpu.mig_capable {
        part.errors.push(format!(
            "{name}: mode mig, but the GPU is not MIG-capable; nothing is published for it"
        ));
        return part;
    }
    let table = match mig::table_for(&gpu.product_name, gpu.memory_bytes) {
        Ok(t) => t,
        Err(e) => {
            part.errors.push(format!(
                "{name}: mode mig, but {e}; nothing is published for it"
            ));
            return part;
        }
    };
    let taints = match (gpu.is_healthy(), taints) {
        (true, _) => None,
        (false, Some(t)) => Some(t),
        (false, None) => return part,
    };
    let all = mig::mig_devices(gpu, table);
    if partitionable {
        part.counter_sets.push(counter_set_json(&all.counter_set));
        part.devices = all
            .devices
            .iter()
            .map(|d| device_json(gpu, d, api, true, taints))
            .collect();
        return part;
    }
    let wanted = fixed.for_gpu(gpu);
    if wanted.is_empty() {
        part.errors.push(format!(
            "{name}: mode mig, but the API server has no partitionable devices and --mig-fixed-layout lists no profile for it; nothing is published for it"
        ));
        return part;
    }
    // Largest first (memory slices, then compute slices), so that small instances do not
    // take the starts the large ones need; a stable sort keeps the admin's order otherwise.
    let mut profiles = Vec::new();
    for p in wanted {
        match table.profile(p) {
            Some(profile) => profiles.push(profile),
            None => part.errors.push(format!(
                "{name}: --mig-fixed-layout profile {p:?} is not one of the {}'s ({}); skipped",
                table.model,
                table.profile_names().join(", ")
            )),
        }
    }
    profiles.sort_by_key(|p| std::cmp::Reverse((p.memory_slices, p.compute_slices)));
    let mut layout = MigLayout::new(table);
    for profile in profiles {
        let Some(choice) = mig::place(&layout, profile) else {
            part.errors.push(format!(
                "{name}: --mig-fixed-layout profile {} does not fit beside {}; skipped",
                profile.name,
                layout
                    .taken()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            continue;
        };
        if layout.take(profile.name, choice.placement.start).is_err() {
            continue;
        }
        if let Some(d) = all
            .devices
            .iter()
            .find(|d| d.profile == profile.name && d.placement == choice.placement)
        {
            part.devices.push(device_json(gpu, d, api, false, taints));
        }
    }
    part
}

/// A counter set as a `sharedCounters` entry.
fn counter_set_json(set: &CounterSet) -> Value {
    let counters: Map<String, Value> = set
        .counters
        .iter()
        .map(|(k, v)| (k.clone(), json!({"value": v.to_string()})))
        .collect();
    json!({"name": set.name, "counters": counters})
}

/// A placement device; with `counters`, it consumes from its GPU's counter set; with
/// `taints`, it carries its GPU's.
fn device_json(
    gpu: &Gpu,
    d: &PlacementDevice,
    api: ApiVersion,
    counters: bool,
    taints: Option<&Value>,
) -> Value {
    let mut attributes = Map::new();
    put(&mut attributes, attr::TYPE, "string", json!(attr::TYPE_MIG));
    put(&mut attributes, attr::PROFILE, "string", json!(d.profile));
    put(&mut attributes, attr::MEMORY, "int", json!(d.memory_bytes));
    put(
        &mut attributes,
        attr::PARENT_UUID,
        "string",
        json!(d.parent_uuid),
    );
    put_gpu_attributes(&mut attributes, gpu);
    let mut body = Map::new();
    body.insert("attributes".into(), Value::Object(attributes));
    body.insert(
        "capacity".into(),
        json!({capacity::MEMORY: {"value": format_u64(d.memory_bytes)}}),
    );
    if counters {
        let consumed: Map<String, Value> = d
            .consumes
            .iter()
            .map(|(k, v)| (k.clone(), json!({"value": v.to_string()})))
            .collect();
        body.insert(
            "consumesCounters".into(),
            json!([{"counterSet": d.counter_set, "counters": consumed}]),
        );
    }
    if let Some(t) = taints {
        body.insert("taints".into(), t.clone());
    }
    match api {
        ApiVersion::V1 | ApiVersion::V1beta2 => {
            body.insert("name".into(), json!(d.name));
            Value::Object(body)
        }
        ApiVersion::V1beta1 => json!({"name": d.name, "basic": body}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::tests::gpu;
    use fgpu_driver::device::GIB;

    fn h100() -> Gpu {
        let mut g = gpu(1, "0000:2b:00.0");
        g.mig_capable = true;
        g.pcie_root = Some("pci0000:20".into());
        g
    }

    #[test]
    fn partitionable_placements_consume_their_gpus_counters() {
        let part = mig_part(
            &h100(),
            ApiVersion::V1,
            true,
            &FixedLayouts::default(),
            None,
        );
        assert!(part.errors.is_empty(), "{:?}", part.errors);
        assert_eq!(part.counter_sets.len(), 1);
        let set = &part.counter_sets[0];
        assert_eq!(set["name"], "gpu-1-counters");
        assert_eq!(set["counters"]["compute-slices"], json!({"value": "7"}));
        assert_eq!(set["counters"]["memory-slice-7"], json!({"value": "1"}));
        assert_eq!(set["counters"].as_object().unwrap().len(), 10);
        assert_eq!(part.devices.len(), 25);
        let d = part
            .devices
            .iter()
            .find(|d| d["name"] == "gpu-1-mig-3g40gb-4")
            .unwrap();
        let a = &d["attributes"];
        assert_eq!(a["type"], json!({"string": "mig"}));
        assert_eq!(a["profile"], json!({"string": "3g.40gb"}));
        assert_eq!(a["memory"], json!({"int": 40 * GIB}));
        assert_eq!(
            a["parentUUID"],
            json!({"string": "GPU-00000001-0000-0000-0000-000000000000"})
        );
        assert_eq!(a["productName"]["string"], "NVIDIA H100 80GB HBM3");
        assert_eq!(a["index"], json!({"int": 1}));
        assert_eq!(a["resource.kubernetes.io/pcieRoot"]["string"], "pci0000:20");
        assert!(a.get("uuid").is_none() && a.get("enforcement").is_none());
        assert_eq!(d["capacity"], json!({"memory": {"value": "40Gi"}}));
        assert_eq!(
            d["consumesCounters"],
            json!([{"counterSet": "gpu-1-counters", "counters": {
                "compute-slices": {"value": "3"},
                "memory-slice-4": {"value": "1"}, "memory-slice-5": {"value": "1"},
                "memory-slice-6": {"value": "1"}, "memory-slice-7": {"value": "1"}}}])
        );
        assert!(d.get("allowMultipleAllocations").is_none());
        // v1beta1 wraps the fields in basic.
        let old = mig_part(
            &h100(),
            ApiVersion::V1beta1,
            true,
            &FixedLayouts::default(),
            None,
        );
        assert!(old.devices[0]["basic"]["consumesCounters"].is_array());
        assert!(old.devices[0].get("attributes").is_none());
    }

    #[test]
    fn the_fixed_layout_is_placed_largest_first_as_plain_devices() {
        let fixed: FixedLayouts = "1g.10gb*2,3g.40gb,2g.20gb".parse().unwrap();
        let part = mig_part(&h100(), ApiVersion::V1, false, &fixed, None);
        assert!(part.errors.is_empty(), "{:?}", part.errors);
        assert!(part.counter_sets.is_empty());
        let names: Vec<&str> = part
            .devices
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        // Largest first, whatever the admin's order: 3g.40gb at 4 (keeps 4g.40gb at 0
        // possible), then 2g.20gb at 2 (0 and 2 leave as much room; the tie goes to the
        // higher start), then the 1g.10gb instances in slices 1 and 0.
        assert_eq!(
            names,
            [
                "gpu-1-mig-3g40gb-4",
                "gpu-1-mig-2g20gb-2",
                "gpu-1-mig-1g10gb-1",
                "gpu-1-mig-1g10gb-0"
            ]
        );
        assert!(
            part.devices
                .iter()
                .all(|d| d.get("consumesCounters").is_none())
        );
        // Unknown profiles and ones that do not fit are named and skipped.
        let fixed: FixedLayouts = "7g.80gb,1g.5gb,1g.10gb".parse().unwrap();
        let part = mig_part(&h100(), ApiVersion::V1, false, &fixed, None);
        assert_eq!(part.devices.len(), 1);
        assert_eq!(part.errors.len(), 2, "{:?}", part.errors);
        assert!(part.errors[0].contains("profile \"1g.5gb\" is not one of the H100 80GB's"));
        assert!(part.errors[1].contains("profile 1g.10gb does not fit beside 7g.80gb at {0}:8"));
        // No layout for the GPU: nothing, and why.
        let part = mig_part(
            &h100(),
            ApiVersion::V1,
            false,
            &FixedLayouts::default(),
            None,
        );
        assert!(part.devices.is_empty());
        assert!(part.errors[0].contains("--mig-fixed-layout lists no profile"));
    }

    #[test]
    fn an_unknown_model_gets_nothing_and_an_error_naming_it() {
        let mut g = h100();
        g.product_name = "NVIDIA H100 NVL".into();
        g.memory_bytes = 94 * GIB;
        let part = mig_part(&g, ApiVersion::V1, true, &FixedLayouts::default(), None);
        assert!(part.devices.is_empty() && part.counter_sets.is_empty());
        assert_eq!(part.errors.len(), 1);
        let e = &part.errors[0];
        assert!(
            e.starts_with("GPU 1 (GPU-00000001-0000-0000-0000-000000000000, \"NVIDIA H100 NVL\"): mode mig, but no MIG profile table for \"NVIDIA H100 NVL\""),
            "{e}"
        );
        let mut g = h100();
        g.mig_capable = false;
        let part = mig_part(&g, ApiVersion::V1, true, &FixedLayouts::default(), None);
        assert!(part.devices.is_empty());
        assert!(part.errors[0].contains("not MIG-capable"));
    }

    #[test]
    fn an_unhealthy_gpu_carries_its_taint_to_every_placement_or_publishes_none() {
        let mut g = h100();
        let healthy = mig_part(&g, ApiVersion::V1, true, &FixedLayouts::default(), None);
        g.health = fgpu_driver::device::Health::Unhealthy {
            reason: "XID 79".into(),
        };
        let taints = json!([{"key": "fgpu.dev/unhealthy", "value": "xid-79", "effect": "NoSchedule", "timeAdded": "2026-12-07T08:00:00Z"}]);
        let tainted = mig_part(
            &g,
            ApiVersion::V1,
            true,
            &FixedLayouts::default(),
            Some(&taints),
        );
        assert_eq!(tainted.devices.len(), healthy.devices.len());
        assert!(!tainted.devices.is_empty());
        for (t, h) in tainted.devices.iter().zip(&healthy.devices) {
            assert_eq!(t["name"], h["name"]);
            assert_eq!(t["taints"], taints, "{}", t["name"]);
            assert!(h.get("taints").is_none());
        }
        assert_eq!(tainted.counter_sets, healthy.counter_sets);
        // The fixed layout too, and the v1beta1 shape keeps the taint in `basic`.
        let fixed: FixedLayouts = "1g.10gb,3g.40gb".parse().unwrap();
        let part = mig_part(&g, ApiVersion::V1beta1, false, &fixed, Some(&taints));
        assert_eq!(part.devices.len(), 2);
        assert!(part.devices.iter().all(|d| d["basic"]["taints"] == taints));
        // Where the API server drops taints: nothing, as for an unhealthy shared GPU.
        let dropped = mig_part(&g, ApiVersion::V1, true, &FixedLayouts::default(), None);
        assert!(dropped.devices.is_empty() && dropped.counter_sets.is_empty());
        assert!(dropped.errors.is_empty());
    }
}
