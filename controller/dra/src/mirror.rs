//! A watched collection kept as what the controller reads of each object, not as the
//! object: [`Mirror<T>`], fed by a kube-rs [`watcher`].
//!
//! kube-rs's reflector store keeps a `DynamicObject` per object (440 bytes before its
//! metadata's strings and body); the controller needs a [`PodView`](crate::view::PodView)
//! of a pod and a claim's JSON text. A mirror converts each object as its event arrives
//! and keeps only the result, per UID. Relists are atomic as in the reflector: the objects
//! of a relist replace the old set when the relist is complete.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::{Notify, watch};

/// An object as the controller keeps it.
pub trait Mirrored: Send + Sync + 'static {
    /// The object's UID.
    fn uid(&self) -> &str;
}

/// A claim or slice kept as the JSON text of the (trimmed) whole object, LZ4-compressed
/// against a recent object of the same kind ([`Packer`]).
///
/// An allocated claim's text is about 1.1 KiB and most of it (keys, class, driver, node
/// selector, config) repeats from claim to claim; against another claim as the dictionary
/// it packs to a few hundred bytes. Reading it back (a view per version, each write) costs a
/// few microseconds.
#[derive(Clone, Debug)]
pub struct Packed {
    pub uid: String,
    pub resource_version: String,
    /// The whole object, `metadata` included: LZ4 block, its length first.
    packed: Box<[u8]>,
    /// The dictionary it was packed against (shared by the objects packed with it).
    dict: Arc<[u8]>,
}

impl PartialEq for Packed {
    fn eq(&self, other: &Self) -> bool {
        self.uid == other.uid
            && self.resource_version == other.resource_version
            && self.text() == other.text()
    }
}

impl Packed {
    /// `obj` packed on its own (no dictionary).
    pub fn of(obj: &DynamicObject) -> Option<Self> {
        Self::with(obj, Arc::from(&[][..]), false).map(|(p, _)| p)
    }

    /// `obj` packed against `dict`; with `renew`, against its own text instead, which is
    /// returned as the next dictionary.
    fn with(obj: &DynamicObject, dict: Arc<[u8]>, renew: bool) -> Option<(Self, Arc<[u8]>)> {
        let meta = &obj.metadata;
        let uid = meta.uid.clone()?;
        let text = serde_json::to_vec(obj).ok()?;
        let dict = if renew {
            Arc::from(text.as_slice())
        } else {
            dict
        };
        let packed = lz4_flex::block::compress_prepend_size_with_dict(&text, &dict);
        let p = Self {
            uid,
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            packed: packed.into_boxed_slice(),
            dict: dict.clone(),
        };
        Some((p, dict))
    }

    /// The object's JSON text (`None` only if the packed bytes were damaged in memory).
    pub fn text(&self) -> Option<Vec<u8>> {
        lz4_flex::block::decompress_size_prepended_with_dict(&self.packed, &self.dict).ok()
    }

    /// The object as a `Value`.
    pub fn value(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.text()?).ok()
    }

    /// The object read straight from its text into `T` (a typed model); `None` only if the
    /// packed bytes were damaged in memory.
    pub fn read<T: serde::de::DeserializeOwned>(&self) -> Option<Result<T, serde_json::Error>> {
        Some(serde_json::from_slice(&self.text()?))
    }

    /// Bytes held for the text (packed).
    pub fn packed_len(&self) -> usize {
        self.packed.len()
    }
}

/// Packs objects of one kind, each against a recent one: the dictionary is the text of
/// every [`Packer::RENEW`]th object packed (the first included), so it follows what the
/// objects look like now (claims pending at start, allocated later). An object keeps the
/// dictionary it was packed with; an old dictionary is freed with its last object.
#[derive(Default)]
pub struct Packer(Mutex<(Arc<[u8]>, u64)>);

impl Packer {
    /// How many objects are packed against one dictionary.
    pub const RENEW: u64 = 256;

    pub fn pack(&self, obj: &DynamicObject) -> Option<Packed> {
        let mut g = lock(&self.0);
        let (dict, packed) = &mut *g;
        let renew = *packed % Self::RENEW == 0;
        let (p, next) = Packed::with(obj, dict.clone(), renew)?;
        *dict = next;
        *packed += 1;
        Some(p)
    }
}

impl Mirrored for Packed {
    fn uid(&self) -> &str {
        &self.uid
    }
}

impl Mirrored for crate::view::PodView {
    fn uid(&self) -> &str {
        &self.id.uid
    }
}

/// What a converter makes of an object: keep this, or not of interest (forget the UID).
pub type Convert<T> = Box<dyn Fn(DynamicObject) -> Option<T> + Send + Sync>;

/// A held object, found in its set by its UID (so the UID is not kept twice, as a key too:
/// about 80 bytes an object).
struct Held<T>(Arc<T>);

