//! A pending claim of the shared class, with its pod's annotations → the engine's
//! [`Request`] and [`Policy`].
//!
//! The controller allocates claims whose device requests (one or more; [`requests_in_class`]
//! gives one [`PendingClaim`] per request) are all of the shared class (`shared.<driver>`),
//! in `ExactCount` mode (`count`, default 1), without CEL selectors, admin access or
//! `firstAvailable`. What each GPU of a request gives (per field, later wins):
//!
//! 1. this driver's `GpuShareConfig`s in the DeviceClass's `spec.config` (they apply to
//!    every request of the class);
//! 2. this driver's `GpuShareConfig`s in `spec.devices.config` that apply to the request;
//! 3. the request's `capacity.requests` (`memory`, `cores`), which the scheduler would
//!    honour too.
//!
//! Memory becomes [`GpuShare::Memory`]; without memory the request takes whole GPUs
//! ([`GpuShare::Whole`]). Cores are a percent 0–100.
//!
//! The policy starts from the configured default; the pod annotations
//! `hami.io/node-scheduler-policy` and `hami.io/gpu-scheduler-policy` (`binpack` or
//! `spread`) replace its node and GPU level. `nvidia.com/use-gputype`,
//! `nvidia.com/nouse-gputype` and `nvidia.com/use-gpuuuid` (comma-separated) restrict the
//! GPUs. `GpuShareConfig` has no policy field, so a claim cannot choose one yet.

use std::collections::BTreeMap;

use fgpu_api::config::{CorePercent, GpuShareConfig};
use fgpu_api::names::{DriverName, capacity};
use fgpu_driver::engine::{GpuShare, Policy, Request, Toleration};
use fgpu_driver::hami;
use serde_json::Value;

use crate::{object_key, quantity_u64};

pub use fgpu_driver::hami::RequestError;

/// A pending claim, ready for the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingClaim {
    /// `namespace/name`.
    pub key: String,
    /// The grant id: the claim's UID (else its key).
    pub id: String,
    /// The device request's name (results name it).
    pub request_name: String,
    pub request: Request,
    pub policy: Policy,
    /// The effective configuration of this driver for the request (priority and
    /// oversubscribe are passed on; memory and cores are replaced by the grant).
    pub config: GpuShareConfig,
    /// The claim's `spec.devices.config` entries, to copy into the allocation.
    pub claim_config: Vec<Value>,
    /// The class's `spec.config` entries, to copy into the allocation (`FromClass`).
    pub class_config: Vec<Value>,
}

/// Reads `claim` (any served version, exactly one request) for `driver`, with the
/// annotations of the pod that uses it; `default_policy` applies where the pod says nothing.
/// No class configuration ([`requests_in_class`] takes one).
pub fn from_claim(
    claim: &Value,
    pod_annotations: &BTreeMap<String, String>,
    pod_key: &str,
    driver: &DriverName,
    default_policy: Policy,
) -> Result<PendingClaim, RequestError> {
    let mut all = requests_in_class(
        claim,
        None,
        pod_annotations,
        pod_key,
        driver,
        default_policy,
    )?;
    if all.len() != 1 {
        return Err(RequestError {
            object: format!("claim {}", object_key(claim)),
            path: "spec.devices.requests".into(),
            problem: format!("{} requests; exactly one is expected here", all.len()),
        });
    }
    Ok(all.remove(0))
}

