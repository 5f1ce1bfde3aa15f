//! The `nvml` backend: GPUs as the NVIDIA driver reports them through NVML.
//!
//! `libnvidia-ml.so.1` is opened at run time by `nvml-wrapper` (through `libloading`), so
//! this module builds and links on machines without a GPU; [`NvmlBackend::new`] fails there
//! with [`BackendError::NvmlNotFound`]. `nvml-wrapper` wraps every call but MIG's GPU
//! and compute instance calls, which [`mig`] makes through its raw table (the only
//! `unsafe` of the backend). Topology NVML does not give (the PCIe root complex) comes
//! from sysfs.

pub mod mig;

use std::path::{Path, PathBuf};

use std::collections::HashMap;
use std::sync::Mutex;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};

use super::DeviceBackend;
use super::fake::normalize_pci_bus_id;
use super::usage::{GpuUsage, join};
use super::{BackendError, HealthReport};
use crate::device::{Architecture, CONTAINER_DEV_DIR, ComputeCapability, DeviceNode, Gpu, Health};
use crate::health::Fault;
use crate::mig::{MigInstance, Placement};

/// The soname the driver installs; the unversioned `libnvidia-ml.so` only exists where the
/// development package is installed.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Where sysfs lists PCI devices.
const SYSFS_PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// How close to the driver's shutdown temperature a GPU may run before it is degraded, °C.
pub const TEMPERATURE_MARGIN_C: u32 = 5;

/// Most driver events drained by one health check (the rest wait for the next).
const EVENTS_PER_CHECK: usize = 256;

/// A [`DeviceBackend`] backed by NVML.
///
/// NVML is initialised once and kept for the life of the process (leaked), so that the
/// driver's event set, which borrows it, can live in the backend.
pub struct NvmlBackend {
    nvml: &'static Nvml,
    sysfs_pci: PathBuf,
    /// The critical-XID / double-bit-ECC event set, registered on the first health check
    /// (`None` until then, and again after NVML broke it).
    events: Mutex<Option<EventSet<'static>>>,
}

impl std::fmt::Debug for NvmlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlBackend").finish_non_exhaustive()
    }
}

impl NvmlBackend {
    /// Loads [`NVML_LIBRARY`] and initialises NVML.
    pub fn new() -> Result<Self, BackendError> {
        Self::with_library(Path::new(NVML_LIBRARY))
    }

    /// Loads the NVML library at `lib` (a path, or a soname the loader resolves) and
    /// initialises it: the fake driver's NVML in tests (`tests/fake-cuda`).
    pub fn with_library(lib: &Path) -> Result<Self, BackendError> {
        Ok(Self {
            nvml: Box::leak(Box::new(load(lib)?)),
            sysfs_pci: PathBuf::from(SYSFS_PCI_DEVICES),
            events: Mutex::new(None),
        })
    }

