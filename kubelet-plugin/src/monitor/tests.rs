//! A monitor pass over recorded driver samples, a fake /proc and real files; the kill
//! against a real child process.

use std::sync::Mutex;

use fgpu_driver::backend::{BackendError, GpuUsage, ProcessUsage};
use fgpu_driver::device::Gpu;

use super::*;
use crate::checkpoint::PreparedDevice;

const POD_A: &str = "6f1c2d3e-0000-4000-8000-00000000000a";
const POD_B: &str = "6f1c2d3e-0000-4000-8000-00000000000b";
const GI: u64 = 1 << 30;

/// Recorded samples, one list per pass.
struct Recorded(Mutex<Vec<Result<Vec<GpuUsage>, BackendError>>>);

impl DeviceBackend for Recorded {
    fn name(&self) -> &'static str {
        "recorded"
    }
    fn enumerate(&self) -> Result<Vec<Gpu>, BackendError> {
        Ok(Vec::new())
    }
    fn usage(&self, _since_us: u64) -> Result<Vec<GpuUsage>, BackendError> {
        let mut v = self.0.lock().unwrap();
        if v.is_empty() {
            Ok(Vec::new())
        } else {
            v.remove(0)
        }
    }
}

struct TestHost {
    records: BTreeMap<String, ClaimRecord>,
    metrics: Metrics,
}

