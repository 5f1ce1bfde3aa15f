//! Serving the plugin socket and registering it with the kubelet, again whenever the
//! kubelet restarts.
//!
//! A restarting kubelet removes every socket in the device-plugins directory and creates a
//! new `kubelet.sock`; the plugin must then serve a new socket and register again. The
//! [`Supervisor`] polls (every `poll`, one `stat` each): when `kubelet.sock` is a new file
//! (another inode or modification time) or the plugin's own socket is gone, it rebinds the
//! plugin socket and registers; a failed registration is retried at the next poll.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fgpu_api::names::kubelet;
use fgpu_api::proto::deviceplugin::v1beta1 as dp;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

use super::pods::PodSource;
use super::service::{DevicePluginService, options};
use crate::grpc::bind_private;

/// Registration failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot register {resource} with the kubelet at {}: {detail}", socket.display())]
pub struct RegisterError {
    /// The kubelet's socket.
    pub socket: PathBuf,
    /// The resource name.
    pub resource: String,
    /// The cause.
    pub detail: String,
}

/// Calls the kubelet's `Registration.Register` at `kubelet_socket` for `resource`, served on
/// `endpoint` (a file name in the kubelet's device-plugins directory).
pub async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource: &str,
) -> Result<(), RegisterError> {
    let err = |detail: String| RegisterError {
        socket: kubelet_socket.to_owned(),
        resource: resource.to_owned(),
        detail,
    };
    let channel =
        tonic::transport::Endpoint::from_shared(format!("unix://{}", kubelet_socket.display()))
            .map_err(|e| err(e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| err(format!("connect: {e}")))?;
    dp::registration_client::RegistrationClient::new(channel)
        .register(dp::RegisterRequest {
            version: kubelet::DEVICE_PLUGIN_VERSION.to_owned(),
            endpoint: endpoint.to_owned(),
            resource_name: resource.to_owned(),
            options: Some(options()),
        })
        .await
        .map_err(|s| err(format!("{}: {}", s.code(), s.message())))?;
    Ok(())
}

/// Where the plugin lives and what it registers.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// The kubelet's device-plugins directory.
    pub dir: PathBuf,
    /// The plugin's socket file name in it (`fgpu.sock`).
    pub socket_name: String,
    /// The resource (`nvidia.com/gpu`).
    pub resource: String,
    /// How often the kubelet socket is checked.
    pub poll: Duration,
}

impl Endpoints {
    /// `<dir>/kubelet.sock`.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.dir.join("kubelet.sock")
    }

    /// `<dir>/<socket name>`.
    pub fn plugin_socket(&self) -> PathBuf {
        self.dir.join(&self.socket_name)
    }
}

/// The identity of a file: (device, inode, modification time in ns).
fn identity(path: &Path) -> Option<(u64, u64, i64)> {
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.mtime() * 1_000_000_000 + m.mtime_nsec()))
}

/// One served socket.
struct Served {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Served {
    /// Stops gracefully, or after 2 s by force (a kubelet's open `ListAndWatch` stream
    /// would otherwise hold the graceful shutdown forever).
    async fn stop(mut self) {
        self.stop.send_replace(true);
        if tokio::time::timeout(Duration::from_secs(2), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

/// The connections of `listener`, relayed through [`crate::authority`]: kubelets before
/// kubernetes/kubernetes#112597 dial the device plugin with the socket path as `:authority`,
/// which tonic's HTTP/2 layer refuses.
fn relayed(
    listener: tokio::net::UnixListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::io::DuplexStream>> {
    use tokio_stream::StreamExt as _;
    UnixListenerStream::new(listener).map(|conn| conn.map(crate::authority::serve_connection))
}

fn serve<P: PodSource>(
    path: &Path,
    service: Arc<DevicePluginService<P>>,
) -> Result<Served, crate::grpc::GrpcError> {
    let listener = bind_private(path)?;
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(dp::device_plugin_server::DevicePluginServer::from_arc(
                service,
            ))
            .serve_with_incoming_shutdown(relayed(listener), async move {
                let _ = stopped.wait_for(|s| *s).await;
            }),
    );
    Ok(Served { stop, task })
}

/// Keeps the plugin socket served and registered until `shutdown` completes; then removes
/// the socket. `registered` counts the successful registrations (for tests and logs).
pub async fn supervise<P: PodSource>(
    ep: Endpoints,
    service: Arc<DevicePluginService<P>>,
    registered: watch::Sender<u64>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let kubelet_sock = ep.kubelet_socket();
    let plugin_sock = ep.plugin_socket();
    let mut served: Option<Served> = None;
    // The kubelet socket we registered with; None: (re)register at the next poll.
    let mut registered_with: Option<(u64, u64, i64)> = None;
    let mut tick = tokio::time::interval(ep.poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        let kubelet_now = identity(&kubelet_sock);
        let socket_gone = !plugin_sock.exists();
        let kubelet_changed = registered_with.is_some() && kubelet_now != registered_with;
        if served.is_some() && (socket_gone || kubelet_changed) {
            tracing::info!(kubelet = %kubelet_sock.display(), socket_gone, kubelet_changed,
                "the kubelet restarted or removed our socket: serving anew and registering again");
            if let Some(s) = served.take() {
                s.stop().await;
            }
            registered_with = None;
        }
        if served.is_none() {
            match serve(&plugin_sock, service.clone()) {
                Ok(s) => served = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot serve the device plugin socket; retrying");
                    continue;
                }
            }
        }
        if registered_with.is_none() && kubelet_now.is_some() {
            match register(&kubelet_sock, &ep.socket_name, &ep.resource).await {
                Ok(()) => {
                    tracing::info!(resource = %ep.resource, socket = %plugin_sock.display(),
                        "registered with the kubelet");
                    registered_with = kubelet_now;
                    registered.send_modify(|n| *n += 1);
                }
                Err(e) => tracing::warn!(error = %e, "registration failed; retrying"),
            }
        }
    }
    if let Some(s) = served.take() {
        let _ = std::fs::remove_file(&plugin_sock);
        s.stop().await;
    }
}
