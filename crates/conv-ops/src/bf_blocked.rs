//! The transposed convgemm's B = im2col(x)ᵀ with its columns in channel-block order, packed
//! from a position-major copy of 16 channels (no per-tap transpose).
//!
//! [`Im2colTB`](crate::Im2colTB) orders the columns of B as dW does, (channel, tap): a panel
//! row then holds a few channels × every tap, and each (channel, tap) lane reads its own
//! stretch of the channel plane, so the packer transposes every input value once per tap.
//! Here the columns are ordered (channel block of [`GROUP`], tap, channel within the block):
//! 16 consecutive lanes of a panel are 16 channels of one tap, i.e. one input position of 16
//! channels. The packer transposes the input lines a packed block reads into a per-thread
//! position-major copy of those 16 channels once (`copy[line][position][16]`), and every
//! (tap, row) of the panel is then one 16-value copy from it (or zeros in the padding).
//! [`unblock`] puts dW's columns back in (channel, tap) order afterwards.

use std::cell::RefCell;

use core_blas::PackB;

use crate::geometry::ConvGeometry;
use crate::source::{Run, Seg, Source, micro_panels};

/// Channels per block: the lanes of one position in the copy.
pub(crate) const GROUP: usize = 16;

/// im2col(x)ᵀ of one group as a virtual `(N·O) × (C/G·R)` matrix whose column
/// `(c / GROUP)·R·GROUP + tap·GROUP + c % GROUP` is im2col(x)ᵀ's column `c·R + tap`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Im2colTBBlocked<'a> {
    src: Source<'a>,
    rows: usize,
    cols: usize,
}

/// Whether the blocked packer takes the layer: channels per group a multiple of [`GROUP`] and
/// output lines of at least [`MIN_LINE`] positions.
pub(crate) fn applies(g: &ConvGeometry) -> bool {
    g.in_channels_per_group().is_multiple_of(GROUP) && g.dims3().output[2] >= MIN_LINE
}

/// Shorter output lines keep [`Im2colTB`](crate::Im2colTB) (its cached chunks): the blocked
/// packer's per-run work does not pay there. Zen 4 (AVX-512), `probe_passes ... 5
/// bwd-filter/convgemm-trans`, base / blocked, 3 alternations, quiet 19:16:12-19:16:19 UTC, ms:
/// ResNet-50's 256@14² 17.84 / 17.95, 17.90 / 18.07, 17.91 / 17.91 (level), 512@7² 17.77 /
/// 19.57, 17.75 / 19.72, 17.67 / 19.35 (1.10× slower).
const MIN_LINE: usize = 16;

#[derive(Default)]
struct Scratch {
    runs: Vec<Run>,
    segs: Vec<Seg>,
    /// The input lines (offset of the line in channel plane 0 of x) the block reads, sorted.
    lines: Vec<usize>,
    /// Per segment, its line's index in `lines` (unused for empty segments).
    slot: Vec<u32>,
    /// `lines.len()` lines of `input[2]` positions × [`GROUP`] channels, position-major.
    copy: Vec<f32>,
}

thread_local! {
    /// The block's runs, segments and position-major copy: no allocation in steady state.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl<'a> Im2colTBBlocked<'a> {
    /// Group `grp` of x (validated by the caller: `x.len() == g.x_len()`, [`applies`]).
    pub(crate) fn new(g: &ConvGeometry, grp: usize, x: &'a [f32]) -> Self {
        debug_assert!(applies(g));
        Im2colTBBlocked {
            src: Source::new(g, grp, x),
            rows: g.batch() * g.output_spatial_len(),
            cols: g.in_channels_per_group() * g.kernel_len(),
        }
    }
}

/// Copies lanes `0..n` (`n <= GROUP`) from `src` to `dst`.
///
/// # Safety
/// `src` valid for `n` reads, `dst` for `n` writes; no overlap.
#[inline(always)]
unsafe fn copy_lanes(dst: *mut f32, src: *const f32, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if n == GROUP {
            let v = src.cast::<[f32; GROUP]>().read_unaligned();
            dst.cast::<[f32; GROUP]>().write_unaligned(v);
        } else {
            for l in 0..n {
                *dst.add(l) = *src.add(l);
            }
        }
    }
}

/// Zeroes lanes `0..n` (`n <= GROUP`) at `dst`.
///
/// # Safety
/// `dst` valid for `n` writes.
#[inline(always)]
unsafe fn zero_lanes(dst: *mut f32, n: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if n == GROUP {
            dst.cast::<[f32; GROUP]>().write_unaligned([0.0; GROUP]);
        } else {
            for l in 0..n {
                *dst.add(l) = 0.0;
            }
        }
    }
}

