//! `libfgpu.so`: the in-container shim that enforces GPU memory and core quotas.
//!
//! Loaded into every dynamically linked process (`/etc/ld.so.preload` or `LD_PRELOAD`),
//! it interposes the CUDA driver API and NVML. It does nothing at load time: the
//! configuration is read on the first CUDA call, and with no quota set every call is
//! forwarded untouched. See README.md for the contract.
//!
//! Modules, top to bottom: a module uses only modules listed below it (its `uses`
//! column; `ffi` and `log`, at the bottom, may be used by any), never one above it, so
//! the module graph is a DAG.
//!
//! | layer | module | what it is | uses |
//! |---|---|---|---|
//! | entry | `dlsym` | the exported `dlsym` and `dlvsym` (assembly stubs + hooks) | `procaddr`, `real` |
//! | entry | [`procaddr`] | the exported `cuGetProcAddress[_v2]`, their answers and the hook table | `hooks`, `process`, `real`, `boundary` |
//! | entry | [`hooks`] | the exported `cu*` / `nvml*` entry points, one file per kind | `core`, `process`, `track`, `real`, `boundary` |
//! | policy | [`core`] | the core (SM) limiter (GCRA bucket + feedback on NVML or the feed) and priority | `identity`, `feed`, `process`, `config`, `claims`, `real`, `boundary`, `elf` |
//! | policy | [`identity`] | the process's own NVML (host) PID, by a memory fingerprint | `real` |
//! | process | [`process`] | per-process state (configuration incl. finding the claims, account, trackers, pools), rebuilt after `fork` | `config`, `claims`, `state`, `track`, `real`, `boundary` |
//! | driver | [`boundary`] | the panic guard, the re-entrancy flag and the forwarding call | `real` |
//! | driver | [`real`] | the real driver and NVML, resolved lazily; the real `dlsym`/`dlvsym` | `elf` |
//! | driver | [`elf`] | a symbol from the loaded libraries' own tables (finds glibc's `dlvsym`) or the vDSO's (the limiter's clock) | — |
//! | data | [`state`] | the claim's shared account file (header, device table, process slots) | `config` |
//! | data | [`config`] | where limits come from (claim mode; else limits file > FGPU env > HAMi env), value syntax | `claims` |
//! | data | [`claims`] | the plugin's limits files (contract v2): parsing, trust, merging claims | — |
//! | data | [`feed`] | the node's utilisation feed (contract, "The utilisation feed") | `claims` |
//! | data | [`track`] | what this process allocated (pointer/handle → size) | — |
//! | base | [`ffi`] | the CUDA / NVML types and constants the shim uses | — |
//! | base | [`log`] | `debug!`: one line per decision on stderr with `FGPU_LOG=debug` | — |
//!
//! Inside [`hooks`], `charge` (the booking the allocation files share) is below every
//! other file and uses none of them.

pub mod boundary;
pub mod claims;
pub mod config;
pub mod core;
mod dlsym;
pub mod elf;
pub mod feed;
pub mod ffi;
pub mod hooks;
pub mod identity;
pub mod log;
pub mod procaddr;
pub mod process;
pub mod real;
pub mod state;
pub mod track;
