//! kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go types carry no JSON tags, so their keys are the Go field names, PascalCase
//! (`NodeNames`, `PodUID`); that is what these types read and write. Absent optional values
//! are written as `null`, as Go writes nil pointers and maps, and `null` is read as empty.
//!
//! The Pod and Node payloads are kept small: the fields the extender needs are typed, and
//! everything else is kept verbatim in `extra` maps, so nothing is lost if a value is
//! passed on. With `nodeCacheCapable: true` the scheduler sends `NodeNames` and no `Nodes`.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// Highest score a prioritize call may give a host (`MaxExtenderPriority`).
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// Request body of the filter and prioritize calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(rename = "Pod", default, deserialize_with = "null_as_default")]
    pub pod: Pod,
    /// Candidate nodes in full; sent only when the extender is not node-cache capable.
    #[serde(rename = "Nodes", default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names; sent only when the extender is node-cache capable.
    #[serde(rename = "NodeNames", default)]
    pub node_names: Option<Vec<String>>,
}

impl ExtenderArgs {
    /// Names of the candidate nodes, from whichever of `NodeNames` and `Nodes` was sent.
    pub fn candidate_names(&self) -> Vec<&str> {
        if let Some(names) = &self.node_names {
            names.iter().map(String::as_str).collect()
        } else if let Some(nodes) = &self.nodes {
            nodes
                .items
                .iter()
                .map(|n| n.metadata.name.as_str())
                .collect()
        } else {
            Vec::new()
        }
    }
}

/// Response body of the filter call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// Nodes that passed, in full (answer in the form the request used).
    #[serde(rename = "Nodes", default)]
    pub nodes: Option<NodeList>,
    /// Names of the nodes that passed (node-cache-capable form).
    #[serde(rename = "NodeNames", default)]
    pub node_names: Option<Vec<String>>,
    /// Nodes that failed, with the reason; preemption may still help them.
    #[serde(rename = "FailedNodes", default, deserialize_with = "null_as_default")]
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes that failed in a way preemption cannot fix, with the reason.
    #[serde(
        rename = "FailedAndUnresolvableNodes",
        default,
        deserialize_with = "null_as_default"
    )]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// An error for the whole call; the scheduler then fails the pod's attempt.
    #[serde(rename = "Error", default, deserialize_with = "null_as_default")]
    pub error: String,
}

/// One host's score from a prioritize call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// Node name.
    #[serde(rename = "Host")]
    pub host: String,
    /// Score, 0 to [`MAX_EXTENDER_PRIORITY`].
    #[serde(rename = "Score")]
    pub score: i64,
}

/// Response body of the prioritize call.
pub type HostPriorityList = Vec<HostPriority>;

/// Request body of the bind call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    /// Name of the pod to bind.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// Namespace of the pod.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// UID of the pod.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// Node to bind it to.
    #[serde(rename = "Node")]
    pub node: String,
}

/// Response body of the bind call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Empty on success.
    #[serde(rename = "Error", default, deserialize_with = "null_as_default")]
    pub error: String,
}

/// Object metadata: the fields the extender reads, the rest kept in `extra`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// `metadata.name`.
    #[serde(default)]
    pub name: String,
    /// `metadata.namespace` (empty for nodes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `metadata.uid`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// `metadata.labels`.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub annotations: BTreeMap<String, String>,
    /// Every other metadata field, verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A Pod, reduced to what GPU placement needs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pod {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`.
    #[serde(default)]
    pub spec: PodSpec,
    /// `apiVersion`, `kind`, `status` and anything else, verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A Pod's spec: its containers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// `spec.containers`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub containers: Vec<Container>,
    /// `spec.initContainers`.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_as_default"
    )]
    pub init_containers: Vec<Container>,
    /// Every other spec field, verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A container: its name and resources.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Container {
    /// `name`.
    #[serde(default)]
    pub name: String,
    /// `resources`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub resources: ResourceRequirements,
    /// Every other container field, verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A container's `resources`. Values are Kubernetes quantity strings; parse them with
