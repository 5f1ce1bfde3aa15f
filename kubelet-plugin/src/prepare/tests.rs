//! The prepare operation end to end over a temporary directory: prepare, unprepare, start
//! (migration, orphans, another boot), locking, stale claims.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use fgpu_driver::backend::BackendError;
use fgpu_driver::device::Gpu;
use serde_json::json;

use super::*;
use crate::checkpoint::{
    CHECKPOINT_DIR, CHECKPOINT_FILE, CheckpointFile, Durability, LoadNote, PrepareState,
    PreparedDevice, create_private_dir,
};
use crate::claim::ResourceClaim;
use crate::edits::tests::gpu;
use crate::edits::{ClaimRef, FileMount, NodeFiles};

mod crash;
mod mig;
mod soak;
mod sweep_crash;

struct StaticBackend(Mutex<Vec<Gpu>>);

impl DeviceBackend for StaticBackend {
    fn name(&self) -> &'static str {
        "static"
    }
    fn enumerate(&self) -> Result<Vec<Gpu>, BackendError> {
        Ok(unpoisoned(&self.0).clone())
    }
}

struct Env {
    dir: tempfile::TempDir,
    source: Arc<MapClaimSource>,
    backend: Arc<StaticBackend>,
}

impl Env {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            source: Arc::default(),
            backend: Arc::new(StaticBackend(Mutex::new(vec![
                gpu(0, "0000:1b:00.0"),
                gpu(1, "0000:2b:00.0"),
            ]))),
        }
    }
    fn cfg(&self, boot: &str) -> PluginConfig {
        PluginConfig {
            driver: DriverName::default(),
            node_name: "n1".into(),
            state_root: self.dir.path().join("state"),
            run_root: self.dir.path().join("run"),
            cdi_dir: self.dir.path().join("cdi"),
            files: NodeFiles {
                shim_library: "/opt/fgpu/libfgpu.so".into(),
                driver_mounts: vec![FileMount::same("/usr/lib/libcuda.so.1")],
                driver_hooks: vec![],
                fake_driver: false,
                fake_state_dir: None,
                context_overhead: 0,
                memory_limits: None,
            },
            boot_id: boot.into(),
            claim_get_timeout: CLAIM_GET_TIMEOUT,
            test_pause: None,
        }
    }
    fn start(&self, boot: &str) -> (Plugin<Arc<MapClaimSource>>, StartReport) {
        self.start_result(boot).unwrap()
    }
    fn start_result(
        &self,
        boot: &str,
    ) -> Result<(Plugin<Arc<MapClaimSource>>, StartReport), crate::checkpoint::CheckpointError>
    {
        Plugin::start(self.cfg(boot), self.source.clone(), self.backend.clone())
    }
    fn spec_path(&self, uid: &str) -> PathBuf {
        self.dir
            .path()
            .join("cdi")
            .join(format!("gpu.fgpu.dev-claim_{uid}.json"))
    }
    fn claim_dir(&self, uid: &str) -> PathBuf {
        self.dir.path().join("run/claims").join(uid)
    }
    fn record_path(&self, uid: &str) -> PathBuf {
        self.dir
            .path()
            .join("run/checkpoint")
            .join(format!("{uid}.json"))
    }
    fn add(&self, name: &str, uid: &str, device: &str) -> ClaimRef {
        self.source.insert(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "status": {"allocation": {"devices": {"results": [{
                    "request": "gpu", "driver": "gpu.fgpu.dev", "pool": "n1",
                    "device": device, "shareID": "s1",
                    "consumedCapacity": {"memory": "10Gi", "cores": "30"}}]}}}
            }))
            .unwrap(),
        );
        ClaimRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[tokio::test]
