//! The ResourceClaim model the plugin reads: `fgpu_api::dra::claim` (typed, tolerant, the
//! same JSON in every served version), re-exported under the plugin's old path.

pub use fgpu_api::dra::claim::*;
