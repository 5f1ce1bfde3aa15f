//! File primitives the checkpoint and the claims' files share: write-to-temporary and
//! rename (with the fsyncs that make it durable), removal that survives a power loss,
//! private directories, moving a corrupt file aside.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use super::error::{CheckpointError, io_error};
use super::fault::{self, Op};
use super::format::CHECKPOINT_FILE;

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
    if let Err(fault) = fault::check(path, Op::Write) {
        if fault.crash {
            // Torn: the process died while writing the temporary file.
            let _ = fs::write(&tmp, &bytes[..bytes.len() / 2]);
        }
        return Err(("write the temporary file", fault.error));
    }
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

/// Renames a file that does not parse to `<name>.corrupt-<n>` (the first free `n`).
pub(super) fn move_aside(path: &Path) -> Result<PathBuf, CheckpointError> {
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
    fault::check(path, Op::CreateDir).map_err(|f| f.error)?;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o700))
}

/// Removes the file `path` (or the directory tree, with `dir`); absent is fine. Says whether
/// it was there.
pub(crate) fn remove_if_present(path: &Path, dir: bool) -> io::Result<bool> {
    fault::check(path, Op::Remove).map_err(|f| f.error)?;
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

pub(super) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir).and_then(|d| d.sync_all())
}

/// The directory `path` is in (`.` for a bare name).
pub(super) fn parent(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Removes `path` (absent is fine) and, if it was there, fsyncs its directory so that the
/// removal survives a power loss; says whether it was there.
pub(super) fn remove_durably(path: &Path) -> Result<bool, CheckpointError> {
    if !remove_if_present(path, false).map_err(|e| io_error(path, "remove", e))? {
        return Ok(false);
    }
    let dir = parent(path);
    fsync_dir(dir).map_err(|e| io_error(dir, "fsync the directory", e))?;
    Ok(true)
}
