//! The kubelet plugin's integration tests, one binary: the shipped DeviceClasses against
//! the derived names (`deploy_deviceclasses`), the device plugin against the fake API
//! server (`device_plugin_kube`) and over unix sockets with a fake kubelet
//! (`device_plugin_unix`), the real binary's `discover` (`discover`), registration and DRA
//! over unix sockets (`grpc_unix`), and `cluster` and the whole `serve::run` loop against
//! the fake API server (`kube_mock`). Fixtures are in `tests/fixtures`.

mod deploy_deviceclasses;
mod device_plugin_kube;
mod device_plugin_unix;
mod discover;
mod grpc_unix;
mod kube_mock;
