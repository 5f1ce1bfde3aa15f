//! HAMi's scheduler families (`fgpu-controller run --hami-metrics`), so that dashboards
//! and alerts written for HAMi's `hami-scheduler` exporter read fgpu's controller unchanged.
//!
//! Names, labels and units are HAMi's (`cmd/scheduler/metrics.go` of Project-HAMi/HAMi),
//! not the house rules': HAMi's `_ratio` core families carry percent (0-100), its memory
//! ratio 0-1, and every series has HAMi's constant label `zone="vGPU"`. Per GPU of the
//! inventory after the last pass (labels `node`, `device_uuid`, `device_index`,
//! `device_type` = `NVIDIA-<productName>`, as HAMi names an NVIDIA GPU's type):
//!
//! | metric | value |
//! |---|---|
//! | `hami_gpu_memory_limit_bytes` | device memory |
//! | `hami_gpu_core_limit_ratio` | cores the GPU offers, percent (100) |
//! | `hami_gpu_memory_allocated_bytes` (+ `device_cores`) | memory granted (all allocated claims) |
//! | `hami_gpu_shared_count` | grants holding part of the GPU (HAMi: containers) |
//! | `hami_gpu_core_allocated_ratio` | cores granted, percent |
//! | `hami_node_gpu_overview` (+ `device_cores`, `device_memory_limit` in MiB) | memory granted |
//! | `hami_node_gpu_memory_allocated_ratio` (no `device_type`) | memory granted / device memory, 0-1 |
//!
//! Not emitted: `hami_vgpu_memory_allocated_bytes` / `hami_vgpu_core_allocated_ratio`
//! (per pod and container index: a DRA claim is not a container's, and the controller does
//! not know which containers use a claim), `hami_resource_quota_*` (fgpu has no GPU
//! ResourceQuota), `hami_node_gpu_mig_instance_info` (no MIG), `hami_build_info`, HAMi's
//! legacy names. Like the house per-GPU families these are encoded from a compact table at
//! each scrape, not kept as gauges.

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// One GPU as HAMi's families show it.
#[derive(Clone, Debug, PartialEq)]
struct Row {
    node: Arc<str>,
    uuid: Box<str>,
    index: Box<str>,
    device_type: Box<str>,
    memory: u64,
    memory_granted: u64,
    cores: u32,
    cores_granted: u32,
    shares: u32,
}

#[derive(Debug, Default)]
struct Table(Mutex<Vec<Row>>);

/// A family: name (after the `hami_` prefix), help, whether it has `device_type`, and the
/// extra labels it has.
type Family = (&'static str, &'static str, fn(&Row) -> f64, Extra);

#[derive(Clone, Copy, PartialEq)]
enum Extra {
    /// node, device_uuid, device_index, device_type.
    Plain,
    /// + device_cores.
    Cores,
    /// + device_cores, device_memory_limit.
    Overview,
    /// node, device_uuid, device_index only.
    NoType,
}

const MIB: f64 = (1u64 << 20) as f64;

