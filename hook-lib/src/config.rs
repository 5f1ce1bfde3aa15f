//! The quota contract: where limits come from, and how values are written.
//!
//! Precedence (first that sets any memory limit wins, as a whole):
//! 1. the limits file (`FGPU_LIMITS_FILE`, else `/etc/fgpu/limits` if present): `KEY=VALUE`
//!    lines with the FGPU names;
//! 2. the FGPU environment: `FGPU_MEMORY_LIMIT`, `FGPU_MEMORY_LIMIT_<i>`, `FGPU_STATE_DIR`;
//! 3. HAMi-core's names, only when no `FGPU_*` name is set at all:
//!    `CUDA_DEVICE_MEMORY_LIMIT[_<i>]`, `CUDA_DEVICE_MEMORY_SHARED_CACHE`.
//!
//! The core quota (`FGPU_CORE_LIMIT[_<i>]`, percent; HAMi's `CUDA_DEVICE_SM_LIMIT[_<i>]`)
//! follows the same precedence, decided separately; `FGPU_CORE_POLICY`, `FGPU_PRIORITY`
//! (HAMi's `CUDA_TASK_PRIORITY`) and `FGPU_GPU_DIR` come from the file, else the
//! environment.
//!
//! **Claim mode** overrides all of the above: when `/etc/fgpu/claims` exists, the
//! plugin's limits files mounted there are the only source ([`crate::claims`],
//! `docs/shim-contract.md`); no variable redirects or loosens them, limits are keyed by
//! GPU UUID, and a problem refuses every device allocation.
//!
//! Pure code: the caller passes the file text and an environment lookup (claim mode:
//! the parsed view, and later the ordinal → UUID resolver).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::claims::{GpuLimits, Rule, View};

/// Devices with a per-device limit and a column in the accounting file.
pub const MAX_DEVICES: usize = 16;
/// Read when `FGPU_LIMITS_FILE` is unset (the kubelet plugin may mount it read-only).
pub const DEFAULT_LIMITS_FILE: &str = "/etc/fgpu/limits";
/// HAMi-core's default shared region (we use this path + `.fgpu`).
pub const HAMI_DEFAULT_CACHE: &str = "/tmp/cudevshr.cache";
/// Name of the accounting file inside `FGPU_STATE_DIR`.
pub const STATE_FILE_NAME: &str = "fgpu-memory.state";
/// Name of the core limiter's file inside `FGPU_STATE_DIR`.
pub const CORE_FILE_NAME: &str = "fgpu-core.state";

pub use crate::claims::{CorePolicy, Priority};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    None,
    File,
    FgpuEnv,
    HamiEnv,
}

/// Resolves a CUDA ordinal to its GPU's UUID (`None`: no such device).
pub type UuidOf = fn(i32) -> Option<[u8; 16]>;

#[derive(Debug)]
pub struct Config {
    /// Any limit set: memory calls are checked and counted. Otherwise pure pass-through.
    pub enabled: bool,
    pub source: Source,
    pub default_limit: Option<u64>,
    pub limits: [Option<u64>; MAX_DEVICES],
    /// The shared accounting file; `None` → accounting local to the process.
    pub state_path: Option<PathBuf>,
    pub debug: bool,
    /// Where the core quota came from (same precedence as memory, decided separately).
    pub core_source: Source,
    pub core_default: Option<u32>,
    pub core_limits: [Option<u32>; MAX_DEVICES],
    pub core_policy: CorePolicy,
    pub priority: Priority,
    /// The per-GPU coordination directory (`FGPU_GPU_DIR`), for priority.
    pub gpu_dir: Option<PathBuf>,
    /// The claim's core-limiter file; `None` → local to the process.
    pub core_state_path: Option<PathBuf>,
    /// Problems found while reading (logged once by the caller when debug is on).
    pub warnings: Vec<String>,
    /// Bytes charged per context (`context_overhead=` / `FGPU_CONTEXT_OVERHEAD`).
    pub context_overhead: u64,
    /// The node's utilisation feed (claim mode: the file's `feed=`; env mode:
    /// `FGPU_FEED_FILE`).
    pub feed_path: Option<PathBuf>,
    /// Claim mode: the container's claims. `None`: env mode.
    pub claims: Option<View>,
    /// Claim mode: ordinal → rule cache (0 unresolved, 1 refused, 2 + i: GPU i of
    /// [`Config::claim_gpus`]).
    ord_rule: [AtomicU32; MAX_DEVICES],
    /// Claim mode: (claim index, UUID, limits) of every GPU named by exactly one claim.
    claim_gpus: Vec<(usize, [u8; 16], GpuLimits)>,
    /// Claim mode: how ordinals become UUIDs (set by the caller, which has the driver).
    pub uuid_of: Option<UuidOf>,
}

