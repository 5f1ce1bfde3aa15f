//! What each allocated device of a claim grants: memory, cores, priority.
//!
//! Pure: from a [`ResourceClaim`] and the driver name to one [`ResolvedResult`] per
//! allocation result of this driver. Per field, the first of these that says something wins:
//!
//! 1. memory and cores: the result's `consumedCapacity` (what the scheduler accounted;
//!    anything else could overbook the card);
//! 2. this driver's [`GpuShareConfig`]s in `status.allocation.devices.config` that apply to
//!    the result's request (every entry with no `requests`, or naming the request or its
//!    parent `<req>` of `<req>/<sub>`), class entries before claim entries, later entries
//!    overriding earlier ones field by field;
//! 3. the whole device (memory: all of it; cores: 0, not throttled).
//!
//! Every configuration entry of this driver is decoded strictly, whether or not it applies,
//! and a bad one fails the claim with an error naming the claim and the field path, e.g.
//! `claim ns/c: status.allocation.devices.config[1].opaque.parameters.cores: 140 is above
//! the maximum 100`.
//!
//! Priority policy ([`check_priority_policy`]): `allowHighPriority` counts only in the
//! class's entries (a claim entry that sets it fails the claim), and `priority: high` from a
//! claim entry needs a class entry applying to the same request that allows it. The
//! controller's admission webhook refuses such claims already; this is the node's own check
//! (a claim admitted before the policy, or by a cluster without the webhook).
//!
//! Oversubscription policy ([`check_oversubscribe_policy`]): `oversubscribe: true` from a
//! claim entry needs a class entry applying to the same request that sets it too (only the
//! research class does); the error names the claim, the entry's field and the result.

use fgpu_api::config::{ConfigError, ConfigProblem, CorePercent, GpuShareConfig, Priority};
use fgpu_api::names::capacity;
use fgpu_api::quantity;

use fgpu_driver::grant::{self as share, ConfigEntry};

use crate::claim::{AllocationConfig, DeviceResult, ResourceClaim, SOURCE_FROM_CLASS};

pub use fgpu_driver::grant::Source;

/// Memory granted on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryGrant {
    /// Exactly this many bytes.
    Bytes(u64),
    /// All of the device's memory.
    Whole,
}

impl MemoryGrant {
    /// Bytes, given the device's total memory.
    pub fn bytes(self, device_total: u64) -> u64 {
        match self {
            Self::Bytes(b) => b,
            Self::Whole => device_total,
        }
    }
}

/// What one allocation result grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Device memory.
    pub memory: MemoryGrant,
    /// Where `memory` came from.
    pub memory_source: Source,
    /// Percent of the device's SMs; 0 = not throttled.
    pub cores: CorePercent,
    /// Where `cores` came from.
    pub cores_source: Source,
    /// Priority of the container's kernels.
    pub priority: Priority,
    /// Whether memory beyond the grant may be backed by host memory.
    pub oversubscribe: bool,
}

/// One allocation result of this driver with its grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedResult {
    /// Index in `status.allocation.devices.results`.
    pub index: usize,
    /// The allocation result as written in the claim.
    pub result: DeviceResult,
    /// What it grants.
    pub grant: Grant,
}

/// Why a claim's grants could not be resolved. Each names the claim and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// `status.allocation` is not set.
    #[error(
        "claim {claim}: status.allocation: not allocated; the kubelet prepares only allocated claims"
    )]
    NotAllocated {
        /// `namespace/name`.
        claim: String,
    },
    /// No result belongs to this driver.
    #[error(
        "claim {claim}: status.allocation.devices.results: no device of driver {driver} (drivers allocated: {others})"
    )]
    NoDevicesOfDriver {
        /// `namespace/name`.
        claim: String,
        /// This driver.
        driver: String,
        /// Drivers that do have results, comma-separated, or `none`.
        others: String,
    },
    /// A field of the claim is invalid.
    #[error("claim {claim}: {path}: {problem}")]
    Invalid {
        /// `namespace/name`.
        claim: String,
        /// Field path inside the claim.
        path: String,
        /// What is wrong and what would be valid.
        problem: String,
    },
}

