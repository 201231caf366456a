//! Tiny planes: the convolution as one GEMM per valid (output position, input position) pair.
//!
//! On a 2×2 plane with a 3×3 kernel and padding 1 only 16 of convgemm's 36 (output position,
//! tap) columns read the image; the other 20 multiply padding zeros (2.25× the real work). Here
//! every pair (o, i) of an output position and the input position that tap `t` reads from it
//! is one product over the channels, with the tensors copied position-major first (`xt[i]` =
//! x\[:, :, i\] as an N × C matrix, likewise dy, y, dx; `wt[t]` = w\[:, :, t\], K × C, through
//! core-blas's gathers in blocks of 16 kernels):
//! - forward: yt\[o\] (N × K) += xt\[i\] (N × C) · wt\[t\]ᵀ (C × K);
//! - backward-data: dxt\[i\] (N × C) += dyt\[o\] (N × K) · wt\[t\] (K × C);
//! - backward-filter: dwt\[t\] (K × C) += dyt\[o\]ᵀ (K × N) · xt\[i\] (N × C).
//!
//! The products do exactly the layer's real multiply-adds. The copies live in per-thread
//! buffers kept across calls (as [`crate::subsample`]'s): one weight-sized (one group's w), two
//! for one block of images' input and output side, [`BLOCK_VALUES`] floats each or one image's,
//! whichever is larger ([`image_block`]): none of them grows with the batch.
//!
//! Measured (probe_passes, VGG-16 CIFAR 512@2², batch 64, 1 thread, quiet 03:51 UTC,
//! session 15, 4 alternations): forward 10.7-14.3 ms against convgemm's 12.7-17.2, backward-data
//! 9.6-10.2 against the flipped convgemm's 13.1-17.8, backward-filter 10.4-10.9 against the
//! transposed convgemm's 14.2-19.1; oneDNN 16.3 / 22.6 / 57.9 ms. On 4×4 planes (100 pairs
//! against convgemm's 144 columns) level or slower (quiet 03:40 UTC), hence [`applies`].

use std::cell::RefCell;

use core_blas::{CHUNK_LANES, Chunk, ConvPack, MatMut, MatRef};

use crate::error::{Result, gemm_err};
use crate::geometry::ConvGeometry;

/// Whether the forward convgemm, the backward-data algorithms and the transposed convgemm run
/// `g` pair by pair: one group, a kernel larger than 1×1, and an input plane of at most as
/// many positions as the kernel has taps (then every output position reads at most all of the
/// plane: the 2×2 and 1×1 planes of VGG-16 on CIFAR, 3×3 planes under 3×3 kernels), where the
/// pairs are at most the convgemm's columns and usually far fewer.
pub(crate) fn applies(g: &ConvGeometry) -> bool {
    g.groups() == 1 && g.kernel_len() > 1 && g.input_spatial_len() <= g.kernel_len()
}

/// The valid (output position, input position, tap) triples of `g`, output position major.
pub(crate) fn pairs(g: &ConvGeometry) -> Vec<(usize, usize, usize)> {
    let d = g.dims3();
    let mut v = Vec::new();
    for o in 0..g.output_spatial_len() {
        let oc = [
            o / (d.output[1] * d.output[2]),
            (o / d.output[2]) % d.output[1],
            o % d.output[2],
        ];
        for t in 0..g.kernel_len() {
            let tc = [
                t / (d.kernel[1] * d.kernel[2]),
                (t / d.kernel[2]) % d.kernel[1],
                t % d.kernel[2],
            ];
            let mut i = 0usize;
            let inside = (0..3).all(|dd| {
                let c = d.input_coord(dd, oc[dd], tc[dd]);
                let ok = c >= 0 && (c as usize) < d.input[dd];
                if ok {
                    i = i * d.input[dd] + c as usize;
                }
                ok
            });
            if inside {
                v.push((o, i, t));
            }
        }
    }
    v
}

