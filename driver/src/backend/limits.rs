//! Driver-native device-memory limits per cgroup (NVIDIA r615+, CUDA 13.4's NVML).
//!
//! `nvmlDeviceSetMemoryLimits_v1(device, {nameSpace, softLimit, hardLimit})` limits the
//! device memory the processes of one cgroup (v2; `nameSpace` is the cgroup directory's
//! full path) may hold on a GPU; the driver refuses past the hard limit
//! (`CUDA_ERROR_OUT_OF_MEMORY`) and, inside that cgroup, reports the limit as the total.
//! `nvmlDeviceGetMemoryLimits_v1` reads it back with the cgroup's current use. "No limit"
//! is soft 0 and hard all ones. `nvml-wrapper` predates both calls, so they are looked up
//! here in the same library with `libloading`.
//!
//! fgpu sets the **hard** limit only and leaves the soft one 0: under the kernel's `dmem`
//! controller a leaf's soft limit is added to every ancestor's `dmem.min`, and a leaf
//! deleted with its soft limit set leaves that reservation behind (NVIDIA's documented
//! sharp edge). A hard limit has no such effect on ancestors.
//!
//! Support: both symbols present and `nvmlDeviceGetMemoryLimits_v1` answering on the
//! cgroup2 root (success, or "no limit here"); an older driver has no symbols, and one
//! that has them but cannot account (MIG, no cgroup v2) answers `NOT_SUPPORTED`.

#![allow(unsafe_code)] // DESIGN.md: unsafe is allowed in the NVML backend.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use super::BackendError;

/// NVML's "no hard limit" (`NVML_DEVICE_MEMORY_LIMIT_MAX`).
pub const LIMIT_MAX: u64 = u64::MAX;

const NVML_SUCCESS: c_int = 0;
const NVML_ERROR_NOT_SUPPORTED: c_int = 3;
const NVML_ERROR_NOT_FOUND: c_int = 6;

type Handle = *mut c_void;

/// `nvmlSetMemoryLimits_v1_t`.
#[repr(C)]
struct SetLimits {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
}

/// `nvmlGetMemoryLimits_v1_t`.
#[repr(C)]
struct GetLimits {
    name_space: *const c_char,
    soft_limit: u64,
    hard_limit: u64,
    current_used: u64,
}

type InitFn = unsafe extern "C" fn() -> c_int;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut Handle) -> c_int;
type SetFn = unsafe extern "C" fn(Handle, *const SetLimits) -> c_int;
type GetFn = unsafe extern "C" fn(Handle, *mut GetLimits) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// A cgroup's limit on one GPU, as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes guaranteed (0: none).
    pub soft: u64,
    /// Bytes the cgroup may hold at most ([`LIMIT_MAX`]: no limit).
    pub hard: u64,
    /// Bytes the cgroup holds now.
    pub used: u64,
}

impl MemoryLimit {
    /// Whether this is "no limit".
    pub fn is_unlimited(&self) -> bool {
        self.soft == 0 && self.hard == LIMIT_MAX
    }
}

/// The two calls, in an NVML library that has them.
pub struct DriverLimits {
    path: PathBuf,
    by_uuid: ByUuidFn,
    set: SetFn,
    get: GetFn,
    error_string: Option<ErrorStringFn>,
    // Last: the functions above point into it.
    _lib: libloading::Library,
}

