//! The fake through a real `kube::Client`: each verb, its errors, watches and hooks.

use std::pin::pin;

use http::{Method, StatusCode};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

use super::{Answer, FakeApiServer};

const CM: &str = "/api/v1/namespaces/ns/configmaps/a";

fn config_map(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}))
    .unwrap()
}

/// The `Status` of a failed call: its code and reason.
fn failure<T: std::fmt::Debug>(r: kube::Result<T>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason),
        other => panic!("want an API error, got {other:?}"),
    }
}

fn rv(cm: &ConfigMap) -> String {
    cm.metadata.resource_version.clone().unwrap()
}

#[tokio::test]
async fn create_then_get_and_already_exists() {
    let fake = FakeApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let created = cms
        .create(&PostParams::default(), &config_map("a", json!({})))
        .await
        .unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(rv(&created), "1");
    assert!(created.metadata.uid.is_some());
    let got = cms.get("a").await.unwrap();
    assert_eq!(got, created);
    assert_eq!(
        failure(
            cms.create(&PostParams::default(), &config_map("a", json!({})))
                .await
        ),
        (409, "AlreadyExists".into())
    );
    assert_eq!(failure(cms.get("b").await), (404, "NotFound".into()));
    assert_eq!(cms.get_opt("b").await.unwrap(), None);

    let s = fake.lock().unwrap();
    assert_eq!(s.writes, [format!("create {CM}")]);
    assert_eq!(s.objects[CM]["data"]["k"], "v");
    assert_eq!(s.resource_version(), 1);
    assert!(s.requests[0].starts_with("POST /api/v1/namespaces/ns/configmaps"));
}

#[tokio::test]
async fn generate_name_gives_distinct_names() {
    let fake = FakeApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let mut cm = config_map("", json!({}));
    cm.metadata.name = None;
    cm.metadata.generate_name = Some("x-".into());
    let a = cms.create(&PostParams::default(), &cm).await.unwrap();
    let b = cms.create(&PostParams::default(), &cm).await.unwrap();
    let (a, b) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(a.starts_with("x-") && a.len() == 7, "{a}");
    assert_ne!(a, b);
    cm.metadata.generate_name = None;
    assert_eq!(
        failure(cms.create(&PostParams::default(), &cm).await),
        (422, "Invalid".into())
    );
}

#[tokio::test]
async fn replace_conflicts_on_a_stale_resource_version() {
    let fake = FakeApiServer::new();
    fake.lock().unwrap().insert(CM, json!({"data": {"k": "1"}}));
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let old = cms.get("a").await.unwrap();
    let mut new = old.clone();
    new.data = Some([("k".to_owned(), "2".to_owned())].into());
    let stored = cms
        .replace("a", &PostParams::default(), &new)
        .await
        .unwrap();
    assert_ne!(rv(&stored), rv(&old));
    assert_eq!(stored.metadata.uid, old.metadata.uid);
    // The old resourceVersion again: someone changed it since.
    assert_eq!(
        failure(cms.replace("a", &PostParams::default(), &new).await),
        (409, "Conflict".into())
    );
    // None: unconditional.
    new.metadata.resource_version = None;
    cms.replace("a", &PostParams::default(), &new)
        .await
        .unwrap();
    assert_eq!(
        failure(
            cms.replace("b", &PostParams::default(), &config_map("b", json!({})))
                .await
        ),
        (404, "NotFound".into())
    );
    assert_eq!(
        fake.lock().unwrap().writes,
        [format!("replace {CM}"), format!("replace {CM}")]
    );
}

