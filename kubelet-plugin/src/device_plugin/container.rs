//! One container's grant as a claim, so that [`crate::prepare::Plugin::prepare`] writes for
//! it exactly what it writes for a DRA claim (one code path, two front ends).
//!
//! The container of pod `ns/p` (UID `u`) named `c` becomes the claim `ns/p/c` with UID
//! `u-c` ([`container_claim_uid`]), allocated with one result per assigned GPU: pool = this
//! node, device = the GPU's `gpu-<minor>` (found by UUID), `consumedCapacity` = the memory
//! bytes and cores the extender granted. An assigned MIG placement (its id is
//! `gpu-<index>-mig-<profile>-<start>`, [`fgpu_driver::mig::parse_device_name`]) becomes a
//! result naming that placement device, with no `consumedCapacity`: the prepare then
//! creates the instance, record first, as for a DRA claim of the class `mig.gpu.fgpu.dev`.
//! Grant resolution ([`crate::grant`]), placement and the CDI spec ([`crate::edits`]) and
//! the files ([`crate::prepare`]) are then the DRA path's own.

use std::collections::BTreeMap;

use fgpu_api::names::capacity;
use fgpu_driver::device::{GpuMode, NodeInventory};

use super::annotations::ContainerAssignment;
use super::pods::{PodInfo, container_claim_uid};
use crate::claim::{
    Allocation, ClaimStatus, DeviceAllocation, DeviceResult, ObjectMeta, ResourceClaim,
};
use crate::edits::{ClaimRef, device_name};

/// A container's grant names a GPU this node does not have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: annotation {annotation}: container {container:?}: {problem}")]
pub struct ContainerGrantError {
    /// `namespace/name`.
    pub pod: String,
    /// The decision annotation.
    pub annotation: String,
    /// The container.
    pub container: String,
    /// What is wrong, starting with the field.
    pub problem: String,
}