impl PackB for Im2colTBBlocked<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        let src = &self.src;
        let (stride, width, rlen) = (src.d.stride[2], src.d.input[2], src.rlen);
        let line_len = width * GROUP;
        let gemm = core_blas::Gemm::global().ok();
        SCRATCH.with_borrow_mut(|s| {
            let Scratch {
                runs,
                segs,
                lines,
                slot,
                copy,
            } = s;
            src.runs(pc, kc, runs);
            src.segments(runs, segs);
            let count = runs.len();
            // The lines the block reads (every segment lies on one input line).
            lines.clear();
            lines.extend(
                segs.iter()
                    .filter(|g| g.hi > g.lo)
                    .map(|g| g.at - g.at % width),
            );
            lines.sort_unstable();
            lines.dedup();
            slot.clear();
            slot.extend(segs.iter().map(|g| {
                if g.hi > g.lo {
                    lines.partition_point(|&l| l < g.at - g.at % width) as u32
                } else {
                    0
                }
            }));
            copy.resize(lines.len() * line_len, 0.0);
            let mut copied = usize::MAX;
            let mut from: [&[f32]; GROUP] = [&[]; GROUP];
            for (j0, w, panel) in micro_panels(dst, kc, nr, jc, nc) {
                debug_assert!(panel.len() >= kc * nr);
                let base = panel.as_mut_ptr();
                let mut l = 0;
                while l < nr {
                    if l >= w {
                        // Past the last column: zero lanes.
                        for p in 0..kc {
                            panel[p * nr + l..p * nr + nr].fill(0.0);
                        }
                        break;
                    }
                    let j = j0 + l;
                    let (cb, tap, lane0) = (j / (rlen * GROUP), (j / GROUP) % rlen, j % GROUP);
                    let n = (GROUP - lane0).min(w - l).min(nr - l);
                    if cb != copied {
                        // The position-major copy of channels cb·16.. on the block's lines.
                        for (line, out) in lines.iter().zip(copy.chunks_exact_mut(line_len)) {
                            for (c, f) in from.iter_mut().enumerate() {
                                *f = &src.x[src.plane(cb * GROUP + c) + line..][..width];
                            }
                            let done = gemm.is_some_and(|g| {
                                g.transpose_lanes(out, GROUP, &from, width, 1).is_ok()
                            });
                            if !done {
                                for (t, row) in out.chunks_exact_mut(GROUP).enumerate() {
                                    for (v, f) in row.iter_mut().zip(&from) {
                                        *v = f[t];
                                    }
                                }
                            }
                        }
                        copied = cb;
                    }
                    for (i, run) in runs.iter().enumerate() {
                        let g = &segs[tap * count + i];
                        let (lo, hi) = if g.hi > g.lo { (g.lo, g.hi) } else { (0, 0) };
                        let first = g.at % width;
                        let at = slot[tap * count + i] as usize * line_len + first * GROUP + lane0;
                        // SAFETY: rows `run.start + t < kc` (runs tile `0..kc`) and lanes
                        // `l + n <= nr` keep writes inside the `kc · nr` panel; a readable
                        // position `first + u·stride`, `u < hi − lo`, lies on its input line
                        // (`segments` clips every run to the input), so `(first + u·stride)·16
                        // + lane0 + n <= line_len` stays inside its line of the copy.
                        unsafe {
                            let d = base.add(run.start * nr + l);
                            for t in 0..lo {
                                zero_lanes(d.add(t * nr), n);
                            }
                            if hi > lo {
                                debug_assert!(
                                    (first + (hi - lo - 1) * stride + 1) * GROUP <= line_len
                                        && at + (hi - lo - 1) * stride * GROUP + n <= copy.len()
                                );
                                let from = copy.as_ptr().add(at);
                                for u in 0..hi - lo {
                                    copy_lanes(
                                        d.add((lo + u) * nr),
                                        from.add(u * stride * GROUP),
                                        n,
                                    );
                                }
                            }
                            for t in hi..run.len {
                                zero_lanes(d.add(t * nr), n);
                            }
                        }
                    }
                    l += n;
                }
            }
        });
    }
}

/// The GEMM context for dW's product over [`Im2colTBBlocked`] (`m` rows: K/G, `n` columns:
/// C/G·R): with one A block (`m` at most MC), MC raised to at least `n` rounded up to the tile
/// width (the A block stays the same). With one A block core-blas
/// keeps the B block in L2, NC at most MC·KC/KC_max columns; the packer then rebuilds a
/// block's position-major copy for every such column block (each copy covers 16 channels,
/// while a 336-wide B block of C3D's 64@8×56² covers fewer than 16 channels × 27 taps, and
/// the block order is columns outermost). With MC ≥ n the B block spans all columns and each
/// copy is made once per k block. Zen 4 (AVX-512), `probe_passes 1 64 64 8x56x56 3x3x3 1 1 3
/// bwd-filter/convgemm-trans`, `CORE_BLAS_MC` default (336) / 672 / 1344 / 1800, quiet
/// 19:48:33 UTC, medians of 3: 59.44 / 57.60 / 56.24 / 55.41 ms.
pub(crate) fn gemm(m: usize, n: usize) -> crate::Result<core_blas::Gemm> {
    let gemm = *core_blas::Gemm::global().map_err(crate::error::gemm_err)?;
    let bs = gemm.block_sizes();
    if m > bs.mc {
        return Ok(gemm);
    }
    let nr = gemm.tile().1.max(1);
    gemm.with_block_sizes(core_blas::BlockSizes {
        mc: bs.mc.max(n.div_ceil(nr) * nr),
        ..bs
    })
    .map_err(crate::error::gemm_err)
}

