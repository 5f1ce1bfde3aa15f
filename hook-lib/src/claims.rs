//! The plugin's limits files, contract version 2 (`docs/shim-contract.md`): parsing one
//! file, and merging the claims of one container into the container's view.
//!
//! Pure code: the caller reads the files and says which are trusted (mount points).

use std::path::PathBuf;

use crate::ffi::parse_uuid;

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

/// NVML's form of a GPU UUID: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let mut s = String::from("GPU-");
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Where the plugin mounts the claims' limits files: `<CLAIMS_DIR>/<uid>/limits`.
pub const CLAIMS_DIR: &str = "/etc/fgpu/claims";

/// One GPU's limits in one claim.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuLimits {
    pub memory: Option<u64>,
    pub cores: Option<u32>,
    pub priority_file: Option<PathBuf>,
}

/// One well-formed limits file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The file it came from.
    pub path: PathBuf,
    /// `<namespace>/<name>` (or the uid when absent).
    pub name: String,
    pub uid: String,
    pub memory_account: PathBuf,
    pub core_account: Option<PathBuf>,
    pub feed: Option<PathBuf>,
    pub priority: Priority,
    pub core_policy: CorePolicy,
    pub context_overhead: u64,
    pub gpus: Vec<([u8; 16], GpuLimits)>,
    /// Unknown keys (a newer plugin may add some).
    pub warnings: Vec<String>,
}

/// `gpu.<GPU-UUID>.<field>` → (UUID, field).
pub fn parse_uuid_key(k: &str) -> Option<([u8; 16], &str)> {
    let rest = k.strip_prefix("gpu.")?;
    let (u, field) = rest.rsplit_once('.')?;
    if !u.starts_with("GPU-") && !u.starts_with("MIG-") {
        return None;
    }
    Some((parse_uuid(u)?, field))
}

impl Claim {
    /// Parses a limits file; `Err` says which line or key is wrong and what is valid.
    pub fn parse(path: PathBuf, text: &str) -> Result<Claim, String> {
        let mut seen: Vec<String> = Vec::new();
        let mut c = Claim {
            path,
            name: String::new(),
            uid: String::new(),
            memory_account: PathBuf::new(),
            core_account: None,
            feed: None,
            priority: Priority::Normal,
            core_policy: CorePolicy::Limit,
            context_overhead: 0,
            gpus: Vec::new(),
            warnings: Vec::new(),
        };
        let mut version = None;
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = format!("line {}", n + 1);
            let Some((k, v)) = line.split_once('=') else {
                return Err(format!("{at}: expected key=value, got {line:?}"));
            };
            let (k, v) = (k.trim(), v.trim());
            if seen.iter().any(|s| s == k) {
                return Err(format!("{at}: duplicate key {k}"));
            }
            seen.push(k.to_string());
            let bad = |what: &str| format!("{at}: {k}={v:?}: expected {what}");
            let abs = |v: &str| -> Result<PathBuf, String> {
                if v.starts_with('/') {
                    Ok(PathBuf::from(v))
                } else {
                    Err(bad("an absolute path"))
                }
            };
            match k {
                "version" => version = Some(v.to_string()),
                "claim" => c.name = v.to_string(),
                "claim_uid" if !v.is_empty() => c.uid = v.to_string(),
                "claim_uid" => return Err(bad("a uid")),
                "memory_account" => c.memory_account = abs(v)?,
                "core_account" => c.core_account = Some(abs(v)?),
                "feed" => c.feed = Some(abs(v)?),
                "priority" => {
                    c.priority = match v {
                        "normal" => Priority::Normal,
                        "low" => Priority::Low,
                        "high" => Priority::High,
                        _ => return Err(bad("normal, low or high")),
                    }
                }
                "core_policy" => {
                    c.core_policy = match v {
                        "limit" | "" => CorePolicy::Limit,
                        "share" => CorePolicy::Share,
                        _ => return Err(bad("limit or share")),
                    }
                }
                "context_overhead" => {
                    c.context_overhead = v.parse().map_err(|_| bad("a byte count"))?
                }
                _ => match parse_uuid_key(k) {
                    Some((uuid, field)) => {
                        let i = match c.gpus.iter().position(|g| g.0 == uuid) {
                            Some(i) => i,
                            None => {
                                c.gpus.push((uuid, GpuLimits::default()));
                                c.gpus.len() - 1
                            }
                        };
                        let g = &mut c.gpus[i].1;
                        match field {
                            "memory" => {
                                g.memory = Some(v.parse().map_err(|_| bad("a byte count"))?)
                            }
                            "cores" => {
                                let p: u32 = v.parse().map_err(|_| bad("a percentage 1..100"))?;
                                if !(1..=100).contains(&p) {
                                    return Err(bad("a percentage 1..100"));
                                }
                                g.cores = (p < 100).then_some(p);
                            }
                            "priority_file" => g.priority_file = Some(abs(v)?),
                            _ => c.warnings.push(format!("{at}: unknown key {k} ignored")),
                        }
                    }
                    None if k.starts_with("gpu.") => {
                        return Err(format!("{at}: {k}: expected gpu.<GPU-UUID>.<field>"));
                    }
                    None => c.warnings.push(format!("{at}: unknown key {k} ignored")),
                },
            }
        }
        match version.as_deref() {
            Some("2") => {}
            Some(v) => return Err(format!("version={v:?}: this shim reads version 2")),
            None => return Err("no version key (expected version=2)".into()),
        }
        if c.uid.is_empty() {
            return Err("no claim_uid key".into());
        }
        if c.memory_account.as_os_str().is_empty() {
            return Err("no memory_account key".into());
        }
        if c.name.is_empty() {
            c.name = c.uid.clone();
        }
        Ok(c)
    }
}

