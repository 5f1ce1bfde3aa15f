//! MIG instances through NVML: creation, destruction and listing for
//! [`super::NvmlBackend`], and the read-only profile listing of `fgpu-kubelet-plugin
//! mig-profiles` ([`read_profiles`], [`compare`]).
//!
//! `nvml-wrapper` 0.13 wraps MIG mode and MIG device handles but no GPU or compute
//! instance call, so those are made through its raw function table (`Nvml::lib()`) on the
//! device's raw handle (`Device::handle()`), each `unsafe` block with its reason. The
//! profile ids NVML wants are read from the driver (`nvmlDeviceGetGpuInstanceProfileInfo`
//! on the profile's index, [`gpu_instance_profile`]), never assumed.
//!
//! A container needs, besides the parent GPU's node, the capability nodes of its GPU
//! instance and compute instance, `/dev/nvidia-caps/nvidia-cap<N>`, whose minors `N` the
//! driver lists in `/proc/driver/nvidia-caps/mig-minors` ([`MigMinors`]; NVIDIA's MIG user
//! guide, "Device Nodes and Capabilities").
//!
//! Untested on hardware: the pure parts (profile indices, the minors file, the comparison)
//! have unit tests; the calls were written from NVML's header and never ran on a GPU.

#![allow(unsafe_code)] // DESIGN.md: unsafe is allowed in the NVML backend.

use std::collections::BTreeMap;
use std::path::Path;

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings as sys;

use crate::device::{CONTAINER_DEV_DIR, DeviceNode};
use crate::mig::{MigInstance, MigProfile, MigTable, Placement};

/// Where the driver lists the MIG capability minors.
pub const MIG_MINORS_FILE: &str = "/proc/driver/nvidia-caps/mig-minors";

/// NVML's GPU instance profile index (`NVML_GPU_INSTANCE_PROFILE_*`) for `profile`:
/// by its compute slices, with `_REV1` for the media-extension profiles (`+me`) and
/// `_REV2` for the one-compute-slice profile on two memory slices (`1g.20gb` of an H100,
/// `1g.10gb` of an A100 40GB). `None` for a shape NVML has no index for.
pub fn gpu_instance_profile(profile: &MigProfile) -> Option<u32> {
    Some(
        match (
            profile.compute_slices,
            profile.memory_slices,
            profile.media_extensions,
        ) {
            (1, _, true) => sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1,
            (2, _, true) => sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1,
            (_, _, true) => return None,
            (1, 1, false) => sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE,
            (1, 2, false) => sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
            (1, _, false) => return None,
            (n, _, false) => slices_index(n, GI_INDICES)?,
        },
    )
}

/// NVML's compute instance profile index (`NVML_COMPUTE_INSTANCE_PROFILE_*`) of the one
/// compute instance that spans a GPU instance of `profile`.
pub fn compute_instance_profile(profile: &MigProfile) -> Option<u32> {
    slices_index(profile.compute_slices, CI_INDICES)
}

/// (compute slices, index) of the plain GPU instance profiles.
const GI_INDICES: &[(u8, u32)] = &[
    (1, sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE),
    (2, sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE),
    (3, sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE),
    (4, sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE),
    (6, sys::NVML_GPU_INSTANCE_PROFILE_6_SLICE),
    (7, sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE),
    (8, sys::NVML_GPU_INSTANCE_PROFILE_8_SLICE),
];

/// (compute slices, index) of the compute instance profiles.
const CI_INDICES: &[(u8, u32)] = &[
    (1, sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE),
    (2, sys::NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE),
    (3, sys::NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE),
    (4, sys::NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE),
    (6, sys::NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE),
    (7, sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE),
    (8, sys::NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE),
];

fn slices_index(slices: u8, table: &[(u8, u32)]) -> Option<u32> {
    table.iter().find(|(n, _)| *n == slices).map(|(_, i)| *i)
}

