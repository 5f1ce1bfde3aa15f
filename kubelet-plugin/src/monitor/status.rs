//! What each prepared claim really uses, in its `ResourceClaim.status.devices`.
//!
//! After a monitor pass, one entry per device the plugin prepared for the claim (keyed by
//! driver, pool, device and, for a share of a consumable-capacity device, `shareID`), with
//! `data` the claim's figures on that GPU and one condition, `WithinGrant`:
//!
//! ```json
//! {"driver": "gpu.fgpu.dev", "pool": "node-1", "device": "gpu-0", "shareID": "…",
//!  "data": {"gpuUUID": "GPU-…", "grantedMemoryBytes": 4294967296, "grantedCores": 30,
//!           "usedMemoryBytes": 1073741824, "smUtilizationPercent": 29, "processes": 2,
//!           "enforcement": "shim", "sampledAt": "2026-12-02T07:00:00Z"},
//!  "conditions": [{"type": "WithinGrant", "status": "True", "reason": "UsageWithinGrant", …}]}
//! ```
//!
//! The used figures are the claim's on the GPU (a claim holding two shares of one GPU has
//! the same used figures on both: the driver cannot tell its processes' shares apart).
//! `WithinGrant` turns `False` (reason `MemoryOverGrant`) when the claim holds more than its
//! grant plus the backstop's tolerance.
//!
//! Writes are server-side apply on the `status` subresource with the plugin's own field
//! manager, so other drivers' entries are left alone, with the claim's UID as a
//! precondition (a claim deleted and created again under the same name is not written).
//! They are rate-limited by construction: a claim is written when what it shows changed
//! (used memory, process count, the condition, SM utilisation by 5 points or more), and
//! then at most once per `--claim-status-interval-seconds` (the first write is at once), so
//! N claims cost at most N writes per interval. With `--claim-status-refresh-seconds` an
//! unchanged claim is also rewritten once its last write is that old (a heartbeat for the
//! controller's usage-aware scoring; off by default). When a claim is unprepared its entries are
//! removed by one last apply (on deallocation the API server drops them too). An API
//! server that drops the field (1.32, feature gate off) is detected on the first write:
//! the writer then stops, with one log line.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::attribute::ClaimUsage;
use crate::checkpoint::ClaimRecord;

/// The condition type the plugin sets on each entry.
pub const CONDITION: &str = "WithinGrant";
/// Its reasons.
pub const REASON_WITHIN: &str = "UsageWithinGrant";
/// Its reasons.
pub const REASON_OVER: &str = "MemoryOverGrant";
/// Field manager of the plugin's status writes.
pub const FIELD_MANAGER: &str = "fgpu-kubelet-plugin";

/// The writer's settings.
#[derive(Clone, Debug)]
pub struct StatusConfig {
    /// The DRA driver name (the entries' `driver`).
    pub driver: String,
    /// Shortest time between two writes of one claim.
    pub interval: Duration,
    /// An unchanged claim is written again once its last write is this old, so that its
    /// `sampledAt` stays fresh (`None`: never; at least `interval`).
    pub refresh: Option<Duration>,
    /// Memory above the grant that still counts as within it (the backstop's tolerance).
    pub tolerance: u64,
}

/// One write to send: the claim, and the `status.devices` the plugin owns in it.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusWrite {
    /// The claim's UID (the write's precondition).
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The entries (empty: remove the plugin's).
    pub devices: Vec<Value>,
}

/// What was last written for one claim.
#[derive(Clone, Debug)]
struct Written {
    namespace: String,
    name: String,
    /// `None`: the write failed (written again once the interval has passed).
    shown: Option<Shown>,
    at: Instant,
    /// The condition's status written last, and since when it holds (RFC 3339).
    within: bool,
    since: String,
}

/// What a write shows, compared to decide whether the claim needs another.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Shown {
    per_gpu: Vec<(String, u64, usize, u32)>,
    within: bool,
}

/// Decides which claims to write after each pass.
#[derive(Debug)]
pub struct StatusWriter {
    cfg: StatusConfig,
    written: HashMap<String, Written>,
    /// The API server keeps no `status.devices`: nothing more is written.
    off: bool,
}

impl StatusWriter {
    /// A writer with nothing written yet.
    pub fn new(cfg: StatusConfig) -> Self {
        Self {
            cfg,
            written: HashMap::new(),
            off: false,
        }
    }

