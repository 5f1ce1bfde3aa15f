//! The GPU model every other part of fgpu speaks.
//!
//! A [`Gpu`] is one physical NVIDIA GPU as a backend saw it: identity (index, minor, UUID,
//! PCI bus id), capacity (memory, SMs), generation (compute capability and the
//! [`Architecture`] it implies), topology (NUMA node, PCIe root), health, and the device
//! nodes a container needs to reach it. A [`NodeInventory`] is the list of GPUs of one node.
//! A [`GpuMode`] is how the admin runs a GPU (shares, MIG or whole); a [`TierRatio`] how
//! far the admin lets its granted memory pass its physical memory (the research tier).
//!
//! The model is plain data: backends (see [`crate::backend`]) fill it, the engine reads it,
//! the kubelet plugin publishes it. Everything serialises to JSON with camelCase keys.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Bytes in one GiB (2^30).
pub const GIB: u64 = 1 << 30;

/// Where device nodes live inside a container.
pub const CONTAINER_DEV_DIR: &str = "/dev";

/// Node-wide NVIDIA control device nodes that every GPU container needs besides the GPU's
/// own `/dev/nvidia<minor>` (file names inside the device directory).
pub const CONTROL_DEVICE_NODES: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

/// One physical GPU of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// Position in the driver's enumeration order (`nvidia-smi -i <index>`).
    pub index: u32,
    /// Minor number of the character device `/dev/nvidia<minor>`.
    pub minor: u32,
    /// Stable NVIDIA identifier, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Marketing name as NVML reports it, e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    /// Total framebuffer memory in bytes.
    pub memory_bytes: u64,
    /// Number of streaming multiprocessors (0 where the driver reports neither SMs nor
    /// CUDA cores).
    pub sm_count: u32,
    /// CUDA compute capability; serialised as `"9.0"` next to the derived `architecture`.
    #[serde(flatten, with = "cc_with_architecture")]
    pub compute_capability: ComputeCapability,
    /// Kernel driver version, e.g. `550.54.15`.
    pub driver_version: String,
    /// Highest CUDA version the driver supports, e.g. `12.4`.
    pub cuda_driver_version: String,
    /// PCI address in sysfs form (`0000:1b:00.0`: 4-digit domain, lower-case hex).
    pub pci_bus_id: String,
    /// The PCIe root complex the GPU hangs below (`pci0000:00`), if known.
    pub pcie_root: Option<String>,
    /// NUMA node of the GPU's PCI device, if the platform reports one.
    pub numa_node: Option<u32>,
    /// Whether the GPU supports Multi-Instance GPU partitioning.
    pub mig_capable: bool,
    /// Current health as last observed by the backend.
    pub health: Health,
    /// What holds a share's device memory on this GPU: the driver (per-cgroup limits, set
    /// by the kubelet plugin's CDI hook) or the shim alone. Backends report `shim`; the
    /// plugin raises it to `driver` where the node's driver has the limits.
    #[serde(default)]
    pub enforcement: Enforcement,
    /// Device nodes a container needs for this GPU: the GPU's own node first, then the
    /// node-wide control nodes (see [`CONTROL_DEVICE_NODES`]).
    pub device_nodes: Vec<DeviceNode>,
}

/// What enforces a share's device-memory quota on a GPU (the device attribute
/// `enforcement`). The shim runs either way; `driver` adds the driver's per-cgroup limit
/// beneath it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// The in-container shim only.
    #[default]
    Shim,
    /// The driver's per-cgroup device-memory limit (NVIDIA r615+, cgroup v2, no MIG), and
    /// the shim.
    Driver,
}

impl Enforcement {
    /// The attribute's value: `shim` or `driver`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shim => "shim",
            Self::Driver => "driver",
        }
    }
}

impl fmt::Display for Enforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Gpu {
    /// The architecture implied by the compute capability.
    pub fn architecture(&self) -> Architecture {
        self.compute_capability.architecture()
    }

    /// Memory in GiB (fractional), for display.
    pub fn memory_gib(&self) -> f64 {
        self.memory_bytes as f64 / GIB as f64
    }

