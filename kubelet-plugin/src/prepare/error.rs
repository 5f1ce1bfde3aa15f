//! Why a claim could not be prepared or unprepared, and the stable reason for metrics.

use std::io;
use std::path::PathBuf;

use super::SourceError;
use crate::checkpoint::CheckpointError;
use crate::edits::EditsError;
use crate::grant::GrantError;

/// Why a claim could not be prepared or unprepared. Each names the claim.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The kubelet sent an unusable UID.
    #[error("claim {claim}: uid {uid:?} is not a valid UID (letters, digits and '-' only)")]
    BadUid {
        /// `namespace/name`.
        claim: String,
        /// The UID sent.
        uid: String,
    },
    /// The claim does not exist (any more).
    #[error("claim {claim}: not found in the API server")]
    NotFound {
        /// `namespace/name`.
        claim: String,
    },
    /// The claim was replaced by another of the same name.
    #[error(
        "claim {claim}: metadata.uid is {found}, the kubelet asked for {expected}; the claim was deleted and recreated"
    )]
    UidMismatch {
        /// `namespace/name`.
        claim: String,
        /// UID the kubelet asked for.
        expected: String,
        /// UID found.
        found: String,
    },
    /// Reading the claim failed.
    #[error("claim {claim}: cannot read it: {source}")]
    Source {
        /// `namespace/name`.
        claim: String,
        /// The cause.
        #[source]
        source: SourceError,
    },
    /// The allocation is unusable.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The devices or the spec are unusable.
    #[error(transparent)]
    Edits(#[from] EditsError),
    /// The GPUs could not be listed.
    #[error("claim {claim}: cannot list this node's GPUs: {detail}")]
    Backend {
        /// `namespace/name`.
        claim: String,
        /// The backend's error.
        detail: String,
    },
    /// A MIG placement device's GPU is not in `mig` mode on this node.
    #[error(
        "claim {claim}: device {device}: GPU {gpu} is in mode {mode}, not mig; its MIG placements cannot be prepared (see docs/mig.md, GPU mode)"
    )]
    MigMode {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// The GPU's UUID.
        gpu: String,
        /// Its mode.
        mode: fgpu_driver::device::GpuMode,
    },
    /// A MIG instance could not be created, found or destroyed.
    #[error("claim {claim}: device {device} (MIG profile {profile}): cannot {op}: {detail}")]
    Mig {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// The profile.
        profile: String,
        /// What was being done.
        op: &'static str,
        /// The backend's error.
        detail: String,
    },
    /// The claim's MIG instance vanished and could not be created again.
    #[error(
        "claim {claim}: device {device} (MIG profile {profile}): its instance is lost: {reason}; delete the pod and the claim to get a new allocation"
    )]
    MigLost {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// The profile.
        profile: String,
        /// Why (from the start-up reconcile).
        reason: String,
    },
    /// A file operation failed.
    #[error("claim {claim}: cannot {op} {}: {source}", path.display())]
    Io {
        /// `namespace/name`.
        claim: String,
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The checkpoint could not be written.
    #[error("claim {claim}: {source}")]
    Checkpoint {
        /// `namespace/name`.
        claim: String,
        /// The cause.
        #[source]
        source: CheckpointError,
    },
}

impl PrepareError {
    /// A short, stable reason for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadUid { .. } => "bad_uid",
            Self::NotFound { .. } => "not_found",
            Self::UidMismatch { .. } => "uid_mismatch",
            Self::Source { .. } => "api",
            Self::Grant(GrantError::NotAllocated { .. }) => "not_allocated",
            Self::Grant(GrantError::NoDevicesOfDriver { .. }) => "other_driver",
            Self::Grant(GrantError::Invalid { .. }) => "invalid_allocation",
            Self::Edits(EditsError::UnknownDevice { .. }) => "unknown_device",
            Self::Edits(_) => "invalid_allocation",
            Self::Backend { .. } => "backend",
            Self::MigMode { .. } => "mig_mode",
            Self::Mig { .. } => "mig",
            Self::MigLost { .. } => "mig_lost",
            // A bug, not the disk: the state machine refused the change.
            Self::Checkpoint {
                source: CheckpointError::Refused { .. },
                ..
            } => "invalid_transition",
            Self::Io { .. } | Self::Checkpoint { .. } => "io",
        }
    }
}
