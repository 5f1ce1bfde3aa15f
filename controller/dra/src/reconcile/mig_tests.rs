//! Passes over claims of the MIG class and over GPUs in `whole` mode.

use super::tests::run;
use super::*;
use fgpu_driver::device::GIB;
use fgpu_driver::mig::{MigTable, table_for};
use proptest::prelude::*;
use serde_json::json;

const GATE: &str = "gpu.fgpu.dev/allocate";
const FIN: &str = "gpu.fgpu.dev/allocation";
const H100: &str = "NVIDIA H100 80GB HBM3";

fn h100() -> &'static MigTable {
    table_for(H100, 80 * GIB).unwrap()
}

/// The slices the plugin publishes for node `node` with MIG-mode H100s `gpus` (index,
/// UUID): one slice of placement devices, one of counter sets (`counters`), or, without
/// counters, the devices alone (a fixed layout lists only `fixed`'s profiles and starts).
fn mig_slices(node: &str, gpus: &[(u32, &str)], fixed: Option<&[(&str, u8)]>) -> Vec<Value> {
    let table = h100();
    let mut devices = Vec::new();
    let mut sets = Vec::new();
    for (index, uuid) in gpus {
        let set = format!("gpu-{index}-counters");
        let mut counters: serde_json::Map<String, Value> = (0..table.memory_slices)
            .map(|i| (format!("memory-slice-{i}"), json!({"value": "1"})))
            .collect();
        counters.insert("compute-slices".into(), json!({"value": "7"}));
        counters.insert("media-extensions".into(), json!({"value": "1"}));
        sets.push(json!({"name": set, "counters": counters}));
        for p in table.profiles {
            for &start in p.starts {
                if fixed.is_some_and(|f| !f.contains(&(p.name, start))) {
                    continue;
                }
                let mut consumed: serde_json::Map<String, Value> = (start..start + p.memory_slices)
                    .map(|i| (format!("memory-slice-{i}"), json!({"value": "1"})))
                    .collect();
                consumed.insert(
                    "compute-slices".into(),
                    json!({"value": p.compute_slices.to_string()}),
                );
                if p.media_extensions {
                    consumed.insert("media-extensions".into(), json!({"value": "1"}));
                }
                let mut d = json!({
                    "name": fgpu_driver::mig::device_name(*index, p, start),
                    "attributes": {
                        "type": {"string": "mig"},
                        "profile": {"string": p.name},
                        "memory": {"int": p.memory_bytes()},
                        "parentUUID": {"string": uuid},
                        "productName": {"string": H100},
                    },
                    "capacity": {"memory": {"value": p.memory_bytes().to_string()}},
                });
                if fixed.is_none() {
                    d["consumesCounters"] = json!([{"counterSet": set, "counters": consumed}]);
                }
                devices.push(d);
            }
        }
    }
    let pool = |count: usize| json!({"name": node, "generation": 1, "resourceSliceCount": count});
    let mut out = vec![json!({"metadata": {"name": format!("{node}-gpu.fgpu.dev")},
        "spec": {"driver": "gpu.fgpu.dev", "nodeName": node, "pool": pool(if fixed.is_some() {1} else {2}),
                 "devices": devices}})];
    if fixed.is_none() {
        out.push(json!({"metadata": {"name": format!("{node}-gpu.fgpu.dev-counters-0")},
            "spec": {"driver": "gpu.fgpu.dev", "nodeName": node, "pool": pool(2), "sharedCounters": sets}}));
    }
    out
}

/// A claim of the MIG class asking `gib` GiB (as `capacity.requests`, as a share would).
fn mig_claim(name: &str, gib: u64) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "7"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mig.gpu.fgpu.dev",
            "capacity": {"requests": {"memory": format!("{gib}Gi")}}}}]}}})
}