    /// Reads GPU `index`; `driver` is (driver version, CUDA driver version), node-wide.
    fn gpu(&self, index: u32, driver: &(String, String)) -> Result<Gpu, BackendError> {
        let call = |name: &'static str| move |e| nvml_err(name, Some(index), e);
        let dev = self
            .nvml
            .device_by_index(index)
            .map_err(call("nvmlDeviceGetHandleByIndex"))?;
        let uuid = dev.uuid().map_err(call("nvmlDeviceGetUUID"))?;
        let product_name = dev.name().map_err(call("nvmlDeviceGetName"))?;
        let memory_bytes = dev
            .memory_info()
            .map_err(call("nvmlDeviceGetMemoryInfo"))?
            .total;
        let minor = dev
            .minor_number()
            .map_err(call("nvmlDeviceGetMinorNumber"))?;
        let cc = dev
            .cuda_compute_capability()
            .map_err(call("nvmlDeviceGetCudaComputeCapability"))?;
        let compute_capability = ComputeCapability::new(
            u32::try_from(cc.major).unwrap_or_default(),
            u32::try_from(cc.minor).unwrap_or_default(),
        );
        let pci = dev.pci_info().map_err(call("nvmlDeviceGetPciInfo"))?;
        let pci_bus_id = normalize_pci_bus_id(&pci.bus_id).map_err(|e| BackendError::Nvml {
            call: "nvmlDeviceGetPciInfo",
            gpu: Some(index),
            detail: e.to_string(),
        })?;
        // SM count: nvmlDeviceGetAttributes answers on many drivers; otherwise derive it
        // from the CUDA core count and the cores per SM of the architecture.
        let sm_count = dev
            .attributes()
            .ok()
            .map(|a| a.multiprocessor_count)
            .filter(|&n| n > 0)
            .or_else(|| {
                let cores = dev.num_cores().ok()?;
                let per_sm = cores_per_sm(compute_capability)?;
                Some(cores / per_sm)
            })
            .unwrap_or(0);
        let numa_node = match dev.numa_node_id() {
            Ok(n) => Some(n),
            Err(_) => sysfs_numa_node(&self.sysfs_pci, &pci_bus_id),
        };
        // nvmlDeviceGetMigMode answers NotSupported on GPUs without MIG.
        let mig_capable = dev.mig_mode().is_ok();
        Ok(Gpu {
            index,
            minor,
            uuid,
            product_name,
            memory_bytes,
            sm_count,
            compute_capability,
            driver_version: driver.0.clone(),
            cuda_driver_version: driver.1.clone(),
            pcie_root: sysfs_pcie_root(&self.sysfs_pci, &pci_bus_id),
            pci_bus_id,
            numa_node,
            mig_capable,
            // Raised to `driver` by the kubelet plugin where the driver limits memory.
            enforcement: crate::device::Enforcement::Shim,
            // Every query above answered: the GPU is reachable. `health` probes again later.
            health: Health::Healthy,
            device_nodes: present_device_nodes(minor),
        })
    }
}

