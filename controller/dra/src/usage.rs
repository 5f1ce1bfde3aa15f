//! Every allocated ResourceClaim → the ledger's grants → a rebuilt [`Ledger`].
//!
//! Claims allocated by kube-scheduler (consumable capacity) and by this controller count
//! alike, so that nothing is granted twice. Per allocation result of this driver (results
//! with `adminAccess` take nothing and are skipped), per field, the first that says
//! something wins:
//!
//! 1. the result's `consumedCapacity` (`memory`, `cores`);
//! 2. this driver's `GpuShareConfig`s in `status.allocation.devices.config` that apply to
//!    the result's request (no `requests`, or naming `<req>` or the parent of `<req>/<sub>`),
//!    class entries before claim entries, later entries winning field by field; memory
//!    left unset there is all of the device's memory, cores left unset 0;
//! 3. the whole device: all its memory and all its cores.
//!
//! The merge is [`fgpu_driver::grant::resolve`], the node side's rule
//! (`kubelet-plugin/src/grant.rs` has its own copy until it switches over). Only rule 3
//! differs: the node grants "not throttled" (cores 0), while the ledger, like
//! kube-scheduler for a result without `shareID`, counts the whole device as taken.

use fgpu_api::config::{CorePercent, GpuShareConfig};
use fgpu_api::dra::claim::{
    AllocationConfig, DeviceAllocation, DeviceResult, ResourceClaim, SOURCE_FROM_CLASS,
};
use fgpu_api::names::capacity;
use fgpu_driver::engine::Inventory;
use fgpu_driver::grant::{self, ConfigEntry, Consumed};
use fgpu_driver::ledger::{DeviceGrant, Grant, Ledger, LedgerError};
use serde::Deserialize;
use serde_json::Value;

use crate::claim_key;

/// Why a claim's allocation does not count in the ledger.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    /// A field of the claim is invalid.
    #[error("claim {claim}: {path}: {problem}")]
    Invalid {
        /// `namespace/name`.
        claim: String,
        /// Field path in the claim.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The claim's text does not read as a ResourceClaim at all (not a JSON object).
    #[error("claim {claim}: does not read as a ResourceClaim: {problem}")]
    Unreadable {
        /// `namespace/name`, or the UID where the name could not be read.
        claim: String,
        /// The parser's message.
        problem: String,
    },
    /// The ledger refused the claim's grant (unknown node or GPU, or more than is free:
    /// the cluster already holds a double grant).
    #[error("claim {claim}: {source}")]
    Ledger {
        /// `namespace/name`.
        claim: String,
        /// The ledger's reason.
        source: LedgerError,
    },
}

/// The id of a claim's grant in the ledger: its UID, else `namespace/name`.
pub fn grant_id(claim: &ResourceClaim) -> String {
    grant_id_of(&claim.metadata.uid, || claim_key(claim))
}

/// [`grant_id`] from the claim's UID (empty when it has none) and its key.
pub fn grant_id_of(uid: &str, key: impl FnOnce() -> String) -> String {
    if uid.is_empty() {
        key()
    } else {
        uid.to_owned()
    }
}

/// An invalid field of claim `claim` (its key).
fn invalid(claim: &str, path: String, problem: String) -> UsageError {
    UsageError::Invalid {
        claim: claim.to_owned(),
        path,
        problem,
    }
}

/// The grant of `claim`'s results of `driver`; `None` when the claim is not allocated or
/// has no device of this driver. `inventory` gives whole-device sizes.
pub fn claim_grant(
    claim: &ResourceClaim,
    driver: &str,
    inventory: &Inventory,
) -> Result<Option<Grant>, UsageError> {
    if !claim.is_allocated() {
        return Ok(None);
    }
    let key = claim_key(claim);
    let empty = DeviceAllocation::default();
    let alloc = claim.allocation().unwrap_or(&empty);
    let entries = config_entries(&alloc.config, driver, &key)?;
    let mut node: Option<&str> = None;
    let mut devices = Vec::new();
    for (i, r) in alloc.results.iter().enumerate() {
        if r.driver != driver || r.admin_access == Some(true) {
            continue;
        }
        // A MIG placement is a device of its own, not a share of a GPU: it is counted in
        // the MIG placements taken (`crate::mig`), not in the ledger.
        if fgpu_driver::mig::parse_device_name(&r.device).is_some() {
            continue;
        }
        let at = ResultAt {
            key: &key,
            index: i,
        };
        let names = at.names(r)?;
        same_node(&mut node, names.pool, &at)?;
        devices.push(device_grant(r, &names, &entries, inventory, &at)?);
    }
    Ok(node.map(|node| Grant {
        id: grant_id(claim),
        node: node.to_owned(),
        cpu_milli: 0,
        memory_mib: 0,
        devices,
    }))
}

