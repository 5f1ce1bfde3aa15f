//! The scheduler extender of the legacy path (clusters below 1.32, HAMi-compatible pods):
//! `/filter`, `/prioritize` and `/bind` over the allocation engine (issue 9,
//! `docs/extender.md`).
//!
//! * [`annotations`]: the node inventory annotation (`<driver>/node-gpus`, written by the
//!   node plugin) and the pod assignment annotation (`<driver>/assigned-devices`, written
//!   at bind, read by the device plugin's `Allocate`): formats and strict parsing.
//! * a pod's `nvidia.com/*` resources and HAMi annotations → one engine request per
//!   container, and the pod's policy: [`fgpu_driver::hami`] (the DRA controller reads pod
//!   annotations through it too).
//! * [`error`]: why a verb refused a pod ([`PodError`]) and why a node takes no GPU pods;
//!   their texts are what kube-scheduler shows.
//! * [`state`]: the node cache and ledger ([`Extender::sync`] from lists of nodes and
//!   pods), and the verbs. Bind reserves under a per-node mutex, then writes with no lock
//!   held (optimistic; no node lock).
//! * [`cache`]: filter's per-node results kept for the next pod of the same shape, keyed
//!   by the pod's shape, the node's generation and the workload model's epoch.
//! * [`writer`]: the [`ClusterWriter`] trait, an in-memory cluster and the kube-rs one.
//! * [`inventory`]: the cluster's GPUs as the webhook checks pods against them.
//! * [`webhook`]: the mutating admission webhook for pods asking for the legacy
//!   resources (scheduler name, defaults, admission-time refusals).
//! * [`http`]: the endpoints (the extender over HTTP; the webhook over HTTPS), served by
//!   the plumbing's server layer.
//! * [`metrics`]: the Prometheus families (verbs by outcome, latency, pods pending by
//!   reason, webhook admissions, nodes reused or evaluated by the filter cache), on
//!   `/metrics` at `--metrics-address`.
//! * [`watch`]: wakes the resync when a pod with a decision goes or a node's inventory
//!   changes (between the periodic lists).
//!
//! [`run`] is the daemon (`fgpu-controller extender`): resync from the API server every
//! few seconds, serve the extender (plain HTTP, loopback only: it has no authentication, so
//! it runs in the fgpu kube-scheduler's pod and only that scheduler can reach it) and,
//! with `--webhook-addr`, the admission webhook (HTTPS); `/metrics` and `/healthz` on
//! `--metrics-address` (plain HTTP).

pub mod annotations;
pub mod cache;
pub mod error;
pub mod http;
pub mod inventory;
pub mod metrics;
pub mod state;
pub mod watch;
pub mod webhook;
pub mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fgpu_api::names::{DriverName, LegacyResourceNames};
use fgpu_driver::engine::Policy;

pub use error::PodError;
pub use state::{CacheStats, Extender, ExtenderConfig, SyncReport};
pub use writer::{ClusterWriter, KubeCluster, MemoryCluster, WriteError};

/// Default `--metrics-address` (loopback, like the controller's; the chart names the pod's).
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:19502";

