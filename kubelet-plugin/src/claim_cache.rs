//! The claim cache: this node's allocated ResourceClaims, kept current by a watch, so that a
//! prepare usually needs no API request.
//!
//! Without it every `NodePrepareResources` GETs its claim, and on a busy API server that GET
//! is most of a prepare's latency (it queues behind the server's other work). The cache is
//! fed by one watch on ResourceClaims in all namespaces ([`crate::cluster::watch_claims`])
//! and keeps only what a prepare on this node can use: claims whose `status.allocation` has
//! a result of this driver in this node's pool (fgpu's pool is the node name), reduced to
//! the plugin's claim model ([`crate::claim`]: name, namespace, UID, allocation, and
//! `reservedFor` for the node monitor) — no spec, no managed fields.
//!
//! [`CachedClaimSource::get_for_prepare`] answers from the cache when all of these hold, and
//! otherwise GETs the claim as before ([`ClaimRead`] says which and why, in the metrics):
//!
//! * the cache is synced: it has completed a list, and its watch has not failed since (on a
//!   failure the watch starts over with a fresh list, and the cache answers nothing until
//!   that list is complete);
//! * it holds a claim of that UID, name and namespace, allocated on this node;
//! * this plugin has not unprepared that UID since the watch last showed the claim
//!   deallocated or gone (below).
//!
//! # Why a cached copy is the claim the kubelet means
//!
//! * The kubelet prepares a claim only once it is allocated and reserved for a pod bound to
//!   this node, and it names the claim by UID; a cached copy must have that UID. A claim
//!   deleted and recreated under the same name has another UID: a miss.
//! * `status.allocation` cannot be modified while it is set (API validation); it can only
//!   be cleared (deallocation, only when `reservedFor` is empty) and set anew. Whatever the
//!   kubelet prepares, its allocation was written before the prepare call.
//! * So a cached allocated copy of the right UID is either the current allocation, or one
//!   that was cleared and replaced since — a deallocation followed by a new allocation,
//!   and a pod bound and started on the new one, all before the watch delivered the
//!   deallocation. Watch events arrive in order, so that needs the watch to lag behind the
//!   API server by the whole of that sequence (a scheduling cycle, a binding, the kubelet
//!   starting the pod: seconds, against milliseconds for a watch event).
//! * The common way to get there is guarded exactly: a claim used by one pod and then by
//!   another on the same node is unprepared in between, and the resourceclaim controller
//!   deallocates it before the scheduler allocates it again. [`ClaimCache::forget`] (called
//!   by every unprepare, under the claim's lock) marks the UID, and the cache does not answer
//!   for it again until the watch has shown it deallocated or deleted, or a fresh list no
//!   longer has it allocated here. A claim prepared again without a deallocation (the
//!   kubelet unprepared it while it stayed reserved) takes the GET: correct, only slower.
//! * What is left is a lag of seconds on a watch that has not failed, for a claim this
//!   process has not unprepared (it was prepared before a restart of the plugin, or on
//!   another node), reallocated to this node within that lag. A watch that far behind
//!   means an API server too slow to run the scheduler and the kubelet through that
//!   sequence in the same time. `--claim-cache=false` turns the cache off.
//!
//! Memory: one small entry per claim allocated on this node (the claim model, a few hundred
//! bytes), plus the UIDs unprepared and not yet seen deallocated. Objects of other nodes
//! are read (the watch cannot filter them out on the server) and dropped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::claim::ResourceClaim;
use crate::metrics::ClaimRead;
use crate::prepare::{ClaimSource, SourceError};

/// At most this many unprepared UIDs are remembered for claims the cache does not hold
/// (see [`ClaimCache::forget`]); beyond it those are dropped. UIDs of claims it holds are
/// kept until the claim is seen deallocated (they are bounded by the claims it holds).
const MAX_UNHELD_UNPREPARED: usize = 1024;

/// What [`ClaimCache::lookup`] found.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// A current allocated copy of the claim (boxed: the claim model is a few hundred
    /// bytes, the miss a word).
    Hit(Box<ResourceClaim>),
    /// Nothing usable; why.
    Miss(ClaimRead),
}

#[derive(Debug, Default)]
struct State {
    /// A list has completed and the watch has not failed since.
    synced: bool,
    /// The kept claims, by UID.
    claims: HashMap<String, ResourceClaim>,
    /// Claims of the list in progress (between [`ClaimCache::relist_started`] and
    /// [`ClaimCache::relist_done`]).
    listing: Option<HashMap<String, ResourceClaim>>,
    /// UIDs this plugin unprepared that the watch has not shown deallocated since.
    unprepared: HashSet<String>,
}

