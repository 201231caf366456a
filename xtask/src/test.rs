//! `cargo xtask test`: formatting, lints, the whole test suite, the ISA matrix (the tests of
//! core-blas, conv-ops and fastconv per kernel family), the multi-rank MPI tests under
//! `mpirun -np 1, 2, 4`, and the `train` binary under `mpirun` in every distributed layout
//! against its own single-process run.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::error::{Result, XtaskError};
use crate::prereq::{ensure_mpi, ensure_rust_components};
use crate::util::{Pipeline, cargo, describe, is_root, run, run_capture};

/// Rank counts every MPI test binary runs with.
pub const MPI_RANKS: [usize; 3] = [1, 2, 4];

/// Seconds after which `mpirun` kills a hung multi-rank test.
const MPI_TIMEOUT_SECS: u32 = 300;

/// The cargo feature that turns on MPI in a package.
const MPI_FEATURE: &str = "mpi";

/// The `train` run that every distributed layout must reproduce: a ResNet-20 with batch norm at
/// a constant learning rate of 0.05 for four steps, so that a missing gradient sum or a batch
/// norm normalised per shard moves the loss by about 1e-2 while rounding moves it by about 1e-7.
/// The convolution algorithm is fixed: `auto` times its candidates, and under load a rank's row
/// blocks may pick Winograd where one process did not, which moved the loss by 3.8e-4 once.
const TRAIN_ARGS: [&str; 17] = [
    "--model",
    "resnet20",
    "--dataset",
    "synthetic",
    "--batch-size",
    "6",
    "--steps",
    "4",
    "--lr",
    "0.05",
    "--lr-schedule",
    "constant",
    "--conv-algo",
    "convgemm",
    "--threads",
    "1",
    "--json",
];

/// `--parallel` layouts `train` runs in under `mpirun`, with their rank counts and extra
/// arguments: every sample, channel and spatial decomposition, alone and on a 2 × 2 grid, and
/// stationary-w on a 2 × 2 grid of channel blocks. The batch of 6 leaves unequal shards on 4
/// sample blocks.
const TRAIN_LAYOUTS: [(usize, &str, &[&str]); 7] = [
    (2, "data", &[]),
    (4, "data", &[]),
    (2, "channel", &[]),
    (4, "channel", &["--channel-grid", "2x2"]),
    (2, "spatial", &[]),
    (4, "2x2", &[]),
    (4, "2x2s", &[]),
];

/// Largest relative difference from the single-process loss a layout may show.
const TRAIN_LOSS_RTOL: f64 = 1e-5;

/// The kernel families of `core-blas` this host can run: `scalar` always, then `avx2` (AVX2 and
/// FMA), `avx512` (AVX-512F) on x86-64, `neon` on aarch64.
pub fn host_isas() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut isas = vec!["scalar"];
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            isas.push("avx2");
        }
        if is_x86_feature_detected!("avx512f") {
            isas.push("avx512");
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            isas.push("neon");
        }
    }
    isas
}

/// The packages whose tests run once per kernel family of the ISA matrix: core-blas and the
/// two crates whose own kernels and error bounds depend on the family (conv-ops' packing and
/// direct tiles follow core-blas's choice; fastconv's error table is asserted per family, and
/// the portable family, without FMA, rounds differently). Their tests took 27 s (avx2) and 49 s
/// (scalar) on top of core-blas's here (session 22, built).
///
/// The matrix runs the test executables of the workspace build (the unit tests and every
/// `[[test]]` of these packages; not their doc tests, which the workspace step runs once) rather
/// than `cargo test -p ...`: cargo resolves features over the packages it is given, so `-p` on
/// three packages rebuilt them and their dependencies with another feature set, 4m43s of the
/// scalar step's 6m26s in session 41's CI.
const ISA_PACKAGES: [&str; 3] = ["core-blas", "conv-ops", "fastconv"];

/// A test executable of the workspace build, and the directory cargo runs it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestExe {
    /// Package name.
    pub package: String,
    /// Target name (the library's unit tests carry the package's library name).
    pub target: String,
    /// The executable.
    pub exe: PathBuf,
    /// The package's root, where `cargo test` runs its tests.
    pub dir: PathBuf,
}

