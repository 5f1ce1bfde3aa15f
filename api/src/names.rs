//! Every name fgpu shares with Kubernetes, the container runtime and the shim, in one place.
//!
//! * [`DriverName`]: the driver name (default [`DEFAULT_DRIVER_NAME`], overridable at run
//!   time) and the names derived from it: DeviceClasses, scheduling gate, finalizer,
//!   annotations, CDI kind and device names.
//! * [`attr`] and [`capacity`]: device attribute and capacity names in ResourceSlices.
//! * [`env`](mod@env): the environment contract between the kubelet plugin (which writes it into
//!   CDI specs) and the in-container shim (which reads it).
//! * [`legacy`]: HAMi-compatible extended resource names and pod annotations.
//! * [`kubelet`]: kubelet plugin registration constants.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The driver name used when none is configured.
pub const DEFAULT_DRIVER_NAME: &str = "gpu.fgpu.dev";

/// Longest driver name (a ResourceSlice's `spec.driver` is limited to 63 characters).
pub const MAX_DRIVER_NAME_LEN: usize = 63;

/// A validated DRA driver name: a lowercase DNS subdomain of at most 63 characters, such as
/// `gpu.fgpu.dev`. All names derived from it are valid where they are used.
///
/// ```
/// use fgpu_api::names::DriverName;
/// let driver = DriverName::default();
/// assert_eq!(driver.shared_class(), "shared.gpu.fgpu.dev");
/// assert_eq!(driver.cdi_device_id("uid-1-gpu-0"), "gpu.fgpu.dev/claim=uid-1-gpu-0");
/// assert!(DriverName::new("GPU.example").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DriverName(String);

/// Why a string is not a valid driver name. Displays the name and what would be valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "driver name {name:?} {reason}; use a lowercase DNS subdomain of at most 63 characters, such as gpu.fgpu.dev"
)]
pub struct InvalidDriverName {
    /// The rejected name.
    pub name: String,
    /// What is wrong with it.
    pub reason: DriverNameReason,
}

/// What is wrong with a driver name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DriverNameReason {
    /// Empty string.
    #[error("is empty")]
    Empty,
    /// Longer than [`MAX_DRIVER_NAME_LEN`].
    #[error("is longer than 63 characters")]
    TooLong,
    /// Two dots in a row, or a dot at either end.
    #[error("has an empty label (a leading, trailing or doubled dot)")]
    EmptyLabel,
    /// A character outside `a-z`, `0-9`, `-` and `.`.
    #[error("contains a character other than a-z, 0-9, '-' and '.'")]
    InvalidCharacter,
    /// A label starting or ending with `-`.
    #[error("has a label that starts or ends with '-'")]
    HyphenAtLabelEdge,
}