/// This node's allocated claims (see the module documentation). The watch feeds it through
/// [`relist_started`](Self::relist_started), [`relisted`](Self::relisted),
/// [`relist_done`](Self::relist_done), [`applied`](Self::applied),
/// [`deleted`](Self::deleted) and [`broken`](Self::broken).
#[derive(Debug)]
pub struct ClaimCache {
    driver: String,
    node: String,
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // Each method leaves the state consistent between statements.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ClaimCache {
    /// An empty, unsynced cache for claims of `driver` allocated in pool `node`.
    pub fn new(driver: impl Into<String>, node: impl Into<String>) -> Self {
        Self {
            driver: driver.into(),
            node: node.into(),
            state: Mutex::new(State::default()),
        }
    }

    /// Whether the cache keeps `claim`: it has a UID and an allocation result of this driver
    /// in this node's pool.
    pub fn keeps(&self, claim: &ResourceClaim) -> bool {
        !claim.metadata.uid.is_empty()
            && claim.allocation().is_some_and(|a| {
                a.results
                    .iter()
                    .any(|r| r.driver == self.driver && r.pool == self.node)
            })
    }

    /// The cached claim for a prepare of `namespace/name` with UID `uid`, or why not.
    pub fn lookup(&self, namespace: &str, name: &str, uid: &str) -> Lookup {
        let st = lock(&self.state);
        if !st.synced {
            return Lookup::Miss(ClaimRead::NotSynced);
        }
        if st.unprepared.contains(uid) {
            return Lookup::Miss(ClaimRead::Unprepared);
        }
        match st.claims.get(uid) {
            Some(c) if c.metadata.namespace == namespace && c.metadata.name == name => {
                Lookup::Hit(Box::new(c.clone()))
            }
            _ => Lookup::Miss(ClaimRead::NotCached),
        }
    }

    /// Claim `uid` is being unprepared: no answers for it until the watch shows it
    /// deallocated or deleted, or a list no longer has it allocated here.
    pub fn forget(&self, uid: &str) {
        let mut st = lock(&self.state);
        st.unprepared.insert(uid.to_owned());
        // UIDs of claims the cache does not hold are cleared only by a later event for them
        // or a new list; keep their number bounded.
        if st.unprepared.len() > st.claims.len() + MAX_UNHELD_UNPREPARED {
            let State {
                claims, unprepared, ..
            } = &mut *st;
            unprepared.retain(|u| claims.contains_key(u));
        }
    }

    /// The pods claim `uid` is reserved for (`status.reservedFor`, resource `pods`), as
    /// (name, UID), if the cache is synced and holds the claim. The node monitor uses it to
    /// map a process's pod to its claims.
    pub fn reserved_pods(&self, uid: &str) -> Option<Vec<(String, String)>> {
        let st = lock(&self.state);
        if !st.synced {
            return None;
        }
        let claim = st.claims.get(uid)?;
        Some(
            claim
                .status
                .iter()
                .flat_map(|s| &s.reserved_for)
                .filter(|r| r.api_group.is_empty() && r.resource == "pods")
                .map(|r| (r.name.clone(), r.uid.clone()))
                .collect(),
        )
    }

    /// Claims held (the watch reports it as a metric).
    pub fn len(&self) -> usize {
        lock(&self.state).claims.len()
    }

    /// Whether no claim is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the cache answers (a list completed, the watch has not failed since).
    pub fn is_synced(&self) -> bool {
        lock(&self.state).synced
    }

    /// The watch starts a list of all claims.
    pub fn relist_started(&self) {
        lock(&self.state).listing = Some(HashMap::new());
    }

    /// A claim of the list in progress.
    pub fn relisted(&self, claim: ResourceClaim) {
        let keep = self.keeps(&claim);
        let mut st = lock(&self.state);
        if keep && let Some(listing) = st.listing.as_mut() {
            listing.insert(claim.metadata.uid.clone(), claim);
        }
    }

    /// The list is complete: it replaces the cache, which answers from now on. An
    /// unprepared UID stays marked only if the list still has it allocated here (a list
    /// after a gap does not show whether it was deallocated and allocated again meanwhile).
    pub fn relist_done(&self) {
        let mut st = lock(&self.state);
        let Some(listing) = st.listing.take() else {
            return;
        };
        st.claims = listing;
        let State {
            claims, unprepared, ..
        } = &mut *st;
        unprepared.retain(|u| claims.contains_key(u));
        st.synced = true;
    }

