use super::*;

const GIB: u64 = 1 << 30;

fn node(name: &str, gpus: usize) -> Node {
    Node::new(
        name,
        (0..gpus)
            .map(|i| Gpu::new(format!("gpu-{i}"), "A100", 80 * GIB))
            .collect(),
    )
    .with_host(64_000, 256 * 1024)
}

fn take(n: &mut Node, gpu: usize, milli: u32) {
    let g = &mut n.gpus[gpu];
    g.memory_free -= g.memory_total * u64::from(milli) / 1000;
}

fn ctx(w: Option<&Workload>) -> ScoreContext<'_> {
    ScoreContext {
        workload: w,
        max_spec: MaxSpec {
            cpu_milli: 64_000,
            gpus: 8,
        },
        usage_weight: 0.0,
    }
}

fn frac(milli: u32) -> Request {
    Request::new(1, GpuShare::Fraction { milli })
}

#[test]
fn whole_gpu_needs_an_idle_gpu() {
    let mut n = node("a", 2);
    take(&mut n, 0, 100);
    let p = evaluate_node(
        0,
        &n,
        &Request::new(1, GpuShare::Whole),
        Policy::BINPACK,
        &ctx(None),
    )
    .expect("gpu-1 is idle");
    assert_eq!(p.gpus, vec![1]);
    take(&mut n, 1, 100);
    assert!(
        evaluate_node(
            0,
            &n,
            &Request::new(1, GpuShare::Whole),
            Policy::BINPACK,
            &ctx(None)
        )
        .is_none()
    );
}

#[test]
fn fraction_and_memory_shares_check_free_memory() {
    let mut n = node("a", 1);
    take(&mut n, 0, 600);
    assert!(evaluate_node(0, &n, &frac(400), Policy::BINPACK, &ctx(None)).is_some());
    assert!(evaluate_node(0, &n, &frac(401), Policy::BINPACK, &ctx(None)).is_none());
    let mem = Request::new(1, GpuShare::Memory { bytes: 33 * GIB });
    assert!(evaluate_node(0, &n, &mem, Policy::BINPACK, &ctx(None)).is_none());
    let mem = Request::new(1, GpuShare::Memory { bytes: 32 * GIB });
    assert!(evaluate_node(0, &n, &mem, Policy::BINPACK, &ctx(None)).is_some());
}

#[test]
fn cores_are_checked() {
    let mut n = node("a", 1);
    n.gpus[0].cores_free = 20;
    let mut r = frac(100);
    r.cores = Some(30);
    assert!(evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).is_none());
    r.cores = Some(20);
    assert!(evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).is_some());
}

#[test]
fn host_cpu_and_memory_are_respected() {
    let n = node("a", 1);
    let mut r = frac(100);
    r.cpu_milli = 64_001;
    assert!(evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).is_none());
    r.cpu_milli = 64_000;
    r.memory_mib = 256 * 1024 + 1;
    assert!(evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).is_none());
}

#[test]
fn device_taints_repel_requests_that_do_not_tolerate_them() {
    let mut n = node("a", 2);
    let taint = |effect: &str| Taint {
        key: "fgpu.dev/unhealthy".into(),
        value: "xid-79".into(),
        effect: effect.into(),
    };
    n.gpus[0].taints = vec![taint("NoExecute")];
    let mut r = Request::new(2, GpuShare::Whole);
    assert!(
        evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).is_none(),
        "two GPUs but one is tainted"
    );
    r.gpus = 1;
    let gpus =
        |r: &Request, n: &Node| evaluate_node(0, n, r, Policy::BINPACK, &ctx(None)).map(|e| e.gpus);
    assert_eq!(gpus(&r, &n), Some(vec![1]));
    // Tolerations, by the Kubernetes rules.
    let tol = |key: &str, exists: bool, value: &str, effect: &str| Toleration {
        key: key.into(),
        exists,
        value: value.into(),
        effect: effect.into(),
    };
    r.gpus = 2;
    for (t, ok) in [
        (tol("fgpu.dev/unhealthy", true, "", ""), true),
        (tol("", true, "", ""), true),
        (
            tol("fgpu.dev/unhealthy", false, "xid-79", "NoExecute"),
            true,
        ),
        (tol("fgpu.dev/unhealthy", false, "xid-48", ""), false),
        (tol("fgpu.dev/unhealthy", true, "", "NoSchedule"), false),
        (tol("", false, "", ""), false),
        (tol("other", true, "", ""), false),
    ] {
        r.tolerations = vec![t.clone()];
        assert_eq!(gpus(&r, &n).is_some(), ok, "{t:?}");
    }
    // An informational taint repels nothing.
    r.tolerations.clear();
    n.gpus[0].taints = vec![taint("None")];
    assert_eq!(gpus(&r, &n), Some(vec![0, 1]));
}