impl DriverName {
    /// Validates `name` as a lowercase RFC 1123 DNS subdomain of at most 63 characters.
    ///
    /// # Errors
    ///
    /// [`InvalidDriverName`] saying which rule is broken.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidDriverName> {
        let name = name.into();
        match check_dns_subdomain(&name) {
            Ok(()) => Ok(Self(name)),
            Err(reason) => Err(InvalidDriverName { name, reason }),
        }
    }

    /// The name itself.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// DeviceClass for shares of a GPU (memory and cores quotas): `shared.<driver>`.
    pub fn shared_class(&self) -> String {
        format!("shared.{}", self.0)
    }

    /// DeviceClass for whole GPUs: `<driver>`.
    pub fn whole_class(&self) -> String {
        self.0.clone()
    }

    /// DeviceClass for MIG instances of GPUs in MIG mode: `mig.<driver>`.
    pub fn mig_class(&self) -> String {
        format!("mig.{}", self.0)
    }

    /// DeviceClass for the oversubscribed research tier (GPUs the admin marked with an
    /// oversubscription ratio): `research.<driver>`.
    pub fn research_class(&self) -> String {
        format!("research.{}", self.0)
    }

    /// Pod scheduling gate set by the webhook and lifted by the controller once it has
    /// allocated the pod's shared claims: `<driver>/allocate`.
    pub fn scheduling_gate(&self) -> String {
        format!("{}/allocate", self.0)
    }

    /// Finalizer the controller puts on claims it allocated, removed after it deallocates
    /// them: `<driver>/allocation`.
    pub fn finalizer(&self) -> String {
        format!("{}/allocation", self.0)
    }

    /// Node annotation carrying the node's GPU inventory (JSON) for the extender path:
    /// `<driver>/node-gpus`.
    pub fn node_inventory_annotation(&self) -> String {
        format!("{}/node-gpus", self.0)
    }

    /// Pod annotation recording the extender's device decision (JSON), read by the device
    /// plugin's `Allocate`: `<driver>/assigned-devices`.
    pub fn pod_assignment_annotation(&self) -> String {
        format!("{}/assigned-devices", self.0)
    }

    /// CDI vendor: the driver name (valid, since CDI vendors allow `[A-Za-z0-9._-]`).
    pub fn cdi_vendor(&self) -> &str {
        &self.0
    }

    /// CDI class of the per-claim devices: [`CDI_CLASS`].
    pub fn cdi_class(&self) -> &'static str {
        CDI_CLASS
    }

    /// CDI kind (`vendor/class`) of the per-claim specs: `<driver>/claim`.
    pub fn cdi_kind(&self) -> String {
        format!("{}/{CDI_CLASS}", self.0)
    }

    /// Fully qualified CDI device name, as returned to the kubelet: `<driver>/claim=<name>`.
    pub fn cdi_device_id(&self, device_name: &str) -> String {
        format!("{}/{CDI_CLASS}={device_name}", self.0)
    }

    /// File name of a claim's transient CDI spec under `/var/run/cdi`:
    /// `<driver>-claim_<claim uid>.json`.
    pub fn cdi_spec_file_name(&self, claim_uid: &str) -> String {
        format!("{}-{CDI_CLASS}_{claim_uid}.json", self.0)
    }

    /// Fully qualified name of device attribute `name`, as used in claim constraints
    /// (`matchAttribute`): `<driver>/<name>`. Names that already carry a domain
    /// (`resource.kubernetes.io/...`) are returned unchanged.
    pub fn qualified_attribute(&self, name: &str) -> String {
        if name.contains('/') {
            name.to_owned()
        } else {
            format!("{}/{name}", self.0)
        }
    }

    /// Kubelet plugin socket for the DRA service: `/var/lib/kubelet/plugins/<driver>/dra.sock`.
    pub fn dra_socket_path(&self) -> String {
        format!("{}/{}/dra.sock", kubelet::PLUGINS_DIR, self.0)
    }

    /// Registration socket in the kubelet's plugin registry:
    /// `/var/lib/kubelet/plugins_registry/<driver>-reg.sock`.
    pub fn registration_socket_path(&self) -> String {
        format!("{}/{}-reg.sock", kubelet::REGISTRY_DIR, self.0)
    }
}

/// CDI class of fgpu's per-claim devices.
pub const CDI_CLASS: &str = "claim";

/// Name of the CDI device for one allocated device of a claim: `<claim uid>-<device>`, with
/// `-<share id>` appended for a share of a device allocated several times. Unique per
/// claim, so runtimes that cache specs never see a reused name.
pub fn cdi_device_name(claim_uid: &str, device: &str, share_id: Option<&str>) -> String {
    match share_id {
        Some(share) => format!("{claim_uid}-{device}-{share}"),
        None => format!("{claim_uid}-{device}"),
    }
}

impl Default for DriverName {
    /// [`DEFAULT_DRIVER_NAME`].
    fn default() -> Self {
        Self(DEFAULT_DRIVER_NAME.to_owned())
    }
}