    /// A claim was added or modified.
    pub fn applied(&self, claim: ResourceClaim) {
        let keep = self.keeps(&claim);
        let mut st = lock(&self.state);
        if keep {
            st.claims.insert(claim.metadata.uid.clone(), claim);
        } else {
            // Deallocated (or allocated elsewhere): what was cached is over, and so is the
            // doubt about an unprepared claim — a later allocation is seen after this.
            st.claims.remove(&claim.metadata.uid);
            st.unprepared.remove(&claim.metadata.uid);
        }
    }

    /// A claim was deleted.
    pub fn deleted(&self, uid: &str) {
        let mut st = lock(&self.state);
        st.claims.remove(uid);
        st.unprepared.remove(uid);
    }

    /// The watch failed: no answers until the next list is complete.
    pub fn broken(&self) {
        let mut st = lock(&self.state);
        st.synced = false;
        st.listing = None;
    }
}

/// A [`ClaimSource`] that answers prepares from a [`ClaimCache`] when it can and asks
/// `inner` (the API server) otherwise; without a cache it is `inner`.
#[derive(Clone, Debug)]
pub struct CachedClaimSource<S> {
    inner: S,
    cache: Option<Arc<ClaimCache>>,
}

impl<S> CachedClaimSource<S> {
    /// `inner` with `cache` in front of it for prepares (`None`: every prepare asks `inner`).
    pub fn new(inner: S, cache: Option<Arc<ClaimCache>>) -> Self {
        Self { inner, cache }
    }

    /// The cache, if any.
    pub fn cache(&self) -> Option<&Arc<ClaimCache>> {
        self.cache.as_ref()
    }
}

impl<S: ClaimSource> ClaimSource for CachedClaimSource<S> {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, SourceError> {
        self.inner.get(namespace, name).await
    }

