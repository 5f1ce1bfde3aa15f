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
//!
//!   Priority policy: a config entry may not set `allowHighPriority` (only a DeviceClass
//!   may), and an entry asking `priority: high` is denied unless every DeviceClass of the
//!   requests it applies to allows it (`allowHighPriority: true` in its config of this
//!   driver). The server looks those classes up ([`high_priority_classes`] says which) and
//!   passes what it found as a [`ClassPolicy`]; the node's prepare checks the same rule on
//!   the allocation.

use std::collections::BTreeMap;

use fgpu_api::config::{ConfigError, ConfigProblem, GpuShareConfig, Priority};
use fgpu_api::dra::claim::{DeviceClaim, DeviceClaimConfiguration, ObjectMeta};
use fgpu_api::dra::class::DeviceClass;
use fgpu_api::dra::tolerant;
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

/// What the webhook learnt of a DeviceClass: whether its configuration of this driver says
/// `allowHighPriority: true`, or why it could not tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClassLookup {
    /// The class exists; whether it allows `priority: high`.
    Found(bool),
    /// There is no such class.
    NotFound,
    /// The lookup failed (the message).
    Failed(String),
}

/// The looked-up classes by name.
pub type ClassPolicy = BTreeMap<String, ClassLookup>;

/// Whether DeviceClass `class` (any served version) allows `priority: high`: one of its
/// `spec.config[]` entries of `driver` decodes and sets `allowHighPriority: true`.
pub fn class_allows_high(class: &DeviceClass, driver: &DriverName) -> bool {
    class
        .spec
        .config
        .iter()
        .filter_map(|e| e.opaque.as_ref())
        .filter(|o| o.driver == driver.as_str())
        .any(|o| GpuShareConfig::from_value(&o.parameters, "").is_ok_and(|c| c.allow_high_priority))
}

/// The devices part of a claim or template (`kind`), typed, and its field path.
fn devices_of(obj: &Value, kind: &str) -> (DeviceClaim, &'static str) {
    match kind {
        "ResourceClaimTemplate" => (
            tolerant::from_value(&obj["spec"]["spec"]["devices"]),
            "spec.spec.devices",
        ),
        _ => (
            tolerant::from_value(&obj["spec"]["devices"]),
            "spec.devices",
        ),
    }
}

/// Each request (and `<request>/<subrequest>` of `firstAvailable`) with its DeviceClass.
fn request_class_names(devices: &DeviceClaim) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in &devices.requests {
        let name = r.name.clone().unwrap_or_default();
        if let Some(c) = r.exact().class_name() {
            out.push((name.clone(), c.to_owned()));
        }
        for sub in r.first_available.iter().flatten() {
            if let Some(c) = sub.exact.class_name() {
                let s = sub.name.as_deref().unwrap_or_default();
                out.push((format!("{name}/{s}"), c.to_owned()));
            }
        }
    }
    out
}

/// Whether a config entry naming `requests` (empty: all) applies to `request`
/// (`<req>` or `<req>/<sub>`).
fn entry_applies(requests: &[String], request: &str) -> bool {
    let parent = request.split_once('/').map_or(request, |(p, _)| p);
    requests.is_empty() || requests.iter().any(|q| q == request || q == parent)
}

/// This driver's config entries of `devices`, with their index and parameters.
fn our_entries<'d>(
    devices: &'d DeviceClaim,
    driver: &DriverName,
) -> impl Iterator<Item = (usize, &'d DeviceClaimConfiguration, &'d Value)> {
    devices.config.iter().enumerate().filter_map(move |(i, e)| {
        let o = e.opaque.as_ref().filter(|o| o.driver == driver.as_str())?;
        Some((i, e, &o.parameters))
    })
}

/// The requested configs of `driver` in the object that ask `priority: high`, as (entry
/// index, the requests it names).
fn high_priority_entries(devices: &DeviceClaim, driver: &DriverName) -> Vec<(usize, Vec<String>)> {
    our_entries(devices, driver)
        .filter(|(_, _, params)| {
            GpuShareConfig::from_value(params, "").is_ok_and(|c| c.priority == Priority::High)
        })
        .map(|(i, e, _)| (i, e.requests.clone()))
        .collect()
}

