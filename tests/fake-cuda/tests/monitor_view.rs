//! The node monitor's view of the fake: `fgpu_driver`'s fake backend reading this very
//! library (`libfgpu_fake_cuda.so`, through `nvml-wrapper`, as the kubelet plugin does with
//! `--fake-nvml-library`) in host mode, while `fgpu-bypass` holds memory and keeps the GPU
//! busy in another process sharing the state file.
//!
//! One test in this file: it sets the reader's environment before the library is loaded.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fgpu_driver::backend::nvml::NvmlUsage;
use fgpu_driver::backend::{DeviceBackend, FakeBackend};

mod common;
use common::library;

const UUIDS: [&str; 2] = [
    "GPU-e2e00000-0000-4000-8000-000000000000",
    "GPU-e2e00000-0000-4000-8000-000000000001",
];

#[test]
fn the_fake_backend_sees_a_bypassing_process_with_its_memory_and_utilisation() {
    let dir = tempfile_dir();
    let state = dir.join("gpu");
    let profile = dir.join("profile.yaml");
    std::fs::write(
        &profile,
        format!(
            "nodes:\n  - name: n\n    gpus:\n{}",
            UUIDS
                .iter()
                .map(|u| format!("      - {{uuid: {u}, productName: NVIDIA H100 80GB HBM3, memory: 80Gi, smCount: 132, computeCapability: \"9.0\"}}\n"))
                .collect::<String>()
        ),
    )
    .unwrap();
    // The process the monitor must see: on the node's GPU-0, 768 MiB, 40 % busy.
    let mut child = Command::new(env!("CARGO_BIN_EXE_fgpu-bypass"))
        .args([
            "--gpu",
            "0",
            "--alloc-mib",
            "768",
            "--busy",
            "40",
            "--hold-s",
            "30",
        ])
        .env("FAKE_CUDA_STATE", &state)
        .env("FAKE_CUDA_UUIDS", UUIDS.join(","))
        .env("FAKE_CUDA_BLOCK_NS", "10000")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "bypass_allocated_mib=768");

    // SAFETY: the only test of this binary, before anything reads the environment on
    // another thread (the library is loaded below, after these writes).
    unsafe {
        std::env::set_var("FAKE_CUDA_STATE", &state);
        std::env::set_var("FAKE_CUDA_NVML_HOST", "1");
        std::env::set_var("FAKE_CUDA_UUIDS", UUIDS.join(","));
    }
    let backend = FakeBackend::open(&profile, None)
        .unwrap()
        .with_usage_reader(std::sync::Arc::new(NvmlUsage::load(&library()).unwrap()));
    std::thread::sleep(Duration::from_millis(1500));
    let deadline = Instant::now() + Duration::from_secs(10);
    let since = |d: Duration| {
        (std::time::SystemTime::now() - d)
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };
    let (gpus, p) = loop {
        let gpus = backend.usage(since(Duration::from_secs(1))).unwrap();
        if let Some(p) = gpus[0]
            .processes
            .iter()
            .find(|p| p.pid == child.id())
            .cloned()
            && p.sm_percent.is_some()
        {
            break (gpus, p);
        }
        assert!(
            Instant::now() < deadline,
            "the bypass process never showed: {gpus:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].uuid, UUIDS[0]);
    assert!(gpus.iter().all(|g| g.error.is_none()), "{gpus:?}");
    assert_eq!(
        p.used_memory,
        Some(768 << 20),
        "host PID, its memory: {p:?}"
    );
    let sm = p.sm_percent.unwrap();
    assert!(
        (30..=50).contains(&sm),
        "utilisation of a 40 % busy process: {sm}"
    );
    assert!(
        gpus[1].processes.is_empty(),
        "nothing on GPU-1: {:?}",
        gpus[1]
    );

    child.kill().unwrap();
    child.wait().unwrap();
    let gone = backend.usage(0).unwrap();
    assert!(
        gone[0].processes.iter().all(|p| p.pid != child.id()),
        "a dead process drops out: {gone:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("fgpu-monitor-view-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