/// dW of one group from the blocked column order back to (channel, tap): `dw` is `k` rows of
/// `c·r` values. Each block of 16 channels is an `r × 16` transpose (core-blas's
/// `transpose_lanes`, through a copy of the block); rows split across threads when dW is large.
pub(crate) fn unblock(dw: &mut [f32], k: usize, c: usize, r: usize) {
    let len = c * r;
    let gemm = core_blas::Gemm::global().ok();
    // `tmp`: one block's copy, allocated once per thread (not per row).
    let row_fn = |tmp: &mut Vec<f32>, row: &mut [f32]| {
        for blk in row.chunks_exact_mut(r * GROUP) {
            tmp.copy_from_slice(blk);
            let done = r <= MAX_UNBLOCK_TAPS
                && gemm.is_some_and(|g| {
                    let mut from: [&[f32]; MAX_UNBLOCK_TAPS] = [&[]; MAX_UNBLOCK_TAPS];
                    for (f, lanes) in from.iter_mut().zip(tmp.chunks_exact(GROUP)) {
                        *f = lanes;
                    }
                    // blk[l·r + tap] = tmp[tap·16 + l]
                    g.transpose_lanes(blk, r, &from[..r], GROUP, 1).is_ok()
                });
            if !done {
                for (tap, lanes) in tmp.chunks_exact(GROUP).enumerate() {
                    for (l, &v) in lanes.iter().enumerate() {
                        blk[l * r + tap] = v;
                    }
                }
            }
        }
    };
    let dw = &mut dw[..k * len];
    let new_tmp = || vec![0f32; r * GROUP];
    if rayon::current_num_threads() > 1 && dw.len() >= PAR_UNBLOCK_MIN {
        use rayon::prelude::*;
        dw.par_chunks_mut(len).for_each_init(new_tmp, row_fn);
    } else {
        let mut tmp = new_tmp();
        dw.chunks_mut(len).for_each(|row| row_fn(&mut tmp, row));
    }
}

/// Kernels of at most this many taps take the vectorised transpose in [`unblock`] (3×3×3 is
/// 27); larger ones a scalar loop.
const MAX_UNBLOCK_TAPS: usize = 32;

/// dW sizes from which [`unblock`] splits its rows across threads.
const PAR_UNBLOCK_MIN: usize = 1 << 16;

#[cfg(test)]
mod tests {
    use crate::ConvGeometry;

    /// Channels per group a multiple of 16 (the blocked packer): odd sizes, strides 1-3,
    /// padding on either side, dilation, groups, 1-3 spatial dimensions, batch 1-3, lines
    /// shorter and longer than a block, kernels of up to 35 taps; on 1 and 2 threads, against the reference.
    #[test]
    fn blocked_columns_match_the_reference() {
        let geoms = [
            ConvGeometry::new(3, 16, 5, &[41], &[3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 32, 6, &[9, 61], &[3, 5])
                .unwrap()
                .with_stride(&[1, 2])
                .unwrap()
                .with_padding_per_side(&[2, 0], &[1, 2])
                .unwrap()
                .with_groups(2)
                .unwrap(),
            ConvGeometry::new(1, 16, 5, &[7, 50], &[2, 3])
                .unwrap()
                .with_stride(&[1, 3])
                .unwrap()
                .with_dilation(&[1, 2])
                .unwrap()
                .with_padding(&[2])
                .unwrap(),
            ConvGeometry::new(2, 32, 3, &[3, 5, 20], &[2, 3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(3, 48, 9, &[5, 17], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 16, 4, &[23, 33], &[3, 3])
                .unwrap()
                .with_stride(&[2, 2])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            // 35 taps: the scalar unblock.
            ConvGeometry::new(2, 16, 3, &[9, 18], &[7, 5])
                .unwrap()
                .with_padding(&[2])
                .unwrap(),
            ConvGeometry::new(1, 64, 8, &[30, 30], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
        ];
        for g in &geoms {
            assert!(super::applies(g), "{g:?}");
            crate::convgemm_trans::check_against_reference_on_1_and_2_threads(g);
        }
    }
}
