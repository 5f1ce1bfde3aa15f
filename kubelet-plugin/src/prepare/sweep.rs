//! Garbage collection: at start, the files no record accounts for (claims' directories and
//! this driver's CDI specs left by a crash before the record was written, or by a previous
//! boot); while running, claims that no longer exist or were replaced
//! ([`Plugin::cleanup_stale`]).
//!
//! Neither removes live state on weak evidence:
//!
//! * At start, a file is an orphan only when no record of its claim is in the checkpoint
//!   directory, loaded or not: a record that did not parse (moved aside as
//!   `<uid>.json.corrupt-<n>`) keeps its claim's files, and so does a record that the
//!   other front end (sharing the directory) wrote after this one loaded it; after a
//!   corrupt version-1 checkpoint, a marker (`<uid>.json.corrupt-v1`) keeps the files of
//!   every claim nothing else names.
//! * While running, a claim's state is removed only when two sweeps saw it gone (the API
//!   server said that this object does not exist) or replaced (another UID under its
//!   name), with its record unchanged in between. The rule, per recorded claim and sweep:
//!
//!   | the sweep sees | the claim was not a suspect | it was one (same record) |
//!   |---|---|---|
//!   | the claim, same UID | — | no longer a suspect |
//!   | gone, or another UID | a suspect | unprepared |
//!   | an error, a timeout, any 404 that does not name it | — | still a suspect (the error does not count) |
//!
//!   A prepare or an unprepare of the claim clears its suspicion, and so does a change of
//!   its record (the sweep compares the record it suspected). Suspects are kept in memory: a
//!   restart starts over. Only the DRA front end's claims are swept here; the device plugin
//!   sweeps its own ([`crate::device_plugin::stale_claims`]).
//! * Each sweep ends by removing the files of claims that nothing in the checkpoint
//!   directory names (an unprepare that failed after removing the record leaves them), by
//!   the start-up rule, under the claim's lock, never a temporary file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::start::StartReport;
use super::{ClaimSource, Plugin, unpoisoned};
use crate::checkpoint::{ClaimRecord, FrontEnd, remove_if_present, valid_uid};
use crate::edits::ClaimRef;
use crate::metrics::Operation;

/// What [`Plugin::cleanup_stale`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Claims unprepared, `namespace/name (uid)`.
    pub removed: Vec<String>,
    /// Claims seen gone or replaced for the first time, `namespace/name (uid): what was
    /// seen`: unprepared by the next sweep that sees the same.
    pub suspected: Vec<String>,
    /// Files of claims that nothing in the checkpoint directory names any more (left by an
    /// unprepare that failed after removing the record), removed.
    pub removed_files: Vec<PathBuf>,
    /// Claims that could not be checked or removed, with the reason.
    pub errors: Vec<String>,
}

/// What one sweep saw of a recorded claim.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// The claim, with the recorded UID.
    Live,
    /// The API server said that the claim does not exist.
    Gone,
    /// A claim of that name with another UID.
    Replaced(String),
    /// Nothing that tells (an error, a timeout, a 404 that does not name the claim).
    Unknown,
}

/// What a sweep does with a recorded claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// It is live: no longer a suspect.
    Clear,
    /// Nothing changes.
    Keep,
    /// Seen gone or replaced for the first time (or its record changed): a suspect.
    Suspect,
    /// Seen gone or replaced by the previous sweep too, its record unchanged: unprepare it.
    Remove,
}

/// The rule of the module documentation: `suspected` is the record as the previous sweep
/// suspected it (if it did), `now` the record now, `seen` what this sweep saw.
fn judge(suspected: Option<&ClaimRecord>, now: &ClaimRecord, seen: &Seen) -> Verdict {
    match seen {
        Seen::Live => Verdict::Clear,
        Seen::Unknown => Verdict::Keep,
        Seen::Gone | Seen::Replaced(_) if suspected == Some(now) => Verdict::Remove,
        Seen::Gone | Seen::Replaced(_) => Verdict::Suspect,
    }
}

