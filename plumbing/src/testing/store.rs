//! The store's verbs, its resourceVersions, and its watches.

use std::collections::BTreeMap;

use http::StatusCode;
use hyper::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::path::ApiPath;
use super::select::Selector;
use super::{Answer, Request, State};

/// One write, as watches see it.
pub(super) struct Event {
    /// The resourceVersion the write gave out.
    rv: u64,
    key: ApiPath,
    /// Before the write (`None`: created).
    old: Option<Value>,
    /// After the write (the last state when deleted).
    new: Value,
    deleted: bool,
}

/// An open watch.
pub(super) struct Watcher {
    collection: ApiPath,
    labels: Selector,
    fields: Selector,
    tx: mpsc::UnboundedSender<Bytes>,
}

impl Watcher {
    /// The line this watch gets for `ev`, if it sees it: an object that leaves the selection
    /// is DELETED for it, one that enters it ADDED.
    fn line(&self, ev: &Event) -> Option<Bytes> {
        if !self.collection.contains(&ev.key) {
            return None;
        }
        let selected = |v: &Value| self.labels.matches_labels(v) && self.fields.matches_fields(v);
        let kind = if ev.deleted {
            selected(&ev.new).then_some("DELETED")?
        } else {
            match (ev.old.as_ref().is_some_and(selected), selected(&ev.new)) {
                (true, true) => "MODIFIED",
                (false, true) => "ADDED",
                (true, false) => "DELETED",
                (false, false) => return None,
            }
        };
        Some(line(kind, &ev.new))
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({"type": kind, "object": object})))
}

/// `v1` or `group/version` of a `/api/v1` or `/apis/group/version` prefix.
fn group_version(prefix: &str) -> &str {
    prefix
        .strip_prefix("/apis/")
        .or_else(|| prefix.strip_prefix("/api/"))
        .unwrap_or(prefix)
}

/// The body of a create or replace: a JSON object whose `metadata`, if any, is one.
fn object_body(body: Option<Value>) -> Result<Value, Answer> {
    match body {
        Some(v) if v.is_object() && (v["metadata"].is_object() || v["metadata"].is_null()) => Ok(v),
        _ => Err(Answer::bad_request(
            "the body must be a JSON object (with object metadata)",
        )),
    }
}

fn invalid(message: impl Into<String>) -> Answer {
    Answer::status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
}

fn rv_of(object: &Value) -> Option<&str> {
    object["metadata"]["resourceVersion"]
        .as_str()
        .filter(|rv| !rv.is_empty())
}

/// Sets `.status` of `to` to that of `from` (removed when `from` has none).
fn take_status(to: &mut Value, from: &Value) {
    match from.get("status") {
        Some(s) => to["status"] = s.clone(),
        None => {
            if let Some(o) = to.as_object_mut() {
                o.remove("status");
            }
        }
    }
}

impl State {
    /// A number not given out before (for names and uids).
    fn count(&mut self) -> u64 {
        self.generated += 1;
        self.generated
    }

    pub(super) fn new_uid(&mut self) -> String {
        format!("fake-uid-{}", self.count())
    }

