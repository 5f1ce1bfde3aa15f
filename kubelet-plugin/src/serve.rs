//! The `serve` loop: everything the DaemonSet's container runs, given a kube client and a
//! device backend. `main.rs` only turns flags into a [`ServeConfig`].
//!
//! 1. Negotiates the `resource.k8s.io` version.
//! 2. Starts the [`Plugin`] (checkpoint, boot id, leftovers) and cleans up stale claims.
//! 3. Starts the claim watch that feeds the claim cache ([`crate::claim_cache`]), unless
//!    turned off; serves the registration and DRA sockets.
//! 4. Starts the node monitor ([`crate::monitor`]) unless turned off.
//! 5. Checks GPU health every `--health-seconds` ([`crate::health`]) and publishes the
//!    node's ResourceSlice at once when a GPU's condition changes (unhealthy GPUs tainted),
//!    and again every `resync` (a kubelet that wiped the node's slices) together with the
//!    stale-claim cleanup; serves the kubelet's device health stream. Each publish reads
//!    the GPUs' wanted modes (node labels, `--gpu-mode`, the backend) and takes a change
//!    only for a GPU without prepared claims ([`crate::gpu_mode`]); a refused change is
//!    logged and told in a Warning Event on the Node (`GpuModeChangeRefused`).
//! 6. Stops on `shutdown`, or with an error when the kubelet refuses the registration (the
//!    container restarts and registers again).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fgpu_api::names::DriverName;
use fgpu_driver::backend::DeviceBackend;
use fgpu_plumbing::events::{EventType, Said};

use crate::checkpoint::{CheckpointError, LoadNote, read_boot_id};
use crate::claim_cache::{CachedClaimSource, ClaimCache};
use crate::cluster::{
    ClusterError, KubeClaimSource, REASON_CHECKPOINT_CORRUPTED, REASON_GPU_MODE_CHANGE_REFUSED,
    REASON_GPU_TIER_CHANGE_REFUSED, SlicePublisher, negotiate, node_event, watch_claims,
};
use crate::edits::NodeFiles;
use crate::gpu_mode::{Keeper, MODES_FILE, ModeFlag, ModeKeeper, Setting, Wanted, wanted_modes};
use crate::grpc::{GrpcError, PluginServer, RegistrationState, Sockets};
use crate::health::{
    DeviceHealthList, HealthMonitor, HealthService, HealthView, NodeSink, TaintArgs,
};
use crate::prepare::{Plugin, PluginConfig};
use crate::slices::GpuSettings;
use crate::tier::{TIERS_FILE, TierFlag, TierKeeper, wanted_tiers};
use fgpu_driver::device::NodeInventory;
use fgpu_driver::device::TierRatio;

/// Settings of [`run`].
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The driver name.
    pub driver: DriverName,
    /// This node.
    pub node_name: String,
    /// The kubelet's plugin registry (`/var/lib/kubelet/plugins_registry`).
    pub registrar_dir: PathBuf,
    /// The kubelet's plugins directory (`/var/lib/kubelet/plugins`).
    pub plugins_dir: PathBuf,
    /// CDI spec directory (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The plugin's node-wide files (preload file, shared GPU directory).
    pub state_dir: PathBuf,
    /// The plugin's per-boot files (checkpoint, claim directories); a tmpfs on real nodes.
    pub run_dir: PathBuf,
    /// Files every claim's containers get.
    pub files: NodeFiles,
    /// Where the boot id is read (`/proc/sys/kernel/random/boot_id`).
    pub boot_id_path: PathBuf,
    /// Publish devices with consumable capacity (falls back if the cluster drops it).
    pub consumable_capacity: bool,
    /// How often to republish the slice and clean up stale claims.
    pub resync: Duration,
    /// Where to serve `/metrics` and `/healthz` over HTTP; `None`: not served.
    pub metrics_addr: Option<SocketAddr>,
    /// Answer prepares from the claim cache ([`crate::claim_cache`]) where it can; `false`:
    /// every prepare GETs its claim.
    pub claim_cache: bool,
    /// Crash tests only: see [`PluginConfig::test_pause`].
    pub test_pause: Option<Duration>,
    /// The kubelet's pod resources socket, for the monitor's container names; `None`: not
    /// read.
    pub pod_resources_socket: Option<PathBuf>,
    /// The node monitor ([`crate::monitor`]); `None`: off.
    pub monitor: Option<crate::monitor::MonitorConfig>,
    /// GPU health checks ([`crate::health`]).
    pub health: crate::health::HealthArgs,
    /// Effects of the device taints on unhealthy GPUs.
    pub taints: crate::health::TaintArgs,
    /// The GPUs' modes and the fixed MIG layouts ([`crate::gpu_mode`]).
    pub modes: crate::gpu_mode::ModeArgs,
}

