//! The API server side: reading claims and publishing the node's ResourceSlice (kube-rs).
//!
//! * [`negotiate`] asks the API server which `resource.k8s.io` versions it serves and picks
//!   `v1`, else `v1beta2`, else `v1beta1` (1.32).
//! * [`KubeClaimSource`] is the production [`ClaimSource`]: a GET of the claim at that
//!   version, as JSON, read into [`ResourceClaim`] (the fields read have one shape in all
//!   three versions). Only a NotFound that names the claim means it is gone
//!   ([`claim_not_found`]); any other 404 is an error.
//! * [`watch_claims`] feeds the [`crate::claim_cache::ClaimCache`]: a watch on
//!   ResourceClaims in all namespaces (kube-runtime's watcher: list, then watch from the
//!   list's resourceVersion), started over with a fresh list whenever it fails.
//! * [`SlicePublisher`] writes the node's slice ([`crate::slices`]), owned by the Node,
//!   bumping the pool generation when the devices change. Asked for consumable capacity, it
//!   reads the stored slice back; if the API server dropped the gated fields it republishes
//!   plain devices and remembers that (controller mode). The same for taints, and for
//!   partitionable devices (MIG counters: without them, the fixed MIG layouts). A node with
//!   MIG counters has several slices; one no longer needed is emptied, not deleted (the
//!   plugin's role has no delete).
//! * [`node_event`] tells something about the Node (a corrupt checkpoint, a GPU's health)
//!   as an `events.k8s.io/v1` Event through the shared writer ([`fgpu_plumbing::events`]).

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::Value;

use fgpu_api::names::DriverName;
use fgpu_driver::device::NodeInventory;
use fgpu_plumbing::events::{self, Regarding, Reporter, Said};

use crate::claim::ResourceClaim;
use crate::gpu_mode::FixedLayouts;
use crate::prepare::{ClaimSource, SourceError};
use crate::slices::{self, ApiVersion};

/// The API group of DRA.
pub use fgpu_plumbing::discovery::GROUP;

