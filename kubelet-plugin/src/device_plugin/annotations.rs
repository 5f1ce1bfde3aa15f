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
            // Not passed down yet: every GPU registers as `shared`. A GPU in MIG mode must
            // write `mig` (and one in whole mode `whole`) for the extender to place MIG
            // instances on it (docs/mig.md, "Legacy path").
            mode: Default::default(),
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
}
