//! `v1beta1.DevicePlugin`: the kubelet's device manager calls it on `<dir>/fgpu.sock`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fgpu_api::names::kubelet;
use fgpu_api::proto::deviceplugin::v1beta1 as dp;
use fgpu_driver::backend::DeviceBackend;
use fgpu_driver::device::NodeInventory;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::container::container_claim;
use super::podresources;
use super::pods::{PodSource, choose_with};
use crate::checkpoint::PrepareState;
use crate::prepare::{MapClaimSource, Plugin};

/// What `Allocate` answers besides nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AllocateResponseMode {
    /// `cdi_devices` only (kubelet 1.28+ with the `DevicePluginCDIDevices` gate, on by
    /// default from 1.29; the runtime must have CDI enabled).
    #[default]
    Cdi,
    /// Env, mounts and device nodes equivalent to the CDI spec (older kubelets or runtimes
    /// without CDI). The spec's hooks cannot be expressed and are left out.
    Legacy,
    /// Both (a runtime that applies both gets the same mounts twice).
    Both,
}

/// The service's fixed settings.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// This node.
    pub node: String,
    /// The pod decision annotation (`<driver>/assigned-devices`).
    pub assignment_annotation: String,
    /// What `Allocate` answers.
    pub response: AllocateResponseMode,
    /// The kubelet's pod resources socket, read at each `Allocate` to learn which pod is
    /// being admitted ([`super::podresources`]); `None`: the earliest-bind rule alone.
    pub pod_resources_socket: Option<std::path::PathBuf>,
    /// The resource registered (the devices the pod resources view is about).
    pub resource_name: String,
    /// The Volcano mode: decisions are Volcano's allocations ([`super::volcano`]); `None`:
    /// fgpu's extender's.
    pub volcano: Option<super::volcano::VolcanoConfig>,
}

/// The virtual devices advertised for `inventory`: `split` per GPU, `<uuid>::<k>`, with the
/// GPU's health and NUMA node.
pub fn virtual_devices(inventory: &NodeInventory, split: u32) -> Vec<dp::Device> {
    let mut out = Vec::with_capacity(inventory.gpus.len() * split as usize);
    for g in &inventory.gpus {
        let health = if g.health.is_healthy() {
            kubelet::DEVICE_PLUGIN_HEALTHY
        } else {
            kubelet::DEVICE_PLUGIN_UNHEALTHY
        };
        let topology = g.numa_node.map(|n| dp::TopologyInfo {
            nodes: vec![dp::NumaNode { id: i64::from(n) }],
        });
        for k in 0..split {
            out.push(dp::Device {
                id: format!("{}::{k}", g.uuid),
                health: health.to_owned(),
                topology: topology.clone(),
            });
        }
    }
    out
}

/// The device plugin service.
pub struct DevicePluginService<P> {
    cfg: ServiceConfig,
    plugin: Arc<Plugin<Arc<MapClaimSource>>>,
    claims: Arc<MapClaimSource>,
    backend: Arc<dyn DeviceBackend>,
    pods: P,
    devices: watch::Receiver<Vec<dp::Device>>,
    /// One `Allocate` at a time: two must not pick the same container.
    allocating: tokio::sync::Mutex<()>,
}

impl<P: PodSource> DevicePluginService<P> {
    /// A service preparing through `plugin` (whose claim source is `claims`), reading pods
    /// from `pods` and advertising what `devices` holds.
    pub fn new(
        cfg: ServiceConfig,
        plugin: Arc<Plugin<Arc<MapClaimSource>>>,
        claims: Arc<MapClaimSource>,
        backend: Arc<dyn DeviceBackend>,
        pods: P,
        devices: watch::Receiver<Vec<dp::Device>>,
    ) -> Self {
        Self {
            cfg,
            plugin,
            claims,
            backend,
            pods,
            devices,
            allocating: tokio::sync::Mutex::new(()),
        }
    }

    /// The claim UIDs already allocated (prepared to completion).
    fn allocated(&self) -> BTreeSet<String> {
        self.plugin
            .claims()
            .into_iter()
            .filter(|(_, r)| r.state == PrepareState::PrepareCompleted)
            .map(|(uid, _)| uid)
            .collect()
    }

