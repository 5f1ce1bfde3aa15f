//! The stop signal of every daemon: SIGTERM (what the kubelet sends) or Ctrl-C.

/// Completes when the process is asked to stop.
pub async fn requested() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
