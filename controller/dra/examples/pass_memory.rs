//! Memory and time of the controller's passes at cluster size, offline (no API server): the
//! objects of `hack/bench-controller.sh` (NODES slices of 8 H100s; CLAIMS claims of 20Gi + 30
//! cores, one gated pod each), kept as the daemon's mirrors keep them (claims and slices trimmed, as text; pods as views), planned
//! and "written" pass after pass until every claim is allocated.
//!
//!   cargo run --release -p fgpu-dra-controller --example pass_memory -- [views|daemon|values] [NODES] [CLAIMS]
//!
//! `views` is the daemon's way ([`ViewCache`] + [`reconcile::plan_views`], at most 128
//! allocations a pass) with `binpack` and no DeviceClass; `daemon` the same with what the
//! daemon adds in the bench: the shared DeviceClass of `deploy/deviceclasses.yaml` (its CEL
//! selector evaluated on every device for every claim) and `fragaware` over the workload
//! model; `values` the way before views (every object parsed into a `Value` each pass,
//! [`reconcile::plan`], no cap), for a baseline in the same build. Prints VmRSS / VmHWM
//! after the objects are built and at the end. Run each way in its own process
//! (MALLOC_ARENA_MAX=2 as the Deployment sets it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use fgpu_api::dra::class::DeviceClass;
use fgpu_api::names::DriverName;
use fgpu_dra_controller::cache::{Overlay, ViewCache};
use fgpu_dra_controller::mirror::{Packed, Packer};
use fgpu_dra_controller::reconcile::{self, Action, ObjectId, Settings, Snapshot, Views};
use fgpu_dra_controller::slim;
use fgpu_dra_controller::view::PodView;
use fgpu_driver::engine::{Policy, WorkloadModel};
use kube::api::DynamicObject;
use serde_json::{Value, json};

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn mem() -> String {
    format!(
        "VmRSS {} MiB, VmHWM {} MiB",
        status_kib("VmRSS:") / 1024,
        status_kib("VmHWM:") / 1024
    )
}

/// As the daemon's mirror keeps a claim or a slice (packed as its mirror of that kind does).
fn stored(v: Value, trim: fn(&mut DynamicObject), packer: &Packer) -> Arc<Packed> {
    let mut o: DynamicObject = serde_json::from_value(v).expect("object");
    trim(&mut o);
    Arc::new(packer.pack(&o).expect("uid"))
}

/// As the daemon's mirror keeps a pod.
fn viewed(v: Value) -> Arc<PodView> {
    let mut o: DynamicObject = serde_json::from_value(v).expect("object");
    slim::pod(&mut o);
    let whole = serde_json::to_value(&o).expect("pod");
    Arc::new(PodView::of(&whole, "gpu.fgpu.dev/allocate"))
}

fn slice(i: usize) -> Value {
    let name = format!("kwok-{i:04}");
    let devices: Vec<Value> = (0..8)
        .map(|g| {
            json!({"name": format!("gpu-{g}"), "allowMultipleAllocations": true,
                "attributes": {"type": {"string": "gpu"},
                    "uuid": {"string": format!("GPU-{i:08}-0000-4000-8000-{g:012}")},
                    "productName": {"string": "NVIDIA H100 80GB HBM3"}, "index": {"int": g},
                    "numaNode": {"int": g / 4}},
                "capacity": {"memory": {"value": "81559Mi", "requestPolicy": {"default": "81559Mi",
                        "validRange": {"min": "268435456", "step": "1048576"}}},
                    "cores": {"value": "100", "requestPolicy": {"default": "0",
                        "validRange": {"min": "0", "max": "100", "step": "1"}}}}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{name}-gpu.fgpu.dev"), "uid": format!("slice-{i}"),
                     "resourceVersion": "1", "labels": {"bench.fgpu.dev/sim": "true"}},
        "spec": {"driver": "gpu.fgpu.dev", "nodeName": name,
                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}})
}

fn claim(i: usize) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": format!("c-{i:05}"), "namespace": "bench-ctrl",
                     "uid": format!("5f0c1a2e-0000-4000-8000-{i:012}"), "resourceVersion": "100",
                     "creationTimestamp": "2026-11-30T03:00:00Z"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "shared.gpu.fgpu.dev", "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": "20Gi", "cores": "30"}}}}]}},
        "status": {}})
}

