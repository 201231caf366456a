//! Benchmark records: the JSON schema `cargo xtask bench --json` writes, how they are read from
//! criterion's output, merged with records benches emit themselves, and compared to a baseline.
//!
//! # Schema
//!
//! One JSON array of objects `{ "bench", "case", "metric", "value", "unit" }`:
//! - from every criterion benchmark that ran: `median_time` in `ns`;
//! - when the benchmark declares a throughput: `throughput` in `bytes/s` (`Bytes`,
//!   `BytesDecimal`), `bits/s` (`Bits`), `elem/s` (`Elements`), or `GFLOP/s` when the group name
//!   ends with [`FLOP_SUFFIX`] (then `Elements(n)` counts floating-point operations and the suffix
//!   is removed from `bench`); `ElementsAndBytes` gives `throughput` in elem/s (or GFLOP/s) and
//!   `throughput_bytes` in bytes/s;
//! - extra records a bench appends itself, one JSON object per line, to the file named by the
//!   environment variable [`RECORDS_ENV`] (for example `% of measured FMA peak`).
//!
//! `bench` is criterion's group id, `case` its function id and parameter joined by `/`
//! (`default` when a benchmark has neither).
//!
//! # Comparison
//!
//! Records match on (bench, case, metric, unit). Time units (`ns`, `us`, `ms`, `s`) and size
//! units (`bytes`, `KiB`, `MiB`, `GiB`) are better lower; every other unit (rates, `%`) is better
//! higher. A change worse than the threshold is a regression.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Result, XtaskError, io_err};

/// Environment variable naming the JSON-lines file where benches may append extra records.
pub const RECORDS_ENV: &str = "XTASK_BENCH_RECORDS";

/// Group-name suffix declaring that `Throughput::Elements(n)` counts floating-point operations.
pub const FLOP_SUFFIX: &str = "@flop";

/// One measured value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The benchmark group.
    pub bench: String,
    /// The case inside the group (function and parameter).
    pub case: String,
    /// What was measured: `median_time`, `throughput`, ...
    pub metric: String,
    /// The value.
    pub value: f64,
    /// Its unit: `ns`, `GFLOP/s`, `bytes/s`, `elem/s`, `%`, ...
    pub unit: String,
}

impl Record {
    fn key(&self) -> (&str, &str, &str, &str) {
        (&self.bench, &self.case, &self.metric, &self.unit)
    }

    /// `true` when a smaller value is better: times (`ns`, `us`, `ms`, `s`) and sizes (`bytes`,
    /// `KiB`, `MiB`, `GiB`, e.g. workspace or peak memory). Rates (`.../s`), `%` and everything
    /// else are better higher.
    pub fn lower_is_better(&self) -> bool {
        matches!(
            self.unit.as_str(),
            "ns" | "us" | "µs" | "ms" | "s" | "bytes" | "B" | "KiB" | "MiB" | "GiB"
        )
    }
}

/// Records of one criterion benchmark directory (`.../new/` holding `benchmark.json` and
/// `estimates.json`).
pub fn records_from_criterion(benchmark: &Value, estimates: &Value) -> Option<Vec<Record>> {
    let group = benchmark["group_id"].as_str()?;
    let function = benchmark["function_id"].as_str();
    let value = benchmark["value_str"].as_str();
    let case = match (function, value) {
        (Some(f), Some(v)) => format!("{f}/{v}"),
        (Some(f), None) => f.to_string(),
        (None, Some(v)) => v.to_string(),
        (None, None) => "default".to_string(),
    };
    let (bench, flop) = match group.strip_suffix(FLOP_SUFFIX) {
        Some(g) => (g.to_string(), true),
        None => (group.to_string(), false),
    };
    let median_ns = estimates["median"]["point_estimate"].as_f64()?;
    let rec = |metric: &str, value: f64, unit: &str| Record {
        bench: bench.clone(),
        case: case.clone(),
        metric: metric.to_string(),
        value,
        unit: unit.to_string(),
    };
    let mut out = vec![rec("median_time", median_ns, "ns")];
    if median_ns > 0.0 {
        let per_sec = |n: f64| n / (median_ns * 1e-9);
        let elements = |n: f64| {
            if flop {
                // n FLOP in median_ns nanoseconds: FLOP/ns is GFLOP/s.
                rec("throughput", n / median_ns, "GFLOP/s")
            } else {
                rec("throughput", per_sec(n), "elem/s")
            }
        };
        let t = &benchmark["throughput"];
        if let Some(n) = t["Bytes"].as_f64().or(t["BytesDecimal"].as_f64()) {
            out.push(rec("throughput", per_sec(n), "bytes/s"));
        } else if let Some(n) = t["Bits"].as_f64() {
            out.push(rec("throughput", per_sec(n), "bits/s"));
        } else if let Some(n) = t["Elements"].as_f64() {
            out.push(elements(n));
        } else if let Some(eb) = t.get("ElementsAndBytes") {
            if let Some(n) = eb["elements"].as_f64() {
                out.push(elements(n));
            }
            if let Some(n) = eb["bytes"].as_f64() {
                out.push(rec("throughput_bytes", per_sec(n), "bytes/s"));
            }
        }
    }
    Some(out)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text).map_err(|source| XtaskError::Json {
        path: path.display().to_string(),
        source,
    })
}

