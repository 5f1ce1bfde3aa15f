//! What the daemon keeps between passes, beside the reflector stores: the objects it wrote
//! that the watch has not delivered yet ([`Overlay`]), and a [`ClaimView`] / [`PodView`] per
//! stored object version plus the inventory per set of slice versions ([`ViewCache`]).
//!
//! The mirrors ([`crate::mirror`]) hold each claim and slice as JSON text and each pod as
//! its [`PodView`]; a pass used to parse every object into a `Value` (about 13 KiB per
//! claim, 47 MiB for 1,000 slices). Now a claim is parsed when its version (or the
//! inventory) is new to the cache, one at a time, straight into the typed claim, and only
//! its view is kept; [`ViewCache::typed_claim`] parses one claim again where a pass needs
//! all of it (a pending claim's requests), [`ViewCache::whole_claim`] as JSON for a write.
//! Slices (and DeviceTaintRules) are parsed into their typed model
//! (`fgpu_api::dra::slice`), one at a time, when the set of their versions changes.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use fgpu_api::dra::claim::ResourceClaim;
use fgpu_api::dra::slice::{DeviceTaintRule, ResourceSlice};
use fgpu_api::names::DriverName;
use serde_json::Value;

use crate::inventory::{self, RuleError, SliceError, SliceInventory};
use crate::mirror::Packed;
use crate::objects::{self, ObjectId};
use crate::slim;
use crate::view::{ClaimView, PodView};

/// Objects this process wrote, laid over the stores until the watch delivers them, so the
/// next pass does not plan from the state before its own writes. Trimmed like the stores'
/// objects ([`slim::written`]) and kept as text.
#[derive(Default)]
pub struct Overlay(HashMap<String, Written>);

/// One object in the [`Overlay`].
struct Written {
    /// `metadata.resourceVersion` as written.
    version: String,
    /// The whole object.
    text: String,
}

/// Whether the stored version `stored` is at least the written `written`. Resource
/// versions are opaque to clients but etcd's are integers; where one is not, only the same
/// version counts as caught up.
fn caught_up(stored: &str, written: &str) -> bool {
    match (stored.parse::<u64>(), written.parse::<u64>()) {
        (Ok(a), Ok(b)) => a >= b,
        _ => stored == written,
    }
}

impl Overlay {
    /// Remembers `obj` as written.
    pub fn put(&mut self, mut obj: Value) {
        slim::written(&mut obj);
        if let (Some(uid), Some(version)) = (
            obj["metadata"]["uid"].as_str(),
            obj["metadata"]["resourceVersion"].as_str(),
        ) && let Ok(text) = serde_json::to_string(&obj)
        {
            let version = version.to_owned();
            self.0.insert(uid.to_owned(), Written { version, text });
        }
    }

    /// The written copy of `uid` (its version and text) when the store, at `stored`, has
    /// not caught up with it; forgets it once the store has.
    fn newer(&mut self, uid: &str, stored: &str) -> Option<(&str, &str)> {
        if self
            .0
            .get(uid)
            .is_some_and(|w| caught_up(stored, &w.version))
        {
            self.0.remove(uid);
        }
        self.0
            .get(uid)
            .map(|w| (w.version.as_str(), w.text.as_str()))
    }

    /// The written copy of `uid` at exactly `version`.
    fn at(&self, uid: &str, version: &str) -> Option<&str> {
        self.0
            .get(uid)
            .filter(|w| w.version == version)
            .map(|w| w.text.as_str())
    }