impl DeviceBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn enumerate(&self) -> Result<Vec<Gpu>, BackendError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_err("nvmlDeviceGetCount", None, e))?;
        let driver_version = self
            .nvml
            .sys_driver_version()
            .map_err(|e| nvml_err("nvmlSystemGetDriverVersion", None, e))?;
        let cuda = self
            .nvml
            .sys_cuda_driver_version()
            .map_err(|e| nvml_err("nvmlSystemGetCudaDriverVersion", None, e))?;
        // NVML encodes CUDA 12.4 as 12040.
        let cuda_version = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
        let driver = (driver_version, cuda_version);
        (0..count).map(|i| self.gpu(i, &driver)).collect()
    }

    fn usage(&self, since_us: u64) -> Result<Vec<GpuUsage>, BackendError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_err("nvmlDeviceGetCount", None, e))?;
        Ok((0..count)
            .map(|i| match self.nvml.device_by_index(i) {
                Ok(dev) => match dev.uuid() {
                    Ok(uuid) => device_usage(&dev, uuid, since_us),
                    Err(e) => GpuUsage::failed(
                        format!("index {i}"),
                        nvml_err("nvmlDeviceGetUUID", Some(i), e).to_string(),
                    ),
                },
                Err(e) => GpuUsage::failed(
                    format!("index {i}"),
                    nvml_err("nvmlDeviceGetHandleByIndex", Some(i), e).to_string(),
                ),
            })
            .collect())
    }

    fn check_health(&self, known: &[String]) -> Result<Vec<HealthReport>, BackendError> {
        let mut from_events = self.drain_events();
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_err("nvmlDeviceGetCount", None, e))?;
        let mut reports = Vec::new();
        for i in 0..count {
            // A GPU that cannot even be named is reported lost through `known` below.
            let Ok(dev) = self.nvml.device_by_index(i) else {
                continue;
            };
            let Ok(uuid) = dev.uuid() else { continue };
            let mut faults = from_events.remove(&uuid).unwrap_or_default();
            faults.extend(device_faults(&dev));
            reports.push(HealthReport { uuid, faults });
        }
        for uuid in known {
            if !reports.iter().any(|r| &r.uuid == uuid) {
                reports.push(HealthReport {
                    uuid: uuid.clone(),
                    faults: vec![Fault::Lost("NVML no longer enumerates it".into())],
                });
            }
        }
        Ok(reports)
    }

    fn health(&self, uuid: &str) -> Result<Health, BackendError> {
        let dev = self.device(uuid)?;
        Ok(match dev.memory_info() {
            Ok(_) => Health::Healthy,
            Err(e) => Health::Unhealthy {
                reason: e.to_string(),
            },
        })
    }

    fn create_mig_instance(
        &self,
        gpu_uuid: &str,
        profile: &str,
        placement: Placement,
    ) -> Result<MigInstance, BackendError> {
        let (dev, minor, table) = self.mig_device(gpu_uuid)?;
        let failed = |detail: String| BackendError::MigCreateFailed {
            uuid: gpu_uuid.to_owned(),
            profile: profile.to_owned(),
            placement,
            detail,
        };
        let wanted = table.profile(profile).ok_or_else(|| {
            failed(format!(
                "the {} has no such profile (its profiles: {})",
                table.model,
                table.profile_names().join(", ")
            ))
        })?;
        // A container cannot use an instance without its capability nodes: check the
        // minors can be read before anything is made.
        read_minors().map_err(&failed)?;
        let (gi, ci) = mig::create(self.nvml.lib(), &dev, wanted, placement).map_err(&failed)?;
        let listed = mig::list(self.nvml.lib(), &dev, gpu_uuid, minor, table, &read_minors)
            .map_err(|e| {
                failed(format!(
                    "created (GPU instance {gi}), but cannot list it: {e}"
                ))
            })?;
        listed
            .into_iter()
            .find(|i| i.gi_id == gi && i.ci_id == ci)
            .ok_or_else(|| {
                failed(format!(
                    "created GPU instance {gi} / compute instance {ci}, but NVML lists no MIG device for it"
                ))
            })
    }

    fn destroy_mig_instance(&self, gpu_uuid: &str, mig_uuid: &str) -> Result<(), BackendError> {
        let dev = self.device(gpu_uuid)?;
        match mig::destroy(self.nvml.lib(), &dev, mig_uuid) {
            Ok(mig::Destroyed::Done) => Ok(()),
            Ok(mig::Destroyed::NotFound(known)) => Err(BackendError::MigInstanceNotFound {
                uuid: gpu_uuid.to_owned(),
                mig_uuid: mig_uuid.to_owned(),
                known,
            }),
            Err(detail) => Err(BackendError::Nvml {
                call: "destroying a MIG instance",
                gpu: None,
                detail: format!("GPU {gpu_uuid}: instance {mig_uuid}: {detail}"),
            }),
        }
    }

    fn list_mig_instances(&self, gpu_uuid: &str) -> Result<Vec<MigInstance>, BackendError> {
        let dev = self.device(gpu_uuid)?;
        if !mig::mig_enabled(&dev).map_err(|e| BackendError::Nvml {
            call: e.call,
            gpu: None,
            detail: e.error.to_string(),
        })? {
            return Ok(Vec::new());
        }
        let (dev, minor, table) = self.mig_device(gpu_uuid)?;
        mig::list(self.nvml.lib(), &dev, gpu_uuid, minor, table, &read_minors).map_err(|detail| {
            BackendError::Nvml {
                call: "listing MIG instances",
                gpu: None,
                detail: format!("GPU {gpu_uuid}: {detail}"),
            }
        })
    }
}

/// The driver's MIG capability minors.
fn read_minors() -> Result<mig::MigMinors, String> {
    mig::MigMinors::read(Path::new(mig::MIG_MINORS_FILE))
}

