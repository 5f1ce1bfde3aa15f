//! One Event writer for every daemon (`events.k8s.io/v1`).
//!
//! [`event`] builds the object (pure: the tests check it without a server), [`publish`]
//! creates it, and an [`Outbox`] creates them in the background, so that a daemon's own
//! work (the controller's allocation writes) never waits for its Events. Events are created directly rather than through kube-rs's `Recorder`, which
//! keeps every Event it published for six minutes to count repeats (10,000 Events at
//! 10,000 claims in the controller) and scans them on every publish; a daemon that must
//! not repeat itself remembers what it said (the controller does).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

/// Longest note the API server accepts (`events.k8s.io/v1`: 1 kB).
pub const MAX_NOTE: usize = 1000;

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// Who reports: `reportingController` (e.g. `gpu.fgpu.dev/controller`) and
/// `reportingInstance` (the pod or node name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reporter {
    pub controller: String,
    pub instance: String,
}

/// The object an Event is about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Regarding {
    /// `v1`, `resource.k8s.io/v1`, ...
    pub api_version: String,
    pub kind: String,
    /// Empty for a cluster-scoped object (a Node): its Events go to `default`.
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Regarding {
    /// The object as an Event names it (`regarding`, `related`).
    pub fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(self.api_version.clone()),
            kind: Some(self.kind.clone()),
            name: Some(self.name.clone()),
            namespace: (!self.namespace.is_empty()).then(|| self.namespace.clone()),
            uid: (!self.uid.is_empty()).then(|| self.uid.clone()),
            ..Default::default()
        }
    }

    /// The namespace the Event is created in.
    pub fn event_namespace(&self) -> &str {
        if self.namespace.is_empty() {
            "default"
        } else {
            &self.namespace
        }
    }
}

/// What one Event says.
#[derive(Clone, Copy, Debug)]
pub struct Said<'a> {
    pub type_: EventType,
    /// CamelCase, e.g. `AllocationFailed`.
    pub reason: &'a str,
    /// What the reporter was doing, e.g. `Allocate`.
    pub action: &'a str,
    /// The message (cut to [`MAX_NOTE`] characters).
    pub note: &'a str,
}

/// The name of an Event about the object `name` created at `nanos` (Unix time): the
/// object's name, a dot, the time in hex — the convention of client-go's recorders, unique
/// as one process tells one object at a time. (A `generateName` of `name.` is refused: it
/// must itself be a DNS subdomain.) Long names are cut to keep the whole within 253.
pub fn event_name(name: &str, nanos: i128) -> String {
    let stamp = format!("{:x}", nanos.max(0));
    let room = 253 - 1 - stamp.len();
    let mut base: String = name.chars().take(room).collect();
    while base.ends_with(['.', '-']) {
        base.pop();
    }
    format!("{base}.{stamp}")
}

/// The Event `reporter` publishes about `regarding` at `now`.
pub fn event(reporter: &Reporter, regarding: &Regarding, said: Said<'_>, now: Timestamp) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(&regarding.name, now.as_nanosecond())),
            namespace: Some(regarding.event_namespace().to_owned()),
            ..Default::default()
        },
        event_time: Some(MicroTime(now)),
        type_: Some(said.type_.as_str().into()),
        reason: Some(said.reason.to_owned()),
        action: Some(said.action.to_owned()),
        note: Some(said.note.chars().take(MAX_NOTE).collect()),
        regarding: Some(regarding.reference()),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(reporter.instance.clone()),
        ..Default::default()
    }
}

/// Creates `event` in its namespace.
pub async fn publish(client: &kube::Client, event: &Event) -> Result<(), kube::Error> {
    let ns = event.metadata.namespace.as_deref().unwrap_or("default");
    Api::<Event>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), event)
        .await
        .map(|_| ())
}

/// Events waiting to be created, by a background task with a bound on the requests in
/// flight. Events are best effort: when the queue is full (the API server slower than what
/// the daemon tells), [`Outbox::send`] drops the Event and counts it rather than making the
/// caller wait. Dropping the last `Outbox` (and its clones) lets the task finish what is
/// queued and end.
#[derive(Clone, Debug)]
pub struct Outbox {
    queue: tokio::sync::mpsc::Sender<Event>,
    dropped: Arc<AtomicU64>,
}

impl Outbox {
    /// Starts the task that creates the queued Events through `client`, at most
    /// `in_flight` at once, and holds up to `capacity` waiting (each at least 1). Must be
    /// called within a tokio runtime.
    pub fn spawn(client: kube::Client, capacity: usize, in_flight: usize) -> Self {
        let (queue, mut waiting) = tokio::sync::mpsc::channel::<Event>(capacity.max(1));
        let in_flight = in_flight.max(1);
        tokio::spawn(async move {
            let mut running = tokio::task::JoinSet::new();
            while let Some(event) = waiting.recv().await {
                while running.len() >= in_flight {
                    running.join_next().await;
                }
                let client = client.clone();
                running.spawn(async move {
                    if let Err(e) = publish(&client, &event).await {
                        let regarding = event.regarding.as_ref();
                        tracing::warn!(
                            kind = regarding.and_then(|r| r.kind.as_deref()).unwrap_or(""),
                            name = regarding.and_then(|r| r.name.as_deref()).unwrap_or(""),
                            reason = event.reason.as_deref().unwrap_or(""),
                            "event not published: {e}"
                        );
                    }
                });
            }
            while running.join_next().await.is_some() {}
        });
        Self {
            queue,
            dropped: Arc::default(),
        }
    }

