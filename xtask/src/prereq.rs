//! Prerequisites: rustup components (rustfmt, clippy) and Open MPI for the multi-rank tests.

use std::path::Path;
use std::process::Command;

use crate::error::{Result, XtaskError};
use crate::util::{is_root, run, run_capture, which};

/// Debian packages the MPI feature needs: the launcher and headers, and libclang for bindgen.
pub const MPI_PACKAGES: [&str; 3] = ["openmpi-bin", "libopenmpi-dev", "libclang-dev"];

/// Makes sure `rustfmt` and `clippy` are installed as rustup components, adding them if not.
pub fn ensure_rust_components() -> Result<()> {
    let wanted = ["rustfmt", "clippy"];
    if which("rustup").is_none() {
        // Without rustup the toolchain came from elsewhere: accept it if the tools answer.
        for (tool, args) in [
            ("cargo", ["fmt", "--version"]),
            ("cargo", ["clippy", "--version"]),
        ] {
            run_capture(Command::new(tool).args(args)).map_err(|_| {
                XtaskError::Missing(format!(
                    "`{tool} {}` does not work and rustup is not installed; install rustup \
                     (https://rustup.rs) and run `rustup component add rustfmt clippy`",
                    args[0]
                ))
            })?;
        }
        return Ok(());
    }
    let installed = run_capture(Command::new("rustup").args(["component", "list", "--installed"]))?;
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|c| !installed.lines().any(|l| l.starts_with(&format!("{c}-"))))
        .collect();
    if missing.is_empty() {
        println!("rustup components rustfmt and clippy: installed");
        return Ok(());
    }
    println!(
        "rustup components missing: {}; installing them",
        missing.join(", ")
    );
    run(Command::new("rustup")
        .args(["component", "add"])
        .args(&missing))
}

/// Where libclang is, if bindgen can find it: `$LIBCLANG_PATH` or the usual Debian locations.
fn libclang_present() -> bool {
    if std::env::var_os("LIBCLANG_PATH").is_some_and(|p| Path::new(&p).exists()) {
        return true;
    }
    let dirs = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
        "/usr/lib64",
    ];
    let mut candidates: Vec<std::path::PathBuf> = dirs.iter().map(Into::into).collect();
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("llvm-") {
                candidates.push(e.path().join("lib"));
            }
        }
    }
    candidates.iter().any(|dir| {
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("libclang"))
            })
            .unwrap_or(false)
    })
}

/// What of Open MPI and libclang is missing, by name.
pub fn missing_mpi_tools() -> Vec<&'static str> {
    let mut missing = Vec::new();
    if which("mpirun").is_none() {
        missing.push("mpirun");
    }
    if which("mpicc").is_none() {
        missing.push("mpicc");
    }
    if !libclang_present() {
        missing.push("libclang");
    }
    missing
}

/// Makes sure `mpirun`, `mpicc` and libclang exist. As root with `apt-get`, installs
/// [`MPI_PACKAGES`]; otherwise fails with a message naming exactly what to install.
pub fn ensure_mpi() -> Result<()> {
    let missing = missing_mpi_tools();
    if missing.is_empty() {
        let v = run_capture(Command::new("mpirun").arg("--version")).unwrap_or_default();
        println!(
            "MPI: {} (mpirun, mpicc, libclang present)",
            v.lines().next().unwrap_or("unknown version")
        );
        return Ok(());
    }
    let packages = MPI_PACKAGES.join(" ");
    if !(is_root() && which("apt-get").is_some()) {
        return Err(XtaskError::Missing(format!(
            "{} not found; install them, e.g. `sudo apt-get install {packages}` on Debian/Ubuntu \
             (Open MPI's launcher and headers, and libclang for rsmpi's bindgen)",
            missing.join(", ")
        )));
    }
    println!(
        "{} not found; installing {packages} with apt-get",
        missing.join(", ")
    );
    run(Command::new("apt-get")
        .arg("update")
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(MPI_PACKAGES)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    let still = missing_mpi_tools();
    if !still.is_empty() {
        return Err(XtaskError::Missing(format!(
            "{} still missing after installing {packages}",
            still.join(", ")
        )));
    }
    Ok(())
}
