//! Fragmentation measures and the two fragmentation-driven policies.
//!
//! **FGD** (Weng et al., ATC'23). A node's fragmentation with respect to one kind of pod
//! `t` is the GPU capacity of the node that `t` could not use: all of the node's free GPU
//! capacity when `t` cannot run there at all (too few GPUs with enough free capacity, or
//! too little free CPU), otherwise the free capacity of the GPUs that each have less than
//! `t`'s per-GPU demand. A pod that needs no GPU can use none of it. The node's
//! fragmentation under a workload is the expectation over the workload's kinds of pods,
//! `F(n) = Σ_t p_t · F_t(n)`. FGD places a pod where `F` grows the least (the
//! "fragmentation gradient"), choosing the GPU of a sharing pod the same way.
//!
//! **fragaware** (ours) keeps FGD's measure and changes what we found wanting in it (the
//! reasoning and the measurements are in `docs/engine.md`):
//!
//! 1. *Every kind.* The expectation runs over every kind of pod seen (no 95 % cut), weighted
//!    by count: the rare kinds (multi-GPU pods, odd sharing sizes) are the ones that suffer
//!    when nodes are broken up.
//! 2. *Host memory strands GPUs too.* `F_t` also counts a node as unusable for `t` when its
//!    free host memory is below `t`'s.
//! 3. *A linear gradient at FGD's resolution.* FGD's plugin squashes the gradient into an
//!    integer 0–100 through a sigmoid: near zero one point is 40 milli-GPU, but the sigmoid
//!    saturates, so placements that fragment by 3 GPUs and by 8 GPUs score the same. We keep
//!    the resolution ([`GRADIENT_RESOLUTION`]) and drop the saturation: the gradient is
//!    rounded down to a multiple of 40 milli-GPU.
//! 4. *Consolidating ties.* Placements in the same band tie; the caller breaks ties by a
//!    fixed node order (first fit), which fills used nodes before it opens empty ones. On a
//!    node, a sharing pod takes the fuller of two GPUs in the same band.
//! 5. *Pods without GPUs go where they strand the fewest GPUs.* Such a pod cannot fragment
//!    a GPU; all it can do is take CPU or memory that a later GPU pod on its node would have
//!    needed, and the GPUs that can be stranded that way are the ones still free on its
//!    node. So it goes to the node with the least free GPU capacity (a node whose GPUs are
//!    all taken first), ties in the fixed node order. FGD scores them by the gradient, which
//!    is zero on almost every node until a kind's CPU threshold is crossed, so they
//!    spread over nodes with free GPUs by the tie order and eat the CPU those GPUs need.
//! 6. *GPU capacity the host cannot feed is fragmented.* The workload's GPU pods bring, on
//!    average, a known amount of host CPU and memory per milli-GPU ([`MeanGpuPod`]). Free GPU
//!    capacity beyond what the node's free CPU (or memory) can feed at that rate is counted
//!    as fragmented, weighted by the chance that the next pod needs a GPU. FGD's per-kind
//!    check only sees a node's CPU once it drops below one pod's request, so it lets CPU-heavy
//!    pods pile onto CPU-poor nodes (two 11-core sharing pods on a GPU of a 12-cores-per-GPU
//!    node) until the node's last GPUs are stranded; the term makes that cost visible from
//!    the first placement that eats more than the GPUs' share of the host. It is derived
//!    from the workload, with no constant.
//!
//! The measure is evaluated in O(kinds + GPUs·log GPUs) per node state: the GPUs' free
//! levels are sorted once, and each kind needs a binary search and a prefix sum.

use super::{GpuPolicy, GpuShare, Node, Request, pick_gpus};

/// One kind of pod in the expected workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkloadType {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// GPUs per pod (0 for CPU-only pods).
    pub gpus: u32,
    /// Demand per GPU in milli-GPU (1000 for whole GPUs).
    pub milli: u32,
    /// Probability that an arriving pod is of this kind.
    pub weight: f64,
    /// The GPU models the kind may use: 0 for any model, else `i` for
    /// [`Workload::model_sets`]`[i - 1]` (the trace's `gpu_spec`).
    pub model_set: u32,
}

