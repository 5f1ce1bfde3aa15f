//! MIG placements in controller mode: each MIG-mode GPU as its slices publish it, the
//! placements allocated claims hold, and the choice of a placement for a claim of the MIG
//! class (`mig.<driver>`).
//!
//! A MIG-mode GPU publishes one device per profile placement (`gpu-<index>-mig-<profile
//! label>-<start>`, `type` = `mig`, attributes `profile`, `memory`, `parentUUID`,
//! `productName`; see `docs/mig.md`). With partitionable devices each consumes counters of
//! the GPU's counter set (`spec.sharedCounters`); with a fixed layout each is one instance
//! the plugin made at start, without counters. [`MigNode::build`] groups a node's
//! placement devices by parent GPU and finds the GPU's profile table from the profiles it
//! publishes ([`fgpu_driver::mig::tables_with_profiles`]).
//!
//! [`MigInventory::take`] marks the placement of an allocated claim taken: it goes into the
//! GPU's [`MigLayout`] and its counters are consumed, so a placement that overlaps it
//! (shares a memory slice, or needs compute slices or media extensions that are gone) is
//! not offered again, by either rule. [`MigInventory::choose`] picks GPU and placement with
//! [`fgpu_driver::mig::choose_across_where`] (the smallest profile that holds the memory,
//! then the placement that keeps the largest profiles possible, then the GPU that wastes
//! least and is fullest) among the placements that are free, that the counters allow and
//! that the claim's selectors accept.
//!
//! A GPU whose UUID is also published as a device of type `gpu` (a GPU in `shared` or
//! `whole` mode) keeps no placement here, so no MIG claim lands on a GPU that takes
//! shares; MIG-mode GPUs publish no `gpu` device, so no share lands on them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fgpu_driver::device::GIB;
use fgpu_driver::mig::{self, MigError, MigLayout, MigProfile, MigRequest, MigTable};

use crate::selector::DeviceInfo;

/// A problem with a slice's MIG device: the slice's name, the field, what is wrong.
pub type Problem = (String, String, String);

/// A placement device as read from a slice, before its GPU is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceMigDevice {
    /// `metadata.name` of its slice.
    pub slice: String,
    /// Its path in the slice: `spec.devices[i]`.
    pub path: String,
    /// Device name.
    pub name: String,
    /// Attribute `profile`.
    pub profile: String,
    /// Attribute `memory` (bytes).
    pub memory: u64,
    /// Attribute `parentUUID`.
    pub parent_uuid: String,
    /// Attribute `productName` (the parent's).
    pub product: String,
    /// The counter set its `consumesCounters` names; `None` without counters (a fixed
    /// layout).
    pub counter_set: Option<String>,
    /// What it consumes of that set.
    pub consumes: BTreeMap<String, u64>,
    /// What CEL selectors see of it.
    pub info: DeviceInfo,
}

/// One placement device of a MIG-mode GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigDevice {
    /// Device name, e.g. `gpu-0-mig-1g10gb-6`.
    pub name: String,
    /// Its profile.
    pub profile: &'static MigProfile,
    /// Its first memory slice.
    pub start: u8,
    /// What it consumes of the GPU's counter set (empty for a fixed layout).
    pub consumes: BTreeMap<String, u64>,
    /// What CEL selectors see of it.
    pub info: DeviceInfo,
}

/// A MIG-mode GPU of a node: its placement devices and what is taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigGpu {
    /// The GPU's UUID (the devices' `parentUUID`).
    pub parent_uuid: String,
    /// The GPU's product name.
    pub product: String,
    /// Its profile table.
    pub table: &'static MigTable,
    /// The counter set its devices consume from; `None` for a fixed layout.
    pub counter_set: Option<String>,
    /// What is left of each counter (empty for a fixed layout).
    pub counters: BTreeMap<String, u64>,
    /// Its placement devices, as published (shared between the copies a pass makes).
    pub devices: Arc<Vec<MigDevice>>,
    /// The instances allocated claims hold.
    pub layout: MigLayout,
    /// Names of the devices allocated claims hold.
    pub taken: BTreeSet<String>,
}

impl MigGpu {
    /// Whether `d` can still be allocated: not taken, the counters have what it consumes,
    /// and it fits beside the instances taken.
    pub fn is_free(&self, d: &MigDevice) -> bool {
        !self.taken.contains(&d.name)
            && d.consumes
                .iter()
                .all(|(c, n)| self.counters.get(c).is_some_and(|have| have >= n))
            && self.layout.check(d.profile, d.start).is_ok()
    }

