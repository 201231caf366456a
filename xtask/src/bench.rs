//! `cargo xtask bench`: runs the criterion benchmarks of the `benches` package, turns criterion's
//! results into records (see [`crate::records`] for the schema), optionally writes them as JSON
//! and compares them with a baseline.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::{Result, XtaskError, io_err};
use crate::records::{
    RECORDS_ENV, Record, collect_criterion, compare, fmt_value, read_extra_records, read_records,
    sort, write_json,
};
use crate::util::{cargo, run, section, target_dir};

/// Options of `cargo xtask bench`.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Criterion's quick mode, with a short measurement cap.
    pub quick: bool,
    /// Where to write the JSON array of records.
    pub json: Option<PathBuf>,
    /// An earlier JSON file to compare against.
    pub baseline: Option<PathBuf>,
    /// Largest tolerated slowdown, in percent.
    pub threshold: f64,
    /// Criterion filters (benchmark id regexes).
    pub filter: Vec<String>,
}

/// Runs the benches and reports; `Err` on a failed run or a regression beyond the threshold.
pub fn bench(opts: &BenchOptions) -> Result<()> {
    // Validate the baseline before spending minutes benchmarking.
    let baseline = opts.baseline.as_deref().map(read_records).transpose()?;
    if !(opts.threshold.is_finite() && opts.threshold >= 0.0) {
        return Err(XtaskError::Other(format!(
            "--threshold must be a non-negative percentage, got {}",
            opts.threshold
        )));
    }

    let target = target_dir();
    let criterion_home = target.join("criterion");
    let extra_path = target.join("xtask-bench-records.jsonl");
    std::fs::create_dir_all(&target).map_err(io_err(&target))?;
    if extra_path.exists() {
        std::fs::remove_file(&extra_path).map_err(io_err(&extra_path))?;
    }
    // File times have coarse resolution on some file systems: allow a little slack.
    let since = SystemTime::now() - Duration::from_secs(2);

    section("cargo bench -p benches");
    let mut cmd = cargo();
    // `--bench '*'` runs the bench targets only: the library's libtest harness would reject
    // criterion's flags.
    cmd.args(["bench", "-p", "benches", "--bench", "*", "--"]);
    if opts.quick {
        // `--opt=value` form: a bench that scans its arguments for a positional filter (gemm
        // does) must not mistake an option's value for one.
        cmd.args(["--quick", "--warm-up-time=0.5", "--measurement-time=1"]);
    }
    cmd.args(&opts.filter);
    cmd.env("CRITERION_HOME", &criterion_home);
    cmd.env(RECORDS_ENV, &extra_path);
    run(&mut cmd)?;

    let mut records = collect_criterion(&criterion_home, since)?;
    records.extend(read_extra_records(&extra_path)?);
    sort(&mut records);
    if records.is_empty() {
        return Err(XtaskError::Other(
            "no benchmark results were produced (does the filter match anything?)".into(),
        ));
    }

    section("bench records");
    print_records(&records);
    if let Some(path) = &opts.json {
        write_json(path, &records)?;
        println!("wrote {} records to {}", records.len(), path.display());
    }

    if let (Some(old), Some(path)) = (baseline, &opts.baseline) {
        report_comparison(&old, &records, opts.threshold, path)?;
    }
    Ok(())
}

fn print_records(records: &[Record]) {
    let w = records
        .iter()
        .map(|r| r.bench.len() + r.case.len() + 1)
        .max()
        .unwrap_or(10);
    for r in records {
        let id = format!("{}/{}", r.bench, r.case);
        println!(
            "{id:<w$}  {:<16} {:>14} {}",
            r.metric,
            fmt_value(r.value),
            r.unit
        );
    }
}

/// Prints the comparison table; `Err(Regression)` when any metric got worse than `threshold`.
fn report_comparison(old: &[Record], new: &[Record], threshold: f64, path: &Path) -> Result<()> {
    section(&format!("comparison with {}", path.display()));
    let (rows, added, removed) = compare(old, new, threshold);
    let w = rows
        .iter()
        .map(|r| r.new.bench.len() + r.new.case.len() + 1)
        .max()
        .unwrap_or(10)
        .max(10);
    println!(
        "{:<w$}  {:<16} {:>14} {:>14} {:>9}  unit",
        "bench/case", "metric", "old", "new", "change"
    );
    for r in &rows {
        let id = format!("{}/{}", r.new.bench, r.new.case);
        println!(
            "{id:<w$}  {:<16} {:>14} {:>14} {:>+8.1}%  {}{}",
            r.new.metric,
            fmt_value(r.old),
            fmt_value(r.new.value),
            r.change_pct,
            r.new.unit,
            if r.regressed { "  REGRESSION" } else { "" }
        );
    }
    for r in &added {
        println!("new (no baseline): {}/{} {}", r.bench, r.case, r.metric);
    }
    for r in &removed {
        println!("not measured now:  {}/{} {}", r.bench, r.case, r.metric);
    }
    let count = rows.iter().filter(|r| r.regressed).count();
    println!(
        "regression threshold: {threshold}% (times may grow, throughputs shrink, by at most this)"
    );
    if count > 0 {
        println!("{count} metric(s) regressed beyond {threshold}%");
        return Err(XtaskError::Regression { count, threshold });
    }
    println!(
        "no regression beyond {threshold}% ({} metrics compared)",
        rows.len()
    );
    Ok(())
}
