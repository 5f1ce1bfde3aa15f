//! The quota contract: where limits come from, and how values are written.
//!
//! Precedence (first that sets any memory limit wins, as a whole):
//! 1. the limits file (`FGPU_LIMITS_FILE`, else `/etc/fgpu/limits` if present): `KEY=VALUE`
//!    lines with the FGPU names;
//! 2. the FGPU environment: `FGPU_MEMORY_LIMIT`, `FGPU_MEMORY_LIMIT_<i>`, `FGPU_STATE_DIR`;
//! 3. HAMi-core's names, only when no `FGPU_*` name is set at all:
//!    `CUDA_DEVICE_MEMORY_LIMIT[_<i>]`, `CUDA_DEVICE_MEMORY_SHARED_CACHE`.
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
        cfg.warnings = warnings;
        cfg
    }
}

fn any_fgpu_name(env: &dyn Fn(&str) -> Option<String>) -> bool {
    // The names of the contract; FGPU_LOG is not one of them.
    ["FGPU_MEMORY_LIMIT", "FGPU_STATE_DIR", "FGPU_LIMITS_FILE"]
        .iter()
        .any(|n| env(n).is_some())
        || (0..MAX_DEVICES).any(|i| env(&format!("FGPU_MEMORY_LIMIT_{i}")).is_some())
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
    fn bad_values_are_ignored_with_a_warning() {
        let c = Config::from_sources(None, &env_of(&[("FGPU_MEMORY_LIMIT", "lots")]));
        assert!(!c.enabled);
        assert_eq!(c.warnings.len(), 1);
        let c = Config::from_sources(None, &env_of(&[("FGPU_MEMORY_LIMIT", "0")]));
        assert!(!c.enabled);
    }
}
