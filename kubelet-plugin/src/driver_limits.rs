//! Driver-native memory limits: the first line of DESIGN.md's trust model, where the node's
//! driver has it (NVIDIA r615+: per-cgroup device-memory limits set through NVML, cgroup
//! v2, no MIG; `fgpu_driver::backend::limits`).
//!
//! * **Detection** ([`Marked`]): a GPU whose driver answers the limits query on the cgroup2
//!   root is published with `enforcement: driver`, every other with `shim`, so a claim can
//!   require driver-backed memory with a CEL selector. `--driver-memory-limits off` turns it
//!   off.
//! * **Setting** ([`run_hook`]): each claim's CDI spec carries a `createRuntime` hook
//!   (`edits::hook_edit`) that runs this binary (`fgpu-kubelet-plugin cdi-hook memory-limit`)
//!   when a container of the claim is created. The runtime hands it the container's state
//!   (its host PID) on stdin; the hook reads the container's own (leaf) cgroup from
//!   `/proc/<pid>/cgroup`, sets each GPU's hard limit to the claim's share there, reads it
//!   back, and records what it set in the claim's directory. Any failure fails the
//!   container's creation: a device published as driver-enforced never runs a container
//!   without its limit (fail closed).
//! * **Clearing** ([`release_claim`], [`sweep`]): at unprepare every limit the claim's
//!   records name on a cgroup that still exists is cleared; the resync sweep clears those
//!   of containers whose cgroup has emptied (`cgroup.events`: `populated 0`) and forgets
//!   the records of cgroups that are gone. Only the hard limit is ever set (the soft one
//!   stays 0): under the kernel's `dmem` controller a soft limit is added to every
//!   ancestor's reservation and outlives a deleted leaf, a hard limit dies with its cgroup.
//!
//! Why `createRuntime` and not `createContainer` (which NVIDIA's toolkit hook uses): OCI
//! runs `createRuntime` hooks in the runtime's namespaces once the container's cgroup is
//! applied, so the hook sees the host's `/proc` and the full cgroup path; a
//! `createContainer` hook runs inside the container's (new) cgroup namespace, where
//! `/proc/<pid>/cgroup` reads `0::/`. See docs/architecture.md.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use fgpu_driver::backend::limits::DriverLimits;
use fgpu_driver::backend::{BackendError, DeviceBackend, GpuUsage};
use fgpu_driver::device::{Enforcement, Gpu, Health, NodeInventory};
use serde::{Deserialize, Serialize};

use crate::edits::LimitHook;

/// `--driver-memory-limits`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LimitsMode {
    /// Use the driver's limits on every GPU where it has them.
    #[default]
    Auto,
    /// Never: every GPU is `enforcement: shim`.
    Off,
}

/// The claim directory's subdirectory of records (one file per container).
pub const RECORDS_DIR: &str = "driver-limits";
/// Where cgroup v2 is mounted when `/proc/self/mountinfo` does not say.
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Copies the running binary to `<state dir>/bin/fgpu-kubelet-plugin` (atomically: a
/// hook running the previous copy keeps it), so that the container runtime on the host
/// can run it even when the plugin runs in a container. Returns the copy's path.
pub fn install_program(state_dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = state_dir.join("bin");
    std::fs::create_dir_all(&dir)?;
    let dest = dir.join("fgpu-kubelet-plugin");
    let tmp = dir.join(format!(".fgpu-kubelet-plugin.{}", std::process::id()));
    std::fs::copy("/proc/self/exe", &tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &dest)?;
    Ok(dest)
}

/// The cgroup2 mount point named by a `/proc/self/mountinfo` text (one whose root is the
/// hierarchy's root, as on a host).
pub fn cgroup2_root(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = pre.split_whitespace().collect();
        if f.get(3) != Some(&"/") {
            return None;
        }
        f.get(4).map(PathBuf::from)
    })
}

/// This process's cgroup2 mount point (default [`DEFAULT_CGROUP_ROOT`]).
pub fn own_cgroup_root() -> PathBuf {
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|m| cgroup2_root(&m))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CGROUP_ROOT))
}