async fn prepare_is_idempotent_and_unprepare_removes_everything() {
    let env = Env::new();
    let (plugin, report) = env.start("b1");
    assert_eq!(report.notes, [LoadNote::Missing]);
    // The node's GPU directory: only the plugin writes it.
    let gpus = env.dir.path().join("state/gpus");
    assert_eq!(mode(&gpus), 0o755);
    let c = env.add("c", "uid-1", "gpu-1");
    let devices = plugin.prepare(&c).await.unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(
        devices[0].cdi_device_ids,
        ["gpu.fgpu.dev/claim=uid-1-gpu-1-s1"]
    );
    assert_eq!(devices[0].memory_bytes, 10 << 30);

    let dir = env.claim_dir("uid-1");
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("state")), 0o700);
    assert_eq!(mode(&dir.join("limits")), 0o444);
    // The contract's files (docs/shim-contract.md): the accounts at the shim's sizes,
    // zero-filled, usable by any UID; the feed directory; the GPU's priority file.
    for (name, size) in [
        ("state/memory.state", 164_928u64),
        ("state/core.state", 4_160),
    ] {
        let f = dir.join(name);
        assert_eq!(mode(&f), 0o666, "{name}");
        let bytes = std::fs::read(&f).unwrap();
        assert_eq!(bytes.len() as u64, size, "{name}");
        assert!(bytes.iter().all(|&b| b == 0), "{name} is not zero-filled");
    }
    assert_eq!(mode(&dir.join("feed")), 0o755);
    assert_eq!(std::fs::read_dir(dir.join("feed")).unwrap().count(), 0);
    let prio = gpus.join("GPU-00000001-0000-0000-0000-000000000000.priority");
    assert_eq!(mode(&prio), 0o666);
    assert_eq!(std::fs::read(&prio).unwrap(), [0u8; 64]);
    let preload = env.dir.path().join("state/ld.so.preload");
    assert_eq!(mode(&preload), 0o444);
    assert_eq!(
        std::fs::read_to_string(&preload).unwrap(),
        "/usr/lib/fgpu/libfgpu.so\n"
    );
    assert_eq!(mode(&env.spec_path("uid-1")), 0o644);
    let limits = std::fs::read_to_string(dir.join("limits")).unwrap();
    assert!(
        limits.contains("\nversion=2\n")
            && limits
                .contains("\ngpu.GPU-00000001-0000-0000-0000-000000000000.memory=10737418240\n"),
        "{limits}"
    );
    let spec = std::fs::read_to_string(env.spec_path("uid-1")).unwrap();
    let spec = fgpu_driver::cdi::CdiSpec::from_json(&spec).unwrap();
    assert_eq!(spec.qualified_names(), devices[0].cdi_device_ids);
    assert_eq!(
        plugin.claims()["uid-1"].state,
        PrepareState::PrepareCompleted
    );
    // The claim's record: its own file in the checkpoint directory.
    let record = env.record_path("uid-1");
    assert_eq!(mode(&record), 0o600);
    assert_eq!(mode(record.parent().unwrap()), 0o700);
    let on_disk: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(on_disk["claim"]["state"], "PrepareCompleted");
    assert_eq!(on_disk["bootId"], "b1");

    let metrics = plugin.metrics().encode();
    for phase in [
        "ClaimGet",
        "Build",
        "RecordStarted",
        "Files",
        "RecordCompleted",
    ] {
        let count = format!(
            "fgpu_kubelet_plugin_prepare_phase_duration_seconds_count{{phase=\"{phase}\"}} 1\n"
        );
        assert!(metrics.contains(&count), "{count} in {metrics}");
    }

    // Repeated prepare answers from the checkpoint, even with the claim gone.
    env.source.remove("ns", "c");
    assert_eq!(plugin.prepare(&c).await.unwrap(), devices);

    // A stamp in the priority file survives other claims' prepares (running containers
    // have it mounted).
    std::fs::write(&prio, [7u8; 64]).unwrap();
    let c2 = env.add("c2", "uid-2", "gpu-1");
    plugin.prepare(&c2).await.unwrap();
    assert_eq!(std::fs::read(&prio).unwrap(), [7u8; 64]);
    plugin.unprepare(&c2).await.unwrap();

    plugin.unprepare(&c).await.unwrap();
    assert!(!dir.exists());
    assert!(!env.spec_path("uid-1").exists());
    assert!(!record.exists());
    assert!(plugin.claims().is_empty());
    plugin.unprepare(&c).await.unwrap();
    // A restart sees no claim.
    drop(plugin);
    assert!(env.start("b1").0.claims().is_empty());
}

#[tokio::test]
async fn bad_claims_fail_without_side_effects() {
    let env = Env::new();
    let (plugin, _) = env.start("b1");
    let mut gone = env.add("gone", "uid-g", "gpu-0");
    env.source.remove("ns", "gone");
    let replaced = ClaimRef {
        uid: "uid-old".into(),
        ..env.add("r", "uid-new", "gpu-0")
    };
    let vanished = env.add("v", "uid-v", "gpu-9");
    let cases: Vec<(ClaimRef, &str, &str)> = vec![
        (gone.clone(), "not_found", "claim ns/gone: not found"),
        (
            replaced,
            "uid_mismatch",
            "claim ns/r: metadata.uid is uid-new, the kubelet asked for uid-old",
        ),
        (
            vanished,
            "unknown_device",
            "claim ns/v: status.allocation.devices.results[0].device: \"gpu-9\"",
        ),
    ];
    for (c, reason, msg) in cases {
        let e = plugin.prepare(&c).await.unwrap_err();
        assert_eq!(e.reason(), reason, "{e}");
        assert!(e.to_string().starts_with(msg), "{e}");
        assert!(!env.claim_dir(&c.uid).exists());
        assert!(!env.spec_path(&c.uid).exists());
    }
    gone.uid = "../../etc".into();
    assert_eq!(plugin.prepare(&gone).await.unwrap_err().reason(), "bad_uid");
    assert_eq!(
        plugin.unprepare(&gone).await.unwrap_err().reason(),
        "bad_uid"
    );
    assert!(plugin.claims().is_empty());
    // The plugin still works.
    plugin
        .prepare(&env.add("ok", "uid-ok", "gpu-0"))
        .await
        .unwrap();
}

#[tokio::test]
async fn restart_keeps_state_and_reboot_discards_it() {
    let env = Env::new();
    let c = env.add("c", "uid-1", "gpu-0");
    let devices = {
        let (plugin, _) = env.start("b1");
        plugin.prepare(&c).await.unwrap()
    };
    // A shim has initialised the account: a restart of the plugin must not reset it.
    let account = env.claim_dir("uid-1").join("state/memory.state");
    let mut bytes = std::fs::read(&account).unwrap();
    bytes[..8].copy_from_slice(b"FGPUACC1");
    std::fs::write(&account, &bytes).unwrap();
    {
        let (plugin, report) = env.start("b1");
        assert_eq!(report.notes, []);
        assert!(report.removed_orphans.is_empty());
        env.source.remove("ns", "c");
        assert_eq!(plugin.prepare(&c).await.unwrap(), devices);
    }
    assert_eq!(std::fs::read(&account).unwrap(), bytes);
    let (plugin, report) = env.start("b2");
    match &report.notes[..] {
        [
            LoadNote::BootChanged {
                previous,
                discarded,
            },
        ] => {
            assert_eq!(previous, "b1");
            assert!(discarded.contains_key("uid-1"));
        }
        other => panic!("{other:?}"),
    }
    assert!(plugin.claims().is_empty());
    assert!(!env.claim_dir("uid-1").exists());
    assert!(!env.spec_path("uid-1").exists());
    assert!(!env.record_path("uid-1").exists());
    assert_eq!(report.removed_orphans.len(), 2);
}

