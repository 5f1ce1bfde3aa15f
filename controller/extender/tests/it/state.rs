//! The extender's verbs on an in-memory cluster: policies, constraints, errors, the bind
//! protocol, concurrent binds and restarts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use fgpu_api::extender::Pod;
use fgpu_extender::annotations::PodAssignment;
use fgpu_extender::{Extender, ExtenderConfig, MemoryCluster};
use serde_json::json;

fn extender() -> Extender {
    Extender::new(ExtenderConfig::default())
}

fn assignment(cluster: &MemoryCluster, name: &str) -> Option<PodAssignment> {
    let pod = cluster
        .pods()
        .into_iter()
        .find(|p| p.metadata.name == name)?;
    let v = pod.metadata.annotations.get(ASSIGNED)?;
    Some(PodAssignment::parse(name, ASSIGNED, v).unwrap())
}

/// Binds `pod` to `node` through the extender and returns the error text ("" = bound).
async fn bind(ext: &Extender, cluster: &MemoryCluster, pod: &Pod, node: &str) -> String {
    cluster.add_pod(pod.clone());
    ext.bind(&bind_args(pod, node), cluster).await.error
}

fn hami_pod(name: &str, ann: serde_json::Value, mem_mib: u64, cores: u64) -> Pod {
    gpu_pod(
        name,
        ann,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": mem_mib.to_string(), "nvidia.com/gpucores": cores.to_string()}),
    )
}

#[tokio::test]
async fn node_binpack_and_spread() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    let nodes = [
        gpu_node("node-a", 2, "NVIDIA A100-SXM4-80GB", 80),
        gpu_node("node-b", 2, "NVIDIA A100-SXM4-80GB", 80),
    ];
    ext.sync(&nodes, &[], Instant::now());
    // node-a gets some usage.
    let first = hami_pod("first", json!({}), 10_000, 30);
    assert_eq!(bind(&ext, &cluster, &first, "node-a").await, "");

    let binpack = hami_pod("bp", json!({}), 10_000, 30);
    let scores = ext
        .prioritize(&filter_args(&binpack, &["node-a", "node-b"]))
        .unwrap();
    assert_eq!(
        (scores[0].host.as_str(), scores[0].score, scores[1].score),
        ("node-a", 10, 0)
    );
    let spread = hami_pod(
        "sp",
        json!({"hami.io/node-scheduler-policy": "spread"}),
        10_000,
        30,
    );
    let scores = ext
        .prioritize(&filter_args(&spread, &["node-a", "node-b"]))
        .unwrap();
    assert_eq!((scores[0].score, scores[1].score), (0, 10));
}

#[tokio::test]
async fn gpu_binpack_and_spread() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    ext.sync(&[gpu_node("n", 4, "A100", 80)], &[], Instant::now());
    let first = hami_pod("first", json!({}), 10_000, 10);
    assert_eq!(bind(&ext, &cluster, &first, "n").await, "");
    let used = assignment(&cluster, "first").unwrap().containers[0].devices[0]
        .id
        .clone();
    // Default GPU policy is spread (HAMi's): the next pod avoids the used GPU.
    let sp = hami_pod("sp", json!({}), 10_000, 10);
    assert_eq!(bind(&ext, &cluster, &sp, "n").await, "");
    assert_ne!(
        assignment(&cluster, "sp").unwrap().containers[0].devices[0].id,
        used
    );
    // GPU binpack: onto the most used GPU that fits.
    let bp = hami_pod(
        "bp",
        json!({"hami.io/gpu-scheduler-policy": "binpack"}),
        10_000,
        10,
    );
    assert_eq!(bind(&ext, &cluster, &bp, "n").await, "");
    let a = assignment(&cluster, "bp").unwrap();
    let d = &a.containers[0].devices[0];
    assert!(
        d.id == used || d.id == assignment(&cluster, "sp").unwrap().containers[0].devices[0].id
    );
    assert_eq!((d.memory_bytes, d.cores), (10_000 << 20, 10));
    assert_eq!(a.node, "n");
}