    /// How many objects it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One claim in the [`ViewCache`].
struct CachedClaim {
    /// Read from the version `view.id.resource_version` (the mirror's, or the overlay's
    /// when newer) with the inventory of this generation.
    view: ClaimView,
    generation: u64,
    /// The mirror's copy as of the last [`ViewCache::refresh`] (what
    /// [`ViewCache::whole_claim`] reads).
    stored: Arc<Packed>,
}

/// The claims' views, each computed once per claim version and inventory, and the
/// inventory, read once per set of slice versions.
#[derive(Default)]
pub struct ViewCache {
    /// Claim UID → its view and the mirror's copy.
    claims: HashMap<String, Box<CachedClaim>>,
    /// This pass's pods: the mirror's views, and the overlay's newer ones.
    pods: Vec<Arc<PodView>>,
    written_pods: Vec<PodView>,
    /// The DeviceTaintRules that may select this driver's devices
    /// ([`ViewCache::set_taint_rules`]).
    taint_rules: Vec<Arc<Packed>>,
    /// (UID, version) of every slice and taint rule the inventory was read from, sorted.
    slice_versions: Vec<(String, String)>,
    /// Bumped whenever the inventory is read again (claim grants depend on it).
    generation: u64,
    /// This driver's slices read.
    pub inventory: SliceInventory,
    /// Whether one of this driver's devices allows several allocations.
    pub consumable: bool,
    /// Objects parsed so far (claim views computed, slices and written pods read): how
    /// much work the cache saved.
    pub parsed: u64,
}

impl ViewCache {
    /// Brings the cache up to the mirrors' current objects (with `overlay`'s newer copies
    /// laid over them): views of new claim versions are computed, those of claims gone are
    /// dropped, as are overlay entries of objects gone.
    pub fn refresh(
        &mut self,
        driver: &DriverName,
        claims: Vec<Arc<Packed>>,
        pods: Vec<Arc<PodView>>,
        slices: &[Arc<Packed>],
        overlay: &mut Overlay,
    ) {
        self.refresh_inventory(driver, slices);
        let generation = self.generation;
        let inventory = &self.inventory.inventory;
        let mut live: HashSet<String> = HashSet::with_capacity(claims.len() + pods.len());
        for c in claims {
            live.insert(c.uid.clone());
            let written = overlay.newer(&c.uid, &c.resource_version);
            let version = written.map_or(c.resource_version.as_str(), |(v, _)| v);
            match self.claims.get_mut(&c.uid) {
                Some(e) if e.view.id.resource_version == version && e.generation == generation => {
                    e.stored = c;
                }
                _ => {
                    let stored = ObjectId {
                        uid: c.uid.clone(),
                        resource_version: version.to_owned(),
                        ..ObjectId::default()
                    };
                    let view = match written {
                        Some((_, text)) => {
                            ClaimView::of_text(text.as_bytes(), stored, driver, inventory)
                        }
                        // Damaged in memory: reported like a text that does not read.
                        None => {
                            let text = c.text().unwrap_or_default();
                            ClaimView::of_text(&text, stored, driver, inventory)
                        }
                    };
                    self.parsed += 1;
                    let entry = CachedClaim {
                        view,
                        generation,
                        stored: c,
                    };
                    self.claims
                        .insert(entry.stored.uid.clone(), Box::new(entry));
                }
            }
        }
        let gate = driver.scheduling_gate();
        self.written_pods.clear();
        self.pods.clear();
        for p in pods {
            live.insert(p.id.uid.clone());
            match overlay.newer(&p.id.uid, &p.id.resource_version) {
                Some((_, text)) => {
                    if let Ok(whole) = serde_json::from_str::<Value>(text) {
                        self.parsed += 1;
                        self.written_pods.push(PodView::of(&whole, &gate));
                    }
                }
                None => self.pods.push(p),
            }
        }
        self.claims.retain(|uid, _| live.contains(uid));
        overlay.0.retain(|uid, _| live.contains(uid));
    }

    /// The admins' DeviceTaintRules to lay over the slices from the next
    /// [`ViewCache::refresh`] on (none where the API server serves no such resource).
    pub fn set_taint_rules(&mut self, rules: Vec<Arc<Packed>>) {
        self.taint_rules = rules;
    }

    /// Reads the inventory again when the set of slice or taint-rule versions changed, one
    /// slice at a time (a thousand slices parsed at once would be tens of MiB), each from
    /// its text straight into the typed model. The text is what [`slim::slice`] wrote from
    /// that model, so it reads back; should one not, it is reported by its UID.
    fn refresh_inventory(&mut self, driver: &DriverName, slices: &[Arc<Packed>]) {
        let mut versions: Vec<(String, String)> = slices
            .iter()
            .chain(&self.taint_rules)
            .map(|s| (s.uid.clone(), s.resource_version.clone()))
            .collect();
        versions.sort();
        if versions == self.slice_versions && self.generation > 0 {
            return;
        }
        let mut consumable = false;
        let mut parsed = 0;
        let mut unreadable = Vec::new();
        let typed = slices
            .iter()
            .filter_map(|s| match s.read::<ResourceSlice>()? {
                Ok(slice) => {
                    parsed += 1;
                    consumable |= objects::consumable(driver.as_str(), [&slice]);
                    Some(slice)
                }
                Err(e) => {
                    unreadable.push(SliceError {
                        slice: format!("with UID {}", s.uid),
                        field: "(the whole object)".into(),
                        problem: e.to_string(),
                    });
                    None
                }
            });
        self.inventory = inventory::from_slices(driver.as_str(), typed);
        self.inventory.errors.extend(unreadable);
        let mut unreadable = Vec::new();
        let rules = self
            .taint_rules
            .iter()
            .filter_map(|r| match r.read::<DeviceTaintRule>()? {
                Ok(rule) => Some(rule),
                Err(e) => {
                    unreadable.push(RuleError {
                        rule: format!("with UID {}", r.uid),
                        field: "(the whole object)".into(),
                        problem: e.to_string(),
                    });
                    None
                }
            });
        self.inventory.apply_taint_rules(driver.as_str(), rules);
        self.inventory.rule_errors.extend(unreadable);
        self.consumable = consumable;
        self.parsed += parsed;
        self.slice_versions = versions;
        self.generation += 1;
    }

