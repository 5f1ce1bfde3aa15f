//! `cluster` against the fake API server of `fgpu_plumbing::testing` (a tower service behind
//! a real `kube::Client`): version negotiation, claim GET, slice create/update, and the
//! fallback when the API server drops consumable capacity.

use std::sync::Arc;

use fgpu_api::names::DriverName;
use fgpu_driver::device::{ComputeCapability, DeviceNode, Gpu, GpuMode, Health, NodeInventory};
use fgpu_kubelet_plugin::cluster::{KubeClaimSource, SlicePublisher, negotiate};
use fgpu_kubelet_plugin::prepare::ClaimSource as _;
use fgpu_kubelet_plugin::slices::ApiVersion;
use fgpu_plumbing::testing::{Answer, FakeApiServer};
use http::Method;
use serde_json::{Value, json};

fn client(server: FakeApiServer) -> kube::Client {
    server.client()
}

fn inventory(healthy: bool) -> NodeInventory {
    let gpu = |minor: u32| Gpu {
        index: minor,
        minor,
        uuid: format!("GPU-{minor}"),
        product_name: "Tesla T4".into(),
        memory_bytes: 15 << 30,
        sm_count: 40,
        compute_capability: ComputeCapability::new(7, 5),
        driver_version: "550.54.15".into(),
        cuda_driver_version: "12.4".into(),
        pci_bus_id: format!("0000:0{minor}:00.0"),
        pcie_root: None,
        numa_node: None,
        mig_capable: false,
        enforcement: Default::default(),
        health: if healthy || minor == 0 {
            Health::Healthy
        } else {
            Health::Unhealthy {
                reason: "XID 79".into(),
            }
        },
        device_nodes: DeviceNode::standard_set(minor, std::path::Path::new("/dev")),
    };
    NodeInventory::new("node-a", vec![gpu(0), gpu(1)])
}

/// Serves `resource.k8s.io` at `versions`, with Node `node-a`; `drop_consumable`: strips
/// consumable-capacity fields from slices on write, as an API server with the gate off does.
fn server(versions: Vec<&'static str>, drop_consumable: bool) -> FakeApiServer {
    let s = FakeApiServer::new().group("resource.k8s.io", &versions);
    {
        let mut state = s.lock().unwrap();
        state.insert(
            "/api/v1/nodes/node-a",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "uid": "node-uid"}}),
        );
        if drop_consumable {
            state.on_write(|key, obj| {
                if !key.contains("/resourceslices/") {
                    return;
                }
                for d in obj["spec"]["devices"].as_array_mut().unwrap() {
                    let d = d.as_object_mut().unwrap();
                    d.remove("allowMultipleAllocations");
                    for c in d["capacity"].as_object_mut().unwrap().values_mut() {
                        c.as_object_mut().unwrap().remove("requestPolicy");
                    }
                }
            });
        }
    }
    s
}

/// A fake profile of node `node-a` with one T4, and a boot id file, under `dir`.
fn one_t4_node(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let profile = dir.join("profile.yaml");
    std::fs::write(
        &profile,
        "nodes:\n  - name: node-a\n    gpus:\n      - uuid: GPU-a1c44256-6d3a-4972-9ea9-d296185fc8ff\n        productName: Tesla T4\n        memory: 15Gi\n        smCount: 40\n        computeCapability: \"7.5\"\n",
    )
    .unwrap();
    let boot_id = dir.join("boot_id");
    std::fs::write(&boot_id, "boot-1\n").unwrap();
    (profile, boot_id)
}

/// The files every claim gets in these tests: the shim under `dir`, nothing else.
fn node_files(dir: &std::path::Path) -> fgpu_kubelet_plugin::edits::NodeFiles {
    fgpu_kubelet_plugin::edits::NodeFiles {
        shim_library: dir.join("libfgpu.so"),
        driver_mounts: vec![],
        driver_hooks: vec![],
        fake_driver: false,
        fake_state_dir: None,
        context_overhead: 0,
        memory_limits: None,
    }
}

