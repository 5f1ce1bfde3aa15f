//! One HTTP/1.1 server layer for every endpoint fgpu serves: metrics and health, the
//! scheduler extender, the admission webhooks.
//!
//! A daemon describes its endpoints as an [`axum::Router`]; [`serve`] runs it on a listener,
//! plain or over TLS, with the same protections everywhere ([`Limits`]): a ceiling on the
//! request body (tower-http's `RequestBodyLimit`: 413 past it), a deadline for the whole
//! request (tower-http's `Timeout`: 408), a deadline for the request head (a client that
//! opens a connection and sends nothing, or sends a head slowly, is dropped), one for the
//! TLS handshake, and a longer one for an idle keep-alive connection. A connection that
//! fails affects only itself; the accept loop ends when `shutdown` completes.
//!
//! The head deadline and the idle one are kept apart on purpose. hyper's own
//! `header_read_timeout` starts when a connection waits for its next request, so it also
//! closes every keep-alive connection idle for that long. A client that sends a `POST` on a
//! pooled connection at the moment the server closes it gets `broken pipe`, and Go's client
//! (the API server calling a webhook, kube-scheduler calling the extender) does not retry a
//! `POST`. So a connection's watchdog here ([`Pulse`]) starts the head deadline at the
//! connection's start and at the first byte of each later request, and closes an idle
//! connection only after [`Limits::idle_timeout`], longer than Go's client keeps one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use http::StatusCode;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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
    /// From a connection's start, or from the first byte of a later request, to a complete
    /// request head.
    pub header_timeout: Duration,
    /// A TLS handshake.
    pub handshake_timeout: Duration,
    /// A keep-alive connection with no request in progress and no byte moved. Longer than
    /// Go's HTTP client keeps an idle connection (90 s), so the client closes it first.
    pub idle_timeout: Duration,
}

impl Limits {
    /// Metrics and health: small GETs.
    pub const PROBES: Self = Self {
        max_body: 64 << 10,
        request_timeout: Duration::from_secs(30),
        header_timeout: Duration::from_secs(10),
        handshake_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
    };

    /// Admission webhooks: an `AdmissionReview` of a Pod or a claim (a Pod is at most about
    /// 1.5 MiB in etcd); the API server's own webhook timeout is 10 s at most 30 s.
    pub const WEBHOOK: Self = Self {
        max_body: 8 << 20,
        request_timeout: Duration::from_secs(30),
        header_timeout: Duration::from_secs(10),
        handshake_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(120),
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
        let app = app.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let served = match acceptor {
                None => serve_connection(stream, app, limits).await,
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
                    serve_connection(stream, app, limits).await
                }
            };
            match served {
                Ok(None) => {}
                Ok(Some(why)) => tracing::debug!(%peer, "connection closed: {why}"),
                Err(e) => tracing::debug!(%peer, "connection: {e}"),
            }
        });
    }
}

/// Serves one connection until the client closes it or its watchdog does (the reason).
async fn serve_connection<S>(
    stream: S,
    app: Router,
    limits: Limits,
) -> hyper::Result<Option<&'static str>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let pulse = Arc::new(Pulse::new());
    let service = Watched {
        inner: TowerToHyperService::new(app),
        pulse: pulse.clone(),
    };
    let io = TokioIo::new(Watched {
        inner: stream,
        pulse: pulse.clone(),
    });
    let conn = hyper::server::conn::http1::Builder::new()
        // The watchdog keeps the head deadline (see the module's documentation).
        .header_read_timeout(None)
        .serve_connection(io, service);
    tokio::pin!(conn);
    loop {
        let wake = match pulse.check(Instant::now(), &limits) {
            Check::Close(why) => return Ok(Some(why)),
            Check::Until(at) => at,
        };
        tokio::select! {
            served = conn.as_mut() => return served.map(|()| None),
            () = tokio::time::sleep_until(wake.into()) => {}
        }
    }
}

/// What a connection's watchdog reads: when it last moved a byte, whether a request is in
/// the service, and since when a request head is due. Written by [`Watched`] around the
/// stream (bytes) and around the service (requests).
#[derive(Debug)]
struct Pulse {
    start: Instant,
    /// Milliseconds from `start` to the last byte read or written.
    last_io: AtomicU64,
    /// Milliseconds from `start` to the moment a request head became due: 0 at the
    /// connection's start, the first byte read while no request is in the service after
    /// that, [`NOT_DUE`] while none is due.
    head_due: AtomicU64,
    /// A request is in the service: its deadline is the request timeout's.
    busy: AtomicBool,
}

const NOT_DUE: u64 = u64::MAX;

