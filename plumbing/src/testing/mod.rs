//! One in-memory API server for tests (feature `testing`): a small object store keyed by API
//! path behind a real [`kube::Client`] (a tower service; no sockets, no TLS).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use fgpu_plumbing::testing::FakeApiServer;
//! let fake = FakeApiServer::new().group("resource.k8s.io", &["v1"]);
//! fake.lock().unwrap().insert(
//!     "/api/v1/nodes/node-a",
//!     serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"uid": "u"}}),
//! );
//! let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(fake.client());
//! assert_eq!(nodes.get("node-a").await.unwrap().metadata.uid.as_deref(), Some("u"));
//! # }
//! ```
//!
//! What it answers (JSON only):
//!
//! * Discovery: `GET /api` (`v1`), `/apis` and `/apis/{group}` (the groups and versions given
//!   to [`FakeApiServer::group`]; a group without versions is not listed), `/api/v1` and
//!   `/apis/{group}/{version}` (the resources of the objects stored there), `/version`.
//!   Resource paths are served at every group version, listed or not.
//! * Objects at `{prefix}[/namespaces/{ns}]/{resource}/{name}`: GET; POST to the collection
//!   (`generateName`, a `uid`; 409 AlreadyExists); PUT (409 Conflict on a stale
//!   `metadata.resourceVersion`, none: unconditional); PATCH as merge, JSON (RFC 6902),
//!   strategic merge (treated as merge) or apply patch (merge; creates when absent), 409 on a
//!   stale resourceVersion in the patched object; DELETE (preconditions; returns the object);
//!   DELETE of a collection. The `status` subresource: GET, and PUT/PATCH that change only
//!   `.status`. No finalizers, defaulting, validation or generation.
//! * Lists of a collection, in one namespace or all: `labelSelector` (`=`, `==`, `!=`, `in`,
//!   `notin`, exists, `!`), `fieldSelector` (`=`, `==`, `!=` on any dotted path), `limit` and
//!   `continue`, `metadata.resourceVersion` the store's.
//! * Watches (`watch=true`) that stay open and deliver the ADDED, MODIFIED and DELETED
//!   events of writes through the server (and [`State::insert`], [`State::remove`]):
//!   from a numeric `resourceVersion` on (replayed from the history), or without one (or
//!   `0`) every current object as ADDED first. No bookmarks, no timeouts, no expiry.
//! * Errors as `Status` objects with the API server's codes and reasons: 400 BadRequest, 404
//!   NotFound, 405 MethodNotAllowed, 409 AlreadyExists or Conflict, 415, 422 Invalid.
//!
//! A client from [`FakeApiServer::cuttable_client`] comes with a [`Cut`]: while cut, its
//! requests hang (no answer, ever), as an API server that stopped answering one replica.
//!
//! Tests assert on [`State`]'s public fields (`objects`, `writes`, `requests`, `watches`) and
//! change behaviour with two hooks: [`State::on_write`] (rewrite each object before it is
//! stored, as an API server that drops unknown fields does) and [`State::intercept`] (answer
//! a request instead of the store: a 404 for a list, a list that differs from the objects).
//! Editing `objects` directly is allowed and silent (no resourceVersion, no watch event).

mod path;
mod select;
mod store;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LockResult, Mutex, MutexGuard, PoisonError};

