//! A pod's HAMi-style resources and annotations → one engine [`Request`] per container
//! that asks for GPUs, and the pod's [`Policy`].
//!
//! Per container (limits, else requests; all per GPU):
//!
//! * `nvidia.com/gpu`: number of GPUs (1 when absent but memory or cores are asked for);
//! * `nvidia.com/gpumem`: MiB → [`GpuShare::Memory`]; wins over the percentage;
//! * `nvidia.com/gpumem-percentage`: 1–100 → [`GpuShare::Fraction`];
//! * `nvidia.com/gpucores`: percent of the SMs, 0–100;
//! * none of the memory fields: with cores, the whole memory and those cores
//!   (`Fraction { milli: 1000 }`); without, whole GPUs ([`GpuShare::Whole`]).
//!
//! Pod annotations ([`pod_annotations`], which the DRA controller applies to the claims of
//! a pod as well, so both paths give them one meaning): the model include/exclude lists
//! (`nvidia.com/use-gputype`, `nvidia.com/nouse-gputype`), the UUID pin
//! (`nvidia.com/use-gpuuuid`), comma-separated, and the two HAMi policy annotations
//! (`hami.io/node-scheduler-policy`: HAMi's `binpack` or `spread`, or fgpu's `gpupacking`,
//! `bestfit`, `fgd` or `fragaware`; `hami.io/gpu-scheduler-policy`: `binpack` or `spread`)
//! replacing the node and GPU level of the default policy. `nvidia.com/numa-bind: "true"`
//! puts every GPU of a multi-GPU container on one NUMA node.
//!
//! Pure functions of the pod: no I/O, no Kubernetes client.

use std::collections::BTreeMap;

use fgpu_api::extender::{Container, Pod};
use fgpu_api::names::{LegacyResourceNames, legacy};

use crate::engine::{GpuPolicy, GpuShare, NodePolicy, Policy, Request, Topology};

/// Why a pod (or a claim) cannot be turned into an engine request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {path}: {problem}")]
pub struct RequestError {
    /// `claim ns/name` or `pod ns/name`.
    pub object: String,
    /// Field path in that object.
    pub path: String,
    /// What is wrong and what is valid.
    pub problem: String,
}

/// What a pod's annotations say about placement: GPU constraints and the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAnnotations {
    /// `nvidia.com/use-gputype`: only GPUs whose model contains one of these.
    pub model_include: Vec<String>,
    /// `nvidia.com/nouse-gputype`: no GPU whose model contains one of these.
    pub model_exclude: Vec<String>,
    /// `nvidia.com/use-gpuuuid`: only these GPUs.
    pub uuid_pin: Vec<String>,
    /// The default policy with the two HAMi policy annotations applied.
    pub policy: Policy,
    /// `nvidia.com/vgpu-mode`: shares, MIG instances or either.
    pub vgpu_mode: VgpuMode,
}

/// What HAMi's `nvidia.com/vgpu-mode` asks: which kind of device the pod's containers may
/// get on the legacy path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VgpuMode {
    /// No annotation: a quota share, else a MIG placement where no shared GPU fits.
    #[default]
    Any,
    /// `mig`: MIG placements only.
    Mig,
    /// `hami-core`, or any other value: quota shares only, never a MIG instance.
    Shares,
}

impl VgpuMode {
    /// The mode the annotation's value `v` names: `mig` (any case) is [`VgpuMode::Mig`],
    /// anything else [`VgpuMode::Shares`], as HAMi treats a value that is not `mig`.
    pub fn parse(v: &str) -> Self {
        if v.trim().eq_ignore_ascii_case("mig") {
            Self::Mig
        } else {
            Self::Shares
        }
    }

    /// Whether quota shares (and whole GPUs) are allowed.
    pub fn shares(self) -> bool {
        self != Self::Mig
    }

    /// Whether MIG placements are allowed.
    pub fn mig(self) -> bool {
        self != Self::Shares
    }
}