/// All ResourceClaims at v1 (the claim watch's list and watch).
const CLAIMS_V1: &str = "/apis/resource.k8s.io/v1/resourceclaims";

const SLICE: &str = "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu.fgpu.dev";

#[tokio::test]
async fn negotiates_the_newest_served_version() {
    let cases: [(Vec<&'static str>, Result<ApiVersion, &str>); 4] = [
        (vec!["v1", "v1beta2", "v1beta1"], Ok(ApiVersion::V1)),
        (vec!["v1beta2", "v1beta1"], Ok(ApiVersion::V1beta2)),
        (vec!["v1beta1"], Ok(ApiVersion::V1beta1)),
        (
            vec![],
            Err("the API server serves no resource.k8s.io version fgpu speaks (served: none)"),
        ),
    ];
    for (versions, want) in cases {
        let got = negotiate(&client(server(versions.clone(), false))).await;
        match (got, want) {
            (Ok(v), Ok(w)) => assert_eq!(v, w, "{versions:?}"),
            (Err(e), Err(w)) => assert!(e.to_string().starts_with(w), "{e}"),
            (got, want) => panic!("{versions:?}: got {got:?}, want {want:?}"),
        }
    }
}

#[tokio::test]
async fn claims_are_read_at_the_negotiated_version() {
    let s = server(vec!["v1beta1"], false);
    s.lock().unwrap().objects.insert(
        "/apis/resource.k8s.io/v1beta1/namespaces/ns/resourceclaims/c".into(),
        json!({"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
               "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-0"}]}}}}),
    );
    let source = KubeClaimSource::new(client(s), ApiVersion::V1beta1);
    let c = source.get("ns", "c").await.unwrap().unwrap();
    assert_eq!(c.metadata.uid, "u1");
    assert_eq!(c.allocation().unwrap().results[0].device, "gpu-0");
    assert_eq!(source.get("ns", "missing").await.unwrap(), None);
}

#[tokio::test]
async fn slice_is_created_then_updated_only_on_change() {
    let s = server(vec!["v1"], false);
    let mut publisher = SlicePublisher::new(
        client(s.clone()),
        ApiVersion::V1,
        DriverName::default(),
        true,
    );
    let p = publisher.publish(&inventory(true)).await.unwrap();
    assert_eq!((p.generation, p.written, p.consumable), (1, true, true));
    let p = publisher.publish(&inventory(true)).await.unwrap();
    assert_eq!((p.generation, p.written, p.consumable), (1, false, true));
    let p = publisher.publish(&inventory(false)).await.unwrap();
    assert_eq!((p.generation, p.written), (2, true));
    let server = s.lock().unwrap();
    assert_eq!(
        server.writes,
        [format!("create {SLICE}"), format!("replace {SLICE}")]
    );
    let stored = &server.objects[SLICE];
    assert_eq!(stored["metadata"]["ownerReferences"][0]["uid"], "node-uid");
    assert_eq!(stored["spec"]["devices"].as_array().unwrap().len(), 1);
    assert_eq!(
        stored["spec"]["devices"][0]["allowMultipleAllocations"],
        true
    );
}

#[tokio::test]
async fn dropped_consumable_capacity_falls_back_to_plain_devices() {
    let s = server(vec!["v1"], true);
    let mut publisher = SlicePublisher::new(
        client(s.clone()),
        ApiVersion::V1,
        DriverName::default(),
        true,
    );
    let p = publisher.publish(&inventory(true)).await.unwrap();
    assert_eq!((p.generation, p.written, p.consumable), (2, true, false));
    // Stable afterwards: no more writes.
    let p = publisher.publish(&inventory(true)).await.unwrap();
    assert_eq!((p.generation, p.written, p.consumable), (2, false, false));
    let server = s.lock().unwrap();
    assert_eq!(
        server.writes,
        [format!("create {SLICE}"), format!("replace {SLICE}")]
    );
    let stored = &server.objects[SLICE];
    assert!(
        stored["spec"]["devices"][0]
            .get("allowMultipleAllocations")
            .is_none()
    );
    assert_eq!(stored["spec"]["pool"]["generation"], 2);
}