use http::{Method, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;

use path::ApiPath;

/// The fake API server: a handle (clones share one store) that makes clients and gives the
/// test its [`State`].
#[derive(Clone, Default)]
pub struct FakeApiServer {
    state: Arc<Mutex<State>>,
}

impl FakeApiServer {
    /// An empty store serving the core group `v1` only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `group` at `versions` (the first preferred) in discovery.
    pub fn group(self, group: &str, versions: &[&str]) -> Self {
        lock(&self.state).serve_group(group, versions);
        self
    }

    /// The store, to set up and to assert on (as [`Mutex::lock`]; a request that panicked
    /// poisons it).
    pub fn lock(&self) -> LockResult<MutexGuard<'_, State>> {
        self.state.lock()
    }

    /// A client of this server, with default namespace `default`. Call it in a Tokio runtime
    /// (the client spawns its request buffer).
    pub fn client(&self) -> kube::Client {
        self.client_with(Cut::default())
    }

    /// A client of this server whose requests `cut` can hang: while cut, the server never
    /// answers this client (its other clients are served), as an API server that stopped
    /// answering one replica. For tests of timeouts and of leader election.
    pub fn cuttable_client(&self) -> (kube::Client, Cut) {
        let cut = Cut::default();
        (self.client_with(cut.clone()), cut)
    }

    fn client_with(&self, cut: Cut) -> kube::Client {
        let state = Arc::clone(&self.state);
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let state = Arc::clone(&state);
            let cut = cut.clone();
            async move {
                if cut.is_cut() {
                    cut.hung.fetch_add(1, Ordering::Relaxed);
                    return std::future::pending().await;
                }
                let (parts, body) = req.into_parts();
                let reply = match body.collect().await {
                    Ok(body) => lock(&state).serve(&parts, &body.to_bytes()),
                    Err(e) => Reply::Answer(Answer::bad_request(format!("request body: {e}"))),
                };
                Ok::<_, Infallible>(reply.into_response())
            }
        });
        kube::Client::new(service, "default")
    }
}

/// The switch of a [`FakeApiServer::cuttable_client`]; clones share it.
#[derive(Clone, Debug, Default)]
pub struct Cut {
    cut: Arc<AtomicBool>,
    hung: Arc<AtomicUsize>,
}

