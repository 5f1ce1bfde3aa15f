//! The legacy path's mutating admission webhook (Pod CREATE, `admission.k8s.io/v1`): pods
//! that ask for the HAMi-style resources are sent to fgpu's scheduler, get the defaults
//! the kubelet and the extender need, and are refused at creation when a resource or an
//! annotation cannot be honoured. Pure: [`review`] turns an `AdmissionReview` into its
//! answer; the HTTPS server is [`crate::http::serve_webhook`]. See `docs/extender.md`,
//! "Admission webhook".
//!
//! A pod *asks for GPUs* when any container or init container names one of the four
//! managed resources (limits or requests). Other pods, and mirror pods, are admitted with
//! no patch.
//!
//! Mutations (one JSON patch):
//!
//! * `spec.schedulerName` ← the configured name, when it is absent, empty or
//!   `default-scheduler`. A pod that names another scheduler is left alone entirely (with a
//!   warning): whoever chose that scheduler owns the pod (HAMi does the same).
//! * A container with memory, percentage or cores but no GPU count gets `<gpu>: 1` in its
//!   limits (and in its requests when it sets our resources there): the kubelet calls the
//!   device plugin only for the count.
//! * With `default_memory_mib` > 0, a container without `gpumem` and without
//!   `gpumem-percentage` gets `<gpumem>: default`; with 0 (the default, as HAMi) it takes
//!   each GPU's whole memory. Likewise `default_cores` for `gpucores`.
//! * `gpumem-percentage` is kept as a percentage: the node, hence the GPU size, is not
//!   known at admission; the extender turns it into bytes per GPU when it places the pod,
//!   and the assignment annotation the device plugin reads carries bytes.
//!
//! Refusals (each names the pod, the container and the field or annotation; all problems
//! of a pod are listed): `spec.nodeName` preset (no scheduler would choose its GPUs),
//! privileged containers asking for GPUs (they see every GPU; as HAMi), quantities that are not whole numbers, a GPU count of 0 with
//! memory or cores, more than 32 GPUs, `gpumem` 0 or above the largest GPU the extender
//! knows, percentage or cores above 100 (percentage 0), GPU resources on init containers,
//! policy annotations other than `binpack`/`spread`, model names in
//! `nvidia.com/use-gputype` / `nouse-gputype` that no known GPU matches, malformed UUIDs in
//! `nvidia.com/use-gpuuuid` / `nouse-gpuuuid`, and anything else the extender itself would
//! refuse ([`fgpu_driver::hami::pod_request`] runs on the mutated pod as the last check, so the
//! webhook never admits a pod the extender cannot read). Soft problems are warnings.

use std::collections::BTreeMap;

use fgpu_api::names::{DriverName, LegacyResourceNames, legacy};
use fgpu_driver::engine::Policy;
use serde_json::{Map, Value, json};

use fgpu_driver::hami::{ANNOTATION_NUMA_BIND, MAX_GPUS_PER_CONTAINER};

/// Default `--scheduler-name`: the profile of the second kube-scheduler that calls the
/// extender (`deploy/extender/scheduler.yaml`).
pub const DEFAULT_SCHEDULER_NAME: &str = "fgpu-scheduler";

/// kube-scheduler's own profile name; pods naming it are moved to fgpu's scheduler.
pub const KUBE_DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Pod annotation (HAMi): comma-separated GPU UUIDs the pod must not use.
pub const ANNOTATION_NOUSE_GPU_UUID: &str = "nvidia.com/nouse-gpuuuid";

/// Pod annotation the kubelet puts on mirror pods (of static pods).
pub const ANNOTATION_MIRROR_POD: &str = "kubernetes.io/config.mirror";

/// How the webhook mutates and checks pods.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// `spec.schedulerName` given to GPU pods.
    pub scheduler_name: String,
    pub names: LegacyResourceNames,
    /// MiB per GPU given to containers that name no memory; 0 = the whole memory.
    pub default_memory_mib: u64,
    /// Cores given to containers that name none; 0 = none added.
    pub default_cores: u64,
    /// For the final check with the extender's own reader.
    pub driver: DriverName,
    pub default_policy: Policy,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        let ext = crate::ExtenderConfig::default();
        Self {
            scheduler_name: DEFAULT_SCHEDULER_NAME.to_owned(),
            names: ext.names,
            default_memory_mib: 0,
            default_cores: 0,
            driver: ext.driver,
            default_policy: ext.default_policy,
        }
    }
}

pub use crate::inventory::GpuInventory;

/// The webhook's decision on one pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Admit with these JSON patch operations (empty: unchanged) and warnings.
    Allow {
        patch: Vec<Value>,
        warnings: Vec<String>,
    },
    /// Refuse; the message lists every problem found.
    Deny(String),
}

