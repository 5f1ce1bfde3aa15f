//! `discover`: enumerate GPUs through a backend and print them as a table or JSON.

use std::io::Write as _;

use anyhow::Context as _;
use fgpu_driver::backend::{BackendKind, FakeProfile, build_backend};
use fgpu_driver::device::{Health, NodeInventory};

use crate::{Backend, DiscoverArgs, Output};

/// Runs `discover` and writes the result to stdout.
pub(crate) fn run(args: &DiscoverArgs) -> anyhow::Result<()> {
    let inventories = match args.gpus.backend {
        Backend::Fake => {
            // clap enforces --fake-gpus with --backend fake.
            let path = args
                .gpus
                .fake_gpus
                .as_deref()
                .context("--backend fake needs --fake-gpus <FILE>")?;
            let profile = FakeProfile::load(path)?;
            tracing::debug!(profile = %path.display(), nodes = profile.nodes().len(), "loaded fake profile");
            let mut nodes = match &args.node {
                Some(node) => vec![profile.node(node)?.clone()],
                None => profile.nodes().to_vec(),
            };
            for n in &mut nodes {
                fgpu_driver::backend::fake::apply_faults(path, &mut n.gpus)?;
            }
            nodes
        }
        Backend::Nvml => {
            let node = args.node.clone().unwrap_or_else(default_node_name);
            let backend = build_backend(BackendKind::Nvml, None, None)?;
            let inventory = backend.inventory(&node)?;
            tracing::debug!(node = %node, gpus = inventory.gpus.len(), "enumerated GPUs via NVML");
            vec![inventory]
        }
    };
    let text = match args.output {
        Output::Table => render_table(&inventories),
        Output::Json => {
            let mut s = serde_json::to_string_pretty(&inventories)?;
            s.push('\n');
            s
        }
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write to stdout")
}

/// `$NODE_NAME` (set from the downward API in the DaemonSet), else the kernel host name.
fn default_node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

const HEADERS: [&str; 10] = [
    "NODE", "INDEX", "UUID", "PRODUCT", "MEMORY", "SMS", "CC", "NUMA", "PCI BUS", "HEALTH",
];
/// Columns whose content is right-aligned (numbers).
const NUMERIC: [bool; 10] = [
    false, true, false, false, true, true, true, true, false, false,
];

/// Renders one row per GPU under a header, columns padded to their widest cell.
pub(crate) fn render_table(inventories: &[NodeInventory]) -> String {
    let rows: Vec<[String; 10]> = inventories
        .iter()
        .flat_map(|inv| {
            inv.gpus.iter().map(move |g| {
                [
                    inv.node.clone(),
                    g.index.to_string(),
                    g.uuid.clone(),
                    g.product_name.clone(),
                    format!("{:.1} GiB", g.memory_gib()),
                    g.sm_count.to_string(),
                    g.compute_capability.to_string(),
                    g.numa_node
                        .map_or_else(|| "-".to_owned(), |n| n.to_string()),
                    g.pci_bus_id.clone(),
                    match &g.health {
                        Health::Healthy => "Healthy".to_owned(),
                        Health::Unhealthy { reason } => format!("Unhealthy: {reason}"),
                    },
                ]
            })
        })
        .collect();
    let mut widths = HEADERS.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = HEADERS.map(str::to_owned);
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                let pad = widths[i] - cell.chars().count();
                let last = i + 1 == row.len();
                match (NUMERIC[i], last) {
                    (true, _) => format!("{}{cell}", " ".repeat(pad)),
                    (false, true) => cell.clone(),
                    (false, false) => format!("{cell}{}", " ".repeat(pad)),
                }
            })
            .collect();
        out.push_str(&cells.join("  "));
        out.push('\n');
    }
    out
}
