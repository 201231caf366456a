//! Explicit im2col and col2im: the transforms of the `base` algorithms.
//!
//! For group `grp`, im2col(x) is the matrix B of shape (C/G·R) × (N·O) whose row `c·R + r`
//! (channel within the group, kernel tap) and column `n·O + o` (image, output position) holds
//! the input value that tap `r` of output `o` reads, or zero where it falls in the padding.
//! The forward convolution of the group is then the GEMM `y_g = w_g · B` with w_g seen as a
//! (K/G) × (C/G·R) matrix. col2im is the adjoint: it adds each entry of such a matrix back to
//! the input position it came from.

use rayon::prelude::*;

use crate::error::Result;
use crate::geometry::ConvGeometry;

/// Rows and columns of the im2col matrix of one group: (C/G·R, N·O).
pub fn im2col_shape(g: &ConvGeometry) -> (usize, usize) {
    (
        g.in_channels_per_group() * g.kernel_len(),
        g.batch() * g.output_spatial_len(),
    )
}

/// Splits a flat kernel-tap index into its three (padded) coordinates.
#[inline(always)]
pub(crate) fn split3(i: usize, dims: &[usize; 3]) -> [usize; 3] {
    [
        i / (dims[1] * dims[2]),
        (i / dims[2]) % dims[1],
        i % dims[2],
    ]
}

/// Writes im2col(x) of group `grp` into `col` (row-major, (C/G·R) × (N·O)).
pub fn im2col(g: &ConvGeometry, grp: usize, x: &[f32], col: &mut [f32]) -> Result<()> {
    g.check_len("x", x.len(), g.x_len())?;
    let (rows, cols) = im2col_shape(g);
    g.check_len("col", col.len(), rows * cols)?;
    if grp >= g.groups() {
        return Err(crate::ConvError::Unsupported {
            algo: "im2col",
            reason: format!("group {grp} out of range (groups = {})", g.groups()),
        });
    }
    let d = g.dims3();
    let (rlen, olen, ilen) = (
        g.kernel_len(),
        g.output_spatial_len(),
        g.input_spatial_len(),
    );
    let cg = g.in_channels_per_group();
    let parallel = rows * cols >= 1 << 15;
    let fill_row = |(row, out): (usize, &mut [f32])| {
        let (cc, r) = (row / rlen, row % rlen);
        let c = grp * cg + cc;
        let rk = split3(r, &d.kernel);
        for n in 0..g.batch() {
            let plane = &x[(n * g.in_channels() + c) * ilen..][..ilen];
            let dst = &mut out[n * olen..][..olen];
            let mut o = 0;
            for o0 in 0..d.output[0] {
                let i0 = d.input_coord(0, o0, rk[0]);
                for o1 in 0..d.output[1] {
                    let i1 = d.input_coord(1, o1, rk[1]);
                    let inside = (0..d.input[0] as isize).contains(&i0)
                        && (0..d.input[1] as isize).contains(&i1);
                    for o2 in 0..d.output[2] {
                        let i2 = d.input_coord(2, o2, rk[2]);
                        dst[o] = if inside && (0..d.input[2] as isize).contains(&i2) {
                            plane[(i0 as usize * d.input[1] + i1 as usize) * d.input[2]
                                + i2 as usize]
                        } else {
                            0.0
                        };
                        o += 1;
                    }
                }
            }
        }
    };
    if parallel {
        col.par_chunks_mut(cols).enumerate().for_each(fill_row);
    } else {
        col.chunks_mut(cols).enumerate().for_each(fill_row);
    }
    Ok(())
}

/// Adds col2im(`col`) of group `grp` into `dx` (the adjoint of [`im2col`]): every entry of
/// `col` is added to the input position it was read from; padding entries are dropped.
///
/// Parallel over (image, channel) planes, so no two threads write the same element.
pub fn col2im_add(g: &ConvGeometry, grp: usize, col: &[f32], dx: &mut [f32]) -> Result<()> {
    g.check_len("dx", dx.len(), g.x_len())?;
    let (rows, cols) = im2col_shape(g);
    g.check_len("col", col.len(), rows * cols)?;
    if grp >= g.groups() {
        return Err(crate::ConvError::Unsupported {
            algo: "col2im",
            reason: format!("group {grp} out of range (groups = {})", g.groups()),
        });
    }
    let d = g.dims3();
    let (rlen, olen, ilen) = (
        g.kernel_len(),
        g.output_spatial_len(),
        g.input_spatial_len(),
    );
    let (cg, cin) = (g.in_channels_per_group(), g.in_channels());
    let add_plane = |(plane_idx, plane): (usize, &mut [f32])| {
        let (n, c) = (plane_idx / cin, plane_idx % cin);
        if c / cg != grp {
            return;
        }
        let cc = c % cg;
        for r in 0..rlen {
            let rk = split3(r, &d.kernel);
            let src = &col[(cc * rlen + r) * cols + n * olen..][..olen];
            let mut o = 0;
            for o0 in 0..d.output[0] {
                let i0 = d.input_coord(0, o0, rk[0]);
                for o1 in 0..d.output[1] {
                    let i1 = d.input_coord(1, o1, rk[1]);
                    let inside = (0..d.input[0] as isize).contains(&i0)
                        && (0..d.input[1] as isize).contains(&i1);
                    for o2 in 0..d.output[2] {
                        let i2 = d.input_coord(2, o2, rk[2]);
                        if inside && (0..d.input[2] as isize).contains(&i2) {
                            plane[(i0 as usize * d.input[1] + i1 as usize) * d.input[2]
                                + i2 as usize] += src[o];
                        }
                        o += 1;
                    }
                }
            }
        }
    };
    if rows * cols >= 1 << 15 {
        dx.par_chunks_mut(ilen).enumerate().for_each(add_plane);
    } else {
        dx.chunks_mut(ilen).enumerate().for_each(add_plane);
    }
    Ok(())
}