/// What claim mode says about one device ordinal.
#[derive(Debug, Clone, Copy)]
pub enum Gpu<'a> {
    /// Env mode: the per-ordinal settings apply.
    Env,
    /// Allocations refused.
    Refused,
    /// Named by claim `claim` with these limits.
    Claimed {
        claim: usize,
        uuid: &'a [u8; 16],
        limits: &'a GpuLimits,
    },
}

impl Config {
    /// The quota of device ordinal `i` as the process sees it.
    #[inline]
    pub fn limit(&self, ordinal: i32) -> Option<u64> {
        if !self.enabled {
            return None;
        }
        if self.claims.is_some() {
            return match self.gpu(ordinal) {
                Gpu::Claimed { limits, .. } => limits.memory,
                _ => Some(0),
            };
        }
        let per = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.limits.get(i).copied().flatten());
        per.or(self.default_limit)
    }

    /// Research tier: the part of device ordinal `i`'s quota that device memory backs
    /// (`gpu.<UUID>.physical=` of the plugin's limits file); past it allocations are served
    /// by managed memory. Claim mode only: nothing in the environment sets it. `None`: no
    /// spill.
    #[inline]
    pub fn physical(&self, ordinal: i32) -> Option<u64> {
        if !self.enabled || self.claims.is_none() {
            return None;
        }
        match self.gpu(ordinal) {
            Gpu::Claimed { limits, .. } => limits.physical,
            _ => None,
        }
    }

    /// The core quota (percent, 1–99) of device ordinal `i`; `None` = not throttled.
    #[inline]
    pub fn core_limit(&self, ordinal: i32) -> Option<u32> {
        if self.claims.is_some() {
            return match self.gpu(ordinal) {
                Gpu::Claimed { limits, .. } => limits.cores,
                _ => None,
            };
        }
        let per = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.core_limits.get(i).copied().flatten());
        per.or(self.core_default)
    }

    /// Launches go through the core limiter (a core quota, or a priority other than
    /// normal with a GPU directory to coordinate through).
    pub fn core_active(&self) -> bool {
        if let Some(view) = &self.claims {
            return self.claim_gpus.iter().any(|g| {
                g.2.cores.is_some()
                    || (g.2.priority_file.is_some()
                        && view.claims[g.0].priority != Priority::Normal)
            });
        }
        self.core_source != Source::None
            || (self.priority != Priority::Normal && self.gpu_dir.is_some())
    }

    /// Claim mode: the rule of device `ordinal` (resolved once, then cached). A refusal
    /// is written to stderr once, naming the GPU and why.
    pub fn gpu(&self, ordinal: i32) -> Gpu<'_> {
        let Some(view) = &self.claims else {
            return Gpu::Env;
        };
        let Some(o) = usize::try_from(ordinal).ok().filter(|&o| o < MAX_DEVICES) else {
            return Gpu::Refused;
        };
        let mut v = self.ord_rule[o].load(Ordering::Relaxed);
        if v == 0 {
            let Some(uuid) = self.uuid_of.and_then(|f| f(ordinal)) else {
                return Gpu::Refused; // not cached: the driver may answer later
            };
            v = match self.claim_gpus.iter().position(|g| g.1 == uuid) {
                Some(i) => i as u32 + 2,
                None => {
                    if let Rule::Refused(why) = view.rule(&uuid) {
                        crate::log::always(format_args!(
                            "refusing device allocations on {} (device {ordinal}): {why}",
                            crate::claims::uuid_string(&uuid)
                        ));
                    }
                    1
                }
            };
            self.ord_rule[o].store(v, Ordering::Relaxed);
        }
        match v {
            1 => Gpu::Refused,
            v => {
                let g = &self.claim_gpus[v as usize - 2];
                Gpu::Claimed {
                    claim: g.0,
                    uuid: &g.1,
                    limits: &g.2,
                }
            }
        }
    }

    /// Claim mode: the configuration of the container's claims. Every device allocation
    /// is checked (and refused where the view says so); nothing in `env` counts except
    /// `FGPU_LOG`.
    pub fn from_claims(view: View, env: &dyn Fn(&str) -> Option<String>) -> Config {
        let mut cfg = Config::from_sources(None, &|k| (k == "FGPU_LOG").then(|| env(k)).flatten());
        cfg.enabled = true;
        cfg.source = Source::File;
        if let Some(why) = &view.refuse_all {
            crate::log::always(format_args!("refusing every device allocation: {why}"));
        }
        let mut gpus = Vec::new();
        for (ci, c) in view.claims.iter().enumerate() {
            cfg.warnings.extend(c.warnings.iter().cloned());
            for (uuid, g) in &c.gpus {
                if matches!(view.rule(uuid), Rule::Claimed(..)) {
                    gpus.push((ci, *uuid, g.clone()));
                }
            }
        }
        if view.refuse_all.is_none() {
            let first = &view.claims[0];
            cfg.priority = first.priority;
            cfg.core_policy = first.core_policy;
            cfg.context_overhead = first.context_overhead;
            cfg.feed_path = first.feed.clone();
            cfg.state_path = Some(first.memory_account.clone());
            cfg.core_state_path = first.core_account.clone();
        }
        cfg.claim_gpus = gpus;
        cfg.claims = Some(view);
        if cfg.core_active() {
            cfg.core_source = Source::File;
        }
        cfg
    }

    /// Claim mode: the claim (index) that owns GPU `uuid`, if exactly one does.
    pub fn claim_of(&self, uuid: &[u8; 16]) -> Option<usize> {
        self.claim_gpus.iter().find(|g| g.1 == *uuid).map(|g| g.0)
    }

    /// Claim mode: the memory quota of GPU `uuid` as NVML names it (`Some(0)`: refused;
    /// `None`: no quota). For NVML paths, which know the UUID without a CUDA context.
    pub fn limit_of_uuid(&self, uuid: &[u8; 16]) -> Option<u64> {
        self.claims.as_ref()?;
        match self.claim_gpus.iter().find(|g| g.1 == *uuid) {
            Some(g) => g.2.memory,
            None => Some(0),
        }
    }

    /// Claim mode: the priority file and priority of GPU `uuid`'s claim.
    pub fn priority_of(&self, uuid: &[u8; 16]) -> (Priority, Option<&Path>) {
        let Some(view) = &self.claims else {
            return (self.priority, None);
        };
        match self.claim_gpus.iter().find(|g| g.1 == *uuid) {
            Some(g) => (view.claims[g.0].priority, g.2.priority_file.as_deref()),
            None => (Priority::Normal, None),
        }
    }

    /// Any reason to hand out our wrappers.
    pub fn hooked(&self) -> bool {
        self.enabled || self.core_active()
    }

    /// Builds the configuration. `file` is the limits file's text if one was read. Each
    /// setting is one step below; warnings come in the order of the steps.
    pub fn from_sources(file: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Config {
        let mut warnings = Vec::new();
        let debug = env("FGPU_LOG").is_some_and(|v| v.eq_ignore_ascii_case("debug"));
        let file_kv: Vec<(String, String)> = file.map(parse_kv).unwrap_or_default();
        let file_get = |k: &str| last_value(&file_kv, k);
        let pick = |k: &str| file_get(k).or_else(|| env(k));
        // HAMi's names count only where no FGPU name is set, in the file or the environment.
        let hami = !any_fgpu_name(env) && file_kv.is_empty();
        let hami_cache = env("CUDA_DEVICE_MEMORY_SHARED_CACHE");
        let state_dir = pick("FGPU_STATE_DIR");

        let mut cfg = Config::empty(debug);
        let (source, (default, limits)) = memory_quota(&file_get, env, hami, &mut warnings);
        (cfg.source, cfg.default_limit, cfg.limits) = (source, default, limits);
        cfg.enabled = source != Source::None;
        cfg.state_path = account_path(
            source,
            state_dir.as_deref(),
            hami_cache.as_deref(),
            ".fgpu",
            STATE_FILE_NAME,
        );
        let (source, (default, limits)) = core_quota(&file_get, env, hami, &mut warnings);
        (cfg.core_source, cfg.core_default, cfg.core_limits) = (source, default, limits);
        cfg.core_policy = core_policy(pick("FGPU_CORE_POLICY").as_deref(), &mut warnings);
        cfg.priority = priority(
            pick("FGPU_PRIORITY").as_deref(),
            env("CUDA_TASK_PRIORITY").as_deref(),
            hami,
            &mut warnings,
        );
        cfg.gpu_dir = non_empty_path(pick("FGPU_GPU_DIR"));
        cfg.core_state_path = account_path(
            source,
            state_dir.as_deref(),
            hami_cache.as_deref(),
            ".fgpu-core",
            CORE_FILE_NAME,
        );
        cfg.context_overhead =
            context_overhead(pick("FGPU_CONTEXT_OVERHEAD").as_deref(), &mut warnings);
        cfg.feed_path = non_empty_path(pick("FGPU_FEED_FILE"));
        cfg.warnings = warnings;
        cfg
    }

    /// No quota, no paths, nothing found yet.
    fn empty(debug: bool) -> Config {
        Config {
            enabled: false,
            source: Source::None,
            default_limit: None,
            limits: [None; MAX_DEVICES],
            state_path: None,
            debug,
            core_source: Source::None,
            core_default: None,
            core_limits: [None; MAX_DEVICES],
            core_policy: CorePolicy::Limit,
            priority: Priority::Normal,
            gpu_dir: None,
            core_state_path: None,
            warnings: Vec::new(),
            context_overhead: 0,
            feed_path: None,
            claims: None,
            ord_rule: Default::default(),
            claim_gpus: Vec::new(),
            uuid_of: None,
        }
    }
}

