//! Benchmark of the extender (issue 9), a bench binary printing figures:
//!
//! ```text
//! cargo bench -p fgpu-extender --bench extender
//! ```
//!
//! 1. `/filter` + `/prioritize` latency (p50/p99) over HTTP on a local TCP socket, with a
//!    5,000-node cache (8 GPUs each, mixed models, mixed usage rebuilt from pod
//!    annotations) and all 5,000 names in the request; target p99 ≤ 10 ms. A stream of
//!    pods: each request's pod is then reserved on the node prioritize ranked first (one
//!    node changes per request), and every [`SYNC_EVERY`] pods a sync shows the pods
//!    bound since (the workload model moves). With filter's kept results off and on
//!    ([`ExtenderConfig::filter_cache`]), in the same run, from the same state.
//! 2. Bind throughput, 200 pods onto 10 nodes, each API write taking 5 ms (in-memory
//!    writer): optimistic reservations vs. a one-pod-per-node lock, in the same run.

#[path = "../tests/it/support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use fgpu_api::extender::{Node, Pod};
use fgpu_driver::hami::pod_request;
use fgpu_extender::{Extender, ExtenderConfig, MemoryCluster};
use serde_json::json;
use support::*;

/// SplitMix64: a fixed, seeded sequence (no `rand` dependency needed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Pods per sync in the stream: the live extender resyncs every 5 s (and when a pod
/// goes), so 50 is a stream of 10 pods per second.
const SYNC_EVERY: usize = 50;

/// `creationTimestamp` `ago` seconds before now.
fn created(ago: u64) -> serde_json::Value {
    let t = k8s_openapi::jiff::Timestamp::now().as_second() - ago as i64;
    json!(
        k8s_openapi::jiff::Timestamp::from_second(t)
            .unwrap()
            .to_string()
    )
}

/// 5,000 nodes of 8 GPUs and the pods (with assignment annotations) that use them.
fn cluster_5000() -> (Vec<Node>, Vec<Pod>) {
    let models = [
        ("NVIDIA A100-SXM4-80GB", 80),
        ("NVIDIA H100 80GB HBM3", 80),
        ("NVIDIA L40S", 48),
        ("Tesla T4", 16),
    ];
    let mut rng = Rng(42);
    let nodes: Vec<Node> = (0..5000)
        .map(|i| {
            let (model, gib) = match rng.below(10) {
                0..=3 => models[0],
                4..=6 => models[1],
                7..=8 => models[2],
                _ => models[3],
            };
            gpu_node(&format!("node-{i:04}"), 8, model, gib)
        })
        .collect();
    // Fill through a scratch extender so the usage is what the engine would produce.
    let scratch = Extender::new(ExtenderConfig::default());
    scratch.sync(&nodes, &[], Instant::now());
    let cfg = ExtenderConfig::default();
    let mut pods = Vec::new();
    for n in &nodes {
        // 0 to 11 pods per node: idle, partly used and nearly full nodes.
        for k in 0..rng.below(12) {
            let name = format!("{}-p{k}", n.metadata.name);
            let limits = match rng.below(4) {
                0 => json!({"nvidia.com/gpu": "1"}),
                1 => {
                    json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": (2000 + rng.below(14000)).to_string(), "nvidia.com/gpucores": (10 * (1 + rng.below(5))).to_string()})
                }
                2 => json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "25"}),
                _ => json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}),
            };
            let mut pod = gpu_pod(&name, json!({}), limits);
            let req = pod_request(&pod, &cfg.names, cfg.default_policy).unwrap();
            if let Ok(a) = scratch.reserve(&n.metadata.name, &req) {
                assign(&mut pod, a.render());
                // Created within the last hour: the workload model (half-life 1 h)
                // counts them.
                pod.metadata
                    .extra
                    .insert("creationTimestamp".into(), created(rng.below(3600)));
                pod.spec
                    .extra
                    .insert("nodeName".into(), json!(n.metadata.name));
                pod.extra["status"] = json!({"phase": "Running"});
                pods.push(pod);
            }
        }
    }
    (nodes, pods)
}

/// Latencies of one stream of requests.
#[derive(Default)]
struct Times {
    filter: Vec<Duration>,
    prio: Vec<Duration>,
    both: Vec<Duration>,
    handlers: Vec<Duration>,
}