    /// Queues `event`; false (and counted in [`Outbox::dropped`]) when the queue is full or
    /// the task has ended.
    pub fn send(&self, event: Event) -> bool {
        let queued = self.queue.try_send(event).is_ok();
        if !queued {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    /// Events dropped so far because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_dns_subdomains() {
        let valid = |n: &str| {
            n.len() <= 253
                && n.split('.').all(|l| {
                    !l.is_empty()
                        && l.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
        };
        let n = event_name("quota-4g-gpu-vmc7t", 1_796_012_289_102_421_433);
        assert_eq!(n, "quota-4g-gpu-vmc7t.18ecb7a9482f9db9");
        assert!(valid(&n), "{n}");
        let long = "a".repeat(250);
        let n = event_name(&long, 1);
        assert!(n.len() <= 253 && valid(&n), "{n}");
        // Cut where a dash or dot would end the name's part.
        let n = event_name(&format!("{}-b", "a".repeat(250)), 1);
        assert!(valid(&n), "{n}");
    }

    #[test]
    fn a_node_event_goes_to_default_and_notes_are_cut() {
        let reporter = Reporter {
            controller: "gpu.fgpu.dev/kubelet-plugin".into(),
            instance: "node-a".into(),
        };
        let node = Regarding {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "node-a".into(),
            uid: "u-1".into(),
            ..Default::default()
        };
        let long = "x".repeat(MAX_NOTE + 10);
        let said = Said {
            type_: EventType::Warning,
            reason: "CheckpointCorrupted",
            action: "Start",
            note: &long,
        };
        let e = event(
            &reporter,
            &node,
            said,
            Timestamp::from_second(1_800_000_000).unwrap(),
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.note.as_ref().map(|n| n.len()), Some(MAX_NOTE));
        let r = e.regarding.unwrap();
        assert_eq!((r.kind.as_deref(), r.namespace), (Some("Node"), None));
        assert_eq!(e.reporting_instance.as_deref(), Some("node-a"));
        assert!(e.metadata.name.unwrap().starts_with("node-a."));
    }

    #[cfg(feature = "testing")]
    fn said_event(name: &str) -> Event {
        let reporter = Reporter {
            controller: "fgpu-controller".into(),
            instance: "test".into(),
        };
        let pod = Regarding {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        };
        let said = Said {
            type_: EventType::Normal,
            reason: "GpuAllocated",
            action: "Allocate",
            note: "placed",
        };
        event(&reporter, &pod, said, Timestamp::now())
    }

    #[cfg(feature = "testing")]
    fn events_stored(server: &crate::testing::FakeApiServer) -> usize {
        let state = server.lock().unwrap();
        state
            .objects
            .keys()
            .filter(|path| path.starts_with("/apis/events.k8s.io/v1/namespaces/ns/events/"))
            .count()
    }

    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn the_outbox_creates_every_queued_event() {
        let server = crate::testing::FakeApiServer::new().group("events.k8s.io", &["v1"]);
        let outbox = Outbox::spawn(server.client(), 64, 4);
        for i in 0..20 {
            assert!(outbox.send(said_event(&format!("pod-{i}"))));
        }
        for _ in 0..500 {
            if events_stored(&server) == 20 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(events_stored(&server), 20);
        assert_eq!(outbox.dropped(), 0);
    }

    #[cfg(feature = "testing")]
    #[tokio::test]
    async fn a_hung_api_server_fills_the_outbox_and_the_rest_is_dropped_not_awaited() {
        let server = crate::testing::FakeApiServer::new().group("events.k8s.io", &["v1"]);
        let (client, cut) = server.cuttable_client();
        cut.cut();
        let outbox = Outbox::spawn(client, 8, 2);
        // Two hang in flight, the task holds a third while it waits for a slot, eight wait
        // in the queue: what is sent beyond that is dropped at once.
        let mut queued = 0;
        for i in 0..30 {
            queued += usize::from(outbox.send(said_event(&format!("pod-{i}"))));
            tokio::task::yield_now().await;
        }
        assert!((8..=11).contains(&queued), "queued {queued}");
        assert_eq!(outbox.dropped(), 30 - queued as u64);
        assert_eq!(events_stored(&server), 0);
        assert!(cut.hung() <= 2, "in flight {}", cut.hung());
    }
}
