//! The live record store: the prepared claims in memory, one record file each on disk.
//! Every change after start-up passes through [`Records::apply`], which asks the state
//! machine ([`transition`]), writes the file, and only then changes the memory.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::dir::CheckpointDir;
use super::error::CheckpointError;
use super::files::Durability;
use super::format::ClaimRecord;
use super::state::{ClaimState, Transition, transition};

/// A change to one claim's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Record claim `uid` as `record` (its `state` is the state the claim goes to).
    Put {
        /// The claim's UID.
        uid: String,
        /// The new record.
        record: ClaimRecord,
        /// Whether the write waits for the disk.
        durability: Durability,
    },
    /// Remove claim `uid`'s record, durably (the claim goes to [`ClaimState::Absent`]).
    Remove {
        /// The claim's UID.
        uid: String,
    },
}

impl Change {
    /// The claim changed.
    pub fn uid(&self) -> &str {
        match self {
            Self::Put { uid, .. } | Self::Remove { uid } => uid,
        }
    }

    /// The state the claim goes to.
    pub fn target(&self) -> ClaimState {
        match self {
            Self::Put { record, .. } => record.state.into(),
            Self::Remove { .. } => ClaimState::Absent,
        }
    }

    /// Whether the change leaves the claim as `held` is: a [`Durability::Atomic`] put of the
    /// record already held (nothing to write, no move to check).
    fn is_no_op(&self, held: Option<&ClaimRecord>) -> bool {
        matches!(self, Self::Put { record, durability: Durability::Atomic, .. }
            if held == Some(record))
    }
}

/// What [`Records::apply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Nothing: the record was already held ([`Durability::Atomic`] puts only).
    Unchanged,
    /// The record was written, then held.
    Written(Transition),
    /// The record was removed; `existed` says whether there was one (on disk or in memory).
    Removed {
        /// Whether there was a record.
        existed: bool,
    },
}

/// The prepared claims: in memory, and one record file each in a [`CheckpointDir`].
///
/// [`apply`](Self::apply) (and its shorthands [`put`](Self::put) and
/// [`remove`](Self::remove)) does blocking file I/O (call it on the blocking pool) and
/// changes the in-memory copy only once the file has changed, so the memory never claims
/// more than the disk holds. Records of different claims are different files, so writes of
/// different claims run in parallel and never wait for each other; the caller runs one
/// operation per claim at a time (`crate::prepare` holds the claim's lock).
#[derive(Debug)]
pub struct Records {
    dir: CheckpointDir,
    boot_id: String,
    claims: Mutex<BTreeMap<String, ClaimRecord>>,
    writes: AtomicU64,
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
            claims: Mutex::new(claims),
            writes: AtomicU64::new(0),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &CheckpointDir {
        &self.dir
    }

    /// How many record writes and removals reached the disk so far.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    fn mem(&self) -> MutexGuard<'_, BTreeMap<String, ClaimRecord>> {
        // Every change is a single statement on the map; a panic elsewhere leaves it whole.
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the claims.
    pub fn read<T>(&self, f: impl FnOnce(&BTreeMap<String, ClaimRecord>) -> T) -> T {
        f(&self.mem())
    }

    /// A copy of the claims.
    pub fn claims(&self) -> BTreeMap<String, ClaimRecord> {
        self.mem().clone()
    }

    /// Makes `change` (blocking): refuses a move the state machine does not allow (nothing
    /// is written then), writes or removes the claim's record file, and only then changes
    /// the memory. A [`Durability::Atomic`] put of the record already held writes nothing.
    pub fn apply(&self, change: Change) -> Result<Applied, CheckpointError> {
        let from = {
            let mem = self.mem();
            let held = mem.get(change.uid());
            if change.is_no_op(held) {
                return Ok(Applied::Unchanged);
            }
            ClaimState::of(held)
        };
        let step =
            transition(from, change.target()).map_err(|source| CheckpointError::Refused {
                path: self.dir.record_path(change.uid()),
                source,
            })?;
        match change {
            Change::Put {
                uid,
                record,
                durability,
            } => {
                self.dir.write(&self.boot_id, &uid, &record, durability)?;
                self.writes.fetch_add(1, Ordering::Relaxed);
                self.mem().insert(uid, record);
                Ok(Applied::Written(step))
            }
            Change::Remove { uid } => {
                let on_disk = self.dir.remove(&uid)?;
                if on_disk {
                    self.writes.fetch_add(1, Ordering::Relaxed);
                }
                let in_memory = self.mem().remove(&uid).is_some();
                Ok(Applied::Removed {
                    existed: on_disk || in_memory,
                })
            }
        }
    }

