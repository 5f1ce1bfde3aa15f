//! One pass of the allocation controller over a snapshot of the cluster → the writes to
//! make. Pure: the daemon ([`crate::daemon`]) takes the snapshot from its reflectors, calls
//! [`plan`], and performs the [`Action`]s, each conditional on the resource version it was
//! planned from.
//!
//! The rules, in the order [`plan`] applies them:
//!
//! 1. **Ledger**: the inventory from this driver's ResourceSlices, every allocated claim
//!    (this controller's and kube-scheduler's) granted in it ([`crate::usage::rebuild`]),
//!    committed claims first. A claim is *tentative* while it carries this controller's
//!    finalizer, is not reserved, and every live pod using it still carries the gate
//!    (nothing has used the allocation yet); every other allocated claim is committed.
//!    Tentative claims are granted after, oldest allocation first; one that no longer fits
//!    (kube-scheduler granted the same capacity in the same moment: the two allocators
//!    share no lock) is revoked ([`Action::Revoke`]): its allocation is cleared and a later
//!    pass places it again. Its pod stays gated meanwhile.
//! 2. **Release**: a claim carrying this controller's finalizer whose `status.reservedFor`
//!    is empty and that no live pod (not `Succeeded`/`Failed`) references is released: its
//!    allocation is cleared (unless the claim is being deleted) and the finalizer removed.
//! 3. **Allocate**: for every pod carrying the scheduling gate (oldest first), each of its
//!    claims of the shared class that exists, is not allocated and is not being deleted is
//!    turned into a request ([`crate::request`]), placed by the engine and written
//!    ([`crate::allocation`]). The ledger takes each planned grant at once, so one pass
//!    never grants the same memory twice; a write that fails leaves the ledger
//!    over-counted until the next pass, never under-counted. The claims of one pod are kept
//!    on one node (the node of its claims already allocated). A claim that does not fit
//!    yields [`Action::Pending`] with the best candidate; a claim that cannot be read yields
//!    [`Action::Rejected`].
//! 4. **Ungate**: a gated pod whose claims of the shared class all exist, are allocated
//!    (before this pass), have *settled* (their allocation is older than the daemon's
//!    settle time, [`Snapshot::unsettled`]) and still fit (rule 1) loses the gate;
//!    kube-scheduler then places it on the allocation's node. Settling covers the other
//!    direction of the race: a grant kube-scheduler had decided but not yet written when
//!    this controller wrote its own lands within that time, and rule 1 then revokes the
//!    controller's claim, not the scheduler's. A pod whose template claims are not created
//!    yet keeps its gate.
//! 5. **Retry**: a pod without the gate and not yet bound to a node, with a claim of the
//!    shared class that carries this controller's finalizer but no allocation, lost that
//!    allocation to kube-scheduler (it clears allocations when the pod fits nowhere,
//!    reference `dra.md` §4): the claim is allocated again as in 3, away from the nodes in
//!    [`Snapshot::avoid`] ([`Action::Allocate`] with `retry`; the caller backs off).
//!
//! Claims of the MIG class (`mig.<driver>`) go through the same rules, but not through the
//! ledger: every allocated claim's MIG placements are marked taken ([`crate::mig`];
//! one that cannot be, such as two claims on overlapping placements, is reported with the
//! claims left out of the ledger), and rule 3 places a pending one with
//! [`crate::mig::MigInventory::choose`] ([`place_mig`]), taking the placement at once so
//! that one pass never hands out overlapping placements.
//!
//! Shares never go to a GPU published in `whole` mode ([`inventory::is_whole_mode`]): it
//! takes whole-GPU requests only.
//!
//! Other pending claims of pods without the gate are kube-scheduler's and left alone.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use fgpu_api::dra::claim::ResourceClaim;
use fgpu_api::dra::class::DeviceClass;
use fgpu_api::dra::slice::ResourceSlice;
use fgpu_api::names::DriverName;
use fgpu_driver::engine::model::{Kind, PolicyWorkloads as Workloads};
use fgpu_driver::engine::{
    self, Gpu, GpuShare, Inventory, Policy, ScoreContext, Workload, WorkloadModel,
};
use fgpu_driver::ledger::{Grant, Ledger};
use serde::Deserialize;
use serde_json::Value;

use crate::allocation::{self, Allocation};
use crate::load::{self, UsageAware};
use crate::mig::{self, MigInventory};
use crate::request::{self, RequestError};
use crate::scores::{self, Scores};
use crate::selector::DeviceInfo;
use crate::usage::{self, UsageError};
use crate::view::{ClaimView, PodView};
use crate::{explain, inventory};

pub use crate::objects::{
    ObjectId, allocated_node, consumable, is_gated, is_shared, pod_claim_names, request_classes,
};

/// What the controller is configured with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub driver: DriverName,
    /// Policy where the pod's annotations say nothing.
    pub default_policy: Policy,
    /// How long it takes a claim's weight in the workload model to halve.
    pub workload_half_life: std::time::Duration,
    /// The engine's usage-aware term (off by default): its weight, and how old a
    /// measured sample may be.
    pub usage_aware: UsageAware,
}

/// The objects one pass looks at (any served `resource.k8s.io` version; core/v1 pods).
#[derive(Clone, Copy, Debug)]
pub struct Snapshot<'a> {
    pub claims: &'a [Value],
    pub pods: &'a [Value],
    pub slices: &'a [Value],
    /// Per claim UID, nodes not to allocate it on again: kube-scheduler cleared its
    /// allocation there (the pod fit nowhere). Ignored when it would leave no node.
    pub avoid: &'a BTreeMap<String, BTreeSet<String>>,
    /// Claim UIDs whose allocation is younger than the settle time: their pods keep the
    /// gate for now.
    pub unsettled: &'a BTreeSet<String>,
    /// The shared DeviceClass, when it exists: its configuration is copied into every
    /// allocation (`FromClass`) and counts before the claim's.
    pub class: Option<&'a DeviceClass>,
}

/// The objects one pass looks at, as the daemon keeps them: views of every claim and
/// pod ([`crate::view`]), the inventory read from the slices, and a way to read one claim
/// whole.
#[derive(Clone, Copy)]
pub struct Views<'a> {
    pub claims: &'a [&'a ClaimView],
    pub pods: &'a [&'a PodView],
    /// This driver's slices read ([`inventory::from_slices`]).
    pub inventory: &'a inventory::SliceInventory,
    /// [`consumable`] over the same slices.
    pub consumable: bool,
    /// The claim `id` names, whole, at the resource version `id` names; `None` when it is
    /// gone or has changed since (the pass then skips it).
    pub claim: &'a dyn Fn(&ObjectId) -> Option<ResourceClaim>,
    /// As [`Snapshot::avoid`].
    pub avoid: &'a BTreeMap<String, BTreeSet<String>>,
    /// As [`Snapshot::unsettled`].
    pub unsettled: &'a BTreeSet<String>,
    /// As [`Snapshot::class`].
    pub class: Option<&'a DeviceClass>,
    /// At most this many [`Action::Allocate`] in one plan (each carries an allocation
    /// `Value`); the pods after the last one allocated wait for the next pass.
    pub max_allocations: usize,
    /// The claims seen lately ([`observe_claims`]): the expected workload of `fgd` and
    /// `fragaware`. `None`, or a model without a claim on a GPU, makes them fall back
    /// ([`Workloads::resolve`]).
    pub model: Option<&'a WorkloadModel>,
    /// Now, in Unix seconds (the model's clock).
    pub now: i64,
}

/// One write to make.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Write `allocation` into the claim's status (conditional on the claim's resource
    /// version), add the finalizer, and tell the claim with `message`.
    Allocate {
        /// The claim, at the version the allocation was planned from (the status write
        /// replaces that version; the caller reads it whole).
        claim: ObjectId,
        pod: ObjectId,
        allocation: Allocation,
        message: String,
        /// The claim had been allocated by this controller and its allocation was cleared
        /// (kube-scheduler found no node for the pod): the caller backs off.
        retry: bool,
    },
    /// The claim fits nowhere now; tell the pod and the claim why.
    Pending {
        claim: ObjectId,
        pod: ObjectId,
        reason: WaitReason,
        message: String,
    },
    /// The claim cannot be allocated as written; tell the pod and the claim why.
    Rejected {
        claim: ObjectId,
        pod: ObjectId,
        message: String,
    },
    /// Remove the scheduling gate from the pod (the remaining gates are `keep`).
    Ungate { pod: ObjectId, keep: Vec<Value> },
    /// Clear the allocation of a tentative claim that no longer fits (conditional on the
    /// claim's resource version); the finalizer stays and a later pass places it again.
    Revoke {
        /// The claim, at the version read.
        claim: ObjectId,
        pod: ObjectId,
        message: String,
    },
    /// Clear the claim's allocation (when `deallocate`) and remove the finalizer.
    Release {
        /// The claim, at the version read.
        claim: ObjectId,
        deallocate: bool,
        reason: String,
    },
}

/// Why a claim of a gated pod waits after a pass ([`Action::Pending`], [`Action::Rejected`]):
/// the `reason` label of `fgpu_controller_claims_pending`, a closed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WaitReason {
    /// No GPU has the free memory and cores now; one could host the claim when idle.
    NoFit,
    /// No GPU the claim may use could host it even idle (too large, or no GPU matches its
    /// model and UUID constraints).
    NeverFits,
    /// The claim cannot be allocated as written (its configuration or request is invalid).
    Rejected,
    /// The engine placed it but the ledger refused the placement (a bug; logged).
    Internal,
}

impl WaitReason {
    /// Every reason, in the order they are exported.
    pub const ALL: [WaitReason; 4] = [
        WaitReason::NoFit,
        WaitReason::NeverFits,
        WaitReason::Rejected,
        WaitReason::Internal,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::NoFit => "no_fit",
            WaitReason::NeverFits => "never_fits",
            WaitReason::Rejected => "rejected",
            WaitReason::Internal => "internal",
        }
    }
}

impl Action {
    /// Why the claim of this action waits; `None` for an action that is not a wait.
    pub fn wait_reason(&self) -> Option<WaitReason> {
        match self {
            Action::Pending { reason, .. } => Some(*reason),
            Action::Rejected { .. } => Some(WaitReason::Rejected),
            _ => None,
        }
    }
}

/// The outcome of one pass.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub actions: Vec<Action>,
    /// Slices left out of the inventory.
    pub slice_errors: Vec<inventory::SliceError>,
    /// DeviceTaintRules whose taint was not applied.
    pub rule_errors: Vec<inventory::RuleError>,
    /// Claims left out of the ledger.
    pub usage_errors: Vec<UsageError>,
    /// Whether this driver's published devices allow several allocations (the cluster has
    /// consumable capacity).
    pub consumable: bool,
    /// GPUs in the inventory.
    pub gpus: usize,
    /// The inventory with every grant counted, those of this plan's allocations included.
    pub usage: Inventory,
    /// Per node and GPU of `usage`: the grants holding part of it ([`shares_per_gpu`]).
    pub shares: Vec<Vec<u32>>,
    /// The share (0–1) of the free GPU capacity that the mix of shares now granted could
    /// not use ([`fragmentation`]).
    pub fragmentation: f64,
}

/// FGD's fragmentation measure (`fgpu_driver::engine::frag`) over the whole inventory, as a
/// share of its free GPU capacity: the expected workload is the mix of the grants in the
/// ledger (GPUs per claim; per GPU the larger of its memory and core share), so the figure
/// says how much of what is free the claims seen so far could not use. 0 with nothing free
/// or nothing granted.
pub fn fragmentation(ledger: &fgpu_driver::ledger::Ledger) -> f64 {
    use fgpu_driver::engine::Weighting;
    use fgpu_driver::engine::frag::node_frag;
    let inv = ledger.inventory();
    let kinds = ledger.grants().filter_map(|g| grant_kind(inv, g));
    let workload = Workload::from_pods(kinds, 1.0, Weighting::Count);
    let free: u64 = inv
        .nodes
        .iter()
        .flat_map(|n| &n.gpus)
        .filter(|g| g.healthy)
        .map(|g| u64::from(g.free_milli()))
        .sum();
    if free == 0 || workload.types.is_empty() {
        return 0.0;
    }
    let frag: f64 = inv
        .nodes
        .iter()
        .map(|n| node_frag(n, &workload, false))
        .sum();
    (frag / free as f64).clamp(0.0, 1.0)
}

/// The kind of request `grant` is ([`Grant::kind_on`] its node of `inv`).
pub fn grant_kind(inv: &Inventory, grant: &Grant) -> Option<Kind> {
    grant.kind_on(&inv.nodes[inv.node_index(&grant.node)?])
}

/// Tells `model` about every claim of `claims` that holds a grant on `inv` (allocated by
/// anyone), at its creation time. A claim is recorded once: the first pass that sees it
/// allocated fixes its kind.
pub fn observe_claims(model: &mut WorkloadModel, claims: &[&ClaimView], inv: &Inventory) {
    for c in claims.iter().filter(|c| c.shared) {
        if model.contains(&c.id.uid) {
            continue;
        }
        if let Ok(Some(g)) = &c.grant
            && let Some(kind) = grant_kind(inv, g)
        {
            model.observe(&c.id.uid, kind, c.created);
        }
    }
}

/// Only the nodes named `node` (a pod's claims stay on one node).
fn restrict(inv: &Inventory, node: &str) -> Inventory {
    Inventory {
        nodes: inv
            .nodes
            .iter()
            .filter(|n| n.name == node)
            .cloned()
            .collect(),
    }
}

/// Plans one pass over `snap` (whole objects): builds the inventory and the views, then
/// [`plan_views`]. The daemon keeps views between passes and calls [`plan_views`] itself;
/// this is the same pass for callers that hold objects (tests, tools).
pub fn plan(snap: Snapshot<'_>, settings: &Settings, allocate: bool) -> Plan {
    let driver = &settings.driver;
    // The typed model reads any JSON object; what it does not read is no slice at all.
    let slices: Vec<ResourceSlice> = snap
        .slices
        .iter()
        .filter_map(|s| ResourceSlice::deserialize(s).ok())
        .collect();
    let inventory = inventory::from_slices(driver.as_str(), &slices);
    let claims: Vec<ClaimView> = snap
        .claims
        .iter()
        .map(|c| ClaimView::of_json(c, driver, &inventory.inventory))
        .collect();
    let gate = driver.scheduling_gate();
    let pods: Vec<PodView> = snap.pods.iter().map(|p| PodView::of(p, &gate)).collect();
    let by_uid: std::collections::HashMap<&str, &Value> = snap
        .claims
        .iter()
        .filter_map(|c| Some((c["metadata"]["uid"].as_str()?, c)))
        .collect();
    let by_id = |id: &ObjectId| {
        by_uid
            .get(id.uid.as_str())
            .filter(|c| ObjectId::of(c) == *id)
            .and_then(|c| usage::typed(c).ok())
    };
    let claim_refs: Vec<&ClaimView> = claims.iter().collect();
    // The model rebuilt from the claims that exist, as a restarted daemon has it.
    let mut model = WorkloadModel::new(settings.workload_half_life);
    observe_claims(&mut model, &claim_refs, &inventory.inventory);
    let views = Views {
        claims: &claim_refs,
        pods: &pods.iter().collect::<Vec<_>>(),
        inventory: &inventory,
        consumable: consumable(driver.as_str(), &slices),
        claim: &by_id,
        avoid: snap.avoid,
        unsettled: snap.unsettled,
        class: snap.class,
        max_allocations: usize::MAX,
        model: Some(&model),
        now: claims.iter().map(|c| c.created).max().unwrap_or(0),
    };
    plan_views(views, settings, allocate)
}

