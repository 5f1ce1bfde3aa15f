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
//! Pure code: the caller passes the file text and an environment lookup.

use std::path::PathBuf;

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

/// Task priority (`FGPU_PRIORITY`, or HAMi's `CUDA_TASK_PRIORITY`: 0 high, 1 low).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    High,
    Normal,
    Low,
}

/// Core-quota policy (`FGPU_CORE_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CorePolicy {
    /// The quota is a ceiling, alone on the card or not (default, `limit`).
    Limit,
    /// Idle GPU time may be used while no other claim is on the card (`share`).
    Share,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    None,
    File,
    FgpuEnv,
    HamiEnv,
}

#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Bytes charged for each context the process creates (limits-file key
    /// `context_overhead`, env `FGPU_CONTEXT_OVERHEAD`; 0: contexts are not charged).
    pub context_overhead: u64,
    /// Problems found while reading (logged once by the caller when debug is on).
    pub warnings: Vec<String>,
}

impl Config {
    /// The quota of device ordinal `i` as the process sees it.
    #[inline]
    pub fn limit(&self, ordinal: i32) -> Option<u64> {
        if !self.enabled {
            return None;
        }
        let per = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.limits.get(i).copied().flatten());
        per.or(self.default_limit)
    }

    /// The core quota (percent, 1–99) of device ordinal `i`; `None` = not throttled.
    #[inline]
    pub fn core_limit(&self, ordinal: i32) -> Option<u32> {
        let per = usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.core_limits.get(i).copied().flatten());
        per.or(self.core_default)
    }

    /// Launches go through the core limiter (a core quota, or a priority other than
    /// normal with a GPU directory to coordinate through).
    pub fn core_active(&self) -> bool {
        self.core_source != Source::None
            || (self.priority != Priority::Normal && self.gpu_dir.is_some())
    }

    /// Any reason to hand out our wrappers.
    pub fn hooked(&self) -> bool {
        self.enabled || self.core_active()
    }

    /// Builds the configuration. `file` is the limits file's text if one was read.
    pub fn from_sources(file: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Config {
        let mut warnings = Vec::new();
        let debug = env("FGPU_LOG").is_some_and(|v| v.eq_ignore_ascii_case("debug"));
        let file_kv: Vec<(String, String)> = file.map(parse_kv).unwrap_or_default();
        let file_get = |k: &str| {
            file_kv
                .iter()
                .rev()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };

        let mut cfg = Config {
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
            context_overhead: 0,
            warnings: Vec::new(),
        };

        let (d, l) = read_limits(&file_get, "FGPU_MEMORY_LIMIT", parse_fgpu, &mut warnings);
        let fgpu_state = file_get("FGPU_STATE_DIR").or_else(|| env("FGPU_STATE_DIR"));
        if d.is_some() || l.iter().any(Option::is_some) {
            cfg.source = Source::File;
            (cfg.default_limit, cfg.limits) = (d, l);
        } else {
            let (d, l) = read_limits(env, "FGPU_MEMORY_LIMIT", parse_fgpu, &mut warnings);
            if d.is_some() || l.iter().any(Option::is_some) {
                cfg.source = Source::FgpuEnv;
                (cfg.default_limit, cfg.limits) = (d, l);
            } else if !any_fgpu_name(env) && file_kv.is_empty() {
                let (d, l) =
                    read_limits(env, "CUDA_DEVICE_MEMORY_LIMIT", parse_hami, &mut warnings);
                if d.is_some() || l.iter().any(Option::is_some) {
                    cfg.source = Source::HamiEnv;
                    (cfg.default_limit, cfg.limits) = (d, l);
                }
            }
        }
        cfg.enabled = cfg.source != Source::None;
        cfg.state_path = match (cfg.source, fgpu_state) {
            (Source::HamiEnv, _) => {
                let p = env("CUDA_DEVICE_MEMORY_SHARED_CACHE")
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| HAMI_DEFAULT_CACHE.to_string());
                Some(PathBuf::from(format!("{p}.fgpu")))
            }
            (_, Some(dir)) if !dir.is_empty() => Some(PathBuf::from(dir).join(STATE_FILE_NAME)),
            _ => None,
        };
        // Core quota: the same precedence, decided on its own names.
        let no_fgpu = !any_fgpu_name(env) && file_kv.is_empty();
        let (d, l) = read_percent(&file_get, "FGPU_CORE_LIMIT", &mut warnings);
        if d.is_some() || l.iter().any(Option::is_some) {
            cfg.core_source = Source::File;
            (cfg.core_default, cfg.core_limits) = (d, l);
        } else {
            let (d, l) = read_percent(env, "FGPU_CORE_LIMIT", &mut warnings);
            if d.is_some() || l.iter().any(Option::is_some) {
                cfg.core_source = Source::FgpuEnv;
                (cfg.core_default, cfg.core_limits) = (d, l);
            } else if no_fgpu {
                let (d, l) = read_percent(env, "CUDA_DEVICE_SM_LIMIT", &mut warnings);
                if d.is_some() || l.iter().any(Option::is_some) {
                    cfg.core_source = Source::HamiEnv;
                    (cfg.core_default, cfg.core_limits) = (d, l);
                }
            }
        }
        let pick = |k: &str| file_get(k).or_else(|| env(k));
        cfg.core_policy = match pick("FGPU_CORE_POLICY").as_deref().map(str::trim) {
            None | Some("") | Some("limit") => CorePolicy::Limit,
            Some("share") => CorePolicy::Share,
            Some(v) => {
                warnings.push(format!(
                    "ignoring FGPU_CORE_POLICY={v:?}: expected limit or share"
                ));
                CorePolicy::Limit
            }
        };
        cfg.priority = match pick("FGPU_PRIORITY").as_deref().map(str::trim) {
            Some("high") => Priority::High,
            Some("low") => Priority::Low,
            None | Some("") | Some("normal") => match env("CUDA_TASK_PRIORITY").as_deref() {
                Some("0") if no_fgpu => Priority::High,
                Some("1") if no_fgpu => Priority::Low,
                _ => Priority::Normal,
            },
            Some(v) => {
                warnings.push(format!(
                    "ignoring FGPU_PRIORITY={v:?}: expected high, normal or low"
                ));
                Priority::Normal
            }
        };
        cfg.gpu_dir = pick("FGPU_GPU_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        cfg.core_state_path = match cfg.core_source {
            Source::HamiEnv => {
                let p = env("CUDA_DEVICE_MEMORY_SHARED_CACHE")
                    .filter(|p| !p.is_empty())
                    .unwrap_or_else(|| HAMI_DEFAULT_CACHE.to_string());
                Some(PathBuf::from(format!("{p}.fgpu-core")))
            }
            _ => file_get("FGPU_STATE_DIR")
                .or_else(|| env("FGPU_STATE_DIR"))
                .filter(|d| !d.is_empty())
                .map(|d| PathBuf::from(d).join(CORE_FILE_NAME)),
        };
        cfg.context_overhead = file_get("context_overhead")
            .or_else(|| env("FGPU_CONTEXT_OVERHEAD"))
            .and_then(|v| parse_fgpu(&v))
            .unwrap_or(0);
        cfg.warnings = warnings;
        cfg
    }
}