#[test]
fn model_uuid_and_health_filters() {
    let mut n = node("a", 3);
    n.gpus[1].model = "T4".into();
    n.gpus[2].healthy = false;
    let mut r = Request::new(1, GpuShare::Whole);
    r.model_include = vec!["t4".into()];
    assert_eq!(
        evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None))
            .unwrap()
            .gpus,
        vec![1]
    );
    r.model_include.clear();
    r.model_exclude = vec!["A100".into()];
    assert_eq!(
        evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None))
            .unwrap()
            .gpus,
        vec![1]
    );
    r.model_exclude.clear();
    r.uuid_pin = vec![n.gpus[2].uuid.clone()];
    assert!(evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).is_none());
    r.uuid_pin = vec![n.gpus[0].uuid.clone()];
    assert_eq!(
        evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None))
            .unwrap()
            .gpus,
        vec![0]
    );
}

#[test]
fn topology_same_numa_and_pcie() {
    let mut n = node("a", 4);
    for (i, g) in n.gpus.iter_mut().enumerate() {
        g.numa = Some((i / 2) as u32);
        g.pcie_root = Some(format!("pci{}", i % 2));
    }
    take(&mut n, 0, 500);
    let mut r = Request::new(2, GpuShare::Whole);
    r.topology = Topology::SameNuma;
    let p = evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).unwrap();
    assert_eq!(p.gpus, vec![2, 3], "numa 0 has only one idle GPU");
    r.topology = Topology::SamePcieRoot;
    let p = evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).unwrap();
    assert_eq!(p.gpus, vec![1, 3], "pci1 holds GPUs 1 and 3");
    r.gpus = 3;
    assert!(evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).is_none());
    r.topology = Topology::Any;
    assert!(evaluate_node(0, &n, &r, Policy::BINPACK, &ctx(None)).is_some());
}

#[test]
fn gpu_level_binpack_and_spread() {
    let mut n = node("a", 3);
    take(&mut n, 1, 700);
    take(&mut n, 2, 300);
    let b = evaluate_node(0, &n, &frac(200), Policy::BINPACK, &ctx(None)).unwrap();
    assert_eq!(b.gpus, vec![1]);
    let s = evaluate_node(0, &n, &frac(200), Policy::SPREAD, &ctx(None)).unwrap();
    assert_eq!(s.gpus, vec![0]);
}

#[test]
fn node_level_binpack_and_spread() {
    let mut inv = Inventory {
        nodes: vec![node("a", 2), node("b", 2)],
    };
    take(&mut inv.nodes[1], 0, 500);
    let r = frac(200);
    assert_eq!(
        choose(&inv, &r, Policy::BINPACK, &ctx(None), 0)
            .unwrap()
            .node,
        1
    );
    assert_eq!(
        choose(&inv, &r, Policy::SPREAD, &ctx(None), 0)
            .unwrap()
            .node,
        0
    );
    let mixed: Policy = "spread/binpack".parse().unwrap();
    assert_eq!(choose(&inv, &r, mixed, &ctx(None), 0).unwrap().node, 0);
}

#[test]
fn bestfit_prefers_the_tightest_node() {
    let mut inv = Inventory {
        nodes: vec![node("a", 8), node("b", 8)],
    };
    for g in 0..6 {
        take(&mut inv.nodes[0], g, 1000);
    }
    let p = choose(
        &inv,
        &Request::new(1, GpuShare::Whole),
        Policy::BESTFIT,
        &ctx(None),
        0,
    );
    assert_eq!(p.unwrap().node, 0);
}

fn workload() -> Workload {
    // Half the pods want 470 milli, half a whole GPU.
    Workload::from_pods(
        [(1000, 0, 1, 470), (1000, 0, 1, 1000)],
        1.0,
        Weighting::Count,
    )
}

#[test]
fn frag_policies_fill_the_matching_hole() {
    // GPU 0 has 530 free: a 470 pod fits it and leaves 60; on an idle GPU it would leave
    // 530 that no whole-GPU pod can use.
    let mut n = node("a", 2);
    take(&mut n, 0, 470);
    let w = workload();
    for p in [Policy::FGD, Policy::FRAGAWARE] {
        let pl = evaluate_node(0, &n, &frac(470), p, &ctx(Some(&w))).unwrap();
        assert_eq!(pl.gpus, vec![0], "{p}");
    }
    // Across nodes: the node with the hole beats an idle node.
    let inv = Inventory {
        nodes: vec![node("idle", 2), n],
    };
    for p in [Policy::FGD, Policy::FRAGAWARE] {
        assert_eq!(
            choose(&inv, &frac(470), p, &ctx(Some(&w)), 7).unwrap().node,
            1
        );
    }
}

#[test]
fn frag_measure_counts_unusable_capacity() {
    let w = workload();
    let mut n = node("a", 2);
    assert_eq!(frag::node_frag(&n, &w, false), 0.0);
    take(&mut n, 0, 470);
    // 530 free on GPU 0 is unusable by whole-GPU pods (weight 0.5).
    assert!((frag::node_frag(&n, &w, false) - 265.0).abs() < 1e-9);
    // Without CPU every kind is blocked: all 1530 free milli count.
    n.cpu_milli_free = Some(0);
    assert!((frag::node_frag(&n, &w, false) - 1530.0).abs() < 1e-9);
}

#[test]
fn fragaware_counts_host_memory_fgd_does_not() {
    let w = Workload::from_pods([(0, 1024, 1, 1000)], 1.0, Weighting::Count);
    let mut n = node("a", 1);
    n.memory_mib_free = Some(10);
    assert_eq!(frag::node_frag(&n, &w, false), 0.0);
    assert_eq!(frag::node_frag(&n, &w, true), 1000.0);
}