/// Plans one pass over `snap`. Without `allocate` (capacity mode: kube-scheduler
/// allocates) only releases are planned, and every gated pod is ungated.
pub fn plan_views(snap: Views<'_>, settings: &Settings, allocate: bool) -> Plan {
    let gpus = snap
        .inventory
        .inventory
        .nodes
        .iter()
        .map(|n| n.gpus.len())
        .sum();
    // Claims by namespace/name.
    let claims: BTreeMap<&str, &ClaimView> =
        snap.claims.iter().map(|c| (c.key.as_str(), *c)).collect();
    let referenced = referenced_claims(snap.pods);
    // 1. Ledger, over the inventory with the measured loads where the usage term is on.
    let mut inventory = snap.inventory.inventory.clone();
    if settings.usage_aware.is_on() {
        let measured = snap.claims.iter().filter_map(|c| match &c.grant {
            Ok(Some(g)) => Some((g, c.load.as_slice())),
            _ => None,
        });
        load::apply(
            &mut inventory,
            measured,
            snap.now,
            settings.usage_aware.fresh,
        );
    }
    let mut ledgered = build_ledger(&snap, inventory, &claims, &referenced, allocate);
    let mig = mig_taken(&snap, &mut ledgered.usage_errors);
    let mut placer = Placer {
        snap,
        settings,
        workloads: Workloads::of(snap.model, snap.now),
        ledger: ledgered.ledger,
        mig,
        actions: ledgered.revokes,
        planned: BTreeSet::new(),
        allocations: 0,
        scores: Scores::default(),
        any_whole: snap
            .inventory
            .devices
            .values()
            .flat_map(BTreeMap::values)
            .any(inventory::is_whole_mode),
    };
    // 2. Release.
    placer.actions.extend(releases(&claims, &referenced));
    // 3 + 4 + 5. Gated pods and pods whose allocation was cleared, oldest first.
    for pod in pods_to_place(snap.pods, &claims, allocate) {
        if placer.allocations >= snap.max_allocations {
            break; // the rest next pass: a pass holds at most this many allocations
        }
        match pod_step(pod, &claims, &ledgered.revoked, snap.unsettled, allocate) {
            PodStep::Wait => {}
            PodStep::Ungate => placer.actions.push(Action::Ungate {
                pod: pod.id.clone(),
                keep: pod.other_gates.clone(),
            }),
            PodStep::Place(shared) => placer.place_pod(pod, shared),
        }
    }
    let ledger = placer.ledger;
    Plan {
        actions: placer.actions,
        slice_errors: snap.inventory.errors.clone(),
        rule_errors: snap.inventory.rule_errors.clone(),
        usage_errors: ledgered.usage_errors,
        consumable: snap.consumable,
        gpus,
        fragmentation: fragmentation(&ledger),
        shares: shares_per_gpu(&ledger),
        usage: ledger.into_inventory(),
    }
}

/// The MIG placements of the inventory with those of every allocated claim taken, the
/// oldest allocation first; a placement that cannot be taken (unknown, or overlapping one
/// taken before) is reported in `errors`, naming the claim's result.
fn mig_taken(snap: &Views<'_>, errors: &mut Vec<UsageError>) -> MigInventory {
    let mut mig = snap.inventory.mig.clone();
    let mut holders: Vec<&ClaimView> = snap
        .claims
        .iter()
        .copied()
        .filter(|c| c.allocated && !c.mig_results.is_empty())
        .collect();
    holders.sort_by(|a, b| (&a.allocated_at, &a.key).cmp(&(&b.allocated_at, &b.key)));
    for c in holders {
        for r in &c.mig_results {
            if let Err(problem) = mig.take(&r.node, &r.device) {
                errors.push(UsageError::Invalid {
                    claim: c.key.clone(),
                    path: format!("status.allocation.devices.results[{}].device", r.index),
                    problem,
                });
            }
        }
    }
    mig
}

/// Per node and GPU of `ledger`'s inventory (same order), the grants that hold part of it.
pub fn shares_per_gpu(ledger: &fgpu_driver::ledger::Ledger) -> Vec<Vec<u32>> {
    let inv = ledger.inventory();
    let mut out: Vec<Vec<u32>> = inv.nodes.iter().map(|n| vec![0; n.gpus.len()]).collect();
    for g in ledger.grants() {
        let Some(n) = inv.node_index(&g.node) else {
            continue;
        };
        for d in &g.devices {
            if let Some(i) = inv.nodes[n].gpus.iter().position(|x| x.id == d.gpu) {
                out[n][i] += 1;
            }
        }
    }
    out
}

/// The claim keys live pods reference → whether every one of those pods is gated.
fn referenced_claims(pods: &[&PodView]) -> BTreeMap<String, bool> {
    let mut referenced: BTreeMap<String, bool> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.live) {
        for k in pod.claim_keys() {
            *referenced.entry(k).or_insert(true) &= pod.gated;
        }
    }
    referenced
}

/// Whether `claim` is tentative (rule 1): this controller's, allocated, not being
/// deleted, not reserved, and every live pod that references it still gated.
fn is_tentative(claim: &ClaimView, referenced: &BTreeMap<String, bool>, allocate: bool) -> bool {
    allocate
        && claim.ours
        && claim.allocated
        && !claim.deleting
        && !claim.reserved
        && referenced.get(&claim.key) == Some(&true)
}

/// The claims split into (tentative, committed); the tentative ones oldest allocation
/// first, the order in which they are granted.
fn split_tentative<'v>(
    claims: &BTreeMap<&str, &'v ClaimView>,
    referenced: &BTreeMap<String, bool>,
    allocate: bool,
) -> (Vec<&'v ClaimView>, Vec<&'v ClaimView>) {
    let (mut tentative, committed): (Vec<&ClaimView>, Vec<&ClaimView>) = claims
        .values()
        .copied()
        .partition(|c| is_tentative(c, referenced, allocate));
    tentative.sort_by(|a, b| (&a.allocated_at, &a.key).cmp(&(&b.allocated_at, &b.key)));
    (tentative, committed)
}

/// Rule 1's outcome: the ledger, the claims left out of it, and the tentative claims
/// that no longer fit (with their revocations).
struct Ledgered<'v> {
    ledger: Ledger,
    usage_errors: Vec<UsageError>,
    revokes: Vec<Action>,
    revoked: BTreeSet<&'v str>,
}

/// Rule 1: the inventory with the committed claims granted, then the tentative ones;
/// a tentative claim that no longer fits is revoked.
fn build_ledger<'v>(
    snap: &Views<'v>,
    inventory: Inventory,
    claims: &BTreeMap<&str, &'v ClaimView>,
    referenced: &BTreeMap<String, bool>,
    allocate: bool,
) -> Ledgered<'v> {
    let (tentative, committed) = split_tentative(claims, referenced, allocate);
    let usage = usage::rebuild_from(
        inventory,
        committed.iter().map(|c| (c.key.as_str(), &c.grant)),
    );
    let mut out = Ledgered {
        ledger: usage.ledger,
        usage_errors: usage.errors,
        revokes: Vec::new(),
        revoked: BTreeSet::new(),
    };
    for claim in tentative {
        let granted = claim.grant.clone().map(|g| g.map(|g| out.ledger.grant(g)));
        match granted {
            Ok(None | Some(Ok(()))) => {}
            Err(e) => out.usage_errors.push(e),
            Ok(Some(Err(e))) => {
                out.revoked.insert(&claim.key);
                out.revokes.push(revoke(claim, snap.pods, &e));
            }
        }
    }
    out
}

/// The revocation of tentative `claim`, which no longer fits (`e`), told to the first
/// live pod that uses it.
fn revoke(claim: &ClaimView, pods: &[&PodView], e: &impl std::fmt::Display) -> Action {
    let pod = pods
        .iter()
        .filter(|p| p.live)
        .find(|p| p.claim_keys().any(|k| k == claim.key))
        .map(|p| p.id.clone())
        .unwrap_or_default();
    let node = claim.node.as_deref().unwrap_or("?");
    Action::Revoke {
        claim: claim.id.clone(),
        pod,
        message: format!(
            "the allocation on node {node} no longer fits beside claims another allocator granted at the same time ({e}); allocating again"
        ),
    }
}

/// Rule 2: this controller's claims that are not reserved and that no live pod
/// references are released.
fn releases(
    claims: &BTreeMap<&str, &ClaimView>,
    referenced: &BTreeMap<String, bool>,
) -> Vec<Action> {
    claims
        .iter()
        .filter(|(key, claim)| claim.ours && !claim.reserved && !referenced.contains_key(**key))
        .map(|(_, claim)| Action::Release {
            claim: claim.id.clone(),
            deallocate: claim.allocated && !claim.deleting,
            reason: if claim.deleting {
                "the claim is being deleted and no pod uses it".into()
            } else {
                "no pod uses the claim any more".into()
            },
        })
        .collect()
}

/// Whether live, unbound `pod` has a shared claim of this controller's whose allocation
/// was cleared (rule 5).
fn reclaimed(pod: &PodView, claims: &BTreeMap<&str, &ClaimView>, allocate: bool) -> bool {
    allocate
        && pod.live
        && !pod.bound
        && pod.claim_keys().any(|k| {
            claims
                .get(k.as_str())
                .is_some_and(|c| c.ours && !c.allocated && !c.deleting && c.shared)
        })
}

/// The pods rules 3–5 look at (gated or [`reclaimed`], not being deleted), oldest first.
fn pods_to_place<'v>(
    pods: &[&'v PodView],
    claims: &BTreeMap<&str, &ClaimView>,
    allocate: bool,
) -> Vec<&'v PodView> {
    let mut out: Vec<&PodView> = pods
        .iter()
        .copied()
        .filter(|p| !p.deleting && (p.gated || reclaimed(p, claims, allocate)))
        .collect();
    out.sort_by(|a, b| {
        (&a.created, &a.id.namespace, &a.id.name).cmp(&(&b.created, &b.id.namespace, &b.id.name))
    });
    out
}

/// A pod's claims of the shared class that exist, and whether any of its claims is
/// missing (not generated, or not in the cache, yet).
fn shared_claims<'v>(
    pod: &PodView,
    claims: &BTreeMap<&str, &'v ClaimView>,
) -> (Vec<&'v ClaimView>, bool) {
    let mut waiting = false;
    let mut shared = Vec::new();
    for n in &pod.claims {
        match n
            .as_ref()
            .and_then(|n| claims.get(format!("{}/{n}", pod.id.namespace).as_str()))
        {
            Some(c) if c.shared => shared.push(*c),
            Some(_) => {}
            None => waiting = true,
        }
    }
    (shared, waiting)
}

/// What rules 3–5 do with one pod.
#[derive(Debug)]
enum PodStep<'v> {
    /// Nothing this pass (claims missing, revoked, settling, or nothing to allocate).
    Wait,
    /// Every shared claim is allocated and settled (or capacity mode): remove the gate.
    Ungate,
    /// Allocate these shared claims (those not allocated yet).
    Place(Vec<&'v ClaimView>),
}

/// Decides rules 3–5 for `pod`: a gated pod waits for its claims to exist, is ungated
/// once they are all allocated and settled, and otherwise has them placed; a reclaimed
/// pod (not gated) has its cleared claims placed again.
fn pod_step<'v>(
    pod: &PodView,
    claims: &BTreeMap<&str, &'v ClaimView>,
    revoked: &BTreeSet<&str>,
    unsettled: &BTreeSet<String>,
    allocate: bool,
) -> PodStep<'v> {
    let retry = !pod.gated;
    let (shared, waiting) = shared_claims(pod, claims);
    if waiting && allocate && !retry {
        return PodStep::Wait;
    }
    if shared.iter().any(|c| revoked.contains(c.key.as_str())) {
        return PodStep::Wait; // placed again once the revocation is written
    }
    let all_allocated = shared.iter().all(|c| c.allocated);
    if retry && all_allocated {
        return PodStep::Wait;
    }
    if !retry && (!allocate || all_allocated) {
        if allocate && shared.iter().any(|c| unsettled.contains(&c.id.uid)) {
            return PodStep::Wait; // ungated once the allocations have settled
        }
        return PodStep::Ungate;
    }
    PodStep::Place(shared)
}

/// Rules 3 and 5 over one pass: the ledger with every planned grant, the actions so far,
/// the claims already planned (a claim shared by two pods is placed once).
struct Placer<'v, 's> {
    snap: Views<'v>,
    settings: &'s Settings,
    workloads: Workloads,
    ledger: Ledger,
    /// The MIG placements, with every allocated and planned one taken.
    mig: MigInventory,
    actions: Vec<Action>,
    planned: BTreeSet<&'v str>,
    allocations: usize,
    /// The pass's node scores per request class ([`Scores`]), told of every grant, and
    /// the selectors found to accept every device.
    scores: Scores,
    /// Whether any GPU of the inventory is published in `whole` mode (none: a share's
    /// search need not look).
    any_whole: bool,
}

