//! Scratch files and directories for the targets that read their input from disk (the
//! shim's files, the checkpoint): each in a fresh temporary directory, removed on drop, so
//! the targets can run on several threads (`cargo test`) and leave nothing behind.

use std::path::{Path, PathBuf};

/// A temporary directory, or a file in one; removed with the directory on drop.
pub struct Scratch {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl Scratch {
    /// An empty directory.
    pub fn dir() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().to_owned();
        Self { dir, path }
    }

    /// A file `name` holding `content`.
    pub fn with(name: &str, content: &[u8]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("a scratch file");
        Self { dir, path }
    }

    /// The directory or the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory that holds everything.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
}