impl fmt::Display for DriverName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for DriverName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for DriverName {
    type Err = InvalidDriverName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for DriverName {
    type Error = InvalidDriverName;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<DriverName> for String {
    fn from(name: DriverName) -> Self {
        name.0
    }
}

fn check_dns_subdomain(name: &str) -> Result<(), DriverNameReason> {
    use DriverNameReason as R;
    if name.is_empty() {
        return Err(R::Empty);
    }
    if name.len() > MAX_DRIVER_NAME_LEN {
        return Err(R::TooLong);
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(R::EmptyLabel);
        }
        let valid = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-';
        if !label.bytes().all(valid) {
            return Err(R::InvalidCharacter);
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(R::HyphenAtLabelEdge);
        }
    }
    Ok(())
}

/// Device taints the node plugin puts on unhealthy GPUs in its ResourceSlice.
pub mod taint {
    /// Key of the taint on an unhealthy GPU; the value names the fault (`xid-79`, `lost`,
    /// `ecc-double-bit` …). Tolerate it (`key: fgpu.dev/unhealthy, operator: Exists`) to
    /// be allocated such a GPU anyway.
    pub const UNHEALTHY: &str = "fgpu.dev/unhealthy";
}

/// Device attribute names published in ResourceSlices. Unqualified names live in the
/// driver's domain (`device.attributes["<driver>"].productName` in CEL).
pub mod attr {
    /// Kind of device; value [`TYPE_GPU`].
    pub const TYPE: &str = "type";
    /// Value of [`TYPE`] for a physical GPU.
    pub const TYPE_GPU: &str = "gpu";
    /// GPU UUID as NVML reports it, `GPU-xxxxxxxx-...` (string).
    pub const UUID: &str = "uuid";
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3` (string).
    pub const PRODUCT_NAME: &str = "productName";
    /// Architecture name, e.g. `Hopper` (string).
    pub const ARCHITECTURE: &str = "architecture";
    /// CUDA compute capability, e.g. `9.0.0` (version).
    pub const CUDA_COMPUTE_CAPABILITY: &str = "cudaComputeCapability";
    /// Kernel driver version, e.g. `570.86.15` (version).
    pub const DRIVER_VERSION: &str = "driverVersion";
    /// NVML device index on the node (int).
    pub const INDEX: &str = "index";
    /// NUMA node of the GPU (int).
    pub const NUMA_NODE: &str = "numaNode";
    /// Standard attribute: PCIe root complex of the device (string).
    pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
    /// Standard attribute: PCI bus ID, `dddd:bb:dd.f` (string).
    pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
    /// What enforces a share's device memory: `driver` (the driver's per-cgroup limit,
    /// beneath the shim) or `shim` (string). A claim can require `driver` with a CEL
    /// selector.
    pub const ENFORCEMENT: &str = "enforcement";
    /// Value of [`TYPE`] for a MIG placement device (a MIG-mode GPU's profile at one
    /// placement).
    pub const TYPE_MIG: &str = "mig";
    /// A MIG device's profile, e.g. `1g.10gb` (string).
    pub const PROFILE: &str = "profile";
    /// A MIG device's memory in bytes, the size in its profile's name read as GiB (int);
    /// also its `memory` capacity.
    pub const MEMORY: &str = "memory";
    /// A MIG device's parent GPU's UUID (string).
    pub const PARENT_UUID: &str = "parentUUID";
    /// A GPU device's mode (string): [`MODE_SHARED`] or [`MODE_WHOLE`]. A MIG-mode GPU
    /// publishes placement devices instead. Absent on slices of older plugins, which read
    /// as `shared`.
    pub const MODE: &str = "mode";
    /// Value of [`MODE`] for a GPU that takes quota shares.
    pub const MODE_SHARED: &str = "shared";
    /// Value of [`MODE`] for a GPU that takes only whole-GPU claims (never a share).
    pub const MODE_WHOLE: &str = "whole";
    /// A GPU device's tier (string): [`TIER_RESEARCH`] on a GPU the admin marked for the
    /// oversubscribed research tier, [`TIER_PRODUCTION`] on every other GPU device. Absent
    /// on slices of older plugins, which read as production.
    pub const TIER: &str = "tier";
    /// Value of [`TIER`] for a GPU whose granted memory may pass its physical memory.
    pub const TIER_RESEARCH: &str = "research";
    /// Value of [`TIER`] for a GPU that never grants more memory than it has.
    pub const TIER_PRODUCTION: &str = "production";
    /// A research-tier GPU's physical memory in bytes (int); its `memory` capacity is
    /// this times its oversubscription ratio. Only on research-tier GPUs.
    pub const PHYSICAL_MEMORY: &str = "physicalMemory";
    /// A research-tier GPU's oversubscription ratio (string, a decimal such as `1.5`).
    pub const OVERSUBSCRIBE_RATIO: &str = "oversubscribeRatio";
}

/// Node labels the kubelet plugin reads.
pub mod label {
    /// The mode of every GPU of the node: `shared`, `mig` or `whole`.
    pub const GPU_MODE: &str = "fgpu.dev/gpu-mode";
    /// Prefix of the mode of one GPU, by index: `fgpu.dev/gpu-mode-<index>` (wins over
    /// [`GPU_MODE`]).
    pub const GPU_MODE_PREFIX: &str = "fgpu.dev/gpu-mode-";
    /// The oversubscription ratio of every GPU of the node (a decimal above 1, at most 4,
    /// such as `1.5`): marks the GPUs for the research tier.
    pub const OVERSUBSCRIBE: &str = "fgpu.dev/oversubscribe";
    /// Prefix of the ratio of one GPU, by index: `fgpu.dev/oversubscribe-<index>` (wins
    /// over [`OVERSUBSCRIBE`]; `1` takes that GPU out of the tier).
    pub const OVERSUBSCRIBE_PREFIX: &str = "fgpu.dev/oversubscribe-";
}

/// Device capacity names published in ResourceSlices and requested by claims.
pub mod capacity {
    /// Device memory, in bytes.
    pub const MEMORY: &str = "memory";
    /// Compute, in percent of the GPU's streaming multiprocessors.
    pub const CORES: &str = "cores";
    /// The `cores` capacity of a whole GPU.
    pub const CORES_PER_GPU: u64 = 100;
}

/// The environment contract between the kubelet plugin (which writes these variables into
/// each claim's CDI spec) and the in-container shim (which reads them).
///
/// Per-device variables exist in a plain form (applies to every visible device) and an
/// indexed form `<NAME>_<i>` for the container's i-th CUDA device, which wins over the
/// plain one. HAMi-core's names are set alongside for compatibility with its library.
pub mod env {
    /// Memory quota for every device: bytes as a decimal integer (the shim also reads an
    /// integer with a suffix, such as `10Gi`).
    pub const FGPU_MEMORY_LIMIT: &str = "FGPU_MEMORY_LIMIT";
    /// Compute quota in percent, 0 to 100 (0 = not throttled), for every device.
    pub const FGPU_CORE_LIMIT: &str = "FGPU_CORE_LIMIT";
    /// Priority of the container's kernels: `high`, `normal` or `low`.
    pub const FGPU_PRIORITY: &str = "FGPU_PRIORITY";
    /// Path of the claim's private state directory (shared accounting, usage export).
    pub const FGPU_STATE_DIR: &str = "FGPU_STATE_DIR";
    /// Path of a file of `KEY=VALUE` lines with the `FGPU_*` limits; when it sets a memory
    /// limit it takes precedence over the variables.
    pub const FGPU_LIMITS_FILE: &str = "FGPU_LIMITS_FILE";
    /// Core-limit policy: unset or `limit` (the quota is a ceiling, alone on the card or
    /// not) or `share` (use idle GPU time while no other claim is on the card, as HAMi does
    /// by default).
    pub const FGPU_CORE_POLICY: &str = "FGPU_CORE_POLICY";
    /// Log level of the shim; `debug` turns its logging on (off otherwise).
    pub const FGPU_LOG: &str = "FGPU_LOG";
    /// Directory of `<GPU-uuid>.priority` files, for the shim outside a claim (a bare host,
    /// its own tests). Claims no longer get it: the plugin mounts each GPU's priority file
    /// itself ([`super::contract::priority_file`]).
    pub const FGPU_GPU_DIR: &str = "FGPU_GPU_DIR";

    /// HAMi-core: memory limit for every device; a number with an optional `k`, `m`, `g`
    /// suffix (either case), bare = bytes.
    pub const CUDA_DEVICE_MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
    /// HAMi-core: percent of SMs for every device; 0 or 100 and above = no throttling.
    pub const CUDA_DEVICE_SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
    /// HAMi-core: path of the shared accounting file of the container.
    pub const CUDA_DEVICE_MEMORY_SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
    /// HAMi-core: task priority, `0` high, `1` low (default).
    pub const CUDA_TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";

    /// Limits file the version-1 shim read when [`FGPU_LIMITS_FILE`] was unset. Claims no
    /// longer get it (see [`super::contract::limits_file`]).
    pub const DEFAULT_LIMITS_FILE: &str = "/etc/fgpu/limits";

    /// `FGPU_MEMORY_LIMIT_<index>`: memory quota of the container's `index`-th device.
    pub fn fgpu_memory_limit(index: usize) -> String {
        indexed(FGPU_MEMORY_LIMIT, index)
    }

    /// `FGPU_CORE_LIMIT_<index>`: compute quota of the container's `index`-th device.
    pub fn fgpu_core_limit(index: usize) -> String {
        indexed(FGPU_CORE_LIMIT, index)
    }

    /// `CUDA_DEVICE_MEMORY_LIMIT_<index>` (HAMi-core).
    pub fn cuda_device_memory_limit(index: usize) -> String {
        indexed(CUDA_DEVICE_MEMORY_LIMIT, index)
    }

    /// `CUDA_DEVICE_SM_LIMIT_<index>` (HAMi-core).
    pub fn cuda_device_sm_limit(index: usize) -> String {
        indexed(CUDA_DEVICE_SM_LIMIT, index)
    }

    /// `<base>_<index>`.
    pub fn indexed(base: &str, index: usize) -> String {
        format!("{base}_{index}")
    }

    /// The device index of an indexed variable of family `base`: `Some(3)` for
    /// (`FGPU_MEMORY_LIMIT`, `FGPU_MEMORY_LIMIT_3`); `None` for the plain form or another
    /// name. Only canonical decimal indices (`0`, `12`, not `01`) match.
    pub fn parse_indexed(base: &str, name: &str) -> Option<usize> {
        let digits = name.strip_prefix(base)?.strip_prefix('_')?;
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if canonical { digits.parse().ok() } else { None }
    }
}

/// The files of the plugin-shim contract, version 2 (`docs/shim-contract.md`): where the
/// kubelet plugin mounts each claim's limits file, accounts and feed in its containers, and
/// the sizes of the account files it pre-creates (the shim's layouts; the shim's tests
/// check these numbers against its own).
pub mod contract {
    /// The `version=` of the limits file.
    pub const LIMITS_VERSION: u32 = 2;
    /// Directory of the claims' limits files in containers: `<dir>/<uid>/limits`.
    pub const LIMITS_DIR: &str = "/etc/fgpu/claims";
    /// Directory of the claims' accounts and feeds in containers: `<dir>/<uid>/...`.
    pub const CLAIMS_RUN_DIR: &str = "/run/fgpu/claims";
    /// Directory of the per-GPU priority files in containers: `<dir>/<GPU-UUID>.priority`.
    pub const GPUS_DIR: &str = "/run/fgpu/gpus";
    /// File name of a claim's memory account.
    pub const MEMORY_ACCOUNT: &str = "memory.state";
    /// File name of a claim's core account.
    pub const CORE_ACCOUNT: &str = "core.state";

    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` of a GPU UUID's 16 bytes, as the
    /// accounts store it (lowercase hex: how NVML spells a UUID).
    pub fn gpu_uuid_string(u: &[u8; 16]) -> String {
        let mut s = String::with_capacity(40);
        s.push_str("GPU-");
        for (i, b) in u.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                s.push('-');
            }
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
    /// Directory name of a claim's utilisation feed.
    pub const FEED_DIR: &str = "feed";
    /// File name of the feed in [`FEED_DIR`].
    pub const FEED_FILE: &str = "utilisation";
    /// Most GPUs one container's shim tracks (`hook-lib/src/config.rs` `MAX_DEVICES`).
    pub const MAX_DEVICES: u64 = 16;
    /// Size of `memory.state`: `hook-lib/src/state.rs` `FILE_SIZE`, a 64-byte header,
    /// [`MAX_DEVICES`] device records of 64 bytes and 1024 process slots of 160 bytes.
    pub const MEMORY_ACCOUNT_SIZE: u64 = 64 + MAX_DEVICES * 64 + 1024 * 160;
    /// Size of `core.state`: `hook-lib/src/core.rs` `FILE_SIZE`, a 64-byte header and
    /// [`MAX_DEVICES`] entries of 256 bytes.
    pub const CORE_ACCOUNT_SIZE: u64 = 64 + MAX_DEVICES * 256;
    /// Size of a GPU's priority file.
    pub const PRIORITY_FILE_SIZE: u64 = 64;
    /// Mode of the account and priority files on the host: usable by any UID in the
    /// containers they are mounted into (and reachable only through those mounts).
    pub const SHARED_FILE_MODE: u32 = 0o666;

