//! A claim's container edits and its CDI spec. Pure: nothing is written here.
//!
//! Per claim, one spec of kind `<driver>/claim` with one device per allocation result,
//! named `<claim uid>-<device>[-<shareID>]`:
//!
//! * each device's own edits: its GPU's device node (`/dev/nvidia<minor>`);
//! * the spec's common edits (applied whenever any of its devices is injected):
//!   - the control device nodes (`nvidiactl`, `nvidia-uvm`, ...), each once;
//!   - the driver's user-space files (libraries, `nvidia-smi`), read-only, as given in
//!     [`NodeFiles::driver_mounts`];
//!   - `libfgpu.so` at [`SHIM_CONTAINER_PATH`] and an `/etc/ld.so.preload` naming it, both
//!     read-only;
//!   - the files of the plugin-shim contract (`docs/shim-contract.md`, version 2), each
//!     mounted on its own (a mount point cannot be unlinked or renamed, so the workload
//!     cannot replace one):
//!     - the limits file ([`limits_content`]) at `/etc/fgpu/claims/<uid>/limits`,
//!       read-only;
//!     - the accounts `memory.state` and `core.state` at `/run/fgpu/claims/<uid>/`
//!       (read-write, `nosuid`, `nodev`, `noexec`), shared by every container of the claim;
//!     - the utilisation feed directory at `/run/fgpu/claims/<uid>/feed` (read-only);
//!     - each GPU's priority file at `/run/fgpu/gpus/<GPU-UUID>.priority`: read-write when
//!       the claim's priority is `high` (it stamps the file to hold back low-priority
//!       launches on the GPU), read-only otherwise (it only reads the stamp);
//!   - the environment (`FGPU_*` and HAMi-core's names): informational for tools and for
//!     older shims; the version-2 shim takes its limits only from the files.
//!
//! A claim of MIG placement devices (`gpu-<index>-mig-<profile>-<start>`, see
//! `docs/mig.md`) gets no shim: each device's own edits are its instance's capability
//! nodes, the common edits the parent GPU's node and the control nodes, the driver's files
//! and `NVIDIA_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES` naming the instances. The hardware
//! holds the instance's memory and compute; the driver reports the instance's memory as
//! the device's total. A claim that mixes MIG devices with GPUs or shares is refused.
//!
//! Device ordinals: the distinct GPUs of the claim sorted by PCI bus id, the order CUDA uses
//! with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (set here) and NVML always uses. Several shares of
//! one GPU in a claim are one device to the container: their memory and cores add up. The
//! indexed variables (`FGPU_MEMORY_LIMIT_<i>`, ...) are exact for a container that uses the
//! whole claim; the plain forms are set too when every GPU has the same grant, so a
//! container that uses only some requests of such a claim is still right.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fgpu_api::config::{CorePercent, Priority};
use fgpu_api::names::{self, DriverName, contract, env};
use fgpu_driver::cdi::{
    CdiError, CdiSpec, ContainerEdits, DeviceNodeEdit, HookEdit, HookName, MountEdit, SpecBuilder,
};
use fgpu_driver::device::{Enforcement, Gpu, NodeInventory, TierRatio};
use fgpu_driver::mig::{self, MigInstance, Placement};

use crate::checkpoint::{MigIntent, PreparedDevice};
use crate::grant::ResolvedResult;

/// Where `libfgpu.so` appears in containers.
pub const SHIM_CONTAINER_PATH: &str = "/usr/lib/fgpu/libfgpu.so";
/// Mode of the node's GPU directory on the host (`<state root>/gpus`): only the plugin
/// creates files in it, one `<GPU-UUID>.priority` per GPU ([`contract::SHARED_FILE_MODE`]).
pub const GPU_DIR_MODE: u32 = 0o755;
/// Where a fake node's GPU state directory appears in containers (`--fake-state-dir`).
pub const FAKE_STATE_CONTAINER: &str = "/run/fgpu-fake";
/// The fake GPU state file in that directory (`FAKE_CUDA_STATE`); the fake driver keeps
/// its other tables beside it, in [`FAKE_STATE_FILES`].
pub const FAKE_STATE_FILE: &str = "gpu";
/// The fake driver's files of one state (`tests/fake-cuda/README.md`), pre-created
/// writable for every UID by the plugin so that non-root containers can map them.
pub const FAKE_STATE_FILES: [&str; 5] = ["gpu", "gpu.procs", "gpu.live", "gpu.limits", "gpu.gpus"];

/// Creates a fake node's GPU state directory and the fake driver's files in it, writable
/// by every UID (the fake stands for a device every container of the node may use), and
/// checks that the plugin's own reader (`FAKE_CUDA_STATE` in its environment, for the
/// node monitor) names the same state; a mismatch is returned as a warning.
pub fn create_fake_state(dir: &Path) -> std::io::Result<Option<String>> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for f in FAKE_STATE_FILES {
        let p = dir.join(f);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666))?;
    }
    let want = dir.join(FAKE_STATE_FILE);
    Ok(match std::env::var_os("FAKE_CUDA_STATE") {
        Some(v) if Path::new(&v) == want => None,
        v => Some(format!(
            "--fake-state-dir {}: the containers' fake GPU state is {}, but this process's FAKE_CUDA_STATE is {:?}: the node monitor reads another state and sees none of them",
            dir.display(),
            want.display(),
            v.unwrap_or_default()
        )),
    })
}

/// A daemon's `--fake-state-dir` (`serve`, `device-plugin`): checked (fake backend only, an
/// absolute path: bad input otherwise) and created ([`create_fake_state`]).
pub fn fake_state_dir(fake: bool, dir: Option<PathBuf>) -> anyhow::Result<Option<PathBuf>> {
    use anyhow::Context as _;
    use fgpu_plumbing::exit::BadInput;
    let Some(dir) = dir else { return Ok(None) };
    if !fake {
        return Err(BadInput("--fake-state-dir: only with --backend fake".into()).into());
    }
    if !dir.is_absolute() {
        return Err(BadInput(format!(
            "--fake-state-dir {}: must be absolute",
            dir.display()
        ))
        .into());
    }
    match create_fake_state(&dir).with_context(|| format!("--fake-state-dir {}", dir.display()))? {
        Some(warning) => tracing::warn!("{warning}"),
        None => {
            tracing::info!(dir = %dir.display(), "fake GPU state shared by the node's containers")
        }
    }
    Ok(Some(dir))
}

/// Mode of a claim's feed directory on the host (the node monitor writes it).
pub const FEED_DIR_MODE: u32 = 0o755;
/// The preload file in containers.
pub const PRELOAD_CONTAINER: &str = "/etc/ld.so.preload";
/// HAMi-core's shared accounting file (`CUDA_DEVICE_MEMORY_SHARED_CACHE`), for images that
/// bring HAMi-core: in the container's own `/tmp` (fgpu's shim does not use it; there is no
/// claim-wide directory a non-root HAMi-core could create it in).
pub const HAMI_CACHE_CONTAINER: &str = "/tmp/fgpu-hami.cache";
/// The core policy written to the limits file (the shim's default).
pub const CORE_POLICY: &str = "limit";
/// Prefix of fgpu's device names in its ResourceSlices: `gpu-<minor>`.
pub const DEVICE_PREFIX: &str = "gpu-";

/// Mount options of read-only files.
const RO: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];
/// Mount options of the accounts and of a high-priority claim's priority files.
const STATE_RW: [&str; 5] = ["rw", "nosuid", "nodev", "noexec", "bind"];
/// Mount options of read-only data (the feed, other claims' priority files).
const DATA_RO: [&str; 5] = ["ro", "nosuid", "nodev", "noexec", "bind"];

/// A host file or directory mounted read-only into containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMount {
    /// Path on the host.
    pub host_path: PathBuf,
    /// Path in the container.
    pub container_path: PathBuf,
}

impl FileMount {
    /// A mount at the same path on both sides.
    pub fn same(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self {
            host_path: path.clone(),
            container_path: path,
        }
    }
}

/// What every claim's containers get besides their GPUs, fixed per node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFiles {
    /// `libfgpu.so` on the host.
    pub shim_library: PathBuf,
    /// The driver's user-space libraries and tools (`nvidia-smi`), mounted read-only. On a
    /// fake node: the fake CUDA and NVML libraries.
    pub driver_mounts: Vec<FileMount>,
    /// Hooks that come with the driver files (the NVIDIA container toolkit's ld-cache and
    /// symlink hooks), see [`crate::driver_files`].
    pub driver_hooks: Vec<HookEdit>,
    /// The node's GPUs are the `fake` backend's: the fake CUDA driver in the container is
    /// told which GPUs the claim holds (`FAKE_CUDA_UUIDS`, in the container's order), as a
    /// real driver sees only the device nodes it was given. Without it the fake would report
    /// its own UUIDs, which no claim names, and the shim would rightly refuse them.
    pub fake_driver: bool,
    /// A fake node's GPU state directory (`--fake-state-dir`): mounted read-write at
    /// [`FAKE_STATE_CONTAINER`] in every claim's containers with `FAKE_CUDA_STATE` naming
    /// its `gpu` file, so that all the node's containers share one fake GPU (its timeline,
    /// its process list) as they would share a real one, and the node monitor sees them.
    pub fake_state_dir: Option<PathBuf>,
    /// Bytes the shim charges per CUDA context (`--context-overhead`; 0: none), written into
    /// the limits file as `context_overhead`.
    pub context_overhead: u64,
    /// The driver-native limits hook (`crate::driver_limits`): each claim's spec runs it
    /// for its GPUs marked `enforcement: driver`. `None`: off on this node.
    pub memory_limits: Option<LimitHook>,
}

/// A byte quantity flag (`300Mi`, `0`): clap's value parser (clap shows the error after
/// the flag's name).
pub fn parse_bytes(s: &str) -> Result<u64, fgpu_api::quantity::QuantityError> {
    fgpu_api::quantity::parse_u64(s)
}

