//! The files a claim gets: its directory (0700) with a state directory (0700) and a limits
//! file (0444), and its CDI spec (0644); written on the blocking pool, removed on
//! unprepare.

use std::path::{Path, PathBuf};

use super::{ClaimSource, Plugin, PrepareError};
use crate::checkpoint::{Durability, create_private_dir, remove_if_present, write_atomic};
use crate::edits::ClaimPaths;

/// A claim's files, written on the blocking pool.
pub(super) struct ClaimFiles {
    /// `namespace/name`, for errors.
    pub(super) claim: String,
    /// Where they go.
    pub(super) paths: ClaimPaths,
    /// The limits file's content.
    pub(super) limits: String,
    /// The CDI spec.
    pub(super) spec: String,
}

impl ClaimFiles {
    /// Creates the claim and state directories (0700) and writes the limits file (0444) and
    /// the CDI spec (0644), each atomically (see [`Durability::Atomic`]
    /// for why not durably: a reboot discards them all).
    pub(super) fn write(self) -> Result<(), PrepareError> {
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
