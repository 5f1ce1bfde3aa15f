//! The first half of a prepare, without side effects: read the claim (with a time limit),
//! check that it is the one the kubelet asked for, resolve its grants, place them on this
//! node's GPUs and build what it gets (its record, its CDI spec, its limits file).

use std::sync::Arc;

use fgpu_api::names::{self, DriverName};
use fgpu_driver::device::NodeInventory;

use super::files::ClaimFiles;
use super::{ClaimSource, Plugin, PrepareError, SourceError, unpoisoned};
use crate::checkpoint::{ClaimRecord, PrepareState, PreparedDevice};
use crate::claim::ResourceClaim;
use crate::edits::{self, ClaimPaths, ClaimRef, EditsError, NodeFiles, PlannedDevice};
use crate::grant;

/// What a prepare writes for a claim, built before anything is written.
pub(super) struct Built {
    /// The claim's `PrepareStarted` record (with the devices).
    pub(super) started: ClaimRecord,
    /// Its files (`None` for a claim of MIG instances: its spec names them, so it is built
    /// once they exist).
    pub(super) files: Option<ClaimFiles>,
    /// The devices returned to the kubelet (for MIG: as intended, without instances).
    pub(super) devices: Vec<PreparedDevice>,
    /// A claim of MIG instances: its devices, each to be given its instance.
    pub(super) mig: Option<Vec<PlannedDevice>>,
}

/// What a claim's files are built from.
#[derive(Clone)]
pub(super) struct FileInputs {
    /// The driver name.
    pub(super) driver: DriverName,
    /// The claim.
    pub(super) claim: ClaimRef,
    /// Files every claim gets.
    pub(super) node: NodeFiles,
    /// Where the claim's files go.
    pub(super) paths: ClaimPaths,
}

impl FileInputs {
    /// The claim's files and its devices for the kubelet, from its placed devices.
    pub(super) fn build(
        &self,
        planned: &[PlannedDevice],
    ) -> Result<(ClaimFiles, Vec<PreparedDevice>), PrepareError> {
        let claim = &self.claim;
        let built = edits::build(&self.driver, claim, planned, &self.node, &self.paths)?;
        let spec = built.spec.to_json().map_err(|source| EditsError::Cdi {
            claim: claim.key(),
            source,
        })?;
        let files = ClaimFiles {
            claim: claim.key(),
            paths: self.paths.clone(),
            limits: built.limits,
            gpu_uuids: built.gpus.iter().map(|g| g.uuid.clone()).collect(),
            spec,
        };
        Ok((files, built.devices))
    }
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
        let mut planned = match edits::plan(claim, &resolved, &inventory) {
            // A device the last reading did not list: read the backend again.
            Err(EditsError::UnknownDevice { .. }) if cached => {
                edits::plan(claim, &resolved, &self.inventory(claim, true)?.0)?
            }
            r => r?,
        };
        let results: Vec<usize> = resolved.iter().map(|r| r.index).collect();
        crate::tier::check(claim, &mut planned, &results, &self.gpu_tiers())?;
        Ok(planned)
    }

    /// Everything a prepare of `claim` (read as `object`) writes, built in memory; for a
    /// claim of MIG instances, what its record says before they exist.
    pub(super) fn build(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
    ) -> Result<Built, PrepareError> {
        let planned = self.plan(claim, object)?;
        self.check_mig_modes(claim, &planned)?;
        let inputs = self.file_inputs(claim);
        let mut started = ClaimRecord {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: PrepareState::PrepareStarted,
            spec_file: inputs.paths.spec_file.clone(),
            claim_dir: inputs.paths.claim_dir.clone(),
            devices: Vec::new(),
        };
        if planned.iter().any(|d| d.mig.is_some()) {
            let mut devices: Vec<PreparedDevice> = planned
                .iter()
                .map(|d| {
                    let name = names::cdi_device_name(&claim.uid, &d.device, d.share_id.as_deref());
                    edits::prepared_device(&self.cfg.driver, &name, d, &self.cfg.files)
                })
                .collect();
            let previous = self.records.read(|c| c.get(&claim.uid).cloned());
            super::mig::intents(&mut devices, previous.as_ref());
            started.devices = devices.clone();
            return Ok(Built {
                started,
                files: None,
                devices,
                mig: Some(planned),
            });
        }
        let (files, devices) = inputs.build(&planned)?;
        started.devices = devices.clone();
        Ok(Built {
            started,
            files: Some(files),
            devices,
            mig: None,
        })
    }

    /// What `claim`'s files are built from.
    pub(super) fn file_inputs(&self, claim: &ClaimRef) -> FileInputs {
        FileInputs {
            driver: self.cfg.driver.clone(),
            claim: claim.clone(),
            node: self.cfg.files.clone(),
            paths: self.paths(&claim.uid),
        }
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