/// The GPU of `pod`'s only device in `cluster`.
fn device_of(cluster: &MemoryCluster, pod: &str) -> String {
    assignment(cluster, pod).unwrap().containers[0].devices[0]
        .id
        .clone()
}

#[tokio::test]
async fn fragaware_learns_the_workload_from_the_pods_and_falls_back_before() {
    // Three 60Gi pods on node m, a 20Gi pod on n: the workload is mostly 3/4-GPU pods.
    let cluster = MemoryCluster::default();
    let nodes = [gpu_node("m", 3, "A100", 80), gpu_node("n", 2, "A100", 80)];
    let seed = extender();
    seed.sync(&nodes, &[], Instant::now());
    let old = |name: &str, mib: u64| {
        let mut p = hami_pod(name, json!({}), mib, 0);
        p.metadata
            .extra
            .insert("creationTimestamp".into(), json!("2020-01-01T00:00:00Z"));
        p
    };
    for i in 0..3 {
        assert_eq!(
            bind(&seed, &cluster, &old(&format!("big-{i}"), 61_440), "m").await,
            ""
        );
    }
    assert_eq!(bind(&seed, &cluster, &old("first", 20_000), "n").await, "");
    let first = device_of(&cluster, "first");
    let with_half_life = |secs| {
        let ext = Extender::new(ExtenderConfig {
            default_policy: "fragaware".parse().unwrap(),
            workload_half_life: Duration::from_secs(secs),
            ..ExtenderConfig::default()
        });
        ext.sync(&nodes, &cluster.pods(), Instant::now());
        ext
    };
    // Pods from 2020 are past 30 half-lives of one second: no model, binpack on the
    // GPUs (the fuller one, first's).
    let forgot = with_half_life(1);
    let learned = with_half_life(100 * 365 * 86_400);
    assert_eq!(
        bind(&forgot, &cluster, &hami_pod("x", json!({}), 20_000, 0), "n").await,
        ""
    );
    assert_eq!(device_of(&cluster, "x"), first);
    // With the pods in the model (synced before x), fragaware keeps 60Gi free on both
    // GPUs instead of leaving first's GPU with 40Gi no 60Gi pod can use.
    assert_eq!(
        bind(
            &learned,
            &cluster,
            &hami_pod("y", json!({}), 20_000, 0),
            "n"
        )
        .await,
        ""
    );
    assert_ne!(device_of(&cluster, "y"), first);
}

#[test]
fn model_include_exclude_and_uuid_pin() {
    let ext = extender();
    ext.sync(
        &[
            gpu_node("a100", 2, "NVIDIA A100-SXM4-80GB", 80),
            gpu_node("t4", 2, "Tesla T4", 16),
        ],
        &[],
        Instant::now(),
    );
    let names = ["a100", "t4"];
    let only_a100 = hami_pod("p", json!({"nvidia.com/use-gputype": "a100"}), 1000, 0);
    let r = ext.filter(&filter_args(&only_a100, &names));
    assert_eq!(r.node_names.clone().unwrap(), ["a100"]);
    assert!(
        r.failed_nodes["t4"].contains("model in [\"a100\"]"),
        "{r:?}"
    );
    let no_a100 = hami_pod("p", json!({"nvidia.com/nouse-gputype": "A100"}), 1000, 0);
    assert_eq!(
        ext.filter(&filter_args(&no_a100, &names))
            .node_names
            .unwrap(),
        ["t4"]
    );
    let pinned = hami_pod("p", json!({"nvidia.com/use-gpuuuid": "GPU-t4-1"}), 1000, 0);
    assert_eq!(
        ext.filter(&filter_args(&pinned, &names))
            .node_names
            .unwrap(),
        ["t4"]
    );
    let placed = ext
        .reserve(
            "t4",
            &fgpu_driver::hami::pod_request(
                &pinned,
                &Default::default(),
                ext.config().default_policy,
            )
            .unwrap(),
        )
        .unwrap();
    assert_eq!(placed.containers[0].devices[0].uuid, "GPU-t4-1");
    // Too much memory for a T4.
    let big = hami_pod("p", json!({}), 20_000, 0);
    let r = ext.filter(&filter_args(&big, &names));
    assert_eq!(r.node_names.clone().unwrap(), ["a100"]);
    assert!(
        r.failed_nodes["t4"].contains("needs 1 GPU(s) with 20000 MiB"),
        "{r:?}"
    );
}