impl Host for TestHost {
    fn records(&self) -> BTreeMap<String, ClaimRecord> {
        self.records.clone()
    }
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

fn record(dir: &Path, pod: &str, memory: u64, cores: u8) -> ClaimRecord {
    std::fs::create_dir_all(dir.join("feed")).unwrap();
    ClaimRecord {
        namespace: "ml".into(),
        name: format!("pod-{}/main", &pod[35..]),
        state: PrepareState::PrepareCompleted,
        spec_file: PathBuf::new(),
        claim_dir: dir.to_owned(),
        devices: vec![PreparedDevice {
            gpu_uuid: "GPU-0".into(),
            memory_bytes: memory,
            cores,
            enforcement: Default::default(),
            ..Default::default()
        }],
    }
}

fn proc_entry(root: &Path, pid: u32, pod: &str) {
    std::fs::create_dir_all(root.join(pid.to_string())).unwrap();
    std::fs::write(
        root.join(pid.to_string()).join("cgroup"),
        format!("0::/kubepods/besteffort/pod{pod}/4a5b6c7d8e9f0011\n"),
    )
    .unwrap();
}

fn gpu0(p: &[(u32, u64, u32)]) -> GpuUsage {
    GpuUsage {
        uuid: "GPU-0".into(),
        processes: p
            .iter()
            .map(|&(pid, m, sm)| ProcessUsage {
                pid,
                used_memory: Some(m),
                sm_percent: Some(sm),
            })
            .collect(),
        error: None,
        sm_error: None,
    }
}

#[test]
fn a_pass_writes_feeds_metrics_and_reports_the_claim_over_its_grant() {
    let tmp = tempfile::tempdir().unwrap();
    let proc_root = tmp.path().join("proc");
    proc_entry(&proc_root, 410_001, POD_A);
    proc_entry(&proc_root, 410_002, POD_B);
    proc_entry(&proc_root, 410_003, POD_B);
    let (da, db) = (tmp.path().join("a"), tmp.path().join("b"));
    let records = BTreeMap::from([
        (format!("{POD_A}-main"), record(&da, POD_A, 4 * GI, 30)),
        (format!("{POD_B}-main"), record(&db, POD_B, 2 * GI, 70)),
    ]);
    let host = Arc::new(TestHost {
        records,
        metrics: Metrics::new(),
    });
    let backend = Arc::new(Recorded(Mutex::new(vec![
        Err(BackendError::Nvml {
            call: "nvmlDeviceGetCount",
            gpu: None,
            detail: "Unknown Error".into(),
        }),
        // B: 1 GiB through the shim + 3 GiB bypassing it, 2 GiB granted.
        Ok(vec![gpu0(&[
            (410_001, GI, 29),
            (410_002, GI, 40),
            (410_003, 3 * GI, 30),
            (999, 5, 1),
        ])]),
    ])));
    let cfg = MonitorConfig {
        node: "n".into(),
        period: Duration::from_secs(1),
        proc_root: proc_root.clone(),
        hami_metrics: false,
        claim_status_interval: None,
        claim_status_refresh: None,
        backstop: BackstopConfig {
            action: OverQuotaAction::Report,
            memory_tolerance: 256 << 20,
            compute_points: 15,
            compute_window: Duration::from_secs(30),
            repeat: Duration::from_secs(300),
        },
    };
    let mut m = Monitor::new(cfg, backend, host.clone(), Consumers::PodUidPrefix, None);
    // A driver failure: no findings, counted, the monitor goes on.
    assert!(m.pass().is_empty());
    assert!(
        host.metrics
            .encode()
            .contains(r#"fgpu_kubelet_plugin_monitor_errors_total{cause="usage"} 1"#)
    );
    let findings = m.pass();
    assert_eq!(findings.len(), 1, "{findings:?}");
    let f = &findings[0];
    assert_eq!((f.kind, f.used, f.granted), (Kind::Memory, 4 * GI, 2 * GI));
    assert_eq!(f.claim_name, format!("pod-{}/main", &POD_B[35..]));
    assert!(f.kill.is_empty());
    let note = event_note(f, OverQuotaAction::Report);
    assert!(
        note.contains("holds 4096 MiB of device memory on GPU GPU-0, granted 2048 MiB"),
        "{note}"
    );
    assert!(
        note.contains("pid 410002 1024 MiB, pid 410003 3072 MiB"),
        "{note}"
    );
    // The feeds: each claim's own processes and utilisation.
    let fa = std::fs::read_to_string(da.join("feed/utilisation")).unwrap();
    assert!(
        fa.contains("gpu.GPU-0.sm_permille=290\n") && fa.contains("gpu.GPU-0.pids=410001\n"),
        "{fa}"
    );
    let fb = std::fs::read_to_string(db.join("feed/utilisation")).unwrap();
    assert!(fb.contains("gpu.GPU-0.sm_permille=700\n"), "{fb}");
    assert!(
        fb.contains(&format!("gpu.GPU-0.memory_used={}\n", 4 * GI)),
        "{fb}"
    );
    let text = host.metrics.encode();
    assert!(text.contains(&format!(
        "fgpu_kubelet_plugin_claim_used_memory_bytes{{namespace=\"ml\",claim=\"pod-b/main\",gpu_uuid=\"GPU-0\"}} {}",
        4 * GI
    )), "{text}");
    assert!(
        text.contains(r#"fgpu_kubelet_plugin_over_quota_total{kind="memory",action="report"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"fgpu_kubelet_plugin_gpu_unattributed_processes{gpu_uuid="GPU-0"} 1"#),
        "{text}"
    );
    // The shared view.
    let snap = m.latest().get().unwrap();
    assert_eq!(snap.usage.claims.len(), 2);
}

#[test]
fn kill_hits_only_a_process_still_in_the_pod() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = child.id();
    // The fake /proc says the child is in another pod: not killed.
    proc_entry(tmp.path(), pid, POD_B);
    let e = kill_in_pod(tmp.path(), pid, POD_A).unwrap_err();
    assert!(e.to_string().contains("no longer in pod"), "{e}");
    assert!(child.try_wait().unwrap().is_none(), "the child must live");
    // In the pod: SIGKILL.
    kill_in_pod(tmp.path(), pid, POD_B).unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(9));
    // A PID that does not exist.
    assert!(kill_in_pod(tmp.path(), pid, POD_B).is_err());
}

fn quiet_backstop() -> BackstopConfig {
    BackstopConfig {
        action: OverQuotaAction::Report,
        memory_tolerance: 256 << 20,
        compute_points: 15,
        compute_window: Duration::from_secs(30),
        repeat: Duration::from_secs(300),
    }
}

/// A line of `text` that starts with `series` (a family and its labels), and its value.
fn value_of(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn legacy_claims_give_per_container_series_and_hami_families() {
    let tmp = tempfile::tempdir().unwrap();
    let proc_root = tmp.path().join("proc");
    proc_entry(&proc_root, 420_001, POD_A);
    proc_entry(&proc_root, 420_002, POD_A);
    proc_entry(&proc_root, 420_003, POD_B);
    let records = BTreeMap::from([
        (
            format!("{POD_A}-main"),
            record(&tmp.path().join("a"), POD_A, 4 * GI, 30),
        ),
        (
            format!("{POD_B}-main"),
            record(&tmp.path().join("b"), POD_B, 2 * GI, 70),
        ),
    ]);
    let host = Arc::new(TestHost {
        records,
        metrics: Metrics::new(),
    });
    let mut gpu = crate::edits::tests::gpu(0, "0000:01:00.0");
    gpu.uuid = "GPU-0".into();
    let product = gpu.product_name.clone();
    host.metrics.set_gpus(&fgpu_driver::device::NodeInventory {
        node: "n".into(),
        gpus: vec![gpu],
    });
    let backend = Arc::new(Recorded(Mutex::new(vec![Ok(vec![gpu0(&[
        (420_001, GI, 10),
        (420_002, 2 * GI, 15),
        (420_003, GI, 60),
    ])])])));
    let cfg = |hami| MonitorConfig {
        node: "node-1".into(),
        period: Duration::from_secs(1),
        proc_root: proc_root.clone(),
        hami_metrics: hami,
        claim_status_interval: None,
        claim_status_refresh: None,
        backstop: quiet_backstop(),
    };
    // Without --hami-metrics: fgpu's families only.
    let mut m = Monitor::new(
        cfg(false),
        backend.clone(),
        host.clone(),
        Consumers::PodUidPrefix,
        None,
    );
    m.pass();
    let text = host.metrics.encode();
    let a = r#"{namespace="ml",pod="pod-a",container="main",claim="pod-a/main",gpu_uuid="GPU-0"}"#;
    assert_eq!(
        value_of(
            &text,
            &format!("fgpu_kubelet_plugin_container_used_memory_bytes{a}")
        ),
        Some((3 * GI) as f64),
        "{text}"
    );
    assert_eq!(
        value_of(
            &text,
            &format!("fgpu_kubelet_plugin_container_processes{a}")
        ),
        Some(2.0)
    );
    assert_eq!(
        value_of(
            &text,
            &format!("fgpu_kubelet_plugin_container_sm_utilization_ratio{a}")
        ),
        Some(0.25)
    );
    assert!(
        !text.contains("hami_"),
        "HAMi's families are off by default"
    );
    assert!(text.ends_with("# EOF\n"), "one end marker");
    // With it: HAMi's names, labels and percent.
    backend.0.lock().unwrap().push(Ok(vec![gpu0(&[
        (420_001, GI, 10),
        (420_002, 2 * GI, 15),
        (420_003, GI, 60),
    ])]));
    let mut m = Monitor::new(
        cfg(true),
        backend,
        host.clone(),
        Consumers::PodUidPrefix,
        None,
    );
    m.pass();
    let text = host.metrics.encode();
    let b =
        r#"{namespace="ml",pod="pod-b",container="main",vdevice_index="0",device_uuid="GPU-0"}"#;
    for (family, want) in [
        ("hami_vgpu_memory_used_bytes", GI as f64),
        ("hami_vgpu_memory_limit_bytes", (2 * GI) as f64),
        ("hami_container_device_memory_bytes", GI as f64),
        ("hami_container_device_utilization_ratio", 60.0),
    ] {
        assert_eq!(
            value_of(&text, &format!("{family}{b}")),
            Some(want),
            "{family} in\n{text}"
        );
    }
    let h = format!(
        r#"{{node="node-1",device_index="0",device_uuid="GPU-0",device_type="NVIDIA-{product}"}}"#
    );
    assert_eq!(
        value_of(&text, &format!("hami_host_gpu_memory_used_bytes{h}")),
        Some((4 * GI) as f64),
        "{text}"
    );
    assert_eq!(
        value_of(&text, &format!("hami_host_gpu_utilization_ratio{h}")),
        Some(85.0)
    );
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
}

/// The kubelet's pod resources API, answering `List` with one fixed response.
struct Kubelet(fgpu_api::proto::podresources::v1::ListPodResourcesResponse);

#[tonic::async_trait]
impl fgpu_api::proto::podresources::v1::pod_resources_lister_server::PodResourcesLister
    for Kubelet
{
    async fn list(
        &self,
        _: tonic::Request<fgpu_api::proto::podresources::v1::ListPodResourcesRequest>,
    ) -> Result<
        tonic::Response<fgpu_api::proto::podresources::v1::ListPodResourcesResponse>,
        tonic::Status,
    > {
        Ok(tonic::Response::new(self.0.clone()))
    }
}

#[tokio::test]
async fn dra_containers_are_named_from_the_kubelets_pod_resources() {
    use fgpu_api::proto::podresources::v1 as pr;
    let tmp = tempfile::tempdir().unwrap();
    let proc_root = tmp.path().join("proc");
    proc_entry(&proc_root, 430_001, POD_A);
    // A DRA claim "shared" used by container "train" of pod-a (and by nothing else).
    let mut rec = record(&tmp.path().join("a"), POD_A, 4 * GI, 30);
    rec.name = "shared".into();
    let records = BTreeMap::from([("claim-uid".to_owned(), rec)]);
    let host = Arc::new(TestHost {
        records,
        metrics: Metrics::new(),
    });
    let container = |name: &str, claims: &[&str]| pr::ContainerResources {
        name: name.into(),
        devices: vec![],
        dynamic_resources: claims
            .iter()
            .map(|c| pr::DynamicResource {
                claim_name: (*c).into(),
                claim_namespace: "ml".into(),
                claim_resources: vec![],
            })
            .collect(),
    };
    let answer = pr::ListPodResourcesResponse {
        pod_resources: vec![pr::PodResources {
            name: "pod-a".into(),
            namespace: "ml".into(),
            containers: vec![container("train", &["shared"]), container("log", &[])],
        }],
    };
    let socket = tmp.path().join("kubelet.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                pr::pod_resources_lister_server::PodResourcesListerServer::new(Kubelet(answer)),
            )
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let backend = Arc::new(Recorded(Mutex::new(vec![
        Ok(vec![gpu0(&[(430_001, GI, 20)])]),
        Ok(vec![gpu0(&[(430_001, GI, 20)])]),
    ])));
    let cfg = MonitorConfig {
        node: "n".into(),
        period: Duration::from_secs(1),
        proc_root: proc_root.clone(),
        hami_metrics: false,
        claim_status_interval: None,
        claim_status_refresh: None,
        backstop: quiet_backstop(),
    };
    // The claim serves pod-a: its status.reservedFor, in the claim cache.
    let cache = crate::claim_cache::ClaimCache::new("gpu.fgpu.dev", "n");
    cache.relist_started();
    cache.relisted(
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "shared", "namespace": "ml", "uid": "claim-uid"},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "gpu", "driver": "gpu.fgpu.dev", "pool": "n", "device": "gpu-0"}]}},
                "reservedFor": [{"resource": "pods", "name": "pod-a", "uid": POD_A}]
            }
        }))
        .unwrap(),
    );
    cache.relist_done();
    let consumers = Consumers::ReservedFor(Arc::new(cache));
    let series = r#"fgpu_kubelet_plugin_container_used_memory_bytes{namespace="ml",pod="pod-a",container="train",claim="shared",gpu_uuid="GPU-0"}"#;
    // Without the socket: no name.
    let mut m = Monitor::new(
        cfg.clone(),
        backend.clone(),
        host.clone(),
        consumers.clone(),
        None,
    );
    m.pass();
    let text = host.metrics.encode();
    assert!(
        text.contains(
            r#"container_used_memory_bytes{namespace="ml",pod="pod-a",container="",claim="shared""#
        ),
        "{text}"
    );
    // With it: the one container that uses the claim.
    let mut m =
        Monitor::new(cfg, backend, host.clone(), consumers, None).with_pod_resources(socket);
    m.refresh_containers().await;
    let m = tokio::task::spawn_blocking(move || {
        m.pass();
        m
    })
    .await
    .unwrap();
    let text = host.metrics.encode();
    assert_eq!(value_of(&text, series), Some(GI as f64), "{text}");
    drop(m);
    server.abort();
}

