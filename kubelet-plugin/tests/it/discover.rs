//! Runs the real `fgpu-kubelet-plugin` binary: `discover` against the shipped fake profiles
//! and against malformed ones.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fgpu-kubelet-plugin");

fn profile(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/fake")
        .join(name)
}

/// Runs the binary with a clean environment for the variables it reads.
fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("NODE_NAME")
        .env_remove("RUST_LOG")
        .env_remove("FGPU_BACKEND")
        .env_remove("FGPU_FAKE_GPUS")
        .env_remove("FGPU_LOG_FORMAT")
        .output()
        .expect("run fgpu-kubelet-plugin")
}

fn discover(file: &Path, extra: &[&str]) -> Output {
    let file = file.to_str().unwrap();
    let mut args = vec!["discover", "--backend", "fake", "--fake-gpus", file];
    args.extend_from_slice(extra);
    run(&args)
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "stderr: {}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("stdout is JSON")
}

/// A scratch file for one test.
fn scratch(test: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fgpu-kp-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("profile.yaml");
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn table_for_the_h100_node() {
    let o = discover(&profile("node-2xh100.yaml"), &[]);
    assert!(o.status.success(), "stderr: {}", stderr(&o));
    assert!(stderr(&o).is_empty(), "no log noise at the default level");
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for h in [
        "NODE", "INDEX", "UUID", "PRODUCT", "MEMORY", "SMS", "CC", "NUMA", "PCI BUS", "HEALTH",
    ] {
        assert!(lines[0].contains(h), "header lacks {h}: {}", lines[0]);
    }
    let cols: Vec<&str> = lines[2]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        cols,
        [
            "gpu-node-1",
            "1",
            "GPU-63367e56-cdb4-4537-be42-f7abdf387237",
            "NVIDIA H100 80GB HBM3",
            "79.6 GiB",
            "132",
            "9.0",
            "1",
            "0000:9a:00.0",
            "Healthy"
        ]
    );
    // Columns are aligned: every row puts the UUID at the same offset.
    let at = lines[0].find("UUID").unwrap();
    assert!(lines[1][at..].starts_with("GPU-a1c44256"));
    assert!(lines[2][at..].starts_with("GPU-63367e56"));
}

#[test]
fn json_for_the_h100_node() {
    let v = json(&discover(&profile("node-2xh100.yaml"), &["-o", "json"]));
    let nodes = v.as_array().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0]["node"], "gpu-node-1");
    let gpus = nodes[0]["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["uuid"], "GPU-a1c44256-6d3a-4972-9ea9-d296185fc8ff");
    assert_eq!(gpus[0]["memoryBytes"], 81559u64 * 1024 * 1024);
    assert_eq!(gpus[0]["architecture"], "Hopper");
    assert_eq!(gpus[1]["numaNode"], 1);
    assert_eq!(gpus[1]["deviceNodes"][0]["path"], "/dev/nvidia1");
}

#[test]
fn cluster_profile_lists_every_node_or_one() {
    let all = json(&discover(
        &profile("cluster-4node-mixed.yaml"),
        &["-o", "json"],
    ));
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a100-80g-1", "a100-40g-1", "t4-1", "mixed-1"]);
    let total: usize = all
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["gpus"].as_array().unwrap().len())
        .sum();
    assert_eq!(total, 13);

    let t4 = json(&discover(
        &profile("cluster-4node-mixed.yaml"),
        &["--node", "t4-1", "-o", "json"],
    ));
    let gpus = t4[0]["gpus"].as_array().unwrap();
    assert_eq!(t4.as_array().unwrap().len(), 1);
    assert_eq!(gpus.len(), 4);
    assert!(gpus.iter().all(|g| g["productName"] == "Tesla T4"));
    assert!(gpus.iter().all(|g| g["memoryBytes"] == 15360u64 << 20));
    assert_eq!(gpus[2]["uuid"], "GPU-89063182-adbb-44a7-8c92-1badbc986a49");

    let table = stdout(&discover(
        &profile("cluster-4node-mixed.yaml"),
        &["--node", "mixed-1"],
    ));
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(table.contains("Unhealthy: XID 79: GPU has fallen off the bus"));
    assert!(!table.contains("80.0 GiB") && table.contains("40.0 GiB"));
}

#[test]
fn unknown_node_lists_the_known_ones() {
    let o = discover(
        &profile("cluster-4node-mixed.yaml"),
        &["--node", "gpu-node-9"],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cluster-4node-mixed.yaml: unknown node \"gpu-node-9\"; known nodes: a100-80g-1, a100-40g-1, t4-1, mixed-1"), "{err}");
    assert!(o.stdout.is_empty());
}

