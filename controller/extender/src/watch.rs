//! Wakes the extender's resync as soon as GPU capacity changes, instead of at the next
//! period: a pod holding a decision is deleted or has finished, or a node's inventory
//! annotation changes.
//!
//! Why: kube-scheduler retries a pod the extender turned away when the cluster changes (a
//! pod deleted, a node updated) — at once, and then not again for up to five minutes
//! unless something else changes. If the extender's ledger still holds the deleted pod's
//! grant at that moment (up to `--resync-seconds` old), the retry fails and the pod waits
//! although the GPU is free. Found on a real cluster by `tests/e2e/52-legacy-burst`.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;

/// Whether `pod` (as a watch delivered it; `deleted` for a delete event) gives GPU capacity
/// back: it carries the decision annotation `ann` and is deleted, being deleted, or finished.
pub fn pod_frees_capacity(pod: &Pod, ann: &str, deleted: bool) -> bool {
    let has = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ann));
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    has && (deleted || finished || pod.metadata.deletion_timestamp.is_some())
}

/// Records `node`'s inventory annotation `ann` in `seen`; true when it changed (appeared,
/// changed or went away) since the last call.
pub fn inventory_changed(
    seen: &mut HashMap<String, Option<String>>,
    node: &Node,
    ann: &str,
    deleted: bool,
) -> bool {
    let name = node.metadata.name.clone().unwrap_or_default();
    let value = if deleted {
        None
    } else {
        node.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ann).cloned())
    };
    let before = seen.insert(name, value.clone()).flatten();
    before != value
}

/// The UID and decision of a pod that is gone for good (deleted, or finished): its grants
/// can be given back at once. `None` for a pod still running (being deleted gracefully
/// included) or without a decision.
pub fn gone_with_decision<'a>(
    pod: &'a Pod,
    ann: &str,
    deleted: bool,
) -> Option<(&'a str, &'a str)> {
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    if !(deleted || finished) {
        return None;
    }
    let uid = pod.metadata.uid.as_deref()?;
    let decision = pod.metadata.annotations.as_ref()?.get(ann)?;
    Some((uid, decision.as_str()))
}

/// Watches pods and nodes and calls `wake.notify_one()` on every change that gives back or
/// adds GPU capacity (the initial listing counts as none). A pod with a decision that is
/// deleted or finished has its grants released in `ext` at once, before the resync: both
/// kube-scheduler and this watch see the deletion at about the same moment, and the
/// scheduler's immediate retry of a pending pod must find the capacity free. Runs until the
/// task is dropped; watch errors are retried with kube-rs's default backoff.
pub async fn wake_on_changes(
    client: kube::Client,
    ext: Arc<crate::Extender>,
    pod_ann: String,
    node_ann: String,
    wake: Arc<Notify>,
) {
    let pods = watcher::watcher(Api::<Pod>::all(client.clone()), watcher::Config::default());
    let nodes = watcher::watcher(Api::<Node>::all(client), watcher::Config::default());
    let pod_wake = wake.clone();
    let pods = async move {
        let mut s = std::pin::pin!(kube::runtime::WatchStreamExt::default_backoff(pods));
        while let Some(ev) = s.next().await {
            let (p, deleted) = match ev {
                Ok(Event::Apply(p)) => (p, false),
                Ok(Event::Delete(p)) => (p, true),
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!("pod watch: {e}");
                    continue;
                }
            };
            if let Some((uid, decision)) = gone_with_decision(&p, &pod_ann, deleted) {
                ext.release_gone_pod(uid, decision);
            }
            if pod_frees_capacity(&p, &pod_ann, deleted) {
                pod_wake.notify_one();
            }
        }
    };
    let nodes = async move {
        let mut seen = HashMap::new();
        let mut s = std::pin::pin!(kube::runtime::WatchStreamExt::default_backoff(nodes));
        while let Some(ev) = s.next().await {
            let changed = match &ev {
                Ok(Event::Apply(n)) => inventory_changed(&mut seen, n, &node_ann, false),
                Ok(Event::Delete(n)) => inventory_changed(&mut seen, n, &node_ann, true),
                // The initial listing only fills `seen`.
                Ok(Event::InitApply(n)) => {
                    inventory_changed(&mut seen, n, &node_ann, false);
                    false
                }
                Ok(_) => false,
                Err(e) => {
                    tracing::debug!("node watch: {e}");
                    false
                }
            };
            if changed {
                wake.notify_one();
            }
        }
    };
    tokio::join!(pods, nodes);
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANN: &str = "gpu.fgpu.dev/assigned-devices";

    fn pod(ann: bool, phase: &str) -> Pod {
        let mut p = Pod::default();
        if ann {
            p.metadata.annotations = Some([(ANN.to_owned(), "{}".to_owned())].into());
        }
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn pods_that_give_capacity_back() {
        assert!(pod_frees_capacity(&pod(true, "Running"), ANN, true));
        assert!(pod_frees_capacity(&pod(true, "Succeeded"), ANN, false));
        assert!(pod_frees_capacity(&pod(true, "Failed"), ANN, false));
        let mut deleting = pod(true, "Running");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(pod_frees_capacity(&deleting, ANN, false));
        assert!(!pod_frees_capacity(&pod(true, "Running"), ANN, false));
        assert!(!pod_frees_capacity(&pod(false, "Succeeded"), ANN, true));
    }

    #[test]
    fn gone_pods_with_a_decision() {
        let mut p = pod(true, "Running");
        p.metadata.uid = Some("u1".into());
        assert_eq!(gone_with_decision(&p, ANN, true), Some(("u1", "{}")));
        assert_eq!(gone_with_decision(&p, ANN, false), None, "still running");
        let mut done = pod(true, "Succeeded");
        done.metadata.uid = Some("u2".into());
        assert_eq!(gone_with_decision(&done, ANN, false), Some(("u2", "{}")));
        let mut plain = pod(false, "Failed");
        plain.metadata.uid = Some("u3".into());
        assert_eq!(gone_with_decision(&plain, ANN, true), None, "no decision");
    }

    #[test]
    fn inventory_changes() {
        let node = |v: Option<&str>| {
            let mut n = Node::default();
            n.metadata.name = Some("n1".into());
            n.metadata.annotations = v.map(|v| [("inv".to_owned(), v.to_owned())].into());
            n
        };
        let mut seen = HashMap::new();
        assert!(inventory_changed(
            &mut seen,
            &node(Some("[1]")),
            "inv",
            false
        ));
        assert!(
            !inventory_changed(&mut seen, &node(Some("[1]")), "inv", false),
            "status-only update"
        );
        assert!(inventory_changed(
            &mut seen,
            &node(Some("[2]")),
            "inv",
            false
        ));
        assert!(inventory_changed(&mut seen, &node(None), "inv", false));
        assert!(!inventory_changed(&mut seen, &node(None), "inv", false));
        assert!(
            !inventory_changed(&mut seen, &node(None), "inv", true),
            "a node without GPUs went away"
        );
        assert!(inventory_changed(
            &mut seen,
            &node(Some("[2]")),
            "inv",
            false
        ));
        assert!(inventory_changed(
            &mut seen,
            &node(Some("[2]")),
            "inv",
            true
        ));
    }
}
