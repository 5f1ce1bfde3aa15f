//! The kubelet plugin's handle on driver-native memory limits (`fgpu_driver`'s
//! `DriverLimits`, the calls `nvml-wrapper` lacks) against this very library, with the
//! feature advertised (`FAKE_CUDA_MEMORY_LIMITS=1`), on a real cgroup v2 directory (run as
//! root): support detected, a hard limit set and read back, a process of the cgroup
//! refused past it, the limit cleared, errors naming the call.
//!
//! One test in this file: it sets the library's environment before loading it.

use std::process::Command;

use fgpu_driver::backend::BackendError;
use fgpu_driver::backend::limits::DriverLimits;

mod common;
use common::{cgroup2, library};

const UUIDS: [&str; 2] = [
    "GPU-e2e00000-0000-4000-8000-0000000000d0",
    "GPU-e2e00000-0000-4000-8000-0000000000d1",
];
const MIB: u64 = 1 << 20;

#[test]
fn the_plugins_handle_sets_reads_back_and_clears_a_cgroups_limit() {
    let dir = std::env::temp_dir().join(format!("fgpu-driver-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("gpu");
    // SAFETY: set before any other thread reads the environment (the only test here).
    unsafe {
        std::env::set_var("FAKE_CUDA_STATE", &state);
        std::env::set_var("FAKE_CUDA_UUIDS", UUIDS.join(","));
        std::env::set_var("FAKE_CUDA_MEMORY", "16Gi");
        std::env::set_var("FAKE_CUDA_MEMORY_LIMITS", "1");
        std::env::set_var("FAKE_CUDA_NVML_HOST", "1");
    }
    let limits = DriverLimits::open(&library())
        .expect("load the fake NVML")
        .expect("the fake has the memory-limit calls");
    let root = cgroup2();
    assert!(limits.supported(UUIDS[0], &root).unwrap());

    let cg = root.join(format!("fgpu-driver-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir(&cg);
    std::fs::create_dir(&cg).expect("mkdir in cgroup2 (needs root)");
    assert_eq!(limits.get(UUIDS[0], &cg).unwrap(), None);
    limits.set_hard(UUIDS[0], &cg, 256 * MIB).unwrap();
    let l = limits.get(UUIDS[0], &cg).unwrap().expect("a limit");
    assert_eq!((l.soft, l.hard, l.used), (0, 256 * MIB, 0));
    // Only that GPU.
    assert_eq!(limits.get(UUIDS[1], &cg).unwrap(), None);

    // A process of the cgroup that bypasses every shim is refused past it by the driver.
    let out = Command::new("sh")
        .args([
            "-c",
            r#"echo $$ > "$CG/cgroup.procs" && exec "$@""#,
            "sh",
            env!("CARGO_BIN_EXE_fgpu-bypass"),
            "--gpu",
            UUIDS[0],
            "--alloc-mib",
            "512",
        ])
        .env("CG", &cg)
        .env_remove("FAKE_CUDA_NVML_HOST")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("cuMemAlloc failed"), "{text}");

    limits.clear(UUIDS[0], &cg).unwrap();
    assert_eq!(limits.get(UUIDS[0], &cg).unwrap(), None);

    // A GPU the driver does not have: the error names the call.
    let e = limits
        .set_hard("GPU-00000000-0000-0000-0000-00000000dead", &cg, MIB)
        .unwrap_err();
    assert!(
        matches!(
            e,
            BackendError::Nvml {
                call: "nvmlDeviceGetHandleByUUID",
                ..
            }
        ),
        "{e}"
    );
    let _ = std::fs::remove_dir(&cg);
    let _ = std::fs::remove_dir_all(&dir);
}