/// The hook subcommand's words after the program.
pub const HOOK_ARGS: [&str; 2] = ["cdi-hook", "memory-limit"];
/// Seconds the runtime lets the hook run.
pub const HOOK_TIMEOUT_SECONDS: i64 = 10;

/// What a claim's CDI spec needs to run the hook, fixed per node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitHook {
    /// This binary on the host (copied to `<state dir>/bin/` at start, see
    /// `driver_limits::install_program`).
    pub program: PathBuf,
    /// The NVML library the hook loads (`libnvidia-ml.so.1`, or the fake driver's).
    pub nvml_library: PathBuf,
    /// The plugin's run directory (the claims' directories, where records go).
    pub run_dir: PathBuf,
    /// Environment of the hook (`NAME=value`; a fake node's `FAKE_CUDA_*`).
    pub env: Vec<String>,
}

/// The hook of one claim's spec: `limits` are (GPU UUID, bytes) in container order.
pub fn hook_edit(hook: &LimitHook, claim_uid: &str, limits: &[(String, u64)]) -> HookEdit {
    let mut args = vec![program_name(&hook.program)];
    args.extend(HOOK_ARGS.iter().map(|s| (*s).to_owned()));
    args.extend([
        "--claim".to_owned(),
        claim_uid.to_owned(),
        "--nvml-library".to_owned(),
        hook.nvml_library.display().to_string(),
        "--run-dir".to_owned(),
        hook.run_dir.display().to_string(),
    ]);
    for (uuid, bytes) in limits {
        args.push("--limit".to_owned());
        args.push(format!("{uuid}={bytes}"));
    }
    HookEdit {
        hook_name: HookName::CreateRuntime,
        path: hook.program.clone(),
        args,
        env: hook.env.clone(),
        timeout: Some(HOOK_TIMEOUT_SECONDS),
    }
}

fn program_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Host paths of one claim's files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimPaths {
    /// The claim's UID.
    pub uid: String,
    /// `<run root>/claims/<uid>` (0700): holds the state and feed directories and the
    /// limits file. Per boot, so on the run root (a tmpfs on real nodes: `/run/fgpu`).
    pub claim_dir: PathBuf,
    /// `<claim dir>/state` (0700): holds the accounts (never mounted itself).
    pub state_dir: PathBuf,
    /// `<state dir>/memory.state` (0666, zero-filled), mounted at
    /// [`contract::memory_account`].
    pub memory_account: PathBuf,
    /// `<state dir>/core.state` (0666, zero-filled), mounted at [`contract::core_account`].
    pub core_account: PathBuf,
    /// `<claim dir>/feed` ([`FEED_DIR_MODE`]), mounted read-only at [`contract::feed_dir`].
    pub feed_dir: PathBuf,
    /// `<claim dir>/limits` (0444), mounted at [`contract::limits_file`].
    pub limits_file: PathBuf,
    /// `<state root>/ld.so.preload` (0444), mounted at [`PRELOAD_CONTAINER`]: one file for
    /// every claim of the node (its content, [`preload_content`], is the same for all), so a
    /// prepare creates one file fewer.
    pub preload_file: PathBuf,
    /// `<cdi dir>/<driver>-claim_<uid>.json`.
    pub spec_file: PathBuf,
    /// `<state root>/gpus` ([`GPU_DIR_MODE`]): the GPUs' priority files, each mounted on its
    /// own at [`contract::priority_file`].
    pub gpu_dir: PathBuf,
}

impl ClaimPaths {
    /// The paths of claim `uid`: its directory under the plugin's `run_root`, the node-wide
    /// files under `state_root`, its spec in the CDI directory.
    pub fn new(
        state_root: &Path,
        run_root: &Path,
        cdi_dir: &Path,
        driver: &DriverName,
        uid: &str,
    ) -> Self {
        let claim_dir = claims_dir(run_root).join(uid);
        let state_dir = claim_dir.join("state");
        Self {
            uid: uid.to_owned(),
            memory_account: state_dir.join(contract::MEMORY_ACCOUNT),
            core_account: state_dir.join(contract::CORE_ACCOUNT),
            state_dir,
            feed_dir: claim_dir.join(contract::FEED_DIR),
            limits_file: claim_dir.join("limits"),
            preload_file: state_root.join("ld.so.preload"),
            spec_file: cdi_dir.join(driver.cdi_spec_file_name(uid)),
            gpu_dir: gpu_dir(state_root),
            claim_dir,
        }
    }
}

/// The content of the preload file: the shim at its path in containers.
pub fn preload_content() -> String {
    format!("{SHIM_CONTAINER_PATH}\n")
}

/// The directory of the claims' directories under `root` (the run root; the state root
/// before the run root existed).
pub fn claims_dir(root: &Path) -> PathBuf {
    root.join("claims")
}

/// The node's GPU directory (the priority files) under the plugin's `state_root`.
pub fn gpu_dir(state_root: &Path) -> PathBuf {
    state_root.join("gpus")
}

/// The priority file of GPU `uuid` in the node's GPU directory `gpu_dir`.
pub fn priority_file(gpu_dir: &Path, uuid: &str) -> PathBuf {
    gpu_dir.join(contract::priority_file_name(uuid))
}

/// The claim being prepared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
}

impl ClaimRef {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One allocation result placed on a GPU of this node, with bytes resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedDevice {
    /// The request the result serves.
    pub request: String,
    /// Pool and device name as allocated.
    pub pool: String,
    /// Device name (`gpu-<minor>`).
    pub device: String,
    /// Share id, if a share.
    pub share_id: Option<String>,
    /// The GPU.
    pub gpu: Gpu,
    /// Granted memory in bytes.
    pub memory_bytes: u64,
    /// Granted cores.
    pub cores: CorePercent,
    /// Priority.
    pub priority: Priority,
    /// Whether the share is on the research tier (its class said `oversubscribe: true`).
    pub oversubscribe: bool,
    /// Its GPU's oversubscription ratio ([`TierRatio::NONE`] off the research tier), as
    /// [`crate::tier::check`] set it.
    pub tier: TierRatio,
    /// For a MIG placement device: the instance it stands for. `None` for a GPU or a
    /// share of one.
    pub mig: Option<PlannedMig>,
}

/// The MIG instance of a placement device: its profile and placement, and the instance
/// once the backend created (or found) it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedMig {
    /// The profile, e.g. `1g.10gb`.
    pub profile: &'static str,
    /// Where on the parent GPU.
    pub placement: Placement,
    /// The instance; `None` until it exists.
    pub instance: Option<MigInstance>,
}

/// The limits of one GPU as a container of the whole claim sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuLimit {
    /// CUDA/NVML ordinal in the container.
    pub ordinal: usize,
    /// The GPU's UUID.
    pub uuid: String,
    /// Memory quota in bytes.
    pub memory_bytes: u64,
    /// Core quota in percent; 0 = not throttled.
    pub cores: u8,
    /// On a research-tier GPU: the part of `memory_bytes` device memory backs (the grant
    /// divided by the ratio, floored); the shim serves the rest with managed memory.
    /// `None` off the tier.
    pub physical_bytes: Option<u64>,
}

/// Everything prepare writes for a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimEdits {
    /// The validated CDI spec.
    pub spec: CdiSpec,
    /// Devices for the kubelet, in allocation-result order.
    pub devices: Vec<PreparedDevice>,
    /// Content of the limits file.
    pub limits: String,
    /// Content of the preload file.
    pub preload: String,
    /// Per-GPU limits in container order.
    pub gpus: Vec<GpuLimit>,
    /// The claim's priority (the highest any of its devices asks).
    pub priority: Priority,
}

/// Why a claim's edits could not be built. Each names the claim and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum EditsError {
    /// A result names a device this node does not have (a vanished GPU, another pool).
    #[error("claim {claim}: status.allocation.devices.results[{index}].device: {detail}")]
    UnknownDevice {
        /// `namespace/name`.
        claim: String,
        /// Result index.
        index: usize,
        /// Which device, and the devices this node has.
        detail: String,
    },
    /// Shares of one GPU add up to more memory than it has.
    #[error(
        "claim {claim}: status.allocation.devices.results[{index}]: grants {granted} bytes of memory on {device}, more than its {total}; lower the memory (only a research-tier GPU grants more memory than it has, to claims of the research class)"
    )]
    MemoryAboveDevice {
        /// `namespace/name`.
        claim: String,
        /// Result index (the last share that crossed the total).
        index: usize,
        /// The device.
        device: String,
        /// Total granted on it by the claim.
        granted: u64,
        /// Its memory.
        total: u64,
    },
    /// An oversubscribed share on a GPU off the research tier.
    #[error(
        "claim {claim}: status.allocation.devices.results[{index}]: an oversubscribed share (oversubscribe: true) on {device}, which is not on the research tier (no fgpu.dev/oversubscribe label); oversubscribed shares go to research-tier GPUs only"
    )]
    OversubscribedOffTier {
        /// `namespace/name`.
        claim: String,
        /// Result index.
        index: usize,
        /// The device.
        device: String,
    },
    /// A share that is not oversubscribed on a research-tier GPU.
    #[error(
        "claim {claim}: status.allocation.devices.results[{index}].device: {device} is on the research tier (oversubscribe ratio {ratio}), and this share does not set oversubscribe: true; only claims of the research class (research.<driver>) go to research-tier GPUs"
    )]
    NotOversubscribedOnTier {
        /// `namespace/name`.
        claim: String,
        /// Result index.
        index: usize,
        /// The device.
        device: String,
        /// Its ratio.
        ratio: String,
    },
    /// Shares of one research-tier GPU add up to more than physical memory × ratio.
    #[error(
        "claim {claim}: status.allocation.devices.results[{index}]: grants {granted} bytes of memory on {device}, more than its {capacity} (its physical memory times its oversubscribe ratio {ratio})"
    )]
    MemoryAboveTier {
        /// `namespace/name`.
        claim: String,
        /// Result index (the last share that crossed).
        index: usize,
        /// The device.
        device: String,
        /// Total granted on it by the claim.
        granted: u64,
        /// Physical memory × ratio.
        capacity: u64,
        /// The ratio.
        ratio: String,
    },
    /// A claim mixes MIG placement devices with GPUs or shares of them.
    #[error(
        "claim {claim}: status.allocation.devices.results[{index}].device: {device} is a MIG placement, and {other} is not; a claim gets MIG instances or GPUs and shares, not both (the shim cannot account for a MIG instance)"
    )]
    MixedMig {
        /// `namespace/name`.
        claim: String,
        /// Result index of the MIG device.
        index: usize,
        /// The MIG device.
        device: String,
        /// A device of the claim that is not a MIG placement.
        other: String,
    },
    /// A MIG device reached the spec before its instance existed (a bug in the caller).
    #[error("claim {claim}: device {device}: its MIG instance ({profile}) was not created")]
    MigNotCreated {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// The profile.
        profile: String,
    },
    /// The CDI spec does not validate.
    #[error("claim {claim}: {source}")]
    Cdi {
        /// `namespace/name`.
        claim: String,
        /// The builder's error.
        #[source]
        source: CdiError,
    },
}

