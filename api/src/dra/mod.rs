//! The `resource.k8s.io` API group as fgpu speaks it: which versions exist and how one is
//! chosen ([`ApiVersion`]), and the typed, tolerant object model, one for every served
//! version (what differs between versions, the model hides):
//!
//! * [`claim`]: a ResourceClaim as the controller and the node side read it: identity,
//!   `spec.devices` (requests, constraints, configuration) and status (the allocation,
//!   `reservedFor`, `status.devices`); [`same_device`] matches a `status.devices` entry
//!   to its allocation result.
//! * [`class`]: a DeviceClass: its selectors and configuration.
//! * [`slice`]: a ResourceSlice (pool, devices with their attributes, capacities and
//!   taints; `v1beta1`'s `basic` read alike) and a DeviceTaintRule, what the controller's
//!   inventory reads.
//! * [`tolerant`]: the field readers all three models share, which never fail on a field
//!   of the wrong JSON type: most read it as absent (the way indexing JSON did), a few
//!   keep it as it came ([`tolerant::Checked`]) for the reader to report, so that any
//!   object reads and its users name the bad field.

pub mod claim;
pub mod class;
pub mod slice;
pub mod tolerant;

/// Whether two device entries of a claim, as JSON, name the same allocated device: the
/// same driver, pool, device and share (`shareID`, absent for a whole device). An entry of
/// `status.devices` belongs to the allocation result it matches so.
pub fn same_device(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    ["driver", "pool", "device", "shareID"]
        .iter()
        .all(|k| a[*k] == b[*k])
}

/// The API group of DRA.
pub const GROUP: &str = "resource.k8s.io";

#[cfg(test)]
mod device_tests {
    use serde_json::json;

    #[test]
    fn same_device_needs_driver_pool_device_and_share() {
        let r = json!({"driver": "d", "pool": "p", "device": "gpu-0", "shareID": "s1"});
        assert!(super::same_device(
            &r,
            &json!({"driver": "d", "pool": "p", "device": "gpu-0", "shareID": "s1", "data": {}})
        ));
        assert!(!super::same_device(
            &r,
            &json!({"driver": "d", "pool": "p", "device": "gpu-0", "shareID": "s2"})
        ));
        assert!(!super::same_device(
            &r,
            &json!({"driver": "d", "pool": "p", "device": "gpu-0"})
        ));
        assert!(!super::same_device(
            &r,
            &json!({"driver": "x", "pool": "p", "device": "gpu-0", "shareID": "s1"})
        ));
    }
}

/// The `resource.k8s.io` versions fgpu reads and writes, newest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiVersion {
    /// `resource.k8s.io/v1` (1.34+).
    V1,
    /// `resource.k8s.io/v1beta2` (1.33+, off by default).
    V1beta2,
    /// `resource.k8s.io/v1beta1` (1.32+, off by default): devices wrap their fields in
    /// `basic`, requests carry their fields directly instead of under `exactly`.
    V1beta1,
}

impl ApiVersion {
    /// Preference order.
    pub const ALL: [Self; 3] = [Self::V1, Self::V1beta2, Self::V1beta1];

    /// The version part (`v1`).
    pub fn version(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V1beta2 => "v1beta2",
            Self::V1beta1 => "v1beta1",
        }
    }

    /// `resource.k8s.io/<version>`.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "resource.k8s.io/v1",
            Self::V1beta2 => "resource.k8s.io/v1beta2",
            Self::V1beta1 => "resource.k8s.io/v1beta1",
        }
    }

    /// The newest version among those the API server serves for `resource.k8s.io` (as
    /// discovery lists them: `v1`, `v1beta1`, ...), or `None` when DRA is off.
    pub fn negotiate<'a>(served: impl IntoIterator<Item = &'a str>) -> Option<Self> {
        let served: Vec<&str> = served.into_iter().collect();
        Self::ALL
            .into_iter()
            .find(|v| served.contains(&v.version()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_served_version_wins() {
        let cases: [(&[&str], Option<ApiVersion>); 5] = [
            (&["v1", "v1beta2", "v1beta1"], Some(ApiVersion::V1)),
            (&["v1beta1", "v1beta2"], Some(ApiVersion::V1beta2)),
            (&["v1beta1"], Some(ApiVersion::V1beta1)),
            (&["v1alpha3"], None),
            (&[], None),
        ];
        for (served, want) in cases {
            assert_eq!(
                ApiVersion::negotiate(served.iter().copied()),
                want,
                "{served:?}"
            );
        }
        for v in ApiVersion::ALL {
            assert_eq!(v.api_version(), format!("{GROUP}/{}", v.version()));
        }
    }
}
