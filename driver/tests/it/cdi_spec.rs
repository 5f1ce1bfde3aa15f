//! The CDI builder's output, checked key by key against the CDI spec's JSON names.

use fgpu_driver::backend::FakeProfile;
use fgpu_driver::cdi::{
    CdiError, CdiSpec, ContainerEdits, DeviceNodeEdit, HookEdit, HookName, MountEdit, SpecBuilder,
    build_spec,
};
use serde_json::json;

#[test]
fn claim_spec_json_is_exactly_the_cdi_shape() {
    let common = ContainerEdits::default()
        .device_node(DeviceNodeEdit::new("/dev/nvidiactl"))
        .mount(MountEdit::bind_read_only(
            "/usr/lib/fgpu/libfgpu.so",
            "/usr/lib/fgpu/libfgpu.so",
        ))
        .hook(HookEdit {
            hook_name: HookName::CreateContainer,
            path: "/usr/bin/fgpu-hook".into(),
            args: vec!["fgpu-hook".into(), "update-ldcache".into()],
            env: vec![],
            timeout: Some(5),
        });
    let spec = SpecBuilder::new("fgpu.dev/claim")
        .common_edits(common)
        .device(
            "a1b2-gpu-0",
            ContainerEdits::default()
                .env("FGPU_MEMORY_LIMIT", "10737418240")
                .env("CUDA_DEVICE_MEMORY_LIMIT", "10240m")
                .device_node(
                    DeviceNodeEdit::new("/dev/nvidia0")
                        .host_path("/tmp/fgpu-fake/dev/nvidia0")
                        .permissions("rw"),
                ),
        )
        .build()
        .unwrap();

    assert_eq!(spec.cdi_version(), "0.5.0");
    assert_eq!(spec.qualified_names(), ["fgpu.dev/claim=a1b2-gpu-0"]);
    let got: serde_json::Value = serde_json::from_str(&spec.to_json().unwrap()).unwrap();
    assert_eq!(
        got,
        json!({
            "cdiVersion": "0.5.0",
            "kind": "fgpu.dev/claim",
            "devices": [{
                "name": "a1b2-gpu-0",
                "containerEdits": {
                    "env": ["FGPU_MEMORY_LIMIT=10737418240", "CUDA_DEVICE_MEMORY_LIMIT=10240m"],
                    "deviceNodes": [{
                        "path": "/dev/nvidia0",
                        "hostPath": "/tmp/fgpu-fake/dev/nvidia0",
                        "permissions": "rw"
                    }]
                }
            }],
            "containerEdits": {
                "deviceNodes": [{"path": "/dev/nvidiactl"}],
                "hooks": [{
                    "hookName": "createContainer",
                    "path": "/usr/bin/fgpu-hook",
                    "args": ["fgpu-hook", "update-ldcache"],
                    "timeout": 5
                }],
                "mounts": [{
                    "hostPath": "/usr/lib/fgpu/libfgpu.so",
                    "containerPath": "/usr/lib/fgpu/libfgpu.so",
                    "options": ["ro", "nosuid", "nodev", "bind"]
                }]
            }
        })
    );
}

#[test]
fn spec_from_a_fake_profile_gpu_validates() {
    let profile = FakeProfile::load(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/fake/node-2xh100.yaml"
    ))
    .unwrap();
    let gpu = &profile.nodes()[0].gpus[1];
    let edits = ContainerEdits::default()
        .env("NVIDIA_VISIBLE_DEVICES", &gpu.uuid)
        .gpu_device_nodes(gpu);
    let spec = build_spec("fgpu.dev/gpu", "gpu-1", edits).unwrap();
    // Device nodes live at /dev on this profile: no hostPath needed, lowest version.
    assert_eq!(spec.cdi_version(), "0.3.0");
    let v = spec.to_json_value();
    assert_eq!(
        v["devices"][0]["containerEdits"]["deviceNodes"][0],
        json!({"path": "/dev/nvidia1"})
    );
    assert_eq!(
        v["devices"][0]["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    // What was built reads back and validates again.
    assert_eq!(CdiSpec::from_json(&spec.to_json().unwrap()).unwrap(), spec);
}

#[test]
fn invalid_names_fail_with_the_cause() {
    let edits = ContainerEdits::default().env("A", "1");
    let e = build_spec("fgpu.dev/claim", "-gpu", edits.clone()).unwrap_err();
    assert!(matches!(e, CdiError::Invalid { .. }));
    assert_eq!(
        e.to_string(),
        r#"CDI spec "fgpu.dev/claim" is invalid: device "-gpu": validate device name failed: name should start with a letter or digit"#
    );
    let e = build_spec("fgpu.dev/cl@ss", "gpu-0", edits)
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid class"), "{e}");
}