#[tokio::test]
async fn numa_binding_for_multi_gpu() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    // 4 GPUs: 0,1 on NUMA 0; 2,3 on NUMA 1. Take GPU 0 and GPU 2 whole.
    ext.sync(&[gpu_node("n", 4, "A100", 80)], &[], Instant::now());
    for (name, uuid) in [("w0", "GPU-n-0"), ("w2", "GPU-n-2")] {
        let p = gpu_pod(
            name,
            json!({"nvidia.com/use-gpuuuid": uuid}),
            json!({"nvidia.com/gpu": "1"}),
        );
        assert_eq!(bind(&ext, &cluster, &p, "n").await, "");
    }
    let two = |ann| {
        gpu_pod(
            "two",
            ann,
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"}),
        )
    };
    let free = ext.filter(&filter_args(&two(json!({})), &["n"]));
    assert_eq!(free.node_names.unwrap(), ["n"]);
    let bound = ext.filter(&filter_args(
        &two(json!({"nvidia.com/numa-bind": "true"})),
        &["n"],
    ));
    assert!(bound.node_names.clone().unwrap().is_empty());
    assert!(
        bound.failed_nodes["n"].contains("no NUMA node has 2"),
        "{bound:?}"
    );
}

#[test]
fn unknown_nodes_and_bad_pods() {
    let ext = extender();
    let mut broken = gpu_node("broken", 1, "A100", 80);
    broken
        .metadata
        .annotations
        .insert(INVENTORY.into(), "[{\"id\":1}]".into());
    let report = ext.sync(
        &[gpu_node("ok", 1, "A100", 80), broken],
        &[],
        Instant::now(),
    );
    assert_eq!(report.errors.len(), 1);
    assert!(
        report.errors[0].starts_with("node broken: annotation gpu.fgpu.dev/node-gpus: "),
        "{report:?}"
    );
    let p = hami_pod("p", json!({}), 1000, 0);
    let r = ext.filter(&filter_args(&p, &["ok", "broken", "cpu-only"]));
    assert_eq!(r.node_names.unwrap(), ["ok"]);
    assert!(r.failed_and_unresolvable_nodes["broken"].starts_with("node broken: annotation"));
    assert!(r.failed_and_unresolvable_nodes["cpu-only"].contains("no GPU inventory"));
    assert_eq!(r.error, "");

    let bad = hami_pod(
        "bad",
        json!({"hami.io/gpu-scheduler-policy": "topology-aware"}),
        1000,
        0,
    );
    let r = ext.filter(&filter_args(&bad, &["ok"]));
    assert_eq!(
        r.error,
        "pod default/bad: metadata.annotations[\"hami.io/gpu-scheduler-policy\"]: \"topology-aware\"; valid are binpack and spread"
    );
    assert!(ext.prioritize(&filter_args(&bad, &["ok"])).is_err());
    // Pods without GPU resources pass everywhere.
    let plain = gpu_pod("plain", json!({}), json!({"cpu": "1"}));
    assert_eq!(
        ext.filter(&filter_args(&plain, &["ok", "cpu-only"]))
            .node_names
            .unwrap(),
        ["ok", "cpu-only"]
    );
}

