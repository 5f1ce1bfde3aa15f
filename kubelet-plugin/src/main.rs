//! `fgpu-kubelet-plugin`: fgpu's node daemon.
//!
//! `discover` enumerates the node's GPUs through a device backend and prints them; `serve`
//! runs the DRA kubelet plugin; `mig-profiles` compares NVML's MIG profiles with fgpu's
//! tables. The binary stays thin: the device model and backends live in
//! `fgpu_driver`, the plugin in this crate's library (`fgpu_kubelet_plugin`).

mod discover;
mod fake_fault;
#[cfg(feature = "nvml")]
mod mig_profiles;
mod serve_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use fgpu_driver::backend::BackendError;
use fgpu_plumbing::exit;
use fgpu_plumbing::logging::LogArgs;

/// fgpu's node daemon: shares GPUs by memory and compute quota through Kubernetes DRA.
///
/// Runs on every GPU node. `serve` is the DRA kubelet plugin (registration, DRA gRPC,
/// ResourceSlices, per-claim CDI specs); `discover` lists the node's GPUs as a device
/// backend sees them.
#[derive(Debug, Parser)]
#[command(
    name = "fgpu-kubelet-plugin",
    version,
    after_help = "Exit status: 0 on success, 2 for bad input (flags, malformed fake profile, unknown node), 1 for other failures."
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Enumerate the node's GPUs through a device backend and print the inventory.
    Discover(DiscoverArgs),
    /// Run the DRA kubelet plugin: register with the kubelet, prepare and unprepare claims,
    /// publish the node's ResourceSlice (library: `fgpu_kubelet_plugin::serve`).
    Serve(Box<serve_cmd::ServeArgs>),
    /// Run the kubelet device plugin of the legacy path (clusters below 1.32, with
    /// `fgpu-controller extender`): `nvidia.com/gpu` as N shares per GPU; Allocate writes the
    /// same CDI spec and claim files as the DRA path.
    DevicePlugin(Box<fgpu_kubelet_plugin::device_plugin::DevicePluginArgs>),
    /// Inject or clear a fault on a GPU of a fake profile (`--backend fake`): the plugin's
    /// next health check sees it (`mig-create-fails`: its next MIG instance creation).
    FakeFault(fake_fault::FakeFaultArgs),
    /// List every GPU's MIG mode and GPU instance profiles and placements through NVML and
    /// compare them with fgpu's profile table for its model. Read-only: never enables MIG
    /// mode or changes a setting.
    #[cfg(feature = "nvml")]
    MigProfiles(mig_profiles::MigProfilesArgs),
    /// Hooks the container runtime runs from a claim's CDI spec (not for people).
    #[command(subcommand, hide = true)]
    CdiHook(CdiHook),
}

#[derive(Debug, Subcommand)]
enum CdiHook {
    /// createRuntime: set the driver's device-memory limit on the new container's cgroup
    /// (its state on stdin), for each GPU of the claim whose driver has such limits.
    #[cfg(feature = "nvml")]
    MemoryLimit(fgpu_kubelet_plugin::driver_limits::HookArgs),
}

#[derive(Debug, clap::Args)]
struct DiscoverArgs {
    #[command(flatten)]
    gpus: BackendArgs,

    /// Kubernetes node name. With a multi-node fake profile, picks that node (all nodes are
    /// printed without it). With nvml, names the inventory (default: $NODE_NAME, else the
    /// host name).
    #[arg(long, value_name = "NAME")]
    node: Option<String>,

    /// Output format: an aligned `table`, or `json` (an array of node inventories).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Where a subcommand's GPUs come from (shared by `discover` and `serve`).
#[derive(Debug, clap::Args)]
struct BackendArgs {
    /// Where GPUs come from: `nvml` asks the NVIDIA driver (needs libnvidia-ml.so.1);
    /// `fake` reads the YAML profile given by --fake-gpus.
    #[arg(long, value_enum, default_value_t = Backend::Nvml, env = "FGPU_BACKEND")]
    backend: Backend,

    /// YAML profile describing the GPUs of one node or of a fake cluster (schema:
    /// deploy/fake/README.md). Required with --backend fake.
    #[arg(
        long,
        value_name = "FILE",
        required_if_eq("backend", "fake"),
        env = "FGPU_FAKE_GPUS"
    )]
    fake_gpus: Option<PathBuf>,
}

/// Device backends selectable on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// NVML (a node with the NVIDIA driver).
    Nvml,
    /// A YAML profile (no GPU needed).
    Fake,
}

/// Output formats of `discover`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// Aligned columns.
    Table,
    /// JSON.
    Json,
}

/// An error that the user's input caused (exit status 2), as opposed to a failure.
pub(crate) use fgpu_plumbing::exit::BadInput;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        return exit::report(&e, |_| false);
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report(&e),
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Discover(args) => discover::run(&args),
        Command::Serve(args) => serve_cmd::run(*args),
        Command::DevicePlugin(args) => fgpu_kubelet_plugin::device_plugin::run(*args),
        Command::FakeFault(args) => fake_fault::run(&args),
        #[cfg(feature = "nvml")]
        Command::MigProfiles(args) => mig_profiles::run(&args),
        #[cfg(feature = "nvml")]
        Command::CdiHook(CdiHook::MemoryLimit(args)) => {
            Ok(fgpu_kubelet_plugin::driver_limits::hook_main(&args)?)
        }
    }
}

/// Prints the error as one line on stderr and picks the exit status: bad input (2) also
/// for a device backend's input errors (a malformed profile, an unknown node).
fn report(e: &anyhow::Error) -> ExitCode {
    exit::report(e.as_ref(), |c| {
        c.downcast_ref::<BackendError>()
            .is_some_and(BackendError::is_bad_input)
    })
}
