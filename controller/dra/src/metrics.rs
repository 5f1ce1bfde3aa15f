//! The controller's Prometheus metrics (`prometheus-client`), served on `/metrics`.
//!
//! * `fgpu_controller_mode_info{mode,reason}` 1 for the mode in force;
//! * `fgpu_controller_claims_allocated_total`;
//! * `fgpu_controller_claims_pending{reason}`: the claims of gated pods that wait after the
//!   last pass, by [`WaitReason`] (`no_fit`, `never_fits`, `rejected`, `internal`); every
//!   reason is set each pass, 0 when no claim waits for it (and 0 on a standby);
//! * `fgpu_controller_revocations_total`: tentative allocations the controller cleared
//!   because kube-scheduler granted the same capacity (written revocations only);
//! * `fgpu_controller_events_dropped_total`: Events not published because the queue of
//!   Events waiting for the API server was full (Events are best effort, see
//!   `fgpu_plumbing::events::Outbox`);
//! * `fgpu_controller_allocation_failures_total{reason}` (`no_fit`, `rejected`,
//!   `conflict`, `api`, `fenced`, `cleared`, `revoked`);
//! * `fgpu_controller_allocation_duration_seconds` (finalizer + status write),
//!   `fgpu_controller_reconcile_duration_seconds` (one pass),
//!   `fgpu_controller_plan_duration_seconds` (its part before the first write);
//! * `fgpu_controller_gpus` in the inventory;
//! * `fgpu_controller_fragmentation_ratio`: the share of the free GPU capacity the mix of
//!   shares now granted could not use (FGD's measure, [`crate::reconcile::fragmentation`]);
//! * per GPU (`node`, `gpu_uuid`, `gpu_index`: the slice device's `uuid` and `index`
//!   attributes, the labels the kubelet plugin's per-GPU families have):
//!   `fgpu_controller_gpu_memory_bytes`,
//!   `fgpu_controller_gpu_granted_memory_bytes`, `fgpu_controller_gpu_granted_cores`
//!   (percent), from the ledger after the last pass. These are encoded from a compact
//!   table at each scrape ([`GpuUsage`]), not kept as gauges: at 8,000 GPUs three gauge
//!   families cost about 5 MiB (a label vector of four strings per series), rebuilt every
//!   pass.

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::reconcile::WaitReason;

type Labels = Vec<(String, String)>;

/// The metrics and their registry.
pub struct Metrics {
    registry: Registry,
    mode: Family<Labels, Gauge>,
    last_mode: Mutex<Option<Labels>>,
    pub allocated: Counter,
    claims_pending: Family<Labels, Gauge>,
    pub revocations: Counter,
    pub events_dropped: Counter,
    failures: Family<Labels, Counter>,
    pub allocation_seconds: Histogram,
    pub pass_seconds: Histogram,
    pub plan_seconds: Histogram,
    pub gpus: Gauge,
    pub fragmentation: Gauge<f64, std::sync::atomic::AtomicU64>,
    usage: Arc<GpuUsage>,
}

/// Per GPU of the last pass: its memory and what is granted of it, encoded at each scrape.
#[derive(Debug, Default)]
struct GpuUsage(Mutex<Vec<NodeUsage>>);

#[derive(Debug)]
struct NodeUsage {
    node: String,
    gpus: Vec<GpuRow>,
}

/// One GPU's row: UUID, index (empty when the slice has none), memory bytes, granted
/// memory bytes, granted cores.
type GpuRow = (Box<str>, Box<str>, u64, u64, u32);

/// A per-GPU gauge: name, help, and its value in a row.
type GpuFamily = (&'static str, &'static str, fn(&GpuRow) -> u64);

