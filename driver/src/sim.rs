//! The trace simulator: the FGD paper's experiment (ATC'23, "Beware of Fragmentation")
//! replayed through the engine.
//!
//! The method, as the paper's artifact runs it:
//!
//! 1. the cluster is the trace's GPU nodes (CPU and memory of each node are respected);
//! 2. the pod list is shuffled with the seed, then inflated by resampling pods of the
//!    original list (or trimmed by removing random pods) until its total GPU request is
//!    `tune` × the cluster's GPU capacity;
//! 3. pods arrive one at a time and never leave; a pod that does not fit fails and is not
//!    retried; among nodes with equal scores the first in a fixed, per-seed random node
//!    order wins (the artifact's scheduler fork picks the smallest node name, and node names
//!    are prefixed with a seeded random permutation);
//! 4. after every pod, the arrived and allocated GPU amounts are logged; the log is
//!    discretised by arrived % of capacity (0..=130) as the artifact's
//!    `merge_alloc_discrete` does: rows whose arrived % rounds to *x*, else rows within
//!    *x* ± 1, averaged and rounded to 2 decimals.
//!
//! Everything here is pure: the caller reads the files and hands the text over.
//! [`curves`] reads the output back (also the live replay's) and averages it over seeds,
//! for `fgpu-sim plot`.

use std::collections::HashMap;
use std::fmt::Write as _;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::engine::model;
use crate::engine::{
    self, Gpu, Inventory, MaxSpec, Node, Placement, Policy, Request, ScoreContext, Weighting,
    Workload,
};
use crate::ledger::{Grant, Ledger};

pub mod curves;

/// Device memory given to every simulated GPU: the trace has none, fractions are taken
/// of it (a multiple of 1000, so that every milli-GPU share is exact).
pub const SIM_GPU_MEMORY: u64 = 16_000_000_000;

/// Share of pods that FGD's "typical pods" cover (the paper artifact's setting).
pub const TYPICAL_COVERAGE: f64 = model::FGD_COVERAGE;

/// Highest arrived % in the discretised output.
pub const MAX_PERCENT: usize = 130;

/// A malformed CSV input: which file, line (1-based, header is line 1) and column.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: column {column_no} ({column}): {message}")]
pub struct CsvError {
    pub file: String,
    pub line: usize,
    /// 1-based column number (0 when the column is missing from the header).
    pub column_no: usize,
    pub column: String,
    pub message: String,
}

/// One node of the trace (`sn,cpu_milli,memory_mib,gpu,model`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceNode {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u32,
    pub model: String,
}

/// One pod of the trace (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracePod {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub num_gpu: u32,
    /// Per-GPU share in milli-GPU (1000 = whole GPU).
    pub gpu_milli: u32,
    /// Allowed GPU models (empty: any).
    pub gpu_spec: Vec<String>,
}

impl TracePod {
    /// Total GPU request in milli-GPU.
    pub fn total_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }

    fn key(&self) -> (u64, u64, u32, u32, Vec<String>) {
        (
            self.cpu_milli,
            self.memory_mib,
            self.num_gpu,
            self.gpu_milli,
            self.gpu_spec.clone(),
        )
    }

    /// The engine request for this pod.
    pub fn request(&self) -> Request {
        let mut r = Request::from_trace(
            self.cpu_milli,
            self.memory_mib,
            self.num_gpu,
            self.gpu_milli,
        );
        r.model_include = self.gpu_spec.clone();
        r
    }
}

struct Table<'a> {
    file: &'a str,
    cols: Vec<&'a str>,
}

impl<'a> Table<'a> {
    fn col(&self, name: &str) -> Result<usize, CsvError> {
        self.cols
            .iter()
            .position(|c| c.trim() == name)
            .ok_or_else(|| CsvError {
                file: self.file.to_string(),
                line: 1,
                column_no: 0,
                column: name.to_string(),
                message: format!(
                    "missing column {name:?} in the header (found: {})",
                    self.cols.join(",")
                ),
            })
    }

