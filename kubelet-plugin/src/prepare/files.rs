//! The files a claim gets (`docs/shim-contract.md`): its directory (0700) with
//!
//! * `limits` (0444), the limits file;
//! * `state/` (0700) with the accounts `memory.state` and `core.state`, zero-filled at the
//!   shim's sizes, 0666 (any UID in the claim's containers uses them: they are mounted one
//!   by one, and reachable only through those mounts, never through the 0700 directory);
//! * `feed/` (0755), empty: the node monitor writes the utilisation feed there;
//!
//! the GPUs' priority files in the node's GPU directory (0755; files 0666, 64 bytes,
//! created once per GPU, kept across claims), and the CDI spec (0644). Written on the
//! blocking pool; the claim's directory and spec are removed on unprepare.

use std::io;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use fgpu_api::names::contract;

use super::{ClaimSource, Plugin, PrepareError};
use crate::checkpoint::{Durability, create_private_dir, remove_if_present, write_atomic};
use crate::edits::{self, ClaimPaths, FEED_DIR_MODE};

/// Serialises the creation of the node's priority files (prepares of claims on one GPU run
/// in parallel).
static PRIORITY_FILES: Mutex<()> = Mutex::new(());

/// Creates `path` (and its parents) with exactly `mode`.
fn create_dir_mode(path: &Path, mode: u32) -> io::Result<()> {
    crate::checkpoint::fault::check(path, crate::checkpoint::fault::Op::CreateDir)
        .map_err(|f| f.error)?;
    std::fs::create_dir_all(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Whether `meta` is a usable priority file: a regular file (not a link) of the plugin's
/// user, 64 bytes.
fn is_priority_file(meta: &std::fs::Metadata) -> bool {
    meta.file_type().is_file() && meta.len() == contract::PRIORITY_FILE_SIZE && meta.uid() == euid()
}

/// The plugin's effective user id.
fn euid() -> u32 {
    // The owner of a file the plugin just created is its effective uid; reading it from
    // /proc/self avoids an unsafe call.
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}

/// Makes `path` a priority file: kept when it already is one (running containers have it
/// mounted; its mode is set to 0666 again), replaced when it is anything else (a link, a
/// directory, a file of another size or user), created zero-filled when missing.
pub(crate) fn ensure_priority_file(path: &Path) -> Result<(), (&'static str, io::Error)> {
    let _guard = PRIORITY_FILES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match std::fs::symlink_metadata(path) {
        Ok(m) if is_priority_file(&m) => {
            if m.permissions().mode() & 0o7777 != contract::SHARED_FILE_MODE {
                std::fs::set_permissions(
                    path,
                    std::fs::Permissions::from_mode(contract::SHARED_FILE_MODE),
                )
                .map_err(|e| ("set the mode of", e))?;
            }
            return Ok(());
        }
        Ok(m) if m.file_type().is_dir() => {
            std::fs::remove_dir_all(path).map_err(|e| ("remove the directory at", e))?
        }
        Ok(_) | Err(_) => {}
    }
    // A rename replaces a link itself, never its target.
    write_atomic(
        path,
        &[0u8; contract::PRIORITY_FILE_SIZE as usize],
        contract::SHARED_FILE_MODE,
        Durability::Atomic,
    )
}

/// Removes from the node's GPU directory whatever is not a priority file the plugin made
/// (links, directories and files a shim of an older release or a tenant left there while
/// it was world-writable), and sets the directory's mode to [`edits::GPU_DIR_MODE`].
/// Returns what it removed.
pub(crate) fn clean_gpu_dir(dir: &Path) -> io::Result<Vec<PathBuf>> {
    create_dir_mode(dir, edits::GPU_DIR_MODE)?;
    let mut removed = Vec::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let ok = name.starts_with("GPU-")
            && name.ends_with(".priority")
            && std::fs::symlink_metadata(&path).is_ok_and(|m| is_priority_file(&m));
        if !ok {
            let dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_dir());
            remove_if_present(&path, dir)?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// A claim's files, written on the blocking pool.
pub(super) struct ClaimFiles {
    /// `namespace/name`, for errors.
    pub(super) claim: String,
    /// Where they go.
    pub(super) paths: ClaimPaths,
    /// The limits file's content.
    pub(super) limits: String,
    /// The claim's GPUs (UUIDs), whose priority files it mounts.
    pub(super) gpu_uuids: Vec<String>,
    /// The CDI spec.
    pub(super) spec: String,
}

impl ClaimFiles {
    /// Creates the claim and state directories (0700) and the feed directory (0755), the
    /// accounts (0666, zero-filled), the GPUs' priority files where missing, and writes the
    /// limits file (0444) and the CDI spec (0644), each atomically (see
    /// [`Durability::Atomic`] for why not durably: a reboot discards them all). The spec is
    /// written last: the runtime finds nothing before every file it mounts exists.
    pub(super) fn write(self) -> Result<(), PrepareError> {
        let Self {
            claim,
            paths,
            limits,
            gpu_uuids,
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
        create_dir_mode(&paths.feed_dir, FEED_DIR_MODE).map_err(io("create", &paths.feed_dir))?;
        create_dir_mode(&paths.gpu_dir, edits::GPU_DIR_MODE)
            .map_err(io("create", &paths.gpu_dir))?;
        for uuid in &gpu_uuids {
            let path = edits::priority_file(&paths.gpu_dir, uuid);
            ensure_priority_file(&path).map_err(|(op, source)| PrepareError::Io {
                claim: claim.clone(),
                op,
                path: path.clone(),
                source,
            })?;
        }
        let memory = vec![0u8; contract::MEMORY_ACCOUNT_SIZE as usize];
        let core = vec![0u8; contract::CORE_ACCOUNT_SIZE as usize];
        for (path, bytes, mode) in [
            (
                &paths.memory_account,
                &memory[..],
                contract::SHARED_FILE_MODE,
            ),
            (&paths.core_account, &core[..], contract::SHARED_FILE_MODE),
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
pub(super) fn remove_claim_files(
    claim: &str,
    paths: &[(PathBuf, bool)],
) -> Result<(), PrepareError> {
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

impl<S: ClaimSource> Plugin<S> {
    /// Everything of claim `uid` to remove on unprepare: its CDI spec, its directory, and
    /// its directory under the state root (claims prepared before the run root existed).
    /// Derived from the UID, never taken from the checkpoint, so that a damaged checkpoint
    /// cannot point the removal elsewhere.
    pub(super) fn removable(&self, uid: &str) -> Vec<(PathBuf, bool)> {
        let paths = self.paths(uid);
        let mut v = vec![(paths.spec_file, false)];
        v.extend(self.claims_dirs().into_iter().map(|d| (d.join(uid), true)));
        v
    }
}
