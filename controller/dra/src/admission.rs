//! The admission webhooks' decisions, on `AdmissionReview` JSON (`admission.k8s.io/v1`).
//! Pure; the HTTPS server ([`crate::server`]) looks up claims and templates and calls these.
//!
//! * **Mutating, Pod CREATE** ([`gate_patch`]): a pod that references a ResourceClaim or a
//!   ResourceClaimTemplate of the shared class gets the scheduling gate
//!   `<driver>/allocate` (a JSON patch), so kube-scheduler waits until the controller has
//!   allocated its claims.
//! * **Validating, ResourceClaim and ResourceClaimTemplate CREATE/UPDATE**
//!   ([`validate`]): every opaque config entry of this driver is strict-decoded with
//!   `fgpu_api`'s `GpuShareConfig` decoder (the one prepare uses); the first problem
//!   denies the object with the field path. A request of the shared class that asks for no
//!   memory (neither `capacity.requests.memory` nor `memory` in a config entry that
//!   applies) is admitted with a warning: it takes whole GPUs.

use fgpu_api::config::GpuShareConfig;
use fgpu_api::names::{DriverName, capacity};
use serde_json::{Value, json};

/// What a pod's `spec.resourceClaims` entry points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimSource {
    /// `resourceClaimName`.
    Claim(String),
    /// `resourceClaimTemplateName`.
    Template(String),
}

/// The claims and templates a pod references, in order.
pub fn pod_sources(pod: &Value) -> Vec<ClaimSource> {
    pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|rc| {
            if let Some(n) = rc["resourceClaimName"].as_str() {
                Some(ClaimSource::Claim(n.to_owned()))
            } else {
                rc["resourceClaimTemplateName"]
                    .as_str()
                    .map(|n| ClaimSource::Template(n.to_owned()))
            }
        })
        .collect()
}

