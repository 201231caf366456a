//! [`ConvGeometry`]: the one description of a convolution that every algorithm shares.
//!
//! Layouts are PyTorch's (row-major): input `x` is N×C×(D×)H×W, weights `w` are
//! K×(C/G)×(T×)R×S, output `y` is N×K×(Do×)Ho×Wo. A geometry has 1, 2 or 3 spatial
//! dimensions; per-dimension quantities are stored right-aligned in arrays of [`MAX_RANK`] entries
//! whose unused leading entries are neutral (size 1, stride 1, dilation 1, padding 0), so kernels
//! can always loop over three dimensions and the contiguous (innermost) one is always index 2.

use crate::error::{ConvError, Result};

/// The largest number of spatial dimensions supported.
pub const MAX_RANK: usize = 3;

/// Shape, stride, padding, dilation and grouping of a convolution, validated.
///
/// Built with [`ConvGeometry::new`] and refined with the `with_*` methods, each of which
/// re-validates the whole geometry and returns an error naming the offending field.
///
/// ```
/// use conv_ops::ConvGeometry;
/// // ResNet-50's first 3×3 stage at batch 8.
/// let g = ConvGeometry::new(8, 64, 64, &[56, 56], &[3, 3])?.with_padding(&[1])?;
/// assert_eq!(g.output(), &[56, 56]);
/// assert_eq!(g.flops(), 2 * 8 * 64 * 56 * 56 * 64 * 9);
/// # Ok::<(), conv_ops::ConvError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvGeometry {
    batch: usize,
    in_channels: usize,
    out_channels: usize,
    groups: usize,
    rank: usize,
    input: [usize; MAX_RANK],
    kernel: [usize; MAX_RANK],
    stride: [usize; MAX_RANK],
    dilation: [usize; MAX_RANK],
    pad_before: [usize; MAX_RANK],
    pad_after: [usize; MAX_RANK],
    output: [usize; MAX_RANK],
}

/// Copies a per-dimension argument into a full array; one entry is broadcast to every dimension.
fn per_dim(
    field: &'static str,
    values: &[usize],
    rank: usize,
    neutral: usize,
) -> Result<[usize; MAX_RANK]> {
    let mut out = [neutral; MAX_RANK];
    let lead = MAX_RANK - rank;
    match values.len() {
        1 => out[lead..].fill(values[0]),
        n if n == rank => out[lead..].copy_from_slice(values),
        n => {
            return Err(ConvError::FieldRank {
                field,
                got: n,
                expected: rank,
            });
        }
    }
    Ok(out)
}

impl ConvGeometry {
    /// A stride-1, unpadded, undilated, ungrouped convolution of `batch` inputs with
    /// `in_channels` channels and spatial size `input` (1 to 3 entries) by `out_channels` kernels
    /// of spatial size `kernel` (one entry per spatial dimension, or one entry for all).
    pub fn new(
        batch: usize,
        in_channels: usize,
        out_channels: usize,
        input: &[usize],
        kernel: &[usize],
    ) -> Result<Self> {
        let rank = input.len();
        if !(1..=MAX_RANK).contains(&rank) {
            return Err(ConvError::Rank { rank });
        }
        let g = ConvGeometry {
            batch,
            in_channels,
            out_channels,
            groups: 1,
            rank,
            input: per_dim("input", input, rank, 1)?,
            kernel: per_dim("kernel", kernel, rank, 1)?,
            stride: [1; MAX_RANK],
            dilation: [1; MAX_RANK],
            pad_before: [0; MAX_RANK],
            pad_after: [0; MAX_RANK],
            output: [1; MAX_RANK],
        };
        g.validated()
    }