/// Every `benchmark.json` under `dir` inside a directory named `new`.
fn find_new_benchmarks(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            if e.file_name() == "new" {
                let b = path.join("benchmark.json");
                if b.is_file() {
                    out.push(b);
                }
            } else {
                find_new_benchmarks(&path, out);
            }
        }
    }
}

/// Records of every criterion benchmark under `criterion_home` whose results were written at or
/// after `since` (so benchmarks filtered out of this run, still on disk from earlier runs, are
/// left out).
pub fn collect_criterion(criterion_home: &Path, since: SystemTime) -> Result<Vec<Record>> {
    let mut files = Vec::new();
    find_new_benchmarks(criterion_home, &mut files);
    let mut out = Vec::new();
    for b in files {
        let dir = b.parent().unwrap_or(Path::new("."));
        let est = dir.join("estimates.json");
        let fresh = std::fs::metadata(&est)
            .and_then(|m| m.modified())
            .map(|t| t >= since)
            .unwrap_or(false);
        if !fresh {
            continue;
        }
        let recs = records_from_criterion(&read_json(&b)?, &read_json(&est)?).ok_or_else(|| {
            XtaskError::Other(format!("{}: unexpected criterion format", dir.display()))
        })?;
        out.extend(recs);
    }
    Ok(out)
}

/// Extra records from the JSON-lines file benches append to (blank lines ignored).
pub fn read_extra_records(path: &Path) -> Result<Vec<Record>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(Vec::new());
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).map_err(|source| XtaskError::Json {
                path: path.display().to_string(),
                source,
            })
        })
        .collect()
}

/// Sorts records by bench, case, metric.
pub fn sort(records: &mut [Record]) {
    records.sort_by(|a, b| (&a.bench, &a.case, &a.metric).cmp(&(&b.bench, &b.case, &b.metric)));
}

/// Writes records as one pretty JSON array, via a temporary file and a rename so a reader never
/// sees a half-written file.
pub fn write_json(path: &Path, records: &[Record]) -> Result<()> {
    let text = serde_json::to_string_pretty(records).map_err(|source| XtaskError::Json {
        path: path.display().to_string(),
        source,
    })?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text + "\n").map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// Reads a records file written by [`write_json`].
pub fn read_records(path: &Path) -> Result<Vec<Record>> {
    serde_json::from_value(read_json(path)?).map_err(|source| XtaskError::Json {
        path: path.display().to_string(),
        source,
    })
}

/// One row of a baseline comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The new record.
    pub new: Record,
    /// The baseline value.
    pub old: f64,
    /// Relative change in percent, `(new - old) / old * 100`.
    pub change_pct: f64,
    /// Whether the change is worse than the threshold.
    pub regressed: bool,
}

/// Compares `new` to `old` record by record; records present on one side only are returned as
/// the second and third elements (new only, baseline only).
pub fn compare(
    old: &[Record],
    new: &[Record],
    threshold_pct: f64,
) -> (Vec<Comparison>, Vec<Record>, Vec<Record>) {
    let mut rows = Vec::new();
    let mut added = Vec::new();
    for n in new {
        match old.iter().find(|o| o.key() == n.key()) {
            Some(o) => {
                let change_pct = if o.value != 0.0 {
                    (n.value - o.value) / o.value.abs() * 100.0
                } else {
                    0.0
                };
                let regressed = if n.lower_is_better() {
                    change_pct > threshold_pct
                } else {
                    change_pct < -threshold_pct
                };
                rows.push(Comparison {
                    new: n.clone(),
                    old: o.value,
                    change_pct,
                    regressed,
                });
            }
            None => added.push(n.clone()),
        }
    }
    let removed = old
        .iter()
        .filter(|o| !new.iter().any(|n| n.key() == o.key()))
        .cloned()
        .collect();
    (rows, added, removed)
}

