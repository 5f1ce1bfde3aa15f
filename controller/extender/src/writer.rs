//! The extender's writes to the cluster, behind a small trait: [`MemoryCluster`] for tests
//! and benchmarks, [`KubeCluster`] for the daemon.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use fgpu_api::extender::Pod;
use serde_json::Value;

/// The field manager of the extender's writes: the API server records it in the pod's
/// `metadata.managedFields` as the owner of the assignment annotation, and the resync counts
/// a pod's grant only when that owner is this manager ([`crate::state::written_by`]).
pub const FIELD_MANAGER: &str = "fgpu-extender";

/// A failed read or write; the message names what failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WriteError(pub String);

/// What `/bind` needs from the API server.
pub trait ClusterWriter: Send + Sync + 'static {
    /// Reads a pod (bind gets only its name; filter's copy is used when there is one).
    fn get_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Pod, WriteError>> + Send;
    /// Applies a JSON merge patch to a pod (the assignment annotation).
    fn annotate_pod(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;
    /// Creates a `v1` Binding (`pods/binding`).
    fn bind(&self, binding: &Value) -> impl Future<Output = Result<(), WriteError>> + Send;
}

/// An in-memory cluster of pods: patches merge into the stored pods (and record
/// [`FIELD_MANAGER`] as the owner of each annotation they set, as the API server does),
/// bindings set `spec.nodeName`. Each write waits `latency` (a simulated API round trip).
#[derive(Debug, Default)]
pub struct MemoryCluster {
    pods: Mutex<HashMap<(String, String), Pod>>,
    latency: Duration,
    fail_bind: Mutex<HashSet<String>>,
    bindings: Mutex<Vec<(String, String, String)>>,
}

impl MemoryCluster {
    /// An empty cluster whose writes each take `latency`.
    pub fn new(latency: Duration) -> Self {
        Self {
            latency,
            ..Self::default()
        }
    }

    /// Adds or replaces a pod.
    pub fn add_pod(&self, pod: Pod) {
        let key = (pod.metadata.namespace.clone(), pod.metadata.name.clone());
        self.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, pod);
    }

    /// Every pod, as stored.
    pub fn pods(&self) -> Vec<Pod> {
        self.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Makes the Binding of pod `name` fail.
    pub fn fail_bind_of(&self, name: &str) {
        self.fail_bind
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned());
    }

    /// `(namespace, name, node)` of every Binding created, in order.
    pub fn bindings(&self) -> Vec<(String, String, String)> {
        self.bindings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn wait(&self) {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }
}

impl ClusterWriter for MemoryCluster {
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, WriteError> {
        self.wait().await;
        self.pods
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| WriteError(format!("pods \"{name}\" not found in {namespace}")))
    }

    async fn annotate_pod(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<(), WriteError> {
        self.wait().await;
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        let pod = pods
            .get_mut(&(namespace.to_owned(), name.to_owned()))
            .ok_or_else(|| WriteError(format!("pods \"{name}\" not found in {namespace}")))?;
        if let Some(uid) = patch["metadata"]["uid"].as_str()
            && uid != pod.metadata.uid
        {
            return Err(WriteError(format!(
                "precondition failed: UID {uid} is not the pod's {}",
                pod.metadata.uid
            )));
        }
        let anns: BTreeMap<String, Value> =
            serde_json::from_value(patch["metadata"]["annotations"].clone()).unwrap_or_default();
        for (k, v) in anns {
            match v {
                Value::String(s) => {
                    record_manager(pod, &k, FIELD_MANAGER);
                    pod.metadata.annotations.insert(k, s);
                }
                _ => {
                    pod.metadata.annotations.remove(&k);
                }
            }
        }
        Ok(())
    }

    async fn bind(&self, binding: &Value) -> Result<(), WriteError> {
        self.wait().await;
        let ns = binding["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default();
        let name = binding["metadata"]["name"].as_str().unwrap_or_default();
        let node = binding["target"]["name"].as_str().unwrap_or_default();
        if self
            .fail_bind
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(name)
        {
            return Err(WriteError(format!(
                "pods \"{name}\": binding refused (injected)"
            )));
        }
        let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        let pod = pods
            .get_mut(&(ns.to_owned(), name.to_owned()))
            .ok_or_else(|| WriteError(format!("pods \"{name}\" not found in {ns}")))?;
        if pod.spec.extra.get("nodeName").is_some_and(|n| !n.is_null()) {
            return Err(WriteError(format!(
                "pod {ns}/{name} is already assigned to node {}",
                pod.spec.extra["nodeName"]
            )));
        }
        pod.spec
            .extra
            .insert("nodeName".into(), Value::String(node.to_owned()));
        self.bindings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((ns.to_owned(), name.to_owned(), node.to_owned()));
        Ok(())
    }
}

/// Records `manager` as the owner of `pod`'s annotation `key` in `metadata.managedFields`
/// (an `Update` entry of its own), as the API server does for a patch with that field
/// manager.
pub fn record_manager(pod: &mut Pod, key: &str, manager: &str) {
    let entries = pod
        .metadata
        .extra
        .entry("managedFields")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !entries.is_array() {
        *entries = Value::Array(Vec::new());
    }
    let Value::Array(list) = entries else { return };
    let field = format!("f:{key}");
    // Ownership moves to the last writer.
    for e in list.iter_mut() {
        if let Some(a) = e["fieldsV1"]["f:metadata"]["f:annotations"].as_object_mut() {
            a.remove(&field);
        }
    }
    let i = match list
        .iter()
        .position(|e| e["manager"].as_str() == Some(manager))
    {
        Some(i) => i,
        None => {
            list.push(
                serde_json::json!({"manager": manager, "operation": "Update",
                "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {}}),
            );
            list.len() - 1
        }
    };
    list[i]["fieldsV1"]["f:metadata"]["f:annotations"][field] = serde_json::json!({});
}

/// The API server, through kube-rs.
#[derive(Clone)]
pub struct KubeCluster {
    client: kube::Client,
}

impl KubeCluster {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    fn pods(&self, namespace: &str) -> kube::Api<k8s_openapi::api::core::v1::Pod> {
        kube::Api::namespaced(self.client.clone(), namespace)
    }
}

fn kube_err(e: impl std::fmt::Display) -> WriteError {
    WriteError(e.to_string())
}

impl ClusterWriter for KubeCluster {
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, WriteError> {
        let p = self.pods(namespace).get(name).await.map_err(kube_err)?;
        let v = serde_json::to_value(&p).map_err(kube_err)?;
        serde_json::from_value(v).map_err(kube_err)
    }

    async fn annotate_pod(
        &self,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<(), WriteError> {
        self.pods(namespace)
            .patch(
                name,
                &kube::api::PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..kube::api::PatchParams::default()
                },
                &kube::api::Patch::Merge(patch),
            )
            .await
            .map(|_| ())
            .map_err(kube_err)
    }

    async fn bind(&self, binding: &Value) -> Result<(), WriteError> {
        let ns = binding["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default();
        let name = binding["metadata"]["name"].as_str().unwrap_or_default();
        self.pods(ns)
            .create_subresource::<Value, Value>(
                "binding",
                name,
                &kube::api::PostParams::default(),
                binding,
            )
            .await
            .map(|_| ())
            .map_err(kube_err)
    }
}