    /// The settings.
    pub fn config(&self) -> &StatusConfig {
        &self.cfg
    }

    /// Stops every later write (the API server dropped the field).
    pub fn turn_off(&mut self) {
        self.off = true;
    }

    /// Whether writes are off.
    pub fn is_off(&self) -> bool {
        self.off
    }

    /// The writes due after a pass over `records` whose usage is `usage`, at `now`
    /// (`now_rfc3339` for the timestamps). Records the writes as made (see
    /// [`StatusWriter::failed`]).
    pub fn due(
        &mut self,
        records: &std::collections::BTreeMap<String, ClaimRecord>,
        usage: &[ClaimUsage],
        now: Instant,
        now_rfc3339: &str,
    ) -> Vec<StatusWrite> {
        if self.off {
            return Vec::new();
        }
        let mut out = Vec::new();
        for u in usage {
            let Some(record) = records.get(&u.uid) else {
                continue;
            };
            let shown = self.shown(u);
            let prev = self.written.get(&u.uid);
            let due = match prev {
                None => true,
                Some(w) => {
                    let age = now.duration_since(w.at);
                    (w.shown.as_ref() != Some(&shown) && age >= self.cfg.interval)
                        || self.cfg.refresh.is_some_and(|r| age >= r)
                }
            };
            if !due {
                continue;
            }
            let since = match prev {
                Some(w) if w.within == shown.within => w.since.clone(),
                _ => now_rfc3339.to_owned(),
            };
            out.push(StatusWrite {
                uid: u.uid.clone(),
                namespace: u.namespace.clone(),
                name: u.name.clone(),
                devices: device_statuses(&self.cfg, record, u, now_rfc3339, &since),
            });
            self.written.insert(
                u.uid.clone(),
                Written {
                    namespace: u.namespace.clone(),
                    name: u.name.clone(),
                    within: shown.within,
                    shown: Some(shown),
                    at: now,
                    since,
                },
            );
        }
        // Claims written before and no longer prepared: one last write removes the entries.
        let gone: Vec<String> = self
            .written
            .keys()
            .filter(|uid| !usage.iter().any(|u| &u.uid == *uid))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(w) = self.written.remove(&uid) {
                out.push(StatusWrite {
                    uid,
                    namespace: w.namespace,
                    name: w.name,
                    devices: Vec::new(),
                });
            }
        }
        out
    }

    /// A write that failed: the claim is written again once the interval has passed (an
    /// API server refusing every write still gets at most one per claim per interval).
    pub fn failed(&mut self, uid: &str) {
        if let Some(w) = self.written.get_mut(uid) {
            w.shown = None;
        }
    }

    fn shown(&self, u: &ClaimUsage) -> Shown {
        let within = u
            .gpus
            .iter()
            .all(|g| g.used_memory() <= g.grant.memory_bytes.saturating_add(self.cfg.tolerance));
        Shown {
            per_gpu: u
                .gpus
                .iter()
                .map(|g| {
                    (
                        g.grant.gpu_uuid.clone(),
                        g.used_memory(),
                        g.processes.len(),
                        g.sm_percent() / 5,
                    )
                })
                .collect(),
            within,
        }
    }
}

/// The plugin's `status.devices` entries for one claim: one per device it prepared.
pub fn device_statuses(
    cfg: &StatusConfig,
    record: &ClaimRecord,
    usage: &ClaimUsage,
    now_rfc3339: &str,
    since_rfc3339: &str,
) -> Vec<Value> {
    record
        .devices
        .iter()
        .map(|d| {
            let g = usage.gpus.iter().find(|g| g.grant.gpu_uuid == d.gpu_uuid);
            let used = g.map_or(0, |g| g.used_memory());
            let granted_on_gpu = g.map_or(d.memory_bytes, |g| g.grant.memory_bytes);
            let within = used <= granted_on_gpu.saturating_add(cfg.tolerance);
            let (status, reason, message) = if within {
                (
                    "True",
                    REASON_WITHIN,
                    format!(
                        "the claim holds {} MiB of the {} MiB granted on {}",
                        used >> 20,
                        granted_on_gpu >> 20,
                        d.gpu_uuid
                    ),
                )
            } else {
                (
                    "False",
                    REASON_OVER,
                    format!(
                        "the claim holds {} MiB on {}, past the {} MiB granted (+{} MiB tolerance)",
                        used >> 20,
                        d.gpu_uuid,
                        granted_on_gpu >> 20,
                        cfg.tolerance >> 20
                    ),
                )
            };
            let mut e = json!({
                "driver": cfg.driver,
                "pool": d.pool_name,
                "device": d.device_name,
                "data": {
                    "gpuUUID": d.gpu_uuid,
                    "grantedMemoryBytes": d.memory_bytes,
                    "grantedCores": d.cores,
                    "usedMemoryBytes": used,
                    "smUtilizationPercent": g.map_or(0, |g| g.sm_percent()),
                    "processes": g.map_or(0, |g| g.processes.len()),
                    "enforcement": d.enforcement.as_str(),
                    "sampledAt": now_rfc3339,
                },
                "conditions": [{
                    "type": CONDITION,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": since_rfc3339,
                }],
            });
            if let Some(id) = &d.share_id {
                e["shareID"] = json!(id);
            }
            e
        })
        .collect()
}

