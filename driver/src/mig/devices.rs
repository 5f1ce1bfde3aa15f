//! A MIG-mode GPU as DRA partitionable devices: one counter set per GPU, one device per
//! profile placement, each consuming some of the counters.
//!
//! Plain data for the kubelet plugin to publish (`sharedCounters` in the ResourceSlice,
//! `consumesCounters` on each device). The counters reproduce [`MigLayout`]'s rules, so
//! kube-scheduler, which only adds counters up, never allocates two devices that cannot
//! exist together:
//!
//! * `memory-slice-<i>` (value 1) for each memory slice: a device consumes the slices of
//!   its placement, so overlapping placements exclude each other;
//! * `compute-slices` (the GPU's compute slices): a device consumes its profile's;
//! * `media-extensions` (1): consumed by the `+me` profiles, so only one holds them.
//!
//! Instance limits need no counter: every model's limits follow from the three above.
//! There is no memory-bytes counter: it would repeat the memory slices, and the sizes in
//! profile names do not add up (two H200 `3g.71gb` make 142 GB of a 141 GB GPU).
//! Counter names are DNS labels, as the API requires (hence `memory-slice-0`, not
//! `memorySlice0`).

use std::collections::BTreeMap;

use super::layout::MigLayout;
use super::profiles::{MigProfile, MigTable, Placement};
use crate::device::Gpu;

/// Counter of the compute slices (GPCs) of a GPU.
pub const COMPUTE_SLICES: &str = "compute-slices";
/// Counter of the media extensions of a GPU (1).
pub const MEDIA_EXTENSIONS: &str = "media-extensions";

/// The counter of memory slice `i`: `memory-slice-<i>`.
pub fn memory_slice(i: u8) -> String {
    format!("memory-slice-{i}")
}

/// A named set of counters (a ResourceSlice's `sharedCounters` entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterSet {
    /// The set's name: `gpu-<index>-counters`.
    pub name: String,
    /// Counter name → value.
    pub counters: BTreeMap<String, u64>,
}

impl CounterSet {
    /// Takes what `device` consumes; refuses (naming the first counter short) when the set
    /// has too little left, and then takes nothing.
    pub fn consume(&mut self, device: &PlacementDevice) -> Result<(), String> {
        for (name, want) in &device.consumes {
            let have = self.counters.get(name).copied().unwrap_or(0);
            if have < *want {
                return Err(format!(
                    "device {}: counter {name} of {} has {have} left, needs {want}",
                    device.name, self.name
                ));
            }
        }
        for (name, want) in &device.consumes {
            if let Some(have) = self.counters.get_mut(name) {
                *have -= want;
            }
        }
        Ok(())
    }
}

/// One profile placement of a GPU, published as a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementDevice {
    /// Device name: `gpu-<index>-mig-<profile label>-<start>`, e.g. `gpu-0-mig-1g10gb-3`.
    pub name: String,
    /// Attribute `profile`: the profile's name, e.g. `1g.10gb`.
    pub profile: &'static str,
    /// Attribute (and capacity) `memory`: the profile's memory in bytes.
    pub memory_bytes: u64,
    /// Attribute `parentUUID`: the GPU's UUID.
    pub parent_uuid: String,
    /// Where the instance would sit.
    pub placement: Placement,
    /// The compute slices it takes.
    pub compute_slices: u8,
    /// The counter set it consumes from.
    pub counter_set: String,
    /// Counter name → amount consumed.
    pub consumes: BTreeMap<String, u64>,
}

/// A MIG-mode GPU's counter set and placement devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigDevices {
    /// The GPU's counters.
    pub counter_set: CounterSet,
    /// One device per profile placement, in table order then start order.
    pub devices: Vec<PlacementDevice>,
}

/// The counter set and placement devices of `gpu`, whose model is `table`.
pub fn mig_devices(gpu: &Gpu, table: &'static MigTable) -> MigDevices {
    let set = format!("gpu-{}-counters", gpu.index);
    let mut counters: BTreeMap<String, u64> = (0..table.memory_slices)
        .map(|i| (memory_slice(i), 1))
        .collect();
    counters.insert(COMPUTE_SLICES.into(), u64::from(table.compute_slices));
    counters.insert(MEDIA_EXTENSIONS.into(), 1);
    let devices = table
        .profiles
        .iter()
        .flat_map(|profile| profile.placements().map(move |pl| (profile, pl)))
        .map(|(profile, placement)| device(gpu, &set, profile, placement))
        .collect();
    MigDevices {
        counter_set: CounterSet {
            name: set,
            counters,
        },
        devices,
    }
}

