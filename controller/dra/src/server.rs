//! The daemon's HTTP endpoints, served by the plumbing's server layer (body limits,
//! timeouts, certificate reload).
//!
//! * Webhooks over TLS (rustls, certificate and key from PEM files):
//!   `POST /mutate-pods` (adds the scheduling gate, [`crate::admission::gate_patch`]) and
//!   `POST /validate-claims` ([`crate::admission::validate`]); with `--hami-pods`,
//!   `POST /mutate-pods-dra` ([`crate::hami_pods`]: creates the pod's ResourceClaimTemplate,
//!   then answers the patch; the pod is refused when the template cannot be created, or
//!   when one of that name holds another spec). A review that cannot be
//!   read is answered 400. The pod gate fails closed: a claim or template that does not
//!   exist yet, or whose lookup fails, gates the pod too (with a warning and a log line
//!   saying why), and the reconcile pass lifts the gate once the claim exists and needs no
//!   fgpu allocation. Otherwise a shared claim created after its pod would be allocated by
//!   kube-scheduler as a whole device, with the user's own config as the quota. Bodies are
//!   bounded by [`WEBHOOK_LIMITS`] (413 past it; the plumbing layer's deadlines apply).
//! * Plain HTTP: `GET /metrics`, `/healthz` (the process serves), `/readyz` (the
//!   reflectors have listed once).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Result;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::Response;
use axum::routing::get;
use fgpu_api::dra::claim::DeviceClaim;
use fgpu_api::dra::tolerant;
use fgpu_plumbing::server::{self as http, Limits};
use kube::api::{Api, DynamicObject};
use serde_json::Value;

use crate::admission::{self, ClaimSource};
use crate::hami_pods::{self, Reviewed};
use crate::objects::uses_controller_class;
use crate::shared::{Mode, Shared};

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response {
    http::body(status, content_type, body)
}

/// The plain endpoints: `/metrics`, `/healthz`, `/readyz`.
pub fn probes(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(
                |State(s): State<Arc<Shared>>, headers: axum::http::HeaderMap| async move {
                    let accept = headers
                        .get(axum::http::header::ACCEPT)
                        .and_then(|v| v.to_str().ok());
                    let page =
                        crate::hami_metrics::encode_with(s.metrics.encode(), s.hami.as_ref());
                    let (content_type, page) = fgpu_plumbing::exposition::negotiate(accept, page);
                    reply(StatusCode::OK, content_type, page)
                },
            ),
        )
        .route(
            "/healthz",
            get(|| async { reply(StatusCode::OK, "text/plain", "ok\n".into()) }),
        )
        .route(
            "/readyz",
            get(|State(s): State<Arc<Shared>>| async move {
                if s.ready.load(Ordering::Relaxed) {
                    reply(StatusCode::OK, "text/plain", "ok\n".into())
                } else {
                    reply(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        "caches not synced\n".into(),
                    )
                }
            }),
        )
        .fallback(|| async { reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()) })
        .with_state(shared)
}

/// Serves `/metrics`, `/healthz`, `/readyz` on `addr`.
pub async fn spawn_plain(addr: SocketAddr, shared: Arc<Shared>) -> Result<()> {
    let listener = http::bind("--metrics-address", addr).await?;
    tracing::info!(%addr, "metrics and health endpoints");
    tokio::spawn(http::serve(
        listener,
        probes(shared),
        Limits::PROBES,
        None,
        std::future::pending(),
    ));
    Ok(())
}

/// The webhook endpoints: `POST /mutate-pods`, `POST /validate-claims`, and with
/// `--hami-pods` `POST /mutate-pods-dra`.
pub fn webhooks(shared: Arc<Shared>) -> Router {
    Router::new()
        .fallback(
            |State(s): State<Arc<Shared>>, req: Request| async move { webhook(req, &s).await },
        )
        .with_state(shared)
}

