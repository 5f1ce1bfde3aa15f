//! The crash-safe record of prepared claims.
//!
//! One small JSON file per claim in the checkpoint directory
//! (`<run dir>/checkpoint/<claim uid>.json`, normally `/run/fgpu/checkpoint/`, mode 0700):
//!
//! ```json
//! {"version": 2, "bootId": "…", "uid": "<claim uid>", "claim": {
//!     "namespace": "ns", "name": "c", "state": "PrepareCompleted",
//!     "specFile": "/var/run/cdi/gpu.fgpu.dev-claim_<uid>.json",
//!     "claimDir": "/run/fgpu/claims/<uid>",
//!     "devices": [{"requestNames": ["gpu"], "poolName": "n1", "deviceName": "gpu-0",
//!                  "shareId": "…", "cdiDeviceIds": ["gpu.fgpu.dev/claim=<uid>-gpu-0-…"],
//!                  "gpuUuid": "GPU-…", "memoryBytes": 10737418240, "cores": 30}]}}
//! ```
//!
//! * Read tolerantly: unknown fields are ignored and missing ones take defaults, so a newer
//!   or older plugin can read it; `version` says which writer made it.
//! * Each record is written by write-to-temporary (0600), rename — with an fsync of the file
//!   before and of the directory after the rename for a record that must survive a power
//!   loss ([`Durability::Fsync`]); a removal is followed by an fsync of the directory.
//!   Records of different claims are different files: a write never waits for another
//!   claim's, and costs the same whatever the number of claims ([`Records`]).
//! * A claim is recorded `PrepareStarted` before any side effect and `PrepareCompleted`
//!   after the last one (`crate::prepare`).
//! * Written under one boot id (`/proc/sys/kernel/random/boot_id`); a record of another
//!   boot is discarded on load (its claims are handed back so that their files can be
//!   removed).
//! * A record that does not parse is moved aside (`<uid>.json.corrupt-<n>`) and the plugin
//!   starts without that claim; the caller reports it (an Event). Temporary files of
//!   interrupted writes are removed on load.
//! * Version 1 (plugins before the checkpoint directory) kept every claim in one file,
//!   `checkpoint.json` ([`CheckpointFile`], same record per claim); it is read once on
//!   start, its claims written as records, and removed (`Plugin::start`).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The format version this build writes (1: one file for all claims; 2: one file per claim).
pub const CHECKPOINT_VERSION: u32 = 2;

/// The checkpoint directory inside the plugin's run directory (one record file per claim).
pub const CHECKPOINT_DIR: &str = "checkpoint";

/// File name of a version-1 checkpoint (every claim in one file) inside the run or state
/// directory: read once on start and migrated to [`CHECKPOINT_DIR`].
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

/// The whole checkpoint of version 1 (one file, [`CheckpointFile`]); version 2 keeps the same
/// claim records, one file each ([`CheckpointDir`]).
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
    /// A checkpoint file (a claim's record, or a version-1 checkpoint) did not parse; it was
    /// moved aside and the claims it recorded are dropped (their files are leftovers now).
    Corrupt {
        /// Where the bad file now is.
        moved_to: PathBuf,
        /// The parse error.
        error: String,
    },
    /// Records of another boot were found; their claims were dropped.
    BootChanged {
        /// The boot id recorded (the first one found, where records of several boots were).
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

/// A checkpoint of version 1: every claim in one file. This build only reads it (to
/// migrate it to a [`CheckpointDir`]); `save` remains for tests and tools that make one.
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

    /// Writes `cp` as a version-1 file, atomically: temporary file (0600), fsync, rename,
    /// fsync of the directory.
    pub fn save(&self, cp: &Checkpoint) -> Result<(), CheckpointError> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Out<'a> {
            version: u32,
            boot_id: &'a str,
            claims: &'a BTreeMap<String, ClaimRecord>,
        }
        let bytes = serde_json::to_vec(&Out {
            version: 1,
            boot_id: &cp.boot_id,
            claims: &cp.claims,
        })
        .map_err(|source| CheckpointError::Encode {
            path: self.path.clone(),
            source,
        })?;
        write_atomic(&self.path, &bytes, 0o600, Durability::Fsync)
            .map_err(|(op, source)| io_error(&self.path, op, source))
    }

    /// Removes the file (gone already is fine) and fsyncs its directory; says whether it was
    /// there.
    pub fn remove(&self) -> Result<bool, CheckpointError> {
        remove_durably(&self.path)
    }

    fn move_aside(&self) -> Result<PathBuf, CheckpointError> {
        move_aside(&self.path)
    }

    fn io(&self, op: &'static str, source: io::Error) -> CheckpointError {
        io_error(&self.path, op, source)
    }
}

