//! `fake-fault`: injects or clears a fault on a GPU of a fake profile, for tests and demos.
//! Writes `<profile>.faults.json` (atomically), which the fake backend reads at each health
//! check (and at each MIG instance creation: `mig-create-fails`); the profile itself is not
//! touched.

use std::path::PathBuf;

use anyhow::Context as _;
use fgpu_driver::backend::fake::{FakeProfile, FaultFile, MIG_CREATE_FAILS, faults_path};
use fgpu_driver::health::Fault;

use crate::BadInput;

/// Flags of `fake-fault`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  fgpu-kubelet-plugin fake-fault --fake-gpus node.yaml --gpu 1 xid 79\n  fgpu-kubelet-plugin fake-fault --fake-gpus node.yaml --gpu 0 mig-create-fails\n  fgpu-kubelet-plugin fake-fault --fake-gpus node.yaml --gpu 1 --clear"
)]
pub(crate) struct FakeFaultArgs {
    /// The fake profile whose GPU gets the fault.
    #[arg(long, value_name = "FILE", env = "FGPU_FAKE_GPUS")]
    fake_gpus: PathBuf,
    /// The node, when the profile describes several.
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// The GPU: its index on the node or its UUID.
    #[arg(long, value_name = "INDEX|UUID")]
    gpu: String,
    /// Remove every injected fault of the GPU instead.
    #[arg(long, conflicts_with = "fault")]
    clear: bool,
    /// The fault: `xid N`, `ecc`, `lost`, `retired-pages` or `temperature C` (health
    /// faults), or `mig-create-fails` (every MIG instance creation on the GPU fails; the GPU
    /// stays healthy). Added to the GPU's faults (each stays until cleared).
    #[arg(value_name = "FAULT", num_args = 1.., required_unless_present = "clear")]
    fault: Vec<String>,
}

pub(crate) fn run(args: &FakeFaultArgs) -> anyhow::Result<()> {
    let profile = FakeProfile::load(&args.fake_gpus)?;
    let node = profile.single_node(args.node.as_deref())?;
    let gpu = node
        .gpus
        .iter()
        .find(|g| g.uuid == args.gpu || g.index.to_string() == args.gpu)
        .ok_or_else(|| {
            BadInput(format!(
                "{}: node {:?} has no GPU {:?} (indexes {}, or a UUID)",
                args.fake_gpus.display(),
                node.node,
                args.gpu,
                node.gpus
                    .iter()
                    .map(|g| g.index.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    let path = faults_path(&args.fake_gpus);
    let mut file = FaultFile::load(&path)?;
    if args.clear {
        file.gpus.remove(&gpu.uuid);
        println!(
            "{}: cleared the faults of GPU {} ({})",
            path.display(),
            gpu.index,
            gpu.uuid
        );
    } else {
        let mut text = args.fault.join(" ");
        if text.trim().eq_ignore_ascii_case(MIG_CREATE_FAILS) {
            // The fake backend's operation fault, in the spelling it writes.
            text = MIG_CREATE_FAILS.to_owned();
        } else if let Fault::Probe(_) = Fault::parse(&text) {
            return Err(BadInput(format!(
                "fault {text:?}: expected `xid N`, `ecc`, `lost`, `retired-pages`, `temperature C` or `{MIG_CREATE_FAILS}`"
            ))
            .into());
        }
        file.gpus
            .entry(gpu.uuid.clone())
            .or_default()
            .push(text.clone());
        println!(
            "{}: GPU {} ({}): {text}",
            path.display(),
            gpu.index,
            gpu.uuid
        );
    }
    file.save(&path)
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(profile: &std::path::Path, fault: &[&str], clear: bool) -> FakeFaultArgs {
        FakeFaultArgs {
            fake_gpus: profile.to_owned(),
            node: None,
            gpu: "0".into(),
            clear,
            fault: fault.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn mig_create_fails_is_accepted_beside_the_health_faults() {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("node.yaml");
        std::fs::write(
            &profile,
            "nodes:\n  - name: n\n    gpus:\n      - uuid: GPU-1\n        productName: NVIDIA H100 80GB HBM3\n        memory: 81559Mi\n        smCount: 132\n        computeCapability: \"9.0\"\n",
        )
        .unwrap();
        run(&args(&profile, &["MIG-create-fails"], false)).unwrap();
        run(&args(&profile, &["xid", "79"], false)).unwrap();
        let file = FaultFile::load(&faults_path(&profile)).unwrap();
        assert_eq!(file.gpus["GPU-1"], [MIG_CREATE_FAILS, "xid 79"]);
        let e = run(&args(&profile, &["mig-create"], false)).unwrap_err();
        assert!(e.to_string().contains("mig-create-fails"), "{e}");
        run(&args(&profile, &[], true)).unwrap();
        assert!(
            FaultFile::load(&faults_path(&profile))
                .unwrap()
                .gpus
                .is_empty()
        );
    }
}
