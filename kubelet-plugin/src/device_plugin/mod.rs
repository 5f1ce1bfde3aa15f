//! The legacy path's node side (clusters below 1.32, issue 9): a kubelet device plugin
//! (`v1beta1`) for `nvidia.com/gpu`, the DRA path's prepare behind a second front end.
//!
//! * [`register`]: serves `<device-plugins dir>/fgpu.sock` (0600) and registers it with the
//!   kubelet's `Registration` service on `kubelet.sock`, again after a kubelet restart.
//! * [`service`]: `GetDevicePluginOptions`, `ListAndWatch` (`--split-count` virtual devices
//!   `<GPU-uuid>::<k>` per GPU, with health, re-sent on change), `Allocate`.
//! * [`pods`]: which pod and container an `Allocate` is for, from the extender's decision
//!   annotation, through a [`pods::PodSource`].
//! * [`container`]: a container's grant as a claim `<pod uid>-<container>` that
//!   [`crate::prepare::Plugin::prepare`] prepares like any DRA claim: same CDI spec, state
//!   directory, limits file, preload, checkpoint.
//! * [`annotations`]: the node inventory (`<driver>/node-gpus`, with each GPU's mode) and
//!   pod decision (`<driver>/assigned-devices`) formats; [`node`]: the Node annotation
//!   writer and label reader.
//! * [`volcano`]: the Volcano mode (`--scheduler volcano`): Volcano's vGPU register and
//!   handshake annotations, its per-pod allocation checked and read as fgpu's decision.
//! * [`modes`]: each GPU's mode (`shared`, `mig`, `whole`) by the DRA side's rule; a
//!   container assigned a MIG placement gets a MIG instance through the same prepare.
//!
//! See `docs/device-plugin.md`.

pub mod annotations;
pub mod container;
pub mod modes;
pub mod node;
pub use crate::podresources;
pub mod pods;
pub mod register;
pub mod service;
pub mod volcano;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use fgpu_api::names::{DriverName, kubelet};
use fgpu_driver::backend::{BackendKind, DeviceBackend};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::checkpoint::{ClaimRecord, FrontEnd};
use crate::edits::{ClaimRef, NodeFiles};
use crate::prepare::{MapClaimSource, Plugin, PluginConfig};
use annotations::{PodAssignment, render_node_inventory};
use node::NodeAnnotationWriter;
use pods::{PodInfo, PodSource, container_claim_uid};
use register::Endpoints;
use service::{AllocateResponseMode, DevicePluginService, ServiceConfig, virtual_devices};

/// Default resource name.
pub const DEFAULT_RESOURCE_NAME: &str = "nvidia.com/gpu";
/// Default socket file name in the device-plugins directory.
pub const DEFAULT_SOCKET_NAME: &str = "fgpu.sock";
/// Default address of `/metrics` and `/healthz` (`serve` has 9400; both may run on one
/// node).
pub const DEFAULT_METRICS_ADDRESS: &str = "0.0.0.0:9401";
/// Default number of virtual devices per GPU.
pub const DEFAULT_SPLIT_COUNT: u32 = 10;

/// How long [`Running::shutdown`] waits for the plugin's tasks before it aborts them.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// The device plugin's settings.
#[derive(Clone, Debug)]
pub struct DevicePluginConfig {
    /// The prepare settings shared with the DRA path (driver, node, state and CDI dirs,
    /// files, boot id).
    pub plugin: PluginConfig,
    /// The kubelet's device-plugins directory (`kubelet.sock` and the plugin's socket).
    pub dir: PathBuf,
    /// The plugin's socket file name.
    pub socket_name: String,
    /// The resource registered.
    pub resource_name: String,
    /// Virtual devices per GPU.
    pub split_count: u32,
    /// What `Allocate` answers.
    pub response: AllocateResponseMode,
    /// How often GPU health is checked (ListAndWatch re-sends on change).
    pub health_interval: Duration,
    /// What the checks make of faults ([`crate::health`]).
    pub health_policy: fgpu_driver::health::HealthPolicy,
    /// How often `kubelet.sock` is checked for a kubelet restart.
    pub kubelet_poll: Duration,
    /// How often claims of gone pods are cleaned up and the Node annotation verified.
    pub resync: Duration,
    /// The kubelet's pod resources socket (which pod `Allocate` serves); `None`: not read.
    pub pod_resources_socket: Option<PathBuf>,
    /// `--gpu-mode`: the GPUs' modes where no node label sets them ([`crate::gpu_mode`]).
    pub gpu_mode: crate::gpu_mode::ModeFlag,
    /// `--scheduler volcano`: serve Volcano's vGPU device sharing ([`volcano`]); `None`:
    /// fgpu's extender.
    pub volcano: Option<volcano::VolcanoConfig>,
}

