//! The daemon's HTTP servers (hyper 1, HTTP/1.1).
//!
//! * Webhooks over TLS (rustls, certificate and key from PEM files):
//!   `POST /mutate-pods` (adds the scheduling gate, [`crate::admission::gate_patch`]) and
//!   `POST /validate-claims` ([`crate::admission::validate`]). A review that cannot be
//!   read is answered 400; a lookup that fails admits the pod without the gate and says
//!   so in a warning (the API server's `failurePolicy` covers only an unreachable webhook).
//! * Plain HTTP: `GET /metrics`, `/healthz` (the process serves), `/readyz` (the
//!   reflectors have listed once).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::api::{Api, DynamicObject};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::{self, ClaimSource};
use crate::daemon::{Mode, Shared, claim_resource, template_resource};
use crate::reconcile::request_classes;

/// A rustls server config from PEM files.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    let certs = rustls_pemfile::certs(&mut std::io::BufReader::new(
        std::fs::File::open(cert).with_context(|| format!("--tls-cert {}", cert.display()))?,
    ))
    .collect::<Result<Vec<_>, _>>()
    .with_context(|| format!("--tls-cert {}: not PEM certificates", cert.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "--tls-cert {}: no certificate in the file",
        cert.display()
    );
    let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
        std::fs::File::open(key).with_context(|| format!("--tls-key {}", key.display()))?,
    ))
    .with_context(|| format!("--tls-key {}: not a PEM private key", key.display()))?
    .with_context(|| format!("--tls-key {}: no private key in the file", key.display()))?;
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS protocol versions")?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .context("--tls-cert/--tls-key do not make a certificate and its key")?;
    Ok(Arc::new(cfg))
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// Serves `/metrics`, `/healthz`, `/readyz` on `addr`.
pub async fn spawn_plain(addr: SocketAddr, shared: Arc<Shared>) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-addr {addr}"))?;
    tracing::info!(%addr, "metrics and health endpoints");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let shared = shared.clone();
                    async move {
                        Ok::<_, Infallible>(match req.uri().path() {
                            "/metrics" => reply(
                                StatusCode::OK,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                shared.metrics.encode(),
                            ),
                            "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
                            "/readyz" if shared.ready.load(Ordering::Relaxed) => {
                                reply(StatusCode::OK, "text/plain", "ok\n".into())
                            }
                            "/readyz" => reply(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "text/plain",
                                "caches not synced\n".into(),
                            ),
                            _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
                        })
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(())
}

/// The webhook server's flags, shared by `run` and `extender`.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Address to serve the admission webhooks on (HTTPS; `run`: /mutate-pods and
    /// /validate-claims, `extender`: /mutate-pods); needs --tls-cert and --tls-key. No
    /// webhook when absent.
    #[arg(long)]
    pub webhook_addr: Option<SocketAddr>,
    /// PEM certificate (chain) of the webhook server.
    #[arg(long, requires = "webhook_addr")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of the webhook server.
    #[arg(long, requires = "webhook_addr")]
    pub tls_key: Option<std::path::PathBuf>,
}

impl WebhookArgs {
    /// The address and TLS configuration to serve on; `None` without --webhook-addr.
    pub fn tls(&self) -> Result<Option<(SocketAddr, Arc<rustls::ServerConfig>)>> {
        match (&self.webhook_addr, &self.tls_cert, &self.tls_key) {
            (Some(addr), Some(c), Some(k)) => Ok(Some((*addr, tls_config(c, k)?))),
            (Some(_), _, _) => anyhow::bail!("--webhook-addr needs --tls-cert and --tls-key"),
            _ => Ok(None),
        }
    }
}

/// Serves the webhooks over TLS on `addr`.
pub async fn spawn_webhooks(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    shared: Arc<Shared>,
) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("--webhook-addr {addr}"))?;
    tracing::info!(%addr, "admission webhooks (HTTPS)");
    tokio::spawn(serve_tls(listener, tls, move |req| {
        let shared = shared.clone();
        async move { webhook(req, &shared).await }
    }));
    Ok(())
}

/// Accepts TLS connections on `listener` until the task is dropped, and answers each
/// request of each connection (HTTP/1.1) with `handle`. A failed handshake drops only that
/// connection.
pub async fn serve_tls<H, F>(listener: TcpListener, tls: Arc<rustls::ServerConfig>, handle: H)
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("accept: {e}");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let handle = handle.clone();
        tokio::spawn(async move {
            let stream = match acceptor.accept(stream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(%peer, "TLS handshake: {e}");
                    return;
                }
            };
            let svc = service_fn(move |req: Request<Incoming>| {
                let reply = handle(req);
                async move { Ok::<_, Infallible>(reply.await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

async fn webhook(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    if req.method() != Method::POST {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "POST an AdmissionReview\n".into(),
        );
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
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
            match admission::validate(&review["request"]["object"], kind, &shared.driver) {
                Ok(w) => admission::response(&review, true, None, None, &w),
                Err(m) => {
                    tracing::info!("denied: {m}");
                    admission::response(&review, false, Some(&m), None, &[])
                }
            }
        }
        _ => return reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    reply(StatusCode::OK, "application/json", answer.to_string())
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
            ClaimSource::Claim(n) => (claim_resource(shared.api), n, false),
            ClaimSource::Template(n) => (template_resource(shared.api), n, true),
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
