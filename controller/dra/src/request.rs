//! A pending claim of the shared class, with its pod's annotations → the engine's
//! [`Request`] and [`Policy`]. A claim of the MIG class is read the same way
//! ([`requests_of_class`]): its memory and cores become the MIG placement's request
//! ([`crate::mig`]).
//!
//! The controller allocates claims whose device requests (one or more; [`requests_in_class`]
//! gives one [`PendingClaim`] per request, and per alternative of a `firstAvailable`
//! request, named `<request>/<subrequest>` as the results name them) are all of the shared
//! class (`shared.<driver>`), in `ExactCount` mode (`count`, default 1), without admin
//! access or derived attributes. CEL `selectors` are compiled here ([`crate::selector`];
//! one that does not compile is refused, naming
//! `spec.devices.requests[i].exactly.selectors[j].cel.expression`) and evaluated against
//! each device at placement. [`constraints`] reads `spec.devices.constraints`
//! (`matchAttribute` of `<driver>/numaNode` or `resource.kubernetes.io/pcieRoot`; anything
//! else refused by field). What each GPU of a request gives (per field, later wins):
//!
//! 1. this driver's `GpuShareConfig`s in the DeviceClass's `spec.config` (they apply to
//!    every request of the class);
//! 2. this driver's `GpuShareConfig`s in `spec.devices.config` that apply to the request
//!    (entries naming `<request>` apply to each of its sub-requests, `<request>/<sub>` to
//!    that one);
//! 3. the request's `capacity.requests` (`memory`, `cores`), which the scheduler would
//!    honour too.
//!
//! Memory becomes [`GpuShare::Memory`]; without memory the request takes whole GPUs
//! ([`GpuShare::Whole`]). Cores are a percent 0–100.
//!
//! The policy starts from the configured default; the pod annotations
//! `hami.io/node-scheduler-policy` and `hami.io/gpu-scheduler-policy` (`binpack` or
//! `spread`) replace its node and GPU level. `nvidia.com/use-gputype`,
//! `nvidia.com/nouse-gputype` and `nvidia.com/use-gpuuuid` (comma-separated) restrict the
//! GPUs. `GpuShareConfig` has no policy field, so a claim cannot choose one yet.

use std::collections::BTreeMap;
use std::sync::Arc;

use fgpu_api::config::{CorePercent, GpuShareConfig};
use fgpu_api::dra::claim::{
    DeviceClaimConfiguration, DeviceConstraint, DeviceRequest, DeviceSubRequest,
    ExactDeviceRequest, ResourceClaim,
};
use fgpu_api::dra::class::{DeviceClass, DeviceClassConfiguration};
use fgpu_api::names::{DriverName, attr, capacity};
use fgpu_driver::engine::{GpuShare, Policy, Request, Toleration};
use fgpu_driver::hami;
use serde_json::Value;

use crate::{claim_key, quantity_u64, selector};

pub use fgpu_driver::hami::RequestError;

/// A pending claim's request (or one alternative of a `firstAvailable` request), ready for
/// the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingClaim {
    /// `namespace/name`.
    pub key: String,
    /// The grant id: the claim's UID (else its key).
    pub id: String,
    /// The name results carry: the request's, or `<request>/<subrequest>` for an
    /// alternative of a `firstAvailable` request.
    pub request_name: String,
    /// The claim request's name (`request_name` without `/<subrequest>`).
    pub parent: String,
    /// Index of the claim request in `spec.devices.requests`; the alternatives of one
    /// `firstAvailable` request share it and come in their order.
    pub request_index: usize,
    pub request: Request,
    pub policy: Policy,
    /// The request's CEL selectors: a device is allowed when every one is true.
    pub selectors: Vec<Selector>,
    /// The effective configuration of this driver for the request (priority and
    /// oversubscribe are passed on; memory and cores are replaced by the grant).
    pub config: GpuShareConfig,
    /// The claim's `spec.devices.config` entries, to copy into the allocation.
    pub claim_config: Vec<DeviceClaimConfiguration>,
    /// The class's `spec.config` entries, to copy into the allocation (`FromClass`).
    pub class_config: Vec<DeviceClassConfiguration>,
}

/// One CEL selector of a request, compiled.
#[derive(Clone)]
pub struct Selector {
    /// Its field in the claim: `spec.devices.requests[i].exactly.selectors[j].cel.expression`.
    pub path: String,
    pub expression: String,
    pub compiled: Arc<selector::Compiled>,
}

impl PartialEq for Selector {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.expression == other.expression
    }
}

impl Eq for Selector {}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector")
            .field("path", &self.path)
            .field("expression", &self.expression)
            .finish()
    }
}

/// The attribute a `matchAttribute` constraint names, of those the controller places by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatchAttribute {
    /// `<driver>/numaNode`.
    NumaNode,
    /// `resource.kubernetes.io/pcieRoot`.
    PcieRoot,
}

/// One entry of `spec.devices.constraints`: the devices of the requests it names (all
/// when none) share one value of the attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constraint {
    /// `spec.devices.constraints[i]`.
    pub path: String,
    /// Request names (`<request>` or `<request>/<subrequest>`); empty: every request.
    pub requests: Vec<String>,
    pub attribute: MatchAttribute,
}

impl Constraint {
    /// Whether the constraint covers `p` (a request or one alternative of one).
    pub fn applies(&self, p: &PendingClaim) -> bool {
        self.requests.is_empty()
            || self
                .requests
                .iter()
                .any(|r| *r == p.parent || *r == p.request_name)
    }
}

