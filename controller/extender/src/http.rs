//! The extender's HTTP servers (the plumbing's server layer: body limits, timeouts). Plain: `POST /filter`, `/prioritize`,
//! `/bind` (the last path segment is the verb, so any `urlPrefix` path works) and
//! `GET /healthz`; each verb's outcome and time go to the extender's metrics
//! ([`crate::metrics`]), served on their own port by [`serve_metrics`].
//!
//! A body that does not decode is answered 400 with the decoder's message; a pod the
//! extender cannot read is answered 200 with `Error` set (filter, bind) or 400
//! (prioritize, whose errors the scheduler ignores). Nothing a client sends stops the
//! server.
//!
//! TLS (optional, [`serve_webhook`]): the admission webhooks, `POST /mutate-pods` (the
//! mutating one) and `POST /validate-pods` (the assignment guard alone), and `GET /healthz`.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use fgpu_api::extender::{ExtenderArgs, ExtenderBindingArgs, ExtenderFilterResult};
use fgpu_plumbing::server::Limits;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use tokio::net::TcpListener;

use crate::metrics::{Admission, Outcome, Verb, Webhook};
use crate::state::Extender;
use crate::writer::ClusterWriter;

/// Largest request body accepted (a filter call with full Node objects can be large).
pub const MAX_BODY: usize = 256 << 20;

/// What one extender call may take: up to [`MAX_BODY`], a minute (a bind writes to the
/// API server).
pub const LIMITS: Limits = Limits::WEBHOOK
    .with_max_body(MAX_BODY)
    .with_request_timeout(std::time::Duration::from_secs(60));

/// The extender's endpoints.
pub fn router<W: ClusterWriter>(ext: Arc<Extender>, writer: Arc<W>) -> Router {
    Router::new().fallback(move |req: axum::extract::Request| async move {
        handle(req, ext, &*writer).await
    })
}

/// Serves the extender on `listener` until the task is dropped.
pub async fn serve<W: ClusterWriter>(listener: TcpListener, ext: Arc<Extender>, writer: Arc<W>) {
    serve_tls(listener, ext, writer, None).await;
}

/// Serves the extender on `listener`, over TLS when `tls` is given (mutual TLS:
/// [`fgpu_plumbing::tls::server_config_mutual`]), until the task is dropped.
pub async fn serve_tls<W: ClusterWriter>(
    listener: TcpListener,
    ext: Arc<Extender>,
    writer: Arc<W>,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    fgpu_plumbing::server::serve(
        listener,
        router(ext, writer),
        LIMITS,
        tls,
        std::future::pending(),
    )
    .await;
}

fn reply(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn text(status: StatusCode, msg: impl Into<String>) -> Response<Full<Bytes>> {
    let mut m = msg.into();
    m.push('\n');
    reply(status, "text/plain; charset=utf-8", m.into_bytes())
}

fn json<T: Serialize>(value: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(value) {
        Ok(b) => reply(StatusCode::OK, "application/json", b),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Answers one request, and records a verb's outcome and time in the extender's metrics.
pub async fn handle<W: ClusterWriter, B: BodyIn>(
    req: Request<B>,
    ext: Arc<Extender>,
    writer: &W,
) -> Response<Full<Bytes>> {
    let started = Instant::now();
    let (response, call) = answer(req, ext.clone(), writer).await;
    if let Some((verb, outcome)) = call {
        ext.metrics().observe(verb, outcome, started.elapsed());
    }
    response
}

/// How a filter's answer ended: an error, no node passed, or some did.
fn filter_outcome(r: &ExtenderFilterResult) -> Outcome {
    let passed = match (&r.node_names, &r.nodes) {
        (Some(names), _) => names.len(),
        (None, Some(nodes)) => nodes.items.len(),
        (None, None) => 0,
    };
    if !r.error.is_empty() {
        Outcome::error
    } else if passed == 0 {
        Outcome::no_fit
    } else {
        Outcome::ok
    }
}

type Answer = (Response<Full<Bytes>>, Option<(Verb, Outcome)>);

async fn answer<W: ClusterWriter, B: BodyIn>(
    req: Request<B>,
    ext: Arc<Extender>,
    writer: &W,
) -> Answer {
    let verb = req
        .uri()
        .path()
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let method = req.method().clone();
    let called = match verb.as_str() {
        "filter" => Verb::filter,
        "prioritize" => Verb::prioritize,
        "bind" => Verb::bind,
        _ if method == Method::GET && verb == "healthz" => {
            return (text(StatusCode::OK, "ok"), None);
        }
        _ => {
            return (
                text(
                    StatusCode::NOT_FOUND,
                    "not found; the extender serves POST /filter, /prioritize, /bind and GET /healthz",
                ),
                None,
            );
        }
    };
    if method != Method::POST {
        return (
            text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("/{verb} takes POST with a JSON body"),
            ),
            None,
        );
    }
    let failed = |response| (response, Some((called, Outcome::error)));
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return failed(text(
                StatusCode::BAD_REQUEST,
                format!("/{verb}: reading the body: {e}"),
            ));
        }
    };
    match called {
        // Filter and prioritize are CPU work (milliseconds for thousands of nodes): run
        // them off the async workers so that binds are never stuck behind them.
        Verb::filter | Verb::prioritize => match serde_json::from_slice::<ExtenderArgs>(&body) {
            Ok(args) => {
                let done = tokio::task::spawn_blocking(move || {
                    if called == Verb::filter {
                        let r = ext.filter(&args);
                        (json(&r), filter_outcome(&r))
                    } else {
                        match ext.prioritize(&args) {
                            Ok(list) => (json(&list), Outcome::ok),
                            Err(e) => (
                                text(StatusCode::BAD_REQUEST, format!("/prioritize: {e}")),
                                Outcome::error,
                            ),
                        }
                    }
                })
                .await;
                match done {
                    Ok((response, outcome)) => (response, Some((called, outcome))),
                    Err(e) => failed(text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("/{verb}: the evaluation failed: {e}"),
                    )),
                }
            }
            Err(e) => failed(text(
                StatusCode::BAD_REQUEST,
                format!("/{verb}: the body is not an ExtenderArgs: {e}"),
            )),
        },
        Verb::bind => match serde_json::from_slice::<ExtenderBindingArgs>(&body) {
            Ok(args) => {
                let r = ext.bind(&args, writer).await;
                let outcome = if r.error.is_empty() {
                    Outcome::ok
                } else {
                    Outcome::error
                };
                (json(&r), Some((called, outcome)))
            }
            Err(e) => failed(text(
                StatusCode::BAD_REQUEST,
                format!("/bind: the body is not an ExtenderBindingArgs: {e}"),
            )),
        },
    }
}

