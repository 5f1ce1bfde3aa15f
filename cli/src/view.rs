//! What `kubectl fgpu` shows, computed from the API objects as JSON (pure, tested).
//!
//! Sources, all read-only:
//! * the driver's ResourceSlices: each GPU's node, device name, UUID and memory;
//! * ResourceClaims: which device (and share) each is allocated on, and the entries the
//!   kubelet plugin's node monitor writes into `status.devices` (granted and used memory,
//!   SM utilisation, processes, the `WithinGrant` condition);
//! * for `why`: the pod, its claims and the Events about both.
//!
//! A claim allocated but not yet measured (no status entry: not prepared yet, or the node
//! writes no claim status) shows its granted memory from the allocation's consumed capacity
//! when there is one, and `-` for what it uses.

use std::collections::BTreeMap;

use serde_json::Value;

/// One share of a GPU: a claim's allocation result on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The pool (the node).
    pub pool: String,
    /// The device.
    pub device: String,
    /// Granted memory (bytes), if known.
    pub granted: Option<u64>,
    /// Granted cores (percent; 0: not throttled), if known.
    pub cores: Option<u64>,
    /// Used memory (bytes), from the claim's status.
    pub used: Option<u64>,
    /// SM utilisation (percent), from the claim's status.
    pub sm: Option<u64>,
    /// Processes, from the claim's status.
    pub processes: Option<u64>,
    /// The `WithinGrant` condition's status (`True`/`False`), from the claim's status.
    pub within: Option<String>,
    /// When the figures were sampled.
    pub sampled_at: Option<String>,
}

/// One GPU of the driver's slices, with its shares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuRow {
    /// The node.
    pub node: String,
    /// The device in the pool.
    pub device: String,
    /// Its UUID attribute.
    pub uuid: String,
    /// Its memory (bytes).
    pub memory: Option<u64>,
    /// Its device taints as `key=value:effect` (an unhealthy GPU's `fgpu.dev/unhealthy`).
    pub taints: Vec<String>,
    /// The claims allocated on it.
    pub shares: Vec<Share>,
}

impl GpuRow {
    /// Granted memory of all shares (unknown ones count 0).
    pub fn granted(&self) -> u64 {
        self.shares.iter().filter_map(|s| s.granted).sum()
    }
    /// Used memory of all shares that report it; `None` when none does.
    pub fn used(&self) -> Option<u64> {
        let v: Vec<u64> = self.shares.iter().filter_map(|s| s.used).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }
    /// SM utilisation of all shares that report it (percent, capped at 100).
    pub fn sm(&self) -> Option<u64> {
        let v: Vec<u64> = self.shares.iter().filter_map(|s| s.sm).collect();
        (!v.is_empty()).then(|| v.iter().sum::<u64>().min(100))
    }
}