/// `inventory(true)` with GPU 1 a MIG-capable H100, and the modes that put it in MIG mode.
fn mig_inventory() -> (NodeInventory, std::collections::BTreeMap<String, GpuMode>) {
    let mut inv = inventory(true);
    inv.gpus[1].mig_capable = true;
    inv.gpus[1].product_name = "NVIDIA H100 80GB HBM3".into();
    inv.gpus[1].memory_bytes = 80 << 30;
    let modes = [(inv.gpus[1].uuid.clone(), GpuMode::Mig)].into();
    (inv, modes)
}

const COUNTERS: &str = "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu.fgpu.dev-counters-0";

#[tokio::test]
async fn a_mig_gpu_is_published_with_counters_in_a_second_slice() {
    let s = server(vec!["v1"], false);
    let mut publisher = SlicePublisher::new(
        client(s.clone()),
        ApiVersion::V1,
        DriverName::default(),
        true,
    );
    let (inv, modes) = mig_inventory();
    let taints = Default::default();
    let p = publisher
        .publish_with_modes(&inv, &taints, |_| modes.clone())
        .await
        .unwrap();
    assert_eq!(
        (p.generation, p.written, p.partitionable, p.slices),
        (1, true, true, 2)
    );
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let p = publisher
        .publish_with_modes(&inv, &taints, |_| modes.clone())
        .await
        .unwrap();
    assert!(!p.written, "unchanged");
    // Back to shared: the counters slice is emptied, not deleted, and still counted.
    let p = publisher.publish(&inv).await.unwrap();
    assert_eq!((p.generation, p.written, p.slices), (2, true, 2));
    let server = s.lock().unwrap();
    assert_eq!(
        server.writes,
        [
            format!("create {SLICE}"),
            format!("create {COUNTERS}"),
            format!("replace {SLICE}"),
            format!("replace {COUNTERS}")
        ]
    );
    let counters = &server.objects[COUNTERS];
    assert_eq!(counters["spec"]["devices"], json!([]));
    assert_eq!(counters["spec"]["pool"]["resourceSliceCount"], 2);
    assert_eq!(
        server.objects[SLICE]["spec"]["devices"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn dropped_counters_fall_back_to_the_fixed_layout() {
    let s = server(vec!["v1"], false);
    s.lock().unwrap().on_write(|key, obj| {
        if !key.contains("/resourceslices/") {
            return;
        }
        let spec = obj["spec"].as_object_mut().unwrap();
        spec.remove("sharedCounters");
        for d in spec
            .get_mut("devices")
            .and_then(|d| d.as_array_mut())
            .into_iter()
            .flatten()
        {
            d.as_object_mut().unwrap().remove("consumesCounters");
        }
    });
    let mut publisher = SlicePublisher::new(
        client(s.clone()),
        ApiVersion::V1,
        DriverName::default(),
        true,
    )
    .with_fixed_layouts("1=3g.40gb*2".parse().unwrap());
    let (inv, modes) = mig_inventory();
    let taints = Default::default();
    let p = publisher
        .publish_with_modes(&inv, &taints, |_| modes.clone())
        .await
        .unwrap();
    assert!(!p.partitionable);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let server = s.lock().unwrap();
    let names: Vec<&str> = server.objects[SLICE]["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-1-mig-3g40gb-4", "gpu-1-mig-3g40gb-0"]);
    // The counters slice written first is kept, emptied, in the count.
    assert_eq!(server.objects[COUNTERS]["spec"]["devices"], json!([]));
    assert_eq!(
        server.objects[SLICE]["spec"]["pool"]["resourceSliceCount"],
        2
    );
    assert_eq!(server.objects[SLICE]["spec"]["pool"]["generation"], 2);
}

#[tokio::test]
async fn refused_counters_fall_back_to_the_fixed_layout() {
    let s = server(vec!["v1"], false);
    // As 1.34 with the gate on: a device may consume only its own slice's counter sets.
    s.lock().unwrap().intercept(|req| {
        let body = req.body.as_ref()?;
        let consumes = body["spec"]["devices"]
            .as_array()?
            .iter()
            .any(|d| d.get("consumesCounters").is_some());
        let has_sets = body["spec"].get("sharedCounters").is_some();
        (consumes && !has_sets).then(|| {
            Answer::status(
                http::StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                "spec.devices[1].consumesCounters[0].counterSet: Invalid value: must reference a counter set in this slice",
            )
        })
    });
    let mut publisher = SlicePublisher::new(
        client(s.clone()),
        ApiVersion::V1,
        DriverName::default(),
        true,
    )
    .with_fixed_layouts("7g.80gb".parse().unwrap());
    let (inv, modes) = mig_inventory();
    let taints = Default::default();
    let p = publisher
        .publish_with_modes(&inv, &taints, |_| modes.clone())
        .await
        .unwrap();
    assert_eq!((p.written, p.partitionable, p.slices), (true, false, 1));
    let server = s.lock().unwrap();
    let devices = server.objects[SLICE]["spec"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[1]["name"], "gpu-1-mig-7g80gb-0");
    assert!(!server.objects.contains_key(COUNTERS));
}

// ---------------------------------------------------------------------------------------
// The stale-claim sweep through the real client: what a 404 means.

mod stale_sweep {
    use super::*;
    use fgpu_kubelet_plugin::edits::ClaimRef;
    use fgpu_kubelet_plugin::prepare::{CLAIM_GET_TIMEOUT, Plugin, PluginConfig};
    use std::sync::Mutex;

    const CLAIM_A: &str = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/a";
    const CLAIM_B: &str = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/b";

    fn claim(name: &str, uid: &str, share: &str) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": name, "namespace": "team", "uid": uid},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-0",
                    "shareID": share, "consumedCapacity": {"memory": "1Gi", "cores": "10"}}]}}}})
    }

    /// The plugin over `dir` with the fake API server's claims, and two claims (team/a,
    /// team/b) prepared. `answer`: while set, every GET of a claim gets it instead.
    async fn prepared(
        dir: &std::path::Path,
    ) -> (
        Plugin<KubeClaimSource>,
        FakeApiServer,
        Arc<Mutex<Option<Answer>>>,
    ) {
        let (profile, _) = one_t4_node(dir);
        let s = server(vec!["v1"], false);
        let answer: Arc<Mutex<Option<Answer>>> = Arc::default();
        {
            let mut state = s.lock().unwrap();
            state.insert(CLAIM_A, claim("a", "uid-a", "s1"));
            state.insert(CLAIM_B, claim("b", "uid-b", "s2"));
            let answer = answer.clone();
            state.intercept(move |req| {
                if !req.path.contains("/resourceclaims/") {
                    return None;
                }
                answer.lock().unwrap().clone()
            });
        }
        let cfg = PluginConfig {
            driver: DriverName::default(),
            node_name: "node-a".into(),
            state_root: dir.join("state"),
            run_root: dir.join("run"),
            cdi_dir: dir.join("cdi"),
            files: node_files(dir),
            boot_id: "boot-1".into(),
            claim_get_timeout: CLAIM_GET_TIMEOUT,
            test_pause: None,
        };
        let backend = Arc::new(fgpu_driver::backend::FakeBackend::open(&profile, None).unwrap());
        let source = KubeClaimSource::new(client(s.clone()), ApiVersion::V1);
        let (plugin, _) = Plugin::start(cfg, source, backend).unwrap();
        for (name, uid) in [("a", "uid-a"), ("b", "uid-b")] {
            let c = ClaimRef {
                namespace: "team".into(),
                name: name.into(),
                uid: uid.into(),
            };
            plugin.prepare(&c).await.unwrap();
        }
        (plugin, s, answer)
    }

    fn spec(dir: &std::path::Path, uid: &str) -> std::path::PathBuf {
        dir.join(format!("cdi/gpu.fgpu.dev-claim_{uid}.json"))
    }

    /// Both claims still have their record, spec and directory.
    fn intact(plugin: &Plugin<KubeClaimSource>, dir: &std::path::Path) -> bool {
        plugin.claims().len() == 2
            && ["uid-a", "uid-b"]
                .iter()
                .all(|uid| spec(dir, uid).exists() && dir.join("run/claims").join(uid).exists())
    }

    #[tokio::test]
    async fn a_404_that_does_not_name_the_claim_and_server_errors_keep_every_claim() {
        let dir = tempfile::tempdir().unwrap();
        let (plugin, _s, answer) = prepared(dir.path()).await;
        let unserved = "the server could not find the requested resource";
        for (what, a) in [
            // The API server does not serve resource.k8s.io/v1 (any more): a Status with
            // reason NotFound and no details.
            ("an unserved version", Answer::not_found(unserved)),
            // A proxy or an aggregation layer: not a Status at all.
            (
                "a plain 404 page",
                Answer::new(http::StatusCode::NOT_FOUND, json!("404 page not found")),
            ),
            (
                "a NotFound about another object",
                Answer::new(
                    http::StatusCode::NOT_FOUND,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "reason": "NotFound", "code": 404, "message": "namespaces \"team\" not found",
                           "details": {"name": "team", "kind": "namespaces"}}),
                ),
            ),
            (
                "an internal error",
                Answer::status(
                    http::StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "etcdserver: request timed out",
                ),
            ),
            (
                "unavailable",
                Answer::status(
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                ),
            ),
        ] {
            *answer.lock().unwrap() = Some(a);
            for sweep in 0..10 {
                let report = plugin.cleanup_stale().await;
                assert_eq!(
                    report.removed,
                    Vec::<String>::new(),
                    "{what}, sweep {sweep}"
                );
                assert_eq!(report.suspected, Vec::<String>::new(), "{what}");
                assert_eq!(report.errors.len(), 2, "{what}: {report:?}");
                assert!(report.errors[0].starts_with("claim team/a (uid-a): cannot read it: GET resource.k8s.io/v1/namespaces/team/resourceclaims/a:"), "{what}: {report:?}");
                assert!(intact(&plugin, dir.path()), "{what}, sweep {sweep}");
            }
        }
    }

    #[tokio::test]
    async fn a_claim_the_api_server_says_is_gone_loses_its_state_at_the_second_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let (plugin, s, answer) = prepared(dir.path()).await;
        // Deleted: the API server's NotFound names team/a.
        s.lock().unwrap().remove(CLAIM_A);
        let report = plugin.cleanup_stale().await;
        assert_eq!(report.suspected, ["team/a (uid-a): not found"]);
        assert!(intact(&plugin, dir.path()));
        // An unserved version in between neither counts nor clears.
        *answer.lock().unwrap() = Some(Answer::not_found(
            "the server could not find the requested resource",
        ));
        assert_eq!(plugin.cleanup_stale().await.removed, Vec::<String>::new());
        *answer.lock().unwrap() = None;
        let report = plugin.cleanup_stale().await;
        assert_eq!(report.removed, ["team/a (uid-a)"]);
        assert_eq!(plugin.claims().keys().collect::<Vec<_>>(), ["uid-b"]);
        assert!(!spec(dir.path(), "uid-a").exists());
        assert!(!dir.path().join("run/claims/uid-a").exists());
        // Recreated under the same name: a UID mismatch, twice.
        s.lock()
            .unwrap()
            .insert(CLAIM_B, claim("b", "uid-b2", "s3"));
        assert_eq!(
            plugin.cleanup_stale().await.suspected,
            ["team/b (uid-b): replaced by uid uid-b2"]
        );
        assert!(spec(dir.path(), "uid-b").exists());
        assert_eq!(plugin.cleanup_stale().await.removed, ["team/b (uid-b)"]);
        assert!(plugin.claims().is_empty());
    }
}