    async fn get_for_prepare(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<(Option<ResourceClaim>, ClaimRead), SourceError> {
        let read = match &self.cache {
            None => ClaimRead::NoCache,
            Some(cache) => match cache.lookup(namespace, name, uid) {
                Lookup::Hit(claim) => return Ok((Some(*claim), ClaimRead::CacheHit)),
                Lookup::Miss(why) => why,
            },
        };
        Ok((self.inner.get(namespace, name).await?, read))
    }

    fn unprepared(&self, uid: &str) {
        if let Some(cache) = &self.cache {
            cache.forget(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::MapClaimSource;
    use serde_json::json;

    const DRIVER: &str = "gpu.fgpu.dev";
    const NODE: &str = "node-a";

    fn claim(name: &str, uid: &str, results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}}
        }))
        .unwrap()
    }

    fn ours(name: &str, uid: &str, device: &str) -> ResourceClaim {
        claim(
            name,
            uid,
            json!([{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]),
        )
    }

    fn deallocated(name: &str, uid: &str) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid}, "status": {}
        }))
        .unwrap()
    }

    fn synced(claims: &[ResourceClaim]) -> ClaimCache {
        let cache = ClaimCache::new(DRIVER, NODE);
        cache.relist_started();
        for c in claims {
            cache.relisted(c.clone());
        }
        cache.relist_done();
        cache
    }

    fn device(l: &Lookup) -> &str {
        match l {
            Lookup::Hit(c) => &c.allocation().unwrap().results[0].device,
            Lookup::Miss(why) => panic!("miss: {why:?}"),
        }
    }

    #[test]
    fn keeps_only_claims_allocated_to_this_driver_on_this_node() {
        let cache = ClaimCache::new(DRIVER, NODE);
        let other_driver =
            json!([{"request": "r", "driver": "x.example.com", "pool": NODE, "device": "d"}]);
        let other_node =
            json!([{"request": "r", "driver": DRIVER, "pool": "node-b", "device": "gpu-0"}]);
        let mixed = json!([
            {"request": "r", "driver": "x.example.com", "pool": NODE, "device": "d"},
            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}]);
        let table = [
            (ours("a", "u1", "gpu-0"), true),
            (claim("b", "u2", mixed), true),
            (claim("c", "u3", other_driver), false),
            (claim("d", "u4", other_node.clone()), false),
            (claim("e", "u5", json!([])), false),
            (deallocated("f", "u6"), false),
            // No UID: nothing a prepare could match.
            (ours("g", "", "gpu-0"), false),
        ];
        for (c, want) in table {
            assert_eq!(cache.keeps(&c), want, "{}", c.metadata.name);
        }
        // Unallocated claims and claims of other nodes do not stay in the cache.
        let cache = synced(&[ours("a", "u1", "gpu-0"), deallocated("f", "u6")]);
        cache.applied(claim("d", "u4", other_node));
        assert_eq!(cache.len(), 1);
        assert_eq!(
            cache.lookup("ns", "d", "u4"),
            Lookup::Miss(ClaimRead::NotCached)
        );
        assert_eq!(
            cache.lookup("ns", "f", "u6"),
            Lookup::Miss(ClaimRead::NotCached)
        );
    }

    #[test]
    fn answers_only_when_synced_and_for_the_same_uid_name_and_namespace() {
        let cache = ClaimCache::new(DRIVER, NODE);
        assert_eq!(
            cache.lookup("ns", "a", "u1"),
            Lookup::Miss(ClaimRead::NotSynced)
        );
        cache.relist_started();
        cache.relisted(ours("a", "u1", "gpu-0"));
        // Not before the list is complete.
        assert_eq!(
            cache.lookup("ns", "a", "u1"),
            Lookup::Miss(ClaimRead::NotSynced)
        );
        cache.relist_done();
        assert!(cache.is_synced());
        assert_eq!(device(&cache.lookup("ns", "a", "u1")), "gpu-0");
        // Recreated claim (another UID), another name or namespace for the UID: misses.
        assert_eq!(
            cache.lookup("ns", "a", "u9"),
            Lookup::Miss(ClaimRead::NotCached)
        );
        assert_eq!(
            cache.lookup("ns", "b", "u1"),
            Lookup::Miss(ClaimRead::NotCached)
        );
        assert_eq!(
            cache.lookup("other", "a", "u1"),
            Lookup::Miss(ClaimRead::NotCached)
        );
        // A failed watch: nothing until the next list is complete, which replaces everything.
        cache.broken();
        assert_eq!(
            cache.lookup("ns", "a", "u1"),
            Lookup::Miss(ClaimRead::NotSynced)
        );
        cache.relist_started();
        cache.relisted(ours("b", "u2", "gpu-1"));
        cache.relist_done();
        assert_eq!(
            cache.lookup("ns", "a", "u1"),
            Lookup::Miss(ClaimRead::NotCached)
        );
        assert_eq!(device(&cache.lookup("ns", "b", "u2")), "gpu-1");
        // A list cut short by a failure leaves nothing behind.
        cache.relist_started();
        cache.relisted(ours("c", "u3", "gpu-0"));
        cache.broken();
        cache.relist_done();
        assert!(!cache.is_synced());
        cache.relist_started();
        cache.relist_done();
        assert!(cache.is_empty());
    }

    #[test]
    fn watch_events_add_replace_and_remove() {
        let cache = synced(&[]);
        cache.applied(ours("a", "u1", "gpu-0"));
        assert_eq!(device(&cache.lookup("ns", "a", "u1")), "gpu-0");
        cache.applied(deallocated("a", "u1"));
        assert_eq!(
            cache.lookup("ns", "a", "u1"),
            Lookup::Miss(ClaimRead::NotCached)
        );
        cache.applied(ours("a", "u1", "gpu-1"));
        assert_eq!(device(&cache.lookup("ns", "a", "u1")), "gpu-1");
        cache.deleted("u1");
        assert_eq!(
            cache.lookup("ns", "a", "u1"),
            Lookup::Miss(ClaimRead::NotCached)
        );
        assert!(cache.is_empty());
    }

    #[test]
    fn an_unprepared_claim_is_not_answered_until_seen_deallocated() {
        // Unprepared, then the watch brings only a change that keeps the old allocation
        // (e.g. the reservation removed): still no answer.
        let cache = synced(&[ours("a", "u1", "gpu-0"), ours("b", "u2", "gpu-0")]);
        cache.forget("u1");
        assert_eq!(
            cache.lookup("ns", "a", "u1"),
            Lookup::Miss(ClaimRead::Unprepared)
        );
        cache.applied(ours("a", "u1", "gpu-0"));
        assert_eq!(
            cache.lookup("ns", "a", "u1"),
            Lookup::Miss(ClaimRead::Unprepared)
        );
        // Others are not affected.
        assert_eq!(device(&cache.lookup("ns", "b", "u2")), "gpu-0");
        // Deallocated, then allocated anew: the new allocation is answered.
        cache.applied(deallocated("a", "u1"));
        cache.applied(ours("a", "u1", "gpu-1"));
        assert_eq!(device(&cache.lookup("ns", "a", "u1")), "gpu-1");

        // A list still showing it allocated keeps the doubt (the gap may have hidden a
        // reallocation); a list without it clears it.
        cache.forget("u2");
        cache.broken();
        cache.relist_started();
        cache.relisted(ours("b", "u2", "gpu-1"));
        cache.relist_done();
        assert_eq!(
            cache.lookup("ns", "b", "u2"),
            Lookup::Miss(ClaimRead::Unprepared)
        );
        cache.forget("u1");
        cache.relist_started();
        cache.relisted(ours("b", "u2", "gpu-1"));
        cache.relist_done();
        cache.applied(ours("a", "u1", "gpu-0"));
        assert_eq!(device(&cache.lookup("ns", "a", "u1")), "gpu-0");
        // Deleted: cleared too.
        cache.deleted("u2");
        cache.applied(ours("b", "u2", "gpu-0"));
        assert_eq!(device(&cache.lookup("ns", "b", "u2")), "gpu-0");
    }

    #[test]
    fn unprepared_uids_of_claims_not_held_are_bounded() {
        let cache = synced(&[ours("a", "u1", "gpu-0")]);
        cache.forget("u1");
        for i in 0..3 * MAX_UNHELD_UNPREPARED {
            cache.forget(&format!("gone-{i}"));
        }
        let n = lock(&cache.state).unprepared.len();
        assert!(n <= 1 + MAX_UNHELD_UNPREPARED + 1, "{n}");
        // The held claim's mark survives the pruning.
        assert_eq!(
            cache.lookup("ns", "a", "u1"),
            Lookup::Miss(ClaimRead::Unprepared)
        );
    }

    #[tokio::test]
    async fn the_source_answers_hits_from_the_cache_and_misses_from_the_api() {
        let api = Arc::new(MapClaimSource::default());
        // The API server has the current allocation (gpu-1); the cache an older copy of
        // another claim and nothing of c.
        api.insert(ours("a", "u1", "gpu-1"));
        api.insert(ours("c", "u3", "gpu-1"));
        let cache = Arc::new(synced(&[ours("a", "u1", "gpu-0")]));
        let source = CachedClaimSource::new(api.clone(), Some(cache.clone()));

        let (got, read) = source.get_for_prepare("ns", "a", "u1").await.unwrap();
        assert_eq!(read, ClaimRead::CacheHit);
        assert_eq!(
            got.unwrap().allocation().unwrap().results[0].device,
            "gpu-0"
        );
        // A miss goes to the API server, and says why.
        let (got, read) = source.get_for_prepare("ns", "c", "u3").await.unwrap();
        assert_eq!(read, ClaimRead::NotCached);
        assert_eq!(
            got.unwrap().allocation().unwrap().results[0].device,
            "gpu-1"
        );
        let (got, read) = source.get_for_prepare("ns", "gone", "u7").await.unwrap();
        assert_eq!((got, read), (None, ClaimRead::NotCached));
        // After an unprepare the API server's copy is taken.
        source.unprepared("u1");
        let (got, read) = source.get_for_prepare("ns", "a", "u1").await.unwrap();
        assert_eq!(read, ClaimRead::Unprepared);
        assert_eq!(
            got.unwrap().allocation().unwrap().results[0].device,
            "gpu-1"
        );
        // Plain reads (the stale-claim cleanup) never use the cache.
        api.remove("ns", "a");
        cache.applied(ours("a", "u1", "gpu-0"));
        assert_eq!(source.get("ns", "a").await.unwrap(), None);
        // A broken watch: the API server again.
        cache.broken();
        let (_, read) = source.get_for_prepare("ns", "c", "u3").await.unwrap();
        assert_eq!(read, ClaimRead::NotSynced);
        // Without a cache: always the API server.
        let plain = CachedClaimSource::new(api, None);
        let (got, read) = plain.get_for_prepare("ns", "c", "u3").await.unwrap();
        assert_eq!(read, ClaimRead::NoCache);
        assert!(got.is_some());
        plain.unprepared("u3");
    }

    #[tokio::test]
    async fn api_errors_on_a_miss_reach_the_caller() {
        struct Failing;
        impl ClaimSource for Failing {
            async fn get(&self, _: &str, _: &str) -> Result<Option<ResourceClaim>, SourceError> {
                Err(SourceError("connection refused".into()))
            }
        }
        let cache = Arc::new(synced(&[ours("a", "u1", "gpu-0")]));
        let source = CachedClaimSource::new(Failing, Some(cache));
        // A hit does not need the API server at all.
        assert_eq!(
            source.get_for_prepare("ns", "a", "u1").await.unwrap().1,
            ClaimRead::CacheHit
        );
        assert_eq!(
            source.get_for_prepare("ns", "b", "u2").await.unwrap_err(),
            SourceError("connection refused".into())
        );
    }
}
