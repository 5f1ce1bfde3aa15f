//! Attacks on the extender's protections: pods of another scheduler sent to its verbs,
//! binds without a pod UID, GPU grants on pods the extender did not write, users writing
//! the assignment annotation through the webhook, a non-loopback listen address, and
//! clients without the right certificate when the verbs are served over mutual TLS.
//!
//! `tests/data/extender-mtls/`: a test client CA (`client-ca.crt`, its key thrown away), a
//! client certificate it signed (`client.crt`, `client.key`, CN fgpu-scheduler) and a
//! self-signed one (`other.crt`, `other.key`); EC P-256, valid until 2126, made with
//! `openssl`. The server side uses `tests/data/webhook-tls/`.

use std::sync::Arc;
use std::time::Instant;

use crate::support::*;
use fgpu_api::extender::Pod;
use fgpu_extender::webhook::{GpuInventory, WebhookConfig, guard_review, review};
use fgpu_extender::writer::{FIELD_MANAGER, record_manager};
use fgpu_extender::{Extender, ExtenderConfig, MemoryCluster};
use serde_json::{Value, json};

fn extender() -> Extender {
    let ext = Extender::new(ExtenderConfig::default());
    ext.sync(&[gpu_node("n", 2, "A100", 80)], &[], Instant::now());
    ext
}

fn small(name: &str) -> Pod {
    gpu_pod(
        name,
        json!({}),
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}),
    )
}

/// A pod of the default scheduler (or of none) reaches the extender: filter, prioritize
/// and bind refuse it, and bind writes nothing.
#[tokio::test]
async fn another_schedulers_pod_is_refused() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    let mut other = small("other");
    other.spec.extra["schedulerName"] = json!("default-scheduler");
    let mut none = small("none");
    none.spec.extra.remove("schedulerName");
    for pod in [other, none] {
        let name = pod.metadata.name.clone();
        let f = ext.filter(&filter_args(&pod, &["n"]));
        assert!(
            f.error.contains("spec.schedulerName") && f.error.contains("\"fgpu-scheduler\""),
            "{name}: {f:?}"
        );
        assert!(f.node_names.is_none_or(|n| n.is_empty()), "{name}");
        let p = ext.prioritize(&filter_args(&pod, &["n"]));
        assert!(p.is_err(), "{name}: {p:?}");
        cluster.add_pod(pod.clone());
        let b = ext.bind(&bind_args(&pod, "n"), &cluster).await;
        assert!(
            b.error
                .starts_with(&format!("pod default/{name}: spec.schedulerName is")),
            "{name}: {b:?}"
        );
    }
    assert!(cluster.bindings().is_empty(), "{:?}", cluster.bindings());
    assert!(
        cluster
            .pods()
            .iter()
            .all(|p| !p.metadata.annotations.contains_key(ASSIGNED)),
        "no grant may be written"
    );
    assert!(ext.node_grants("n").is_empty());
    // fgpu's own pod still binds.
    let ours = small("ours");
    cluster.add_pod(ours.clone());
    assert_eq!(ext.bind(&bind_args(&ours, "n"), &cluster).await.error, "");
    assert_eq!(cluster.bindings().len(), 1);
}

/// Over HTTP, as a caller that skips filter: `/bind` of another scheduler's pod.
#[tokio::test]
async fn bind_over_http_refuses_another_schedulers_pod() {
    let ext = Arc::new(extender());
    let cluster = Arc::new(MemoryCluster::default());
    let mut victim = small("victim");
    victim.spec.extra["schedulerName"] = json!("default-scheduler");
    cluster.add_pod(victim.clone());
    let addr = start_server(ext, cluster.clone()).await;
    let body = serde_json::to_string(&bind_args(&victim, "n")).unwrap();
    let (status, answer) = Conn::open(addr).await.post("/bind", &body).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert!(
        v["Error"]
            .as_str()
            .unwrap_or("")
            .contains("spec.schedulerName"),
        "{answer}"
    );
    assert!(cluster.bindings().is_empty());
}

/// A bind request without the pod's UID (the review's C1: it skipped the UID check and
/// wrote a Binding without one) is refused.
#[tokio::test]
async fn a_bind_without_pod_uid_is_refused() {
    let ext = extender();
    let cluster = MemoryCluster::default();
    let pod = small("p");
    cluster.add_pod(pod.clone());
    let mut args = bind_args(&pod, "n");
    args.pod_uid.clear();
    let b = ext.bind(&args, &cluster).await;
    assert!(b.error.contains("no PodUID"), "{b:?}");
    assert!(cluster.bindings().is_empty());
}

fn assigned_json(mib: u64) -> String {
    format!(
        r#"{{"node":"n","containers":[{{"index":0,"name":"main","devices":[{{"id":"gpu-0","uuid":"GPU-n-0","memoryBytes":{},"cores":0}}]}}]}}"#,
        mib << 20
    )
}

