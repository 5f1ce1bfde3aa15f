//! What each coverage-guided fuzz target runs: one function per target, taking the
//! fuzzer's bytes and handing them to the product's own parser or decoder. The targets in
//! `fuzz/fuzz_targets/` are one-line calls of these; `tests/corpus.rs` feeds them every
//! committed corpus and regression file, so `cargo test` (hence `make test`) checks them
//! without libFuzzer. See `docs/reliability.md`, "Fuzzing".
//!
//! A target fails by panicking (libFuzzer reports a crash). Beyond "no panic", some check a
//! property the code promises; each says which. Bytes that are not UTF-8 are handed on the
//! way the product gets them: where it reads a file with `read_to_string`, as that error.
//!
//! | module | holds |
//! |---|---|
//! | [`files`] | the scratch files the shim and checkpoint targets write the bytes to |
//!
//! The targets, in [`TARGETS`] order: [`share_config`], [`quantity`], [`shim_limits`],
//! [`shim_account`], [`shim_core`], [`shim_feed`], [`checkpoint`], [`hami_annotations`],
//! [`assignment`], [`extender_request`], [`admission_review`], [`authority`],
//! [`fake_profile`].

pub mod files;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use fgpu_api::config::GpuShareConfig;
use fgpu_api::extender::{Node, Pod};
use fgpu_api::names::{DriverName, LegacyResourceNames};
use fgpu_api::{assignment as legacy, quantity as qty};
use fgpu_driver::backend::fake::FakeProfile;
use fgpu_driver::engine::{self, Gpu, Policy};
use fgpu_extender::webhook::WebhookConfig;
use fgpu_extender::{Extender, ExtenderConfig, MemoryCluster};
use fgpu_kubelet_plugin::authority;
use fgpu_kubelet_plugin::checkpoint::{CheckpointDir, CheckpointFile};
use http_body_util::Full;
use hyper::body::Bytes;

/// A target's function: the fuzzer's bytes in, a panic on failure.
pub type Target = fn(&[u8]);

/// Every target: its name (the directory under `fuzz/corpus/` and `fuzz/regressions/`,
/// and the binary under `fuzz/fuzz_targets/`) and its function.
pub const TARGETS: &[(&str, Target)] = &[
    ("share_config", share_config),
    ("quantity", quantity),
    ("shim_limits", shim_limits),
    ("shim_account", shim_account),
    ("shim_core", shim_core),
    ("shim_feed", shim_feed),
    ("checkpoint", checkpoint),
    ("hami_annotations", hami_annotations),
    ("assignment", assignment),
    ("extender_request", extender_request),
    ("admission_review", admission_review),
    ("authority", authority),
    ("fake_profile", fake_profile),
];

/// A GPU UUID the shim targets register (16 bytes, as the shim keys its files).
const UUID: [u8; 16] = *b"fgpu-fuzz-gpu-00";

/// The first byte picks a variant of a target (a verb, a file layout); the rest is the
/// input. Empty input: variant 0, no bytes.
fn split(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((b, rest)) => (*b, rest),
        None => (0, &[]),
    }
}

/// `GpuShareConfig` over arbitrary text (the claim's `opaque.parameters`, a config file).
pub fn share_config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = GpuShareConfig::parse(text, "spec.devices.config[0].opaque.parameters");
    }
}

/// Kubernetes quantities. Property: a quantity that parses formats back to the same value.
pub fn quantity(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(v) = qty::parse_u64(text) {
        let canonical = qty::format_u64(v);
        assert_eq!(
            qty::parse_u64(&canonical).ok(),
            Some(v),
            "{text:?} parsed to {v}, formatted as {canonical:?}"
        );
    }
}

/// The shim's limits file, both ways it is read: a claim's file (claim mode: parsed, then
/// merged into the process's view and configuration) and the env-mode file.
pub fn shim_limits(data: &[u8]) {
    use fgpu::claims::{Claim, View};
    use fgpu::config::Config;
    let text = String::from_utf8(data.to_vec()).map_err(|e| e.to_string());
    let path = std::path::PathBuf::from("/var/run/fgpu/claims/uid/limits");
    if let Ok(t) = &text {
        let _ = Claim::parse(path.clone(), t);
    }
    let no_env = |_: &str| None;
    let view = View::build(vec![(path, true, text.clone())]);
    let cfg = Config::from_claims(view, &no_env);
    let _ = (cfg.limit(0), cfg.core_limit(0), cfg.limit_of_uuid(&UUID));
    let cfg = Config::from_sources(text.as_deref().ok(), &no_env);
    let _ = (cfg.limit(0), cfg.core_limit(1), cfg.hooked());
}

