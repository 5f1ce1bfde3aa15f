//! Publishing the node's GPU inventory as the `<driver>/node-gpus` annotation (or, in the
//! Volcano mode, Volcano's register annotation, its handshake and the node's vGPU memory
//! and cores), and reading the Node's labels that set the GPUs' modes.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};

/// Writes the inventory annotation on the Node, only when its value differs.
pub struct NodeAnnotationWriter {
    api: kube::Api<Node>,
    node: String,
    annotation: String,
    /// The value last written or read, to skip the GET when nothing changed here.
    last: Option<String>,
}

impl NodeAnnotationWriter {
    /// The client it writes with (for the GPU health Events).
    pub fn client(&self) -> kube::Client {
        self.api.clone().into_client()
    }

    /// A writer for `annotation` on node `node`.
    pub fn new(client: kube::Client, node: &str, annotation: &str) -> Self {
        Self {
            api: kube::Api::all(client),
            node: node.to_owned(),
            annotation: annotation.to_owned(),
            last: None,
        }
    }

    /// The Node's labels (they choose the GPUs' modes, [`crate::gpu_mode`]).
    pub async fn labels(&self) -> Result<std::collections::BTreeMap<String, String>, kube::Error> {
        let node = self.api.get(&self.node).await?;
        Ok(node.metadata.labels.unwrap_or_default())
    }

    /// Makes the annotation `value`. Returns whether the Node was patched. With `verify`,
    /// reads the Node even if this writer wrote `value` last (someone may have changed it).
    pub async fn publish(&mut self, value: &str, verify: bool) -> Result<bool, kube::Error> {
        if !verify && self.last.as_deref() == Some(value) {
            return Ok(false);
        }
        let node = self.api.get(&self.node).await?;
        let current = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&self.annotation));
        if current.map(String::as_str) == Some(value) {
            self.last = Some(value.to_owned());
            return Ok(false);
        }
        let patch = serde_json::json!({"metadata": {"annotations": {&self.annotation: value}}});
        self.api
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.last = Some(value.to_owned());
        Ok(true)
    }

    /// Sets the annotation `key` to `value` with one merge patch, unconditionally (the
    /// Volcano handshake, whose value is a time).
    pub async fn set(&self, key: &str, value: &str) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        self.api
            .patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    /// Sets the Node's `status.capacity` entries `capacity` (extended resources the
    /// kubelet does not own; it derives `allocatable` from them and keeps them).
    pub async fn set_capacity(
        &self,
        capacity: &std::collections::BTreeMap<String, String>,
    ) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"status": {"capacity": capacity}});
        self.api
            .patch_status(&self.node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }
}