/// The running device plugin.
pub struct Running {
    plugin: Arc<dyn crate::monitor::Host>,
    registered: watch::Receiver<u64>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// The prepared claims and metrics, for the node monitor.
    pub fn host(&self) -> Arc<dyn crate::monitor::Host> {
        self.plugin.clone()
    }

    /// Counts the successful registrations with the kubelet.
    pub fn registered(&self) -> watch::Receiver<u64> {
        self.registered.clone()
    }

    /// Stops serving and removes the socket. Tasks still busy after [`STOP_GRACE`] (an API
    /// request that hangs) are aborted, so that a hung API server does not hold the exit;
    /// what they leave half done is what a crash leaves, which the checkpoint is built for.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        let deadline = tokio::time::Instant::now() + STOP_GRACE;
        for t in self.tasks {
            let abort = t.abort_handle();
            if tokio::time::timeout_at(deadline, t).await.is_err() {
                tracing::warn!(
                    "a task did not stop within {}s of the stop signal (an API request hangs?): aborted",
                    STOP_GRACE.as_secs()
                );
                abort.abort();
            }
        }
    }
}

/// Device-plugin claims (named `<pod>/<container>`) whose pod is gone, terminated, or no
/// longer grants that container. DRA claims in the same checkpoint are never chosen.
pub fn stale_claims(
    records: &std::collections::BTreeMap<String, ClaimRecord>,
    pods: &[PodInfo],
    annotation: &str,
) -> Vec<ClaimRef> {
    let mut live = BTreeSet::new();
    for p in pods.iter().filter(|p| !p.terminated()) {
        let Some(a) = p
            .annotations
            .get(annotation)
            .and_then(|v| PodAssignment::parse(&p.key(), annotation, v).ok())
        else {
            continue;
        };
        for c in a.containers {
            live.insert(container_claim_uid(&p.uid, &c.name));
        }
    }
    records
        .iter()
        .filter(|(uid, r)| r.front_end() == FrontEnd::DevicePlugin && !live.contains(*uid))
        .map(|(uid, r)| ClaimRef {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: uid.clone(),
        })
        .collect()
}

/// The resource registered: `--resource-name`, except that its default becomes
/// `volcano.sh/vgpu-number` with `--scheduler volcano`.
pub fn resource_for(scheduler: volcano::SchedulerKind, resource_name: String) -> String {
    match scheduler {
        volcano::SchedulerKind::Volcano if resource_name == DEFAULT_RESOURCE_NAME => {
            fgpu_api::volcano::RESOURCE_NUMBER.to_owned()
        }
        _ => resource_name,
    }
}

/// The handshake value the plugin writes at `now`: `Reported_<UTC time>` in the layout
/// Volcano's scheduler uses.
pub fn volcano_handshake(now: k8s_openapi::jiff::Timestamp) -> String {
    format!(
        "{}{}",
        fgpu_api::volcano::HANDSHAKE_REPORTED,
        now.strftime(fgpu_api::volcano::HANDSHAKE_TIME_FORMAT)
    )
}

