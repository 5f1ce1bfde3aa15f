//! Where GPUs come from.
//!
//! A [`DeviceBackend`] enumerates the GPUs of the node it runs on. Two implementations:
//!
//! * [`nvml::NvmlBackend`] (cargo feature `nvml`, on by default) asks the NVIDIA driver through
//!   NVML; `libnvidia-ml.so.1` is loaded at run time, so the crate builds on any machine.
//! * [`fake::FakeBackend`] reads a YAML profile describing one node or a whole fake cluster
//!   (see `deploy/fake/README.md`), for development and tests without GPUs.
//!
//! MIG instances are created, destroyed and listed through the backend too
//! ([`DeviceBackend::create_mig_instance`] and its siblings). The fake models them, with
//! their limits and failures, in a state file beside its profile; the NVML backend makes
//! NVML's GPU and compute instance calls (`nvml::mig`, untested on hardware). A backend
//! without them answers [`BackendError::MigUnsupported`].

use std::path::PathBuf;

use crate::device::{Gpu, GpuMode, Health, NodeInventory};
use crate::health::Fault;
use crate::mig::{MigError, MigInstance, Placement, UnknownModel};

pub mod fake;
#[cfg(feature = "nvml")]
pub mod limits;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod usage;

pub use fake::{FakeBackend, FakeProfile};
pub use usage::{GpuUsage, ProcessUsage, UsageReader};

/// A source of GPUs for one node.
pub trait DeviceBackend: Send + Sync {
    /// Short name of the backend (`nvml`, `fake`), for logs.
    fn name(&self) -> &'static str;

    /// Lists the node's GPUs in index order, with their current health.
    fn enumerate(&self) -> Result<Vec<Gpu>, BackendError>;

    /// Current health of the GPU with `uuid`.
    ///
    /// The default re-enumerates; backends with a cheaper probe override it.
    fn health(&self, uuid: &str) -> Result<Health, BackendError> {
        self.enumerate()?
            .into_iter()
            .find(|g| g.uuid == uuid)
            .map(|g| g.health)
            .ok_or_else(|| BackendError::GpuNotFound {
                uuid: uuid.to_owned(),
            })
    }

    /// One health check of the node's GPUs: per GPU, what is wrong with it now (an empty
    /// list: nothing). `known` are the GPUs the caller has seen before; one of them that is no
    /// longer enumerated is reported [`Fault::Lost`]. Events that arrived since the last
    /// check (XIDs) are reported once.
    ///
    /// The default enumerates and reads each unhealthy GPU's reason as faults
    /// ([`Fault::parse`] of each part); the NVML backend also drains the driver's event set
    /// and reads ECC, retired-page and temperature counters.
    fn check_health(&self, known: &[String]) -> Result<Vec<HealthReport>, BackendError> {
        let gpus = self.enumerate()?;
        Ok(reports_from(&gpus, known))
    }

    /// The node's inventory under the Kubernetes node name `node`.
    fn inventory(&self, node: &str) -> Result<NodeInventory, BackendError> {
        Ok(NodeInventory::new(node, self.enumerate()?))
    }

    /// What runs on each GPU now, for the node monitor: the compute processes (host PIDs)
    /// with the device memory each holds, and each process's SM utilisation over the
    /// samples newer than `since_us` (µs of `CLOCK_REALTIME`; 0: the driver's default
    /// window). One entry per GPU, in index order; a GPU whose queries failed carries its
    /// error and does not hide the others.
    ///
    /// The default answers [`BackendError::UsageUnsupported`].
    fn usage(&self, since_us: u64) -> Result<Vec<GpuUsage>, BackendError> {
        let _ = since_us;
        Err(BackendError::UsageUnsupported {
            backend: self.name(),
        })
    }

    /// Creates a MIG instance of `profile` at `placement` on the GPU `gpu_uuid`: a GPU
    /// instance and one compute instance spanning it. The GPU must be in MIG mode and the
    /// placement free (see [`crate::mig::MigLayout`]).
    ///
    /// The default answers [`BackendError::MigUnsupported`].
    fn create_mig_instance(
        &self,
        gpu_uuid: &str,
        profile: &str,
        placement: Placement,
    ) -> Result<MigInstance, BackendError> {
        let _ = (gpu_uuid, profile, placement);
        Err(BackendError::MigUnsupported {
            backend: self.name(),
        })
    }

