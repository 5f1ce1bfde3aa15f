//! Volcano's vGPU device sharing (its `deviceshare` plugin with `deviceshare.VGPUEnable`),
//! as fgpu's device plugin speaks it: the names, the node's register format and the pod's
//! allocation format, read from Volcano v1.14.1's scheduler
//! (`pkg/scheduler/api/devices/nvidia/vgpu/` and `pkg/scheduler/api/devices/config/`).
//!
//! * Node, written by the device plugin, read by the scheduler:
//!   [`REGISTER_ANNOTATION`], one entry per GPU, each `uuid,count,memoryMiB,type,healthy,mode`
//!   followed by `:` ([`render_register`], [`parse_register`]); and
//!   [`HANDSHAKE_ANNOTATION`], which the plugin keeps at `Reported_<time>` while it runs.
//! * Pod, written by the scheduler when it places the pod, read by the device plugin:
//!   [`POD_DEVICES_ANNOTATION`], the devices of each container that asks for vGPUs, in
//!   `spec.containers` order, containers separated by `;`, each device `uuid,type,memoryMiB,cores`
//!   followed by `:` ([`parse_pod_devices`], [`render_pod_devices`]).
//!
//! Everything here is pure and never panics on any input: a malformed value is an error
//! that names the object, the annotation and the field.

use std::fmt::Write as _;

pub use crate::assignment::{NodeAnnotationError, PodAnnotationError};

/// Node annotation: the GPUs the node offers ([`render_register`]).
pub const REGISTER_ANNOTATION: &str = "volcano.sh/node-vgpu-register";
/// Node annotation: the liveness handshake. The scheduler writes `Requesting_<time>` when it
/// sees anything else, and drops the node (writing `Deleted_<time>`) when its own request is
/// older than 60 s; the plugin answers with [`HANDSHAKE_REPORTED`]`<time>`.
pub const HANDSHAKE_ANNOTATION: &str = "volcano.sh/node-vgpu-handshake";
/// The prefix of the plugin's handshake value.
pub const HANDSHAKE_REPORTED: &str = "Reported_";
/// The time layout of the handshake values (Go's `2006.01.02 15:04:05`), as a strftime
/// pattern.
pub const HANDSHAKE_TIME_FORMAT: &str = "%Y.%m.%d %H:%M:%S";
/// How often the plugin writes the handshake: well inside the scheduler's 60 s.
pub const HANDSHAKE_INTERVAL_SECS: u64 = 20;

/// Pod annotation: the devices the scheduler chose, per vGPU container.
pub const POD_DEVICES_ANNOTATION: &str = "volcano.sh/vgpu-ids-new";
/// Pod annotation: a copy of [`POD_DEVICES_ANNOTATION`] written at the same time (HAMi's
/// device plugins consume it container by container; fgpu keeps its own record instead).
pub const POD_TO_ALLOCATE_ANNOTATION: &str = "volcano.sh/devices-to-allocate";
/// Pod annotation: the node the scheduler chose.
pub const POD_NODE_ANNOTATION: &str = "volcano.sh/vgpu-node";
/// Pod annotation: the bind phase; the scheduler writes [`BIND_PHASE_ALLOCATING`].
pub const BIND_PHASE_ANNOTATION: &str = "volcano.sh/bind-phase";
/// The bind phase the scheduler writes.
pub const BIND_PHASE_ALLOCATING: &str = "allocating";
/// The bind phase the plugin writes once every vGPU container of the pod is allocated.
pub const BIND_PHASE_SUCCESS: &str = "success";
/// The bind phase the plugin writes when it refuses the pod's allocation.
pub const BIND_PHASE_FAILED: &str = "failed";

/// Resource: vGPUs (the device plugin's registered resource).
pub const RESOURCE_NUMBER: &str = "volcano.sh/vgpu-number";
/// Resource: device memory in MiB per vGPU.
pub const RESOURCE_MEMORY: &str = "volcano.sh/vgpu-memory";
/// Resource: device memory in percent of the GPU per vGPU.
pub const RESOURCE_MEMORY_PERCENTAGE: &str = "volcano.sh/vgpu-memory-percentage";
/// Resource: compute in percent of the GPU per vGPU (0: no limit).
pub const RESOURCE_CORES: &str = "volcano.sh/vgpu-cores";