/// Why serving stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The API server could not be used.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The checkpoint or state directory could not be used.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The sockets could not be served.
    #[error(transparent)]
    Grpc(#[from] GrpcError),
    /// The kubelet refused the registration.
    #[error("the kubelet refused the registration: {0}")]
    Rejected(String),
    /// The metrics address could not be bound.
    #[error("metrics address {addr}: {source}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Runs the plugin until `shutdown` completes or the kubelet refuses it.
pub async fn run(
    cfg: ServeConfig,
    client: kube::Client,
    backend: Arc<dyn DeviceBackend>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let api = negotiate(&client).await?;
    tracing::info!(api = %api.api_version(), "using resource.k8s.io version");
    let cache = cfg
        .claim_cache
        .then(|| Arc::new(ClaimCache::new(cfg.driver.as_str(), cfg.node_name.as_str())));
    let source = CachedClaimSource::new(KubeClaimSource::new(client.clone(), api), cache.clone());
    let boot_id = read_boot_id(&cfg.boot_id_path)?;
    let (plugin, report) = Plugin::start(
        PluginConfig {
            driver: cfg.driver.clone(),
            node_name: cfg.node_name.clone(),
            state_root: cfg.state_dir.clone(),
            run_root: cfg.run_dir.clone(),
            cdi_dir: cfg.cdi_dir.clone(),
            files: cfg.files.clone(),
            boot_id,
            claim_get_timeout: crate::prepare::CLAIM_GET_TIMEOUT,
            test_pause: cfg.test_pause,
        },
        source,
        backend.clone(),
    )?;
    // Only the DRA front end reconciles MIG instances with its records: the device plugin,
    // which may share the checkpoint directory, would take the records this one writes
    // after its load for orphans (docs/mig.md, Legacy path).
    let mig = plugin.reconcile_mig();
    if !mig.destroyed.is_empty() || !mig.recreated.is_empty() || !mig.lost.is_empty() {
        tracing::warn!(
            destroyed = mig.destroyed.len(),
            recreated = mig.recreated.len(),
            lost = mig.lost.len(),
            "MIG instances reconciled with the checkpoint"
        );
    }
    for e in &mig.errors {
        tracing::error!("{e}");
    }
    if let Some(from) = &report.migrated_from {
        tracing::info!(from = %from.display(), claims = plugin.claims().len(),
            "version-1 checkpoint migrated to the checkpoint directory");
    }
    for note in &report.notes {
        match note {
            LoadNote::Corrupt { moved_to, error } => {
                tracing::error!(moved_to = %moved_to.display(), %error, "checkpoint file was corrupt; moved aside, the claims it recorded are no longer prepared");
                let message = format!(
                    "fgpu kubelet plugin: a checkpoint file could not be read ({error}); moved to {} and started without the claims it recorded",
                    moved_to.display()
                );
                let said = Said {
                    type_: EventType::Warning,
                    reason: REASON_CHECKPOINT_CORRUPTED,
                    action: "Start",
                    note: &message,
                };
                if let Err(e) = node_event(&client, &cfg.node_name, said).await {
                    tracing::warn!(error = %e, "cannot record the event");
                }
            }
            LoadNote::BootChanged {
                previous,
                discarded,
            } => {
                tracing::warn!(%previous, claims = discarded.len(), "checkpoint records from a previous boot; discarded");
            }
            LoadNote::Missing => {}
        }
    }
    for path in &report.removed_orphans {
        tracing::info!(path = %path.display(), "removed a leftover file");
    }
    for path in &report.kept_unloaded {
        tracing::warn!(path = %path.display(), "kept a claim's file: its record is in the checkpoint directory but was not loaded (corrupt, or the device plugin's); removed when the claim is unprepared");
    }
    for e in &report.errors {
        tracing::warn!(error = %e, "cleanup at start");
    }
    let plugin = Arc::new(plugin);
    // The claim watch: started before the sockets, so that it has usually listed the claims
    // by the first prepare (until then prepares GET their claims).
    let (stop_monitor, monitor_stopped) = tokio::sync::watch::channel(false);
    if let Some(mcfg) = cfg.monitor.clone() {
        use crate::monitor::{Consumers, Host, Monitor};
        let consumers = cache
            .clone()
            .map_or(Consumers::Unknown, Consumers::ReservedFor);
        if matches!(consumers, Consumers::Unknown) {
            tracing::warn!(
                "the node monitor needs the claim cache to map processes to claims (--claim-cache=false): it measures GPUs only"
            );
        }
        let host: Arc<dyn Host> = plugin.clone();
        let mut monitor =
            Monitor::new(mcfg, backend.clone(), host, consumers, Some(client.clone()))
                .with_claim_status(cfg.driver.as_str(), api);
        if let Some(socket) = cfg.pod_resources_socket.clone() {
            monitor = monitor.with_pod_resources(socket);
        }
        tokio::spawn(monitor.run(monitor_stopped));
    }
    let watch = cache.map(|cache| {
        let size = plugin.metrics().claim_cache_size();
        tokio::spawn(watch_claims(client.clone(), api, cache, size))
    });
    let (stop_metrics, metrics_stopped) = tokio::sync::watch::channel(false);
    if let Some(addr) = cfg.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Metrics { addr, source })?;
        let p = plugin.clone();
        let render = Arc::new(move || p.metrics().encode());
        tracing::info!(%addr, "serving /metrics");
        tokio::spawn(crate::metrics::serve_http(
            listener,
            render,
            metrics_stopped,
        ));
    }
    // GPU health: checked every --health-seconds; a change republishes the slice at once.
    let (stop_health, health_stopped) = tokio::sync::watch::channel(false);
    let monitor = HealthMonitor::new(backend.clone(), cfg.health.policy());
    let mut health = monitor.subscribe();
    let counted = plugin.clone();
    let sink = Arc::new(NodeSink::new(
        Some(client.clone()),
        &cfg.node_name,
        move |gpu, to| counted.metrics().observe_health_transition(gpu, to),
    ));
    tokio::spawn(crate::health::run(
        monitor,
        cfg.health.interval(),
        sink,
        health_stopped,
    ));
    let (device_health, device_health_rx) =
        tokio::sync::watch::channel(DeviceHealthList::default());
    let health_service = HealthService::new(
        device_health_rx,
        cfg.health.interval().max(Duration::from_secs(10)),
    );

    let sockets = Sockets::new(&cfg.registrar_dir, &cfg.plugins_dir, &cfg.driver);
    let server =
        PluginServer::start_with_health(plugin.clone(), sockets, Some(health_service)).await?;
    let mut registration = server.registration();
    let (modes, note) = ModeKeeper::load(cfg.state_dir.join(MODES_FILE));
    if let Some(note) = note {
        tracing::warn!("{note}");
    }
    let (tiers, note) = TierKeeper::load(cfg.state_dir.join(TIERS_FILE));
    if let Some(note) = note {
        tracing::warn!("{note}");
    }
    // Prepares before the first publish keep the tiers apart by the ratios in force.
    plugin.set_gpu_tiers(tiers.modes().clone());
    let mut slice = SliceState {
        publisher: SlicePublisher::new(
            client.clone(),
            api,
            cfg.driver.clone(),
            cfg.consumable_capacity,
        )
        .with_fixed_layouts(cfg.modes.mig_fixed_layout.clone()),
        taints: cfg.taints.clone(),
        last_inventory: None,
        device_health,
        modes,
        mode_flag: cfg.modes.gpu_mode.clone(),
        tiers,
        tier_flag: cfg.modes.oversubscribe.clone(),
        client,
        notes: Default::default(),
    };

    let mut tick = tokio::time::interval(cfg.resync);
    tokio::pin!(shutdown);
    let outcome = loop {
        tokio::select! {
            () = &mut shutdown => break Ok(()),
            changed = registration.changed() => {
                if changed.is_err() {
                    break Ok(());
                }
                if let RegistrationState::Rejected(reason) = registration.borrow_and_update().clone() {
                    break Err(ServeError::Rejected(reason));
                }
            }
            // The API calls below wait on the stop signal too: a hung API server must not
            // hold the exit (each request is bounded anyway, by the client's timeout).
            _ = tick.tick() => {
                let view = health.borrow_and_update().clone();
                tokio::select! {
                    () = resync(&plugin, backend.as_ref(), &cfg.node_name, &mut slice, &view) => {}
                    () = &mut shutdown => break Ok(()),
                }
            }
            changed = health.changed() => {
                if changed.is_ok() {
                    let view = health.borrow_and_update().clone();
                    tokio::select! {
                        () = slice.publish(&plugin, backend.as_ref(), &cfg.node_name, &view) => {}
                        () = &mut shutdown => break Ok(()),
                    }
                }
            }
        }
    };
    stop_metrics.send_replace(true);
    stop_monitor.send_replace(true);
    stop_health.send_replace(true);
    if let Some(watch) = watch {
        watch.abort();
    }
    server.shutdown().await?;
    outcome
}

