//! MIG instances of prepared claims: created at prepare, destroyed at unprepare, and
//! reconciled with the checkpoint at start (`docs/mig.md`, Prepare).
//!
//! A claim's record names each MIG device's instance ([`MigIntent`]): first the profile
//! and placement (before the backend is asked), then the instance's UUID. So whatever a
//! crash interrupts, every instance the plugin made is named by a record, by its UUID or
//! by its placement:
//!
//! * prepare finds an instance of the claim before creating one: the recorded UUID, else
//!   an instance of the profile at the placement that no other claim names;
//! * unprepare destroys the instances before the record goes (one already gone is fine);
//! * the start-up reconcile ([`Plugin::reconcile_mig`]) destroys instances no record
//!   names, and creates again at its placement the instance of a `PrepareCompleted` claim
//!   that vanished (or marks it lost, so that the claim's next prepare fails with why).

use std::collections::BTreeMap;
use std::sync::Arc;

use fgpu_driver::backend::{BackendError, DeviceBackend};
use fgpu_driver::device::{GpuMode, NodeInventory, TierRatio};
use fgpu_driver::mig::{MigInstance, Placement};

use super::{ClaimSource, Plugin, PrepareError, unpoisoned};
use crate::checkpoint::{
    Change, ClaimRecord, Durability, MigIntent, PrepareState, PreparedDevice, Records, write_atomic,
};
use crate::edits::{self, ClaimRef, PlannedDevice, PlannedMig};

/// What [`Plugin::reconcile_mig`] found and did, for logs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MigReconcile {
    /// Instances no record named, destroyed: (GPU UUID, instance UUID).
    pub destroyed: Vec<(String, String)>,
    /// Claims (`namespace/name`, device) whose vanished instance was created again.
    pub recreated: Vec<(String, String)>,
    /// Claims (`namespace/name`, device) whose vanished instance could not be created
    /// again: marked lost.
    pub lost: Vec<(String, String)>,
    /// What failed (the plugin still starts).
    pub errors: Vec<String>,
}

impl<S: ClaimSource> Plugin<S> {
    /// Sets the GPU modes in force (by UUID), as the publisher settled them; a prepare
    /// of a MIG placement checks its GPU's mode here. Until this is called the backend's
    /// own mode is taken (the fake profile's `mode:`).
    pub fn set_gpu_modes(&self, modes: BTreeMap<String, GpuMode>) {
        *unpoisoned(&self.gpu_modes) = Some(modes);
    }

    /// Sets the research tier's ratios in force (by UUID), as the tier keeper settled
    /// them; a prepare keeps the tiers apart by them ([`crate::tier::check`]).
    pub fn set_gpu_tiers(&self, tiers: BTreeMap<String, TierRatio>) {
        self.metrics.set_gpu_tiers(&tiers);
        *unpoisoned(&self.gpu_tiers) = tiers;
    }

    /// The research tier's ratios in force, by UUID.
    pub fn gpu_tiers(&self) -> BTreeMap<String, TierRatio> {
        unpoisoned(&self.gpu_tiers).clone()
    }

    /// The mode of the GPU `uuid`: as last set, else the backend's, else `shared`.
    fn gpu_mode(&self, uuid: &str) -> GpuMode {
        if let Some(m) = unpoisoned(&self.gpu_modes).as_ref() {
            return m.get(uuid).copied().unwrap_or_default();
        }
        self.backend.gpu_mode(uuid).unwrap_or_default()
    }

    /// Refuses MIG placements of GPUs that are not in `mig` mode.
    pub(super) fn check_mig_modes(
        &self,
        claim: &ClaimRef,
        planned: &[PlannedDevice],
    ) -> Result<(), PrepareError> {
        for d in planned.iter().filter(|d| d.mig.is_some()) {
            let mode = self.gpu_mode(&d.gpu.uuid);
            if mode != GpuMode::Mig {
                return Err(PrepareError::MigMode {
                    claim: claim.key(),
                    device: d.device.clone(),
                    gpu: d.gpu.uuid.clone(),
                    mode,
                });
            }
        }
        Ok(())
    }