fn device(
    gpu: &Gpu,
    set: &str,
    profile: &'static MigProfile,
    placement: Placement,
) -> PlacementDevice {
    let mut consumes: BTreeMap<String, u64> =
        placement.slices().map(|i| (memory_slice(i), 1)).collect();
    consumes.insert(COMPUTE_SLICES.into(), u64::from(profile.compute_slices));
    if profile.media_extensions {
        consumes.insert(MEDIA_EXTENSIONS.into(), 1);
    }
    PlacementDevice {
        name: device_name(gpu.index, profile, placement.start),
        profile: profile.name,
        memory_bytes: profile.memory_bytes(),
        parent_uuid: gpu.uuid.clone(),
        placement,
        compute_slices: profile.compute_slices,
        counter_set: set.to_owned(),
        consumes,
    }
}

/// The name of the device of `profile` at memory slice `start` on GPU `gpu_index`:
/// `gpu-<index>-mig-<profile label>-<start>`.
pub fn device_name(gpu_index: u32, profile: &MigProfile, start: u8) -> String {
    format!("gpu-{gpu_index}-mig-{}-{start}", profile.label())
}

/// A placement device's name taken apart ([`device_name`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceName {
    /// The parent GPU's index.
    pub gpu_index: u32,
    /// The profile's label (`1g10gb`).
    pub label: String,
    /// The first memory slice.
    pub start: u8,
}

/// The parts of `name` when it is a placement device's name (`gpu-0-mig-1g10gb-3`);
/// `None` for any other name (a GPU's `gpu-0`, say). Allocations name devices only, so
/// this is how a claim's result is known to be a MIG placement.
pub fn parse_device_name(name: &str) -> Option<DeviceName> {
    let rest = name.strip_prefix("gpu-")?;
    let (index, rest) = rest.split_once("-mig-")?;
    let (label, start) = rest.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(index) || !digits(start) || label.is_empty() {
        return None;
    }
    if !label.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    Some(DeviceName {
        gpu_index: index.parse().ok()?,
        label: label.to_owned(),
        start: start.parse().ok()?,
    })
}

