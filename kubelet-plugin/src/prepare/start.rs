//! Opening the plugin's state ([`Plugin::start`]): the node's directories and preload file,
//! then the checkpoint, loaded from its directory or migrated from a version-1 file, then
//! the sweep of files no record accounts for (`sweep`).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use fgpu_driver::backend::DeviceBackend;

use super::{ClaimSource, Plugin, PluginConfig};
use crate::checkpoint::{
    CHECKPOINT_DIR, CHECKPOINT_FILE, CheckpointDir, CheckpointError, CheckpointFile, ClaimRecord,
    Durability, LoadNote, Records, create_private_dir, valid_uid, write_atomic,
};
use crate::metrics::Metrics;

/// What [`Plugin::start`] found and did, for logs and Events.
#[derive(Debug, Default)]
pub struct StartReport {
    /// What loading the checkpoint found: missing; corrupt (one note per file moved aside);
    /// records of another boot.
    pub notes: Vec<LoadNote>,
    /// A version-1 checkpoint (one file) was read from here, its claims written to the
    /// checkpoint directory, and the file removed.
    pub migrated_from: Option<PathBuf>,
    /// Files removed that no checkpoint entry accounted for.
    pub removed_orphans: Vec<PathBuf>,
    /// Claims' files kept although no loaded record accounts for them: a record of their
    /// claim is in the checkpoint directory but was not loaded (it did not parse and was
    /// moved aside, or the other front end wrote it after this one loaded the directory).
    /// The claim may be running: its files stay until it is unprepared.
    pub kept_unloaded: Vec<PathBuf>,
    /// Problems while removing leftovers (the plugin still starts).
    pub errors: Vec<String>,
}

/// The claims the checkpoint holds at start, and what loading it found.
struct Opened {
    claims: BTreeMap<String, ClaimRecord>,
    notes: Vec<LoadNote>,
    migrated_from: Option<PathBuf>,
    /// A version-1 checkpoint to migrate did not parse: which claims it recorded is lost,
    /// so every claim's files on the node may be a running claim's.
    version1_corrupt: bool,
}

fn io_error(path: &Path, op: &'static str, source: io::Error) -> CheckpointError {
    CheckpointError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

/// Creates the plugin's directories (state and run roots 0700, the CDI directory, the
/// node's GPU directory, 0755, cleaned of anything but the plugin's priority files) and
/// writes the node's preload file (0444). Returns what it removed from the GPU directory.
fn create_node_files(cfg: &PluginConfig) -> Result<Vec<PathBuf>, CheckpointError> {
    create_private_dir(&cfg.state_root)
        .map_err(|e| io_error(&cfg.state_root, "create the state directory", e))?;
    create_private_dir(&cfg.run_root)
        .map_err(|e| io_error(&cfg.run_root, "create the run directory", e))?;
    std::fs::create_dir_all(&cfg.cdi_dir)
        .map_err(|e| io_error(&cfg.cdi_dir, "create the CDI directory", e))?;
    let gpu_dir = crate::edits::gpu_dir(&cfg.state_root);
    let removed = super::files::clean_gpu_dir(&gpu_dir)
        .map_err(|e| io_error(&gpu_dir, "create and clean the GPU directory", e))?;
    let preload = cfg.state_root.join("ld.so.preload");
    write_atomic(
        &preload,
        crate::edits::preload_content().as_bytes(),
        0o444,
        Durability::Atomic,
    )
    .map_err(|(op, source)| io_error(&preload, op, source))?;
    Ok(removed)
}

/// The version-1 checkpoints (one file each) that older plugins may have left: in the state
/// directory (plugins before the run directory), and in the run directory (last: it wins a
/// tie of modification times).
fn version1_checkpoints(cfg: &PluginConfig) -> Vec<CheckpointFile> {
    let mut v = Vec::new();
    if cfg.state_root != cfg.run_root {
        v.push(CheckpointFile::new(cfg.state_root.join(CHECKPOINT_FILE)));
    }
    v.push(CheckpointFile::new(cfg.run_root.join(CHECKPOINT_FILE)));
    v
}

/// The newest of the files found, by modification time; of equally new ones the last.
fn newest<'a>(found: impl IntoIterator<Item = (SystemTime, &'a Path)>) -> Option<PathBuf> {
    found
        .into_iter()
        .max_by_key(|(m, _)| *m)
        .map(|(_, p)| p.to_owned())
}