/// The name of a GPU instance profile index, for listings (`1_SLICE_REV2`).
pub fn gpu_instance_profile_name(index: u32) -> &'static str {
    match index {
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE => "1_SLICE",
        sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE => "2_SLICE",
        sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE => "3_SLICE",
        sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE => "4_SLICE",
        sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE => "7_SLICE",
        sys::NVML_GPU_INSTANCE_PROFILE_8_SLICE => "8_SLICE",
        sys::NVML_GPU_INSTANCE_PROFILE_6_SLICE => "6_SLICE",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 => "1_SLICE_REV1",
        sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 => "2_SLICE_REV1",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 => "1_SLICE_REV2",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX => "1_SLICE_GFX",
        sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_GFX => "2_SLICE_GFX",
        sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE_GFX => "4_SLICE_GFX",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_NO_ME => "1_SLICE_NO_ME",
        sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_NO_ME => "2_SLICE_NO_ME",
        sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME => "1_SLICE_ALL_ME",
        sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME => "2_SLICE_ALL_ME",
        _ => "?",
    }
}

/// The driver's MIG capability minors (`/proc/driver/nvidia-caps/mig-minors`): lines
/// `config 1`, `monitor 2`, `gpu<minor>/gi<gi>/access <N>` and
/// `gpu<minor>/gi<gi>/ci<ci>/access <N>`, where `<minor>` is the GPU's device minor and
/// `N` the minor of `/dev/nvidia-caps/nvidia-cap<N>`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigMinors {
    /// Capability path (`gpu0/gi1/access`) to its minor.
    minors: BTreeMap<String, u32>,
}

impl MigMinors {
    /// Parses the file's text; a line that is not `<path> <minor>` is an error naming its
    /// line number.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut minors = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(path), Some(minor), None) = (words.next(), words.next(), words.next()) else {
                return Err(format!(
                    "{MIG_MINORS_FILE} line {}: {line:?} is not \"<capability> <minor>\"",
                    n + 1
                ));
            };
            let minor = minor.parse().map_err(|_| {
                format!(
                    "{MIG_MINORS_FILE} line {}: minor {minor:?} is not a number",
                    n + 1
                )
            })?;
            minors.insert(path.to_owned(), minor);
        }
        Ok(Self { minors })
    }

    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read ({e})", path.display()))?;
        Self::parse(&text)
    }

    /// The capability nodes of compute instance `ci` of GPU instance `gi` on the GPU with
    /// device minor `gpu_minor`: the GPU instance's, then the compute instance's. An error
    /// names the capability the file lacks.
    pub fn nodes(&self, gpu_minor: u32, gi: u32, ci: u32) -> Result<Vec<DeviceNode>, String> {
        [
            format!("gpu{gpu_minor}/gi{gi}/access"),
            format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access"),
        ]
        .iter()
        .map(|cap| {
            let minor = self
                .minors
                .get(cap)
                .ok_or_else(|| format!("{MIG_MINORS_FILE} has no capability {cap}"))?;
            Ok(dev_node(&format!("nvidia-caps/nvidia-cap{minor}")))
        })
        .collect()
    }
}

/// The node `/dev/<name>`, at the same path on the host and in the container.
fn dev_node(name: &str) -> DeviceNode {
    let path = Path::new(CONTAINER_DEV_DIR).join(name);
    DeviceNode {
        host_path: path.clone(),
        path,
    }
}

/// An NVML call that failed, with its name.
#[derive(Debug)]
pub struct CallError {
    /// The NVML function.
    pub call: &'static str,
    /// Its error.
    pub error: NvmlError,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.call, self.error)
    }
}

fn failed(call: &'static str) -> impl Fn(NvmlError) -> CallError {
    move |error| CallError { call, error }
}

/// Runs an NVML function of the raw table: `$field` names it, the rest are its arguments.
/// The value is `Result<(), CallError>`.
macro_rules! raw {
    ($lib:expr, $field:ident ( $($arg:expr),* $(,)? )) => {
        match nvml_sym($lib.$field.as_ref()) {
            // SAFETY: `f` is the driver's function of that name, loaded by nvml-wrapper
            // from the library it initialised and keeps loaded for the life of `Nvml`
            // (which the backend leaks); the arguments are live handles from that library
            // and pointers to locals that outlive the call, as NVML's header asks.
            Ok(f) => nvml_try(unsafe { f($($arg),*) }),
            Err(e) => Err(e),
        }
        .map_err(failed(stringify!($field)))
    };
}

