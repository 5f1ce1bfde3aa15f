//! Which of the host's NVIDIA user-space files go into every GPU container.
//!
//! Two sources, in this order:
//!
//! 1. the NVIDIA container toolkit's CDI spec, where the node has one (`nvidia-ctk cdi
//!    generate` writes `/etc/cdi/nvidia.yaml` or `/var/run/cdi/nvidia.yaml`, kind
//!    `nvidia.com/gpu`): its spec-level `containerEdits` mounts (libraries, `nvidia-smi`,
//!    firmware, ...) and hooks (symlinks, ld cache) are taken over as they are;
//! 2. otherwise discovery: the driver's libraries (`libcuda.so*`, `libnvidia-ml.so*`, ...)
//!    in the usual library directories and the tools (`nvidia-smi`, ...) in the usual
//!    binary directories, each mounted read-only at the same path.
//!
//! With the fake backend the caller names the fake CUDA libraries explicitly instead.

use std::path::{Path, PathBuf};

use fgpu_driver::cdi::{HookEdit, HookName};
use serde::Deserialize;

use crate::edits::FileMount;

/// Kind of the toolkit's spec.
pub const TOOLKIT_KIND: &str = "nvidia.com/gpu";
/// Where the toolkit's spec is looked for, in order.
pub const TOOLKIT_SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
/// Library directories searched by discovery.
pub const LIBRARY_DIRS: [&str; 5] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
];
/// Binary directories searched by discovery.
pub const BINARY_DIRS: [&str; 2] = ["/usr/bin", "/usr/local/bin"];
/// File name prefixes of the driver libraries a CUDA container needs.
pub const LIBRARY_PREFIXES: [&str; 8] = [
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
];
/// Tools a GPU container expects.
pub const BINARIES: [&str; 3] = ["nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control"];

/// The driver's files for containers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverFiles {
    /// Read-only mounts.
    pub mounts: Vec<FileMount>,
    /// Hooks (from the toolkit's spec).
    pub hooks: Vec<HookEdit>,
    /// Where they came from, for logs: the toolkit spec's path, or `discovery`.
    pub origin: String,
}

