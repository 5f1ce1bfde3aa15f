//! Filter's kept results (`fgpu_extender::cache`): a random stream of state changes
//! (binds, pods going, reservations given back, device taints, health, labels, nodes
//! leaving and coming back, syncs that move the workload model) interleaved with
//! filter/prioritize requests, each answered with the cache and again without it; and
//! the counter of reused and evaluated nodes on `/metrics`.

use std::time::Instant;

use crate::support::*;
use fgpu_api::extender::{ExtenderArgs, ExtenderFilterResult, HostPriorityList, Node, Pod};
use fgpu_driver::engine::{self, Gpu};
use fgpu_driver::hami::pod_request;
use fgpu_extender::annotations::{WHOLE_MODE_TAINT, render_node_inventory};
use fgpu_extender::{CacheStats, Extender, ExtenderConfig};
use proptest::prelude::*;
use serde_json::json;

/// The pod shapes of the stream: policies that read the workload model and some that do
/// not, model constraints, NUMA binding, whole GPUs.
fn shape(i: usize, name: &str) -> Pod {
    match i % 5 {
        0 => gpu_pod(
            name,
            json!({}),
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "30"}),
        ),
        1 => gpu_pod(
            name,
            json!({"hami.io/node-scheduler-policy": "fragaware"}),
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "30"}),
        ),
        2 => gpu_pod(
            name,
            json!({"nvidia.com/numa-bind": "true", "nvidia.com/use-gputype": "A100", "hami.io/node-scheduler-policy": "spread"}),
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "20000"}),
        ),
        3 => gpu_pod(
            name,
            json!({"hami.io/node-scheduler-policy": "fragaware"}),
            json!({"nvidia.com/gpu": "1"}),
        ),
        _ => gpu_pod(
            name,
            json!({"nvidia.com/nouse-gputype": "T4", "hami.io/node-scheduler-policy": "fgd"}),
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
        ),
    }
}

/// One node as the test varies it.
#[derive(Clone)]
struct NodeSpec {
    name: String,
    model: &'static str,
    gib: u64,
    healthy: [bool; 4],
    whole: [bool; 4],
    label: u8,
    listed: bool,
}

impl NodeSpec {
    fn node(&self) -> Node {
        let gpus = (0..4)
            .map(|i| {
                let mut g = Gpu::new(format!("gpu-{i}"), self.model, self.gib * GIB);
                g.uuid = format!("GPU-{}-{i}", self.name);
                g.numa = Some((i / 2) as u32);
                g.healthy = self.healthy[i];
                if self.whole[i] {
                    g.taints.push(engine::Taint {
                        key: WHOLE_MODE_TAINT.into(),
                        value: String::new(),
                        effect: "NoSchedule".into(),
                    });
                }
                g
            })
            .collect();
        let inv = render_node_inventory(&engine::Node::new(self.name.clone(), gpus));
        serde_json::from_value(json!({
            "metadata": {"name": self.name, "labels": {"pool": format!("p{}", self.label)},
                "annotations": {INVENTORY: inv}},
            "status": {}
        }))
        .unwrap()
    }
}

/// The cluster: nodes, the pods bound so far (as the pod list shows them) and the
/// extender under test.
struct World {
    ext: Extender,
    nodes: Vec<NodeSpec>,
    bound: Vec<Pod>,
    names: Vec<String>,
    serial: usize,
    /// Seconds before now the next bound pod says it was created (moves the model).
    age: i64,
}

impl World {
    fn new() -> Self {
        let models = [
            ("NVIDIA A100-SXM4-80GB", 80),
            ("Tesla T4", 16),
            ("NVIDIA L40S", 48),
        ];
        let nodes: Vec<NodeSpec> = (0..6)
            .map(|i| NodeSpec {
                name: format!("n{i}"),
                model: models[i % 3].0,
                gib: models[i % 3].1,
                healthy: [true; 4],
                whole: [false; 4],
                label: 0,
                listed: true,
            })
            .collect();
        let names = nodes.iter().map(|n| n.name.clone()).collect();
        let w = World {
            ext: Extender::new(ExtenderConfig::default()),
            nodes,
            bound: Vec::new(),
            names,
            serial: 0,
            age: 0,
        };
        w.sync();
        w
    }