#[tokio::test]
async fn multi_container_pods_share_the_node() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    ext.sync(&[gpu_node("n", 2, "A100", 80)], &[], Instant::now());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "mc", "namespace": "default", "uid": "uid-mc"},
        "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}}},
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "50000"}}}
        ], "schedulerName": "fgpu-scheduler"}
    }))
    .unwrap();
    // 3 × 50000 MiB do not fit on 2 × 80 GiB GPUs: each GPU holds one.
    let r = ext.filter(&filter_args(&pod, &["n"]));
    assert!(r.failed_nodes["n"].starts_with("container c:"), "{r:?}");
    let mut two = pod.clone();
    two.spec.containers.pop();
    assert_eq!(
        ext.filter(&filter_args(&two, &["n"])).node_names.unwrap(),
        ["n"]
    );
    assert_eq!(bind(&ext, &cluster, &two, "n").await, "");
    let a = assignment(&cluster, "mc").unwrap();
    assert_eq!(a.containers.len(), 2);
    assert_eq!((a.containers[0].index, a.containers[1].index), (0, 1));
    assert_ne!(a.containers[0].devices[0].id, a.containers[1].devices[0].id);
    assert_eq!(ext.node_grants("n").len(), 2);
}

#[tokio::test]
async fn failed_binding_gives_everything_back() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    ext.sync(&[gpu_node("n", 1, "A100", 80)], &[], Instant::now());
    let p = hami_pod("p", json!({}), 80 * 1024, 100);
    cluster.fail_bind_of("p");
    let err = bind(&ext, &cluster, &p, "n").await;
    assert_eq!(
        err,
        "pod default/p: creating the Binding to n: pods \"p\": binding refused (injected)"
    );
    assert!(ext.node_grants("n").is_empty());
    assert!(assignment(&cluster, "p").is_none(), "annotation removed");
    // The next pod gets the GPU.
    let q = hami_pod("q", json!({}), 80 * 1024, 100);
    assert_eq!(bind(&ext, &cluster, &q, "n").await, "");
    // Nothing left.
    let r = hami_pod("r", json!({}), 1, 0);
    assert!(
        bind(&ext, &cluster, &r, "n")
            .await
            .contains("needs 1 GPU(s)")
    );
    // A bind for a replaced pod (other UID) is refused.
    let mut args = bind_args(&q, "n");
    args.pod_uid = "other".into();
    assert!(
        ext.bind(&args, &cluster)
            .await
            .error
            .contains("was replaced")
    );
}

/// A pod the watch sees deleted gives its grants back at once, before any list.
#[tokio::test]
async fn a_gone_pod_releases_its_grants_at_once() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    ext.sync(&[gpu_node("n", 1, "A100", 80)], &[], Instant::now());
    let p = hami_pod("p", json!({}), 60 * 1024, 60);
    assert_eq!(bind(&ext, &cluster, &p, "n").await, "");
    let q = hami_pod("q", json!({}), 60 * 1024, 60);
    assert!(
        bind(&ext, &cluster, &q, "n")
            .await
            .contains("needs 1 GPU(s)")
    );
    let bound = cluster
        .pods()
        .into_iter()
        .find(|x| x.metadata.name == "p")
        .unwrap();
    let decision = bound.metadata.annotations.get(ASSIGNED).unwrap();
    assert_eq!(ext.release_gone_pod(&bound.metadata.uid, decision), 1);
    assert!(ext.node_grants("n").is_empty());
    assert_eq!(bind(&ext, &cluster, &q, "n").await, "", "q fits now");
    // Twice, or with a decision that cannot be read: nothing more happens.
    assert_eq!(ext.release_gone_pod(&bound.metadata.uid, decision), 0);
    assert_eq!(ext.release_gone_pod("x", "not json"), 0);
    assert_eq!(ext.node_grants("n").len(), 1, "q's grant stays");
}