/// The JSON patch adding `gate` to the pod's scheduling gates; `None` when it has it.
pub fn gate_patch(pod: &Value, gate: &str) -> Option<Value> {
    match pod["spec"]["schedulingGates"].as_array() {
        Some(g) if g.iter().any(|e| e["name"].as_str() == Some(gate)) => None,
        Some(_) => Some(json!([
            {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": gate}}
        ])),
        None => Some(json!([
            {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": gate}]}
        ])),
    }
}

pub use fgpu_plumbing::admission::response;

/// Why [`validate`] denies a claim or template: a configuration of this driver in it does
/// not read. The message names the object, then the field path and the problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {source}")]
pub struct Invalid {
    /// `<kind> <namespace>/<name>`.
    pub object: String,
    pub source: fgpu_api::config::ConfigError,
}

/// Checks a ResourceClaim or ResourceClaimTemplate (`kind`) of any served version for
/// `driver`: `Err` denies (its message names the object and the field path),
/// `Ok(warnings)` admits.
pub fn validate(obj: &Value, kind: &str, driver: &DriverName) -> Result<Vec<String>, Invalid> {
    let (devices, prefix) = match kind {
        "ResourceClaimTemplate" => (&obj["spec"]["spec"]["devices"], "spec.spec.devices"),
        _ => (&obj["spec"]["devices"], "spec.devices"),
    };
    let name = {
        let m = &obj["metadata"];
        let n = m["name"]
            .as_str()
            .or_else(|| m["generateName"].as_str())
            .unwrap_or("<unnamed>");
        match m["namespace"].as_str() {
            Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{n}"),
            _ => format!("{kind} {n}"),
        }
    };
    // (requests it applies to; empty = all, whether it sets memory)
    let mut ours: Vec<(Vec<String>, bool)> = Vec::new();
    for (i, e) in devices["config"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if e["opaque"]["driver"].as_str() != Some(driver.as_str()) {
            continue;
        }
        let path = format!("{prefix}.config[{i}].opaque.parameters");
        let c =
            GpuShareConfig::from_value(&e["opaque"]["parameters"], &path).map_err(|source| {
                Invalid {
                    object: name.clone(),
                    source,
                }
            })?;
        let requests = e["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r.as_str().map(str::to_owned))
            .collect();
        ours.push((requests, c.memory.is_some()));
    }
    let class = driver.shared_class();
    let mut warnings = Vec::new();
    for (i, r) in devices["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let req_name = r["name"].as_str().unwrap_or_default();
        let exact = if r["exactly"].is_object() {
            &r["exactly"]
        } else {
            r
        };
        if exact["deviceClassName"].as_str() != Some(class.as_str()) {
            continue;
        }
        let asks_capacity = !exact["capacity"]["requests"][capacity::MEMORY].is_null();
        let asks_config = ours.iter().any(|(reqs, memory)| {
            *memory && (reqs.is_empty() || reqs.iter().any(|q| q == req_name))
        });
        if !asks_capacity && !asks_config {
            warnings.push(format!(
                "{name}: {prefix}.requests[{i}] ({req_name}) of class {class} asks for no memory: it gets whole GPUs; set capacity.requests.memory (e.g. 10Gi) to share one"
            ));
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver() -> DriverName {
        DriverName::new("gpu.fgpu.dev").unwrap()
    }

    fn claim(params: Value) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "shared.gpu.fgpu.dev"}}],
                "config": [
                    {"opaque": {"driver": "other.dev", "parameters": {"anything": 1}}},
                    {"requests": ["gpu"], "opaque": {"driver": "gpu.fgpu.dev", "parameters": params}}
                ]
            }}
        })
    }

    #[test]
    fn valid_config_with_memory_is_admitted_without_warnings() {
        let c = claim(
            json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": "4Gi"}),
        );
        assert_eq!(validate(&c, "ResourceClaim", &driver()), Ok(vec![]));
    }

    #[test]
    fn bad_configs_are_denied_with_the_field_path() {
        let cases = [
            (
                json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "cores": 140}),
                "ResourceClaim ns/c: spec.devices.config[1].opaque.parameters.cores:",
            ),
            (
                json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memroy": "1Gi"}),
                "ResourceClaim ns/c: spec.devices.config[1].opaque.parameters.memroy:",
            ),
            (
                json!("10Gi"),
                "ResourceClaim ns/c: spec.devices.config[1].opaque.parameters:",
            ),
        ];
        for (params, prefix) in cases {
            let e = validate(&claim(params.clone()), "ResourceClaim", &driver())
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(prefix), "{params}: {e}");
        }
    }

    #[test]
    fn template_paths_and_no_memory_warning() {
        let t = json!({
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "a", "deviceClassName": "shared.gpu.fgpu.dev"},
                {"name": "b", "exactly": {"deviceClassName": "shared.gpu.fgpu.dev", "capacity": {"requests": {"memory": "1Gi"}}}},
                {"name": "c", "exactly": {"deviceClassName": "gpu.fgpu.dev"}}
            ]}}}
        });
        let w = validate(&t, "ResourceClaimTemplate", &driver()).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("ResourceClaimTemplate ns/t: spec.spec.devices.requests[0] (a)"),
            "{w:?}"
        );
        let mut bad = t.clone();
        bad["spec"]["spec"]["devices"]["config"] = json!([{"opaque": {"driver": "gpu.fgpu.dev", "parameters": {"kind": "GpuShareConfig"}}}]);
        let e = validate(&bad, "ResourceClaimTemplate", &driver())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("ResourceClaimTemplate ns/t: spec.spec.devices.config[0].opaque.parameters.apiVersion:"), "{e}");
    }

    #[test]
    fn gate_patch_adds_once() {
        let gate = "gpu.fgpu.dev/allocate";
        assert_eq!(
            gate_patch(&json!({"spec": {}}), gate),
            Some(
                json!([{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": gate}]}])
            )
        );
        assert_eq!(
            gate_patch(&json!({"spec": {"schedulingGates": [{"name": "x"}]}}), gate),
            Some(
                json!([{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": gate}}])
            )
        );
        assert_eq!(
            gate_patch(
                &json!({"spec": {"schedulingGates": [{"name": gate}]}}),
                gate
            ),
            None
        );
    }

    #[test]
    fn response_echoes_uid_and_encodes_the_patch() {
        let review = json!({"apiVersion": "admission.k8s.io/v1", "request": {"uid": "u-1"}});
        let r = response(&review, true, None, Some(&json!([])), &[]);
        assert_eq!(r["response"]["uid"], "u-1");
        assert_eq!(r["response"]["patch"], "W10=");
        let d = response(&review, false, Some("no"), None, &["w".into()]);
        assert_eq!(d["response"]["allowed"], false);
        assert_eq!(d["response"]["status"]["message"], "no");
        assert_eq!(d["response"]["warnings"][0], "w");
    }

    #[test]
    fn pod_sources_in_order() {
        let p = json!({"spec": {"resourceClaims": [
            {"name": "a", "resourceClaimTemplateName": "t"},
            {"name": "b", "resourceClaimName": "c"},
            {"name": "x"}
        ]}});
        assert_eq!(
            pod_sources(&p),
            vec![
                ClaimSource::Template("t".into()),
                ClaimSource::Claim("c".into())
            ]
        );
    }
}