    /// Records claim `uid` as `record` with `durability` (blocking): [`apply`](Self::apply)
    /// of a [`Change::Put`].
    pub fn put(
        &self,
        uid: &str,
        record: ClaimRecord,
        durability: Durability,
    ) -> Result<(), CheckpointError> {
        self.apply(Change::Put {
            uid: uid.to_owned(),
            record,
            durability,
        })
        .map(|_| ())
    }

    /// Removes claim `uid`'s record durably (blocking); says whether there was one:
    /// [`apply`](Self::apply) of a [`Change::Remove`].
    pub fn remove(&self, uid: &str) -> Result<bool, CheckpointError> {
        let applied = self.apply(Change::Remove {
            uid: uid.to_owned(),
        })?;
        Ok(matches!(applied, Applied::Removed { existed: true }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::PrepareState;

    fn record(state: PrepareState) -> ClaimRecord {
        ClaimRecord {
            namespace: "ns".into(),
            name: "c".into(),
            state,
            ..ClaimRecord::default()
        }
    }

    fn put(uid: &str, state: PrepareState) -> Change {
        Change::Put {
            uid: uid.into(),
            record: record(state),
            durability: Durability::Fsync,
        }
    }

    #[test]
    fn a_refused_change_writes_nothing_and_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join("checkpoint"));
        let records = Records::new(dir.clone(), "b", dir.load("b").unwrap().claims);
        let e = records
            .apply(put("u1", PrepareState::PrepareCompleted))
            .unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "checkpoint {}: cannot go from no record to PrepareCompleted",
                dir.record_path("u1").display()
            )),
            "{e}"
        );
        assert!(!dir.record_path("u1").exists());
        assert!(records.claims().is_empty());
        assert_eq!(records.writes(), 0);

        assert_eq!(
            records
                .apply(put("u1", PrepareState::PrepareStarted))
                .unwrap(),
            Applied::Written(Transition::Begin)
        );
        assert_eq!(
            records
                .apply(put("u1", PrepareState::PrepareCompleted))
                .unwrap(),
            Applied::Written(Transition::Complete)
        );
        // A completed claim is not demoted: the record on disk stays PrepareCompleted.
        assert!(matches!(
            records.apply(put("u1", PrepareState::PrepareStarted)),
            Err(CheckpointError::Refused { .. })
        ));
        assert_eq!(
            dir.load("b").unwrap().claims["u1"].state,
            PrepareState::PrepareCompleted
        );
        assert_eq!(records.claims()["u1"].state, PrepareState::PrepareCompleted);
        assert_eq!(records.writes(), 2);
        assert_eq!(
            records.apply(Change::Remove { uid: "u1".into() }).unwrap(),
            Applied::Removed { existed: true }
        );
        assert_eq!(
            records.apply(Change::Remove { uid: "u1".into() }).unwrap(),
            Applied::Removed { existed: false }
        );
    }

    #[test]
    fn an_atomic_repeat_of_the_held_record_is_no_change() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join("checkpoint"));
        let records = Records::new(dir.clone(), "b", dir.load("b").unwrap().claims);
        records
            .apply(put("u1", PrepareState::PrepareStarted))
            .unwrap();
        records
            .apply(put("u1", PrepareState::PrepareCompleted))
            .unwrap();
        let repeat = Change::Put {
            uid: "u1".into(),
            record: record(PrepareState::PrepareCompleted),
            durability: Durability::Atomic,
        };
        assert_eq!(records.apply(repeat).unwrap(), Applied::Unchanged);
        // The same with a wait for the disk is a change: an amendment, written.
        assert_eq!(
            records
                .apply(put("u1", PrepareState::PrepareCompleted))
                .unwrap(),
            Applied::Written(Transition::Amend)
        );
        assert_eq!(records.writes(), 3);
    }
}
