//! The online workload model: the mix of requests a live allocator has seen lately, as the
//! expected [`Workload`] the fragmentation policies (`fgd`, `fragaware`) score against.
//!
//! The simulator knows its whole trace in advance; a controller or an extender only knows
//! what arrived. [`WorkloadModel`] keeps each request it is told about once (by id), at
//! the time it arrived, and weighs it by its age: the weight halves every
//! [`WorkloadModel::half_life`], so the mix follows the cluster's recent demand and forgets
//! what stopped arriving. Nothing is persisted: a restarted allocator tells the model about
//! the requests that still exist, each at its own arrival time, and gets the same mix as a
//! model that saw them arrive one by one ([`WorkloadModel::workload`] depends only on the
//! set of `(kind, arrival)` it holds and the time asked for).
//!
//! A kind is FGD's: host CPU, host memory, GPUs per request and the per-GPU demand in
//! milli-GPU. At most [`MAX_KINDS`] kinds (the heaviest) go into a workload, so scoring a
//! node stays O(kinds) however varied the requests are.

use std::collections::BTreeMap;
use std::time::Duration;

use super::frag::{Weighting, Workload, WorkloadType};
use super::{MILLI, NodePolicy, Policy};

/// One kind of request: `(cpu_milli, memory_mib, gpus, milli_per_gpu)`.
pub type Kind = (u64, u64, u32, u32);

/// A kind with the GPU models its requests may use (empty: any model).
pub type PinnedKind = (Kind, Vec<String>);

/// At most this many model lists are told apart in a workload (a bit each per GPU).
pub const MAX_MODEL_SETS: usize = 64;

/// At most this many kinds (the heaviest) make up a workload.
pub const MAX_KINDS: usize = 64;

/// A request older than this many half-lives weighs less than 2⁻³⁰ of a new one and is
/// forgotten.
const HORIZON_HALF_LIVES: f64 = 30.0;

/// The requests seen, by id, each with its kind and arrival time (seconds on the caller's
/// clock, e.g. Unix time).
#[derive(Clone, Debug)]
pub struct WorkloadModel {
    half_life: Duration,
    seen: BTreeMap<String, (Kind, i64)>,
}

impl WorkloadModel {
    /// An empty model whose weights halve every `half_life` (at least one second).
    pub fn new(half_life: Duration) -> Self {
        Self {
            half_life: half_life.max(Duration::from_secs(1)),
            seen: BTreeMap::new(),
        }
    }

    /// How long it takes a request's weight to halve.
    pub fn half_life(&self) -> Duration {
        self.half_life
    }

    /// Records request `id` of `kind`, arrived at `at`; a request already recorded keeps
    /// its first record (an allocator sees the same request on every pass).
    pub fn observe(&mut self, id: &str, kind: Kind, at: i64) {
        if !self.seen.contains_key(id) {
            self.seen.insert(id.to_owned(), (kind, at));
        }
    }

    /// Whether request `id` is recorded.
    pub fn contains(&self, id: &str) -> bool {
        self.seen.contains_key(id)
    }

    /// Requests recorded.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Forgets the requests that arrived more than the horizon (30 half-lives) before `now`.
    pub fn prune(&mut self, now: i64) {
        let horizon = (self.half_life.as_secs_f64() * HORIZON_HALF_LIVES) as i64;
        self.seen
            .retain(|_, (_, at)| now.saturating_sub(*at) <= horizon);
    }

    /// The weight of each kind at `now`: Σ 2^(−age / half-life) over its requests (a
    /// request from the future counts as new). Summed in the order of the ids, so the
    /// same requests give the same weights to the last bit however they were recorded.
    pub fn weights(&self, now: i64) -> BTreeMap<Kind, f64> {
        let h = self.half_life.as_secs_f64();
        let mut out: BTreeMap<Kind, f64> = BTreeMap::new();
        for (kind, at) in self.seen.values() {
            let age = now.saturating_sub(*at).max(0) as f64;
            *out.entry(*kind).or_default() += (-age / h).exp2();
        }
        out
    }

    /// The expected workload at `now` for `policy` ([`workload_for_policy`] over
    /// [`WorkloadModel::weights`]).
    pub fn workload(&self, policy: Policy, now: i64) -> Option<Workload> {
        workload_for_policy(self.weights(now), policy)
    }
}

/// Share of the weight FGD's "typical kinds" cover (the paper artifact's setting).
pub const FGD_COVERAGE: f64 = 0.95;

