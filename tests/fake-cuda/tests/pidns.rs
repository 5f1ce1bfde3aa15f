//! Two real PID namespaces (`unshare -p -f --mount-proc`, run as root): processes in new
//! namespaces allocate and launch through the fake driver (`fgpu-bypass`), and a reader in
//! this namespace sees them through the fake NVML (`fgpu-fake-smi`): with
//! `FAKE_CUDA_NVML_HOST=1` by their PIDs here, with their memory and utilisation; without
//! it by their own PIDs + the offset, as before. Dead processes drop out of both views.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fgpu_fake_cuda::{pidns, procs};

const BYPASS: &str = env!("CARGO_BIN_EXE_fgpu-bypass");
const SMI: &str = env!("CARGO_BIN_EXE_fgpu-fake-smi");
const UUID1: &str = "GPU-e2e00000-0000-4000-8000-0000000000b1";

fn state(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fgpu-pidns-it-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d.join("gpu")
}

fn fake_env(cmd: &mut Command, state: &Path) {
    cmd.env("FAKE_CUDA_STATE", state)
        .env(
            "FAKE_CUDA_UUIDS",
            format!("GPU-e2e00000-0000-4000-8000-0000000000b0,{UUID1}"),
        )
        .env("FAKE_CUDA_MEMORY", "16Gi")
        .env("FAKE_CUDA_BLOCK_NS", "100000")
        .env_remove("FAKE_CUDA_NVML_HOST")
        .env_remove("FAKE_CUDA_NVML_PID_OFFSET")
        .env_remove("FAKE_CUDA_GPUS")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("LD_PRELOAD");
}

struct Proc {
    child: Child,
    /// The bypass's PID in this namespace.
    pid: u32,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGKILL of the bypass; in a new namespace, unshare then reaps it and exits, so
        // once `wait` returns the bypass is gone (its liveness lock with it).
        // SAFETY: kill has no memory preconditions; a PID this test started.
        unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Starts `fgpu-bypass ARGS` (in a new PID namespace when `new_ns`) and waits for its
/// allocation line.
fn start(state: &Path, new_ns: bool, args: &[&str], mib: u64) -> Proc {
    let mut cmd = if new_ns {
        let mut c = Command::new("unshare");
        c.args(["-p", "-f", "--mount-proc", BYPASS]);
        c
    } else {
        Command::new(BYPASS)
    };
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    fake_env(&mut cmd, state);
    let mut child = cmd.spawn().expect("spawn (unshare needs root)");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), format!("bypass_allocated_mib={mib}"));
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("bypass_mem_total_mib=16384 "), "{line}");
    let pid = if new_ns {
        // unshare forked the bypass: its only child.
        let kids =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", child.id())).unwrap();
        let kids: Vec<u32> = kids
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(kids.len(), 1, "{kids:?}");
        kids[0]
    } else {
        child.id()
    };
    Proc { child, pid }
}

