//! `fgpu-fake-smi`: what the fake NVML reports, one line per fact (tests and debugging).
//!
//! Calls the fake's NVML code linked in as an rlib (the same code `libnvidia-ml.so.1`
//! exports), so it reads the `FAKE_CUDA_STATE` files the workloads write and honours
//! `FAKE_CUDA_NVML_HOST` / `FAKE_CUDA_NVML_PID_OFFSET` like any NVML reader:
//!
//! ```text
//! gpu=<index> uuid=<GPU-…> pid=<pid> used_mib=<MiB>    every running compute process
//! gpu=<index> uuid=<GPU-…> pid=<pid> sm=<percent>      every utilisation sample (last second)
//! ```
//! Exit 1 when an NVML call fails (other than "no samples").

use std::ffi::{c_char, c_uint};

use fgpu_fake_cuda as cu;

fn check(what: &str, r: i32) {
    if r != 0 {
        eprintln!("fgpu-fake-smi: {what} failed: NVML error {r}");
        std::process::exit(1);
    }
}

fn main() {
    // SAFETY: direct calls into the linked-in fake NVML; every pointer is to a local
    // buffer of the size passed.
    unsafe {
        check("nvmlInit_v2", cu::nvmlInit_v2());
        let mut n: c_uint = 0;
        check("nvmlDeviceGetCount_v2", cu::nvmlDeviceGetCount_v2(&mut n));
        for i in 0..n {
            let mut h: *const u8 = std::ptr::null();
            check(
                "nvmlDeviceGetHandleByIndex_v2",
                cu::nvmlDeviceGetHandleByIndex_v2(i, &mut h),
            );
            let mut buf = [0 as c_char; 96];
            check(
                "nvmlDeviceGetUUID",
                cu::nvmlDeviceGetUUID(h, buf.as_mut_ptr(), buf.len() as c_uint),
            );
            let uuid = std::ffi::CStr::from_ptr(buf.as_ptr()).to_string_lossy();
            let mut count: c_uint = 64;
            let mut infos = vec![std::mem::zeroed::<cu::procs::ProcessInfoV2>(); 64];
            check(
                "nvmlDeviceGetComputeRunningProcesses_v3",
                cu::nvmlDeviceGetComputeRunningProcesses_v3(h, &mut count, infos.as_mut_ptr()),
            );
            for p in &infos[..count as usize] {
                let used = if p.used_gpu_memory == cu::procs::VALUE_NOT_AVAILABLE {
                    "n/a".to_owned()
                } else {
                    (p.used_gpu_memory >> 20).to_string()
                };
                println!("gpu={i} uuid={uuid} pid={} used_mib={used}", p.pid);
            }
            let mut count: c_uint = 64;
            let mut samples: Vec<cu::NvmlProcessUtilizationSample> =
                (0..64).map(|_| std::mem::zeroed()).collect();
            let r = cu::nvmlDeviceGetProcessUtilization(h, samples.as_mut_ptr(), &mut count, 0);
            if r == 6 {
                continue; // NVML_ERROR_NOT_FOUND: nobody ran in the last second
            }
            check("nvmlDeviceGetProcessUtilization", r);
            for s in &samples[..count as usize] {
                println!("gpu={i} uuid={uuid} pid={} sm={}", s.pid, s.sm_util);
            }
        }
    }
}