    /// A suffix for `generateName`, in the API server's alphabet.
    fn suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut n = self.count();
        (0..5)
            .map(|_| {
                let c = ALPHABET[(n % ALPHABET.len() as u64) as usize];
                n /= ALPHABET.len() as u64;
                c as char
            })
            .collect()
    }

    /// Stores `new` at `key` with a new resourceVersion; watches see it. Returns it.
    pub(super) fn commit(&mut self, key: &str, old: Option<Value>, mut new: Value) -> Value {
        self.resource_version += 1;
        new["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.objects.insert(key.to_owned(), new.clone());
        self.event(key, old, new.clone(), false);
        new
    }

    /// Records the deletion of `object` (already out of `objects`) at `key` with a new
    /// resourceVersion; watches see it. Returns it.
    pub(super) fn commit_delete(&mut self, key: &str, mut object: Value) -> Value {
        self.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.event(key, None, object.clone(), true);
        object
    }

    fn event(&mut self, key: &str, old: Option<Value>, new: Value, deleted: bool) {
        let Some(key) = ApiPath::parse(key) else {
            return;
        };
        let ev = Event {
            rv: self.resource_version,
            key,
            old,
            new,
            deleted,
        };
        self.watchers.retain(|w| match w.line(&ev) {
            Some(line) => w.tx.send(line).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push(ev);
    }

    /// Runs the [`State::on_write`] hook.
    fn rewrite(&mut self, key: &str, object: &mut Value) {
        if let Some(hook) = &mut self.on_write {
            hook(key, object);
        }
    }

    fn not_found(path: &ApiPath, name: &str) -> Answer {
        Answer::not_found(format!("{} {name:?} not found", path.qualified())).about(path, name)
    }

    fn conflict(path: &ApiPath, name: &str, message: &str) -> Answer {
        Answer::status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {message}",
                path.qualified()
            ),
        )
        .about(path, name)
    }

    /// 409 when `sent` carries a resourceVersion other than `current`'s.
    fn precondition(
        path: &ApiPath,
        name: &str,
        current: &Value,
        sent: &Value,
    ) -> Result<(), Answer> {
        match rv_of(sent) {
            Some(rv) if Some(rv) != rv_of(current) => Err(Self::conflict(
                path,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )),
            _ => Ok(()),
        }
    }

    /// Gives `object` the path's namespace; 400 when it names another.
    fn namespace_of(path: &ApiPath, object: &mut Value) -> Result<(), Answer> {
        let Some(ns) = &path.namespace else {
            return Ok(());
        };
        match object["metadata"]["namespace"].as_str() {
            Some(o) if !o.is_empty() && o != ns => Err(Answer::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            )),
            _ => {
                object["metadata"]["namespace"] = json!(ns);
                Ok(())
            }
        }
    }

    /// The object's name and key (the path without its subresource).
    fn named(path: &ApiPath) -> (String, String) {
        let name = path.name.clone().unwrap_or_default();
        let key = path.object(&name);
        (name, key)
    }

    pub(super) fn get(&self, path: &ApiPath) -> Result<Answer, Answer> {
        let (name, key) = Self::named(path);
        self.objects
            .get(&key)
            .map(|o| Answer::ok(o.clone()))
            .ok_or_else(|| Self::not_found(path, &name))
    }

    /// The keys of the objects in collection `path` that `req`'s selectors select.
    fn selected(&self, path: &ApiPath, req: &Request) -> Result<Vec<String>, Answer> {
        let labels = Selector::labels(req.param("labelSelector").unwrap_or(""))
            .map_err(Answer::bad_request)?;
        let fields = Selector::fields(req.param("fieldSelector").unwrap_or(""))
            .map_err(Answer::bad_request)?;
        Ok(self
            .objects
            .iter()
            .filter(|(k, v)| {
                ApiPath::parse(k).is_some_and(|p| path.contains(&p))
                    && labels.matches_labels(v)
                    && fields.matches_fields(v)
            })
            .map(|(k, _)| k.clone())
            .collect())
    }

    /// A list of `items` of collection `path`, its kind from the objects stored there.
    fn list_of(&self, path: &ApiPath, items: Vec<Value>, continue_: Option<&str>) -> Value {
        let kind = self
            .objects
            .iter()
            .filter(|(k, _)| ApiPath::parse(k).is_some_and(|p| path.contains(&p)))
            .find_map(|(_, v)| v["kind"].as_str())
            .map_or_else(|| "List".to_owned(), |k| format!("{k}List"));
        let mut metadata = json!({"resourceVersion": self.resource_version.to_string()});
        if let Some(c) = continue_ {
            metadata["continue"] = json!(c);
        }
        json!({"apiVersion": group_version(&path.prefix), "kind": kind,
               "metadata": metadata, "items": items})
    }

    pub(super) fn list(&self, path: &ApiPath, req: &Request) -> Result<Answer, Answer> {
        let limit = match req.param("limit").filter(|l| !l.is_empty()) {
            None => usize::MAX,
            Some(l) => match l.parse::<usize>() {
                Ok(0) => usize::MAX,
                Ok(n) => n,
                Err(_) => return Err(Answer::bad_request(format!("limit {l:?}"))),
            },
        };
        let after = req.param("continue").filter(|c| !c.is_empty());
        let keys: Vec<String> = self
            .selected(path, req)?
            .into_iter()
            .filter(|k| after.is_none_or(|a| k.as_str() > a))
            .collect();
        let page = &keys[..keys.len().min(limit)];
        let continue_ = if page.len() < keys.len() {
            page.last().map(String::as_str)
        } else {
            None
        };
        let items = page.iter().map(|k| self.objects[k].clone()).collect();
        Ok(Answer::ok(self.list_of(path, items, continue_)))
    }

    pub(super) fn watch(
        &mut self,
        path: &ApiPath,
        req: &Request,
    ) -> Result<mpsc::UnboundedReceiver<Bytes>, Answer> {
        let labels = Selector::labels(req.param("labelSelector").unwrap_or(""))
            .map_err(Answer::bad_request)?;
        let fields = Selector::fields(req.param("fieldSelector").unwrap_or(""))
            .map_err(Answer::bad_request)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = Watcher {
            collection: path.clone(),
            labels,
            fields,
            tx,
        };
        match req
            .param("resourceVersion")
            .filter(|rv| !rv.is_empty() && *rv != "0")
        {
            // From now, with what is there as ADDED first.
            None => {
                for key in self.selected(path, req)? {
                    let _ = watcher.tx.send(line("ADDED", &self.objects[&key]));
                }
            }
            Some(rv) => {
                let from: u64 = rv
                    .parse()
                    .map_err(|_| Answer::bad_request(format!("resourceVersion {rv:?}")))?;
                for ev in self.history.iter().filter(|ev| ev.rv > from) {
                    if let Some(line) = watcher.line(ev) {
                        let _ = watcher.tx.send(line);
                    }
                }
            }
        }
        self.watchers.push(watcher);
        self.watches += 1;
        Ok(rx)
    }

    pub(super) fn create(&mut self, path: &ApiPath, body: Option<Value>) -> Result<Answer, Answer> {
        let mut obj = object_body(body)?;
        let name = match obj["metadata"]["name"].as_str().filter(|n| !n.is_empty()) {
            Some(n) => n.to_owned(),
            None => match obj["metadata"]["generateName"]
                .as_str()
                .filter(|g| !g.is_empty())
            {
                Some(prefix) => format!("{prefix}{}", self.suffix()),
                None => {
                    return Err(invalid(format!(
                        "{} is invalid: metadata.name: Required value: name or generateName is required",
                        path.qualified()
                    )));
                }
            },
        };
        Self::namespace_of(path, &mut obj)?;
        let key = path.object(&name);
        if self.objects.contains_key(&key) {
            return Err(Answer::status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} {name:?} already exists", path.qualified()),
            )
            .about(path, &name));
        }
        obj["metadata"]["name"] = json!(name);
        if obj["metadata"]["uid"].is_null() {
            obj["metadata"]["uid"] = json!(self.new_uid());
        }
        self.rewrite(&key, &mut obj);
        let stored = self.commit(&key, None, obj);
        self.writes.push(format!("create {key}"));
        Ok(Answer::new(StatusCode::CREATED, stored))
    }

    /// The object to store for a replace or patch of `current` (if any) with `sent`: only
    /// its status for the `status` subresource, else `sent` with the path's name and
    /// namespace and the current uid.
    fn next_version(
        &mut self,
        path: &ApiPath,
        current: Option<&Value>,
        mut sent: Value,
        status: bool,
    ) -> Result<Value, Answer> {
        let (name, _) = Self::named(path);
        if let Some(c) = current {
            Self::precondition(path, &name, c, &sent)?;
        }
        if let (Some(c), true) = (current, status) {
            let mut next = c.clone();
            take_status(&mut next, &sent);
            return Ok(next);
        }
        if !(sent["metadata"].is_object() || sent["metadata"].is_null()) {
            return Err(invalid("metadata must be an object"));
        }
        sent["metadata"]["name"] = json!(name);
        Self::namespace_of(path, &mut sent)?;
        if sent["metadata"]["uid"].is_null() {
            sent["metadata"]["uid"] = match current {
                Some(c) => c["metadata"]["uid"].clone(),
                None => json!(self.new_uid()),
            };
        }
        Ok(sent)
    }

    fn log(&mut self, verb: &str, key: &str, status: bool) {
        let sub = if status { "/status" } else { "" };
        self.writes.push(format!("{verb} {key}{sub}"));
    }

    pub(super) fn replace(
        &mut self,
        path: &ApiPath,
        body: Option<Value>,
        status: bool,
    ) -> Result<Answer, Answer> {
        let (name, key) = Self::named(path);
        let current = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| Self::not_found(path, &name))?;
        let obj = object_body(body)?;
        if let Some(n) = obj["metadata"]["name"].as_str()
            && n != name
        {
            return Err(Answer::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        let mut next = self.next_version(path, Some(&current), obj, status)?;
        self.rewrite(&key, &mut next);
        let stored = self.commit(&key, Some(current), next);
        self.log("replace", &key, status);
        Ok(Answer::ok(stored))
    }

    pub(super) fn patch(
        &mut self,
        path: &ApiPath,
        req: &Request,
        status: bool,
    ) -> Result<Answer, Answer> {
        let (name, key) = Self::named(path);
        let current = self.objects.get(&key).cloned();
        let patch = req
            .body
            .clone()
            .ok_or_else(|| Answer::bad_request("a patch needs a body"))?;
        let content_type = req.content_type.split(';').next().unwrap_or("").trim();
        let apply = content_type == "application/apply-patch+yaml";
        let mut obj = match &current {
            Some(c) => c.clone(),
            None if apply && !status => json!({"metadata": {}}),
            None => return Err(Self::not_found(path, &name)),
        };
        match content_type {
            "application/merge-patch+json"
            | "application/strategic-merge-patch+json"
            | "application/apply-patch+yaml" => json_patch::merge(&mut obj, &patch),
            "application/json-patch+json" => {
                let p: json_patch::Patch = serde_json::from_value(patch)
                    .map_err(|e| Answer::bad_request(format!("JSON patch: {e}")))?;
                json_patch::patch(&mut obj, &p).map_err(|e| invalid(format!("JSON patch: {e}")))?;
            }
            other => {
                return Err(Answer::status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    format!("the body of the request was in an unknown format ({other})"),
                ));
            }
        }
        if !obj.is_object() {
            return Err(invalid("the patched object is not a JSON object"));
        }
        let mut next = self.next_version(path, current.as_ref(), obj, status)?;
        self.rewrite(&key, &mut next);
        let code = if current.is_some() {
            StatusCode::OK
        } else {
            StatusCode::CREATED
        };
        let stored = self.commit(&key, current, next);
        self.log("patch", &key, status);
        Ok(Answer::new(code, stored))
    }

    pub(super) fn delete(
        &mut self,
        path: &ApiPath,
        body: Option<&Value>,
    ) -> Result<Answer, Answer> {
        let (name, key) = Self::named(path);
        let current = self
            .objects
            .get(&key)
            .ok_or_else(|| Self::not_found(path, &name))?;
        let pre = body.map_or(&Value::Null, |b| &b["preconditions"]);
        for (field, what) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            let have = current["metadata"][field].as_str().unwrap_or("");
            if let Some(want) = pre[field].as_str()
                && want != have
            {
                return Err(Self::conflict(
                    path,
                    &name,
                    &format!(
                        "Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"
                    ),
                ));
            }
        }
        let object = self.objects.remove(&key).unwrap_or_default();
        let deleted = self.commit_delete(&key, object);
        self.log("delete", &key, false);
        Ok(Answer::ok(deleted))
    }

    pub(super) fn delete_collection(
        &mut self,
        path: &ApiPath,
        req: &Request,
    ) -> Result<Answer, Answer> {
        let mut items = vec![];
        for key in self.selected(path, req)? {
            if let Some(object) = self.objects.remove(&key) {
                items.push(self.commit_delete(&key, object));
                self.log("delete", &key, false);
            }
        }
        Ok(Answer::ok(self.list_of(path, items, None)))
    }

    /// The APIResourceList of group version `path` (`/api/v1`, `/apis/g/v`): the resources
    /// of the objects stored there.
    pub(super) fn resource_list(&self, path: &str) -> Value {
        let prefix = path.trim_end_matches('/');
        let mut resources = BTreeMap::new();
        for (key, object) in &self.objects {
            if let Some(p) = ApiPath::parse(key)
                && p.prefix == prefix
                && p.name.is_some()
            {
                resources.entry(p.resource.clone()).or_insert_with(|| {
                    json!({"name": p.resource, "singularName": "", "namespaced": p.namespace.is_some(),
                           "kind": object["kind"].as_str().unwrap_or(""),
                           "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]})
                });
            }
        }
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version(prefix),
               "resources": resources.into_values().collect::<Vec<_>>()})
    }
}