/// Why a `/proc/<pid>/cgroup` text names no usable cgroup v2 path (the caller names the
/// container and the file).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CgroupPathError {
    /// No `0::` line: the node is not on cgroup v2.
    #[error("no cgroup v2 entry (0::) in it: is the node on cgroup v2?")]
    NoUnified,
    /// The path is relative, or its cgroup was deleted.
    #[error("cgroup {0:?} is not a live absolute path")]
    NotLive(String),
    /// The path has a `..` component.
    #[error("cgroup {0:?} climbs out of the hierarchy")]
    Climbs(String),
}

/// The cgroup v2 path (`0::<path>`) of a `/proc/<pid>/cgroup` text.
pub fn unified_path(proc_cgroup: &str) -> Result<String, CgroupPathError> {
    let p = proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(CgroupPathError::NoUnified)?
        .trim();
    if !p.starts_with('/') || p.contains(" (deleted)") {
        return Err(CgroupPathError::NotLive(p.to_owned()));
    }
    if Path::new(p)
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(CgroupPathError::Climbs(p.to_owned()));
    }
    Ok(p.to_owned())
}

/// The directory of cgroup `path` (from [`unified_path`]) under the mount `root`.
pub fn cgroup_dir(root: &Path, path: &str) -> PathBuf {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        root.to_owned()
    } else {
        root.join(rel)
    }
}

/// What the hook set on one container: its record in the claim's directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The runtime's container id.
    pub container: String,
    /// The container's cgroup directory.
    pub cgroup: PathBuf,
    /// GPU UUID → hard limit in bytes.
    pub limits: BTreeMap<String, u64>,
}

/// `fgpu-kubelet-plugin cdi-hook memory-limit` flags.
#[derive(Debug, clap::Args)]
pub struct HookArgs {
    /// The claim's UID (its records go to `<run dir>/claims/<uid>/driver-limits/`).
    #[arg(long, value_name = "UID")]
    pub claim: String,
    /// `GPU-UUID=BYTES`: the hard limit of the container's cgroup on that GPU (repeat).
    #[arg(long = "limit", value_name = "UUID=BYTES", required = true)]
    pub limits: Vec<String>,
    /// The NVML library to set the limits through.
    #[arg(long, value_name = "FILE", default_value = fgpu_driver::backend::nvml::NVML_LIBRARY)]
    pub nvml_library: PathBuf,
    /// The plugin's run directory (its `--run-dir`).
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// Where host processes are.
    #[arg(long, value_name = "DIR", default_value = "/proc", hide = true)]
    pub proc_root: PathBuf,
}

