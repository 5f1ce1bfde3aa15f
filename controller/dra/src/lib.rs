//! `fgpu-controller`: the DRA allocation controller (DESIGN.md, "Allocation: who decides
//! what", mode 2), its admission webhooks, and the trace simulator's library parts.
//!
//! The pure core, functions from API objects (JSON) to API objects:
//!
//! * [`inventory`]: this driver's ResourceSlices → the engine's [`Inventory`](fgpu_driver::engine::Inventory).
//! * [`usage`]: every allocated ResourceClaim → the ledger's grants → a rebuilt [`Ledger`](fgpu_driver::ledger::Ledger).
//! * [`request`]: a pending claim of the shared class and its pod's annotations → the
//!   engine's request and policy.
//! * [`allocation`]: a chosen placement → the `status.allocation` to write.
//! * [`explain`]: the Event messages for every outcome.
//! * [`reconcile`]: one pass over a snapshot of claims, pods and slices → the writes.
//! * [`admission`]: the webhooks' decisions on `AdmissionReview`s.
//! * [`slim`]: what the daemon keeps of each watched object (only the fields it reads).
//!
//! The daemon (`fgpu-controller run`), which does the I/O:
//!
//! * [`daemon`]: client, discovery, reflectors, the reconcile loop, conditional writes,
//!   Events, mode selection.
//! * [`server`]: the HTTPS webhooks and the metrics/health endpoints.
//! * [`metrics`]: Prometheus metrics. [`leader`]: Lease-based leader election.

pub mod admission;
pub mod allocation;
pub mod cache;
pub mod daemon;
pub mod explain;
pub mod extender;
pub mod inventory;
pub mod leader;
pub mod metrics;
pub mod mirror;
pub mod reconcile;
pub mod request;
pub mod server;
pub mod slim;
pub mod usage;
pub mod view;

/// The `resource.k8s.io` versions the controller reads and writes, newest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiVersion {
    /// `resource.k8s.io/v1` (1.34+).
    V1,
    /// `resource.k8s.io/v1beta2` (1.33+).
    V1beta2,
    /// `resource.k8s.io/v1beta1` (1.32+): devices wrap their fields in `basic`, requests
    /// carry their fields directly instead of under `exactly`.
    V1beta1,
}

impl ApiVersion {
    /// `resource.k8s.io/<version>`.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "resource.k8s.io/v1",
            Self::V1beta2 => "resource.k8s.io/v1beta2",
            Self::V1beta1 => "resource.k8s.io/v1beta1",
        }
    }
}

/// `namespace/name` of an object, the way messages name it.
pub fn object_key(obj: &serde_json::Value) -> String {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or("<unnamed>");
    match meta["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// A quantity (string, or a JSON integer) resolved to a whole number.
pub(crate) fn quantity_u64(v: &serde_json::Value) -> Result<u64, String> {
    match v {
        serde_json::Value::String(s) => fgpu_api::quantity::parse_u64(s).map_err(|e| e.to_string()),
        serde_json::Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("{n} is not a non-negative integer")),
        serde_json::Value::Null => Err("missing".to_owned()),
        other => Err(format!("{other} is not a quantity")),
    }
}
