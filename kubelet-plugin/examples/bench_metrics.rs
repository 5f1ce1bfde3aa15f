//! Scrape cost of the plugin's metrics page (issue 19's benchmark): a node of 8 GPUs x 64
//! claims (512 claims, one share each, two processes per claim, one pod per claim), every
//! per-claim and per-container family filled as a monitor pass fills it, HAMi's families on.
//!
//! ```text
//! cargo run --release -p fgpu-kubelet-plugin --example bench_metrics [SCRAPES] [DUMP_FILE]
//! ```
//!
//! DUMP_FILE: where to write the filled page (for `promtool check metrics < DUMP_FILE`).
//!
//! Printed: the page's size, series count, and the time to render it (median and p99 of
//! SCRAPES renders), against a baseline page of the same node with no claim prepared, in the
//! same run.

use std::collections::BTreeMap;
use std::time::Instant;

use fgpu_kubelet_plugin::checkpoint::{ClaimRecord, PrepareState, PreparedDevice};
use fgpu_kubelet_plugin::metrics::{ClaimGpuFigures, ContainerFigures, Metrics};

const GPUS: usize = 8;
const PER_GPU: usize = 64;

fn uuid(g: usize) -> String {
    format!("GPU-{g:08x}-0000-4000-8000-000000000000")
}

fn filled() -> Metrics {
    let m = Metrics::new();
    m.enable_hami("node-1");
    m.set_gpus(&fgpu_driver::device::NodeInventory {
        node: "node-1".into(),
        gpus: (0..GPUS)
            .map(|g| fgpu_driver::device::Gpu {
                index: g as u32,
                minor: g as u32,
                uuid: uuid(g),
                product_name: "NVIDIA H200".into(),
                memory_bytes: 141 << 30,
                sm_count: 132,
                compute_capability: fgpu_driver::device::ComputeCapability { major: 9, minor: 0 },
                driver_version: "580.0".into(),
                cuda_driver_version: "13.0".into(),
                pci_bus_id: format!("0000:{:02x}:00.0", g + 1),
                pcie_root: None,
                numa_node: None,
                mig_capable: true,
                enforcement: Default::default(),
                health: fgpu_driver::device::Health::Healthy,
                device_nodes: Vec::new(),
            })
            .collect(),
    });
    let mut claims = BTreeMap::new();
    let mut rows = Vec::new();
    for g in 0..GPUS {
        for c in 0..PER_GPU {
            let name = format!("claim-{g}-{c}");
            claims.insert(
                format!("uid-{g}-{c}"),
                ClaimRecord {
                    namespace: "team-a".into(),
                    name: name.clone(),
                    state: PrepareState::PrepareCompleted,
                    devices: vec![PreparedDevice {
                        gpu_uuid: uuid(g),
                        memory_bytes: 1 << 30,
                        cores: 1,
                        enforcement: Default::default(),
                        ..PreparedDevice::default()
                    }],
                    ..ClaimRecord::default()
                },
            );
            rows.push((name, uuid(g)));
        }
    }
    m.set_claims(&claims);
    m.set_claim_usage(
        rows.iter().map(|(n, u)| ClaimGpuFigures {
            namespace: "team-a",
            claim: n,
            gpu_uuid: u,
            used_memory: 900 << 20,
            granted_memory: 1 << 30,
            sm_percent: 1,
            processes: 2,
        }),
        &BTreeMap::new(),
    );
    let pods: Vec<String> = rows.iter().map(|(n, _)| format!("pod-{n}")).collect();
    let containers: Vec<ContainerFigures<'_>> = rows
        .iter()
        .zip(&pods)
        .map(|((n, u), p)| ContainerFigures {
            namespace: "team-a",
            pod: p,
            container: "main".into(),
            claim: n,
            gpu_uuid: u,
            gpu_position: 0,
            used_memory: 900 << 20,
            granted_memory: 1 << 30,
            sm_percent: 1,
            processes: 2,
        })
        .collect();
    m.set_container_usage(&containers);
    m.set_claim_pods(
        rows.iter()
            .zip(&pods)
            .map(|((n, u), p)| ("team-a", n.as_str(), u.as_str(), p.as_str())),
    );
    m.set_shim_counters(
        rows.iter()
            .map(|(n, u)| ("team-a", n.as_str(), u.as_str(), 3, 12_345_678_900, 0)),
    );
    m
}

fn measure(m: &Metrics, n: usize) -> (usize, usize, f64, f64) {
    let page = m.encode();
    let series = page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let s = Instant::now();
            std::hint::black_box(m.encode());
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (page.len(), series, t[n / 2], t[(n * 99 / 100).min(n - 1)])
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let (bs, bn, bm, bp) = measure(&Metrics::new(), n);
    let page = filled();
    let (fs, fnn, fm, fp) = measure(&page, n);
    if let Some(path) = std::env::args().nth(2) {
        // As a reader without an OpenMetrics Accept header (promtool) gets it.
        let text = fgpu_plumbing::exposition::to_text(&page.encode());
        std::fs::write(&path, text).expect("cannot write the dump file");
    }
    println!(
        "baseline (no claim): {bs} bytes, {bn} series, render median {bm:.3} ms, p99 {bp:.3} ms"
    );
    println!(
        "{GPUS} GPUs x {PER_GPU} claims: {fs} bytes ({:.0} KiB), {fnn} series, render median {fm:.3} ms, p99 {fp:.3} ms ({:.0}x the baseline's median)",
        fs as f64 / 1024.0,
        fm / bm.max(1e-9)
    );
}
