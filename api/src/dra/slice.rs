//! A `resource.k8s.io` ResourceSlice and DeviceTaintRule, typed and tolerant: the fields the
//! controller reads of them, and no more (its mirror keeps a slice as this model serialized
//! back, so these fields are the list of what it keeps).
//!
//! One model for `v1`, `v1beta2` and `v1beta1`: a `v1beta1` device wraps its fields in
//! `basic`, the newer ones carry them directly; [`Device::body`] gives them either way.
//! Partitionable devices (a MIG-mode GPU's placements) add the slice's `sharedCounters`
//! ([`CounterSet`]) and each device's `consumesCounters` ([`CounterConsumption`]).
//!
//! Tolerant: unknown fields are ignored, missing ones read as absent or empty, and a field
//! of the wrong JSON type never fails the object ([`super::tolerant`]). Where a reader reports such a field
//! (`spec.pool.generation`, `spec.devices`, a capacity's `value`) the model keeps it as it
//! came ([`Checked::Invalid`], [`QuantityValue::Invalid`]); elsewhere it reads as absent (a
//! name that is not a string), as the default (a device that is not an object), or is left
//! out (an attribute or capacity whose value is null). So any JSON object deserializes,
//! and serializing the result back gives an object that reads the same.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::tolerant;
pub use super::tolerant::{Checked, RawJson};

/// A ResourceSlice, reduced to what the controller reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceSlice {
    /// Name, UID and resource version.
    #[serde(default, deserialize_with = "tolerant::object")]
    pub metadata: Metadata,
    /// Driver, node, pool and devices.
    #[serde(default, deserialize_with = "tolerant::object")]
    pub spec: SliceSpec,
}

impl ResourceSlice {
    /// The slice's devices: none when `spec.devices` is missing or not a list.
    pub fn devices(&self) -> &[Device] {
        match &self.spec.devices {
            Some(Checked::Valid(d)) => d,
            _ => &[],
        }
    }
}

/// `metadata`: what identifies the object. Each field is absent when missing or not a
/// string.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// `metadata.name`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    /// `metadata.uid`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub uid: Option<String>,
    /// `metadata.resourceVersion`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_version: Option<String>,
}

/// A slice's `spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceSpec {
    /// `spec.driver`: the driver that publishes the devices.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub driver: Option<String>,
    /// `spec.nodeName`: the node whose devices these are (fgpu's slices always set it).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub node_name: Option<String>,
    /// `spec.pool`.
    #[serde(default, deserialize_with = "tolerant::object")]
    pub pool: Pool,
    /// `spec.devices`, in order; `None` when missing. [`ResourceSlice::devices`] reads it.
    #[serde(
        default,
        deserialize_with = "tolerant::checked_list",
        skip_serializing_if = "Option::is_none"
    )]
    pub devices: Option<Checked<Vec<Device>>>,
    /// `spec.sharedCounters` (partitionable devices, 1.36+ or DRAPartitionableDevices):
    /// counter sets the pool's devices consume from. Since 1.35 a slice holds either these
    /// or devices, not both. Empty when missing or not a list.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub shared_counters: Vec<CounterSet>,
}

/// One entry of `spec.sharedCounters`: a named set of counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CounterSet {
    /// `name`, unique in the pool (fgpu's: `gpu-<index>-counters`).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    /// `counters` by name.
    #[serde(
        default,
        deserialize_with = "tolerant::map",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub counters: BTreeMap<String, Counter>,
}

/// A counter's amount: in a counter set, what there is; in a device's consumption, what
/// the device takes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counter {
    /// `value`; `None` when missing or null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<QuantityValue>,
}

/// One entry of a device's `consumesCounters`: what it takes from one counter set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterConsumption {
    /// `counterSet`: the name of a set in the pool's `sharedCounters`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub counter_set: Option<String>,
    /// `counters` by name.
    #[serde(
        default,
        deserialize_with = "tolerant::map",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub counters: BTreeMap<String, Counter>,
}

/// `spec.pool`: the pool the slice belongs to, and which generation of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// `spec.pool.name`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    /// `spec.pool.generation`: of a pool published in several generations only the newest
    /// counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<Checked<i64>>,
    /// `spec.pool.resourceSliceCount`: how many slices the generation has.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_int",
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_slice_count: Option<i64>,
}

