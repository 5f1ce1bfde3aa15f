//! Wire-format checks of the generated kubelet protos against encodings derived by hand
//! from the protobuf specification (not produced by prost).
//!
//! Reminders: a field's tag byte is `(field_number << 3) | wire_type`; strings, bytes and
//! embedded messages use wire type 2 (LEN), followed by a varint length (one byte below
//! 128) and the payload. Fields equal to their proto3 default are not written. A map entry
//! is an embedded message with the key as field 1 and the value as field 2.

use fgpu_api::proto::{deviceplugin, dra, pluginregistration};
use prost::Message;

/// Concatenates byte pieces (the golden encodings are written piece by piece).
fn cat(pieces: &[&[u8]]) -> Vec<u8> {
    pieces.concat()
}

/// `NodePrepareResourcesRequest { claims: [Claim { namespace: "default", uid: "uid-1",
/// name: "gpu-claim" }] }`, identical in v1 and v1beta1.
fn golden_prepare_request() -> Vec<u8> {
    cat(&[
        // NodePrepareResourcesRequest.claims (field 1, LEN): tag 0x0a, length 27 = 0x1b
        //   = 2 + 7 (namespace) + 2 + 5 (uid) + 2 + 9 (name).
        &[0x0a, 0x1b],
        // Claim.namespace (field 1, LEN): tag 0x0a, length 7.
        &[0x0a, 0x07],
        b"default",
        // Claim.uid (field 2, LEN): tag (2 << 3) | 2 = 0x12, length 5.
        &[0x12, 0x05],
        b"uid-1",
        // Claim.name (field 3, LEN): tag (3 << 3) | 2 = 0x1a, length 9.
        &[0x1a, 0x09],
        b"gpu-claim",
    ])
}

#[test]
fn v1_prepare_request_matches_golden() {
    let request = dra::v1::NodePrepareResourcesRequest {
        claims: vec![dra::v1::Claim {
            namespace: "default".into(),
            uid: "uid-1".into(),
            name: "gpu-claim".into(),
        }],
    };
    let golden = golden_prepare_request();
    assert_eq!(golden.len(), 29);
    assert_eq!(request.encode_to_vec(), golden);
    assert_eq!(
        dra::v1::NodePrepareResourcesRequest::decode(golden.as_slice()).unwrap(),
        request
    );
}

#[test]
fn v1beta1_prepare_request_matches_golden() {
    let request = dra::v1beta1::NodePrepareResourcesRequest {
        claims: vec![dra::v1beta1::Claim {
            namespace: "default".into(),
            uid: "uid-1".into(),
            name: "gpu-claim".into(),
        }],
    };
    assert_eq!(request.encode_to_vec(), golden_prepare_request());
}

const CDI_ID: &[u8] = b"gpu.fgpu.dev/claim=uid-1-gpu-0"; // 12 + 7 + 11 = 30 bytes

/// The Device message shared by both response goldens, without `share_id`: 51 bytes.
fn golden_device_fields() -> Vec<u8> {
    cat(&[
        // Device.request_names (field 1, LEN): tag 0x0a, length 3, "gpu".       5 bytes
        &[0x0a, 0x03],
        b"gpu",
        // Device.pool_name (field 2, LEN): tag 0x12, length 5, "node1".          7 bytes
        &[0x12, 0x05],
        b"node1",
        // Device.device_name (field 3, LEN): tag 0x1a, length 5, "gpu-0".        7 bytes
        &[0x1a, 0x05],
        b"gpu-0",
        // Device.cdi_device_ids (field 4, LEN): tag (4 << 3) | 2 = 0x22, length 30 = 0x1e.
        //                                                                        32 bytes
        &[0x22, 0x1e],
        CDI_ID,
    ])
}

#[test]
fn v1_prepare_response_matches_golden() {
    let device = dra::v1::Device {
        request_names: vec!["gpu".into()],
        pool_name: "node1".into(),
        device_name: "gpu-0".into(),
        cdi_device_ids: vec![String::from_utf8(CDI_ID.to_vec()).unwrap()],
        share_id: Some("s1".into()),
    };
    let response = dra::v1::NodePrepareResourcesResponse {
        claims: [(
            "uid-1".to_owned(),
            dra::v1::NodePrepareResourceResponse {
                devices: vec![device],
                error: String::new(),
            },
        )]
        .into(),
    };
    let golden = cat(&[
        // NodePrepareResourcesResponse.claims (field 1, LEN), one map entry:
        // length 66 = 0x42 = 7 (key) + 2 + 57 (value).
        &[0x0a, 0x42],
        // entry key (field 1, LEN): tag 0x0a, length 5, "uid-1".
        &[0x0a, 0x05],
        b"uid-1",
        // entry value (field 2, LEN): tag 0x12, NodePrepareResourceResponse of
        // length 57 = 0x39 = 2 + 55 (one device; `error` is empty, so not written).
        &[0x12, 0x39],
        // NodePrepareResourceResponse.devices (field 1, LEN): tag 0x0a, Device of
        // length 55 = 0x37 = 51 + 4 (share_id).
        &[0x0a, 0x37],
        &golden_device_fields(),
        // Device.share_id (field 5, LEN): tag (5 << 3) | 2 = 0x2a, length 2, "s1". 4 bytes
        // (`optional`: written because it is set, although it would be written anyway).
        &[0x2a, 0x02],
        b"s1",
    ]);
    assert_eq!(golden.len(), 68);
    assert_eq!(response.encode_to_vec(), golden);
    assert_eq!(
        dra::v1::NodePrepareResourcesResponse::decode(golden.as_slice()).unwrap(),
        response
    );
}