/// Starts the device plugin: opens the prepare state, serves and registers the socket,
/// follows GPU health, and (with `writer`) publishes the node annotation. Fails only if the
/// state cannot be opened or the GPUs cannot be read at start.
pub async fn start<P: PodSource + Clone>(
    cfg: DevicePluginConfig,
    backend: Arc<dyn DeviceBackend>,
    pods: P,
    mut writer: Option<NodeAnnotationWriter>,
) -> anyhow::Result<Running> {
    let node = cfg.plugin.node_name.clone();
    let driver = cfg.plugin.driver.clone();
    let claims = Arc::new(MapClaimSource::default());
    let (plugin, report) = Plugin::start(cfg.plugin.clone(), claims.clone(), backend.clone())
        .context("cannot open the plugin state")?;
    for e in &report.errors {
        tracing::warn!(error = %e, "start");
    }
    for path in &report.kept_unloaded {
        tracing::warn!(path = %path.display(), "kept a claim's file: its record is in the checkpoint directory but was not loaded (corrupt, or the DRA plugin's)");
    }
    let plugin = Arc::new(plugin);
    let (mut mode_state, note) = modes::ModeState::load(
        cfg.plugin.state_root.join(modes::DEVICE_PLUGIN_MODES_FILE),
        cfg.gpu_mode.clone(),
    );
    if let Some(note) = note {
        tracing::warn!("{note}");
    }
    let inventory = backend
        .inventory(&node)
        .context("cannot enumerate the GPUs")?;
    let (devices_tx, devices_rx) = watch::channel(virtual_devices(&inventory, cfg.split_count));
    let assignment = driver.pod_assignment_annotation();
    let service = Arc::new(DevicePluginService::new(
        ServiceConfig {
            node: node.clone(),
            assignment_annotation: assignment.clone(),
            response: cfg.response,
            pod_resources_socket: cfg.pod_resources_socket.clone(),
            resource_name: cfg.resource_name.clone(),
            volcano: cfg.volcano.clone(),
        },
        plugin.clone(),
        claims,
        backend.clone(),
        pods.clone(),
        devices_rx,
    ));
    let (stop, stopped) = watch::channel(false);
    let until = |rx: &watch::Receiver<bool>| {
        let mut rx = rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let (registered_tx, registered) = watch::channel(0u64);
    let ep = Endpoints {
        dir: cfg.dir.clone(),
        socket_name: cfg.socket_name.clone(),
        resource: cfg.resource_name.clone(),
        poll: cfg.kubelet_poll,
    };
    let mut tasks = vec![tokio::spawn(register::supervise(
        ep,
        service,
        registered_tx,
        until(&stopped),
    ))];

    // Health and inventory: ListAndWatch re-sends on change; the annotation follows.
    let inventory_annotation = match cfg.volcano {
        Some(_) => fgpu_api::volcano::REGISTER_ANNOTATION.to_owned(),
        None => driver.node_inventory_annotation(),
    };
    let volcano_mode = cfg.volcano.is_some();
    let mut last_handshake: Option<tokio::time::Instant> = None;
    let mut last_capacity: Option<std::collections::BTreeMap<String, String>> = None;
    let (split, health_every, resync) = (cfg.split_count, cfg.health_interval, cfg.resync);
    let mut stop_rx = stopped.clone();
    let refresh_backend = backend.clone();
    let refresh_node = node.clone();
    let mut monitor = crate::health::HealthMonitor::new(backend.clone(), cfg.health_policy.clone());
    let view = monitor.subscribe();
    let (counted, gauges, mode_plugin) = (plugin.clone(), plugin.clone(), plugin.clone());
    let sink = crate::health::NodeSink::new(
        writer.as_ref().map(NodeAnnotationWriter::client),
        &node,
        move |gpu, to| counted.metrics().observe_health_transition(gpu, to),
    );
    tasks.push(tokio::spawn(async move {
        use crate::health::TransitionSink as _;
        let mut tick = tokio::time::interval(health_every);
        let mut last_verify = tokio::time::Instant::now();
        let mut first = true;
        let recovery = monitor.policy().recovery_checks;
        let mut labels: Option<std::collections::BTreeMap<String, String>> = None;
        // Each note logged once while it holds.
        let mut notes = BTreeSet::new();
        loop {
            tokio::select! {
                _ = stop_rx.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            let checked = tokio::task::spawn_blocking(move || {
                let r = monitor.check(std::time::SystemTime::now());
                (monitor, r)
            })
            .await;
            let Ok((m, result)) = checked else {
                tracing::error!("the health check panicked; GPU health is no longer checked");
                return;
            };
            monitor = m;
            match result {
                Ok(transitions) => {
                    for t in &transitions {
                        let message = format!("GPU {}: {}", t.uuid, t.message(recovery));
                        tracing::warn!(gpu = %t.uuid, state = t.to.as_str(), "{message}");
                        sink.transition(t, &message);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "GPU health check failed; conditions unchanged"),
            }
            let mut inv = match refresh_backend.inventory(&refresh_node) {
                Ok(inv) => inv,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the GPUs; keeping the last device list");
                    continue;
                }
            };
            view.borrow().overlay(&mut inv);
            gauges.metrics().set_gpus(&inv);
            let list = virtual_devices(&inv, split);
            devices_tx.send_if_modified(|cur| {
                let changed = *cur != list;
                if changed {
                    tracing::info!(devices = list.len(), "device list or health changed");
                    *cur = list;
                }
                changed
            });
            // The modes: labels read at the first refresh and every resync (a label change
            // is taken within one resync, as in `serve`); without a writer (tests), none.
            let verify = first || last_verify.elapsed() >= resync;
            if verify && let Some(w) = writer.as_ref() {
                match w.labels().await {
                    Ok(l) => labels = Some(l),
                    Err(e) => tracing::warn!(error = %e, "cannot read the Node's labels; the GPU modes stay as they are"),
                }
            } else if writer.is_none() {
                labels = Some(Default::default());
            }
            let Some(node_labels) = labels.as_ref() else {
                continue;
            };
            let settled = mode_state.settle(&inv, node_labels, &mode_plugin.claims(), refresh_backend.as_ref());
            mode_plugin.set_gpu_modes(settled.modes.clone());
            modes::report_refusals(writer.as_ref().map(NodeAnnotationWriter::client).as_ref(), &refresh_node, &settled.refusals).await;
            let (value, left_out, capacity) = if volcano_mode {
                let (gpus, notes) = volcano::register_gpus(&inv, &settled.modes, split);
                (fgpu_api::volcano::render_register(&gpus), notes, Some(volcano::node_capacity(&gpus)))
            } else {
                let (value, notes) = render_node_inventory(&inv, &settled.modes);
                (value, notes, None)
            };
            let now: BTreeSet<String> = settled.notes.into_iter().chain(left_out).collect();
            for n in now.difference(&notes) {
                tracing::error!("{n}");
            }
            notes = now;
            if let Some(w) = writer.as_mut() {
                match w.publish(&value, verify).await {
                    Ok(true) => tracing::info!(annotation = %inventory_annotation, "node inventory published"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, annotation = %inventory_annotation, "cannot publish the node inventory"),
                }
            }
            if let (Some(w), Some(cap)) = (writer.as_ref(), capacity)
                && (verify || last_capacity.as_ref() != Some(&cap))
            {
                match w.set_capacity(&cap).await {
                    Ok(()) => last_capacity = Some(cap),
                    Err(e) => tracing::warn!(error = %e, "cannot publish the node's vGPU memory and cores"),
                }
            }
            // Volcano's handshake: answered well inside the scheduler's 60 s.
            let handshake_due = last_handshake.is_none_or(|t| {
                t.elapsed() >= Duration::from_secs(fgpu_api::volcano::HANDSHAKE_INTERVAL_SECS)
            });
            if volcano_mode && handshake_due && let Some(w) = writer.as_ref() {
                let value = volcano_handshake(k8s_openapi::jiff::Timestamp::now());
                match w.set(fgpu_api::volcano::HANDSHAKE_ANNOTATION, &value).await {
                    Ok(()) => last_handshake = Some(tokio::time::Instant::now()),
                    Err(e) => tracing::warn!(error = %e, "cannot answer Volcano's handshake"),
                }
            }
            if verify {
                last_verify = tokio::time::Instant::now();
            }
            first = false;
        }
    }));

    // Claims of pods that are gone.
    let host: Arc<dyn crate::monitor::Host> = plugin.clone();
    let (sweep_backend, sweep_volcano) = (backend.clone(), cfg.volcano.clone());
    let mut stop_rx = stopped.clone();
    tasks.push(tokio::spawn(async move {
        let mut tick = tokio::time::interval(resync);
        loop {
            tokio::select! {
                _ = stop_rx.wait_for(|s| *s) => return,
                _ = tick.tick() => {}
            }
            // The records before the list: a container allocated after the list was taken
            // must not look stale for want of its pod in it.
            let records = plugin.claims();
            let list = match pods.pods_on_node(&node).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cleanup skipped");
                    continue;
                }
            };
            let list = match &sweep_volcano {
                Some(v) => match sweep_backend.inventory(&node) {
                    Ok(inv) => volcano::translate(&list, &node, &inv, &assignment, v).0,
                    Err(e) => {
                        tracing::warn!(error = %e, "cleanup skipped: cannot read the GPUs");
                        continue;
                    }
                },
                None => list,
            };
            for c in stale_claims(&records, &list, &assignment) {
                match plugin.unprepare(&c).await {
                    Ok(()) => tracing::info!(claim = %c.key(), uid = %c.uid, "removed the files of a gone container"),
                    Err(e) => tracing::warn!(error = %e, "cleanup"),
                }
            }
        }
    }));
    Ok(Running {
        plugin: host,
        registered,
        stop,
        tasks,
    })
}

