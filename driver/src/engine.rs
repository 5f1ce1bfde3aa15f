//! The allocation engine: which GPUs of which node a request gets.
//!
//! Pure functions over an [`Inventory`] snapshot (nodes → GPUs with their total and free
//! capacity). One request is evaluated at a time: [`evaluate_node`] says whether a node can
//! host the request, on which GPUs, and with which score under a [`Policy`]; [`evaluate`]
//! does it for every node; [`choose`] picks the best node. The caller (the DRA controller,
//! the scheduler extender, the trace simulator) records the decision in a
//! [`crate::ledger::Ledger`], which keeps the inventory's free values current.
//!
//! Policies (all scores: higher is better):
//!
//! * `binpack` / `spread`: HAMi's meaning at node level (prefer the node whose GPUs are the
//!   most / least used after the placement) and at GPU level (prefer the most / least used
//!   GPUs that fit). They can be combined freely ([`NodePolicy`] × [`GpuPolicy`]).
//! * `gpupacking`: the FGD paper's GpuPacking baseline (shared GPUs first, then idle GPUs
//!   of used nodes, then idle nodes, in integer tiers).
//! * `bestfit`: the FGD paper's BestFit baseline: the node whose free CPU and free GPU after
//!   the placement are smallest (normalised by the largest node of the cluster).
//! * `fgd`: the FGD paper's Fragmentation Gradient Descent, faithfully (including its
//!   quantised score), as a baseline.
//! * `fragaware`: our fragmentation-aware policy (FGD's measure over every kind with host
//!   memory, plus the GPU capacity that the node's free CPU and memory cannot feed at the
//!   workload's average rate; a linear gradient at FGD's resolution; pods without GPUs placed
//!   where the fewest GPUs are free); see `docs/engine.md` and [`frag`].
//!
//! Any policy can add the usage-aware term ([`load`], off unless
//! [`ScoreContext::usage_weight`] is above 0): it prefers GPUs whose measured load leaves
//! the request's core quota real headroom.
//!
//! The simulator evaluates tens of millions of nodes with it, the scheduler extender 5,000
//! per request: evaluating a node allocates nothing but the [`Placement`] it returns. The
//! lists it works in (the GPUs that fit, the measure's free levels) live in a per-thread
//! scratch that each evaluation refills, and model names are compared without copies.

pub mod frag;
pub mod load;
pub mod model;

pub use frag::{MeanGpuPod, Weighting, Workload, WorkloadType};
pub use model::WorkloadModel;

use std::fmt;

/// Milli-GPU: 1000 is one whole GPU.
pub const MILLI: u32 = 1000;

/// One GPU as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Device name on its node (e.g. `gpu-0`); unique within the node.
    pub id: String,
    /// The GPU's UUID (`GPU-...`); unique in the cluster.
    pub uuid: String,
    /// Product name (e.g. `NVIDIA A100-SXM4-80GB`, or a trace's `G2`).
    pub model: String,
    /// The driver's index of the GPU on its node (NVML's), where known; labels only, the
    /// engine never reads it.
    pub index: Option<u32>,
    /// NUMA node the GPU is attached to, where known.
    pub numa: Option<u32>,
    /// PCIe root complex (or switch) the GPU sits under, where known.
    pub pcie_root: Option<String>,
    /// An unhealthy GPU is never chosen.
    pub healthy: bool,
    /// Device taints from the slice; one with effect `NoSchedule` or `NoExecute` keeps
    /// every request off the GPU that does not tolerate it ([`Request::tolerations`]).
    pub taints: Vec<Taint>,
    /// Device memory in bytes.
    pub memory_total: u64,
    /// Device memory not granted to anyone, in bytes.
    pub memory_free: u64,
    /// Compute capacity in percent of the SMs (100 for a whole GPU).
    pub cores_total: u32,
    /// Compute not granted to anyone.
    pub cores_free: u32,
    /// Measured SM load in percent (the sum over the claims on it of what the node
    /// monitor measured lately); `None` when unknown. Only the usage-aware term reads it
    /// ([`load`]); fit and the policies' scores never do.
    pub measured_load: Option<u16>,
}

