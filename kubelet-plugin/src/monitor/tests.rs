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
        claim_status_interval: None,
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