#[tokio::test]
async fn interrupted_prepare_is_redone_and_a_corrupt_record_loses_only_its_claim() {
    let env = Env::new();
    let c = env.add("c", "uid-1", "gpu-0");
    let other = env.add("other", "uid-2", "gpu-1");
    {
        let (plugin, _) = env.start("b1");
        plugin.prepare(&other).await.unwrap();
        // Simulate a crash after PrepareStarted and the directory, before the spec.
        plugin
            .records
            .put(
                "uid-1",
                ClaimRecord {
                    namespace: "ns".into(),
                    name: "c".into(),
                    ..ClaimRecord::default()
                },
                Durability::Atomic,
            )
            .unwrap();
        create_private_dir(&env.claim_dir("uid-1")).unwrap();
    }
    let tmp = env
        .dir
        .path()
        .join("cdi/.gpu.fgpu.dev-claim_uid-1.json.tmp");
    std::fs::write(&tmp, b"{").unwrap();
    let (plugin, report) = env.start("b1");
    // The entry accounts for the claim directory; the interrupted write is a leftover.
    assert_eq!(report.removed_orphans, [tmp]);
    assert_eq!(plugin.claims()["uid-1"].state, PrepareState::PrepareStarted);
    let devices = plugin.prepare(&c).await.unwrap();
    assert_eq!(devices[0].device_name, "gpu-0");
    assert!(env.spec_path("uid-1").exists());
    drop(plugin);

    std::fs::write(env.record_path("uid-1"), b"not json").unwrap();
    let (plugin, report) = env.start("b1");
    let [LoadNote::Corrupt { moved_to, .. }] = &report.notes[..] else {
        panic!("{:?}", report.notes)
    };
    assert_eq!(
        *moved_to,
        env.dir.path().join("run/checkpoint/uid-1.json.corrupt-1")
    );
    // The claim is no longer recorded, but it may be running: its files are kept (and
    // reported), not swept as orphans; the other claim is untouched.
    assert_eq!(report.removed_orphans, Vec::<PathBuf>::new());
    assert_eq!(
        report.kept_unloaded,
        [env.claim_dir("uid-1"), env.spec_path("uid-1")]
    );
    assert!(env.spec_path("uid-1").exists());
    assert!(env.claim_dir("uid-1").join("limits").exists());
    assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-2"]);
    assert!(env.spec_path("uid-2").exists());
    // Not on the next start either: the moved-aside record still speaks for the claim.
    drop(plugin);
    let (plugin, report) = env.start("b1");
    assert_eq!(report.removed_orphans, Vec::<PathBuf>::new());
    assert!(env.spec_path("uid-1").exists() && env.claim_dir("uid-1").exists());
    // The kubelet prepares it again (a new record), or unprepares it (its files go).
    plugin.prepare(&c).await.unwrap();
    assert_eq!(
        plugin.claims()["uid-1"].state,
        PrepareState::PrepareCompleted
    );
    plugin.unprepare(&c).await.unwrap();
    assert!(!env.spec_path("uid-1").exists() && !env.claim_dir("uid-1").exists());
}

/// The record of one claim in a version-1 checkpoint (one file), exactly as plugins
/// before the checkpoint directory wrote it, made from this build's record of `uid`.
fn version1_checkpoint(env: &Env, boot: &str, uids: &[&str]) -> String {
    let claims: serde_json::Map<String, serde_json::Value> = uids
        .iter()
        .map(|uid| {
            let rec: serde_json::Value =
                serde_json::from_slice(&std::fs::read(env.record_path(uid)).unwrap()).unwrap();
            ((*uid).to_owned(), rec["claim"].clone())
        })
        .collect();
    serde_json::to_string(&json!({"version": 1, "bootId": boot, "claims": claims})).unwrap()
}

