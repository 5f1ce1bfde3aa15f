//! Prepare and unprepare claims: the side effects, made crash-safe by the checkpoint.
//!
//! [`Plugin::prepare`] for one claim:
//!
//! 1. takes the claim's lock (one operation per claim at a time; different claims run in
//!    parallel);
//! 2. returns the recorded devices if the claim is `PrepareCompleted` (idempotent);
//! 3. GETs the claim through the [`ClaimSource`], checks the UID, resolves the grants
//!    ([`crate::grant`]), places them on this node's GPUs and builds the CDI spec
//!    ([`crate::edits`]) — all before touching anything;
//! 4. records `PrepareStarted` (written, not fsynced: only a restart in this boot reads it),
//!    creates the claim directory (0700) and its state directory (0700), writes the limits
//!    file (0444) and the CDI spec (0644), each by write-rename (see
//!    [`Durability::Atomic`]);
//! 5. records `PrepareCompleted` with the devices (fsynced).
//!
//! Steps 4 and 5 are one task on the blocking pool, which holds the claim's lock until it
//! ends (even when the gRPC call that started it is dropped, so that the next operation on
//! the claim cannot overlap its file work). Each claim's record is its own file
//! ([`crate::checkpoint`]): the records of concurrent prepares never wait for each other.
//!
//! Where the files are: the checkpoint and the claim directories under the run root
//! (`/run/fgpu`, a tmpfs on real nodes: per boot like everything they describe, and a
//! prepare there costs no disk I/O — on a disk, creating the files and the fsync were most
//! of a prepare's time); the CDI spec in the CDI directory the runtime reads; the node-wide
//! files under the state root (`/var/lib/fgpu`): the preload file (`ld.so.preload`, naming
//! the shim), written by [`Plugin::start`] and mounted by every claim, and the shared GPU
//! directory. A version-1 checkpoint (one file, `checkpoint.json`) left in the run root or,
//! by plugins before the run root, in the state root is migrated on start: its claims become
//! records in the checkpoint directory and the file is removed; claims' directories in the
//! state root stay where they are until unprepared.
//!
//! [`Plugin::unprepare`] removes the claim's record (durably), then its spec and directory;
//! it succeeds for a claim it does not know. [`Plugin::cleanup_stale`] unprepares claims
//! that no longer exist or were replaced (another UID). [`Plugin::start`] discards state of
//! a previous boot, moves a corrupt checkpoint aside and removes files no entry accounts for.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fgpu_api::names::DriverName;
use fgpu_driver::backend::DeviceBackend;
use fgpu_driver::device::NodeInventory;

use crate::checkpoint::{
    CHECKPOINT_DIR, CHECKPOINT_FILE, CheckpointDir, CheckpointError, CheckpointFile, ClaimRecord,
    Durability, LoadNote, PrepareState, PreparedDevice, Records, create_private_dir,
    remove_if_present, valid_uid, write_atomic,
};
use crate::claim::ResourceClaim;
use crate::edits::{self, ClaimPaths, ClaimRef, EditsError, NodeFiles};
use crate::grant::{self, GrantError};
use crate::metrics::{ClaimRead, Metrics, Operation, Phase};

/// The default run root ([`PluginConfig::run_root`]): on a tmpfs on most distributions.
pub const DEFAULT_RUN_DIR: &str = "/run/fgpu";

/// How long prepare waits for the claim by default (the kubelet gives a whole call 45 s).
pub const CLAIM_GET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Where claims come from: the API server in production (through the claim cache, see
/// [`crate::claim_cache`]), a map in tests.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name` as the API server has it now; `Ok(None)` if it does not
    /// exist. The stale-claim cleanup uses this: it must see deletions.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaim>, SourceError>> + Send;

    /// The claim `namespace/name` for a prepare of UID `uid`, and where it came from. A
    /// source may answer from a cache when it holds an allocated claim of that UID (the
    /// kubelet prepares only allocated claims, and an allocation does not change while it is
    /// set); otherwise, and by default, this is [`get`](Self::get).
    fn get_for_prepare(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(Option<ResourceClaim>, ClaimRead), SourceError>> + Send {
        let _ = uid;
        async move { Ok((self.get(namespace, name).await?, ClaimRead::NoCache)) }
    }

    /// Claim `uid` is being unprepared: a cached copy must not be used for it again until
    /// the source knows it is current (it may be deallocated and allocated anew before
    /// the next prepare). A no-op by default.
    fn unprepared(&self, uid: &str) {
        let _ = uid;
    }
}

/// The claim source failed (the API server could not be reached, RBAC, ...).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// A [`ClaimSource`] over an in-memory map, for tests and dry runs.
#[derive(Debug, Default)]
pub struct MapClaimSource {
    claims: Mutex<HashMap<(String, String), ResourceClaim>>,
}

impl MapClaimSource {
    /// Adds or replaces a claim (keyed by its namespace and name).
    pub fn insert(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone(),
            claim.metadata.name.clone(),
        );
        lock(&self.claims).insert(key, claim);
    }

    /// Removes a claim.
    pub fn remove(&self, namespace: &str, name: &str) {
        lock(&self.claims).remove(&(namespace.to_owned(), name.to_owned()));
    }
}

impl ClaimSource for MapClaimSource {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, SourceError> {
        Ok(lock(&self.claims)
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned())
    }
}

impl<T: ClaimSource> ClaimSource for Arc<T> {
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaim>, SourceError>> + Send {
        (**self).get(namespace, name)
    }

    fn get_for_prepare(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(Option<ResourceClaim>, ClaimRead), SourceError>> + Send {
        (**self).get_for_prepare(namespace, name, uid)
    }

    fn unprepared(&self, uid: &str) {
        (**self).unprepared(uid);
    }
}

/// The plugin's fixed settings.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    /// The driver name.
    pub driver: DriverName,
    /// This node's name (= the pool name).
    pub node_name: String,
    /// The plugin's node-wide files, written at start: `ld.so.preload` and `gpus/`
    /// (`/var/lib/fgpu`).
    pub state_root: PathBuf,
    /// The plugin's per-boot files, written by every prepare: `checkpoint/<uid>.json` and
    /// `claims/<uid>/` (`/run/fgpu`, a tmpfs on real nodes: nothing of it outlives the boot,
    /// and a prepare costs no disk I/O there).
    pub run_root: PathBuf,
    /// Where CDI specs go (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Files every claim's containers get.
    pub files: NodeFiles,
    /// This boot's id.
    pub boot_id: String,
    /// How long prepare waits for the claim source ([`CLAIM_GET_TIMEOUT`] in production).
    pub claim_get_timeout: std::time::Duration,
    /// For crash tests only: after a claim's files are written and before it is recorded
    /// `PrepareCompleted`, log `test pause` and wait this long (so that a test can kill the
    /// plugin between the two phases). `None` in production.
    pub test_pause: Option<std::time::Duration>,
}