    /// `/etc/fgpu/claims/<uid>/limits`.
    pub fn limits_file(uid: &str) -> String {
        format!("{LIMITS_DIR}/{uid}/limits")
    }

    /// `/run/fgpu/claims/<uid>`.
    pub fn claim_run_dir(uid: &str) -> String {
        format!("{CLAIMS_RUN_DIR}/{uid}")
    }

    /// `/run/fgpu/claims/<uid>/memory.state`.
    pub fn memory_account(uid: &str) -> String {
        format!("{CLAIMS_RUN_DIR}/{uid}/{MEMORY_ACCOUNT}")
    }

    /// `/run/fgpu/claims/<uid>/core.state`.
    pub fn core_account(uid: &str) -> String {
        format!("{CLAIMS_RUN_DIR}/{uid}/{CORE_ACCOUNT}")
    }

    /// `/run/fgpu/claims/<uid>/feed`.
    pub fn feed_dir(uid: &str) -> String {
        format!("{CLAIMS_RUN_DIR}/{uid}/{FEED_DIR}")
    }

    /// `/run/fgpu/claims/<uid>/feed/utilisation`.
    pub fn feed_file(uid: &str) -> String {
        format!("{CLAIMS_RUN_DIR}/{uid}/{FEED_DIR}/{FEED_FILE}")
    }

