//! The backstop: what the monitor does when a claim uses more than its grant (pure).
//!
//! The shim refuses allocations past the quota, so a claim holding more device memory than
//! its grant (plus a tolerance for what the driver takes on its own) has bypassed the shim:
//! a static binary, raw ioctls, a tampered account. [`Backstop::assess`] turns each pass's
//! [`Attribution`] into [`Finding`]s; the monitor reports each (an Event on the pod, a
//! metric, a log line) and, with [`OverQuotaAction::Kill`], kills the processes the finding
//! names.
//!
//! * **Memory** over `granted + tolerance` on a GPU: reported when first seen and again every
//!   `repeat` while it lasts. With `kill`, the claim's processes on that GPU are chosen
//!   largest first until the rest fits — never a process of another claim, never an
//!   *ambiguous* one (its pod holds several claims on the GPU, so which quota it broke is
//!   unknown).
//! * **Compute** above `cores + points` on a throttled claim in every pass for `window`:
//!   reported the same way (never killed: the shim's limiter works in windows, and a short
//!   burst over the quota is what it allows).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::attribute::{Attribution, ClaimGpuUsage, ClaimProcess};

/// `--over-quota`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OverQuotaAction {
    /// Event, metric and log line.
    Report,
    /// The same, and SIGKILL of the claim's processes that hold the excess.
    Kill,
}

impl OverQuotaAction {
    /// For labels and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Report => "report",
            Self::Kill => "kill",
        }
    }
}

/// The backstop's settings.
#[derive(Clone, Debug)]
pub struct BackstopConfig {
    /// What to do about memory over the grant.
    pub action: OverQuotaAction,
    /// Bytes a claim may hold above its grant before it counts as over (driver overhead).
    pub memory_tolerance: u64,
    /// Points of SM utilisation above the core quota that count as over.
    pub compute_points: u32,
    /// How long compute must stay over before it is reported.
    pub compute_window: Duration,
    /// A finding that lasts is reported again this often.
    pub repeat: Duration,
}

/// Which limit a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Device memory.
    Memory,
    /// SM time.
    Compute,
}

impl Kind {
    /// For labels and Event reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Compute => "compute",
        }
    }
}

/// One claim over one limit on one GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Memory or compute.
    pub kind: Kind,
    /// The claim's UID, namespace and name.
    pub claim_uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub claim_name: String,
    /// The GPU.
    pub gpu_uuid: String,
    /// Bytes used and granted (memory), or SM percent measured and cores granted (compute).
    pub used: u64,
    /// See `used`.
    pub granted: u64,
    /// The claim's processes on the GPU.
    pub processes: Vec<ClaimProcess>,
    /// Processes to kill (empty unless memory and [`OverQuotaAction::Kill`]).
    pub kill: Vec<ClaimProcess>,
    /// Whether this is a repeat of a finding reported before (no new Event is needed for
    /// the metric, but one is sent every `repeat`).
    pub first: bool,
}

#[derive(Debug, Default)]
struct Track {
    /// Since when the claim has been over, in consecutive passes.
    over_since: Option<Instant>,
    /// When it was last reported.
    reported: Option<Instant>,
}

/// The backstop's state across passes.
#[derive(Debug)]
pub struct Backstop {
    cfg: BackstopConfig,
    tracks: HashMap<(Kind, String, String), Track>,
}