impl Collector for GpuUsage {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let nodes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let families: [GpuFamily; 3] = [
            ("gpu_memory_bytes", "Device memory of each GPU", |g| g.2),
            (
                "gpu_granted_memory_bytes",
                "Device memory granted on each GPU (all allocated claims)",
                |g| g.3,
            ),
            (
                "gpu_granted_cores",
                "Core percent granted on each GPU (all allocated claims)",
                |g| u64::from(g.4),
            ),
        ];
        for (name, help, value) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for n in nodes.iter() {
                for g in &n.gpus {
                    let labels = [
                        ("node", n.node.as_str()),
                        ("gpu_uuid", &*g.0),
                        ("gpu_index", &*g.1),
                    ];
                    ConstGauge::new(gauge(value(g))).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the prefix `fgpu_controller`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fgpu_controller");
        let mode = Family::<Labels, Gauge>::default();
        registry.register(
            "mode_info",
            "The allocation mode in force, and why",
            mode.clone(),
        );
        let allocated = Counter::default();
        registry.register(
            "claims_allocated",
            "Claims allocated by the controller",
            allocated.clone(),
        );
        let claims_pending = Family::<Labels, Gauge>::default();
        registry.register(
            "claims_pending",
            "Claims of gated pods that wait after the last pass, by reason",
            claims_pending.clone(),
        );
        for reason in WaitReason::ALL {
            claims_pending
                .get_or_create(&reason_label(reason.as_str()))
                .set(0);
        }
        let revocations = Counter::default();
        registry.register(
            "revocations",
            "Tentative allocations the controller cleared (kube-scheduler granted the same capacity)",
            revocations.clone(),
        );
        let events_dropped = Counter::default();
        registry.register(
            "events_dropped",
            "Events not published because the queue of Events waiting for the API server was full",
            events_dropped.clone(),
        );
        let failures = Family::<Labels, Counter>::default();
        registry.register(
            "allocation_failures",
            "Allocation attempts that did not allocate, by reason",
            failures.clone(),
        );
        let allocation_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "allocation_duration_seconds",
            "Time to write one allocation (finalizer and status)",
            allocation_seconds.clone(),
        );
        let pass_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile pass",
            pass_seconds.clone(),
        );
        let plan_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "plan_duration_seconds",
            "Time of one reconcile pass before its first write: the views refreshed and the plan made (the rest of the pass is its writes)",
            plan_seconds.clone(),
        );
        let gpus = Gauge::default();
        registry.register(
            "gpus",
            "GPUs in the inventory (this driver's ResourceSlices)",
            gpus.clone(),
        );
        let fragmentation = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "fragmentation_ratio",
            "Share (0-1) of the free GPU capacity that the mix of shares now granted could not use",
            fragmentation.clone(),
        );
        let usage = Arc::new(GpuUsage::default());
        registry.register_collector(Box::new(usage.clone()));
        Self {
            registry,
            mode,
            last_mode: Mutex::new(None),
            allocated,
            claims_pending,
            revocations,
            events_dropped,
            failures,
            allocation_seconds,
            pass_seconds,
            plan_seconds,
            gpus,
            fragmentation,
            usage,
        }
    }

    /// Sets `mode_info` to the mode in force (the previous label set is removed).
    pub fn set_mode(&self, mode: &str, reason: &str) {
        let labels = vec![
            ("mode".to_owned(), mode.to_owned()),
            ("reason".to_owned(), reason.to_owned()),
        ];
        let mut last = self
            .last_mode
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = last.take() {
            self.mode.remove(&old);
        }
        self.mode.get_or_create(&labels).set(1);
        *last = Some(labels);
    }

    /// Sets the per-GPU gauges from `usage` (GPUs no longer present are dropped).
    pub fn set_usage(&self, usage: &fgpu_driver::engine::Inventory) {
        let table = usage
            .nodes
            .iter()
            .map(|n| NodeUsage {
                node: n.name.clone(),
                gpus: n
                    .gpus
                    .iter()
                    .map(|g| {
                        (
                            g.uuid.as_str().into(),
                            g.index.map(|i| i.to_string()).unwrap_or_default().into(),
                            g.memory_total,
                            g.memory_total.saturating_sub(g.memory_free),
                            g.cores_total.saturating_sub(g.cores_free),
                        )
                    })
                    .collect(),
            })
            .collect();
        *self.usage.0.lock().unwrap_or_else(PoisonError::into_inner) = table;
    }

    pub fn failure(&self, reason: &str) {
        self.failures.get_or_create(&reason_label(reason)).inc();
    }

    /// Sets `claims_pending` from the reasons of the claims that wait after a pass (one
    /// item per claim): every reason is set, 0 for those absent.
    pub fn set_pending(&self, waiting: impl IntoIterator<Item = WaitReason>) {
        let mut counts = [0i64; WaitReason::ALL.len()];
        for r in waiting {
            if let Some(i) = WaitReason::ALL.iter().position(|x| *x == r) {
                counts[i] += 1;
            }
        }
        for (reason, n) in WaitReason::ALL.iter().zip(counts) {
            self.claims_pending
                .get_or_create(&reason_label(reason.as_str()))
                .set(n);
        }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

fn reason_label(reason: &str) -> Labels {
    vec![("reason".to_owned(), reason.to_owned())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_label_follows_the_mode() {
        let m = Metrics::new();
        m.set_mode("controller", "set by --mode");
        m.set_mode("capacity", "auto: x");
        let text = m.encode();
        assert!(
            text.contains(r#"fgpu_controller_mode_info{mode="capacity",reason="auto: x"} 1"#),
            "{text}"
        );
        assert!(!text.contains(r#"mode="controller""#), "{text}");
        let mut gpu = fgpu_driver::engine::Gpu::new("gpu-0", "H100", 80 << 30);
        gpu.uuid = "GPU-1111".into();
        gpu.index = Some(3);
        gpu.memory_free = 70 << 30;
        gpu.cores_free = 70;
        // A slice device without an `index` attribute: the label is empty.
        let mut other = fgpu_driver::engine::Gpu::new("gpu-1", "H100", 80 << 30);
        other.uuid = "GPU-2222".into();
        let usage = fgpu_driver::engine::Inventory {
            nodes: vec![fgpu_driver::engine::Node::new("n", vec![gpu, other])],
        };
        m.set_usage(&usage);
        let text = m.encode();
        // The house labels, the plugin's names for the same GPU (not the device name).
        let labels = r#"{node="n",gpu_uuid="GPU-1111",gpu_index="3"}"#;
        for line in [
            format!("fgpu_controller_gpu_granted_memory_bytes{labels} 10737418240"),
            format!("fgpu_controller_gpu_granted_cores{labels} 30"),
            format!("fgpu_controller_gpu_memory_bytes{labels} 85899345920"),
            r#"fgpu_controller_gpu_granted_cores{node="n",gpu_uuid="GPU-2222",gpu_index=""} 0"#
                .to_owned(),
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} in {text}");
        }
        assert!(!text.contains("gpu=\""), "{text}");
        assert!(!text.contains("gpu-0"), "{text}");
        assert!(
            text.contains("# TYPE fgpu_controller_gpu_granted_cores gauge"),
            "{text}"
        );
        // The next pass's table replaces the last one: a GPU gone is no longer reported.
        m.set_usage(&fgpu_driver::engine::Inventory { nodes: vec![] });
        assert!(!m.encode().contains("GPU-1111"));
        m.failure("no_fit");
        assert!(
            m.encode()
                .contains(r#"fgpu_controller_allocation_failures_total{reason="no_fit"} 1"#)
        );
    }

    #[test]
    fn pending_by_reason_and_revocations() {
        let m = Metrics::new();
        let text = m.encode();
        // Before any pass (and on a standby) every reason reads 0, revocations 0.
        for r in WaitReason::ALL {
            let line = format!(
                "fgpu_controller_claims_pending{{reason=\"{}\"}} 0",
                r.as_str()
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(
            text.contains("# TYPE fgpu_controller_claims_pending gauge"),
            "{text}"
        );
        assert!(
            text.contains("fgpu_controller_revocations_total 0"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE fgpu_controller_revocations counter"),
            "{text}"
        );
        m.set_pending([
            WaitReason::NoFit,
            WaitReason::Rejected,
            WaitReason::NoFit,
            WaitReason::NeverFits,
        ]);
        m.revocations.inc();
        m.revocations.inc();
        let text = m.encode();
        for (reason, n) in [
            ("no_fit", 2),
            ("never_fits", 1),
            ("rejected", 1),
            ("internal", 0),
        ] {
            let line = format!("fgpu_controller_claims_pending{{reason=\"{reason}\"}} {n}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(
            text.contains("fgpu_controller_revocations_total 2\n"),
            "{text}"
        );
        // The next pass sets every reason again: one that no claim has any more reads 0.
        m.set_pending([WaitReason::Internal]);
        let text = m.encode();
        for (reason, n) in [
            ("no_fit", 0),
            ("never_fits", 0),
            ("rejected", 0),
            ("internal", 1),
        ] {
            let line = format!("fgpu_controller_claims_pending{{reason=\"{reason}\"}} {n}\n");
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert_eq!(
            text.matches("fgpu_controller_claims_pending{").count(),
            4,
            "{text}"
        );
    }
}