/// What NVML says of one GPU instance profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmlProfile {
    /// The profile index asked for (`NVML_GPU_INSTANCE_PROFILE_*`).
    pub index: u32,
    /// The profile id the driver gives it (what `nvidia-smi mig -lgip` shows as ID).
    pub id: u32,
    /// Compute slices (`sliceCount`).
    pub slices: u32,
    /// Most instances (`instanceCount`).
    pub instances: u32,
    /// Memory in MiB (`memorySizeMB`).
    pub memory_mib: u64,
    /// Its possible placements, or why they could not be read.
    pub placements: Result<Vec<Placement>, String>,
}

/// A zeroed NVML out-structure.
fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for NVML's plain C structs of integers and raw pointers, for
    // which all-zero bytes are a valid value (NVML overwrites them).
    unsafe { std::mem::zeroed() }
}

/// The raw handle of `dev`.
fn handle(dev: &Device<'_>) -> sys::nvmlDevice_t {
    // SAFETY: the handle is only passed to NVML functions of the same library while
    // `dev` (and the `Nvml` it borrows) lives.
    unsafe { dev.handle() }
}

/// The GPU's MIG mode is on (`false` for a GPU without MIG).
pub fn mig_enabled(dev: &Device<'_>) -> Result<bool, CallError> {
    match dev.mig_mode() {
        Ok(m) => Ok(m.current == sys::NVML_DEVICE_MIG_ENABLE),
        Err(NvmlError::NotSupported) => Ok(false),
        Err(error) => Err(CallError {
            call: "nvmlDeviceGetMigMode",
            error,
        }),
    }
}

/// NVML's info on GPU instance profile `index` of `dev`.
fn profile_info(
    lib: &sys::NvmlLib,
    dev: &Device<'_>,
    index: u32,
) -> Result<sys::nvmlGpuInstanceProfileInfo_t, CallError> {
    let mut info: sys::nvmlGpuInstanceProfileInfo_t = zeroed();
    raw!(
        lib,
        nvmlDeviceGetGpuInstanceProfileInfo(handle(dev), index, &raw mut info)
    )?;
    Ok(info)
}

/// The possible placements of the GPU instance profile `id` on `dev`.
fn possible_placements(
    lib: &sys::NvmlLib,
    dev: &Device<'_>,
    id: u32,
) -> Result<Vec<Placement>, CallError> {
    let mut count: u32 = 0;
    raw!(
        lib,
        nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            handle(dev),
            id,
            std::ptr::null_mut(),
            &raw mut count
        )
    )?;
    let mut out: Vec<sys::nvmlGpuInstancePlacement_t> = vec![zeroed(); count as usize];
    raw!(
        lib,
        nvmlDeviceGetGpuInstancePossiblePlacements_v2(
            handle(dev),
            id,
            out.as_mut_ptr(),
            &raw mut count
        )
    )?;
    out.truncate(count as usize);
    Ok(out
        .iter()
        .map(|p| Placement {
            start: u8::try_from(p.start).unwrap_or(u8::MAX),
            size: u8::try_from(p.size).unwrap_or(u8::MAX),
        })
        .collect())
}

/// Every GPU instance profile NVML knows on `dev`, with its placements; only get calls.
/// A profile index the GPU does not have is left out; the others' placement errors (MIG
/// mode off, on some drivers) are kept in [`NvmlProfile::placements`].
pub fn read_profiles(lib: &sys::NvmlLib, dev: &Device<'_>) -> Vec<NvmlProfile> {
    (0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|index| {
            let info = profile_info(lib, dev, index).ok()?;
            Some(NvmlProfile {
                index,
                id: info.id,
                slices: info.sliceCount,
                instances: info.instanceCount,
                memory_mib: info.memorySizeMB,
                placements: possible_placements(lib, dev, info.id).map_err(|e| e.to_string()),
            })
        })
        .collect()
}

/// One MIG device of a GPU: its ids, UUID and memory.
struct MigDevice {
    gi: u32,
    ci: u32,
    uuid: String,
    memory_bytes: u64,
}

