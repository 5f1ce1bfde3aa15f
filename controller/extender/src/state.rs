//! The extender's state and its three verbs: the node cache (inventory + ledger per node),
//! `filter`, `prioritize` and `bind`.
//!
//! Each node has its own slot: the capacity from the node's inventory annotation, a
//! one-node [`Ledger`] of the grants on it, and the reservations made by binds the pod list
//! does not show yet. A bind reserves under the slot's mutex (placement and grant together,
//! microseconds), then writes to the API server with no lock held; a failed write gives the
//! reservation back. Two binds to one node therefore never see the same free capacity, and
//! neither waits for the other's API round trips. See `docs/extender.md`.
//!
//! Each slot also keeps the outcomes of the last few pod shapes evaluated there, valid
//! while the node's generation and the workload model stay the same ([`crate::cache`]):
//! a pod of a shape seen before is evaluated again only on the nodes that changed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use fgpu_api::extender::{
    ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult, HostPriority,
    HostPriorityList, MAX_EXTENDER_PRIORITY, NodeList, Pod,
};
use fgpu_api::names::{DriverName, LegacyResourceNames, legacy};
use fgpu_driver::engine::WorkloadModel;
use fgpu_driver::engine::model::PolicyWorkloads;
use fgpu_driver::engine::{
    self, Gpu, GpuPolicy, GpuShare, Inventory, MaxSpec, Node, NodePolicy, Placement, Policy,
    Request, ScoreContext, Toleration, Topology,
};
use fgpu_driver::ledger::{DeviceGrant, Grant, Ledger};
use fgpu_driver::mig::{MigLayout, MigProfile, MigRequest, MigTable};
use serde_json::{Value, json};

use crate::annotations::{
    AssignedDevice, ContainerAssignment, PodAssignment, WHOLE_MODE_TAINT, grant_id,
    parse_node_inventory,
};
use crate::cache::{Cached, NodeResults, ResultKey, ShapeTable, next_generation};
use crate::error::{NoFit, PodError, Unusable};
pub use crate::metrics::CacheStats;
use crate::metrics::{CacheVerb, Metrics, PendingReason};
use crate::writer::ClusterWriter;
use fgpu_driver::hami::{ContainerRequest, PodRequest, VgpuMode, pod_key, pod_request};

/// Default `--scheduler-name`: the profile of the second kube-scheduler that calls the
/// extender (`deploy/extender/scheduler.yaml`).
pub const DEFAULT_SCHEDULER_NAME: &str = "fgpu-scheduler";

/// How the extender is configured.
#[derive(Clone, Debug)]
pub struct ExtenderConfig {
    pub driver: DriverName,
    pub names: LegacyResourceNames,
    /// Policy where the pod's annotations say nothing (HAMi's defaults: node binpack,
    /// GPU spread).
    pub default_policy: Policy,
    /// How long a bind's reservation is kept while the pod list does not show the pod's
    /// assignment annotation yet.
    pub reservation_grace: Duration,
    /// Benchmark baseline only: hold a per-node lock across the whole bind, API writes
    /// included, as HAMi's node lock does.
    pub serialize_node_binds: bool,
    /// `spec.schedulerName` of the pods this extender serves (the profile of the
    /// kube-scheduler that calls it); filter, prioritize and bind refuse every other pod.
    pub scheduler_name: String,
    /// How long it takes a pod's weight in the workload model (fgd, fragaware) to halve.
    pub workload_half_life: Duration,
    /// Reuse filter's per-node results for the next pod of the same shape on the nodes
    /// that did not change ([`crate::cache`]); off: every request evaluates every node
    /// (prioritize still reuses its own pod's filter scores). [`Extender::set_filter_cache`]
    /// switches it at run time.
    pub filter_cache: bool,
}

impl Default for ExtenderConfig {
    fn default() -> Self {
        Self {
            driver: DriverName::default(),
            names: LegacyResourceNames::default(),
            default_policy: Policy {
                node: NodePolicy::Binpack,
                gpu: GpuPolicy::Spread,
            },
            reservation_grace: Duration::from_secs(300),
            serialize_node_binds: false,
            scheduler_name: DEFAULT_SCHEDULER_NAME.to_owned(),
            workload_half_life: Duration::from_secs(3600),
            filter_cache: true,
        }
    }
}

/// A bind's grants on a node, kept until the pod list shows them.
#[derive(Clone, Debug)]
struct Reservation {
    grants: Vec<Grant>,
    since: Instant,
}

/// One node's state, under its slot's mutex.
#[derive(Debug)]
struct NodeState {
    /// The inventory with nothing granted.
    capacity: Node,
    /// The grants; `Err` holds why the node cannot be used.
    ledger: Result<Ledger, Unusable>,
    /// Binds not (yet) visible in the pod list, by pod UID.
    inflight: HashMap<String, Reservation>,
    /// Changes ([`NodeState::touch`]) whenever what the per-node work reads of the node
    /// changes: the ledger's node (GPUs, their health and taints, grants and
    /// reservations) or whether the node can be used.
    generation: u64,
    /// Filter's results for the last few pod shapes, at this generation.
    results: NodeResults,
}

impl NodeState {
    /// Records a change of what the per-node work reads: a new generation, and the
    /// results of the old one dropped.
    fn touch(&mut self) {
        self.generation = next_generation();
        self.results.clear();
    }
}

#[derive(Debug)]
struct NodeSlot {
    state: Mutex<NodeState>,
    /// Held across a whole bind only with [`ExtenderConfig::serialize_node_binds`].
    bind_lock: tokio::sync::Mutex<()>,
}

impl NodeSlot {
    /// A slot for a node first seen with `capacity`; the sync fills its ledger.
    fn new(capacity: Node) -> Self {
        Self {
            state: Mutex::new(NodeState {
                capacity,
                ledger: Err(Unusable::NotSynced),
                inflight: HashMap::new(),
                generation: next_generation(),
                results: NodeResults::default(),
            }),
            bind_lock: tokio::sync::Mutex::new(()),
        }
    }
}

/// A live pod whose assignment annotation the list shows: its UID (or key, without one),
/// the grants the annotation records, and its creation time (Unix seconds, 0 unknown).
#[derive(Clone, Debug, PartialEq)]
struct ListedPod {
    uid: String,
    grants: Vec<Grant>,
    created: i64,
}

/// What a [`Extender::sync`] found wrong (each names its object).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Nodes with a GPU inventory.
    pub nodes: usize,
    /// Pods whose assignment was applied.
    pub assigned_pods: usize,
    pub errors: Vec<String>,
}

/// The scheduler extender: node cache, ledger, and the verbs.
#[derive(Debug)]
pub struct Extender {
    config: ExtenderConfig,
    nodes: RwLock<HashMap<String, Arc<NodeSlot>>>,
    /// Pods seen by filter, by UID: bind gets only the pod's name.
    pending: Mutex<HashMap<String, Pod>>,
    /// Filter results by pod UID, for prioritize.
    memos: Mutex<HashMap<String, Arc<Memo>>>,
    /// Pods whose last filter passed no node, by UID, and why (the pending gauge).
    waiting: Mutex<HashMap<String, PendingReason>>,
    metrics: Metrics,
    /// The GPU requests of the pods seen holding GPUs, at their creation time.
    model: Mutex<WorkloadModel>,
    /// Whether the model gained or lost a request since [`Extender::refresh_workloads`]
    /// last read it.
    model_changed: AtomicBool,
    /// What fgd and fragaware score against, from the model at the last sync.
    workloads: RwLock<Models>,
    /// The pod shapes whose results the nodes keep.
    shapes: Mutex<ShapeTable>,
    /// Whether filter and prioritize reuse the nodes' kept results.
    filter_cache: AtomicBool,
}

/// The workloads fgd and fragaware score against, and their epoch: a number that changes
/// whenever they do (part of the kept results' key for those policies).
#[derive(Clone, Debug, Default)]
struct Models {
    workloads: Arc<PolicyWorkloads>,
    epoch: u64,
}

impl Models {
    /// The part of a kept result's key that stands for the model under `policy`: the
    /// epoch for the policies that read it, 0 for the others.
    fn key(&self, policy: Policy) -> u64 {
        if policy.needs_workload() {
            self.epoch
        } else {
            0
        }
    }
}