/// `mig_claim` allocated on `node`/`device` at `at`.
fn mig_allocated(name: &str, gib: u64, node: &str, device: &str, at: &str) -> Value {
    let mut c = mig_claim(name, gib);
    c["metadata"]["finalizers"] = json!([FIN]);
    c["status"]["allocation"] = json!({
        "allocationTimestamp": at,
        "devices": {"results": [{"request": "gpu", "driver": "gpu.fgpu.dev", "pool": node, "device": device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}});
    c
}

/// A gated pod using the claim `claim` directly.
fn pod(name: &str, created: &str, claim: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "3",
                     "creationTimestamp": created},
        "spec": {"resourceClaims": [{"name": "g", "resourceClaimName": claim}],
                 "schedulingGates": [{"name": GATE}]},
        "status": {"phase": "Pending"}})
}

/// Per action: `claim → node/device` for an allocation, `claim waits (reason): message`
/// or `claim rejected: message`.
fn outcomes(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Allocate {
                claim, allocation, ..
            } => {
                let r = &allocation.allocation["devices"]["results"][0];
                Some(format!(
                    "{} → {}/{}",
                    claim.name,
                    r["pool"].as_str().unwrap(),
                    r["device"].as_str().unwrap()
                ))
            }
            Action::Pending {
                claim,
                reason,
                message,
                ..
            } => Some(format!(
                "{} waits ({}): {message}",
                claim.name,
                reason.as_str()
            )),
            Action::Rejected { claim, message, .. } => {
                Some(format!("{} rejected: {message}", claim.name))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn claims_of_10_20_40_gib_get_1g_2g_3g_and_a_fourth_40_waits_saying_why() {
    let slices = mig_slices("node-a", &[(0, "GPU-a")], None);
    let claims = [
        mig_claim("c10", 10),
        mig_claim("c20", 20),
        mig_claim("c40", 40),
        mig_claim("d40", 40),
    ];
    let pods = [
        pod("p10", "2026-01-01T00:00:01Z", "c10"),
        pod("p20", "2026-01-01T00:00:02Z", "c20"),
        pod("p40", "2026-01-01T00:00:03Z", "c40"),
        pod("q40", "2026-01-01T00:00:04Z", "d40"),
    ];
    let p = run(&claims, &pods, &slices);
    assert!(p.slice_errors.is_empty(), "{:?}", p.slice_errors);
    assert!(p.usage_errors.is_empty(), "{:?}", p.usage_errors);
    // 1g.10gb at 6 (keeps 4g.40gb at 0), 2g.20gb at 4, then the 3g.40gb must go to 0.
    assert_eq!(
        outcomes(&p),
        [
            "c10 → node-a/gpu-0-mig-1g10gb-6",
            "c20 → node-a/gpu-0-mig-2g20gb-4",
            "c40 → node-a/gpu-0-mig-3g40gb-0",
            "d40 waits (no_fit): no free MIG placement holds memory 40.0 GiB; largest free profile per node: node-a: none",
        ]
    );
    // The allocation names the placement device, whole: no consumed capacity, no share.
    let Action::Allocate { allocation, .. } = &p.actions[0] else {
        panic!("{:?}", p.actions[0]);
    };
    assert_eq!(
        allocation.allocation["devices"]["results"],
        json!([{"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-0-mig-1g10gb-6"}])
    );
    assert_eq!(
        allocation.allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"],
        json!(["node-a"])
    );
    assert_eq!(allocation.grant.devices[0].memory, 10 * GIB);

    // The next pass rebuilds the placements taken from the allocated claims: memory
    // slices 0-6 and six compute slices are held, so 40 GiB still waits, and so does
    // 10 GiB: slice 7 is free, but no 1g.10gb placement starts there.
    let allocated = [
        mig_allocated("c10", 10, "node-a", "gpu-0-mig-1g10gb-6", "t1"),
        mig_allocated("c20", 20, "node-a", "gpu-0-mig-2g20gb-4", "t2"),
        mig_allocated("c40", 40, "node-a", "gpu-0-mig-3g40gb-0", "t3"),
        mig_claim("d40", 40),
        mig_claim("e10", 10),
    ];
    let pods = [pods[3].clone(), pod("r10", "2026-01-01T00:00:05Z", "e10")];
    let p = run(&allocated, &pods, &slices);
    assert!(p.usage_errors.is_empty(), "{:?}", p.usage_errors);
    assert_eq!(
        outcomes(&p),
        [
            "d40 waits (no_fit): no free MIG placement holds memory 40.0 GiB; largest free profile per node: node-a: none",
            "e10 waits (no_fit): no free MIG placement holds memory 10.0 GiB; largest free profile per node: node-a: none",
        ]
    );
}

#[test]
fn too_large_or_no_mig_gpu_never_fits_and_bad_requests_are_refused_by_field() {
    let slices = mig_slices("node-a", &[(0, "GPU-a")], None);
    let claims = [mig_claim("big", 81)];
    let pods = [pod("p", "2026-01-01T00:00:01Z", "big")];
    assert_eq!(
        outcomes(&run(&claims, &pods, &slices)),
        [
            "big waits (never_fits): no MIG profile of the 1 MIG-mode GPUs holds memory 81.0 GiB; the largest: H100 80GB 7g.80gb"
        ]
    );
    let claims = [mig_claim("c", 10)];
    let pods = [pod("p", "2026-01-01T00:00:01Z", "c")];
    assert_eq!(
        outcomes(&run(&claims, &pods, &[])),
        ["c waits (never_fits): no MIG-mode GPU publishes placements"]
    );
    // A request of another class beside the MIG one is refused, naming it.
    let mut mixed = mig_claim("m", 10);
    mixed["spec"]["devices"]["requests"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "s", "exactly": {"deviceClassName": "shared.gpu.fgpu.dev"}}));
    let out = outcomes(&run(&[mixed], &[pod("p", "t", "m")], &slices));
    assert_eq!(out.len(), 1);
    assert!(
        out[0].starts_with("m rejected: ")
            && out[0].contains("spec.devices.requests[1].exactly.deviceClassName"),
        "{out:?}"
    );
}