    /// A sync from the nodes listed and the pods bound (its errors are expected: pods
    /// on a node that left, grants on a GPU turned unhealthy).
    fn sync(&self) {
        let nodes: Vec<Node> = self
            .nodes
            .iter()
            .filter(|n| n.listed)
            .map(NodeSpec::node)
            .collect();
        self.ext.sync(&nodes, &self.bound, Instant::now());
    }

    fn args(&self, pod: &Pod, names: &[String]) -> ExtenderArgs {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        filter_args(pod, &names)
    }

    /// Filter then prioritize over every node, with the cache as it is.
    fn ask(&self, pod: &Pod) -> (ExtenderFilterResult, HostPriorityList) {
        let f = self.ext.filter(&self.args(pod, &self.names));
        let p = self.ext.prioritize(&self.args(pod, &self.names)).unwrap();
        (f, p)
    }

    /// A request of shape `s`: answered with the cache, then afresh (cache off, pods with
    /// UIDs never seen, so no filter scores are reused either); both must agree. Returns
    /// the pod and the node with the best score, if any.
    fn request(&mut self, s: usize) -> (Pod, Option<String>) {
        self.serial += 1;
        let pod = shape(s, &format!("pod-{}", self.serial));
        self.ext.set_filter_cache(true);
        let (f, p) = self.ask(&pod);
        self.ext.set_filter_cache(false);
        let fresh = |tag: &str| {
            let mut q = pod.clone();
            q.metadata.uid = format!("fresh-{tag}-{}", self.serial);
            q
        };
        let f0 = self.ext.filter(&self.args(&fresh("f"), &self.names));
        let p0 = self
            .ext
            .prioritize(&self.args(&fresh("p"), &self.names))
            .unwrap();
        self.ext.set_filter_cache(true);
        assert_eq!(f.error, f0.error, "shape {s}");
        assert_eq!(f.node_names, f0.node_names, "shape {s}: passed nodes");
        assert_eq!(f.failed_nodes, f0.failed_nodes, "shape {s}: FailedNodes");
        assert_eq!(
            f.failed_and_unresolvable_nodes, f0.failed_and_unresolvable_nodes,
            "shape {s}: FailedAndUnresolvableNodes"
        );
        assert_eq!(p, p0, "shape {s}: priorities");
        let best = p
            .iter()
            .filter(|h| f.node_names.as_ref().unwrap().contains(&h.host))
            .max_by_key(|h| h.score)
            .map(|h| h.host.clone());
        (pod, best)
    }

    /// A request of shape `s`, then its pod reserved on the best node and shown bound in
    /// the pod list from the next sync on.
    fn bind(&mut self, s: usize) {
        let (mut pod, best) = self.request(s);
        let Some(node) = best else { return };
        let cfg = self.ext.config();
        let req = pod_request(&pod, &cfg.names, cfg.default_policy).unwrap();
        let a = self.ext.reserve(&node, &req).expect("filter said it fits");
        assign(&mut pod, a.render());
        pod.spec.extra.insert("nodeName".into(), json!(node));
        pod.extra["status"] = json!({"phase": "Running"});
        let created = k8s_openapi::jiff::Timestamp::now().as_second() - self.age;
        let created = k8s_openapi::jiff::Timestamp::from_second(created).unwrap();
        pod.metadata
            .extra
            .insert("creationTimestamp".into(), json!(created.to_string()));
        self.bound.push(pod);
    }
}