/// What a GPU the process sees may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule<'a> {
    /// Named by exactly one claim (index, limits).
    Claimed(usize, &'a GpuLimits),
    /// Allocations refused; the reason, for the one stderr line.
    Refused(String),
}

/// The container's view: the union of its claims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub claims: Vec<Claim>,
    /// Set when the claims cannot be used at all: every device allocation is refused.
    pub refuse_all: Option<String>,
}

impl View {
    /// Builds the view from the files found: (path, trusted, text or read error).
    pub fn build(found: Vec<(PathBuf, bool, Result<String, String>)>) -> View {
        let mut claims = Vec::new();
        let mut problems = Vec::new();
        for (path, trusted, text) in found {
            if !trusted {
                // A file the workload made (not a mount): ignored, never trusted.
                continue;
            }
            match text.and_then(|t| Claim::parse(path.clone(), &t)) {
                Ok(c) => claims.push(c),
                Err(e) => problems.push(format!("{}: {e}", path.display())),
            }
        }
        let refuse_all = if !problems.is_empty() {
            Some(problems.join("; "))
        } else if claims.is_empty() {
            Some(format!(
                "{CLAIMS_DIR} exists but holds no limits file mounted by the kubelet plugin"
            ))
        } else {
            None
        };
        View { claims, refuse_all }
    }

    /// The rule of GPU `uuid`.
    pub fn rule(&self, uuid: &[u8; 16]) -> Rule<'_> {
        if let Some(why) = &self.refuse_all {
            return Rule::Refused(why.clone());
        }
        let named: Vec<(usize, &GpuLimits)> = self
            .claims
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.gpus.iter().find(|g| g.0 == *uuid).map(|g| (i, &g.1)))
            .collect();
        match named[..] {
            [(i, g)] => Rule::Claimed(i, g),
            [] => Rule::Refused("no claim of this container names it".into()),
            _ => Rule::Refused(format!(
                "named by several claims ({}): one account per GPU per container",
                named
                    .iter()
                    .map(|(i, _)| self.claims[*i].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "GPU-fa4ec0da-0000-0000-8000-000000000000";
    const B: &str = "GPU-fa4ec0da-0000-0000-8000-000000000001";

    fn file(uid: &str, gpus: &str) -> String {
        format!(
            "version=2\nclaim=ns/{uid}\nclaim_uid={uid}\nmemory_account=/run/fgpu/claims/{uid}/memory.state\n\
             core_account=/run/fgpu/claims/{uid}/core.state\npriority=normal\n{gpus}"
        )
    }

    #[test]
    fn parses_the_contract() {
        let c = Claim::parse(
            "/x".into(),
            &file(
                "u1",
                &format!(
                    "gpu.{A}.memory=1024\ngpu.{A}.cores=30\ncontext_overhead=4096\nnew_key=1\n"
                ),
            ),
        )
        .unwrap();
        assert_eq!(c.name, "ns/u1");
        assert_eq!(c.context_overhead, 4096);
        assert_eq!(c.gpus[0].1.memory, Some(1024));
        assert_eq!(c.gpus[0].1.cores, Some(30));
        assert_eq!(c.warnings.len(), 1);
    }

    #[test]
    fn malformed_files_say_why() {
        let no_version = file("u1", "").replace("version=2\n", "");
        for (text, want) in [
            (no_version, "no version"),
            (
                file("u1", "").replace("version=2", "version=3"),
                "version 2",
            ),
            (file("u1", &format!("gpu.{A}.memory=lots\n")), "byte count"),
            (file("u1", &format!("gpu.{A}.cores=0\n")), "percentage"),
            (file("u1", "claim_uid=u2\n"), "duplicate key claim_uid"),
            (
                file("u1", "").replace("memory_account=/run/fgpu/claims/u1/memory.state\n", ""),
                "no memory_account",
            ),
            (file("u1", "gpu.nonsense.memory=1\n"), "gpu.<GPU-UUID>"),
            (file("u1", "garbage\n"), "key=value"),
        ] {
            let e = Claim::parse("/x".into(), &text).unwrap_err();
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }

    #[test]
    fn claims_merge_and_conflicts_are_refused() {
        let f = |uid: &str, g: &str| ("/f".into(), true, Ok(file(uid, g)));
        let v = View::build(vec![
            f("u1", &format!("gpu.{A}.memory=100\n")),
            f("u2", &format!("gpu.{B}.memory=200\n")),
        ]);
        let a = parse_uuid(A).unwrap();
        let b = parse_uuid(B).unwrap();
        assert!(matches!(v.rule(&a), Rule::Claimed(0, g) if g.memory == Some(100)));
        assert!(matches!(v.rule(&b), Rule::Claimed(1, g) if g.memory == Some(200)));
        assert!(matches!(v.rule(&[9; 16]), Rule::Refused(_)));
        let v = View::build(vec![
            f("u1", &format!("gpu.{A}.memory=100\n")),
            f("u2", &format!("gpu.{A}.memory=200\n")),
        ]);
        assert!(matches!(v.rule(&a), Rule::Refused(w) if w.contains("ns/u1, ns/u2")));
        // Untrusted files are not a source; with nothing else everything is refused.
        let v = View::build(vec![(
            "/f".into(),
            false,
            Ok(file("u1", &format!("gpu.{A}.memory=1\n"))),
        )]);
        assert!(v.refuse_all.is_some());
        // One malformed file refuses everything.
        let v = View::build(vec![
            f("u1", &format!("gpu.{A}.memory=1\n")),
            f("u2", "version=9\n"),
        ]);
        assert!(matches!(v.rule(&a), Rule::Refused(_)));
        let v = View::build(vec![("/f".into(), true, Err("Permission denied".into()))]);
        assert!(v.refuse_all.unwrap().contains("Permission denied"));
    }
}
