//! `fgpu-kubelet-plugin mig-profiles`: every GPU's MIG mode and GPU instance profiles
//! (compute slices, memory, instances, possible placements) as NVML reports them, compared
//! with fgpu's profile table for the model (`docs/mig.md`, "Checking the tables on a GPU").
//! Only get calls: it never enables MIG mode or changes a setting.

use std::path::PathBuf;

use fgpu_driver::backend::nvml::{NVML_LIBRARY, NvmlBackend};

/// Flags of `mig-profiles`.
#[derive(Debug, clap::Args)]
pub struct MigProfilesArgs {
    /// The NVML library to load (a soname or a path).
    #[arg(long, value_name = "LIB", default_value = NVML_LIBRARY)]
    pub nvml_library: PathBuf,
}

/// Prints the report; fails only when NVML cannot be loaded or enumerated. Mismatches are
/// printed and counted, not an error.
pub fn run(args: &MigProfilesArgs) -> anyhow::Result<()> {
    let backend = NvmlBackend::with_library(&args.nvml_library)?;
    let gpus = backend.mig_profiles()?;
    let mut mismatches = 0;
    for g in &gpus {
        let (text, n) = g.report();
        print!("{text}");
        mismatches += n;
    }
    println!(
        "{} GPUs, {mismatches} mismatches with fgpu's tables",
        gpus.len()
    );
    Ok(())
}
