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
//! Kernels with more than one plane (3-D) read every input line from the blocks of several
//! output planes: there x is copied whole once per product instead ([`position_major`],
//! [`whole_copy`]). [`unblock`] puts dW's columns back in (channel, tap) order afterwards.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use core_blas::{CHUNK_LANES, Chunk, ConvPack, ConvPanel, PackA, PackB};

use crate::geometry::ConvGeometry;
use crate::im2col::split3;
use crate::source::{Run, Seg, Source, micro_panels};

/// Channels per block: the lanes of one position in the copy.
pub(crate) const GROUP: usize = 16;

/// im2col(x)ᵀ of one group as a virtual `(N·O) × (C/G·R)` matrix whose column
/// `(c / GROUP)·R·GROUP + tap·GROUP + c % GROUP` is im2col(x)ᵀ's column `c·R + tap`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Im2colTBBlocked<'a> {
    src: Source<'a>,
    /// The group's whole position-major copy ([`position_major`]) and its layout; without
    /// it, each block's lines are copied into the thread's scratch.
    whole: Option<(&'a [f32], Layout)>,
    rows: usize,
    cols: usize,
    /// This instance's key for the thread's copy.
    id: u64,
}

/// Whether the blocked packer takes the layer: channels per group a multiple of [`GROUP`] and
/// output lines of at least [`MIN_LINE`] positions.
pub(crate) fn applies(g: &ConvGeometry) -> bool {
    g.in_channels_per_group().is_multiple_of(GROUP) && g.dims3().output[2] >= MIN_LINE
}

/// Whether [`Im2colTBBlocked`] reads a whole copy of x made once per product
/// ([`position_major`]) rather than copying each block's lines: kernels of more than one plane,
/// whose blocks (whole output lines of one output plane) read every input line again for each
/// of the kernel's planes (3 times on a 3×3×3 kernel, 3.4 with the halo lines), where the whole
/// copy transposes it once (perf, C3D, quiet 04:26:53 UTC: the transposes 4.8% → 3.0% of the
/// samples; the copy is written to memory and read back from L3). 2-D kernels read each line
/// from one block (and its neighbours' halo), and there the block's copy, written to L2 and
/// read back from there, is level or faster. Zen 4 (AVX-512), `probe_passes ... 5
/// bwd-filter/convgemm-trans`, block copies / whole copy, medians (pair-ratio median): C3D
/// 64@8×56² quiet 04:26:53 UTC 53.98 / 52.49 ms (0.975, 8 pairs), 04:33:39 54.81 / 53.39,
/// 04:44:50 51.67 / 50.60 (0.982, 6 pairs); the whole copy on 2-D layers (quiet 04:22:41):
/// ResNet-50 64@56² 18.75 / 18.97 (1.024), VGG 64@224² 41.16 / 41.08 (0.989).
pub(crate) fn whole_copy(g: &ConvGeometry) -> bool {
    applies(g) && g.dims3().kernel[0] > 1
}

/// How [`position_major`]'s copy of one group of x is laid out: per block of [`GROUP`]
/// channels, per image and input plane (the outer input coordinate), `rows` lines of
/// `input[2]` positions × [`GROUP`] channels: `z_lo` zero lines, the plane's `input[1]` lines,
/// `z_hi` zero lines (the padding lines the rows of a fused panel step through).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    z_lo: usize,
    z_hi: usize,
    /// Lines per input plane: `z_lo + input[1] + z_hi`.
    rows: usize,
    /// Values of one line: `input[2] · GROUP`.
    line_len: usize,
    /// Values of one channel block: images × planes × `rows` lines.
    block_len: usize,
}

impl Layout {
    /// The copy's layout for `g` (one group; its channel blocks: `C/G / GROUP`).
    pub(crate) fn new(g: &ConvGeometry) -> Self {
        let d = g.dims3();
        let (z_lo, z_hi) = zero_lines(&d);
        let rows = z_lo + d.input[1] + z_hi;
        let line_len = d.input[2] * GROUP;
        Layout {
            z_lo,
            z_hi,
            rows,
            line_len,
            block_len: g.batch() * d.input[0] * rows * line_len,
        }
    }

    /// Values of the whole copy of one group.
    pub(crate) fn len(&self, g: &ConvGeometry) -> usize {
        g.in_channels_per_group() / GROUP * self.block_len
    }

    /// The row, within a channel block, of input line `i1` (`-z_lo .. input[1] + z_hi`: a
    /// zero line outside the plane) of plane `plane` (image · planes + input plane).
    #[inline]
    fn row(&self, plane: usize, i1: isize) -> usize {
        (plane * self.rows + self.z_lo).wrapping_add_signed(i1)
    }
}

/// The zero lines a copy needs before and after each input plane's lines: the padding lines
/// the rows of a fused panel step through.
fn zero_lines(d: &crate::geometry::Dims3) -> (usize, usize) {
    let reach = (d.output[1] - 1) * d.stride[1] + (d.kernel[1] - 1) * d.dilation[1];
    (d.pad[1], (reach + 1).saturating_sub(d.pad[1] + d.input[1]))
}

