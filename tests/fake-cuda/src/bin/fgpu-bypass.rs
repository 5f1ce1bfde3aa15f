//! `fgpu-bypass`: takes device memory from the fake driver **without** any symbol the shim
//! (libfgpu.so, through `LD_PRELOAD` or `/etc/ld.so.preload`) could interpose.
//!
//! The fake driver's code is linked in as an rlib and called directly: no `libcuda.so.1`,
//! no dynamic symbol, no `dlopen`/`dlsym`, no `cuGetProcAddress`. It maps the same
//! `FAKE_CUDA_STATE` files as the library, so the fake NVML lists it (its memory and,
//! with `--busy`, its utilisation) like any other process. It stands for what a static
//! binary or a raw ioctl does on a real node: the node monitor's backstop must catch it.
//!
//! ```text
//! fgpu-bypass --gpu <index|UUID> --alloc-mib N [--hold-s S] [--busy PERCENT] [--close-fds]
//! ```
//! Creates a context on the GPU (an index is a CUDA ordinal, after `CUDA_VISIBLE_DEVICES`;
//! a UUID is matched against `cuDeviceGetUuid`), allocates N MiB in steps of 256 MiB,
//! prints `bypass_allocated_mib=<n>`, then `bypass_mem_total_mib=<t> bypass_mem_free_mib=<f>`
//! (`cuMemGetInfo` after allocating), and holds it S seconds (default: until killed).
//! `--busy P` keeps the GPU P % busy meanwhile (one kernel per 10 ms; needs
//! `FAKE_CUDA_BLOCK_NS`). `--close-fds` closes every descriptor above 2 once the memory is
//! taken and before the report, as a hostile program may (the fake's own included). Exit 1 when not all of N could be allocated (after printing
//! what was), 2 on bad usage. `FAKE_CUDA_UUIDS`, `FAKE_CUDA_MEMORY`, `FAKE_CUDA_GPUS`
//! and the fake's other variables apply as in the library.

use std::ffi::{c_int, c_void};
use std::io::Write;
use std::time::{Duration, Instant};

use fgpu_fake_cuda as cu;

const STEP: u64 = 256 << 20;
const PERIOD: Duration = Duration::from_millis(10);

struct Args {
    gpu: String,
    alloc_mib: u64,
    hold: Option<Duration>,
    busy: u32,
    close_fds: bool,
}

fn usage(msg: &str) -> ! {
    eprintln!("fgpu-bypass: {msg}");
    eprintln!(
        "usage: fgpu-bypass --gpu <index|UUID> --alloc-mib N [--hold-s S] [--busy PERCENT] [--close-fds]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        gpu: String::new(),
        alloc_mib: 0,
        hold: None,
        busy: 0,
        close_fds: false,
    };
    let mut seen_alloc = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--gpu" => a.gpu = val(),
            "--alloc-mib" => {
                a.alloc_mib = val()
                    .parse()
                    .unwrap_or_else(|_| usage("--alloc-mib: a number of MiB"));
                seen_alloc = true;
            }
            "--hold-s" => {
                let s: f64 = val()
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .unwrap_or_else(|| usage("--hold-s: seconds"));
                a.hold = Some(Duration::from_secs_f64(s));
            }
            "--busy" => {
                a.busy = val()
                    .parse()
                    .ok()
                    .filter(|p| *p <= 100)
                    .unwrap_or_else(|| usage("--busy: a percentage 0..100"));
            }
            "--close-fds" => a.close_fds = true,
            "-h" | "--help" => usage("help"),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if a.gpu.is_empty() || !seen_alloc {
        usage("--gpu and --alloc-mib are required");
    }
    a
}

fn check(what: &str, r: cu::CUresult) {
    if r != cu::CUDA_SUCCESS {
        eprintln!("fgpu-bypass: {what} failed: CUDA error {r}");
        std::process::exit(1);
    }
}

