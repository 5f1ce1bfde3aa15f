//! The node monitor: what every prepared claim really uses, seen from the host.
//!
//! Every `--monitor-period` the monitor asks the device backend what runs on each GPU
//! ([`DeviceBackend::usage`]: host PIDs, their device memory, their SM utilisation since
//! the last pass), maps each PID to its pod through `/proc/<pid>/cgroup`
//! ([`cgroup`]) and each pod to the claims it holds on that GPU ([`attribute`]: the
//! checkpoint says which GPUs and shares a claim holds; the claim's `status.reservedFor`,
//! from the claim cache, which pods it serves — on the legacy path the claim's UID is
//! `<pod uid>-<container>`). Then, per pass:
//!
//! * it writes each claim's utilisation feed for the shim's core limiter ([`feed`]);
//! * it refreshes the per-claim and per-container metrics ([`crate::metrics`]; container
//!   names from the kubelet's pod resources API, [`containers`]);
//! * it writes each claim's used figures into its `ResourceClaim.status.devices`, on
//!   change and at most once per `--claim-status-interval-seconds` ([`status`]);
//! * it hands the view to the backstop ([`backstop`]), which reports claims over their
//!   grant (a Warning Event on the pod, a metric, a log line) and, with
//!   `--over-quota=kill`, kills the processes holding the excess.
//!
//! Nothing here blocks a prepare or an unprepare: the monitor reads a copy of the
//! checkpoint's records and runs on its own task (the driver and `/proc` reads on the
//! blocking pool). Every failure — the driver, a process gone between two calls, a PID in
//! no pod, an Event the API server refuses — is logged once per cause, counted in
//! `monitor_errors_total`, and the pass goes on.

pub mod accounts;
pub mod attribute;
pub mod backstop;
pub mod cgroup;
pub mod containers;
pub mod feed;
pub mod lifecycle;
pub mod status;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fgpu_driver::backend::{DeviceBackend, GpuUsage};
use fgpu_plumbing::events::{self, EventType, Regarding, Reporter, Said};

use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};

use crate::checkpoint::{ClaimRecord, PrepareState};
use crate::metrics::Metrics;
use crate::slices::ApiVersion;
use attribute::{Attribution, ClaimView, GpuGrant, PodRef};
use backstop::{Backstop, BackstopConfig, Finding, Kind, OverQuotaAction};
use status::{StatusConfig, StatusWrite, StatusWriter};

/// The monitor's flags (in `serve` and `device-plugin`).
#[derive(Clone, Debug, clap::Args)]
pub struct MonitorArgs {
    /// Milliseconds between two monitor passes; 0 turns the node monitor off (no feed for
    /// the shim, no per-claim usage, no backstop).
    #[arg(
        long,
        default_value_t = 1000,
        value_name = "MS",
        env = "FGPU_MONITOR_PERIOD_MS"
    )]
    pub monitor_period_ms: u64,

    /// What the monitor does when a claim holds more device memory than its grant plus
    /// --over-quota-tolerance (the shim was bypassed): `report` (Warning Event on the pod,
    /// metric, log) or `kill` (the same, and SIGKILL of the claim's processes holding the
    /// excess, largest first; never another claim's).
    #[arg(long, value_enum, default_value_t = OverQuotaAction::Report, env = "FGPU_OVER_QUOTA")]
    pub over_quota: OverQuotaAction,

    /// Device memory a claim may hold above its grant before it counts as over quota: what
    /// the driver takes per process that the shim does not see (a Kubernetes quantity).
    #[arg(
        long,
        default_value = "256Mi",
        value_name = "QUANTITY",
        value_parser = crate::edits::parse_bytes,
        env = "FGPU_OVER_QUOTA_TOLERANCE"
    )]
    pub over_quota_tolerance: u64,

    /// Points of SM utilisation above a claim's core quota that count as compute over
    /// quota, when they last --compute-over-quota-seconds.
    #[arg(long, default_value_t = 15, value_name = "POINTS")]
    pub compute_over_quota_points: u32,

    /// Shortest time between two writes of one claim's `status.devices` (used memory, SM
    /// utilisation, the `WithinGrant` condition); a claim is written only when those change.
    /// 0: the plugin does not write claim status.
    #[arg(
        long,
        default_value_t = 30,
        value_name = "SECONDS",
        env = "FGPU_CLAIM_STATUS_INTERVAL_SECONDS"
    )]
    pub claim_status_interval_seconds: u64,

    /// Rewrite a claim's `status.devices` after this many seconds even when nothing it
    /// shows changed, so that its `sampledAt` stays fresh for the DRA controller's
    /// usage-aware scoring (`--usage-aware-weight`, `--usage-fresh-seconds`: set this below
    /// the freshness). 0 (the default): a steady claim is not rewritten. At least the
    /// interval; each claim then costs one write per refresh even when idle.
    #[arg(
        long,
        default_value_t = 0,
        value_name = "SECONDS",
        env = "FGPU_CLAIM_STATUS_REFRESH_SECONDS"
    )]
    pub claim_status_refresh_seconds: u64,

    /// Seconds compute must stay over quota before it is reported.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub compute_over_quota_seconds: u64,

    /// Seconds between two reports of a claim that stays over quota.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub over_quota_repeat_seconds: u64,

    /// With --backend fake: the fake driver's NVML library (libfgpu_fake_cuda.so), through
    /// which the monitor sees the fake GPUs' processes (give the plugin the same
    /// FAKE_CUDA_STATE as the containers, FAKE_CUDA_UUIDS with the profile's UUIDs and
    /// FAKE_CUDA_NVML_HOST=1). Without it the monitor has nothing to read on a fake node.
    #[arg(long, value_name = "FILE", env = "FGPU_FAKE_NVML_LIBRARY")]
    pub fake_nvml_library: Option<PathBuf>,

    /// Also export HAMi's node-monitor families (`hami_host_gpu_*`, `hami_vgpu_memory_*`,
    /// `hami_container_device_*`, with HAMi's names, labels and 0-100 utilisation), so that
    /// dashboards written for HAMi work unchanged. Needs the monitor.
    #[arg(long, env = "FGPU_HAMI_METRICS")]
    pub hami_metrics: bool,
}

