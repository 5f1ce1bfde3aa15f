//! Filter's per-node results, kept for the next pod of the same shape (issue 21).
//!
//! Filter and prioritize run the same per-node work for every pod: the model and UUID
//! checks, then one engine evaluation per node. Pods of one workload (a Deployment, a
//! Job) ask for the same thing, and between two of them only the node the first was bound
//! to has changed. So each node keeps, next to its ledger, the outcome (fits with a score,
//! or why not) of the last few pod shapes evaluated there, each tagged with:
//!
//! * the pod's [`Shape`]: everything of the pod the per-node work reads (its containers'
//!   engine requests and names, its policy, its `vgpu-mode`), never its name or UID;
//! * the node's generation ([`next_generation`]): a number that changes whenever what the
//!   per-node work reads of the node changes (its GPUs, their health and taints, the
//!   grants and reservations on them, whether the node can be used at all). Generations
//!   come from one process-wide counter, so a node removed and added again never repeats
//!   an earlier number;
//! * the workload model's epoch, for the policies that score against it (`fgd`,
//!   `fragaware`); 0 for the others. The epoch changes when a sync changes the model.
//!
//! A result is reused only when all three match, so it equals a fresh evaluation. A sync
//! that moves the model evaluates the few most recently used shapes of `fgd` and
//! `fragaware` pods again on every node (`Extender::sync`), so that the next such pod
//! does not pay for the whole cluster in its own filter. Bounds:
//! at most [`SHAPES`] shapes are told apart (least recently used first out; a shape seen
//! again later gets a new id), and each node keeps at most [`SHAPES`] results (least
//! recently used first out). See `docs/extender.md`, "Reusing filter's results".

use std::sync::atomic::{AtomicU64, Ordering};

use fgpu_driver::engine::Policy;
use fgpu_driver::hami::{ContainerRequest, PodRequest, VgpuMode};

/// Most pod shapes remembered, and most results kept per node.
pub const SHAPES: usize = 16;

/// The last generation handed out (process-wide).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A node generation never handed out before.
pub fn next_generation() -> u64 {
    GENERATION.fetch_add(1, Ordering::Relaxed) + 1
}

/// What the per-node work reads of a pod: a [`PodRequest`] without the pod's name and UID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The containers asking for GPUs: index, name (it is in the reasons) and request.
    pub containers: Vec<ContainerRequest>,
    pub policy: Policy,
    pub vgpu_mode: VgpuMode,
}

impl Shape {
    /// The shape of `req`.
    pub fn of(req: &PodRequest) -> Self {
        Self {
            containers: req.containers.clone(),
            policy: req.policy,
            vgpu_mode: req.vgpu_mode,
        }
    }

    /// Whether `req` has this shape (without building one).
    fn matches(&self, req: &PodRequest) -> bool {
        self.containers == req.containers
            && self.policy == req.policy
            && self.vgpu_mode == req.vgpu_mode
    }
}

/// The shapes seen lately, each with an id that is never given to another shape.
#[derive(Debug, Default)]
pub struct ShapeTable {
    /// (shape, id, last use).
    shapes: Vec<(Shape, u64, u64)>,
    next_id: u64,
    clock: u64,
}

impl ShapeTable {
    /// The id of `req`'s shape (a new one for a shape not in the table, which then drops
    /// its least recently used shape if full), and the current use stamp: the value
    /// [`NodeResults`] take as "now".
    pub fn id_of(&mut self, req: &PodRequest) -> (u64, u64) {
        self.clock += 1;
        let now = self.clock;
        if let Some(entry) = self.shapes.iter_mut().find(|e| e.0.matches(req)) {
            entry.2 = now;
            return (entry.1, now);
        }
        if self.shapes.len() >= SHAPES
            && let Some(oldest) = (0..self.shapes.len()).min_by_key(|&i| self.shapes[i].2)
        {
            self.shapes.swap_remove(oldest);
        }
        self.next_id += 1;
        self.shapes.push((Shape::of(req), self.next_id, now));
        (self.next_id, now)
    }

    /// A new use stamp, for results kept outside a pod's request.
    pub fn stamp(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Up to `n` shapes that pass `keep`, most recently used first, with their ids.
    pub fn recent(&self, n: usize, keep: impl Fn(&Shape) -> bool) -> Vec<(Shape, u64)> {
        let mut found: Vec<&(Shape, u64, u64)> =
            self.shapes.iter().filter(|e| keep(&e.0)).collect();
        found.sort_by_key(|e| std::cmp::Reverse(e.2));
        found
            .into_iter()
            .take(n)
            .map(|e| (e.0.clone(), e.1))
            .collect()
    }

    /// Shapes in the table.
    pub fn len(&self) -> usize {
        self.shapes.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }
}

/// What the per-node work found for one shape on one node.
#[derive(Clone, Debug, PartialEq)]
pub enum Cached {
    /// The pod fits, with this score.
    Fits(f64),
    /// It does not fit; why.
    NoFit(String),
}

/// Which result a lookup asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResultKey {
    /// The shape's id ([`ShapeTable::id_of`]).
    pub shape: u64,
    /// The workload model's epoch, or 0 for a policy that does not read the model.
    pub model: u64,
    /// The node's generation.
    pub generation: u64,
}

/// One node's results, at most [`SHAPES`].
#[derive(Debug, Default)]
pub struct NodeResults {
    /// (key, result, last use).
    entries: Vec<(ResultKey, Cached, u64)>,
}

