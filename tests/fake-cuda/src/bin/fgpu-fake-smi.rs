//! `fgpu-fake-smi`: what the fake NVML reports, one line per fact (tests and debugging).
//!
//! Calls the fake's NVML code linked in as an rlib (the same code `libnvidia-ml.so.1`
//! exports), so it reads the `FAKE_CUDA_STATE` files the workloads write and honours
//! `FAKE_CUDA_NVML_HOST` / `FAKE_CUDA_NVML_PID_OFFSET` like any NVML reader:
//!
//! ```text
//! gpu=<index> uuid=<GPU-…> pid=<pid> used_mib=<MiB>    every running compute process
//! gpu=<index> uuid=<GPU-…> util=<percent>             the device's utilisation (last second)
//! gpu=<index> uuid=<GPU-…> pid=<pid> sm=<percent>      every utilisation sample (last second)
//! ```
//! Exit 1 when an NVML call fails (other than "no samples").
//!
//! Driver-native limits (`nvmlDeviceSetMemoryLimits_v1` / `nvmlDeviceGetMemoryLimits_v1`;
//! need `FAKE_CUDA_MEMORY_LIMITS=1`):
//!
//! ```text
//! fgpu-fake-smi set-limit <gpu index> <cgroup> <soft bytes> <hard bytes>
//! fgpu-fake-smi get-limit <gpu index> <cgroup>   → soft=<b> hard=<b> current_used=<b>
//! ```
//! Exit status: the NVML return code (0 = success; 3 = not supported), 100 on bad usage.

use std::ffi::{c_char, c_uint};

use fgpu_fake_cuda as cu;

fn check(what: &str, r: i32) {
    if r != 0 {
        eprintln!("fgpu-fake-smi: {what} failed: NVML error {r}");
        std::process::exit(1);
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: fgpu-fake-smi [set-limit <gpu> <cgroup> <soft> <hard> | get-limit <gpu> <cgroup>]"
    );
    std::process::exit(100)
}

/// `set-limit` / `get-limit`: the NVML status as the exit code.
fn limits(args: &[String]) -> ! {
    let num = |s: &String| s.parse::<u64>().unwrap_or_else(|_| usage());
    let (cmd, gpu, cg) = match args {
        [cmd, gpu, cg, ..] => (cmd.as_str(), num(gpu) as c_uint, cg),
        _ => usage(),
    };
    let cg = std::ffi::CString::new(cg.as_str()).unwrap_or_else(|_| usage());
    // SAFETY: direct calls into the linked-in fake NVML with valid pointers to locals.
    let r = unsafe {
        check("nvmlInit_v2", cu::nvmlInit_v2());
        let mut h: *const u8 = std::ptr::null();
        check(
            "nvmlDeviceGetHandleByIndex_v2",
            cu::nvmlDeviceGetHandleByIndex_v2(gpu, &mut h),
        );
        match (cmd, args.len()) {
            ("set-limit", 5) => {
                let l = cu::NvmlSetMemoryLimits {
                    name_space: cg.as_ptr(),
                    soft_limit: num(&args[3]),
                    hard_limit: num(&args[4]),
                };
                cu::nvmlDeviceSetMemoryLimits_v1(h, &l)
            }
            ("get-limit", 3) => {
                let mut l = cu::NvmlGetMemoryLimits {
                    name_space: cg.as_ptr(),
                    soft_limit: 0,
                    hard_limit: 0,
                    current_used: 0,
                };
                let r = cu::nvmlDeviceGetMemoryLimits_v1(h, &mut l);
                if r == 0 {
                    println!(
                        "soft={} hard={} current_used={}",
                        l.soft_limit, l.hard_limit, l.current_used
                    );
                }
                r
            }
            _ => usage(),
        }
    };
    if r != 0 {
        eprintln!("fgpu-fake-smi: {cmd}: NVML error {r}");
    }
    std::process::exit(r)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.is_empty() {
        limits(&args);
    }
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
            let mut util: cu::NvmlUtilization = std::mem::zeroed();
            check(
                "nvmlDeviceGetUtilizationRates",
                cu::nvmlDeviceGetUtilizationRates(h, &mut util),
            );
            println!("gpu={i} uuid={uuid} util={}", util.gpu);
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
