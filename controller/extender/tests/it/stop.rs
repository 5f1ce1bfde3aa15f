//! SIGTERM while the API server hangs: the daemon's loop ends at once.

use std::time::Duration;

use clap::Parser;
use fgpu_plumbing::testing::FakeApiServer;

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: fgpu_extender::ExtenderArgs,
}

/// The stand-in answers the first resync, then never again; its requests have no timeout,
/// so a loop that waited on one would never end.
#[tokio::test]
async fn serve_stops_promptly_while_the_api_server_hangs() {
    let cli = Cli::try_parse_from([
        "x",
        "--extender-address",
        "127.0.0.1:0",
        "--metrics-address",
        "127.0.0.1:0",
        "--resync-seconds",
        "1",
    ])
    .unwrap();
    let fake = FakeApiServer::new();
    let (client, cut) = fake.cuttable_client();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(fgpu_extender::serve(cli.args, client, async move {
        let _ = stopped.await;
    }));
    // Both watches (pods, nodes) open: they stay open on the stand-in, so that once it
    // is cut only the loop's periodic resync (every second) asks anything, and hangs.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while fake.lock().unwrap().watches < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watches did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cut.cut();
    while cut.hung() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no request hung");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the extender waited on the hung request")
        .unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
}