#[test]
fn workload_coverage_and_weights() {
    let pods = (0..10)
        .map(|i| {
            if i < 6 {
                (1, 0, 1, 500)
            } else {
                (1, 0, 1, 1000)
            }
        })
        .chain([(1, 0, 0, 0)]);
    let w = Workload::from_pods(pods.clone(), 0.5, Weighting::Count);
    assert_eq!(w.types.len(), 1);
    assert_eq!(w.types[0].milli, 500);
    let w = Workload::from_pods(pods.clone(), 1.0, Weighting::Count);
    assert_eq!(w.types.len(), 3);
    assert!((w.types.iter().map(|t| t.weight).sum::<f64>() - 1.0).abs() < 1e-12);
    let g = Workload::from_pods(pods.clone(), 1.0, Weighting::GpuDemand);
    let cpu = g.types.iter().find(|t| t.gpus == 0).unwrap();
    assert_eq!(cpu.weight, 0.0);
    let whole = g.types.iter().find(|t| t.milli == 1000).unwrap();
    assert!((whole.weight - 4000.0 / 7000.0).abs() < 1e-12);
    let d = Workload::from_pods(pods, 1.0, Weighting::PerGpu);
    let whole = d.types.iter().find(|t| t.milli == 1000).unwrap();
    assert!((whole.weight - 0.4).abs() < 1e-12);
}

#[test]
fn choose_reports_no_fit_and_invalid() {
    let inv = Inventory {
        nodes: vec![node("a", 1)],
    };
    assert_eq!(
        choose(
            &inv,
            &Request::new(2, GpuShare::Whole),
            Policy::BINPACK,
            &ctx(None),
            0
        ),
        Err(NoFit::Insufficient { nodes: 1 })
    );
    assert!(matches!(
        choose(&inv, &frac(0), Policy::BINPACK, &ctx(None), 0),
        Err(NoFit::Invalid(_))
    ));
}

#[test]
fn ties_are_broken_by_the_salt_deterministically() {
    let inv = Inventory {
        nodes: (0..16).map(|i| node(&format!("n{i}"), 1)).collect(),
    };
    let r = frac(100);
    let picks: Vec<usize> = (0..32)
        .map(|s| {
            choose(&inv, &r, Policy::BINPACK, &ctx(None), s)
                .unwrap()
                .node
        })
        .collect();
    let again: Vec<usize> = (0..32)
        .map(|s| {
            choose(&inv, &r, Policy::BINPACK, &ctx(None), s)
                .unwrap()
                .node
        })
        .collect();
    assert_eq!(picks, again);
    let distinct: std::collections::BTreeSet<_> = picks.iter().collect();
    assert!(distinct.len() > 4, "salts spread ties: {picks:?}");
}

#[test]
fn policy_names_round_trip() {
    for (name, p) in Policy::ALL {
        assert_eq!(name.parse::<Policy>().unwrap(), p);
        assert_eq!(p.to_string(), name);
    }
    let p: Policy = "binpack/spread".parse().unwrap();
    assert_eq!(p.to_string(), "binpack/spread");
    assert!("packing".parse::<Policy>().is_err());
}

#[test]
fn gpupacking_scores_the_papers_tiers() {
    let idle8 = node("idle8", 8);
    let idle2 = node("idle2", 2);
    let mut used = node("used", 8);
    take(&mut used, 0, 500);
    let whole = Request::new(1, GpuShare::Whole);
    let s = |n: &Node, r: &Request| {
        evaluate_node(0, n, r, Policy::GPUPACKING, &ctx(None))
            .unwrap()
            .score
    };
    // Idle nodes: max(33 − GPUs, GPUs), the smaller node first.
    assert_eq!(s(&idle8, &whole), 25.0);
    assert_eq!(s(&idle2, &whole), 31.0);
    // A used node that must give an idle GPU: 50 − 1.
    assert_eq!(s(&used, &whole), 49.0);
    // A shared GPU (50 % free): 100 − 50 / 10; the pod takes that GPU.
    assert_eq!(s(&used, &frac(300)), 95.0);
    let p = evaluate_node(0, &used, &frac(300), Policy::GPUPACKING, &ctx(None)).unwrap();
    assert_eq!(p.gpus, vec![0]);
    // Pods without GPUs score the minimum everywhere (the tie order decides).
    let cpu = Request::new(0, GpuShare::Whole);
    assert_eq!(s(&idle8, &cpu), 0.0);
    assert_eq!(s(&used, &cpu), 0.0);
    assert_eq!("gpupacking".parse::<Policy>().unwrap(), Policy::GPUPACKING);
    assert_eq!(Policy::GPUPACKING.to_string(), "gpupacking");
}

#[test]
fn fragaware_ranks_at_fgd_resolution() {
    // Scores are whole multiples of the resolution: gradients closer than 40 milli-GPU
    // tie and the caller's node order decides.
    let w = workload();
    let mut n = node("a", 4);
    take(&mut n, 0, 470);
    take(&mut n, 1, 200);
    for r in [frac(470), frac(100), Request::new(1, GpuShare::Whole)] {
        let p = evaluate_node(0, &n, &r, Policy::FRAGAWARE, &ctx(Some(&w))).unwrap();
        let k = p.score / frag::GRADIENT_RESOLUTION;
        assert_eq!(k, k.round(), "{r:?}: {}", p.score);
    }
}

