//! GPU health on the node: a check every `--health-seconds` through the device backend
//! ([`DeviceBackend::check_health`]), the state machine of [`fgpu_driver::health`] (faults
//! the admin ignores change nothing; any other turns the GPU unhealthy at once; healthy
//! again after `--health-recovery-checks` clean checks in a row), and what each mode makes
//! of it:
//!
//! * `serve`: the GPU stays in the ResourceSlice with a device taint ([`taints`]:
//!   `fgpu.dev/unhealthy=<fault>`, effect `--taint-degraded` / `--taint-fatal`), or is left out
//!   where the API server drops taints; the kubelet's `DRAResourceHealth` stream
//!   ([`HealthService`]) shows it in the status of pods that use it.
//! * `device-plugin`: `ListAndWatch` reports its shares `Unhealthy`; the node annotation
//!   tells the extender.
//! * both: a Node Event per transition (`GpuUnhealthy`, `GpuHealthy`) and the metrics
//!   `gpu_healthy` and `gpu_health_transitions_total`.
//!
//! The taints are fgpu's own (one key); taints an admin sets with a DeviceTaintRule are
//! separate objects that fgpu neither reads nor removes.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fgpu_api::names::taint;
use fgpu_api::proto::drahealth;
use fgpu_driver::backend::{BackendError, DeviceBackend};
use fgpu_driver::device::{GpuMode, Health, NodeInventory};
use fgpu_driver::health::{
    Condition, DEFAULT_FATAL_XIDS, DEFAULT_IGNORED_XIDS, HealthPolicy, HealthTracker, Severity,
    Transition,
};
use fgpu_plumbing::events::{EventType, Said};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::slices::DeviceTaint;

/// Reason of the Node Event when a GPU turns (or gets more) unhealthy.
pub const REASON_GPU_UNHEALTHY: &str = "GpuUnhealthy";
/// Reason of the Node Event when a GPU is healthy again.
pub const REASON_GPU_HEALTHY: &str = "GpuHealthy";
/// The Node Events' `action`: what the plugin was doing when it saw the transition.
pub const EVENT_ACTION: &str = "CheckHealth";

/// A list of XIDs on the command line: `13,31,43`; empty or `none` for no XID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XidList(pub BTreeSet<u32>);

impl FromStr for XidList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("none") {
            return Ok(Self(BTreeSet::new()));
        }
        s.split(',')
            .map(|p| {
                p.trim().parse::<u32>().map_err(|_| {
                    format!("{p:?} is not an XID number (a list like 13,31,43, or none)")
                })
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }
}

impl std::fmt::Display for XidList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u32::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

fn default_list(xids: &[u32]) -> String {
    XidList(xids.iter().copied().collect()).to_string()
}

/// Health-check flags, the same in `serve` and `device-plugin`.
#[derive(Clone, Debug, clap::Args)]
pub struct HealthArgs {
    /// Seconds between GPU health checks (driver events are drained at each).
    #[arg(long, value_name = "SECONDS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    pub health_seconds: u64,
    /// Clean health checks in a row before an unhealthy GPU is healthy again.
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub health_recovery_checks: u32,
    /// XIDs that are application errors, not device faults: ignored (comma-separated, or
    /// `none`).
    #[arg(long, value_name = "XIDS", default_value_t = XidList(DEFAULT_IGNORED_XIDS.into_iter().collect()), hide_default_value = true,
          help = format!("XIDs that are application errors, not device faults: ignored (comma-separated, or `none`) [default: {}]", default_list(&DEFAULT_IGNORED_XIDS)))]
    pub health_ignore_xids: XidList,
    /// XIDs that make a GPU fatally unhealthy; other XIDs degrade it.
    #[arg(long, value_name = "XIDS", default_value_t = XidList(DEFAULT_FATAL_XIDS.into_iter().collect()), hide_default_value = true,
          help = format!("XIDs that make a GPU fatally unhealthy; other XIDs degrade it (comma-separated, or `none`) [default: {}]", default_list(&DEFAULT_FATAL_XIDS)))]
    pub health_fatal_xids: XidList,
}