async fn filter_prioritize_latency_5000_nodes() {
    let (nodes, pods) = cluster_5000();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "machine: {threads} CPUs, load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let names: Vec<&str> = nodes.iter().map(|n| n.metadata.name.as_str()).collect();
    let cases = [
        (
            "1 GPU x 10000 MiB, 30% cores (binpack)",
            json!({}),
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "30"}),
        ),
        (
            // fgpu's placement: scored against the workload model of the assigned pods
            // (their kinds, created within the last hour), as the live extender scores it.
            "1 GPU x 10000 MiB, 30% cores (fragaware)",
            json!({"hami.io/node-scheduler-policy": "fragaware"}),
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "30"}),
        ),
        (
            "2 GPUs x 20000 MiB, numa-bind, A100|H100, spread",
            json!({"nvidia.com/numa-bind": "true", "nvidia.com/use-gputype": "A100,H100", "hami.io/node-scheduler-policy": "spread"}),
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20000"}),
        ),
    ];
    let mut first = true;
    for (what, annotations, limits) in cases {
        for cache in [false, true] {
            let ext = Arc::new(Extender::new(ExtenderConfig {
                filter_cache: cache,
                ..ExtenderConfig::default()
            }));
            let t = Instant::now();
            let report = ext.sync(&nodes, &pods, Instant::now());
            let sync_time = t.elapsed();
            assert!(report.errors.is_empty(), "{:?}", &report.errors[..3]);
            assert_eq!(report.nodes, 5000);
            if first {
                first = false;
                println!(
                    "cache: {} nodes, {} GPUs, {} pods with assignments; rebuild (sync) {:.1} ms",
                    report.nodes,
                    report.nodes * 8,
                    report.assigned_pods,
                    ms(sync_time)
                );
            }
            let cluster = Arc::new(MemoryCluster::default());
            let addr = start_server(ext.clone(), cluster).await;
            let mut conn = Conn::open(addr).await;
            let mut bound = pods.clone();
            let mut times = Times::default();
            let mut passed = 0;
            let mut body_kib = 0;
            let mut syncs = Vec::new();
            let stats0 = ext.cache_stats();
            let n: usize = 420;
            for i in 0..n {
                let mut pod = gpu_pod(
                    &format!("stream-{}-{i}", u8::from(cache)),
                    annotations.clone(),
                    limits.clone(),
                );
                // Even requests through HTTP, odd ones to the handlers in process.
                let (ok, prio) = if i % 2 == 0 {
                    let filter_body = serde_json::to_string(&filter_args(&pod, &names)).unwrap();
                    body_kib = filter_body.len() / 1024;
                    let t0 = Instant::now();
                    let (status, body) = conn.post("/filter", &filter_body).await;
                    let t1 = Instant::now();
                    assert_eq!(status, 200);
                    let r: serde_json::Value = serde_json::from_str(&body).unwrap();
                    let ok: Vec<String> = r["NodeNames"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|v| v.as_str().unwrap().to_owned())
                        .collect();
                    let ok_names: Vec<&str> = ok.iter().map(String::as_str).collect();
                    let prio_body = serde_json::to_string(&filter_args(&pod, &ok_names)).unwrap();
                    let t2 = Instant::now();
                    let (status, body) = conn.post("/prioritize", &prio_body).await;
                    let t3 = Instant::now();
                    assert_eq!(status, 200);
                    let prio: Vec<(String, i64)> = serde_json::from_str::<serde_json::Value>(&body)
                        .unwrap()
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|h| {
                            (
                                h["Host"].as_str().unwrap().to_owned(),
                                h["Score"].as_i64().unwrap(),
                            )
                        })
                        .collect();
                    if i >= 20 {
                        times.filter.push(t1 - t0);
                        times.prio.push(t3 - t2);
                        times.both.push((t1 - t0) + (t3 - t2));
                    }
                    (ok, prio)
                } else {
                    let args = filter_args(&pod, &names);
                    let h0 = Instant::now();
                    let f = ext.filter(&args);
                    let ok = f.node_names.unwrap();
                    let ok_names: Vec<&str> = ok.iter().map(String::as_str).collect();
                    let p = ext.prioritize(&filter_args(&pod, &ok_names)).unwrap();
                    let h1 = Instant::now();
                    if i >= 20 {
                        times.handlers.push(h1 - h0);
                    }
                    (ok, p.into_iter().map(|h| (h.host, h.score)).collect())
                };
                passed = ok.len();
                // The scheduler binds the pod to the best node: reserve it there, and
                // show it bound in the pod list from the next sync on.
                let best = prio.iter().max_by_key(|(_, s)| *s).map(|(h, _)| h.clone());
                if let Some(node) = best {
                    let cfg = ext.config();
                    let req = pod_request(&pod, &cfg.names, cfg.default_policy).unwrap();
                    let a = ext.reserve(&node, &req).unwrap();
                    assign(&mut pod, a.render());
                    pod.spec.extra.insert("nodeName".into(), json!(node));
                    pod.extra["status"] = json!({"phase": "Running"});
                    pod.metadata
                        .extra
                        .insert("creationTimestamp".into(), created(0));
                    bound.push(pod);
                }
                if (i + 1).is_multiple_of(SYNC_EVERY) {
                    let t = Instant::now();
                    ext.sync(&nodes, &bound, Instant::now());
                    syncs.push(t.elapsed());
                }
            }
            let stats = ext.cache_stats();
            for v in [
                &mut times.filter,
                &mut times.prio,
                &mut times.both,
                &mut times.handlers,
            ] {
                v.sort();
            }
            println!(
                "{what}, filter cache {}: {passed} of 5000 nodes feasible at the end; request body {body_kib} KiB; per request {:.0} nodes evaluated, {:.0} reused",
                if cache { "on" } else { "off" },
                (stats.evaluated - stats0.evaluated) as f64 / n as f64,
                (stats.reused - stats0.reused) as f64 / n as f64,
            );
            println!(
                "  syncs in the stream: {}, mean {:.1} ms (with the cache on, a sync that moved the model also evaluates fgd and fragaware shapes again)",
                syncs.len(),
                ms(syncs.iter().sum::<Duration>()) / syncs.len().max(1) as f64
            );
            for (label, v) in [
                ("  HTTP /filter             ", &times.filter),
                ("  HTTP /prioritize         ", &times.prio),
                ("  HTTP /filter + /prioritize", &times.both),
                ("  handlers only (no HTTP)  ", &times.handlers),
            ] {
                println!(
                    "{label}: min {:6.2} ms  p50 {:6.2} ms  p99 {:6.2} ms  (n={})",
                    ms(v[0]),
                    ms(percentile(v, 0.50)),
                    ms(percentile(v, 0.99)),
                    v.len()
                );
            }
        }
    }
}