/// The name fgpu publishes for `gpu`: `gpu-<minor>`.
pub fn device_name(gpu: &Gpu) -> String {
    format!("{DEVICE_PREFIX}{}", gpu.minor)
}

/// Places each resolved result on a GPU of `inventory` and resolves whole-device grants to
/// bytes. Fails for a result whose pool is not this node or whose device is unknown.
pub fn plan(
    claim: &ClaimRef,
    resolved: &[ResolvedResult],
    inventory: &NodeInventory,
) -> Result<Vec<PlannedDevice>, EditsError> {
    let mut out: Vec<PlannedDevice> = Vec::with_capacity(resolved.len());
    let mut granted: BTreeMap<&str, u64> = BTreeMap::new();
    for r in resolved {
        let planned = |gpu: &Gpu, memory_bytes| PlannedDevice {
            request: r.result.request.clone(),
            pool: r.result.pool.clone(),
            device: r.result.device.clone(),
            share_id: r.result.share_id.clone(),
            gpu: gpu.clone(),
            memory_bytes,
            cores: r.grant.cores,
            priority: r.grant.priority,
            oversubscribe: r.grant.oversubscribe,
            tier: TierRatio::NONE,
            mig: None,
        };
        if let Some(found) = mig_placement(inventory, &r.result.pool, &r.result.device) {
            let (gpu, placement) = found.map_err(|detail| EditsError::UnknownDevice {
                claim: claim.key(),
                index: r.index,
                detail,
            })?;
            // The instance is the grant: its memory, its compute; nothing to throttle.
            out.push(PlannedDevice {
                cores: CorePercent::ZERO,
                oversubscribe: false,
                mig: Some(PlannedMig {
                    profile: placement.profile,
                    placement: placement.placement,
                    instance: None,
                }),
                ..planned(gpu, placement.memory_bytes)
            });
            continue;
        }
        let gpu = (r.result.pool == inventory.node)
            .then(|| {
                inventory
                    .gpus
                    .iter()
                    .find(|g| device_name(g) == r.result.device)
            })
            .flatten()
            .ok_or_else(|| {
                let known: Vec<String> = inventory.gpus.iter().map(device_name).collect();
                EditsError::UnknownDevice {
                    claim: claim.key(),
                    index: r.index,
                    detail: format!(
                        "{:?} in pool {:?} is not a GPU of node {} (its devices: {})",
                        r.result.device,
                        r.result.pool,
                        inventory.node,
                        known.join(", ")
                    ),
                }
            })?;
        let memory_bytes = r.grant.memory.bytes(gpu.memory_bytes);
        let sum = granted.entry(&gpu.uuid).or_default();
        *sum = sum.saturating_add(memory_bytes);
        if *sum > gpu.memory_bytes && !r.grant.oversubscribe {
            return Err(EditsError::MemoryAboveDevice {
                claim: claim.key(),
                index: r.index,
                device: r.result.device.clone(),
                granted: *sum,
                total: gpu.memory_bytes,
            });
        }
        out.push(planned(gpu, memory_bytes));
    }
    let is_mig = |d: &PlannedDevice| d.mig.is_some();
    if let (Some(m), Some(other)) = (out.iter().position(is_mig), out.iter().find(|d| !is_mig(d))) {
        return Err(EditsError::MixedMig {
            claim: claim.key(),
            index: resolved[m].index,
            device: out[m].device.clone(),
            other: other.device.clone(),
        });
    }
    Ok(out)
}

/// The GPU and placement that `device` of `pool` names, when it is named as a MIG
/// placement device (`gpu-<index>-mig-<label>-<start>`, read by
/// [`mig::parse_device_name`], as the controller and the extender read it): `None` for any
/// other name; an
/// error (naming the device and what is wrong) when the GPU is not this node's, has no
/// profile table, or has no such placement.
pub fn mig_placement<'a>(
    inventory: &'a NodeInventory,
    pool: &str,
    device: &str,
) -> Option<Result<(&'a Gpu, mig::PlacementDevice), String>> {
    let index = mig::parse_device_name(device)?.gpu_index;
    let gpu = inventory
        .gpus
        .iter()
        .find(|g| g.index == index && pool == inventory.node);
    let Some(gpu) = gpu else {
        return Some(Err(format!(
            "{device:?} in pool {pool:?} is a MIG placement of GPU {index}, which node {} does not have",
            inventory.node
        )));
    };
    let table = match mig::table_for(&gpu.product_name, gpu.memory_bytes) {
        Ok(t) => t,
        Err(e) => return Some(Err(format!("{device:?}: GPU {index} ({}): {e}", gpu.uuid))),
    };
    let devices = mig::mig_devices(gpu, table);
    Some(
        devices
            .devices
            .into_iter()
            .find(|d| d.name == device)
            .map(|d| (gpu, d))
            .ok_or_else(|| {
                format!(
                    "{device:?} is not a MIG placement of GPU {index} ({}, {}); its profiles: {}",
                    gpu.uuid,
                    table.model,
                    table.profile_names().join(", ")
                )
            }),
    )
}

/// A GPU's UUID in the contract's form, NVML's: `GPU-` and lower-case hex.
pub fn contract_uuid(uuid: &str) -> String {
    match uuid.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("GPU-") => {
            format!("GPU-{}", uuid[4..].to_ascii_lowercase())
        }
        _ => uuid.to_ascii_lowercase(),
    }
}

/// The per-GPU limits in the order the container sees its GPUs (PCI bus id). On a
/// research-tier GPU the physical part is the claim's grant there divided by the ratio.
pub fn gpu_limits(devices: &[PlannedDevice]) -> Vec<GpuLimit> {
    /// One GPU's shares in the claim, added up.
    struct Sum {
        uuid: String,
        memory: u64,
        cores: u16,
        /// Any share without a core quota.
        unthrottled: bool,
        tier: TierRatio,
    }
    // Keyed by (PCI bus id, minor): the container's order.
    let mut by_gpu: BTreeMap<(String, u32), Sum> = BTreeMap::new();
    for d in devices {
        let e = by_gpu
            .entry((d.gpu.pci_bus_id.to_ascii_lowercase(), d.gpu.minor))
            .or_insert_with(|| Sum {
                uuid: contract_uuid(&d.gpu.uuid),
                memory: 0,
                cores: 0,
                unthrottled: false,
                tier: d.tier,
            });
        e.memory = e.memory.saturating_add(d.memory_bytes);
        e.cores += u16::from(d.cores.get());
        e.unthrottled |= d.cores.get() == 0;
    }
    by_gpu
        .into_values()
        .enumerate()
        .map(|(ordinal, g)| GpuLimit {
            ordinal,
            uuid: g.uuid,
            memory_bytes: g.memory,
            // A share without a core quota leaves the GPU unthrottled for the container.
            cores: if g.unthrottled {
                0
            } else {
                g.cores.min(100) as u8
            },
            physical_bytes: g.tier.is_tier().then(|| g.tier.physical_share(g.memory)),
        })
        .collect()
}

/// A memory limit as HAMi-core's own tools write it: MiB with `m` where exact, else bytes
/// (HAMi-core reads a bare number as bytes).
fn hami_memory(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes.is_multiple_of(MIB) {
        format!("{}m", bytes / MIB)
    } else {
        bytes.to_string()
    }
}

/// Builds the claim's CDI spec, the kubelet's device list and the files' contents.
pub fn build(
    driver: &DriverName,
    claim: &ClaimRef,
    devices: &[PlannedDevice],
    files: &NodeFiles,
    paths: &ClaimPaths,
) -> Result<ClaimEdits, EditsError> {
    if devices.iter().any(|d| d.mig.is_some()) {
        return build_mig(driver, claim, devices, files);
    }
    let gpus = gpu_limits(devices);
    let priority = claim_priority(devices);
    let limits = limits_content(claim, &gpus, priority, files.context_overhead);
    let common = common_edits(claim, devices, &gpus, priority, files, paths);

    let (spec, prepared) = spec_and_devices(driver, claim, devices, common, files, device_edits)?;
    Ok(ClaimEdits {
        spec,
        devices: prepared,
        limits,
        preload: preload_content(),
        gpus,
        priority,
    })
}

