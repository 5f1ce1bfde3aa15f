//! Node monitor CPU per pass (issue 18's benchmark): 8 GPUs x 32 processes, 64 claims.
//!
//! ```text
//! cargo run --release -p fgpu-kubelet-plugin --example bench_monitor [PASSES]
//! ```
//!
//! A pass here is everything but the driver calls: reading each process's
//! `/proc/<pid>/cgroup` (the real `/proc`: the PIDs are this machine's own processes, so
//! the reads are real; a fake cgroup tree is not needed because unattributed and
//! attributed processes cost the same read), the attribution, the 64 feeds written and
//! replaced in a temporary directory, the metrics and the backstop. The driver's side is
//! measured by `tests/fake-cuda` (fake) or on a GPU node (NVML). Printed: CPU time per pass
//! (user + system of this process, `getrusage` via /proc/self/stat) for the full pass and
//! for a baseline pass with no process on any GPU, and the ratio.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fgpu_driver::backend::{BackendError, DeviceBackend, GpuUsage, ProcessUsage};
use fgpu_driver::device::Gpu;
use fgpu_kubelet_plugin::checkpoint::{ClaimRecord, PrepareState, PreparedDevice};
use fgpu_kubelet_plugin::metrics::Metrics;
use fgpu_kubelet_plugin::monitor::backstop::{BackstopConfig, OverQuotaAction};
use fgpu_kubelet_plugin::monitor::{Consumers, Host, Monitor, MonitorConfig};

const GPUS: usize = 8;
const PER_GPU: usize = 32;
const CLAIMS: usize = 64;

struct Samples(Mutex<Vec<GpuUsage>>);

impl DeviceBackend for Samples {
    fn name(&self) -> &'static str {
        "recorded"
    }
    fn enumerate(&self) -> Result<Vec<Gpu>, BackendError> {
        Ok(Vec::new())
    }
    fn usage(&self, _since_us: u64) -> Result<Vec<GpuUsage>, BackendError> {
        Ok(self.0.lock().unwrap().clone())
    }
}

struct BenchHost {
    records: BTreeMap<String, ClaimRecord>,
    metrics: Metrics,
}

impl Host for BenchHost {
    fn records(&self) -> BTreeMap<String, ClaimRecord> {
        self.records.clone()
    }
    fn metrics(&self) -> &Metrics {
        &self.metrics
    }
}

fn cpu_ticks() -> u64 {
    // utime + stime (fields 14 and 15 of /proc/self/stat), in clock ticks.
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn run(monitor: &mut Monitor, passes: usize) -> Duration {
    let t0 = cpu_ticks();
    for _ in 0..passes {
        monitor.pass();
    }
    // USER_HZ is 100 on Linux.
    Duration::from_millis((cpu_ticks() - t0) * 10) / passes as u32
}

fn main() {
    let passes: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    // The claims' directories where the plugin keeps them on a node: a tmpfs (/run); here
    // /dev/shm when present, else the temporary directory (FGPU_BENCH_DIR overrides).
    let base = std::env::var_os("FGPU_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let shm = PathBuf::from("/dev/shm");
            if shm.is_dir() {
                shm
            } else {
                std::env::temp_dir()
            }
        });
    let dir = base.join(format!("fgpu-bench-monitor-{}", std::process::id()));
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let uuid = |g: usize| format!("GPU-00000000-0000-4000-8000-00000000000{g}");
    let mut records = BTreeMap::new();
    for c in 0..CLAIMS {
        let claim_dir = dir.join(format!("c{c}"));
        std::fs::create_dir_all(claim_dir.join("feed")).unwrap();
        records.insert(
            format!("00000000-0000-4000-8000-{c:012}-main"),
            ClaimRecord {
                namespace: "bench".into(),
                name: format!("pod-{c}/main"),
                state: PrepareState::PrepareCompleted,
                spec_file: PathBuf::new(),
                claim_dir,
                devices: vec![PreparedDevice {
                    gpu_uuid: uuid(c % GPUS),
                    memory_bytes: 8 << 30,
                    cores: 12,
                    enforcement: Default::default(),
                    ..Default::default()
                }],
            },
        );
    }
    let full: Vec<GpuUsage> = (0..GPUS)
        .map(|g| GpuUsage {
            uuid: uuid(g),
            processes: (0..PER_GPU)
                .map(|i| ProcessUsage {
                    pid: pids[(g * PER_GPU + i) % pids.len()],
                    used_memory: Some(1 << 28),
                    sm_percent: Some(3),
                })
                .collect(),
            error: None,
            sm_error: None,
        })
        .collect();
    let empty: Vec<GpuUsage> = full
        .iter()
        .map(|g| GpuUsage {
            processes: Vec::new(),
            ..g.clone()
        })
        .collect();
    let backend = Arc::new(Samples(Mutex::new(empty)));
    let host = Arc::new(BenchHost {
        records,
        metrics: Metrics::new(),
    });
    let cfg = MonitorConfig {
        node: "bench".into(),
        period: Duration::from_secs(1),
        proc_root: PathBuf::from("/proc"),
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
    let mut m = Monitor::new(cfg, backend.clone(), host, Consumers::PodUidPrefix, None);
    run(&mut m, passes / 10); // warm-up
    let base = run(&mut m, passes);
    *backend.0.lock().unwrap() = full;
    run(&mut m, passes / 10);
    let loaded = run(&mut m, passes);
    println!(
        "monitor pass, {CLAIMS} claims, CPU per pass: no processes {:.1} us; {GPUS} GPUs x {PER_GPU} processes {:.1} us ({:.2}x); {} passes each",
        base.as_secs_f64() * 1e6,
        loaded.as_secs_f64() * 1e6,
        loaded.as_secs_f64() / base.as_secs_f64().max(1e-9),
        passes
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
