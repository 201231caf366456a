//! The one error type of `conv-ops`.

use thiserror::Error;

/// Everything that can go wrong in `conv-ops`: each variant names the offending argument.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConvError {
    /// The number of spatial dimensions is not 1, 2 or 3.
    #[error("spatial rank {rank} is not supported (1, 2 or 3 spatial dimensions)")]
    Rank {
        /// The rank that was given.
        rank: usize,
    },
    /// A per-dimension argument has the wrong number of entries.
    #[error("`{field}` has {got} entries but the geometry has {expected} spatial dimensions")]
    FieldRank {
        /// The argument (`kernel`, `stride`, ...).
        field: &'static str,
        /// Entries given.
        got: usize,
        /// Entries expected (the spatial rank).
        expected: usize,
    },
    /// A size, stride or dilation that must be positive is zero.
    #[error("`{field}` must be positive, got 0 (dimension {dim})")]
    Zero {
        /// The argument that is zero.
        field: &'static str,
        /// Which dimension (0 for scalar fields).
        dim: usize,
    },
    /// Channels are not divisible by the number of groups.
    #[error("{field} = {channels} is not divisible by groups = {groups}")]
    Groups {
        /// `in_channels` or `out_channels`.
        field: &'static str,
        /// The channel count.
        channels: usize,
        /// The group count.
        groups: usize,
    },
    /// The dilated kernel does not fit in the padded input.
    #[error(
        "dimension {dim}: dilated kernel extent {extent} exceeds padded input {padded} \
         (input {input} + padding)"
    )]
    KernelTooLarge {
        /// Spatial dimension index.
        dim: usize,
        /// `dilation * (kernel - 1) + 1`.
        extent: usize,
        /// Input plus padding on both sides.
        padded: usize,
        /// Input size.
        input: usize,
    },
    /// A buffer does not have the length the geometry requires.
    #[error("buffer `{name}` has {got} elements, the geometry needs {expected}")]
    BufferLength {
        /// Which buffer (`x`, `w`, `y`, `dx`, ...).
        name: &'static str,
        /// Elements given.
        got: usize,
        /// Elements needed.
        expected: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("the size of `{field}` overflows")]
    Overflow {
        /// The quantity that overflowed.
        field: &'static str,
    },
    /// An algorithm does not support this geometry.
    #[error("algorithm `{algo}` does not support this geometry: {reason}")]
    Unsupported {
        /// The algorithm.
        algo: &'static str,
        /// Why not.
        reason: String,
    },
    /// The GEMM underneath reported an error (a bug in `conv-ops` if it happens: shapes are
    /// validated here first).
    #[error("GEMM failed: {0}")]
    Gemm(String),
}

/// Result alias of `conv-ops`.
pub type Result<T> = std::result::Result<T, ConvError>;

/// Wraps an error of the GEMM underneath.
pub(crate) fn gemm_err(e: core_blas::Error) -> ConvError {
    ConvError::Gemm(e.to_string())
}