/// `fgpu-controller extender`: the kube-scheduler extender for clusters below 1.32.
#[derive(clap::Args, Debug, Clone)]
pub struct ExtenderArgs {
    /// Address to serve the extender on (plain HTTP; kube-scheduler's `urlPrefix`). A
    /// loopback address only (127.0.0.0/8, ::1): /filter, /prioritize and /bind have no
    /// authentication, and the extender's account can bind pods and write their GPU grants,
    /// so it runs in the fgpu kube-scheduler's pod and listens where only that pod reaches
    /// it. Any address with --extender-client-ca (mutual TLS). `--listen` is the older
    /// spelling.
    #[arg(long, alias = "listen", default_value = "127.0.0.1:8888")]
    pub extender_address: SocketAddr,
    /// PEM CA certificate(s) that sign the kube-scheduler's client certificate: the
    /// extender then serves its verbs over HTTPS with the webhook's --tls-cert/--tls-key and
    /// refuses every client without such a certificate (mutual TLS; kube-scheduler's
    /// extender `tlsConfig` with `enableHTTPS: true`), and may listen on any address.
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_key"])]
    pub extender_client_ca: Option<std::path::PathBuf>,
    /// Plain HTTP: /metrics (Prometheus) and /healthz, on their own port: unlike the verbs
    /// they may be served off loopback (the Helm chart serves them on the pod's address).
    #[arg(
        long,
        value_name = "ADDR",
        env = "FGPU_METRICS_ADDRESS",
        default_value = DEFAULT_METRICS_ADDRESS
    )]
    pub metrics_address: SocketAddr,
    /// The user the API server authenticates this extender as (its service account,
    /// `system:serviceaccount:<namespace>:<name>`): the only user the webhook lets set,
    /// change or remove a pod's GPU assignment annotation. Default: asked of the API server
    /// at start (SelfSubjectReview, authentication.k8s.io/v1, 1.28+).
    #[arg(long, env = "FGPU_EXTENDER_USER", value_name = "USER")]
    pub extender_user: Option<String>,
    /// The driver name (annotation prefix).
    #[arg(long, env = "FGPU_DRIVER_NAME", default_value = fgpu_api::names::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// Default placement policy, `<node>/<gpu>` (HAMi's default: binpack/spread); pods
    /// override it with `hami.io/node-scheduler-policy` and `hami.io/gpu-scheduler-policy`.
    /// `--policy` is the older spelling.
    /// fgd and fragaware (e.g. `fragaware/binpack`) score against the GPU requests of the
    /// pods seen lately and place by binpack at node level until one is seen.
    #[arg(long, alias = "policy", default_value = "binpack/spread")]
    pub default_policy: String,
    /// Seconds it takes a pod's weight in the workload model (fgd, fragaware) to halve.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub workload_half_life_seconds: u64,
    /// Evaluate every candidate node for every pod: do not reuse filter's per-node
    /// results for the next pod of the same shape on the nodes that did not change
    /// (docs/extender.md, "Reusing filter's results"). For comparisons; the answers are
    /// the same either way.
    #[arg(long, env = "FGPU_EXTENDER_NO_FILTER_CACHE")]
    pub no_filter_cache: bool,
    /// Seconds between two reads of all nodes and pods (capacity and grants).
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub resync_seconds: u64,
    /// Seconds a bind's reservation is kept while the pod list does not show it.
    #[arg(long, default_value_t = 300)]
    pub reservation_grace_seconds: u64,
    /// Extended resource: number of GPUs.
    #[arg(long, default_value = fgpu_api::names::legacy::RESOURCE_GPU)]
    pub resource_gpu: String,
    /// Extended resource: MiB per GPU.
    #[arg(long, default_value = fgpu_api::names::legacy::RESOURCE_MEMORY)]
    pub resource_memory: String,
    /// Extended resource: percent of each GPU's memory.
    #[arg(long, default_value = fgpu_api::names::legacy::RESOURCE_MEMORY_PERCENTAGE)]
    pub resource_memory_percentage: String,
    /// Extended resource: percent of each GPU's SMs.
    #[arg(long, default_value = fgpu_api::names::legacy::RESOURCE_CORES)]
    pub resource_cores: String,
    #[command(flatten)]
    pub kube: fgpu_plumbing::client::KubeArgs,
    #[command(flatten)]
    pub webhook: fgpu_plumbing::server::WebhookArgs,
    /// `spec.schedulerName` the webhook gives pods asking for the GPU resources (pods with
    /// no scheduler name or `default-scheduler`); the profile name of the kube-scheduler
    /// that calls this extender. Filter, prioritize and bind refuse pods naming another.
    #[arg(long, default_value = webhook::DEFAULT_SCHEDULER_NAME)]
    pub scheduler_name: String,
    /// MiB per GPU the webhook adds to containers that ask for GPUs but name neither
    /// memory nor a memory percentage; 0: none added, such containers get each GPU's whole
    /// memory (HAMi's `defaultMemory`).
    #[arg(long, default_value_t = 0)]
    pub default_gpumem: u64,
    /// Percent of the SMs the webhook adds to containers that ask for GPUs but name no
    /// cores (0-100); 0: none added (no core quota; HAMi's `defaultCores`).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub default_gpucores: u64,
}