/// This driver's entries of `status.allocation.devices.config`, decoded, in the order the
/// grant rule reads them ([`grant::order`]).
fn config_entries(
    configs: &[AllocationConfig],
    driver: &str,
    key: &str,
) -> Result<Vec<ConfigEntry>, UsageError> {
    let mut entries = Vec::new();
    for (i, c) in configs.iter().enumerate() {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        let base = format!("status.allocation.devices.config[{i}].opaque.parameters");
        let config = GpuShareConfig::from_value(&opaque.parameters, &base)
            .map_err(|e| invalid(key, e.path, e.problem.to_string()))?;
        entries.push(ConfigEntry {
            from_class: c.source == SOURCE_FROM_CLASS,
            position: i,
            requests: c.requests.clone(),
            config,
            has_priority: opaque.has("priority"),
            has_oversubscribe: opaque.has("oversubscribe"),
        });
    }
    grant::order(&mut entries);
    Ok(entries)
}

/// Where in a claim one allocation result is: errors name the claim and the field.
struct ResultAt<'a> {
    /// The claim's `namespace/name`.
    key: &'a str,
    /// Index in `status.allocation.devices.results`.
    index: usize,
}

impl ResultAt<'_> {
    /// The path of field `f` of the result.
    fn path(&self, f: &str) -> String {
        format!("status.allocation.devices.results[{}].{f}", self.index)
    }

    /// An error at field `f` of the result.
    fn err(&self, f: &str, problem: String) -> UsageError {
        invalid(self.key, self.path(f), problem)
    }

    /// The names result `r` must carry: `request`, `pool` and `device`, none empty.
    fn names<'r>(&self, r: &'r DeviceResult) -> Result<Names<'r>, UsageError> {
        let required = |f: &str, value: &'r str| {
            if value.is_empty() {
                Err(self.err(f, "missing or not a string".to_owned()))
            } else {
                Ok(value)
            }
        };
        Ok(Names {
            request: required("request", &r.request)?,
            pool: required("pool", &r.pool)?,
            device: required("device", &r.device)?,
        })
    }
}

/// What names one allocation result: its request, pool (node) and device.
#[derive(Clone, Copy)]
struct Names<'r> {
    request: &'r str,
    pool: &'r str,
    device: &'r str,
}

/// Checks that `pool` is the node of the claim's earlier results (`node`, set by the
/// first): a claim of this driver lives on one node.
fn same_node<'a>(
    node: &mut Option<&'a str>,
    pool: &'a str,
    at: &ResultAt<'_>,
) -> Result<(), UsageError> {
    match node {
        Some(n) if *n != pool => Err(at.err(
            "pool",
            format!(
                "{pool:?}: the claim's other devices are on {n:?}; a claim of this driver lives on one node"
            ),
        )),
        _ => {
            *node = Some(pool);
            Ok(())
        }
    }
}

/// What result `r` (named `names`) takes of its device: `consumedCapacity`, else the
/// configuration `entries`, else the whole device (its size from `inventory`).
fn device_grant(
    r: &DeviceResult,
    names: &Names<'_>,
    entries: &[ConfigEntry],
    inventory: &Inventory,
    at: &ResultAt<'_>,
) -> Result<DeviceGrant, UsageError> {
    let Names {
        request,
        pool,
        device,
    } = *names;
    let gpu = inventory
        .node_index(pool)
        .and_then(|n| inventory.nodes[n].gpus.iter().find(|g| g.id == device));
    let share = grant::resolve(entries, request, consumed(r, at)?);
    let memory = match share.memory {
        Some(m) => m,
        None => gpu.map(|g| g.memory_total).ok_or_else(|| {
            at.err(
                "device",
                format!("{pool}/{device} is not in any ResourceSlice; its memory size is unknown"),
            )
        })?,
    };
    let cores = match share.cores {
        Some(c) => u32::from(c.get()),
        None if share.is_whole_device() => gpu.map_or(100, |g| g.cores_total),
        None => 0,
    };
    Ok(DeviceGrant {
        gpu: device.to_owned(),
        memory,
        cores,
    })
}

/// The result's `consumedCapacity` (`memory`, `cores`), `None` when it has none.
fn consumed(r: &DeviceResult, at: &ResultAt<'_>) -> Result<Option<Consumed>, UsageError> {
    let Some(cc) = &r.consumed_capacity else {
        return Ok(None);
    };
    let get = |name: &str| {
        cc.get(name)
            .map(|v| {
                fgpu_api::quantity::parse_u64(v)
                    .map_err(|p| at.err(&format!("consumedCapacity.{name}"), p.to_string()))
            })
            .transpose()
    };
    let cores = match get(capacity::CORES)? {
        None => None,
        Some(n) => Some(
            u8::try_from(n)
                .ok()
                .and_then(CorePercent::new)
                .ok_or_else(|| {
                    at.err(
                        "consumedCapacity.cores",
                        format!("{n} is above the maximum 100"),
                    )
                })?,
        ),
    };
    Ok(Some(Consumed {
        memory: get(capacity::MEMORY)?,
        cores,
    }))
}

