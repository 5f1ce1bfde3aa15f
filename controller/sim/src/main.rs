//! `fgpu-sim`: fgpu's trace simulator. Replays a GPU cluster trace (the FGD paper's
//! experiment) through the allocation engine and writes the allocation curve per seed, as
//! the paper's `analysis_allo_discrete.csv`. File I/O and printing around
//! `fgpu_driver::sim`; it links the domain and the logging flags only (no Kubernetes
//! client, TLS or HTTP: `cargo tree -p fgpu-sim`).
//!
//! * [`plot`]: `fgpu-sim plot`, the curves of one or more output files drawn as the FGD
//!   paper's figure (SVG).

mod plot;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use fgpu_driver::engine::Policy;
use fgpu_driver::sim::{self, RunConfig, RunResult};
use fgpu_plumbing::exit::{self, BadInput};
use fgpu_plumbing::logging::LogArgs;

/// Replay a GPU cluster trace (the FGD paper's experiment) through fgpu's allocation
/// engine and write the allocation curve per seed, as the paper's
/// `analysis_allo_discrete.csv`; `fgpu-sim plot` draws such files as the paper's figure.
#[derive(Debug, Parser)]
#[command(
    name = "fgpu-sim",
    version,
    subcommand_negates_reqs = true,
    after_help = "Exit status: 0 on success, 2 for bad input (flags, unreadable or malformed CSV), 1 for other failures."
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    simulate: Option<SimulateArgs>,
}

#[derive(Debug, Subcommand)]
enum Command {
    Plot(plot::PlotArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = cli.log.init() {
        return exit::report(&e, |_| false);
    }
    let done = match (cli.command, cli.simulate) {
        (Some(Command::Plot(args)), _) => plot::run(args),
        (None, Some(args)) => run(args),
        (None, None) => Err(BadInput::new(
            "give --nodes, --pods and --out to simulate, or `plot` to draw (see --help)",
        )
        .into()),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            exit::report(e.as_ref(), |_| false)
        }
    }
}

#[derive(Debug, Args)]
#[group(id = "simulate")]
pub struct SimulateArgs {
    /// Node list CSV (`sn,cpu_milli,memory_mib,gpu,model`); nodes without GPUs are left
    /// out of the simulated cluster.
    #[arg(long, value_name = "CSV")]
    pub nodes: PathBuf,

    /// Pod list CSV (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`). Its
    /// file name without `.csv` is the `workload` column of the output.
    #[arg(long, value_name = "CSV")]
    pub pods: PathBuf,

    /// Placement policy: binpack, spread, gpupacking, bestfit, fgd, fragaware,
    /// `<node>/<gpu>` (e.g. binpack/spread), a comma-separated list of those, or `all` for
    /// every named policy.
    #[arg(long, default_value = "fragaware")]
    pub policy: String,

    /// Seeds, one run each: `42`, `42-51` or a comma-separated list of those.
    #[arg(long, default_value = "42-51")]
    pub seeds: String,

    /// Inflate (or trim) the shuffled pod list by resampling until its GPU request is
    /// this multiple of the cluster's GPU capacity (the paper: 1.3).
    #[arg(long, default_value_t = 1.3)]
    pub tune: f64,

    /// Score fgd and fragaware against the pods placed so far (what the live controller
    /// and extender know: binpack until the first placement, the 64 heaviest kinds,
    /// refreshed as the count grows by 1 %) instead of the whole trace.
    #[arg(long)]
    pub online_workload: bool,

    /// Place as fgpu-controller does today: host CPU and memory not accounted (CPU-only
    /// pods left out, the others ask none), nodes tried in name order, equal scores to the
    /// first. With --online-workload this is the controller's decision rule, to compare
    /// with a live replay (hack/bench-replay.sh, tests/e2e/47-controller-fragaware).
    #[arg(long)]
    pub as_controller: bool,

    /// Also write every arrival with where it went, per policy and seed, in arrival order
    /// (`sc_policy,seed,seq,name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,node,gpus`;
    /// node and gpus empty for a pod that found no room).
    #[arg(long, value_name = "FILE")]
    pub placements: Option<PathBuf>,

    /// Output CSV in the layout of the paper's `analysis_allo_discrete.csv`: one row per
    /// policy and seed (allocation % of GPU capacity at arrived = 0..130 %).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// The paper's `analysis_allo_discrete.csv`: when given, its figure for the same
    /// workload is printed beside ours (gpupacking ↔ GpuPacking, bestfit ↔ BestFit, fgd
    /// and fragaware ↔ FGD).
    #[arg(long, value_name = "CSV")]
    pub paper: Option<PathBuf>,

    /// Pin this fraction (0-1) of the GPU pods to one GPU model each, drawn in proportion
    /// to the model's share of the cluster's GPUs (the FGD paper's "gpuspec" family),
    /// seeded by --pin-seed; the workload is named `<pods>-pin<percent>`.
    #[arg(long, value_name = "FRACTION")]
    pub pin_models: Option<f64>,

    /// Seed of --pin-models' choice of pods and models.
    #[arg(long, default_value_t = 1)]
    pub pin_seed: u64,

    /// Runs in parallel (default: the number of CPUs).
    #[arg(long)]
    pub jobs: Option<usize>,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| BadInput::new(format!("cannot read {}: {e}", path.display())).into())
}

