//! Crash consistency of the stale-claim sweep: a fault (a crash, ENOSPC, EIO) at each file
//! operation of the sweep that removes a claim seen gone twice, then the next sweeps (after
//! a restart, for a crash). After each: nothing of the gone claim is left, the live claim
//! beside it keeps every file and stays prepared with the same devices.

use super::crash::{FAULTS, restart, tree};
use super::*;
use crate::checkpoint::fault::{Fault, Op, Plan};

/// A node with claim `gone` (uid-1, deleted from the API server and seen so by one sweep:
/// a suspect) and claim `live` (uid-2) prepared.
async fn node() -> (
    Env,
    Plugin<Arc<MapClaimSource>>,
    ClaimRef,
    Vec<PreparedDevice>,
) {
    let env = Env::new();
    let gone = env.add("gone", "uid-1", "gpu-0");
    let live = env.add("live", "uid-2", "gpu-1");
    let (plugin, _) = env.start("b1");
    plugin.prepare(&gone).await.unwrap();
    let devices = plugin.prepare(&live).await.unwrap();
    env.source.remove("ns", "gone");
    let first = plugin.cleanup_stale().await;
    assert_eq!(first.suspected.len(), 1, "{first:?}");
    assert!(first.removed.is_empty(), "{first:?}");
    (env, plugin, live, devices)
}

/// What the sweep that removes `gone` leaves, and its file operations.
async fn baseline() -> (std::collections::BTreeSet<PathBuf>, Vec<(Op, PathBuf)>) {
    let (env, plugin, _, _) = node().await;
    let plan = Plan::new(env.dir.path(), None);
    let report = plugin.cleanup_stale().await;
    let ops = plan.seen();
    drop(plan);
    assert_eq!(report.removed, ["ns/gone (uid-1)"], "{report:?}");
    (tree(env.dir.path()), ops)
}

#[tokio::test]
async fn every_step_of_the_sweeps_removal_is_numbered() {
    let (_, ops) = baseline().await;
    let ops: Vec<String> = ops
        .iter()
        .map(|(op, p)| format!("{op:?} {}", p.display()))
        .collect();
    // docs/reliability.md lists these: the sweep removes through the unprepare's steps.
    assert_eq!(
        ops,
        [
            "Remove run/checkpoint/uid-1.json",
            "Remove cdi/gpu.fgpu.dev-claim_uid-1.json",
            "Remove run/claims/uid-1",
            "Remove state/claims/uid-1",
        ]
    );
}

#[tokio::test]
async fn a_fault_at_any_step_of_the_sweep_then_the_next_sweeps_converge() {
    let (swept, ops) = baseline().await;
    for (at, step) in ops.iter().enumerate() {
        for fault in FAULTS {
            let what = format!("{fault:?} at step {} ({step:?})", at + 1);
            let (env, plugin, live, devices) = node().await;
            let plan = Plan::new(env.dir.path(), Some((at, fault)));
            let report = plugin.cleanup_stale().await;
            drop(plan);
            assert!(
                !report.errors.is_empty(),
                "{what}: the fault was not reported"
            );
            let plugin = match fault {
                // A restarted plugin has no suspects: two sweeps again (and its start-up
                // sweep removes files no record names).
                Fault::Crash => restart(&env, plugin),
                Fault::Errno(_) => plugin,
            };
            for _ in 0..2 {
                let r = plugin.cleanup_stale().await;
                assert!(r.errors.is_empty(), "{what}: {r:?}");
            }
            assert_eq!(tree(env.dir.path()), swept, "{what}: after the next sweeps");
            assert_eq!(
                plugin.claims().keys().collect::<Vec<_>>(),
                ["uid-2"],
                "{what}"
            );
            assert_eq!(plugin.prepare(&live).await.unwrap(), devices, "{what}");
            // And a restart changes nothing.
            let plugin = restart(&env, plugin);
            assert_eq!(tree(env.dir.path()), swept, "{what}: after a restart");
            assert_eq!(plugin.claims().len(), 1, "{what}");
        }
    }
}
