//! deconvgemm: backward-data as the GEMM Wᵀ·dY whose C, (C/G·R) × (N·O), is never stored
//! whole: it is computed one C panel at a time into a per-thread buffer and each panel is added
//! into dx through the col2im map right away (the convgemm paper's Fig. 7, with the "one C
//! panel per thread" buffer instead of the micro-tile).
//!
//! A panel is a block of whole input channels (rows: channel × kernel tap) by a block of whole
//! output lines (columns: the innermost output dimension, possibly spanning several images). The
//! GEMM writes the panel with its dense store (straight from registers), and the scatter then
//! walks it line by line: for each (line, channel, tap) one contiguous run of the panel is added
//! to one line of dx, with the line's coordinates derived once per panel line and the tap's
//! clipping against the padding once per call (a tap table). With stride 1 the adds are
//! contiguous and vectorise.
//!
//! Two panels can land on the same element of dx (neighbouring taps and lines overlap), so the
//! paper unpacks sequentially. Here the work is split so that threads never share an element of
//! dx: by blocks of whole images when they divide evenly among the threads (columns of C for
//! different images hit different images of dx); otherwise, on 1-2-D layers whose line blocks
//! reach past the kernel, in two rounds over 2·threads blocks of output lines (even blocks, then
//! odd ones: two blocks of a round are one block apart, so their dx lines never meet; every
//! thread keeps the whole M of the GEMM and no dy column is packed twice); otherwise by blocks
//! of input channels, a few per thread, claimed in turn (rows of C for different channels hit
//! different planes of dx). Each block runs its own single-threaded GEMMs, all blocks of a round
//! in parallel.
//!
//! A pointwise layer (1×1 kernel, stride 1, no padding) has col2im = identity: dx of one image
//! and group is the dense product W_gᵀ·dy, stored by the GEMM straight into dx.

use core_blas::{DenseStore, MatMut, MatRef};

use crate::Result;
use crate::error::gemm_err;
use crate::geometry::{ConvGeometry, Dims3};
use crate::layout::{ChannelMajor, Columns, OneThread, with_panel};
use crate::ops::is_pointwise;
use crate::shares::share_out;

/// The C panel size the blocking aims at: about this many columns (rounded to whole output
/// lines) and at most this many floats (256 KiB, a quarter of the L2 of the machines we tune
/// on, so that the panel, the packed B block and dx's lines stay in L2 between the GEMM that
/// writes the panel and the scatter that reads it). A single line of one channel's taps is
/// always taken, even when larger.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PanelBlocking {
    pub(crate) cols: usize,
    pub(crate) floats: usize,
}

impl PanelBlocking {
    pub(crate) const DEFAULT: PanelBlocking = PanelBlocking {
        cols: 256,
        floats: 64 * 1024,
    };
}

/// Parts of the input channels per thread when the blocks go by channels: each thread claims
/// the next part when it ends one ([`share_out`]), so a thread slowed or started late by the
/// host leaves the others a part's time apart, not half the call's (C3D 64@8×56², 1 image, 2
/// threads: two halves of 32 channels ended 1-9 ms apart, session 37). Each part packs dy's
/// columns for its own panels, as each channel block of a half already did: with 8 channels
/// a part is one channel block (rows 8·27) where a half of 32 ran blocks of 10, 10, 10 and 2
/// channels. `probe_passes --threads 2`, C3D, 12 rotations of 20-call runs (quiet 08:52:55 UTC),
/// parts in all on 2 threads: 2 (one a thread, as before) 15.17 ms, 8 (this) 15.01 (0.986, 10 of
/// 12 faster), 16 15.73 (1.039).
const CHANNEL_PARTS: usize = 4;

/// Along the innermost dimension, one kernel tap reaches the output positions `lo..hi` of a
/// line (the others fall into the padding), starting at input position `first`.
#[derive(Clone, Copy, Debug)]
struct InnerRun {
    lo: usize,
    hi: usize,
    first: usize,
}

/// With stride 1 and 2 or 3 taps along the innermost dimension, the scatter adds a panel line's
/// taps into a dx line in one pass (`dx[x] += Σ_r src_r[x − offset_r]`, one load and store of
/// dx for all of them) over the input positions `xlo..xhi` every tap reaches, and the rest of
/// each tap's run on its own: `(r2, u, x, len)` pieces.
#[derive(Clone, Debug)]
struct Fused {
    xlo: usize,
    xhi: usize,
    edges: Vec<(usize, usize, usize, usize)>,
}

