//! Claims of MIG placement devices over the fake backend: the instance is created once
//! and recorded, destroyed at unprepare, left nowhere by a failed creation or by a fault
//! at any step (crash, ENOSPC, EIO), and reconciled at start.

use std::collections::BTreeSet;

use fgpu_driver::backend::FakeBackend;
use fgpu_driver::backend::fake::{FaultFile, MIG_CREATE_FAILS, faults_path};
use fgpu_driver::mig::{MigInstance, Placement};

use super::*;
use crate::checkpoint::fault::{self, Fault, Op, Plan};

const H100: &str = "GPU-a1c44256-6d3a-4972-9ea9-d296185fc8ff";
const SHARED: &str = "GPU-63367e56-cdb4-4537-be42-f7abdf387237";
const FAULTS: [Fault; 3] = [Fault::Crash, Fault::Errno(28), Fault::Errno(5)];

/// The fake backend, each instance creation and destruction counted by the fault plan
/// (as `Device mig/<op>` under the test's directory) and failing where the plan says.
struct Counted {
    inner: FakeBackend,
    root: PathBuf,
}

impl Counted {
    fn step(&self, op: &str) -> Result<(), BackendError> {
        fault::check(&self.root.join("mig").join(op), Op::Device).map_err(|f| {
            BackendError::MigCreateFailed {
                uuid: H100.into(),
                profile: op.into(),
                placement: Placement { start: 0, size: 0 },
                detail: f.error.to_string(),
            }
        })
    }
}

impl DeviceBackend for Counted {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn enumerate(&self) -> Result<Vec<Gpu>, BackendError> {
        self.inner.enumerate()
    }
    fn create_mig_instance(
        &self,
        gpu: &str,
        profile: &str,
        placement: Placement,
    ) -> Result<MigInstance, BackendError> {
        self.step("create")?;
        self.inner.create_mig_instance(gpu, profile, placement)
    }
    fn destroy_mig_instance(&self, gpu: &str, mig: &str) -> Result<(), BackendError> {
        self.step("destroy")?;
        self.inner.destroy_mig_instance(gpu, mig)
    }
    fn list_mig_instances(&self, gpu: &str) -> Result<Vec<MigInstance>, BackendError> {
        self.inner.list_mig_instances(gpu)
    }
    fn gpu_mode(&self, gpu: &str) -> Option<fgpu_driver::device::GpuMode> {
        self.inner.gpu_mode(gpu)
    }
}

/// An [`Env`] whose node is a fake H100 in MIG mode (index 0) and one in shared mode.
struct MigEnv {
    env: Env,
    profile: PathBuf,
    backend: Arc<Counted>,
}

impl MigEnv {
    fn new() -> Self {
        let env = Env::new();
        let fake = env.dir.path().join("fake");
        std::fs::create_dir_all(&fake).unwrap();
        let profile = fake.join("node.yaml");
        let gpu = |uuid: &str, extra: &str| {
            format!(
                "      - uuid: {uuid}\n        productName: NVIDIA H100 80GB HBM3\n        memory: 81559Mi\n        smCount: 132\n        computeCapability: \"9.0\"\n        migCapable: true\n{extra}"
            )
        };
        let text = format!(
            "defaults:\n  deviceRoot: /dev\nnodes:\n  - name: n1\n    gpus:\n{}{}",
            gpu(H100, "        mode: mig\n"),
            gpu(SHARED, "")
        );
        std::fs::write(&profile, text).unwrap();
        let backend = Arc::new(Counted {
            inner: FakeBackend::open(&profile, None).unwrap(),
            root: env.dir.path().to_owned(),
        });
        Self {
            env,
            profile,
            backend,
        }
    }