fn policies(spec: &str) -> Result<Vec<(String, Policy)>> {
    if spec.trim().eq_ignore_ascii_case("all") {
        return Ok(Policy::ALL
            .iter()
            .map(|(n, p)| (n.to_string(), *p))
            .collect());
    }
    spec.split(',')
        .map(|s| {
            let p: Policy = s
                .parse()
                .map_err(|e| BadInput::new(format!("--policy: {e}")))?;
            Ok((p.to_string(), p))
        })
        .collect()
}

pub fn run(args: SimulateArgs) -> Result<()> {
    let policies = policies(&args.policy)?;
    let seeds =
        sim::parse_seeds(&args.seeds).map_err(|e| BadInput::new(format!("--seeds: {e}")))?;
    if !(args.tune.is_finite() && args.tune >= 0.0) {
        return Err(BadInput::new(format!(
            "--tune: {} is not a non-negative number",
            args.tune
        ))
        .into());
    }
    let nodes_name = args.nodes.display().to_string();
    let pods_name = args.pods.display().to_string();
    let nodes = sim::parse_nodes(&nodes_name, &read(&args.nodes)?)
        .map_err(|e| BadInput::new(e.to_string()))?;
    let mut pods = sim::parse_pods(&pods_name, &read(&args.pods)?)
        .map_err(|e| BadInput::new(e.to_string()))?;
    let mut workload = args
        .pods
        .file_name()
        .map(|f| f.to_string_lossy().trim_end_matches(".csv").to_string())
        .unwrap_or_else(|| "workload".into());
    if let Some(f) = args.pin_models {
        if !(0.0..=1.0).contains(&f) {
            return Err(
                BadInput::new(format!("--pin-models: {f} is not a fraction in 0-1")).into(),
            );
        }
        pods = sim::pin_models(&pods, &nodes, f, args.pin_seed);
        workload = format!("{workload}-pin{}", (f * 100.0).round());
    }
    tracing::info!(
        nodes = nodes.len(),
        gpu_nodes = nodes.iter().filter(|n| n.gpus > 0).count(),
        pods = pods.len(),
        %workload,
        "trace loaded"
    );
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);

    let mut out = String::new();
    out.push_str(&sim::csv_header());
    out.push('\n');
    let mut placed = format!("{}\n", sim::PLACEMENTS_HEADER);
    let mut summary = Vec::new();
    for (name, policy) in &policies {
        let t0 = Instant::now();
        let results = run_seeds(
            &nodes,
            &pods,
            RunConfig {
                policy: *policy,
                seed: 0,
                tune: args.tune,
                online: args.online_workload,
                as_controller: args.as_controller,
                record: args.placements.is_some(),
            },
            &seeds,
            jobs,
        );
        let secs = t0.elapsed().as_secs_f64();
        let un: Vec<f64> = results
            .iter()
            .filter_map(RunResult::unallocated_at_100)
            .collect();
        let (m, sd) = sim::mean_sd(&un);
        for r in &results {
            out.push_str(&sim::csv_row(&workload, name, args.tune, r));
            out.push('\n');
            for (seq, p) in r.placements.iter().enumerate() {
                placed.push_str(&sim::placement_row(name, r.seed, seq, p));
                placed.push('\n');
            }
            tracing::debug!(policy = %name, seed = r.seed, pods = r.pods, failed = r.failed,
                evaluations = r.evaluations, unallocated_at_100 = ?r.unallocated_at_100(), "seed done");
        }
        tracing::info!(policy = %name, seeds = seeds.len(), seconds = secs, "policy done");
        summary.push((name.clone(), m, sd, results.len(), secs));
    }
    std::fs::write(&args.out, out)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    if let Some(f) = &args.placements {
        std::fs::write(f, placed).with_context(|| format!("cannot write {}", f.display()))?;
    }
    let paper = match &args.paper {
        Some(p) => sim::paper_figures(&p.display().to_string(), &read(p)?, &workload)
            .map_err(|e| BadInput::new(e.to_string()))?,
        None => Vec::new(),
    };
    println!("workload {workload}: unallocated GPU % at arrived = 100 % (mean ± sd over seeds)");
    for (name, m, sd, n, secs) in summary {
        let theirs = sim::paper_counterpart(&name)
            .and_then(|c| paper.iter().find(|p| p.0 == c))
            .map(|(c, pm, psd, _)| format!("   paper {c}: {pm:.2} ± {psd:.2}"))
            .unwrap_or_default();
        println!("  {name:<12} {m:6.2} ± {sd:4.2}   ({n} seeds, {secs:.1} s){theirs}");
    }
    Ok(())
}

fn run_seeds(
    nodes: &[sim::TraceNode],
    pods: &[sim::TracePod],
    cfg: RunConfig,
    seeds: &[u64],
    jobs: usize,
) -> Vec<RunResult> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<RunResult>> = vec![None; seeds.len()];
    let slots = std::sync::Mutex::new(&mut results);
    std::thread::scope(|s| {
        for _ in 0..jobs.min(seeds.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= seeds.len() {
                        break;
                    }
                    let r = sim::run(
                        nodes,
                        pods,
                        RunConfig {
                            seed: seeds[i],
                            ..cfg
                        },
                    );
                    slots.lock().expect("no panics while holding")[i] = Some(r);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every seed ran"))
        .collect()
}