/// The sharing mode of a registered GPU that the scheduler shares by memory and cores.
pub const MODE_HAMI_CORE: &str = "hami-core";
/// The device type a vGPU request asks for; a registered GPU's type must contain it.
pub const DEVICE_TYPE: &str = "NVIDIA";

/// One GPU in [`REGISTER_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredGpu {
    /// The GPU's UUID.
    pub uuid: String,
    /// How many containers may share it (0: none, e.g. while unhealthy: the scheduler does
    /// not read the health field when it places).
    pub count: u32,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// The type (`NVIDIA-<model>`); matched by `nvidia.com/use-gputype` and
    /// `nvidia.com/nouse-gputype`.
    pub kind: String,
    /// Whether the GPU is healthy.
    pub healthy: bool,
}

impl RegisteredGpu {
    /// The type for a GPU of model `model`: `NVIDIA-<model>`, or the model where it starts
    /// with `NVIDIA`; the separators of the format (`,` `:` `;`) become `-`.
    pub fn kind_for(model: &str) -> String {
        let t = if model.starts_with(DEVICE_TYPE) {
            model.to_owned()
        } else {
            format!("{DEVICE_TYPE}-{model}")
        };
        t.replace([',', ':', ';'], "-")
    }
}

/// The value of [`REGISTER_ANNOTATION`] for `gpus`. Every entry ends with `:`: the
/// scheduler ignores a value without one, and a `:` between entries only would leave a
/// single GPU unread.
pub fn render_register(gpus: &[RegisteredGpu]) -> String {
    let mut s = String::new();
    for g in gpus {
        let _ = write!(
            s,
            "{},{},{},{},{},{MODE_HAMI_CORE}:",
            g.uuid, g.count, g.memory_mib, g.kind, g.healthy
        );
    }
    s
}

/// Reads [`REGISTER_ANNOTATION`] of node `node` (strictly: each entry has six fields).
pub fn parse_register(node: &str, value: &str) -> Result<Vec<RegisteredGpu>, NodeAnnotationError> {
    let err = |problem: String| NodeAnnotationError {
        node: node.to_owned(),
        annotation: REGISTER_ANNOTATION.to_owned(),
        problem,
    };
    let mut out = Vec::new();
    for (i, entry) in value.split(':').filter(|e| !e.is_empty()).enumerate() {
        let f: Vec<&str> = entry.split(',').collect();
        if f.len() != 6 {
            return Err(err(format!(
                "gpus[{i}]: {} fields, expected uuid,count,memoryMiB,type,healthy,mode",
                f.len()
            )));
        }
        let count = f[1]
            .parse()
            .map_err(|_| err(format!("gpus[{i}].count: {:?} is not a whole number", f[1])))?;
        let memory_mib = f[2].parse().map_err(|_| {
            err(format!(
                "gpus[{i}].memoryMiB: {:?} is not a whole number",
                f[2]
            ))
        })?;
        let healthy = match f[4] {
            "true" => true,
            "false" => false,
            other => {
                return Err(err(format!(
                    "gpus[{i}].healthy: {other:?}, expected true or false"
                )));
            }
        };
        out.push(RegisteredGpu {
            uuid: f[0].to_owned(),
            count,
            memory_mib,
            kind: f[3].to_owned(),
            healthy,
        });
    }
    Ok(out)
}

/// One device of one container in [`POD_DEVICES_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolcanoDevice {
    /// The GPU's UUID.
    pub uuid: String,
    /// The requested type (`NVIDIA`).
    pub kind: String,
    /// Device memory granted, MiB.
    pub memory_mib: u64,
    /// Compute granted, percent (0: no limit).
    pub cores: u32,
}