#[tokio::test]
async fn merge_json_and_strategic_patches() {
    let fake = FakeApiServer::new();
    fake.lock()
        .unwrap()
        .insert(CM, json!({"metadata": {"labels": {"a": "1", "b": "2"}}}));
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let pp = PatchParams::default();
    let merged = cms
        .patch(
            "a",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"b": null, "c": "3"}}})),
        )
        .await
        .unwrap();
    let labels = merged.metadata.labels.clone().unwrap();
    assert_eq!(
        labels.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a", "c"]
    );
    // JSON patch (kube's `Patch::Json` needs its `jsonpatch` feature): a raw request.
    let json_patch = |ops: Value| {
        http::Request::patch(CM)
            .header("content-type", "application/json-patch+json")
            .body(serde_json::to_vec(&ops).unwrap())
            .unwrap()
    };
    let client = fake.client();
    let patched: ConfigMap = client
        .request(json_patch(json!([
            {"op": "test", "path": "/metadata/labels/a", "value": "1"},
            {"op": "add", "path": "/data", "value": {"x": "y"}}])))
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["x"], "y");
    assert_eq!(
        failure(
            client
                .request::<ConfigMap>(json_patch(json!([
                    {"op": "test", "path": "/metadata/labels/a", "value": "9"}])))
                .await
        ),
        (422, "Invalid".into())
    );
    let strategic = cms
        .patch("a", &pp, &Patch::Strategic(json!({"data": {"z": "1"}})))
        .await
        .unwrap();
    assert_eq!(strategic.data.unwrap().len(), 2);
    // A stale resourceVersion in the patch is a precondition that fails.
    assert_eq!(
        failure(
            cms.patch(
                "a",
                &pp,
                &Patch::Merge(json!({"metadata": {"resourceVersion": rv(&merged)}}))
            )
            .await
        ),
        (409, "Conflict".into())
    );
    assert_eq!(
        failure(cms.patch("b", &pp, &Patch::Merge(json!({}))).await),
        (404, "NotFound".into())
    );
    // Apply creates what is not there.
    let applied = cms
        .patch(
            "b",
            &PatchParams::apply("test"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"n": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(applied.metadata.name.as_deref(), Some("b"));
    assert_eq!(
        fake.lock().unwrap().writes,
        [
            format!("patch {CM}"),
            format!("patch {CM}"),
            format!("patch {CM}"),
            "patch /api/v1/namespaces/ns/configmaps/b".into(),
        ]
    );
}

#[tokio::test]
async fn lists_by_namespace_selectors_and_pages() {
    let fake = FakeApiServer::new();
    {
        let mut s = fake.lock().unwrap();
        for (path, app) in [
            ("/api/v1/namespaces/ns/configmaps/a", "x"),
            ("/api/v1/namespaces/ns/configmaps/b", "y"),
            ("/api/v1/namespaces/other/configmaps/c", "x"),
        ] {
            s.insert(
                path,
                json!({"kind": "ConfigMap", "metadata": {"labels": {"app": app}}}),
            );
        }
        s.insert("/api/v1/namespaces/ns/secrets/a", json!({}));
    }
    let names = |l: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|c| c.metadata.name.unwrap())
            .collect()
    };
    let all: Api<ConfigMap> = Api::all(fake.client());
    let ns: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let list = all.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.metadata.resource_version.as_deref(), Some("4"));
    assert_eq!(list.types.kind, "ConfigMapList");
    assert_eq!(names(list), ["a", "b", "c"]);
    assert_eq!(
        names(ns.list(&ListParams::default()).await.unwrap()),
        ["a", "b"]
    );
    assert_eq!(
        names(
            all.list(&ListParams::default().labels("app=x"))
                .await
                .unwrap()
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(
            all.list(&ListParams::default().fields("metadata.namespace!=ns"))
                .await
                .unwrap()
        ),
        ["c"]
    );
    let first = all.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.clone().unwrap();
    assert_eq!(names(first), ["a", "b"]);
    let rest = all
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.metadata.continue_, None);
    assert_eq!(names(rest), ["c"]);
    assert_eq!(
        failure(all.list(&ListParams::default().labels("a in b")).await),
        (400, "BadRequest".into())
    );
}

#[tokio::test]
async fn delete_with_preconditions_and_by_collection() {
    let fake = FakeApiServer::new();
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    for (name, app) in [("a", "x"), ("b", "x"), ("c", "y")] {
        cms.create(
            &PostParams::default(),
            &config_map(name, json!({"app": app})),
        )
        .await
        .unwrap();
    }
    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some("0".into()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        failure(cms.delete("a", &stale).await),
        (409, "Conflict".into())
    );
    let deleted = cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(deleted.left().unwrap().metadata.name.as_deref(), Some("a"));
    assert_eq!(cms.get_opt("a").await.unwrap(), None);
    assert_eq!(
        failure(cms.delete("a", &DeleteParams::default()).await),
        (404, "NotFound".into())
    );
    let gone = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app=x"),
        )
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(gone.items.len(), 1);
    let s = fake.lock().unwrap();
    assert_eq!(
        s.objects.keys().collect::<Vec<_>>(),
        ["/api/v1/namespaces/ns/configmaps/c"]
    );
    assert_eq!(
        s.writes[3..],
        [
            "delete /api/v1/namespaces/ns/configmaps/a",
            "delete /api/v1/namespaces/ns/configmaps/b"
        ]
    );
}

#[tokio::test]
async fn the_status_subresource_changes_only_status() {
    let fake = FakeApiServer::new();
    fake.lock().unwrap().insert(
        "/api/v1/nodes/n",
        json!({"metadata": {"labels": {"a": "1"}}, "status": {"phase": "Pending"}}),
    );
    let nodes: Api<Node> = Api::all(fake.client());
    let patched = nodes
        .patch_status(
            "n",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"a": "2"}}, "status": {"phase": "Running"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["a"], "1");
    assert_eq!(
        patched.status.clone().unwrap().phase.as_deref(),
        Some("Running")
    );
    let mut sent = nodes.get_status("n").await.unwrap();
    sent.status = None;
    sent.metadata.labels = None;
    let replaced = nodes
        .replace_status("n", &PostParams::default(), &sent)
        .await
        .unwrap();
    assert_eq!(replaced.status, None);
    assert!(replaced.metadata.labels.is_some());
    assert_eq!(
        fake.lock().unwrap().writes,
        [
            "patch /api/v1/nodes/n/status",
            "replace /api/v1/nodes/n/status"
        ]
    );
}