impl Gpu {
    /// A healthy, unused GPU.
    pub fn new(id: impl Into<String>, model: impl Into<String>, memory_total: u64) -> Self {
        let id = id.into();
        Self {
            uuid: format!("GPU-{id}"),
            id,
            model: model.into(),
            index: None,
            numa: None,
            pcie_root: None,
            healthy: true,
            taints: Vec::new(),
            memory_total,
            memory_free: memory_total,
            cores_total: 100,
            cores_free: 100,
            measured_load: None,
        }
    }

    /// True when nothing of this GPU is granted.
    pub fn is_idle(&self) -> bool {
        self.memory_free == self.memory_total && self.cores_free == self.cores_total
    }

    /// Free capacity in milli-GPU: the smaller of the free memory share and the free compute
    /// share, rounded down. The fragmentation measure works on this one-dimensional level.
    pub fn free_milli(&self) -> u32 {
        let mem = if self.memory_total == 0 {
            0
        } else {
            (u128::from(self.memory_free) * u128::from(MILLI) / u128::from(self.memory_total))
                as u32
        };
        let cores = if self.cores_total == 0 {
            0
        } else {
            (u64::from(self.cores_free) * u64::from(MILLI) / u64::from(self.cores_total)) as u32
        };
        mem.min(cores)
    }
}

/// One node: its host resources (where known) and its GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    /// CPU capacity in milli-cores; `None` when unknown (then CPU is not checked).
    pub cpu_milli_total: Option<u64>,
    pub cpu_milli_free: Option<u64>,
    /// Host memory in MiB; `None` when unknown (then memory is not checked).
    pub memory_mib_total: Option<u64>,
    pub memory_mib_free: Option<u64>,
    pub gpus: Vec<Gpu>,
}

impl Node {
    /// A node with no known host resources.
    pub fn new(name: impl Into<String>, gpus: Vec<Gpu>) -> Self {
        Self {
            name: name.into(),
            cpu_milli_total: None,
            cpu_milli_free: None,
            memory_mib_total: None,
            memory_mib_free: None,
            gpus,
        }
    }

    /// Sets CPU (milli-cores) and memory (MiB) capacity, all free.
    pub fn with_host(mut self, cpu_milli: u64, memory_mib: u64) -> Self {
        self.cpu_milli_total = Some(cpu_milli);
        self.cpu_milli_free = Some(cpu_milli);
        self.memory_mib_total = Some(memory_mib);
        self.memory_mib_free = Some(memory_mib);
        self
    }

    fn host_fits(&self, req: &Request) -> bool {
        self.cpu_milli_free.is_none_or(|f| f >= req.cpu_milli)
            && self.memory_mib_free.is_none_or(|f| f >= req.memory_mib)
    }
}

/// A snapshot of the cluster's GPU nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    pub nodes: Vec<Node>,
}

impl Inventory {
    /// Index of the node with this name.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }
    /// Largest CPU capacity and GPU count of any node (BestFit's normalisation).
    pub fn max_spec(&self) -> MaxSpec {
        MaxSpec {
            cpu_milli: self
                .nodes
                .iter()
                .filter_map(|n| n.cpu_milli_total)
                .max()
                .unwrap_or(0),
            gpus: self.nodes.iter().map(|n| n.gpus.len()).max().unwrap_or(0) as u32,
        }
    }
}

/// The largest node of a cluster, used to normalise BestFit's score.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaxSpec {
    pub cpu_milli: u64,
    pub gpus: u32,
}

/// How much of each GPU a request wants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuShare {
    /// Whole GPUs: only idle GPUs fit, and all their memory and cores are granted.
    Whole,
    /// A fraction of each GPU in milli-GPU (1..=1000): that share of the GPU's memory.
    Fraction { milli: u32 },
    /// An amount of memory per GPU, in bytes.
    Memory { bytes: u64 },
}

/// Topology constraint between the GPUs of one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Topology {
    #[default]
    Any,
    /// All GPUs on one NUMA node (GPUs of unknown NUMA node never qualify).
    SameNuma,
    /// All GPUs under one PCIe root (GPUs of unknown root never qualify).
    SamePcieRoot,
}