impl MonitorArgs {
    /// The monitor's settings, `None` when it is off: `--monitor-period-ms 0`, or a fake
    /// node (`fake`) without the fake NVML library, where there is nothing to read (said in
    /// a log line).
    pub fn config_for(&self, node: &str, fake: bool) -> Option<MonitorConfig> {
        if self.monitor_period_ms == 0 {
            return None;
        }
        if fake && self.fake_nvml_library.is_none() {
            tracing::info!(
                "node monitor off: a fake node has no processes to read without --fake-nvml-library"
            );
            return None;
        }
        Some(MonitorConfig {
            node: node.to_owned(),
            period: Duration::from_millis(self.monitor_period_ms),
            proc_root: PathBuf::from("/proc"),
            hami_metrics: self.hami_metrics,
            claim_status_interval: (self.claim_status_interval_seconds > 0)
                .then(|| Duration::from_secs(self.claim_status_interval_seconds)),
            claim_status_refresh: (self.claim_status_refresh_seconds > 0).then(|| {
                Duration::from_secs(
                    self.claim_status_refresh_seconds
                        .max(self.claim_status_interval_seconds),
                )
            }),
            backstop: BackstopConfig {
                action: self.over_quota,
                memory_tolerance: self.over_quota_tolerance,
                compute_points: self.compute_over_quota_points,
                compute_window: Duration::from_secs(self.compute_over_quota_seconds),
                repeat: Duration::from_secs(self.over_quota_repeat_seconds.max(1)),
            },
        })
    }
}

/// The device backend of a daemon with a monitor: with `fake`, answering the monitor's
/// usage queries through the fake driver's NVML when `fake_nvml` names it.
pub fn backend(
    kind: fgpu_driver::backend::BackendKind,
    profile: Option<&Path>,
    node: &str,
    fake_nvml: Option<&Path>,
) -> Result<Box<dyn DeviceBackend>, fgpu_driver::backend::BackendError> {
    use fgpu_driver::backend::{BackendError, BackendKind, FakeBackend, build_backend};
    Ok(match (kind, fake_nvml) {
        (BackendKind::Fake, Some(lib)) => {
            let path = profile.ok_or(BackendError::NoProfile)?;
            Box::new(FakeBackend::open(path, Some(node))?.with_usage_reader(usage_library(lib)?))
        }
        (BackendKind::Fake, None) => build_backend(BackendKind::Fake, profile, Some(node))?,
        (BackendKind::Nvml, _) => build_backend(BackendKind::Nvml, None, None)?,
    })
}

/// The NVML library at `lib` as a usage reader (the fake driver's).
#[cfg(feature = "nvml")]
fn usage_library(
    lib: &Path,
) -> Result<Arc<dyn fgpu_driver::backend::UsageReader>, fgpu_driver::backend::BackendError> {
    Ok(Arc::new(fgpu_driver::backend::nvml::NvmlUsage::load(lib)?))
}

/// Without the `nvml` feature there is no NVML to load.
#[cfg(not(feature = "nvml"))]
fn usage_library(
    _lib: &Path,
) -> Result<Arc<dyn fgpu_driver::backend::UsageReader>, fgpu_driver::backend::BackendError> {
    Err(fgpu_driver::backend::BackendError::NotCompiled("nvml"))
}