// ---------------------------------------------------------------------------------------
// The whole `serve` loop: fake API server, fake GPUs, real sockets.

mod serve_loop {
    use super::*;
    use fgpu_api::proto::dra::v1;
    use fgpu_api::proto::pluginregistration as reg;
    use fgpu_kubelet_plugin::serve::{ServeConfig, ServeError, run};
    use hyper_util::rt::TokioIo;
    use std::path::Path;
    use std::time::Duration;
    use tonic::transport::{Channel, Endpoint, Uri};

    /// The plugin as the tests run it: node `node-a`, every directory under `dir`, the
    /// claim cache on, no metrics server.
    fn serve_config(dir: &Path, boot_id: std::path::PathBuf, resync: Duration) -> ServeConfig {
        ServeConfig {
            driver: DriverName::default(),
            node_name: "node-a".into(),
            registrar_dir: dir.join("plugins_registry"),
            plugins_dir: dir.join("plugins"),
            cdi_dir: dir.join("cdi"),
            state_dir: dir.join("state"),
            run_dir: dir.join("run"),
            files: node_files(dir),
            boot_id_path: boot_id,
            consumable_capacity: true,
            resync,
            metrics_addr: None,
            claim_cache: true,
            test_pause: None,
            pod_resources_socket: None,
            monitor: None,
            health: Default::default(),
            taints: Default::default(),
            modes: Default::default(),
        }
    }

