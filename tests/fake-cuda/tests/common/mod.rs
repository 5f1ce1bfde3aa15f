//! Helpers shared by this crate's integration tests (each test file is its own binary and
//! uses what it needs of these).
#![allow(dead_code)]

use std::path::PathBuf;

/// This crate's cdylib (`libfgpu_fake_cuda.so`), next to the test binary's directory: the
/// test binary is in `<target>/<profile>/deps`, the cdylib in `<target>/<profile>`.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("libfgpu_fake_cuda.so")
}

/// The cgroup2 mount point (its root must be the hierarchy's, as on a host).
pub fn cgroup2() -> PathBuf {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mi.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            (post.split_whitespace().next()? == "cgroup2").then(|| {
                let f: Vec<&str> = pre.split_whitespace().collect();
                assert_eq!(f[3], "/", "cgroup2 mounted from a subtree: {l}");
                PathBuf::from(f[4])
            })
        })
        .expect("no cgroup2 mount")
}
