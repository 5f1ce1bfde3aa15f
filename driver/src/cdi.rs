//! CDI (Container Device Interface) specs for the devices fgpu hands to containers.
//!
//! The spec model and its validation are the CNCF `container-device-interface` crate's
//! ([`container_device_interface::specs::config::Spec`]): this module only gathers the
//! container edits (environment, device nodes, mounts, hooks, additional GIDs), turns them
//! into that model, stamps the lowest `cdiVersion` that covers the fields used (the crate's
//! own `minimum_required_version`: 0.3.0 by default, 0.4.0 for a mount `type`, 0.5.0 for a
//! device node `hostPath` or a device name starting with a digit, 0.6.0 for annotations,
//! 0.7.0 for `additionalGids`), and validates the result with the crate's `new_spec`
//! (JSON-schema and semantic checks: names, env syntax, hook names, permissions, ...).
//!
//! The crate keeps most fields of its model `pub(crate)`, so the model is filled through
//! its serde interface (which also rejects unknown keys) rather than field by field.
//!
//! Everything here is pure: nothing is written to disk.
//!
//! ```
//! use fgpu_driver::cdi::{ContainerEdits, DeviceNodeEdit, SpecBuilder};
//!
//! let spec = SpecBuilder::new("fgpu.dev/claim")
//!     .device(
//!         "gpu-0",
//!         ContainerEdits::default()
//!             .env("FGPU_MEMORY_LIMIT", "10Gi")
//!             .device_node(DeviceNodeEdit::new("/dev/nvidia0")),
//!     )
//!     .build()
//!     .unwrap();
//! assert_eq!(spec.cdi_version(), "0.3.0");
//! assert_eq!(spec.qualified_names(), ["fgpu.dev/claim=gpu-0"]);
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use container_device_interface as cdi;
use serde_json::{Map, Value, json};

use crate::device::{DeviceNode, Gpu};

/// The crate's raw spec type (the JSON document), re-exported for callers that need it.
pub use cdi::specs::config::Spec as RawSpec;

/// Errors of the CDI builder. Each names the spec kind and says what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// The spec has no device.
    #[error("CDI spec {kind:?}: needs at least one device")]
    NoDevices {
        /// The spec kind.
        kind: String,
    },
    /// The spec fails the CDI crate's validation.
    #[error("CDI spec {kind:?} is invalid: {detail}")]
    Invalid {
        /// The spec kind.
        kind: String,
        /// The validation chain, on one line.
        detail: String,
    },
    /// JSON (de)serialisation failed.
    #[error("CDI spec {kind:?}: JSON")]
    Json {
        /// The spec kind (or `<unknown>` when reading).
        kind: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

/// The OCI hook points a CDI hook may attach to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookName {
    /// After the runtime environment is created, before pivot_root.
    CreateRuntime,
    /// In the container namespace, before pivot_root.
    CreateContainer,
    /// In the container, before the user process starts.
    StartContainer,
    /// After the user process starts.
    Poststart,
    /// After the container is deleted.
    Poststop,
}

impl HookName {
    /// The name as the CDI and OCI specs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CreateRuntime => "createRuntime",
            Self::CreateContainer => "createContainer",
            Self::StartContainer => "startContainer",
            Self::Poststart => "poststart",
            Self::Poststop => "poststop",
        }
    }
}

/// A device node to create in the container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DeviceNodeEdit {
    /// Path inside the container.
    pub path: PathBuf,
    /// Path on the host when it differs from `path` (needs CDI 0.5.0).
    pub host_path: Option<PathBuf>,
    /// cgroup permissions, any of `r`, `w`, `m` (the runtime's default is `rwm`).
    pub permissions: Option<String>,
}

impl DeviceNodeEdit {
    /// A node at the same path on the host and in the container.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            ..Self::default()
        }
    }

    /// Sets a host path different from the container path.
    pub fn host_path(mut self, host_path: impl Into<PathBuf>) -> Self {
        self.host_path = Some(host_path.into());
        self
    }

    /// Sets cgroup permissions (`rw`, `rwm`, ...).
    pub fn permissions(mut self, permissions: impl Into<String>) -> Self {
        self.permissions = Some(permissions.into());
        self
    }
}

impl From<&DeviceNode> for DeviceNodeEdit {
    /// Keeps `hostPath` only where it differs from the container path, so that specs for
    /// real nodes stay at the lowest CDI version.
    fn from(node: &DeviceNode) -> Self {
        Self {
            path: node.path.clone(),
            host_path: (node.host_path != node.path).then(|| node.host_path.clone()),
            permissions: None,
        }
    }
}

