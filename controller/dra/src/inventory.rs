//! This driver's ResourceSlices ([`ResourceSlice`], the typed model of `fgpu_api::dra`) →
//! the engine's [`Inventory`].
//!
//! A node is a pool (`spec.pool.name`, which the kubelet plugin names after the node;
//! `spec.nodeName` when the pool has no name; a slice whose pool and node names differ is
//! malformed, since allocations select the node by the pool's name). Per device: GPU id =
//! device name, `uuid`, `productName` as the model, `index` (labels only; left out when not
//! an int), `numaNode`, `resource.kubernetes.io/pcieRoot`, and the capacities `memory`
//! (bytes) and `cores` (percent, 100 when absent). `v1` and `v1beta2` devices carry these
//! directly, `v1beta1` devices under `basic` ([`Device::body`]). Slices of other drivers
//! are ignored; of a pool published in several generations only the newest counts (a pool
//! may span several slices of one generation). Devices whose `type` is `mig` (MIG
//! placements) are never a share's: they go, with the pool's `sharedCounters`, into
//! [`SliceInventory::mig`] ([`crate::mig`]); other types are left out. A GPU published
//! with the attribute `mode` = `whole` takes only whole-GPU claims ([`is_whole_mode`]). A
//! device's `taints` are carried to the engine, which keeps a request off a device with a
//! `NoSchedule` or `NoExecute` taint it does not tolerate (the plugin taints unhealthy
//! GPUs); so are the taints of the admins' DeviceTaintRules
//! ([`SliceInventory::apply_taint_rules`]), which fgpu reads and never writes.
//!
//! Every attribute of the four scalar kinds and every capacity of a device is also kept,
//! per node and device ([`SliceInventory::devices`]), for CEL selectors; names and string
//! values are stored once per inventory.
//!
//! A malformed slice is left out whole and reported with the slice's name and the field;
//! the other slices are still used. The typed model reads any JSON object, keeping the
//! fields of the wrong type that are reported here, so the checks are all in this module.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use fgpu_api::dra::slice::{
    self, Attribute, Checked, Device, DeviceTaintRule, QuantityValue, ResourceSlice, SliceSpec,
};
use fgpu_api::names::{attr, capacity};
use fgpu_driver::engine::{Gpu, Inventory, Node, Taint};

use crate::QuantityError;
use crate::mig::{MigInventory, MigNode, SliceMigDevice};
use crate::selector::{Attr, DeviceInfo, Quantity};

