//! The crash-safe record of prepared claims.
//!
//! One JSON file (`<run dir>/checkpoint.json`, normally `/run/fgpu/checkpoint.json`):
//!
//! ```json
//! {"version": 1, "bootId": "…", "claims": {"<claim uid>": {
//!     "namespace": "ns", "name": "c", "state": "PrepareCompleted",
//!     "specFile": "/var/run/cdi/gpu.fgpu.dev-claim_<uid>.json",
//!     "claimDir": "/run/fgpu/claims/<uid>",
//!     "devices": [{"requestNames": ["gpu"], "poolName": "n1", "deviceName": "gpu-0",
//!                  "shareId": "…", "cdiDeviceIds": ["gpu.fgpu.dev/claim=<uid>-gpu-0-…"],
//!                  "gpuUuid": "GPU-…", "memoryBytes": 10737418240, "cores": 30}]}}}
//! ```
//!
//! * Read tolerantly: unknown fields are ignored and missing ones take defaults, so a newer
//!   or older plugin can read it; `version` says which writer made it.
//! * Written by write-to-temporary, fsync, rename, fsync of the directory, mode 0600, as
//!   compact JSON. Concurrent changes are committed together ([`Journal`]): a caller's
//!   change is on disk when its `update` returns, and one write carries every change made
//!   while the previous write was in flight.
//! * A claim is recorded `PrepareStarted` before any side effect and `PrepareCompleted`
//!   after the last one.
//! * Written under one boot id (`/proc/sys/kernel/random/boot_id`); a checkpoint from
//!   another boot is discarded on load (its claims are handed back so that their files can
//!   be removed).
//! * A file that does not parse is moved aside (`checkpoint.json.corrupt-<n>`) and the
//!   plugin starts with an empty checkpoint; the caller reports it (an Event).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The format version this build writes.
pub const CHECKPOINT_VERSION: u32 = 1;

/// File name of the checkpoint inside the plugin's state directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";

/// Where the kernel publishes the current boot's id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// How far a claim's preparation got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrepareState {
    /// Side effects may have started; a repeat must redo them, an unprepare undo them.
    #[default]
    PrepareStarted,
    /// Everything is in place; a repeated prepare returns the recorded devices.
    PrepareCompleted,
}

/// One device handed to the kubelet for a claim (one per allocation result).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PreparedDevice {
    /// Requests of the claim this device serves.
    pub request_names: Vec<String>,
    /// The pool (the node).
    pub pool_name: String,
    /// The device in the pool (`gpu-<minor>`).
    pub device_name: String,
    /// The share, for a device allocated several times.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Fully qualified CDI device ids, `<driver>/claim=<uid>-<device>[-<share>]`.
    pub cdi_device_ids: Vec<String>,
    /// UUID of the GPU.
    pub gpu_uuid: String,
    /// Granted memory in bytes.
    pub memory_bytes: u64,
    /// Granted cores in percent (0 = not throttled).
    pub cores: u8,
}

/// A claim known to the plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClaimRecord {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// How far preparation got.
    pub state: PrepareState,
    /// The claim's CDI spec file.
    pub spec_file: PathBuf,
    /// The claim's directory (state dir, limits file, preload file).
    pub claim_dir: PathBuf,
    /// Devices returned to the kubelet (complete once `PrepareCompleted`).
    pub devices: Vec<PreparedDevice>,
}

/// The whole checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Checkpoint {
    /// Format version of the writer.
    pub version: u32,
    /// Boot the claims were prepared in.
    pub boot_id: String,
    /// Claims by UID.
    pub claims: BTreeMap<String, ClaimRecord>,
}

impl Checkpoint {
    /// An empty checkpoint of this boot.
    pub fn new(boot_id: impl Into<String>) -> Self {
        Self {
            version: CHECKPOINT_VERSION,
            boot_id: boot_id.into(),
            claims: BTreeMap::new(),
        }
    }
}

