//! The extender's side of the legacy path's two annotations. Their formats and strict
//! parsing live in [`fgpu_api::assignment`] (the device plugin reads and writes the same
//! types); here they meet the engine: a node's inventory becomes an engine [`Node`], a pod's
//! assignment becomes ledger [`Grant`]s.

use fgpu_driver::engine::{Gpu, Node, Taint};
use fgpu_driver::ledger::{DeviceGrant, Grant};
use fgpu_driver::mig::MigTable;

pub use fgpu_api::assignment::{
    AssignedDevice, ContainerAssignment, NodeAnnotationError, NodeGpu, NodeGpuMode,
    PodAnnotationError, PodAssignment,
};

/// Taint the extender puts on the placement devices of a MIG-mode GPU: no share and no
/// whole-GPU request goes there through the engine; [`crate::state`] places MIG
/// instances itself.
pub const MIG_PLACEMENT_TAINT: &str = "fgpu.dev/mig-placement";

/// Taint the extender puts on a whole-mode GPU: only whole-GPU requests tolerate it.
pub const WHOLE_MODE_TAINT: &str = "fgpu.dev/whole-mode";

/// Reads the inventory annotation `value` of node `node` into an engine node with every
/// GPU free (the ledger applies the grants). A `whole`-mode GPU carries the taint
/// [`WHOLE_MODE_TAINT`]. A `mig`-mode GPU is replaced by its placement devices
/// (`gpu-<index>-mig-<profile label>-<start>`, [`fgpu_driver::mig::mig_devices`]'s names,
/// the parent's UUID, model and NUMA node, the profile's memory), each tainted with
/// [`MIG_PLACEMENT_TAINT`]: the ledger then counts an assignment to a placement like any
/// whole device, and which placements are taken is which of them hold a grant. A
/// MIG-mode GPU of a model without a profile table is an error naming it.
pub fn parse_node_inventory(
    node: &str,
    annotation: &str,
    value: &str,
) -> Result<Node, NodeAnnotationError> {
    let mut gpus = Vec::new();
    for (i, g) in fgpu_api::assignment::parse_node_gpus(node, annotation, value)?
        .into_iter()
        .enumerate()
    {
        let mut gpu = Gpu::new(g.id.clone(), g.model.clone(), g.memory_bytes);
        gpu.uuid = g.uuid.clone();
        gpu.cores_total = g.cores;
        gpu.cores_free = g.cores;
        gpu.numa = g.numa;
        gpu.pcie_root = g.pcie_root.clone();
        gpu.healthy = g.healthy;
        match g.mode {
            NodeGpuMode::Shared => gpus.push(gpu),
            NodeGpuMode::Whole => {
                gpu.taints.push(taint(WHOLE_MODE_TAINT));
                gpus.push(gpu);
            }
            NodeGpuMode::Mig => {
                let table = fgpu_driver::mig::table_for(&g.model, g.memory_bytes).map_err(|e| {
                    NodeAnnotationError {
                        node: node.to_owned(),
                        annotation: annotation.to_owned(),
                        problem: format!("[{i}].mode: mig, but {e}"),
                    }
                })?;
                gpus.extend(placement_devices(&g, &gpu, table));
            }
        }
    }
    Ok(Node::new(node, gpus))
}

/// A `NoSchedule` taint with key `key`.
fn taint(key: &str) -> Taint {
    Taint {
        key: key.to_owned(),
        value: String::new(),
        effect: "NoSchedule".to_owned(),
    }
}

/// The placement devices of MIG-mode GPU `g` (read as `parent`), one engine GPU each.
fn placement_devices(g: &NodeGpu, parent: &Gpu, table: &'static MigTable) -> Vec<Gpu> {
    // The GPU index is the number in the device name `gpu-<index>`, else its position.
    let index =
        g.id.strip_prefix("gpu-")
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or_default();
    table
        .profiles
        .iter()
        .flat_map(|p| p.starts.iter().map(move |&s| (p, s)))
        .map(|(p, start)| {
            let mut d = parent.clone();
            d.id = fgpu_driver::mig::device_name(index, p, start);
            d.memory_total = p.memory_bytes();
            d.memory_free = p.memory_bytes();
            d.taints.push(taint(MIG_PLACEMENT_TAINT));
            d
        })
        .collect()
}

/// Writes an engine node's GPUs in the inventory annotation's format (for tests and tools;
/// the device plugin writes the real one). MIG placement devices are left out: a node read
/// with MIG-mode GPUs does not come back whole.
pub fn render_node_inventory(node: &Node) -> String {
    let gpus: Vec<NodeGpu> = node
        .gpus
        .iter()
        .filter(|g| fgpu_driver::mig::parse_device_name(&g.id).is_none())
        .map(|g| NodeGpu {
            id: g.id.clone(),
            uuid: g.uuid.clone(),
            model: g.model.clone(),
            memory_bytes: g.memory_total,
            cores: g.cores_total,
            numa: g.numa,
            pcie_root: g.pcie_root.clone(),
            healthy: g.healthy,
            mode: if g.taints.iter().any(|t| t.key == WHOLE_MODE_TAINT) {
                NodeGpuMode::Whole
            } else {
                NodeGpuMode::Shared
            },
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
    fn mig_mode_gpus_become_tainted_placements_and_whole_mode_gpus_are_tainted() {
        let v = r#"[
          {"id":"gpu-0","uuid":"GPU-a","model":"NVIDIA H100 80GB HBM3","memoryBytes":85899345920,"mode":"mig","numa":1},
          {"id":"gpu-1","uuid":"GPU-b","model":"NVIDIA H100 80GB HBM3","memoryBytes":85899345920,"mode":"whole"},
          {"id":"gpu-2","uuid":"GPU-c","model":"NVIDIA H100 80GB HBM3","memoryBytes":85899345920}
        ]"#;
        let n = parse_node_inventory("node-a", ANN, v).unwrap();
        let placements: Vec<&Gpu> = n.gpus.iter().filter(|g| g.uuid == "GPU-a").collect();
        assert_eq!(placements.len(), 25, "an H100's profile placements");
        assert!(placements.iter().all(|g| {
            g.taints
                .iter()
                .any(|t| t.key == MIG_PLACEMENT_TAINT && t.repels())
                && g.numa == Some(1)
                && fgpu_driver::mig::parse_device_name(&g.id).is_some()
        }));
        let seven = placements
            .iter()
            .find(|g| g.id == "gpu-0-mig-7g80gb-0")
            .unwrap();
        assert_eq!(seven.memory_total, 80 << 30);
        let whole = n.gpus.iter().find(|g| g.id == "gpu-1").unwrap();
        assert_eq!(whole.taints[0].key, WHOLE_MODE_TAINT);
        let shared = n.gpus.iter().find(|g| g.id == "gpu-2").unwrap();
        assert!(shared.taints.is_empty());
        // Rendered back: the whole-mode GPU keeps its mode, the MIG one is left out.
        let again = parse_node_inventory("node-a", ANN, &render_node_inventory(&n)).unwrap();
        let ids: Vec<&str> = again.gpus.iter().map(|g| g.id.as_str()).collect();
        assert_eq!(ids, ["gpu-1", "gpu-2"]);
        assert_eq!(again.gpus[0].taints[0].key, WHOLE_MODE_TAINT);
        // A mode that is not one is refused by the annotation's parser.
        let e =
            parse_node_inventory("node-a", ANN, &v.replace("\"whole\"", "\"MIG\"")).unwrap_err();
        assert!(e.to_string().contains("unknown variant `MIG`"), "{e}");
    }

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
