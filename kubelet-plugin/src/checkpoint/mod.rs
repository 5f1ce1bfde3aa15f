//! The crash-safe record of prepared claims.
//!
//! One small JSON file per claim in the checkpoint directory
//! (`<run dir>/checkpoint/<claim uid>.json`, normally `/run/fgpu/checkpoint/`, mode 0700):
//!
//! ```json
//! {"version": 2, "bootId": "…", "uid": "<claim uid>", "claim": {
//!     "namespace": "ns", "name": "c", "state": "PrepareCompleted",
//!     "specFile": "/var/run/cdi/gpu.fgpu.dev-claim_<uid>.json",
//!     "claimDir": "/run/fgpu/claims/<uid>",
//!     "devices": [{"requestNames": ["gpu"], "poolName": "n1", "deviceName": "gpu-0",
//!                  "shareId": "…", "cdiDeviceIds": ["gpu.fgpu.dev/claim=<uid>-gpu-0-…"],
//!                  "gpuUuid": "GPU-…", "memoryBytes": 10737418240, "cores": 30}]}}
//! ```
//!
//! * Read tolerantly: unknown fields are ignored and missing ones take defaults, so a newer
//!   or older plugin can read it; `version` says which writer made it.
//! * Each record is written by write-to-temporary (0600), rename — with an fsync of the file
//!   before and of the directory after the rename for a record that must survive a power
//!   loss ([`Durability::Fsync`]); a removal is followed by an fsync of the directory.
//!   Records of different claims are different files: a write never waits for another
//!   claim's, and costs the same whatever the number of claims ([`Records`]).
//! * A claim is recorded `PrepareStarted` before any side effect and `PrepareCompleted`
//!   after the last one (`crate::prepare`). Every change to a record passes through
//!   [`Records::apply`], which refuses the moves the state machine does not allow
//!   ([`transition`]).
//! * Written under one boot id (`/proc/sys/kernel/random/boot_id`); a record of another
//!   boot is discarded on load (its claims are handed back so that their files can be
//!   removed).
//! * A record that does not parse is moved aside (`<uid>.json.corrupt-<n>`) and the plugin
//!   starts without that claim; the caller reports it (an Event). The claim may be running:
//!   the moved-aside file keeps its directory and CDI spec from the start-up sweep until the
//!   kubelet unprepares (or prepares) it. Temporary files of interrupted writes are removed
//!   on load.
//! * Both front ends (DRA, device plugin) may share the directory; a record's
//!   [`FrontEnd`] (by its name) says whose sweep may remove it.
//! * Version 1 (plugins before the checkpoint directory) kept every claim in one file,
//!   `checkpoint.json` ([`CheckpointFile`], same record per claim); it is read once on
//!   start, its claims written as records, and removed (`Plugin::start`). A corrupt one is
//!   moved aside and not migrated; the files of claims nothing else names are then kept
//!   by a marker, `<uid>.json.corrupt-v1`.
//!
//! The parts:
//!
//! * `format`: the records and the record file of version 2, encoding and decoding (pure).
//! * `state`: the prepare state machine, [`ClaimState`] and [`transition`] (pure).
//! * `records`: the live store, [`Records`], and its one door, [`Records::apply`].
//! * `dir`: the checkpoint directory on disk, [`CheckpointDir`] (load, write, remove).
//! * `version1`: the single file of version 1, [`CheckpointFile`], read to migrate it.
//! * `files`: write-rename, durable removal, private directories.
//! * `fault`: test-only fault injection at each of those file operations (off, and empty,
//!   outside `cfg(test)`).
//! * `boot`: the boot id.
//! * `error`: [`CheckpointError`].

mod boot;
mod dir;
mod error;
pub(crate) mod fault;
mod files;
mod format;
mod records;
mod state;
mod version1;

#[cfg(test)]
mod tests;

pub use boot::{BOOT_ID_PATH, read_boot_id};
pub use dir::{CheckpointDir, LoadNote, Loaded};
pub use error::CheckpointError;
pub use files::{Durability, write_atomic};
pub(crate) use files::{create_private_dir, remove_if_present};
pub use format::{
    CHECKPOINT_DIR, CHECKPOINT_FILE, CHECKPOINT_VERSION, ClaimRecord, FrontEnd, MigIntent,
    PrepareState, PreparedDevice, RecordFile, valid_uid,
};
pub use records::{Applied, Change, Records};
pub use state::{ClaimState, Transition, TransitionError, transition};
pub use version1::{Checkpoint, CheckpointFile};
