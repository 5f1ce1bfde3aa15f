//! The device plugin's side of the legacy path's two annotations. Their formats and strict
//! parsing live in [`fgpu_api::assignment`] (the scheduler extender reads and writes the
//! same types); here the node's GPUs become the inventory annotation.

use fgpu_driver::device::NodeInventory;

pub use fgpu_api::assignment::{
    AssignedDevice, ContainerAssignment, NodeGpu, PodAnnotationError as AssignmentError,
    PodAssignment,
};

use crate::edits::device_name;

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
    fgpu_api::assignment::render_node_gpus(&node_gpus(inventory))
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
