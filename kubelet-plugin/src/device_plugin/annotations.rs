//! The two annotations the device plugin shares with the scheduler extender, written
//! against their documented format (`docs/extender.md`, "Annotations"):
//!
//! * Node `<driver>/node-gpus` (written here): a JSON array, one object per GPU,
//!   `{"id", "uuid", "model", "memoryBytes", "cores", "numa", "pcieRoot", "healthy"}`.
//! * Pod `<driver>/assigned-devices` (written by the extender at bind, read by `Allocate`):
//!   `{"node", "containers": [{"index", "name", "devices": [{"id", "uuid", "memoryBytes",
//!   "cores"}]}]}`.
//!
//! The extender has its own copy of these types (`controller/src/extender/annotations.rs`);
//! both sides read strictly (unknown fields refused). They should become one type in
//! `fgpu_api`.

use fgpu_driver::device::NodeInventory;
use serde::{Deserialize, Serialize};

use crate::edits::device_name;

/// One GPU as the node publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGpu {
    /// Device name on the node, `gpu-<minor>` (the DRA path's device name).
    pub id: String,
    /// The GPU's UUID.
    pub uuid: String,
    /// NVML product name.
    pub model: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Compute capacity in percent of the SMs (always 100 for a whole GPU).
    pub cores: u32,
    /// NUMA node, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// PCIe root, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_root: Option<String>,
    /// Health.
    pub healthy: bool,
}

/// The node's GPUs in the inventory annotation's format, sorted by device name so that the
/// value changes only when the GPUs do.
pub fn node_gpus(inventory: &NodeInventory) -> Vec<NodeGpu> {
    let mut gpus: Vec<NodeGpu> = inventory
        .gpus
        .iter()
        .map(|g| NodeGpu {
            id: device_name(g),
            uuid: g.uuid.clone(),
            model: g.product_name.clone(),
            memory_bytes: g.memory_bytes,
            cores: 100,
            numa: g.numa_node,
            pcie_root: g.pcie_root.clone(),
            healthy: g.health.is_healthy(),
        })
        .collect();
    gpus.sort_by(|a, b| a.id.cmp(&b.id));
    gpus
}

/// The inventory annotation's value for `inventory`.
pub fn render_node_inventory(inventory: &NodeInventory) -> String {
    serde_json::to_string(&node_gpus(inventory)).expect("serialisable")
}

/// The extender's decision for one pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodAssignment {
    /// The node the pod was bound to.
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
    /// Memory granted in bytes.
    pub memory_bytes: u64,
    /// Percent of the SMs granted (0: no core quota).
    pub cores: u32,
}

/// A pod annotation that cannot be used, naming the pod, the annotation and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: annotation {annotation}: {problem}")]
pub struct AssignmentError {
    /// `namespace/name`.
    pub pod: String,
    /// The annotation.
    pub annotation: String,
    /// What is wrong, starting with the field.
    pub problem: String,
}

impl PodAssignment {
    /// Reads the decision annotation `value` of pod `pod` (`namespace/name`).
    pub fn parse(pod: &str, annotation: &str, value: &str) -> Result<Self, AssignmentError> {
        let err = |problem: String| AssignmentError {
            pod: pod.to_owned(),
            annotation: annotation.to_owned(),
            problem,
        };
        let a: PodAssignment = serde_json::from_str(value).map_err(|e| {
            err(format!(
                "{e}; expected {{\"node\", \"containers\": [{{\"index\", \"name\", \"devices\": [{{\"id\", \"uuid\", \"memoryBytes\", \"cores\"}}]}}]}}"
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::tests::gpu;
    use fgpu_driver::device::Health;

    #[test]
    fn inventory_in_the_extender_format() {
        let mut g1 = gpu(1, "0000:9a:00.0");
        g1.health = Health::Unhealthy {
            reason: "xid 79".into(),
        };
        g1.numa_node = Some(1);
        let inv = NodeInventory::new("n1", vec![g1, gpu(0, "0000:19:00.0")]);
        let v: serde_json::Value = serde_json::from_str(&render_node_inventory(&inv)).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"id": "gpu-0", "uuid": "GPU-00000000-0000-0000-0000-000000000000",
                 "model": "NVIDIA H100 80GB HBM3", "memoryBytes": 85899345920u64, "cores": 100,
                 "numa": 0, "healthy": true},
                {"id": "gpu-1", "uuid": "GPU-00000001-0000-0000-0000-000000000000",
                 "model": "NVIDIA H100 80GB HBM3", "memoryBytes": 85899345920u64, "cores": 100,
                 "numa": 1, "healthy": false}
            ])
        );
    }

    #[test]
    fn assignment_parses_and_errors_name_pod_and_field() {
        let ann = "gpu.fgpu.dev/assigned-devices";
        let ok = r#"{"node":"n1","containers":[{"index":1,"name":"main","devices":[{"id":"gpu-0","uuid":"GPU-a","memoryBytes":1073741824,"cores":30}]}]}"#;
        let a = PodAssignment::parse("ns/p", ann, ok).unwrap();
        assert_eq!(a.containers[0].devices[0].memory_bytes, 1 << 30);
        let cases = [
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
