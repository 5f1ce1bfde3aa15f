//! Kubelet gRPC APIs, generated at build time from the `.proto` files in `api/proto/`.
//!
//! Package names are those of upstream Kubernetes, so the gRPC paths (for example
//! `/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources`) match what the kubelet
//! calls. Each module holds the prost messages plus a tonic client (`*_client`) and server
//! (`*_server`) for its services. No transport is compiled in: bring a channel or a server
//! from `tonic`'s `transport` feature in the binary that does the I/O.

/// Generated code is exempt from the crate's lints.
macro_rules! generated {
    ($(#[$meta:meta])* $name:ident => $package:literal) => {
        $(#[$meta])*
        #[allow(
            missing_docs,
            clippy::all,
            clippy::pedantic,
            clippy::nursery,
            rustdoc::all
        )]
        pub mod $name {
            include!(concat!(env!("OUT_DIR"), "/", $package, ".rs"));
        }
    };
}

/// Dynamic Resource Allocation: the kubelet asks the driver to prepare and unprepare claims.
pub mod dra {
    generated!(
        /// `k8s.io.kubelet.pkg.apis.dra.v1` (kubelet 1.34+; `Device.share_id` since 1.35).
        /// Advertised at registration as `v1.DRAPlugin`.
        v1 => "k8s.io.kubelet.pkg.apis.dra.v1"
    );
    generated!(
        /// `k8s.io.kubelet.pkg.apis.dra.v1beta1` (kubelet 1.32+; no `share_id`).
        /// Advertised at registration as `v1beta1.DRAPlugin`.
        v1beta1 => "k8s.io.kubelet.pkg.apis.dra.v1beta1"
    );
}

/// DRA device health streaming (KEP-4680), served beside [`dra`] on the same socket.
pub mod drahealth {
    generated!(
        /// Package `v1alpha1` (kubelet 1.34+), advertised as `v1alpha1.DRAResourceHealth`.
        v1alpha1 => "v1alpha1"
    );
    generated!(
        /// Package `v1` (kubelet 1.37+), advertised as `v1.DRAResourceHealth`. The pod
        /// resources API is package `v1` too, so its types are generated into this module
        /// as well; use them through [`podresources::v1`](crate::proto::podresources::v1).
        v1 => "v1"
    );
}

generated!(
    /// Kubelet plugin registration (package `pluginregistration`, API v1): the kubelet's
    /// plugin watcher calls `GetInfo` and `NotifyRegistrationStatus` on the plugin.
    pluginregistration => "pluginregistration"
);

/// Device plugin API (the legacy, pre-DRA path).
pub mod deviceplugin {
    generated!(
        /// Package `v1beta1`: `Registration` (served by the kubelet) and `DevicePlugin`
        /// (served by the plugin), including `cdi_devices` in `ContainerAllocateResponse`.
        v1beta1 => "v1beta1"
    );
}

/// Pod resources API (package `v1`): the kubelet's `PodResourcesLister` on
/// `/var/lib/kubelet/pod-resources/kubelet.sock`, which pods it knows and which devices it
/// gave their containers. The device plugin reads it in `Allocate` to learn which pod the
/// kubelet is admitting. Generated into [`drahealth::v1`] (same proto package), named here.
pub mod podresources {
    /// Package `v1`: `PodResourcesLister.List` and its messages.
    pub mod v1 {
        pub use crate::proto::drahealth::v1::{
            ClaimResource, ContainerDevices, ContainerResources, DynamicResource,
            ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
            pod_resources_lister_client, pod_resources_lister_server,
        };
    }
}