impl<'v> Placer<'v, '_> {
    /// Places `pod`'s shared claims that are not allocated, on the node of those that
    /// are; stops at the first claim that is rejected or does not fit.
    fn place_pod(&mut self, pod: &PodView, shared: Vec<&'v ClaimView>) {
        let mut node: Option<String> = shared.iter().find_map(|c| c.node.clone());
        for claim in shared.into_iter().filter(|c| !c.allocated && !c.deleting) {
            if !self.planned.insert(&claim.key) {
                continue; // shared by an earlier pod of this pass
            }
            let Some(action) = self.place_one(pod, claim, node.as_deref()) else {
                continue; // changed since the view was taken: the next pass
            };
            let placed = match &action {
                Action::Allocate { allocation, .. } => Some(allocation.grant.node.clone()),
                _ => None,
            };
            self.actions.push(action);
            match placed {
                Some(n) => {
                    node = Some(n);
                    self.allocations += 1;
                }
                None => break,
            }
        }
    }

    /// The action for one claim of `pod` (`Allocate`, `Pending` or `Rejected`), placed on
    /// `node` when given; `None` when the claim changed since its view was taken.
    fn place_one(
        &mut self,
        pod: &PodView,
        claim: &ClaimView,
        node: Option<&str>,
    ) -> Option<Action> {
        if claim.mig {
            return self.place_mig(pod, claim, node);
        }
        let snap = &self.snap;
        let pod_id = &pod.id;
        let whole = (snap.claim)(&claim.id)?;
        let read = request::requests_in_class(
            &whole,
            snap.class,
            &pod.annotations,
            &pod_id.key(),
            &self.settings.driver,
            self.settings.default_policy,
        )
        .and_then(|p| {
            let c = request::constraints(&whole, &self.settings.driver, &p)?;
            Ok((p, c))
        });
        let (mut pendings, constraints) = match read {
            Ok(p) => p,
            Err(e) => return Some(rejected(claim.id.clone(), pod_id.clone(), &e)),
        };
        drop(whole);
        let cross = apply_topology(&mut pendings, &constraints);
        let ask = Ask {
            pendings: &pendings,
            cross: &cross,
            devices: &snap.inventory.devices,
            driver: self.settings.driver.as_str(),
            any_whole: self.any_whole,
        };
        let avoid = snap.avoid.get(&claim.id.uid);
        Some(
            match place_claim(
                &mut self.ledger,
                &mut self.scores,
                &ask,
                node,
                avoid,
                &self.workloads,
                self.settings.usage_aware.weight,
            ) {
                Ok((parts, note)) => self.allocated(claim, pod, &parts, note),
                Err(NotPlaced::Rejected(message)) => Action::Rejected {
                    claim: claim.id.clone(),
                    pod: pod_id.clone(),
                    message,
                },
                Err(NotPlaced::Pending(reason, message)) => Action::Pending {
                    claim: claim.id.clone(),
                    pod: pod_id.clone(),
                    reason,
                    message,
                },
            },
        )
    }

    /// The action for one claim of the MIG class of `pod` ([`place_mig`]), placed on `node`
    /// when given; `None` when the claim changed since its view was taken. A placement
    /// chosen is taken at once.
    fn place_mig(
        &mut self,
        pod: &PodView,
        claim: &ClaimView,
        node: Option<&str>,
    ) -> Option<Action> {
        let snap = &self.snap;
        let driver = &self.settings.driver;
        let whole = (snap.claim)(&claim.id)?;
        let read = request::requests_of_class(
            &whole,
            &driver.mig_class(),
            None,
            &pod.annotations,
            &pod.id.key(),
            driver,
            self.settings.default_policy,
        );
        let pendings = match read {
            Ok(p) => p,
            Err(e) => return Some(rejected(claim.id.clone(), pod.id.clone(), &e)),
        };
        if !whole.spec.devices.constraints.is_empty() {
            return Some(Action::Rejected {
                claim: claim.id.clone(),
                pod: pod.id.clone(),
                message: format!(
                    "not allocated: claim {}: spec.devices.constraints: not supported for class {} by the controller",
                    claim.key,
                    driver.mig_class()
                ),
            });
        }
        drop(whole);
        let avoid = snap.avoid.get(&claim.id.uid);
        Some(
            match place_mig(&mut self.mig, &pendings, node, avoid, driver.as_str()) {
                Ok(parts) => {
                    let allocation = allocation::mig(driver.as_str(), &parts);
                    let grant = Grant {
                        id: claim.grant_id(),
                        node: parts[0].1.node.clone(),
                        cpu_milli: 0,
                        memory_mib: 0,
                        devices: parts
                            .iter()
                            .map(|(_, c)| fgpu_driver::ledger::DeviceGrant {
                                gpu: c.device.clone(),
                                memory: c.profile.memory_bytes(),
                                cores: 0,
                            })
                            .collect(),
                    };
                    let placed: Vec<String> = parts
                        .iter()
                        .map(|(_, c)| {
                            format!(
                                "{} (MIG {} of GPU {})",
                                c.device, c.profile.name, c.parent_uuid
                            )
                        })
                        .collect();
                    Action::Allocate {
                        claim: claim.id.clone(),
                        pod: pod.id.clone(),
                        message: format!("allocated on {}: {}", grant.node, placed.join(", ")),
                        allocation: Allocation { allocation, grant },
                        retry: !pod.gated,
                    }
                }
                Err(NotPlaced::Rejected(message)) => Action::Rejected {
                    claim: claim.id.clone(),
                    pod: pod.id.clone(),
                    message,
                },
                Err(NotPlaced::Pending(reason, message)) => Action::Pending {
                    claim: claim.id.clone(),
                    pod: pod.id.clone(),
                    reason,
                    message,
                },
            },
        )
    }

    /// The `Allocate` action for `claim` placed as `parts` (a retry when the pod is not
    /// gated).
    fn allocated(
        &self,
        claim: &ClaimView,
        pod: &PodView,
        parts: &[(&request::PendingClaim, Grant)],
        note: Option<String>,
    ) -> Action {
        let driver = self.settings.driver.as_str();
        let (allocation, devices) = allocation::assemble(driver, parts, self.snap.consumable);
        let grant = Grant {
            id: claim.grant_id(),
            node: parts[0].1.node.clone(),
            cpu_milli: 0,
            memory_mib: 0,
            devices,
        };
        Action::Allocate {
            claim: claim.id.clone(),
            pod: pod.id.clone(),
            message: explain::allocated(&grant)
                + &note.map(|n| format!("; {n}")).unwrap_or_default(),
            allocation: Allocation { allocation, grant },
            retry: !pod.gated,
        }
    }
}

/// Places every request of a claim of the MIG class (`pendings`, one per request; `count`
/// placements each) on MIG placements of `mig`, all on one node: `node` when the pod's
/// other claims are there, else the node of the first placement, chosen away from `avoid`
/// where possible. Each placement is taken in `mig` as it is chosen, and given back when
/// a later one does not fit (on failure `mig` is as before). A request's memory
/// and cores are read as for a share ([`crate::request`]); its CEL selectors must accept
/// the placement device. `firstAvailable` is refused, naming the request.
fn place_mig<'p>(
    mig: &mut MigInventory,
    pendings: &'p [request::PendingClaim],
    node: Option<&str>,
    avoid: Option<&BTreeSet<String>>,
    driver: &str,
) -> Result<Vec<allocation::MigPart<'p>>, NotPlaced> {
    if let Some(p) = pendings.iter().find(|p| p.request_name != p.parent) {
        return Err(NotPlaced::Rejected(format!(
            "not allocated: claim {}: spec.devices.requests[{}].firstAvailable: not supported for MIG placements by the controller; use exactly",
            p.key, p.request_index
        )));
    }
    let mut parts = Vec::new();
    let placed = choose_mig(mig, pendings, node, avoid, driver, &mut parts);
    if placed.is_err() {
        for (_, c) in &parts {
            mig.release(&c.node, &c.device);
        }
    }
    placed.map(|()| parts)
}

/// [`place_mig`]'s choices, pushed onto `parts` (and taken in `mig`) as they are made.
fn choose_mig<'p>(
    mig: &mut MigInventory,
    pendings: &'p [request::PendingClaim],
    node: Option<&str>,
    avoid: Option<&BTreeSet<String>>,
    driver: &str,
    parts: &mut Vec<allocation::MigPart<'p>>,
) -> Result<(), NotPlaced> {
    let evaluator = crate::selector::Evaluator::new().map_err(NotPlaced::Rejected)?;
    let mut at = node.map(str::to_owned);
    for p in pendings {
        // Selectors are evaluated once per device; an evaluation error refuses the claim.
        let mut accepted: BTreeSet<(String, String)> = BTreeSet::new();
        for n in &mig.nodes {
            for d in n.gpus.iter().flat_map(|g| g.devices.iter()) {
                if selectors_accept(&evaluator, p, driver, &d.info, &n.name, &d.name)? {
                    accepted.insert((n.name.clone(), d.name.clone()));
                }
            }
        }
        let allowed =
            |n: &str, d: &mig::MigDevice| accepted.contains(&(n.to_owned(), d.name.clone()));
        let ask = mig::MigAsk {
            memory_bytes: p.config.memory.unwrap_or(0),
            cores: p.request.cores,
            allowed: &allowed,
        };
        for _ in 0..p.request.gpus {
            let chosen = mig.choose(&ask, at.as_deref(), avoid).map_err(|u| {
                let reason = if u.never {
                    WaitReason::NeverFits
                } else {
                    WaitReason::NoFit
                };
                let which = if pendings.len() > 1 || p.request.gpus > 1 {
                    format!("request {}: ", p.request_name)
                } else {
                    String::new()
                };
                let tail = where_others_are(at.as_deref(), parts.is_empty());
                NotPlaced::Pending(reason, format!("{which}{}{tail}", u.message))
            })?;
            mig.take(&chosen.node, &chosen.device).map_err(|e| {
                NotPlaced::Pending(
                    WaitReason::Internal,
                    format!("internal: the chosen MIG placement could not be taken: {e}"),
                )
            })?;
            at = Some(chosen.node.clone());
            parts.push((p, chosen));
        }
    }
    if parts.is_empty() {
        return Err(NotPlaced::Rejected(
            "not allocated: the claim requests no device".into(),
        ));
    }
    Ok(())
}

/// Why [`place_claim`] placed nothing.
enum NotPlaced {
    /// The claim can never be placed as written.
    Rejected(String),
    /// Nothing fits now, for this reason.
    Pending(WaitReason, String),
}

/// Places every request of one claim (`pendings`, [`request::requests_in_class`], with
/// [`apply_topology`] done; `cross` the constraints left over several requests) on one
/// node — `node` when the pod's other claims are there, else away from `avoid` where
/// possible. Nodes are tried in the order of the first request's score (its earlier
/// `firstAvailable` alternatives first); on each, the requests are placed in order, each
/// on GPUs the claim's earlier requests did not take, trying each request's alternatives
/// in order and each shared value of the `cross` constraints, backtracking when a later
/// request does not fit. The first node where all fit wins. Each request is scored under
/// its policy as `workloads` resolve it. On success the ledger holds the claim's grant
/// under its id and the parts are returned, with a note when a policy fell back
/// ([`Workloads::resolve`]); on failure the ledger is as before.
fn place_claim<'p>(
    ledger: &mut Ledger,
    scores: &mut Scores,
    ask: &Ask<'p, '_>,
    node: Option<&str>,
    avoid: Option<&BTreeSet<String>>,
    workloads: &Workloads,
    usage_weight: f64,
) -> Result<(Parts<'p>, Option<String>), NotPlaced> {
    let cand = candidates(ledger.inventory(), node, avoid);
    let whole = matches!(cand, Cow::Borrowed(_));
    let allowed = ask
        .pendings
        .iter()
        .map(|p| {
            let key: Vec<&str> = p.selectors.iter().map(|s| s.expression.as_str()).collect();
            if scores.accepts_all(&key) {
                return Ok(None); // as for a request without selectors
            }
            let allowed = allowed_devices(&cand, p, ask.devices, ask.driver)?;
            let gpus = || cand.nodes.iter().map(|n| n.gpus.len()).sum::<usize>();
            match allowed {
                // Every device of the whole inventory: so every device of any part of it,
                // for the rest of the pass (the devices' attributes do not change in one).
                Some(a) if whole && a.len() == gpus() => {
                    scores.accept_all(&key);
                    Ok(None)
                }
                a => Ok(a),
            }
        })
        .collect::<Result<Vec<_>, NotPlaced>>()?;
    let groups = groups(ask.pendings);
    if groups.is_empty() {
        return Err(NotPlaced::Rejected(
            "not allocated: the claim requests no device".into(),
        ));
    }
    for p in ask.pendings {
        if let Err(engine::NoFit::Invalid(why)) = engine::validate(&p.request) {
            return Err(NotPlaced::Rejected(format!(
                "not allocated: request {}: {why}",
                p.request_name
            )));
        }
    }
    let search = Search {
        cand: &cand,
        ask,
        groups: &groups,
        allowed: &allowed,
        workloads,
        max_spec: cand.max_spec(),
        usage_weight,
    };
    let note = ask
        .pendings
        .iter()
        .find_map(|p| workloads.resolve(p.policy).note());
    let mut fail: Option<Failure> = None;
    let mut budget = SEARCH_BUDGET;
    let mut placed = None;
    // The scores kept are per node of the whole inventory: only a search over all of it
    // reads them.
    let kept = whole.then_some(&mut *scores);
    for n in node_order(&search, kept) {
        let name = cand.nodes[n].name.clone();
        let mut parts = Vec::new();
        if search.on_node(n, &mut parts, &mut budget, &mut fail)? {
            placed = Some((name, parts));
            break;
        }
    }
    let Some((node_name, parts)) = placed else {
        return Err(search.failure(fail, node));
    };
    let grant = Grant {
        id: ask.pendings[0].id.clone(),
        node: node_name,
        cpu_milli: 0,
        memory_mib: 0,
        devices: parts.iter().flat_map(|(_, p)| p.devices.clone()).collect(),
    };
    let at = ledger.inventory().node_index(&grant.node);
    if let Err(e) = ledger.grant(grant) {
        return Err(NotPlaced::Pending(
            WaitReason::Internal,
            format!("internal: the ledger refused the placement: {e}"),
        ));
    }
    if let Some(i) = at {
        scores.changed(i);
    }
    Ok((parts, note))
}

/// The requests of a claim placed, each with its part of the grant.
type Parts<'p> = Vec<(&'p request::PendingClaim, Grant)>;

/// Engine calls one claim's placement may make at most (the search backtracks over
/// nodes, alternatives and constraint values).
const SEARCH_BUDGET: usize = 4096;

/// Combinations of constraint values tried per node at most.
const MAX_VALUE_COMBINATIONS: usize = 256;

/// One claim to place: its requests and alternatives, the constraints over several
/// requests, and what selectors read.
pub(crate) struct Ask<'p, 'i> {
    pub pendings: &'p [request::PendingClaim],
    pub cross: &'p [request::Constraint],
    pub devices: &'i BTreeMap<String, BTreeMap<String, DeviceInfo>>,
    pub driver: &'i str,
    /// Whether any GPU of `devices` is in `whole` mode ([`inventory::is_whole_mode`]).
    pub any_whole: bool,
}

/// GPUs by node and device name, borrowed from the candidates they were picked from (a
/// claim's search holds one set per request; owned names cost two allocations per GPU).
type Allowed<'c> = BTreeSet<(&'c str, &'c str)>;