async fn resync<S: crate::prepare::ClaimSource>(
    plugin: &Plugin<S>,
    backend: &dyn DeviceBackend,
    node: &str,
    slice: &mut SliceState,
    health: &HealthView,
) {
    #[cfg(feature = "nvml")]
    if let Some(hook) = plugin.config().files.memory_limits.clone() {
        let swept = tokio::task::spawn_blocking(move || crate::driver_limits::sweep(&hook)).await;
        if let Ok(r) = swept {
            for (gpu, cgroup) in &r.cleared {
                tracing::info!(gpu = %gpu, cgroup = %cgroup.display(),
                    "driver memory limit of an ended container cleared");
            }
            for e in &r.errors {
                tracing::warn!(error = %e, "driver memory limits sweep");
            }
        }
    }
    let cleaned = plugin.cleanup_stale().await;
    for c in &cleaned.suspected {
        tracing::info!(claim = %c, "a prepared claim looks stale; unprepared if the next sweep sees the same");
    }
    for c in &cleaned.removed {
        tracing::info!(claim = %c, "unprepared a claim that no longer exists (seen by two sweeps)");
    }
    for path in &cleaned.removed_files {
        tracing::info!(path = %path.display(), "removed a file that no claim's record names");
    }
    for e in &cleaned.errors {
        tracing::warn!(error = %e, "stale-claim cleanup");
    }
    slice.publish(plugin, backend, node, health).await;
}