/// Why a claim could not be prepared or unprepared. Each names the claim.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The kubelet sent an unusable UID.
    #[error("claim {claim}: uid {uid:?} is not a valid UID (letters, digits and '-' only)")]
    BadUid {
        /// `namespace/name`.
        claim: String,
        /// The UID sent.
        uid: String,
    },
    /// The claim does not exist (any more).
    #[error("claim {claim}: not found in the API server")]
    NotFound {
        /// `namespace/name`.
        claim: String,
    },
    /// The claim was replaced by another of the same name.
    #[error(
        "claim {claim}: metadata.uid is {found}, the kubelet asked for {expected}; the claim was deleted and recreated"
    )]
    UidMismatch {
        /// `namespace/name`.
        claim: String,
        /// UID the kubelet asked for.
        expected: String,
        /// UID found.
        found: String,
    },
    /// Reading the claim failed.
    #[error("claim {claim}: cannot read it: {source}")]
    Source {
        /// `namespace/name`.
        claim: String,
        /// The cause.
        #[source]
        source: SourceError,
    },
    /// The allocation is unusable.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The devices or the spec are unusable.
    #[error(transparent)]
    Edits(#[from] EditsError),
    /// The GPUs could not be listed.
    #[error("claim {claim}: cannot list this node's GPUs: {detail}")]
    Backend {
        /// `namespace/name`.
        claim: String,
        /// The backend's error.
        detail: String,
    },
    /// A file operation failed.
    #[error("claim {claim}: cannot {op} {}: {source}", path.display())]
    Io {
        /// `namespace/name`.
        claim: String,
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The checkpoint could not be written.
    #[error("claim {claim}: {source}")]
    Checkpoint {
        /// `namespace/name`.
        claim: String,
        /// The cause.
        #[source]
        source: CheckpointError,
    },
}

impl PrepareError {
    /// A short, stable reason for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadUid { .. } => "bad_uid",
            Self::NotFound { .. } => "not_found",
            Self::UidMismatch { .. } => "uid_mismatch",
            Self::Source { .. } => "api",
            Self::Grant(GrantError::NotAllocated { .. }) => "not_allocated",
            Self::Grant(GrantError::NoDevicesOfDriver { .. }) => "other_driver",
            Self::Grant(GrantError::Invalid { .. }) => "invalid_allocation",
            Self::Edits(EditsError::UnknownDevice { .. }) => "unknown_device",
            Self::Edits(_) => "invalid_allocation",
            Self::Backend { .. } => "backend",
            // A bug, not the disk: the state machine refused the change.
            Self::Checkpoint {
                source: CheckpointError::Refused { .. },
                ..
            } => "invalid_transition",
            Self::Io { .. } | Self::Checkpoint { .. } => "io",
        }
    }
}

/// What [`Plugin::start`] found and did, for logs and Events.
#[derive(Debug, Default)]
pub struct StartReport {
    /// What loading the checkpoint found: missing; corrupt (one note per file moved aside);
    /// records of another boot.
    pub notes: Vec<LoadNote>,
    /// A version-1 checkpoint (one file) was read from here, its claims written to the
    /// checkpoint directory, and the file removed.
    pub migrated_from: Option<PathBuf>,
    /// Files removed that no checkpoint entry accounted for.
    pub removed_orphans: Vec<PathBuf>,
    /// Problems while removing leftovers (the plugin still starts).
    pub errors: Vec<String>,
}

/// What [`Plugin::cleanup_stale`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Claims unprepared, `namespace/name (uid)`.
    pub removed: Vec<String>,
    /// Claims that could not be checked or removed, with the reason.
    pub errors: Vec<String>,
}

/// The node plugin's prepare/unprepare state.
pub struct Plugin<S> {
    cfg: PluginConfig,
    source: S,
    backend: Arc<dyn DeviceBackend>,
    records: Arc<Records>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    metrics: Metrics,
    /// The node's GPUs as last read from the backend. What a prepare needs of them (device
    /// name, UUID, PCI bus, memory) does not change while the node is up, so prepares reuse
    /// it (NVML is not asked on every prepare) and read the backend again only for a device
    /// it does not list; [`Plugin::set_inventory`] refreshes it.
    inventory: Mutex<Option<Arc<NodeInventory>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these locks stays consistent between statements; a panic elsewhere
    // must not take the plugin down.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The node's shared GPU directory, exactly [`crate::edits::GPU_DIR_MODE`] whatever the
/// umask or an earlier run left.
fn create_shared_dir(path: &Path) -> io::Result<()> {
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(
        path,
        std::fs::Permissions::from_mode(crate::edits::GPU_DIR_MODE),
    )
}

/// The version-1 checkpoints (one file each) that older plugins may have left: in the state
/// directory (plugins before the run directory), and in the run directory (last: it wins a
/// tie of modification times).
fn version1_checkpoints(cfg: &PluginConfig) -> Vec<CheckpointFile> {
    let mut v = Vec::new();
    if cfg.state_root != cfg.run_root {
        v.push(CheckpointFile::new(cfg.state_root.join(CHECKPOINT_FILE)));
    }
    v.push(CheckpointFile::new(cfg.run_root.join(CHECKPOINT_FILE)));
    v
}

impl<S: ClaimSource> Plugin<S> {
    /// Opens the plugin's state: creates its directories, loads the checkpoint (a corrupt
    /// one is moved aside, one from another boot discarded), removes files of discarded
    /// claims and files that no entry accounts for. Fails only if the directories or the
    /// checkpoint cannot be created or written at all.
    pub fn start(
        cfg: PluginConfig,
        source: S,
        backend: Arc<dyn DeviceBackend>,
    ) -> Result<(Self, StartReport), CheckpointError> {
        let io = |path: &Path, op, source| CheckpointError::Io {
            path: path.to_owned(),
            op,
            source,
        };
        create_private_dir(&cfg.state_root)
            .map_err(|e| io(&cfg.state_root, "create the state directory", e))?;
        create_private_dir(&cfg.run_root)
            .map_err(|e| io(&cfg.run_root, "create the run directory", e))?;
        std::fs::create_dir_all(&cfg.cdi_dir)
            .map_err(|e| io(&cfg.cdi_dir, "create the CDI directory", e))?;
        let gpu_dir = crate::edits::gpu_dir(&cfg.state_root);
        create_shared_dir(&gpu_dir)
            .map_err(|e| io(&gpu_dir, "create the shared GPU directory", e))?;
        let preload = cfg.state_root.join("ld.so.preload");
        write_atomic(
            &preload,
            crate::edits::preload_content().as_bytes(),
            0o444,
            Durability::Atomic,
        )
        .map_err(|(op, source)| io(&preload, op, source))?;
        let dir = CheckpointDir::new(cfg.run_root.join(CHECKPOINT_DIR));
        // A version-1 checkpoint (one file) exists only where an older plugin wrote it: this
        // build removes it once migrated. So where there is one, an older plugin ran last (it
        // ignored the checkpoint directory, and its own start removed the files of claims it
        // did not know), or this build's migration was interrupted: either way the file is
        // the state. Where there are two (the run and the state directory), the newer one.
        // Its claims are written to the directory (fsynced; records no longer in it removed)
        // before the file is removed, so an interrupted migration is simply done again.
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let version1 = version1_checkpoints(&cfg);
        let migrated_from = version1
            .iter()
            .filter_map(|f| Some((modified(f.path())?, f.path())))
            .max_by_key(|(m, _)| *m)
            .map(|(_, p)| p.to_owned());
        let (claims, notes) = match &migrated_from {
            Some(path) => {
                let (mut checkpoint, note) = CheckpointFile::new(path).load(&cfg.boot_id)?;
                // No prepare ever accepted a UID that cannot name a file.
                checkpoint.claims.retain(|uid, _| valid_uid(uid));
                dir.replace_all(&cfg.boot_id, &checkpoint.claims)?;
                for f in &version1 {
                    f.remove()?;
                }
                (checkpoint.claims, note.into_iter().collect())
            }
            None => {
                let loaded = dir.load(&cfg.boot_id)?;
                (loaded.claims, loaded.notes)
            }
        };
        let metrics = Metrics::new();
        metrics.set_claims(&claims);
        let plugin = Self {
            records: Arc::new(Records::new(dir, cfg.boot_id.clone(), claims)),
            cfg,
            source,
            backend,
            locks: Mutex::new(HashMap::new()),
            metrics,
            inventory: Mutex::new(None),
        };
        let mut report = StartReport {
            notes,
            migrated_from,
            ..StartReport::default()
        };
        plugin.remove_orphans(&mut report);
        Ok((plugin, report))
    }