/// Errors talking to the API server. Each names the object.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// Discovery failed, or the API server does not serve `resource.k8s.io` at a version
    /// fgpu speaks.
    #[error(transparent)]
    Discovery(#[from] fgpu_plumbing::discovery::DiscoveryError),
    /// A request failed.
    #[error("{what}: {source}")]
    Kube {
        /// The object and the operation.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// An object could not be converted.
    #[error("{what}: {source}")]
    Json {
        /// The object.
        what: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// Picks the `resource.k8s.io` version to use from what the API server serves.
pub async fn negotiate(client: &kube::Client) -> Result<ApiVersion, ClusterError> {
    Ok(fgpu_plumbing::discovery::negotiate(client).await?)
}

fn resource(api: ApiVersion, kind: &str, plural: &str) -> ApiResource {
    fgpu_plumbing::discovery::resource(api, kind, plural)
}

/// Reads ResourceClaims from the API server.
#[derive(Clone)]
pub struct KubeClaimSource {
    client: kube::Client,
    api: ApiVersion,
}

impl KubeClaimSource {
    /// Claims at `api` through `client`.
    pub fn new(client: kube::Client, api: ApiVersion) -> Self {
        Self { client, api }
    }
}

impl ClaimSource for KubeClaimSource {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, SourceError> {
        use kube::Resource as _;
        let ar = resource(self.api, "ResourceClaim", "resourceclaims");
        // The response is read straight into the plugin's claim model: no DynamicObject and
        // no intermediate JSON tree on the path every prepare takes.
        let request = kube::core::Request::new(DynamicObject::url_path(&ar, Some(namespace)))
            .get(name, &kube::api::GetParams::default())
            .map_err(|e| SourceError(format!("ResourceClaim {namespace}/{name}: {e}")))?;
        match self.client.request::<ResourceClaim>(request).await {
            Ok(claim) => Ok(Some(claim)),
            Err(kube::Error::Api(status)) if claim_not_found(&status, name) => Ok(None),
            Err(e) => Err(SourceError(format!(
                "GET {}/namespaces/{namespace}/resourceclaims/{name}: {e}",
                self.api.api_version()
            ))),
        }
    }
}

/// Whether `status` says that the ResourceClaim `name` does not exist: reason `NotFound`,
/// code 404, and `details` naming that object (`name`, resource `resourceclaims` of group
/// `resource.k8s.io`), as the API server answers a GET of a missing object.
///
/// Any other 404 is not: a version the API server does not serve answers `NotFound` with no
/// details ("the server could not find the requested resource"), a proxy or an aggregation
/// layer may answer a plain "404 page not found". Those say nothing about the claim, and the
/// stale-claim sweep must not take them for its deletion.
pub fn claim_not_found(status: &kube::core::Status, name: &str) -> bool {
    status.reason == "NotFound"
        && status.code == 404
        && status
            .details
            .as_ref()
            .is_some_and(|d| d.name == name && d.kind == "resourceclaims" && d.group == GROUP)
}

/// A ResourceClaim as the claim watch reads it: the metadata kube-runtime's watcher needs
/// (resourceVersion) and the status; the spec is skipped while parsing.
#[derive(Clone, Debug, serde::Deserialize)]
struct WatchedClaim {
    #[serde(default)]
    metadata: kube::core::ObjectMeta,
    #[serde(default)]
    status: Option<crate::claim::ClaimStatus>,
}

impl kube::Resource for WatchedClaim {
    type DynamicType = ApiResource;
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &kube::core::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut kube::core::ObjectMeta {
        &mut self.metadata
    }
}

impl WatchedClaim {
    /// The plugin's claim model: identity and allocation, nothing else kept.
    fn into_claim(self) -> ResourceClaim {
        let m = self.metadata;
        ResourceClaim {
            metadata: crate::claim::ObjectMeta {
                name: m.name.unwrap_or_default(),
                namespace: m.namespace.unwrap_or_default(),
                uid: m.uid.unwrap_or_default(),
                ..Default::default()
            },
            status: self.status,
            ..ResourceClaim::default()
        }
    }
}

/// Claims per page of the watch's list: bounds what one page holds in memory at once.
const WATCH_LIST_PAGE: u32 = 100;

/// Feeds `cache` from a watch on ResourceClaims at `api` in all namespaces, forever (run it
/// as a task; dropping it stops the watch). `size` gets the number of claims held.
///
/// Any error of the watch (a refused list or watch, a dropped connection, an expired
/// resourceVersion) marks the cache unsynced, and after a pause (1 s, doubling to 30 s while
/// failures repeat) the watch starts over with a full list; the cache answers again once that
/// list is complete. A watch that the API server ends normally (its timeout) is resumed
/// from the last resourceVersion by the watcher without a new list and without a gap.
pub async fn watch_claims(
    client: kube::Client,
    api: ApiVersion,
    cache: std::sync::Arc<crate::claim_cache::ClaimCache>,
    size: prometheus_client::metrics::gauge::Gauge,
) {
    use kube::runtime::watcher::{self, Event};
    use tokio_stream::StreamExt as _;

    let claims: Api<WatchedClaim> =
        Api::all_with(client, &resource(api, "ResourceClaim", "resourceclaims"));
    let config = watcher::Config::default().page_size(WATCH_LIST_PAGE);
    let mut pause = std::time::Duration::from_secs(1);
    loop {
        let mut events = std::pin::pin!(watcher::watcher(claims.clone(), config.clone()));
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => cache.relist_started(),
                Ok(Event::InitApply(c)) => cache.relisted(c.into_claim()),
                Ok(Event::InitDone) => {
                    cache.relist_done();
                    pause = std::time::Duration::from_secs(1);
                    tracing::info!(claims = cache.len(), "claim cache synced");
                }
                Ok(Event::Apply(c)) => cache.applied(c.into_claim()),
                Ok(Event::Delete(c)) => cache.deleted(c.metadata.uid.as_deref().unwrap_or("")),
                Err(e) => {
                    // Unsynced below, as when the stream ends.
                    tracing::warn!(error = %e, retry_in = ?pause,
                        "claim watch failed; prepares GET their claims until it has listed them again");
                    break;
                }
            }
            size.set(i64::try_from(cache.len()).unwrap_or(i64::MAX));
        }
        cache.broken();
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(30));
    }
}

