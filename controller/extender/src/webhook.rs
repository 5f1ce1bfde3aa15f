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
//!
//! The GPU grant is the extender's alone ([`guard`], Pod CREATE and UPDATE, also served
//! on its own as the validating `POST /validate-pods`): a request that sets, changes or
//! removes the assignment annotation (`<driver>/assigned-devices`, the one the device
//! plugin turns into the container's quota) is refused unless it comes from the
//! extender's own user ([`WebhookConfig::extender_user`]).

use std::collections::BTreeMap;

use fgpu_api::names::{DriverName, LegacyResourceNames, legacy};
use fgpu_driver::engine::Policy;
use serde_json::{Map, Value, json};

use fgpu_driver::hami::{ANNOTATION_NUMA_BIND, MAX_GPUS_PER_CONTAINER};
use fgpu_plumbing::admission::pointer_token as token;

pub use crate::state::DEFAULT_SCHEDULER_NAME;

/// kube-scheduler's own profile name; pods naming it are moved to fgpu's scheduler.
pub const KUBE_DEFAULT_SCHEDULER: &str = "default-scheduler";

pub use fgpu_api::names::legacy::ANNOTATION_NOUSE_GPU_UUID;

/// Default user allowed to write the assignment annotation: the extender's service account
/// in `deploy/extender/rbac.yaml`.
pub const DEFAULT_EXTENDER_USER: &str = "system:serviceaccount:fgpu-system:fgpu-extender";

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
    /// The only user (`request.userInfo.username`) that may set, change or remove the
    /// assignment annotation: the extender's own identity.
    pub extender_user: String,
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
            extender_user: DEFAULT_EXTENDER_USER.to_owned(),
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

/// Why a body is not a usable `AdmissionReview` (the server answers 400 with the message).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview: not a JSON object")]
    NotAnObject,
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("the AdmissionReview has no request.uid (a string)")]
    NoUid,
    #[error("the AdmissionReview's request.object is not a Pod object")]
    NotAPod,
}

/// The `request` of an `AdmissionReview`, once it is one the server can answer.
fn request_of(review: &Value) -> Result<&Value, ReviewError> {
    if !review.is_object() {
        return Err(ReviewError::NotAnObject);
    }
    let req = &review["request"];
    if !req.is_object() {
        return Err(ReviewError::NoRequest);
    }
    if !req["uid"].is_string() {
        return Err(ReviewError::NoUid);
    }
    Ok(req)
}