    /// The settings.
    pub fn config(&self) -> &PluginConfig {
        &self.cfg
    }

    /// The plugin's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Replaces the GPUs that prepares use (the caller read them from the backend, e.g.
    /// to publish the ResourceSlice).
    pub fn set_inventory(&self, inventory: NodeInventory) {
        *lock(&self.inventory) = Some(Arc::new(inventory));
    }

    /// The node's GPUs: the last reading unless `fresh`, else the backend's now; says
    /// whether it was the last reading.
    fn inventory(
        &self,
        claim: &ClaimRef,
        fresh: bool,
    ) -> Result<(Arc<NodeInventory>, bool), PrepareError> {
        if !fresh && let Some(inv) = lock(&self.inventory).clone() {
            return Ok((inv, true));
        }
        let inv =
            self.backend
                .inventory(&self.cfg.node_name)
                .map_err(|e| PrepareError::Backend {
                    claim: claim.key(),
                    detail: e.to_string(),
                })?;
        let inv = Arc::new(inv);
        *lock(&self.inventory) = Some(inv.clone());
        Ok((inv, false))
    }

    /// A copy of the checkpoint's claims.
    pub fn claims(&self) -> std::collections::BTreeMap<String, ClaimRecord> {
        self.records.claims()
    }

    fn paths(&self, uid: &str) -> ClaimPaths {
        ClaimPaths::new(
            &self.cfg.state_root,
            &self.cfg.run_root,
            &self.cfg.cdi_dir,
            &self.cfg.driver,
            uid,
        )
    }

    /// The directories that hold claims' directories: the run root's, and the state root's
    /// where claims prepared before the run root existed may still be.
    fn claims_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![edits::claims_dir(&self.cfg.run_root)];
        if self.cfg.state_root != self.cfg.run_root {
            dirs.push(edits::claims_dir(&self.cfg.state_root));
        }
        dirs
    }

    /// Everything of claim `uid` to remove on unprepare: its CDI spec, its directory, and
    /// its directory under the state root (claims prepared before the run root existed).
    /// Derived from the UID, never taken from the checkpoint, so that a damaged checkpoint
    /// cannot point the removal elsewhere.
    fn removable(&self, uid: &str) -> Vec<(PathBuf, bool)> {
        let paths = self.paths(uid);
        let mut v = vec![(paths.spec_file, false)];
        v.extend(self.claims_dirs().into_iter().map(|d| (d.join(uid), true)));
        v
    }

    /// Removes claim directories and this driver's CDI specs that no entry accounts for
    /// (left by a crash before the entry was written, or by a previous boot).
    fn remove_orphans(&self, report: &mut StartReport) {
        let known = self.claims();
        let spec_prefix = self.cfg.driver.cdi_spec_file_name("");
        let spec_prefix = spec_prefix.trim_end_matches(".json");
        let mut candidates = Vec::new();
        for claims_dir in self.claims_dirs() {
            if let Ok(entries) = std::fs::read_dir(&claims_dir) {
                for e in entries.flatten() {
                    let uid = e.file_name().to_string_lossy().into_owned();
                    if !known.contains_key(&uid) {
                        candidates.push((e.path(), true));
                    }
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.cfg.cdi_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // A temporary file of an interrupted write (`.<spec>.tmp`) is always a leftover.
                let interrupted = name
                    .strip_prefix('.')
                    .is_some_and(|n| n.starts_with(spec_prefix) && n.ends_with(".json.tmp"));
                let uid = name
                    .strip_prefix(spec_prefix)
                    .and_then(|r| r.strip_suffix(".json"));
                if interrupted || uid.is_some_and(|uid| !known.contains_key(uid)) {
                    candidates.push((e.path(), false));
                }
            }
        }
        for (path, dir) in candidates {
            match remove_if_present(&path, dir) {
                Ok(true) => report.removed_orphans.push(path),
                Ok(false) => {}
                Err(e) => report
                    .errors
                    .push(format!("cannot remove {}: {e}", path.display())),
            }
        }
    }

    fn claim_lock(&self, uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks).entry(uid.to_owned()).or_default().clone()
    }

    fn release_lock(&self, uid: &str, l: Arc<tokio::sync::Mutex<()>>) {
        let mut locks = lock(&self.locks);
        // Ours plus the map's: nobody else waits for this claim, and no task of an earlier
        // operation still holds it.
        if Arc::strong_count(&l) == 2 {
            locks.remove(uid);
        }
    }

    /// Recomputes the claim gauges from the records.
    fn refresh_claim_metrics(&self) {
        self.records.read(|claims| self.metrics.set_claims(claims));
    }