/// Reads `claim` (any served version, exactly one request) for `driver`, with the
/// annotations of the pod that uses it; `default_policy` applies where the pod says nothing.
/// No class configuration ([`requests_in_class`] takes one).
pub fn from_claim(
    claim: &ResourceClaim,
    pod_annotations: &BTreeMap<String, String>,
    pod_key: &str,
    driver: &DriverName,
    default_policy: Policy,
) -> Result<PendingClaim, RequestError> {
    let mut all = requests_in_class(
        claim,
        None,
        pod_annotations,
        pod_key,
        driver,
        default_policy,
    )?;
    if all.len() != 1 {
        return Err(claim_error(
            claim,
            "spec.devices.requests".into(),
            format!("{} requests; exactly one is expected here", all.len()),
        ));
    }
    Ok(all.remove(0))
}

/// An error at `path` of `claim`.
fn claim_error(claim: &ResourceClaim, path: String, problem: String) -> RequestError {
    RequestError {
        object: format!("claim {}", claim_key(claim)),
        path,
        problem,
    }
}

/// One [`PendingClaim`] per device request of `claim` and per alternative of a
/// `firstAvailable` request, in order (every one must be of the shared class), with
/// `device_class`'s configuration before the claim's.
pub fn requests_in_class(
    claim: &ResourceClaim,
    device_class: Option<&DeviceClass>,
    pod_annotations: &BTreeMap<String, String>,
    pod_key: &str,
    driver: &DriverName,
    default_policy: Policy,
) -> Result<Vec<PendingClaim>, RequestError> {
    requests_of_class(
        claim,
        &driver.shared_class(),
        device_class,
        pod_annotations,
        pod_key,
        driver,
        default_policy,
    )
}

/// [`requests_in_class`] for the requests of class `class` (the shared class, or the MIG
/// class: [`crate::mig`] reads a MIG claim's memory and cores the same way); a request of
/// another class is refused, naming its `deviceClassName`.
pub fn requests_of_class(
    claim: &ResourceClaim,
    class: &str,
    device_class: Option<&DeviceClass>,
    pod_annotations: &BTreeMap<String, String>,
    pod_key: &str,
    driver: &DriverName,
    default_policy: Policy,
) -> Result<Vec<PendingClaim>, RequestError> {
    let requests = &claim.spec.devices.requests;
    if requests.is_empty() {
        return Err(claim_error(
            claim,
            "spec.devices.requests".into(),
            "missing; the claim requests no device".into(),
        ));
    }
    let ctx = Reading {
        claim,
        class,
        device_class,
        pod_annotations,
        pod_key,
        driver,
        default_policy,
    };
    let mut names = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (i, req) in requests.iter().enumerate() {
        let parts = ctx.request(i, req)?;
        let parent = parts.first().map(|p| p.parent.clone()).unwrap_or_default();
        if !names.insert(parent.clone()) {
            return Err(claim_error(
                claim,
                format!("spec.devices.requests[{i}].name"),
                format!("{parent:?} names two requests"),
            ));
        }
        out.extend(parts);
    }
    Ok(out)
}

/// The claim's `spec.devices.constraints` over its requests `pendings`
/// ([`requests_in_class`]): `matchAttribute` of `<driver>/numaNode` or
/// `resource.kubernetes.io/pcieRoot`. Everything else (`distinctAttribute`, another
/// attribute, a request name the claim does not have) is refused, naming the field.
pub fn constraints(
    claim: &ResourceClaim,
    driver: &DriverName,
    pendings: &[PendingClaim],
) -> Result<Vec<Constraint>, RequestError> {
    let numa = format!("{}/{}", driver.as_str(), attr::NUMA_NODE);
    claim
        .spec
        .devices
        .constraints
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let path = format!("spec.devices.constraints[{i}]");
            let err = |field: &str, problem: String| {
                claim_error(claim, format!("{path}.{field}"), problem)
            };
            only_match_attribute(c, &err)?;
            let attribute = match_attribute(c, &numa, &err)?;
            let requests = constraint_requests(c, pendings, &err)?;
            Ok(Constraint {
                path,
                requests,
                attribute,
            })
        })
        .collect()
}

/// Refuses a constraint with a field beside `requests` and `matchAttribute`, naming it
/// (`err` makes the error at a field of the constraint).
fn only_match_attribute(
    c: &DeviceConstraint,
    err: &impl Fn(&str, String) -> RequestError,
) -> Result<(), RequestError> {
    match c.other.keys().next().map(String::as_str) {
        None => Ok(()),
        Some("distinctAttribute") => Err(err(
            "distinctAttribute",
            "distinct devices per request are not supported by the controller; every request of a claim already takes GPUs the others do not".into(),
        )),
        Some(other) => Err(err(
            other,
            "not supported by the controller; use matchAttribute".into(),
        )),
    }
}

/// The attribute a constraint matches: `numa` (`<driver>/numaNode`) or the PCIe root.
fn match_attribute(
    c: &DeviceConstraint,
    numa: &str,
    err: &impl Fn(&str, String) -> RequestError,
) -> Result<MatchAttribute, RequestError> {
    match c.match_attribute.as_deref() {
        Some(a) if a == numa => Ok(MatchAttribute::NumaNode),
        Some(attr::PCIE_ROOT) => Ok(MatchAttribute::PcieRoot),
        Some(a) => Err(err(
            "matchAttribute",
            format!(
                "{a:?} is not supported by the controller; valid are {numa:?} and {:?}",
                attr::PCIE_ROOT
            ),
        )),
        None => Err(err(
            "matchAttribute",
            "missing; the controller supports matchAttribute constraints only".into(),
        )),
    }
}

