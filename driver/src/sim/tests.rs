use super::*;

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
n0,32000,131072,2,T4\n\
n1,64000,262144,4,V100\n\
cpu,32000,131072,0,\n";

const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
p0,4000,8192,1,1000,\n\
p1,2000,4096,1,500,\n\
p2,2000,4096,1,500,\n\
p3,8000,8192,0,0,\n\
p4,8000,16384,2,1000,V100|A100\n";

#[test]
fn parses_and_builds_the_gpu_cluster() {
    let nodes = parse_nodes("nodes.csv", NODES).unwrap();
    assert_eq!(nodes.len(), 3);
    let inv = cluster(&nodes);
    assert_eq!(inv.nodes.len(), 2, "CPU-only nodes are left out");
    assert_eq!(inv.nodes[1].gpus.len(), 4);
    let pods = parse_pods("pods.csv", PODS).unwrap();
    assert_eq!(pods[4].gpu_spec, vec!["V100", "A100"]);
    assert_eq!(pods[1].total_milli(), 500);
}

#[test]
fn csv_errors_name_file_line_and_column() {
    let bad = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,abc,2,T4\n";
    let e = parse_nodes("nodes.csv", bad).unwrap_err();
    assert_eq!((e.file.as_str(), e.line, e.column_no), ("nodes.csv", 2, 3));
    assert_eq!(e.column, "memory_mib");
    assert!(
        e.to_string()
            .starts_with("nodes.csv:2: column 3 (memory_mib)"),
        "{e}"
    );
    let missing = "sn,cpu_milli,gpu,model\nn0,1,2,T4\n";
    let e = parse_nodes("nodes.csv", missing).unwrap_err();
    assert_eq!(e.column, "memory_mib");
    assert_eq!(e.line, 1);
    let short = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,2,3\n";
    let e = parse_pods("pods.csv", short).unwrap_err();
    assert_eq!(e.line, 2);
    let share = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,2,2,500\n";
    assert_eq!(
        parse_pods("pods.csv", share).unwrap_err().column,
        "gpu_milli"
    );
}

#[test]
fn inflates_to_the_tune_target_and_is_deterministic() {
    let pods = parse_pods("p", PODS).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let out = prepare_pods(&pods, 6000, 1.3, &mut rng);
    let total: u64 = out.iter().map(TracePod::total_milli).sum();
    assert!(total as f64 <= 1.3 * 6000.0 && total as f64 > 1.3 * 6000.0 - 2000.0);
    let mut rng2 = ChaCha8Rng::seed_from_u64(1);
    assert_eq!(out, prepare_pods(&pods, 6000, 1.3, &mut rng2));
    // Trimming when the trace is larger than the target.
    let mut rng3 = ChaCha8Rng::seed_from_u64(1);
    let t: u64 = prepare_pods(&pods, 1000, 1.0, &mut rng3)
        .iter()
        .map(TracePod::total_milli)
        .sum();
    assert!(t <= 1000);
}

#[test]
fn run_is_deterministic_and_respects_constraints() {
    let nodes = parse_nodes("n", NODES).unwrap();
    let pods = parse_pods("p", PODS).unwrap();
    for (name, policy) in Policy::ALL {
        let cfg = RunConfig {
            policy,
            seed: 42,
            tune: 1.3,
            online: false,
            as_controller: false,
            record: false,
        };
        let a = run(&nodes, &pods, cfg);
        assert_eq!(a, run(&nodes, &pods, cfg), "{name}");
        assert_eq!(a.total_gpus, 6);
        assert_eq!(a.alloc_by_arrived.len(), MAX_PERCENT + 1);
        for v in a.alloc_by_arrived.iter().flatten() {
            assert!((0.0..=100.0).contains(v), "{name}: {v}");
        }
        assert!(a.failed > 0, "{name}: 130 % of capacity cannot all fit");
    }
}