    /// Prepares `claim` and returns its devices (see the module documentation).
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        self.guarded(Operation::Prepare, claim, |guard| {
            self.prepare_locked(claim, guard)
        })
        .await
    }

    async fn prepare_locked(
        &self,
        claim: &ClaimRef,
        guard: ClaimGuard,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let done = self.records.read(|claims| {
            claims
                .get(&claim.uid)
                .filter(|rec| rec.state == PrepareState::PrepareCompleted)
                .map(|rec| rec.devices.clone())
        });
        if let Some(devices) = done {
            return Ok(devices);
        }
        let mut clock = PhaseClock::new(&self.metrics);
        let get = self
            .source
            .get_for_prepare(&claim.namespace, &claim.name, &claim.uid);
        let limit = self.cfg.claim_get_timeout;
        let (object, read) = tokio::time::timeout(limit, get)
            .await
            .unwrap_or_else(|_| Err(SourceError(format!("no answer within {limit:?}"))))
            .map_err(|source| PrepareError::Source {
                claim: claim.key(),
                source,
            })?;
        self.metrics.observe_claim_read(read);
        let object = object.ok_or_else(|| PrepareError::NotFound { claim: claim.key() })?;
        clock.lap(Phase::ClaimGet);
        if object.metadata.uid != claim.uid {
            return Err(PrepareError::UidMismatch {
                claim: claim.key(),
                expected: claim.uid.clone(),
                found: object.metadata.uid,
            });
        }
        let resolved = grant::resolve(&object, self.cfg.driver.as_str())?;
        let (inventory, cached) = self.inventory(claim, false)?;
        let planned = match edits::plan(claim, &resolved, &inventory) {
            // A device the last reading did not list: read the backend again.
            Err(EditsError::UnknownDevice { .. }) if cached => {
                edits::plan(claim, &resolved, &self.inventory(claim, true)?.0)?
            }
            r => r?,
        };
        let paths = self.paths(&claim.uid);
        let built = edits::build(&self.cfg.driver, claim, &planned, &self.cfg.files, &paths)?;
        let spec_json = built.spec.to_json().map_err(|source| EditsError::Cdi {
            claim: claim.key(),
            source,
        })?;

        clock.lap(Phase::Build);
        let started = ClaimRecord {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: PrepareState::PrepareStarted,
            spec_file: paths.spec_file.clone(),
            claim_dir: paths.claim_dir.clone(),
            devices: built.devices.clone(),
        };
        // The side effects and both records: one task on the blocking pool (a slow disk must
        // not stall other claims' gRPC), which holds the claim's lock until it ends.
        let work = PrepareWork {
            records: self.records.clone(),
            uid: claim.uid.clone(),
            started,
            files: ClaimFiles {
                claim: claim.key(),
                paths: paths.clone(),
                limits: built.limits.clone(),
                spec: spec_json,
            },
            test_pause: self.cfg.test_pause,
        };
        let laps = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            work.run()
        })
        .await
        .map_err(|e| PrepareError::Io {
            claim: claim.key(),
            op: "write the claim's files",
            path: paths.claim_dir.clone(),
            source: io::Error::other(e),
        })?;
        // The gauges follow the records even when a step failed (`PrepareStarted` may be on
        // record).
        self.refresh_claim_metrics();
        let laps = laps?;
        // RecordStarted includes the wait for a blocking thread.
        clock.lap_at(Phase::RecordStarted, laps.started);
        clock.lap_at(Phase::Files, laps.files);
        clock.lap(Phase::RecordCompleted);
        Ok(built.devices)
    }

    /// Undoes [`prepare`](Self::prepare): removes the CDI spec, the claim directory and the
    /// checkpoint entry. Succeeds for a claim that is not (or no longer) prepared.
    pub async fn unprepare(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        self.guarded(Operation::Unprepare, claim, |guard| {
            self.unprepare_locked(claim, guard)
        })
        .await
    }

    /// Runs `work` for `claim` as one operation: refuses a malformed UID, takes the claim's
    /// lock and hands it to `work` (other claims proceed in parallel; `work` passes it on to
    /// its blocking task, so that the lock is held until that task ends even if this future
    /// is dropped), and records the outcome and duration in the metrics.
    async fn guarded<T, F, Fut>(
        &self,
        op: Operation,
        claim: &ClaimRef,
        work: F,
    ) -> Result<T, PrepareError>
    where
        F: FnOnce(ClaimGuard) -> Fut,
        Fut: Future<Output = Result<T, PrepareError>>,
    {
        if !valid_uid(&claim.uid) {
            self.metrics
                .observe(op, Some("bad_uid"), Default::default());
            return Err(PrepareError::BadUid {
                claim: claim.key(),
                uid: claim.uid.clone(),
            });
        }
        let started = std::time::Instant::now();
        let l = self.claim_lock(&claim.uid);
        let guard = l.clone().lock_owned().await;
        let result = work(guard).await;
        self.release_lock(&claim.uid, l);
        let reason = result.as_ref().err().map(PrepareError::reason);
        self.metrics.observe(op, reason, started.elapsed());
        result
    }

    async fn unprepare_locked(
        &self,
        claim: &ClaimRef,
        guard: ClaimGuard,
    ) -> Result<(), PrepareError> {
        // Before anything else (and under the claim's lock): whatever happens below, the
        // next prepare of this UID must not trust a cached allocation.
        self.source.unprepared(&claim.uid);
        let paths = self.removable(&claim.uid);
        let key = claim.key();
        let records = self.records.clone();
        let uid = claim.uid.clone();
        // The record first (durably), then the files: a crash in between leaves files no
        // record accounts for, which the start-up sweep removes (and the kubelet's retry of
        // the unprepare too). The other order would leave a `PrepareCompleted` record whose
        // CDI spec is gone, which a later prepare of the claim would return as prepared.
        let removed = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            records
                .remove(&uid)
                .map_err(|source| PrepareError::Checkpoint {
                    claim: key.clone(),
                    source,
                })?;
            remove_claim_files(&key, &paths)
        })
        .await
        .map_err(|e| PrepareError::Io {
            claim: claim.key(),
            op: "remove the claim's files",
            path: self.paths(&claim.uid).claim_dir,
            source: io::Error::other(e),
        })?;
        self.refresh_claim_metrics();
        removed.map(|_| ())
    }

    /// Unprepares every recorded claim that no longer exists or now has another UID.
    /// Claims that cannot be read are left alone and reported.
    pub async fn cleanup_stale(&self) -> CleanupReport {
        let mut report = CleanupReport::default();
        for (uid, rec) in self.claims() {
            let claim = ClaimRef {
                namespace: rec.namespace,
                name: rec.name,
                uid,
            };
            let stale = match self.source.get(&claim.namespace, &claim.name).await {
                Ok(None) => true,
                Ok(Some(c)) => c.metadata.uid != claim.uid,
                Err(e) => {
                    report
                        .errors
                        .push(format!("claim {}: cannot read it: {e}", claim.key()));
                    continue;
                }
            };
            if stale {
                match self.unprepare(&claim).await {
                    Ok(()) => report
                        .removed
                        .push(format!("{} ({})", claim.key(), claim.uid)),
                    Err(e) => report.errors.push(e.to_string()),
                }
            }
        }
        report
    }
}

/// Times the steps of one prepare into the phase histogram.
struct PhaseClock<'a> {
    metrics: &'a Metrics,
    last: std::time::Instant,
}

impl<'a> PhaseClock<'a> {
    fn new(metrics: &'a Metrics) -> Self {
        Self {
            metrics,
            last: std::time::Instant::now(),
        }
    }

    /// Records the time since the previous lap as `phase`.
    fn lap(&mut self, phase: Phase) {
        self.lap_at(phase, std::time::Instant::now());
    }

