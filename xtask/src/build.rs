//! `cargo xtask build --arch NAME|all`: release builds for the x86-64 micro-architecture levels
//! (baseline, v3 = AVX2/FMA, v4 = AVX-512) and for every other installed rustup target.
//!
//! Each build has its own target directory (`<target>/arch-<name>`) so they do not evict each
//! other or the main build. `-C target-cpu` is set per build through `RUSTFLAGS`, never globally,
//! and always with an explicit `--target`, so it reaches only the artifacts and not the build
//! scripts that run on the host. Building a level does not require the host to run it.

use std::process::Command;
use std::time::Instant;

use crate::error::{Result, XtaskError};
use crate::util::{
    cargo, fmt_duration, host_triple, run, run_capture, section, target_dir, which, with_rustflags,
};

/// The x86-64 micro-architecture levels built on an x86-64 host, as `-C target-cpu` values.
pub const X86_LEVELS: [&str; 3] = ["x86-64", "x86-64-v3", "x86-64-v4"];

/// Cross targets worth building when installed; listed as skipped when they are not.
pub const KNOWN_CROSS_TARGETS: [&str; 2] =
    ["aarch64-unknown-linux-gnu", "x86_64-unknown-linux-musl"];

/// Builds to run, and builds skipped with the reason.
type Plan = (Vec<Arch>, Vec<(String, String)>);

/// One build to try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arch {
    /// A host build with `-C target-cpu=<level>`.
    Level(String),
    /// A build for another rustup target triple.
    Target(String),
}

impl Arch {
    fn name(&self) -> &str {
        match self {
            Arch::Level(s) | Arch::Target(s) => s,
        }
    }
}

/// Outcome of one build.
enum Outcome {
    Built(std::time::Duration),
    Skipped(String),
    Failed(String),
}

fn installed_targets() -> Vec<String> {
    run_capture(Command::new("rustup").args(["target", "list", "--installed"]))
        .map(|s| {
            s.lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The environment variable cargo reads a target's linker from.
pub fn linker_env(triple: &str) -> String {
    format!(
        "CARGO_TARGET_{}_LINKER",
        triple.to_uppercase().replace(['-', '.'], "_")
    )
}

/// Why a cross target cannot be linked here, or `None` when it can.
fn missing_linker(triple: &str, host: &str) -> Option<String> {
    let env = linker_env(triple);
    if std::env::var_os(&env).is_some() {
        return None;
    }
    let arch = triple.split('-').next().unwrap_or_default();
    let host_arch = host.split('-').next().unwrap_or_default();
    // Same architecture and OS family (e.g. musl on a glibc host): the host `cc` links it.
    if arch == host_arch && triple.contains("linux") && host.contains("linux") {
        return None;
    }
    // Debian's cross compilers: aarch64-linux-gnu-gcc and friends.
    let gcc = format!("{arch}-linux-gnu-gcc");
    if triple.contains("linux-gnu") && which(&gcc).is_some() {
        return None;
    }
    Some(format!(
        "no linker: set {env} or install a cross gcc (Debian: gcc-{}-linux-gnu)",
        arch.replace('_', "-")
    ))
}

fn build_one(arch: &Arch, host: &str) -> Outcome {
    let dir = target_dir().join(format!("arch-{}", arch.name()));
    let mut cmd = cargo();
    cmd.args(["build", "--release", "--workspace", "--exclude", "xtask"]);
    cmd.env("CARGO_TARGET_DIR", &dir);
    match arch {
        Arch::Level(level) => {
            if !host.starts_with("x86_64-") {
                return Outcome::Skipped(format!("host {host} is not x86-64"));
            }
            with_rustflags(&mut cmd, &format!("-C target-cpu={level}"));
            // An explicit `--target` keeps RUSTFLAGS away from build scripts and proc macros,
            // which run on this host: a v4 build script would die with SIGILL on a CPU without
            // AVX-512 (as this project's own machine is).
            cmd.args(["--target", host]);
        }
        Arch::Target(triple) => {
            if let Some(why) = missing_linker(triple, host) {
                return Outcome::Skipped(why);
            }
            let arch = triple.split('-').next().unwrap_or_default();
            let env = linker_env(triple);
            let cross = !host.starts_with(&format!("{arch}-"));
            let gcc = which(&format!("{arch}-linux-gnu-gcc")).filter(|_| cross);
            if let Some(gcc) = gcc.filter(|_| std::env::var_os(&env).is_none()) {
                cmd.env(env, gcc);
            }
            cmd.args(["--target", triple]);
        }
    }
    let t = Instant::now();
    match run(&mut cmd) {
        Ok(()) => Outcome::Built(t.elapsed()),
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// The builds `--arch name` asks for.
fn plan(name: &str, host: &str) -> Result<Plan> {
    let installed = installed_targets();
    let mut all = Vec::new();
    let mut skipped = Vec::new();
    for level in X86_LEVELS {
        all.push(Arch::Level(level.to_string()));
    }
    for t in &installed {
        if t != host {
            all.push(Arch::Target(t.clone()));
        }
    }
    for t in KNOWN_CROSS_TARGETS {
        if t != host && !installed.iter().any(|i| i == t) {
            skipped.push((
                t.to_string(),
                format!("rustup target not installed (rustup target add {t})"),
            ));
        }
    }
    if name == "all" {
        return Ok((all, skipped));
    }
    if let Some(a) = all.iter().find(|a| a.name() == name) {
        return Ok((vec![a.clone()], Vec::new()));
    }
    if name.contains('-') && name.split('-').count() >= 3 && !name.starts_with("x86-64") {
        return Ok((
            Vec::new(),
            vec![(
                name.to_string(),
                format!("rustup target not installed (rustup target add {name})"),
            )],
        ));
    }
    Err(XtaskError::Other(format!(
        "unknown --arch `{name}`: use all, {}, or an installed target triple",
        X86_LEVELS.join(", ")
    )))
}

/// Runs the builds and prints what was built and what was skipped, and why.
pub fn build(name: &str) -> Result<()> {
    let host = host_triple()?;
    let (archs, mut skipped) = plan(name, &host)?;
    let mut built = Vec::new();
    let mut failed = Vec::new();
    for a in &archs {
        section(&format!("build --arch {}", a.name()));
        match build_one(a, &host) {
            Outcome::Built(d) => built.push((a.name().to_string(), d)),
            Outcome::Skipped(why) => {
                println!("skipped: {why}");
                skipped.push((a.name().to_string(), why));
            }
            Outcome::Failed(why) => failed.push((a.name().to_string(), why)),
        }
    }
    section("build summary");
    for (n, d) in &built {
        println!("built    {n:<28} {}", fmt_duration(*d));
    }
    for (n, why) in &skipped {
        println!("skipped  {n:<28} {why}");
    }
    for (n, why) in &failed {
        println!("FAILED   {n:<28} {why}");
    }
    println!(
        "xtask build: {} built, {} skipped, {} failed",
        built.len(),
        skipped.len(),
        failed.len()
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(XtaskError::Other(format!(
            "{} build(s) failed",
            failed.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linker_env_name() {
        assert_eq!(
            linker_env("aarch64-unknown-linux-gnu"),
            "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER"
        );
    }

    #[test]
    fn same_arch_linux_needs_no_cross_linker() {
        assert!(missing_linker("x86_64-unknown-linux-musl", "x86_64-unknown-linux-gnu").is_none());
    }
}