/// The MIG devices (one per compute instance) of `dev`.
fn mig_devices(lib: &sys::NvmlLib, dev: &Device<'static>) -> Result<Vec<MigDevice>, CallError> {
    let max = dev
        .mig_device_count()
        .map_err(failed("nvmlDeviceGetMaxMigDeviceCount"))?;
    let mut out = Vec::new();
    for i in 0..max {
        let mig = match dev.mig_device_by_index(i) {
            Ok(m) => m,
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
            Err(error) => {
                return Err(CallError {
                    call: "nvmlDeviceGetMigDeviceHandleByIndex",
                    error,
                });
            }
        };
        let (mut gi, mut ci) = (0u32, 0u32);
        raw!(lib, nvmlDeviceGetGpuInstanceId(handle(&mig), &raw mut gi))?;
        raw!(
            lib,
            nvmlDeviceGetComputeInstanceId(handle(&mig), &raw mut ci)
        )?;
        out.push(MigDevice {
            gi,
            ci,
            uuid: mig.uuid().map_err(failed("nvmlDeviceGetUUID"))?,
            memory_bytes: mig
                .memory_info()
                .map_err(failed("nvmlDeviceGetMemoryInfo"))?
                .total,
        });
    }
    Ok(out)
}

/// The GPU instance `gi` of `dev`.
fn gpu_instance(
    lib: &sys::NvmlLib,
    dev: &Device<'_>,
    gi: u32,
) -> Result<sys::nvmlGpuInstance_t, CallError> {
    let mut h: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    raw!(
        lib,
        nvmlDeviceGetGpuInstanceById(handle(dev), gi, &raw mut h)
    )?;
    Ok(h)
}

/// The instances of `dev` (GPU `gpu_uuid`, device minor `minor`, profiles `table`):
/// each MIG device with its GPU instance's profile and placement and its nodes (the
/// capability nodes from `minors`; without them, the parent's node alone, logged).
pub fn list(
    lib: &sys::NvmlLib,
    dev: &Device<'static>,
    gpu_uuid: &str,
    minor: u32,
    table: &MigTable,
    minors: &dyn Fn() -> Result<MigMinors, String>,
) -> Result<Vec<MigInstance>, String> {
    if !mig_enabled(dev).map_err(|e| e.to_string())? {
        return Ok(Vec::new());
    }
    let devices = mig_devices(lib, dev).map_err(|e| e.to_string())?;
    if devices.is_empty() {
        return Ok(Vec::new());
    }
    // The driver's profile id of each of the table's profiles.
    let mut by_id: BTreeMap<u32, &MigProfile> = BTreeMap::new();
    for p in table.profiles {
        if let Some(index) = gpu_instance_profile(p)
            && let Ok(info) = profile_info(lib, dev, index)
        {
            by_id.insert(info.id, p);
        }
    }
    // Without the minors the instances are still listed (so that they can be destroyed),
    // with the parent's node alone.
    let minors = minors()
        .inspect_err(|e| tracing::warn!(gpu = %gpu_uuid, "MIG instances listed without their capability nodes: {e}"))
        .ok();
    let mut out = Vec::new();
    for d in devices {
        let gi = gpu_instance(lib, dev, d.gi).map_err(|e| e.to_string())?;
        let mut info: sys::nvmlGpuInstanceInfo_t = zeroed();
        raw!(lib, nvmlGpuInstanceGetInfo(gi, &raw mut info)).map_err(|e| e.to_string())?;
        let profile = by_id.get(&info.profileId).map_or_else(
            || format!("nvml-profile-{}", info.profileId),
            |p| p.name.to_owned(),
        );
        let mut device_nodes = vec![dev_node(&format!("nvidia{minor}"))];
        if let Some(m) = &minors {
            device_nodes.extend(m.nodes(minor, d.gi, d.ci)?);
        }
        out.push(MigInstance {
            uuid: d.uuid,
            gpu_uuid: gpu_uuid.to_owned(),
            profile,
            placement: Placement {
                start: u8::try_from(info.placement.start).unwrap_or(u8::MAX),
                size: u8::try_from(info.placement.size).unwrap_or(u8::MAX),
            },
            gi_id: d.gi,
            ci_id: d.ci,
            memory_bytes: d.memory_bytes,
            device_nodes,
        });
    }
    Ok(out)
}

