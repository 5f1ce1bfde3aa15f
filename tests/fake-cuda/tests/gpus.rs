//! The shared tables are keyed by GPU UUID (`$FAKE_CUDA_STATE.gpus`): processes whose
//! `FAKE_CUDA_UUIDS` list different GPUs, or the same GPUs in another order (containers
//! of different claims on one node), each use their device 0, and a host-side reader
//! with the node's full list sees each on the GPU it really is.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fgpu_fake_cuda::{pidns, procs};

const BYPASS: &str = env!("CARGO_BIN_EXE_fgpu-bypass");
const SMI: &str = env!("CARGO_BIN_EXE_fgpu-fake-smi");

fn uuid(i: u32) -> String {
    format!("GPU-5eed0000-0000-4000-8000-0000000000{i:02x}")
}

fn state(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fgpu-gpus-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d.join("gpu")
}

fn fake_env(cmd: &mut Command, state: &Path, uuids: &str) {
    cmd.env("FAKE_CUDA_STATE", state)
        .env("FAKE_CUDA_UUIDS", uuids)
        .env("FAKE_CUDA_MEMORY", "16Gi")
        .env("FAKE_CUDA_BLOCK_NS", "100000")
        .env_remove("FAKE_CUDA_NVML_HOST")
        .env_remove("FAKE_CUDA_NVML_PID_OFFSET")
        .env_remove("FAKE_CUDA_MEMORY_LIMITS")
        .env_remove("FAKE_CUDA_GPUS")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("LD_PRELOAD");
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `fgpu-bypass ARGS` with `FAKE_CUDA_UUIDS=uuids`, once it has allocated `mib`.
fn start(state: &Path, uuids: &str, args: &[&str], mib: u64) -> Proc {
    let mut cmd = Command::new(BYPASS);
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    fake_env(&mut cmd, state, uuids);
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("bypass_allocated_mib={mib}"));
    Proc(child)
}