    /// The device of `profile` at `start`.
    fn device(&self, profile: &MigProfile, start: u8) -> Option<&MigDevice> {
        self.devices
            .iter()
            .find(|d| d.profile.name == profile.name && d.start == start)
    }

    /// The largest profile (most memory slices, then compute slices) with a free device.
    pub fn largest_free(&self) -> Option<&'static MigProfile> {
        self.devices
            .iter()
            .filter(|d| self.is_free(d))
            .map(|d| d.profile)
            .max_by_key(|p| (p.memory_slices, p.compute_slices, p.memory_gib))
    }
}

/// A node's MIG-mode GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigNode {
    /// The node (its pool's name).
    pub name: String,
    /// Its MIG-mode GPUs, in the order their first device is published.
    pub gpus: Vec<MigGpu>,
}

/// Every node's MIG-mode GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigInventory {
    /// Nodes with at least one MIG-mode GPU, by name.
    pub nodes: Vec<MigNode>,
}

/// What a claim's request asks of a MIG instance.
pub struct MigAsk<'a> {
    /// Memory in bytes (0: the smallest profile).
    pub memory_bytes: u64,
    /// Percent of a GPU's compute, when the request names cores: as many compute slices
    /// of the GPU's as that percent of them, rounded up.
    pub cores: Option<u32>,
    /// Whether the claim's selectors accept device `d` on node `node`.
    pub allowed: &'a dyn Fn(&str, &MigDevice) -> bool,
}

impl MigAsk<'_> {
    /// The request on a GPU of `table`.
    pub fn request(&self, table: &MigTable) -> MigRequest {
        let compute_slices = self.cores.filter(|&c| c > 0).map(|c| {
            let total = u32::from(table.compute_slices);
            u8::try_from(c.saturating_mul(total).div_ceil(100).min(total)).unwrap_or(u8::MAX)
        });
        MigRequest {
            memory_bytes: self.memory_bytes,
            compute_slices,
        }
    }
}

/// A placement chosen for a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    /// The node.
    pub node: String,
    /// The device to allocate.
    pub device: String,
    /// Its profile.
    pub profile: &'static MigProfile,
    /// The parent GPU's UUID.
    pub parent_uuid: String,
}

/// Why no placement was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unplaced {
    /// No MIG-mode GPU of the candidates could ever hold the request (none there, or no
    /// profile large enough): the claim waits as `never_fits`, else as `no_fit`.
    pub never: bool,
    /// The message for the claim and the pod.
    pub message: String,
}

impl MigNode {
    /// The MIG-mode GPUs of node `name` from its placement devices `devices`, the pool's
    /// counter sets `counter_sets` (name → counter → value) and the UUIDs of its devices of
    /// type `gpu` (`gpu_uuids`). A GPU that cannot be read is left out with a problem
    /// naming a slice and field; so is a device that does not belong to its GPU's table.
    pub fn build(
        name: &str,
        devices: Vec<SliceMigDevice>,
        counter_sets: &BTreeMap<String, BTreeMap<String, u64>>,
        gpu_uuids: &BTreeSet<String>,
    ) -> (MigNode, Vec<Problem>) {
        let mut groups: Vec<(String, Vec<SliceMigDevice>)> = Vec::new();
        for d in devices {
            match groups.iter_mut().find(|(u, _)| *u == d.parent_uuid) {
                Some((_, g)) => g.push(d),
                None => groups.push((d.parent_uuid.clone(), vec![d])),
            }
        }
        let mut problems = Vec::new();
        let mut gpus = Vec::new();
        for (uuid, devices) in groups {
            match build_gpu(&uuid, devices, counter_sets, gpu_uuids, &mut problems) {
                Ok(g) => gpus.push(g),
                Err(p) => problems.push(p),
            }
        }
        let node = MigNode {
            name: name.to_owned(),
            gpus,
        };
        (node, problems)
    }
}

/// A problem at `field` of device `d`.
fn problem(d: &SliceMigDevice, field: &str, what: String) -> Problem {
    (d.slice.clone(), format!("{}.{field}", d.path), what)
}