/// Loads the checkpoint: from the version-1 file to migrate, if there is one (its claims
/// become the directory's records and every version-1 file is removed), else from the
/// directory.
///
/// A version-1 checkpoint (one file) exists only where an older plugin wrote it: this
/// build removes it once migrated. So where there is one, an older plugin ran last (it
/// ignored the checkpoint directory, and its own start removed the files of claims it
/// did not know), or this build's migration was interrupted: either way the file is
/// the state. Where there are two (the run and the state directory), the newer one.
/// Its claims are written to the directory (fsynced; records no longer in it removed)
/// before the file is removed, so an interrupted migration is simply done again.
fn open_checkpoint(cfg: &PluginConfig, dir: &CheckpointDir) -> Result<Opened, CheckpointError> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let version1 = version1_checkpoints(cfg);
    let migrated_from = newest(
        version1
            .iter()
            .filter_map(|f| Some((modified(f.path())?, f.path()))),
    );
    let Some(path) = migrated_from else {
        let loaded = dir.load(&cfg.boot_id)?;
        return Ok(Opened {
            claims: loaded.claims,
            notes: loaded.notes,
            migrated_from: None,
            version1_corrupt: false,
        });
    };
    let (mut checkpoint, note) = CheckpointFile::new(&path).load(&cfg.boot_id)?;
    if let Some(corrupt @ LoadNote::Corrupt { .. }) = note {
        // The file (moved aside by the load) was the state, and it is lost. The directory's
        // records stay (they may be stale: the stale-claim sweep judges them); the caller
        // keeps every other claim's files.
        for f in &version1 {
            f.remove()?;
        }
        let mut loaded = dir.load(&cfg.boot_id)?;
        loaded.notes.retain(|n| *n != LoadNote::Missing);
        loaded.notes.insert(0, corrupt);
        return Ok(Opened {
            claims: loaded.claims,
            notes: loaded.notes,
            migrated_from: Some(path),
            version1_corrupt: true,
        });
    }
    // No prepare ever accepted a UID that cannot name a file.
    checkpoint.claims.retain(|uid, _| valid_uid(uid));
    dir.replace_all(&cfg.boot_id, &checkpoint.claims)?;
    for f in &version1 {
        f.remove()?;
    }
    Ok(Opened {
        claims: checkpoint.claims,
        notes: note.into_iter().collect(),
        migrated_from: Some(path),
        version1_corrupt: false,
    })
}

impl<S: ClaimSource> Plugin<S> {
    /// Opens the plugin's state: creates its directories, loads the checkpoint (a corrupt
    /// one is moved aside, one from another boot discarded), removes files of discarded
    /// claims and files that no entry accounts for. Fails only if the directories or the
    /// checkpoint cannot be created or written at all.
    pub fn start(
        cfg: PluginConfig,
        source: S,
        backend: Arc<dyn DeviceBackend>,
    ) -> Result<(Self, StartReport), CheckpointError> {
        let removed_from_gpu_dir = create_node_files(&cfg)?;
        let dir = CheckpointDir::new(cfg.run_root.join(CHECKPOINT_DIR));
        let Opened {
            claims,
            notes,
            migrated_from,
            version1_corrupt,
        } = open_checkpoint(&cfg, &dir)?;
        let metrics = Metrics::new();
        metrics.set_claims(&claims);
        let plugin = Self {
            records: Arc::new(Records::new(dir, cfg.boot_id.clone(), claims)),
            cfg,
            source,
            backend,
            locks: Mutex::new(HashMap::new()),
            metrics,
            inventory: Mutex::new(None),
            suspects: Mutex::new(HashMap::new()),
            gpu_modes: Mutex::new(None),
            gpu_tiers: Mutex::new(Default::default()),
        };
        let mut report = StartReport {
            notes,
            migrated_from,
            removed_orphans: removed_from_gpu_dir,
            ..StartReport::default()
        };
        if version1_corrupt {
            plugin.mark_unrecorded(&mut report);
        }
        plugin.remove_orphans(&mut report);
        Ok((plugin, report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_version1_file_is_migrated_and_the_last_wins_a_tie() {
        let t = SystemTime::UNIX_EPOCH;
        let later = t + std::time::Duration::from_secs(1);
        let (state, run) = (Path::new("/state/c.json"), Path::new("/run/c.json"));
        assert_eq!(newest([]), None);
        assert_eq!(newest([(later, state), (t, run)]), Some(state.to_owned()));
        assert_eq!(newest([(t, state), (t, run)]), Some(run.to_owned()));
    }
}