/// Answers an `AdmissionReview` (any JSON). `Err` is a body that is not a usable review
/// (the server answers 400 with it); everything else is an answer to send.
pub fn review(
    review: &Value,
    cfg: &WebhookConfig,
    inv: &GpuInventory,
) -> Result<Value, ReviewError> {
    let req = request_of(review)?;
    let answer = |d: Decision| match d {
        Decision::Allow { patch, warnings } => {
            let patch = (!patch.is_empty()).then_some(Value::Array(patch));
            fgpu_plumbing::admission::response(review, true, None, patch.as_ref(), &warnings)
        }
        Decision::Deny(m) => fgpu_plumbing::admission::response(review, false, Some(&m), None, &[]),
    };
    let kind = req["kind"]["kind"].as_str().unwrap_or("Pod");
    if kind == "Pod"
        && let Some(m) = guard(req, cfg)
    {
        return Ok(answer(Decision::Deny(m)));
    }
    if req["operation"].as_str() != Some("CREATE") || kind != "Pod" {
        return Ok(answer(Decision::Allow {
            patch: vec![],
            warnings: vec![],
        }));
    }
    let pod = &req["object"];
    if !pod.is_object() {
        return Err(ReviewError::NotAPod);
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

/// Answers an `AdmissionReview` with the [`guard`] alone (the validating
/// `/validate-pods`): allowed unless the request writes the assignment annotation as
/// someone other than the extender. `Err` is a body that is not a usable review.
pub fn guard_review(review: &Value, cfg: &WebhookConfig) -> Result<Value, ReviewError> {
    let req = request_of(review)?;
    let kind = req["kind"]["kind"].as_str().unwrap_or("Pod");
    Ok(match guard(req, cfg).filter(|_| kind == "Pod") {
        Some(m) => fgpu_plumbing::admission::response(review, false, Some(&m), None, &[]),
        None => fgpu_plumbing::admission::response(review, true, None, None, &[]),
    })
}

/// The refusal of an admission `request` (CREATE or UPDATE of a Pod) that sets, changes or
/// removes the assignment annotation, unless its user is the extender; `None` otherwise.
pub fn guard(req: &Value, cfg: &WebhookConfig) -> Option<String> {
    let op = req["operation"].as_str().unwrap_or("");
    if op != "CREATE" && op != "UPDATE" {
        return None;
    }
    let ann = cfg.driver.pod_assignment_annotation();
    let new = req["object"]["metadata"]["annotations"][&ann].as_str();
    let old = if op == "UPDATE" {
        req["oldObject"]["metadata"]["annotations"][&ann].as_str()
    } else {
        None
    };
    if new == old {
        return None;
    }
    let user = req["userInfo"]["username"].as_str().unwrap_or("");
    if user == cfg.extender_user {
        return None;
    }
    let meta = if req["object"]["metadata"].is_object() {
        &req["object"]["metadata"]
    } else {
        &req["oldObject"]["metadata"]
    };
    let mut meta = meta.clone();
    if meta["namespace"].as_str().is_none_or(str::is_empty)
        && let Some(ns) = req["namespace"].as_str()
        && let Some(m) = meta.as_object_mut()
    {
        m.insert("namespace".into(), json!(ns));
    }
    let what = match (old, new) {
        (None, _) => "set",
        (_, None) => "remove",
        _ => "change",
    };
    Some(format!(
        "fgpu: pod {}: {}: only fgpu's extender ({}) writes the GPU assignment; user {user:?} may not {what} it",
        pod_key(&meta),
        at_annotation(&ann),
        cfg.extender_user
    ))
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

/// Decides on one pod (`pod` is the Pod object, namespace filled in): a pod fgpu does not
/// handle passes unchanged ([`pass_through`]); otherwise every check runs, the patch is
/// built, and the mutated pod goes through the extender's own reader ([`extender_check`]).
pub fn admit_pod(pod: &Value, cfg: &WebhookConfig, inv: &GpuInventory) -> Decision {
    let ctx = Admission {
        cfg,
        inv,
        managed: managed_names(&cfg.names),
        key: pod_key(&pod["metadata"]),
    };
    let containers = pod_list(pod, "containers");
    let inits = pod_list(pod, "initContainers");
    if let Some(d) = ctx.pass_through(pod, containers, inits) {
        return d;
    }
    let mut found = Findings::default();
    let mut patch = Patch::of(pod);
    ctx.pod_problems(pod, containers, inits, &mut found);
    ctx.scheduler_patch(pod, &mut patch);
    for (i, c) in containers.iter().enumerate() {
        if ctx.asks(c) {
            ctx.container(i, c, &mut found, &mut patch);
        }
    }
    ctx.annotations(&pod["metadata"], &mut found);
    if found.problems.is_empty()
        && let Err(e) = extender_check(patch.pod, &cfg.names, cfg.default_policy)
    {
        found.problems.push(e);
    }
    ctx.decide(found, patch.ops)
}

/// The four managed resource names, in the order their values are read and copied.
fn managed_names(names: &LegacyResourceNames) -> [&str; 4] {
    [
        names.gpu.as_str(),
        names.memory.as_str(),
        names.memory_percentage.as_str(),
        names.cores.as_str(),
    ]
}

/// How messages name the pod: `namespace/name`, the `generateName` when it has no name
/// yet, `<unnamed>` when it has neither.
fn pod_key(meta: &Value) -> String {
    let n = meta["name"]
        .as_str()
        .filter(|s| !s.is_empty())
        .or_else(|| meta["generateName"].as_str())
        .unwrap_or("<unnamed>");
    match meta["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{n}"),
        _ => n.to_owned(),
    }
}

/// The pod's `spec.<field>` array (containers or init containers); empty when absent.
fn pod_list<'v>(pod: &'v Value, field: &str) -> &'v [Value] {
    pod["spec"][field].as_array().map_or(&[], Vec::as_slice)
}

/// Whether container `c` names one of the `managed` resources in its limits or requests.
fn asks_for(c: &Value, managed: &[&str; 4]) -> bool {
    ["limits", "requests"].iter().any(|k| {
        c["resources"][k]
            .as_object()
            .is_some_and(|r| managed.iter().any(|n| r.contains_key(*n)))
    })
}

