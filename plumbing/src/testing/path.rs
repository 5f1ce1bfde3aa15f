//! API paths: `/api/v1/...` and `/apis/{group}/{version}/...`, split into the parts the
//! store keys objects by.

/// A path below a group version: a collection, an object, or an object's subresource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ApiPath {
    /// `/api/v1` or `/apis/{group}/{version}`.
    pub prefix: String,
    /// `""` for the core group.
    pub group: String,
    /// The resource, plural (`pods`).
    pub resource: String,
    /// The namespace in the path; `None`: cluster-scoped, or all namespaces for a list.
    pub namespace: Option<String>,
    /// The object's name; `None`: the collection.
    pub name: Option<String>,
    /// `status`, ...
    pub subresource: Option<String>,
}

impl ApiPath {
    /// Splits `path`; `None` for anything that is not a resource path (discovery included).
    pub fn parse(path: &str) -> Option<Self> {
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (prefix, group, rest) = match segs.as_slice() {
            ["api", version, rest @ ..] => (format!("/api/{version}"), String::new(), rest),
            ["apis", group, version, rest @ ..] => (
                format!("/apis/{group}/{version}"),
                (*group).to_owned(),
                rest,
            ),
            _ => return None,
        };
        let owned = |s: &&str| Some((*s).to_owned());
        let (namespace, resource, name, subresource) = match rest {
            // Namespaces themselves (cluster-scoped), and their subresources.
            ["namespaces"] => (None, "namespaces", None, None),
            ["namespaces", n] => (None, "namespaces", owned(n), None),
            ["namespaces", n, sub @ ("status" | "finalize")] => {
                (None, "namespaces", owned(n), owned(sub))
            }
            ["namespaces", ns, resource, tail @ ..] if tail.len() <= 2 => (
                owned(ns),
                *resource,
                tail.first().and_then(owned),
                tail.get(1).and_then(owned),
            ),
            [resource, tail @ ..] if tail.len() <= 2 => (
                None,
                *resource,
                tail.first().and_then(owned),
                tail.get(1).and_then(owned),
            ),
            _ => return None,
        };
        Some(Self {
            prefix,
            group,
            resource: resource.to_owned(),
            namespace,
            name,
            subresource,
        })
    }

    /// The path of the collection this path is in (or is), in its namespace.
    pub fn collection(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/namespaces/{ns}/{}", self.prefix, self.resource),
            None => format!("{}/{}", self.prefix, self.resource),
        }
    }

    /// The path of object `name` in this path's collection (the store's key).
    pub fn object(&self, name: &str) -> String {
        format!("{}/{name}", self.collection())
    }

    /// Whether the object stored at `key` is in this (collection) path: same group version
    /// and resource, and the same namespace unless this path spans all namespaces.
    pub fn contains(&self, key: &ApiPath) -> bool {
        key.name.is_some()
            && key.subresource.is_none()
            && key.prefix == self.prefix
            && key.resource == self.resource
            && (self.namespace.is_none() || self.namespace == key.namespace)
    }

    /// `resource.group` as the API server names it in messages (`pods`, `leases.coordination.k8s.io`).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ApiPath;

    #[test]
    fn paths_split_into_collection_object_and_subresource() {
        let p = ApiPath::parse("/api/v1/namespaces/ml/pods/p/status").unwrap();
        assert_eq!(
            (
                p.prefix.as_str(),
                p.resource.as_str(),
                p.namespace.as_deref()
            ),
            ("/api/v1", "pods", Some("ml"))
        );
        assert_eq!(
            (p.name.as_deref(), p.subresource.as_deref()),
            (Some("p"), Some("status"))
        );
        assert_eq!(p.object("q"), "/api/v1/namespaces/ml/pods/q");

        let all = ApiPath::parse("/api/v1/pods").unwrap();
        assert_eq!(
            (all.namespace.as_deref(), all.name.as_deref()),
            (None, None)
        );
        assert!(all.contains(&p.clone().without_subresource()));

        let ns = ApiPath::parse("/api/v1/namespaces/ml").unwrap();
        assert_eq!(
            (ns.resource.as_str(), ns.name.as_deref()),
            ("namespaces", Some("ml"))
        );

        let slice = ApiPath::parse("/apis/resource.k8s.io/v1/resourceslices/s").unwrap();
        assert_eq!(slice.qualified(), "resourceslices.resource.k8s.io");
        assert_eq!(
            slice.collection(),
            "/apis/resource.k8s.io/v1/resourceslices"
        );
        assert!(
            !ApiPath::parse("/apis/resource.k8s.io/v1beta1/resourceslices")
                .unwrap()
                .contains(&slice)
        );

        assert_eq!(ApiPath::parse("/apis"), None);
        assert_eq!(ApiPath::parse("/version"), None);
        assert_eq!(ApiPath::parse("/api/v1/pods/a/b/c"), None);
    }

    impl ApiPath {
        fn without_subresource(mut self) -> Self {
            self.subresource = None;
            self
        }
    }
}