    /// Allocates one container request.
    async fn allocate_one(
        &self,
        request: &dp::ContainerAllocateRequest,
    ) -> Result<dp::ContainerAllocateResponse, Status> {
        let node = &self.cfg.node;
        let n = request.devices_ids.len();
        if n == 0 {
            return Err(Status::invalid_argument(
                "container request with no device ids",
            ));
        }
        let pods = self
            .pods
            .pods_on_node(node)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let inventory = self
            .backend
            .inventory(node)
            .map_err(|e| Status::internal(format!("cannot enumerate the GPUs: {e}")))?;
        let (pods, refused) = match &self.cfg.volcano {
            Some(v) => super::volcano::translate(
                &pods,
                node,
                &inventory,
                &self.cfg.assignment_annotation,
                v,
            ),
            None => (pods, Vec::new()),
        };
        let kubelet = match &self.cfg.pod_resources_socket {
            Some(socket) => match podresources::list(socket, &self.cfg.resource_name).await {
                Ok(k) => Some(k),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read which pod the kubelet admits; choosing by the earliest bind");
                    None
                }
            },
            None => None,
        };
        let choice = choose_with(
            &pods,
            node,
            &self.cfg.assignment_annotation,
            &self.allocated(),
            n,
            kubelet.as_ref(),
        )
        .map_err(|mut e| {
            e.problems.extend(refused);
            Status::failed_precondition(e.to_string())
        })?;
        if kubelet.is_some() && !choice.kubelet_confirmed {
            tracing::warn!(pod = %choice.pod.key(), container = %choice.container.name,
                "the kubelet shows no waiting pod among the candidates; chose by the earliest bind");
        }
        let driver = self.plugin.config().driver.clone();
        // Errors name the annotation the grant came from.
        let source = if self.cfg.volcano.is_some() {
            fgpu_api::volcano::POD_DEVICES_ANNOTATION
        } else {
            self.cfg.assignment_annotation.as_str()
        };
        let claimed = container_claim(
            &choice.pod,
            &choice.container,
            &inventory,
            driver.as_str(),
            source,
            |uuid| self.plugin.gpu_mode(uuid),
        )
        .map_err(|e| Status::failed_precondition(e.to_string()));
        let prepared = match claimed {
            Ok((claim_ref, claim)) => {
                self.claims.insert(claim);
                let prepared = self.plugin.prepare(&claim_ref).await;
                self.claims.remove(&claim_ref.namespace, &claim_ref.name);
                prepared
                    .map(|p| (claim_ref, p))
                    .map_err(|e| Status::internal(e.to_string()))
            }
            Err(e) => Err(e),
        };
        if self.cfg.volcano.is_some() {
            self.bind_phase(&choice, prepared.is_ok()).await;
        }
        let (claim_ref, prepared) = prepared?;
        let mut resp = dp::ContainerAllocateResponse::default();
        let ids: Vec<String> = prepared
            .iter()
            .flat_map(|d| d.cdi_device_ids.iter().cloned())
            .collect();
        tracing::info!(pod = %choice.pod.key(), container = %choice.container.name,
            kubelet_devices = ?request.devices_ids, cdi = ?ids,
            kubelet_confirmed = choice.kubelet_confirmed, "allocated");
        if self.cfg.response != AllocateResponseMode::Legacy {
            resp.cdi_devices = ids.into_iter().map(|name| dp::CdiDevice { name }).collect();
        }
        if self.cfg.response != AllocateResponseMode::Cdi {
            let spec = self
                .plugin
                .config()
                .cdi_dir
                .join(driver.cdi_spec_file_name(&claim_ref.uid));
            legacy_edits(&spec, &mut resp)
                .map_err(|e| Status::internal(format!("claim {}: {e}", claim_ref.key())))?;
        }
        Ok(resp)
    }
}

impl<P: PodSource> DevicePluginService<P> {
    /// Volcano's bind handshake: `volcano.sh/bind-phase` becomes `success` once every vGPU
    /// container of the pod is allocated, `failed` when one is refused. Volcano v1.14.1's
    /// scheduler writes `allocating` and reads it no further; the value tells people and
    /// tools what the node made of the allocation. A failed patch is logged, not returned:
    /// the container's files are in place either way.
    async fn bind_phase(&self, choice: &super::pods::Choice, ok: bool) {
        use fgpu_api::volcano::{BIND_PHASE_ANNOTATION, BIND_PHASE_FAILED, BIND_PHASE_SUCCESS};
        let phase = if !ok {
            BIND_PHASE_FAILED
        } else {
            let allocated = self.allocated();
            let all = choice
                .pod
                .annotations
                .get(&self.cfg.assignment_annotation)
                .and_then(|v| {
                    super::annotations::PodAssignment::parse(
                        &choice.pod.key(),
                        &self.cfg.assignment_annotation,
                        v,
                    )
                    .ok()
                })
                .is_some_and(|a| {
                    a.containers.iter().all(|c| {
                        allocated
                            .contains(&super::pods::container_claim_uid(&choice.pod.uid, &c.name))
                    })
                });
            if !all {
                return;
            }
            BIND_PHASE_SUCCESS
        };
        let p = &choice.pod;
        if let Err(e) = self
            .pods
            .set_annotation(&p.namespace, &p.name, BIND_PHASE_ANNOTATION, phase)
            .await
        {
            tracing::warn!(error = %e, "cannot record the bind phase");
        }
    }
}

