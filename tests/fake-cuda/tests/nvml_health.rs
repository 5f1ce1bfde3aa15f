//! The `nvml` backend's health checks (`fgpu_driver::backend::nvml`: its event set and
//! its probes, through `nvml-wrapper`) against this library's fake NVML, with faults
//! injected in the fake backend's file format (`FaultFile`, as `fgpu-kubelet-plugin
//! fake-fault` writes it), and the driver's health state machine on top.
//!
//! One test in this file: it sets the library's environment before the library is loaded.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use fgpu_driver::backend::fake::FaultFile;
use fgpu_driver::backend::nvml::NvmlBackend;
use fgpu_driver::backend::{DeviceBackend, HealthReport};
use fgpu_driver::health::{Condition, Fault, HealthPolicy, HealthTracker, Severity};

mod common;
use common::library;

const GPU0: &str = "GPU-e2e00000-0000-4000-8000-000000000000";
const GPU1: &str = "GPU-e2e00000-0000-4000-8000-000000000001";
/// Known to the plugin, not enumerated by NVML.
const GONE: &str = "GPU-e2e00000-0000-4000-8000-0000000000ff";

fn inject(path: &Path, faults: &[(&str, &[&str])]) {
    let file = FaultFile {
        gpus: faults
            .iter()
            .map(|(u, f)| (u.to_string(), f.iter().map(|s| s.to_string()).collect()))
            .collect(),
    };
    file.save(path).unwrap();
}

/// Runs one check of the known GPUs and feeds it to the tracker; returns each GPU's
/// faults, by UUID order of `known`.
struct Checker {
    backend: NvmlBackend,
    tracker: HealthTracker,
    known: Vec<String>,
    clock: SystemTime,
}

impl Checker {
    fn check(&mut self) -> Vec<Vec<Fault>> {
        let reports: Vec<HealthReport> = self.backend.check_health(&self.known).unwrap();
        self.clock += Duration::from_secs(1);
        self.known
            .iter()
            .map(|u| {
                let r = reports
                    .iter()
                    .find(|r| &r.uuid == u)
                    .unwrap_or_else(|| panic!("no report for {u}: {reports:?}"));
                self.tracker.observe(u, &r.faults, self.clock);
                r.faults.clone()
            })
            .collect()
    }

    fn severity(&self, uuid: &str) -> Option<Severity> {
        match self.tracker.condition(uuid) {
            Condition::Healthy => None,
            Condition::Unhealthy(u) => Some(u.severity),
        }
    }
}

#[test]
fn nvml_events_and_probes_report_the_injected_faults_and_recovery_follows_the_policy() {
    let dir = std::env::temp_dir().join(format!("fgpu-nvml-health-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let faults: PathBuf = dir.join("profile.yaml.faults.json");
    // SAFETY: the only test of this binary, before anything reads the environment on
    // another thread (the library is loaded below, after these writes).
    unsafe {
        std::env::set_var("FAKE_CUDA_UUIDS", format!("{GPU0},{GPU1}"));
        std::env::set_var("FAKE_CUDA_FAULTS", &faults);
    }
    let mut c = Checker {
        backend: NvmlBackend::with_library(&library()).unwrap(),
        tracker: HealthTracker::new(HealthPolicy {
            recovery_checks: 2,
            ..HealthPolicy::default()
        }),
        known: vec![GPU0.into(), GPU1.into(), GONE.into()],
        clock: SystemTime::UNIX_EPOCH,
    };
    let lost_gone = || vec![Fault::Lost("NVML no longer enumerates it".into())];

    // No fault file: both GPUs clean; a known GPU NVML does not enumerate is lost.
    assert_eq!(c.check(), vec![vec![], vec![], lost_gone()]);
    assert_eq!(c.severity(GONE), Some(Severity::Fatal));
    c.known.pop();

    // An application XID: one event, ignored by the default policy.
    inject(&faults, &[(GPU0, &["xid 13"])]);
    assert_eq!(c.check(), vec![vec![Fault::Xid(13)], vec![]]);
    assert_eq!(c.severity(GPU0), None, "XID 13 is on the ignore list");
    // Events are one-shot: still listed, not raised again.
    assert_eq!(c.check(), vec![vec![], vec![]]);

    // A fatal XID on GPU-1: one event; then two clean checks bring it back.
    inject(&faults, &[(GPU0, &["xid 13"]), (GPU1, &["xid 48"])]);
    assert_eq!(c.check(), vec![vec![], vec![Fault::Xid(48)]]);
    assert_eq!(c.severity(GPU1), Some(Severity::Fatal));
    assert_eq!(c.check(), vec![vec![], vec![]]);
    assert_eq!(
        c.severity(GPU1),
        Some(Severity::Fatal),
        "1 clean check of 2"
    );
    c.check();
    assert_eq!(c.severity(GPU1), None, "recovered after 2 clean checks");

    // XID 79, fallen off the bus: the event, then GPU_IS_LOST at every probe while listed.
    inject(&faults, &[(GPU1, &["xid 79"])]);
    let lost = Fault::Lost("NVML reports GPU_IS_LOST".into());
    assert_eq!(c.check(), vec![vec![], vec![Fault::Xid(79), lost.clone()]]);
    for _ in 0..3 {
        assert_eq!(c.check(), vec![vec![], vec![lost.clone()]]);
    }
    assert_eq!(c.severity(GPU1), Some(Severity::Fatal));

    // Cleared: recovery after the policy's clean checks, not before.
    inject(&faults, &[]);
    c.check();
    assert_eq!(c.severity(GPU1), Some(Severity::Fatal));
    assert_eq!(c.check(), vec![vec![], vec![]]);
    assert_eq!(c.severity(GPU1), None);

    // Double-bit ECC: the event and the volatile counter; the counter stays while listed.
    inject(&faults, &[(GPU0, &["ecc"])]);
    assert_eq!(
        c.check(),
        vec![vec![Fault::DoubleBitEcc, Fault::DoubleBitEcc], vec![]]
    );
    assert_eq!(c.check(), vec![vec![Fault::DoubleBitEcc], vec![]]);
    assert_eq!(c.severity(GPU0), Some(Severity::Fatal));

    // Retired pages and a temperature at the shutdown margin degrade; a cool GPU does not.
    inject(
        &faults,
        &[
            (GPU0, &["retired-pages", "temperature 60"]),
            (GPU1, &["temperature 91"]),
        ],
    );
    let found = c.check();
    assert_eq!(found[0], vec![Fault::RetiredPagesPending]);
    assert!(
        matches!(
            found[1].as_slice(),
            [Fault::Temperature {
                celsius: 91,
                shutdown: 95
            }]
        ),
        "{found:?}"
    );
    assert_eq!(c.severity(GPU1), Some(Severity::Degraded));

    // A fault file that cannot be read fails closed: every GPU's probe fails.
    std::fs::write(&faults, "{\"gpus\": {\"GPU-x\": [\"melted\"]}}").unwrap();
    for f in c.check() {
        assert!(
            matches!(f.as_slice(), [Fault::Probe(m)] if m.starts_with("nvmlDeviceGetMemoryInfo")),
            "{f:?}"
        );
    }

    // Gone: clean again, and healthy after the recovery window.
    std::fs::remove_file(&faults).unwrap();
    assert_eq!(c.check(), vec![vec![], vec![]]);
    c.check();
    assert_eq!((c.severity(GPU0), c.severity(GPU1)), (None, None));
    std::fs::remove_dir_all(&dir).unwrap();
}