#[test]
fn fragaware_puts_cpu_only_pods_where_fewest_gpus_are_free() {
    // Three nodes with room for the pod's CPU: all 8 GPUs free, 2 free, none free. A pod
    // without GPUs can only strand GPUs of its own node, so it goes to the full node; FGD's
    // gradient is 0 on all three (no kind's CPU threshold is crossed) and leaves it to the
    // tie order.
    let w = workload();
    let mut two = node("two", 8);
    for g in 0..6 {
        take(&mut two, g, 1000);
    }
    let mut full = node("full", 8);
    for g in 0..8 {
        take(&mut full, g, 1000);
    }
    let mut cpu = Request::new(0, GpuShare::Whole);
    cpu.cpu_milli = 8_000;
    let inv = Inventory {
        nodes: vec![node("idle", 8), two.clone(), full],
    };
    for salt in 0..16 {
        let p = choose(&inv, &cpu, Policy::FRAGAWARE, &ctx(Some(&w)), salt).unwrap();
        assert_eq!(p.node, 2, "salt {salt}");
        assert!(p.gpus.is_empty());
    }
    let fgd: Vec<f64> = evaluate(&inv, &cpu, Policy::FGD, &ctx(Some(&w)))
        .iter()
        .map(|p| p.score)
        .collect();
    assert!(fgd.windows(2).all(|x| x[0] == x[1]), "{fgd:?}");
    // Without the full node: the one with 2 free GPUs, not the idle one.
    let inv = Inventory {
        nodes: vec![node("idle", 8), two],
    };
    for salt in 0..16 {
        let p = choose(&inv, &cpu, Policy::FRAGAWARE, &ctx(Some(&w)), salt).unwrap();
        assert_eq!(p.node, 1, "salt {salt}");
    }
    // A node without the CPU is not a candidate however full it is.
    let mut starved = node("starved", 1);
    take(&mut starved, 0, 1000);
    starved.cpu_milli_free = Some(1_000);
    let inv = Inventory {
        nodes: vec![starved, node("idle", 8)],
    };
    assert_eq!(
        choose(&inv, &cpu, Policy::FRAGAWARE, &ctx(Some(&w)), 3)
            .unwrap()
            .node,
        1
    );
}

#[test]
fn mean_gpu_pod_and_host_starved_capacity() {
    // Half the pods want a whole GPU with 3 cores and 4 GiB, half no GPU with 8 cores: the
    // average GPU pod brings 3 milli-CPU and 4.096 MiB per milli-GPU, and weighs 0.5.
    let w = Workload::from_pods(
        [(3_000, 4_096, 1, 1000), (8_000, 0, 0, 0)],
        1.0,
        Weighting::Count,
    );
    let mean = MeanGpuPod::of(&w);
    assert!((mean.cpu_per_milli - 3.0).abs() < 1e-12);
    assert!((mean.memory_per_milli - 4.096).abs() < 1e-12);
    assert!((mean.weight - 0.5).abs() < 1e-12);
    // 4 idle GPUs and 12 cores: exactly fed. Only the CPU-only kind's share counts (FGD's
    // measure: 0.5 × 4000).
    let mut n = node("a", 4);
    n.cpu_milli_free = Some(12_000);
    assert_eq!(frag::node_frag(&n, &w, true), 2000.0);
    assert_eq!(frag::fragaware_frag(&n, &w), 2000.0);
    // 6 cores feed 2 of the 4 GPUs: 2000 milli-GPU starved, weighted 0.5. No kind is blocked
    // yet (6 cores ≥ 3), so FGD's measure does not move.
    n.cpu_milli_free = Some(6_000);
    assert_eq!(frag::node_frag(&n, &w, true), 2000.0);
    assert_eq!(frag::fragaware_frag(&n, &w), 3000.0);
    // Memory starves the same way: 4096 MiB feed one GPU.
    n.cpu_milli_free = Some(12_000);
    n.memory_mib_free = Some(4_096);
    assert_eq!(frag::fragaware_frag(&n, &w), 3500.0);
    // Unknown host resources feed everything.
    let bare = Node::new("b", node("x", 4).gpus);
    assert_eq!(
        frag::fragaware_frag(&bare, &w),
        frag::node_frag(&bare, &w, true)
    );
    // A workload without GPU pods has no average GPU pod.
    let cpu_only = Workload::from_pods([(8_000, 0, 0, 0)], 1.0, Weighting::Count);
    assert_eq!(MeanGpuPod::of(&cpu_only).weight, 0.0);
}