/// Most pods remembered between filter and bind.
const PENDING_LIMIT: usize = 10_000;

/// Most shapes a sync that moved the workload model evaluates again ([`Extender::warm`]).
const WARM_SHAPES: usize = 4;

/// Candidate lists at least this long are evaluated on several threads.
const PARALLEL_MIN: usize = 512;
/// Most threads one evaluation uses.
const MAX_THREADS: usize = 8;

/// A pod on one node.
enum Outcome {
    /// It fits, with this score; `generation` is the node state's.
    Fits { score: f64, generation: u64 },
    /// It does not fit now (preemption may help).
    NoFit(String),
    /// The node cannot take GPU pods (no or bad inventory).
    Unusable(String),
}

/// Where a node's outcome came from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The node's kept result for the pod's shape.
    Kept,
    /// The engine.
    Evaluated,
    /// Neither: the node is unusable, or a filter hint answered.
    Other,
}

/// A filter's scores for one pod, reused by prioritize for unchanged nodes (with the
/// filter cache off).
#[derive(Debug)]
struct Memo {
    req: PodRequest,
    /// [`Models::key`] at the filter: scores of another model are not reused.
    model: u64,
    /// The nodes that passed, in the filter's order.
    names: Vec<String>,
    /// Per node of `names`: (generation, score).
    scores: Vec<(u64, f64)>,
}

/// A placement of every container of a pod on one node.
struct PodPlacement {
    /// Per container: the GPU indices on the node.
    gpus: Vec<Vec<usize>>,
    /// Mean of the containers' scores.
    score: f64,
}

impl Extender {
    pub fn new(config: ExtenderConfig) -> Self {
        Self {
            nodes: RwLock::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            memos: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            metrics: Metrics::new(),
            model: Mutex::new(WorkloadModel::new(config.workload_half_life)),
            model_changed: AtomicBool::new(true),
            workloads: RwLock::new(Models::default()),
            shapes: Mutex::new(ShapeTable::default()),
            filter_cache: AtomicBool::new(config.filter_cache),
            config,
        }
    }

    pub fn config(&self) -> &ExtenderConfig {
        &self.config
    }

    /// Switches the reuse of filter's per-node results on or off
    /// ([`ExtenderConfig::filter_cache`]); results kept stay valid across the switch.
    pub fn set_filter_cache(&self, on: bool) {
        self.filter_cache.store(on, Ordering::Relaxed);
    }

    /// Whether filter's per-node results are reused.
    pub fn filter_cache(&self) -> bool {
        self.filter_cache.load(Ordering::Relaxed)
    }

    /// How many per-node outcomes were reused and worked out since the start, by every
    /// caller together (the counters behind `fgpu_extender_filter_cache_nodes_total`).
    pub fn cache_stats(&self) -> CacheStats {
        self.metrics.cache_stats()
    }