/// The claim a file in the CDI directory belongs to, if it is one of this driver's claim
/// specs (`<spec_prefix><uid>.json`) or the temporary file of an interrupted write of one
/// (`.<spec_prefix><uid>.json.tmp`), and whether it is such a temporary file. Other files
/// are not ours.
fn spec_owner<'a>(name: &'a str, spec_prefix: &str) -> Option<(&'a str, bool)> {
    let (name, tmp) = match name.strip_prefix('.') {
        Some(n) => (n.strip_suffix(".tmp")?, true),
        None => (name, false),
    };
    let uid = name.strip_prefix(spec_prefix)?.strip_suffix(".json")?;
    Some((uid, tmp))
}

/// The claim a file in the checkpoint directory speaks for: its record (`<uid>.json`), the
/// temporary file of a write of it (`.<uid>.json.tmp`), or its record moved aside as corrupt
/// (`<uid>.json.corrupt-<n>`).
fn record_owner(name: &str) -> Option<&str> {
    let name = name.strip_prefix('.').unwrap_or(name);
    let (uid, _) = name.split_once(".json")?;
    valid_uid(uid).then_some(uid)
}

/// Removes `path` (a directory tree with `dir`; absent is fine), noting it in `removed` if
/// it was there, or the failure in `errors`.
fn remove_noting(path: PathBuf, dir: bool, removed: &mut Vec<PathBuf>, errors: &mut Vec<String>) {
    match remove_if_present(&path, dir) {
        Ok(true) => removed.push(path),
        Ok(false) => {}
        Err(e) => errors.push(format!("cannot remove {}: {e}", path.display())),
    }
}

impl<S: ClaimSource> Plugin<S> {
    /// The claims that have a file in the checkpoint directory now (a record, a record being
    /// written, a record moved aside as corrupt), loaded or not.
    fn recorded_on_disk(&self) -> BTreeSet<String> {
        let Ok(entries) = std::fs::read_dir(self.records.dir().path()) else {
            return BTreeSet::new();
        };
        entries
            .flatten()
            .filter_map(|e| record_owner(&e.file_name().to_string_lossy()).map(str::to_owned))
            .collect()
    }