/// The monitor's settings.
#[derive(Clone, Debug)]
pub struct MonitorConfig {
    /// This node (the Events' reporting instance).
    pub node: String,
    /// Time between passes.
    pub period: Duration,
    /// Where host processes are (`/proc`; the plugin runs in the host's PID namespace).
    pub proc_root: PathBuf,
    /// HAMi's families too (`--hami-metrics`).
    pub hami_metrics: bool,
    /// Shortest time between two status writes of one claim (`None`: no writes; the
    /// legacy path has no ResourceClaims and writes none either way).
    pub claim_status_interval: Option<Duration>,
    /// Rewrite an unchanged claim's status after this long (`None`: never).
    pub claim_status_refresh: Option<Duration>,
    /// The backstop.
    pub backstop: BackstopConfig,
}

/// Which pods a prepared claim serves.
#[derive(Clone)]
pub enum Consumers {
    /// DRA claims: `status.reservedFor`, from the claim cache.
    ReservedFor(Arc<crate::claim_cache::ClaimCache>),
    /// Legacy device-plugin claims, whose UID is `<pod uid>-<container>` and whose record
    /// names the pod's namespace and `<pod>/<container>`.
    PodUidPrefix,
    /// Unknown (no claim cache): usage is measured per GPU, nothing is attributed.
    Unknown,
}

impl Consumers {
    fn pods(&self, uid: &str, record: &ClaimRecord) -> Vec<PodRef> {
        match self {
            Self::ReservedFor(cache) => cache
                .reserved_pods(uid)
                .unwrap_or_default()
                .into_iter()
                .map(|(name, uid)| PodRef {
                    namespace: record.namespace.clone(),
                    name,
                    uid,
                })
                .collect(),
            Self::PodUidPrefix => {
                let (Some(pod_uid), Some((pod, _))) = (uid.get(..36), record.name.split_once('/'))
                else {
                    return Vec::new();
                };
                vec![PodRef {
                    namespace: record.namespace.clone(),
                    name: pod.to_owned(),
                    uid: pod_uid.to_owned(),
                }]
            }
            Self::Unknown => Vec::new(),
        }
    }
}

/// Per claim, GPU, pod and container (named by `name(claim, pod)`, `""` when not known):
/// the figures of its processes.
fn container_rows<'a>(
    claims: &'a [attribute::ClaimUsage],
    mut name: impl FnMut(&attribute::ClaimUsage, &str) -> String,
) -> Vec<crate::metrics::ContainerFigures<'a>> {
    let mut rows = Vec::new();
    for c in claims {
        for (position, g) in c.gpus.iter().enumerate() {
            // (pod, container) -> (used memory, SM percent, processes)
            let mut per: BTreeMap<(&str, String), (u64, u32, usize)> = BTreeMap::new();
            for p in &g.processes {
                let key = (p.pod.name.as_str(), name(c, &p.pod.name));
                let e = per.entry(key).or_default();
                e.0 = e.0.saturating_add(p.used_memory);
                e.1 = e.1.saturating_add(p.sm_percent.unwrap_or(0));
                e.2 += 1;
            }
            for ((pod, container), (used, sm, n)) in per {
                rows.push(crate::metrics::ContainerFigures {
                    namespace: &c.namespace,
                    pod,
                    container,
                    claim: &c.name,
                    gpu_uuid: &g.grant.gpu_uuid,
                    gpu_position: position,
                    used_memory: used,
                    granted_memory: g.grant.memory_bytes,
                    sm_percent: sm.min(100),
                    processes: n,
                });
            }
        }
    }
    rows
}

/// One claim's shim counters on one GPU, added up across the shim's restarts.
type ShimRow<'a> = (&'a attribute::ClaimUsage, &'a str, accounts::Raw);

/// Milliseconds the pass's sample covers: since the last sample (`since_us`), or one
/// period for the first.
fn window_ms(since_us: u64, now_us: u64, period: Duration) -> u64 {
    if since_us == 0 {
        period.as_millis() as u64
    } else {
        now_us.saturating_sub(since_us) / 1000
    }
}

/// The claim usage metrics' rows: one per claim and GPU.
fn claim_gpu_rows(
    claims: &[attribute::ClaimUsage],
) -> impl Iterator<Item = crate::metrics::ClaimGpuFigures<'_>> {
    claims.iter().flat_map(|c| {
        c.gpus.iter().map(move |g| crate::metrics::ClaimGpuFigures {
            namespace: &c.namespace,
            claim: &c.name,
            gpu_uuid: &g.grant.gpu_uuid,
            used_memory: g.used_memory(),
            granted_memory: g.grant.memory_bytes,
            sm_percent: g.sm_percent(),
            processes: g.processes.len(),
        })
    })
}

/// The pods each claim serves, by claim UID.
fn claim_pods(claims: &[ClaimView]) -> HashMap<String, Vec<PodRef>> {
    claims
        .iter()
        .map(|c| (c.uid.clone(), c.pods.clone()))
        .collect()
}

