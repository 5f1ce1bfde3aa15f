//! Device attributes a GPU's devices share: its whole-GPU device ([`crate::slices`]) and its
//! MIG placements ([`crate::mig_slice`]) carry the same product, architecture, versions,
//! index and topology. Also the semver form of version attributes.

use fgpu_api::names::attr;
use fgpu_driver::device::Gpu;
use serde_json::{Map, Value, json};

/// Semantic version for a version attribute: `9.0` → `9.0.0`, `535.104.05` → `535.104.5`
/// (leading zeros are not allowed in semver). `None` if the parts are not numbers.
pub fn semver(text: &str) -> Option<String> {
    let parts: Vec<u64> = text
        .trim()
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    match parts.as_slice() {
        [major] => Some(format!("{major}.0.0")),
        [major, minor] => Some(format!("{major}.{minor}.0")),
        [major, minor, patch] => Some(format!("{major}.{minor}.{patch}")),
        _ => None,
    }
}

/// Sets attribute `name` to `{kind: value}` (`kind`: `string`, `int`, `bool`, `version`).
pub fn put(attributes: &mut Map<String, Value>, name: &str, kind: &str, value: Value) {
    attributes.insert(name.to_owned(), json!({ kind: value }));
}

/// Adds `gpu`'s `productName`, `architecture`, `cudaComputeCapability`, `driverVersion`
/// (versions where they parse), `index`, `numaNode` and `resource.kubernetes.io/pcieRoot`
/// (where known).
pub fn put_gpu_attributes(attributes: &mut Map<String, Value>, gpu: &Gpu) {
    put(
        attributes,
        attr::PRODUCT_NAME,
        "string",
        json!(gpu.product_name),
    );
    put(
        attributes,
        attr::ARCHITECTURE,
        "string",
        json!(gpu.architecture().as_str()),
    );
    if let Some(v) = semver(&gpu.compute_capability.to_string()) {
        put(
            attributes,
            attr::CUDA_COMPUTE_CAPABILITY,
            "version",
            json!(v),
        );
    }
    if let Some(v) = semver(&gpu.driver_version) {
        put(attributes, attr::DRIVER_VERSION, "version", json!(v));
    }
    put(attributes, attr::INDEX, "int", json!(gpu.index));
    if let Some(n) = gpu.numa_node {
        put(attributes, attr::NUMA_NODE, "int", json!(n));
    }
    if let Some(root) = &gpu.pcie_root {
        put(attributes, attr::PCIE_ROOT, "string", json!(root));
    }
}