/// A slice that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ResourceSlice {slice}: {field}: {problem}")]
pub struct SliceError {
    /// `metadata.name` of the slice.
    pub slice: String,
    /// Path of the bad field inside the slice.
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

/// A DeviceTaintRule that could not be read (its taint is not applied).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("DeviceTaintRule {rule}: {field}: {problem}")]
pub struct RuleError {
    /// `metadata.name` of the rule.
    pub rule: String,
    /// Path of the bad field inside the rule.
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

/// The inventory, and the slices and taint rules that were left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceInventory {
    /// Nodes sorted by name, GPUs in slice order.
    pub inventory: Inventory,
    /// Per node and device name, every attribute and capacity the slice publishes, for
    /// CEL selectors ([`crate::selector`]).
    pub devices: BTreeMap<String, BTreeMap<String, DeviceInfo>>,
    /// One error per slice left out.
    pub errors: Vec<SliceError>,
    /// One error per DeviceTaintRule left out.
    pub rule_errors: Vec<RuleError>,
    /// The MIG-mode GPUs: their placement devices and counters ([`crate::mig`]).
    pub mig: MigInventory,
}

/// A string field that is set and not empty.
fn non_empty(field: &Option<String>) -> Option<&str> {
    field.as_deref().filter(|s| !s.is_empty())
}

/// How messages name an object without a name.
const UNNAMED: &str = "<unnamed>";

impl SliceInventory {
    /// Adds the taint of each admin's DeviceTaintRule among `rules` to the devices of
    /// `driver` it selects: every field its `spec.deviceSelector` sets (`driver`, `pool`,
    /// `device`) must match; an empty selector matches every device, a missing one none
    /// (the API's rules). A device keeps its slice taints beside the rules'. A rule without
    /// a taint key or effect is left out and reported.
    pub fn apply_taint_rules<R: Borrow<DeviceTaintRule>>(
        &mut self,
        driver: &str,
        rules: impl IntoIterator<Item = R>,
    ) {
        for rule in rules {
            let rule = rule.borrow();
            let name = rule.metadata.name.as_deref().unwrap_or(UNNAMED);
            let Some(selector) = &rule.spec.device_selector else {
                continue;
            };
            if non_empty(&selector.driver).is_some_and(|d| d != driver) {
                continue;
            }
            let taint = match read_taint(&rule.spec.taint) {
                Ok(t) => t,
                Err(problem) => {
                    self.rule_errors.push(RuleError {
                        rule: name.to_owned(),
                        field: "spec.taint".into(),
                        problem,
                    });
                    continue;
                }
            };
            for node in &mut self.inventory.nodes {
                if non_empty(&selector.pool).is_some_and(|p| p != node.name) {
                    continue;
                }
                for gpu in &mut node.gpus {
                    if non_empty(&selector.device).is_none_or(|d| d == gpu.id)
                        && !gpu.taints.contains(&taint)
                    {
                        gpu.taints.push(taint.clone());
                    }
                }
            }
        }
    }
}

/// Reads every slice of `driver` among `slices` (other drivers' are skipped). Takes them
/// one at a time, owned or borrowed.
pub fn from_slices<S: Borrow<ResourceSlice>>(
    driver: &str,
    slices: impl IntoIterator<Item = S>,
) -> SliceInventory {
    // pool → (generation, node name, what the slices of that generation hold)
    let mut pools: BTreeMap<String, (i64, String, SliceParts)> = BTreeMap::new();
    let mut errors = Vec::new();
    let mut names = Interner::default();
    for slice in slices {
        let slice = slice.borrow();
        if slice.spec.driver.as_deref() != Some(driver) {
            continue;
        }
        let slice_name = slice.metadata.name.as_deref().unwrap_or(UNNAMED);
        match read_slice(slice_name, &slice.spec, &mut names) {
            Ok((pool, generation, parts)) => {
                let entry = pools
                    .entry(pool.clone())
                    .or_insert_with(|| (generation, pool.clone(), SliceParts::default()));
                if generation > entry.0 {
                    *entry = (generation, pool, parts);
                } else if generation == entry.0 {
                    entry.2.extend(parts);
                }
            }
            Err((field, problem)) => errors.push(SliceError {
                slice: slice_name.to_owned(),
                field,
                problem,
            }),
        }
    }
    let mut devices = BTreeMap::new();
    let mut mig = MigInventory::default();
    let nodes = pools
        .into_values()
        .map(|(_, name, parts)| {
            let (gpus, infos): (Vec<Gpu>, Vec<DeviceInfo>) = parts.gpus.into_iter().unzip();
            devices.insert(
                name.clone(),
                gpus.iter().map(|g| g.id.clone()).zip(infos).collect(),
            );
            errors.extend(parts.mig_errors);
            if !parts.mig.is_empty() {
                let uuids = gpus.iter().map(|g| g.uuid.clone()).collect();
                let (node, problems) =
                    MigNode::build(&name, parts.mig, &parts.counter_sets, &uuids);
                errors.extend(
                    problems
                        .into_iter()
                        .map(|(slice, field, problem)| SliceError {
                            slice,
                            field,
                            problem,
                        }),
                );
                if !node.gpus.is_empty() {
                    mig.nodes.push(node);
                }
            }
            Node::new(name, gpus)
        })
        .collect();
    SliceInventory {
        inventory: Inventory { nodes },
        devices,
        errors,
        rule_errors: Vec::new(),
        mig,
    }
}

/// What the slices of one pool generation hold: GPUs, MIG placement devices and counter
/// sets.
#[derive(Default)]
struct SliceParts {
    gpus: SliceGpus,
    mig: Vec<SliceMigDevice>,
    /// `spec.sharedCounters`: set name → counter → value.
    counter_sets: BTreeMap<String, BTreeMap<String, u64>>,
    /// MIG devices left out.
    mig_errors: Vec<SliceError>,
}

impl SliceParts {
    fn extend(&mut self, other: SliceParts) {
        self.gpus.extend(other.gpus);
        self.mig.extend(other.mig);
        self.counter_sets.extend(other.counter_sets);
        self.mig_errors.extend(other.mig_errors);
    }
}

/// One copy of each attribute name and string value (most repeat on every device).
#[derive(Default)]
struct Interner(std::collections::HashSet<std::sync::Arc<str>>);

impl Interner {
    fn get(&mut self, s: &str) -> std::sync::Arc<str> {
        if let Some(a) = self.0.get(s) {
            return a.clone();
        }
        let a: std::sync::Arc<str> = std::sync::Arc::from(s);
        self.0.insert(a.clone());
        a
    }
}

/// What a CEL selector sees of a device: attributes of the four scalar kinds (others, such
/// as lists, are left out), capacity values that parse. Kept for every device between
/// passes, so its lists hold no spare room (a list grown by pushing has up to twice what
/// it holds: 1.5 MiB at 8,000 devices).
fn device_info(device: &Device, names: &mut Interner) -> DeviceInfo {
    let body = device.body();
    let mut info = DeviceInfo {
        attributes: Vec::with_capacity(body.attributes.len()),
        capacity: Vec::with_capacity(body.capacity.len()),
        multi: device.allows_multiple_allocations(),
    };
    for (k, v) in &body.attributes {
        let a = match v {
            Attribute::Int(i) => Attr::Int(*i),
            Attribute::Bool(b) => Attr::Bool(*b),
            Attribute::String(s) => Attr::Str(names.get(s)),
            Attribute::Version(s) => Attr::Version(names.get(s)),
            Attribute::Other => continue,
        };
        info.attributes.push((names.get(k), a));
    }
    for (k, c) in &body.capacity {
        let q = match &c.value {
            Some(QuantityValue::String(s)) => Quantity::parse(s).ok(),
            Some(QuantityValue::Number(n)) => n.as_i64().map(Quantity::from_int),
            _ => None,
        };
        if let Some(q) = q {
            info.capacity.push((names.get(k), q));
        }
    }
    info.attributes.shrink_to_fit();
    info.capacity.shrink_to_fit();
    info
}

/// A capacity's `value` resolved to a whole number (as [`crate::quantity_u64`] resolves a
/// JSON value, with the same errors).
pub(crate) fn capacity_u64(v: Option<&QuantityValue>) -> Result<u64, QuantityError> {
    match v {
        Some(QuantityValue::String(s)) => Ok(fgpu_api::quantity::parse_u64(s)?),
        Some(QuantityValue::Number(n)) => n
            .as_u64()
            .ok_or_else(|| QuantityError::NotANonNegativeInteger(n.clone())),
        Some(QuantityValue::Invalid(raw)) => Err(QuantityError::NotAQuantity(raw.value())),
        None => Err(QuantityError::Missing),
    }
}

type FieldError = (String, String);

type SliceGpus = Vec<(Gpu, DeviceInfo)>;

/// A problem with `spec.<field>`.
fn bad(field: &str, problem: &str) -> FieldError {
    (format!("spec.{field}"), problem.to_owned())
}

/// The pool, the generation and what one slice (`name`) of this driver holds.
fn read_slice(
    name: &str,
    spec: &SliceSpec,
    names: &mut Interner,
) -> Result<(String, i64, SliceParts), FieldError> {
    let pool = pool_name(spec)?;
    let generation = generation(spec)?;
    let counter_sets = read_counter_sets(spec)?;
    let devices = match &spec.devices {
        None => {
            let parts = SliceParts {
                counter_sets,
                ..SliceParts::default()
            };
            return Ok((pool, generation, parts));
        }
        Some(Checked::Valid(d)) => d,
        Some(Checked::Invalid(_)) => return Err(bad("devices", "not a list")),
    };
    let gpus = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| is_gpu(d))
        .map(|(i, d)| read_device(i, d, names))
        .collect::<Result<_, _>>()?;
    // A bad MIG device is left out alone: the slice's GPUs stay.
    let mut mig = Vec::new();
    let mut mig_errors = Vec::new();
    for (i, d) in devices.iter().enumerate().filter(|(_, d)| is_mig(d)) {
        match read_mig_device(name, i, d, names) {
            Ok(m) => mig.push(m),
            Err((field, problem)) => mig_errors.push(SliceError {
                slice: name.to_owned(),
                field,
                problem: format!("{problem}; the MIG placement is left out"),
            }),
        }
    }
    let parts = SliceParts {
        gpus,
        mig,
        counter_sets,
        mig_errors,
    };
    Ok((pool, generation, parts))
}