impl<T: Mirrored> Borrow<str> for Held<T> {
    fn borrow(&self) -> &str {
        self.0.uid()
    }
}

impl<T: Mirrored> Hash for Held<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `str` hashes: `Borrow<str>` lookups must find it.
        self.0.uid().hash(state);
    }
}

impl<T: Mirrored> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.uid() == other.0.uid()
    }
}

impl<T: Mirrored> Eq for Held<T> {}

struct State<T> {
    items: HashSet<Held<T>>,
    /// A relist in progress.
    relist: Option<HashSet<Held<T>>>,
}

impl<T> Default for State<T> {
    fn default() -> Self {
        Self {
            items: HashSet::new(),
            relist: None,
        }
    }
}

/// The current set of one kind of object, as `T`s.
pub struct Mirror<T> {
    state: Arc<Mutex<State<T>>>,
    ready: watch::Receiver<bool>,
    /// The task feeding it; stopped when the mirror is dropped.
    feed: tokio::task::JoinHandle<()>,
}

impl<T> Drop for Mirror<T> {
    fn drop(&mut self) {
        self.feed.abort();
    }
}

impl<T: Mirrored> Mirror<T> {
    /// Starts watching with `api` (all namespaces); every change wakes `wake`. `convert`
    /// turns each object into its `T`; `None` means not of interest (a pod that lost the
    /// gate: forgotten if held).
    pub fn start(
        api: Api<DynamicObject>,
        what: &'static str,
        page_size: u32,
        wake: Arc<Notify>,
        convert: Convert<T>,
    ) -> Self {
        let state: Arc<Mutex<State<T>>> = Arc::new(Mutex::new(State::default()));
        let (ready_tx, ready) = watch::channel(false);
        let fed = state.clone();
        let config = watcher::Config::default().page_size(page_size);
        let stream = watcher(api, config).default_backoff();
        let feed = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => {
                        if apply(&fed, ev, &convert) {
                            let _ = ready_tx.send(true);
                        }
                        wake.notify_one();
                    }
                    Err(e) => tracing::warn!(resource = what, "watch: {e}"),
                }
            }
        });
        Self { state, ready, feed }
    }

    /// Waits for the first complete list.
    pub async fn ready(&mut self) -> Result<(), watch::error::RecvError> {
        self.ready.wait_for(|r| *r).await.map(|_| ())
    }

    /// Every object held now.
    pub fn state(&self) -> Vec<Arc<T>> {
        lock(&self.state)
            .items
            .iter()
            .map(|h| h.0.clone())
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves a map that is still consistent (every change
    // is one insert or remove): keep using it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Applies one watcher event; true when a list has just completed.
fn apply<T: Mirrored>(
    state: &Mutex<State<T>>,
    ev: watcher::Event<DynamicObject>,
    convert: &Convert<T>,
) -> bool {
    let uid_of = |o: &DynamicObject| o.metadata.uid.clone().unwrap_or_default();
    let mut s = lock(state);
    match ev {
        watcher::Event::Init => {
            s.relist = Some(HashSet::new());
            false
        }
        watcher::Event::InitApply(o) => {
            if let (Some(t), Some(relist)) = (convert(o), s.relist.as_mut()) {
                relist.replace(Held(Arc::new(t)));
            }
            false
        }
        watcher::Event::InitDone => {
            if let Some(items) = s.relist.take() {
                s.items = items;
            }
            true
        }
        watcher::Event::Apply(o) => {
            let uid = uid_of(&o);
            match convert(o) {
                Some(t) => {
                    s.items.replace(Held(Arc::new(t)));
                }
                None => {
                    s.items.remove(uid.as_str());
                }
            }
            false
        }
        watcher::Event::Delete(o) => {
            s.items.remove(uid_of(&o).as_str());
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    impl Mirrored for String {
        fn uid(&self) -> &str {
            self
        }
    }

    fn obj(uid: &str, keep: bool) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid,
                         "labels": {"keep": keep.to_string()}}}))
        .expect("object")
    }

    fn keep_labelled() -> Convert<String> {
        Box::new(|o: DynamicObject| {
            let keep = o.metadata.labels.as_ref()?.get("keep")? == "true";
            keep.then(|| o.metadata.uid.unwrap_or_default())
        })
    }

    #[test]
    fn packed_objects_read_back_exactly_and_share_a_recent_dictionary() {
        let claim = |i: usize, allocated: bool| -> DynamicObject {
            let mut v = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": format!("c-{i:05}"), "namespace": "bench", "uid": format!("uid-{i:08}"),
                             "resourceVersion": (1000 + i).to_string()},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": "shared.gpu.fgpu.dev",
                    "capacity": {"requests": {"memory": "20Gi", "cores": "30"}}}}]}}});
            if allocated {
                v["status"] = json!({"allocation": {"devices": {"results": [{"request": "gpu",
                    "driver": "gpu.fgpu.dev", "pool": format!("node-{}", i % 7), "device": "gpu-3",
                    "consumedCapacity": {"memory": "20Gi", "cores": "30"}}]}}});
            }
            serde_json::from_value(v).expect("object")
        };
        let packer = Packer::default();
        let mut packed = Vec::new();
        for i in 0..600 {
            let o = claim(i, i >= 300);
            let p = packer.pack(&o).expect("uid");
            assert_eq!(
                p.value().expect("reads back"),
                serde_json::to_value(&o).unwrap()
            );
            assert_eq!(
                (p.uid.as_str(), p.resource_version.clone()),
                (o.metadata.uid.as_deref().unwrap(), (1000 + i).to_string())
            );
            packed.push(p);
        }
        // Every 256th object renews the dictionary; the others share the one before them.
        assert!(Arc::ptr_eq(&packed[1].dict, &packed[255].dict));
        assert!(!Arc::ptr_eq(&packed[255].dict, &packed[256].dict));
        // Against a like object the text packs to a small part of itself ...
        let alone = Packed::of(&claim(599, true)).expect("uid");
        let text = alone.text().expect("text").len();
        assert_eq!(alone, packed[599]);
        assert!(
            packed[599].packed_len() * 3 < text,
            "{} of {text}",
            packed[599].packed_len()
        );
        assert!(packed[599].packed_len() < alone.packed_len());
        // ... and damaged bytes read as nothing, not as another object.
        let mut bad = packed[599].clone();
        bad.packed = vec![0xff; 8].into_boxed_slice();
        assert!(bad.value().is_none());
    }

    #[test]
    fn a_new_version_replaces_the_held_one() {
        #[derive(Debug, PartialEq)]
        struct Tagged(String, String);
        impl Mirrored for Tagged {
            fn uid(&self) -> &str {
                &self.0
            }
        }
        let tagged = |uid: &str, v: &str| -> DynamicObject {
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": uid, "namespace": "ns", "uid": uid, "resourceVersion": v}}))
            .expect("object")
        };
        let c: Convert<Tagged> = Box::new(|o: DynamicObject| {
            Some(Tagged(o.metadata.uid?, o.metadata.resource_version?))
        });
        let s = Mutex::new(State::default());
        let now = |s: &Mutex<State<Tagged>>| -> Vec<(String, String)> {
            let mut v: Vec<_> = lock(s)
                .items
                .iter()
                .map(|h| (h.0.0.clone(), h.0.1.clone()))
                .collect();
            v.sort();
            v
        };
        apply(&s, watcher::Event::Init, &c);
        apply(&s, watcher::Event::InitApply(tagged("a", "1")), &c);
        apply(&s, watcher::Event::InitApply(tagged("a", "2")), &c);
        apply(&s, watcher::Event::InitDone, &c);
        assert_eq!(now(&s), [("a".to_owned(), "2".to_owned())]);
        apply(&s, watcher::Event::Apply(tagged("a", "3")), &c);
        apply(&s, watcher::Event::Apply(tagged("b", "4")), &c);
        assert_eq!(
            now(&s),
            [
                ("a".to_owned(), "3".to_owned()),
                ("b".to_owned(), "4".to_owned())
            ]
        );
        apply(&s, watcher::Event::Delete(tagged("a", "5")), &c);
        assert_eq!(now(&s), [("b".to_owned(), "4".to_owned())]);
    }

    fn held(s: &Mutex<State<String>>) -> Vec<String> {
        let mut v: Vec<String> = lock(s).items.iter().map(|h| h.0.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn relists_replace_the_set_when_complete_and_uninteresting_objects_are_dropped() {
        let s = Mutex::new(State::default());
        let c = keep_labelled();
        assert!(!apply(&s, watcher::Event::Init, &c));
        apply(&s, watcher::Event::InitApply(obj("a", true)), &c);
        apply(&s, watcher::Event::InitApply(obj("b", false)), &c);
        assert!(held(&s).is_empty(), "nothing before the list completes");
        assert!(apply(&s, watcher::Event::InitDone, &c));
        assert_eq!(held(&s), ["a"]);

        apply(&s, watcher::Event::Apply(obj("c", true)), &c);
        assert_eq!(held(&s), ["a", "c"]);
        // a is no longer of interest: forgotten.
        apply(&s, watcher::Event::Apply(obj("a", false)), &c);
        assert_eq!(held(&s), ["c"]);
        apply(&s, watcher::Event::Delete(obj("c", true)), &c);
        assert!(held(&s).is_empty());

        // A relist: the old set stays until it is complete, then is replaced whole.
        apply(&s, watcher::Event::Apply(obj("old", true)), &c);
        apply(&s, watcher::Event::Init, &c);
        apply(&s, watcher::Event::InitApply(obj("new", true)), &c);
        assert_eq!(held(&s), ["old"]);
        apply(&s, watcher::Event::InitDone, &c);
        assert_eq!(held(&s), ["new"]);
    }
}