/// A toolkit spec that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{}: {detail}", path.display())]
pub struct ToolkitSpecError {
    /// The spec file.
    pub path: PathBuf,
    /// What is wrong.
    pub detail: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    container_edits: RawEdits,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEdits {
    #[serde(default)]
    mounts: Vec<RawMount>,
    #[serde(default)]
    hooks: Vec<RawHook>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMount {
    host_path: PathBuf,
    container_path: PathBuf,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawHook {
    hook_name: String,
    path: PathBuf,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    timeout: Option<i64>,
}

fn hook_name(name: &str) -> Option<HookName> {
    Some(match name {
        "createRuntime" => HookName::CreateRuntime,
        "createContainer" => HookName::CreateContainer,
        "startContainer" => HookName::StartContainer,
        "poststart" => HookName::Poststart,
        "poststop" => HookName::Poststop,
        _ => return None,
    })
}

/// Reads the toolkit's spec (YAML or JSON): its spec-level mounts and hooks. Unknown fields
/// are ignored; a spec of another kind or an unknown hook point is an error.
pub fn from_toolkit_spec(text: &str, path: &Path) -> Result<DriverFiles, ToolkitSpecError> {
    let err = |detail: String| ToolkitSpecError {
        path: path.to_owned(),
        detail,
    };
    let raw: RawSpec = serde_saphyr::from_str(text).map_err(|e| err(e.to_string()))?;
    if raw.kind != TOOLKIT_KIND {
        return Err(err(format!(
            "kind is {:?}, expected {TOOLKIT_KIND:?}",
            raw.kind
        )));
    }
    let hooks = raw
        .container_edits
        .hooks
        .into_iter()
        .map(|h| {
            Ok(HookEdit {
                hook_name: hook_name(&h.hook_name)
                    .ok_or_else(|| err(format!("unknown hook point {:?}", h.hook_name)))?,
                path: h.path,
                args: h.args,
                env: h.env,
                timeout: h.timeout,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(DriverFiles {
        mounts: raw
            .container_edits
            .mounts
            .into_iter()
            .map(|m| FileMount {
                host_path: m.host_path,
                container_path: m.container_path,
            })
            .collect(),
        hooks,
        origin: path.display().to_string(),
    })
}

/// The first toolkit spec (`*.yaml`, `*.yml`, `*.json` of kind `nvidia.com/gpu`) in `dirs`.
pub fn find_toolkit_spec(dirs: &[PathBuf]) -> Option<(PathBuf, String)> {
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let ext = f.extension().and_then(|e| e.to_str()).unwrap_or_default();
            if !matches!(ext, "yaml" | "yml" | "json") {
                continue;
            }
            if let Ok(text) = std::fs::read_to_string(&f)
                && serde_saphyr::from_str::<RawSpec>(&text).is_ok_and(|s| s.kind == TOOLKIT_KIND)
            {
                return Some((f, text));
            }
        }
    }
    None
}

/// Discovers the driver's libraries under `library_dirs` and its tools under `binary_dirs`,
/// each mounted at the same path. Files are listed in a stable order.
pub fn discover(library_dirs: &[PathBuf], binary_dirs: &[PathBuf]) -> DriverFiles {
    let mut mounts = Vec::new();
    for dir in library_dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| {
                LIBRARY_PREFIXES
                    .iter()
                    .any(|p| n.strip_prefix(p).is_some_and(|rest| rest.starts_with('.')))
            })
            .collect();
        names.sort();
        mounts.extend(names.into_iter().map(|n| FileMount::same(dir.join(n))));
    }
    for dir in binary_dirs {
        for b in BINARIES {
            let p = dir.join(b);
            if p.is_file() {
                mounts.push(FileMount::same(p));
            }
        }
    }
    DriverFiles {
        mounts,
        hooks: Vec::new(),
        origin: "discovery".into(),
    }
}

/// The toolkit's spec if one is found in `spec_dirs`, else discovery in the standard
/// directories below `driver_root` (where the host's root is mounted when the plugin runs
/// in a container; `/` otherwise). Discovered paths are given as the host sees them.
pub fn resolve(spec_dirs: &[PathBuf], driver_root: &Path) -> Result<DriverFiles, ToolkitSpecError> {
    if let Some((path, text)) = find_toolkit_spec(spec_dirs) {
        return from_toolkit_spec(&text, &path);
    }
    let under = |dirs: &[&str]| -> Vec<PathBuf> {
        dirs.iter()
            .map(|d| driver_root.join(d.trim_start_matches('/')))
            .collect()
    };
    let mut files = discover(&under(&LIBRARY_DIRS), &under(&BINARY_DIRS));
    for m in &mut files.mounts {
        if let Ok(rest) = m.host_path.strip_prefix(driver_root) {
            let host = Path::new("/").join(rest);
            m.host_path = host.clone();
            m.container_path = host;
        }
    }
    Ok(files)
}

/// A `--driver-file` value with a relative path (the value as given).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "--driver-file {0:?}: paths must be absolute, e.g. /usr/lib/x86_64-linux-gnu/libcuda.so.1 or /opt/fake/libcuda.so.1:/usr/lib/x86_64-linux-gnu/libcuda.so.1"
)]
pub struct DriverFileError(pub String);

/// One `--driver-file` value, `HOST[:CONTAINER]` (the container path defaults to the host
/// path); both must be absolute. The error says what was given and what is expected.
pub fn parse_driver_file(spec: &str) -> Result<FileMount, DriverFileError> {
    let (host, container) = spec.split_once(':').unwrap_or((spec, spec));
    let (host, container) = (PathBuf::from(host), PathBuf::from(container));
    if !host.is_absolute() || !container.is_absolute() {
        return Err(DriverFileError(spec.to_owned()));
    }
    Ok(FileMount {
        host_path: host,
        container_path: container,
    })
}

/// The driver files every claim's containers get, as both front ends (DRA `serve` and the
/// device plugin) choose them: the `explicit` `--driver-file`s when any are given, or none
/// besides them for the fake backend (its CUDA libraries are given explicitly); otherwise the
/// NVIDIA container toolkit's spec in its directories under `driver_root` or in `cdi_root`,
/// else discovery below `driver_root`.
pub fn for_node(
    explicit: Vec<FileMount>,
    fake_backend: bool,
    driver_root: &Path,
    cdi_root: &Path,
) -> Result<(Vec<FileMount>, Vec<HookEdit>), ToolkitSpecError> {
    if !explicit.is_empty() || fake_backend {
        return Ok((explicit, Vec::new()));
    }
    let mut spec_dirs: Vec<PathBuf> = TOOLKIT_SPEC_DIRS
        .iter()
        .map(|d| driver_root.join(d.trim_start_matches('/')))
        .collect();
    spec_dirs.push(cdi_root.to_owned());
    let files = resolve(&spec_dirs, driver_root)?;
    tracing::info!(origin = %files.origin, mounts = files.mounts.len(), hooks = files.hooks.len(), "driver files for containers");
    Ok((files.mounts, files.hooks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_files_win_and_the_fake_backend_uses_only_those() {
        // A driver root with no toolkit spec and no libraries: nothing may be read from it.
        let root = Path::new("/nonexistent-fgpu-driver-root");
        let given =
            vec![parse_driver_file("/opt/fake/libcuda.so.1:/usr/lib/libcuda.so.1").unwrap()];
        assert_eq!(
            for_node(given.clone(), false, root, root).unwrap(),
            (given.clone(), vec![])
        );
        assert_eq!(
            for_node(given.clone(), true, root, root).unwrap(),
            (given, vec![])
        );
        assert_eq!(
            for_node(vec![], true, root, root).unwrap(),
            (vec![], vec![])
        );
        assert!(
            parse_driver_file("libcuda.so.1")
                .unwrap_err()
                .to_string()
                .contains("paths must be absolute")
        );
    }

    const TOOLKIT: &str = r#"
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0}]
containerEdits:
  env: [NVIDIA_VISIBLE_DEVICES=void]
  deviceNodes: [{path: /dev/nvidiactl}]
  mounts:
    - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
      containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
      options: [ro, nosuid, nodev, bind]
    - hostPath: /usr/bin/nvidia-smi
      containerPath: /usr/bin/nvidia-smi
      options: [ro, nosuid, nodev, bind]
  hooks:
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args: [nvidia-cdi-hook, update-ldcache, --folder, /usr/lib/x86_64-linux-gnu]
      futureField: 1
"#;

    #[test]
    fn toolkit_spec_mounts_and_hooks_are_taken_over() {
        let f = from_toolkit_spec(TOOLKIT, Path::new("/etc/cdi/nvidia.yaml")).unwrap();
        assert_eq!(
            f.mounts,
            [
                FileMount::same("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
                FileMount::same("/usr/bin/nvidia-smi"),
            ]
        );
        assert_eq!(f.hooks.len(), 1);
        assert_eq!(f.hooks[0].hook_name, HookName::CreateContainer);
        assert_eq!(f.hooks[0].args[1], "update-ldcache");
        assert_eq!(f.origin, "/etc/cdi/nvidia.yaml");

        let e = from_toolkit_spec("kind: vendor.com/x\n", Path::new("/x.yaml")).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"/x.yaml: kind is "vendor.com/x", expected "nvidia.com/gpu""#
        );
        let bad_hook = TOOLKIT.replace("createContainer", "sometime");
        let e = from_toolkit_spec(&bad_hook, Path::new("/x.yaml")).unwrap_err();
        assert!(
            e.to_string().contains("unknown hook point \"sometime\""),
            "{e}"
        );
    }

    #[test]
    fn finds_the_toolkit_spec_among_others_else_discovers() {
        let dir = tempfile::tempdir().unwrap();
        let (etc, run) = (dir.path().join("etc-cdi"), dir.path().join("run-cdi"));
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::create_dir_all(&run).unwrap();
        std::fs::write(etc.join("other.yaml"), "kind: vendor.com/x\n").unwrap();
        std::fs::write(etc.join("notes.txt"), TOOLKIT).unwrap();
        assert!(find_toolkit_spec(&[etc.clone(), run.clone()]).is_none());
        std::fs::write(run.join("nvidia.yaml"), TOOLKIT).unwrap();
        let (path, _) = find_toolkit_spec(&[etc.clone(), run.clone()]).unwrap();
        assert_eq!(path, run.join("nvidia.yaml"));
        let files = resolve(&[etc, run], Path::new("/")).unwrap();
        assert_eq!(files.mounts.len(), 2);

        let lib = dir.path().join("lib");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        for f in [
            "libcuda.so.1",
            "libcuda.so.550.54.15",
            "libnvidia-ml.so.1",
            "libcudart.so.12",
            "libcuda-stub.so",
            "libc.so.6",
        ] {
            std::fs::write(lib.join(f), b"").unwrap();
        }
        std::fs::write(bin.join("nvidia-smi"), b"").unwrap();
        std::fs::write(bin.join("bash"), b"").unwrap();
        let found = discover(
            &[lib.clone(), dir.path().join("missing")],
            std::slice::from_ref(&bin),
        );
        let paths: Vec<PathBuf> = found.mounts.iter().map(|m| m.host_path.clone()).collect();
        assert_eq!(
            paths,
            [
                lib.join("libcuda.so.1"),
                lib.join("libcuda.so.550.54.15"),
                lib.join("libnvidia-ml.so.1"),
                bin.join("nvidia-smi"),
            ]
        );
        assert!(found.mounts.iter().all(|m| m.host_path == m.container_path));
        assert_eq!(found.origin, "discovery");
    }

    #[test]
    fn discovery_below_a_driver_root_reports_host_paths() {
        let root = tempfile::tempdir().unwrap();
        let lib = root.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnvidia-ml.so.1"), b"").unwrap();
        std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
        std::fs::write(root.path().join("usr/bin/nvidia-smi"), b"").unwrap();
        let files = resolve(&[root.path().join("no-cdi")], root.path()).unwrap();
        assert_eq!(
            files.mounts,
            [
                FileMount::same("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
                FileMount::same("/usr/bin/nvidia-smi"),
            ]
        );
    }
}