impl PodAnnotations {
    /// Puts the GPU constraints on `request`.
    pub fn constrain(&self, request: &mut Request) {
        request.model_include = self.model_include.clone();
        request.model_exclude = self.model_exclude.clone();
        request.uuid_pin = self.uuid_pin.clone();
    }
}

/// What `hami.io/node-scheduler-policy` may say, for errors.
pub const VALID_NODE_POLICIES: &str =
    "valid are binpack and spread (HAMi's), gpupacking, bestfit, fgd and fragaware";
/// What `hami.io/gpu-scheduler-policy` may say, for errors.
pub const VALID_GPU_POLICIES: &str = "valid are binpack and spread";

/// The node level `hami.io/node-scheduler-policy` names: HAMi's two, and fgpu's other
/// node-level policies; `None` for anything else.
pub fn node_policy(v: &str) -> Option<NodePolicy> {
    if v.contains('/') {
        return None;
    }
    format!("{v}/binpack")
        .parse::<Policy>()
        .ok()
        .map(|p| p.node)
}

/// The GPU level `hami.io/gpu-scheduler-policy` names (`binpack`, `spread`).
pub fn gpu_policy(v: &str) -> Option<GpuPolicy> {
    match v {
        "binpack" => Some(GpuPolicy::Binpack),
        "spread" => Some(GpuPolicy::Spread),
        _ => None,
    }
}

