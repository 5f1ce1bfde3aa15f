//! Reading allocation curves back: files in the layout of the FGD artifact's
//! `analysis_allo_discrete.csv` (`workload,sc_policy,tune,seed,total_gpus,0,…,130`), as
//! `fgpu-sim --out` and `hack/replay.py curve` write them, and their mean per policy over
//! the seeds. The plot of `fgpu-sim plot` is drawn from these means.
//!
//! Each numbered column holds the allocated GPU % of capacity at that arrived % (an empty
//! cell: no arrival was logged near it). The paper's figure shows the unallocated GPU %,
//! `100 - allocated`.

use super::{CsvError, split_csv};

/// One row: the curve of one policy and seed.
#[derive(Clone, Debug, PartialEq)]
pub struct CurveRow {
    /// The row's line in its file (1-based; the header is line 1).
    pub line: usize,
    pub workload: String,
    pub policy: String,
    pub seed: String,
    /// Allocated GPU % at each of [`CurveFile::arrived`]; `None` for an empty cell.
    pub allocated: Vec<Option<f64>>,
}

/// A whole file of curves.
#[derive(Clone, Debug, PartialEq)]
pub struct CurveFile {
    /// The arrived % of each numbered column, in column order.
    pub arrived: Vec<u32>,
    pub rows: Vec<CurveRow>,
}

/// One policy's curve averaged over its rows (seeds).
#[derive(Clone, Debug, PartialEq)]
pub struct MeanCurve {
    pub workload: String,
    pub policy: String,
    /// How many rows were averaged.
    pub runs: usize,
    /// Per arrived % (those of [`CurveFile::arrived`]): the mean allocated GPU % of the
    /// rows that have a value there; `None` where none has.
    pub allocated: Vec<Option<f64>>,
}

impl MeanCurve {
    /// The paper's axes: (arrived %, unallocated GPU %) where the mean is known.
    pub fn unallocated(&self, arrived: &[u32]) -> Vec<(f64, f64)> {
        arrived
            .iter()
            .zip(&self.allocated)
            .filter_map(|(&x, a)| a.map(|a| (f64::from(x), 100.0 - a)))
            .collect()
    }
}

/// Parses a file of curves. `file` names it in errors. The header must have `workload`,
/// `sc_policy` and `seed` and at least two columns named by a whole number (the arrived
/// %); every cell of those is empty or an allocated % in 0-100.
pub fn parse_curves(file: &str, text: &str) -> Result<CurveFile, CsvError> {
    let (t, rows) = split_csv(file, text)?;
    let (wl, pol, seed) = (t.col("workload")?, t.col("sc_policy")?, t.col("seed")?);
    let numbered: Vec<(usize, u32)> = t
        .cols
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.trim().parse::<u32>().ok().map(|x| (i, x)))
        .collect();
    if numbered.len() < 2 {
        return Err(CsvError {
            file: file.to_string(),
            line: 1,
            column_no: 0,
            column: "0".into(),
            message: format!(
                "expected columns named by arrived % (0,1,…,130) in the header (found: {})",
                t.cols.join(",")
            ),
        });
    }
    let mut out = Vec::with_capacity(rows.len());
    for (line, f) in &rows {
        let mut allocated = Vec::with_capacity(numbered.len());
        for &(i, _) in &numbered {
            let raw = f[i].trim();
            if raw.is_empty() {
                allocated.push(None);
                continue;
            }
            match raw.parse::<f64>() {
                Ok(v) if (0.0..=100.0).contains(&v) => allocated.push(Some(v)),
                _ => {
                    return Err(CsvError {
                        file: file.to_string(),
                        line: *line,
                        column_no: i + 1,
                        column: t.cols[i].trim().to_string(),
                        message: format!("{raw:?} is not an allocated GPU % in 0-100"),
                    });
                }
            }
        }
        out.push(CurveRow {
            line: *line,
            workload: f[wl].trim().to_string(),
            policy: f[pol].trim().to_string(),
            seed: f[seed].trim().to_string(),
            allocated,
        });
    }
    Ok(CurveFile {
        arrived: numbered.into_iter().map(|(_, x)| x).collect(),
        rows: out,
    })
}

/// Whether a row's `workload` is the one asked for: the same name, or the name after a
/// `_` (`default` is `openb_pod_list_default`; `default` is not `…_default-pin5`).
pub fn workload_matches(workload: &str, wanted: &str) -> bool {
    workload == wanted
        || workload
            .strip_suffix(wanted)
            .is_some_and(|head| head.ends_with('_'))
}

/// The distinct workloads of a file, in order of first appearance.
pub fn workloads(file: &CurveFile) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for r in &file.rows {
        if !out.contains(&r.workload.as_str()) {
            out.push(&r.workload);
        }
    }
    out
}