impl NvmlBackend {
    /// Every GPU's MIG mode and GPU instance profiles as NVML reports them, beside fgpu's
    /// table for its model: only get calls, nothing is changed (`fgpu-kubelet-plugin
    /// mig-profiles`).
    pub fn mig_profiles(&self) -> Result<Vec<mig::GpuProfiles>, BackendError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| nvml_err("nvmlDeviceGetCount", None, e))?;
        (0..count)
            .map(|i| {
                let dev = self
                    .nvml
                    .device_by_index(i)
                    .map_err(|e| nvml_err("nvmlDeviceGetHandleByIndex", Some(i), e))?;
                Ok(mig::GpuProfiles::read(self.nvml.lib(), i, &dev))
            })
            .collect()
    }

    /// The GPU `uuid`'s handle.
    fn device(&self, uuid: &str) -> Result<Device<'static>, BackendError> {
        self.nvml.device_by_uuid(uuid).map_err(|e| match e {
            NvmlError::NotFound => BackendError::GpuNotFound {
                uuid: uuid.to_owned(),
            },
            other => nvml_err("nvmlDeviceGetHandleByUUID", None, other),
        })
    }

    /// The GPU `uuid`'s handle, device minor and MIG profile table.
    fn mig_device(
        &self,
        uuid: &str,
    ) -> Result<(Device<'static>, u32, &'static crate::mig::MigTable), BackendError> {
        let dev = self.device(uuid)?;
        let name = dev
            .name()
            .map_err(|e| nvml_err("nvmlDeviceGetName", None, e))?;
        let memory = dev
            .memory_info()
            .map_err(|e| nvml_err("nvmlDeviceGetMemoryInfo", None, e))?
            .total;
        let minor = dev
            .minor_number()
            .map_err(|e| nvml_err("nvmlDeviceGetMinorNumber", None, e))?;
        let table = crate::mig::table_for(&name, memory).map_err(|source| {
            BackendError::MigUnknownModel {
                uuid: uuid.to_owned(),
                source,
            }
        })?;
        Ok((dev, minor, table))
    }

    /// The events (critical XIDs, double-bit ECC) that arrived since the last call, by GPU
    /// UUID. Registers the event set on first use; a GPU that does not support an event type
    /// is simply not watched for it. Failures are logged and retried on the next check: the
    /// periodic probes still run.
    fn drain_events(&self) -> HashMap<String, Vec<Fault>> {
        let mut out: HashMap<String, Vec<Fault>> = HashMap::new();
        let Ok(mut guard) = self.events.lock() else {
            return out;
        };
        if guard.is_none() {
            *guard = self.register_events();
        }
        let Some(set) = guard.as_ref() else {
            return out;
        };
        for _ in 0..EVENTS_PER_CHECK {
            match set.wait(0) {
                Ok(ev) => {
                    let Ok(uuid) = ev.device.uuid() else { continue };
                    let fault = if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                        Fault::DoubleBitEcc
                    } else {
                        match ev.event_data {
                            Some(XidError::Value(n)) => {
                                Fault::Xid(u32::try_from(n).unwrap_or(u32::MAX))
                            }
                            _ => Fault::Probe("critical XID of unknown number".into()),
                        }
                    };
                    out.entry(uuid).or_default().push(fault);
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "nvmlEventSetWait failed; re-registering the event set on the next check");
                    *guard = None;
                    break;
                }
            }
        }
        out
    }

    fn register_events(&self) -> Option<EventSet<'static>> {
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let mut set = match self.nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "nvmlEventSetCreate failed; XID events are not watched");
                return None;
            }
        };
        let count = self.nvml.device_count().unwrap_or(0);
        for i in 0..count {
            let Ok(dev) = self.nvml.device_by_index(i) else {
                continue;
            };
            let supported = dev.supported_event_types().unwrap_or(EventTypes::empty());
            let events = supported & wanted;
            if events.is_empty() {
                continue;
            }
            set = match dev.register_events(events, set) {
                Ok(s) => s,
                Err(e) => {
                    // NVML freed the set: start again on the next check.
                    tracing::warn!(gpu = i, error = %e.error, "nvmlDeviceRegisterEvents failed");
                    return None;
                }
            };
        }
        Some(set)
    }
}

