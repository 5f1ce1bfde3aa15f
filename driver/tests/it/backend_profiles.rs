//! The profiles shipped in `deploy/fake/` load and say what their comments claim.

use std::path::PathBuf;

use fgpu_driver::backend::{DeviceBackend, FakeBackend, FakeProfile};
use fgpu_driver::device::{Architecture, ComputeCapability, Health};

fn profile(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/fake")
        .join(name)
}

#[test]
fn node_2xh100() {
    let p = FakeProfile::load(profile("node-2xh100.yaml")).unwrap();
    assert_eq!(p.node_names(), ["gpu-node-1"]);
    let gpus = &p.nodes()[0].gpus;
    assert_eq!(gpus.len(), 2);
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(g.index as usize, i);
        assert_eq!(g.product_name, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.memory_bytes, 81559 * 1024 * 1024);
        assert_eq!(g.sm_count, 132);
        assert_eq!(g.compute_capability, ComputeCapability::new(9, 0));
        assert_eq!(g.architecture(), Architecture::Hopper);
        assert_eq!(g.numa_node, Some(i as u32));
        assert!(g.mig_capable && g.is_healthy());
    }
    assert_eq!(gpus[0].uuid, "GPU-a1c44256-6d3a-4972-9ea9-d296185fc8ff");
    assert_eq!(gpus[1].pcie_root.as_deref(), Some("pci0000:97"));

    // A single-node profile needs no node name.
    let b = FakeBackend::open(profile("node-2xh100.yaml"), None).unwrap();
    assert_eq!(b.node(), "gpu-node-1");
    assert_eq!(b.enumerate().unwrap(), *gpus);
}

#[test]
fn cluster_4node_mixed() {
    let p = FakeProfile::load(profile("cluster-4node-mixed.yaml")).unwrap();
    assert_eq!(
        p.node_names(),
        ["a100-80g-1", "a100-40g-1", "t4-1", "mixed-1"]
    );
    let count = |product: &str| {
        p.nodes()
            .iter()
            .flat_map(|n| &n.gpus)
            .filter(|g| g.product_name == product)
            .count()
    };
    assert_eq!(count("NVIDIA A100-SXM4-80GB"), 4);
    assert_eq!(count("NVIDIA A100-PCIE-40GB"), 3);
    assert_eq!(count("Tesla T4"), 6);

    let t4 = p.node("t4-1").unwrap();
    assert_eq!(t4.gpus[0].memory_bytes, 15 << 30);
    assert_eq!(t4.gpus[0].architecture(), Architecture::Turing);
    assert_eq!(t4.gpus[0].driver_version, "535.183.01");
    assert_eq!(t4.gpus[0].cuda_driver_version, "12.2");

    let a100 = p.node("a100-80g-1").unwrap();
    assert_eq!(a100.total_memory_bytes(), 4 * (80 << 30));
    assert_eq!(a100.gpus[0].driver_version, "550.54.15");
    let roots: Vec<_> = a100
        .gpus
        .iter()
        .map(|g| (g.numa_node, g.pcie_root.clone().unwrap()))
        .collect();
    assert_eq!(roots[0], (Some(0), "pci0000:00".to_owned()));
    assert_eq!(roots[3], (Some(1), "pci0000:80".to_owned()));

    let mixed = p.node("mixed-1").unwrap();
    let sick: Vec<_> = mixed.gpus.iter().filter(|g| !g.is_healthy()).collect();
    assert_eq!(sick.len(), 1);
    assert_eq!(
        sick[0].health,
        Health::Unhealthy {
            reason: "XID 79: GPU has fallen off the bus".into()
        }
    );

    // A multi-node profile needs a node name for a backend.
    assert!(FakeBackend::open(profile("cluster-4node-mixed.yaml"), None).is_err());
    let b = FakeBackend::open(profile("cluster-4node-mixed.yaml"), Some("t4-1")).unwrap();
    assert_eq!(b.enumerate().unwrap().len(), 4);
}