/// The sizes every pass indexes with: N, C, K, C/G, K/G, input plane, output plane, taps.
#[derive(Clone, Copy)]
struct Sizes {
    n: usize,
    c: usize,
    k: usize,
    cg: usize,
    kg: usize,
    pi: usize,
    po: usize,
    r: usize,
}

impl Sizes {
    fn of(g: &ConvGeometry) -> Sizes {
        Sizes {
            n: g.batch(),
            c: g.in_channels(),
            k: g.out_channels(),
            cg: g.in_channels_per_group(),
            kg: g.out_channels_per_group(),
            pi: g.input_spatial_len(),
            po: g.output_spatial_len(),
            r: g.kernel_len(),
        }
    }
}

/// Values of each of the input-side and output-side position-major copies: the images are
/// taken in blocks of at most this many values (at least one image), so the copies are bounded
/// whatever the batch. 256 Ki floats (1 MiB) holds 128 images of VGG-16 CIFAR's 512@2²: that
/// layer at batch 64 or 128 runs in one block as before the blocking (the GEMMs' rows are the
/// block's images). Blocks of 64 at batch 128 ran 1.0-1.4× slower forward (probe_passes, 1
/// thread, quiet 06:30 UTC, session 16).
pub(crate) const BLOCK_VALUES: usize = 256 << 10;

/// Images per block for `g`: as many as fit [`BLOCK_VALUES`] values on both the input side
/// (C/G × input plane per image) and the output side (K/G × output plane), at least one, at
/// most the batch.
pub(crate) fn image_block(g: &ConvGeometry) -> usize {
    let s = Sizes::of(g);
    let per_image = (s.pi * s.cg).max(s.po * s.kg).max(1);
    (BLOCK_VALUES / per_image).clamp(1, s.n.max(1))
}

/// The values of this thread's three buffers (weights, input side, output side) every pass of
/// `g` asks for: `[taps · K/G · (C/G rounded up to 16), input plane · block · C/G, output plane
/// · block · K/G]` for blocks of `nb` images ([`image_block`] in the passes).
fn buffer_lens(g: &ConvGeometry, nb: usize) -> [usize; 3] {
    let s = Sizes::of(g);
    [
        s.r * s.kg * s.cg.next_multiple_of(CHUNK_LANES),
        s.pi * nb * s.cg,
        s.po * nb * s.kg,
    ]
}

/// The bytes this thread's buffers hold after any pass of `g` that found them empty: one
/// group's w (rows rounded up to 16) plus at most 2 × max([`BLOCK_VALUES`], one image's side)
/// floats, whatever the batch.
#[cfg(test)]
fn buffer_bytes(g: &ConvGeometry) -> usize {
    buffer_lens(g, image_block(g)).iter().sum::<usize>() * size_of::<f32>()
}

/// Bytes this thread's buffers hold now.
#[cfg(test)]
fn held_bytes() -> usize {
    BUFS.with_borrow(|b| b.iter().map(|v| v.capacity() * size_of::<f32>()).sum())
}