    /// Records the time from the previous lap to `at` as `phase`.
    fn lap_at(&mut self, phase: Phase, at: std::time::Instant) {
        self.metrics
            .observe_phase(phase, at.saturating_duration_since(self.last));
        self.last = at;
    }
}

/// A claim's lock, held by the operation (and its blocking task) that took it.
type ClaimGuard = tokio::sync::OwnedMutexGuard<()>;

/// The side effects of one prepare with its two records, run on the blocking pool.
struct PrepareWork {
    records: Arc<Records>,
    uid: String,
    started: ClaimRecord,
    files: ClaimFiles,
    test_pause: Option<std::time::Duration>,
}

/// When the steps of a [`PrepareWork`] ended.
struct Laps {
    started: std::time::Instant,
    files: std::time::Instant,
}

impl PrepareWork {
    /// Records `PrepareStarted` (atomically), writes the claim's files, records
    /// `PrepareCompleted` (durably). Stops at the first step that fails: a record of
    /// `PrepareStarted` that stays behind makes a repeated prepare redo the files and an
    /// unprepare remove them.
    fn run(self) -> Result<Laps, PrepareError> {
        let Self {
            records,
            uid,
            started,
            files,
            test_pause,
        } = self;
        let claim = files.claim.clone();
        let checkpoint = |source| PrepareError::Checkpoint {
            claim: claim.clone(),
            source,
        };
        // PrepareStarted is read only by a restart of the plugin in this boot, which sees the
        // file without an fsync (the kernel keeps it); after a reboot the boot id discards
        // every record. So it is written atomically but not durably: one fsync per prepare.
        records
            .put(&uid, started.clone(), Durability::Atomic)
            .map_err(checkpoint)?;
        let started_at = std::time::Instant::now();
        files.write()?;
        let files_at = std::time::Instant::now();
        if let Some(pause) = test_pause {
            tracing::warn!(%claim, %uid, ?pause,
                "test pause: claim files written, PrepareCompleted not yet recorded");
            std::thread::sleep(pause);
        }
        let completed = ClaimRecord {
            state: PrepareState::PrepareCompleted,
            ..started
        };
        records
            .put(&uid, completed, Durability::Fsync)
            .map_err(checkpoint)?;
        Ok(Laps {
            started: started_at,
            files: files_at,
        })
    }
}

/// A claim's files, written on the blocking pool.
struct ClaimFiles {
    claim: String,
    paths: ClaimPaths,
    limits: String,
    spec: String,
}

impl ClaimFiles {
    /// Creates the claim and state directories (0700) and writes the limits file (0444) and
    /// the CDI spec (0644), each atomically (see [`Durability::Atomic`]
    /// for why not durably: a reboot discards them all).
    fn write(self) -> Result<(), PrepareError> {
        let Self {
            claim,
            paths,
            limits,
            spec,
        } = self;
        let io = |op, path: &Path| {
            let claim = claim.clone();
            let path = path.to_owned();
            move |source| PrepareError::Io {
                claim,
                op,
                path,
                source,
            }
        };
        create_private_dir(&paths.claim_dir).map_err(io("create", &paths.claim_dir))?;
        create_private_dir(&paths.state_dir).map_err(io("create", &paths.state_dir))?;
        for (path, bytes, mode) in [
            (&paths.limits_file, limits.as_bytes(), 0o444),
            (&paths.spec_file, spec.as_bytes(), 0o644),
        ] {
            write_atomic(path, bytes, mode, Durability::Atomic).map_err(|(op, source)| {
                PrepareError::Io {
                    claim: claim.clone(),
                    op,
                    path: path.to_owned(),
                    source,
                }
            })?;
        }
        Ok(())
    }
}