/// The position-major copy of group `grp` of x into `copy` (at least [`Layout::len`] values):
/// every input line of 16 channels transposed once (core-blas's lane transposes), the zero
/// lines filled; channel blocks over threads.
pub(crate) fn position_major(g: &ConvGeometry, grp: usize, x: &[f32], copy: &mut [f32]) {
    let lay = Layout::new(g);
    let src = Source::new(g, grp, x);
    let d = g.dims3();
    let (width, lines) = (d.input[2], d.input[1]);
    let gemm = core_blas::Gemm::global().ok();
    let one = |(cb, out): (usize, &mut [f32])| {
        let mut from: [&[f32]; GROUP] = [&[]; GROUP];
        for (plane, rows) in out.chunks_exact_mut(lay.rows * lay.line_len).enumerate() {
            let (n, i0) = (plane / d.input[0], plane % d.input[0]);
            let (lo, rest) = rows.split_at_mut(lay.z_lo * lay.line_len);
            lo.fill(0.0);
            let (body, hi) = rest.split_at_mut(lines * lay.line_len);
            hi.fill(0.0);
            for (i1, out) in body.chunks_exact_mut(lay.line_len).enumerate() {
                let line = n * src.image_len() + (i0 * lines + i1) * width;
                for (c, f) in from.iter_mut().enumerate() {
                    *f = &src.x[src.plane(cb * GROUP + c) + line..][..width];
                }
                transpose(gemm, out, &from, width);
            }
        }
    };
    let copy = &mut copy[..lay.len(g)];
    if rayon::current_num_threads() > 1 {
        use rayon::prelude::*;
        copy.par_chunks_exact_mut(lay.block_len)
            .enumerate()
            .for_each(one);
    } else {
        copy.chunks_exact_mut(lay.block_len)
            .enumerate()
            .for_each(one);
    }
}