    /// Every field at once, validated once. The builder methods validate after each step, which
    /// rejects a kernel that fits only once the padding is added; this does not.
    pub fn from_parts(
        batch: usize,
        in_channels: usize,
        out_channels: usize,
        input: &[usize],
        kernel: &[usize],
        stride: &[usize],
        dilation: &[usize],
        pad_before: &[usize],
        pad_after: &[usize],
        groups: usize,
    ) -> Result<Self> {
        let rank = input.len();
        if !(1..=MAX_RANK).contains(&rank) {
            return Err(ConvError::Rank { rank });
        }
        ConvGeometry {
            batch,
            in_channels,
            out_channels,
            groups,
            rank,
            input: per_dim("input", input, rank, 1)?,
            kernel: per_dim("kernel", kernel, rank, 1)?,
            stride: per_dim("stride", stride, rank, 1)?,
            dilation: per_dim("dilation", dilation, rank, 1)?,
            pad_before: per_dim("pad_before", pad_before, rank, 0)?,
            pad_after: per_dim("pad_after", pad_after, rank, 0)?,
            output: [1; MAX_RANK],
        }
        .validated()
    }

    /// Sets the stride per dimension (or one value for all).
    pub fn with_stride(mut self, stride: &[usize]) -> Result<Self> {
        self.stride = per_dim("stride", stride, self.rank, 1)?;
        self.validated()
    }

    /// Sets the dilation per dimension (or one value for all).
    pub fn with_dilation(mut self, dilation: &[usize]) -> Result<Self> {
        self.dilation = per_dim("dilation", dilation, self.rank, 1)?;
        self.validated()
    }

    /// Sets the same zero padding on both sides of each dimension (or one value for all).
    pub fn with_padding(self, padding: &[usize]) -> Result<Self> {
        self.with_padding_per_side(padding, padding)
    }

    /// Sets zero padding separately before and after each dimension.
    pub fn with_padding_per_side(mut self, before: &[usize], after: &[usize]) -> Result<Self> {
        self.pad_before = per_dim("pad_before", before, self.rank, 0)?;
        self.pad_after = per_dim("pad_after", after, self.rank, 0)?;
        self.validated()
    }

    /// Sets the number of groups; `groups == in_channels == out_channels` is depthwise.
    pub fn with_groups(mut self, groups: usize) -> Result<Self> {
        self.groups = groups;
        self.validated()
    }

    /// The same convolution on a different batch size.
    pub fn with_batch(mut self, batch: usize) -> Result<Self> {
        self.batch = batch;
        self.validated()
    }

    fn validated(mut self) -> Result<Self> {
        for (field, v) in [
            ("batch", self.batch),
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("groups", self.groups),
        ] {
            if v == 0 {
                return Err(ConvError::Zero { field, dim: 0 });
            }
        }
        for (field, channels) in [
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
        ] {
            if channels % self.groups != 0 {
                return Err(ConvError::Groups {
                    field,
                    channels,
                    groups: self.groups,
                });
            }
        }
        for d in MAX_RANK - self.rank..MAX_RANK {
            for (field, v) in [
                ("input", self.input[d]),
                ("kernel", self.kernel[d]),
                ("stride", self.stride[d]),
                ("dilation", self.dilation[d]),
            ] {
                if v == 0 {
                    return Err(ConvError::Zero {
                        field,
                        dim: d + self.rank - MAX_RANK,
                    });
                }
            }
            let extent = self.dilation[d]
                .checked_mul(self.kernel[d] - 1)
                .and_then(|e| e.checked_add(1))
                .ok_or(ConvError::Overflow { field: "kernel" })?;
            let padded = self.input[d]
                .checked_add(self.pad_before[d])
                .and_then(|p| p.checked_add(self.pad_after[d]))
                .ok_or(ConvError::Overflow { field: "padding" })?;
            if extent > padded {
                return Err(ConvError::KernelTooLarge {
                    dim: d + self.rank - MAX_RANK,
                    extent,
                    padded,
                    input: self.input[d],
                });
            }
            self.output[d] = (padded - extent) / self.stride[d] + 1;
        }
        // Every buffer size must be representable.
        let sizes = [
            ("x", self.x_len_checked()),
            ("w", self.w_len_checked()),
            ("y", self.y_len_checked()),
        ];
        for (field, s) in sizes {
            s.ok_or(ConvError::Overflow { field })?;
        }
        Ok(self)
    }