/// The mean curve of each policy over its rows of `workload` (all rows when `None`), in
/// order of the policies' first rows. Each arrived % is averaged over the rows that have
/// a value there.
pub fn mean_by_policy(file: &CurveFile, workload: Option<&str>) -> Vec<MeanCurve> {
    let mut sums: Vec<(MeanCurve, Vec<(f64, usize)>)> = Vec::new();
    let width = file.arrived.len();
    for r in &file.rows {
        if workload.is_some_and(|w| !workload_matches(&r.workload, w)) {
            continue;
        }
        let i = match sums.iter().position(|(m, _)| m.policy == r.policy) {
            Some(i) => i,
            None => {
                sums.push((
                    MeanCurve {
                        workload: r.workload.clone(),
                        policy: r.policy.clone(),
                        runs: 0,
                        allocated: Vec::new(),
                    },
                    vec![(0.0, 0); width],
                ));
                sums.len() - 1
            }
        };
        let (m, acc) = &mut sums[i];
        m.runs += 1;
        for (slot, v) in acc.iter_mut().zip(&r.allocated) {
            if let Some(v) = v {
                slot.0 += v;
                slot.1 += 1;
            }
        }
    }
    sums.into_iter()
        .map(|(mut m, acc)| {
            m.allocated = acc
                .into_iter()
                .map(|(s, n)| (n > 0).then(|| s / n as f64))
                .collect();
            m
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two policies, two seeds of `a` (one with an empty cell) and one of `b`; a row of
    /// another workload.
    const FILE: &str = "workload,sc_policy,tune,seed,total_gpus,0,1,2\n\
        openb_pod_list_default,a,1.3,42,8,0.0,10.0,20.0\n\
        openb_pod_list_default,b,1.3,42,8,0.0,12.5,\n\
        openb_pod_list_default,a,1.3,43,8,0.0,11.0,\n\
        other,a,1.3,42,8,50.0,50.0,50.0\n";

    #[test]
    fn reads_a_good_file() {
        let f = parse_curves("c.csv", FILE).unwrap();
        assert_eq!(f.arrived, vec![0, 1, 2]);
        assert_eq!(f.rows.len(), 4);
        let r = &f.rows[1];
        assert_eq!((r.line, r.policy.as_str(), r.seed.as_str()), (3, "b", "42"));
        assert_eq!(r.allocated, vec![Some(0.0), Some(12.5), None]);
        assert_eq!(workloads(&f), vec!["openb_pod_list_default", "other"]);
    }

    #[test]
    fn a_bad_field_names_file_line_and_column() {
        let bad = FILE.replace("0.0,11.0,", "0.0,eleven,");
        let e = parse_curves("c.csv", &bad).unwrap_err();
        assert_eq!((e.line, e.column_no, e.column.as_str()), (4, 7, "1"));
        assert!(e.to_string().starts_with("c.csv:4: column 7 (1): "), "{e}");
        // A percentage above 100 is no allocated share either.
        let e = parse_curves("c.csv", &FILE.replace("20.0", "120.0")).unwrap_err();
        assert_eq!((e.line, e.column_no), (2, 8));
    }

    #[test]
    fn a_wrong_column_count_or_layout_is_refused() {
        let short = FILE.replace("0.0,12.5,", "0.0,12.5");
        let e = parse_curves("c.csv", &short).unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("expected 8 fields"), "{e}");
        let e = parse_curves("c.csv", "workload,policy,seed,0,1\nw,a,1,2,3\n").unwrap_err();
        assert_eq!((e.line, e.column.as_str()), (1, "sc_policy"));
        let e = parse_curves("c.csv", "workload,sc_policy,seed,x\nw,a,1,2\n").unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("arrived %"), "{e}");
    }

    #[test]
    fn averages_each_policy_over_its_seeds() {
        let f = parse_curves("c.csv", FILE).unwrap();
        let m = mean_by_policy(&f, Some("default"));
        assert_eq!(m.len(), 2, "{m:?}");
        // a: (10 + 11) / 2 at 1 %; at 2 % only seed 42 has a value.
        assert_eq!((m[0].policy.as_str(), m[0].runs), ("a", 2));
        assert_eq!(m[0].allocated, vec![Some(0.0), Some(10.5), Some(20.0)]);
        assert_eq!((m[1].policy.as_str(), m[1].runs), ("b", 1));
        assert_eq!(m[1].allocated, vec![Some(0.0), Some(12.5), None]);
        // The paper's axes: unallocated = 100 - allocated, gaps left out.
        assert_eq!(
            m[1].unallocated(&f.arrived),
            vec![(0.0, 100.0), (1.0, 87.5)]
        );
        // Without a workload every row counts: a's 0 % is (0 + 0 + 50) / 3.
        let all = mean_by_policy(&f, None);
        assert_eq!(all[0].runs, 3);
        let v = all[0].allocated[0].unwrap();
        assert!((v - 50.0 / 3.0).abs() < 1e-9, "{v}");
    }

    #[test]
    fn a_workload_is_named_whole_or_after_an_underscore() {
        assert!(workload_matches("openb_pod_list_default", "default"));
        assert!(workload_matches("default", "default"));
        assert!(!workload_matches("openb_pod_list_default-pin5", "default"));
        assert!(!workload_matches("openb_pod_list_nodefault", "default"));
    }
}
