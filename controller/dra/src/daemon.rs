//! `fgpu-controller run`: the allocation controller against a real API server.
//!
//! * One client (kubeconfig file or in-cluster), `resource.k8s.io` version by discovery
//!   (`v1`, else `v1beta2`, else `v1beta1`); claims, pods and slices are read as
//!   [`DynamicObject`]s, so one code path serves every version.
//! * Three reflectors (kube-rs runtime watchers): ResourceClaims and Pods of all
//!   namespaces, ResourceSlices; a fourth for DeviceTaintRules where the API server serves
//!   them (`v1`, `v1beta2` or `v1alpha3`, by discovery), whose taints join the slices'.
//!   Every watch event wakes the loop; it also runs every `--resync` seconds.
//! * One pass: snapshot of the stores (with the objects this process wrote and the watch
//!   has not delivered yet laid over them) → [`reconcile::plan`] → the writes, each
//!   conditional on the resource version it was planned from (a conflict is logged and
//!   retried by the next pass, never forced) → Events.
//! * Mode: `controller` allocates; `capacity` only lifts gates and releases what it
//!   allocated earlier (kube-scheduler allocates); `auto` is `capacity` when this driver's
//!   published devices kept `allowMultipleAllocations` (the API server has consumable
//!   capacity), else `controller`, decided again on every pass and logged when it changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};

use fgpu_plumbing::discovery;
use fgpu_plumbing::events::{self, EventType, Outbox, Reporter};
use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::Notify;

use fgpu_api::dra::class::DeviceClass;
use fgpu_api::dra::tolerant;
use fgpu_api::names::DriverName;
use fgpu_driver::engine::{Policy, WorkloadModel};

use crate::cache::{Overlay, ViewCache};
use crate::metrics::Metrics;
use crate::mirror::{Mirror, Packed, Packer};
use crate::reconcile::{self, Action, ObjectId, Settings, Views};
use crate::slim;
use crate::view::PodView;
use crate::write::{WriteError, fenced, write_allocation};
use fgpu_plumbing::leader::Fence;

pub use crate::shared::{Mode, ModeCell, Shared};
pub use fgpu_plumbing::discovery::GROUP;

/// `fgpu-controller run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub kube: fgpu_plumbing::client::KubeArgs,
    /// Allocation mode: auto (capacity when the cluster has consumable capacity, else
    /// controller), controller, or capacity (kube-scheduler allocates; serve only).
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    pub mode: Mode,
    /// Placement policy where the pod's annotations say nothing: binpack, spread,
    /// gpupacking, bestfit, fgd, fragaware, or `<node>/<gpu>`. fgd and fragaware score
    /// against the workload model (the claims seen lately); until it holds a claim on a
    /// GPU they place by binpack and the claim's Event says so.
    #[arg(long, default_value = "fragaware")]
    pub default_policy: String,
    /// Seconds it takes a claim's weight in the workload model to halve: the model follows
    /// the demand of about the last few half-lives and forgets the rest (after 30).
    #[arg(long, value_name = "SECONDS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub workload_half_life_seconds: u64,
    /// Weight of the usage-aware term: prefer GPUs whose load, as the node monitor measured
    /// it (claims' `status.devices`), leaves the claim's core quota headroom. The term is
    /// in [-1, 1] and is added to the policy's score times this weight; 0 turns it off.
    #[arg(long, value_name = "WEIGHT", default_value_t = 0.0, value_parser = crate::load::parse_weight)]
    pub usage_aware_weight: f64,
    /// A measured sample older than this many seconds counts as unknown load.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::load::DEFAULT_FRESH_SECONDS, value_parser = clap::value_parser!(u64).range(1..))]
    pub usage_fresh_seconds: u64,
    /// DRA driver name (the kubelet plugin's). `--driver` is the older spelling.
    #[arg(long, alias = "driver", env = "FGPU_DRIVER_NAME", default_value = fgpu_api::names::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// The shared DeviceClass the controller allocates; must be `shared.<driver>`.
    #[arg(long)]
    pub class: Option<String>,
    #[command(flatten)]
    pub webhook: fgpu_plumbing::server::WebhookArgs,
    /// Plain HTTP: /metrics, /healthz, /readyz. `--metrics-addr` is the older spelling.
    #[arg(
        long,
        alias = "metrics-addr",
        value_name = "ADDR",
        env = "FGPU_METRICS_ADDRESS",
        default_value = "127.0.0.1:19500"
    )]
    pub metrics_address: SocketAddr,
    /// Also serve HAMi's scheduler families on /metrics (`hami_gpu_memory_limit_bytes`,
    /// `hami_gpu_memory_allocated_bytes`, ...: HAMi's names, labels and units, 0-100 core
    /// "ratios" included), so that HAMi's dashboards work unchanged (docs/observability.md).
    #[arg(long, env = "FGPU_HAMI_METRICS")]
    pub hami_metrics: bool,
    /// Serve `POST /mutate-pods-dra`: pods that ask for GPUs with HAMi's resources and
    /// annotations are rewritten to use a ResourceClaimTemplate of the shared class, which
    /// the webhook creates in the pod's namespace (docs/controller.md, "HAMi pods on DRA").
    /// Off: the path answers 404.
    #[arg(long, env = "FGPU_HAMI_PODS")]
    pub hami_pods: bool,
    /// Seconds between passes when nothing changes. `--resync` is the older spelling.
    #[arg(long, alias = "resync", value_name = "SECONDS", default_value_t = 30)]
    pub resync_seconds: u64,
    /// Objects per page of the watches' lists (kube-rs's default is 500). A page is parsed
    /// whole before its objects are trimmed, and the three watches list at once: 500 slices
    /// of 8 devices are 44 MiB parsed, 100 are 9 MiB. Smaller pages lower the peak at
    /// start on big clusters at the cost of more list requests.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub list_page_size: u32,
    /// Milliseconds an allocation of this controller must have been seen before its pod's
    /// gate is lifted. In that time a grant kube-scheduler decided concurrently (it shares
    /// no lock with the controller) lands, and the controller gives way if the two
    /// over-book a GPU. 0 lifts gates at once (safe only where no other allocator writes
    /// shares of this driver's devices).
    #[arg(long, default_value_t = 3000)]
    pub settle_ms: u64,
    /// Allocations of one pass written at once (each: finalizer patch, status replace, two
    /// Events), and pods of one pass ungated at once. The plan is made first, one claim
    /// after another, so writing them together cannot over-grant: a write that fails
    /// frees what it planned to take. 1 writes them one after another.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub concurrent_writes: u32,
    /// Allocations planned in one pass at most. Each waits in memory (its claim and
    /// allocation) until written; the pass after plans the next ones. Every pass walks all
    /// claims and pods, so under a flood of claims larger passes spend less of the time
    /// planning, at the cost of memory, of later writes for the last claims planned, and
    /// of Events: two per allocation share a queue of 4,096 (the surplus is dropped and
    /// counted).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub allocations_per_pass: u32,
    /// Leader election: allocate only while holding the Lease `fgpu-controller` in this
    /// namespace (every replica serves the webhooks). Without it, run one replica.
    #[arg(long)]
    pub leader_election_namespace: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "fgpu-controller")]
    pub leader_election_lease: String,
    /// Seconds the Lease holds after the leader's last renewal (a standby takes over at most
    /// this plus the retry period after the leader stopped renewing).
    #[arg(long, value_name = "SECONDS", default_value_t = fgpu_plumbing::leader::LEASE_SECONDS)]
    pub leader_election_lease_seconds: i32,
    /// Seconds between the leader's renewals; below the lease less the retry period.
    #[arg(long, value_name = "SECONDS", default_value_t = fgpu_plumbing::leader::RENEW.as_secs())]
    pub leader_election_renew_seconds: u64,
    /// Seconds between a standby's attempts to take the Lease.
    #[arg(long, value_name = "SECONDS", default_value_t = fgpu_plumbing::leader::RETRY.as_secs())]
    pub leader_election_retry_seconds: u64,
}

