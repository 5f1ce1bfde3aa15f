//! The checkpoint of version 1 (plugins before the checkpoint directory): every claim in
//! one file, `checkpoint.json`, with the same record per claim as version 2. This build
//! only reads it, to migrate it (`Plugin::start`); `save` remains for tests and tools that
//! make one.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::dir::LoadNote;
use super::error::{CheckpointError, io_error};
use super::files::{Durability, move_aside, remove_durably, write_atomic};
use super::format::{CHECKPOINT_VERSION, ClaimRecord};

/// The whole checkpoint of version 1 (one file, [`CheckpointFile`]); version 2 keeps the same
/// claim records, one file each ([`CheckpointDir`](super::CheckpointDir)).
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

/// A checkpoint of version 1: every claim in one file. This build only reads it (to
/// migrate it to a [`CheckpointDir`](super::CheckpointDir)); `save` remains for tests and
/// tools that make one.
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
            Err(source) => return Err(io_error(&self.path, "read", source)),
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
                let moved_to = move_aside(&self.path)?;
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
}
