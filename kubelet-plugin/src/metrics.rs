//! Prometheus metrics of the node plugin (`prometheus-client`).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `fgpu_kubelet_plugin_requests_total` | `operation`, `result` | claims prepared / unprepared, `ok` or `error` |
//! | `fgpu_kubelet_plugin_request_duration_seconds` | `operation` | time per claim |
//! | `fgpu_kubelet_plugin_prepare_phase_duration_seconds` | `phase` | time per step of a prepare ([`Phase`]) |
//! | `fgpu_kubelet_plugin_errors_total` | `operation`, `reason` | failures by reason ([`crate::prepare::PrepareError::reason`]) |
//! | `fgpu_kubelet_plugin_prepared_claims` | | claims in the checkpoint marked `PrepareCompleted` |
//! | `fgpu_kubelet_plugin_gpu_granted_memory_bytes` | `gpu_uuid` | memory granted on the GPU by prepared claims |
//! | `fgpu_kubelet_plugin_gpu_granted_cores` | `gpu_uuid` | cores (percent) granted on the GPU by prepared claims |
//! | `fgpu_kubelet_plugin_gpu_shares` | `gpu_uuid` | prepared claim devices (shares) on the GPU |
//! | `fgpu_kubelet_plugin_gpu_memory_bytes` | `gpu_uuid`, `gpu_index` | device memory of the GPU (inventory) |
//! | `fgpu_kubelet_plugin_gpu_oversubscribe_ratio` | `gpu_uuid` | the research tier's ratio in force on the GPU (1: off the tier; [`crate::tier`]) |
//! | `fgpu_kubelet_plugin_gpu_healthy` | `gpu_uuid`, `gpu_index` | 1 when the GPU is healthy (the health monitor's conclusion) |
//! | `fgpu_kubelet_plugin_gpu_health_transitions_total` | `gpu_uuid`, `to` (`healthy`, `degraded`, `fatal`) | changes of a GPU's condition |
//! | `fgpu_kubelet_plugin_claim_reads_total` | `read` ([`ClaimRead`]) | where each prepare got its claim: the claim cache, or a GET and why |
//! | `fgpu_kubelet_plugin_claim_cache_claims` | | claims the claim cache holds (allocated on this node) |
//!
//! The node monitor's ([`crate::monitor`]), per claim and GPU it holds (labels `namespace`,
//! `claim`, `gpu_uuid`), refreshed every pass; claims gone are dropped:
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `fgpu_kubelet_plugin_claim_used_memory_bytes` | `namespace`, `claim`, `gpu_uuid` | device memory the claim's processes hold, as the driver reports it |
//! | `fgpu_kubelet_plugin_claim_granted_memory_bytes` | `namespace`, `claim`, `gpu_uuid` | memory granted |
//! | `fgpu_kubelet_plugin_claim_sm_utilization_ratio` | `namespace`, `claim`, `gpu_uuid` | SM utilisation of the claim's processes over the last pass (0-1) |
//! | `fgpu_kubelet_plugin_claim_processes` | `namespace`, `claim`, `gpu_uuid` | the claim's processes on the GPU |
//! | `fgpu_kubelet_plugin_claim_allocation_refusals_total` | `namespace`, `claim`, `gpu_uuid` | allocations the shim refused past the grant (the shim's count) |
//! | `fgpu_kubelet_plugin_claim_managed_memory_bytes` | `namespace`, `claim`, `gpu_uuid` | the part of the claim's memory that is managed memory (research tier: spilled past the physical share, or asked for; the shim's count) |
//! | `fgpu_kubelet_plugin_claim_throttled_seconds_total` | `namespace`, `claim`, `gpu_uuid` | time the claim's launches waited for its core quota (the shim's count) |
//! | `fgpu_kubelet_plugin_claim_info` | `namespace`, `claim`, `gpu_uuid`, `pod` | 1 per pod a claim serves on a GPU: the device to pod map |
//! | `fgpu_kubelet_plugin_container_used_memory_bytes` | `namespace`, `pod`, `container`, `claim`, `gpu_uuid` | device memory a container's processes hold |
//! | `fgpu_kubelet_plugin_container_sm_utilization_ratio` | the same | SM utilisation of a container's processes over the last pass (0-1) |
//! | `fgpu_kubelet_plugin_container_processes` | the same | a container's processes on the GPU |
//! | `fgpu_kubelet_plugin_gpu_used_memory_bytes`, `_gpu_sm_utilization_ratio`, `_gpu_processes` | `gpu_uuid` | the same for all processes on the GPU |
//! | `fgpu_kubelet_plugin_claim_status_writes_total` | `result` | writes of claims' `status.devices` |
//! | `fgpu_kubelet_plugin_over_quota_total` | `kind` (`memory`, `compute`), `action` | findings of the backstop (each report; a kill is counted in `backstop_kills_total`) |
//! | `fgpu_kubelet_plugin_backstop_kills_total` | | processes killed by `--over-quota=kill` |
//! | `fgpu_kubelet_plugin_gpu_unattributed_processes` | `gpu_uuid` | processes on the GPU that belong to no prepared claim of this node |
//! | `fgpu_kubelet_plugin_monitor_errors_total` | `cause` | monitor failures (logged once per cause) |
//! | `fgpu_kubelet_plugin_monitor_pass_duration_seconds` | | time of one monitor pass |
//!
//! The per-container families name the container the monitor found for each process
//! ([`crate::monitor::containers`]); `container` is empty where it could not tell (several
//! containers of one pod sharing the claim, or the kubelet's pod resources API unread).
//! With `--hami-metrics` the registry also encodes HAMi's node families ([`hami`]).

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::checkpoint::{ClaimRecord, PrepareState};

