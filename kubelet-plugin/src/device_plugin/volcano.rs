//! The device plugin's Volcano mode (`--scheduler volcano`): Volcano's `deviceshare`
//! scheduler plugin, with vGPU on, places the pods instead of fgpu's extender, and the
//! plugin speaks its annotations ([`fgpu_api::volcano`]).
//!
//! * [`register_gpus`] and [`node_capacity`]: what the node offers, in the register
//!   annotation and as the node's `volcano.sh/vgpu-memory` and `volcano.sh/vgpu-cores`
//!   (the scheduler and the kubelet count them as pod resources against the node's).
//! * [`assignment`]: a pod's Volcano allocation as fgpu's [`PodAssignment`], after checking
//!   who wrote it, the node, and that it grants exactly what the pod's containers ask for.
//! * [`translate`]: the pods of the node as the legacy path's matching
//!   ([`super::pods::choose_with`], [`super::stale_claims`]) reads them: each pod carries
//!   its translated allocation under fgpu's decision annotation, and nothing else does.
//!
//! See `docs/platforms.md` ("Volcano with reclaim").

use std::collections::BTreeMap;

use fgpu_api::assignment::{
    AssignedDevice, ContainerAssignment, PodAnnotationError, PodAssignment,
};
use fgpu_api::volcano::{
    self, POD_DEVICES_ANNOTATION, POD_NODE_ANNOTATION, RESOURCE_CORES, RESOURCE_MEMORY,
    RESOURCE_MEMORY_PERCENTAGE, RESOURCE_NUMBER, RegisteredGpu,
};
use fgpu_driver::device::{GpuMode, NodeInventory};

use super::pods::{ContainerInfo, PodInfo};
use crate::edits::device_name;

/// The field manager of Volcano's scheduler: the API server names the manager of a patch
/// without one after the client's user agent, which client-go takes from the binary
/// (`vc-scheduler`).
pub const DEFAULT_SCHEDULER_MANAGER: &str = "vc-scheduler";

const MIB: u64 = 1 << 20;

/// Which scheduler's decisions the device plugin reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SchedulerKind {
    /// fgpu's scheduler extender (`<driver>/assigned-devices`).
    #[default]
    Fgpu,
    /// Volcano's `deviceshare` plugin with vGPU (`volcano.sh/vgpu-ids-new`).
    Volcano,
}

/// The Volcano mode's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolcanoConfig {
    /// The field manager whose allocation annotations are trusted; `None`: any (tests, or
    /// an admission policy guards the annotation instead).
    pub trusted_manager: Option<String>,
}

/// The node's GPUs in the register annotation's terms: each GPU in mode `shared` (the only
/// mode Volcano's vGPU shares), `count` = `split` while healthy and 0 while not (the
/// scheduler places by count and does not read the health field). The second value names
/// each GPU left out and why.
pub fn register_gpus(
    inventory: &NodeInventory,
    modes: &BTreeMap<String, GpuMode>,
    split: u32,
) -> (Vec<RegisteredGpu>, Vec<String>) {
    let mut notes = Vec::new();
    let mut gpus: Vec<(u32, RegisteredGpu)> = Vec::new();
    for g in &inventory.gpus {
        let mode = modes.get(&g.uuid).copied().unwrap_or_default();
        if mode != GpuMode::Shared {
            notes.push(format!(
                "GPU {} ({}): mode {mode}; Volcano's vGPU shares only GPUs in mode shared: left out of {}",
                g.index,
                g.uuid,
                volcano::REGISTER_ANNOTATION
            ));
            continue;
        }
        let healthy = g.health.is_healthy();
        gpus.push((
            g.index,
            RegisteredGpu {
                uuid: g.uuid.clone(),
                count: if healthy { split } else { 0 },
                memory_mib: g.memory_bytes / MIB,
                kind: RegisteredGpu::kind_for(&g.product_name),
                healthy,
            },
        ));
    }
    gpus.sort_by_key(|(index, _)| *index);
    (gpus.into_iter().map(|(_, g)| g).collect(), notes)
}

