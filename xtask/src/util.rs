//! Shared plumbing: the workspace root, the target directory, running commands, section headers.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Result, XtaskError};

/// The workspace root: the parent of this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest.to_path_buf())
}

/// The cargo target directory of the main build: `$CARGO_TARGET_DIR` if set (relative paths are
/// taken from the workspace root), else `<root>/target`.
pub fn target_dir() -> PathBuf {
    let root = workspace_root();
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

/// The `cargo` that runs us (cargo sets `$CARGO` for `cargo run`), else `cargo` from `PATH`.
pub fn cargo() -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(program);
    cmd.current_dir(workspace_root());
    cmd
}

/// A printable form of a command: program and arguments, with the environment it sets.
pub fn describe(cmd: &Command) -> String {
    let mut s = String::new();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            s.push_str(&format!("{}={} ", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    s.push_str(&cmd.get_program().to_string_lossy());
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs a command with inherited stdio and fails unless it exits with status 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    println!("$ {}", describe(cmd));
    let status = cmd.status().map_err(|e| XtaskError::Spawn {
        command: describe(cmd),
        source: e,
    })?;
    check_status(cmd, status)
}

/// Runs a command, capturing stdout (stderr is inherited), and fails unless it exits with 0.
pub fn run_capture(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stdout(Stdio::piped())
        .output()
        .map_err(|e| XtaskError::Spawn {
            command: describe(cmd),
            source: e,
        })?;
    check_status(cmd, out.status)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn check_status(cmd: &Command, status: ExitStatus) -> Result<()> {
    if status.success() {
        Ok(())
    } else {
        Err(XtaskError::CommandFailed {
            command: describe(cmd),
            status: status.to_string(),
        })
    }
}

/// `true` when `program` is found in `PATH` (or is a path to an existing file).
pub fn which(program: &str) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|cand| cand.is_file())
}

/// `true` when this process runs as root (uid 0), asked of `id -u`.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The host's target triple, from `rustc -vV`.
pub fn host_triple() -> Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = run_capture(Command::new(rustc).arg("-vV"))?;
    out.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|s| s.trim().to_string())
        .ok_or_else(|| XtaskError::Other("`rustc -vV` printed no host line".into()))
}

/// Prints a section header.
pub fn section(title: &str) {
    println!();
    println!("==================== {title} ====================");
}

/// Formats a duration as `1m02s` or `3.4s`.
pub fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 60.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s as u64) % 60)
    } else {
        format!("{s:.1}s")
    }
}

/// One step of a pipeline and its outcome, for the final summary.
pub struct StepResult {
    /// What ran.
    pub name: String,
    /// `None` when it passed, otherwise why not.
    pub error: Option<String>,
    /// Wall time.
    pub elapsed: Duration,
}

/// Runs named steps one after another, continuing past failures, and prints a summary.
#[derive(Default)]
pub struct Pipeline {
    steps: Vec<StepResult>,
    start: Option<Instant>,
}

impl Pipeline {
    /// Runs `f` as the step `name` under a section header and records its outcome.
    pub fn step(&mut self, name: &str, f: impl FnOnce() -> Result<()>) -> bool {
        self.start.get_or_insert_with(Instant::now);
        section(name);
        let t = Instant::now();
        let r = f();
        let elapsed = t.elapsed();
        let ok = r.is_ok();
        match &r {
            Ok(()) => println!("--> {name}: ok ({})", fmt_duration(elapsed)),
            Err(e) => println!("--> {name}: FAILED ({}): {e}", fmt_duration(elapsed)),
        }
        self.steps.push(StepResult {
            name: name.to_string(),
            error: r.err().map(|e| e.to_string()),
            elapsed,
        });
        ok
    }

    /// Records a step that was not run, with the reason, as a failure.
    pub fn skipped_failure(&mut self, name: &str, reason: &str) {
        section(name);
        println!("--> {name}: NOT RUN: {reason}");
        self.steps.push(StepResult {
            name: name.to_string(),
            error: Some(format!("not run: {reason}")),
            elapsed: Duration::ZERO,
        });
    }

    /// Prints the summary table and the final line; `Err` when any step failed.
    pub fn finish(self, what: &str) -> Result<()> {
        let total = self.start.map(|t| t.elapsed()).unwrap_or_default();
        section(&format!("{what} summary"));
        for s in &self.steps {
            let status = if s.error.is_none() { "ok  " } else { "FAIL" };
            println!("{status} {:>8}  {}", fmt_duration(s.elapsed), s.name);
            if let Some(e) = &s.error {
                println!("              {e}");
            }
        }
        let failed = self.steps.iter().filter(|s| s.error.is_some()).count();
        if failed == 0 {
            println!(
                "{what}: PASSED ({} steps, {})",
                self.steps.len(),
                fmt_duration(total)
            );
            Ok(())
        } else {
            println!(
                "{what}: FAILED ({failed} of {} steps failed, {})",
                self.steps.len(),
                fmt_duration(total)
            );
            Err(XtaskError::StepsFailed {
                what: what.to_string(),
                failed,
            })
        }
    }
}

/// Sets `RUSTFLAGS` to the current value plus `extra`.
pub fn with_rustflags(cmd: &mut Command, extra: &str) {
    let current = std::env::var("RUSTFLAGS").unwrap_or_default();
    let flags = if current.trim().is_empty() {
        extra.to_string()
    } else {
        format!("{} {extra}", current.trim())
    };
    cmd.env("RUSTFLAGS", flags);
}
