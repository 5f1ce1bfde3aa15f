//! The API client every daemon builds the same way: from `--kubeconfig` when given, else
//! in-cluster configuration, else `$KUBECONFIG` / `~/.kube/config`; every request bounded.
//!
//! kube's client has a connect timeout (30 s) and a write timeout (295 s) but no read
//! timeout: a request the API server accepted and never answers waits forever. A read
//! timeout on the connection would also cut watches that see no event for a while, so the
//! bound is a tower timeout around each request up to its response headers
//! ([`REQUEST_TIMEOUT`]): a watch gets its headers at once and then streams on, ended by
//! its own `timeoutSeconds` (290 s) and kube-runtime's idle timeout past that.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long any request of a daemon waits for the API server's answer (its response
/// headers); kube's retries of 429, 503 and 504 count within it. The API server gives up on
/// a request itself after 60 s (`--request-timeout`); the daemons' calls are single objects
/// or pages of 100.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The `--kubeconfig` flag; flatten into a subcommand's arguments.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct KubeArgs {
    /// Kubeconfig file (in-cluster configuration, else $KUBECONFIG, when absent).
    #[arg(long, value_name = "FILE", env = "FGPU_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("--kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no --kubeconfig, and neither in-cluster config nor $KUBECONFIG works: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building the API client: {0}")]
    Build(#[source] kube::Error),
}

impl KubeArgs {
    /// The client these flags name.
    pub async fn client(&self) -> Result<kube::Client, ClientError> {
        client(self.kubeconfig.as_deref()).await
    }
}

/// The API client: from `kubeconfig` when given, else inferred.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    crate::tls_provider();
    let config = match kubeconfig {
        Some(path) => {
            let err = |source| ClientError::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(err)?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        None => kube::Config::infer().await.map_err(ClientError::Infer)?,
    };
    bounded(config, REQUEST_TIMEOUT)
}

/// The client of `config`, each request cut off after `timeout` without response headers.
pub fn bounded(config: kube::Config, timeout: Duration) -> Result<kube::Client, ClientError> {
    let builder = kube::client::ClientBuilder::try_from(config).map_err(ClientError::Build)?;
    Ok(builder
        .with_layer(&tower::timeout::TimeoutLayer::new(timeout))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, WatchEvent, WatchParams};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio_stream::StreamExt as _;

    /// A client of a local plain-HTTP server that runs `serve` on each connection.
    async fn client_of<F, Fut>(timeout: Duration, serve: F) -> kube::Client
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        crate::tls_provider();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn));
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        bounded(config, timeout).unwrap()
    }

    /// Reads one request's head.
    async fn read_head(conn: &mut tokio::net::TcpStream) {
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            got.extend_from_slice(&buf[..n]);
        }
    }

    #[tokio::test]
    async fn a_request_the_api_server_never_answers_fails() {
        let client = client_of(Duration::from_millis(300), |mut conn| async move {
            read_head(&mut conn).await;
            std::future::pending::<()>().await; // accepted, never answered
        })
        .await;
        let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
        let r = tokio::time::timeout(Duration::from_secs(20), cms.get("a")).await;
        let e = r.expect("the request timed out").unwrap_err();
        assert!(matches!(e, kube::Error::Service(_)), "{e:?}");
    }

    #[tokio::test]
    async fn a_quiet_watch_outlives_the_request_timeout() {
        let client = client_of(Duration::from_millis(200), |mut conn| async move {
            read_head(&mut conn).await;
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
            conn.write_all(head.as_bytes()).await.unwrap();
            // quiet for five request timeouts, then one event
            tokio::time::sleep(Duration::from_secs(1)).await;
            let event = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","resourceVersion":"2"}}}"#;
            let line = format!("{event}\n");
            let chunk = format!("{:x}\r\n{line}\r\n", line.len());
            conn.write_all(chunk.as_bytes()).await.unwrap();
            std::future::pending::<()>().await;
        })
        .await;
        let cms: Api<ConfigMap> = Api::namespaced(client, "ns");
        let stream = cms.watch(&WatchParams::default(), "1").await.unwrap();
        let mut stream = std::pin::pin!(stream);
        let first = tokio::time::timeout(Duration::from_secs(20), stream.next()).await;
        match first.expect("an event within 20 s") {
            Some(Ok(WatchEvent::Added(cm))) => assert_eq!(cm.metadata.name.as_deref(), Some("a")),
            other => panic!("want the ADDED event, got {other:?}"),
        }
    }
}