/// Percent quotas: 1–99 throttle; 0 and 100 (and HAMi's ≥ 100) mean "not throttled".
fn read_percent(
    get: &dyn Fn(&str) -> Option<String>,
    prefix: &str,
    warnings: &mut Vec<String>,
) -> (Option<u32>, [Option<u32>; MAX_DEVICES]) {
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
    ]
    .iter()
    .any(|n| env(n).is_some())
        || (0..MAX_DEVICES).any(|i| {
            env(&format!("FGPU_MEMORY_LIMIT_{i}")).is_some()
                || env(&format!("FGPU_CORE_LIMIT_{i}")).is_some()
        })
}

type Limits = (Option<u64>, [Option<u64>; MAX_DEVICES]);

fn read_limits(
    get: &dyn Fn(&str) -> Option<String>,
    prefix: &str,
    parse: fn(&str) -> Option<u64>,
    warnings: &mut Vec<String>,
) -> Limits {
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
    fn bad_values_are_ignored_with_a_warning() {
        let c = Config::from_sources(None, &env_of(&[("FGPU_MEMORY_LIMIT", "lots")]));
        assert!(!c.enabled);
        assert_eq!(c.warnings.len(), 1);
        let c = Config::from_sources(None, &env_of(&[("FGPU_MEMORY_LIMIT", "0")]));
        assert!(!c.enabled);
    }
}
