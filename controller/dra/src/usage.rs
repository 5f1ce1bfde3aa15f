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
use fgpu_api::names::capacity;
use fgpu_driver::engine::Inventory;
use fgpu_driver::grant::{self, ConfigEntry, Consumed};
use fgpu_driver::ledger::{DeviceGrant, Grant, Ledger, LedgerError};
use serde_json::Value;

use crate::{object_key, quantity_u64};

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
pub fn grant_id(claim: &Value) -> String {
    grant_id_of(
        claim["metadata"]["uid"].as_str().unwrap_or_default(),
        || object_key(claim),
    )
}

/// [`grant_id`] from the claim's UID (empty when it has none) and its key.
pub fn grant_id_of(uid: &str, key: impl FnOnce() -> String) -> String {
    if uid.is_empty() {
        key()
    } else {
        uid.to_owned()
    }
}

/// The grant of `claim`'s results of `driver`; `None` when the claim is not allocated or
/// has no device of this driver. `inventory` gives whole-device sizes.
pub fn claim_grant(
    claim: &Value,
    driver: &str,
    inventory: &Inventory,
) -> Result<Option<Grant>, UsageError> {
    let alloc = &claim["status"]["allocation"];
    if alloc.is_null() {
        return Ok(None);
    }
    let key = object_key(claim);
    let invalid = |path: String, problem: String| UsageError::Invalid {
        claim: key.clone(),
        path,
        problem,
    };
    let empty = Vec::new();
    let configs = alloc["devices"]["config"].as_array().unwrap_or(&empty);
    let mut entries = Vec::new();
    for (i, c) in configs.iter().enumerate() {
        if c["opaque"]["driver"].as_str() != Some(driver) {
            continue;
        }
        let params = &c["opaque"]["parameters"];
        let base = format!("status.allocation.devices.config[{i}].opaque.parameters");
        let config = GpuShareConfig::from_value(params, &base)
            .map_err(|e| invalid(e.path, e.problem.to_string()))?;
        let requests = c["requests"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let present = |f: &str| params.get(f).is_some_and(|v| !v.is_null());
        entries.push(ConfigEntry {
            from_class: c["source"] == "FromClass",
            position: i,
            requests,
            config,
            has_priority: present("priority"),
            has_oversubscribe: present("oversubscribe"),
        });
    }
    grant::order(&mut entries);

    let results = alloc["devices"]["results"].as_array().unwrap_or(&empty);
    let mut node: Option<String> = None;
    let mut devices = Vec::new();
    for (i, r) in results.iter().enumerate() {
        if r["driver"].as_str() != Some(driver) || r["adminAccess"] == Value::Bool(true) {
            continue;
        }
        let path = |f: &str| format!("status.allocation.devices.results[{i}].{f}");
        let field = |f: &str| {
            r[f].as_str()
                .filter(|s| !s.is_empty())
                .ok_or_else(|| invalid(path(f), "missing or not a string".to_owned()))
        };
        let (request, pool, device) = (field("request")?, field("pool")?, field("device")?);
        match &node {
            Some(n) if n != pool => {
                return Err(invalid(
                    path("pool"),
                    format!(
                        "{pool:?}: the claim's other devices are on {n:?}; a claim of this driver lives on one node"
                    ),
                ));
            }
            _ => node = Some(pool.to_owned()),
        }
        let gpu = inventory
            .node_index(pool)
            .and_then(|n| inventory.nodes[n].gpus.iter().find(|g| g.id == device));
        let (memory_total, cores_total) = gpu.map_or((None, None), |g| {
            (Some(g.memory_total), Some(g.cores_total))
        });
        let consumed = match r["consumedCapacity"].as_object() {
            None => None,
            Some(cc) => {
                let get = |name: &str| {
                    cc.get(name)
                        .map(|v| {
                            quantity_u64(v).map_err(|p| {
                                invalid(path(&format!("consumedCapacity.{name}")), p.to_string())
                            })
                        })
                        .transpose()
                };
                let cores = match get(capacity::CORES)? {
                    None => None,
                    Some(n) => Some(u8::try_from(n).ok().and_then(CorePercent::new).ok_or_else(
                        || {
                            invalid(
                                path("consumedCapacity.cores"),
                                format!("{n} is above the maximum 100"),
                            )
                        },
                    )?),
                };
                Some(Consumed {
                    memory: get(capacity::MEMORY)?,
                    cores,
                })
            }
        };
        let share = grant::resolve(&entries, request, consumed);
        let memory = match share.memory {
            Some(m) => m,
            None => memory_total.ok_or_else(|| {
                invalid(
                    path("device"),
                    format!(
                        "{pool}/{device} is not in any ResourceSlice; its memory size is unknown"
                    ),
                )
            })?,
        };
        let cores = match share.cores {
            Some(c) => u32::from(c.get()),
            None if share.is_whole_device() => cores_total.unwrap_or(100),
            None => 0,
        };
        devices.push(DeviceGrant {
            gpu: device.to_owned(),
            memory,
            cores,
        });
    }
    Ok(node.map(|node| Grant {
        id: grant_id(claim),
        node,
        cpu_milli: 0,
        memory_mib: 0,
        devices,
    }))
}

/// The ledger over `capacity` with every claim's grant, and the claims that did not count.
#[derive(Clone, Debug)]
pub struct Usage {
    pub ledger: Ledger,
    /// One per claim left out. Any of these means the ledger may under-count: the caller
    /// should not allocate on the named node until it is resolved.
    pub errors: Vec<UsageError>,
}

/// Rebuilds the ledger from all claims (allocated or not; only allocated ones count).
pub fn rebuild<'a>(
    driver: &str,
    capacity: Inventory,
    claims: impl IntoIterator<Item = &'a Value>,
) -> Usage {
    let grants: Vec<(String, Result<Option<Grant>, UsageError>)> = claims
        .into_iter()
        .map(|c| (object_key(c), claim_grant(c, driver, &capacity)))
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
            let g = claim_grant(&claim("u1", results, config), DRIVER, &inv())
                .unwrap()
                .unwrap();
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
            let e = claim_grant(&c, DRIVER, &inv()).unwrap_err();
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