/// Binds 200 pods onto 10 nodes at once; returns (seconds, successes).
async fn bind_run(serialize: bool, latency: Duration) -> (f64, usize) {
    let ext = Arc::new(Extender::new(ExtenderConfig {
        serialize_node_binds: serialize,
        ..ExtenderConfig::default()
    }));
    let nodes: Vec<Node> = (0..10)
        .map(|i| gpu_node(&format!("n{i}"), 8, "NVIDIA A100-SXM4-80GB", 80))
        .collect();
    ext.sync(&nodes, &[], Instant::now());
    let cluster = Arc::new(MemoryCluster::new(latency));
    let pods: Vec<Pod> = (0..200)
        .map(|i| {
            gpu_pod(
                &format!("b{i}"),
                json!({}),
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "nvidia.com/gpucores": "10"}),
            )
        })
        .collect();
    for p in &pods {
        cluster.add_pod(p.clone());
    }
    // The scheduler's filter call leaves the pod in the extender's cache, so bind need
    // not read it back.
    for p in &pods {
        let _ = ext.filter(&filter_args(p, &["n0"]));
    }
    let t = Instant::now();
    let tasks: Vec<_> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (ext, cluster) = (ext.clone(), cluster.clone());
            let args = bind_args(p, &format!("n{}", i % 10));
            tokio::spawn(async move { ext.bind(&args, &*cluster).await.error })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        if task.await.unwrap().is_empty() {
            ok += 1;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    // Never over-granted: the ledger refused nothing and every GPU is within capacity.
    for n in 0..10 {
        for (_, mem_free, cores_free) in ext.node_usage(&format!("n{n}")).unwrap() {
            assert!(mem_free <= 80 * GIB && cores_free <= 100);
        }
    }
    (secs, ok)
}

async fn bind_throughput_optimistic_vs_node_lock() {
    let latency = Duration::from_millis(5);
    let (opt_s, opt_ok) = bind_run(false, latency).await;
    let (lock_s, lock_ok) = bind_run(true, latency).await;
    assert_eq!((opt_ok, lock_ok), (200, 200));
    let opt = 200.0 / opt_s;
    let lock = 200.0 / lock_s;
    println!(
        "bind 200 pods onto 10 nodes, 5 ms per API write (annotate + Binding = 2 writes per pod):"
    );
    println!(
        "  optimistic reservations: {:8.1} ms total, {:8.0} pods/s",
        opt_s * 1e3,
        opt
    );
    println!(
        "  one pod per node (lock): {:8.1} ms total, {:8.0} pods/s",
        lock_s * 1e3,
        lock
    );
    println!("  ratio optimistic / node lock: {:.1}x", opt / lock);
}

fn main() {
    // `cargo bench` passes `--bench`; a test run (`cargo test --benches`) does not: then
    // only check that the bench builds.
    if !std::env::args().any(|a| a == "--bench") {
        println!("extender bench: run with `cargo bench -p fgpu-extender --bench extender`");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    rt.block_on(filter_prioritize_latency_5000_nodes());
    rt.block_on(bind_throughput_optimistic_vs_node_lock());
}