#[test]
fn fragaware_keeps_the_host_of_a_cpu_poor_node_for_its_gpus() {
    // Every GPU pod of the workload wants a whole GPU and 3 cores. A sharing pod with 6
    // cores fits both nodes; on the 12-core node it leaves 6 cores for 3.5 free GPUs, which
    // feed only 2 of them; on the 64-core node nothing is starved. No kind's CPU threshold
    // is crossed on either node, so FGD scores them the same and leaves it to the tie order.
    let w = Workload::from_pods([(3_000, 0, 1, 1000)], 1.0, Weighting::Count);
    let mut poor = node("poor", 4);
    poor.cpu_milli_total = Some(12_000);
    poor.cpu_milli_free = Some(12_000);
    let rich = node("rich", 4);
    let mut pod = frac(500);
    pod.cpu_milli = 6_000;
    let inv = Inventory {
        nodes: vec![poor, rich],
    };
    let fgd: Vec<f64> = evaluate(&inv, &pod, Policy::FGD, &ctx(Some(&w)))
        .iter()
        .map(|p| p.score)
        .collect();
    assert_eq!(fgd.len(), 2);
    assert_eq!(fgd[0], fgd[1]);
    let fa = evaluate(&inv, &pod, Policy::FRAGAWARE, &ctx(Some(&w)));
    // 500 fragmented on either node (the half GPU no kind can use), plus 1500 starved on
    // the poor one; gradients rounded down to the 40 milli-GPU band.
    assert_eq!(fa[0].score, -2000.0);
    assert_eq!(fa[1].score, -520.0);
    for salt in 0..16 {
        let p = choose(&inv, &pod, Policy::FRAGAWARE, &ctx(Some(&w)), salt).unwrap();
        assert_eq!(p.node, 1, "salt {salt}");
    }
}

/// Two one-GPU nodes, one A100 and one T4, and a workload where `t4_share` of the GPU
/// demand is pinned to T4 (whole GPUs) and the rest unpinned.
fn pinned_cluster(t4_share: f64) -> (Inventory, Workload) {
    let a = node("a100", 1);
    let mut t = node("t4", 1);
    t.gpus[0].model = "T4".into();
    let kind = |model_set, weight| frag::WorkloadType {
        cpu_milli: 1000,
        memory_mib: 0,
        gpus: 1,
        milli: 1000,
        weight,
        model_set,
    };
    let w = Workload {
        types: vec![kind(0, 1.0 - t4_share), kind(1, t4_share)],
        model_sets: vec![vec!["T4".into()]],
        pressure: Vec::new(),
    };
    (Inventory { nodes: vec![a, t] }, w)
}

#[test]
fn model_pressure_is_zero_while_the_pinned_models_have_room() {
    // 10 % of demand on half the capacity: 0.1 × 2000 / 1000 = 0.2, under the threshold.
    let (inv, mut w) = pinned_cluster(0.1);
    w.set_pressure(&inv);
    assert_eq!(w.pressure_on("T4"), 0.0);
    assert_eq!(w.pressure_on("A100"), 0.0);
}

#[test]
fn model_pressure_charges_an_oversubscribed_model_and_steers_unpinned_pods() {
    let (inv, mut w) = pinned_cluster(0.8);
    let r = frac(500);
    assert!(w.set_pressure(&inv), "a new charge is a change");
    // 0.8 × 2000 / 1000 = 1.6: far over the threshold, capped at 1.
    assert_eq!(w.pressure_on("T4"), 1.0);
    assert_eq!(w.pressure_on("A100"), 0.0);
    for salt in 0..32 {
        assert_eq!(
            choose(&inv, &r, Policy::FRAGAWARE, &ctx(Some(&w)), salt)
                .unwrap()
                .node,
            0,
            "salt {salt}: the unpinned pod must leave the T4 to the pinned ones"
        );
    }
    assert!(!w.set_pressure(&inv), "same inventory: no change");
    // 20 % on half: 0.2 × 2000 / 1000 = 0.4, charged 3 × 0.15; once the A100 is nearly
    // full, 0.2 × 1100 / 1000 = 0.22 is under the threshold and the charge goes.
    let (inv, mut w) = pinned_cluster(0.2);
    w.set_pressure(&inv);
    assert!((w.pressure_on("T4") - 0.45).abs() < 1e-9);
    let mut full = inv.clone();
    take(&mut full.nodes[0], 0, 900);
    assert!(w.set_pressure(&full));
    assert_eq!(w.pressure_on("T4"), 0.0);
}

#[test]
fn model_pressure_is_equal_where_pins_follow_capacity() {
    let (inv, mut w) = pinned_cluster(0.4);
    w.types.push(frag::WorkloadType {
        model_set: 2,
        ..w.types[1]
    });
    w.types[0].weight = 0.2;
    w.model_sets.push(vec!["A100".into()]);
    w.set_pressure(&inv);
    assert!(w.pressure_on("T4") > 0.0);
    assert!((w.pressure_on("T4") - w.pressure_on("A100")).abs() < 1e-12);
}

/// [`ctx`] with the usage-aware term at `weight`.
fn usage_ctx(w: Option<&Workload>, weight: f64) -> ScoreContext<'_> {
    ScoreContext {
        usage_weight: weight,
        ..ctx(w)
    }
}

/// A one-GPU request of `milli` memory and `cores` percent of the SMs.
fn cores_req(milli: u32, cores: u32) -> Request {
    Request {
        cores: Some(cores),
        ..frac(milli)
    }
}