/// The DeviceClasses [`validate`] needs to know about: those of the requests that a config
/// entry asking `priority: high` applies to (none for most claims: nothing to look up).
pub fn high_priority_classes(obj: &Value, kind: &str, driver: &DriverName) -> Vec<String> {
    let (devices, _) = devices_of(obj, kind);
    let entries = high_priority_entries(&devices, driver);
    let mut classes: Vec<String> = request_class_names(&devices)
        .into_iter()
        .filter(|(req, _)| entries.iter().any(|(_, reqs)| entry_applies(reqs, req)))
        .map(|(_, c)| c)
        .collect();
    classes.sort();
    classes.dedup();
    classes
}

/// How messages name the claim or template `obj` of `kind`: `<kind> <namespace>/<name>`
/// (its `generateName` before it has a name).
fn object_name(obj: &Value, kind: &str) -> String {
    let m: ObjectMeta = tolerant::from_value(&obj["metadata"]);
    let n = match (m.name.as_str(), &m.generate_name) {
        ("", Some(g)) => g.as_str(),
        ("", None) => "<unnamed>",
        (n, _) => n,
    };
    if m.namespace.is_empty() {
        format!("{kind} {n}")
    } else {
        format!("{kind} {}/{n}", m.namespace)
    }
}

/// The object an `AdmissionReview` of `/validate-claims` asks about and its kind (a review
/// that names none is read as a ResourceClaim).
pub fn review_object(review: &Value) -> (&str, &Value) {
    let kind = review["request"]["kind"]["kind"]
        .as_str()
        .unwrap_or("ResourceClaim");
    (kind, &review["request"]["object"])
}

/// The answer to a `/validate-claims` review: [`validate`] of its object, admitted with the
/// warnings or denied with the message. `classes`: what the server found of the classes
/// [`high_priority_classes`] named.
pub fn answer_claim_review(review: &Value, driver: &DriverName, classes: &ClassPolicy) -> Value {
    let (kind, object) = review_object(review);
    match validate(object, kind, driver, classes) {
        Ok(w) => response(review, true, None, None, &w),
        Err(e) => {
            let m = e.to_string();
            tracing::info!("denied: {m}");
            response(review, false, Some(&m), None, &[])
        }
    }
}

/// Checks a ResourceClaim or ResourceClaimTemplate (`kind`) of any served version for
/// `driver`: `Err` denies (its message names the object and the field path),
/// `Ok(warnings)` admits. `classes` holds what the server found of the classes
/// [`high_priority_classes`] named (a class missing from it does not allow `high`).
pub fn validate(
    obj: &Value,
    kind: &str,
    driver: &DriverName,
    classes: &ClassPolicy,
) -> Result<Vec<String>, Invalid> {
    let (devices, prefix) = devices_of(obj, kind);
    let name = object_name(obj, kind);
    let ours = check_config(&devices, prefix, &name, driver, classes)?;
    Ok(memory_warnings(&devices, prefix, &name, driver, &ours))
}

/// One config entry of this driver that passed [`check_config`]: the requests it applies
/// to (empty = all) and whether it sets memory.
struct Checked {
    requests: Vec<String>,
    memory: bool,
}

/// Strict-decodes every config entry of this driver in `devices` (at `prefix`, of the
/// object `name`) and applies the priority policy; the first problem denies.
fn check_config(
    devices: &DeviceClaim,
    prefix: &str,
    name: &str,
    driver: &DriverName,
    classes: &ClassPolicy,
) -> Result<Vec<Checked>, Invalid> {
    let mut ours = Vec::new();
    for (i, e, params) in our_entries(devices, driver) {
        let path = format!("{prefix}.config[{i}].opaque.parameters");
        let c = GpuShareConfig::from_value(params, &path).map_err(|source| Invalid {
            object: name.to_owned(),
            source,
        })?;
        let deny = |field: &str, problem| Invalid {
            object: name.to_owned(),
            source: ConfigError {
                path: format!("{path}.{field}"),
                problem,
            },
        };
        if c.allow_high_priority {
            return Err(deny("allowHighPriority", ConfigProblem::ClassOnly));
        }
        if c.priority == Priority::High
            && let Some((request, class)) = high_priority_refused(devices, &e.requests, classes)
        {
            return Err(deny(
                "priority",
                ConfigProblem::HighPriorityNotAllowed { request, class },
            ));
        }
        ours.push(Checked {
            requests: e.requests.clone(),
            memory: c.memory.is_some(),
        });
    }
    Ok(ours)
}