/// The kernel taps as the scatter needs them, built once per call.
#[derive(Clone, Debug)]
struct TapTable {
    /// Per (r0, r1): the input coordinates reached from output coordinate 0.
    outer: Vec<(isize, isize)>,
    /// Per r2.
    inner: Vec<InnerRun>,
    fused: Option<Fused>,
}

impl TapTable {
    fn new(d: &Dims3) -> TapTable {
        let outer = (0..d.kernel[0] * d.kernel[1])
            .map(|rr| {
                let (r0, r1) = (rr / d.kernel[1], rr % d.kernel[1]);
                (d.input_coord(0, 0, r0), d.input_coord(1, 0, r1))
            })
            .collect();
        let width = d.output[2];
        let inner: Vec<InnerRun> = (0..d.kernel[2])
            .map(|r2| {
                let valid = |u: usize| {
                    let i = d.input_coord(2, u, r2);
                    i >= 0 && i < d.input[2] as isize
                };
                let lo = (0..width).find(|&u| valid(u)).unwrap_or(width);
                let hi = (lo..width).find(|&u| !valid(u)).unwrap_or(width);
                let first = if lo < hi {
                    d.input_coord(2, lo, r2) as usize
                } else {
                    0
                };
                InnerRun { lo, hi, first }
            })
            .collect();
        let fused = (d.stride[2] == 1 && (2..=3).contains(&inner.len())).then(|| {
            let xlo = inner.iter().map(|t| t.first).max().unwrap_or(0);
            let xhi = inner
                .iter()
                .map(|t| t.first + (t.hi - t.lo))
                .min()
                .unwrap_or(0);
            // No position reached by every tap: an empty interior, whole runs as edges.
            let (xlo, xhi) = if xlo < xhi && inner.iter().all(|t| t.lo < t.hi) {
                (xlo, xhi)
            } else {
                (0, 0)
            };
            let mut edges = Vec::new();
            for (r2, t) in inner.iter().enumerate() {
                let end = t.first + (t.hi - t.lo);
                let pieces = if xlo < xhi {
                    [(t.first, xlo.min(end)), (xhi.max(t.first), end)]
                } else {
                    [(t.first, end), (0, 0)]
                };
                for (x0, x1) in pieces {
                    if x0 < x1 {
                        edges.push((r2, t.lo + (x0 - t.first), x0, x1 - x0));
                    }
                }
            }
            Fused { xlo, xhi, edges }
        });
        TapTable {
            outer,
            inner,
            fused,
        }
    }
}

/// `dst[x] += Σ_r src[r][x]` in one pass over `dst` (the sources are at least as long).
#[inline(always)]
fn add_sum<const K: usize>(dst: &mut [f32], src: [&[f32]; K]) {
    let n = dst.len();
    let src = src.map(|s| &s[..n]);
    for x in 0..n {
        let mut acc = dst[x];
        for s in &src {
            acc += s[x];
        }
        dst[x] = acc;
    }
}

/// dx as a raw pointer shared by the blocks, which write disjoint elements.
#[derive(Clone, Copy)]
struct Dx {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the blocks that hold a `Dx` at the same time cover disjoint (image, channel) sets of
// dx (see `backward_data`), so no element is written by two threads; the `&mut dx` borrow held
// by `backward_data` outlives them.
unsafe impl Sync for Dx {}

/// Everything a block needs, shared by all blocks of one call.
struct Plan<'a> {
    g: &'a ConvGeometry,
    d: Dims3,
    taps: TapTable,
    dy: &'a [f32],
    w: &'a [f32],
    dx: Dx,
    blocking: PanelBlocking,
}