/// The test executables of `packages` in cargo's `--message-format=json` output of
/// `cargo test --no-run`: artifacts built with the test harness that have an executable. Each
/// package is found by its manifest path in `metadata` (`cargo metadata` output).
pub fn test_executables(messages: &str, metadata: &Value, packages: &[&str]) -> Vec<TestExe> {
    let manifests: Vec<(&str, &str)> = metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .filter_map(|p| Some((p["name"].as_str()?, p["manifest_path"].as_str()?)))
        .filter(|(name, _)| packages.contains(name))
        .collect();
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["profile"]["test"] == true)
        .filter_map(|m| {
            let manifest = m["manifest_path"].as_str()?;
            let (package, _) = manifests.iter().find(|(_, path)| *path == manifest)?;
            Some(TestExe {
                package: package.to_string(),
                target: m["target"]["name"].as_str().unwrap_or_default().to_string(),
                exe: PathBuf::from(m["executable"].as_str()?),
                dir: PathBuf::from(manifest).parent()?.to_path_buf(),
            })
        })
        .collect()
}

/// Builds (normally: finds already built) the workspace's test executables with the features of
/// `cargo test --workspace`, and returns those of [`ISA_PACKAGES`].
fn isa_test_executables(metadata: &Value) -> Result<Vec<TestExe>> {
    let out = run_capture(cargo().args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]))?;
    let exes = test_executables(&out, metadata, &ISA_PACKAGES);
    for package in ISA_PACKAGES {
        if !exes.iter().any(|e| e.package == package) {
            return Err(XtaskError::Other(format!(
                "cargo built no test executable for `{package}`"
            )));
        }
    }
    Ok(exes)
}

/// Runs every executable of `exes` with `CORE_BLAS_ISA=isa` in its package's directory; all of
/// them run, and the error names those that failed.
fn run_isa_tests(exes: &[TestExe], isa: &str) -> Result<()> {
    let mut failed = Vec::new();
    for t in exes {
        let mut cmd = Command::new(&t.exe);
        cmd.current_dir(&t.dir).env("CORE_BLAS_ISA", isa);
        if let Err(e) = run(&mut cmd) {
            eprintln!("{}::{}: {e}", t.package, t.target);
            failed.push(format!("{}::{}", t.package, t.target));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::Other(format!(
            "CORE_BLAS_ISA={isa}: {} failed",
            failed.join(", ")
        )))
    }
}

/// The ISA values to test: all of [`host_isas`], or only `$CORE_BLAS_ISA` when it is set (a CI
/// matrix entry), which must then be one the host supports.
fn isa_matrix() -> Result<Vec<String>> {
    let host = host_isas();
    match std::env::var("CORE_BLAS_ISA") {
        Ok(forced) if !forced.is_empty() => {
            if host.contains(&forced.as_str()) {
                Ok(vec![forced])
            } else {
                Err(XtaskError::Other(format!(
                    "CORE_BLAS_ISA={forced} is set but this host supports only {host:?}"
                )))
            }
        }
        _ => Ok(host.into_iter().map(String::from).collect()),
    }
}

/// A multi-rank test: the package it belongs to and the test target's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiTest {
    /// Package name.
    pub package: String,
    /// Test target name.
    pub target: String,
}

/// Finds the MPI test binaries from `cargo metadata`: test targets whose `required-features`
/// contain `mpi`. Adding such a `[[test]]` to any workspace package is all it takes.
pub fn mpi_tests_from_metadata(metadata: &Value) -> Vec<MpiTest> {
    let mut out = Vec::new();
    let packages = metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for p in packages {
        let pkg = p["name"].as_str().unwrap_or_default();
        for t in p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            let is_test = t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"));
            let needs_mpi = t["required-features"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f == MPI_FEATURE));
            if is_test && needs_mpi {
                out.push(MpiTest {
                    package: pkg.to_string(),
                    target: t["name"].as_str().unwrap_or_default().to_string(),
                });
            }
        }
    }
    out
}