/// How the device backend is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// NVML (real GPUs).
    Nvml,
    /// A fake profile (`--fake-gpus`).
    Fake,
}

/// Flags of the device-plugin subcommand.
#[derive(Debug, clap::Args)]
pub struct DevicePluginArgs {
    #[command(flatten)]
    /// The API client's flags (`--kubeconfig`).
    pub kube: fgpu_plumbing::client::KubeArgs,

    /// Kubernetes node name.
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node: String,
    /// Driver name (annotation prefix, CDI vendor).
    #[arg(long, env = "FGPU_DRIVER_NAME", default_value = fgpu_api::names::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// Device backend.
    #[arg(long, value_enum, default_value_t = BackendChoice::Nvml, env = "FGPU_BACKEND")]
    pub backend: BackendChoice,
    /// Fake GPU profile (with --backend fake).
    #[arg(
        long,
        value_name = "FILE",
        required_if_eq("backend", "fake"),
        env = "FGPU_FAKE_GPUS"
    )]
    pub fake_gpus: Option<PathBuf>,
    /// The kubelet's device-plugins directory.
    #[arg(long, value_name = "DIR", default_value = kubelet::DEVICE_PLUGIN_DIR)]
    pub device_plugin_path: PathBuf,
    /// The plugin's socket file name in that directory.
    #[arg(long, default_value = DEFAULT_SOCKET_NAME)]
    pub socket_name: String,
    /// Extended resource registered with the kubelet (with `--scheduler volcano`, the
    /// default becomes `volcano.sh/vgpu-number`).
    #[arg(long, default_value = DEFAULT_RESOURCE_NAME, env = "FGPU_RESOURCE_NAME")]
    pub resource_name: String,
    /// Whose placement decisions `Allocate` reads: fgpu's scheduler extender, or Volcano's
    /// `deviceshare` plugin with vGPU on (registers Volcano's vGPU annotations and the
    /// node's `volcano.sh/vgpu-memory` and `volcano.sh/vgpu-cores`).
    #[arg(long, value_enum, default_value_t = volcano::SchedulerKind::Fgpu, env = "FGPU_SCHEDULER")]
    pub scheduler: volcano::SchedulerKind,
    /// With `--scheduler volcano`: the field manager whose `volcano.sh/vgpu-ids-new` is
    /// trusted (Volcano's scheduler); an allocation written by anyone else is refused. Empty:
    /// not checked (only when an admission policy guards the annotation).
    #[arg(long, default_value = volcano::DEFAULT_SCHEDULER_MANAGER, env = "FGPU_VOLCANO_SCHEDULER_MANAGER")]
    pub volcano_scheduler_manager: String,
    /// Virtual devices advertised per GPU (at most this many containers per GPU).
    #[arg(long, default_value_t = DEFAULT_SPLIT_COUNT, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub split_count: u32,
    /// What Allocate answers: CDI device names, env/mounts/devices, or both.
    #[arg(long, value_enum, default_value_t = AllocateResponseMode::Cdi)]
    pub allocate_response: AllocateResponseMode,
    /// Directory for the per-container CDI specs.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/run/cdi",
        env = "CDI_ROOT"
    )]
    pub cdi_root: PathBuf,
    /// The plugin's node-wide files (ld.so.preload, gpus/).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/fgpu",
        env = "FGPU_STATE_DIR_ROOT"
    )]
    pub state_dir: PathBuf,
    /// The plugin's per-boot files (checkpoint/<uid>.json, claims/<uid>/); best on a tmpfs.
    #[arg(
        long,
        value_name = "DIR",
        default_value = crate::prepare::DEFAULT_RUN_DIR,
        env = "FGPU_RUN_DIR"
    )]
    pub run_dir: PathBuf,
    /// libfgpu.so on the host.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/fgpu/lib/libfgpu.so",
        env = "FGPU_SHIM_LIBRARY"
    )]
    pub shim_library: PathBuf,
    /// Device memory the shim charges to the claim's quota for each CUDA context a process
    /// creates (a Kubernetes quantity, e.g. `300Mi`; 0: contexts are not charged). A real
    /// context holds driver memory the allocation API never reports; measure it on the node's
    /// GPUs and driver (hook-lib/gpu-check) and set it here. Written into every claim's limits
    /// file (`context_overhead`).
    #[arg(
        long,
        value_name = "QUANTITY",
        default_value = "0",
        value_parser = crate::edits::parse_bytes,
        env = "FGPU_CONTEXT_OVERHEAD"
    )]
    pub context_overhead: u64,
    /// A driver file to mount read-only, `HOST[:CONTAINER]` (repeat or comma-separate).
    #[arg(
        long = "driver-file",
        value_name = "HOST[:CONTAINER]",
        value_delimiter = ',',
        env = "FGPU_DRIVER_FILES"
    )]
    pub driver_files: Vec<String>,
    /// With --backend fake: the node's fake GPU state directory shared by every claim's
    /// containers (see `serve --help`).
    #[arg(long, value_name = "DIR", env = "FGPU_FAKE_STATE_DIR")]
    pub fake_state_dir: Option<PathBuf>,
    /// Host root for discovering the driver's files when no --driver-file is given.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/",
        env = "FGPU_DRIVER_ROOT"
    )]
    pub driver_root: PathBuf,
    /// Where the kernel publishes the boot id.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/proc/sys/kernel/random/boot_id"
    )]
    pub boot_id_file: PathBuf,
    /// GPU health checks.
    #[command(flatten)]
    pub health: crate::health::HealthArgs,
    /// Seconds between cleanups of gone pods' files and Node annotation checks.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub resync_seconds: u64,
    /// Async worker threads.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub worker_threads: u16,
    /// The kubelet's pod resources socket, read at each Allocate to learn which pod the
    /// kubelet is admitting; empty: not read (the earliest bind decides).
    #[arg(long, value_name = "FILE", default_value = podresources::DEFAULT_SOCKET)]
    pub pod_resources_socket: PathBuf,
    /// Address of the HTTP endpoint for /metrics and /healthz. Not `serve`'s 9400: both
    /// may run on one node.
    #[arg(
        long,
        default_value = DEFAULT_METRICS_ADDRESS,
        value_name = "ADDR",
        env = "FGPU_METRICS_ADDRESS"
    )]
    pub metrics_address: std::net::SocketAddr,
    /// The node monitor.
    #[command(flatten)]
    pub monitor: crate::monitor::MonitorArgs,
    /// The GPUs' modes, as `serve --gpu-mode`: `shared` (quota shares), `mig` (a MIG
    /// instance per container, sized to its memory) or `whole`; one for every GPU (`mig`)
    /// and/or per GPU index or UUID (`0=mig,1=whole`). The node labels fgpu.dev/gpu-mode and
    /// fgpu.dev/gpu-mode-<index> win over it.
    #[arg(long, value_name = "MODES", default_value = "", env = "FGPU_GPU_MODE")]
    pub gpu_mode: crate::gpu_mode::ModeFlag,
}