/// What the watchdog does next.
#[derive(Debug)]
enum Check {
    /// Close the connection, for this reason.
    Close(&'static str),
    /// Look again at this instant (sooner if the connection ends).
    Until(Instant),
}

impl Pulse {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_io: AtomicU64::new(0),
            head_due: AtomicU64::new(0),
            busy: AtomicBool::new(false),
        }
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.start).as_millis()).unwrap_or(NOT_DUE - 1)
    }

    /// Milliseconds from `start` to now.
    fn now(&self) -> u64 {
        self.millis(Instant::now())
    }

    fn at(&self, millis: u64) -> Instant {
        self.start + Duration::from_millis(millis)
    }

    fn read(&self) {
        let now = self.now();
        self.last_io.store(now, Ordering::Relaxed);
        if !self.busy.load(Ordering::Acquire) {
            // The first byte of a request: its head is due from now. A later byte of the
            // same head leaves the deadline where it is.
            let _ =
                self.head_due
                    .compare_exchange(NOT_DUE, now, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    fn wrote(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
    }

    fn request_began(&self) {
        self.busy.store(true, Ordering::Release);
        self.head_due.store(NOT_DUE, Ordering::Release);
    }

    fn request_ended(&self) {
        self.last_io.store(self.now(), Ordering::Relaxed);
        self.busy.store(false, Ordering::Release);
    }

    fn check(&self, now: Instant, limits: &Limits) -> Check {
        // Never sleep past one head deadline: a head may begin right after this look.
        let soon = now + limits.header_timeout;
        if self.busy.load(Ordering::Acquire) {
            return Check::Until(soon);
        }
        let due = self.head_due.load(Ordering::Acquire);
        if due != NOT_DUE {
            let deadline = self.at(due) + limits.header_timeout;
            return if now >= deadline {
                Check::Close("no complete request head in time")
            } else {
                Check::Until(deadline)
            };
        }
        let idle_until = self.at(self.last_io.load(Ordering::Relaxed)) + limits.idle_timeout;
        if now >= idle_until {
            Check::Close("idle")
        } else {
            Check::Until(idle_until.min(soon))
        }
    }
}

/// A connection's stream or service, reporting to its [`Pulse`].
struct Watched<T> {
    inner: T,
    pulse: Arc<Pulse>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.pulse.read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.pulse.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.pulse.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T, R> hyper::service::Service<R> for Watched<T>
where
    T: hyper::service::Service<R>,
    T::Future: Send + 'static,
{
    type Response = T::Response;
    type Error = T::Error;
    type Future = Pin<Box<dyn Future<Output = Result<T::Response, T::Error>> + Send>>;

    fn call(&self, req: R) -> Self::Future {
        self.pulse.request_began();
        let pulse = self.pulse.clone();
        let answered = self.inner.call(req);
        Box::pin(async move {
            let response = answered.await;
            pulse.request_ended();
            response
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A head deadline short enough to wait out in a test; the idle one far from it.
    const SHORT: Limits = Limits {
        max_body: 1024,
        request_timeout: Duration::from_secs(5),
        header_timeout: Duration::from_millis(300),
        handshake_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
    };

    const REQUEST: &[u8] = b"POST / HTTP/1.1\r\nhost: test\r\ncontent-length: 5\r\n\r\nhello";

    /// Serves `POST /` (answers with the body's length) with `limits`; its address.
    async fn server(limits: Limits) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route(
            "/",
            axum::routing::post(|body: String| async move { format!("got {}", body.len()) }),
        );
        tokio::spawn(serve(
            listener,
            router,
            limits,
            None,
            std::future::pending(),
        ));
        addr
    }

    /// Sends [`REQUEST`] on `c` and reads its answer; what came back.
    async fn ask(c: &mut TcpStream) -> String {
        c.write_all(REQUEST).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while !String::from_utf8_lossy(&got).contains("got 5") {
            match tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    /// Whether the server closes `c` within `within` (end of stream or a reset).
    async fn closed_within(c: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(within, c.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => true,
            Ok(Ok(n)) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&buf[..n])),
            Err(_) => false,
        }
    }

    #[tokio::test]
    async fn a_keep_alive_connection_idle_past_the_head_deadline_serves_its_next_request() {
        // The API server's webhook client and kube-scheduler's extender client reuse an
        // idle connection for a POST and do not retry it if the server closed it.
        let addr = server(SHORT).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut c).await.contains("got 5"));
        tokio::time::sleep(SHORT.header_timeout * 3).await;
        let second = ask(&mut c).await;
        assert!(
            second.contains("200 OK") && second.contains("got 5"),
            "the second request on an idle keep-alive connection got {second:?}"
        );
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_is_dropped_at_the_head_deadline() {
        let addr = server(SHORT).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert!(!closed_within(&mut c, SHORT.header_timeout / 3).await);
        assert!(
            closed_within(&mut c, Duration::from_secs(5)).await,
            "a connection that sent nothing was kept past its head deadline"
        );
    }

    #[tokio::test]
    async fn a_request_head_trickled_after_a_request_is_dropped_at_the_head_deadline() {
        let addr = server(SHORT).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut c).await.contains("got 5"));
        c.write_all(b"POST / HTTP/1.1\r\n").await.unwrap();
        // One header line every tenth of the deadline: bytes keep coming, the head never
        // ends. The deadline runs from the head's first byte, not from its last.
        let (mut rd, mut wr) = c.into_split();
        let trickle = tokio::spawn(async move {
            for i in 0..200 {
                tokio::time::sleep(SHORT.header_timeout / 10).await;
                if wr
                    .write_all(format!("x-{i}: y\r\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let mut buf = [0u8; 64];
        let end = tokio::time::timeout(Duration::from_secs(5), rd.read(&mut buf)).await;
        trickle.abort();
        assert!(
            matches!(end, Ok(Ok(0) | Err(_))),
            "a head trickled byte by byte was kept past its deadline: {end:?}"
        );
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_after_the_idle_timeout() {
        let limits = Limits {
            idle_timeout: Duration::from_millis(900),
            ..SHORT
        };
        let addr = server(limits).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut c).await.contains("got 5"));
        // Past the head deadline, short of the idle one: still open.
        assert!(!closed_within(&mut c, limits.header_timeout * 2).await);
        assert!(
            closed_within(&mut c, Duration::from_secs(5)).await,
            "an idle connection was kept past the idle timeout"
        );
    }
}