/// One allocation request: a pod's (or a claim's) GPU and host needs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    /// Number of GPUs; 0 for a request that only needs CPU and memory.
    pub gpus: u32,
    pub share: GpuShare,
    /// Percent of each GPU's SMs; `None` reserves none (no core quota).
    pub cores: Option<u32>,
    /// Host CPU in milli-cores and memory in MiB.
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Allowed GPU models (substring match, case-insensitive); empty allows all.
    pub model_include: Vec<String>,
    /// Refused GPU models (substring match, case-insensitive).
    pub model_exclude: Vec<String>,
    /// Only these GPU UUIDs; empty allows all.
    pub uuid_pin: Vec<String>,
    pub topology: Topology,
    /// Device taints this request tolerates (DRA's `tolerations`).
    pub tolerations: Vec<Toleration>,
}

/// A device taint (`key=value:effect`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Taint {
    /// Qualified key.
    pub key: String,
    /// Value; may be empty.
    pub value: String,
    /// `None`, `NoSchedule` or `NoExecute`.
    pub effect: String,
}

impl Taint {
    /// Whether the taint keeps new allocations off the device (`NoSchedule`, `NoExecute`).
    pub fn repels(&self) -> bool {
        matches!(self.effect.as_str(), "NoSchedule" | "NoExecute")
    }
}

/// A toleration of device taints, with the Kubernetes rules: an empty key with `Exists`
/// tolerates every taint; `Exists` ignores the value, `Equal` (the default) compares it; an
/// empty effect matches every effect.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Toleration {
    /// Key to match; empty matches all keys (only with `exists`).
    pub key: String,
    /// Operator `Exists` (true) or `Equal` (false).
    pub exists: bool,
    /// Value to compare under `Equal`.
    pub value: String,
    /// Effect to match; empty matches all.
    pub effect: String,
}

impl Toleration {
    /// Whether this toleration tolerates `t`.
    pub fn tolerates(&self, t: &Taint) -> bool {
        let key = if self.key.is_empty() {
            self.exists
        } else {
            self.key == t.key
        };
        let value = self.exists || self.value == t.value;
        let effect = self.effect.is_empty() || self.effect == t.effect;
        key && value && effect
    }
}

impl Request {
    /// `gpus` GPUs with `share` each, no host needs, no constraints.
    pub fn new(gpus: u32, share: GpuShare) -> Self {
        Self {
            gpus,
            share,
            cores: None,
            cpu_milli: 0,
            memory_mib: 0,
            model_include: Vec::new(),
            model_exclude: Vec::new(),
            uuid_pin: Vec::new(),
            topology: Topology::Any,
            tolerations: Vec::new(),
        }
    }
    /// The FGD trace's request shape: `num_gpu` GPUs of `gpu_milli` each (1000 = whole).
    pub fn from_trace(cpu_milli: u64, memory_mib: u64, num_gpu: u32, gpu_milli: u32) -> Self {
        let share = if num_gpu == 0 || gpu_milli >= MILLI {
            GpuShare::Whole
        } else {
            GpuShare::Fraction { milli: gpu_milli }
        };
        Self {
            cpu_milli,
            memory_mib,
            ..Self::new(num_gpu, share)
        }
    }

    /// Memory and cores this request takes from `gpu`.
    pub fn per_gpu(&self, gpu: &Gpu) -> (u64, u32) {
        match self.share {
            GpuShare::Whole => (gpu.memory_total, gpu.cores_total),
            GpuShare::Fraction { milli } => {
                let mem = (u128::from(gpu.memory_total) * u128::from(milli.min(MILLI)))
                    .div_ceil(u128::from(MILLI)) as u64;
                (mem, self.cores.unwrap_or(0))
            }
            GpuShare::Memory { bytes } => (bytes, self.cores.unwrap_or(0)),
        }
    }

    /// The per-GPU demand in milli-GPU on `gpu` (what the fragmentation measure compares).
    pub fn milli_on(&self, gpu: &Gpu) -> u32 {
        match self.share {
            GpuShare::Whole => MILLI,
            GpuShare::Fraction { milli } => milli.min(MILLI),
            GpuShare::Memory { bytes } => {
                if gpu.memory_total == 0 {
                    MILLI
                } else {
                    (u128::from(bytes) * u128::from(MILLI))
                        .div_ceil(u128::from(gpu.memory_total))
                        .min(u128::from(MILLI)) as u32
                }
            }
        }
        .max(self.cores.map_or(0, |c| c.saturating_mul(10)).min(MILLI))
    }