    /// Unprepare's first step for a claim with MIG devices: destroys each instance its
    /// record names (by UUID, or by placement when only intended). An instance already
    /// gone, or on a GPU no longer on the node, is success.
    pub(super) fn destroy_instances(
        backend: &dyn DeviceBackend,
        records: &Records,
        claim: &str,
        uid: &str,
    ) -> Result<(), PrepareError> {
        let Some(record) = records.read(|c| c.get(uid).cloned()) else {
            return Ok(());
        };
        for d in &record.devices {
            let Some(m) = &d.mig else { continue };
            let err = |op, e: BackendError| mig_error(claim, d, op, e);
            let uuid = match &m.uuid {
                Some(u) => Some(u.clone()),
                None => match backend.list_mig_instances(&d.gpu_uuid) {
                    Ok(listed) => records
                        .read(|c| adoptable(&listed, d, m, uid, c))
                        .map(|i| i.uuid.clone()),
                    Err(BackendError::GpuNotFound { .. }) => None,
                    Err(e) => return Err(err("list the GPU's MIG instances", e)),
                },
            };
            let Some(uuid) = uuid else { continue };
            match backend.destroy_mig_instance(&d.gpu_uuid, &uuid) {
                Ok(())
                | Err(
                    BackendError::MigInstanceNotFound { .. } | BackendError::GpuNotFound { .. },
                ) => {
                    tracing::info!(%claim, device = %d.device_name, mig = %uuid,
                        "MIG instance destroyed");
                }
                Err(e) => return Err(err("destroy its MIG instance", e)),
            }
        }
        Ok(())
    }

    /// The start-up reconcile: lists the instances of the node's GPUs; destroys those no
    /// record names; creates again the vanished instance of a `PrepareCompleted` claim at
    /// its placement (rewriting its CDI spec and record), or marks it lost. A
    /// `PrepareStarted` claim is left to the kubelet's retry. A backend without MIG
    /// (NVML today) is skipped.
    pub fn reconcile_mig(&self) -> MigReconcile {
        let mut out = MigReconcile::default();
        let inventory = match self.backend.inventory(&self.cfg.node_name) {
            Ok(i) => i,
            Err(e) => {
                out.errors
                    .push(format!("MIG reconcile: cannot list the GPUs: {e}"));
                return out;
            }
        };
        let claims = self.records.claims();
        let mut listed: BTreeMap<String, Vec<MigInstance>> = BTreeMap::new();
        for gpu in &inventory.gpus {
            match self.backend.list_mig_instances(&gpu.uuid) {
                Ok(l) => {
                    listed.insert(gpu.uuid.clone(), l);
                }
                Err(BackendError::MigUnsupported { .. }) => return out,
                Err(e) => out.errors.push(format!(
                    "MIG reconcile: GPU {}: cannot list its instances: {e}",
                    gpu.uuid
                )),
            }
        }
        for (gpu, instances) in &listed {
            for inst in instances {
                if named(inst, &claims) {
                    continue;
                }
                match self.backend.destroy_mig_instance(gpu, &inst.uuid) {
                    Ok(()) | Err(BackendError::MigInstanceNotFound { .. }) => {
                        tracing::warn!(gpu = %gpu, mig = %inst.uuid, profile = %inst.profile,
                            start = inst.placement.start,
                            "MIG instance no claim names: destroyed");
                        out.destroyed.push((gpu.clone(), inst.uuid.clone()));
                    }
                    Err(e) => out.errors.push(format!(
                        "MIG reconcile: GPU {gpu}: cannot destroy instance {} that no claim names: {e}",
                        inst.uuid
                    )),
                }
            }
        }
        for (uid, record) in claims {
            if record.state != PrepareState::PrepareCompleted {
                continue;
            }
            let gone = record.devices.iter().any(|d| {
                d.mig.as_ref().is_some_and(|m| {
                    m.lost.is_none()
                        && listed.get(&d.gpu_uuid).is_some_and(|l| {
                            !m.uuid
                                .as_ref()
                                .is_some_and(|u| l.iter().any(|i| &i.uuid == u))
                        })
                })
            });
            if gone {
                self.recreate(&uid, record, &inventory, &mut out);
            }
        }
        out
    }

