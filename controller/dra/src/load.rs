//! The measured load of each GPU, from what the node monitor writes into each claim's
//! `status.devices` (`docs/node-monitor.md`, "Claim status"), for the engine's usage-aware
//! term ([`fgpu_driver::engine::load`]).
//!
//! Per claim, [`claim_loads`] keeps a few bytes per GPU of its grant: the latest
//! `smUtilizationPercent` and its `sampledAt` (a claim holding two shares of one GPU
//! reports the same figures on both: they count once). Per pass, [`apply`] sums over the
//! claims on each GPU the samples that are fresh (no older than [`UsageAware::fresh`]) into
//! [`Gpu::measured_load`](fgpu_driver::engine::Gpu::measured_load); a GPU with no fresh
//! sample keeps `None` (unknown: the term leaves it alone). Only the node monitor's
//! figures count; granted cores are not load.

use std::collections::HashMap;
use std::time::Duration;

use fgpu_api::dra::claim::ResourceClaim;
use fgpu_driver::engine::Inventory;
use fgpu_driver::ledger::Grant;

/// The usage-aware term's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UsageAware {
    /// Weight of the term (`--usage-aware-weight`); 0 turns it off.
    pub weight: f64,
    /// A sample older than this is stale (`--usage-fresh-seconds`).
    pub fresh: Duration,
}

impl Default for UsageAware {
    /// Off, with samples of the last 120 s counting once it is turned on.
    fn default() -> Self {
        Self {
            weight: 0.0,
            fresh: Duration::from_secs(DEFAULT_FRESH_SECONDS),
        }
    }
}

/// Default age (seconds) past which a sample no longer counts.
pub const DEFAULT_FRESH_SECONDS: u64 = 120;

impl UsageAware {
    /// Whether the term is on (weight above 0).
    pub fn is_on(&self) -> bool {
        self.weight > 0.0
    }
}

/// Reads a weight of the term: a finite number, 0 or more.
pub fn parse_weight(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(w) if w.is_finite() && w >= 0.0 => Ok(w),
        _ => Err(format!("{s:?} is not a weight: a finite number, 0 or more")),
    }
}

/// One claim's latest measured load on one GPU of its grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLoad {
    /// Index of the GPU in the grant's `devices`.
    pub device: u16,
    /// SM utilisation in percent, 0..=100.
    pub sm: u8,
    /// When it was measured, in Unix seconds.
    pub sampled_at: i64,
}

/// The loads `claim` reports for the GPUs of `grant` (its grant for `driver`): per GPU,
/// the entry of `status.devices` of this driver, the grant's node (pool) and that device
/// with the latest readable `sampledAt` (on equal times the larger figure). Entries without
/// a readable `smUtilizationPercent` or `sampledAt` are left out; an empty list costs
/// nothing.
pub fn claim_loads(claim: &ResourceClaim, driver: &str, grant: &Grant) -> Vec<DeviceLoad> {
    let Some(status) = &claim.status else {
        return Vec::new();
    };
    let mut out: Vec<DeviceLoad> = Vec::new();
    for e in &status.devices {
        if e.driver != driver || e.pool != grant.node {
            continue;
        }
        let Some(device) = grant.devices.iter().position(|d| d.gpu == e.device) else {
            continue;
        };
        let Ok(device) = u16::try_from(device) else {
            continue;
        };
        let Some(data) = &e.data else { continue };
        let (Some(sm), Some(at)) = (data.sm_utilization_percent, data.sampled_at.as_deref()) else {
            continue;
        };
        let Ok(at) = at.parse::<k8s_openapi::jiff::Timestamp>() else {
            continue;
        };
        let load = DeviceLoad {
            device,
            sm: sm.clamp(0, 100) as u8,
            sampled_at: at.as_second(),
        };
        match out.iter_mut().find(|l| l.device == device) {
            Some(l) if (load.sampled_at, load.sm) > (l.sampled_at, l.sm) => *l = load,
            Some(_) => {}
            None => out.push(load),
        }
    }
    out.shrink_to_fit();
    out
}

