//! The kubelet's device manager's view of the device plugin: a fake kubelet `Registration`
//! server on a unix socket receives the registration; a client calls `ListAndWatch` and
//! `Allocate` on the plugin's socket for a pod from the in-memory pod source. Each test starts
//! from a [`Fixture`]: the fake node, the fake kubelet, the pod source.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fgpu_api::names::DriverName;
use fgpu_api::proto::deviceplugin::v1beta1 as dp;
use fgpu_driver::backend::{DeviceBackend, FakeBackend};
use fgpu_driver::device::Gpu;
use fgpu_kubelet_plugin::device_plugin::pods::{
    ContainerInfo, KubePodSource, MapPodSource, PodInfo,
};
use fgpu_kubelet_plugin::device_plugin::service::AllocateResponseMode;
use fgpu_kubelet_plugin::device_plugin::{DevicePluginConfig, Running, STOP_GRACE, start};
use fgpu_kubelet_plugin::edits::{FileMount, NodeFiles, device_name};
use fgpu_kubelet_plugin::prepare::PluginConfig;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;

/// A client of the plugin's `DevicePlugin` service.
type Client = dp::device_plugin_client::DevicePluginClient<Channel>;

/// A fake node with two H100s; `DEVROOT` is replaced by the test's device directory.
const PROFILE: &str = include_str!("../fixtures/node-a-2xh100.yaml");
const GPU_B: &str = "GPU-63367e56-cdb4-4537-be42-f7abdf387237";
const POD_UID: &str = "3b0e6a52-9c1d-4f0e-8a57-2d7c1f0b9e11";
const GI: u64 = 1 << 30;

/// The plugin's settings for a test under `root`, sockets in `dp_dir`; resync and health
/// checks every 200 ms.
fn config(root: &Path, dp_dir: &Path) -> DevicePluginConfig {
    DevicePluginConfig {
        plugin: PluginConfig {
            driver: DriverName::default(),
            node_name: "node-a".into(),
            state_root: root.join("state"),
            run_root: root.join("run"),
            cdi_dir: root.join("cdi"),
            files: NodeFiles {
                shim_library: root.join("lib/libfgpu.so"),
                driver_mounts: vec![FileMount::same(root.join("fake-cuda/libcuda.so.1"))],
                driver_hooks: vec![],
                fake_driver: false,
                fake_state_dir: None,
                context_overhead: 0,
                memory_limits: None,
            },
            boot_id: "boot-1".into(),
            claim_get_timeout: Duration::from_secs(5),
            test_pause: None,
        },
        dir: dp_dir.to_owned(),
        socket_name: "fgpu.sock".into(),
        resource_name: "nvidia.com/gpu".into(),
        split_count: 10,
        response: AllocateResponseMode::Both,
        health_interval: Duration::from_millis(200),
        health_policy: fgpu_driver::health::HealthPolicy::default(),
        kubelet_poll: Duration::from_millis(100),
        resync: Duration::from_millis(200),
        pod_resources_socket: None,
        gpu_mode: Default::default(),
        volcano: None,
    }
}

/// The kubelet's `Registration` service: forwards each request.
struct FakeKubelet(mpsc::UnboundedSender<dp::RegisterRequest>);

#[tonic::async_trait]
impl dp::registration_server::Registration for FakeKubelet {
    async fn register(
        &self,
        request: tonic::Request<dp::RegisterRequest>,
    ) -> Result<tonic::Response<dp::Empty>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(dp::Empty {}))
    }
}

/// Serves a fake kubelet on `path` until the returned sender is dropped or fired.
fn fake_kubelet(
    path: &Path,
    tx: mpsc::UnboundedSender<dp::RegisterRequest>,
) -> tokio::sync::oneshot::Sender<()> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(dp::registration_server::RegistrationServer::new(
                FakeKubelet(tx),
            ))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            }),
    );
    stop
}