/// The GPUs of `inv` (by node and device name) that every selector of `p` allows; `None`
/// when `p` has no selector. An evaluation error refuses the claim, as in Kubernetes.
fn allowed_devices<'c>(
    inv: &'c Inventory,
    p: &request::PendingClaim,
    devices: &BTreeMap<String, BTreeMap<String, DeviceInfo>>,
    driver: &str,
) -> Result<Option<Allowed<'c>>, NotPlaced> {
    if p.selectors.is_empty() {
        return Ok(None);
    }
    let empty = DeviceInfo::default();
    let evaluator = crate::selector::Evaluator::new().map_err(NotPlaced::Rejected)?;
    let mut out = BTreeSet::new();
    for n in &inv.nodes {
        for g in &n.gpus {
            let info = devices
                .get(&n.name)
                .and_then(|d| d.get(&g.id))
                .unwrap_or(&empty);
            if selectors_accept(&evaluator, p, driver, info, &n.name, &g.id)? {
                out.insert((n.name.as_str(), g.id.as_str()));
            }
        }
    }
    Ok(Some(out))
}

/// Whether every selector of `p` accepts the device `node`/`device` (what selectors see of
/// it: `info`); an evaluation error refuses the claim, as in Kubernetes.
fn selectors_accept(
    evaluator: &crate::selector::Evaluator,
    p: &request::PendingClaim,
    driver: &str,
    info: &DeviceInfo,
    node: &str,
    device: &str,
) -> Result<bool, NotPlaced> {
    for s in &p.selectors {
        match evaluator.matches(&s.compiled, driver, info) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) => {
                return Err(NotPlaced::Rejected(format!(
                    "not allocated: claim {}: {}: on device {node}/{device}: {e}",
                    p.key, s.path
                )));
            }
        }
    }
    Ok(true)
}

/// The indices of `pendings` per claim request (its alternatives, in order).
fn groups(pendings: &[request::PendingClaim]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (i, p) in pendings.iter().enumerate() {
        match out.last_mut() {
            Some(g) if pendings[g[0]].request_index == p.request_index => g.push(i),
            _ => out.push(vec![i]),
        }
    }
    out
}

/// Where a claim's placement failed furthest: the request group, its first alternative
/// and the GPUs it had, and the node.
struct Failure {
    group: usize,
    pending: usize,
    inv: Inventory,
    node: String,
}

/// One claim's placement search ([`place_claim`]).
struct Search<'s, 'p, 'i> {
    cand: &'s Inventory,
    ask: &'s Ask<'p, 'i>,
    groups: &'s [Vec<usize>],
    allowed: &'s [Option<Allowed<'s>>],
    /// What fgd and fragaware score against ([`Workloads::resolve`]).
    workloads: &'s Workloads,
    /// The candidates' largest node (BestFit's normalisation).
    max_spec: engine::MaxSpec,
    /// [`ScoreContext::usage_weight`]: the usage-aware term's weight.
    usage_weight: f64,
}

impl Search<'_, '_, '_> {
    /// The policy request `p` is scored under and its context.
    fn scoring(&self, p: &request::PendingClaim) -> (Policy, ScoreContext<'_>) {
        let r = self.workloads.resolve(p.policy);
        let ctx = ScoreContext {
            workload: r.workload,
            max_spec: self.max_spec,
            usage_weight: self.usage_weight,
        };
        (r.policy, ctx)
    }
}

/// The value of `attr` on `gpu`, where it has one.
fn attr_value(gpu: &engine::Gpu, attr: request::MatchAttribute) -> Option<String> {
    match attr {
        request::MatchAttribute::NumaNode => gpu.numa.map(|n| n.to_string()),
        request::MatchAttribute::PcieRoot => gpu.pcie_root.clone(),
    }
}

/// The nodes of `s.cand` (indices) in the order of the first request's placement there:
/// earlier alternatives first, then the higher score, then inventory order. Nodes where
/// no alternative of the first request fits are left out. `kept`: the pass's scores,
/// given when `s.cand` is the whole inventory; they serve the alternatives whose
/// selectors leave out no GPU.
fn node_order(s: &Search<'_, '_, '_>, mut kept: Option<&mut Scores>) -> Vec<usize> {
    let mut best: BTreeMap<usize, (usize, f64)> = BTreeMap::new();
    for (alt, &pi) in s.groups[0].iter().enumerate() {
        let p = &s.ask.pendings[pi];
        let inv = s.filtered(s.cand, pi);
        let (policy, ctx) = s.scoring(p);
        let feasible = match (&inv, kept.as_deref_mut()) {
            (Cow::Borrowed(whole), Some(cache)) => cache.feasible(whole, &p.request, policy, &ctx),
            _ => scores::evaluate(&inv, &p.request, policy, &ctx),
        };
        for (node, score) in feasible {
            best.entry(node).or_insert((alt, score));
        }
    }
    let mut order: Vec<(usize, (usize, f64))> = best.into_iter().collect();
    order.sort_by(|(na, (aa, sa)), (nb, (ab, sb))| {
        aa.cmp(ab)
            .then_with(|| engine::controller_order((*na, *sa), (*nb, *sb)))
    });
    order.into_iter().map(|(n, _)| n).collect()
}

impl<'p> Search<'_, 'p, '_> {
    /// `inv` with only the GPUs pending `pi`'s selectors allow, and, for a share, without
    /// the GPUs in `whole` mode.
    /// `inv` itself when that leaves out no GPU (the usual case: a copy of every
    /// candidate per claim was most of a pass's transient memory).
    fn filtered<'v>(&self, inv: &'v Inventory, pi: usize) -> Cow<'v, Inventory> {
        let allowed = self.allowed[pi].as_ref();
        let share = self.ask.pendings[pi].request.share != GpuShare::Whole && self.ask.any_whole;
        if allowed.is_none() && !share {
            return Cow::Borrowed(inv); // nothing to leave out
        }
        let keep = |node: &str, infos: Option<&BTreeMap<String, DeviceInfo>>, g: &Gpu| {
            allowed.is_none_or(|a| a.contains(&(node, g.id.as_str())))
                && !(share
                    && infos
                        .and_then(|d| d.get(&g.id))
                        .is_some_and(inventory::is_whole_mode))
        };
        let all_kept = inv.nodes.iter().all(|n| {
            let infos = self.ask.devices.get(&n.name);
            n.gpus.iter().all(|g| keep(&n.name, infos, g))
        });
        if all_kept {
            return Cow::Borrowed(inv);
        }
        let mut out = inv.clone();
        for n in &mut out.nodes {
            let infos = self.ask.devices.get(&n.name);
            let name = std::mem::take(&mut n.name);
            n.gpus.retain(|g| keep(&name, infos, g));
            n.name = name;
        }
        Cow::Owned(out)
    }

    /// Tries every combination of values of the cross constraints on node `n`; true with
    /// `parts` filled when all requests fit.
    fn on_node(
        &self,
        n: usize,
        parts: &mut Vec<(&'p request::PendingClaim, Grant)>,
        budget: &mut usize,
        fail: &mut Option<Failure>,
    ) -> Result<bool, NotPlaced> {
        let node = restrict(self.cand, &self.cand.nodes[n].name);
        let per_constraint: Vec<Vec<String>> = self
            .ask
            .cross
            .iter()
            .map(|c| {
                let mut v: Vec<String> = node.nodes[0]
                    .gpus
                    .iter()
                    .filter_map(|g| attr_value(g, c.attribute))
                    .collect();
                v.sort();
                v.dedup();
                v
            })
            .collect();
        let mut combo = vec![0usize; per_constraint.len()];
        let mut tried = 0;
        if per_constraint.iter().any(Vec::is_empty) {
            // No GPU of the node has the attribute: nothing can meet the constraint.
            let values: Vec<String> = Vec::new();
            return self
                .requests(&node, &values, 0, parts, budget, fail)
                .map(|_| false);
        }
        loop {
            let values: Vec<String> = combo
                .iter()
                .zip(&per_constraint)
                .map(|(&i, v)| v[i].clone())
                .collect();
            if self.requests(&node, &values, 0, parts, budget, fail)? {
                return Ok(true);
            }
            tried += 1;
            // Next combination (odometer).
            let mut k = 0;
            loop {
                if k == combo.len() || tried >= MAX_VALUE_COMBINATIONS {
                    return Ok(false);
                }
                combo[k] += 1;
                if combo[k] < per_constraint[k].len() {
                    break;
                }
                combo[k] = 0;
                k += 1;
            }
        }
    }

    /// Places request groups `r..` on `node` (one node) with the cross constraints'
    /// `values` (empty: the node has no value, so a constrained request cannot fit).
    fn requests(
        &self,
        node: &Inventory,
        values: &[String],
        r: usize,
        parts: &mut Vec<(&'p request::PendingClaim, Grant)>,
        budget: &mut usize,
        fail: &mut Option<Failure>,
    ) -> Result<bool, NotPlaced> {
        if r == self.groups.len() {
            return Ok(true);
        }
        for &pi in &self.groups[r] {
            if *budget == 0 {
                return Ok(false);
            }
            *budget -= 1;
            let p = &self.ask.pendings[pi];
            let mut inv = self.filtered(node, pi).into_owned();
            without_taken(&mut inv, parts);
            for (k, c) in self.ask.cross.iter().enumerate() {
                if c.applies(p) {
                    let want = values.get(k);
                    for n in &mut inv.nodes {
                        n.gpus.retain(|g| {
                            want.is_some() && attr_value(g, c.attribute).as_ref() == want
                        });
                    }
                }
            }
            let (policy, ctx) = self.scoring(p);
            match engine::choose(&inv, &p.request, policy, &ctx, 0) {
                Ok(pl) => {
                    let id = format!("{}#{}", p.id, p.request_name);
                    parts.push((p, Grant::from_placement(id, &inv, &p.request, &pl)));
                    if self.requests(node, values, r + 1, parts, budget, fail)? {
                        return Ok(true);
                    }
                    parts.pop();
                }
                Err(engine::NoFit::Invalid(why)) => {
                    return Err(NotPlaced::Rejected(format!(
                        "not allocated: request {}: {why}",
                        p.request_name
                    )));
                }
                Err(engine::NoFit::Insufficient { .. }) => {
                    if fail.as_ref().is_none_or(|f| r > f.group) {
                        *fail = Some(Failure {
                            group: r,
                            pending: self.groups[r][0],
                            inv: inv.clone(),
                            node: node.nodes[0].name.clone(),
                        });
                    }
                }
            }
        }
        Ok(false)
    }

    /// Why nothing was placed: where the search got furthest, else the first request over
    /// every candidate node. `pod_node`: the pod's other claims are there.
    fn failure(&self, fail: Option<Failure>, pod_node: Option<&str>) -> NotPlaced {
        let several = self.groups.len() > 1;
        let (group, pi, inv, tail) = match fail {
            Some(f) if f.group > 0 => {
                let tail = where_others_are(Some(&f.node), false);
                (f.group, f.pending, f.inv, tail)
            }
            _ => {
                let pi = self.groups[0][0];
                (
                    0,
                    pi,
                    self.filtered(self.cand, pi).into_owned(),
                    where_others_are(pod_node, true),
                )
            }
        };
        let p = &self.ask.pendings[pi];
        let which = if several {
            format!("request {}: ", p.request_name)
        } else {
            String::new()
        };
        let alternatives = if self.groups[group].len() > 1 {
            format!(" (and {} later alternatives)", self.groups[group].len() - 1)
        } else {
            String::new()
        };
        let gpus = |i: &Inventory| i.nodes.iter().map(|n| n.gpus.len()).sum::<usize>();
        if let Some(s) = p
            .selectors
            .first()
            .filter(|_| gpus(&inv) == 0 && gpus(self.cand) > 0 && group == 0)
        {
            let base = s
                .path
                .rsplit_once(".selectors[")
                .map_or(s.path.as_str(), |(b, _)| b);
            return NotPlaced::Pending(
                WaitReason::NeverFits,
                format!(
                    "{which}no GPU matches the selectors ({base}.selectors) among the {} candidate GPUs{alternatives}{tail}",
                    gpus(self.cand)
                ),
            );
        }
        let reason = if explain::never_fits(&inv, &p.request) {
            WaitReason::NeverFits
        } else {
            WaitReason::NoFit
        };
        let constrained = if self.ask.cross.is_empty() {
            String::new()
        } else {
            let paths: Vec<&str> = self.ask.cross.iter().map(|c| c.path.as_str()).collect();
            format!(" under {}", paths.join(", "))
        };
        let whole_mode = if p.request.share == GpuShare::Whole {
            0
        } else {
            self.cand
                .nodes
                .iter()
                .flat_map(|n| n.gpus.iter().map(move |g| (n, g)))
                .filter(|(n, g)| {
                    self.ask
                        .devices
                        .get(&n.name)
                        .and_then(|d| d.get(&g.id))
                        .is_some_and(inventory::is_whole_mode)
                })
                .count()
        };
        let whole_mode = match whole_mode {
            0 => String::new(),
            k => format!(" ({k} GPUs in whole mode take whole-GPU claims only)"),
        };
        NotPlaced::Pending(
            reason,
            format!(
                "{which}{}{whole_mode}{constrained}{alternatives}{tail}",
                explain::pending(&inv, &p.request)
            ),
        )
    }
}

/// Maps each constraint that covers a single claim request onto the engine's topology of
/// that request's alternatives it applies to (`SameNuma`, `SamePcieRoot`: the engine then
/// picks the best group); returns the constraints left, which span several requests (or
/// meet a request whose topology is already set) and are searched value by value.
pub(crate) fn apply_topology(
    pendings: &mut [request::PendingClaim],
    constraints: &[request::Constraint],
) -> Vec<request::Constraint> {
    use fgpu_driver::engine::Topology;
    let mut cross = Vec::new();
    for c in constraints {
        let covered: BTreeSet<usize> = pendings
            .iter()
            .filter(|p| c.applies(p))
            .map(|p| p.request_index)
            .collect();
        let topology = match c.attribute {
            request::MatchAttribute::NumaNode => Topology::SameNuma,
            request::MatchAttribute::PcieRoot => Topology::SamePcieRoot,
        };
        let free = pendings
            .iter()
            .filter(|p| c.applies(p))
            .all(|p| p.request.topology == Topology::Any);
        if covered.len() == 1 && free {
            for p in pendings.iter_mut().filter(|p| c.applies(p)) {
                p.request.topology = topology;
            }
        } else {
            cross.push(c.clone());
        }
    }
    cross
}

/// The nodes a request may go to: `node` alone when the claim (or its pod) is already
/// there, else every node away from `avoid` (every node when that leaves none). `inv`
/// itself where nothing is left out: a claim's search reads the candidates, it does not
/// change them.
fn candidates<'v>(
    inv: &'v Inventory,
    node: Option<&str>,
    avoid: Option<&BTreeSet<String>>,
) -> Cow<'v, Inventory> {
    match (node, avoid) {
        (Some(n), _) => Cow::Owned(restrict(inv, n)),
        (None, Some(avoid)) => {
            let away = Inventory {
                nodes: inv
                    .nodes
                    .iter()
                    .filter(|n| !avoid.contains(&n.name))
                    .cloned()
                    .collect(),
            };
            if away.nodes.is_empty() || away.nodes.len() == inv.nodes.len() {
                Cow::Borrowed(inv)
            } else {
                Cow::Owned(away)
            }
        }
        (None, None) => Cow::Borrowed(inv),
    }
}