/// The expected workload for `policy` from weighted kinds, as the simulator builds it from
/// a trace ([`crate::sim::workload_for`]): `fgd` keeps FGD's typical kinds (by CPU and
/// GPU, covering [`FGD_COVERAGE`] of the weight), `fragaware` every kind with its memory;
/// at most [`MAX_KINDS`] kinds. `None` when the policy needs no workload or no kind needs a
/// GPU (a policy that needs one cannot run yet).
pub fn workload_for_policy(
    weights: impl IntoIterator<Item = (Kind, f64)>,
    policy: Policy,
) -> Option<Workload> {
    workload_for_policy_pinned(
        weights.into_iter().map(|(k, w)| ((k, Vec::new()), w)),
        policy,
    )
}

/// [`workload_for_policy`] over kinds that name the GPU models they may use.
pub fn workload_for_policy_pinned(
    weights: impl IntoIterator<Item = (PinnedKind, f64)>,
    policy: Policy,
) -> Option<Workload> {
    if !policy.needs_workload() {
        return None;
    }
    let fgd = policy.node == NodePolicy::Fgd;
    let kinds = weights
        .into_iter()
        .map(|(((cpu, mem, gpus, milli), models), w)| {
            (((cpu, if fgd { 0 } else { mem }, gpus, milli), models), w)
        });
    let coverage = if fgd { FGD_COVERAGE } else { 1.0 };
    let w = Workload::from_weighted_pinned(kinds, coverage, Weighting::Count, MAX_KINDS);
    w.types.iter().any(|t| t.gpus > 0).then_some(w)
}

impl Workload {
    /// FGD's typical kinds from weighted kinds: most weight first (equal weights by the
    /// kind), cut once they cover `coverage` (0–1) of the weight or at `max_kinds`, then
    /// renormalised and weighted by `weighting`. [`Workload::from_pods`] is this with each
    /// pod weighing 1.
    pub fn from_weighted(
        kinds: impl IntoIterator<Item = (Kind, f64)>,
        coverage: f64,
        weighting: Weighting,
        max_kinds: usize,
    ) -> Workload {
        Workload::from_weighted_pinned(
            kinds.into_iter().map(|(k, w)| ((k, Vec::new()), w)),
            coverage,
            weighting,
            max_kinds,
        )
    }

    /// [`Workload::from_weighted`] where each kind also names the GPU models it may use
    /// (empty: any), which makes part of the kind ([`WorkloadType::model_set`]). The model
    /// lists are numbered in the order the kept kinds first name them, heaviest first; a
    /// list beyond the 64th counts as "any model".
    pub fn from_weighted_pinned(
        kinds: impl IntoIterator<Item = (PinnedKind, f64)>,
        coverage: f64,
        weighting: Weighting,
        max_kinds: usize,
    ) -> Workload {
        let mut merged: BTreeMap<PinnedKind, f64> = BTreeMap::new();
        for (((cpu, mem, gpus, milli), models), w) in kinds {
            if w.is_nan() || w <= 0.0 {
                continue;
            }
            let (milli, models) = if gpus == 0 {
                (0, Vec::new())
            } else {
                (milli.min(MILLI), models)
            };
            *merged.entry(((cpu, mem, gpus, milli), models)).or_default() += w;
        }
        let total: f64 = merged.values().sum();
        if merged.is_empty() || total <= 0.0 {
            return Workload::default();
        }
        let mut kinds: Vec<(PinnedKind, f64)> = merged.into_iter().collect();
        // Heaviest first; the key orders equal weights deterministically.
        kinds.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let want = coverage.clamp(0.0, 1.0) * total;
        let mut kept: Vec<(PinnedKind, f64)> = Vec::new();
        let mut cum = 0.0;
        for (k, w) in kinds {
            if (cum >= want && !kept.is_empty()) || kept.len() >= max_kinds.max(1) {
                break;
            }
            cum += w;
            kept.push((k, w));
        }
        let mut model_sets: Vec<Vec<String>> = Vec::new();
        let mut types: Vec<WorkloadType> = Vec::with_capacity(kept.len());
        for (((cpu_milli, memory_mib, gpus, milli), models), w) in kept {
            let model_set = if models.is_empty() {
                0
            } else if let Some(i) = model_sets.iter().position(|m| *m == models) {
                i as u32 + 1
            } else if model_sets.len() < MAX_MODEL_SETS {
                model_sets.push(models);
                model_sets.len() as u32
            } else {
                0
            };
            types.push(WorkloadType {
                cpu_milli,
                memory_mib,
                gpus,
                milli,
                weight: w / cum,
                model_set,
            });
        }
        if weighting != Weighting::Count {
            for t in &mut types {
                t.weight *= match weighting {
                    Weighting::PerGpu => f64::from(t.gpus),
                    _ => f64::from(t.gpus) * f64::from(t.milli),
                };
            }
            let sum: f64 = types.iter().map(|t| t.weight).sum();
            if sum > 0.0 {
                for t in &mut types {
                    t.weight /= sum;
                }
            }
        }
        types.sort_by(|a, b| {
            (a.milli, a.gpus, a.cpu_milli, a.memory_mib, a.model_set).cmp(&(
                b.milli,
                b.gpus,
                b.cpu_milli,
                b.memory_mib,
                b.model_set,
            ))
        });
        Workload {
            types,
            model_sets,
            pressure: Vec::new(),
        }
    }
}