fn io_error(path: &Path, op: &'static str, source: io::Error) -> CheckpointError {
    CheckpointError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

/// Renames a file that does not parse to `<name>.corrupt-<n>` (the first free `n`).
fn move_aside(path: &Path) -> Result<PathBuf, CheckpointError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| CHECKPOINT_FILE.to_owned());
    let target = (1u32..)
        .map(|n| path.with_file_name(format!("{name}.corrupt-{n}")))
        .find(|p| !p.exists())
        .unwrap_or_else(|| path.with_file_name(format!("{name}.corrupt")));
    fs::rename(path, &target).map_err(|e| io_error(path, "move aside the corrupt file", e))?;
    Ok(target)
}

/// Creates `path` and its parents, `path` itself exactly 0700 whatever the umask or an
/// earlier run left.
pub(crate) fn create_private_dir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o700))
}

/// Removes the file `path` (or the directory tree, with `dir`); absent is fine. Says whether
/// it was there.
pub(crate) fn remove_if_present(path: &Path, dir: bool) -> io::Result<bool> {
    let r = if dir {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}

fn parent(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Removes `path` (absent is fine) and, if it was there, fsyncs its directory so that the
/// removal survives a power loss; says whether it was there.
fn remove_durably(path: &Path) -> Result<bool, CheckpointError> {
    if !remove_if_present(path, false).map_err(|e| io_error(path, "remove", e))? {
        return Ok(false);
    }
    let dir = parent(path);
    fsync_dir(dir).map_err(|e| io_error(dir, "fsync the directory", e))?;
    Ok(true)
}

/// Whether `uid` can name a claim's files: letters, digits and `-`, at most 128 bytes (the
/// kubelet sends UUIDs; the legacy device plugin `<pod uid>-<container>`).
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 128
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Whether [`write_atomic`] waits for the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// fsync the file before the rename and the directory after it: the new content
    /// survives a power loss. For the records that end an operation (`PrepareCompleted`).
    Fsync,
    /// Rename only: readers see the old or the new content, never a torn file, and the
    /// content survives a crash of the process (the kernel still holds it) but not of the
    /// machine. For a claim's files and its `PrepareStarted` record: after a reboot the records of the old boot are
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
    let dir = parent(path);
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
        fsync_dir(dir).map_err(|e| ("fsync the directory", e))?;
    }
    Ok(())
}

/// One claim's record file in a [`CheckpointDir`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RecordFile {
    /// Format version of the writer.
    pub version: u32,
    /// Boot the claim was prepared in.
    pub boot_id: String,
    /// The claim's UID (also the file's name; a file whose UID differs is corrupt).
    pub uid: String,
    /// The record.
    pub claim: ClaimRecord,
}

/// What [`CheckpointDir::load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The claims of this boot, by UID.
    pub claims: BTreeMap<String, ClaimRecord>,
    /// What was noteworthy: no directory yet, records that did not parse (one note each),
    /// records of another boot (one note for all).
    pub notes: Vec<LoadNote>,
}

/// The checkpoint directory: one record file per claim, `<dir>/<uid>.json`.
#[derive(Clone, Debug)]
pub struct CheckpointDir {
    dir: PathBuf,
}