    /// Destroys the MIG instance `mig_uuid` of the GPU `gpu_uuid` (its compute instance,
    /// then its GPU instance).
    ///
    /// The default answers [`BackendError::MigUnsupported`].
    fn destroy_mig_instance(&self, gpu_uuid: &str, mig_uuid: &str) -> Result<(), BackendError> {
        let _ = (gpu_uuid, mig_uuid);
        Err(BackendError::MigUnsupported {
            backend: self.name(),
        })
    }

    /// The MIG instances on the GPU `gpu_uuid`, in creation order.
    ///
    /// The default answers [`BackendError::MigUnsupported`].
    fn list_mig_instances(&self, gpu_uuid: &str) -> Result<Vec<MigInstance>, BackendError> {
        let _ = gpu_uuid;
        Err(BackendError::MigUnsupported {
            backend: self.name(),
        })
    }

    /// The mode the backend itself sets for the GPU `gpu_uuid` (the fake profile's
    /// `mode:`), beneath the admin's node label and plugin flag; `None`: the backend has
    /// no say (the default, and NVML: a real GPU's mode is the admin's choice).
    fn gpu_mode(&self, gpu_uuid: &str) -> Option<GpuMode> {
        let _ = gpu_uuid;
        None
    }
}

/// What one health check found on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthReport {
    /// The GPU.
    pub uuid: String,
    /// What is wrong with it (empty: nothing).
    pub faults: Vec<Fault>,
}

/// Health reports from an enumeration: each GPU's `Unhealthy` reason read as faults, and
/// each of `known` that is missing as lost.
pub fn reports_from(gpus: &[Gpu], known: &[String]) -> Vec<HealthReport> {
    let mut reports: Vec<HealthReport> = gpus
        .iter()
        .map(|g| HealthReport {
            uuid: g.uuid.clone(),
            faults: match &g.health {
                Health::Healthy => Vec::new(),
                Health::Unhealthy { reason } => reason
                    .split(fake::FAULT_SEPARATOR)
                    .filter(|p| !p.trim().is_empty())
                    .map(Fault::parse)
                    .collect(),
            },
        })
        .collect();
    for uuid in known {
        if !gpus.iter().any(|g| &g.uuid == uuid) {
            reports.push(HealthReport {
                uuid: uuid.clone(),
                faults: vec![Fault::Lost("no longer enumerated".into())],
            });
        }
    }
    reports
}

/// Which backend to build; parsed from `--backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// NVML on a real node.
    Nvml,
    /// A YAML profile.
    Fake,
}