/// Whether a device is a GPU the engine may share: its `type` is `gpu`, or it has none
/// (slices of older plugins). MIG placements (`type` `mig`) are read apart
/// ([`read_mig_device`]): a share must never land on one.
fn is_gpu(d: &Device) -> bool {
    d.body()
        .attributes
        .get(attr::TYPE)
        .is_none_or(|t| t.as_string() == Some(attr::TYPE_GPU))
}

/// Whether a device is a MIG placement (`type` `mig`).
fn is_mig(d: &Device) -> bool {
    d.body()
        .attributes
        .get(attr::TYPE)
        .is_some_and(|t| t.as_string() == Some(attr::TYPE_MIG))
}

/// Whether a GPU is published in `whole` mode (attribute `mode` = `whole`): it takes only
/// whole-GPU claims, never a share. A GPU without the attribute (older plugins) is
/// `shared`.
pub fn is_whole_mode(info: &DeviceInfo) -> bool {
    info.attributes
        .iter()
        .any(|(k, v)| &**k == attr::MODE && matches!(v, Attr::Str(s) if &**s == attr::MODE_WHOLE))
}

/// `spec.sharedCounters`: set name → counter → value.
fn read_counter_sets(
    spec: &SliceSpec,
) -> Result<BTreeMap<String, BTreeMap<String, u64>>, FieldError> {
    let mut out = BTreeMap::new();
    for (i, set) in spec.shared_counters.iter().enumerate() {
        let at = |f: &str| format!("spec.sharedCounters[{i}].{f}");
        let name = non_empty(&set.name).ok_or_else(|| (at("name"), "missing".to_owned()))?;
        let mut counters = BTreeMap::new();
        for (c, v) in &set.counters {
            let n = capacity_u64(v.value.as_ref())
                .map_err(|p| (at(&format!("counters.{c}.value")), p.to_string()))?;
            counters.insert(c.clone(), n);
        }
        out.insert(name.to_owned(), counters);
    }
    Ok(out)
}

