//! `cargo xtask`: project automation (the alias in `.cargo/config.toml` builds this crate in
//! `target/xtask`, so it never evicts the main build).
//!
//! - `cargo xtask test`: fmt, clippy, the workspace tests, the ISA matrix (core-blas, conv-ops, fastconv)
//!   (`CORE_BLAS_ISA` = each kernel family the host supports) and the multi-rank MPI tests under
//!   `mpirun -np 1, 2, 4`, then the `train` binary under `mpirun` in every `--parallel` layout,
//!   whose loss must equal the single-process run's.
//! - `cargo xtask train-check`: only those `train` runs.
//! - `cargo xtask bench [--quick] [--json FILE] [--baseline FILE] [--threshold PCT] [-- FILTER]`:
//!   criterion benchmarks, written as JSON records and compared with a baseline.
//! - `cargo xtask build --arch NAME|all`: release builds per x86-64 level and installed target.
//! - `cargo xtask ci`: test, then `build --arch all`, then `bench --quick --json target/bench.json`.

mod bench;
mod build;
mod error;
mod prereq;
mod records;
mod test;
mod util;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::bench::BenchOptions;
use crate::error::Result;
use crate::util::{Pipeline, target_dir};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Project automation for the CNN-on-CPU workspace"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// fmt, clippy, all tests, the ISA matrix (core-blas, conv-ops, fastconv), the multi-rank
    /// MPI tests, `train` under mpirun.
    Test,
    /// `train` under mpirun in every --parallel layout against one process (part of `test`).
    TrainCheck,
    /// Run the criterion benchmarks and write/compare JSON records.
    Bench {
        /// Criterion's quick mode (short runs; for smoke tests and CI, not for decisions).
        #[arg(long)]
        quick: bool,
        /// Write all records as one JSON array to FILE.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
        /// Compare with an earlier JSON file; exit non-zero on a regression.
        #[arg(long, value_name = "FILE")]
        baseline: Option<PathBuf>,
        /// Largest tolerated regression, in percent.
        #[arg(long, value_name = "PCT", default_value_t = 10.0)]
        threshold: f64,
        /// Criterion filters (after `--`).
        #[arg(last = true)]
        filter: Vec<String>,
    },
    /// Release builds per x86-64 level (x86-64, x86-64-v3, x86-64-v4) and installed target.
    Build {
        /// A level, an installed target triple, or `all`.
        #[arg(long, value_name = "NAME", default_value = "all")]
        arch: String,
    },
    /// test, then build --arch all, then bench --quick --json `<target>/bench.json`.
    Ci,
}

fn ci() -> Result<()> {
    let mut p = Pipeline::default();
    p.step("xtask test", test::test);
    p.step("xtask build --arch all", || build::build("all"));
    let json = target_dir().join("bench.json");
    p.step("xtask bench --quick --json target/bench.json", || {
        bench::bench(&BenchOptions {
            quick: true,
            json: Some(json.clone()),
            baseline: None,
            threshold: 10.0,
            filter: Vec::new(),
        })
    });
    p.finish("xtask ci")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Cmd::Test => test::test(),
        Cmd::TrainCheck => test::train_check(),
        Cmd::Bench {
            quick,
            json,
            baseline,
            threshold,
            filter,
        } => bench::bench(&BenchOptions {
            quick,
            json,
            baseline,
            threshold,
            filter,
        }),
        Cmd::Build { arch } => build::build(&arch),
        Cmd::Ci => ci(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