/// A quota as one source sets it: the default and the per-device values.
type Quota<T> = (Option<T>, [Option<T>; MAX_DEVICES]);

/// One place a quota may come from: its [`Source`] and how to read it (warnings into the
/// vector).
type Reader<'a, T> = (Source, &'a dyn Fn(&mut Vec<String>) -> Quota<T>);

/// The first of `readers` (in precedence order) whose quota sets anything, with its
/// source; the ones after it are not read, so their warnings are not given.
/// `Source::None` and no quota when none sets anything.
fn first_set<T: Copy>(readers: &[Reader<'_, T>], warnings: &mut Vec<String>) -> (Source, Quota<T>) {
    for (source, read) in readers {
        let q = read(warnings);
        if q.0.is_some() || q.1.iter().any(Option::is_some) {
            return (*source, q);
        }
    }
    (Source::None, (None, [None; MAX_DEVICES]))
}

/// The memory quota: the file's `FGPU_MEMORY_LIMIT[_<i>]`, else the environment's, else
/// (where `hami` allows) HAMi's `CUDA_DEVICE_MEMORY_LIMIT[_<i>]`.
fn memory_quota(
    file: &dyn Fn(&str) -> Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
    hami: bool,
    warnings: &mut Vec<String>,
) -> (Source, Quota<u64>) {
    let from_file = |w: &mut Vec<String>| read_limits(file, "FGPU_MEMORY_LIMIT", parse_fgpu, w);
    let from_env = |w: &mut Vec<String>| read_limits(env, "FGPU_MEMORY_LIMIT", parse_fgpu, w);
    let from_hami =
        |w: &mut Vec<String>| read_limits(env, "CUDA_DEVICE_MEMORY_LIMIT", parse_hami, w);
    let readers: [Reader<'_, u64>; 3] = [
        (Source::File, &from_file),
        (Source::FgpuEnv, &from_env),
        (Source::HamiEnv, &from_hami),
    ];
    first_set(&readers[..if hami { 3 } else { 2 }], warnings)
}

/// The core quota, in the same precedence on its own names: `FGPU_CORE_LIMIT[_<i>]` from
/// the file, else the environment, else (where `hami` allows) `CUDA_DEVICE_SM_LIMIT[_<i>]`.
fn core_quota(
    file: &dyn Fn(&str) -> Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
    hami: bool,
    warnings: &mut Vec<String>,
) -> (Source, Quota<u32>) {
    let from_file = |w: &mut Vec<String>| read_percent(file, "FGPU_CORE_LIMIT", w);
    let from_env = |w: &mut Vec<String>| read_percent(env, "FGPU_CORE_LIMIT", w);
    let from_hami = |w: &mut Vec<String>| read_percent(env, "CUDA_DEVICE_SM_LIMIT", w);
    let readers: [Reader<'_, u32>; 3] = [
        (Source::File, &from_file),
        (Source::FgpuEnv, &from_env),
        (Source::HamiEnv, &from_hami),
    ];
    first_set(&readers[..if hami { 3 } else { 2 }], warnings)
}

/// The accounting file of a quota from `source`: with HAMi's names, HAMi's shared cache
/// (`hami_cache`, default [`HAMI_DEFAULT_CACHE`]) plus `hami_suffix`; otherwise `name` in
/// the state directory, if one is set.
fn account_path(
    source: Source,
    state_dir: Option<&str>,
    hami_cache: Option<&str>,
    hami_suffix: &str,
    name: &str,
) -> Option<PathBuf> {
    match source {
        Source::HamiEnv => {
            let cache = hami_cache
                .filter(|p| !p.is_empty())
                .unwrap_or(HAMI_DEFAULT_CACHE);
            Some(PathBuf::from(format!("{cache}{hami_suffix}")))
        }
        _ => state_dir
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(name)),
    }
}

