//! `deploy/deviceclasses.yaml` names the classes `fgpu_api` derives and selects this
//! driver's devices: GPUs for the whole and shared classes, MIG placements for the MIG
//! class, research-tier GPUs (with `oversubscribe: true` as class config) for the research
//! class, which the whole and shared classes keep off.

use fgpu_api::names::{DriverName, attr};

#[test]
fn device_classes_match_the_driver_names() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/deviceclasses.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
    let driver = DriverName::default();
    let names: Vec<&str> = docs
        .iter()
        .map(|d| d["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            driver.whole_class(),
            driver.shared_class(),
            driver.mig_class(),
            driver.research_class()
        ]
    );
    for d in &docs {
        // The whole and shared classes select GPUs; the MIG class MIG placements only.
        let kind = if d["metadata"]["name"] == driver.mig_class().as_str() {
            attr::TYPE_MIG
        } else {
            attr::TYPE_GPU
        };
        assert_eq!(d["apiVersion"].as_str(), Some("resource.k8s.io/v1"));
        assert_eq!(d["kind"].as_str(), Some("DeviceClass"));
        let cel = d["spec"]["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap();
        assert!(
            cel.contains(&format!("device.driver == \"{driver}\"")),
            "{cel}"
        );
        assert!(
            cel.contains(&format!(
                "device.attributes[\"{driver}\"].{} == \"{}\"",
                attr::TYPE,
                kind
            )),
            "{cel}"
        );
        let tier = format!("device.attributes[\"{driver}\"].{}", attr::TIER);
        let name = d["metadata"]["name"].as_str().unwrap();
        let oversubscribe = &d["spec"]["config"][0]["opaque"]["parameters"]["oversubscribe"];
        if name == driver.research_class() {
            assert!(
                cel.contains(&format!("{tier} == \"{}\"", attr::TIER_RESEARCH)),
                "{cel}"
            );
            assert_eq!(d["spec"]["config"][0]["opaque"]["driver"], driver.as_str());
            assert_eq!(oversubscribe, &serde_json::json!(true));
        } else if kind == attr::TYPE_GPU {
            assert!(
                cel.contains(&format!("{tier} != \"{}\"", attr::TIER_RESEARCH)),
                "{name} must keep off research-tier GPUs: {cel}"
            );
            assert!(oversubscribe.is_null(), "{name}");
        }
    }
}
