//! Event messages: why a claim was allocated where, why it waits, why it was rejected.

use fgpu_api::quantity::format_u64;
use fgpu_driver::engine::{Gpu, GpuShare, Inventory, Request};
use fgpu_driver::ledger::Grant;

/// What the `GpuAllocated` Event says after `claim NAME: `: `allocated on node-a: gpu-1
/// (10Gi, 30 cores)`.
pub fn allocated(grant: &Grant) -> String {
    let devices: Vec<String> = grant
        .devices
        .iter()
        .map(|d| format!("{} ({}, {} cores)", d.gpu, format_u64(d.memory), d.cores))
        .collect();
    format!("allocated on {}: {}", grant.node, devices.join(", "))
}

/// `Rejected` event: the error of the claim's configuration, as is.
pub fn rejected(error: &dyn std::error::Error) -> String {
    format!("not allocated: {error}")
}

/// What one GPU of `req` needs, in words: `10Gi and 30 cores`, `a whole idle GPU`.
fn need(req: &Request) -> String {
    match req.share {
        GpuShare::Whole => "a whole idle GPU".to_owned(),
        GpuShare::Fraction { milli } => format!(
            "{milli}/1000 of its memory and {} cores",
            req.cores.unwrap_or(0)
        ),
        GpuShare::Memory { bytes } => {
            format!("{} and {} cores", format_u64(bytes), req.cores.unwrap_or(0))
        }
    }
}

/// How close `gpu` comes to what `req` wants of one GPU: the smaller of the free memory
/// and the free cores relative to the need, in [0, 1].
fn closeness(gpu: &Gpu, req: &Request) -> f64 {
    let (mem, cores) = req.per_gpu(gpu);
    let part = |free: f64, want: f64| {
        if want <= 0.0 {
            1.0
        } else {
            (free / want).min(1.0)
        }
    };
    part(gpu.memory_free as f64, mem as f64).min(part(f64::from(gpu.cores_free), f64::from(cores)))
}

/// The GPUs of `inventory` that could host one GPU of `req` were they idle (size, model and
/// UUID constraints), with their node.
fn allowed<'i>(inventory: &'i Inventory, req: &Request) -> Vec<(&'i str, &'i Gpu)> {
    inventory
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(move |g| (n.name.as_str(), g)))
        .filter(|(_, g)| req.gpu_fits(&idle(g)))
        .collect()
}

/// `gpu` as if nothing were allocated on it.
fn idle(gpu: &Gpu) -> Gpu {
    let mut probe = gpu.clone();
    probe.memory_free = probe.memory_total;
    probe.cores_free = probe.cores_total;
    probe
}

/// The GPUs that could host one GPU of `req` were they idle and untainted, but carry a
/// taint it does not tolerate: `node-a/gpu-0 (key=value:NoSchedule)`.
fn repelled(inventory: &Inventory, req: &Request) -> Vec<String> {
    inventory
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter().map(move |g| (n.name.as_str(), g)))
        .filter_map(|(node, g)| {
            let mut untainted = idle(g);
            untainted.taints.clear();
            if !req.gpu_fits(&untainted) {
                return None;
            }
            let against: Vec<String> = req
                .repelled_by(g)
                .map(|t| format!("{}={}:{}", t.key, t.value, t.effect))
                .collect();
            (!against.is_empty()).then(|| format!("{node}/{} ({})", g.id, against.join(", ")))
        })
        .collect()
}

/// Whether no GPU of `inventory` could host `req` even idle and untainted: [`pending`] then
/// says "no GPU can ever host".
pub fn never_fits(inventory: &Inventory, req: &Request) -> bool {
    // A taint is not forever: GPUs kept off only by taints make the claim wait (`no_fit`).
    allowed(inventory, req).is_empty() && repelled(inventory, req).is_empty()
}

