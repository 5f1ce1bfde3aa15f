//! The two annotations of the legacy path (scheduler extender + device plugin), their JSON
//! formats and strict parsing — one definition for both sides.
//!
//! * Node, written by the device plugin, read by the extender:
//!   [`DriverName::node_inventory_annotation`] (`gpu.fgpu.dev/node-gpus`), a JSON array of
//!   [`NodeGpu`]:
//!
//!   ```json
//!   [{"id": "gpu-0", "uuid": "GPU-6c8e...", "model": "NVIDIA A100-SXM4-80GB",
//!     "memoryBytes": 85899345920, "cores": 100, "numa": 0, "healthy": true},
//!    {"id": "gpu-1", "uuid": "GPU-9a1f...", "model": "NVIDIA H100 80GB HBM3",
//!     "memoryBytes": 85520809984, "mode": "mig"}]
//!   ```
//!
//!   `mode` (`shared` when absent, `mig`, `whole`) is the GPU's mode. A container placed
//!   on a MIG-mode GPU is assigned the placement device `gpu-<index>-mig-<profile
//!   label>-<start>` (`fgpu_driver::mig::parse_device_name` takes it apart) with the
//!   parent's UUID and the profile's memory; the device plugin creates that instance.
//!
//! * Pod, written by the extender at bind, read by the device plugin's `Allocate`:
//!   [`DriverName::pod_assignment_annotation`] (`gpu.fgpu.dev/assigned-devices`), a
//!   [`PodAssignment`]:
//!
//!   ```json
//!   {"node": "node-a", "containers": [{"index": 0, "name": "main", "devices": [
//!     {"id": "gpu-0", "uuid": "GPU-6c8e...", "memoryBytes": 10737418240, "cores": 30}]}]}
//!   ```
//!
//! Both are read strictly (unknown fields refused) so that a typo on either side shows up as
//! an error naming the object and the field, not as a silently ignored value.
//!
//! [`DriverName::node_inventory_annotation`]: crate::names::DriverName::node_inventory_annotation
//! [`DriverName::pod_assignment_annotation`]: crate::names::DriverName::pod_assignment_annotation

use serde::{Deserialize, Serialize};

/// One GPU as the node publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGpu {
    /// Device name on the node (`gpu-0`, the DRA path's device name); unique within the node.
    pub id: String,
    /// The GPU's UUID (`GPU-...`).
    pub uuid: String,
    /// Product name as NVML reports it (`NVIDIA A100-SXM4-80GB`).
    pub model: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Compute capacity in percent of the SMs; 100 when absent.
    #[serde(default = "hundred")]
    pub cores: u32,
    /// NUMA node, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// PCIe root, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// Health; true when absent.
    #[serde(default = "yes")]
    pub healthy: bool,
    /// The GPU's mode: `shared` (quota shares; the default, and what an annotation without
    /// the field means), `mig` (one MIG instance per container, sized to its memory) or
    /// `whole` (whole-GPU requests only). Left out when `shared`, so annotations without
    /// MIG read as before.
    #[serde(default, skip_serializing_if = "NodeGpuMode::is_shared")]
    pub mode: NodeGpuMode,
}

/// A GPU's mode in the node inventory annotation ([`NodeGpu::mode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeGpuMode {
    /// Quota shares.
    #[default]
    Shared,
    /// Dynamic MIG: the extender picks a profile and placement per container.
    Mig,
    /// Whole GPUs only.
    Whole,
}

impl NodeGpuMode {
    /// Whether this is [`NodeGpuMode::Shared`] (the default).
    pub fn is_shared(&self) -> bool {
        *self == Self::Shared
    }
}

fn hundred() -> u32 {
    100
}

fn yes() -> bool {
    true
}

/// A node annotation that cannot be used; names the node, the annotation and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("node {node}: annotation {annotation}: {problem}")]
pub struct NodeAnnotationError {
    /// The node.
    pub node: String,
    /// The annotation.
    pub annotation: String,
    /// What is wrong, starting with the field.
    pub problem: String,
}