/// Creates a GPU instance of `profile` at `placement` on `dev` and one compute instance
/// spanning it; returns their ids. A compute instance that cannot be created takes its
/// GPU instance down with it, so a failure leaves nothing behind.
pub fn create(
    lib: &sys::NvmlLib,
    dev: &Device<'_>,
    profile: &MigProfile,
    placement: Placement,
) -> Result<(u32, u32), String> {
    let (Some(gi_index), Some(ci_index)) = (
        gpu_instance_profile(profile),
        compute_instance_profile(profile),
    ) else {
        return Err(format!("NVML has no profile index for {}", profile.name));
    };
    if !mig_enabled(dev).map_err(|e| e.to_string())? {
        return Err("MIG mode is not enabled on the GPU (the admin enables it: nvidia-smi -i <index> -mig 1)".into());
    }
    let info = profile_info(lib, dev, gi_index).map_err(|e| e.to_string())?;
    let at = sys::nvmlGpuInstancePlacement_t {
        start: u32::from(placement.start),
        size: u32::from(placement.size),
    };
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    raw!(
        lib,
        nvmlDeviceCreateGpuInstanceWithPlacement(handle(dev), info.id, &raw const at, &raw mut gi)
    )
    .map_err(|e| e.to_string())?;
    let made = (|| {
        let mut gi_info: sys::nvmlGpuInstanceInfo_t = zeroed();
        raw!(lib, nvmlGpuInstanceGetInfo(gi, &raw mut gi_info))?;
        let mut ci_profile: sys::nvmlComputeInstanceProfileInfo_t = zeroed();
        raw!(
            lib,
            nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                ci_index,
                sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &raw mut ci_profile
            )
        )?;
        let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
        raw!(
            lib,
            nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id, &raw mut ci)
        )?;
        let mut ci_info: sys::nvmlComputeInstanceInfo_t = zeroed();
        if let Err(e) = raw!(lib, nvmlComputeInstanceGetInfo_v2(ci, &raw mut ci_info)) {
            let _ = raw!(lib, nvmlComputeInstanceDestroy(ci));
            return Err(e);
        }
        Ok((gi_info.id, ci_info.id))
    })();
    made.map_err(|e| {
        let undone = match raw!(lib, nvmlGpuInstanceDestroy(gi)) {
            Ok(()) => "its GPU instance was destroyed again".to_owned(),
            Err(d) => format!("its GPU instance is left ({d})"),
        };
        format!("{e}; {undone}")
    })
}

/// Whether `mig_uuid` is no instance of `dev` (destroying it is then done).
pub enum Destroyed {
    /// It was destroyed.
    Done,
    /// No MIG device of the GPU has that UUID; the ones it has.
    NotFound(Vec<String>),
}

/// Destroys the MIG instance `mig_uuid` of `dev`: its compute instance, then its GPU
/// instance.
pub fn destroy(
    lib: &sys::NvmlLib,
    dev: &Device<'static>,
    mig_uuid: &str,
) -> Result<Destroyed, String> {
    if !mig_enabled(dev).map_err(|e| e.to_string())? {
        return Ok(Destroyed::NotFound(Vec::new()));
    }
    let devices = mig_devices(lib, dev).map_err(|e| e.to_string())?;
    let Some(d) = devices
        .iter()
        .find(|d| d.uuid.eq_ignore_ascii_case(mig_uuid))
    else {
        return Ok(Destroyed::NotFound(
            devices.into_iter().map(|d| d.uuid).collect(),
        ));
    };
    let gi = gpu_instance(lib, dev, d.gi).map_err(|e| e.to_string())?;
    let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
    match raw!(
        lib,
        nvmlGpuInstanceGetComputeInstanceById(gi, d.ci, &raw mut ci)
    ) {
        Ok(()) => raw!(lib, nvmlComputeInstanceDestroy(ci)).map_err(|e| e.to_string())?,
        Err(CallError {
            error: NvmlError::NotFound,
            ..
        }) => {}
        Err(e) => return Err(e.to_string()),
    }
    raw!(lib, nvmlGpuInstanceDestroy(gi)).map_err(|e| e.to_string())?;
    Ok(Destroyed::Done)
}