/// Errors of the device backends. Each renders as one line that names the object and field.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// A fake profile could not be read from disk.
    #[error("{}: cannot read fake GPU profile", path.display())]
    ProfileRead {
        /// The profile file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A fake profile is malformed or fails validation.
    #[error(transparent)]
    Profile(#[from] ProfileError),

    /// A node name was asked for that the profile does not describe.
    #[error("{}: unknown node {node:?}; known nodes: {}", path.display(), known.join(", "))]
    UnknownNode {
        /// The profile file.
        path: PathBuf,
        /// The requested node.
        node: String,
        /// Nodes the profile does describe.
        known: Vec<String>,
    },

    /// A multi-node profile was used where a single node is needed, without naming one.
    #[error("{}: profile describes {} nodes; pick one with --node (known nodes: {})", path.display(), known.len(), known.join(", "))]
    NodeRequired {
        /// The profile file.
        path: PathBuf,
        /// Nodes the profile describes.
        known: Vec<String>,
    },

    /// The fake backend was asked for without a profile file.
    #[error("the fake backend needs a profile file (--fake-gpus <FILE>)")]
    NoProfile,

    /// No GPU with this UUID on the node.
    #[error("no GPU with UUID {uuid:?} on this node")]
    GpuNotFound {
        /// The UUID asked for.
        uuid: String,
    },

    /// NVML could not be loaded (no driver on this machine).
    #[error(
        "NVML library libnvidia-ml.so.1 not found: {detail}; is the NVIDIA driver installed? use --backend fake for a machine without GPUs"
    )]
    NvmlNotFound {
        /// What the loader said.
        detail: String,
    },

    /// An NVML library named by path (the fake driver's, for the monitor) could not be
    /// loaded or initialised.
    #[error("NVML library {}: cannot load it: {detail}", path.display())]
    NvmlLibrary {
        /// The library.
        path: PathBuf,
        /// What the loader said.
        detail: String,
    },

    /// An NVML call failed.
    #[error("NVML {call} failed{}: {detail}", gpu.map(|i| format!(" for GPU {i}")).unwrap_or_default())]
    Nvml {
        /// The NVML function, e.g. `nvmlDeviceGetUUID`.
        call: &'static str,
        /// The GPU index, if the call concerned one.
        gpu: Option<u32>,
        /// NVML's message.
        detail: String,
    },

    /// The backend cannot report what runs on its GPUs (a fake profile without
    /// `--fake-nvml-library`).
    #[error("the {backend} backend reports no per-process usage{}", if *backend == "fake" { " (give it the fake NVML library: --fake-nvml-library)" } else { "" })]
    UsageUnsupported {
        /// The backend's name.
        backend: &'static str,
    },

    /// The backend cannot create, destroy or list MIG instances.
    #[error("the {backend} backend does not support MIG instances")]
    MigUnsupported {
        /// The backend's name.
        backend: &'static str,
    },

    /// A MIG operation on a GPU that is not in MIG mode.
    #[error("GPU {uuid}: its mode is {mode}, not mig; MIG instances need mode: mig")]
    MigNotEnabled {
        /// The GPU.
        uuid: String,
        /// Its mode.
        mode: GpuMode,
    },

    /// A MIG operation on a GPU whose model has no profile table.
    #[error("GPU {uuid}: {source}")]
    MigUnknownModel {
        /// The GPU.
        uuid: String,
        /// The lookup's error, naming the product.
        #[source]
        source: UnknownModel,
    },

    /// The GPU refused the instance: the profile, placement or limits do not allow it.
    #[error("GPU {uuid}: {source}")]
    Mig {
        /// The GPU.
        uuid: String,
        /// Why.
        #[source]
        source: MigError,
    },

    /// The driver failed to create the instance (a fake's injected fault, or NVML's error).
    #[error("GPU {uuid}: creating a MIG {profile} instance at {placement} failed: {detail}")]
    MigCreateFailed {
        /// The GPU.
        uuid: String,
        /// The profile.
        profile: String,
        /// The placement.
        placement: Placement,
        /// What failed.
        detail: String,
    },

    /// No MIG instance with this UUID on the GPU.
    #[error("GPU {uuid}: no MIG instance {mig_uuid:?}; it has {}", if known.is_empty() { "none".to_owned() } else { known.join(", ") })]
    MigInstanceNotFound {
        /// The GPU.
        uuid: String,
        /// The instance asked for.
        mig_uuid: String,
        /// The instances it has.
        known: Vec<String>,
    },

    /// The fake's MIG state file is malformed.
    #[error("{}: malformed MIG state file: {detail}", path.display())]
    MigState {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },

    /// The fake's MIG state file could not be read or written.
    #[error("{}: cannot {action} the MIG state file", path.display())]
    MigStateIo {
        /// The file.
        path: PathBuf,
        /// `read` or `write`.
        action: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },

    /// This build has no support for the requested backend.
    #[error("backend {0:?} is not compiled into this build (cargo feature {0:?} is off)")]
    NotCompiled(&'static str),
}

impl BackendError {
    /// Whether the error is the user's input (a malformed profile, an unknown node), as
    /// opposed to an environment or system failure. Binaries map this to exit code 2.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Self::Profile(_)
            | Self::UnknownNode { .. }
            | Self::NodeRequired { .. }
            | Self::NoProfile => true,
            // The user named a file that is not there; other I/O failures are the system's.
            Self::ProfileRead { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            Self::NvmlLibrary { path, .. } => !path.exists(),
            _ => false,
        }
    }
}

