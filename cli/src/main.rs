//! `kubectl fgpu`: what fgpu's GPU shares grant and what they use, and why a pod waits.
//!
//! Install by copying `kubectl-fgpu` to a directory on `PATH`; `kubectl fgpu …` then runs
//! it. It only reads: the driver's ResourceSlices, ResourceClaims (their allocation and the
//! `status.devices` entries the node monitor writes), pods and Events.

mod view;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use kube::Api;
use kube::api::{DynamicObject, ListParams};
use serde_json::Value;

#[derive(Parser, Debug)]
#[command(
    name = "kubectl-fgpu",
    version,
    about = "Granted vs used GPU memory and utilisation of fgpu's shares, and why a pod waits for a GPU",
    after_help = "Used figures come from each claim's status.devices, written by the kubelet plugin's node monitor (at most every --claim-status-interval-seconds, 30 by default); claims not measured yet show '-'."
)]
struct Cli {
    #[command(flatten)]
    client: fgpu_plumbing::client::KubeArgs,

    /// The DRA driver name fgpu was installed with.
    #[arg(long, default_value = fgpu_api::names::DEFAULT_DRIVER_NAME, global = true)]
    driver: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Per GPU, claim or node: memory granted and used, SM utilisation, shares.
    Top {
        /// What to list.
        what: Top,
        /// Only the claims of this namespace (`top claims`); all namespaces by default.
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
    /// Why a pod waits (or where it runs): its scheduling condition, its claims'
    /// allocation and the Events of fgpu and the scheduler about them.
    Why {
        /// `pod/<name>` or `<name>`.
        pod: String,
        /// The pod's namespace (default: the kubeconfig context's).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Top {
    /// One row per GPU.
    Gpus,
    /// One row per claim and GPU.
    Claims,
    /// One row per node.
    Nodes,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(out) => {
            print!("{out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("kubectl-fgpu: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<String> {
    fgpu_plumbing::tls_provider();
    let client = cli.client.client().await?;
    let api = fgpu_plumbing::discovery::negotiate(&client).await?;
    match cli.command {
        Command::Top { what, namespace } => {
            let slices = list(
                &client,
                &fgpu_plumbing::discovery::resource(api, "ResourceSlice", "resourceslices"),
                None,
            )
            .await
            .context("list ResourceSlices")?;
            let claims = list(
                &client,
                &fgpu_plumbing::discovery::claims(api),
                namespace.as_deref(),
            )
            .await
            .context("list ResourceClaims")?;
            let gpus = view::gpus(&slices, &claims, &cli.driver);
            Ok(match what {
                Top::Gpus => view::gpus_table(&gpus),
                Top::Claims => view::claims_table(&gpus),
                Top::Nodes => view::nodes_table(&view::nodes(&gpus)),
            })
        }
        Command::Why { pod, namespace } => {
            let name = match pod.split_once('/') {
                Some(("pod" | "pods" | "po", n)) => n.to_owned(),
                Some((kind, _)) => {
                    bail!("why {pod}: only pods are explained (pod/<name>), not {kind}")
                }
                None => pod.clone(),
            };
            let ns = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
            let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
            let p = pods
                .get_opt(&name)
                .await
                .with_context(|| format!("get pod {ns}/{name}"))?
                .with_context(|| format!("pod {ns}/{name} not found"))?;
            let p = serde_json::to_value(p)?;
            let claim_api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &ns, &fgpu_plumbing::discovery::claims(api));
            let mut claims = Vec::new();
            let mut names = vec![name.clone()];
            for c in claim_names(&p) {
                if let Some(c) = claim_api
                    .get_opt(&c)
                    .await
                    .with_context(|| format!("get ResourceClaim {ns}/{c}"))?
                {
                    names.push(c.metadata.name.clone().unwrap_or_default());
                    claims.push(serde_json::to_value(c)?);
                }
            }
            let events: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(client.clone(), &ns);
            let mut evs = Vec::new();
            for n in &names {
                let lp = ListParams::default().fields(&format!("regarding.name={n}"));
                for e in events
                    .list(&lp)
                    .await
                    .with_context(|| format!("list Events about {ns}/{n}"))?
                {
                    evs.push(serde_json::to_value(e)?);
                }
            }
            Ok(view::why(&p, &claims, &evs, &cli.driver))
        }
    }
}

/// The claims a pod names: by name, or as generated for it (its status says which).
fn claim_names(pod: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let direct = pod["spec"]["resourceClaims"]
        .as_array()
        .into_iter()
        .flatten();
    let generated = pod["status"]["resourceClaimStatuses"]
        .as_array()
        .into_iter()
        .flatten();
    for c in direct.chain(generated) {
        if let Some(n) = c["resourceClaimName"].as_str()
            && !out.iter().any(|o| o == n)
        {
            out.push(n.to_owned());
        }
    }
    out
}

async fn list(
    client: &kube::Client,
    ar: &kube::api::ApiResource,
    namespace: Option<&str>,
) -> Result<Value> {
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    let items = api.list(&ListParams::default()).await?.items;
    Ok(serde_json::json!({ "items": items }))
}
