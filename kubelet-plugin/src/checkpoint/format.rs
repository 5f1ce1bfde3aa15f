//! The on-disk format of version 2: what one claim's record says, the record file that
//! holds it, and which UIDs may name a file. Pure: encoding and decoding, no I/O.

use std::io;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The format version this build writes (1: one file for all claims; 2: one file per claim).
pub const CHECKPOINT_VERSION: u32 = 2;

/// The checkpoint directory inside the plugin's run directory (one record file per claim).
pub const CHECKPOINT_DIR: &str = "checkpoint";

/// File name of a version-1 checkpoint (every claim in one file) inside the run or state
/// directory: read once on start and migrated to [`CHECKPOINT_DIR`].
pub const CHECKPOINT_FILE: &str = "checkpoint.json";

/// How far a claim's preparation got, as written in its record (`state`). A claim without a
/// record is the third state, [`ClaimState::Absent`](super::ClaimState::Absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrepareState {
    /// Side effects may have started; a repeat must redo them, an unprepare undo them.
    #[default]
    PrepareStarted,
    /// Everything is in place; a repeated prepare returns the recorded devices.
    PrepareCompleted,
}

/// One device handed to the kubelet for a claim (one per allocation result).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PreparedDevice {
    /// Requests of the claim this device serves.
    pub request_names: Vec<String>,
    /// The pool (the node).
    pub pool_name: String,
    /// The device in the pool (`gpu-<minor>`).
    pub device_name: String,
    /// The share, for a device allocated several times.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Fully qualified CDI device ids, `<driver>/claim=<uid>-<device>[-<share>]`.
    pub cdi_device_ids: Vec<String>,
    /// UUID of the GPU.
    pub gpu_uuid: String,
    /// Granted memory in bytes.
    pub memory_bytes: u64,
    /// Granted cores in percent (0 = not throttled).
    pub cores: u8,
    /// What holds the device's memory: `driver` when its CDI spec sets the driver's
    /// per-cgroup limit (written only then: `shim` is absent, as in earlier versions).
    #[serde(skip_serializing_if = "is_shim")]
    pub enforcement: fgpu_driver::device::Enforcement,
    /// For a MIG placement device (`gpu-<index>-mig-<profile>-<start>`): the instance the
    /// claim gets on the GPU `gpu_uuid`, recorded before it is created. Absent for a GPU
    /// or a share of one (and in records of earlier versions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigIntent>,
}

/// The MIG instance of a prepared device: what the plugin means to create (the profile
/// at a placement of the parent GPU), then the instance it created.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MigIntent {
    /// The profile, e.g. `1g.10gb`.
    pub profile: String,
    /// The first memory slice of the placement.
    pub start: u8,
    /// The placement's memory slices.
    pub size: u8,
    /// The instance's UUID (`MIG-…`) once created; absent while only intended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Why the instance is gone for good: it vanished and could not be created again at
    /// its placement (start-up reconcile). A prepare of the claim fails with this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<String>,
}

fn is_shim(e: &fgpu_driver::device::Enforcement) -> bool {
    *e == fgpu_driver::device::Enforcement::Shim
}

/// A claim known to the plugin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClaimRecord {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// How far preparation got.
    pub state: PrepareState,
    /// The claim's CDI spec file.
    pub spec_file: PathBuf,
    /// The claim's directory (state dir, limits file, preload file).
    pub claim_dir: PathBuf,
    /// Devices returned to the kubelet (complete once `PrepareCompleted`).
    pub devices: Vec<PreparedDevice>,
}

/// Which front end prepared a claim: the one whose sweep may remove it. Both front ends
/// (the DRA plugin, `serve`, and the legacy device plugin) may share one checkpoint
/// directory on a node; neither sweeps the other's claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontEnd {
    /// A ResourceClaim, prepared for the kubelet's DRA manager.
    Dra,
    /// A container of a pod, prepared for the kubelet's device manager (named
    /// `<pod>/<container>`).
    DevicePlugin,
}

impl ClaimRecord {
    /// The front end that prepared this claim, by its name: the device plugin names its
    /// claims `<pod>/<container>`, and no Kubernetes object's name has a `/`.
    pub fn front_end(&self) -> FrontEnd {
        if self.name.contains('/') {
            FrontEnd::DevicePlugin
        } else {
            FrontEnd::Dra
        }
    }
}

