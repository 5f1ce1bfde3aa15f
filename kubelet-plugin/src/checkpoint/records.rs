//! The live record store: the prepared claims in memory, one record file each on disk; the
//! memory changes only after the file did.

use super::dir::CheckpointDir;
use super::error::CheckpointError;
use super::files::Durability;
use super::format::ClaimRecord;
use std::collections::BTreeMap;

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
