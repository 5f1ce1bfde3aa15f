//! The boot id records are written under: a record of another boot is discarded on load.

use std::fs;
use std::path::Path;

use super::error::CheckpointError;

/// Where the kernel publishes the current boot's id.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Reads the current boot id from `path` (normally [`BOOT_ID_PATH`]).
pub fn read_boot_id(path: &Path) -> Result<String, CheckpointError> {
    let text = fs::read_to_string(path).map_err(|e| CheckpointError::BootId {
        path: path.to_owned(),
        detail: e.to_string(),
    })?;
    let id = text.trim();
    if id.is_empty() {
        return Err(CheckpointError::BootId {
            path: path.to_owned(),
            detail: "is empty".into(),
        });
    }
    Ok(id.to_owned())
}