/// Sets [`Gpu::measured_load`](fgpu_driver::engine::Gpu::measured_load) of the GPUs of
/// `inv` that `claims` (each claim's grant and [`claim_loads`]) hold: the sum of the
/// samples taken at `now` (Unix seconds) or less than `fresh` before. GPUs with no fresh
/// sample are left as they are (`None`: unknown). Claims on nodes or GPUs `inv` does not
/// have are skipped.
pub fn apply<'a>(
    inv: &mut Inventory,
    claims: impl IntoIterator<Item = (&'a Grant, &'a [DeviceLoad])>,
    now: i64,
    fresh: Duration,
) {
    let fresh = i64::try_from(fresh.as_secs()).unwrap_or(i64::MAX);
    let mut nodes: HashMap<&str, usize> = HashMap::new();
    let mut sums: Vec<(usize, usize, u16)> = Vec::new();
    for (grant, loads) in claims {
        if loads.is_empty() {
            continue;
        }
        if nodes.is_empty() {
            nodes = inv
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.as_str(), i))
                .collect();
        }
        let Some(&n) = nodes.get(grant.node.as_str()) else {
            continue;
        };
        for l in loads {
            if now.saturating_sub(l.sampled_at) >= fresh {
                continue;
            }
            let Some(d) = grant.devices.get(usize::from(l.device)) else {
                continue;
            };
            let Some(g) = inv.nodes[n].gpus.iter().position(|g| g.id == d.gpu) else {
                continue;
            };
            sums.push((n, g, u16::from(l.sm)));
        }
    }
    for (n, g, sm) in sums {
        let gpu = &mut inv.nodes[n].gpus[g];
        gpu.measured_load = Some(gpu.measured_load.unwrap_or(0).saturating_add(sm));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_driver::engine::{Gpu, Node};
    use fgpu_driver::ledger::DeviceGrant;
    use serde_json::{Value, json};

    const NOW: i64 = 1_796_198_400;
    const FRESH: Duration = Duration::from_secs(120);

    fn at(secs_before_now: i64) -> String {
        k8s_openapi::jiff::Timestamp::from_second(NOW - secs_before_now)
            .unwrap()
            .to_string()
    }

    fn grant(id: &str, node: &str, gpus: &[&str]) -> Grant {
        Grant {
            id: id.into(),
            node: node.into(),
            cpu_milli: 0,
            memory_mib: 0,
            devices: gpus
                .iter()
                .map(|g| DeviceGrant {
                    gpu: (*g).into(),
                    memory: 1 << 30,
                    cores: 20,
                })
                .collect(),
        }
    }

    fn claim(entries: Value) -> ResourceClaim {
        serde_json::from_value(json!({"metadata": {"name": "c", "namespace": "ns"},
                                       "status": {"devices": entries}}))
        .unwrap()
    }

    fn entry(device: &str, sm: Value, sampled: Value) -> Value {
        json!({"driver": "gpu.fgpu.dev", "pool": "node-a", "device": device,
               "data": {"smUtilizationPercent": sm, "sampledAt": sampled,
                        "grantedCores": 20, "usedMemoryBytes": 1}})
    }

    /// node-a with three like GPUs, gpu-0..gpu-2, nothing measured.
    fn inventory() -> Inventory {
        let gpus = (0..3)
            .map(|i| Gpu::new(format!("gpu-{i}"), "H100", 80 << 30))
            .collect();
        Inventory {
            nodes: vec![Node::new("node-a", gpus)],
        }
    }

    fn loads(inv: &Inventory) -> Vec<Option<u16>> {
        inv.nodes[0].gpus.iter().map(|g| g.measured_load).collect()
    }

    #[test]
    fn a_claim_keeps_its_latest_sample_per_gpu_of_its_grant() {
        let g = grant("u1", "node-a", &["gpu-0", "gpu-1"]);
        let c = claim(json!([
            entry("gpu-0", json!(30), json!(at(10))),
            // Two shares of gpu-1 (shareIDs): the same figures; the later one is kept.
            {"shareID": "s1", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-1",
             "data": {"smUtilizationPercent": 40, "sampledAt": at(50)}},
            {"shareID": "s2", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-1",
             "data": {"smUtilizationPercent": 45, "sampledAt": at(5)}},
            // Other drivers, other pools, devices outside the grant: not this claim's load.
            {"driver": "other.dev", "pool": "node-a", "device": "gpu-0",
             "data": {"smUtilizationPercent": 99, "sampledAt": at(0)}},
            {"driver": "gpu.fgpu.dev", "pool": "node-b", "device": "gpu-0",
             "data": {"smUtilizationPercent": 99, "sampledAt": at(0)}},
            entry("gpu-2", json!(99), json!(at(0))),
        ]));
        let l = claim_loads(&c, "gpu.fgpu.dev", &g);
        assert_eq!(
            l,
            [
                DeviceLoad {
                    device: 0,
                    sm: 30,
                    sampled_at: NOW - 10
                },
                DeviceLoad {
                    device: 1,
                    sm: 45,
                    sampled_at: NOW - 5
                },
            ]
        );
        // Past 100 reads as 100.
        let over = claim(json!([entry("gpu-0", json!(250), json!(at(1)))]));
        assert_eq!(claim_loads(&over, "gpu.fgpu.dev", &g)[0].sm, 100);
    }

    #[test]
    fn absent_or_unreadable_figures_are_no_load() {
        let g = grant("u1", "node-a", &["gpu-0"]);
        for (what, entries) in [
            ("no status.devices", json!([])),
            (
                "no data",
                json!([{"driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-0"}]),
            ),
            (
                "no sampledAt",
                json!([entry("gpu-0", json!(30), json!(null))]),
            ),
            (
                "bad sampledAt",
                json!([entry("gpu-0", json!(30), json!("yesterday"))]),
            ),
            (
                "no figure",
                json!([entry("gpu-0", json!(null), json!(at(1)))]),
            ),
            (
                "figure as text",
                json!([entry("gpu-0", json!("30"), json!(at(1)))]),
            ),
        ] {
            assert!(
                claim_loads(&claim(entries), "gpu.fgpu.dev", &g).is_empty(),
                "{what}"
            );
        }
        let bare: ResourceClaim = serde_json::from_value(json!({})).unwrap();
        assert!(claim_loads(&bare, "gpu.fgpu.dev", &g).is_empty());
    }

    #[test]
    fn fresh_samples_sum_per_gpu_and_stale_ones_do_not_count() {
        let a = grant("a", "node-a", &["gpu-0", "gpu-1"]);
        let b = grant("b", "node-a", &["gpu-0"]);
        let c = grant("c", "node-a", &["gpu-2"]);
        let gone = grant("d", "node-x", &["gpu-0"]);
        let la = [
            DeviceLoad {
                device: 0,
                sm: 30,
                sampled_at: NOW - 10,
            },
            // Stale: exactly `fresh` old.
            DeviceLoad {
                device: 1,
                sm: 50,
                sampled_at: NOW - 120,
            },
        ];
        // A second claim on gpu-0 adds to the first.
        let lb = [DeviceLoad {
            device: 0,
            sm: 25,
            sampled_at: NOW - 119,
        }];
        // A sample from a little in the future (clock skew) counts.
        let lc = [DeviceLoad {
            device: 0,
            sm: 7,
            sampled_at: NOW + 3,
        }];
        let ld = [DeviceLoad {
            device: 0,
            sm: 90,
            sampled_at: NOW,
        }];
        let mut inv = inventory();
        apply(
            &mut inv,
            [
                (&a, &la[..]),
                (&b, &lb[..]),
                (&c, &lc[..]),
                (&gone, &ld[..]),
            ],
            NOW,
            FRESH,
        );
        assert_eq!(loads(&inv), [Some(55), None, Some(7)]);
        // Later, everything is stale: nothing is known.
        let mut later = inventory();
        apply(&mut later, [(&a, &la[..]), (&b, &lb[..])], NOW + 600, FRESH);
        assert_eq!(loads(&later), [None, None, None]);
    }

    #[test]
    fn weights_are_finite_and_not_negative() {
        assert_eq!(parse_weight("0"), Ok(0.0));
        assert_eq!(parse_weight(" 2.5 "), Ok(2.5));
        for bad in ["-1", "NaN", "inf", "x", ""] {
            let e = parse_weight(bad).unwrap_err();
            assert!(e.contains("not a weight"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_term_is_off_by_default() {
        let d = UsageAware::default();
        assert!(!d.is_on());
        assert_eq!(d.fresh, FRESH);
        assert!(UsageAware { weight: 0.5, ..d }.is_on());
    }
}