impl Cut {
    /// From now on, requests of this client get no answer (those already answered keep
    /// their answer; an open watch stays open).
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }

    /// From now on, requests are answered again (those that hung stay hung).
    pub fn restore(&self) {
        self.cut.store(false, Ordering::Relaxed);
    }

    /// Whether requests hang now.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// How many requests got no answer so far.
    pub fn hung(&self) -> usize {
        self.hung.load(Ordering::Relaxed)
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Rewrites an object (its key, the object) before it is stored.
type WriteHook = Box<dyn FnMut(&str, &mut Value) + Send>;
/// Answers a request instead of the store, or passes (`None`).
type InterceptHook = Box<dyn FnMut(&Request) -> Option<Answer> + Send>;

/// What the fake server holds.
#[derive(Default)]
pub struct State {
    /// Every object, keyed by its path (`/api/v1/namespaces/ns/pods/p`).
    pub objects: BTreeMap<String, Value>,
    /// Every successful write through the server, in order: `create {key}`, `replace {key}`,
    /// `patch {key}`, `delete {key}`, and `replace {key}/status`, `patch {key}/status`.
    pub writes: Vec<String>,
    /// Every request, in order, as `METHOD path?query` (the query as sent).
    pub requests: Vec<String>,
    /// Watches the store started (not those an [`State::intercept`] hook answered).
    pub watches: usize,
    /// Served groups and their versions, for discovery.
    groups: Vec<(String, Vec<String>)>,
    /// The last resourceVersion given out.
    resource_version: u64,
    /// Names made from `generateName` so far.
    generated: u64,
    /// Every write, for watches that start at an older resourceVersion.
    history: Vec<store::Event>,
    watchers: Vec<store::Watcher>,
    on_write: Option<WriteHook>,
    intercept: Option<InterceptHook>,
}

impl State {
    /// Serves `group` at `versions` (the first preferred) in discovery, replacing what was
    /// served for it.
    pub fn serve_group(&mut self, group: &str, versions: &[&str]) {
        self.groups.retain(|(g, _)| g != group);
        self.groups.push((
            group.to_owned(),
            versions.iter().map(|v| (*v).to_owned()).collect(),
        ));
    }

    /// The last resourceVersion given out (`0` before any write).
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// Stores `object` at `path` (an object's path) as the server would a write: its name
    /// and namespace from the path, a `uid` unless it has one, a new resourceVersion; watches
    /// see ADDED or MODIFIED. Not in `writes`, and no [`State::on_write`] hook. Returns what
    /// is stored.
    ///
    /// # Panics
    ///
    /// When `path` is not an object's path or `object` not a JSON object.
    pub fn insert(&mut self, path: &str, object: Value) -> Value {
        let p = ApiPath::parse(path)
            .filter(|p| p.name.is_some() && p.subresource.is_none())
            .unwrap_or_else(|| panic!("{path} is not the path of an object"));
        assert!(
            object.is_object(),
            "the object at {path} is not a JSON object"
        );
        let key = p.object(p.name.as_deref().unwrap_or_default());
        let mut object = object;
        object["metadata"]["name"] = json!(p.name);
        if let Some(ns) = &p.namespace {
            object["metadata"]["namespace"] = json!(ns);
        }
        let old = self.objects.get(&key).cloned();
        if object["metadata"]["uid"].is_null() {
            object["metadata"]["uid"] = json!(self.new_uid());
        }
        self.commit(&key, old, object)
    }

    /// Removes the object at `path` as a DELETE would (watches see DELETED; not in
    /// `writes`); `None` when there is none.
    pub fn remove(&mut self, path: &str) -> Option<Value> {
        let object = self.objects.remove(path)?;
        Some(self.commit_delete(path, object))
    }

    /// Calls `hook` with the key and the object of every create, replace and patch through
    /// the server (status ones too) before it is stored; replaces an earlier hook.
    pub fn on_write(&mut self, hook: impl FnMut(&str, &mut Value) + Send + 'static) {
        self.on_write = Some(Box::new(hook));
    }

    /// Asks `hook` first about every request: what it answers is the reply (the store is not
    /// consulted, `watches` not counted); `None` lets the store answer. Replaces an earlier
    /// hook.
    pub fn intercept(&mut self, hook: impl FnMut(&Request) -> Option<Answer> + Send + 'static) {
        self.intercept = Some(Box::new(hook));
    }

    /// Answers one HTTP request.
    fn serve(&mut self, parts: &http::request::Parts, body: &Bytes) -> Reply {
        self.requests
            .push(format!("{} {}", parts.method, parts.uri));
        let body = if body.is_empty() {
            None
        } else {
            match serde_json::from_slice(body) {
                Ok(v) => Some(v),
                Err(e) => return Reply::Answer(Answer::bad_request(format!("body: {e}"))),
            }
        };
        let req = Request {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
            query: select::parse_query(parts.uri.query().unwrap_or("")),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("application/json")
                .to_owned(),
            body,
        };
        if let Some(hook) = &mut self.intercept
            && let Some(answer) = hook(&req)
        {
            return Reply::Answer(answer);
        }
        self.route(req).unwrap_or_else(Reply::Answer)
    }

    fn route(&mut self, req: Request) -> Result<Reply, Answer> {
        if req.method == Method::GET
            && let Some(answer) = self.discovery(&req.path)
        {
            return Ok(Reply::Answer(answer));
        }
        let Some(path) = ApiPath::parse(&req.path) else {
            return Err(Answer::status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({})",
                    req.path
                ),
            ));
        };
        let status = match path.subresource.as_deref() {
            None => false,
            Some("status") => true,
            Some(other) => {
                return Err(Answer::status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("the fake API server serves no subresource {other:?}"),
                ));
            }
        };
        let object = path.name.is_some();
        let answer = match req.method {
            Method::GET if !object && req.is_watch() => {
                return Ok(Reply::Watch(self.watch(&path, &req)?));
            }
            Method::GET if !object => self.list(&path, &req)?,
            Method::GET => self.get(&path)?,
            Method::POST if !object => self.create(&path, req.body)?,
            Method::PUT if object => self.replace(&path, req.body, status)?,
            Method::PATCH if object => self.patch(&path, &req, status)?,
            Method::DELETE if object && !status => self.delete(&path, req.body.as_ref())?,
            Method::DELETE if !object => self.delete_collection(&path, &req)?,
            _ => {
                return Err(Answer::status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    format!(
                        "the server does not allow this method on the requested resource ({} {})",
                        req.method, req.path
                    ),
                ));
            }
        };
        Ok(Reply::Answer(answer))
    }

    /// The discovery documents; `None`: not a discovery path.
    fn discovery(&self, path: &str) -> Option<Answer> {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let group = |(name, versions): &(String, Vec<String>)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            json!({"name": name, "versions": versions, "preferredVersion": versions[0]})
        };
        let served = || self.groups.iter().filter(|(_, v)| !v.is_empty());
        let body = match segs.as_slice() {
            ["version"] => json!({
                "major": "1", "minor": "34", "gitVersion": "v1.34.0-fake", "gitCommit": "",
                "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z", "goVersion": "",
                "compiler": "gc", "platform": "linux/amd64"}),
            ["api"] => json!({"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "fake:443"}]}),
            ["apis"] => json!({"kind": "APIGroupList", "apiVersion": "v1",
                "groups": served().map(group).collect::<Vec<_>>()}),
            ["apis", name] => match served().find(|(g, _)| g == name) {
                Some(g) => {
                    let mut body = group(g);
                    body["kind"] = json!("APIGroup");
                    body["apiVersion"] = json!("v1");
                    body
                }
                None => {
                    return Some(Answer::status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        format!("the server could not find the requested resource ({path})"),
                    ));
                }
            },
            ["api", _] | ["apis", _, _] => self.resource_list(path),
            _ => return None,
        };
        Some(Answer::ok(body))
    }
}