/// How the kinds of pods are weighted in the expectation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Weighting {
    /// By pod count: the chance that the next pod is of this kind (FGD).
    Count,
    /// By GPU requests (count × GPUs): the chance that the next GPU a pod asks for (one
    /// device slot, whole or shared) belongs to this kind (an alternative). Pods without GPUs
    /// weigh nothing.
    PerGpu,
    /// By GPU demand (count × GPUs × milli-GPU): the chance that the next unit of GPU
    /// capacity demanded belongs to this kind. Pods without GPUs weigh nothing.
    GpuDemand,
}

/// The expected distribution of arriving pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    pub types: Vec<WorkloadType>,
    /// The model lists of the kinds that are pinned to GPU models (see
    /// [`WorkloadType::model_set`]); a GPU is usable for such a kind when its model matches
    /// one entry, as `Request::model_include` matches. At most 64 lists are told apart; a
    /// kind whose list is beyond that is treated as unpinned.
    pub model_sets: Vec<Vec<String>>,
    /// fragaware's charge per milli-GPU taken on a GPU of each model (sorted by model;
    /// [`Workload::set_pressure`]); empty: no charge.
    pub pressure: Vec<(String, f64)>,
}

impl Workload {
    /// Sets fragaware's model charge from the free capacity of `inv`; whether it changed
    /// by more than [`PRESSURE_TOLERANCE`] on any model (a caller that caches scores
    /// re-scores then).
    ///
    /// For each list `S` of pinned models, `D_S` is the share of the workload's GPU demand
    /// (weight × GPUs × milli-GPU) pinned to `S`, and `F_S` the free capacity of the healthy
    /// GPUs `S` allows, against `F` free in all. If the cluster goes on filling, the demand
    /// still to come pinned to `S` is about `D_S · F`; once that exceeds
    /// [`PRESSURE_THRESHOLD`] × `F_S`, the capacity of `S` is at risk: every milli-GPU an
    /// arriving pod takes there is one that a pinned pod may miss. The charge of a model is
    /// the gain times the overshoot `Σ max(0, D_S·F / F_S − threshold)` over the lists that allow it,
    /// capped at 1 (a full milli-GPU per milli-GPU). Below the threshold nothing is charged,
    /// so while the pinned models have room the measure is unchanged, and where every model
    /// is pinned in proportion to its size the overshoot is the same everywhere.
    pub fn set_pressure(&mut self, inv: &super::Inventory) -> bool {
        if self.model_sets.is_empty() {
            let changed = !self.pressure.is_empty();
            self.pressure.clear();
            return changed;
        }
        let demand = |t: &WorkloadType| t.weight * f64::from(t.gpus) * f64::from(t.milli);
        let total_demand: f64 = self.types.iter().map(demand).sum();
        // Free milli-GPU per model, on healthy GPUs.
        let mut free: Vec<(String, f64)> = Vec::new();
        for g in inv.nodes.iter().flat_map(|n| &n.gpus).filter(|g| g.healthy) {
            let f = f64::from(g.free_milli());
            match free.iter_mut().find(|(m, _)| *m == g.model) {
                Some((_, n)) => *n += f,
                None => free.push((g.model.clone(), f)),
            }
        }
        free.sort_by(|a, b| a.0.cmp(&b.0));
        let all_free: f64 = free.iter().map(|(_, f)| f).sum();
        let mut charge: Vec<(String, f64)> = free.iter().map(|(m, _)| (m.clone(), 0.0)).collect();
        if total_demand > 0.0 && all_free > 0.0 {
            for (i, set) in self.model_sets.iter().enumerate() {
                let pinned: f64 = self
                    .types
                    .iter()
                    .filter(|t| t.model_set as usize == i + 1)
                    .map(demand)
                    .sum::<f64>()
                    / total_demand;
                let allows = |m: &str| set.iter().any(|p| super::model_matches(m, p));
                let set_free: f64 = free.iter().filter(|(m, _)| allows(m)).map(|(_, f)| f).sum();
                if pinned <= 0.0 {
                    continue;
                }
                let over = if set_free > 0.0 {
                    PRESSURE_GAIN * (pinned * all_free / set_free - PRESSURE_THRESHOLD).max(0.0)
                } else {
                    1.0
                };
                for (m, c) in &mut charge {
                    if allows(m) {
                        *c += over;
                    }
                }
            }
        }
        for (_, c) in &mut charge {
            *c = c.min(1.0);
        }
        let changed = charge.len() != self.pressure.len()
            || charge
                .iter()
                .zip(&self.pressure)
                .any(|(a, b)| a.0 != b.0 || (a.1 - b.1).abs() > PRESSURE_TOLERANCE);
        if changed {
            self.pressure = charge;
        }
        changed
    }