impl Default for HealthArgs {
    fn default() -> Self {
        Self {
            health_seconds: 2,
            health_recovery_checks: 3,
            health_ignore_xids: XidList(DEFAULT_IGNORED_XIDS.into_iter().collect()),
            health_fatal_xids: XidList(DEFAULT_FATAL_XIDS.into_iter().collect()),
        }
    }
}

impl HealthArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> HealthPolicy {
        HealthPolicy {
            ignored_xids: self.health_ignore_xids.0.clone(),
            fatal_xids: self.health_fatal_xids.0.clone(),
            recovery_checks: self.health_recovery_checks,
        }
    }

    /// The check period.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.health_seconds)
    }
}

/// The effect of a device taint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TaintEffect {
    /// Informational only (API servers 1.35+).
    #[value(name = "None")]
    None,
    /// No new allocation on the device.
    #[value(name = "NoSchedule")]
    NoSchedule,
    /// No new allocation, and pods using the device are evicted.
    #[value(name = "NoExecute")]
    NoExecute,
}

impl TaintEffect {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::NoSchedule => "NoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

/// Device-taint flags of `serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct TaintArgs {
    /// Effect of the taint on a degraded GPU (a non-fatal XID, pages pending retirement,
    /// near the shutdown temperature).
    #[arg(long, value_enum, value_name = "EFFECT", default_value_t = TaintEffect::NoSchedule)]
    pub taint_degraded: TaintEffect,
    /// Effect of the taint on a fatally unhealthy GPU (lost, double-bit ECC, a fatal XID).
    /// `NoExecute` evicts the pods using it.
    #[arg(long, value_enum, value_name = "EFFECT", default_value_t = TaintEffect::NoExecute)]
    pub taint_fatal: TaintEffect,
}

impl Default for TaintArgs {
    fn default() -> Self {
        Self {
            taint_degraded: TaintEffect::NoSchedule,
            taint_fatal: TaintEffect::NoExecute,
        }
    }
}

impl TaintArgs {
    fn effect(&self, s: Severity) -> TaintEffect {
        match s {
            Severity::Degraded => self.taint_degraded,
            Severity::Fatal => self.taint_fatal,
        }
    }
}

/// What the health monitor last concluded, per GPU UUID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthView {
    /// Each GPU checked, with its condition.
    pub gpus: BTreeMap<String, Condition>,
}

impl HealthView {
    /// Sets each GPU's health in `inventory` to what the monitor concluded (a GPU the
    /// monitor has not checked yet keeps the backend's word).
    pub fn overlay(&self, inventory: &mut NodeInventory) {
        for g in &mut inventory.gpus {
            match self.gpus.get(&g.uuid) {
                None => {}
                Some(Condition::Healthy) => g.health = Health::Healthy,
                Some(Condition::Unhealthy(u)) => {
                    g.health = Health::Unhealthy {
                        reason: format!("{} ({})", u.fault, u.severity.as_str()),
                    }
                }
            }
        }
    }

    /// The device taint of each unhealthy GPU, effects from `effects`.
    pub fn taints(&self, effects: &TaintArgs) -> BTreeMap<String, DeviceTaint> {
        self.gpus
            .iter()
            .filter_map(|(uuid, c)| match c {
                Condition::Healthy => None,
                Condition::Unhealthy(u) => Some((
                    uuid.clone(),
                    DeviceTaint {
                        key: taint::UNHEALTHY.to_owned(),
                        value: u.fault.slug(),
                        effect: effects.effect(u.severity).as_str(),
                        time_added: rfc3339(u.since),
                    },
                )),
            })
            .collect()
    }
}

fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map_or_else(|_| "1970-01-01T00:00:00Z".into(), |ts| ts.to_string())
}

/// The health checks of one node: the backend, the state machine and the published view.
pub struct HealthMonitor {
    backend: Arc<dyn DeviceBackend>,
    tracker: HealthTracker,
    view: watch::Sender<HealthView>,
}

impl HealthMonitor {
    /// A monitor over `backend` under `policy`; nothing is checked until [`check`](Self::check).
    pub fn new(backend: Arc<dyn DeviceBackend>, policy: HealthPolicy) -> Self {
        Self {
            backend,
            tracker: HealthTracker::new(policy),
            view: watch::channel(HealthView::default()).0,
        }
    }

