//! Crash consistency at every step: a fault (a crash, ENOSPC, EIO) at each file operation
//! of a prepare and of an unprepare ([`crate::checkpoint::fault`]), then the start-up
//! reconcile and the kubelet's retry. After each: the retry converges to exactly what a
//! run without the fault leaves (the same devices, the same files: nothing leaked, nothing
//! missing, one record), a further restart changes nothing, and an unprepare leaves nothing
//! of the claim.

use std::collections::BTreeSet;

use super::*;
use crate::checkpoint::fault::{Fault, Op, Plan};

/// ENOSPC and EIO (Linux numbers).
const ENOSPC: i32 = 28;
const EIO: i32 = 5;
pub(super) const FAULTS: [Fault; 3] = [Fault::Crash, Fault::Errno(ENOSPC), Fault::Errno(EIO)];

/// Every file and directory under `root`, relative.
pub(super) fn tree(root: &Path) -> BTreeSet<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            out.insert(path.strip_prefix(root).unwrap().to_owned());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// What a run without faults leaves: the devices, the tree after the prepare and after the
/// unprepare, and the file operations of each.
struct Baseline {
    devices: Vec<PreparedDevice>,
    prepared: BTreeSet<PathBuf>,
    unprepared: BTreeSet<PathBuf>,
    prepare_ops: Vec<(Op, PathBuf)>,
    unprepare_ops: Vec<(Op, PathBuf)>,
}

async fn baseline() -> Baseline {
    let env = Env::new();
    let c = env.add("c", "uid-1", "gpu-0");
    let (plugin, _) = env.start("b1");
    let plan = Plan::new(env.dir.path(), None);
    let devices = plugin.prepare(&c).await.unwrap();
    let prepare_ops = plan.seen();
    drop(plan);
    let prepared = tree(env.dir.path());
    let plan = Plan::new(env.dir.path(), None);
    plugin.unprepare(&c).await.unwrap();
    let unprepare_ops = plan.seen();
    drop(plan);
    Baseline {
        devices,
        prepared,
        unprepared: tree(env.dir.path()),
        prepare_ops,
        unprepare_ops,
    }
}

/// `plugin` restarted over `env`'s directories (a crashed process does nothing more); checks
/// what the restart found: every claim recorded `PrepareCompleted` has its CDI spec and its
/// directory (a later prepare returns it as prepared without writing them again).
pub(super) fn restart(
    env: &Env,
    plugin: Plugin<Arc<MapClaimSource>>,
) -> Plugin<Arc<MapClaimSource>> {
    drop(plugin);
    let plugin = env.start("b1").0;
    for (uid, rec) in plugin.claims() {
        if rec.state == PrepareState::PrepareCompleted {
            assert!(
                env.spec_path(&uid).exists() && env.claim_dir(&uid).join("limits").exists(),
                "claim {uid} is recorded prepared without its files"
            );
        }
    }
    plugin
}

#[tokio::test]
async fn every_step_of_prepare_and_unprepare_is_numbered() {
    let b = baseline().await;
    let ops = |v: &[(Op, PathBuf)]| -> Vec<String> {
        v.iter()
            .map(|(op, p)| format!("{op:?} {}", p.display()))
            .collect()
    };
    // The numbered steps of docs/reliability.md: if this changes, update the list there.
    assert_eq!(
        ops(&b.prepare_ops),
        [
            "Write run/checkpoint/uid-1.json",
            "CreateDir run/claims/uid-1",
            "CreateDir run/claims/uid-1/state",
            "CreateDir run/claims/uid-1/feed",
            "CreateDir state/gpus",
            "Write state/gpus/GPU-00000000-0000-0000-0000-000000000000.priority",
            "Write run/claims/uid-1/state/memory.state",
            "Write run/claims/uid-1/state/core.state",
            "Write run/claims/uid-1/limits",
            "Write cdi/gpu.fgpu.dev-claim_uid-1.json",
            "Write run/checkpoint/uid-1.json",
        ]
    );
    assert_eq!(
        ops(&b.unprepare_ops),
        [
            "Remove run/checkpoint/uid-1.json",
            "Remove cdi/gpu.fgpu.dev-claim_uid-1.json",
            "Remove run/claims/uid-1",
            "Remove state/claims/uid-1",
        ]
    );
}

#[tokio::test]
async fn a_fault_at_any_step_of_prepare_then_the_retry_converges() {
    let b = baseline().await;
    for at in 0..b.prepare_ops.len() {
        for fault in FAULTS {
            let what = format!("{fault:?} at step {} ({:?})", at + 1, b.prepare_ops[at]);
            // The kubelet retries the prepare.
            let env = Env::new();
            let c = env.add("c", "uid-1", "gpu-0");
            let (plugin, _) = env.start("b1");
            let plan = Plan::new(env.dir.path(), Some((at, fault)));
            let failed = plugin.prepare(&c).await;
            drop(plan);
            assert!(
                failed.is_err(),
                "{what}: the fault did not fail the prepare"
            );
            let plugin = match fault {
                Fault::Crash => restart(&env, plugin),
                Fault::Errno(_) => plugin,
            };
            let devices = plugin.prepare(&c).await.unwrap();
            assert_eq!(devices, b.devices, "{what}");
            assert_eq!(tree(env.dir.path()), b.prepared, "{what}: after the retry");
            // A restart now keeps everything, and the claim stays prepared once.
            let plugin = restart(&env, plugin);
            assert_eq!(tree(env.dir.path()), b.prepared, "{what}: after a restart");
            assert_eq!(plugin.prepare(&c).await.unwrap(), b.devices, "{what}");
            assert_eq!(plugin.claims().len(), 1, "{what}");
            plugin.unprepare(&c).await.unwrap();
            assert_eq!(
                tree(env.dir.path()),
                b.unprepared,
                "{what}: after unprepare"
            );

            // The kubelet unprepares instead (the pod was deleted meanwhile).
            let env = Env::new();
            let c = env.add("c", "uid-1", "gpu-0");
            let (plugin, _) = env.start("b1");
            let plan = Plan::new(env.dir.path(), Some((at, fault)));
            let _ = plugin.prepare(&c).await;
            drop(plan);
            let plugin = restart(&env, plugin);
            plugin.unprepare(&c).await.unwrap();
            // Nothing left that a run without the fault would not leave (a fault before
            // the node's priority file was made leaves less).
            let left = tree(env.dir.path());
            assert!(
                left.is_subset(&b.unprepared),
                "{what}: unprepared instead left {:?}",
                left.difference(&b.unprepared).collect::<Vec<_>>()
            );
        }
    }
}