/// One [`PendingClaim`] per device request of `claim`, in order (every one must be of the
/// shared class), with `device_class`'s configuration before the claim's.
pub fn requests_in_class(
    claim: &Value,
    device_class: Option<&Value>,
    pod_annotations: &BTreeMap<String, String>,
    pod_key: &str,
    driver: &DriverName,
    default_policy: Policy,
) -> Result<Vec<PendingClaim>, RequestError> {
    let requests = claim["spec"]["devices"]["requests"]
        .as_array()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| RequestError {
            object: format!("claim {}", object_key(claim)),
            path: "spec.devices.requests".into(),
            problem: "missing; the claim requests no device".into(),
        })?;
    let mut names = std::collections::BTreeSet::new();
    requests
        .iter()
        .enumerate()
        .map(|(i, req)| {
            let p = read_request(
                claim,
                i,
                req,
                device_class,
                pod_annotations,
                pod_key,
                driver,
                default_policy,
            )?;
            if !names.insert(p.request_name.clone()) {
                return Err(RequestError {
                    object: format!("claim {}", p.key),
                    path: format!("spec.devices.requests[{i}].name"),
                    problem: format!("{:?} names two requests", p.request_name),
                });
            }
            Ok(p)
        })
        .collect()
}

/// Request `index` (`req`) of `claim`: its name, the device count ([`check_exact`]), the
/// effective configuration ([`effective_config`], then [`apply_capacity`]), the share
/// ([`share_of`]) and the pod's placement annotations.
#[allow(clippy::too_many_arguments)]
fn read_request(
    claim: &Value,
    index: usize,
    req: &Value,
    device_class: Option<&Value>,
    pod_annotations: &BTreeMap<String, String>,
    pod_key: &str,
    driver: &DriverName,
    default_policy: Policy,
) -> Result<PendingClaim, RequestError> {
    let key = object_key(claim);
    let req_path = format!("spec.devices.requests[{index}]");
    let here = At::new(&key, &req_path);
    let name = req["name"]
        .as_str()
        .ok_or_else(|| here.err(&format!("{req_path}.name"), "missing".into()))?;
    if !req["firstAvailable"].is_null() {
        return Err(here.err(
            &format!("{req_path}.firstAvailable"),
            "prioritized alternatives are not supported by the controller; use exactly".into(),
        ));
    }
    // v1/v1beta2: fields under `exactly`; v1beta1: directly in the request.
    let (exact, here) = if req["exactly"].is_object() {
        (
            &req["exactly"],
            At::new(&key, &format!("{req_path}.exactly")),
        )
    } else {
        (req, here)
    };
    let count = check_exact(exact, &here, driver)?;
    let mut entries = effective_config(claim, name, device_class, driver, &here)?;
    apply_capacity(&mut entries.config, exact, &here)?;
    let config = entries.config;
    let mut request = Request::new(count, share_of(&config, &here)?);
    request.cores = config.cores.map(|c| u32::from(c.get()));
    request.tolerations = tolerations(exact, &here)?;

    let placement = hami::pod_annotations(pod_annotations, pod_key, default_policy)?;
    placement.constrain(&mut request);
    let policy = placement.policy;
    Ok(PendingClaim {
        key,
        id: crate::usage::grant_id(claim),
        request_name: name.to_owned(),
        request,
        policy,
        config,
        claim_config: entries.claim_config,
        class_config: entries.class_config,
    })
}

/// The request's `tolerations` of device taints (operator `Exists` or `Equal`).
fn tolerations(exact: &Value, here: &At) -> Result<Vec<Toleration>, RequestError> {
    let Some(list) = exact["tolerations"].as_array() else {
        return Ok(Vec::new());
    };
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let s = |f: &str| t[f].as_str().unwrap_or_default().to_owned();
            let exists = match t["operator"].as_str() {
                None | Some("Equal") => false,
                Some("Exists") => true,
                Some(op) => {
                    return Err(here.field(
                        &format!("tolerations[{i}].operator"),
                        format!("{op:?}; use Exists or Equal"),
                    ));
                }
            };
            if s("key").is_empty() && !exists {
                return Err(here.field(
                    &format!("tolerations[{i}].key"),
                    "empty; an empty key needs operator Exists".into(),
                ));
            }
            Ok(Toleration {
                key: s("key"),
                exists,
                value: s("value"),
                effect: s("effect"),
            })
        })
        .collect()
}

/// Where in a claim a request's fields are: errors name the claim and the field.
struct At {
    /// `claim <namespace/name>`.
    object: String,
    /// The request's path (`spec.devices.requests[i]`, or its `.exactly`).
    base: String,
}