/// The shim's refusals by (claim UID, GPU UUID).
fn refusals(shim: &[ShimRow<'_>]) -> HashMap<(String, String), u64> {
    shim.iter()
        .map(|(c, gpu, t)| ((c.uid.clone(), (*gpu).to_owned()), t.refusals))
        .collect()
}

/// The shim counter metrics' rows: (namespace, claim, GPU, refusals, throttled ns).
fn shim_counter_rows<'a>(
    shim: &'a [ShimRow<'a>],
) -> impl Iterator<Item = (&'a str, &'a str, &'a str, u64, u64, u64)> {
    shim.iter().map(|(c, gpu, t)| {
        (
            c.namespace.as_str(),
            c.name.as_str(),
            *gpu,
            t.refusals,
            t.throttled_ns,
            t.managed,
        )
    })
}

/// The claim info metric's rows: (namespace, claim, GPU, pod) for each GPU and pod of each
/// claim.
fn claim_pod_rows(claims: &[ClaimView]) -> impl Iterator<Item = (&str, &str, &str, &str)> {
    claims.iter().flat_map(|c| {
        c.grants.iter().flat_map(move |g| {
            c.pods.iter().map(move |p| {
                (
                    c.namespace.as_str(),
                    c.name.as_str(),
                    g.gpu_uuid.as_str(),
                    p.name.as_str(),
                )
            })
        })
    })
}

/// The prepared claims as the monitor sees them, with their feed directories. Only
/// claims recorded `PrepareCompleted`; per GPU, the grants of its shares summed.
pub fn claim_views(
    records: &BTreeMap<String, ClaimRecord>,
    consumers: &Consumers,
) -> Vec<(ClaimView, Option<PathBuf>)> {
    records
        .iter()
        .filter(|(_, r)| r.state == PrepareState::PrepareCompleted && !r.devices.is_empty())
        .map(|(uid, r)| {
            let mut grants: Vec<GpuGrant> = Vec::new();
            for d in &r.devices {
                match grants.iter_mut().find(|g| g.gpu_uuid == d.gpu_uuid) {
                    Some(g) => {
                        g.memory_bytes = g.memory_bytes.saturating_add(d.memory_bytes);
                        g.cores = (g.cores + u32::from(d.cores)).min(100);
                    }
                    None => grants.push(GpuGrant {
                        gpu_uuid: d.gpu_uuid.clone(),
                        memory_bytes: d.memory_bytes,
                        cores: u32::from(d.cores),
                    }),
                }
            }
            let feed_dir = (!r.claim_dir.as_os_str().is_empty())
                .then(|| r.claim_dir.join(fgpu_api::names::contract::FEED_DIR));
            (
                ClaimView {
                    uid: uid.clone(),
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                    pods: consumers.pods(uid, r),
                    grants,
                },
                feed_dir,
            )
        })
        .collect()
}

/// What the monitor reads from the plugin: a copy of the checkpoint's records, and the
/// metrics it sets.
pub trait Host: Send + Sync + 'static {
    /// The checkpoint's claims.
    fn records(&self) -> BTreeMap<String, ClaimRecord>;
    /// The plugin's metrics.
    fn metrics(&self) -> &Metrics;
}

impl<S: crate::prepare::ClaimSource + 'static> Host for crate::prepare::Plugin<S> {
    fn records(&self) -> BTreeMap<String, ClaimRecord> {
        self.claims()
    }
    fn metrics(&self) -> &Metrics {
        crate::prepare::Plugin::metrics(self)
    }
}

/// The last pass's per-claim view, for readers in the plugin (tests, a future status
/// writer).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// When it was sampled (ms since the epoch).
    pub sampled_unix_ms: u64,
    /// The view.
    pub usage: Attribution,
}

/// A running monitor's shared view.
#[derive(Clone, Default)]
pub struct Latest(Arc<Mutex<Option<Arc<Snapshot>>>>);

impl Latest {
    /// The last pass's view, if a pass completed.
    pub fn get(&self) -> Option<Arc<Snapshot>> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
    fn set(&self, s: Snapshot) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(s));
    }
}

/// Logs each cause once (then only counts it).
#[derive(Default)]
struct Once(HashSet<String>);

impl Once {
    fn first(&mut self, cause: &str) -> bool {
        self.0.len() < 256 && self.0.insert(cause.to_owned())
    }
}

/// The monitor: one pass per period until `stop` turns true.
pub struct Monitor {
    cfg: MonitorConfig,
    backend: Arc<dyn DeviceBackend>,
    host: Arc<dyn Host>,
    consumers: Consumers,
    client: Option<kube::Client>,
    backstop: Backstop,
    latest: Latest,
    logged: Once,
    last_sample_us: u64,
    /// The claim status writer and the `resource.k8s.io` version it writes
    /// ([`Monitor::with_claim_status`]).
    status: Option<(StatusWriter, ApiVersion)>,
    /// The writes the last pass found due.
    status_due: Vec<StatusWrite>,
    /// The shim's refusal and throttling counters, per claim and GPU.
    accounts: accounts::Counters,
    /// The `resource.k8s.io` version of the claims (DRA path only: Events about claims).
    api: Option<ApiVersion>,
    /// What happened between passes, and what the last pass found.
    lifecycle: lifecycle::Lifecycle,
    lifecycle_due: Vec<lifecycle::Happening>,
    /// The kubelet's pod resources socket (DRA path: container names).
    pod_resources: Option<PathBuf>,
    /// Which containers of each pod use which claim.
    containers: containers::ClaimContainers,
}

