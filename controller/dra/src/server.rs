//! The daemon's HTTP endpoints, served by the plumbing's server layer (body limits,
//! timeouts, certificate reload).
//!
//! * Webhooks over TLS (rustls, certificate and key from PEM files):
//!   `POST /mutate-pods` (adds the scheduling gate, [`crate::admission::gate_patch`]) and
//!   `POST /validate-claims` ([`crate::admission::validate`]). A review that cannot be
//!   read is answered 400; a lookup that fails admits the pod without the gate and says
//!   so in a warning (the API server's `failurePolicy` covers only an unreachable webhook).
//! * Plain HTTP: `GET /metrics`, `/healthz` (the process serves), `/readyz` (the
//!   reflectors have listed once).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Result;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use axum::routing::get;
use fgpu_plumbing::server::{self as http, Limits};
use kube::api::{Api, DynamicObject};
use serde_json::Value;

use crate::admission::{self, ClaimSource};
use crate::objects::request_classes;
use crate::shared::{Mode, Shared};

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response {
    http::body(status, content_type, body)
}

/// The plain endpoints: `/metrics`, `/healthz`, `/readyz`.
pub fn probes(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(s): State<Arc<Shared>>| async move {
                reply(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    s.metrics.encode(),
                )
            }),
        )
        .route(
            "/healthz",
            get(|| async { reply(StatusCode::OK, "text/plain", "ok\n".into()) }),
        )
        .route(
            "/readyz",
            get(|State(s): State<Arc<Shared>>| async move {
                if s.ready.load(Ordering::Relaxed) {
                    reply(StatusCode::OK, "text/plain", "ok\n".into())
                } else {
                    reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        "caches not synced\n".into(),
                    )
                }
            }),
        )
        .fallback(|| async { reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()) })
        .with_state(shared)
}

/// Serves `/metrics`, `/healthz`, `/readyz` on `addr`.
pub async fn spawn_plain(addr: SocketAddr, shared: Arc<Shared>) -> Result<()> {
    let listener = http::bind("--metrics-address", addr).await?;
    tracing::info!(%addr, "metrics and health endpoints");
    tokio::spawn(http::serve(
        listener,
        probes(shared),
        Limits::PROBES,
        None,
        std::future::pending(),
    ));
    Ok(())
}

/// The webhook endpoints: `POST /mutate-pods`, `POST /validate-claims`.
pub fn webhooks(shared: Arc<Shared>) -> Router {
    Router::new()
        .fallback(
            |State(s): State<Arc<Shared>>, req: Request| async move { webhook(req, &s).await },
        )
        .with_state(shared)
}

/// Serves the webhooks over TLS on `addr`.
pub async fn spawn_webhooks(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    shared: Arc<Shared>,
) -> Result<()> {
    let listener = http::bind("--webhook-addr", addr).await?;
    tracing::info!(%addr, "admission webhooks (HTTPS)");
    tokio::spawn(http::serve(
        listener,
        webhooks(shared),
        Limits::WEBHOOK,
        Some(tls),
        std::future::pending(),
    ));
    Ok(())
}

async fn webhook(req: Request, shared: &Shared) -> Response {
    let path = req.uri().path().to_owned();
    if req.method() != Method::POST {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "POST an AdmissionReview\n".into(),
        );
    }
    let body: Bytes = match axum::body::to_bytes(req.into_body(), Limits::WEBHOOK.max_body).await {
        Ok(b) => b,
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("reading the body: {e}\n"),
            );
        }
    };
    let review: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("the body is not an AdmissionReview (JSON): {e}\n"),
            );
        }
    };
    if !review["request"]["uid"].is_string() {
        return reply(
            StatusCode::BAD_REQUEST,
            "text/plain",
            "AdmissionReview without request.uid\n".into(),
        );
    }
    let answer = match path.as_str() {
        "/mutate-pods" => mutate_pod(&review, shared).await,
        "/validate-claims" => {
            let kind = review["request"]["kind"]["kind"]
                .as_str()
                .unwrap_or("ResourceClaim");
            let object = &review["request"]["object"];
            let classes = lookup_classes(
                shared,
                &admission::high_priority_classes(object, kind, &shared.driver),
            )
            .await;
            match admission::validate(object, kind, &shared.driver, &classes) {
                Ok(w) => admission::response(&review, true, None, None, &w),
                Err(e) => {
                    let m = e.to_string();
                    tracing::info!("denied: {m}");
                    admission::response(&review, false, Some(&m), None, &[])
                }
            }
        }
        _ => return reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    reply(StatusCode::OK, "application/json", answer.to_string())
}

