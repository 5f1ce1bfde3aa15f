//! `fgpu-controller`: fgpu's cluster daemon. Today: the trace simulator (`simulate`).
//! Logic lives in `fgpu-driver`; this binary parses arguments, reads files and prints.

mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// fgpu's cluster daemon: GPU allocation controller, scheduler extender and tools.
#[derive(Debug, Parser)]
#[command(name = "fgpu-controller", version, about, long_about = None)]
pub struct Cli {
    /// Log format on stderr: human-readable `text` or one JSON object per line (`json`).
    /// The level comes from RUST_LOG (default: info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a GPU cluster trace (the FGD paper's experiment) through the allocation
    /// engine and write the allocation curve per seed, as the paper's
    /// `analysis_allo_discrete.csv`.
    Simulate(simulate::SimulateArgs),
    /// Run the cluster daemon: the DRA allocation controller (reflectors on claims, pods and
    /// slices; allocates claims of the shared class for gated pods), the admission webhooks
    /// (HTTPS) and the metrics/health endpoints.
    Run(fgpu_controller::daemon::RunArgs),
    /// Run the scheduler extender of the legacy path (clusters below 1.32): `/filter`,
    /// `/prioritize` and `/bind` for pods asking for `nvidia.com/gpu` and HAMi's resources.
    Extender(fgpu_controller::extender::ExtenderArgs),
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format);
    let res = match cli.command {
        Command::Simulate(args) => simulate::run(args),
        Command::Run(args) => fgpu_controller::daemon::run(args),
        Command::Extender(args) => fgpu_controller::extender::run(args),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            if e.downcast_ref::<simulate::BadInput>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
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