/// The request names a constraint lists (empty: every request), each one of `pendings`'.
fn constraint_requests(
    c: &DeviceConstraint,
    pendings: &[PendingClaim],
    err: &impl Fn(&str, String) -> RequestError,
) -> Result<Vec<String>, RequestError> {
    match &c.requests {
        Value::Null => Ok(Vec::new()),
        Value::Array(r) => r
            .iter()
            .enumerate()
            .map(|(j, n)| {
                let name = n.as_str().unwrap_or_default();
                if pendings
                    .iter()
                    .any(|p| p.parent == name || p.request_name == name)
                {
                    Ok(name.to_owned())
                } else {
                    Err(err(
                        &format!("requests[{j}]"),
                        format!("{n} names no request of the claim"),
                    ))
                }
            })
            .collect(),
        _ => Err(err("requests", "not a list".into())),
    }
}

/// What reading one claim's requests needs.
struct Reading<'a> {
    claim: &'a ResourceClaim,
    /// The class every request must be of.
    class: &'a str,
    device_class: Option<&'a DeviceClass>,
    pod_annotations: &'a BTreeMap<String, String>,
    pod_key: &'a str,
    driver: &'a DriverName,
    default_policy: Policy,
}

impl Reading<'_> {
    /// Request `index` (`req`) of the claim: one part for `exactly` (v1beta1: the fields
    /// in the request), one per sub-request of `firstAvailable`, in order.
    fn request(
        &self,
        index: usize,
        req: &DeviceRequest,
    ) -> Result<Vec<PendingClaim>, RequestError> {
        let key = claim_key(self.claim);
        let req_path = format!("spec.devices.requests[{index}]");
        let here = At::new(&key, &req_path);
        let name = req
            .name
            .as_deref()
            .ok_or_else(|| here.err(&format!("{req_path}.name"), "missing".into()))?;
        if let Some(subs) = &req.first_available {
            return self.sub_requests(index, name, subs, &here);
        }
        // v1/v1beta2: fields under `exactly`; v1beta1: directly in the request.
        let here = match req.exactly {
            Some(_) => At::new(&key, &format!("{req_path}.exactly")),
            None => here,
        };
        Ok(vec![self.exact(index, name, name, req.exact(), &here)?])
    }

    /// The alternatives `subs` of `firstAvailable` request `index` named `name` (at
    /// `here`), one part each, in order; their names must be there and differ.
    fn sub_requests(
        &self,
        index: usize,
        name: &str,
        subs: &[DeviceSubRequest],
        here: &At,
    ) -> Result<Vec<PendingClaim>, RequestError> {
        if subs.is_empty() {
            return Err(here.field(
                "firstAvailable",
                "empty or not a list of sub-requests".into(),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        subs.iter()
            .enumerate()
            .map(|(j, sub)| {
                let at = here.nested(&format!("firstAvailable[{j}]"));
                let sub_name = sub
                    .name
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| at.field("name", "missing".into()))?;
                if !seen.insert(sub_name) {
                    return Err(at.field("name", format!("{sub_name:?} names two sub-requests")));
                }
                self.exact(index, name, &format!("{name}/{sub_name}"), &sub.exact, &at)
            })
            .collect()
    }

    /// One request or sub-request (`exact`, at `here`) named `full` of claim request
    /// `index` named `parent`: the device count ([`check_exact`]), the effective
    /// configuration ([`effective_config`], then [`apply_capacity`]), the share
    /// ([`share_of`]), the selectors and the pod's placement annotations.
    fn exact(
        &self,
        index: usize,
        parent: &str,
        full: &str,
        exact: &ExactDeviceRequest,
        here: &At,
    ) -> Result<PendingClaim, RequestError> {
        let count = check_exact(exact, here, self.class)?;
        let mut entries = effective_config(
            self.claim,
            parent,
            full,
            self.device_class,
            self.driver,
            here,
        )?;
        apply_capacity(&mut entries.config, exact, here)?;
        let config = entries.config;
        let mut request = Request::new(count, share_of(&config, here)?);
        request.cores = config.cores.map(|c| u32::from(c.get()));
        request.tolerations = tolerations(exact, here)?;
        let selectors = selectors(exact, here)?;

        let placement =
            hami::pod_annotations(self.pod_annotations, self.pod_key, self.default_policy)?;
        placement.constrain(&mut request);
        let policy = placement.policy;
        Ok(PendingClaim {
            key: claim_key(self.claim),
            id: crate::usage::grant_id(self.claim),
            request_name: full.to_owned(),
            parent: parent.to_owned(),
            request_index: index,
            request,
            policy,
            selectors,
            config,
            claim_config: entries.claim_config,
            class_config: entries.class_config,
        })
    }
}

/// The request's `selectors`, each compiled ([`selector::compile`]); a selector that is
/// not CEL or does not compile is refused, naming its field.
fn selectors(exact: &ExactDeviceRequest, here: &At) -> Result<Vec<Selector>, RequestError> {
    exact
        .selectors
        .iter()
        .enumerate()
        .map(|(j, s)| {
            let Some(expression) = s.cel.as_ref().and_then(|c| c.expression.as_deref()) else {
                return Err(here.field(
                    &format!("selectors[{j}].cel.expression"),
                    "missing; the controller evaluates CEL selectors only".into(),
                ));
            };
            let path = here.at(&format!("selectors[{j}].cel.expression"));
            let compiled = selector::compile(expression).map_err(|e| here.err(&path, e))?;
            Ok(Selector {
                path,
                expression: expression.to_owned(),
                compiled,
            })
        })
        .collect()
}

/// The request's `tolerations` of device taints (operator `Exists` or `Equal`).
fn tolerations(exact: &ExactDeviceRequest, here: &At) -> Result<Vec<Toleration>, RequestError> {
    exact
        .tolerations
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let exists = match t.operator.as_deref() {
                None | Some("Equal") => false,
                Some("Exists") => true,
                Some(op) => {
                    return Err(here.field(
                        &format!("tolerations[{i}].operator"),
                        format!("{op:?}; use Exists or Equal"),
                    ));
                }
            };
            if t.key.is_empty() && !exists {
                return Err(here.field(
                    &format!("tolerations[{i}].key"),
                    "empty; an empty key needs operator Exists".into(),
                ));
            }
            Ok(Toleration {
                key: t.key.clone(),
                exists,
                value: t.value.clone(),
                effect: t.effect.clone(),
            })
        })
        .collect()
}

