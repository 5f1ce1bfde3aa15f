//! The `fake` backend: GPUs described by a YAML profile instead of a driver.
//!
//! One file describes one node or a whole fake cluster. The schema (documented for users in
//! `deploy/fake/README.md`):
//!
//! ```yaml
//! defaults:                     # optional; every key may also be set per node
//!   driverVersion: "550.54.15"  # default 550.54.15
//!   cudaVersion: "12.4"         # default 12.4
//!   deviceRoot: /dev            # host directory holding the (stand-in) device nodes
//! nodes:
//!   - name: gpu-node-1          # Kubernetes node name (DNS-1123 subdomain), unique
//!     gpus:                     # at least one
//!       - uuid: GPU-8a3c1f2e-...  # required, "GPU-" + hex and dashes, unique in the file
//!         productName: NVIDIA H100 80GB HBM3   # required
//!         memory: 80Gi          # required, > 0; Kubernetes quantity or a byte count
//!         smCount: 132          # required, > 0
//!         computeCapability: "9.0"  # required, MAJOR.MINOR of Pascal..Blackwell
//!         numaNode: 0           # optional
//!         pciBusID: "0000:1b:00.0"  # optional, unique per node; default 0000:<pos+1>:00.0
//!         pcieRoot: pci0000:15  # optional
//!         migCapable: true      # optional, default false
//!         mode: mig             # optional: shared (default), mig or whole; mig needs
//!                               # migCapable and a model with a MIG table (crate::mig)
//!         index: 0              # optional, default: position in the list
//!         minor: 0              # optional, default: index
//!         unhealthy: "XID 79"   # optional; present = Unhealthy with this reason
//! ```
//!
//! Unknown keys are rejected. Every problem is reported as one line naming the file, the node
//! and the field.
//!
//! Faults are injected beside the profile, in `<profile>.faults.json` ([`FaultFile`], written
//! by `fgpu-kubelet-plugin fake-fault`): per GPU UUID a list of faults in the words of
//! [`Fault::parse`](crate::health::Fault::parse) (`xid 79`, `ecc`, `lost`, `retired-pages`,
//! `temperature 97`). Both files are re-read by every enumeration, so an injected fault is
//! seen by the next health check, as a driver event would be on a real node. One word in a
//! GPU's list is not a health fault: [`MIG_CREATE_FAILS`] makes the next MIG instance
//! creations on that GPU fail (as a driver error would), until it is cleared.
//!
//! MIG instances of GPUs in `mode: mig` live in `<profile>.mig.json` ([`MigStateFile`],
//! [`mig_state_path`]), written atomically at each change and re-read by each call, so a
//! restarted plugin finds the instances that survived it, as on a real GPU. Creation
//! refuses what the GPU would ([`crate::mig::MigLayout`]: overlap, no compute slices left,
//! instance limits, a second `+me`). The instance UUIDs, GPU instance ids and
//! capability-node minors are the fake's own numbering; a real node's come from the driver.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{BackendError, DeviceBackend, ProfileError};
use crate::device::{
    Architecture, CONTAINER_DEV_DIR, ComputeCapability, DeviceNode, Gpu, GpuMode, Health,
    NodeInventory, ParseComputeCapabilityError,
};
use crate::mig::{self, MigInstance, Placement};

/// Driver version used when a profile names none.
pub const DEFAULT_DRIVER_VERSION: &str = "550.54.15";
/// CUDA driver version used when a profile names none.
pub const DEFAULT_CUDA_VERSION: &str = "12.4";
/// Host directory of device nodes used when a profile names none.
pub const DEFAULT_DEVICE_ROOT: &str = "/dev";

/// A parsed and validated fake profile: the inventories of one or more nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeProfile {
    path: PathBuf,
    nodes: Vec<NodeInventory>,
    /// Each GPU's mode, by UUID.
    modes: BTreeMap<String, GpuMode>,
}

impl FakeProfile {
    /// Reads and validates the profile at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, BackendError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| BackendError::ProfileRead {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::parse(&text, path)?)
    }

    /// Parses and validates profile text; `path` is only used in messages.
    pub fn parse(text: &str, path: impl AsRef<Path>) -> Result<Self, ProfileError> {
        Parser {
            path: path.as_ref(),
        }
        .profile(text)
    }

    /// The file the profile came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All nodes, in file order.
    pub fn nodes(&self) -> &[NodeInventory] {
        &self.nodes
    }

    /// The mode of the GPU `uuid` (`shared` for one the profile does not list).
    pub fn mode(&self, uuid: &str) -> GpuMode {
        self.modes.get(uuid).copied().unwrap_or_default()
    }

    /// Node names, in file order.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.node.clone()).collect()
    }

    /// The node called `name`; [`BackendError::UnknownNode`] lists the known ones otherwise.
    pub fn node(&self, name: &str) -> Result<&NodeInventory, BackendError> {
        self.nodes
            .iter()
            .find(|n| n.node == name)
            .ok_or_else(|| BackendError::UnknownNode {
                path: self.path.clone(),
                node: name.to_owned(),
                known: self.node_names(),
            })
    }

    /// The node called `name`, or the only node when `name` is `None` and there is just one.
    pub fn single_node(&self, name: Option<&str>) -> Result<&NodeInventory, BackendError> {
        match (name, self.nodes.as_slice()) {
            (Some(name), _) => self.node(name),
            (None, [only]) => Ok(only),
            (None, _) => Err(BackendError::NodeRequired {
                path: self.path.clone(),
                known: self.node_names(),
            }),
        }
    }
}

/// A [`DeviceBackend`] serving one node of a fake profile.
///
/// Every [`enumerate`](DeviceBackend::enumerate) re-reads the file, so editing the profile
/// (e.g. adding `unhealthy:` to a GPU) is seen by the next health poll, as a driver event
/// would be on a real node.
#[derive(Clone)]
pub struct FakeBackend {
    path: PathBuf,
    node: String,
    /// The fake driver's NVML (`tests/fake-cuda`), answering [`DeviceBackend::usage`].
    usage: Option<std::sync::Arc<dyn super::UsageReader>>,
}

impl std::fmt::Debug for FakeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBackend")
            .field("path", &self.path)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl FakeBackend {
    /// Opens the profile at `path` and picks `node` (optional for a single-node profile).
    pub fn open(path: impl AsRef<Path>, node: Option<&str>) -> Result<Self, BackendError> {
        let profile = FakeProfile::load(path.as_ref())?;
        let node = profile.single_node(node)?.node.clone();
        Ok(Self {
            path: path.as_ref().to_owned(),
            node,
            usage: None,
        })
    }

    /// Answers [`DeviceBackend::usage`] through `reader`: the fake driver's NVML
    /// (`libfgpu_fake_cuda.so`, through the `nvml` module's `NvmlUsage`), which sees the processes of
    /// every container that shares its state file (`FAKE_CUDA_STATE`,
    /// `FAKE_CUDA_NVML_HOST=1` for host PIDs; see `tests/fake-cuda/README.md`). The reader
    /// must know the profile's GPUs by UUID (`FAKE_CUDA_UUIDS`); a GPU it does not know is
    /// reported as failed.
    pub fn with_usage_reader(mut self, reader: std::sync::Arc<dyn super::UsageReader>) -> Self {
        self.usage = Some(reader);
        self
    }

    /// The node this backend serves.
    pub fn node(&self) -> &str {
        &self.node
    }
}