/// The comma-separated list in annotation `name`, items trimmed, empty ones dropped (empty
/// when the annotation is absent).
pub fn annotation_list(annotations: &BTreeMap<String, String>, name: &str) -> Vec<String> {
    annotations.get(name).map_or_else(Vec::new, |v| {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

/// Reads the placement annotations of the pod `pod_key`; `default_policy` applies where
/// they say nothing. Errors name the annotation and say what is valid.
pub fn pod_annotations(
    annotations: &BTreeMap<String, String>,
    pod_key: &str,
    default_policy: Policy,
) -> Result<PodAnnotations, RequestError> {
    let err = |ann: &str, problem: String| RequestError {
        object: format!("pod {pod_key}"),
        path: format!("metadata.annotations[{ann:?}]"),
        problem,
    };
    let list = |ann: &str| annotation_list(annotations, ann);
    let mut policy = default_policy;
    if let Some(v) = annotations.get(legacy::ANNOTATION_NODE_SCHEDULER_POLICY) {
        let other = v.trim();
        policy.node = node_policy(other).ok_or_else(|| {
            err(
                legacy::ANNOTATION_NODE_SCHEDULER_POLICY,
                format!("{other:?}; {VALID_NODE_POLICIES}"),
            )
        })?;
    }
    if let Some(v) = annotations.get(legacy::ANNOTATION_GPU_SCHEDULER_POLICY) {
        let other = v.trim();
        policy.gpu = gpu_policy(other).ok_or_else(|| {
            err(
                legacy::ANNOTATION_GPU_SCHEDULER_POLICY,
                format!("{other:?}; {VALID_GPU_POLICIES}"),
            )
        })?;
    }
    Ok(PodAnnotations {
        model_include: list(legacy::ANNOTATION_USE_GPU_TYPE),
        model_exclude: list(legacy::ANNOTATION_NOUSE_GPU_TYPE),
        uuid_pin: list(legacy::ANNOTATION_USE_GPU_UUID),
        policy,
        vgpu_mode: annotations
            .get(legacy::ANNOTATION_VGPU_MODE)
            .map_or(VgpuMode::Any, |v| VgpuMode::parse(v)),
    })
}

/// Pod annotation (HAMi): all GPUs of a container on one NUMA node.
pub const ANNOTATION_NUMA_BIND: &str = "nvidia.com/numa-bind";

/// Largest GPU count one container may ask for.
pub const MAX_GPUS_PER_CONTAINER: u64 = 32;

/// One container's GPU request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRequest {
    /// Index in `spec.containers`.
    pub index: usize,
    pub name: String,
    pub request: Request,
}

/// What a pod asks of the extender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRequest {
    /// `namespace/name`.
    pub key: String,
    pub uid: String,
    /// Containers asking for GPUs; empty when the pod asks for none.
    pub containers: Vec<ContainerRequest>,
    pub policy: Policy,
    /// `nvidia.com/vgpu-mode`: which kind of device the containers may get.
    pub vgpu_mode: VgpuMode,
}

/// `namespace/name` of a pod.
pub fn pod_key(pod: &Pod) -> String {
    let m = &pod.metadata;
    if m.namespace.is_empty() {
        m.name.clone()
    } else {
        format!("{}/{}", m.namespace, m.name)
    }
}

/// Reads `pod`'s GPU requests; `default_policy` applies where its annotations say nothing.
pub fn pod_request(
    pod: &Pod,
    names: &LegacyResourceNames,
    default_policy: Policy,
) -> Result<PodRequest, RequestError> {
    let key = pod_key(pod);
    check_init_containers(&key, &pod.spec.init_containers, names)?;
    let placement = pod_annotations(&pod.metadata.annotations, &key, default_policy)?;
    let numa_bind = numa_bind(&key, &pod.metadata.annotations)?;
    let mut containers = Vec::new();
    for (index, c) in pod.spec.containers.iter().enumerate() {
        let Some(mut request) = container_request(&key, index, c, names)? else {
            continue;
        };
        placement.constrain(&mut request);
        if numa_bind && request.gpus > 1 {
            request.topology = Topology::SameNuma;
        }
        containers.push(ContainerRequest {
            index,
            name: c.name.clone(),
            request,
        });
    }
    Ok(PodRequest {
        key,
        uid: pod.metadata.uid.clone(),
        containers,
        policy: placement.policy,
        vgpu_mode: placement.vgpu_mode,
    })
}

/// An error about field `path` of the pod `key`.
fn pod_error(key: &str, path: String, problem: String) -> RequestError {
    RequestError {
        object: format!("pod {key}"),
        path,
        problem,
    }
}

/// Whether container `c` asks for any of the GPU resources `names`.
fn asks_for_gpus(c: &Container, names: &LegacyResourceNames) -> bool {
    [
        &names.gpu,
        &names.memory,
        &names.memory_percentage,
        &names.cores,
    ]
    .iter()
    .any(|n| c.resource(n).is_some())
}

/// Refuses an init container of the pod `key` that asks for GPUs (the extender places GPUs
/// for regular containers only).
fn check_init_containers(
    key: &str,
    init_containers: &[Container],
    names: &LegacyResourceNames,
) -> Result<(), RequestError> {
    match init_containers
        .iter()
        .enumerate()
        .find(|(_, c)| asks_for_gpus(c, names))
    {
        Some((i, c)) => Err(pod_error(
            key,
            format!("spec.initContainers[{i}].resources"),
            format!(
                "init container {:?} asks for GPUs; the extender places GPUs for regular containers only",
                c.name
            ),
        )),
        None => Ok(()),
    }
}

/// The pod's [`ANNOTATION_NUMA_BIND`]: `true`, or `false` (also when absent or empty).
fn numa_bind(key: &str, annotations: &BTreeMap<String, String>) -> Result<bool, RequestError> {
    match annotations.get(ANNOTATION_NUMA_BIND).map(|v| v.trim()) {
        None | Some("false" | "") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(pod_error(
            key,
            format!("metadata.annotations[{ANNOTATION_NUMA_BIND:?}]"),
            format!("{other:?}; valid are \"true\" and \"false\""),
        )),
    }
}

/// The field path of container `index`'s limit of `resource`.
fn limit_path(index: usize, resource: &str) -> String {
    format!("spec.containers[{index}].resources.limits[{resource:?}]")
}

/// Container `index`'s whole-number amount of `resource` (limits, else requests), at most
/// `max`; `None` when it does not ask for it.
fn amount(
    key: &str,
    index: usize,
    c: &Container,
    resource: &str,
    max: u64,
) -> Result<Option<u64>, RequestError> {
    let Some(text) = c.resource(resource) else {
        return Ok(None);
    };
    let path = limit_path(index, resource);
    let n = fgpu_api::quantity::parse_u64(text)
        .map_err(|e| pod_error(key, path.clone(), format!("{e}; use a whole number")))?;
    if n > max {
        return Err(pod_error(
            key,
            path,
            format!("{n} is above the maximum {max}"),
        ));
    }
    Ok(Some(n))
}

/// Container `index`'s engine request, before the pod's annotations are applied; `None`
/// when it asks for no GPU (nothing asked, or a count of 0 alone).
fn container_request(
    key: &str,
    index: usize,
    c: &Container,
    names: &LegacyResourceNames,
) -> Result<Option<Request>, RequestError> {
    if !asks_for_gpus(c, names) {
        return Ok(None);
    }
    let count = amount(key, index, c, &names.gpu, MAX_GPUS_PER_CONTAINER)?;
    let mem_mib = amount(key, index, c, &names.memory, u64::MAX >> 20)?;
    let pct = amount(key, index, c, &names.memory_percentage, 100)?;
    let cores = amount(key, index, c, &names.cores, 100)?;
    let gpus = match count {
        Some(0) => {
            if mem_mib.is_some() || pct.is_some() || cores.is_some() {
                return Err(pod_error(
                    key,
                    limit_path(index, &names.gpu),
                    "0 while GPU memory or cores are asked for; ask for 1 or more GPUs".into(),
                ));
            }
            return Ok(None);
        }
        Some(n) => n as u32,
        None => 1,
    };
    let share = gpu_share(key, index, names, mem_mib, pct, cores.is_some())?;
    let mut request = Request::new(gpus, share);
    request.cores = cores.map(|c| c as u32);
    Ok(Some(request))
}

/// The share of each GPU of container `index`: its memory in MiB wins over its memory
/// percentage; with neither, the whole memory and, when cores are asked for, a fraction
/// of 1000 (so the cores count), else whole GPUs.
fn gpu_share(
    key: &str,
    index: usize,
    names: &LegacyResourceNames,
    mem_mib: Option<u64>,
    pct: Option<u64>,
    cores: bool,
) -> Result<GpuShare, RequestError> {
    Ok(match (mem_mib, pct) {
        (Some(0), _) => {
            return Err(pod_error(
                key,
                limit_path(index, &names.memory),
                "0; ask for 1 MiB or more, or leave it out for the whole memory".into(),
            ));
        }
        (Some(mib), _) => GpuShare::Memory { bytes: mib << 20 },
        (None, Some(0)) => {
            return Err(pod_error(
                key,
                limit_path(index, &names.memory_percentage),
                "0; use 1 to 100".into(),
            ));
        }
        (None, Some(p)) => GpuShare::Fraction {
            milli: (p * 10) as u32,
        },
        (None, None) if cores => GpuShare::Fraction { milli: 1000 },
        (None, None) => GpuShare::Whole,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{GpuPolicy, NodePolicy};
    use serde_json::{Value, json};

    const HAMI_DEFAULT: Policy = Policy {
        node: NodePolicy::Binpack,
        gpu: GpuPolicy::Spread,
    };

    fn pod(annotations: Value, containers: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": annotations},
            "spec": {"containers": containers}
        }))
        .unwrap()
    }

    fn ctr(name: &str, limits: Value) -> Value {
        json!({"name": name, "image": "x", "resources": {"limits": limits}})
    }

    fn read(p: &Pod) -> Result<PodRequest, RequestError> {
        pod_request(p, &LegacyResourceNames::default(), HAMI_DEFAULT)
    }

    fn container(limits: Value) -> Container {
        serde_json::from_value(ctr("c", limits)).unwrap()
    }

    #[test]
    fn a_container_asks_for_gpus_by_any_of_the_four_names() {
        let names = LegacyResourceNames::default();
        assert!(!asks_for_gpus(&container(json!({"cpu": "1"})), &names));
        for n in [
            "nvidia.com/gpu",
            "nvidia.com/gpumem",
            "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores",
        ] {
            assert!(asks_for_gpus(&container(json!({n: "1"})), &names), "{n}");
        }
        let init = [
            container(json!({})),
            container(json!({"nvidia.com/gpu": "1"})),
        ];
        let e = check_init_containers("ns/p", &init, &names).unwrap_err();
        assert_eq!(e.path, "spec.initContainers[1].resources");
        assert!(check_init_containers("ns/p", &init[..1], &names).is_ok());
    }

    #[test]
    fn numa_bind_is_true_or_false() {
        let ann = |v: Option<&str>| -> BTreeMap<String, String> {
            v.map(|v| (ANNOTATION_NUMA_BIND.to_owned(), v.to_owned()))
                .into_iter()
                .collect()
        };
        assert_eq!(numa_bind("ns/p", &ann(None)), Ok(false));
        assert_eq!(numa_bind("ns/p", &ann(Some(" true "))), Ok(true));
        assert_eq!(numa_bind("ns/p", &ann(Some(""))), Ok(false));
        let e = numa_bind("ns/p", &ann(Some("yes"))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod ns/p: metadata.annotations[\"nvidia.com/numa-bind\"]: \"yes\"; valid are \"true\" and \"false\""
        );
    }

    #[test]
    fn amounts_are_whole_numbers_up_to_a_maximum() {
        let c = container(json!({"nvidia.com/gpu": "3", "nvidia.com/gpucores": "1.5"}));
        assert_eq!(amount("ns/p", 0, &c, "nvidia.com/gpu", 4), Ok(Some(3)));
        assert_eq!(amount("ns/p", 0, &c, "nvidia.com/gpumem", 4), Ok(None));
        let e = amount("ns/p", 2, &c, "nvidia.com/gpu", 2).unwrap_err();
        assert_eq!(
            e.path,
            "spec.containers[2].resources.limits[\"nvidia.com/gpu\"]"
        );
        assert_eq!(e.problem, "3 is above the maximum 2");
        let e = amount("ns/p", 0, &c, "nvidia.com/gpucores", 100).unwrap_err();
        assert!(e.problem.ends_with("; use a whole number"), "{e}");
    }

    #[test]
    fn the_share_of_each_gpu() {
        let names = LegacyResourceNames::default();
        let share = |mem, pct, cores| gpu_share("ns/p", 0, &names, mem, pct, cores);
        assert_eq!(
            share(Some(2), Some(50), false),
            Ok(GpuShare::Memory { bytes: 2 << 20 })
        );
        assert_eq!(
            share(None, Some(25), true),
            Ok(GpuShare::Fraction { milli: 250 })
        );
        assert_eq!(
            share(None, None, true),
            Ok(GpuShare::Fraction { milli: 1000 })
        );
        assert_eq!(share(None, None, false), Ok(GpuShare::Whole));
        assert!(share(Some(0), None, false).is_err());
        assert_eq!(
            share(None, Some(0), false).unwrap_err().problem,
            "0; use 1 to 100"
        );
    }

    #[test]
    fn a_container_request_before_the_annotations() {
        let names = LegacyResourceNames::default();
        let req = |limits| container_request("ns/p", 0, &container(limits), &names);
        assert_eq!(req(json!({"cpu": "1"})), Ok(None));
        assert_eq!(req(json!({"nvidia.com/gpu": "0"})), Ok(None));
        assert!(req(json!({"nvidia.com/gpu": "0", "nvidia.com/gpucores": "5"})).is_err());
        let r = req(json!({"nvidia.com/gpucores": "30"})).unwrap().unwrap();
        assert_eq!((r.gpus, r.cores), (1, Some(30)));
        assert_eq!(r.share, GpuShare::Fraction { milli: 1000 });
        assert_eq!(r.topology, Topology::Any);
    }

    #[test]
    fn resources_table() {
        let gib = 1u64 << 30;
        let cases: Vec<(&str, Value, u32, GpuShare, Option<u32>)> = vec![
            (
                "hami example",
                json!({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}),
                1,
                GpuShare::Memory { bytes: 3000 << 20 },
                Some(30),
            ),
            (
                "two GPUs by percent",
                json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50"}),
                2,
                GpuShare::Fraction { milli: 500 },
                None,
            ),
            (
                "memory wins over percent",
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpumem-percentage": "50"}),
                1,
                GpuShare::Memory { bytes: gib },
                None,
            ),
            (
                "whole GPU",
                json!({"nvidia.com/gpu": "1"}),
                1,
                GpuShare::Whole,
                None,
            ),
            (
                "cores only",
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "20"}),
                1,
                GpuShare::Fraction { milli: 1000 },
                Some(20),
            ),
            (
                "memory without count",
                json!({"nvidia.com/gpumem": "2048"}),
                1,
                GpuShare::Memory { bytes: 2 * gib },
                None,
            ),
        ];
        for (what, limits, gpus, share, cores) in cases {
            let r = read(&pod(json!({}), json!([ctr("main", limits)])))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(r.containers.len(), 1, "{what}");
            let c = &r.containers[0];
            assert_eq!(
                (c.request.gpus, c.request.share, c.request.cores),
                (gpus, share, cores),
                "{what}"
            );
            assert_eq!(r.policy, HAMI_DEFAULT);
            assert_eq!((r.key.as_str(), r.uid.as_str()), ("ns/p", "u1"));
        }
    }

    #[test]
    fn multi_container_and_annotations() {
        let p = pod(
            json!({
                "nvidia.com/use-gputype": "A100,H100",
                "nvidia.com/nouse-gputype": "T4",
                "nvidia.com/use-gpuuuid": "GPU-1,GPU-2",
                "hami.io/node-scheduler-policy": "spread",
                "hami.io/gpu-scheduler-policy": "binpack",
                "nvidia.com/numa-bind": "true"
            }),
            json!([
                ctr(
                    "a",
                    json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"})
                ),
                ctr("sidecar", json!({"cpu": "1"})),
                ctr(
                    "b",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"})
                ),
            ]),
        );
        let r = read(&p).unwrap();
        assert_eq!(
            r.policy,
            Policy {
                node: NodePolicy::Spread,
                gpu: GpuPolicy::Binpack
            }
        );
        let names: Vec<_> = r
            .containers
            .iter()
            .map(|c| (c.index, c.name.as_str()))
            .collect();
        assert_eq!(names, [(0, "a"), (2, "b")]);
        let a = &r.containers[0].request;
        assert_eq!(a.model_include, ["A100", "H100"]);
        assert_eq!(a.model_exclude, ["T4"]);
        assert_eq!(a.uuid_pin, ["GPU-1", "GPU-2"]);
        assert_eq!(a.topology, Topology::SameNuma);
        // One GPU needs no NUMA constraint (and GPUs of unknown NUMA still qualify).
        assert_eq!(r.containers[1].request.topology, Topology::Any);
        // A pod without GPU resources asks for nothing.
        let none = read(&pod(json!({}), json!([ctr("c", json!({"cpu": "1"}))]))).unwrap();
        assert!(none.containers.is_empty());
    }

    #[test]
    fn the_node_policy_annotation_takes_every_node_policy() {
        for (value, node) in [
            ("binpack", NodePolicy::Binpack),
            ("spread", NodePolicy::Spread),
            ("gpupacking", NodePolicy::GpuPacking),
            ("bestfit", NodePolicy::BestFit),
            ("fgd", NodePolicy::Fgd),
            (" fragaware ", NodePolicy::FragAware),
        ] {
            let ann =
                BTreeMap::from([("hami.io/node-scheduler-policy".to_owned(), value.to_owned())]);
            let got = pod_annotations(&ann, "ns/p", Policy::SPREAD)
                .unwrap()
                .policy;
            // The GPU level stays the default's.
            assert_eq!(
                got,
                Policy {
                    node,
                    gpu: GpuPolicy::Spread
                },
                "{value}"
            );
        }
    }

    #[test]
    fn errors_name_pod_and_field() {
        let cases: Vec<(Value, Value, &str, &str)> = vec![
            (
                json!({"hami.io/node-scheduler-policy": "fastest"}),
                json!([ctr("c", json!({"nvidia.com/gpu": "1"}))]),
                "metadata.annotations[\"hami.io/node-scheduler-policy\"]",
                "\"fastest\"; valid are binpack and spread (HAMi's), gpupacking, bestfit, fgd and fragaware",
            ),
            (
                json!({"hami.io/node-scheduler-policy": "fgd/spread"}),
                json!([ctr("c", json!({"nvidia.com/gpu": "1"}))]),
                "metadata.annotations[\"hami.io/node-scheduler-policy\"]",
                "\"fgd/spread\"; valid are",
            ),
            (
                json!({"nvidia.com/numa-bind": "yes"}),
                json!([ctr("c", json!({"nvidia.com/gpu": "1"}))]),
                "metadata.annotations[\"nvidia.com/numa-bind\"]",
                "valid are",
            ),
            (
                json!({}),
                json!([ctr(
                    "c",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "140"})
                )]),
                "spec.containers[0].resources.limits[\"nvidia.com/gpucores\"]",
                "140 is above the maximum 100",
            ),
            (
                json!({}),
                json!([ctr(
                    "c",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "lots"})
                )]),
                "spec.containers[0].resources.limits[\"nvidia.com/gpumem\"]",
                "use a whole number",
            ),
            (
                json!({}),
                json!([ctr(
                    "c",
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"})
                )]),
                "spec.containers[0].resources.limits[\"nvidia.com/gpumem-percentage\"]",
                "0; use 1 to 100",
            ),
            (
                json!({}),
                json!([ctr(
                    "c",
                    json!({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "10"})
                )]),
                "spec.containers[0].resources.limits[\"nvidia.com/gpu\"]",
                "ask for 1 or more GPUs",
            ),
        ];
        for (ann, ctrs, path, problem) in cases {
            let e = read(&pod(ann, ctrs)).unwrap_err();
            assert_eq!(e.object, "pod ns/p");
            assert_eq!(e.path, path);
            assert!(e.problem.contains(problem), "{e}");
        }
        let init: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [], "initContainers": [ctr("i", json!({"nvidia.com/gpu": "1"}))]}
        }))
        .unwrap();
        assert_eq!(
            read(&init).unwrap_err().path,
            "spec.initContainers[0].resources"
        );
    }

    #[test]
    fn vgpu_mode_annotation() {
        let read = |ann: &[(&str, &str)]| {
            let a: BTreeMap<String, String> = ann
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            pod_annotations(&a, "ns/p", Policy::SPREAD)
                .unwrap()
                .vgpu_mode
        };
        assert_eq!(read(&[]), VgpuMode::Any);
        assert_eq!(read(&[("nvidia.com/vgpu-mode", "mig")]), VgpuMode::Mig);
        assert_eq!(read(&[("nvidia.com/vgpu-mode", " MIG ")]), VgpuMode::Mig);
        assert_eq!(
            read(&[("nvidia.com/vgpu-mode", "hami-core")]),
            VgpuMode::Shares
        );
        assert_eq!(read(&[("nvidia.com/vgpu-mode", "mps")]), VgpuMode::Shares);
        assert!(VgpuMode::Mig.mig() && !VgpuMode::Mig.shares());
        assert!(!VgpuMode::Shares.mig() && VgpuMode::Shares.shares());
        assert!(VgpuMode::Any.mig() && VgpuMode::Any.shares());
    }
}
