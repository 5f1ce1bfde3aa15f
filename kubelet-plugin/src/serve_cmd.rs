//! `serve`: flags → [`fgpu_kubelet_plugin::serve::ServeConfig`], then the library's loop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use fgpu_api::names::{DriverName, kubelet};
use fgpu_driver::backend::DeviceBackend as _;
use fgpu_kubelet_plugin::driver_files;
use fgpu_kubelet_plugin::edits::{FileMount, NodeFiles};
use fgpu_kubelet_plugin::serve::{ServeConfig, run as serve};

use crate::{Backend, BackendArgs, BadInput};

/// Flags of `serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    kube: fgpu_plumbing::client::KubeArgs,

    /// Kubernetes node name (the DaemonSet sets it from the downward API).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    node: String,

    /// DRA driver name.
    #[arg(long, env = "FGPU_DRIVER_NAME", default_value = fgpu_api::names::DEFAULT_DRIVER_NAME)]
    driver_name: String,

    #[command(flatten)]
    gpus: BackendArgs,

    #[command(flatten)]
    monitor: fgpu_kubelet_plugin::monitor::MonitorArgs,

    #[command(flatten)]
    health: fgpu_kubelet_plugin::health::HealthArgs,

    #[command(flatten)]
    taints: fgpu_kubelet_plugin::health::TaintArgs,

    #[command(flatten)]
    modes: fgpu_kubelet_plugin::gpu_mode::ModeArgs,

    /// The kubelet's plugin registry directory (registration socket).
    #[arg(long, value_name = "DIR", default_value = kubelet::REGISTRY_DIR, env = "KUBELET_REGISTRAR_DIRECTORY_PATH")]
    kubelet_registrar_directory_path: PathBuf,

    /// The kubelet's plugins directory (DRA socket in <dir>/<driver>/dra.sock).
    #[arg(long, value_name = "DIR", default_value = kubelet::PLUGINS_DIR, env = "KUBELET_PLUGINS_DIRECTORY_PATH")]
    kubelet_plugins_directory_path: PathBuf,

    /// Directory for the per-claim CDI specs.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/run/cdi",
        env = "CDI_ROOT"
    )]
    cdi_root: PathBuf,

    /// The plugin's node-wide files: ld.so.preload and gpus/ (claims' task priorities).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/var/lib/fgpu",
        env = "FGPU_STATE_DIR_ROOT"
    )]
    state_dir: PathBuf,

    /// The plugin's per-boot files, written by every prepare: checkpoint/<uid>.json and
    /// claims/<uid>/ (state dir, limits). Should be on a tmpfs (/run is on most
    /// distributions): a prepare there costs no disk I/O, and nothing in it outlives a reboot
    /// (the boot id discards it anyway).
    #[arg(
        long,
        value_name = "DIR",
        default_value = fgpu_kubelet_plugin::prepare::DEFAULT_RUN_DIR,
        env = "FGPU_RUN_DIR"
    )]
    run_dir: PathBuf,

    /// libfgpu.so on the host, mounted read-only into every claim's containers.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/var/lib/fgpu/lib/libfgpu.so",
        env = "FGPU_SHIM_LIBRARY"
    )]
    shim_library: PathBuf,

    /// Device memory the shim charges to the claim's quota for each CUDA context a process
    /// creates (a Kubernetes quantity, e.g. `300Mi`; 0: contexts are not charged). A real
    /// context holds driver memory the allocation API never reports; measure it on the node's
    /// GPUs and driver (hook-lib/gpu-check) and set it here. Written into every claim's limits
    /// file (`context_overhead`).
    #[arg(
        long,
        value_name = "QUANTITY",
        default_value = "0",
        value_parser = fgpu_kubelet_plugin::edits::parse_bytes,
        env = "FGPU_CONTEXT_OVERHEAD"
    )]
    context_overhead: u64,

    /// A driver file to mount read-only into containers, `HOST[:CONTAINER]` (repeat it, or
    /// separate with commas): the CUDA/NVML libraries and nvidia-smi; with --backend fake
    /// the fake CUDA libraries.
    #[arg(
        long = "driver-file",
        value_name = "HOST[:CONTAINER]",
        value_delimiter = ',',
        env = "FGPU_DRIVER_FILES"
    )]
    driver_files: Vec<String>,

    /// With --backend fake: the node's fake GPU state directory, shared read-write by every
    /// claim's containers (mounted at /run/fgpu-fake, FAKE_CUDA_STATE=/run/fgpu-fake/gpu) so
    /// that they share one fake GPU; give the plugin FAKE_CUDA_STATE=<DIR>/gpu for the node
    /// monitor. Created at start.
    #[arg(long, value_name = "DIR", env = "FGPU_FAKE_STATE_DIR")]
    fake_state_dir: Option<PathBuf>,

    /// Where the host's root file system is mounted, for discovering the driver's files
    /// when neither --driver-file nor the NVIDIA container toolkit's CDI spec names them.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/",
        env = "FGPU_DRIVER_ROOT"
    )]
    driver_root: PathBuf,

    /// Where the kernel publishes the boot id.
    #[arg(
        long,
        value_name = "FILE",
        default_value = "/proc/sys/kernel/random/boot_id"
    )]
    boot_id_file: PathBuf,

    /// Publish devices with consumable capacity (shares scheduled by kube-scheduler); falls
    /// back to plain devices where the cluster drops the field.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    consumable_capacity: bool,

    /// Driver-native memory limits: `auto` sets the driver's per-cgroup device-memory limit
    /// on each container of a claim (a CDI createRuntime hook) on every GPU whose driver has
    /// such limits (NVIDIA r615+, cgroup v2, no MIG; with --backend fake, the fake NVML of
    /// --fake-nvml-library), and publishes those GPUs with `enforcement: driver`; `off`:
    /// the shim alone (`enforcement: shim`).
    #[arg(
        long,
        value_enum,
        default_value_t = fgpu_kubelet_plugin::driver_limits::LimitsMode::Auto,
        value_name = "MODE",
        env = "FGPU_DRIVER_MEMORY_LIMITS"
    )]
    driver_memory_limits: fgpu_kubelet_plugin::driver_limits::LimitsMode,

    /// Seconds between ResourceSlice republishing and stale-claim cleanup.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    resync_seconds: u64,

    /// The kubelet's pod resources socket, read by the node monitor to name the container
    /// of each process in the per-container metrics; empty: not read (no container names).
    #[arg(long, value_name = "FILE", default_value = fgpu_kubelet_plugin::podresources::DEFAULT_SOCKET)]
    pod_resources_socket: PathBuf,

    /// Address of the HTTP endpoint for /metrics and /healthz.
    #[arg(
        long,
        default_value = "0.0.0.0:9400",
        value_name = "ADDR",
        env = "FGPU_METRICS_ADDRESS"
    )]
    metrics_address: SocketAddr,

    /// Threads serving gRPC and the API server. The plugin's work is small and mostly
    /// waiting; a few threads keep its memory low on nodes with many CPUs. File writes run
    /// on a separate pool of at most 4 threads.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    worker_threads: u16,

    /// Keep this node's allocated ResourceClaims in memory, fed by a watch on claims in all
    /// namespaces, and prepare from that copy when it is current (else GET the claim, as
    /// with false). Needs list and watch on resourceclaims (deploy/kubelet-plugin/rbac.yaml).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL", env = "FGPU_CLAIM_CACHE")]
    claim_cache: bool,

    /// Crash tests only: pause this long after writing a claim's files, before recording it
    /// PrepareCompleted, so that a test can kill the plugin between the two phases.
    #[arg(
        long,
        hide = true,
        value_name = "SECONDS",
        env = "FGPU_TEST_PAUSE_PREPARE_SECONDS"
    )]
    test_pause_prepare_seconds: Option<u64>,
}