    fn num<T: std::str::FromStr>(
        &self,
        line: usize,
        fields: &[&str],
        idx: usize,
    ) -> Result<T, CsvError> {
        let raw = fields.get(idx).copied().unwrap_or("");
        raw.trim().parse::<T>().map_err(|_| CsvError {
            file: self.file.to_string(),
            line,
            column_no: idx + 1,
            column: self.cols[idx].trim().to_string(),
            message: format!("{raw:?} is not a valid non-negative number"),
        })
    }
}

/// A data line: its 1-based number and its fields.
type Row<'a> = (usize, Vec<&'a str>);

/// Splits CSV text into the header and the data lines (with their 1-based numbers).
fn split_csv<'a>(file: &'a str, text: &'a str) -> Result<(Table<'a>, Vec<Row<'a>>), CsvError> {
    let mut lines = text.lines().enumerate();
    let header = loop {
        match lines.next() {
            Some((_, l)) if l.trim().is_empty() => continue,
            Some((_, l)) => break l,
            None => {
                return Err(CsvError {
                    file: file.to_string(),
                    line: 1,
                    column_no: 0,
                    column: String::new(),
                    message: "empty file: expected a header line".into(),
                });
            }
        }
    };
    let header = header.trim_start_matches('\u{feff}').trim_end_matches('\r');
    let cols: Vec<&str> = header.split(',').collect();
    let n = cols.len();
    let mut rows = Vec::new();
    for (i, l) in lines {
        let l = l.trim_end_matches('\r');
        if l.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = l.split(',').collect();
        if fields.len() != n {
            return Err(CsvError {
                file: file.to_string(),
                line: i + 1,
                column_no: fields.len().min(n) + 1,
                column: cols.get(fields.len()).unwrap_or(&"").trim().to_string(),
                message: format!(
                    "expected {n} fields as in the header, found {}",
                    fields.len()
                ),
            });
        }
        rows.push((i + 1, fields));
    }
    Ok((Table { file, cols }, rows))
}

/// Parses a node list (`sn,cpu_milli,memory_mib,gpu,model`). `file` names it in errors.
pub fn parse_nodes(file: &str, text: &str) -> Result<Vec<TraceNode>, CsvError> {
    let (t, rows) = split_csv(file, text)?;
    let (sn, cpu, mem, gpu, model) = (
        t.col("sn")?,
        t.col("cpu_milli")?,
        t.col("memory_mib")?,
        t.col("gpu")?,
        t.col("model")?,
    );
    rows.iter()
        .map(|(line, f)| {
            Ok(TraceNode {
                name: f[sn].trim().to_string(),
                cpu_milli: t.num(*line, f, cpu)?,
                memory_mib: t.num(*line, f, mem)?,
                gpus: t.num(*line, f, gpu)?,
                model: f[model].trim().to_string(),
            })
        })
        .collect()
}