/// Formats a value compactly with its magnitude kept readable.
pub fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        format!("{v:.4e}")
    } else {
        format!("{v:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(bench: &str, metric: &str, value: f64, unit: &str) -> Record {
        Record {
            bench: bench.into(),
            case: "c".into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
        }
    }

    #[test]
    fn criterion_bytes_throughput() {
        let b = json!({"group_id": "allreduce", "function_id": "single", "value_str": "1024",
                       "throughput": {"Bytes": 4096}});
        let e = json!({"median": {"point_estimate": 2000.0}});
        let r = records_from_criterion(&b, &e).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].case, "single/1024");
        assert_eq!(
            (r[0].metric.as_str(), r[0].value, r[0].unit.as_str()),
            ("median_time", 2000.0, "ns")
        );
        // 4096 bytes in 2 µs = 2.048e9 bytes/s.
        assert_eq!(r[1].unit, "bytes/s");
        assert!((r[1].value - 2.048e9).abs() < 1.0);
    }

    #[test]
    fn criterion_flop_throughput_and_no_throughput() {
        let b = json!({"group_id": "sgemm@flop", "function_id": "ours", "value_str": null,
                       "throughput": {"Elements": 2_000_000}});
        let e = json!({"median": {"point_estimate": 1000.0}});
        let r = records_from_criterion(&b, &e).unwrap();
        assert_eq!(r[1].bench, "sgemm");
        assert_eq!((r[1].value, r[1].unit.as_str()), (2000.0, "GFLOP/s"));

        let b =
            json!({"group_id": "g", "function_id": null, "value_str": null, "throughput": null});
        let r = records_from_criterion(&b, &e).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].case, "default");
        assert!(records_from_criterion(&json!({}), &e).is_none());
    }

    #[test]
    fn elements_and_bytes() {
        let b = json!({"group_id": "g", "function_id": "f", "value_str": null,
                       "throughput": {"ElementsAndBytes": {"elements": 10, "bytes": 40}}});
        let e = json!({"median": {"point_estimate": 1e9}});
        let r = records_from_criterion(&b, &e).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!((r[1].value, r[1].unit.as_str()), (10.0, "elem/s"));
        assert_eq!(
            (r[2].metric.as_str(), r[2].value),
            ("throughput_bytes", 40.0)
        );
    }

    #[test]
    fn comparison_directions() {
        let old = vec![
            rec("a", "median_time", 100.0, "ns"),
            rec("a", "throughput", 100.0, "GFLOP/s"),
            rec("gone", "median_time", 1.0, "ns"),
        ];
        let new = vec![
            rec("a", "median_time", 115.0, "ns"),
            rec("a", "throughput", 95.0, "GFLOP/s"),
            rec("fresh", "median_time", 1.0, "ns"),
        ];
        let (rows, added, removed) = compare(&old, &new, 10.0);
        assert_eq!(rows.len(), 2);
        assert!(rows[0].regressed, "15% slower is a regression at 10%");
        assert!((rows[0].change_pct - 15.0).abs() < 1e-9);
        assert!(!rows[1].regressed, "5% less throughput is within 10%");
        assert_eq!(added[0].bench, "fresh");
        assert_eq!(removed[0].bench, "gone");

        let (rows, _, _) = compare(&old, &new, 4.0);
        assert!(rows[1].regressed, "5% less throughput exceeds 4%");
        let old_ws = vec![rec("w", "workspace", 100.0, "bytes")];
        let (rows, _, _) = compare(&old_ws, &[rec("w", "workspace", 120.0, "bytes")], 10.0);
        assert!(rows[0].regressed, "20% more workspace is a regression");
        let (rows, _, _) = compare(&old_ws, &[rec("w", "workspace", 50.0, "bytes")], 10.0);
        assert!(!rows[0].regressed, "less workspace is not");
        let faster = vec![rec("a", "median_time", 50.0, "ns")];
        let (rows, _, _) = compare(&old, &faster, 10.0);
        assert!(!rows[0].regressed);
    }

    #[test]
    fn json_round_trip_via_rename() {
        let dir = std::env::temp_dir().join(format!("xtask-records-{}", std::process::id()));
        let path = dir.join("out.json");
        let recs = vec![rec("a", "median_time", 1.5, "ns")];
        write_json(&path, &recs).unwrap();
        assert_eq!(read_records(&path).unwrap(), recs);
        assert!(!dir.join("out.json.tmp").exists());
        std::fs::write(dir.join("extra.jsonl"), "{\"bench\":\"x\",\"case\":\"c\",\"metric\":\"peak\",\"value\":80.5,\"unit\":\"%\"}\n\n").unwrap();
        let extra = read_extra_records(&dir.join("extra.jsonl")).unwrap();
        assert_eq!(extra[0].unit, "%");
        assert!(read_extra_records(&dir.join("missing")).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