/// What every test here starts from: a fake node under a temporary directory, the
/// device-plugin directory with a fake kubelet serving registrations on `kubelet.sock`, and
/// an empty in-memory pod source.
struct Fixture {
    /// Removed when the fixture is dropped.
    _dir: tempfile::TempDir,
    /// The temporary directory.
    root: PathBuf,
    backend: Arc<FakeBackend>,
    /// The fake node's profile (a test may rewrite it: the backend reads it again).
    profile: PathBuf,
    /// The kubelet's device-plugin directory: its socket and the plugin's.
    dp_dir: PathBuf,
    pods: Arc<MapPodSource>,
    /// Where the fake kubelets send the registrations they receive.
    reg_tx: mpsc::UnboundedSender<dp::RegisterRequest>,
    /// The registrations, in order.
    reg_rx: mpsc::UnboundedReceiver<dp::RegisterRequest>,
    /// Stops the fake kubelet now serving.
    kubelet: Option<oneshot::Sender<()>>,
}

impl Fixture {
    /// The fixture on `profile`, a profile of `node-a` whose `DEVROOT` is replaced by the
    /// test's device directory.
    fn new(profile: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let profile_path = root.join("profile.yaml");
        std::fs::write(
            &profile_path,
            profile.replace("DEVROOT", root.join("dev").to_str().unwrap()),
        )
        .unwrap();
        let backend = Arc::new(FakeBackend::open(&profile_path, Some("node-a")).unwrap());
        let dp_dir = root.join("device-plugins");
        std::fs::create_dir_all(&dp_dir).unwrap();
        let (reg_tx, reg_rx) = mpsc::unbounded_channel();
        let mut fixture = Self {
            _dir: dir,
            root,
            backend,
            profile: profile_path,
            dp_dir,
            pods: Arc::new(MapPodSource::default()),
            reg_tx,
            reg_rx,
            kubelet: None,
        };
        fixture.start_kubelet();
        fixture
    }

    /// The fake node's GPU `uuid`.
    fn gpu(&self, uuid: &str) -> Gpu {
        let inventory = self.backend.inventory("node-a").unwrap();
        inventory.gpus.into_iter().find(|g| g.uuid == uuid).unwrap()
    }

    /// The plugin's settings for this fixture ([`config`]).
    fn config(&self) -> DevicePluginConfig {
        config(&self.root, &self.dp_dir)
    }

    /// The plugin's socket.
    fn sock(&self) -> PathBuf {
        self.dp_dir.join("fgpu.sock")
    }

    /// Serves a fresh fake kubelet on `kubelet.sock` (a kubelet start or restart).
    fn start_kubelet(&mut self) {
        self.kubelet = Some(fake_kubelet(
            &self.dp_dir.join("kubelet.sock"),
            self.reg_tx.clone(),
        ));
    }

    /// Stops the fake kubelet.
    fn stop_kubelet(&mut self) {
        if let Some(stop) = self.kubelet.take() {
            let _ = stop.send(());
        }
    }

    /// Starts the plugin with `cfg` on the fixture's node and pods; waits for its
    /// registration and returns it with a client connected to the plugin's socket.
    async fn start(&mut self, cfg: DevicePluginConfig) -> (Running, dp::RegisterRequest, Client) {
        let running = start(cfg, self.backend.clone(), self.pods.clone(), None)
            .await
            .unwrap();
        let registration = recv(&mut self.reg_rx).await;
        let channel =
            tonic::transport::Endpoint::from_shared(format!("unix://{}", self.sock().display()))
                .unwrap()
                .connect()
                .await
                .unwrap();
        (running, registration, Client::new(channel))
    }
}

/// An `Allocate` request for one container with the kubelet's device `id`.
fn allocate_request(id: String) -> dp::AllocateRequest {
    dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest {
            devices_ids: vec![id],
        }],
    }
}

fn pod(decision: &str) -> PodInfo {
    PodInfo {
        namespace: "ml".into(),
        name: "train-0".into(),
        uid: POD_UID.into(),
        node_name: "node-a".into(),
        phase: "Pending".into(),
        created: 1_700_000_000,
        bound: Some(1_700_000_005),
        annotations: [(
            "gpu.fgpu.dev/assigned-devices".to_owned(),
            decision.to_owned(),
        )]
        .into(),
        ..Default::default()
    }
}