#[tokio::test]
async fn an_upgrade_from_the_single_file_checkpoint_keeps_prepared_claims() {
    let env = Env::new();
    let c1 = env.add("c1", "uid-1", "gpu-0");
    let c2 = env.add("c2", "uid-2", "gpu-1");
    let run = env.dir.path().join("run");
    let (devices1, devices2) = {
        let (plugin, _) = env.start("b1");
        (
            plugin.prepare(&c1).await.unwrap(),
            plugin.prepare(&c2).await.unwrap(),
        )
    };
    // What an older plugin leaves: its claims' files and one checkpoint.json, no
    // checkpoint directory.
    let v1 = version1_checkpoint(&env, "b1", &["uid-1", "uid-2"]);
    assert!(v1.contains(r#""state":"PrepareCompleted""#), "{v1}");
    std::fs::remove_dir_all(run.join(CHECKPOINT_DIR)).unwrap();
    std::fs::write(run.join(CHECKPOINT_FILE), &v1).unwrap();

    let (plugin, report) = env.start("b1");
    assert_eq!(report.notes, []);
    assert_eq!(report.migrated_from, Some(run.join(CHECKPOINT_FILE)));
    assert!(
        report.removed_orphans.is_empty(),
        "{:?}",
        report.removed_orphans
    );
    assert!(
        !run.join(CHECKPOINT_FILE).exists(),
        "migrated, then removed"
    );
    assert!(env.record_path("uid-1").exists() && env.record_path("uid-2").exists());
    // Still prepared: the same CDI ids without reading the claims again.
    env.source.remove("ns", "c1");
    env.source.remove("ns", "c2");
    assert_eq!(plugin.prepare(&c1).await.unwrap(), devices1);
    assert_eq!(plugin.prepare(&c2).await.unwrap(), devices2);
    let metrics = plugin.metrics().encode();
    assert!(
        metrics.contains("fgpu_kubelet_plugin_prepared_claims 2\n"),
        "{metrics}"
    );
    plugin.unprepare(&c1).await.unwrap();
    assert!(!env.spec_path("uid-1").exists() && !env.claim_dir("uid-1").exists());
    drop(plugin);
    let (plugin, report) = env.start("b1");
    assert_eq!(report.migrated_from, None);
    assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-2"]);
    drop(plugin);

    // A migration interrupted after some records were written (and with a record the
    // file does not have): the file is the state and the migration is done again.
    std::fs::write(run.join(CHECKPOINT_FILE), &v1).unwrap();
    std::fs::remove_file(env.record_path("uid-2")).unwrap();
    std::fs::write(
        env.record_path("uid-stale"),
        br#"{"version": 2, "bootId": "b1", "uid": "uid-stale", "claim": {}}"#,
    )
    .unwrap();
    let (plugin, report) = env.start("b1");
    assert_eq!(report.migrated_from, Some(run.join(CHECKPOINT_FILE)));
    assert_eq!(
        plugin.claims().keys().collect::<Vec<_>>(),
        ["uid-1", "uid-2"]
    );
    assert!(!env.record_path("uid-stale").exists());
    drop(plugin);

    // A version-1 checkpoint of another boot: discarded like records of another boot.
    std::fs::write(run.join(CHECKPOINT_FILE), v1.replace("\"b1\"", "\"b0\"")).unwrap();
    let (plugin, report) = env.start("b1");
    assert!(
        matches!(&report.notes[..], [LoadNote::BootChanged { previous, .. }] if previous == "b0"),
        "{:?}",
        report.notes
    );
    assert!(plugin.claims().is_empty());
    assert!(!env.record_path("uid-1").exists());
    assert!(
        !env.spec_path("uid-2").exists(),
        "files of discarded claims removed"
    );
    drop(plugin);

    // A corrupt version-1 checkpoint: moved aside, reported, a clean start.
    std::fs::write(run.join(CHECKPOINT_FILE), b"{garbage").unwrap();
    let (plugin, report) = env.start("b1");
    assert!(
        matches!(&report.notes[..], [LoadNote::Corrupt { moved_to, .. }]
            if *moved_to == run.join("checkpoint.json.corrupt-1")),
        "{:?}",
        report.notes
    );
    assert!(plugin.claims().is_empty());
    assert!(!run.join(CHECKPOINT_FILE).exists());
}

#[tokio::test]
async fn a_checkpoint_in_the_state_dir_is_migrated() {
    let env = Env::new();
    let c = env.add("c", "uid-1", "gpu-0");
    let state = env.dir.path().join("state");
    let run = env.dir.path().join("run");
    // An older plugin that kept everything under the state directory: its claim's
    // directory there, its checkpoint.json there.
    let devices = {
        let cfg = PluginConfig {
            run_root: state.clone(),
            ..env.cfg("b1")
        };
        let (plugin, _) = Plugin::start(cfg, env.source.clone(), env.backend.clone()).unwrap();
        plugin.prepare(&c).await.unwrap()
    };
    let old_dir = state.join("claims/uid-1");
    assert!(old_dir.join("limits").exists());
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("checkpoint/uid-1.json")).unwrap())
            .unwrap();
    std::fs::remove_dir_all(state.join(CHECKPOINT_DIR)).unwrap();
    let v1 = json!({"version": 1, "bootId": "b1", "claims": {"uid-1": record["claim"]}});
    std::fs::write(state.join(CHECKPOINT_FILE), v1.to_string()).unwrap();
    create_private_dir(&state.join("claims/uid-orphan")).unwrap();

    let (plugin, report) = env.start("b1");
    assert_eq!(report.notes, []);
    assert_eq!(report.migrated_from, Some(state.join(CHECKPOINT_FILE)));
    assert_eq!(report.removed_orphans, [state.join("claims/uid-orphan")]);
    assert!(!state.join(CHECKPOINT_FILE).exists());
    assert!(env.record_path("uid-1").exists());
    // The claim is still prepared, its files where they were.
    env.source.remove("ns", "c");
    assert_eq!(plugin.prepare(&c).await.unwrap(), devices);
    assert!(old_dir.exists());
    plugin.unprepare(&c).await.unwrap();
    assert!(!old_dir.exists());
    assert!(!env.spec_path("uid-1").exists());
    drop(plugin);
    let (plugin, report) = env.start("b1");
    assert_eq!(report.migrated_from, None);
    assert!(plugin.claims().is_empty());
    drop(plugin);

    // Version-1 files in both places (an older plugin ran again): the newer is the
    // state, both are removed.
    let older = CheckpointFile::new(run.join(CHECKPOINT_FILE));
    let mut cp = crate::checkpoint::Checkpoint::new("b1");
    cp.claims.insert("uid-run".into(), ClaimRecord::default());
    older.save(&cp).unwrap();
    let newer = CheckpointFile::new(state.join(CHECKPOINT_FILE));
    cp.claims.clear();
    cp.claims.insert("uid-old".into(), ClaimRecord::default());
    newer.save(&cp).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(10);
    std::fs::File::options()
        .write(true)
        .open(newer.path())
        .unwrap()
        .set_modified(later)
        .unwrap();
    let (plugin, report) = env.start("b1");
    assert_eq!(report.migrated_from, Some(newer.path().to_owned()));
    assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-old"]);
    assert!(!newer.path().exists() && !older.path().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_prepare_keeps_the_claim_locked_until_its_files_are_done() {
    let env = Env::new();
    let cfg = PluginConfig {
        test_pause: Some(std::time::Duration::from_millis(300)),
        ..env.cfg("b1")
    };
    let (plugin, _) = Plugin::start(cfg, env.source.clone(), env.backend.clone()).unwrap();
    let plugin = Arc::new(plugin);
    let c = env.add("c", "uid-1", "gpu-0");
    let task = {
        let (plugin, c) = (plugin.clone(), c.clone());
        tokio::spawn(async move { plugin.prepare(&c).await })
    };
    // The kubelet gives up on the call while the claim's files are being written.
    while !env.spec_path("uid-1").exists() {
        tokio::task::yield_now().await;
    }
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // The unprepare that follows waits for the dropped prepare's task, then removes
    // everything it wrote: nothing is left behind.
    plugin.unprepare(&c).await.unwrap();
    assert!(!env.spec_path("uid-1").exists());
    assert!(!env.claim_dir("uid-1").exists());
    assert!(!env.record_path("uid-1").exists());
    assert!(plugin.claims().is_empty());
}

#[tokio::test]
async fn a_gpu_the_last_reading_missed_is_read_again() {
    let env = Env::new();
    let (plugin, _) = env.start("b1");
    plugin
        .prepare(&env.add("a", "uid-a", "gpu-0"))
        .await
        .unwrap();
    // Prepares use the last reading; a device it lacks makes them read the backend.
    unpoisoned(&env.backend.0).push(gpu(2, "0000:3b:00.0"));
    let devices = plugin
        .prepare(&env.add("b", "uid-b", "gpu-2"))
        .await
        .unwrap();
    assert_eq!(devices[0].device_name, "gpu-2");
    // What the backend no longer lists stays usable until the next reading.
    unpoisoned(&env.backend.0).clear();
    plugin
        .prepare(&env.add("c", "uid-c", "gpu-1"))
        .await
        .unwrap();
    plugin.set_inventory(NodeInventory::new("n1", vec![]));
    let e = plugin
        .prepare(&env.add("d", "uid-d", "gpu-1"))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "unknown_device", "{e}");
}

#[tokio::test]
async fn stale_claims_are_cleaned_up() {
    let env = Env::new();
    let (plugin, _) = env.start("b1");
    let keep = env.add("keep", "uid-k", "gpu-0");
    let gone = env.add("gone", "uid-g", "gpu-0");
    let replaced = env.add("repl", "uid-r", "gpu-1");
    for c in [&keep, &gone, &replaced] {
        plugin.prepare(c).await.unwrap();
    }
    env.source.remove("ns", "gone");
    env.add("repl", "uid-r2", "gpu-1");
    // The first sweep that sees them gone or replaced only suspects them.
    let report = plugin.cleanup_stale().await;
    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(report.removed, Vec::<String>::new());
    assert_eq!(
        report.suspected,
        [
            "ns/gone (uid-g): not found",
            "ns/repl (uid-r): replaced by uid uid-r2"
        ]
    );
    assert_eq!(plugin.claims().len(), 3);
    assert!(env.claim_dir("uid-g").exists() && env.spec_path("uid-r").exists());
    let report = plugin.cleanup_stale().await;
    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(report.removed, ["ns/gone (uid-g)", "ns/repl (uid-r)"]);
    assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-k"]);
    assert!(!env.claim_dir("uid-g").exists());
    assert!(env.claim_dir("uid-k").exists());
    assert!(env.claim_dir("uid-k").join("state/memory.state").exists());
    // The GPU's priority file is the node's, not the claim's: it stays.
    assert!(
        env.dir
            .path()
            .join("state/gpus/GPU-00000000-0000-0000-0000-000000000000.priority")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_prepares() {
    let env = Env::new();
    let (plugin, _) = env.start("b1");
    let plugin = Arc::new(plugin);
    let claims: Vec<ClaimRef> = (0..6)
        .map(|i| env.add(&format!("c{}", i % 3), &format!("uid-{}", i % 3), "gpu-0"))
        .collect();
    let mut set = tokio::task::JoinSet::new();
    for c in claims.clone() {
        let p = plugin.clone();
        set.spawn(async move { (c.uid.clone(), p.prepare(&c).await.unwrap()) });
    }
    let mut by_uid: HashMap<String, Vec<PreparedDevice>> = HashMap::new();
    while let Some(r) = set.join_next().await {
        let (uid, devices) = r.unwrap();
        if let Some(prev) = by_uid.insert(uid, devices.clone()) {
            assert_eq!(prev, devices);
        }
    }
    assert_eq!(by_uid.len(), 3);
    assert_eq!(plugin.claims().len(), 3);
    assert!(unpoisoned(&plugin.locks).is_empty(), "locks are released");
}

struct Hanging;

impl ClaimSource for Hanging {
    async fn get(&self, _: &str, _: &str) -> Result<Option<ResourceClaim>, SourceError> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_silent_api_server_fails_the_claim_in_time() {
    let env = Env::new();
    let cfg = PluginConfig {
        claim_get_timeout: std::time::Duration::from_millis(20),
        ..env.cfg("b1")
    };
    let (plugin, _) = Plugin::start(cfg, Hanging, env.backend.clone()).unwrap();
    let c = ClaimRef {
        namespace: "ns".into(),
        name: "c".into(),
        uid: "uid-1".into(),
    };
    let e = plugin.prepare(&c).await.unwrap_err();
    assert_eq!(e.reason(), "api");
    assert_eq!(
        e.to_string(),
        "claim ns/c: cannot read it: no answer within 20ms"
    );
    assert!(plugin.claims().is_empty());
}

/// What a tenant could leave in the GPU directory while it was world-writable (1777): a
/// link to another claim's account, a forged file of its own, a directory. Start removes
/// them, a prepare replaces a link by a real file and never follows it.
#[tokio::test]
async fn the_gpu_directory_is_cleaned_of_what_tenants_left() {
    use std::os::unix::fs::PermissionsExt as _;
    let env = Env::new();
    let gpus = env.dir.path().join("state/gpus");
    std::fs::create_dir_all(&gpus).unwrap();
    std::fs::set_permissions(&gpus, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = env.dir.path().join("victim");
    std::fs::write(&victim, b"secret").unwrap();
    let p0 = gpus.join("GPU-00000000-0000-0000-0000-000000000000.priority");
    let p1 = gpus.join("GPU-00000001-0000-0000-0000-000000000000.priority");
    std::os::unix::fs::symlink(&victim, &p1).unwrap();
    std::fs::write(&p0, b"short").unwrap();
    std::fs::write(gpus.join("junk"), b"x").unwrap();
    std::fs::create_dir(gpus.join("GPU-dir.priority")).unwrap();

    let (plugin, report) = env.start("b1");
    assert_eq!(mode(&gpus), 0o755);
    let mut removed: Vec<_> = report
        .removed_orphans
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    removed.sort();
    assert_eq!(
        removed,
        [
            "GPU-00000000-0000-0000-0000-000000000000.priority",
            "GPU-00000001-0000-0000-0000-000000000000.priority",
            "GPU-dir.priority",
            "junk"
        ]
    );
    // A link planted after start: prepare replaces the link, the target is untouched.
    std::os::unix::fs::symlink(&victim, &p1).unwrap();
    let c = env.add("c", "uid-1", "gpu-1");
    plugin.prepare(&c).await.unwrap();
    assert!(
        std::fs::symlink_metadata(&p1)
            .unwrap()
            .file_type()
            .is_file()
    );
    assert_eq!(std::fs::read(&p1).unwrap(), [0u8; 64]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"secret");
}

/// A claim that asks `priority: high` in a class that does not allow it fails at prepare
/// with a field error, before any file is written.
#[tokio::test]
async fn high_priority_without_the_class_allowing_it_is_refused() {
    let env = Env::new();
    let (plugin, _) = env.start("b1");
    let claim = |uid: &str, name: &str, class_allows: bool| {
        let mut config = vec![json!({"source": "FromClaim", "requests": [],
            "opaque": {"driver": "gpu.fgpu.dev", "parameters": {
                "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig",
                "priority": "high"}}})];
        if class_allows {
            config.insert(
                0,
                json!({"source": "FromClass", "requests": ["gpu"],
                "opaque": {"driver": "gpu.fgpu.dev", "parameters": {
                    "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig",
                    "allowHighPriority": true}}}),
            );
        }
        env.source.insert(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "status": {"allocation": {"devices": {"results": [{
                    "request": "gpu", "driver": "gpu.fgpu.dev", "pool": "n1",
                    "device": "gpu-0", "shareID": "s1",
                    "consumedCapacity": {"memory": "1Gi"}}], "config": config}}}
            }))
            .unwrap(),
        );
        ClaimRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
        }
    };
    let bad = claim("uid-h1", "greedy", false);
    let e = plugin.prepare(&bad).await.unwrap_err().to_string();
    assert!(
        e.starts_with(r#"claim ns/greedy: status.allocation.devices.config[0].opaque.parameters.priority: "high" is not allowed for request "gpu""#),
        "{e}"
    );
    assert!(!env.claim_dir("uid-h1").exists());
    assert!(!env.spec_path("uid-h1").exists());

    let good = claim("uid-h2", "allowed", true);
    plugin.prepare(&good).await.unwrap();
    let limits = std::fs::read_to_string(env.claim_dir("uid-h2").join("limits")).unwrap();
    assert!(limits.contains("\npriority=high\n"), "{limits}");
    let spec = std::fs::read_to_string(env.spec_path("uid-h2")).unwrap();
    let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
    let prio = spec["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| {
            m["containerPath"]
                .as_str()
                .unwrap()
                .starts_with("/run/fgpu/gpus/")
        })
        .unwrap();
    assert_eq!(prio["options"][0], "rw");
}

#[tokio::test]
async fn the_research_tier_is_kept_apart_and_tells_the_shim_its_physical_share() {
    let env = Env::new();
    let (plugin, _) = env.start("b1");
    let tier_gpu = gpu(0, "0000:1b:00.0").uuid;
    plugin.set_gpu_tiers(BTreeMap::from([(tier_gpu.clone(), "1.5".parse().unwrap())]));
    // A 3 GiB share on `device`; `oversubscribe: true` from the class (the research class).
    let claim = |uid: &str, name: &str, device: &str, research: bool| {
        let config: Vec<serde_json::Value> = if research {
            vec![json!({"source": "FromClass", "requests": [],
                "opaque": {"driver": "gpu.fgpu.dev", "parameters": {
                    "apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig",
                    "oversubscribe": true}}})]
        } else {
            vec![]
        };
        env.source.insert(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "status": {"allocation": {"devices": {"results": [{
                    "request": "gpu", "driver": "gpu.fgpu.dev", "pool": "n1",
                    "device": device, "shareID": "s1",
                    "consumedCapacity": {"memory": "3Gi"}}], "config": config}}}
            }))
            .unwrap(),
        );
        ClaimRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
        }
    };
    let research = claim("uid-r1", "research", "gpu-0", true);
    plugin.prepare(&research).await.unwrap();
    let limits = std::fs::read_to_string(env.claim_dir("uid-r1").join("limits")).unwrap();
    let uuid = crate::edits::contract_uuid(&tier_gpu);
    assert!(
        limits.contains(&format!("gpu.{uuid}.physical={}\n", 2u64 << 30)),
        "{limits}"
    );
    for (uid, name, device, research, want) in [
        (
            "uid-r2",
            "prod-on-tier",
            "gpu-0",
            false,
            "gpu-0 is on the research tier",
        ),
        (
            "uid-r3",
            "research-off-tier",
            "gpu-1",
            true,
            "which is not on the research tier",
        ),
    ] {
        let c = claim(uid, name, device, research);
        let e = plugin.prepare(&c).await.unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "claim ns/{name}: status.allocation.devices.results[0]"
            )) && e.contains(want),
            "{e}"
        );
        assert!(
            !env.claim_dir(uid).exists() && !env.spec_path(uid).exists(),
            "{name}"
        );
    }
    // Off the tier again (no claim on GPU 0 but the research one: the keeper decides when),
    // a production claim is taken there.
    plugin.set_gpu_tiers(BTreeMap::new());
    plugin
        .prepare(&claim("uid-r4", "prod", "gpu-0", false))
        .await
        .unwrap();
    let limits = std::fs::read_to_string(env.claim_dir("uid-r4").join("limits")).unwrap();
    assert!(!limits.contains(".physical="), "{limits}");
}