impl CheckpointDir {
    /// The checkpoint directory at `dir` (normally `<run dir>/checkpoint`).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The record file of claim `uid`.
    pub fn record_path(&self, uid: &str) -> PathBuf {
        self.dir.join(format!("{uid}.json"))
    }

    /// Creates the directory (0700) if it is missing, durably (the parent is fsynced); says
    /// whether it was missing.
    fn create(&self) -> Result<bool, CheckpointError> {
        if self.dir.is_dir() {
            return Ok(false);
        }
        create_private_dir(&self.dir)
            .map_err(|e| io_error(&self.dir, "create the checkpoint directory", e))?;
        let up = parent(&self.dir);
        fsync_dir(up).map_err(|e| io_error(up, "fsync the directory", e))?;
        Ok(true)
    }

    /// The directory's entries: file name and path.
    fn entries(&self) -> Result<Vec<(String, PathBuf)>, CheckpointError> {
        let read = |e| io_error(&self.dir, "read the checkpoint directory", e);
        fs::read_dir(&self.dir)
            .map_err(read)?
            .map(|entry| {
                let entry = entry.map_err(read)?;
                Ok((
                    entry.file_name().to_string_lossy().into_owned(),
                    entry.path(),
                ))
            })
            .collect()
    }

    /// Loads the records of boot `boot_id` (creating the directory if it is missing). Never
    /// fails on content: a record that does not parse is moved aside, one of another boot is
    /// removed, temporary files of interrupted writes are removed; the first two come back
    /// as notes. Fails only when the directory cannot be created or read, or a file cannot
    /// be read, moved or removed.
    pub fn load(&self, boot_id: &str) -> Result<Loaded, CheckpointError> {
        let mut loaded = Loaded::default();
        if self.create()? {
            loaded.notes.push(LoadNote::Missing);
            return Ok(loaded);
        }
        let mut previous: Option<String> = None;
        let mut discarded = BTreeMap::new();
        for (name, path) in self.entries()? {
            if name.starts_with('.') && name.ends_with(".tmp") {
                // An interrupted write: the record it replaced (if any) is still in place.
                remove_if_present(&path, false).map_err(|e| io_error(&path, "remove", e))?;
                continue;
            }
            // Anything else that is not a record (moved-aside files) is left alone.
            let Some(uid) = name.strip_suffix(".json").filter(|u| valid_uid(u)) else {
                continue;
            };
            let parsed = match fs::read(&path) {
                Ok(text) => serde_json::from_slice::<RecordFile>(&text).map_err(|e| e.to_string()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                // Not readable (a directory of that name, an I/O error): as good as corrupt;
                // failing the start would only make the plugin restart into the same error.
                Err(e) => Err(format!("cannot read it: {e}")),
            };
            let parsed = parsed.and_then(|r| {
                if r.uid.is_empty() || r.uid == uid {
                    Ok(r)
                } else {
                    Err(format!("uid {:?} does not match the file name", r.uid))
                }
            });
            match parsed {
                Ok(r) if r.boot_id == boot_id => {
                    loaded.claims.insert(uid.to_owned(), r.claim);
                }
                Ok(r) => {
                    remove_if_present(&path, false).map_err(|e| io_error(&path, "remove", e))?;
                    previous.get_or_insert(r.boot_id);
                    discarded.insert(uid.to_owned(), r.claim);
                }
                Err(error) => {
                    let moved_to = move_aside(&path)?;
                    loaded.notes.push(LoadNote::Corrupt { moved_to, error });
                }
            }
        }
        if let Some(previous) = previous {
            loaded.notes.push(LoadNote::BootChanged {
                previous,
                discarded,
            });
        }
        Ok(loaded)
    }

    /// Writes claim `uid`'s record atomically (temporary file 0600, rename), and durably for
    /// [`Durability::Fsync`].
    pub fn write(
        &self,
        boot_id: &str,
        uid: &str,
        record: &ClaimRecord,
        durability: Durability,
    ) -> Result<(), CheckpointError> {
        let path = self.record_path(uid);
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Out<'a> {
            version: u32,
            boot_id: &'a str,
            uid: &'a str,
            claim: &'a ClaimRecord,
        }
        let bytes = serde_json::to_vec(&Out {
            version: CHECKPOINT_VERSION,
            boot_id,
            uid,
            claim: record,
        })
        .map_err(|source| CheckpointError::Encode {
            path: path.clone(),
            source,
        })?;
        write_atomic(&path, &bytes, 0o600, durability)
            .map_err(|(op, source)| io_error(&path, op, source))
    }

