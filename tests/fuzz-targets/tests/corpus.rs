//! Feeds every committed corpus and regression input of every fuzz target
//! (`fuzz/corpus/<target>/`, `fuzz/regressions/<target>/`) through the target's function,
//! as `cargo fuzz run` would: each must return (the product's `Ok` or a clean `Err`), not
//! panic. Runs in `make test` (`make unit`) without libFuzzer.

use std::path::{Path, PathBuf};

use fgpu_fuzz_targets::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_target_has_a_seed_corpus() {
    for (name, _) in TARGETS {
        let dir = fuzz_dir().join("corpus").join(name);
        assert!(
            inputs(&dir).len() >= 2,
            "{}: a target needs a few seed inputs",
            dir.display()
        );
        let bin = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        assert!(
            bin.is_file(),
            "{}: the target's binary is missing",
            bin.display()
        );
    }
}

#[test]
fn every_committed_input_returns() {
    let mut fed = 0;
    for (name, run) in TARGETS {
        for kind in ["corpus", "regressions"] {
            for file in inputs(&fuzz_dir().join(kind).join(name)) {
                let data = std::fs::read(&file).expect("a committed input");
                let outcome = std::panic::catch_unwind(|| run(&data));
                assert!(
                    outcome.is_ok(),
                    "{}: target {name} panicked",
                    file.display()
                );
                fed += 1;
            }
        }
    }
    assert!(fed >= TARGETS.len() * 2, "only {fed} inputs found");
}
