use super::*;
use crate::engine::{Gpu, GpuShare, Node, Placement, Request};
use proptest::prelude::*;

const MEM: u64 = 1000;

fn capacity() -> Inventory {
    Inventory {
        nodes: (0..3)
            .map(|n| {
                Node::new(
                    format!("n{n}"),
                    (0..2)
                        .map(|g| Gpu::new(format!("g{g}"), "T4", MEM))
                        .collect(),
                )
                .with_host(4000, 4096)
            })
            .collect(),
    }
}

#[derive(Clone, Debug)]
enum Op {
    Grant {
        node: usize,
        cpu: u64,
        mem: u64,
        devices: Vec<(usize, u64, u32)>,
    },
    Release(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            0..3usize,
            0..3000u64,
            0..3000u64,
            proptest::collection::vec((0..2usize, 0..700u64, 0..70u32), 0..3)
        )
            .prop_map(|(node, cpu, mem, devices)| Op::Grant {
                node,
                cpu,
                mem,
                devices
            }),
        (0..8usize).prop_map(Op::Release),
    ]
}

fn grant_of(i: usize, node: usize, cpu: u64, mem: u64, devices: &[(usize, u64, u32)]) -> Grant {
    Grant {
        id: format!("g{i}"),
        node: format!("n{node}"),
        cpu_milli: cpu,
        memory_mib: mem,
        devices: devices
            .iter()
            .map(|&(g, memory, cores)| DeviceGrant {
                gpu: format!("g{g}"),
                memory,
                cores,
            })
            .collect(),
    }
}

/// Usage recomputed from the live grants, checked against the capacity.
fn check_no_over_grant(l: &Ledger) {
    let cap = capacity();
    for (ni, n) in l.inventory().nodes.iter().enumerate() {
        let grants: Vec<&Grant> = l.grants().filter(|g| g.node == n.name).collect();
        let cpu: u64 = grants.iter().map(|g| g.cpu_milli).sum();
        let mem: u64 = grants.iter().map(|g| g.memory_mib).sum();
        assert!(cpu <= cap.nodes[ni].cpu_milli_total.unwrap());
        assert!(mem <= cap.nodes[ni].memory_mib_total.unwrap());
        assert_eq!(n.cpu_milli_free.unwrap(), 4000 - cpu);
        assert_eq!(n.memory_mib_free.unwrap(), 4096 - mem);
        for gpu in &n.gpus {
            let (m, c) = grants
                .iter()
                .flat_map(|g| &g.devices)
                .filter(|d| d.gpu == gpu.id)
                .fold((0, 0), |(m, c), d| (m + d.memory, c + d.cores));
            assert!(m <= MEM && c <= 100, "over-granted {}", gpu.id);
            assert_eq!(gpu.memory_free, MEM - m);
            assert_eq!(gpu.cores_free, 100 - c);
        }
    }
}

proptest! {
    #[test]
    fn replay_and_rebuild_agree(ops in proptest::collection::vec(op(), 0..40)) {
        let mut l = Ledger::new(capacity());
        for (i, o) in ops.iter().enumerate() {
            match o {
                Op::Grant { node, cpu, mem, devices } => {
                    let before = l.clone();
                    let g = grant_of(i, *node, *cpu, *mem, devices);
                    if l.grant(g.clone()).is_err() {
                        prop_assert_eq!(&l, &before, "a refused grant changes nothing");
                    } else {
                        // grant and release are exact inverses
                        let mut undo = l.clone();
                        prop_assert_eq!(undo.release(&g.id).unwrap(), g);
                        prop_assert_eq!(&undo, &before);
                    }
                }
                Op::Release(k) => {
                    let ids: Vec<String> = l.grants().map(|g| g.id.clone()).collect();
                    if !ids.is_empty() {
                        let id = &ids[k % ids.len()];
                        l.release(id).unwrap();
                    }
                }
            }
            check_no_over_grant(&l);
        }
        let live: Vec<Grant> = l.grants().cloned().collect();
        let rebuilt = Ledger::rebuild(capacity(), live.clone()).unwrap();
        prop_assert_eq!(&rebuilt, &l);
        // Rebuilding in another order gives the same state too.
        let rebuilt_rev = Ledger::rebuild(capacity(), live.into_iter().rev()).unwrap();
        prop_assert_eq!(&rebuilt_rev, &l);
        // Releasing everything gives the empty ledger back.
        let ids: Vec<String> = l.grants().map(|g| g.id.clone()).collect();
        for id in ids {
            l.release(&id).unwrap();
        }
        prop_assert_eq!(&l, &Ledger::new(capacity()));
    }
}

