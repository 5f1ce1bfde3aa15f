//! Property: allocating a random sequence of claims through
//! slices → inventory → request → engine → allocation → usage never grants more than a GPU
//! has, and the ledger rebuilt from the written allocations equals the ledger that
//! recorded each decision.

use std::collections::BTreeMap;

use fgpu_api::dra::slice::ResourceSlice;
use fgpu_api::names::DriverName;
use fgpu_dra_controller::{allocation, explain, inventory, request, usage};
use fgpu_driver::engine::{MaxSpec, Policy, ScoreContext, choose};
use fgpu_driver::ledger::Ledger;
use proptest::prelude::*;
use serde_json::{Value, json};

const DRIVER: &str = "gpu.fgpu.dev";

fn slice(node: usize, gpus: &[u64], v1beta1: bool) -> Value {
    let devices: Vec<Value> = gpus
        .iter()
        .enumerate()
        .map(|(i, gib)| {
            let body = json!({
                "attributes": {"uuid": {"string": format!("GPU-{node}-{i}")}, "productName": {"string": "H100"}},
                "capacity": {"memory": {"value": format!("{gib}Gi")}, "cores": {"value": "100"}},
            });
            if v1beta1 {
                json!({"name": format!("gpu-{i}"), "basic": body})
            } else {
                let mut d = body;
                d["name"] = json!(format!("gpu-{i}"));
                d
            }
        })
        .collect();
    json!({"metadata": {"name": format!("node-{node}-{DRIVER}")},
           "spec": {"driver": DRIVER, "nodeName": format!("node-{node}"),
                    "pool": {"name": format!("node-{node}"), "generation": 1}, "devices": devices}})
}

/// (memory GiB or 0 for whole GPUs, cores, count, memory via capacity or opaque config)
type ClaimSpec = (u64, u32, u64, bool);

fn claim(i: usize, (gib, cores, count, via_capacity): ClaimSpec) -> Value {
    let mut exactly = json!({"deviceClassName": "shared.gpu.fgpu.dev", "count": count});
    let mut config = json!([]);
    if gib > 0 {
        if via_capacity {
            exactly["capacity"] =
                json!({"requests": {"memory": format!("{gib}Gi"), "cores": cores.to_string()}});
        } else {
            config = json!([{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig",
                "memory": format!("{gib}Gi"), "cores": cores}}}]);
        }
    }
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": format!("c{i}"), "namespace": "ns", "uid": format!("uid-{i}")},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}], "config": config}}})
}

fn claim_spec() -> impl Strategy<Value = ClaimSpec> {
    (
        prop_oneof![Just(0u64), 1u64..40],
        0u32..=100,
        1u64..=2,
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn never_over_grants_and_usage_matches_the_ledger(
        nodes in prop::collection::vec(prop::collection::vec(prop_oneof![Just(16u64), Just(40), Just(80)], 1..4), 1..4),
        claims in prop::collection::vec(claim_spec(), 1..24),
        consumable in any::<bool>(),
        spread in any::<bool>(),
    ) {
        let slices: Vec<Value> = nodes.iter().enumerate().map(|(i, g)| slice(i, g, i % 2 == 1)).collect();
        let slices: Vec<ResourceSlice> = slices.into_iter().map(|s| serde_json::from_value(s).expect("any object reads")).collect();
        let inv = inventory::from_slices(DRIVER, &slices);
        prop_assert!(inv.errors.is_empty(), "{:?}", inv.errors);
        let capacity = inv.inventory;
        let mut ledger = Ledger::new(capacity.clone());
        let mut written: Vec<Value> = Vec::new();
        let ctx = ScoreContext { workload: None, max_spec: MaxSpec::default(), usage_weight: 0.0 };
        let driver = DriverName::default();
        let default = if spread { Policy::SPREAD } else { Policy::BINPACK };
        for (i, spec) in claims.into_iter().enumerate() {
            let mut c = claim(i, spec);
            let typed = usage::typed(&c).unwrap();
            let pending = request::from_claim(&typed, &BTreeMap::new(), "ns/p", &driver, default).unwrap();
            match choose(ledger.inventory(), &pending.request, pending.policy, &ctx, 0) {
                Ok(placement) => {
                    let a = allocation::build(DRIVER, ledger.inventory(), &pending, &placement, consumable);
                    ledger.grant(a.grant.clone()).unwrap();
                    c["status"] = json!({"allocation": a.allocation});
                }
                Err(_) => {
                    let msg = explain::pending(ledger.inventory(), &pending.request);
                    prop_assert!(msg.starts_with("no "), "{}", msg);
                }
            }
            written.push(c);
            // Rebuilt from everything written so far (allocated or not), from scratch.
            let rebuilt = usage::rebuild(DRIVER, capacity.clone(), &written);
            prop_assert!(rebuilt.errors.is_empty(), "{:?}", rebuilt.errors);
            prop_assert_eq!(&rebuilt.ledger, &ledger);
        }
        // Independently of the ledger: per GPU, the sum of what the written claims take.
        let mut taken: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
        for c in &written {
            if let Some(g) = usage::claim_grant(&usage::typed(c).unwrap(), DRIVER, &capacity).unwrap() {
                for d in g.devices {
                    let t = taken.entry((g.node.clone(), d.gpu)).or_default();
                    t.0 += d.memory;
                    t.1 += u64::from(d.cores);
                }
            }
        }
        for n in &capacity.nodes {
            for g in &n.gpus {
                let (m, c) = taken.get(&(n.name.clone(), g.id.clone())).copied().unwrap_or_default();
                prop_assert!(m <= g.memory_total && c <= u64::from(g.cores_total), "{}/{} over-granted: {m} bytes, {c} cores", n.name, g.id);
            }
        }
    }
}
