//! Test-only fault injection at the plugin's file writes: every write, directory creation
//! and removal of the checkpoint and of a claim's files passes [`check`] first. In a build
//! with tests (`cfg(test)`) a test can make the n-th of them under a directory fail with an
//! I/O error, or "crash" there (that one and every later one fail, as if the process had
//! died; a write leaves its torn temporary file, as a crash in the middle of it would). In
//! any other build [`check`] is an empty inline function: nothing can be turned on.

use std::io;
#[cfg(not(test))]
use std::path::Path;

/// A file operation, as the fault plan counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// A write (by temporary file and rename).
    Write,
    /// A directory created.
    CreateDir,
    /// A file or directory removed.
    Remove,
    /// A change on the device through the backend (a MIG instance created or destroyed),
    /// counted by the tests' backend.
    #[cfg(test)]
    Device,
}

/// A fault injected at one operation.
#[derive(Debug)]
pub(crate) struct Injected {
    /// The error the operation returns.
    pub(crate) error: io::Error,
    /// The process "died" here: a write leaves a torn temporary file.
    pub(crate) crash: bool,
}

/// Whether the operation `op` on `path` may proceed.
#[cfg(not(test))]
#[inline(always)]
pub(crate) fn check(_path: &Path, _op: Op) -> Result<(), Injected> {
    Ok(())
}

#[cfg(test)]
pub(crate) use plan::{Fault, Plan, check};

#[cfg(test)]
mod plan {
    use std::path::{Path, PathBuf};
    use std::sync::{Mutex, PoisonError};

    use super::{Injected, Op};

    /// What happens at the chosen operation.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Fault {
        /// The process dies there: it and every later operation under the root fail.
        Crash,
        /// That operation fails with this `errno` (ENOSPC, EIO); the next ones proceed.
        Errno(i32),
    }

    /// One test's plan: operations under `root` are counted (and logged); the one numbered
    /// `at` (from 0) gets `fault`.
    #[derive(Debug)]
    struct Active {
        root: PathBuf,
        at: Option<(usize, Fault)>,
        seen: Vec<(Op, PathBuf)>,
        dead: bool,
    }

    /// The plans of the tests running now (each under its own temporary directory).
    static PLANS: Mutex<Vec<Active>> = Mutex::new(Vec::new());

    fn plans() -> std::sync::MutexGuard<'static, Vec<Active>> {
        PLANS.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A plan for the operations under `root`, active until dropped.
    pub(crate) struct Plan {
        root: PathBuf,
    }

    impl Plan {
        /// Counts the operations under `root`; the `at`-th (from 0) gets `fault`, if given.
        pub(crate) fn new(root: &Path, at: Option<(usize, Fault)>) -> Self {
            let mut plans = plans();
            plans.retain(|p| p.root != root);
            plans.push(Active {
                root: root.to_owned(),
                at,
                seen: Vec::new(),
                dead: false,
            });
            Self {
                root: root.to_owned(),
            }
        }

        /// The operations counted so far, their paths relative to the root.
        pub(crate) fn seen(&self) -> Vec<(Op, PathBuf)> {
            plans()
                .iter()
                .find(|p| p.root == self.root)
                .map(|p| p.seen.clone())
                .unwrap_or_default()
        }
    }

    impl Drop for Plan {
        fn drop(&mut self) {
            plans().retain(|p| p.root != self.root);
        }
    }

    /// Whether the operation `op` on `path` may proceed under the plans.
    pub(crate) fn check(path: &Path, op: Op) -> Result<(), Injected> {
        let mut plans = plans();
        let Some(p) = plans.iter_mut().find(|p| path.starts_with(&p.root)) else {
            return Ok(());
        };
        let n = p.seen.len();
        let rel = path.strip_prefix(&p.root).unwrap_or(path).to_owned();
        p.seen.push((op, rel));
        if p.dead {
            return Err(Injected {
                error: std::io::Error::other("the process crashed (injected)"),
                crash: true,
            });
        }
        match p.at {
            Some((at, Fault::Crash)) if at == n => {
                p.dead = true;
                Err(Injected {
                    error: std::io::Error::other("the process crashed (injected)"),
                    crash: true,
                })
            }
            Some((at, Fault::Errno(errno))) if at == n => Err(Injected {
                error: std::io::Error::from_raw_os_error(errno),
                crash: false,
            }),
            _ => Ok(()),
        }
    }
}