/// The instance of each of `devices` (MIG placements, created): an error for one without.
fn instances<'a>(
    claim: &ClaimRef,
    devices: &'a [PlannedDevice],
) -> Result<Vec<&'a MigInstance>, EditsError> {
    devices
        .iter()
        .map(|d| {
            d.mig
                .as_ref()
                .and_then(|m| m.instance.as_ref())
                .ok_or_else(|| EditsError::MigNotCreated {
                    claim: claim.key(),
                    device: d.device.clone(),
                    profile: d.mig.as_ref().map_or("", |m| m.profile).to_owned(),
                })
        })
        .collect()
}

/// The spec of a claim of MIG instances: no shim (the hardware isolates), each device
/// its instance's capability nodes, the common edits the parent GPUs' nodes, the control
/// nodes, the driver's files and hooks and [`mig_env`]. The limits file is written (the
/// claim's directory is the same for every claim) but not mounted: it lists no GPU.
fn build_mig(
    driver: &DriverName,
    claim: &ClaimRef,
    devices: &[PlannedDevice],
    files: &NodeFiles,
) -> Result<ClaimEdits, EditsError> {
    let instances = instances(claim, devices)?;
    let priority = claim_priority(devices);
    let mut common = ContainerEdits {
        env: mig_env(&instances, files),
        ..ContainerEdits::default()
    };
    if files.fake_driver
        && let Some(dir) = &files.fake_state_dir
    {
        common = common.mount(MountEdit::bind(dir, FAKE_STATE_CONTAINER, &STATE_RW));
    }
    for m in &files.driver_mounts {
        common = common.mount(MountEdit::bind(&m.host_path, &m.container_path, &RO));
    }
    for d in devices {
        for node in &d.gpu.device_nodes {
            common = common.device_node(DeviceNodeEdit::from(node));
        }
    }
    for h in &files.driver_hooks {
        common = common.hook(h.clone());
    }
    // The parent's own node is in the common edits (two instances of one GPU share it).
    let own = |d: &PlannedDevice| {
        let mut own = ContainerEdits::default();
        let nodes = d.mig.as_ref().and_then(|m| m.instance.as_ref());
        for node in nodes
            .into_iter()
            .flat_map(|i| &i.device_nodes)
            .filter(|n| !d.gpu.device_nodes.iter().any(|g| g.path == n.path))
        {
            own = own.device_node(DeviceNodeEdit::from(node));
        }
        own
    };
    let (spec, prepared) = spec_and_devices(driver, claim, devices, common, files, own)?;
    Ok(ClaimEdits {
        spec,
        devices: prepared,
        limits: limits_content(claim, &[], priority, files.context_overhead),
        preload: preload_content(),
        gpus: Vec::new(),
        priority,
    })
}

/// The environment of a claim of MIG instances: `NVIDIA_VISIBLE_DEVICES` and
/// `CUDA_VISIBLE_DEVICES` naming them (in allocation order), and on a fake node the fake
/// driver's view of them (`FAKE_CUDA_UUIDS`, each one's memory as its device's total in
/// `FAKE_CUDA_MEMORY_<i>`, the shared state).
pub fn mig_env(instances: &[&MigInstance], files: &NodeFiles) -> Vec<(String, String)> {
    let uuids: Vec<&str> = instances.iter().map(|i| i.uuid.as_str()).collect();
    let list = uuids.join(",");
    let mut vars = vec![
        ("NVIDIA_VISIBLE_DEVICES".to_owned(), list.clone()),
        ("CUDA_VISIBLE_DEVICES".to_owned(), list.clone()),
    ];
    if files.fake_driver {
        vars.push(("FAKE_CUDA_UUIDS".into(), list));
        for (i, inst) in instances.iter().enumerate() {
            vars.push((
                format!("FAKE_CUDA_MEMORY_{i}"),
                inst.memory_bytes.to_string(),
            ));
        }
        if files.fake_state_dir.is_some() {
            vars.push((
                "FAKE_CUDA_STATE".into(),
                format!("{FAKE_STATE_CONTAINER}/{FAKE_STATE_FILE}"),
            ));
        }
    }
    vars
}

/// The claim's spec (`common` edits, and one device per planned device with `own(d)`) and
/// the kubelet's devices.
fn spec_and_devices(
    driver: &DriverName,
    claim: &ClaimRef,
    devices: &[PlannedDevice],
    common: ContainerEdits,
    files: &NodeFiles,
    own: impl Fn(&PlannedDevice) -> ContainerEdits,
) -> Result<(CdiSpec, Vec<PreparedDevice>), EditsError> {
    let mut builder = SpecBuilder::new(driver.cdi_kind()).common_edits(common);
    let mut prepared = Vec::with_capacity(devices.len());
    for d in devices {
        let name = names::cdi_device_name(&claim.uid, &d.device, d.share_id.as_deref());
        builder = builder.device(&name, own(d));
        prepared.push(prepared_device(driver, &name, d, files));
    }
    let spec = builder.build().map_err(|source| EditsError::Cdi {
        claim: claim.key(),
        source,
    })?;
    Ok((spec, prepared))
}

/// The claim's priority: the highest any of its devices asks (`normal` for none).
pub fn claim_priority(devices: &[PlannedDevice]) -> Priority {
    devices
        .iter()
        .map(|d| d.priority)
        .min() // High < Normal < Low: the highest priority asked for.
        .unwrap_or_default()
}

/// `f` of the claim's GPUs when it is the same for all of them (`None` for none, or when
/// they differ): the value of the plain (not indexed) variables.
fn uniform(gpus: &[GpuLimit], f: fn(&GpuLimit) -> u64) -> Option<u64> {
    let first = gpus.first().map(f);
    gpus.iter()
        .all(|g| Some(f(g)) == first)
        .then_some(first)
        .flatten()
}

/// The common environment of the claim's containers, in order: fgpu's variables
/// ([`fgpu_env`]), the fake driver's ([`fake_env`]), then HAMi-core's ([`hami_env`]).
pub fn claim_env(
    claim: &ClaimRef,
    gpus: &[GpuLimit],
    priority: Priority,
    files: &NodeFiles,
) -> Vec<(String, String)> {
    let mut vars = fgpu_env(claim, gpus, priority);
    vars.extend(fake_env(gpus, files));
    vars.extend(hami_env(gpus, priority));
    vars
}

/// fgpu's variables: the limits (plain where uniform, then per ordinal), the priority,
/// the claim's directory and limits file, and the ordinal order (`CUDA_DEVICE_ORDER`).
pub fn fgpu_env(claim: &ClaimRef, gpus: &[GpuLimit], priority: Priority) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = Vec::new();
    if let Some(m) = uniform(gpus, |g| g.memory_bytes) {
        vars.push((env::FGPU_MEMORY_LIMIT.into(), m.to_string()));
    }
    for g in gpus {
        vars.push((
            env::fgpu_memory_limit(g.ordinal),
            g.memory_bytes.to_string(),
        ));
    }
    if let Some(c) = uniform(gpus, |g| u64::from(g.cores)) {
        vars.push((env::FGPU_CORE_LIMIT.into(), c.to_string()));
    }
    for g in gpus {
        vars.push((env::fgpu_core_limit(g.ordinal), g.cores.to_string()));
    }
    vars.push((env::FGPU_PRIORITY.into(), priority.as_str().into()));
    vars.push((
        env::FGPU_STATE_DIR.into(),
        contract::claim_run_dir(&claim.uid),
    ));
    vars.push((
        env::FGPU_LIMITS_FILE.into(),
        contract::limits_file(&claim.uid),
    ));
    vars.push(("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into()));
    vars
}

/// The fake driver's variables on a fake node (none on a real one): the claim's GPUs in
/// container order (`FAKE_CUDA_UUIDS`) and, with a shared state directory, its state file
/// (`FAKE_CUDA_STATE`).
pub fn fake_env(gpus: &[GpuLimit], files: &NodeFiles) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = Vec::new();
    if !files.fake_driver {
        return vars;
    }
    let uuids: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    vars.push(("FAKE_CUDA_UUIDS".into(), uuids.join(",")));
    if files.fake_state_dir.is_some() {
        vars.push((
            "FAKE_CUDA_STATE".into(),
            format!("{FAKE_STATE_CONTAINER}/{FAKE_STATE_FILE}"),
        ));
    }
    vars
}

/// HAMi-core's names, for images that bring HAMi-core's library: the limits (plain where
/// uniform, then per ordinal), its accounting file and its task priority.
pub fn hami_env(gpus: &[GpuLimit], priority: Priority) -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = Vec::new();
    if let Some(m) = uniform(gpus, |g| g.memory_bytes) {
        vars.push((env::CUDA_DEVICE_MEMORY_LIMIT.into(), hami_memory(m)));
    }
    for g in gpus {
        vars.push((
            env::cuda_device_memory_limit(g.ordinal),
            hami_memory(g.memory_bytes),
        ));
    }
    if let Some(c) = uniform(gpus, |g| u64::from(g.cores)) {
        vars.push((env::CUDA_DEVICE_SM_LIMIT.into(), c.to_string()));
    }
    for g in gpus {
        vars.push((env::cuda_device_sm_limit(g.ordinal), g.cores.to_string()));
    }
    vars.push((
        env::CUDA_DEVICE_MEMORY_SHARED_CACHE.into(),
        HAMI_CACHE_CONTAINER.into(),
    ));
    vars.push((
        env::CUDA_TASK_PRIORITY.into(),
        priority.hami_task_priority().to_string(),
    ));
    vars
}

/// The GPUs whose driver limits the claim's memory itself (`enforcement: driver`), as
/// (UUID, bytes) in container order: the claim's share of each (every share of it in the
/// claim, added up), for the limits hook ([`hook_edit`]).
pub fn driver_limited(devices: &[PlannedDevice], gpus: &[GpuLimit]) -> Vec<(String, u64)> {
    gpus.iter()
        .filter(|g| {
            devices
                .iter()
                .any(|d| d.gpu.uuid == g.uuid && d.gpu.enforcement == Enforcement::Driver)
        })
        .map(|g| (g.uuid.clone(), g.memory_bytes))
        .collect()
}