    /// The pressure on GPU model `model` (0 when none is set).
    pub fn pressure_on(&self, model: &str) -> f64 {
        self.pressure
            .binary_search_by(|(m, _)| m.as_str().cmp(model))
            .map_or(0.0, |i| self.pressure[i].1)
    }

    /// The FGD paper's "typical pods": kinds of pods (CPU, memory, GPU count, per-GPU
    /// demand) counted over `pods`, most frequent first, cut once they cover `coverage`
    /// (0–1) of the pods, then renormalised, then weighted by `weighting`. FGD's artifact
    /// used 0.95 and [`Weighting::Count`], and grouped pods by CPU and GPU only (pass
    /// memory 0 for that); fragaware uses all kinds (coverage 1.0), count weights and memory.
    pub fn from_pods(
        pods: impl IntoIterator<Item = (u64, u64, u32, u32)>,
        coverage: f64,
        weighting: Weighting,
    ) -> Workload {
        Self::from_pinned_pods(
            pods.into_iter()
                .map(|(c, m, g, milli)| (c, m, g, milli, Vec::new())),
            coverage,
            weighting,
        )
    }

    /// [`Workload::from_pods`] with each pod's allowed GPU models (empty: any), which make
    /// part of its kind: a pinned kind can only use GPUs of its models, so on a node of
    /// another model all the free GPU capacity is fragmented for it (FGD's "no access").
    pub fn from_pinned_pods(
        pods: impl IntoIterator<Item = (u64, u64, u32, u32, Vec<String>)>,
        coverage: f64,
        weighting: Weighting,
    ) -> Workload {
        Workload::from_weighted_pinned(
            pods.into_iter()
                .map(|(c, m, g, milli, models)| (((c, m, g, milli), models), 1.0)),
            coverage,
            weighting,
            usize::MAX,
        )
    }
}

/// The workload's average GPU pod, as fragaware's host-starvation term sees it: the host
/// CPU and memory that the GPU pods bring per milli-GPU they ask for (totals over the kinds
/// that need GPUs, weighted like the kinds), and the chance that the next pod needs a GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeanGpuPod {
    /// Milli-CPU per milli-GPU (0: the GPU pods need no CPU).
    pub cpu_per_milli: f64,
    /// MiB of host memory per milli-GPU (0: the GPU pods need no memory).
    pub memory_per_milli: f64,
    /// Sum of the weights of the kinds that need GPUs.
    pub weight: f64,
}

impl MeanGpuPod {
    /// The average GPU pod of `w`.
    pub fn of(w: &Workload) -> MeanGpuPod {
        let (mut cpu, mut mem, mut milli, mut weight) = (0.0, 0.0, 0.0, 0.0);
        for t in w.types.iter().filter(|t| t.gpus > 0) {
            cpu += t.weight * t.cpu_milli as f64;
            mem += t.weight * t.memory_mib as f64;
            milli += t.weight * f64::from(t.gpus) * f64::from(t.milli);
            weight += t.weight;
        }
        if milli <= 0.0 {
            return MeanGpuPod {
                cpu_per_milli: 0.0,
                memory_per_milli: 0.0,
                weight: 0.0,
            };
        }
        MeanGpuPod {
            cpu_per_milli: cpu / milli,
            memory_per_milli: mem / milli,
            weight,
        }
    }
}

/// A node's state as the measure sees it: free GPU levels (in the node's order and sorted)
/// and free host resources. Refilled in place ([`Levels::set`]) for each state measured,
/// so measuring allocates nothing once its vectors have grown to the node's GPU count.
#[derive(Clone, Debug, Default)]
struct Levels {
    /// Free level per GPU, in the node's order (for the pinned kinds).
    raw: Vec<u32>,
    sorted: Vec<u32>,
    /// `prefix[i]`: the sum of the `i` lowest levels.
    prefix: Vec<u64>,
    cpu_free: u64,
    mem_free: u64,
}