/// The issue's test: 20 pods bound at once to 2 nodes that hold exactly 8 of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_binds_never_over_grant() {
    let ext = Arc::new(extender());
    // Each API write takes 20 ms, so the binds overlap.
    let cluster = Arc::new(MemoryCluster::new(Duration::from_millis(20)));
    // 2 nodes × 2 GPUs × 40 GiB; each pod asks 1 GPU with 20 GiB and 50 % cores: 4 per node.
    ext.sync(
        &[gpu_node("n0", 2, "A100", 40), gpu_node("n1", 2, "A100", 40)],
        &[],
        Instant::now(),
    );
    let pods: Vec<Pod> = (0..20)
        .map(|i| hami_pod(&format!("p{i}"), json!({}), 20 * 1024, 50))
        .collect();
    for p in &pods {
        cluster.add_pod(p.clone());
    }
    let started = Instant::now();
    let tasks: Vec<_> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (ext, cluster) = (ext.clone(), cluster.clone());
            let args = bind_args(p, if i % 2 == 0 { "n0" } else { "n1" });
            tokio::spawn(async move { ext.bind(&args, &*cluster).await.error })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        let e = t.await.unwrap();
        if e.is_empty() {
            ok += 1;
        } else {
            assert!(e.contains("needs 1 GPU(s) with 20480 MiB"), "{e}");
        }
    }
    let elapsed = started.elapsed();
    assert_eq!(ok, 8);
    assert_eq!(cluster.bindings().len(), 8);
    for node in ["n0", "n1"] {
        for (gpu, mem_free, cores_free) in ext.node_usage(node).unwrap() {
            assert_eq!((mem_free, cores_free), (0, 0), "{node}/{gpu} exactly full");
        }
    }
    // A restarted extender rebuilds the same ledger from the pods' annotations alone.
    let again = extender();
    let report = again.sync(
        &[gpu_node("n0", 2, "A100", 40), gpu_node("n1", 2, "A100", 40)],
        &cluster.pods(),
        Instant::now(),
    );
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.assigned_pods, 8);
    for node in ["n0", "n1"] {
        let mut a = ext.node_grants(node);
        let mut b = again.node_grants(node);
        a.sort_by(|x, y| x.id.cmp(&y.id));
        b.sort_by(|x, y| x.id.cmp(&y.id));
        assert_eq!(a, b);
    }
    eprintln!("20 concurrent binds (8 granted) took {elapsed:?} with 20 ms per API write");
}

#[tokio::test]
async fn reservations_survive_a_stale_pod_list() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    let nodes = [gpu_node("n", 1, "A100", 80)];
    ext.sync(&nodes, &[], Instant::now());
    let p = hami_pod("p", json!({}), 80 * 1024, 0);
    assert_eq!(bind(&ext, &cluster, &p, "n").await, "");
    // A pod list taken before the annotation landed: the reservation stays.
    let stale = vec![p.clone()];
    ext.sync(&nodes, &stale, Instant::now());
    assert_eq!(ext.node_grants("n").len(), 1);
    // The list shows the annotation: the grant now comes from the pod.
    ext.sync(&nodes, &cluster.pods(), Instant::now());
    assert_eq!(ext.node_grants("n").len(), 1);
    // The pod is gone: nothing is granted.
    ext.sync(&nodes, &[], Instant::now());
    assert!(ext.node_grants("n").is_empty());
    // A reservation never shown is dropped after the grace period.
    let q = hami_pod("q", json!({}), 1000, 0);
    assert_eq!(bind(&ext, &cluster, &q, "n").await, "");
    ext.sync(&nodes, &[], Instant::now());
    assert_eq!(ext.node_grants("n").len(), 1);
    ext.sync(&nodes, &[], Instant::now() + Duration::from_secs(301));
    assert!(ext.node_grants("n").is_empty());
    // A list showing an older assignment of a pod (a failed earlier attempt) does not
    // replace the newer reservation.
    let r = hami_pod("r", json!({}), 2000, 0);
    assert_eq!(bind(&ext, &cluster, &r, "n").await, "");
    let mut older = cluster
        .pods()
        .into_iter()
        .find(|x| x.metadata.name == "r")
        .unwrap();
    let mut a = PodAssignment::parse("r", ASSIGNED, &older.metadata.annotations[ASSIGNED]).unwrap();
    a.containers[0].devices[0].memory_bytes = 1 << 20;
    assign(&mut older, a.render());
    ext.sync(&nodes, &[older], Instant::now());
    let g = ext.node_grants("n");
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].devices[0].memory, 2000 << 20);
    let current: Vec<Pod> = cluster
        .pods()
        .into_iter()
        .filter(|x| x.metadata.name == "r")
        .collect();
    ext.sync(&nodes, &current, Instant::now());
    assert_eq!(ext.node_grants("n")[0].devices[0].memory, 2000 << 20);
    // Finished pods free their GPUs.
    let mut done = cluster
        .pods()
        .into_iter()
        .find(|x| x.metadata.name == "q")
        .unwrap();
    done.extra["status"] = json!({"phase": "Succeeded"});
    ext.sync(&nodes, &[done], Instant::now() + Duration::from_secs(301));
    assert!(ext.node_grants("n").is_empty());
}