impl Monitor {
    /// A monitor over `backend` for the claims `host` records. `client`: where Events go
    /// (`None`: only logs and metrics).
    pub fn new(
        cfg: MonitorConfig,
        backend: Arc<dyn DeviceBackend>,
        host: Arc<dyn Host>,
        consumers: Consumers,
        client: Option<kube::Client>,
    ) -> Self {
        let backstop = Backstop::new(cfg.backstop.clone());
        if cfg.hami_metrics {
            host.metrics().enable_hami(&cfg.node);
        }
        Self {
            cfg,
            backend,
            host,
            consumers,
            client,
            backstop,
            latest: Latest::default(),
            logged: Once::default(),
            last_sample_us: 0,
            status: None,
            status_due: Vec::new(),
            accounts: accounts::Counters::default(),
            api: None,
            lifecycle: lifecycle::Lifecycle::default(),
            lifecycle_due: Vec::new(),
            pod_resources: None,
            containers: containers::ClaimContainers::default(),
        }
    }

    /// Names the containers of DRA claims from the kubelet's pod resources API at `socket`.
    pub fn with_pod_resources(mut self, socket: PathBuf) -> Self {
        self.pod_resources = Some(socket);
        self
    }

    /// Reads the kubelet's pod resources list when it is due.
    async fn refresh_containers(&mut self) {
        let Some(socket) = self.pod_resources.clone() else {
            return;
        };
        let now = Instant::now();
        if !self.containers.due(now) {
            return;
        }
        match crate::podresources::list_all(&socket).await {
            Ok(resp) => self.containers.replace(&resp, now),
            Err(e) => {
                self.containers.failed(now);
                self.failed("pod-resources", &e.to_string());
            }
        }
    }

    /// Writes each claim's figures into its `status.devices` as driver `driver`, through
    /// `resource.k8s.io` at `api` (when the config's interval is set).
    pub fn with_claim_status(mut self, driver: &str, api: ApiVersion) -> Self {
        self.api = Some(api);
        self.status = self.cfg.claim_status_interval.map(|interval| {
            let cfg = StatusConfig {
                driver: driver.to_owned(),
                interval,
                refresh: self.cfg.claim_status_refresh,
                tolerance: self.cfg.backstop.memory_tolerance,
            };
            (StatusWriter::new(cfg), api)
        });
        self
    }

    /// The shared view of the last pass.
    pub fn latest(&self) -> Latest {
        self.latest.clone()
    }