/// One entry of `spec.devices`. Its fields are read from [`Device::body`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// `name`, unique in the pool (fgpu's: `gpu-<minor>`).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub name: Option<String>,
    /// `v1beta1`'s `basic`, which holds the device's fields there.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub basic: Option<DeviceBody>,
    /// The fields carried directly (`v1`, `v1beta2`).
    #[serde(flatten)]
    pub direct: DeviceBody,
}

impl Device {
    /// The device's fields: `basic` when the device has it (`v1beta1`), else those carried
    /// directly.
    pub fn body(&self) -> &DeviceBody {
        self.basic.as_ref().unwrap_or(&self.direct)
    }

    /// Whether the device allows several allocations at once (consumable capacity), set
    /// directly or under `basic`.
    pub fn allows_multiple_allocations(&self) -> bool {
        self.direct.allow_multiple_allocations == Some(true)
            || self
                .basic
                .as_ref()
                .is_some_and(|b| b.allow_multiple_allocations == Some(true))
    }
}

/// A device's fields (directly on the device, or under `v1beta1`'s `basic`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceBody {
    /// `attributes` by name (qualified or not, as published).
    #[serde(
        default,
        deserialize_with = "tolerant::map",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub attributes: BTreeMap<String, Attribute>,
    /// `capacity` by name.
    #[serde(
        default,
        deserialize_with = "tolerant::map",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub capacity: BTreeMap<String, Capacity>,
    /// `allowMultipleAllocations` (1.34+); absent when missing or not a bool.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_flag",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_multiple_allocations: Option<bool>,
    /// `taints`: empty when missing or not a list.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub taints: Vec<Taint>,
    /// `consumesCounters` (partitionable devices): empty when missing or not a list.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub consumes_counters: Vec<CounterConsumption>,
}

/// A device attribute: one of the four scalar kinds, or [`Attribute::Other`] (a kind this
/// model does not read, or not an object).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "AttributeFields", into = "AttributeFields")]
pub enum Attribute {
    /// `{"int": n}`.
    Int(i64),
    /// `{"bool": b}`.
    Bool(bool),
    /// `{"string": s}`.
    String(String),
    /// `{"version": v}` (semver).
    Version(String),
    /// Anything else; serialized as `{}`.
    #[default]
    Other,
}

impl Attribute {
    /// The string of a string attribute.
    pub fn as_string(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The number of an int attribute.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Self::Int(n) => Some(*n),
            _ => None,
        }
    }
}

/// An attribute as JSON: the first field of the right type, in this order, is its value.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct AttributeFields {
    #[serde(
        default,
        deserialize_with = "tolerant::opt_int",
        skip_serializing_if = "Option::is_none"
    )]
    int: Option<i64>,
    #[serde(
        default,
        deserialize_with = "tolerant::opt_flag",
        skip_serializing_if = "Option::is_none"
    )]
    bool: Option<bool>,
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    string: Option<String>,
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    version: Option<String>,
}

impl From<AttributeFields> for Attribute {
    fn from(f: AttributeFields) -> Self {
        match f {
            AttributeFields { int: Some(n), .. } => Self::Int(n),
            AttributeFields { bool: Some(b), .. } => Self::Bool(b),
            AttributeFields {
                string: Some(s), ..
            } => Self::String(s),
            AttributeFields {
                version: Some(v), ..
            } => Self::Version(v),
            _ => Self::Other,
        }
    }
}

impl From<Attribute> for AttributeFields {
    fn from(a: Attribute) -> Self {
        let mut f = Self::default();
        match a {
            Attribute::Int(n) => f.int = Some(n),
            Attribute::Bool(b) => f.bool = Some(b),
            Attribute::String(s) => f.string = Some(s),
            Attribute::Version(v) => f.version = Some(v),
            Attribute::Other => {}
        }
        f
    }
}

/// One entry of a device's `capacity`: its `value` only (the request policy is the
/// scheduler's business).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// `value`; `None` when missing or null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<QuantityValue>,
}

/// A quantity as JSON: a string (`80Gi`), a number, or something else, kept to be reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum QuantityValue {
    /// A quantity string.
    String(String),
    /// A JSON number.
    Number(serde_json::Number),
    /// Neither.
    Invalid(RawJson),
}

/// A device taint (on a slice's device, or a DeviceTaintRule's). Each field is absent
/// when missing or not a string.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    /// `key`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub key: Option<String>,
    /// `value`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<String>,
    /// `effect`: `NoSchedule`, `NoExecute` (or `None` in newer versions).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub effect: Option<String>,
    /// `timeAdded` (RFC 3339).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub time_added: Option<String>,
}