    /// Follows the view; it changes only when a GPU's condition does (or a GPU is first
    /// seen).
    pub fn subscribe(&self) -> watch::Receiver<HealthView> {
        self.view.subscribe()
    }

    /// The policy in force.
    pub fn policy(&self) -> &HealthPolicy {
        self.tracker.policy()
    }

    /// One check at `now` (blocking: the backend's probes). Returns the transitions; a
    /// backend error changes nothing (the GPUs keep their condition) and is returned.
    pub fn check(&mut self, now: SystemTime) -> Result<Vec<Transition>, BackendError> {
        let known: Vec<String> = self
            .tracker
            .conditions()
            .map(|(u, _)| u.to_owned())
            .collect();
        let reports = self.backend.check_health(&known)?;
        let transitions: Vec<Transition> = reports
            .iter()
            .filter_map(|r| self.tracker.observe(&r.uuid, &r.faults, now))
            .collect();
        let gpus: BTreeMap<String, Condition> = self
            .tracker
            .conditions()
            .map(|(u, c)| (u.to_owned(), c.clone()))
            .collect();
        self.view.send_if_modified(|v| {
            // Only severity changes and new GPUs matter to readers, not the clean-check count.
            let same = v.gpus.len() == gpus.len()
                && v.gpus
                    .iter()
                    .zip(&gpus)
                    .all(|((ua, a), (ub, b))| ua == ub && a.as_str() == b.as_str());
            if same {
                false
            } else {
                v.gpus = gpus;
                true
            }
        });
        Ok(transitions)
    }
}

/// Where transitions are told, besides the log.
pub trait TransitionSink: Send + Sync + 'static {
    /// Called once per transition, from the monitor's task.
    fn transition(&self, t: &Transition, message: &str);
}

/// The usual [`TransitionSink`]: a Node Event per transition (`GpuUnhealthy` Warning,
/// `GpuHealthy` Normal; written in the background, failures logged) and a count.
pub struct NodeSink {
    client: Option<kube::Client>,
    node: String,
    count: Box<CountFn>,
}

/// `count(gpu_uuid, to)`: how a [`NodeSink`] counts a transition (a metric).
type CountFn = dyn Fn(&str, &'static str) + Send + Sync;

impl NodeSink {
    /// Events through `client` (`None`: none) about `node`; `count(gpu_uuid, to)` per
    /// transition (a metric).
    pub fn new(
        client: Option<kube::Client>,
        node: &str,
        count: impl Fn(&str, &'static str) + Send + Sync + 'static,
    ) -> Self {
        Self {
            client,
            node: node.to_owned(),
            count: Box::new(count),
        }
    }
}

impl TransitionSink for NodeSink {
    fn transition(&self, t: &Transition, message: &str) {
        (self.count)(&t.uuid, t.to.as_str());
        let Some(client) = self.client.clone() else {
            return;
        };
        let (type_, reason) = if t.to.is_healthy() {
            (EventType::Normal, REASON_GPU_HEALTHY)
        } else {
            (EventType::Warning, REASON_GPU_UNHEALTHY)
        };
        let (node, message) = (self.node.clone(), message.to_owned());
        tokio::spawn(async move {
            let said = Said {
                type_,
                reason,
                action: EVENT_ACTION,
                note: &message,
            };
            if let Err(e) = crate::cluster::node_event(&client, &node, said).await {
                tracing::warn!(error = %e, "cannot record the GPU health event");
            }
        });
    }
}

/// Runs `monitor` every `interval` until `stop` turns true: checks, logs each transition
/// and hands it to `sink`. Backend errors are logged once per distinct message.
pub async fn run(
    mut monitor: HealthMonitor,
    interval: Duration,
    sink: Arc<dyn TransitionSink>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = stop.wait_for(|s| *s) => { let _ = r; return; }
        }
        let recovery = monitor.policy().recovery_checks;
        let joined = tokio::task::spawn_blocking(move || {
            let r = monitor.check(SystemTime::now());
            (monitor, r)
        })
        .await;
        let (m, result) = match joined {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(error = %e, "the health check panicked; GPU health is no longer checked");
                return;
            }
        };
        monitor = m;
        match result {
            Ok(transitions) => {
                last_error = None;
                for t in &transitions {
                    let message = format!("GPU {}: {}", t.uuid, t.message(recovery));
                    if t.to.is_healthy() {
                        tracing::info!(gpu = %t.uuid, "{message}");
                    } else {
                        tracing::warn!(gpu = %t.uuid, state = t.to.as_str(), "{message}");
                    }
                    sink.transition(t, &message);
                }
            }
            Err(e) => {
                let text = e.to_string();
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "GPU health check failed; conditions unchanged");
                    last_error = Some(text);
                }
            }
        }
    }
}