    async fn channel(path: &Path) -> Channel {
        let path = path.to_owned();
        Endpoint::try_from("http://[::]:50051")
            .unwrap()
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .unwrap()
    }

    async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
        for _ in 0..200 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting for {what}");
    }

    const CLAIM: &str = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/c";

    #[tokio::test]
    async fn serve_publishes_prepares_cleans_up_and_stops_on_rejection() {
        let dir = tempfile::tempdir().unwrap();
        let (profile, boot_id) = one_t4_node(dir.path());
        // A corrupt checkpoint from an earlier run: moved aside and reported as an Event.
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        std::fs::write(dir.path().join("run/checkpoint.json"), b"{garbage").unwrap();
        let s = server(vec!["v1", "v1beta1"], false);
        s.lock().unwrap().objects.insert(
            CLAIM.into(),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"name": "c", "namespace": "team", "uid": "uid-c"},
                   "status": {"allocation": {"devices": {"results": [
                       {"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-0",
                        "shareID": "s1", "consumedCapacity": {"memory": "1Gi", "cores": "10"}}]}}}}),
        );
        s.lock().unwrap().intercept(|req| {
            (req.path == CLAIMS_V1).then(|| Answer::not_found("no list or watch of claims here"))
        });
        let cfg = ServeConfig {
            metrics_addr: Some("127.0.0.1:0".parse().unwrap()),
            // On, but the stand-in serves no list of claims: the watch keeps failing and
            // every prepare GETs its claim.
            ..serve_config(dir.path(), boot_id, Duration::from_millis(50))
        };
        let backend = Arc::new(fgpu_driver::backend::FakeBackend::open(&profile, None).unwrap());
        let task = tokio::spawn(run(cfg, client(s.clone()), backend, std::future::pending()));

        let reg_sock = dir.path().join("plugins_registry/gpu.fgpu.dev-reg.sock");
        let dra_sock = dir.path().join("plugins/gpu.fgpu.dev/dra.sock");
        eventually("the sockets", || reg_sock.exists() && dra_sock.exists()).await;
        eventually("the slice", || {
            s.lock().unwrap().objects.contains_key(SLICE)
        })
        .await;
        assert_eq!(
            s.lock().unwrap().objects[SLICE]["spec"]["devices"][0]["allowMultipleAllocations"],
            true
        );
        {
            let server = s.lock().unwrap();
            let events: Vec<&Value> = server
                .objects
                .iter()
                .filter(|(k, _)| k.starts_with("/apis/events.k8s.io/v1/namespaces/default/events/"))
                .map(|(_, v)| v)
                .collect();
            assert_eq!(events.len(), 1, "{:?}", server.writes);
            assert_eq!(events[0]["reason"], "CheckpointCorrupted");
            assert_eq!(events[0]["type"], "Warning");
            assert_eq!(events[0]["regarding"]["kind"], "Node");
            assert_eq!(events[0]["regarding"]["uid"], "node-uid");
            assert_eq!(events[0]["reportingController"], "fgpu.dev/kubelet-plugin");
            assert_eq!(events[0]["reportingInstance"], "node-a");
            assert!(
                events[0]["note"]
                    .as_str()
                    .unwrap()
                    .contains("checkpoint.json.corrupt-1")
            );
        }
        assert!(dir.path().join("run/checkpoint.json.corrupt-1").exists());

        let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel(&dra_sock).await);
        assert_eq!(
            prepare_cdi_ids(&mut dra).await,
            ["gpu.fgpu.dev/claim=uid-c-gpu-0-s1"]
        );
        let spec = dir.path().join("cdi/gpu.fgpu.dev-claim_uid-c.json");
        assert!(spec.exists());

        // The claim is deleted behind the kubelet's back: the periodic cleanup removes it.
        s.lock().unwrap().objects.remove(CLAIM);
        // Unprepare removes the spec, then the claim's directory: wait for both, else the
        // check below races the second removal on a loaded machine.
        let claim_dir = dir.path().join("run/claims/uid-c");
        eventually("the stale claim's spec and directory to go", || {
            !spec.exists() && !claim_dir.exists()
        })
        .await;
        assert!(!dir.path().join("run/claims/uid-c").exists());

        // The kubelet refuses the registration: the loop stops with that reason.
        let mut registration =
            reg::registration_client::RegistrationClient::new(channel(&reg_sock).await);
        registration
            .notify_registration_status(reg::RegistrationStatus {
                plugin_registered: false,
                error: "no".into(),
            })
            .await
            .unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(outcome, Err(ServeError::Rejected(ref r)) if r == "no"),
            "{outcome:?}"
        );
        assert!(!reg_sock.exists() && !dra_sock.exists());
    }

    fn claim(share: &str) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "c", "namespace": "team", "uid": "uid-c", "resourceVersion": "7",
                            "labels": {"a": "b"},
                            "managedFields": [{"manager": "kube-scheduler", "operation": "Update",
                                               "fieldsV1": {"f:status": {"f:allocation": {}}}}]},
               "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
               "status": {"allocation": {"devices": {"results": [
                   {"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-0",
                    "shareID": share, "consumedCapacity": {"memory": "1Gi", "cores": "10"}}]}},
                   "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]}})
    }

    /// Claim team/c (uid-c), as the kubelet names it.
    fn claim_c() -> Vec<v1::Claim> {
        vec![v1::Claim {
            namespace: "team".into(),
            uid: "uid-c".into(),
            name: "c".into(),
        }]
    }

    /// Prepares claim team/c (uid-c) and returns the CDI device ids of its first device.
    async fn prepare_cdi_ids(
        dra: &mut v1::dra_plugin_client::DraPluginClient<Channel>,
    ) -> Vec<String> {
        let resp = dra
            .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: claim_c() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.claims["uid-c"].error, "");
        resp.claims["uid-c"].devices[0].cdi_device_ids.clone()
    }

    #[tokio::test]
    async fn serve_prepares_from_the_claim_cache_until_the_claim_is_unprepared() {
        let dir = tempfile::tempdir().unwrap();
        let (profile, boot_id) = one_t4_node(dir.path());
        let s = server(vec!["v1"], false);
        {
            // The list has the claim with share "s-list", a GET returns it with "s-get": the
            // CDI device id says which copy a prepare used.
            let mut server = s.lock().unwrap();
            server.objects.insert(CLAIM.into(), claim("s-get"));
            let other_node = json!({"metadata": {"name": "d", "namespace": "team", "uid": "uid-d", "resourceVersion": "8"},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-b", "device": "gpu-0"}]}}}});
            let items = vec![claim("s-list"), other_node];
            server.intercept(move |req| {
                (req.method == Method::GET && req.path == CLAIMS_V1 && !req.is_watch()).then(|| {
                    Answer::ok(
                        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
                                      "metadata": {"resourceVersion": "100"}, "items": items}),
                    )
                })
            });
        }
        let cfg = serve_config(dir.path(), boot_id, Duration::from_secs(3600));
        let backend = Arc::new(fgpu_driver::backend::FakeBackend::open(&profile, None).unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(cfg, client(s.clone()), backend, async move {
            let _ = stopped.await;
        }));
        let dra_sock = dir.path().join("plugins/gpu.fgpu.dev/dra.sock");
        eventually("the DRA socket", || dra_sock.exists()).await;
        // The watch starts after the list is in the cache.
        eventually("the claim watch", || s.lock().unwrap().watches > 0).await;
        let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel(&dra_sock).await);
        assert_eq!(
            prepare_cdi_ids(&mut dra).await,
            ["gpu.fgpu.dev/claim=uid-c-gpu-0-s-list"]
        );

        // Unprepared: the next prepare does not trust the cached allocation and GETs it.
        let resp = dra
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: claim_c() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(resp.claims["uid-c"].error, "");
        assert_eq!(
            prepare_cdi_ids(&mut dra).await,
            ["gpu.fgpu.dev/claim=uid-c-gpu-0-s-get"]
        );

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }

    /// SIGTERM while the API server hangs: `serve::run` ends at once, its sockets gone. The
    /// stand-in answers until the claim is prepared, then never again; the fake's requests
    /// have no timeout, so a loop that waited on one would never end.
    #[tokio::test]
    async fn serve_stops_promptly_while_the_api_server_hangs() {
        let dir = tempfile::tempdir().unwrap();
        let (profile, boot_id) = one_t4_node(dir.path());
        let s = server(vec!["v1"], false);
        s.lock().unwrap().objects.insert(CLAIM.into(), claim("s1"));
        let (client, cut) = s.cuttable_client();
        let cfg = ServeConfig {
            // Off, so that nothing but the loop asks the API server anything: its
            // stale-claim sweep GETs the prepared claim at every resync.
            claim_cache: false,
            ..serve_config(dir.path(), boot_id, Duration::from_millis(50))
        };
        let backend = Arc::new(fgpu_driver::backend::FakeBackend::open(&profile, None).unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(cfg, client, backend, async move {
            let _ = stopped.await;
        }));
        let reg_sock = dir.path().join("plugins_registry/gpu.fgpu.dev-reg.sock");
        let dra_sock = dir.path().join("plugins/gpu.fgpu.dev/dra.sock");
        eventually("the sockets", || reg_sock.exists() && dra_sock.exists()).await;
        let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel(&dra_sock).await);
        assert_eq!(
            prepare_cdi_ids(&mut dra).await,
            ["gpu.fgpu.dev/claim=uid-c-gpu-0-s1"]
        );

        cut.cut();
        eventually("a request of the loop to hang", || cut.hung() > 0).await;
        stop.send(()).unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("serve::run waited on the hung request")
            .unwrap();
        assert!(outcome.is_ok(), "{outcome:?}");
        assert!(!reg_sock.exists() && !dra_sock.exists());
    }
}