/// `fgpu-fake-smi` with `FAKE_CUDA_UUIDS=uuids` (and `env`): (stdout lines, stderr).
fn smi(state: &Path, uuids: &str, env: &[(&str, &str)], args: &[&str]) -> (Vec<String>, String) {
    let mut cmd = Command::new(SMI);
    fake_env(&mut cmd, state, uuids);
    cmd.envs(env.iter().copied()).args(args);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

const HOST: &[(&str, &str)] = &[("FAKE_CUDA_NVML_HOST", "1")];

/// The values after `tag` (e.g. " pid=7 used_mib=") on lines of GPU `gpu` with `uuid`.
fn field(lines: &[String], gpu: u32, uuid: &str, tag: &str) -> Vec<String> {
    let pre = format!("gpu={gpu} uuid={uuid}");
    lines
        .iter()
        .filter(|l| l.starts_with(&pre))
        .filter_map(|l| l[pre.len()..].strip_prefix(tag).map(str::to_owned))
        .collect()
}

fn used(lines: &[String], gpu: u32, uuid: &str, pid: u32) -> Vec<String> {
    field(lines, gpu, uuid, &format!(" pid={pid} used_mib="))
}

fn sm(lines: &[String], gpu: u32, uuid: &str, pid: u32) -> Option<u32> {
    field(lines, gpu, uuid, &format!(" pid={pid} sm="))
        .first()
        .map(|v| v.parse().unwrap())
}

fn util(lines: &[String], gpu: u32, uuid: &str) -> u32 {
    field(lines, gpu, uuid, " util=")[0].parse().unwrap()
}

#[test]
fn processes_listing_gpus_in_other_orders_share_one_state_by_uuid() {
    let st = state("order");
    let (g0, g1) = (uuid(0), uuid(1));
    // A's claim lists GPU-1 first, B's only GPU-0: both work on their device 0.
    let a = start(
        &st,
        &format!("{g1},{g0}"),
        &[
            "--gpu",
            "0",
            "--alloc-mib",
            "768",
            "--busy",
            "30",
            "--hold-s",
            "60",
        ],
        768,
    );
    let b = start(
        &st,
        &g0,
        &[
            "--gpu",
            "0",
            "--alloc-mib",
            "256",
            "--busy",
            "10",
            "--hold-s",
            "60",
        ],
        256,
    );
    let (pa, pb) = (a.0.id(), b.0.id());
    // A second of launches for the utilisation window.
    std::thread::sleep(Duration::from_millis(1300));

    // The node monitor: the node's GPUs in node order.
    let (host, err) = smi(&st, &format!("{g0},{g1}"), HOST, &[]);
    assert!(err.is_empty(), "{err}");
    assert_eq!(used(&host, 0, &g0, pb), vec!["256"], "{host:?}");
    assert_eq!(used(&host, 1, &g1, pa), vec!["768"], "{host:?}");
    assert!(used(&host, 0, &g0, pa).is_empty(), "{host:?}");
    assert!(used(&host, 1, &g1, pb).is_empty(), "{host:?}");
    let ua = sm(&host, 1, &g1, pa).unwrap_or_else(|| panic!("no sample of A: {host:?}"));
    let ub = sm(&host, 0, &g0, pb).unwrap_or_else(|| panic!("no sample of B: {host:?}"));
    assert!(ua.abs_diff(30) <= 3, "A's sm {ua}: {host:?}");
    assert!(ub.abs_diff(10) <= 3, "B's sm {ub}: {host:?}");
    assert_eq!(sm(&host, 0, &g0, pa), None, "{host:?}");
    assert_eq!(sm(&host, 1, &g1, pb), None, "{host:?}");
    // Device utilisation: each GPU carries only its own process's work.
    let (d0, d1) = (util(&host, 0, &g0), util(&host, 1, &g1));
    assert!(d0.abs_diff(10) <= 3, "GPU-0 util {d0}: {host:?}");
    assert!(d1.abs_diff(30) <= 3, "GPU-1 util {d1}: {host:?}");

    // A reader listing the GPUs the other way round sees the same processes on them.
    let (rev, _) = smi(&st, &format!("{g1},{g0}"), HOST, &[]);
    assert_eq!(used(&rev, 0, &g1, pa), vec!["768"], "{rev:?}");
    assert_eq!(used(&rev, 1, &g0, pb), vec!["256"], "{rev:?}");
    assert!(used(&rev, 0, &g1, pb).is_empty(), "{rev:?}");

    // B's own container view (GPU-0 only, offset PIDs): B and not A.
    let (mine, _) = smi(&st, &g0, &[], &[]);
    let disguised = |pid: u32| procs::nvml_pid(pidns::key(pidns::own_ns(), pid));
    assert_eq!(used(&mine, 0, &g0, disguised(pb)), vec!["256"], "{mine:?}");
    assert!(used(&mine, 0, &g0, disguised(pa)).is_empty(), "{mine:?}");
    assert!(mine.iter().all(|l| !l.starts_with("gpu=1 ")), "{mine:?}");

    drop((a, b));
    let _ = std::fs::remove_dir_all(st.parent().unwrap());
}

#[test]
fn driver_native_limits_follow_the_gpu_not_the_ordinal() {
    let st = state("limits");
    let (g0, g1) = (uuid(0), uuid(1));
    let knob = [("FAKE_CUDA_MEMORY_LIMITS", "1")];
    // The node's hook sets a limit on the node's GPU 1 (GPU-1) for a cgroup.
    let cg = "/sys/fs/cgroup";
    let (out, _) = smi(
        &st,
        &format!("{g0},{g1}"),
        &knob,
        &["set-limit", "1", cg, "0", "1073741824"],
    );
    assert!(out.is_empty(), "{out:?}");
    // A container of a claim on GPU-1 sees it on its device 0 ...
    let (got, _) = smi(&st, &g1, &knob, &["get-limit", "0", cg]);
    assert_eq!(got, vec![format!("soft=0 hard=1073741824 current_used=0")]);
    // ... one on GPU-0 does not.
    let (other, _) = smi(&st, &g0, &knob, &["get-limit", "0", cg]);
    assert_eq!(
        other,
        vec![format!("soft=0 hard={} current_used=0", u64::MAX)]
    );
    let _ = std::fs::remove_dir_all(st.parent().unwrap());
}

#[test]
fn a_full_directory_or_another_layout_leaves_the_process_private_and_says_so() {
    let st = state("full");
    // A node of 16 GPUs fills the directory.
    let all: Vec<String> = (0..16).map(uuid).collect();
    let (lines, err) = smi(&st, &all.join(","), HOST, &[]);
    assert!(err.is_empty(), "{err}");
    assert_eq!(field(&lines, 15, &uuid(15), " util="), vec!["0"]);
    // A 17th GPU: the process works on private tables and says so once.
    let mut cmd = Command::new(BYPASS);
    fake_env(&mut cmd, &st, &uuid(16));
    let out = cmd
        .args(["--gpu", "0", "--alloc-mib", "512", "--hold-s", "0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("bypass_allocated_mib=512"),
        "{out:?}"
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.matches("is full").count(), 1, "{err}");
    assert!(err.contains("private"), "{err}");

    // A directory of another layout: the same, with its reason.
    let other = state("layout");
    std::fs::write(format!("{}.gpus", other.display()), [0xffu8; 8]).unwrap();
    let (_, err) = smi(&other, &uuid(0), &[], &[]);
    assert!(err.contains("another layout"), "{err}");
    let _ = std::fs::remove_dir_all(st.parent().unwrap());
    let _ = std::fs::remove_dir_all(other.parent().unwrap());
}