/// Removes a claim's files and directories, `(path, is a directory)` (absent ones are fine).
fn remove_claim_files(claim: &str, paths: &[(PathBuf, bool)]) -> Result<(), PrepareError> {
    for (path, dir) in paths {
        remove_if_present(path, *dir).map_err(|source| PrepareError::Io {
            claim: claim.to_owned(),
            op: "remove",
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::tests::gpu;
    use crate::edits::{FileMount, NodeFiles};
    use fgpu_driver::backend::BackendError;
    use fgpu_driver::device::Gpu;
    use serde_json::json;

    struct StaticBackend(Mutex<Vec<Gpu>>);

    impl DeviceBackend for StaticBackend {
        fn name(&self) -> &'static str {
            "static"
        }
        fn enumerate(&self) -> Result<Vec<Gpu>, BackendError> {
            Ok(lock(&self.0).clone())
        }
    }

    struct Env {
        dir: tempfile::TempDir,
        source: Arc<MapClaimSource>,
        backend: Arc<StaticBackend>,
    }

    impl Env {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().unwrap(),
                source: Arc::default(),
                backend: Arc::new(StaticBackend(Mutex::new(vec![
                    gpu(0, "0000:1b:00.0"),
                    gpu(1, "0000:2b:00.0"),
                ]))),
            }
        }
        fn cfg(&self, boot: &str) -> PluginConfig {
            PluginConfig {
                driver: DriverName::default(),
                node_name: "n1".into(),
                state_root: self.dir.path().join("state"),
                run_root: self.dir.path().join("run"),
                cdi_dir: self.dir.path().join("cdi"),
                files: NodeFiles {
                    shim_library: "/opt/fgpu/libfgpu.so".into(),
                    driver_mounts: vec![FileMount::same("/usr/lib/libcuda.so.1")],
                    driver_hooks: vec![],
                },
                boot_id: boot.into(),
                claim_get_timeout: CLAIM_GET_TIMEOUT,
                test_pause: None,
            }
        }
        fn start(&self, boot: &str) -> (Plugin<Arc<MapClaimSource>>, StartReport) {
            Plugin::start(self.cfg(boot), self.source.clone(), self.backend.clone()).unwrap()
        }
        fn spec_path(&self, uid: &str) -> PathBuf {
            self.dir
                .path()
                .join("cdi")
                .join(format!("gpu.fgpu.dev-claim_{uid}.json"))
        }
        fn claim_dir(&self, uid: &str) -> PathBuf {
            self.dir.path().join("run/claims").join(uid)
        }
        fn record_path(&self, uid: &str) -> PathBuf {
            self.dir
                .path()
                .join("run/checkpoint")
                .join(format!("{uid}.json"))
        }
        fn add(&self, name: &str, uid: &str, device: &str) -> ClaimRef {
            self.source.insert(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "ns", "uid": uid},
                    "status": {"allocation": {"devices": {"results": [{
                        "request": "gpu", "driver": "gpu.fgpu.dev", "pool": "n1",
                        "device": device, "shareID": "s1",
                        "consumedCapacity": {"memory": "10Gi", "cores": "30"}}]}}}
                }))
                .unwrap(),
            );
            ClaimRef {
                namespace: "ns".into(),
                name: name.into(),
                uid: uid.into(),
            }
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[tokio::test]
    async fn prepare_is_idempotent_and_unprepare_removes_everything() {
        let env = Env::new();
        let (plugin, report) = env.start("b1");
        assert_eq!(report.notes, [LoadNote::Missing]);
        // The node's shared GPU directory: world-writable with the sticky bit.
        let gpus = env.dir.path().join("state/gpus");
        assert_eq!(mode(&gpus), 0o1777);
        let c = env.add("c", "uid-1", "gpu-1");
        let devices = plugin.prepare(&c).await.unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(
            devices[0].cdi_device_ids,
            ["gpu.fgpu.dev/claim=uid-1-gpu-1-s1"]
        );
        assert_eq!(devices[0].memory_bytes, 10 << 30);

        let dir = env.claim_dir("uid-1");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("state")), 0o700);
        assert_eq!(mode(&dir.join("limits")), 0o444);
        let preload = env.dir.path().join("state/ld.so.preload");
        assert_eq!(mode(&preload), 0o444);
        assert_eq!(
            std::fs::read_to_string(&preload).unwrap(),
            "/usr/lib/fgpu/libfgpu.so\n"
        );
        assert_eq!(mode(&env.spec_path("uid-1")), 0o644);
        let limits = std::fs::read_to_string(dir.join("limits")).unwrap();
        assert!(
            limits.contains("FGPU_MEMORY_LIMIT_0=10737418240\n"),
            "{limits}"
        );
        let spec = std::fs::read_to_string(env.spec_path("uid-1")).unwrap();
        let spec = fgpu_driver::cdi::CdiSpec::from_json(&spec).unwrap();
        assert_eq!(spec.qualified_names(), devices[0].cdi_device_ids);
        assert_eq!(
            plugin.claims()["uid-1"].state,
            PrepareState::PrepareCompleted
        );
        // The claim's record: its own file in the checkpoint directory.
        let record = env.record_path("uid-1");
        assert_eq!(mode(&record), 0o600);
        assert_eq!(mode(record.parent().unwrap()), 0o700);
        let on_disk: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        assert_eq!(on_disk["claim"]["state"], "PrepareCompleted");
        assert_eq!(on_disk["bootId"], "b1");

        let metrics = plugin.metrics().encode();
        for phase in [
            "ClaimGet",
            "Build",
            "RecordStarted",
            "Files",
            "RecordCompleted",
        ] {
            let count = format!(
                "fgpu_kubelet_plugin_prepare_phase_duration_seconds_count{{phase=\"{phase}\"}} 1\n"
            );
            assert!(metrics.contains(&count), "{count} in {metrics}");
        }

        // Repeated prepare answers from the checkpoint, even with the claim gone.
        env.source.remove("ns", "c");
        assert_eq!(plugin.prepare(&c).await.unwrap(), devices);

        plugin.unprepare(&c).await.unwrap();
        assert!(!dir.exists());
        assert!(!env.spec_path("uid-1").exists());
        assert!(!record.exists());
        assert!(plugin.claims().is_empty());
        plugin.unprepare(&c).await.unwrap();
        // A restart sees no claim.
        drop(plugin);
        assert!(env.start("b1").0.claims().is_empty());
    }

    #[tokio::test]
    async fn bad_claims_fail_without_side_effects() {
        let env = Env::new();
        let (plugin, _) = env.start("b1");
        let mut gone = env.add("gone", "uid-g", "gpu-0");
        env.source.remove("ns", "gone");
        let replaced = ClaimRef {
            uid: "uid-old".into(),
            ..env.add("r", "uid-new", "gpu-0")
        };
        let vanished = env.add("v", "uid-v", "gpu-9");
        let cases: Vec<(ClaimRef, &str, &str)> = vec![
            (gone.clone(), "not_found", "claim ns/gone: not found"),
            (
                replaced,
                "uid_mismatch",
                "claim ns/r: metadata.uid is uid-new, the kubelet asked for uid-old",
            ),
            (
                vanished,
                "unknown_device",
                "claim ns/v: status.allocation.devices.results[0].device: \"gpu-9\"",
            ),
        ];
        for (c, reason, msg) in cases {
            let e = plugin.prepare(&c).await.unwrap_err();
            assert_eq!(e.reason(), reason, "{e}");
            assert!(e.to_string().starts_with(msg), "{e}");
            assert!(!env.claim_dir(&c.uid).exists());
            assert!(!env.spec_path(&c.uid).exists());
        }
        gone.uid = "../../etc".into();
        assert_eq!(plugin.prepare(&gone).await.unwrap_err().reason(), "bad_uid");
        assert_eq!(
            plugin.unprepare(&gone).await.unwrap_err().reason(),
            "bad_uid"
        );
        assert!(plugin.claims().is_empty());
        // The plugin still works.
        plugin
            .prepare(&env.add("ok", "uid-ok", "gpu-0"))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn restart_keeps_state_and_reboot_discards_it() {
        let env = Env::new();
        let c = env.add("c", "uid-1", "gpu-0");
        let devices = {
            let (plugin, _) = env.start("b1");
            plugin.prepare(&c).await.unwrap()
        };
        {
            let (plugin, report) = env.start("b1");
            assert_eq!(report.notes, []);
            assert!(report.removed_orphans.is_empty());
            env.source.remove("ns", "c");
            assert_eq!(plugin.prepare(&c).await.unwrap(), devices);
        }
        let (plugin, report) = env.start("b2");
        match &report.notes[..] {
            [
                LoadNote::BootChanged {
                    previous,
                    discarded,
                },
            ] => {
                assert_eq!(previous, "b1");
                assert!(discarded.contains_key("uid-1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(plugin.claims().is_empty());
        assert!(!env.claim_dir("uid-1").exists());
        assert!(!env.spec_path("uid-1").exists());
        assert!(!env.record_path("uid-1").exists());
        assert_eq!(report.removed_orphans.len(), 2);
    }

    #[tokio::test]
    async fn interrupted_prepare_is_redone_and_a_corrupt_record_loses_only_its_claim() {
        let env = Env::new();
        let c = env.add("c", "uid-1", "gpu-0");
        let other = env.add("other", "uid-2", "gpu-1");
        {
            let (plugin, _) = env.start("b1");
            plugin.prepare(&other).await.unwrap();
            // Simulate a crash after PrepareStarted and the directory, before the spec.
            plugin
                .records
                .put(
                    "uid-1",
                    ClaimRecord {
                        namespace: "ns".into(),
                        name: "c".into(),
                        ..ClaimRecord::default()
                    },
                    Durability::Atomic,
                )
                .unwrap();
            create_private_dir(&env.claim_dir("uid-1")).unwrap();
        }
        let tmp = env
            .dir
            .path()
            .join("cdi/.gpu.fgpu.dev-claim_uid-1.json.tmp");
        std::fs::write(&tmp, b"{").unwrap();
        let (plugin, report) = env.start("b1");
        // The entry accounts for the claim directory; the interrupted write is a leftover.
        assert_eq!(report.removed_orphans, [tmp]);
        assert_eq!(plugin.claims()["uid-1"].state, PrepareState::PrepareStarted);
        let devices = plugin.prepare(&c).await.unwrap();
        assert_eq!(devices[0].device_name, "gpu-0");
        assert!(env.spec_path("uid-1").exists());
        drop(plugin);

        std::fs::write(env.record_path("uid-1"), b"not json").unwrap();
        let (plugin, report) = env.start("b1");
        let [LoadNote::Corrupt { moved_to, .. }] = &report.notes[..] else {
            panic!("{:?}", report.notes)
        };
        assert_eq!(
            *moved_to,
            env.dir.path().join("run/checkpoint/uid-1.json.corrupt-1")
        );
        // Files of the lost entry are orphans now and removed; the other claim is untouched.
        assert!(!env.spec_path("uid-1").exists());
        assert!(!env.claim_dir("uid-1").exists());
        assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-2"]);
        assert!(env.spec_path("uid-2").exists());
        plugin.prepare(&c).await.unwrap();
    }

    /// The record of one claim in a version-1 checkpoint (one file), exactly as plugins
    /// before the checkpoint directory wrote it, made from this build's record of `uid`.
    fn version1_checkpoint(env: &Env, boot: &str, uids: &[&str]) -> String {
        let claims: serde_json::Map<String, serde_json::Value> = uids
            .iter()
            .map(|uid| {
                let rec: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(env.record_path(uid)).unwrap()).unwrap();
                ((*uid).to_owned(), rec["claim"].clone())
            })
            .collect();
        serde_json::to_string(&json!({"version": 1, "bootId": boot, "claims": claims})).unwrap()
    }

    #[tokio::test]
    async fn an_upgrade_from_the_single_file_checkpoint_keeps_prepared_claims() {
        let env = Env::new();
        let c1 = env.add("c1", "uid-1", "gpu-0");
        let c2 = env.add("c2", "uid-2", "gpu-1");
        let run = env.dir.path().join("run");
        let (devices1, devices2) = {
            let (plugin, _) = env.start("b1");
            (
                plugin.prepare(&c1).await.unwrap(),
                plugin.prepare(&c2).await.unwrap(),
            )
        };
        // What an older plugin leaves: its claims' files and one checkpoint.json, no
        // checkpoint directory.
        let v1 = version1_checkpoint(&env, "b1", &["uid-1", "uid-2"]);
        assert!(v1.contains(r#""state":"PrepareCompleted""#), "{v1}");
        std::fs::remove_dir_all(run.join(CHECKPOINT_DIR)).unwrap();
        std::fs::write(run.join(CHECKPOINT_FILE), &v1).unwrap();

        let (plugin, report) = env.start("b1");
        assert_eq!(report.notes, []);
        assert_eq!(report.migrated_from, Some(run.join(CHECKPOINT_FILE)));
        assert!(
            report.removed_orphans.is_empty(),
            "{:?}",
            report.removed_orphans
        );
        assert!(
            !run.join(CHECKPOINT_FILE).exists(),
            "migrated, then removed"
        );
        assert!(env.record_path("uid-1").exists() && env.record_path("uid-2").exists());
        // Still prepared: the same CDI ids without reading the claims again.
        env.source.remove("ns", "c1");
        env.source.remove("ns", "c2");
        assert_eq!(plugin.prepare(&c1).await.unwrap(), devices1);
        assert_eq!(plugin.prepare(&c2).await.unwrap(), devices2);
        let metrics = plugin.metrics().encode();
        assert!(
            metrics.contains("fgpu_kubelet_plugin_prepared_claims 2\n"),
            "{metrics}"
        );
        plugin.unprepare(&c1).await.unwrap();
        assert!(!env.spec_path("uid-1").exists() && !env.claim_dir("uid-1").exists());
        drop(plugin);
        let (plugin, report) = env.start("b1");
        assert_eq!(report.migrated_from, None);
        assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-2"]);
        drop(plugin);

        // A migration interrupted after some records were written (and with a record the
        // file does not have): the file is the state and the migration is done again.
        std::fs::write(run.join(CHECKPOINT_FILE), &v1).unwrap();
        std::fs::remove_file(env.record_path("uid-2")).unwrap();
        std::fs::write(
            env.record_path("uid-stale"),
            br#"{"version": 2, "bootId": "b1", "uid": "uid-stale", "claim": {}}"#,
        )
        .unwrap();
        let (plugin, report) = env.start("b1");
        assert_eq!(report.migrated_from, Some(run.join(CHECKPOINT_FILE)));
        assert_eq!(
            plugin.claims().keys().collect::<Vec<_>>(),
            ["uid-1", "uid-2"]
        );
        assert!(!env.record_path("uid-stale").exists());
        drop(plugin);

        // A version-1 checkpoint of another boot: discarded like records of another boot.
        std::fs::write(run.join(CHECKPOINT_FILE), v1.replace("\"b1\"", "\"b0\"")).unwrap();
        let (plugin, report) = env.start("b1");
        assert!(
            matches!(&report.notes[..], [LoadNote::BootChanged { previous, .. }] if previous == "b0"),
            "{:?}",
            report.notes
        );
        assert!(plugin.claims().is_empty());
        assert!(!env.record_path("uid-1").exists());
        assert!(
            !env.spec_path("uid-2").exists(),
            "files of discarded claims removed"
        );
        drop(plugin);

        // A corrupt version-1 checkpoint: moved aside, reported, a clean start.
        std::fs::write(run.join(CHECKPOINT_FILE), b"{garbage").unwrap();
        let (plugin, report) = env.start("b1");
        assert!(
            matches!(&report.notes[..], [LoadNote::Corrupt { moved_to, .. }]
                if *moved_to == run.join("checkpoint.json.corrupt-1")),
            "{:?}",
            report.notes
        );
        assert!(plugin.claims().is_empty());
        assert!(!run.join(CHECKPOINT_FILE).exists());
    }

    #[tokio::test]
    async fn a_checkpoint_in_the_state_dir_is_migrated() {
        let env = Env::new();
        let c = env.add("c", "uid-1", "gpu-0");
        let state = env.dir.path().join("state");
        let run = env.dir.path().join("run");
        // An older plugin that kept everything under the state directory: its claim's
        // directory there, its checkpoint.json there.
        let devices = {
            let cfg = PluginConfig {
                run_root: state.clone(),
                ..env.cfg("b1")
            };
            let (plugin, _) = Plugin::start(cfg, env.source.clone(), env.backend.clone()).unwrap();
            plugin.prepare(&c).await.unwrap()
        };
        let old_dir = state.join("claims/uid-1");
        assert!(old_dir.join("limits").exists());
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(state.join("checkpoint/uid-1.json")).unwrap())
                .unwrap();
        std::fs::remove_dir_all(state.join(CHECKPOINT_DIR)).unwrap();
        let v1 = json!({"version": 1, "bootId": "b1", "claims": {"uid-1": record["claim"]}});
        std::fs::write(state.join(CHECKPOINT_FILE), v1.to_string()).unwrap();
        create_private_dir(&state.join("claims/uid-orphan")).unwrap();

        let (plugin, report) = env.start("b1");
        assert_eq!(report.notes, []);
        assert_eq!(report.migrated_from, Some(state.join(CHECKPOINT_FILE)));
        assert_eq!(report.removed_orphans, [state.join("claims/uid-orphan")]);
        assert!(!state.join(CHECKPOINT_FILE).exists());
        assert!(env.record_path("uid-1").exists());
        // The claim is still prepared, its files where they were.
        env.source.remove("ns", "c");
        assert_eq!(plugin.prepare(&c).await.unwrap(), devices);
        assert!(old_dir.exists());
        plugin.unprepare(&c).await.unwrap();
        assert!(!old_dir.exists());
        assert!(!env.spec_path("uid-1").exists());
        drop(plugin);
        let (plugin, report) = env.start("b1");
        assert_eq!(report.migrated_from, None);
        assert!(plugin.claims().is_empty());
        drop(plugin);

        // Version-1 files in both places (an older plugin ran again): the newer is the
        // state, both are removed.
        let older = CheckpointFile::new(run.join(CHECKPOINT_FILE));
        let mut cp = crate::checkpoint::Checkpoint::new("b1");
        cp.claims.insert("uid-run".into(), ClaimRecord::default());
        older.save(&cp).unwrap();
        let newer = CheckpointFile::new(state.join(CHECKPOINT_FILE));
        cp.claims.clear();
        cp.claims.insert("uid-old".into(), ClaimRecord::default());
        newer.save(&cp).unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(10);
        std::fs::File::options()
            .write(true)
            .open(newer.path())
            .unwrap()
            .set_modified(later)
            .unwrap();
        let (plugin, report) = env.start("b1");
        assert_eq!(report.migrated_from, Some(newer.path().to_owned()));
        assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-old"]);
        assert!(!newer.path().exists() && !older.path().exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_prepare_keeps_the_claim_locked_until_its_files_are_done() {
        let env = Env::new();
        let cfg = PluginConfig {
            test_pause: Some(std::time::Duration::from_millis(300)),
            ..env.cfg("b1")
        };
        let (plugin, _) = Plugin::start(cfg, env.source.clone(), env.backend.clone()).unwrap();
        let plugin = Arc::new(plugin);
        let c = env.add("c", "uid-1", "gpu-0");
        let task = {
            let (plugin, c) = (plugin.clone(), c.clone());
            tokio::spawn(async move { plugin.prepare(&c).await })
        };
        // The kubelet gives up on the call while the claim's files are being written.
        while !env.spec_path("uid-1").exists() {
            tokio::task::yield_now().await;
        }
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        // The unprepare that follows waits for the dropped prepare's task, then removes
        // everything it wrote: nothing is left behind.
        plugin.unprepare(&c).await.unwrap();
        assert!(!env.spec_path("uid-1").exists());
        assert!(!env.claim_dir("uid-1").exists());
        assert!(!env.record_path("uid-1").exists());
        assert!(plugin.claims().is_empty());
    }

    #[tokio::test]
    async fn a_gpu_the_last_reading_missed_is_read_again() {
        let env = Env::new();
        let (plugin, _) = env.start("b1");
        plugin
            .prepare(&env.add("a", "uid-a", "gpu-0"))
            .await
            .unwrap();
        // Prepares use the last reading; a device it lacks makes them read the backend.
        lock(&env.backend.0).push(gpu(2, "0000:3b:00.0"));
        let devices = plugin
            .prepare(&env.add("b", "uid-b", "gpu-2"))
            .await
            .unwrap();
        assert_eq!(devices[0].device_name, "gpu-2");
        // What the backend no longer lists stays usable until the next reading.
        lock(&env.backend.0).clear();
        plugin
            .prepare(&env.add("c", "uid-c", "gpu-1"))
            .await
            .unwrap();
        plugin.set_inventory(NodeInventory::new("n1", vec![]));
        let e = plugin
            .prepare(&env.add("d", "uid-d", "gpu-1"))
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "unknown_device", "{e}");
    }

    #[tokio::test]
    async fn stale_claims_are_cleaned_up() {
        let env = Env::new();
        let (plugin, _) = env.start("b1");
        let keep = env.add("keep", "uid-k", "gpu-0");
        let gone = env.add("gone", "uid-g", "gpu-0");
        let replaced = env.add("repl", "uid-r", "gpu-1");
        for c in [&keep, &gone, &replaced] {
            plugin.prepare(c).await.unwrap();
        }
        env.source.remove("ns", "gone");
        env.add("repl", "uid-r2", "gpu-1");
        let report = plugin.cleanup_stale().await;
        assert_eq!(report.errors, Vec::<String>::new());
        assert_eq!(report.removed, ["ns/gone (uid-g)", "ns/repl (uid-r)"]);
        assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-k"]);
        assert!(!env.claim_dir("uid-g").exists());
        assert!(env.claim_dir("uid-k").exists());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_prepares() {
        let env = Env::new();
        let (plugin, _) = env.start("b1");
        let plugin = Arc::new(plugin);
        let claims: Vec<ClaimRef> = (0..6)
            .map(|i| env.add(&format!("c{}", i % 3), &format!("uid-{}", i % 3), "gpu-0"))
            .collect();
        let mut set = tokio::task::JoinSet::new();
        for c in claims.clone() {
            let p = plugin.clone();
            set.spawn(async move { (c.uid.clone(), p.prepare(&c).await.unwrap()) });
        }
        let mut by_uid: HashMap<String, Vec<PreparedDevice>> = HashMap::new();
        while let Some(r) = set.join_next().await {
            let (uid, devices) = r.unwrap();
            if let Some(prev) = by_uid.insert(uid, devices.clone()) {
                assert_eq!(prev, devices);
            }
        }
        assert_eq!(by_uid.len(), 3);
        assert_eq!(plugin.claims().len(), 3);
        assert!(lock(&plugin.locks).is_empty(), "locks are released");
    }

    struct Hanging;

    impl ClaimSource for Hanging {
        async fn get(&self, _: &str, _: &str) -> Result<Option<ResourceClaim>, SourceError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn a_silent_api_server_fails_the_claim_in_time() {
        let env = Env::new();
        let cfg = PluginConfig {
            claim_get_timeout: std::time::Duration::from_millis(20),
            ..env.cfg("b1")
        };
        let (plugin, _) = Plugin::start(cfg, Hanging, env.backend.clone()).unwrap();
        let c = ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "uid-1".into(),
        };
        let e = plugin.prepare(&c).await.unwrap_err();
        assert_eq!(e.reason(), "api");
        assert_eq!(
            e.to_string(),
            "claim ns/c: cannot read it: no answer within 20ms"
        );
        assert!(plugin.claims().is_empty());
    }
}