/// `FGPU_CORE_POLICY`: `limit` (also unset or empty) or `share`; anything else is `limit`
/// with a warning.
fn core_policy(value: Option<&str>, warnings: &mut Vec<String>) -> CorePolicy {
    match value.map(str::trim) {
        None | Some("") | Some("limit") => CorePolicy::Limit,
        Some("share") => CorePolicy::Share,
        Some(v) => {
            warnings.push(format!(
                "ignoring FGPU_CORE_POLICY={v:?}: expected limit or share"
            ));
            CorePolicy::Limit
        }
    }
}

/// `FGPU_PRIORITY` (`value`): `high`, `low`, or `normal` (also unset or empty), where
/// HAMi's `CUDA_TASK_PRIORITY` (`hami_value`: `0` high, `1` low) may still say otherwise
/// if `hami` allows its names; anything else is normal with a warning.
fn priority(
    value: Option<&str>,
    hami_value: Option<&str>,
    hami: bool,
    warnings: &mut Vec<String>,
) -> Priority {
    match value.map(str::trim) {
        Some("high") => Priority::High,
        Some("low") => Priority::Low,
        None | Some("") | Some("normal") => match hami_value {
            Some("0") if hami => Priority::High,
            Some("1") if hami => Priority::Low,
            _ => Priority::Normal,
        },
        Some(v) => {
            warnings.push(format!(
                "ignoring FGPU_PRIORITY={v:?}: expected high, normal or low"
            ));
            Priority::Normal
        }
    }
}

