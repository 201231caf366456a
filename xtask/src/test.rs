//! `cargo xtask test`: formatting, lints, the whole test suite, the ISA matrix of `core-blas`,
//! and the multi-rank MPI tests under `mpirun -np 1, 2, 4`.

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

/// `cargo metadata --no-deps` of the workspace.
pub fn metadata() -> Result<Value> {
    let out = run_capture(cargo().args(["metadata", "--format-version", "1", "--no-deps"]))?;
    serde_json::from_str(&out).map_err(|source| XtaskError::Json {
        path: "cargo metadata".into(),
        source,
    })
}

/// Builds the test target with `features` on the whole workspace (see [`test`]) and returns its
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
    executable_from_messages(&out, &test.target).ok_or_else(|| {
        XtaskError::Other(format!(
            "cargo built no executable for test `{}` of `{}`",
            test.target, test.package
        ))
    })
}

/// The executable of test target `target` in cargo's `--message-format=json` output.
pub fn executable_from_messages(messages: &str, target: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == target)
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

/// Runs `exe` under `mpirun -np ranks` and checks that every rank printed its PASS line.
fn run_under_mpirun(exe: &PathBuf, name: &str, ranks: usize) -> Result<()> {
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

    // The MPI features of every package that has one, enabled together on the whole workspace:
    // dependencies keep the feature set of the plain workspace build, so only the MPI crates and
    // their dependents are rebuilt.
    let meta = metadata();
    let mpi_features = meta
        .as_ref()
        .map(|m| {
            mpi_packages(m)
                .iter()
                .map(|p| format!("{p}/{MPI_FEATURE}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
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

    match isa_matrix() {
        Ok(isas) => {
            println!("ISA matrix for core-blas: {isas:?}");
            for isa in isas {
                p.step(
                    &format!("cargo test -p core-blas, CORE_BLAS_ISA={isa}"),
                    || {
                        run(cargo()
                            .args(["test", "-p", "core-blas"])
                            .env("CORE_BLAS_ISA", &isa))
                    },
                );
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
            executable_from_messages(msgs, "mpi_allreduce"),
            Some(PathBuf::from("/t/deps/mpi_allreduce-1"))
        );
        assert_eq!(executable_from_messages(msgs, "other"), None);
    }

    #[test]
    fn scalar_is_always_in_the_matrix() {
        assert_eq!(host_isas()[0], "scalar");
    }
}