/// A claim source whose every answer a test sets: a claim source as flaky as an API server
/// can be.
struct Scripted {
    /// The claims while neither failing nor silent: `Env::source`.
    claims: Arc<MapClaimSource>,
    /// While set, every GET fails with this error (a 5xx, a 404 that names nothing).
    failing: Mutex<Option<String>>,
    /// While set, every GET hangs (an API server that stopped answering).
    silent: std::sync::atomic::AtomicBool,
}

impl ClaimSource for Scripted {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, SourceError> {
        if self.silent.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if let Some(e) = unpoisoned(&self.failing).clone() {
            return Err(SourceError(e));
        }
        self.claims.get(namespace, name).await
    }
}

/// A plugin over `env`'s directories reading `env`'s claims through a [`Scripted`] source,
/// with a short claim timeout.
fn scripted(env: &Env) -> (Plugin<Arc<Scripted>>, Arc<Scripted>) {
    let source = Arc::new(Scripted {
        claims: env.source.clone(),
        failing: Mutex::new(None),
        silent: std::sync::atomic::AtomicBool::new(false),
    });
    let cfg = PluginConfig {
        claim_get_timeout: std::time::Duration::from_millis(20),
        ..env.cfg("b1")
    };
    let (plugin, _) = Plugin::start(cfg, source.clone(), env.backend.clone()).unwrap();
    (plugin, source)
}