#[test]
fn v1beta1_prepare_response_matches_golden() {
    let device = dra::v1beta1::Device {
        request_names: vec!["gpu".into()],
        pool_name: "node1".into(),
        device_name: "gpu-0".into(),
        cdi_device_ids: vec![String::from_utf8(CDI_ID.to_vec()).unwrap()],
    };
    let response = dra::v1beta1::NodePrepareResourcesResponse {
        claims: [(
            "uid-1".to_owned(),
            dra::v1beta1::NodePrepareResourceResponse {
                devices: vec![device],
                error: String::new(),
            },
        )]
        .into(),
    };
    let golden = cat(&[
        // claims entry: length 62 = 0x3e = 7 (key) + 2 + 53 (value).
        &[0x0a, 0x3e],
        &[0x0a, 0x05],
        b"uid-1",
        // value: length 53 = 0x35 = 2 + 51.
        &[0x12, 0x35],
        // devices[0]: length 51 = 0x33.
        &[0x0a, 0x33],
        &golden_device_fields(),
    ]);
    assert_eq!(golden.len(), 64);
    assert_eq!(response.encode_to_vec(), golden);
}

#[test]
fn v1beta1_ignores_share_id_and_v1_defaults_it_to_unset() {
    // A v1 device with share_id decodes as v1beta1 (field 5 is skipped as unknown) ...
    let v1 = dra::v1::Device {
        device_name: "gpu-0".into(),
        share_id: Some("s1".into()),
        ..Default::default()
    };
    let beta = dra::v1beta1::Device::decode(v1.encode_to_vec().as_slice()).unwrap();
    assert_eq!(beta.device_name, "gpu-0");
    // ... and a v1beta1 device decodes as v1 with no share ID.
    let back = dra::v1::Device::decode(beta.encode_to_vec().as_slice()).unwrap();
    assert_eq!(back.share_id, None);
    // An explicitly empty share ID is still written (proto3 `optional` has presence):
    // tag 0x2a, length 0.
    let empty = dra::v1::Device {
        share_id: Some(String::new()),
        ..Default::default()
    };
    assert_eq!(empty.encode_to_vec(), [0x2a, 0x00]);
}

#[test]
fn registration_messages_match_golden() {
    let info = pluginregistration::PluginInfo {
        r#type: "DRAPlugin".into(),
        name: "gpu.fgpu.dev".into(),
        endpoint: String::new(),
        supported_versions: vec!["v1.DRAPlugin".into()],
    };
    let golden = cat(&[
        // PluginInfo.type (field 1, LEN): tag 0x0a, length 9.
        &[0x0a, 0x09],
        b"DRAPlugin",
        // PluginInfo.name (field 2, LEN): tag 0x12, length 12 = 0x0c.
        &[0x12, 0x0c],
        b"gpu.fgpu.dev",
        // endpoint (field 3) is empty: not written.
        // PluginInfo.supported_versions (field 4, LEN): tag 0x22, length 12 = 0x0c.
        &[0x22, 0x0c],
        b"v1.DRAPlugin",
    ]);
    assert_eq!(info.encode_to_vec(), golden);

    // RegistrationStatus { plugin_registered: true }: field 1, wire type 0 (VARINT),
    // tag 0x08, value 1.
    let status = pluginregistration::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    assert_eq!(status.encode_to_vec(), [0x08, 0x01]);
}

#[test]
fn device_plugin_allocate_response_carries_cdi_devices() {
    let response = deviceplugin::v1beta1::ContainerAllocateResponse {
        cdi_devices: vec![deviceplugin::v1beta1::CdiDevice {
            name: "gpu.fgpu.dev/claim=x".into(),
        }],
        ..Default::default()
    };
    let golden = cat(&[
        // ContainerAllocateResponse.cdi_devices (field 5, LEN): tag 0x2a, CDIDevice of
        // length 22 = 0x16 = 2 + 20.
        &[0x2a, 0x16],
        // CDIDevice.name (field 1, LEN): tag 0x0a, length 20 = 0x14.
        &[0x0a, 0x14],
        b"gpu.fgpu.dev/claim=x",
    ]);
    assert_eq!(response.encode_to_vec(), golden);

    // NUMANode.ID (field 1, VARINT): tag 0x08, value 1.
    let numa = deviceplugin::v1beta1::NumaNode { id: 1 };
    assert_eq!(numa.encode_to_vec(), [0x08, 0x01]);
}

#[test]
fn grpc_service_names_match_the_kubelet() {
    use tonic::server::NamedService;

    struct Unused;
    fn name<S: NamedService>() -> &'static str {
        S::NAME
    }
    assert_eq!(
        name::<dra::v1::dra_plugin_server::DraPluginServer<Unused>>(),
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        name::<dra::v1beta1::dra_plugin_server::DraPluginServer<Unused>>(),
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    );
    assert_eq!(
        name::<pluginregistration::registration_server::RegistrationServer<Unused>>(),
        "pluginregistration.Registration"
    );
    assert_eq!(
        name::<deviceplugin::v1beta1::device_plugin_server::DevicePluginServer<Unused>>(),
        "v1beta1.DevicePlugin"
    );
    assert_eq!(
        name::<deviceplugin::v1beta1::registration_server::RegistrationServer<Unused>>(),
        "v1beta1.Registration"
    );
    assert_eq!(
        name::<fgpu_api::proto::drahealth::v1alpha1::dra_resource_health_server::DraResourceHealthServer<Unused>>(),
        "v1alpha1.DRAResourceHealth"
    );
}
