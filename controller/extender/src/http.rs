//! The extender's HTTP servers (hyper 1, HTTP/1.1). Plain: `POST /filter`, `/prioritize`,
//! `/bind` (the last path segment is the verb, so any `urlPrefix` path works) and
//! `GET /healthz`.
//!
//! A body that does not decode is answered 400 with the decoder's message; a pod the
//! extender cannot read is answered 200 with `Error` set (filter, bind) or 400
//! (prioritize, whose errors the scheduler ignores). Nothing a client sends stops the
//! server.
//!
//! TLS (optional, [`serve_webhook`]): the admission webhook, `POST /mutate-pods`, and
//! `GET /healthz`.

use std::convert::Infallible;
use std::sync::Arc;

use fgpu_api::extender::{ExtenderArgs, ExtenderBindingArgs};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpListener;

use super::state::Extender;
use super::writer::ClusterWriter;

/// Largest request body accepted (a filter call with full Node objects can be large).
pub const MAX_BODY: usize = 256 << 20;

/// Serves the extender on `listener` until the task is dropped.
pub async fn serve<W: ClusterWriter>(listener: TcpListener, ext: Arc<Extender>, writer: Arc<W>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("accept: {e}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let ext = ext.clone();
        let writer = writer.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let ext = ext.clone();
                let writer = writer.clone();
                async move { Ok::<_, Infallible>(handle(req, ext, &*writer).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
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
pub async fn handle<W: ClusterWriter>(
    req: Request<Incoming>,
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
pub const MAX_REVIEW_BODY: usize = 8 << 20;

/// Serves the admission webhook over TLS on `listener` until the task is dropped:
/// `POST /mutate-pods` (an `AdmissionReview` of a Pod, [`super::webhook::review`]) and
/// `GET /healthz`. The checks read the GPU inventory `ext` has cached. A body that is not
/// a review is answered 400; a failed TLS handshake drops only that connection.
pub async fn serve_webhook(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    ext: Arc<Extender>,
    cfg: Arc<super::webhook::WebhookConfig>,
) {
    crate::server::serve_tls(listener, tls, move |req| {
        let ext = ext.clone();
        let cfg = cfg.clone();
        async move { handle_webhook(req, &ext, &cfg).await }
    })
    .await;
}

/// Answers one webhook request.
pub async fn handle_webhook(
    req: Request<Incoming>,
    ext: &Extender,
    cfg: &super::webhook::WebhookConfig,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => return text(StatusCode::OK, "ok"),
        (&Method::POST, "/mutate-pods") => {}
        (_, "/mutate-pods") => {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "/mutate-pods takes POST with an AdmissionReview",
            );
        }
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "not found; the webhook serves POST /mutate-pods and GET /healthz",
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
                format!("/mutate-pods: reading the body: {e}"),
            );
        }
    };
    let review: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("/mutate-pods: the body is not an AdmissionReview (JSON): {e}"),
            );
        }
    };
    let inv = ext.gpu_inventory();
    match super::webhook::review(&review, cfg, &inv) {
        Ok(answer) => {
            let r = &answer["response"];
            if r["allowed"] == false {
                tracing::info!("webhook denied: {}", r["status"]["message"]);
            } else if r["patch"].is_string() {
                tracing::debug!(uid = %r["uid"], "webhook mutated a pod");
            }
            json(&answer)
        }
        Err(e) => text(StatusCode::BAD_REQUEST, format!("/mutate-pods: {e}")),
    }
}