/// The server-side apply body of `w` for `resource.k8s.io/<version>`.
pub fn apply_body(api_version: &str, w: &StatusWrite) -> Value {
    json!({
        "apiVersion": api_version,
        "kind": "ResourceClaim",
        "metadata": {"name": w.name, "namespace": w.namespace, "uid": w.uid},
        "status": {"devices": w.devices},
    })
}

/// Whether the API server kept the entries of `w` in the claim it returned (`stored`): an
/// API server with the field gated off drops them without an error.
pub fn kept(stored: &Value, w: &StatusWrite) -> bool {
    let devices = stored["status"]["devices"].as_array();
    w.devices.iter().all(|want| {
        devices.is_some_and(|have| have.iter().any(|h| fgpu_api::dra::same_device(h, want)))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::checkpoint::{PrepareState, PreparedDevice};
    use crate::monitor::attribute::{ClaimGpuUsage, ClaimProcess, GpuGrant, PodRef};

    const MI: u64 = 1 << 20;

    fn cfg() -> StatusConfig {
        StatusConfig {
            driver: "gpu.fgpu.dev".into(),
            interval: Duration::from_secs(30),
            refresh: None,
            tolerance: 256 * MI,
        }
    }

    fn record(share: Option<&str>) -> ClaimRecord {
        ClaimRecord {
            namespace: "ml".into(),
            name: "train".into(),
            state: PrepareState::PrepareCompleted,
            devices: vec![PreparedDevice {
                pool_name: "node-1".into(),
                device_name: "gpu-0".into(),
                share_id: share.map(str::to_owned),
                gpu_uuid: "GPU-0".into(),
                memory_bytes: 4096 * MI,
                cores: 30,
                enforcement: Default::default(),
                ..PreparedDevice::default()
            }],
            ..ClaimRecord::default()
        }
    }

    fn usage(used: &[u64], sm: u32) -> ClaimUsage {
        ClaimUsage {
            uid: "u1".into(),
            namespace: "ml".into(),
            name: "train".into(),
            gpus: vec![ClaimGpuUsage {
                grant: GpuGrant {
                    gpu_uuid: "GPU-0".into(),
                    memory_bytes: 4096 * MI,
                    cores: 30,
                },
                processes: used
                    .iter()
                    .enumerate()
                    .map(|(i, &u)| ClaimProcess {
                        pid: 100 + i as u32,
                        used_memory: u,
                        sm_percent: Some(sm / used.len().max(1) as u32),
                        pod: PodRef {
                            namespace: "ml".into(),
                            name: "p".into(),
                            uid: "pod-uid".into(),
                        },
                        container_id: "c".into(),
                        ambiguous: false,
                    })
                    .collect(),
                memory_known: true,
            }],
        }
    }

    fn records(share: Option<&str>) -> BTreeMap<String, ClaimRecord> {
        BTreeMap::from([("u1".to_owned(), record(share))])
    }

    #[test]
    fn an_entry_per_prepared_device_with_the_claims_figures() {
        let e = device_statuses(
            &cfg(),
            &record(Some("s-1")),
            &usage(&[MI << 10], 30),
            "T1",
            "T0",
        );
        assert_eq!(e.len(), 1);
        let e = &e[0];
        assert_eq!(e["driver"], "gpu.fgpu.dev");
        assert_eq!(e["pool"], "node-1");
        assert_eq!(e["device"], "gpu-0");
        assert_eq!(e["shareID"], "s-1");
        assert_eq!(e["data"]["usedMemoryBytes"], 1024 * MI);
        assert_eq!(e["data"]["grantedMemoryBytes"], 4096 * MI);
        assert_eq!(e["data"]["grantedCores"], 30);
        assert_eq!(e["data"]["smUtilizationPercent"], 30);
        assert_eq!(e["data"]["processes"], 1);
        assert_eq!(e["data"]["enforcement"], "shim");
        assert_eq!(e["data"]["sampledAt"], "T1");
        let c = &e["conditions"][0];
        assert_eq!(c["type"], CONDITION);
        assert_eq!(c["status"], "True");
        assert_eq!(c["lastTransitionTime"], "T0");
        // Without a share there is no shareID key at all (the API's list key).
        let plain = device_statuses(&cfg(), &record(None), &usage(&[], 0), "T1", "T0");
        assert!(plain[0].get("shareID").is_none());
        assert_eq!(plain[0]["data"]["processes"], 0);
    }

    #[test]
    fn over_the_grant_plus_tolerance_the_condition_turns_false() {
        let within = device_statuses(
            &cfg(),
            &record(None),
            &usage(&[4096 * MI + 256 * MI], 0),
            "T",
            "T",
        );
        assert_eq!(within[0]["conditions"][0]["status"], "True");
        let over = device_statuses(
            &cfg(),
            &record(None),
            &usage(&[4096 * MI + 257 * MI], 0),
            "T",
            "T",
        );
        let c = &over[0]["conditions"][0];
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], REASON_OVER);
        assert!(c["message"].as_str().unwrap().contains("4353 MiB"), "{c}");
    }

    #[test]
    fn writes_only_on_change_and_at_most_once_per_interval() {
        let mut w = StatusWriter::new(cfg());
        let t0 = Instant::now();
        let r = records(None);
        // The first pass writes at once.
        assert_eq!(w.due(&r, &[usage(&[MI], 10)], t0, "T0").len(), 1);
        // Unchanged: never written again, however long it stays so.
        assert!(
            w.due(&r, &[usage(&[MI], 10)], t0 + Duration::from_secs(300), "T")
                .is_empty()
        );
        // Changed, but within the interval of the last write: not yet.
        let t1 = t0 + Duration::from_secs(301);
        assert_eq!(w.due(&r, &[usage(&[2 * MI], 10)], t1, "T1").len(), 1);
        assert!(
            w.due(
                &r,
                &[usage(&[3 * MI], 10)],
                t1 + Duration::from_secs(29),
                "T"
            )
            .is_empty()
        );
        // Past the interval, the latest figures go.
        let due = w.due(
            &r,
            &[usage(&[3 * MI], 10)],
            t1 + Duration::from_secs(30),
            "T2",
        );
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].devices[0]["data"]["usedMemoryBytes"], 3 * MI);
        // SM jitter under 5 points is no change.
        let t2 = t1 + Duration::from_secs(100);
        assert!(w.due(&r, &[usage(&[3 * MI], 11)], t2, "T").is_empty());
        assert_eq!(w.due(&r, &[usage(&[3 * MI], 16)], t2, "T").len(), 1);
    }

    #[test]
    fn a_refresh_rewrites_an_unchanged_claim_once_its_last_write_is_that_old() {
        let mut w = StatusWriter::new(StatusConfig {
            refresh: Some(Duration::from_secs(90)),
            ..cfg()
        });
        let t0 = Instant::now();
        let r = records(None);
        assert_eq!(w.due(&r, &[usage(&[MI], 10)], t0, "T0").len(), 1);
        // Unchanged, younger than the refresh: not written.
        let s = |n| t0 + Duration::from_secs(n);
        assert!(w.due(&r, &[usage(&[MI], 10)], s(89), "T").is_empty());
        // As old as the refresh: written again with the new sample time.
        let d = w.due(&r, &[usage(&[MI], 10)], s(90), "T90");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].devices[0]["data"]["sampledAt"], "T90");
        // The refresh counts from that write.
        assert!(w.due(&r, &[usage(&[MI], 10)], s(179), "T").is_empty());
        assert_eq!(w.due(&r, &[usage(&[MI], 10)], s(180), "T").len(), 1);
        // Changes still wait for the interval, not the refresh.
        assert_eq!(w.due(&r, &[usage(&[2 * MI], 10)], s(210), "T").len(), 1);
    }

    #[test]
    fn n_claims_cost_at_most_n_writes_per_interval() {
        // 1,000 claims whose figures change on every one-second pass, for ten minutes.
        let mut w = StatusWriter::new(cfg());
        let mut recs = BTreeMap::new();
        for i in 0..1000 {
            recs.insert(format!("u{i}"), record(None));
        }
        let t0 = Instant::now();
        let mut writes = 0;
        for s in 0..600u64 {
            let us: Vec<ClaimUsage> = (0..1000)
                .map(|i| ClaimUsage {
                    uid: format!("u{i}"),
                    ..usage(&[(s + 1) * MI], 0)
                })
                .collect();
            writes += w.due(&recs, &us, t0 + Duration::from_secs(s), "T").len();
        }
        // 600 s / 30 s = 20 writes per claim.
        assert_eq!(writes, 1000 * 20);
    }

    #[test]
    fn the_transition_time_moves_only_when_the_condition_does() {
        let mut w = StatusWriter::new(cfg());
        let r = records(None);
        let t0 = Instant::now();
        w.due(&r, &[usage(&[MI], 0)], t0, "T0");
        let s = Duration::from_secs(31);
        let d = w.due(&r, &[usage(&[2 * MI], 0)], t0 + s, "T1");
        assert_eq!(d[0].devices[0]["conditions"][0]["lastTransitionTime"], "T0");
        let d = w.due(&r, &[usage(&[8192 * MI], 0)], t0 + 2 * s, "T2");
        assert_eq!(d[0].devices[0]["conditions"][0]["status"], "False");
        assert_eq!(d[0].devices[0]["conditions"][0]["lastTransitionTime"], "T2");
    }

    #[test]
    fn an_unprepared_claim_gets_one_write_removing_its_entries() {
        let mut w = StatusWriter::new(cfg());
        let t0 = Instant::now();
        w.due(&records(None), &[usage(&[MI], 0)], t0, "T0");
        let d = w.due(&BTreeMap::new(), &[], t0, "T1");
        assert_eq!(
            d,
            vec![StatusWrite {
                uid: "u1".into(),
                namespace: "ml".into(),
                name: "train".into(),
                devices: Vec::new(),
            }]
        );
        assert!(w.due(&BTreeMap::new(), &[], t0, "T2").is_empty());
    }

    #[test]
    fn a_failed_write_is_retried_and_an_off_writer_writes_nothing() {
        let mut w = StatusWriter::new(cfg());
        let r = records(None);
        let t0 = Instant::now();
        assert_eq!(w.due(&r, &[usage(&[MI], 0)], t0, "T").len(), 1);
        w.failed("u1");
        // Not at the next pass: after the interval, even with the same figures.
        assert!(
            w.due(&r, &[usage(&[MI], 0)], t0 + Duration::from_secs(1), "T")
                .is_empty()
        );
        assert_eq!(
            w.due(&r, &[usage(&[MI], 0)], t0 + Duration::from_secs(30), "T")
                .len(),
            1
        );
        w.turn_off();
        assert!(w.is_off());
        assert!(
            w.due(
                &r,
                &[usage(&[2 * MI], 0)],
                t0 + Duration::from_secs(60),
                "T"
            )
            .is_empty()
        );
    }

    #[test]
    fn kept_sees_whether_the_api_server_stored_the_entries() {
        let wr = StatusWrite {
            uid: "u1".into(),
            namespace: "ml".into(),
            name: "train".into(),
            devices: device_statuses(&cfg(), &record(Some("s")), &usage(&[], 0), "T", "T"),
        };
        let body = apply_body("resource.k8s.io/v1", &wr);
        assert_eq!(body["metadata"]["uid"], "u1");
        assert_eq!(body["kind"], "ResourceClaim");
        assert!(kept(&body, &wr));
        let dropped = json!({"status": {"allocation": {}}});
        assert!(!kept(&dropped, &wr));
        let other = json!({"status": {"devices": [{"driver": "gpu.fgpu.dev", "pool": "node-1", "device": "gpu-0"}]}});
        assert!(
            !kept(&other, &wr),
            "an entry without the share is another entry"
        );
    }
}