/// Sweeps `n` times; returns the last report.
async fn sweeps<S: ClaimSource>(plugin: &Plugin<S>, n: usize) -> CleanupReport {
    let mut last = CleanupReport::default();
    for _ in 0..n {
        last = plugin.cleanup_stale().await;
    }
    last
}

#[tokio::test]
async fn a_claim_seen_gone_once_keeps_its_state_and_twice_loses_it() {
    let env = Env::new();
    let (plugin, _) = scripted(&env);
    let c = env.add("c", "uid-1", "gpu-0");
    plugin.prepare(&c).await.unwrap();
    env.source.remove("ns", "c");
    let first = plugin.cleanup_stale().await;
    assert_eq!(first.removed, Vec::<String>::new());
    assert_eq!(first.suspected, ["ns/c (uid-1): not found"]);
    assert!(plugin.claims().contains_key("uid-1"));
    assert!(env.spec_path("uid-1").exists() && env.claim_dir("uid-1").exists());
    let second = plugin.cleanup_stale().await;
    assert_eq!(second.removed, ["ns/c (uid-1)"]);
    assert!(plugin.claims().is_empty());
    assert!(!env.spec_path("uid-1").exists() && !env.claim_dir("uid-1").exists());
    assert!(!env.record_path("uid-1").exists());
}

