//! The error type of xtask.

use thiserror::Error;

/// Everything that can make an xtask command fail.
#[derive(Debug, Error)]
pub enum XtaskError {
    /// A program could not be started.
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it could not start.
        source: std::io::Error,
    },
    /// A program exited with a non-zero status.
    #[error("`{command}` failed: {status}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A JSON document could not be parsed.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// Where it came from.
        path: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A tool the command needs is missing and cannot be installed here.
    #[error("missing prerequisite: {0}")]
    Missing(String),
    /// Benchmarks got slower than the threshold allows.
    #[error("{count} benchmark metric(s) regressed by more than {threshold}%")]
    Regression {
        /// How many metrics regressed.
        count: usize,
        /// The threshold in percent.
        threshold: f64,
    },
    /// Some steps of a pipeline failed (the summary printed which).
    #[error("{what}: {failed} step(s) failed")]
    StepsFailed {
        /// The pipeline.
        what: String,
        /// How many steps failed.
        failed: usize,
    },
    /// Anything else, described.
    #[error("{0}")]
    Other(String),
}

/// Shorthand for results of xtask.
pub type Result<T, E = XtaskError> = std::result::Result<T, E>;

/// Wraps an I/O error with the path it concerns.
pub fn io_err(path: impl AsRef<std::path::Path>) -> impl FnOnce(std::io::Error) -> XtaskError {
    let path = path.as_ref().display().to_string();
    move |source| XtaskError::Io { path, source }
}