const GOOD_GPU: &str = "      - uuid: GPU-11111111-2222-3333-4444-555555555555
        productName: Tesla T4
        memory: 15360Mi
        smCount: 40
        computeCapability: \"7.5\"
";

/// Asserts exit status 2 and one stderr line holding every needle.
fn assert_one_line_error(test: &str, text: &str, needles: &[&str]) {
    let file = scratch(test, text);
    let o = discover(&file, &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{test}: {err}");
    assert_eq!(err.lines().count(), 1, "{test}: {err}");
    assert!(
        err.contains(file.to_str().unwrap()),
        "{test}: no file name in {err}"
    );
    for n in needles {
        assert!(err.contains(n), "{test}: {n:?} missing in {err}");
    }
    assert!(o.stdout.is_empty());
    std::fs::remove_dir_all(file.parent().unwrap()).unwrap();
}

#[test]
fn zero_memory() {
    let text = format!(
        "nodes:\n  - name: gpu-node-1\n    gpus:\n{GOOD_GPU}{}",
        GOOD_GPU
            .replace("15360Mi", "0")
            .replace("GPU-1111", "GPU-9999")
    );
    assert_one_line_error(
        "zero-memory",
        &text,
        &[r#"node "gpu-node-1" gpu[1].memory: must be greater than 0 (e.g. 80Gi)"#],
    );
}

#[test]
fn duplicate_uuid_across_nodes() {
    let text = format!(
        "nodes:\n  - name: node-a\n    gpus:\n{GOOD_GPU}  - name: node-b\n    gpus:\n{GOOD_GPU}"
    );
    assert_one_line_error(
        "dup-uuid",
        &text,
        &[
            r#"node "node-b" gpu[0].uuid: duplicate UUID "GPU-11111111-2222-3333-4444-555555555555""#,
            r#"already used by node "node-a" gpu[0]"#,
        ],
    );
}

#[test]
fn unknown_field() {
    let text = format!("nodes:\n  - name: gpu-node-1\n    gpus:\n{GOOD_GPU}        vram: 16Gi\n");
    assert_one_line_error(
        "unknown-field",
        &text,
        &[r#"node "gpu-node-1" gpu[0].vram: unknown field `vram`"#],
    );
}

#[test]
fn bad_yaml() {
    let text = format!("nodes:\n  - name: gpu-node-1\n    gpus:\n{GOOD_GPU}      - uuid: [GPU-2\n");
    assert_one_line_error(
        "bad-yaml",
        &text,
        &[r#"node "gpu-node-1": invalid YAML:"#, "line 9 column"],
    );
}

#[test]
fn missing_profile_is_bad_input() {
    let o = discover(Path::new("/nonexistent/fgpu/profile.yaml"), &[]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert_eq!(
        err.trim_end(),
        "error: /nonexistent/fgpu/profile.yaml: cannot read fake GPU profile: No such file or directory (os error 2)"
    );
}

#[cfg(feature = "nvml")]
#[test]
fn nvml_without_a_driver_fails_with_a_hint() {
    if Path::new("/dev/nvidiactl").exists() {
        return; // a real GPU node: nothing to check here
    }
    let o = run(&["discover", "--backend", "nvml"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: NVML library libnvidia-ml.so.1 not found:"),
        "{err}"
    );
    assert!(
        err.contains("use --backend fake for a machine without GPUs"),
        "{err}"
    );
}

#[test]
fn help_and_version() {
    let help = stdout(&run(&["discover", "--help"]));
    for flag in [
        "--backend",
        "--fake-gpus",
        "--node",
        "--output",
        "--log-format",
        "--log-level",
    ] {
        assert!(help.contains(flag), "help lacks {flag}");
    }
    let v = run(&["--version"]);
    assert!(v.status.success());
    assert_eq!(
        stdout(&v).trim(),
        format!("fgpu-kubelet-plugin {}", env!("CARGO_PKG_VERSION"))
    );
    let o = run(&["discover", "--backend", "fake"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--fake-gpus is required with fake"
    );
}

#[test]
fn json_logs_on_request() {
    let file = profile("node-2xh100.yaml");
    let o = run(&[
        "--log-format",
        "json",
        "--log-level",
        "debug",
        "discover",
        "--backend",
        "fake",
        "--fake-gpus",
        file.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let line = stderr(&o)
        .lines()
        .next()
        .map(str::to_owned)
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
    assert_eq!(v["level"], "DEBUG");
    assert_eq!(v["fields"]["message"], "loaded fake profile");
    // stdout still carries only the table
    assert!(stdout(&o).starts_with("NODE"));
}