/// The devices of `devices` that fit the GPU's current `layout`: what is still allocatable.
pub fn free_devices<'a>(devices: &'a MigDevices, layout: &MigLayout) -> Vec<&'a PlacementDevice> {
    devices
        .devices
        .iter()
        .filter(|d| {
            layout
                .table()
                .profile(d.profile)
                .is_some_and(|p| layout.check(p, d.placement.start).is_ok())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_round_trip_and_others_are_not_placements() {
        let table = table_for("NVIDIA H100 80GB HBM3", 80 * GIB).unwrap();
        for profile in table.profiles {
            for &start in profile.starts {
                let name = device_name(3, profile, start);
                let parsed = parse_device_name(&name).unwrap();
                assert_eq!(
                    (parsed.gpu_index, parsed.label.as_str(), parsed.start),
                    (3, profile.label().as_str(), start),
                    "{name}"
                );
            }
        }
        for other in [
            "gpu-0",
            "gpu-0-mig-",
            "gpu-0-mig-1g10gb",
            "gpu-x-mig-1g10gb-0",
            "gpu-0-mig-1g10gb-x",
            "gpu-0-mig-1g.10gb-0",
            "mig-1g10gb-0",
            "gpu-0-mig--0",
        ] {
            assert_eq!(parse_device_name(other), None, "{other}");
        }
    }
    use crate::device::{ComputeCapability, DeviceNode, GIB, Health};
    use crate::mig::profiles::{TABLES, table_for};

    fn gpu(product: &str, gib: u64) -> Gpu {
        Gpu {
            index: 0,
            minor: 0,
            uuid: "GPU-0a".into(),
            product_name: product.into(),
            memory_bytes: gib * GIB,
            sm_count: 132,
            compute_capability: ComputeCapability::new(9, 0),
            driver_version: "550.54.15".into(),
            cuda_driver_version: "12.4".into(),
            pci_bus_id: "0000:01:00.0".into(),
            pcie_root: None,
            numa_node: None,
            mig_capable: true,
            health: Health::Healthy,
            enforcement: Default::default(),
            device_nodes: DeviceNode::standard_set(0, std::path::Path::new("/dev")),
        }
    }

    #[test]
    fn an_h100_has_its_counters_and_named_placement_devices() {
        let g = gpu("NVIDIA H100 80GB HBM3", 80);
        let table = table_for(&g.product_name, g.memory_bytes).unwrap();
        let d = mig_devices(&g, table);
        assert_eq!(d.counter_set.name, "gpu-0-counters");
        assert_eq!(d.counter_set.counters.len(), 10);
        assert_eq!(d.counter_set.counters[COMPUTE_SLICES], 7);
        // 7 + 7 + 4 + 3 + 2 + 1 + 1 placements.
        assert_eq!(d.devices.len(), 25);
        let one = d
            .devices
            .iter()
            .find(|x| x.name == "gpu-0-mig-1g10gb-3")
            .unwrap();
        assert_eq!((one.profile, one.memory_bytes), ("1g.10gb", 10 * GIB));
        assert_eq!(one.parent_uuid, "GPU-0a");
        assert_eq!(
            one.consumes.keys().collect::<Vec<_>>(),
            ["compute-slices", "memory-slice-3"]
        );
        let me = d
            .devices
            .iter()
            .find(|x| x.name == "gpu-0-mig-1g10gbme-0")
            .unwrap();
        assert_eq!(me.consumes[MEDIA_EXTENSIONS], 1);
        let whole = d.devices.iter().find(|x| x.profile == "7g.80gb").unwrap();
        assert_eq!(whole.consumes.len(), 9);
        // Every name is a DNS label and unique.
        let mut names: Vec<&str> = d.devices.iter().map(|x| x.name.as_str()).collect();
        assert!(names.iter().all(|n| {
            n.len() <= 63
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        }));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 25);
    }

    /// Counters say yes exactly when the layout says yes, for every pair and every
    /// greedy sequence of placements on every model.
    #[test]
    fn counters_agree_with_the_layout() {
        for table in &TABLES {
            let g = gpu("x", 1);
            let d = mig_devices(&g, table);
            for a in &d.devices {
                for b in &d.devices {
                    let mut set = d.counter_set.clone();
                    let mut layout = MigLayout::new(table);
                    set.consume(a).unwrap();
                    layout.take(a.profile, a.placement.start).unwrap();
                    let by_counters = set.consume(b).is_ok();
                    let by_layout = layout.take(b.profile, b.placement.start).is_ok();
                    assert_eq!(
                        by_counters, by_layout,
                        "{}: {} then {}",
                        table.model, a.name, b.name
                    );
                }
            }
            // Greedy fills from each starting device: still in agreement at every step.
            for first in &d.devices {
                let mut set = d.counter_set.clone();
                let mut layout = MigLayout::new(table);
                for x in std::iter::once(first).chain(&d.devices) {
                    let by_counters = set.clone().consume(x).is_ok();
                    let by_layout = layout
                        .check(table.profile(x.profile).unwrap(), x.placement.start)
                        .is_ok();
                    assert_eq!(
                        by_counters,
                        by_layout,
                        "{}: {} after {:?}",
                        table.model,
                        x.name,
                        layout.taken()
                    );
                    if by_layout {
                        set.consume(x).unwrap();
                        layout.take(x.profile, x.placement.start).unwrap();
                    }
                }
                assert_eq!(free_devices(&d, &layout).len(), 0, "{}", table.model);
            }
        }
    }

    #[test]
    fn free_devices_follow_the_layout() {
        let g = gpu("NVIDIA H100 80GB HBM3", 80);
        let table = table_for(&g.product_name, g.memory_bytes).unwrap();
        let d = mig_devices(&g, table);
        let layout = MigLayout::with_instances(table, [("3g.40gb", 4)]).unwrap();
        let free: Vec<&str> = free_devices(&d, &layout)
            .iter()
            .map(|x| x.name.as_str())
            .collect();
        assert!(free.contains(&"gpu-0-mig-4g40gb-0") && free.contains(&"gpu-0-mig-3g40gb-0"));
        assert!(
            !free
                .iter()
                .any(|n| n.ends_with("-4") || n.ends_with("-6") || n.contains("7g"))
        );
    }
}