#[test]
fn discretises_like_the_artifact() {
    // 10 GPUs: arrived 10 % per step, 5 % allocated per step.
    let log: Vec<(u64, u64)> = (1..=13).map(|i| (i * 1000, i * 500)).collect();
    let d = discretise(&log, 10);
    assert_eq!(d[10], Some(5.0));
    assert_eq!(d[100], Some(50.0));
    assert_eq!(
        d[11],
        Some(5.0),
        "no row at 11: rows within ±1 (10) are used"
    );
    assert_eq!(d[15], None);
    assert_eq!(round_half_even(0.5), 0.0);
    assert_eq!(round_half_even(1.5), 2.0);
    assert_eq!(round_half_even(2.4), 2.0);
}

#[test]
fn output_row_matches_the_header_layout() {
    let nodes = parse_nodes("n", NODES).unwrap();
    let pods = parse_pods("p", PODS).unwrap();
    let r = run(
        &nodes,
        &pods,
        RunConfig {
            policy: Policy::FRAGAWARE,
            seed: 1,
            tune: 1.3,
            online: false,
            as_controller: false,
            record: false,
        },
    );
    let h = csv_header();
    let row = csv_row("w", "fragaware", 1.3, &r);
    assert_eq!(h.split(',').count(), row.split(',').count());
    assert!(h.starts_with("workload,sc_policy,tune,seed,total_gpus,0,1,"));
    assert!(h.ends_with(",129,130"));
    assert!(row.starts_with("w,fragaware,1.3,1,6,"));
    let mut fixed = r.clone();
    fixed.alloc_by_arrived = vec![Some(2.0), Some(0.25), None];
    assert_eq!(csv_row("w", "p", 1.3, &fixed), "w,p,1.3,1,6,2.0,0.25,");
}

#[test]
fn seeds_and_stats() {
    assert_eq!(parse_seeds("42-44,50").unwrap(), vec![42, 43, 44, 50]);
    assert!(parse_seeds("44-42").is_err());
    assert!(parse_seeds("x").is_err());
    let (m, sd) = mean_sd(&[1.0, 2.0, 3.0]);
    assert_eq!((m, sd), (2.0, 1.0));
}

#[test]
fn ties_go_to_one_node_order_for_the_whole_run() {
    // Two identical nodes. Under gpupacking, CPU-only pods tie everywhere (score 0) and
    // so do the two idle nodes for the GPU pod. With one node order per run (the
    // artifact's tie-break) the CPU pods pile onto the first node that fits and the GPU
    // pod, which needs 8 cores, always finds the other node free enough; with a fresh
    // random pick per pod the CPU pods would spread and the GPU pod would fail.
    let nodes = parse_nodes(
        "n.csv",
        "sn,cpu_milli,memory_mib,gpu,model\na,10000,65536,1,T4\nb,10000,65536,1,T4\n",
    )
    .unwrap();
    let pods = parse_pods(
        "p.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n\
         c0,3000,1024,0,0\nc1,3000,1024,0,0\nc2,3000,1024,0,0\ng0,8000,1024,1,1000\n",
    )
    .unwrap();
    for seed in 0..32 {
        let r = run(
            &nodes,
            &pods,
            RunConfig {
                policy: Policy::GPUPACKING,
                seed,
                tune: 0.0,
                online: false,
                as_controller: false,
                record: false,
            },
        );
        assert_eq!((r.pods, r.failed), (4, 0), "seed {seed}");
    }
}

fn pin_cluster() -> Vec<TraceNode> {
    // 30 G2 GPUs, 10 T4 GPUs: G2 has 3/4 of the capacity.
    let mut text = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
    for i in 0..3 {
        text.push_str(&format!("g{i},96000,786432,10,G2\n"));
    }
    for i in 0..5 {
        text.push_str(&format!("t{i},32000,131072,2,T4\n"));
    }
    parse_nodes("nodes.csv", &text).unwrap()
}