/// Answers an `AdmissionReview` (any JSON). `Err` is a body that is not a usable review
/// (the server answers 400 with it); everything else is an answer to send.
pub fn review(review: &Value, cfg: &WebhookConfig, inv: &GpuInventory) -> Result<Value, String> {
    if !review.is_object() {
        return Err("the body is not an AdmissionReview: not a JSON object".into());
    }
    let req = &review["request"];
    if !req.is_object() {
        return Err("the AdmissionReview has no request".into());
    }
    if !req["uid"].is_string() {
        return Err("the AdmissionReview has no request.uid (a string)".into());
    }
    let answer = |d: Decision| match d {
        Decision::Allow { patch, warnings } => {
            let patch = (!patch.is_empty()).then_some(Value::Array(patch));
            fgpu_plumbing::admission::response(review, true, None, patch.as_ref(), &warnings)
        }
        Decision::Deny(m) => fgpu_plumbing::admission::response(review, false, Some(&m), None, &[]),
    };
    let kind = req["kind"]["kind"].as_str().unwrap_or("Pod");
    if req["operation"].as_str() != Some("CREATE") || kind != "Pod" {
        return Ok(answer(Decision::Allow {
            patch: vec![],
            warnings: vec![],
        }));
    }
    let pod = &req["object"];
    if !pod.is_object() {
        return Err("the AdmissionReview's request.object is not a Pod object".into());
    }
    let mut pod = pod.clone();
    // The namespace is not always in a new pod's metadata (it comes from the URL).
    if pod["metadata"]["namespace"]
        .as_str()
        .is_none_or(str::is_empty)
        && let Some(ns) = req["namespace"].as_str()
        && let Some(m) = pod["metadata"].as_object_mut()
    {
        m.insert("namespace".into(), json!(ns));
    }
    Ok(answer(admit_pod(&pod, cfg, inv)))
}

