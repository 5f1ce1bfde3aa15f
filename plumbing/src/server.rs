//! One HTTP/1.1 server layer for every endpoint fgpu serves: metrics and health, the
//! scheduler extender, the admission webhooks.
//!
//! A daemon describes its endpoints as an [`axum::Router`]; [`serve`] runs it on a listener,
//! plain or over TLS, with the same protections everywhere ([`Limits`]): a ceiling on the
//! request body (tower-http's `RequestBodyLimit`: 413 past it), a deadline for the whole
//! request (tower-http's `Timeout`: 408), a deadline for the request head (a client that
//! opens a connection and sends nothing is dropped) and one for the TLS handshake. A
//! connection that fails affects only itself; the accept loop ends when `shutdown`
//! completes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

/// What one request may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// The whole request, from its head to the end of the response.
    pub request_timeout: Duration,
    /// From a connection's start (or its last request) to a complete request head.
    pub header_timeout: Duration,
    /// A TLS handshake.
    pub handshake_timeout: Duration,
}

impl Limits {
    /// Metrics and health: small GETs.
    pub const PROBES: Self = Self {
        max_body: 64 << 10,
        request_timeout: Duration::from_secs(30),
        header_timeout: Duration::from_secs(10),
        handshake_timeout: Duration::from_secs(10),
    };

    /// Admission webhooks: an `AdmissionReview` of a Pod or a claim (a Pod is at most about
    /// 1.5 MiB in etcd); the API server's own webhook timeout is 10 s at most 30 s.
    pub const WEBHOOK: Self = Self {
        max_body: 8 << 20,
        request_timeout: Duration::from_secs(30),
        header_timeout: Duration::from_secs(10),
        handshake_timeout: Duration::from_secs(10),
    };

    /// The same limits with another body ceiling.
    pub const fn with_max_body(self, max_body: usize) -> Self {
        Self { max_body, ..self }
    }

    /// The same limits with another deadline for the whole request.
    pub const fn with_request_timeout(self, request_timeout: Duration) -> Self {
        Self {
            request_timeout,
            ..self
        }
    }
}

/// The webhook server's flags, the same in `fgpu-controller run` and `extender`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct WebhookArgs {
    /// Address to serve the admission webhooks on (HTTPS; `run`: /mutate-pods and
    /// /validate-claims, `extender`: /mutate-pods); needs --tls-cert and --tls-key. No
    /// webhook when absent.
    #[arg(long, value_name = "ADDR")]
    pub webhook_addr: Option<std::net::SocketAddr>,
    /// PEM certificate (chain) of the webhook server; a renewed file is served without a
    /// restart.
    #[arg(long, value_name = "FILE", requires = "webhook_addr")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of the webhook server.
    #[arg(long, value_name = "FILE", requires = "webhook_addr")]
    pub tls_key: Option<std::path::PathBuf>,
}

/// `--webhook-addr` without its certificate and key.
#[derive(Debug, thiserror::Error)]
pub enum WebhookArgsError {
    #[error("--webhook-addr needs --tls-cert and --tls-key")]
    MissingTls,
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

impl WebhookArgs {
    /// The address and TLS configuration to serve on; `None` without --webhook-addr.
    pub fn tls(
        &self,
    ) -> Result<Option<(std::net::SocketAddr, Arc<rustls::ServerConfig>)>, WebhookArgsError> {
        match (&self.webhook_addr, &self.tls_cert, &self.tls_key) {
            (Some(addr), Some(c), Some(k)) => Ok(Some((*addr, crate::tls::server_config(c, k)?))),
            (Some(_), _, _) => Err(WebhookArgsError::MissingTls),
            _ => Ok(None),
        }
    }
}

/// Serves `router` on `listener` (over TLS when `tls` is given) until `shutdown`
/// completes.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) {
    let app = router.layer(
        ServiceBuilder::new()
            .layer(TimeoutLayer::with_status_code(
                StatusCode::REQUEST_TIMEOUT,
                limits.request_timeout,
            ))
            .layer(RequestBodyLimitLayer::new(limits.max_body)),
    );
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!("accept: {e}");
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let served = match acceptor {
                None => http.serve_connection(TokioIo::new(stream), service).await,
                Some(acceptor) => {
                    let stream = match tokio::time::timeout(
                        limits.handshake_timeout,
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, "TLS handshake: {e}");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    http.serve_connection(TokioIo::new(stream), service).await
                }
            };
            if let Err(e) = served {
                tracing::debug!(%peer, "connection: {e}");
            }
        });
    }
}

/// A response with `body` of `content_type`.
pub fn body(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<axum::body::Body>,
) -> axum::response::Response {
    let mut r = axum::response::Response::new(body.into());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

/// Binds `addr`; the error names `flag`.
pub async fn bind(flag: &str, addr: std::net::SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr).await.map_err(|source| BindError {
        flag: flag.to_owned(),
        addr,
        source,
    })
}

/// A listen address that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {addr}: {source}")]
pub struct BindError {
    pub flag: String,
    pub addr: std::net::SocketAddr,
    #[source]
    pub source: std::io::Error,
}
