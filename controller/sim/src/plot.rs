//! `fgpu-sim plot`: draws allocation curves as the FGD paper's figure, unallocated GPU %
//! (y) against arrived GPU demand in % of the cluster's GPU capacity (x), one line per
//! (file, policy), each the mean over the file's seeds (`fgpu_driver::sim::curves`). SVG
//! through `plotters`; text is left to the viewer's sans-serif font.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use fgpu_driver::sim::curves::{self, CurveFile, MeanCurve};
use fgpu_plumbing::exit::BadInput;
use plotters::prelude::*;

/// Draw allocation curves (files of `fgpu-sim --out` or `hack/replay.py curve`) as the
/// FGD paper's figure: unallocated GPU % against arrived GPU %, one line per file and
/// policy, averaged over the seeds.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// A file of curves (`workload,sc_policy,tune,seed,total_gpus,0,…,130`); repeat to
    /// draw several files in one figure (the lines of the second and later files carry
    /// markers, and the legend names the file).
    #[arg(long = "in", value_name = "CSV", required = true)]
    pub inputs: Vec<PathBuf>,

    /// The SVG to write.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// The figure's title (default: the workload and the number of seeds).
    #[arg(long)]
    pub title: Option<String>,

    /// Draw only this workload's rows: its whole name or the part after a `_`
    /// (`default` is `openb_pod_list_default`). Needed when the files hold several.
    #[arg(long)]
    pub workload: Option<String>,

    /// The arrived % shown on the x axis, `LO-HI` (the paper's view: 75-120; the whole
    /// run: 0-130).
    #[arg(long, default_value = "75-120", value_name = "LO-HI")]
    pub arrived: String,
}

/// One line of the figure: (arrived %, unallocated %) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub label: String,
    /// Index into the palette (one colour per policy, the same in every file).
    pub colour: usize,
    /// Which input file it came from (0: plain line; later files: markers).
    pub file: usize,
    pub points: Vec<(f64, f64)>,
}

/// What [`render_svg`] draws.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub title: String,
    /// The x axis' range (arrived %).
    pub arrived: (f64, f64),
    pub lines: Vec<Line>,
}

/// Picture size in pixels.
const SIZE: (u32, u32) = (900, 520);

/// Line colours, one per policy in order of appearance (the Tableau 10 palette).
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// Markers are drawn every this many arrived %.
const MARK_EVERY: f64 = 5.0;

/// Runs `fgpu-sim plot`.
pub fn run(args: PlotArgs) -> Result<()> {
    let arrived = parse_range(&args.arrived)?;
    let mut files = Vec::new();
    for path in &args.inputs {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| BadInput::new(format!("cannot read {name}: {e}")))?;
        let file = curves::parse_curves(&name, &text).map_err(|e| BadInput::new(e.to_string()))?;
        files.push((path.as_path(), file));
    }
    let fig = figure(&files, args.workload.as_deref(), args.title, arrived)?;
    let svg = render_svg(&fig)?;
    std::fs::write(&args.out, svg)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    tracing::info!(out = %args.out.display(), lines = fig.lines.len(), "figure written");
    Ok(())
}

/// Parses `--arrived LO-HI`.
fn parse_range(s: &str) -> Result<(f64, f64)> {
    let bad = || BadInput::new(format!("--arrived: {s:?} is not LO-HI with 0 <= LO < HI"));
    let (lo, hi) = s.split_once('-').ok_or_else(bad)?;
    let lo: f64 = lo.trim().parse().map_err(|_| bad())?;
    let hi: f64 = hi.trim().parse().map_err(|_| bad())?;
    if !(lo.is_finite() && hi.is_finite() && 0.0 <= lo && lo < hi) {
        return Err(bad().into());
    }
    Ok((lo, hi))
}