/// Reads the inventory annotation `value` of node `node`.
pub fn parse_node_gpus(
    node: &str,
    annotation: &str,
    value: &str,
) -> Result<Vec<NodeGpu>, NodeAnnotationError> {
    let err = |problem: String| NodeAnnotationError {
        node: node.to_owned(),
        annotation: annotation.to_owned(),
        problem,
    };
    let gpus: Vec<NodeGpu> = serde_json::from_str(value).map_err(|e| {
        err(format!(
            "{e}; expected a JSON array of {{id, uuid, model, memoryBytes, cores, numa, healthy, mode}}"
        ))
    })?;
    for (i, g) in gpus.iter().enumerate() {
        let at = |field: &str, problem: &str| err(format!("[{i}].{field}: {problem}"));
        if g.id.is_empty() {
            return Err(at("id", "empty; give the device name, such as gpu-0"));
        }
        if gpus[..i].iter().any(|o| o.id == g.id) {
            return Err(at("id", &format!("{:?} appears twice", g.id)));
        }
        if g.uuid.is_empty() {
            return Err(at(
                "uuid",
                "empty; give the GPU's UUID, such as GPU-6c8e...",
            ));
        }
        if g.memory_bytes == 0 {
            return Err(at("memoryBytes", "0; give the device memory in bytes"));
        }
        if g.cores == 0 || g.cores > 100 {
            return Err(at(
                "cores",
                &format!("{}; a percent of the SMs, 1 to 100", g.cores),
            ));
        }
    }
    Ok(gpus)
}

/// The inventory annotation's value for `gpus`.
pub fn render_node_gpus(gpus: &[NodeGpu]) -> String {
    // Plain strings and numbers: serialising cannot fail.
    serde_json::to_string(gpus).unwrap_or_default()
}

/// The extender's decision for one pod: its node, and per container asking for GPUs the
/// devices with the memory and cores granted on each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodAssignment {
    /// The node the pod is bound to.
    pub node: String,
    /// Containers with GPUs, in `spec.containers` order.
    pub containers: Vec<ContainerAssignment>,
}

/// One container's devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerAssignment {
    /// Index in `spec.containers`.
    pub index: usize,
    /// The container's name.
    pub name: String,
    /// Its GPUs.
    pub devices: Vec<AssignedDevice>,
}

/// One GPU given to a container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AssignedDevice {
    /// Device name on the node (`gpu-0`).
    pub id: String,
    /// The GPU's UUID.
    pub uuid: String,
    /// Device memory granted, in bytes.
    pub memory_bytes: u64,
    /// Percent of the SMs granted (0: no core quota).
    pub cores: u32,
}

/// A pod annotation that cannot be used; names the pod, the annotation and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: annotation {annotation}: {problem}")]
pub struct PodAnnotationError {
    /// `namespace/name`.
    pub pod: String,
    /// The annotation.
    pub annotation: String,
    /// What is wrong, starting with the field.
    pub problem: String,
}

impl PodAssignment {
    /// Reads the assignment annotation `value` of pod `pod` (`namespace/name`).
    pub fn parse(pod: &str, annotation: &str, value: &str) -> Result<Self, PodAnnotationError> {
        let err = |problem: String| PodAnnotationError {
            pod: pod.to_owned(),
            annotation: annotation.to_owned(),
            problem,
        };
        let a: PodAssignment = serde_json::from_str(value).map_err(|e| {
            err(format!(
                "{e}; expected {{\"node\": ..., \"containers\": [{{\"index\", \"name\", \"devices\": [{{\"id\", \"uuid\", \"memoryBytes\", \"cores\"}}]}}]}}"
            ))
        })?;
        if a.node.is_empty() {
            return Err(err("node: empty".into()));
        }
        for (i, c) in a.containers.iter().enumerate() {
            if c.name.is_empty() {
                return Err(err(format!("containers[{i}].name: empty")));
            }
            if a.containers[..i]
                .iter()
                .any(|o| o.index == c.index || o.name == c.name)
            {
                return Err(err(format!(
                    "containers[{i}]: container {:?} (index {}) appears twice",
                    c.name, c.index
                )));
            }
            if c.devices.is_empty() {
                return Err(err(format!("containers[{i}].devices: empty")));
            }
            for (j, d) in c.devices.iter().enumerate() {
                let at = |f: &str, p: String| err(format!("containers[{i}].devices[{j}].{f}: {p}"));
                if c.devices[..j].iter().any(|o| o.id == d.id) {
                    return Err(at("id", format!("{:?} appears twice", d.id)));
                }
                if d.uuid.is_empty() {
                    return Err(at("uuid", "empty".into()));
                }
                if c.devices[..j].iter().any(|o| o.uuid == d.uuid) {
                    return Err(at("uuid", format!("{:?} appears twice", d.uuid)));
                }
                if d.memory_bytes == 0 {
                    return Err(at("memoryBytes", "0; a share needs memory".into()));
                }
                if d.cores > 100 {
                    return Err(at("cores", format!("{} is above 100", d.cores)));
                }
            }
        }
        Ok(a)
    }