/// A claim as the mirror keeps it: trimmed ([`slim::claim`]), as packed text.
fn claim_entry(mut o: DynamicObject, packer: &Packer) -> Option<Packed> {
    slim::claim(&mut o);
    packer.pack(&o)
}

/// A pod as the mirror keeps it: its view, when it can matter to a plan at all
/// ([`slim::pod_matters`]); read from the trimmed pod ([`slim::pod`]), the fields
/// `slim::tests` checks plans against.
fn pod_entry(mut o: DynamicObject, gate: &str) -> Option<PodView> {
    if !slim::pod_matters(&o, gate) {
        return None;
    }
    slim::pod(&mut o);
    let whole = serde_json::to_value(&o).ok()?;
    Some(PodView::of(&whole, gate))
}

/// A slice as the mirror keeps it: this driver's only, trimmed ([`slim::slice`]), as
/// packed text.
fn slice_entry(mut o: DynamicObject, driver: &str, packer: &Packer) -> Option<Packed> {
    if o.data["spec"]["driver"].as_str() != Some(driver) {
        return None;
    }
    slim::slice(&mut o);
    packer.pack(&o)
}

/// The mirror's copy of a DeviceTaintRule that may select this driver's devices (its
/// selector names no driver, or this one).
fn taint_rule_entry(o: DynamicObject, driver: &str, packer: &Packer) -> Option<Packed> {
    match o.data["spec"]["deviceSelector"]["driver"].as_str() {
        Some(d) if !d.is_empty() && d != driver => None,
        _ => packer.pack(&o),
    }
}

/// Runs the daemon until SIGTERM / Ctrl-C: checks the flags, connects, starts the
/// servers, then reconciles (as the leader, with `--leader-election-namespace`).
pub fn run(args: RunArgs) -> Result<()> {
    fgpu_plumbing::tls_provider();
    let settings = settings_of(&args)?;
    let timings = fgpu_plumbing::leader::Timings::new(
        args.leader_election_lease_seconds,
        args.leader_election_renew_seconds,
        args.leader_election_retry_seconds,
    )?;
    let tls = args.webhook.tls()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shared = connect(&args, &settings.driver).await?;
        crate::server::spawn_plain(args.metrics_address, shared.clone()).await?;
        if let Some((addr, cfg)) = tls {
            crate::server::spawn_webhooks(addr, cfg, shared.clone()).await?;
        }
        let mut ctl = Controller::new(shared.clone(), settings, args.mode);
        ctl.settle = Duration::from_millis(args.settle_ms);
        ctl.list_page = args.list_page_size;
        ctl.concurrent_writes = args.concurrent_writes as usize;
        ctl.allocations_per_pass = args.allocations_per_pass as usize;
        let resync = Duration::from_secs(args.resync_seconds.max(1));
        match &args.leader_election_namespace {
            None => tokio::select! {
                r = ctl.run(resync) => r,
                _ = shutdown() => {
                    tracing::info!("shutting down");
                    Ok(())
                }
            },
            Some(ns) => {
                lead(
                    ctl,
                    &shared,
                    ns,
                    &args.leader_election_lease,
                    resync,
                    timings,
                )
                .await
            }
        }
    })
}

/// The settings the flags give: a valid driver name, `--class` (when set) its shared
/// class, a valid default policy.
fn settings_of(args: &RunArgs) -> Result<Settings> {
    let driver = DriverName::new(args.driver_name.clone())
        .map_err(|e| anyhow::anyhow!("--driver-name: {e}"))?;
    if let Some(class) = &args.class
        && *class != driver.shared_class()
    {
        bail!(
            "--class {class}: the controller allocates the shared class of --driver-name {}, {}; set --driver-name {} or drop --class",
            driver.as_str(),
            driver.shared_class(),
            class.strip_prefix("shared.").unwrap_or(class)
        );
    }
    let default_policy: Policy = args
        .default_policy
        .parse()
        .map_err(|e| anyhow::anyhow!("--default-policy: {e}"))?;
    Ok(Settings {
        driver,
        default_policy,
        workload_half_life: Duration::from_secs(args.workload_half_life_seconds),
        usage_aware: crate::load::UsageAware {
            weight: args.usage_aware_weight,
            fresh: Duration::from_secs(args.usage_fresh_seconds),
        },
    })
}

/// Connects to the API server, picks the `resource.k8s.io` version, and builds what the
/// loop and the servers share (the mode fixed unless `auto`).
async fn connect(args: &RunArgs, driver: &DriverName) -> Result<Arc<Shared>> {
    let client = args.kube.client().await?;
    let api = discovery::negotiate(&client).await?;
    tracing::info!(
        api = api.api_version(),
        mode = args.mode.as_str(),
        driver = driver.as_str(),
        "connected"
    );
    let shared = Arc::new(Shared {
        driver: driver.clone(),
        api,
        client,
        mode: ModeCell::default(),
        metrics: Metrics::new(),
        hami: args
            .hami_metrics
            .then(crate::hami_metrics::HamiMetrics::new),
        ready: AtomicBool::new(false),
        hami_pods: args.hami_pods,
    });
    if args.mode != Mode::Auto {
        shared.mode.set(args.mode);
    }
    Ok(shared)
}

/// This replica's leader-election identity: the pod (or host) name and a fresh UUID.
fn candidate_identity() -> String {
    format!(
        "{}_{}",
        std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "fgpu-controller".into()),
        uuid::Uuid::new_v4()
    )
}