/// Where in a claim a request's fields are: errors name the claim and the field.
struct At {
    /// `claim <namespace/name>`.
    object: String,
    /// The request's path (`spec.devices.requests[i]`, or its `.exactly`).
    base: String,
}

impl At {
    fn new(key: &str, base: &str) -> Self {
        Self {
            object: format!("claim {key}"),
            base: base.to_owned(),
        }
    }

    /// The place of field `f` of the request (a sub-request's, say).
    fn nested(&self, f: &str) -> Self {
        Self {
            object: self.object.clone(),
            base: self.at(f),
        }
    }

    /// The path of field `f` of the request.
    fn at(&self, f: &str) -> String {
        format!("{}.{f}", self.base)
    }

    /// An error at `path` of the claim.
    fn err(&self, path: &str, problem: String) -> RequestError {
        RequestError {
            object: self.object.clone(),
            path: path.to_owned(),
            problem,
        }
    }

    /// An error at field `f` of the request.
    fn field(&self, f: &str, problem: String) -> RequestError {
        self.err(&self.at(f), problem)
    }
}

/// Checks the `exactly` part of a request or a sub-request (`exact`): class `class`,
/// `ExactCount`, no admin access, no derived attributes; returns its count (default 1, at
/// most 32).
fn check_exact(exact: &ExactDeviceRequest, here: &At, class: &str) -> Result<u32, RequestError> {
    if exact.class_name() != Some(class) {
        return Err(here.field(
            "deviceClassName",
            format!(
                "{}; the controller allocates class {class}",
                exact.device_class_name
            ),
        ));
    }
    match exact.allocation_mode.as_deref() {
        None | Some("ExactCount") => {}
        Some(m) => {
            return Err(here.field(
                "allocationMode",
                format!("{m:?}; only ExactCount is supported"),
            ));
        }
    }
    if !exact.derived_attributes.is_empty() {
        return Err(here.field(
            "derivedAttributes",
            "derived attributes are not supported by the controller".into(),
        ));
    }
    if exact.admin_access {
        return Err(here.field(
            "adminAccess",
            "admin access is not allocated by the controller".into(),
        ));
    }
    match &exact.count {
        Value::Null => Ok(1),
        v => v
            .as_u64()
            .filter(|&c| (1..=32).contains(&c))
            .map(|c| c as u32)
            .ok_or_else(|| here.field("count", format!("{v}; use an integer 1 to 32"))),
    }
}

/// A request's configuration and the config entries to copy into its allocation.
struct ConfigEntries {
    /// This driver's configuration that applies to the request, class first.
    config: GpuShareConfig,
    /// Every entry of the claim's `spec.devices.config`.
    claim_config: Vec<DeviceClaimConfiguration>,
    /// Every entry of the class's `spec.config`.
    class_config: Vec<DeviceClassConfiguration>,
}

/// The configuration of request `name` (sub-request `full`): this driver's
/// `GpuShareConfig`s of the class ([`class_configs`]), then those of the claim that apply
/// to the request ([`claim_configs`]), later fields winning; every entry is kept to be
/// copied into the allocation.
fn effective_config(
    claim: &ResourceClaim,
    name: &str,
    full: &str,
    device_class: Option<&DeviceClass>,
    driver: &DriverName,
    here: &At,
) -> Result<ConfigEntries, RequestError> {
    let mut config = GpuShareConfig::default();
    for (c, params) in class_configs(device_class, driver)? {
        merge_config(&mut config, &c, params);
    }
    for (c, e) in claim_configs(claim, driver, here)? {
        if entry_applies(e, name, full) {
            let params = e.opaque.as_ref().map_or(&Value::Null, |o| &o.parameters);
            merge_config(&mut config, &c, params);
        }
    }
    Ok(ConfigEntries {
        config,
        claim_config: claim.spec.devices.config.clone(),
        class_config: device_class
            .map(|c| c.spec.config.clone())
            .unwrap_or_default(),
    })
}

/// This driver's `GpuShareConfig`s in the class's `spec.config`, decoded, with their
/// parameters; a bad one is refused, naming the class and the field.
fn class_configs<'c>(
    device_class: Option<&'c DeviceClass>,
    driver: &DriverName,
) -> Result<Vec<(GpuShareConfig, &'c Value)>, RequestError> {
    let Some(class) = device_class else {
        return Ok(Vec::new());
    };
    let ours = class.spec.config.iter().enumerate().filter_map(|(i, e)| {
        let opaque = e.opaque.as_ref().filter(|o| o.driver == driver.as_str())?;
        Some((i, opaque))
    });
    ours.map(|(i, opaque)| {
        let path = format!("spec.config[{i}].opaque.parameters");
        let c =
            GpuShareConfig::from_value(&opaque.parameters, &path).map_err(|e| RequestError {
                object: format!("DeviceClass {}", class.metadata.name),
                path: e.path,
                problem: e.problem.to_string(),
            })?;
        Ok((c, &opaque.parameters))
    })
    .collect()
}