thread_local! {
    /// This thread's position-major copies (weights, input side, output side), reused across
    /// calls.
    static BUFS: RefCell<[Vec<f32>; 3]> = const { RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// Frees this thread's position-major copies ([`crate::release_workspaces`]) and returns their
/// bytes; 0 when in use.
pub(crate) fn release_thread() -> usize {
    crate::take_thread_buffer(&BUFS, |b| b.into_iter().map(crate::vec_bytes).sum())
}

/// Runs `f` on this thread's three buffers of at least `lens` values (contents unspecified).
fn with_bufs<R>(lens: [usize; 3], f: impl FnOnce(&mut [f32], &mut [f32], &mut [f32]) -> R) -> R {
    BUFS.with_borrow_mut(|b| {
        for (v, &len) in b.iter_mut().zip(&lens) {
            if v.len() < len {
                // Exactly `len`, so that `held_bytes` is what `buffer_bytes` says.
                *v = Vec::new();
                v.reserve_exact(len);
                v.resize(len, 0.0);
            }
        }
        let [w, x, y] = b;
        f(&mut w[..lens[0]], &mut x[..lens[1]], &mut y[..lens[2]])
    })
}

/// `dst[p][n][ch]` (position major) = `src[n][c0 + ch][p]` for `ch < chans` of `channels`
/// channels, `plane` positions.
fn to_position_major(src: &[f32], dst: &mut [f32], s: (usize, usize, usize, usize, usize)) {
    let (n, channels, c0, chans, plane) = s;
    for img in 0..n {
        let src = &src[(img * channels + c0) * plane..][..chans * plane];
        for (ch, pl) in src.chunks_exact(plane).enumerate() {
            for (p, &v) in pl.iter().enumerate() {
                dst[(p * n + img) * chans + ch] = v;
            }
        }
    }
}

/// The inverse of [`to_position_major`]: `dst[n][c0 + ch][p]` = `src[p][n][ch]`.
fn from_position_major(src: &[f32], dst: &mut [f32], s: (usize, usize, usize, usize, usize)) {
    let (n, channels, c0, chans, plane) = s;
    for img in 0..n {
        let dst = &mut dst[(img * channels + c0) * plane..][..chans * plane];
        for (ch, pl) in dst.chunks_exact_mut(plane).enumerate() {
            for (p, v) in pl.iter_mut().enumerate() {
                *v = src[(p * n + img) * chans + ch];
            }
        }
    }
}

/// Rows of [`gather_taps`]' blocks.
const TAP_ROWS: usize = 16;

/// `dst[t][row][col]` (rows `ld` apart, `ld` a multiple of 16 and at least `cols`; the
/// columns past `cols` zero) = `src[row · row_step + col · col_step + t]` for every tap `t <
/// r`: the weights tap by tap as dense matrices, through core-blas's masked gathers.
fn gather_taps(
    src: &[f32],
    dst: &mut [f32],
    r: usize,
    (rows, row_step): (usize, usize),
    (cols, col_step): (usize, usize),
    ld: usize,
) -> Result<()> {
    debug_assert!(ld.is_multiple_of(CHUNK_LANES) && ld >= cols && dst.len() >= r * rows * ld);
    let pack = ConvPack::global().map_err(gemm_err)?;
    let mut idx = Vec::new();
    let chunks = (0..ld / CHUNK_LANES)
        .map(|q| {
            let offs: Vec<Option<isize>> = (0..CHUNK_LANES)
                .map(|l| {
                    let col = q * CHUNK_LANES + l;
                    (col < cols).then_some((col * col_step) as isize)
                })
                .collect();
            Chunk::from_offsets(&offs, col_step, &mut idx)
        })
        .collect::<Option<Vec<Chunk>>>();
    let Some(chunks) = chunks else {
        // Offsets past i32: value by value.
        for t in 0..r {
            for row in 0..rows {
                let d = &mut dst[(t * rows + row) * ld..][..ld];
                for (col, v) in d.iter_mut().enumerate() {
                    *v = if col < cols {
                        src[row * row_step + col * col_step + t]
                    } else {
                        0.0
                    };
                }
            }
        }
        return Ok(());
    };
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    assert!((rows - 1) * row_step + (cols - 1) * col_step + r <= src.len());
    // Blocks of rows, every tap of a block before the next: the block's source (16 rows ×
    // every column, a few hundred KiB at most on the layers this runs on) stays in L2 for the
    // taps; tap by tap over all rows would stream w from memory once per tap.
    for r0 in (0..rows).step_by(TAP_ROWS) {
        let nrows = TAP_ROWS.min(rows - r0);
        for t in 0..r {
            // SAFETY: row `r0 + i`, `i < nrows`, writes `ld` values at `dst[(t·rows + r0 +
            // i)·ld ..]`, inside the slice taken here; the lanes read (col < cols) are at `t +
            // (r0 + i)·row_step + col·col_step < src.len()` (asserted above); the gathers'
            // rows are in `idx`; `dst` and `src` are distinct slices.
            unsafe {
                let d = dst[(t * rows + r0) * ld..][..nrows * ld].as_mut_ptr();
                let s = src.as_ptr().add(r0 * row_step + t);
                pack.pack_rows(d, ld, nrows, s, row_step, &chunks, &idx);
            }
        }
    }
    Ok(())
}

/// `dw[kc · r + t]` = `dwt[t · kc_len + kc]` for `kc < kc_len`, `t < r`: the tap-major weight
/// gradient back in w's layout, 16 `kc` (16·r values) per gathered row.
fn scatter_taps(dwt: &[f32], dw: &mut [f32], r: usize, kc_len: usize) {
    let blocks = kc_len / CHUNK_LANES;
    let mut idx = Vec::new();
    let chunks = (0..r)
        .map(|q| {
            let offs: Vec<Option<isize>> = (0..CHUNK_LANES)
                .map(|l| {
                    let e = q * CHUNK_LANES + l;
                    Some(((e % r) * kc_len + e / r) as isize)
                })
                .collect();
            Chunk::from_offsets(&offs, 1, &mut idx)
        })
        .collect::<Option<Vec<Chunk>>>();
    let done = match (chunks, ConvPack::global()) {
        (Some(chunks), Ok(pack)) if blocks > 0 => {
            assert!(dwt.len() >= r * kc_len && dw.len() >= kc_len * r);
            // In runs of 64 blocks (1024 kc: 4 KiB of each tap's plane): the chunks are
            // gathered one by one over all rows of a call, so one call over all of dwt
            // would read every plane once per chunk.
            for b0 in (0..blocks).step_by(64) {
                let nb = 64.min(blocks - b0);
                // SAFETY: block `b < blocks` writes the 16·r values `dw[16·r·b ..]`, inside
                // `dw` (`16·blocks <= kc_len`); its lanes read `dwt[16·b + (e % r)·kc_len + e /
                // r]` with `e / r < 16`, `e % r < r`: below `r·kc_len` (asserted); distinct
                // slices.
                unsafe {
                    pack.pack_rows(
                        dw.as_mut_ptr().add(b0 * CHUNK_LANES * r),
                        CHUNK_LANES * r,
                        nb,
                        dwt.as_ptr().add(b0 * CHUNK_LANES),
                        CHUNK_LANES,
                        &chunks,
                        &idx,
                    );
                }
            }
            blocks * CHUNK_LANES
        }
        _ => 0,
    };
    for kc in done..kc_len {
        for t in 0..r {
            dw[kc * r + t] = dwt[t * kc_len + kc];
        }
    }
}

/// The products of one pass: for each pair `(o, i, t)`, `C[which.2] (+)= A[which.0] · B[which.1]`
/// where `pick` maps the pair to (A, B, C) block indices; unless `accumulate`, the first product
/// into a C block overwrites it and blocks never written are zeroed (with `accumulate` every
/// product adds). `a`, `b`, `c` give the blocks as views.
#[allow(clippy::too_many_arguments)]
fn run_pairs<'x>(
    pairs: &[(usize, usize, usize)],
    accumulate: bool,
    pick: impl Fn((usize, usize, usize)) -> (usize, usize, usize),
    a: impl Fn(usize) -> Result<MatRef<'x>>,
    b: impl Fn(usize) -> Result<MatRef<'x>>,
    c_blocks: &mut [f32],
    c_block: usize,
    c_shape: (usize, usize),
) -> Result<()> {
    let mut first = vec![!accumulate; c_blocks.len() / c_block.max(1)];
    for &pair in pairs {
        let (ia, ib, ic) = pick(pair);
        let c = MatMut::row_major(
            "c",
            &mut c_blocks[ic * c_block..][..c_block],
            c_shape.0,
            c_shape.1,
            c_shape.1,
        )
        .map_err(gemm_err)?;
        let beta = if first[ic] { 0.0 } else { 1.0 };
        first[ic] = false;
        core_blas::gemm(1.0, a(ia)?, b(ib)?, beta, c).map_err(gemm_err)?;
    }
    for (blk, f) in c_blocks.chunks_exact_mut(c_block.max(1)).zip(first) {
        if f {
            blk.fill(0.0);
        }
    }
    Ok(())
}

/// y = conv(x, w) (+ bias) (then ReLU when `relu`), pair by pair.
pub(crate) fn forward(
    g: &ConvGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
) -> Result<()> {
    forward_in_blocks(g, x, w, bias, relu, y, image_block(g))
}

/// [`forward`] on blocks of `nb` images.
fn forward_in_blocks(
    g: &ConvGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
    nb: usize,
) -> Result<()> {
    let s = Sizes::of(g);
    through_pairs(g, x, w, y, nb, Way::Forward)?;
    if bias.is_some() || relu {
        for img in y.chunks_exact_mut(s.k * s.po) {
            for (ch, pl) in img.chunks_exact_mut(s.po).enumerate() {
                let b = bias.map_or(0.0, |b| b[ch]);
                for v in pl {
                    *v += b;
                    if relu {
                        // As core-blas's stores: `max`, NaN becomes 0.
                        *v = v.max(0.0);
                    }
                }
            }
        }
    }
    Ok(())
}

/// dx from dy and w (overwritten), pair by pair.
pub(crate) fn backward_data(g: &ConvGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
    backward_data_in_blocks(g, dy, w, dx, image_block(g))
}

/// [`backward_data`] on blocks of `nb` images.
fn backward_data_in_blocks(
    g: &ConvGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    nb: usize,
) -> Result<()> {
    through_pairs(g, dy, w, dx, nb, Way::Data)
}

/// Which way [`through_pairs`] runs a layer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// x to y: `yt[o] (m × K/G) = Σ xt[i] (m × C/G) · wt[t]ᵀ (C/G × K/G)`.
    Forward,
    /// dy to dx: `dxt[i] (m × C/G) = Σ dyt[o] (m × K/G) · wt[t] (K/G × C/G)`.
    Data,
}