#[test]
fn the_feed_window_is_the_time_since_the_last_sample_or_one_period() {
    let period = Duration::from_millis(1000);
    assert_eq!(window_ms(0, 5_000_000, period), 1000);
    assert_eq!(window_ms(4_000_000, 5_500_000, period), 1500);
    // A clock that stepped back gives an empty window, not a huge one.
    assert_eq!(window_ms(6_000_000, 5_000_000, period), 0);
}

fn view(uid: &str, gpus: &[&str], pods: &[&str]) -> ClaimView {
    ClaimView {
        uid: uid.into(),
        namespace: "ml".into(),
        name: format!("c-{uid}"),
        pods: pods
            .iter()
            .map(|p| PodRef {
                namespace: "ml".into(),
                name: (*p).into(),
                uid: format!("uid-{p}"),
            })
            .collect(),
        grants: gpus
            .iter()
            .map(|g| GpuGrant {
                gpu_uuid: (*g).into(),
                memory_bytes: GI,
                cores: 0,
            })
            .collect(),
    }
}

fn usage_of(v: &ClaimView, used: &[u64]) -> attribute::ClaimUsage {
    attribute::ClaimUsage {
        uid: v.uid.clone(),
        namespace: v.namespace.clone(),
        name: v.name.clone(),
        gpus: v
            .grants
            .iter()
            .zip(used)
            .map(|(g, &m)| attribute::ClaimGpuUsage {
                grant: g.clone(),
                processes: (m > 0)
                    .then(|| attribute::ClaimProcess {
                        pid: 7,
                        used_memory: m,
                        sm_percent: Some(40),
                        pod: v.pods[0].clone(),
                        container_id: "c".into(),
                        ambiguous: false,
                    })
                    .into_iter()
                    .collect(),
                memory_known: true,
            })
            .collect(),
    }
}

