//! The two annotations of the extender path, their JSON formats and strict parsing.
//!
//! * Node, written by the node plugin: [`DriverName::node_inventory_annotation`]
//!   (`gpu.fgpu.dev/node-gpus`), a JSON array of [`NodeGpu`]:
//!
//!   ```json
//!   [{"id": "gpu-0", "uuid": "GPU-6c8e...", "model": "NVIDIA A100-SXM4-80GB",
//!     "memoryBytes": 85899345920, "cores": 100, "numa": 0, "healthy": true}]
//!   ```
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
//! [`DriverName::node_inventory_annotation`]: fgpu_api::names::DriverName::node_inventory_annotation
//! [`DriverName::pod_assignment_annotation`]: fgpu_api::names::DriverName::pod_assignment_annotation

use fgpu_driver::engine::{Gpu, Node};
use fgpu_driver::ledger::{DeviceGrant, Grant};
use serde::{Deserialize, Serialize};

/// One GPU as the node plugin publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGpu {
    /// Device name on the node (`gpu-0`); unique within the node.
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
}

fn hundred() -> u32 {
    100
}

fn yes() -> bool {
    true
}

/// A node annotation that cannot be used; names the node and the annotation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("node {node}: annotation {annotation}: {problem}")]
pub struct NodeAnnotationError {
    pub node: String,
    pub annotation: String,
    pub problem: String,
}

/// Reads the inventory annotation `value` of node `node` into an engine node with every
/// GPU free (the ledger applies the grants).
pub fn parse_node_inventory(
    node: &str,
    annotation: &str,
    value: &str,
) -> Result<Node, NodeAnnotationError> {
    let err = |problem: String| NodeAnnotationError {
        node: node.to_owned(),
        annotation: annotation.to_owned(),
        problem,
    };
    let gpus: Vec<NodeGpu> = serde_json::from_str(value).map_err(|e| {
        err(format!(
            "{e}; expected a JSON array of {{id, uuid, model, memoryBytes, cores, numa, healthy}}"
        ))
    })?;
    let mut out = Vec::with_capacity(gpus.len());
    for (i, g) in gpus.into_iter().enumerate() {
        let at = |field: &str, problem: &str| err(format!("[{i}].{field}: {problem}"));
        if g.id.is_empty() {
            return Err(at("id", "empty; give the device name, such as gpu-0"));
        }
        if out.iter().any(|o: &Gpu| o.id == g.id) {
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
        let mut gpu = Gpu::new(g.id, g.model, g.memory_bytes);
        gpu.uuid = g.uuid;
        gpu.cores_total = g.cores;
        gpu.cores_free = g.cores;
        gpu.numa = g.numa;
        gpu.pcie_root = g.pcie_root;
        gpu.healthy = g.healthy;
        out.push(gpu);
    }
    Ok(Node::new(node, out))
}

/// Writes an engine node's GPUs in the inventory annotation's format (for the node side and
/// for tests).
pub fn render_node_inventory(node: &Node) -> String {
    let gpus: Vec<NodeGpu> = node
        .gpus
        .iter()
        .map(|g| NodeGpu {
            id: g.id.clone(),
            uuid: g.uuid.clone(),
            model: g.model.clone(),
            memory_bytes: g.memory_total,
            cores: g.cores_total,
            numa: g.numa,
            pcie_root: g.pcie_root.clone(),
            healthy: g.healthy,
        })
        .collect();
    serde_json::to_string(&gpus).expect("serialisable")
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

/// A pod annotation that cannot be used; names the pod and the annotation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: annotation {annotation}: {problem}")]
pub struct PodAnnotationError {
    /// `namespace/name`.
    pub pod: String,
    pub annotation: String,
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
                if c.devices[..j].iter().any(|o| o.id == d.id) {
                    return Err(err(format!(
                        "containers[{i}].devices[{j}].id: {:?} appears twice",
                        d.id
                    )));
                }
            }
        }
        Ok(a)
    }

    /// The JSON to store in the annotation.
    pub fn render(&self) -> String {
        serde_json::to_string(self).expect("serialisable")
    }

    /// The ledger grants of this assignment, one per container, keyed by
    /// [`grant_id`]`(pod_uid, container name)`.
    pub fn grants(&self, pod_uid: &str) -> Vec<Grant> {
        self.containers
            .iter()
            .map(|c| Grant {
                id: grant_id(pod_uid, &c.name),
                node: self.node.clone(),
                cpu_milli: 0,
                memory_mib: 0,
                devices: c
                    .devices
                    .iter()
                    .map(|d| DeviceGrant {
                        gpu: d.id.clone(),
                        memory: d.memory_bytes,
                        cores: d.cores,
                    })
                    .collect(),
            })
            .collect()
    }
}