impl ExtenderArgs {
    /// The webhook's configuration, with `extender_user` the user allowed to write the
    /// assignment annotation; errors name the flag.
    pub fn webhook_config(&self, extender_user: &str) -> Result<webhook::WebhookConfig> {
        let ext = self.config()?;
        anyhow::ensure!(
            !extender_user.trim().is_empty(),
            "--extender-user: empty; name the user the extender authenticates as (system:serviceaccount:<namespace>:<name>)"
        );
        Ok(webhook::WebhookConfig {
            extender_user: extender_user.to_owned(),
            scheduler_name: self.scheduler_name.clone(),
            names: ext.names,
            default_memory_mib: self.default_gpumem,
            default_cores: self.default_gpucores,
            driver: ext.driver,
            default_policy: ext.default_policy,
        })
    }

    /// The extender's configuration; errors name the flag.
    pub fn config(&self) -> Result<ExtenderConfig> {
        anyhow::ensure!(
            !self.scheduler_name.trim().is_empty(),
            "--scheduler-name: empty; name the profile of the scheduler that calls the extender"
        );
        let driver = DriverName::new(self.driver_name.clone()).context("--driver-name")?;
        let default_policy: Policy = self.default_policy.parse().context("--default-policy")?;
        Ok(ExtenderConfig {
            driver,
            names: LegacyResourceNames {
                gpu: self.resource_gpu.clone(),
                memory: self.resource_memory.clone(),
                memory_percentage: self.resource_memory_percentage.clone(),
                cores: self.resource_cores.clone(),
            },
            default_policy,
            reservation_grace: Duration::from_secs(self.reservation_grace_seconds),
            serialize_node_binds: false,
            scheduler_name: self.scheduler_name.clone(),
            workload_half_life: Duration::from_secs(self.workload_half_life_seconds),
            filter_cache: !self.no_filter_cache,
        })
    }
}

/// `Err` (naming the flag, the address and what is valid) unless `addr` is a loopback
/// address or `mutual_tls` is on: without client certificates the extender's verbs have no
/// authentication (see `--extender-address`).
pub fn check_extender_address(addr: SocketAddr, mutual_tls: bool) -> Result<()> {
    anyhow::ensure!(
        mutual_tls || addr.ip().is_loopback(),
        "--extender-address {addr}: not a loopback address; /filter, /prioritize and /bind have no \
         authentication, so the extender serves them only on 127.0.0.1 or [::1], in the fgpu \
         kube-scheduler's pod (its urlPrefix http://127.0.0.1:<port>), or anywhere with mutual TLS \
         (--extender-client-ca)"
    );
    Ok(())
}

/// The TLS configuration of the extender's verbs: mutual TLS with the webhook's serving
/// pair when `--extender-client-ca` is given, else none (plain HTTP on loopback).
pub fn extender_tls(args: &ExtenderArgs) -> Result<Option<Arc<rustls::ServerConfig>>> {
    let Some(ca) = &args.extender_client_ca else {
        return Ok(None);
    };
    let (Some(cert), Some(key)) = (&args.webhook.tls_cert, &args.webhook.tls_key) else {
        anyhow::bail!(
            "--extender-client-ca needs --tls-cert and --tls-key (the extender serves that pair)"
        );
    };
    Ok(Some(fgpu_plumbing::tls::server_config_mutual(
        cert,
        key,
        "--extender-client-ca",
        ca,
    )?))
}

/// The user the API server authenticates `client` as (SelfSubjectReview,
/// `authentication.k8s.io/v1`, Kubernetes 1.28+).
pub async fn whoami(client: &kube::Client) -> Result<String> {
    let body = serde_json::to_vec(&serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"
    }))?;
    let req = hyper::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(body)
        .context("building the SelfSubjectReview")?;
    let answer: serde_json::Value = client.request(req).await.context(
        "asking the API server who the extender is (SelfSubjectReview, 1.28+); pass --extender-user",
    )?;
    answer["status"]["userInfo"]["username"]
        .as_str()
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("the SelfSubjectReview names no user; pass --extender-user"))
}

/// Reads every node and every live pod and applies them to `ext`.
pub async fn resync(client: &kube::Client, ext: &Extender) -> Result<SyncReport> {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams};
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("listing nodes")?;
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed"))
        .await
        .context("listing pods")?;
    let nodes: Vec<fgpu_api::extender::Node> = nodes
        .items
        .iter()
        .filter_map(|n| serde_json::to_value(n).ok())
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    let pods: Vec<fgpu_api::extender::Pod> = pods
        .items
        .iter()
        .filter_map(|p| serde_json::to_value(p).ok())
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    Ok(ext.sync(&nodes, &pods, Instant::now()))
}

