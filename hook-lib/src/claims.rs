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
    /// Research tier: the part of `memory` device memory backs; allocations past it are
    /// served by managed memory. `None`: no spill.
    pub physical: Option<u64>,
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

/// Why a limits file is malformed: the line (1-based) or key at fault and what is valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    /// A line that is not `key=value`.
    NotKeyValue { line: usize, text: String },
    /// A key given twice.
    DuplicateKey { line: usize, key: String },
    /// A value the key does not take; `expected` says what it takes.
    BadValue {
        line: usize,
        key: String,
        value: String,
        expected: &'static str,
    },
    /// A `gpu.` key without a GPU UUID and a field.
    BadGpuKey { line: usize, key: String },
    /// A version this shim does not read.
    WrongVersion(String),
    /// No `version` key.
    NoVersion,
    /// No `claim_uid` key.
    NoClaimUid,
    /// No `memory_account` key.
    NoMemoryAccount,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotKeyValue { line, text } => {
                write!(f, "line {line}: expected key=value, got {text:?}")
            }
            Self::DuplicateKey { line, key } => write!(f, "line {line}: duplicate key {key}"),
            Self::BadValue {
                line,
                key,
                value,
                expected,
            } => write!(f, "line {line}: {key}={value:?}: expected {expected}"),
            Self::BadGpuKey { line, key } => {
                write!(f, "line {line}: {key}: expected gpu.<GPU-UUID>.<field>")
            }
            Self::WrongVersion(v) => write!(f, "version={v:?}: this shim reads version 2"),
            Self::NoVersion => f.write_str("no version key (expected version=2)"),
            Self::NoClaimUid => f.write_str("no claim_uid key"),
            Self::NoMemoryAccount => f.write_str("no memory_account key"),
        }
    }
}

impl std::error::Error for ParseError {}

/// One `key=value` line of a limits file, trimmed.
struct Entry<'a> {
    /// Line number, 1-based.
    line: usize,
    key: &'a str,
    value: &'a str,
}

impl Entry<'_> {
    /// The value is not what the key takes.
    fn bad(&self, expected: &'static str) -> ParseError {
        ParseError::BadValue {
            line: self.line,
            key: self.key.to_string(),
            value: self.value.to_string(),
            expected,
        }
    }

    /// The value as an absolute path.
    fn absolute_path(&self) -> Result<PathBuf, ParseError> {
        if self.value.starts_with('/') {
            Ok(PathBuf::from(self.value))
        } else {
            Err(self.bad("an absolute path"))
        }
    }

    /// The value as a byte count.
    fn bytes(&self) -> Result<u64, ParseError> {
        self.value.parse().map_err(|_| self.bad("a byte count"))
    }

    /// The warning for a key this shim does not know.
    fn unknown(&self) -> String {
        format!("line {}: unknown key {} ignored", self.line, self.key)
    }
}

/// Line `n` (0-based) of a limits file without its comment: `None` when nothing is left,
/// else its key and value.
fn entry(n: usize, raw: &str) -> Result<Option<Entry<'_>>, ParseError> {
    let line = raw.split('#').next().unwrap_or("").trim();
    if line.is_empty() {
        return Ok(None);
    }
    let Some((k, v)) = line.split_once('=') else {
        return Err(ParseError::NotKeyValue {
            line: n + 1,
            text: line.to_string(),
        });
    };
    Ok(Some(Entry {
        line: n + 1,
        key: k.trim(),
        value: v.trim(),
    }))
}

/// `priority`'s value.
fn priority(v: &str) -> Option<Priority> {
    match v {
        "normal" => Some(Priority::Normal),
        "low" => Some(Priority::Low),
        "high" => Some(Priority::High),
        _ => None,
    }
}

/// `core_policy`'s value (empty: the default, `limit`).
fn core_policy(v: &str) -> Option<CorePolicy> {
    match v {
        "limit" | "" => Some(CorePolicy::Limit),
        "share" => Some(CorePolicy::Share),
        _ => None,
    }
}