/// The health of the published devices, for the kubelet's stream: pool (the node) and,
/// per device name, healthy or not with a message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceHealthList {
    /// The ResourceSlice pool (the node's name).
    pub pool: String,
    /// Device name -> (healthy, message).
    pub devices: BTreeMap<String, (bool, String)>,
}

impl DeviceHealthList {
    /// The list for `inventory` (health already overlaid), with the GPUs' `modes` in force
    /// (by UUID; absent: `shared`): a GPU is its device `gpu-<minor>`; a MIG-mode GPU of a
    /// known model is each of its placement devices instead, all with the GPU's health, so
    /// that a pod holding an instance of a failed GPU hears of it.
    pub fn from_inventory(inventory: &NodeInventory, modes: &BTreeMap<String, GpuMode>) -> Self {
        let mut devices = BTreeMap::new();
        for g in &inventory.gpus {
            let health = (
                g.is_healthy(),
                match &g.health {
                    Health::Healthy => String::new(),
                    Health::Unhealthy { reason } => reason.clone(),
                },
            );
            let table = (modes.get(&g.uuid) == Some(&GpuMode::Mig))
                .then(|| fgpu_driver::mig::table_for(&g.product_name, g.memory_bytes).ok())
                .flatten();
            match table {
                Some(table) => {
                    for d in fgpu_driver::mig::mig_devices(g, table).devices {
                        devices.insert(d.name, health.clone());
                    }
                }
                None => {
                    devices.insert(crate::edits::device_name(g), health);
                }
            }
        }
        Self {
            pool: inventory.node.clone(),
            devices,
        }
    }
}

/// The kubelet's `DRAResourceHealth` service (`v1` and `v1alpha1`): on each
/// `NodeWatchResources` call, the full device list at once, again on every change, and at
/// least every `heartbeat` (the kubelet counts a device not updated within
/// `health_check_timeout_seconds` as Unknown).
#[derive(Clone)]
pub struct HealthService {
    list: watch::Receiver<DeviceHealthList>,
    heartbeat: Duration,
}

impl HealthService {
    /// Serves `list`, re-sent at least every `heartbeat`.
    pub fn new(list: watch::Receiver<DeviceHealthList>, heartbeat: Duration) -> Self {
        Self { list, heartbeat }
    }

    fn timeout_seconds(&self) -> i64 {
        i64::try_from(self.heartbeat.as_secs().saturating_mul(3).max(30)).unwrap_or(i64::MAX)
    }

    fn response(&self, list: &DeviceHealthList) -> drahealth::v1::NodeWatchResourcesResponse {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
        let timeout = self.timeout_seconds();
        drahealth::v1::NodeWatchResourcesResponse {
            devices: list
                .devices
                .iter()
                .map(|(name, (healthy, message))| drahealth::v1::DeviceHealth {
                    device: Some(drahealth::v1::DeviceIdentifier {
                        pool_name: list.pool.clone(),
                        device_name: name.clone(),
                    }),
                    health: if *healthy {
                        drahealth::v1::HealthStatus::Healthy
                    } else {
                        drahealth::v1::HealthStatus::Unhealthy
                    } as i32,
                    last_updated_time: now,
                    health_check_timeout_seconds: timeout,
                    message: message.chars().take(1024).collect(),
                })
                .collect(),
        }
    }

