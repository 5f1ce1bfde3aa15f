//! The device plugin's API-server side against the fake API server of
//! `fgpu_plumbing::testing` (a tower service behind a real `kube::Client`): the Node
//! inventory annotation is patched only when it changed, and the pods of the node are read
//! with their bind time.

use fgpu_kubelet_plugin::device_plugin::node::NodeAnnotationWriter;
use fgpu_kubelet_plugin::device_plugin::pods::{KubePodSource, PodSource as _};
use fgpu_plumbing::testing::FakeApiServer;
use serde_json::json;

const ANN: &str = "gpu.fgpu.dev/node-gpus";

const NODE: &str = "/api/v1/nodes/node-a";

fn setup() -> (FakeApiServer, kube::Client) {
    let fake = FakeApiServer::new();
    {
        let mut f = fake.lock().unwrap();
        f.insert(
            NODE,
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": "node-a", "annotations": {"other": "x"}}}),
        );
        f.insert(
            "/api/v1/namespaces/ml/pods/p",
            json!({"metadata": {"name": "p", "namespace": "ml", "uid": "u1",
                                "creationTimestamp": "2026-11-29T10:00:00Z",
                                "annotations": {"gpu.fgpu.dev/assigned-devices": "{}"}},
                   "spec": {"nodeName": "node-a", "containers": []},
                   "status": {"phase": "Pending", "conditions": [
                       {"type": "PodScheduled", "status": "True",
                        "lastTransitionTime": "2026-11-29T10:00:07Z"}]}}),
        );
    }
    let c = fake.client();
    (fake, c)
}

fn writes(fake: &FakeApiServer) -> usize {
    fake.lock()
        .unwrap()
        .requests
        .iter()
        .filter(|l| l.starts_with("PATCH"))
        .count()
}

fn requests(fake: &FakeApiServer) -> usize {
    fake.lock().unwrap().requests.len()
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
        assert_eq!(f.objects[NODE]["metadata"]["annotations"][ANN], v1);
        assert_eq!(f.objects[NODE]["metadata"]["annotations"]["other"], "x");
    }
    // Same value: no request at all; verified: a GET, no PATCH.
    let n = requests(&fake);
    assert!(!w.publish(v1, false).await.unwrap());
    assert_eq!(requests(&fake), n);
    assert!(!w.publish(v1, true).await.unwrap());
    assert_eq!((requests(&fake), writes(&fake)), (n + 1, 1));
    // Changed on the Node by someone else: the verified publish restores it.
    fake.lock().unwrap().objects.get_mut(NODE).unwrap()["metadata"]["annotations"][ANN] =
        json!("[]");
    assert!(w.publish(v1, true).await.unwrap());
    assert_eq!(writes(&fake), 2);
    // A new value is written.
    let v2 = v1.replace("true", "false");
    assert!(w.publish(&v2, false).await.unwrap());
    assert_eq!(
        fake.lock().unwrap().objects[NODE]["metadata"]["annotations"][ANN],
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
    let log = fake.lock().unwrap().requests.clone();
    assert!(
        log[0].contains("fieldSelector=spec.nodeName%3Dnode-a"),
        "{log:?}"
    );
}