    /// The plugin started (and its MIG instances reconciled, as `serve` does).
    fn start(&self) -> (Plugin<Arc<MapClaimSource>>, MigReconcile) {
        let (plugin, _) = Plugin::start(
            self.env.cfg("b1"),
            self.env.source.clone(),
            self.backend.clone(),
        )
        .unwrap();
        let r = plugin.reconcile_mig();
        assert_eq!(r.errors, Vec::<String>::new());
        (plugin, r)
    }

    /// A claim of one MIG placement device.
    fn add(&self, name: &str, uid: &str, device: &str) -> ClaimRef {
        self.env.source.insert(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "status": {"allocation": {"devices": {"results": [{
                    "request": "gpu", "driver": "gpu.fgpu.dev", "pool": "n1",
                    "device": device}]}}}
            }))
            .unwrap(),
        );
        ClaimRef {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    fn instances(&self) -> Vec<MigInstance> {
        self.backend.inner.list_mig_instances(H100).unwrap()
    }

    /// The UUIDs of the instances the records name.
    fn recorded(plugin: &Plugin<Arc<MapClaimSource>>) -> BTreeSet<String> {
        plugin
            .claims()
            .values()
            .flat_map(|r| r.devices.clone())
            .filter_map(|d| d.mig?.uuid)
            .collect()
    }

    fn spec(&self, uid: &str) -> String {
        std::fs::read_to_string(self.env.spec_path(uid)).unwrap()
    }
}

#[tokio::test]
async fn prepare_creates_one_instance_a_retry_none_and_unprepare_destroys_it() {
    let m = MigEnv::new();
    let (plugin, _) = m.start();
    let c = m.add("c", "uid-1", "gpu-0-mig-1g10gb-6");
    let devices = plugin.prepare(&c).await.unwrap();
    let inst = m.instances();
    assert_eq!(inst.len(), 1);
    assert_eq!(
        (inst[0].profile.as_str(), inst[0].placement.start),
        ("1g.10gb", 6)
    );
    let mig = devices[0].mig.clone().unwrap();
    assert_eq!(mig.uuid.as_deref(), Some(inst[0].uuid.as_str()));
    assert_eq!(
        (mig.profile.as_str(), mig.start, mig.size),
        ("1g.10gb", 6, 1)
    );
    assert_eq!(devices[0].gpu_uuid, H100);
    assert_eq!(devices[0].memory_bytes, 10 << 30);
    assert_eq!(plugin.claims()["uid-1"].devices, devices);
    // The spec names the instance and its nodes, and injects no shim.
    let spec = m.spec("uid-1");
    assert!(
        spec.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", inst[0].uuid)),
        "{spec}"
    );
    assert!(
        spec.contains(&format!("CUDA_VISIBLE_DEVICES={}", inst[0].uuid)),
        "{spec}"
    );
    assert!(spec.contains("/dev/nvidia-caps/nvidia-cap"), "{spec}");
    assert!(!spec.contains("libfgpu"), "{spec}");
    assert!(!spec.contains("ld.so.preload"), "{spec}");

    // A retry, and a restart then a retry, create nothing more.
    assert_eq!(plugin.prepare(&c).await.unwrap(), devices);
    drop(plugin);
    let (plugin, r) = m.start();
    assert_eq!(r, MigReconcile::default());
    assert_eq!(plugin.prepare(&c).await.unwrap(), devices);
    assert_eq!(m.instances(), inst);

    plugin.unprepare(&c).await.unwrap();
    assert!(m.instances().is_empty());
    assert!(plugin.claims().is_empty());
    assert!(!m.env.spec_path("uid-1").exists());
    // Unpreparing again: nothing to destroy, success.
    plugin.unprepare(&c).await.unwrap();
}