/// Writes the bytes as a file of `size` bytes: variant even, the bytes over zeros (a file
/// of the right size, so the header and tables are read); odd, the bytes as they are.
fn sized_file(data: &[u8], size: usize) -> files::Scratch {
    let (variant, bytes) = split(data);
    let mut content = bytes.to_vec();
    if variant % 2 == 0 {
        content.resize(size.max(content.len()), 0);
        content.truncate(size);
    }
    files::Scratch::with("account", &content)
}

/// The shim's memory account file (claim mode) as raw bytes: opened, a GPU registered,
/// memory booked and given back, dead slots reaped.
pub fn shim_account(data: &[u8]) {
    let file = sized_file(data, fgpu::state::FILE_SIZE);
    let _ = fgpu::state::fuzz_account_file(file.path(), &UUID);
}

/// The shim's core (SM) limiter file (claim mode) as raw bytes: mapped, a GPU's entry found
/// or claimed.
pub fn shim_core(data: &[u8]) {
    let file = sized_file(data, fgpu::core::FILE_SIZE);
    let _ = fgpu::core::fuzz_core_file(file.path(), &UUID);
}

/// The node's utilisation feed as raw bytes, read as the shim reads it.
pub fn shim_feed(data: &[u8]) {
    let file = files::Scratch::with("feed", data);
    if let Some(feed) = fgpu::feed::read(file.path(), 0) {
        let _ = feed.sm_permille(&UUID);
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(feed) = fgpu::feed::Feed::parse(text)
    {
        let _ = (feed.fresh(u64::MAX), feed.sm_permille(&UUID));
    }
}

/// The kubelet plugin's checkpoint: the bytes as one claim's record (version 2, a
/// directory of records), or, variant odd, as the version 1 file; then loaded. Property:
/// loading never fails on content (only on I/O).
pub fn checkpoint(data: &[u8]) {
    let (variant, bytes) = split(data);
    let scratch = files::Scratch::dir();
    if variant % 2 == 0 {
        let dir = CheckpointDir::new(scratch.path().join("checkpoint"));
        std::fs::create_dir_all(dir.path()).expect("scratch directory");
        let uid = "0b3d8c1e-5f0a-4c56-9d2e-1f7a9b6c4d21";
        std::fs::write(dir.record_path(uid), bytes).expect("scratch record");
        if let Err(e) = dir.load("boot-1") {
            panic!("a record's content failed the load: {e}");
        }
    } else {
        let file = CheckpointFile::new(scratch.path().join("checkpoint.json"));
        std::fs::write(file.path(), bytes).expect("scratch checkpoint");
        if let Err(e) = file.load("boot-1") {
            panic!("the file's content failed the load: {e}");
        }
    }
}

/// A pod of the legacy (HAMi) path, as JSON: its resources and annotations read into a
/// request.
pub fn hami_annotations(data: &[u8]) {
    let names = LegacyResourceNames::default();
    if let Ok(pod) = serde_json::from_slice::<Pod>(data) {
        let _ = fgpu_driver::hami::pod_request(&pod, &names, Policy::BINPACK);
    }
    if let Ok(annotations) = serde_json::from_slice::<BTreeMap<String, String>>(data) {
        let _ = fgpu_driver::hami::pod_annotations(&annotations, "default/pod", Policy::BINPACK);
    }
}

/// The legacy path's annotation values: a pod's assignment, a node's inventory (as the API
/// type and as the extender's engine node); and the Volcano mode's, a pod's vGPU allocation
/// and a node's vGPU register. Property: a Volcano allocation that reads renders back to a
/// value that reads the same.
pub fn assignment(data: &[u8]) {
    let Ok(value) = std::str::from_utf8(data) else {
        return;
    };
    let driver = DriverName::default();
    let pod_ann = driver.pod_assignment_annotation();
    let node_ann = driver.node_inventory_annotation();
    if let Ok(a) = legacy::PodAssignment::parse("default/pod", &pod_ann, value) {
        let _ = fgpu_extender::annotations::grants(&a, "uid-1");
    }
    let _ = legacy::parse_node_gpus("node", &node_ann, value);
    let _ = fgpu_extender::annotations::parse_node_inventory("node", &node_ann, value);
    if let Ok(c) = fgpu_api::volcano::parse_pod_devices("default/pod", value) {
        let again = fgpu_api::volcano::parse_pod_devices(
            "default/pod",
            &fgpu_api::volcano::render_pod_devices(&c),
        );
        assert_eq!(
            again.as_ref(),
            Ok(&c),
            "a Volcano allocation changed on a round trip"
        );
    }
    let _ = fgpu_api::volcano::parse_register("node", value);
}

/// One runtime for the async targets (a current-thread one: the fuzzer is one thread).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// An extender that knows two nodes of two GPUs each.
fn extender() -> Arc<Extender> {
    let ext = Extender::new(ExtenderConfig::default());
    let ann = ext.config().driver.node_inventory_annotation();
    let nodes: Vec<Node> = ["node-a", "node-b"]
        .iter()
        .map(|name| {
            let gpus = (0..2)
                .map(|i| {
                    let mut g = Gpu::new(format!("gpu-{i}"), "NVIDIA A100-SXM4-80GB", 80 << 30);
                    g.uuid = format!("GPU-{name}-{i}");
                    g
                })
                .collect();
            let inv =
                fgpu_extender::annotations::render_node_inventory(&engine::Node::new(*name, gpus));
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "annotations": {ann.as_str(): inv}},
                "status": {}
            }))
            .expect("a node")
        })
        .collect();
    ext.sync(&nodes, &[], Instant::now());
    Arc::new(ext)
}