/// Runs the device plugin until SIGTERM or SIGINT.
pub fn run(args: DevicePluginArgs) -> anyhow::Result<()> {
    let driver = DriverName::new(args.driver_name.as_str())
        .map_err(|e| anyhow::anyhow!("--driver-name: {e}"))?;
    let explicit = args
        .driver_files
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| crate::driver_files::parse_driver_file(s).map_err(anyhow::Error::from))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (driver_mounts, driver_hooks) = crate::driver_files::for_node(
        explicit,
        args.backend == BackendChoice::Fake,
        &args.driver_root,
        &args.cdi_root,
    )?;
    let backend: Arc<dyn DeviceBackend> = Arc::from(crate::monitor::backend(
        match args.backend {
            BackendChoice::Fake => BackendKind::Fake,
            BackendChoice::Nvml => BackendKind::Nvml,
        },
        args.fake_gpus.as_deref(),
        &args.node,
        args.monitor.fake_nvml_library.as_deref(),
    )?);
    let monitor = args
        .monitor
        .config_for(&args.node, args.backend == BackendChoice::Fake);
    let fake_state_dir = crate::edits::fake_state_dir(
        args.backend == BackendChoice::Fake,
        args.fake_state_dir.clone(),
    )?;
    let boot_id = crate::checkpoint::read_boot_id(&args.boot_id_file)?;
    let cfg = DevicePluginConfig {
        plugin: PluginConfig {
            driver: driver.clone(),
            node_name: args.node.clone(),
            state_root: args.state_dir,
            run_root: args.run_dir,
            cdi_dir: args.cdi_root,
            files: NodeFiles {
                shim_library: args.shim_library,
                driver_mounts,
                driver_hooks,
                fake_driver: args.backend == BackendChoice::Fake,
                fake_state_dir,
                context_overhead: args.context_overhead,
                memory_limits: None,
            },
            boot_id,
            claim_get_timeout: crate::prepare::CLAIM_GET_TIMEOUT,
            test_pause: None,
        },
        dir: args.device_plugin_path,
        socket_name: args.socket_name,
        resource_name: resource_for(args.scheduler, args.resource_name),
        split_count: args.split_count,
        response: args.allocate_response,
        health_interval: args.health.interval(),
        health_policy: args.health.policy(),
        kubelet_poll: Duration::from_secs(1),
        resync: Duration::from_secs(args.resync_seconds),
        pod_resources_socket: Some(args.pod_resources_socket).filter(|p| !p.as_os_str().is_empty()),
        gpu_mode: args.gpu_mode,
        volcano: (args.scheduler == volcano::SchedulerKind::Volcano).then(|| {
            volcano::VolcanoConfig {
                trusted_manager: Some(args.volcano_scheduler_manager.clone())
                    .filter(|m| !m.is_empty()),
            }
        }),
    };
    let runtime =
        crate::serve::runtime(args.worker_threads).context("cannot start the async runtime")?;
    let metrics_addr = args.metrics_address;
    runtime.block_on(async move {
        // Bound before registering: a port in use fails the start, not the scrape.
        let listener = tokio::net::TcpListener::bind(metrics_addr)
            .await
            .with_context(|| format!("--metrics-address {metrics_addr}"))?;
        let client = args.kube.client().await?;
        let writer = NodeAnnotationWriter::new(
            client.clone(),
            &args.node,
            &match args.scheduler {
                volcano::SchedulerKind::Volcano => {
                    fgpu_api::volcano::REGISTER_ANNOTATION.to_owned()
                }
                volcano::SchedulerKind::Fgpu => driver.node_inventory_annotation(),
            },
        );
        let running = start(
            cfg,
            backend.clone(),
            pods::KubePodSource::new(client.clone()),
            Some(writer),
        )
        .await?;
        let (stop_metrics, metrics_stopped) = watch::channel(false);
        let host = running.host();
        let render = Arc::new(move || host.metrics().encode());
        tracing::info!(addr = %metrics_addr, "serving /metrics");
        tokio::spawn(crate::metrics::serve_http(
            listener,
            render,
            metrics_stopped,
        ));
        let (stop_monitor, monitor_stopped) = watch::channel(false);
        if let Some(mcfg) = monitor {
            let m = crate::monitor::Monitor::new(
                mcfg,
                backend,
                running.host(),
                crate::monitor::Consumers::PodUidPrefix,
                Some(client),
            );
            tokio::spawn(m.run(monitor_stopped));
        }
        crate::serve::shutdown_signal().await;
        stop_metrics.send_replace(true);
        stop_monitor.send_replace(true);
        running.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::PrepareState;

    /// The flags as `main.rs` would mount them: a `device-plugin` subcommand.
    #[test]
    fn volcano_flags_handshake_and_resource() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: DevicePluginArgs,
        }
        let a = Cli::try_parse_from(["x", "--node", "n1", "--scheduler", "volcano"])
            .unwrap()
            .args;
        assert_eq!(a.scheduler, volcano::SchedulerKind::Volcano);
        assert_eq!(a.volcano_scheduler_manager, "vc-scheduler");
        assert_eq!(
            resource_for(a.scheduler, a.resource_name),
            "volcano.sh/vgpu-number"
        );
        assert_eq!(
            resource_for(volcano::SchedulerKind::Volcano, "example.com/v".into()),
            "example.com/v"
        );
        assert_eq!(
            resource_for(volcano::SchedulerKind::Fgpu, DEFAULT_RESOURCE_NAME.into()),
            DEFAULT_RESOURCE_NAME
        );
        // Go's layout 2006.01.02 15:04:05, in UTC.
        let t: k8s_openapi::jiff::Timestamp = "2026-12-07T08:05:09Z".parse().unwrap();
        assert_eq!(volcano_handshake(t), "Reported_2026.12.07 08:05:09");
    }

    #[test]
    fn flags_parse_as_a_subcommand() {
        use clap::{CommandFactory as _, Parser as _};
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            command: Command,
        }
        #[derive(clap::Subcommand)]
        enum Command {
            DevicePlugin(Box<DevicePluginArgs>),
        }
        Cli::command().debug_assert();
        let Command::DevicePlugin(a) = Cli::try_parse_from([
            "fgpu-kubelet-plugin",
            "device-plugin",
            "--node",
            "n1",
            "--split-count",
            "4",
            "--allocate-response",
            "both",
            "--resource-name",
            "example.com/vgpu",
            "--gpu-mode",
            "0=mig",
        ])
        .unwrap()
        .command;
        assert_eq!(a.node, "n1");
        assert_eq!(a.split_count, 4);
        assert_eq!(a.allocate_response, AllocateResponseMode::Both);
        assert_eq!(a.resource_name, "example.com/vgpu");
        assert_eq!(
            a.gpu_mode.by_gpu[&crate::gpu_mode::GpuRef::Index(0)],
            fgpu_driver::device::GpuMode::Mig
        );
        assert_eq!(a.socket_name, DEFAULT_SOCKET_NAME);
        assert_eq!(
            a.device_plugin_path,
            PathBuf::from(kubelet::DEVICE_PLUGIN_DIR)
        );
        assert!(
            Cli::try_parse_from(["x", "device-plugin", "--node", "n", "--split-count", "0"])
                .is_err()
        );
        // Metrics: not serve's 9400 by default; an address that does not parse is refused.
        if std::env::var_os("FGPU_METRICS_ADDRESS").is_none() {
            assert_eq!(a.metrics_address.to_string(), "0.0.0.0:9401");
        }
        let parse = |addr: &str| {
            Cli::try_parse_from([
                "x",
                "device-plugin",
                "--node",
                "n",
                "--metrics-address",
                addr,
            ])
            .map(|c| {
                let Command::DevicePlugin(a) = c.command;
                a.metrics_address
            })
        };
        assert_eq!(parse("127.0.0.1:19401").unwrap().port(), 19401);
        let err = parse("localhost").unwrap_err().to_string();
        assert!(err.contains("--metrics-address"), "{err}");
    }

    #[test]
    fn stale_claims_spare_dra_claims_and_live_containers() {
        let ann = "gpu.fgpu.dev/assigned-devices";
        let rec = |name: &str| ClaimRecord {
            namespace: "ns".into(),
            name: name.into(),
            state: PrepareState::PrepareCompleted,
            spec_file: "/x".into(),
            claim_dir: "/y".into(),
            devices: vec![],
        };
        let records = [
            ("u1-main".to_owned(), rec("p1/main")),
            ("u1-side".to_owned(), rec("p1/side")),
            ("u2-main".to_owned(), rec("p2/main")),
            ("dra-claim".to_owned(), rec("claim")),
        ]
        .into();
        let decision = r#"{"node":"n","containers":[{"index":0,"name":"main","devices":[{"id":"gpu-0","uuid":"GPU-a","memoryBytes":1,"cores":0}]}]}"#;
        let p1 = PodInfo {
            namespace: "ns".into(),
            name: "p1".into(),
            uid: "u1".into(),
            node_name: "n".into(),
            phase: "Running".into(),
            annotations: [(ann.to_owned(), decision.to_owned())].into(),
            ..Default::default()
        };
        let mut p2 = p1.clone();
        p2.name = "p2".into();
        p2.uid = "u2".into();
        p2.phase = "Succeeded".into();
        let stale: Vec<String> = stale_claims(&records, &[p1, p2], ann)
            .into_iter()
            .map(|c| c.uid)
            .collect();
        assert_eq!(stale, ["u1-side", "u2-main"]);
    }
}