/// `Pending` event for a request no node can host now, e.g. `no GPU has 10Gi and 30 cores
/// free; best candidate node-a/gpu-1 has 6Gi and 100 cores free`. The best candidate is
/// the allowed GPU that comes closest (ties: more free memory, then inventory order).
pub fn pending(inventory: &Inventory, req: &Request) -> String {
    let allowed = allowed(inventory, req);
    if allowed.is_empty() {
        let repelled = repelled(inventory, req);
        if !repelled.is_empty() {
            return format!(
                "no GPU can host {} now: those that could carry device taints the claim does not tolerate: {}",
                need(req),
                repelled.join(", ")
            );
        }
        return format!(
            "no GPU can ever host {}: none of the {} GPUs is large enough and matches the model and UUID constraints",
            need(req),
            inventory.nodes.iter().map(|n| n.gpus.len()).sum::<usize>()
        );
    }
    let head = if req.gpus > 1 && req.share == GpuShare::Whole {
        format!("no node has {} idle GPUs", req.gpus)
    } else if req.gpus > 1 {
        format!("no node has {} GPUs with {} free", req.gpus, need(req))
    } else if req.share == GpuShare::Whole {
        "no GPU is idle".to_owned()
    } else {
        format!("no GPU has {} free", need(req))
    };
    let mut best: Option<(&str, &Gpu, f64)> = None;
    for (node, g) in allowed {
        let c = closeness(g, req);
        if best.is_none_or(|(_, b, bc)| c > bc || (c == bc && g.memory_free > b.memory_free)) {
            best = Some((node, g, c));
        }
    }
    let (node, g, _) = best.expect("allowed is not empty");
    format!(
        "{head}; best candidate {node}/{} has {} and {} cores free",
        g.id,
        format_u64(g.memory_free),
        g.cores_free
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_driver::engine::Node;
    use fgpu_driver::ledger::DeviceGrant;

    fn gpu(id: &str, model: &str, total_gib: u64, free_gib: u64, cores_free: u32) -> Gpu {
        let mut g = Gpu::new(id, model, total_gib << 30);
        g.memory_free = free_gib << 30;
        g.cores_free = cores_free;
        g
    }

    #[test]
    fn pending_messages() {
        let inv = Inventory {
            nodes: vec![
                Node::new(
                    "node-a",
                    vec![
                        gpu("gpu-0", "H100", 80, 2, 100),
                        gpu("gpu-1", "H100", 80, 6, 100),
                    ],
                ),
                Node::new(
                    "node-b",
                    vec![
                        gpu("gpu-0", "T4", 16, 16, 20),
                        gpu("gpu-1", "T4", 16, 12, 0),
                    ],
                ),
            ],
        };
        let share = |gib: u64, cores: u32, gpus: u32| {
            let mut r = Request::new(gpus, GpuShare::Memory { bytes: gib << 30 });
            r.cores = Some(cores);
            r
        };
        let mut only_t4 = share(10, 30, 1);
        only_t4.model_include = vec!["t4".into()];
        let big = share(100, 0, 1);
        let cases = [
            (
                "share",
                share(10, 30, 1),
                "no GPU has 10Gi and 30 cores free; best candidate node-b/gpu-0 has 16Gi and 20 cores free",
            ),
            (
                "model filter",
                only_t4.clone(),
                "no GPU has 10Gi and 30 cores free; best candidate node-b/gpu-0 has 16Gi and 20 cores free",
            ),
            (
                "memory bound",
                share(8, 0, 1),
                "no GPU has 8Gi and 0 cores free; best candidate node-b/gpu-0 has 16Gi and 20 cores free",
            ),
            (
                "two GPUs",
                share(10, 10, 2),
                "no node has 2 GPUs with 10Gi and 10 cores free; best candidate node-b/gpu-0 has 16Gi and 20 cores free",
            ),
            (
                "whole",
                Request::new(1, GpuShare::Whole),
                "no GPU is idle; best candidate node-b/gpu-0 has 16Gi and 20 cores free",
            ),
            (
                "too big",
                big,
                "no GPU can ever host 100Gi and 0 cores: none of the 4 GPUs is large enough and matches the model and UUID constraints",
            ),
        ];
        for (what, req, want) in cases {
            assert_eq!(pending(&inv, &req), want, "{what}");
            assert_eq!(never_fits(&inv, &req), what == "too big", "{what}");
        }
        // Pinned to a GPU an admin tainted: the taint is named.
        let mut tainted = inv.clone();
        tainted.nodes[0].gpus[1].taints = vec![fgpu_driver::engine::Taint {
            key: "example.com/maintenance".into(),
            value: "bios".into(),
            effect: "NoSchedule".into(),
        }];
        let mut pinned = share(4, 10, 1);
        pinned.uuid_pin = vec!["GPU-1".into()];
        tainted.nodes[0].gpus[1].uuid = "GPU-1".into();
        assert_eq!(
            pending(&tainted, &pinned),
            "no GPU can host 4Gi and 10 cores now: those that could carry device taints the claim does not tolerate: node-a/gpu-1 (example.com/maintenance=bios:NoSchedule)"
        );
        assert!(!never_fits(&tainted, &pinned), "a taint is not forever");
        let mut h100 = share(10, 30, 1);
        h100.model_include = vec!["H100".into()];
        assert_eq!(
            pending(&inv, &h100),
            "no GPU has 10Gi and 30 cores free; best candidate node-a/gpu-1 has 6Gi and 100 cores free"
        );
    }

    #[test]
    fn allocated_message() {
        let g = Grant {
            id: "u".into(),
            node: "node-a".into(),
            cpu_milli: 0,
            memory_mib: 0,
            devices: vec![DeviceGrant {
                gpu: "gpu-1".into(),
                memory: 10 << 30,
                cores: 30,
            }],
        };
        assert_eq!(allocated(&g), "allocated on node-a: gpu-1 (10Gi, 30 cores)");
    }
}