fn file_mount(spec: &str) -> anyhow::Result<FileMount> {
    driver_files::parse_driver_file(spec).map_err(|e| BadInput(e.to_string()).into())
}

/// Runs `serve` until SIGTERM / SIGINT, or until the kubelet refuses the registration.
pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    let driver = DriverName::new(args.driver_name.as_str())
        .map_err(|e| BadInput(format!("--driver-name: {e}")))?;
    if args.resync_seconds == 0 {
        return Err(BadInput("--resync-seconds: must be at least 1".into()).into());
    }
    let explicit = args
        .driver_files
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| file_mount(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (driver_mounts, driver_hooks) = driver_files::for_node(
        explicit,
        args.gpus.backend == Backend::Fake,
        &args.driver_root,
        &args.cdi_root,
    )?;
    let backend = fgpu_kubelet_plugin::monitor::backend(
        match args.gpus.backend {
            Backend::Fake => fgpu_driver::backend::BackendKind::Fake,
            Backend::Nvml => fgpu_driver::backend::BackendKind::Nvml,
        },
        args.gpus.fake_gpus.as_deref(),
        &args.node,
        args.monitor.fake_nvml_library.as_deref(),
    )?;
    let fake = args.gpus.backend == Backend::Fake;
    let (backend, memory_limits) = driver_limits(
        backend,
        args.driver_memory_limits,
        fake,
        args.monitor.fake_nvml_library.as_deref(),
        &args.state_dir,
        &args.run_dir,
    )?;
    let fake_state_dir = fgpu_kubelet_plugin::edits::fake_state_dir(
        args.gpus.backend == Backend::Fake,
        args.fake_state_dir,
    )?;
    let monitor = args
        .monitor
        .config_for(&args.node, args.gpus.backend == Backend::Fake);
    let cfg = ServeConfig {
        driver,
        node_name: args.node,
        registrar_dir: args.kubelet_registrar_directory_path,
        plugins_dir: args.kubelet_plugins_directory_path,
        cdi_dir: args.cdi_root,
        state_dir: args.state_dir,
        run_dir: args.run_dir,
        files: NodeFiles {
            shim_library: args.shim_library,
            driver_mounts,
            driver_hooks,
            fake_driver: args.gpus.backend == Backend::Fake,
            fake_state_dir,
            context_overhead: args.context_overhead,
            memory_limits,
        },
        boot_id_path: args.boot_id_file,
        consumable_capacity: args.consumable_capacity,
        resync: Duration::from_secs(args.resync_seconds),
        metrics_addr: Some(args.metrics_address),
        pod_resources_socket: (!args.pod_resources_socket.as_os_str().is_empty())
            .then_some(args.pod_resources_socket),
        claim_cache: args.claim_cache,
        test_pause: args.test_pause_prepare_seconds.map(Duration::from_secs),
        monitor,
        health: args.health,
        taints: args.taints,
        modes: args.modes,
    };
    let runtime = fgpu_kubelet_plugin::serve::runtime(args.worker_threads)
        .context("cannot start the async runtime")?;
    let args_kube = args.kube.clone();
    runtime.block_on(async move {
        let client = args_kube.client().await?;
        serve(
            cfg,
            client,
            Arc::from(backend),
            fgpu_kubelet_plugin::serve::shutdown_signal(),
        )
        .await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// The backend with its GPUs marked where the driver limits memory, and the hook for the
/// claims' specs (`None`: off, or no GPU has the limits).
fn driver_limits(
    backend: Box<dyn fgpu_driver::backend::DeviceBackend>,
    mode: fgpu_kubelet_plugin::driver_limits::LimitsMode,
    fake: bool,
    fake_nvml: Option<&std::path::Path>,
    state_dir: &std::path::Path,
    run_dir: &std::path::Path,
) -> anyhow::Result<(
    Box<dyn fgpu_driver::backend::DeviceBackend>,
    Option<fgpu_kubelet_plugin::edits::LimitHook>,
)> {
    use fgpu_driver::device::Enforcement;
    use fgpu_kubelet_plugin::driver_limits::{self as dl, LimitsMode};
    if mode == LimitsMode::Off {
        return Ok((backend, None));
    }
    let lib = match (fake, fake_nvml) {
        (false, _) => PathBuf::from(fgpu_driver::backend::nvml::NVML_LIBRARY),
        (true, Some(l)) => l.to_owned(),
        (true, None) => return Ok((backend, None)),
    };
    let marked = match dl::Marked::new(backend, &lib) {
        Ok(m) => m,
        Err((backend, why)) => {
            tracing::info!(library = %lib.display(), reason = %why,
                "driver memory limits off: enforcement: shim");
            return Ok((backend, None));
        }
    };
    let any = marked
        .enumerate()
        .map(|gpus| gpus.iter().any(|g| g.enforcement == Enforcement::Driver))
        .unwrap_or(false);
    if !any {
        tracing::info!(library = %lib.display(),
            "no GPU's driver limits memory per cgroup: enforcement: shim");
        return Ok((Box::new(marked), None));
    }
    let program = dl::install_program(state_dir).with_context(|| {
        format!(
            "cannot install the memory-limit hook's program in {}/bin",
            state_dir.display()
        )
    })?;
    tracing::info!(program = %program.display(), library = %lib.display(),
        "driver memory limits on: each claim's containers get the driver's limit");
    let hook = fgpu_kubelet_plugin::edits::LimitHook {
        program,
        nvml_library: lib,
        run_dir: run_dir.to_owned(),
        env: if fake { dl::fake_env() } else { Vec::new() },
    };
    Ok((Box::new(marked), Some(hook)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_file_flags() {
        assert_eq!(
            file_mount("/usr/lib/libcuda.so.1").unwrap(),
            FileMount::same("/usr/lib/libcuda.so.1")
        );
        assert_eq!(
            file_mount("/opt/fake/libcuda.so.1:/usr/lib/x86_64-linux-gnu/libcuda.so.1").unwrap(),
            FileMount {
                host_path: "/opt/fake/libcuda.so.1".into(),
                container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
            }
        );
        let e = file_mount("libcuda.so.1").unwrap_err();
        assert!(e.downcast_ref::<BadInput>().is_some());
        assert!(e.to_string().contains("paths must be absolute"), "{e}");
    }
}