    /// The taints of `gpu` that keep this request off it: `NoSchedule`/`NoExecute` ones it
    /// does not tolerate.
    pub fn repelled_by<'g>(&self, gpu: &'g Gpu) -> impl Iterator<Item = &'g Taint> {
        gpu.taints
            .iter()
            .filter(|t| t.repels() && !self.tolerations.iter().any(|tol| tol.tolerates(t)))
    }

    fn gpu_allowed(&self, gpu: &Gpu) -> bool {
        if !gpu.healthy {
            return false;
        }
        if self.repelled_by(gpu).next().is_some() {
            return false;
        }
        if !self.uuid_pin.is_empty() && !self.uuid_pin.contains(&gpu.uuid) {
            return false;
        }
        if !self.model_include.is_empty()
            && !self
                .model_include
                .iter()
                .any(|m| model_matches(&gpu.model, m))
        {
            return false;
        }
        !self
            .model_exclude
            .iter()
            .any(|m| model_matches(&gpu.model, m))
    }

    /// Whether `gpu` can take one share of this request now.
    pub fn gpu_fits(&self, gpu: &Gpu) -> bool {
        if !self.gpu_allowed(gpu) {
            return false;
        }
        if self.share == GpuShare::Whole {
            return gpu.is_idle();
        }
        let (mem, cores) = self.per_gpu(gpu);
        gpu.memory_free >= mem && gpu.cores_free >= cores && mem > 0
    }
}

/// Whether GPU model `model` contains `pattern`, ignoring ASCII case (the rule of
/// [`Request::model_include`] and [`Request::model_exclude`]). Allocates nothing: it runs
/// for every GPU of every node a constrained request is evaluated on.
pub fn model_matches(model: &str, pattern: &str) -> bool {
    let (hay, needle) = (model.as_bytes(), pattern.as_bytes());
    needle.is_empty()
        || hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Node-level policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodePolicy {
    Binpack,
    Spread,
    BestFit,
    /// The FGD paper's GpuPacking baseline (its three integer score tiers).
    GpuPacking,
    Fgd,
    FragAware,
}

/// GPU-level policy (which GPUs of the chosen node). The fragmentation policies choose
/// GPUs by their own measure and use this only to order candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuPolicy {
    Binpack,
    Spread,
}

/// A placement policy: node level and GPU level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    pub node: NodePolicy,
    pub gpu: GpuPolicy,
}

impl Policy {
    pub const BINPACK: Policy = Policy {
        node: NodePolicy::Binpack,
        gpu: GpuPolicy::Binpack,
    };
    pub const SPREAD: Policy = Policy {
        node: NodePolicy::Spread,
        gpu: GpuPolicy::Spread,
    };
    pub const BESTFIT: Policy = Policy {
        node: NodePolicy::BestFit,
        gpu: GpuPolicy::Binpack,
    };
    pub const GPUPACKING: Policy = Policy {
        node: NodePolicy::GpuPacking,
        gpu: GpuPolicy::Binpack,
    };
    pub const FGD: Policy = Policy {
        node: NodePolicy::Fgd,
        gpu: GpuPolicy::Binpack,
    };
    pub const FRAGAWARE: Policy = Policy {
        node: NodePolicy::FragAware,
        gpu: GpuPolicy::Binpack,
    };

    /// Every named policy, in the order `--policy all` runs them.
    pub const ALL: [(&'static str, Policy); 6] = [
        ("binpack", Policy::BINPACK),
        ("spread", Policy::SPREAD),
        ("gpupacking", Policy::GPUPACKING),
        ("bestfit", Policy::BESTFIT),
        ("fgd", Policy::FGD),
        ("fragaware", Policy::FRAGAWARE),
    ];

    /// Whether the policy needs a [`Workload`] in its [`ScoreContext`].
    pub fn needs_workload(&self) -> bool {
        matches!(self.node, NodePolicy::Fgd | NodePolicy::FragAware)
    }
}

/// Unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown policy {0:?}: valid are binpack, spread, gpupacking, bestfit, fgd, fragaware, \
     or <node>/<gpu> with node in binpack|spread|gpupacking|bestfit|fgd|fragaware and gpu in \
     binpack|spread"
)]
pub struct UnknownPolicy(pub String);