/// The CUDA ordinal of `--gpu`: a number, or the device whose UUID it names.
fn ordinal(gpu: &str) -> c_int {
    let mut n: c_int = 0;
    // SAFETY: a valid out-pointer; direct call into the linked-in fake driver.
    check("cuDeviceGetCount", unsafe { cu::cuDeviceGetCount(&mut n) });
    if let Ok(i) = gpu.parse::<c_int>() {
        if i < 0 || i >= n {
            usage(&format!("--gpu {i}: {n} device(s) visible"));
        }
        return i;
    }
    for i in 0..n {
        let mut u = [0u8; 16];
        // SAFETY: a valid 16-byte out-buffer; i < count.
        check("cuDeviceGetUuid", unsafe { cu::cuDeviceGetUuid(&mut u, i) });
        if cu::uuid_string(&u).eq_ignore_ascii_case(gpu.trim()) {
            return i;
        }
    }
    usage(&format!("--gpu {gpu}: no visible device has this UUID"))
}

fn block_ns() -> u64 {
    std::env::var("FAKE_CUDA_BLOCK_NS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let args = parse_args();
    // SAFETY: direct calls into the linked-in fake driver with valid arguments; every
    // out-pointer is a local.
    unsafe {
        check("cuInit", cu::cuInit(0));
        let dev = ordinal(&args.gpu);
        let mut ctx = 0usize;
        check("cuCtxCreate", cu::pools::cuCtxCreate_v2(&mut ctx, 0, dev));
        let want = args.alloc_mib << 20;
        let mut got = 0u64;
        let mut ptrs = Vec::new();
        let mut err = cu::CUDA_SUCCESS;
        while got < want {
            let n = (want - got).min(STEP);
            let mut p: cu::CUdeviceptr = 0;
            err = cu::cuMemAlloc_v2(&mut p, n as usize);
            if err != cu::CUDA_SUCCESS {
                break;
            }
            ptrs.push(p);
            got += n;
        }
        if args.close_fds {
            // Every descriptor above stderr, the fake's state files included (before the
            // report, so a reader of it knows they are closed).
            libc::close_range(3, u32::MAX, 0);
        }
        // (Write errors ignored: a reader that stopped reading must not end the hold.)
        let mut out = std::io::stdout();
        let _ = writeln!(out, "bypass_allocated_mib={}", got >> 20);
        let (mut free, mut total) = (0usize, 0usize);
        check("cuMemGetInfo", cu::cuMemGetInfo_v2(&mut free, &mut total));
        let _ = writeln!(
            out,
            "bypass_mem_total_mib={} bypass_mem_free_mib={}",
            total >> 20,
            free >> 20
        );
        let _ = out.flush();
        if got < want {
            eprintln!(
                "fgpu-bypass: cuMemAlloc failed after {} MiB of {}: CUDA error {err}",
                got >> 20,
                args.alloc_mib
            );
            std::process::exit(1);
        }
        let deadline = args.hold.map(|h| Instant::now() + h);
        let done = || deadline.is_some_and(|d| Instant::now() >= d);
        if args.busy == 0 {
            match deadline {
                Some(d) => std::thread::sleep(d.saturating_duration_since(Instant::now())),
                None => loop {
                    std::thread::sleep(Duration::from_secs(3600));
                },
            }
        } else {
            let bns = block_ns();
            if bns == 0 {
                usage("--busy needs FAKE_CUDA_BLOCK_NS > 0 (the time of one thread block)");
            }
            let mut module = 0usize;
            let mut f = 0usize;
            check(
                "cuModuleLoadData",
                cu::cuModuleLoadData(&mut module, c"bypass".as_ptr() as *const c_void),
            );
            check(
                "cuModuleGetFunction",
                cu::cuModuleGetFunction(&mut f, module, c"spin".as_ptr()),
            );
            let blocks = ((PERIOD.as_nanos() as u64 * u64::from(args.busy) / 100) / bns).max(1);
            let start = Instant::now();
            let mut k = 0u32;
            while !done() {
                check(
                    "cuLaunchKernel",
                    cu::cuLaunchKernel(
                        f,
                        blocks as u32,
                        1,
                        1,
                        1,
                        1,
                        1,
                        0,
                        0,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    ),
                );
                k += 1;
                std::thread::sleep((start + PERIOD * k).saturating_duration_since(Instant::now()));
            }
        }
        for p in ptrs {
            cu::cuMemFree_v2(p);
        }
    }
}