    fn x_len_checked(&self) -> Option<usize> {
        self.input
            .iter()
            .try_fold(self.batch, |a, &b| a.checked_mul(b))?
            .checked_mul(self.in_channels)
    }
    fn w_len_checked(&self) -> Option<usize> {
        self.kernel
            .iter()
            .try_fold(self.out_channels, |a, &b| a.checked_mul(b))?
            .checked_mul(self.in_channels / self.groups)
    }
    fn y_len_checked(&self) -> Option<usize> {
        self.output
            .iter()
            .try_fold(self.batch, |a, &b| a.checked_mul(b))?
            .checked_mul(self.out_channels)
    }

    /// Batch size N.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// Input channels C.
    pub fn in_channels(&self) -> usize {
        self.in_channels
    }
    /// Output channels (kernels) K.
    pub fn out_channels(&self) -> usize {
        self.out_channels
    }
    /// Groups G (1 for a dense convolution).
    pub fn groups(&self) -> usize {
        self.groups
    }
    /// Input channels per group, C/G.
    pub fn in_channels_per_group(&self) -> usize {
        self.in_channels / self.groups
    }
    /// Output channels per group, K/G.
    pub fn out_channels_per_group(&self) -> usize {
        self.out_channels / self.groups
    }
    /// Number of spatial dimensions (1, 2 or 3).
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Input spatial size.
    pub fn input(&self) -> &[usize] {
        &self.input[MAX_RANK - self.rank..]
    }
    /// Kernel spatial size.
    pub fn kernel(&self) -> &[usize] {
        &self.kernel[MAX_RANK - self.rank..]
    }
    /// Stride per dimension.
    pub fn stride(&self) -> &[usize] {
        &self.stride[MAX_RANK - self.rank..]
    }
    /// Dilation per dimension.
    pub fn dilation(&self) -> &[usize] {
        &self.dilation[MAX_RANK - self.rank..]
    }
    /// Zero padding before each dimension.
    pub fn pad_before(&self) -> &[usize] {
        &self.pad_before[MAX_RANK - self.rank..]
    }
    /// Zero padding after each dimension.
    pub fn pad_after(&self) -> &[usize] {
        &self.pad_after[MAX_RANK - self.rank..]
    }
    /// Output spatial size.
    pub fn output(&self) -> &[usize] {
        &self.output[MAX_RANK - self.rank..]
    }

    /// The per-dimension arrays right-aligned in three dimensions with neutral leading values, in the order
    /// (input, kernel, stride, dilation, pad_before, output): what the kernels loop over.
    pub fn dims3(&self) -> Dims3 {
        Dims3 {
            input: self.input,
            kernel: self.kernel,
            stride: self.stride,
            dilation: self.dilation,
            pad: self.pad_before,
            output: self.output,
        }
    }

    /// Elements of one input image per channel (the product of `input()`).
    pub fn input_spatial_len(&self) -> usize {
        self.input.iter().product()
    }
    /// Elements of one output image per channel (the product of `output()`).
    pub fn output_spatial_len(&self) -> usize {
        self.output.iter().product()
    }
    /// Taps of one kernel per channel (the product of `kernel()`).
    pub fn kernel_len(&self) -> usize {
        self.kernel.iter().product()
    }
    /// Elements of the input tensor `x` (N·C·spatial).
    pub fn x_len(&self) -> usize {
        self.batch * self.in_channels * self.input_spatial_len()
    }
    /// Elements of the weight tensor `w` (K·C/G·kernel).
    pub fn w_len(&self) -> usize {
        self.out_channels * self.in_channels_per_group() * self.kernel_len()
    }
    /// Elements of the output tensor `y` (N·K·output spatial).
    pub fn y_len(&self) -> usize {
        self.batch * self.out_channels * self.output_spatial_len()
    }

    /// The GEMM of one group of the forward pass, as (M, N, K) = (K/G, N·O, C/G·R):
    /// `y_g = w_g · im2col(x)_g`.
    pub fn gemm_dims(&self) -> (usize, usize, usize) {
        (
            self.out_channels_per_group(),
            self.batch * self.output_spatial_len(),
            self.in_channels_per_group() * self.kernel_len(),
        )
    }