/// A JSON pointer token (RFC 6901): `~` → `~0`, `/` → `~1`.
fn token(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Whether `s` is a GPU or MIG UUID as NVML writes it: `GPU-` or `MIG-` and a hyphenated
/// UUID (8-4-4-4-12 hex digits).
pub fn valid_gpu_uuid(s: &str) -> bool {
    let rest = s
        .strip_prefix("GPU-")
        .or_else(|| s.strip_prefix("MIG-"))
        .unwrap_or("");
    rest.len() == 36 && uuid::Uuid::try_parse(rest).is_ok()
}

fn list(v: &str) -> Vec<&str> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Decides on one pod (`pod` is the Pod object, namespace filled in).
pub fn admit_pod(pod: &Value, cfg: &WebhookConfig, inv: &GpuInventory) -> Decision {
    let names = &cfg.names;
    let managed = [
        &names.gpu,
        &names.memory,
        &names.memory_percentage,
        &names.cores,
    ];
    let m = &pod["metadata"];
    let key = {
        let n = m["name"]
            .as_str()
            .filter(|s| !s.is_empty())
            .or_else(|| m["generateName"].as_str())
            .unwrap_or("<unnamed>");
        match m["namespace"].as_str() {
            Some(ns) if !ns.is_empty() => format!("{ns}/{n}"),
            _ => n.to_owned(),
        }
    };
    let asks = |c: &Value| {
        ["limits", "requests"].iter().any(|k| {
            c["resources"][k]
                .as_object()
                .is_some_and(|r| managed.iter().any(|n| r.contains_key(n.as_str())))
        })
    };
    let containers: &[Value] = pod["spec"]["containers"]
        .as_array()
        .map_or(&[], Vec::as_slice);
    let inits: &[Value] = pod["spec"]["initContainers"]
        .as_array()
        .map_or(&[], Vec::as_slice);
    if !containers.iter().chain(inits).any(asks) {
        return Decision::Allow {
            patch: vec![],
            warnings: vec![],
        };
    }
    // A mirror pod reflects a static pod the kubelet already runs; nothing to place.
    if m["annotations"][ANNOTATION_MIRROR_POD].is_string() {
        return Decision::Allow {
            patch: vec![],
            warnings: vec![],
        };
    }
    let mut warnings = Vec::new();
    let current = pod["spec"]["schedulerName"].as_str().unwrap_or("");
    if !current.is_empty() && current != KUBE_DEFAULT_SCHEDULER && current != cfg.scheduler_name {
        return Decision::Allow {
            patch: vec![],
            warnings: vec![format!(
                "fgpu: pod {key} asks for GPU resources but names scheduler {current:?}; fgpu leaves it alone and will not place its GPUs (remove spec.schedulerName or set it to {:?})",
                cfg.scheduler_name
            )],
        };
    }

    let mut problems: Vec<String> = Vec::new();
    let mut patch: Vec<Value> = Vec::new();
    let mut mutated = pod.clone();
    if let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
        problems.push(format!(
            "spec.nodeName: {node:?} is set, so no scheduler places the pod and its GPUs are never chosen; remove it (pin the node with a nodeSelector on kubernetes.io/hostname instead)"
        ));
    }
    for (section, list) in [("containers", containers), ("initContainers", inits)] {
        for (i, c) in list.iter().enumerate() {
            if asks(c) && c["securityContext"]["privileged"] == true {
                problems.push(format!(
                    "container {:?} (spec.{section}[{i}]): securityContext.privileged: a privileged container sees every GPU of the node, so its GPU quota cannot be enforced; drop privileged or the GPU resources",
                    c["name"].as_str().unwrap_or("")
                ));
            }
        }
    }
    if current != cfg.scheduler_name {
        let op = if pod["spec"].get("schedulerName").is_some() {
            "replace"
        } else {
            "add"
        };
        patch.push(json!({"op": op, "path": "/spec/schedulerName", "value": cfg.scheduler_name}));
        mutated["spec"]["schedulerName"] = json!(cfg.scheduler_name);
    }

    for (i, c) in inits.iter().enumerate() {
        if asks(c) {
            problems.push(format!(
                "init container {:?} (spec.initContainers[{i}]): asks for GPU resources; fgpu places GPUs for regular containers only",
                c["name"].as_str().unwrap_or("")
            ));
        }
    }

    let max_mib = inv.max_memory_bytes >> 20;
    for (i, c) in containers.iter().enumerate() {
        if !asks(c) {
            continue;
        }
        let cname = c["name"].as_str().unwrap_or("");
        let at = format!("container {cname:?} (spec.containers[{i}])");
        // Each managed value, limit else request; every present value must be a number.
        let mut val: BTreeMap<&str, u64> = BTreeMap::new();
        for section in ["requests", "limits"] {
            let Some(map) = c["resources"][section].as_object() else {
                continue;
            };
            for n in managed {
                let Some(v) = map.get(n.as_str()) else {
                    continue;
                };
                match value_text(v).as_deref().map(fgpu_api::quantity::parse_u64) {
                    Some(Ok(x)) => {
                        val.insert(n.as_str(), x);
                    }
                    Some(Err(e)) => problems.push(format!(
                        "{at}: resources.{section}[{n:?}]: {e}; use a whole number"
                    )),
                    None => problems.push(format!(
                        "{at}: resources.{section}[{n:?}]: {v} is not a quantity; use a whole number"
                    )),
                }
            }
        }
        let field = |n: &str| {
            let section = if c["resources"]["limits"].get(n).is_some() {
                "limits"
            } else {
                "requests"
            };
            format!("{at}: resources.{section}[{n:?}]")
        };
        let count = val.get(names.gpu.as_str()).copied();
        let mem = val.get(names.memory.as_str()).copied();
        let pct = val.get(names.memory_percentage.as_str()).copied();
        let cores = val.get(names.cores.as_str()).copied();
        let share_asked = mem.is_some() || pct.is_some() || cores.is_some();
        match count {
            Some(0) if share_asked => problems.push(format!(
                "{}: 0 while GPU memory or cores are asked for; ask for 1 or more GPUs",
                field(&names.gpu)
            )),
            Some(0) => continue,
            Some(n) if n > MAX_GPUS_PER_CONTAINER => problems.push(format!(
                "{}: {n} is above the maximum {MAX_GPUS_PER_CONTAINER}",
                field(&names.gpu)
            )),
            _ => {}
        }
        match mem {
            Some(0) => problems.push(format!(
                "{}: 0; ask for 1 MiB or more, or leave it out for the whole memory",
                field(&names.memory)
            )),
            Some(m) if !inv.is_empty() && m > max_mib => problems.push(format!(
                "{}: {m} MiB is more than the largest GPU in the cluster has ({max_mib} MiB, {})",
                field(&names.memory),
                inv.max_memory_model
            )),
            Some(m) if m > u64::MAX >> 20 => {
                problems.push(format!("{}: {m} MiB is too large", field(&names.memory)))
            }
            _ => {}
        }
        match pct {
            Some(0) => problems.push(format!(
                "{}: 0; use 1 to 100",
                field(&names.memory_percentage)
            )),
            Some(p) if p > 100 => problems.push(format!(
                "{}: {p} is above the maximum 100",
                field(&names.memory_percentage)
            )),
            _ => {}
        }
        if let Some(k) = cores.filter(|&k| k > 100) {
            problems.push(format!(
                "{}: {k} is above the maximum 100",
                field(&names.cores)
            ));
        }
        if mem.is_some() && pct.is_some() {
            warnings.push(format!(
                "fgpu: pod {key}: {at}: both {} and {} are set; {} is used",
                names.memory, names.memory_percentage, names.memory
            ));
        }

        // Defaults. Limits always (the API server requires a limit for an extended
        // resource, and the device manager reads limits); requests too when the container
        // lists our resources there (as every pod does once the API server has defaulted
        // requests from limits), since they must equal the limits.
        let mut defaults: Vec<(&str, String)> = Vec::new();
        if count.is_none() {
            defaults.push((names.gpu.as_str(), "1".into()));
        }
        if mem.is_none() && pct.is_none() && cfg.default_memory_mib > 0 {
            if !inv.is_empty() && cfg.default_memory_mib > max_mib {
                warnings.push(format!(
                    "fgpu: pod {key}: {at}: the default memory {} MiB is more than the largest GPU has ({max_mib} MiB); the pod will not fit",
                    cfg.default_memory_mib
                ));
            }
            defaults.push((names.memory.as_str(), cfg.default_memory_mib.to_string()));
        }
        if cores.is_none() && cfg.default_cores > 0 {
            defaults.push((names.cores.as_str(), cfg.default_cores.to_string()));
        }
        let requests = c["resources"]["requests"].as_object();
        let limits = c["resources"]["limits"].as_object();
        let mut add_limits = defaults.clone();
        // Our resources set as requests only: the same value as the limit.
        for n in managed {
            if let Some(v) = requests.and_then(|r| r.get(n.as_str()))
                && limits.is_none_or(|l| !l.contains_key(n.as_str()))
                && let Some(t) = value_text(v)
            {
                add_limits.push((n.as_str(), t));
            }
        }
        let add_requests =
            if requests.is_some_and(|r| managed.iter().any(|n| r.contains_key(n.as_str()))) {
                defaults
            } else {
                Vec::new()
            };
        for (section, add) in [("limits", add_limits), ("requests", add_requests)] {
            if add.is_empty() {
                continue;
            }
            let base = format!("/spec/containers/{i}/resources/{section}");
            let target = &mut mutated["spec"]["containers"][i]["resources"][section];
            if target.is_object() {
                for (n, v) in &add {
                    patch.push(
                        json!({"op": "add", "path": format!("{base}/{}", token(n)), "value": v}),
                    );
                    target[*n] = json!(v);
                }
            } else {
                let obj: Map<String, Value> = add
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), json!(v)))
                    .collect();
                patch.push(json!({"op": "add", "path": base, "value": obj}));
                *target = Value::Object(obj);
            }
        }
    }

    // Annotations.
    let ann = |a: &str| m["annotations"][a].as_str().map(str::trim);
    let at_ann = |a: &str| format!("metadata.annotations[{a:?}]");
    for a in [
        legacy::ANNOTATION_NODE_SCHEDULER_POLICY,
        legacy::ANNOTATION_GPU_SCHEDULER_POLICY,
    ] {
        if let Some(v) = ann(a)
            && v != "binpack"
            && v != "spread"
        {
            problems.push(format!(
                "{}: {v:?}; valid are binpack and spread",
                at_ann(a)
            ));
        }
    }
    for a in [
        legacy::ANNOTATION_USE_GPU_TYPE,
        legacy::ANNOTATION_NOUSE_GPU_TYPE,
    ] {
        let Some(v) = ann(a) else { continue };
        if inv.is_empty() {
            if !list(v).is_empty() {
                warnings.push(format!(
                    "fgpu: pod {key}: {}: no node has published its GPUs yet, so the model names are not checked",
                    at_ann(a)
                ));
            }
            continue;
        }
        let unknown: Vec<&str> = list(v).into_iter().filter(|t| !inv.has_model(t)).collect();
        if !unknown.is_empty() {
            problems.push(format!(
                "{}: no GPU in the cluster matches {}; known models: {}",
                at_ann(a),
                unknown
                    .iter()
                    .map(|t| format!("{t:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                inv.models
                    .iter()
                    .map(|t| format!("{t:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    for a in [legacy::ANNOTATION_USE_GPU_UUID, ANNOTATION_NOUSE_GPU_UUID] {
        let Some(v) = ann(a) else { continue };
        let ids = list(v);
        let bad: Vec<String> = ids
            .iter()
            .filter(|u| !valid_gpu_uuid(u))
            .map(|u| format!("{u:?}"))
            .collect();
        if !bad.is_empty() {
            problems.push(format!(
                "{}: {} not a GPU UUID; write them as NVML does, e.g. GPU-6c8e2f1a-0b3d-4e5f-8a9b-0c1d2e3f4a5b",
                at_ann(a),
                if bad.len() == 1 {
                    format!("{} is", bad[0])
                } else {
                    format!("{} are", bad.join(", "))
                }
            ));
            continue;
        }
        if a == ANNOTATION_NOUSE_GPU_UUID && !ids.is_empty() {
            warnings.push(format!(
                "fgpu: pod {key}: {}: excluding GPUs by UUID is not supported by the extender yet; the pod may get those GPUs (use {} to pin GPUs instead)",
                at_ann(a),
                legacy::ANNOTATION_USE_GPU_UUID
            ));
        }
        if !inv.is_empty() {
            let unknown: Vec<&str> = ids
                .iter()
                .copied()
                .filter(|u| !inv.uuids.contains(&u.to_ascii_lowercase()))
                .collect();
            if !unknown.is_empty() {
                warnings.push(format!(
                    "fgpu: pod {key}: {}: no known node has {}",
                    at_ann(a),
                    unknown.join(", ")
                ));
            }
        }
    }
    if let Some(v) = ann(ANNOTATION_NUMA_BIND)
        && !matches!(v, "true" | "false" | "")
    {
        problems.push(format!(
            "{}: {v:?}; valid are \"true\" and \"false\"",
            at_ann(ANNOTATION_NUMA_BIND)
        ));
    }

    if problems.is_empty() {
        // The extender's own reader on the pod as it will be stored: whatever it would
        // refuse at filter time is refused now.
        let parsed = serde_json::from_value::<fgpu_api::extender::Pod>(mutated)
            .map_err(|e| format!("the pod does not decode: {e}"))
            .and_then(|p| {
                fgpu_driver::hami::pod_request(&p, names, cfg.default_policy)
                    .map(drop)
                    .map_err(|e| format!("{}: {}", e.path, e.problem))
            });
        if let Err(e) = parsed {
            problems.push(e);
        }
    }
    if problems.is_empty() {
        if inv.is_empty() {
            warnings.push(format!(
                "fgpu: pod {key}: no node has published its GPUs yet; the pod stays pending until one does"
            ));
        }
        Decision::Allow { patch, warnings }
    } else {
        Decision::Deny(format!("fgpu: pod {key}: {}", problems.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const UUID_A: &str = "GPU-0423a23e-8042-44c4-bb51-62264d985475";
    const UUID_B: &str = "GPU-23dfb177-cd7d-42f5-b340-12bc234902b9";

    fn inventory() -> GpuInventory {
        let mut inv = GpuInventory {
            nodes: 2,
            ..Default::default()
        };
        inv.add_gpu("NVIDIA A100-SXM4-80GB", UUID_A, 80 * GIB);
        inv.add_gpu("Tesla T4", UUID_B, 16 * GIB);
        inv
    }

    fn pod(annotations: Value, containers: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
            "spec": {"containers": containers}
        })
    }

    fn ctr(name: &str, limits: Value) -> Value {
        json!({"name": name, "image": "x", "resources": {"limits": limits}})
    }

    fn admit(p: &Value) -> Decision {
        admit_pod(p, &WebhookConfig::default(), &inventory())
    }

    /// Applies the decision's patch with the `json-patch` crate (as the API server would).
    fn patched(p: &Value, d: &Decision) -> Value {
        let Decision::Allow { patch, .. } = d else {
            panic!("denied: {d:?}")
        };
        let ops: json_patch::Patch = serde_json::from_value(Value::Array(patch.clone())).unwrap();
        let mut out = p.clone();
        json_patch::patch(&mut out, &ops).unwrap();
        out
    }

    #[test]
    fn pods_without_gpu_resources_are_left_alone() {
        let cases = [
            pod(json!({}), json!([ctr("c", json!({"cpu": "1"}))])),
            pod(json!({}), json!([{"name": "c", "image": "x"}])),
            json!({"metadata": {"name": "p"}, "spec": {}}),
            // Bad HAMi annotations do not matter on a pod that asks for no GPU.
            pod(
                json!({"hami.io/node-scheduler-policy": "fastest"}),
                json!([ctr("c", json!({"memory": "1Gi"}))]),
            ),
        ];
        for p in cases {
            assert_eq!(
                admit(&p),
                Decision::Allow {
                    patch: vec![],
                    warnings: vec![]
                },
                "{p}"
            );
        }
    }

    #[test]
    fn another_scheduler_is_left_alone_with_a_warning() {
        let mut p = pod(
            json!({"hami.io/node-scheduler-policy": "fastest"}),
            json!([ctr("c", json!({"nvidia.com/gpumem": "1000"}))]),
        );
        p["spec"]["schedulerName"] = json!("volcano");
        let Decision::Allow { patch, warnings } = admit(&p) else {
            panic!()
        };
        assert!(patch.is_empty());
        assert!(warnings[0].contains("\"volcano\""), "{warnings:?}");
    }

    #[test]
    fn defaults_table() {
        // (what, limits or whole container, expected container resources after the patch)
        let cases: Vec<(&str, Value, Value)> = vec![
            (
                "count added beside memory and cores",
                ctr(
                    "c",
                    json!({"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
                ),
                json!({"limits": {"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30", "nvidia.com/gpu": "1"}}),
            ),
            (
                "count added beside a percentage, kept a percentage",
                ctr("c", json!({"nvidia.com/gpumem-percentage": "50"})),
                json!({"limits": {"nvidia.com/gpumem-percentage": "50", "nvidia.com/gpu": "1"}}),
            ),
            (
                "cores only",
                ctr("c", json!({"nvidia.com/gpucores": "20"})),
                json!({"limits": {"nvidia.com/gpucores": "20", "nvidia.com/gpu": "1"}}),
            ),
            (
                "as the API server sends it (requests defaulted from limits)",
                json!({"name": "c", "image": "x", "resources": {
                    "limits": {"nvidia.com/gpucores": "30"},
                    "requests": {"nvidia.com/gpucores": "30"}
                }}),
                json!({
                    "limits": {"nvidia.com/gpucores": "30", "nvidia.com/gpu": "1"},
                    "requests": {"nvidia.com/gpucores": "30", "nvidia.com/gpu": "1"}
                }),
            ),
            (
                "count given: nothing added",
                ctr("c", json!({"nvidia.com/gpu": "2"})),
                json!({"limits": {"nvidia.com/gpu": "2"}}),
            ),
            (
                "requests only: limits created, requests completed",
                json!({"name": "c", "image": "x", "resources": {"requests": {"nvidia.com/gpumem": "1000", "cpu": "1"}}}),
                json!({
                    "requests": {"nvidia.com/gpumem": "1000", "cpu": "1", "nvidia.com/gpu": "1"},
                    "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
                }),
            ),
        ];
        for (what, c, want) in cases {
            let p = pod(json!({}), json!([ctr("side", json!({"cpu": "1"})), c]));
            let d = admit(&p);
            let out = patched(&p, &d);
            assert_eq!(out["spec"]["containers"][1]["resources"], want, "{what}");
            assert_eq!(
                out["spec"]["containers"][0], p["spec"]["containers"][0],
                "{what}"
            );
            assert_eq!(out["spec"]["schedulerName"], "fgpu-scheduler", "{what}");
        }
    }

    #[test]
    fn scheduler_name_set_replaced_or_kept() {
        let base = pod(json!({}), json!([ctr("c", json!({"nvidia.com/gpu": "1"}))]));
        let mut dflt = base.clone();
        dflt["spec"]["schedulerName"] = json!("default-scheduler");
        let mut ours = base.clone();
        ours["spec"]["schedulerName"] = json!("fgpu-scheduler");
        for p in [&base, &dflt, &ours] {
            let d = admit(p);
            assert_eq!(patched(p, &d)["spec"]["schedulerName"], "fgpu-scheduler");
        }
        let Decision::Allow { patch, warnings } = admit(&ours) else {
            panic!()
        };
        assert!(
            patch.is_empty() && warnings.is_empty(),
            "{patch:?} {warnings:?}"
        );
        let Decision::Allow { patch, .. } = admit(&dflt) else {
            panic!()
        };
        assert_eq!(patch[0]["op"], "replace");
    }

    #[test]
    fn configured_defaults_and_names() {
        let cfg = WebhookConfig {
            scheduler_name: "gpu-sched".into(),
            default_memory_mib: 4096,
            default_cores: 50,
            names: LegacyResourceNames {
                gpu: "example.com/vgpu".into(),
                memory: "example.com/vmem".into(),
                memory_percentage: "example.com/vmem-pct".into(),
                cores: "example.com/vcores".into(),
            },
            ..WebhookConfig::default()
        };
        let p = pod(
            json!({}),
            json!([ctr("c", json!({"example.com/vgpu": "1"}))]),
        );
        let d = admit_pod(&p, &cfg, &inventory());
        let out = patched(&p, &d);
        assert_eq!(
            out["spec"]["containers"][0]["resources"]["limits"],
            json!({"example.com/vgpu": "1", "example.com/vmem": "4096", "example.com/vcores": "50"})
        );
        assert_eq!(out["spec"]["schedulerName"], "gpu-sched");
        // A percentage is a memory field: no default memory next to it.
        let p = pod(
            json!({}),
            json!([ctr(
                "c",
                json!({"example.com/vmem-pct": "25", "example.com/vcores": "10"})
            )]),
        );
        let out = patched(&p, &admit_pod(&p, &cfg, &inventory()));
        assert_eq!(
            out["spec"]["containers"][0]["resources"]["limits"],
            json!({"example.com/vmem-pct": "25", "example.com/vcores": "10", "example.com/vgpu": "1"})
        );
        // HAMi's names are not managed under other names.
        let p = pod(json!({}), json!([ctr("c", json!({"nvidia.com/gpu": "1"}))]));
        assert!(
            matches!(admit_pod(&p, &cfg, &inventory()), Decision::Allow { patch, .. } if patch.is_empty())
        );
    }

    #[test]
    fn rejections_table() {
        let one = |limits: Value| json!([ctr("main", limits)]);
        let gpu1 = || one(json!({"nvidia.com/gpu": "1"}));
        // (annotations, containers, text the message must contain)
        let cases: Vec<(Value, Value, &str)> = vec![
            (
                json!({"hami.io/node-scheduler-policy": "fastest"}),
                gpu1(),
                "metadata.annotations[\"hami.io/node-scheduler-policy\"]: \"fastest\"; valid are binpack and spread",
            ),
            (
                json!({"hami.io/gpu-scheduler-policy": "topology-aware"}),
                gpu1(),
                "metadata.annotations[\"hami.io/gpu-scheduler-policy\"]: \"topology-aware\"; valid are binpack and spread",
            ),
            (
                json!({"nvidia.com/use-gputype": "A100,H200"}),
                gpu1(),
                "metadata.annotations[\"nvidia.com/use-gputype\"]: no GPU in the cluster matches \"H200\"",
            ),
            (
                json!({"nvidia.com/nouse-gputype": "V100"}),
                gpu1(),
                "metadata.annotations[\"nvidia.com/nouse-gputype\"]: no GPU in the cluster matches \"V100\"",
            ),
            (
                json!({"nvidia.com/use-gpuuuid": format!("{UUID_A},GPU-1")}),
                gpu1(),
                "metadata.annotations[\"nvidia.com/use-gpuuuid\"]: \"GPU-1\" is not a GPU UUID",
            ),
            (
                json!({"nvidia.com/nouse-gpuuuid": "0423a23e-8042-44c4-bb51-62264d985475"}),
                gpu1(),
                "metadata.annotations[\"nvidia.com/nouse-gpuuuid\"]: \"0423a23e-8042-44c4-bb51-62264d985475\" is not a GPU UUID",
            ),
            (
                json!({"nvidia.com/numa-bind": "yes"}),
                gpu1(),
                "metadata.annotations[\"nvidia.com/numa-bind\"]: \"yes\"",
            ),
            (
                json!({}),
                one(json!({"nvidia.com/gpumem": "81921"})),
                "container \"main\" (spec.containers[0]): resources.limits[\"nvidia.com/gpumem\"]: 81921 MiB is more than the largest GPU in the cluster has (81920 MiB, NVIDIA A100-SXM4-80GB)",
            ),
            (
                json!({}),
                one(json!({"nvidia.com/gpumem": "0"})),
                "container \"main\" (spec.containers[0]): resources.limits[\"nvidia.com/gpumem\"]: 0; ask for 1 MiB or more",
            ),
            (
                json!({}),
                one(json!({"nvidia.com/gpucores": "101"})),
                "container \"main\" (spec.containers[0]): resources.limits[\"nvidia.com/gpucores\"]: 101 is above the maximum 100",
            ),
            (
                json!({}),
                one(json!({"nvidia.com/gpumem-percentage": "150"})),
                "container \"main\" (spec.containers[0]): resources.limits[\"nvidia.com/gpumem-percentage\"]: 150 is above the maximum 100",
            ),
            (
                json!({}),
                one(json!({"nvidia.com/gpumem-percentage": "0"})),
                "resources.limits[\"nvidia.com/gpumem-percentage\"]: 0; use 1 to 100",
            ),
            (
                json!({}),
                one(json!({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1000"})),
                "container \"main\" (spec.containers[0]): resources.limits[\"nvidia.com/gpu\"]: 0 while GPU memory or cores are asked for",
            ),
            (
                json!({}),
                json!([{"name": "main", "image": "x", "resources": {"requests": {"nvidia.com/gpucores": "101"}}}]),
                "container \"main\" (spec.containers[0]): resources.requests[\"nvidia.com/gpucores\"]: 101 is above the maximum 100",
            ),
            (
                json!({}),
                one(json!({"nvidia.com/gpu": "33"})),
                "resources.limits[\"nvidia.com/gpu\"]: 33 is above the maximum 32",
            ),
            (
                json!({}),
                one(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1.5"})),
                "container \"main\" (spec.containers[0]): resources.limits[\"nvidia.com/gpumem\"]: ",
            ),
            (
                json!({}),
                one(json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "lots"})),
                "resources.limits[\"nvidia.com/gpucores\"]: ",
            ),
            (
                json!({}),
                json!([{"name": "main", "image": "x", "resources": {"requests": {"nvidia.com/gpumem": "1.5"}}}]),
                "container \"main\" (spec.containers[0]): resources.requests[\"nvidia.com/gpumem\"]: ",
            ),
        ];
        for (ann, ctrs, want) in cases {
            let p = pod(ann.clone(), ctrs.clone());
            match admit(&p) {
                Decision::Deny(m) => {
                    assert!(m.starts_with("fgpu: pod ns/p: "), "{m}");
                    assert!(m.contains(want), "{ann} {ctrs}:\n  {m}\n  wants {want}");
                }
                d => panic!("{ann} {ctrs}: admitted: {d:?}"),
            }
        }
        // "1.5" and "lots" say why and what is valid.
        let Decision::Deny(m) = admit(&pod(json!({}), one(json!({"nvidia.com/gpucores": "lots"}))))
        else {
            panic!()
        };
        assert!(m.ends_with("use a whole number"), "{m}");
    }

    #[test]
    fn node_name_privileged_and_mirror_pods() {
        let mut p = pod(
            json!({}),
            json!([{"name": "main", "image": "x", "securityContext": {"privileged": true},
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        );
        p["spec"]["nodeName"] = json!("node-a");
        let Decision::Deny(m) = admit(&p) else {
            panic!()
        };
        assert!(m.contains("spec.nodeName: \"node-a\" is set"), "{m}");
        assert!(
            m.contains("container \"main\" (spec.containers[0]): securityContext.privileged:"),
            "{m}"
        );
        p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
        assert_eq!(
            admit(&p),
            Decision::Allow {
                patch: vec![],
                warnings: vec![]
            }
        );
        // Privileged containers without GPU resources are not our business.
        let p = pod(
            json!({}),
            json!([
                {"name": "side", "image": "x", "securityContext": {"privileged": true}},
                ctr("main", json!({"nvidia.com/gpu": "1"}))
            ]),
        );
        assert!(matches!(admit(&p), Decision::Allow { .. }));
    }

    #[test]
    fn init_containers_and_several_problems_at_once() {
        let p = json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"hami.io/gpu-scheduler-policy": "mutex"}},
            "spec": {
                "initContainers": [ctr("setup", json!({"nvidia.com/gpu": "1"}))],
                "containers": [ctr("a", json!({"nvidia.com/gpucores": "200"}))]
            }
        });
        let Decision::Deny(m) = admit(&p) else {
            panic!()
        };
        for part in [
            "init container \"setup\" (spec.initContainers[0]): asks for GPU resources",
            "container \"a\" (spec.containers[0]): resources.limits[\"nvidia.com/gpucores\"]: 200",
            "hami.io/gpu-scheduler-policy",
        ] {
            assert!(m.contains(part), "{m}\n  wants {part}");
        }
    }

    #[test]
    fn warnings_for_soft_problems() {
        // Empty inventory: model names cannot be checked; allowed with warnings.
        let p = pod(
            json!({"nvidia.com/use-gputype": "H200"}),
            json!([ctr("c", json!({"nvidia.com/gpumem": "999999"}))]),
        );
        let Decision::Allow { warnings, .. } =
            admit_pod(&p, &WebhookConfig::default(), &GpuInventory::default())
        else {
            panic!()
        };
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("model names are not checked"));
        assert!(warnings[1].contains("no node has published its GPUs yet"));
        // Exclusion by UUID is not honoured; UUIDs nobody has; both memory fields.
        let p = pod(
            json!({
                "nvidia.com/nouse-gpuuuid": UUID_A,
                "nvidia.com/use-gpuuuid": "GPU-ffffffff-8042-44c4-bb51-62264d985475",
                "nvidia.com/use-gputype": "a100, t4"
            }),
            json!([ctr(
                "c",
                json!({"nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "10"})
            )]),
        );
        let Decision::Allow { warnings, .. } = admit(&p) else {
            panic!()
        };
        let all = warnings.join("\n");
        assert!(all.contains("nvidia.com/gpumem is used"), "{all}");
        assert!(all.contains("not supported by the extender yet"), "{all}");
        assert!(
            all.contains("no known node has GPU-ffffffff-8042-44c4-bb51-62264d985475"),
            "{all}"
        );
    }

    #[test]
    fn uuids() {
        assert!(valid_gpu_uuid(UUID_A));
        assert!(valid_gpu_uuid("MIG-0423A23E-8042-44C4-BB51-62264D985475"));
        for bad in [
            "GPU-1",
            "gpu-0423a23e-8042-44c4-bb51-62264d985475",
            "GPU-0423a23e804244c4bb5162264d985475",
            "GPU-0423a23e-8042-44c4-bb51-62264d98547z",
            "",
        ] {
            assert!(!valid_gpu_uuid(bad), "{bad}");
        }
    }

    #[test]
    fn reviews() {
        let cfg = WebhookConfig::default();
        let inv = inventory();
        let p = pod(
            json!({}),
            json!([ctr("c", json!({"nvidia.com/gpumem": "1000"}))]),
        );
        let mut p_no_ns = p.clone();
        p_no_ns["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("namespace");
        let r = review(
            &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "u1", "operation": "CREATE", "namespace": "team",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": p_no_ns}}),
            &cfg,
            &inv,
        )
        .unwrap();
        assert_eq!(r["response"]["uid"], "u1");
        assert_eq!(r["response"]["allowed"], true);
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        // Deny names the namespace from the request.
        let mut bad = p.clone();
        bad["metadata"] =
            json!({"name": "p", "annotations": {"hami.io/node-scheduler-policy": "x"}});
        let r = review(
            &json!({"request": {"uid": "u2", "operation": "CREATE", "namespace": "team", "object": bad}}),
            &cfg,
            &inv,
        )
        .unwrap();
        assert_eq!(r["response"]["allowed"], false);
        let msg = r["response"]["status"]["message"].as_str().unwrap();
        assert!(msg.starts_with("fgpu: pod team/p: "), "{msg}");
        // A ReplicaSet's pod: generateName, no name yet; mutated, and named in denials.
        let gen_pod = |ann: Value| {
            json!({"metadata": {"generateName": "train-", "annotations": ann},
                "spec": {"containers": [ctr("c", json!({"nvidia.com/gpucores": "10"}))]}})
        };
        let r = review(
            &json!({"request": {"uid": "u4", "operation": "CREATE", "namespace": "team", "object": gen_pod(json!({}))}}),
            &cfg,
            &inv,
        )
        .unwrap();
        assert_eq!(r["response"]["allowed"], true, "{r}");
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        let r = review(
            &json!({"request": {"uid": "u5", "operation": "CREATE", "namespace": "team",
                "object": gen_pod(json!({"nvidia.com/numa-bind": "maybe"}))}}),
            &cfg,
            &inv,
        )
        .unwrap();
        let msg = r["response"]["status"]["message"].as_str().unwrap();
        assert!(msg.starts_with("fgpu: pod team/train-: "), "{msg}");
        // UPDATE and other kinds: allowed, no patch.
        let r = review(
            &json!({"request": {"uid": "u3", "operation": "UPDATE", "object": p}}),
            &cfg,
            &inv,
        )
        .unwrap();
        assert_eq!(r["response"]["allowed"], true);
        assert!(r["response"]["patch"].is_null());
        // Bodies that are not reviews.
        for b in [
            json!([]),
            json!({}),
            json!({"request": {"operation": "CREATE"}}),
            json!({"request": {"uid": 7}}),
            json!({"request": {"uid": "u", "operation": "CREATE", "object": "pod"}}),
        ] {
            assert!(review(&b, &cfg, &inv).is_err(), "{b}");
        }
    }
}
