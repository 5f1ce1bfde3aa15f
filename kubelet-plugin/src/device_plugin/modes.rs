//! Each GPU's mode on the legacy path, decided by the DRA side's rule
//! ([`crate::gpu_mode`]): the node labels, `--gpu-mode`, the backend, `shared`; a change is
//! taken only while the GPU holds no prepared container, else refused once with a Warning
//! Event on the Node, as `serve` refuses it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use fgpu_driver::backend::DeviceBackend;
use fgpu_driver::device::{GpuMode, NodeInventory};
use fgpu_plumbing::events::{EventType, Said};

use crate::checkpoint::ClaimRecord;
use crate::cluster::{REASON_GPU_MODE_CHANGE_REFUSED, node_event};
use crate::gpu_mode::{ModeFlag, ModeKeeper, Refusal, wanted_modes};

/// The device plugin's file of the modes in force, in its state directory. Not `serve`'s
/// [`crate::gpu_mode::MODES_FILE`]: when both front ends run on one node, each refuses a
/// change by the claims it prepared, and neither overwrites the other's record.
pub const DEVICE_PLUGIN_MODES_FILE: &str = "device-plugin-gpu-modes.json";

/// The modes in force and what decides them.
#[derive(Debug)]
pub struct ModeState {
    keeper: ModeKeeper,
    flag: ModeFlag,
}

/// What one [`ModeState::settle`] decided.
#[derive(Debug, Default)]
pub struct Settled {
    /// The modes in force, by GPU UUID.
    pub modes: BTreeMap<String, GpuMode>,
    /// Changes refused (each reported once while it holds).
    pub refusals: Vec<Refusal>,
    /// Label values that are not modes, and a modes file that could not be written.
    pub notes: Vec<String>,
}

impl ModeState {
    /// The modes recorded in `file` (a note when it cannot be read), decided with `flag`.
    pub fn load(file: PathBuf, flag: ModeFlag) -> (Self, Option<String>) {
        let (keeper, note) = ModeKeeper::load(file);
        (Self { keeper, flag }, note)
    }

    /// Decides each GPU's mode from the Node's `labels`, the flag and the backend, and
    /// takes it unless the GPU holds one of the prepared claims `claims` (by GPU UUID).
    pub fn settle(
        &mut self,
        inventory: &NodeInventory,
        labels: &BTreeMap<String, String>,
        claims: &BTreeMap<String, ClaimRecord>,
        backend: &dyn DeviceBackend,
    ) -> Settled {
        let (wanted, mut notes) = wanted_modes(&inventory.gpus, labels, &self.flag, |uuid| {
            backend.gpu_mode(uuid)
        });
        let busy = crate::serve::claims_by_gpu(claims);
        let (refusals, error) = self.keeper.settle(&wanted, &busy);
        notes.extend(error);
        Settled {
            modes: self.keeper.modes().clone(),
            refusals,
            notes,
        }
    }
}

/// Logs each refusal and, with a client, records it as a Warning Event
/// `GpuModeChangeRefused` on the Node.
pub async fn report_refusals(client: Option<&kube::Client>, node: &str, refusals: &[Refusal]) {
    for r in refusals {
        let message = format!("fgpu device plugin: {r}");
        tracing::warn!(gpu = %r.gpu_uuid, from = %r.from, to = %r.to.value, "{message}");
        let Some(client) = client else { continue };
        let said = Said {
            type_: EventType::Warning,
            reason: REASON_GPU_MODE_CHANGE_REFUSED,
            action: "PublishNodeAnnotation",
            note: &message,
        };
        if let Err(e) = node_event(client, node, said).await {
            tracing::warn!(error = %e, "cannot record the event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{PrepareState, PreparedDevice};
    use crate::edits::tests::gpu;
    use fgpu_driver::backend::BackendError;

    /// A backend with no say on modes (NVML's answer).
    struct NoSay;
    impl DeviceBackend for NoSay {
        fn name(&self) -> &'static str {
            "none"
        }
        fn enumerate(&self) -> Result<Vec<fgpu_driver::device::Gpu>, BackendError> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn labels_and_flag_decide_and_a_busy_gpu_keeps_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(DEVICE_PLUGIN_MODES_FILE);
        let inv = NodeInventory::new("n1", vec![gpu(0, "0000:19:00.0"), gpu(1, "0000:9a:00.0")]);
        let (g0, g1) = (inv.gpus[0].uuid.clone(), inv.gpus[1].uuid.clone());
        let flag: ModeFlag = "1=whole".parse().unwrap();
        let (mut state, note) = ModeState::load(file.clone(), flag.clone());
        assert_eq!(note, None);
        let labels = BTreeMap::from([("fgpu.dev/gpu-mode-0".to_owned(), "mig".to_owned())]);
        let s = state.settle(&inv, &labels, &BTreeMap::new(), &NoSay);
        assert_eq!(s.modes[&g0], GpuMode::Mig);
        assert_eq!(s.modes[&g1], GpuMode::Whole);
        assert!(s.refusals.is_empty() && s.notes.is_empty(), "{s:?}");

        // GPU 0 holds a container; the label goes: the change is refused, once.
        let record = ClaimRecord {
            namespace: "ml".into(),
            name: "p/main".into(),
            state: PrepareState::PrepareCompleted,
            spec_file: "/x".into(),
            claim_dir: "/y".into(),
            devices: vec![PreparedDevice {
                gpu_uuid: g0.clone(),
                ..PreparedDevice::default()
            }],
        };
        let claims = BTreeMap::from([("u-main".to_owned(), record)]);
        let s = state.settle(&inv, &BTreeMap::new(), &claims, &NoSay);
        assert_eq!(s.modes[&g0], GpuMode::Mig);
        assert_eq!(s.refusals.len(), 1);
        assert_eq!(s.refusals[0].claims, ["ml/p/main"]);
        assert_eq!(s.refusals[0].to.value, GpuMode::Shared);
        let s = state.settle(&inv, &BTreeMap::new(), &claims, &NoSay);
        assert!(s.refusals.is_empty(), "reported twice: {:?}", s.refusals);

        // A restarted plugin reads the modes in force and still refuses.
        let (mut again, _) = ModeState::load(file, flag);
        let s = again.settle(&inv, &BTreeMap::new(), &claims, &NoSay);
        assert_eq!(s.modes[&g0], GpuMode::Mig);
        assert_eq!(s.refusals.len(), 1);
        // Once the container is gone the change is taken.
        let s = again.settle(&inv, &BTreeMap::new(), &BTreeMap::new(), &NoSay);
        assert_eq!(s.modes[&g0], GpuMode::Shared);
    }
}