/// The GPU `uuid` from its devices; a problem when it cannot be used at all. Devices that
/// do not fit its table are left out and reported in `problems`.
fn build_gpu(
    uuid: &str,
    devices: Vec<SliceMigDevice>,
    counter_sets: &BTreeMap<String, BTreeMap<String, u64>>,
    gpu_uuids: &BTreeSet<String>,
    problems: &mut Vec<Problem>,
) -> Result<MigGpu, Problem> {
    let first = devices[0].clone();
    if gpu_uuids.contains(uuid) {
        return Err(problem(
            &first,
            "attributes.parentUUID",
            format!(
                "GPU {uuid} is also published as a device of type gpu (mode shared or whole); its MIG placements are left out"
            ),
        ));
    }
    let product = first.product.clone();
    let profiles: Vec<(&str, u64)> = devices
        .iter()
        .map(|d| (d.profile.as_str(), d.memory))
        .collect();
    let table = match mig::tables_with_profiles(&product, profiles.iter().copied()).as_slice() {
        [t] => *t,
        [] => {
            return Err(problem(
                &first,
                "attributes.productName",
                format!(
                    "GPU {uuid} ({product:?}): no MIG profile table has the profiles it publishes; its placements are left out"
                ),
            ));
        }
        several => {
            let models: Vec<&str> = several.iter().map(|t| t.model).collect();
            return Err(problem(
                &first,
                "attributes.productName",
                format!(
                    "GPU {uuid} ({product:?}): the profiles it publishes fit several models ({}); its placements are left out",
                    models.join(", ")
                ),
            ));
        }
    };
    let counter_set = first.counter_set.clone();
    let counters = match &counter_set {
        None => BTreeMap::new(),
        Some(set) => counter_sets.get(set).cloned().ok_or_else(|| {
            problem(
                &first,
                "consumesCounters[0].counterSet",
                format!("{set:?} is in no slice's sharedCounters of the pool"),
            )
        })?,
    };
    let mut out = Vec::new();
    for d in devices {
        if d.counter_set != counter_set {
            problems.push(problem(
                &d,
                "consumesCounters",
                format!(
                    "consumes from {:?}, the GPU's other placements from {counter_set:?}; left out",
                    d.counter_set
                ),
            ));
            continue;
        }
        let profile = table
            .profile(&d.profile)
            .expect("the table has every profile published");
        let Some(start) = mig::parse_device_name(&d.name)
            .filter(|n| n.label == profile.label())
            .map(|n| n.start)
            .filter(|s| profile.starts.contains(s))
        else {
            problems.push(problem(
                &d,
                "name",
                format!(
                    "{:?} is not gpu-<index>-mig-{}-<start> with a start of {}'s ({:?}); left out",
                    d.name,
                    profile.label(),
                    profile.name,
                    profile.starts
                ),
            ));
            continue;
        };
        out.push(MigDevice {
            name: d.name,
            profile,
            start,
            consumes: d.consumes,
            info: d.info,
        });
    }
    Ok(MigGpu {
        parent_uuid: uuid.to_owned(),
        product,
        table,
        counter_set,
        counters,
        devices: Arc::new(out),
        layout: MigLayout::new(table),
        taken: BTreeSet::new(),
    })
}

