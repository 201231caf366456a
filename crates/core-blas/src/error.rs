//! The crate's single error type.

use thiserror::Error;

/// Everything a `core-blas` entry point can reject. Each variant names the offending argument.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    /// A slice is shorter than the matrix it is supposed to hold.
    #[error("slice `{arg}` has {len} elements, the matrix needs at least {needed}")]
    SliceTooShort {
        /// The argument (`a`, `b`, `c`, ...).
        arg: &'static str,
        /// Its length.
        len: usize,
        /// The minimum length the shape and strides require.
        needed: usize,
    },
    /// A leading dimension is smaller than the row length it must skip.
    #[error("leading dimension `{arg}` = {value} is smaller than the minimum {min}")]
    LeadingDimension {
        /// The argument (`lda`, `ldb`, `ldc`).
        arg: &'static str,
        /// The value given.
        value: usize,
        /// The smallest valid value.
        min: usize,
    },
    /// Operand shapes do not agree (inner dimensions, output shape, batch sizes).
    #[error("shape mismatch on `{arg}`: expected {expected}, got {got}")]
    ShapeMismatch {
        /// The argument whose shape is wrong.
        arg: &'static str,
        /// What the other operands imply.
        expected: String,
        /// What was given.
        got: String,
    },
    /// Strides of a mutable view map two elements to one address, or an index computation overflows.
    #[error("invalid strides on `{arg}`: {reason}")]
    Stride {
        /// The view argument.
        arg: &'static str,
        /// Why the strides were rejected.
        reason: String,
    },
    /// A block size (MC, KC, NC) is invalid.
    #[error("invalid block size `{arg}` = {value}: {reason}")]
    BlockSize {
        /// `mc`, `kc` or `nc`.
        arg: &'static str,
        /// The value given.
        value: usize,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// An ISA name (from `CORE_BLAS_ISA` or [`crate::Isa::from_name`]) is not one we know.
    #[error("unknown ISA `{name}` (expected one of scalar, avx2, avx512, neon)")]
    UnknownIsa {
        /// The name given.
        name: String,
    },
    /// The requested kernel family cannot run on this CPU (or is not built for this target).
    #[error("kernel family `{requested}` is not available on this CPU (available: {available})")]
    IsaUnavailable {
        /// The family asked for.
        requested: &'static str,
        /// The families this host supports.
        available: String,
    },
    /// The calling thread's CPU affinity cannot be read ([`crate::bind_workers`]).
    #[error("CPU affinity unavailable: {reason}")]
    Affinity {
        /// Why.
        reason: &'static str,
    },
    /// An environment variable holds a value that cannot be parsed.
    #[error("environment variable `{var}` = `{value}` is invalid: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
}
