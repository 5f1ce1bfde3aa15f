//! The extender's admission webhook over a real HTTPS socket (rustls on both sides), with
//! the `AdmissionReview` bodies the API server sends, bad bodies and a client that does not
//! speak TLS; the server keeps serving throughout.
//!
//! `tests/data/webhook-tls/`: a test CA (`ca.crt`, its key thrown away) and a serving
//! certificate for `localhost` / 127.0.0.1 signed by it (`tls.crt`, `tls.key`), valid
//! until 2126; made with `openssl` (EC P-256).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::support::*;
use base64::Engine;
use fgpu_extender::webhook::WebhookConfig;
use fgpu_extender::{Extender, ExtenderConfig};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn data(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/webhook-tls")
        .join(file)
}

async fn start(ext: Arc<Extender>) -> std::net::SocketAddr {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls = fgpu_plumbing::tls::server_config(&data("tls.crt"), &data("tls.key")).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(fgpu_extender::http::serve_webhook(
        listener,
        tls,
        ext,
        Arc::new(WebhookConfig::default()),
    ));
    addr
}

fn connector() -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(data("ca.crt")).unwrap();
    use rustls_pki_types::pem::PemObject;
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// One request over a fresh TLS connection (`Connection: close`): status and body.
async fn call(addr: std::net::SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = connector().connect(name, tcp).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // One write, as in `support::Conn::send`: a body that arrives after the server has
    // answered without reading it may meet a closed connection.
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    s.write_all(&request).await.unwrap();
    let mut out = Vec::new();
    // A server that closes without close_notify is an error for rustls; what was read
    // before counts.
    let _ = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    (head[9..12].parse().unwrap(), body.to_owned())
}

fn review(uid: &str, pod: Value) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
    .to_string()
}

