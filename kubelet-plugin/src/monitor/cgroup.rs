//! Which pod and container a host process belongs to, from `/proc/<pid>/cgroup`.
//!
//! The kubelet puts each pod's containers below a cgroup named after the pod's UID, with
//! the container's runtime id as the leaf, under either cgroup driver and either cgroup
//! version:
//!
//! * cgroupfs: `/kubepods/besteffort/pod<uid>/<container id>` (guaranteed pods:
//!   `/kubepods/pod<uid>/<id>`);
//! * systemd: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with
//!   '_' for '-'>.slice/cri-containerd-<id>.scope` (also `crio-`, `docker-`).
//!
//! A process cannot move itself out of its container's cgroup (the hierarchy above it is
//! not writable from inside), so the pod UID read here is the runtime's word, not the
//! tenant's.

use std::path::Path;

/// A process's pod and container, as its cgroup names them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodCgroup {
    /// The pod's UID (with dashes).
    pub pod_uid: String,
    /// The container's runtime id (hex), empty where the cgroup stops at the pod (the pod's
    /// own processes, e.g. the sandbox).
    pub container_id: String,
}

/// Reads `<proc>/<pid>/cgroup`; `None` when the process is gone or is not in a pod.
pub fn of_pid(proc_root: &Path, pid: u32) -> Option<PodCgroup> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    parse(&text)
}

/// The pod and container of a `/proc/<pid>/cgroup` file (v1: `N:controllers:/path` per
/// hierarchy; v2: `0::/path`): the first line whose path has a pod segment.
pub fn parse(text: &str) -> Option<PodCgroup> {
    text.lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .find_map(parse_path)
}

/// The pod and container of one cgroup path.
pub fn parse_path(path: &str) -> Option<PodCgroup> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (i, pod_uid) = segments
        .iter()
        .enumerate()
        .find_map(|(i, s)| pod_segment(s).map(|u| (i, u)))?;
    let container_id = segments
        .get(i + 1)
        .and_then(|s| container_segment(s))
        .unwrap_or_default();
    Some(PodCgroup {
        pod_uid,
        container_id,
    })
}

/// `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid_>.slice` (systemd) → the UID.
fn pod_segment(s: &str) -> Option<String> {
    let s = s.strip_suffix(".slice").unwrap_or(s);
    let at = s.rfind("pod")?;
    let before = &s[..at];
    if !(before.is_empty() || (before.starts_with("kubepods") && before.ends_with('-'))) {
        return None;
    }
    let uid = s[at + 3..].replace('_', "-");
    is_uuid(&uid).then_some(uid)
}

/// `<64 hex>` or `<runtime>-<64 hex>.scope` → the id.
fn container_segment(s: &str) -> Option<String> {
    let s = s.strip_suffix(".scope").unwrap_or(s);
    let id = s.rsplit('-').next().unwrap_or(s);
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6f1c2d3e-0000-4000-8000-000000000001";
    const CID: &str = "4a5b6c7d8e9f00112233445566778899aabbccddeeff00112233445566778899";

    #[test]
    fn cgroupfs_v1_and_v2() {
        let v1 = format!(
            "12:pids:/kubepods/besteffort/pod{UID}/{CID}\n4:memory:/kubepods/besteffort/pod{UID}/{CID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n"
        );
        let want = PodCgroup {
            pod_uid: UID.into(),
            container_id: CID.into(),
        };
        assert_eq!(parse(&v1), Some(want.clone()));
        assert_eq!(
            parse(&format!("0::/kubepods/pod{UID}/{CID}\n")),
            Some(want.clone())
        );
    }

    #[test]
    fn systemd_driver() {
        let u = UID.replace('-', "_");
        let p = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope\n"
        );
        assert_eq!(
            parse(&p),
            Some(PodCgroup {
                pod_uid: UID.into(),
                container_id: CID.into()
            })
        );
        let g = format!("0::/kubepods.slice/kubepods-pod{u}.slice/crio-{CID}.scope");
        assert_eq!(parse(&g).unwrap().pod_uid, UID);
    }

    #[test]
    fn not_in_a_pod() {
        assert_eq!(parse("0::/system.slice/containerd.service\n"), None);
        assert_eq!(parse("0::/user.slice/user-0.slice/session-1.scope\n"), None);
        // A look-alike that is not the kubelet's: no UUID after "pod".
        assert_eq!(parse("0::/kubepods/podcast/x\n"), None);
        assert_eq!(
            parse("0::/mypod6f1c2d3e-0000-4000-8000-000000000001/x\n"),
            None
        );
        assert_eq!(parse(""), None);
        // The pod's own cgroup, no container below it.
        assert_eq!(
            parse(&format!("0::/kubepods/besteffort/pod{UID}\n")),
            Some(PodCgroup {
                pod_uid: UID.into(),
                container_id: String::new()
            })
        );
    }

    #[test]
    fn reads_proc() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("42")).unwrap();
        std::fs::write(
            dir.path().join("42/cgroup"),
            format!("0::/kubepods/pod{UID}/{CID}\n"),
        )
        .unwrap();
        assert_eq!(of_pid(dir.path(), 42).unwrap().pod_uid, UID);
        assert_eq!(of_pid(dir.path(), 43), None);
        // This test process is not in a pod.
        assert_eq!(of_pid(Path::new("/proc"), std::process::id()), None);
    }
}