    /// Whether the GPU may take new work.
    pub fn is_healthy(&self) -> bool {
        self.health.is_healthy()
    }

    /// The GPU's own device node (`/dev/nvidia<minor>`), if the backend listed one.
    pub fn primary_device_node(&self) -> Option<&DeviceNode> {
        self.device_nodes.first()
    }
}

/// How the admin runs a GPU (per GPU: a node label or chart value on a real node, `mode:`
/// in a fake profile). Switching needs the GPU to hold no claims.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMode {
    /// Quota shares (memory and cores) of one GPU, enforced by the shim.
    #[default]
    Shared,
    /// Dynamic MIG: one instance per claim, sized to the request.
    Mig,
    /// Whole GPUs only.
    Whole,
}

impl GpuMode {
    /// The mode's name: `shared`, `mig` or `whole`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::Mig => "mig",
            Self::Whole => "whole",
        }
    }
}

impl fmt::Display for GpuMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for GpuMode {
    type Err = String;

    /// Parses `shared`, `mig` or `whole`; the error says what is valid.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "shared" => Ok(Self::Shared),
            "mig" => Ok(Self::Mig),
            "whole" => Ok(Self::Whole),
            other => Err(format!(
                "{other:?} is not a GPU mode (shared, mig or whole)"
            )),
        }
    }
}

/// How much memory a GPU of the oversubscribed research tier grants per byte it has: a
/// decimal above 1 and at most [`TierRatio::MAX`] with up to three decimals (`1.5`), kept
/// in thousandths so that the byte arithmetic is exact. [`TierRatio::NONE`] (`1`) is a GPU
/// outside the tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct TierRatio(u32);

impl TierRatio {
    /// Not on the tier: grants only the memory the GPU has.
    pub const NONE: Self = Self(1000);
    /// The largest ratio: a GPU grants at most four times its memory (past that the spill
    /// to host memory is the workload, not its overflow).
    pub const MAX: Self = Self(4000);

    /// The ratio in thousandths (`1.5` is 1500).
    pub fn thousandths(self) -> u32 {
        self.0
    }

    /// Whether the GPU is on the research tier (ratio above 1).
    pub fn is_tier(self) -> bool {
        self > Self::NONE
    }

    /// The memory a GPU of `physical` bytes grants: `physical × ratio`, floored.
    pub fn capacity(self, physical: u64) -> u64 {
        let bytes = u128::from(physical) * u128::from(self.0) / 1000;
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }

    /// The part of a grant of `granted` bytes that device memory backs: `granted / ratio`,
    /// floored (the rest is served by managed memory).
    pub fn physical_share(self, granted: u64) -> u64 {
        let bytes = u128::from(granted) * 1000 / u128::from(self.0.max(1));
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }
}

impl Default for TierRatio {
    fn default() -> Self {
        Self::NONE
    }
}

impl fmt::Display for TierRatio {
    /// `1.5`, `2`, `1.125`: the shortest decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, frac) = (self.0 / 1000, self.0 % 1000);
        if frac == 0 {
            return write!(f, "{whole}");
        }
        let digits = format!("{frac:03}");
        write!(f, "{whole}.{}", digits.trim_end_matches('0'))
    }
}

impl FromStr for TierRatio {
    type Err = String;

    /// Parses a decimal such as `1.5` (up to three decimals), above 1 and at most 4, or
    /// exactly `1` (not on the tier); the error says what is valid.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "{s:?} is not an oversubscription ratio (a decimal above 1 and at most {}, such as 1.5, with up to three decimals; 1 for none)",
                Self::MAX
            )
        };
        let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
        let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() || whole.len() > 2 || frac.len() > 3 || !digits(whole) || !digits(frac)
        {
            return Err(bad());
        }
        if s.ends_with('.') {
            return Err(bad());
        }
        let whole: u32 = whole.parse().map_err(|_| bad())?;
        let frac: u32 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
        let ratio = Self(whole * 1000 + frac);
        if ratio < Self::NONE || ratio > Self::MAX {
            return Err(bad());
        }
        Ok(ratio)
    }
}