#[test]
fn selectors_and_cores_narrow_the_placement() {
    let slices = mig_slices("node-a", &[(0, "GPU-a")], None);
    // A profile named by CEL: 10 GiB in a 2g.20gb.
    let mut c = mig_claim("c", 10);
    c["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = json!([
        {"cel": {"expression": "device.attributes[\"gpu.fgpu.dev\"].profile == \"2g.20gb\""}}]);
    // 30 % of the compute: 3 of 7 compute slices, so 10 GiB gets a 3g.40gb.
    let mut d = mig_claim("d", 10);
    d["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["cores"] = json!("30");
    let pods = [
        pod("pc", "2026-01-01T00:00:01Z", "c"),
        pod("pd", "2026-01-01T00:00:02Z", "d"),
    ];
    assert_eq!(
        outcomes(&run(&[c, d], &pods, &slices)),
        [
            "c → node-a/gpu-0-mig-2g20gb-4",
            "d → node-a/gpu-0-mig-3g40gb-0"
        ]
    );
}

#[test]
fn the_used_gpu_fills_first_and_a_fixed_layout_offers_its_devices_only() {
    let slices = mig_slices("node-a", &[(0, "GPU-a"), (1, "GPU-b")], None);
    let claims = [
        mig_allocated("old", 40, "node-a", "gpu-1-mig-3g40gb-4", "t1"),
        mig_claim("c", 10),
    ];
    let pods = [pod("p", "2026-01-01T00:00:01Z", "c")];
    assert_eq!(
        outcomes(&run(&claims, &pods, &slices)),
        ["c → node-a/gpu-1-mig-1g10gb-3"]
    );
    // A fixed layout without counters: two 3g.40gb; the 10 GiB claim takes the free one.
    let fixed = mig_slices(
        "node-b",
        &[(0, "GPU-c")],
        Some(&[("3g.40gb", 0), ("3g.40gb", 4)]),
    );
    let claims = [
        mig_allocated("old", 40, "node-b", "gpu-0-mig-3g40gb-4", "t1"),
        mig_claim("c", 10),
        mig_claim("d", 10),
    ];
    let pods = [
        pod("p", "2026-01-01T00:00:01Z", "c"),
        pod("q", "2026-01-01T00:00:02Z", "d"),
    ];
    let p = run(&claims, &pods, &fixed);
    assert!(p.slice_errors.is_empty(), "{:?}", p.slice_errors);
    assert_eq!(
        outcomes(&p),
        [
            "c → node-b/gpu-0-mig-3g40gb-0",
            "d waits (no_fit): no free MIG placement holds memory 10.0 GiB; largest free profile per node: node-b: none"
        ]
    );
}