/// One step of the stream, from three random numbers.
fn step(w: &mut World, op: u8, a: u8, b: u8) {
    let node = usize::from(a) % w.nodes.len();
    let gpu = usize::from(b) % 4;
    match op % 10 {
        0 | 1 => {
            w.request(usize::from(a));
        }
        2 | 3 => w.bind(usize::from(a)),
        // A bound pod goes (the watch releases it at once; the next sync agrees).
        4 if !w.bound.is_empty() => {
            let pod = w.bound.remove(usize::from(a) % w.bound.len());
            let decision = &pod.metadata.annotations[ASSIGNED];
            w.ext.release_gone_pod(&pod.metadata.uid, decision);
        }
        // A bind whose write failed gives its reservation back; another pod's request
        // comes while it is held.
        5 => {
            let (pod, best) = w.request(usize::from(a));
            if let Some(node) = best {
                let cfg = w.ext.config();
                let req = pod_request(&pod, &cfg.names, cfg.default_policy).unwrap();
                w.ext.reserve(&node, &req).unwrap();
                w.request(usize::from(b));
                w.ext.unreserve(&node, &req.uid);
            }
        }
        6 => {
            w.nodes[node].whole[gpu] ^= true;
            w.sync();
        }
        7 => {
            w.nodes[node].healthy[gpu] ^= true;
            w.sync();
        }
        8 => {
            w.nodes[node].label = w.nodes[node].label.wrapping_add(1);
            w.nodes[node].listed = !b.is_multiple_of(5);
            w.sync();
        }
        // A sync that shows the pods bound since, with older or newer creation times:
        // the workload model moves.
        _ => {
            w.age = i64::from(b) * 60;
            w.sync();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every answer with the cache is the answer without it.
    #[test]
    fn cached_answers_equal_fresh_ones(
        ops in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>()), 1..80)
    ) {
        let mut w = World::new();
        for (op, a, b) in ops {
            step(&mut w, op, a, b);
        }
        // And once more every shape at the end.
        for s in 0..5 {
            w.request(s);
        }
    }
}

/// Pods of one shape arriving one by one, each bound to the node it was given: after
/// the first, filter evaluates only the node the previous pod went to.
#[test]
fn the_next_pod_of_a_shape_evaluates_only_the_changed_node() {
    let mut w = World::new();
    w.bind(0);
    let before = w.ext.cache_stats();
    w.ext.set_filter_cache(true);
    let (f, _) = w.ask(&shape(0, "next"));
    let after = w.ext.cache_stats();
    assert!(f.node_names.is_some_and(|n| !n.is_empty()));
    // Filter: the bound node again, the other five kept; prioritize: all six kept.
    assert_eq!(
        after.evaluated - before.evaluated,
        1,
        "{before:?} {after:?}"
    );
    assert_eq!(after.reused - before.reused, 5 + 6, "{before:?} {after:?}");
    // With the cache off, every node is worked out.
    w.ext.set_filter_cache(false);
    let _ = w.ext.filter(&w.args(&shape(0, "off"), &w.names));
    assert_eq!(w.ext.cache_stats().evaluated - after.evaluated, 6);
}

/// A sync that changes nothing keeps the results; one that moves the model replaces
/// those of the policies that read it, and only those.
#[test]
fn a_sync_drops_only_what_it_changes() {
    let mut w = World::new();
    // Bind one pod of each shape so the model knows them; then sync twice to settle.
    for s in 0..5 {
        w.bind(s);
    }
    w.sync();
    w.sync();
    for s in 0..5 {
        w.request(s);
    }
    let stats = |w: &World, s: usize| {
        let before = w.ext.cache_stats();
        let _ = w.ext.filter(&w.args(&shape(s, "probe"), &w.names));
        let after = w.ext.cache_stats();
        after.evaluated - before.evaluated
    };
    w.sync();
    assert_eq!(stats(&w, 0), 0, "an unchanged sync keeps binpack's results");
    assert_eq!(
        stats(&w, 1),
        0,
        "an unchanged sync keeps fragaware's results"
    );
    // New pods in the list: the model moves. (The nodes they went to are evaluated
    // again first: their ledgers changed.)
    w.bind(4);
    w.bind(4);
    stats(&w, 0);
    stats(&w, 1);
    let evaluated = |w: &World| w.ext.cache_stats().evaluated;
    let e = evaluated(&w);
    let synced = series(&w.ext, "sync", "evaluated");
    w.sync();
    // The sync itself evaluates again the shapes whose policy reads the model (two
    // fragaware, one fgd) on the six nodes; not binpack's or spread's. The metric counts
    // them under `sync`.
    assert_eq!(evaluated(&w) - e, 3 * 6);
    assert_eq!(series(&w.ext, "sync", "evaluated") - synced, 3 * 6);
    assert_eq!(stats(&w, 0), 0, "binpack does not read the model");
    assert_eq!(
        stats(&w, 1),
        0,
        "fragaware's results were evaluated by the sync"
    );
    // With the cache off, a sync evaluates nothing ahead.
    w.bind(4);
    w.ext.set_filter_cache(false);
    let e = evaluated(&w);
    w.sync();
    assert_eq!(evaluated(&w), e);
}