fn items(list: &Value) -> &[Value] {
    list["items"].as_array().map_or(&[], Vec::as_slice)
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// A quantity (`"85899345920"`, `"80Gi"`, `"512Mi"`) in units, if it parses.
pub fn quantity(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => fgpu_api::quantity::parse_u64(s).ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// A slice's devices (v1/v1beta2 put the fields on the device, v1beta1 under `basic`).
fn device_body(d: &Value) -> &Value {
    if d["basic"].is_object() {
        &d["basic"]
    } else {
        d
    }
}

/// The shares of every claim allocated on `driver`'s devices.
pub fn shares(claims: &Value, driver: &str) -> Vec<Share> {
    let mut out = Vec::new();
    for c in items(claims) {
        let claim = format!(
            "{}/{}",
            str_of(&c["metadata"]["namespace"]),
            str_of(&c["metadata"]["name"])
        );
        let results = c["status"]["allocation"]["devices"]["results"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let statuses = c["status"]["devices"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        for r in results.iter().filter(|r| r["driver"] == driver) {
            let st = statuses.iter().find(|s| fgpu_api::dra::same_device(s, r));
            let data = st.map(|s| &s["data"]);
            let num = |k: &str| data.and_then(|d| d[k].as_u64());
            let granted = num("grantedMemoryBytes")
                .or_else(|| quantity(&r["consumedCapacity"][fgpu_api::names::capacity::MEMORY]));
            let within = st.and_then(|s| {
                s["conditions"].as_array().and_then(|cs| {
                    cs.iter()
                        .find(|c| c["type"] == "WithinGrant")
                        .map(|c| str_of(&c["status"]))
                })
            });
            out.push(Share {
                claim: claim.clone(),
                pool: str_of(&r["pool"]),
                device: str_of(&r["device"]),
                granted,
                cores: num("grantedCores")
                    .or_else(|| quantity(&r["consumedCapacity"][fgpu_api::names::capacity::CORES])),
                used: num("usedMemoryBytes"),
                sm: num("smUtilizationPercent"),
                processes: num("processes"),
                within,
                sampled_at: data.and_then(|d| d["sampledAt"].as_str().map(str::to_owned)),
            });
        }
    }
    out
}

/// Every GPU of `driver`'s slices, with the shares allocated on it, by node and device.
pub fn gpus(slices: &Value, claims: &Value, driver: &str) -> Vec<GpuRow> {
    let mut rows: BTreeMap<(String, String), GpuRow> = BTreeMap::new();
    for s in items(slices)
        .iter()
        .filter(|s| s["spec"]["driver"] == driver)
    {
        let pool = str_of(&s["spec"]["pool"]["name"]);
        let node = s["spec"]["nodeName"]
            .as_str()
            .map_or(pool.clone(), str::to_owned);
        for d in s["spec"]["devices"]
            .as_array()
            .map_or(&[][..], Vec::as_slice)
        {
            let body = device_body(d);
            let device = str_of(&d["name"]);
            rows.insert(
                (pool.clone(), device.clone()),
                GpuRow {
                    node: node.clone(),
                    device,
                    uuid: str_of(&body["attributes"][fgpu_api::names::attr::UUID]["string"]),
                    memory: quantity(&body["capacity"][fgpu_api::names::capacity::MEMORY]["value"]),
                    taints: body["taints"]
                        .as_array()
                        .map_or(&[][..], Vec::as_slice)
                        .iter()
                        .map(|t| {
                            format!(
                                "{}={}:{}",
                                str_of(&t["key"]),
                                str_of(&t["value"]),
                                str_of(&t["effect"])
                            )
                        })
                        .collect(),
                    shares: Vec::new(),
                },
            );
        }
    }
    for sh in shares(claims, driver) {
        if let Some(r) = rows.get_mut(&(sh.pool.clone(), sh.device.clone())) {
            r.shares.push(sh);
        }
    }
    rows.into_values().collect()
}

/// Per node: GPUs, shares, memory, granted and used memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRow {
    /// The node.
    pub node: String,
    /// Its GPUs.
    pub gpus: usize,
    /// Shares on them.
    pub shares: usize,
    /// Memory of its GPUs.
    pub memory: u64,
    /// Granted on them.
    pub granted: u64,
    /// Used on them, where measured.
    pub used: Option<u64>,
}

/// The GPU rows summed per node.
pub fn nodes(gpus: &[GpuRow]) -> Vec<NodeRow> {
    let mut out: BTreeMap<String, NodeRow> = BTreeMap::new();
    for g in gpus {
        let n = out.entry(g.node.clone()).or_insert_with(|| NodeRow {
            node: g.node.clone(),
            ..NodeRow::default()
        });
        n.gpus += 1;
        n.shares += g.shares.len();
        n.memory += g.memory.unwrap_or(0);
        n.granted += g.granted();
        if let Some(u) = g.used() {
            n.used = Some(n.used.unwrap_or(0) + u);
        }
    }
    out.into_values().collect()
}

/// Bytes as MiB/GiB for a table (`-` when unknown).
pub fn bytes(b: Option<u64>) -> String {
    match b {
        None => "-".into(),
        Some(b) if b >= 10 << 30 && b % (1 << 30) == 0 => format!("{}Gi", b >> 30),
        Some(b) => format!("{}Mi", b >> 20),
    }
}

fn opt(v: Option<u64>, suffix: &str) -> String {
    v.map_or("-".into(), |v| format!("{v}{suffix}"))
}

/// A table: columns padded to their widest cell, two spaces apart (kubectl's style).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// `top gpus`.
pub fn gpus_table(rows: &[GpuRow]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|g| {
            vec![
                g.node.clone(),
                g.device.clone(),
                g.uuid.clone(),
                g.shares.len().to_string(),
                bytes(g.memory),
                bytes(Some(g.granted())),
                bytes(g.used()),
                opt(g.sm(), "%"),
                if g.taints.is_empty() {
                    "-".into()
                } else {
                    g.taints.join(",")
                },
            ]
        })
        .collect();
    table(
        &[
            "NODE", "GPU", "UUID", "SHARES", "MEMORY", "GRANTED", "USED", "SM", "TAINTS",
        ],
        &body,
    )
}

/// `top claims`.
pub fn claims_table(rows: &[GpuRow]) -> String {
    let mut body: Vec<Vec<String>> = Vec::new();
    for g in rows {
        for s in &g.shares {
            body.push(vec![
                s.claim.clone(),
                g.node.clone(),
                g.device.clone(),
                bytes(s.granted),
                opt(s.cores, "%"),
                bytes(s.used),
                opt(s.sm, "%"),
                opt(s.processes, ""),
                s.within.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
    }
    body.sort();
    table(
        &[
            "CLAIM", "NODE", "GPU", "GRANTED", "CORES", "USED", "SM", "PROCS", "WITHIN",
        ],
        &body,
    )
}

/// `top nodes`.
pub fn nodes_table(rows: &[NodeRow]) -> String {
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|n| {
            vec![
                n.node.clone(),
                n.gpus.to_string(),
                n.shares.to_string(),
                bytes(Some(n.memory)),
                bytes(Some(n.granted)),
                bytes(n.used),
            ]
        })
        .collect();
    table(
        &["NODE", "GPUS", "SHARES", "MEMORY", "GRANTED", "USED"],
        &body,
    )
}

/// `why pod/<name>`: the pod's scheduling state, its claims' allocation, and the Events
/// about them (oldest first), fgpu's and the scheduler's.
pub fn why(pod: &Value, claims: &[Value], events: &[Value], driver: &str) -> String {
    let name = format!(
        "{}/{}",
        str_of(&pod["metadata"]["namespace"]),
        str_of(&pod["metadata"]["name"])
    );
    let mut out = format!(
        "pod {name}: {}",
        pod["status"]["phase"].as_str().unwrap_or("Unknown")
    );
    if let Some(node) = pod["spec"]["nodeName"].as_str() {
        out.push_str(&format!(" on node {node}"));
    }
    out.push('\n');
    let conds = pod["status"]["conditions"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    if let Some(c) = conds.iter().find(|c| c["type"] == "PodScheduled")
        && c["status"] != "True"
    {
        out.push_str(&format!(
            "  not scheduled: {} {}\n",
            str_of(&c["reason"]),
            str_of(&c["message"])
        ));
    }
    for c in claims {
        let cname = str_of(&c["metadata"]["name"]);
        let results = c["status"]["allocation"]["devices"]["results"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        if results.is_empty() {
            out.push_str(&format!("  claim {cname}: not allocated\n"));
        } else {
            let on: Vec<String> = results
                .iter()
                .map(|r| format!("{}/{}", str_of(&r["pool"]), str_of(&r["device"])))
                .collect();
            out.push_str(&format!(
                "  claim {cname}: allocated on {}\n",
                on.join(", ")
            ));
        }
    }
    let mut evs: Vec<&Value> = events.iter().collect();
    evs.sort_by_key(|e| event_time(e));
    let mut told = 0;
    for e in evs {
        let reason = str_of(&e["reason"]);
        let note = e["note"]
            .as_str()
            .or_else(|| e["message"].as_str())
            .unwrap_or_default();
        let by = e["reportingController"]
            .as_str()
            .or_else(|| e["source"]["component"].as_str())
            .unwrap_or("?");
        let what = format!(
            "{}/{}",
            str_of(&e["regarding"]["kind"]),
            str_of(&e["regarding"]["name"])
        );
        out.push_str(&format!(
            "  {} {} {reason} ({by}, {what}): {note}\n",
            event_time(e),
            str_of(&e["type"])
        ));
        told += 1;
    }
    if told == 0 {
        out.push_str(&format!(
            "  no Events about the pod or its claims (driver {driver})\n"
        ));
    }
    out
}

fn event_time(e: &Value) -> String {
    [
        "eventTime",
        "deprecatedLastTimestamp",
        "deprecatedFirstTimestamp",
    ]
    .iter()
    .find_map(|k| e[*k].as_str())
    .unwrap_or_default()
    .to_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const D: &str = "gpu.fgpu.dev";
    const GI: u64 = 1 << 30;

    fn slices() -> Value {
        json!({"items": [
            {"spec": {"driver": D, "nodeName": "n1", "pool": {"name": "n1"}, "devices": [
                {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}},
                 "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}},
                {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-1"}},
                 "capacity": {"memory": {"value": "85899345920"}},
                 "taints": [{"key": "fgpu.dev/unhealthy", "value": "xid-79", "effect": "NoExecute"}]}]}},
            // v1beta1's shape
            {"spec": {"driver": D, "nodeName": "n2", "pool": {"name": "n2"}, "devices": [
                {"name": "gpu-0", "basic": {"attributes": {"uuid": {"string": "GPU-2"}},
                 "capacity": {"memory": {"value": "40Gi"}}}}]}},
            {"spec": {"driver": "other.dev", "nodeName": "n1", "pool": {"name": "n1"}, "devices": [{"name": "x"}]}}
        ]})
    }

    fn claim(name: &str, device: &str, share: Option<&str>, status: Option<Value>) -> Value {
        let mut r = json!({"request": "gpu", "driver": D, "pool": "n1", "device": device,
                           "consumedCapacity": {"memory": "4Gi", "cores": "30"}});
        if let Some(s) = share {
            r["shareID"] = json!(s);
        }
        let mut c = json!({"metadata": {"namespace": "ml", "name": name},
                           "status": {"allocation": {"devices": {"results": [r]}}}});
        if let Some(s) = status {
            c["status"]["devices"] = json!([s]);
        }
        c
    }

    fn entry(device: &str, share: &str, used: u64, within: &str) -> Value {
        json!({"driver": D, "pool": "n1", "device": device, "shareID": share,
               "data": {"grantedMemoryBytes": 4 * GI, "grantedCores": 30, "usedMemoryBytes": used,
                        "smUtilizationPercent": 29, "processes": 2, "sampledAt": "T"},
               "conditions": [{"type": "WithinGrant", "status": within}]})
    }

    #[test]
    fn gpus_join_slices_allocations_and_claim_status() {
        let claims = json!({"items": [
            claim("a", "gpu-0", Some("s1"), Some(entry("gpu-0", "s1", GI, "True"))),
            claim("b", "gpu-0", Some("s2"), None),
            // A status entry of another share must not be read as this one's.
            claim("c", "gpu-1", Some("s3"), Some(entry("gpu-1", "s9", 3 * GI, "False"))),
            json!({"metadata": {"namespace": "ml", "name": "pending"}, "status": {}}),
        ]});
        let g = gpus(&slices(), &claims, D);
        assert_eq!(g.len(), 3, "{g:?}");
        assert_eq!(
            (g[0].node.as_str(), g[0].device.as_str(), g[0].uuid.as_str()),
            ("n1", "gpu-0", "GPU-0")
        );
        assert_eq!(g[0].memory, Some(80 * GI));
        assert_eq!(g[0].shares.len(), 2);
        assert_eq!(g[0].granted(), 8 * GI);
        assert_eq!(g[0].used(), Some(GI));
        assert_eq!(g[0].shares[0].within.as_deref(), Some("True"));
        assert_eq!(g[0].shares[1].used, None);
        assert_eq!(g[1].memory, Some(85_899_345_920));
        assert_eq!(g[1].shares[0].used, None, "another share's entry");
        assert_eq!(
            g[1].shares[0].granted,
            Some(4 * GI),
            "from the consumed capacity"
        );
        assert_eq!(g[2].uuid, "GPU-2");
        assert_eq!(g[2].memory, Some(40 * GI));
        let n = nodes(&g);
        assert_eq!(n.len(), 2);
        assert_eq!(
            (n[0].gpus, n[0].shares, n[0].granted, n[0].used),
            (2, 3, 12 * GI, Some(GI))
        );
        assert_eq!((n[1].gpus, n[1].shares, n[1].used), (1, 0, None));
    }

    #[test]
    fn tables_show_granted_and_used() {
        let claims = json!({"items": [
            claim("a", "gpu-0", Some("s1"), Some(entry("gpu-0", "s1", GI, "True"))),
        ]});
        let g = gpus(&slices(), &claims, D);
        let t = gpus_table(&g);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(
            lines[0].starts_with("NODE  GPU    UUID   SHARES  MEMORY"),
            "{t}"
        );
        let cols: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cols,
            [
                "n1", "gpu-0", "GPU-0", "1", "80Gi", "4096Mi", "1024Mi", "29%", "-"
            ]
        );
        let cols: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(cols[8], "fgpu.dev/unhealthy=xid-79:NoExecute", "{t}");
        let c = claims_table(&g);
        let cols: Vec<&str> = c.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            cols,
            [
                "ml/a", "n1", "gpu-0", "4096Mi", "30%", "1024Mi", "29%", "2", "True"
            ]
        );
        let n = nodes_table(&nodes(&g));
        let cols: Vec<&str> = n.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(cols, ["n1", "2", "1", "160Gi", "4096Mi", "1024Mi"], "{n}");
    }

    #[test]
    fn why_names_the_scheduling_state_the_claims_and_the_events() {
        let pod = json!({"metadata": {"namespace": "ml", "name": "p"},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/1 nodes are available"}]}});
        let claims = vec![json!({"metadata": {"name": "p-gpu"}, "status": {}})];
        let events = vec![
            json!({"eventTime": "2026-12-02T07:00:02Z", "type": "Warning", "reason": "GpuAllocationPending",
                   "reportingController": "fgpu-controller", "regarding": {"kind": "Pod", "name": "p"},
                   "note": "no GPU has 12Gi free; best candidate n1/gpu-0 (8Gi free)"}),
            json!({"eventTime": "2026-12-02T07:00:01Z", "type": "Warning", "reason": "FailedScheduling",
                   "reportingController": "default-scheduler", "regarding": {"kind": "Pod", "name": "p"},
                   "note": "0/1 nodes are available"}),
        ];
        let w = why(&pod, &claims, &events, D);
        let lines: Vec<&str> = w.lines().collect();
        assert_eq!(lines[0], "pod ml/p: Pending");
        assert!(lines[1].contains("not scheduled: Unschedulable"), "{w}");
        assert_eq!(lines[2], "  claim p-gpu: not allocated");
        assert!(lines[3].contains("FailedScheduling"), "oldest first: {w}");
        assert!(lines[4].contains("best candidate n1/gpu-0"), "{w}");
        let quiet = why(&pod, &[], &[], D);
        assert!(quiet.contains("no Events"), "{quiet}");
    }

    #[test]
    fn quantities_and_bytes() {
        assert_eq!(quantity(&json!("80Gi")), Some(80 * GI));
        assert_eq!(quantity(&json!("512Mi")), Some(512 << 20));
        assert_eq!(quantity(&json!(7)), Some(7));
        assert_eq!(quantity(&json!("lots")), None);
        assert_eq!(bytes(Some(80 * GI)), "80Gi");
        assert_eq!(bytes(Some(4 * GI)), "4096Mi");
        assert_eq!(bytes(None), "-");
    }
}