#[test]
fn refuses_over_grants_and_unknowns() {
    let mut l = Ledger::new(capacity());
    l.grant(grant_of(0, 0, 0, 0, &[(0, 600, 0)])).unwrap();
    let e = l.grant(grant_of(1, 0, 0, 0, &[(0, 401, 0)])).unwrap_err();
    assert!(
        matches!(
            e,
            LedgerError::OverGrant {
                wanted: 401,
                free: 400,
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        l.grant(grant_of(0, 1, 0, 0, &[])),
        Err(LedgerError::Duplicate(_))
    ));
    assert!(matches!(
        l.grant(grant_of(2, 0, 5000, 0, &[])),
        Err(LedgerError::OverGrant { .. })
    ));
    assert!(matches!(
        l.grant(grant_of(3, 0, 0, 0, &[(0, 1, 0), (0, 1, 0)])),
        Err(LedgerError::RepeatedGpu { .. })
    ));
    let mut bad = grant_of(4, 0, 0, 0, &[]);
    bad.node = "nope".into();
    assert!(matches!(l.grant(bad), Err(LedgerError::UnknownNode { .. })));
    assert!(matches!(
        l.release("nope"),
        Err(LedgerError::UnknownGrant(_))
    ));
}

#[test]
fn into_inventory_is_the_state_after_the_grants() {
    let mut l = Ledger::new(capacity());
    l.grant(grant_of(0, 0, 0, 0, &[(0, 600, 0)])).unwrap();
    let state = l.inventory().clone();
    let inv = l.into_inventory();
    assert_eq!(inv, state);
    assert_ne!(inv, capacity(), "the grant's memory is not free");
}

#[test]
fn grant_from_placement_takes_whole_gpus_entirely() {
    let mut l = Ledger::new(capacity());
    let req = Request::new(2, GpuShare::Whole);
    let p = Placement {
        node: 1,
        gpus: vec![0, 1],
        score: 0.0,
    };
    let g = Grant::from_placement("w", l.inventory(), &req, &p);
    l.grant(g).unwrap();
    let n = &l.inventory().nodes[1];
    assert!(
        n.gpus
            .iter()
            .all(|g| g.memory_free == 0 && g.cores_free == 0)
    );
    let half = Request::new(1, GpuShare::Fraction { milli: 500 });
    let p = Placement {
        node: 1,
        gpus: vec![0],
        score: 0.0,
    };
    let g = Grant::from_placement("h", l.inventory(), &half, &p);
    assert!(l.grant(g).is_err(), "a used GPU cannot take more");
}

#[test]
fn a_grant_is_the_kind_of_its_larger_share() {
    let gib = 1u64 << 30;
    let node = Node::new(
        "n",
        vec![
            Gpu::new("gpu-0", "H100", 80 * gib),
            Gpu::new("gpu-1", "H100", 40 * gib),
        ],
    );
    let dev = |gpu: &str, memory, cores| DeviceGrant {
        gpu: gpu.into(),
        memory,
        cores,
    };
    let grant = |devices| Grant {
        id: "g".into(),
        node: "n".into(),
        cpu_milli: 0,
        memory_mib: 0,
        devices,
    };
    assert_eq!(
        grant(vec![dev("gpu-0", 20 * gib, 0)]).kind_on(&node),
        Some((0, 0, 1, 250))
    );
    // The 40Gi GPU's 20Gi is the larger share; cores 30 % are 300.
    assert_eq!(
        grant(vec![dev("gpu-0", 20 * gib, 30), dev("gpu-1", 20 * gib, 0)]).kind_on(&node),
        Some((0, 0, 2, 500))
    );
    assert_eq!(grant(vec![dev("gpu-9", gib, 0)]).kind_on(&node), None);
}
