//! fgpu's domain logic. Nothing here talks to the API server or to sockets.
//!
//! * [`device`]: the GPU model every other part speaks.
//! * [`backend`]: where devices come from (`nvml` on a real node, `fake` from a YAML profile).
//! * [`cdi`]: the per-claim CDI spec (container edits) built with the CNCF CDI crate.
//! * [`engine`]: fit and score a request against an inventory under a placement policy.
//! * [`ledger`]: granted usage per GPU, rebuilt from the list of granted allocations.
//! * [`sim`]: the trace simulator that replays the Alibaba GPU trace through the engine.

pub mod backend;
pub mod cdi;
pub mod device;
pub mod engine;
pub mod grant;
pub mod ledger;
pub mod sim;