/// The first request that an entry naming `requests` applies to whose DeviceClass does not
/// allow `priority: high`, with why (as the message names the class).
fn high_priority_refused(
    devices: &DeviceClaim,
    requests: &[String],
    classes: &ClassPolicy,
) -> Option<(String, String)> {
    request_class_names(devices)
        .into_iter()
        .filter(|(req, _)| entry_applies(requests, req))
        .find_map(|(req, class)| {
            let why = match classes.get(&class) {
                Some(ClassLookup::Found(true)) => return None,
                Some(ClassLookup::Found(false)) => format!("DeviceClass {class}"),
                Some(ClassLookup::NotFound) => format!("DeviceClass {class} (not found)"),
                Some(ClassLookup::Failed(e)) => {
                    format!("DeviceClass {class} (could not be read: {e})")
                }
                None => format!("DeviceClass {class} (not looked up)"),
            };
            Some((req, why))
        })
}

/// A warning per request of the shared class that asks for no memory, neither in
/// `capacity.requests.memory` nor in a config entry of `ours` that applies to it.
fn memory_warnings(
    devices: &DeviceClaim,
    prefix: &str,
    name: &str,
    driver: &DriverName,
    ours: &[Checked],
) -> Vec<String> {
    let class = driver.shared_class();
    let mut warnings = Vec::new();
    for (i, r) in devices.requests.iter().enumerate() {
        let req_name = r.name.as_deref().unwrap_or_default();
        let exact = r.exact();
        if exact.class_name() != Some(class.as_str()) {
            continue;
        }
        let asks_capacity = exact
            .capacity
            .requests
            .as_ref()
            .and_then(|m| m.get(capacity::MEMORY))
            .is_some_and(|v| !v.is_null());
        let asks_config = ours.iter().any(|c| {
            c.memory && (c.requests.is_empty() || c.requests.iter().any(|q| q == req_name))
        });
        if !asks_capacity && !asks_config {
            warnings.push(format!(
                "{name}: {prefix}.requests[{i}] ({req_name}) of class {class} asks for no memory: it gets whole GPUs; set capacity.requests.memory (e.g. 10Gi) to share one"
            ));
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON class `c` typed, as the server reads it.
    fn typed(c: Value) -> DeviceClass {
        serde_json::from_value(c).unwrap()
    }

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
        assert_eq!(
            validate(&c, "ResourceClaim", &driver(), &ClassPolicy::new()),
            Ok(vec![])
        );
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
            let e = validate(
                &claim(params.clone()),
                "ResourceClaim",
                &driver(),
                &ClassPolicy::new(),
            )
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
        let w = validate(&t, "ResourceClaimTemplate", &driver(), &ClassPolicy::new()).unwrap();
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("ResourceClaimTemplate ns/t: spec.spec.devices.requests[0] (a)"),
            "{w:?}"
        );
        let mut bad = t.clone();
        bad["spec"]["spec"]["devices"]["config"] = json!([{"opaque": {"driver": "gpu.fgpu.dev", "parameters": {"kind": "GpuShareConfig"}}}]);
        let e = validate(
            &bad,
            "ResourceClaimTemplate",
            &driver(),
            &ClassPolicy::new(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("ResourceClaimTemplate ns/t: spec.spec.devices.config[0].opaque.parameters.apiVersion:"), "{e}");
    }

    /// A tenant's claim asking `priority: high` (or granting itself the permission) where
    /// the admin did not allow it.
    #[test]
    fn high_priority_needs_the_class() {
        let high = json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": "1Gi", "priority": "high"});
        let c = claim(high.clone());
        assert_eq!(
            high_priority_classes(&c, "ResourceClaim", &driver()),
            ["shared.gpu.fgpu.dev"]
        );
        let with = |l: ClassLookup| ClassPolicy::from([("shared.gpu.fgpu.dev".into(), l)]);
        let denied = [
            (ClassPolicy::new(), "(not looked up)"),
            (
                with(ClassLookup::Found(false)),
                "DeviceClass shared.gpu.fgpu.dev does not",
            ),
            (with(ClassLookup::NotFound), "(not found)"),
            (
                with(ClassLookup::Failed("forbidden".into())),
                "(could not be read: forbidden)",
            ),
        ];
        for (classes, detail) in denied {
            let e = validate(&c, "ResourceClaim", &driver(), &classes)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(r#"ResourceClaim ns/c: spec.devices.config[1].opaque.parameters.priority: "high" is not allowed for request "gpu": "#),
                "{e}"
            );
            assert!(e.contains(detail), "{detail}: {e}");
        }
        assert_eq!(
            validate(
                &c,
                "ResourceClaim",
                &driver(),
                &with(ClassLookup::Found(true))
            ),
            Ok(vec![])
        );
        // Granting itself the permission.
        let mut selfish = high.clone();
        selfish["allowHighPriority"] = json!(true);
        let e = validate(
            &claim(selfish),
            "ResourceClaim",
            &driver(),
            &with(ClassLookup::Found(true)),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("ResourceClaim ns/c: spec.devices.config[1].opaque.parameters.allowHighPriority: may be set only in a DeviceClass's configuration"),
            "{e}"
        );
        // Normal priority needs no lookup.
        let normal = claim(
            json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": "1Gi"}),
        );
        assert!(high_priority_classes(&normal, "ResourceClaim", &driver()).is_empty());
        // A template's subrequests: every alternative's class must allow it.
        let t = json!({
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"spec": {"devices": {
                "requests": [{"name": "g", "firstAvailable": [
                    {"name": "hi", "deviceClassName": "high.gpu.fgpu.dev"},
                    {"name": "lo", "deviceClassName": "shared.gpu.fgpu.dev"}
                ]}],
                "config": [{"requests": ["g"], "opaque": {"driver": "gpu.fgpu.dev", "parameters": high}}]
            }}}
        });
        assert_eq!(
            high_priority_classes(&t, "ResourceClaimTemplate", &driver()),
            ["high.gpu.fgpu.dev", "shared.gpu.fgpu.dev"]
        );
        let mut classes = with(ClassLookup::Found(false));
        classes.insert("high.gpu.fgpu.dev".into(), ClassLookup::Found(true));
        let e = validate(&t, "ResourceClaimTemplate", &driver(), &classes)
            .unwrap_err()
            .to_string();
        assert!(e.contains(r#"for request "g/lo""#), "{e}");
        classes.insert("shared.gpu.fgpu.dev".into(), ClassLookup::Found(true));
        assert!(validate(&t, "ResourceClaimTemplate", &driver(), &classes).is_ok());
    }

    #[test]
    fn class_allows_high_reads_its_config() {
        let class = |params: Value| {
            typed(json!({"spec": {"config": [
                {"opaque": {"driver": "other.dev", "parameters": {"allowHighPriority": true}}},
                {"opaque": {"driver": "gpu.fgpu.dev", "parameters": params}}
            ]}}))
        };
        let ok = json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "allowHighPriority": true});
        assert!(class_allows_high(&class(ok), &driver()));
        let off = json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig"});
        assert!(!class_allows_high(&class(off), &driver()));
        // Another driver's parameters do not count, nor does an undecodable entry.
        assert!(!class_allows_high(
            &class(json!({"allowHighPriority": true})),
            &driver()
        ));
        assert!(!class_allows_high(&typed(json!({"spec": {}})), &driver()));
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