/// `FGPU_CONTEXT_OVERHEAD`: bytes charged per context (unset: 0; not a byte count: 0 with
/// a warning).
fn context_overhead(value: Option<&str>, warnings: &mut Vec<String>) -> u64 {
    match value {
        None => 0,
        Some(v) => parse_fgpu(v).unwrap_or_else(|| {
            warnings.push(format!(
                "ignoring FGPU_CONTEXT_OVERHEAD={v:?}: not a byte count"
            ));
            0
        }),
    }
}

/// A path setting; unset and empty are both none.
fn non_empty_path(value: Option<String>) -> Option<PathBuf> {
    value.filter(|d| !d.is_empty()).map(PathBuf::from)
}

/// The value of `key` in `KEY=VALUE` pairs: the last one wins.
fn last_value(kv: &[(String, String)], key: &str) -> Option<String> {
    kv.iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
}

/// Percent quotas: 1–99 throttle; 0 and 100 (and HAMi's ≥ 100) mean "not throttled".
fn read_percent(
    get: &dyn Fn(&str) -> Option<String>,
    prefix: &str,
    warnings: &mut Vec<String>,
) -> Quota<u32> {
    let hami = prefix.starts_with("CUDA_");
    let mut one = |key: String| -> Option<u32> {
        let v = get(&key)?;
        match v.trim().parse::<u32>() {
            Ok(n) if (1..100).contains(&n) => Some(n),
            Ok(0) | Ok(100) => None,
            Ok(_) if hami => None,
            _ => {
                warnings.push(format!("ignoring {key}={v:?}: not a percentage 0-100"));
                None
            }
        }
    };
    let default = one(prefix.to_string());
    let mut per = [None; MAX_DEVICES];
    for (i, slot) in per.iter_mut().enumerate() {
        *slot = one(format!("{prefix}_{i}"));
    }
    (default, per)
}

fn any_fgpu_name(env: &dyn Fn(&str) -> Option<String>) -> bool {
    // The names of the contract; FGPU_LOG is not one of them.
    [
        "FGPU_MEMORY_LIMIT",
        "FGPU_STATE_DIR",
        "FGPU_LIMITS_FILE",
        "FGPU_CORE_LIMIT",
        "FGPU_PRIORITY",
        "FGPU_CORE_POLICY",
        "FGPU_GPU_DIR",
        "FGPU_CONTEXT_OVERHEAD",
        "FGPU_FEED_FILE",
    ]
    .iter()
    .any(|n| env(n).is_some())
        || (0..MAX_DEVICES).any(|i| {
            env(&format!("FGPU_MEMORY_LIMIT_{i}")).is_some()
                || env(&format!("FGPU_CORE_LIMIT_{i}")).is_some()
        })
}

fn read_limits(
    get: &dyn Fn(&str) -> Option<String>,
    prefix: &str,
    parse: fn(&str) -> Option<u64>,
    warnings: &mut Vec<String>,
) -> Quota<u64> {
    let mut one = |key: String| -> Option<u64> {
        let v = get(&key)?;
        match parse(&v) {
            // 0 means "no limit", as in HAMi-core.
            Some(0) => None,
            Some(n) => Some(n),
            None => {
                warnings.push(format!("ignoring {key}={v:?}: not a byte count"));
                None
            }
        }
    };
    let default = one(prefix.to_string());
    let mut per = [None; MAX_DEVICES];
    for (i, slot) in per.iter_mut().enumerate() {
        *slot = one(format!("{prefix}_{i}"));
    }
    (default, per)
}

/// `KEY=VALUE` lines; `#` starts a comment line; blank lines are skipped.
pub fn parse_kv(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            let v = v.trim().trim_matches('"');
            Some((k.trim().to_string(), v.to_string()))
        })
        .collect()
}

/// FGPU values: bytes, or a Kubernetes-style suffix `Ki Mi Gi Ti` (binary) or
/// `K M G T` (decimal).
pub fn parse_fgpu(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suf) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mul: u64 = match suf {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(mul)
}