#[tokio::test]
async fn a_failed_creation_leaves_nothing_and_names_the_claim_device_and_profile() {
    let m = MigEnv::new();
    let (plugin, _) = m.start();
    let mut faults = FaultFile::default();
    faults
        .gpus
        .insert(H100.into(), vec![MIG_CREATE_FAILS.into()]);
    faults.save(&faults_path(&m.profile)).unwrap();
    let c = m.add("c", "uid-1", "gpu-0-mig-3g40gb-4");
    let e = plugin.prepare(&c).await.unwrap_err();
    let text = e.to_string();
    assert_eq!(e.reason(), "mig", "{text}");
    for part in [
        "claim ns/c",
        "gpu-0-mig-3g40gb-4",
        "3g.40gb",
        MIG_CREATE_FAILS,
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    assert!(plugin.claims().is_empty());
    assert!(m.instances().is_empty());
    assert!(!m.env.spec_path("uid-1").exists());
    assert!(!m.env.record_path("uid-1").exists());

    // An instance in the way (overlap) fails the same way.
    std::fs::remove_file(faults_path(&m.profile)).unwrap();
    let other = m.add("o", "uid-2", "gpu-0-mig-1g10gb-5");
    plugin.prepare(&other).await.unwrap();
    let e = plugin.prepare(&c).await.unwrap_err().to_string();
    assert!(e.contains("claim ns/c") && e.contains("3g.40gb"), "{e}");
    assert_eq!(m.instances().len(), 1);
    assert!(!plugin.claims().contains_key("uid-1"));
}

#[tokio::test]
async fn a_placement_of_a_gpu_not_in_mig_mode_or_not_in_the_table_is_refused() {
    let m = MigEnv::new();
    let (plugin, _) = m.start();
    let c = m.add("c", "uid-1", "gpu-1-mig-1g10gb-6");
    let e = plugin.prepare(&c).await.unwrap_err();
    assert_eq!(e.reason(), "mig_mode", "{e}");
    assert!(e.to_string().contains("is in mode shared, not mig"), "{e}");
    // The publisher's modes win over the backend's.
    plugin.set_gpu_modes([(H100.to_owned(), fgpu_driver::device::GpuMode::Whole)].into());
    let c0 = m.add("c0", "uid-0", "gpu-0-mig-1g10gb-6");
    assert_eq!(plugin.prepare(&c0).await.unwrap_err().reason(), "mig_mode");
    let bad = m.add("b", "uid-3", "gpu-0-mig-1g10gb-9");
    let e = plugin.prepare(&bad).await.unwrap_err().to_string();
    assert!(e.contains("is not a MIG placement of GPU 0"), "{e}");
    assert!(m.instances().is_empty());
}

#[tokio::test]
async fn a_claim_mixing_a_mig_placement_with_a_gpu_is_refused_before_anything_is_made() {
    let m = MigEnv::new();
    let (plugin, _) = m.start();
    m.env.source.insert(
        serde_json::from_value(json!({
            "metadata": {"name": "mixed", "namespace": "ns", "uid": "uid-9"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "a", "driver": "gpu.fgpu.dev", "pool": "n1", "device": "gpu-1"},
                {"request": "b", "driver": "gpu.fgpu.dev", "pool": "n1",
                 "device": "gpu-0-mig-1g10gb-6"}]}}}
        }))
        .unwrap(),
    );
    let c = ClaimRef {
        namespace: "ns".into(),
        name: "mixed".into(),
        uid: "uid-9".into(),
    };
    let e = plugin.prepare(&c).await.unwrap_err().to_string();
    assert!(
        e.starts_with("claim ns/mixed: status.allocation.devices.results[1].device: gpu-0-mig-1g10gb-6 is a MIG placement, and gpu-1 is not"),
        "{e}"
    );
    assert!(m.instances().is_empty());
    assert!(plugin.claims().is_empty());
}