/// `dst` (overwritten) from `src` and w, pair by pair, on blocks of `nb` images: the forward
/// (x → y) or the backward-data (dy → dx) pass, which differ only in which side is read.
fn through_pairs(
    g: &ConvGeometry,
    src: &[f32],
    w: &[f32],
    dst: &mut [f32],
    nb: usize,
    way: Way,
) -> Result<()> {
    let s = Sizes::of(g);
    let pairs = pairs(g);
    let cp = s.cg.next_multiple_of(CHUNK_LANES);
    let forward = way == Way::Forward;
    // (channels, channels per group, positions) of the side read and of the side written.
    let input = (s.c, s.cg, s.pi);
    let output = (s.k, s.kg, s.po);
    let ((sc, scg, sp), (dc, dcg, dp)) = if forward {
        (input, output)
    } else {
        (output, input)
    };
    with_bufs(buffer_lens(g, nb), |wt, it, ot| {
        let (srct, dstt) = if forward { (it, ot) } else { (ot, it) };
        for grp in 0..g.groups() {
            // wt[t] = w[:, :, t]: K/G × C/G, rows `cp` apart (the forward reads it transposed:
            // gathering w[:, :, t]ᵀ directly reads 16 kernels 9·C values apart per chunk,
            // 1.2-1.3× slower than packing the transposed view).
            let wg = &w[grp * s.kg * s.cg * s.r..][..s.kg * s.cg * s.r];
            gather_taps(wg, wt, s.r, (s.kg, s.cg * s.r), (s.cg, s.r), cp)?;
            let wt = &*wt;
            for n0 in (0..s.n).step_by(nb) {
                let m = nb.min(s.n - n0);
                let (srct, dstt) = (&mut srct[..sp * m * scg], &mut dstt[..dp * m * dcg]);
                to_position_major(&src[n0 * sc * sp..], srct, (m, sc, grp * scg, scg, sp));
                let srct = &*srct;
                run_pairs(
                    &pairs,
                    false,
                    |(o, i, t)| if forward { (i, t, o) } else { (o, t, i) },
                    |j| {
                        let name = if forward { "x" } else { "dy" };
                        MatRef::row_major(name, &srct[j * m * scg..][..m * scg], m, scg, scg)
                            .map_err(gemm_err)
                    },
                    |t| {
                        let wt = &wt[t * s.kg * cp..][..s.kg * cp];
                        let wt = MatRef::row_major("w", wt, s.kg, s.cg, cp).map_err(gemm_err)?;
                        Ok(if forward { wt.t() } else { wt })
                    },
                    dstt,
                    m * dcg,
                    (m, dcg),
                )?;
                from_position_major(dstt, &mut dst[n0 * dc * dp..], (m, dc, grp * dcg, dcg, dp));
            }
        }
        Ok(())
    })
}