#[test]
fn recorded_grants_beyond_capacity_close_the_node() {
    let ext = extender();
    let nodes = [gpu_node("n", 1, "A100", 80)];
    let assigned = |name: &str, mib: u64| {
        let mut p = hami_pod(name, json!({}), mib, 0);
        assign(
            &mut p,
            format!(
                r#"{{"node":"n","containers":[{{"index":0,"name":"main","devices":[{{"id":"gpu-0","uuid":"GPU-n-0","memoryBytes":{},"cores":0}}]}}]}}"#,
                mib << 20
            ),
        );
        p
    };
    let report = ext.sync(
        &nodes,
        &[assigned("a", 60_000), assigned("b", 60_000)],
        Instant::now(),
    );
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert!(
        report.errors[0].contains("do not fit its inventory"),
        "{report:?}"
    );
    let r = ext.filter(&filter_args(&hami_pod("c", json!({}), 1, 0), &["n"]));
    assert!(r.failed_and_unresolvable_nodes["n"].starts_with("node n: the GPU grants"));
    // A broken assignment annotation is reported with the pod's name.
    let mut bad = hami_pod("bad", json!({}), 1, 0);
    assign(&mut bad, "{}".into());
    let report = ext.sync(&nodes, &[bad], Instant::now());
    assert!(
        report.errors[0].starts_with("pod default/bad: annotation gpu.fgpu.dev/assigned-devices: "),
        "{report:?}"
    );
}

#[test]
fn full_node_objects_are_answered_in_kind() {
    let ext = extender();
    let nodes = [gpu_node("a", 1, "A100", 80), gpu_node("b", 1, "T4", 16)];
    ext.sync(&nodes, &[], Instant::now());
    let p = hami_pod("p", json!({}), 20_000, 0);
    let args = fgpu_api::extender::ExtenderArgs {
        pod: p,
        nodes: Some(fgpu_api::extender::NodeList {
            items: nodes.to_vec(),
            extra: Default::default(),
        }),
        node_names: None,
    };
    let r = ext.filter(&args);
    assert!(r.node_names.is_none());
    let kept: Vec<_> = r
        .nodes
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name)
        .collect();
    assert_eq!(kept, ["a"]);
    assert!(r.failed_nodes.contains_key("b"));
}