#[test]
fn overlapping_allocations_are_reported_and_still_held() {
    let slices = mig_slices("node-a", &[(0, "GPU-a")], None);
    // Two claims on overlapping placements (written by someone else): the later is
    // reported; what it consumes stays held (4 + 2 compute slices), so only one 1g.10gb
    // still fits, and the second 10 GiB claim waits.
    let claims = [
        mig_allocated("a", 40, "node-a", "gpu-0-mig-4g40gb-0", "t1"),
        mig_allocated("b", 20, "node-a", "gpu-0-mig-2g20gb-2", "t2"),
        mig_claim("c", 10),
        mig_claim("d", 10),
    ];
    let pods = [
        pod("p", "2026-01-01T00:00:01Z", "c"),
        pod("q", "2026-01-01T00:00:02Z", "d"),
    ];
    let p = run(&claims, &pods, &slices);
    assert_eq!(p.usage_errors.len(), 1, "{:?}", p.usage_errors);
    let e = p.usage_errors[0].to_string();
    assert!(
        e.starts_with(
            "claim ns/b: status.allocation.devices.results[0].device: node-a/gpu-0-mig-2g20gb-2"
        ),
        "{e}"
    );
    assert_eq!(
        outcomes(&p),
        [
            "c → node-a/gpu-0-mig-1g10gb-6",
            "d waits (no_fit): no free MIG placement holds memory 10.0 GiB; largest free profile per node: node-a: none"
        ]
    );
}

#[test]
fn a_gpu_published_both_ways_keeps_no_placement_and_shares_skip_mig_gpus() {
    let mut slices = mig_slices("node-a", &[(0, "GPU-a")], None);
    // A GPU device with the same UUID as the MIG placements' parent.
    slices[0]["spec"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "gpu-9", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-a"}},
                     "capacity": {"memory": {"value": "80Gi"}}}));
    let claims = [mig_claim("c", 10)];
    let pods = [pod("p", "2026-01-01T00:00:01Z", "c")];
    let p = run(&claims, &pods, &slices);
    assert_eq!(p.slice_errors.len(), 1, "{:?}", p.slice_errors);
    assert!(
        p.slice_errors[0]
            .to_string()
            .contains("GPU GPU-a is also published as a device of type gpu"),
        "{}",
        p.slice_errors[0]
    );
    assert_eq!(
        outcomes(&p),
        ["c waits (never_fits): no MIG-mode GPU publishes placements"]
    );
    // A share on a node whose only GPU is in MIG mode finds no GPU.
    let share = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "s", "namespace": "ns", "uid": "uid-s", "resourceVersion": "7"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "shared.gpu.fgpu.dev",
            "capacity": {"requests": {"memory": "10Gi"}}}}]}}});
    let slices = mig_slices("node-a", &[(0, "GPU-a")], None);
    let p = run(&[share], &[pod("p", "t", "s")], &slices);
    assert_eq!(p.gpus, 0);
    let out = outcomes(&p);
    assert!(out[0].starts_with("s waits (never_fits)"), "{out:?}");
}