/// Errors reading or writing the checkpoint. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// An I/O operation failed.
    #[error("checkpoint {}: cannot {op}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Encoding failed (not expected for this data).
    #[error("checkpoint {}: cannot encode: {source}", path.display())]
    Encode {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The boot id could not be read.
    #[error("boot id {}: {detail}", path.display())]
    BootId {
        /// The file read.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// Something noteworthy found while loading, for logs and Events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadNote {
    /// No checkpoint yet: a fresh start.
    Missing,
    /// The file did not parse; it was moved aside and the plugin starts clean.
    Corrupt {
        /// Where the bad file now is.
        moved_to: PathBuf,
        /// The parse error.
        error: String,
    },
    /// The checkpoint was written in another boot; its claims were dropped.
    BootChanged {
        /// The boot id recorded in the file.
        previous: String,
        /// Claims dropped, for file cleanup.
        discarded: BTreeMap<String, ClaimRecord>,
    },
}

/// Reads the current boot id from `path` (normally [`BOOT_ID_PATH`]).
pub fn read_boot_id(path: &Path) -> Result<String, CheckpointError> {
    let text = fs::read_to_string(path).map_err(|e| CheckpointError::BootId {
        path: path.to_owned(),
        detail: e.to_string(),
    })?;
    let id = text.trim();
    if id.is_empty() {
        return Err(CheckpointError::BootId {
            path: path.to_owned(),
            detail: "is empty".into(),
        });
    }
    Ok(id.to_owned())
}

/// The checkpoint file of one plugin.
#[derive(Clone, Debug)]
pub struct CheckpointFile {
    path: PathBuf,
}

impl CheckpointFile {
    /// The checkpoint at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the checkpoint for boot `boot_id`. Never fails on content: a corrupt file is
    /// moved aside, a file from another boot is discarded; both come back as a note with an
    /// empty checkpoint. Fails only when the file cannot be read or moved at all.
    pub fn load(&self, boot_id: &str) -> Result<(Checkpoint, Option<LoadNote>), CheckpointError> {
        let text = match fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok((Checkpoint::new(boot_id), Some(LoadNote::Missing)));
            }
            Err(source) => return Err(self.io("read", source)),
        };
        match serde_json::from_slice::<Checkpoint>(&text) {
            Ok(cp) if cp.boot_id == boot_id => Ok((cp, None)),
            Ok(cp) => Ok((
                Checkpoint::new(boot_id),
                Some(LoadNote::BootChanged {
                    previous: cp.boot_id,
                    discarded: cp.claims,
                }),
            )),
            Err(e) => {
                let moved_to = self.move_aside()?;
                Ok((
                    Checkpoint::new(boot_id),
                    Some(LoadNote::Corrupt {
                        moved_to,
                        error: e.to_string(),
                    }),
                ))
            }
        }
    }

    /// Writes `cp` atomically: temporary file (0600), fsync, rename, fsync of the directory.
    pub fn save(&self, cp: &Checkpoint) -> Result<(), CheckpointError> {
        self.write(&self.encode(cp)?, Durability::Fsync)
    }

    /// `cp` as this build writes it (compact JSON, this build's version).
    pub fn encode(&self, cp: &Checkpoint) -> Result<Vec<u8>, CheckpointError> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Out<'a> {
            version: u32,
            boot_id: &'a str,
            claims: &'a BTreeMap<String, ClaimRecord>,
        }
        serde_json::to_vec(&Out {
            version: CHECKPOINT_VERSION,
            boot_id: &cp.boot_id,
            claims: &cp.claims,
        })
        .map_err(|source| CheckpointError::Encode {
            path: self.path.clone(),
            source,
        })
    }

    /// Writes encoded bytes atomically, and durably for [`Durability::Fsync`].
    pub fn write(&self, bytes: &[u8], durability: Durability) -> Result<(), CheckpointError> {
        write_atomic(&self.path, bytes, 0o600, durability)
            .map_err(|(op, source)| self.io(op, source))
    }

    fn move_aside(&self) -> Result<PathBuf, CheckpointError> {
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| CHECKPOINT_FILE.to_owned());
        let target = (1u32..)
            .map(|n| self.path.with_file_name(format!("{name}.corrupt-{n}")))
            .find(|p| !p.exists())
            .unwrap_or_else(|| self.path.with_file_name(format!("{name}.corrupt")));
        fs::rename(&self.path, &target).map_err(|e| self.io("move aside the corrupt file", e))?;
        Ok(target)
    }

    fn io(&self, op: &'static str, source: io::Error) -> CheckpointError {
        CheckpointError::Io {
            path: self.path.clone(),
            op,
            source,
        }
    }
}