/// What the periodic probes find wrong with `dev`: lost (memory info answers GPU_IS_LOST),
/// volatile double-bit ECC errors, pages pending retirement, a temperature within
/// [`TEMPERATURE_MARGIN_C`] of the shutdown limit. A probe the GPU does not support says
/// nothing.
fn device_faults(dev: &Device<'_>) -> Vec<Fault> {
    let mut faults = Vec::new();
    match dev.memory_info() {
        Ok(_) => {}
        Err(NvmlError::GpuLost) => {
            faults.push(Fault::Lost("NVML reports GPU_IS_LOST".into()));
            return faults;
        }
        Err(e) => faults.push(Fault::Probe(format!("nvmlDeviceGetMemoryInfo: {e}"))),
    }
    if let Ok(n) = dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        && n > 0
    {
        faults.push(Fault::DoubleBitEcc);
    }
    if matches!(dev.are_pages_pending_retired(), Ok(true)) {
        faults.push(Fault::RetiredPagesPending);
    }
    if let (Ok(celsius), Ok(shutdown)) = (
        dev.temperature(TemperatureSensor::Gpu),
        dev.temperature_threshold(TemperatureThreshold::Shutdown),
    ) && shutdown > 0
        && celsius + TEMPERATURE_MARGIN_C >= shutdown
    {
        faults.push(Fault::Temperature { celsius, shutdown });
    }
    faults
}

/// An NVML library loaded only to read usage by GPU UUID: the fake driver's, for the
/// fake backend ([`super::FakeBackend::with_usage_reader`]).
pub struct NvmlUsage(Nvml);

impl NvmlUsage {
    /// Loads the NVML library at `lib`.
    pub fn load(lib: &Path) -> Result<Self, BackendError> {
        Ok(Self(load(lib)?))
    }
}

impl super::UsageReader for NvmlUsage {
    fn usage_of(&self, uuids: &[String], since_us: u64) -> Vec<GpuUsage> {
        uuids
            .iter()
            .map(|u| match self.0.device_by_uuid(u.as_str()) {
                Ok(dev) => device_usage(&dev, u.clone(), since_us),
                Err(e) => GpuUsage::failed(
                    u.clone(),
                    format!("the NVML library does not know this GPU ({e}); a fake one needs FAKE_CUDA_UUIDS with the profile's UUIDs"),
                ),
            })
            .collect()
    }
}

/// The processes on `dev` (UUID `uuid`) and their SM utilisation since `since_us`.
///
/// `nvmlDeviceGetProcessUtilization` answers `NOT_FOUND` when no process ran in the window
/// (no samples, not an error); any other failure of it leaves the SM figures out but keeps
/// the process list.
pub fn device_usage(dev: &Device<'_>, uuid: String, since_us: u64) -> GpuUsage {
    let procs = match dev.running_compute_processes() {
        Ok(p) => p,
        Err(e) => {
            return GpuUsage::failed(
                uuid,
                nvml_err("nvmlDeviceGetComputeRunningProcesses_v3", None, e).to_string(),
            );
        }
    };
    let mut sm_error = None;
    let samples: Vec<(u32, u64, u32)> = match dev.process_utilization_stats(since_us) {
        Ok(s) => s.iter().map(|s| (s.pid, s.timestamp, s.sm_util)).collect(),
        Err(NvmlError::NotFound) => Vec::new(),
        Err(e) => {
            sm_error = Some(nvml_err("nvmlDeviceGetProcessUtilization", None, e).to_string());
            Vec::new()
        }
    };
    let processes = procs
        .into_iter()
        .map(|p| {
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            };
            (p.pid, used)
        })
        .collect();
    GpuUsage {
        uuid,
        processes: join(processes, &samples),
        error: None,
        sm_error,
    }
}

/// Loads the NVML library at `lib` (a soname or a path) and initialises it.
pub fn load(lib: &Path) -> Result<Nvml, BackendError> {
    let not_found = |detail: String| {
        if lib == Path::new(NVML_LIBRARY) {
            BackendError::NvmlNotFound { detail }
        } else {
            BackendError::NvmlLibrary {
                path: lib.to_owned(),
                detail,
            }
        }
    };
    Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .map_err(|e| match e {
            NvmlError::LibloadingError(e) => not_found(e.to_string()),
            NvmlError::LibraryNotFound | NvmlError::DriverNotLoaded => not_found(e.to_string()),
            other => nvml_err("nvmlInit_v2", None, other),
        })
}

