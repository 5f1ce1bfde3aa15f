//! The kubelet-facing gRPC servers on unix sockets.
//!
//! * Registration (`pluginregistration.Registration`) on `<registrar dir>/<driver>-reg.sock`:
//!   `GetInfo` answers type `DRAPlugin`, the driver name, the DRA socket and the versions
//!   `v1.DRAPlugin`, `v1beta1.DRAPlugin` (v1 first: kubelet 1.34+ takes the first it
//!   knows); `NotifyRegistrationStatus` is logged and published on a watch channel
//!   ([`PluginServer::registration`]) so the caller can act on a rejection.
//! * DRA (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` and `...v1beta1.DRAPlugin`, both on
//!   one socket) on `<plugins dir>/<driver>/dra.sock`; with [`PluginServer::start_with_health`]
//!   also the device health stream (`v1.DRAResourceHealth`, `v1alpha1.DRAResourceHealth`,
//!   [`crate::health::HealthService`]), then advertised after the DRA versions.
//!
//! Sockets are bound under a hidden temporary name (the kubelet's plugin watcher ignores
//! dot files), made mode 0600 and then renamed into place, so the kubelet never sees a
//! socket with wider permissions. Every claim of a request gets an entry in the response;
//! a claim that fails gets its error there (the kubelet shows it as a pod event) and the
//! server keeps serving. Claims of one request are prepared in parallel.
//!
//! Every accepted connection is relayed through [`crate::authority`]: the kubelet's
//! registration client (and its DRA client before 1.34) sends the socket path as
//! `:authority`, which tonic's HTTP/2 layer refuses.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fgpu_api::names::{DriverName, kubelet};
use fgpu_api::proto::dra::{v1, v1beta1};
use fgpu_api::proto::pluginregistration as reg;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::checkpoint::PreparedDevice;
use crate::edits::ClaimRef;
use crate::prepare::{ClaimSource, Plugin, PrepareError};

/// The connections of `listener`, each relayed through [`crate::authority`] so that the
/// kubelet's bare-path `:authority` (registration on every version, DRA before 1.34)
/// reaches tonic as `localhost`.
fn relayed(
    listener: UnixListener,
) -> impl tokio_stream::Stream<Item = io::Result<tokio::io::DuplexStream>> {
    use tokio_stream::StreamExt as _;
    UnixListenerStream::new(listener).map(|conn| conn.map(crate::authority::serve_connection))
}

/// The two sockets of the plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sockets {
    /// `<registrar dir>/<driver>-reg.sock`.
    pub registration: PathBuf,
    /// `<plugins dir>/<driver>/dra.sock`.
    pub dra: PathBuf,
}

impl Sockets {
    /// The sockets for `driver` under the kubelet's registry and plugins directories
    /// (defaults [`kubelet::REGISTRY_DIR`] and [`kubelet::PLUGINS_DIR`]).
    pub fn new(registrar_dir: &Path, plugins_dir: &Path, driver: &DriverName) -> Self {
        Self {
            registration: registrar_dir.join(format!("{driver}-reg.sock")),
            dra: plugins_dir.join(driver.as_str()).join("dra.sock"),
        }
    }
}

/// What the kubelet said about the registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistrationState {
    /// No word yet.
    Pending,
    /// The kubelet accepted the plugin.
    Registered,
    /// The kubelet refused it, with its reason.
    Rejected(String),
}

/// Errors starting or running the servers.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    /// A socket could not be set up.
    #[error("socket {}: cannot {op}: {source}", path.display())]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A server stopped with an error.
    #[error("gRPC server on {}: {detail}", path.display())]
    Serve {
        /// The socket path.
        path: PathBuf,
        /// The error.
        detail: String,
    },
}

/// `pluginregistration.Registration`.
#[derive(Debug)]
pub struct RegistrationService {
    info: reg::PluginInfo,
    state: watch::Sender<RegistrationState>,
}