/// Why the hook failed (the container is then not created).
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// A flag is malformed.
    #[error("--limit {0:?}: want GPU-UUID=BYTES")]
    BadLimit(String),
    /// The container state on stdin is unusable.
    #[error("the container state on stdin: {0}")]
    State(String),
    /// The container's cgroup could not be found.
    #[error("container {container} (pid {pid}): {detail}")]
    Cgroup {
        /// Container id.
        container: String,
        /// Its host PID.
        pid: u32,
        /// What went wrong.
        detail: String,
    },
    /// The driver has no limits or refused one.
    #[error(
        "claim {claim}: GPU {gpu}: cannot limit the container's memory to {bytes} bytes: {detail}"
    )]
    Driver {
        /// Claim UID.
        claim: String,
        /// GPU UUID.
        gpu: String,
        /// The limit.
        bytes: u64,
        /// NVML's answer.
        detail: String,
    },
    /// The record could not be written.
    #[error("claim {claim}: cannot record the limits in {}: {source}", path.display())]
    Record {
        /// Claim UID.
        claim: String,
        /// The record.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

fn parse_limit(s: &str) -> Result<(String, u64), HookError> {
    let (u, b) = s
        .split_once('=')
        .ok_or_else(|| HookError::BadLimit(s.to_owned()))?;
    let bytes = b.parse().map_err(|_| HookError::BadLimit(s.to_owned()))?;
    if !u.starts_with("GPU-") || bytes == 0 {
        return Err(HookError::BadLimit(s.to_owned()));
    }
    Ok((u.to_owned(), bytes))
}

/// The OCI container state the runtime writes to a hook's stdin: (id, pid).
pub fn parse_state(text: &str) -> Result<(String, u32), HookError> {
    #[derive(Deserialize)]
    struct State {
        id: String,
        pid: Option<u32>,
    }
    let s: State = serde_json::from_str(text).map_err(|e| HookError::State(e.to_string()))?;
    let pid = s
        .pid
        .filter(|&p| p > 0)
        .ok_or_else(|| HookError::State(format!("container {}: no pid", s.id)))?;
    if s.id.is_empty() || s.id.contains('/') || s.id.starts_with('.') {
        return Err(HookError::State(format!("container id {:?}", s.id)));
    }
    Ok((s.id, pid))
}

/// The hook: sets the container's limits (state on `stdin`), records them.
pub fn run_hook(args: &HookArgs, stdin: &mut dyn std::io::Read) -> Result<Record, HookError> {
    let limits = args
        .limits
        .iter()
        .map(|s| parse_limit(s))
        .collect::<Result<Vec<_>, _>>()?;
    let mut text = String::new();
    stdin
        .read_to_string(&mut text)
        .map_err(|e| HookError::State(e.to_string()))?;
    let (container, pid) = parse_state(&text)?;
    let cg_err = |detail: String| HookError::Cgroup {
        container: container.clone(),
        pid,
        detail,
    };
    let proc_cgroup = std::fs::read_to_string(args.proc_root.join(pid.to_string()).join("cgroup"))
        .map_err(|e| cg_err(format!("/proc/{pid}/cgroup: {e}")))?;
    let path = unified_path(&proc_cgroup).map_err(|e| cg_err(e.to_string()))?;
    let dir = cgroup_dir(&own_cgroup_root(), &path);
    if !dir.join("cgroup.procs").is_file() {
        return Err(cg_err(format!(
            "{} is not a cgroup v2 directory",
            dir.display()
        )));
    }
    let driver = |gpu: &str, bytes: u64, detail: String| HookError::Driver {
        claim: args.claim.clone(),
        gpu: gpu.to_owned(),
        bytes,
        detail,
    };
    let nvml = handle(&args.nvml_library).map_err(|d| {
        let (g, b) = limits.first().cloned().unwrap_or_default();
        driver(&g, b, d.to_string())
    })?;
    let mut record = Record {
        container,
        cgroup: dir.clone(),
        limits: BTreeMap::new(),
    };
    for (gpu, bytes) in &limits {
        nvml.set_hard(gpu, &dir, *bytes)
            .map_err(|e| driver(gpu, *bytes, e.to_string()))?;
        record.limits.insert(gpu.clone(), *bytes);
    }
    let records = records_dir(&args.run_dir, &args.claim);
    let file = records.join(format!("{}.json", record.container));
    write_record(&records, &file, &record).map_err(|source| HookError::Record {
        claim: args.claim.clone(),
        path: file.clone(),
        source,
    })?;
    Ok(record)
}

/// `<run dir>/claims/<uid>/driver-limits`.
pub fn records_dir(run_dir: &Path, claim_uid: &str) -> PathBuf {
    crate::edits::claims_dir(run_dir)
        .join(claim_uid)
        .join(RECORDS_DIR)
}

fn write_record(dir: &Path, file: &Path, r: &Record) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(r).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, file)
}

/// Why a record file could not be read back (the caller names the file).
#[derive(Debug, thiserror::Error)]
enum BadRecord {
    /// The file could not be read.
    #[error(transparent)]
    Read(#[from] std::io::Error),
    /// It is not a [`Record`].
    #[error(transparent)]
    Parse(#[from] serde_json::Error),
}

/// The records in a claim's directory (a malformed one is reported and skipped).
fn read_records(dir: &Path) -> Vec<(PathBuf, Result<Record, BadRecord>)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let r = std::fs::read(&p)
                .map_err(BadRecord::from)
                .and_then(|b| Ok(serde_json::from_slice(&b)?));
            (p, r)
        })
        .collect()
}

