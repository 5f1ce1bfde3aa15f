//! The extender's HTTP servers (the plumbing's server layer: body limits, timeouts). Plain: `POST /filter`, `/prioritize`,
//! `/bind` (the last path segment is the verb, so any `urlPrefix` path works) and
//! `GET /healthz`.
//!
//! A body that does not decode is answered 400 with the decoder's message; a pod the
//! extender cannot read is answered 200 with `Error` set (filter, bind) or 400
//! (prioritize, whose errors the scheduler ignores). Nothing a client sends stops the
//! server.
//!
//! TLS (optional, [`serve_webhook`]): the admission webhooks, `POST /mutate-pods` (the
//! mutating one) and `POST /validate-pods` (the assignment guard alone), and `GET /healthz`.

use std::sync::Arc;

use axum::Router;
use fgpu_api::extender::{ExtenderArgs, ExtenderBindingArgs};
use fgpu_plumbing::server::Limits;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use tokio::net::TcpListener;

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

/// Answers one request.
pub async fn handle<W: ClusterWriter, B: BodyIn>(
    req: Request<B>,
    ext: Arc<Extender>,
    writer: &W,
) -> Response<Full<Bytes>> {
    let verb = req
        .uri()
        .path()
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let method = req.method().clone();
    match (method, verb.as_str()) {
        (Method::GET, "healthz") => return text(StatusCode::OK, "ok"),
        (Method::POST, "filter" | "prioritize" | "bind") => {}
        (_, "filter" | "prioritize" | "bind") => {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("/{verb} takes POST with a JSON body"),
            );
        }
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "not found; the extender serves POST /filter, /prioritize, /bind and GET /healthz",
            );
        }
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("/{verb}: reading the body: {e}"),
            );
        }
    };
    match verb.as_str() {
        // Filter and prioritize are CPU work (milliseconds for thousands of nodes): run
        // them off the async workers so that binds are never stuck behind them.
        "filter" | "prioritize" => match serde_json::from_slice::<ExtenderArgs>(&body) {
            Ok(args) => {
                let filter = verb == "filter";
                let done = tokio::task::spawn_blocking(move || {
                    if filter {
                        json(&ext.filter(&args))
                    } else {
                        match ext.prioritize(&args) {
                            Ok(list) => json(&list),
                            Err(e) => text(StatusCode::BAD_REQUEST, format!("/prioritize: {e}")),
                        }
                    }
                })
                .await;
                done.unwrap_or_else(|e| {
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("/{verb}: the evaluation failed: {e}"),
                    )
                })
            }
            Err(e) => text(
                StatusCode::BAD_REQUEST,
                format!("/{verb}: the body is not an ExtenderArgs: {e}"),
            ),
        },
        _ => match serde_json::from_slice::<ExtenderBindingArgs>(&body) {
            Ok(args) => json(&ext.bind(&args, writer).await),
            Err(e) => text(
                StatusCode::BAD_REQUEST,
                format!("/bind: the body is not an ExtenderBindingArgs: {e}"),
            ),
        },
    }
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
            return text(
                StatusCode::BAD_REQUEST,
                format!("{path}: reading the body: {e}"),
            );
        }
    };
    let review: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("{path}: the body is not an AdmissionReview (JSON): {e}"),
            );
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
            if r["allowed"] == false {
                tracing::info!("webhook denied: {}", r["status"]["message"]);
            } else if r["patch"].is_string() {
                tracing::debug!(uid = %r["uid"], "webhook mutated a pod");
            }
            json(&answer)
        }
        Err(e) => text(StatusCode::BAD_REQUEST, format!("{path}: {e}")),
    }
}