impl Plan<'_> {
    /// Images `n_lo..n_hi`, input channels `c_lo..c_hi` of group `grp`, output lines
    /// `l_lo..l_hi` of those images (counted from image `n_lo`'s first line; `None`: all):
    /// panels of whole output lines × whole channels, each computed by a single-threaded GEMM
    /// and scattered into dx.
    fn block(
        &self,
        grp: usize,
        (n_lo, n_hi): (usize, usize),
        (c_lo, c_hi): (usize, usize),
        line_range: Option<(usize, usize)>,
    ) -> Result<()> {
        let g = self.g;
        let d = &self.d;
        let (cg, kg, rlen) = (
            g.in_channels_per_group(),
            g.out_channels_per_group(),
            g.kernel_len(),
        );
        let (olen, width) = (g.output_spatial_len(), d.output[2]);
        let lines_per_image = olen / width;
        let (l_lo, l_hi) = line_range.unwrap_or((0, (n_hi - n_lo) * lines_per_image));
        let line_block = (self.blocking.cols / width).clamp(1, l_hi - l_lo);
        let cols_max = line_block * width;
        let ch_block = (self.blocking.floats / (cols_max * rlen)).clamp(1, c_hi - c_lo);
        let b = ChannelMajor {
            data: self.dy,
            channels: g.out_channels(),
            plane: olen,
            c0: grp * kg,
            rows: kg,
            n0: 0,
            batch: g.batch(),
        };
        let wg = &self.w[grp * kg * cg * rlen..][..kg * cg * rlen];
        with_panel(ch_block * rlen * cols_max, |panel| {
            let mut one = |l0: usize, c0: usize| -> Result<()> {
                let nl = line_block.min(l_hi - l0);
                let cols = nl * width;
                let j0 = n_lo * olen + l0 * width;
                let bcols = Columns { b: &b, j0, cols };
                let nc = ch_block.min(c_hi - c0);
                let rows = nc * rlen;
                // A = rows c0·R.. of W_gᵀ (W_g is Kg × (Cg·R) row-major).
                let a =
                    MatRef::new("w", &wg[c0 * rlen..], rows, kg, 1, cg * rlen).map_err(gemm_err)?;
                let c = MatMut::row_major("panel", &mut panel[..rows * cols], rows, cols, cols)
                    .map_err(gemm_err)?;
                let mut store = OneThread(DenseStore::new(c, 1.0, 0.0));
                core_blas::gemm_with(&a, &bcols, &mut store).map_err(gemm_err)?;
                self.scatter(
                    &panel[..rows * cols],
                    grp,
                    c0,
                    nc,
                    n_lo * lines_per_image + l0,
                    nl,
                );
                Ok(())
            };
            // Lines outer, channels inner: the B block (dy's columns) is reused from cache by
            // every channel block, and W is small enough to stay cached (measured: the other
            // order is 0-13% slower on the layers).
            for l0 in (l_lo..l_hi).step_by(line_block) {
                for c0 in (c_lo..c_hi).step_by(ch_block) {
                    one(l0, c0)?;
                }
            }
            Ok(())
        })
    }

    /// Zeroes the planes of dx that block (`grp`, images `n_lo..n_hi`, channels `c_lo..c_hi`)
    /// adds into, before its first panel.
    fn zero(&self, grp: usize, (n_lo, n_hi): (usize, usize), (c_lo, c_hi): (usize, usize)) {
        let g = self.g;
        let (c, cg, plane) = (
            g.in_channels(),
            g.in_channels_per_group(),
            g.input_spatial_len(),
        );
        let len = (c_hi - c_lo) * plane;
        for n in n_lo..n_hi {
            let at = (n * c + grp * cg + c_lo) * plane;
            assert!(at + len <= self.dx.len, "a block's planes lie inside dx");
            // SAFETY: `at .. at + len` lies inside dx (asserted) and holds the planes of channels
            // `c_lo..c_hi` of group `grp` in image `n`: only this block's (image, channel) set,
            // which no other block running at the same time touches (see `Dx`).
            let planes = unsafe { std::slice::from_raw_parts_mut(self.dx.ptr.add(at), len) };
            planes.fill(0.0);
        }
    }

    /// Adds a panel (rows: channels `c0..c0 + nc` × taps; columns: global output lines
    /// `line0..line0 + nl`) into dx through the col2im map.
    fn scatter(&self, panel: &[f32], grp: usize, c0: usize, nc: usize, line0: usize, nl: usize) {
        let g = self.g;
        let d = &self.d;
        let width = d.output[2];
        let cols = nl * width;
        let (k2, ilen) = (d.kernel[2], g.input_spatial_len());
        let rlen = self.taps.outer.len() * k2;
        let lines_per_image = d.output[0] * d.output[1];
        let (s2, in0, in1, in2) = (
            d.stride[2],
            d.input[0] as isize,
            d.input[1] as isize,
            d.input[2],
        );
        let chan0 = grp * g.in_channels_per_group() + c0;
        for t in 0..nl {
            let line = line0 + t;
            let (n, li) = (line / lines_per_image, line % lines_per_image);
            let (o0, o1) = (li / d.output[1], li % d.output[1]);
            let (b0, b1) = ((o0 * d.stride[0]) as isize, (o1 * d.stride[1]) as isize);
            for cc in 0..nc {
                let plane = (n * g.in_channels() + chan0 + cc) * ilen;
                let rows = &panel[cc * rlen * cols + t * width..];
                for (rr, &(off0, off1)) in self.taps.outer.iter().enumerate() {
                    let (i0, i1) = (b0 + off0, b1 + off1);
                    if i0 < 0 || i0 >= in0 || i1 < 0 || i1 >= in1 {
                        continue;
                    }
                    // The panel rows of taps (r0, r1, 0..k2), this line's columns.
                    let src = |r2: usize| &rows[(rr * k2 + r2) * cols..][..width];
                    let at = plane + (i0 as usize * d.input[1] + i1 as usize) * in2;
                    debug_assert!(at + in2 <= self.dx.len);
                    // SAFETY: `at .. at + input[2]` is one line of one plane of dx: image `n` <
                    // N, channel < C, (i0, i1) checked against the input just above (asserted
                    // in debug builds). Only this block writes this (image, channel) plane now
                    // (see `Dx`).
                    let dst = unsafe { std::slice::from_raw_parts_mut(self.dx.ptr.add(at), in2) };
                    match &self.taps.fused {
                        Some(f) => {
                            let (xlo, xhi) = (f.xlo, f.xhi);
                            if xlo < xhi {
                                let inner = &self.taps.inner;
                                let from = |r2: usize| {
                                    let tap = &inner[r2];
                                    &src(r2)[tap.lo + (xlo - tap.first)..]
                                };
                                let dst = &mut dst[xlo..xhi];
                                if k2 == 3 {
                                    add_sum(dst, [from(0), from(1), from(2)]);
                                } else {
                                    add_sum(dst, [from(0), from(1)]);
                                }
                            }
                            for &(r2, u, x, len) in &f.edges {
                                add_sum(&mut dst[x..x + len], [&src(r2)[u..]]);
                            }
                        }
                        None => {
                            for (r2, tap) in self.taps.inner.iter().enumerate() {
                                if tap.lo >= tap.hi {
                                    continue;
                                }
                                let run = &src(r2)[tap.lo..tap.hi];
                                let dst = &mut dst[tap.first..];
                                if s2 == 1 {
                                    add_sum(&mut dst[..run.len()], [run]);
                                } else {
                                    for (x, &v) in dst.iter_mut().step_by(s2).zip(run) {
                                        *x += v;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// dx = backward-data(dy, w) by deconvgemm (dx is overwritten). Inputs are validated by the
/// caller.
pub(crate) fn backward_data(g: &ConvGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
    backward_data_with(g, dy, w, dx, PanelBlocking::DEFAULT)
}

/// [`backward_data`] with a given panel blocking (tests force many small panels).
pub(crate) fn backward_data_with(
    g: &ConvGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    blocking: PanelBlocking,
) -> Result<()> {
    if is_pointwise(g) {
        return pointwise(g, dy, w, dx);
    }
    let (cg, batch) = (g.in_channels_per_group(), g.batch());
    let threads = rayon::current_num_threads().max(1);
    // Blocks that never share an element of dx: whole images when they divide evenly among
    // the threads, otherwise whole channels ([`CHANNEL_PARTS`] parts per thread, claimed in
    // turn).
    let by_images = threads == 1 || batch % threads == 0 || (cg % threads != 0 && batch >= cg);
    let parts = if by_images {
        threads.min(batch)
    } else {
        (CHANNEL_PARTS * threads).min(cg)
    };
    // Else, on 1-2-D layers, two rounds over 2·threads blocks of output lines (the even blocks,
    // then the odd ones): blocks of one round are a block apart, so their dx lines never meet
    // when a block's lines reach past the kernel ((k − 1)·dil < (h + 1)·s along the lines'
    // dimension); every thread keeps all channels (the whole M of the GEMM, no B packed twice).
    let d = g.dims3();
    let lines = batch * g.output_spatial_len() / d.output[2];
    let nb = 2 * threads;
    let coloured = !by_images
        && g.rank() <= 2
        && (d.kernel[1] - 1) * d.dilation[1] < (lines / nb + 1) * d.stride[1];
    // dx is zeroed before any panel is added. On one thread up front; on several, no serial
    // step before the blocks (it would let the other worker fall asleep, see `crate::shares`):
    // each block zeroes its own part of dx, or (line blocks, which share dx's lines across
    // rounds) a first parallel step zeroes one chunk of dx per thread.
    if threads == 1 {
        dx.fill(0.0);
    } else if coloured {
        let chunk = dx.len().div_ceil(threads).max(1);
        share_out(dx.chunks_mut(chunk).collect(), |_, part: &mut [f32]| {
            part.fill(0.0);
            Ok(())
        })?;
    }
    let plan = Plan {
        g,
        d: g.dims3(),
        taps: TapTable::new(&g.dims3()),
        dy,
        w,
        dx: Dx {
            ptr: dx.as_mut_ptr(),
            len: dx.len(),
        },
        blocking,
    };
    if coloured {
        for round in 0..2 {
            share_out(vec![(); g.groups() * threads], |item, ()| -> Result<()> {
                let (grp, b) = (item / threads, 2 * (item % threads) + round);
                let (l0, l1) = (lines * b / nb, lines * (b + 1) / nb);
                if l0 == l1 {
                    return Ok(());
                }
                plan.block(grp, (0, batch), (0, cg), Some((l0, l1)))
            })?;
        }
        return Ok(());
    }
    let run = |item: usize| -> Result<()> {
        let (grp, part) = (item / parts, item % parts);
        let cut = |len: usize| (len * part / parts, len * (part + 1) / parts);
        let (images, channels) = if by_images {
            (cut(batch), (0, cg))
        } else {
            ((0, batch), cut(cg))
        };
        if images.0 == images.1 || channels.0 == channels.1 {
            return Ok(());
        }
        if threads > 1 {
            plan.zero(grp, images, channels);
        }
        plan.block(grp, images, channels, None)
    };
    let items = g.groups() * parts;
    share_out(vec![(); items], |item, ()| run(item))
}

/// Pointwise layers: dx[n, group] = W_gᵀ · dy[n, group], a dense product per image and group
/// stored straight into dx.
fn pointwise(g: &ConvGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
    let (cg, kg, plane) = (
        g.in_channels_per_group(),
        g.out_channels_per_group(),
        g.output_spatial_len(),
    );
    let groups = g.groups();
    let one = |idx: usize, dxi: &mut [f32], serial: bool| -> Result<()> {
        let grp = idx % groups;
        // idx = n·G + grp, and dy's (image, group) block has the same index.
        let a =
            MatRef::new("w", &w[grp * kg * cg..][..kg * cg], cg, kg, 1, cg).map_err(gemm_err)?;
        let b = MatRef::row_major(
            "dy",
            &dy[idx * kg * plane..][..kg * plane],
            kg,
            plane,
            plane,
        )
        .map_err(gemm_err)?;
        let c = MatMut::row_major("dx", dxi, cg, plane, plane).map_err(gemm_err)?;
        let mut store = DenseStore::new(c, 1.0, 0.0);
        if serial {
            core_blas::gemm_with(&a, &b, &mut OneThread(store))
        } else {
            core_blas::gemm_with(&a, &b, &mut store)
        }
        .map_err(gemm_err)
    };
    let items = g.batch() * groups;
    let threads = rayon::current_num_threads().max(1);
    if threads > 1 && items >= threads {
        // The (image, group) products claimed in turn, each on one thread, the threads
        // leaving together (`share_out`): a thread slowed by the host runs fewer of them, where
        // one contiguous run per thread made the call wait for the slow run. Level on a noisy
        // host, and simpler: ResNet-50 1×1 256→64 @56² (batch 8), Emerald Rapids, `probe_passes
        // --scale --threads 2 ... 20 bwd-data/deconvgemm` (t1 / t2 pair medians), A B B A
        // rounds at quiet 17:29:05, 17:47 and 18:07:02 UTC: runs 1.556, 1.528, 1.604, 1.117,
        // 1.939, 1.073, 1.175, 1.492, 1.894, 1.989, 1.442, 1.554, 1.991, 1.309, 1.811, 1.925
        // (median 1.55); products claimed in turn 1.578, 1.836, 1.935, 1.580, 1.613, 1.091,
        // 1.993, 1.773, 1.911, 1.600, 1.336, 1.715, 1.476, 1.685, 1.547, 1.476 (1.60); 10 of
        // 16 rounds higher.
        share_out(
            dx.chunks_mut(cg * plane).collect(),
            |idx, dxi: &mut [f32]| one(idx, dxi, true),
        )
    } else {
        // Few products: each one uses every thread (core-blas splits it).
        dx.chunks_mut(cg * plane)
            .enumerate()
            .try_for_each(|(idx, dxi)| one(idx, dxi, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{Tolerance, uniform};

    /// Tiny panels: many line blocks (some crossing images, some shorter at the end) and many
    /// channel blocks per call, on strided, dilated, padded, grouped 1-3-D geometries, plus a
    /// pointwise one; on 1, 2 and 3 threads (blocks by images, by channels and by line blocks
    /// in two rounds; dx starts as NaN, so a part of dx no block zeroes shows).
    #[test]
    fn small_panels_match_the_reference() {
        let geoms = [
            ConvGeometry::new(3, 5, 4, &[7, 9], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 6, 4, &[11, 10], &[3, 2])
                .unwrap()
                .with_stride(&[2, 3])
                .unwrap()
                .with_padding_per_side(&[2, 0], &[1, 2])
                .unwrap(),
            ConvGeometry::new(2, 4, 6, &[5, 6, 7], &[3, 3, 3])
                .unwrap()
                .with_dilation(&[1, 2, 1])
                .unwrap()
                .with_padding(&[1])
                .unwrap()
                .with_groups(2)
                .unwrap(),
            ConvGeometry::new(4, 3, 3, &[13], &[4])
                .unwrap()
                .with_stride(&[3])
                .unwrap()
                .with_padding(&[2])
                .unwrap(),
            // Two taps along the line (fused pass), asymmetric padding.
            ConvGeometry::new(2, 3, 2, &[6, 5], &[2, 2])
                .unwrap()
                .with_padding_per_side(&[1, 1], &[0, 0])
                .unwrap(),
            // Dilation 2 on a 3-wide line: no position is reached by all three taps (the
            // fused pass has an empty interior, every run is an edge).
            ConvGeometry::from_parts(1, 2, 3, &[4, 3], &[3, 3], &[1], &[2], &[2], &[2], 1).unwrap(),
            ConvGeometry::new(3, 6, 4, &[5, 7], &[1, 1])
                .unwrap()
                .with_groups(2)
                .unwrap(),
            // One image, 3-D: blocks by channels on 2 and 3 threads (each zeroes its planes).
            ConvGeometry::new(1, 4, 3, &[4, 5, 6], &[3, 3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            // By channels in uneven parts: 8 parts of 1-2 channels on 2 threads, 10 of 1 on 3.
            ConvGeometry::new(1, 10, 3, &[3, 4, 5], &[3, 3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
        ];
        let blockings = [
            PanelBlocking { cols: 1, floats: 1 },
            PanelBlocking {
                cols: 20,
                floats: 200,
            },
            PanelBlocking {
                cols: 1000,
                floats: 10_000,
            },
        ];
        for g in &geoms {
            let (dy, w) = (uniform(7, g.y_len()), uniform(8, g.w_len()));
            let mut want = vec![0f32; g.x_len()];
            reference::backward_data(g, &dy, &w, &mut want).unwrap();
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                for &bl in &blockings {
                    let mut dx = vec![f32::NAN; g.x_len()];
                    pool.install(|| backward_data_with(g, &dy, &w, &mut dx, bl))
                        .unwrap();
                    Tolerance::for_f32_sum(g.out_channels_per_group() * g.kernel_len())
                        .check(&format!("{g:?} {bl:?} {threads} threads"), &dx, &want)
                        .unwrap();
                }
            }
        }
    }
}