/// The claim `c` (JSON) typed; a value that is not a JSON object is
/// [`UsageError::Unreadable`], named by its key.
pub fn typed(c: &Value) -> Result<ResourceClaim, UsageError> {
    ResourceClaim::deserialize(c).map_err(|e| UsageError::Unreadable {
        claim: crate::object_key(c),
        problem: e.to_string(),
    })
}

/// The ledger over `capacity` with every claim's grant, and the claims that did not count.
#[derive(Clone, Debug)]
pub struct Usage {
    pub ledger: Ledger,
    /// One per claim left out. Any of these means the ledger may under-count: the caller
    /// should not allocate on the named node until it is resolved.
    pub errors: Vec<UsageError>,
}

/// Rebuilds the ledger from all claims, as JSON (allocated or not; only allocated ones
/// count).
pub fn rebuild<'a>(
    driver: &str,
    capacity: Inventory,
    claims: impl IntoIterator<Item = &'a Value>,
) -> Usage {
    let grants: Vec<(String, Result<Option<Grant>, UsageError>)> = claims
        .into_iter()
        .map(|c| {
            let grant = typed(c).and_then(|c| claim_grant(&c, driver, &capacity));
            (crate::object_key(c), grant)
        })
        .collect();
    rebuild_from(capacity, grants.iter().map(|(k, g)| (k.as_str(), g)))
}