fn pin_pods(n: usize) -> Vec<TracePod> {
    (0..n)
        .map(|i| TracePod {
            name: format!("p{i}"),
            cpu_milli: 2000,
            memory_mib: 4096,
            num_gpu: u32::from(i % 10 != 0),
            gpu_milli: if i % 10 == 0 { 0 } else { 500 },
            gpu_spec: Vec::new(),
        })
        .collect()
}

#[test]
fn pin_models_pins_the_fraction_in_capacity_proportion_deterministically() {
    let nodes = pin_cluster();
    let pods = pin_pods(10_000);
    let gpu_pods = pods.iter().filter(|p| p.num_gpu > 0).count(); // 9,000
    let out = pin_models(&pods, &nodes, 0.2, 7);
    assert_eq!(
        out,
        pin_models(&pods, &nodes, 0.2, 7),
        "same seed, same list"
    );
    assert_ne!(
        out,
        pin_models(&pods, &nodes, 0.2, 8),
        "another seed, other pods"
    );
    let pinned: Vec<&TracePod> = out.iter().filter(|p| !p.gpu_spec.is_empty()).collect();
    assert_eq!(pinned.len(), (0.2 * gpu_pods as f64).round() as usize);
    assert!(
        pinned.iter().all(|p| p.num_gpu > 0),
        "CPU-only pods stay unpinned"
    );
    assert!(pinned.iter().all(|p| p.gpu_spec.len() == 1));
    let g2 = pinned.iter().filter(|p| p.gpu_spec[0] == "G2").count() as f64;
    let share = g2 / pinned.len() as f64;
    // 1,800 draws at p = 0.75: sd ≈ 0.010; a uniform draw over models would give 0.5.
    assert!((share - 0.75).abs() < 0.04, "G2 share {share}");
    // Only gpu_spec changes.
    for (a, b) in pods.iter().zip(&out) {
        assert_eq!(
            (&a.name, a.cpu_milli, a.num_gpu),
            (&b.name, b.cpu_milli, b.num_gpu)
        );
    }
}

#[test]
fn pin_models_only_pins_to_a_model_whose_nodes_can_hold_the_pod() {
    let nodes = pin_cluster();
    let mut pods = pin_pods(1_000);
    for p in pods.iter_mut().filter(|p| p.num_gpu > 0) {
        p.num_gpu = 4; // no T4 node has 4 GPUs
        p.gpu_milli = 1000;
    }
    let out = pin_models(&pods, &nodes, 0.5, 1);
    let pinned: Vec<&TracePod> = out.iter().filter(|p| !p.gpu_spec.is_empty()).collect();
    assert_eq!(pinned.len(), 450);
    assert!(pinned.iter().all(|p| p.gpu_spec == ["G2"]));
}

#[test]
fn a_pinned_kind_cannot_use_a_node_of_another_model() {
    use crate::engine::frag::{fragaware_frag, node_frag};
    use crate::engine::{Weighting, Workload};
    let inv = cluster(&pin_cluster());
    let g2 = &inv.nodes[0]; // 10 idle G2 GPUs
    let t4 = &inv.nodes[3]; // 2 idle T4 GPUs
    // One kind only: a 500-milli pod pinned to T4.
    let w = Workload::from_pinned_pods(
        [(2000, 4096, 1, 500, vec!["T4".to_string()])],
        1.0,
        Weighting::Count,
    );
    assert_eq!(w.types[0].model_set, 1);
    // FGD ("no access"): all of the G2 node's free capacity is fragmented for it; none of
    // the idle T4 node's is.
    assert_eq!(node_frag(g2, &w, false), 10_000.0);
    assert_eq!(node_frag(t4, &w, false), 0.0);
    // Unpinned, the same kind could use the G2 node.
    let any = Workload::from_pods([(2000, 4096, 1, 500)], 1.0, Weighting::Count);
    assert_eq!(node_frag(g2, &any, false), 0.0);
    // fragaware leaves the kind out of a node it cannot access (no reward for filling it).
    assert_eq!(fragaware_frag(g2, &w), 0.0);
    assert_eq!(fragaware_frag(t4, &w), 0.0);
}