    /// The extender's metrics (the HTTP layer records the verbs' outcomes in them).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The metrics' text exposition, with the pending gauge set from the pods that wait now.
    pub fn encode_metrics(&self) -> String {
        let mut counts = [0usize; PendingReason::ALL.len()];
        for r in self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            if let Some(i) = PendingReason::ALL.iter().position(|x| x == r) {
                counts[i] += 1;
            }
        }
        self.metrics.set_pending(counts);
        self.metrics.encode()
    }

    /// Records why the pod `uid` waits after a filter (`None`: it does not, a node passed).
    fn set_waiting(&self, uid: &str, reason: Option<PendingReason>) {
        if uid.is_empty() {
            return;
        }
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        match reason {
            Some(r) => {
                if waiting.len() >= PENDING_LIMIT && !waiting.contains_key(uid) {
                    waiting.clear();
                }
                waiting.insert(uid.to_owned(), r);
            }
            None => {
                waiting.remove(uid);
            }
        }
    }

    /// Replaces the node cache and the ledger from a list of nodes and a list of pods:
    /// capacity from each node's inventory annotation, grants from each live pod's
    /// assignment annotation, plus the reservations of binds (made at most
    /// `reservation_grace` before `now`) whose pod does not show its assignment yet.
    pub fn sync(
        &self,
        nodes: &[fgpu_api::extender::Node],
        pods: &[Pod],
        now: Instant,
    ) -> SyncReport {
        let mut report = SyncReport::default();
        self.forget_waiting(pods);
        let inv_ann = self.config.driver.node_inventory_annotation();
        let pod_ann = self.config.driver.pod_assignment_annotation();
        let mut by_node = listed_grants(pods, &pod_ann, &mut report.errors);
        report.assigned_pods = by_node.values().map(Vec::len).sum();
        let old = self
            .nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut fresh: HashMap<String, Arc<NodeSlot>> = HashMap::new();
        for n in nodes {
            let name = &n.metadata.name;
            let Some((capacity, problem)) = announced_capacity(n, &inv_ann) else {
                continue;
            };
            if let Some(p) = &problem {
                report.errors.push(p.to_string());
            }
            report.nodes += 1;
            let slot = old
                .get(name)
                .cloned()
                .unwrap_or_else(|| Arc::new(NodeSlot::new(capacity.clone())));
            let listed = by_node.remove(name).unwrap_or_default();
            self.refill(&slot, capacity, problem, listed, now, &mut report.errors);
            fresh.insert(name.clone(), slot);
        }
        report.errors.extend(unannounced(&by_node, &inv_ann));
        *self.nodes.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        self.metrics.set_nodes(report.nodes);
        if self.refresh_workloads() {
            self.warm();
        }
        report
    }

    /// After the workload model moved: evaluates the [`WARM_SHAPES`] most recently used
    /// shapes of pods whose policy reads the model on every node, so that the next pods of
    /// those shapes find their results kept instead of paying for the whole cluster in
    /// their own filter. Nothing with the filter cache off.
    fn warm(&self) {
        if !self.filter_cache() {
            return;
        }
        let (shapes, now) = {
            let mut table = self.shapes.lock().unwrap_or_else(PoisonError::into_inner);
            (
                table.recent(WARM_SHAPES, |s| s.policy.needs_workload()),
                table.stamp(),
            )
        };
        if shapes.is_empty() {
            return;
        }
        let models = self.models();
        let names: Vec<String> = self
            .nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        for (shape, id) in shapes {
            let req = PodRequest {
                key: String::new(),
                uid: String::new(),
                containers: shape.containers,
                policy: shape.policy,
                vgpu_mode: shape.vgpu_mode,
            };
            let key = (id, models.key(req.policy), now);
            let _ = self.evaluate(CacheVerb::sync, &req, &names, &models, Some(key), &[]);
        }
    }

    /// Refills one node's slot at a sync: records its listed pods in the workload model,
    /// settles the reservations against them and rebuilds the ledger (a ledger that does
    /// not fit the node is reported into `errors`).
    fn refill(
        &self,
        slot: &NodeSlot,
        capacity: Node,
        problem: Option<Unusable>,
        listed: Vec<ListedPod>,
        now: Instant,
        errors: &mut Vec<String>,
    ) {
        self.observe(&listed, &capacity);
        let mut st = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
        let grants = settle(&mut st.inflight, listed, now, self.config.reservation_grace);
        let ledger = rebuild_ledger(&capacity, problem, grants);
        // Most syncs change nothing on most nodes: their kept results stay.
        if !same_view(&st.ledger, &ledger) {
            st.touch();
        }
        st.ledger = ledger;
        if let Err(e @ Unusable::Overbooked { .. }) = &st.ledger {
            errors.push(e.to_string());
        }
        st.capacity = capacity;
    }

    /// Records the GPU requests of `listed` pods on a node of `capacity` in the workload
    /// model. A pod is recorded once (its first record is kept): the kind of one already
    /// recorded is not worked out again at every sync.
    fn observe(&self, listed: &[ListedPod], capacity: &Node) {
        let mut model = self.model.lock().unwrap_or_else(PoisonError::into_inner);
        for pod in listed {
            for g in &pod.grants {
                if !model.contains(&g.id)
                    && let Some(kind) = g.kind_on(capacity)
                {
                    model.observe(&g.id, kind, pod.created);
                    self.model_changed.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    /// Recomputes what fgd and fragaware score against from the model (pruned), and logs
    /// when the default policy starts or stops falling back for want of a model.
    ///
    /// Only when the model gained or lost a request: ageing alone scales every weight by
    /// the same factor, which leaves the workload (weights relative to their sum) as it
    /// was. The epoch moves only when the workloads differ, so kept results of fgd and
    /// fragaware pods live until a sync sees a new pod (or forgets an old one).
    /// Returns whether the epoch moved.
    fn refresh_workloads(&self) -> bool {
        let now = unix_now();
        let fresh = {
            let mut model = self.model.lock().unwrap_or_else(PoisonError::into_inner);
            let before = model.len();
            model.prune(now);
            if model.len() != before {
                self.model_changed.store(true, Ordering::Relaxed);
            }
            if !self.model_changed.swap(false, Ordering::Relaxed) {
                return false;
            }
            PolicyWorkloads::of(Some(&model), now)
        };
        let default = self.config.default_policy;
        let mut slot = self
            .workloads
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let old = &slot.workloads;
        let before = old.resolve(default).fell_back_from.is_some();
        let after = fresh.resolve(default);
        if before != after.fell_back_from.is_some() {
            match after.note() {
                Some(note) => tracing::info!("{note}"),
                None => tracing::info!(policy = %default, "workload model ready"),
            }
        }
        let same = [Policy::FGD, Policy::FRAGAWARE]
            .into_iter()
            .all(|p| old.resolve(p).workload == fresh.resolve(p).workload);
        if !same {
            *slot = Models {
                workloads: Arc::new(fresh),
                epoch: slot.epoch + 1,
            };
        }
        !same
    }

    /// What fgd and fragaware score against now, with its epoch.
    fn models(&self) -> Models {
        self.workloads
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn slot(&self, node: &str) -> Option<Arc<NodeSlot>> {
        self.nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(node)
            .cloned()
    }

    /// `Err` (naming the pod and both names) unless `pod` is addressed to the scheduler
    /// this extender serves.
    fn addressed_to_us(&self, pod: &Pod) -> Result<(), PodError> {
        let name = pod
            .spec
            .extra
            .get("schedulerName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if name == self.config.scheduler_name {
            return Ok(());
        }
        Err(PodError::OtherScheduler {
            pod: pod_key(pod),
            name: name.to_owned(),
            ours: self.config.scheduler_name.clone(),
        })
    }

    /// Keeps in the pending gauge only the pods that `pods` (a full list) shows alive and
    /// not bound to a node.
    fn forget_waiting(&self, pods: &[Pod]) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.is_empty() {
            return;
        }
        let unbound: HashSet<&str> = pods
            .iter()
            .filter(|p| {
                let phase = p.extra["status"]["phase"].as_str();
                let node = p.spec.extra.get("nodeName").and_then(Value::as_str);
                !matches!(phase, Some("Succeeded" | "Failed")) && node.is_none_or(str::is_empty)
            })
            .map(|p| p.metadata.uid.as_str())
            .collect();
        waiting.retain(|uid, _| unbound.contains(uid.as_str()));
    }

    fn read_pod(&self, pod: &Pod) -> Result<PodRequest, PodError> {
        Ok(pod_request(
            pod,
            &self.config.names,
            self.config.default_policy,
        )?)
    }

    fn remember(&self, pod: &Pod) {
        if pod.metadata.uid.is_empty() {
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if pending.len() >= PENDING_LIMIT {
            pending.clear();
        }
        pending.insert(pod.metadata.uid.clone(), pod.clone());
    }

    /// The kept-results key of `req` under `models` (shape id, model key, use stamp), or
    /// `None` with the filter cache off or for a pod without GPU containers.
    fn cache_key(&self, req: &PodRequest, models: &Models) -> Option<(u64, u64, u64)> {
        if !self.filter_cache() || req.containers.is_empty() {
            return None;
        }
        let (shape, now) = self
            .shapes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .id_of(req);
        Some((shape, models.key(req.policy), now))
    }

    /// Evaluates `req` on every candidate node, in candidate order, against `models`.
    /// Large candidate lists are split over a few threads. `cache` (from
    /// [`Extender::cache_key`]) reuses and keeps the nodes' results for the pod's shape;
    /// `hints` (a filter's results for the same pod) answer for nodes that have not
    /// changed since. The nodes reused and evaluated are counted under `verb` (nodes that
    /// are unusable or answered by a hint under neither).
    fn evaluate<'a>(
        &self,
        verb: CacheVerb,
        req: &PodRequest,
        names: &[&'a str],
        models: &Models,
        cache: Option<(u64, u64, u64)>,
        hints: &[Option<(u64, f64)>],
    ) -> Vec<(&'a str, Outcome)> {
        let workloads: &PolicyWorkloads = &models.workloads;
        let requests = engine_requests(req);
        let requests: &[Request] = &requests;
        let map = self.nodes.read().unwrap_or_else(PoisonError::into_inner);
        let map: &HashMap<String, Arc<NodeSlot>> = &map;
        let inv_ann = self.config.driver.node_inventory_annotation();
        // One node: its outcome, and where it came from.
        let one = |(name, hint): (&'a str, Option<(u64, f64)>)| -> (&'a str, Outcome, Source) {
            let Some(slot) = map.get(name) else {
                return (
                    name,
                    Outcome::Unusable(format!(
                        "node {name} has no GPU inventory (annotation {inv_ann}); is the fgpu node plugin running there in extender mode?"
                    )),
                    Source::Other,
                );
            };
            let mut guard = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
            let st = &mut *guard;
            let generation = st.generation;
            let l = match &st.ledger {
                Err(e) => return (name, Outcome::Unusable(e.to_string()), Source::Other),
                Ok(l) => l,
            };
            let key = cache.map(|(shape, model, now)| {
                (
                    ResultKey {
                        shape,
                        model,
                        generation,
                    },
                    now,
                )
            });
            if let Some((k, now)) = key
                && let Some(kept) = st.results.get(k, now)
            {
                let out = match kept {
                    Cached::Fits(score) => Outcome::Fits {
                        score: *score,
                        generation,
                    },
                    Cached::NoFit(why) => Outcome::NoFit(why.clone()),
                };
                return (name, out, Source::Kept);
            }
            if let Some((g, score)) = hint
                && g == generation
            {
                return (name, Outcome::Fits { score, generation }, Source::Other);
            }
            let placed = place(&l.inventory().nodes[0], req, requests, workloads);
            let out = match placed {
                Ok(p) => Outcome::Fits {
                    score: p.score,
                    generation,
                },
                Err(e) => Outcome::NoFit(e.0),
            };
            if let Some((k, now)) = key {
                let kept = match &out {
                    Outcome::Fits { score, .. } => Cached::Fits(*score),
                    Outcome::NoFit(why) => Cached::NoFit(why.clone()),
                    Outcome::Unusable(_) => unreachable!("the ledger is usable here"),
                };
                st.results.put(k, kept, now);
            }
            (name, out, Source::Evaluated)
        };
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS);
        let hint = |i: usize| hints.get(i).copied().flatten();
        let all: Vec<(&'a str, Outcome, Source)> = if threads < 2 || names.len() < PARALLEL_MIN {
            names
                .iter()
                .enumerate()
                .map(|(i, &n)| one((n, hint(i))))
                .collect()
        } else {
            let chunk = names.len().div_ceil(threads);
            std::thread::scope(|s| {
                let parts: Vec<_> = names
                    .chunks(chunk)
                    .enumerate()
                    .map(|(c, part)| {
                        s.spawn(move || {
                            part.iter()
                                .enumerate()
                                .map(|(i, &n)| one((n, hint(c * chunk + i))))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                parts
                    .into_iter()
                    .flat_map(|h| h.join().expect("evaluation thread"))
                    .collect()
            })
        };
        let count = |src: Source| all.iter().filter(|e| e.2 == src).count() as u64;
        self.metrics
            .count_cache(verb, count(Source::Kept), count(Source::Evaluated));
        all.into_iter().map(|(n, o, _)| (n, o)).collect()
    }

    /// The filter verb.
    pub fn filter(&self, args: &ExtenderArgs) -> ExtenderFilterResult {
        let names = args.candidate_names();
        let mut result = ExtenderFilterResult::default();
        if let Err(e) = self.addressed_to_us(&args.pod) {
            tracing::warn!("filter refused: {e}");
            result.error = e.to_string();
            return result;
        }
        let req = match self.read_pod(&args.pod) {
            Ok(r) => r,
            Err(e) => {
                self.set_waiting(&args.pod.metadata.uid, Some(PendingReason::invalid));
                result.error = e.to_string();
                return result;
            }
        };
        let asks_gpus = !req.containers.is_empty();
        let passed: Vec<String> = if !asks_gpus {
            names.iter().map(|s| (*s).to_owned()).collect()
        } else {
            self.remember(&args.pod);
            let models = self.models();
            let cache = self.cache_key(&req, &models);
            let mut passed = Vec::new();
            let mut scores = Vec::with_capacity(names.len());
            for (name, r) in self.evaluate(CacheVerb::filter, &req, &names, &models, cache, &[]) {
                match r {
                    Outcome::Fits { score, generation } => {
                        scores.push((generation, score));
                        passed.push(name.to_owned());
                    }
                    Outcome::NoFit(why) => {
                        result.failed_nodes.insert(name.to_owned(), why);
                    }
                    Outcome::Unusable(why) => {
                        result
                            .failed_and_unresolvable_nodes
                            .insert(name.to_owned(), why);
                    }
                }
            }
            // With the cache on, prioritize finds the nodes' kept results instead.
            if cache.is_none() {
                self.memorise(Memo {
                    model: models.key(req.policy),
                    req,
                    names: passed.clone(),
                    scores,
                });
            }
            passed
        };
        let waits = if !asks_gpus || !passed.is_empty() {
            None
        } else if result.failed_nodes.is_empty() {
            Some(PendingReason::no_gpu_node)
        } else {
            Some(PendingReason::no_fit)
        };
        self.set_waiting(&args.pod.metadata.uid, waits);
        if let Some(nodes) = &args.nodes {
            let keep: HashSet<&str> = passed.iter().map(String::as_str).collect();
            result.nodes = Some(NodeList {
                items: nodes
                    .items
                    .iter()
                    .filter(|n| keep.contains(n.metadata.name.as_str()))
                    .cloned()
                    .collect(),
                extra: nodes.extra.clone(),
            });
        } else {
            result.node_names = Some(passed);
        }
        result
    }

    /// The prioritize verb: the pod's policy score on each node, scaled to 0..=10 over
    /// the candidates (the best feasible node gets 10); nodes where the pod does not fit
    /// get 0.
    pub fn prioritize(&self, args: &ExtenderArgs) -> Result<HostPriorityList, PodError> {
        let names = args.candidate_names();
        self.addressed_to_us(&args.pod)?;
        let req = self.read_pod(&args.pod)?;
        if req.containers.is_empty() {
            return Ok(names
                .iter()
                .map(|n| HostPriority {
                    host: (*n).to_owned(),
                    score: 0,
                })
                .collect());
        }
        let models = self.models();
        let cache = self.cache_key(&req, &models);
        // Without the cache, hints from the filter's results: prioritize gets (a subset
        // of) the nodes that passed, in the same order, so one merge walk finds them.
        let mut hints = Vec::new();
        if cache.is_none()
            && let Some(memo) = self.memo_for(&req, models.key(req.policy))
        {
            let (mut j, mut misses) = (0, 0);
            hints = names
                .iter()
                .map(|&n| {
                    // Names out of order or unknown: give up hinting (bounded cost).
                    if misses > 16 {
                        return None;
                    }
                    let start = j;
                    while j < memo.names.len() && memo.names[j] != n {
                        j += 1;
                    }
                    if j < memo.names.len() {
                        j += 1;
                        Some(memo.scores[j - 1])
                    } else {
                        j = start;
                        misses += 1;
                        None
                    }
                })
                .collect();
        }
        let evaluated = self.evaluate(CacheVerb::prioritize, &req, &names, &models, cache, &hints);
        let scores: Vec<f64> = evaluated
            .iter()
            .filter_map(|(_, r)| match r {
                Outcome::Fits { score, .. } => Some(*score),
                _ => None,
            })
            .collect();
        let lo = scores.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let flat = hi - lo <= engine::SCORE_EPS * hi.abs().max(1.0);
        Ok(evaluated
            .into_iter()
            .map(|(name, r)| HostPriority {
                host: name.to_owned(),
                score: match r {
                    Outcome::Fits { .. } if flat => MAX_EXTENDER_PRIORITY,
                    Outcome::Fits { score, .. } => {
                        ((score - lo) / (hi - lo) * MAX_EXTENDER_PRIORITY as f64).round() as i64
                    }
                    _ => 0,
                },
            })
            .collect())
    }

    fn memorise(&self, memo: Memo) {
        if memo.req.uid.is_empty() {
            return;
        }
        let mut memos = self.memos.lock().unwrap_or_else(PoisonError::into_inner);
        if memos.len() >= PENDING_LIMIT {
            memos.clear();
        }
        memos.insert(memo.req.uid.clone(), Arc::new(memo));
    }

    /// The filter's results for `req`, if they were worked out against the model `model`
    /// ([`Models::key`]).
    fn memo_for(&self, req: &PodRequest, model: u64) -> Option<Arc<Memo>> {
        let memos = self.memos.lock().unwrap_or_else(PoisonError::into_inner);
        memos
            .get(&req.uid)
            .filter(|m| m.req == *req && m.model == model)
            .cloned()
    }

    /// Reserves GPUs for `req` on `node`: placement and grant under the node's mutex.
    /// Returns the assignment and the grant ids to give back on failure.
    pub fn reserve(&self, node: &str, req: &PodRequest) -> Result<PodAssignment, PodError> {
        let slot = self.slot(node).ok_or_else(|| PodError::NoInventory {
            pod: req.key.clone(),
            node: node.to_owned(),
        })?;
        self.reserve_in(&slot, node, req)
    }

    fn reserve_in(
        &self,
        slot: &NodeSlot,
        node: &str,
        req: &PodRequest,
    ) -> Result<PodAssignment, PodError> {
        let mut guard = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
        let st = &mut *guard;
        st.touch();
        let ledger = st.ledger.as_mut().map_err(|e| PodError::Unusable {
            pod: req.key.clone(),
            reason: e.clone(),
        })?;
        // A pod placed again (an earlier bind of it failed half-way): its old grants go.
        if let Some(old) = st.inflight.remove(&req.uid) {
            for g in old.grants {
                let _ = ledger.release(&g.id);
            }
        }
        for c in &req.containers {
            let _ = ledger.release(&grant_id(&req.uid, &c.name));
        }
        let inv = ledger.inventory();
        let n = &inv.nodes[0];
        let models = self.models();
        let placed = place(n, req, &engine_requests(req), &models.workloads).map_err(|reason| {
            PodError::NoFit {
                pod: req.key.clone(),
                reason,
            }
        })?;
        let mut grants = Vec::with_capacity(req.containers.len());
        let mut containers = Vec::with_capacity(req.containers.len());
        for (c, gpus) in req.containers.iter().zip(&placed.gpus) {
            let devices: Vec<(DeviceGrant, AssignedDevice)> = gpus
                .iter()
                .map(|&i| {
                    let g = &n.gpus[i];
                    let (memory, cores) = granted(&c.request, g);
                    (
                        DeviceGrant {
                            gpu: g.id.clone(),
                            memory,
                            cores,
                        },
                        AssignedDevice {
                            id: g.id.clone(),
                            uuid: g.uuid.clone(),
                            memory_bytes: memory,
                            cores,
                        },
                    )
                })
                .collect();
            grants.push(Grant {
                id: grant_id(&req.uid, &c.name),
                node: node.to_owned(),
                cpu_milli: 0,
                memory_mib: 0,
                devices: devices.iter().map(|d| d.0.clone()).collect(),
            });
            containers.push(ContainerAssignment {
                index: c.index,
                name: c.name.clone(),
                devices: devices.into_iter().map(|d| d.1).collect(),
            });
        }
        // The ledger is the final word: it refuses anything over capacity.
        for (i, g) in grants.iter().enumerate() {
            if let Err(e) = ledger.grant(g.clone()) {
                for done in &grants[..i] {
                    let _ = ledger.release(&done.id);
                }
                return Err(PodError::Grant {
                    pod: req.key.clone(),
                    source: Box::new(e),
                });
            }
        }
        st.inflight.insert(
            req.uid.clone(),
            Reservation {
                grants,
                since: Instant::now(),
            },
        );
        Ok(PodAssignment {
            node: node.to_owned(),
            containers,
        })
    }

    /// Gives back at once the grants of a pod that is gone (deleted, or finished), given
    /// its UID and its decision annotation's value, without waiting for the next list: the
    /// watch calls it as soon as it sees the pod go, so that kube-scheduler's immediate retry
    /// of a pending pod finds the capacity free. Returns how many grants were released. The
    /// next [`Extender::sync`] agrees (it skips gone and finished pods).
    pub fn release_gone_pod(&self, uid: &str, decision: &str) -> usize {
        let ann = self.config.driver.pod_assignment_annotation();
        let Ok(a) = PodAssignment::parse(uid, &ann, decision) else {
            return 0;
        };
        let Some(slot) = self.slot(&a.node) else {
            return 0;
        };
        let mut guard = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
        let st = &mut *guard;
        let mut released = 0;
        if let Some(r) = st.inflight.remove(uid)
            && let Ok(l) = st.ledger.as_mut()
        {
            for g in r.grants {
                released += usize::from(l.release(&g.id).is_ok());
            }
        }
        if let Ok(l) = st.ledger.as_mut() {
            for c in &a.containers {
                released += usize::from(l.release(&grant_id(uid, &c.name)).is_ok());
            }
        }
        if released > 0 {
            st.touch();
        }
        released
    }

    /// Gives back the reservation of pod `uid` on `node`.
    pub fn unreserve(&self, node: &str, uid: &str) {
        let Some(slot) = self.slot(node) else { return };
        let mut guard = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
        let st = &mut *guard;
        st.touch();
        if let Some(r) = st.inflight.remove(uid)
            && let Ok(l) = st.ledger.as_mut()
        {
            for g in r.grants {
                let _ = l.release(&g.id);
            }
        }
    }

    /// The bind verb: reserve, record the decision on the pod, create the Binding; a
    /// failed write gives the reservation back.
    pub async fn bind<W: ClusterWriter>(
        &self,
        args: &ExtenderBindingArgs,
        writer: &W,
    ) -> ExtenderBindingResult {
        match self.bind_inner(args, writer).await {
            Ok(()) => {
                self.set_waiting(&args.pod_uid, None);
                ExtenderBindingResult::default()
            }
            Err(error) => {
                tracing::warn!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), node = %args.node, %error, "bind failed");
                ExtenderBindingResult {
                    error: error.to_string(),
                }
            }
        }
    }

    async fn bind_inner<W: ClusterWriter>(
        &self,
        args: &ExtenderBindingArgs,
        writer: &W,
    ) -> Result<(), PodError> {
        let key = format!("{}/{}", args.pod_namespace, args.pod_name);
        if args.pod_uid.is_empty() {
            return Err(PodError::NoPodUid { pod: key });
        }
        let cached = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&args.pod_uid);
        let pod = match cached {
            Some(p) => p,
            None => writer
                .get_pod(&args.pod_namespace, &args.pod_name)
                .await
                .map_err(|source| PodError::ReadPod {
                    pod: key.clone(),
                    source,
                })?,
        };
        if pod.metadata.uid != args.pod_uid {
            return Err(PodError::Replaced {
                pod: key,
                found: pod.metadata.uid.clone(),
                asked: args.pod_uid.clone(),
            });
        }
        if let Some(node) = pod.spec.extra.get("nodeName").and_then(|n| n.as_str())
            && !node.is_empty()
        {
            return Err(PodError::AlreadyBound {
                pod: key,
                node: node.to_owned(),
            });
        }
        self.addressed_to_us(&pod)?;
        let mut req = self.read_pod(&pod)?;
        if req.uid.is_empty() {
            req.uid = args.pod_uid.clone();
        }
        let binding = binding_object(args);
        let binding_failed = |source| PodError::Binding {
            pod: key.clone(),
            node: args.node.clone(),
            source,
        };
        if req.containers.is_empty() {
            return writer.bind(&binding).await.map_err(binding_failed);
        }
        let slot = self.slot(&args.node).ok_or_else(|| PodError::NoInventory {
            pod: key.clone(),
            node: args.node.clone(),
        })?;
        let _serial = if self.config.serialize_node_binds {
            Some(slot.bind_lock.lock().await)
        } else {
            None
        };
        let assignment = self.reserve_in(&slot, &args.node, &req)?;
        let ann = self.config.driver.pod_assignment_annotation();
        let patch = annotation_patch(&args.pod_uid, &ann, Some(&assignment.render()));
        if let Err(e) = writer
            .annotate_pod(&args.pod_namespace, &args.pod_name, &patch)
            .await
        {
            self.unreserve(&args.node, &req.uid);
            return Err(PodError::Annotate {
                pod: key.clone(),
                source: e,
            });
        }
        if let Err(e) = writer.bind(&binding).await {
            self.unreserve(&args.node, &req.uid);
            let undo = annotation_patch(&args.pod_uid, &ann, None);
            let _ = writer
                .annotate_pod(&args.pod_namespace, &args.pod_name, &undo)
                .await;
            return Err(binding_failed(e));
        }
        Ok(())
    }

    /// The GPUs of every node in the cache (models, UUIDs, largest memory), for the
    /// admission webhook's checks.
    pub fn gpu_inventory(&self) -> crate::inventory::GpuInventory {
        let slots: Vec<Arc<NodeSlot>> = self
            .nodes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        let mut inv = crate::inventory::GpuInventory::default();
        for slot in slots {
            let st = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
            if st.capacity.gpus.is_empty() {
                continue;
            }
            inv.nodes += 1;
            for g in &st.capacity.gpus {
                inv.add_gpu(&g.model, &g.uuid, g.memory_total);
            }
        }
        inv
    }

    /// Free memory and cores per GPU of `node` (for tests and debugging).
    pub fn node_usage(&self, node: &str) -> Option<Vec<(String, u64, u32)>> {
        let slot = self.slot(node)?;
        let st = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
        let l = st.ledger.as_ref().ok()?;
        Some(
            l.inventory().nodes[0]
                .gpus
                .iter()
                .map(|g| (g.id.clone(), g.memory_free, g.cores_free))
                .collect(),
        )
    }

    /// Live grants on `node`.
    pub fn node_grants(&self, node: &str) -> Vec<Grant> {
        let Some(slot) = self.slot(node) else {
            return Vec::new();
        };
        let st = slot.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.ledger
            .as_ref()
            .map(|l| l.grants().cloned().collect())
            .unwrap_or_default()
    }
}

/// The grants recorded on `pods` by node: every pod not finished whose assignment
/// annotation `pod_ann` the extender wrote. A pod whose annotation someone else wrote, or
/// that does not parse, is left out and reported into `errors` (naming the pod).
fn listed_grants(
    pods: &[Pod],
    pod_ann: &str,
    errors: &mut Vec<String>,
) -> HashMap<String, Vec<ListedPod>> {
    let mut by_node: HashMap<String, Vec<ListedPod>> = HashMap::new();
    for pod in pods {
        let phase = pod.extra["status"]["phase"].as_str();
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let Some(value) = pod.metadata.annotations.get(pod_ann) else {
            continue;
        };
        let key = pod_key(pod);
        if !written_by(pod, pod_ann, crate::writer::FIELD_MANAGER) {
            errors.push(format!(
                "pod {key}: annotation {pod_ann} was not written by the extender (field manager {:?} in metadata.managedFields); its GPU grant is ignored",
                crate::writer::FIELD_MANAGER
            ));
            continue;
        }
        match PodAssignment::parse(&key, pod_ann, value) {
            Ok(a) => {
                let uid = if pod.metadata.uid.is_empty() {
                    key
                } else {
                    pod.metadata.uid.clone()
                };
                let grants = crate::annotations::grants(&a, &uid);
                let created = pod
                    .metadata
                    .extra
                    .get("creationTimestamp")
                    .map_or(0, fgpu_plumbing::unix_seconds);
                by_node.entry(a.node).or_default().push(ListedPod {
                    uid,
                    grants,
                    created,
                });
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    by_node
}

/// The capacity node `n` announces in its inventory annotation `inv_ann`, every GPU
/// free. `None` without the annotation (not a GPU node); one that does not parse gives a
/// node without GPUs and why the node cannot be used.
fn announced_capacity(
    n: &fgpu_api::extender::Node,
    inv_ann: &str,
) -> Option<(Node, Option<Unusable>)> {
    let name = &n.metadata.name;
    let value = n.metadata.annotations.get(inv_ann)?;
    Some(match parse_node_inventory(name, inv_ann, value) {
        Ok(c) => (c, None),
        Err(e) => (
            Node::new(name.clone(), Vec::new()),
            Some(Unusable::Inventory(e)),
        ),
    })
}

/// The grants a node's ledger is rebuilt from: its `listed` pods' and the reservations of
/// binds the list does not show yet. A reservation the list shows exactly is covered by the
/// list from now on (dropped); one it shows otherwise (a list older than the reservation)
/// is kept, and wins; one made `grace` or longer before `now` expires.
fn settle(
    inflight: &mut HashMap<String, Reservation>,
    listed: Vec<ListedPod>,
    now: Instant,
    grace: Duration,
) -> Vec<Grant> {
    let mut grants: Vec<Grant> = Vec::new();
    for pod in listed {
        match inflight.get(&pod.uid) {
            Some(r) if r.grants == pod.grants => {
                inflight.remove(&pod.uid);
                grants.extend(pod.grants);
            }
            Some(_) => {}
            None => grants.extend(pod.grants),
        }
    }
    inflight.retain(|_, r| now.saturating_duration_since(r.since) < grace);
    grants.extend(inflight.values().flat_map(|r| r.grants.iter().cloned()));
    grants
}

/// The ledger of a node of `capacity` holding `grants`, or why the node cannot be used:
/// `problem` (its inventory), or grants that do not fit.
fn rebuild_ledger(
    capacity: &Node,
    problem: Option<Unusable>,
    grants: Vec<Grant>,
) -> Result<Ledger, Unusable> {
    if let Some(p) = problem {
        return Err(p);
    }
    let inventory = Inventory {
        nodes: vec![capacity.clone()],
    };
    Ledger::rebuild(inventory, grants).map_err(|e| Unusable::Overbooked {
        node: capacity.name.clone(),
        source: Box::new(e),
    })
}

/// Whether the per-node work reads the same of two ledgers: the same node (GPUs, taints,
/// health, free capacity) in both. An unusable node never counts as the same (its outcome
/// is not kept anyway).
fn same_view(a: &Result<Ledger, Unusable>, b: &Result<Ledger, Unusable>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a.inventory().nodes == b.inventory().nodes,
        _ => false,
    }
}

/// One error per node that listed pods hold GPUs on but that announces no inventory
/// (`by_node`: what is left once the announcing nodes took theirs).
fn unannounced(by_node: &HashMap<String, Vec<ListedPod>>, inv_ann: &str) -> Vec<String> {
    by_node
        .iter()
        .map(|(node, pods)| {
            format!(
                "node {node}: {} pod(s) hold GPUs there, but the node has no GPU inventory annotation {inv_ann}",
                pods.len()
            )
        })
        .collect()
}

/// The merge patch that sets (or, with `None`, removes) the assignment annotation, with
/// the pod's UID as a precondition.
pub fn annotation_patch(uid: &str, annotation: &str, value: Option<&str>) -> Value {
    let mut annotations = serde_json::Map::new();
    annotations.insert(
        annotation.to_owned(),
        value.map_or(Value::Null, |v| Value::String(v.to_owned())),
    );
    let mut meta = json!({ "annotations": annotations });
    if !uid.is_empty() {
        meta["uid"] = Value::String(uid.to_owned());
    }
    json!({ "metadata": meta })
}

/// Whether `metadata.managedFields` of `pod` records `manager` as the owner of annotation
/// `annotation` (the field manager the extender patches with). The API server keeps this
/// record; a later write of the annotation by anyone else moves the ownership to them.
pub fn written_by(pod: &Pod, annotation: &str, manager: &str) -> bool {
    let field = format!("f:{annotation}");
    pod.metadata
        .extra
        .get("managedFields")
        .and_then(Value::as_array)
        .is_some_and(|entries| {
            entries.iter().any(|e| {
                e["manager"].as_str() == Some(manager)
                    && e["fieldsV1"]["f:metadata"]["f:annotations"]
                        .get(&field)
                        .is_some()
            })
        })
}

/// Now in Unix seconds.
fn unix_now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// The `v1` Binding that puts the pod on the node.
pub fn binding_object(args: &ExtenderBindingArgs) -> Value {
    let mut meta = json!({"name": args.pod_name, "namespace": args.pod_namespace});
    if !args.pod_uid.is_empty() {
        meta["uid"] = Value::String(args.pod_uid.clone());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": args.node}
    })
}

/// Places every container of `req` on `node` (in order, each seeing the ones before it),
/// under the pod's policy as `workloads` resolve it (fgd and fragaware fall back to binpack
/// without a model).
fn place(
    node: &Node,
    req: &PodRequest,
    requests: &[Request],
    workloads: &PolicyWorkloads,
) -> Result<PodPlacement, NoFit> {
    let resolved = workloads.resolve(req.policy);
    let policy = resolved.policy;
    let ctx = ScoreContext {
        workload: resolved.workload,
        max_spec: MaxSpec {
            cpu_milli: 0,
            gpus: node.gpus.len() as u32,
        },
        // The extender mirrors no claim status, so it has no measured load: the
        // usage-aware term stays off (docs/extender.md).
        usage_weight: 0.0,
    };
    // Nodes whose GPUs the model or UUID constraints rule out are answered without the
    // engine (a necessary condition only: the engine decides for the rest).
    for (c, r) in req.containers.iter().zip(requests) {
        if let Some(allowed) = allowed_gpus(node, r)
            && allowed < r.gpus as usize
        {
            return Err(NoFit(why_not_counted(node, c, r, allowed)));
        }
    }
    // `nvidia.com/vgpu-mode`: `mig` takes MIG placements only, `hami-core` shares only.
    let mode = req.vgpu_mode;
    let shares = |node: &Node, r: &Request| {
        mode.shares()
            .then(|| engine::evaluate_node(0, node, r, policy, &ctx))
            .flatten()
    };
    let mig = |node: &Node, r: &Request| mode.mig().then(|| place_mig(node, r)).flatten();
    let refused = |node: &Node, c: &ContainerRequest, r: &Request| {
        let why = why_not(node, c, r);
        NoFit(match mode {
            VgpuMode::Any => why,
            VgpuMode::Mig => format!(
                "{why} (annotation {}: mig: MIG placements only)",
                legacy::ANNOTATION_VGPU_MODE
            ),
            VgpuMode::Shares => format!(
                "{why} (annotation {}: quota shares only, no MIG placement)",
                legacy::ANNOTATION_VGPU_MODE
            ),
        })
    };
    if let ([c], [r]) = (req.containers.as_slice(), requests) {
        if let Some(Placement { gpus, score, .. }) = shares(node, r) {
            return Ok(PodPlacement {
                gpus: vec![gpus],
                score,
            });
        }
        return match mig(node, r) {
            Some(gpus) => Ok(PodPlacement {
                gpus: vec![gpus],
                score: 0.0,
            }),
            None => Err(refused(node, c, r)),
        };
    }
    let mut work = node.clone();
    let mut out = PodPlacement {
        gpus: Vec::with_capacity(req.containers.len()),
        score: 0.0,
    };
    for (c, r) in req.containers.iter().zip(requests) {
        let gpus = match shares(&work, r) {
            Some(p) => {
                out.score += p.score;
                p.gpus
            }
            None => mig(&work, r).ok_or_else(|| refused(&work, c, r))?,
        };
        for &i in &gpus {
            let g = &mut work.gpus[i];
            let (mem, cores) = granted(r, g);
            g.memory_free = g.memory_free.saturating_sub(mem);
            g.cores_free = g.cores_free.saturating_sub(cores);
        }
        out.gpus.push(gpus);
    }
    out.score /= req.containers.len() as f64;
    Ok(out)
}

/// The engine requests of `req`'s containers, as [`place`] takes them: whole-GPU requests
/// may use whole-mode GPUs, shares may not. Built once per pod, not once per node.
fn engine_requests(req: &PodRequest) -> Vec<Request> {
    req.containers
        .iter()
        .map(|c| with_mode_tolerations(&c.request))
        .collect()
}

/// `r` tolerating [`WHOLE_MODE_TAINT`] when it asks for whole GPUs.
fn with_mode_tolerations(r: &Request) -> Request {
    let mut r = r.clone();
    if r.share == GpuShare::Whole {
        r.tolerations.push(Toleration {
            key: WHOLE_MODE_TAINT.to_owned(),
            exists: true,
            value: String::new(),
            effect: String::new(),
        });
    }
    r
}

/// What `r` takes of device `g`: a MIG placement device whole (its profile's memory, no
/// core quota: the instance's compute slices are its own), else the request's share.
fn granted(r: &Request, g: &Gpu) -> (u64, u32) {
    if fgpu_driver::mig::parse_device_name(&g.id).is_some() {
        (g.memory_total, 0)
    } else {
        r.per_gpu(g)
    }
}

/// MIG placements on `node` for a request of memory (`nvidia.com/gpumem`; whole-GPU and
/// percent requests never take one): one placement per GPU asked, each the smallest
/// profile that holds the memory (and the compute slices its core percent asks, rounded
/// up) at the placement that keeps the largest profiles possible
/// ([`fgpu_driver::mig::choose_across_where`]), among the placement devices that are
/// healthy, hold no grant and pass the request's model and UUID constraints. The taken
/// placements are those whose device holds a grant. `None` when they do not all fit.
fn place_mig(node: &Node, r: &Request) -> Option<Vec<usize>> {
    let GpuShare::Memory { bytes } = r.share else {
        return None;
    };
    // Placement devices (their positions in `node.gpus`) by parent GPU UUID.
    let mut parents: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, g) in node.gpus.iter().enumerate() {
        if fgpu_driver::mig::parse_device_name(&g.id).is_none() {
            continue;
        }
        match parents.iter_mut().find(|(u, _)| *u == g.uuid) {
            Some((_, v)) => v.push(i),
            None => parents.push((g.uuid.as_str(), vec![i])),
        }
    }
    if parents.is_empty() {
        return None;
    }
    let profile_of = |g: &Gpu, table: &'static MigTable| {
        let name = fgpu_driver::mig::parse_device_name(&g.id)?;
        let p = table.profiles.iter().find(|p| p.label() == name.label)?;
        Some((p, name.start))
    };
    let mut gpus: Vec<(&'static MigTable, &[usize], MigLayout)> = Vec::new();
    for (_, devices) in &parents {
        let model = &node.gpus[devices[0]].model;
        let profiles: Vec<(&str, u64)> = devices
            .iter()
            .filter_map(|&i| {
                let name = fgpu_driver::mig::parse_device_name(&node.gpus[i].id)?;
                let memory = node.gpus[i].memory_total;
                Some((label_profile(&name.label, memory)?, memory))
            })
            .collect();
        let [table] = fgpu_driver::mig::tables_with_profiles(model, profiles.iter().copied())[..]
        else {
            continue;
        };
        let mut layout = MigLayout::new(table);
        for &i in devices {
            let g = &node.gpus[i];
            if g.memory_free < g.memory_total
                && let Some((p, start)) = profile_of(g, table)
            {
                // An overlapping grant fails here; its device still holds a grant, so it
                // is not offered, and `check` keeps what overlaps the others away.
                let _ = layout.take(p.name, start);
            }
        }
        gpus.push((table, devices.as_slice(), layout));
    }
    let mut out = Vec::new();
    for _ in 0..r.gpus {
        let layouts: Vec<&MigLayout> = gpus.iter().map(|(_, _, l)| l).collect();
        let request = |k: usize| MigRequest {
            memory_bytes: bytes,
            compute_slices: r.cores.filter(|&c| c > 0).map(|c| {
                let total = u32::from(gpus[k].0.compute_slices);
                u8::try_from(c.saturating_mul(total).div_ceil(100).min(total)).unwrap_or(u8::MAX)
            }),
        };
        let device = |k: usize, p: &MigProfile, start: u8| {
            gpus[k].1.iter().copied().find(|&i| {
                profile_of(&node.gpus[i], gpus[k].0)
                    .is_some_and(|(q, s)| q.name == p.name && s == start)
            })
        };
        let allowed = |k: usize, p: &MigProfile, start: u8| {
            device(k, p, start).is_some_and(|i| {
                let g = &node.gpus[i];
                g.healthy
                    && g.memory_free == g.memory_total
                    && !out.contains(&i)
                    && meets_constraints(g, r)
            })
        };
        let (k, c) = fgpu_driver::mig::choose_across_where(&layouts, &request, &allowed).ok()?;
        let i = device(k, c.profile, c.placement.start)?;
        out.push(i);
        let _ = gpus[k].2.take(c.profile.name, c.placement.start);
    }
    Some(out)
}

/// The profile name of label `label` (`1g10gb`) with `memory` bytes in any table: what a
/// placement device's name and memory say (the tables agree on names and sizes; which
/// table is the GPU's follows from all of its placements).
fn label_profile(label: &str, memory: u64) -> Option<&'static str> {
    fgpu_driver::mig::profiles::TABLES
        .iter()
        .flat_map(|t| t.profiles.iter())
        .find(|p| p.label() == label && p.memory_bytes() == memory)
        .map(|p| p.name)
}

/// Whether GPU `g` passes `r`'s UUID and model constraints (as the engine reads them:
/// case-insensitive substrings for models).
fn meets_constraints(g: &Gpu, r: &Request) -> bool {
    let matches = |m: &String| engine::model_matches(&g.model, m);
    (r.uuid_pin.is_empty() || r.uuid_pin.contains(&g.uuid))
        && (r.model_include.is_empty() || r.model_include.iter().any(matches))
        && !r.model_exclude.iter().any(matches)
}

/// Why container `c` does not fit on `node`, for FailedNodes.
/// How many GPUs of `node` are healthy and pass `r`'s UUID and model constraints; `None`
/// when `r` has no such constraint. The same rules as the engine's (case-insensitive
/// substring for models), without allocating.
fn allowed_gpus(node: &Node, r: &fgpu_driver::engine::Request) -> Option<usize> {
    if r.model_include.is_empty() && r.model_exclude.is_empty() && r.uuid_pin.is_empty() {
        return None;
    }
    Some(
        node.gpus
            .iter()
            .filter(|g| g.healthy && meets_constraints(g, r))
            .count(),
    )
}

fn why_not(node: &Node, c: &ContainerRequest, r: &Request) -> String {
    let fit = node.gpus.iter().filter(|g| r.gpu_fits(g)).count();
    why_not_counted(node, c, r, fit)
}

/// Why container `c` does not fit on `node`, where `fit` of its GPUs qualify. No `%` in
/// the text: kube-scheduler passes an extender's reason through a format string, so a `%`
/// comes out mangled in the pod's FailedScheduling event ("50%!c(MISSING)ores").
fn why_not_counted(node: &Node, c: &ContainerRequest, r: &Request, fit: usize) -> String {
    let each = match r.share {
        GpuShare::Whole => "a whole idle GPU".to_owned(),
        GpuShare::Fraction { milli } => format!("{} percent of the memory", milli / 10),
        GpuShare::Memory { bytes } => format!("{} MiB", bytes >> 20),
    };
    let cores = r
        .cores
        .map_or(String::new(), |c| format!(" and {c} percent of the cores"));
    let mut limits = Vec::new();
    if !r.model_include.is_empty() {
        limits.push(format!("model in {:?}", r.model_include));
    }
    if !r.model_exclude.is_empty() {
        limits.push(format!("model not in {:?}", r.model_exclude));
    }
    if !r.uuid_pin.is_empty() {
        limits.push(format!("UUID in {:?}", r.uuid_pin));
    }
    let limits = if limits.is_empty() {
        String::new()
    } else {
        format!(", {}", limits.join(", "))
    };
    if fit >= r.gpus as usize && r.topology == Topology::SameNuma {
        return format!(
            "container {}: {fit} GPUs have {each}{cores} free, but no NUMA node has {} of them (nvidia.com/numa-bind)",
            c.name, r.gpus
        );
    }
    format!(
        "container {}: needs {} GPU(s) with {each}{cores} free{limits}; {fit} of the node's {} GPUs qualify",
        c.name,
        r.gpus,
        node.gpus.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_driver::engine::{Gpu, Request};

    /// FailedNodes reasons reach the pod's event through a format string: no `%`.
    #[test]
    fn reasons_have_no_percent_sign() {
        let node = Node::new(
            "n",
            vec![Gpu::new("gpu-0", "NVIDIA H100 80GB HBM3", 1 << 30)],
        );
        let mut r = Request::new(1, GpuShare::Fraction { milli: 500 });
        r.cores = Some(50);
        r.model_include = vec!["T4".into()];
        let c = ContainerRequest {
            index: 0,
            name: "main".into(),
            request: r,
        };
        let why = why_not(&node, &c, &c.request);
        assert!(!why.contains('%'), "{why}");
        assert!(
            why.contains("50 percent of the memory and 50 percent of the cores free"),
            "{why}"
        );
    }

    fn grant(id: &str, memory: u64) -> Grant {
        Grant {
            id: id.into(),
            node: "n".into(),
            cpu_milli: 0,
            memory_mib: 0,
            devices: vec![DeviceGrant {
                gpu: "gpu-0".into(),
                memory,
                cores: 10,
            }],
        }
    }

    /// A pod in phase `phase` whose assignment annotation (on node `n1`, or `value`)
    /// field manager `manager` wrote.
    fn assigned_pod(name: &str, manager: &str, phase: &str, value: Option<&str>) -> Pod {
        let ann = DriverName::default().pod_assignment_annotation();
        let a = PodAssignment {
            node: "n1".into(),
            containers: vec![ContainerAssignment {
                index: 0,
                name: "main".into(),
                devices: vec![AssignedDevice {
                    id: "gpu-0".into(),
                    uuid: "GPU-a".into(),
                    memory_bytes: 1 << 30,
                    cores: 10,
                }],
            }],
        };
        let value = value.map_or_else(|| a.render(), str::to_owned);
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "annotations": {ann.clone(): value},
                "managedFields": [{"manager": manager,
                    "fieldsV1": {"f:metadata": {"f:annotations": {format!("f:{ann}"): {}}}}}],
            },
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn listed_grants_take_live_pods_the_extender_wrote() {
        let ann = DriverName::default().pod_assignment_annotation();
        let mut plain = assigned_pod("e", "fgpu-extender", "Running", None);
        plain.metadata.annotations.clear();
        let pods = [
            assigned_pod("a", "fgpu-extender", "Running", None),
            assigned_pod("b", "kubectl", "Running", None),
            assigned_pod("c", "fgpu-extender", "Succeeded", None),
            assigned_pod("d", "fgpu-extender", "Pending", Some("{")),
            plain,
        ];
        let mut errors = Vec::new();
        let by_node = listed_grants(&pods, &ann, &mut errors);
        assert_eq!(by_node.len(), 1);
        let listed = &by_node["n1"];
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].uid.as_str(), listed[0].created),
            ("uid-a", 1_767_225_600)
        );
        assert_eq!(listed[0].grants[0].id, "uid-a/main");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with(&format!(
                "pod ns/b: annotation {ann} was not written by the extender"
            )),
            "{errors:?}"
        );
        assert!(errors[1].contains("ns/d"), "{errors:?}");
    }

    #[test]
    fn announced_capacity_reads_the_inventory_annotation() {
        let ann = DriverName::default().node_inventory_annotation();
        let node = |value: Option<&str>| -> fgpu_api::extender::Node {
            let annotations = value.map_or(json!({}), |v| json!({ann.clone(): v}));
            serde_json::from_value(json!({"metadata": {"name": "x", "annotations": annotations}}))
                .unwrap()
        };
        assert!(announced_capacity(&node(None), &ann).is_none());
        let good = r#"[{"id":"gpu-0","uuid":"GPU-a","model":"A100","memoryBytes":1073741824}]"#;
        let (capacity, problem) = announced_capacity(&node(Some(good)), &ann).unwrap();
        assert_eq!((capacity.name.as_str(), capacity.gpus.len()), ("x", 1));
        assert_eq!(problem, None);
        let (capacity, problem) = announced_capacity(&node(Some("[")), &ann).unwrap();
        assert!(capacity.gpus.is_empty());
        let why = problem.unwrap().to_string();
        assert!(
            why.starts_with(&format!("node x: annotation {ann}: ")),
            "{why}"
        );
    }

    #[test]
    fn settle_keeps_newer_reservations_and_expires_old_ones() {
        let t0 = Instant::now();
        let now = t0 + Duration::from_secs(10);
        let reservation = |id: &str, memory, since| Reservation {
            grants: vec![grant(id, memory)],
            since,
        };
        let mut inflight: HashMap<String, Reservation> = [
            ("shown", reservation("shown/main", 1, now)),
            ("newer", reservation("newer/main", 2, now)),
            ("unlisted", reservation("unlisted/main", 3, now)),
            ("expired", reservation("expired/main", 4, t0)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let listed = |uid: &str, memory| ListedPod {
            uid: uid.into(),
            grants: vec![grant(&format!("{uid}/main"), memory)],
            created: 0,
        };
        let grants = settle(
            &mut inflight,
            vec![listed("shown", 1), listed("newer", 1), listed("plain", 5)],
            now,
            Duration::from_secs(5),
        );
        let mut got: Vec<(String, u64)> = grants
            .iter()
            .map(|g| (g.id.clone(), g.devices[0].memory))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("newer/main".to_owned(), 2),
                ("plain/main".to_owned(), 5),
                ("shown/main".to_owned(), 1),
                ("unlisted/main".to_owned(), 3),
            ]
        );
        let mut kept: Vec<&str> = inflight.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["newer", "unlisted"]);
    }

    #[test]
    fn rebuild_ledger_reports_grants_over_the_inventory() {
        let capacity = Node::new("n", vec![Gpu::new("gpu-0", "A100", 1 << 30)]);
        let l = rebuild_ledger(&capacity, None, vec![grant("a/main", 1 << 29)]).unwrap();
        assert_eq!(l.grants().count(), 1);
        assert_eq!(
            rebuild_ledger(&capacity, Some(Unusable::NotSynced), Vec::new()).unwrap_err(),
            Unusable::NotSynced
        );
        let why = rebuild_ledger(&capacity, None, vec![grant("a/main", 2 << 30)])
            .unwrap_err()
            .to_string();
        assert!(
            why.starts_with(
                "node n: the GPU grants recorded on its pods do not fit its inventory ("
            ) && why.ends_with("); no new GPU pods are placed there until that is resolved"),
            "{why}"
        );
    }

    #[test]
    fn unannounced_nodes_are_named() {
        let pod = ListedPod {
            uid: "u".into(),
            grants: Vec::new(),
            created: 0,
        };
        let by_node = HashMap::from([("n9".to_owned(), vec![pod.clone(), pod])]);
        assert_eq!(
            unannounced(&by_node, "gpu.fgpu.dev/node-gpus"),
            [
                "node n9: 2 pod(s) hold GPUs there, but the node has no GPU inventory annotation gpu.fgpu.dev/node-gpus"
            ]
        );
    }

    /// The allocation-free pre-check agrees with the engine on free GPUs.
    #[test]
    fn allowed_gpus_matches_the_engine() {
        let mut gpus: Vec<Gpu> = ["NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H100 80GB HBM3"]
            .iter()
            .enumerate()
            .map(|(i, m)| Gpu::new(format!("gpu-{i}"), *m, 1 << 34))
            .collect();
        gpus[2].healthy = false;
        let node = Node::new("n", gpus);
        let lists: [&[&str]; 5] = [&[], &["a100"], &["T4", "h100"], &["nvidia"], &["x"]];
        for inc in lists {
            for exc in lists {
                for pin in [vec![], vec!["GPU-gpu-1".to_owned()]] {
                    let mut r = Request::new(1, GpuShare::Memory { bytes: 1 });
                    r.model_include = inc.iter().map(|s| (*s).to_owned()).collect();
                    r.model_exclude = exc.iter().map(|s| (*s).to_owned()).collect();
                    r.uuid_pin = pin.clone();
                    let engine = node.gpus.iter().filter(|g| r.gpu_fits(g)).count();
                    let ours = allowed_gpus(&node, &r).unwrap_or(2);
                    assert_eq!(ours, engine, "{inc:?} {exc:?} {pin:?}");
                }
            }
        }
    }
}