/// Packages of the workspace that declare the `mpi` feature.
fn mpi_packages(metadata: &Value) -> Vec<String> {
    let packages = metadata["packages"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    packages
        .iter()
        .filter(|p| p["features"].get(MPI_FEATURE).is_some())
        .filter_map(|p| p["name"].as_str().map(String::from))
        .collect()
}

/// The `mpi` features of every package that has one, as one `--features` value
/// (`dist/mpi,examples/mpi`).
fn mpi_features(metadata: &Value) -> String {
    mpi_packages(metadata)
        .iter()
        .map(|p| format!("{p}/{MPI_FEATURE}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `cargo xtask train-check`: only the `train`-under-`mpirun` steps of [`test()`].
pub fn train_check() -> Result<()> {
    let mut p = Pipeline::default();
    if p.step("prerequisites: Open MPI, libclang", ensure_mpi) {
        let features = mpi_features(&metadata()?);
        train_steps(&mut p, &features);
    }
    p.finish("xtask train-check")
}

/// `cargo metadata --no-deps` of the workspace.
pub fn metadata() -> Result<Value> {
    let out = run_capture(cargo().args(["metadata", "--format-version", "1", "--no-deps"]))?;
    serde_json::from_str(&out).map_err(|source| XtaskError::Json {
        path: "cargo metadata".into(),
        source,
    })
}

/// Builds the test target with `features` on the whole workspace (see [`test()`]) and returns its
/// executable, read from cargo's JSON messages.
fn build_test_binary(test: &MpiTest, features: &str) -> Result<PathBuf> {
    let out = run_capture(cargo().args([
        "test",
        "--workspace",
        "--features",
        features,
        "--test",
        &test.target,
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]))?;
    executable_from_messages(&out, &test.target, "test").ok_or_else(|| {
        XtaskError::Other(format!(
            "cargo built no executable for test `{}` of `{}`",
            test.target, test.package
        ))
    })
}

/// The executable of target `target` of kind `kind` (`test`, `bin`) in cargo's
/// `--message-format=json` output.
pub fn executable_from_messages(messages: &str, target: &str, kind: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == target)
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == kind))
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

/// `mpirun -np ranks`, with Open MPI's options for more ranks than cores, a time limit, and
/// running as root.
fn mpirun(ranks: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    let version = run_capture(Command::new("mpirun").arg("--version")).unwrap_or_default();
    let open_mpi = version.contains("Open MPI") || version.contains("OpenRTE");
    cmd.arg("-np").arg(ranks.to_string());
    if open_mpi {
        // More ranks than cores is the point of the 4-rank run on a 2-core machine.
        cmd.arg("--oversubscribe");
        cmd.arg("--timeout").arg(MPI_TIMEOUT_SECS.to_string());
        if is_root() {
            cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1");
            cmd.env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        }
    }
    cmd
}

/// Runs `exe` under `mpirun -np ranks` and checks that every rank printed its PASS line.
fn run_under_mpirun(exe: &PathBuf, name: &str, ranks: usize) -> Result<()> {
    let mut cmd = mpirun(ranks);
    cmd.arg(exe);
    println!("$ {}", describe(&cmd));
    let out = cmd.output().map_err(|e| XtaskError::Spawn {
        command: describe(&cmd),
        source: e,
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(XtaskError::CommandFailed {
            command: describe(&cmd),
            status: out.status.to_string(),
        });
    }
    let passes = stdout.lines().filter(|l| l.contains(": PASS")).count();
    if passes != ranks {
        return Err(XtaskError::Other(format!(
            "{name} with {ranks} ranks: {passes} PASS lines, expected one per rank"
        )));
    }
    println!("{name}: all {ranks} ranks passed");
    Ok(())
}

/// Builds the `train` binary with `features` in the profile of the multi-rank tests (whose
/// libraries it reuses) and returns its path.
fn build_train(features: &str) -> Result<PathBuf> {
    let out = run_capture(cargo().args([
        "build",
        "--profile",
        "test",
        "--workspace",
        "--features",
        features,
        "--bin",
        "train",
        "--message-format=json-render-diagnostics",
    ]))?;
    executable_from_messages(&out, "train", "bin")
        .ok_or_else(|| XtaskError::Other("cargo built no executable for bin `train`".into()))
}

/// The `train_loss` of `train --json`'s summary, the last line of `stdout`.
pub fn train_loss_from_json(stdout: &str) -> Result<f64> {
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let v: Value = serde_json::from_str(last).map_err(|source| XtaskError::Json {
        path: "train --json output".into(),
        source,
    })?;
    v["train_loss"]
        .as_f64()
        .ok_or_else(|| XtaskError::Other(format!("no numeric train_loss in `{last}`")))
}

/// Runs `cmd` (a `train --json` invocation) and returns its loss.
fn train_loss(cmd: &mut Command) -> Result<f64> {
    println!("$ {}", describe(cmd));
    let loss = train_loss_from_json(&run_capture(cmd)?)?;
    println!("train_loss {loss}");
    Ok(loss)
}

/// `train` under `mpirun -np ranks --parallel layout` (plus `extra` arguments): its loss.
fn train_loss_under_mpirun(
    exe: &PathBuf,
    ranks: usize,
    layout: &str,
    extra: &[&str],
) -> Result<f64> {
    train_loss(
        mpirun(ranks)
            .arg(exe)
            .args(TRAIN_ARGS)
            .args(["--parallel", layout])
            .args(extra),
    )
}

/// Relative difference of `got` from `want`.
fn rel_diff(got: f64, want: f64) -> f64 {
    (got - want).abs() / want.abs().max(f64::MIN_POSITIVE)
}

/// The `train` steps of the pipeline: the single-process loss, then each of [`TRAIN_LAYOUTS`]
/// under `mpirun` within [`TRAIN_LOSS_RTOL`] of it, and a control showing the comparison can
/// fail: per-shard batch norm (`--local-batch-norm`) must land far outside the tolerance.
fn train_steps(p: &mut Pipeline, features: &str) {
    let mut exe = None;
    let built = p.step("build train (test profile, MPI)", || {
        exe = Some(build_train(features)?);
        Ok(())
    });
    let exe = match exe {
        Some(exe) if built => exe,
        _ => return p.skipped_failure("train under mpirun", "build failed"),
    };
    let mut reference = None;
    p.step("train, one process (no launcher)", || {
        reference = Some(train_loss(Command::new(&exe).args(TRAIN_ARGS))?);
        Ok(())
    });
    let Some(want) = reference else {
        return p.skipped_failure("train under mpirun", "the single-process run failed");
    };
    for (ranks, layout, extra) in TRAIN_LAYOUTS {
        let args = [&["--parallel", layout][..], extra].concat().join(" ");
        p.step(&format!("mpirun -np {ranks} train {args}"), || {
            let got = train_loss_under_mpirun(&exe, ranks, layout, extra)?;
            let d = rel_diff(got, want);
            if d > TRAIN_LOSS_RTOL {
                return Err(XtaskError::Other(format!(
                    "train {args} on {ranks} ranks: loss {got}, one process {want} \
                     (relative difference {d:.1e} > {TRAIN_LOSS_RTOL:.0e})"
                )));
            }
            println!("relative difference from one process: {d:.1e}");
            Ok(())
        });
    }
    p.step(
        "mpirun -np 4 train --parallel data --local-batch-norm (control)",
        || {
            let got = train_loss_under_mpirun(&exe, 4, "data", &["--local-batch-norm"])?;
            let d = rel_diff(got, want);
            if d <= 100.0 * TRAIN_LOSS_RTOL {
                return Err(XtaskError::Other(format!(
                    "per-shard batch norm gave loss {got}, within {d:.1e} of one process's {want}: \
                 the layout comparison cannot tell a wrong step from a right one"
                )));
            }
            println!("relative difference from one process: {d:.1e} (expected: far off)");
            Ok(())
        },
    );
}

/// Runs the whole test pipeline; `Err` when any step failed.
pub fn test() -> Result<()> {
    let mut p = Pipeline::default();

    p.step("prerequisites: rustfmt, clippy", ensure_rust_components);
    let mpi_ok = p.step("prerequisites: Open MPI, libclang", ensure_mpi);

    p.step("cargo fmt --all --check", || {
        run(cargo().args(["fmt", "--all", "--check"]))
    });
    p.step("cargo clippy (workspace, all targets)", || {
        run(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))
    });

    // Every public item is documented, and its links resolve: rustdoc's warnings are errors.
    p.step(
        "cargo doc --workspace --no-deps (rustdoc warnings denied)",
        || {
            run(cargo()
                .args(["doc", "--workspace", "--no-deps"])
                .env("RUSTDOCFLAGS", "-D warnings"))
        },
    );
    // The private items' docs too: a link that breaks when code moves (a test-only item, a
    // macro out of scope) is found here, not by the next reader.
    p.step(
        "cargo doc --workspace --no-deps --document-private-items (rustdoc warnings denied)",
        || {
            run(cargo()
                .args([
                    "doc",
                    "--workspace",
                    "--no-deps",
                    "--document-private-items",
                ])
                .env("RUSTDOCFLAGS", "-D warnings"))
        },
    );

    // The MPI features of every package that has one, enabled together on the whole workspace:
    // dependencies keep the feature set of the plain workspace build, so only the MPI crates and
    // their dependents are rebuilt.
    let meta = metadata();
    let mpi_features = meta.as_ref().map(mpi_features).unwrap_or_default();
    if !mpi_features.is_empty() {
        let name = format!("cargo clippy --workspace --features {mpi_features}");
        if mpi_ok {
            p.step(&name, || {
                run(cargo()
                    .args(["clippy", "--workspace", "--all-targets", "--features"])
                    .args([mpi_features.as_str(), "--", "-D", "warnings"]))
            });
        } else {
            p.skipped_failure(&name, "Open MPI is missing");
        }
    }

    p.step("cargo test --workspace (unit, doc, integration)", || {
        run(cargo().args(["test", "--workspace"]))
    });

    let isas = isa_matrix().and_then(|isas| {
        let meta = meta
            .as_ref()
            .map_err(|e| XtaskError::Other(format!("cargo metadata: {e}")))?;
        Ok((isas, meta))
    });
    match isas {
        Ok((isas, meta)) => {
            println!("ISA matrix for {}: {isas:?}", ISA_PACKAGES.join(", "));
            let mut exes = Vec::new();
            let found = p.step("ISA matrix: the workspace build's test executables", || {
                exes = isa_test_executables(meta)?;
                Ok(())
            });
            if found {
                for isa in isas {
                    p.step(
                        &format!(
                            "tests of {} (unit, integration), CORE_BLAS_ISA={isa}",
                            ISA_PACKAGES.join(", ")
                        ),
                        || run_isa_tests(&exes, &isa),
                    );
                }
            }
        }
        Err(e) => p.skipped_failure("ISA matrix", &e.to_string()),
    }

    match &meta {
        Ok(meta) => {
            let tests = mpi_tests_from_metadata(meta);
            if tests.is_empty() {
                p.skipped_failure("multi-rank tests", "no test target requires feature `mpi`");
            }
            for t in &tests {
                let name = format!("{}::{}", t.package, t.target);
                if !mpi_ok {
                    p.skipped_failure(&format!("multi-rank {name}"), "Open MPI is missing");
                    continue;
                }
                let mut exe = None;
                let built = p.step(&format!("build multi-rank test {name}"), || {
                    exe = Some(build_test_binary(t, &mpi_features)?);
                    Ok(())
                });
                match exe {
                    Some(exe) if built => {
                        for ranks in MPI_RANKS {
                            p.step(&format!("mpirun -np {ranks} {name}"), || {
                                run_under_mpirun(&exe, &name, ranks)
                            });
                        }
                    }
                    _ => p.skipped_failure(&format!("multi-rank {name}"), "build failed"),
                }
            }
        }
        Err(e) => p.skipped_failure("multi-rank tests", &format!("cargo metadata: {e}")),
    }

    if mpi_ok && !mpi_features.is_empty() {
        train_steps(&mut p, &mpi_features);
    } else {
        p.skipped_failure(
            "train under mpirun",
            "Open MPI or the `mpi` features are missing",
        );
    }

    p.finish("xtask test")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_mpi_tests_in_metadata() {
        let meta: Value = serde_json::json!({
            "packages": [
                { "name": "dist", "features": { "mpi": ["dep:mpi"] }, "targets": [
                    { "name": "dist", "kind": ["lib"], "required-features": [] },
                    { "name": "mpi_allreduce", "kind": ["test"], "required-features": ["mpi"] },
                    { "name": "plain", "kind": ["test"] }
                ]},
                { "name": "nn", "features": {}, "targets": [
                    { "name": "nn", "kind": ["lib"] }
                ]}
            ]
        });
        assert_eq!(
            mpi_tests_from_metadata(&meta),
            vec![MpiTest {
                package: "dist".into(),
                target: "mpi_allreduce".into()
            }]
        );
        assert_eq!(mpi_packages(&meta), vec!["dist".to_string()]);
    }

    #[test]
    fn finds_executable_in_messages() {
        let msgs = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"dist","kind":["lib"]},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"mpi_allreduce","kind":["test"]},"executable":"/t/deps/mpi_allreduce-1"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(
            executable_from_messages(msgs, "mpi_allreduce", "test"),
            Some(PathBuf::from("/t/deps/mpi_allreduce-1"))
        );
        assert_eq!(executable_from_messages(msgs, "other", "test"), None);
        assert_eq!(executable_from_messages(msgs, "mpi_allreduce", "bin"), None);
    }

    #[test]
    fn finds_test_executables_of_the_given_packages() {
        let meta: Value = serde_json::json!({
            "packages": [
                { "name": "core-blas", "manifest_path": "/w/crates/core-blas/Cargo.toml" },
                { "name": "nn", "manifest_path": "/w/crates/nn/Cargo.toml" }
            ]
        });
        let msgs = concat!(
            r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/core-blas/Cargo.toml","target":{"name":"core_blas","kind":["lib"]},"profile":{"test":false},"executable":null}"#,
            "\n",
            r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/core-blas/Cargo.toml","target":{"name":"core_blas","kind":["lib"]},"profile":{"test":true},"executable":"/t/deps/core_blas-1"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/core-blas/Cargo.toml","target":{"name":"gemm","kind":["test"]},"profile":{"test":true},"executable":"/t/deps/gemm-2"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/core-blas/Cargo.toml","target":{"name":"peak","kind":["example"]},"profile":{"test":false},"executable":"/t/examples/peak-3"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","manifest_path":"/w/crates/nn/Cargo.toml","target":{"name":"nn","kind":["lib"]},"profile":{"test":true},"executable":"/t/deps/nn-4"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        let exes = test_executables(msgs, &meta, &["core-blas"]);
        let dir = PathBuf::from("/w/crates/core-blas");
        assert_eq!(
            exes,
            vec![
                TestExe {
                    package: "core-blas".into(),
                    target: "core_blas".into(),
                    exe: "/t/deps/core_blas-1".into(),
                    dir: dir.clone(),
                },
                TestExe {
                    package: "core-blas".into(),
                    target: "gemm".into(),
                    exe: "/t/deps/gemm-2".into(),
                    dir,
                },
            ]
        );
        assert!(test_executables(msgs, &meta, &["fastconv"]).is_empty());
    }

    #[test]
    fn reads_train_loss_from_the_last_line() {
        let out = "epoch 1/1 ...\n{\"train_loss\":2.5,\"steps\":4}\n\n";
        assert_eq!(train_loss_from_json(out).unwrap(), 2.5);
        assert!(train_loss_from_json("{\"steps\":4}").is_err());
        assert!(train_loss_from_json("loss 2.5").is_err());
        assert_eq!(rel_diff(2.0, 2.0), 0.0);
        assert!((rel_diff(2.0 + 2e-5, 2.0) - 1e-5).abs() < 1e-12);
    }

    #[test]
    fn scalar_is_always_in_the_matrix() {
        assert_eq!(host_isas()[0], "scalar");
    }
}