/// Removes from `inv` the GPUs the claim's earlier requests (`parts`) took: a claim takes
/// a GPU once (the node side names devices per claim and GPU).
fn without_taken(inv: &mut Inventory, parts: &[(&request::PendingClaim, Grant)]) {
    for n in &mut inv.nodes {
        n.gpus.retain(|g| {
            !parts
                .iter()
                .any(|(_, p)| p.node == n.name && p.devices.iter().any(|d| d.gpu == g.id))
        });
    }
}

/// The end of a pending message that says why only `node` was tried: the pod's other
/// claims are there (`first`: no request of this claim placed yet) or the claim's other
/// requests are.
fn where_others_are(node: Option<&str>, first: bool) -> String {
    match (node, first) {
        (Some(n), true) => format!(" (the pod's other claims are on node {n})"),
        (Some(n), false) => format!(" (the claim's other requests are on node {n})"),
        (None, _) => String::new(),
    }
}

fn rejected(claim: ObjectId, pod: ObjectId, e: &RequestError) -> Action {
    Action::Rejected {
        claim,
        pod,
        message: explain::rejected(e),
    }
}

#[cfg(test)]
mod mig_tests;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    use crate::inventory::typed_slices as typed;

    const GATE: &str = "gpu.fgpu.dev/allocate";
    const FIN: &str = "gpu.fgpu.dev/allocation";

    /// The settings of the plan's tests (binpack by default); the daemon's tests too.
    pub(crate) fn settings() -> Settings {
        Settings {
            driver: DriverName::default(),
            default_policy: Policy::BINPACK,
            workload_half_life: std::time::Duration::from_secs(3600),
            usage_aware: UsageAware::default(),
        }
    }

    /// One node `node-a` with GPUs of `gib` GiB each.
    fn slice(gib: &[u64], consumable: bool) -> Value {
        let devices: Vec<Value> = gib
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let mut d = json!({"name": format!("gpu-{i}"),
                    "attributes": {"uuid": {"string": format!("GPU-{i}")}, "productName": {"string": "H100"}},
                    "capacity": {"memory": {"value": format!("{g}Gi")}, "cores": {"value": "100"}}});
                if consumable {
                    d["allowMultipleAllocations"] = json!(true);
                }
                d
            })
            .collect();
        json!({"metadata": {"name": "node-a-gpu.fgpu.dev"},
               "spec": {"driver": "gpu.fgpu.dev", "nodeName": "node-a",
                        "pool": {"name": "node-a", "generation": 1}, "devices": devices}})
    }

    fn claim(name: &str, gib: u64) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "7"},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "shared.gpu.fgpu.dev"}}],
                "config": [{"requests": ["gpu"], "opaque": {"driver": "gpu.fgpu.dev", "parameters": {
                    "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": format!("{gib}Gi")}}}]}}})
    }

    /// `claim` allocated on node-a/`device` with `gib` as the grant.
    fn allocated(name: &str, gib: u64, device: &str) -> Value {
        let mut c = claim(name, gib);
        c["metadata"]["finalizers"] = json!([FIN]);
        c["status"]["allocation"] = json!({
            "devices": {"results": [{"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": device}],
                        "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.fgpu.dev",
                            "parameters": {"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig", "memory": format!("{gib}Gi")}}}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}});
        c
    }

    /// A pod using template claims, `claims` = (entry, generated claim name or None).
    fn pod(name: &str, created: &str, gated: bool, claims: &[(&str, Option<&str>)]) -> Value {
        let spec_claims: Vec<Value> = claims
            .iter()
            .map(|(e, _)| json!({"name": e, "resourceClaimTemplateName": "t"}))
            .collect();
        let statuses: Vec<Value> = claims
            .iter()
            .filter_map(|(e, c)| c.map(|c| json!({"name": e, "resourceClaimName": c})))
            .collect();
        let mut p = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "3",
                         "creationTimestamp": created},
            "spec": {"resourceClaims": spec_claims, "schedulingGates": [{"name": "other/gate"}]},
            "status": {"phase": "Pending", "resourceClaimStatuses": statuses}});
        if gated {
            p["spec"]["schedulingGates"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": GATE}));
        }
        p
    }

    /// Plans `claims` and `pods` over `inv` as the daemon does (views, every allocation in
    /// one pass) with `model` as the workload model seen, under `settings`.
    fn plan_with_model(
        claims: &[Value],
        pods: &[Value],
        inv: &inventory::SliceInventory,
        model: Option<&WorkloadModel>,
        settings: &Settings,
    ) -> Plan {
        let d = &settings.driver;
        let cv: Vec<ClaimView> = claims
            .iter()
            .map(|c| ClaimView::of_json(c, d, &inv.inventory))
            .collect();
        let pv: Vec<PodView> = pods.iter().map(|p| PodView::of(p, GATE)).collect();
        let whole = |id: &ObjectId| {
            claims
                .iter()
                .find(|c| ObjectId::of(c) == *id)
                .map(|c| usage::typed(c).unwrap())
        };
        let (crefs, prefs): (Vec<_>, Vec<_>) = (cv.iter().collect(), pv.iter().collect());
        let (avoid, unsettled) = (BTreeMap::new(), BTreeSet::new());
        let views = Views {
            claims: &crefs,
            pods: &prefs,
            inventory: inv,
            consumable: false,
            claim: &whole,
            avoid: &avoid,
            unsettled: &unsettled,
            class: None,
            max_allocations: usize::MAX,
            model,
            now: 0,
        };
        plan_views(views, settings, true)
    }

    pub(super) fn run(claims: &[Value], pods: &[Value], slices: &[Value]) -> Plan {
        plan(
            Snapshot {
                claims,
                pods,
                slices,
                avoid: &BTreeMap::new(),
                unsettled: &BTreeSet::new(),
                class: None,
            },
            &settings(),
            true,
        )
    }

    fn kinds(p: &Plan) -> Vec<String> {
        p.actions
            .iter()
            .map(|a| match a {
                Action::Allocate {
                    claim, allocation, ..
                } => format!(
                    "allocate {} on {}",
                    claim.name, allocation.grant.devices[0].gpu
                ),
                Action::Pending { claim, .. } => format!("pending {}", claim.name),
                Action::Rejected { claim, .. } => format!("rejected {}", claim.name),
                Action::Ungate { pod, .. } => format!("ungate {}", pod.name),
                Action::Revoke { claim, pod, .. } => {
                    format!("revoke {} of {}", claim.name, pod.name)
                }
                Action::Release {
                    claim, deallocate, ..
                } => format!("release {} deallocate={deallocate}", claim.name),
            })
            .collect()
    }

    #[test]
    fn one_pass_never_grants_the_same_memory_twice() {
        // 16Gi GPU: 8 + 6 fit, the third (4Gi) does not; binpack keeps all on gpu-0 first.
        let claims = [claim("a", 8), claim("b", 6), claim("c", 4)];
        let pods = [
            pod("pa", "2026-01-01T00:00:01Z", true, &[("g", Some("a"))]),
            pod("pb", "2026-01-01T00:00:02Z", true, &[("g", Some("b"))]),
            pod("pc", "2026-01-01T00:00:03Z", true, &[("g", Some("c"))]),
        ];
        let p = run(&claims, &pods, &[slice(&[16], false)]);
        assert_eq!(
            kinds(&p),
            ["allocate a on gpu-0", "allocate b on gpu-0", "pending c"]
        );
        // The two planned grants share gpu-0 (the HAMi families' shared count).
        assert_eq!(p.shares, [[2]]);
        let Action::Pending {
            message,
            pod: waiter,
            reason,
            ..
        } = &p.actions[2]
        else {
            unreachable!()
        };
        assert_eq!(waiter.name, "pc");
        // Free now it would fit: it waits for capacity, not forever.
        assert_eq!(*reason, WaitReason::NoFit);
        assert_eq!(p.actions[2].wait_reason(), Some(WaitReason::NoFit));
        assert_eq!(p.actions[0].wait_reason(), None);
        // 20Gi fits no 16Gi GPU even idle.
        let big = [claim("big", 20)];
        let pods = [pod(
            "pbig",
            "2026-01-01T00:00:01Z",
            true,
            &[("g", Some("big"))],
        )];
        let p2 = run(&big, &pods, &[slice(&[16], false)]);
        assert_eq!(kinds(&p2), ["pending big"]);
        assert_eq!(p2.actions[0].wait_reason(), Some(WaitReason::NeverFits));
        assert!(message.contains("no GPU has 4Gi"), "{message}");
        assert!(
            message.contains("best candidate node-a/gpu-0 has 2Gi"),
            "{message}"
        );
    }

    #[test]
    fn a_pass_plans_at_most_max_allocations_and_skips_claims_changed_since_their_view() {
        let claims = [claim("a", 4), claim("b", 4), claim("c", 4)];
        let pods = [
            pod("pa", "2026-01-01T00:00:01Z", true, &[("g", Some("a"))]),
            pod("pb", "2026-01-01T00:00:02Z", true, &[("g", Some("b"))]),
            pod("pc", "2026-01-01T00:00:03Z", true, &[("g", Some("c"))]),
        ];
        let d = DriverName::default();
        let inv = inventory::from_slices(d.as_str(), typed([slice(&[16], false)]));
        let cv: Vec<ClaimView> = claims
            .iter()
            .map(|c| ClaimView::of_json(c, &d, &inv.inventory))
            .collect();
        let pv: Vec<PodView> = pods.iter().map(|p| PodView::of(p, GATE)).collect();
        // Claim b is at another version now: its whole object is not there.
        let whole = |id: &ObjectId| {
            claims
                .iter()
                .find(|c| ObjectId::of(c) == *id && id.name != "b")
                .map(|c| usage::typed(c).unwrap())
        };
        let (crefs, prefs): (Vec<_>, Vec<_>) = (cv.iter().collect(), pv.iter().collect());
        let (avoid, unsettled) = (BTreeMap::new(), BTreeSet::new());
        let views = |max| Views {
            claims: &crefs,
            pods: &prefs,
            inventory: &inv,
            consumable: false,
            claim: &whole,
            avoid: &avoid,
            unsettled: &unsettled,
            class: None,
            max_allocations: max,
            model: None,
            now: 0,
        };
        let p = plan_views(views(1), &settings(), true);
        assert_eq!(kinds(&p), ["allocate a on gpu-0"], "one per pass");
        let p = plan_views(views(usize::MAX), &settings(), true);
        assert_eq!(
            kinds(&p),
            ["allocate a on gpu-0", "allocate c on gpu-0"],
            "b changed since its view: left to the next pass"
        );
    }

    #[test]
    fn fragaware_scores_against_the_model_and_falls_back_to_binpack_without_one() {
        // node-a: two 16Gi GPUs, 4Gi of gpu-0 taken; a new 4Gi claim. Binpack stacks it
        // on gpu-0 (8Gi left there); against a workload of 12Gi claims fragaware keeps
        // 12Gi free on both GPUs instead.
        let claims = [allocated("x", 4, "gpu-0"), claim("n", 4)];
        let pods = [
            pod("px", "2026-01-01T00:00:00Z", false, &[("g", Some("x"))]),
            pod("pn", "2026-01-01T00:00:01Z", true, &[("g", Some("n"))]),
        ];
        let d = DriverName::default();
        let inv = inventory::from_slices(d.as_str(), typed([slice(&[16, 16], false)]));
        let mut model = WorkloadModel::new(std::time::Duration::from_secs(3600));
        for i in 0..10 {
            model.observe(&format!("seen-{i}"), (0, 0, 1, 750), 0);
        }
        let empty = WorkloadModel::new(std::time::Duration::from_secs(3600));
        let fragaware = Settings {
            default_policy: Policy::FRAGAWARE,
            ..settings()
        };
        let message = |p: &Plan| match &p.actions[0] {
            Action::Allocate { message, .. } => message.clone(),
            a => panic!("{a:?}"),
        };
        let p = plan_with_model(&claims, &pods, &inv, Some(&model), &fragaware);
        assert_eq!(kinds(&p), ["allocate n on gpu-1"]);
        assert!(!message(&p).contains("workload model"), "{}", message(&p));
        // Binpack on the same pass: the fuller GPU.
        let p = plan_with_model(&claims, &pods, &inv, Some(&model), &settings());
        assert_eq!(kinds(&p), ["allocate n on gpu-0"]);
        // No model (nothing seen yet): binpack, and the claim's Event says so.
        for none in [None, Some(&empty)] {
            let p = plan_with_model(&claims, &pods, &inv, none, &fragaware);
            assert_eq!(kinds(&p), ["allocate n on gpu-0"]);
            assert!(
                message(&p).contains(
                    "policy fragaware has no workload model yet (no request holding a GPU seen lately), placed by binpack"
                ),
                "{}",
                message(&p)
            );
        }
    }

    #[test]
    fn the_model_is_rebuilt_from_the_allocated_claims_once_each() {
        let mut x = allocated("x", 4, "gpu-0");
        x["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut y = allocated("y", 8, "gpu-1");
        y["metadata"]["creationTimestamp"] = json!("2026-01-01T01:00:00Z");
        let claims = [x, y, claim("pending", 2)];
        let d = DriverName::default();
        let inv = inventory::from_slices(d.as_str(), typed([slice(&[16, 16], false)]));
        let cv: Vec<ClaimView> = claims
            .iter()
            .map(|c| ClaimView::of_json(c, &d, &inv.inventory))
            .collect();
        let crefs: Vec<&ClaimView> = cv.iter().collect();
        let mut model = WorkloadModel::new(std::time::Duration::from_secs(3600));
        observe_claims(&mut model, &crefs, &inv.inventory);
        observe_claims(&mut model, &crefs, &inv.inventory);
        assert_eq!(model.len(), 2, "allocated claims only, once each");
        let t1 = cv[1].created;
        assert_eq!(t1 - cv[0].created, 3600);
        let w = model.weights(t1);
        // 4Gi of 16 is 250 milli, an hour old (half weight); 8Gi is 500, new.
        assert_eq!(w.get(&(0, 0, 1, 250)), Some(&0.5));
        assert_eq!(w.get(&(0, 0, 1, 500)), Some(&1.0));
    }

    #[test]
    fn oldest_pod_first_and_the_ledger_counts_existing_allocations() {
        // Already allocated by someone (scheduler or an earlier pass): 10Gi of 16.
        let claims = [
            allocated("x", 10, "gpu-0"),
            claim("late", 6),
            claim("early", 8),
        ];
        let pods = [
            pod("px", "2026-01-01T00:00:00Z", false, &[("g", Some("x"))]),
            pod("late", "2026-01-01T00:00:09Z", true, &[("g", Some("late"))]),
            pod(
                "early",
                "2026-01-01T00:00:01Z",
                true,
                &[("g", Some("early"))],
            ),
        ];
        let p = run(&claims, &pods, &[slice(&[16, 16], false)]);
        // early (8Gi) does not fit beside x's 10Gi: gpu-1; late (6Gi) then fits on gpu-0.
        assert_eq!(
            kinds(&p),
            ["allocate early on gpu-1", "allocate late on gpu-0"]
        );
    }

    #[test]
    fn the_usage_term_takes_the_gpu_with_measured_headroom_only_when_on_and_fresh() {
        // busy and calm hold 10Gi each of two like GPUs; the node monitor measured busy at
        // 90 % and calm at 5 %. `now` is the new claim's creation time.
        let measured = |name: &str, device: &str, sm: u64, at: &str| {
            let mut c = allocated(name, 10, device);
            c["status"]["devices"] = json!([{"driver": "gpu.fgpu.dev", "pool": "node-a", "device": device,
                "data": {"smUtilizationPercent": sm, "sampledAt": at, "grantedCores": 0}}]);
            c
        };
        let mut new = claim("new", 10);
        new["metadata"]["creationTimestamp"] = json!("2026-12-02T07:00:00Z");
        let pods = [
            pod("pb", "2026-01-01T00:00:00Z", false, &[("g", Some("busy"))]),
            pod("pc", "2026-01-01T00:00:00Z", false, &[("g", Some("calm"))]),
            pod("pn", "2026-01-01T00:00:01Z", true, &[("g", Some("new"))]),
        ];
        let plan_at = |sampled: &str, weight: f64| {
            let claims = [
                measured("busy", "gpu-0", 90, sampled),
                measured("calm", "gpu-1", 5, sampled),
                new.clone(),
            ];
            let settings = Settings {
                usage_aware: UsageAware {
                    weight,
                    ..UsageAware::default()
                },
                ..settings()
            };
            let snap = Snapshot {
                claims: &claims,
                pods: &pods,
                slices: &[slice(&[80, 80], false)],
                avoid: &BTreeMap::new(),
                unsettled: &BTreeSet::new(),
                class: None,
            };
            kinds(&plan(snap, &settings, true))
        };
        let fresh = "2026-12-02T06:59:30Z";
        assert_eq!(plan_at(fresh, 0.0), ["allocate new on gpu-0"], "off");
        assert_eq!(plan_at(fresh, 1.0), ["allocate new on gpu-1"], "on");
        // Ten minutes old: unknown load, the policy alone decides.
        let stale = "2026-12-02T06:50:00Z";
        assert_eq!(plan_at(stale, 1.0), ["allocate new on gpu-0"], "stale");
    }

    #[test]
    fn ungate_only_when_every_shared_claim_is_allocated() {
        let claims = [allocated("a", 4, "gpu-0"), claim("b", 4)];
        let pods = [
            pod(
                "both",
                "2026-01-01T00:00:01Z",
                true,
                &[("g1", Some("a")), ("g2", Some("b"))],
            ),
            pod("one", "2026-01-01T00:00:02Z", true, &[("g", Some("a"))]),
            pod("notyet", "2026-01-01T00:00:03Z", true, &[("g", None)]),
        ];
        let p = run(&claims, &pods, &[slice(&[16], false)]);
        assert_eq!(kinds(&p), ["allocate b on gpu-0", "ungate one"]);
        let Action::Ungate { keep, .. } = &p.actions[1] else {
            unreachable!()
        };
        assert_eq!(
            keep,
            &vec![json!({"name": "other/gate"})],
            "other gates stay"
        );
    }

    #[test]
    fn a_pods_claims_stay_on_one_node() {
        let mut other = slice(&[80], false);
        other["metadata"]["name"] = json!("node-b-gpu.fgpu.dev");
        other["spec"]["nodeName"] = json!("node-b");
        other["spec"]["pool"]["name"] = json!("node-b");
        // a is on node-a (16Gi, 4 used); b (14Gi) would fit only on node-b.
        let claims = [allocated("a", 4, "gpu-0"), claim("b", 14)];
        let pods = [pod(
            "p",
            "2026-01-01T00:00:01Z",
            true,
            &[("g1", Some("a")), ("g2", Some("b"))],
        )];
        let p = run(&claims, &pods, &[slice(&[16], false), other]);
        assert_eq!(kinds(&p), ["pending b"]);
        let Action::Pending { message, .. } = &p.actions[0] else {
            unreachable!()
        };
        assert!(
            message.ends_with("(the pod's other claims are on node node-a)"),
            "{message}"
        );
    }

    #[test]
    fn ungated_pods_and_other_classes_are_left_to_the_scheduler() {
        let mut whole = claim("w", 4);
        whole["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] =
            json!("gpu.fgpu.dev");
        let claims = [claim("a", 4), whole];
        let pods = [
            pod("free", "2026-01-01T00:00:01Z", false, &[("g", Some("a"))]),
            pod("w", "2026-01-01T00:00:02Z", true, &[("g", Some("w"))]),
        ];
        let p = run(&claims, &pods, &[slice(&[16], false)]);
        // a: its pod is not gated; w: not the shared class, so the gated pod is ungated.
        assert_eq!(kinds(&p), ["ungate w"]);
    }

    #[test]
    fn bad_config_is_rejected_and_nothing_is_written() {
        let mut bad = claim("bad", 4);
        bad["spec"]["devices"]["config"][0]["opaque"]["parameters"]["cores"] = json!(140);
        let pods = [pod(
            "p",
            "2026-01-01T00:00:01Z",
            true,
            &[("g", Some("bad"))],
        )];
        let p = run(&[bad], &pods, &[slice(&[16], false)]);
        assert_eq!(kinds(&p), ["rejected bad"]);
        assert_eq!(p.actions[0].wait_reason(), Some(WaitReason::Rejected));
        let Action::Rejected { message, .. } = &p.actions[0] else {
            unreachable!()
        };
        assert!(
            message.contains("spec.devices.config[0].opaque.parameters.cores"),
            "{message}"
        );
    }

    #[test]
    fn release_when_no_pod_uses_the_claim() {
        let mut reserved = allocated("reserved", 4, "gpu-0");
        reserved["status"]["reservedFor"] =
            json!([{"resource": "pods", "name": "gone", "uid": "u"}]);
        let mut deleting = allocated("deleting", 4, "gpu-0");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let mut done = allocated("done", 4, "gpu-0");
        done["metadata"]["name"] = json!("done");
        let mut finished = pod(
            "finished",
            "2026-01-01T00:00:01Z",
            false,
            &[("g", Some("done"))],
        );
        finished["status"]["phase"] = json!("Succeeded");
        let claims = [
            allocated("orphan", 4, "gpu-0"),
            allocated("used", 4, "gpu-0"),
            reserved,
            deleting,
            done,
            claim("never", 4),
        ];
        let pods = [
            pod(
                "user",
                "2026-01-01T00:00:01Z",
                false,
                &[("g", Some("used"))],
            ),
            finished,
        ];
        let p = run(&claims, &pods, &[slice(&[80], false)]);
        let mut k = kinds(&p);
        k.sort();
        assert_eq!(
            k,
            [
                "release deleting deallocate=false",
                "release done deallocate=true",
                "release orphan deallocate=true",
            ]
        );
    }

    #[test]
    fn consumable_capacity_is_read_from_the_slices_and_written() {
        let claims = [claim("a", 4)];
        let pods = [pod("p", "2026-01-01T00:00:01Z", true, &[("g", Some("a"))])];
        for consumable in [false, true] {
            let slices = [slice(&[16], consumable)];
            let p = run(&claims, &pods, &slices);
            assert_eq!(p.consumable, consumable);
            let Action::Allocate { allocation, .. } = &p.actions[0] else {
                panic!("{:?}", kinds(&p))
            };
            let r = &allocation.allocation["devices"]["results"][0];
            assert_eq!(r["shareID"].is_string(), consumable, "{r}");
        }
        // v1beta1 devices carry the field under `basic`.
        let beta = json!({"spec": {"driver": "gpu.fgpu.dev", "devices": [{"name": "gpu-0", "basic": {"allowMultipleAllocations": true}}]}});
        assert!(consumable("gpu.fgpu.dev", typed([&beta])));
        assert!(!consumable("other.dev", typed([beta])));
    }

    #[test]
    fn capacity_mode_only_ungates_and_releases() {
        let claims = [claim("a", 4), allocated("orphan", 4, "gpu-0")];
        let pods = [
            pod("p", "2026-01-01T00:00:01Z", true, &[("g", Some("a"))]),
            pod("q", "2026-01-01T00:00:02Z", true, &[("g", None)]),
        ];
        let slices = [slice(&[16], true)];
        let p = plan(
            Snapshot {
                claims: &claims,
                pods: &pods,
                slices: &slices,
                avoid: &BTreeMap::new(),
                unsettled: &BTreeSet::new(),
                class: None,
            },
            &settings(),
            false,
        );
        assert_eq!(
            kinds(&p),
            ["release orphan deallocate=true", "ungate p", "ungate q"]
        );
    }

    #[test]
    fn a_cleared_allocation_is_retried_away_from_the_node() {
        let mut other = slice(&[80], false);
        other["metadata"]["name"] = json!("node-b-gpu.fgpu.dev");
        other["spec"]["nodeName"] = json!("node-b");
        other["spec"]["pool"]["name"] = json!("node-b");
        let slices = [slice(&[80], false), other];
        // Allocated by us once (finalizer), cleared by the scheduler; the pod is ungated.
        let mut cleared = claim("c", 4);
        cleared["metadata"]["finalizers"] = json!([FIN]);
        let mut bound = claim("d", 4);
        bound["metadata"]["finalizers"] = json!([FIN]);
        let claims = [cleared, bound, claim("theirs", 4)];
        let mut on_node = pod("bound", "2026-01-01T00:00:02Z", false, &[("g", Some("d"))]);
        on_node["spec"]["nodeName"] = json!("node-a");
        let pods = [
            pod("p", "2026-01-01T00:00:01Z", false, &[("g", Some("c"))]),
            on_node,
            pod("s", "2026-01-01T00:00:03Z", false, &[("g", Some("theirs"))]),
        ];
        let mut avoid = BTreeMap::new();
        avoid.insert("uid-c".to_owned(), BTreeSet::from(["node-a".to_owned()]));
        fn snap<'a>(
            claims: &'a [Value],
            pods: &'a [Value],
            slices: &'a [Value],
            avoid: &'a BTreeMap<String, BTreeSet<String>>,
        ) -> Snapshot<'a> {
            Snapshot {
                claims,
                pods,
                slices,
                avoid,
                unsettled: const { &BTreeSet::new() },
                class: None,
            }
        }
        let p = plan(snap(&claims, &pods, &slices, &avoid), &settings(), true);
        // Only c: d's pod is bound (the scheduler's business), theirs has no finalizer.
        assert_eq!(kinds(&p), ["allocate c on gpu-0"]);
        let Action::Allocate {
            allocation, retry, ..
        } = &p.actions[0]
        else {
            unreachable!()
        };
        assert!(*retry);
        assert_eq!(allocation.grant.node, "node-b", "away from node-a");
        // Avoiding every node: the whole inventory again (binpack: node-a first).
        avoid.insert(
            "uid-c".to_owned(),
            BTreeSet::from(["node-a".to_owned(), "node-b".to_owned()]),
        );
        let p = plan(snap(&claims, &pods, &slices, &avoid), &settings(), true);
        assert_eq!(kinds(&p), ["allocate c on gpu-0"]);
        // Not in capacity mode.
        let p = plan(snap(&claims, &pods, &slices, &avoid), &settings(), false);
        assert_eq!(kinds(&p), Vec::<String>::new());
    }

    /// `allocated`, with consumed capacity as kube-scheduler writes it and no finalizer
    /// (kube-scheduler's), or with the finalizer (the controller's).
    fn shared_grant(name: &str, gib: u64, cores: u32, ours: bool, at: &str) -> Value {
        let mut c = allocated(name, gib, "gpu-0");
        let r = &mut c["status"]["allocation"]["devices"]["results"][0];
        r["consumedCapacity"] = json!({"memory": format!("{gib}Gi"), "cores": cores.to_string()});
        r["shareID"] = json!(format!("share-{name}"));
        c["status"]["allocation"]["allocationTimestamp"] = json!(at);
        if !ours {
            c["metadata"]["finalizers"] = json!([]);
        }
        c
    }

    #[test]
    fn a_tentative_claim_over_booked_by_the_scheduler_is_revoked_not_ungated() {
        // One 16Gi GPU. The scheduler's claim s (8Gi, pod already bound) and ours, a and b
        // (6Gi each, pods still gated), were written in the same moment: 20Gi of 16.
        let mut s = shared_grant("s", 8, 10, false, "2026-01-01T00:00:05Z");
        s["status"]["reservedFor"] = json!([{"resource": "pods", "name": "ps", "uid": "u"}]);
        let claims = [
            // b is listed first but was allocated later: a keeps its place.
            shared_grant("b", 6, 10, true, "2026-01-01T00:00:02Z"),
            shared_grant("a", 6, 10, true, "2026-01-01T00:00:01Z"),
            s,
        ];
        let mut ps = pod("ps", "2026-01-01T00:00:00Z", false, &[("g", Some("s"))]);
        ps["spec"]["nodeName"] = json!("node-a");
        let pods = [
            ps,
            pod("pa", "2026-01-01T00:00:01Z", true, &[("g", Some("a"))]),
            pod("pb", "2026-01-01T00:00:02Z", true, &[("g", Some("b"))]),
        ];
        let p = run(&claims, &pods, &[slice(&[16], true)]);
        assert_eq!(kinds(&p), ["revoke b of pb", "ungate pa"]);
        let Action::Revoke { message, .. } = &p.actions[0] else {
            unreachable!()
        };
        assert!(
            message.contains("on node node-a no longer fits"),
            "{message}"
        );
        // The ledger keeps the committed claim and the tentative one that fits.
        let gpu = &p.usage.nodes[0].gpus[0];
        assert_eq!(gpu.memory_total - gpu.memory_free, 14 << 30);

        // Once a's pod is ungated, a is committed even though it is not reserved yet.
        let mut pods = pods;
        pods[1] = pod("pa", "2026-01-01T00:00:01Z", false, &[("g", Some("a"))]);
        let p = run(&claims, &pods, &[slice(&[16], true)]);
        assert_eq!(kinds(&p), ["revoke b of pb"]);
        // Without the scheduler's claim nothing is revoked and both pods go.
        let p = run(&claims[..2], &pods[1..], &[slice(&[16], true)]);
        assert_eq!(kinds(&p), ["ungate pb"]);
    }

    #[test]
    fn unsettled_allocations_keep_the_gate() {
        let claims = [
            shared_grant("a", 4, 10, true, "2026-01-01T00:00:01Z"),
            shared_grant("b", 4, 10, true, "2026-01-01T00:00:01Z"),
        ];
        let pods = [
            pod("pa", "2026-01-01T00:00:01Z", true, &[("g", Some("a"))]),
            pod("pb", "2026-01-01T00:00:02Z", true, &[("g", Some("b"))]),
        ];
        let slices = [slice(&[16], true)];
        let unsettled = BTreeSet::from(["uid-b".to_owned()]);
        let snap = Snapshot {
            claims: &claims,
            pods: &pods,
            slices: &slices,
            avoid: &BTreeMap::new(),
            unsettled: &unsettled,
            class: None,
        };
        assert_eq!(kinds(&plan(snap, &settings(), true)), ["ungate pa"]);
        // Capacity mode: kube-scheduler allocated; nothing to wait for.
        assert_eq!(
            kinds(&plan(snap, &settings(), false)),
            ["ungate pa", "ungate pb"]
        );
    }

    /// `claim` with a second request `extra` of `gib`.
    fn two_requests(name: &str, gib: u64, extra: u64) -> Value {
        let mut c = claim(name, gib);
        c["spec"]["devices"]["requests"][0]["name"] = json!("first");
        c["spec"]["devices"]["config"][0]["requests"] = json!(["first"]);
        c["spec"]["devices"]["requests"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "second", "exactly": {
                "deviceClassName": "shared.gpu.fgpu.dev",
                "capacity": {"requests": {"memory": format!("{extra}Gi")}}}}));
        c
    }

    #[test]
    fn a_claim_with_two_requests_takes_two_gpus_on_one_node() {
        let pods = [pod("p", "2026-01-01T00:00:01Z", true, &[("g", Some("c"))])];
        // Binpack would put both 4Gi requests on gpu-0; a claim takes a GPU once.
        let p = run(
            &[two_requests("c", 4, 4)],
            &pods,
            &[slice(&[16, 16], false)],
        );
        let Action::Allocate { allocation, .. } = &p.actions[0] else {
            panic!("{:?}", kinds(&p))
        };
        let results = allocation.allocation["devices"]["results"]
            .as_array()
            .unwrap();
        let got: Vec<(&str, &str)> = results
            .iter()
            .map(|r| {
                (
                    r["request"].as_str().unwrap(),
                    r["device"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(got, [("first", "gpu-0"), ("second", "gpu-1")]);
        assert_eq!(allocation.grant.id, "uid-c");
        assert_eq!(allocation.grant.devices.len(), 2);
        // The written allocation reads back as the same grant.
        let mut written = two_requests("c", 4, 4);
        written["status"]["allocation"] = allocation.allocation.clone();
        let inv =
            inventory::from_slices("gpu.fgpu.dev", typed(&[slice(&[16, 16], false)])).inventory;
        let g = usage::claim_grant(&usage::typed(&written).unwrap(), "gpu.fgpu.dev", &inv)
            .unwrap()
            .unwrap();
        let mem: Vec<u64> = g.devices.iter().map(|d| d.memory).collect();
        assert_eq!(mem, [4 << 30, 4 << 30]);

        // One GPU: the second request has nowhere to go; nothing is granted.
        let p = run(&[two_requests("c", 4, 4)], &pods, &[slice(&[16], false)]);
        assert_eq!(kinds(&p), ["pending c"]);
        let Action::Pending { message, .. } = &p.actions[0] else {
            unreachable!()
        };
        assert!(message.starts_with("request second: "), "{message}");
        assert!(
            message.ends_with("(the claim's other requests are on node node-a)"),
            "{message}"
        );
        assert_eq!(p.usage.nodes[0].gpus[0].memory_free, 16 << 30);
    }

    /// A slice of `node` with GPUs of (GiB, NUMA node, product name).
    fn node_slice(node: &str, gpus: &[(u64, u32, &str)]) -> Value {
        let devices: Vec<Value> = gpus
            .iter()
            .enumerate()
            .map(|(i, (g, numa, model))| {
                json!({"name": format!("gpu-{i}"),
                    "attributes": {"uuid": {"string": format!("GPU-{node}-{i}")},
                        "productName": {"string": model}, "numaNode": {"int": numa},
                        "resource.kubernetes.io/pcieRoot": {"string": format!("pci{numa}")}},
                    "capacity": {"memory": {"value": format!("{g}Gi")}, "cores": {"value": "100"}}})
            })
            .collect();
        json!({"metadata": {"name": format!("{node}-gpu.fgpu.dev")},
               "spec": {"driver": "gpu.fgpu.dev", "nodeName": node,
                        "pool": {"name": node, "generation": 1}, "devices": devices}})
    }

    /// A claim `name` with one request `gpu` written as `request` (the `exactly` or
    /// `firstAvailable` part), and `extra` fields of `spec.devices`.
    fn claim_with(name: &str, requests: Value, extra: Value) -> Value {
        let mut c = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "resourceVersion": "7"},
            "spec": {"devices": {"requests": requests}}});
        if let Some(o) = extra.as_object() {
            for (k, v) in o {
                c["spec"]["devices"][k] = v.clone();
            }
        }
        c
    }

    fn shared(gib: u64, more: Value) -> Value {
        let mut e = json!({"deviceClassName": "shared.gpu.fgpu.dev",
            "capacity": {"requests": {"memory": format!("{gib}Gi")}}});
        if let Some(o) = more.as_object() {
            for (k, v) in o {
                e[k] = v.clone();
            }
        }
        e
    }

    /// (request, pool, device) of each result of the first action, which must allocate.
    fn results(p: &Plan) -> Vec<(String, String, String)> {
        let Some(Action::Allocate { allocation, .. }) = p
            .actions
            .iter()
            .find(|a| matches!(a, Action::Allocate { .. }))
        else {
            panic!("no allocation: {:?}", p.actions)
        };
        allocation.allocation["devices"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let f = |k: &str| r[k].as_str().unwrap().to_owned();
                (f("request"), f("pool"), f("device"))
            })
            .collect()
    }

    /// The message of the first `Pending` or `Rejected` action, with its kind.
    fn waiting(p: &Plan) -> (String, String) {
        for a in &p.actions {
            match a {
                Action::Pending {
                    message, reason, ..
                } => return (reason.as_str().to_owned(), message.clone()),
                Action::Rejected { message, .. } => return ("rejected".into(), message.clone()),
                _ => {}
            }
        }
        panic!("nothing waits: {:?}", kinds(p))
    }

    /// Within one pass, a selector that accepts every device is not evaluated again, but
    /// one that accepts some devices still narrows every claim that carries it.
    #[test]
    fn a_pass_remembers_only_selectors_that_accept_every_device() {
        let slices = [
            node_slice("node-a", &[(80, 0, "H100"), (80, 0, "H100")]),
            node_slice("node-b", &[(80, 0, "A100"), (80, 0, "A100")]),
        ];
        let any = r#"device.driver == "gpu.fgpu.dev""#;
        let a100 = r#"device.attributes["gpu.fgpu.dev"].productName == "A100""#;
        let with = |name: &str, exprs: &[&str]| {
            let selectors: Vec<Value> = exprs
                .iter()
                .map(|e| json!({"cel": {"expression": e}}))
                .collect();
            claim_with(
                name,
                json!([{"name": "gpu", "exactly": shared(10, json!({"selectors": selectors}))}]),
                json!({}),
            )
        };
        // Binpack fills node-a first (inventory order), unless a selector says otherwise.
        let claims = [
            with("c0", &[any]),
            with("c1", &[any, a100]),
            with("c2", &[any]),
            with("c3", &[any, a100]),
            with("c4", &[any, a100]),
        ];
        let pods: Vec<Value> = (0..5)
            .map(|i| {
                let (p, c) = (format!("p{i}"), format!("c{i}"));
                pod(
                    &p,
                    &format!("2026-01-01T00:00:0{i}Z"),
                    true,
                    &[("g", Some(&c))],
                )
            })
            .collect();
        let p = run(&claims, &pods, &slices);
        let placed: Vec<(String, String)> = p
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Allocate {
                    claim, allocation, ..
                } => Some((claim.name.clone(), allocation.grant.node.clone())),
                _ => None,
            })
            .collect();
        let want = [
            ("c0", "node-a"),
            ("c1", "node-b"),
            ("c2", "node-a"),
            ("c3", "node-b"),
            ("c4", "node-b"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(c, n)| ((*c).to_owned(), (*n).to_owned()))
            .collect();
        assert_eq!(placed, want);

        let mut scores = Scores::default();
        scores.accept_all(&[any]);
        assert!(scores.accepts_all(&[any]));
        assert!(
            !scores.accepts_all(&[any, a100]),
            "the whole list, in order"
        );
        assert!(
            !scores.accepts_all(&[]),
            "no selector is not a recorded set"
        );
    }

    #[test]
    fn cel_selectors_choose_devices_and_bad_ones_are_refused_by_field() {
        let pods = [pod("p", "2026-01-01T00:00:01Z", true, &[("g", Some("c"))])];
        let slices = [node_slice(
            "node-a",
            &[(16, 0, "Tesla T4"), (80, 0, "NVIDIA H100 80GB HBM3")],
        )];
        let with = |expr: &str| {
            claim_with(
                "c",
                json!([{"name": "gpu", "exactly": shared(4, json!({"selectors": [
                    {"cel": {"expression": "device.driver == \"gpu.fgpu.dev\""}},
                    {"cel": {"expression": expr}}]}))}]),
                json!({}),
            )
        };
        // Binpack alone takes gpu-0 (the smaller GPU is the fuller after the placement).
        let p = run(&[with("true")], &pods, &slices);
        assert_eq!(results(&p)[0].2, "gpu-0");
        let cases = [
            (
                r#"device.attributes["gpu.fgpu.dev"].productName.contains("H100")"#,
                "gpu-1",
            ),
            (
                r#"device.capacity["gpu.fgpu.dev"].memory.compareTo(quantity("20Gi")) > 0"#,
                "gpu-1",
            ),
            (
                r#"device.attributes["gpu.fgpu.dev"].productName.startsWith("Tesla")"#,
                "gpu-0",
            ),
        ];
        for (expr, want) in cases {
            let p = run(&[with(expr)], &pods, &slices);
            assert_eq!(results(&p)[0].2, want, "{expr}");
        }
        // None matches: the claim waits, saying so.
        let p = run(
            &[with(
                r#"device.attributes["gpu.fgpu.dev"].productName == "A100""#,
            )],
            &pods,
            &slices,
        );
        let (reason, message) = waiting(&p);
        assert_eq!(reason, "never_fits");
        assert!(
            message.contains(
                "no GPU matches the selectors (spec.devices.requests[0].exactly.selectors)"
            ),
            "{message}"
        );
        // An evaluation error refuses the claim, naming the field and the device.
        let p = run(
            &[with(r#"device.attributes["gpu.fgpu.dev"].model == "H100""#)],
            &pods,
            &slices,
        );
        let (reason, message) = waiting(&p);
        assert_eq!(reason, "rejected");
        assert!(
            message.contains("spec.devices.requests[0].exactly.selectors[1].cel.expression: on device node-a/gpu-0"),
            "{message}"
        );
        // So does one that does not compile.
        let p = run(&[with("device.attributes[")], &pods, &slices);
        let (reason, message) = waiting(&p);
        assert_eq!(reason, "rejected");
        assert!(
            message.contains("claim ns/c: spec.devices.requests[0].exactly.selectors[1].cel.expression: does not compile"),
            "{message}"
        );
    }

    #[test]
    fn match_attribute_numa_keeps_two_requests_on_one_numa_node() {
        let pods = [pod("p", "2026-01-01T00:00:01Z", true, &[("g", Some("c"))])];
        let slices = [node_slice(
            "node-a",
            &[
                (16, 0, "H100"),
                (16, 0, "H100"),
                (16, 1, "H100"),
                (16, 1, "H100"),
            ],
        )];
        // gpu-0 is partly used (binpack's first choice), gpu-1 is full: NUMA node 0 has
        // room for one request only.
        let busy = [allocated("x", 4, "gpu-0"), allocated("y", 16, "gpu-1")];
        let two = |constraints: Value| {
            claim_with(
                "c",
                json!([{"name": "a", "exactly": shared(4, json!({}))},
                       {"name": "b", "exactly": shared(4, json!({}))}]),
                json!({"constraints": constraints}),
            )
        };
        let mut claims = busy.to_vec();
        claims.push(two(json!([])));
        let p = run(&claims, &pods, &slices);
        let devices: Vec<String> = results(&p).into_iter().map(|r| r.2).collect();
        assert_eq!(
            devices,
            ["gpu-0", "gpu-2"],
            "unconstrained: across NUMA nodes"
        );

        for constraint in [
            json!([{"matchAttribute": "gpu.fgpu.dev/numaNode"}]),
            json!([{"requests": ["a", "b"], "matchAttribute": "gpu.fgpu.dev/numaNode"}]),
            json!([{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]),
        ] {
            let mut claims = busy.to_vec();
            claims.push(two(constraint.clone()));
            let p = run(&claims, &pods, &slices);
            let mut devices: Vec<String> = results(&p).into_iter().map(|r| r.2).collect();
            devices.sort();
            assert_eq!(devices, ["gpu-2", "gpu-3"], "{constraint}");
        }
        // A constraint over one request becomes the engine's topology (both GPUs of a
        // count-2 request on NUMA node 1).
        let mut claims = busy.to_vec();
        claims.push(claim_with(
            "c",
            json!([{"name": "a", "exactly": shared(4, json!({"count": 2}))}]),
            json!({"constraints": [{"requests": ["a"], "matchAttribute": "gpu.fgpu.dev/numaNode"}]}),
        ));
        let p = run(&claims, &pods, &slices);
        let mut devices: Vec<String> = results(&p).into_iter().map(|r| r.2).collect();
        devices.sort();
        assert_eq!(devices, ["gpu-2", "gpu-3"]);

        // Room for neither: the claim waits, naming the constraint.
        let mut claims = vec![allocated("x", 16, "gpu-0"), allocated("y", 16, "gpu-2")];
        claims.push(two(json!([{"matchAttribute": "gpu.fgpu.dev/numaNode"}])));
        let p = run(&claims, &pods, &slices);
        let (reason, message) = waiting(&p);
        assert_eq!(reason, "no_fit", "{message}");
        assert!(message.starts_with("request b: "), "{message}");
        assert!(
            message.contains("under spec.devices.constraints[0]"),
            "{message}"
        );
    }

    #[test]
    fn unsupported_constraints_are_refused_by_field() {
        let pods = [pod("p", "2026-01-01T00:00:01Z", true, &[("g", Some("c"))])];
        let slices = [node_slice("node-a", &[(16, 0, "H100"), (16, 0, "H100")])];
        let cases = [
            (
                json!([{"matchAttribute": "gpu.fgpu.dev/productName"}]),
                "spec.devices.constraints[0].matchAttribute: \"gpu.fgpu.dev/productName\" is not supported",
            ),
            (
                json!([{"matchAttribute": "numaNode"}]),
                "spec.devices.constraints[0].matchAttribute",
            ),
            (
                json!([{"matchAttribute": "gpu.fgpu.dev/numaNode"},
                       {"distinctAttribute": "gpu.fgpu.dev/uuid"}]),
                "spec.devices.constraints[1].distinctAttribute",
            ),
            (
                json!([{"requests": ["nope"], "matchAttribute": "gpu.fgpu.dev/numaNode"}]),
                "spec.devices.constraints[0].requests[0]",
            ),
        ];
        for (constraints, want) in cases {
            let c = claim_with(
                "c",
                json!([{"name": "gpu", "exactly": shared(4, json!({}))}]),
                json!({"constraints": constraints}),
            );
            let p = run(&[c], &pods, &slices);
            let (reason, message) = waiting(&p);
            assert_eq!(reason, "rejected", "{message}");
            assert!(message.contains(want), "{want}: {message}");
            assert!(message.contains("claim ns/c"), "{message}");
        }
    }

    #[test]
    fn first_available_takes_the_first_sub_request_that_fits() {
        let pods = [pod("p", "2026-01-01T00:00:01Z", true, &[("g", Some("c"))])];
        let c = claim_with(
            "c",
            json!([{"name": "gpu", "firstAvailable": [
                {"name": "big", "deviceClassName": "shared.gpu.fgpu.dev",
                 "capacity": {"requests": {"memory": "60Gi"}}},
                {"name": "small", "deviceClassName": "shared.gpu.fgpu.dev",
                 "capacity": {"requests": {"memory": "8Gi"}}}]}]),
            json!({}),
        );
        let big = [node_slice("node-a", &[(80, 0, "H100")])];
        let p = run(std::slice::from_ref(&c), &pods, &big);
        assert_eq!(results(&p)[0].0, "gpu/big");
        let small = [node_slice("node-a", &[(16, 0, "T4")])];
        let p = run(std::slice::from_ref(&c), &pods, &small);
        assert_eq!(results(&p)[0].0, "gpu/small");
        // The allocation reads back as the 8Gi share of the sub-request.
        let Some(Action::Allocate { allocation, .. }) = p.actions.first() else {
            unreachable!()
        };
        let mut written = c.clone();
        written["status"]["allocation"] = allocation.allocation.clone();
        let inv = inventory::from_slices("gpu.fgpu.dev", typed(&small)).inventory;
        let g = usage::claim_grant(&usage::typed(&written).unwrap(), "gpu.fgpu.dev", &inv)
            .unwrap()
            .unwrap();
        assert_eq!(g.devices[0].memory, 8 << 30);
        // Neither fits: pending, about the first alternative.
        let tiny = [node_slice("node-a", &[(4, 0, "T4")])];
        let p = run(&[c], &pods, &tiny);
        let (reason, message) = waiting(&p);
        assert_eq!(reason, "never_fits");
        assert!(message.contains("(and 1 later alternatives)"), "{message}");
        // Earlier alternatives win over a better node score: a node that fits `big`
        // comes before one that fits only `small`.
        let c2 = claim_with(
            "c",
            json!([{"name": "gpu", "firstAvailable": [
                {"name": "big", "deviceClassName": "shared.gpu.fgpu.dev",
                 "capacity": {"requests": {"memory": "60Gi"}}},
                {"name": "small", "deviceClassName": "shared.gpu.fgpu.dev",
                 "capacity": {"requests": {"memory": "8Gi"}}}]}]),
            json!({}),
        );
        let two = [
            node_slice("node-a", &[(16, 0, "T4")]),
            node_slice("node-b", &[(80, 0, "H100")]),
        ];
        let p = run(&[c2], &pods, &two);
        assert_eq!(
            results(&p),
            [(
                "gpu/big".to_owned(),
                "node-b".to_owned(),
                "gpu-0".to_owned()
            )]
        );
    }

    #[test]
    fn a_claims_requests_move_to_the_next_node_when_the_best_cannot_host_them_all() {
        let pods = [pod("p", "2026-01-01T00:00:01Z", true, &[("g", Some("c"))])];
        // node-a (partly used: binpack's best node for the first request) has one GPU;
        // node-b has two.
        let slices = [
            node_slice("node-a", &[(16, 0, "H100")]),
            node_slice("node-b", &[(16, 0, "H100"), (16, 0, "H100")]),
        ];
        let claims = [allocated("x", 4, "gpu-0"), two_requests("c", 4, 4)];
        let p = run(&claims, &pods, &slices);
        let got: Vec<(String, String)> = results(&p).into_iter().map(|r| (r.0, r.1)).collect();
        assert_eq!(
            got,
            [
                ("first".to_owned(), "node-b".to_owned()),
                ("second".to_owned(), "node-b".to_owned())
            ]
        );
        // A single request still goes to the best node.
        let p = run(&[allocated("x", 4, "gpu-0"), claim("c", 4)], &pods, &slices);
        assert_eq!(results(&p)[0].1, "node-a");
    }

    #[test]
    fn fragmentation_is_the_free_capacity_the_granted_mix_cannot_use() {
        let pods = [
            pod("pa", "2026-01-01T00:00:01Z", false, &[("g", Some("a"))]),
            pod("pb", "2026-01-01T00:00:02Z", false, &[("g", Some("b"))]),
        ];
        // 10Gi shares on two 16Gi GPUs, one each: 6Gi free on each, and a 10Gi share fits
        // on neither — all of the free capacity is fragmented.
        let spread = [allocated("a", 10, "gpu-0"), allocated("b", 10, "gpu-1")];
        let p = run(&spread, &pods, &[slice(&[16, 16], false)]);
        assert!((p.fragmentation - 1.0).abs() < 1e-9, "{}", p.fragmentation);
        // 4Gi shares packed on gpu-0: 8Gi left there and all of gpu-1 are usable.
        let packed = [allocated("a", 4, "gpu-0"), allocated("b", 4, "gpu-0")];
        let p = run(&packed, &pods, &[slice(&[16, 16], false)]);
        assert!(p.fragmentation.abs() < 1e-9, "{}", p.fragmentation);
        // Nothing granted: nothing to measure against.
        assert_eq!(run(&[], &[], &[slice(&[16], false)]).fragmentation, 0.0);
    }

    #[test]
    fn claim_names_of_a_pod() {
        let p = json!({"spec": {"resourceClaims": [
                {"name": "a", "resourceClaimName": "direct"},
                {"name": "b", "resourceClaimTemplateName": "t"},
                {"name": "c", "resourceClaimTemplateName": "t"},
                {"name": "d", "resourceClaimTemplateName": "t"}]},
            "status": {"resourceClaimStatuses": [
                {"name": "b", "resourceClaimName": "p-b-x"},
                {"name": "d"}]}});
        assert_eq!(
            pod_claim_names(&p),
            [Some("direct".to_owned()), Some("p-b-x".to_owned()), None]
        );
    }

    /// [`pod_step`] for `pod` over the claims `claims`, as a word (`place` with the keys).
    fn step(
        pod_json: &Value,
        claims: &[Value],
        revoked: &[&str],
        unsettled: &[&str],
        allocate: bool,
    ) -> String {
        let driver = DriverName::default();
        let inv = inventory::from_slices(driver.as_str(), typed(&[slice(&[40], true)]));
        let views: Vec<ClaimView> = claims
            .iter()
            .map(|c| ClaimView::of_json(c, &driver, &inv.inventory))
            .collect();
        let by_key: BTreeMap<&str, &ClaimView> =
            views.iter().map(|c| (c.key.as_str(), c)).collect();
        let pod = PodView::of(pod_json, &driver.scheduling_gate());
        let revoked: BTreeSet<&str> = revoked.iter().copied().collect();
        let unsettled: BTreeSet<String> = unsettled.iter().map(|u| (*u).to_owned()).collect();
        match pod_step(&pod, &by_key, &revoked, &unsettled, allocate) {
            PodStep::Wait => "wait".into(),
            PodStep::Ungate => "ungate".into(),
            PodStep::Place(c) => {
                let keys: Vec<&str> = c.iter().map(|c| c.key.as_str()).collect();
                format!("place {}", keys.join(","))
            }
        }
    }

    #[test]
    fn a_pod_step_waits_ungates_or_places() {
        let claims = [claim("a", 4), allocated("b", 4, "gpu-0")];
        let on_a = pod("p", "2024-01-01T00:00:00Z", true, &[("g", Some("a"))]);
        let on_b = pod("p", "2024-01-01T00:00:00Z", true, &[("g", Some("b"))]);
        let missing = pod("p", "2024-01-01T00:00:00Z", true, &[("g", None)]);
        assert_eq!(step(&on_a, &claims, &[], &[], true), "place ns/a");
        assert_eq!(step(&on_a, &claims, &[], &[], false), "ungate");
        assert_eq!(step(&on_b, &claims, &[], &[], true), "ungate");
        assert_eq!(step(&on_b, &claims, &[], &["uid-b"], true), "wait");
        assert_eq!(step(&on_b, &claims, &["ns/b"], &[], true), "wait");
        assert_eq!(step(&missing, &claims, &[], &[], true), "wait");
        assert_eq!(step(&missing, &claims, &[], &[], false), "ungate");
    }

    #[test]
    fn candidates_keep_the_claims_node_or_avoid_nodes_while_some_are_left() {
        let driver = DriverName::default();
        let inv = inventory::from_slices(driver.as_str(), typed(&[slice(&[40], true)])).inventory;
        let names = |i: &Inventory| i.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>();
        let avoid_a: BTreeSet<String> = ["node-a".to_owned()].into();
        let avoid_b: BTreeSet<String> = ["node-b".to_owned()].into();
        assert_eq!(names(&candidates(&inv, None, None)), ["node-a"]);
        assert_eq!(
            names(&candidates(&inv, Some("node-b"), None)),
            Vec::<String>::new()
        );
        assert_eq!(names(&candidates(&inv, None, Some(&avoid_b))), ["node-a"]);
        // Avoiding every node would leave none: every node stays.
        assert_eq!(names(&candidates(&inv, None, Some(&avoid_a))), ["node-a"]);
        // Where no node is left out, the candidates are the inventory itself, not a copy.
        let borrowed = |c: Cow<'_, Inventory>| matches!(c, Cow::Borrowed(_));
        assert!(borrowed(candidates(&inv, None, None)));
        assert!(borrowed(candidates(&inv, None, Some(&avoid_b))));
        assert!(borrowed(candidates(&inv, None, Some(&avoid_a))));
        assert!(!borrowed(candidates(&inv, Some("node-a"), None)));
        assert_eq!(
            where_others_are(Some("n"), true),
            " (the pod's other claims are on node n)"
        );
        assert_eq!(
            where_others_are(Some("n"), false),
            " (the claim's other requests are on node n)"
        );
        assert_eq!(where_others_are(None, true), "");
    }

    /// A pass of many claims, placed with the pass's kept scores ([`Scores`]), lands each
    /// claim where a search that scores every node afresh puts it: on the ledger holding
    /// every claim placed before it, the first node in the controller's order, on the
    /// GPUs the engine picks there.
    #[test]
    fn kept_scores_place_a_pass_as_a_fresh_search_would() {
        for policy in [
            Policy::FRAGAWARE,
            Policy::SPREAD,
            Policy::FGD,
            Policy::BESTFIT,
        ] {
            kept_scores_place_as_a_fresh_search(policy);
        }
    }

    fn kept_scores_place_as_a_fresh_search(policy: Policy) {
        let d = DriverName::default();
        let nodes: Vec<String> = (0..6).map(|n| format!("node-{n}")).collect();
        let slices: Vec<Value> = nodes
            .iter()
            .map(|n| node_slice(n, &[(80, 0, "H100"); 4]))
            .collect();
        let inv = inventory::from_slices(d.as_str(), typed(&slices));
        let sizes = [20, 30, 50, 10, 40];
        let claims: Vec<Value> = (0..36)
            .map(|i| claim(&format!("c{i:02}"), sizes[i % sizes.len()]))
            .collect();
        let pods: Vec<Value> = (0..36)
            .map(|i| {
                let name = format!("c{i:02}");
                let created = format!("2026-01-01T00:00:{i:02}Z");
                pod(&format!("p{i:02}"), &created, true, &[("g", Some(&name))])
            })
            .collect();
        let mut model = WorkloadModel::new(std::time::Duration::from_secs(3600));
        for (i, milli) in [250, 375, 500, 625, 1000].into_iter().enumerate() {
            model.observe(&format!("seen-{i}"), (0, 0, 1, milli), 0);
        }
        let settings = Settings {
            default_policy: policy,
            ..settings()
        };
        let planned: Vec<(String, String, Vec<String>)> =
            plan_with_model(&claims, &pods, &inv, Some(&model), &settings)
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Allocate {
                        claim, allocation, ..
                    } => Some((
                        claim.name.clone(),
                        allocation.grant.node.clone(),
                        allocation
                            .grant
                            .devices
                            .iter()
                            .map(|g| g.gpu.clone())
                            .collect(),
                    )),
                    _ => None,
                })
                .collect();

        // The reference: every node scored afresh for every claim.
        let workloads = Workloads::of(Some(&model), 0);
        let resolved = workloads.resolve(policy);
        assert_eq!(resolved.policy, policy, "{policy} runs, not a fallback");
        let mut ledger = Ledger::new(inv.inventory.clone());
        let mut expected = Vec::new();
        for i in 0..36 {
            let gib = sizes[i % sizes.len()];
            let req = engine::Request::new(1, GpuShare::Memory { bytes: gib << 30 });
            let inv = ledger.inventory();
            let ctx = ScoreContext {
                workload: resolved.workload,
                max_spec: inv.max_spec(),
                usage_weight: 0.0,
            };
            let all = engine::evaluate(inv, &req, resolved.policy, &ctx);
            let Some(best) = engine::controller_best(all.iter().map(|p| (p.node, p.score))) else {
                continue;
            };
            let pl = engine::evaluate_node(best, &inv.nodes[best], &req, resolved.policy, &ctx)
                .expect("fits");
            let g = Grant::from_placement(format!("c{i:02}"), inv, &req, &pl);
            expected.push((
                format!("c{i:02}"),
                g.node.clone(),
                g.devices.iter().map(|d| d.gpu.clone()).collect(),
            ));
            ledger.grant(g).expect("fits");
        }
        assert!(
            expected.len() > 20,
            "{policy}: most claims fit: {}",
            expected.len()
        );
        let spread: BTreeSet<&String> = expected.iter().map(|(_, n, _)| n).collect();
        assert!(spread.len() > 1, "{policy}: the claims use several nodes");
        assert_eq!(planned, expected, "{policy}");
    }
}