/// Grants the extender did not write (annotation set by a user: no managedFields entry,
/// another manager, or the extender's value overwritten by someone else) are not counted,
/// each with an error naming the pod; the extender's own count.
#[test]
fn grants_written_by_others_are_ignored() {
    let ext = extender();
    let mut plain = small("plain");
    plain
        .metadata
        .annotations
        .insert(ASSIGNED.into(), assigned_json(40_000));
    let mut kubectl = small("kubectl");
    record_manager(&mut kubectl, ASSIGNED, "kubectl-annotate");
    kubectl
        .metadata
        .annotations
        .insert(ASSIGNED.into(), assigned_json(40_000));
    let mut overwritten = small("overwritten");
    assign(&mut overwritten, assigned_json(1));
    record_manager(&mut overwritten, ASSIGNED, "kubectl-edit");
    overwritten
        .metadata
        .annotations
        .insert(ASSIGNED.into(), assigned_json(40_000));
    let mut ours = small("ours");
    assign(&mut ours, assigned_json(2_000));
    let report = ext.sync(
        &[gpu_node("n", 2, "A100", 80)],
        &[plain, kubectl, overwritten, ours],
        Instant::now(),
    );
    assert_eq!(report.assigned_pods, 1, "{report:?}");
    for name in ["plain", "kubectl", "overwritten"] {
        assert!(
            report.errors.iter().any(|e| e.starts_with(&format!(
                "pod default/{name}: annotation {ASSIGNED} was not written by the extender"
            ))),
            "{name}: {report:?}"
        );
    }
    let grants = ext.node_grants("n");
    assert_eq!(grants.len(), 1, "{grants:?}");
    assert_eq!(grants[0].devices[0].memory, 2_000 << 20);
    // The field manager the daemon patches with is the one counted.
    assert_eq!(FIELD_MANAGER, "fgpu-extender");
}

/// A CREATE or UPDATE review of a pod as `user`.
fn pod_review(op: &str, user: &str, new: Option<&str>, old: Option<&str>) -> Value {
    let pod = |a: Option<&str>| {
        let mut p = json!({"metadata": {"name": "p", "annotations": {}},
            "spec": {"containers": [{"name": "main", "image": "cuda"}]}});
        if let Some(a) = a {
            p["metadata"]["annotations"][ASSIGNED] = json!(a);
        }
        p
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "r", "operation": op, "namespace": "team",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "userInfo": {"username": user},
            "object": pod(new),
            "oldObject": if op == "UPDATE" { pod(old) } else { Value::Null }}})
}

/// Users may not set, change or remove the assignment annotation, on create or update,
/// through either webhook path; the extender may; other updates pass.
#[test]
fn users_cannot_write_the_assignment_annotation() {
    let cfg = WebhookConfig::default();
    let inv = GpuInventory::default();
    let ext_user = cfg.extender_user.clone();
    let g = assigned_json(1_000);
    let g2 = assigned_json(80_000);
    // (operation, user, annotation after, before, the refusal's end or None: allowed)
    type Case<'a> = (
        &'a str,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
    );
    let cases: [Case<'_>; 8] = [
        ("CREATE", "alice", Some(&g), None, Some("may not set it")),
        ("UPDATE", "alice", Some(&g), None, Some("may not set it")),
        (
            "UPDATE",
            "alice",
            Some(&g2),
            Some(&g),
            Some("may not change it"),
        ),
        ("UPDATE", "alice", None, Some(&g), Some("may not remove it")),
        ("UPDATE", "alice", Some(&g), Some(&g), None),
        ("CREATE", "alice", None, None, None),
        ("UPDATE", &ext_user, Some(&g), None, None),
        ("UPDATE", &ext_user, None, Some(&g), None),
    ];
    for (op, user, new, old, denied) in cases {
        let r = pod_review(op, user, new, old);
        for (path, answer) in [
            ("validate", guard_review(&r, &cfg).unwrap()),
            ("mutate", review(&r, &cfg, &inv).unwrap()),
        ] {
            let what = format!("{path} {op} by {user} {new:?} <- {old:?}: {answer}");
            match denied {
                Some(m) => {
                    assert_eq!(answer["response"]["allowed"], false, "{what}");
                    let msg = answer["response"]["status"]["message"].as_str().unwrap();
                    assert!(
                        msg.starts_with(&format!(
                            "fgpu: pod team/p: metadata.annotations[\"{ASSIGNED}\"]: only fgpu's extender"
                        )) && msg.ends_with(m),
                        "{what}"
                    );
                }
                None => assert_eq!(answer["response"]["allowed"], true, "{what}"),
            }
        }
    }
}