impl DeviceBackend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn enumerate(&self) -> Result<Vec<Gpu>, BackendError> {
        let profile = FakeProfile::load(&self.path)?;
        let mut gpus = profile.node(&self.node)?.gpus.clone();
        apply_faults(&self.path, &mut gpus)?;
        Ok(gpus)
    }

    fn usage(&self, since_us: u64) -> Result<Vec<super::GpuUsage>, BackendError> {
        let Some(reader) = &self.usage else {
            return Err(BackendError::UsageUnsupported { backend: "fake" });
        };
        let uuids: Vec<String> = self.enumerate()?.into_iter().map(|g| g.uuid).collect();
        Ok(reader.usage_of(&uuids, since_us))
    }

    fn create_mig_instance(
        &self,
        gpu_uuid: &str,
        profile: &str,
        placement: Placement,
    ) -> Result<MigInstance, BackendError> {
        let (gpu, table) = self.mig_gpu(gpu_uuid)?;
        let refused = |source| BackendError::Mig {
            uuid: gpu_uuid.to_owned(),
            source,
        };
        let state_path = mig_state_path(&self.path);
        let _lock = MigStateFile::lock(&state_path)?;
        let mut state = MigStateFile::load(&state_path)?;
        let existing = state
            .gpus
            .get(gpu_uuid)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut layout = mig::layout_of(table, existing).map_err(|e| BackendError::MigState {
            path: state_path.clone(),
            detail: format!("GPU {gpu_uuid}: {e}"),
        })?;
        let wanted = layout.profile(profile).map_err(refused)?;
        if placement.size != wanted.memory_slices {
            return Err(refused(mig::MigError::NoSuchPlacement {
                model: table.model,
                profile: wanted.name,
                start: placement.start,
                valid: wanted.starts,
            }));
        }
        let faults = FaultFile::load(&faults_path(&self.path))?;
        if faults
            .gpus
            .get(gpu_uuid)
            .is_some_and(|l| l.iter().any(|f| is_operation_fault(f)))
        {
            return Err(BackendError::MigCreateFailed {
                uuid: gpu_uuid.to_owned(),
                profile: profile.to_owned(),
                placement,
                detail: format!("injected fault {MIG_CREATE_FAILS:?}"),
            });
        }
        layout.take(profile, placement.start).map_err(refused)?;
        let gi_id = (1..)
            .find(|id| !existing.iter().any(|i| i.gi_id == *id))
            .unwrap_or(1);
        state.serial += 1;
        let mut device_nodes: Vec<DeviceNode> =
            gpu.primary_device_node().cloned().into_iter().collect();
        device_nodes.extend(fake_cap_nodes(&gpu, gi_id, 0));
        let instance = MigInstance {
            uuid: fake_mig_uuid(gpu_uuid, state.serial),
            gpu_uuid: gpu_uuid.to_owned(),
            profile: wanted.name.to_owned(),
            placement,
            gi_id,
            ci_id: 0,
            memory_bytes: wanted.memory_bytes(),
            device_nodes,
        };
        state
            .gpus
            .entry(gpu_uuid.to_owned())
            .or_default()
            .push(instance.clone());
        state.save(&state_path)?;
        Ok(instance)
    }

    fn destroy_mig_instance(&self, gpu_uuid: &str, mig_uuid: &str) -> Result<(), BackendError> {
        // Any mode: instances left from before the admin switched the GPU away from mig
        // must still be removable.
        self.node_gpu(gpu_uuid)?;
        let state_path = mig_state_path(&self.path);
        let _lock = MigStateFile::lock(&state_path)?;
        let mut state = MigStateFile::load(&state_path)?;
        let list = state.gpus.entry(gpu_uuid.to_owned()).or_default();
        let Some(pos) = list.iter().position(|i| i.uuid == mig_uuid) else {
            return Err(BackendError::MigInstanceNotFound {
                uuid: gpu_uuid.to_owned(),
                mig_uuid: mig_uuid.to_owned(),
                known: list.iter().map(|i| i.uuid.clone()).collect(),
            });
        };
        list.remove(pos);
        if list.is_empty() {
            state.gpus.remove(gpu_uuid);
        }
        state.save(&state_path)
    }

    fn list_mig_instances(&self, gpu_uuid: &str) -> Result<Vec<MigInstance>, BackendError> {
        // Any mode (a GPU switched away from mig may still hold instances).
        self.node_gpu(gpu_uuid)?;
        let mut state = MigStateFile::load(&mig_state_path(&self.path))?;
        Ok(state.gpus.remove(gpu_uuid).unwrap_or_default())
    }

    /// The profile's `mode:` for the GPU, re-read (`None` when the profile cannot be read:
    /// the enumeration fails then too).
    fn gpu_mode(&self, gpu_uuid: &str) -> Option<GpuMode> {
        self.mode(gpu_uuid).ok()
    }
}

/// Joins several faults in one `Health::Unhealthy` reason; the default
/// [`DeviceBackend::check_health`] splits on it.
pub const FAULT_SEPARATOR: &str = "; ";

/// Where faults for the profile at `profile` are injected: `<profile>.faults.json`.
pub fn faults_path(profile: &Path) -> PathBuf {
    let mut name = profile.as_os_str().to_owned();
    name.push(".faults.json");
    PathBuf::from(name)
}

/// Injected faults of a fake profile, by GPU UUID (`{"gpus": {"GPU-…": ["xid 79"]}}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultFile {
    /// Faults per GPU UUID; a GPU not listed (or with an empty list) has none.
    #[serde(default)]
    pub gpus: BTreeMap<String, Vec<String>>,
}

impl FaultFile {
    /// Reads the fault file at `path`; a missing file is no faults.
    pub fn load(path: &Path) -> Result<Self, BackendError> {
        let read = read_if_present(path).map_err(|source| BackendError::ProfileRead {
            path: path.to_owned(),
            source,
        })?;
        let Some(text) = read else {
            return Ok(Self::default());
        };
        serde_json::from_slice(&text).map_err(|e| {
            BackendError::Profile(ProfileError {
                path: path.to_owned(),
                node: None,
                field: None,
                message: format!(
                    "malformed fault file ({e}); expected {{\"gpus\": {{\"GPU-…\": [\"xid 79\"]}}}}"
                ),
            })
        })
    }

    /// Writes the file at `path` atomically (a temporary file renamed over it), so the
    /// backend never reads half of it.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let body = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, path)
    }
}

