//! The utilisation feed the monitor writes for each claim's shim (`docs/shim-contract.md`,
//! "The utilisation feed"): `<claim dir>/feed/utilisation`, mounted read-only in the
//! claim's containers, replaced atomically (a temporary file renamed over it).

use std::io::Write as _;
use std::path::Path;

use fgpu_api::names::contract::FEED_FILE;

use super::attribute::ClaimUsage;

/// The feed's text for `claim`, sampled at `sampled_unix_ms` over `window_ms`.
pub fn render(claim: &ClaimUsage, sampled_unix_ms: u64, window_ms: u64) -> String {
    let mut s = format!("version=1\nsampled_unix_ms={sampled_unix_ms}\nwindow_ms={window_ms}\n");
    for g in &claim.gpus {
        let uuid = &g.grant.gpu_uuid;
        let pids: Vec<String> = g.processes.iter().map(|p| p.pid.to_string()).collect();
        s.push_str(&format!(
            "gpu.{uuid}.sm_permille={}\ngpu.{uuid}.memory_used={}\ngpu.{uuid}.pids={}\n",
            g.sm_percent() * 10,
            g.used_memory(),
            pids.join(",")
        ));
    }
    s
}

/// Replaces `<feed_dir>/utilisation` with `text` (0644: the container's user reads it
/// through a read-only mount; only the plugin writes the directory).
pub fn write(feed_dir: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = feed_dir.join(format!(".{FEED_FILE}.tmp"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, feed_dir.join(FEED_FILE))
}

#[cfg(test)]
mod tests {
    use super::super::attribute::{ClaimGpuUsage, ClaimProcess, GpuGrant, PodRef};
    use super::*;

    #[test]
    fn renders_the_contract_and_replaces_the_file() {
        let p = |pid, used, sm| ClaimProcess {
            pid,
            used_memory: used,
            sm_percent: sm,
            pod: PodRef {
                namespace: "ml".into(),
                name: "p".into(),
                uid: "u".into(),
            },
            container_id: String::new(),
            ambiguous: false,
        };
        let claim = ClaimUsage {
            uid: "u1".into(),
            namespace: "ml".into(),
            name: "c".into(),
            gpus: vec![
                ClaimGpuUsage {
                    grant: GpuGrant {
                        gpu_uuid: "GPU-aa".into(),
                        memory_bytes: 1 << 30,
                        cores: 30,
                    },
                    processes: vec![p(410001, 100, Some(20)), p(410002, 50, Some(9))],
                    memory_known: true,
                },
                ClaimGpuUsage {
                    grant: GpuGrant {
                        gpu_uuid: "GPU-bb".into(),
                        memory_bytes: 1 << 30,
                        cores: 0,
                    },
                    processes: vec![],
                    memory_known: true,
                },
            ],
        };
        let text = render(&claim, 1_800_000_000_123, 1000);
        assert_eq!(
            text,
            "version=1\nsampled_unix_ms=1800000000123\nwindow_ms=1000\n\
             gpu.GPU-aa.sm_permille=290\ngpu.GPU-aa.memory_used=150\ngpu.GPU-aa.pids=410001,410002\n\
             gpu.GPU-bb.sm_permille=0\ngpu.GPU-bb.memory_used=0\ngpu.GPU-bb.pids=\n"
        );
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a").unwrap();
        write(dir.path(), &text).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FEED_FILE)).unwrap(),
            text
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from(FEED_FILE)],
            "no temporary file left"
        );
    }
}