#[test]
fn daemon_flags_are_checked() {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: fgpu_extender::ExtenderArgs,
    }
    let ok = Cli::parse_from(["x", "--default-policy", "spread/binpack"])
        .args
        .config()
        .unwrap();
    assert_eq!(ok.default_policy.to_string(), "spread/binpack");
    let default = Cli::parse_from(["x"]).args.config().unwrap();
    assert_eq!(default.default_policy.to_string(), "binpack/spread");
    // The old spelling is still accepted; errors name the flag as --help shows it.
    let old = Cli::parse_from(["x", "--policy", "spread/binpack"]).args;
    assert_eq!(
        old.config().unwrap().default_policy.to_string(),
        "spread/binpack"
    );
    let e = Cli::parse_from(["x", "--default-policy", "fastest"])
        .args
        .config()
        .unwrap_err();
    assert!(
        format!("{e:#}").starts_with("--default-policy: unknown policy \"fastest\""),
        "{e:#}"
    );
    let e = Cli::parse_from(["x", "--driver-name", "Bad"])
        .args
        .config()
        .unwrap_err();
    assert!(
        format!("{e:#}").starts_with("--driver-name: driver name \"Bad\""),
        "{e:#}"
    );
}

/// A node whose inventory annotation lists GPUs `(model, GiB, mode)`.
fn moded_node(name: &str, gpus: &[(&str, u64, &str)]) -> fgpu_api::extender::Node {
    let list: Vec<serde_json::Value> = gpus
        .iter()
        .enumerate()
        .map(|(i, (model, gib, mode))| {
            json!({"id": format!("gpu-{i}"), "uuid": format!("GPU-{name}-{i}"), "model": model,
                   "memoryBytes": gib * GIB, "mode": mode})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {INVENTORY: serde_json::to_string(&list).unwrap()}},
        "status": {}
    }))
    .unwrap()
}

#[tokio::test]
async fn gpumem_on_a_mig_mode_gpu_gets_the_smallest_fitting_profile() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    ext.sync(
        &[moded_node("n", &[("NVIDIA H100 80GB HBM3", 80, "mig")])],
        &[],
        Instant::now(),
    );
    // 10, 20 and 40 GiB: 1g.10gb at 6, 2g.20gb at 4, 3g.40gb at 0 (the placement rule),
    // each granted its profile's memory and no core quota.
    for (name, mib, device) in [
        ("p10", 10_240u64, "gpu-0-mig-1g10gb-6"),
        ("p20", 20_480, "gpu-0-mig-2g20gb-4"),
        ("p40", 40_960, "gpu-0-mig-3g40gb-0"),
    ] {
        let pod = gpu_pod(
            name,
            json!({}),
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": mib.to_string()}),
        );
        assert_eq!(bind(&ext, &cluster, &pod, "n").await, "", "{name}");
        let a = assignment(&cluster, name).unwrap();
        let d = &a.containers[0].devices[0];
        assert_eq!(
            (d.id.as_str(), d.uuid.as_str(), d.cores),
            (device, "GPU-n-0", 0),
            "{name}"
        );
        assert_eq!(
            d.memory_bytes,
            (mib << 20).next_multiple_of(10 * GIB),
            "{name}"
        );
    }
    // A fourth 40 GiB does not fit: filter says so.
    let fourth = gpu_pod(
        "p4",
        json!({}),
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960"}),
    );
    let r = ext.filter(&filter_args(&fourth, &["n"]));
    assert!(r.node_names.unwrap_or_default().is_empty());
    assert!(r.failed_nodes.contains_key("n"), "{:?}", r.failed_nodes);
    // After a restart, the placements are read back from the pods' assignments: the
    // extender, synced from the pod list alone, still refuses the fourth.
    let again = extender();
    again.sync(
        &[moded_node("n", &[("NVIDIA H100 80GB HBM3", 80, "mig")])],
        &cluster.pods(),
        Instant::now(),
    );
    let r = again.filter(&filter_args(&fourth, &["n"]));
    assert!(r.failed_nodes.contains_key("n"), "{:?}", r.failed_nodes);
    let small = gpu_pod(
        "p5",
        json!({}),
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5000"}),
    );
    let r = again.filter(&filter_args(&small, &["n"]));
    assert!(
        r.failed_nodes.contains_key("n"),
        "no 1g.10gb starts at slice 7"
    );
}