/// The metrics endpoints: `GET /metrics` ([`Extender::encode_metrics`]) and `GET /healthz`.
pub fn metrics_router(ext: Arc<Extender>) -> Router {
    use axum::routing::get;
    use fgpu_plumbing::server::body;
    Router::new()
        .route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| async move {
                let accept = headers
                    .get(axum::http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                let (content_type, page) =
                    fgpu_plumbing::exposition::negotiate(accept, ext.encode_metrics());
                body(StatusCode::OK, content_type, page)
            }),
        )
        .route(
            "/healthz",
            get(|| async { body(StatusCode::OK, "text/plain", "ok\n") }),
        )
        .fallback(|| async {
            body(
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found; this port serves GET /metrics and GET /healthz\n",
            )
        })
}

/// Serves [`metrics_router`] on `listener` (plain HTTP, the plumbing's probe limits) until
/// the task is dropped.
pub async fn serve_metrics(listener: TcpListener, ext: Arc<Extender>) {
    fgpu_plumbing::server::serve(
        listener,
        metrics_router(ext),
        Limits::PROBES,
        None,
        std::future::pending(),
    )
    .await;
}

/// Largest AdmissionReview accepted (a Pod is at most about 1.5 MiB in etcd).
pub const MAX_REVIEW_BODY: usize = Limits::WEBHOOK.max_body;

/// A request body the handlers can read (hyper's `Incoming`, axum's `Body`).
pub trait BodyIn:
    hyper::body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>> + Send
{
}

impl<B> BodyIn for B where
    B: hyper::body::Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
{
}

/// Serves the admission webhook over TLS on `listener` until the task is dropped:
/// `POST /mutate-pods` (an `AdmissionReview` of a Pod, [`crate::webhook::review`]) and
/// `GET /healthz`. The checks read the GPU inventory `ext` has cached. A body that is not
/// a review is answered 400; a failed TLS handshake drops only that connection.
pub async fn serve_webhook(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    ext: Arc<Extender>,
    cfg: Arc<crate::webhook::WebhookConfig>,
) {
    let router = Router::new().fallback(move |req: axum::extract::Request| async move {
        handle_webhook(req, &ext, &cfg).await
    });
    fgpu_plumbing::server::serve(
        listener,
        router,
        Limits::WEBHOOK,
        Some(tls),
        std::future::pending(),
    )
    .await;
}

/// Answers one webhook request.
pub async fn handle_webhook<B: BodyIn>(
    req: Request<B>,
    ext: &Extender,
    cfg: &crate::webhook::WebhookConfig,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let hook = if path == "/validate-pods" {
        Webhook::validate_pods
    } else {
        Webhook::mutate_pods
    };
    let error = |response| {
        ext.metrics().observe_admission(hook, Admission::error);
        response
    };
    match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => return text(StatusCode::OK, "ok"),
        (&Method::POST, "/mutate-pods" | "/validate-pods") => {}
        (_, "/mutate-pods" | "/validate-pods") => {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{path} takes POST with an AdmissionReview"),
            );
        }
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "not found; the webhook serves POST /mutate-pods, POST /validate-pods and GET /healthz",
            );
        }
    }
    let body = match Limited::new(req.into_body(), MAX_REVIEW_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(text(
                StatusCode::BAD_REQUEST,
                format!("{path}: reading the body: {e}"),
            ));
        }
    };
    let review: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(text(
                StatusCode::BAD_REQUEST,
                format!("{path}: the body is not an AdmissionReview (JSON): {e}"),
            ));
        }
    };
    let answer = if path == "/validate-pods" {
        crate::webhook::guard_review(&review, cfg)
    } else {
        crate::webhook::review(&review, cfg, &ext.gpu_inventory())
    };
    match answer {
        Ok(answer) => {
            let r = &answer["response"];
            let result = if r["allowed"] == false {
                tracing::info!("webhook denied: {}", r["status"]["message"]);
                Admission::denied
            } else if r["patch"].is_string() {
                tracing::debug!(uid = %r["uid"], "webhook mutated a pod");
                Admission::mutated
            } else {
                Admission::allowed
            };
            ext.metrics().observe_admission(hook, result);
            json(&answer)
        }
        Err(e) => error(text(StatusCode::BAD_REQUEST, format!("{path}: {e}"))),
    }
}