/// The claim of container `c` of `pod`: its reference and its allocated object. `mode`
/// gives each GPU's mode in force (by UUID): a MIG placement is accepted only on a GPU in
/// `mig` mode, and a share or whole GPU only on one that is not (no shares and MIG
/// instances on one GPU).
pub fn container_claim(
    pod: &PodInfo,
    c: &ContainerAssignment,
    inventory: &NodeInventory,
    driver: &str,
    annotation: &str,
    mode: impl Fn(&str) -> GpuMode,
) -> Result<(ClaimRef, ResourceClaim), ContainerGrantError> {
    let err = |problem: String| ContainerGrantError {
        pod: pod.key(),
        annotation: annotation.to_owned(),
        container: c.name.clone(),
        problem,
    };
    let uid = container_claim_uid(&pod.uid, &c.name);
    if uid.len() > 128 || !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(err(format!(
            "metadata.uid {:?} and the container name do not make a valid claim UID {uid:?} (letters, digits and '-', at most 128)",
            pod.uid
        )));
    }
    let mut results = Vec::with_capacity(c.devices.len());
    for (j, d) in c.devices.iter().enumerate() {
        let gpu = inventory
            .gpus
            .iter()
            .find(|g| g.uuid.eq_ignore_ascii_case(&d.uuid))
            .ok_or_else(|| {
                let known: Vec<&str> = inventory.gpus.iter().map(|g| g.uuid.as_str()).collect();
                err(format!(
                    "devices[{j}].uuid: {:?} is not a GPU of node {} (its GPUs: {})",
                    d.uuid,
                    inventory.node,
                    known.join(", ")
                ))
            })?;
        if !gpu.health.is_healthy() {
            tracing::warn!(pod = %pod.key(), container = %c.name, gpu = %gpu.uuid,
                "allocating a GPU that is now unhealthy (the extender chose it when it was healthy)");
        }
        let gpu_mode = mode(&gpu.uuid);
        let placement = fgpu_driver::mig::parse_device_name(&d.id);
        let (device, consumed_capacity) = match placement {
            Some(p) if p.gpu_index != gpu.index => {
                return Err(err(format!(
                    "devices[{j}].id: {:?} is a MIG placement of GPU {}, but devices[{j}].uuid {} is GPU {}",
                    d.id, p.gpu_index, gpu.uuid, gpu.index
                )));
            }
            Some(_) if gpu_mode != GpuMode::Mig => {
                return Err(err(format!(
                    "devices[{j}].id: {:?} is a MIG placement, but GPU {} is in mode {gpu_mode}, not mig (the extender read an older node annotation?)",
                    d.id, gpu.uuid
                )));
            }
            // The instance's size is the profile's: no quota, no shim.
            Some(_) => (d.id.clone(), None),
            None if gpu_mode == GpuMode::Mig => {
                return Err(err(format!(
                    "devices[{j}].id: {:?}: GPU {} is in mode mig and takes only MIG placements (gpu-{}-mig-<profile>-<start>), not a share or the whole GPU",
                    d.id, gpu.uuid, gpu.index
                )));
            }
            None => (
                device_name(gpu),
                Some(BTreeMap::from([
                    (capacity::MEMORY.to_owned(), d.memory_bytes.to_string()),
                    (capacity::CORES.to_owned(), d.cores.to_string()),
                ])),
            ),
        };
        results.push(DeviceResult {
            request: c.name.clone(),
            driver: driver.to_owned(),
            pool: inventory.node.clone(),
            device,
            share_id: None,
            consumed_capacity,
            admin_access: None,
        });
    }
    let claim_ref = ClaimRef {
        namespace: pod.namespace.clone(),
        name: format!("{}/{}", pod.name, c.name),
        uid: uid.clone(),
    };
    let claim = ResourceClaim {
        metadata: ObjectMeta {
            name: claim_ref.name.clone(),
            namespace: claim_ref.namespace.clone(),
            uid,
            ..ObjectMeta::default()
        },
        status: Some(ClaimStatus {
            allocation: Some(Allocation {
                devices: Some(DeviceAllocation {
                    results,
                    config: Vec::new(),
                }),
                ..Allocation::default()
            }),
            ..ClaimStatus::default()
        }),
        ..ResourceClaim::default()
    };
    Ok((claim_ref, claim))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_plugin::annotations::AssignedDevice;
    use crate::edits::tests::gpu;
    use crate::edits::{ClaimPaths, FileMount, NodeFiles, build, plan};
    use fgpu_api::names::DriverName;
    use std::path::Path;

    const GI: u64 = 1 << 30;

    fn pod() -> PodInfo {
        PodInfo {
            namespace: "ml".into(),
            name: "train".into(),
            uid: "6f1c2d3e-0000-4000-8000-000000000001".into(),
            node_name: "n1".into(),
            ..Default::default()
        }
    }

    fn inventory() -> NodeInventory {
        NodeInventory::new("n1", vec![gpu(0, "0000:1b:00.0"), gpu(1, "0000:0a:00.0")])
    }

    fn assigned(uuid: &str, gi: u64, cores: u32) -> AssignedDevice {
        AssignedDevice {
            id: "ignored".into(),
            uuid: uuid.into(),
            memory_bytes: gi * GI,
            cores,
        }
    }

    /// Grant → claim → the DRA path's plan and build: the container's edits.
    #[test]
    fn grant_to_edits() {
        let inv = inventory();
        let c = ContainerAssignment {
            index: 0,
            name: "main".into(),
            devices: vec![
                assigned(&inv.gpus[1].uuid.to_lowercase(), 10, 30),
                assigned(&inv.gpus[0].uuid, 20, 0),
            ],
        };
        let driver = DriverName::default();
        let (r, claim) =
            container_claim(&pod(), &c, &inv, driver.as_str(), "a", |_| GpuMode::Shared).unwrap();
        assert_eq!(r.uid, "6f1c2d3e-0000-4000-8000-000000000001-main");
        assert_eq!(r.key(), "ml/train/main");
        let resolved = crate::grant::resolve(&claim, driver.as_str()).unwrap();
        let planned = plan(&r, &resolved, &inv).unwrap();
        let paths = ClaimPaths::new(
            Path::new("/s"),
            Path::new("/r"),
            Path::new("/cdi"),
            &driver,
            &r.uid,
        );
        let files = NodeFiles {
            shim_library: "/lib/libfgpu.so".into(),
            driver_mounts: vec![FileMount::same("/usr/lib/libcuda.so.1")],
            driver_hooks: vec![],
            fake_driver: false,
            fake_state_dir: None,
            context_overhead: 0,
            memory_limits: None,
        };
        let e = build(&driver, &r, &planned, &files, &paths).unwrap();
        // Device names after the pod UID and the container, one per GPU.
        let g = |i: usize| device_name(&inv.gpus[i]);
        assert_eq!(
            e.devices
                .iter()
                .map(|d| d.cdi_device_ids[0].clone())
                .collect::<Vec<_>>(),
            [
                format!("gpu.fgpu.dev/claim={}-{}", r.uid, g(1)),
                format!("gpu.fgpu.dev/claim={}-{}", r.uid, g(0)),
            ]
        );
        // Limits per GPU in bus order: which GPU has 0000:0a first depends on the fixture.
        let want: Vec<(String, u64, u8)> = {
            let mut v = vec![
                (inv.gpus[1].clone(), 10 * GI, 30u8),
                (inv.gpus[0].clone(), 20 * GI, 0u8),
            ];
            v.sort_by(|a, b| a.0.pci_bus_id.cmp(&b.0.pci_bus_id));
            v.into_iter().map(|(g, m, c)| (g.uuid, m, c)).collect()
        };
        let got: Vec<(String, u64, u8)> = e
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), g.memory_bytes, g.cores))
            .collect();
        assert_eq!(got, want);
        assert!(
            e.limits
                .lines()
                .any(|l| l == format!("gpu.{}.memory={}", want[0].0, want[0].1)),
            "{}",
            e.limits
        );
        assert_eq!(
            paths.limits_file,
            Path::new("/r/claims/6f1c2d3e-0000-4000-8000-000000000001-main/limits")
        );
    }

    #[test]
    fn unknown_gpu_and_bad_uid_name_the_pod() {
        let inv = inventory();
        let c = ContainerAssignment {
            index: 2,
            name: "main".into(),
            devices: vec![assigned("GPU-nope", 1, 0)],
        };
        let e = container_claim(&pod(), &c, &inv, "gpu.fgpu.dev", "ann", |_| GpuMode::Shared)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("pod ml/train: annotation ann: container \"main\": devices[0].uuid: \"GPU-nope\" is not a GPU of node n1"),
            "{e}"
        );
        let mut p = pod();
        p.uid = "a/b".into();
        let e = container_claim(&p, &c, &inv, "gpu.fgpu.dev", "ann", |_| GpuMode::Shared)
            .unwrap_err()
            .to_string();
        assert!(e.contains("metadata.uid \"a/b\""), "{e}");
    }

    /// A MIG placement becomes a result naming the placement device with no capacity (the
    /// prepare creates the instance); on a GPU not in mig mode, or a share on a MIG-mode
    /// GPU, the refusal names the pod, the annotation and the device.
    #[test]
    fn mig_placements_need_a_mig_mode_gpu() {
        let mut inv = inventory();
        inv.gpus[0].mig_capable = true;
        let uuid = inv.gpus[0].uuid.clone();
        let idx = inv.gpus[0].index;
        let placement = format!("gpu-{idx}-mig-1g10gb-6");
        let c = ContainerAssignment {
            index: 0,
            name: "main".into(),
            devices: vec![AssignedDevice {
                id: placement.clone(),
                uuid: uuid.clone(),
                memory_bytes: 10 * GI,
                cores: 0,
            }],
        };
        let mig = |u: &str| {
            if u == uuid {
                GpuMode::Mig
            } else {
                GpuMode::Shared
            }
        };
        let driver = DriverName::default();
        let (r, claim) = container_claim(&pod(), &c, &inv, driver.as_str(), "ann", mig).unwrap();
        let results = &claim
            .status
            .unwrap()
            .allocation
            .unwrap()
            .devices
            .unwrap()
            .results;
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].device, placement);
        assert_eq!(results[0].pool, "n1");
        assert_eq!(results[0].consumed_capacity, None);
        assert_eq!(r.key(), "ml/train/main");

        let e = container_claim(&pod(), &c, &inv, driver.as_str(), "ann", |_| {
            GpuMode::Shared
        })
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            format!(
                "pod ml/train: annotation ann: container \"main\": devices[0].id: \"{placement}\" is a MIG placement, but GPU {uuid} is in mode shared, not mig (the extender read an older node annotation?)"
            )
        );
        // The placement's GPU index must be the UUID's GPU.
        let mut other = c.clone();
        other.devices[0].uuid = inv.gpus[1].uuid.clone();
        let e = container_claim(&pod(), &other, &inv, driver.as_str(), "ann", |_| {
            GpuMode::Mig
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("is a MIG placement of GPU"), "{e}");
        // A share on a MIG-mode GPU.
        let mut share = c;
        share.devices[0].id = "gpu-0".into();
        let e = container_claim(&pod(), &share, &inv, driver.as_str(), "ann", mig)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is in mode mig and takes only MIG placements"),
            "{e}"
        );
    }
}