    /// The JSON to store in the annotation.
    pub fn render(&self) -> String {
        // Plain strings and numbers: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_gpus_defaults_and_errors() {
        let gpus = parse_node_gpus(
            "n1",
            "a",
            r#"[{"id":"gpu-0","uuid":"GPU-1","model":"H100","memoryBytes":80}]"#,
        )
        .unwrap();
        assert_eq!((gpus[0].cores, gpus[0].healthy), (100, true));
        assert_eq!(
            parse_node_gpus("n1", "a", &render_node_gpus(&gpus)).unwrap(),
            gpus
        );
        for (value, problem) in [
            (
                r#"[{"id":"","uuid":"u","model":"m","memoryBytes":1}]"#,
                "[0].id: empty",
            ),
            (
                r#"[{"id":"g","uuid":"u","model":"m","memoryBytes":0}]"#,
                "[0].memoryBytes: 0",
            ),
            (
                r#"[{"id":"g","uuid":"u","model":"m","memoryBytes":1,"cores":101}]"#,
                "[0].cores: 101",
            ),
            (
                r#"[{"id":"g","uuid":"u","model":"m","memoryBytes":1,"extra":1}]"#,
                "unknown field `extra`",
            ),
        ] {
            let e = parse_node_gpus("n1", "gpu.fgpu.dev/node-gpus", value).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with("node n1: annotation gpu.fgpu.dev/node-gpus: "),
                "{text}"
            );
            assert!(text.contains(problem), "{text} lacks {problem}");
        }
    }

    #[test]
    fn pod_assignment_round_trip_and_errors() {
        let a = PodAssignment {
            node: "n1".into(),
            containers: vec![ContainerAssignment {
                index: 0,
                name: "main".into(),
                devices: vec![AssignedDevice {
                    id: "gpu-0".into(),
                    uuid: "GPU-1".into(),
                    memory_bytes: 1 << 30,
                    cores: 30,
                }],
            }],
        };
        assert_eq!(PodAssignment::parse("ns/p", "a", &a.render()).unwrap(), a);
        let dup = r#"{"node":"n1","containers":[{"index":0,"name":"a","devices":[
            {"id":"gpu-0","uuid":"u","memoryBytes":1,"cores":0},
            {"id":"gpu-0","uuid":"u","memoryBytes":1,"cores":0}]}]}"#;
        let e = PodAssignment::parse("ns/p", "x/assigned-devices", dup).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod ns/p: annotation x/assigned-devices: containers[0].devices[1].id: \"gpu-0\" appears twice"
        );
        assert!(PodAssignment::parse("ns/p", "a", r#"{"node":""}"#).is_err());
    }

    #[test]
    fn pod_assignment_errors_name_pod_annotation_and_field() {
        let ann = "gpu.fgpu.dev/assigned-devices";
        let ok = r#"{"node":"n1","containers":[{"index":1,"name":"main","devices":[{"id":"gpu-0","uuid":"GPU-a","memoryBytes":1073741824,"cores":30}]}]}"#;
        let a = PodAssignment::parse("ns/p", ann, ok).unwrap();
        assert_eq!(a.containers[0].devices[0].memory_bytes, 1 << 30);
        let cases = [
            ("nope", "expected ident"),
            ("{", "EOF while parsing"),
            (
                r#"{"node":"n1","containers":[],"x":1}"#,
                "unknown field `x`",
            ),
            (r#"{"node":"","containers":[]}"#, "node: empty"),
            (
                r#"{"node":"n","containers":[{"index":0,"name":"a","devices":[]}]}"#,
                "containers[0].devices: empty",
            ),
            (
                r#"{"node":"n","containers":[{"index":0,"name":"a","devices":[{"id":"g","uuid":"u","memoryBytes":0,"cores":0}]}]}"#,
                "containers[0].devices[0].memoryBytes: 0",
            ),
            (
                r#"{"node":"n","containers":[{"index":0,"name":"a","devices":[{"id":"g","uuid":"u","memoryBytes":1,"cores":101}]}]}"#,
                "containers[0].devices[0].cores: 101 is above 100",
            ),
            (
                r#"{"node":"n","containers":[{"index":0,"name":"a","devices":[{"id":"g","uuid":"u","memoryBytes":1,"cores":0},{"id":"g","uuid":"u","memoryBytes":1,"cores":0}]}]}"#,
                "containers[0].devices[1].id: \"g\" appears twice",
            ),
        ];
        for (v, want) in cases {
            let e = PodAssignment::parse("ml/train-0", ann, v)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("pod ml/train-0: annotation gpu.fgpu.dev/assigned-devices: "),
                "{e}"
            );
            assert!(e.contains(want), "{v}: {e}");
        }
    }
}