/// The slice and what it was built from.
struct SliceState {
    publisher: SlicePublisher,
    taints: TaintArgs,
    /// The last inventory the backend gave, used when it cannot enumerate (a GPU fell off
    /// the bus and NVML fails for the whole node): the lost GPU is then published unhealthy.
    last_inventory: Option<NodeInventory>,
    /// What the kubelet's health stream sends.
    device_health: tokio::sync::watch::Sender<DeviceHealthList>,
    /// The GPU modes in force.
    modes: ModeKeeper,
    /// `--gpu-mode`.
    mode_flag: ModeFlag,
    /// The research tier's ratios in force.
    tiers: TierKeeper,
    /// `--oversubscribe`.
    tier_flag: TierFlag,
    /// For the Node Events of refused mode changes.
    client: kube::Client,
    /// The messages logged at the last publish (each is logged once while it holds).
    notes: std::collections::BTreeSet<String>,
}

impl SliceState {
    /// Reads the GPUs, overlays the health monitor's conclusions and publishes the slice
    /// (with a taint per unhealthy GPU) and the device health list.
    async fn publish<S: crate::prepare::ClaimSource>(
        &mut self,
        plugin: &Plugin<S>,
        backend: &dyn DeviceBackend,
        node: &str,
        health: &HealthView,
    ) {
        let mut inventory = match backend.inventory(node) {
            Ok(inventory) => {
                self.last_inventory = Some(inventory.clone());
                inventory
            }
            Err(e) => match &self.last_inventory {
                Some(last) => {
                    tracing::warn!(error = %e, "cannot list the GPUs; publishing the last inventory with their health");
                    last.clone()
                }
                None => {
                    tracing::warn!(error = %e, "cannot list the GPUs; the ResourceSlice is not updated");
                    return;
                }
            },
        };
        health.overlay(&mut inventory);
        plugin.set_inventory(inventory.clone());
        // Sent before publishing (a hung API server must not hold the kubelet's health
        // stream), and again after, should the publish have settled other modes.
        self.send_device_health(&inventory);
        let taints = health.taints(&self.taints);
        let busy = claims_by_gpu(&plugin.claims());
        let mut notes = Vec::new();
        let mut refusals = Vec::new();
        let (modes, flag) = (&mut self.modes, &self.mode_flag);
        let (tiers, tier_flag) = (&mut self.tiers, &self.tier_flag);
        let gpus = &inventory.gpus;
        let decide = |labels: &std::collections::BTreeMap<String, String>| {
            let mut settled = Settled {
                notes: &mut notes,
                refusals: &mut refusals,
            };
            let wanted = wanted_modes(gpus, labels, flag, |uuid| backend.gpu_mode(uuid));
            settled.settle(modes, wanted, &busy, REASON_GPU_MODE_CHANGE_REFUSED);
            // A GPU the keeper has no record of was off the tier (a plugin without tiers
            // prepared its claims): putting it on the tier waits for its claims to go.
            tiers.assume_unseen(gpus.iter().map(|g| g.uuid.as_str()), TierRatio::NONE);
            let wanted = wanted_tiers(gpus, labels, tier_flag);
            settled.settle(tiers, wanted, &busy, REASON_GPU_TIER_CHANGE_REFUSED);
            GpuSettings {
                modes: modes.modes().clone(),
                tiers: tiers.modes().clone(),
            }
        };
        let published = self
            .publisher
            .publish_with_modes(&inventory, &taints, decide)
            .await;
        plugin.set_gpu_modes(self.modes.modes().clone());
        plugin.set_gpu_tiers(self.tiers.modes().clone());
        self.send_device_health(&inventory);
        for (gpu, refusal, reason) in &refusals {
            let message = format!("fgpu kubelet plugin: {refusal}");
            tracing::warn!(gpu = %gpu, "{message}");
            let said = Said {
                type_: EventType::Warning,
                reason,
                action: "PublishResourceSlice",
                note: &message,
            };
            if let Err(e) = node_event(&self.client, node, said).await {
                tracing::warn!(error = %e, "cannot record the event");
            }
        }
        match published {
            Ok(p) => {
                notes.extend(p.errors.iter().cloned());
                if p.written {
                    tracing::info!(
                        generation = p.generation,
                        consumable = p.consumable,
                        partitionable = p.partitionable,
                        slices = p.slices,
                        devices = inventory.gpus.len(),
                        tainted = if self.publisher.taints_kept() {
                            taints.len()
                        } else {
                            0
                        },
                        "published the ResourceSlice"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot publish the ResourceSlice; retrying later")
            }
        }
        // Each message once while it holds (not at every resync).
        let now: std::collections::BTreeSet<String> = notes.into_iter().collect();
        for n in now.difference(&self.notes) {
            tracing::error!("{n}");
        }
        self.notes = now;
    }
}

impl SliceState {
    /// Tells the kubelet's health stream the devices' health, if it changed.
    fn send_device_health(&self, inventory: &NodeInventory) {
        self.device_health.send_if_modified(|l| {
            let new = DeviceHealthList::from_inventory(inventory, self.modes.modes());
            let changed = *l != new;
            *l = new;
            changed
        });
    }
}

/// What settling the GPUs' settings had to say: messages to log, and refused changes
/// (GPU, message, Event reason) to tell in Node Events.
struct Settled<'a> {
    notes: &'a mut Vec<String>,
    refusals: &'a mut Vec<(String, String, &'static str)>,
}

