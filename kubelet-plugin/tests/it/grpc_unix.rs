//! The kubelet's view: registration and DRA (v1 and v1beta1) over real unix sockets, called
//! with the generated tonic clients, against the fake device backend.

use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fgpu_api::names::DriverName;
use fgpu_api::proto::dra::{v1, v1beta1};
use fgpu_api::proto::pluginregistration as reg;
use fgpu_driver::backend::FakeBackend;
use fgpu_kubelet_plugin::edits::{FileMount, NodeFiles};
use fgpu_kubelet_plugin::grpc::{PluginServer, RegistrationState, Sockets};
use fgpu_kubelet_plugin::prepare::{MapClaimSource, Plugin, PluginConfig};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint, Uri};

/// A fake node with two H100s; `DEVROOT` is replaced by the test's device directory.
const PROFILE: &str = include_str!("../fixtures/node-a-2xh100.yaml");

async fn channel(path: &Path) -> Channel {
    let path = path.to_owned();
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .unwrap()
}

fn claim(
    name: &str,
    uid: &str,
    results: Value,
    config: Value,
) -> fgpu_kubelet_plugin::claim::ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "team", "uid": uid},
        "status": {"allocation": {"devices": {"results": results, "config": config}}}
    }))
    .unwrap()
}

fn share_config(extra: Value) -> Value {
    let mut p = json!({"apiVersion": "gpu.fgpu.dev/v1alpha1", "kind": "GpuShareConfig"});
    p.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!([{"source": "FromClaim", "requests": [], "opaque": {"driver": "gpu.fgpu.dev", "parameters": p}}])
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

struct Setup {
    dir: tempfile::TempDir,
    server: PluginServer,
}

impl Setup {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("profile.yaml");
        let devroot = dir.path().join("dev");
        std::fs::write(
            &profile,
            PROFILE.replace("DEVROOT", devroot.to_str().unwrap()),
        )
        .unwrap();
        let source = Arc::new(MapClaimSource::default());
        source.insert(claim(
            "share",
            "uid-share",
            json!([{"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-0",
                    "shareID": "7f0c", "consumedCapacity": {"memory": "10Gi", "cores": "30"}}]),
            json!([]),
        ));
        source.insert(claim(
            "quota",
            "uid-quota",
            json!([{"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-1"}]),
            share_config(json!({"memory": "4Gi", "cores": 20})),
        ));
        source.insert(claim(
            "bad",
            "uid-bad",
            json!([{"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "node-a", "device": "gpu-1"}]),
            share_config(json!({"cores": 140})),
        ));
        let backend = Arc::new(FakeBackend::open(&profile, Some("node-a")).unwrap());
        let cfg = PluginConfig {
            driver: DriverName::default(),
            node_name: "node-a".into(),
            state_root: dir.path().join("state"),
            run_root: dir.path().join("run"),
            cdi_dir: dir.path().join("cdi"),
            files: NodeFiles {
                shim_library: dir.path().join("lib/libfgpu.so"),
                driver_mounts: vec![FileMount {
                    host_path: dir.path().join("fake-cuda/libcuda.so.1"),
                    container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                }],
                driver_hooks: vec![],
                fake_driver: false,
                fake_state_dir: None,
                context_overhead: 0,
                memory_limits: None,
            },
            boot_id: "boot-1".into(),
            claim_get_timeout: fgpu_kubelet_plugin::prepare::CLAIM_GET_TIMEOUT,
            test_pause: None,
        };
        let (plugin, _) = Plugin::start(cfg, source, backend).unwrap();
        let sockets = Sockets::new(
            &dir.path().join("plugins_registry"),
            &dir.path().join("plugins"),
            &DriverName::default(),
        );
        let server = PluginServer::start(Arc::new(plugin), sockets)
            .await
            .unwrap();
        Self { dir, server }
    }

    fn spec(&self, uid: &str) -> PathBuf {
        self.dir
            .path()
            .join(format!("cdi/gpu.fgpu.dev-claim_{uid}.json"))
    }
}

fn v1_claim(name: &str, uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: "team".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn registration_and_sockets() {
    let s = Setup::new().await;
    let sockets = s.server.sockets().clone();
    assert_eq!(
        sockets.registration,
        s.dir.path().join("plugins_registry/gpu.fgpu.dev-reg.sock")
    );
    assert_eq!(
        sockets.dra,
        s.dir.path().join("plugins/gpu.fgpu.dev/dra.sock")
    );
    for p in [&sockets.registration, &sockets.dra] {
        assert!(
            std::fs::metadata(p).unwrap().file_type().is_socket(),
            "{}",
            p.display()
        );
        assert_eq!(mode(p), 0o600, "{}", p.display());
    }
    // No temporary socket left behind.
    let names: Vec<_> = std::fs::read_dir(sockets.registration.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["gpu.fgpu.dev-reg.sock"]);

    let mut client =
        reg::registration_client::RegistrationClient::new(channel(&sockets.registration).await);
    let info = client
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.fgpu.dev");
    assert_eq!(info.endpoint, sockets.dra.to_str().unwrap());
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );

    let mut state = s.server.registration();
    assert_eq!(*state.borrow(), RegistrationState::Pending);
    client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: false,
            error: "version not supported".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        *state
            .wait_for(|s| *s != RegistrationState::Pending)
            .await
            .unwrap(),
        RegistrationState::Rejected("version not supported".into())
    );
    client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(*state.borrow_and_update(), RegistrationState::Registered);

    s.server.shutdown().await.unwrap();
    assert!(!sockets.registration.exists());
    assert!(!sockets.dra.exists());
}

#[tokio::test]
async fn v1_prepare_unprepare_with_per_claim_errors() {
    let s = Setup::new().await;
    let dra = s.server.sockets().dra.clone();
    let mut client = v1::dra_plugin_client::DraPluginClient::new(channel(&dra).await);
    let request = v1::NodePrepareResourcesRequest {
        claims: vec![
            v1_claim("share", "uid-share"),
            v1_claim("bad", "uid-bad"),
            v1_claim("gone", "uid-gone"),
            v1_claim("share", "uid-replaced"),
        ],
    };
    let resp = client
        .node_prepare_resources(request.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims.len(), 4, "{resp:?}");
    let ok = &resp.claims["uid-share"];
    assert_eq!(ok.error, "");
    assert_eq!(
        ok.devices,
        [v1::Device {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-0".into(),
            cdi_device_ids: vec!["gpu.fgpu.dev/claim=uid-share-gpu-0-7f0c".into()],
            share_id: Some("7f0c".into()),
        }]
    );
    assert_eq!(
        resp.claims["uid-bad"].error,
        "claim team/bad: status.allocation.devices.config[0].opaque.parameters.cores: 140 is above the maximum 100"
    );
    assert!(resp.claims["uid-bad"].devices.is_empty());
    assert_eq!(
        resp.claims["uid-gone"].error,
        "claim team/gone: not found in the API server"
    );
    assert!(
        resp.claims["uid-replaced"]
            .error
            .contains("metadata.uid is uid-share, the kubelet asked for uid-replaced"),
        "{}",
        resp.claims["uid-replaced"].error
    );

    // The spec is on disk, names the share and points at the fake device nodes.
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(s.spec("uid-share")).unwrap()).unwrap();
    assert_eq!(spec["kind"], "gpu.fgpu.dev/claim");
    assert_eq!(spec["devices"][0]["name"], "uid-share-gpu-0-7f0c");
    let host = spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"]
        .as_str()
        .unwrap();
    assert_eq!(host, s.dir.path().join("dev/nvidia0").to_str().unwrap());
    let env: Vec<&str> = spec["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(env.contains(&"FGPU_MEMORY_LIMIT=10737418240"), "{env:?}");
    assert!(env.contains(&"FGPU_CORE_LIMIT=30"), "{env:?}");

    // Again: the same answer for the good claim.
    let again = client
        .node_prepare_resources(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims["uid-share"], resp.claims["uid-share"]);

    // Unprepare: the prepared one, one never prepared; both succeed.
    let un = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![v1_claim("share", "uid-share"), v1_claim("gone", "uid-gone")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims.len(), 2);
    assert!(un.claims.values().all(|r| r.error.is_empty()), "{un:?}");
    assert!(!s.spec("uid-share").exists());
    assert!(!s.dir.path().join("run/claims/uid-share").exists());

    // An empty call (a liveness probe) gets an empty answer.
    let empty = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![] })
        .await
        .unwrap()
        .into_inner();
    assert!(empty.claims.is_empty());
    s.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn v1beta1_prepare_unprepare() {
    let s = Setup::new().await;
    let dra = s.server.sockets().dra.clone();
    let mut client = v1beta1::dra_plugin_client::DraPluginClient::new(channel(&dra).await);
    let c = v1beta1::Claim {
        namespace: "team".into(),
        uid: "uid-quota".into(),
        name: "quota".into(),
    };
    let resp = client
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![c.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    let r = &resp.claims["uid-quota"];
    assert_eq!(r.error, "");
    assert_eq!(
        r.devices,
        [v1beta1::Device {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-1".into(),
            cdi_device_ids: vec!["gpu.fgpu.dev/claim=uid-quota-gpu-1".into()],
        }]
    );
    let limits = std::fs::read_to_string(s.dir.path().join("run/claims/uid-quota/limits")).unwrap();
    // Contract v2: keyed by the GPU's UUID, whatever the ordinal in the container.
    assert!(limits.contains("\nversion=2\n"), "{limits}");
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("gpu.GPU-") && l.ends_with(".memory=4294967296")),
        "{limits}"
    );
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("gpu.GPU-") && l.ends_with(".cores=20")),
        "{limits}"
    );

    // A bad claim on the old API too, and the server keeps serving.
    let bad = client
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "team".into(),
                uid: "uid-bad".into(),
                name: "bad".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        bad.claims["uid-bad"].error.starts_with("claim team/bad: "),
        "{bad:?}"
    );

    let un = client
        .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest { claims: vec![c] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(un.claims["uid-quota"].error, "");
    assert!(!s.spec("uid-quota").exists());
    s.server.shutdown().await.unwrap();
}