/// Why an NVML library offers no memory limits.
#[derive(Debug, thiserror::Error)]
pub enum LimitsUnavailable {
    /// The library cannot be loaded (the message names it).
    #[error(transparent)]
    Library(#[from] BackendError),
    /// It loads but lacks the calls.
    #[error("{} has no memory-limit calls (a driver before r615)", .0.display())]
    NoCalls(PathBuf),
}

/// One NVML handle per library, for the life of the process.
fn handle(lib: &Path) -> Result<Arc<DriverLimits>, LimitsUnavailable> {
    static HANDLES: OnceLock<Mutex<BTreeMap<PathBuf, Arc<DriverLimits>>>> = OnceLock::new();
    let mut map = HANDLES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(h) = map.get(lib) {
        return Ok(h.clone());
    }
    let h = DriverLimits::open(lib)?.ok_or_else(|| LimitsUnavailable::NoCalls(lib.to_owned()))?;
    let h = Arc::new(h);
    map.insert(lib.to_owned(), h.clone());
    Ok(h)
}

/// What a pass over records did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Limits cleared (GPU, cgroup).
    pub cleared: Vec<(String, PathBuf)>,
    /// Records removed.
    pub records: usize,
    /// What failed (the record is kept for the next pass).
    pub errors: Vec<String>,
}

/// Clears every limit claim `uid`'s records name on a cgroup that still exists, and
/// removes the records (unprepare).
pub fn release_claim(hook: &LimitHook, uid: &str) -> Released {
    release(hook, &records_dir(&hook.run_dir, uid), |_| true)
}

/// The resync pass over every claim: clears the limits of containers whose cgroup has
/// emptied, forgets the records of cgroups that are gone.
pub fn sweep(hook: &LimitHook) -> Released {
    let mut all = Released::default();
    let Ok(rd) = std::fs::read_dir(crate::edits::claims_dir(&hook.run_dir)) else {
        return all;
    };
    for claim in rd.flatten() {
        let r = release(hook, &claim.path().join(RECORDS_DIR), |cg| !populated(cg));
        all.cleared.extend(r.cleared);
        all.records += r.records;
        all.errors.extend(r.errors);
    }
    all
}

/// Whether cgroup `dir` still has processes (`cgroup.events`; unreadable: yes).
fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|t| !t.lines().any(|l| l.trim() == "populated 0"))
        .unwrap_or(true)
}

fn release(hook: &LimitHook, dir: &Path, done: impl Fn(&Path) -> bool) -> Released {
    let mut out = Released::default();
    for (file, record) in read_records(dir) {
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                out.errors.push(format!("{}: {e}; removed", file.display()));
                let _ = std::fs::remove_file(&file);
                continue;
            }
        };
        let exists = record.cgroup.join("cgroup.procs").is_file();
        if exists && !done(&record.cgroup) {
            continue;
        }
        let mut failed = false;
        if exists {
            match handle(&hook.nvml_library) {
                Ok(nvml) => {
                    for gpu in record.limits.keys() {
                        match nvml.clear(gpu, &record.cgroup) {
                            Ok(()) => out.cleared.push((gpu.clone(), record.cgroup.clone())),
                            Err(e) => {
                                failed = true;
                                out.errors.push(format!(
                                    "GPU {gpu}, cgroup {}: {e}",
                                    record.cgroup.display()
                                ));
                            }
                        }
                    }
                }
                Err(e) => {
                    failed = true;
                    out.errors.push(e.to_string());
                }
            }
        }
        if !failed && std::fs::remove_file(&file).is_ok() {
            out.records += 1;
        }
    }
    out
}

/// A device backend whose GPUs say `enforcement: driver` where the driver limits memory.
pub struct Marked {
    inner: Box<dyn DeviceBackend>,
    nvml: Arc<DriverLimits>,
    cgroup_root: PathBuf,
    /// The answer per GPU, asked once (a driver does not gain or lose the feature while
    /// it is loaded).
    known: Mutex<BTreeMap<String, Enforcement>>,
}