#[tokio::test]
async fn a_claim_replaced_twice_loses_its_state_and_reappearing_starts_over() {
    let env = Env::new();
    let (plugin, _) = scripted(&env);
    let c = env.add("c", "uid-1", "gpu-0");
    plugin.prepare(&c).await.unwrap();
    // Replaced, then back with its own UID between two sweeps: no longer a suspect.
    env.add("c", "uid-2", "gpu-0");
    assert_eq!(
        plugin.cleanup_stale().await.suspected,
        ["ns/c (uid-1): replaced by uid uid-2"]
    );
    env.add("c", "uid-1", "gpu-0");
    assert_eq!(plugin.cleanup_stale().await, CleanupReport::default());
    env.add("c", "uid-2", "gpu-0");
    let report = plugin.cleanup_stale().await;
    assert_eq!(report.removed, Vec::<String>::new(), "one sighting since");
    assert!(plugin.claims().contains_key("uid-1"));
    // Gone, then prepared again by the kubelet: that too starts over.
    env.source.remove("ns", "c");
    plugin.cleanup_stale().await;
    env.add("c", "uid-1", "gpu-0");
    plugin.prepare(&c).await.unwrap();
    env.add("c", "uid-2", "gpu-0");
    let report = plugin.cleanup_stale().await;
    assert_eq!(report.removed, Vec::<String>::new(), "prepared since");
    assert!(env.spec_path("uid-1").exists());
    // Two sightings in a row: removed.
    let report = plugin.cleanup_stale().await;
    assert_eq!(report.removed, ["ns/c (uid-1)"]);
    assert!(!env.spec_path("uid-1").exists() && !env.claim_dir("uid-1").exists());
}

#[tokio::test]
async fn errors_and_timeouts_keep_every_claims_state_however_many_sweeps() {
    let env = Env::new();
    let (plugin, source) = scripted(&env);
    let claims = [
        env.add("a", "uid-a", "gpu-0"),
        env.add("b", "uid-b", "gpu-1"),
    ];
    for c in &claims {
        plugin.prepare(c).await.unwrap();
    }
    let kept = |plugin: &Plugin<Arc<Scripted>>| {
        plugin.claims().len() == 2
            && claims
                .iter()
                .all(|c| env.spec_path(&c.uid).exists() && env.claim_dir(&c.uid).exists())
    };
    for error in [
        "GET v1/namespaces/ns/resourceclaims/a: 404 page not found",
        "GET v1/namespaces/ns/resourceclaims/a: the server could not find the requested resource",
        "GET v1/namespaces/ns/resourceclaims/a: etcdserver: request timed out (500)",
    ] {
        *unpoisoned(&source.failing) = Some(error.to_owned());
        let report = sweeps(&plugin, 10).await;
        assert_eq!(report.errors.len(), 2, "{error}: {report:?}");
        assert!(report.errors[0].contains(error), "{report:?}");
        assert!(kept(&plugin), "{error}");
    }
    *unpoisoned(&source.failing) = None;
    source
        .silent
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // The outer limit only turns a hang into a failure; the sweep's own limit is 20 ms.
    let report = tokio::time::timeout(std::time::Duration::from_secs(60), sweeps(&plugin, 5))
        .await
        .expect("the sweep gives up on a silent API server");
    assert_eq!(
        report.errors,
        [
            "claim ns/a (uid-a): cannot read it: no answer within 20ms; its state is kept",
            "claim ns/b (uid-b): cannot read it: no answer within 20ms; its state is kept",
        ]
    );
    assert!(kept(&plugin));
}

