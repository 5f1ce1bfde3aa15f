//! One pass's node scores, kept while the nodes they were computed on are unchanged.
//!
//! A pass places its claims one after another on one ledger, under one workload model and
//! one scoring context. A claim's search scores every candidate node
//! ([`fgpu_driver::engine::evaluate_node`]), and placing it changes one node: so the next
//! claim of the same request and policy would score the other nodes exactly as before.
//! [`Scores`] keeps each node's score per request class and a version per node, which
//! every grant of the pass bumps ([`Scores::changed`]); a score whose node's version moved
//! is computed again. The trace simulator keeps its scores the same way.
//!
//! Only the score and whether the request fits are kept (16 bytes per node and class),
//! not the GPUs: the node a claim lands on is evaluated again to pick them. A pass keeps at
//! most [`MAX_CLASSES`] classes; a request of another class is scored without the cache.
//!
//! It also keeps the sets of CEL selectors found to accept every device of the inventory
//! (the shared DeviceClass's, which every claim of the class carries): a device's
//! attributes do not change within a pass, so such a set is not evaluated again on the
//! pass's later claims.

use std::collections::{HashMap, HashSet};

use fgpu_driver::engine::{self, Inventory, Policy, Request, ScoreContext};

/// Request classes kept per pass (each costs 16 bytes per node: 128 KiB at 8,000 nodes).
pub const MAX_CLASSES: usize = 64;

/// The feasible nodes of `inv` for `req`, as `(node index, score)` in node order, every
/// node scored afresh: [`engine::evaluate`] without the GPUs.
pub fn evaluate(
    inv: &Inventory,
    req: &Request,
    policy: Policy,
    ctx: &ScoreContext<'_>,
) -> Vec<(usize, f64)> {
    engine::evaluate(inv, req, policy, ctx)
        .into_iter()
        .map(|p| (p.node, p.score))
        .collect()
}

/// The scores of one pass (see the module documentation). Valid for one inventory and one
/// scoring context: a pass makes a new one.
#[derive(Debug, Default)]
pub struct Scores {
    classes: HashMap<(Request, Policy), usize>,
    /// Per class, per node: the node's version when scored and the score (`None`: the
    /// request does not fit there).
    entries: Vec<Vec<(u32, Option<f64>)>>,
    /// Per node of the inventory: bumped by every change to the node.
    version: Vec<u32>,
    /// Sets of selector expressions that accept every device ([`Scores::accept_all`]).
    accepting: HashSet<Vec<String>>,
    /// Nodes scored (cache misses) and scores reused.
    pub evaluated: u64,
    pub reused: u64,
}

impl Scores {
    /// The feasible nodes of `inv` for `req` under `policy` and `ctx`, as `(node index,
    /// score)` in node order: what [`evaluate`] gives. `inv` must
    /// be the whole inventory this cache follows (same nodes, same order), changed only
    /// where [`Scores::changed`] was told.
    pub fn feasible(
        &mut self,
        inv: &Inventory,
        req: &Request,
        policy: Policy,
        ctx: &ScoreContext<'_>,
    ) -> Vec<(usize, f64)> {
        let n = inv.nodes.len();
        if self.version.len() != n {
            // A first use (or another inventory): nothing kept is valid.
            self.version = vec![1; n];
            self.classes.clear();
            self.entries.clear();
        }
        let class = match self.classes.get(&(req.clone(), policy)) {
            Some(&c) => c,
            None if self.entries.len() < MAX_CLASSES => {
                self.classes
                    .insert((req.clone(), policy), self.entries.len());
                self.entries.push(vec![(0, None); n]);
                self.entries.len() - 1
            }
            None => {
                self.evaluated += n as u64;
                return evaluate(inv, req, policy, ctx);
            }
        };
        let entries = &mut self.entries[class];
        let mut out = Vec::new();
        for (i, e) in entries.iter_mut().enumerate() {
            if e.0 == self.version[i] {
                self.reused += 1;
            } else {
                let scored = engine::evaluate_node(i, &inv.nodes[i], req, policy, ctx);
                *e = (self.version[i], scored.map(|p| p.score));
                self.evaluated += 1;
            }
            if let Some(score) = e.1 {
                out.push((i, score));
            }
        }
        out
    }

    /// Records that the selectors `expressions` (all of a request's, in order) accept
    /// every device of the pass's inventory. An empty set is not recorded.
    pub fn accept_all(&mut self, expressions: &[&str]) {
        if !expressions.is_empty() && self.accepting.len() < MAX_CLASSES {
            self.accepting
                .insert(expressions.iter().map(|e| (*e).to_owned()).collect());
        }
    }

    /// Whether [`Scores::accept_all`] recorded these selectors.
    pub fn accepts_all(&self, expressions: &[&str]) -> bool {
        !expressions.is_empty()
            && self.accepting.iter().any(|set| {
                set.iter()
                    .map(String::as_str)
                    .eq(expressions.iter().copied())
            })
    }