/// The `i`th device of slice `slice` as a MIG placement device: it needs a name and the
/// attributes `profile`, `memory` and `parentUUID`; its `consumesCounters` names at most
/// one counter set.
fn read_mig_device(
    slice: &str,
    i: usize,
    d: &Device,
    names: &mut Interner,
) -> Result<SliceMigDevice, FieldError> {
    let name = named(i, d)?;
    let body = d.body();
    let field = |f: &str| body_field(i, d, f);
    let string = |n: &str| {
        body.attributes
            .get(n)
            .and_then(Attribute::as_string)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| {
                (
                    field(&format!("attributes[{n:?}]")),
                    "missing or not a string attribute".to_owned(),
                )
            })
    };
    let memory = body
        .attributes
        .get(attr::MEMORY)
        .and_then(Attribute::as_int)
        .and_then(|m| u64::try_from(m).ok())
        .ok_or_else(|| {
            (
                field("attributes[\"memory\"]"),
                "missing or not a non-negative int attribute".to_owned(),
            )
        })?;
    let (counter_set, consumes) = match body.consumes_counters.as_slice() {
        [] => (None, BTreeMap::new()),
        [c] => {
            let set = non_empty(&c.counter_set).ok_or_else(|| {
                (
                    field("consumesCounters[0].counterSet"),
                    "missing".to_owned(),
                )
            })?;
            let mut consumes = BTreeMap::new();
            for (n, v) in &c.counters {
                let value = capacity_u64(v.value.as_ref()).map_err(|p| {
                    (
                        field(&format!("consumesCounters[0].counters.{n}.value")),
                        p.to_string(),
                    )
                })?;
                consumes.insert(n.clone(), value);
            }
            (Some(set.to_owned()), consumes)
        }
        more => {
            return Err((
                field("consumesCounters"),
                format!(
                    "{} counter sets; a MIG placement consumes from its GPU's one",
                    more.len()
                ),
            ));
        }
    };
    Ok(SliceMigDevice {
        slice: slice.to_owned(),
        path: format!("spec.devices[{i}]"),
        name: name.to_owned(),
        profile: string(attr::PROFILE)?,
        memory,
        parent_uuid: string(attr::PARENT_UUID)?,
        product: string(attr::PRODUCT_NAME)?,
        counter_set,
        consumes,
        info: device_info(d, names),
    })
}

/// The node a slice's devices are on: its pool's name, or its `nodeName` where the pool
/// has none; both must agree.
fn pool_name(spec: &SliceSpec) -> Result<String, FieldError> {
    let pool = match (non_empty(&spec.pool.name), non_empty(&spec.node_name)) {
        (Some(p), _) => p.to_owned(),
        (_, Some(n)) => n.to_owned(),
        _ => {
            return Err(bad(
                "pool.name",
                "missing; neither a pool name nor a nodeName",
            ));
        }
    };
    if let Some(n) = non_empty(&spec.node_name).filter(|n| *n != pool) {
        return Err(bad(
            "pool.name",
            &format!(
                "{pool:?} differs from nodeName {n:?}; this driver names each pool after its node"
            ),
        ));
    }
    Ok(pool)
}

/// `spec.pool.generation`, 0 when missing.
fn generation(spec: &SliceSpec) -> Result<i64, FieldError> {
    match &spec.pool.generation {
        None => Ok(0),
        Some(Checked::Valid(g)) => Ok(*g),
        Some(Checked::Invalid(_)) => Err(bad("pool.generation", "not an integer")),
    }
}

/// The name of the `i`th device of a slice; it must be there.
fn named(i: usize, d: &Device) -> Result<&str, FieldError> {
    d.name.as_deref().filter(|n| !n.is_empty()).ok_or_else(|| {
        (
            format!("spec.devices[{i}].name"),
            "missing or not a string".to_owned(),
        )
    })
}

/// The path of field `f` of the `i`th device's body (under `basic` in `v1beta1`).
fn body_field(i: usize, d: &Device, f: &str) -> String {
    let prefix = if d.basic.is_some() { "basic." } else { "" };
    format!("spec.devices[{i}].{prefix}{f}")
}

