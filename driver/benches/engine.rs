//! Node evaluations per second: one request scored against a synthetic 1,000-node
//! inventory (8 GPUs each, partly used), under each policy.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fgpu_driver::engine::{
    self, Gpu, GpuShare, Inventory, Node, Policy, Request, ScoreContext, Weighting, Workload,
};
use std::hint::black_box;

const MEM: u64 = 16_000_000_000;

fn inventory(nodes: usize) -> Inventory {
    let mut inv = Inventory {
        nodes: (0..nodes)
            .map(|n| {
                Node::new(
                    format!("n{n}"),
                    (0..8)
                        .map(|g| Gpu::new(format!("g{g}"), "G2", MEM))
                        .collect(),
                )
                .with_host(96_000, 393_216)
            })
            .collect(),
    };
    // A deterministic mix of partly used GPUs.
    for (n, node) in inv.nodes.iter_mut().enumerate() {
        for (g, gpu) in node.gpus.iter_mut().enumerate() {
            let used = ((n * 7 + g * 13) % 11) as u64 * 100;
            gpu.memory_free = MEM - MEM / 1000 * used.min(1000);
        }
        node.cpu_milli_free = Some(96_000 - (n as u64 % 8) * 8_000);
    }
    inv
}

fn workload() -> Workload {
    let kinds = [
        (12_000, 16_384, 1, 1000, 40),
        (6_000, 12_288, 1, 460, 10),
        (4_000, 8_192, 1, 810, 13),
        (8_000, 30_517, 1, 470, 9),
        (16_000, 65_536, 0, 0, 13),
        (4_000, 8_192, 1, 320, 4),
        (88_000, 327_680, 8, 1000, 1),
        (24_000, 65_536, 2, 1000, 1),
        (2_000, 4_096, 1, 650, 3),
        (3_000, 6_144, 1, 230, 2),
    ];
    Workload::from_pods(
        kinds
            .iter()
            .flat_map(|&(c, m, g, milli, n)| std::iter::repeat_n((c, m, g, milli), n)),
        1.0,
        Weighting::Count,
    )
}

fn bench(c: &mut Criterion) {
    let inv = inventory(1000);
    let w = workload();
    let ctx = ScoreContext {
        workload: Some(&w),
        max_spec: inv.max_spec(),
        usage_weight: 0.0,
    };
    let mut share = Request::new(1, GpuShare::Fraction { milli: 300 });
    share.cpu_milli = 4_000;
    share.memory_mib = 8_192;
    let mut whole = Request::new(1, GpuShare::Whole);
    whole.cpu_milli = 12_000;
    let mut g = c.benchmark_group("evaluate_1000_nodes");
    g.throughput(Throughput::Elements(inv.nodes.len() as u64));
    for (name, policy) in Policy::ALL {
        for (kind, req) in [("share", &share), ("whole", &whole)] {
            g.bench_with_input(BenchmarkId::new(name, kind), req, |b, req| {
                b.iter(|| black_box(engine::evaluate(&inv, req, policy, &ctx)).len())
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