/// The claim's CDI spec cannot be turned into legacy edits; the caller adds the claim.
#[derive(Debug, thiserror::Error)]
pub enum LegacyEditsError {
    /// The spec file cannot be read.
    #[error("cannot read the CDI spec {}: {source}", spec.display())]
    Read {
        /// The spec file.
        spec: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The spec file is not JSON.
    #[error("CDI spec {}: {source}", spec.display())]
    Parse {
        /// The spec file.
        spec: PathBuf,
        /// Where and why parsing stopped.
        #[source]
        source: serde_json::Error,
    },
}

/// Fills `resp`'s env, mounts and device nodes from the CDI spec at `spec` (its common edits
/// and every device's: the spec holds only this container's devices).
pub fn legacy_edits(
    spec: &Path,
    resp: &mut dp::ContainerAllocateResponse,
) -> Result<(), LegacyEditsError> {
    let text = std::fs::read_to_string(spec).map_err(|source| LegacyEditsError::Read {
        spec: spec.to_owned(),
        source,
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| LegacyEditsError::Parse {
            spec: spec.to_owned(),
            source,
        })?;
    let mut edits = vec![&v["containerEdits"]];
    if let Some(devs) = v["devices"].as_array() {
        edits.extend(devs.iter().map(|d| &d["containerEdits"]));
    }
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    let mut envs: HashMap<String, String> = HashMap::new();
    for e in &edits {
        for kv in e["env"].as_array().into_iter().flatten() {
            if let Some((k, val)) = kv.as_str().and_then(|kv| kv.split_once('=')) {
                envs.insert(k.to_owned(), val.to_owned());
            }
        }
        for m in e["mounts"].as_array().into_iter().flatten() {
            let read_only = m["options"]
                .as_array()
                .is_some_and(|o| o.iter().any(|o| o == "ro"));
            resp.mounts.push(dp::Mount {
                container_path: s(&m["containerPath"]),
                host_path: s(&m["hostPath"]),
                read_only,
            });
        }
        for d in e["deviceNodes"].as_array().into_iter().flatten() {
            let path = s(&d["path"]);
            let host = d["hostPath"]
                .as_str()
                .map_or_else(|| path.clone(), str::to_owned);
            let permissions = d["permissions"].as_str().unwrap_or("rw").to_owned();
            resp.devices.push(dp::DeviceSpec {
                container_path: path,
                host_path: host,
                permissions,
            });
        }
    }
    resp.envs.extend(envs);
    Ok(())
}

#[tonic::async_trait]
impl<P: PodSource> dp::device_plugin_server::DevicePlugin for DevicePluginService<P> {
    async fn get_device_plugin_options(
        &self,
        _request: Request<dp::Empty>,
    ) -> Result<Response<dp::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<dp::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _request: Request<dp::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut devices = self.devices.clone();
        tokio::spawn(async move {
            loop {
                let list = devices.borrow_and_update().clone();
                if tx
                    .send(Ok(dp::ListAndWatchResponse { devices: list }))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::select! {
                    changed = devices.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        _request: Request<dp::PreferredAllocationRequest>,
    ) -> Result<Response<dp::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented(
            "fgpu does not offer preferred allocations (the extender chose the GPUs)",
        ))
    }

    async fn allocate(
        &self,
        request: Request<dp::AllocateRequest>,
    ) -> Result<Response<dp::AllocateResponse>, Status> {
        let _one = self.allocating.lock().await;
        let mut out = dp::AllocateResponse::default();
        for c in &request.get_ref().container_requests {
            match self.allocate_one(c).await {
                Ok(r) => out.container_responses.push(r),
                Err(status) => {
                    tracing::warn!(error = %status.message(), devices = ?c.devices_ids, "allocate failed");
                    return Err(status);
                }
            }
        }
        Ok(Response::new(out))
    }

    async fn pre_start_container(
        &self,
        _request: Request<dp::PreStartContainerRequest>,
    ) -> Result<Response<dp::PreStartContainerResponse>, Status> {
        Ok(Response::new(dp::PreStartContainerResponse {}))
    }
}

/// The options registered and answered: no pre-start call, no preferred allocation.
pub fn options() -> dp::DevicePluginOptions {
    dp::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: false,
    }
}