impl RegistrationService {
    /// Announces `driver` with its DRA socket at `dra_endpoint`.
    pub fn new(driver: &DriverName, dra_endpoint: &Path) -> Self {
        Self {
            info: reg::PluginInfo {
                r#type: kubelet::DRA_PLUGIN_TYPE.into(),
                name: driver.to_string(),
                endpoint: dra_endpoint.to_string_lossy().into_owned(),
                supported_versions: kubelet::DRA_SUPPORTED_VERSIONS
                    .iter()
                    .map(|v| (*v).to_owned())
                    .collect(),
            },
            state: watch::channel(RegistrationState::Pending).0,
        }
    }

    /// Follows the registration state.
    pub fn subscribe(&self) -> watch::Receiver<RegistrationState> {
        self.state.subscribe()
    }
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        tracing::debug!(endpoint = %self.info.endpoint, "kubelet asked for plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        let state = if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
            RegistrationState::Registered
        } else {
            tracing::error!(driver = %self.info.name, error = %status.error, "the kubelet refused the registration");
            RegistrationState::Rejected(status.error)
        };
        self.state.send_replace(state);
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// The DRA service, both versions, over one [`Plugin`].
pub struct DraService<S> {
    plugin: Arc<Plugin<S>>,
}

impl<S> Clone for DraService<S> {
    fn clone(&self) -> Self {
        Self {
            plugin: self.plugin.clone(),
        }
    }
}

impl<S: ClaimSource> DraService<S> {
    /// Serves `plugin`.
    pub fn new(plugin: Arc<Plugin<S>>) -> Self {
        Self { plugin }
    }

    /// Prepares every claim in parallel; one result per claim UID. `grpc` (the DRA gRPC
    /// version the call came in, `v1` or `v1beta1`) goes into the log lines.
    async fn prepare_all(
        &self,
        claims: Vec<ClaimRef>,
        grpc: &'static str,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, PrepareError>> {
        let mut set = tokio::task::JoinSet::new();
        for claim in claims {
            let plugin = self.plugin.clone();
            set.spawn(async move {
                let r = plugin.prepare(&claim).await;
                match &r {
                    Ok(devices) => {
                        tracing::info!(claim = %claim.key(), uid = %claim.uid, grpc, devices = devices.len(), "prepared claim");
                    }
                    Err(e) => {
                        tracing::warn!(claim = %claim.key(), uid = %claim.uid, grpc, reason = e.reason(), error = %e, "cannot prepare claim");
                    }
                }
                (claim.uid, r)
            });
        }
        collect(set).await
    }

    async fn unprepare_all(
        &self,
        claims: Vec<ClaimRef>,
        grpc: &'static str,
    ) -> HashMap<String, Result<(), PrepareError>> {
        let mut set = tokio::task::JoinSet::new();
        for claim in claims {
            let plugin = self.plugin.clone();
            set.spawn(async move {
                let r = plugin.unprepare(&claim).await;
                match &r {
                    Ok(()) => tracing::info!(claim = %claim.key(), uid = %claim.uid, grpc, "unprepared claim"),
                    Err(e) => {
                        tracing::warn!(claim = %claim.key(), uid = %claim.uid, grpc, error = %e, "cannot unprepare claim");
                    }
                }
                (claim.uid, r)
            });
        }
        collect(set).await
    }
}

async fn collect<T: 'static>(
    mut set: tokio::task::JoinSet<(String, Result<T, PrepareError>)>,
) -> HashMap<String, Result<T, PrepareError>> {
    let mut out = HashMap::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((uid, r)) => {
                out.insert(uid, r);
            }
            // A panic in one claim's task; that claim gets no entry and the kubelet retries.
            Err(e) => tracing::error!(error = %e, "claim task failed"),
        }
    }
    out
}

fn claim_ref(namespace: String, name: String, uid: String) -> ClaimRef {
    ClaimRef {
        namespace,
        name,
        uid,
    }
}

