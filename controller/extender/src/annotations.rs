//! The extender's side of the legacy path's two annotations. Their formats and strict
//! parsing live in [`fgpu_api::assignment`] (the device plugin reads and writes the same
//! types); here they meet the engine: a node's inventory becomes an engine [`Node`], a pod's
//! assignment becomes ledger [`Grant`]s.

use fgpu_driver::engine::{Gpu, Node};
use fgpu_driver::ledger::{DeviceGrant, Grant};

pub use fgpu_api::assignment::{
    AssignedDevice, ContainerAssignment, NodeAnnotationError, NodeGpu, PodAnnotationError,
    PodAssignment,
};

/// Reads the inventory annotation `value` of node `node` into an engine node with every
/// GPU free (the ledger applies the grants).
pub fn parse_node_inventory(
    node: &str,
    annotation: &str,
    value: &str,
) -> Result<Node, NodeAnnotationError> {
    let gpus = fgpu_api::assignment::parse_node_gpus(node, annotation, value)?
        .into_iter()
        .map(|g| {
            let mut gpu = Gpu::new(g.id, g.model, g.memory_bytes);
            gpu.uuid = g.uuid;
            gpu.cores_total = g.cores;
            gpu.cores_free = g.cores;
            gpu.numa = g.numa;
            gpu.pcie_root = g.pcie_root;
            gpu.healthy = g.healthy;
            gpu
        })
        .collect();
    Ok(Node::new(node, gpus))
}

/// Writes an engine node's GPUs in the inventory annotation's format (for tests and tools;
/// the device plugin writes the real one).
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
    fgpu_api::assignment::render_node_gpus(&gpus)
}

/// The ledger grants of an assignment, one per container, keyed by
/// [`grant_id`]`(pod_uid, container name)`.
pub fn grants(assignment: &PodAssignment, pod_uid: &str) -> Vec<Grant> {
    assignment
        .containers
        .iter()
        .map(|c| Grant {
            id: grant_id(pod_uid, &c.name),
            node: assignment.node.clone(),
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
        let g = grants(&a, "uid-1");
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].id, "uid-1/main");
        assert_eq!(g[0].node, "node-a");
        assert_eq!(g[0].devices[0].memory, 1 << 30);
        assert_eq!(g[0].devices[0].cores, 30);
    }
}