/// Where fgpu's table for a model and NVML's answers differ, one line each (empty: they
/// agree). Compared per fgpu profile: the NVML profile of its index exists, its compute
/// slices and instance limit, its memory within 5 % of the name's (the driver reports a
/// little less), and its placements; then the NVML profiles no fgpu profile maps to.
pub fn compare(table: &MigTable, nvml: &[NvmlProfile]) -> Vec<String> {
    let mut out = Vec::new();
    let mut used = Vec::new();
    for p in table.profiles {
        let Some(index) = gpu_instance_profile(p) else {
            out.push(format!(
                "{}: fgpu knows no NVML profile index for it",
                p.name
            ));
            continue;
        };
        let name = gpu_instance_profile_name(index);
        let Some(n) = nvml.iter().find(|n| n.index == index) else {
            out.push(format!(
                "{}: NVML has no profile {name} (index {index}) on this GPU",
                p.name
            ));
            continue;
        };
        used.push(index);
        if n.slices != u32::from(p.compute_slices) {
            out.push(format!(
                "{}: compute slices: fgpu {}, NVML {}",
                p.name, p.compute_slices, n.slices
            ));
        }
        if n.instances != u32::from(p.max_instances) {
            out.push(format!(
                "{}: most instances: fgpu {}, NVML {}",
                p.name, p.max_instances, n.instances
            ));
        }
        let named_mib = u64::from(p.memory_gib) * 1024;
        if n.memory_mib > named_mib || n.memory_mib * 100 < named_mib * 95 {
            out.push(format!(
                "{}: memory: fgpu {} GiB ({named_mib} MiB), NVML {} MiB",
                p.name, p.memory_gib, n.memory_mib
            ));
        }
        match &n.placements {
            Ok(got) => {
                let mut got = got.clone();
                got.sort_by_key(|g| (g.start, g.size));
                let want: Vec<Placement> = p.placements().collect();
                if got != want {
                    out.push(format!(
                        "{}: placements: fgpu {}, NVML {}",
                        p.name,
                        placements_text(&want),
                        placements_text(&got)
                    ));
                }
            }
            Err(e) => out.push(format!("{}: placements not read: {e}", p.name)),
        }
    }
    for n in nvml.iter().filter(|n| !used.contains(&n.index)) {
        out.push(format!(
            "NVML profile {} (index {}, id {}: {} compute slices, {} MiB, {} instances) is not in fgpu's table",
            gpu_instance_profile_name(n.index),
            n.index,
            n.id,
            n.slices,
            n.memory_mib,
            n.instances
        ));
    }
    out
}

/// One GPU's MIG profiles as NVML reports them, beside fgpu's table for its model.
#[derive(Clone, Debug)]
pub struct GpuProfiles {
    /// NVML index.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// MIG mode (current, pending), or why it could not be read (`None`: no MIG).
    pub mode: Result<Option<(bool, bool)>, String>,
    /// NVML's GPU instance profiles.
    pub profiles: Vec<NvmlProfile>,
    /// fgpu's table for the model, or why there is none.
    pub table: Result<&'static MigTable, String>,
}

impl GpuProfiles {
    /// Reads GPU `dev` (index `index`): only get calls, nothing is changed.
    pub fn read(lib: &sys::NvmlLib, index: u32, dev: &Device<'_>) -> Self {
        let name = dev.name().unwrap_or_else(|e| format!("(name unread: {e})"));
        let memory_bytes = dev.memory_info().map(|m| m.total).unwrap_or(0);
        let mode = match dev.mig_mode() {
            Ok(m) => Ok(Some((
                m.current == sys::NVML_DEVICE_MIG_ENABLE,
                m.pending == sys::NVML_DEVICE_MIG_ENABLE,
            ))),
            Err(NvmlError::NotSupported) => Ok(None),
            Err(e) => Err(format!("nvmlDeviceGetMigMode: {e}")),
        };
        Self {
            index,
            uuid: dev.uuid().unwrap_or_else(|e| format!("(uuid unread: {e})")),
            table: crate::mig::table_for(&name, memory_bytes).map_err(|e| e.to_string()),
            name,
            memory_bytes,
            mode,
            profiles: read_profiles(lib, dev),
        }
    }