/// What the DeviceClasses `names` say about `priority: high` (see
/// [`admission::class_allows_high`]); none are read when a claim does not ask for it.
async fn lookup_classes(shared: &Shared, names: &[String]) -> admission::ClassPolicy {
    let ar = fgpu_plumbing::discovery::device_classes(shared.api);
    let api: Api<DynamicObject> = Api::all_with(shared.client.clone(), &ar);
    let mut out = admission::ClassPolicy::new();
    for n in names {
        let found = match api.get_opt(n).await {
            Ok(Some(o)) => {
                let v = serde_json::to_value(&o).unwrap_or(Value::Null);
                admission::ClassLookup::Found(admission::class_allows_high(&v, &shared.driver))
            }
            Ok(None) => admission::ClassLookup::NotFound,
            Err(e) => admission::ClassLookup::Failed(e.to_string()),
        };
        out.insert(n.clone(), found);
    }
    out
}

/// Whether the pod needs the gate: any referenced claim or template of the shared class.
async fn mutate_pod(review: &Value, shared: &Shared) -> Value {
    let pod = &review["request"]["object"];
    let ns = review["request"]["namespace"]
        .as_str()
        .or_else(|| pod["metadata"]["namespace"].as_str())
        .unwrap_or("default");
    if review["request"]["operation"].as_str() != Some("CREATE")
        || shared.mode.get() == Mode::Capacity
    {
        return admission::response(review, true, None, None, &[]);
    }
    let class = shared.driver.shared_class();
    let mut warnings = Vec::new();
    let mut needs = false;
    for src in admission::pod_sources(pod) {
        let (ar, name, inner) = match &src {
            ClaimSource::Claim(n) => (fgpu_plumbing::discovery::claims(shared.api), n, false),
            ClaimSource::Template(n) => (
                fgpu_plumbing::discovery::claim_templates(shared.api),
                n,
                true,
            ),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(shared.client.clone(), ns, &ar);
        match api.get_opt(name).await {
            Ok(Some(o)) => {
                let v = serde_json::to_value(&o).unwrap_or(Value::Null);
                let devices = if inner {
                    &v["spec"]["spec"]["devices"]
                } else {
                    &v["spec"]["devices"]
                };
                if request_classes(devices).contains(&class.as_str()) {
                    needs = true;
                }
            }
            Ok(None) => warnings.push(format!(
                "fgpu: {} {ns}/{name} not found; the pod gets no allocation gate",
                if inner {
                    "ResourceClaimTemplate"
                } else {
                    "ResourceClaim"
                }
            )),
            Err(e) => warnings.push(format!(
                "fgpu: looking up {ns}/{name} failed ({e}); the pod gets no allocation gate"
            )),
        }
    }
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let patch = if needs {
        admission::gate_patch(pod, &shared.driver.scheduling_gate())
    } else {
        None
    };
    if patch.is_some() {
        tracing::info!(
            pod = %format!("{ns}/{}", pod["metadata"]["name"].as_str().or(pod["metadata"]["generateName"].as_str()).unwrap_or("")),
            "scheduling gate added"
        );
    }
    admission::response(review, true, None, patch.as_ref(), &warnings)
}
