//! `fgpu_kubelet_plugin`: the node side of fgpu's DRA driver, as a library so that every
//! piece can be tested without a kubelet or a cluster. The binary (`main.rs`) only parses
//! flags and wires these together.
//!
//! Pure computation:
//!
//! * [`claim`]: the ResourceClaim model (`fgpu_api::dra::claim`: tolerant serde structs).
//! * [`grant`]: what each allocated device grants (consumedCapacity, opaque config, whole
//!   device), with errors naming the claim and the field.
//! * [`edits`]: a claim's container edits and CDI spec, device ordinals in container order;
//!   a MIG claim's spec (its instances' nodes and identity, no shim).
//! * [`driver_files`]: the NVIDIA user-space files for containers (toolkit spec or
//!   discovery).
//! * [`slices`]: the node's ResourceSlices (with or without consumable capacity, per API
//!   version, per GPU mode).
//! * [`device_attrs`]: the attributes a GPU's devices share (product, versions,
//!   topology).
//! * [`mig_slice`]: a MIG-mode GPU's devices: placements consuming a counter set
//!   (partitionable devices), or the admin's fixed layout.
//! * [`gpu_mode`]: each GPU's mode (`shared`, `mig`, `whole`) from node labels, flags and
//!   the backend, and the refusal of a change while the GPU holds claims.
//! * [`tier`]: the oversubscribed research tier: each GPU's ratio from node labels and
//!   flags, and what a claim may get on a tier GPU.
//! * [`metrics`]: the Prometheus metrics.
//!
//! State and side effects:
//!
//! * [`checkpoint`]: the versioned, tolerant, atomically written record of prepared claims.
//! * [`prepare`]: prepare/unprepare orchestration against a [`prepare::ClaimSource`], with
//!   per-claim locking, idempotence and stale-claim cleanup; MIG instances created,
//!   destroyed and reconciled at start through the backend.
//! * [`authority`]: relays the kubelet's connections, fixing the `:authority` that
//!   tonic's HTTP/2 layer would refuse.
//! * [`grpc`]: the kubelet-facing gRPC servers (registration, DRA `v1` and `v1beta1`) on
//!   unix sockets.
//! * [`claim_cache`]: this node's allocated claims, kept by a watch, so that a prepare
//!   usually reads its claim without an API request (falls back to the GET).
//! * [`cluster`]: the API server through kube-rs: version negotiation, claim GET and watch,
//!   slice publishing.
//! * [`monitor`]: the node monitor — what every claim really uses (host PIDs → pod →
//!   claim), the shim's utilisation feed, and the backstop for bypassed quotas.
//! * [`podresources`]: the kubelet's pod resources API (`List`): which pod the device
//!   plugin's `Allocate` serves, and which containers use which claim (the monitor).
//! * [`driver_limits`]: driver-native memory limits (NVIDIA r615+): which GPUs have them
//!   (the `enforcement` attribute), the CDI hook that sets a container's, their clearing.
//! * [`health`]: the GPU health monitor (checks, transitions, Node Events), the slice's
//!   device taints and the kubelet's `DRAResourceHealth` stream; shared with the device
//!   plugin.
//! * [`serve`]: the daemon's loop tying the above together.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod authority;
pub mod checkpoint;
pub mod claim;
pub mod claim_cache;
pub mod cluster;
pub mod device_attrs;
pub mod device_plugin;
pub mod driver_files;
#[cfg(feature = "nvml")]
pub mod driver_limits;
pub mod edits;
pub mod gpu_mode;
pub mod grant;
pub mod grpc;
pub mod health;
pub mod metrics;
pub mod mig_slice;
pub mod monitor;
pub mod podresources;
pub mod prepare;
pub mod serve;
pub mod slices;
pub mod tier;