/// What [`SlicePublisher::publish`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The pool generation now stored.
    pub generation: i64,
    /// Whether anything was written.
    pub written: bool,
    /// Whether the stored devices carry consumable capacity.
    pub consumable: bool,
    /// Whether MIG-mode GPUs are published as partitionable devices (counters).
    pub partitionable: bool,
    /// How many slices the pool has.
    pub slices: usize,
    /// What could not be published (MIG-mode GPUs of unknown model, fixed-layout
    /// profiles that do not fit), naming the GPU.
    pub errors: Vec<String>,
}

/// Publishes the node's ResourceSlices.
pub struct SlicePublisher {
    client: kube::Client,
    api: ApiVersion,
    driver: DriverName,
    /// Consumable capacity is still to be tried (cleared once the API server dropped it).
    try_consumable: bool,
    /// Device taints are still to be tried (cleared once the API server dropped them).
    try_taints: bool,
    /// Partitionable devices are still to be tried (cleared once the API server dropped
    /// them).
    try_counters: bool,
    /// The fixed MIG layouts, for MIG-mode GPUs without partitionable devices.
    fixed: FixedLayouts,
    /// Names of the node's slices beyond the first, once looked up: they are never deleted
    /// (the plugin may not delete slices), only emptied.
    extra: Option<BTreeSet<String>>,
}

impl SlicePublisher {
    /// A publisher at `api`; `consumable` asks for shareable devices (only tried on `v1`).
    /// Partitionable devices are tried on `v1` only.
    pub fn new(
        client: kube::Client,
        api: ApiVersion,
        driver: DriverName,
        consumable: bool,
    ) -> Self {
        Self {
            client,
            api,
            driver,
            try_consumable: consumable && api == ApiVersion::V1,
            // v1beta1 (1.32) has no taints; 1.33's v1beta1 has them behind the gate.
            try_taints: true,
            try_counters: api == ApiVersion::V1,
            fixed: FixedLayouts::default(),
            extra: None,
        }
    }

    /// Sets the fixed MIG layouts (`--mig-fixed-layout`).
    pub fn with_fixed_layouts(mut self, fixed: FixedLayouts) -> Self {
        self.fixed = fixed;
        self
    }

