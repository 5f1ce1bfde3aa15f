//! Compiles the kubelet gRPC protos in `proto/` into Rust at build time.
//!
//! `protox` parses the `.proto` files in pure Rust (no system `protoc`), and
//! `tonic-prost-build` turns the resulting descriptor set into prost messages plus tonic
//! clients and servers. Transport helpers (`connect`) are left out: this crate does no I/O,
//! and the binaries bring their own channel (a Unix socket).

#[cfg(feature = "proto")]
use std::error::Error;

/// Proto files, relative to `proto/`. Each has its own package, hence its own output file.
#[cfg(feature = "proto")]
const PROTOS: &[&str] = &[
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "dra-health/v1alpha1/api.proto",
    "dra-health/v1/api.proto",
    "pluginregistration/v1/api.proto",
    "deviceplugin/v1beta1/api.proto",
    "podresources/v1/api.proto",
];

/// Without feature `proto` there is nothing to generate.
#[cfg(not(feature = "proto"))]
fn main() {}

#[cfg(feature = "proto")]
fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
