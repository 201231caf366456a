//! Shared helpers for the criterion benchmarks in `benches/benches/`.
//!
//! # Records for `cargo xtask bench`
//!
//! `cargo xtask bench --json FILE` turns criterion's results into records
//! `{ "bench", "case", "metric", "value", "unit" }` (median time in ns, and throughput when the
//! benchmark declares one). Two conventions let a bench say more:
//! - a benchmark group whose name ends with [`FLOP_SUFFIX`] declares `Throughput::Elements(n)`
//!   as `n` floating-point operations; xtask reports `throughput` in GFLOP/s under the group name
//!   without the suffix (see [`flop_group`]);
//! - [`emit_record`] appends any other record (a measured FMA peak, % of peak, ...) to the file
//!   named by [`RECORDS_ENV`], which xtask sets and merges. Outside xtask it does nothing.

use std::io::Write;

/// Environment variable naming the JSON-lines file of extra records (set by `cargo xtask bench`).
pub const RECORDS_ENV: &str = "XTASK_BENCH_RECORDS";

/// Group-name suffix declaring that the group's `Throughput::Elements` counts FLOPs.
pub const FLOP_SUFFIX: &str = "@flop";

/// The name of a benchmark group whose element throughput counts floating-point operations.
pub fn flop_group(name: &str) -> String {
    format!("{name}{FLOP_SUFFIX}")
}

/// A string as a JSON string literal.
fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}

/// Rayon pools of 1 and 2 threads, for benchmarks that measure both (run a case inside
/// `pool.install`).
pub fn thread_pools() -> Vec<(usize, rayon::ThreadPool)> {
    thread_pools_bound(false)
}

/// [`thread_pools`], with each pool's workers bound to CPUs ([`core_blas::bind_workers`]: worker
/// i on the i-th CPU of the process's affinity mask) when `bind` is true, for bound rows beside
/// the default, unbound ones.
pub fn thread_pools_bound(bind: bool) -> Vec<(usize, rayon::ThreadPool)> {
    [1usize, 2]
        .into_iter()
        .map(|t| {
            let builder = rayon::ThreadPoolBuilder::new().num_threads(t);
            let builder = if bind {
                core_blas::bind_workers(builder).expect("CPU affinity readable")
            } else {
                builder
            };
            (t, builder.build().expect("thread pool"))
        })
        .collect()
}

/// Whether the environment variable `var` is set to `1` (a bench's opt-in switch such as
/// `CONV_BIND=1`).
pub fn env_flag(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// One record as a JSON object on one line. `value` must be finite (JSON has no NaN or infinity;
/// [`emit_record`] checks).
pub fn record_line(bench: &str, case: &str, metric: &str, value: f64, unit: &str) -> String {
    format!(
        "{{\"bench\":{},\"case\":{},\"metric\":{},\"value\":{value:e},\"unit\":{}}}",
        json_string(bench),
        json_string(case),
        json_string(metric),
        json_string(unit)
    )
}

/// Appends a record for `cargo xtask bench` to the file named by [`RECORDS_ENV`]; does nothing
/// when the variable is unset (a plain `cargo bench`).
///
/// Errors: `InvalidInput` when `value` is not finite; I/O errors of the file.
pub fn emit_record(
    bench: &str,
    case: &str,
    metric: &str,
    value: f64,
    unit: &str,
) -> std::io::Result<()> {
    if !value.is_finite() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("record {bench}/{case} {metric}: value {value} is not finite"),
        ));
    }
    let Some(path) = std::env::var_os(RECORDS_ENV) else {
        return Ok(());
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(f, "{}", record_line(bench, case, metric, value, unit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_line_is_json() {
        let l = record_line("g\"x", "c\\1", "peak", 1.5e9, "GFLOP/s");
        assert_eq!(
            l,
            r#"{"bench":"g\"x","case":"c\\1","metric":"peak","value":1.5e9,"unit":"GFLOP/s"}"#
        );
        assert!(emit_record("a", "b", "c", f64::NAN, "d").is_err());
        assert_eq!(flop_group("sgemm"), "sgemm@flop");
    }
}
