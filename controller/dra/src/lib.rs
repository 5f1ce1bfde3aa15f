//! `fgpu-dra-controller`: the DRA allocation controller (DESIGN.md, "Allocation: who
//! decides what", mode 2) and its admission webhooks, run by `fgpu-controller run`.
//!
//! The pure core, functions from API objects to API objects. Claims, DeviceClasses and
//! slices are read typed ([`fgpu_api::dra`]: tolerant serde structs over every served
//! version), pods as JSON; what is written (allocations, patches, whole claims on release)
//! is JSON:
//!
//! * [`inventory`]: this driver's ResourceSlices (typed) and the admins' DeviceTaintRules →
//!   the engine's [`Inventory`](fgpu_driver::engine::Inventory).
//! * [`mig`]: the MIG-mode GPUs the slices publish (placement devices, counters), the
//!   placements allocated claims hold, and the choice of a placement for a claim of the
//!   MIG class.
//! * [`usage`]: every allocated ResourceClaim → the ledger's grants → a rebuilt [`Ledger`](fgpu_driver::ledger::Ledger).
//! * [`load`]: what the node monitor measured of each claim (`status.devices`) → each
//!   GPU's measured load, for the engine's usage-aware term.
//! * [`request`]: a pending claim of the shared class and its pod's annotations → the
//!   engine's request and policy.
//! * [`selector`]: CEL device selectors (the DRA CEL environment, Kubernetes' quantity and
//!   semver functions), compiled once per expression, evaluated per device.
//! * [`allocation`]: a chosen placement → the `status.allocation` to write.
//! * [`explain`]: the Event messages for every outcome.
//! * [`scores`]: one pass's node scores per request class, kept while each node is
//!   unchanged.
//! * [`reconcile`]: one pass over a snapshot of claims, pods and slices → the writes.
//! * [`admission`]: the webhooks' decisions on `AdmissionReview`s.
//! * [`hami_pods`]: a pod with HAMi's GPU resources and annotations → a
//!   ResourceClaimTemplate of the shared class and the pod's patch (`/mutate-pods-dra`).
//! * [`objects`]: what a claim or a pod says (identity, classes, gate, node), read from
//!   the typed claim and the pod's JSON; whether slices offer consumable capacity.
//! * [`view`]: the small per-claim and per-pod records a pass reads ([`view::ClaimView`]
//!   from the typed claim, parsed straight from its text).
//! * [`cache`], [`mirror`]: what the daemon keeps between passes (views; objects as
//!   packed JSON text).
//! * [`slim`]: what the daemon keeps of each watched object (only the fields it reads; of
//!   a slice, what the typed model holds).
//!
//! The daemon (`fgpu-controller run`), which does the I/O:
//!
//! * [`daemon`]: client, discovery, reflectors, the reconcile loop, conditional writes,
//!   Events, mode selection.
//! * [`server`]: the HTTPS webhooks and the metrics/health endpoints (served by the
//!   plumbing's server layer).
//! * [`write`]: the writes to claims, each behind the leader's fence and cut off at its
//!   deadline.
//! * [`metrics`]: Prometheus metrics. [`shared`]: what the loop and the servers share.
//!
//! Client set-up, version discovery, TLS, leader election and the HTTP server layer are
//! `fgpu-plumbing`'s; reading a pod's HAMi annotations is `fgpu_driver::hami`.
//!
//! Layering (no module uses one above it): `explain`, `slim`, `mirror`, `metrics`,
//! `admission`, `selector` → `mig` → `inventory`, `usage`, `load`, `request`, `allocation` →
//! `hami_pods`, `view`, `scores` → `cache` → `reconcile` → `write`, `shared` → `server` → `daemon`.

pub mod admission;
pub mod allocation;
pub mod cache;
pub mod daemon;
pub mod explain;
pub mod hami_metrics;
pub mod hami_pods;
pub mod inventory;
pub mod load;
pub mod metrics;
pub mod mig;
pub mod mirror;
pub mod objects;
pub mod reconcile;
pub mod request;
pub mod scores;
pub mod selector;
pub mod server;
pub mod shared;
pub mod slim;
pub mod usage;
pub mod view;
pub mod write;

pub use fgpu_api::dra::ApiVersion;

/// `namespace/name` of an object, the way messages name it.
pub fn object_key(obj: &serde_json::Value) -> String {
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or("<unnamed>");
    match meta["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// `namespace/name` of a typed claim, the way messages name it: as [`object_key`] names
/// its JSON.
pub fn claim_key(claim: &fgpu_api::dra::claim::ResourceClaim) -> String {
    let meta = &claim.metadata;
    let name = if meta.name.is_empty() {
        "<unnamed>"
    } else {
        meta.name.as_str()
    };
    if meta.namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{}/{name}", meta.namespace)
    }
}

/// Why a JSON value is not a whole-number quantity ([`quantity_u64`]); the message reads
/// as the predicate of a sentence whose subject is the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// A string that does not parse as a whole-number quantity.
    #[error(transparent)]
    Parse(#[from] fgpu_api::quantity::QuantityError),
    /// A JSON number that is negative or not an integer.
    #[error("{0} is not a non-negative integer")]
    NotANonNegativeInteger(serde_json::Number),
    /// No value.
    #[error("missing")]
    Missing,
    /// Neither a string nor a number.
    #[error("{0} is not a quantity")]
    NotAQuantity(serde_json::Value),
}

/// A quantity (string, or a JSON integer) resolved to a whole number.
pub(crate) fn quantity_u64(v: &serde_json::Value) -> Result<u64, QuantityError> {
    match v {
        serde_json::Value::String(s) => Ok(fgpu_api::quantity::parse_u64(s)?),
        serde_json::Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| QuantityError::NotANonNegativeInteger(n.clone())),
        serde_json::Value::Null => Err(QuantityError::Missing),
        other => Err(QuantityError::NotAQuantity(other.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantity_errors_say_what_is_wrong() {
        assert_eq!(quantity_u64(&json!("2Gi")), Ok(2 << 30));
        assert_eq!(quantity_u64(&json!(7)), Ok(7));
        let messages = [
            (json!(-1), "-1 is not a non-negative integer"),
            (json!(1.5), "1.5 is not a non-negative integer"),
            (json!(null), "missing"),
            (json!(true), "true is not a quantity"),
        ];
        for (v, want) in messages {
            assert_eq!(quantity_u64(&v).unwrap_err().to_string(), want, "{v}");
        }
        let parse = quantity_u64(&json!("0.1Ki")).unwrap_err();
        assert_eq!(
            parse.to_string(),
            fgpu_api::quantity::parse_u64("0.1Ki")
                .unwrap_err()
                .to_string()
        );
    }
}