    /// Removes claim `uid`'s record durably (absent is fine); says whether it was there.
    pub fn remove(&self, uid: &str) -> Result<bool, CheckpointError> {
        remove_durably(&self.record_path(uid))
    }

    /// Makes the directory hold exactly `claims` of boot `boot_id`, durably: every record
    /// written with fsync, every other record removed. For the migration of a version-1
    /// checkpoint, whose claims are then the whole state.
    pub fn replace_all(
        &self,
        boot_id: &str,
        claims: &BTreeMap<String, ClaimRecord>,
    ) -> Result<(), CheckpointError> {
        self.create()?;
        for (name, path) in self.entries()? {
            let stale = name
                .strip_suffix(".json")
                .is_some_and(|uid| valid_uid(uid) && !claims.contains_key(uid));
            if stale {
                remove_durably(&path)?;
            }
        }
        for (uid, record) in claims {
            if valid_uid(uid) {
                self.write(boot_id, uid, record, Durability::Fsync)?;
            }
        }
        Ok(())
    }
}

/// The prepared claims: in memory, and one record file each in a [`CheckpointDir`].
///
/// [`put`](Self::put) and [`remove`](Self::remove) do blocking file I/O (call them on the
/// blocking pool) and change the in-memory copy only once the file has changed, so the
/// memory never claims more than the disk holds. Records of different claims are different
/// files, so writes of different claims run in parallel and never wait for each other; the
/// caller runs one operation per claim at a time (`crate::prepare` holds the claim's lock).
#[derive(Debug)]
pub struct Records {
    dir: CheckpointDir,
    boot_id: String,
    claims: std::sync::Mutex<BTreeMap<String, ClaimRecord>>,
    writes: std::sync::atomic::AtomicU64,
}

