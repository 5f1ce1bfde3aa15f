//! fgpu's domain logic. Nothing here talks to the API server or to sockets.
//!
//! * [`device`]: the GPU model every other part speaks.
//! * [`backend`]: where devices come from (`nvml` on a real node, feature `nvml`; `fake`
//!   from a YAML profile).
//! * [`cdi`]: the per-claim CDI spec (container edits) built with the CNCF CDI crate
//!   (feature `cdi`: only the kubelet plugin writes CDI specs, and the CDI crate brings an
//!   HTTP client and a second TLS provider that nothing else should link).
//! * [`grant`]: what an allocation result grants a claim.
//! * [`health`]: device faults, the admin's health policy and the per-GPU health state
//!   machine (unhealthy at once, healthy again after N clean checks).
//! * [`mig`]: Multi-Instance GPU: NVIDIA's profile tables, a MIG-mode GPU's free
//!   placements, the choice of profile and placement for a request, and the GPU as DRA
//!   partitionable devices (counters and placement devices).
//! * [`engine`]: fit and score a request against an inventory under a placement policy.
//! * [`hami`]: HAMi's pod resources and annotations → engine requests and policy (the
//!   extender and the DRA controller both read pods through it).
//! * [`ledger`]: granted usage per GPU, rebuilt from the list of granted allocations.
//! * [`sim`]: the trace simulator that replays the Alibaba GPU trace through the engine,
//!   and the reader of its allocation curves (`sim::curves`).
//!
//! Layering: `device` and `engine` use nothing above them; `mig` uses `device`; `backend`
//! uses `mig`; `backend`, `cdi` and `grant` use `device`; `backend` uses `health`, which uses nothing; `hami`, `ledger` and `sim`
//! use `engine`.

// No unsafe code but in the NVML backend's driver-limits and MIG modules (DESIGN.md), which
// opt in.
#![deny(unsafe_code)]

pub mod backend;
#[cfg(feature = "cdi")]
pub mod cdi;
pub mod device;
pub mod engine;
pub mod grant;
pub mod hami;
pub mod health;
pub mod ledger;
pub mod mig;
pub mod sim;