#[test]
fn usage_term_prefers_the_less_loaded_of_two_equal_nodes_only_when_on() {
    // Two nodes alike in every grant; node a's GPU runs at 90 %, node b's at 20 %.
    let mut inv = Inventory {
        nodes: vec![node("a", 1), node("b", 1)],
    };
    for (n, load) in inv.nodes.iter_mut().zip([90, 20]) {
        take(n, 0, 200);
        n.gpus[0].cores_free = 70;
        n.gpus[0].measured_load = Some(load);
    }
    let req = cores_req(100, 30);
    for policy in [Policy::BINPACK, Policy::SPREAD, Policy::FRAGAWARE] {
        let w = workload();
        let off = choose(&inv, &req, policy, &usage_ctx(Some(&w), 0.0), 0).unwrap();
        let on = choose(&inv, &req, policy, &usage_ctx(Some(&w), 1.0), 0).unwrap();
        assert_eq!(off.node, 0, "{policy}: off, the fixed node order decides");
        assert_eq!(on.node, 1, "{policy}: on, the node with headroom wins");
        // 100 − 20 − 30 = 50 points of headroom: the term is 0.5.
        assert!((on.score - off.score - 0.5).abs() < 1e-12, "{policy}");
    }
}

#[test]
fn usage_term_swaps_a_gpu_only_for_one_the_policy_cannot_tell_apart() {
    // GPUs 0 and 1 alike by grants, 0 busy; GPU 2 idle by grants and unmeasured.
    let mut n = node("a", 3);
    for i in 0..2 {
        take(&mut n, i, 300);
    }
    n.gpus[0].measured_load = Some(95);
    n.gpus[1].measured_load = Some(10);
    let req = cores_req(200, 20);
    let off = evaluate_node(0, &n, &req, Policy::BINPACK, &usage_ctx(None, 0.0)).unwrap();
    assert_eq!(off.gpus, [0]);
    let on = evaluate_node(0, &n, &req, Policy::BINPACK, &usage_ctx(None, 1.0)).unwrap();
    assert_eq!(on.gpus, [1], "the twin with headroom");
    // A GPU that differs by its grants is not a twin: with GPU 1 fuller than GPU 0,
    // binpack keeps GPU 1 whatever the loads say.
    take(&mut n, 1, 100);
    n.gpus[1].measured_load = Some(99);
    n.gpus[0].measured_load = Some(0);
    let on = evaluate_node(0, &n, &req, Policy::BINPACK, &usage_ctx(None, 100.0)).unwrap();
    assert_eq!(on.gpus, [1]);
}

#[test]
fn usage_term_never_places_where_the_grants_do_not_fit() {
    // Node a: an idle, measured GPU whose memory is all granted. Node b: a busy GPU
    // that fits. However large the weight, the claim goes to b.
    let mut a = node("a", 1);
    a.gpus[0].memory_free = 0;
    a.gpus[0].measured_load = Some(0);
    let mut b = node("b", 1);
    b.gpus[0].measured_load = Some(100);
    let inv = Inventory { nodes: vec![a, b] };
    let req = cores_req(500, 50);
    let p = choose(&inv, &req, Policy::BINPACK, &usage_ctx(None, 1e9), 0).unwrap();
    assert_eq!((p.node, p.gpus.as_slice()), (1, &[0][..]));
    // The term is negative there (100 − 100 − 50 → −0.5) and still the claim is placed.
    assert!(p.score < 0.0);
    // A request that fits nowhere still fits nowhere.
    let big = cores_req(1000, 100);
    let mut full = inv.clone();
    full.nodes[1].gpus[0].cores_free = 10;
    assert!(choose(&full, &big, Policy::BINPACK, &usage_ctx(None, 1e9), 0).is_err());
}

#[test]
fn usage_term_scale_clamps_and_unknown_is_neutral() {
    let mut g = Gpu::new("gpu-0", "A100", 80 * GIB);
    let req = cores_req(100, 30);
    assert_eq!(load::headroom(&g, &req), None);
    assert_eq!(load::gpu_term(&g, &req), 0.0);
    g.measured_load = Some(20);
    assert_eq!(load::headroom(&g, &req), Some(50));
    assert_eq!(load::gpu_term(&g, &req), 0.5);
    // Two claims' samples can sum past 100: the term stops at −1.
    g.measured_load = Some(180);
    assert_eq!(load::headroom(&g, &req), Some(-110));
    assert_eq!(load::gpu_term(&g, &req), -1.0);
    // A request without a core quota asks for no headroom beyond the load.
    g.measured_load = Some(0);
    assert_eq!(load::gpu_term(&g, &frac(100)), 1.0);
}

mod usage_off {
    use super::*;
    use proptest::prelude::*;

    /// A random node: up to 4 GPUs, each with some memory and cores granted (from few
    /// values, so that GPUs alike by their grants are common) and a measured load or none.
    fn arb_node() -> impl Strategy<Value = Vec<(u32, u32, Option<u16>)>> {
        let gpu = (
            (0u32..5).prop_map(|k| k * 250),
            (0u32..4).prop_map(|k| k * 30),
            proptest::option::of(0u16..=150),
        );
        proptest::collection::vec(gpu, 1..5)
    }

