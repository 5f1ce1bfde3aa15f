//! One operation per claim at a time: each claim has its own lock, taken by
//! [`Plugin::guarded`] and held by the operation (and its blocking task) that took it;
//! different claims proceed in parallel.

use std::future::Future;
use std::sync::Arc;

use super::{ClaimSource, Plugin, PrepareError, unpoisoned};
use crate::checkpoint::valid_uid;
use crate::edits::ClaimRef;
use crate::metrics::Operation;

/// A claim's lock, held by the operation (and its blocking task) that took it.
pub(super) type ClaimGuard = tokio::sync::OwnedMutexGuard<()>;

impl<S: ClaimSource> Plugin<S> {
    pub(super) fn claim_lock(&self, uid: &str) -> Arc<tokio::sync::Mutex<()>> {
        unpoisoned(&self.locks)
            .entry(uid.to_owned())
            .or_default()
            .clone()
    }

    pub(super) fn release_lock(&self, uid: &str, l: Arc<tokio::sync::Mutex<()>>) {
        let mut locks = unpoisoned(&self.locks);
        // Ours plus the map's: nobody else waits for this claim, and no task of an earlier
        // operation still holds it.
        if Arc::strong_count(&l) == 2 {
            locks.remove(uid);
        }
    }

    /// Runs `work` for `claim` as one operation: refuses a malformed UID, takes the claim's
    /// lock and hands it to `work` (other claims proceed in parallel; `work` passes it on to
    /// its blocking task, so that the lock is held until that task ends even if this future
    /// is dropped), and records the outcome and duration in the metrics.
    pub(super) async fn guarded<T, F, Fut>(
        &self,
        op: Operation,
        claim: &ClaimRef,
        work: F,
    ) -> Result<T, PrepareError>
    where
        F: FnOnce(ClaimGuard) -> Fut,
        Fut: Future<Output = Result<T, PrepareError>>,
    {
        if !valid_uid(&claim.uid) {
            self.metrics
                .observe(op, Some("bad_uid"), Default::default());
            return Err(PrepareError::BadUid {
                claim: claim.key(),
                uid: claim.uid.clone(),
            });
        }
        let started = std::time::Instant::now();
        let l = self.claim_lock(&claim.uid);
        let guard = l.clone().lock_owned().await;
        let result = work(guard).await;
        self.release_lock(&claim.uid, l);
        let reason = result.as_ref().err().map(PrepareError::reason);
        self.metrics.observe(op, reason, started.elapsed());
        result
    }
}
