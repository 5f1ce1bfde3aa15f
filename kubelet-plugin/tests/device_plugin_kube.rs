//! The device plugin's API-server side against an in-memory stand-in (a tower service
//! behind a real `kube::Client`): the Node inventory annotation is patched only when it
//! changed, and the pods of the node are read with their bind time.

use std::sync::{Arc, Mutex};

use fgpu_kubelet_plugin::device_plugin::node::NodeAnnotationWriter;
use fgpu_kubelet_plugin::device_plugin::pods::{KubePodSource, PodSource as _};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use kube::client::Body;
use serde_json::{Value, json};

const ANN: &str = "gpu.fgpu.dev/node-gpus";

struct Fake {
    node: Value,
    pods: Value,
    /// `METHOD path?query` of every request.
    log: Vec<String>,
}

impl Fake {
    fn handle(&mut self, method: &Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        match (method.clone(), path) {
            (Method::GET, "/api/v1/nodes/node-a") => (StatusCode::OK, self.node.clone()),
            (Method::PATCH, "/api/v1/nodes/node-a") => {
                let patch = body.unwrap();
                let anns = patch["metadata"]["annotations"].as_object().unwrap();
                let meta = self.node["metadata"].as_object_mut().unwrap();
                let current = meta.entry("annotations").or_insert_with(|| json!({}));
                for (k, v) in anns {
                    current[k] = v.clone();
                }
                (StatusCode::OK, self.node.clone())
            }
            (Method::GET, "/api/v1/pods") => (StatusCode::OK, self.pods.clone()),
            _ => panic!("unexpected {method} {path}"),
        }
    }
}

fn client(fake: Arc<Mutex<Fake>>) -> kube::Client {
    let service = tower::service_fn(move |req: Request<Body>| {
        let fake = fake.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await.unwrap().to_bytes();
            let body = (!bytes.is_empty()).then(|| serde_json::from_slice(&bytes).unwrap());
            let mut f = fake.lock().unwrap();
            f.log.push(format!("{} {}", parts.method, parts.uri));
            let (status, value) = f.handle(&parts.method, parts.uri.path(), body);
            let resp = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&value).unwrap()))
                .unwrap();
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    kube::Client::new(service, "default")
}

fn setup() -> (Arc<Mutex<Fake>>, kube::Client) {
    let fake = Arc::new(Mutex::new(Fake {
        node: json!({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": "node-a", "annotations": {"other": "x"}}}),
        pods: json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
            {"metadata": {"name": "p", "namespace": "ml", "uid": "u1",
                          "creationTimestamp": "2026-11-29T10:00:00Z",
                          "annotations": {"gpu.fgpu.dev/assigned-devices": "{}"}},
             "spec": {"nodeName": "node-a", "containers": []},
             "status": {"phase": "Pending", "conditions": [
                 {"type": "PodScheduled", "status": "True",
                  "lastTransitionTime": "2026-11-29T10:00:07Z"}]}}
        ]}),
        log: vec![],
    }));
    let c = client(fake.clone());
    (fake, c)
}

fn writes(fake: &Mutex<Fake>) -> usize {
    fake.lock()
        .unwrap()
        .log
        .iter()
        .filter(|l| l.starts_with("PATCH"))
        .count()
}

fn requests(fake: &Mutex<Fake>) -> usize {
    fake.lock().unwrap().log.len()
}

#[tokio::test]
async fn node_annotation_is_patched_only_on_change() {
    let (fake, c) = setup();
    let mut w = NodeAnnotationWriter::new(c, "node-a", ANN);
    let v1 =
        r#"[{"id":"gpu-0","uuid":"GPU-a","model":"m","memoryBytes":1,"cores":100,"healthy":true}]"#;
    assert!(w.publish(v1, false).await.unwrap());
    assert_eq!(writes(&fake), 1);
    {
        let f = fake.lock().unwrap();
        assert_eq!(f.node["metadata"]["annotations"][ANN], v1);
        assert_eq!(f.node["metadata"]["annotations"]["other"], "x");
    }
    // Same value: no request at all; verified: a GET, no PATCH.
    let n = requests(&fake);
    assert!(!w.publish(v1, false).await.unwrap());
    assert_eq!(requests(&fake), n);
    assert!(!w.publish(v1, true).await.unwrap());
    assert_eq!((requests(&fake), writes(&fake)), (n + 1, 1));
    // Changed on the Node by someone else: the verified publish restores it.
    fake.lock().unwrap().node["metadata"]["annotations"][ANN] = json!("[]");
    assert!(w.publish(v1, true).await.unwrap());
    assert_eq!(writes(&fake), 2);
    // A new value is written.
    let v2 = v1.replace("true", "false");
    assert!(w.publish(&v2, false).await.unwrap());
    assert_eq!(
        fake.lock().unwrap().node["metadata"]["annotations"][ANN],
        v2
    );
}

#[tokio::test]
async fn pods_of_the_node_with_bind_time() {
    let (fake, c) = setup();
    let pods = KubePodSource::new(c).pods_on_node("node-a").await.unwrap();
    assert_eq!(pods.len(), 1);
    let p = &pods[0];
    assert_eq!(p.key(), "ml/p");
    assert_eq!(p.uid, "u1");
    assert_eq!(p.node_name, "node-a");
    assert_eq!(p.phase, "Pending");
    assert_eq!(p.bound.unwrap() - p.created, 7);
    assert!(!p.deleting);
    assert_eq!(p.annotations["gpu.fgpu.dev/assigned-devices"], "{}");
    let log = fake.lock().unwrap().log.clone();
    assert!(
        log[0].contains("fieldSelector=spec.nodeName%3Dnode-a"),
        "{log:?}"
    );
}