    /// The report's lines for this GPU, and its mismatch count.
    pub fn report(&self) -> (String, usize) {
        use std::fmt::Write as _;
        let mut out = String::new();
        let mode = match &self.mode {
            Ok(None) => "not supported".to_owned(),
            Ok(Some((cur, pending))) => format!(
                "{} (pending {})",
                if *cur { "enabled" } else { "disabled" },
                if *pending { "enabled" } else { "disabled" }
            ),
            Err(e) => format!("unread: {e}"),
        };
        let _ = writeln!(
            out,
            "GPU {} {} {:?} {:.1} GiB: MIG mode {mode}",
            self.index,
            self.uuid,
            self.name,
            self.memory_bytes as f64 / (1u64 << 30) as f64
        );
        for p in &self.profiles {
            let placements = match &p.placements {
                Ok(pl) => placements_text(pl),
                Err(e) => format!("unread ({e})"),
            };
            let _ = writeln!(
                out,
                "  profile {:<13} id {:>2}: {} compute slices, {} MiB, {} instances; placements {placements}",
                gpu_instance_profile_name(p.index),
                p.id,
                p.slices,
                p.memory_mib,
                p.instances
            );
        }
        if self.profiles.is_empty() {
            let _ = writeln!(out, "  NVML gives no GPU instance profile");
        }
        let mismatches = match &self.table {
            Ok(t) => {
                let diff = compare(t, &self.profiles);
                if diff.is_empty() {
                    let _ = writeln!(out, "  fgpu's table {}: agrees", t.model);
                } else {
                    let _ = writeln!(out, "  fgpu's table {}: {} mismatches", t.model, diff.len());
                    for d in &diff {
                        let _ = writeln!(out, "    {d}");
                    }
                }
                diff.len()
            }
            Err(e) => {
                let _ = writeln!(out, "  fgpu has no table: {e}");
                0
            }
        };
        (out, mismatches)
    }
}

