//! Electors over the fake API server, in paused (virtual) time: a leader whose API server
//! stops answering is fenced before a standby takes over; skewed wall clocks change
//! nothing; stopping is prompt while requests hang.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use tokio::time::{Duration, Instant};

use super::{Elector, LeaderError, Led, Timings};
use crate::testing::FakeApiServer;

const NS: &str = "ns";
const LEASE: &str = "fgpu-controller";

/// A wall clock `secs` ahead of the real one (behind when negative).
fn skewed(secs: i64) -> super::WallClock {
    Arc::new(move || {
        Timestamp::now()
            .checked_add(SignedDuration::from_secs(secs))
            .unwrap()
    })
}

async fn holder(fake: &FakeApiServer) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(fake.client(), NS);
    leases
        .get(LEASE)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
}

#[tokio::test(start_paused = true)]
async fn a_leader_the_api_server_stops_answering_is_fenced_before_the_standby_leads() {
    let t = Timings::default();
    let fake = FakeApiServer::new();
    let (client_a, cut_a) = fake.cuttable_client();
    let mut a = Elector::new(client_a, NS, LEASE, "a".into());
    // b polls every second: it sees a's last renewal at most a second after it was written,
    // so its takeover comes as early as the protocol allows
    let quick = Timings::new(t.lease_seconds, 4, 1).unwrap();
    let mut b = Elector::new(fake.client(), NS, LEASE, "b".into()).with_timings(quick);
    a.acquire().await;
    let fence_a = a.fence();
    assert!(fence_a.check().is_ok());
    let fence_closed = tokio::spawn({
        let f = fence_a.clone();
        async move {
            f.closed().await;
            Instant::now()
        }
    });
    let a_held = tokio::spawn(async move {
        let e = a.hold().await;
        (Instant::now(), e)
    });
    let b_led = tokio::spawn(async move {
        b.acquire().await;
        (Instant::now(), b)
    });

    // a renews for a minute (five leases) and b stands by
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!b_led.is_finished(), "b took a lease that a renews");
    assert!(fence_a.check().is_ok());
    assert_eq!(holder(&fake).await.as_deref(), Some("a"));

    cut_a.cut();
    let cut_at = Instant::now();
    let (a_stopped, e) = a_held.await.unwrap();
    let closed_at = fence_closed.await.unwrap();
    let (b_at, b) = b_led.await.unwrap();
    assert!(cut_a.hung() > 0, "a's requests hung");
    assert!(
        matches!(e, LeaderError::NotRenewed { .. }),
        "a stopped because {e}"
    );
    assert!(fence_a.check().is_err());
    assert!(b.fence().check().is_ok());
    assert_eq!(holder(&fake).await.as_deref(), Some("b"));
    // the order that matters: a's writes stop, then b leads, with the margin between
    assert!(a_stopped <= closed_at + Duration::from_millis(1));
    assert!(
        closed_at + t.retry <= b_at,
        "fence closed {:?} after the cut, b led {:?} after it",
        closed_at - cut_at,
        b_at - cut_at
    );
    // and a's fence closed no later than one validity after the cut
    assert!(closed_at - cut_at <= t.validity());
    // b took over within a lease, a retry and a renewal of the cut
    assert!(b_at - cut_at <= t.lease() + quick.retry + t.renew);
}