impl MigInventory {
    /// Marks device `device` of node `node` taken by an allocated claim: its instance goes
    /// into the GPU's layout and its counters are consumed. An error (the device is
    /// unknown, already taken, or does not fit beside the others) says why; the device is
    /// then still held as far as it can be (counters consumed down to zero), so nothing
    /// that overlaps it is chosen.
    pub fn take(&mut self, node: &str, device: &str) -> Result<(), String> {
        let Some(n) = self.nodes.iter_mut().find(|n| n.name == node) else {
            return Err(format!(
                "{node}/{device}: node {node} publishes no MIG placement"
            ));
        };
        let found = n
            .gpus
            .iter_mut()
            .find_map(|g| Some((g.devices.iter().position(|d| d.name == device)?, g)));
        let Some((i, gpu)) = found else {
            return Err(format!(
                "{node}/{device} is not a MIG placement any slice of node {node} publishes"
            ));
        };
        if !gpu.taken.insert(device.to_owned()) {
            return Err(format!(
                "{node}/{device} is allocated to another claim already"
            ));
        }
        let d = &gpu.devices[i];
        let mut short = None;
        for (c, want) in &d.consumes {
            let have = gpu.counters.entry(c.clone()).or_insert(0);
            if *have < *want && short.is_none() {
                short = Some(format!(
                    "{node}/{device}: counter {c} of {} has {have} left, needs {want}",
                    gpu.counter_set.as_deref().unwrap_or("?")
                ));
            }
            *have = have.saturating_sub(*want);
        }
        let placed = gpu
            .layout
            .take(d.profile.name, d.start)
            .map_err(|e| format!("{node}/{device}: {e}"));
        match (short, placed) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(_)) => Ok(()),
        }
    }

    /// Gives back device `device` of node `node`, taken by [`MigInventory::take`] without
    /// an error (a placement planned for a claim whose other placements did not fit).
    pub fn release(&mut self, node: &str, device: &str) {
        let Some(gpu) = self
            .nodes
            .iter_mut()
            .filter(|n| n.name == node)
            .flat_map(|n| n.gpus.iter_mut())
            .find(|g| g.taken.contains(device))
        else {
            return;
        };
        gpu.taken.remove(device);
        if let Some(d) = gpu.devices.iter().find(|d| d.name == device) {
            for (c, n) in &d.consumes {
                if let Some(have) = gpu.counters.get_mut(c) {
                    *have += n;
                }
            }
            gpu.layout.release(d.profile.name, d.start);
        }
    }

    /// The placement for `ask`: on node `node` alone when given (the pod's other claims are
    /// there), else on any node away from `avoid` (any node when that leaves none).
    pub fn choose(
        &self,
        ask: &MigAsk<'_>,
        node: Option<&str>,
        avoid: Option<&BTreeSet<String>>,
    ) -> Result<Chosen, Unplaced> {
        let mut nodes: Vec<&MigNode> = match node {
            Some(n) => self.nodes.iter().filter(|x| x.name == n).collect(),
            None => self.nodes.iter().collect(),
        };
        if let (None, Some(avoid)) = (node, avoid)
            && nodes.iter().any(|n| !avoid.contains(&n.name))
        {
            nodes.retain(|n| !avoid.contains(&n.name));
        }
        let gpus: Vec<(&MigNode, &MigGpu)> = nodes
            .iter()
            .flat_map(|n| n.gpus.iter().map(move |g| (*n, g)))
            .collect();
        if gpus.is_empty() {
            let e = MigError::NoGpus {
                request: String::new(),
            };
            return Err(self.unplaced(ask, &nodes, &e));
        }
        let layouts: Vec<&MigLayout> = gpus.iter().map(|(_, g)| &g.layout).collect();
        let request = |i: usize| ask.request(gpus[i].1.table);
        let allowed = |i: usize, profile: &MigProfile, start: u8| {
            let (n, g) = gpus[i];
            g.device(profile, start)
                .is_some_and(|d| g.is_free(d) && (ask.allowed)(&n.name, d))
        };
        match mig::choose_across_where(&layouts, &request, &allowed) {
            Ok((i, c)) => {
                let (n, g) = gpus[i];
                let d = g
                    .device(c.profile, c.placement.start)
                    .expect("only published placements are allowed");
                Ok(Chosen {
                    node: n.name.clone(),
                    device: d.name.clone(),
                    profile: c.profile,
                    parent_uuid: g.parent_uuid.clone(),
                })
            }
            Err(e) => Err(self.unplaced(ask, &nodes, &e)),
        }
    }

    /// Why `ask` has no placement on `nodes`: no MIG-mode GPU, no profile large enough, or
    /// the largest free profile per node.
    fn unplaced(&self, ask: &MigAsk<'_>, nodes: &[&MigNode], e: &MigError) -> Unplaced {
        let need = format!("{:.1} GiB", ask.memory_bytes as f64 / GIB as f64);
        let count: usize = nodes.iter().map(|n| n.gpus.len()).sum();
        if count == 0 {
            return Unplaced {
                never: true,
                message: "no MIG-mode GPU publishes placements".to_owned(),
            };
        }
        if matches!(e, MigError::TooLarge { .. }) {
            let largest: Vec<String> = nodes
                .iter()
                .flat_map(|n| n.gpus.iter())
                .map(|g| {
                    let p = g.table.profiles.iter().max_by_key(|p| p.memory_slices);
                    format!("{} {}", g.table.model, p.map_or("none", |p| p.name))
                })
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            return Unplaced {
                never: true,
                message: format!(
                    "no MIG profile of the {count} MIG-mode GPUs holds {e_req}; the largest: {}",
                    largest.join(", "),
                    e_req = describe(ask, &need),
                ),
            };
        }
        let per_node: Vec<String> = nodes
            .iter()
            .map(|n| {
                let best = n
                    .gpus
                    .iter()
                    .filter_map(|g| g.largest_free().map(|p| (p, g)))
                    .max_by_key(|(p, _)| (p.memory_slices, p.compute_slices, p.memory_gib));
                match best {
                    Some((p, g)) => format!("{}: {} (GPU {})", n.name, p.name, g.parent_uuid),
                    None => format!("{}: none", n.name),
                }
            })
            .collect();
        Unplaced {
            never: false,
            message: format!(
                "no free MIG placement holds {}; largest free profile per node: {}",
                describe(ask, &need),
                per_node.join(", ")
            ),
        }
    }
}

/// `memory 40.0 GiB`, with the cores when the request names some.
fn describe(ask: &MigAsk<'_>, need: &str) -> String {
    match ask.cores.filter(|&c| c > 0) {
        Some(c) => format!("memory {need} and {c}% of a GPU's compute"),
        None => format!("memory {need}"),
    }
}