impl GrantError {
    /// The field path, where there is one.
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::Invalid { path, .. } => Some(path),
            Self::NotAllocated { .. } => Some("status.allocation"),
            Self::NoDevicesOfDriver { .. } => Some("status.allocation.devices.results"),
        }
    }
}

/// Resolves the grant of every allocation result of `driver` in `claim`, in result order.
pub fn resolve(claim: &ResourceClaim, driver: &str) -> Result<Vec<ResolvedResult>, GrantError> {
    let key = claim.key();
    if !claim.is_allocated() {
        return Err(GrantError::NotAllocated { claim: key });
    }
    let empty = Default::default();
    let alloc = claim.allocation().unwrap_or(&empty);
    let mut entries = config_entries(&key, &alloc.config, driver)?;
    // Class configuration first, then the claim's; the allocator's order within each.
    share::order(&mut entries);
    check_class_only(&entries).map_err(|e| invalid(&key, e.path, e.problem.to_string()))?;

    let out = alloc
        .results
        .iter()
        .enumerate()
        .filter(|(_, result)| result.driver == driver)
        .map(|(index, result)| resolve_result(&key, &entries, index, result))
        .collect::<Result<Vec<_>, _>>()?;
    if out.is_empty() {
        return Err(no_devices_of(key, driver, &alloc.results));
    }
    Ok(out)
}

/// A field of claim `claim` (`namespace/name`) at `path` is invalid.
fn invalid(claim: &str, path: String, problem: String) -> GrantError {
    GrantError::Invalid {
        claim: claim.to_owned(),
        path,
        problem,
    }
}

/// Decodes every configuration entry of `driver` in `config` (strictly, whether or not it
/// applies), in the claim's order.
fn config_entries(
    claim: &str,
    config: &[AllocationConfig],
    driver: &str,
) -> Result<Vec<ConfigEntry>, GrantError> {
    let mut entries = Vec::new();
    for (i, entry) in config.iter().enumerate() {
        let Some(opaque) = entry.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let base = format!("status.allocation.devices.config[{i}].opaque.parameters");
        let config = GpuShareConfig::from_value(&opaque.parameters, &base).map_err(|e| {
            let problem = e.problem.to_string();
            invalid(claim, e.path, problem)
        })?;
        let present = |f: &str| opaque.parameters.get(f).is_some_and(|v| !v.is_null());
        entries.push(ConfigEntry {
            from_class: entry.source == SOURCE_FROM_CLASS,
            position: i,
            requests: entry.requests.clone(),
            config,
            has_priority: present("priority"),
            has_oversubscribe: present("oversubscribe"),
        });
    }
    Ok(entries)
}

/// The field path of result `index`'s `field`.
fn result_path(index: usize, field: &str) -> String {
    format!("status.allocation.devices.results[{index}].{field}")
}

/// What result `index` consumed of its device's capacity, as the scheduler accounted it
/// (`consumedCapacity`; nothing where it is absent).
fn consumed(
    claim: &str,
    index: usize,
    result: &DeviceResult,
) -> Result<share::Consumed, GrantError> {
    let mut consumed = share::Consumed::default();
    let Some(cap) = &result.consumed_capacity else {
        return Ok(consumed);
    };
    if let Some(m) = cap.get(capacity::MEMORY) {
        let bytes = quantity::parse_u64(m).map_err(|e| {
            invalid(
                claim,
                result_path(index, "consumedCapacity.memory"),
                e.to_string(),
            )
        })?;
        consumed.memory = Some(bytes);
    }
    if let Some(c) = cap.get(capacity::CORES) {
        let at = result_path(index, "consumedCapacity.cores");
        let n = quantity::parse_u64(c).map_err(|e| invalid(claim, at.clone(), e.to_string()))?;
        let cores = u8::try_from(n)
            .ok()
            .and_then(CorePercent::new)
            .ok_or_else(|| {
                invalid(
                    claim,
                    at,
                    format!("{c:?} is above the maximum 100 (percent of the GPU)"),
                )
            })?;
        consumed.cores = Some(cores);
    }
    Ok(consumed)
}