/// An admin's DeviceTaintRule: a taint for the devices its selector picks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceTaintRule {
    /// Name (and UID, resource version).
    #[serde(default, deserialize_with = "tolerant::object")]
    pub metadata: Metadata,
    /// Selector and taint.
    #[serde(default, deserialize_with = "tolerant::object")]
    pub spec: TaintRuleSpec,
}

/// A DeviceTaintRule's `spec`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaintRuleSpec {
    /// `deviceSelector`; `None` when missing or not an object (the rule selects nothing).
    #[serde(
        default,
        deserialize_with = "tolerant::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub device_selector: Option<DeviceSelector>,
    /// `taint`.
    #[serde(default, deserialize_with = "tolerant::object")]
    pub taint: Taint,
}

/// A DeviceTaintRule's `spec.deviceSelector`: each field that is set must match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSelector {
    /// `driver`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub driver: Option<String>,
    /// `pool`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub pool: Option<String>,
    /// `device`.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub device: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn read(v: Value) -> ResourceSlice {
        serde_json::from_value(v).expect("any object reads")
    }

    fn gpu_v1() -> Value {
        json!({
            "name": "gpu-0",
            "allowMultipleAllocations": true,
            "attributes": {
                "uuid": {"string": "GPU-0"},
                "index": {"int": 0},
                "cuda": {"bool": true},
                "driverVersion": {"version": "580.0.0"},
                "list": {"ints": [1, 2]}
            },
            "capacity": {
                "memory": {"value": "80Gi", "requestPolicy": {"default": "80Gi"}},
                "cores": {"value": 100}
            },
            "taints": [{"key": "fgpu.dev/unhealthy", "value": "xid-79", "effect": "NoExecute",
                        "timeAdded": "2026-12-02T00:00:00Z"}],
            "consumesCounters": []
        })
    }

    fn slice(version: &str, device: Value) -> Value {
        json!({
            "apiVersion": format!("resource.k8s.io/{version}"), "kind": "ResourceSlice",
            "metadata": {"name": "n-gpu.fgpu.dev", "uid": "u", "resourceVersion": "5",
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"driver": "gpu.fgpu.dev", "nodeName": "n", "perDeviceNodeSelection": false,
                     "pool": {"name": "n", "generation": 3, "resourceSliceCount": 1},
                     "devices": [device]}
        })
    }

    #[test]
    fn reads_v1_v1beta2_and_v1beta1_alike() {
        let basic = {
            let mut body = gpu_v1();
            let name = body["name"].take();
            body.as_object_mut().unwrap().remove("name");
            json!({"name": name, "basic": body})
        };
        let slices = [
            read(slice("v1", gpu_v1())),
            read(slice("v1beta2", gpu_v1())),
            read(slice("v1beta1", basic)),
        ];
        for s in &slices {
            assert_eq!(s.metadata.name.as_deref(), Some("n-gpu.fgpu.dev"));
            assert_eq!(s.metadata.uid.as_deref(), Some("u"));
            assert_eq!(s.metadata.resource_version.as_deref(), Some("5"));
            assert_eq!(s.spec.driver.as_deref(), Some("gpu.fgpu.dev"));
            assert_eq!(s.spec.node_name.as_deref(), Some("n"));
            assert_eq!(s.spec.pool.name.as_deref(), Some("n"));
            assert_eq!(s.spec.pool.generation, Some(Checked::Valid(3)));
            assert_eq!(s.spec.pool.resource_slice_count, Some(1));
            let [d] = s.devices() else {
                panic!("one device: {s:?}")
            };
            assert_eq!(d.name.as_deref(), Some("gpu-0"));
            assert!(d.allows_multiple_allocations());
            let b = d.body();
            assert_eq!(b.attributes["uuid"].as_string(), Some("GPU-0"));
            assert_eq!(b.attributes["index"].as_int(), Some(0));
            assert_eq!(b.attributes["cuda"], Attribute::Bool(true));
            assert_eq!(
                b.attributes["driverVersion"],
                Attribute::Version("580.0.0".into())
            );
            assert_eq!(b.attributes["list"], Attribute::Other);
            assert_eq!(
                b.capacity["memory"].value,
                Some(QuantityValue::String("80Gi".into()))
            );
            assert_eq!(
                b.capacity["cores"].value,
                Some(QuantityValue::Number(100.into()))
            );
            assert_eq!(
                b.taints,
                vec![Taint {
                    key: Some("fgpu.dev/unhealthy".into()),
                    value: Some("xid-79".into()),
                    effect: Some("NoExecute".into()),
                    time_added: Some("2026-12-02T00:00:00Z".into()),
                }]
            );
        }
        assert_eq!(slices[0], slices[1]);
        assert!(slices[2].devices()[0].basic.is_some());
        assert_eq!(slices[2].devices()[0].direct, DeviceBody::default());
    }

    #[test]
    fn missing_fields_are_absent_or_empty() {
        let s = read(json!({}));
        assert_eq!(s, ResourceSlice::default());
        assert!(s.devices().is_empty());
        let s = read(json!({"spec": {"devices": [{}]}}));
        let d = &s.devices()[0];
        assert_eq!(d.name, None);
        assert!(!d.allows_multiple_allocations());
        assert_eq!(d.body(), &DeviceBody::default());
        assert_eq!(s.spec.pool.generation, None);
    }

    #[test]
    fn fields_of_the_wrong_type_do_not_fail_the_object() {
        let s = read(json!({
            "metadata": "x",
            "spec": {"driver": 7, "nodeName": ["n"], "pool": {"name": {}, "generation": "one",
                     "resourceSliceCount": "1"},
                     "devices": [
                        "not an object",
                        null,
                        {"name": 3, "basic": "no", "attributes": [], "capacity": {
                            "memory": {"value": true}, "cores": "100", "gone": null,
                            "big": {"value": -1.5}},
                         "allowMultipleAllocations": "true", "taints": {"key": "k"}},
                        {"name": "gpu-3", "attributes": {"a": "s", "b": null, "c": {"int": 1.5},
                            "d": {"int": "2", "string": "two"}},
                         "taints": [7, {"key": 1, "effect": "NoSchedule"}]}
                     ]}
        }));
        assert_eq!(s.metadata, Metadata::default());
        assert_eq!(
            (s.spec.driver.clone(), s.spec.node_name.clone()),
            (None, None)
        );
        assert_eq!(s.spec.pool.name, None);
        assert_eq!(
            s.spec.pool.generation,
            Some(Checked::Invalid(json!("one").into()))
        );
        assert_eq!(s.spec.pool.resource_slice_count, None);
        let d = s.devices();
        assert_eq!(d.len(), 4, "every entry keeps its index");
        assert_eq!((&d[0], &d[1]), (&Device::default(), &Device::default()));
        assert_eq!((d[2].name.clone(), d[2].basic.clone()), (None, None));
        let b = d[2].body();
        assert!(b.attributes.is_empty() && b.taints.is_empty());
        assert_eq!(b.allow_multiple_allocations, None);
        assert_eq!(
            b.capacity["memory"].value,
            Some(QuantityValue::Invalid(json!(true).into()))
        );
        assert_eq!(b.capacity["cores"], Capacity::default());
        assert!(!b.capacity.contains_key("gone"));
        let Some(QuantityValue::Number(n)) = &b.capacity["big"].value else {
            panic!("{:?}", b.capacity["big"])
        };
        assert_eq!(n.to_string(), "-1.5");
        let b = d[3].body();
        assert_eq!(b.attributes["a"], Attribute::Other);
        assert!(!b.attributes.contains_key("b"));
        assert_eq!(b.attributes["c"], Attribute::Other);
        assert_eq!(b.attributes["d"], Attribute::String("two".into()));
        assert_eq!(b.taints[0], Taint::default());
        assert_eq!(b.taints[1].key, None);
        assert_eq!(b.taints[1].effect.as_deref(), Some("NoSchedule"));

        let s = read(json!({"spec": {"devices": {"not": "a list"}}}));
        assert_eq!(
            s.spec.devices,
            Some(Checked::Invalid(json!({"not": "a list"}).into()))
        );
        assert!(s.devices().is_empty());
    }

    #[test]
    fn serialized_back_it_reads_the_same_and_keeps_only_what_is_read() {
        let odd = json!({
            "metadata": {"name": "s", "labels": {"a": "b"}},
            "spec": {"driver": "d", "pool": {"name": "p", "generation": 1.5},
                     "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": {"x": 1}}},
                                  "attributes": {"odd": {"strings": ["a"]}}}]}
        });
        let whole = [
            slice("v1", gpu_v1()),
            odd,
            json!({"spec": {"devices": "none"}}),
        ];
        for v in whole {
            let s = read(v.clone());
            let from_text: ResourceSlice = serde_json::from_str(&v.to_string()).unwrap();
            assert_eq!(from_text, s, "text and value read alike");
            let back = serde_json::to_string(&s).unwrap();
            assert_eq!(
                serde_json::from_str::<ResourceSlice>(&back).unwrap(),
                s,
                "{back}"
            );
        }
        let kept = serde_json::to_value(read(slice("v1", gpu_v1()))).unwrap();
        assert_eq!(
            kept,
            json!({
                "metadata": {"name": "n-gpu.fgpu.dev", "uid": "u", "resourceVersion": "5"},
                "spec": {"driver": "gpu.fgpu.dev", "nodeName": "n",
                         "pool": {"name": "n", "generation": 3, "resourceSliceCount": 1},
                         "devices": [{
                            "name": "gpu-0",
                            "allowMultipleAllocations": true,
                            "attributes": {
                                "uuid": {"string": "GPU-0"},
                                "index": {"int": 0},
                                "cuda": {"bool": true},
                                "driverVersion": {"version": "580.0.0"},
                                "list": {}
                            },
                            "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": 100}},
                            "taints": [{"key": "fgpu.dev/unhealthy", "value": "xid-79",
                                        "effect": "NoExecute",
                                        "timeAdded": "2026-12-02T00:00:00Z"}]
                         }]}
            })
        );
    }

    #[test]
    fn counters_are_read_on_the_slice_and_the_devices() {
        let s = read(json!({
            "spec": {"driver": "gpu.fgpu.dev",
                     "sharedCounters": [
                        {"name": "gpu-0-counters",
                         "counters": {"memory-slice-0": {"value": "1"},
                                      "compute-slices": {"value": 7}}},
                        "not an object"
                     ],
                     "devices": [
                        {"name": "gpu-0-mig-1g10gb-0",
                         "consumesCounters": [{"counterSet": "gpu-0-counters",
                            "counters": {"memory-slice-0": {"value": "1"},
                                         "compute-slices": {"value": "1"}}}]},
                        {"name": "old", "basic": {"consumesCounters": [{"counterSet": "s"}]}},
                        {"name": "odd", "consumesCounters": {"counterSet": "s"}}
                     ]}
        }));
        let sets = &s.spec.shared_counters;
        assert_eq!(
            sets.len(),
            2,
            "an entry that is not an object keeps its place"
        );
        assert_eq!(sets[0].name.as_deref(), Some("gpu-0-counters"));
        assert_eq!(
            sets[0].counters["memory-slice-0"].value,
            Some(QuantityValue::String("1".into()))
        );
        assert_eq!(
            sets[0].counters["compute-slices"].value,
            Some(QuantityValue::Number(7.into()))
        );
        assert_eq!(sets[1], CounterSet::default());
        let d = s.devices();
        let c = &d[0].body().consumes_counters;
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].counter_set.as_deref(), Some("gpu-0-counters"));
        assert_eq!(
            c[0].counters.keys().collect::<Vec<_>>(),
            ["compute-slices", "memory-slice-0"]
        );
        assert_eq!(
            d[1].body().consumes_counters[0].counter_set.as_deref(),
            Some("s")
        );
        assert!(d[2].body().consumes_counters.is_empty());
        // Written back, the counters read the same.
        let back: ResourceSlice =
            serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v["spec"]["sharedCounters"][0]["counters"]["compute-slices"],
            json!({"value": 7})
        );
        assert_eq!(
            v["spec"]["devices"][0]["consumesCounters"][0]["counterSet"],
            "gpu-0-counters"
        );
    }

    #[test]
    fn taint_rules_read_selector_and_taint() {
        let r: DeviceTaintRule = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule",
            "metadata": {"name": "maint"},
            "spec": {"deviceSelector": {"driver": "gpu.fgpu.dev", "pool": "n", "device": "gpu-1",
                                        "selectors": []},
                     "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}},
            "status": {}
        }))
        .unwrap();
        assert_eq!(r.metadata.name.as_deref(), Some("maint"));
        let sel = r.spec.device_selector.clone().unwrap();
        assert_eq!(
            (sel.driver, sel.pool, sel.device),
            (
                Some("gpu.fgpu.dev".into()),
                Some("n".into()),
                Some("gpu-1".into())
            )
        );
        assert_eq!(r.spec.taint.key.as_deref(), Some("example.com/maintenance"));
        assert_eq!(r.spec.taint.value, None);
        // No selector, or one that is not an object: none. A taint that is not an object:
        // an empty one.
        for spec in [json!({}), json!({"deviceSelector": "all", "taint": 1})] {
            let r: DeviceTaintRule = serde_json::from_value(json!({"spec": spec})).unwrap();
            assert_eq!(r.spec, TaintRuleSpec::default());
        }
    }
}