/// Ledger grant id of one container of a pod: `<pod uid>/<container name>`.
pub fn grant_id(pod_uid: &str, container: &str) -> String {
    format!("{pod_uid}/{container}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANN: &str = "gpu.fgpu.dev/node-gpus";

    #[test]
    fn inventory_round_trip_and_defaults() {
        let v = r#"[
          {"id":"gpu-0","uuid":"GPU-a","model":"NVIDIA A100-SXM4-80GB","memoryBytes":85899345920,"numa":0},
          {"id":"gpu-1","uuid":"GPU-b","model":"NVIDIA A100-SXM4-80GB","memoryBytes":85899345920,"cores":100,"numa":1,"healthy":false,"pcieRoot":"pci0000:80"}
        ]"#;
        let n = parse_node_inventory("node-a", ANN, v).unwrap();
        assert_eq!(n.name, "node-a");
        assert_eq!(n.gpus.len(), 2);
        assert_eq!(n.gpus[0].uuid, "GPU-a");
        assert_eq!(n.gpus[0].cores_total, 100);
        assert!(n.gpus[0].healthy);
        assert_eq!(n.gpus[1].numa, Some(1));
        assert!(!n.gpus[1].healthy);
        assert_eq!(n.gpus[1].pcie_root.as_deref(), Some("pci0000:80"));
        let again = parse_node_inventory("node-a", ANN, &render_node_inventory(&n)).unwrap();
        assert_eq!(again, n);
        assert_eq!(parse_node_inventory("n", ANN, "[]").unwrap().gpus.len(), 0);
    }

    #[test]
    fn inventory_errors_name_node_and_field() {
        let cases = [
            ("[", "EOF while parsing"),
            (
                r#"[{"id":"gpu-0","uuid":"GPU-a","model":"m","memoryBytes":1,"colour":"red"}]"#,
                "unknown field `colour`",
            ),
            (
                r#"[{"id":"","uuid":"GPU-a","model":"m","memoryBytes":1}]"#,
                "[0].id: empty",
            ),
            (
                r#"[{"id":"g","uuid":"GPU-a","model":"m","memoryBytes":1},{"id":"g","uuid":"GPU-b","model":"m","memoryBytes":1}]"#,
                "[1].id: \"g\" appears twice",
            ),
            (
                r#"[{"id":"g","uuid":"GPU-a","model":"m","memoryBytes":0}]"#,
                "[0].memoryBytes: 0",
            ),
            (
                r#"[{"id":"g","uuid":"GPU-a","model":"m","memoryBytes":1,"cores":101}]"#,
                "[0].cores: 101",
            ),
        ];
        for (v, want) in cases {
            let e = parse_node_inventory("node-a", ANN, v)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with("node node-a: annotation gpu.fgpu.dev/node-gpus: "),
                "{e}"
            );
            assert!(e.contains(want), "{v}: {e}");
        }
    }

    #[test]
    fn assignment_round_trip_and_grants() {
        let a = PodAssignment {
            node: "node-a".into(),
            containers: vec![ContainerAssignment {
                index: 1,
                name: "main".into(),
                devices: vec![AssignedDevice {
                    id: "gpu-0".into(),
                    uuid: "GPU-a".into(),
                    memory_bytes: 1 << 30,
                    cores: 30,
                }],
            }],
        };
        let text = a.render();
        assert_eq!(
            text,
            r#"{"node":"node-a","containers":[{"index":1,"name":"main","devices":[{"id":"gpu-0","uuid":"GPU-a","memoryBytes":1073741824,"cores":30}]}]}"#
        );
        assert_eq!(PodAssignment::parse("ns/p", "x", &text).unwrap(), a);
        let g = a.grants("uid-1");
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].id, "uid-1/main");
        assert_eq!(g[0].node, "node-a");
        assert_eq!(g[0].devices[0].memory, 1 << 30);
        assert_eq!(g[0].devices[0].cores, 30);
    }

    #[test]
    fn assignment_errors_name_pod() {
        let ann = "gpu.fgpu.dev/assigned-devices";
        let cases = [
            ("nope", "expected ident"),
            (r#"{"node":"","containers":[]}"#, "node: empty"),
            (
                r#"{"node":"n","containers":[{"index":0,"name":"a","devices":[]}]}"#,
                "containers[0].devices: empty",
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