/// Resolves the grant of result `index` of the claim from its consumed capacity and the
/// ordered configuration `entries`, and checks it.
fn resolve_result(
    claim: &str,
    entries: &[ConfigEntry],
    index: usize,
    result: &DeviceResult,
) -> Result<ResolvedResult, GrantError> {
    let consumed = consumed(claim, index, result)?;
    // One rule with the controller's ledger (`fgpu_driver::grant`); what "nothing said"
    // means is the node's: all of the memory, cores not throttled.
    let resolved = share::resolve(entries, &result.request, Some(consumed));
    check_priority_policy(entries, &result.request)
        .map_err(|e| invalid(claim, e.path, e.problem.to_string()))?;
    check_oversubscribe_policy(entries, &result.request).map_err(|e| {
        let problem = format!("(result {index}) {}", e.problem);
        invalid(claim, e.path, problem)
    })?;
    let memory_entry = resolved.memory_entry;
    let grant = node_grant(resolved);
    check_memory(claim, index, &grant, memory_entry)?;
    Ok(ResolvedResult {
        index,
        result: result.clone(),
        grant,
    })
}

/// The node's reading of a shared grant: nothing said about memory is all of it, nothing
/// said about cores is not throttled.
fn node_grant(resolved: share::ShareGrant) -> Grant {
    Grant {
        memory: resolved
            .memory
            .map_or(MemoryGrant::Whole, MemoryGrant::Bytes),
        memory_source: resolved.memory_source,
        cores: resolved.cores.unwrap_or(CorePercent::ZERO),
        cores_source: resolved.cores_source,
        priority: resolved.priority,
        oversubscribe: resolved.oversubscribe,
    }
}

/// Refuses a grant of 0 bytes, naming the field it came from: configuration entry
/// `memory_entry`'s memory, or result `index`'s consumed memory.
fn check_memory(
    claim: &str,
    index: usize,
    grant: &Grant,
    memory_entry: Option<usize>,
) -> Result<(), GrantError> {
    if grant.memory != MemoryGrant::Bytes(0) {
        return Ok(());
    }
    Err(invalid(
        claim,
        match (grant.memory_source, memory_entry) {
            (Source::Config, Some(i)) => config_path(i, "memory"),
            _ => result_path(index, "consumedCapacity.memory"),
        },
        "grants 0 bytes of memory; a share needs at least 1 byte (the class minimum is 256Mi)"
            .into(),
    ))
}

/// The claim has no result of `driver`: names the drivers it has results of (`none`).
fn no_devices_of(claim: String, driver: &str, results: &[DeviceResult]) -> GrantError {
    let mut others: Vec<&str> = results.iter().map(|r| r.driver.as_str()).collect();
    others.sort_unstable();
    others.dedup();
    let others = if others.is_empty() {
        "none".to_owned()
    } else {
        others.join(", ")
    };
    GrantError::NoDevicesOfDriver {
        claim,
        driver: driver.to_owned(),
        others,
    }
}

/// The field path of entry `position`'s `field`.
fn config_path(position: usize, field: &str) -> String {
    format!("status.allocation.devices.config[{position}].opaque.parameters.{field}")
}

/// Refuses a claim entry that sets `allowHighPriority` (only a class may).
fn check_class_only(entries: &[ConfigEntry]) -> Result<(), ConfigError> {
    match entries
        .iter()
        .find(|e| !e.from_class && e.config.allow_high_priority)
    {
        Some(e) => Err(ConfigError {
            path: config_path(e.position, "allowHighPriority"),
            problem: ConfigProblem::ClassOnly,
        }),
        None => Ok(()),
    }
}