/// Pod annotation `a`, trimmed.
fn annotation<'v>(meta: &'v Value, a: &str) -> Option<&'v str> {
    meta["annotations"][a].as_str().map(str::trim)
}

/// How messages name annotation `a`.
fn at_annotation(a: &str) -> String {
    format!("metadata.annotations[{a:?}]")
}

/// `"a", "b"`: each item quoted, comma-separated.
fn quoted<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    items
        .into_iter()
        .map(|t| format!("{:?}", t.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An admission with nothing to patch and nothing to say.
fn unchanged() -> Decision {
    Decision::Allow {
        patch: vec![],
        warnings: vec![],
    }
}

/// What the checks of one pod found: the refusals and the warnings, in the order found.
#[derive(Debug, Default)]
struct Findings {
    problems: Vec<String>,
    warnings: Vec<String>,
}

/// The JSON patch being built and the pod as it will be with it applied.
struct Patch {
    ops: Vec<Value>,
    pod: Value,
}

impl Patch {
    fn of(pod: &Value) -> Self {
        Self {
            ops: Vec::new(),
            pod: pod.clone(),
        }
    }
}

/// A container's managed values (limit, else request), as numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Asked {
    count: Option<u64>,
    memory: Option<u64>,
    percentage: Option<u64>,
    cores: Option<u64>,
}

impl Asked {
    /// Whether a share of a GPU (memory, percentage or cores) is named.
    fn share(&self) -> bool {
        self.memory.is_some() || self.percentage.is_some() || self.cores.is_some()
    }
}

/// One pod's admission: the configuration, the cluster's GPUs and how the pod is named.
struct Admission<'a> {
    cfg: &'a WebhookConfig,
    inv: &'a GpuInventory,
    managed: [&'a str; 4],
    key: String,
}

impl Admission<'_> {
    /// Whether container `c` asks for GPU resources.
    fn asks(&self, c: &Value) -> bool {
        asks_for(c, &self.managed)
    }

    /// The decision for a pod fgpu leaves alone (`None`: fgpu handles it): one that asks
    /// for no GPU resource, a mirror pod, one that names another scheduler (warned).
    fn pass_through(&self, pod: &Value, containers: &[Value], inits: &[Value]) -> Option<Decision> {
        if !containers.iter().chain(inits).any(|c| self.asks(c)) {
            return Some(unchanged());
        }
        // A mirror pod reflects a static pod the kubelet already runs; nothing to place.
        if pod["metadata"]["annotations"][ANNOTATION_MIRROR_POD].is_string() {
            return Some(unchanged());
        }
        let current = pod["spec"]["schedulerName"].as_str().unwrap_or("");
        let ours = &self.cfg.scheduler_name;
        if !current.is_empty() && current != KUBE_DEFAULT_SCHEDULER && current != ours {
            return Some(Decision::Allow {
                patch: vec![],
                warnings: vec![format!(
                    "fgpu: pod {} asks for GPU resources but names scheduler {current:?}; fgpu leaves it alone and will not place its GPUs (remove spec.schedulerName or set it to {ours:?})",
                    self.key
                )],
            });
        }
        None
    }

    /// Problems of the pod as a whole: a preset `spec.nodeName`, privileged containers
    /// asking for GPUs, init containers asking for GPUs.
    fn pod_problems(
        &self,
        pod: &Value,
        containers: &[Value],
        inits: &[Value],
        found: &mut Findings,
    ) {
        if let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            found.problems.push(format!(
                "spec.nodeName: {node:?} is set, so no scheduler places the pod and its GPUs are never chosen; remove it (pin the node with a nodeSelector on kubernetes.io/hostname instead)"
            ));
        }
        for (section, list) in [("containers", containers), ("initContainers", inits)] {
            for (i, c) in list.iter().enumerate() {
                if self.asks(c) && c["securityContext"]["privileged"] == true {
                    found.problems.push(format!(
                        "container {:?} (spec.{section}[{i}]): securityContext.privileged: a privileged container sees every GPU of the node, so its GPU quota cannot be enforced; drop privileged or the GPU resources",
                        c["name"].as_str().unwrap_or("")
                    ));
                }
            }
        }
        for (i, c) in inits.iter().enumerate() {
            if self.asks(c) {
                found.problems.push(format!(
                    "init container {:?} (spec.initContainers[{i}]): asks for GPU resources; fgpu places GPUs for regular containers only",
                    c["name"].as_str().unwrap_or("")
                ));
            }
        }
    }

    /// Sets `spec.schedulerName` to fgpu's scheduler unless the pod names it already.
    fn scheduler_patch(&self, pod: &Value, patch: &mut Patch) {
        let name = &self.cfg.scheduler_name;
        if pod["spec"]["schedulerName"].as_str().unwrap_or("") == name {
            return;
        }
        let op = if pod["spec"].get("schedulerName").is_some() {
            "replace"
        } else {
            "add"
        };
        patch
            .ops
            .push(json!({"op": op, "path": "/spec/schedulerName", "value": name}));
        patch.pod["spec"]["schedulerName"] = json!(name);
    }

    /// Checks regular container `i` (which asks for GPUs) and patches in its defaults.
    fn container(&self, i: usize, c: &Value, found: &mut Findings, patch: &mut Patch) {
        let at = format!(
            "container {:?} (spec.containers[{i}])",
            c["name"].as_str().unwrap_or("")
        );
        let asked = self.values(c, &at, &mut found.problems);
        if asked.count == Some(0) && !asked.share() {
            return; // no GPU: nothing to check or default
        }
        let field = |n: &str| {
            let section = if c["resources"]["limits"].get(n).is_some() {
                "limits"
            } else {
                "requests"
            };
            format!("{at}: resources.{section}[{n:?}]")
        };
        self.check_values(asked, &field, &mut found.problems);
        let names = &self.cfg.names;
        if asked.memory.is_some() && asked.percentage.is_some() {
            found.warnings.push(format!(
                "fgpu: pod {}: {at}: both {} and {} are set; {} is used",
                self.key, names.memory, names.memory_percentage, names.memory
            ));
        }
        let defaults = self.defaults(asked, &at, &mut found.warnings);
        for (section, add) in self.additions(c, defaults) {
            add_resources(patch, i, section, &add);
        }
    }

    /// Each managed value of `c`, the limit where both are set; every present value must
    /// be a whole number (a problem otherwise, and the value is left out).
    fn values(&self, c: &Value, at: &str, problems: &mut Vec<String>) -> Asked {
        let mut val: BTreeMap<&str, u64> = BTreeMap::new();
        for section in ["requests", "limits"] {
            let Some(map) = c["resources"][section].as_object() else {
                continue;
            };
            for n in self.managed {
                let Some(v) = map.get(n) else {
                    continue;
                };
                match value_text(v).as_deref().map(fgpu_api::quantity::parse_u64) {
                    Some(Ok(x)) => {
                        val.insert(n, x);
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
        let [gpu, memory, percentage, cores] = self.managed;
        Asked {
            count: val.get(gpu).copied(),
            memory: val.get(memory).copied(),
            percentage: val.get(percentage).copied(),
            cores: val.get(cores).copied(),
        }
    }

    /// Problems of a container's values: a GPU count of 0 with a share or above the
    /// maximum, memory 0 or above the largest GPU, percentage 0 or above 100, cores above
    /// 100. `field` names a resource's field in the container.
    fn check_values(
        &self,
        asked: Asked,
        field: &dyn Fn(&str) -> String,
        problems: &mut Vec<String>,
    ) {
        let names = &self.cfg.names;
        let max_mib = self.inv.max_memory_bytes >> 20;
        match asked.count {
            Some(0) => problems.push(format!(
                "{}: 0 while GPU memory or cores are asked for; ask for 1 or more GPUs",
                field(&names.gpu)
            )),
            Some(n) if n > MAX_GPUS_PER_CONTAINER => problems.push(format!(
                "{}: {n} is above the maximum {MAX_GPUS_PER_CONTAINER}",
                field(&names.gpu)
            )),
            _ => {}
        }
        match asked.memory {
            Some(0) => problems.push(format!(
                "{}: 0; ask for 1 MiB or more, or leave it out for the whole memory",
                field(&names.memory)
            )),
            Some(m) if !self.inv.is_empty() && m > max_mib => problems.push(format!(
                "{}: {m} MiB is more than the largest GPU in the cluster has ({max_mib} MiB, {})",
                field(&names.memory),
                self.inv.max_memory_model
            )),
            Some(m) if m > u64::MAX >> 20 => {
                problems.push(format!("{}: {m} MiB is too large", field(&names.memory)))
            }
            _ => {}
        }
        match asked.percentage {
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
        if let Some(k) = asked.cores.filter(|&k| k > 100) {
            problems.push(format!(
                "{}: {k} is above the maximum 100",
                field(&names.cores)
            ));
        }
    }

    /// The values a container gets where it names none: a GPU count of 1, the configured
    /// default memory (warned when no GPU has that much) and cores.
    fn defaults(&self, asked: Asked, at: &str, warnings: &mut Vec<String>) -> Vec<(&str, String)> {
        let cfg = self.cfg;
        let [gpu, memory, _, cores] = self.managed;
        let max_mib = self.inv.max_memory_bytes >> 20;
        let mut defaults: Vec<(&str, String)> = Vec::new();
        if asked.count.is_none() {
            defaults.push((gpu, "1".into()));
        }
        if asked.memory.is_none() && asked.percentage.is_none() && cfg.default_memory_mib > 0 {
            if !self.inv.is_empty() && cfg.default_memory_mib > max_mib {
                warnings.push(format!(
                    "fgpu: pod {}: {at}: the default memory {} MiB is more than the largest GPU has ({max_mib} MiB); the pod will not fit",
                    self.key, cfg.default_memory_mib
                ));
            }
            defaults.push((memory, cfg.default_memory_mib.to_string()));
        }
        if asked.cores.is_none() && cfg.default_cores > 0 {
            defaults.push((cores, cfg.default_cores.to_string()));
        }
        defaults
    }

    /// What to add to the container's limits and requests. Limits always get the
    /// defaults (the API server requires a limit for an extended resource, and the device
    /// manager reads limits), and our resources set as requests only (the same value as
    /// the limit); requests get the defaults when the container lists our resources there
    /// (as every pod does once the API server has defaulted requests from limits), since
    /// they must equal the limits.
    fn additions<'s>(
        &'s self,
        c: &Value,
        defaults: Vec<(&'s str, String)>,
    ) -> [(&'static str, Vec<(&'s str, String)>); 2] {
        let requests = c["resources"]["requests"].as_object();
        let limits = c["resources"]["limits"].as_object();
        let mut add_limits = defaults.clone();
        for n in self.managed {
            if let Some(v) = requests.and_then(|r| r.get(n))
                && limits.is_none_or(|l| !l.contains_key(n))
                && let Some(t) = value_text(v)
            {
                add_limits.push((n, t));
            }
        }
        let add_requests =
            if requests.is_some_and(|r| self.managed.iter().any(|n| r.contains_key(*n))) {
                defaults
            } else {
                Vec::new()
            };
        [("limits", add_limits), ("requests", add_requests)]
    }

    /// Checks the pod's annotations: policies, GPU models, GPU UUIDs, NUMA binding.
    fn annotations(&self, meta: &Value, found: &mut Findings) {
        policy_problems(meta, &mut found.problems);
        self.gpu_types(meta, found);
        self.gpu_uuids(meta, found);
        if let Some(v) = annotation(meta, ANNOTATION_NUMA_BIND)
            && !matches!(v, "true" | "false" | "")
        {
            found.problems.push(format!(
                "{}: {v:?}; valid are \"true\" and \"false\"",
                at_annotation(ANNOTATION_NUMA_BIND)
            ));
        }
    }

    /// The model names in `use-gputype` / `nouse-gputype`: each must match a known GPU
    /// (warned, not checked, while no node has published its GPUs).
    fn gpu_types(&self, meta: &Value, found: &mut Findings) {
        for a in [
            legacy::ANNOTATION_USE_GPU_TYPE,
            legacy::ANNOTATION_NOUSE_GPU_TYPE,
        ] {
            let Some(v) = annotation(meta, a) else {
                continue;
            };
            if self.inv.is_empty() {
                if !list(v).is_empty() {
                    found.warnings.push(format!(
                        "fgpu: pod {}: {}: no node has published its GPUs yet, so the model names are not checked",
                        self.key,
                        at_annotation(a)
                    ));
                }
                continue;
            }
            let unknown: Vec<&str> = list(v)
                .into_iter()
                .filter(|t| !self.inv.has_model(t))
                .collect();
            if !unknown.is_empty() {
                found.problems.push(format!(
                    "{}: no GPU in the cluster matches {}; known models: {}",
                    at_annotation(a),
                    quoted(&unknown),
                    quoted(&self.inv.models)
                ));
            }
        }
    }

    /// The UUIDs in `use-gpuuuid` / `nouse-gpuuuid`: each must be well formed; those no
    /// known node has, and any exclusion (not supported yet), are warned.
    fn gpu_uuids(&self, meta: &Value, found: &mut Findings) {
        for a in [legacy::ANNOTATION_USE_GPU_UUID, ANNOTATION_NOUSE_GPU_UUID] {
            let Some(v) = annotation(meta, a) else {
                continue;
            };
            let ids = list(v);
            if let Some(problem) = malformed_uuids(a, &ids) {
                found.problems.push(problem);
                continue;
            }
            if a == ANNOTATION_NOUSE_GPU_UUID && !ids.is_empty() {
                found.warnings.push(format!(
                    "fgpu: pod {}: {}: excluding GPUs by UUID is not supported by the extender yet; the pod may get those GPUs (use {} to pin GPUs instead)",
                    self.key,
                    at_annotation(a),
                    legacy::ANNOTATION_USE_GPU_UUID
                ));
            }
            if !self.inv.is_empty() {
                let unknown: Vec<&str> = ids
                    .iter()
                    .copied()
                    .filter(|u| !self.inv.uuids.contains(&u.to_ascii_lowercase()))
                    .collect();
                if !unknown.is_empty() {
                    found.warnings.push(format!(
                        "fgpu: pod {}: {}: no known node has {}",
                        self.key,
                        at_annotation(a),
                        unknown.join(", ")
                    ));
                }
            }
        }
    }

    /// The answer from what was found: refused with every problem, else admitted with the
    /// patch and the warnings (one more while no node has published its GPUs).
    fn decide(&self, mut found: Findings, patch: Vec<Value>) -> Decision {
        if !found.problems.is_empty() {
            return Decision::Deny(format!(
                "fgpu: pod {}: {}",
                self.key,
                found.problems.join("; ")
            ));
        }
        if self.inv.is_empty() {
            found.warnings.push(format!(
                "fgpu: pod {}: no node has published its GPUs yet; the pod stays pending until one does",
                self.key
            ));
        }
        Decision::Allow {
            patch,
            warnings: found.warnings,
        }
    }
}

/// Adds `add` (resource name, value) to `resources.<section>` of container `i`: one
/// operation per entry when the section exists, else one that creates it.
fn add_resources(patch: &mut Patch, i: usize, section: &str, add: &[(&str, String)]) {
    if add.is_empty() {
        return;
    }
    let base = format!("/spec/containers/{i}/resources/{section}");
    let target = &mut patch.pod["spec"]["containers"][i]["resources"][section];
    if target.is_object() {
        for (n, v) in add {
            patch
                .ops
                .push(json!({"op": "add", "path": format!("{base}/{}", token(n)), "value": v}));
            target[*n] = json!(v);
        }
    } else {
        let obj: Map<String, Value> = add
            .iter()
            .map(|(n, v)| ((*n).to_owned(), json!(v)))
            .collect();
        patch
            .ops
            .push(json!({"op": "add", "path": base, "value": obj}));
        *target = Value::Object(obj);
    }
}

/// Problems of the policy annotations (the values `fgpu_driver::hami` reads).
fn policy_problems(meta: &Value, problems: &mut Vec<String>) {
    use fgpu_driver::hami;
    let node = legacy::ANNOTATION_NODE_SCHEDULER_POLICY;
    if let Some(v) = annotation(meta, node)
        && hami::node_policy(v.trim()).is_none()
    {
        let valid = hami::VALID_NODE_POLICIES;
        problems.push(format!("{}: {v:?}; {valid}", at_annotation(node)));
    }
    let gpu = legacy::ANNOTATION_GPU_SCHEDULER_POLICY;
    if let Some(v) = annotation(meta, gpu)
        && hami::gpu_policy(v.trim()).is_none()
    {
        let valid = hami::VALID_GPU_POLICIES;
        problems.push(format!("{}: {v:?}; {valid}", at_annotation(gpu)));
    }
}

/// The problem with the UUIDs of annotation `a` that are not GPU UUIDs, if any.
fn malformed_uuids(a: &str, ids: &[&str]) -> Option<String> {
    let bad: Vec<String> = ids
        .iter()
        .filter(|u| !valid_gpu_uuid(u))
        .map(|u| format!("{u:?}"))
        .collect();
    if bad.is_empty() {
        return None;
    }
    Some(format!(
        "{}: {} not a GPU UUID; write them as NVML does, e.g. GPU-6c8e2f1a-0b3d-4e5f-8a9b-0c1d2e3f4a5b",
        at_annotation(a),
        if bad.len() == 1 {
            format!("{} is", bad[0])
        } else {
            format!("{} are", bad.join(", "))
        }
    ))
}

/// The extender's own reader on the pod as it will be stored: whatever it would refuse
/// at filter time is refused now.
fn extender_check(
    mutated: Value,
    names: &LegacyResourceNames,
    policy: Policy,
) -> Result<(), String> {
    serde_json::from_value::<fgpu_api::extender::Pod>(mutated)
        .map_err(|e| format!("the pod does not decode: {e}"))
        .and_then(|p| {
            fgpu_driver::hami::pod_request(&p, names, policy)
                .map(drop)
                .map_err(|e| format!("{}: {}", e.path, e.problem))
        })
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
                "metadata.annotations[\"hami.io/node-scheduler-policy\"]: \"fastest\"; valid are binpack and spread (HAMi's), gpupacking, bestfit, fgd and fragaware",
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

    #[test]
    fn pod_key_names_namespace_and_name_or_generate_name() {
        let cases = [
            (json!({"name": "p", "namespace": "ns"}), "ns/p"),
            (
                json!({"name": "", "generateName": "job-", "namespace": "ns"}),
                "ns/job-",
            ),
            (json!({"name": "p", "namespace": ""}), "p"),
            (json!({}), "<unnamed>"),
        ];
        for (meta, want) in cases {
            assert_eq!(pod_key(&meta), want, "{meta}");
        }
    }

    #[test]
    fn a_container_asks_for_gpus_in_limits_or_requests() {
        let names = LegacyResourceNames::default();
        let managed = managed_names(&names);
        assert!(asks_for(&ctr("c", json!({"nvidia.com/gpu": 1})), &managed));
        assert!(asks_for(
            &json!({"resources": {"requests": {"nvidia.com/gpucores": "10"}}}),
            &managed
        ));
        assert!(!asks_for(&ctr("c", json!({"cpu": "1"})), &managed));
        assert!(!asks_for(&json!({"name": "c"}), &managed));
    }

    #[test]
    fn values_prefer_limits_and_report_what_is_not_a_number() {
        let cfg = WebhookConfig::default();
        let inv = inventory();
        let ctx = Admission {
            cfg: &cfg,
            inv: &inv,
            managed: managed_names(&cfg.names),
            key: "ns/p".into(),
        };
        let c = json!({"resources": {
            "requests": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "100"},
            "limits": {"nvidia.com/gpumem": "200", "nvidia.com/gpucores": "1.5"},
        }});
        let mut problems = Vec::new();
        let asked = ctx.values(&c, "here", &mut problems);
        assert_eq!(
            asked,
            Asked {
                count: Some(2),
                memory: Some(200),
                percentage: None,
                cores: None,
            }
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("here: resources.limits[\"nvidia.com/gpucores\"]: "),
            "{problems:?}"
        );
        assert!(asked.share());
        assert!(!Asked::default().share());
    }

    #[test]
    fn malformed_uuids_are_listed_in_one_problem() {
        assert_eq!(malformed_uuids("a", &[UUID_A, UUID_B]), None);
        let one = malformed_uuids("a", &["x", UUID_A]).unwrap();
        assert!(
            one.starts_with("metadata.annotations[\"a\"]: \"x\" is not"),
            "{one}"
        );
        let two = malformed_uuids("a", &["x", "y"]).unwrap();
        assert!(two.contains("\"x\", \"y\" are not"), "{two}");
    }

    #[test]
    fn bodies_that_are_not_reviews_say_why() {
        let (cfg, inv) = (WebhookConfig::default(), inventory());
        let cases = [
            (json!([]), ReviewError::NotAnObject),
            (json!({}), ReviewError::NoRequest),
            (json!({"request": {}}), ReviewError::NoUid),
            (
                json!({"request": {"uid": "u", "operation": "CREATE", "object": 1}}),
                ReviewError::NotAPod,
            ),
        ];
        for (body, want) in cases {
            assert_eq!(review(&body, &cfg, &inv), Err(want), "{body}");
        }
        assert_eq!(
            ReviewError::NoUid.to_string(),
            "the AdmissionReview has no request.uid (a string)"
        );
    }
}