impl Levels {
    /// Makes this the state with free levels `free` and free host `cpu_free`, `mem_free`.
    fn set(&mut self, free: &[u32], cpu_free: u64, mem_free: u64) {
        self.raw.clear();
        self.raw.extend_from_slice(free);
        self.sorted.clear();
        self.sorted.extend_from_slice(free);
        self.sorted.sort_unstable();
        self.prefix.clear();
        self.prefix.push(0);
        let mut acc = 0u64;
        for &l in &self.sorted {
            acc += u64::from(l);
            self.prefix.push(acc);
        }
        self.cpu_free = cpu_free;
        self.mem_free = mem_free;
    }

    fn total(&self) -> u64 {
        *self.prefix.last().unwrap_or(&0)
    }

    /// `F(n)` in milli-GPU; `access` holds, per GPU, which of `w`'s model lists allow it
    /// ([`Scratch::load`]).
    ///
    /// fragaware (`check_memory`) leaves out the kinds pinned to models the node has none
    /// of: their term would be the node's whole free capacity, a term every placement on
    /// the node lowers, so a node of a rare model would look the best place for any pod
    /// (its capacity "fragmented" for the many kinds pinned elsewhere) and the pods pinned
    /// to that model would find it taken. FGD counts them ("no access").
    fn frag(&self, access: &[u64], w: &Workload, check_memory: bool) -> f64 {
        let skip_no_access = check_memory;
        let n = self.sorted.len();
        let total = self.total() as f64;
        let mut acc = 0.0;
        for t in &w.types {
            if t.gpus == 0 {
                acc += t.weight * total;
                continue;
            }
            let host_short =
                self.cpu_free < t.cpu_milli || (check_memory && self.mem_free < t.memory_mib);
            if t.model_set > 0 {
                // A pinned kind: only GPUs of its models with its demand free are of use;
                // the free capacity of every other GPU is fragmented for it.
                let bit = 1u64 << (t.model_set - 1);
                if skip_no_access && !access.iter().any(|a| a & bit != 0) {
                    continue;
                }
                let (mut usable, mut usable_free) = (0usize, 0u64);
                for (l, a) in self.raw.iter().zip(access) {
                    if a & bit != 0 && *l >= t.milli {
                        usable += 1;
                        usable_free += u64::from(*l);
                    }
                }
                let blocked = usable < t.gpus as usize || host_short;
                acc += t.weight
                    * if blocked {
                        total
                    } else {
                        total - usable_free as f64
                    };
                continue;
            }
            let idx = self.sorted.partition_point(|&l| l < t.milli);
            let usable = n - idx;
            let blocked = usable < t.gpus as usize || host_short;
            acc += t.weight
                * if blocked {
                    total
                } else {
                    self.prefix[idx] as f64
                };
        }
        acc
    }

    /// fragaware's host-starvation term in milli-GPU: the free GPU capacity beyond what the
    /// node's free CPU and memory can feed at the average GPU pod's rates, times the chance
    /// that the next pod needs a GPU. Unknown host resources feed everything.
    fn starved(&self, mean: &MeanGpuPod) -> f64 {
        let total = self.total() as f64;
        let mut fed = total;
        if mean.cpu_per_milli > 0.0 && self.cpu_free != u64::MAX {
            fed = fed.min(self.cpu_free as f64 / mean.cpu_per_milli);
        }
        if mean.memory_per_milli > 0.0 && self.mem_free != u64::MAX {
            fed = fed.min(self.mem_free as f64 / mean.memory_per_milli);
        }
        mean.weight * (total - fed).max(0.0)
    }

    /// fragaware's measure: FGD's with host memory, plus the host-starvation term.
    fn fragaware(&self, access: &[u64], w: &Workload, mean: &MeanGpuPod) -> f64 {
        self.frag(access, w, true) + self.starved(mean)
    }
}

/// The buffers the measure works in: one node's free levels and model access, and the
/// state measured last. [`super::evaluate_node`] keeps one per thread and passes it down,
/// so scoring a node and its candidate placements allocates nothing once the buffers have
/// grown to the largest node's GPU count.
#[derive(Clone, Debug, Default)]
pub(super) struct Scratch {
    /// Free level per GPU of the node as it is (0 for an unhealthy GPU).
    levels: Vec<u32>,
    /// Per GPU, bit `i` set when model list `i` of the workload allows it; empty when
    /// the workload pins no kind to models.
    access: Vec<u64>,
    /// The levels after a candidate placement (the input of `state`).
    after: Vec<u32>,
    /// The state measured last.
    state: Levels,
    /// Free levels already tried as a sharing pod's GPU (fragaware).
    seen: Vec<u32>,
}

