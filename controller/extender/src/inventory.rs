//! The cluster's GPUs as the admission webhook checks pods against them: node count,
//! models, UUIDs and the largest memory, gathered from the extender's node cache
//! ([`crate::Extender::gpu_inventory`]).

use std::collections::BTreeSet;

/// What the extender knows of the cluster's GPUs (from the node inventory annotations).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuInventory {
    /// Nodes with at least one GPU.
    pub nodes: usize,
    /// Distinct model names.
    pub models: BTreeSet<String>,
    /// UUIDs, lower case.
    pub uuids: BTreeSet<String>,
    /// The largest GPU's memory, bytes, and its model.
    pub max_memory_bytes: u64,
    pub max_memory_model: String,
}

impl GpuInventory {
    /// Adds one GPU.
    pub fn add_gpu(&mut self, model: &str, uuid: &str, memory_bytes: u64) {
        if !self.models.contains(model) {
            self.models.insert(model.to_owned());
        }
        self.uuids.insert(uuid.to_ascii_lowercase());
        if memory_bytes > self.max_memory_bytes {
            self.max_memory_bytes = memory_bytes;
            self.max_memory_model = model.to_owned();
        }
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// Whether some known model contains `pattern` (ASCII case-insensitive), the engine's
    /// matching rule.
    pub fn has_model(&self, pattern: &str) -> bool {
        let p = pattern.to_ascii_lowercase();
        self.models
            .iter()
            .any(|m| m.to_ascii_lowercase().contains(&p))
    }
}