fn cfg(policy: Policy, seed: u64) -> RunConfig {
    RunConfig {
        policy,
        seed,
        tune: 0.0,
        online: false,
        as_controller: false,
        record: true,
    }
}

#[test]
fn as_controller_breaks_ties_by_node_name_and_ignores_the_host() {
    // Four identical empty nodes, listed out of name order; one pod of a whole GPU whose
    // CPU fits none of them.
    let nodes = parse_nodes(
        "n.csv",
        "sn,cpu_milli,memory_mib,gpu,model\n\
         n-c,1000,1024,2,T4\nn-a,1000,1024,2,T4\nn-d,1000,1024,2,T4\nn-b,1000,1024,2,T4\n",
    )
    .unwrap();
    let pods = parse_pods(
        "p.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\ng,8000,1024,1,1000\ncpu-only,100,0,0,0\n",
    )
    .unwrap();
    let mut seen_elsewhere = false;
    for seed in 0..16 {
        let r = run(&nodes, &pods, cfg(Policy::BINPACK, seed));
        assert_eq!(
            (r.pods, r.failed),
            (2, 1),
            "seed {seed}: the GPU pod asks more CPU than any node has"
        );
        let live = run(
            &nodes,
            &pods,
            RunConfig {
                as_controller: true,
                ..cfg(Policy::BINPACK, seed)
            },
        );
        assert_eq!(live.pods, 1, "the CPU-only pod is left out");
        assert_eq!(live.failed, 0, "host CPU is not accounted");
        let p = &live.placements[0];
        assert_eq!((p.node.as_deref(), p.pod.cpu_milli), (Some("n-a"), 0));
        assert_eq!(p.gpus, ["gpu-0"]);
        // Without it, ties go to a per-seed order: not always the first name.
        let free = parse_pods(
            "p.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\ng,0,0,1,1000\n",
        )
        .unwrap();
        let r = run(&nodes, &free, cfg(Policy::BINPACK, seed));
        seen_elsewhere |= r.placements[0].node.as_deref() != Some("n-a");
    }
    assert!(seen_elsewhere, "the artifact's tie order is per seed");
}

#[test]
fn placements_list_every_arrival_in_order() {
    let nodes = parse_nodes("n", NODES).unwrap();
    let pods = parse_pods("p", PODS).unwrap();
    let r = run(
        &nodes,
        &pods,
        RunConfig {
            tune: 1.3,
            ..cfg(Policy::FRAGAWARE, 7)
        },
    );
    assert_eq!(r.placements.len(), r.pods);
    let failed = r.placements.iter().filter(|p| p.node.is_none()).count();
    assert_eq!(failed, r.failed);
    for p in r.placements.iter().filter(|p| p.node.is_some()) {
        assert_eq!(p.gpus.len() as u32, p.pod.num_gpu, "{p:?}");
    }
    let unrecorded = run(
        &nodes,
        &pods,
        RunConfig {
            tune: 1.3,
            record: false,
            ..cfg(Policy::FRAGAWARE, 7)
        },
    );
    assert!(unrecorded.placements.is_empty());
    assert_eq!(
        unrecorded.alloc_by_arrived, r.alloc_by_arrived,
        "recording changes nothing"
    );

    let row = placement_row(
        "fragaware",
        7,
        3,
        &Placed {
            pod: pods[4].clone(),
            node: Some("n1".into()),
            gpus: vec!["gpu-1".into(), "gpu-3".into()],
        },
    );
    assert_eq!(
        row,
        "fragaware,7,3,p4,8000,16384,2,1000,V100|A100,n1,gpu-1+gpu-3"
    );
    assert_eq!(row.split(',').count(), PLACEMENTS_HEADER.split(',').count());
    let none = placement_row(
        "binpack",
        1,
        0,
        &Placed {
            pod: pods[1].clone(),
            node: None,
            gpus: vec![],
        },
    );
    assert_eq!(none, "binpack,1,0,p1,2000,4096,1,500,,,");
}