/// One run: a leads with its clock `leader_skew` seconds off, b stands by with its clock
/// `standby_skew` off. Neither skew lets b steal the live lease, nor keeps b waiting once
/// a stopped.
async fn skewed_run(leader_skew: i64, standby_skew: i64) {
    let t = Timings::default();
    let fake = FakeApiServer::new();
    let (client_a, cut_a) = fake.cuttable_client();
    let mut a = Elector::new(client_a, NS, LEASE, "a".into()).with_clock(skewed(leader_skew));
    let mut b = Elector::new(fake.client(), NS, LEASE, "b".into()).with_clock(skewed(standby_skew));
    a.acquire().await;
    let a_held = tokio::spawn(async move { a.hold().await });
    let b_led = tokio::spawn(async move {
        b.acquire().await;
        Instant::now()
    });
    tokio::time::sleep(Duration::from_secs(120)).await;
    let skews = format!("leader {leader_skew:+}s, standby {standby_skew:+}s");
    assert!(!b_led.is_finished(), "{skews}: b stole a live lease");
    assert_eq!(holder(&fake).await.as_deref(), Some("a"), "{skews}");

    cut_a.cut();
    let cut_at = Instant::now();
    let b_at = b_led.await.unwrap();
    assert!(
        b_at - cut_at <= t.lease() + t.retry + t.renew,
        "{skews}: b waited {:?} for a dead lease",
        b_at - cut_at
    );
    assert!(matches!(
        a_held.await.unwrap(),
        LeaderError::NotRenewed { .. }
    ));
    // the skew was real: b wrote its own clock's time
    let leases: Api<Lease> = Api::namespaced(fake.client(), NS);
    let spec = leases.get(LEASE).await.unwrap().spec.unwrap();
    let renewed = spec.renew_time.unwrap().0;
    let off = renewed.duration_since(Timestamp::now()).as_secs();
    assert!(
        (off - standby_skew).abs() < 600,
        "{skews}: renewTime {renewed} is {off}s off"
    );
}

#[tokio::test(start_paused = true)]
async fn a_standby_an_hour_ahead_neither_steals_nor_waits_for_a_dead_lease() {
    skewed_run(0, 3600).await;
}

#[tokio::test(start_paused = true)]
async fn a_standby_an_hour_behind_neither_steals_nor_waits_for_a_dead_lease() {
    skewed_run(0, -3600).await;
}

#[tokio::test(start_paused = true)]
async fn a_leader_an_hour_behind_keeps_its_lease_while_it_renews() {
    skewed_run(-3600, 0).await;
}

#[tokio::test(start_paused = true)]
async fn a_leader_an_hour_ahead_is_taken_over_when_it_stops() {
    skewed_run(3600, 0).await;
}

#[tokio::test(start_paused = true)]
async fn stopping_is_prompt_while_the_api_server_hangs() {
    let t = Timings::default();
    let fake = FakeApiServer::new();

    // a leader: the API server stops answering, then the stop signal comes
    let (client, cut) = fake.cuttable_client();
    let mut a = Elector::new(client, NS, LEASE, "a".into());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let led = tokio::spawn(async move {
        let stop = async {
            let _ = stopped.await;
        };
        a.lead(stop, std::future::pending::<()>()).await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(holder(&fake).await.as_deref(), Some("a"));
    cut.cut();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.send(()).unwrap();
    let asked = Instant::now();
    let r = led.await.unwrap();
    assert!(matches!(r, Led::Stopped), "{r:?}");
    assert!(
        asked.elapsed() <= 2 * t.request_timeout(),
        "took {:?}",
        asked.elapsed()
    );

    // a standby whose every request hangs
    let (client, cut) = fake.cuttable_client();
    cut.cut();
    let mut b = Elector::new(client, NS, LEASE, "b".into());
    let asked = Instant::now();
    let r = b
        .lead(tokio::time::sleep(Duration::from_secs(3)), async {})
        .await;
    assert!(matches!(r, Led::Stopped), "{r:?}");
    assert_eq!(asked.elapsed(), Duration::from_secs(3));
}

#[tokio::test(start_paused = true)]
async fn release_hands_the_lease_over_at_once() {
    let fake = FakeApiServer::new();
    let mut a = Elector::new(fake.client(), NS, LEASE, "a".into());
    let mut b = Elector::new(fake.client(), NS, LEASE, "b".into());
    let r = a
        .lead(tokio::time::sleep(Duration::from_secs(1)), async { 5 })
        .await;
    assert!(matches!(r, Led::Done(5)), "{r:?}");
    assert_eq!(holder(&fake).await, None, "given up on the way out");
    assert!(a.fence().check().is_err());
    let start = Instant::now();
    b.acquire().await;
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "no wait for a released lease"
    );
}