/// A mount to add to the container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MountEdit {
    /// Source on the host.
    pub host_path: PathBuf,
    /// Target inside the container.
    pub container_path: PathBuf,
    /// Mount options (`ro`, `bind`, `nosuid`, ...).
    pub options: Vec<String>,
    /// Filesystem type (needs CDI 0.4.0); `None` lets the runtime choose (a bind mount).
    pub mount_type: Option<String>,
}

impl MountEdit {
    /// A bind mount with `options`.
    pub fn bind(
        host_path: impl Into<PathBuf>,
        container_path: impl Into<PathBuf>,
        options: &[&str],
    ) -> Self {
        Self {
            host_path: host_path.into(),
            container_path: container_path.into(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
            mount_type: None,
        }
    }

    /// A read-only bind mount (`ro`, `nosuid`, `nodev`, `bind`).
    pub fn bind_read_only(
        host_path: impl Into<PathBuf>,
        container_path: impl Into<PathBuf>,
    ) -> Self {
        Self::bind(
            host_path,
            container_path,
            &["ro", "nosuid", "nodev", "bind"],
        )
    }
}

/// A hook the runtime runs at one of the OCI hook points.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HookEdit {
    /// When it runs.
    pub hook_name: HookName,
    /// Absolute path of the executable on the host.
    pub path: PathBuf,
    /// Arguments, `argv[0]` included.
    pub args: Vec<String>,
    /// Environment, `KEY=VALUE`.
    pub env: Vec<String>,
    /// Timeout in seconds.
    pub timeout: Option<i64>,
}

/// What the runtime must change in a container to give it a device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerEdits {
    /// Environment variables as (name, value), in order.
    pub env: Vec<(String, String)>,
    /// Device nodes.
    pub device_nodes: Vec<DeviceNodeEdit>,
    /// Mounts.
    pub mounts: Vec<MountEdit>,
    /// Hooks.
    pub hooks: Vec<HookEdit>,
    /// Supplementary groups of the container process (needs CDI 0.7.0).
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// Adds `name=value` to the environment.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Adds a device node unless one with the same container path is already there.
    pub fn device_node(mut self, node: DeviceNodeEdit) -> Self {
        if !self.device_nodes.iter().any(|n| n.path == node.path) {
            self.device_nodes.push(node);
        }
        self
    }

    /// Adds the device nodes of `gpu` (its own node and the control nodes), skipping ones
    /// already present, so edits for several GPUs list each control node once.
    pub fn gpu_device_nodes(self, gpu: &Gpu) -> Self {
        gpu.device_nodes
            .iter()
            .fold(self, |edits, n| edits.device_node(n.into()))
    }

    /// Adds a mount.
    pub fn mount(mut self, mount: MountEdit) -> Self {
        self.mounts.push(mount);
        self
    }

    /// Adds a hook.
    pub fn hook(mut self, hook: HookEdit) -> Self {
        self.hooks.push(hook);
        self
    }

    /// Adds a supplementary group.
    pub fn additional_gid(mut self, gid: u32) -> Self {
        self.additional_gids.push(gid);
        self
    }

    /// Whether there is nothing to edit.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
            && self.additional_gids.is_empty()
    }

    /// The CDI JSON object (`{"env": [...], "deviceNodes": [...], ...}`), empty lists left out.
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if !self.env.is_empty() {
            let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            m.insert("env".into(), json!(env));
        }
        if !self.device_nodes.is_empty() {
            let nodes: Vec<Value> = self
                .device_nodes
                .iter()
                .map(|n| {
                    let mut o = Map::new();
                    o.insert("path".into(), json!(path_str(&n.path)));
                    if let Some(h) = &n.host_path {
                        o.insert("hostPath".into(), json!(path_str(h)));
                    }
                    if let Some(p) = &n.permissions {
                        o.insert("permissions".into(), json!(p));
                    }
                    Value::Object(o)
                })
                .collect();
            m.insert("deviceNodes".into(), Value::Array(nodes));
        }
        if !self.hooks.is_empty() {
            let hooks: Vec<Value> = self
                .hooks
                .iter()
                .map(|h| {
                    let mut o = Map::new();
                    o.insert("hookName".into(), json!(h.hook_name.as_str()));
                    o.insert("path".into(), json!(path_str(&h.path)));
                    if !h.args.is_empty() {
                        o.insert("args".into(), json!(h.args));
                    }
                    if !h.env.is_empty() {
                        o.insert("env".into(), json!(h.env));
                    }
                    if let Some(t) = h.timeout {
                        o.insert("timeout".into(), json!(t));
                    }
                    Value::Object(o)
                })
                .collect();
            m.insert("hooks".into(), Value::Array(hooks));
        }
        if !self.mounts.is_empty() {
            let mounts: Vec<Value> = self
                .mounts
                .iter()
                .map(|mt| {
                    let mut o = Map::new();
                    o.insert("hostPath".into(), json!(path_str(&mt.host_path)));
                    o.insert("containerPath".into(), json!(path_str(&mt.container_path)));
                    if !mt.options.is_empty() {
                        o.insert("options".into(), json!(mt.options));
                    }
                    if let Some(t) = &mt.mount_type {
                        o.insert("type".into(), json!(t));
                    }
                    Value::Object(o)
                })
                .collect();
            m.insert("mounts".into(), Value::Array(mounts));
        }
        if !self.additional_gids.is_empty() {
            m.insert("additionalGids".into(), json!(self.additional_gids));
        }
        Value::Object(m)
    }
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