impl Collector for Table {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let rows = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let families: [Family; 7] = [
            (
                "gpu_memory_limit_bytes",
                "Device memory limit for a certain GPU",
                |r| r.memory as f64,
                Extra::Plain,
            ),
            (
                "gpu_core_limit_ratio",
                "Device core limit for a certain GPU",
                |r| f64::from(r.cores),
                Extra::Plain,
            ),
            (
                "gpu_memory_allocated_bytes",
                "Device memory allocated for a certain GPU",
                |r| r.memory_granted as f64,
                Extra::Cores,
            ),
            (
                "gpu_shared_count",
                "Number of containers sharing this GPU",
                |r| f64::from(r.shares),
                Extra::Plain,
            ),
            (
                "gpu_core_allocated_ratio",
                "Device core allocated for a certain GPU",
                |r| f64::from(r.cores_granted),
                Extra::Plain,
            ),
            (
                "node_gpu_overview",
                "GPU overview on a certain node",
                |r| r.memory_granted as f64,
                Extra::Overview,
            ),
            (
                "node_gpu_memory_allocated_ratio",
                "GPU Memory Allocated Percentage on a certain GPU",
                |r| {
                    if r.memory == 0 {
                        0.0
                    } else {
                        r.memory_granted as f64 / r.memory as f64
                    }
                },
                Extra::NoType,
            ),
        ];
        for (name, help, value, extra) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for r in rows.iter() {
                if extra == Extra::NoType && r.memory == 0 {
                    continue; // HAMi writes the ratio only for GPUs with memory
                }
                let cores = r.cores.to_string();
                let limit_mib = ((r.memory as f64) / MIB).floor().to_string();
                let mut labels: Vec<(&str, &str)> = vec![
                    ("node", &*r.node),
                    ("device_uuid", &*r.uuid),
                    ("device_index", &*r.index),
                ];
                if matches!(extra, Extra::Cores | Extra::Overview) {
                    labels.push(("device_cores", &cores));
                }
                if extra == Extra::Overview {
                    labels.push(("device_memory_limit", &limit_mib));
                }
                if extra != Extra::NoType {
                    labels.push(("device_type", &*r.device_type));
                }
                ConstGauge::new(value(r)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// HAMi's scheduler families and their registry (prefix `hami`, constant label
/// `zone="vGPU"`).
#[derive(Debug)]
pub struct HamiMetrics {
    registry: Registry,
    table: Arc<Table>,
}

impl Default for HamiMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl HamiMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix_and_labels(
            "hami",
            [(
                std::borrow::Cow::Borrowed("zone"),
                std::borrow::Cow::Borrowed("vGPU"),
            )]
            .into_iter(),
        );
        let table = Arc::new(Table::default());
        registry.register_collector(Box::new(table.clone()));
        Self { registry, table }
    }

    /// Sets the table from the inventory after a pass (`usage`, free figures after every
    /// grant) and the grants per GPU (`shares`, same order; missing entries read 0).
    pub fn set(&self, usage: &fgpu_driver::engine::Inventory, shares: &[Vec<u32>]) {
        let mut rows = Vec::with_capacity(usage.nodes.iter().map(|n| n.gpus.len()).sum());
        for (ni, n) in usage.nodes.iter().enumerate() {
            let node: Arc<str> = n.name.as_str().into();
            for (gi, g) in n.gpus.iter().enumerate() {
                rows.push(Row {
                    node: node.clone(),
                    uuid: g.uuid.as_str().into(),
                    index: g.index.map(|i| i.to_string()).unwrap_or_default().into(),
                    device_type: format!("NVIDIA-{}", g.model).into(),
                    memory: g.memory_total,
                    memory_granted: g.memory_total.saturating_sub(g.memory_free),
                    cores: g.cores_total,
                    cores_granted: g.cores_total.saturating_sub(g.cores_free),
                    shares: shares.get(ni).and_then(|s| s.get(gi)).copied().unwrap_or(0),
                });
            }
        }
        *self.table.0.lock().unwrap_or_else(PoisonError::into_inner) = rows;
    }

    /// Appends the families to `out`, an exposition without its `# EOF` line, and ends it.
    pub fn encode_after(&self, out: &mut String) {
        // Writing to a String cannot fail.
        let _ = encode_registry(out, &self.registry);
        let _ = encode_eof(out);
    }
}

/// `main` (a whole exposition, `# EOF` last) followed by `hami`'s families, when given.
pub fn encode_with(main: String, hami: Option<&HamiMetrics>) -> String {
    let Some(h) = hami else {
        return main;
    };
    let mut out = match main.strip_suffix("# EOF\n") {
        Some(body) => body.to_owned(),
        None => main,
    };
    h.encode_after(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_driver::engine::{Gpu, Inventory, Node};

    fn inventory() -> Inventory {
        let mut a = Gpu::new("gpu-0", "NVIDIA H100 80GB HBM3", 80 << 30);
        a.uuid = "GPU-aaaa".into();
        a.index = Some(0);
        a.memory_free = 60 << 30;
        a.cores_free = 70;
        let mut b = Gpu::new("gpu-1", "NVIDIA H100 80GB HBM3", 80 << 30);
        b.uuid = "GPU-bbbb".into();
        b.index = Some(1);
        Inventory {
            nodes: vec![Node::new("node-a", vec![a, b])],
        }
    }

    #[test]
    fn hami_names_labels_and_units() {
        let h = HamiMetrics::new();
        h.set(&inventory(), &[vec![2, 0]]);
        let text = encode_with("# HELP x y\n# EOF\n".into(), Some(&h));
        let plain = r#"zone="vGPU",node="node-a",device_uuid="GPU-aaaa",device_index="0""#;
        let ty = r#"device_type="NVIDIA-NVIDIA H100 80GB HBM3""#;
        for line in [
            format!("hami_gpu_memory_limit_bytes{{{plain},{ty}}} 85899345920.0"),
            format!("hami_gpu_core_limit_ratio{{{plain},{ty}}} 100.0"),
            format!(
                "hami_gpu_memory_allocated_bytes{{{plain},device_cores=\"100\",{ty}}} 21474836480.0"
            ),
            format!("hami_gpu_shared_count{{{plain},{ty}}} 2.0"),
            // HAMi's "ratio" of cores is percent: 30 granted of 100.
            format!("hami_gpu_core_allocated_ratio{{{plain},{ty}}} 30.0"),
            format!(
                "hami_node_gpu_overview{{{plain},device_cores=\"100\",device_memory_limit=\"81920\",{ty}}} 21474836480.0"
            ),
            // The memory ratio is 0-1 (20 of 80 GiB), and has no device_type.
            format!("hami_node_gpu_memory_allocated_ratio{{{plain}}} 0.25"),
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} in {text}");
        }
        assert!(
            text.contains(
                r#"hami_gpu_shared_count{zone="vGPU",node="node-a",device_uuid="GPU-bbbb",device_index="1",device_type="NVIDIA-NVIDIA H100 80GB HBM3"} 0.0"#
            ),
            "{text}"
        );
        for t in [
            "# TYPE hami_gpu_memory_limit_bytes gauge",
            "# TYPE hami_node_gpu_memory_allocated_ratio gauge",
        ] {
            assert!(text.contains(t), "{t} in {text}");
        }
        // One exposition: the main one's lines first, one EOF at the end.
        assert!(text.starts_with("# HELP x y\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");

        // The next pass replaces the table: GPUs gone are gone.
        h.set(&Inventory { nodes: vec![] }, &[]);
        let text = encode_with("# EOF\n".into(), Some(&h));
        assert!(!text.contains("GPU-aaaa"), "{text}");
        // Off: the main exposition unchanged.
        assert_eq!(encode_with("a\n# EOF\n".into(), None), "a\n# EOF\n");
    }
}