/// A malformed or invalid fake profile: the file, where in it, and what is wrong.
///
/// Renders as one line, e.g.
/// `deploy/fake/x.yaml: node "gpu-node-1" gpu[1].memory: must be greater than 0 (e.g. 80Gi)`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {}{message}", path.display(), location_prefix(node.as_deref(), field.as_deref()))]
pub struct ProfileError {
    /// The profile file.
    pub path: PathBuf,
    /// The node the problem is in, if it is inside one.
    pub node: Option<String>,
    /// The field path inside the node (`gpu[1].memory`) or the document (`nodes`).
    pub field: Option<String>,
    /// What is wrong and what would be valid.
    pub message: String,
}

fn location_prefix(node: Option<&str>, field: Option<&str>) -> String {
    match (node, field) {
        (Some(n), Some(f)) => format!("node {n:?} {f}: "),
        (Some(n), None) => format!("node {n:?}: "),
        (None, Some(f)) => format!("{f}: "),
        (None, None) => String::new(),
    }
}

/// Builds the backend named by `kind`. `fake_profile` and `node` are used by the fake
/// backend only (the node may be omitted for a single-node profile).
pub fn build_backend(
    kind: BackendKind,
    fake_profile: Option<&std::path::Path>,
    node: Option<&str>,
) -> Result<Box<dyn DeviceBackend>, BackendError> {
    match kind {
        BackendKind::Fake => {
            let path = fake_profile.ok_or(BackendError::NoProfile)?;
            Ok(Box::new(FakeBackend::open(path, node)?))
        }
        #[cfg(feature = "nvml")]
        BackendKind::Nvml => Ok(Box::new(nvml::NvmlBackend::new()?)),
        #[cfg(not(feature = "nvml"))]
        BackendKind::Nvml => Err(BackendError::NotCompiled("nvml")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_error_renders_one_line_with_location() {
        let e = ProfileError {
            path: "deploy/fake/x.yaml".into(),
            node: Some("gpu-node-1".into()),
            field: Some("gpu[1].memory".into()),
            message: "must be greater than 0 (e.g. 80Gi)".into(),
        };
        assert_eq!(
            e.to_string(),
            r#"deploy/fake/x.yaml: node "gpu-node-1" gpu[1].memory: must be greater than 0 (e.g. 80Gi)"#
        );
        assert!(BackendError::from(e).is_bad_input());
    }

    #[test]
    fn build_backend_picks_the_backend() {
        let profile = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/fake/node-2xh100.yaml"
        ));
        let fake = build_backend(BackendKind::Fake, Some(profile), None).unwrap();
        assert_eq!(fake.name(), "fake");
        assert_eq!(fake.inventory("n").unwrap().gpus.len(), 2);
        let e = build_backend(BackendKind::Fake, None, None).err().unwrap();
        assert!(matches!(e, BackendError::NoProfile) && e.is_bad_input());
        match build_backend(BackendKind::Nvml, None, None) {
            Ok(b) => assert_eq!(b.name(), "nvml"),
            Err(e) => assert!(
                matches!(
                    e,
                    BackendError::NvmlNotFound { .. } | BackendError::NotCompiled(_)
                ),
                "{e}"
            ),
        }
    }

    #[test]
    fn backends_without_mig_say_so() {
        struct Plain;
        impl DeviceBackend for Plain {
            fn name(&self) -> &'static str {
                "plain"
            }
            fn enumerate(&self) -> Result<Vec<Gpu>, BackendError> {
                Ok(Vec::new())
            }
        }
        let at = Placement { start: 0, size: 1 };
        let e = Plain
            .create_mig_instance("GPU-1", "1g.10gb", at)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the plain backend does not support MIG instances"
        );
        assert!(matches!(
            Plain.list_mig_instances("GPU-1"),
            Err(BackendError::MigUnsupported { backend: "plain" })
        ));
        assert!(matches!(
            Plain.destroy_mig_instance("GPU-1", "MIG-1"),
            Err(BackendError::MigUnsupported { .. })
        ));
    }

    #[test]
    fn nvml_not_found_names_the_library_and_the_way_out() {
        let e = BackendError::NvmlNotFound {
            detail: "cannot open shared object file".into(),
        };
        let s = e.to_string();
        assert!(s.starts_with("NVML library libnvidia-ml.so.1 not found: cannot open"));
        assert!(s.ends_with("use --backend fake for a machine without GPUs"));
        assert!(!e.is_bad_input());
    }
}