impl Settled<'_> {
    /// Settles one setting's `wanted` values (and the messages of reading them) in
    /// `keeper`, keeping what it says.
    fn settle<V: Setting>(
        &mut self,
        keeper: &mut Keeper<V>,
        (wanted, errors): (std::collections::BTreeMap<String, Wanted<V>>, Vec<String>),
        busy: &std::collections::BTreeMap<String, Vec<String>>,
        reason: &'static str,
    ) {
        self.notes.extend(errors);
        let (refused, error) = keeper.settle(&wanted, busy);
        self.notes.extend(error);
        self.refusals.extend(
            refused
                .iter()
                .map(|r| (r.gpu_uuid.clone(), r.to_string(), reason)),
        );
    }
}

/// The prepared claims (`namespace/name`) on each GPU, by UUID: a GPU with any cannot
/// change its mode.
pub(crate) fn claims_by_gpu(
    claims: &std::collections::BTreeMap<String, crate::checkpoint::ClaimRecord>,
) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for c in claims.values() {
        for d in &c.devices {
            let list = out.entry(d.gpu_uuid.clone()).or_default();
            let name = format!("{}/{}", c.namespace, c.name);
            if !list.contains(&name) {
                list.push(name);
            }
        }
    }
    out
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

/// The async runtime of the plugin's daemons: `worker_threads` workers and a blocking pool of
/// at most 4 threads for file writes (each is resident memory, its stack and malloc cache:
/// hack/bench-prepare.sh saw 0.4-0.6 MiB less than with 8, latency at 8 prepares in flight
/// within noise). Also picks rustls' `ring` provider: both of rustls' providers are compiled
/// in (kube asks for ring, the CDI crate's jsonschema for aws-lc-rs), rustls then refuses to
/// pick one and the first TLS client panics. An error installing it means one is installed
/// already.
pub fn runtime(worker_threads: u16) -> std::io::Result<tokio::runtime::Runtime> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads.into())
        .max_blocking_threads(4)
        .enable_all()
        .build()
}
