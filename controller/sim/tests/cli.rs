//! `fgpu-sim` end to end: output layout and exit codes.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fgpu-sim"))
}

const NODES: &str =
    "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,131072,2,T4\nn1,64000,262144,4,V100\n";
const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,1,1000\np1,2000,4096,1,500\np2,8000,8192,0,0\n";

/// Runs every policy on NODES and PODS (as `mytrace.csv`), seeds 1-2, in `dir`: the
/// output CSV's path and the process' output.
fn simulate_all(dir: &std::path::Path) -> (std::path::PathBuf, std::process::Output) {
    let (nodes, pods) = (dir.join("nodes.csv"), dir.join("mytrace.csv"));
    let out = dir.join("out.csv");
    std::fs::write(&nodes, NODES).unwrap();
    std::fs::write(&pods, PODS).unwrap();
    let o = bin()
        .args(["--policy", "all", "--seeds", "1-2", "--nodes"])
        .arg(&nodes)
        .arg("--pods")
        .arg(&pods)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (out, o)
}

#[test]
fn writes_one_row_per_policy_and_seed() {
    let dir = tempfile::tempdir().unwrap();
    let (out, o) = simulate_all(dir.path());
    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + 6 * 2);
    assert!(lines[0].starts_with("workload,sc_policy,tune,seed,total_gpus,0,1,2,"));
    assert!(lines[1].starts_with("mytrace,binpack,1.3,1,6,"));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("fragaware"), "{stdout}");
}

#[test]
fn malformed_csv_exits_2_naming_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.csv");
    let pods = dir.path().join("pods.csv");
    std::fs::write(&nodes, NODES).unwrap();
    std::fs::write(
        &pods,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,one,1000\n",
    )
    .unwrap();
    let o = bin()
        .args(["--seeds", "1", "--nodes"])
        .arg(&nodes)
        .arg("--pods")
        .arg(&pods)
        .arg("--out")
        .arg(dir.path().join("out.csv"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("pods.csv:2: column 4 (num_gpu)"), "{err}");
    let o = bin()
        .args(["--policy", "nope", "--nodes"])
        .arg(&nodes)
        .arg("--pods")
        .arg(&pods)
        .arg("--out")
        .arg(dir.path().join("out.csv"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn help_and_version() {
    let o = bin().args(["--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--nodes", "--pods", "--policy", "--seeds", "--tune", "--out", "--paper", "--jobs",
    ] {
        assert!(help.contains(flag), "{flag} missing from help");
    }
    assert!(
        help.contains("plot"),
        "the plot command is missing from help"
    );
    let o = bin().args(["plot", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    for flag in ["--in", "--out", "--title", "--workload", "--arrived"] {
        assert!(help.contains(flag), "{flag} missing from plot's help");
    }
    let o = bin().arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn placements_as_the_controller_list_gpu_pods_in_arrival_order() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, pods) = (dir.path().join("nodes.csv"), dir.path().join("pods.csv"));
    let placements = dir.path().join("placements.csv");
    std::fs::write(&nodes, NODES).unwrap();
    std::fs::write(&pods, PODS).unwrap();
    let o = bin()
        .args([
            "--policy",
            "binpack,fragaware",
            "--seeds",
            "3",
            "--tune",
            "0",
        ])
        .args(["--as-controller", "--online-workload", "--nodes"])
        .arg(&nodes)
        .arg("--pods")
        .arg(&pods)
        .arg("--out")
        .arg(dir.path().join("out.csv"))
        .arg("--placements")
        .arg(&placements)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&placements).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "sc_policy,seed,seq,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,node,gpus"
    );
    // p2 asks no GPU: left out; the other two ask no host CPU or memory.
    assert_eq!(lines.len(), 1 + 2 * 2, "{text}");
    let mut names: Vec<&str> = lines[1..3]
        .iter()
        .map(|l| l.split(',').nth(3).unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["p0", "p1"]);
    for l in &lines[1..] {
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!((f[1], f[4], f[5]), ("3", "0", "0"), "{l}");
        assert!(f[9] == "n0" || f[9] == "n1", "{l}");
        assert!(f[10].starts_with("gpu-"), "{l}");
    }
    // The same arrival order for every policy of a seed.
    let order = |p: &str| -> Vec<String> {
        lines[1..]
            .iter()
            .filter(|l| l.starts_with(&format!("{p},")))
            .map(|l| l.split(',').nth(3).unwrap().to_owned())
            .collect()
    };
    assert_eq!(order("binpack"), order("fragaware"));
}

#[test]
fn plot_draws_every_policy_of_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = simulate_all(dir.path());
    let svg = dir.path().join("fig.svg");
    let o = bin()
        .args(["plot", "--arrived", "0-130", "--in"])
        .arg(&out)
        .arg("--out")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    for p in [
        "binpack",
        "spread",
        "gpupacking",
        "bestfit",
        "fgd",
        "fragaware",
    ] {
        assert!(
            text.contains(&format!("\n{p}\n</text>")),
            "{p} not in the legend"
        );
    }
    assert!(
        text.contains("mytrace (mean of 2 seeds)"),
        "the title names the workload"
    );
}

#[test]
fn plot_of_bad_input_exits_2_naming_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        "workload,sc_policy,tune,seed,total_gpus,0,1\nw,fgd,1.3,42,8,0.0,1.0\nw,fgd,1.3,43,8,0.0,x\n",
    )
    .unwrap();
    let plot = |input: &std::path::Path| {
        bin()
            .args(["plot", "--in"])
            .arg(input)
            .arg("--out")
            .arg(dir.path().join("fig.svg"))
            .output()
            .unwrap()
    };
    let o = plot(&bad);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.csv:3: column 7 (1)"), "{err}");
    let o = plot(&dir.path().join("missing.csv"));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing.csv"));
    assert!(
        !dir.path().join("fig.svg").exists(),
        "no figure from bad input"
    );
}