    /// `<GPU-UUID>.priority`.
    pub fn priority_file_name(uuid: &str) -> String {
        format!("{uuid}.priority")
    }

    /// `/run/fgpu/gpus/<GPU-UUID>.priority`.
    pub fn priority_file(uuid: &str) -> String {
        format!("{GPUS_DIR}/{}", priority_file_name(uuid))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn sizes_and_paths() {
            // The numbers the shim's layouts give today (a change on either side must
            // change both).
            assert_eq!(MEMORY_ACCOUNT_SIZE, 164_928);
            assert_eq!(CORE_ACCOUNT_SIZE, 4_160);
            assert_eq!(limits_file("u1"), "/etc/fgpu/claims/u1/limits");
            assert_eq!(memory_account("u1"), "/run/fgpu/claims/u1/memory.state");
            assert_eq!(core_account("u1"), "/run/fgpu/claims/u1/core.state");
            assert_eq!(feed_file("u1"), "/run/fgpu/claims/u1/feed/utilisation");
            assert_eq!(priority_file("GPU-1"), "/run/fgpu/gpus/GPU-1.priority");
        }
    }
}

/// HAMi-compatible names of the legacy (device plugin + scheduler extender) path. These are
/// the defaults; deployments may rename them (see [`LegacyResourceNames`]).
pub mod legacy {
    /// Extended resource: number of physical GPUs for the container.
    pub const RESOURCE_GPU: &str = "nvidia.com/gpu";
    /// Extended resource: device memory per GPU, in MiB.
    pub const RESOURCE_MEMORY: &str = "nvidia.com/gpumem";
    /// Extended resource: device memory per GPU, in percent of the GPU's memory (1-100).
    pub const RESOURCE_MEMORY_PERCENTAGE: &str = "nvidia.com/gpumem-percentage";
    /// Extended resource: percent of each GPU's SMs (0-100; 100 = exclusive).
    pub const RESOURCE_CORES: &str = "nvidia.com/gpucores";
    /// Extended resource (HAMi): the container's task priority, `0` high, `1` low (HAMi's
    /// default).
    pub const RESOURCE_PRIORITY: &str = "nvidia.com/priority";