#[test]
fn metric_rows_cover_each_claim_gpu_and_pod() {
    let (a, b) = (
        view("a", &["GPU-0", "GPU-1"], &["p1", "p2"]),
        view("b", &["GPU-0"], &[]),
    );
    let pods = claim_pods(&[a.clone(), b.clone()]);
    assert_eq!(pods["a"].len(), 2);
    assert!(pods["b"].is_empty());
    let rows: Vec<_> = claim_pod_rows(std::slice::from_ref(&a)).collect();
    assert_eq!(
        rows,
        [
            ("ml", "c-a", "GPU-0", "p1"),
            ("ml", "c-a", "GPU-0", "p2"),
            ("ml", "c-a", "GPU-1", "p1"),
            ("ml", "c-a", "GPU-1", "p2"),
        ]
    );
    // A claim without pods has no info row.
    assert_eq!(claim_pod_rows(&[b]).count(), 0);

    let usage = [usage_of(&a, &[GI, 0])];
    let figures: Vec<_> = claim_gpu_rows(&usage)
        .map(|f| (f.gpu_uuid, f.used_memory, f.sm_percent, f.processes))
        .collect();
    assert_eq!(figures, [("GPU-0", GI, 40, 1), ("GPU-1", 0, 0, 0)]);
}

#[test]
fn shim_rows_give_refusals_by_claim_and_gpu() {
    let a = view("a", &["GPU-0", "GPU-1"], &["p1"]);
    let usage = usage_of(&a, &[0, 0]);
    let shim: Vec<ShimRow<'_>> = vec![
        (
            &usage,
            "GPU-0",
            accounts::Raw {
                refusals: 3,
                throttled_ns: 10,
                managed: 1 << 30,
            },
        ),
        (
            &usage,
            "GPU-1",
            accounts::Raw {
                refusals: 0,
                throttled_ns: 20,
                managed: 0,
            },
        ),
    ];
    let by = refusals(&shim);
    assert_eq!(by[&("a".to_owned(), "GPU-0".to_owned())], 3);
    assert_eq!(by[&("a".to_owned(), "GPU-1".to_owned())], 0);
    let rows: Vec<_> = shim_counter_rows(&shim).collect();
    assert_eq!(
        rows,
        [
            ("ml", "c-a", "GPU-0", 3, 10, 1 << 30),
            ("ml", "c-a", "GPU-1", 0, 20, 0)
        ]
    );
}