/// The value of [`POD_DEVICES_ANNOTATION`] for `containers`, as the scheduler writes it.
pub fn render_pod_devices(containers: &[Vec<VolcanoDevice>]) -> String {
    let mut parts = Vec::with_capacity(containers.len());
    for c in containers {
        let mut s = String::new();
        for d in c {
            let _ = write!(s, "{},{},{},{}:", d.uuid, d.kind, d.memory_mib, d.cores);
        }
        parts.push(s);
    }
    parts.join(";")
}

/// Reads [`POD_DEVICES_ANNOTATION`] of pod `pod` (`namespace/name`): per vGPU container
/// (in `spec.containers` order), its devices. Strict where the scheduler is lenient: each
/// device has exactly four fields, a UUID, whole numbers, cores at most 100, no GPU twice
/// in one container.
pub fn parse_pod_devices(
    pod: &str,
    value: &str,
) -> Result<Vec<Vec<VolcanoDevice>>, PodAnnotationError> {
    let err = |problem: String| PodAnnotationError {
        pod: pod.to_owned(),
        annotation: POD_DEVICES_ANNOTATION.to_owned(),
        problem,
    };
    if value.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (i, container) in value.split(';').enumerate() {
        let mut devices: Vec<VolcanoDevice> = Vec::new();
        for (j, entry) in container.split(':').filter(|e| !e.is_empty()).enumerate() {
            let at =
                |field: &str, p: String| err(format!("containers[{i}].devices[{j}].{field}: {p}"));
            let f: Vec<&str> = entry.split(',').collect();
            if f.len() != 4 {
                return Err(err(format!(
                    "containers[{i}].devices[{j}]: {} fields in {entry:?}, expected uuid,type,memoryMiB,cores",
                    f.len()
                )));
            }
            if f[0].is_empty() {
                return Err(at("uuid", "empty".into()));
            }
            let memory_mib: u64 = f[2]
                .parse()
                .map_err(|_| at("memoryMiB", format!("{:?} is not a whole number", f[2])))?;
            let cores: u32 = f[3]
                .parse()
                .map_err(|_| at("cores", format!("{:?} is not a whole number", f[3])))?;
            if cores > 100 {
                return Err(at("cores", format!("{cores} is above 100")));
            }
            if devices.iter().any(|d| d.uuid == f[0]) {
                return Err(at("uuid", format!("{:?} appears twice", f[0])));
            }
            devices.push(VolcanoDevice {
                uuid: f[0].to_owned(),
                kind: f[1].to_owned(),
                memory_mib,
                cores,
            });
        }
        out.push(devices);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gpu(uuid: &str, count: u32, healthy: bool) -> RegisteredGpu {
        RegisteredGpu {
            uuid: uuid.into(),
            count,
            memory_mib: 81920,
            kind: RegisteredGpu::kind_for("A100-SXM4-80GB"),
            healthy,
        }
    }

    #[test]
    fn register_format_is_what_the_scheduler_splits() {
        let v = render_register(&[gpu("GPU-a", 10, true), gpu("GPU-b", 0, false)]);
        assert_eq!(
            v,
            "GPU-a,10,81920,NVIDIA-A100-SXM4-80GB,true,hami-core:GPU-b,0,81920,NVIDIA-A100-SXM4-80GB,false,hami-core:"
        );
        // One GPU still carries the `:` the scheduler looks for.
        assert!(render_register(&[gpu("GPU-a", 10, true)]).ends_with(':'));
        assert_eq!(
            parse_register("n1", &v).unwrap(),
            vec![gpu("GPU-a", 10, true), gpu("GPU-b", 0, false)]
        );
    }

    #[test]
    fn kind_keeps_the_nvidia_prefix_and_drops_separators() {
        assert_eq!(
            RegisteredGpu::kind_for("NVIDIA H100 80GB HBM3"),
            "NVIDIA H100 80GB HBM3"
        );
        assert_eq!(
            RegisteredGpu::kind_for("Tesla T4,x:y;z"),
            "NVIDIA-Tesla T4-x-y-z"
        );
    }

    #[test]
    fn register_errors_name_node_and_field() {
        let e = parse_register("n1", "GPU-a,ten,1,NVIDIA,true,hami-core:").unwrap_err();
        assert_eq!(
            e.to_string(),
            "node n1: annotation volcano.sh/node-vgpu-register: gpus[0].count: \"ten\" is not a whole number"
        );
        let e = parse_register("n1", "GPU-a,1,1,NVIDIA:").unwrap_err();
        assert!(e.problem.starts_with("gpus[0]: 4 fields"), "{e}");
    }

    #[test]
    fn pod_devices_as_volcano_writes_them() {
        // Two vGPU containers: one GPU with 20000 MiB and 30 % of the cores, then two GPUs.
        let v = "GPU-a,NVIDIA,20000,30:;GPU-a,NVIDIA,1000,0:GPU-b,NVIDIA,1000,0:";
        let c = parse_pod_devices("ns/p", v).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[0],
            vec![VolcanoDevice {
                uuid: "GPU-a".into(),
                kind: "NVIDIA".into(),
                memory_mib: 20000,
                cores: 30
            }]
        );
        assert_eq!(c[1].len(), 2);
        assert_eq!(c[1][1].uuid, "GPU-b");
        assert_eq!(render_pod_devices(&c), v);
        assert_eq!(
            parse_pod_devices("ns/p", "").unwrap(),
            Vec::<Vec<VolcanoDevice>>::new()
        );
    }

    #[test]
    fn pod_device_errors_name_pod_annotation_and_field() {
        let cases = [
            (
                "GPU-a,NVIDIA,lots,0:",
                "containers[0].devices[0].memoryMiB: \"lots\" is not a whole number",
            ),
            (
                "GPU-a,NVIDIA,1,0:;GPU-b,NVIDIA,1,101:",
                "containers[1].devices[0].cores: 101 is above 100",
            ),
            (",NVIDIA,1,0:", "containers[0].devices[0].uuid: empty"),
            (
                "GPU-a,NVIDIA,1,0:GPU-a,NVIDIA,1,0:",
                "containers[0].devices[1].uuid: \"GPU-a\" appears twice",
            ),
            (
                "GPU-a,NVIDIA,1:",
                "containers[0].devices[0]: 3 fields in \"GPU-a,NVIDIA,1\", expected uuid,type,memoryMiB,cores",
            ),
            (
                "GPU-a,NVIDIA,-5,0:",
                "containers[0].devices[0].memoryMiB: \"-5\" is not a whole number",
            ),
        ];
        for (v, want) in cases {
            let e = parse_pod_devices("ml/x", v).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("pod ml/x: annotation volcano.sh/vgpu-ids-new: {want}"),
                "{v}"
            );
        }
    }

    fn device() -> impl Strategy<Value = VolcanoDevice> {
        ("GPU-[0-9a-f]{1,12}", 0u64..200_000, 0u32..=100).prop_map(|(uuid, memory_mib, cores)| {
            VolcanoDevice {
                uuid,
                kind: DEVICE_TYPE.into(),
                memory_mib,
                cores,
            }
        })
    }

    proptest! {
        #[test]
        fn any_text_is_an_answer_not_a_panic(s in ".{0,200}") {
            let _ = parse_pod_devices("ns/p", &s);
            let _ = parse_register("n", &s);
        }

        #[test]
        fn separators_in_any_order_never_panic(s in "[,:;GPU0-9a]{0,80}") {
            let _ = parse_pod_devices("ns/p", &s);
            let _ = parse_register("n", &s);
        }

        #[test]
        fn rendered_devices_read_back(cs in proptest::collection::vec(proptest::collection::vec(device(), 1..4), 1..4)) {
            // Within a container a GPU appears once (as the scheduler places).
            let cs: Vec<Vec<VolcanoDevice>> = cs
                .into_iter()
                .map(|c| {
                    let mut seen = std::collections::BTreeSet::new();
                    c.into_iter().filter(|d| seen.insert(d.uuid.clone())).collect()
                })
                .collect();
            let back = parse_pod_devices("ns/p", &render_pod_devices(&cs)).unwrap();
            prop_assert_eq!(back, cs);
        }
    }
}
