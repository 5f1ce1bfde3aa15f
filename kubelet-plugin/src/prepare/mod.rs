//! Prepare and unprepare claims: the side effects, made crash-safe by the checkpoint.
//!
//! [`Plugin::prepare`] for one claim:
//!
//! 1. takes the claim's lock (one operation per claim at a time; different claims run in
//!    parallel);
//! 2. returns the recorded devices if the claim is `PrepareCompleted` (idempotent);
//! 3. GETs the claim through the [`ClaimSource`], checks the UID, resolves the grants
//!    ([`crate::grant`]), places them on this node's GPUs and builds the CDI spec
//!    ([`crate::edits`]) — all before touching anything;
//! 4. records `PrepareStarted` (written, not fsynced: only a restart in this boot reads it),
//!    creates the claim directory (0700) and its state directory (0700), writes the limits
//!    file (0444) and the CDI spec (0644), each by write-rename (see
//!    [`Durability::Atomic`](crate::checkpoint::Durability::Atomic));
//! 5. records `PrepareCompleted` with the devices (fsynced).
//!
//! Steps 4 and 5 are one task on the blocking pool, which holds the claim's lock until it
//! ends (even when the gRPC call that started it is dropped, so that the next operation on
//! the claim cannot overlap its file work). Each claim's record is its own file
//! ([`crate::checkpoint`]): the records of concurrent prepares never wait for each other.
//!
//! Where the files are: the checkpoint and the claim directories under the run root
//! (`/run/fgpu`, a tmpfs on real nodes: per boot like everything they describe, and a
//! prepare there costs no disk I/O — on a disk, creating the files and the fsync were most
//! of a prepare's time); the CDI spec in the CDI directory the runtime reads; the node-wide
//! files under the state root (`/var/lib/fgpu`): the preload file (`ld.so.preload`, naming
//! the shim), written by [`Plugin::start`] and mounted by every claim, and the shared GPU
//! directory. A version-1 checkpoint (one file, `checkpoint.json`) left in the run root or,
//! by plugins before the run root, in the state root is migrated on start: its claims become
//! records in the checkpoint directory and the file is removed; claims' directories in the
//! state root stay where they are until unprepared.
//!
//! A claim of MIG placement devices adds steps (`mig`): after `PrepareStarted` names each
//! instance it means to create, the instances are found or created and the record names
//! them by UUID; then the files (the CDI spec names the instances) and `PrepareCompleted`.
//!
//! [`Plugin::unprepare`] destroys a claim's MIG instances, then removes the claim's record
//! (durably), then its spec and directory;
//! it succeeds for a claim it does not know. [`Plugin::cleanup_stale`] unprepares DRA claims
//! that two sweeps in a row saw deleted or replaced (another UID); an error, a timeout or a
//! 404 that does not name the claim never counts. [`Plugin::start`] discards state of a
//! previous boot, moves a corrupt record aside (its claim's files stay) and removes files
//! that nothing in the checkpoint directory accounts for.
//!
//! The parts:
//!
//! * `source`: where claims come from, [`ClaimSource`] (and [`MapClaimSource`] for tests).
//! * `claim`: reading the claim, checking its UID, resolving its grants and placing them on
//!   this node's GPUs, building its files (no side effects).
//! * `operation`: [`Plugin::prepare`]: the steps above, then the records and files on the
//!   blocking pool, timed by phase.
//! * `files`: the files a claim gets, written and removed.
//! * `unprepare`: [`Plugin::unprepare`].
//! * `lock`: one operation per claim at a time.
//! * `mig`: MIG instances: found or created at prepare (recorded first as an intent,
//!   then by UUID), destroyed at unprepare, reconciled at start
//!   ([`Plugin::reconcile_mig`]).
//! * `start`: [`Plugin::start`]: the node's directories, the checkpoint loaded or migrated.
//! * `sweep`: files no record accounts for (at start) and stale claims
//!   ([`Plugin::cleanup_stale`], two sightings, suspects kept in memory).
//! * `error`: [`PrepareError`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fgpu_api::names::DriverName;
use fgpu_driver::backend::DeviceBackend;
use fgpu_driver::device::NodeInventory;

use crate::checkpoint::{ClaimRecord, Records};
use crate::edits::{self, ClaimPaths, NodeFiles};
use crate::metrics::Metrics;

mod claim;
mod error;
mod files;
mod lock;
mod mig;
mod operation;
mod source;
mod start;
mod sweep;
mod unprepare;

#[cfg(test)]
mod tests;