    /// Runs passes until `stop` turns true.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        tracing::info!(
            period_ms = self.cfg.period.as_millis() as u64,
            over_quota = self.cfg.backstop.action.as_str(),
            backend = self.backend.name(),
            "node monitor started"
        );
        let mut tick = tokio::time::interval(self.cfg.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut me = self;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            me.refresh_containers().await;
            // The pass reads the driver and /proc: on the blocking pool.
            let (back, findings) = match tokio::task::spawn_blocking(move || {
                let findings = me.pass();
                (me, findings)
            })
            .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "node monitor pass panicked; the monitor stops");
                    return;
                }
            };
            me = back;
            for f in &findings {
                me.publish(f).await;
            }
            me.write_status().await;
            me.tell_lifecycle().await;
        }
    }

    /// One pass: sample, attribute, feeds, metrics, backstop (kills included). Returns the
    /// findings, whose Events the caller sends.
    pub fn pass(&mut self) -> Vec<Finding> {
        let started = Instant::now();
        let now_us = unix_us();
        let since = self.last_sample_us;
        let Some(gpus) = self.sample(since) else {
            return Vec::new();
        };
        self.last_sample_us = now_us;
        let records = self.host.records();
        let (claims, feed_dirs): (Vec<ClaimView>, Vec<Option<PathBuf>>) =
            claim_views(&records, &self.consumers).into_iter().unzip();
        let usage = self.attribute_usage(&gpus, &claims);
        let sampled_ms = now_us / 1000;
        let window = window_ms(since, now_us, self.cfg.period);
        self.write_feeds(&usage.claims, &feed_dirs, sampled_ms, window);
        self.set_usage_metrics(&gpus, &usage);
        let shim_rows = self.shim_counters(&records, &usage.claims);
        self.step_lifecycle(&usage, &claims, &shim_rows);
        let metrics = self.host.metrics();
        metrics.set_shim_counters(shim_counter_rows(&shim_rows));
        metrics.set_claim_pods(claim_pod_rows(&claims));
        let findings = self.enforce(&usage);
        self.find_status_due(&records, &usage.claims);
        self.latest.set(Snapshot {
            sampled_unix_ms: sampled_ms,
            usage,
        });
        self.host.metrics().observe_monitor_pass(started.elapsed());
        findings
    }

    /// Asks the driver what runs on each GPU since `since_us` and notes the GPUs it could
    /// not read fully. `None` when the driver failed as a whole (noted too).
    fn sample(&mut self, since_us: u64) -> Option<Vec<GpuUsage>> {
        let gpus = match self.backend.usage(since_us) {
            Ok(g) => g,
            Err(e) => {
                self.failed("usage", &e.to_string());
                return None;
            }
        };
        for g in &gpus {
            if let Some(e) = &g.error {
                self.failed("gpu", &format!("GPU {}: {e}", g.uuid));
            }
            if let Some(e) = &g.sm_error {
                self.failed("utilization", &format!("GPU {}: {e}", g.uuid));
            }
        }
        Some(gpus)
    }

    /// Attributes the sampled processes to `claims`, reading each PID's cgroup once.
    fn attribute_usage(&self, gpus: &[GpuUsage], claims: &[ClaimView]) -> Attribution {
        let proc_root = &self.cfg.proc_root;
        let mut cache = HashMap::new();
        attribute::attribute(gpus, claims, |pid| {
            cache
                .entry(pid)
                .or_insert_with(|| cgroup::of_pid(proc_root, pid))
                .clone()
        })
    }

    /// Writes each claim's utilisation feed (`feed_dirs` in the order of `claims`; a claim
    /// without one, or whose directory is gone, is skipped).
    fn write_feeds(
        &mut self,
        claims: &[attribute::ClaimUsage],
        feed_dirs: &[Option<PathBuf>],
        sampled_ms: u64,
        window_ms: u64,
    ) {
        for (c, dir) in claims.iter().zip(feed_dirs) {
            let Some(dir) = dir else { continue };
            if !dir.is_dir() {
                continue; // unprepared meanwhile
            }
            if let Err(e) = feed::write(dir, &feed::render(c, sampled_ms, window_ms)) {
                self.failed("feed", &format!("{}: {e}", dir.display()));
            }
        }
    }

    /// Sets the per-claim, per-GPU and per-container usage metrics.
    fn set_usage_metrics(&mut self, gpus: &[GpuUsage], usage: &Attribution) {
        let metrics = self.host.metrics();
        metrics.set_claim_usage(claim_gpu_rows(&usage.claims), &usage.unattributed);
        metrics.set_gpu_usage(gpus);
        let legacy = matches!(self.consumers, Consumers::PodUidPrefix);
        let known = &mut self.containers;
        metrics.set_container_usage(&container_rows(&usage.claims, |c, pod| {
            let name = if legacy {
                containers::of_legacy_claim(&c.name)
            } else {
                known.container(&c.namespace, pod, &c.name)
            };
            name.unwrap_or_default().to_owned()
        }));
    }

    /// Reads the shim's counters of each claim (from its accounts) and adds them up across
    /// the shim's restarts; forgets the claims no longer prepared.
    fn shim_counters<'a>(
        &mut self,
        records: &BTreeMap<String, ClaimRecord>,
        claims: &'a [attribute::ClaimUsage],
    ) -> Vec<ShimRow<'a>> {
        let mut rows = Vec::new();
        for c in claims {
            let Some(r) = records.get(&c.uid) else {
                continue;
            };
            if r.claim_dir.as_os_str().is_empty() {
                continue;
            }
            let state = r.claim_dir.join("state");
            let raw = accounts::read(
                &state.join(fgpu_api::names::contract::MEMORY_ACCOUNT),
                &state.join(fgpu_api::names::contract::CORE_ACCOUNT),
            );
            for g in &c.gpus {
                let now = raw.get(&g.grant.gpu_uuid).copied().unwrap_or_default();
                let total = self.accounts.update(&c.uid, &g.grant.gpu_uuid, now);
                rows.push((c, g.grant.gpu_uuid.as_str(), total));
            }
        }
        self.accounts
            .retain(&claims.iter().map(|c| c.uid.as_str()).collect());
        rows
    }

    /// Steps the claims' lifecycle and logs what happened; the caller tells it.
    fn step_lifecycle(&mut self, usage: &Attribution, claims: &[ClaimView], shim: &[ShimRow<'_>]) {
        self.lifecycle_due = self.lifecycle.step(
            usage,
            &claim_pods(claims),
            &refusals(shim),
            Instant::now(),
            self.cfg.backstop.repeat,
        );
        for h in &self.lifecycle_due {
            tracing::info!(reason = h.reason(), note = %h.note(), "claim lifecycle");
        }
    }

    /// Asks the backstop about the claims over their grant: logs and counts each finding
    /// and kills the processes it names.
    fn enforce(&mut self, usage: &Attribution) -> Vec<Finding> {
        let findings = self.backstop.assess(usage, Instant::now());
        let action = self.backstop.config().action;
        let host = self.host.clone();
        let metrics = host.metrics();
        for f in &findings {
            log_finding(f, action);
            metrics.observe_over_quota(f.kind.as_str(), action.as_str());
            for p in &f.kill {
                match kill_in_pod(&self.cfg.proc_root, p.pid, &p.pod.uid) {
                    Ok(()) => {
                        metrics.observe_kill();
                        tracing::warn!(pid = p.pid, pod = %format!("{}/{}", p.pod.namespace, p.pod.name),
                            claim = %format!("{}/{}", f.namespace, f.claim_name), gpu = %f.gpu_uuid,
                            used_bytes = p.used_memory, "killed a process holding device memory past the claim's grant");
                    }
                    Err(e) => self.failed("kill", &format!("pid {}: {e}", p.pid)),
                }
            }
        }
        findings
    }

    /// Notes the claim status writes now due (when the monitor writes claim status).
    fn find_status_due(
        &mut self,
        records: &BTreeMap<String, ClaimRecord>,
        claims: &[attribute::ClaimUsage],
    ) {
        if let Some((writer, _)) = &mut self.status {
            let now = k8s_openapi::jiff::Timestamp::now()
                .round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now());
            self.status_due = writer.due(records, claims, Instant::now(), &now.to_string());
        }
    }

    fn failed(&mut self, cause: &'static str, detail: &str) {
        self.host.metrics().observe_monitor_error(cause);
        let key = format!("{cause}: {}", first_words(detail));
        if self.logged.first(&key) {
            tracing::warn!(cause, error = %detail, "node monitor (logged once per cause; counted in monitor_errors_total)");
        }
    }

    /// Sends the status writes the last pass found due.
    async fn write_status(&mut self) {
        let due = std::mem::take(&mut self.status_due);
        let (Some(client), Some((_, api))) = (self.client.clone(), self.status.as_ref()) else {
            return;
        };
        let api = *api;
        let ar = fgpu_plumbing::discovery::resource(api, "ResourceClaim", "resourceclaims");
        let params = PatchParams::apply(status::FIELD_MANAGER).force();
        for w in due {
            let claims: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &w.namespace, &ar);
            let body = status::apply_body(api.api_version(), &w);
            let what = format!("ResourceClaim {}/{} status.devices", w.namespace, w.name);
            match claims
                .patch_status(&w.name, &params, &Patch::Apply(body))
                .await
            {
                Ok(stored) => {
                    let stored = serde_json::to_value(stored).unwrap_or_default();
                    if status::kept(&stored, &w) {
                        self.host.metrics().observe_status_write("ok");
                    } else {
                        self.host.metrics().observe_status_write("dropped");
                        tracing::warn!(claim = %format!("{}/{}", w.namespace, w.name),
                            "the API server does not keep ResourceClaim status.devices (feature gate DRAResourceClaimDeviceStatus off?): claim status writes stop");
                        if let Some((writer, _)) = &mut self.status {
                            writer.turn_off();
                        }
                        return;
                    }
                }
                // Deleted meanwhile, or deallocated (its devices are no longer allocated).
                Err(kube::Error::Api(e))
                    if e.code == 404 || (w.devices.is_empty() && e.code == 422) => {}
                Err(e) => {
                    self.host.metrics().observe_status_write("error");
                    self.failed("claim-status", &format!("{what}: {e}"));
                    if let Some((writer, _)) = &mut self.status {
                        writer.failed(&w.uid);
                    }
                }
            }
        }
    }

    /// The lifecycle Events the last pass found: about the claim (DRA path) or its pods.
    async fn tell_lifecycle(&mut self) {
        use lifecycle::Happening;
        for h in std::mem::take(&mut self.lifecycle_due) {
            let (type_, regarding): (EventType, Vec<Regarding>) = match &h {
                Happening::Prepared(c) | Happening::Unprepared(c) => {
                    let Some(api) = self.api else { continue };
                    (
                        EventType::Normal,
                        vec![Regarding {
                            api_version: api.api_version().to_owned(),
                            kind: "ResourceClaim".into(),
                            namespace: c.namespace.clone(),
                            name: c.name.clone(),
                            uid: c.uid.clone(),
                        }],
                    )
                }
                Happening::ContainerStarted(x) | Happening::ContainerExited(x) => (
                    EventType::Normal,
                    vec![pod_regarding(&x.pod.namespace, &x.pod.name, &x.pod.uid)],
                ),
                Happening::Refused { pods, .. } => (
                    EventType::Warning,
                    pods.iter()
                        .map(|p| pod_regarding(&p.namespace, &p.name, &p.uid))
                        .collect(),
                ),
            };
            let note = h.note();
            for r in &regarding {
                self.send_event(r, type_, h.reason(), &note).await;
            }
        }
    }

    /// The Warning Event on each pod of the finding.
    async fn publish(&mut self, f: &Finding) {
        let note = event_note(f, self.backstop.config().action);
        let reason = match (f.kind, f.kill.is_empty()) {
            (Kind::Memory, true) => "GpuMemoryOverQuota",
            (Kind::Memory, false) => "GpuMemoryOverQuotaKilled",
            (Kind::Compute, _) => "GpuComputeOverQuota",
        };
        let mut pods: Vec<&PodRef> = f.processes.iter().map(|p| &p.pod).collect();
        pods.sort_by(|a, b| a.uid.cmp(&b.uid));
        pods.dedup_by(|a, b| a.uid == b.uid);
        for pod in pods {
            let r = pod_regarding(&pod.namespace, &pod.name, &pod.uid);
            self.send_event(&r, EventType::Warning, reason, &note).await;
        }
    }

    /// One Event from the monitor (`fgpu.dev/kubelet-plugin` on this node); a refusal is
    /// counted and logged once per cause. Nothing without a client.
    async fn send_event(&mut self, r: &Regarding, type_: EventType, reason: &str, note: &str) {
        let Some(client) = self.client.clone() else {
            return;
        };
        let reporter = Reporter {
            controller: crate::cluster::EVENT_REPORTER.into(),
            instance: self.cfg.node.clone(),
        };
        let said = Said {
            type_,
            reason,
            action: "Monitor",
            note,
        };
        let ev = events::event(&reporter, r, said, k8s_openapi::jiff::Timestamp::now());
        if let Err(e) = events::publish(&client, &ev).await {
            self.failed(
                "event",
                &format!(
                    "Event {reason} on {} {}/{}: {e}",
                    r.kind, r.namespace, r.name
                ),
            );
        }
    }
}