/// This driver's `GpuShareConfig`s in the claim's `spec.devices.config`, decoded, with
/// their entries (whichever requests they apply to: a bad one is refused all the same).
fn claim_configs<'c>(
    claim: &'c ResourceClaim,
    driver: &DriverName,
    here: &At,
) -> Result<Vec<(GpuShareConfig, &'c DeviceClaimConfiguration)>, RequestError> {
    let entries = claim.spec.devices.config.iter().enumerate();
    let ours = entries.filter_map(|(i, e)| {
        let opaque = e.opaque.as_ref().filter(|o| o.driver == driver.as_str())?;
        Some((i, e, opaque))
    });
    ours.map(|(i, e, opaque)| {
        let path = format!("spec.devices.config[{i}].opaque.parameters");
        let c = GpuShareConfig::from_value(&opaque.parameters, &path)
            .map_err(|e| here.err(&e.path, e.problem.to_string()))?;
        Ok((c, e))
    })
    .collect()
}

/// Whether config entry `e` applies to request `name` (or its sub-request `full`,
/// `<name>/<sub>`; `full == name` for a plain request): it names no request, or names
/// either.
fn entry_applies(e: &DeviceClaimConfiguration, name: &str, full: &str) -> bool {
    e.requests.is_empty() || e.requests.iter().any(|q| q == name || q == full)
}

/// Lays `c` (read from `params`) over `config`: memory and cores where `c` has them,
/// priority and oversubscribe where `params` names them.
fn merge_config(config: &mut GpuShareConfig, c: &GpuShareConfig, params: &Value) {
    let present = |f: &str| params.get(f).is_some_and(|v| !v.is_null());
    config.memory = c.memory.or(config.memory);
    config.cores = c.cores.or(config.cores);
    if present("priority") {
        config.priority = c.priority;
    }
    if present("oversubscribe") {
        config.oversubscribe = c.oversubscribe;
    }
}

/// Lays the request's `capacity.requests` (`memory`, `cores`; nothing else) over
/// `config`.
fn apply_capacity(
    config: &mut GpuShareConfig,
    exact: &ExactDeviceRequest,
    here: &At,
) -> Result<(), RequestError> {
    let Some(obj) = &exact.capacity.requests else {
        return Ok(());
    };
    if let Some(unknown) = obj
        .keys()
        .find(|k| *k != capacity::MEMORY && *k != capacity::CORES)
    {
        return Err(here.field(
            &format!("capacity.requests.{unknown}"),
            "unknown capacity; valid are memory and cores".into(),
        ));
    }
    if let Some(m) = obj.get(capacity::MEMORY) {
        let path = here.at("capacity.requests.memory");
        config.memory = Some(quantity_u64(m).map_err(|p| here.err(&path, p.to_string()))?);
    }
    if let Some(c) = obj.get(capacity::CORES) {
        let path = here.at("capacity.requests.cores");
        let n = quantity_u64(c).map_err(|p| here.err(&path, p.to_string()))?;
        config.cores = Some(
            u8::try_from(n)
                .ok()
                .and_then(CorePercent::new)
                .ok_or_else(|| here.err(&path, format!("{n} is above the maximum 100")))?,
        );
    }
    Ok(())
}