/// The node's `volcano.sh/vgpu-memory` (MiB) and `volcano.sh/vgpu-cores` (percent) for the
/// registered GPUs that take containers.
pub fn node_capacity(gpus: &[RegisteredGpu]) -> BTreeMap<String, String> {
    let open = gpus.iter().filter(|g| g.count > 0);
    let memory: u64 = open.clone().map(|g| g.memory_mib).sum();
    let cores: u64 = open.map(|_| 100).sum();
    BTreeMap::from([
        (RESOURCE_MEMORY.to_owned(), memory.to_string()),
        (RESOURCE_CORES.to_owned(), cores.to_string()),
    ])
}

/// A container asks for vGPUs as Volcano reads it: a limit on `volcano.sh/vgpu-number`, or
/// on `volcano.sh/vgpu-memory` alone (one vGPU).
fn asks_vgpu(c: &ContainerInfo) -> bool {
    c.limits.contains_key(RESOURCE_NUMBER) || c.limits.contains_key(RESOURCE_MEMORY)
}

/// A whole-number limit of `c`, if set.
fn limit(c: &ContainerInfo, name: &str) -> Result<Option<u64>, String> {
    c.limits
        .get(name)
        .map(|v| {
            fgpu_api::quantity::parse_u64(v)
                .map_err(|e| format!("container {:?}: resources.limits[{name:?}]: {e}", c.name))
        })
        .transpose()
}

/// The allocation Volcano wrote on `pod`, as fgpu's [`PodAssignment`] for node `node`;
/// `None` when the pod carries none. Refused, naming the pod, the annotation and the field:
/// an annotation not written by `trusted_manager` (when set), another node, a malformed
/// value, a GPU this node does not have, or a grant that differs from what the containers
/// ask for (device count, memory per device, cores) — so a pod that wrote its own
/// allocation gets nothing it did not ask for in the resources its queue was charged.
pub fn assignment(
    pod: &PodInfo,
    node: &str,
    inventory: &NodeInventory,
    trusted_manager: Option<&str>,
) -> Result<Option<PodAssignment>, PodAnnotationError> {
    let Some(value) = pod.annotations.get(POD_DEVICES_ANNOTATION) else {
        return Ok(None);
    };
    let err = |problem: String| PodAnnotationError {
        pod: pod.key(),
        annotation: POD_DEVICES_ANNOTATION.to_owned(),
        problem,
    };
    if let Some(trusted) = trusted_manager {
        let writers = pod.annotation_managers.get(POD_DEVICES_ANNOTATION);
        if writers.is_none_or(|w| w.len() != 1 || !w.contains(trusted)) {
            let named: Vec<&str> = writers.into_iter().flatten().map(String::as_str).collect();
            return Err(err(format!(
                "metadata.managedFields: written by {}, not by Volcano's scheduler (field manager {trusted:?}); refused as a forged allocation",
                if named.is_empty() {
                    "no recorded manager".to_owned()
                } else {
                    named.join(", ")
                }
            )));
        }
    }
    match pod.annotations.get(POD_NODE_ANNOTATION) {
        Some(n) if n == node => {}
        other => {
            return Err(err(format!(
                "metadata.annotations[{POD_NODE_ANNOTATION:?}]: {other:?}, but the pod is on node {node}"
            )));
        }
    }
    let per_container = volcano::parse_pod_devices(&pod.key(), value)?;
    let asking: Vec<(usize, &ContainerInfo)> = pod
        .containers
        .iter()
        .enumerate()
        .filter(|(_, c)| asks_vgpu(c))
        .collect();
    if per_container.len() != asking.len() {
        return Err(err(format!(
            "containers: {} in the allocation, but the pod has {} container(s) asking for {RESOURCE_NUMBER} or {RESOURCE_MEMORY}",
            per_container.len(),
            asking.len()
        )));
    }
    let mut containers = Vec::with_capacity(asking.len());
    for (i, ((index, c), devices)) in asking.into_iter().zip(per_container).enumerate() {
        let number = limit(c, RESOURCE_NUMBER).map_err(&err)?.unwrap_or(1);
        let memory = limit(c, RESOURCE_MEMORY).map_err(&err)?.unwrap_or(0);
        let percent = limit(c, RESOURCE_MEMORY_PERCENTAGE).map_err(&err)?;
        let cores = limit(c, RESOURCE_CORES).map_err(&err)?.unwrap_or(0);
        if devices.len() as u64 != number {
            return Err(err(format!(
                "containers[{i}]: {} device(s), but container {:?} asks for {RESOURCE_NUMBER} {number}",
                devices.len(),
                c.name
            )));
        }
        let mut assigned = Vec::with_capacity(devices.len());
        for (j, d) in devices.into_iter().enumerate() {
            let at =
                |field: &str, p: String| err(format!("containers[{i}].devices[{j}].{field}: {p}"));
            let Some(gpu) = inventory
                .gpus
                .iter()
                .find(|g| g.uuid.eq_ignore_ascii_case(&d.uuid))
            else {
                return Err(at(
                    "uuid",
                    format!("{:?} is not a GPU of node {node}", d.uuid),
                ));
            };
            let gpu_mib = gpu.memory_bytes / MIB;
            // Volcano's rule: a percentage wins; else the MiB asked; else the whole GPU.
            let want = match percent {
                Some(p) if p != 101 => gpu_mib.saturating_mul(p) / 100,
                _ if memory > 0 => memory,
                _ => gpu_mib,
            };
            if d.memory_mib != want {
                return Err(at(
                    "memoryMiB",
                    format!(
                        "{}, but container {:?} asks for {want} on GPU {}",
                        d.memory_mib, c.name, gpu.uuid
                    ),
                ));
            }
            if d.memory_mib == 0 || d.memory_mib > gpu_mib {
                return Err(at(
                    "memoryMiB",
                    format!(
                        "{} does not fit GPU {} ({gpu_mib} MiB); a share needs 1 MiB or more",
                        d.memory_mib, gpu.uuid
                    ),
                ));
            }
            if u64::from(d.cores) != cores {
                return Err(at(
                    "cores",
                    format!(
                        "{}, but container {:?} asks for {RESOURCE_CORES} {cores}",
                        d.cores, c.name
                    ),
                ));
            }
            assigned.push(AssignedDevice {
                id: device_name(gpu),
                uuid: gpu.uuid.clone(),
                memory_bytes: d.memory_mib * MIB,
                cores: d.cores,
            });
        }
        containers.push(ContainerAssignment {
            index,
            name: c.name.clone(),
            devices: assigned,
        });
    }
    Ok(Some(PodAssignment {
        node: node.to_owned(),
        containers,
    }))
}

