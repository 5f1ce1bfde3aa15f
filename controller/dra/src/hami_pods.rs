//! HAMi pods on a DRA cluster: the webhook `POST /mutate-pods-dra` (with `--hami-pods`)
//! turns a pod that asks for GPUs with HAMi's resources and annotations into one that asks
//! for the same through a ResourceClaimTemplate of the shared class, so that a HAMi
//! manifest runs unchanged where no device plugin serves `nvidia.com/gpu`.
//!
//! Pure: [`translate`] turns a pod into the template and the pod's JSON patch; [`review`]
//! answers an `AdmissionReview` with it. The server creates the template (an existing one
//! of the same name must hold the same spec), then sends the answer. See
//! `docs/controller.md`, "HAMi pods on DRA".
//!
//! The pod's HAMi resources are read by [`fgpu_driver::hami::pod_request`], the reader the
//! legacy extender uses, so both paths accept and refuse the same values. Per container that
//! asks for GPUs, one request of the template, named after the container:
//!
//! * `count` ← `nvidia.com/gpu` (1 when only memory or cores are given);
//! * `nvidia.com/gpumem` (MiB) → the request's `GpuShareConfig.memory` and, in capacity
//!   mode, `capacity.requests.memory`; `nvidia.com/gpucores` → `cores` likewise. Capacity
//!   is what kube-scheduler reads where it allocates; the opaque config is what fgpu's
//!   controller reads (an API server without consumable capacity drops `capacity`);
//! * `nvidia.com/gpumem-percentage` P < 100: the size of the GPU is not known before
//!   placement, so the request becomes `firstAvailable` with one alternative per GPU
//!   memory size this driver's slices publish (at most 8, Kubernetes' limit), each
//!   selecting that size by CEL and asking P % of it (whole MiB). P = 100, and no memory
//!   field: the whole memory;
//! * `nvidia.com/priority`: `0` → `priority: high` (the DeviceClass must allow it), `1`
//!   (HAMi's default) → fgpu's default, `normal`;
//! * CEL selectors over the attributes the kubelet plugin publishes:
//!   `nvidia.com/use-gputype` / `nouse-gputype` (case-blind substrings of `productName`,
//!   as the engine matches them), `nvidia.com/use-gpuuuid` / `nouse-gpuuuid` (`uuid`);
//! * `nvidia.com/numa-bind: "true"` on a multi-GPU request → a `matchAttribute`
//!   constraint on `<driver>/numaNode`.
//!
//! The scheduler-policy annotations (`hami.io/node-scheduler-policy`,
//! `hami.io/gpu-scheduler-policy`) are fgpu's per-pod policy annotations already: the
//! controller reads them from the pod of a claim ([`crate::request`]). They stay on the
//! pod, checked here; where kube-scheduler allocates (capacity mode) they have no effect and
//! the answer warns.
//!
//! The patch removes the HAMi resources from every container's limits and requests, adds
//! `spec.resourceClaims[]` entry [`POD_CLAIM`] naming the template, a `resources.claims[]`
//! entry per GPU container naming its request, and, where fgpu's controller allocates, the
//! scheduling gate (as `/mutate-pods` would: the order of the two webhooks does not matter).
//!
//! The template is named `hami-` and a hash of its spec ([`template_name`]), so identical
//! pods share one template per namespace. A pod that cannot be translated whole (an
//! unknown `nvidia.com/*` resource, `gpumem` and `gpumem-percentage` together, a value the
//! reader refuses, a preset `spec.nodeName`, a pod that already has a claim named
//! [`POD_CLAIM`]) is refused with a message naming the pod, the container and the field.

use std::collections::BTreeSet;

use fgpu_api::config::{CorePercent, GpuShareConfig, Priority};
use fgpu_api::dra::ApiVersion;
use fgpu_api::dra::slice::ResourceSlice;
use fgpu_api::extender::{Container, Pod};
use fgpu_api::names::{DriverName, LegacyResourceNames, attr, capacity, legacy};
use fgpu_api::quantity;
use fgpu_driver::engine::{GpuPolicy, GpuShare, NodePolicy, Policy, Topology};
use fgpu_driver::hami::{self, ContainerRequest, RequestError};
use fgpu_plumbing::admission::{pointer_token, response};
use serde_json::{Value, json};