/// A node-a slice of one GPU `gpu-0` of 80 GiB in mode `mode` (none: an older plugin).
fn gpu_slice(mode: Option<&str>) -> Value {
    let mut attributes = json!({"type": {"string": "gpu"}, "uuid": {"string": "GPU-w"},
                                "productName": {"string": H100}});
    if let Some(m) = mode {
        attributes["mode"] = json!({"string": m});
    }
    json!({"metadata": {"name": "node-a-gpu.fgpu.dev"},
           "spec": {"driver": "gpu.fgpu.dev", "nodeName": "node-a", "pool": {"name": "node-a", "generation": 1},
                    "devices": [{"name": "gpu-0", "attributes": attributes,
                                 "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}}]}})
}

#[test]
fn a_whole_mode_gpu_takes_whole_gpu_claims_only() {
    let claim = |name: &str, class: &str, memory: Option<&str>| {
        let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "7"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}});
        if let Some(m) = memory {
            c["spec"]["devices"]["requests"][0]["exactly"]["capacity"] =
                json!({"requests": {"memory": m}});
        }
        c
    };
    let share = claim("s", "shared.gpu.fgpu.dev", Some("10Gi"));
    let pods = [pod("p", "2026-01-01T00:00:01Z", "s")];
    // Shared mode (and an older plugin without the attribute): the share is placed.
    for mode in [Some("shared"), None] {
        let p = run(std::slice::from_ref(&share), &pods, &[gpu_slice(mode)]);
        assert_eq!(kinds_of(&p), ["allocate s on gpu-0"], "mode {mode:?}");
    }
    // Whole mode: the share waits, and never fits there.
    let p = run(
        std::slice::from_ref(&share),
        &pods,
        &[gpu_slice(Some("whole"))],
    );
    let out = outcomes(&p);
    assert_eq!(out.len(), 1);
    assert!(
        out[0].starts_with("s waits (never_fits)")
            && out[0].ends_with("(1 GPUs in whole mode take whole-GPU claims only)"),
        "{out:?}"
    );
    // A whole-GPU claim of the shared class (no memory) still gets it.
    let whole = claim("w", "shared.gpu.fgpu.dev", None);
    let p = run(
        &[whole],
        &[pod("p", "2026-01-01T00:00:01Z", "w")],
        &[gpu_slice(Some("whole"))],
    );
    assert_eq!(kinds_of(&p), ["allocate w on gpu-0"]);
}

fn kinds_of(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Allocate {
                claim, allocation, ..
            } => Some(format!(
                "allocate {} on {}",
                claim.name, allocation.grant.devices[0].gpu
            )),
            Action::Pending { claim, .. } => Some(format!("pending {}", claim.name)),
            _ => None,
        })
        .collect()
}