struct DeviceEntry {
    name: String,
    annotations: BTreeMap<String, String>,
    edits: ContainerEdits,
}

/// Builds a CDI spec for one kind (`vendor/class`) with one or more devices.
pub struct SpecBuilder {
    kind: String,
    annotations: BTreeMap<String, String>,
    common: ContainerEdits,
    devices: Vec<DeviceEntry>,
}

impl SpecBuilder {
    /// A spec of `kind`, `vendor/class` (e.g. `fgpu.dev/claim`).
    pub fn new(kind: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            annotations: BTreeMap::new(),
            common: ContainerEdits::default(),
            devices: Vec::new(),
        }
    }

    /// Adds a spec-level annotation (needs CDI 0.6.0).
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// Edits applied whenever any device of the spec is injected.
    pub fn common_edits(mut self, edits: ContainerEdits) -> Self {
        self.common = edits;
        self
    }

    /// Adds a device with its own edits (which must not be empty).
    pub fn device(mut self, name: impl Into<String>, edits: ContainerEdits) -> Self {
        self.devices.push(DeviceEntry {
            name: name.into(),
            annotations: BTreeMap::new(),
            edits,
        });
        self
    }

    /// Adds an annotation to the most recently added device (needs CDI 0.6.0).
    pub fn device_annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let Some(d) = self.devices.last_mut() {
            d.annotations.insert(key.into(), value.into());
        }
        self
    }

    /// Produces the spec at the lowest CDI version that covers its fields, validated.
    pub fn build(self) -> Result<CdiSpec, CdiError> {
        if self.devices.is_empty() {
            return Err(CdiError::NoDevices { kind: self.kind });
        }
        let devices: Vec<Value> = self
            .devices
            .iter()
            .map(|d| {
                let mut o = Map::new();
                o.insert("name".into(), json!(d.name));
                if !d.annotations.is_empty() {
                    o.insert("annotations".into(), json!(d.annotations));
                }
                o.insert("containerEdits".into(), d.edits.to_json());
                Value::Object(o)
            })
            .collect();
        let mut doc = Map::new();
        doc.insert(
            "cdiVersion".into(),
            json!(cdi::specs::config::CURRENT_VERSION),
        );
        doc.insert("kind".into(), json!(self.kind));
        if !self.annotations.is_empty() {
            doc.insert("annotations".into(), json!(self.annotations));
        }
        doc.insert("devices".into(), Value::Array(devices));
        if !self.common.is_empty() {
            doc.insert("containerEdits".into(), self.common.to_json());
        }
        let mut doc = Value::Object(doc);

        let kind = self.kind;
        let json_err = |source| CdiError::Json {
            kind: kind.clone(),
            source,
        };
        let draft: RawSpec = serde_json::from_value(doc.clone()).map_err(json_err)?;
        let version = cdi::version::minimum_required_version(&draft)
            .map_err(|e| invalid(&kind, &e))?
            .to_string();
        doc["cdiVersion"] = json!(version);
        let raw: RawSpec = serde_json::from_value(doc).map_err(json_err)?;
        let spec = CdiSpec { raw, kind, version };
        spec.validate()?;
        Ok(spec)
    }
}

/// A spec of `kind` with one device `name` carrying `edits`: the common case.
pub fn build_spec(kind: &str, name: &str, edits: ContainerEdits) -> Result<CdiSpec, CdiError> {
    SpecBuilder::new(kind).device(name, edits).build()
}

/// A validated CDI spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CdiSpec {
    raw: RawSpec,
    kind: String,
    version: String,
}