    /// Every claim's view (any order).
    pub fn claims(&self) -> Vec<&ClaimView> {
        self.claims.values().map(|e| &e.view).collect()
    }

    /// Every pod's view (any order).
    pub fn pods(&self) -> Vec<&PodView> {
        self.pods
            .iter()
            .map(|p| p.as_ref())
            .chain(&self.written_pods)
            .collect()
    }

    /// The claim `id` names, whole, at exactly its version: the overlay's copy or the
    /// mirror's as of the last [`ViewCache::refresh`]; `None` when it is at another version.
    /// JSON, to be written back.
    pub fn whole_claim(&self, overlay: &Overlay, id: &ObjectId) -> Option<Value> {
        serde_json::from_slice(&self.claim_text(overlay, id)?).ok()
    }

    /// [`ViewCache::whole_claim`] typed, parsed straight from the text: what the planner
    /// reads of a pending claim.
    pub fn typed_claim(&self, overlay: &Overlay, id: &ObjectId) -> Option<ResourceClaim> {
        serde_json::from_slice(&self.claim_text(overlay, id)?).ok()
    }

    /// The text of the claim `id` names at exactly its version.
    fn claim_text<'a>(&'a self, overlay: &'a Overlay, id: &ObjectId) -> Option<Cow<'a, [u8]>> {
        if let Some(text) = overlay.at(&id.uid, &id.resource_version) {
            return Some(Cow::Borrowed(text.as_bytes()));
        }
        let c = &self.claims.get(&id.uid)?.stored;
        if c.resource_version != id.resource_version {
            return None;
        }
        c.text().map(Cow::Owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(v: Value) -> Arc<Packed> {
        let o: kube::api::DynamicObject = serde_json::from_value(v).expect("object");
        Arc::new(Packed::of(&o).expect("uid"))
    }

    fn viewed(v: Value) -> Arc<PodView> {
        Arc::new(PodView::of(&v, "gpu.fgpu.dev/allocate"))
    }

    fn claim(rv: &str, finalized: bool) -> Value {
        let finalizers: Vec<&str> = if finalized {
            vec!["gpu.fgpu.dev/allocation"]
        } else {
            vec![]
        };
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uc", "resourceVersion": rv,
                         "finalizers": finalizers},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "shared.gpu.fgpu.dev"}}]}}})
    }

    fn pod(rv: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "up", "resourceVersion": rv},
            "spec": {"schedulingGates": [{"name": "gpu.fgpu.dev/allocate"}],
                     "resourceClaims": [{"name": "g", "resourceClaimName": "c"}]}})
    }

    fn slice(rv: &str, gpus: usize) -> Value {
        let devices: Vec<Value> = (0..gpus)
            .map(|i| {
                json!({"name": format!("gpu-{i}"), "allowMultipleAllocations": true,
                "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}})
            })
            .collect();
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "node-a-gpu.fgpu.dev", "uid": "us", "resourceVersion": rv},
            "spec": {"driver": "gpu.fgpu.dev", "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1}, "devices": devices}})
    }

    #[test]
    fn views_are_computed_once_per_version() {
        let d = DriverName::default();
        let mut cache = ViewCache::default();
        let mut overlay = Overlay::default();
        let slices = [stored(slice("1", 2))];
        cache.refresh(
            &d,
            vec![stored(claim("5", false))],
            vec![viewed(pod("6"))],
            &slices,
            &mut overlay,
        );
        assert_eq!(
            cache.parsed, 2,
            "one slice, one claim (the pod comes as a view)"
        );
        assert_eq!(cache.inventory.inventory.nodes[0].gpus.len(), 2);
        assert!(cache.consumable);
        assert!(cache.claims()[0].shared && !cache.claims()[0].ours);
        assert!(cache.pods()[0].gated);

        // Same versions: nothing parsed again.
        cache.refresh(
            &d,
            vec![stored(claim("5", false))],
            vec![viewed(pod("6"))],
            &slices,
            &mut overlay,
        );
        assert_eq!(cache.parsed, 2);

        // A new claim version: that claim only.
        cache.refresh(
            &d,
            vec![stored(claim("7", true))],
            vec![viewed(pod("6"))],
            &slices,
            &mut overlay,
        );
        assert_eq!(cache.parsed, 3);
        assert!(cache.claims()[0].ours);

        // A new slice version: the inventory and every claim's grant are read again.
        let slices = [stored(slice("2", 3))];
        cache.refresh(
            &d,
            vec![stored(claim("7", true))],
            vec![viewed(pod("6"))],
            &slices,
            &mut overlay,
        );
        assert_eq!(cache.parsed, 5, "the slice and the claim");
        assert_eq!(cache.inventory.inventory.nodes[0].gpus.len(), 3);

        // An admin's DeviceTaintRule: the inventory is read again with its taint; once it
        // is gone, again without.
        let rule = json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": "maint", "uid": "ur", "resourceVersion": "4"},
            "spec": {"deviceSelector": {"device": "gpu-1"},
                     "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"}}});
        let tainted = |c: &ViewCache| -> Vec<String> {
            c.inventory.inventory.nodes[0]
                .gpus
                .iter()
                .filter(|g| !g.taints.is_empty())
                .map(|g| g.id.clone())
                .collect()
        };
        cache.set_taint_rules(vec![stored(rule)]);
        let claims = || vec![stored(claim("7", true))];
        cache.refresh(&d, claims(), vec![], &slices, &mut overlay);
        assert_eq!(cache.parsed, 7, "the slice and the claim again");
        assert_eq!(tainted(&cache), vec!["gpu-1"]);
        cache.set_taint_rules(vec![]);
        cache.refresh(&d, claims(), vec![], &slices, &mut overlay);
        assert_eq!(tainted(&cache), Vec::<String>::new());

        // Objects gone: their views go.
        cache.refresh(&d, vec![], vec![], &slices, &mut overlay);
        assert!(cache.claims().is_empty() && cache.pods().is_empty());
    }

    #[test]
    fn the_overlay_counts_until_the_store_catches_up() {
        let d = DriverName::default();
        let mut cache = ViewCache::default();
        let mut overlay = Overlay::default();
        overlay.put(claim("10", true));
        // Store behind: the written copy.
        cache.refresh(
            &d,
            vec![stored(claim("9", false))],
            vec![],
            &[],
            &mut overlay,
        );
        assert!(cache.claims()[0].ours);
        assert_eq!(cache.claims()[0].id.resource_version, "10");
        let id = cache.claims()[0].id.clone();
        assert!(
            cache.whole_claim(&overlay, &id).is_some(),
            "the written version, whole"
        );
        assert_eq!(overlay.len(), 1);
        // Store caught up (a later version): the store's copy, the overlay forgets it.
        cache.refresh(
            &d,
            vec![stored(claim("11", false))],
            vec![],
            &[],
            &mut overlay,
        );
        assert!(!cache.claims()[0].ours);
        assert!(overlay.is_empty());
        // The version planned from is gone: no whole claim.
        assert!(cache.whole_claim(&overlay, &id).is_none());
        let now = cache.claims()[0].id.clone();
        let whole = cache.whole_claim(&overlay, &now).expect("stored version");
        assert_eq!(whole["metadata"]["resourceVersion"], "11");
        assert_eq!(whole["spec"]["devices"]["requests"][0]["name"], "gpu");
    }

    #[test]
    fn a_written_pod_counts_until_the_mirror_catches_up() {
        let d = DriverName::default();
        let mut cache = ViewCache::default();
        let mut overlay = Overlay::default();
        let mut ungated = pod("8");
        ungated["spec"]["schedulingGates"] = json!([]);
        overlay.put(ungated);
        cache.refresh(&d, vec![], vec![viewed(pod("6"))], &[], &mut overlay);
        assert!(!cache.pods()[0].gated, "the written version");
        assert_eq!(cache.pods().len(), 1);
        cache.refresh(&d, vec![], vec![viewed(pod("8"))], &[], &mut overlay);
        assert!(
            cache.pods()[0].gated,
            "the mirror's (here still gated: it is what counts)"
        );
        assert!(overlay.is_empty());
    }

    #[test]
    fn overlay_entries_of_deleted_objects_are_dropped() {
        let d = DriverName::default();
        let mut cache = ViewCache::default();
        let mut overlay = Overlay::default();
        overlay.put(claim("10", true));
        cache.refresh(&d, vec![], vec![], &[], &mut overlay);
        assert!(overlay.is_empty());
    }
}