/// An Event's object: a pod.
fn pod_regarding(namespace: &str, name: &str, uid: &str) -> Regarding {
    Regarding {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
    }
}

/// The Event's message: the claim, the GPU, used against granted, the processes.
pub fn event_note(f: &Finding, action: OverQuotaAction) -> String {
    let procs: Vec<String> = f
        .processes
        .iter()
        .map(|p| match f.kind {
            Kind::Memory => format!("pid {} {}", p.pid, mib(p.used_memory)),
            Kind::Compute => format!("pid {} {}%", p.pid, p.sm_percent.unwrap_or(0)),
        })
        .collect();
    let what = match f.kind {
        Kind::Memory => format!(
            "claim {}/{} holds {} of device memory on GPU {}, granted {} (the shim was bypassed)",
            f.namespace,
            f.claim_name,
            mib(f.used),
            f.gpu_uuid,
            mib(f.granted)
        ),
        Kind::Compute => format!(
            "claim {}/{} uses {}% of the SMs of GPU {}, granted {}%",
            f.namespace, f.claim_name, f.used, f.gpu_uuid, f.granted
        ),
    };
    let done = if f.kill.is_empty() {
        format!("reported (--over-quota={})", action.as_str())
    } else {
        let k: Vec<String> = f.kill.iter().map(|p| p.pid.to_string()).collect();
        format!("killed pid {}", k.join(", "))
    };
    format!("{what}; processes: {}; {done}", procs.join(", "))
}

