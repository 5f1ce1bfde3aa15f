//! A `resource.k8s.io` DeviceClass, typed and tolerant like [`super::claim`]: its name,
//! the selectors its devices must pass and the configuration it gives every request of it.

use serde::{Deserialize, Serialize};

use super::claim::{DeviceSelector, ObjectMeta, OpaqueConfig};
use super::tolerant;

/// A DeviceClass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClass {
    /// `metadata` (a class has no namespace).
    #[serde(default, deserialize_with = "tolerant::object")]
    pub metadata: ObjectMeta,
    /// `spec`.
    #[serde(default, deserialize_with = "tolerant::object")]
    pub spec: DeviceClassSpec,
}

/// `spec` of a DeviceClass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassSpec {
    /// `selectors`: every device of the class passes them all.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub selectors: Vec<DeviceSelector>,
    /// `config`: configuration for every request of the class.
    #[serde(
        default,
        deserialize_with = "tolerant::list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub config: Vec<DeviceClassConfiguration>,
}

/// `spec.config[i]` of a DeviceClass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassConfiguration {
    /// Opaque, driver-specific parameters.
    #[serde(
        default,
        deserialize_with = "tolerant::opt_object",
        skip_serializing_if = "Option::is_none"
    )]
    pub opaque: Option<OpaqueConfig>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_name_selectors_and_config() {
        let c: DeviceClass = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "shared.gpu.fgpu.dev"},
            "spec": {
                "selectors": [{"cel": {"expression": "device.driver == 'gpu.fgpu.dev'"}}],
                "config": [{"opaque": {"driver": "gpu.fgpu.dev", "parameters": {"cores": 20}}},
                           "not an entry"],
                "extendedResourceName": "x"
            }
        }))
        .unwrap();
        assert_eq!(c.metadata.name, "shared.gpu.fgpu.dev");
        assert_eq!(
            c.spec.selectors[0]
                .cel
                .as_ref()
                .and_then(|s| s.expression.as_deref()),
            Some("device.driver == 'gpu.fgpu.dev'")
        );
        let opaque = c.spec.config[0].opaque.as_ref().unwrap();
        assert_eq!(opaque.parameters["cores"], 20);
        assert!(c.spec.config[1].opaque.is_none());
        let empty: DeviceClass = serde_json::from_value(json!({"spec": "x"})).unwrap();
        assert!(empty.spec.config.is_empty());
    }
}