fn post(path: &str, body: &[u8]) -> http::Request<Full<Bytes>> {
    http::Request::post(path)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::copy_from_slice(body)))
        .expect("a request")
}

/// The extender's request bodies (filter, prioritize, bind by the variant) through its HTTP
/// handler. Property: no answer is a 500 (a panic in a verb comes back as one).
pub fn extender_request(data: &[u8]) {
    let (variant, body) = split(data);
    let path = ["/filter", "/prioritize", "/bind"][usize::from(variant % 3)];
    let ext = extender();
    let cluster = MemoryCluster::default();
    let response = runtime().block_on(fgpu_extender::http::handle(post(path, body), ext, &cluster));
    assert_ne!(
        response.status(),
        http::StatusCode::INTERNAL_SERVER_ERROR,
        "{path}: {response:?}"
    );
}

/// `AdmissionReview` bodies: the legacy webhook's handler (mutate or validate pods, by the
/// variant), the DRA controller's claim validation as its server runs it (decode, then
/// `admission::answer_claim_review`), and its HAMi pod translation (`hami_pods::review`).
/// Properties: no 500 from the legacy handler; a translated pod's template is named by
/// the hash of its spec.
pub fn admission_review(data: &[u8]) {
    let (variant, body) = split(data);
    let path = ["/mutate-pods", "/validate-pods"][usize::from(variant % 2)];
    let ext = extender();
    let cfg = WebhookConfig::default();
    let response = runtime().block_on(fgpu_extender::http::handle_webhook(
        post(path, body),
        &ext,
        &cfg,
    ));
    assert_ne!(
        response.status(),
        http::StatusCode::INTERNAL_SERVER_ERROR,
        "{path}: {response:?}"
    );

    use fgpu_dra_controller::admission;
    let Ok(review) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    let driver = DriverName::default();
    let (kind, object) = admission::review_object(&review);
    let _ = admission::high_priority_classes(object, kind, &driver);
    let answer = admission::answer_claim_review(&review, &driver, &admission::ClassPolicy::new());
    let _ = answer.to_string();
    let _ = admission::gate_patch(object, "gpu.fgpu.dev/allocate");

    use fgpu_dra_controller::hami_pods;
    let cfg = hami_pods::HamiConfig::new(driver);
    let _ = hami_pods::needs_gpu_sizes(&review, &cfg.names);
    if let hami_pods::Reviewed::Create { translation, .. } =
        hami_pods::review(&review, &cfg, &[80 << 30, 40 << 30])
    {
        let t = &translation.template;
        assert_eq!(
            hami_pods::template_name(t["apiVersion"].as_str().unwrap_or_default(), &t["spec"]),
            translation.template_name(),
            "the template's name is the hash of its spec"
        );
    }
}

/// The kubelet registration relay's `:authority` rewrite: the bytes as one HPACK header
/// block, and as a client's byte stream (variant even: after the HTTP/2 preface). Property:
/// a rewritten block is never longer than the original (the relay's HPACK argument).
pub fn authority(data: &[u8]) {
    if let Some(out) = authority::rewrite_header_block(data) {
        assert!(
            out.len() <= data.len(),
            "rewritten block grew: {} -> {} bytes",
            data.len(),
            out.len()
        );
    }
    let (variant, bytes) = split(data);
    let mut stream = Vec::with_capacity(bytes.len() + 24);
    if variant % 2 == 0 {
        stream.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    }
    stream.extend_from_slice(bytes);
    let mut out = Vec::new();
    let _ = runtime().block_on(authority::relay_client_to_server(&stream[..], &mut out));
}

/// The fake backend's device profile (YAML), then each node's inventory.
pub fn fake_profile(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(profile) = FakeProfile::parse(text, "profile.yaml") {
        for name in profile.node_names() {
            let _ = profile.node(&name);
        }
        let _ = profile.single_node(None);
    }
}