#[tokio::test]
async fn a_fault_at_any_step_of_unprepare_then_the_retry_converges() {
    let b = baseline().await;
    for at in 0..b.unprepare_ops.len() {
        for fault in FAULTS {
            let what = format!("{fault:?} at step {} ({:?})", at + 1, b.unprepare_ops[at]);
            let env = Env::new();
            let c = env.add("c", "uid-1", "gpu-0");
            let (plugin, _) = env.start("b1");
            plugin.prepare(&c).await.unwrap();
            let plan = Plan::new(env.dir.path(), Some((at, fault)));
            let failed = plugin.unprepare(&c).await;
            drop(plan);
            // Removing what is already gone fails nothing: the last step (the state root's
            // claim directory, absent) still fails, as the fault comes first.
            assert!(
                failed.is_err(),
                "{what}: the fault did not fail the unprepare"
            );
            let plugin = match fault {
                Fault::Crash => restart(&env, plugin),
                Fault::Errno(_) => plugin,
            };
            plugin.unprepare(&c).await.unwrap();
            assert_eq!(
                tree(env.dir.path()),
                b.unprepared,
                "{what}: after the retry"
            );
            assert!(plugin.claims().is_empty(), "{what}");
            let plugin = restart(&env, plugin);
            assert_eq!(
                tree(env.dir.path()),
                b.unprepared,
                "{what}: after a restart"
            );
            // A later prepare of the claim (the same UID) starts from nothing.
            assert_eq!(plugin.prepare(&c).await.unwrap(), b.devices, "{what}");
            assert_eq!(tree(env.dir.path()), b.prepared, "{what}: prepared again");
        }
    }
}

/// An older plugin's leftovers in a fresh `Env`: claims uid-1 and uid-2 prepared, their
/// files, and one version-1 `checkpoint.json` (no checkpoint directory). Returns the env,
/// the claims and their devices.
async fn version1_node() -> (Env, [ClaimRef; 2], [Vec<PreparedDevice>; 2]) {
    let env = Env::new();
    let c1 = env.add("c1", "uid-1", "gpu-0");
    let c2 = env.add("c2", "uid-2", "gpu-1");
    let devices = {
        let (plugin, _) = env.start("b1");
        [
            plugin.prepare(&c1).await.unwrap(),
            plugin.prepare(&c2).await.unwrap(),
        ]
    };
    let v1 = version1_checkpoint(&env, "b1", &["uid-1", "uid-2"]);
    let run = env.dir.path().join("run");
    std::fs::remove_dir_all(run.join(CHECKPOINT_DIR)).unwrap();
    std::fs::write(run.join(CHECKPOINT_FILE), &v1).unwrap();
    (env, [c1, c2], devices)
}

#[tokio::test]
async fn a_fault_at_any_step_of_the_checkpoint_migration_then_a_restart_converges() {
    let (env, _, devices) = version1_node().await;
    let plan = Plan::new(env.dir.path(), None);
    let (plugin, _) = env.start("b1");
    let steps = plan.seen();
    drop(plan);
    drop(plugin);
    let migrated = tree(env.dir.path());
    let ops: Vec<String> = steps
        .iter()
        .map(|(op, p)| format!("{op:?} {}", p.display()))
        .collect();
    // The records are written (fsynced) before the file that was the state goes.
    let last_record = ops
        .iter()
        .rposition(|s| s == "Write run/checkpoint/uid-2.json")
        .unwrap_or_else(|| panic!("{ops:?}"));
    let file_removed = ops
        .iter()
        .position(|s| s == "Remove run/checkpoint.json")
        .unwrap_or_else(|| panic!("{ops:?}"));
    assert!(last_record < file_removed, "{ops:?}");
    for (at, step) in ops.iter().enumerate() {
        for fault in FAULTS {
            let what = format!("{fault:?} at step {} ({step})", at + 1);
            let (env, claims, _) = version1_node().await;
            let plan = Plan::new(env.dir.path(), Some((at, fault)));
            // A start that fails makes the daemon exit; one that "succeeds" after a crash
            // is a dead process all the same. Either way: a new start.
            drop(env.start_result("b1"));
            drop(plan);
            let (plugin, report) = env.start("b1");
            assert_eq!(report.errors, Vec::<String>::new(), "{what}");
            assert_eq!(tree(env.dir.path()), migrated, "{what}: after the restart");
            // Still prepared, answered from the records (the claims are no longer read).
            env.source.remove("ns", "c1");
            env.source.remove("ns", "c2");
            for (c, d) in claims.iter().zip(&devices) {
                assert_eq!(&plugin.prepare(c).await.unwrap(), d, "{what}");
            }
        }
    }
}
