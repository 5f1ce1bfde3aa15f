//! The first half of a prepare, without side effects: read the claim (with a time limit),
//! check that it is the one the kubelet asked for, resolve its grants, place them on this
//! node's GPUs and build what it gets (its record, its CDI spec, its limits file).

use std::sync::Arc;

use fgpu_driver::device::NodeInventory;

use super::files::ClaimFiles;
use super::{ClaimSource, Plugin, PrepareError, SourceError, unpoisoned};
use crate::checkpoint::{ClaimRecord, PrepareState, PreparedDevice};
use crate::claim::ResourceClaim;
use crate::edits::{self, ClaimRef, EditsError, PlannedDevice};
use crate::grant;

/// What a prepare writes for a claim, built before anything is written.
pub(super) struct Built {
    /// The claim's `PrepareStarted` record (with the devices).
    pub(super) started: ClaimRecord,
    /// Its files.
    pub(super) files: ClaimFiles,
    /// The devices returned to the kubelet.
    pub(super) devices: Vec<PreparedDevice>,
}

/// Refuses a claim that is not the one the kubelet asked for (deleted and recreated under
/// the same name).
pub(super) fn check_uid(claim: &ClaimRef, object: &ResourceClaim) -> Result<(), PrepareError> {
    if object.metadata.uid == claim.uid {
        return Ok(());
    }
    Err(PrepareError::UidMismatch {
        claim: claim.key(),
        expected: claim.uid.clone(),
        found: object.metadata.uid.clone(),
    })
}

impl<S: ClaimSource> Plugin<S> {
    /// The claim as the source has it, within the configured time (the source's answer is
    /// counted in the metrics); an error if it does not exist.
    pub(super) async fn read_claim(&self, claim: &ClaimRef) -> Result<ResourceClaim, PrepareError> {
        let get = self
            .source
            .get_for_prepare(&claim.namespace, &claim.name, &claim.uid);
        let limit = self.cfg.claim_get_timeout;
        let (object, read) = tokio::time::timeout(limit, get)
            .await
            .unwrap_or_else(|_| Err(SourceError(format!("no answer within {limit:?}"))))
            .map_err(|source| PrepareError::Source {
                claim: claim.key(),
                source,
            })?;
        self.metrics.observe_claim_read(read);
        object.ok_or_else(|| PrepareError::NotFound { claim: claim.key() })
    }

    /// The node's GPUs: the last reading unless `fresh`, else the backend's now; says
    /// whether it was the last reading.
    fn inventory(
        &self,
        claim: &ClaimRef,
        fresh: bool,
    ) -> Result<(Arc<NodeInventory>, bool), PrepareError> {
        if !fresh && let Some(inv) = unpoisoned(&self.inventory).clone() {
            return Ok((inv, true));
        }
        let inv =
            self.backend
                .inventory(&self.cfg.node_name)
                .map_err(|e| PrepareError::Backend {
                    claim: claim.key(),
                    detail: e.to_string(),
                })?;
        let inv = Arc::new(inv);
        *unpoisoned(&self.inventory) = Some(inv.clone());
        Ok((inv, false))
    }

    /// The claim's grants placed on this node's GPUs: on the last reading of them, and on
    /// a new one where the last reading does not list a device.
    fn plan(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Vec<PlannedDevice>, PrepareError> {
        let resolved = grant::resolve(object, self.cfg.driver.as_str())?;
        let (inventory, cached) = self.inventory(claim, false)?;
        match edits::plan(claim, &resolved, &inventory) {
            // A device the last reading did not list: read the backend again.
            Err(EditsError::UnknownDevice { .. }) if cached => Ok(edits::plan(
                claim,
                &resolved,
                &self.inventory(claim, true)?.0,
            )?),
            r => Ok(r?),
        }
    }

    /// Everything a prepare of `claim` (read as `object`) writes, built in memory.
    pub(super) fn build(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Built, PrepareError> {
        let planned = self.plan(claim, object)?;
        let paths = self.paths(&claim.uid);
        let built = edits::build(&self.cfg.driver, claim, &planned, &self.cfg.files, &paths)?;
        let spec = built.spec.to_json().map_err(|source| EditsError::Cdi {
            claim: claim.key(),
            source,
        })?;
        let started = ClaimRecord {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: PrepareState::PrepareStarted,
            spec_file: paths.spec_file.clone(),
            claim_dir: paths.claim_dir.clone(),
            devices: built.devices.clone(),
        };
        Ok(Built {
            started,
            files: ClaimFiles {
                claim: claim.key(),
                paths,
                limits: built.limits,
                gpu_uuids: built.gpus.iter().map(|g| g.uuid.clone()).collect(),
                spec,
            },
            devices: built.devices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_of_another_uid_is_refused() {
        let claim = ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "uid-1".into(),
        };
        let mut object: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"}
        }))
        .unwrap();
        check_uid(&claim, &object).unwrap();
        object.metadata.uid = "uid-2".into();
        let e = check_uid(&claim, &object).unwrap_err();
        assert_eq!(e.reason(), "uid_mismatch");
        assert!(
            e.to_string()
                .starts_with("claim ns/c: metadata.uid is uid-2, the kubelet asked for uid-1"),
            "{e}"
        );
    }
}