/// The priority policy for one request, on `entries` in [`share::order`]: when the entry
/// that decides its priority (the last applying one that sets it) is a claim's and says
/// `high`, a class entry applying to the request must say `allowHighPriority: true`. A
/// class that sets `priority: high` itself is the admin's decision and needs nothing more.
pub fn check_priority_policy(entries: &[ConfigEntry], request: &str) -> Result<(), ConfigError> {
    let applying = || entries.iter().filter(|e| e.applies_to(request));
    let Some(decider) = applying().rfind(|e| e.has_priority) else {
        return Ok(());
    };
    if decider.from_class || decider.config.priority != Priority::High {
        return Ok(());
    }
    if applying().any(|e| e.from_class && e.config.allow_high_priority) {
        return Ok(());
    }
    Err(ConfigError {
        path: config_path(decider.position, "priority"),
        problem: ConfigProblem::HighPriorityNotAllowed {
            request: request.to_owned(),
            class: "its DeviceClass".into(),
        },
    })
}

/// The oversubscription policy for one request, on `entries` in [`share::order`]: when the
/// entry that decides `oversubscribe` (the last applying one that sets it) is a claim's and
/// says `true`, a class entry applying to the request must say `oversubscribe: true` too.
pub fn check_oversubscribe_policy(
    entries: &[ConfigEntry],
    request: &str,
) -> Result<(), ConfigError> {
    let applying = || entries.iter().filter(|e| e.applies_to(request));
    let Some(decider) = applying().rfind(|e| e.has_oversubscribe) else {
        return Ok(());
    };
    if decider.from_class || !decider.config.oversubscribe {
        return Ok(());
    }
    if applying().any(|e| e.from_class && e.has_oversubscribe && e.config.oversubscribe) {
        return Ok(());
    }
    Err(ConfigError {
        path: config_path(decider.position, "oversubscribe"),
        problem: ConfigProblem::OversubscribeNotAllowed {
            request: request.to_owned(),
            class: "its DeviceClass".into(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const D: &str = "gpu.fgpu.dev";

    fn claim(results: Value, config: Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "status": {"allocation": {"devices": {"results": results, "config": config}}}
        }))
        .unwrap()
    }

    fn params(extra: Value) -> Value {
        let mut p = json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig"});
        p.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        p
    }

    fn cfg(source: &str, requests: Value, extra: Value) -> Value {
        json!({"source": source, "requests": requests,
               "opaque": {"driver": D, "parameters": params(extra)}})
    }

    fn res(request: &str, device: &str) -> Value {
        json!({"request": request, "driver": D, "pool": "n1", "device": device})
    }

    const GI: u64 = 1 << 30;

    fn device_result(consumed: Option<&[(&str, &str)]>) -> DeviceResult {
        DeviceResult {
            request: "gpu".into(),
            driver: D.into(),
            pool: "n1".into(),
            device: "gpu-0".into(),
            consumed_capacity: consumed.map(|c| {
                c.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn consumed_capacity_is_read_with_its_field_path() {
        let none = consumed("ns/c", 0, &device_result(None)).unwrap();
        assert_eq!((none.memory, none.cores), (None, None));
        let both = consumed(
            "ns/c",
            1,
            &device_result(Some(&[("memory", "2Gi"), ("cores", "30")])),
        )
        .unwrap();
        assert_eq!(both.memory, Some(2 * GI));
        assert_eq!(both.cores, CorePercent::new(30));
        let e = consumed("ns/c", 3, &device_result(Some(&[("cores", "101")]))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "claim ns/c: status.allocation.devices.results[3].consumedCapacity.cores: \"101\" is above the maximum 100 (percent of the GPU)"
        );
        let e = consumed("ns/c", 2, &device_result(Some(&[("memory", "lots")]))).unwrap_err();
        assert_eq!(
            e.path(),
            Some("status.allocation.devices.results[2].consumedCapacity.memory")
        );
    }

    #[test]
    fn config_entries_keep_only_this_drivers_and_decode_them_strictly() {
        let config: Vec<AllocationConfig> = serde_json::from_value(json!([
            {"source": "FromClaim", "opaque": {"driver": "other.dev", "parameters": {"x": 1}}},
            cfg(SOURCE_FROM_CLASS, json!(["gpu"]), json!({"memory": "1Gi"})),
        ]))
        .unwrap();
        let entries = config_entries("ns/c", &config, D).unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].position, 1);
        assert!(entries[0].from_class);
        assert_eq!(entries[0].requests, ["gpu"]);
        assert!(!entries[0].has_priority);
        let bad: Vec<AllocationConfig> =
            serde_json::from_value(json!([cfg("FromClaim", json!([]), json!({"cores": 140}))]))
                .unwrap();
        let e = config_entries("ns/c", &bad, D).unwrap_err();
        assert!(
            e.path()
                .is_some_and(|p| p.starts_with("status.allocation.devices.config[0]")),
            "{e}"
        );
    }

    #[test]
    fn the_node_reads_nothing_said_as_the_whole_device() {
        let g = node_grant(share::resolve(&[], "gpu", None));
        assert_eq!(g.memory, MemoryGrant::Whole);
        assert_eq!(g.cores, CorePercent::ZERO);
        assert_eq!(
            (g.memory_source, g.cores_source),
            (Source::WholeDevice, Source::WholeDevice)
        );
    }

    #[test]
    fn a_zero_grant_names_where_it_came_from() {
        let zero = |memory_source| Grant {
            memory: MemoryGrant::Bytes(0),
            memory_source,
            cores: CorePercent::ZERO,
            cores_source: Source::WholeDevice,
            priority: Priority::Normal,
            oversubscribe: false,
        };
        let e = check_memory("ns/c", 4, &zero(Source::Config), Some(2)).unwrap_err();
        assert_eq!(
            e.path(),
            Some("status.allocation.devices.config[2].opaque.parameters.memory")
        );
        let e = check_memory("ns/c", 4, &zero(Source::ConsumedCapacity), None).unwrap_err();
        assert_eq!(
            e.path(),
            Some("status.allocation.devices.results[4].consumedCapacity.memory")
        );
        let one = Grant {
            memory: MemoryGrant::Bytes(1),
            ..zero(Source::Config)
        };
        assert!(check_memory("ns/c", 4, &one, Some(2)).is_ok());
    }

    #[test]
    fn no_devices_of_names_the_other_drivers_once_each() {
        let of = |driver: &str| DeviceResult {
            driver: driver.into(),
            ..Default::default()
        };
        let e = no_devices_of("ns/c".into(), D, &[of("b.dev"), of("a.dev"), of("b.dev")]);
        assert_eq!(
            e.to_string(),
            "claim ns/c: status.allocation.devices.results: no device of driver gpu.fgpu.dev (drivers allocated: a.dev, b.dev)"
        );
        assert!(
            no_devices_of("ns/c".into(), D, &[])
                .to_string()
                .ends_with("(drivers allocated: none)")
        );
    }

    #[test]
    fn grant_table() {
        use MemoryGrant::{Bytes, Whole};
        use Source::{Config, ConsumedCapacity as Cc, WholeDevice as W};
        struct Case {
            name: &'static str,
            results: Value,
            config: Value,
            // (memory, memory source, cores, cores source, priority, oversubscribe) per result
            want: Vec<(MemoryGrant, Source, u8, Source, Priority, bool)>,
        }
        let cases = [
            Case {
                name: "nothing said: whole device",
                results: json!([res("gpu", "gpu-0")]),
                config: json!([]),
                want: vec![(Whole, W, 0, W, Priority::Normal, false)],
            },
            Case {
                name: "consumedCapacity wins over config (high priority: the class allows it)",
                results: json!([{"request": "gpu", "driver": D, "pool": "n1", "device": "gpu-0",
                    "shareID": "s1", "consumedCapacity": {"memory": "10Gi", "cores": "30"}}]),
                config: json!([
                    cfg(
                        "FromClass",
                        json!(["gpu"]),
                        json!({"allowHighPriority": true})
                    ),
                    cfg(
                        "FromClaim",
                        json!([]),
                        json!({"memory": "20Gi", "cores": 50, "priority": "high"})
                    )
                ]),
                want: vec![(Bytes(10 * GI), Cc, 30, Cc, Priority::High, false)],
            },
            Case {
                name: "consumedCapacity with memory only: cores from config",
                results: json!([{"request": "gpu", "driver": D, "pool": "n1", "device": "gpu-0",
                    "consumedCapacity": {"memory": "1Gi"}}]),
                config: json!([cfg("FromClaim", json!(["gpu"]), json!({"cores": 25}))]),
                want: vec![(Bytes(GI), Cc, 25, Config, Priority::Normal, false)],
            },
            Case {
                name: "class then claim, later wins field by field",
                results: json!([res("gpu", "gpu-0")]),
                config: json!([
                    cfg("FromClaim", json!([]), json!({"memory": "4Gi"})),
                    cfg(
                        "FromClass",
                        json!([]),
                        json!({"memory": "8Gi", "cores": 10, "priority": "low", "oversubscribe": true})
                    ),
                ]),
                want: vec![(Bytes(4 * GI), Config, 10, Config, Priority::Low, true)],
            },
            Case {
                name: "per-request config, subrequests match their parent",
                results: json!([
                    res("a", "gpu-0"),
                    res("b/small", "gpu-1"),
                    res("c", "gpu-2")
                ]),
                config: json!([
                    cfg("FromClaim", json!(["a"]), json!({"memory": "1Gi"})),
                    cfg(
                        "FromClaim",
                        json!(["b"]),
                        json!({"memory": "2Gi", "cores": 20})
                    ),
                ]),
                want: vec![
                    (Bytes(GI), Config, 0, W, Priority::Normal, false),
                    (Bytes(2 * GI), Config, 20, Config, Priority::Normal, false),
                    (Whole, W, 0, W, Priority::Normal, false),
                ],
            },
            Case {
                name: "other drivers' results and configs are ignored",
                results: json!([res("gpu", "gpu-0"),
                    {"request": "nic", "driver": "net.example.com", "pool": "n1", "device": "eth0"}]),
                config: json!([{"source": "FromClaim", "requests": [],
                    "opaque": {"driver": "net.example.com", "parameters": {"anything": true}}}]),
                want: vec![(Whole, W, 0, W, Priority::Normal, false)],
            },
        ];
        for case in cases {
            let got = resolve(&claim(case.results, case.config), D)
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            let got: Vec<_> = got
                .iter()
                .map(|r| {
                    let g = r.grant;
                    (
                        g.memory,
                        g.memory_source,
                        g.cores.get(),
                        g.cores_source,
                        g.priority,
                        g.oversubscribe,
                    )
                })
                .collect();
            assert_eq!(got, case.want, "{}", case.name);
        }
    }

    #[test]
    fn error_table() {
        let cases = [
            (
                "bad cores in the second config entry",
                claim(
                    json!([res("gpu", "gpu-0")]),
                    json!([
                        cfg("FromClass", json!([]), json!({})),
                        cfg("FromClaim", json!(["other"]), json!({"cores": 140}))
                    ]),
                ),
                "claim ns/c: status.allocation.devices.config[1].opaque.parameters.cores: 140 is above the maximum 100",
            ),
            (
                "unknown field",
                claim(
                    json!([res("gpu", "gpu-0")]),
                    json!([cfg("FromClaim", json!([]), json!({"memroy": "1Gi"}))]),
                ),
                "claim ns/c: status.allocation.devices.config[0].opaque.parameters.memroy: unknown field",
            ),
            (
                "bad consumed memory",
                claim(
                    json!([{"request": "gpu", "driver": D, "pool": "n1", "device": "gpu-0",
                            "consumedCapacity": {"memory": "0.5"}}]),
                    json!([]),
                ),
                "claim ns/c: status.allocation.devices.results[0].consumedCapacity.memory: \"0.5\" is not a whole number",
            ),
            (
                "consumed cores above 100",
                claim(
                    json!([res("x", "gpu-9"),
                           {"request": "gpu", "driver": D, "pool": "n1", "device": "gpu-0",
                            "consumedCapacity": {"cores": "101"}}]),
                    json!([]),
                ),
                "claim ns/c: status.allocation.devices.results[1].consumedCapacity.cores: \"101\" is above the maximum 100",
            ),
            (
                "zero memory",
                claim(
                    json!([{"request": "gpu", "driver": D, "pool": "n1", "device": "gpu-0",
                            "consumedCapacity": {"memory": "0"}}]),
                    json!([]),
                ),
                "claim ns/c: status.allocation.devices.results[0].consumedCapacity.memory: grants 0 bytes",
            ),
            (
                "zero memory from config names the config entry",
                claim(
                    json!([res("gpu", "gpu-0")]),
                    json!([
                        cfg("FromClass", json!([]), json!({"memory": "1Gi"})),
                        cfg("FromClaim", json!(["gpu"]), json!({"memory": 0}))
                    ]),
                ),
                "claim ns/c: status.allocation.devices.config[1].opaque.parameters.memory: 0 grants no device memory",
            ),
            (
                "another driver's allocation",
                claim(
                    json!([{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]),
                    json!([]),
                ),
                "claim ns/c: status.allocation.devices.results: no device of driver gpu.fgpu.dev (drivers allocated: gpu.nvidia.com)",
            ),
        ];
        for (name, c, want) in cases {
            let e = resolve(&c, D).unwrap_err().to_string();
            assert!(
                e.starts_with(want),
                "{name}: got {e:?}, want prefix {want:?}"
            );
        }
        let unallocated: ResourceClaim = serde_json::from_value(
            json!({"metadata": {"name": "c", "namespace": "ns", "uid": "u1"}}),
        )
        .unwrap();
        let e = resolve(&unallocated, D).unwrap_err();
        assert!(matches!(e, GrantError::NotAllocated { .. }));
        assert_eq!(e.path(), Some("status.allocation"));
        assert!(
            e.to_string()
                .starts_with("claim ns/c: status.allocation: not allocated")
        );
    }

    /// Claims that try to get `priority: high` without the class's permission, and the ways
    /// a class grants it.
    /// Each (case, allocation config, error prefix): a claim with one result of request
    /// `gpu` and that config is refused with an error starting so.
    fn assert_refused<const N: usize>(cases: [(&str, Value, &str); N]) {
        for (name, config, want) in cases {
            let e = resolve(&claim(json!([res("gpu", "gpu-0")]), config), D)
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(want),
                "{name}: got {e:?}, want prefix {want:?}"
            );
        }
    }

    #[test]
    fn priority_policy() {
        let high = json!({"priority": "high"});
        let refused = [
            (
                "a claim asks high, the class says nothing",
                json!([
                    cfg("FromClass", json!(["gpu"]), json!({"memory": "1Gi"})),
                    cfg("FromClaim", json!([]), high.clone())
                ]),
                r#"claim ns/c: status.allocation.devices.config[1].opaque.parameters.priority: "high" is not allowed for request "gpu": its DeviceClass does not set allowHighPriority: true"#,
            ),
            (
                "no class config at all",
                json!([cfg("FromClaim", json!(["gpu"]), high.clone())]),
                r#"claim ns/c: status.allocation.devices.config[0].opaque.parameters.priority: "high" is not allowed for request "gpu""#,
            ),
            (
                "the claim grants itself allowHighPriority",
                json!([cfg(
                    "FromClaim",
                    json!([]),
                    json!({"priority": "high", "allowHighPriority": true})
                )]),
                "claim ns/c: status.allocation.devices.config[0].opaque.parameters.allowHighPriority: may be set only in a DeviceClass's configuration",
            ),
            (
                "the claim sets allowHighPriority even without asking high",
                json!([cfg(
                    "FromClaim",
                    json!(["other"]),
                    json!({"allowHighPriority": true})
                )]),
                "claim ns/c: status.allocation.devices.config[0].opaque.parameters.allowHighPriority: may be set only",
            ),
            (
                "another request's class allows it, not this one's",
                json!([
                    cfg(
                        "FromClass",
                        json!(["other"]),
                        json!({"allowHighPriority": true})
                    ),
                    cfg("FromClaim", json!(["gpu"]), high.clone())
                ]),
                r#"claim ns/c: status.allocation.devices.config[1].opaque.parameters.priority: "high" is not allowed for request "gpu""#,
            ),
            (
                "allowHighPriority: false in the class",
                json!([
                    cfg("FromClass", json!([]), json!({"allowHighPriority": false})),
                    cfg("FromClaim", json!([]), high.clone())
                ]),
                r#"claim ns/c: status.allocation.devices.config[1].opaque.parameters.priority: "high" is not allowed"#,
            ),
        ];
        assert_refused(refused);
        let allowed = [
            (
                "the class allows it",
                json!([
                    cfg(
                        "FromClass",
                        json!(["gpu"]),
                        json!({"allowHighPriority": true})
                    ),
                    cfg("FromClaim", json!([]), high.clone())
                ]),
                Priority::High,
            ),
            (
                "the class itself sets high",
                json!([cfg("FromClass", json!([]), high.clone())]),
                Priority::High,
            ),
            (
                "the claim overrides the class's high with low",
                json!([
                    cfg("FromClass", json!([]), high.clone()),
                    cfg("FromClaim", json!([]), json!({"priority": "low"}))
                ]),
                Priority::Low,
            ),
            (
                "the claim asks normal",
                json!([cfg("FromClaim", json!([]), json!({"priority": "normal"}))]),
                Priority::Normal,
            ),
        ];
        for (name, config, want) in allowed {
            let r = resolve(&claim(json!([res("gpu", "gpu-0")]), config), D)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(r[0].grant.priority, want, "{name}");
        }
    }

    #[test]
    fn oversubscribe_counts_only_where_the_class_sets_it() {
        let on = json!({"oversubscribe": true});
        let refused = [
            (
                "a claim on the shared class sets it",
                json!([
                    cfg("FromClass", json!([]), json!({"memory": "1Gi"})),
                    cfg("FromClaim", json!(["gpu"]), on.clone())
                ]),
                r#"claim ns/c: status.allocation.devices.config[1].opaque.parameters.oversubscribe: (result 0) true is not allowed for request "gpu": its DeviceClass does not set oversubscribe: true"#,
            ),
            (
                "the class says false",
                json!([
                    cfg("FromClass", json!([]), json!({"oversubscribe": false})),
                    cfg("FromClaim", json!([]), on.clone())
                ]),
                "claim ns/c: status.allocation.devices.config[1].opaque.parameters.oversubscribe: (result 0)",
            ),
            (
                "another request's class sets it",
                json!([
                    cfg("FromClass", json!(["other"]), on.clone()),
                    cfg("FromClaim", json!([]), on.clone())
                ]),
                "claim ns/c: status.allocation.devices.config[1].opaque.parameters.oversubscribe:",
            ),
        ];
        assert_refused(refused);
        let allowed = [
            (
                "the research class sets it",
                json!([cfg("FromClass", json!([]), on.clone())]),
                true,
            ),
            (
                "the class sets it and the claim repeats it",
                json!([
                    cfg("FromClass", json!([]), on.clone()),
                    cfg("FromClaim", json!([]), on.clone())
                ]),
                true,
            ),
            (
                "a claim turns it off",
                json!([cfg("FromClaim", json!([]), json!({"oversubscribe": false}))]),
                false,
            ),
        ];
        for (name, config, want) in allowed {
            let r = resolve(&claim(json!([res("gpu", "gpu-0")]), config), D)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(r[0].grant.oversubscribe, want, "{name}");
        }
    }
}