/// Parses a pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli`, optionally
/// `gpu_spec`; other columns are ignored). `file` names it in errors.
pub fn parse_pods(file: &str, text: &str) -> Result<Vec<TracePod>, CsvError> {
    let (t, rows) = split_csv(file, text)?;
    let (name, cpu, mem, ng, gm) = (
        t.col("name")?,
        t.col("cpu_milli")?,
        t.col("memory_mib")?,
        t.col("num_gpu")?,
        t.col("gpu_milli")?,
    );
    let spec = t.col("gpu_spec").ok();
    rows.iter()
        .map(|(line, f)| {
            let num_gpu: u32 = t.num(*line, f, ng)?;
            let gpu_milli: u32 = t.num(*line, f, gm)?;
            if gpu_milli > engine::MILLI
                || (num_gpu > 1 && gpu_milli != engine::MILLI && gpu_milli != 0)
            {
                return Err(CsvError {
                    file: file.to_string(),
                    line: *line,
                    column_no: gm + 1,
                    column: "gpu_milli".into(),
                    message: format!(
                        "{gpu_milli} is not valid: 0..=1000, and exactly 1000 when num_gpu > 1"
                    ),
                });
            }
            Ok(TracePod {
                name: f[name].trim().to_string(),
                cpu_milli: t.num(*line, f, cpu)?,
                memory_mib: t.num(*line, f, mem)?,
                num_gpu,
                gpu_milli: if num_gpu == 0 { 0 } else { gpu_milli },
                gpu_spec: spec
                    .map(|s| {
                        f[s].split('|')
                            .map(str::trim)
                            .filter(|x| !x.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// The simulated cluster: GPU nodes only.
pub fn cluster(nodes: &[TraceNode]) -> Inventory {
    Inventory {
        nodes: nodes
            .iter()
            .filter(|n| n.gpus > 0)
            .map(|n| {
                let gpus = (0..n.gpus)
                    .map(|i| {
                        let mut g = Gpu::new(format!("gpu-{i}"), n.model.clone(), SIM_GPU_MEMORY);
                        g.uuid = format!("GPU-{}-{i}", n.name);
                        g
                    })
                    .collect();
                Node::new(n.name.clone(), gpus).with_host(n.cpu_milli, n.memory_mib)
            })
            .collect(),
    }
}

/// The expected workload the fragmentation policies score against: FGD's typical pods of
/// the trace (before shuffling and inflation, which only resample it). FGD's: pod kinds by
/// CPU, GPU and GPU model list (`gpu_spec`, as the artifact's `PodResource.GpuType`), the
/// most frequent covering 95 % of pods, weighted by count. fragaware's: every kind (no 95 %
/// cut), memory and model list kept, weighted by count like FGD.
pub fn workload_for(policy: Policy, pods: &[TracePod]) -> Workload {
    let with_mem = policy.node == engine::NodePolicy::FragAware;
    Workload::from_pinned_pods(
        pods.iter().map(|p| {
            (
                p.cpu_milli,
                if with_mem { p.memory_mib } else { 0 },
                p.num_gpu,
                p.gpu_milli,
                p.gpu_spec.clone(),
            )
        }),
        if with_mem { 1.0 } else { TYPICAL_COVERAGE },
        Weighting::Count,
    )
}

/// A model-constrained variant of a pod list (the FGD paper's "gpuspec" family): exactly
/// `round(fraction × GPU pods)` of the pods that need GPUs and have no `gpu_spec` yet,
/// chosen with a ChaCha8 RNG seeded by `seed`, are pinned to one GPU model each. The model
/// is drawn in proportion to its share of the cluster's GPUs (GPU nodes of `nodes`) among
/// the models with a node that can hold the pod (enough GPUs, CPU and memory); a pod that
/// no node can hold is left unpinned and another is taken. The same inputs give the same
/// list. CPU-only pods are never pinned.
pub fn pin_models(
    pods: &[TracePod],
    nodes: &[TraceNode],
    fraction: f64,
    seed: u64,
) -> Vec<TracePod> {
    let mut out = pods.to_vec();
    let gpu_pods = pods.iter().filter(|p| p.num_gpu > 0).count();
    let want = (fraction.clamp(0.0, 1.0) * gpu_pods as f64).round() as usize;
    // Per model: GPUs in the cluster, and the nodes' (GPUs, CPU, memory).
    let mut models: Vec<(String, u64, Vec<&TraceNode>)> = Vec::new();
    for n in nodes.iter().filter(|n| n.gpus > 0) {
        match models.iter_mut().find(|m| m.0 == n.model) {
            Some(m) => {
                m.1 += u64::from(n.gpus);
                m.2.push(n);
            }
            None => models.push((n.model.clone(), u64::from(n.gpus), vec![n])),
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..out.len())
        .filter(|&i| out[i].num_gpu > 0 && out[i].gpu_spec.is_empty())
        .collect();
    order.shuffle(&mut rng);
    let mut pinned = 0usize;
    for i in order {
        if pinned == want {
            break;
        }
        let p = &out[i];
        let fits = |m: &(String, u64, Vec<&TraceNode>)| {
            m.2.iter().any(|n| {
                n.gpus >= p.num_gpu && n.cpu_milli >= p.cpu_milli && n.memory_mib >= p.memory_mib
            })
        };
        let total: u64 = models.iter().filter(|m| fits(m)).map(|m| m.1).sum();
        if total == 0 {
            continue;
        }
        let mut x = rng.random_range(0..total);
        let model = models
            .iter()
            .filter(|m| fits(m))
            .find(|m| {
                if x < m.1 {
                    true
                } else {
                    x -= m.1;
                    false
                }
            })
            .map(|m| m.0.clone())
            .expect("x < total");
        out[i].gpu_spec = vec![model];
        pinned += 1;
    }
    out
}

/// One simulation run's parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunConfig {
    pub policy: Policy,
    pub seed: u64,
    /// Target total GPU request as a multiple of cluster GPU capacity (the paper: 1.3).
    pub tune: f64,
    /// Score fgd and fragaware against what a live allocator knows (the pods placed so far,
    /// [`crate::engine::WorkloadModel`]'s rules: nothing placed yet → binpack) instead of
    /// the whole trace.
    pub online: bool,
    /// Place as fgpu-controller does today: host CPU and memory are not accounted (pods
    /// ask none, CPU-only pods are left out), nodes are tried in name order and equal
    /// scores go to the first ([`engine::controller_best`]) instead of a per-seed order.
    pub as_controller: bool,
    /// Keep every pod's placement in [`RunResult::placements`].
    pub record: bool,
}

/// One simulation run's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    pub seed: u64,
    pub total_gpus: u64,
    /// Allocation % of GPU capacity at arrived = x % (index x, 0..=130); `None` when no
    /// pod was logged near x.
    pub alloc_by_arrived: Vec<Option<f64>>,
    pub pods: usize,
    pub failed: usize,
    /// Node evaluations the engine performed (cache misses).
    pub evaluations: u64,
    /// Each arrival in order with where it went, when [`RunConfig::record`].
    pub placements: Vec<Placed>,
}

/// Where one arrival went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub pod: TracePod,
    /// The node, `None` when no node could host the pod.
    pub node: Option<String>,
    /// The GPUs' ids on the node (`gpu-<i>`), in the engine's order.
    pub gpus: Vec<String>,
}

/// Header of [`placement_row`]'s CSV.
pub const PLACEMENTS_HEADER: &str =
    "sc_policy,seed,seq,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,node,gpus";

/// One row of the placements CSV: the arrival (`gpu_spec` models joined by `|`) and
/// where it went (`gpus` joined by `+`; node and GPUs empty when it found no room).
pub fn placement_row(policy: &str, seed: u64, seq: usize, p: &Placed) -> String {
    let pod = &p.pod;
    format!(
        "{policy},{seed},{seq},{},{},{},{},{},{},{},{}",
        pod.name,
        pod.cpu_milli,
        pod.memory_mib,
        pod.num_gpu,
        pod.gpu_milli,
        pod.gpu_spec.join("|"),
        p.node.as_deref().unwrap_or(""),
        p.gpus.join("+")
    )
}

/// The trace as fgpu-controller sees it ([`RunConfig::as_controller`]): nodes sorted by
/// name; GPU pods only, asking no host CPU or memory.
pub fn as_controller(nodes: &[TraceNode], pods: &[TracePod]) -> (Vec<TraceNode>, Vec<TracePod>) {
    let mut nodes = nodes.to_vec();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let pods = pods
        .iter()
        .filter(|p| p.num_gpu > 0)
        .map(|p| TracePod {
            cpu_milli: 0,
            memory_mib: 0,
            ..p.clone()
        })
        .collect();
    (nodes, pods)
}

impl RunResult {
    /// Unallocated GPU % when arrived = 100 % (the paper's headline metric).
    pub fn unallocated_at_100(&self) -> Option<f64> {
        self.alloc_by_arrived
            .get(100)
            .copied()
            .flatten()
            .map(|a| round2(100.0 - a))
    }
}

/// Shuffles with the seed, then inflates (or trims) the list to `tune` × capacity.
pub fn prepare_pods(
    pods: &[TracePod],
    capacity_milli: u64,
    tune: f64,
    rng: &mut ChaCha8Rng,
) -> Vec<TracePod> {
    let mut out: Vec<TracePod> = pods.to_vec();
    out.shuffle(rng);
    if tune <= 0.0 || pods.is_empty() {
        return out;
    }
    let target = tune * capacity_milli as f64;
    let mut total: u64 = out.iter().map(TracePod::total_milli).sum();
    if (total as f64) > target {
        while (total as f64) > target && !out.is_empty() {
            let i = rng.random_range(0..out.len());
            total -= out.remove(i).total_milli();
        }
    } else {
        let mut k = 0usize;
        loop {
            let p = &pods[rng.random_range(0..pods.len())];
            if (total + p.total_milli()) as f64 > target {
                break;
            }
            total += p.total_milli();
            let mut q = p.clone();
            q.name = format!("{}-tuned-{k}", p.name);
            k += 1;
            out.push(q);
        }
    }
    out
}

/// Runs one seed of the experiment.
pub fn run(nodes: &[TraceNode], pods: &[TracePod], cfg: RunConfig) -> RunResult {
    let stripped;
    let (nodes, pods) = if cfg.as_controller {
        stripped = as_controller(nodes, pods);
        (stripped.0.as_slice(), stripped.1.as_slice())
    } else {
        (nodes, pods)
    };
    let inv = cluster(nodes);
    let total_gpus: u64 = inv.nodes.iter().map(|n| n.gpus.len() as u64).sum();
    let capacity = total_gpus * u64::from(engine::MILLI);
    // Only fragaware reads the model charge: fgd must not re-score for it.
    let charged = matches!(cfg.policy.node, engine::NodePolicy::FragAware);
    let mut workload = cfg.policy.needs_workload().then(|| {
        let mut w = workload_for(cfg.policy, pods);
        if charged {
            w.set_pressure(&inv);
        }
        w
    });
    // Online: the kinds of the pods placed so far, refreshed whenever the count has grown by
    // 1 % (a live allocator refreshes per pass); until the first placement, binpack.
    let mut online = cfg.online.then(OnlineModel::default);
    if online.is_some() {
        workload = None;
    }
    let max_spec: MaxSpec = inv.max_spec();
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let arrivals = prepare_pods(pods, capacity, cfg.tune, &mut rng);

    // One tie order for the whole run, as the artifact has it: its kube-scheduler fork
    // breaks equal scores by the smallest node name, and the names carry a prefix from a
    // seeded random permutation of the nodes. So ties go to the first node of a fixed,
    // per-seed random order (first fit), not to a fresh random draw per pod.
    let tie_salt: u64 = rng.random();
    let mut ledger = Ledger::new(inv);
    let n_nodes = ledger.inventory().nodes.len();
    // Per request class and node: the evaluation, valid while the node is unchanged.
    let mut class_of: HashMap<(u64, u64, u32, u32, Vec<String>), usize> = HashMap::new();
    let mut cache: Vec<Vec<(u32, Option<Placement>)>> = Vec::new();
    let mut version: Vec<u32> = vec![1; n_nodes];

    let mut arrived = 0u64;
    let mut used = 0u64;
    let mut failed = 0usize;
    let mut evaluations = 0u64;
    let mut log: Vec<(u64, u64)> = Vec::with_capacity(arrivals.len());
    let mut placements = Vec::new();
    for (seq, pod) in arrivals.iter().enumerate() {
        let req = pod.request();
        let next = class_of.len();
        let class = *class_of.entry(pod.key()).or_insert(next);
        if class == cache.len() {
            cache.push(vec![(0, None); n_nodes]);
        }
        let policy = match (&online, &workload) {
            (Some(_), None) => {
                engine::model::PolicyWorkloads::default()
                    .resolve(cfg.policy)
                    .policy
            }
            _ => cfg.policy,
        };
        let ctx = ScoreContext {
            workload: workload.as_ref(),
            max_spec,
            // A trace has no measured load.
            usage_weight: 0.0,
        };
        let inv = ledger.inventory();
        let entries = &mut cache[class];
        for (i, e) in entries.iter_mut().enumerate() {
            if e.0 != version[i] {
                *e = (
                    version[i],
                    engine::evaluate_node(i, &inv.nodes[i], &req, policy, &ctx),
                );
                evaluations += 1;
            }
        }
        let scored = entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.1.as_ref().map(|p| (i, p.score)));
        let best = if cfg.as_controller {
            engine::controller_best(scored)
        } else {
            engine::best_index(scored, tie_salt)
        };
        arrived += pod.total_milli();
        match best {
            Some(i) => {
                let p = entries[i].1.clone().expect("feasible");
                if cfg.record {
                    let node = &inv.nodes[i];
                    placements.push(Placed {
                        pod: pod.clone(),
                        node: Some(node.name.clone()),
                        gpus: p.gpus.iter().map(|&g| node.gpus[g].id.clone()).collect(),
                    });
                }
                let g = Grant::from_placement(format!("{seq}"), inv, &req, &p);
                ledger
                    .grant(g)
                    .expect("the engine only proposes placements that fit");
                version[i] = version[i].wrapping_add(1).max(1);
                used += pod.total_milli();
                let mut rescore = false;
                if let Some(m) = &mut online
                    && let Some(w) = m.placed(cfg.policy, pod)
                {
                    workload = Some(w);
                    rescore = true;
                }
                // fragaware's model charge follows the free capacity per model.
                if charged
                    && let Some(w) = &mut workload
                    && !w.model_sets.is_empty()
                {
                    rescore |= w.set_pressure(ledger.inventory());
                }
                if rescore {
                    // Every cached score was against the old workload.
                    for v in &mut version {
                        *v = v.wrapping_add(1).max(1);
                    }
                }
            }
            None => {
                failed += 1;
                if cfg.record {
                    placements.push(Placed {
                        pod: pod.clone(),
                        node: None,
                        gpus: Vec::new(),
                    });
                }
            }
        }
        log.push((arrived, used));
    }
    RunResult {
        seed: cfg.seed,
        total_gpus,
        alloc_by_arrived: discretise(&log, total_gpus),
        pods: arrivals.len(),
        failed,
        evaluations,
        placements,
    }
}

/// The pods placed so far, for [`RunConfig::online`].
#[derive(Default)]
struct OnlineModel {
    counts: std::collections::BTreeMap<model::PinnedKind, f64>,
    placed: u64,
    refreshed_at: u64,
}

impl OnlineModel {
    /// Records `pod` as placed; the new workload for `policy` when it is time to refresh.
    fn placed(&mut self, policy: Policy, pod: &TracePod) -> Option<Workload> {
        let kind = (pod.cpu_milli, pod.memory_mib, pod.num_gpu, pod.gpu_milli);
        *self.counts.entry((kind, pod.gpu_spec.clone())).or_default() += 1.0;
        self.placed += 1;
        if self.placed < self.refreshed_at + (self.refreshed_at / 100).max(1) {
            return None;
        }
        self.refreshed_at = self.placed;
        model::workload_for_policy_pinned(self.counts.iter().map(|(k, c)| (k.clone(), *c)), policy)
    }
}

/// Python's `round(x, 0)`: half to even.
fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The artifact's discretisation of a per-pod log of (arrived, allocated) milli-GPU.
pub fn discretise(log: &[(u64, u64)], total_gpus: u64) -> Vec<Option<f64>> {
    let tg = total_gpus.max(1) as f64;
    let rows: Vec<(f64, f64)> = log
        .iter()
        .map(|&(a, u)| {
            (
                round_half_even(a as f64 / tg / 10.0),
                round2(u as f64 / tg / 10.0),
            )
        })
        .collect();
    (0..=MAX_PERCENT)
        .map(|x| {
            let x = x as f64;
            let mean = |lo: f64, hi: f64| {
                let (s, n) = rows
                    .iter()
                    .filter(|r| r.0 >= lo && r.0 <= hi)
                    .fold((0.0, 0usize), |(s, n), r| (s + r.1, n + 1));
                (n > 0).then(|| round2(s / n as f64))
            };
            mean(x, x).or_else(|| mean(x - 1.0, x + 1.0))
        })
        .collect()
}

/// The header of `analysis_allo_discrete.csv`.
pub fn csv_header() -> String {
    let mut h = String::from("workload,sc_policy,tune,seed,total_gpus");
    for x in 0..=MAX_PERCENT {
        let _ = write!(h, ",{x}");
    }
    h
}

/// One row of `analysis_allo_discrete.csv`.
pub fn csv_row(workload: &str, policy: &str, tune: f64, r: &RunResult) -> String {
    let mut s = format!("{workload},{policy},{tune},{},{}", r.seed, r.total_gpus);
    for v in &r.alloc_by_arrived {
        match v {
            // As Python prints floats (the artifact's files): `2.0`, `0.25`.
            Some(v) if v.fract() == 0.0 => {
                let _ = write!(s, ",{v:.1}");
            }
            Some(v) => {
                let _ = write!(s, ",{v}");
            }
            None => s.push(','),
        }
    }
    s
}

/// Mean and sample standard deviation.
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let sd = if xs.len() > 1 {
        (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (m, sd)
}

/// The paper's figures for `workload` from its `analysis_allo_discrete.csv`: per
/// `sc_policy`, the unallocated GPU % at arrived = 100 % as (mean, sd, runs).
pub fn paper_figures(
    file: &str,
    text: &str,
    workload: &str,
) -> Result<Vec<(String, f64, f64, usize)>, CsvError> {
    let (t, rows) = split_csv(file, text)?;
    let (wl, pol, c100) = (t.col("workload")?, t.col("sc_policy")?, t.col("100")?);
    let mut by: Vec<(String, Vec<f64>)> = Vec::new();
    for (line, f) in &rows {
        if f[wl].trim() != workload {
            continue;
        }
        let v: f64 = t.num(*line, f, c100)?;
        let name = f[pol].trim().to_string();
        match by.iter_mut().find(|(n, _)| *n == name) {
            Some((_, xs)) => xs.push(round2(100.0 - v)),
            None => by.push((name, vec![round2(100.0 - v)])),
        }
    }
    Ok(by
        .into_iter()
        .map(|(n, xs)| {
            let (m, sd) = mean_sd(&xs);
            (n, m, sd, xs.len())
        })
        .collect())
}

/// The paper's policy that ours is compared with (`sc_policy` of the artifact).
pub fn paper_counterpart(policy: &str) -> Option<&'static str> {
    match policy {
        "gpupacking" => Some("04-GpuPacking"),
        "bestfit" => Some("05-BestFit"),
        "fgd" | "fragaware" => Some("06-FGD"),
        _ => None,
    }
}

/// A `--seeds` value that is not a seed list; the caller adds the flag.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SeedListError {
    /// A part is not `N` or `N-M` with `N <= M` (the whole list as given).
    #[error("bad seed list {0:?}: use N, N-M or a comma-separated list of those")]
    Bad(String),
    /// The list names no seed (as given).
    #[error("empty seed list {0:?}")]
    Empty(String),
}

/// Parses a seed list: `42`, `42-51`, `42,45,50-51`.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>, SeedListError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || SeedListError::Bad(s.to_owned());
        match part.split_once('-') {
            Some((a, b)) => {
                let a: u64 = a.trim().parse().map_err(|_| bad())?;
                let b: u64 = b.trim().parse().map_err(|_| bad())?;
                if b < a {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    if out.is_empty() {
        return Err(SeedListError::Empty(s.to_owned()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