/// The expected workloads of the two fragmentation policies at one moment, from a model;
/// what a pass of an allocator scores with.
#[derive(Clone, Debug, Default)]
pub struct PolicyWorkloads {
    fgd: Option<Workload>,
    fragaware: Option<Workload>,
}

/// The policy that runs for the one asked for, with its workload ([`PolicyWorkloads::resolve`]).
#[derive(Clone, Copy, Debug)]
pub struct Resolved<'a> {
    pub policy: Policy,
    pub workload: Option<&'a Workload>,
    /// The asked policy could not run: it fell back to [`Resolved::policy`].
    pub fell_back_from: Option<Policy>,
}

impl Resolved<'_> {
    /// Why the policy fell back, in words (for an Event or a log line).
    pub fn note(&self) -> Option<String> {
        self.fell_back_from.map(|asked| {
            format!(
                "policy {asked} has no workload model yet (no request holding a GPU seen lately), placed by {}",
                self.policy
            )
        })
    }
}

impl PolicyWorkloads {
    /// Both workloads from `model` at `now` (none without a model).
    pub fn of(model: Option<&WorkloadModel>, now: i64) -> Self {
        let of = |p: Policy| model.and_then(|m| m.workload(p, now));
        PolicyWorkloads {
            fgd: of(Policy::FGD),
            fragaware: of(Policy::FRAGAWARE),
        }
    }