/// A GPU's `cores`: a percentage 1..100, `None` for 100 (not throttled).
fn cores(v: &str) -> Result<Option<u32>, ()> {
    let p: u32 = v.parse().map_err(|_| ())?;
    if !(1..=100).contains(&p) {
        return Err(());
    }
    Ok((p < 100).then_some(p))
}

impl Claim {
    /// Parses a limits file; `Err` says which line or key is wrong and what is valid.
    pub fn parse(path: PathBuf, text: &str) -> Result<Claim, ParseError> {
        let mut seen: Vec<&str> = Vec::new();
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
            let Some(e) = entry(n, raw)? else {
                continue;
            };
            if seen.contains(&e.key) {
                return Err(ParseError::DuplicateKey {
                    line: e.line,
                    key: e.key.to_string(),
                });
            }
            seen.push(e.key);
            if e.key == "version" {
                version = Some(e.value.to_string());
            } else {
                c.apply(&e)?;
            }
        }
        c.check(version.as_deref())?;
        Ok(c)
    }

    /// Takes one entry other than `version`.
    fn apply(&mut self, e: &Entry<'_>) -> Result<(), ParseError> {
        let v = e.value;
        match e.key {
            "claim" => self.name = v.to_string(),
            "claim_uid" if !v.is_empty() => self.uid = v.to_string(),
            "claim_uid" => return Err(e.bad("a uid")),
            "memory_account" => self.memory_account = e.absolute_path()?,
            "core_account" => self.core_account = Some(e.absolute_path()?),
            "feed" => self.feed = Some(e.absolute_path()?),
            "priority" => {
                self.priority = priority(v).ok_or_else(|| e.bad("normal, low or high"))?
            }
            "core_policy" => {
                self.core_policy = core_policy(v).ok_or_else(|| e.bad("limit or share"))?
            }
            "context_overhead" => self.context_overhead = e.bytes()?,
            k => match parse_uuid_key(k) {
                Some((uuid, field)) => self.apply_gpu(e, uuid, field)?,
                None if k.starts_with("gpu.") => {
                    return Err(ParseError::BadGpuKey {
                        line: e.line,
                        key: k.to_string(),
                    });
                }
                None => self.warnings.push(e.unknown()),
            },
        }
        Ok(())
    }

    /// Takes the entry `gpu.<uuid>.<field>`.
    fn apply_gpu(&mut self, e: &Entry<'_>, uuid: [u8; 16], field: &str) -> Result<(), ParseError> {
        let i = match self.gpus.iter().position(|g| g.0 == uuid) {
            Some(i) => i,
            None => {
                self.gpus.push((uuid, GpuLimits::default()));
                self.gpus.len() - 1
            }
        };
        let g = &mut self.gpus[i].1;
        match field {
            "memory" => g.memory = Some(e.bytes()?),
            "physical" => g.physical = Some(e.bytes()?),
            "cores" => g.cores = cores(e.value).map_err(|()| e.bad("a percentage 1..100"))?,
            "priority_file" => g.priority_file = Some(e.absolute_path()?),
            _ => self.warnings.push(e.unknown()),
        }
        Ok(())
    }

    /// Checks the whole file: version 2 and the required keys; names an unnamed claim by
    /// its uid.
    fn check(&mut self, version: Option<&str>) -> Result<(), ParseError> {
        match version {
            Some("2") => {}
            Some(v) => return Err(ParseError::WrongVersion(v.to_string())),
            None => return Err(ParseError::NoVersion),
        }
        if self.uid.is_empty() {
            return Err(ParseError::NoClaimUid);
        }
        if self.memory_account.as_os_str().is_empty() {
            return Err(ParseError::NoMemoryAccount);
        }
        if self.name.is_empty() {
            self.name = self.uid.clone();
        }
        Ok(())
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
            match text.and_then(|t| Claim::parse(path.clone(), &t).map_err(|e| e.to_string())) {
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
                    "gpu.{A}.memory=1024\ngpu.{A}.physical=768\ngpu.{A}.cores=30\ncontext_overhead=4096\nnew_key=1\n"
                ),
            ),
        )
        .unwrap();
        assert_eq!(c.name, "ns/u1");
        assert_eq!(c.context_overhead, 4096);
        assert_eq!(c.gpus[0].1.memory, Some(1024));
        assert_eq!(c.gpus[0].1.physical, Some(768));
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
            (file("u1", &format!("gpu.{A}.physical=-1\n")), "byte count"),
            (file("u1", &format!("gpu.{A}.cores=0\n")), "percentage"),
            (file("u1", "claim_uid=u2\n"), "duplicate key claim_uid"),
            (
                file("u1", "").replace("memory_account=/run/fgpu/claims/u1/memory.state\n", ""),
                "no memory_account",
            ),
            (file("u1", "gpu.nonsense.memory=1\n"), "gpu.<GPU-UUID>"),
            (file("u1", "garbage\n"), "key=value"),
        ] {
            let e = Claim::parse("/x".into(), &text).unwrap_err().to_string();
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }

    #[test]
    fn a_line_is_a_trimmed_key_and_value_without_its_comment() {
        assert!(entry(0, "  # only a comment").unwrap().is_none());
        assert!(entry(0, "").unwrap().is_none());
        let e = entry(4, " feed = /a#b ").unwrap().unwrap();
        assert_eq!((e.line, e.key, e.value), (5, "feed", "/a"));
        assert_eq!(
            entry(2, "garbage # x").err(),
            Some(ParseError::NotKeyValue {
                line: 3,
                text: "garbage".into()
            })
        );
        assert_eq!(e.absolute_path(), Ok(PathBuf::from("/a")));
        let rel = entry(0, "feed=a").unwrap().unwrap();
        assert_eq!(
            rel.absolute_path().unwrap_err().to_string(),
            "line 1: feed=\"a\": expected an absolute path"
        );
    }

    #[test]
    fn values_of_the_enumerated_keys() {
        assert_eq!(priority("high"), Some(Priority::High));
        assert_eq!(priority("low"), Some(Priority::Low));
        assert_eq!(priority("normal"), Some(Priority::Normal));
        assert_eq!(priority("urgent"), None);
        assert_eq!(core_policy(""), Some(CorePolicy::Limit));
        assert_eq!(core_policy("share"), Some(CorePolicy::Share));
        assert_eq!(core_policy("greedy"), None);
        assert_eq!(cores("30"), Ok(Some(30)));
        assert_eq!(cores("100"), Ok(None));
        assert_eq!(cores("0"), Err(()));
        assert_eq!(cores("101"), Err(()));
        assert_eq!(cores("x"), Err(()));
    }

    #[test]
    fn parse_errors_keep_their_texts() {
        let bad = ParseError::BadValue {
            line: 7,
            key: "priority".into(),
            value: "urgent".into(),
            expected: "normal, low or high",
        };
        for (e, want) in [
            (
                ParseError::NotKeyValue {
                    line: 1,
                    text: "x".into(),
                },
                "line 1: expected key=value, got \"x\"",
            ),
            (
                ParseError::DuplicateKey {
                    line: 2,
                    key: "feed".into(),
                },
                "line 2: duplicate key feed",
            ),
            (
                bad,
                "line 7: priority=\"urgent\": expected normal, low or high",
            ),
            (
                ParseError::BadGpuKey {
                    line: 3,
                    key: "gpu.x".into(),
                },
                "line 3: gpu.x: expected gpu.<GPU-UUID>.<field>",
            ),
            (
                ParseError::WrongVersion("3".into()),
                "version=\"3\": this shim reads version 2",
            ),
            (ParseError::NoVersion, "no version key (expected version=2)"),
            (ParseError::NoClaimUid, "no claim_uid key"),
            (ParseError::NoMemoryAccount, "no memory_account key"),
        ] {
            assert_eq!(e.to_string(), want);
        }
        // An unnamed claim takes its uid as its name.
        let c = Claim::parse("/x".into(), &file("u1", "").replace("claim=ns/u1\n", "")).unwrap();
        assert_eq!(c.name, "u1");
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