impl Marked {
    /// `inner`, its GPUs marked through the NVML library `lib`. `Err`: the library cannot
    /// be loaded or has no memory-limit calls (the reason, for a log line).
    pub fn new(
        inner: Box<dyn DeviceBackend>,
        lib: &Path,
    ) -> Result<Self, (Box<dyn DeviceBackend>, LimitsUnavailable)> {
        match handle(lib) {
            Ok(nvml) => Ok(Self {
                inner,
                nvml,
                cgroup_root: own_cgroup_root(),
                known: Mutex::default(),
            }),
            Err(e) => Err((inner, e)),
        }
    }

    fn mark(&self, gpus: &mut [Gpu]) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        for g in gpus {
            let e = *known.entry(g.uuid.clone()).or_insert_with(|| {
                match self.nvml.supported(&g.uuid, &self.cgroup_root) {
                    Ok(true) => Enforcement::Driver,
                    Ok(false) => Enforcement::Shim,
                    Err(e) => {
                        tracing::warn!(gpu = %g.uuid, error = %e,
                            "cannot tell whether the driver limits memory on this GPU; enforcement: shim");
                        Enforcement::Shim
                    }
                }
            });
            g.enforcement = e;
        }
    }
}

impl DeviceBackend for Marked {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn enumerate(&self) -> Result<Vec<Gpu>, BackendError> {
        let mut gpus = self.inner.enumerate()?;
        self.mark(&mut gpus);
        Ok(gpus)
    }

    fn health(&self, uuid: &str) -> Result<Health, BackendError> {
        self.inner.health(uuid)
    }

    fn inventory(&self, node: &str) -> Result<NodeInventory, BackendError> {
        let mut inv = self.inner.inventory(node)?;
        self.mark(&mut inv.gpus);
        Ok(inv)
    }

    fn usage(&self, since_us: u64) -> Result<Vec<GpuUsage>, BackendError> {
        self.inner.usage(since_us)
    }
}