impl Scratch {
    /// Loads `node` as it is: its free levels and which of `w`'s model lists allow each GPU.
    fn load(&mut self, node: &Node, w: &Workload) {
        self.levels.clear();
        self.levels.extend(
            node.gpus
                .iter()
                .map(|g| if g.healthy { g.free_milli() } else { 0 }),
        );
        self.access.clear();
        if !w.model_sets.is_empty() {
            self.access.extend(node.gpus.iter().map(|g| {
                w.model_sets
                    .iter()
                    .enumerate()
                    .filter(|(_, set)| set.iter().any(|m| super::model_matches(&g.model, m)))
                    .fold(0u64, |acc, (i, _)| acc | (1u64 << i))
            }));
        }
    }

    /// Makes the loaded node as it is the state to measure.
    fn before(&mut self, node: &Node) -> &Self {
        let (c, m) = host_free(node);
        self.state.set(&self.levels, c, m);
        self
    }

    /// Makes the loaded node after placing `req` on `gpus` of `node` the state to measure.
    fn after(&mut self, node: &Node, req: &Request, gpus: &[usize]) -> &Self {
        self.after.clear();
        self.after.extend_from_slice(&self.levels);
        for &i in gpus {
            self.after[i] = self.after[i].saturating_sub(req.milli_on(&node.gpus[i]));
        }
        let (c, m) = host_free(node);
        self.state.set(
            &self.after,
            c.saturating_sub(req.cpu_milli),
            m.saturating_sub(req.memory_mib),
        );
        self
    }

    /// `F(n)` of the state to measure ([`Levels::frag`]).
    fn frag(&self, w: &Workload, check_memory: bool) -> f64 {
        self.state.frag(&self.access, w, check_memory)
    }

    /// fragaware's measure of the state to measure ([`Levels::fragaware`]).
    fn fragaware(&self, w: &Workload, mean: &MeanGpuPod) -> f64 {
        self.state.fragaware(&self.access, w, mean)
    }
}

fn host_free(node: &Node) -> (u64, u64) {
    (
        node.cpu_milli_free.unwrap_or(u64::MAX),
        node.memory_mib_free.unwrap_or(u64::MAX),
    )
}

/// The node's fragmentation `F(n)` in milli-GPU under `w` (FGD's measure when
/// `check_memory` is false).
pub fn node_frag(node: &Node, w: &Workload, check_memory: bool) -> f64 {
    let mut s = Scratch::default();
    s.load(node, w);
    s.before(node).frag(w, check_memory)
}