/// HAMi's example pod as the API server hands it to the webhook: no namespace in the
/// metadata, requests defaulted from limits, defaults filled in.
fn hami_pod(annotations: Value, limits: Value) -> Value {
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "gpu-pod", "creationTimestamp": null, "annotations": annotations},
        "spec": {
            "containers": [{
                "name": "ubuntu-container", "image": "ubuntu:22.04",
                "command": ["bash", "-c", "sleep 86400"],
                "resources": {"limits": limits.clone(), "requests": limits},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"
            }],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst", "securityContext": {},
            "schedulerName": "default-scheduler", "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_over_https() {
    let ext = Arc::new(Extender::new(ExtenderConfig::default()));
    ext.sync(
        &[
            gpu_node("node-a100", 2, "NVIDIA A100-SXM4-80GB", 80),
            gpu_node("node-t4", 1, "Tesla T4", 16),
        ],
        &[],
        Instant::now(),
    );
    let addr = start(ext.clone()).await;

    assert_eq!(
        call(addr, "GET", "/healthz", b"").await,
        (200, "ok\n".into())
    );

    // Mutated: scheduler name and the GPU count, in limits and requests.
    let pod = hami_pod(
        json!({"nvidia.com/use-gputype": "A100"}),
        json!({"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}),
    );
    let (status, body) = call(
        addr,
        "POST",
        "/mutate-pods",
        review("u-1", pod.clone()).as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(r["kind"], "AdmissionReview");
    assert_eq!(r["response"]["uid"], "u-1");
    assert_eq!(r["response"]["allowed"], true);
    assert_eq!(r["response"]["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(r["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch).unwrap();
    let mut want = pod.clone();
    want["spec"]["schedulerName"] = json!("fgpu-scheduler");
    let res = &mut want["spec"]["containers"][0]["resources"];
    res["limits"]["nvidia.com/gpu"] = json!("1");
    res["requests"]["nvidia.com/gpu"] = json!("1");
    assert_eq!(out, want);

    // Denied, naming the pod, the container and the field.
    let pod = hami_pod(
        json!({"nvidia.com/use-gputype": "H200"}),
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "130"}),
    );
    let (status, body) = call(addr, "POST", "/mutate-pods", review("u-2", pod).as_bytes()).await;
    assert_eq!(status, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["response"]["uid"], "u-2");
    assert_eq!(r["response"]["allowed"], false);
    let msg = r["response"]["status"]["message"].as_str().unwrap();
    assert!(msg.starts_with("fgpu: pod default/gpu-pod: "), "{msg}");
    assert!(
        msg.contains("container \"ubuntu-container\" (spec.containers[0]): resources.limits[\"nvidia.com/gpucores\"]: 130 is above the maximum 100"),
        "{msg}"
    );
    assert!(
        msg.contains("no GPU in the cluster matches \"H200\""),
        "{msg}"
    );

    // A pod without GPU resources: allowed, no patch.
    let pod = hami_pod(json!({}), json!({"cpu": "1"}));
    let (_, body) = call(addr, "POST", "/mutate-pods", review("u-3", pod).as_bytes()).await;
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["response"]["allowed"], true);
    assert!(r["response"].get("patch").is_none(), "{r}");

    // Bad bodies: 400 with a reason; bad paths and methods.
    for (body, reason) in [
        (&b"not json"[..], "not an AdmissionReview (JSON)"),
        (
            b"{\"request\": {\"uid\": \"u\", \"operation\": \"CRE",
            "not an AdmissionReview (JSON)",
        ),
        (b"[]", "not a JSON object"),
        (b"{}", "no request"),
        (
            b"{\"request\": {\"operation\": \"CREATE\"}}",
            "no request.uid",
        ),
        (
            b"{\"request\": {\"uid\": \"u\", \"operation\": \"CREATE\", \"object\": 5}}",
            "request.object is not a Pod object",
        ),
        (b"", "not an AdmissionReview (JSON)"),
    ] {
        let (status, text) = call(addr, "POST", "/mutate-pods", body).await;
        assert_eq!(status, 400, "{text}");
        assert!(text.contains(reason), "{text}");
    }
    assert_eq!(call(addr, "GET", "/mutate-pods", b"").await.0, 405);
    assert_eq!(call(addr, "POST", "/filter", b"{}").await.0, 404);

    // A client that does not speak TLS: its connection fails, nothing else does.
    {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"POST /mutate-pods HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let _ = tcp.read_to_end(&mut buf).await;
    }

    // Still serving.
    let pod = hami_pod(json!({}), json!({"nvidia.com/gpu": "1"}));
    let (status, body) = call(addr, "POST", "/mutate-pods", review("u-4", pod).as_bytes()).await;
    assert_eq!(status, 200, "{body}");
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (
            r["response"]["uid"].as_str(),
            r["response"]["allowed"].as_bool()
        ),
        (Some("u-4"), Some(true))
    );
}

/// The webhook reads the inventory the extender has at each request: before any node
/// has published its GPUs, model names cannot be checked (admitted with warnings).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_inventory_admits_with_warnings_then_checks() {
    let ext = Arc::new(Extender::new(ExtenderConfig::default()));
    let addr = start(ext.clone()).await;
    let pod = hami_pod(
        json!({"nvidia.com/use-gputype": "H100"}),
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "100000"}),
    );
    let (_, body) = call(
        addr,
        "POST",
        "/mutate-pods",
        review("u-1", pod.clone()).as_bytes(),
    )
    .await;
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["response"]["allowed"], true, "{r}");
    let w = r["response"]["warnings"].as_array().unwrap();
    assert_eq!(w.len(), 2, "{w:?}");

    ext.sync(
        &[gpu_node("node-t4", 1, "Tesla T4", 16)],
        &[],
        Instant::now(),
    );
    let (_, body) = call(addr, "POST", "/mutate-pods", review("u-2", pod).as_bytes()).await;
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["response"]["allowed"], false, "{r}");
    let msg = r["response"]["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains(
            "100000 MiB is more than the largest GPU in the cluster has (16384 MiB, Tesla T4)"
        ),
        "{msg}"
    );
    assert!(msg.contains("known models: \"Tesla T4\""), "{msg}");
}