/// A request, as an [`State::intercept`] hook sees it.
#[derive(Clone, Debug)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// The path, without the query.
    pub path: String,
    /// The query's parameters, percent-decoded, in order.
    pub query: Vec<(String, String)>,
    /// The `Content-Type` (`application/json` when none).
    pub content_type: String,
    /// The JSON body, if any.
    pub body: Option<Value>,
}

impl Request {
    /// The query parameter `name`, if given.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether this is a watch (`watch=true` or `watch=1`).
    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch"), Some("true" | "1"))
    }
}

/// A reply with a JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The status code.
    pub code: StatusCode,
    /// The body (a `Status` for a failure).
    pub body: Value,
}

impl Answer {
    /// `code` with `body`.
    pub fn new(code: StatusCode, body: Value) -> Self {
        Self { code, body }
    }

    /// 200 with `body`.
    pub fn ok(body: Value) -> Self {
        Self::new(StatusCode::OK, body)
    }

    /// A failure `Status` (`reason`: `NotFound`, `Conflict`, ...) with `code`.
    pub fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Self {
        Self::new(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": message.into(), "reason": reason, "code": code.as_u16()}),
        )
    }

    /// 404 NotFound, with `message`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::status(StatusCode::NOT_FOUND, "NotFound", message)
    }

    /// 400 BadRequest, with `message`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::status(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// The `Status` with `details` of the object at `path` named `name` added.
    fn about(mut self, path: &ApiPath, name: &str) -> Self {
        self.body["details"] = json!({"name": name, "group": path.group, "kind": path.resource});
        self
    }
}

/// What the service sends back.
enum Reply {
    Answer(Answer),
    /// A watch: newline-separated events, open while the store keeps the sender.
    Watch(mpsc::UnboundedReceiver<Bytes>),
}

type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

impl Reply {
    fn into_response(self) -> http::Response<ResponseBody> {
        let (code, body) = match self {
            Self::Answer(a) => (
                a.code,
                Full::new(Bytes::from(a.body.to_string())).boxed_unsync(),
            ),
            Self::Watch(rx) => (
                StatusCode::OK,
                StreamBody::new(
                    tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
                        .map(|line| Ok::<_, Infallible>(Frame::data(line))),
                )
                .boxed_unsync(),
            ),
        };
        let mut resp = http::Response::new(body);
        *resp.status_mut() = code;
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }
}
