//! Garbage collection: at start, the files no record accounts for (claims' directories and
//! this driver's CDI specs left by a crash before the record was written, or by a previous
//! boot); while running, claims that no longer exist or were replaced
//! ([`Plugin::cleanup_stale`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::start::StartReport;
use super::{ClaimSource, Plugin};
use crate::checkpoint::{ClaimRecord, remove_if_present};
use crate::edits::ClaimRef;

/// What [`Plugin::cleanup_stale`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CleanupReport {
    /// Claims unprepared, `namespace/name (uid)`.
    pub removed: Vec<String>,
    /// Claims that could not be checked or removed, with the reason.
    pub errors: Vec<String>,
}

/// Whether the file `name` in the CDI directory is a leftover: a temporary file of an
/// interrupted write of one of this driver's specs (`.<spec>.tmp`), or this driver's spec
/// (`<spec_prefix><uid>.json`) of a claim not in `known`. Other files are not ours.
fn is_orphan_spec(name: &str, spec_prefix: &str, known: &BTreeMap<String, ClaimRecord>) -> bool {
    let interrupted = name
        .strip_prefix('.')
        .is_some_and(|n| n.starts_with(spec_prefix) && n.ends_with(".json.tmp"));
    let uid = name
        .strip_prefix(spec_prefix)
        .and_then(|r| r.strip_suffix(".json"));
    interrupted || uid.is_some_and(|uid| !known.contains_key(uid))
}

impl<S: ClaimSource> Plugin<S> {
    /// The files and directories no record in `known` accounts for, `(path, is a directory)`.
    fn orphans(&self, known: &BTreeMap<String, ClaimRecord>) -> Vec<(PathBuf, bool)> {
        let spec_prefix = self.cfg.driver.cdi_spec_file_name("");
        let spec_prefix = spec_prefix.trim_end_matches(".json");
        let mut candidates = Vec::new();
        for claims_dir in self.claims_dirs() {
            if let Ok(entries) = std::fs::read_dir(&claims_dir) {
                for e in entries.flatten() {
                    let uid = e.file_name().to_string_lossy().into_owned();
                    if !known.contains_key(&uid) {
                        candidates.push((e.path(), true));
                    }
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&self.cfg.cdi_dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if is_orphan_spec(&name, spec_prefix, known) {
                    candidates.push((e.path(), false));
                }
            }
        }
        candidates
    }

    /// Removes claim directories and this driver's CDI specs that no entry accounts for
    /// (left by a crash before the entry was written, or by a previous boot).
    pub(super) fn remove_orphans(&self, report: &mut StartReport) {
        for (path, dir) in self.orphans(&self.claims()) {
            match remove_if_present(&path, dir) {
                Ok(true) => report.removed_orphans.push(path),
                Ok(false) => {}
                Err(e) => report
                    .errors
                    .push(format!("cannot remove {}: {e}", path.display())),
            }
        }
    }

    /// Unprepares every recorded claim that no longer exists or now has another UID.
    /// Claims that cannot be read are left alone and reported.
    pub async fn cleanup_stale(&self) -> CleanupReport {
        let mut report = CleanupReport::default();
        for (uid, rec) in self.claims() {
            let claim = ClaimRef {
                namespace: rec.namespace,
                name: rec.name,
                uid,
            };
            let stale = match self.source.get(&claim.namespace, &claim.name).await {
                Ok(None) => true,
                Ok(Some(c)) => c.metadata.uid != claim.uid,
                Err(e) => {
                    report
                        .errors
                        .push(format!("claim {}: cannot read it: {e}", claim.key()));
                    continue;
                }
            };
            if stale {
                match self.unprepare(&claim).await {
                    Ok(()) => report
                        .removed
                        .push(format!("{} ({})", claim.key(), claim.uid)),
                    Err(e) => report.errors.push(e.to_string()),
                }
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_drivers_specs_of_unknown_claims_are_orphans() {
        let prefix = "gpu.fgpu.dev-claim_";
        let known: BTreeMap<String, ClaimRecord> =
            [("uid-1".to_owned(), ClaimRecord::default())].into();
        let orphan = |name| is_orphan_spec(name, prefix, &known);
        assert!(!orphan("gpu.fgpu.dev-claim_uid-1.json"), "a recorded claim");
        assert!(orphan("gpu.fgpu.dev-claim_uid-2.json"), "an unknown claim");
        assert!(
            orphan(".gpu.fgpu.dev-claim_uid-1.json.tmp"),
            "an interrupted write"
        );
        assert!(!orphan("nvidia.yaml"), "another vendor's spec");
        assert!(
            !orphan("other.dev-claim_uid-2.json"),
            "another driver's spec"
        );
        assert!(
            !orphan(".other.json.tmp"),
            "another writer's temporary file"
        );
    }
}
