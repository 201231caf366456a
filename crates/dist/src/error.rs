//! The crate's single error type.

use thiserror::Error;

/// Every fallible operation of `dist` returns this error. Variants name the offending argument.
#[derive(Debug, Error)]
pub enum DistError {
    /// A rank argument (for example the root of a broadcast) is not a rank of the communicator.
    #[error("argument `{arg}` = {rank} is not a rank of a communicator of size {size}")]
    RankOutOfRange {
        /// Name of the offending argument.
        arg: &'static str,
        /// The rank that was passed.
        rank: usize,
        /// Size of the communicator.
        size: usize,
    },
    /// A buffer is longer than one MPI call can address (MPI counts are C `int`).
    #[error("argument `{arg}` has {len} elements, more than the MPI count limit {max}")]
    CountTooLarge {
        /// Name of the offending argument.
        arg: &'static str,
        /// Number of elements passed.
        len: usize,
        /// Largest count one call accepts.
        max: usize,
    },
    /// A split colour or key does not fit MPI's non-negative C `int`.
    #[error("argument `{arg}` = {value} does not fit a non-negative MPI int")]
    ValueOutOfRange {
        /// Name of the offending argument.
        arg: &'static str,
        /// The value that was passed.
        value: u64,
    },
    /// MPI was already initialised in this process: [`crate::Runtime::init`] may be called once.
    #[error(
        "MPI is already initialised in this process; call Runtime::init once and keep the handle"
    )]
    AlreadyInitialized,
    /// A layer, the loss or the optimizer of the replica failed.
    #[error("training: {0}")]
    Nn(#[from] nn::NnError),
    /// A distributed layer's communicator is not registered with the running thread
    /// ([`crate::register`]).
    #[error("communicator handle: {0}")]
    CommHandle(String),
    /// Arguments of a data-parallel step disagree.
    #[error("data-parallel step: {0}")]
    Training(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = DistError> = std::result::Result<T, E>;
