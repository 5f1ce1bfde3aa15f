//! Calls a DRA plugin's socket the way the kubelet does (DRA v1), for e2e tests and for
//! poking a node by hand:
//!
//! ```text
//! dra_call <dra.sock> prepare|unprepare <namespace> <name> <uid>
//! ```
//!
//! `prepare` prints one line per device, `device=<name> share=<id> cdi=<id>[,<id>...]`, or
//! `error=<message>`; `unprepare` prints `ok` or `error=<message>`. Exit status 1 on an
//! error.

use std::process::ExitCode;

use fgpu_api::proto::dra::v1;
use hyper_util::rt::TokioIo;
use tonic::transport::{Endpoint, Uri};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, op, namespace, name, uid] = args.as_slice() else {
        eprintln!("usage: dra_call <dra.sock> prepare|unprepare <namespace> <name> <uid>");
        return ExitCode::from(2);
    };
    let socket = socket.clone();
    let channel = match Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error=cannot connect: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut client = v1::dra_plugin_client::DraPluginClient::new(channel);
    let claim = v1::Claim {
        namespace: namespace.clone(),
        name: name.clone(),
        uid: uid.clone(),
    };
    match op.as_str() {
        "prepare" => {
            let r = client
                .node_prepare_resources(v1::NodePrepareResourcesRequest {
                    claims: vec![claim],
                })
                .await;
            match r.map(|r| r.into_inner().claims.remove(uid)) {
                Ok(Some(c)) if c.error.is_empty() => {
                    for d in c.devices {
                        println!(
                            "device={} share={} cdi={}",
                            d.device_name,
                            d.share_id.unwrap_or_default(),
                            d.cdi_device_ids.join(",")
                        );
                    }
                    ExitCode::SUCCESS
                }
                Ok(Some(c)) => {
                    println!("error={}", c.error);
                    ExitCode::FAILURE
                }
                Ok(None) => {
                    println!("error=no entry for the claim in the response");
                    ExitCode::FAILURE
                }
                Err(e) => {
                    println!("error={e}");
                    ExitCode::FAILURE
                }
            }
        }
        "unprepare" => {
            let r = client
                .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                    claims: vec![claim],
                })
                .await;
            match r.map(|r| r.into_inner().claims.remove(uid)) {
                Ok(Some(c)) if c.error.is_empty() => {
                    println!("ok");
                    ExitCode::SUCCESS
                }
                Ok(c) => {
                    println!("error={}", c.map(|c| c.error).unwrap_or_default());
                    ExitCode::FAILURE
                }
                Err(e) => {
                    println!("error={e}");
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!("unknown operation {op:?}: prepare or unprepare");
            ExitCode::from(2)
        }
    }
}
