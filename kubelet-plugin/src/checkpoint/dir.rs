//! The record store on disk: the checkpoint directory, one record file per claim
//! (`<dir>/<uid>.json`), loaded tolerantly and written atomically. It knows files, not the
//! state machine: live changes reach it through [`Records::apply`](super::Records::apply).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::error::{CheckpointError, io_error};
use super::files::{
    Durability, create_private_dir, fsync_dir, move_aside, parent, remove_durably,
    remove_if_present, write_atomic,
};
use super::format::{ClaimRecord, decode_record, encode_record, valid_uid};

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

/// What [`CheckpointDir::load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The claims of this boot, by UID.
    pub claims: BTreeMap<String, ClaimRecord>,
    /// What was noteworthy: no directory yet, records that did not parse (one note each),
    /// records of another boot (one note for all).
    pub notes: Vec<LoadNote>,
}

/// What a file in the checkpoint directory is, by its name.
#[derive(Debug, PartialEq, Eq)]
enum Entry<'a> {
    /// The temporary file of an interrupted write: the record it replaced (if any) is
    /// still in place.
    Interrupted,
    /// The record file of claim `uid`.
    Record(&'a str),
    /// Anything else (moved-aside files): left alone.
    Other,
}

impl<'a> Entry<'a> {
    fn of(name: &'a str) -> Self {
        if name.starts_with('.') && name.ends_with(".tmp") {
            return Self::Interrupted;
        }
        match name.strip_suffix(".json").filter(|u| valid_uid(u)) {
            Some(uid) => Self::Record(uid),
            None => Self::Other,
        }
    }
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
            let uid = match Entry::of(&name) {
                Entry::Interrupted => {
                    remove_if_present(&path, false).map_err(|e| io_error(&path, "remove", e))?;
                    continue;
                }
                Entry::Other => continue,
                Entry::Record(uid) => uid,
            };
            let parsed = match fs::read(&path) {
                Ok(text) => decode_record(uid, &text),
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => Err(super::format::BadRecord::Unreadable(e)),
            };
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
                    let error = error.to_string();
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
        let bytes =
            encode_record(boot_id, uid, record).map_err(|source| CheckpointError::Encode {
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
    /// checkpoint, whose claims are then the whole state (before [`Records`](super::Records)
    /// opens over the directory).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_told_apart_by_name() {
        assert_eq!(Entry::of(".u1.json.tmp"), Entry::Interrupted);
        assert_eq!(Entry::of("u1.json"), Entry::Record("u1"));
        for other in ["u1.json.corrupt-1", "not a uid.json", ".json", "u1"] {
            assert_eq!(Entry::of(other), Entry::Other, "{other:?}");
        }
    }
}