#[tokio::test]
async fn reconcile_destroys_unrecorded_instances_and_recreates_or_marks_lost_vanished_ones() {
    let m = MigEnv::new();
    let (plugin, _) = m.start();
    let c = m.add("c", "uid-1", "gpu-0-mig-2g20gb-4");
    let devices = plugin.prepare(&c).await.unwrap();
    let old = devices[0].mig.clone().unwrap().uuid.unwrap();
    // An instance no record names (a crash of an older plugin, an admin's).
    let stray = m
        .backend
        .inner
        .create_mig_instance(H100, "1g.10gb", Placement { start: 0, size: 1 })
        .unwrap();
    // The claim's own instance vanishes (destroyed behind the plugin's back).
    m.backend.inner.destroy_mig_instance(H100, &old).unwrap();
    drop(plugin);
    let (plugin, r) = m.start();
    assert_eq!(r.destroyed, [(H100.to_owned(), stray.uuid.clone())]);
    assert_eq!(
        r.recreated,
        [("ns/c".to_owned(), "gpu-0-mig-2g20gb-4".to_owned())]
    );
    let inst = m.instances();
    assert_eq!(inst.len(), 1);
    assert_ne!(inst[0].uuid, old);
    assert_eq!(
        (inst[0].profile.as_str(), inst[0].placement.start),
        ("2g.20gb", 4)
    );
    assert_eq!(
        MigEnv::recorded(&plugin),
        BTreeSet::from([inst[0].uuid.clone()])
    );
    assert!(m.spec("uid-1").contains(&inst[0].uuid));
    assert!(!m.spec("uid-1").contains(&old));
    let again = plugin.prepare(&c).await.unwrap();
    assert_eq!(
        again[0].mig.as_ref().unwrap().uuid.as_ref(),
        Some(&inst[0].uuid)
    );

    // It vanishes again, and cannot be created: the claim is marked lost.
    m.backend
        .inner
        .destroy_mig_instance(H100, &inst[0].uuid)
        .unwrap();
    let mut faults = FaultFile::default();
    faults
        .gpus
        .insert(H100.into(), vec![MIG_CREATE_FAILS.into()]);
    faults.save(&faults_path(&m.profile)).unwrap();
    drop(plugin);
    let (plugin, r) = m.start();
    assert_eq!(
        r.lost,
        [("ns/c".to_owned(), "gpu-0-mig-2g20gb-4".to_owned())]
    );
    let e = plugin.prepare(&c).await.unwrap_err();
    assert_eq!(e.reason(), "mig_lost", "{e}");
    assert!(e.to_string().contains("its instance is lost"), "{e}");
    // Unprepare still succeeds (nothing to destroy) and forgets the claim.
    plugin.unprepare(&c).await.unwrap();
    assert!(plugin.claims().is_empty());
}

/// The operations of a MIG prepare and unprepare without faults.
async fn baseline() -> (Vec<String>, Vec<String>) {
    let m = MigEnv::new();
    let (plugin, _) = m.start();
    let c = m.add("c", "uid-1", "gpu-0-mig-1g10gb-6");
    let plan = Plan::new(m.env.dir.path(), None);
    plugin.prepare(&c).await.unwrap();
    let prep = plan.seen();
    drop(plan);
    let plan = Plan::new(m.env.dir.path(), None);
    plugin.unprepare(&c).await.unwrap();
    let unprep = plan.seen();
    drop(plan);
    let show = |v: Vec<(Op, PathBuf)>| -> Vec<String> {
        v.into_iter()
            .map(|(op, p)| format!("{op:?} {}", p.display()))
            .collect()
    };
    (show(prep), show(unprep))
}

#[tokio::test]
async fn the_mig_steps_are_numbered() {
    let (prep, unprep) = baseline().await;
    // The MIG steps of docs/reliability.md: the intent, the instance, the record naming it.
    assert_eq!(
        prep[..3],
        [
            "Write run/checkpoint/uid-1.json",
            "Device mig/create",
            "Write run/checkpoint/uid-1.json",
        ]
    );
    assert_eq!(prep.last().unwrap(), "Write run/checkpoint/uid-1.json");
    assert_eq!(
        unprep[..2],
        ["Device mig/destroy", "Remove run/checkpoint/uid-1.json"]
    );
}