/// One series of `fgpu_extender_filter_cache_nodes_total` in `ext`'s `/metrics` text.
fn series(ext: &Extender, verb: &str, result: &str) -> u64 {
    let text = ext.encode_metrics();
    let head =
        format!("fgpu_extender_filter_cache_nodes_total{{verb=\"{verb}\",result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&head))
        .unwrap_or_else(|| panic!("{head} in {text}"))
        .parse()
        .unwrap()
}

/// `(evaluated, reused)` of `verb` on `/metrics`.
fn counted(ext: &Extender, verb: &str) -> (u64, u64) {
    (series(ext, verb, "evaluated"), series(ext, verb, "reused"))
}

/// `/metrics` counts each node a request looked at once: evaluated the first time a shape
/// comes, reused by the next pod of that shape, evaluated again where the node changed.
#[test]
fn metrics_count_each_node_reused_or_evaluated() {
    let w = World::new();
    let n = w.names.len() as u64;
    for verb in ["filter", "prioritize", "sync"] {
        assert_eq!(counted(&w.ext, verb), (0, 0), "{verb} before any request");
    }
    let first = shape(0, "first");
    let f = w.ext.filter(&w.args(&first, &w.names));
    assert_eq!(f.node_names.map(|v| v.len() as u64), Some(n), "all fit");
    assert_eq!(counted(&w.ext, "filter"), (n, 0));
    // Prioritize of the same pod finds filter's results.
    w.ext.prioritize(&w.args(&first, &w.names)).unwrap();
    assert_eq!(counted(&w.ext, "prioritize"), (0, n));
    // Another pod of the same shape: every node reused.
    let second = shape(0, "second");
    let _ = w.ext.filter(&w.args(&second, &w.names));
    assert_eq!(counted(&w.ext, "filter"), (n, n));
    // A reservation on one node changes it: the next pod evaluates that node alone.
    let cfg = w.ext.config();
    let req = pod_request(&second, &cfg.names, cfg.default_policy).unwrap();
    w.ext
        .reserve(&w.names[2], &req)
        .expect("filter said it fits");
    let _ = w.ext.filter(&w.args(&shape(0, "third"), &w.names));
    assert_eq!(counted(&w.ext, "filter"), (n + 1, n + n - 1));
    // Another shape starts afresh.
    let _ = w.ext.filter(&w.args(&shape(2, "other"), &w.names));
    assert_eq!(counted(&w.ext, "filter"), (n + 1 + n, n + n - 1));
    // `cache_stats` reads the same counters.
    assert_eq!(
        w.ext.cache_stats(),
        CacheStats {
            reused: n + n + n - 1,
            evaluated: n + 1 + n,
        }
    );
    assert_eq!(counted(&w.ext, "sync"), (0, 0), "no sync moved the model");
}

/// With the cache off (`--no-filter-cache`) every node is evaluated for every request and
/// the reused series stay 0.
#[test]
fn metrics_without_the_cache_reuse_nothing() {
    let mut w = World::new();
    // As `--no-filter-cache` builds it (not `World::request`, which switches the cache).
    w.ext = Extender::new(ExtenderConfig {
        filter_cache: false,
        ..ExtenderConfig::default()
    });
    w.sync();
    let n = w.names.len() as u64;
    let first = shape(0, "first");
    let _ = w.ext.filter(&w.args(&first, &w.names));
    let _ = w.ext.filter(&w.args(&shape(0, "second"), &w.names));
    assert_eq!(counted(&w.ext, "filter"), (2 * n, 0));
    // Prioritize takes the pod's own filter scores for the nodes unchanged since (counted
    // in neither series), and evaluates the node a reservation changed.
    let cfg = w.ext.config();
    let req = pod_request(&shape(0, "other"), &cfg.names, cfg.default_policy).unwrap();
    w.ext.reserve(&w.names[0], &req).unwrap();
    w.ext.prioritize(&w.args(&first, &w.names)).unwrap();
    assert_eq!(counted(&w.ext, "prioritize"), (1, 0));
    assert_eq!(counted(&w.ext, "sync"), (0, 0));
    assert_eq!(w.ext.cache_stats().reused, 0);
}