    fn stream(&self) -> ResponseStream {
        let this = self.clone();
        let mut rx = self.list.clone();
        Box::pin(async_stream_like(move |tx| async move {
            loop {
                let list = rx.borrow_and_update().clone();
                if tx.send(Ok(this.response(&list))).await.is_err() {
                    return;
                }
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return },
                    () = tokio::time::sleep(this.heartbeat) => {}
                }
            }
        }))
    }
}

type ResponseStream = Pin<
    Box<
        dyn tokio_stream::Stream<Item = Result<drahealth::v1::NodeWatchResourcesResponse, Status>>
            + Send,
    >,
>;

/// A stream fed by `body` through a small channel (the task ends when the client goes).
fn async_stream_like<T, F, Fut>(body: F) -> tokio_stream::wrappers::ReceiverStream<T>
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(body(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[tonic::async_trait]
impl drahealth::v1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = ResponseStream;

    async fn node_watch_resources(
        &self,
        _request: Request<drahealth::v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        tracing::info!(grpc = "v1", "the kubelet watches device health");
        Ok(Response::new(self.stream()))
    }
}

type AlphaStream = Pin<
    Box<
        dyn tokio_stream::Stream<
                Item = Result<drahealth::v1alpha1::NodeWatchResourcesResponse, Status>,
            > + Send,
    >,
>;

#[tonic::async_trait]
impl drahealth::v1alpha1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = AlphaStream;

    async fn node_watch_resources(
        &self,
        _request: Request<drahealth::v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        use tokio_stream::StreamExt as _;
        tracing::info!(grpc = "v1alpha1", "the kubelet watches device health");
        // The two packages have the same messages; re-encode field by field.
        let s = self.stream().map(|r| {
            r.map(|v1| drahealth::v1alpha1::NodeWatchResourcesResponse {
                devices: v1
                    .devices
                    .into_iter()
                    .map(|d| drahealth::v1alpha1::DeviceHealth {
                        device: d.device.map(|id| drahealth::v1alpha1::DeviceIdentifier {
                            pool_name: id.pool_name,
                            device_name: id.device_name,
                        }),
                        health: d.health,
                        last_updated_time: d.last_updated_time,
                        health_check_timeout_seconds: d.health_check_timeout_seconds,
                        message: d.message,
                    })
                    .collect(),
            })
        });
        Ok(Response::new(Box::pin(s)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use fgpu_driver::backend::FakeBackend;
    use fgpu_driver::backend::fake::{FaultFile, faults_path};

    use super::*;

    const PROFILE: &str = "nodes:\n  - name: n\n    gpus:\n      - uuid: GPU-00000000-0000-4000-8000-000000000000\n        productName: NVIDIA H100 80GB HBM3\n        memory: 80Gi\n        smCount: 132\n        computeCapability: \"9.0\"\n      - uuid: GPU-00000000-0000-4000-8000-000000000001\n        productName: NVIDIA H100 80GB HBM3\n        memory: 80Gi\n        smCount: 132\n        computeCapability: \"9.0\"\n";
    const G1: &str = "GPU-00000000-0000-4000-8000-000000000001";

    #[test]
    fn xid_lists_parse_and_refuse() {
        assert_eq!("13, 31".parse::<XidList>().unwrap().0, [13, 31].into());
        assert!("none".parse::<XidList>().unwrap().0.is_empty());
        assert!("".parse::<XidList>().unwrap().0.is_empty());
        let e = "13,x".parse::<XidList>().unwrap_err();
        assert!(e.contains("\"x\" is not an XID"), "{e}");
    }

    #[test]
    fn a_fault_file_turns_into_a_taint_and_recovery_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("p.yaml");
        std::fs::write(&profile, PROFILE).unwrap();
        let backend: Arc<dyn DeviceBackend> = Arc::new(FakeBackend::open(&profile, None).unwrap());
        let mut m = HealthMonitor::new(
            backend.clone(),
            HealthPolicy {
                recovery_checks: 2,
                ..HealthPolicy::default()
            },
        );
        let view = m.subscribe();
        let at = |s| UNIX_EPOCH + Duration::from_secs(s);
        assert!(m.check(at(1_000)).unwrap().is_empty());
        assert!(view.borrow().taints(&TaintArgs::default()).is_empty());

        let mut faults = FaultFile::default();
        faults.gpus.insert(G1.into(), vec!["xid 79".into()]);
        faults.save(&faults_path(&profile)).unwrap();
        let t = m.check(at(1_002)).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].message(2), "unhealthy (fatal): XID 79");
        let taints = view.borrow().taints(&TaintArgs::default());
        let taint = &taints[G1];
        assert_eq!(
            (taint.key.as_str(), taint.value.as_str(), taint.effect),
            ("fgpu.dev/unhealthy", "xid-79", "NoExecute")
        );
        assert_eq!(taint.time_added, "1970-01-01T00:16:42Z");

        let mut inv = backend.inventory("n").unwrap();
        view.borrow().overlay(&mut inv);
        assert!(inv.gpus[0].is_healthy());
        assert!(!inv.gpus[1].is_healthy());
        let list = DeviceHealthList::from_inventory(&inv, &BTreeMap::new());
        assert!(!list.devices["gpu-1"].0);
        assert!(list.devices["gpu-1"].1.contains("XID 79"));
        assert!(list.devices["gpu-0"].0);
        // gpu-1 in MIG mode: its placements carry its health, in place of gpu-1.
        let mut mig = inv.clone();
        mig.gpus[1].mig_capable = true;
        mig.gpus[1].product_name = "NVIDIA H100 80GB HBM3".into();
        mig.gpus[1].memory_bytes = 80 << 30;
        let modes = BTreeMap::from([(mig.gpus[1].uuid.clone(), GpuMode::Mig)]);
        let list = DeviceHealthList::from_inventory(&mig, &modes);
        assert!(!list.devices.contains_key("gpu-1"));
        let placements: Vec<_> = list
            .devices
            .iter()
            .filter(|(name, _)| name.starts_with("gpu-1-mig-"))
            .collect();
        // An H100's placements: 7 + 3 + 2 + 1 + 1 (1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb,
        // 7g.80gb) and the 1g.10gb+me and 1g.20gb ones.
        assert!(placements.len() >= 14, "{placements:?}");
        assert!(
            placements
                .iter()
                .all(|(_, (ok, m))| !ok && m.contains("XID 79"))
        );
        assert!(list.devices["gpu-0"].0);

        // An ignored XID on the other GPU changes nothing.
        faults.gpus.insert(
            "GPU-00000000-0000-4000-8000-000000000000".into(),
            vec!["xid 43".into()],
        );
        faults.save(&faults_path(&profile)).unwrap();
        assert!(m.check(at(1_004)).unwrap().is_empty());

        // Cleared: one clean check is not enough, the second brings it back.
        FaultFile::default().save(&faults_path(&profile)).unwrap();
        assert!(m.check(at(1_006)).unwrap().is_empty());
        assert!(
            !view.borrow().gpus[G1].is_healthy(),
            "still within the recovery window"
        );
        let back = m.check(at(1_008)).unwrap();
        assert!(back[0].to.is_healthy());
        assert!(view.borrow().taints(&TaintArgs::default()).is_empty());
        let mut inv = backend.inventory("n").unwrap();
        view.borrow().overlay(&mut inv);
        assert!(inv.gpus.iter().all(|g| g.is_healthy()));
    }

    #[test]
    fn a_degraded_gpu_gets_the_degraded_effect() {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("p.yaml");
        std::fs::write(&profile, PROFILE).unwrap();
        let mut faults = FaultFile::default();
        faults.gpus.insert(G1.into(), vec!["retired-pages".into()]);
        faults.save(&faults_path(&profile)).unwrap();
        let backend: Arc<dyn DeviceBackend> = Arc::new(FakeBackend::open(&profile, None).unwrap());
        let mut m = HealthMonitor::new(backend, HealthPolicy::default());
        m.check(SystemTime::now()).unwrap();
        let effects = TaintArgs {
            taint_degraded: TaintEffect::None,
            taint_fatal: TaintEffect::NoSchedule,
        };
        let taints = m.subscribe().borrow().taints(&effects);
        assert_eq!(
            (taints[G1].value.as_str(), taints[G1].effect),
            ("retired-pages", "None")
        );
    }
}