/// The name of the pod's `spec.resourceClaims[]` entry that the translation adds.
pub const POD_CLAIM: &str = "fgpu-hami";

/// The prefix of the templates' names.
pub const TEMPLATE_PREFIX: &str = "hami-";

/// Kubernetes' limit on the alternatives of one `firstAvailable` request.
pub const MAX_ALTERNATIVES: usize = 8;

/// The label the templates carry: who made them.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "fgpu-controller");

/// The HAMi annotations the translation does not carry over; the answer warns of each.
pub const IGNORED_ANNOTATIONS: [&str; 2] =
    ["nvidia.com/vgpu-mode", "hami.io/device-scoring-weights"];

/// What the translation needs to know of the deployment.
#[derive(Clone, Debug)]
pub struct HamiConfig {
    pub driver: DriverName,
    /// The `resource.k8s.io` version the templates are written in.
    pub api: ApiVersion,
    /// The scheduling gate to add where fgpu's controller allocates; `None` where
    /// kube-scheduler does (capacity mode).
    pub gate: Option<String>,
    /// Write `capacity.requests` (capacity mode: what kube-scheduler reads). Off, the
    /// quota is in the opaque config alone, which the controller reads: an API server
    /// without consumable capacity drops `capacity`, and the stored template would then
    /// differ from the next identical pod's.
    pub capacity: bool,
    /// HAMi's resource names (its defaults unless the deployment renamed them).
    pub names: LegacyResourceNames,
}

impl HamiConfig {
    /// The defaults for `driver`: `resource.k8s.io/v1`, controller mode (the gate, no
    /// capacity requests), HAMi's names.
    pub fn new(driver: DriverName) -> Self {
        Self {
            gate: Some(driver.scheduling_gate()),
            capacity: false,
            driver,
            api: ApiVersion::V1,
            names: LegacyResourceNames::default(),
        }
    }
}

/// A pod translated: the template to create in its namespace and what to answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Translation {
    /// The whole ResourceClaimTemplate object (name, namespace, labels, spec).
    pub template: Value,
    /// The JSON patch of the pod.
    pub patch: Vec<Value>,
    /// Warnings for the client.
    pub warnings: Vec<String>,
}