impl std::str::FromStr for Policy {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        if let Some((_, p)) = Policy::ALL.iter().find(|(n, _)| *n == lower) {
            return Ok(*p);
        }
        let bad = || UnknownPolicy(s.to_string());
        let (n, g) = lower.split_once('/').ok_or_else(bad)?;
        let node = match n {
            "binpack" => NodePolicy::Binpack,
            "spread" => NodePolicy::Spread,
            "bestfit" => NodePolicy::BestFit,
            "gpupacking" => NodePolicy::GpuPacking,
            "fgd" => NodePolicy::Fgd,
            "fragaware" => NodePolicy::FragAware,
            _ => return Err(bad()),
        };
        let gpu = match g {
            "binpack" => GpuPolicy::Binpack,
            "spread" => GpuPolicy::Spread,
            _ => return Err(bad()),
        };
        Ok(Policy { node, gpu })
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((n, _)) = Policy::ALL.iter().find(|(_, p)| p == self) {
            return f.write_str(n);
        }
        let n = match self.node {
            NodePolicy::Binpack => "binpack",
            NodePolicy::Spread => "spread",
            NodePolicy::BestFit => "bestfit",
            NodePolicy::GpuPacking => "gpupacking",
            NodePolicy::Fgd => "fgd",
            NodePolicy::FragAware => "fragaware",
        };
        let g = match self.gpu {
            GpuPolicy::Binpack => "binpack",
            GpuPolicy::Spread => "spread",
        };
        write!(f, "{n}/{g}")
    }
}

/// What scoring needs beyond the node and the request.
#[derive(Clone, Copy, Debug)]
pub struct ScoreContext<'a> {
    /// Expected workload (required by `fgd` and `fragaware`; without it they score like
    /// `binpack`).
    pub workload: Option<&'a Workload>,
    /// The cluster's largest node (BestFit's normalisation).
    pub max_spec: MaxSpec,
    /// Weight of the usage-aware term ([`load`]): above 0, `weight × term` (the term in
    /// `[−1, 1]`) is added to each placement's score and, on a node, the GPU with more
    /// headroom is taken among GPUs the policy cannot tell apart. 0 (or below) turns it
    /// off: placements are exactly those without the term.
    pub usage_weight: f64,
}

/// A feasible placement of a request on one node.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Index of the node in the inventory.
    pub node: usize,
    /// Indices of the chosen GPUs in the node's `gpus`.
    pub gpus: Vec<usize>,
    /// Score under the policy; higher is better. Comparable only between placements of
    /// the same request under the same policy.
    pub score: f64,
}

/// Why no node can host a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoFit {
    #[error("the request is invalid: {0}")]
    Invalid(&'static str),
    #[error("no node has enough free GPUs, CPU and memory for the request ({nodes} nodes checked)")]
    Insufficient { nodes: usize },
}

/// Checks a request's own consistency.
pub fn validate(req: &Request) -> Result<(), NoFit> {
    match req.share {
        GpuShare::Fraction { milli } if milli == 0 || milli > MILLI => {
            return Err(NoFit::Invalid("a fraction must be 1..=1000 milli-GPU"));
        }
        GpuShare::Memory { bytes: 0 } => {
            return Err(NoFit::Invalid("a memory share must be more than 0 bytes"));
        }
        _ => {}
    }
    if req.cores.is_some_and(|c| c > 100) {
        return Err(NoFit::Invalid("cores is a percent: 0..=100"));
    }
    Ok(())
}

/// Evaluates one node: `None` when the request does not fit there, else the chosen GPUs
/// and the node's score under `policy`.
pub fn evaluate_node(
    inv_index: usize,
    node: &Node,
    req: &Request,
    policy: Policy,
    ctx: &ScoreContext<'_>,
) -> Option<Placement> {
    if !node.host_fits(req) {
        return None;
    }
    with_scratch(|s| {
        let Scratch { fit, frag } = s;
        if req.gpus == 0 {
            let score = score_host_only(node, req, policy, ctx, frag);
            return Some(Placement {
                node: inv_index,
                gpus: Vec::new(),
                score,
            });
        }
        fit.clear();
        fit.extend((0..node.gpus.len()).filter(|&i| req.gpu_fits(&node.gpus[i])));
        if fit.len() < req.gpus as usize {
            return None;
        }
        let (mut gpus, mut score) = match (policy.node, ctx.workload) {
            (NodePolicy::Fgd, Some(w)) => frag::place_fgd(node, req, fit, policy.gpu, w, frag)?,
            (NodePolicy::FragAware, Some(w)) => {
                frag::place_fragaware(node, req, fit, policy.gpu, w, frag)?
            }
            _ => {
                let gpus = pick_gpus(node, req, fit, policy.gpu)?;
                let score = score_plain(node, req, &gpus, policy, ctx);
                (gpus, score)
            }
        };
        if ctx.usage_weight > 0.0 {
            load::prefer_headroom(node, req, fit, &mut gpus);
            score += ctx.usage_weight * load::placement_term(node, req, &gpus);
        }
        Some(Placement {
            node: inv_index,
            gpus,
            score,
        })
    })
}