/// The `i`th device of a slice as a GPU, and what selectors see of it.
fn read_device(
    i: usize,
    d: &Device,
    names: &mut Interner,
) -> Result<(Gpu, DeviceInfo), FieldError> {
    let name = named(i, d)?;
    let body = d.body();
    let field = |f: &str| body_field(i, d, f);
    let attrs = &body.attributes;
    let string_attr = |n: &str| -> Result<Option<String>, FieldError> {
        match attrs.get(n) {
            None => Ok(None),
            Some(a) => a.as_string().map(|s| Some(s.to_owned())).ok_or_else(|| {
                (
                    field(&format!("attributes[{n:?}]")),
                    "not a string attribute".to_owned(),
                )
            }),
        }
    };
    let numa = match attrs.get(attr::NUMA_NODE) {
        None => None,
        Some(a) => Some(
            a.as_int()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    (
                        field("attributes.numaNode"),
                        "not a non-negative int attribute".to_owned(),
                    )
                })?,
        ),
    };
    // The driver's index: labels of the metrics only, so a bad one is left out rather
    // than the GPU.
    let index = attrs
        .get(attr::INDEX)
        .and_then(Attribute::as_int)
        .and_then(|n| u32::try_from(n).ok());
    let value = |name: &str| body.capacity.get(name).and_then(|c| c.value.as_ref());
    let memory = capacity_u64(value(capacity::MEMORY))
        .map_err(|p| (field("capacity.memory.value"), p.to_string()))?;
    let cores = match value(capacity::CORES) {
        None => capacity::CORES_PER_GPU,
        v => capacity_u64(v).map_err(|p| (field("capacity.cores.value"), p.to_string()))?,
    };
    let cores = u32::try_from(cores)
        .ok()
        .filter(|&c| c <= 100)
        .ok_or_else(|| {
            (
                field("capacity.cores.value"),
                format!("{cores} is above 100"),
            )
        })?;
    let mut gpu = Gpu::new(
        name,
        string_attr(attr::PRODUCT_NAME)?.unwrap_or_default(),
        memory,
    );
    gpu.uuid = string_attr(attr::UUID)?.unwrap_or_default();
    gpu.index = index;
    gpu.numa = numa;
    gpu.pcie_root = string_attr(attr::PCIE_ROOT)?;
    gpu.cores_total = cores;
    gpu.cores_free = cores;
    gpu.taints = body
        .taints
        .iter()
        .enumerate()
        .map(|(i, t)| read_taint(t).map_err(|p| (field(&format!("taints[{i}]")), p)))
        .collect::<Result<_, _>>()?;
    Ok((gpu, device_info(d, names)))
}

/// One taint (a slice device's or a DeviceTaintRule's): it needs a key and an effect.
fn read_taint(t: &slice::Taint) -> Result<Taint, String> {
    let key = t.key.as_deref().filter(|k| !k.is_empty());
    let effect = t.effect.as_deref().filter(|e| !e.is_empty());
    match (key, effect) {
        (Some(key), Some(effect)) => Ok(Taint {
            key: key.to_owned(),
            value: t.value.clone().unwrap_or_default(),
            effect: effect.to_owned(),
        }),
        _ => Err("a taint needs a key and an effect".to_owned()),
    }
}

