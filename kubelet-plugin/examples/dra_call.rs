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
//!
//! Benchmark mode (hack/bench-prepare.sh):
//!
//! ```text
//! dra_call <dra.sock> bench <namespace> <claims file> <parallel> <rounds>
//! ```
//!
//! The claims file has one `<name> <uid> [<device>]` per line; with a device, every prepare
//! of that claim must return it (CDI ids ending in `=<uid>-<device>`), else the run fails. Each round prepares every claim (one
//! claim per `NodePrepareResources` call, `parallel` calls in flight, over one connection like
//! the kubelet's), then unprepares every claim the same way; any error stops the run. Prints
//! `prepare n=<n> p50_ms=… p99_ms=… max_ms=…` and the same for `unprepare`, over all rounds.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use fgpu_api::proto::dra::v1;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.get(1).map(String::as_str) == Some("bench") {
        return bench(&args).await;
    }
    let [socket, op, namespace, name, uid] = args.as_slice() else {
        eprintln!("usage: dra_call <dra.sock> prepare|unprepare <namespace> <name> <uid>");
        return ExitCode::from(2);
    };
    let channel = match connect(socket.clone()).await {
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

async fn connect(socket: String) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
}

type Client = v1::dra_plugin_client::DraPluginClient<Channel>;

/// One claim's prepare (`true`) or unprepare; the call's latency, or the error.
/// `device`: for a prepare, the device the claim must get (its CDI ids end in
/// `=<uid>-<device>`), when the claims file names one.
async fn timed(
    mut client: Client,
    prepare: bool,
    claim: v1::Claim,
    device: Option<String>,
) -> anyhow::Result<Duration> {
    let uid = claim.uid.clone();
    let t = Instant::now();
    let error = if prepare {
        let r = client
            .node_prepare_resources(v1::NodePrepareResourcesRequest {
                claims: vec![claim],
            })
            .await?;
        let entry = r.into_inner().claims.remove(&uid);
        if let (Some(c), Some(device)) = (&entry, device)
            && c.error.is_empty()
        {
            let want = format!("={uid}-{device}");
            let ids: Vec<&String> = c.devices.iter().flat_map(|d| &d.cdi_device_ids).collect();
            if ids.is_empty() || !ids.iter().all(|id| id.ends_with(&want)) {
                bail!("claim {uid}: prepared {ids:?}, want the device {device}");
            }
        }
        entry.map(|c| c.error)
    } else {
        let r = client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                claims: vec![claim],
            })
            .await?;
        r.into_inner().claims.remove(&uid).map(|c| c.error)
    };
    let elapsed = t.elapsed();
    match error {
        Some(e) if e.is_empty() => Ok(elapsed),
        Some(e) => Err(anyhow!("claim {uid}: {e}")),
        None => Err(anyhow!("claim {uid}: no entry in the response")),
    }
}

/// Runs `claims` through `prepare` or unprepare, `parallel` at a time.
async fn phase(
    client: &Client,
    claims: &[(v1::Claim, Option<String>)],
    prepare: bool,
    parallel: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(claims.len());
    let mut set = tokio::task::JoinSet::new();
    for (claim, device) in claims {
        if set.len() >= parallel {
            out.push(set.join_next().await.expect("a task").expect("no panic")?);
        }
        set.spawn(timed(
            client.clone(),
            prepare,
            claim.clone(),
            device.clone(),
        ));
    }
    while let Some(r) = set.join_next().await {
        out.push(r.expect("no panic")?);
    }
    Ok(out)
}

fn summary(what: &str, mut d: Vec<Duration>) -> String {
    d.sort();
    let ms = |x: Duration| x.as_secs_f64() * 1000.0;
    // Nearest rank.
    let pct = |p: f64| ms(d[((p * d.len() as f64).ceil() as usize).clamp(1, d.len()) - 1]);
    format!(
        "{what} n={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2}",
        d.len(),
        pct(0.50),
        pct(0.99),
        ms(*d.last().expect("at least one call"))
    )
}

async fn bench(args: &[String]) -> ExitCode {
    let [socket, _, namespace, file, parallel, rounds] = args else {
        eprintln!("usage: dra_call <dra.sock> bench <namespace> <claims file> <parallel> <rounds>");
        return ExitCode::from(2);
    };
    let (Ok(parallel), Ok(rounds)) = (parallel.parse::<usize>(), rounds.parse::<usize>()) else {
        eprintln!("parallel and rounds are numbers");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error=cannot read {file}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let claims: Vec<(v1::Claim, Option<String>)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, uid) = (f.next()?, f.next()?);
            let claim = v1::Claim {
                namespace: namespace.clone(),
                name: name.into(),
                uid: uid.into(),
            };
            Some((claim, f.next().map(str::to_owned)))
        })
        .collect();
    if claims.is_empty() || parallel == 0 {
        eprintln!("no claims in {file}, or parallel 0");
        return ExitCode::from(2);
    }
    let client = match connect(socket.clone()).await {
        Ok(c) => v1::dra_plugin_client::DraPluginClient::new(c),
        Err(e) => {
            eprintln!("error=cannot connect: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut prep, mut unprep) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (prepare, into) in [(true, &mut prep), (false, &mut unprep)] {
            match phase(&client, &claims, prepare, parallel).await {
                Ok(d) => into.extend(d),
                Err(e) => {
                    println!("error={e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    println!("{}", summary("prepare", prep));
    println!("{}", summary("unprepare", unprep));
    ExitCode::SUCCESS
}