mod hami;

/// The kubelet operation.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Operation {
    /// NodePrepareResources, per claim.
    Prepare,
    /// NodeUnprepareResources, per claim.
    Unprepare,
}

/// A step of a prepare, for [`Metrics::observe_phase`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Phase {
    /// Reading the claim: from the claim cache, else from the API server.
    ClaimGet,
    /// Resolving the grants and building the CDI spec (pure computation).
    Build,
    /// Recording `PrepareStarted` in the checkpoint (on disk when done), from the end of
    /// `Build`: includes the wait for a thread of the blocking pool, where the records and
    /// the files are written.
    RecordStarted,
    /// Writing the claim's directory, limits, preload and CDI spec files.
    Files,
    /// Recording `PrepareCompleted` in the checkpoint (on disk when done).
    RecordCompleted,
}

/// Where a prepare's copy of the claim came from ([`crate::claim_cache`]), for
/// [`Metrics::observe_claim_read`].
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum ClaimRead {
    /// From the claim cache (no API request).
    CacheHit,
    /// A GET: the plugin runs without the claim cache (`--claim-cache=false`).
    NoCache,
    /// A GET: the cache has not listed the claims yet, or its watch broke and it is
    /// listing them again.
    NotSynced,
    /// A GET: the cache does not hold an allocated claim of this name and UID (not yet
    /// seen by the watch, or not allocated on this node).
    NotCached,
    /// A GET: this plugin unprepared the claim and the watch has not shown it deallocated
    /// since, so the cached allocation may be the one before a reallocation.
    Unprepared,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimReadLabels {
    read: ClaimRead,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: Phase,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    operation: Operation,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: Operation,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    operation: Operation,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    gpu_uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuIndexLabels {
    gpu_uuid: String,
    gpu_index: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    gpu_uuid: String,
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerLabels {
    namespace: String,
    pod: String,
    container: String,
    claim: String,
    gpu_uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimPodLabels {
    namespace: String,
    claim: String,
    gpu_uuid: String,
    pod: String,
}

fn duration_histogram() -> Histogram {
    // 1 ms to about 33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

fn phase_histogram() -> Histogram {
    // 50 µs to about 1.6 s.
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimGpuLabels {
    namespace: String,
    claim: String,
    gpu_uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OverQuotaLabels {
    kind: &'static str,
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UuidLabels {
    gpu_uuid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

/// One claim's figures on one GPU, as the node monitor measured them.
#[derive(Clone, Copy, Debug)]
pub struct ClaimGpuFigures<'a> {
    /// The claim's namespace.
    pub namespace: &'a str,
    /// The claim's name.
    pub claim: &'a str,
    /// The GPU.
    pub gpu_uuid: &'a str,
    /// Device memory its processes hold.
    pub used_memory: u64,
    /// Device memory granted.
    pub granted_memory: u64,
    /// SM utilisation in percent.
    pub sm_percent: u32,
    /// Its processes on the GPU.
    pub processes: usize,
}

/// One container's figures on one GPU, as the node monitor measured them.
#[derive(Clone, Debug)]
pub struct ContainerFigures<'a> {
    /// The pod's namespace (the claim's).
    pub namespace: &'a str,
    /// The pod.
    pub pod: &'a str,
    /// The container's name (empty: not known).
    pub container: String,
    /// The claim.
    pub claim: &'a str,
    /// The GPU.
    pub gpu_uuid: &'a str,
    /// The GPU's position among the claim's GPUs.
    pub gpu_position: usize,
    /// Device memory its processes hold.
    pub used_memory: u64,
    /// Device memory granted to the claim on the GPU.
    pub granted_memory: u64,
    /// SM utilisation in percent.
    pub sm_percent: u32,
    /// Its processes on the GPU.
    pub processes: usize,
}

/// The node monitor's metrics (see the module documentation).
#[derive(Default)]
struct MonitorFamilies {
    used_memory: Family<ClaimGpuLabels, Gauge>,
    granted_memory: Family<ClaimGpuLabels, Gauge>,
    sm_ratio: Family<ClaimGpuLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    processes: Family<ClaimGpuLabels, Gauge>,
    over_quota: Family<OverQuotaLabels, Counter>,
    kills: Counter,
    unattributed: Family<UuidLabels, Gauge>,
    errors: Family<CauseLabels, Counter>,
    status_writes: Family<ResultLabels, Counter>,
    gpu_used_memory: Family<UuidLabels, Gauge>,
    gpu_sm_ratio: Family<UuidLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    gpu_processes: Family<UuidLabels, Gauge>,
    claim_info: Family<ClaimPodLabels, Gauge>,
    refusals: Family<ClaimGpuLabels, Counter>,
    throttled: Family<ClaimGpuLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    managed: Family<ClaimGpuLabels, Gauge>,
    container_used_memory: Family<ContainerLabels, Gauge>,
    container_sm_ratio: Family<ContainerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    container_processes: Family<ContainerLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The plugin's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: Family<OperationLabels, Histogram, fn() -> Histogram>,
    phases: Family<PhaseLabels, Histogram, fn() -> Histogram>,
    errors: Family<ErrorLabels, Counter>,
    prepared_claims: Gauge,
    granted_memory: Family<GpuLabels, Gauge>,
    granted_cores: Family<GpuLabels, Gauge>,
    shares: Family<GpuLabels, Gauge>,
    gpu_memory: Family<GpuIndexLabels, Gauge>,
    gpu_oversubscribe_ratio: Family<GpuLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    gpu_healthy: Family<GpuIndexLabels, Gauge>,
    health_transitions: Family<TransitionLabels, Counter>,
    claim_reads: Family<ClaimReadLabels, Counter>,
    claim_cache_claims: Gauge,
    monitor: MonitorFamilies,
    monitor_pass: Histogram,
    /// HAMi's families (off unless [`Metrics::enable_hami`]), in a registry without prefix.
    hami: std::sync::Arc<hami::Hami>,
    hami_registry: Registry,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `fgpu_kubelet_plugin` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("fgpu_kubelet_plugin");
        let m = Self {
            requests: Family::default(),
            durations: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            phases: Family::new_with_constructor(phase_histogram as fn() -> Histogram),
            errors: Family::default(),
            prepared_claims: Gauge::default(),
            granted_memory: Family::default(),
            granted_cores: Family::default(),
            shares: Family::default(),
            gpu_memory: Family::default(),
            gpu_oversubscribe_ratio: Family::default(),
            gpu_healthy: Family::default(),
            health_transitions: Family::default(),
            claim_reads: Family::default(),
            claim_cache_claims: Gauge::default(),
            monitor: MonitorFamilies::default(),
            monitor_pass: phase_histogram(),
            registry: Registry::default(),
            hami: std::sync::Arc::default(),
            hami_registry: Registry::default(),
        };
        registry.register(
            "requests",
            "Claims prepared or unprepared, by result",
            m.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to prepare or unprepare one claim",
            m.durations.clone(),
        );
        registry.register(
            "prepare_phase_duration_seconds",
            "Time spent in each step of a prepare",
            m.phases.clone(),
        );
        registry.register(
            "errors",
            "Failed prepares and unprepares by reason",
            m.errors.clone(),
        );
        registry.register(
            "prepared_claims",
            "Claims prepared on this node",
            m.prepared_claims.clone(),
        );
        registry.register(
            "gpu_granted_memory_bytes",
            "Memory granted on the GPU by prepared claims",
            m.granted_memory.clone(),
        );
        registry.register(
            "gpu_granted_cores",
            "Cores (percent of SMs) granted on the GPU by prepared claims",
            m.granted_cores.clone(),
        );
        registry.register(
            "gpu_shares",
            "Prepared claim devices (shares) on the GPU",
            m.shares.clone(),
        );
        registry.register(
            "gpu_memory_bytes",
            "Device memory of the GPU",
            m.gpu_memory.clone(),
        );
        registry.register(
            "gpu_oversubscribe_ratio",
            "The research tier's oversubscription ratio in force on the GPU: granted memory per byte of device memory (1: off the tier)",
            m.gpu_oversubscribe_ratio.clone(),
        );
        registry.register(
            "gpu_healthy",
            "1 while the GPU is healthy, 0 while it is not (as the health monitor concluded)",
            m.gpu_healthy.clone(),
        );
        registry.register(
            "gpu_health_transitions",
            "Changes of a GPU's health condition, by the condition it changed to",
            m.health_transitions.clone(),
        );
        registry.register(
            "claim_reads",
            "Where prepares read their claim: the claim cache, or the API server and why",
            m.claim_reads.clone(),
        );
        registry.register(
            "claim_cache_claims",
            "Allocated claims of this node held by the claim cache",
            m.claim_cache_claims.clone(),
        );
        let mon = &m.monitor;
        registry.register(
            "claim_used_memory_bytes",
            "Device memory the claim's processes hold on the GPU, as the driver reports it",
            mon.used_memory.clone(),
        );
        registry.register(
            "claim_granted_memory_bytes",
            "Device memory granted to the claim on the GPU",
            mon.granted_memory.clone(),
        );
        registry.register(
            "claim_sm_utilization_ratio",
            "SM utilisation of the claim's processes on the GPU over the last monitor pass (0-1)",
            mon.sm_ratio.clone(),
        );
        registry.register(
            "claim_processes",
            "The claim's processes on the GPU",
            mon.processes.clone(),
        );
        registry.register(
            "over_quota",
            "Claims found over their memory or compute quota by the node monitor, per report",
            mon.over_quota.clone(),
        );
        registry.register(
            "backstop_kills",
            "Processes killed by the node monitor (--over-quota=kill)",
            mon.kills.clone(),
        );
        registry.register(
            "gpu_unattributed_processes",
            "Processes on the GPU that belong to no prepared claim of this node",
            mon.unattributed.clone(),
        );
        registry.register(
            "monitor_errors",
            "Node monitor failures by cause",
            mon.errors.clone(),
        );
        registry.register(
            "gpu_used_memory_bytes",
            "Device memory all processes on the GPU hold (claims' or not), as the driver reports it",
            mon.gpu_used_memory.clone(),
        );
        registry.register(
            "gpu_sm_utilization_ratio",
            "SM utilisation of all processes on the GPU over the last monitor pass (0-1)",
            mon.gpu_sm_ratio.clone(),
        );
        registry.register(
            "gpu_processes",
            "Compute processes on the GPU",
            mon.gpu_processes.clone(),
        );
        registry.register(
            "claim_allocation_refusals",
            "Device memory allocations the shim refused past the claim's grant (counted by the shim in the claim's account; informational)",
            mon.refusals.clone(),
        );
        registry.register(
            "claim_managed_memory_bytes",
            "Bytes of the claim's memory on the GPU that are managed memory, which may live in host memory (research tier; counted by the shim in the claim's account; informational)",
            mon.managed.clone(),
        );
        registry.register(
            "claim_throttled_seconds",
            "Wall time the claim's kernel launches waited for its core quota (counted by the shim in the claim's account; informational)",
            mon.throttled.clone(),
        );
        registry.register(
            "claim_info",
            "1 per pod a prepared claim serves on a GPU: the device to pod mapping",
            mon.claim_info.clone(),
        );
        registry.register(
            "claim_status_writes",
            "Writes of ResourceClaim status.devices by the node monitor, by result (ok, error, dropped)",
            mon.status_writes.clone(),
        );
        registry.register(
            "monitor_pass_duration_seconds",
            "Time of one node monitor pass",
            m.monitor_pass.clone(),
        );
        registry.register(
            "container_used_memory_bytes",
            "Device memory a container's processes hold on the GPU, as the driver reports it",
            mon.container_used_memory.clone(),
        );
        registry.register(
            "container_sm_utilization_ratio",
            "SM utilisation of a container's processes on the GPU over the last monitor pass (0-1)",
            mon.container_sm_ratio.clone(),
        );
        registry.register(
            "container_processes",
            "A container's compute processes on the GPU",
            mon.container_processes.clone(),
        );
        let mut hami_registry = Registry::default();
        hami_registry.register_collector(Box::new(m.hami.clone()));
        Self {
            registry,
            hami_registry,
            ..m
        }
    }

    /// Adds HAMi's node families (`--hami-metrics`), labelled with node `node`.
    pub fn enable_hami(&self, node: &str) {
        self.hami.enable(node);
    }

    /// Replaces the per-container gauges with one monitor pass's figures.
    pub fn set_container_usage(&self, rows: &[ContainerFigures<'_>]) {
        let mon = &self.monitor;
        mon.container_used_memory.clear();
        mon.container_sm_ratio.clear();
        mon.container_processes.clear();
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for r in rows {
            let l = ContainerLabels {
                namespace: r.namespace.to_owned(),
                pod: r.pod.to_owned(),
                container: r.container.clone(),
                claim: r.claim.to_owned(),
                gpu_uuid: r.gpu_uuid.to_owned(),
            };
            mon.container_used_memory
                .get_or_create(&l)
                .set(int(r.used_memory));
            mon.container_sm_ratio
                .get_or_create(&l)
                .set(f64::from(r.sm_percent.min(100)) / 100.0);
            mon.container_processes
                .get_or_create(&l)
                .set(int(r.processes as u64));
        }
        // HAMi's per-container families name a container; rows without a name are left out.
        self.hami.set_containers(
            rows.iter()
                .filter(|r| !r.container.is_empty())
                .map(|r| hami::ContainerGpu {
                    namespace: r.namespace.to_owned(),
                    pod: r.pod.to_owned(),
                    container: r.container.clone(),
                    vdevice_index: r.gpu_position,
                    gpu_uuid: r.gpu_uuid.to_owned(),
                    used_memory: r.used_memory,
                    limit: r.granted_memory,
                    sm_percent: r.sm_percent,
                })
                .collect(),
        );
    }

    /// Replaces the per-claim gauges with one monitor pass's figures, and the per-GPU
    /// count of processes of no claim.
    pub fn set_claim_usage<'a>(
        &self,
        rows: impl IntoIterator<Item = ClaimGpuFigures<'a>>,
        unattributed: &BTreeMap<String, u32>,
    ) {
        let mon = &self.monitor;
        mon.used_memory.clear();
        mon.granted_memory.clear();
        mon.sm_ratio.clear();
        mon.processes.clear();
        mon.unattributed.clear();
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for r in rows {
            let l = ClaimGpuLabels {
                namespace: r.namespace.to_owned(),
                claim: r.claim.to_owned(),
                gpu_uuid: r.gpu_uuid.to_owned(),
            };
            mon.used_memory.get_or_create(&l).set(int(r.used_memory));
            mon.granted_memory
                .get_or_create(&l)
                .set(int(r.granted_memory));
            mon.sm_ratio
                .get_or_create(&l)
                .set(f64::from(r.sm_percent) / 100.0);
            mon.processes.get_or_create(&l).set(int(r.processes as u64));
        }
        for (gpu, n) in unattributed {
            mon.unattributed
                .get_or_create(&UuidLabels {
                    gpu_uuid: gpu.clone(),
                })
                .set(i64::from(*n));
        }
    }

    /// Replaces the per-GPU usage gauges with one monitor pass's figures (GPUs that could
    /// not be read are left out).
    pub fn set_gpu_usage(&self, gpus: &[fgpu_driver::backend::GpuUsage]) {
        let mon = &self.monitor;
        mon.gpu_used_memory.clear();
        mon.gpu_sm_ratio.clear();
        mon.gpu_processes.clear();
        self.hami
            .set_usage(gpus.iter().filter(|g| g.error.is_none()).map(|g| {
                let used: u64 = g.processes.iter().filter_map(|p| p.used_memory).sum();
                let sm = g
                    .sm_error
                    .is_none()
                    .then(|| g.processes.iter().filter_map(|p| p.sm_percent).sum());
                (g.uuid.clone(), used, sm)
            }));
        for g in gpus.iter().filter(|g| g.error.is_none()) {
            let l = UuidLabels {
                gpu_uuid: g.uuid.clone(),
            };
            let used: u64 = g.processes.iter().filter_map(|p| p.used_memory).sum();
            mon.gpu_used_memory
                .get_or_create(&l)
                .set(i64::try_from(used).unwrap_or(i64::MAX));
            if g.sm_error.is_none() {
                let sm: u32 = g.processes.iter().filter_map(|p| p.sm_percent).sum();
                mon.gpu_sm_ratio
                    .get_or_create(&l)
                    .set(f64::from(sm.min(100)) / 100.0);
            }
            mon.gpu_processes
                .get_or_create(&l)
                .set(i64::try_from(g.processes.len()).unwrap_or(i64::MAX));
        }
    }

    /// Sets the shim's figures per claim and GPU: (namespace, claim, GPU UUID, refusals,
    /// throttled ns, managed bytes) per row; refusals and throttled ns are totals that only
    /// grow (`monitor::accounts::Counters`), managed bytes a gauge.
    pub fn set_shim_counters<'a>(
        &self,
        rows: impl IntoIterator<Item = (&'a str, &'a str, &'a str, u64, u64, u64)>,
    ) {
        let mon = &self.monitor;
        mon.refusals.clear();
        mon.throttled.clear();
        mon.managed.clear();
        for (namespace, claim, gpu_uuid, refusals, throttled_ns, managed) in rows {
            let l = ClaimGpuLabels {
                namespace: namespace.to_owned(),
                claim: claim.to_owned(),
                gpu_uuid: gpu_uuid.to_owned(),
            };
            mon.refusals.get_or_create(&l).inc_by(refusals);
            mon.managed
                .get_or_create(&l)
                .set(i64::try_from(managed).unwrap_or(i64::MAX));
            mon.throttled
                .get_or_create(&l)
                .inc_by(throttled_ns as f64 / 1e9);
        }
    }

    /// Replaces the device to pod mapping: (namespace, claim, GPU UUID, pod) per row.
    pub fn set_claim_pods<'a>(
        &self,
        rows: impl IntoIterator<Item = (&'a str, &'a str, &'a str, &'a str)>,
    ) {
        let info = &self.monitor.claim_info;
        info.clear();
        for (namespace, claim, gpu_uuid, pod) in rows {
            info.get_or_create(&ClaimPodLabels {
                namespace: namespace.to_owned(),
                claim: claim.to_owned(),
                gpu_uuid: gpu_uuid.to_owned(),
                pod: pod.to_owned(),
            })
            .set(1);
        }
    }

    /// Sets the per-GPU memory and health gauges from the node's inventory.
    pub fn set_gpus(&self, inventory: &fgpu_driver::device::NodeInventory) {
        self.gpu_memory.clear();
        self.gpu_healthy.clear();
        self.hami.set_inventory(
            inventory
                .gpus
                .iter()
                .map(|g| (g.uuid.clone(), g.index, g.product_name.clone())),
        );
        for g in &inventory.gpus {
            let l = GpuIndexLabels {
                gpu_uuid: g.uuid.clone(),
                gpu_index: g.index.to_string(),
            };
            self.gpu_memory
                .get_or_create(&l)
                .set(i64::try_from(g.memory_bytes).unwrap_or(i64::MAX));
            self.gpu_healthy
                .get_or_create(&l)
                .set(i64::from(g.health.is_healthy()));
        }
    }

    /// Sets the research tier's ratio in force per GPU (by UUID; every GPU the tier keeper
    /// knows, 1 off the tier).
    pub fn set_gpu_tiers(&self, tiers: &BTreeMap<String, fgpu_driver::device::TierRatio>) {
        self.gpu_oversubscribe_ratio.clear();
        for (uuid, ratio) in tiers {
            self.gpu_oversubscribe_ratio
                .get_or_create(&GpuLabels {
                    gpu_uuid: uuid.clone(),
                })
                .set(f64::from(ratio.thousandths()) / 1000.0);
        }
    }

    /// Counts one change of a GPU's health condition to `to` (`healthy`, `degraded`,
    /// `fatal`).
    pub fn observe_health_transition(&self, gpu_uuid: &str, to: &'static str) {
        self.health_transitions
            .get_or_create(&TransitionLabels {
                gpu_uuid: gpu_uuid.to_owned(),
                to,
            })
            .inc();
    }

    /// Counts one backstop report.
    pub fn observe_over_quota(&self, kind: &'static str, action: &'static str) {
        self.monitor
            .over_quota
            .get_or_create(&OverQuotaLabels { kind, action })
            .inc();
    }

    /// Counts one process killed by the backstop.
    pub fn observe_kill(&self) {
        self.monitor.kills.inc();
    }

    /// Counts one monitor failure.
    pub fn observe_monitor_error(&self, cause: &'static str) {
        self.monitor
            .errors
            .get_or_create(&CauseLabels { cause })
            .inc();
    }

    /// Counts one write of a claim's `status.devices` (`ok`, `error`, or `dropped`: the API
    /// server did not keep the field).
    pub fn observe_status_write(&self, result: &'static str) {
        self.monitor
            .status_writes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Records the time of one monitor pass.
    pub fn observe_monitor_pass(&self, took: Duration) {
        self.monitor_pass.observe(took.as_secs_f64());
    }

    /// Records one claim's operation: its outcome (an error reason, or `None`) and time.
    pub fn observe(
        &self,
        operation: Operation,
        error_reason: Option<&'static str>,
        took: Duration,
    ) {
        let result = if error_reason.is_some() {
            "error"
        } else {
            "ok"
        };
        self.requests
            .get_or_create(&RequestLabels { operation, result })
            .inc();
        self.durations
            .get_or_create(&OperationLabels { operation })
            .observe(took.as_secs_f64());
        if let Some(reason) = error_reason {
            self.errors
                .get_or_create(&ErrorLabels { operation, reason })
                .inc();
        }
    }

    /// Records the time one step of a prepare took.
    pub fn observe_phase(&self, phase: Phase, took: Duration) {
        self.phases
            .get_or_create(&PhaseLabels { phase })
            .observe(took.as_secs_f64());
    }

    /// Records where one prepare read its claim.
    pub fn observe_claim_read(&self, read: ClaimRead) {
        self.claim_reads
            .get_or_create(&ClaimReadLabels { read })
            .inc();
    }

    /// The gauge of claims in the claim cache (a handle: the cache's watch sets it).
    pub fn claim_cache_size(&self) -> Gauge {
        self.claim_cache_claims.clone()
    }

    /// Recomputes the claim and per-GPU gauges from the checkpoint's claims.
    pub fn set_claims(&self, claims: &BTreeMap<String, ClaimRecord>) {
        let completed: Vec<&ClaimRecord> = claims
            .values()
            .filter(|c| c.state == PrepareState::PrepareCompleted)
            .collect();
        self.prepared_claims
            .set(i64::try_from(completed.len()).unwrap_or(i64::MAX));
        let mut per_gpu: BTreeMap<&str, (u64, u64, i64)> = BTreeMap::new();
        for d in completed.iter().flat_map(|c| &c.devices) {
            let e = per_gpu.entry(&d.gpu_uuid).or_default();
            e.0 = e.0.saturating_add(d.memory_bytes);
            e.1 += u64::from(d.cores);
            e.2 += 1;
        }
        self.granted_memory.clear();
        self.granted_cores.clear();
        self.shares.clear();
        for (gpu, (memory, cores, shares)) in per_gpu {
            let labels = GpuLabels {
                gpu_uuid: gpu.to_owned(),
            };
            self.shares.get_or_create(&labels).set(shares);
            self.granted_memory
                .get_or_create(&labels)
                .set(i64::try_from(memory).unwrap_or(i64::MAX));
            self.granted_cores
                .get_or_create(&labels)
                .set(i64::try_from(cores).unwrap_or(i64::MAX));
        }
    }

    /// The metrics in the Prometheus text format (OpenMetrics).
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        if self.hami.enabled() {
            let _ = encode_registry(&mut out, &self.hami_registry);
        }
        let _ = encode_eof(&mut out);
        out
    }
}

/// Content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = fgpu_plumbing::exposition::OPENMETRICS;

/// Serves `GET /metrics` (the OpenMetrics page `render` returns, or its text 0.0.4 form
/// for a reader that does not ask for OpenMetrics) and `GET /healthz` over HTTP/1 on
/// `listener` until `stop` turns true (the plumbing's server layer: body limit, timeouts).
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    render: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use axum::http::StatusCode;
    use axum::routing::get;
    use fgpu_plumbing::server::{Limits, body};

    let router = axum::Router::new()
        .route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| async move {
                let accept = headers
                    .get(axum::http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                let (content_type, page) = fgpu_plumbing::exposition::negotiate(accept, render());
                body(StatusCode::OK, content_type, page)
            }),
        )
        .route(
            "/healthz",
            get(|| async { body(StatusCode::OK, "text/plain", "ok\n") }),
        )
        .fallback(|| async { body(StatusCode::NOT_FOUND, "text/plain", "not found\n") });
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    fgpu_plumbing::server::serve(listener, router, Limits::PROBES, None, stopped).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::PreparedDevice;

    fn rec(state: PrepareState, gpu: &str, memory: u64, cores: u8) -> ClaimRecord {
        ClaimRecord {
            state,
            devices: vec![PreparedDevice {
                gpu_uuid: gpu.into(),
                memory_bytes: memory,
                cores,
                enforcement: Default::default(),
                ..PreparedDevice::default()
            }],
            ..ClaimRecord::default()
        }
    }

    #[test]
    fn counts_durations_errors_and_gauges() {
        let m = Metrics::new();
        m.observe(Operation::Prepare, None, Duration::from_millis(3));
        m.observe(
            Operation::Prepare,
            Some("not_found"),
            Duration::from_millis(1),
        );
        m.observe(Operation::Unprepare, None, Duration::from_millis(1));
        let claims = BTreeMap::from([
            (
                "a".to_owned(),
                rec(PrepareState::PrepareCompleted, "GPU-1", 10, 30),
            ),
            (
                "b".to_owned(),
                rec(PrepareState::PrepareCompleted, "GPU-1", 5, 20),
            ),
            (
                "c".to_owned(),
                rec(PrepareState::PrepareStarted, "GPU-2", 7, 7),
            ),
        ]);
        m.set_claims(&claims);
        let text = m.encode();
        for line in [
            "fgpu_kubelet_plugin_requests_total{operation=\"Prepare\",result=\"ok\"} 1",
            "fgpu_kubelet_plugin_requests_total{operation=\"Prepare\",result=\"error\"} 1",
            "fgpu_kubelet_plugin_requests_total{operation=\"Unprepare\",result=\"ok\"} 1",
            "fgpu_kubelet_plugin_errors_total{operation=\"Prepare\",reason=\"not_found\"} 1",
            "fgpu_kubelet_plugin_request_duration_seconds_count{operation=\"Prepare\"} 2",
            "fgpu_kubelet_plugin_prepared_claims 2",
            "fgpu_kubelet_plugin_gpu_granted_memory_bytes{gpu_uuid=\"GPU-1\"} 15",
            "fgpu_kubelet_plugin_gpu_granted_cores{gpu_uuid=\"GPU-1\"} 50",
            "fgpu_kubelet_plugin_gpu_shares{gpu_uuid=\"GPU-1\"} 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(!text.contains("GPU-2"), "started claims are not counted");
        // A GPU whose claims are gone disappears.
        m.set_claims(&BTreeMap::new());
        assert!(!m.encode().contains("GPU-1"));
    }

    #[test]
    fn per_gpu_inventory_usage_and_the_device_to_pod_map() {
        use fgpu_driver::backend::{GpuUsage, ProcessUsage};
        use fgpu_driver::device::{Health, NodeInventory};
        let m = Metrics::new();
        let mut inv = NodeInventory {
            node: "n".into(),
            gpus: vec![
                crate::edits::tests::gpu(0, "0000:01:00.0"),
                crate::edits::tests::gpu(1, "0000:02:00.0"),
            ],
        };
        inv.gpus[1].health = Health::Unhealthy {
            reason: "xid 79".into(),
        };
        m.set_gpus(&inv);
        let (u0, u1) = (inv.gpus[0].uuid.clone(), inv.gpus[1].uuid.clone());
        let proc_ = |pid, used, sm| ProcessUsage {
            pid,
            used_memory: used,
            sm_percent: sm,
        };
        m.set_gpu_usage(&[
            GpuUsage {
                uuid: u0.clone(),
                processes: vec![
                    proc_(1, Some(3 << 30), Some(60)),
                    proc_(2, Some(1 << 30), Some(50)),
                    proc_(3, None, None),
                ],
                error: None,
                sm_error: None,
            },
            GpuUsage::failed(u1.clone(), "gone"),
        ]);
        m.set_claim_pods([
            ("ml", "c1", u0.as_str(), "p1"),
            ("ml", "c1", u0.as_str(), "p2"),
        ]);
        m.set_gpu_tiers(&BTreeMap::from([
            (u0.clone(), "1.5".parse().unwrap()),
            (u1.clone(), fgpu_driver::device::TierRatio::NONE),
        ]));
        m.set_shim_counters([("ml", "c1", u0.as_str(), 0, 0, 1u64 << 30)]);
        let text = m.encode();
        for line in [
            format!("fgpu_kubelet_plugin_gpu_oversubscribe_ratio{{gpu_uuid=\"{u0}\"}} 1.5"),
            format!("fgpu_kubelet_plugin_gpu_oversubscribe_ratio{{gpu_uuid=\"{u1}\"}} 1.0"),
            format!(
                "fgpu_kubelet_plugin_claim_managed_memory_bytes{{namespace=\"ml\",claim=\"c1\",gpu_uuid=\"{u0}\"}} {}",
                1u64 << 30
            ),
            format!(
                "fgpu_kubelet_plugin_gpu_memory_bytes{{gpu_uuid=\"{u0}\",gpu_index=\"0\"}} {}",
                80u64 << 30
            ),
            format!("fgpu_kubelet_plugin_gpu_healthy{{gpu_uuid=\"{u0}\",gpu_index=\"0\"}} 1"),
            format!("fgpu_kubelet_plugin_gpu_healthy{{gpu_uuid=\"{u1}\",gpu_index=\"1\"}} 0"),
            format!(
                "fgpu_kubelet_plugin_gpu_used_memory_bytes{{gpu_uuid=\"{u0}\"}} {}",
                4u64 << 30
            ),
            // Capped at 1: two processes' samples can sum past 100 through rounding.
            format!("fgpu_kubelet_plugin_gpu_sm_utilization_ratio{{gpu_uuid=\"{u0}\"}} 1.0"),
            format!("fgpu_kubelet_plugin_gpu_processes{{gpu_uuid=\"{u0}\"}} 3"),
            format!(
                "fgpu_kubelet_plugin_claim_info{{namespace=\"ml\",claim=\"c1\",gpu_uuid=\"{u0}\",pod=\"p2\"}} 1"
            ),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(
            !text.contains(&format!("gpu_processes{{gpu_uuid=\"{u1}\"}}")),
            "a GPU that could not be read has no usage series"
        );
        m.set_claim_pods([]);
        assert!(!m.encode().contains("claim_info{"));
    }

    #[tokio::test]
    async fn serves_metrics_over_http() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let m = std::sync::Arc::new(Metrics::new());
        m.observe(Operation::Prepare, None, Duration::from_millis(1));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let render = {
            let m = m.clone();
            std::sync::Arc::new(move || m.encode())
        };
        let server = tokio::spawn(serve_http(listener, render, stopped));
        let get_with = |path: &'static str, accept: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let req =
                format!("GET {path} HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let get = |path: &'static str| get_with(path, "");
        // Prometheus asks for OpenMetrics and gets it.
        let resp = get_with(
            "/metrics",
            "Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n",
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
        assert!(resp.contains(CONTENT_TYPE), "{resp}");
        assert!(resp.contains("# EOF"), "{resp}");
        // Any other reader gets text 0.0.4.
        let resp = get("/metrics").await;
        assert!(resp.contains(fgpu_plumbing::exposition::TEXT), "{resp}");
        assert!(
            resp.contains("# TYPE fgpu_kubelet_plugin_requests_total counter"),
            "{resp}"
        );
        assert!(
            resp.contains(
                "fgpu_kubelet_plugin_requests_total{operation=\"Prepare\",result=\"ok\"} 1"
            ),
            "{resp}"
        );
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }
}