    /// Pod annotation: comma-separated GPU model substrings the pod may use.
    pub const ANNOTATION_USE_GPU_TYPE: &str = "nvidia.com/use-gputype";
    /// Pod annotation: comma-separated GPU model substrings the pod must not use.
    pub const ANNOTATION_NOUSE_GPU_TYPE: &str = "nvidia.com/nouse-gputype";
    /// Pod annotation: comma-separated GPU UUIDs the pod may use.
    pub const ANNOTATION_USE_GPU_UUID: &str = "nvidia.com/use-gpuuuid";
    /// Pod annotation: comma-separated GPU UUIDs the pod must not use.
    pub const ANNOTATION_NOUSE_GPU_UUID: &str = "nvidia.com/nouse-gpuuuid";
    /// Pod annotation: node policy override, `binpack` or `spread`.
    pub const ANNOTATION_NODE_SCHEDULER_POLICY: &str = "hami.io/node-scheduler-policy";
    /// Pod annotation: GPU policy override, `binpack`, `spread`, `topology-aware`, ...
    pub const ANNOTATION_GPU_SCHEDULER_POLICY: &str = "hami.io/gpu-scheduler-policy";

    /// The resource names of the legacy path, configurable per deployment.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    pub struct LegacyResourceNames {
        /// Count of GPUs ([`RESOURCE_GPU`] by default).
        pub gpu: String,
        /// MiB per GPU ([`RESOURCE_MEMORY`] by default).
        pub memory: String,
        /// Percent of GPU memory ([`RESOURCE_MEMORY_PERCENTAGE`] by default).
        pub memory_percentage: String,
        /// Percent of SMs ([`RESOURCE_CORES`] by default).
        pub cores: String,
    }

