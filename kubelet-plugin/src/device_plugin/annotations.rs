//! The device plugin's side of the legacy path's two annotations. Their formats and strict
//! parsing live in [`fgpu_api::assignment`] (the scheduler extender reads and writes the
//! same types); here the node's GPUs, with the modes in force, become the inventory
//! annotation.

use std::collections::BTreeMap;

use fgpu_api::assignment::NodeGpuMode;
use fgpu_driver::device::{Gpu, GpuMode, NodeInventory};

pub use fgpu_api::assignment::{
    AssignedDevice, ContainerAssignment, NodeGpu, PodAnnotationError as AssignmentError,
    PodAssignment,
};

use crate::edits::device_name;

/// The node's GPUs in the inventory annotation's format, each with its mode in force
/// (`modes`, by UUID; a GPU not named is `shared`), sorted by device name so that the value
/// changes only when the GPUs or their modes do. A `mig` GPU that cannot be cut (not
/// MIG-capable, or a model without a profile table) is left out, as the DRA side publishes
/// nothing for it; the second value says why, one line per such GPU.
pub fn node_gpus(
    inventory: &NodeInventory,
    modes: &BTreeMap<String, GpuMode>,
) -> (Vec<NodeGpu>, Vec<String>) {
    let mut notes = Vec::new();
    let mut gpus: Vec<NodeGpu> = inventory
        .gpus
        .iter()
        .filter_map(|g| {
            let mode = modes.get(&g.uuid).copied().unwrap_or_default();
            if mode == GpuMode::Mig
                && let Some(why) = cannot_cut(g)
            {
                notes.push(format!(
                    "GPU {} ({}, {:?}): mode mig, but {why}; left out of the node annotation",
                    g.index, g.uuid, g.product_name
                ));
                return None;
            }
            Some(NodeGpu {
                id: device_name(g),
                uuid: g.uuid.clone(),
                model: g.product_name.clone(),
                memory_bytes: g.memory_bytes,
                cores: 100,
                numa: g.numa_node,
                pcie_root: g.pcie_root.clone(),
                healthy: g.health.is_healthy(),
                mode: match mode {
                    GpuMode::Shared => NodeGpuMode::Shared,
                    GpuMode::Mig => NodeGpuMode::Mig,
                    GpuMode::Whole => NodeGpuMode::Whole,
                },
            })
        })
        .collect();
    gpus.sort_by(|a, b| a.id.cmp(&b.id));
    (gpus, notes)
}

/// Why `gpu` cannot be cut into MIG instances, or `None` when it can.
fn cannot_cut(gpu: &Gpu) -> Option<String> {
    if !gpu.mig_capable {
        return Some("the GPU is not MIG-capable".into());
    }
    fgpu_driver::mig::table_for(&gpu.product_name, gpu.memory_bytes)
        .err()
        .map(|e| e.to_string())
}

/// The inventory annotation's value for `inventory` with the modes `modes`, and the notes
/// of [`node_gpus`].
pub fn render_node_inventory(
    inventory: &NodeInventory,
    modes: &BTreeMap<String, GpuMode>,
) -> (String, Vec<String>) {
    let (gpus, notes) = node_gpus(inventory, modes);
    (fgpu_api::assignment::render_node_gpus(&gpus), notes)
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
        let (text, notes) = render_node_inventory(&inv, &BTreeMap::new());
        assert!(notes.is_empty(), "{notes:?}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
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

    /// The modes in force reach the annotation: a MIG-mode GPU registers `mig`, a whole
    /// one `whole`, and a MIG-mode GPU that cannot be cut is left out with a note.
    #[test]
    fn modes_in_force_are_registered() {
        let mut g0 = gpu(0, "0000:19:00.0");
        g0.mig_capable = true;
        let g1 = gpu(1, "0000:9a:00.0");
        let mut g2 = gpu(2, "0000:ab:00.0");
        g2.mig_capable = true;
        g2.product_name = "NVIDIA H100 NVL".into();
        g2.memory_bytes = 94 << 30;
        let inv = NodeInventory::new("n1", vec![g0.clone(), g1.clone(), g2.clone()]);
        let modes = BTreeMap::from([
            (g0.uuid.clone(), GpuMode::Mig),
            (g1.uuid.clone(), GpuMode::Whole),
            (g2.uuid.clone(), GpuMode::Mig),
        ]);
        let (gpus, notes) = node_gpus(&inv, &modes);
        let got: Vec<(&str, NodeGpuMode)> = gpus.iter().map(|g| (g.id.as_str(), g.mode)).collect();
        assert_eq!(
            got,
            [("gpu-0", NodeGpuMode::Mig), ("gpu-1", NodeGpuMode::Whole)]
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with(&format!(
                "GPU 2 ({}, \"NVIDIA H100 NVL\"): mode mig, but",
                g2.uuid
            )),
            "{notes:?}"
        );
        // The annotation's text carries the field as the extender reads it.
        let (text, _) = render_node_inventory(&inv, &modes);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v[0]["mode"], "mig");
        assert_eq!(v[1]["mode"], "whole");
        // Not MIG-capable: left out too, saying so.
        let mut plain = g0.clone();
        plain.mig_capable = false;
        let inv = NodeInventory::new("n1", vec![plain]);
        let (gpus, notes) = node_gpus(&inv, &modes);
        assert!(gpus.is_empty());
        assert!(notes[0].contains("not MIG-capable"), "{notes:?}");
    }
}
