//! HAMi-compatible node families (`--hami-metrics`), so that dashboards and alerts written
//! for HAMi's node monitor (`vGPUmonitor`) work on an fgpu node unchanged.
//!
//! Names, label names and units are those of HAMi's monitor, not fgpu's conventions: its
//! utilisation "ratios" are percentages (0-100), its GPU label is `device_uuid`, its
//! per-container families carry `vdevice_index` (the GPU's position among the claim's
//! GPUs, as the container sees them). Emitted:
//!
//! | family | labels | fgpu's figure |
//! |---|---|---|
//! | `hami_host_gpu_memory_used_bytes` | `node`, `device_index`, `device_uuid`, `device_type` | device memory the GPU's processes hold |
//! | `hami_host_gpu_utilization_ratio` | the same | SM utilisation of the GPU's processes, percent |
//! | `hami_vgpu_memory_used_bytes` | `namespace`, `pod`, `container`, `vdevice_index`, `device_uuid` | device memory the container's processes hold |
//! | `hami_vgpu_memory_limit_bytes` | the same | memory granted to the container's claim on the GPU |
//! | `hami_container_device_memory_bytes` | the same | as `hami_vgpu_memory_used_bytes` (HAMi exports both) |
//! | `hami_container_device_utilization_ratio` | the same | SM utilisation of the container's processes, percent |
//!
//! Not emitted, because fgpu does not measure them: the memory-controller utilisation, the
//! time since a container's last kernel, HAMi's context/module/buffer split of a
//! container's memory, MIG instance info, and the `zone` label HAMi's registry adds.
//! Per-container series exist for containers with processes on the GPU whose name the
//! monitor knows ([`crate::monitor::containers`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// One GPU as HAMi's host families describe it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct HostGpu {
    pub index: u32,
    /// `NVIDIA-<product name>`, as HAMi labels it.
    pub device_type: String,
    /// Device memory of its processes (`None`: the GPU could not be read this pass).
    pub used_memory: Option<u64>,
    /// SM utilisation in percent (`None`: not read this pass).
    pub sm_percent: Option<u32>,
}

/// One container's figures on one GPU.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct ContainerGpu {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub vdevice_index: usize,
    pub gpu_uuid: String,
    pub used_memory: u64,
    pub limit: u64,
    pub sm_percent: u32,
}

#[derive(Debug, Default)]
struct State {
    node: String,
    gpus: BTreeMap<String, HostGpu>,
    containers: Vec<ContainerGpu>,
}

/// The families' source: kept up to date by the monitor whether or not they are on (a copy
/// of what the fgpu families hold), encoded only when on.
#[derive(Debug, Default)]
pub(super) struct Hami {
    on: AtomicBool,
    state: Mutex<State>,
}

impl Hami {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns the families on, labelled with node `node`.
    pub fn enable(&self, node: &str) {
        self.state().node = node.to_owned();
        self.on.store(true, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The node's GPUs (index and product), from the inventory; their usage is kept.
    pub fn set_inventory(&self, gpus: impl IntoIterator<Item = (String, u32, String)>) {
        let mut s = self.state();
        let mut next = BTreeMap::new();
        for (uuid, index, product) in gpus {
            let old = s.gpus.remove(&uuid).unwrap_or_default();
            next.insert(
                uuid,
                HostGpu {
                    index,
                    device_type: format!("NVIDIA-{product}"),
                    ..old
                },
            );
        }
        s.gpus = next;
    }

    /// One pass's per-GPU usage: (UUID, used memory, SM percent); GPUs not named are unread.
    pub fn set_usage(&self, rows: impl IntoIterator<Item = (String, u64, Option<u32>)>) {
        let mut s = self.state();
        for g in s.gpus.values_mut() {
            g.used_memory = None;
            g.sm_percent = None;
        }
        for (uuid, used, sm) in rows {
            if let Some(g) = s.gpus.get_mut(&uuid) {
                g.used_memory = Some(used);
                g.sm_percent = sm;
            }
        }
    }

    pub fn set_containers(&self, rows: Vec<ContainerGpu>) {
        self.state().containers = rows;
    }
}

type HostValue = fn(&HostGpu) -> Option<u64>;
type ContainerValue = fn(&ContainerGpu) -> u64;

impl Collector for Hami {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if !self.enabled() {
            return Ok(());
        }
        let s = self.state();
        let gauge = |v: u64| ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
        let host: [(&str, &str, HostValue); 2] = [
            (
                "hami_host_gpu_memory_used_bytes",
                "GPU device memory usage in bytes",
                |g| g.used_memory,
            ),
            (
                "hami_host_gpu_utilization_ratio",
                "GPU core utilization ratio (0-100)",
                |g| g.sm_percent.map(|p| u64::from(p.min(100))),
            ),
        ];
        for (name, help, value) in host {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (uuid, g) in &s.gpus {
                let Some(v) = value(g) else { continue };
                let index = g.index.to_string();
                let labels = [
                    ("node", s.node.as_str()),
                    ("device_index", index.as_str()),
                    ("device_uuid", uuid.as_str()),
                    ("device_type", g.device_type.as_str()),
                ];
                gauge(v).encode(family.encode_family(&labels)?)?;
            }
        }
        let per_container: [(&str, &str, ContainerValue); 4] = [
            (
                "hami_vgpu_memory_used_bytes",
                "vGPU device memory usage in bytes",
                |c| c.used_memory,
            ),
            (
                "hami_vgpu_memory_limit_bytes",
                "vGPU device memory limit in bytes",
                |c| c.limit,
            ),
            (
                "hami_container_device_memory_bytes",
                "Container device memory usage in bytes",
                |c| c.used_memory,
            ),
            (
                "hami_container_device_utilization_ratio",
                "Container device SM utilization ratio (0-100)",
                |c| u64::from(c.sm_percent.min(100)),
            ),
        ];
        for (name, help, value) in per_container {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for c in &s.containers {
                let index = c.vdevice_index.to_string();
                let labels = [
                    ("namespace", c.namespace.as_str()),
                    ("pod", c.pod.as_str()),
                    ("container", c.container.as_str()),
                    ("vdevice_index", index.as_str()),
                    ("device_uuid", c.gpu_uuid.as_str()),
                ];
                gauge(value(c)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}