    /// Every claim's file in the claims directories and the CDI directory:
    /// `(claim, path, is a directory, is a temporary file)`.
    fn claim_files(&self) -> Vec<(String, PathBuf, bool, bool)> {
        let spec_prefix = self.cfg.driver.cdi_spec_file_name("");
        let spec_prefix = spec_prefix.trim_end_matches(".json");
        let mut files = Vec::new();
        for claims_dir in self.claims_dirs() {
            if let Ok(entries) = std::fs::read_dir(&claims_dir) {
                for e in entries.flatten() {
                    let uid = e.file_name().to_string_lossy().into_owned();
                    files.push((uid, e.path(), true, false));
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.cfg.cdi_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some((uid, tmp)) = spec_owner(&name, spec_prefix) {
                    files.push((uid.to_owned(), e.path(), false, tmp));
                }
            }
        }
        files
    }

    /// The files and directories no record accounts for, `(path, is a directory)`, and the
    /// ones kept although no loaded record in `known` accounts for them (a record on disk
    /// does: corrupt, or the other front end's).
    fn orphans(
        &self,
        known: &BTreeMap<String, ClaimRecord>,
    ) -> (Vec<(PathBuf, bool)>, Vec<PathBuf>) {
        let files = self.claim_files();
        // Read after the files were listed: a prepare writes its record before the claim's
        // files, so a file listed above whose claim has a record has it on disk by now.
        let on_disk = self.recorded_on_disk();
        let (mut orphans, mut kept) = (Vec::new(), Vec::new());
        for (uid, path, dir, tmp) in files {
            let orphan = if known.contains_key(&uid) {
                // This plugin's claim: its temporary files are of writes a crash interrupted.
                tmp
            } else {
                !on_disk.contains(&uid)
            };
            if orphan {
                orphans.push((path, dir));
            } else if !known.contains_key(&uid) {
                kept.push(path);
            }
        }
        (orphans, kept)
    }

    /// While running: removes the files of claims that nothing in the checkpoint directory
    /// names, as an unprepare that failed after removing the record leaves them (the
    /// record goes first). Each under its claim's lock, checked again there; never a
    /// temporary file (a prepare may be writing it now). Adds what it did to `report`.
    async fn remove_leftovers(&self, report: &mut CleanupReport) {
        let files = self.claim_files();
        let on_disk = self.recorded_on_disk();
        let leftovers = files
            .into_iter()
            .filter(|(uid, _, _, tmp)| !tmp && valid_uid(uid) && !on_disk.contains(uid));
        for (uid, path, dir, _) in leftovers {
            let lock = self.claim_lock(&uid);
            let guard = lock.clone().lock_owned().await;
            if !self.recorded_on_disk().contains(&uid) {
                remove_noting(path, dir, &mut report.removed_files, &mut report.errors);
            }
            drop(guard);
            self.release_lock(&uid, lock);
        }
    }

    /// Writes a marker (`<uid>.json.corrupt-v1`, empty) into the checkpoint directory for
    /// each claim whose files are on the node and which nothing there names: after a
    /// corrupt version-1 checkpoint, any of them may be running. The marker keeps its files
    /// from this and every later start-up sweep (until the run directory goes, at reboot).
    pub(super) fn mark_unrecorded(&self, report: &mut StartReport) {
        let known = self.claims();
        let on_disk = self.recorded_on_disk();
        let uids: BTreeSet<String> = self
            .claim_files()
            .into_iter()
            .filter(|(uid, _, _, tmp)| {
                !tmp && valid_uid(uid) && !known.contains_key(uid) && !on_disk.contains(uid)
            })
            .map(|(uid, ..)| uid)
            .collect();
        for uid in uids {
            let marker = self
                .records
                .dir()
                .path()
                .join(format!("{uid}.json.corrupt-v1"));
            if let Err(e) = std::fs::write(&marker, b"") {
                report
                    .errors
                    .push(format!("cannot write {}: {e}", marker.display()));
            }
        }
    }

    /// Removes claim directories and this driver's CDI specs that no record accounts for
    /// (left by a crash before the record was written, or by a previous boot). Keeps, and
    /// reports, the files of claims whose record is on disk but not loaded (moved aside as
    /// corrupt, or written by the other front end since).
    pub(super) fn remove_orphans(&self, report: &mut StartReport) {
        let (orphans, kept) = self.orphans(&self.claims());
        for (path, dir) in orphans {
            remove_noting(path, dir, &mut report.removed_orphans, &mut report.errors);
        }
        report.kept_unloaded = kept;
    }

    /// What the claim source says of `claim` now, within the configured time; an error is
    /// added to `report`.
    async fn look(&self, claim: &ClaimRef, report: &mut CleanupReport) -> Seen {
        let limit = self.cfg.claim_get_timeout;
        let got = tokio::time::timeout(limit, self.source.get(&claim.namespace, &claim.name))
            .await
            .map_err(|_| format!("no answer within {limit:?}"))
            .and_then(|r| r.map_err(|e| e.to_string()));
        match got {
            Ok(None) => Seen::Gone,
            Ok(Some(c)) if c.metadata.uid == claim.uid => Seen::Live,
            Ok(Some(c)) => Seen::Replaced(c.metadata.uid),
            Err(e) => {
                report.errors.push(format!(
                    "claim {} ({}): cannot read it: {e}; its state is kept",
                    claim.key(),
                    claim.uid
                ));
                Seen::Unknown
            }
        }
    }

    /// Unprepares the DRA claims that two sweeps in a row saw gone or replaced (see the
    /// module documentation for the rule); marks as suspects those seen so for the first
    /// time. Claims that cannot be read are left alone and reported.
    pub async fn cleanup_stale(&self) -> CleanupReport {
        let mut report = CleanupReport::default();
        let records = self.claims();
        unpoisoned(&self.suspects).retain(|uid, _| records.contains_key(uid));
        for (uid, rec) in records {
            if rec.front_end() != FrontEnd::Dra {
                continue;
            }
            let claim = ClaimRef {
                namespace: rec.namespace.clone(),
                name: rec.name.clone(),
                uid,
            };
            let seen = self.look(&claim, &mut report).await;
            let verdict = {
                let mut suspects = unpoisoned(&self.suspects);
                let verdict = judge(suspects.get(&claim.uid), &rec, &seen);
                match verdict {
                    Verdict::Clear => {
                        suspects.remove(&claim.uid);
                    }
                    Verdict::Suspect => {
                        suspects.insert(claim.uid.clone(), rec.clone());
                    }
                    Verdict::Keep | Verdict::Remove => {}
                }
                verdict
            };
            let what = match &seen {
                Seen::Replaced(other) => format!("replaced by uid {other}"),
                _ => "not found".to_owned(),
            };
            match verdict {
                Verdict::Suspect => {
                    report
                        .suspected
                        .push(format!("{} ({}): {what}", claim.key(), claim.uid))
                }
                Verdict::Remove => match self.remove_suspect(&claim, &rec).await {
                    Ok(true) => report
                        .removed
                        .push(format!("{} ({})", claim.key(), claim.uid)),
                    Ok(false) => {}
                    Err(e) => report.errors.push(e.to_string()),
                },
                Verdict::Clear | Verdict::Keep => {}
            }
        }
        self.remove_leftovers(&mut report).await;
        report
    }

    /// Unprepares `claim` if, under its lock, it is still a suspect with record `rec` (a
    /// prepare that ran since cleared it); says whether it did.
    async fn remove_suspect(
        &self,
        claim: &ClaimRef,
        rec: &ClaimRecord,
    ) -> Result<bool, super::PrepareError> {
        self.guarded(Operation::Unprepare, claim, |guard| async move {
            let suspected = unpoisoned(&self.suspects).get(&claim.uid) == Some(rec);
            let unchanged = self.records.read(|c| c.get(&claim.uid) == Some(rec));
            if !(suspected && unchanged) {
                return Ok(false);
            }
            self.unprepare_locked(claim, guard).await.map(|()| true)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_drivers_specs_belong_to_claims() {
        let prefix = "gpu.fgpu.dev-claim_";
        let owner = |name| spec_owner(name, prefix);
        assert_eq!(
            owner("gpu.fgpu.dev-claim_uid-1.json"),
            Some(("uid-1", false))
        );
        assert_eq!(
            owner(".gpu.fgpu.dev-claim_uid-1.json.tmp"),
            Some(("uid-1", true)),
            "an interrupted write"
        );
        assert_eq!(owner("nvidia.yaml"), None, "another vendor's spec");
        assert_eq!(
            owner("other.dev-claim_uid-2.json"),
            None,
            "another driver's spec"
        );
        assert_eq!(
            owner(".other.json.tmp"),
            None,
            "another writer's temporary file"
        );
        assert_eq!(
            owner(".gpu.fgpu.dev-claim_uid-1.json"),
            None,
            "not a temporary file"
        );
    }

    #[test]
    fn checkpoint_files_name_their_claim() {
        assert_eq!(record_owner("uid-1.json"), Some("uid-1"));
        assert_eq!(record_owner(".uid-1.json.tmp"), Some("uid-1"));
        assert_eq!(record_owner("uid-1.json.corrupt-2"), Some("uid-1"));
        assert_eq!(record_owner("checkpoint.json"), Some("checkpoint"));
        assert_eq!(record_owner("not a uid.json"), None);
        assert_eq!(record_owner("uid-1"), None);
    }

    #[test]
    fn two_sightings_with_the_same_record_remove_and_anything_live_clears() {
        let rec = ClaimRecord {
            name: "c".into(),
            ..ClaimRecord::default()
        };
        let changed = ClaimRecord {
            state: crate::checkpoint::PrepareState::PrepareCompleted,
            ..rec.clone()
        };
        let gone = Seen::Gone;
        let replaced = Seen::Replaced("u2".into());
        assert_eq!(judge(None, &rec, &gone), Verdict::Suspect);
        assert_eq!(judge(None, &rec, &replaced), Verdict::Suspect);
        assert_eq!(judge(Some(&rec), &rec, &gone), Verdict::Remove);
        assert_eq!(judge(Some(&rec), &rec, &replaced), Verdict::Remove);
        assert_eq!(
            judge(Some(&rec), &changed, &gone),
            Verdict::Suspect,
            "a changed record starts over"
        );
        assert_eq!(judge(Some(&rec), &rec, &Seen::Live), Verdict::Clear);
        assert_eq!(judge(None, &rec, &Seen::Live), Verdict::Clear);
        assert_eq!(judge(Some(&rec), &rec, &Seen::Unknown), Verdict::Keep);
        assert_eq!(judge(None, &rec, &Seen::Unknown), Verdict::Keep);
    }
}