impl NodeResults {
    /// The result for `key`, marked used at `now`.
    pub fn get(&mut self, key: ResultKey, now: u64) -> Option<&Cached> {
        let e = self.entries.iter_mut().find(|e| e.0 == key)?;
        e.2 = now;
        Some(&e.1)
    }

    /// Keeps `result` for `key`: it replaces the shape's older result, else the least
    /// recently used one when full.
    pub fn put(&mut self, key: ResultKey, result: Cached, now: u64) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.0.shape == key.shape) {
            *e = (key, result, now);
            return;
        }
        if self.entries.len() >= SHAPES
            && let Some(oldest) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].2)
        {
            self.entries.swap_remove(oldest);
        }
        self.entries.push((key, result, now));
    }

    /// Forgets every result (the node changed: none can match again).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Results kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_driver::engine::{GpuShare, NodePolicy, Request};

    fn req(uid: &str, gpus: u32, policy: NodePolicy) -> PodRequest {
        PodRequest {
            key: format!("ns/{uid}"),
            uid: uid.into(),
            containers: vec![ContainerRequest {
                index: 0,
                name: "main".into(),
                request: Request::new(gpus, GpuShare::Whole),
            }],
            policy: Policy {
                node: policy,
                ..Policy::FRAGAWARE
            },
            vgpu_mode: VgpuMode::Any,
        }
    }

    #[test]
    fn pods_of_one_shape_share_an_id_and_others_do_not() {
        let mut t = ShapeTable::default();
        let (a, _) = t.id_of(&req("a", 1, NodePolicy::Binpack));
        let (b, _) = t.id_of(&req("b", 1, NodePolicy::Binpack));
        let (c, _) = t.id_of(&req("c", 2, NodePolicy::Binpack));
        let (d, _) = t.id_of(&req("d", 1, NodePolicy::Spread));
        assert_eq!(a, b, "name and UID are not part of the shape");
        assert_ne!(a, c);
        assert_ne!(a, d);
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn the_table_drops_the_least_recently_used_shape_and_never_reuses_its_id() {
        let mut t = ShapeTable::default();
        let first = t.id_of(&req("x", 1, NodePolicy::Binpack)).0;
        for g in 2..=SHAPES as u32 {
            t.id_of(&req("x", g, NodePolicy::Binpack));
        }
        // Touch the first two shapes: the third is now the oldest.
        assert_eq!(t.id_of(&req("y", 1, NodePolicy::Binpack)).0, first);
        let second = t.id_of(&req("x", 2, NodePolicy::Binpack)).0;
        t.id_of(&req("x", 99, NodePolicy::Binpack));
        assert_eq!(t.len(), SHAPES);
        assert_eq!(t.id_of(&req("y", 1, NodePolicy::Binpack)).0, first);
        // Shape 3 was the oldest when shape 99 came: seen again, it gets a new id.
        let third_again = t.id_of(&req("x", 3, NodePolicy::Binpack)).0;
        assert!(third_again > SHAPES as u64 + 1, "{third_again}");
        assert_eq!(t.id_of(&req("x", 2, NodePolicy::Binpack)).0, second);
    }

    #[test]
    fn recent_shapes_come_most_recently_used_first() {
        let mut t = ShapeTable::default();
        let a = t.id_of(&req("a", 1, NodePolicy::FragAware)).0;
        let b = t.id_of(&req("b", 2, NodePolicy::Binpack)).0;
        let c = t.id_of(&req("c", 3, NodePolicy::FragAware)).0;
        t.id_of(&req("a", 1, NodePolicy::FragAware));
        let ids = |v: Vec<(Shape, u64)>| v.into_iter().map(|e| e.1).collect::<Vec<_>>();
        assert_eq!(ids(t.recent(4, |_| true)), [a, c, b]);
        assert_eq!(ids(t.recent(1, |_| true)), [a]);
        assert_eq!(ids(t.recent(4, |s| s.policy.needs_workload())), [a, c]);
        let before = t.stamp();
        assert!(t.stamp() > before);
    }

    #[test]
    fn node_results_match_on_the_whole_key_and_stay_bounded() {
        let mut r = NodeResults::default();
        let key = ResultKey {
            shape: 1,
            model: 0,
            generation: 7,
        };
        r.put(key, Cached::Fits(0.5), 1);
        assert_eq!(r.get(key, 2), Some(&Cached::Fits(0.5)));
        for other in [
            ResultKey {
                generation: 8,
                ..key
            },
            ResultKey { model: 1, ..key },
            ResultKey { shape: 2, ..key },
        ] {
            assert_eq!(r.get(other, 3), None, "{other:?}");
        }
        // A newer result of the same shape replaces the old one.
        r.put(
            ResultKey { model: 1, ..key },
            Cached::NoFit("full".into()),
            4,
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r.get(key, 5), None);
        for s in 2..=SHAPES as u64 + 3 {
            r.put(ResultKey { shape: s, ..key }, Cached::Fits(s as f64), 5 + s);
        }
        assert_eq!(r.len(), SHAPES);
        // The oldest (shape 1, then 2, 3) went first.
        assert_eq!(r.get(ResultKey { model: 1, ..key }, 100), None);
        assert_eq!(r.get(ResultKey { shape: 3, ..key }, 100), None);
        assert_eq!(
            r.get(ResultKey { shape: 4, ..key }, 100),
            Some(&Cached::Fits(4.0))
        );
        r.clear();
        assert!(r.is_empty());
    }

    #[test]
    fn generations_are_never_repeated() {
        let a = next_generation();
        let b = next_generation();
        assert!(b > a);
    }
}
