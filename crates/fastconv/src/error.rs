//! The one error type of `fastconv`.

use thiserror::Error;

/// Everything that can go wrong in `fastconv`: each variant names the offending argument.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FastconvError {
    /// An argument that must be positive is zero (`m`, `r`, a tile size, a dimension...).
    #[error("`{arg}` must be at least 1, got 0")]
    Zero {
        /// The offending argument.
        arg: &'static str,
    },
    /// A list of interpolation points has the wrong length for F(m, r).
    #[error("F({m}, {r}) needs alpha = m + r - 1 = {expected} interpolation points, got {got}")]
    PointCount {
        /// Output tile size.
        m: usize,
        /// Kernel size.
        r: usize,
        /// alpha = m + r - 1.
        expected: usize,
        /// Points given.
        got: usize,
    },
    /// Two interpolation points coincide (the CRT moduli would not be coprime).
    #[error("interpolation point {point} appears more than once in `points`")]
    DuplicatePoint {
        /// The repeated point, printed as a rational or `inf`.
        point: String,
    },
    /// A rational point has a zero denominator.
    #[error("interpolation point {num}/{den} has a zero denominator")]
    ZeroDenominator {
        /// Numerator given.
        num: i64,
        /// Denominator given.
        den: i64,
    },
    /// A synthesized transform failed its exact check (a bug, never expected).
    #[error("F({m}, {r}) transform failed its exact self-check: {detail}")]
    Verification {
        /// Output tile size.
        m: usize,
        /// Kernel size.
        r: usize,
        /// Which identity failed.
        detail: String,
    },
    /// A per-dimension argument has the wrong number of entries, or dimensions disagree.
    #[error("`{arg}` has {got} entries, expected {expected}")]
    Rank {
        /// The offending argument.
        arg: &'static str,
        /// Entries given.
        got: usize,
        /// Entries expected.
        expected: usize,
    },
    /// A buffer does not have the length its shape requires.
    #[error("buffer `{arg}` has {got} elements, its shape needs {expected}")]
    BufferLength {
        /// The offending buffer.
        arg: &'static str,
        /// Elements given.
        got: usize,
        /// Elements required.
        expected: usize,
    },
    /// A shape does not match what another argument implies (mode size vs matrix columns...).
    #[error("shape of `{arg}` does not match: {detail}")]
    Shape {
        /// The offending argument.
        arg: &'static str,
        /// What was expected and what was given.
        detail: String,
    },
    /// No synthesized point set is tabulated for this F(m, r) (see `points::tabulated`).
    #[error("no tabulated interpolation points for F({m}, {r}); pass points explicitly")]
    NoPointSet {
        /// Output tile size.
        m: usize,
        /// Kernel size.
        r: usize,
    },
    /// The request is valid but outside what Winograd supports (stride > 1, dilation, groups):
    /// callers fall back to `conv-ops`.
    #[error("unsupported by Winograd: `{arg}` {detail}")]
    Unsupported {
        /// The offending argument (`stride`, `dilation`, ...).
        arg: &'static str,
        /// Why.
        detail: String,
    },
    /// The transformed-domain GEMM failed (an internal shape bug, never expected).
    #[error("core-blas: {0}")]
    Gemm(#[from] core_blas::Error),
    /// A geometry could not be built or checked by `conv-ops`.
    #[error("geometry: {0}")]
    Geometry(#[from] conv_ops::ConvError),
}

/// Result alias of `fastconv`.
pub type Result<T> = std::result::Result<T, FastconvError>;
