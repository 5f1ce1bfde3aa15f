//! What can go wrong with the checkpoint: each error names the file.

use std::io;
use std::path::{Path, PathBuf};

use super::state::TransitionError;

/// Errors reading or writing the checkpoint. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// An I/O operation failed.
    #[error("checkpoint {}: cannot {op}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Encoding failed (not expected for this data).
    #[error("checkpoint {}: cannot encode: {source}", path.display())]
    Encode {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The boot id could not be read.
    #[error("boot id {}: {detail}", path.display())]
    BootId {
        /// The file read.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// A change the prepare state machine does not allow (a bug in the caller); nothing was
    /// written.
    #[error("checkpoint {}: {source}", path.display())]
    Refused {
        /// The claim's record file.
        path: PathBuf,
        /// The move refused.
        #[source]
        source: TransitionError,
    },
}

pub(super) fn io_error(path: &Path, op: &'static str, source: io::Error) -> CheckpointError {
    CheckpointError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}
