//! The exported CUDA driver and NVML entry points. Each checks the quota (when one is
//! set), forwards to the real driver, and books the result. Panics never cross the
//! boundary: every body runs in `guard`.
//!
//! One file per kind of entry point (the section banners of the former `hooks.rs`);
//! the booking the allocation files share is in `charge`, below all of them:
//! - `charge`: reserve / charge / give back, the pools' refresh (shared, not exported).
//! - `alloc`: plain allocations (`cuMemAlloc`, managed, pitch, `cuMemFree`).
//! - `arrays`: CUDA arrays (2D, 3D, mipmapped).
//! - `vmm`: virtual memory management (`cuMemCreate`, `cuMemRelease`).
//! - `stream_ordered`: stream-ordered allocation and memory pools.
//! - `sync`: stream, event and context synchronisation (pools give memory back there).
//! - `context`: contexts and `cuCtxSetLimit` (the memory they take, charged).
//! - `info`: what the process is told (`cuMemGetInfo`, `cuDeviceTotalMem`).
//! - `launch`: kernel and graph launches, through the core limiter.
//! - `nvml`: `nvmlDeviceGetMemoryInfo[_v2]`.
//!
//! `cuGetProcAddress[_v2]` are in [`crate::procaddr`], beside the table they answer from.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

mod alloc;
mod arrays;
mod charge;
mod context;
mod info;
mod launch;
mod nvml;
mod stream_ordered;
mod sync;
mod vmm;

pub use crate::boundary::guard;
pub use alloc::*;
pub use arrays::*;
pub use context::*;
pub use info::*;
pub use launch::*;
pub use nvml::*;
pub use stream_ordered::*;
pub use sync::*;
pub use vmm::*;