#[tokio::test]
async fn shares_stay_off_mig_and_whole_mode_gpus() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    ext.sync(
        &[moded_node(
            "n",
            &[
                ("NVIDIA A100-SXM4-80GB", 80, "whole"),
                ("NVIDIA A100-SXM4-80GB", 80, "shared"),
            ],
        )],
        &[],
        Instant::now(),
    );
    // Two shares: both on the shared GPU (gpu-1), never on the whole-mode one.
    for name in ["s1", "s2"] {
        let pod = hami_pod(name, json!({}), 10_000, 10);
        assert_eq!(bind(&ext, &cluster, &pod, "n").await, "");
        assert_eq!(device_of(&cluster, name), "gpu-1", "{name}");
    }
    // A whole GPU request takes the whole-mode GPU.
    let whole = gpu_pod("w", json!({}), json!({"nvidia.com/gpu": "1"}));
    assert_eq!(bind(&ext, &cluster, &whole, "n").await, "");
    assert_eq!(device_of(&cluster, "w"), "gpu-0");
    // A MIG-mode GPU of a model without a table is refused, naming the field.
    let bad = moded_node("m", &[("NVIDIA L4", 24, "mig")]);
    let report = ext.sync(&[bad], &[], Instant::now());
    assert!(
        format!("{report:?}").contains("[0].mode: mig, but no MIG profile table"),
        "{report:?}"
    );
}

/// HAMi's `nvidia.com/vgpu-mode`: `mig` takes a MIG placement even where a shared GPU has
/// room; `hami-core` (or another value) never takes one, and its refusal names the
/// annotation; without it a share is taken first.
#[tokio::test]
async fn vgpu_mode_annotation_picks_shares_or_mig() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    ext.sync(
        &[moded_node(
            "n",
            &[
                ("NVIDIA A100-SXM4-80GB", 80, "shared"),
                ("NVIDIA H100 80GB HBM3", 80, "mig"),
            ],
        )],
        &[],
        Instant::now(),
    );
    let pod = |name: &str, ann: serde_json::Value| {
        gpu_pod(
            name,
            ann,
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"}),
        )
    };
    let mig = pod("m", json!({"nvidia.com/vgpu-mode": "mig"}));
    assert_eq!(bind(&ext, &cluster, &mig, "n").await, "");
    assert_eq!(device_of(&cluster, "m"), "gpu-1-mig-1g10gb-6");
    let plain = pod("p", json!({}));
    assert_eq!(bind(&ext, &cluster, &plain, "n").await, "");
    assert_eq!(device_of(&cluster, "p"), "gpu-0");
    let core = pod("c", json!({"nvidia.com/vgpu-mode": "hami-core"}));
    assert_eq!(bind(&ext, &cluster, &core, "n").await, "");
    assert_eq!(device_of(&cluster, "c"), "gpu-0");

    // Only the MIG-mode GPU: hami-core is refused, saying why; no annotation takes MIG.
    let only_mig = MemoryCluster::default();
    let ext = extender();
    ext.sync(
        &[moded_node("k", &[("NVIDIA H100 80GB HBM3", 80, "mig")])],
        &[],
        Instant::now(),
    );
    let core = pod("c2", json!({"nvidia.com/vgpu-mode": "hami-core"}));
    let r = ext.filter(&filter_args(&core, &["k"]));
    let why = r.failed_nodes.get("k").cloned().unwrap_or_default();
    assert!(
        why.contains("annotation nvidia.com/vgpu-mode: quota shares only, no MIG placement"),
        "{:?}",
        r.failed_nodes
    );
    let plain = pod("p2", json!({}));
    assert_eq!(bind(&ext, &only_mig, &plain, "k").await, "");
    assert_eq!(device_of(&only_mig, "p2"), "gpu-0-mig-1g10gb-6");
}