/// After the fault and whatever followed: the records name exactly the instances there
/// are (nothing leaked, nothing lost).
fn consistent(m: &MigEnv, plugin: &Plugin<Arc<MapClaimSource>>, what: &str) {
    let live: BTreeSet<String> = m.instances().into_iter().map(|i| i.uuid).collect();
    assert_eq!(MigEnv::recorded(plugin), live, "{what}");
}

/// A fresh node with the plugin started and claim `c` on `gpu-0-mig-1g10gb-6`, prepared
/// when `prepared`.
async fn fresh(prepared: bool) -> (MigEnv, Plugin<Arc<MapClaimSource>>, ClaimRef) {
    let m = MigEnv::new();
    let (plugin, _) = m.start();
    let c = m.add("c", "uid-1", "gpu-0-mig-1g10gb-6");
    if prepared {
        plugin.prepare(&c).await.unwrap();
    }
    (m, plugin, c)
}

/// After a `fault`: the plugin restarted (with the reconcile) when it was a crash, else
/// the same process.
fn after(
    fault: Fault,
    m: &MigEnv,
    plugin: Plugin<Arc<MapClaimSource>>,
) -> Plugin<Arc<MapClaimSource>> {
    match fault {
        Fault::Crash => {
            drop(plugin);
            m.start().0
        }
        Fault::Errno(_) => plugin,
    }
}

#[tokio::test]
async fn a_fault_at_any_step_of_a_mig_prepare_or_unprepare_leaks_no_instance() {
    let (prep, unprep) = baseline().await;
    for (at, step) in prep.iter().enumerate() {
        for fault in FAULTS {
            let what = format!("prepare: {fault:?} at step {} ({step})", at + 1);
            let (m, plugin, c) = fresh(false).await;
            let plan = Plan::new(m.env.dir.path(), Some((at, fault)));
            assert!(plugin.prepare(&c).await.is_err(), "{what}: did not fail");
            drop(plan);
            let plugin = after(fault, &m, plugin);
            let devices = plugin.prepare(&c).await.unwrap();
            assert_eq!(m.instances().len(), 1, "{what}");
            consistent(&m, &plugin, &what);
            assert_eq!(
                devices[0].mig.as_ref().unwrap().uuid.as_ref(),
                Some(&m.instances()[0].uuid),
                "{what}"
            );
            plugin.unprepare(&c).await.unwrap();
            assert!(m.instances().is_empty(), "{what}: after unprepare");

            // The kubelet unprepares instead (the pod was deleted meanwhile).
            let (m, plugin, c) = fresh(false).await;
            let plan = Plan::new(m.env.dir.path(), Some((at, fault)));
            let _ = plugin.prepare(&c).await;
            drop(plan);
            let plugin = after(fault, &m, plugin);
            plugin.unprepare(&c).await.unwrap();
            assert!(m.instances().is_empty(), "{what}: unprepared instead");
            assert!(plugin.claims().is_empty(), "{what}");
        }
    }
    for (at, step) in unprep.iter().enumerate() {
        for fault in FAULTS {
            let what = format!("unprepare: {fault:?} at step {} ({step})", at + 1);
            let (m, plugin, c) = fresh(true).await;
            let plan = Plan::new(m.env.dir.path(), Some((at, fault)));
            assert!(plugin.unprepare(&c).await.is_err(), "{what}: did not fail");
            drop(plan);
            let plugin = after(fault, &m, plugin);
            if fault == Fault::Crash {
                // The restart keeps (or creates again) exactly what the record names.
                consistent(&m, &plugin, &what);
            }
            plugin.unprepare(&c).await.unwrap();
            assert!(m.instances().is_empty(), "{what}: after the retry");
            assert!(plugin.claims().is_empty(), "{what}");
            drop(plugin);
            let (plugin, _) = m.start();
            assert!(m.instances().is_empty(), "{what}: after a restart");
            assert!(plugin.claims().is_empty(), "{what}");
        }
    }
}