/// The manifests in `deploy/extender/` agree with the flags' defaults: the scheduler
/// profile is the webhook's scheduler name, and the four resources are the extender's
/// managed resources and the webhook's match condition.
#[test]
fn deploy_manifests_agree_with_the_defaults() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/extender");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let scheduler = read("scheduler.yaml");
    let webhook = read("webhook.yaml");
    let extender = read("extender.yaml");
    let name = fgpu_extender::webhook::DEFAULT_SCHEDULER_NAME;
    assert!(scheduler.contains(&format!("- schedulerName: {name}\n")));
    assert!(extender.contains(&format!("--scheduler-name={name}\n")));
    let names = fgpu_api::names::LegacyResourceNames::default();
    for r in [
        &names.gpu,
        &names.memory,
        &names.memory_percentage,
        &names.cores,
    ] {
        assert!(
            scheduler.contains(&format!("{{name: {r}, ignoredByScheduler: true}}")),
            "{r}"
        );
        assert!(webhook.contains(&format!("'{r}'")), "{r}");
    }
    assert!(webhook.contains("path: /mutate-pods"));
    assert!(extender.contains("--webhook-addr=0.0.0.0:9443"));
    // The verbs on loopback, called by the scheduler in the same pod.
    assert!(extender.contains("--extender-address=127.0.0.1:8888\n"));
    assert!(scheduler.contains("urlPrefix: http://127.0.0.1:8888\n"));
    assert!(
        extender.contains("- name: kube-scheduler\n") && extender.contains("- name: extender\n")
    );
    assert!(
        !extender.contains("port: 8888"),
        "no Service port for the extender's verbs"
    );
    // The assignment guard: validating, CREATE and UPDATE, the extender's account.
    let guard = &webhook[webhook
        .find("kind: ValidatingWebhookConfiguration")
        .unwrap()..];
    assert!(guard.contains("path: /validate-pods"));
    assert!(guard.contains(r#"operations: ["CREATE", "UPDATE"]"#));
    assert!(guard.contains("failurePolicy: Fail"));
    assert!(!guard.contains("objectSelector"));
    assert!(guard.contains(&format!("'{ASSIGNED}' in object.metadata.annotations")));
    let (ns, sa) = ("fgpu-system", "fgpu-extender");
    assert_eq!(
        fgpu_extender::webhook::DEFAULT_EXTENDER_USER,
        format!("system:serviceaccount:{ns}:{sa}")
    );
    assert!(extender.contains(&format!("serviceAccountName: {sa}\n")));
    assert!(
        extender.contains(
            "--extender-user=system:serviceaccount:$(POD_NAMESPACE):$(SERVICE_ACCOUNT)\n"
        )
    );
}

/// The validating path over HTTPS: a user's pod carrying the assignment annotation is
/// refused on both paths; without it, admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assignment_guard_over_https() {
    let ext = Arc::new(Extender::new(ExtenderConfig::default()));
    let addr = start(ext).await;
    let forged = hami_pod(
        json!({ASSIGNED: r#"{"node":"n","containers":[]}"#}),
        json!({"nvidia.com/gpu": "1"}),
    );
    for path in ["/validate-pods", "/mutate-pods"] {
        let (status, body) =
            call(addr, "POST", path, review("g1", forged.clone()).as_bytes()).await;
        assert_eq!(status, 200, "{path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["response"]["allowed"], false, "{path}: {body}");
        assert!(
            v["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains("user \"kubernetes-admin\" may not set it"),
            "{path}: {body}"
        );
    }
    let plain = hami_pod(json!({}), json!({"nvidia.com/gpu": "1"}));
    let (status, body) = call(
        addr,
        "POST",
        "/validate-pods",
        review("g2", plain).as_bytes(),
    )
    .await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["response"]["allowed"], true, "{body}");
    assert!(v["response"]["patch"].is_null(), "{body}");
}