/// The mounts of the claim's containers, in order: a fake node's shared state, the
/// driver's files, the shim and its preload file, the plugin-shim contract's files and
/// the GPUs' priority files (read-write only for a high-priority claim).
pub fn claim_mounts(
    claim: &ClaimRef,
    gpus: &[GpuLimit],
    priority: Priority,
    files: &NodeFiles,
    paths: &ClaimPaths,
) -> Vec<MountEdit> {
    let mut mounts = Vec::new();
    if files.fake_driver
        && let Some(dir) = &files.fake_state_dir
    {
        mounts.push(MountEdit::bind(dir, FAKE_STATE_CONTAINER, &STATE_RW));
    }
    for m in &files.driver_mounts {
        mounts.push(MountEdit::bind(&m.host_path, &m.container_path, &RO));
    }
    mounts.extend([
        MountEdit::bind(&files.shim_library, SHIM_CONTAINER_PATH, &RO),
        MountEdit::bind(&paths.preload_file, PRELOAD_CONTAINER, &RO),
        MountEdit::bind(&paths.limits_file, contract::limits_file(&claim.uid), &RO),
        MountEdit::bind(
            &paths.memory_account,
            contract::memory_account(&claim.uid),
            &STATE_RW,
        ),
        MountEdit::bind(
            &paths.core_account,
            contract::core_account(&claim.uid),
            &STATE_RW,
        ),
        MountEdit::bind(&paths.feed_dir, contract::feed_dir(&claim.uid), &DATA_RO),
    ]);
    // Only a claim allowed high priority (checked at admission and in grant resolution)
    // may stamp a GPU's priority file; the others can only read it.
    let priority_opts: &[&str] = if priority == Priority::High {
        &STATE_RW
    } else {
        &DATA_RO
    };
    for g in gpus {
        mounts.push(MountEdit::bind(
            priority_file(&paths.gpu_dir, &g.uuid),
            contract::priority_file(&g.uuid),
            priority_opts,
        ));
    }
    mounts
}

/// The spec's common edits ([`claim_env`], [`claim_mounts`]), the control device nodes
/// (every node of each GPU but its own, the first), the driver's hooks and, where the
/// node has it and a GPU needs it, the limits hook.
fn common_edits(
    claim: &ClaimRef,
    devices: &[PlannedDevice],
    gpus: &[GpuLimit],
    priority: Priority,
    files: &NodeFiles,
    paths: &ClaimPaths,
) -> ContainerEdits {
    let mut common = ContainerEdits {
        env: claim_env(claim, gpus, priority, files),
        mounts: claim_mounts(claim, gpus, priority, files, paths),
        ..ContainerEdits::default()
    };
    for d in devices {
        for node in d.gpu.device_nodes.iter().skip(1) {
            common = common.device_node(DeviceNodeEdit::from(node));
        }
    }
    for h in &files.driver_hooks {
        common = common.hook(h.clone());
    }
    if let Some(hook) = &files.memory_limits {
        let driver = driver_limited(devices, gpus);
        if !driver.is_empty() {
            common = common.hook(hook_edit(hook, &claim.uid, &driver));
        }
    }
    common
}

/// A device's own edits: its GPU's device node.
pub fn device_edits(d: &PlannedDevice) -> ContainerEdits {
    let mut own = ContainerEdits::default();
    if let Some(node) = d.gpu.primary_device_node() {
        own = own.device_node(DeviceNodeEdit::from(node));
    }
    own
}

/// What the kubelet and the checkpoint learn of device `d`, named `name` in the claim's
/// spec. Its enforcement is the GPU's where the node runs the limits hook, else the shim's.
pub fn prepared_device(
    driver: &DriverName,
    name: &str,
    d: &PlannedDevice,
    files: &NodeFiles,
) -> PreparedDevice {
    PreparedDevice {
        request_names: vec![d.request.clone()],
        pool_name: d.pool.clone(),
        device_name: d.device.clone(),
        share_id: d.share_id.clone(),
        cdi_device_ids: vec![driver.cdi_device_id(name)],
        gpu_uuid: d.gpu.uuid.clone(),
        memory_bytes: d.memory_bytes,
        cores: d.cores.get(),
        enforcement: if files.memory_limits.is_some() && d.mig.is_none() {
            d.gpu.enforcement
        } else {
            Enforcement::Shim
        },
        mig: d.mig.as_ref().map(|m| MigIntent {
            profile: m.profile.to_owned(),
            start: m.placement.start,
            size: m.placement.size,
            uuid: m.instance.as_ref().map(|i| i.uuid.clone()),
            lost: None,
        }),
    }
}