    /// Creates again the vanished instances of the completed claim `uid`, then writes its
    /// spec and amends its record; an instance that cannot be created is marked lost.
    fn recreate(
        &self,
        uid: &str,
        mut record: ClaimRecord,
        inventory: &NodeInventory,
        out: &mut MigReconcile,
    ) {
        let claim = ClaimRef {
            namespace: record.namespace.clone(),
            name: record.name.clone(),
            uid: uid.to_owned(),
        };
        let key = claim.key();
        let mut planned = Vec::new();
        let mut lost = false;
        for d in &mut record.devices {
            let Some(m) = d.mig.as_mut() else { continue };
            let placement = Placement {
                start: m.start,
                size: m.size,
            };
            let mut mark_lost = |m: &mut MigIntent, reason: String| {
                tracing::error!(claim = %key, device = %d.device_name, reason = %reason,
                    "MIG instance of a prepared claim is lost");
                out.lost.push((key.clone(), d.device_name.clone()));
                m.lost = Some(reason);
                lost = true;
            };
            let gpu = inventory.gpus.iter().find(|g| g.uuid == d.gpu_uuid);
            let Some((gpu, profile)) = gpu.and_then(|g| {
                let table = fgpu_driver::mig::table_for(&g.product_name, g.memory_bytes).ok()?;
                Some((g, table.profile(&m.profile)?.name))
            }) else {
                let reason = format!(
                    "it vanished, and GPU {} is no longer on the node or has no profile {}",
                    d.gpu_uuid, m.profile
                );
                mark_lost(m, reason);
                continue;
            };
            let listed = match self.backend.list_mig_instances(&d.gpu_uuid) {
                Ok(l) => l,
                Err(e) => {
                    out.errors.push(format!(
                        "MIG reconcile: claim {key}: {}: {e}",
                        d.device_name
                    ));
                    return;
                }
            };
            let kept = m
                .uuid
                .as_ref()
                .and_then(|u| listed.iter().find(|i| &i.uuid == u));
            let instance = match kept {
                Some(i) => i.clone(),
                None => match self
                    .backend
                    .create_mig_instance(&d.gpu_uuid, profile, placement)
                {
                    Ok(i) => {
                        tracing::warn!(claim = %key, device = %d.device_name, mig = %i.uuid,
                            "MIG instance of a prepared claim vanished: created again");
                        out.recreated.push((key.clone(), d.device_name.clone()));
                        i
                    }
                    Err(e) => {
                        let reason = format!(
                            "it vanished, and creating {profile} again at slice {} of GPU {} failed: {e}",
                            placement.start, d.gpu_uuid
                        );
                        mark_lost(m, reason);
                        continue;
                    }
                },
            };
            m.uuid = Some(instance.uuid.clone());
            planned.push(PlannedDevice {
                request: d.request_names.first().cloned().unwrap_or_default(),
                pool: d.pool_name.clone(),
                device: d.device_name.clone(),
                share_id: d.share_id.clone(),
                gpu: gpu.clone(),
                memory_bytes: instance.memory_bytes,
                cores: fgpu_api::config::CorePercent::ZERO,
                priority: fgpu_api::config::Priority::Normal,
                oversubscribe: false,
                tier: TierRatio::NONE,
                mig: Some(PlannedMig {
                    profile,
                    placement,
                    instance: Some(instance),
                }),
            });
        }
        if !lost {
            // The new instance has a new UUID (and maybe new nodes): the spec says so.
            let paths = self.paths(uid);
            let written = edits::build(&self.cfg.driver, &claim, &planned, &self.cfg.files, &paths)
                .map_err(|e| e.to_string())
                .and_then(|b| b.spec.to_json().map_err(|e| e.to_string()))
                .and_then(|spec| {
                    write_atomic(&paths.spec_file, spec.as_bytes(), 0o644, Durability::Atomic)
                        .map_err(|(op, e)| {
                            format!("cannot {op} {}: {e}", paths.spec_file.display())
                        })
                });
            if let Err(e) = written {
                out.errors.push(format!("MIG reconcile: claim {key}: {e}"));
                return;
            }
        }
        if let Err(e) = self.records.apply(Change::Put {
            uid: uid.to_owned(),
            record,
            durability: Durability::Fsync,
        }) {
            out.errors.push(format!("MIG reconcile: claim {key}: {e}"));
        }
    }
}

/// Whether a record names `inst`: by its UUID, or (an intent not yet given a UUID) by its
/// GPU, profile and placement.
fn named(inst: &MigInstance, claims: &BTreeMap<String, ClaimRecord>) -> bool {
    claims.values().flat_map(|r| &r.devices).any(|d| {
        d.mig.as_ref().is_some_and(|m| match &m.uuid {
            Some(u) => *u == inst.uuid,
            None => {
                d.gpu_uuid == inst.gpu_uuid
                    && m.profile == inst.profile
                    && m.start == inst.placement.start
            }
        })
    })
}

/// The instance of `listed` that claim `uid`'s device `d` (intent `m`) may take as its
/// own: its recorded UUID, else one of its profile at its placement that no other
/// claim's record names by UUID.
fn adoptable<'a>(
    listed: &'a [MigInstance],
    d: &PreparedDevice,
    m: &MigIntent,
    uid: &str,
    claims: &BTreeMap<String, ClaimRecord>,
) -> Option<&'a MigInstance> {
    if let Some(u) = &m.uuid
        && let Some(i) = listed.iter().find(|i| &i.uuid == u)
    {
        return Some(i);
    }
    listed.iter().find(|i| {
        i.gpu_uuid == d.gpu_uuid
            && i.profile == m.profile
            && i.placement.start == m.start
            && !claims
                .iter()
                .filter(|(other, _)| other.as_str() != uid)
                .flat_map(|(_, r)| &r.devices)
                .any(|o| o.mig.as_ref().and_then(|om| om.uuid.as_ref()) == Some(&i.uuid))
    })
}