impl At {
    fn new(key: &str, base: &str) -> Self {
        Self {
            object: format!("claim {key}"),
            base: base.to_owned(),
        }
    }

    /// The path of field `f` of the request.
    fn at(&self, f: &str) -> String {
        format!("{}.{f}", self.base)
    }

    /// An error at `path` of the claim.
    fn err(&self, path: &str, problem: String) -> RequestError {
        RequestError {
            object: self.object.clone(),
            path: path.to_owned(),
            problem,
        }
    }

    /// An error at field `f` of the request.
    fn field(&self, f: &str, problem: String) -> RequestError {
        self.err(&self.at(f), problem)
    }
}

/// Checks the `exactly` part of a request (`exact`): the shared class, `ExactCount`, no
/// selectors, no admin access; returns its count (default 1, at most 32).
fn check_exact(exact: &Value, here: &At, driver: &DriverName) -> Result<u32, RequestError> {
    let class = driver.shared_class();
    if exact["deviceClassName"].as_str() != Some(class.as_str()) {
        return Err(here.field(
            "deviceClassName",
            format!(
                "{}; the controller allocates class {class}",
                exact["deviceClassName"]
            ),
        ));
    }
    match exact["allocationMode"].as_str() {
        None | Some("ExactCount") => {}
        Some(m) => {
            return Err(here.field(
                "allocationMode",
                format!("{m:?}; only ExactCount is supported"),
            ));
        }
    }
    if exact["selectors"].as_array().is_some_and(|s| !s.is_empty()) {
        return Err(here.field("selectors", "CEL selectors are not supported by the controller; use pod annotations nvidia.com/use-gputype or nvidia.com/use-gpuuuid".into()));
    }
    if exact["adminAccess"] == Value::Bool(true) {
        return Err(here.field(
            "adminAccess",
            "admin access is not allocated by the controller".into(),
        ));
    }
    match &exact["count"] {
        Value::Null => Ok(1),
        v => v
            .as_u64()
            .filter(|&c| (1..=32).contains(&c))
            .map(|c| c as u32)
            .ok_or_else(|| here.field("count", format!("{v}; use an integer 1 to 32"))),
    }
}

/// A request's configuration and the config entries to copy into its allocation.
struct ConfigEntries {
    /// This driver's configuration that applies to the request, class first.
    config: GpuShareConfig,
    /// Every entry of the claim's `spec.devices.config`.
    claim_config: Vec<Value>,
    /// Every entry of the class's `spec.config`.
    class_config: Vec<Value>,
}

/// The configuration of request `name`: this driver's `GpuShareConfig`s of the class,
/// then those of the claim that apply to the request, later fields winning; every entry
/// is kept to be copied into the allocation.
fn effective_config(
    claim: &Value,
    name: &str,
    device_class: Option<&Value>,
    driver: &DriverName,
    here: &At,
) -> Result<ConfigEntries, RequestError> {
    let mut out = ConfigEntries {
        config: GpuShareConfig::default(),
        claim_config: Vec::new(),
        class_config: Vec::new(),
    };
    let class_name = device_class
        .and_then(|c| c["metadata"]["name"].as_str())
        .unwrap_or_default();
    let class_entries = device_class
        .and_then(|c| c["spec"]["config"].as_array())
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| (true, i, e));
    let claim_entries = claim["spec"]["devices"]["config"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| (false, i, e));
    for (from_class, i, e) in class_entries.chain(claim_entries) {
        if from_class {
            out.class_config.push(e.clone());
        } else {
            out.claim_config.push(e.clone());
        }
        if e["opaque"]["driver"].as_str() != Some(driver.as_str()) {
            continue;
        }
        let c = if from_class {
            let path = format!("spec.config[{i}].opaque.parameters");
            GpuShareConfig::from_value(&e["opaque"]["parameters"], &path).map_err(|e| {
                RequestError {
                    object: format!("DeviceClass {class_name}"),
                    path: e.path,
                    problem: e.problem.to_string(),
                }
            })?
        } else {
            let path = format!("spec.devices.config[{i}].opaque.parameters");
            GpuShareConfig::from_value(&e["opaque"]["parameters"], &path)
                .map_err(|e| here.err(&e.path, e.problem.to_string()))?
        };
        if entry_applies(e, name) {
            merge_config(&mut out.config, &c, &e["opaque"]["parameters"]);
        }
    }
    Ok(out)
}

