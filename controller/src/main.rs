//! `fgpu-controller`: fgpu's cluster daemon. Argument parsing and wiring only: the DRA
//! allocation controller is `fgpu-dra-controller`, the legacy scheduler extender
//! `fgpu-extender`, the shared flags and exit codes `fgpu-plumbing`. The trace simulator
//! is its own binary, `fgpu-sim`.

use std::process::ExitCode;

mod certs;

use clap::{Parser, Subcommand};
use fgpu_plumbing::exit;
use fgpu_plumbing::logging::LogArgs;

/// fgpu's cluster daemon: the DRA allocation controller with its admission webhooks, and
/// the scheduler extender of the legacy path.
#[derive(Debug, Parser)]
#[command(
    name = "fgpu-controller",
    version,
    about,
    long_about = None,
    after_help = "Exit status: 0 on success, 2 for bad input (flags, certificate files), 1 for other failures."
)]
pub struct Cli {
    #[command(flatten)]
    log: LogArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the cluster daemon: the DRA allocation controller (reflectors on claims, pods and
    /// slices; allocates claims of the shared class for gated pods), the admission webhooks
    /// (HTTPS) and the metrics/health endpoints.
    Run(Box<fgpu_dra_controller::daemon::RunArgs>),
    /// Run the scheduler extender of the legacy path (clusters below 1.32): `/filter`,
    /// `/prioritize` and `/bind` for pods asking for `nvidia.com/gpu` and HAMi's resources.
    Extender(Box<fgpu_extender::ExtenderArgs>),
    /// The webhooks' serving certificates: issue, renew before expiry, and set the webhook
    /// configurations' caBundle (the Helm chart's Job and CronJob run `certs ensure`).
    Certs(certs::CertsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        return exit::report(&e, |_| false);
    }
    let res = match cli.command {
        Command::Run(args) => fgpu_dra_controller::daemon::run(*args),
        Command::Extender(args) => fgpu_extender::run(*args),
        Command::Certs(args) => certs::run(args),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            exit::report(e.as_ref(), is_bad_input)
        }
    }
}

/// Certificate and flag errors are the caller's to fix.
fn is_bad_input(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<fgpu_plumbing::tls::TlsError>().is_some()
        || e.downcast_ref::<fgpu_plumbing::server::WebhookArgsError>()
            .is_some()
        || e.downcast_ref::<fgpu_plumbing::leader::TimingsError>()
            .is_some()
        || e.downcast_ref::<certs::CertsError>()
            .is_some_and(|c| matches!(c, certs::CertsError::Name(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }
}