/// HAMi-core values: an unsigned number (decimal, `0x` hex or leading-0 octal, like
/// `strtoul(.., 0)`), optionally followed by `k`/`m`/`g` in either case (binary units).
pub fn parse_hami(s: &str) -> Option<u64> {
    let s = s.trim();
    let (body, mul) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1u64 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n = if let Some(h) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok()?
    } else if body.len() > 1 && body.starts_with('0') {
        u64::from_str_radix(&body[1..], 8).ok()?
    } else {
        body.parse().ok()?
    };
    n.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn values() {
        assert_eq!(parse_fgpu("10Gi"), Some(10 << 30));
        assert_eq!(parse_fgpu("1536Mi"), Some(1536 << 20));
        assert_eq!(parse_fgpu("2G"), Some(2_000_000_000));
        assert_eq!(parse_fgpu("4096"), Some(4096));
        assert_eq!(parse_fgpu("10GB"), None);
        assert_eq!(parse_fgpu("-1"), None);
        assert_eq!(parse_hami("1024m"), Some(1 << 30));
        assert_eq!(parse_hami("1g"), Some(1 << 30));
        assert_eq!(parse_hami("0x100"), Some(256));
        assert_eq!(parse_hami("12345"), Some(12345));
        assert_eq!(parse_hami("g"), None);
    }

    #[test]
    fn no_quota_is_pass_through() {
        let c = Config::from_sources(None, &env_of(&[("PATH", "/bin")]));
        assert!(!c.enabled);
        assert_eq!(c.limit(0), None);
    }

    #[test]
    fn fgpu_env_per_device_over_default() {
        let c = Config::from_sources(
            None,
            &env_of(&[
                ("FGPU_MEMORY_LIMIT", "4Gi"),
                ("FGPU_MEMORY_LIMIT_1", "1Gi"),
                ("FGPU_STATE_DIR", "/run/fgpu"),
            ]),
        );
        assert_eq!(c.source, Source::FgpuEnv);
        assert_eq!(c.limit(0), Some(4 << 30));
        assert_eq!(c.limit(1), Some(1 << 30));
        assert_eq!(c.limit(40), Some(4 << 30));
        assert_eq!(
            c.state_path,
            Some(PathBuf::from("/run/fgpu/fgpu-memory.state"))
        );
    }

    #[test]
    fn precedence_file_over_fgpu_over_hami() {
        let env = env_of(&[
            ("FGPU_MEMORY_LIMIT", "4Gi"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "8g"),
        ]);
        let c = Config::from_sources(Some("# claim x\nFGPU_MEMORY_LIMIT = 1Gi\n"), &env);
        assert_eq!((c.source, c.limit(0)), (Source::File, Some(1 << 30)));
        // The environment cannot add a per-device limit next to the file's.
        let env2 = env_of(&[("FGPU_MEMORY_LIMIT_0", "40Gi")]);
        let c = Config::from_sources(Some("FGPU_MEMORY_LIMIT=1Gi"), &env2);
        assert_eq!(c.limit(0), Some(1 << 30));
        let c = Config::from_sources(None, &env);
        assert_eq!((c.source, c.limit(0)), (Source::FgpuEnv, Some(4 << 30)));
        let hami = env_of(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "8g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "1024m"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/x.cache"),
        ]);
        let c = Config::from_sources(None, &env_of(&[("CUDA_DEVICE_MEMORY_LIMIT", "1g")]));
        assert_eq!(
            c.state_path,
            Some(PathBuf::from("/tmp/cudevshr.cache.fgpu"))
        );
        let c = Config::from_sources(None, &hami);
        assert_eq!(c.source, Source::HamiEnv);
        assert_eq!((c.limit(0), c.limit(1)), (Some(8 << 30), Some(1 << 30)));
        assert_eq!(c.state_path, Some(PathBuf::from("/tmp/x.cache.fgpu")));
        // Any FGPU name switches the HAMi names off.
        let mixed = env_of(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "8g"),
            ("FGPU_STATE_DIR", "/run/x"),
        ]);
        assert!(!Config::from_sources(None, &mixed).enabled);
    }

    #[test]
    fn core_quota_policy_and_priority() {
        let c = Config::from_sources(None, &env_of(&[("FGPU_CORE_LIMIT", "30")]));
        assert_eq!(
            (c.core_source, c.core_limit(0)),
            (Source::FgpuEnv, Some(30))
        );
        assert!(!c.enabled && c.core_active() && c.hooked());
        assert_eq!(c.core_policy, CorePolicy::Limit);
        let c = Config::from_sources(
            Some("FGPU_CORE_LIMIT=20\nFGPU_CORE_POLICY=share\n"),
            &env_of(&[("FGPU_CORE_LIMIT", "90"), ("FGPU_CORE_LIMIT_1", "95")]),
        );
        assert_eq!((c.core_limit(0), c.core_limit(1)), (Some(20), Some(20)));
        assert_eq!(c.core_policy, CorePolicy::Share);
        let hami = env_of(&[
            ("CUDA_DEVICE_SM_LIMIT", "50"),
            ("CUDA_DEVICE_SM_LIMIT_1", "150"),
            ("CUDA_TASK_PRIORITY", "1"),
        ]);
        let c = Config::from_sources(None, &hami);
        assert_eq!(c.core_source, Source::HamiEnv);
        assert_eq!((c.core_limit(0), c.core_limit(1)), (Some(50), Some(50)));
        assert_eq!(c.priority, Priority::Low);
        assert_eq!(
            c.core_state_path,
            Some(PathBuf::from("/tmp/cudevshr.cache.fgpu-core"))
        );
        let c = Config::from_sources(
            None,
            &env_of(&[("FGPU_CORE_LIMIT", "100"), ("FGPU_PRIORITY", "high")]),
        );
        assert_eq!(c.core_limit(0), None);
        assert_eq!(c.priority, Priority::High);
        assert!(!c.core_active(), "priority needs FGPU_GPU_DIR");
        let c = Config::from_sources(None, &env_of(&[("FGPU_CORE_LIMIT", "250")]));
        assert_eq!((c.core_limit(0), c.warnings.len()), (None, 1));
    }

    #[test]
    fn claim_mode_keys_limits_by_uuid_and_ignores_the_environment() {
        use crate::claims::View;
        let g = |i: u8| format!("GPU-fa4ec0da-0000-0000-8000-0000000000{i:02x}");
        let text = format!(
            "version=2\nclaim_uid=u1\nmemory_account=/a\ncore_account=/c\npriority=low\n\
             context_overhead=1048576\ngpu.{}.memory=100\ngpu.{}.memory=200\ngpu.{}.cores=30\n\
             gpu.{}.priority_file=/run/fgpu/gpus/x.priority\n",
            g(0),
            g(1),
            g(1),
            g(1)
        );
        let view = View::build(vec![("/l".into(), true, Ok(text))]);
        let env = env_of(&[("FGPU_MEMORY_LIMIT", "1Gi"), ("FGPU_CORE_LIMIT", "90")]);
        let mut c = Config::from_claims(view, &env);
        // Ordinal 0 is GPU 1 and ordinal 1 is GPU 0 (CUDA_VISIBLE_DEVICES=1,0); 2 is
        // GPU 2, which no claim names.
        c.uuid_of = Some(|o| {
            let map = [1u8, 0, 2];
            let i = *map.get(o as usize)?;
            crate::ffi::parse_uuid(&format!("GPU-fa4ec0da-0000-0000-8000-0000000000{i:02x}"))
        });
        assert!(c.enabled && c.core_active());
        assert_eq!(
            (c.limit(0), c.limit(1), c.limit(2)),
            (Some(200), Some(100), Some(0))
        );
        assert_eq!((c.core_limit(0), c.core_limit(1)), (Some(30), None));
        assert_eq!(
            c.limit(9),
            Some(0),
            "an ordinal the driver does not know is refused"
        );
        assert_eq!(c.context_overhead, 1 << 20);
        assert_eq!(c.state_path, Some(PathBuf::from("/a")));
        let u1 = crate::ffi::parse_uuid(&g(1)).unwrap();
        assert_eq!(c.priority_of(&u1).0, Priority::Low);
        assert_eq!(c.limit_of_uuid(&u1), Some(200));
    }

    #[test]
    fn context_overhead_from_the_environment() {
        let c = Config::from_sources(None, &env_of(&[("FGPU_CONTEXT_OVERHEAD", "300Mi")]));
        assert_eq!(c.context_overhead, 300 << 20);
        let c = Config::from_sources(None, &env_of(&[]));
        assert_eq!(c.context_overhead, 0);
    }

    #[test]
    fn the_first_source_that_sets_a_quota_wins_and_later_ones_are_not_read() {
        let nothing = |_: &mut Vec<String>| (None, [None; MAX_DEVICES]);
        let bad = |w: &mut Vec<String>| {
            w.push("bad".into());
            (None, [None; MAX_DEVICES])
        };
        let per_device = |_: &mut Vec<String>| {
            let mut per = [None; MAX_DEVICES];
            per[3] = Some(7u32);
            (None, per)
        };
        let default = |w: &mut Vec<String>| {
            w.push("read".into());
            (Some(1u32), [None; MAX_DEVICES])
        };
        let mut w = Vec::new();
        let readers: [Reader<'_, u32>; 4] = [
            (Source::File, &bad),
            (Source::FgpuEnv, &per_device),
            (Source::HamiEnv, &default),
            (Source::None, &nothing),
        ];
        let (source, q) = first_set(&readers, &mut w);
        assert_eq!((source, q.0, q.1[3]), (Source::FgpuEnv, None, Some(7)));
        assert_eq!(w, ["bad"]);
        let (source, q) = first_set(&readers[3..], &mut w);
        assert_eq!((source, q), (Source::None, (None, [None; MAX_DEVICES])));
    }

    #[test]
    fn memory_and_core_quotas_read_hami_names_only_where_allowed() {
        let file = env_of(&[("FGPU_CORE_LIMIT_2", "40")]);
        let env = env_of(&[
            ("FGPU_MEMORY_LIMIT", "lots"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_SM_LIMIT", "20"),
        ]);
        let mut w = Vec::new();
        let (source, q) = memory_quota(&file, &env, true, &mut w);
        assert_eq!((source, q.0), (Source::HamiEnv, Some(1 << 30)));
        assert_eq!(w, ["ignoring FGPU_MEMORY_LIMIT=\"lots\": not a byte count"]);
        let (source, q) = memory_quota(&file, &env, false, &mut w);
        assert_eq!((source, q.0), (Source::None, None));
        let (source, q) = core_quota(&file, &env, true, &mut w);
        assert_eq!((source, q.0, q.1[2]), (Source::File, None, Some(40)));
        let none = env_of(&[]);
        let (source, q) = core_quota(&none, &env, true, &mut w);
        assert_eq!((source, q.0), (Source::HamiEnv, Some(20)));
        assert_eq!(core_quota(&none, &env, false, &mut w).0, Source::None);
    }

    #[test]
    fn account_paths_follow_the_quota_source() {
        let p = |source, dir, cache| account_path(source, dir, cache, ".fgpu", STATE_FILE_NAME);
        assert_eq!(
            p(Source::FgpuEnv, Some("/run/x"), Some("/c")),
            Some(PathBuf::from("/run/x/fgpu-memory.state"))
        );
        assert_eq!(
            p(Source::None, Some("/run/x"), None),
            Some(PathBuf::from("/run/x/fgpu-memory.state"))
        );
        assert_eq!(p(Source::File, Some(""), None), None);
        assert_eq!(p(Source::File, None, Some("/c")), None);
        assert_eq!(
            p(Source::HamiEnv, Some("/run/x"), Some("/c")),
            Some(PathBuf::from("/c.fgpu"))
        );
        assert_eq!(
            p(Source::HamiEnv, None, Some("")),
            Some(PathBuf::from("/tmp/cudevshr.cache.fgpu"))
        );
    }

    #[test]
    fn policy_priority_and_overhead_values() {
        let mut w = Vec::new();
        assert_eq!(core_policy(None, &mut w), CorePolicy::Limit);
        assert_eq!(core_policy(Some(" share "), &mut w), CorePolicy::Share);
        assert_eq!(core_policy(Some("fair"), &mut w), CorePolicy::Limit);
        assert_eq!(
            priority(Some("low"), Some("0"), true, &mut w),
            Priority::Low
        );
        assert_eq!(priority(Some(""), Some("0"), true, &mut w), Priority::High);
        assert_eq!(priority(None, Some("1"), true, &mut w), Priority::Low);
        assert_eq!(priority(None, Some("1"), false, &mut w), Priority::Normal);
        assert_eq!(priority(Some("top"), None, true, &mut w), Priority::Normal);
        assert_eq!(context_overhead(None, &mut w), 0);
        assert_eq!(context_overhead(Some("2Mi"), &mut w), 2 << 20);
        assert_eq!(context_overhead(Some("much"), &mut w), 0);
        assert_eq!(
            w,
            [
                "ignoring FGPU_CORE_POLICY=\"fair\": expected limit or share",
                "ignoring FGPU_PRIORITY=\"top\": expected high, normal or low",
                "ignoring FGPU_CONTEXT_OVERHEAD=\"much\": not a byte count",
            ]
        );
    }

    #[test]
    fn small_readers() {
        let kv = parse_kv("A=1\nB=2\nA=3\n");
        assert_eq!(last_value(&kv, "A").as_deref(), Some("3"));
        assert_eq!(last_value(&kv, "C"), None);
        assert_eq!(non_empty_path(Some(String::new())), None);
        assert_eq!(non_empty_path(None), None);
        assert_eq!(non_empty_path(Some("/f".into())), Some(PathBuf::from("/f")));
        let c = Config::empty(true);
        assert!(c.debug && !c.enabled && !c.hooked());
        assert_eq!((c.source, c.core_source), (Source::None, Source::None));
    }

    #[test]
    fn bad_values_are_ignored_with_a_warning() {
        let c = Config::from_sources(None, &env_of(&[("FGPU_MEMORY_LIMIT", "lots")]));
        assert!(!c.enabled);
        assert_eq!(c.warnings.len(), 1);
        let c = Config::from_sources(None, &env_of(&[("FGPU_MEMORY_LIMIT", "0")]));
        assert!(!c.enabled);
    }
}