fn log_finding(f: &Finding, action: OverQuotaAction) {
    tracing::warn!(
        kind = f.kind.as_str(),
        claim = %format!("{}/{}", f.namespace, f.claim_name),
        uid = %f.claim_uid,
        gpu = %f.gpu_uuid,
        used = f.used,
        granted = f.granted,
        processes = %f.processes.iter().map(|p| p.pid.to_string()).collect::<Vec<_>>().join(","),
        action = action.as_str(),
        repeat = !f.first,
        "claim over quota"
    );
}

fn mib(b: u64) -> String {
    format!("{} MiB", b >> 20)
}

fn first_words(s: &str) -> &str {
    // Group repeats of one cause whose details differ only in numbers (pids, sizes).
    s.split(|c: char| c.is_ascii_digit()).next().unwrap_or(s)
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// SIGKILL of `pid` if, and only if, it is still in pod `pod_uid`: the process is pinned
/// with a pidfd first and its cgroup read after, so a PID reused meanwhile is never hit.
pub fn kill_in_pod(proc_root: &Path, pid: u32, pod_uid: &str) -> std::io::Result<()> {
    use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
    let p = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::other("not a valid PID"))?;
    let fd = pidfd_open(p, PidfdFlags::empty())?;
    match cgroup::of_pid(proc_root, pid) {
        Some(cg) if cg.pod_uid == pod_uid => {}
        _ => {
            return Err(std::io::Error::other(format!(
                "no longer in pod {pod_uid}; not killed"
            )));
        }
    }
    pidfd_send_signal(&fd, Signal::KILL)?;
    Ok(())
}

#[cfg(test)]
mod tests;