pub use error::PrepareError;
pub use mig::MigReconcile;
pub use source::{ClaimSource, MapClaimSource, SourceError};
pub use start::StartReport;
pub use sweep::CleanupReport;

/// The default run root ([`PluginConfig::run_root`]): on a tmpfs on most distributions.
pub const DEFAULT_RUN_DIR: &str = "/run/fgpu";

/// How long prepare waits for the claim by default (the kubelet gives a whole call 45 s).
pub const CLAIM_GET_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The plugin's fixed settings.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    /// The driver name.
    pub driver: DriverName,
    /// This node's name (= the pool name).
    pub node_name: String,
    /// The plugin's node-wide files, written at start: `ld.so.preload` and `gpus/`
    /// (`/var/lib/fgpu`).
    pub state_root: PathBuf,
    /// The plugin's per-boot files, written by every prepare: `checkpoint/<uid>.json` and
    /// `claims/<uid>/` (`/run/fgpu`, a tmpfs on real nodes: nothing of it outlives the boot,
    /// and a prepare costs no disk I/O there).
    pub run_root: PathBuf,
    /// Where CDI specs go (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Files every claim's containers get.
    pub files: NodeFiles,
    /// This boot's id.
    pub boot_id: String,
    /// How long prepare waits for the claim source ([`CLAIM_GET_TIMEOUT`] in production).
    pub claim_get_timeout: std::time::Duration,
    /// For crash tests only: after a claim's files are written and before it is recorded
    /// `PrepareCompleted`, log `test pause` and wait this long (so that a test can kill the
    /// plugin between the two phases). `None` in production.
    pub test_pause: Option<std::time::Duration>,
}

/// The node plugin's prepare/unprepare state.
pub struct Plugin<S> {
    cfg: PluginConfig,
    source: S,
    backend: Arc<dyn DeviceBackend>,
    records: Arc<Records>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    metrics: Metrics,
    /// The node's GPUs as last read from the backend. What a prepare needs of them (device
    /// name, UUID, PCI bus, memory) does not change while the node is up, so prepares reuse
    /// it (NVML is not asked on every prepare) and read the backend again only for a device
    /// it does not list; [`Plugin::set_inventory`] refreshes it.
    inventory: Mutex<Option<Arc<NodeInventory>>>,
    /// Claims the last stale-claim sweep saw gone or replaced, with their record as it was
    /// then: the next sweep that sees the same unprepares them (`sweep`).
    suspects: Mutex<HashMap<String, ClaimRecord>>,
    /// The GPU modes in force by UUID, as the publisher settled them (`None` until it
    /// does: the backend's modes are taken).
    gpu_modes: Mutex<Option<std::collections::BTreeMap<String, fgpu_driver::device::GpuMode>>>,
    /// The research tier's ratios in force by UUID, as the publisher settled them (a GPU
    /// not in it is off the tier).
    gpu_tiers: Mutex<std::collections::BTreeMap<String, fgpu_driver::device::TierRatio>>,
}

fn unpoisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these locks stays consistent between statements; a panic elsewhere
    // must not take the plugin down.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S: ClaimSource> Plugin<S> {
    /// The settings.
    pub fn config(&self) -> &PluginConfig {
        &self.cfg
    }

    /// The plugin's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Replaces the GPUs that prepares use (the caller read them from the backend, e.g.
    /// to publish the ResourceSlice).
    pub fn set_inventory(&self, inventory: NodeInventory) {
        self.metrics.set_gpus(&inventory);
        *unpoisoned(&self.inventory) = Some(Arc::new(inventory));
    }

    /// A copy of the checkpoint's claims.
    pub fn claims(&self) -> std::collections::BTreeMap<String, ClaimRecord> {
        self.records.claims()
    }

    fn paths(&self, uid: &str) -> ClaimPaths {
        ClaimPaths::new(
            &self.cfg.state_root,
            &self.cfg.run_root,
            &self.cfg.cdi_dir,
            &self.cfg.driver,
            uid,
        )
    }

    /// The directories that hold claims' directories: the run root's, and the state root's
    /// where claims prepared before the run root existed may still be.
    fn claims_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![edits::claims_dir(&self.cfg.run_root)];
        if self.cfg.state_root != self.cfg.run_root {
            dirs.push(edits::claims_dir(&self.cfg.state_root));
        }
        dirs
    }

    /// Recomputes the claim gauges from the records.
    fn refresh_claim_metrics(&self) {
        self.records.read(|claims| self.metrics.set_claims(claims));
    }
}