impl Translation {
    /// The template's name.
    pub fn template_name(&self) -> &str {
        self.template["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
    }
}

/// Whether `review`'s pod asks for a memory percentage below 100 somewhere, so that
/// [`translate`] needs the GPU memory sizes (the server lists slices only then).
pub fn needs_gpu_sizes(review: &Value, names: &LegacyResourceNames) -> bool {
    let containers = &review["request"]["object"]["spec"]["containers"];
    containers.as_array().into_iter().flatten().any(|c| {
        ["limits", "requests"].iter().any(|k| {
            let v = &c["resources"][k][names.memory_percentage.as_str()];
            v.as_str()
                .and_then(|v| fgpu_api::quantity::parse_u64(v).ok())
                .or_else(|| v.as_u64())
                .is_some_and(|p| p < 100)
        })
    })
}

/// The distinct memory sizes (bytes) of `driver`'s devices in `slices`, for
/// [`translate`]'s percentages.
pub fn gpu_sizes(slices: &[ResourceSlice], driver: &DriverName) -> Vec<u64> {
    let sizes: BTreeSet<u64> = slices
        .iter()
        .filter(|s| s.spec.driver.as_deref() == Some(driver.as_str()))
        .flat_map(ResourceSlice::devices)
        .filter_map(|d| {
            crate::inventory::capacity_u64(
                d.body()
                    .capacity
                    .get(capacity::MEMORY)
                    .and_then(|c| c.value.as_ref()),
            )
            .ok()
        })
        .collect();
    sizes.into_iter().collect()
}

/// What the server does with a review of `/mutate-pods-dra`.
#[derive(Clone, Debug, PartialEq)]
pub enum Reviewed {
    /// Send this answer (the pod admitted unchanged, or refused).
    Answer(Value),
    /// Create the template of `translation` (in `namespace`), then send `answer`; if
    /// that fails, send [`refuse`] with why.
    Create {
        namespace: String,
        translation: Translation,
        answer: Value,
    },
}

/// The refusal of `review` with `message`.
pub fn refuse(review: &Value, message: &str) -> Value {
    tracing::info!("denied: {message}");
    response(review, false, Some(message), None, &[])
}

/// Answers an `AdmissionReview` of `/mutate-pods-dra` (any JSON with a `request.uid`):
/// pods other than new ones, and pods that ask for no HAMi GPU, are admitted unchanged; a
/// dry run gets the patch without the template being created.
/// `gpu_sizes`: the memory sizes (bytes) of this driver's GPUs, for memory percentages.
pub fn review(review: &Value, cfg: &HamiConfig, gpu_sizes: &[u64]) -> Reviewed {
    let req = &review["request"];
    let kind = req["kind"]["kind"].as_str().unwrap_or("Pod");
    if req["operation"].as_str() != Some("CREATE") || kind != "Pod" {
        return Reviewed::Answer(response(review, true, None, None, &[]));
    }
    let pod = &req["object"];
    let namespace = req["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .or_else(|| pod["metadata"]["namespace"].as_str())
        .unwrap_or("default")
        .to_owned();
    match translate(pod, &namespace, cfg, gpu_sizes) {
        Ok(None) => Reviewed::Answer(response(review, true, None, None, &[])),
        Ok(Some(t)) => {
            let patch = Value::Array(t.patch.clone());
            let answer = response(review, true, None, Some(&patch), &t.warnings);
            // The webhook is registered `sideEffects: NoneOnDryRun`.
            if req["dryRun"].as_bool() == Some(true) {
                return Reviewed::Answer(answer);
            }
            Reviewed::Create {
                namespace,
                translation: t,
                answer,
            }
        }
        Err(e) => Reviewed::Answer(refuse(review, &format!("fgpu: {e}"))),
    }
}

/// An error about field `path` of the pod `key`.
fn pod_error(key: &str, path: String, problem: String) -> RequestError {
    RequestError {
        object: format!("pod {key}"),
        path,
        problem,
    }
}

/// The HAMi resource names the translation knows.
fn known_resources(names: &LegacyResourceNames) -> [&str; 5] {
    [
        &names.gpu,
        &names.memory,
        &names.memory_percentage,
        &names.cores,
        legacy::RESOURCE_PRIORITY,
    ]
}

/// The domain of HAMi's resources (`nvidia.com/`): a name in it that the translation does
/// not know is refused.
fn resource_domain(names: &LegacyResourceNames) -> &str {
    names
        .gpu
        .find('/')
        .map_or("nvidia.com/", |i| &names.gpu[..=i])
}

/// Refuses, in container `c` (`spec.<list>[index]`), a resource of HAMi's domain that the
/// translation does not know, and `gpumem` beside `gpumem-percentage`.
fn check_container(
    key: &str,
    list: &str,
    index: usize,
    c: &Container,
    names: &LegacyResourceNames,
) -> Result<(), RequestError> {
    let known = known_resources(names);
    let domain = resource_domain(names);
    for (part, map) in [
        ("limits", &c.resources.limits),
        ("requests", &c.resources.requests),
    ] {
        if let Some(unknown) = map
            .keys()
            .find(|k| k.starts_with(domain) && !known.contains(&k.as_str()))
        {
            return Err(pod_error(
                key,
                format!("spec.{list}[{index}].resources.{part}[{unknown:?}]"),
                format!(
                    "container {:?}: not a resource the DRA translation knows; known are {}",
                    c.name,
                    known.join(", ")
                ),
            ));
        }
    }
    if c.resource(&names.memory).is_some() && c.resource(&names.memory_percentage).is_some() {
        return Err(pod_error(
            key,
            format!(
                "spec.{list}[{index}].resources.limits[{:?}]",
                names.memory_percentage
            ),
            format!(
                "container {:?}: given beside {}; ask for one of the two",
                c.name, names.memory
            ),
        ));
    }
    Ok(())
}

/// Container `index`'s `nvidia.com/priority`: `0` → high, `1` → normal, absent → normal.
fn priority(key: &str, index: usize, c: &Container) -> Result<Priority, RequestError> {
    match c.resource(legacy::RESOURCE_PRIORITY).map(str::trim) {
        None | Some("1") => Ok(Priority::Normal),
        Some("0") => Ok(Priority::High),
        Some(other) => Err(pod_error(
            key,
            format!(
                "spec.containers[{index}].resources.limits[{:?}]",
                legacy::RESOURCE_PRIORITY
            ),
            format!(
                "container {:?}: {other:?}; valid are 0 (high) and 1 (HAMi's default)",
                c.name
            ),
        )),
    }
}

/// `s` as a CEL string literal (JSON's escapes are CEL's).
fn cel_string(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// The CEL selectors of one request: the model and UUID lists of the pod.
fn selectors(cr: &ContainerRequest, uuid_exclude: &[String], driver: &DriverName) -> Vec<String> {
    let a = format!("device.attributes[{}]", cel_string(driver.as_str()));
    let model_any = |models: &[String]| {
        models
            .iter()
            .map(|m| {
                format!(
                    "{a}.{}.lowerAscii().contains({})",
                    attr::PRODUCT_NAME,
                    cel_string(&m.to_ascii_lowercase())
                )
            })
            .collect::<Vec<_>>()
            .join(" || ")
    };
    let uuid_in = |uuids: &[String]| {
        let list: Vec<String> = uuids.iter().map(|u| cel_string(u)).collect();
        format!("{a}.{} in [{}]", attr::UUID, list.join(", "))
    };
    let r = &cr.request;
    let mut out = Vec::new();
    if !r.model_include.is_empty() {
        out.push(model_any(&r.model_include));
    }
    if !r.model_exclude.is_empty() {
        out.push(format!("!({})", model_any(&r.model_exclude)));
    }
    if !r.uuid_pin.is_empty() {
        out.push(uuid_in(&r.uuid_pin));
    }
    if !uuid_exclude.is_empty() {
        out.push(format!("!({})", uuid_in(uuid_exclude)));
    }
    out
}

/// The CEL selector of the GPUs of `bytes` memory.
fn size_selector(bytes: u64, driver: &DriverName) -> String {
    format!(
        "device.capacity[{}].{}.compareTo(quantity({})) == 0",
        cel_string(driver.as_str()),
        capacity::MEMORY,
        cel_string(&fgpu_api::quantity::format_u64(bytes))
    )
}

/// One request's (or alternative's) device fields: class, count, selectors, and with
/// `cfg.capacity` the capacity requests.
fn exact(
    cfg: &HamiConfig,
    count: u32,
    selectors: &[String],
    memory: Option<u64>,
    cores: Option<u32>,
) -> Value {
    let class = cfg.driver.shared_class();
    let mut e = json!({
        "deviceClassName": class,
        "allocationMode": "ExactCount",
        "count": count,
    });
    if !selectors.is_empty() {
        e["selectors"] = selectors
            .iter()
            .map(|s| json!({"cel": {"expression": s}}))
            .collect();
    }
    let mut requests = serde_json::Map::new();
    if let Some(m) = memory {
        requests.insert(
            capacity::MEMORY.into(),
            fgpu_api::quantity::format_u64(m).into(),
        );
    }
    if let Some(c) = cores {
        requests.insert(capacity::CORES.into(), c.to_string().into());
    }
    if cfg.capacity && !requests.is_empty() {
        e["capacity"] = json!({"requests": requests});
    }
    e
}

/// The opaque config entry of this driver for `requests`, or `None` when it would say
/// nothing.
fn config_entry(
    requests: &[String],
    memory: Option<u64>,
    cores: Option<u32>,
    priority: Priority,
    driver: &DriverName,
) -> Option<Value> {
    let config = GpuShareConfig {
        memory,
        cores: cores
            .and_then(|c| u8::try_from(c).ok())
            .and_then(CorePercent::new),
        priority,
        ..GpuShareConfig::default()
    };
    (config != GpuShareConfig::default()).then(|| {
        json!({"requests": requests, "opaque": {"driver": driver.as_str(), "parameters": config.to_value()}})
    })
}

/// The memory a request of share `share` asks of each GPU: `Ok(Some(bytes))`, `Ok(None)`
/// for the whole memory, or `Err(percent)` for a percentage below 100.
fn memory_of(share: GpuShare) -> Result<Option<u64>, u32> {
    match share {
        GpuShare::Memory { bytes } => Ok(Some(bytes)),
        GpuShare::Fraction { milli } if milli < 1000 => Err(milli / 10),
        GpuShare::Fraction { .. } | GpuShare::Whole => Ok(None),
    }
}

/// `percent` % of `size` bytes, in whole MiB.
fn percent_of(size: u64, percent: u32) -> u64 {
    let mib = (u128::from(size >> 20) * u128::from(percent) / 100) as u64;
    mib << 20
}

/// The request (and its config entries) for container request `cr`.
struct Built {
    request: Value,
    config: Vec<Value>,
}

/// Builds the template's request for `cr` (container `c`, of the pod `key`).
fn build_request(
    key: &str,
    cr: &ContainerRequest,
    c: &Container,
    uuid_exclude: &[String],
    cfg: &HamiConfig,
    gpu_sizes: &[u64],
) -> Result<Built, RequestError> {
    let name = cr.name.clone();
    let sel = selectors(cr, uuid_exclude, &cfg.driver);
    let prio = priority(key, cr.index, c)?;
    let r = &cr.request;
    match memory_of(r.share) {
        Ok(memory) => Ok(Built {
            request: json!({"name": name, "exactly": exact(cfg, r.gpus, &sel, memory, r.cores)}),
            config: config_entry(
                std::slice::from_ref(&name),
                memory,
                r.cores,
                prio,
                &cfg.driver,
            )
            .into_iter()
            .collect(),
        }),
        Err(percent) => {
            let path = format!(
                "spec.containers[{}].resources.limits[{:?}]",
                cr.index, cfg.names.memory_percentage
            );
            let sizes: BTreeSet<u64> = gpu_sizes.iter().copied().filter(|s| *s > 0).collect();
            if sizes.is_empty() {
                return Err(pod_error(
                    key,
                    path,
                    format!(
                        "container {:?}: {percent} % of a GPU, but no GPU of {} is published, so the percentage cannot be turned into bytes; ask for {} (MiB) instead",
                        cr.name,
                        cfg.driver.as_str(),
                        cfg.names.memory
                    ),
                ));
            }
            if sizes.len() > MAX_ALTERNATIVES {
                return Err(pod_error(
                    key,
                    path,
                    format!(
                        "container {:?}: {percent} % of a GPU, but the cluster's GPUs come in {} memory sizes and a request may list at most {MAX_ALTERNATIVES}; ask for {} (MiB) instead",
                        cr.name,
                        sizes.len(),
                        cfg.names.memory
                    ),
                ));
            }
            let mut subs = Vec::new();
            let mut config = Vec::new();
            for size in sizes {
                let sub = format!("mem-{}mi", size >> 20);
                let mut sel = sel.clone();
                sel.push(size_selector(size, &cfg.driver));
                let memory = Some(percent_of(size, percent));
                let mut e = exact(cfg, r.gpus, &sel, memory, r.cores);
                e["name"] = json!(sub);
                subs.push(e);
                config.extend(config_entry(
                    &[format!("{name}/{sub}")],
                    memory,
                    r.cores,
                    prio,
                    &cfg.driver,
                ));
            }
            Ok(Built {
                request: json!({"name": name, "firstAvailable": subs}),
                config,
            })
        }
    }
}

/// The template's name: [`TEMPLATE_PREFIX`] and 12 hex digits of the FNV-1a hash of its
/// `apiVersion` and spec as JSON text. Stable across releases and machines (unlike std's
/// hasher), so that identical pods meet one template.
pub fn template_name(api_version: &str, spec: &Value) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in api_version
        .bytes()
        .chain([0])
        .chain(spec.to_string().into_bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{TEMPLATE_PREFIX}{:012x}", h >> 16)
}

/// Whether `stored` (a template's spec as the API server returns it) holds what `written`
/// (the spec this translation creates) says: every field written has the same value there;
/// fields the API server added (its defaults) do not matter; arrays keep their length and
/// order; two strings that are equal quantities are the same (the API server writes typed
/// quantities, such as capacity requests, in its canonical form: `3072Mi` comes back as
/// `3Gi`). A field written and missing (dropped by an API server without the feature) or
/// changed (the template edited, or another made under the name) is a difference.
pub fn holds_spec(stored: &Value, written: &Value) -> bool {
    match (stored, written) {
        (Value::Object(s), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| s.get(k).is_some_and(|sv| holds_spec(sv, v))),
        (Value::Array(s), Value::Array(w)) => {
            s.len() == w.len() && s.iter().zip(w).all(|(sv, wv)| holds_spec(sv, wv))
        }
        (Value::String(s), Value::String(w)) => {
            s == w
                || matches!(
                    (quantity::parse_u64(s), quantity::parse_u64(w)),
                    (Ok(a), Ok(b)) if a == b
                )
        }
        _ => stored == written,
    }
}

/// Writes `exactly`'s fields into the request itself, as `resource.k8s.io/v1beta1` has
/// them.
fn flatten_v1beta1(request: &mut Value) {
    if let Some(Value::Object(e)) = request.as_object_mut().and_then(|r| r.remove("exactly"))
        && let Some(r) = request.as_object_mut()
    {
        r.extend(e);
    }
}

/// Translates the pod `pod` (JSON, of namespace `namespace`): `Ok(None)` when it asks for
/// no GPU by HAMi's resources; `Err` names the pod, the field and, for a container's
/// field, the container. `gpu_sizes`: see [`review`].
pub fn translate(
    pod: &Value,
    namespace: &str,
    cfg: &HamiConfig,
    gpu_sizes: &[u64],
) -> Result<Option<Translation>, RequestError> {
    let mut typed: Pod = serde_json::from_value(pod.clone()).map_err(|e| {
        pod_error(
            &crate::object_key(pod),
            "spec".into(),
            format!("not a Pod: {e}"),
        )
    })?;
    if typed.metadata.namespace.is_empty() {
        typed.metadata.namespace = namespace.to_owned();
    }
    if typed.metadata.name.is_empty()
        && let Some(g) = pod["metadata"]["generateName"].as_str()
    {
        typed.metadata.name = format!("{g}<generated>");
    }
    let key = hami::pod_key(&typed);
    // The policy only to check the annotations: the controller reads them from the pod.
    let any_policy = Policy {
        node: NodePolicy::Binpack,
        gpu: GpuPolicy::Spread,
    };
    let read = hami::pod_request(&typed, &cfg.names, any_policy)?;
    if read.containers.is_empty() {
        return Ok(None);
    }
    // Checked only once the pod asks for HAMi GPUs: a pod of another `nvidia.com/`
    // device plugin is none of this webhook's business.
    for (list, containers) in [
        ("containers", &typed.spec.containers),
        ("initContainers", &typed.spec.init_containers),
    ] {
        for (i, c) in containers.iter().enumerate() {
            check_container(&key, list, i, c, &cfg.names)?;
        }
    }
    if pod["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty())
    {
        return Err(pod_error(
            &key,
            "spec.nodeName".into(),
            "preset; a pod that names its node skips the scheduler, and nothing would allocate its GPU claim"
                .into(),
        ));
    }
    if let Some(i) = pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .position(|rc| rc["name"].as_str() == Some(POD_CLAIM))
    {
        return Err(pod_error(
            &key,
            format!("spec.resourceClaims[{i}].name"),
            format!("{POD_CLAIM:?} is the name the HAMi translation gives its claim; rename it"),
        ));
    }
    let uuid_exclude = hami::annotation_list(
        &typed.metadata.annotations,
        legacy::ANNOTATION_NOUSE_GPU_UUID,
    );
    let mut requests = Vec::new();
    let mut config = Vec::new();
    let mut constraints = Vec::new();
    for cr in &read.containers {
        let c = &typed.spec.containers[cr.index];
        let mut built = build_request(&key, cr, c, &uuid_exclude, cfg, gpu_sizes)?;
        if cr.request.topology == Topology::SameNuma {
            constraints.push(json!({
                "requests": [cr.name],
                "matchAttribute": format!("{}/{}", cfg.driver.as_str(), attr::NUMA_NODE),
            }));
        }
        if cfg.api == ApiVersion::V1beta1 {
            flatten_v1beta1(&mut built.request);
        }
        requests.push(built.request);
        config.extend(built.config);
    }
    let mut devices = json!({"requests": requests});
    if !config.is_empty() {
        devices["config"] = Value::Array(config);
    }
    if !constraints.is_empty() {
        devices["constraints"] = Value::Array(constraints);
    }
    let spec = json!({"spec": {"devices": devices}});
    let api_version = cfg.api.api_version();
    let name = template_name(api_version, &spec);
    let template = json!({
        "apiVersion": api_version,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": typed.metadata.namespace,
            "labels": {MANAGED_BY.0: MANAGED_BY.1},
        },
        "spec": spec,
    });
    let patch = pod_patch(pod, &typed, &read.containers, &name, cfg)?;
    Ok(Some(Translation {
        template,
        patch,
        warnings: warnings(&typed, cfg),
    }))
}

/// The pod's JSON patch: HAMi's resources out, the claim in (see the module docs).
fn pod_patch(
    pod: &Value,
    typed: &Pod,
    gpu_containers: &[ContainerRequest],
    template: &str,
    cfg: &HamiConfig,
) -> Result<Vec<Value>, RequestError> {
    let key = hami::pod_key(typed);
    let known = known_resources(&cfg.names);
    let mut patch = Vec::new();
    for (i, c) in typed.spec.containers.iter().enumerate() {
        for (part, map) in [
            ("limits", &c.resources.limits),
            ("requests", &c.resources.requests),
        ] {
            for k in map.keys().filter(|k| known.contains(&k.as_str())) {
                patch.push(json!({
                    "op": "remove",
                    "path": format!("/spec/containers/{i}/resources/{part}/{}", pointer_token(k)),
                }));
            }
        }
    }
    for cr in gpu_containers {
        let i = cr.index;
        let entry = json!({"name": POD_CLAIM, "request": cr.name});
        match pod["spec"]["containers"][i]["resources"]["claims"].as_array() {
            Some(claims) => {
                if let Some(j) = claims
                    .iter()
                    .position(|e| e["name"].as_str() == Some(POD_CLAIM))
                {
                    return Err(pod_error(
                        &key,
                        format!("spec.containers[{i}].resources.claims[{j}].name"),
                        format!(
                            "container {:?}: {POD_CLAIM:?} is the name the HAMi translation gives its claim; rename it",
                            cr.name
                        ),
                    ));
                }
                patch.push(json!({"op": "add", "path": format!("/spec/containers/{i}/resources/claims/-"), "value": entry}));
            }
            None => patch.push(json!({"op": "add", "path": format!("/spec/containers/{i}/resources/claims"), "value": [entry]})),
        }
    }
    let claim = json!({"name": POD_CLAIM, "resourceClaimTemplateName": template});
    if pod["spec"]["resourceClaims"].is_array() {
        patch.push(json!({"op": "add", "path": "/spec/resourceClaims/-", "value": claim}));
    } else {
        patch.push(json!({"op": "add", "path": "/spec/resourceClaims", "value": [claim]}));
    }
    if let Some(gate) = &cfg.gate
        && let Some(Value::Array(ops)) = crate::admission::gate_patch(pod, gate)
    {
        patch.extend(ops);
    }
    Ok(patch)
}

/// Warnings for what the translation leaves without effect.
fn warnings(pod: &Pod, cfg: &HamiConfig) -> Vec<String> {
    let key = hami::pod_key(pod);
    let ann = &pod.metadata.annotations;
    let mut out = Vec::new();
    if cfg.gate.is_none() {
        for a in [
            legacy::ANNOTATION_NODE_SCHEDULER_POLICY,
            legacy::ANNOTATION_GPU_SCHEDULER_POLICY,
        ] {
            if ann.contains_key(a) {
                out.push(format!(
                    "fgpu: pod {key}: metadata.annotations[{a:?}] has no effect: kube-scheduler allocates the shares here (capacity mode)"
                ));
            }
        }
    }
    for a in IGNORED_ANNOTATIONS {
        if ann.contains_key(a) {
            out.push(format!(
                "fgpu: pod {key}: metadata.annotations[{a:?}] is not translated to DRA and has no effect"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests;