fn pod(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("p-{i:05}"), "namespace": "bench-ctrl",
                     "uid": format!("9a1b2c3d-0000-4000-8000-{i:012}"), "resourceVersion": "101",
                     "creationTimestamp": format!("2026-11-30T03:{:02}:{:02}Z", i / 3600 % 60, i / 60 % 60)},
        "spec": {"schedulingGates": [{"name": "gpu.fgpu.dev/allocate"}], "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": format!("c-{i:05}")}],
                 "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"claims": [{"name": "gpu"}]}}]},
        "status": {"phase": "Pending"}})
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let way = args.get(1).map_or("views", String::as_str);
    let nodes: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let n: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let daemon = way == "daemon";
    let settings = Settings {
        driver: DriverName::default(),
        default_policy: if daemon {
            Policy::FRAGAWARE
        } else {
            Policy::BINPACK
        },
        workload_half_life: std::time::Duration::from_secs(3600),
        usage_aware: Default::default(),
    };
    let (slice_packer, claim_packer, pod_packer) =
        (Packer::default(), Packer::default(), Packer::default());
    let slices: Vec<Arc<Packed>> = (0..nodes)
        .map(|i| stored(slice(i), slim::slice, &slice_packer))
        .collect();
    let mut claims: Vec<Arc<Packed>> = (0..n)
        .map(|i| stored(claim(i), slim::claim, &claim_packer))
        .collect();
    // The pods' objects, for the `values` way; the mirror's views for the other.
    let pod_objects: Vec<Arc<Packed>> = match way {
        "values" => (0..n)
            .map(|i| stored(pod(i), slim::pod, &pod_packer))
            .collect(),
        _ => Vec::new(),
    };
    let pods: Vec<Arc<PodView>> = match way {
        "values" => Vec::new(),
        _ => (0..n).map(|i| viewed(pod(i))).collect(),
    };
    println!(
        "{way}: {nodes} nodes x 8 GPUs, {n} claims + {n} gated pods stored: {}",
        mem()
    );

    let index: BTreeMap<String, usize> = claims
        .iter()
        .enumerate()
        .map(|(i, c)| (c.uid.clone(), i))
        .collect();
    let (avoid, unsettled) = (BTreeMap::new(), BTreeSet::new());
    // The bench's class (deploy/deviceclasses.yaml) and the daemon's model.
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "shared.gpu.fgpu.dev"},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == \"gpu.fgpu.dev\" && device.attributes[\"gpu.fgpu.dev\"].type == \"gpu\" && (!has(device.attributes[\"gpu.fgpu.dev\"].tier) || device.attributes[\"gpu.fgpu.dev\"].tier != \"research\")"}}]}}))
    .expect("class");
    let mut model = WorkloadModel::new(settings.workload_half_life);
    let now = 1_796_000_000;
    let mut cache = ViewCache::default();
    let mut overlay = Overlay::default();
    let started = Instant::now();
    let (mut passes, mut allocated, mut version) = (0, 0, 1000u64);
    let mut hwm_pass = 0;
    loop {
        passes += 1;
        let t = Instant::now();
        let plan = match way {
            "values" => {
                let values = |s: &[Arc<Packed>]| -> Vec<Value> {
                    s.iter().filter_map(|o| o.value()).collect()
                };
                let (c, p, s) = (values(&claims), values(&pod_objects), values(&slices));
                let snap = Snapshot {
                    claims: &c,
                    pods: &p,
                    slices: &s,
                    avoid: &avoid,
                    unsettled: &unsettled,
                    class: None,
                };
                reconcile::plan(snap, &settings, true)
            }
            _ => {
                let before = status_kib("VmRSS:");
                cache.refresh(
                    &settings.driver,
                    claims.clone(),
                    pods.clone(),
                    &slices,
                    &mut overlay,
                );
                if passes == 1 || std::env::var_os("PASS_MEMORY_VERBOSE").is_some() {
                    println!(
                        "  pass {passes}: refresh {} -> {} MiB",
                        before / 1024,
                        status_kib("VmRSS:") / 1024
                    );
                }
                let (cv, pv) = (cache.claims(), cache.pods());
                if daemon {
                    reconcile::observe_claims(&mut model, &cv, &cache.inventory.inventory);
                }
                let whole = |id: &ObjectId| cache.typed_claim(&overlay, id);
                let views = Views {
                    claims: &cv,
                    pods: &pv,
                    inventory: &cache.inventory,
                    consumable: cache.consumable,
                    claim: &whole,
                    avoid: &avoid,
                    unsettled: &unsettled,
                    class: daemon.then_some(&class),
                    max_allocations: 128,
                    model: daemon.then_some(&model),
                    now,
                };
                reconcile::plan_views(views, &settings, true)
            }
        };
        hwm_pass = hwm_pass.max(status_kib("VmRSS:"));
        let mut wrote = 0;
        for a in plan.actions {
            if let Action::Allocate {
                claim, allocation, ..
            } = a
            {
                let i = index[&claim.uid];
                let mut whole = claims[i].value().expect("claim");
                version += 1;
                whole["metadata"]["resourceVersion"] = json!(version.to_string());
                whole["metadata"]["finalizers"] = json!([settings.driver.finalizer()]);
                whole["status"]["allocation"] = allocation.allocation;
                claims[i] = stored(whole, slim::claim, &claim_packer);
                wrote += 1;
            }
        }
        allocated += wrote;
        if passes == 1 || wrote == 0 {
            println!(
                "pass {passes}: {wrote} allocations planned in {:.0} ms; {}",
                t.elapsed().as_secs_f64() * 1e3,
                mem()
            );
        }
        if wrote == 0 {
            break;
        }
    }
    let text =
        |s: &[Arc<Packed>]| -> usize { s.iter().map(|o| o.packed_len()).sum::<usize>() / 1024 };
    println!(
        "stored as packed text: claims {} KiB, slices {} KiB; a PodView {} bytes inline",
        text(&claims),
        text(&slices),
        std::mem::size_of::<PodView>()
    );
    println!(
        "{way}: {allocated} of {n} claims allocated in {passes} passes, {:.1} s; peak VmRSS seen after a plan {} MiB; at the end {}",
        started.elapsed().as_secs_f64(),
        hwm_pass / 1024,
        mem()
    );
}