/// Whether [`write_atomic`] waits for the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// fsync the file before the rename and the directory after it: the new content
    /// survives a power loss. For the checkpoint.
    Fsync,
    /// Rename only: readers see the old or the new content, never a torn file, and the
    /// content survives a crash of the process (the kernel still holds it) but not of the
    /// machine. For a claim's files: after a reboot the checkpoint of the old boot is
    /// discarded and every claim is prepared again, so durability would buy nothing.
    Atomic,
}

/// Writes `bytes` to `path` by temporary file and rename (with fsyncs of the file and the
/// directory for [`Durability::Fsync`]); the file gets `mode`. On error, says which step
/// failed.
pub fn write_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> Result<(), (&'static str, io::Error)> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let write = || -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // The mode given to open() is masked by the umask; set it exactly.
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        f.write_all(bytes)?;
        if durability == Durability::Fsync {
            f.sync_all()?;
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        ("write the temporary file", e)
    })?;
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        ("rename the temporary file into place", e)
    })?;
    if durability == Durability::Fsync {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| ("fsync the directory", e))?;
    }
    Ok(())
}

/// The checkpoint in memory and on disk, with group commit.
///
/// [`update`](Self::update) changes the in-memory checkpoint at once, then waits until a
/// write that includes the change is in the file — fsynced, for a change that asks for
/// [`Durability::Fsync`]. Writes run one at a time on the blocking pool; whoever takes the
/// writer's turn writes everything changed so far, so callers that queued behind a write
/// usually find their change already written and return without writing. A failed write fails its caller; the change stays in memory and goes
/// out with the next successful write (an unprepare or a repeated prepare rewrites the
/// entry anyway).
#[derive(Debug)]
pub struct Journal {
    file: CheckpointFile,
    mem: std::sync::Mutex<Mem>,
    /// The writer's turn; holds the generations known to be in the file.
    on_disk: tokio::sync::Mutex<Written>,
    writes: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Written {
    /// Changes up to this generation are in the file (visible to a restarted plugin).
    visible: u64,
    /// Changes up to this generation are fsynced (survive a power loss).
    durable: u64,
}

#[derive(Debug)]
struct Mem {
    cp: Checkpoint,
    /// Bumped by every change.
    generation: u64,
}

impl Journal {
    /// A journal over `file`, whose content is `cp` (already on disk).
    pub fn new(file: CheckpointFile, cp: Checkpoint) -> Self {
        Self {
            file,
            mem: std::sync::Mutex::new(Mem { cp, generation: 0 }),
            on_disk: tokio::sync::Mutex::new(Written::default()),
            writes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many writes reached the file so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The file.
    pub fn file(&self) -> &CheckpointFile {
        &self.file
    }

    /// Runs `f` on the in-memory checkpoint (the latest state, possibly ahead of the disk
    /// while a write is in flight).
    pub fn read<T>(&self, f: impl FnOnce(&Checkpoint) -> T) -> T {
        f(&self.mem().cp)
    }

    fn mem(&self) -> std::sync::MutexGuard<'_, Mem> {
        // Every change is a single statement on the map; a panic elsewhere leaves it whole.
        self.mem
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies `f` (which says whether it changed anything), then returns once the change
    /// is in the file with `durability`. `after` sees the checkpoint right after the change
    /// (for metrics).
    pub async fn update(
        &self,
        durability: Durability,
        f: impl FnOnce(&mut Checkpoint) -> bool,
        after: impl FnOnce(&Checkpoint),
    ) -> Result<(), CheckpointError> {
        let mine = {
            let mut m = self.mem();
            if f(&mut m.cp) {
                m.generation += 1;
                after(&m.cp);
            }
            m.generation
        };
        let mut on_disk = self.on_disk.lock().await;
        let done = match durability {
            Durability::Fsync => on_disk.durable,
            Durability::Atomic => on_disk.visible,
        };
        if done >= mine {
            return Ok(());
        }
        let (bytes, generation) = {
            let m = self.mem();
            (self.file.encode(&m.cp)?, m.generation)
        };
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || file.write(&bytes, durability))
            .await
            .map_err(|e| self.file.io("write", io::Error::other(e)))??;
        on_disk.visible = generation;
        if durability == Durability::Fsync {
            on_disk.durable = generation;
        }
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn record(state: PrepareState) -> ClaimRecord {
        ClaimRecord {
            namespace: "ns".into(),
            name: "c".into(),
            state,
            spec_file: "/var/run/cdi/x.json".into(),
            claim_dir: "/run/fgpu/claims/u1".into(),
            devices: vec![PreparedDevice {
                request_names: vec!["gpu".into()],
                pool_name: "n1".into(),
                device_name: "gpu-0".into(),
                share_id: Some("s1".into()),
                cdi_device_ids: vec!["gpu.fgpu.dev/claim=u1-gpu-0-s1".into()],
                gpu_uuid: "GPU-1".into(),
                memory_bytes: 1 << 30,
                cores: 30,
            }],
        }
    }

    #[test]
    fn round_trip_atomic_and_private() {
        let dir = tempfile::tempdir().unwrap();
        let file = CheckpointFile::new(dir.path().join(CHECKPOINT_FILE));
        let (mut cp, note) = file.load("boot-1").unwrap();
        assert_eq!(note, Some(LoadNote::Missing));
        cp.claims
            .insert("u1".into(), record(PrepareState::PrepareCompleted));
        file.save(&cp).unwrap();
        let mode = fs::metadata(file.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, [CHECKPOINT_FILE], "no temporary file left");
        let (back, note) = file.load("boot-1").unwrap();
        assert_eq!(note, None);
        assert_eq!(back, cp);
        let raw: serde_json::Value =
            serde_json::from_slice(&fs::read(file.path()).unwrap()).unwrap();
        assert_eq!(raw["version"], CHECKPOINT_VERSION);
        assert_eq!(raw["claims"]["u1"]["state"], "PrepareCompleted");
    }

    #[test]
    fn unknown_fields_are_ignored_and_missing_ones_defaulted() {
        let dir = tempfile::tempdir().unwrap();
        let file = CheckpointFile::new(dir.path().join(CHECKPOINT_FILE));
        fs::write(
            file.path(),
            r#"{"version": 7, "bootId": "b", "future": {"x": 1},
                "claims": {"u1": {"namespace": "ns", "name": "c", "state": "PrepareStarted",
                                  "newField": [1, 2],
                                  "devices": [{"deviceName": "gpu-1", "extra": true}]}}}"#,
        )
        .unwrap();
        let (cp, note) = file.load("b").unwrap();
        assert_eq!(note, None);
        assert_eq!(cp.version, 7);
        let rec = &cp.claims["u1"];
        assert_eq!(rec.state, PrepareState::PrepareStarted);
        assert_eq!(rec.devices[0].device_name, "gpu-1");
        assert_eq!(rec.devices[0].memory_bytes, 0);
        // Saving writes this build's version.
        file.save(&cp).unwrap();
        assert_eq!(file.load("b").unwrap().0.version, CHECKPOINT_VERSION);
    }

    #[test]
    fn boot_change_discards_and_hands_back_claims() {
        let dir = tempfile::tempdir().unwrap();
        let file = CheckpointFile::new(dir.path().join(CHECKPOINT_FILE));
        let mut cp = Checkpoint::new("boot-1");
        cp.claims
            .insert("u1".into(), record(PrepareState::PrepareCompleted));
        file.save(&cp).unwrap();
        let (fresh, note) = file.load("boot-2").unwrap();
        assert_eq!(fresh, Checkpoint::new("boot-2"));
        match note {
            Some(LoadNote::BootChanged {
                previous,
                discarded,
            }) => {
                assert_eq!(previous, "boot-1");
                assert_eq!(discarded.keys().collect::<Vec<_>>(), ["u1"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn corrupt_file_is_moved_aside_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let file = CheckpointFile::new(dir.path().join(CHECKPOINT_FILE));
        for n in 1..=2 {
            fs::write(file.path(), b"{\"claims\": {\"u1\": ").unwrap();
            let (cp, note) = file.load("b").unwrap();
            assert_eq!(cp, Checkpoint::new("b"));
            let Some(LoadNote::Corrupt { moved_to, error }) = note else {
                panic!("{note:?}")
            };
            assert_eq!(
                moved_to,
                dir.path().join(format!("checkpoint.json.corrupt-{n}"))
            );
            assert!(error.contains("EOF"), "{error}");
            assert!(!file.path().exists());
            assert!(moved_to.exists());
        }
        // Wrong types are corruption too.
        fs::write(file.path(), br#"{"claims": []}"#).unwrap();
        assert!(matches!(
            file.load("b").unwrap().1,
            Some(LoadNote::Corrupt { .. })
        ));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn journal_commits_queued_changes_in_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let file = CheckpointFile::new(dir.path().join(CHECKPOINT_FILE));
        let journal = std::sync::Arc::new(Journal::new(file.clone(), Checkpoint::new("b")));
        // Hold the writer's turn, as a slow write in flight would.
        let turn = journal.on_disk.lock().await;
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..10 {
            let j = journal.clone();
            let file = file.clone();
            tasks.spawn(async move {
                let uid = format!("u{i}");
                j.update(
                    Durability::Fsync,
                    |cp| {
                        cp.claims
                            .insert(uid.clone(), record(PrepareState::PrepareCompleted));
                        true
                    },
                    |_| {},
                )
                .await
                .unwrap();
                // On disk when update returns.
                let (cp, _) = file.load("b").unwrap();
                assert!(cp.claims.contains_key(&uid), "{uid} not on disk");
            });
        }
        while journal.read(|cp| cp.claims.len()) < 10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(journal.writes(), 0);
        drop(turn);
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        assert_eq!(journal.writes(), 1, "ten queued changes, one write");
        assert_eq!(file.load("b").unwrap().0.claims.len(), 10);

        // An update that changes nothing writes nothing; a removal is written.
        journal
            .update(Durability::Fsync, |_| false, |_| panic!("no change"))
            .await
            .unwrap();
        assert_eq!(journal.writes(), 1);
        journal
            .update(
                Durability::Fsync,
                |cp| cp.claims.remove("u3").is_some(),
                |cp| assert_eq!(cp.claims.len(), 9),
            )
            .await
            .unwrap();
        assert_eq!(journal.writes(), 2);
        assert!(!file.load("b").unwrap().0.claims.contains_key("u3"));

        // A change written without fsync is visible at once; a caller that needs it durable
        // (even with no change of its own) writes again, with fsync.
        journal
            .update(
                Durability::Atomic,
                |cp| cp.claims.remove("u4").is_some(),
                |_| {},
            )
            .await
            .unwrap();
        assert_eq!(journal.writes(), 3);
        assert!(!file.load("b").unwrap().0.claims.contains_key("u4"));
        journal
            .update(Durability::Atomic, |_| false, |_| {})
            .await
            .unwrap();
        assert_eq!(journal.writes(), 3, "already visible");
        journal
            .update(Durability::Fsync, |_| false, |_| {})
            .await
            .unwrap();
        assert_eq!(journal.writes(), 4, "visible but not yet durable");
    }

    #[tokio::test]
    async fn journal_write_failure_fails_the_caller_and_keeps_the_change_for_later() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("state");
        fs::create_dir(&sub).unwrap();
        let file = CheckpointFile::new(sub.join(CHECKPOINT_FILE));
        let journal = Journal::new(file.clone(), Checkpoint::new("b"));
        fs::remove_dir(&sub).unwrap();
        let e = journal
            .update(
                Durability::Fsync,
                |cp| {
                    cp.claims
                        .insert("u1".into(), record(PrepareState::PrepareStarted))
                        .is_none()
                },
                |_| {},
            )
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("checkpoint {}", file.path().display())),
            "{e}"
        );
        fs::create_dir(&sub).unwrap();
        journal
            .update(
                Durability::Atomic,
                |cp| {
                    cp.claims
                        .insert("u2".into(), record(PrepareState::PrepareStarted))
                        .is_none()
                },
                |_| {},
            )
            .await
            .unwrap();
        let on_disk = file.load("b").unwrap().0;
        assert_eq!(on_disk.claims.keys().collect::<Vec<_>>(), ["u1", "u2"]);
    }

    #[test]
    fn boot_id_is_read_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("boot_id");
        fs::write(&p, "1b2c-3d\n").unwrap();
        assert_eq!(read_boot_id(&p).unwrap(), "1b2c-3d");
        fs::write(&p, "\n").unwrap();
        assert!(
            read_boot_id(&p)
                .unwrap_err()
                .to_string()
                .contains("is empty")
        );
        assert!(read_boot_id(&dir.path().join("nope")).is_err());
    }
}