thread_local! {
    /// The whole position-major copy of the products this thread calls ([`with_copy`]): grows
    /// to the largest and stays, so that the next call allocates nothing.
    static WHOLE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Frees this thread's whole copy ([`crate::release_workspaces`]) and returns its bytes; one
/// in use counts 0.
pub(crate) fn release_thread() -> usize {
    crate::take_thread_buffer(&WHOLE, crate::vec_bytes)
}

/// Floats of [`with_copy`]'s copy from which a product runs over blocks of images (a block
/// holds at least one image): the copy stays independent of the batch (C3D's 64@8×56²: one
/// image, 1.7 Mi floats).
pub(crate) const WHOLE_FLOATS: usize = 1 << 20;

/// Images per block of the whole copy of `g` ([`WHOLE_FLOATS`], at least one).
pub(crate) fn whole_images(g: &ConvGeometry) -> usize {
    let one = g
        .with_batch(1)
        .map_or(usize::MAX, |g1| Layout::new(&g1).len(&g1));
    (WHOLE_FLOATS / one.max(1)).clamp(1, g.batch().max(1))
}

/// Runs `f` with group `grp`'s whole position-major copy ([`position_major`], in this
/// thread's buffer) where [`whole_copy`] takes the layer, `None` elsewhere. `g` and `x` are
/// one block of images ([`whole_images`]).
pub(crate) fn with_copy<R>(
    g: &ConvGeometry,
    grp: usize,
    x: &[f32],
    f: impl FnOnce(Option<&[f32]>) -> R,
) -> R {
    if !whole_copy(g) {
        return f(None);
    }
    let mut buf = WHOLE.with_borrow_mut(std::mem::take);
    buf.resize(Layout::new(g).len(g), 0.0);
    position_major(g, grp, x, &mut buf);
    let result = f(Some(&buf));
    WHOLE.with_borrow_mut(|kept| *kept = buf);
    result
}

/// `out[t·16 + c] = from[c][t]` for `t < width`: core-blas's lane transposes, or a plain loop
/// without them.
fn transpose(
    gemm: Option<&core_blas::Gemm>,
    out: &mut [f32],
    from: &[&[f32]; GROUP],
    width: usize,
) {
    let done = gemm.is_some_and(|g| g.transpose_lanes(out, GROUP, from, width, 1).is_ok());
    if !done {
        for (t, row) in out.chunks_exact_mut(GROUP).enumerate() {
            for (v, f) in row.iter_mut().zip(from) {
                *v = f[t];
            }
        }
    }
}

/// Shorter output lines keep [`Im2colTB`](crate::Im2colTB) (its cached chunks): the blocked
/// packer's per-run work does not pay there. Zen 4 (AVX-512), `probe_passes ... 5
/// bwd-filter/convgemm-trans`, base / blocked, 3 alternations, quiet 19:16:12-19:16:19 UTC, ms:
/// ResNet-50's 256@14² 17.84 / 17.95, 17.90 / 18.07, 17.91 / 17.91 (level), 512@7² 17.77 /
/// 19.57, 17.75 / 19.72, 17.67 / 19.35 (1.10× slower).
const MIN_LINE: usize = 16;

/// The fused packing ([`PackB::conv_panel`]) takes blocks of at least this many output lines:
/// the driver resolves a panel's rows one output line at a time (`ConvRows::resolve`: 3.6% of
/// C3D's samples at 7 lines a block, 1.9% at 14), which does not pay on blocks of one or two
/// lines (VGG's 64@224² at KC 384, 1.7 lines: 41.7 ms fused against 37.9, quiet 22:06 UTC; at
/// 4 lines level, 37.48 against 37.71 unfused, quiet 22:22:10).
const MIN_BLOCK_LINES: usize = 4;

/// The fused blocks run about this many times the GEMM's KC deep (see [`block_depth`]). Zen 4
/// (AVX-512, KC 384), `probe_passes ... 5 bwd-filter/convgemm-trans`, medians of 6-10
/// alternations, main / 7 / 14 lines a block (quiet 22:17:44 UTC): C3D 64@8×56² 55.80 / 54.25
/// / 53.62 ms, ResNet-50 64@56² 18.90 / 18.52 / 17.96, 128@28² (7 / 14 / 28 lines) 17.78 /
/// 17.26 / 17.24 / 17.13; 14 / 28 / 8 lines (quiet 22:19:46): C3D 53.43 / 54.09 / 54.46,
/// 64@56² 18.33 / 18.53 / -.
const DEPTH_FACTOR: usize = 2;

#[derive(Default)]
struct Scratch {
    /// The block `runs` … `slot` describe: (instance, pc, kc).
    key: Option<(u64, usize, usize)>,
    /// The channel block `copy` holds for that block.
    copied: Option<usize>,
    runs: Vec<Run>,
    segs: Vec<Seg>,
    /// The input lines (offset of the line in channel plane 0 of x) the block reads, sorted.
    lines: Vec<usize>,
    /// Per segment, its line's row in `copy` (unused for empty segments).
    slot: Vec<u32>,
    /// Per line of `lines`, its row in `copy`.
    row_of: Vec<u32>,
    /// The rows of `copy` that stand for padding lines (zeros).
    zero_rows: Vec<u32>,
    /// Rows of `copy`: the lines and the zero rows.
    copy_rows: usize,
    /// `copy_rows` lines of `input[2]` positions × [`GROUP`] channels, position-major.
    copy: Vec<f32>,
    /// The view's taps of the panels [`PackB::conv_panel`] describes, for (instance, first
    /// tap along the kernel line, chunks per row).
    taps: Vec<Chunk>,
    taps_key: Option<(u64, usize, usize)>,
}

thread_local! {
    /// The block's runs, segments and position-major copy: no allocation in steady state.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Distinguishes the instances (one per product): a thread's copy is reused only for the
/// instance, block and channel block it was made for.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl<'a> Im2colTBBlocked<'a> {
    /// Group `grp` of x (validated by the caller: `x.len() == g.x_len()`, [`applies`]), and
    /// with `whole` the group's position-major copy made by [`position_major`].
    pub(crate) fn new(
        g: &ConvGeometry,
        grp: usize,
        x: &'a [f32],
        whole: Option<&'a [f32]>,
    ) -> Self {
        debug_assert!(applies(g));
        let lay = Layout::new(g);
        debug_assert!(whole.is_none_or(|c| c.len() >= lay.len(g)));
        Im2colTBBlocked {
            src: Source::new(g, grp, x),
            whole: whole.map(|c| (c, lay)),
            rows: g.batch() * g.output_spatial_len(),
            cols: g.in_channels_per_group() * g.kernel_len(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Makes `s` describe the block of rows `pc..pc + kc` (its runs, segments and lines) and,
    /// with `cb`, hold the position-major copy of channel block `cb` on its lines; kept when it
    /// already does.
    fn prepare(&self, s: &mut Scratch, pc: usize, kc: usize, cb: Option<usize>) {
        let src = &self.src;
        let width = src.d.input[2];
        let line_len = width * GROUP;
        if s.key != Some((self.id, pc, kc)) {
            let Scratch {
                key,
                copied,
                runs,
                segs,
                lines,
                slot,
                row_of,
                zero_rows,
                copy_rows,
                ..
            } = s;
            src.runs(pc, kc, runs);
            src.segments(runs, segs);
            if let Some((_, lay)) = &self.whole {
                // Each segment's row in a channel block of the whole copy (every segment lies
                // on one input line, `at` = n·C·I + (i0·input[1] + i1)·input[2] + i2).
                let d = &src.d;
                let (width, plane_len) = (d.input[2], d.input[1] * d.input[2]);
                slot.clear();
                slot.extend(segs.iter().map(|g| {
                    if g.hi > g.lo {
                        let (n, sp) = (g.at / src.image_len(), g.at % src.image_len());
                        let plane = n * d.input[0] + sp / plane_len;
                        lay.row(plane, ((sp % plane_len) / width) as isize) as u32
                    } else {
                        0
                    }
                }));
                *key = Some((self.id, pc, kc));
                return;
            }
            // The lines the block reads (every segment lies on one input line).
            lines.clear();
            lines.extend(
                segs.iter()
                    .filter(|g| g.hi > g.lo)
                    .map(|g| g.at - g.at % width),
            );
            lines.sort_unstable();
            lines.dedup();
            // Each line's row in the copy, with zero rows for the padding lines around each
            // input plane's first and last lines (the fused rows step through them).
            let d = &src.d;
            let (i1len, i2len) = (d.input[1], d.input[2]);
            let (z_lo, z_hi) = zero_lines(d);
            row_of.clear();
            zero_rows.clear();
            let mut rows = 0u32;
            for &l in lines.iter() {
                let i1 = (l / i2len) % i1len;
                if i1 == 0 {
                    zero_rows.extend(rows..rows + z_lo as u32);
                    rows += z_lo as u32;
                }
                row_of.push(rows);
                rows += 1;
                if i1 + 1 == i1len {
                    zero_rows.extend(rows..rows + z_hi as u32);
                    rows += z_hi as u32;
                }
            }
            *copy_rows = rows as usize;
            slot.clear();
            slot.extend(segs.iter().map(|g| {
                if g.hi > g.lo {
                    row_of[lines.partition_point(|&l| l < g.at - g.at % width)]
                } else {
                    0
                }
            }));
            *key = Some((self.id, pc, kc));
            *copied = None;
        }
        let Some(cb) = cb else { return };
        if self.whole.is_some() || s.copied == Some(cb) {
            return;
        }
        let Scratch {
            lines,
            row_of,
            zero_rows,
            copy_rows,
            copy,
            copied,
            ..
        } = s;
        copy.resize(*copy_rows * line_len, 0.0);
        for &z in zero_rows.iter() {
            copy[z as usize * line_len..][..line_len].fill(0.0);
        }
        let gemm = core_blas::Gemm::global().ok();
        let mut from: [&[f32]; GROUP] = [&[]; GROUP];
        // The position-major copy of channels cb·16.. on the block's lines.
        for (line, &row) in lines.iter().zip(row_of.iter()) {
            let out = &mut copy[row as usize * line_len..][..line_len];
            for (c, f) in from.iter_mut().enumerate() {
                *f = &src.x[src.plane(cb * GROUP + c) + line..][..width];
            }
            transpose(gemm, out, &from, width);
        }
        *copied = Some(cb);
    }

    /// Appends to `out.taps` the view's taps of a fused panel whose first tap along the kernel
    /// line is `kw0` and whose rows are `nch` chunks (per output position along the line, the
    /// chunk of each tap: 16 channels of one input position, zero in the padding), kept in
    /// `s` for the next panel alike.
    fn describe_taps(
        &self,
        s: &mut Scratch,
        kw0: usize,
        nch: usize,
        out: &mut ConvPanel,
    ) -> Option<()> {
        let d = &self.src.d;
        let signed = |v: usize| isize::try_from(v).ok();
        if s.taps_key != Some((self.id, kw0, nch)) {
            s.taps.clear();
            for o2 in 0..d.output[2] {
                let p2 = signed(o2 * d.stride[2] + kw0)? - signed(d.pad[2])?;
                for q in 0..nch as isize {
                    let i2 = p2 + q;
                    let inside = i2 >= 0 && (i2 as usize) < d.input[2];
                    s.taps.push(Chunk::Lines {
                        step: 1,
                        m1: if inside { u16::MAX } else { 0 },
                        m2: 0,
                        off1: i2 * GROUP as isize,
                        off2: 0,
                    });
                }
            }
            s.taps_key = Some((self.id, kw0, nch));
        }
        out.taps.extend_from_slice(&s.taps);
        Some(())
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
        SCRATCH.with_borrow_mut(|s| {
            self.prepare(s, pc, kc, None);
            let count = s.runs.len();
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
                    self.prepare(s, pc, kc, Some(cb));
                    let Scratch {
                        runs,
                        segs,
                        slot,
                        copy,
                        ..
                    } = &*s;
                    // The channel block's lines: in the whole copy, or the thread's.
                    let (copy, block) = match &self.whole {
                        Some((whole, lay)) => (*whole, cb * lay.block_len),
                        None => (&copy[..], 0),
                    };
                    for (i, run) in runs.iter().enumerate() {
                        let g = &segs[tap * count + i];
                        let (lo, hi) = if g.hi > g.lo { (g.lo, g.hi) } else { (0, 0) };
                        let first = g.at % width;
                        let at = block
                            + slot[tap * count + i] as usize * line_len
                            + first * GROUP
                            + lane0;
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

    /// Panels of whole 16-channel groups (48 wide: three taps of 16 channels) on a kernel
    /// that packs B in its first tile.
    fn conv_fusable(&self, nr: usize) -> bool {
        let line = self.src.d.output[2];
        nr.is_multiple_of(CHUNK_LANES)
            && nr / CHUNK_LANES <= 3
            && self.src.d.dilation[2] == 1
            && ConvPack::global().is_ok()
            && core_blas::Gemm::global()
                .is_ok_and(|g| DEPTH_FACTOR * g.block_sizes().kc >= MIN_BLOCK_LINES * line)
    }

    /// The full panel at `(pc, j)` as rows of the thread's position-major copy: with the
    /// columns (channel block, tap, channel), a panel of `nr / 16` taps that are consecutive
    /// along the kernel line reads, for one output position, `nr` consecutive values of the
    /// copy (the positions under the taps, 16 channels each), so the block's rows repeat per
    /// output line (the view's taps are the positions along the line, its channel planes the
    /// copied input lines, `stride[1]` lines apart; padding lines are zero rows of the copy).
    /// `None` (packed by [`PackB::pack_b`]) when the block crosses an output plane, or is
    /// shorter than [`MIN_BLOCK_LINES`] lines; a panel whose taps read a padding plane is
    /// described with every lane zero.
    ///
    /// The slice returned is the thread's copy: it stays as it is until the next call into
    /// this source on this thread (the driver reads it in the panel's first tile, right
    /// after this call).
    fn conv_panel(
        &self,
        pc: usize,
        kc: usize,
        j: usize,
        nr: usize,
        out: &mut ConvPanel,
    ) -> Option<&[f32]> {
        let src = &self.src;
        let d = &src.d;
        let (rlen, nch) = (src.rlen, nr / CHUNK_LANES);
        let width = rlen * GROUP;
        if !self.conv_fusable(nr)
            || kc < MIN_BLOCK_LINES * d.output[2]
            || pc + kc > self.rows
            || j + nr > self.cols
            || !j.is_multiple_of(GROUP)
            || j % width + nr > width
        {
            return None;
        }
        let (cb, tap0) = (j / width, (j / GROUP) % rlen);
        let [kd, kh, kw0] = split3(tap0, &d.kernel);
        if kw0 + nch > d.kernel[2] {
            return None;
        }
        // The block's first and last rows: (image, output plane, line, position).
        let olen = src.olen();
        let (o1len, o2len) = (d.output[1], d.output[2]);
        let at = |p: usize| {
            let pos = p % olen;
            (
                p / olen,
                pos / (o1len * o2len),
                (pos / o2len) % o1len,
                pos % o2len,
            )
        };
        let (n, o0, o1f, first) = at(pc);
        let (n1, o01, o1l, _) = at(pc + kc - 1);
        if (n, o0) != (n1, o01) {
            return None;
        }
        let signed = |v: usize| isize::try_from(v).ok();
        let i0 = signed(o0 * d.stride[0] + kd * d.dilation[0])? - signed(d.pad[0])?;
        out.taps.clear();
        out.period = o2len;
        out.first = first;
        out.step = 0;
        out.base = 0;
        if i0 < 0 || i0 >= signed(d.input[0])? {
            // A padding plane: every lane zero, nothing read.
            out.taps.resize(o2len * nch, Chunk::ZERO);
            return Some(&src.x[..0]);
        }
        let i1 = |o1: usize| -> Option<isize> {
            Some(signed(o1 * d.stride[1] + kh * d.dilation[1])? - signed(d.pad[1])?)
        };
        let (i1f, i1l) = (i1(o1f)?, i1(o1l)?);
        let i1len = signed(d.input[1])?;
        if let Some((whole, lay)) = self.whole {
            // Every line the rows step through is in the whole copy: the plane's lines and its
            // zero lines.
            if i1f < -signed(lay.z_lo)? || i1l >= i1len + signed(lay.z_hi)? {
                return None;
            }
            SCRATCH.with_borrow_mut(|s| self.describe_taps(s, kw0, nch, out))?;
            let row =
                cb * (lay.block_len / lay.line_len) + lay.row(n * d.input[0] + i0 as usize, i1f);
            out.base = signed(row.checked_mul(lay.line_len)?)?;
            out.step = signed(d.stride[1] * lay.line_len)?;
            return Some(whole);
        }
        let (i2len, line_len) = (d.input[2], d.input[2] * GROUP);
        let line =
            |i1: isize| n * src.image_len() + (i0 as usize * d.input[1] + i1 as usize) * i2len;
        let lines_apart = (o1l - o1f) * d.stride[1];
        SCRATCH.with_borrow_mut(|s| {
            self.prepare(s, pc, kc, Some(cb));
            // The copy's row of input line `i1` of the plane (a padding line: a zero row
            // before its first line or after its last).
            let row = |i1: isize| -> Option<isize> {
                let near = i1.clamp(0, i1len - 1);
                let at = s.lines.binary_search(&line(near)).ok()?;
                signed(s.row_of[at] as usize).map(|r| r + i1 - near)
            };
            let (rf, rl) = (row(i1f)?, row(i1l)?);
            // Every line between the first and the last row's is in the copy, in order (rows
            // of one plane increase with the line, by one between lines both present).
            if rf < 0 || rl - rf != signed(lines_apart)? || (rl as usize) >= s.copy_rows {
                return None;
            }
            self.describe_taps(s, kw0, nch, out)?;
            out.base = rf.checked_mul(signed(line_len)?)?;
            out.step = signed(d.stride[1] * line_len)?;
            // SAFETY: the copy's buffer is this thread's and is only written by `prepare`,
            // which no call reaches before the driver is done with this panel's first tile
            // (the contract above); it lives as long as the thread.
            Some(unsafe { std::slice::from_raw_parts(s.copy.as_ptr(), s.copy.len()) })
        })
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
pub(crate) fn gemm(g: &ConvGeometry, m: usize, n: usize) -> crate::Result<core_blas::Gemm> {
    let gemm = *core_blas::Gemm::global().map_err(crate::error::gemm_err)?;
    let bs = gemm.block_sizes();
    if m > bs.mc {
        return Ok(gemm);
    }
    let nr = gemm.tile().1.max(1);
    gemm.with_block_sizes(core_blas::BlockSizes {
        mc: bs.mc.max(n.div_ceil(nr) * nr),
        kc: block_depth(g, gemm.isa(), bs.kc),
        ..bs
    })
    .map_err(crate::error::gemm_err)
}

/// KC for the fused packing ([`PackB::conv_panel`]): whole output lines, as many as a divisor
/// of the output plane's lines (at least [`MIN_BLOCK_LINES`]), the depth nearest
/// [`DEPTH_FACTOR`]·`kc`; then no block crosses an output plane and every block starts a line
/// (`kc` itself otherwise). Deeper blocks resolve fewer panels (per output line, see
/// [`MIN_BLOCK_LINES`]), transpose fewer halo lines and load / store C less often; the panel is
/// packed by its first tile, so the B block need not fit L2.
fn block_depth(g: &ConvGeometry, isa: core_blas::Isa, kc: usize) -> usize {
    let d = g.dims3();
    let (lines, line) = (d.output[1], d.output[2]);
    // Only the AVX-512 family packs B in its first tiles (the others keep their KC).
    if isa != core_blas::Isa::Avx512 || DEPTH_FACTOR * kc < MIN_BLOCK_LINES * line {
        return kc;
    }
    (MIN_BLOCK_LINES..=lines)
        .filter(|q| lines.is_multiple_of(*q))
        .map(|q| q * line)
        .min_by_key(|&depth| depth.abs_diff(DEPTH_FACTOR * kc))
        .unwrap_or(kc)
}

/// The output planes of `g` (its outermost output coordinate) in classes of consecutive planes
/// whose taps along the outermost kernel dimension reach inside the input over the same range
/// (`(planes, taps)`; a 3×3×3 kernel with padding 1 on 8 planes: plane 0 taps 1..3, planes 1..7
/// all, plane 7 taps 0..2). Planes whose taps all read padding add nothing to dW and are left
/// out.
fn plane_classes(g: &ConvGeometry) -> Vec<(Range<usize>, Range<usize>)> {
    let d = g.dims3();
    let (o0, k0) = (d.output[0], d.kernel[0]);
    let ok = |o: usize, r: usize| (0..d.input[0] as isize).contains(&d.input_coord(0, o, r));
    let mut classes: Vec<(Range<usize>, Range<usize>)> = Vec::new();
    for o in 0..o0 {
        let lo = (0..k0).find(|&r| ok(o, r)).unwrap_or(k0);
        let hi = (lo..k0).find(|&r| !ok(o, r)).unwrap_or(k0);
        if lo == hi {
            continue;
        }
        match classes.last_mut() {
            Some((planes, taps)) if planes.end == o && *taps == (lo..hi) => planes.end += 1,
            _ => classes.push((o..o + 1, lo..hi)),
        }
    }
    classes
}

/// Rows `r0..r0 + rows` of B (output positions), as a B source of its own.
struct DepthB<'a, B> {
    b: &'a B,
    r0: usize,
    rows: usize,
}

impl<B: PackB> PackB for DepthB<'_, B> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.b.cols()
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        self.b.pack_b(self.r0 + pc, kc, jc, nc, nr, dst)
    }
    fn prefetch_b(&self, pc: usize, kc: usize, jc: usize, nc: usize) {
        self.b.prefetch_b(self.r0 + pc, kc, jc, nc)
    }
    fn conv_fusable(&self, nr: usize) -> bool {
        self.b.conv_fusable(nr)
    }
    fn conv_panel(
        &self,
        pc: usize,
        kc: usize,
        j: usize,
        nr: usize,
        out: &mut ConvPanel,
    ) -> Option<&[f32]> {
        if pc + kc > self.rows {
            return None;
        }
        self.b.conv_panel(self.r0 + pc, kc, j, nr, out)
    }
}

/// dW (`dw`: `k` rows of the blocked columns, [`Im2colTBBlocked`]'s order) of one block of
/// images `g` (dy as `a`, x as `b`) by classes of output planes ([`plane_classes`]), so that
/// the products skip the taps that read padding planes: per image, the planes whose taps all
/// read inside the input take every column (one product over their positions); an outer class
/// takes, per channel block, only the columns of its taps (the taps of one kernel plane are
/// consecutive columns of a block: `16 · R1 · R2` per plane), one product each. On C3D's
/// 64@8×56² (3×3×3, padding 1) the first and last planes' products skip a third of the
/// columns: 8.3% of the multiply-adds. Zen 4 (AVX-512), one product / by planes:
/// `probe_passes ... 5 bwd-filter/convgemm-trans`, 1 thread, quiet 10:06:04 UTC, medians of 5
/// alternations 51.68 / 47.84 ms (pair-ratio median 0.924); wall clock of 6 back-to-back calls,
/// quiet 10:14:04, medians of 4 alternations: 1 thread 51.55 / 47.42, 2 threads 26.42 / 24.42.
/// `beta` scales dW before the first product (0: dW is
/// overwritten); the full classes go first, so every column is written by the first product
/// (dW is zeroed first when no class is full).
pub(crate) fn product_by_planes<A: PackA>(
    gemm: &core_blas::Gemm,
    g: &ConvGeometry,
    a: &A,
    b: &Im2colTBBlocked<'_>,
    dw: &mut [f32],
    k: usize,
    beta: f32,
) -> Result<(), core_blas::Error> {
    let d = g.dims3();
    let cols = b.cols();
    let (olen, k0) = (g.output_spatial_len(), d.kernel[0]);
    let per_plane = olen / d.output[0].max(1);
    // Columns of one kernel plane's taps in a channel block, and of a channel block.
    let plane_cols = GROUP * g.kernel_len() / k0;
    let block = GROUP * g.kernel_len();
    let mut classes = plane_classes(g);
    classes.sort_by_key(|(_, taps)| taps.len() != k0);
    let mut beta = beta;
    if beta == 0.0 && classes.first().is_none_or(|(_, taps)| taps.len() != k0) {
        dw[..k * cols].fill(0.0);
        beta = 1.0;
    }
    for n in 0..g.batch() {
        for (planes, taps) in &classes {
            let (r0, depth) = (
                n * olen + planes.start * per_plane,
                planes.len() * per_plane,
            );
            let ad = crate::layout::KRange {
                a,
                k0: r0,
                k: depth,
            };
            let bd = DepthB { b, r0, rows: depth };
            if taps.len() == k0 {
                let c = core_blas::MatMut::row_major("dw", &mut *dw, k, cols, cols)?;
                gemm.gemm_with(&ad, &bd, &mut core_blas::DenseStore::new(c, 1.0, beta))?;
                beta = 1.0;
                continue;
            }
            let width = taps.len() * plane_cols;
            for j0 in (taps.start * plane_cols..cols).step_by(block) {
                let c = core_blas::MatMut::row_major("dw", &mut dw[j0..], k, width, cols)?;
                let bc = crate::layout::Columns {
                    b: &bd,
                    j0,
                    cols: width,
                };
                gemm.gemm_with(&ad, &bc, &mut core_blas::DenseStore::new(c, 1.0, beta))?;
            }
        }
    }
    Ok(())
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

    /// The products by classes of output planes ([`super::product_by_planes`]) on 3-D kernels:
    /// the outer planes' taps reading padding (padding 1, per-side padding 0 / 2, a kernel
    /// plane of 2), planes that read padding only (left out), no plane reading every kernel
    /// plane (dW zeroed first), stride and dilation along the depth, odd sizes, groups, batch
    /// 1-3 (several images in one block of the whole copy); on 1 and 2 threads, against the
    /// reference.
    #[test]
    fn plane_classes_match_the_reference() {
        let geoms = [
            ConvGeometry::new(1, 32, 5, &[5, 7, 19], &[3, 3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            // Depth 2 < kernel 3: plane 0 reads taps 1-2, plane 1 taps 0-1 (no full class).
            ConvGeometry::from_parts(2, 16, 3, &[2, 6, 17], &[3, 3, 3], &[1], &[1], &[1], &[1], 1)
                .unwrap(),
            // Padding 2 before a kernel plane of 2: output plane 0 reads padding only.
            ConvGeometry::new(3, 16, 4, &[3, 5, 18], &[2, 3, 1])
                .unwrap()
                .with_padding_per_side(&[2, 1, 0], &[0, 1, 0])
                .unwrap(),
            // Stride 2 and dilation 2 along the depth, groups.
            ConvGeometry::new(2, 32, 6, &[7, 6, 20], &[3, 2, 3])
                .unwrap()
                .with_stride(&[2, 1, 1])
                .unwrap()
                .with_dilation(&[2, 1, 1])
                .unwrap()
                .with_padding(&[2, 0, 1])
                .unwrap()
                .with_groups(2)
                .unwrap(),
        ];
        for g in &geoms {
            assert!(super::whole_copy(g), "{g:?}");
            let classes = super::plane_classes(g);
            assert!(classes.len() > 1, "{g:?}: {classes:?}");
            crate::convgemm_trans::check_against_reference_on_1_and_2_threads(g);
        }
    }

    /// 3-D layers whose whole copy takes one image a block ([`super::WHOLE_FLOATS`]): several
    /// blocks accumulate into dW (against the reference, on 1 and 2 threads, groups too), and
    /// the thread's copy is the size of one image's whatever the batch.
    #[test]
    fn whole_copy_by_blocks_of_images() {
        let g = ConvGeometry::new(3, 32, 4, &[4, 96, 96], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap();
        assert!(super::whole_copy(&g));
        assert_eq!(super::whole_images(&g), 1);
        crate::convgemm_trans::check_against_reference_on_1_and_2_threads(&g);
        // The copy's size after a call: a batch of 3 keeps what a batch of 1 grows.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let bytes = |g: &ConvGeometry| {
            pool.install(|| {
                super::release_thread();
                let (x, dy) = (
                    crate::testing::uniform(1, g.x_len()),
                    crate::testing::uniform(2, g.y_len()),
                );
                let mut dw = vec![0f32; g.w_len()];
                crate::backward_filter(
                    g,
                    &x,
                    &dy,
                    &mut dw,
                    crate::BackwardFilterAlgo::ConvgemmTrans,
                    &mut crate::Workspace::new(false),
                )
                .unwrap();
                super::release_thread()
            })
        };
        let one = bytes(&g.with_batch(1).unwrap());
        assert!(one > 0);
        assert_eq!(bytes(&g), one);
    }

    /// The panels [`PackB::conv_panel`] describes hold the values [`PackB::pack_b`] writes
    /// (read as the fused kernel reads them: masked step-1 chunks, every lane read inside the
    /// slice), on blocks inside one output plane, across planes and images, at the padding
    /// lines and planes, asked in an order that revisits blocks; with each block's lines copied
    /// per block and read from the whole copy; on AVX-512 machines only.
    #[test]
    fn described_panels_match_pack_b() {
        use core_blas::{Chunk, ConvPanel, PackB};
        if core_blas::ConvPack::global().is_err() {
            return;
        }
        let geoms = [
            ConvGeometry::new(2, 32, 3, &[4, 6, 20], &[3, 3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 16, 3, &[13, 41], &[3, 3])
                .unwrap()
                .with_stride(&[2, 2])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(1, 32, 3, &[9, 18], &[3, 5])
                .unwrap()
                .with_padding_per_side(&[0, 2], &[1, 1])
                .unwrap(),
        ];
        let mut described = 0;
        let mut desc = ConvPanel::default();
        // Each geometry with its lines copied per block and from the whole copy.
        for (g, whole) in geoms.iter().flat_map(|g| [(g, false), (g, true)]) {
            let x = crate::testing::uniform(7, g.x_len());
            let mut copy = vec![f32::NAN; super::Layout::new(g).len(g)];
            super::position_major(g, 0, &x, &mut copy);
            let b = super::Im2colTBBlocked::new(g, 0, &x, whole.then_some(&copy[..]));
            let (rows, cols) = (b.rows(), b.cols());
            let blocks: Vec<(usize, usize)> =
                [(0, 100), (37, 130), (0, 100), (101, 250), (5, 1), (3, 90)]
                    .into_iter()
                    .chain((0..rows).step_by(95).map(|p| (p, 95)))
                    .map(|(p, k)| (p.min(rows - 1), k.min(rows - p.min(rows - 1))))
                    .collect();
            for &(pc, kc) in &blocks {
                for j in (0..cols.saturating_sub(47)).step_by(16) {
                    let mut want = vec![f32::NAN; kc * 48];
                    b.pack_b(pc, kc, j, 48, 48, &mut want);
                    let Some(data) = b.conv_panel(pc, kc, j, 48, &mut desc) else {
                        continue;
                    };
                    described += 1;
                    assert_eq!(desc.taps.len(), desc.period * 3);
                    for p in 0..kc {
                        let (t, chan) = (
                            (desc.first + p) % desc.period,
                            (desc.first + p) / desc.period,
                        );
                        for q in 0..3 {
                            let Chunk::Lines {
                                step: 1,
                                m1,
                                m2: 0,
                                off1,
                                ..
                            } = desc.taps[t * 3 + q]
                            else {
                                panic!("{g:?}: chunk {:?}", desc.taps[t * 3 + q]);
                            };
                            for l in 0..16 {
                                let got = if m1 & (1 << l) != 0 {
                                    let at =
                                        desc.base + chan as isize * desc.step + off1 + l as isize;
                                    *data.get(at as usize).expect("read inside the slice")
                                } else {
                                    0.0
                                };
                                assert_eq!(
                                    got.to_bits(),
                                    want[p * 48 + q * 16 + l].to_bits(),
                                    "{g:?} whole {whole} block {pc}+{kc} panel {j} row {p} lane {}",
                                    q * 16 + l
                                );
                            }
                        }
                    }
                }
            }
        }
        assert!(described > 0);
    }
}
