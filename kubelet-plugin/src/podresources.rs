//! The kubelet's pod resources API: which pod the kubelet is admitting (the device plugin),
//! and which containers of a pod use which ResourceClaim (the node monitor).
//!
//! `Allocate` names no pod. The kubelet admits pods one at a time: it adds the pod to its
//! pod manager, then runs admission, whose device manager calls `Allocate`, and records the
//! devices it got only after `Allocate` returns. So, during an `Allocate`, the kubelet's
//! `PodResourcesLister.List` shows the pod being admitted with **no** devices of our resource
//! for the container being allocated, shows every pod admitted before with its devices, and
//! does not show the pods it has not reached yet. That singles out the pod among several
//! bound at once whose next containers ask for the same number of GPUs (where the earliest
//! bind rule of [`super::pods`] can guess wrong and swap two pods' grants).
//!
//! [`KubeletPods`] is that view; [`list`] reads it from the socket. The caller falls back
//! to the earliest-bind rule when the socket cannot be read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use fgpu_api::proto::podresources::v1 as pr;

/// Default socket of the kubelet's pod resources API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The kubelet's pods (`namespace/name`) and, per container, whether it has devices of the
/// plugin's resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeletPods {
    pods: BTreeMap<String, BTreeMap<String, bool>>,
}

impl KubeletPods {
    /// The view of `resp` for `resource`.
    pub fn from_response(resp: &pr::ListPodResourcesResponse, resource: &str) -> Self {
        let pods =
            resp.pod_resources
                .iter()
                .map(|p| {
                    let containers =
                        p.containers
                            .iter()
                            .map(|c| {
                                let has = c.devices.iter().any(|d| {
                                    d.resource_name == resource && !d.device_ids.is_empty()
                                });
                                (c.name.clone(), has)
                            })
                            .collect();
                    (format!("{}/{}", p.namespace, p.name), containers)
                })
                .collect();
        Self { pods }
    }

    /// Whether the kubelet knows pod `key` (`namespace/name`) and its container `container`
    /// has no devices of the resource yet: it is being admitted (or was refused).
    pub fn waiting(&self, key: &str, container: &str) -> bool {
        self.pods
            .get(key)
            .and_then(|cs| cs.get(container))
            .is_some_and(|has| !has)
    }

    /// The pods the kubelet knows.
    pub fn keys(&self) -> BTreeSet<&str> {
        self.pods.keys().map(String::as_str).collect()
    }
}

/// The kubelet's pod resources API could not be read; each message names the socket and
/// the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    /// The socket path does not make an endpoint URI.
    #[error("pod resources API at {}: {source}", socket.display())]
    Endpoint {
        /// The socket.
        socket: PathBuf,
        /// Why the URI was refused.
        #[source]
        source: tonic::transport::Error,
    },
    /// Nothing answered on the socket.
    #[error("pod resources API at {}: connect: {source}", socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why the connection failed.
        #[source]
        source: tonic::transport::Error,
    },
    /// The kubelet answered `List` with an error.
    #[error("pod resources API at {}: List: {code}: {message}", socket.display())]
    List {
        /// The socket.
        socket: PathBuf,
        /// The gRPC status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
}

/// Reads the kubelet's pods from the pod resources socket; the error says what failed.
pub async fn list(socket: &Path, resource: &str) -> Result<KubeletPods, PodResourcesError> {
    Ok(KubeletPods::from_response(
        &list_all(socket).await?,
        resource,
    ))
}

/// The kubelet's whole `List` answer (every pod, container, device and ResourceClaim).
pub async fn list_all(socket: &Path) -> Result<pr::ListPodResourcesResponse, PodResourcesError> {
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
        .map_err(|source| PodResourcesError::Endpoint {
            socket: socket.to_owned(),
            source,
        })?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|source| PodResourcesError::Connect {
            socket: socket.to_owned(),
            source,
        })?;
    let resp = pr::pod_resources_lister_client::PodResourcesListerClient::new(channel)
        .list(pr::ListPodResourcesRequest {})
        .await
        .map_err(|s| PodResourcesError::List {
            socket: socket.to_owned(),
            code: s.code(),
            message: s.message().to_owned(),
        })?;
    Ok(resp.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (container, [(resource, device ids)]).
    type Container<'a> = (&'a str, &'a [(&'a str, &'a [&'a str])]);

    /// A response: (namespace/name, containers).
    fn response(pods: &[(&str, &[Container<'_>])]) -> pr::ListPodResourcesResponse {
        pr::ListPodResourcesResponse {
            pod_resources: pods
                .iter()
                .map(|(key, cs)| {
                    let (ns, name) = key.split_once('/').unwrap();
                    pr::PodResources {
                        name: name.into(),
                        namespace: ns.into(),
                        containers: cs
                            .iter()
                            .map(|(c, devs)| pr::ContainerResources {
                                name: (*c).into(),
                                devices: devs
                                    .iter()
                                    .map(|(r, ids)| pr::ContainerDevices {
                                        resource_name: (*r).into(),
                                        device_ids: ids.iter().map(|s| (*s).into()).collect(),
                                    })
                                    .collect(),
                                dynamic_resources: vec![],
                            })
                            .collect(),
                    }
                })
                .collect(),
        }
    }

    #[test]
    fn waiting_is_a_known_container_without_devices_of_the_resource() {
        let gpu = "nvidia.com/gpu";
        let resp = response(&[
            ("ml/admitted", &[("main", &[(gpu, &["GPU-a::1"])])]),
            (
                "ml/admitting",
                &[("main", &[]), ("side", &[(gpu, &["GPU-a::2"])])],
            ),
            (
                "ml/other-resource",
                &[("main", &[("example.com/x", &["x"])])],
            ),
            ("ml/empty-ids", &[("main", &[(gpu, &[])])]),
        ]);
        let k = KubeletPods::from_response(&resp, gpu);
        assert!(!k.waiting("ml/admitted", "main"));
        assert!(k.waiting("ml/admitting", "main"));
        assert!(!k.waiting("ml/admitting", "side"));
        assert!(!k.waiting("ml/admitting", "gone"), "unknown container");
        assert!(k.waiting("ml/other-resource", "main"));
        assert!(k.waiting("ml/empty-ids", "main"));
        assert!(
            !k.waiting("ml/not-reached", "main"),
            "a pod the kubelet has not reached"
        );
        assert_eq!(k.keys().len(), 4);
    }
}