/// The pods of `node` as the legacy path's matching reads them: a pod with a usable Volcano
/// allocation carries it, translated, under `fgpu_annotation`; no other pod carries that
/// annotation (on a Volcano node an fgpu decision is not a grant). The second value lists
/// each refused allocation ([`assignment`]'s errors).
pub fn translate(
    pods: &[PodInfo],
    node: &str,
    inventory: &NodeInventory,
    fgpu_annotation: &str,
    cfg: &VolcanoConfig,
) -> (Vec<PodInfo>, Vec<String>) {
    let mut problems = Vec::new();
    let out = pods
        .iter()
        .map(|p| {
            let mut p = p.clone();
            p.annotations.remove(fgpu_annotation);
            match assignment(&p, node, inventory, cfg.trusted_manager.as_deref()) {
                Ok(Some(a)) => {
                    p.annotations.insert(fgpu_annotation.to_owned(), a.render());
                }
                Ok(None) => {}
                Err(e) => problems.push(e.to_string()),
            }
            p
        })
        .collect();
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edits::tests::gpu;
    use fgpu_api::volcano::{VolcanoDevice, render_pod_devices};

    const FGPU: &str = "gpu.fgpu.dev/assigned-devices";

    fn inventory() -> NodeInventory {
        let mut a = gpu(0, "0000:01:00.0");
        a.uuid = "GPU-aaaa".into();
        a.memory_bytes = 81920 * MIB;
        let mut b = gpu(1, "0000:02:00.0");
        b.uuid = "GPU-bbbb".into();
        b.memory_bytes = 40960 * MIB;
        NodeInventory::new("n1", vec![a, b])
    }

    fn container(name: &str, limits: &[(&str, &str)]) -> ContainerInfo {
        ContainerInfo {
            name: name.into(),
            limits: limits
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    fn dev(uuid: &str, mib: u64, cores: u32) -> VolcanoDevice {
        VolcanoDevice {
            uuid: uuid.into(),
            kind: "NVIDIA".into(),
            memory_mib: mib,
            cores,
        }
    }

    fn pod(devices: &[Vec<VolcanoDevice>]) -> PodInfo {
        PodInfo {
            namespace: "ml".into(),
            name: "train".into(),
            uid: "u1".into(),
            node_name: "n1".into(),
            phase: "Pending".into(),
            annotations: [
                (
                    POD_DEVICES_ANNOTATION.to_owned(),
                    render_pod_devices(devices),
                ),
                (POD_NODE_ANNOTATION.to_owned(), "n1".to_owned()),
            ]
            .into(),
            annotation_managers: [(
                POD_DEVICES_ANNOTATION.to_owned(),
                [DEFAULT_SCHEDULER_MANAGER.to_owned()].into(),
            )]
            .into(),
            containers: vec![
                container("sidecar", &[("cpu", "1")]),
                container(
                    "main",
                    &[
                        (RESOURCE_NUMBER, "1"),
                        (RESOURCE_MEMORY, "20000"),
                        (RESOURCE_CORES, "30"),
                    ],
                ),
            ],
            ..Default::default()
        }
    }

    fn check(p: &PodInfo) -> Result<Option<PodAssignment>, PodAnnotationError> {
        assignment(p, "n1", &inventory(), Some(DEFAULT_SCHEDULER_MANAGER))
    }

    #[test]
    fn a_volcano_allocation_becomes_the_containers_grant() {
        let a = check(&pod(&[vec![dev("GPU-bbbb", 20000, 30)]]))
            .unwrap()
            .unwrap();
        assert_eq!(a.node, "n1");
        assert_eq!(a.containers.len(), 1);
        let c = &a.containers[0];
        // The second container of the spec: the sidecar asks for none.
        assert_eq!((c.index, c.name.as_str()), (1, "main"));
        assert_eq!(
            c.devices,
            vec![AssignedDevice {
                id: "gpu-1".into(),
                uuid: "GPU-bbbb".into(),
                memory_bytes: 20000 * MIB,
                cores: 30
            }]
        );
        let mut none = pod(&[]);
        none.annotations.clear();
        assert_eq!(check(&none).unwrap(), None);
    }

    #[test]
    fn memory_follows_volcanos_rule_percentage_then_mib_then_whole_gpu() {
        let mut p = pod(&[vec![dev("GPU-aaaa", 40960, 0)]]);
        p.containers[1] = container(
            "main",
            &[(RESOURCE_NUMBER, "1"), (RESOURCE_MEMORY_PERCENTAGE, "50")],
        );
        assert_eq!(
            check(&p).unwrap().unwrap().containers[0].devices[0].memory_bytes,
            40960 * MIB
        );
        // Neither: the whole GPU.
        let mut p = pod(&[vec![dev("GPU-bbbb", 40960, 0)]]);
        p.containers[1] = container("main", &[(RESOURCE_NUMBER, "1")]);
        assert!(check(&p).unwrap().is_some());
        p.annotations.insert(
            POD_DEVICES_ANNOTATION.into(),
            render_pod_devices(&[vec![dev("GPU-bbbb", 1000, 0)]]),
        );
        let e = check(&p).unwrap_err().to_string();
        assert!(e.contains("containers[0].devices[0].memoryMiB: 1000, but container \"main\" asks for 40960 on GPU GPU-bbbb"), "{e}");
    }

    #[test]
    fn forged_or_inconsistent_allocations_are_refused_naming_the_field() {
        let ok = pod(&[vec![dev("GPU-aaaa", 20000, 30)]]);
        let cases: Vec<(PodInfo, &str)> = vec![
            (
                {
                    let mut p = ok.clone();
                    p.annotation_managers.insert(
                        POD_DEVICES_ANNOTATION.into(),
                        ["kubectl-client-side-apply".to_owned()].into(),
                    );
                    p
                },
                "metadata.managedFields: written by kubectl-client-side-apply, not by Volcano's scheduler (field manager \"vc-scheduler\"); refused as a forged allocation",
            ),
            (
                {
                    let mut p = ok.clone();
                    p.annotation_managers.clear();
                    p
                },
                "written by no recorded manager",
            ),
            (
                {
                    let mut p = ok.clone();
                    p.annotations
                        .insert(POD_NODE_ANNOTATION.into(), "n2".into());
                    p
                },
                "metadata.annotations[\"volcano.sh/vgpu-node\"]: Some(\"n2\"), but the pod is on node n1",
            ),
            (
                pod(&[vec![dev("GPU-aaaa", 80000, 30)]]),
                "containers[0].devices[0].memoryMiB: 80000, but container \"main\" asks for 20000",
            ),
            (
                pod(&[vec![dev("GPU-aaaa", 20000, 100)]]),
                "containers[0].devices[0].cores: 100, but container \"main\" asks for volcano.sh/vgpu-cores 30",
            ),
            (
                pod(&[vec![dev("GPU-cccc", 20000, 30)]]),
                "containers[0].devices[0].uuid: \"GPU-cccc\" is not a GPU of node n1",
            ),
            (
                pod(&[vec![dev("GPU-aaaa", 20000, 30), dev("GPU-bbbb", 20000, 30)]]),
                "containers[0]: 2 device(s), but container \"main\" asks for volcano.sh/vgpu-number 1",
            ),
            (
                pod(&[
                    vec![dev("GPU-aaaa", 20000, 30)],
                    vec![dev("GPU-bbbb", 20000, 30)],
                ]),
                "containers: 2 in the allocation, but the pod has 1 container(s)",
            ),
            (
                {
                    let mut p = ok.clone();
                    p.annotations.insert(
                        POD_DEVICES_ANNOTATION.into(),
                        "GPU-aaaa,NVIDIA,lots,30:".into(),
                    );
                    p
                },
                "containers[0].devices[0].memoryMiB: \"lots\" is not a whole number",
            ),
        ];
        for (p, want) in cases {
            let e = check(&p).unwrap_err();
            assert_eq!(
                (e.pod.as_str(), e.annotation.as_str()),
                ("ml/train", POD_DEVICES_ANNOTATION)
            );
            assert!(
                e.problem.contains(want),
                "{} does not contain {want}",
                e.problem
            );
        }
        // Without a trusted manager, only the content is checked.
        let mut p = ok;
        p.annotation_managers.clear();
        assert!(assignment(&p, "n1", &inventory(), None).unwrap().is_some());
    }

    #[test]
    fn translate_replaces_fgpu_decisions_with_volcanos() {
        let good = pod(&[vec![dev("GPU-aaaa", 20000, 30)]]);
        let mut forged = pod(&[vec![dev("GPU-aaaa", 80000, 30)]]);
        forged.uid = "u2".into();
        forged.name = "forged".into();
        let mut fgpu_only = PodInfo {
            name: "x".into(),
            ..forged.clone()
        };
        fgpu_only.annotations = [(FGPU.to_owned(), "{}".to_owned())].into();
        let cfg = VolcanoConfig {
            trusted_manager: Some(DEFAULT_SCHEDULER_MANAGER.into()),
        };
        let (out, problems) = translate(&[good, forged, fgpu_only], "n1", &inventory(), FGPU, &cfg);
        let a = PodAssignment::parse("ml/train", FGPU, &out[0].annotations[FGPU]).unwrap();
        assert_eq!(a.containers[0].devices[0].memory_bytes, 20000 * MIB);
        assert!(!out[1].annotations.contains_key(FGPU));
        assert!(
            !out[2].annotations.contains_key(FGPU),
            "an fgpu decision is no grant on a Volcano node"
        );
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("pod ml/forged: annotation volcano.sh/vgpu-ids-new:"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn register_lists_shared_gpus_and_closes_unhealthy_ones() {
        let mut inv = inventory();
        inv.gpus[1].health = fgpu_driver::device::Health::Unhealthy {
            reason: "xid 79".into(),
        };
        let (gpus, notes) = register_gpus(&inv, &BTreeMap::new(), 10);
        assert!(notes.is_empty());
        assert_eq!(gpus.len(), 2);
        assert_eq!(
            (gpus[0].count, gpus[0].memory_mib, gpus[0].healthy),
            (10, 81920, true)
        );
        assert_eq!((gpus[1].count, gpus[1].healthy), (0, false));
        assert!(gpus[0].kind.contains("NVIDIA"), "{}", gpus[0].kind);
        let cap = node_capacity(&gpus);
        assert_eq!(cap[RESOURCE_MEMORY], "81920");
        assert_eq!(cap[RESOURCE_CORES], "100");
        let modes = BTreeMap::from([("GPU-aaaa".to_owned(), GpuMode::Mig)]);
        let (gpus, notes) = register_gpus(&inventory(), &modes, 10);
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].uuid, "GPU-bbbb");
        assert!(notes[0].contains("mode mig"), "{}", notes[0]);
    }
}
