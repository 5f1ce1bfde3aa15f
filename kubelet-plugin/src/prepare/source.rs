//! Where claims come from: the API server in production (through the claim cache), a map
//! in tests.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use super::unpoisoned;
use crate::claim::ResourceClaim;
use crate::metrics::ClaimRead;

/// Where claims come from: the API server in production (through the claim cache, see
/// [`crate::claim_cache`]), a map in tests.
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim `namespace/name` as the API server has it now; `Ok(None)` only when the
    /// source knows that this object does not exist (the API server's NotFound naming it).
    /// Anything that does not say so — a 404 of a version or a path the API server does not
    /// serve, a proxy's error page, a timeout, a 5xx — is an error, never `Ok(None)`: the
    /// stale-claim sweep removes a claim's state on `Ok(None)` (seen twice).
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaim>, SourceError>> + Send;

    /// The claim `namespace/name` for a prepare of UID `uid`, and where it came from. A
    /// source may answer from a cache when it holds an allocated claim of that UID (the
    /// kubelet prepares only allocated claims, and an allocation does not change while it is
    /// set); otherwise, and by default, this is [`get`](Self::get).
    fn get_for_prepare(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(Option<ResourceClaim>, ClaimRead), SourceError>> + Send {
        let _ = uid;
        async move { Ok((self.get(namespace, name).await?, ClaimRead::NoCache)) }
    }

    /// Claim `uid` is being unprepared: a cached copy must not be used for it again until
    /// the source knows it is current (it may be deallocated and allocated anew before
    /// the next prepare). A no-op by default.
    fn unprepared(&self, uid: &str) {
        let _ = uid;
    }
}

/// The claim source failed (the API server could not be reached, RBAC, ...).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// A [`ClaimSource`] over an in-memory map, for tests and dry runs.
#[derive(Debug, Default)]
pub struct MapClaimSource {
    claims: Mutex<HashMap<(String, String), ResourceClaim>>,
}

impl MapClaimSource {
    /// Adds or replaces a claim (keyed by its namespace and name).
    pub fn insert(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone(),
            claim.metadata.name.clone(),
        );
        unpoisoned(&self.claims).insert(key, claim);
    }

    /// Removes a claim.
    pub fn remove(&self, namespace: &str, name: &str) {
        unpoisoned(&self.claims).remove(&(namespace.to_owned(), name.to_owned()));
    }
}

impl ClaimSource for MapClaimSource {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, SourceError> {
        Ok(unpoisoned(&self.claims)
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned())
    }
}

impl<T: ClaimSource> ClaimSource for Arc<T> {
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaim>, SourceError>> + Send {
        (**self).get(namespace, name)
    }

    fn get_for_prepare(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(Option<ResourceClaim>, ClaimRead), SourceError>> + Send {
        (**self).get_for_prepare(namespace, name, uid)
    }

    fn unprepared(&self, uid: &str) {
        (**self).unprepared(uid);
    }
}