/// Buffers that the evaluation of one node fills and the next one reuses, so that
/// evaluating a node allocates nothing but the [`Placement`] it returns once the buffers
/// have grown to the largest node's GPU count. One per thread ([`with_scratch`]).
#[derive(Debug, Default)]
struct Scratch {
    /// The GPUs of the node that can take the request.
    fit: Vec<usize>,
    /// The fragmentation measure's node states.
    frag: frag::Scratch,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Runs `f` with this thread's [`Scratch`]. A nested call (none today) gets a fresh one
/// rather than a panic.
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::default()),
    })
}

/// Evaluates every node; returns the feasible placements in node order.
pub fn evaluate(
    inv: &Inventory,
    req: &Request,
    policy: Policy,
    ctx: &ScoreContext<'_>,
) -> Vec<Placement> {
    inv.nodes
        .iter()
        .enumerate()
        .filter_map(|(i, n)| evaluate_node(i, n, req, policy, ctx))
        .collect()
}

/// The best placement: highest score; equal scores are broken by `tie_salt` (a seeded
/// random draw in the simulator, 0 for "lowest node index first" ordering by a fixed hash).
pub fn choose(
    inv: &Inventory,
    req: &Request,
    policy: Policy,
    ctx: &ScoreContext<'_>,
    tie_salt: u64,
) -> Result<Placement, NoFit> {
    validate(req)?;
    let all = evaluate(inv, req, policy, ctx);
    let best = best_index(all.iter().map(|p| (p.node, p.score)), tie_salt);
    match best {
        Some(node) => Ok(all.into_iter().find(|p| p.node == node).expect("present")),
        None => Err(NoFit::Insufficient {
            nodes: inv.nodes.len(),
        }),
    }
}

/// Relative tolerance under which two scores count as equal.
pub const SCORE_EPS: f64 = 1e-9;

/// Picks the node with the highest score among `(node, score)`; ties (within
/// [`SCORE_EPS`]) go to the node with the smallest `tie_hash(tie_salt, node)`.
pub fn best_index(items: impl Iterator<Item = (usize, f64)>, tie_salt: u64) -> Option<usize> {
    let mut best: Option<(usize, f64, u64)> = None;
    for (node, score) in items {
        let h = tie_hash(tie_salt, node);
        best = match best {
            None => Some((node, score, h)),
            Some((bn, bs, bh)) => {
                let tol = SCORE_EPS * bs.abs().max(1.0);
                if score > bs + tol || (score >= bs - tol && h < bh) {
                    Some((node, score, h))
                } else {
                    Some((bn, bs, bh))
                }
            }
        };
    }
    best.map(|b| b.0)
}

/// The order in which fgpu-controller tries nodes for a request: the higher score first,
/// equal scores (exactly, no [`SCORE_EPS`]) by the smaller index, that is inventory order
/// (nodes sorted by name). `fgpu-sim --as-controller` picks the first node of this order.
pub fn controller_order(a: (usize, f64), b: (usize, f64)) -> std::cmp::Ordering {
    b.1.partial_cmp(&a.1)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.0.cmp(&b.0))
}

/// The first of `(node, score)` in [`controller_order`].
pub fn controller_best(items: impl Iterator<Item = (usize, f64)>) -> Option<usize> {
    items
        .min_by(|a, b| controller_order(*a, *b))
        .map(|(n, _)| n)
}

