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
use crate::geometry::{ConvGeometry, Dims3};

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

/// Validates the buffers and group of [`im2col`] / [`col2im_add`]; returns the matrix shape.
fn check(
    g: &ConvGeometry,
    grp: usize,
    algo: &'static str,
    (tensor, tensor_len): (&'static str, usize),
    col_len: usize,
) -> Result<(usize, usize)> {
    g.check_len(tensor, tensor_len, g.x_len())?;
    let (rows, cols) = im2col_shape(g);
    g.check_len("col", col_len, rows * cols)?;
    if grp >= g.groups() {
        return Err(crate::ConvError::Unsupported {
            algo,
            reason: format!("group {grp} out of range (groups = {})", g.groups()),
        });
    }
    Ok((rows, cols))
}

/// Walks the output positions `o` of one plane in order and calls `f(o, Some(i))` with the input
/// position `i` that kernel tap `rk` reads there, or `f(o, None)` where it falls in the padding.
/// im2col and col2im both walk this map, one reading through it and the other adding back.
#[inline(always)]
fn for_each_tap_position(d: &Dims3, rk: [usize; 3], mut f: impl FnMut(usize, Option<usize>)) {
    let mut o = 0;
    for o0 in 0..d.output[0] {
        let i0 = d.input_coord(0, o0, rk[0]);
        for o1 in 0..d.output[1] {
            let i1 = d.input_coord(1, o1, rk[1]);
            let inside =
                (0..d.input[0] as isize).contains(&i0) && (0..d.input[1] as isize).contains(&i1);
            for o2 in 0..d.output[2] {
                let i2 = d.input_coord(2, o2, rk[2]);
                let at = (inside && (0..d.input[2] as isize).contains(&i2))
                    .then(|| (i0 as usize * d.input[1] + i1 as usize) * d.input[2] + i2 as usize);
                f(o, at);
                o += 1;
            }
        }
    }
}

/// Writes im2col(x) of group `grp` into `col` (row-major, (C/G·R) × (N·O)).
pub fn im2col(g: &ConvGeometry, grp: usize, x: &[f32], col: &mut [f32]) -> Result<()> {
    let (rows, cols) = check(g, grp, "im2col", ("x", x.len()), col.len())?;
    let d = g.dims3();
    let (rlen, olen, ilen) = (
        g.kernel_len(),
        g.output_spatial_len(),
        g.input_spatial_len(),
    );
    let cg = g.in_channels_per_group();
    let fill_row = |(row, out): (usize, &mut [f32])| {
        let (cc, r) = (row / rlen, row % rlen);
        let c = grp * cg + cc;
        let rk = split3(r, &d.kernel);
        for n in 0..g.batch() {
            let plane = &x[(n * g.in_channels() + c) * ilen..][..ilen];
            let dst = &mut out[n * olen..][..olen];
            for_each_tap_position(&d, rk, |o, at| dst[o] = at.map_or(0.0, |i| plane[i]));
        }
    };
    if rows * cols >= 1 << 15 {
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
    let (rows, cols) = check(g, grp, "col2im", ("dx", dx.len()), col.len())?;
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
            let src = &col[(cc * rlen + r) * cols + n * olen..][..olen];
            for_each_tap_position(&d, split3(r, &d.kernel), |o, at| {
                if let Some(i) = at {
                    plane[i] += src[o];
                }
            });
        }
    };
    if rows * cols >= 1 << 15 {
        dx.par_chunks_mut(ilen).enumerate().for_each(add_plane);
    } else {
        dx.chunks_mut(ilen).enumerate().for_each(add_plane);
    }
    Ok(())
}