/// `{0,2,4}:2 {0}:8`: placements grouped by size, as `nvidia-smi mig -lgipp` prints them.
pub fn placements_text(placements: &[Placement]) -> String {
    let mut by_size: BTreeMap<u8, Vec<u8>> = BTreeMap::new();
    for p in placements {
        by_size.entry(p.size).or_default().push(p.start);
    }
    if by_size.is_empty() {
        return "none".into();
    }
    by_size
        .iter()
        .map(|(size, starts)| {
            let s: Vec<String> = starts.iter().map(u8::to_string).collect();
            format!("{{{}}}:{size}", s.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::table_for;

    const GIB: u64 = 1 << 30;

    fn h100() -> &'static MigTable {
        table_for("NVIDIA H100 80GB HBM3", 80 * GIB).unwrap()
    }

    #[test]
    fn profiles_map_to_nvml_indices() {
        let t = h100();
        let idx = |name: &str| gpu_instance_profile(t.profile(name).unwrap()).unwrap();
        assert_eq!(idx("1g.10gb"), sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE);
        assert_eq!(
            idx("1g.10gb+me"),
            sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
        );
        assert_eq!(idx("1g.20gb"), sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2);
        assert_eq!(idx("2g.20gb"), sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE);
        assert_eq!(idx("3g.40gb"), sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE);
        assert_eq!(idx("4g.40gb"), sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE);
        assert_eq!(idx("7g.80gb"), sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE);
        let ci = |name: &str| compute_instance_profile(t.profile(name).unwrap()).unwrap();
        assert_eq!(ci("1g.20gb"), sys::NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE);
        assert_eq!(ci("7g.80gb"), sys::NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE);
        // Every profile of every table has an index, and no two of one table share one.
        for (product, gib) in [
            ("NVIDIA A100-SXM4-40GB", 40),
            ("NVIDIA A100-SXM4-80GB", 80),
            ("NVIDIA A30", 24),
            ("NVIDIA H200", 141),
            ("NVIDIA B200", 180),
        ] {
            let t = table_for(product, gib * GIB).unwrap();
            let mut seen = Vec::new();
            for p in t.profiles {
                let i = gpu_instance_profile(p)
                    .unwrap_or_else(|| panic!("{product}: {} has no index", p.name));
                assert!(!seen.contains(&i), "{product}: {} shares index {i}", p.name);
                seen.push(i);
                assert!(compute_instance_profile(p).is_some(), "{}", p.name);
            }
        }
    }

    #[test]
    fn mig_minors_give_the_capability_nodes() {
        let text = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n\
                    gpu1/gi2/access 156\ngpu1/gi2/ci0/access 157\n";
        let m = MigMinors::parse(text).unwrap();
        let nodes = m.nodes(1, 2, 0).unwrap();
        let paths: Vec<_> = nodes.iter().map(|n| n.path.to_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidia-caps/nvidia-cap156",
                "/dev/nvidia-caps/nvidia-cap157"
            ]
        );
        assert_eq!(nodes[0].host_path, nodes[0].path);
        let e = m.nodes(0, 5, 0).unwrap_err();
        assert!(e.contains("no capability gpu0/gi5/access"), "{e}");
        let e = MigMinors::parse("config 1\ngpu0/gi0/access x\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("\"x\""), "{e}");
        let e = MigMinors::parse("gpu0/gi0/access\n").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
    }

    /// NVML's answers for an H100 as the table has them.
    fn nvml_h100() -> Vec<NvmlProfile> {
        h100()
            .profiles
            .iter()
            .map(|p| NvmlProfile {
                index: gpu_instance_profile(p).unwrap(),
                id: 100 + gpu_instance_profile(p).unwrap(),
                slices: u32::from(p.compute_slices),
                instances: u32::from(p.max_instances),
                memory_mib: u64::from(p.memory_gib) * 1024 * 975 / 1000,
                placements: Ok(p.placements().collect()),
            })
            .collect()
    }

    #[test]
    fn report_lists_profiles_and_mismatches() {
        let mut g = GpuProfiles {
            index: 0,
            uuid: "GPU-1".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 80 * GIB,
            mode: Ok(Some((false, false))),
            profiles: nvml_h100(),
            table: Ok(h100()),
        };
        let (text, n) = g.report();
        assert_eq!(n, 0, "{text}");
        assert!(text.starts_with("GPU 0 GPU-1 \"NVIDIA H100 80GB HBM3\" 80.0 GiB: MIG mode disabled (pending disabled)\n"), "{text}");
        assert!(text.contains("placements {0,1,2,3,4,5,6}:1\n"), "{text}");
        assert!(text.contains("fgpu's table H100 80GB: agrees"), "{text}");
        g.profiles.pop();
        let (text, n) = g.report();
        assert_eq!(n, 1, "{text}");
        assert!(text.contains("1 mismatches"), "{text}");
    }

    #[test]
    fn comparison_names_each_difference() {
        let t = h100();
        assert_eq!(compare(t, &nvml_h100()), Vec::<String>::new());

        let mut n = nvml_h100();
        let at = |n: &[NvmlProfile], i: u32| n.iter().position(|p| p.index == i).unwrap();
        let i = at(&n, sys::NVML_GPU_INSTANCE_PROFILE_2_SLICE);
        n[i].placements = Ok(vec![
            Placement { start: 0, size: 2 },
            Placement { start: 2, size: 2 },
        ]);
        let i = at(&n, sys::NVML_GPU_INSTANCE_PROFILE_7_SLICE);
        n[i].memory_mib = 60_000;
        let i = at(&n, sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE);
        n[i].instances = 6;
        let i = at(&n, sys::NVML_GPU_INSTANCE_PROFILE_3_SLICE);
        n[i].placements =
            Err("nvmlDeviceGetGpuInstancePossiblePlacements_v2: not supported".into());
        n.retain(|p| p.index != sys::NVML_GPU_INSTANCE_PROFILE_4_SLICE);
        n.push(NvmlProfile {
            index: sys::NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX,
            id: 29,
            slices: 1,
            instances: 7,
            memory_mib: 9984,
            placements: Ok(vec![]),
        });
        let diff = compare(t, &n);
        assert_eq!(
            diff,
            [
                "1g.10gb: most instances: fgpu 7, NVML 6",
                "2g.20gb: placements: fgpu {0,2,4}:2, NVML {0,2}:2",
                "3g.40gb: placements not read: nvmlDeviceGetGpuInstancePossiblePlacements_v2: not supported",
                "4g.40gb: NVML has no profile 4_SLICE (index 3) on this GPU",
                "7g.80gb: memory: fgpu 80 GiB (81920 MiB), NVML 60000 MiB",
                "NVML profile 1_SLICE_GFX (index 10, id 29: 1 compute slices, 9984 MiB, 7 instances) is not in fgpu's table",
            ]
        );
    }
}
