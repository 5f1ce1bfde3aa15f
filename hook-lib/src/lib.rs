//! `libfgpu.so`: the in-container shim that enforces GPU memory and core quotas.
//!
//! Loaded into every dynamically linked process (`/etc/ld.so.preload` or `LD_PRELOAD`),
//! it interposes the CUDA driver API and NVML. It does nothing at load time: the
//! configuration is read on the first CUDA call, and with no quota set every call is
//! forwarded untouched. See README.md for the contract.
//!
//! Table of contents:
//! - [`config`]: where limits come from (limits file > FGPU env > HAMi env), value syntax.
//! - [`core`]: the core (SM) limiter (GCRA bucket + feedback on NVML) and priority.
//! - [`state`]: the claim's shared account file (header, device table, process slots).
//! - [`process`]: per-process state, rebuilt after `fork`.
//! - [`track`]: what this process allocated (pointer/handle → size).
//! - [`hooks`]: the exported `cu*` / `nvml*` entry points.
//! - [`procaddr`]: the exported `cuGetProcAddress[_v2]`, their answers and the hook table.
//! - `dlsym`: the exported `dlsym` (assembly stub + hook).
//! - [`real`]: the real driver, resolved lazily.
//! - [`boundary`]: the panic guard, the re-entrancy flag and the forwarding call.

pub mod boundary;
pub mod config;
pub mod core;
mod dlsym;
pub mod ffi;
pub mod hooks;
pub mod log;
pub mod procaddr;
pub mod process;
pub mod real;
pub mod state;
pub mod track;