    fn slices(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client.clone(),
            &resource(self.api, "ResourceSlice", "resourceslices"),
        )
    }

    /// Creates or updates the slice for `inventory`; a no-op when the devices are unchanged.
    /// Unhealthy GPUs are left out.
    pub async fn publish(&mut self, inventory: &NodeInventory) -> Result<Published, ClusterError> {
        self.publish_with_taints(inventory, &BTreeMap::new()).await
    }

    /// [`publish`](Self::publish), with a device taint (by GPU UUID) for each unhealthy GPU
    /// that should stay in the slice, tainted. Where the API server drops taints (the
    /// DRADeviceTaints gate is off), the unhealthy GPUs are left out from then on.
    pub async fn publish_with_taints(
        &mut self,
        inventory: &NodeInventory,
        taints: &BTreeMap<String, slices::DeviceTaint>,
    ) -> Result<Published, ClusterError> {
        self.publish_with_modes(inventory, taints, |_| slices::GpuSettings::default())
            .await
    }

    /// [`publish_with_taints`](Self::publish_with_taints), with each GPU's mode and
    /// research-tier ratio: `modes` is given the Node's labels and answers them by GPU UUID
    /// (see [`crate::gpu_mode`] and [`crate::tier`]; modes alone convert). MIG-mode GPUs
    /// are published as partitionable devices where the
    /// API server keeps them (read back, as for consumable capacity), else by their fixed
    /// layout.
    pub async fn publish_with_modes<S>(
        &mut self,
        inventory: &NodeInventory,
        taints: &BTreeMap<String, slices::DeviceTaint>,
        modes: impl FnOnce(&BTreeMap<String, String>) -> S,
    ) -> Result<Published, ClusterError>
    where
        S: Into<slices::GpuSettings>,
    {
        let node_name = &inventory.node;
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let node = nodes
            .get(node_name)
            .await
            .map_err(|source| ClusterError::Kube {
                what: format!("Node {node_name}: get"),
                source,
            })?;
        let node_uid = node.metadata.uid.unwrap_or_default();
        let settings: slices::GpuSettings = modes(&node.metadata.labels.unwrap_or_default()).into();
        let name = slices::slice_name(node_name, &self.driver);
        let existing = self.read_existing(&name).await?;
        let generation = |v: &Value| v["spec"]["pool"]["generation"].as_i64().unwrap_or(0);
        let newest = |all: &[Value]| all.iter().map(generation).max().unwrap_or(0);
        let build = |this: &Self, generation: i64, old: &[Value]| {
            let mut built = slices::build_node_slices(
                &this.driver,
                inventory,
                &node_uid,
                generation,
                this.api,
                &slices::Publish {
                    consumable: this.try_consumable,
                    taints: this.try_taints.then_some(taints),
                    modes: &settings.modes,
                    tiers: &settings.tiers,
                    partitionable: this.try_counters,
                    fixed: &this.fixed,
                },
            );
            slices::keep_names(&mut built.slices, old);
            built
        };

        let old_generation = newest(&existing);
        let want = build(self, old_generation + 1, &existing);
        if !existing.is_empty() && !slices::slices_changed(&existing, &want.slices) {
            return Ok(Published {
                generation: old_generation,
                written: false,
                consumable: self.try_consumable,
                partitionable: self.try_counters,
                slices: existing.len(),
                errors: want.errors,
            });
        }
        let has_counters = want
            .slices
            .iter()
            .any(|w| slices::kept_counters(w, &Value::Null).is_some());
        let mut stored = match self.write_all(&existing, &want.slices).await {
            // An API server that validates counters by the older rules (1.34's alpha shape:
            // counter sets in the devices' own slice) refuses the slices: the fixed layouts.
            Err(ClusterError::Kube {
                source: kube::Error::Api(status),
                ..
            }) if self.try_counters && has_counters && status.is_invalid() => {
                tracing::warn!(slice = %name, error = %status.message, "the API server refused the MIG counters; publishing the fixed MIG layouts (--mig-fixed-layout)");
                self.try_counters = false;
                // Some slices may have been written before the refusal: read them again.
                let now = self.read_existing(&name).await?;
                let again = build(self, newest(&now) + 1, &now);
                let stored = self.write_all(&now, &again.slices).await?;
                return Ok(Published {
                    generation: newest(&stored),
                    written: true,
                    consumable: self.try_consumable,
                    partitionable: false,
                    slices: stored.len(),
                    errors: again.errors,
                });
            }
            other => other?,
        };
        let mut errors = want.errors;
        let pairs = || want.slices.iter().zip(&stored);
        let mut fell_back = false;
        if self.try_consumable
            && pairs().any(|(w, s)| slices::kept_consumable_in(w, s) == Some(false))
        {
            tracing::warn!(slice = %name, "the API server dropped allowMultipleAllocations (DRAConsumableCapacity is off); publishing plain devices");
            self.try_consumable = false;
            fell_back = true;
        }
        if self.try_taints && pairs().any(|(w, s)| slices::kept_taints(w, s) == Some(false)) {
            tracing::warn!(slice = %name, "the API server dropped the device taints (DRADeviceTaints is off); leaving unhealthy GPUs out of the slice");
            self.try_taints = false;
            fell_back = true;
        }
        if self.try_counters && pairs().any(|(w, s)| slices::kept_counters(w, s) == Some(false)) {
            tracing::warn!(slice = %name, "the API server dropped sharedCounters/consumesCounters (DRAPartitionableDevices is off); publishing the fixed MIG layouts (--mig-fixed-layout)");
            self.try_counters = false;
            fell_back = true;
        }
        if fell_back {
            let again = build(self, newest(&stored) + 1, &stored);
            stored = self.write_all(&stored, &again.slices).await?;
            errors = again.errors;
        }
        Ok(Published {
            generation: newest(&stored),
            written: true,
            consumable: self.try_consumable,
            partitionable: self.try_counters,
            slices: stored.len(),
            errors,
        })
    }

    /// Whether unhealthy GPUs are still published tainted (false once the API server
    /// dropped taints).
    pub fn taints_kept(&self) -> bool {
        self.try_taints
    }

    /// The node's slices as stored: `first` and those beyond it.
    async fn read_existing(&mut self, first: &str) -> Result<Vec<Value>, ClusterError> {
        let mut existing = Vec::new();
        if let Some(s) = self.get(first).await? {
            existing.push(s);
        }
        existing.extend(self.extra_slices(first).await?);
        Ok(existing)
    }

    async fn get(&self, name: &str) -> Result<Option<Value>, ClusterError> {
        self.slices()
            .get_opt(name)
            .await
            .map_err(|source| ClusterError::Kube {
                what: format!("ResourceSlice {name}: get"),
                source,
            })?
            .map(|o| to_json(name, o))
            .transpose()
    }

    /// The node's slices beyond `first`: looked up once (`<first>-1`, `-2` … and
    /// `<first>-counters-0`, `-1` … until one is missing), then remembered.
    async fn extra_slices(&mut self, first: &str) -> Result<Vec<Value>, ClusterError> {
        if self.extra.is_none() {
            let mut found = BTreeSet::new();
            for prefix in [format!("{first}-"), format!("{first}-counters-")] {
                let from = usize::from(!prefix.ends_with("counters-"));
                for i in from.. {
                    let name = format!("{prefix}{i}");
                    if self.get(&name).await?.is_none() {
                        break;
                    }
                    found.insert(name);
                }
            }
            self.extra = Some(found);
        }
        let mut out = Vec::new();
        for name in self.extra.clone().unwrap_or_default() {
            if let Some(s) = self.get(&name).await? {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Writes each slice of `want` over its namesake in `existing` (or creates it); returns
    /// what the API server stored, in `want`'s order.
    async fn write_all(
        &mut self,
        existing: &[Value],
        want: &[Value],
    ) -> Result<Vec<Value>, ClusterError> {
        let mut stored = Vec::with_capacity(want.len());
        for (i, w) in want.iter().enumerate() {
            let name = w["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let old = existing
                .iter()
                .find(|e| e["metadata"]["name"] == w["metadata"]["name"]);
            stored.push(self.write(&name, old, w.clone()).await?);
            if i > 0 {
                self.extra.get_or_insert_with(BTreeSet::new).insert(name);
            }
        }
        Ok(stored)
    }

    /// Creates the slice, or replaces `existing` (optimistic concurrency on its
    /// resourceVersion); returns what the API server stored.
    async fn write(
        &self,
        name: &str,
        existing: Option<&Value>,
        mut want: Value,
    ) -> Result<Value, ClusterError> {
        let kube_err = |op: &str| {
            let what = format!("ResourceSlice {name}: {op}");
            move |source| ClusterError::Kube { what, source }
        };
        let stored = match existing {
            Some(old) => {
                want["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                let obj = from_json(name, want)?;
                self.slices()
                    .replace(name, &PostParams::default(), &obj)
                    .await
                    .map_err(kube_err("replace"))?
            }
            None => {
                let obj = from_json(name, want)?;
                self.slices()
                    .create(&PostParams::default(), &obj)
                    .await
                    .map_err(kube_err("create"))?
            }
        };
        to_json(name, stored)
    }
}

fn to_json(name: &str, o: DynamicObject) -> Result<Value, ClusterError> {
    serde_json::to_value(o).map_err(|source| ClusterError::Json {
        what: format!("ResourceSlice {name}"),
        source,
    })
}

fn from_json(name: &str, v: Value) -> Result<DynamicObject, ClusterError> {
    serde_json::from_value(v).map_err(|source| ClusterError::Json {
        what: format!("ResourceSlice {name}"),
        source,
    })
}

/// Reason of the Event for a checkpoint that did not parse.
pub const REASON_CHECKPOINT_CORRUPTED: &str = "CheckpointCorrupted";

/// Reason of the Event for a GPU mode change refused while the GPU holds prepared claims.
pub const REASON_GPU_MODE_CHANGE_REFUSED: &str = "GpuModeChangeRefused";
/// Reason of the Node Event for a research-tier ratio change the plugin did not take (the
/// GPU holds prepared claims).
pub const REASON_GPU_TIER_CHANGE_REFUSED: &str = "GpuTierChangeRefused";

/// The `reportingController` of every Event the plugin writes (its `reportingInstance` is
/// the node).
pub const EVENT_REPORTER: &str = "fgpu.dev/kubelet-plugin";

/// The object of an Event about `node` (UID `uid`): cluster-scoped, so the Event goes to
/// namespace `default`, where the kubelet's Node events go too.
pub fn node_regarding(node: &str, uid: &str) -> Regarding {
    Regarding {
        api_version: "v1".into(),
        kind: "Node".into(),
        namespace: String::new(),
        name: node.to_owned(),
        uid: uid.to_owned(),
    }
}

/// Records an Event (`events.k8s.io/v1`, through [`fgpu_plumbing::events`]) about `node`,
/// reported by [`EVENT_REPORTER`] on that node. Reads the Node first for its UID.
pub async fn node_event(
    client: &kube::Client,
    node: &str,
    said: Said<'_>,
) -> Result<(), ClusterError> {
    use k8s_openapi::api::core::v1::Node;

    let what = |op: &str| format!("Event {} for Node {node}: {op}", said.reason);
    let uid = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .map_err(|source| ClusterError::Kube {
            what: what("get the node"),
            source,
        })?
        .metadata
        .uid
        .unwrap_or_default();
    let reporter = Reporter {
        controller: EVENT_REPORTER.into(),
        instance: node.to_owned(),
    };
    let event = events::event(
        &reporter,
        &node_regarding(node, &uid),
        said,
        k8s_openapi::jiff::Timestamp::now(),
    );
    events::publish(client, &event)
        .await
        .map_err(|source| ClusterError::Kube {
            what: what("create"),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_not_found_naming_the_claim_means_it_is_gone() {
        use kube::core::Status;
        use kube::core::response::StatusDetails;
        let details = |name: &str, group: &str, kind: &str| StatusDetails {
            name: name.into(),
            group: group.into(),
            kind: kind.into(),
            uid: String::new(),
            causes: vec![],
            retry_after_seconds: 0,
        };
        let not_found = |d: Option<StatusDetails>| Status {
            details: d,
            ..Status::failure("resourceclaims.resource.k8s.io \"c\" not found", "NotFound")
                .with_code(404)
        };
        let object = not_found(Some(details("c", "resource.k8s.io", "resourceclaims")));
        assert!(claim_not_found(&object, "c"));
        assert!(!claim_not_found(&object, "d"), "another object's NotFound");
        for (why, status) in [
            ("an unserved version: no details", not_found(None)),
            (
                "another resource",
                not_found(Some(details("c", "resource.k8s.io", "resourceslices"))),
            ),
            (
                "another group",
                not_found(Some(details("c", "example.com", "resourceclaims"))),
            ),
            (
                "a plain-text 404 page, as kube-client rebuilds it",
                Status::failure("404 page not found", "Failed to parse error data").with_code(404),
            ),
            (
                "a NotFound reason with another code",
                Status {
                    code: 503,
                    ..object.clone()
                },
            ),
        ] {
            assert!(!claim_not_found(&status, "c"), "{why}");
        }
    }

    #[test]
    fn a_node_event_is_about_the_node_and_goes_to_default() {
        let reporter = Reporter {
            controller: EVENT_REPORTER.into(),
            instance: "node-a".into(),
        };
        let said = Said {
            type_: events::EventType::Warning,
            reason: REASON_CHECKPOINT_CORRUPTED,
            action: "Start",
            note: "moved aside",
        };
        let e = events::event(
            &reporter,
            &node_regarding("node-a", "u-1"),
            said,
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        let r = e.regarding.unwrap();
        assert_eq!(
            (r.api_version.as_deref(), r.kind.as_deref(), r.namespace),
            (Some("v1"), Some("Node"), None)
        );
        assert_eq!(
            (r.name.as_deref(), r.uid.as_deref()),
            (Some("node-a"), Some("u-1"))
        );
        assert_eq!(
            e.reporting_controller.as_deref(),
            Some("fgpu.dev/kubelet-plugin")
        );
    }
}