impl std::fmt::Debug for DriverLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverLimits")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl DriverLimits {
    /// Loads `path` (`libnvidia-ml.so.1`, or the fake driver's library) and initialises
    /// NVML. `Ok(None)`: the library has no memory-limit calls (a driver before r615).
    pub fn open(path: &Path) -> Result<Option<Self>, BackendError> {
        let lib_err = |detail: String| BackendError::NvmlLibrary {
            path: path.to_owned(),
            detail,
        };
        // SAFETY: loading NVML runs its constructors, which have no preconditions.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| lib_err(e.to_string()))?;
        // SAFETY: each symbol is NVML's, with the signature of its type alias (nvml.h).
        let (init, by_uuid, set, get, error_string) = unsafe {
            let sym = |name: &[u8]| lib.get::<*mut c_void>(name).ok().map(|s| *s);
            let Some(init) = sym(b"nvmlInit_v2\0") else {
                return Err(lib_err("no nvmlInit_v2 in it".into()));
            };
            let Some(by_uuid) = sym(b"nvmlDeviceGetHandleByUUID\0") else {
                return Err(lib_err("no nvmlDeviceGetHandleByUUID in it".into()));
            };
            let (Some(set), Some(get)) = (
                sym(b"nvmlDeviceSetMemoryLimits_v1\0"),
                sym(b"nvmlDeviceGetMemoryLimits_v1\0"),
            ) else {
                return Ok(None);
            };
            (
                std::mem::transmute::<*mut c_void, InitFn>(init),
                std::mem::transmute::<*mut c_void, ByUuidFn>(by_uuid),
                std::mem::transmute::<*mut c_void, SetFn>(set),
                std::mem::transmute::<*mut c_void, GetFn>(get),
                sym(b"nvmlErrorString\0")
                    .map(|p| std::mem::transmute::<*mut c_void, ErrorStringFn>(p)),
            )
        };
        let me = Self {
            path: path.to_owned(),
            by_uuid,
            set,
            get,
            error_string,
            _lib: lib,
        };
        // SAFETY: nvmlInit_v2 takes nothing; NVML counts its initialisations.
        let r = unsafe { init() };
        if r != NVML_SUCCESS {
            return Err(me.err("nvmlInit_v2", r));
        }
        Ok(Some(me))
    }

    fn err(&self, call: &'static str, code: c_int) -> BackendError {
        let text = self
            .error_string
            // SAFETY: nvmlErrorString returns a static NUL-terminated string (or null).
            .map(|f| unsafe { f(code) })
            .filter(|p| !p.is_null())
            .map(|p| {
                // SAFETY: checked non-null; NVML's strings are static and NUL-terminated.
                let c = unsafe { std::ffi::CStr::from_ptr(p) };
                c.to_string_lossy().into_owned()
            })
            .unwrap_or_default();
        BackendError::Nvml {
            call,
            gpu: None,
            detail: format!(
                "NVML error {code}{}",
                if text.is_empty() {
                    String::new()
                } else {
                    format!(" ({text})")
                }
            ),
        }
    }

    fn handle(&self, uuid: &str) -> Result<Handle, BackendError> {
        let c = CString::new(uuid).map_err(|_| BackendError::GpuNotFound {
            uuid: uuid.to_owned(),
        })?;
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: c is NUL-terminated, h a valid out-pointer.
        let r = unsafe { (self.by_uuid)(c.as_ptr(), &mut h) };
        if r != NVML_SUCCESS {
            return Err(self.err("nvmlDeviceGetHandleByUUID", r));
        }
        Ok(h)
    }

    fn cgroup(dir: &Path) -> Result<CString, BackendError> {
        CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| BackendError::Nvml {
            call: "nvmlDeviceSetMemoryLimits_v1",
            gpu: None,
            detail: format!("cgroup path {} holds a NUL byte", dir.display()),
        })
    }

    /// NVML's answer for cgroup `dir` on GPU `uuid`: its status code and what it filled in.
    fn query(&self, uuid: &str, dir: &Path) -> Result<(c_int, MemoryLimit), BackendError> {
        let h = self.handle(uuid)?;
        let ns = Self::cgroup(dir)?;
        let mut l = GetLimits {
            name_space: ns.as_ptr(),
            soft_limit: 0,
            hard_limit: 0,
            current_used: 0,
        };
        // SAFETY: l is a valid nvmlGetMemoryLimits_v1_t whose nameSpace outlives the call.
        let r = unsafe { (self.get)(h, &mut l) };
        let m = MemoryLimit {
            soft: l.soft_limit,
            hard: l.hard_limit,
            used: l.current_used,
        };
        Ok((r, m))
    }

    /// The limit of cgroup `dir` on GPU `uuid`; `None`: no limit there.
    pub fn get(&self, uuid: &str, dir: &Path) -> Result<Option<MemoryLimit>, BackendError> {
        match self.query(uuid, dir)? {
            (NVML_SUCCESS, m) => Ok((!m.is_unlimited()).then_some(m)),
            (NVML_ERROR_NOT_FOUND, _) => Ok(None),
            (code, _) => Err(self.err("nvmlDeviceGetMemoryLimits_v1", code)),
        }
    }

    /// Whether the driver limits memory per cgroup on GPU `uuid`: it answers for the
    /// cgroup2 root `cgroup_root` (a limit or none), rather than `NOT_SUPPORTED`.
    pub fn supported(&self, uuid: &str, cgroup_root: &Path) -> Result<bool, BackendError> {
        match self.query(uuid, cgroup_root)? {
            (NVML_SUCCESS | NVML_ERROR_NOT_FOUND, _) => Ok(true),
            (NVML_ERROR_NOT_SUPPORTED, _) => Ok(false),
            (code, _) => Err(self.err("nvmlDeviceGetMemoryLimits_v1", code)),
        }
    }

    fn put(&self, uuid: &str, dir: &Path, soft: u64, hard: u64) -> Result<(), BackendError> {
        let h = self.handle(uuid)?;
        let ns = Self::cgroup(dir)?;
        let l = SetLimits {
            name_space: ns.as_ptr(),
            soft_limit: soft,
            hard_limit: hard,
        };
        // SAFETY: l is a valid nvmlSetMemoryLimits_v1_t whose nameSpace outlives the call.
        let r = unsafe { (self.set)(h, &l) };
        if r != NVML_SUCCESS {
            return Err(self.err("nvmlDeviceSetMemoryLimits_v1", r));
        }
        Ok(())
    }

    /// Limits cgroup `dir` to `bytes` of GPU `uuid` (hard limit; soft 0, see the module
    /// docs), then reads it back: an error unless the driver reports exactly that limit.
    pub fn set_hard(&self, uuid: &str, dir: &Path, bytes: u64) -> Result<(), BackendError> {
        self.put(uuid, dir, 0, bytes)?;
        match self.get(uuid, dir)? {
            Some(l) if l.hard == bytes => Ok(()),
            other => Err(BackendError::Nvml {
                call: "nvmlDeviceGetMemoryLimits_v1",
                gpu: None,
                detail: format!(
                    "cgroup {} on {uuid}: set a hard limit of {bytes} bytes, read back {}",
                    dir.display(),
                    other.map_or("no limit".to_owned(), |l| format!(
                        "hard {} soft {}",
                        l.hard, l.soft
                    ))
                ),
            }),
        }
    }

    /// Removes cgroup `dir`'s limit on GPU `uuid` (soft 0, hard unlimited).
    pub fn clear(&self, uuid: &str, dir: &Path) -> Result<(), BackendError> {
        self.put(uuid, dir, 0, LIMIT_MAX)
    }
}