/// The extender refuses to serve its unauthenticated verbs on a non-loopback address.
#[test]
fn non_loopback_addresses_are_refused() {
    for bad in ["0.0.0.0:8888", "10.1.2.3:8888", "[::]:8888"] {
        let e = fgpu_extender::check_extender_address(bad.parse().unwrap(), false).unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with(&format!("--extender-address {bad}: not a loopback address")),
            "{m}"
        );
    }
    for good in ["127.0.0.1:8888", "[::1]:8888"] {
        fgpu_extender::check_extender_address(good.parse().unwrap(), false).unwrap();
    }
    // With mutual TLS any address is allowed.
    for any in ["0.0.0.0:8888", "[::]:8888"] {
        fgpu_extender::check_extender_address(any.parse().unwrap(), true).unwrap();
    }
}

/// The default listen address is the loopback one, and `--listen` still parses.
#[test]
fn default_listen_address_is_loopback() {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: fgpu_extender::ExtenderArgs,
    }
    let cli = Cli::try_parse_from(["x"]).unwrap();
    assert!(cli.args.extender_address.ip().is_loopback());
    let cli = Cli::try_parse_from(["x", "--listen", "127.0.0.1:9"]).unwrap();
    assert_eq!(cli.args.extender_address, "127.0.0.1:9".parse().unwrap());
}

fn tls_data(dir: &str, file: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(dir)
        .join(file)
}

/// A TLS client trusting the test serving CA, presenting `cert` (a file pair in
/// `extender-mtls/`) when given.
fn mtls_client(cert: Option<&str>) -> tokio_rustls::TlsConnector {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in
        rustls_pki_types::CertificateDer::pem_file_iter(tls_data("webhook-tls", "ca.crt")).unwrap()
    {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let cfg = match cert {
        None => b.with_no_client_auth(),
        Some(name) => {
            let chain = rustls_pki_types::CertificateDer::pem_file_iter(tls_data(
                "extender-mtls",
                &format!("{name}.crt"),
            ))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
            let key = rustls_pki_types::PrivateKeyDer::from_pem_file(tls_data(
                "extender-mtls",
                &format!("{name}.key"),
            ))
            .unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        }
    };
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// `POST /bind` over TLS as `cert`: the HTTP status, or the error that stopped it.
async fn bind_over_tls(
    addr: std::net::SocketAddr,
    cert: Option<&str>,
    body: &str,
) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut s = mtls_client(cert)
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let req = format!(
        "POST /bind HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // With TLS 1.3 the server checks the client's certificate after the client finished
    // its handshake: a refusal shows on the first read (or write).
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let read = s.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).to_string();
    match text.get(9..12).and_then(|c| c.parse().ok()) {
        Some(code) => Ok(code),
        None => Err(format!("no HTTP response ({read:?})")),
    }
}

/// Over mutual TLS, only a client with a certificate of the configured CA gets an answer:
/// no certificate and a self-signed one are refused at the handshake, and the victim
/// stays unbound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_clients_without_the_cas_certificate() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ext = Arc::new(extender());
    let cluster = Arc::new(MemoryCluster::default());
    let victim = small("victim");
    cluster.add_pod(victim.clone());
    let tls = fgpu_plumbing::tls::server_config_mutual(
        &tls_data("webhook-tls", "tls.crt"),
        &tls_data("webhook-tls", "tls.key"),
        "--extender-client-ca",
        &tls_data("extender-mtls", "client-ca.crt"),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(fgpu_extender::http::serve_tls(
        listener,
        ext,
        cluster.clone(),
        Some(tls),
    ));
    let body = serde_json::to_string(&bind_args(&victim, "n")).unwrap();
    for who in [None, Some("other")] {
        let r = bind_over_tls(addr, who, &body).await;
        assert!(r.is_err(), "{who:?}: {r:?}");
    }
    assert!(cluster.bindings().is_empty(), "{:?}", cluster.bindings());
    assert_eq!(bind_over_tls(addr, Some("client"), &body).await, Ok(200));
    assert_eq!(cluster.bindings().len(), 1);
}

/// `--extender-client-ca` needs the serving pair, and a CA file that is not PEM is refused
/// naming the flag.
#[test]
fn extender_client_ca_needs_the_serving_pair() {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: fgpu_extender::ExtenderArgs,
    }
    assert!(Cli::try_parse_from(["x", "--extender-client-ca", "ca.crt"]).is_err());
    let bad = tls_data("webhook-tls", "tls.key");
    let e = fgpu_plumbing::tls::server_config_mutual(
        &tls_data("webhook-tls", "tls.crt"),
        &tls_data("webhook-tls", "tls.key"),
        "--extender-client-ca",
        &bad,
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("--extender-client-ca "), "{e}");
}