/// Waits (ready, serving the webhooks) until this replica holds the Lease `lease` in
/// `ns`, then reconciles while it holds it; releases it on the way out.
async fn lead(
    mut ctl: Controller,
    shared: &Shared,
    ns: &str,
    lease: &str,
    resync: Duration,
    timings: fgpu_plumbing::leader::Timings,
) -> Result<()> {
    let mut elector =
        fgpu_plumbing::leader::Elector::new(shared.client.clone(), ns, lease, candidate_identity())
            .with_timings(timings);
    // Every claim write of the controller passes this fence (crate::write).
    ctl.fence = elector.fence();
    // A standby serves the webhooks: ready. The leader is ready once its caches sync.
    shared.ready.store(true, Ordering::Relaxed);
    let work = async {
        shared.ready.store(false, Ordering::Relaxed);
        ctl.run(resync).await
    };
    match elector.lead(shutdown(), work).await {
        Led::Stopped => {
            tracing::info!("shutting down");
            Ok(())
        }
        Led::Done(r) => r,
        Led::Lost(e) => Err(e.into()),
    }
}

use fgpu_plumbing::leader::Led;
use fgpu_plumbing::shutdown::requested as shutdown;

/// A claim whose allocation kube-scheduler cleared.
struct Retry {
    /// Nodes it was allocated on and cleared from.
    avoid: std::collections::BTreeSet<String>,
    attempts: u32,
    /// Not before.
    next: Instant,
}

/// Backoff after the `attempts`-th clearing: none the first time (kube-scheduler backs the
/// pod off for at least a second, and would allocate the claim itself meanwhile), then 1 s,
/// 2 s, 4 s, ... at most 256 s.
fn backoff(attempts: u32) -> Duration {
    fgpu_plumbing::backoff::nth_delay(attempts, 1, Duration::from_secs(1), 8)
}

/// Events waiting for the API server before more are dropped ([`Outbox`]): one per claim
/// of a pass's 128 allocations (`--allocations-per-pass`'s default), many times over.
const EVENT_QUEUE: usize = 4096;

/// Events created at once, beside (not within) the allocation writes. Enough to keep up
/// with one Event per claim at the rate the writes reach: a queue that falls behind holds
/// its Events in memory (4 at once let 10,000 claims peak 4 MiB higher; docs/controller.md,
/// "Where the time goes").
const EVENTS_IN_FLIGHT: usize = 8;

/// How long a read of the shared DeviceClass is used before it is read again (classes
/// change rarely; a change reaches allocations within this time).
const CLASS_REFRESH: Duration = Duration::from_secs(30);

struct Controller {
    shared: Arc<Shared>,
    settings: Settings,
    configured: Mode,
    /// The mode of the last pass (logged and exported when it changes).
    decided: Option<Mode>,
    /// `reportingController` / `reportingInstance` of the Events it publishes.
    reporter: Reporter,
    /// Where Events go: created in the background, never awaited by a pass or a write.
    events: Outbox,
    claims_ar: ApiResource,
    overlay: Overlay,
    /// The views of the stored objects and the inventory, kept between passes.
    views: ViewCache,
    /// A hash of the last Event message per hash of (object UID, reason), so a waiting
    /// claim is told once per change, not once per pass (two entries per claim: 16 bytes
    /// each, not a UID and a message).
    told: HashMap<u64, u64>,
    /// Node each claim was allocated on by this process (hash of the claim UID → node).
    allocated_on: HashMap<u64, String>,
    /// Claims whose allocation kube-scheduler cleared (claim UID →).
    retries: HashMap<String, Retry>,
    /// When each allocated claim was first seen allocated (hash of the claim UID →).
    seen_allocated: HashMap<u64, Instant>,
    /// How long an allocation must have been seen before its pod is ungated.
    settle: Duration,
    /// Objects per page of the watches' lists.
    list_page: u32,
    /// Allocations and ungates written at once ([`Controller::act_writes`]).
    concurrent_writes: usize,
    /// At most this many allocations are planned in one pass ([`Views::max_allocations`]):
    /// each waits in memory, allocation and all, until its turn to be written. The pass
    /// after takes the next ones at once.
    allocations_per_pass: usize,
    /// The earliest moment an unsettled allocation settles (a pass is due then).
    next_settle: Option<Instant>,
    /// The shared DeviceClass as last read (None: it does not exist), and when.
    class: Option<(Instant, Option<DeviceClass>)>,
    /// The claims seen lately, for fgd and fragaware (rebuilt from the claims at start).
    model: WorkloadModel,
    /// The leader's fence every claim and pod write passes (open without leader election).
    fence: Fence,
}