/// Runs the extender daemon until SIGTERM / Ctrl-C (`fgpu-controller extender`).
pub fn run(args: ExtenderArgs) -> Result<()> {
    fgpu_plumbing::tls_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(run_async(args))
}

/// The daemon's body, for callers that already run a Tokio runtime: [`serve`] with the
/// client the flags name, until SIGTERM / Ctrl-C.
pub async fn run_async(args: ExtenderArgs) -> Result<()> {
    let client = args.kube.client().await?;
    serve(args, client, fgpu_plumbing::shutdown::requested()).await
}

/// Serves the extender (and the webhook, with its flags) with `client` until `stop`
/// completes. A hung API server does not hold the stop: the periodic resync waits on it
/// too.
pub async fn serve(
    args: ExtenderArgs,
    client: kube::Client,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let config = args.config()?;
    let extender_tls = extender_tls(&args)?;
    check_extender_address(args.extender_address, extender_tls.is_some())?;
    let tls = args.webhook.tls()?;
    let webhook = match tls {
        Some((addr, tls)) => {
            let user = match &args.extender_user {
                Some(u) => u.clone(),
                None => whoami(&client).await?,
            };
            Some((addr, tls, Arc::new(args.webhook_config(&user)?)))
        }
        None => None,
    };
    let ext = Arc::new(Extender::new(config));
    let report = resync(&client, &ext).await.context("first resync")?;
    tracing::info!(
        nodes = report.nodes,
        pods = report.assigned_pods,
        "node cache loaded"
    );
    for e in &report.errors {
        tracing::warn!("{e}");
    }
    let listener = fgpu_plumbing::server::bind("--extender-address", args.extender_address).await?;
    tracing::info!(
        addr = %args.extender_address,
        scheduler = %args.scheduler_name,
        "scheduler extender ({})",
        if extender_tls.is_some() { "HTTPS, client certificates required" } else { "plain HTTP, loopback only" }
    );
    let metrics = fgpu_plumbing::server::bind("--metrics-address", args.metrics_address).await?;
    tracing::info!(addr = %args.metrics_address, "metrics and health endpoints (/metrics, /healthz)");
    let metrics_server = tokio::spawn(http::serve_metrics(metrics, ext.clone()));
    let writer = Arc::new(KubeCluster::new(client.clone()));
    let server = tokio::spawn(http::serve_tls(listener, ext.clone(), writer, extender_tls));
    let webhook_server = match webhook {
        Some((addr, tls, cfg)) => {
            let l = fgpu_plumbing::server::bind("--webhook-addr", addr).await?;
            tracing::info!(%addr, scheduler = %cfg.scheduler_name, extender_user = %cfg.extender_user, "admission webhook (HTTPS)");
            Some(tokio::spawn(http::serve_webhook(l, tls, ext.clone(), cfg)))
        }
        None => None,
    };
    let period = Duration::from_secs(args.resync_seconds.max(1));
    let mut last_errors = report.errors;
    // Resync at once when capacity is given back or changes, not only every period.
    let wake = Arc::new(tokio::sync::Notify::new());
    let watch = tokio::spawn(watch::wake_on_changes(
        client.clone(),
        ext.clone(),
        ext.config().driver.pod_assignment_annotation(),
        ext.config().driver.node_inventory_annotation(),
        wake.clone(),
    ));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            // A short pause gathers the events of one change (a deleted pod is updated,
            // then deleted) into one list.
            _ = wake.notified() => tokio::time::sleep(Duration::from_millis(100)).await,
            _ = &mut stop => break,
        }
        // A hung API server must not hold the exit: the resync itself waits on the stop
        // signal too (each request is bounded anyway, by the client's REQUEST_TIMEOUT).
        let resynced = tokio::select! {
            r = resync(&client, &ext) => r,
            _ = &mut stop => break,
        };
        match resynced {
            Ok(r) => {
                if r.errors != last_errors {
                    for e in &r.errors {
                        tracing::warn!("{e}");
                    }
                }
                last_errors = r.errors;
            }
            Err(e) => tracing::warn!("resync: {e:#}"),
        }
    }
    server.abort();
    metrics_server.abort();
    if let Some(w) = webhook_server {
        w.abort();
    }
    watch.abort();
    tracing::info!("stopped");
    Ok(())
}
