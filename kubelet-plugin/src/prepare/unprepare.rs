//! The unprepare operation ([`Plugin::unprepare`]): the claim's MIG instances are
//! destroyed first (while its record still names them), then the record is removed
//! (durably), then its files; it succeeds for a claim that is not (or no longer) prepared.

use std::io;

use super::files::remove_claim_files;
use super::lock::ClaimGuard;
use super::{ClaimSource, Plugin, PrepareError, unpoisoned};
use crate::checkpoint::Change;
use crate::edits::ClaimRef;
use crate::metrics::Operation;

impl<S: ClaimSource> Plugin<S> {
    /// Undoes [`prepare`](Self::prepare): removes the CDI spec, the claim directory and the
    /// checkpoint entry. Succeeds for a claim that is not (or no longer) prepared.
    pub async fn unprepare(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        self.guarded(Operation::Unprepare, claim, |guard| {
            self.unprepare_locked(claim, guard)
        })
        .await
    }

    pub(super) async fn unprepare_locked(
        &self,
        claim: &ClaimRef,
        guard: ClaimGuard,
    ) -> Result<(), PrepareError> {
        // Before anything else (and under the claim's lock): whatever happens below, the
        // next prepare of this UID must not trust a cached allocation.
        self.source.unprepared(&claim.uid);
        unpoisoned(&self.suspects).remove(&claim.uid);
        let paths = self.removable(&claim.uid);
        let key = claim.key();
        let records = self.records.clone();
        let uid = claim.uid.clone();
        let limits = self.cfg.files.memory_limits.clone();
        let backend = self.backend.clone();
        // The record first (durably), then the files: a crash in between leaves files no
        // record accounts for, which the start-up sweep removes (and the kubelet's retry of
        // the unprepare too). The other order would leave a `PrepareCompleted` record whose
        // CDI spec is gone, which a later prepare of the claim would return as prepared.
        let removed = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            // The instances before the record: a failure leaves the record naming them for
            // the retry; a crash after it leaves a record of instances already gone, which
            // the retry (destroying what is gone is success) and the reconcile handle.
            Self::destroy_instances(backend.as_ref(), &records, &key, &uid)?;
            records
                .apply(Change::Remove { uid: uid.clone() })
                .map_err(|source| PrepareError::Checkpoint {
                    claim: key.clone(),
                    source,
                })?;
            // The driver's limits the claim's containers got, before their records go with
            // the claim's directory.
            #[cfg(feature = "nvml")]
            if let Some(hook) = &limits {
                let r = crate::driver_limits::release_claim(hook, &uid);
                for (gpu, cgroup) in &r.cleared {
                    tracing::info!(claim = %key, gpu = %gpu, cgroup = %cgroup.display(),
                        "driver memory limit cleared");
                }
                for e in &r.errors {
                    tracing::warn!(claim = %key, error = %e, "cannot clear a driver memory limit");
                }
            }
            #[cfg(not(feature = "nvml"))]
            let _ = limits;
            remove_claim_files(&key, &paths)
        })
        .await
        .map_err(|e| PrepareError::Io {
            claim: claim.key(),
            op: "remove the claim's files",
            path: self.paths(&claim.uid).claim_dir,
            source: io::Error::other(e),
        })?;
        self.refresh_claim_metrics();
        removed
    }
}