/// What one webhook request may take: an `AdmissionReview` of a Pod or a claim (8 MiB;
/// a Pod is at most about 1.5 MiB in etcd), 30 s in all, 10 s for the request head and
/// for the TLS handshake.
pub const WEBHOOK_LIMITS: Limits = Limits::WEBHOOK;

/// Serves the webhooks over TLS on `addr`.
pub async fn spawn_webhooks(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    shared: Arc<Shared>,
) -> Result<()> {
    let listener = http::bind("--webhook-addr", addr).await?;
    tracing::info!(%addr, "admission webhooks (HTTPS)");
    tokio::spawn(serve_webhooks(listener, Some(tls), shared));
    Ok(())
}

/// Serves the webhooks on `listener` (over TLS when given) with [`WEBHOOK_LIMITS`], until
/// the task is dropped.
pub async fn serve_webhooks(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    shared: Arc<Shared>,
) {
    http::serve(
        listener,
        webhooks(shared),
        WEBHOOK_LIMITS,
        tls,
        std::future::pending(),
    )
    .await;
}

async fn webhook(req: Request, shared: &Shared) -> Response {
    let path = req.uri().path().to_owned();
    if req.method() != Method::POST {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "POST an AdmissionReview\n".into(),
        );
    }
    let body: Bytes = match axum::body::to_bytes(req.into_body(), WEBHOOK_LIMITS.max_body).await {
        Ok(b) => b,
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("reading the body: {e}\n"),
            );
        }
    };
    let review: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                format!("the body is not an AdmissionReview (JSON): {e}\n"),
            );
        }
    };
    if !review["request"]["uid"].is_string() {
        return reply(
            StatusCode::BAD_REQUEST,
            "text/plain",
            "AdmissionReview without request.uid\n".into(),
        );
    }
    let answer = match path.as_str() {
        "/mutate-pods" => mutate_pod(&review, shared).await,
        "/mutate-pods-dra" if shared.hami_pods => mutate_hami_pod(&review, shared).await,
        "/validate-claims" => {
            let (kind, object) = admission::review_object(&review);
            let classes = lookup_classes(
                shared,
                &admission::high_priority_classes(object, kind, &shared.driver),
            )
            .await;
            admission::answer_claim_review(&review, &shared.driver, &classes)
        }
        _ => return reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    reply(StatusCode::OK, "application/json", answer.to_string())
}

/// What the DeviceClasses `names` say about `priority: high` (see
/// [`admission::class_allows_high`]); none are read when a claim does not ask for it.
async fn lookup_classes(shared: &Shared, names: &[String]) -> admission::ClassPolicy {
    let ar = fgpu_plumbing::discovery::device_classes(shared.api);
    let api: Api<DynamicObject> = Api::all_with(shared.client.clone(), &ar);
    let mut out = admission::ClassPolicy::new();
    for n in names {
        let found = match api.get_opt(n).await {
            Ok(Some(o)) => {
                let v = serde_json::to_value(&o).unwrap_or(Value::Null);
                let class = tolerant::from_value(&v);
                admission::ClassLookup::Found(admission::class_allows_high(&class, &shared.driver))
            }
            Ok(None) => admission::ClassLookup::NotFound,
            Err(e) => admission::ClassLookup::Failed(e.to_string()),
        };
        out.insert(n.clone(), found);
    }
    out
}

/// A HAMi pod on DRA ([`hami_pods::review`]): the GPUs' memory sizes when the pod asks
/// for a percentage, the template created (or found with the same spec), then the patch.
pub(crate) async fn mutate_hami_pod(review: &Value, shared: &Shared) -> Value {
    let mut cfg = hami_pods::HamiConfig::new(shared.driver.clone());
    cfg.api = shared.api;
    if shared.mode.get() == Mode::Capacity {
        cfg.gate = None;
        cfg.capacity = true;
    }
    let sizes = if hami_pods::needs_gpu_sizes(review, &cfg.names) {
        match gpu_sizes(shared).await {
            Ok(s) => s,
            Err(e) => {
                return hami_pods::refuse(
                    review,
                    &format!(
                        "fgpu: listing the ResourceSlices of {} for the GPUs' memory sizes failed: {e}",
                        shared.driver.as_str()
                    ),
                );
            }
        }
    } else {
        Vec::new()
    };
    match hami_pods::review(review, &cfg, &sizes) {
        Reviewed::Answer(a) => a,
        Reviewed::Create {
            namespace,
            translation,
            answer,
        } => match ensure_template(shared, &namespace, &translation.template).await {
            Ok(()) => answer,
            Err(m) => hami_pods::refuse(review, &m),
        },
    }
}