/// A fixed mixing function (SplitMix64's finaliser) of salt and node index.
pub fn tie_hash(salt: u64, node: usize) -> u64 {
    let mut z = salt ^ (node as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Chooses `req.gpus` GPUs among `fit` by the GPU-level policy, honouring the topology
/// constraint. `None` when the topology cannot be met.
pub fn pick_gpus(node: &Node, req: &Request, fit: &[usize], gpu: GpuPolicy) -> Option<Vec<usize>> {
    let k = req.gpus as usize;
    let mut order: Vec<usize> = fit.to_vec();
    let key = |i: &usize| node.gpus[*i].free_milli();
    match gpu {
        GpuPolicy::Binpack => order.sort_by_key(|i| (key(i), *i)),
        GpuPolicy::Spread => order.sort_by_key(|i| (std::cmp::Reverse(key(i)), *i)),
    }
    match req.topology {
        Topology::Any => {
            order.truncate(k);
            Some(order)
        }
        Topology::SameNuma | Topology::SamePcieRoot => {
            // Candidate groups in order of their first member under the policy ordering:
            // the group holding the preferred GPU wins if it has room for all k. A group is
            // named by its leader, the position in `order` of its first member.
            let group = |i: usize| GroupKey::of(&node.gpus[i], req.topology);
            let mut best: Option<usize> = None;
            for (p, &i) in order.iter().enumerate() {
                let Some(grp) = group(i) else { continue };
                if order[..p].iter().any(|&j| group(j) == Some(grp)) {
                    continue; // not the group's leader: the group was looked at already
                }
                let members = order.iter().filter(|&&j| group(j) == Some(grp)).take(k);
                if members.count() == k {
                    // Binpack: the fullest group that fits (fewest free GPUs left over);
                    // spread: the first in policy order.
                    let better = match (best, gpu) {
                        (None, _) => true,
                        (Some(b), GpuPolicy::Binpack) => {
                            group_free(node, i, req) < group_free(node, order[b], req)
                        }
                        (Some(_), GpuPolicy::Spread) => false,
                    };
                    if better {
                        best = Some(p);
                    }
                }
            }
            let leader = order[best?];
            let grp = group(leader);
            order.retain(|&j| group(j) == grp);
            order.truncate(k);
            Some(order)
        }
    }
}

/// The topology group of a GPU (its NUMA node or PCIe root), borrowed from the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GroupKey<'a> {
    Numa(u32),
    PcieRoot(&'a str),
}

impl<'a> GroupKey<'a> {
    /// The group of `g` under `topology`; `None` when unknown (or for [`Topology::Any`]).
    fn of(g: &'a Gpu, topology: Topology) -> Option<Self> {
        match topology {
            Topology::Any => None,
            Topology::SameNuma => g.numa.map(GroupKey::Numa),
            Topology::SamePcieRoot => g.pcie_root.as_deref().map(GroupKey::PcieRoot),
        }
    }
}

/// Free milli-GPU of every GPU of `node` in the group of GPU `leader`.
fn group_free(node: &Node, leader: usize, req: &Request) -> u64 {
    let first = &node.gpus[leader];
    node.gpus
        .iter()
        .filter(|g| match req.topology {
            Topology::SameNuma => g.numa == first.numa,
            _ => g.pcie_root == first.pcie_root,
        })
        .map(|g| u64::from(g.free_milli()))
        .sum()
}

/// GPU usage of a node after placing `req` on `gpus`, in [0, 1].
fn gpu_used_after(node: &Node, req: &Request, gpus: &[usize]) -> f64 {
    let total = node.gpus.len() as u64 * u64::from(MILLI);
    if total == 0 {
        return 0.0;
    }
    let free: u64 = node.gpus.iter().map(|g| u64::from(g.free_milli())).sum();
    let took: u64 = gpus
        .iter()
        .map(|&i| u64::from(req.milli_on(&node.gpus[i])))
        .sum();
    (total - free.saturating_sub(took).min(total)) as f64 / total as f64
}

fn cpu_used_after(node: &Node, req: &Request) -> f64 {
    match (node.cpu_milli_total, node.cpu_milli_free) {
        (Some(t), Some(f)) if t > 0 => {
            (t - f.saturating_sub(req.cpu_milli).min(t)) as f64 / t as f64
        }
        _ => 0.0,
    }
}

fn score_host_only(
    node: &Node,
    req: &Request,
    policy: Policy,
    ctx: &ScoreContext<'_>,
    scratch: &mut frag::Scratch,
) -> f64 {
    match policy.node {
        NodePolicy::Spread => 1.0 - cpu_used_after(node, req),
        NodePolicy::BestFit => bestfit_score(node, req, &[], ctx.max_spec),
        // The paper's GpuPacking gives pods without GPUs the minimum score everywhere.
        NodePolicy::GpuPacking => 0.0,
        NodePolicy::Fgd => match ctx.workload {
            Some(w) => frag::fgd_host_only(node, req, w, scratch),
            None => cpu_used_after(node, req),
        },
        // Needs no workload: the fewest free GPUs wins (see `frag`).
        NodePolicy::FragAware => frag::fragaware_host_only(node),
        NodePolicy::Binpack => cpu_used_after(node, req),
    }
}

fn score_plain(
    node: &Node,
    req: &Request,
    gpus: &[usize],
    policy: Policy,
    ctx: &ScoreContext<'_>,
) -> f64 {
    match policy.node {
        NodePolicy::Spread => 1.0 - gpu_used_after(node, req, gpus),
        NodePolicy::BestFit => bestfit_score(node, req, gpus, ctx.max_spec),
        NodePolicy::GpuPacking => gpupacking_score(node, gpus),
        _ => binpack_score(node, req, gpus),
    }
}

/// Binpack: first GPUs that are already shared, then idle GPUs of a node already in use,
/// then an idle node; within each tier, the node whose GPUs are the most used after the
/// placement (HAMi's node binpack).
fn binpack_score(node: &Node, req: &Request, gpus: &[usize]) -> f64 {
    let tier = if gpus.iter().all(|&i| !node.gpus[i].is_idle()) {
        2.0
    } else if node.gpus.iter().any(|g| !g.is_idle()) {
        1.0
    } else {
        0.0
    };
    tier + gpu_used_after(node, req, gpus)
}

/// The FGD paper's GpuPacking, as its scheduler plugin scores (integers, higher is better):
/// a node whose GPUs are all idle gets `max(33 − GPUs, GPUs)` (small idle nodes first);
/// a used node on which the request needs `k` idle GPUs gets `max(50 − k, 33)`; a request
/// that fits on already shared GPUs gets `max(100 − Σ free% of those GPUs / 10, 50)`.
/// `gpus` are the GPUs chosen (the least free that fit, as its GPU allocator does).
fn gpupacking_score(node: &Node, gpus: &[usize]) -> f64 {
    let total = node.gpus.len() as i64;
    let idle = |g: &Gpu| g.free_milli() == MILLI;
    let fully_free = node.gpus.iter().filter(|g| idle(g)).count() as i64;
    let score = if fully_free == total {
        (33 - fully_free).max(fully_free)
    } else {
        let idle_used = gpus.iter().filter(|&&i| idle(&node.gpus[i])).count() as i64;
        if idle_used > 0 {
            (50 - idle_used).max(33)
        } else {
            let free_pct: i64 = gpus
                .iter()
                .map(|&i| i64::from(node.gpus[i].free_milli()) * 100 / i64::from(MILLI))
                .sum();
            (100 - free_pct / 10).max(50)
        }
    };
    score as f64
}

/// The FGD paper's BestFit: `100 * (1 - (½·cpu_left/max_cpu + ½·gpu_left/max_gpu))`,
/// truncated to an integer as the paper's scheduler plugin does.
fn bestfit_score(node: &Node, req: &Request, gpus: &[usize], max: MaxSpec) -> f64 {
    let cpu_left = node
        .cpu_milli_free
        .map_or(0, |f| f.saturating_sub(req.cpu_milli)) as f64;
    let free: u64 = node.gpus.iter().map(|g| u64::from(g.free_milli())).sum();
    let took: u64 = gpus
        .iter()
        .map(|&i| u64::from(req.milli_on(&node.gpus[i])))
        .sum();
    let gpu_left = free.saturating_sub(took) as f64;
    let max_cpu = (max.cpu_milli.max(1)) as f64;
    let max_gpu = (u64::from(max.gpus.max(1)) * u64::from(MILLI)) as f64;
    let s = 0.5 * cpu_left / max_cpu + 0.5 * gpu_left / max_gpu;
    ((1.0 - s) * 100.0).trunc()
}

#[cfg(test)]
mod tests;