/// What each GPU of the request gives: its memory, or the whole GPU without memory
/// (memory 0 is refused).
fn share_of(config: &GpuShareConfig, here: &At) -> Result<GpuShare, RequestError> {
    match config.memory {
        Some(0) => Err(here.field(
            "capacity.requests.memory",
            "0; a share needs some memory".into(),
        )),
        Some(bytes) => Ok(GpuShare::Memory { bytes }),
        None => Ok(GpuShare::Whole),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_driver::engine::{GpuPolicy, NodePolicy};
    use serde_json::json;

    fn claim(request: Value, config: Value) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
            "spec": {"devices": {"requests": [request], "config": config}}
        })
    }

    fn exactly(fields: Value) -> Value {
        let mut e = json!({"deviceClassName": "shared.gpu.fgpu.dev"});
        e.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        json!({"name": "gpu", "exactly": e})
    }

    fn ours(requests: Value, params: Value) -> Value {
        let mut p = json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig"});
        p.as_object_mut()
            .unwrap()
            .extend(params.as_object().unwrap().clone());
        json!({"requests": requests, "opaque": {"driver": "gpu.fgpu.dev", "parameters": p}})
    }

    /// The JSON claim `c` typed, as the daemon reads it.
    fn typed(c: &Value) -> ResourceClaim {
        crate::usage::typed(c).unwrap()
    }

    /// The JSON config entry `e` typed.
    fn entry(e: Value) -> DeviceClaimConfiguration {
        serde_json::from_value(e).unwrap()
    }

    fn read(c: &Value, ann: &[(&str, &str)]) -> Result<PendingClaim, RequestError> {
        let ann = ann
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let c = typed(c);
        from_claim(
            &c,
            &ann,
            "ns/pod",
            &DriverName::default(),
            Policy::FRAGAWARE,
        )
    }

    fn read_all(c: &Value, class: Option<&Value>) -> Result<Vec<PendingClaim>, RequestError> {
        let d = DriverName::default();
        let class: Option<DeviceClass> = class.map(|c| serde_json::from_value(c.clone()).unwrap());
        let c = typed(c);
        requests_in_class(
            &c,
            class.as_ref(),
            &BTreeMap::new(),
            "ns/pod",
            &d,
            Policy::BINPACK,
        )
    }

    fn read_one(c: &Value, class: Option<&Value>) -> Result<PendingClaim, RequestError> {
        read_all(c, class).map(|mut all| all.remove(0))
    }

    #[test]
    fn tolerations_are_read_and_bad_ones_refused_by_field() {
        let c = claim(
            exactly(json!({"tolerations": [
                {"key": "fgpu.dev/unhealthy", "operator": "Exists", "effect": "NoExecute"},
                {"key": "k", "value": "v"}]})),
            json!([]),
        );
        let p = read(&c, &[]).unwrap();
        assert_eq!(
            p.request.tolerations,
            vec![
                Toleration {
                    key: "fgpu.dev/unhealthy".into(),
                    exists: true,
                    value: String::new(),
                    effect: "NoExecute".into()
                },
                Toleration {
                    key: "k".into(),
                    exists: false,
                    value: "v".into(),
                    effect: String::new()
                },
            ]
        );
        let bad = claim(
            exactly(json!({"tolerations": [{"key": "k", "operator": "Lt"}]})),
            json!([]),
        );
        let e = read(&bad, &[]).unwrap_err();
        assert_eq!(
            e.path,
            "spec.devices.requests[0].exactly.tolerations[0].operator"
        );
        let bad = claim(exactly(json!({"tolerations": [{"value": "v"}]})), json!([]));
        let e = read(&bad, &[]).unwrap_err();
        assert_eq!(
            e.path,
            "spec.devices.requests[0].exactly.tolerations[0].key"
        );
    }

    #[test]
    fn each_request_of_a_claim_gets_its_own_config() {
        let mut a = exactly(json!({"capacity": {"requests": {"memory": "8Gi"}}}));
        a["name"] = json!("a");
        let mut b = exactly(json!({"count": 2}));
        b["name"] = json!("b");
        let c = claim(
            a,
            json!([ours(json!(["b"]), json!({"memory": "3Gi", "cores": 5}))]),
        );
        let mut c = c;
        c["spec"]["devices"]["requests"]
            .as_array_mut()
            .unwrap()
            .push(b);
        let all = read_all(&c, None).unwrap();
        let got: Vec<_> = all
            .iter()
            .map(|p| {
                (
                    p.request_name.as_str(),
                    p.request.gpus,
                    p.request.share,
                    p.request.cores,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", 1, GpuShare::Memory { bytes: 8 << 30 }, None),
                ("b", 2, GpuShare::Memory { bytes: 3 << 30 }, Some(5)),
            ]
        );
        // The single-request reader refuses it, naming the field.
        let e = read(&c, &[]).unwrap_err();
        assert_eq!(e.path, "spec.devices.requests");
        // A bad second request names its index.
        c["spec"]["devices"]["requests"][1]["exactly"]["allocationMode"] = json!("All");
        let e = read_all(&c, None).unwrap_err();
        assert_eq!(e.path, "spec.devices.requests[1].exactly.allocationMode");
    }

    #[test]
    fn first_available_gives_one_part_per_sub_request_with_its_config() {
        let c = claim(
            json!({"name": "gpu", "firstAvailable": [
                {"name": "a", "deviceClassName": "shared.gpu.fgpu.dev", "count": 2},
                {"name": "b", "deviceClassName": "shared.gpu.fgpu.dev",
                 "selectors": [{"cel": {"expression": "device.driver == 'gpu.fgpu.dev'"}}]}]}),
            json!([
                ours(json!(["gpu/b"]), json!({"memory": "3Gi"})),
                ours(json!(["gpu"]), json!({"cores": 5}))
            ]),
        );
        let all = read_all(&c, None).unwrap();
        let got: Vec<_> = all
            .iter()
            .map(|p| {
                (
                    p.request_name.as_str(),
                    p.parent.as_str(),
                    p.request_index,
                    p.request.gpus,
                    p.request.share,
                    p.request.cores,
                    p.selectors.len(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("gpu/a", "gpu", 0, 2, GpuShare::Whole, Some(5), 0),
                (
                    "gpu/b",
                    "gpu",
                    0,
                    1,
                    GpuShare::Memory { bytes: 3 << 30 },
                    Some(5),
                    1
                ),
            ]
        );
        assert_eq!(
            all[1].selectors[0].path,
            "spec.devices.requests[0].firstAvailable[1].selectors[0].cel.expression"
        );
        // Two sub-requests of one name are refused.
        let mut twice = c.clone();
        twice["spec"]["devices"]["requests"][0]["firstAvailable"][1]["name"] = json!("a");
        let e = read_all(&twice, None).unwrap_err();
        assert_eq!(e.path, "spec.devices.requests[0].firstAvailable[1].name");
        // Constraints may name a sub-request.
        let mut with = c;
        with["spec"]["devices"]["constraints"] =
            json!([{"requests": ["gpu/a"], "matchAttribute": "gpu.fgpu.dev/numaNode"}]);
        let cs = constraints(&typed(&with), &DriverName::default(), &all).unwrap();
        assert_eq!(cs.len(), 1);
        assert!(cs[0].applies(&all[0]) && !cs[0].applies(&all[1]));
        assert_eq!(cs[0].attribute, MatchAttribute::NumaNode);
    }

    #[test]
    fn class_config_comes_first_and_the_claim_wins() {
        let class = json!({"metadata": {"name": "shared.gpu.fgpu.dev"}, "spec": {"config": [
            ours(Value::Null, json!({"memory": "2Gi", "cores": 20, "priority": "low"})),
            {"opaque": {"driver": "net.example.com", "parameters": {"mtu": 9000}}}]}});
        let c = claim(
            exactly(json!({})),
            json!([ours(json!(["gpu"]), json!({"memory": "6Gi"}))]),
        );
        let p = read_one(&c, Some(&class)).unwrap();
        // Memory from the claim, cores and priority from the class.
        assert_eq!(p.request.share, GpuShare::Memory { bytes: 6 << 30 });
        assert_eq!(p.request.cores, Some(20));
        assert_eq!(p.config.priority, fgpu_api::config::Priority::Low);
        assert_eq!(p.class_config.len(), 2, "every class entry is copied");
        assert_eq!(p.claim_config.len(), 1);

        // A bad class entry names the class and the field.
        let bad = json!({"metadata": {"name": "shared.gpu.fgpu.dev"}, "spec": {"config": [
            ours(Value::Null, json!({"cores": 140}))]}});
        let e = read_one(&c, Some(&bad)).unwrap_err();
        assert_eq!(e.object, "DeviceClass shared.gpu.fgpu.dev");
        assert_eq!(e.path, "spec.config[0].opaque.parameters.cores");
    }

    #[test]
    fn requests_table() {
        let gib = 1u64 << 30;
        let cases: Vec<(&str, Value, u32, GpuShare, Option<u32>)> = vec![
            (
                "capacity requests",
                claim(
                    exactly(json!({"capacity": {"requests": {"memory": "10Gi", "cores": "30"}}})),
                    json!([]),
                ),
                1,
                GpuShare::Memory { bytes: 10 * gib },
                Some(30),
            ),
            (
                "opaque config, count 2",
                claim(
                    exactly(json!({"count": 2})),
                    json!([ours(json!(["gpu"]), json!({"memory": "4Gi", "cores": 10}))]),
                ),
                2,
                GpuShare::Memory { bytes: 4 * gib },
                Some(10),
            ),
            (
                "capacity wins over config",
                claim(
                    exactly(json!({"capacity": {"requests": {"memory": "2Gi"}}})),
                    json!([ours(json!([]), json!({"memory": "4Gi", "cores": 10}))]),
                ),
                1,
                GpuShare::Memory { bytes: 2 * gib },
                Some(10),
            ),
            (
                "config for another request ignored",
                claim(
                    exactly(json!({})),
                    json!([ours(json!(["other"]), json!({"memory": "4Gi"}))]),
                ),
                1,
                GpuShare::Whole,
                None,
            ),
            (
                "v1beta1 request without exactly",
                claim(
                    json!({"name": "gpu", "deviceClassName": "shared.gpu.fgpu.dev",
                "count": 1}),
                    json!([ours(json!([]), json!({"memory": "1Gi"}))]),
                ),
                1,
                GpuShare::Memory { bytes: gib },
                None,
            ),
        ];
        for (what, c, gpus, share, cores) in cases {
            let p = read(&c, &[]).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                (p.request.gpus, p.request.share, p.request.cores),
                (gpus, share, cores),
                "{what}"
            );
            assert_eq!(
                (p.key.as_str(), p.id.as_str(), p.request_name.as_str()),
                ("ns/c", "uid-1", "gpu"),
                "{what}"
            );
            assert_eq!(p.policy, Policy::FRAGAWARE, "{what}");
        }
    }

    #[test]
    fn annotations_set_policy_and_constraints() {
        let c = claim(exactly(json!({})), json!([]));
        let p = read(
            &c,
            &[
                ("hami.io/node-scheduler-policy", "spread"),
                ("hami.io/gpu-scheduler-policy", "binpack"),
                ("nvidia.com/use-gputype", "H100, A100"),
                ("nvidia.com/nouse-gputype", "T4"),
                ("nvidia.com/use-gpuuuid", "GPU-1"),
            ],
        )
        .unwrap();
        assert_eq!(
            p.policy,
            Policy {
                node: NodePolicy::Spread,
                gpu: GpuPolicy::Binpack
            }
        );
        assert_eq!(p.request.model_include, ["H100", "A100"]);
        assert_eq!(p.request.model_exclude, ["T4"]);
        assert_eq!(p.request.uuid_pin, ["GPU-1"]);
        let only_gpu = read(&c, &[("hami.io/gpu-scheduler-policy", "spread")]).unwrap();
        assert_eq!(
            only_gpu.policy,
            Policy {
                node: NodePolicy::FragAware,
                gpu: GpuPolicy::Spread
            }
        );
        let e = read(&c, &[("hami.io/gpu-scheduler-policy", "topology-aware")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "pod ns/pod: metadata.annotations[\"hami.io/gpu-scheduler-policy\"]: \"topology-aware\"; valid are binpack and spread"
        );
    }

    #[test]
    fn strict_errors_name_claim_and_field() {
        let two = json!({"apiVersion": "resource.k8s.io/v1", "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"devices": {"requests": [exactly(json!({})), exactly(json!({}))]}}});
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "two requests, one name",
                two,
                "spec.devices.requests[1].name",
            ),
            (
                "other class",
                claim(
                    json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.fgpu.dev"}}),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.deviceClassName",
            ),
            (
                "first available",
                claim(json!({"name": "gpu", "firstAvailable": []}), json!([])),
                "spec.devices.requests[0].firstAvailable",
            ),
            (
                "mode All",
                claim(exactly(json!({"allocationMode": "All"})), json!([])),
                "spec.devices.requests[0].exactly.allocationMode",
            ),
            (
                "selector that does not compile",
                claim(
                    exactly(json!({"selectors": [{"cel": {"expression": "true"}},
                        {"cel": {"expression": "device.driver =="}}]})),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.selectors[1].cel.expression",
            ),
            (
                "selector that is not CEL",
                claim(exactly(json!({"selectors": [{"other": {}}]})), json!([])),
                "spec.devices.requests[0].exactly.selectors[0].cel.expression",
            ),
            (
                "derived attributes",
                claim(
                    exactly(json!({"derivedAttributes": [{"name": "x", "expression": "1"}]})),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.derivedAttributes",
            ),
            (
                "sub-request of another class",
                claim(
                    json!({"name": "gpu", "firstAvailable": [
                        {"name": "a", "deviceClassName": "shared.gpu.fgpu.dev"},
                        {"name": "b", "deviceClassName": "gpu.fgpu.dev"}]}),
                    json!([]),
                ),
                "spec.devices.requests[0].firstAvailable[1].deviceClassName",
            ),
            (
                "sub-request without a name",
                claim(
                    json!({"name": "gpu", "firstAvailable": [
                        {"deviceClassName": "shared.gpu.fgpu.dev"}]}),
                    json!([]),
                ),
                "spec.devices.requests[0].firstAvailable[0].name",
            ),
            (
                "sub-request with admin access",
                claim(
                    json!({"name": "gpu", "firstAvailable": [
                        {"name": "a", "deviceClassName": "shared.gpu.fgpu.dev", "adminAccess": true}]}),
                    json!([]),
                ),
                "spec.devices.requests[0].firstAvailable[0].adminAccess",
            ),
            (
                "count 0",
                claim(exactly(json!({"count": 0})), json!([])),
                "spec.devices.requests[0].exactly.count",
            ),
            (
                "cores 140",
                claim(
                    exactly(json!({"capacity": {"requests": {"cores": "140"}}})),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.capacity.requests.cores",
            ),
            (
                "fractional memory",
                claim(
                    exactly(json!({"capacity": {"requests": {"memory": "0.1Ki"}}})),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.capacity.requests.memory",
            ),
            (
                "unknown capacity",
                claim(
                    exactly(json!({"capacity": {"requests": {"bandwidth": "1"}}})),
                    json!([]),
                ),
                "spec.devices.requests[0].exactly.capacity.requests.bandwidth",
            ),
            (
                "bad config",
                claim(
                    exactly(json!({})),
                    json!([ours(json!([]), json!({"cores": 140}))]),
                ),
                "spec.devices.config[0].opaque.parameters.cores",
            ),
        ];
        for (what, c, path) in cases {
            let e = read(&c, &[]).unwrap_err();
            assert_eq!(
                (e.object.as_str(), e.path.as_str()),
                ("claim ns/c", path),
                "{what}: {e}"
            );
        }
    }

    #[test]
    fn config_entries_apply_to_the_requests_they_name_and_later_fields_win() {
        assert!(entry_applies(&entry(json!({})), "gpu", "gpu"));
        assert!(entry_applies(&entry(json!({"requests": []})), "gpu", "gpu"));
        assert!(entry_applies(
            &entry(json!({"requests": ["a", "gpu"]})),
            "gpu",
            "gpu"
        ));
        assert!(!entry_applies(
            &entry(json!({"requests": ["a"]})),
            "gpu",
            "gpu"
        ));
        // A sub-request takes its request's entries and its own, not a sibling's.
        assert!(entry_applies(
            &entry(json!({"requests": ["gpu"]})),
            "gpu",
            "gpu/big"
        ));
        assert!(entry_applies(
            &entry(json!({"requests": ["gpu/big"]})),
            "gpu",
            "gpu/big"
        ));
        assert!(!entry_applies(
            &entry(json!({"requests": ["gpu/small"]})),
            "gpu",
            "gpu/big"
        ));
        let read = |mut p: Value| {
            p["apiVersion"] = json!("gpu.fgpu.dev/v1alpha1");
            p["kind"] = json!("GpuShareConfig");
            (GpuShareConfig::from_value(&p, "p").unwrap(), p)
        };
        let mut config = GpuShareConfig::default();
        let (first, p1) = read(json!({"memory": "1Gi", "cores": 10}));
        merge_config(&mut config, &first, &p1);
        let (second, p2) = read(json!({"memory": "2Gi"}));
        merge_config(&mut config, &second, &p2);
        assert_eq!(config.memory, Some(2 << 30));
        assert_eq!(config.cores, first.cores);
    }

    #[test]
    fn the_share_is_the_memory_or_the_whole_gpu() {
        let here = At::new("ns/c", "spec.devices.requests[0].exactly");
        let mut config = GpuShareConfig::default();
        assert_eq!(share_of(&config, &here), Ok(GpuShare::Whole));
        config.memory = Some(5);
        assert_eq!(share_of(&config, &here), Ok(GpuShare::Memory { bytes: 5 }));
        config.memory = Some(0);
        let e = share_of(&config, &here).unwrap_err();
        assert_eq!(e.object, "claim ns/c");
        assert_eq!(
            e.path,
            "spec.devices.requests[0].exactly.capacity.requests.memory"
        );
    }
}