    impl Default for LegacyResourceNames {
        /// HAMi's defaults.
        fn default() -> Self {
            Self {
                gpu: RESOURCE_GPU.to_owned(),
                memory: RESOURCE_MEMORY.to_owned(),
                memory_percentage: RESOURCE_MEMORY_PERCENTAGE.to_owned(),
                cores: RESOURCE_CORES.to_owned(),
            }
        }
    }
}

pub use legacy::LegacyResourceNames;

/// Kubelet plugin registration constants.
pub mod kubelet {
    /// Directory of plugin sockets.
    pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
    /// Directory the kubelet's plugin watcher scans for registration sockets.
    pub const REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
    /// `PluginInfo.type` of a DRA plugin.
    pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
    /// Version string of the `dra.v1` service in `PluginInfo.supported_versions`.
    pub const DRA_V1: &str = "v1.DRAPlugin";
    /// Version string of the `dra.v1beta1` service.
    pub const DRA_V1BETA1: &str = "v1beta1.DRAPlugin";
    /// `supported_versions` to advertise: v1 first (kubelet 1.34+ picks the first it knows).
    pub const DRA_SUPPORTED_VERSIONS: [&str; 2] = [DRA_V1, DRA_V1BETA1];
    /// Version string of the `v1alpha1` health service.
    pub const DRA_HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";
    /// Version string of the `v1` health service.
    pub const DRA_HEALTH_V1: &str = "v1.DRAResourceHealth";
    /// Device plugin directory, holding the kubelet's socket and plugin sockets.
    pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
    /// The kubelet's device plugin registration socket.
    pub const DEVICE_PLUGIN_KUBELET_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
    /// Device plugin API version sent in `RegisterRequest.version`.
    pub const DEVICE_PLUGIN_VERSION: &str = "v1beta1";
    /// Device health value: healthy.
    pub const DEVICE_PLUGIN_HEALTHY: &str = "Healthy";
    /// Device health value: unhealthy.
    pub const DEVICE_PLUGIN_UNHEALTHY: &str = "Unhealthy";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names() {
        let d = DriverName::default();
        assert_eq!(d.as_str(), "gpu.fgpu.dev");
        assert_eq!(d.shared_class(), "shared.gpu.fgpu.dev");
        assert_eq!(d.whole_class(), "gpu.fgpu.dev");
        assert_eq!(d.mig_class(), "mig.gpu.fgpu.dev");
        assert_eq!(d.research_class(), "research.gpu.fgpu.dev");
        assert_eq!(d.scheduling_gate(), "gpu.fgpu.dev/allocate");
        assert_eq!(d.finalizer(), "gpu.fgpu.dev/allocation");
        assert_eq!(d.cdi_kind(), "gpu.fgpu.dev/claim");
        assert_eq!(d.cdi_vendor(), "gpu.fgpu.dev");
        assert_eq!(d.cdi_class(), "claim");
        assert_eq!(
            d.cdi_device_id(&cdi_device_name("u1", "gpu-0", Some("s1"))),
            "gpu.fgpu.dev/claim=u1-gpu-0-s1"
        );
        assert_eq!(cdi_device_name("u1", "gpu-0", None), "u1-gpu-0");
        assert_eq!(d.cdi_spec_file_name("u1"), "gpu.fgpu.dev-claim_u1.json");
        assert_eq!(d.qualified_attribute("uuid"), "gpu.fgpu.dev/uuid");
        assert_eq!(d.qualified_attribute(attr::PCIE_ROOT), attr::PCIE_ROOT);
        assert_eq!(
            d.dra_socket_path(),
            "/var/lib/kubelet/plugins/gpu.fgpu.dev/dra.sock"
        );
        assert_eq!(
            d.registration_socket_path(),
            "/var/lib/kubelet/plugins_registry/gpu.fgpu.dev-reg.sock"
        );
    }