/// [`crate::quantity::parse_u64`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceRequirements {
    /// `resources.limits`.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "quantity_map"
    )]
    pub limits: BTreeMap<String, String>,
    /// `resources.requests`.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "quantity_map"
    )]
    pub requests: BTreeMap<String, String>,
    /// Every other field (`claims`), verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Container {
    /// The container's value for extended resource `name`: its limit, else its request
    /// (extended resources may not be overcommitted, so both are equal when both are set).
    pub fn resource(&self, name: &str) -> Option<&str> {
        self.resources
            .limits
            .get(name)
            .or_else(|| self.resources.requests.get(name))
            .map(String::as_str)
    }
}

/// A `NodeList`: its items.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    /// `items`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub items: Vec<Node>,
    /// `apiVersion`, `kind`, `metadata`, verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A Node: its metadata (name, labels, annotations), the rest verbatim.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`, `status` and anything else, verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Reads `null` as the type's default (Go writes nil maps, slices and pointers as `null`).
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Reads a resource list; quantities are strings, but a bare JSON number is accepted too.
fn quantity_map<'de, D>(deserializer: D) -> Result<BTreeMap<String, String>, D::Error>
where
    D: Deserializer<'de>,
{
    let map: Option<BTreeMap<String, Value>> = Option::deserialize(deserializer)?;
    map.unwrap_or_default()
        .into_iter()
        .map(|(name, value)| match value {
            Value::String(text) => Ok((name, text)),
            Value::Number(number) => Ok((name, number.to_string())),
            other => Err(serde::de::Error::custom(format!(
                "resource {name:?}: expected a quantity string such as \"1\" or \"10Gi\", found {}",
                crate::config::JsonType::of(&other)
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A filter request as kube-scheduler sends it with `nodeCacheCapable: true`.
    const FILTER_NODE_CACHE: &str = r#"{
      "Pod": {
        "metadata": {
          "name": "train-0",
          "namespace": "ml",
          "uid": "6f1c2a9e-6a1b-4c1e-9a53-0d5c7a8e9b10",
          "creationTimestamp": null,
          "annotations": {"nvidia.com/use-gputype": "A100,H100"}
        },
        "spec": {
          "containers": [{
            "name": "main",
            "image": "pytorch:2",
            "resources": {
              "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "30"},
              "requests": {"cpu": "1", "nvidia.com/gpu": "1"}
            }
          }],
          "schedulerName": "default-scheduler"
        },
        "status": {}
      },
      "Nodes": null,
      "NodeNames": ["node-a", "node-b"]
    }"#;

    #[test]
    fn filter_request_with_node_names() {
        let args: ExtenderArgs = serde_json::from_str(FILTER_NODE_CACHE).unwrap();
        assert_eq!(args.pod.metadata.name, "train-0");
        assert_eq!(args.pod.metadata.namespace, "ml");
        assert_eq!(
            args.pod.metadata.uid,
            "6f1c2a9e-6a1b-4c1e-9a53-0d5c7a8e9b10"
        );
        assert_eq!(
            args.pod.metadata.annotations["nvidia.com/use-gputype"],
            "A100,H100"
        );
        let main = &args.pod.spec.containers[0];
        assert_eq!(main.resource("nvidia.com/gpumem"), Some("10240"));
        assert_eq!(main.resource("nvidia.com/gpu"), Some("1"));
        assert_eq!(main.resource("cpu"), Some("1"));
        assert_eq!(main.extra["image"], "pytorch:2");
        assert_eq!(args.pod.spec.extra["schedulerName"], "default-scheduler");
        assert!(args.nodes.is_none());
        assert_eq!(args.candidate_names(), ["node-a", "node-b"]);
        // Unknown fields survive a round trip.
        let again = serde_json::to_value(&args).unwrap();
        assert_eq!(again["Pod"]["status"], json!({}));
        assert_eq!(again["Pod"]["metadata"]["creationTimestamp"], Value::Null);
    }

    #[test]
    fn filter_request_with_full_nodes() {
        let body = json!({
            "Pod": {"metadata": {"name": "p", "namespace": "default", "uid": "u"}, "spec": {"containers": []}},
            "Nodes": {
                "metadata": {"resourceVersion": "12"},
                "items": [
                    {"metadata": {"name": "node-a", "annotations": {"gpu.fgpu.dev/node-gpus": "[]"}}, "status": {"allocatable": {"nvidia.com/gpu": "40"}}},
                    {"metadata": {"name": "node-b", "labels": {"zone": "z1"}}}
                ]
            },
            "NodeNames": null
        });
        let args: ExtenderArgs = serde_json::from_value(body).unwrap();
        assert!(args.node_names.is_none());
        assert_eq!(args.candidate_names(), ["node-a", "node-b"]);
        let nodes = args.nodes.as_ref().unwrap();
        assert_eq!(
            nodes.items[0].metadata.annotations["gpu.fgpu.dev/node-gpus"],
            "[]"
        );
        assert_eq!(nodes.items[1].metadata.labels["zone"], "z1");
        assert_eq!(
            nodes.items[0].extra["status"]["allocatable"]["nvidia.com/gpu"],
            "40"
        );
    }

    #[test]
    fn filter_result_is_pascal_case() {
        let result = ExtenderFilterResult {
            node_names: Some(vec!["node-a".into()]),
            failed_nodes: [("node-b".to_owned(), "no GPU with 10Gi free".to_owned())].into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            json!({
                "Nodes": null,
                "NodeNames": ["node-a"],
                "FailedNodes": {"node-b": "no GPU with 10Gi free"},
                "FailedAndUnresolvableNodes": {},
                "Error": ""
            })
        );
        // As Go writes an empty result: nil maps and pointers are null.
        let go: ExtenderFilterResult = serde_json::from_str(
            r#"{"Nodes":null,"NodeNames":null,"FailedNodes":null,"FailedAndUnresolvableNodes":null,"Error":""}"#,
        )
        .unwrap();
        assert_eq!(go, ExtenderFilterResult::default());
    }

    #[test]
    fn prioritize_result() {
        let list: HostPriorityList = vec![
            HostPriority {
                host: "node-a".into(),
                score: MAX_EXTENDER_PRIORITY,
            },
            HostPriority {
                host: "node-b".into(),
                score: 3,
            },
        ];
        let text = serde_json::to_string(&list).unwrap();
        assert_eq!(
            text,
            r#"[{"Host":"node-a","Score":10},{"Host":"node-b","Score":3}]"#
        );
        assert_eq!(
            serde_json::from_str::<HostPriorityList>(&text).unwrap(),
            list
        );
    }

    #[test]
    fn binding() {
        let args: ExtenderBindingArgs = serde_json::from_str(
            r#"{"PodName":"train-0","PodNamespace":"ml","PodUID":"6f1c2a9e","Node":"node-a"}"#,
        )
        .unwrap();
        assert_eq!(
            args,
            ExtenderBindingArgs {
                pod_name: "train-0".into(),
                pod_namespace: "ml".into(),
                pod_uid: "6f1c2a9e".into(),
                node: "node-a".into(),
            }
        );
        assert_eq!(
            serde_json::to_string(&args).unwrap(),
            r#"{"PodName":"train-0","PodNamespace":"ml","PodUID":"6f1c2a9e","Node":"node-a"}"#
        );
        let ok = ExtenderBindingResult::default();
        assert_eq!(serde_json::to_string(&ok).unwrap(), r#"{"Error":""}"#);
        let failed = ExtenderBindingResult {
            error: "conflict".into(),
        };
        assert_eq!(
            serde_json::to_string(&failed).unwrap(),
            r#"{"Error":"conflict"}"#
        );
    }

    #[test]
    fn numeric_quantities_are_read_as_text() {
        let c: Container = serde_json::from_value(json!({
            "name": "c",
            "resources": {"limits": {"nvidia.com/gpumem": 4096}, "requests": null}
        }))
        .unwrap();
        assert_eq!(c.resource("nvidia.com/gpumem"), Some("4096"));
    }
}