/// The figure of the parsed files: the workload to draw (the one asked for, else the only
/// one), one line per (file, policy), the title. Bad input when a file holds several
/// workloads and none was chosen, or has no row of the workload.
pub fn figure(
    files: &[(&Path, CurveFile)],
    workload: Option<&str>,
    title: Option<String>,
    arrived: (f64, f64),
) -> Result<Figure> {
    let mut lines = Vec::new();
    let mut policies: Vec<String> = Vec::new();
    let mut shown: Vec<String> = Vec::new();
    let mut seeds = 0;
    for (i, (path, file)) in files.iter().enumerate() {
        let name = path.display();
        let all = curves::workloads(file);
        if all.is_empty() {
            return Err(BadInput::new(format!("{name}: no data rows")).into());
        }
        let wanted = match workload {
            Some(w) => w.to_string(),
            None if all.len() > 1 => {
                return Err(BadInput::new(format!(
                    "{name}: holds several workloads ({}): choose one with --workload",
                    all.join(", ")
                ))
                .into());
            }
            None => all.first().map(|w| w.to_string()).unwrap_or_default(),
        };
        let means = curves::mean_by_policy(file, Some(&wanted));
        if means.is_empty() {
            return Err(BadInput::new(format!(
                "{name}: no rows of workload {wanted:?} (found: {})",
                all.join(", ")
            ))
            .into());
        }
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| name.to_string());
        for m in means {
            seeds = seeds.max(m.runs);
            if !shown.contains(&m.workload) {
                shown.push(m.workload.clone());
            }
            lines.push(line(&m, file, i, &stem, files.len() > 1, &mut policies));
        }
    }
    let title = title.unwrap_or_else(|| {
        format!(
            "Unallocated GPUs as demand arrives: {} (mean of {seeds} seed{})",
            shown.join(", "),
            if seeds == 1 { "" } else { "s" }
        )
    });
    Ok(Figure {
        title,
        arrived,
        lines,
    })
}

fn line(
    m: &MeanCurve,
    file: &CurveFile,
    index: usize,
    stem: &str,
    name_file: bool,
    policies: &mut Vec<String>,
) -> Line {
    let colour = match policies.iter().position(|p| *p == m.policy) {
        Some(c) => c,
        None => {
            policies.push(m.policy.clone());
            policies.len() - 1
        }
    };
    Line {
        label: if name_file {
            format!("{} ({stem})", m.policy)
        } else {
            m.policy.clone()
        },
        colour,
        file: index,
        points: m.unallocated(&file.arrived),
    }
}

/// Rounds to 2 decimals (the curves' own precision; keeps the numbers short).
fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The top of the y axis: the highest unallocated % shown, rounded up to a multiple of 5
/// (at least 5, at most 100).
fn y_top(fig: &Figure) -> f64 {
    let (lo, hi) = fig.arrived;
    let max = fig
        .lines
        .iter()
        .flat_map(|l| &l.points)
        .filter(|p| p.0 >= lo && p.0 <= hi)
        .map(|p| p.1)
        .fold(0.0, f64::max);
    ((max / 5.0).ceil() * 5.0).clamp(5.0, 100.0)
}

/// A line's points inside the x range, rounded. A missing value is bridged by the segment
/// between its neighbours, as the paper's figure (seaborn) draws the curves.
fn shown(points: &[(f64, f64)], (lo, hi): (f64, f64)) -> Vec<(f64, f64)> {
    points
        .iter()
        .filter(|p| p.0 >= lo && p.0 <= hi)
        .map(|&(x, y)| (x, round2(y)))
        .collect()
}

/// Draws the figure as SVG: axes with labels, a grid, the ideal line (every arrival
/// allocated: unallocated = 100 - arrived, up to arrived = 100 %), one path per line (2 px
/// wide; the other paths are 1 px), a legend naming every line.
pub fn render_svg(fig: &Figure) -> Result<String> {
    let mut svg = String::new();
    draw(fig, &mut svg).map_err(|e| anyhow::anyhow!("drawing the figure: {e}"))?;
    Ok(svg)
}