    fn inventory(nodes: &[Vec<(u32, u32, Option<u16>)>], measured: bool) -> Inventory {
        Inventory {
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(k, gpus)| {
                    let mut n = node(&format!("n{k}"), gpus.len());
                    for (g, &(milli, cores, load)) in n.gpus.iter_mut().zip(gpus) {
                        g.memory_free = g.memory_total / 1000 * u64::from(1000 - milli);
                        g.cores_free = 100 - cores;
                        g.measured_load = if measured { load } else { None };
                    }
                    n
                })
                .collect(),
        }
    }

    proptest! {
        #[test]
        fn weight_zero_places_exactly_as_without_the_term(
            nodes in proptest::collection::vec(arb_node(), 1..6),
            milli in 1u32..=1000,
            cores in proptest::option::of(0u32..=100),
            gpus in 1u32..=2,
        ) {
            let req = Request { cores, ..Request::new(gpus, GpuShare::Fraction { milli }) };
            let measured = inventory(&nodes, true);
            let unmeasured = inventory(&nodes, false);
            let w = workload();
            for (_, policy) in Policy::ALL {
                let with = choose(&measured, &req, policy, &usage_ctx(Some(&w), 0.0), 7);
                let without = choose(&unmeasured, &req, policy, &usage_ctx(Some(&w), 0.0), 7);
                match (with, without) {
                    (Ok(a), Ok(b)) => {
                        prop_assert_eq!(&a.gpus, &b.gpus);
                        prop_assert_eq!(a.node, b.node);
                        prop_assert_eq!(a.score.to_bits(), b.score.to_bits());
                    }
                    (a, b) => prop_assert_eq!(a.is_err(), b.is_err()),
                }
                // On, the choice still fits by its grants.
                if let Ok(p) = choose(&measured, &req, policy, &usage_ctx(Some(&w), 5.0), 7) {
                    for &g in &p.gpus {
                        prop_assert!(req.gpu_fits(&measured.nodes[p.node].gpus[g]));
                    }
                }
            }
        }
    }
}

/// The allocation-free evaluation against straightforward references: the model match
/// against lowercasing both strings, the topology grouping against grouping GPUs by their
/// group's name as a string (the code before the per-thread scratch), and every
/// evaluation on a thread that has evaluated other nodes before against one with a fresh
/// scratch.
mod scratch_and_references {
    use super::*;
    use proptest::prelude::*;

    fn reference_model_matches(model: &str, pattern: &str) -> bool {
        model
            .to_ascii_lowercase()
            .contains(&pattern.to_ascii_lowercase())
    }

    /// `pick_gpus` as it was: each GPU's group as an owned string, groups in order of
    /// their first member, members collected per group.
    fn reference_pick_gpus(
        node: &Node,
        req: &Request,
        fit: &[usize],
        gpu: GpuPolicy,
    ) -> Option<Vec<usize>> {
        let k = req.gpus as usize;
        let mut order: Vec<usize> = fit.to_vec();
        let key = |i: &usize| node.gpus[*i].free_milli();
        match gpu {
            GpuPolicy::Binpack => order.sort_by_key(|i| (key(i), *i)),
            GpuPolicy::Spread => order.sort_by_key(|i| (std::cmp::Reverse(key(i)), *i)),
        }
        if req.topology == Topology::Any {
            order.truncate(k);
            return Some(order);
        }
        let group_of = |i: usize| -> Option<String> {
            let g = &node.gpus[i];
            match req.topology {
                Topology::SameNuma => g.numa.map(|n| n.to_string()),
                _ => g.pcie_root.clone(),
            }
        };
        let free_of = |members: &[usize]| -> u64 {
            let first = group_of(members[0]);
            (0..node.gpus.len())
                .filter(|&j| group_of(j) == first)
                .map(|j| u64::from(node.gpus[j].free_milli()))
                .sum()
        };
        let mut seen: Vec<String> = Vec::new();
        let mut best: Option<Vec<usize>> = None;
        for &i in &order {
            let Some(grp) = group_of(i) else { continue };
            if seen.contains(&grp) {
                continue;
            }
            let members: Vec<usize> = order
                .iter()
                .copied()
                .filter(|&j| group_of(j).as_deref() == Some(grp.as_str()))
                .take(k)
                .collect();
            seen.push(grp);
            if members.len() == k {
                let better = match (&best, gpu) {
                    (None, _) => true,
                    (Some(b), GpuPolicy::Binpack) => free_of(&members) < free_of(b),
                    (Some(_), GpuPolicy::Spread) => false,
                };
                if better {
                    best = Some(members);
                }
            }
        }
        best
    }

    const MODELS: [&str; 4] = [
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA H100 80GB HBM3",
        "Tesla T4",
        "L40S",
    ];

    /// A random GPU: model, free milli (in steps, so that equal levels are common), NUMA
    /// node, PCIe root, health.
    type ArbGpu = (usize, u32, Option<u32>, Option<u8>, bool);

    fn arb_gpu() -> impl Strategy<Value = ArbGpu> {
        (
            0..MODELS.len(),
            (0u32..=8).prop_map(|k| k * 125),
            proptest::option::of(0u32..3),
            proptest::option::of(0u8..3),
            proptest::bool::weighted(0.9),
        )
    }

