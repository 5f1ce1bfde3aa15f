//! `fgpu-plumbing`: what fgpu's daemons share to talk to the API server and to serve HTTP.
//! No domain decisions live here (those are in `fgpu-driver`), and no data contract (that
//! is `fgpu-api`); this crate is the wiring every binary would otherwise write again.
//!
//! Always built (the simulator uses these and nothing else):
//!
//! * [`logging`]: the `--log-format` / `--log-level` flags of every binary and the
//!   subscriber they install.
//! * [`exit`]: exit statuses (0, 1 failure, 2 bad input), [`exit::BadInput`] and the one-line
//!   error report on stderr.
//! * [`exposition`]: a metrics page in OpenMetrics (for Prometheus) or text 0.0.4 (for
//!   everyone else, `promtool check metrics` included), by the request's `Accept`.
//!
//! Feature `kube` (default):
//!
//! * [`client`]: the API client from `--kubeconfig`, in-cluster config or `$KUBECONFIG`,
//!   every request bounded ([`client::REQUEST_TIMEOUT`]).
//! * [`discovery`]: the `resource.k8s.io` version the API server serves ([`ApiVersion`]),
//!   and the dynamic resources of DRA at that version.
//! * [`leader`]: Lease-based leader election: expiry judged on the local monotonic clock
//!   ([`leader::observe`]), and the [`leader::Fence`] that stops the leader's writes before
//!   a standby could take over.
//! * [`events`]: one Event writer (`events.k8s.io/v1`).
//! * [`backoff`]: the doubling retry delays of the daemons' loops.
//! * [`unix_seconds`]: an object's RFC 3339 timestamp (`creationTimestamp`) in Unix seconds.
//!
//! Feature `http` (default):
//!
//! * [`tls`]: the process-wide TLS provider, server configs from PEM files, and a
//!   certificate resolver that picks up renewed files.
//! * [`server`]: one HTTP/1.1 server layer (axum + tower-http) with request-body limits and
//!   timeouts, plain or over TLS, with graceful stop.
//! * [`admission`]: `AdmissionReview` responses, shared by both webhooks.
//!
//! With either: [`shutdown`], the future that completes on SIGTERM or Ctrl-C.
//!
//! Feature `testing` (off; tests only):
//!
//! * `testing`: the one fake API server of the tests, an in-memory object store behind a
//!   real `kube::Client`; a client of it can be cut off (its requests hang).
//!
//! Layering: `logging`, `exit` and `exposition` use nothing here; `discovery`, `client`, `leader` and
//! `backoff` use nothing here; `server` uses `tls`; `admission` and `testing` use nothing
//! here.

pub mod exit;
pub mod exposition;
pub mod logging;

#[cfg(feature = "kube")]
pub mod backoff;
#[cfg(feature = "kube")]
pub mod client;
#[cfg(feature = "kube")]
pub mod discovery;
#[cfg(feature = "kube")]
pub mod events;
#[cfg(feature = "kube")]
pub mod leader;

#[cfg(feature = "http")]
pub mod admission;
#[cfg(feature = "http")]
pub mod server;
#[cfg(feature = "http")]
pub mod tls;

#[cfg(any(feature = "kube", feature = "http"))]
pub mod shutdown;

#[cfg(feature = "testing")]
pub mod testing;

#[cfg(feature = "kube")]
pub use discovery::ApiVersion;

/// An RFC 3339 timestamp as the API server writes them (`metadata.creationTimestamp`) in
/// Unix seconds; 0 when `v` is absent or not such a timestamp.
#[cfg(feature = "kube")]
pub fn unix_seconds(v: &serde_json::Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_second())
}

/// Installs ring as the process-wide rustls provider (once; later calls do nothing).
///
/// The CDI crate's JSON-schema validator brings aws-lc-rs into the kubelet plugin too, and
/// with two providers compiled in rustls refuses to pick one: every binary that talks TLS
/// calls this first (the client set-up does).
#[cfg(any(feature = "kube", feature = "http"))]
pub fn tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