fn draw(fig: &Figure, svg: &mut String) -> Result<(), Box<dyn std::error::Error>> {
    let (lo, hi) = fig.arrived;
    let top = y_top(fig);
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&fig.title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(60)
        .build_cartesian_2d(lo..hi, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("Arrived GPU demand (% of the cluster's GPU capacity)")
        .y_desc("Unallocated GPUs (% of capacity)")
        .max_light_lines(0)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .bold_line_style(BLACK.mix(0.12))
        .axis_desc_style(("sans-serif", 15))
        .label_style(("sans-serif", 13))
        .draw()?;

    // The ideal, as the paper draws it: every arrival allocated until the cluster is full.
    let start = lo.max(100.0 - top);
    let end = hi.min(100.0);
    let ideal = vec![(start, 100.0 - start), (end, 100.0 - end)];
    let grey = BLACK.mix(0.45);
    chart
        .draw_series(std::iter::once(PathElement::new(
            ideal,
            grey.stroke_width(1),
        )))?
        .label("ideal")
        .legend(move |(x, y)| Rectangle::new([(x, y - 1), (x + 18, y + 1)], grey.filled()));

    for l in &fig.lines {
        let colour = PALETTE[l.colour % PALETTE.len()];
        let style = colour.stroke_width(2);
        let points = shown(&l.points, fig.arrived);
        let marks: Vec<(f64, f64)> = points
            .iter()
            .copied()
            .filter(|p| l.file > 0 && p.0 % MARK_EVERY == 0.0)
            .collect();
        let marker = (l.file > 0).then(|| (l.file - 1) % 2);
        let anno = chart.draw_series(std::iter::once(PathElement::new(points, style)))?;
        anno.label(l.label.as_str());
        match marker {
            None => anno.legend(move |(x, y)| {
                Rectangle::new([(x, y - 2), (x + 18, y + 2)], colour.filled())
            }),
            Some(0) => anno.legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + Rectangle::new([(0, -1), (18, 1)], colour.filled())
                    + Circle::new((9, 0), 4, colour.filled())
            }),
            Some(_) => anno.legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + Rectangle::new([(0, -1), (18, 1)], colour.filled())
                    + TriangleMarker::new((9, 0), 5, colour.filled())
            }),
        };
        match marker {
            None => {}
            Some(0) => {
                chart.draw_series(marks.iter().map(|&p| Circle::new(p, 4, colour.filled())))?;
            }
            Some(_) => {
                chart.draw_series(
                    marks
                        .iter()
                        .map(|&p| TriangleMarker::new(p, 5, colour.filled())),
                )?;
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 13))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two policies, two seeds each; fragaware's seed 43 misses arrived = 3 %.
    const SIM: &str = "workload,sc_policy,tune,seed,total_gpus,0,1,2,3\n\
        openb_pod_list_default,binpack,1.3,42,8,0.0,1.0,2.0,2.5\n\
        openb_pod_list_default,fragaware,1.3,42,8,0.0,1.0,2.0,3.0\n\
        openb_pod_list_default,binpack,1.3,43,8,0.0,1.0,1.5,2.5\n\
        openb_pod_list_default,fragaware,1.3,43,8,0.0,1.0,2.0,\n";

    /// The live replay's curve (`replay.py curve`: tune 0, one seed).
    const LIVE: &str = "workload,sc_policy,tune,seed,total_gpus,0,1,2,3\n\
        openb_pod_list_default,live-fragaware,0,42,8,0.0,1.0,2.0,2.75\n";

    fn parsed(name: &'static str, text: &str) -> (&'static Path, CurveFile) {
        (Path::new(name), curves::parse_curves(name, text).unwrap())
    }

    #[test]
    fn one_line_per_file_and_policy_on_the_papers_axes() {
        let files = [parsed("sim.csv", SIM), parsed("live.csv", LIVE)];
        let fig = figure(&files, None, None, (0.0, 3.0)).unwrap();
        let labels: Vec<&str> = fig.lines.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(
            labels,
            ["binpack (sim)", "fragaware (sim)", "live-fragaware (live)"]
        );
        // binpack at 2 %: mean allocated (2.0 + 1.5) / 2 = 1.75, unallocated 98.25.
        assert_eq!(
            fig.lines[0].points,
            [(0.0, 100.0), (1.0, 99.0), (2.0, 98.25), (3.0, 97.5)]
        );
        // fragaware at 3 %: only seed 42 has a value.
        assert_eq!(fig.lines[1].points[3], (3.0, 97.0));
        assert_eq!(
            (
                fig.lines[0].colour,
                fig.lines[1].colour,
                fig.lines[2].colour
            ),
            (0, 1, 2)
        );
        assert_eq!((fig.lines[1].file, fig.lines[2].file), (0, 1));
        assert!(
            fig.title.contains("openb_pod_list_default"),
            "{}",
            fig.title
        );
        assert!(fig.title.contains("2 seeds"), "{}", fig.title);
        // One file: the labels are the policies alone.
        let fig = figure(&files[..1], Some("default"), Some("T".into()), (0.0, 3.0)).unwrap();
        assert_eq!(fig.lines[0].label, "binpack");
        assert_eq!(fig.title, "T");
    }

    #[test]
    fn the_svg_has_one_path_per_line_and_a_legend_entry_each() {
        let files = [parsed("sim.csv", SIM), parsed("live.csv", LIVE)];
        let fig = figure(&files, None, Some("curves".into()), (0.0, 3.0)).unwrap();
        let svg = render_svg(&fig).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        // The lines are the only 2 px paths; the axes, ticks and ideal are 1 px.
        let paths = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\""))
            .count();
        assert_eq!(paths, 3, "{svg}");
        for colour in ["#1F77B4", "#FF7F0E", "#2CA02C"] {
            assert!(
                svg.contains(&format!("stroke=\"{colour}\" stroke-width=\"2\"")),
                "{colour}"
            );
        }
        for label in [
            "binpack (sim)",
            "fragaware (sim)",
            "live-fragaware (live)",
            "ideal",
            "curves",
        ] {
            assert!(
                svg.contains(&format!("\n{label}\n</text>")),
                "{label}: {svg}"
            );
        }
        assert!(svg.contains("Unallocated GPUs (% of capacity)"));
        assert!(svg.contains("Arrived GPU demand"));
    }

    #[test]
    fn the_range_clips_a_line_and_gaps_are_bridged() {
        let pts = [
            (0.0, 100.0),
            (1.0, 99.0),
            (4.0, 96.004),
            (5.0, 95.0),
            (9.0, 91.0),
        ];
        assert_eq!(
            shown(&pts, (1.0, 5.0)),
            [(1.0, 99.0), (4.0, 96.0), (5.0, 95.0)]
        );
    }

    #[test]
    fn the_y_axis_covers_the_shown_points() {
        let fig = Figure {
            title: String::new(),
            arrived: (75.0, 120.0),
            lines: vec![Line {
                label: "a".into(),
                colour: 0,
                file: 0,
                points: vec![(10.0, 90.0), (75.0, 25.5), (100.0, 4.2)],
            }],
        };
        assert_eq!(y_top(&fig), 30.0);
    }

    #[test]
    fn several_workloads_need_a_choice_and_a_missing_one_is_named() {
        let two = format!("{SIM}other,binpack,1.3,42,8,0.0,1.0,2.0,2.5\n");
        let files = [parsed("two.csv", &two)];
        let e = figure(&files, None, None, (0.0, 3.0)).unwrap_err();
        assert!(
            e.to_string().contains("two.csv: holds several workloads"),
            "{e}"
        );
        assert!(e.downcast_ref::<BadInput>().is_some());
        let e = figure(&files, Some("gpushare40"), None, (0.0, 3.0)).unwrap_err();
        assert!(
            e.to_string()
                .contains("two.csv: no rows of workload \"gpushare40\""),
            "{e}"
        );
        let empty = [parsed("empty.csv", "workload,sc_policy,seed,0,1\n")];
        let e = figure(&empty, None, None, (0.0, 3.0)).unwrap_err();
        assert_eq!(e.to_string(), "empty.csv: no data rows");
        assert!(figure(&files, Some("other"), None, (0.0, 3.0)).is_ok());
    }

    #[test]
    fn arrived_range_is_checked() {
        assert_eq!(parse_range("75-120").unwrap(), (75.0, 120.0));
        for bad in ["120-75", "x-1", "75", "5-5"] {
            let e = parse_range(bad).unwrap_err();
            assert!(e.to_string().starts_with("--arrived: "), "{e}");
        }
    }
}