#[tokio::test]
async fn watches_see_later_writes_and_replay_from_a_resource_version() {
    let fake = FakeApiServer::new();
    fake.lock().unwrap().insert(CM, json!({}));
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let mut from_now = pin!(cms.watch(&WatchParams::default(), "0").await.unwrap());
    let pp = PostParams::default();
    cms.create(&pp, &config_map("b", json!({"app": "x"})))
        .await
        .unwrap();
    cms.patch(
        "b",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "y"}}})),
    )
    .await
    .unwrap();
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    // Another namespace: not in this watch.
    fake.lock()
        .unwrap()
        .insert("/api/v1/namespaces/other/configmaps/a", json!({}));
    let mut seen = vec![];
    for _ in 0..4 {
        seen.push(match from_now.next().await.unwrap().unwrap() {
            WatchEvent::Added(c) => format!("ADDED {}", c.metadata.name.unwrap()),
            WatchEvent::Modified(c) => format!("MODIFIED {}", c.metadata.name.unwrap()),
            WatchEvent::Deleted(c) => format!("DELETED {}", c.metadata.name.unwrap()),
            other => panic!("{other:?}"),
        });
    }
    assert_eq!(seen, ["ADDED a", "ADDED b", "MODIFIED b", "DELETED b"]);

    // From resourceVersion 2 (b created) on, with a label selector: b leaves the selection
    // when its label changes.
    let wp = WatchParams::default().labels("app=x");
    let mut replay = pin!(cms.watch(&wp, "1").await.unwrap());
    let mut kinds = vec![];
    for _ in 0..2 {
        kinds.push(match replay.next().await.unwrap().unwrap() {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Deleted(_) => "DELETED",
            other => panic!("{other:?}"),
        });
    }
    assert_eq!(kinds, ["ADDED", "DELETED"]);
    assert_eq!(fake.lock().unwrap().watches, 2);
    // Still open: nothing more, no end.
    let more = tokio::time::timeout(std::time::Duration::from_millis(50), replay.next()).await;
    assert!(more.is_err(), "{more:?}");
}

#[tokio::test]
async fn discovery_serves_the_configured_groups() {
    let fake = FakeApiServer::new()
        .group("resource.k8s.io", &["v1", "v1beta1"])
        .group("empty.example", &[]);
    fake.lock().unwrap().insert(
        "/apis/resource.k8s.io/v1/resourceslices/s",
        json!({"kind": "ResourceSlice"}),
    );
    let c = fake.client();
    let groups = c.list_api_groups().await.unwrap();
    assert_eq!(groups.groups.len(), 1);
    let g = &groups.groups[0];
    assert_eq!(g.name, "resource.k8s.io");
    assert_eq!(
        g.versions
            .iter()
            .map(|v| v.version.as_str())
            .collect::<Vec<_>>(),
        ["v1", "v1beta1"]
    );
    assert_eq!(g.preferred_version.as_ref().unwrap().version, "v1");
    assert_eq!(c.list_core_api_versions().await.unwrap().versions, ["v1"]);
    let resources = c
        .list_api_group_resources("resource.k8s.io/v1")
        .await
        .unwrap();
    assert_eq!(resources.resources[0].name, "resourceslices");
    assert!(!resources.resources[0].namespaced);
    assert_eq!(c.apiserver_version().await.unwrap().major, "1");
}

#[tokio::test]
async fn hooks_rewrite_writes_and_answer_instead_of_the_store() {
    let fake = FakeApiServer::new();
    {
        let mut s = fake.lock().unwrap();
        s.on_write(|key, obj| {
            if key.contains("/configmaps/") {
                obj["data"].as_object_mut().unwrap().remove("dropped");
            }
        });
        s.intercept(|req| {
            (req.method == Method::GET && req.path == "/api/v1/namespaces/ns/configmaps")
                .then(|| Answer::not_found("no lists here"))
        });
    }
    let cms: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
    let mut cm = config_map("a", json!({}));
    cm.data = Some([("dropped".to_owned(), "x".to_owned())].into());
    let stored = cms.create(&PostParams::default(), &cm).await.unwrap();
    assert_eq!(stored.data, Some(Default::default()));
    assert_eq!(
        failure(cms.list(&ListParams::default()).await),
        (404, "NotFound".into())
    );
    assert_eq!(
        failure(cms.watch(&WatchParams::default(), "0").await.map(|_| ())),
        (404, "NotFound".into())
    );
    let s = fake.lock().unwrap();
    assert_eq!(s.watches, 0);
    assert_eq!(s.requests.len(), 3);
    assert!(s.requests[1].starts_with("GET /api/v1/namespaces/ns/configmaps"));
}

#[test]
fn answers_are_kubernetes_statuses() {
    let a = Answer::status(StatusCode::CONFLICT, "Conflict", "m");
    assert_eq!(a.code, 409);
    assert_eq!(
        (
            a.body["kind"].as_str(),
            a.body["code"].as_u64(),
            a.body["status"].as_str()
        ),
        (Some("Status"), Some(409), Some("Failure"))
    );
}