/// dw from x and dy (overwritten), pair by pair.
pub(crate) fn backward_filter(
    g: &ConvGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
) -> Result<()> {
    backward_filter_in_blocks(g, x, dy, dw, image_block(g))
}

/// [`backward_filter`] on blocks of `nb` images.
fn backward_filter_in_blocks(
    g: &ConvGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    nb: usize,
) -> Result<()> {
    let s = Sizes::of(g);
    let pairs = pairs(g);
    with_bufs(buffer_lens(g, nb), |dwt, xt, dyt| {
        let dwt = &mut dwt[..s.r * s.kg * s.cg];
        for grp in 0..g.groups() {
            let (c0, k0) = (grp * s.cg, grp * s.kg);
            for n0 in (0..s.n).step_by(nb) {
                let m = nb.min(s.n - n0);
                let (xt, dyt) = (&mut xt[..s.pi * m * s.cg], &mut dyt[..s.po * m * s.kg]);
                to_position_major(&x[n0 * s.c * s.pi..], xt, (m, s.c, c0, s.cg, s.pi));
                to_position_major(&dy[n0 * s.k * s.po..], dyt, (m, s.k, k0, s.kg, s.po));
                let (xt, dyt) = (&*xt, &*dyt);
                // dwt[t] (K/G × C/G) (+)= Σ dyt[o]ᵀ (K/G × m) · xt[i] (m × C/G): the first block
                // overwrites, the others add.
                run_pairs(
                    &pairs,
                    n0 > 0,
                    |(o, i, t)| (o, i, t),
                    |o| {
                        MatRef::row_major("dy", &dyt[o * m * s.kg..][..m * s.kg], m, s.kg, s.kg)
                            .map(MatRef::t)
                            .map_err(gemm_err)
                    },
                    |i| {
                        MatRef::row_major("x", &xt[i * m * s.cg..][..m * s.cg], m, s.cg, s.cg)
                            .map_err(gemm_err)
                    },
                    dwt,
                    s.kg * s.cg,
                    (s.kg, s.cg),
                )?;
            }
            if s.n == 0 {
                dwt.fill(0.0);
            }
            // dw[k][c][t] = dwt[t][k][c].
            scatter_taps(
                dwt,
                &mut dw[k0 * s.cg * s.r..][..s.kg * s.cg * s.r],
                s.r,
                s.kg * s.cg,
            );
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{Tolerance, uniform};

    /// (batch, C, K, input, kernel, stride, dilation, padding before, after, groups).
    #[allow(clippy::too_many_arguments)]
    fn geo(
        n: usize,
        c: usize,
        k: usize,
        sp: &[usize],
        ks: &[usize],
        s: usize,
        d: usize,
        pb: &[usize],
        pa: &[usize],
        groups: usize,
    ) -> ConvGeometry {
        ConvGeometry::from_parts(n, c, k, sp, ks, &[s], &[d], pb, pa, groups).unwrap()
    }

    fn geometries() -> Vec<ConvGeometry> {
        let v = vec![
            // VGG-16 on CIFAR's last planes (narrowed), a 3×3 plane.
            geo(3, 24, 20, &[2, 2], &[3, 3], 1, 1, &[1], &[1], 1),
            geo(2, 17, 9, &[1, 1], &[3, 3], 1, 1, &[1], &[1], 1),
            geo(2, 5, 7, &[3, 3], &[3, 3], 1, 1, &[1], &[1], 1),
            // Stride, dilation, asymmetric padding, 1D and 3D, groups.
            geo(2, 6, 4, &[3, 2], &[3, 3], 2, 1, &[2, 1], &[0, 2], 1),
            geo(3, 4, 5, &[2, 3], &[2, 3], 1, 2, &[2], &[2], 1),
            geo(2, 3, 4, &[3], &[5], 1, 1, &[2], &[2], 1),
            geo(1, 4, 3, &[2, 2, 2], &[3, 3, 3], 1, 1, &[1], &[1], 1),
            geo(2, 6, 4, &[2, 2], &[3, 3], 1, 1, &[1], &[1], 2),
            // Padding wider than the kernel reaches: output positions no input reaches; stride
            // 3 on a 4-line: an input position no output reads.
            geo(2, 3, 2, &[2, 2], &[2, 2], 1, 1, &[2], &[2], 1),
            geo(2, 3, 2, &[4], &[5], 3, 1, &[0], &[3], 1),
        ];
        for g in &v {
            assert!(g.groups() > 1 || applies(g), "{g:?}");
        }
        v
    }

    #[test]
    fn applies_to_tiny_planes_only() {
        let g = |sp: &[usize]| geo(64, 512, 512, sp, &[3, 3], 1, 1, &[1], &[1], 1);
        assert!(applies(&g(&[2, 2])));
        assert!(applies(&g(&[1, 1])));
        assert!(!applies(&g(&[4, 4])));
        assert_eq!(pairs(&g(&[2, 2])).len(), 16);
        assert_eq!(pairs(&g(&[1, 1])).len(), 1);
        assert_eq!(pairs(&g(&[4, 4])).len(), 100);
        assert!(applies(&geo(
            1,
            4,
            4,
            &[3, 3],
            &[3, 3],
            1,
            1,
            &[0],
            &[0],
            1
        )));
        assert!(!applies(&geo(
            1,
            4,
            4,
            &[3, 3],
            &[1, 1],
            1,
            1,
            &[0],
            &[0],
            1
        )));
        assert!(!applies(&geo(
            1,
            4,
            4,
            &[2, 2],
            &[3, 3],
            1,
            1,
            &[1],
            &[1],
            2
        )));
    }

    #[test]
    fn passes_match_the_reference() {
        for g in geometries() {
            check_passes(&g, image_block(&g));
            // Blocks of 1 and 2 images (the last one shorter on odd batches): the same results.
            for nb in [1, 2] {
                if nb < g.batch() {
                    check_passes(&g, nb);
                }
            }
        }
    }

    /// The buffers are bounded by the block, not the batch: VGG-16 CIFAR's 512@2² at batch 64
    /// or 128 runs in one block, at batch 129 or 1000 in blocks of 128; a layer whose image
    /// alone is larger than the block takes one image per block.
    #[test]
    fn image_blocks_do_not_grow_with_the_batch() {
        let g = |n: usize, c: usize| geo(n, c, c, &[2, 2], &[3, 3], 1, 1, &[1], &[1], 1);
        assert_eq!(image_block(&g(64, 512)), 64);
        assert_eq!(image_block(&g(128, 512)), 128);
        assert_eq!(image_block(&g(129, 512)), 128);
        assert_eq!(image_block(&g(1000, 512)), 128);
        assert_eq!(image_block(&g(8, 1 << 17)), 1);
        assert_eq!(buffer_bytes(&g(129, 512)), buffer_bytes(&g(1000, 512)));
        // w (9 × 512 × 512) plus two blocks of 128 images × 4 positions × 512 channels.
        assert_eq!(
            buffer_bytes(&g(1000, 512)),
            (9 * 512 * 512 + 2 * 128 * 4 * 512) * 4
        );
        // A pass on a fresh thread leaves exactly `buffer_bytes` in its buffers.
        let small = geo(9, 20, 12, &[2, 2], &[3, 3], 1, 1, &[1], &[1], 1);
        let (x, w, dy) = (
            uniform(1, small.x_len()),
            uniform(2, small.w_len()),
            uniform(3, small.y_len()),
        );
        for pass in 0..3 {
            let held = std::thread::scope(|sc| {
                sc.spawn(|| {
                    assert_eq!(held_bytes(), 0);
                    let mut out = vec![0.0; small.x_len().max(small.y_len()).max(small.w_len())];
                    match pass {
                        0 => forward(&small, &x, &w, None, false, &mut out[..small.y_len()]),
                        1 => backward_data(&small, &dy, &w, &mut out[..small.x_len()]),
                        _ => backward_filter(&small, &x, &dy, &mut out[..small.w_len()]),
                    }
                    .unwrap();
                    held_bytes()
                })
                .join()
                .unwrap()
            });
            assert_eq!(held, buffer_bytes(&small), "pass {pass}");
        }
    }

    /// Every pass on blocks of `nb` images against the reference.
    fn check_passes(g: &ConvGeometry, nb: usize) {
        let (x, w, dy) = (
            uniform(1, g.x_len()),
            uniform(2, g.w_len()),
            uniform(3, g.y_len()),
        );
        let bias = uniform(4, g.out_channels());
        let terms = g.in_channels_per_group() * g.kernel_len();
        for (b, relu) in [(None, false), (Some(&bias[..]), true)] {
            let mut want = vec![0.0; g.y_len()];
            reference::forward(g, &x, &w, b, &mut want).unwrap();
            if relu {
                want.iter_mut().for_each(|v| *v = v.max(0.0));
            }
            let mut y = vec![f32::NAN; g.y_len()];
            forward_in_blocks(g, &x, &w, b, relu, &mut y, nb).unwrap();
            Tolerance::for_f32_sum(terms)
                .check("y", &y, &want)
                .unwrap_or_else(|e| panic!("{g:?} nb {nb}: {e}"));
        }
        let mut want = vec![0.0; g.x_len()];
        reference::backward_data(g, &dy, &w, &mut want).unwrap();
        let mut dx = vec![f32::NAN; g.x_len()];
        backward_data_in_blocks(g, &dy, &w, &mut dx, nb).unwrap();
        Tolerance::for_f32_sum(g.out_channels() * g.kernel_len())
            .check("dx", &dx, &want)
            .unwrap_or_else(|e| panic!("{g:?} nb {nb}: {e}"));
        let mut want = vec![0.0; g.w_len()];
        reference::backward_filter(g, &x, &dy, &mut want).unwrap();
        let mut dw = vec![f32::NAN; g.w_len()];
        backward_filter_in_blocks(g, &x, &dy, &mut dw, nb).unwrap();
        Tolerance::for_f32_sum(g.batch() * g.output_spatial_len())
            .check("dw", &dw, &want)
            .unwrap_or_else(|e| panic!("{g:?} nb {nb}: {e}"));
    }
}
