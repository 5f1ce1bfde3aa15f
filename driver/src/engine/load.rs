//! The usage-aware term: "real-load awareness".
//!
//! A grant is a quota, not a load. A GPU whose claims were granted 30 % of its SMs may run
//! at 95 % because a claim is not throttled (cores 0) or its limiter lags; another, with
//! the same grants, may sit idle. Where the node monitor measures what each claim really
//! uses ([`Gpu::measured_load`]), this term prefers GPUs whose measured load leaves the
//! request's core quota real headroom: `100 − load ≥ cores`.
//!
//! The term of one GPU is its headroom `(100 − load − cores) / 100`, clamped to
//! `[−1, 1]`; a GPU of unknown load counts 0. The term of a placement is the mean over its
//! GPUs, so it too lies in `[−1, 1]`. [`super::evaluate_node`] adds `weight × term` to the
//! policy's score ([`super::ScoreContext::usage_weight`]); it never makes a GPU fit that
//! does not fit by its grants, since it only scores placements the policy already found.
//! On one node it only swaps a chosen GPU for one the policy cannot tell apart from it
//! ([`prefer_headroom`]), so the policy's GPU choice keeps its meaning.

use super::{Gpu, Node, Request};

/// The term of a GPU of unknown load (and of a placement on no GPU): no effect.
const NEUTRAL: f64 = 0.0;

/// Headroom of `gpu` for `req` in percent of its SMs: `100 − load − cores`, where `load`
/// is the measured load and `cores` what `req` takes of the GPU. `None` when the load is
/// unknown.
pub fn headroom(gpu: &Gpu, req: &Request) -> Option<i32> {
    let load = i32::from(gpu.measured_load?);
    let cores = i32::try_from(req.per_gpu(gpu).1).unwrap_or(i32::MAX);
    Some(100i32.saturating_sub(load).saturating_sub(cores))
}

/// The term of one GPU: its [`headroom`] / 100 in `[−1, 1]`; 0 when its load is unknown.
pub fn gpu_term(gpu: &Gpu, req: &Request) -> f64 {
    headroom(gpu, req).map_or(NEUTRAL, |h| (f64::from(h) / 100.0).clamp(-1.0, 1.0))
}

/// The term of placing `req` on `gpus` of `node`: the mean of their [`gpu_term`]s (0 for
/// no GPU).
pub fn placement_term(node: &Node, req: &Request, gpus: &[usize]) -> f64 {
    if gpus.is_empty() {
        return NEUTRAL;
    }
    let sum: f64 = gpus.iter().map(|&i| gpu_term(&node.gpus[i], req)).sum();
    sum / gpus.len() as f64
}

/// Whether the policies cannot tell `a` and `b` apart: same model, sizes, free capacity,
/// NUMA node and PCIe root. Every policy's score and every topology constraint reads only
/// these, so swapping one for the other changes neither.
fn interchangeable(a: &Gpu, b: &Gpu) -> bool {
    a.model == b.model
        && a.memory_total == b.memory_total
        && a.memory_free == b.memory_free
        && a.cores_total == b.cores_total
        && a.cores_free == b.cores_free
        && a.numa == b.numa
        && a.pcie_root == b.pcie_root
}

/// Replaces each GPU of `gpus` by the GPU of `fit` (not chosen) that is interchangeable
/// with it and has the largest [`gpu_term`], where that term is strictly larger; on equal
/// terms the policy's choice stays. `fit` holds the GPUs of `node` that can take `req`.
pub(super) fn prefer_headroom(node: &Node, req: &Request, fit: &[usize], gpus: &mut [usize]) {
    for k in 0..gpus.len() {
        let chosen = gpus[k];
        let mut best = (chosen, gpu_term(&node.gpus[chosen], req));
        for &i in fit {
            if gpus.contains(&i) || !interchangeable(&node.gpus[i], &node.gpus[chosen]) {
                continue;
            }
            let t = gpu_term(&node.gpus[i], req);
            if t > best.1 {
                best = (i, t);
            }
        }
        gpus[k] = best.0;
    }
}