/// fragaware's measure of the node in milli-GPU under `w`: FGD's measure with host memory
/// plus the capacity its free CPU and memory cannot feed (see [`MeanGpuPod`]).
pub fn fragaware_frag(node: &Node, w: &Workload) -> f64 {
    let mut s = Scratch::default();
    s.load(node, w);
    s.before(node).fragaware(w, &MeanGpuPod::of(w))
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// FGD's score as its scheduler plugin computes it: `⌊100·σ(ΔF/1000)⌋`, ΔF = F before − F
/// after (in milli-GPU).
fn fgd_quantised(before: f64, after: f64) -> f64 {
    (sigmoid((before - after) / 1000.0) * 100.0).trunc()
}

/// FGD, faithfully: a sharing pod goes to the GPU with the best quantised score (first
/// GPU on ties); other pods take GPUs in policy order.
pub(super) fn place_fgd(
    node: &Node,
    req: &Request,
    fit: &[usize],
    gpu: GpuPolicy,
    w: &Workload,
    s: &mut Scratch,
) -> Option<(Vec<usize>, f64)> {
    s.load(node, w);
    let before = s.before(node).frag(w, false);
    if req.gpus == 1 && req.share != GpuShare::Whole {
        let mut best: Option<(usize, f64)> = None;
        for &i in fit {
            let after = s.after(node, req, &[i]).frag(w, false);
            let score = fgd_quantised(before, after);
            if best.is_none_or(|(_, b)| score > b) {
                best = Some((i, score));
            }
        }
        best.map(|(i, score)| (vec![i], score))
    } else {
        let gpus = pick_gpus(node, req, fit, gpu)?;
        let score = fgd_quantised(before, s.after(node, req, &gpus).frag(w, false));
        Some((gpus, score))
    }
}

/// The resolution at which fragaware compares gradients, in milli-GPU: one point of FGD's
/// integer score at zero gradient (`100 · σ'(0) / 1000` = 1/40 point per milli-GPU).
/// Differences below it are not taken as real; candidates within one band tie and the
/// caller's fixed node order (first fit) decides.
pub const GRADIENT_RESOLUTION: f64 = 40.0;

/// The gradient rounded down to a multiple of [`GRADIENT_RESOLUTION`].
fn banded(gradient: f64) -> f64 {
    (gradient / GRADIENT_RESOLUTION).floor() * GRADIENT_RESOLUTION
}

/// The expected pinned demand still to come must exceed this share of its models' free
/// capacity before fragaware charges other pods for taking it ([`Workload::set_pressure`]).
/// 0.25 with [`PRESSURE_GAIN`] 3 was the best of the pairs tried on the FGD paper's
/// gpuspec05-33 traces and generated pins (docs/engine.md).
pub const PRESSURE_THRESHOLD: f64 = 0.25;

/// Charge per unit of overshoot over [`PRESSURE_THRESHOLD`].
pub const PRESSURE_GAIN: f64 = 3.0;

/// A change of the model charge smaller than this (per milli-GPU) is not a change.
pub const PRESSURE_TOLERANCE: f64 = 0.01;

/// fragaware: banded linear gradient of its measure (host memory, host starvation).
pub(super) fn place_fragaware(
    node: &Node,
    req: &Request,
    fit: &[usize],
    gpu: GpuPolicy,
    w: &Workload,
    s: &mut Scratch,
) -> Option<(Vec<usize>, f64)> {
    s.load(node, w);
    let mean = MeanGpuPod::of(w);
    let before = s.before(node).fragaware(w, &mean);
    let score_of = |s: &mut Scratch, gpus: &[usize]| -> f64 {
        let displaced: f64 = gpus
            .iter()
            .map(|&i| f64::from(req.milli_on(&node.gpus[i])) * w.pressure_on(&node.gpus[i].model))
            .sum();
        banded(before - s.after(node, req, gpus).fragaware(w, &mean) - displaced)
    };
    if req.gpus == 1 && req.share != GpuShare::Whole {
        // One candidate per distinct free level: GPUs at the same level are equivalent.
        let mut best: Option<(usize, f64, u32)> = None;
        s.seen.clear();
        for &i in fit {
            let l = s.levels[i];
            if s.seen.contains(&l) {
                continue;
            }
            s.seen.push(l);
            let score = score_of(s, &[i]);
            let better = match best {
                None => true,
                Some((_, bs, bl)) => {
                    let tol = super::SCORE_EPS * bs.abs().max(1.0);
                    score > bs + tol || (score >= bs - tol && l < bl)
                }
            };
            if better {
                best = Some((i, score, l));
            }
        }
        best.map(|(i, score, _)| (vec![i], score))
    } else {
        let gpus = pick_gpus(node, req, fit, gpu)?;
        let score = score_of(s, &gpus);
        Some((gpus, score))
    }
}

/// FGD's score for a pod without GPUs.
pub(super) fn fgd_host_only(node: &Node, req: &Request, w: &Workload, s: &mut Scratch) -> f64 {
    s.load(node, w);
    let before = s.before(node).frag(w, false);
    let after = s.after(node, req, &[]).frag(w, false);
    fgd_quantised(before, after)
}

/// fragaware's score for a pod without GPUs: minus the node's free GPU capacity (milli-GPU,
/// healthy GPUs). Such a pod uses no GPU, so the only harm it can do is to take CPU or memory
/// that a later GPU pod on the same node needs: the GPUs it can strand are the ones still
/// free on its node. It therefore goes where the fewest are free — a node whose GPUs are
/// all taken first, where its CPU is of no use to a GPU pod anyway — and equal nodes go to
/// the caller's fixed node order.
pub(super) fn fragaware_host_only(node: &Node) -> f64 {
    let free: u64 = node
        .gpus
        .iter()
        .filter(|g| g.healthy)
        .map(|g| u64::from(g.free_milli()))
        .sum();
    -(free as f64)
}