/// What a random sequence step does: allocate a claim of this many GiB, or release the
/// claim at this position among those allocated.
#[derive(Clone, Debug)]
enum Step {
    Allocate(u64),
    Release(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => prop::sample::select(vec![1u64, 5, 10, 11, 20, 25, 40, 41, 80]).prop_map(Step::Allocate),
        1 => (0usize..16).prop_map(Step::Release),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Over random sequences of claims and releases on two nodes of two MIG-mode H100s,
    /// each pass rebuilt from the claims allocated so far: no two allocated placements
    /// overlap, each GPU's compute slices and media extensions are never over-used (the
    /// counters never go below zero), and the allocated claims never make an error.
    #[test]
    fn allocated_placements_never_overlap(steps in prop::collection::vec(step(), 1..40)) {
        let mut slices = mig_slices("node-a", &[(0, "GPU-a"), (1, "GPU-b")], None);
        slices.extend(mig_slices("node-b", &[(0, "GPU-c"), (1, "GPU-d")], None));
        let table = h100();
        // (claim name, GiB, node, device)
        let mut held: Vec<(String, u64, String, String)> = Vec::new();
        for (n, s) in steps.iter().enumerate() {
            match s {
                Step::Release(i) => {
                    if !held.is_empty() {
                        held.remove(i % held.len());
                    }
                }
                Step::Allocate(gib) => {
                    let name = format!("c{n}");
                    let mut claims: Vec<Value> = held
                        .iter()
                        .enumerate()
                        .map(|(k, (c, g, node, d))| mig_allocated(c, *g, node, d, &format!("t{k:03}")))
                        .collect();
                    claims.push(mig_claim(&name, *gib));
                    let p = run(&claims, &[pod("p", "t", &name)], &slices);
                    prop_assert!(p.usage_errors.is_empty(), "{:?}", p.usage_errors);
                    for a in &p.actions {
                        if let Action::Allocate { allocation, .. } = a {
                            let r = &allocation.allocation["devices"]["results"][0];
                            held.push((
                                name.clone(),
                                *gib,
                                r["pool"].as_str().unwrap().to_owned(),
                                r["device"].as_str().unwrap().to_owned(),
                            ));
                        }
                    }
                }
            }
            // Check what is held, per GPU, by the placements' own geometry.
            let mut per_gpu: BTreeMap<(String, u32), (u32, u8, u8)> = BTreeMap::new();
            for (_, gib, node, device) in &held {
                let name = fgpu_driver::mig::parse_device_name(device).unwrap();
                let profile = table
                    .profiles
                    .iter()
                    .find(|p| p.label() == name.label)
                    .unwrap();
                prop_assert!(profile.memory_bytes() >= gib * GIB, "{device} for {gib} GiB");
                let mask = fgpu_driver::mig::Placement { start: name.start, size: profile.memory_slices }.mask();
                let e = per_gpu.entry((node.clone(), name.gpu_index)).or_default();
                prop_assert_eq!(e.0 & mask, 0, "{} overlaps on {}", device, node);
                e.0 |= mask;
                e.1 += profile.compute_slices;
                e.2 += u8::from(profile.media_extensions);
                prop_assert!(e.1 <= table.compute_slices && e.2 <= 1, "{:?}", held);
            }
        }
    }
}

#[test]
fn memory_from_the_claims_config_as_for_a_share() {
    // Without consumable capacity the API server drops capacity.requests: the memory
    // comes from this driver's GpuShareConfig, as for a share; the config is copied.
    let slices = mig_slices("node-a", &[(0, "GPU-a")], None);
    let c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-c", "resourceVersion": "7"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.gpu.fgpu.dev"}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.fgpu.dev", "parameters": {
                "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": "20Gi"}}}]}}});
    let p = run(&[c], &[pod("p", "t", "c")], &slices);
    assert_eq!(outcomes(&p), ["c → node-a/gpu-0-mig-2g20gb-4"]);
    let Action::Allocate { allocation, .. } = &p.actions[0] else {
        panic!("{:?}", p.actions);
    };
    let config = &allocation.allocation["devices"]["config"];
    assert_eq!(config.as_array().unwrap().len(), 1, "{config}");
    assert_eq!(config[0]["source"], "FromClaim");
    assert_eq!(config[0]["opaque"]["parameters"]["memory"], "20Gi");
    // A bad config is refused, naming the field.
    let mut bad = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "b", "namespace": "ns", "uid": "uid-b", "resourceVersion": "7"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.gpu.fgpu.dev"}}],
            "config": [{"opaque": {"driver": "gpu.fgpu.dev", "parameters": {
                "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": "lots"}}}]}}});
    bad["spec"]["devices"]["requests"][0]["exactly"]["count"] = json!(1);
    let out = outcomes(&run(&[bad], &[pod("p", "t", "b")], &slices));
    assert!(
        out[0].starts_with("b rejected: ")
            && out[0].contains("spec.devices.config[0].opaque.parameters.memory"),
        "{out:?}"
    );
}

#[test]
fn a_claim_whose_later_request_does_not_fit_gives_its_placements_back() {
    let slices = mig_slices("node-a", &[(0, "GPU-a")], None);
    // x asks 40 GiB and 80 GiB: the 40 fits, the 80 then does not; y's 40 GiB gets the
    // placement x would have held.
    let mut x = mig_claim("x", 40);
    x["spec"]["devices"]["requests"]
        .as_array_mut()
        .unwrap()
        .push(
            json!({"name": "big", "exactly": {"deviceClassName": "mig.gpu.fgpu.dev",
                      "capacity": {"requests": {"memory": "80Gi"}}}}),
        );
    let pods = [
        pod("px", "2026-01-01T00:00:01Z", "x"),
        pod("py", "2026-01-01T00:00:02Z", "y"),
    ];
    let p = run(&[x, mig_claim("y", 40)], &pods, &slices);
    assert_eq!(
        outcomes(&p),
        [
            "x waits (no_fit): request big: no free MIG placement holds memory 80.0 GiB; largest free profile per node: node-a: 4g.40gb (GPU GPU-a) (the claim's other requests are on node node-a)",
            "y → node-a/gpu-0-mig-3g40gb-4",
        ]
    );
}
