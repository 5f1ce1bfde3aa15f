//! The extender over a real TCP socket, with the JSON bodies kube-scheduler sends
//! (PascalCase, `nodeCacheCapable: true`), bad bodies included.

use std::sync::Arc;
use std::time::Instant;

use crate::support::*;
use fgpu_extender::annotations::PodAssignment;
use fgpu_extender::{Extender, ExtenderConfig, MemoryCluster};
use serde_json::{Value, json};

/// A filter body as kube-scheduler writes it for a HAMi example pod.
const FILTER: &str = r#"{
  "Pod": {
    "metadata": {
      "name": "gpu-pod", "namespace": "default", "uid": "0b6c2a9e-6a1b-4c1e-9a53-0d5c7a8e9b10",
      "creationTimestamp": null,
      "annotations": {"nvidia.com/use-gputype": "A100"}
    },
    "spec": {
      "containers": [{
        "name": "ubuntu-container", "image": "ubuntu:22.04", "command": ["bash", "-c", "sleep 86400"],
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}}
      }],
      "schedulerName": "fgpu-scheduler"
    },
    "status": {"phase": "Pending"}
  },
  "Nodes": null,
  "NodeNames": ["node-a100", "node-t4", "node-cpu"]
}"#;

const BIND: &str = r#"{"PodName":"gpu-pod","PodNamespace":"default","PodUID":"0b6c2a9e-6a1b-4c1e-9a53-0d5c7a8e9b10","Node":"node-a100"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_prioritize_bind_over_tcp() {
    let ext = Arc::new(Extender::new(ExtenderConfig::default()));
    ext.sync(
        &[
            gpu_node("node-a100", 2, "NVIDIA A100-SXM4-80GB", 80),
            gpu_node("node-t4", 1, "Tesla T4", 16),
        ],
        &[],
        Instant::now(),
    );
    let cluster = Arc::new(MemoryCluster::default());
    let pod: Value = serde_json::from_str::<Value>(FILTER).unwrap()["Pod"].clone();
    cluster.add_pod(serde_json::from_value(pod).unwrap());
    let addr = start_server(ext.clone(), cluster.clone()).await;
    let mut c = Conn::open(addr).await;

    let (status, body) = c.send("GET", "/healthz", b"").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    let (status, body) = c.post("/filter", FILTER).await;
    assert_eq!(status, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["NodeNames"], json!(["node-a100"]));
    assert_eq!(r["Nodes"], Value::Null);
    assert_eq!(r["Error"], "");
    assert!(
        r["FailedNodes"]["node-t4"]
            .as_str()
            .unwrap()
            .contains("container ubuntu-container: needs 1 GPU(s) with 3000 MiB and 30 percent of the cores free, model in [\"A100\"]"),
        "{r}"
    );
    assert!(
        r["FailedAndUnresolvableNodes"]["node-cpu"]
            .as_str()
            .unwrap()
            .contains("no GPU inventory"),
        "{r}"
    );

    // Prioritize gets the filtered names; a URL prefix path works too.
    let prio = FILTER.replace(
        r#""NodeNames": ["node-a100", "node-t4", "node-cpu"]"#,
        r#""NodeNames": ["node-a100"]"#,
    );
    let (status, body) = c.post("/fgpu/prioritize", &prio).await;
    assert_eq!(
        (status, body.as_str()),
        (200, r#"[{"Host":"node-a100","Score":10}]"#)
    );

    let (status, body) = c.post("/bind", BIND).await;
    assert_eq!((status, body.as_str()), (200, r#"{"Error":""}"#));
    assert_eq!(
        cluster.bindings(),
        [(
            "default".to_owned(),
            "gpu-pod".to_owned(),
            "node-a100".to_owned()
        )]
    );
    let stored = cluster.pods().pop().unwrap();
    let a = PodAssignment::parse("p", ASSIGNED, &stored.metadata.annotations[ASSIGNED]).unwrap();
    assert_eq!(a.node, "node-a100");
    assert_eq!(a.containers[0].name, "ubuntu-container");
    assert_eq!(a.containers[0].devices[0].memory_bytes, 3000 << 20);
    assert_eq!(a.containers[0].devices[0].cores, 30);
    assert!(
        a.containers[0].devices[0]
            .uuid
            .starts_with("GPU-node-a100-")
    );

    // A second bind of the same pod (read back from the cluster: bound already) changes
    // nothing: the running pod keeps its GPUs and its annotation.
    let (status, body) = c.post("/bind", BIND).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("is already bound to node node-a100; nothing changed"),
        "{body}"
    );
    assert_eq!(ext.node_grants("node-a100").len(), 1);
    assert!(
        cluster.pods()[0]
            .metadata
            .annotations
            .contains_key(ASSIGNED)
    );
}

#[tokio::test]
async fn bad_requests_keep_the_server_serving() {
    let ext = Arc::new(Extender::new(ExtenderConfig::default()));
    ext.sync(&[gpu_node("node-a100", 1, "A100", 80)], &[], Instant::now());
    let cluster = Arc::new(MemoryCluster::default());
    let addr = start_server(ext, cluster).await;
    let mut c = Conn::open(addr).await;

    let (status, body) = c.post("/filter", "{not json").await;
    assert_eq!(status, 400);
    assert!(
        body.starts_with("/filter: the body is not an ExtenderArgs: "),
        "{body}"
    );

    let (status, body) = c.post("/bind", r#"{"PodName": 3}"#).await;
    assert_eq!(status, 400);
    assert!(
        body.starts_with("/bind: the body is not an ExtenderBindingArgs: "),
        "{body}"
    );

    // A pod with an unknown policy: 200 with Error naming the pod and the field.
    let bad = FILTER.replace(
        r#""nvidia.com/use-gputype": "A100""#,
        r#""hami.io/node-scheduler-policy": "fastest""#,
    );
    let (status, body) = c.post("/filter", &bad).await;
    assert_eq!(status, 200);
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        r["Error"],
        "pod default/gpu-pod: metadata.annotations[\"hami.io/node-scheduler-policy\"]: \"fastest\"; valid are binpack and spread (HAMi's), gpupacking, bestfit, fgd and fragaware"
    );
    let bad_quantity = FILTER.replace(
        r#""nvidia.com/gpumem": "3000""#,
        r#""nvidia.com/gpumem": "3k5""#,
    );
    let (_, body) = c.post("/filter", &bad_quantity).await;
    let r: Value = serde_json::from_str(&body).unwrap();
    assert!(
        r["Error"].as_str().unwrap().starts_with(
            "pod default/gpu-pod: spec.containers[0].resources.limits[\"nvidia.com/gpumem\"]: "
        ),
        "{r}"
    );
    let (status, _) = c.post("/prioritize", &bad).await;
    assert_eq!(status, 400);

    // Bind of a pod the cluster does not know.
    let (status, body) = c.post("/bind", BIND).await;
    assert_eq!(status, 200);
    assert!(
        body.contains("pod default/gpu-pod: reading it for bind: pods \\\"gpu-pod\\\" not found"),
        "{body}"
    );

    let (status, _) = c.send("GET", "/filter", b"").await;
    assert_eq!(status, 405);
    let (status, _) = c.post("/preempt", "{}").await;
    assert_eq!(status, 404);

    // Still serving, on the same connection and a new one.
    let (status, _) = c.send("GET", "/healthz", b"").await;
    assert_eq!(status, 200);
    let (status, body) = Conn::open(addr).await.post("/filter", FILTER).await;
    assert_eq!(status, 200);
    assert!(body.contains(r#""NodeNames":["node-a100"]"#), "{body}");
}

/// The value of the series `line_start` (the name and labels, exactly as written) in the
/// exposition `text`; `None` when there is no such series.
fn series(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_verbs_pending_pods_and_serve_on_their_own_port() {
    let ext = Arc::new(Extender::new(ExtenderConfig::default()));
    ext.sync(
        &[
            gpu_node("node-a100", 1, "NVIDIA A100-SXM4-80GB", 80),
            gpu_node("node-t4", 1, "Tesla T4", 16),
        ],
        &[],
        Instant::now(),
    );
    let cluster = Arc::new(MemoryCluster::default());
    let pod: Value = serde_json::from_str::<Value>(FILTER).unwrap()["Pod"].clone();
    cluster.add_pod(serde_json::from_value(pod).unwrap());
    let addr = start_server(ext.clone(), cluster.clone()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = listener.local_addr().unwrap();
    tokio::spawn(fgpu_extender::http::serve_metrics(listener, ext.clone()));
    let mut c = Conn::open(addr).await;
    let mut m = Conn::open(metrics_addr).await;
    let scrape = async |m: &mut Conn| {
        let (status, body) = m.send("GET", "/metrics", b"").await;
        assert_eq!(status, 200, "{body}");
        body
    };

    let text = scrape(&mut m).await;
    assert_eq!(series(&text, "fgpu_extender_nodes"), Some(2.0), "{text}");
    assert_eq!(
        series(&text, r#"fgpu_extender_pods_pending{reason="no_fit"}"#),
        Some(0.0)
    );
    // The metrics port serves nothing of the extender's verbs (its own connection: the
    // server may close one whose body it did not read).
    let (status, _) = Conn::open(metrics_addr).await.post("/bind", BIND).await;
    assert_eq!(status, 404);
    let (status, body) = m.send("GET", "/healthz", b"").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    // Only the T4 node as candidate: the A100 pod fits nowhere and waits.
    let t4_only = FILTER.replace(
        r#""NodeNames": ["node-a100", "node-t4", "node-cpu"]"#,
        r#""NodeNames": ["node-t4"]"#,
    );
    let (status, body) = c.post("/filter", &t4_only).await;
    assert_eq!(status, 200, "{body}");
    let text = scrape(&mut m).await;
    assert_eq!(
        series(
            &text,
            r#"fgpu_extender_requests_total{verb="filter",result="no_fit"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        series(&text, r#"fgpu_extender_pods_pending{reason="no_fit"}"#),
        Some(1.0),
        "{text}"
    );
    // Only a node without inventory: waits for another reason.
    let cpu_only = FILTER.replace(
        r#""NodeNames": ["node-a100", "node-t4", "node-cpu"]"#,
        r#""NodeNames": ["node-cpu"]"#,
    );
    c.post("/filter", &cpu_only).await;
    let text = scrape(&mut m).await;
    assert_eq!(
        series(&text, r#"fgpu_extender_pods_pending{reason="no_fit"}"#),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        series(&text, r#"fgpu_extender_pods_pending{reason="no_gpu_node"}"#),
        Some(1.0),
        "{text}"
    );

    // All candidates: it passes (no longer pending), then binds.
    let (status, _) = c.post("/filter", FILTER).await;
    assert_eq!(status, 200);
    let text = scrape(&mut m).await;
    assert_eq!(
        series(&text, r#"fgpu_extender_pods_pending{reason="no_gpu_node"}"#),
        Some(0.0),
        "{text}"
    );
    let (status, body) = c.post("/bind", BIND).await;
    assert_eq!((status, body.as_str()), (200, r#"{"Error":""}"#));
    // Bound already: the second bind is an error.
    c.post("/bind", BIND).await;
    // A body that is not JSON: an error of its verb; a wrong method is not a call.
    c.post("/prioritize", "{").await;
    c.send("GET", "/filter", b"").await;
    let text = scrape(&mut m).await;
    for (series_start, want) in [
        (
            r#"fgpu_extender_requests_total{verb="filter",result="ok"}"#,
            1.0,
        ),
        (
            r#"fgpu_extender_requests_total{verb="filter",result="no_fit"}"#,
            2.0,
        ),
        (
            r#"fgpu_extender_requests_total{verb="bind",result="ok"}"#,
            1.0,
        ),
        (
            r#"fgpu_extender_requests_total{verb="bind",result="error"}"#,
            1.0,
        ),
        (
            r#"fgpu_extender_requests_total{verb="prioritize",result="error"}"#,
            1.0,
        ),
        (
            r#"fgpu_extender_request_duration_seconds_count{verb="filter"}"#,
            3.0,
        ),
        (
            r#"fgpu_extender_request_duration_seconds_count{verb="bind"}"#,
            2.0,
        ),
    ] {
        assert_eq!(
            series(&text, series_start),
            Some(want),
            "{series_start} in {text}"
        );
    }
    assert_eq!(
        series(
            &text,
            r#"fgpu_extender_requests_total{verb="filter",result="error"}"#
        ),
        None,
        "{text}"
    );

    // A pod that waits and is then deleted leaves the gauge at the next resync.
    c.post("/filter", &t4_only.replace("0b6c2a9e", "1b6c2a9e"))
        .await;
    let text = scrape(&mut m).await;
    assert_eq!(
        series(&text, r#"fgpu_extender_pods_pending{reason="no_fit"}"#),
        Some(1.0),
        "{text}"
    );
    ext.sync(
        &[gpu_node("node-t4", 1, "Tesla T4", 16)],
        &[],
        Instant::now(),
    );
    let text = scrape(&mut m).await;
    assert_eq!(
        series(&text, r#"fgpu_extender_pods_pending{reason="no_fit"}"#),
        Some(0.0),
        "{text}"
    );
    assert_eq!(series(&text, "fgpu_extender_nodes"), Some(1.0), "{text}");
}