/// One claim's record file in a [`CheckpointDir`](super::CheckpointDir).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RecordFile {
    /// Format version of the writer.
    pub version: u32,
    /// Boot the claim was prepared in.
    pub boot_id: String,
    /// The claim's UID (also the file's name; a file whose UID differs is corrupt).
    pub uid: String,
    /// The record.
    pub claim: ClaimRecord,
}

/// Whether `uid` can name a claim's files: letters, digits and `-`, at most 128 bytes (the
/// kubelet sends UUIDs; the legacy device plugin `<pod uid>-<container>`).
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 128
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The bytes of claim `uid`'s record file, written by this build's version.
pub(super) fn encode_record(
    boot_id: &str,
    uid: &str,
    record: &ClaimRecord,
) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Out<'a> {
        version: u32,
        boot_id: &'a str,
        uid: &'a str,
        claim: &'a ClaimRecord,
    }
    serde_json::to_vec(&Out {
        version: CHECKPOINT_VERSION,
        boot_id,
        uid,
        claim: record,
    })
}

/// Why a record file is corrupt: it is moved aside and its claim dropped. The message goes
/// into [`LoadNote::Corrupt`](super::LoadNote::Corrupt).
#[derive(Debug, thiserror::Error)]
pub(super) enum BadRecord {
    /// Not readable (a directory of that name, an I/O error): as good as corrupt; failing
    /// the start would only make the plugin restart into the same error.
    #[error("cannot read it: {0}")]
    Unreadable(#[source] io::Error),
    /// Not a record.
    #[error("{0}")]
    Parse(#[source] serde_json::Error),
    /// A record, but of another claim than the file's name says.
    #[error("uid {found:?} does not match the file name")]
    UidMismatch {
        /// The UID in the file.
        found: String,
    },
}

/// Decodes the record file of claim `uid` (its file name); a record without a UID is taken
/// as `uid`'s.
pub(super) fn decode_record(uid: &str, text: &[u8]) -> Result<RecordFile, BadRecord> {
    let record = serde_json::from_slice::<RecordFile>(text).map_err(BadRecord::Parse)?;
    if record.uid.is_empty() || record.uid == uid {
        Ok(record)
    } else {
        Err(BadRecord::UidMismatch { found: record.uid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_that_could_leave_the_directory_are_refused() {
        assert!(valid_uid("0b6f2c1e-8a1d-4c9e-9f00-1234567890ab"));
        for bad in ["", "../etc", "a/b", "a.json", "a b", &"x".repeat(129)] {
            assert!(!valid_uid(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_record_decodes_what_it_encodes_and_only_under_its_own_name() {
        let record = ClaimRecord {
            namespace: "ns".into(),
            name: "c".into(),
            state: PrepareState::PrepareCompleted,
            ..ClaimRecord::default()
        };
        let bytes = encode_record("b", "u1", &record).unwrap();
        let back = decode_record("u1", &bytes).unwrap();
        assert_eq!(back.version, CHECKPOINT_VERSION);
        assert_eq!((back.boot_id.as_str(), back.uid.as_str()), ("b", "u1"));
        assert_eq!(back.claim, record);
        assert_eq!(
            decode_record("u2", &bytes).unwrap_err().to_string(),
            "uid \"u1\" does not match the file name"
        );
        // A record of an earlier version (no `mig`) loads with none.
        let old = br#"{"version": 2, "claim": {"devices": [{"deviceName": "gpu-0", "gpuUuid": "GPU-1"}]}}"#;
        let back = decode_record("u1", old).unwrap();
        assert_eq!(back.claim.devices[0].mig, None);
        assert_eq!(back.claim.devices[0].device_name, "gpu-0");
        // And one with an intent keeps it, the UUID absent until the instance exists.
        let mut with = record.clone();
        with.devices = vec![PreparedDevice {
            device_name: "gpu-0-mig-1g10gb-6".into(),
            mig: Some(MigIntent {
                profile: "1g.10gb".into(),
                start: 6,
                size: 1,
                ..MigIntent::default()
            }),
            ..PreparedDevice::default()
        }];
        let bytes = encode_record("b", "u1", &with).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.contains(r#""mig":{"profile":"1g.10gb","start":6,"size":1}"#),
            "{text}"
        );
        assert_eq!(decode_record("u1", &bytes).unwrap().claim, with);
        // A record without a UID (the field is optional) belongs to its file.
        assert_eq!(decode_record("u2", br#"{"bootId": "b"}"#).unwrap().uid, "");
        assert!(matches!(
            decode_record("u1", b"{"),
            Err(BadRecord::Parse(_))
        ));
    }
}