impl From<TierRatio> for String {
    fn from(r: TierRatio) -> Self {
        r.to_string()
    }
}

impl TryFrom<String> for TierRatio {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// A CUDA compute capability, `major.minor` (e.g. 8.0 for A100, 9.0 for H100).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    /// Major revision (the architecture family).
    pub major: u32,
    /// Minor revision.
    pub minor: u32,
}

impl ComputeCapability {
    /// A compute capability from its two parts.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The GPU architecture this capability belongs to.
    pub fn architecture(self) -> Architecture {
        Architecture::from_compute_capability(self)
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why a compute capability string was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid compute capability {input:?}: expected MAJOR.MINOR such as \"8.0\" or \"9.0\"")]
pub struct ParseComputeCapabilityError {
    input: String,
}

impl FromStr for ComputeCapability {
    type Err = ParseComputeCapabilityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseComputeCapabilityError {
            input: s.to_owned(),
        };
        let (major, minor) = s.trim().split_once('.').ok_or_else(err)?;
        let digits =
            |p: &str| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) {
            return Err(err());
        }
        Ok(Self {
            major: major.parse().map_err(|_| err())?,
            minor: minor.parse().map_err(|_| err())?,
        })
    }
}

/// NVIDIA GPU architecture generations, derived from the compute capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Architecture {
    /// Compute capability 6.x.
    Pascal,
    /// 7.0 and 7.2.
    Volta,
    /// 7.5.
    Turing,
    /// 8.0, 8.6 and 8.7.
    Ampere,
    /// 8.9 (Ada Lovelace).
    Ada,
    /// 9.0.
    Hopper,
    /// 10.x, 11.x and 12.x.
    Blackwell,
    /// Anything else (older than Pascal, or newer than this build knows).
    Unknown,
}

impl Architecture {
    /// Maps a compute capability to its architecture.
    pub fn from_compute_capability(cc: ComputeCapability) -> Self {
        match (cc.major, cc.minor) {
            (6, _) => Self::Pascal,
            (7, 0..=4) => Self::Volta,
            (7, _) => Self::Turing,
            (8, 9) => Self::Ada,
            (8, _) => Self::Ampere,
            (9, _) => Self::Hopper,
            (10..=12, _) => Self::Blackwell,
            _ => Self::Unknown,
        }
    }

    /// The name as NVIDIA writes it (`Hopper`, `Ada Lovelace`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pascal => "Pascal",
            Self::Volta => "Volta",
            Self::Turing => "Turing",
            Self::Ampere => "Ampere",
            Self::Ada => "Ada Lovelace",
            Self::Hopper => "Hopper",
            Self::Blackwell => "Blackwell",
            Self::Unknown => "Unknown",
        }
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Health of a GPU as the backend last saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state")]
pub enum Health {
    /// Usable.
    #[default]
    Healthy,
    /// Not usable for new work; `reason` says why (e.g. an XID error).
    Unhealthy {
        /// Human-readable cause.
        reason: String,
    },
}

impl Health {
    /// Whether this is [`Health::Healthy`].
    pub fn is_healthy(&self) -> bool {
        matches!(self, Self::Healthy)
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Healthy => f.write_str("Healthy"),
            Self::Unhealthy { reason } => write!(f, "Unhealthy ({reason})"),
        }
    }
}

/// A device node as a container sees it (`path`) and where it is on the host (`host_path`).
///
/// On a real node both are the same; the fake backend can point `host_path` at stand-in
/// files so that CDI specs can be exercised on a machine without GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub path: PathBuf,
    /// Path on the host, e.g. `/dev/nvidia0` or `/tmp/fgpu-fake/dev/nvidia0`.
    pub host_path: PathBuf,
}