/// The bytes of the file at `path`, or `None` when there is no such file (the fault and
/// MIG state files are optional).
fn read_if_present(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Marks the GPUs of the profile at `profile` that have injected faults (its
/// [`faults_path`]) unhealthy, the faults joined by [`FAULT_SEPARATOR`] after any
/// `unhealthy:` reason of the profile.
pub fn apply_faults(profile: &Path, gpus: &mut [Gpu]) -> Result<(), BackendError> {
    let faults = FaultFile::load(&faults_path(profile))?;
    for gpu in gpus {
        let list: Vec<&String> = faults
            .gpus
            .get(&gpu.uuid)
            .into_iter()
            .flatten()
            .filter(|f| !is_operation_fault(f))
            .collect();
        if list.is_empty() {
            continue;
        }
        let mut reasons: Vec<String> = match &gpu.health {
            Health::Unhealthy { reason } => vec![reason.clone()],
            Health::Healthy => Vec::new(),
        };
        reasons.extend(list.into_iter().cloned());
        gpu.health = Health::Unhealthy {
            reason: reasons.join(FAULT_SEPARATOR),
        };
    }
    Ok(())
}

/// The fault-file word that makes MIG instance creation fail on a GPU (until cleared).
pub const MIG_CREATE_FAILS: &str = "mig-create-fails";

/// Whether a fault-file entry makes an operation fail rather than the GPU unhealthy.
fn is_operation_fault(entry: &str) -> bool {
    entry.trim().eq_ignore_ascii_case(MIG_CREATE_FAILS)
}

/// Where the fake keeps the MIG instances of the profile at `profile`:
/// `<profile>.mig.json`.
pub fn mig_state_path(profile: &Path) -> PathBuf {
    let mut name = profile.as_os_str().to_owned();
    name.push(".mig.json");
    PathBuf::from(name)
}

/// The fake's MIG instances, by GPU UUID
/// (`{"serial": 3, "gpus": {"GPU-…": [{"uuid": "MIG-…", …}]}}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigStateFile {
    /// Instances created so far on the whole node; each new one takes the next number (it
    /// seeds the instance's UUID, so a re-created instance gets a new one, as on a GPU).
    #[serde(default)]
    pub serial: u64,
    /// Instances per GPU UUID, in creation order.
    #[serde(default)]
    pub gpus: BTreeMap<String, Vec<MigInstance>>,
}

impl MigStateFile {
    /// Takes the exclusive advisory lock of the state file at `path` (on `<path>.lock`),
    /// held until the returned file is dropped. A creation or destruction holds it from its
    /// read to its write: the kubelet unprepares several claims at once, and two changes
    /// that both read the file before either wrote it would lose one (a destroyed instance
    /// written back by the other). A GPU's driver serialises the same calls.
    pub fn lock(path: &Path) -> Result<std::fs::File, BackendError> {
        let mut name = path.as_os_str().to_owned();
        name.push(".lock");
        let io = |source| BackendError::MigStateIo {
            path: path.to_owned(),
            action: "lock",
            source,
        };
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(PathBuf::from(name))
            .map_err(io)?;
        f.lock().map_err(io)?;
        Ok(f)
    }

    /// Reads the state file at `path`; a missing file is no instances.
    pub fn load(path: &Path) -> Result<Self, BackendError> {
        let read = read_if_present(path).map_err(|source| BackendError::MigStateIo {
            path: path.to_owned(),
            action: "read",
            source,
        })?;
        let Some(text) = read else {
            return Ok(Self::default());
        };
        serde_json::from_slice(&text).map_err(|e| BackendError::MigState {
            path: path.to_owned(),
            detail: e.to_string(),
        })
    }

    /// Writes the file at `path` atomically and durably: a temporary file, synced, renamed
    /// over it.
    pub fn save(&self, path: &Path) -> Result<(), BackendError> {
        let io = |source| BackendError::MigStateIo {
            path: path.to_owned(),
            action: "write",
            source,
        };
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let body = serde_json::to_vec_pretty(self).map_err(|e| io(std::io::Error::other(e)))?;
        {
            use std::io::Write as _;
            let mut f = std::fs::File::create(&tmp).map_err(io)?;
            f.write_all(&body).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, path).map_err(io)
    }
}

impl FakeBackend {
    /// The GPU `uuid` of this node, the profile's mode for it and its MIG table; the GPU
    /// must be in MIG mode.
    fn mig_gpu(&self, uuid: &str) -> Result<(Gpu, &'static mig::MigTable), BackendError> {
        let profile = FakeProfile::load(&self.path)?;
        let gpu = profile
            .node(&self.node)?
            .gpu_by_uuid(uuid)
            .cloned()
            .ok_or_else(|| BackendError::GpuNotFound {
                uuid: uuid.to_owned(),
            })?;
        let mode = profile.mode(uuid);
        if mode != GpuMode::Mig {
            return Err(BackendError::MigNotEnabled {
                uuid: uuid.to_owned(),
                mode,
            });
        }
        let table = mig::table_for(&gpu.product_name, gpu.memory_bytes).map_err(|source| {
            BackendError::MigUnknownModel {
                uuid: uuid.to_owned(),
                source,
            }
        })?;
        Ok((gpu, table))
    }

    /// The GPU `uuid` of this node.
    fn node_gpu(&self, uuid: &str) -> Result<Gpu, BackendError> {
        self.enumerate()?
            .into_iter()
            .find(|g| g.uuid == uuid)
            .ok_or_else(|| BackendError::GpuNotFound {
                uuid: uuid.to_owned(),
            })
    }

    /// The mode of the GPU `uuid` as the profile sets it now.
    pub fn mode(&self, uuid: &str) -> Result<GpuMode, BackendError> {
        Ok(FakeProfile::load(&self.path)?.mode(uuid))
    }
}

/// A fake MIG UUID from the parent's UUID and the node's creation serial.
fn fake_mig_uuid(gpu_uuid: &str, serial: u64) -> String {
    // FNV-1a over the parent UUID, then the serial: stable, and distinct per creation.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in gpu_uuid.bytes().chain(serial.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let hex = format!("{h:016x}{serial:016x}");
    format!(
        "MIG-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The capability device nodes of GPU instance `gi` / compute instance `ci` on the GPU with
/// `minor`, under the GPU's device directory. The minors are the fake's own numbering
/// (9 per GPU instance, 15 GPU instances per GPU, after the driver's `config` 1 and
/// `monitor` 2); a real node lists them in `/proc/driver/nvidia-caps/mig-minors`.
fn fake_cap_nodes(gpu: &Gpu, gi: u32, ci: u32) -> Vec<DeviceNode> {
    let host_dir = gpu
        .primary_device_node()
        .and_then(|n| n.host_path.parent())
        .map_or_else(|| PathBuf::from(DEFAULT_DEVICE_ROOT), Path::to_path_buf);
    let gi_minor = 3 + gpu.minor * 135 + gi * 9;
    [gi_minor, gi_minor + 1 + ci]
        .into_iter()
        .map(|minor| {
            let name = format!("nvidia-caps/nvidia-cap{minor}");
            DeviceNode {
                path: Path::new(CONTAINER_DEV_DIR).join(&name),
                host_path: host_dir.join(&name),
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Raw schema (what the YAML may contain) and its validation.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDefaults {
    driver_version: Option<String>,
    cuda_version: Option<String>,
    device_root: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawProfile {
    #[serde(default)]
    defaults: RawDefaults,
    nodes: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawNode {
    name: String,
    driver_version: Option<String>,
    cuda_version: Option<String>,
    device_root: Option<PathBuf>,
    gpus: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGpu {
    uuid: String,
    product_name: String,
    memory: Value,
    sm_count: u32,
    compute_capability: Value,
    numa_node: Option<u32>,
    #[serde(rename = "pciBusID")]
    pci_bus_id: Option<String>,
    pcie_root: Option<String>,
    #[serde(default)]
    mig_capable: bool,
    index: Option<u32>,
    minor: Option<u32>,
    unhealthy: Option<String>,
    mode: Option<String>,
}

struct Parser<'a> {
    path: &'a Path,
}

/// Where a GPU with a given UUID was first seen: (node, position).
type UuidSeen = HashMap<String, (String, usize)>;

impl Parser<'_> {
    fn err(
        &self,
        node: Option<&str>,
        field: Option<String>,
        message: impl Into<String>,
    ) -> ProfileError {
        ProfileError {
            path: self.path.to_owned(),
            node: node.map(str::to_owned),
            field,
            message: one_line(&message.into()),
        }
    }

    /// Deserialises `value` as `T`, naming the offending field (below `prefix`) on error.
    fn typed<T: for<'de> Deserialize<'de>>(
        &self,
        value: Value,
        node: Option<&str>,
        prefix: Option<&str>,
    ) -> Result<T, ProfileError> {
        serde_path_to_error::deserialize(value).map_err(|e| {
            let inner = e.path().to_string();
            let field = match (prefix, inner.as_str()) {
                (p, ".") => p.map(str::to_owned),
                (Some(p), f) => Some(format!("{p}.{f}")),
                (None, f) => Some(f.to_owned()),
            };
            self.err(node, field, e.into_inner().to_string())
        })
    }

    fn profile(&self, text: &str) -> Result<FakeProfile, ProfileError> {
        let doc: Value = read_yaml(text).map_err(|e| {
            let at = e.location();
            let node =
                at.and_then(|at| enclosing_node_name(text, usize::try_from(at.line()).ok()?));
            // One spelling of a location in every message of ours: `line L column C`.
            let mut message = e.to_string();
            if let Some(at) = at {
                let (l, c) = (at.line(), at.column());
                message = message.replace(
                    &format!("line {l}, column {c}"),
                    &format!("line {l} column {c}"),
                );
            }
            self.err(node.as_deref(), None, format!("invalid YAML: {message}"))
        })?;
        if doc.is_null() {
            return Err(self.err(None, None, "the profile is empty; it needs a `nodes:` list"));
        }
        let raw: RawProfile = self.typed(doc, None, None)?;
        if raw.nodes.is_empty() {
            return Err(self.err(None, Some("nodes".into()), "must list at least one node"));
        }
        let mut nodes: Vec<NodeInventory> = Vec::with_capacity(raw.nodes.len());
        let mut uuids = UuidSeen::new();
        let mut modes = BTreeMap::new();
        for (pos, value) in raw.nodes.into_iter().enumerate() {
            let inv = self.node(pos, value, &raw.defaults, &mut uuids, &mut modes)?;
            if nodes.iter().any(|n| n.node == inv.node) {
                return Err(self.err(
                    Some(&inv.node),
                    Some("name".into()),
                    format!("duplicate node name (nodes[{pos}] repeats an earlier node)"),
                ));
            }
            nodes.push(inv);
        }
        Ok(FakeProfile {
            path: self.path.to_owned(),
            nodes,
            modes,
        })
    }

    fn node(
        &self,
        pos: usize,
        value: Value,
        defaults: &RawDefaults,
        uuids: &mut UuidSeen,
        modes: &mut BTreeMap<String, GpuMode>,
    ) -> Result<NodeInventory, ProfileError> {
        // Name the node in messages as early as possible; fall back to its position.
        let label = value
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("nodes[{pos}]"));
        let raw: RawNode = self.typed(value, Some(&label), None)?;
        let name = raw.name.as_str();
        if let Err(why) = check_node_name(name) {
            return Err(self.err(Some(&label), Some("name".into()), why.to_string()));
        }
        if raw.gpus.is_empty() {
            return Err(self.err(
                Some(name),
                Some("gpus".into()),
                "must list at least one GPU",
            ));
        }
        let driver_version = raw
            .driver_version
            .or_else(|| defaults.driver_version.clone())
            .unwrap_or_else(|| DEFAULT_DRIVER_VERSION.to_owned());
        let cuda_version = raw
            .cuda_version
            .or_else(|| defaults.cuda_version.clone())
            .unwrap_or_else(|| DEFAULT_CUDA_VERSION.to_owned());
        let device_root = raw
            .device_root
            .or_else(|| defaults.device_root.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DEVICE_ROOT));
        if !device_root.is_absolute() {
            return Err(self.err(
                Some(name),
                Some("deviceRoot".into()),
                format!(
                    "{:?} must be an absolute path (e.g. /dev)",
                    device_root.display()
                ),
            ));
        }
        for (field, v) in [
            ("driverVersion", &driver_version),
            ("cudaVersion", &cuda_version),
        ] {
            if !is_dotted_version(v) {
                return Err(self.err(
                    Some(name),
                    Some(field.into()),
                    format!("{v:?} is not a version (digits and dots, e.g. 550.54.15 or 12.4)"),
                ));
            }
        }

        let mut gpus: Vec<Gpu> = Vec::with_capacity(raw.gpus.len());
        for (i, value) in raw.gpus.into_iter().enumerate() {
            let f = |field: &str| Some(format!("gpu[{i}].{field}"));
            let g: RawGpu = self.typed(value, Some(name), Some(&format!("gpu[{i}]")))?;

            check_uuid(&g.uuid).map_err(|why| self.err(Some(name), f("uuid"), why.to_string()))?;
            if let Some((other_node, other_pos)) = uuids.get(&g.uuid) {
                let at = if other_node == name {
                    format!("gpu[{other_pos}] of the same node")
                } else {
                    format!("node {other_node:?} gpu[{other_pos}]")
                };
                return Err(self.err(
                    Some(name),
                    f("uuid"),
                    format!(
                        "duplicate UUID {:?}, already used by {at}; UUIDs must be unique",
                        g.uuid
                    ),
                ));
            }
            if g.product_name.trim().is_empty() {
                return Err(self.err(
                    Some(name),
                    f("productName"),
                    "must not be empty (e.g. NVIDIA H100 80GB HBM3)",
                ));
            }
            let memory_bytes = memory(&g.memory)
                .map_err(|why| self.err(Some(name), f("memory"), why.to_string()))?;
            if g.sm_count == 0 {
                return Err(self.err(
                    Some(name),
                    f("smCount"),
                    "must be greater than 0 (e.g. 132 for H100 SXM)",
                ));
            }
            let cc = compute_capability(&g.compute_capability)
                .map_err(|why| self.err(Some(name), f("computeCapability"), why.to_string()))?;
            let pci_bus_id = match &g.pci_bus_id {
                Some(id) => normalize_pci_bus_id(id)
                    .map_err(|why| self.err(Some(name), f("pciBusID"), why.to_string()))?,
                None => synthetic_pci_bus_id(i).ok_or_else(|| {
                    self.err(
                        Some(name),
                        f("pciBusID"),
                        "cannot invent one beyond 255 GPUs; set it explicitly",
                    )
                })?,
            };
            if let Some(root) = &g.pcie_root {
                check_pcie_root(root)
                    .map_err(|why| self.err(Some(name), f("pcieRoot"), why.to_string()))?;
            }
            let health = match g.unhealthy {
                None => Health::Healthy,
                Some(reason) if reason.trim().is_empty() => {
                    return Err(self.err(
                        Some(name),
                        f("unhealthy"),
                        "must give a reason (e.g. \"XID 79: GPU has fallen off the bus\"); omit the key for a healthy GPU",
                    ));
                }
                Some(reason) => Health::Unhealthy { reason },
            };
            let index = g.index.unwrap_or(u32::try_from(i).unwrap_or(u32::MAX));
            let minor = g.minor.unwrap_or(index);
            for (field, clash) in [
                ("index", gpus.iter().position(|o| o.index == index)),
                ("minor", gpus.iter().position(|o| o.minor == minor)),
                (
                    "pciBusID",
                    gpus.iter().position(|o| o.pci_bus_id == pci_bus_id),
                ),
            ] {
                if let Some(other) = clash {
                    return Err(self.err(
                        Some(name),
                        f(field),
                        format!("same {field} as gpu[{other}]; it must be unique within a node"),
                    ));
                }
            }
            let mode = match g.mode.as_deref() {
                None => GpuMode::default(),
                Some(text) => text
                    .parse()
                    .map_err(|why: String| self.err(Some(name), f("mode"), why))?,
            };
            if mode == GpuMode::Mig {
                if !g.mig_capable {
                    return Err(self.err(
                        Some(name),
                        f("mode"),
                        "mig needs a MIG-capable GPU (set migCapable: true)",
                    ));
                }
                mig::table_for(g.product_name.trim(), memory_bytes)
                    .map_err(|why| self.err(Some(name), f("mode"), format!("mig: {why}")))?;
            }
            modes.insert(g.uuid.clone(), mode);
            uuids.insert(g.uuid.clone(), (name.to_owned(), i));
            gpus.push(Gpu {
                index,
                minor,
                uuid: g.uuid,
                product_name: g.product_name.trim().to_owned(),
                memory_bytes,
                sm_count: g.sm_count,
                compute_capability: cc,
                driver_version: driver_version.clone(),
                cuda_driver_version: cuda_version.clone(),
                pci_bus_id,
                pcie_root: g.pcie_root,
                numa_node: g.numa_node,
                mig_capable: g.mig_capable,
                enforcement: Default::default(),
                health,
                device_nodes: DeviceNode::standard_set(minor, &device_root),
            });
        }
        Ok(NodeInventory::new(name, gpus))
    }
}

/// The node whose block contains line `line` (1-based) of an unparsable profile: the value
/// of the last `name:` key at or above it. Only nodes have a `name` key in this schema, so
/// in block-style YAML this names the right node; it is a hint for the error message only.
fn enclosing_node_name(text: &str, line: usize) -> Option<String> {
    text.lines()
        .take(line)
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("- ").map_or(l, str::trim_start);
            l.strip_prefix("name:")
        })
        .filter_map(|v| {
            let v = v.split(" #").next().unwrap_or_default().trim();
            let v = v.trim_matches(|c| c == '"' || c == '\'');
            (!v.is_empty()).then(|| v.to_owned())
        })
        .last()
}

/// Collapses a message to one line (YAML errors may quote multi-line input).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Why the value of one profile field is invalid: what is wrong and what would be valid.
/// [`Parser::err`] adds the file, the node and the field path; the NVML backend reuses
/// [`InvalidValue::PciBusId`] for the address the driver reports.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InvalidValue {
    /// `name` is not a DNS-1123 subdomain.
    #[error(
        "{0:?} is not a valid Kubernetes node name (lower-case letters, digits, '-' and '.', e.g. gpu-node-1)"
    )]
    NodeName(String),
    /// `uuid` is not `GPU-` followed by hex digits and dashes.
    #[error(
        "{0:?} is not a GPU UUID (\"GPU-\" followed by hex digits and dashes, e.g. GPU-8a3c1f2e-5b6d-4e7f-9a0b-1c2d3e4f5a6b)"
    )]
    Uuid(String),
    /// `memory` is a string that is not a Kubernetes quantity of whole bytes.
    #[error(transparent)]
    Quantity(#[from] fgpu_api::quantity::QuantityError),
    /// `memory` is a number that is not a non-negative integer.
    #[error("{0} is not a positive byte count (e.g. 80Gi)")]
    ByteCount(serde_json::Number),
    /// `memory` is neither a string nor a number (the kind found).
    #[error("expected a quantity such as 80Gi, found {0}")]
    MemoryType(&'static str),
    /// `memory` is 0.
    #[error("must be greater than 0 (e.g. 80Gi)")]
    ZeroMemory,
    /// `computeCapability` is neither a string nor a number (the kind found).
    #[error("expected MAJOR.MINOR such as \"9.0\", found {0}")]
    ComputeCapabilityType(&'static str),
    /// `computeCapability` is not `MAJOR.MINOR`.
    #[error(transparent)]
    ComputeCapability(#[from] ParseComputeCapabilityError),
    /// `computeCapability` parses but names no architecture this driver knows.
    #[error(
        "{0} is not a known NVIDIA architecture (6.x Pascal to 12.x Blackwell, e.g. \"8.0\" or \"9.0\")"
    )]
    UnknownArchitecture(ComputeCapability),
    /// `pciBusID` is not `DOMAIN:BUS:DEVICE.FUNCTION`.
    #[error("{0:?} is not a PCI address (DOMAIN:BUS:DEVICE.FUNCTION, e.g. 0000:1b:00.0)")]
    PciBusId(String),
    /// `pcieRoot` is not `pciDDDD:BB`.
    #[error("{0:?} is not a PCIe root (pciDDDD:BB as in /sys/devices, e.g. pci0000:00)")]
    PcieRoot(String),
}

fn check_node_name(name: &str) -> Result<(), InvalidValue> {
    let ok_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.len() <= 253 && name.split('.').all(ok_label) {
        Ok(())
    } else {
        Err(InvalidValue::NodeName(name.to_owned()))
    }
}

fn check_uuid(uuid: &str) -> Result<(), InvalidValue> {
    let rest = uuid.strip_prefix("GPU-").unwrap_or_default();
    if !rest.is_empty()
        && rest.bytes().any(|b| b.is_ascii_hexdigit())
        && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
    {
        Ok(())
    } else {
        Err(InvalidValue::Uuid(uuid.to_owned()))
    }
}

fn memory(v: &Value) -> Result<u64, InvalidValue> {
    let bytes = match v {
        Value::String(s) => fgpu_api::quantity::parse_u64(s)?,
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| InvalidValue::ByteCount(n.clone()))?,
        other => return Err(InvalidValue::MemoryType(kind_of(other))),
    };
    if bytes == 0 {
        return Err(InvalidValue::ZeroMemory);
    }
    Ok(bytes)
}