    #[test]
    fn driver_name_serde_validates() {
        let d: DriverName = serde_json::from_str(r#""vgpu.example.com""#).unwrap();
        assert_eq!(serde_json::to_string(&d).unwrap(), r#""vgpu.example.com""#);
        let e = serde_json::from_str::<DriverName>(r#""Bad_Name""#).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(r#"driver name "Bad_Name" contains"#),
            "{e}"
        );
    }

    #[test]
    fn renamed_driver() {
        let d: DriverName = "vgpu.example.com".parse().unwrap();
        assert_eq!(d.shared_class(), "shared.vgpu.example.com");
        assert_eq!(d.mig_class(), "mig.vgpu.example.com");
        assert_eq!(d.scheduling_gate(), "vgpu.example.com/allocate");
        assert_eq!(d.cdi_kind(), "vgpu.example.com/claim");
    }

    #[test]
    fn driver_name_validation() {
        use DriverNameReason as R;
        let long = "a".repeat(64);
        let cases: &[(&str, R)] = &[
            ("", R::Empty),
            (&long, R::TooLong),
            ("gpu..dev", R::EmptyLabel),
            (".gpu", R::EmptyLabel),
            ("gpu.", R::EmptyLabel),
            ("GPU.dev", R::InvalidCharacter),
            ("gpu_x.dev", R::InvalidCharacter),
            ("gpu/x", R::InvalidCharacter),
            ("-gpu.dev", R::HyphenAtLabelEdge),
            ("gpu-.dev", R::HyphenAtLabelEdge),
        ];
        for (name, reason) in cases {
            assert_eq!(
                DriverName::new(*name).unwrap_err().reason,
                *reason,
                "{name}"
            );
        }
        assert!(DriverName::new("a".repeat(63)).is_ok());
        assert!(DriverName::new("gpu-1.example.com").is_ok());
        assert_eq!(
            DriverName::new("GPU").unwrap_err().to_string(),
            "driver name \"GPU\" contains a character other than a-z, 0-9, '-' and '.'; \
             use a lowercase DNS subdomain of at most 63 characters, such as gpu.fgpu.dev"
        );
    }

    #[test]
    fn env_names() {
        assert_eq!(env::fgpu_memory_limit(0), "FGPU_MEMORY_LIMIT_0");
        assert_eq!(env::fgpu_core_limit(3), "FGPU_CORE_LIMIT_3");
        assert_eq!(
            env::cuda_device_memory_limit(1),
            "CUDA_DEVICE_MEMORY_LIMIT_1"
        );
        assert_eq!(env::cuda_device_sm_limit(15), "CUDA_DEVICE_SM_LIMIT_15");
        assert_eq!(
            env::parse_indexed(env::FGPU_MEMORY_LIMIT, "FGPU_MEMORY_LIMIT_12"),
            Some(12)
        );
        assert_eq!(
            env::parse_indexed(env::FGPU_MEMORY_LIMIT, "FGPU_MEMORY_LIMIT_0"),
            Some(0)
        );
        assert_eq!(
            env::parse_indexed(env::FGPU_MEMORY_LIMIT, "FGPU_MEMORY_LIMIT"),
            None
        );
        assert_eq!(
            env::parse_indexed(env::FGPU_MEMORY_LIMIT, "FGPU_MEMORY_LIMIT_"),
            None
        );
        assert_eq!(
            env::parse_indexed(env::FGPU_MEMORY_LIMIT, "FGPU_MEMORY_LIMIT_01"),
            None
        );
        assert_eq!(
            env::parse_indexed(env::FGPU_MEMORY_LIMIT, "FGPU_MEMORY_LIMIT_x"),
            None
        );
        assert_eq!(
            env::parse_indexed(env::FGPU_CORE_LIMIT, "FGPU_MEMORY_LIMIT_1"),
            None
        );
    }

    #[test]
    fn legacy_defaults() {
        let names = LegacyResourceNames::default();
        assert_eq!(names.gpu, "nvidia.com/gpu");
        assert_eq!(names.memory, "nvidia.com/gpumem");
        assert_eq!(names.memory_percentage, "nvidia.com/gpumem-percentage");
        assert_eq!(names.cores, "nvidia.com/gpucores");
    }
}