/// Whether config entry `e` applies to request `name`: it names no request, or names it.
fn entry_applies(e: &Value, name: &str) -> bool {
    e["requests"]
        .as_array()
        .is_none_or(|r| r.is_empty() || r.iter().any(|q| q == name))
}

/// Lays `c` (read from `params`) over `config`: memory and cores where `c` has them,
/// priority and oversubscribe where `params` names them.
fn merge_config(config: &mut GpuShareConfig, c: &GpuShareConfig, params: &Value) {
    let present = |f: &str| params.get(f).is_some_and(|v| !v.is_null());
    config.memory = c.memory.or(config.memory);
    config.cores = c.cores.or(config.cores);
    if present("priority") {
        config.priority = c.priority;
    }
    if present("oversubscribe") {
        config.oversubscribe = c.oversubscribe;
    }
}

/// Lays the request's `capacity.requests` (`memory`, `cores`; nothing else) over
/// `config`.
fn apply_capacity(
    config: &mut GpuShareConfig,
    exact: &Value,
    here: &At,
) -> Result<(), RequestError> {
    let Some(obj) = exact["capacity"]["requests"].as_object() else {
        return Ok(());
    };
    if let Some(unknown) = obj
        .keys()
        .find(|k| *k != capacity::MEMORY && *k != capacity::CORES)
    {
        return Err(here.field(
            &format!("capacity.requests.{unknown}"),
            "unknown capacity; valid are memory and cores".into(),
        ));
    }
    if let Some(m) = obj.get(capacity::MEMORY) {
        let path = here.at("capacity.requests.memory");
        config.memory = Some(quantity_u64(m).map_err(|p| here.err(&path, p.to_string()))?);
    }
    if let Some(c) = obj.get(capacity::CORES) {
        let path = here.at("capacity.requests.cores");
        let n = quantity_u64(c).map_err(|p| here.err(&path, p.to_string()))?;
        config.cores = Some(
            u8::try_from(n)
                .ok()
                .and_then(CorePercent::new)
                .ok_or_else(|| here.err(&path, format!("{n} is above the maximum 100")))?,
        );
    }
    Ok(())
}