async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("no registration within 10 s")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_lists_and_allocates() {
    let mut fx = Fixture::new(PROFILE);
    let root = fx.root.clone();
    let gpu_b = &fx.gpu(GPU_B);
    fx.pods.insert(pod(&format!(
        r#"{{"node":"node-a","containers":[{{"index":0,"name":"main","devices":[{{"id":"{}","uuid":"{GPU_B}","memoryBytes":{},"cores":30}}]}}]}}"#,
        device_name(gpu_b),
        10 * GI
    )));
    let (running, r, mut client) = fx.start(fx.config()).await;

    // Registration.
    assert_eq!(r.version, "v1beta1");
    assert_eq!(r.endpoint, "fgpu.sock");
    assert_eq!(r.resource_name, "nvidia.com/gpu");
    let opts = r.options.unwrap();
    assert!(!opts.pre_start_required && !opts.get_preferred_allocation_available);
    let sock = fx.sock();
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // ListAndWatch: 10 virtual devices per GPU, healthy, with NUMA where known.
    let mut stream = client
        .list_and_watch(dp::Empty {})
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 20);
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));
    let mut ids: Vec<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
    ids.sort_unstable();
    assert!(ids.contains(&format!("{GPU_B}::0").as_str()));
    assert!(ids.contains(&format!("{GPU_B}::9").as_str()));
    assert!(!ids.contains(&format!("{GPU_B}::10").as_str()));

    // Allocate: the kubelet's device ids are virtual; the pod's decision says which GPU.
    let resp = client
        .allocate(allocate_request(
            "GPU-a1c44256-6d3a-4972-9ea9-d296185fc8ff::4".into(),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.container_responses.len(), 1);
    let c = &resp.container_responses[0];
    let claim_uid = format!("{POD_UID}-main");
    let cdi: Vec<&str> = c.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        cdi,
        [format!(
            "gpu.fgpu.dev/claim={claim_uid}-{}",
            device_name(gpu_b)
        )]
    );
    let spec = root.join(format!("cdi/gpu.fgpu.dev-claim_{claim_uid}.json"));
    let spec_text = std::fs::read_to_string(&spec).unwrap();
    assert!(spec_text.contains(&format!("{claim_uid}-{}", device_name(gpu_b))));
    let limits = root.join(format!("run/claims/{claim_uid}/limits"));
    let limits_text = std::fs::read_to_string(&limits).unwrap();
    let uuid = GPU_B.to_ascii_lowercase().replacen("gpu-", "GPU-", 1);
    assert!(
        limits_text
            .lines()
            .any(|l| l == format!("gpu.{uuid}.memory={}", 10 * GI)),
        "{limits_text}"
    );
    assert!(
        limits_text
            .lines()
            .any(|l| l == format!("gpu.{uuid}.cores=30")),
        "{limits_text}"
    );
    assert!(
        root.join(format!("run/claims/{claim_uid}/state/memory.state"))
            .is_file()
    );
    // The legacy answer mirrors the spec.
    assert_eq!(
        c.envs.get("FGPU_MEMORY_LIMIT").map(String::as_str),
        Some((10 * GI).to_string().as_str())
    );
    assert!(c.mounts.iter().any(|m| m.container_path
        == format!("/etc/fgpu/claims/{claim_uid}/limits")
        && m.host_path == limits.to_str().unwrap()
        && m.read_only));
    // The device plugin's mounts carry the accounts read-write, the GPU's priority file
    // read-only (a normal-priority container).
    let account = format!("/run/fgpu/claims/{claim_uid}/memory.state");
    assert!(
        c.mounts
            .iter()
            .any(|m| m.container_path == account && !m.read_only)
    );
    let prio = format!("/run/fgpu/gpus/{uuid}.priority");
    assert!(
        c.mounts
            .iter()
            .any(|m| m.container_path == prio && m.read_only)
    );
    assert!(
        c.devices
            .iter()
            .any(|d| d.container_path == format!("/dev/nvidia{}", gpu_b.minor))
    );

    // The pod has no container left to allocate: a clear refusal, and the daemon serves on.
    let e = client
        .allocate(allocate_request(format!("{GPU_B}::1")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("no pod on node node-a"),
        "{}",
        e.message()
    );

    // A broken decision on another pod names the pod and the field.
    let mut bad = pod(
        r#"{"node":"node-a","containers":[{"index":0,"name":"x","devices":[{"id":"gpu-0","uuid":"GPU-x","memoryBytes":0,"cores":0}]}]}"#,
    );
    bad.name = "broken".into();
    bad.uid = "0b0e6a52-9c1d-4f0e-8a57-2d7c1f0b9e12".into();
    fx.pods.insert(bad);
    let e = client
        .allocate(allocate_request(format!("{GPU_B}::2")))
        .await
        .unwrap_err();
    assert!(
        e.message().contains(
            "pod ml/broken: annotation gpu.fgpu.dev/assigned-devices: containers[0].devices[0].memoryBytes: 0"
        ),
        "{}",
        e.message()
    );
    let opts = client
        .get_device_plugin_options(dp::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(!opts.get_preferred_allocation_available);

    // Health: the GPU turns unhealthy; the open stream gets the new list.
    let tmp = root.join("profile.yaml.tmp");
    std::fs::write(
        &tmp,
        PROFILE
            .replace("DEVROOT", root.join("dev").to_str().unwrap())
            .replace(
                "        pciBusID: \"0000:9a:00.0\"\n",
                "        pciBusID: \"0000:9a:00.0\"\n        unhealthy: XID 79\n",
            ),
    )
    .unwrap();
    std::fs::rename(&tmp, &fx.profile).unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("no new device list within 5 s")
        .unwrap()
        .unwrap();
    let bad: Vec<&str> = next
        .devices
        .iter()
        .filter(|d| d.health == "Unhealthy")
        .map(|d| d.id.as_str())
        .collect();
    assert_eq!(bad.len(), 10, "{bad:?}");
    assert!(bad.iter().all(|id| id.starts_with(GPU_B)), "{bad:?}");

    // Kubelet restart: kubelet.sock is recreated and the plugin's socket removed; the plugin
    // serves again and registers again.
    fx.stop_kubelet();
    std::fs::remove_file(&sock).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    fx.start_kubelet();
    let r = recv(&mut fx.reg_rx).await;
    assert_eq!(r.endpoint, "fgpu.sock");
    assert!(sock.exists());
    let mut registered = running.registered();
    tokio::time::timeout(Duration::from_secs(5), registered.wait_for(|n| *n >= 2))
        .await
        .unwrap()
        .unwrap();
    drop(stream);

    // The pod goes away: its container's files are removed at the next resync.
    fx.pods.remove(POD_UID);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while spec.exists() || limits.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "files of a gone pod stay"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    running.shutdown().await;
    assert!(!sock.exists());
}

/// The pods' API server stops answering while the stale-claim sweep lists the node's pods:
/// the stop signal still ends the plugin within its grace period (the hung task is aborted).
#[tokio::test]
async fn stops_promptly_while_the_api_server_hangs() {
    let fx = Fixture::new(PROFILE);
    let fake = fgpu_plumbing::testing::FakeApiServer::new();
    let (client, cut) = fake.cuttable_client();
    cut.cut();
    let pods = KubePodSource::new(client);
    let running = start(fx.config(), fx.backend.clone(), pods, None)
        .await
        .unwrap();
    // the sweep runs every 200 ms: wait until its list hangs
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while cut.hung() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no request hung");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped =
        tokio::time::timeout(STOP_GRACE + Duration::from_secs(10), running.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown waited on the hung request");
}

/// [`PROFILE`]'s first GPU made MIG-capable and put in `mode: mig`.
fn mig_profile() -> String {
    PROFILE.replacen(
        "        pciBusID: \"0000:19:00.0\"\n",
        "        pciBusID: \"0000:19:00.0\"\n        migCapable: true\n        mode: mig\n",
        1,
    )
}

/// The legacy path's MIG instance: a container assigned a placement device gets the
/// instance created at prepare (once, even when Allocate is retried), its device nodes and
/// `MIG-` UUID and no shim; a placement on a GPU not in mig mode is refused naming the
/// pod, the annotation and the device; the pod's removal destroys the instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocates_a_mig_placement_once_and_destroys_it_with_the_pod() {
    const GPU_A: &str = "GPU-a1c44256-6d3a-4972-9ea9-d296185fc8ff";
    let mut fx = Fixture::new(&mig_profile());
    let (root, backend, pods) = (fx.root.clone(), fx.backend.clone(), fx.pods.clone());
    let (gpu_a, gpu_b) = (fx.gpu(GPU_A), fx.gpu(GPU_B));

    // The extender mapped `nvidia.com/gpumem: 10000` to a 1g.10gb at slice 6 of GPU A.
    let placement = format!("gpu-{}-mig-1g10gb-6", gpu_a.index);
    pods.insert(pod(&format!(
        r#"{{"node":"node-a","containers":[{{"index":0,"name":"main","devices":[{{"id":"{placement}","uuid":"{GPU_A}","memoryBytes":{},"cores":0}}]}}]}}"#,
        10 * GI
    )));
    let (running, _, mut client) = fx.start(fx.config()).await;
    let request = |k: u32| allocate_request(format!("{GPU_A}::{k}"));

    // First attempt: the instance is created, then the CDI spec cannot be written (the CDI
    // directory is a file): Allocate fails, as a crash after the creation would.
    let cdi = root.join("cdi");
    let _ = std::fs::remove_dir_all(&cdi);
    std::fs::write(&cdi, "not a directory").unwrap();
    let e = client.allocate(request(0)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Internal, "{}", e.message());
    // The instance was made and its record names it: the retry must take it.
    let after_failure = backend.list_mig_instances(GPU_A).unwrap();
    assert_eq!(after_failure.len(), 1, "{after_failure:?}");

    // The kubelet's retry: exactly one 1g.10gb instance, at slice 6.
    std::fs::remove_file(&cdi).unwrap();
    std::fs::create_dir_all(&cdi).unwrap();
    let resp = client.allocate(request(1)).await.unwrap().into_inner();
    let instances = backend.list_mig_instances(GPU_A).unwrap();
    assert_eq!(instances.len(), 1, "{instances:?}");
    let inst = &instances[0];
    assert_eq!(inst.profile, "1g.10gb");
    assert_eq!(inst.placement.start, 6);
    assert_eq!(
        after_failure[0].uuid, inst.uuid,
        "the retry made a new instance"
    );
    assert!(backend.list_mig_instances(GPU_B).unwrap().is_empty());

    // The answer: the instance's UUID, its nodes and the parent's, no shim.
    let c = &resp.container_responses[0];
    assert!(inst.uuid.starts_with("MIG-"), "{}", inst.uuid);
    assert_eq!(
        c.envs.get("NVIDIA_VISIBLE_DEVICES"),
        Some(&inst.uuid),
        "{:?}",
        c.envs
    );
    assert_eq!(c.envs.get("CUDA_VISIBLE_DEVICES"), Some(&inst.uuid));
    assert!(!c.envs.contains_key("FGPU_MEMORY_LIMIT"), "{:?}", c.envs);
    assert!(
        !c.mounts.iter().any(
            |m| m.container_path == "/etc/ld.so.preload" || m.host_path.ends_with("libfgpu.so")
        ),
        "{:?}",
        c.mounts
    );
    let paths: Vec<&str> = c
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    for n in &inst.device_nodes {
        assert!(
            paths.contains(&n.path.to_str().unwrap()),
            "{} missing from {paths:?}",
            n.path.display()
        );
    }
    assert!(paths.contains(&format!("/dev/nvidia{}", gpu_a.minor).as_str()));
    assert!(
        paths.iter().any(|p| p.starts_with("/dev/nvidia-caps/")),
        "{paths:?}"
    );
    assert_eq!(c.cdi_devices.len(), 1);
    assert!(
        c.cdi_devices[0].name.ends_with(&placement),
        "{:?}",
        c.cdi_devices
    );

    // A placement on GPU B, which is in mode shared: refused, naming the pod, the
    // annotation and the device; nothing is created.
    let wrong = format!("gpu-{}-mig-1g10gb-6", gpu_b.index);
    let mut other = pod(&format!(
        r#"{{"node":"node-a","containers":[{{"index":0,"name":"main","devices":[{{"id":"{wrong}","uuid":"{GPU_B}","memoryBytes":{},"cores":0}}]}}]}}"#,
        10 * GI
    ));
    other.name = "train-1".into();
    other.uid = "0b0e6a52-9c1d-4f0e-8a57-2d7c1f0b9e13".into();
    pods.insert(other);
    let e = client
        .allocate(allocate_request(format!("{GPU_B}::0")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    let m = e.message();
    assert!(
        m.contains("pod ml/train-1")
            && m.contains("annotation gpu.fgpu.dev/assigned-devices")
            && m.contains(&format!(
                "{wrong:?} is a MIG placement, but GPU {GPU_B} is in mode shared, not mig"
            )),
        "{m}"
    );
    assert!(backend.list_mig_instances(GPU_B).unwrap().is_empty());
    pods.remove("0b0e6a52-9c1d-4f0e-8a57-2d7c1f0b9e13");

    // The pod goes: its instance is destroyed at the next cleanup.
    pods.remove(POD_UID);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !backend.list_mig_instances(GPU_A).unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the instance of a gone pod stays"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.shutdown().await;
}

/// A pod as Volcano's `deviceshare` plugin leaves it: its allocation `devices` for one
/// container `main` asking for `vgpu-number: 1`, `vgpu-memory: 20000`, `vgpu-cores: 30`,
/// written by the field manager `writer`.
fn volcano_pod(name: &str, uid: &str, devices: &str, writer: &str) -> PodInfo {
    use fgpu_api::volcano;
    PodInfo {
        namespace: "research".into(),
        name: name.into(),
        uid: uid.into(),
        node_name: "node-a".into(),
        phase: "Pending".into(),
        created: 1_700_000_000,
        bound: Some(1_700_000_005),
        annotations: [
            (
                volcano::POD_DEVICES_ANNOTATION.to_owned(),
                devices.to_owned(),
            ),
            (
                volcano::POD_TO_ALLOCATE_ANNOTATION.to_owned(),
                devices.to_owned(),
            ),
            (volcano::POD_NODE_ANNOTATION.to_owned(), "node-a".to_owned()),
            (
                volcano::BIND_PHASE_ANNOTATION.to_owned(),
                volcano::BIND_PHASE_ALLOCATING.to_owned(),
            ),
        ]
        .into(),
        annotation_managers: [(
            volcano::POD_DEVICES_ANNOTATION.to_owned(),
            [writer.to_owned()].into(),
        )]
        .into(),
        containers: vec![ContainerInfo {
            name: "main".into(),
            limits: [
                (volcano::RESOURCE_NUMBER.to_owned(), "1".to_owned()),
                (volcano::RESOURCE_MEMORY.to_owned(), "20000".to_owned()),
                (volcano::RESOURCE_CORES.to_owned(), "30".to_owned()),
            ]
            .into(),
        }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volcano_mode_enforces_volcanos_allocation_and_refuses_forged_ones() {
    use fgpu_api::volcano;
    use fgpu_kubelet_plugin::device_plugin::pods::PodSource as _;
    use fgpu_kubelet_plugin::device_plugin::volcano::{DEFAULT_SCHEDULER_MANAGER, VolcanoConfig};
    let mut fx = Fixture::new(PROFILE);
    let (root, pods) = (fx.root.clone(), fx.pods.clone());
    let gpu_b = &fx.gpu(GPU_B);
    let good = format!("{GPU_B},NVIDIA,20000,30:");
    pods.insert(volcano_pod(
        "train-0",
        POD_UID,
        &good,
        DEFAULT_SCHEDULER_MANAGER,
    ));
    // The same pod's allocation, but 80000 MiB, written by the tenant: never a grant.
    pods.insert(volcano_pod(
        "forged",
        "0b0e6a52-9c1d-4f0e-8a57-2d7c1f0b9e13",
        &format!("{GPU_B},NVIDIA,80000,30:"),
        "kubectl-edit",
    ));
    let mut cfg = fx.config();
    cfg.resource_name = volcano::RESOURCE_NUMBER.into();
    cfg.response = AllocateResponseMode::Cdi;
    cfg.volcano = Some(VolcanoConfig {
        trusted_manager: Some(DEFAULT_SCHEDULER_MANAGER.into()),
    });
    let (running, r, mut client) = fx.start(cfg).await;
    assert_eq!(r.resource_name, "volcano.sh/vgpu-number");

    // The Volcano-placed container: its GPU, 20000 MiB and 30 % in the limits file.
    let resp = client
        .allocate(allocate_request(format!("{GPU_B}::3")))
        .await
        .unwrap()
        .into_inner();
    let claim_uid = format!("{POD_UID}-main");
    assert_eq!(
        resp.container_responses[0].cdi_devices[0].name,
        format!("gpu.fgpu.dev/claim={claim_uid}-{}", device_name(gpu_b))
    );
    let limits =
        std::fs::read_to_string(root.join(format!("run/claims/{claim_uid}/limits"))).unwrap();
    let uuid = GPU_B.to_ascii_lowercase().replacen("gpu-", "GPU-", 1);
    assert!(
        limits
            .lines()
            .any(|l| l == format!("gpu.{uuid}.memory={}", 20000u64 << 20)),
        "{limits}"
    );
    assert!(
        limits.lines().any(|l| l == format!("gpu.{uuid}.cores=30")),
        "{limits}"
    );
    // The bind handshake: the pod's every vGPU container is allocated.
    let now = pods.pods_on_node("node-a").await.unwrap();
    let phase = |name: &str| {
        now.iter().find(|p| p.name == name).unwrap().annotations[volcano::BIND_PHASE_ANNOTATION]
            .clone()
    };
    assert_eq!(phase("train-0"), volcano::BIND_PHASE_SUCCESS);
    assert_eq!(phase("forged"), volcano::BIND_PHASE_ALLOCATING);

    // The forged pod is left: refused, naming the pod, the annotation and the field.
    let e = client
        .allocate(allocate_request(format!("{GPU_B}::4")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains(
            "pod research/forged: annotation volcano.sh/vgpu-ids-new: metadata.managedFields: written by kubectl-edit, not by Volcano's scheduler"
        ),
        "{}",
        e.message()
    );
    assert!(
        !root
            .join("run/claims/0b0e6a52-9c1d-4f0e-8a57-2d7c1f0b9e13-main")
            .exists()
    );

    // A malformed allocation from the scheduler's own manager: refused with the field.
    pods.remove("0b0e6a52-9c1d-4f0e-8a57-2d7c1f0b9e13");
    pods.insert(volcano_pod(
        "broken",
        "0b0e6a52-9c1d-4f0e-8a57-2d7c1f0b9e14",
        &format!("{GPU_B},NVIDIA,lots,30:"),
        DEFAULT_SCHEDULER_MANAGER,
    ));
    let e = client
        .allocate(allocate_request(format!("{GPU_B}::5")))
        .await
        .unwrap_err();
    assert!(
        e.message().contains(
            "pod research/broken: annotation volcano.sh/vgpu-ids-new: containers[0].devices[0].memoryMiB: \"lots\" is not a whole number"
        ),
        "{}",
        e.message()
    );

    // The pod ends: its container's files go at the next resync.
    pods.remove(POD_UID);
    let claim_dir = root.join(format!("run/claims/{claim_uid}"));
    for _ in 0..100 {
        if !claim_dir.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !claim_dir.exists(),
        "the gone pod's claim files are still there"
    );
    fx.stop_kubelet();
    running.shutdown().await;
}