    /// Multiply-adds counted as two flops, of one pass (forward, backward-data or
    /// backward-filter all do the same work), zero padding included.
    pub fn flops(&self) -> u64 {
        let (m, n, k) = self.gemm_dims();
        2 * (self.groups as u64) * (m as u64) * (n as u64) * (k as u64)
    }

    /// True when the stride is 1 and the dilation 1 in every dimension.
    pub fn is_unit_stride_and_dilation(&self) -> bool {
        self.stride.iter().all(|&s| s == 1) && self.dilation.iter().all(|&d| d == 1)
    }

    /// Checks that a buffer has the length the geometry requires.
    pub fn check_len(&self, name: &'static str, got: usize, expected: usize) -> Result<()> {
        if got == expected {
            Ok(())
        } else {
            Err(ConvError::BufferLength {
                name,
                got,
                expected,
            })
        }
    }
}

/// Per-dimension quantities right-aligned in three dimensions (see [`ConvGeometry::dims3`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims3 {
    /// Input size.
    pub input: [usize; MAX_RANK],
    /// Kernel size.
    pub kernel: [usize; MAX_RANK],
    /// Stride.
    pub stride: [usize; MAX_RANK],
    /// Dilation.
    pub dilation: [usize; MAX_RANK],
    /// Padding before each dimension.
    pub pad: [usize; MAX_RANK],
    /// Output size.
    pub output: [usize; MAX_RANK],
}

impl Dims3 {
    /// Input coordinate (signed, may fall in the padding) read by output coordinate `o` and
    /// kernel tap `r` in dimension `d`.
    #[inline(always)]
    pub fn input_coord(&self, d: usize, o: usize, r: usize) -> isize {
        (o * self.stride[d] + r * self.dilation[d]) as isize - self.pad[d] as isize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes_follow_pytorch() {
        let g = ConvGeometry::new(1, 3, 8, &[7, 7], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        assert_eq!(g.output(), &[4, 4]);
        let g = ConvGeometry::new(1, 1, 1, &[10], &[3])
            .unwrap()
            .with_dilation(&[2])
            .unwrap();
        assert_eq!(g.output(), &[6]);
        let g = ConvGeometry::new(2, 4, 4, &[5, 6, 7], &[3, 2, 1])
            .unwrap()
            .with_padding_per_side(&[1, 0, 0], &[0, 1, 2])
            .unwrap();
        assert_eq!(g.output(), &[4, 6, 9]);
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            ConvGeometry::new(1, 1, 1, &[], &[]).unwrap_err(),
            ConvError::Rank { rank: 0 }
        );
        assert_eq!(
            ConvGeometry::new(1, 1, 1, &[4, 4], &[3, 3, 3]).unwrap_err(),
            ConvError::FieldRank {
                field: "kernel",
                got: 3,
                expected: 2
            }
        );
        assert!(matches!(
            ConvGeometry::new(1, 1, 1, &[4, 4], &[3, 3])
                .unwrap()
                .with_stride(&[1, 0]),
            Err(ConvError::Zero {
                field: "stride",
                dim: 1
            })
        ));
        assert!(matches!(
            ConvGeometry::new(1, 6, 4, &[4], &[3])
                .unwrap()
                .with_groups(4),
            Err(ConvError::Groups {
                field: "in_channels",
                ..
            })
        ));
        assert!(matches!(
            ConvGeometry::new(1, 1, 1, &[2, 8], &[3, 3]),
            Err(ConvError::KernelTooLarge { dim: 0, .. })
        ));
        assert!(matches!(
            ConvGeometry::new(0, 1, 1, &[4], &[3]),
            Err(ConvError::Zero { field: "batch", .. })
        ));
        assert!(matches!(
            ConvGeometry::new(1, 1, 1, &[1 << 40, 1 << 30], &[1, 1]),
            Err(ConvError::Overflow { .. })
        ));
    }
}