impl CdiSpec {
    /// Reads a spec from JSON and validates it (e.g. one written earlier by the plugin).
    pub fn from_json(text: &str) -> Result<Self, CdiError> {
        let doc: Value = serde_json::from_str(text).map_err(|source| CdiError::Json {
            kind: "<unknown>".into(),
            source,
        })?;
        let field = |k: &str| {
            doc.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let (kind, version) = (field("kind"), field("cdiVersion"));
        let raw: RawSpec = serde_json::from_value(doc).map_err(|source| CdiError::Json {
            kind: kind.clone(),
            source,
        })?;
        let spec = Self { raw, kind, version };
        spec.validate()?;
        Ok(spec)
    }

    /// The `cdiVersion` of the spec.
    pub fn cdi_version(&self) -> &str {
        &self.version
    }

    /// The `vendor/class` kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// Fully qualified device names, `vendor/class=name`, as the runtime and the kubelet
    /// expect them.
    pub fn qualified_names(&self) -> Vec<String> {
        self.device_names()
            .iter()
            .map(|n| format!("{}={n}", self.kind))
            .collect()
    }

    /// The device names, in spec order.
    pub fn device_names(&self) -> Vec<String> {
        // The crate's device fields are crate-private; read them from the JSON form.
        self.to_json_value()["devices"]
            .as_array()
            .map(|ds| {
                ds.iter()
                    .filter_map(|d| d["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The crate's model of the spec.
    pub fn raw(&self) -> &RawSpec {
        &self.raw
    }

    /// The spec as a JSON value.
    pub fn to_json_value(&self) -> Value {
        // A derived Serialize of plain strings, lists and maps cannot fail.
        serde_json::to_value(&self.raw).unwrap_or(Value::Null)
    }

    /// The spec as pretty-printed JSON, ready to be written to a CDI spec directory.
    pub fn to_json(&self) -> Result<String, CdiError> {
        serde_json::to_string_pretty(&self.raw).map_err(|source| CdiError::Json {
            kind: self.kind.clone(),
            source,
        })
    }

    /// Runs the CDI crate's validation (schema, version, names, edits).
    pub fn validate(&self) -> Result<(), CdiError> {
        // The crate's spec-level check reports a bad device without the cause ("validate
        // device name failed"), so each device is first checked on its own, which keeps
        // the cause ("invalid character ' ' in device name ...").
        if let Some(devices) = self.to_json_value()["devices"].as_array() {
            for value in devices {
                let name = value["name"].as_str().unwrap_or_default().to_owned();
                let mut device = cdi::device::Device::new();
                device.cdi_device =
                    serde_json::from_value(value.clone()).map_err(|source| CdiError::Json {
                        kind: self.kind.clone(),
                        source,
                    })?;
                device
                    .validate()
                    .map_err(|e| invalid(&self.kind, &format!("device {name:?}: {e:#}")))?;
            }
        }
        // The path only labels the spec inside the crate; nothing is read or written.
        let label = PathBuf::from("/var/run/cdi/fgpu-builder.json");
        cdi::spec::new_spec(&self.raw, &label, 0)
            .map(|_| ())
            .map_err(|e| invalid(&self.kind, &e))
    }
}

/// One-line form of the crate's error chain (it reports `anyhow` errors, whose alternate
/// form `{:#}` joins the causes with `: `).
fn invalid<E: std::fmt::Display>(kind: &str, e: &E) -> CdiError {
    let detail = format!("{e:#}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    CdiError::Invalid {
        kind: kind.to_owned(),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic() -> ContainerEdits {
        ContainerEdits::default()
            .env("FGPU_MEMORY_LIMIT", "10Gi")
            .device_node(DeviceNodeEdit::new("/dev/nvidia0"))
    }

    #[test]
    fn lowest_version_follows_fields_used() {
        let v = |b: SpecBuilder| b.build().unwrap().cdi_version().to_owned();
        let k = "fgpu.dev/claim";
        assert_eq!(v(SpecBuilder::new(k).device("gpu-0", basic())), "0.3.0");
        let typed_mount = MountEdit {
            mount_type: Some("tmpfs".into()),
            ..MountEdit::bind("tmpfs", "/scratch", &["nosuid"])
        };
        assert_eq!(
            v(SpecBuilder::new(k).device("gpu-0", basic().mount(typed_mount))),
            "0.4.0"
        );
        let host =
            basic().device_node(DeviceNodeEdit::new("/dev/nvidia1").host_path("/tmp/dev/nvidia1"));
        assert_eq!(v(SpecBuilder::new(k).device("gpu-0", host)), "0.5.0");
        // Claim UIDs often start with a digit: allowed from 0.5.0.
        assert_eq!(
            v(SpecBuilder::new(k).device("0f3a-gpu-0", basic())),
            "0.5.0"
        );
        assert_eq!(
            v(SpecBuilder::new(k)
                .annotation("fgpu.dev/claim", "ns/name")
                .device("gpu-0", basic())),
            "0.6.0"
        );
        assert_eq!(
            v(SpecBuilder::new(k)
                .device("gpu-0", basic())
                .device_annotation("a", "b")),
            "0.6.0"
        );
        assert_eq!(
            v(SpecBuilder::new(k).device("gpu-0", basic().additional_gid(44))),
            "0.7.0"
        );
    }

    #[test]
    fn invalid_device_name_is_rejected_clearly() {
        let e = build_spec("fgpu.dev/claim", "gpu 0", basic()).unwrap_err();
        let s = e.to_string();
        assert!(matches!(e, CdiError::Invalid { .. }));
        assert!(
            s.starts_with(r#"CDI spec "fgpu.dev/claim" is invalid:"#),
            "{s}"
        );
        assert!(
            s.contains("invalid character ' ' in device name gpu 0"),
            "{s}"
        );
        assert!(!s.contains('\n'));
    }

    #[test]
    fn other_invalid_specs() {
        let e = build_spec("no-class", "gpu-0", basic())
            .unwrap_err()
            .to_string();
        assert!(e.contains("is invalid"), "{e}");
        let e = build_spec(
            "fgpu.dev/claim",
            "gpu-0",
            ContainerEdits::default().env("", "x"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("invalid environment variable"), "{e}");
        let e = build_spec("fgpu.dev/claim", "gpu-0", ContainerEdits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("empty device edits"), "{e}");
        let e = build_spec(
            "fgpu.dev/claim",
            "gpu-0",
            basic().device_node(DeviceNodeEdit::new("/dev/nvidia1").permissions("rwx")),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("invalid permissions rwx"), "{e}");
        assert!(matches!(
            SpecBuilder::new("fgpu.dev/claim").build(),
            Err(CdiError::NoDevices { .. })
        ));
    }

    #[test]
    fn gpu_device_nodes_are_deduplicated_and_keep_host_paths() {
        let fake = std::path::Path::new("/tmp/fake-dev");
        let gpu = |minor: u32| Gpu {
            index: minor,
            minor,
            uuid: format!("GPU-{minor}"),
            product_name: "Tesla T4".into(),
            memory_bytes: 15 << 30,
            sm_count: 40,
            compute_capability: crate::device::ComputeCapability::new(7, 5),
            driver_version: "550.54.15".into(),
            cuda_driver_version: "12.4".into(),
            pci_bus_id: format!("0000:0{minor}:00.0"),
            pcie_root: None,
            numa_node: None,
            mig_capable: false,
            enforcement: Default::default(),
            health: crate::device::Health::Healthy,
            device_nodes: DeviceNode::standard_set(minor, fake),
        };
        let edits = ContainerEdits::default()
            .gpu_device_nodes(&gpu(0))
            .gpu_device_nodes(&gpu(1));
        let paths: Vec<_> = edits
            .device_nodes
            .iter()
            .map(|n| n.path.to_str().unwrap())
            .collect();
        assert_eq!(
            paths,
            [
                "/dev/nvidia0",
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia1"
            ]
        );
        assert_eq!(
            edits.device_nodes[4].host_path.as_deref(),
            Some(std::path::Path::new("/tmp/fake-dev/nvidia1"))
        );
        // Same path on host and in container: no hostPath, so the spec stays at 0.3.0.
        let real = DeviceNode::standard_set(0, std::path::Path::new("/dev"));
        assert_eq!(DeviceNodeEdit::from(&real[0]).host_path, None);
    }

    #[test]
    fn json_round_trips_and_rejects_unknown_keys() {
        let spec = build_spec("fgpu.dev/claim", "gpu-0", basic()).unwrap();
        let text = spec.to_json().unwrap();
        let back = CdiSpec::from_json(&text).unwrap();
        assert_eq!(back, spec);
        let bad = text.replacen("\"kind\"", "\"kinds\"", 1);
        assert!(matches!(
            CdiSpec::from_json(&bad),
            Err(CdiError::Json { .. })
        ));
        // A declared version too low for the fields used is refused.
        let host = build_spec(
            "fgpu.dev/claim",
            "gpu-0",
            basic().device_node(DeviceNodeEdit::new("/dev/x").host_path("/tmp/x")),
        )
        .unwrap();
        let lowered = host.to_json().unwrap().replace("0.5.0", "0.3.0");
        let e = CdiSpec::from_json(&lowered).unwrap_err().to_string();
        assert!(e.contains("at least v0.5.0"), "{e}");
    }
}