fn nvml_err(call: &'static str, gpu: Option<u32>, e: NvmlError) -> BackendError {
    BackendError::Nvml {
        call,
        gpu,
        detail: e.to_string(),
    }
}

/// CUDA cores per SM by architecture (NVIDIA's CUDA C programming guide, per generation).
fn cores_per_sm(cc: ComputeCapability) -> Option<u32> {
    Some(match (cc.architecture(), cc.major, cc.minor) {
        (Architecture::Pascal, 6, 0) => 64,
        (Architecture::Pascal, ..) => 128,
        (Architecture::Volta | Architecture::Turing, ..) => 64,
        (Architecture::Ampere, 8, 0) => 64,
        (Architecture::Ampere | Architecture::Ada, ..) => 128,
        (Architecture::Hopper | Architecture::Blackwell, ..) => 128,
        (Architecture::Unknown, ..) => return None,
    })
}

/// The device nodes for GPU `minor` that exist on this host: the GPU's own node always
/// (the driver creates it), the control nodes only where present (`nvidia-uvm` appears
/// once the module is loaded).
fn present_device_nodes(minor: u32) -> Vec<DeviceNode> {
    DeviceNode::standard_set(minor, Path::new(CONTAINER_DEV_DIR))
        .into_iter()
        .enumerate()
        .filter(|(i, n)| *i == 0 || n.host_path.exists())
        .map(|(_, n)| n)
        .collect()
}

/// NUMA node from `/sys/bus/pci/devices/<bus id>/numa_node`; `-1` means none.
fn sysfs_numa_node(sysfs_pci: &Path, bus_id: &str) -> Option<u32> {
    let text = std::fs::read_to_string(sysfs_pci.join(bus_id).join("numa_node")).ok()?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// The `pciDDDD:BB` component of the device's canonical sysfs path.
fn sysfs_pcie_root(sysfs_pci: &Path, bus_id: &str) -> Option<String> {
    let real = std::fs::canonicalize(sysfs_pci.join(bus_id)).ok()?;
    real.components()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| c.starts_with("pci") && c.contains(':'))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_gives_the_documented_error() {
        // This machine has no NVIDIA driver; where one exists the test has nothing to say.
        match NvmlBackend::new() {
            Ok(_) => {}
            Err(e) => {
                let s = e.to_string();
                assert!(
                    s.starts_with("NVML library libnvidia-ml.so.1 not found:"),
                    "{s}"
                );
                assert!(s.contains("use --backend fake"), "{s}");
            }
        }
    }

    #[test]
    fn sysfs_topology_is_read() {
        let dir = std::env::temp_dir().join(format!("fgpu-sysfs-{}", std::process::id()));
        let real = dir.join("devices/pci0000:15/0000:15:01.0/0000:1b:00.0");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("numa_node"), "1\n").unwrap();
        let bus = dir.join("bus");
        std::fs::create_dir_all(&bus).unwrap();
        std::os::unix::fs::symlink(&real, bus.join("0000:1b:00.0")).unwrap();
        assert_eq!(sysfs_numa_node(&bus, "0000:1b:00.0"), Some(1));
        assert_eq!(
            sysfs_pcie_root(&bus, "0000:1b:00.0").as_deref(),
            Some("pci0000:15")
        );
        std::fs::write(real.join("numa_node"), "-1\n").unwrap();
        assert_eq!(sysfs_numa_node(&bus, "0000:1b:00.0"), None);
        assert_eq!(sysfs_numa_node(&bus, "0000:ff:00.0"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sm_count_from_cores() {
        assert_eq!(cores_per_sm(ComputeCapability::new(9, 0)), Some(128));
        assert_eq!(cores_per_sm(ComputeCapability::new(8, 0)), Some(64));
        assert_eq!(cores_per_sm(ComputeCapability::new(7, 5)), Some(64));
        assert_eq!(cores_per_sm(ComputeCapability::new(5, 0)), None);
    }
}