#[tonic::async_trait]
impl<S: ClaimSource> v1::dra_plugin_server::DraPlugin for DraService<S> {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = request.into_inner().claims;
        let claims = claims
            .into_iter()
            .map(|c| claim_ref(c.namespace, c.name, c.uid))
            .collect();
        let claims = self
            .prepare_all(claims, "v1")
            .await
            .into_iter()
            .map(|(uid, r)| {
                let resp = match r {
                    Ok(devices) => v1::NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| v1::Device {
                                request_names: kubelet_request_names(d.request_names),
                                pool_name: d.pool_name,
                                device_name: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: d.share_id,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(error) => v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: error.to_string(),
                    },
                };
                (uid, resp)
            })
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| claim_ref(c.namespace, c.name, c.uid))
            .collect();
        let claims = self
            .unprepare_all(claims, "v1")
            .await
            .into_iter()
            .map(|(uid, r)| {
                let error = r.err().map(|e| e.to_string()).unwrap_or_default();
                (uid, v1::NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl<S: ClaimSource> v1beta1::dra_plugin_server::DraPlugin for DraService<S> {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| claim_ref(c.namespace, c.name, c.uid))
            .collect();
        let claims = self
            .prepare_all(claims, "v1beta1")
            .await
            .into_iter()
            .map(|(uid, r)| {
                let resp = match r {
                    // v1beta1 has no share_id: the CDI id still names the share.
                    Ok(devices) => v1beta1::NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| v1beta1::Device {
                                request_names: kubelet_request_names(d.request_names),
                                pool_name: d.pool_name,
                                device_name: d.device_name,
                                cdi_device_ids: d.cdi_device_ids,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(error) => v1beta1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: error.to_string(),
                    },
                };
                (uid, resp)
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| claim_ref(c.namespace, c.name, c.uid))
            .collect();
        let claims = self
            .unprepare_all(claims, "v1beta1")
            .await
            .into_iter()
            .map(|(uid, r)| {
                let error = r.err().map(|e| e.to_string()).unwrap_or_default();
                (uid, v1beta1::NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

/// Binds a unix socket at `path` with mode 0600: bound under a hidden temporary name in the
/// same directory, chmod-ed, then renamed over `path` (replacing a stale socket).
pub fn bind_private(path: &Path) -> Result<UnixListener, GrpcError> {
    let err = |op, source| GrpcError::Socket {
        path: path.to_owned(),
        op,
        source,
    };
    let dir = path
        .parent()
        .ok_or_else(|| err("find the directory of", io::ErrorKind::InvalidInput.into()))?;
    std::fs::create_dir_all(dir).map_err(|e| err("create the directory of", e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(err("remove a stale temporary socket for", e));
        }
        _ => {}
    }
    let listener = UnixListener::bind(&tmp).map_err(|e| err("bind", e))?;
    let finish = || -> io::Result<()> {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&tmp, path)
    };
    finish().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err("make private and move into place", e)
    })?;
    Ok(listener)
}

/// The running servers.
pub struct PluginServer {
    sockets: Sockets,
    registration: watch::Receiver<RegistrationState>,
    stop: watch::Sender<bool>,
    tasks: Vec<(PathBuf, JoinHandle<Result<(), tonic::transport::Error>>)>,
}

impl PluginServer {
    /// Binds both sockets and serves: the DRA socket first, then the registration socket
    /// (whose appearance makes the kubelet register the plugin).
    pub async fn start<S: ClaimSource>(
        plugin: Arc<Plugin<S>>,
        sockets: Sockets,
    ) -> Result<Self, GrpcError> {
        Self::start_with_health(plugin, sockets, None).await
    }

    /// [`start`](Self::start), also serving the kubelet's device health stream
    /// (`v1.DRAResourceHealth`, `v1alpha1.DRAResourceHealth`) on the DRA socket and
    /// advertising it in the registration.
    pub async fn start_with_health<S: ClaimSource>(
        plugin: Arc<Plugin<S>>,
        sockets: Sockets,
        health: Option<crate::health::HealthService>,
    ) -> Result<Self, GrpcError> {
        let (stop, stopped) = watch::channel(false);
        let until_stopped = move || {
            let mut rx = stopped.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let driver = plugin.config().driver.clone();
        let dra = DraService::new(plugin);
        let dra_listener = bind_private(&sockets.dra)?;
        let with_health = health.is_some();
        let router = tonic::transport::Server::builder()
            .add_service(v1::dra_plugin_server::DraPluginServer::new(dra.clone()))
            .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(dra))
            .add_optional_service(health.clone().map(
                fgpu_api::proto::drahealth::v1::dra_resource_health_server::DraResourceHealthServer::new,
            ))
            .add_optional_service(health.map(
                fgpu_api::proto::drahealth::v1alpha1::dra_resource_health_server::DraResourceHealthServer::new,
            ));
        let dra_task = tokio::spawn(
            router.serve_with_incoming_shutdown(relayed(dra_listener), until_stopped()),
        );
        let mut registration = RegistrationService::new(&driver, &sockets.dra);
        if with_health {
            registration
                .info
                .supported_versions
                .extend([kubelet::DRA_HEALTH_V1, kubelet::DRA_HEALTH_V1ALPHA1].map(str::to_owned));
        }
        let state = registration.subscribe();
        let reg_listener = match bind_private(&sockets.registration) {
            Ok(l) => l,
            Err(e) => {
                stop.send_replace(true);
                let _ = dra_task.await;
                let _ = std::fs::remove_file(&sockets.dra);
                return Err(e);
            }
        };
        let reg_task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(reg::registration_server::RegistrationServer::new(
                    registration,
                ))
                .serve_with_incoming_shutdown(relayed(reg_listener), until_stopped()),
        );
        tracing::info!(registration = %sockets.registration.display(), dra = %sockets.dra.display(), "serving the kubelet plugin sockets");
        Ok(Self {
            tasks: vec![
                (sockets.dra.clone(), dra_task),
                (sockets.registration.clone(), reg_task),
            ],
            sockets,
            registration: state,
            stop,
        })
    }

    /// The sockets served.
    pub fn sockets(&self) -> &Sockets {
        &self.sockets
    }

    /// Follows what the kubelet said about the registration.
    pub fn registration(&self) -> watch::Receiver<RegistrationState> {
        self.registration.clone()
    }

    /// Stops both servers and removes the sockets (the registration socket first, so the
    /// kubelet deregisters the plugin).
    pub async fn shutdown(self) -> Result<(), GrpcError> {
        let _ = std::fs::remove_file(&self.sockets.registration);
        self.stop.send_replace(true);
        let mut first_error = None;
        for (path, task) in self.tasks {
            let detail = match task.await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(detail) = detail {
                first_error.get_or_insert(GrpcError::Serve { path, detail });
            }
        }
        let _ = std::fs::remove_file(&self.sockets.dra);
        first_error.map_or(Ok(()), Err)
    }
}

/// The request names the kubelet matches a container's claim reference against: the
/// claim's requests, without the `/<subrequest>` of a `firstAvailable` alternative (the
/// kubelet compares them with the container's `resources.claims[].request`, which names
/// the request; a result of `gpu/large` must answer as `gpu`, or the container gets none of
/// the claim's CDI devices), each once.
fn kubelet_request_names(names: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let base = match name.split_once('/') {
            Some((base, _)) => base.to_owned(),
            None => name,
        };
        if !out.contains(&base) {
            out.push(base);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::kubelet_request_names;

    #[test]
    fn the_kubelet_gets_request_names_without_subrequests() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(kubelet_request_names(v(&["gpu"])), ["gpu"]);
        assert_eq!(kubelet_request_names(v(&["gpu/mem-81559mi"])), ["gpu"]);
        assert_eq!(
            kubelet_request_names(v(&["a/x", "a/y", "b", "a"])),
            ["a", "b"]
        );
        assert!(kubelet_request_names(Vec::new()).is_empty());
    }
}