fn compute_capability(v: &Value) -> Result<ComputeCapability, InvalidValue> {
    let text = match v {
        Value::String(s) => s.clone(),
        // `computeCapability: 8.6` without quotes arrives as a float; keep one decimal.
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.1}"),
            _ => format!("{n}"),
        },
        other => return Err(InvalidValue::ComputeCapabilityType(kind_of(other))),
    };
    let cc: ComputeCapability = text.parse()?;
    if cc.architecture() == Architecture::Unknown {
        return Err(InvalidValue::UnknownArchitecture(cc));
    }
    Ok(cc)
}

/// The YAML document `text` as a JSON value (a document of nothing but comments is null).
fn read_yaml(text: &str) -> Result<Value, serde_saphyr::Error> {
    let blank = text
        .lines()
        .map(str::trim)
        .all(|l| l.is_empty() || l.starts_with('#') || l == "---");
    if blank {
        return Ok(Value::Null);
    }
    // YAML 1.2's core schema, as Kubernetes manifests are read: `n`, `no`, `on` stay
    // strings (a node named `n` is not `false`); errors as one line, without a snippet.
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    options.with_snippet = false;
    serde_saphyr::from_str_with_options(text, options)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn is_dotted_version(v: &str) -> bool {
    !v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `DDDD:BB:DD.F` (or NVML's 8-digit domain) → sysfs form, lower-case with a 4-digit domain.
pub(crate) fn normalize_pci_bus_id(id: &str) -> Result<String, InvalidValue> {
    let bad = || InvalidValue::PciBusId(id.to_owned());
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let mut parts = id.trim().split(':');
    let (Some(domain), Some(bus), Some(devfn), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
    let domain = match domain.len() {
        8 if hex(domain, 8) && domain.starts_with("0000") => &domain[4..],
        4 if hex(domain, 4) => domain,
        _ => return Err(bad()),
    };
    let function_ok = func.len() == 1 && func.bytes().all(|b| (b'0'..=b'7').contains(&b));
    if !(hex(bus, 2) && hex(dev, 2) && function_ok) {
        return Err(bad());
    }
    Ok(format!("{domain}:{bus}:{dev}.{func}").to_ascii_lowercase())
}

fn synthetic_pci_bus_id(pos: usize) -> Option<String> {
    let bus = u8::try_from(pos + 1).ok()?;
    Some(format!("0000:{bus:02x}:00.0"))
}

fn check_pcie_root(root: &str) -> Result<(), InvalidValue> {
    let ok = root
        .strip_prefix("pci")
        .and_then(|r| r.split_once(':'))
        .is_some_and(|(d, b)| {
            d.len() == 4
                && b.len() == 2
                && d.bytes().chain(b.bytes()).all(|c| c.is_ascii_hexdigit())
        });
    if ok {
        Ok(())
    } else {
        Err(InvalidValue::PcieRoot(root.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::GIB;

    const P: &str = "deploy/fake/x.yaml";

    fn gpu(uuid: &str, extra: &str) -> String {
        format!(
            "      - uuid: {uuid}\n        productName: NVIDIA A100-SXM4-80GB\n        memory: 80Gi\n        smCount: 108\n        computeCapability: \"8.0\"\n{extra}"
        )
    }

    fn two_nodes(extra_b: &str) -> String {
        format!(
            "nodes:\n  - name: node-a\n    gpus:\n{}{}  - name: node-b\n    gpus:\n{}",
            gpu("GPU-aa", ""),
            gpu("GPU-ab", ""),
            gpu("GPU-ba", extra_b)
        )
    }

    fn err(text: &str) -> String {
        FakeProfile::parse(text, P).unwrap_err().to_string()
    }

    #[test]
    fn minimal_profile_gets_defaults() {
        let p = FakeProfile::parse(&two_nodes(""), P).unwrap();
        assert_eq!(p.node_names(), ["node-a", "node-b"]);
        let a = p.node("node-a").unwrap();
        assert_eq!(a.gpus.len(), 2);
        let g1 = &a.gpus[1];
        assert_eq!((g1.index, g1.minor), (1, 1));
        assert_eq!(g1.memory_bytes, 80 * GIB);
        assert_eq!(g1.pci_bus_id, "0000:02:00.0");
        assert_eq!(g1.driver_version, DEFAULT_DRIVER_VERSION);
        assert_eq!(g1.cuda_driver_version, DEFAULT_CUDA_VERSION);
        assert_eq!(g1.architecture(), Architecture::Ampere);
        assert_eq!(g1.device_nodes[0].host_path, Path::new("/dev/nvidia1"));
        assert!(g1.is_healthy());
    }

    #[test]
    fn defaults_and_node_overrides_apply() {
        let text = format!(
            "defaults:\n  driverVersion: \"535.1\"\n  deviceRoot: /tmp/fake-dev\nnodes:\n  - name: n\n    cudaVersion: \"12.2\"\n    gpus:\n{}",
            gpu(
                "GPU-01",
                "        minor: 7\n        unhealthy: XID 79\n        pciBusID: 00000000:3B:00.0\n        numaNode: 1\n"
            )
        );
        let p = FakeProfile::parse(&text, P).unwrap();
        let g = &p.nodes()[0].gpus[0];
        assert_eq!(g.driver_version, "535.1");
        assert_eq!(g.cuda_driver_version, "12.2");
        assert_eq!((g.index, g.minor), (0, 7));
        assert_eq!(g.pci_bus_id, "0000:3b:00.0");
        assert_eq!(g.numa_node, Some(1));
        assert_eq!(
            g.health,
            Health::Unhealthy {
                reason: "XID 79".into()
            }
        );
        assert_eq!(g.device_nodes[0].path, Path::new("/dev/nvidia7"));
        assert_eq!(
            g.device_nodes[0].host_path,
            Path::new("/tmp/fake-dev/nvidia7")
        );
    }

    #[test]
    fn zero_memory_names_file_node_and_field() {
        let text = two_nodes("").replacen("memory: 80Gi", "memory: 0", 2);
        // the second occurrence is node-a gpu[1]
        let text = text.replacen("memory: 0", "memory: 80Gi", 1);
        assert_eq!(
            err(&text),
            r#"deploy/fake/x.yaml: node "node-a" gpu[1].memory: must be greater than 0 (e.g. 80Gi)"#
        );
    }

    #[test]
    fn duplicate_uuid_across_nodes_and_within_a_node() {
        let text = two_nodes("").replace("GPU-ba", "GPU-ab");
        assert_eq!(
            err(&text),
            r#"deploy/fake/x.yaml: node "node-b" gpu[0].uuid: duplicate UUID "GPU-ab", already used by node "node-a" gpu[1]; UUIDs must be unique"#
        );
        let text = two_nodes("").replace("GPU-ab", "GPU-aa");
        assert!(err(&text).contains(r#"node "node-a" gpu[1].uuid: duplicate UUID "GPU-aa", already used by gpu[0] of the same node"#));
    }

    #[test]
    fn unknown_field_is_named() {
        let e = err(&two_nodes("        colour: green\n"));
        assert!(
            e.starts_with(
                r#"deploy/fake/x.yaml: node "node-b" gpu[0].colour: unknown field `colour`"#
            ),
            "{e}"
        );
        assert!(!e.contains('\n'));
    }

    #[test]
    fn wrong_type_names_the_field() {
        let e = err(&two_nodes("").replacen("smCount: 108", "smCount: many", 1));
        assert!(
            e.starts_with(r#"deploy/fake/x.yaml: node "node-a" gpu[0].smCount: invalid type"#),
            "{e}"
        );
    }

    #[test]
    fn bad_yaml_is_one_line() {
        let e = err("nodes:\n  - gpus: [unclosed\n");
        assert!(e.starts_with("deploy/fake/x.yaml: invalid YAML:"), "{e}");
        // The location of the unclosed bracket itself (serde_yaml named the end of the
        // input, line 3 column 1, where it gave up).
        assert!(e.contains("line 2 column 11"), "{e}");
        assert!(!e.contains('\n'));
        // Inside a node's block the message names the node.
        let text = format!("{}      - uuid: [GPU-x\n", two_nodes(""));
        let e = err(&text);
        assert!(
            e.starts_with(r#"deploy/fake/x.yaml: node "node-b": invalid YAML: "#),
            "{e}"
        );
        let text = two_nodes("").replacen("    gpus:", "    gpus: {", 1);
        assert!(err(&text).starts_with(r#"deploy/fake/x.yaml: node "node-a": invalid YAML: "#));
    }

    #[test]
    fn structural_errors() {
        assert_eq!(
            err(""),
            "deploy/fake/x.yaml: the profile is empty; it needs a `nodes:` list"
        );
        assert_eq!(
            err("nodes: []"),
            "deploy/fake/x.yaml: nodes: must list at least one node"
        );
        assert_eq!(
            err("nodes:\n  - name: n\n    gpus: []\n"),
            r#"deploy/fake/x.yaml: node "n" gpus: must list at least one GPU"#
        );
        assert!(err("nodes:\n  - gpus: []\n").contains(r#"node "nodes[0]": missing field `name`"#));
        assert!(
            err("nodes:\n  - name: Bad_Name\n    gpus: []\n")
                .contains("not a valid Kubernetes node name")
        );
        let dup = format!(
            "nodes:\n  - name: n\n    gpus:\n{}  - name: n\n    gpus:\n{}",
            gpu("GPU-1", ""),
            gpu("GPU-2", "")
        );
        assert!(err(&dup).contains(r#"node "n" name: duplicate node name"#));
    }

    #[test]
    fn field_checks() {
        let one = |extra: &str, from: &str, to: &str| {
            err(&format!(
                "nodes:\n  - name: n\n    gpus:\n{}",
                gpu("GPU-1", extra).replacen(from, to, 1)
            ))
        };
        assert!(
            one(
                "",
                "computeCapability: \"8.0\"",
                "computeCapability: \"eight\""
            )
            .contains(r#"gpu[0].computeCapability: invalid compute capability "eight""#)
        );
        assert!(
            one(
                "",
                "computeCapability: \"8.0\"",
                "computeCapability: \"5.2\""
            )
            .contains("not a known NVIDIA architecture")
        );
        assert!(
            one("", "uuid: GPU-1", "uuid: abc").contains(r#"gpu[0].uuid: "abc" is not a GPU UUID"#)
        );
        assert!(
            one("", "memory: 80Gi", "memory: 80GB")
                .contains(r#"gpu[0].memory: "80GB" has an unknown suffix"#)
        );
        assert!(
            one("", "smCount: 108", "smCount: 0")
                .contains("gpu[0].smCount: must be greater than 0")
        );
        assert!(
            one("        pciBusID: 1b:00.0\n", "", "")
                .contains("gpu[0].pciBusID: \"1b:00.0\" is not a PCI address")
        );
        assert!(one("        pcieRoot: root0\n", "", "").contains("gpu[0].pcieRoot:"));
        assert!(
            one("        unhealthy: \"\"\n", "", "")
                .contains("gpu[0].unhealthy: must give a reason")
        );
        // unquoted float compute capability is accepted
        let ok = format!(
            "nodes:\n  - name: n\n    gpus:\n{}",
            gpu("GPU-1", "").replace("\"8.0\"", "8.6")
        );
        assert_eq!(
            FakeProfile::parse(&ok, P).unwrap().nodes()[0].gpus[0].compute_capability,
            ComputeCapability::new(8, 6)
        );
    }

    #[test]
    fn duplicate_index_minor_or_bus_id_within_node() {
        let text = format!(
            "nodes:\n  - name: n\n    gpus:\n{}{}",
            gpu("GPU-1", "        minor: 5\n"),
            gpu("GPU-2", "        minor: 5\n")
        );
        assert_eq!(
            err(&text),
            r#"deploy/fake/x.yaml: node "n" gpu[1].minor: same minor as gpu[0]; it must be unique within a node"#
        );
    }

    #[test]
    fn node_selection() {
        let p = FakeProfile::parse(&two_nodes(""), P).unwrap();
        let e = p.single_node(Some("nope")).unwrap_err();
        assert!(e.is_bad_input());
        assert_eq!(
            e.to_string(),
            r#"deploy/fake/x.yaml: unknown node "nope"; known nodes: node-a, node-b"#
        );
        assert!(matches!(
            p.single_node(None),
            Err(BackendError::NodeRequired { .. })
        ));
        assert_eq!(
            p.single_node(Some("node-b")).unwrap().gpus[0].uuid,
            "GPU-ba"
        );
    }

    #[test]
    fn backend_rereads_the_file_for_health() {
        let dir = std::env::temp_dir().join(format!("fgpu-fake-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.yaml");
        std::fs::write(&file, two_nodes("")).unwrap();
        let b = FakeBackend::open(&file, Some("node-b")).unwrap();
        assert_eq!(b.health("GPU-ba").unwrap(), Health::Healthy);
        std::fs::write(&file, two_nodes("        unhealthy: XID 48\n")).unwrap();
        assert_eq!(
            b.health("GPU-ba").unwrap(),
            Health::Unhealthy {
                reason: "XID 48".into()
            }
        );
        assert!(matches!(
            b.health("GPU-zz"),
            Err(BackendError::GpuNotFound { .. })
        ));
        let inv = b.inventory("node-b").unwrap();
        assert_eq!(inv.gpus.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn injected_faults_overlay_the_profile_and_read_back_as_faults() {
        use crate::health::Fault;
        let dir = std::env::temp_dir().join(format!("fgpu-fake-faults-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.yaml");
        std::fs::write(&file, two_nodes("        unhealthy: XID 92\n")).unwrap();
        let b = FakeBackend::open(&file, Some("node-b")).unwrap();
        let known = vec!["GPU-ba".to_owned(), "GPU-gone".to_owned()];
        let reports = b.check_health(&known).unwrap();
        assert_eq!(reports[0].faults, vec![Fault::Xid(92)]);
        assert!(
            matches!(reports[1].faults.as_slice(), [Fault::Lost(_)]),
            "{reports:?}"
        );

        let faults = faults_path(&file);
        let mut f = FaultFile::default();
        f.gpus
            .insert("GPU-ba".into(), vec!["xid 79".into(), "ecc".into()]);
        f.save(&faults).unwrap();
        let reports = b.check_health(&known[..1]).unwrap();
        assert_eq!(
            reports[0].faults,
            vec![Fault::Xid(92), Fault::Xid(79), Fault::DoubleBitEcc]
        );
        // A malformed fault file is an error naming it; the profile is not touched.
        std::fs::write(&faults, "{\"gpu\": 1}").unwrap();
        let e = b.enumerate().unwrap_err().to_string();
        assert!(
            e.contains("p.yaml.faults.json") && e.contains("malformed"),
            "{e}"
        );
        // Cleared: back to the profile's own reason.
        FaultFile::default().save(&faults).unwrap();
        assert_eq!(b.check_health(&[]).unwrap()[0].faults, vec![Fault::Xid(92)]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    const H100: &str = "GPU-a1c44256-6d3a-4972-9ea9-d296185fc8ff";
    const H100_SHARED: &str = "GPU-63367e56-cdb4-4537-be42-f7abdf387237";

    /// A node with one H100 in MIG mode and one in the default mode, in a fresh directory.
    fn mig_node(tag: &str) -> (PathBuf, FakeBackend) {
        let dir = std::env::temp_dir().join(format!("fgpu-fake-mig-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.yaml");
        let h100 = |uuid: &str, extra: &str| {
            format!(
                "      - uuid: {uuid}\n        productName: NVIDIA H100 80GB HBM3\n        memory: 81559Mi\n        smCount: 132\n        computeCapability: \"9.0\"\n        migCapable: true\n{extra}"
            )
        };
        let text = format!(
            "defaults:\n  deviceRoot: /tmp/fake-dev\nnodes:\n  - name: n\n    gpus:\n{}{}",
            h100(H100, "        mode: mig\n"),
            h100(H100_SHARED, "")
        );
        std::fs::write(&file, text).unwrap();
        let backend = FakeBackend::open(&file, None).unwrap();
        (dir, backend)
    }

    fn at(start: u8, size: u8) -> Placement {
        Placement { start, size }
    }

    #[test]
    fn the_backend_reports_the_profile_mode() {
        let (dir, b) = mig_node("mode");
        let b: &dyn DeviceBackend = &b;
        assert_eq!(b.gpu_mode(H100), Some(GpuMode::Mig));
        assert_eq!(b.gpu_mode(H100_SHARED), Some(GpuMode::Shared));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn mode_is_parsed_and_checked() {
        let text = |extra: &str| format!("nodes:\n  - name: n\n    gpus:\n{}", gpu("GPU-1", extra));
        let p =
            FakeProfile::parse(&text("        migCapable: true\n        mode: mig\n"), P).unwrap();
        assert_eq!(p.mode("GPU-1"), GpuMode::Mig);
        let p = FakeProfile::parse(&text("        mode: whole\n"), P).unwrap();
        assert_eq!(p.mode("GPU-1"), GpuMode::Whole);
        assert_eq!(
            FakeProfile::parse(&text(""), P).unwrap().mode("GPU-1"),
            GpuMode::Shared
        );
        assert_eq!(
            err(&text("        mode: mig\n")),
            r#"deploy/fake/x.yaml: node "n" gpu[0].mode: mig needs a MIG-capable GPU (set migCapable: true)"#
        );
        assert_eq!(
            err(&text("        mode: split\n")),
            r#"deploy/fake/x.yaml: node "n" gpu[0].mode: "split" is not a GPU mode (shared, mig or whole)"#
        );
        // A MIG-capable GPU fgpu has no table for: named, not guessed.
        let l40 = text("        migCapable: true\n        mode: mig\n")
            .replace("NVIDIA A100-SXM4-80GB", "NVIDIA H100 NVL")
            .replace("memory: 80Gi", "memory: 95830Mi");
        let e = err(&l40);
        assert!(
            e.starts_with(r#"deploy/fake/x.yaml: node "n" gpu[0].mode: mig: no MIG profile table for "NVIDIA H100 NVL" with 93.6 GiB"#),
            "{e}"
        );
    }

    /// Creations and destructions from several threads at once (the kubelet unprepares
    /// claims in parallel) lose no update: every instance made is listed until destroyed,
    /// and none is left at the end. Without the state file's lock, a destruction read
    /// before another's write brought the other's instance back (seen in e2e 35).
    #[test]
    fn concurrent_creations_and_destructions_lose_no_update() {
        let (dir, b) = mig_node("concurrent");
        for round in 0..10 {
            let made: Vec<MigInstance> = std::thread::scope(|s| {
                let b = &b;
                let handles: Vec<_> = (0..7u8)
                    .map(|start| {
                        s.spawn(move || b.create_mig_instance(H100, "1g.10gb", at(start, 1)))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap().unwrap())
                    .collect()
            });
            assert_eq!(
                b.list_mig_instances(H100).unwrap().len(),
                7,
                "round {round}"
            );
            std::thread::scope(|s| {
                let b = &b;
                for i in &made {
                    s.spawn(move || b.destroy_mig_instance(H100, &i.uuid).unwrap());
                }
            });
            assert!(
                b.list_mig_instances(H100).unwrap().is_empty(),
                "round {round}: left {:?}",
                b.list_mig_instances(H100).unwrap()
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn mig_instances_survive_a_reload_and_are_destroyed() {
        let (dir, b) = mig_node("reload");
        assert!(b.list_mig_instances(H100).unwrap().is_empty());
        let a = b.create_mig_instance(H100, "3g.40gb", at(4, 4)).unwrap();
        let c = b.create_mig_instance(H100, "1g.10gb", at(0, 1)).unwrap();
        assert!(
            a.uuid.starts_with("MIG-") && a.uuid.len() == 40,
            "{}",
            a.uuid
        );
        assert_ne!(a.uuid, c.uuid);
        assert_eq!((a.gi_id, c.gi_id, a.ci_id), (1, 2, 0));
        assert_eq!(a.memory_bytes, 40 * GIB);
        assert_eq!(a.device_nodes[0].path, Path::new("/dev/nvidia0"));
        assert_eq!(
            a.device_nodes[1].host_path,
            Path::new("/tmp/fake-dev/nvidia-caps/nvidia-cap12")
        );
        assert_eq!(
            a.device_nodes[2].path,
            Path::new("/dev/nvidia-caps/nvidia-cap13")
        );

        // A restarted plugin (a new backend on the same files) sees both.
        let again = FakeBackend::open(b.path.clone(), None).unwrap();
        assert_eq!(
            again.list_mig_instances(H100).unwrap(),
            vec![a.clone(), c.clone()]
        );
        again.destroy_mig_instance(H100, &a.uuid).unwrap();
        assert_eq!(b.list_mig_instances(H100).unwrap(), vec![c.clone()]);
        let e = b.destroy_mig_instance(H100, &a.uuid).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "GPU {H100}: no MIG instance {:?}; it has {}",
                a.uuid, c.uuid
            )
        );
        // The freed slices take a new instance, with a new UUID and the lowest free GI id.
        let d = b.create_mig_instance(H100, "4g.40gb", at(0, 4));
        assert!(
            matches!(d, Err(BackendError::Mig { .. })),
            "slice 0 is still c's"
        );
        let d = b.create_mig_instance(H100, "3g.40gb", at(4, 4)).unwrap();
        assert_eq!(d.gi_id, 1);
        assert_ne!(d.uuid, a.uuid);
        assert!(b.list_mig_instances("GPU-ffff").is_err());
        // The admin switches the GPU back to shared: no new instance, but the old ones are
        // still listed and can be destroyed.
        let text = std::fs::read_to_string(&b.path).unwrap();
        std::fs::write(&b.path, text.replace("mode: mig", "mode: shared")).unwrap();
        assert!(matches!(
            b.create_mig_instance(H100, "1g.10gb", at(6, 1)),
            Err(BackendError::MigNotEnabled { .. })
        ));
        assert_eq!(b.list_mig_instances(H100).unwrap().len(), 2);
        b.destroy_mig_instance(H100, &d.uuid).unwrap();
        b.destroy_mig_instance(H100, &c.uuid).unwrap();
        assert!(b.list_mig_instances(H100).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mig_creation_refuses_what_the_gpu_would() {
        let (dir, b) = mig_node("refuse");
        b.create_mig_instance(H100, "2g.20gb", at(0, 2)).unwrap();
        let e = b
            .create_mig_instance(H100, "4g.40gb", at(0, 4))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "GPU {H100}: H100 80GB: MIG profile 4g.40gb at {{0}}:4 overlaps the instance 2g.20gb at {{0}}:2"
            )
        );
        let e = b
            .create_mig_instance(H100, "2g.20gb", at(1, 2))
            .unwrap_err();
        assert!(
            e.to_string().contains("cannot start at memory slice 1"),
            "{e}"
        );
        let e = b
            .create_mig_instance(H100, "2g.20gb", at(2, 4))
            .unwrap_err();
        assert!(matches!(e, BackendError::Mig { .. }), "{e}");
        let e = b
            .create_mig_instance(H100, "9g.90gb", at(0, 8))
            .unwrap_err();
        assert!(e.to_string().contains("no MIG profile \"9g.90gb\""), "{e}");
        // The instance limit: one +me, then compute slices run out.
        b.create_mig_instance(H100, "1g.10gb+me", at(2, 1)).unwrap();
        let e = b
            .create_mig_instance(H100, "1g.10gb+me", at(3, 1))
            .unwrap_err();
        assert!(e.to_string().contains("maximum of 1 instances"), "{e}");
        for s in [3, 4, 5, 6] {
            b.create_mig_instance(H100, "1g.10gb", at(s, 1)).unwrap();
        }
        // 2 + 1 + 4 = 7 compute slices: slice 7 is free but nothing can use it.
        let e = b
            .create_mig_instance(H100, "1g.20gb", at(6, 2))
            .unwrap_err();
        assert!(matches!(e, BackendError::Mig { .. }), "{e}");
        assert_eq!(b.list_mig_instances(H100).unwrap().len(), 6);
        // A GPU not in MIG mode refuses, naming its mode.
        let e = b
            .create_mig_instance(H100_SHARED, "1g.10gb", at(0, 1))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("GPU {H100_SHARED}: its mode is shared, not mig; MIG instances need mode: mig")
        );
        assert!(matches!(
            b.create_mig_instance("GPU-ffff", "1g.10gb", at(0, 1)),
            Err(BackendError::GpuNotFound { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn injected_creation_failure_leaves_no_instance_and_the_gpu_healthy() {
        let (dir, b) = mig_node("fault");
        let faults = faults_path(&b.path);
        let mut f = FaultFile::default();
        f.gpus.insert(H100.into(), vec![MIG_CREATE_FAILS.into()]);
        f.save(&faults).unwrap();
        let e = b
            .create_mig_instance(H100, "1g.10gb", at(6, 1))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "GPU {H100}: creating a MIG 1g.10gb instance at {{6}}:1 failed: injected fault \"mig-create-fails\""
            )
        );
        assert!(b.list_mig_instances(H100).unwrap().is_empty());
        // The word is not a health fault.
        assert!(b.health(H100).unwrap().is_healthy());
        // Cleared: creation works again.
        FaultFile::default().save(&faults).unwrap();
        b.create_mig_instance(H100, "1g.10gb", at(6, 1)).unwrap();
        // A malformed state file is an error naming it, never silently empty.
        std::fs::write(mig_state_path(&b.path), "{\"gpus\": 1}").unwrap();
        let e = b.list_mig_instances(H100).unwrap_err().to_string();
        assert!(
            e.contains("p.yaml.mig.json: malformed MIG state file"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_file_is_bad_input() {
        let e = FakeProfile::load("/nonexistent/fgpu.yaml").unwrap_err();
        assert!(e.is_bad_input());
        assert!(
            e.to_string()
                .starts_with("/nonexistent/fgpu.yaml: cannot read fake GPU profile")
        );
    }

    #[test]
    fn normalizes_pci_bus_ids() {
        assert_eq!(
            normalize_pci_bus_id("00000000:1B:00.0").unwrap(),
            "0000:1b:00.0"
        );
        assert_eq!(
            normalize_pci_bus_id("0001:af:1f.7").unwrap(),
            "0001:af:1f.7"
        );
        for bad in [
            "1b:00.0",
            "0000:1b:00",
            "0000:1b:00.8",
            "00010000:1b:00.0",
            "zzzz:1b:00.0",
        ] {
            assert!(normalize_pci_bus_id(bad).is_err(), "{bad}");
        }
    }
}