/// The memory sizes of this driver's GPUs, from the ResourceSlices.
async fn gpu_sizes(shared: &Shared) -> Result<Vec<u64>, kube::Error> {
    let ar = fgpu_plumbing::discovery::slices(shared.api);
    let api: Api<DynamicObject> = Api::all_with(shared.client.clone(), &ar);
    let list = api.list(&kube::api::ListParams::default()).await?;
    let slices: Vec<fgpu_api::dra::slice::ResourceSlice> = list
        .items
        .iter()
        .map(|o| tolerant::from_value(&serde_json::to_value(o).unwrap_or(Value::Null)))
        .collect();
    Ok(hami_pods::gpu_sizes(&slices, &shared.driver))
}

/// Creates `template` in `ns`; one that exists already must hold the same spec
/// ([`hami_pods::holds_spec`]: the API server's defaults aside). `Err` is the refusal's
/// message.
async fn ensure_template(shared: &Shared, ns: &str, template: &Value) -> Result<(), String> {
    let ar = fgpu_plumbing::discovery::claim_templates(shared.api);
    let api: Api<DynamicObject> = Api::namespaced_with(shared.client.clone(), ns, &ar);
    let name = template["metadata"]["name"].as_str().unwrap_or_default();
    let obj: DynamicObject = serde_json::from_value(template.clone())
        .map_err(|e| format!("fgpu: ResourceClaimTemplate {ns}/{name}: {e}"))?;
    match api.create(&kube::api::PostParams::default(), &obj).await {
        Ok(_) => {
            tracing::info!(template = %format!("{ns}/{name}"), "HAMi pod: template created");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => match api.get(name).await {
            Ok(found) if hami_pods::holds_spec(&found.data["spec"], &template["spec"]) => Ok(()),
            Ok(_) => Err(format!(
                "fgpu: ResourceClaimTemplate {ns}/{name} exists with another spec than this pod's HAMi resources ask; delete it, fgpu recreates it"
            )),
            Err(e) => Err(format!(
                "fgpu: reading ResourceClaimTemplate {ns}/{name} failed: {e}"
            )),
        },
        Err(e) => Err(format!(
            "fgpu: creating ResourceClaimTemplate {ns}/{name} failed: {e}"
        )),
    }
}

/// Whether the pod needs the gate: any referenced claim or template of the shared class
/// or the MIG class (both are the controller's to allocate).
pub(crate) async fn mutate_pod(review: &Value, shared: &Shared) -> Value {
    let pod = &review["request"]["object"];
    let ns = review["request"]["namespace"]
        .as_str()
        .or_else(|| pod["metadata"]["namespace"].as_str())
        .unwrap_or("default");
    if review["request"]["operation"].as_str() != Some("CREATE")
        || shared.mode.get() == Mode::Capacity
    {
        return admission::response(review, true, None, None, &[]);
    }
    let class = format!(
        "{} or {}",
        shared.driver.shared_class(),
        shared.driver.mig_class()
    );
    let mut warnings = Vec::new();
    let mut needs = false;
    for src in admission::pod_sources(pod) {
        let (ar, name, inner) = match &src {
            ClaimSource::Claim(n) => (fgpu_plumbing::discovery::claims(shared.api), n, false),
            ClaimSource::Template(n) => (
                fgpu_plumbing::discovery::claim_templates(shared.api),
                n,
                true,
            ),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(shared.client.clone(), ns, &ar);
        match api.get_opt(name).await {
            Ok(Some(o)) => {
                let v = serde_json::to_value(&o).unwrap_or(Value::Null);
                let devices: DeviceClaim = tolerant::from_value(if inner {
                    &v["spec"]["spec"]["devices"]
                } else {
                    &v["spec"]["devices"]
                });
                if uses_controller_class(&devices, &shared.driver) {
                    needs = true;
                }
            }
            // Fail closed: a claim that does not exist yet may be of the shared class.
            // Gated, the pod waits for it; the reconcile pass lifts the gate once it
            // exists and needs no allocation of ours.
            Ok(None) => {
                needs = true;
                warnings.push(format!(
                    "fgpu: {} {ns}/{name} not found; the pod is gated ({}) until it exists and, if it uses {class}, fgpu has allocated it",
                    if inner {
                        "ResourceClaimTemplate"
                    } else {
                        "ResourceClaim"
                    },
                    shared.driver.scheduling_gate()
                ));
            }
            Err(e) => {
                needs = true;
                warnings.push(format!(
                    "fgpu: looking up {ns}/{name} failed ({e}); the pod is gated ({}) until the controller has seen the claim",
                    shared.driver.scheduling_gate()
                ));
            }
        }
    }
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let patch = if needs {
        admission::gate_patch(pod, &shared.driver.scheduling_gate())
    } else {
        None
    };
    if patch.is_some() {
        tracing::info!(
            pod = %format!("{ns}/{}", pod["metadata"]["name"].as_str().or(pod["metadata"]["generateName"].as_str()).unwrap_or("")),
            "scheduling gate added"
        );
    }
    admission::response(review, true, None, patch.as_ref(), &warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_api::dra::ApiVersion;
    use fgpu_plumbing::testing::{Answer, FakeApiServer};
    use serde_json::json;

    const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims";

    fn shared(fake: &FakeApiServer) -> Arc<Shared> {
        Arc::new(shared_with(fake, true))
    }

    /// What the servers share over `fake`; `hami_pods`: `--hami-pods`.
    fn shared_with(fake: &FakeApiServer, hami_pods: bool) -> Shared {
        Shared {
            hami_pods,
            ..Shared::for_tests(fake.client())
        }
    }

    fn claim(class: &str) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "team", "uid": "u-c"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}})
    }

    /// A Pod CREATE review of a pod using the claim `c` in namespace `team`.
    fn review() -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r1", "operation": "CREATE", "namespace": "team",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "object": {"metadata": {"name": "p", "namespace": "team"},
                    "spec": {"containers": [{"name": "main", "image": "cuda"}],
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}}}})
    }

    fn gated(answer: &Value) -> bool {
        answer["response"]["allowed"] == true
            && answer["response"]["patch"]
                .as_str()
                .is_some_and(|p| !p.is_empty())
    }

    #[tokio::test]
    async fn a_shared_claim_gates_its_pod_and_another_class_does_not() {
        let fake = FakeApiServer::new().group("resource.k8s.io", &["v1"]);
        let s = shared(&fake);
        fake.lock()
            .unwrap()
            .insert(&format!("{CLAIMS}/c"), claim("shared.gpu.fgpu.dev"));
        assert!(gated(&mutate_pod(&review(), &s).await));
        fake.lock()
            .unwrap()
            .insert(&format!("{CLAIMS}/c"), claim("gpu.example.com"));
        let a = mutate_pod(&review(), &s).await;
        assert_eq!(a["response"]["allowed"], true, "{a}");
        assert!(!gated(&a), "{a}");
    }

    /// Pod first, claim later: the claim may be of the shared class, so the pod is gated
    /// (it used to be admitted ungated, and kube-scheduler then allocated the shared claim
    /// as a whole GPU). The warning says why.
    #[tokio::test]
    async fn a_missing_claim_keeps_the_gate() {
        let fake = FakeApiServer::new().group("resource.k8s.io", &["v1"]);
        let a = mutate_pod(&review(), &shared(&fake)).await;
        assert!(gated(&a), "the pod must be gated: {a}");
        let w = a["response"]["warnings"].to_string();
        assert!(w.contains("team/c not found; the pod is gated"), "{w}");
    }

    /// A failed lookup (the API server answers 500) gates the pod too.
    #[tokio::test]
    async fn a_failed_lookup_keeps_the_gate() {
        let fake = FakeApiServer::new().group("resource.k8s.io", &["v1"]);
        fake.lock().unwrap().intercept(|r| {
            r.path.contains("/resourceclaims/").then(|| {
                Answer::status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "etcd is down",
                )
            })
        });
        let a = mutate_pod(&review(), &shared(&fake)).await;
        assert!(gated(&a), "the pod must be gated: {a}");
        assert!(
            a["response"]["warnings"]
                .to_string()
                .contains("team/c failed (ApiError: etcd is down"),
            "{a}"
        );
    }

    /// A HAMi pod review (`/mutate-pods-dra`) of a pod in `team` with these limits.
    fn hami_review(limits: Value) -> Value {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r1", "operation": "CREATE", "namespace": "team",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "object": {"metadata": {"name": "p", "namespace": "team"},
                    "spec": {"containers": [{"name": "main", "image": "cuda",
                        "resources": {"limits": limits}}]}}}})
    }

    /// The template of `answer`'s patch, read back from the fake API server.
    async fn template_of(fake: &FakeApiServer, answer: &Value) -> Value {
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(answer["response"]["patch"].as_str().expect("a patch"))
            .unwrap();
        let patch: Value = serde_json::from_slice(&raw).unwrap();
        let op = patch
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["path"] == "/spec/resourceClaims")
            .expect("the claim op");
        let name = op["value"][0]["resourceClaimTemplateName"]
            .as_str()
            .unwrap();
        let ar = fgpu_plumbing::discovery::claim_templates(ApiVersion::V1);
        let api: Api<DynamicObject> = Api::namespaced_with(fake.client(), "team", &ar);
        serde_json::to_value(api.get(name).await.unwrap()).unwrap()
    }

    /// The template is created, a second identical pod finds it, a template of that name
    /// with another spec refuses the pod, and a percentage reads the slices' GPU sizes.
    #[tokio::test]
    async fn a_hami_pod_gets_its_template() {
        let fake = FakeApiServer::new().group("resource.k8s.io", &["v1"]);
        let s = shared(&fake);
        let r = hami_review(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}));
        let a = mutate_hami_pod(&r, &s).await;
        assert_eq!(a["response"]["allowed"], true, "{a}");
        let t = template_of(&fake, &a).await;
        assert_eq!(
            t["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["memory"],
            "3000Mi"
        );
        let again = mutate_hami_pod(&r, &s).await;
        assert_eq!(again["response"]["allowed"], true, "{again}");

        let name = t["metadata"]["name"].as_str().unwrap().to_owned();
        let mut other = t.clone();
        other["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = json!(2);
        fake.lock().unwrap().insert(
            &format!("/apis/resource.k8s.io/v1/namespaces/team/resourceclaimtemplates/{name}"),
            other,
        );
        let a = mutate_hami_pod(&r, &s).await;
        assert_eq!(a["response"]["allowed"], false, "{a}");
        assert!(
            a["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!(
                    "ResourceClaimTemplate team/{name} exists with another spec"
                )),
            "{a}"
        );

        fake.lock().unwrap().insert(
            "/apis/resource.k8s.io/v1/resourceslices/node-a-gpu.fgpu.dev",
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": "node-a-gpu.fgpu.dev"},
                "spec": {"driver": "gpu.fgpu.dev", "nodeName": "node-a",
                    "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}}]}}),
        );
        let pct = hami_review(json!({"nvidia.com/gpumem-percentage": "25"}));
        let a = mutate_hami_pod(&pct, &s).await;
        assert_eq!(a["response"]["allowed"], true, "{a}");
        let t = template_of(&fake, &a).await;
        assert_eq!(
            t["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["memory"],
            "20Gi"
        );
        assert_eq!(
            t["spec"]["spec"]["devices"]["config"][0]["requests"],
            json!(["main/mem-81920mi"])
        );
    }

    /// Off (`--hami-pods` not given), the path is not served.
    #[tokio::test]
    async fn the_hami_path_is_off_by_default() {
        let fake = FakeApiServer::new().group("resource.k8s.io", &["v1"]);
        let on = shared_with(&fake, true);
        let off = shared_with(&fake, false);
        let req = |body: &Value| {
            Request::builder()
                .method(Method::POST)
                .uri("/mutate-pods-dra")
                .body(axum::body::Body::from(body.to_string()))
                .unwrap()
        };
        let r = hami_review(json!({"nvidia.com/gpu": "1"}));
        assert_eq!(webhook(req(&r), &on).await.status(), StatusCode::OK);
        assert_eq!(webhook(req(&r), &off).await.status(), StatusCode::NOT_FOUND);
    }

    /// The webhook server refuses a body over its ceiling (413) without reading it whole,
    /// and still answers a review of normal size on the same server.
    #[tokio::test]
    async fn a_too_large_body_is_refused() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let fake = FakeApiServer::new().group("resource.k8s.io", &["v1"]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_webhooks(listener, None, shared(&fake)));
        let send = |body: Vec<u8>| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "POST /mutate-pods HTTP/1.1\r\nHost: w\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            // The server may answer and close before the body is all sent.
            let _ = s.write_all(&body).await;
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).to_string()
        };
        let big = vec![b' '; WEBHOOK_LIMITS.max_body + 1];
        let out = send(big).await;
        assert!(out.starts_with("HTTP/1.1 413"), "{out:.200}");
        let out = send(review().to_string().into_bytes()).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{out:.200}");
    }

    /// `/metrics` over a socket: the house families alone, or followed by HAMi's with
    /// `--hami-metrics`, in one exposition (one `# EOF`).
    #[tokio::test]
    async fn metrics_with_and_without_hami_families() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let fake = FakeApiServer::new().group("resource.k8s.io", &["v1"]);
        let scrape = |shared: Arc<Shared>| async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(http::serve(
                listener,
                probes(shared),
                Limits::PROBES,
                None,
                std::future::pending(),
            ));
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            // As Prometheus asks (a reader that does not gets text 0.0.4, without `# EOF`).
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: m\r\nAccept: application/openmetrics-text;version=1.0.0\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
            String::from_utf8_lossy(&out).to_string()
        };
        let off = scrape(shared(&fake)).await;
        assert!(off.starts_with("HTTP/1.1 200"), "{off:.200}");
        assert!(off.contains("fgpu_controller_gpus 0"), "{off}");
        assert!(!off.contains("hami_"), "{off}");

        let mut gpu = fgpu_driver::engine::Gpu::new("gpu-0", "Tesla T4", 16 << 30);
        gpu.uuid = "GPU-t4".into();
        gpu.memory_free = 12 << 30;
        let inv = fgpu_driver::engine::Inventory {
            nodes: vec![fgpu_driver::engine::Node::new("node-a", vec![gpu])],
        };
        let hami = crate::hami_metrics::HamiMetrics::new();
        hami.set(&inv, &[vec![1]]);
        let on = Arc::new(Shared {
            hami: Some(hami),
            ..Shared::for_tests(fake.client())
        });
        let text = scrape(on).await;
        assert!(text.contains("fgpu_controller_gpus 0"), "{text}");
        assert!(
            text.contains(
                "hami_gpu_memory_allocated_bytes{zone=\"vGPU\",node=\"node-a\",device_uuid=\"GPU-t4\",device_index=\"\",device_cores=\"100\",device_type=\"NVIDIA-Tesla T4\"} 4294967296.0"
            ),
            "{text}"
        );
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }
}