fn mig_error(claim: &str, d: &PreparedDevice, op: &'static str, e: BackendError) -> PrepareError {
    PrepareError::Mig {
        claim: claim.to_owned(),
        device: d.device_name.clone(),
        profile: d
            .mig
            .as_ref()
            .map(|m| m.profile.clone())
            .unwrap_or_default(),
        op,
        detail: e.to_string(),
    }
}

/// The MIG steps of a prepare, on the blocking pool.
pub(super) struct MigSteps {
    /// The backend that creates the instances.
    pub(super) backend: Arc<dyn DeviceBackend>,
}

impl MigSteps {
    /// Gives each MIG device of `planned` its instance: the one `record` (the claim's
    /// `PrepareStarted` record, already written with the intents) names or that sits at
    /// its placement unnamed by another claim, else a new one. On a failure the record is
    /// left naming the instances the claim has (and removed when it has none), and the
    /// error names the claim, the device and the profile.
    pub(super) fn ensure(
        &self,
        records: &Records,
        claim: &str,
        uid: &str,
        record: &ClaimRecord,
        planned: &mut [PlannedDevice],
    ) -> Result<(), PrepareError> {
        for idx in 0..planned.len().min(record.devices.len()) {
            let rec = &record.devices[idx];
            let (Some(pm), Some(m)) = (planned[idx].mig.as_ref(), rec.mig.as_ref()) else {
                continue;
            };
            let (profile, placement) = (pm.profile, pm.placement);
            let err = |op, e| mig_error(claim, rec, op, e);
            let found = self
                .backend
                .list_mig_instances(&rec.gpu_uuid)
                .map_err(|e| err("list the GPU's MIG instances", e))
                .and_then(
                    |l| match records.read(|c| adoptable(&l, rec, m, uid, c)).cloned() {
                        Some(i) => Ok(i),
                        None => self
                            .backend
                            .create_mig_instance(&rec.gpu_uuid, profile, placement)
                            .map_err(|e| err("create its MIG instance", e)),
                    },
                );
            match found {
                Ok(i) => {
                    if let Some(pm) = planned[idx].mig.as_mut() {
                        pm.instance = Some(i);
                    }
                }
                Err(e) => {
                    forget_intents(records, uid, record, planned_instances(planned));
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// The UUIDs of the instances `planned` holds, by device name.
fn planned_instances(planned: &[PlannedDevice]) -> BTreeMap<String, String> {
    planned
        .iter()
        .filter_map(|d| {
            let i = d.mig.as_ref()?.instance.as_ref()?;
            Some((d.device.clone(), i.uuid.clone()))
        })
        .collect()
}

/// After a failed creation: the record names exactly the instances the claim has
/// (`have`, by device), and is removed when it has none, so that no record claims an
/// instance that does not exist. Best effort: the prepare fails anyway, and a record of
/// mere intents claims nothing.
fn forget_intents(
    records: &Records,
    uid: &str,
    record: &ClaimRecord,
    have: BTreeMap<String, String>,
) {
    let change = if have.is_empty() {
        Change::Remove {
            uid: uid.to_owned(),
        }
    } else {
        let mut record = record.clone();
        for d in &mut record.devices {
            if let Some(m) = d.mig.as_mut() {
                m.uuid = have.get(&d.device_name).cloned();
            }
        }
        Change::Put {
            uid: uid.to_owned(),
            record,
            durability: Durability::Atomic,
        }
    };
    if let Err(e) = records.apply(change) {
        tracing::warn!(%uid, error = %e, "cannot update the record after a failed MIG creation");
    }
}

/// The claim's devices as recorded before its instances exist: each MIG device's intent
/// keeps the UUID an earlier attempt recorded for the same placement (`previous`).
pub(super) fn intents(devices: &mut [PreparedDevice], previous: Option<&ClaimRecord>) {
    let Some(previous) = previous else { return };
    for d in devices {
        let Some(m) = d.mig.as_mut() else { continue };
        let old = previous.devices.iter().find(|o| {
            o.device_name == d.device_name
                && o.mig
                    .as_ref()
                    .is_some_and(|om| om.profile == m.profile && om.start == m.start)
        });
        if let Some(u) = old.and_then(|o| o.mig.as_ref()?.uuid.clone()) {
            m.uuid = Some(u);
        }
    }
}

/// The loss the start-up reconcile recorded for one of `devices`, as the error a prepare
/// of the claim returns.
pub(super) fn lost(claim: &str, devices: &[PreparedDevice]) -> Option<PrepareError> {
    devices.iter().find_map(|d| {
        let m = d.mig.as_ref()?;
        Some(PrepareError::MigLost {
            claim: claim.to_owned(),
            device: d.device_name.clone(),
            profile: m.profile.clone(),
            reason: m.lost.clone()?,
        })
    })
}