    /// Nodes of 1 to 9 GPUs (so that a node larger than the one before grows the scratch,
    /// and a smaller one must not see the larger one's leftovers), with host CPU and memory.
    fn arb_nodes() -> impl Strategy<Value = Vec<(Vec<ArbGpu>, u64, u64)>> {
        proptest::collection::vec(
            (
                proptest::collection::vec(arb_gpu(), 1..10),
                0u64..64_000,
                0u64..256_000,
            ),
            1..7,
        )
    }

    fn build(nodes: &[(Vec<ArbGpu>, u64, u64)]) -> Inventory {
        Inventory {
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(k, (gpus, cpu, mem))| {
                    let mut n = node(&format!("n{k}"), gpus.len()).with_host(64_000, 256_000);
                    n.cpu_milli_free = Some(*cpu);
                    n.memory_mib_free = Some(*mem);
                    for (g, &(model, free, numa, root, healthy)) in n.gpus.iter_mut().zip(gpus) {
                        g.model = MODELS[model].into();
                        g.memory_free = g.memory_total / 1000 * u64::from(free);
                        g.numa = numa;
                        g.pcie_root = root.map(|r| format!("pci{r}"));
                        g.healthy = healthy;
                    }
                    n
                })
                .collect(),
        }
    }

    /// A workload with unpinned kinds, kinds pinned to A100 and to H100|L40S, and one
    /// without GPUs; the model charge set from `inv`.
    fn pinned_workload(inv: &Inventory) -> Workload {
        let kind = |cpu_milli, memory_mib, gpus, milli, weight, model_set| frag::WorkloadType {
            cpu_milli,
            memory_mib,
            gpus,
            milli,
            weight,
            model_set,
        };
        let mut w = Workload {
            types: vec![
                kind(4000, 16_000, 1, 250, 0.3, 0),
                kind(8000, 32_000, 1, 1000, 0.2, 0),
                kind(16_000, 64_000, 2, 1000, 0.1, 0),
                kind(2000, 8000, 1, 500, 0.15, 1),
                kind(12_000, 48_000, 1, 1000, 0.15, 2),
                kind(1000, 4000, 0, 0, 0.1, 0),
            ],
            model_sets: vec![vec!["a100".into()], vec!["H100".into(), "l40s".into()]],
            pressure: Vec::new(),
        };
        w.set_pressure(inv);
        w
    }

    fn same(a: &Option<Placement>, b: &Option<Placement>) -> Result<(), TestCaseError> {
        match (a, b) {
            (Some(a), Some(b)) => {
                prop_assert_eq!(&a.gpus, &b.gpus);
                prop_assert_eq!(a.score.to_bits(), b.score.to_bits());
            }
            (a, b) => prop_assert_eq!(a.is_some(), b.is_some()),
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn model_match_is_a_case_blind_substring_test(
            model in "[a-zA-Z0-9 äÄé-]{0,12}",
            pattern in "[a-zA-Z0-9 äÄé-]{0,4}",
        ) {
            prop_assert_eq!(
                model_matches(&model, &pattern),
                reference_model_matches(&model, &pattern)
            );
            // A pattern cut from the model, in the other case, always matches.
            let cut: String = model.chars().take(3).collect();
            prop_assert!(model_matches(&model, &cut.to_ascii_uppercase()));
        }

        #[test]
        fn pick_gpus_groups_as_the_string_grouping_did(
            nodes in arb_nodes(),
            k in 1u32..=4,
            numa in any::<bool>(),
        ) {
            let inv = build(&nodes);
            let mut req = Request::new(k, GpuShare::Fraction { milli: 125 });
            req.topology = if numa { Topology::SameNuma } else { Topology::SamePcieRoot };
            for n in &inv.nodes {
                let fit: Vec<usize> =
                    (0..n.gpus.len()).filter(|&i| req.gpu_fits(&n.gpus[i])).collect();
                for gpu in [GpuPolicy::Binpack, GpuPolicy::Spread] {
                    prop_assert_eq!(
                        pick_gpus(n, &req, &fit, gpu),
                        reference_pick_gpus(n, &req, &fit, gpu)
                    );
                }
            }
        }

        #[test]
        fn an_evaluation_does_not_depend_on_the_ones_before_it(
            nodes in arb_nodes(),
            gpus in 0u32..=3,
            milli in prop_oneof![Just(1000u32), 1u32..1000],
            topology in prop_oneof![
                Just(Topology::Any),
                Just(Topology::SameNuma),
                Just(Topology::SamePcieRoot)
            ],
            include in proptest::option::of(Just("a100")),
            host in (0u64..20_000, 0u64..80_000),
        ) {
            let inv = build(&nodes);
            let w = pinned_workload(&inv);
            let mut req = Request::from_trace(host.0, host.1, gpus, milli);
            req.topology = topology;
            req.model_include = include.iter().map(|m| m.to_string()).collect();
            for (_, policy) in Policy::ALL {
                for c in [ctx(Some(&w)), ctx(None)] {
                    for (i, n) in inv.nodes.iter().enumerate() {
                        // This thread's scratch holds what the nodes before left in it; a
                        // nested call gets a fresh one.
                        let reused = evaluate_node(i, n, &req, policy, &c);
                        let fresh = with_scratch(|_| evaluate_node(i, n, &req, policy, &c));
                        same(&reused, &fresh)?;
                    }
                }
            }
        }
    }
}