    /// The policy that runs for `policy`, with its workload. The fallback rule: a policy
    /// that needs a workload the model cannot give yet (no request holding a GPU seen in
    /// the window) runs as `binpack` at node level, keeping its GPU level.
    pub fn resolve(&self, policy: Policy) -> Resolved<'_> {
        let workload = match policy.node {
            NodePolicy::Fgd => self.fgd.as_ref(),
            NodePolicy::FragAware => self.fragaware.as_ref(),
            _ => {
                return Resolved {
                    policy,
                    workload: None,
                    fell_back_from: None,
                };
            }
        };
        match workload {
            Some(w) => Resolved {
                policy,
                workload: Some(w),
                fell_back_from: None,
            },
            None => Resolved {
                policy: Policy {
                    node: NodePolicy::Binpack,
                    ..policy
                },
                workload: None,
                fell_back_from: Some(policy),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(3600);

    #[test]
    fn a_request_is_counted_once_and_weighs_half_after_a_half_life() {
        let mut m = WorkloadModel::new(H);
        m.observe("a", (0, 0, 1, 500), 0);
        m.observe("a", (0, 0, 1, 500), 3600); // seen again on a later pass: ignored
        m.observe("b", (0, 0, 1, 250), 3600);
        let w = m.weights(3600);
        assert_eq!(w.len(), 2);
        assert!((w[&(0, 0, 1, 500)] - 0.5).abs() < 1e-12, "{w:?}");
        assert!((w[&(0, 0, 1, 250)] - 1.0).abs() < 1e-12, "{w:?}");
        // The mix: the new kind weighs twice the old one.
        let wl = m
            .workload(Policy::FRAGAWARE, 3600)
            .expect("a GPU kind was seen");
        let p = |milli| wl.types.iter().find(|t| t.milli == milli).unwrap().weight;
        assert!((p(250) - 2.0 / 3.0).abs() < 1e-12);
        assert!((p(500) - 1.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn rebuilt_from_the_survivors_equals_the_live_model() {
        // Live: requests arrive one by one over two hours, the model asked on every pass.
        let arrivals: Vec<(String, Kind, i64)> = (0..200)
            .map(|i| {
                let kind = (
                    0,
                    0,
                    1 + (i % 3) as u32,
                    [100, 250, 500, 1000][(i % 4) as usize],
                );
                (format!("claim-{i}"), kind, i * 36)
            })
            .collect();
        let mut live = WorkloadModel::new(H);
        for (id, kind, at) in &arrivals {
            live.observe(id, *kind, *at);
            let _ = live.workload(Policy::FRAGAWARE, *at);
        }
        // Rebuilt: a fresh model told about the same requests at once, in another order.
        let mut rebuilt = WorkloadModel::new(H);
        for (id, kind, at) in arrivals.iter().rev() {
            rebuilt.observe(id, *kind, *at);
        }
        let now = 7200;
        for policy in [Policy::FRAGAWARE, Policy::FGD] {
            assert_eq!(live.workload(policy, now), rebuilt.workload(policy, now));
        }
    }

    #[test]
    fn no_gpu_kind_means_no_workload_and_plain_policies_need_none() {
        let mut m = WorkloadModel::new(H);
        assert_eq!(m.workload(Policy::FRAGAWARE, 0), None);
        m.observe("cpu", (4000, 1024, 0, 0), 0);
        assert_eq!(m.workload(Policy::FRAGAWARE, 0), None, "no GPU kind yet");
        m.observe("gpu", (0, 0, 1, 300), 0);
        assert!(m.workload(Policy::FRAGAWARE, 0).is_some());
        assert_eq!(m.workload(Policy::BINPACK, 0), None);
    }

    #[test]
    fn fgd_drops_memory_and_the_rare_kinds_fragaware_keeps_all() {
        let mut m = WorkloadModel::new(H);
        for i in 0..97 {
            m.observe(&format!("common-{i}"), (0, 100 + i, 1, 500), 0);
        }
        for i in 0..3 {
            m.observe(&format!("rare-{i}"), (0, 0, 8, 1000), 0);
        }
        let fgd = m.workload(Policy::FGD, 0).unwrap();
        assert_eq!(fgd.types.len(), 1, "memory merged, the 3 % cut: {fgd:?}");
        assert_eq!((fgd.types[0].gpus, fgd.types[0].memory_mib), (1, 0));
        let fa = m.workload(Policy::FRAGAWARE, 0).unwrap();
        assert_eq!(fa.types.len(), MAX_KINDS, "capped: {}", fa.types.len());
        // The cap keeps the heaviest kind (the 8-GPU one weighs 3, each other 1).
        assert!(fa.types.iter().any(|t| t.gpus == 8));
        let sum: f64 = fa.types.iter().map(|t| t.weight).sum();
        assert!((sum - 1.0).abs() < 1e-9);
    }

    #[test]
    fn old_requests_are_pruned_and_weigh_nothing_before() {
        let mut m = WorkloadModel::new(Duration::from_secs(10));
        m.observe("old", (0, 0, 1, 500), 0);
        m.observe("new", (0, 0, 1, 250), 1000);
        assert_eq!(m.len(), 2);
        m.prune(1000);
        assert!(!m.contains("old") && m.contains("new"));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn from_pods_is_from_weighted_with_unit_weights() {
        let pods = [
            (0, 0, 1, 500),
            (0, 0, 1, 500),
            (1000, 0, 2, 1000),
            (0, 0, 0, 0),
        ];
        for cov in [0.5, 0.95, 1.0] {
            let a = Workload::from_pods(pods, cov, Weighting::GpuDemand);
            let b = Workload::from_weighted(
                pods.iter().map(|k| (*k, 1.0)),
                cov,
                Weighting::GpuDemand,
                usize::MAX,
            );
            assert_eq!(a, b, "coverage {cov}");
        }
    }

    #[test]
    fn policies_fall_back_without_a_model() {
        let empty = PolicyWorkloads::of(None, 0);
        let r = empty.resolve(Policy::FRAGAWARE);
        assert_eq!(
            (r.policy, r.fell_back_from),
            (Policy::BINPACK, Some(Policy::FRAGAWARE))
        );
        assert!(r.note().unwrap().contains("placed by binpack"));
        let spread_gpus: Policy = "fgd/spread".parse().unwrap();
        assert_eq!(
            empty.resolve(spread_gpus).policy.to_string(),
            "binpack/spread"
        );
        assert!(empty.resolve(Policy::SPREAD).fell_back_from.is_none());
        let mut m = WorkloadModel::new(H);
        m.observe("a", (0, 0, 1, 500), 0);
        let some = PolicyWorkloads::of(Some(&m), 0);
        let r = some.resolve(Policy::FRAGAWARE);
        assert_eq!(r.policy, Policy::FRAGAWARE);
        assert!(r.workload.is_some() && r.note().is_none());
    }
}