impl DeviceNode {
    /// The standard node set for the GPU with `minor`, with host files under `host_dev_dir`:
    /// `nvidia<minor>` followed by [`CONTROL_DEVICE_NODES`].
    pub fn standard_set(minor: u32, host_dev_dir: &std::path::Path) -> Vec<DeviceNode> {
        std::iter::once(format!("nvidia{minor}"))
            .chain(CONTROL_DEVICE_NODES.iter().map(|s| (*s).to_owned()))
            .map(|name| DeviceNode {
                path: PathBuf::from(CONTAINER_DEV_DIR).join(&name),
                host_path: host_dev_dir.join(&name),
            })
            .collect()
    }
}

/// The GPUs of one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInventory {
    /// Kubernetes node name.
    pub node: String,
    /// GPUs in index order.
    pub gpus: Vec<Gpu>,
}

impl NodeInventory {
    /// An inventory for `node`; GPUs are sorted by index.
    pub fn new(node: impl Into<String>, mut gpus: Vec<Gpu>) -> Self {
        gpus.sort_by_key(|g| g.index);
        Self {
            node: node.into(),
            gpus,
        }
    }

    /// The GPU with this UUID.
    pub fn gpu_by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// The GPU with this index.
    pub fn gpu_by_index(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// Total GPU memory of the node in bytes.
    pub fn total_memory_bytes(&self) -> u64 {
        self.gpus.iter().map(|g| g.memory_bytes).sum()
    }
}

/// Serialises a [`ComputeCapability`] flattened into its `Gpu` as two keys,
/// `computeCapability: "9.0"` and the derived `architecture: "Hopper"`; on input the
/// `architecture` key is accepted and ignored (it is always recomputed).
mod cc_with_architecture {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Architecture, ComputeCapability};

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out {
        compute_capability: String,
        architecture: Architecture,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct In {
        compute_capability: String,
        #[serde(default)]
        #[allow(dead_code)]
        architecture: Option<Architecture>,
    }

    pub(super) fn serialize<S: Serializer>(
        cc: &ComputeCapability,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        Out {
            compute_capability: cc.to_string(),
            architecture: cc.architecture(),
        }
        .serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<ComputeCapability, D::Error> {
        let raw = In::deserialize(d)?;
        raw.compute_capability
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tier_ratios_parse_print_and_split_a_grant() {
        let r: TierRatio = "1.5".parse().unwrap();
        assert_eq!(r.thousandths(), 1500);
        assert!(r.is_tier());
        assert_eq!(r.to_string(), "1.5");
        assert_eq!("2".parse::<TierRatio>().unwrap().to_string(), "2");
        assert_eq!("1.125".parse::<TierRatio>().unwrap().to_string(), "1.125");
        assert_eq!("4.0".parse::<TierRatio>().unwrap(), TierRatio::MAX);
        let none: TierRatio = "1".parse().unwrap();
        assert_eq!(none, TierRatio::NONE);
        assert!(!none.is_tier());
        for bad in [
            "0.5", "4.001", "1.2345", "x", "", ".5", "1.", "-1.5", "1,5", "100",
        ] {
            let e = bad.parse::<TierRatio>().unwrap_err();
            assert!(e.contains("is not an oversubscription ratio"), "{bad}: {e}");
        }
        // 80 GiB at 1.5 grants 120 GiB; 3 GiB granted at 1.5 is 2 GiB of device memory.
        assert_eq!(r.capacity(80 * GIB), 120 * GIB);
        assert_eq!(r.physical_share(3 * GIB), 2 * GIB);
        assert_eq!(r.physical_share(10), 6, "floored");
        assert_eq!(TierRatio::NONE.physical_share(7), 7);
        // Kept as its decimal text.
        assert_eq!(serde_json::to_string(&r).unwrap(), "\"1.5\"");
        assert!(serde_json::from_str::<TierRatio>("\"9\"").is_err());
    }

    fn h100(index: u32) -> Gpu {
        Gpu {
            index,
            minor: index,
            uuid: format!("GPU-00000000-0000-0000-0000-00000000000{index}"),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 80 * GIB,
            sm_count: 132,
            compute_capability: ComputeCapability::new(9, 0),
            driver_version: "550.54.15".into(),
            cuda_driver_version: "12.4".into(),
            pci_bus_id: "0000:1b:00.0".into(),
            pcie_root: Some("pci0000:15".into()),
            numa_node: Some(0),
            mig_capable: true,
            enforcement: Default::default(),
            health: Health::Healthy,
            device_nodes: DeviceNode::standard_set(index, std::path::Path::new("/dev")),
        }
    }

    #[test]
    fn architecture_follows_compute_capability() {
        let cases = [
            ((6, 1), Architecture::Pascal),
            ((7, 0), Architecture::Volta),
            ((7, 5), Architecture::Turing),
            ((8, 0), Architecture::Ampere),
            ((8, 6), Architecture::Ampere),
            ((8, 7), Architecture::Ampere),
            ((8, 9), Architecture::Ada),
            ((9, 0), Architecture::Hopper),
            ((10, 0), Architecture::Blackwell),
            ((12, 0), Architecture::Blackwell),
            ((5, 2), Architecture::Unknown),
            ((13, 0), Architecture::Unknown),
        ];
        for ((major, minor), want) in cases {
            assert_eq!(
                ComputeCapability::new(major, minor).architecture(),
                want,
                "{major}.{minor}"
            );
        }
    }

    #[test]
    fn compute_capability_parses_and_rejects() {
        assert_eq!(
            "9.0".parse::<ComputeCapability>().unwrap(),
            ComputeCapability::new(9, 0)
        );
        assert_eq!(
            "12.1".parse::<ComputeCapability>().unwrap(),
            ComputeCapability::new(12, 1)
        );
        for bad in ["9", "9.", ".0", "nine.0", "9.0.1", "-9.0", ""] {
            let err = bad.parse::<ComputeCapability>().unwrap_err();
            assert!(err.to_string().contains("MAJOR.MINOR"), "{bad}: {err}");
        }
    }

    #[test]
    fn standard_device_nodes_map_host_dir() {
        let nodes = DeviceNode::standard_set(3, std::path::Path::new("/tmp/fake/dev"));
        let pairs: Vec<_> = nodes
            .iter()
            .map(|n| (n.path.to_str().unwrap(), n.host_path.to_str().unwrap()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("/dev/nvidia3", "/tmp/fake/dev/nvidia3"),
                ("/dev/nvidiactl", "/tmp/fake/dev/nvidiactl"),
                ("/dev/nvidia-uvm", "/tmp/fake/dev/nvidia-uvm"),
                ("/dev/nvidia-uvm-tools", "/tmp/fake/dev/nvidia-uvm-tools"),
            ]
        );
    }

    #[test]
    fn json_has_camel_case_keys_and_architecture() {
        let inv = NodeInventory::new("n1", vec![h100(1), h100(0)]);
        let v = serde_json::to_value(&inv).unwrap();
        let g = &v["gpus"][0];
        assert_eq!(g["index"], 0, "sorted by index");
        assert_eq!(g["computeCapability"], "9.0");
        assert_eq!(g["architecture"], "Hopper");
        assert_eq!(g["memoryBytes"], 80 * GIB);
        assert_eq!(g["smCount"], 132);
        assert_eq!(g["pciBusId"], "0000:1b:00.0");
        assert_eq!(g["health"]["state"], "Healthy");
        assert_eq!(g["deviceNodes"][0]["hostPath"], "/dev/nvidia0");
    }

    #[test]
    fn json_round_trips() {
        let mut gpu = h100(0);
        gpu.health = Health::Unhealthy {
            reason: "XID 79".into(),
        };
        let inv = NodeInventory::new("n1", vec![gpu]);
        let json = serde_json::to_string(&inv).unwrap();
        let back: NodeInventory = serde_json::from_str(&json).unwrap();
        assert_eq!(back, inv);
        assert!(!back.gpus[0].is_healthy());
        assert_eq!(back.total_memory_bytes(), 80 * GIB);
        assert_eq!(back.gpu_by_uuid(&inv.gpus[0].uuid).unwrap().index, 0);
    }
}