/// `NSpid:` of a process, as this namespace's /proc shows it.
fn nspid(pid: u32) -> Vec<u32> {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    st.lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

fn smi(state: &Path, env: &[(&str, &str)]) -> Vec<String> {
    let mut cmd = Command::new(SMI);
    fake_env(&mut cmd, state);
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

const HOST: &[(&str, &str)] = &[("FAKE_CUDA_NVML_HOST", "1")];

/// `used_mib` of `pid` on GPU `gpu` in a listing.
fn used(lines: &[String], gpu: u32, pid: u32) -> Vec<String> {
    let pre = format!("gpu={gpu} ");
    let tag = format!(" pid={pid} used_mib=");
    lines
        .iter()
        .filter(|l| l.starts_with(&pre))
        .filter_map(|l| l.split_once(&tag).map(|(_, m)| m.to_owned()))
        .collect()
}

fn sm(lines: &[String], gpu: u32, pid: u32) -> Option<u32> {
    let pre = format!("gpu={gpu} ");
    let tag = format!(" pid={pid} sm=");
    lines
        .iter()
        .filter(|l| l.starts_with(&pre))
        .find_map(|l| l.split_once(&tag).map(|(_, m)| m.parse().unwrap()))
}

#[test]
fn a_host_reader_sees_processes_of_other_pid_namespaces_by_their_host_pids() {
    let st = state("host");
    // Two containers, each one's bypass is PID 1 there; one on GPU 1 by UUID keeps it 30 %
    // busy, the other holds 256 MiB on GPU 1 by index.
    let a = start(
        &st,
        true,
        &[
            "--gpu",
            UUID1,
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
        true,
        &["--gpu", "1", "--alloc-mib", "256", "--hold-s", "60"],
        256,
    );
    // And a process of this namespace.
    let c = start(
        &st,
        false,
        &["--gpu", "0", "--alloc-mib", "512", "--hold-s", "60"],
        512,
    );
    for p in [&a, &b] {
        let ns = nspid(p.pid);
        assert_eq!((ns.len(), ns.last()), (2, Some(&1)), "{ns:?}");
    }
    assert_ne!(a.pid, b.pid);
    // A second of launches for the utilisation window.
    std::thread::sleep(Duration::from_millis(1300));

    let host = smi(&st, HOST);
    assert_eq!(used(&host, 1, a.pid), vec!["768"], "{host:?}");
    assert_eq!(used(&host, 1, b.pid), vec!["256"], "{host:?}");
    assert_eq!(used(&host, 0, c.pid), vec!["512"], "{host:?}");
    // Nobody is listed by a PID of another namespace.
    assert!(used(&host, 1, 1).is_empty(), "{host:?}");
    assert!(used(&host, 1, 400_001).is_empty(), "{host:?}");
    assert!(used(&host, 0, a.pid).is_empty(), "{host:?}");
    let u = sm(&host, 1, a.pid).unwrap_or_else(|| panic!("no sample of {}: {host:?}", a.pid));
    assert!(u.abs_diff(30) <= 3, "sm {u}: {host:?}");
    assert_eq!(sm(&host, 1, b.pid), None, "{host:?}");

    // Without host mode (a container's view): own PIDs + the offset, told apart by
    // namespace; both containers' PID 1 are two PIDs, neither 400001.
    let off = smi(&st, &[]);
    let disguised = |pid: u32| procs::nvml_pid(pidns::key(ns_inode(pid) as u32, 1));
    let (da, db) = (disguised(a.pid), disguised(b.pid));
    assert_ne!(da, db);
    assert_eq!(used(&off, 1, da), vec!["768"], "{off:?}");
    assert_eq!(used(&off, 1, db), vec!["256"], "{off:?}");
    assert!(used(&off, 1, 400_001).is_empty(), "{off:?}");
    let dc = procs::nvml_pid(pidns::key(ns_inode(std::process::id()) as u32, c.pid));
    assert_eq!(used(&off, 0, dc), vec!["512"], "{off:?}");
    let raw = smi(&st, &[("FAKE_CUDA_NVML_PID_OFFSET", "0")]);
    let mut ones = used(&raw, 1, 1);
    ones.sort();
    assert_eq!(ones, vec!["256", "768"], "{raw:?}");
    assert!(
        sm(&raw, 1, 1).is_some_and(|u| u.abs_diff(30) <= 3),
        "{raw:?}"
    );

    // Container A's process dies: gone from both views, though this namespace has a PID 1
    // (liveness of another namespace's slot is its lock, not kill(1, 0) here).
    let a_pid = a.pid;
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let host = smi(&st, HOST);
        let off = smi(&st, &[]);
        if used(&host, 1, a_pid).is_empty() && used(&off, 1, da).is_empty() {
            assert_eq!(used(&host, 1, b.pid), vec!["256"], "{host:?}");
            assert_eq!(sm(&host, 1, a_pid), None, "{host:?}");
            assert_eq!(used(&off, 1, db), vec!["256"], "{off:?}");
            break;
        }
        assert!(Instant::now() < deadline, "still listed: {host:?} {off:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop((b, c));
    let _ = std::fs::remove_dir_all(st.parent().unwrap());
}

/// The key a slot of `$FAKE_CUDA_STATE.procs` holds (16 GPU rows x 64 slots of
/// `{key: u64, used: u64}`). Row = the GPU's index in `$FAKE_CUDA_STATE.gpus`: every
/// process here lists the same two UUIDs and claims them in that order, so row = device.
fn slot_key(state: &Path, dev: usize, slot: usize) -> u64 {
    let procs = std::fs::read(format!("{}.procs", state.display())).unwrap();
    let off = (dev * 64 + slot) * 16;
    u64::from_ne_bytes(procs[off..off + 8].try_into().unwrap())
}

fn ns_inode(pid: u32) -> u64 {
    let l = std::fs::read_link(format!("/proc/{pid}/ns/pid")).unwrap();
    let l = l.to_str().unwrap();
    l["pid:[".len()..l.len() - 1].parse().unwrap()
}

#[test]
fn a_dead_containers_slot_is_reused_by_the_next_container_process() {
    let st = state("reuse");
    let a = start(
        &st,
        true,
        &["--gpu", "0", "--alloc-mib", "256", "--hold-s", "60"],
        256,
    );
    assert_eq!(slot_key(&st, 0, 0), ns_inode(a.pid) << 32 | 1);
    let a_pid = a.pid;
    drop(a);
    // The next one is PID 1 of another namespace: it judges A's slot by A's liveness
    // lock (A is dead), not by its own PID 1 (itself), and takes it.
    let b = start(
        &st,
        true,
        &["--gpu", "0", "--alloc-mib", "512", "--hold-s", "60"],
        512,
    );
    assert_eq!(slot_key(&st, 0, 0), ns_inode(b.pid) << 32 | 1);
    assert_eq!(slot_key(&st, 0, 1), 0);
    // A live container's slot is not taken: C gets the next one.
    let c = start(
        &st,
        true,
        &["--gpu", "0", "--alloc-mib", "256", "--hold-s", "60"],
        256,
    );
    assert_eq!(slot_key(&st, 0, 0), ns_inode(b.pid) << 32 | 1);
    assert_eq!(slot_key(&st, 0, 1), ns_inode(c.pid) << 32 | 1);
    let host = smi(&st, HOST);
    assert!(used(&host, 0, a_pid).is_empty(), "{host:?}");
    assert_eq!(used(&host, 0, b.pid), vec!["512"], "{host:?}");
    assert_eq!(used(&host, 0, c.pid), vec!["256"], "{host:?}");
    drop((b, c));
    let _ = std::fs::remove_dir_all(st.parent().unwrap());
}

#[test]
fn a_container_process_that_closes_the_fakes_descriptors_stays_listed() {
    let st = state("closefds");
    // It drops its liveness lock with its descriptors: this namespace still sees it in
    // /proc, so neither view loses it (a bypass must not hide from the monitor that way).
    let a = start(
        &st,
        true,
        &[
            "--gpu",
            "0",
            "--alloc-mib",
            "256",
            "--hold-s",
            "60",
            "--close-fds",
        ],
        256,
    );
    let fds = std::fs::read_dir(format!("/proc/{}/fd", a.pid))
        .unwrap()
        .count();
    assert!(fds <= 3, "{fds} descriptors open");
    let host = smi(&st, HOST);
    assert_eq!(used(&host, 0, a.pid), vec!["256"], "{host:?}");
    let off = smi(&st, &[]);
    let da = procs::nvml_pid(pidns::key(ns_inode(a.pid) as u32, 1));
    assert_eq!(used(&off, 0, da), vec!["256"], "{off:?}");
    let a_pid = a.pid;
    drop(a);
    let host = smi(&st, HOST);
    assert!(used(&host, 0, a_pid).is_empty(), "{host:?}");
    assert!(used(&smi(&st, &[]), 0, da).is_empty());
    let _ = std::fs::remove_dir_all(st.parent().unwrap());
}