/// The ledger over `capacity` with each claim's grant already read ([`claim_grant`]),
/// given as (`namespace/name`, grant).
pub fn rebuild_from<'a>(
    capacity: Inventory,
    grants: impl IntoIterator<Item = (&'a str, &'a Result<Option<Grant>, UsageError>)>,
) -> Usage {
    let mut errors = Vec::new();
    let mut ledger = Ledger::new(capacity);
    for (claim, g) in grants {
        match g {
            Ok(Some(g)) => {
                if let Err(source) = ledger.grant(g.clone()) {
                    errors.push(UsageError::Ledger {
                        claim: claim.to_owned(),
                        source,
                    });
                }
            }
            Ok(None) => {}
            Err(e) => errors.push(e.clone()),
        }
    }
    Usage { ledger, errors }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_driver::engine::{Gpu, Node};
    use serde_json::json;

    const DRIVER: &str = "gpu.fgpu.dev";

    fn inv() -> Inventory {
        Inventory {
            nodes: vec![Node::new(
                "node-a",
                vec![
                    Gpu::new("gpu-0", "H100", 80 << 30),
                    Gpu::new("gpu-1", "H100", 80 << 30),
                ],
            )],
        }
    }

    fn claim(uid: &str, results: Value, config: Value) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("c-{uid}"), "namespace": "ns", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "shared.gpu.fgpu.dev"}}]}},
            "status": {"allocation": {
                "devices": {"results": results, "config": config},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}
            }}
        })
    }

    /// [`claim_grant`] of the JSON claim `c` over [`inv`].
    fn grant_of(c: &Value) -> Result<Option<Grant>, UsageError> {
        claim_grant(&typed(c).unwrap(), DRIVER, &inv())
    }

    fn result(device: &str) -> Value {
        json!({"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device})
    }

    fn share(memory: &str, cores: u8) -> Value {
        json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": memory, "cores": cores})
    }

    #[test]
    fn grant_resolution_table() {
        let mut consumed = result("gpu-0");
        consumed["shareID"] = json!("6f1c3a0e-0000-4000-8000-000000000000");
        consumed["consumedCapacity"] = json!({"memory": "20Gi", "cores": "25"});
        let mut consumed_memory_only = result("gpu-0");
        consumed_memory_only["consumedCapacity"] = json!({"memory": "1Gi"});
        let mut admin = result("gpu-1");
        admin["adminAccess"] = json!(true);
        let other = json!({"request": "nic", "driver": "net.example.com", "pool": "node-a", "device": "eth0"});
        let class = |p: Value| json!({"source": "FromClass", "requests": [], "opaque": {"driver": DRIVER, "parameters": p}});
        let from_claim = |reqs: Value, p: Value| json!({"source": "FromClaim", "requests": reqs, "opaque": {"driver": DRIVER, "parameters": p}});
        let cores_only =
            json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "cores": 10});
        type Case<'a> = (&'a str, Value, Value, Vec<(&'a str, u64, u32)>);
        let cases: Vec<Case<'_>> = vec![
            (
                "consumedCapacity wins over config",
                json!([consumed.clone()]),
                json!([from_claim(json!([]), share("1Gi", 1))]),
                vec![("gpu-0", 20 << 30, 25)],
            ),
            (
                "a capacity left out of consumedCapacity is 0",
                json!([consumed_memory_only]),
                json!([]),
                vec![("gpu-0", 1 << 30, 0)],
            ),
            (
                "config: claim after class, even written first",
                json!([result("gpu-0")]),
                json!([
                    from_claim(json!(["gpu"]), share("10Gi", 30)),
                    class(share("4Gi", 5))
                ]),
                vec![("gpu-0", 10 << 30, 30)],
            ),
            (
                "config for another request does not apply",
                json!([result("gpu-0")]),
                json!([from_claim(json!(["other"]), share("10Gi", 30))]),
                vec![("gpu-0", 80 << 30, 100)],
            ),
            (
                "config cores only: all memory",
                json!([result("gpu-1")]),
                json!([class(cores_only)]),
                vec![("gpu-1", 80 << 30, 10)],
            ),
            (
                "nothing said: whole device",
                json!([result("gpu-1")]),
                json!([]),
                vec![("gpu-1", 80 << 30, 100)],
            ),
            (
                "admin access and other drivers skipped",
                json!([admin, other, consumed]),
                json!([]),
                vec![("gpu-0", 20 << 30, 25)],
            ),
        ];
        for (what, results, config, want) in cases {
            let g = grant_of(&claim("u1", results, config)).unwrap().unwrap();
            assert_eq!((g.id.as_str(), g.node.as_str()), ("u1", "node-a"), "{what}");
            let got: Vec<_> = g
                .devices
                .iter()
                .map(|d| (d.gpu.as_str(), d.memory, d.cores))
                .collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn errors_name_claim_and_field() {
        let bad_cfg = json!([{"source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER,
            "parameters": {"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "cores": 140}}}]);
        let mut bad_cc = result("gpu-0");
        bad_cc["consumedCapacity"] = json!({"memory": "lots"});
        let mut big_cores = result("gpu-0");
        big_cores["consumedCapacity"] = json!({"memory": "1Gi", "cores": "101"});
        let mut other_node = result("gpu-1");
        other_node["pool"] = json!("node-b");
        let cases = [
            (
                "bad config",
                claim("u1", json!([result("gpu-0")]), bad_cfg),
                "status.allocation.devices.config[0].opaque.parameters.cores",
            ),
            (
                "bad consumedCapacity",
                claim("u1", json!([bad_cc]), json!([])),
                "status.allocation.devices.results[0].consumedCapacity.memory",
            ),
            (
                "consumedCapacity cores above 100",
                claim("u1", json!([big_cores]), json!([])),
                "status.allocation.devices.results[0].consumedCapacity.cores",
            ),
            (
                "two nodes",
                claim("u1", json!([result("gpu-0"), other_node]), json!([])),
                "status.allocation.devices.results[1].pool",
            ),
            (
                "unknown device",
                claim("u1", json!([result("gpu-9")]), json!([])),
                "status.allocation.devices.results[0].device",
            ),
        ];
        for (what, c, path) in cases {
            let e = grant_of(&c).unwrap_err();
            let UsageError::Invalid { claim, path: p, .. } = &e else {
                panic!("{what}: {e}")
            };
            assert_eq!((claim.as_str(), p.as_str()), ("ns/c-u1", path), "{what}");
            assert!(
                e.to_string()
                    .starts_with("claim ns/c-u1: status.allocation"),
                "{what}: {e}"
            );
        }
    }

    #[test]
    fn rebuild_counts_all_claims_and_reports_double_grants() {
        let mut a = result("gpu-0");
        a["consumedCapacity"] = json!({"memory": "60Gi", "cores": "50"});
        let mut b = result("gpu-0");
        b["consumedCapacity"] = json!({"memory": "30Gi", "cores": "10"});
        let pending =
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "p"}, "status": {}});
        let claims = [
            claim("a", json!([a]), json!([])),
            pending,
            claim("b", json!([b]), json!([])),
            claim("c", json!([result("gpu-1")]), json!([])),
        ];
        let u = rebuild(DRIVER, inv(), &claims);
        assert_eq!(u.ledger.len(), 2, "a and c count, b would over-grant gpu-0");
        assert_eq!(u.errors.len(), 1);
        assert!(
            matches!(&u.errors[0], UsageError::Ledger { claim, source: LedgerError::OverGrant { .. } } if claim == "ns/c-b"),
            "{:?}",
            u.errors
        );
        let gpus = &u.ledger.inventory().nodes[0].gpus;
        assert_eq!((gpus[0].memory_free, gpus[0].cores_free), (20 << 30, 50));
        assert!(gpus[1].memory_free == 0 && gpus[1].cores_free == 0);
    }
}
