//! One Event writer for every daemon (`events.k8s.io/v1`).
//!
//! [`event`] builds the object (pure: the tests check it without a server), [`publish`]
//! creates it. Events are created directly rather than through kube-rs's `Recorder`, which
//! keeps every Event it published for six minutes to count repeats (20,000 Events at
//! 10,000 claims in the controller) and scans them on every publish; a daemon that must
//! not repeat itself remembers what it said (the controller does).

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
        regarding: Some(ObjectReference {
            api_version: Some(regarding.api_version.clone()),
            kind: Some(regarding.kind.clone()),
            name: Some(regarding.name.clone()),
            namespace: (!regarding.namespace.is_empty()).then(|| regarding.namespace.clone()),
            uid: (!regarding.uid.is_empty()).then(|| regarding.uid.clone()),
            ..Default::default()
        }),
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
}