    /// Node `node` (its index in the inventory) changed: its scores are computed again.
    pub fn changed(&mut self, node: usize) {
        if let Some(v) = self.version.get_mut(node) {
            *v = v.wrapping_add(1).max(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_driver::engine::{Gpu, GpuShare, Node, Weighting, Workload};
    use fgpu_driver::ledger::{Grant, Ledger};

    const GIB: u64 = 1 << 30;

    fn inventory(nodes: usize) -> Inventory {
        Inventory {
            nodes: (0..nodes)
                .map(|n| {
                    Node::new(
                        format!("n{n:02}"),
                        (0..4)
                            .map(|g| Gpu::new(format!("gpu-{g}"), "H100", 80 * GIB))
                            .collect(),
                    )
                })
                .collect(),
        }
    }

    fn workload() -> Workload {
        Workload::from_pods(
            [(0, 0, 1, 250), (0, 0, 1, 500), (0, 0, 2, 1000)],
            1.0,
            Weighting::Count,
        )
    }

    fn scores(inv: &Inventory, req: &Request, w: &Workload) -> Vec<(usize, f64)> {
        let ctx = ScoreContext {
            workload: Some(w),
            max_spec: inv.max_spec(),
            usage_weight: 0.0,
        };
        engine::evaluate(inv, req, Policy::FRAGAWARE, &ctx)
            .into_iter()
            .map(|p| (p.node, p.score))
            .collect()
    }

    /// Placing claims one after another, the kept scores equal a fresh evaluation after
    /// every grant, and only the changed node is scored again.
    #[test]
    fn kept_scores_equal_fresh_ones_after_every_grant() {
        let w = workload();
        let mut ledger = Ledger::new(inventory(12));
        let mut cache = Scores::default();
        let shapes = [
            Request::new(1, GpuShare::Memory { bytes: 20 * GIB }),
            Request::new(1, GpuShare::Memory { bytes: 50 * GIB }),
            Request::new(2, GpuShare::Whole),
        ];
        for i in 0..40 {
            let req = &shapes[i % shapes.len()];
            let inv = ledger.inventory();
            let ctx = ScoreContext {
                workload: Some(&w),
                max_spec: inv.max_spec(),
                usage_weight: 0.0,
            };
            let kept = cache.feasible(inv, req, Policy::FRAGAWARE, &ctx);
            assert_eq!(kept, scores(inv, req, &w), "claim {i}");
            let Some(best) = engine::controller_best(kept.iter().copied()) else {
                break;
            };
            let pl = engine::evaluate_node(best, &inv.nodes[best], req, Policy::FRAGAWARE, &ctx)
                .expect("fits");
            let grant = Grant::from_placement(format!("c{i}"), inv, req, &pl);
            ledger.grant(grant).expect("fits");
            cache.changed(best);
        }
        // Each class is scored in full once (3 × 12), then again only on the nodes that
        // changed since: each grant moves one node, for every class (at most 3 × 40).
        let full = 40 * 12;
        assert!(
            cache.evaluated <= 36 + 3 * 40,
            "evaluated {}",
            cache.evaluated
        );
        assert_eq!(cache.evaluated + cache.reused, full);
    }

    /// A grant the cache is not told of leaves a stale score: the version is what keeps
    /// the scores true (this is why every grant of a pass calls `changed`).
    #[test]
    fn a_change_not_told_is_not_seen() {
        let mut ledger = Ledger::new(inventory(2));
        let mut cache = Scores::default();
        let req = Request::new(1, GpuShare::Memory { bytes: 30 * GIB });
        let ctx = |inv: &Inventory| ScoreContext {
            workload: None,
            max_spec: inv.max_spec(),
            usage_weight: 0.0,
        };
        let before = cache.feasible(
            ledger.inventory(),
            &req,
            Policy::BINPACK,
            &ctx(ledger.inventory()),
        );
        let inv = ledger.inventory();
        let pl = engine::evaluate_node(0, &inv.nodes[0], &req, Policy::BINPACK, &ctx(inv))
            .expect("fits");
        ledger
            .grant(Grant::from_placement("a", inv, &req, &pl))
            .expect("fits");
        let stale = cache.feasible(
            ledger.inventory(),
            &req,
            Policy::BINPACK,
            &ctx(ledger.inventory()),
        );
        assert_eq!(stale, before);
        cache.changed(0);
        let fresh = cache.feasible(
            ledger.inventory(),
            &req,
            Policy::BINPACK,
            &ctx(ledger.inventory()),
        );
        assert_ne!(fresh, before);
    }

    /// Past MAX_CLASSES, a request is scored in full each time, and still correctly.
    #[test]
    fn classes_past_the_bound_are_scored_without_the_cache() {
        let w = workload();
        let inv = inventory(3);
        let mut cache = Scores::default();
        let ctx = ScoreContext {
            workload: Some(&w),
            max_spec: inv.max_spec(),
            usage_weight: 0.0,
        };
        for i in 0..MAX_CLASSES as u64 + 5 {
            let req = Request::new(
                1,
                GpuShare::Memory {
                    bytes: GIB + i * (1 << 20),
                },
            );
            assert_eq!(
                cache.feasible(&inv, &req, Policy::FRAGAWARE, &ctx),
                scores(&inv, &req, &w)
            );
        }
        assert_eq!(cache.entries.len(), MAX_CLASSES);
        assert_eq!(cache.evaluated, (MAX_CLASSES as u64 + 5) * 3);
    }
}
