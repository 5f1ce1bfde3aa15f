//! Which `resource.k8s.io` version the API server serves, and DRA's resources at it.
//!
//! [`negotiate`] asks discovery (`GET /apis`) and picks `v1`, else `v1beta2`, else
//! `v1beta1` ([`ApiVersion::negotiate`]); the daemons then read and write claims and slices
//! as dynamic objects of that version, so one code path serves every version.

pub use fgpu_api::dra::{ApiVersion, GROUP};
use kube::api::ApiResource;
use kube::core::GroupVersionKind;

/// Why no version could be chosen.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The discovery request failed.
    #[error("API discovery (GET /apis): {0}")]
    Kube(#[source] kube::Error),
    /// The API server does not serve `resource.k8s.io` at a version fgpu speaks.
    #[error(
        "the API server serves no resource.k8s.io version fgpu speaks (served: {served}); enable DRA: v1 on 1.34+, or --runtime-config=resource.k8s.io/v1beta1=true on 1.32/1.33"
    )]
    NoDra {
        /// Versions served, comma-separated, or `none`.
        served: String,
    },
}

/// Picks the `resource.k8s.io` version to use from what the API server serves.
pub async fn negotiate(client: &kube::Client) -> Result<ApiVersion, DiscoveryError> {
    let groups = client
        .list_api_groups()
        .await
        .map_err(DiscoveryError::Kube)?;
    let served: Vec<String> = groups
        .groups
        .iter()
        .filter(|g| g.name == GROUP)
        .flat_map(|g| g.versions.iter().map(|v| v.version.clone()))
        .collect();
    ApiVersion::negotiate(served.iter().map(String::as_str)).ok_or_else(|| DiscoveryError::NoDra {
        served: if served.is_empty() {
            "none".into()
        } else {
            served.join(", ")
        },
    })
}

/// The DRA resource `kind` (plural `plural`) at `api`.
pub fn resource(api: ApiVersion, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, api.version(), kind), plural)
}

/// ResourceClaims at `api`.
pub fn claims(api: ApiVersion) -> ApiResource {
    resource(api, "ResourceClaim", "resourceclaims")
}

/// ResourceClaimTemplates at `api`.
pub fn claim_templates(api: ApiVersion) -> ApiResource {
    resource(api, "ResourceClaimTemplate", "resourceclaimtemplates")
}

/// ResourceSlices at `api`.
pub fn slices(api: ApiVersion) -> ApiResource {
    resource(api, "ResourceSlice", "resourceslices")
}

/// DeviceClasses at `api`.
pub fn device_classes(api: ApiVersion) -> ApiResource {
    resource(api, "DeviceClass", "deviceclasses")
}

/// The `resource.k8s.io` versions that may serve DeviceTaintRules, newest first: `v1`
/// from 1.37, `v1beta2` on 1.36 and `v1alpha3` on 1.33 to 1.35 (each behind the
/// `DRADeviceTaintRules` gate before 1.37).
pub const TAINT_RULE_VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1alpha3"];

/// DeviceTaintRules at the newest version the API server serves them, or `None` where it
/// serves none (the gate is off, or the release predates them). A version the server does
/// not serve at all is skipped; any other discovery failure is an error.
pub async fn device_taint_rules(client: &kube::Client) -> Result<Option<ApiResource>, kube::Error> {
    for version in TAINT_RULE_VERSIONS {
        let list = match client
            .list_api_group_resources(&format!("{GROUP}/{version}"))
            .await
        {
            Ok(list) => list,
            Err(kube::Error::Api(s)) if s.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        if list.resources.iter().any(|r| r.name == "devicetaintrules") {
            return Ok(Some(ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(GROUP, version, "DeviceTaintRule"),
                "devicetaintrules",
            )));
        }
    }
    Ok(None)
}

/// Pods (`v1`), as a dynamic resource.
pub fn pods() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_carry_the_negotiated_version() {
        let r = claims(ApiVersion::V1beta1);
        assert_eq!(r.api_version, "resource.k8s.io/v1beta1");
        assert_eq!(
            (r.kind.as_str(), r.plural.as_str()),
            ("ResourceClaim", "resourceclaims")
        );
        assert_eq!(slices(ApiVersion::V1).api_version, "resource.k8s.io/v1");
        assert_eq!(pods().api_version, "v1");
    }
}