#[tokio::test]
async fn an_error_between_two_sightings_neither_counts_nor_clears() {
    let env = Env::new();
    let (plugin, source) = scripted(&env);
    let c = env.add("c", "uid-1", "gpu-0");
    plugin.prepare(&c).await.unwrap();
    env.source.remove("ns", "c");
    plugin.cleanup_stale().await;
    *unpoisoned(&source.failing) = Some("503".into());
    let report = sweeps(&plugin, 3).await;
    assert_eq!(report.removed, Vec::<String>::new());
    assert!(env.spec_path("uid-1").exists());
    *unpoisoned(&source.failing) = None;
    assert_eq!(plugin.cleanup_stale().await.removed, ["ns/c (uid-1)"]);
}

#[tokio::test]
async fn the_dra_sweep_leaves_the_device_plugins_claims_alone() {
    let env = Env::new();
    let (plugin, _) = scripted(&env);
    // A device-plugin container's claim, named <pod>/<container>, in the same checkpoint.
    let container = env.add("pod-1/main", "pod-uid-1-main", "gpu-0");
    let dra = env.add("c", "uid-1", "gpu-1");
    plugin.prepare(&container).await.unwrap();
    plugin.prepare(&dra).await.unwrap();
    // No ResourceClaim has either name now.
    env.source.remove("ns", "pod-1/main");
    env.source.remove("ns", "c");
    let report = sweeps(&plugin, 5).await;
    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(
        plugin.claims().keys().collect::<Vec<_>>(),
        ["pod-uid-1-main"]
    );
    assert!(env.spec_path("pod-uid-1-main").exists());
    assert!(env.claim_dir("pod-uid-1-main").exists());
    assert!(!env.spec_path("uid-1").exists());
}

#[tokio::test]
async fn a_start_never_sweeps_what_the_other_front_end_recorded_since_it_loaded() {
    let env = Env::new();
    // Both front ends over the same directories: `dra` loads the checkpoint, then the
    // device plugin prepares a container before `dra`'s start-up sweep runs.
    let (dra, _) = env.start("b1");
    let (device_plugin, _) = env.start("b1");
    let container = env.add("pod-1/main", "pod-uid-1-main", "gpu-0");
    device_plugin.prepare(&container).await.unwrap();
    let mut report = StartReport::default();
    dra.remove_orphans(&mut report);
    assert_eq!(report.removed_orphans, Vec::<PathBuf>::new());
    assert!(env.spec_path("pod-uid-1-main").exists());
    assert!(env.claim_dir("pod-uid-1-main").join("limits").exists());
    assert_eq!(
        report.kept_unloaded,
        [
            env.claim_dir("pod-uid-1-main"),
            env.spec_path("pod-uid-1-main")
        ]
    );
    // Once the device plugin unprepared it, nothing is left to sweep.
    device_plugin.unprepare(&container).await.unwrap();
    assert!(!env.claim_dir("pod-uid-1-main").exists());
}

#[tokio::test]
async fn a_corrupt_version1_checkpoint_keeps_every_claims_files() {
    let env = Env::new();
    let c = env.add("c", "uid-1", "gpu-0");
    let kept = env.add("d", "uid-2", "gpu-1");
    {
        let (plugin, _) = env.start("b1");
        plugin.prepare(&c).await.unwrap();
        plugin.prepare(&kept).await.unwrap();
    }
    // An older plugin ran last: it kept its claims in one file (now corrupt), not in the
    // directory, where only uid-2's record is left from before.
    std::fs::remove_file(env.record_path("uid-1")).unwrap();
    std::fs::write(env.dir.path().join("run").join(CHECKPOINT_FILE), b"{torn").unwrap();
    let (plugin, report) = env.start("b1");
    assert!(
        matches!(report.notes[..], [LoadNote::Corrupt { .. }]),
        "{:?}",
        report.notes
    );
    assert_eq!(report.removed_orphans, Vec::<PathBuf>::new());
    assert_eq!(
        report.kept_unloaded,
        [env.claim_dir("uid-1"), env.spec_path("uid-1")]
    );
    assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-2"]);
    assert!(!env.dir.path().join("run").join(CHECKPOINT_FILE).exists());
    // And at every later start.
    drop(plugin);
    let (plugin, report) = env.start("b1");
    assert_eq!(report.removed_orphans, Vec::<PathBuf>::new());
    assert!(env.spec_path("uid-1").exists() && env.claim_dir("uid-1").join("limits").exists());
    // The kubelet's unprepare removes them.
    plugin.unprepare(&c).await.unwrap();
    assert!(!env.spec_path("uid-1").exists() && !env.claim_dir("uid-1").exists());
}

#[tokio::test]
async fn files_a_failed_unprepare_of_the_sweep_left_go_in_the_same_sweep() {
    use crate::checkpoint::fault::{Fault, Plan};
    let env = Env::new();
    let (plugin, _) = scripted(&env);
    let c = env.add("c", "uid-1", "gpu-0");
    let live = env.add("live", "uid-2", "gpu-1");
    plugin.prepare(&c).await.unwrap();
    plugin.prepare(&live).await.unwrap();
    env.source.remove("ns", "c");
    plugin.cleanup_stale().await;
    // The second sweep unprepares c, and the removal of its spec (the step after the
    // record's) fails: the record is gone, the files are left; the same sweep then finds
    // files that nothing names and removes them. The live claim's stay.
    let plan = Plan::new(env.dir.path(), Some((1, Fault::Errno(5))));
    let report = plugin.cleanup_stale().await;
    drop(plan);
    assert_eq!(report.removed, Vec::<String>::new());
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert!(
        report.errors[0].contains("gpu.fgpu.dev-claim_uid-1.json"),
        "{report:?}"
    );
    assert_eq!(
        report.removed_files,
        [env.claim_dir("uid-1"), env.spec_path("uid-1")]
    );
    assert!(!env.record_path("uid-1").exists());
    assert!(!env.spec_path("uid-1").exists() && !env.claim_dir("uid-1").exists());
    assert!(env.spec_path("uid-2").exists() && env.claim_dir("uid-2").exists());
    assert_eq!(plugin.cleanup_stale().await, CleanupReport::default());
}