impl Backstop {
    /// A backstop with nothing seen yet.
    pub fn new(cfg: BackstopConfig) -> Self {
        Self {
            cfg,
            tracks: HashMap::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &BackstopConfig {
        &self.cfg
    }

    /// The findings of one pass at `now`.
    pub fn assess(&mut self, usage: &Attribution, now: Instant) -> Vec<Finding> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for claim in &usage.claims {
            for g in &claim.gpus {
                for kind in [Kind::Memory, Kind::Compute] {
                    let Some((used, granted)) = self.over(kind, g) else {
                        continue;
                    };
                    let key = (kind, claim.uid.clone(), g.grant.gpu_uuid.clone());
                    seen.insert(key.clone());
                    let t = self.tracks.entry(key).or_default();
                    let since = *t.over_since.get_or_insert(now);
                    let window = match kind {
                        Kind::Memory => Duration::ZERO,
                        Kind::Compute => self.cfg.compute_window,
                    };
                    if now.duration_since(since) < window {
                        continue;
                    }
                    let due = t
                        .reported
                        .is_none_or(|r| now.duration_since(r) >= self.cfg.repeat);
                    let kill = if kind == Kind::Memory && self.cfg.action == OverQuotaAction::Kill {
                        victims(g, granted.saturating_add(self.cfg.memory_tolerance))
                    } else {
                        Vec::new()
                    };
                    if !due && kill.is_empty() {
                        continue;
                    }
                    let first = t.reported.is_none();
                    if due {
                        t.reported = Some(now);
                    }
                    out.push(Finding {
                        kind,
                        claim_uid: claim.uid.clone(),
                        namespace: claim.namespace.clone(),
                        claim_name: claim.name.clone(),
                        gpu_uuid: g.grant.gpu_uuid.clone(),
                        used,
                        granted,
                        processes: g.processes.clone(),
                        kill,
                        first,
                    });
                }
            }
        }
        // A claim back under its limit (or gone) starts a new episode next time.
        self.tracks.retain(|k, _| seen.contains(k));
        out
    }

    /// (used, granted) when `g` is over the `kind` limit this pass.
    fn over(&self, kind: Kind, g: &ClaimGpuUsage) -> Option<(u64, u64)> {
        match kind {
            Kind::Memory => {
                let granted = g.grant.memory_bytes;
                let used = g.used_memory();
                (granted > 0 && used > granted.saturating_add(self.cfg.memory_tolerance))
                    .then_some((used, granted))
            }
            Kind::Compute => {
                let cores = g.grant.cores;
                let sm = g.sm_percent();
                (cores > 0 && cores < 100 && sm > cores.saturating_add(self.cfg.compute_points))
                    .then_some((u64::from(sm), u64::from(cores)))
            }
        }
    }
}

/// The claim's processes on `g` to kill so that the rest holds at most `limit` bytes:
/// largest first; ambiguous processes are never chosen (and their memory still counts).
fn victims(g: &ClaimGpuUsage, limit: u64) -> Vec<ClaimProcess> {
    let mut used = g.used_memory();
    let mut candidates: Vec<&ClaimProcess> = g
        .processes
        .iter()
        .filter(|p| !p.ambiguous && p.used_memory > 0)
        .collect();
    candidates.sort_by(|a, b| b.used_memory.cmp(&a.used_memory).then(a.pid.cmp(&b.pid)));
    let mut out = Vec::new();
    for p in candidates {
        if used <= limit {
            break;
        }
        used -= p.used_memory;
        out.push(p.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::attribute::{ClaimUsage, GpuGrant, PodRef};
    use super::*;

    const GI: u64 = 1 << 30;

    fn proc_(pid: u32, used: u64, sm: Option<u32>) -> ClaimProcess {
        ClaimProcess {
            pid,
            used_memory: used,
            sm_percent: sm,
            pod: PodRef {
                namespace: "ml".into(),
                name: "p".into(),
                uid: "u".into(),
            },
            container_id: "c".into(),
            ambiguous: false,
        }
    }

    fn usage(memory: u64, cores: u32, procs: Vec<ClaimProcess>) -> Attribution {
        Attribution {
            claims: vec![ClaimUsage {
                uid: "claim-1".into(),
                namespace: "ml".into(),
                name: "c".into(),
                gpus: vec![ClaimGpuUsage {
                    grant: GpuGrant {
                        gpu_uuid: "GPU-0".into(),
                        memory_bytes: memory,
                        cores,
                    },
                    processes: procs,
                    memory_known: true,
                }],
            }],
            unattributed: Default::default(),
        }
    }

    fn cfg(action: OverQuotaAction) -> BackstopConfig {
        BackstopConfig {
            action,
            memory_tolerance: 64 << 20,
            compute_points: 10,
            compute_window: Duration::from_secs(5),
            repeat: Duration::from_secs(60),
        }
    }

    #[test]
    fn memory_within_the_tolerance_is_not_over() {
        let mut b = Backstop::new(cfg(OverQuotaAction::Kill));
        let u = usage(4 * GI, 0, vec![proc_(1, 4 * GI + (64 << 20), None)]);
        assert!(b.assess(&u, Instant::now()).is_empty());
    }

    #[test]
    fn memory_over_is_reported_once_then_every_repeat() {
        let mut b = Backstop::new(cfg(OverQuotaAction::Report));
        let t0 = Instant::now();
        let u = usage(4 * GI, 0, vec![proc_(1, GI, None), proc_(2, 5 * GI, None)]);
        let f = b.assess(&u, t0);
        assert_eq!(f.len(), 1);
        assert_eq!(
            (f[0].kind, f[0].used, f[0].granted, f[0].first),
            (Kind::Memory, 6 * GI, 4 * GI, true)
        );
        assert!(f[0].kill.is_empty(), "report never kills");
        assert!(b.assess(&u, t0 + Duration::from_secs(30)).is_empty());
        let again = b.assess(&u, t0 + Duration::from_secs(61));
        assert_eq!(again.len(), 1);
        assert!(!again[0].first);
        // Back under: the next excess is a new episode, reported at once.
        assert!(
            b.assess(
                &usage(4 * GI, 0, vec![proc_(1, GI, None)]),
                t0 + Duration::from_secs(62)
            )
            .is_empty()
        );
        assert!(b.assess(&u, t0 + Duration::from_secs(63))[0].first);
    }

    #[test]
    fn kill_takes_the_largest_until_the_rest_fits_and_spares_ambiguous() {
        let mut b = Backstop::new(cfg(OverQuotaAction::Kill));
        let mut amb = proc_(4, 3 * GI, None);
        amb.ambiguous = true;
        let u = usage(
            4 * GI,
            0,
            vec![
                proc_(1, GI, None),
                proc_(2, 6 * GI, None),
                proc_(3, 2 * GI, None),
                amb,
            ],
        );
        // 12 GiB used, limit 4 GiB + 64 MiB: kill 2 (6), then 3 (2) -> 4 GiB left (1 + the
        // ambiguous 3) fits; 1 stays.
        let f = b.assess(&u, Instant::now());
        let pids: Vec<u32> = f[0].kill.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![2, 3]);
        // Still over in the next pass (the kill has not landed): kill again, no new report.
        let f = b.assess(&u, Instant::now());
        assert_eq!(f.len(), 1);
        assert!(!f[0].first && !f[0].kill.is_empty());
    }

    #[test]
    fn compute_over_must_last_the_window() {
        let mut b = Backstop::new(cfg(OverQuotaAction::Kill));
        let t0 = Instant::now();
        let over = usage(GI, 30, vec![proc_(1, 0, Some(45))]);
        assert!(b.assess(&over, t0).is_empty());
        assert!(b.assess(&over, t0 + Duration::from_secs(4)).is_empty());
        let f = b.assess(&over, t0 + Duration::from_secs(5));
        assert_eq!(
            (f.len(), f[0].kind, f[0].used, f[0].granted),
            (1, Kind::Compute, 45, 30)
        );
        assert!(f[0].kill.is_empty(), "compute is never killed");
        // A pass under the threshold (30 + 10) ends the episode.
        let near = usage(GI, 30, vec![proc_(1, 0, Some(40))]);
        assert!(b.assess(&near, t0 + Duration::from_secs(6)).is_empty());
        assert!(b.assess(&over, t0 + Duration::from_secs(7)).is_empty());
        // Unthrottled claims (cores 0 or 100) are never over.
        let mut b = Backstop::new(cfg(OverQuotaAction::Report));
        for cores in [0, 100] {
            let u = usage(GI, cores, vec![proc_(1, 0, Some(100))]);
            assert!(b.assess(&u, t0).is_empty());
            assert!(b.assess(&u, t0 + Duration::from_secs(10)).is_empty());
        }
    }
}
