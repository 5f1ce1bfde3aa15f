//! The controller's writes to claims and pods, each behind the leader's fence: checked
//! right before it is sent ([`Fence::check`]) and cut off at the fence's deadline, so that
//! no write of this replica starts, or is still awaited, once a standby could lead
//! (`fgpu_plumbing::leader::fence`). Without leader election the fence is open.
//!
//! A write the fence refuses is not retried by this replica: it no longer leads, and the
//! next leader plans the claim again from what the API server holds.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use fgpu_plumbing::leader::{Fence, Fenced};

use crate::reconcile::ObjectId;

/// Why a write did not happen (or may not have).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The API server refused it, or could not be reached.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The fence refused it: this replica may no longer lead.
    #[error("{0} (not retried by this replica)")]
    Fenced(#[from] Fenced),
}

impl WriteError {
    /// A stale `resourceVersion` (the object changed since planned): the next pass.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Kube(kube::Error::Api(s)) if s.is_conflict())
    }

    /// The label of `fgpu_controller_allocation_failures_total` for this failure.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Fenced(_) => "fenced",
            e if e.is_conflict() => "conflict",
            Self::Kube(_) => "api",
        }
    }
}

/// `request` if the fence lets this replica write now, cut off at its deadline.
pub async fn fenced<T>(
    fence: &Fence,
    request: impl Future<Output = kube::Result<T>>,
) -> Result<T, WriteError> {
    Ok(fence.run(request).await??)
}

/// Adds the finalizer (conditional on the claim's resource version), then writes the
/// allocation into the status (conditional on the version the finalizer write returned).
/// Returns the objects as stored, in order, for the overlay.
pub async fn write_allocation(
    fence: &Fence,
    api: &Api<DynamicObject>,
    finalizer: &str,
    claim: Value,
    allocation: &Value,
) -> Result<Vec<Value>, WriteError> {
    let id = ObjectId::of(&claim);
    let mut stored = Vec::new();
    let mut current = claim;
    let mut finalizers: Vec<Value> = current["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !finalizers.iter().any(|f| f.as_str() == Some(finalizer)) {
        finalizers.push(json!(finalizer));
        let patch = json!({"metadata": {
            "resourceVersion": id.resource_version,
            "finalizers": finalizers,
        }});
        let o = fenced(
            fence,
            api.patch(&id.name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await?;
        current = serde_json::to_value(&o).map_err(kube::Error::SerdeError)?;
        stored.push(current.clone());
    }
    current["status"]["allocation"] = allocation.clone();
    // kube-scheduler 1.37 (DRADeviceBindingConditions and DRAResourceClaimDeviceStatus
    // on) sets a missing allocationTimestamp when it reserves the claim, and the API
    // server then refuses its write (the allocation is immutable): set it here. Servers
    // without the field drop it.
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    if let Ok(t) = k8s_openapi::jiff::Timestamp::from_second(now) {
        current["status"]["allocation"]["allocationTimestamp"] = json!(t.to_string());
    }
    let obj: DynamicObject = serde_json::from_value(current).map_err(kube::Error::SerdeError)?;
    let o = fenced(
        fence,
        api.replace_status(&id.name, &PostParams::default(), &obj),
    )
    .await?;
    let o = serde_json::to_value(&o).map_err(kube::Error::SerdeError)?;
    if !o["status"]["allocation"].is_object() {
        // Not expected: the API server accepted the write but kept no allocation.
        tracing::error!(claim = %id.key(), "the API server stored no allocation");
    }
    stored.push(o);
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fgpu_plumbing::testing::FakeApiServer;
    use tokio::time::{Duration, Instant};

    const CLAIM: &str = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c";

    fn claims(client: kube::Client) -> Api<DynamicObject> {
        let ar = fgpu_plumbing::discovery::claims(fgpu_plumbing::ApiVersion::V1);
        Api::namespaced_with(client, "ns", &ar)
    }

    fn stored_claim(fake: &FakeApiServer) -> Value {
        fake.lock().unwrap().insert(
            CLAIM,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"uid": "u1"}, "spec": {}}),
        )
    }

    /// A fence that leads for `secs` from now (an elector's, after one renewal).
    async fn leading_for(fake: &FakeApiServer, secs: u64) -> Fence {
        let timings =
            fgpu_plumbing::leader::Timings::new(i32::try_from(secs + 2).unwrap(), 1, 2).unwrap();
        let mut e = fgpu_plumbing::leader::Elector::new(fake.client(), "ns", "l", "me".into())
            .with_timings(timings);
        e.acquire().await;
        e.fence()
    }

    #[tokio::test(start_paused = true)]
    async fn an_allocation_is_written_while_leading_and_refused_after() {
        let fake = FakeApiServer::new();
        let claim = stored_claim(&fake);
        let fence = leading_for(&fake, 10).await;
        let api = claims(fake.client());
        let allocation = json!({"devices": {"results": []}});
        let stored = write_allocation(&fence, &api, "f", claim.clone(), &allocation)
            .await
            .unwrap();
        assert_eq!(stored.len(), 2, "finalizer, then status");
        assert_eq!(
            stored[1]["status"]["allocation"]["devices"],
            allocation["devices"]
        );

        tokio::time::sleep(Duration::from_secs(10)).await; // never renewed
        let before = fake.lock().unwrap().writes.len();
        let again = stored[1].clone();
        let e = write_allocation(&fence, &api, "f", again, &allocation)
            .await
            .unwrap_err();
        assert!(
            matches!(e, WriteError::Fenced(Fenced::Expired { .. })),
            "{e}"
        );
        assert_eq!(e.reason(), "fenced");
        assert_eq!(fake.lock().unwrap().writes.len(), before, "nothing sent");
        assert!(e.to_string().contains("Lease ns/l"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_to_a_hung_api_server_ends_at_the_deadline() {
        let fake = FakeApiServer::new();
        let claim = stored_claim(&fake);
        let fence = leading_for(&fake, 10).await;
        let (client, cut) = fake.cuttable_client();
        cut.cut();
        let start = Instant::now();
        let e = write_allocation(&fence, &claims(client), "f", claim, &json!({}))
            .await
            .unwrap_err();
        assert!(
            matches!(e, WriteError::Fenced(Fenced::TimedOut { .. })),
            "{e}"
        );
        assert!(start.elapsed() <= Duration::from_secs(10));
        assert_eq!(cut.hung(), 1);
    }

    #[tokio::test]
    async fn without_leader_election_the_fence_is_open() {
        let fake = FakeApiServer::new();
        let claim = stored_claim(&fake);
        let written = write_allocation(
            &Fence::open(),
            &claims(fake.client()),
            "f",
            claim,
            &json!({}),
        )
        .await;
        assert!(written.is_ok(), "{written:?}");
    }
}