/// JSON slices read into the typed model, as the cache reads the mirror's text (for the
/// tests of this crate, which write slices as JSON).
#[cfg(test)]
pub(crate) fn typed_slices<V: Borrow<serde_json::Value>>(
    slices: impl IntoIterator<Item = V>,
) -> Vec<ResourceSlice> {
    slices
        .into_iter()
        .map(|v| serde_json::from_value(v.borrow().clone()).expect("any object reads"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::typed_slices as typed;
    use super::*;
    use serde_json::{Value, json};

    const DRIVER: &str = "gpu.fgpu.dev";

    /// JSON DeviceTaintRules read into the typed model.
    fn typed_rules<V: Borrow<Value>>(rules: impl IntoIterator<Item = V>) -> Vec<DeviceTaintRule> {
        rules
            .into_iter()
            .map(|v| serde_json::from_value(v.borrow().clone()).expect("any object reads"))
            .collect()
    }

    fn v1_slice(node: &str, generation: i64, devices: Value) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": format!("{node}-{DRIVER}")},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}
        })
    }

    fn h100(minor: u32) -> Value {
        json!({
            "name": format!("gpu-{minor}"),
            "allowMultipleAllocations": true,
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": format!("GPU-{minor:08}-0000-0000-0000-000000000000")},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "index": {"int": minor},
                "numaNode": {"int": 0},
                "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"}
            },
            "capacity": {
                "memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi",
                    "validRange": {"min": "256Mi", "step": "1Mi"}}},
                "cores": {"value": "100", "requestPolicy": {"default": "0",
                    "validRange": {"min": "0", "max": "100", "step": "1"}}}
            }
        })
    }

    #[test]
    fn reads_every_version_and_ignores_other_drivers() {
        let v1beta1 = json!({
            "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice",
            "metadata": {"name": "node-b-gpu.fgpu.dev"},
            "spec": {"driver": DRIVER, "nodeName": "node-b",
                     "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "basic": {
                        "attributes": {"uuid": {"string": "GPU-b0"},
                                       "productName": {"string": "Tesla T4"}},
                        "capacity": {"memory": {"value": "15Gi"}, "cores": {"value": "100"}}}}]}
        });
        let other = json!({"metadata": {"name": "nic"}, "spec": {"driver": "net.example.com",
            "pool": {"name": "node-a"}, "devices": [{"name": "eth0"}]}});
        let slices = [
            v1_slice("node-a", 1, json!([h100(0), h100(1)])),
            v1beta1,
            other,
        ];
        let out = from_slices(DRIVER, typed(&slices));
        assert_eq!(out.errors, vec![]);
        let nodes = &out.inventory.nodes;
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].name, "node-a");
        let g = &nodes[0].gpus[1];
        assert_eq!(g.id, "gpu-1");
        assert_eq!(g.uuid, "GPU-00000001-0000-0000-0000-000000000000");
        assert_eq!(g.model, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.numa, Some(0));
        assert_eq!(g.index, Some(1));
        assert_eq!(g.pcie_root.as_deref(), Some("pci0000:15"));
        assert_eq!((g.memory_total, g.memory_free), (80 << 30, 80 << 30));
        assert_eq!((g.cores_total, g.cores_free), (100, 100));
        let t4 = &nodes[1].gpus[0];
        assert_eq!(
            (t4.id.as_str(), t4.uuid.as_str(), t4.model.as_str()),
            ("gpu-0", "GPU-b0", "Tesla T4")
        );
        assert_eq!(
            (t4.memory_total, t4.numa, t4.pcie_root.clone(), t4.index),
            (15 << 30, None, None, None)
        );
        // What selectors see: every attribute and capacity, also under `basic`.
        let info = &out.devices["node-a"]["gpu-1"];
        let attr = |n: &str| {
            info.attributes
                .iter()
                .find(|(k, _)| &**k == n)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(attr("type"), Some(Attr::Str("gpu".into())));
        assert_eq!(attr("index"), Some(Attr::Int(1)));
        assert_eq!(
            attr("resource.kubernetes.io/pcieRoot"),
            Some(Attr::Str("pci0000:15".into()))
        );
        assert!(info.multi);
        // Kept between passes for every device: no spare room in its lists.
        assert_eq!(info.attributes.capacity(), info.attributes.len());
        assert_eq!(info.capacity.capacity(), info.capacity.len());
        let memory = info.capacity.iter().find(|(k, _)| &**k == "memory");
        assert_eq!(memory.map(|(_, q)| *q), Quantity::parse("80Gi").ok());
        let t4 = &out.devices["node-b"]["gpu-0"];
        assert_eq!(t4.attributes.len(), 2);
        assert_eq!(t4.capacity.len(), 2);
        assert!(!t4.multi);
    }

    #[test]
    fn mig_placements_are_not_gpus_of_the_engine() {
        let mig = json!({
            "name": "gpu-1-mig-1g10gb-6",
            "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"},
                           "parentUUID": {"string": "GPU-1"}, "memory": {"int": 10u64 << 30},
                           "productName": {"string": "NVIDIA H100 80GB HBM3"}},
            "capacity": {"memory": {"value": "10Gi"}},
            "consumesCounters": [{"counterSet": "gpu-1-counters",
                                  "counters": {"memory-slice-6": {"value": "1"}}}]
        });
        // The same placement without its memory attribute: left out alone.
        let mut bad = mig.clone();
        bad["name"] = json!("gpu-1-mig-1g10gb-5");
        bad["attributes"].as_object_mut().unwrap().remove("memory");
        let counters = json!({
            "metadata": {"name": "node-a-gpu.fgpu.dev-counters-0"},
            "spec": {"driver": DRIVER, "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 2},
                     "sharedCounters": [{"name": "gpu-1-counters",
                                         "counters": {"memory-slice-6": {"value": "1"}}}]}
        });
        let out = from_slices(
            DRIVER,
            typed([v1_slice("node-a", 1, json!([h100(0), mig, bad])), counters]),
        );
        assert_eq!(
            out.errors,
            vec![SliceError {
                slice: format!("node-a-{DRIVER}"),
                field: "spec.devices[2].attributes[\"memory\"]".into(),
                problem:
                    "missing or not a non-negative int attribute; the MIG placement is left out"
                        .into(),
            }]
        );
        let gpus = &out.inventory.nodes[0].gpus;
        assert_eq!(
            gpus.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
            ["gpu-0"]
        );
        // The placement is the MIG inventory's, with its counters.
        let node = &out.mig.nodes[0];
        assert_eq!(node.name, "node-a");
        assert_eq!(node.gpus.len(), 1);
        let g = &node.gpus[0];
        assert_eq!(
            (g.parent_uuid.as_str(), g.table.model),
            ("GPU-1", "H100 80GB")
        );
        assert_eq!(g.counter_set.as_deref(), Some("gpu-1-counters"));
        assert_eq!(g.counters["memory-slice-6"], 1);
        assert_eq!(
            g.devices
                .iter()
                .map(|d| (d.name.as_str(), d.start))
                .collect::<Vec<_>>(),
            [("gpu-1-mig-1g10gb-6", 6)]
        );
    }

    #[test]
    fn device_taints_reach_the_engine() {
        let mut tainted = h100(1);
        tainted["taints"] = json!([{"key": "fgpu.dev/unhealthy", "value": "xid-79",
            "effect": "NoExecute", "timeAdded": "2026-12-02T00:00:00Z"}]);
        let out = from_slices(
            DRIVER,
            typed([v1_slice("node-a", 1, json!([h100(0), tainted]))]),
        );
        assert_eq!(out.errors, vec![]);
        let gpus = &out.inventory.nodes[0].gpus;
        assert!(gpus[0].taints.is_empty());
        assert_eq!(
            gpus[1].taints,
            vec![Taint {
                key: "fgpu.dev/unhealthy".into(),
                value: "xid-79".into(),
                effect: "NoExecute".into()
            }]
        );
        let mut bad = h100(0);
        bad["taints"] = json!([{"key": "k"}]);
        let out = from_slices(DRIVER, typed([v1_slice("node-a", 1, json!([bad]))]));
        assert_eq!(out.errors[0].field, "spec.devices[0].taints[0]");
    }

    fn rule(name: &str, selector: Value, taint: Value) -> Value {
        let mut spec = json!({"taint": taint});
        if !selector.is_null() {
            spec["deviceSelector"] = selector;
        }
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
               "metadata": {"name": name}, "spec": spec})
    }

    #[test]
    fn taint_rules_taint_the_devices_they_select() {
        let slices = [
            v1_slice("node-a", 1, json!([h100(0), h100(1)])),
            v1_slice("node-b", 1, json!([h100(0)])),
        ];
        let maint =
            json!({"key": "example.com/maintenance", "value": "bios", "effect": "NoSchedule"});
        let taint = Taint {
            key: "example.com/maintenance".into(),
            value: "bios".into(),
            effect: "NoSchedule".into(),
        };
        let tainted = |rules: Vec<Value>| -> (Vec<(String, String)>, Vec<RuleError>) {
            let mut out = from_slices(DRIVER, typed(&slices));
            out.apply_taint_rules(DRIVER, typed_rules(&rules));
            let mut hit = Vec::new();
            for n in &out.inventory.nodes {
                for g in &n.gpus {
                    if g.taints.contains(&taint) {
                        hit.push((n.name.clone(), g.id.clone()));
                    }
                }
            }
            (hit, out.rule_errors)
        };
        let pair = |n: &str, g: &str| (n.to_owned(), g.to_owned());
        // One device of one pool.
        let (hit, errors) = tainted(vec![rule(
            "one",
            json!({"driver": DRIVER, "pool": "node-a", "device": "gpu-1"}),
            maint.clone(),
        )]);
        assert_eq!((hit, errors), (vec![pair("node-a", "gpu-1")], vec![]));
        // A device name alone matches it in every pool; a pool alone, all of its devices.
        let (hit, _) = tainted(vec![rule("dev", json!({"device": "gpu-0"}), maint.clone())]);
        assert_eq!(hit, vec![pair("node-a", "gpu-0"), pair("node-b", "gpu-0")]);
        let (hit, _) = tainted(vec![rule("pool", json!({"pool": "node-a"}), maint.clone())]);
        assert_eq!(hit, vec![pair("node-a", "gpu-0"), pair("node-a", "gpu-1")]);
        // Empty selector: every device; no selector, or another driver's: none.
        let (hit, _) = tainted(vec![rule("all", json!({}), maint.clone())]);
        assert_eq!(hit.len(), 3);
        let (hit, _) = tainted(vec![
            rule("none", Value::Null, maint.clone()),
            rule("other", json!({"driver": "gpu.nvidia.com"}), maint.clone()),
        ]);
        assert_eq!(hit, vec![]);
        // Two rules with the same taint: once on the device.
        let mut out = from_slices(DRIVER, typed(&slices));
        let twice = rule("dev", json!({"device": "gpu-1"}), maint.clone());
        out.apply_taint_rules(DRIVER, typed_rules([&twice, &twice]));
        assert_eq!(out.inventory.nodes[0].gpus[1].taints, vec![taint.clone()]);
        // A rule without an effect is reported by name and field, and taints nothing.
        let (hit, errors) = tainted(vec![rule(
            "bad",
            json!({}),
            json!({"key": "example.com/maintenance"}),
        )]);
        assert_eq!(hit, vec![]);
        assert_eq!(
            errors[0].to_string(),
            "DeviceTaintRule bad: spec.taint: a taint needs a key and an effect"
        );
    }

    #[test]
    fn newest_generation_wins_and_slices_of_a_pool_merge() {
        let old = v1_slice("node-a", 1, json!([h100(0), h100(1)]));
        let mut new1 = v1_slice("node-a", 2, json!([h100(0)]));
        new1["metadata"]["name"] = json!("node-a-1");
        let new2 = v1_slice("node-a", 2, json!([h100(3)]));
        let out = from_slices(DRIVER, typed([&new1, &old, &new2]));
        let ids: Vec<_> = out.inventory.nodes[0]
            .gpus
            .iter()
            .map(|g| g.id.as_str())
            .collect();
        assert_eq!(ids, ["gpu-0", "gpu-3"]);
    }

    #[test]
    fn odd_values_are_named_as_they_came() {
        let cases = [
            (json!(true), "true is not a quantity"),
            (json!({"a": 1}), "{\"a\":1} is not a quantity"),
            (json!(-1), "-1 is not a non-negative integer"),
            (json!(1.5), "1.5 is not a non-negative integer"),
        ];
        for (value, want) in cases {
            let device = json!({"name": "gpu-0", "capacity": {"memory": {"value": value}}});
            let out = from_slices(DRIVER, typed([v1_slice("node-a", 1, json!([device]))]));
            assert_eq!(
                out.errors[0].to_string(),
                format!(
                    "ResourceSlice node-a-{DRIVER}: spec.devices[0].capacity.memory.value: {want}"
                )
            );
        }
        // A whole-number quantity as a JSON number is read; taints that are not a list are
        // none.
        let device = json!({"name": "gpu-0", "capacity": {"memory": {"value": 1024}},
            "taints": {"key": "k"}});
        let out = from_slices(DRIVER, typed([v1_slice("node-a", 1, json!([device]))]));
        assert_eq!(out.errors, vec![]);
        let gpu = &out.inventory.nodes[0].gpus[0];
        assert_eq!((gpu.memory_total, gpu.taints.len()), (1024, 0));
    }

    #[test]
    fn malformed_slices_are_reported_and_the_rest_used() {
        let mut other_pool = v1_slice("node-x", 1, json!([]));
        other_pool["metadata"]["name"] = json!("bad-slice");
        other_pool["spec"]["pool"]["name"] = json!("pool-1");
        let out = from_slices(DRIVER, typed([&other_pool]));
        assert_eq!(out.errors[0].field, "spec.pool.name");
        assert!(
            out.errors[0]
                .to_string()
                .starts_with("ResourceSlice bad-slice: spec.pool.name: \"pool-1\" differs"),
            "{}",
            out.errors[0]
        );
        let cases: [(&str, Value, &str, &str); 5] = [
            (
                "no memory",
                json!({"name": "gpu-0", "capacity": {}}),
                "spec.devices[0].capacity.memory.value",
                "missing",
            ),
            (
                "bad memory",
                json!({"name": "gpu-0", "capacity": {"memory": {"value": "0.5"}}}),
                "spec.devices[0].capacity.memory.value",
                "whole",
            ),
            (
                "no name",
                json!({"capacity": {"memory": {"value": "1Gi"}}}),
                "spec.devices[0].name",
                "missing",
            ),
            (
                "cores above 100",
                json!({"name": "gpu-0", "capacity": {"memory": {"value": "1Gi"}, "cores": {"value": "200"}}}),
                "spec.devices[0].capacity.cores.value",
                "above 100",
            ),
            (
                "numa not int",
                json!({"name": "gpu-0", "basic": {"attributes": {"numaNode": {"string": "0"}},
                "capacity": {"memory": {"value": "1Gi"}}}}),
                "spec.devices[0].basic.attributes.numaNode",
                "int",
            ),
        ];
        for (what, device, field, problem) in cases {
            let mut bad = v1_slice("node-x", 1, json!([device]));
            bad["metadata"]["name"] = json!("bad-slice");
            let out = from_slices(
                DRIVER,
                typed([&bad, &v1_slice("node-a", 1, json!([h100(0)]))]),
            );
            assert_eq!(out.errors.len(), 1, "{what}");
            let e = &out.errors[0];
            assert_eq!(
                (e.slice.as_str(), e.field.as_str()),
                ("bad-slice", field),
                "{what}"
            );
            assert!(e.problem.contains(problem), "{what}: {e}");
            assert_eq!(
                out.inventory.nodes.len(),
                1,
                "{what}: the good slice is kept"
            );
            assert_eq!(out.inventory.nodes[0].name, "node-a");
        }
    }
}