/// What each GPU of the request gives: its memory, or the whole GPU without memory
/// (memory 0 is refused).
fn share_of(config: &GpuShareConfig, here: &At) -> Result<GpuShare, RequestError> {
    match config.memory {
        Some(0) => Err(here.field(
            "capacity.requests.memory",
            "0; a share needs some memory".into(),
        )),
        Some(bytes) => Ok(GpuShare::Memory { bytes }),
        None => Ok(GpuShare::Whole),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_driver::engine::{GpuPolicy, NodePolicy};
    use serde_json::json;

    fn claim(request: Value, config: Value) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
            "spec": {"devices": {"requests": [request], "config": config}}
        })
    }

    fn exactly(fields: Value) -> Value {
        let mut e = json!({"deviceClassName": "shared.gpu.fgpu.dev"});
        e.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        json!({"name": "gpu", "exactly": e})
    }

    fn ours(requests: Value, params: Value) -> Value {
        let mut p = json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig"});
        p.as_object_mut()
            .unwrap()
            .extend(params.as_object().unwrap().clone());
        json!({"requests": requests, "opaque": {"driver": "gpu.fgpu.dev", "parameters": p}})
    }

    fn read(c: &Value, ann: &[(&str, &str)]) -> Result<PendingClaim, RequestError> {
        let ann = ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_claim(c, &ann, "ns/pod", &DriverName::default(), Policy::FRAGAWARE)
    }

    fn read_all(c: &Value, class: Option<&Value>) -> Result<Vec<PendingClaim>, RequestError> {
        let d = DriverName::default();
        requests_in_class(c, class, &BTreeMap::new(), "ns/pod", &d, Policy::BINPACK)
    }

    fn read_one(c: &Value, class: Option<&Value>) -> Result<PendingClaim, RequestError> {
        read_all(c, class).map(|mut all| all.remove(0))
    }

    #[test]
    fn tolerations_are_read_and_bad_ones_refused_by_field() {
        let c = claim(
            exactly(json!({"tolerations": [
                {"key": "fgpu.dev/unhealthy", "operator": "Exists", "effect": "NoExecute"},
                {"key": "k", "value": "v"}]})),
            json!([]),
        );
        let p = read(&c, &[]).unwrap();
        assert_eq!(
            p.request.tolerations,
            vec![
                Toleration {
                    key: "fgpu.dev/unhealthy".into(),
                    exists: true,
                    value: String::new(),
                    effect: "NoExecute".into()
                },
                Toleration {
                    key: "k".into(),
                    exists: false,
                    value: "v".into(),
                    effect: String::new()
                },
            ]
        );
        let bad = claim(
            exactly(json!({"tolerations": [{"key": "k", "operator": "Lt"}]})),
            json!([]),
        );
        let e = read(&bad, &[]).unwrap_err();
        assert_eq!(
            e.path,
            "spec.devices.requests[0].exactly.tolerations[0].operator"
        );
        let bad = claim(exactly(json!({"tolerations": [{"value": "v"}]})), json!([]));
        let e = read(&bad, &[]).unwrap_err();
        assert_eq!(
            e.path,
            "spec.devices.requests[0].exactly.tolerations[0].key"
        );
    }

    #[test]
    fn each_request_of_a_claim_gets_its_own_config() {
        let mut a = exactly(json!({"capacity": {"requests": {"memory": "8Gi"}}}));
        a["name"] = json!("a");
        let mut b = exactly(json!({"count": 2}));
        b["name"] = json!("b");
        let c = claim(
            a,
            json!([ours(json!(["b"]), json!({"memory": "3Gi", "cores": 5}))]),
        );
        let mut c = c;
        c["spec"]["devices"]["requests"]
            .as_array_mut()
            .unwrap()
            .push(b);
        let all = read_all(&c, None).unwrap();
        let got: Vec<_> = all
            .iter()
            .map(|p| {
                (
                    p.request_name.as_str(),
                    p.request.gpus,
                    p.request.share,
                    p.request.cores,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", 1, GpuShare::Memory { bytes: 8 << 30 }, None),
                ("b", 2, GpuShare::Memory { bytes: 3 << 30 }, Some(5)),
            ]
        );
        // The single-request reader refuses it, naming the field.
        let e = read(&c, &[]).unwrap_err();
        assert_eq!(e.path, "spec.devices.requests");
        // A bad second request names its index.
        c["spec"]["devices"]["requests"][1]["exactly"]["allocationMode"] = json!("All");
        let e = read_all(&c, None).unwrap_err();
        assert_eq!(e.path, "spec.devices.requests[1].exactly.allocationMode");
    }

    #[test]
    fn class_config_comes_first_and_the_claim_wins() {
        let class = json!({"metadata": {"name": "shared.gpu.fgpu.dev"}, "spec": {"config": [
            ours(Value::Null, json!({"memory": "2Gi", "cores": 20, "priority": "low"})),
            {"opaque": {"driver": "net.example.com", "parameters": {"mtu": 9000}}}]}});
        let c = claim(
            exactly(json!({})),
            json!([ours(json!(["gpu"]), json!({"memory": "6Gi"}))]),
        );
        let p = read_one(&c, Some(&class)).unwrap();
        // Memory from the claim, cores and priority from the class.
        assert_eq!(p.request.share, GpuShare::Memory { bytes: 6 << 30 });
        assert_eq!(p.request.cores, Some(20));
        assert_eq!(p.config.priority, fgpu_api::config::Priority::Low);
        assert_eq!(p.class_config.len(), 2, "every class entry is copied");
        assert_eq!(p.claim_config.len(), 1);

        // A bad class entry names the class and the field.
        let bad = json!({"metadata": {"name": "shared.gpu.fgpu.dev"}, "spec": {"config": [
            ours(Value::Null, json!({"cores": 140}))]}});
        let e = read_one(&c, Some(&bad)).unwrap_err();
        assert_eq!(e.object, "DeviceClass shared.gpu.fgpu.dev");
        assert_eq!(e.path, "spec.config[0].opaque.parameters.cores");
    }

    #[test]
    fn requests_table() {
        let gib = 1u64 << 30;
        let cases: Vec<(&str, Value, u32, GpuShare, Option<u32>)> = vec![
            (
                "capacity requests",
                claim(
                    exactly(json!({"capacity": {"requests": {"memory": "10Gi", "cores": "30"}}})),
                    json!([]),
                ),
                1,
                GpuShare::Memory { bytes: 10 * gib },
                Some(30),
            ),
            (
                "opaque config, count 2",
                claim(
                    exactly(json!({"count": 2})),
                    json!([ours(json!(["gpu"]), json!({"memory": "4Gi", "cores": 10}))]),
                ),
                2,
                GpuShare::Memory { bytes: 4 * gib },
                Some(10),
            ),
            (
                "capacity wins over config",
                claim(
                    exactly(json!({"capacity": {"requests": {"memory": "2Gi"}}})),
                    json!([ours(json!([]), json!({"memory": "4Gi", "cores": 10}))]),
                ),
                1,
                GpuShare::Memory { bytes: 2 * gib },
                Some(10),
            ),
            (
                "config for another request ignored",
                claim(
                    exactly(json!({})),
                    json!([ours(json!(["other"]), json!({"memory": "4Gi"}))]),
                ),
                1,
                GpuShare::Whole,
                None,
            ),
            (
                "v1beta1 request without exactly",
                claim(
                    json!({"name": "gpu", "deviceClassName": "shared.gpu.fgpu.dev",
                "count": 1}),
                    json!([ours(json!([]), json!({"memory": "1Gi"}))]),
                ),
                1,
                GpuShare::Memory { bytes: gib },
                None,
            ),
        ];
        for (what, c, gpus, share, cores) in cases {
            let p = read(&c, &[]).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                (p.request.gpus, p.request.share, p.request.cores),
                (gpus, share, cores),
                "{what}"
            );
            assert_eq!(
                (p.key.as_str(), p.id.as_str(), p.request_name.as_str()),
                ("ns/c", "uid-1", "gpu"),
                "{what}"
            );
            assert_eq!(p.policy, Policy::FRAGAWARE, "{what}");
        }
    }

    #[test]
    fn annotations_set_policy_and_constraints() {
        let c = claim(exactly(json!({})), json!([]));
        let p = read(
            &c,
            &[
                ("hami.io/node-scheduler-policy", "spread"),
                ("hami.io/gpu-scheduler-policy", "binpack"),
                ("nvidia.com/use-gputype", "H100, A100"),
                ("nvidia.com/nouse-gputype", "T4"),
                ("nvidia.com/use-gpuuuid", "GPU-1"),
            ],
        )
        .unwrap();
        assert_eq!(
            p.policy,
            Policy {
                node: NodePolicy::Spread,
                gpu: GpuPolicy::Binpack
            }
        );
        assert_eq!(p.request.model_include, ["H100", "A100"]);
        assert_eq!(p.request.model_exclude, ["T4"]);
        assert_eq!(p.request.uuid_pin, ["GPU-1"]);
        let only_gpu = read(&c, &[("hami.io/gpu-scheduler-policy", "spread")]).unwrap();
        assert_eq!(
            only_gpu.policy,
            Policy {
                node: NodePolicy::FragAware,
                gpu: GpuPolicy::Spread
            }
        );
        let e = read(&c, &[("hami.io/gpu-scheduler-policy", "topology-aware")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod ns/pod: metadata.annotations[\"hami.io/gpu-scheduler-policy\"]: \"topology-aware\"; valid are binpack and spread"
        );
    }

    #[test]
    fn strict_errors_name_claim_and_field() {
        let two = json!({"apiVersion": "resource.k8s.io/v1", "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [exactly(json!({})), exactly(json!({}))]}}});
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "two requests, one name",
                two,
                "spec.devices.requests[1].name",
            ),
            (
                "other class",
                claim(
                    json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.fgpu.dev"}}),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.deviceClassName",
            ),
            (
                "first available",
                claim(json!({"name": "gpu", "firstAvailable": []}), json!([])),
                "spec.devices.requests[0].firstAvailable",
            ),
            (
                "mode All",
                claim(exactly(json!({"allocationMode": "All"})), json!([])),
                "spec.devices.requests[0].exactly.allocationMode",
            ),
            (
                "selectors",
                claim(
                    exactly(json!({"selectors": [{"cel": {"expression": "true"}}]})),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.selectors",
            ),
            (
                "count 0",
                claim(exactly(json!({"count": 0})), json!([])),
                "spec.devices.requests[0].exactly.count",
            ),
            (
                "cores 140",
                claim(
                    exactly(json!({"capacity": {"requests": {"cores": "140"}}})),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.capacity.requests.cores",
            ),
            (
                "fractional memory",
                claim(
                    exactly(json!({"capacity": {"requests": {"memory": "0.1Ki"}}})),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.capacity.requests.memory",
            ),
            (
                "unknown capacity",
                claim(
                    exactly(json!({"capacity": {"requests": {"bandwidth": "1"}}})),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.capacity.requests.bandwidth",
            ),
            (
                "bad config",
                claim(
                    exactly(json!({})),
                    json!([ours(json!([]), json!({"cores": 140}))]),
                ),
                "spec.devices.config[0].opaque.parameters.cores",
            ),
        ];
        for (what, c, path) in cases {
            let e = read(&c, &[]).unwrap_err();
            assert_eq!(
                (e.object.as_str(), e.path.as_str()),
                ("claim ns/c", path),
                "{what}: {e}"
            );
        }
    }

    #[test]
    fn config_entries_apply_to_the_requests_they_name_and_later_fields_win() {
        assert!(entry_applies(&json!({}), "gpu"));
        assert!(entry_applies(&json!({"requests": []}), "gpu"));
        assert!(entry_applies(&json!({"requests": ["a", "gpu"]}), "gpu"));
        assert!(!entry_applies(&json!({"requests": ["a"]}), "gpu"));
        let read = |mut p: Value| {
            p["apiVersion"] = json!("gpu.fgpu.dev/v1alpha1");
            p["kind"] = json!("GpuShareConfig");
            (GpuShareConfig::from_value(&p, "p").unwrap(), p)
        };
        let mut config = GpuShareConfig::default();
        let (first, p1) = read(json!({"memory": "1Gi", "cores": 10}));
        merge_config(&mut config, &first, &p1);
        let (second, p2) = read(json!({"memory": "2Gi"}));
        merge_config(&mut config, &second, &p2);
        assert_eq!(config.memory, Some(2 << 30));
        assert_eq!(config.cores, first.cores);
    }

    #[test]
    fn the_share_is_the_memory_or_the_whole_gpu() {
        let here = At::new("ns/c", "spec.devices.requests[0].exactly");
        let mut config = GpuShareConfig::default();
        assert_eq!(share_of(&config, &here), Ok(GpuShare::Whole));
        config.memory = Some(5);
        assert_eq!(share_of(&config, &here), Ok(GpuShare::Memory { bytes: 5 }));
        config.memory = Some(0);
        let e = share_of(&config, &here).unwrap_err();
        assert_eq!(e.object, "claim ns/c");
        assert_eq!(
            e.path,
            "spec.devices.requests[0].exactly.capacity.requests.memory"
        );
    }
}
