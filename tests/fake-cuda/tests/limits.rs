//! Driver-native memory limits on real cgroup v2 directories (run as root, with a
//! writable cgroup2 mount): set, read back, refuse past the limit across the processes
//! of one cgroup, the visible total, clearing, and the knob that hides the feature.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

mod common;
use common::cgroup2;

const BYPASS: &str = env!("CARGO_BIN_EXE_fgpu-bypass");
const SMI: &str = env!("CARGO_BIN_EXE_fgpu-fake-smi");
const MIB: u64 = 1 << 20;

struct Cg(PathBuf);

impl Cg {
    fn new(name: &str) -> Cg {
        let p = cgroup2().join(format!("fgpu-fake-limits-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir(&p);
        std::fs::create_dir(&p).expect("mkdir in cgroup2 (needs root)");
        Cg(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Cg {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

struct Test {
    state: PathBuf,
}

struct Proc {
    child: Child,
    lines: Vec<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Test {
    fn new(name: &str) -> Test {
        let d = std::env::temp_dir().join(format!("fgpu-limits-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Test {
            state: d.join("gpu"),
        }
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("FAKE_CUDA_STATE", &self.state)
            .env("FAKE_CUDA_GPUS", "2")
            .env("FAKE_CUDA_MEMORY", "16Gi")
            .env_remove("FAKE_CUDA_UUIDS")
            .env_remove("FAKE_CUDA_MEMORY_LIMITS")
            .env_remove("FAKE_CUDA_CONTEXT_MEMORY")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("LD_PRELOAD");
    }

    /// `fgpu-fake-smi ARGS` (with `FAKE_CUDA_MEMORY_LIMITS=knob`): (exit code, stdout).
    fn smi(&self, knob: &str, args: &[&str]) -> (i32, String) {
        let mut cmd = Command::new(SMI);
        self.env(&mut cmd);
        cmd.env("FAKE_CUDA_MEMORY_LIMITS", knob).args(args);
        let out = cmd.output().unwrap();
        (
            out.status.code().unwrap(),
            String::from_utf8(out.stdout).unwrap().trim().to_owned(),
        )
    }

    /// `fgpu-bypass --gpu G --alloc-mib N` inside cgroup `cg`: its two output lines.
    fn bypass(&self, cg: &Cg, gpu: &str, mib: u64) -> Proc {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            r#"echo $$ > "$CG/cgroup.procs" && exec "$@""#,
            "sh",
            BYPASS,
        ])
        .args([
            "--gpu",
            gpu,
            "--alloc-mib",
            &mib.to_string(),
            "--hold-s",
            "60",
        ])
        .env("CG", &cg.0)
        .stdout(Stdio::piped());
        self.env(&mut cmd);
        let mut child = cmd.spawn().unwrap();
        let mut r = BufReader::new(child.stdout.take().unwrap());
        let mut lines = Vec::new();
        for _ in 0..2 {
            let mut l = String::new();
            r.read_line(&mut l).unwrap();
            lines.push(l.trim().to_owned());
        }
        Proc { child, lines }
    }
}

impl Drop for Test {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.state.parent().unwrap());
    }
}

fn mem(total: u64, free: u64) -> String {
    format!("bypass_mem_total_mib={total} bypass_mem_free_mib={free}")
}

#[test]
fn a_cgroups_hard_limit_refuses_past_it_and_is_its_visible_total() {
    let t = Test::new("hard");
    let a = Cg::new("a");
    let b = Cg::new("b");
    let gib = (1024 * MIB).to_string();
    // Not advertised: both calls are not supported, nothing is stored.
    assert_eq!(t.smi("0", &["set-limit", "0", a.path(), "0", &gib]).0, 3);
    assert_eq!(t.smi("0", &["get-limit", "0", a.path()]).0, 3);
    assert_eq!(
        t.smi("1", &["get-limit", "0", a.path()]).1,
        format!("soft=0 hard={} current_used=0", u64::MAX)
    );
    // Set 1 GiB hard on GPU 0 for cgroup A (its sysfs path); read back by either name.
    assert_eq!(
        t.smi(
            "1",
            &["set-limit", "0", a.path(), &(256 * MIB).to_string(), &gib]
        ),
        (0, String::new())
    );
    let want = format!("soft={} hard={gib} current_used=0", 256 * MIB);
    assert_eq!(t.smi("1", &["get-limit", "0", a.path()]).1, want);
    let rel = format!("/{}", a.0.file_name().unwrap().to_str().unwrap());
    assert_eq!(t.smi("1", &["get-limit", "0", &rel]).1, want);
    // Bad input: soft above hard, a cgroup that does not exist.
    assert_eq!(
        t.smi(
            "1",
            &["set-limit", "0", a.path(), &(2048 * MIB).to_string(), &gib]
        )
        .0,
        2
    );
    assert_eq!(
        t.smi("1", &["set-limit", "0", "/no/such/fgpu-cgroup", "0", &gib])
            .0,
        6
    );

    // In A: 768 MiB fit and the process sees a 1 GiB GPU.
    let p1 = t.bypass(&a, "0", 768);
    assert_eq!(
        p1.lines,
        ["bypass_allocated_mib=768".to_owned(), mem(1024, 256)]
    );
    assert_eq!(
        t.smi("1", &["get-limit", "0", a.path()]).1,
        format!("soft={} hard={gib} current_used={}", 256 * MIB, 768 * MIB)
    );
    // A second process of A: the cgroup's total counts, 256 MiB fit, the next step does not.
    let mut p2 = t.bypass(&a, "0", 512);
    assert_eq!(
        p2.lines,
        ["bypass_allocated_mib=256".to_owned(), mem(1024, 0)]
    );
    assert_eq!(p2.child.wait().unwrap().code(), Some(1));
    // Cgroup B has no limit; GPU 1 has none for A.
    let p3 = t.bypass(&b, "0", 2048);
    assert_eq!(
        p3.lines,
        ["bypass_allocated_mib=2048".to_owned(), mem(16384, 14336)]
    );
    let p4 = t.bypass(&a, "1", 2048);
    assert_eq!(
        p4.lines,
        ["bypass_allocated_mib=2048".to_owned(), mem(16384, 14336)]
    );
    // A's total on GPU 0 is p1's alone again (p2 is gone).
    assert!(
        t.smi("1", &["get-limit", "0", a.path()])
            .1
            .ends_with(&format!("current_used={}", 768 * MIB))
    );

    // Cleared with hard = 0: A's next process takes 2 GiB and sees the whole GPU.
    assert_eq!(t.smi("1", &["set-limit", "0", a.path(), "0", "0"]).0, 0);
    assert_eq!(
        t.smi("1", &["get-limit", "0", a.path()]).1,
        format!("soft=0 hard={} current_used={}", u64::MAX, 768 * MIB)
    );
    let p5 = t.bypass(&a, "0", 2048);
    assert_eq!(
        p5.lines,
        ["bypass_allocated_mib=2048".to_owned(), mem(16384, 14336)]
    );

    // Set again (below what A holds: later allocations refused, nothing free), then cleared
    // as NVML documents it: soft 0, hard NVML_DEVICE_MEMORY_LIMIT_MAX.
    assert_eq!(t.smi("1", &["set-limit", "0", a.path(), "0", &gib]).0, 0);
    let p6 = t.bypass(&a, "0", 256);
    assert_eq!(
        p6.lines,
        ["bypass_allocated_mib=0".to_owned(), mem(1024, 0)]
    );
    assert_eq!(
        t.smi(
            "1",
            &["set-limit", "0", a.path(), "0", &u64::MAX.to_string()]
        )
        .0,
        0
    );
    let p7 = t.bypass(&a, "0", 256);
    assert_eq!(p7.lines[0], "bypass_allocated_mib=256");
    drop((p1, p2, p3, p4, p5, p6, p7));
    wait_empty(&a.0);
    wait_empty(&b.0);
}

#[test]
fn a_process_in_its_own_cgroup_namespace_is_held_to_its_cgroups_limit() {
    // As in a container: a cgroup namespace rooted at the process's cgroup and cgroup2
    // mounted afresh, so /proc/self/cgroup says `0::/` and the mount's root is that
    // cgroup. The limit is set from outside by the cgroup's sysfs path.
    let t = Test::new("ns");
    let c = Cg::new("ns");
    let mount = cgroup2();
    assert_eq!(
        t.smi(
            "1",
            &["set-limit", "1", c.path(), "0", &(512 * MIB).to_string()]
        )
        .0,
        0
    );
    let mut cmd = Command::new("sh");
    let inner = r#"umount "$MNT" && mount -t cgroup2 none "$MNT" && grep -qx '0::/' /proc/self/cgroup && exec "$@""#;
    cmd.args([
        "-c",
        r#"echo $$ > "$CG/cgroup.procs" && exec unshare -C -m sh -c "$INNER" sh "$@""#,
        "sh",
        BYPASS,
    ])
    .args(["--gpu", "1", "--alloc-mib", "1024", "--hold-s", "0"])
    .env("CG", &c.0)
    .env("MNT", &mount)
    .env("INNER", inner);
    t.env(&mut cmd);
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["bypass_allocated_mib=512", &mem(512, 0)],
        "{out:?}"
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    wait_empty(&c.0);
}

/// Waits until a cgroup has no process (so it can be removed).
fn wait_empty(cg: &Path) {
    for _ in 0..100 {
        if std::fs::read_to_string(cg.join("cgroup.procs"))
            .map(|s| s.trim().is_empty())
            .unwrap_or(true)
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