/// The hook's environment on a fake node: the plugin's own `FAKE_CUDA_*` (state, UUIDs,
/// the limits knob), so that the hook's NVML is the node's fake driver.
pub fn fake_env() -> Vec<String> {
    let mut v: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("FAKE_CUDA_"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    v.sort();
    v
}

/// Reads the hook's stdin and runs it (the binary's `cdi-hook memory-limit`).
pub fn hook_main(args: &HookArgs) -> Result<(), HookError> {
    let r = run_hook(args, &mut std::io::stdin())?;
    tracing::info!(claim = %args.claim, container = %r.container, cgroup = %r.cgroup.display(),
        limits = ?r.limits, "driver memory limits set");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::{HOOK_TIMEOUT_SECONDS, hook_edit};
    use fgpu_driver::cdi::HookName;

    #[test]
    fn the_cgroup2_mount_and_a_process_cgroup() {
        let mi = "24 30 0:22 / /sys rw - sysfs sysfs rw\n\
                  35 24 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_root(mi), Some(PathBuf::from("/sys/fs/cgroup")));
        // A container's view (its cgroup namespace's root is a subtree): not the host's.
        let sub = "35 24 0:30 /kubepods/x /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_root(sub), None);
        assert_eq!(
            unified_path("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope\n"),
            Ok("/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope".into())
        );
        assert!(
            unified_path("1:name=systemd:/x\n")
                .unwrap_err()
                .to_string()
                .contains("cgroup v2")
        );
        assert!(unified_path("0::/a/../../etc\n").is_err());
        assert!(unified_path("0::/gone (deleted)\n").is_err());
        assert_eq!(
            cgroup_dir(Path::new("/sys/fs/cgroup"), "/k/c"),
            PathBuf::from("/sys/fs/cgroup/k/c")
        );
        assert_eq!(
            cgroup_dir(Path::new("/sys/fs/cgroup"), "/"),
            PathBuf::from("/sys/fs/cgroup")
        );
    }

    #[test]
    fn the_oci_state_and_the_limit_flags() {
        assert_eq!(
            parse_state(
                r#"{"ociVersion":"1.2.0","id":"abc","status":"creating","pid":4242,"bundle":"/b"}"#
            )
            .unwrap(),
            ("abc".into(), 4242)
        );
        for bad in [
            r#"{"id":"abc"}"#,
            r#"{"id":"abc","pid":0}"#,
            r#"{"id":"../x","pid":3}"#,
            "not json",
        ] {
            assert!(parse_state(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_limit("GPU-1=1073741824").unwrap(),
            ("GPU-1".into(), 1 << 30)
        );
        for bad in ["GPU-1", "GPU-1=x", "1=5", "GPU-1=0"] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_hook_edit_runs_the_installed_binary_with_the_claims_limits() {
        let hook = LimitHook {
            program: "/var/lib/fgpu/bin/fgpu-kubelet-plugin".into(),
            nvml_library: "/usr/lib/libnvidia-ml.so.1".into(),
            run_dir: "/run/fgpu".into(),
            env: vec!["FAKE_CUDA_MEMORY_LIMITS=1".into()],
        };
        let h = hook_edit(
            &hook,
            "uid-1",
            &[("GPU-a".into(), 1 << 30), ("GPU-b".into(), 5)],
        );
        assert_eq!(h.hook_name, HookName::CreateRuntime);
        assert_eq!(
            h.path,
            PathBuf::from("/var/lib/fgpu/bin/fgpu-kubelet-plugin")
        );
        assert_eq!(
            h.args.join(" "),
            "fgpu-kubelet-plugin cdi-hook memory-limit --claim uid-1 \
             --nvml-library /usr/lib/libnvidia-ml.so.1 --run-dir /run/fgpu \
             --limit GPU-a=1073741824 --limit GPU-b=5"
        );
        assert_eq!(h.env, vec!["FAKE_CUDA_MEMORY_LIMITS=1".to_owned()]);
        assert_eq!(h.timeout, Some(HOOK_TIMEOUT_SECONDS));
    }

    #[test]
    fn records_of_gone_cgroups_are_forgotten_and_malformed_ones_removed() {
        let run = std::env::temp_dir().join(format!("fgpu-dl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&run);
        let hook = LimitHook {
            program: "/x".into(),
            nvml_library: "/no/such/libnvidia-ml.so.1".into(),
            run_dir: run.clone(),
            env: vec![],
        };
        let dir = records_dir(&run, "u1");
        let gone = Record {
            container: "c1".into(),
            cgroup: "/no/such/cgroup".into(),
            limits: [("GPU-a".to_owned(), 5)].into(),
        };
        write_record(&dir, &dir.join("c1.json"), &gone).unwrap();
        std::fs::write(dir.join("c2.json"), "{").unwrap();
        // A record of a live cgroup (a directory with cgroup.procs) whose driver cannot be
        // loaded: kept, with the error.
        let live = run.join("cg");
        std::fs::create_dir_all(&live).unwrap();
        std::fs::write(live.join("cgroup.procs"), "").unwrap();
        let alive = Record {
            container: "c3".into(),
            cgroup: live.clone(),
            limits: [("GPU-a".to_owned(), 5)].into(),
        };
        write_record(&dir, &dir.join("c3.json"), &alive).unwrap();
        // The sweep leaves a populated cgroup's record alone (no cgroup.events: populated).
        let s = sweep(&hook);
        assert_eq!(s.records, 1, "{s:?}");
        assert_eq!(s.errors.len(), 1, "the malformed record: {s:?}");
        assert!(dir.join("c3.json").exists());
        let r = release_claim(&hook, "u1");
        assert_eq!(r.records, 0);
        assert!(r.errors[0].contains("/no/such/libnvidia-ml.so.1"), "{r:?}");
        assert!(dir.join("c3.json").exists(), "kept for the next pass");
        let _ = std::fs::remove_dir_all(&run);
    }
}