/// The claim's limits file, version 2 of the contract (`docs/shim-contract.md`): the claim,
/// its accounts, feed and priority, and per GPU (by UUID, in container order) its memory,
/// its cores (absent when not throttled), on a research-tier GPU its physical part, and
/// its priority file.
pub fn limits_content(
    claim: &ClaimRef,
    gpus: &[GpuLimit],
    priority: Priority,
    context_overhead: u64,
) -> String {
    let uid = &claim.uid;
    let mut out = format!(
        "# fgpu limits of claim {} (uid {uid}); written by the kubelet plugin, read by libfgpu.so (docs/shim-contract.md)\n",
        claim.key()
    );
    let mut line = |k: &str, v: &str| {
        out.push_str(k);
        out.push('=');
        out.push_str(v);
        out.push('\n');
    };
    line("version", &contract::LIMITS_VERSION.to_string());
    line("claim", &claim.key());
    line("claim_uid", uid);
    line("memory_account", &contract::memory_account(uid));
    line("core_account", &contract::core_account(uid));
    line("feed", &contract::feed_file(uid));
    line("priority", priority.as_str());
    line("core_policy", CORE_POLICY);
    if context_overhead > 0 {
        line("context_overhead", &context_overhead.to_string());
    }
    for g in gpus {
        let key = |field: &str| format!("gpu.{}.{field}", g.uuid);
        line(&key("memory"), &g.memory_bytes.to_string());
        if let Some(physical) = g.physical_bytes {
            line(&key("physical"), &physical.to_string());
        }
        if g.cores > 0 {
            line(&key("cores"), &g.cores.to_string());
        }
        line(&key("priority_file"), &contract::priority_file(&g.uuid));
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fgpu_driver::device::{ComputeCapability, DeviceNode, Health};

    const GI: u64 = 1 << 30;

    pub(crate) fn gpu(minor: u32, pci: &str) -> Gpu {
        Gpu {
            index: minor,
            minor,
            uuid: format!("GPU-0000000{minor}-0000-0000-0000-000000000000"),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 80 * GI,
            sm_count: 132,
            compute_capability: ComputeCapability::new(9, 0),
            driver_version: "550.54.15".into(),
            cuda_driver_version: "12.4".into(),
            pci_bus_id: pci.into(),
            pcie_root: None,
            numa_node: Some(0),
            mig_capable: false,
            enforcement: Default::default(),
            health: Health::Healthy,
            device_nodes: DeviceNode::standard_set(minor, Path::new("/dev")),
        }
    }

    fn dev(g: &Gpu, request: &str, share: Option<&str>, mem_gi: u64, cores: u8) -> PlannedDevice {
        PlannedDevice {
            request: request.into(),
            pool: "n1".into(),
            device: device_name(g),
            share_id: share.map(str::to_owned),
            gpu: g.clone(),
            memory_bytes: mem_gi * GI,
            cores: CorePercent::new(cores).unwrap(),
            priority: Priority::Normal,
            oversubscribe: false,
            tier: TierRatio::NONE,
            mig: None,
        }
    }

    /// A share of `bytes` on `g`, oversubscribed or not (for [`crate::tier`]'s tests).
    pub(crate) fn planned_share(g: &Gpu, bytes: u64, oversubscribe: bool) -> PlannedDevice {
        PlannedDevice {
            memory_bytes: bytes,
            oversubscribe,
            ..dev(g, "gpu", Some("s"), 0, 0)
        }
    }

    fn claim() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "0a1b-uid".into(),
        }
    }

    fn files() -> NodeFiles {
        NodeFiles {
            shim_library: "/opt/fgpu/lib/libfgpu.so".into(),
            driver_mounts: vec![
                FileMount::same("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                FileMount {
                    host_path: "/opt/fake/nvidia-smi".into(),
                    container_path: "/usr/bin/nvidia-smi".into(),
                },
            ],
            driver_hooks: vec![HookEdit {
                hook_name: fgpu_driver::cdi::HookName::CreateContainer,
                path: "/usr/bin/nvidia-cdi-hook".into(),
                args: vec!["nvidia-cdi-hook".into(), "update-ldcache".into()],
                env: vec![],
                timeout: None,
            }],
            fake_driver: false,
            fake_state_dir: None,
            context_overhead: 0,
            memory_limits: None,
        }
    }

    fn paths() -> ClaimPaths {
        ClaimPaths::new(
            Path::new("/var/lib/fgpu"),
            Path::new("/run/fgpu"),
            Path::new("/var/run/cdi"),
            &DriverName::default(),
            "0a1b-uid",
        )
    }

    fn env_of(spec: &CdiSpec) -> Vec<String> {
        spec.to_json_value()["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_fake_state_dir_is_shared_with_every_claim_and_made_writable() {
        let g0 = gpu(0, "0000:1b:00.0");
        let devices = vec![dev(&g0, "a", None, 10, 30)];
        let shared = NodeFiles {
            fake_driver: true,
            fake_state_dir: Some("/run/fgpu-e2e/state".into()),
            ..files()
        };
        let e = build(
            &DriverName::default(),
            &claim(),
            &devices,
            &shared,
            &paths(),
        )
        .unwrap();
        let json = e.spec.to_json_value();
        assert!(env_of(&e.spec).contains(&"FAKE_CUDA_STATE=/run/fgpu-fake/gpu".to_owned()));
        let mounts = json["containerEdits"]["mounts"].as_array().unwrap();
        let m = mounts
            .iter()
            .find(|m| m["containerPath"] == "/run/fgpu-fake")
            .expect("the state directory is mounted");
        assert_eq!(m["hostPath"], "/run/fgpu-e2e/state");
        assert!(m["options"].as_array().unwrap().iter().any(|o| o == "rw"));
        // A real node (or a fake one without the flag) gets nothing of it.
        let plain = build(
            &DriverName::default(),
            &claim(),
            &devices,
            &NodeFiles {
                fake_driver: true,
                ..files()
            },
            &paths(),
        )
        .unwrap();
        assert!(
            !env_of(&plain.spec)
                .iter()
                .any(|v| v.starts_with("FAKE_CUDA_STATE"))
        );

        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("s");
        // This test process's FAKE_CUDA_STATE is not that state: the mismatch is reported.
        let warning = create_fake_state(&state).unwrap();
        assert!(warning.is_some_and(|w| w.contains("the node monitor reads another state")));
        for f in FAKE_STATE_FILES {
            let mode = std::fs::metadata(state.join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o666, "{f}");
        }
        // Again over existing files (a restart): nothing truncated.
        std::fs::write(state.join("gpu"), b"x").unwrap();
        create_fake_state(&state).unwrap();
        assert_eq!(std::fs::read(state.join("gpu")).unwrap(), b"x");
    }

    #[test]
    fn a_fake_node_tells_the_fake_driver_the_claims_gpus_in_container_order() {
        let (g0, g1) = (gpu(0, "0000:1b:00.0"), gpu(1, "0000:0a:00.0"));
        let devices = vec![dev(&g0, "a", None, 10, 30), dev(&g1, "b", None, 20, 50)];
        let build_env = |fake_driver| {
            let files = NodeFiles {
                fake_driver,
                ..files()
            };
            let e = build(&DriverName::default(), &claim(), &devices, &files, &paths()).unwrap();
            env_of(&e.spec)
        };
        // PCI bus order: g1 (0a) is ordinal 0.
        assert!(
            build_env(true).contains(&format!("FAKE_CUDA_UUIDS={},{}", g1.uuid, g0.uuid)),
            "{:?}",
            build_env(true)
        );
        assert!(
            !build_env(false).iter().any(|v| v.starts_with("FAKE_CUDA_")),
            "a real node's containers get nothing of the fake"
        );
    }

    #[test]
    fn a_research_tier_gpu_tells_the_shim_its_physical_part() {
        let (g0, g1) = (gpu(0, "0000:1b:00.0"), gpu(1, "0000:2b:00.0"));
        let ratio: TierRatio = "1.5".parse().unwrap();
        let on_tier = |bytes| PlannedDevice {
            tier: ratio,
            ..planned_share(&g0, bytes, true)
        };
        // Two shares of 1.5 GiB on the tier GPU: 3 GiB granted, 2 GiB of it device memory.
        let devices = [
            on_tier(3 * GI / 2),
            on_tier(3 * GI / 2),
            dev(&g1, "b", None, 4, 0),
        ];
        let gpus = gpu_limits(&devices);
        assert_eq!(gpus[0].memory_bytes, 3 * GI);
        assert_eq!(gpus[0].physical_bytes, Some(2 * GI));
        assert_eq!(gpus[1].physical_bytes, None);
        let text = limits_content(&claim(), &gpus, Priority::Normal, 0);
        let u0 = contract_uuid(&g0.uuid);
        assert!(
            text.contains(&format!(
                "gpu.{u0}.memory={}\ngpu.{u0}.physical={}\n",
                3 * GI,
                2 * GI
            )),
            "{text}"
        );
        assert!(!text.contains(&format!("gpu.{}.physical", contract_uuid(&g1.uuid))));
    }

    #[test]
    fn the_per_context_charge_reaches_the_limits_file_only_when_set() {
        let devices = vec![dev(&gpu(0, "0000:1b:00.0"), "a", None, 10, 30)];
        let limits = |context_overhead| {
            let files = NodeFiles {
                context_overhead,
                ..files()
            };
            build(&DriverName::default(), &claim(), &devices, &files, &paths())
                .unwrap()
                .limits
        };
        assert!(limits(300 << 20).contains("\ncontext_overhead=314572800\n"));
        assert!(!limits(0).contains("context_overhead"));
        assert_eq!(parse_bytes("300Mi"), Ok(300 << 20));
        assert!(parse_bytes("lots").is_err());
    }

    #[test]
    fn env_table() {
        let (g0, g1) = (gpu(0, "0000:1b:00.0"), gpu(1, "0000:0a:00.0"));
        // (name, devices, wanted env entries, unwanted env prefixes)
        type Case = (
            &'static str,
            Vec<PlannedDevice>,
            Vec<String>,
            Vec<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "one share",
                vec![dev(&g0, "gpu", Some("s1"), 10, 30)],
                vec![
                    format!("FGPU_MEMORY_LIMIT={}", 10 * GI),
                    format!("FGPU_MEMORY_LIMIT_0={}", 10 * GI),
                    "FGPU_CORE_LIMIT=30".into(),
                    "FGPU_CORE_LIMIT_0=30".into(),
                    "CUDA_DEVICE_MEMORY_LIMIT=10240m".into(),
                    "CUDA_DEVICE_SM_LIMIT_0=30".into(),
                    "FGPU_PRIORITY=normal".into(),
                    "CUDA_TASK_PRIORITY=1".into(),
                    "FGPU_STATE_DIR=/run/fgpu/claims/0a1b-uid".into(),
                    "FGPU_LIMITS_FILE=/etc/fgpu/claims/0a1b-uid/limits".into(),
                    "CUDA_DEVICE_ORDER=PCI_BUS_ID".into(),
                    "CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/fgpu-hami.cache".into(),
                ],
                // The node-wide GPU directory is gone from claims.
                vec!["FGPU_MEMORY_LIMIT_1", "FGPU_GPU_DIR"],
            ),
            (
                "two GPUs listed against bus order: ordinals follow the bus, no plain form",
                vec![dev(&g0, "a", None, 10, 30), dev(&g1, "b", None, 20, 50)],
                vec![
                    format!("FGPU_MEMORY_LIMIT_0={}", 20 * GI),
                    format!("FGPU_MEMORY_LIMIT_1={}", 10 * GI),
                    "FGPU_CORE_LIMIT_0=50".into(),
                    "FGPU_CORE_LIMIT_1=30".into(),
                    "CUDA_DEVICE_MEMORY_LIMIT_0=20480m".into(),
                    "CUDA_DEVICE_SM_LIMIT_1=30".into(),
                ],
                vec![
                    "FGPU_MEMORY_LIMIT=",
                    "FGPU_CORE_LIMIT=",
                    "CUDA_DEVICE_MEMORY_LIMIT=",
                ],
            ),
            (
                "two shares of one GPU: one device, sums",
                vec![
                    dev(&g0, "a", Some("s1"), 10, 30),
                    dev(&g0, "b", Some("s2"), 6, 20),
                ],
                vec![
                    format!("FGPU_MEMORY_LIMIT={}", 16 * GI),
                    format!("FGPU_MEMORY_LIMIT_0={}", 16 * GI),
                    "FGPU_CORE_LIMIT_0=50".into(),
                ],
                vec!["FGPU_MEMORY_LIMIT_1"],
            ),
            (
                "a share without cores leaves the GPU unthrottled",
                vec![
                    dev(&g0, "a", Some("s1"), 10, 0),
                    dev(&g0, "b", Some("s2"), 6, 20),
                ],
                vec!["FGPU_CORE_LIMIT_0=0".into()],
                vec![],
            ),
            (
                "same grants on two GPUs: plain forms too",
                vec![dev(&g1, "a", None, 8, 25), dev(&g0, "a", None, 8, 25)],
                vec![
                    format!("FGPU_MEMORY_LIMIT={}", 8 * GI),
                    "FGPU_CORE_LIMIT=25".into(),
                    "FGPU_CORE_LIMIT_1=25".into(),
                ],
                vec![],
            ),
        ];
        for (name, devices, want, unwanted) in cases {
            let e = build(
                &DriverName::default(),
                &claim(),
                &devices,
                &files(),
                &paths(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            let got = env_of(&e.spec);
            for w in &want {
                assert!(got.contains(w), "{name}: missing {w} in {got:?}");
            }
            for u in &unwanted {
                assert!(
                    !got.iter().any(|g| g.starts_with(u)),
                    "{name}: {u} in {got:?}"
                );
            }
            // The limits file is keyed by UUID, never by the environment's names.
            assert!(e.limits.contains("\nversion=2\n"), "{name}: {}", e.limits);
            for g in &e.gpus {
                let memory = format!("gpu.{}.memory={}\n", g.uuid, g.memory_bytes);
                assert!(
                    e.limits.contains(&memory),
                    "{name}: {memory} in {}",
                    e.limits
                );
            }
            assert!(!e.limits.contains("FGPU_"), "{name}");
            assert!(!e.limits.contains("CUDA_"), "{name}");
            // Round trip through the CDI crate's validation.
            CdiSpec::from_json(&e.spec.to_json().unwrap()).unwrap();
        }
    }

    #[test]
    fn hami_memory_uses_mib_where_exact() {
        assert_eq!(hami_memory(10 * GI), "10240m");
        assert_eq!(hami_memory(1 << 20), "1m");
        assert_eq!(hami_memory(1536), "1536");
        assert_eq!(hami_memory((1 << 20) + 1), "1048577");
    }

    #[test]
    fn the_driver_limit_hook_covers_the_driver_enforced_gpus_only() {
        let (mut g0, g1) = (gpu(0, "0000:1b:00.0"), gpu(1, "0000:0a:00.0"));
        g0.enforcement = Enforcement::Driver;
        // Two shares of the driver-enforced GPU (their memory adds up) and a shim-only GPU.
        let devices = vec![
            dev(&g0, "a", Some("s1"), 2, 0),
            dev(&g0, "b", Some("s2"), 3, 0),
            dev(&g1, "c", Some("s3"), 4, 0),
        ];
        let hooks = |f: &NodeFiles, devices: &[PlannedDevice]| {
            let e = build(&DriverName::default(), &claim(), devices, f, &paths()).unwrap();
            let v = e.spec.to_json_value();
            v["containerEdits"]["hooks"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|h| h["hookName"] == "createRuntime")
                        .cloned()
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        let mut f = files();
        assert!(
            hooks(&f, &devices).is_empty(),
            "no hook without --driver-memory-limits"
        );
        f.memory_limits = Some(LimitHook {
            program: "/var/lib/fgpu/bin/fgpu-kubelet-plugin".into(),
            nvml_library: "/usr/lib/libnvidia-ml.so.1".into(),
            run_dir: "/run/fgpu".into(),
            env: vec![],
        });
        let h = hooks(&f, &devices);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h[0]["path"], "/var/lib/fgpu/bin/fgpu-kubelet-plugin");
        let args: Vec<&str> = h[0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let limits: Vec<&str> = args
            .windows(2)
            .filter(|w| w[0] == "--limit")
            .map(|w| w[1])
            .collect();
        assert_eq!(limits, [format!("{}={}", g0.uuid, 5 * GI)]);
        assert!(
            args.windows(2).any(|w| w == ["--claim", "0a1b-uid"]),
            "{args:?}"
        );
        // A claim of shim-only GPUs gets no hook.
        assert!(hooks(&f, &devices[2..]).is_empty());
    }

    #[test]
    fn the_claims_priority_is_the_highest_asked() {
        let g = gpu(0, "0000:1b:00.0");
        let with = |p| PlannedDevice {
            priority: p,
            ..dev(&g, "a", None, 1, 0)
        };
        assert_eq!(claim_priority(&[]), Priority::Normal);
        assert_eq!(claim_priority(&[with(Priority::Low)]), Priority::Low);
        assert_eq!(
            claim_priority(&[
                with(Priority::Low),
                with(Priority::High),
                with(Priority::Normal)
            ]),
            Priority::High
        );
    }

    fn limit(ordinal: usize, memory_gi: u64, cores: u8) -> GpuLimit {
        GpuLimit {
            ordinal,
            uuid: format!("GPU-{ordinal}"),
            memory_bytes: memory_gi * GI,
            cores,
            physical_bytes: None,
        }
    }

    #[test]
    fn plain_variables_only_for_a_uniform_grant() {
        let even = [limit(0, 2, 30), limit(1, 2, 30)];
        let vars = fgpu_env(&claim(), &even, Priority::High);
        let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "FGPU_MEMORY_LIMIT",
                "FGPU_MEMORY_LIMIT_0",
                "FGPU_MEMORY_LIMIT_1",
                "FGPU_CORE_LIMIT",
                "FGPU_CORE_LIMIT_0",
                "FGPU_CORE_LIMIT_1",
                "FGPU_PRIORITY",
                "FGPU_STATE_DIR",
                "FGPU_LIMITS_FILE",
                "CUDA_DEVICE_ORDER"
            ]
        );
        assert_eq!(vars[6].1, "high");
        let uneven = [limit(0, 2, 30), limit(1, 4, 30)];
        let vars = fgpu_env(&claim(), &uneven, Priority::Normal);
        assert!(!vars.iter().any(|(k, _)| k == "FGPU_MEMORY_LIMIT"));
        assert!(
            vars.iter()
                .any(|(k, v)| k == "FGPU_CORE_LIMIT" && v == "30")
        );
        // No GPU: nothing uniform either.
        assert_eq!(uniform(&[], |g| g.memory_bytes), None);
    }

    #[test]
    fn hami_names_carry_mib_where_exact() {
        let vars = hami_env(&[limit(0, 1, 0)], Priority::Low);
        let get = |name: &str| {
            vars.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("CUDA_DEVICE_MEMORY_LIMIT"), Some("1024m"));
        assert_eq!(get("CUDA_DEVICE_MEMORY_LIMIT_0"), Some("1024m"));
        assert_eq!(get("CUDA_DEVICE_SM_LIMIT"), Some("0"));
        assert_eq!(
            get("CUDA_DEVICE_MEMORY_SHARED_CACHE"),
            Some(HAMI_CACHE_CONTAINER)
        );
        assert_eq!(
            get("CUDA_TASK_PRIORITY"),
            Some(Priority::Low.hami_task_priority().to_string().as_str())
        );
        assert_eq!(hami_memory(GI + 1), (GI + 1).to_string());
    }

    #[test]
    fn only_a_fake_node_gets_the_fake_drivers_variables() {
        let gpus = [limit(0, 1, 0), limit(1, 1, 0)];
        assert!(fake_env(&gpus, &files()).is_empty());
        let fake = NodeFiles {
            fake_driver: true,
            ..files()
        };
        assert_eq!(
            fake_env(&gpus, &fake),
            [("FAKE_CUDA_UUIDS".to_owned(), "GPU-0,GPU-1".to_owned())]
        );
        let shared = NodeFiles {
            fake_state_dir: Some("/s".into()),
            ..fake
        };
        assert_eq!(
            fake_env(&gpus, &shared)[1],
            (
                "FAKE_CUDA_STATE".to_owned(),
                "/run/fgpu-fake/gpu".to_owned()
            )
        );
        // The state directory without the fake driver is not mounted either.
        let real = NodeFiles {
            fake_state_dir: Some("/s".into()),
            ..files()
        };
        let mounts = claim_mounts(&claim(), &gpus, Priority::Normal, &real, &paths());
        assert!(
            !mounts
                .iter()
                .any(|m| m.container_path == Path::new(FAKE_STATE_CONTAINER))
        );
        let mounts = claim_mounts(&claim(), &gpus, Priority::Normal, &shared, &paths());
        assert_eq!(mounts[0].container_path, Path::new(FAKE_STATE_CONTAINER));
    }

    #[test]
    fn the_limits_hook_covers_only_driver_enforced_gpus() {
        let mut g = gpu(1, "0000:0a:00.0");
        g.enforcement = Enforcement::Driver;
        // The bytes are the GPU's limit in the claim (its shares added up), not one share's.
        let limits = [
            GpuLimit {
                ordinal: 0,
                uuid: g.uuid.clone(),
                memory_bytes: 5 * GI,
                cores: 0,
                physical_bytes: None,
            },
            limit(1, 1, 0),
        ];
        let one = [dev(&g, "a", None, 4, 0)];
        assert_eq!(driver_limited(&one, &limits), [(g.uuid.clone(), 5 * GI)]);
        // Only the devices say which GPU has the driver's limit.
        g.enforcement = Enforcement::Shim;
        assert!(driver_limited(&[dev(&g, "a", None, 4, 0)], &limits).is_empty());
    }

    #[test]
    fn a_device_brings_its_own_node_and_its_enforcement_with_the_hook_only() {
        let mut g = gpu(2, "0000:1b:00.0");
        g.enforcement = Enforcement::Driver;
        let d = dev(&g, "a", Some("s1"), 2, 40);
        let own = device_edits(&d);
        assert_eq!(own.device_nodes.len(), 1);
        assert_eq!(own.device_nodes[0].path, Path::new("/dev/nvidia2"));
        let driver = DriverName::default();
        let p = prepared_device(&driver, "n-gpu-2-s1", &d, &files());
        assert_eq!(p.cdi_device_ids, ["gpu.fgpu.dev/claim=n-gpu-2-s1"]);
        assert_eq!((p.memory_bytes, p.cores), (2 * GI, 40));
        assert_eq!(p.enforcement, Enforcement::Shim);
        let hooked = NodeFiles {
            memory_limits: Some(LimitHook {
                program: "/p".into(),
                nvml_library: "/n".into(),
                run_dir: "/r".into(),
                env: vec![],
            }),
            ..files()
        };
        let p = prepared_device(&driver, "n-gpu-2-s1", &d, &hooked);
        assert_eq!(p.enforcement, Enforcement::Driver);
    }

    #[test]
    fn spec_layout() {
        let (g0, g1) = (gpu(0, "0000:1b:00.0"), gpu(1, "0000:0a:00.0"));
        let devices = vec![
            dev(&g0, "a", Some("s1"), 10, 30),
            dev(&g1, "b", None, 80, 0),
        ];
        let e = build(
            &DriverName::default(),
            &claim(),
            &devices,
            &files(),
            &paths(),
        )
        .unwrap();
        // Claim UIDs may start with a digit: CDI 0.5.0.
        assert_eq!(e.spec.cdi_version(), "0.5.0");
        assert_eq!(
            e.spec.qualified_names(),
            [
                "gpu.fgpu.dev/claim=0a1b-uid-gpu-0-s1",
                "gpu.fgpu.dev/claim=0a1b-uid-gpu-1"
            ]
        );
        let ids: Vec<_> = e.devices.iter().map(|d| d.cdi_device_ids.clone()).collect();
        assert_eq!(
            ids,
            [
                ["gpu.fgpu.dev/claim=0a1b-uid-gpu-0-s1"],
                ["gpu.fgpu.dev/claim=0a1b-uid-gpu-1"]
            ]
        );
        assert_eq!(e.devices[0].request_names, ["a"]);
        assert_eq!(e.devices[0].share_id.as_deref(), Some("s1"));
        assert_eq!(e.devices[1].memory_bytes, 80 * GI);

        let v = e.spec.to_json_value();
        let own: Vec<_> = v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                d["containerEdits"]["deviceNodes"][0]["path"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(own, ["/dev/nvidia0", "/dev/nvidia1"]);
        let common = &v["containerEdits"];
        let nodes: Vec<_> = common["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            nodes,
            ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        );
        let mounts: Vec<(String, String, String)> = common["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let opts: Vec<_> = m["options"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.as_str().unwrap())
                    .collect();
                (
                    m["hostPath"].as_str().unwrap().to_owned(),
                    m["containerPath"].as_str().unwrap().to_owned(),
                    opts.join(","),
                )
            })
            .collect();
        let m = |h: &str, c: &str, o: &str| (h.to_owned(), c.to_owned(), o.to_owned());
        assert_eq!(
            mounts,
            [
                m(
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                    "ro,nosuid,nodev,bind"
                ),
                m(
                    "/opt/fake/nvidia-smi",
                    "/usr/bin/nvidia-smi",
                    "ro,nosuid,nodev,bind"
                ),
                m(
                    "/opt/fgpu/lib/libfgpu.so",
                    "/usr/lib/fgpu/libfgpu.so",
                    "ro,nosuid,nodev,bind"
                ),
                m(
                    "/var/lib/fgpu/ld.so.preload",
                    "/etc/ld.so.preload",
                    "ro,nosuid,nodev,bind"
                ),
                m(
                    "/run/fgpu/claims/0a1b-uid/limits",
                    "/etc/fgpu/claims/0a1b-uid/limits",
                    "ro,nosuid,nodev,bind"
                ),
                m(
                    "/run/fgpu/claims/0a1b-uid/state/memory.state",
                    "/run/fgpu/claims/0a1b-uid/memory.state",
                    "rw,nosuid,nodev,noexec,bind"
                ),
                m(
                    "/run/fgpu/claims/0a1b-uid/state/core.state",
                    "/run/fgpu/claims/0a1b-uid/core.state",
                    "rw,nosuid,nodev,noexec,bind"
                ),
                m(
                    "/run/fgpu/claims/0a1b-uid/feed",
                    "/run/fgpu/claims/0a1b-uid/feed",
                    "ro,nosuid,nodev,noexec,bind"
                ),
                // A normal-priority claim reads the GPUs' priority files only.
                m(
                    "/var/lib/fgpu/gpus/GPU-00000001-0000-0000-0000-000000000000.priority",
                    "/run/fgpu/gpus/GPU-00000001-0000-0000-0000-000000000000.priority",
                    "ro,nosuid,nodev,noexec,bind"
                ),
                m(
                    "/var/lib/fgpu/gpus/GPU-00000000-0000-0000-0000-000000000000.priority",
                    "/run/fgpu/gpus/GPU-00000000-0000-0000-0000-000000000000.priority",
                    "ro,nosuid,nodev,noexec,bind"
                ),
            ]
        );
        // Nothing of the node is mounted read-write but the claim's own accounts.
        let rw: Vec<_> = mounts
            .iter()
            .filter(|(_, _, o)| o.starts_with("rw"))
            .map(|(_, c, _)| c.as_str())
            .collect();
        assert_eq!(
            rw,
            [
                "/run/fgpu/claims/0a1b-uid/memory.state",
                "/run/fgpu/claims/0a1b-uid/core.state"
            ]
        );
        assert_eq!(e.preload, "/usr/lib/fgpu/libfgpu.so\n");
        assert_eq!(common["hooks"][0]["hookName"], "createContainer");
        assert_eq!(common["hooks"][0]["path"], "/usr/bin/nvidia-cdi-hook");
        assert_eq!(
            paths().spec_file,
            Path::new("/var/run/cdi/gpu.fgpu.dev-claim_0a1b-uid.json")
        );
        assert_eq!(
            e.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>(),
            [&g1.uuid, &g0.uuid]
        );
    }

    #[test]
    fn limits_file_version_2() {
        let (g0, g1) = (gpu(0, "0000:1b:00.0"), gpu(1, "0000:0a:00.0"));
        let devices = vec![
            dev(&g0, "a", Some("s1"), 10, 30),
            dev(&g0, "b", Some("s2"), 6, 20),
            dev(&g1, "c", None, 80, 0),
        ];
        let e = build(
            &DriverName::default(),
            &claim(),
            &devices,
            &files(),
            &paths(),
        )
        .unwrap();
        assert_eq!(
            e.limits,
            format!(
                "# fgpu limits of claim ns/c (uid 0a1b-uid); written by the kubelet plugin, read by libfgpu.so (docs/shim-contract.md)
version=2
claim=ns/c
claim_uid=0a1b-uid
memory_account=/run/fgpu/claims/0a1b-uid/memory.state
core_account=/run/fgpu/claims/0a1b-uid/core.state
feed=/run/fgpu/claims/0a1b-uid/feed/utilisation
priority=normal
core_policy=limit
gpu.GPU-00000001-0000-0000-0000-000000000000.memory={}
gpu.GPU-00000001-0000-0000-0000-000000000000.priority_file=/run/fgpu/gpus/GPU-00000001-0000-0000-0000-000000000000.priority
gpu.GPU-00000000-0000-0000-0000-000000000000.memory={}
gpu.GPU-00000000-0000-0000-0000-000000000000.cores=50
gpu.GPU-00000000-0000-0000-0000-000000000000.priority_file=/run/fgpu/gpus/GPU-00000000-0000-0000-0000-000000000000.priority
",
                80 * GI,
                16 * GI
            )
        );
        // Every key once (a duplicate makes the file malformed for the shim).
        let keys: Vec<&str> = e
            .limits
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split_once('=').unwrap().0)
            .collect();
        let mut unique = keys.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(keys.len(), unique.len(), "{keys:?}");
    }

    #[test]
    fn uuids_take_nvml_form() {
        let mut g = gpu(0, "0000:1b:00.0");
        g.uuid = "GPU-ABCDEF01-0000-0000-0000-00000000000A".into();
        let e = build(
            &DriverName::default(),
            &claim(),
            &[dev(&g, "a", None, 1, 0)],
            &files(),
            &paths(),
        )
        .unwrap();
        assert!(
            e.limits
                .contains("gpu.GPU-abcdef01-0000-0000-0000-00000000000a.memory="),
            "{}",
            e.limits
        );
    }

    #[test]
    fn only_a_high_priority_claim_may_write_the_priority_files() {
        let g = gpu(0, "0000:1b:00.0");
        let prio_opts = |p: Priority| {
            let mut d = dev(&g, "a", None, 1, 0);
            d.priority = p;
            let e = build(&DriverName::default(), &claim(), &[d], &files(), &paths()).unwrap();
            assert!(
                e.limits.contains(&format!("\npriority={p}\n")),
                "{}",
                e.limits
            );
            let v = e.spec.to_json_value();
            let m = v["containerEdits"]["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| {
                    m["containerPath"]
                        == "/run/fgpu/gpus/GPU-00000000-0000-0000-0000-000000000000.priority"
                })
                .cloned()
                .unwrap();
            m["options"][0].as_str().unwrap().to_owned()
        };
        assert_eq!(prio_opts(Priority::High), "rw");
        assert_eq!(prio_opts(Priority::Normal), "ro");
        assert_eq!(prio_opts(Priority::Low), "ro");
    }

    #[test]
    fn fake_device_nodes_keep_their_host_paths() {
        let mut g = gpu(3, "0000:03:00.0");
        g.device_nodes = DeviceNode::standard_set(3, Path::new("/tmp/fake/dev"));
        let e = build(
            &DriverName::default(),
            &claim(),
            &[dev(&g, "a", None, 1, 0)],
            &files(),
            &paths(),
        )
        .unwrap();
        let v = e.spec.to_json_value();
        assert_eq!(
            v["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"],
            "/tmp/fake/dev/nvidia3"
        );
        assert_eq!(
            v["containerEdits"]["deviceNodes"][0]["hostPath"],
            "/tmp/fake/dev/nvidiactl"
        );
    }

    #[test]
    fn plan_errors() {
        use crate::grant::{Grant, MemoryGrant, Source};
        let inv = NodeInventory::new("n1", vec![gpu(0, "0000:1b:00.0")]);
        let resolved =
            |pool: &str, device: &str, memory: MemoryGrant, oversubscribe: bool| ResolvedResult {
                index: 2,
                result: crate::claim::DeviceResult {
                    request: "gpu".into(),
                    driver: "gpu.fgpu.dev".into(),
                    pool: pool.into(),
                    device: device.into(),
                    ..Default::default()
                },
                grant: Grant {
                    memory,
                    memory_source: Source::Config,
                    cores: CorePercent::ZERO,
                    cores_source: Source::WholeDevice,
                    priority: Priority::Normal,
                    oversubscribe,
                },
            };
        let ok = plan(
            &claim(),
            &[resolved("n1", "gpu-0", MemoryGrant::Whole, false)],
            &inv,
        )
        .unwrap();
        assert_eq!(ok[0].memory_bytes, 80 * GI);
        let e = plan(
            &claim(),
            &[resolved("n1", "gpu-7", MemoryGrant::Whole, false)],
            &inv,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "claim ns/c: status.allocation.devices.results[2].device: \"gpu-7\" in pool \"n1\" is not a GPU of node n1 (its devices: gpu-0)"
        );
        let e = plan(
            &claim(),
            &[resolved("n2", "gpu-0", MemoryGrant::Whole, false)],
            &inv,
        )
        .unwrap_err();
        assert!(matches!(e, EditsError::UnknownDevice { .. }), "{e}");
        let big = MemoryGrant::Bytes(81 * GI);
        let e = plan(&claim(), &[resolved("n1", "gpu-0", big, false)], &inv)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than its"), "{e}");
        assert!(plan(&claim(), &[resolved("n1", "gpu-0", big, true)], &inv).is_ok());
    }
}