/// A 64-bit hash of `v` (what the controller remembers instead of the value itself).
fn hash_of(v: impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// The mode of a pass and why: `auto` is `capacity` when this driver's devices are
/// consumable, else `controller`; any other configured mode is kept.
fn decide_mode(configured: Mode, consumable: bool) -> (Mode, &'static str) {
    match configured {
        Mode::Auto if consumable => (
            Mode::Capacity,
            "auto: this driver's devices kept allowMultipleAllocations (consumable capacity)",
        ),
        Mode::Auto => (
            Mode::Controller,
            "auto: no device of this driver allows multiple allocations (no consumable capacity, or no slice yet)",
        ),
        m => (m, "set by --mode"),
    }
}

impl Controller {
    fn new(shared: Arc<Shared>, settings: Settings, configured: Mode) -> Self {
        let instance = std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| "fgpu-controller".into());
        let model = WorkloadModel::new(settings.workload_half_life);
        let events = Outbox::spawn(shared.client.clone(), EVENT_QUEUE, EVENTS_IN_FLIGHT);
        Self {
            events,
            reporter: Reporter {
                controller: "fgpu-controller".into(),
                instance,
            },
            claims_ar: discovery::claims(shared.api),
            shared,
            settings,
            configured,
            decided: None,
            overlay: Overlay::default(),
            views: ViewCache::default(),
            told: HashMap::new(),
            allocated_on: HashMap::new(),
            retries: HashMap::new(),
            seen_allocated: HashMap::new(),
            settle: Duration::from_secs(3),
            list_page: 100,
            concurrent_writes: 16,
            allocations_per_pass: 128,
            next_settle: None,
            class: None,
            model,
            fence: Fence::open(),
        }
    }

    /// The shared DeviceClass, read again when the last read is older than
    /// [`CLASS_REFRESH`]; a failed read keeps the last copy.
    async fn device_class(&mut self) -> Option<DeviceClass> {
        if let Some((at, class)) = &self.class
            && at.elapsed() < CLASS_REFRESH
        {
            return class.clone();
        }
        let ar = fgpu_plumbing::discovery::device_classes(self.shared.api);
        let api: Api<DynamicObject> = Api::all_with(self.shared.client.clone(), &ar);
        let name = self.settings.driver.shared_class();
        let read = match api.get_opt(&name).await {
            Ok(o) => o
                .and_then(|o| serde_json::to_value(o).ok())
                .map(|v| tolerant::from_value(&v)),
            Err(e) => {
                tracing::warn!(class = %name, "reading the DeviceClass failed (its config is left out until it can be read): {e}");
                self.class.as_ref().and_then(|(_, c)| c.clone())
            }
        };
        self.class = Some((Instant::now(), read.clone()));
        read
    }

    fn claims(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.shared.client.clone(), namespace, &self.claims_ar)
    }

    /// Whether this controller may list `ar` (false only on Forbidden: an RBAC that
    /// predates the resource; other failures are the watch's to retry).
    async fn may_list(&self, ar: &ApiResource) -> bool {
        let api: Api<DynamicObject> = Api::all_with(self.shared.client.clone(), ar);
        !matches!(
            api.list(&kube::api::ListParams::default().limit(1)).await,
            Err(kube::Error::Api(s)) if s.is_forbidden()
        )
    }

    async fn run(&mut self, resync: Duration) -> Result<()> {
        let client = self.shared.client.clone();
        let wake = Arc::new(Notify::new());
        let slices_ar = fgpu_plumbing::discovery::slices(self.shared.api);
        let mut claims = Mirror::start(
            Api::all_with(client.clone(), &self.claims_ar),
            "resourceclaims",
            self.list_page,
            wake.clone(),
            Box::new({
                let packer = Packer::default();
                move |o| claim_entry(o, &packer)
            }),
        );
        let gate = self.settings.driver.scheduling_gate();
        let mut pods = Mirror::start(
            Api::all_with(client.clone(), &discovery::pods()),
            "pods",
            self.list_page,
            wake.clone(),
            Box::new(move |o| pod_entry(o, &gate)),
        );
        // Other drivers' slices are not read (plan and the mode both filter by driver).
        let driver = self.settings.driver.as_str().to_owned();
        let mut slices = Mirror::start(
            Api::all_with(client.clone(), &slices_ar),
            "resourceslices",
            self.list_page,
            wake.clone(),
            Box::new({
                let packer = Packer::default();
                move |o| slice_entry(o, &driver, &packer)
            }),
        );
        // The admins' DeviceTaintRules, where the API server serves them.
        let mut rules = match discovery::device_taint_rules(&client).await {
            Ok(Some(ar)) if !self.may_list(&ar).await => {
                tracing::warn!(
                    "not allowed to list DeviceTaintRules (grant list and watch on devicetaintrules.resource.k8s.io, as deploy/controller/rbac.yaml does): only the slices' device taints are read"
                );
                None
            }
            Ok(Some(ar)) => {
                let driver = self.settings.driver.as_str().to_owned();
                Some(Mirror::start(
                    Api::all_with(client.clone(), &ar),
                    "devicetaintrules",
                    self.list_page,
                    wake.clone(),
                    Box::new({
                        let packer = Packer::default();
                        move |o| taint_rule_entry(o, &driver, &packer)
                    }),
                ))
            }
            Ok(None) => {
                tracing::info!(
                    "the API server serves no DeviceTaintRules: only the slices' device taints are read"
                );
                None
            }
            Err(e) => {
                tracing::warn!(
                    "discovering DeviceTaintRules failed ({e}); only the slices' device taints are read until a restart"
                );
                None
            }
        };
        let lists = [
            (claims.ready().await, "resourceclaims"),
            (pods.ready().await, "pods"),
            (slices.ready().await, "resourceslices"),
        ];
        for (r, what) in lists {
            r.with_context(|| format!("the {what} watch stopped before its first list"))?;
        }
        if let Some(rules) = &mut rules {
            rules
                .ready()
                .await
                .context("the devicetaintrules watch stopped before its first list")?;
        }
        self.shared.ready.store(true, Ordering::Relaxed);
        tracing::info!("caches synced; reconciling");
        loop {
            // A leader whose fence closed plans nothing more: it no longer leads.
            self.fence.check()?;
            let started = Instant::now();
            if let Some(rules) = &rules {
                self.views.set_taint_rules(rules.state());
            }
            let wrote = self.pass(&claims, &pods, &slices).await;
            self.shared
                .metrics
                .pass_seconds
                .observe(started.elapsed().as_secs_f64());
            if wrote {
                // Writes change what the next pass sees (a pod to ungate): go again now.
                continue;
            }
            let now = Instant::now();
            let sleep = self
                .retries
                .values()
                .filter(|r| r.next > now)
                .map(|r| r.next - now)
                .chain(self.next_settle.map(|t| t.saturating_duration_since(now)))
                .min()
                .map_or(resync, |d| d.min(resync));
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
            }
            // Let a burst of watch events settle into one pass.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// One pass; true when something was written: refresh the views, decide the mode,
    /// track the claims' allocations, plan ([`reconcile::plan_views`]), perform the plan.
    async fn pass(
        &mut self,
        claims: &Mirror<Packed>,
        pods: &Mirror<PodView>,
        slices: &Mirror<Packed>,
    ) -> bool {
        let started = Instant::now();
        self.views.refresh(
            &self.settings.driver,
            claims.state(),
            pods.state(),
            &slices.state(),
            &mut self.overlay,
        );
        let consumable = self.views.consumable;
        let mode = self.note_mode(consumable);
        let (cleared, unsettled) = self.track_allocations(Instant::now());
        self.tell_cleared(cleared).await;
        let avoid: BTreeMap<String, BTreeSet<String>> = self
            .retries
            .iter()
            .map(|(uid, r)| (uid.clone(), r.avoid.clone()))
            .collect();
        let class = if mode == Mode::Controller {
            self.device_class().await
        } else {
            None
        };
        let plan = {
            let claim_views = self.views.claims();
            let now = Timestamp::now().as_second();
            reconcile::observe_claims(
                &mut self.model,
                &claim_views,
                &self.views.inventory.inventory,
            );
            self.model.prune(now);
            let pod_views = self.views.pods();
            let whole = |id: &ObjectId| self.views.typed_claim(&self.overlay, id);
            let views = Views {
                claims: &claim_views,
                pods: &pod_views,
                inventory: &self.views.inventory,
                consumable,
                claim: &whole,
                avoid: &avoid,
                unsettled: &unsettled,
                class: class.as_ref(),
                max_allocations: self.allocations_per_pass,
                model: Some(&self.model),
                now,
            };
            reconcile::plan_views(views, &self.settings, mode == Mode::Controller)
        };
        self.report_plan(&plan);
        // Only the actions are left to perform: the rest of the plan (the ledger's
        // inventory, about 1.8 MiB at 8,000 GPUs) goes now, not after the writes.
        let reconcile::Plan { actions, .. } = plan;
        self.shared
            .metrics
            .plan_seconds
            .observe(started.elapsed().as_secs_f64());
        let mut wrote = false;
        let mut actions = actions.into_iter().peekable();
        while let Some(action) = actions.next() {
            // A run of allocations and ungates is written together; the other actions keep
            // their place in the plan's order (a release is written before the allocations
            // planned into what it frees).
            match action {
                Action::Allocate { .. } | Action::Ungate { .. } => {
                    let mut run = vec![action];
                    while let Some(a) = actions.next_if(is_batched) {
                        run.push(a);
                    }
                    wrote |= self.act_writes(run).await;
                }
                Action::Pending {
                    claim,
                    pod,
                    message,
                    ..
                } => self.act_pending(claim, pod, message),
                Action::Rejected {
                    claim,
                    pod,
                    message,
                } => self.act_rejected(claim, pod, message),
                Action::Revoke {
                    claim,
                    pod,
                    message,
                } => wrote |= self.act_revoke(claim, pod, message).await,
                Action::Release {
                    claim,
                    deallocate,
                    reason,
                } => wrote |= self.act_release(claim, deallocate, reason).await,
            }
        }
        wrote
    }

    /// This pass's mode ([`decide_mode`]), published to the servers; logged and exported
    /// when it changes.
    fn note_mode(&mut self, consumable: bool) -> Mode {
        let (mode, reason) = decide_mode(self.configured, consumable);
        self.shared.mode.set(mode);
        if self.decided != Some(mode) {
            self.decided = Some(mode);
            // The metric first: whoever reads the log line may scrape at once.
            self.shared.metrics.set_mode(mode.as_str(), reason);
            tracing::info!(mode = mode.as_str(), reason, "allocation mode");
        }
        mode
    }

    /// One walk over the claims at `now`: the allocations kube-scheduler cleared since the
    /// last pass (our finalizer, no allocation, and this process had allocated the claim),
    /// each with its node and backoff, and the claims whose allocation has not settled
    /// yet. Updates the retries, the settle times and [`Controller::next_settle`], and
    /// forgets claims that are gone.
    fn track_allocations(
        &mut self,
        now: Instant,
    ) -> (Vec<(ObjectId, String, Duration)>, BTreeSet<String>) {
        let mut cleared = Vec::new();
        let mut present = std::collections::HashSet::new();
        let mut allocated = std::collections::HashSet::new();
        let mut unsettled = BTreeSet::new();
        self.next_settle = None;
        for c in self.views.claims() {
            let id = &c.id;
            let h = hash_of(&id.uid);
            present.insert(h);
            if c.ours
                && !c.allocated
                && let Some(node) = self.allocated_on.remove(&h)
            {
                let r = self.retries.entry(id.uid.clone()).or_insert(Retry {
                    avoid: Default::default(),
                    attempts: 0,
                    next: now,
                });
                r.avoid.insert(node.clone());
                r.attempts += 1;
                let wait = backoff(r.attempts);
                r.next = now + wait;
                cleared.push((id.clone(), node, wait));
            }
            if c.allocated {
                allocated.insert(h);
                let seen = *self.seen_allocated.entry(h).or_insert(now);
                let settles = seen + self.settle;
                if settles > now {
                    unsettled.insert(id.uid.clone());
                    self.next_settle = Some(self.next_settle.map_or(settles, |t| t.min(settles)));
                }
            }
        }
        self.retries
            .retain(|uid, _| present.contains(&hash_of(uid)));
        self.allocated_on.retain(|h, _| present.contains(h));
        self.seen_allocated.retain(|h, _| allocated.contains(h));
        (cleared, unsettled)
    }

    /// Tells each claim whose allocation kube-scheduler cleared ([`track_allocations`]'s
    /// list) that it is allocated again, away from that node, after its backoff.
    ///
    /// [`track_allocations`]: Controller::track_allocations
    async fn tell_cleared(&mut self, cleared: Vec<(ObjectId, String, Duration)>) {
        for (id, node, wait) in cleared {
            let m = format!(
                "the allocation on node {node} was cleared (kube-scheduler found no node for the pod); allocating again away from it in {}s",
                wait.as_secs()
            );
            tracing::warn!(claim = %id.key(), "{m}");
            self.shared.metrics.failure("cleared");
            self.tell(
                &id,
                "ResourceClaim",
                EventType::Warning,
                "AllocationCleared",
                &m,
            );
        }
    }

    /// Logs what the plan left out and exports its figures (GPUs, fragmentation, usage,
    /// claims pending or rejected).
    fn report_plan(&self, plan: &reconcile::Plan) {
        for e in &plan.slice_errors {
            tracing::warn!("{e}");
        }
        for e in &plan.rule_errors {
            tracing::warn!("{e}; its taint is not applied");
        }
        for e in &plan.usage_errors {
            tracing::warn!("{e}");
        }
        self.shared.metrics.gpus.set(plan.gpus as i64);
        self.shared.metrics.fragmentation.set(plan.fragmentation);
        self.shared.metrics.set_usage(&plan.usage);
        if let Some(h) = &self.shared.hami {
            h.set(&plan.usage, &plan.shares);
        }
        self.shared
            .metrics
            .set_pending(plan.actions.iter().filter_map(Action::wait_reason));
    }

    /// A run of [`Action::Allocate`]s and [`Action::Ungate`]s, written up to
    /// [`Controller::concurrent_writes`] at once in one stream, so that neither kind waits
    /// for the other's last writes.
    ///
    /// An allocation is written unless its claim backs off (a retry before its time) or
    /// changed since planned; the claim and the pod are told of each one written. Each was
    /// planned on the ledger holding all those before it, so any subset of them fits: one
    /// that fails (a conflict, a slow or broken API server) only leaves its share free for
    /// the next pass, and no write waits for another.
    ///
    /// An ungate writes the pod's remaining gates, conditional on its resource version; a
    /// conflict waits for the next pass. It is planned only for a pod whose claims were
    /// allocated and settled before this pass, so it depends on no allocation of the run.
    ///
    /// Every write passes the fence ([`crate::write`]). True when one was written.
    async fn act_writes(&mut self, run: Vec<Action>) -> bool {
        let jobs = self.jobs_of(run);
        let client = self.shared.client.clone();
        let claims_ar = self.claims_ar.clone();
        let finalizer = self.settings.driver.finalizer();
        let fence = self.fence.clone();
        let writes = futures::stream::iter(jobs.into_iter().map(|job| {
            let (client, claims_ar) = (client.clone(), claims_ar.clone());
            let (finalizer, fence) = (finalizer.clone(), fence.clone());
            async move {
                match job {
                    Job::Allocate(w) => {
                        let api: Api<DynamicObject> =
                            Api::namespaced_with(client, &w.id.namespace, &claims_ar);
                        let started = Instant::now();
                        let written = write_allocation(
                            &fence,
                            &api,
                            &finalizer,
                            w.claim.clone(),
                            &w.allocation.allocation,
                        )
                        .await;
                        Outcome::Allocated(w, started.elapsed(), written)
                    }
                    Job::Ungate(pod, keep) => {
                        let pods: Api<DynamicObject> =
                            Api::namespaced_with(client, &pod.namespace, &discovery::pods());
                        let patch = json!({
                            "metadata": {"resourceVersion": pod.resource_version},
                            "spec": {"schedulingGates": keep},
                        });
                        let written = fenced(
                            &fence,
                            pods.patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch)),
                        )
                        .await
                        .map(|o| serde_json::to_value(&o).ok());
                        Outcome::Ungated(pod, written)
                    }
                }
            }
        }))
        .buffer_unordered(self.concurrent_writes.max(1));
        let mut writes = std::pin::pin!(writes);
        let mut wrote = false;
        while let Some(outcome) = writes.next().await {
            wrote |= match outcome {
                Outcome::Allocated(w, took, written) => self.note_written(w, took, written),
                Outcome::Ungated(pod, written) => self.note_ungated(&pod, written),
            };
        }
        wrote
    }

    /// The writes of a run of [`Action::Allocate`]s and [`Action::Ungate`]s, in the plan's
    /// order: every ungate, and the allocations not backing off whose claim has not
    /// changed since planned, with their Events.
    fn jobs_of(&mut self, run: Vec<Action>) -> Vec<Job> {
        let mut jobs = Vec::new();
        for action in run {
            let (id, pod, allocation, message, retry) = match action {
                Action::Allocate {
                    claim,
                    pod,
                    allocation,
                    message,
                    retry,
                } => (claim, pod, allocation, message, retry),
                Action::Ungate { pod, keep } => {
                    jobs.push(Job::Ungate(pod, keep));
                    continue;
                }
                _ => continue,
            };
            if retry
                && self
                    .retries
                    .get(&id.uid)
                    .is_some_and(|r| r.next > Instant::now())
            {
                continue; // backing off
            }
            let Some(claim) = self.views.whole_claim(&self.overlay, &id) else {
                continue; // changed since planned: the next pass
            };
            // One Event per allocation, on the pod, naming the claim as `related`: the
            // claim's own status shows its allocation, and at 10,000 claims a second Event
            // on the claim would be 10,000 more writes to an API server that is the limit.
            let m = format!("claim {}: {message}", id.name);
            let event = self
                .event_for(&pod, "Pod", EventType::Normal, "GpuAllocated", &m)
                .map(|(told, mut event)| {
                    event.related = Some(self.regarding(&id, "ResourceClaim").reference());
                    (told, event)
                });
            jobs.push(Job::Allocate(Box::new(Write {
                id,
                pod,
                allocation,
                message,
                claim,
                event,
            })));
        }
        jobs
    }

    /// Records one allocation write's outcome (overlay, metrics, log); true when written.
    fn note_written(
        &mut self,
        w: Box<Write>,
        took: Duration,
        written: Result<Vec<Value>, WriteError>,
    ) -> bool {
        match written {
            Ok(stored) => {
                for o in stored {
                    self.overlay.put(o);
                }
                self.allocated_on
                    .insert(hash_of(&w.id.uid), w.allocation.grant.node.clone());
                self.shared.metrics.allocated.inc();
                self.shared
                    .metrics
                    .allocation_seconds
                    .observe(took.as_secs_f64());
                tracing::info!(claim = %w.id.key(), pod = %w.pod.key(), "{}", w.message);
                if let Some((told, event)) = w.event {
                    self.note_told(told);
                    self.publish(event);
                }
                true
            }
            Err(e @ WriteError::Fenced(_)) => {
                self.shared.metrics.failure(e.reason());
                tracing::warn!(claim = %w.id.key(), "allocation not written: {e}");
                false
            }
            Err(e) => {
                self.shared.metrics.failure(e.reason());
                tracing::warn!(claim = %w.id.key(), "allocation not written (retried next pass): {e}");
                false
            }
        }
    }

    /// [`Action::Pending`]: counts the failure and tells the pod, then the claim (once per
    /// change of the message).
    fn act_pending(&mut self, claim: ObjectId, pod: ObjectId, message: String) {
        self.shared.metrics.failure("no_fit");
        let m = format!("claim {} waits: {message}", claim.name);
        if self.tell(&pod, "Pod", EventType::Warning, "GpuAllocationPending", &m) {
            tracing::info!(claim = %claim.key(), pod = %pod.key(), "{message}");
            self.tell(
                &claim,
                "ResourceClaim",
                EventType::Warning,
                "Pending",
                &message,
            );
        }
    }

    /// [`Action::Rejected`]: counts the failure and tells the pod, then the claim (once per
    /// change of the message).
    fn act_rejected(&mut self, claim: ObjectId, pod: ObjectId, message: String) {
        self.shared.metrics.failure("rejected");
        let m = format!("claim {}: {message}", claim.name);
        if self.tell(&pod, "Pod", EventType::Warning, "GpuClaimRejected", &m) {
            tracing::warn!(claim = %claim.key(), pod = %pod.key(), "{message}");
            self.tell(
                &claim,
                "ResourceClaim",
                EventType::Warning,
                "Rejected",
                &message,
            );
        }
    }

    /// Records one ungate's outcome (overlay, log); true when written.
    fn note_ungated(&mut self, pod: &ObjectId, written: Result<Option<Value>, WriteError>) -> bool {
        match written {
            Ok(stored) => {
                tracing::info!(pod = %pod.key(), "scheduling gate lifted");
                if let Some(v) = stored {
                    self.overlay.put(v);
                }
                true
            }
            Err(e) if e.is_conflict() => {
                tracing::debug!(pod = %pod.key(), "ungate: conflict, next pass");
                false
            }
            Err(e) => {
                tracing::warn!(pod = %pod.key(), "ungate failed: {e}");
                false
            }
        }
    }

    /// [`Action::Revoke`]: clears the tentative claim's allocation unless it changed since
    /// planned, forgets where it was, and tells the claim and (when known) the pod.
    async fn act_revoke(&mut self, id: ObjectId, pod: ObjectId, message: String) -> bool {
        let Some(claim) = self.views.whole_claim(&self.overlay, &id) else {
            return false; // changed since planned: the next pass
        };
        self.shared.metrics.failure("revoked");
        match self.deallocate(claim).await {
            Ok(_) => {
                self.shared.metrics.revocations.inc();
                // Not a clearing by kube-scheduler: no backoff, no node to avoid.
                self.allocated_on.remove(&hash_of(&id.uid));
                self.seen_allocated.remove(&hash_of(&id.uid));
                tracing::warn!(claim = %id.key(), pod = %pod.key(), "revoked: {message}");
                self.tell(
                    &id,
                    "ResourceClaim",
                    EventType::Warning,
                    "AllocationRevoked",
                    &message,
                );
                if !pod.name.is_empty() {
                    let m = format!("claim {}: {message}", id.name);
                    self.tell(&pod, "Pod", EventType::Warning, "GpuAllocationRevoked", &m);
                }
                true
            }
            Err(e) if e.is_conflict() => false,
            Err(e) => {
                tracing::warn!(claim = %id.key(), "revocation failed (retried next pass): {e}");
                false
            }
        }
    }

    /// [`Action::Release`]: clears the allocation (when `deallocate`) and removes the
    /// finalizer, unless the claim changed since planned.
    async fn act_release(&mut self, id: ObjectId, deallocate: bool, reason: String) -> bool {
        let Some(claim) = self.views.whole_claim(&self.overlay, &id) else {
            return false; // changed since planned: the next pass
        };
        match self.release(claim, deallocate).await {
            Ok(()) => {
                tracing::info!(claim = %id.key(), deallocated = deallocate, "released: {reason}");
                true
            }
            Err(e) if e.is_conflict() => false,
            Err(e) => {
                tracing::warn!(claim = %id.key(), "release failed (retried next pass): {e}");
                false
            }
        }
    }

    /// Clears the claim's allocation (a status replace, conditional on the resource version
    /// it was read at); returns the claim as stored.
    async fn deallocate(&mut self, claim: Value) -> Result<Value, WriteError> {
        let id = ObjectId::of(&claim);
        let mut current = claim;
        if let Some(st) = current["status"].as_object_mut() {
            st.remove("allocation");
            st.remove("devices");
        }
        let obj: DynamicObject =
            serde_json::from_value(current).map_err(kube::Error::SerdeError)?;
        let claims = self.claims(&id.namespace);
        let o = fenced(
            &self.fence,
            claims.replace_status(&id.name, &PostParams::default(), &obj),
        )
        .await?;
        let stored = serde_json::to_value(&o).map_err(kube::Error::SerdeError)?;
        self.overlay.put(stored.clone());
        Ok(stored)
    }

    /// Clears the allocation (when `deallocate`), then removes the finalizer.
    async fn release(&mut self, claim: Value, deallocate: bool) -> Result<(), WriteError> {
        let id = ObjectId::of(&claim);
        let api = self.claims(&id.namespace);
        let finalizer = self.settings.driver.finalizer();
        let mut current = claim;
        if deallocate {
            current = self.deallocate(current).await?;
        }
        let finalizers: Vec<Value> = current["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f.as_str() != Some(finalizer.as_str()))
            .cloned()
            .collect();
        let patch = json!({"metadata": {
            "resourceVersion": current["metadata"]["resourceVersion"],
            "finalizers": finalizers,
        }});
        let o = fenced(
            &self.fence,
            api.patch(&id.name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await?;
        if let Ok(v) = serde_json::to_value(&o) {
            self.overlay.put(v);
        }
        Ok(())
    }

    /// Publishes an Event about `obj` unless the last one for it with `reason` said the
    /// same; true when queued for the [`Outbox`] (or dropped there because it was full).
    ///
    /// Created directly (events.k8s.io/v1), not through kube-rs's `Recorder`: that keeps
    /// every Event it published for six minutes to count repeats, 10,000 Events (one per
    /// claim) at 10,000 claims, and scans them all on every publish. Repeats are not
    /// published here at all (`told`).
    fn tell(
        &mut self,
        obj: &ObjectId,
        kind: &str,
        type_: EventType,
        reason: &'static str,
        message: &str,
    ) -> bool {
        let Some((told, event)) = self.event_for(obj, kind, type_, reason, message) else {
            return false;
        };
        self.note_told(told);
        self.publish(event);
        true
    }

    /// Queues `event` for the [`Outbox`]; a full queue drops it (counted in
    /// `fgpu_controller_events_dropped_total`).
    fn publish(&self, event: Event) {
        if !self.events.send(event) {
            self.shared.metrics.events_dropped.inc();
        }
    }

    /// The Event to publish about `obj`, with its dedup key ([`Controller::note_told`]);
    /// `None` when this message was the last one told for the object and reason.
    fn event_for(
        &self,
        obj: &ObjectId,
        kind: &str,
        type_: EventType,
        reason: &'static str,
        message: &str,
    ) -> Option<(Told, Event)> {
        let key = hash_of((obj.uid.as_str(), reason));
        let said = hash_of(message);
        if self.told.get(&key) == Some(&said) {
            return None;
        }
        let regarding = self.regarding(obj, kind);
        let said_ev = events::Said {
            type_,
            reason,
            action: "Allocate",
            note: message,
        };
        let event = events::event(&self.reporter, &regarding, said_ev, Timestamp::now());
        Some(((key, said), event))
    }

    /// `obj` of `kind` (`Pod` or `ResourceClaim`) as an Event names it.
    fn regarding(&self, obj: &ObjectId, kind: &str) -> events::Regarding {
        let api_version = if kind == "Pod" {
            "v1".to_owned()
        } else {
            self.shared.api.api_version().to_owned()
        };
        events::Regarding {
            api_version,
            kind: kind.to_owned(),
            namespace: obj.namespace.clone(),
            name: obj.name.clone(),
            uid: obj.uid.clone(),
        }
    }

    /// Remembers that an Event was told ([`Controller::event_for`]'s key).
    fn note_told(&mut self, (key, said): Told) {
        self.told.insert(key, said);
        if self.told.len() > 100_000 {
            self.told.clear();
        }
    }
}

/// The dedup key of a told Event: hash of (object UID, reason), hash of the message.
type Told = (u64, u64);

/// Whether `a` is written in a run of [`Controller::act_writes`].
fn is_batched(a: &Action) -> bool {
    matches!(a, Action::Allocate { .. } | Action::Ungate { .. })
}

/// One write of a run ([`Controller::act_writes`]).
enum Job {
    Allocate(Box<Write>),
    /// A pod and the gates it keeps.
    Ungate(ObjectId, Vec<Value>),
}

/// What a [`Job`] came to.
enum Outcome {
    Allocated(Box<Write>, Duration, Result<Vec<Value>, WriteError>),
    /// The pod as stored after the write (where it reads as JSON).
    Ungated(ObjectId, Result<Option<Value>, WriteError>),
}

/// One allocation to write ([`Controller::act_writes`]).
struct Write {
    id: ObjectId,
    pod: ObjectId,
    allocation: crate::allocation::Allocation,
    message: String,
    claim: Value,
    /// The `GpuAllocated` Event, unless it was told already.
    event: Option<(Told, Event)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_plumbing::testing::FakeApiServer;

    const GATE: &str = "gpu.fgpu.dev/allocate";

    /// A controller over `client` (no leader election: its fence is open).
    fn controller(client: kube::Client) -> Controller {
        let shared = Arc::new(Shared::for_tests(client));
        Controller::new(shared, reconcile::tests::settings(), Mode::Controller)
    }

    /// Pod `p{i}` in namespace `team`, gated by the controller and one other gate, as
    /// stored; the action that ungates it (keeping the other gate).
    fn gated_pod(fake: &FakeApiServer, i: usize) -> Action {
        let other = json!({"name": "example.com/hold"});
        let pod = fake.lock().unwrap().insert(
            &format!("/api/v1/namespaces/team/pods/p{i}"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {},
                   "spec": {"schedulingGates": [{"name": GATE}, other.clone()]}}),
        );
        Action::Ungate {
            pod: ObjectId::of(&pod),
            keep: vec![other],
        }
    }

    /// Claim `c{i}` in namespace `team`, pending, as stored and as `ctl` has read it; the
    /// action that allocates it (for pod `p{i}`).
    fn pending_claim(fake: &FakeApiServer, ctl: &mut Controller, i: usize) -> Action {
        let claim = fake.lock().unwrap().insert(
            &format!("/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/c{i}"),
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {}, "spec": {"devices": {"requests": []}}}),
        );
        ctl.overlay.put(claim.clone());
        let id = ObjectId::of(&claim);
        Action::Allocate {
            pod: ObjectId {
                name: format!("p{i}"),
                ..id.clone()
            },
            allocation: crate::allocation::Allocation {
                allocation: json!({"devices": {"results": []}}),
                grant: fgpu_driver::ledger::Grant {
                    id: id.uid.clone(),
                    node: "n1".into(),
                    cpu_milli: 0,
                    memory_mib: 0,
                    devices: Vec::new(),
                },
            },
            claim: id,
            message: "allocated on n1".into(),
            retry: false,
        }
    }

    fn gates(fake: &FakeApiServer, i: usize) -> Value {
        let state = fake.lock().unwrap();
        state.objects[&format!("/api/v1/namespaces/team/pods/p{i}")]["spec"]["schedulingGates"]
            .clone()
    }

    #[tokio::test]
    async fn ungates_keep_the_other_gates_and_a_stale_pod_waits_for_the_next_pass() {
        let fake = FakeApiServer::new();
        let run: Vec<_> = (0..3).map(|i| gated_pod(&fake, i)).collect();
        // p2 changed after the pass read it: its ungate is refused, the others are not.
        gated_pod(&fake, 2);
        let mut ctl = controller(fake.client());
        assert!(ctl.act_writes(run).await);
        for i in 0..2 {
            assert_eq!(
                gates(&fake, i),
                json!([{"name": "example.com/hold"}]),
                "p{i}"
            );
        }
        assert_eq!(
            gates(&fake, 2).as_array().map(Vec::len),
            Some(2),
            "p2 kept its gate"
        );

        let stale = vec![gated_pod(&fake, 3)];
        gated_pod(&fake, 3);
        assert!(!ctl.act_writes(stale).await, "nothing written");
    }

    #[tokio::test(start_paused = true)]
    async fn ungates_are_sent_together_up_to_the_concurrent_writes() {
        for (at_once, sent) in [(16, 5), (2, 2), (1, 1)] {
            let fake = FakeApiServer::new();
            let run: Vec<_> = (0..5).map(|i| gated_pod(&fake, i)).collect();
            let (client, cut) = fake.cuttable_client();
            let mut ctl = controller(client);
            ctl.concurrent_writes = at_once;
            cut.cut();
            let waited = tokio::time::timeout(Duration::from_secs(5), ctl.act_writes(run)).await;
            assert!(waited.is_err(), "an API server that never answers");
            assert_eq!(cut.hung(), sent, "{at_once} at once");
        }
    }

    /// The allocations and the ungates of one run share the writes in flight: neither
    /// waits for the other kind's last writes.
    #[tokio::test(start_paused = true)]
    async fn allocations_and_ungates_are_sent_together() {
        for (at_once, sent) in [(16, 6), (4, 4), (1, 1)] {
            let fake = FakeApiServer::new();
            let (client, cut) = fake.cuttable_client();
            let mut ctl = controller(client);
            ctl.concurrent_writes = at_once;
            let mut run: Vec<Action> = (0..3).map(|i| gated_pod(&fake, i)).collect();
            run.extend((0..3).map(|i| pending_claim(&fake, &mut ctl, i)));
            cut.cut();
            let waited = tokio::time::timeout(Duration::from_secs(5), ctl.act_writes(run)).await;
            assert!(waited.is_err(), "an API server that never answers");
            assert_eq!(cut.hung(), sent, "{at_once} at once");
        }
    }

    /// A run of both kinds, answered: every claim gets its allocation and finalizer, every
    /// pod keeps only its other gate.
    #[tokio::test]
    async fn a_run_of_allocations_and_ungates_writes_each() {
        let fake = FakeApiServer::new();
        let mut ctl = controller(fake.client());
        let mut run: Vec<Action> = Vec::new();
        for i in 0..3 {
            run.push(gated_pod(&fake, i));
            run.push(pending_claim(&fake, &mut ctl, i));
        }
        assert!(ctl.act_writes(run).await);
        let state = fake.lock().unwrap();
        for i in 0..3 {
            let claim = &state.objects
                [&format!("/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/c{i}")];
            assert_eq!(
                claim["status"]["allocation"]["devices"],
                json!({"results": []}),
                "c{i}"
            );
            assert_eq!(
                claim["metadata"]["finalizers"],
                json!([DriverName::default().finalizer()]),
                "c{i}"
            );
            let pod = &state.objects[&format!("/api/v1/namespaces/team/pods/p{i}")];
            assert_eq!(
                pod["spec"]["schedulingGates"],
                json!([{"name": "example.com/hold"}]),
                "p{i}"
            );
        }
    }

    #[tokio::test]
    async fn an_allocation_is_told_once_on_its_pod_naming_the_claim() {
        let fake = FakeApiServer::new();
        let mut ctl = controller(fake.client());
        let run = vec![pending_claim(&fake, &mut ctl, 0)];
        assert!(ctl.act_writes(run).await);
        let events = || -> Vec<Value> {
            let state = fake.lock().unwrap();
            state
                .objects
                .iter()
                .filter(|(path, _)| path.starts_with("/apis/events.k8s.io/v1/namespaces/team/"))
                .map(|(_, e)| e.clone())
                .collect()
        };
        // The Outbox creates Events in the background: wait for the first, then long enough
        // for a second to show.
        let deadline = Instant::now() + Duration::from_secs(5);
        while events().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let told = events();
        assert_eq!(told.len(), 1, "one Event per allocation: {told:#?}");
        let e = &told[0];
        assert_eq!(e["reason"], "GpuAllocated");
        assert_eq!(
            (
                e["regarding"]["kind"].as_str(),
                e["regarding"]["name"].as_str()
            ),
            (Some("Pod"), Some("p0"))
        );
        assert_eq!(
            (e["related"]["kind"].as_str(), e["related"]["name"].as_str()),
            (Some("ResourceClaim"), Some("c0"))
        );
        assert!(e["note"].as_str().unwrap().starts_with("claim c0: "), "{e}");
    }

    #[test]
    fn backoff_doubles_up_to_256_seconds() {
        let s = |n| backoff(n).as_secs();
        assert_eq!([s(1), s(2), s(3), s(10), s(100)], [0, 1, 2, 256, 256]);
        assert!(backoff(u32::MAX) <= Duration::from_secs(300));
    }

    #[test]
    fn auto_mode_follows_consumable_capacity() {
        assert_eq!(decide_mode(Mode::Auto, true).0, Mode::Capacity);
        assert_eq!(decide_mode(Mode::Auto, false).0, Mode::Controller);
        for consumable in [true, false] {
            assert_eq!(
                decide_mode(Mode::Controller, consumable),
                (Mode::Controller, "set by --mode")
            );
            assert_eq!(
                decide_mode(Mode::Capacity, consumable),
                (Mode::Capacity, "set by --mode")
            );
        }
    }
}