impl Records {
    /// The records of boot `boot_id` in `dir`, whose content is `claims` (already on disk).
    pub fn new(
        dir: CheckpointDir,
        boot_id: impl Into<String>,
        claims: BTreeMap<String, ClaimRecord>,
    ) -> Self {
        Self {
            dir,
            boot_id: boot_id.into(),
            claims: std::sync::Mutex::new(claims),
            writes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &CheckpointDir {
        &self.dir
    }

    /// How many record writes and removals reached the disk so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn mem(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ClaimRecord>> {
        // Every change is a single statement on the map; a panic elsewhere leaves it whole.
        self.claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` on the claims.
    pub fn read<T>(&self, f: impl FnOnce(&BTreeMap<String, ClaimRecord>) -> T) -> T {
        f(&self.mem())
    }

    /// A copy of the claims.
    pub fn claims(&self) -> BTreeMap<String, ClaimRecord> {
        self.mem().clone()
    }

    /// Records claim `uid` as `record` with `durability` (blocking). A record equal to the
    /// one held is not written again when only [`Durability::Atomic`] is asked for.
    pub fn put(
        &self,
        uid: &str,
        record: ClaimRecord,
        durability: Durability,
    ) -> Result<(), CheckpointError> {
        if durability == Durability::Atomic && self.mem().get(uid) == Some(&record) {
            return Ok(());
        }
        self.dir.write(&self.boot_id, uid, &record, durability)?;
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.mem().insert(uid.to_owned(), record);
        Ok(())
    }

    /// Removes claim `uid`'s record durably (blocking); says whether there was one.
    pub fn remove(&self, uid: &str) -> Result<bool, CheckpointError> {
        let on_disk = self.dir.remove(uid)?;
        if on_disk {
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let in_memory = self.mem().remove(uid).is_some();
        Ok(on_disk || in_memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// Writes `uid`'s record in `state` under `boot`.
    fn put(dir: &CheckpointDir, boot: &str, uid: &str, state: PrepareState, d: Durability) {
        dir.write(boot, uid, &record(state), d).unwrap();
    }

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

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn records_round_trip_one_private_file_each() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
        let loaded = dir.load("boot-1").unwrap();
        assert_eq!(loaded.notes, [LoadNote::Missing]);
        assert!(loaded.claims.is_empty());
        assert_eq!(mode(dir.path()), 0o700);
        let records = Records::new(dir.clone(), "boot-1", loaded.claims);
        records
            .put(
                "u1",
                record(PrepareState::PrepareStarted),
                Durability::Atomic,
            )
            .unwrap();
        records
            .put(
                "u2",
                record(PrepareState::PrepareCompleted),
                Durability::Fsync,
            )
            .unwrap();
        records
            .put(
                "u1",
                record(PrepareState::PrepareCompleted),
                Durability::Fsync,
            )
            .unwrap();
        assert_eq!(records.writes(), 3);
        // The same record again, not durable: nothing to write.
        records
            .put(
                "u1",
                record(PrepareState::PrepareCompleted),
                Durability::Atomic,
            )
            .unwrap();
        assert_eq!(records.writes(), 3);
        assert_eq!(
            names(dir.path()),
            ["u1.json", "u2.json"],
            "no temporary file left"
        );
        assert_eq!(mode(&dir.record_path("u1")), 0o600);
        let raw: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.record_path("u1")).unwrap()).unwrap();
        assert_eq!(raw["version"], CHECKPOINT_VERSION);
        assert_eq!(raw["bootId"], "boot-1");
        assert_eq!(raw["uid"], "u1");
        assert_eq!(raw["claim"]["state"], "PrepareCompleted");

        let back = dir.load("boot-1").unwrap();
        assert_eq!(back.notes, []);
        assert_eq!(back.claims, records.claims());

        assert!(records.remove("u1").unwrap());
        assert!(!records.remove("u1").unwrap(), "idempotent");
        assert_eq!(names(dir.path()), ["u2.json"]);
        assert_eq!(
            dir.load("boot-1")
                .unwrap()
                .claims
                .keys()
                .collect::<Vec<_>>(),
            ["u2"]
        );
    }

    #[test]
    fn unknown_fields_are_ignored_and_missing_ones_defaulted() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
        dir.load("b").unwrap();
        fs::write(
            dir.record_path("u1"),
            r#"{"version": 7, "bootId": "b", "future": {"x": 1},
                "claim": {"namespace": "ns", "name": "c", "state": "PrepareStarted",
                          "newField": [1, 2],
                          "devices": [{"deviceName": "gpu-1", "extra": true}]}}"#,
        )
        .unwrap();
        let loaded = dir.load("b").unwrap();
        assert_eq!(loaded.notes, []);
        let rec = &loaded.claims["u1"];
        assert_eq!(rec.state, PrepareState::PrepareStarted);
        assert_eq!(rec.devices[0].device_name, "gpu-1");
        assert_eq!(rec.devices[0].memory_bytes, 0);

        // The version-1 file likewise.
        let file = CheckpointFile::new(tmp.path().join(CHECKPOINT_FILE));
        fs::write(
            file.path(),
            r#"{"version": 1, "bootId": "b", "future": {"x": 1},
                "claims": {"u1": {"namespace": "ns", "name": "c", "state": "PrepareCompleted",
                                  "newField": [1, 2],
                                  "devices": [{"deviceName": "gpu-1", "extra": true}]}}}"#,
        )
        .unwrap();
        let (cp, note) = file.load("b").unwrap();
        assert_eq!(note, None);
        assert_eq!(cp.version, 1);
        assert_eq!(cp.claims["u1"].state, PrepareState::PrepareCompleted);
        assert_eq!(cp.claims["u1"].devices[0].device_name, "gpu-1");
    }

    #[test]
    fn records_of_another_boot_are_discarded_and_handed_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
        dir.load("boot-1").unwrap();
        put(
            &dir,
            "boot-1",
            "u1",
            PrepareState::PrepareCompleted,
            Durability::Fsync,
        );
        put(
            &dir,
            "boot-2",
            "u2",
            PrepareState::PrepareCompleted,
            Durability::Fsync,
        );
        let loaded = dir.load("boot-2").unwrap();
        assert_eq!(loaded.claims.keys().collect::<Vec<_>>(), ["u2"]);
        match &loaded.notes[..] {
            [
                LoadNote::BootChanged {
                    previous,
                    discarded,
                },
            ] => {
                assert_eq!(previous, "boot-1");
                assert_eq!(discarded.keys().collect::<Vec<_>>(), ["u1"]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(names(dir.path()), ["u2.json"]);

        // The version-1 file: the whole checkpoint is discarded.
        let file = CheckpointFile::new(tmp.path().join(CHECKPOINT_FILE));
        let mut cp = Checkpoint::new("boot-1");
        cp.claims
            .insert("u1".into(), record(PrepareState::PrepareCompleted));
        file.save(&cp).unwrap();
        let (fresh, note) = file.load("boot-2").unwrap();
        assert_eq!(fresh, Checkpoint::new("boot-2"));
        assert!(
            matches!(note, Some(LoadNote::BootChanged { previous, discarded })
                if previous == "boot-1" && discarded.contains_key("u1"))
        );
    }

    #[test]
    fn corrupt_records_are_moved_aside_each_time_and_only_they_are_lost() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
        dir.load("b").unwrap();
        put(
            &dir,
            "b",
            "good",
            PrepareState::PrepareCompleted,
            Durability::Fsync,
        );
        for n in 1..=2 {
            fs::write(dir.record_path("u1"), b"{\"claim\": {\"name\": ").unwrap();
            let loaded = dir.load("b").unwrap();
            assert_eq!(loaded.claims.keys().collect::<Vec<_>>(), ["good"]);
            let [LoadNote::Corrupt { moved_to, error }] = &loaded.notes[..] else {
                panic!("{:?}", loaded.notes)
            };
            assert_eq!(*moved_to, dir.path().join(format!("u1.json.corrupt-{n}")));
            assert!(error.contains("EOF"), "{error}");
            assert!(!dir.record_path("u1").exists());
            assert!(moved_to.exists());
        }
        // Wrong types and a record under another claim's name are corruption too; moved-aside
        // files and names that are no UID are left alone.
        fs::write(
            dir.record_path("u2"),
            br#"{"bootId": "b", "claim": {"devices": {}}}"#,
        )
        .unwrap();
        fs::write(dir.record_path("u3"), br#"{"bootId": "b", "uid": "u4"}"#).unwrap();
        fs::write(dir.path().join("not a uid.json"), b"x").unwrap();
        // Something that cannot be read at all is moved aside too (no start that fails).
        fs::create_dir(dir.record_path("u5")).unwrap();
        let loaded = dir.load("b").unwrap();
        assert_eq!(loaded.notes.len(), 3, "{:?}", loaded.notes);
        assert!(
            loaded
                .notes
                .iter()
                .all(|n| matches!(n, LoadNote::Corrupt { .. })),
            "{:?}",
            loaded.notes
        );
        assert_eq!(
            names(dir.path()),
            [
                "good.json",
                "not a uid.json",
                "u1.json.corrupt-1",
                "u1.json.corrupt-2",
                "u2.json.corrupt-1",
                "u3.json.corrupt-1",
                "u5.json.corrupt-1"
            ]
        );

        // The version-1 file.
        let file = CheckpointFile::new(tmp.path().join(CHECKPOINT_FILE));
        fs::write(file.path(), b"{\"claims\": {\"u1\": ").unwrap();
        let (cp, note) = file.load("b").unwrap();
        assert_eq!(cp, Checkpoint::new("b"));
        let Some(LoadNote::Corrupt { moved_to, .. }) = note else {
            panic!("{note:?}")
        };
        assert_eq!(moved_to, tmp.path().join("checkpoint.json.corrupt-1"));
        assert!(!file.path().exists());
    }

    #[test]
    fn interrupted_writes_are_removed_on_load() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
        dir.load("b").unwrap();
        put(
            &dir,
            "b",
            "u1",
            PrepareState::PrepareStarted,
            Durability::Atomic,
        );
        // A crash between writing the temporary file and the rename.
        fs::write(dir.path().join(".u1.json.tmp"), b"{\"half").unwrap();
        fs::write(dir.path().join(".u2.json.tmp"), b"").unwrap();
        let loaded = dir.load("b").unwrap();
        assert_eq!(loaded.notes, []);
        assert_eq!(loaded.claims["u1"].state, PrepareState::PrepareStarted);
        assert_eq!(names(dir.path()), ["u1.json"]);
    }

    #[test]
    fn replace_all_makes_the_directory_hold_exactly_the_claims() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
        dir.load("b").unwrap();
        put(
            &dir,
            "b",
            "old",
            PrepareState::PrepareCompleted,
            Durability::Fsync,
        );
        put(
            &dir,
            "b",
            "kept",
            PrepareState::PrepareStarted,
            Durability::Fsync,
        );
        let claims: BTreeMap<String, ClaimRecord> = [
            ("kept".to_owned(), record(PrepareState::PrepareCompleted)),
            ("new".to_owned(), record(PrepareState::PrepareCompleted)),
        ]
        .into();
        dir.replace_all("b", &claims).unwrap();
        assert_eq!(names(dir.path()), ["kept.json", "new.json"]);
        assert_eq!(dir.load("b").unwrap().claims, claims);
    }

    #[test]
    fn a_failed_write_fails_the_caller_and_changes_nothing_in_memory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
        let records = Records::new(dir.clone(), "b", dir.load("b").unwrap().claims);
        records
            .put(
                "u1",
                record(PrepareState::PrepareStarted),
                Durability::Atomic,
            )
            .unwrap();
        fs::remove_dir_all(dir.path()).unwrap();
        let e = records
            .put(
                "u1",
                record(PrepareState::PrepareCompleted),
                Durability::Fsync,
            )
            .unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "checkpoint {}: cannot write the temporary file",
                dir.record_path("u1").display()
            )),
            "{e}"
        );
        assert_eq!(
            records.claims()["u1"].state,
            PrepareState::PrepareStarted,
            "memory is never ahead of the disk"
        );
        dir.load("b").unwrap();
        records
            .put(
                "u1",
                record(PrepareState::PrepareCompleted),
                Durability::Fsync,
            )
            .unwrap();
        assert_eq!(
            dir.load("b").unwrap().claims["u1"].state,
            PrepareState::PrepareCompleted
        );
    }

    #[test]
    fn records_of_different_claims_are_written_in_parallel() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join(CHECKPOINT_DIR));
        let records = std::sync::Arc::new(Records::new(
            dir.clone(),
            "b",
            dir.load("b").unwrap().claims,
        ));
        // Eight claims recorded from eight threads at once, twenty times each: every file
        // ends with its claim's last record, and the memory agrees with the disk.
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let r = records.clone();
                std::thread::spawn(move || {
                    for round in 0..20 {
                        let uid = format!("u{i}");
                        let state = if round % 2 == 0 {
                            PrepareState::PrepareStarted
                        } else {
                            PrepareState::PrepareCompleted
                        };
                        r.put(&uid, record(state), Durability::Fsync).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let on_disk = dir.load("b").unwrap().claims;
        assert_eq!(on_disk.len(), 8);
        assert_eq!(on_disk, records.claims());
        assert!(
            on_disk
                .values()
                .all(|r| r.state == PrepareState::PrepareCompleted)
        );
        assert_eq!(records.writes(), 160);
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
