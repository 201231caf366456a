//! Many channels on small planes: the forward and backward-data passes as one product per
//! kernel tap over only the (output position, input position) pairs the tap joins, positions
//! on the GEMM's rows.
//!
//! On ResNet-50's 512@7² (3×3, padding 1) 18% of convgemm's (position, tap) columns read the
//! padding: the batch-wide GEMM multiplies zeros there, oneDNN skips them. Here, per block of
//! images, the input side is copied position-major (`xt[n·I + i]` = x\[n\]\[:, i\], a row of C
//! values) and, per tap `t`, the pairs it joins are listed as (row of the output, row of
//! `xt`); then
//! - forward: `yt[o] += xt[i] · W_t` over tap `t`'s pairs (`W_t[c][k] = w[k][c][t]`, C × K),
//! - backward-data: `dxt[i] += dyt[o] · W_tᵀ` (`W_tᵀ[k][c] = w[k][c][t]`, K × C),
//!
//! each a GEMM whose A rows are gathered rows of the copy (packed once per block of images
//! by core-blas's lane transposes) and whose C rows are scattered rows of the position-major
//! output (a tile of consecutive rows is stored from registers, [`Store::window`]); the first
//! tap that joins every output position writes, the others add. The products run by blocks
//! of [`BLOCK_COLS`] output columns, all nine taps on one block's B before the next. The
//! result is transposed back into y (dx), with bias and ReLU. Exactly the layer's real
//! multiply-adds, plus copies: of w once per call (transposed or de-interleaved by tap, a
//! block of columns at a time), of each block's input and output (at most [`BLOCK_FLOATS`]
//! each, or one image's) and of the taps' gathered A rows. With several threads the blocks
//! of images (at least one per thread) are copied side by side, then each thread runs an
//! even share of the columns on every block of images, each product on one thread
//! ([`side_by_side`]): the nine products of one block forked over two threads scaled
//! 1.58-1.64× on 512@7²'s backward-data, whole blocks of images side by side (each thread
//! making all of w's copy) 1.88-1.92× (criterion, quiet 01:56 UTC).

use std::cell::RefCell;

use core_blas::{Gemm, MatRef, PackA, PackB, Store, Tile, Window};
use rayon::prelude::*;

use crate::error::{Result, gemm_err};
use crate::geometry::{ConvGeometry, Dims3};
use crate::im2col::split3;
use crate::shares::share_out;

/// Channels (input and output, both) from which [`applies`] takes a layer: each tap's product
/// is C deep, and a shallow product pays the C tile's traffic too often.
const MIN_CHANNELS: usize = 256;

/// Share of (output position, tap) pairs in the padding from which [`applies`] takes a layer
/// (3×3 kernels: 512@7² 18%, 256@14² 9.3%, 128@28² 4.7%). `probe_passes`, 1 thread, quiet
/// 01:04:44 UTC, 3 alternations, ms, convgemm (C panels, A packed once) / tap by tap:
/// ResNet-50 512@7² forward 18.31 / 17.01, 18.45 / 16.88, 18.64 / 17.37 (0.93×),
/// backward-data (flipped convgemm) 18.83 / 16.46, 18.94 / 16.43, 19.20 / 16.66 (0.87×);
/// 256@14² forward 17.29 / 17.76, 17.12 / 17.81, 18.14 / 17.51 (1.03× by the median),
/// backward-data 17.35 / 17.34, 17.15 / 17.35, 17.33 / 17.25 (level): the copies (w
/// transposed or de-interleaved by tap, the position-major input and output, A's gathered rows)
/// cost about what 9% of padding products do.
const MIN_PADDING_SHARE: f64 = 0.12;

/// Floats of one block's position-major input or output copy (the block holds at least one
/// image).
const BLOCK_FLOATS: usize = 256 * 1024;

/// Whether the forward convgemm and the backward-data algorithms run `g` tap by tap: one
/// group, a kernel larger than 1×1, stride 1 (the strided layers were not measured), at least [`MIN_CHANNELS`] input and output channels,
/// small planes (fewer than 1024 output positions: the batch-wide convgemm), and at least
/// [`MIN_PADDING_SHARE`] of the (output position, tap) pairs in the padding.
pub(crate) fn applies(g: &ConvGeometry) -> bool {
    g.groups() == 1
        && g.kernel_len() > 1
        && g.stride().iter().all(|&s| s == 1)
        && g.in_channels().min(g.out_channels()) >= MIN_CHANNELS
        && g.output_spatial_len() < 1024
        && !crate::tapwise::applies(g)
        && padding_share(g) >= MIN_PADDING_SHARE
}

/// The share of (output position, tap) pairs of `g` that read the padding.
fn padding_share(g: &ConvGeometry) -> f64 {
    let d = g.dims3();
    let valid: f64 = (0..3)
        .map(|dd| {
            let (o, k) = (d.output[dd], d.kernel[dd]);
            let inside = (0..o)
                .flat_map(|oc| (0..k).map(move |r| (oc, r)))
                .filter(|&(oc, r)| {
                    let c = d.input_coord(dd, oc, r);
                    c >= 0 && (c as usize) < d.input[dd]
                })
                .count();
            inside as f64 / (o * k).max(1) as f64
        })
        .product();
    1.0 - valid
}

/// Per tap, the pairs it joins in a block of `count` images: (output row, input row) of the
/// position-major copies (rows `n·O + o` and `n·I + i`), output rows increasing. `backward`:
/// the roles swapped, (dx row, dy row), for backward-data.
fn pairs(d: &Dims3, count: usize, backward: bool) -> Vec<(Vec<u32>, Vec<u32>)> {
    let olen: usize = d.output.iter().product();
    let ilen: usize = d.input.iter().product();
    let rlen: usize = d.kernel.iter().product();
    (0..rlen)
        .map(|t| {
            let rk = split3(t, &d.kernel);
            let (mut to, mut from) = (Vec::new(), Vec::new());
            for n in 0..count {
                if !backward {
                    for o in 0..olen {
                        let oc = split3(o, &d.output);
                        let mut i = 0usize;
                        let inside = (0..3).all(|dd| {
                            let c = d.input_coord(dd, oc[dd], rk[dd]);
                            i = i * d.input[dd] + c.max(0) as usize;
                            c >= 0 && (c as usize) < d.input[dd]
                        });
                        if inside {
                            to.push((n * olen + o) as u32);
                            from.push((n * ilen + i) as u32);
                        }
                    }
                } else {
                    for i in 0..ilen {
                        let ic = split3(i, &d.input);
                        let mut o = 0usize;
                        let inside = (0..3).all(|dd| {
                            // o·s + r·dil − pad = i.
                            let num =
                                (ic[dd] + d.pad[dd]) as isize - (rk[dd] * d.dilation[dd]) as isize;
                            let s = d.stride[dd] as isize;
                            let ok =
                                num >= 0 && num % s == 0 && ((num / s) as usize) < d.output[dd];
                            o = o * d.output[dd] + if ok { (num / s) as usize } else { 0 };
                            ok
                        });
                        if inside {
                            to.push((n * ilen + i) as u32);
                            from.push((n * olen + o) as u32);
                        }
                    }
                }
            }
            (to, from)
        })
        .collect()
}

/// A block's input and output copies, kept across calls on one thread.
#[derive(Default)]
struct Buffers {
    src: Vec<f32>,
    dst: Vec<f32>,
    /// Every tap's A packed once ([`CachedA`]).
    a: Vec<f32>,
    /// One block of columns of every tap's B ([`Weights::block`]).
    w: Vec<f32>,
}

thread_local! {
    /// The copies of the blocks this thread runs.
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

/// Frees this thread's weight copy and block copies ([`crate::release_workspaces`]) and returns
/// their bytes; one in use counts 0.
pub(crate) fn release_thread() -> usize {
    use crate::{take_thread_buffer, vec_bytes};
    take_thread_buffer(&BUFFERS, |b| {
        vec_bytes(b.src) + vec_bytes(b.dst) + vec_bytes(b.a) + vec_bytes(b.w)
    }) + take_thread_buffer(&SIDE, |side| {
        crate::bytes_of(&side)
            + side
                .into_iter()
                .map(|b| {
                    crate::bytes_of(&b.pairs)
                        + b.pairs
                            .iter()
                            .map(|(to, from)| crate::bytes_of(to) + crate::bytes_of(from))
                            .sum::<usize>()
                        + vec_bytes(b.src)
                        + vec_bytes(b.a)
                        + crate::bytes_of(&b.starts)
                })
                .sum::<usize>()
    })
}

/// `wt[c][t][k] = w[k][c][t]` ((C·R) × K): row `c·R + t` of the result is row `c` of the
/// forward's B of tap `t` (C × K, rows `R·K` apart), which the GEMM then packs straight from
/// rows (one pass over w here, instead of a de-interleave plus a transposing B packing per
/// tap). Blocks of 64 channels over threads; each block 16 kernels at a time through
/// core-blas's lane transposes (16 rows of w, the block's `64·R` values each, become 16
/// columns of its `64·R` rows). Longer pieces of w's rows read faster: perf (call graph, 15
/// rounds of 512@7² forward, quiet 22:21 UTC) puts this function at 10.9% of the samples with
/// blocks of 8 channels, 10.2% with 16, 9.6% with 32, 9.05% with 64, 10.3% with 128 (22:17),
/// 9.8% with 32 channels and 32 kernels.
fn transposed_by_tap(
    gemm: &Gemm,
    w: &[f32],
    k: usize,
    c: usize,
    r: usize,
    wt: &mut Vec<f32>,
) -> Result<()> {
    const CB: usize = 64;
    const KB: usize = 16;
    wt.resize(c * r * k, 0.0);
    let one = |(b, out): (usize, &mut [f32])| -> std::result::Result<(), core_blas::Error> {
        let (c0, cc) = (b * CB, out.len() / (r * k));
        let mut lanes: Vec<&[f32]> = Vec::with_capacity(KB);
        for k0 in (0..k).step_by(KB) {
            let nl = KB.min(k - k0);
            lanes.clear();
            lanes.extend((k0..k0 + nl).map(|kk| &w[(kk * c + c0) * r..][..cc * r]));
            // Row `i·R + t` of the block, columns k0 .. k0 + nl.
            gemm.transpose_lanes(&mut out[k0..], k, &lanes, cc * r, 1)?;
        }
        Ok(())
    };
    if rayon::current_num_threads() > 1 {
        wt.par_chunks_mut(CB * r * k).enumerate().try_for_each(one)
    } else {
        wt.chunks_mut(CB * r * k).enumerate().try_for_each(one)
    }
    .map_err(gemm_err)
}

/// `dst[n·P + p][c] = src[n][c][p]` for `count` images of `ch` planes of `plane` values.
fn to_rows(
    gemm: &Gemm,
    src: &[f32],
    count: usize,
    ch: usize,
    plane: usize,
    dst: &mut Vec<f32>,
) -> Result<()> {
    dst.resize(count * plane * ch, 0.0);
    let mut lanes: Vec<&[f32]> = Vec::with_capacity(ch);
    for (img, out) in src
        .chunks_exact(ch * plane)
        .zip(dst.chunks_exact_mut(plane * ch))
    {
        lanes.clear();
        lanes.extend(img.chunks_exact(plane));
        gemm.transpose_lanes(out, ch, &lanes, plane, 1)
            .map_err(gemm_err)?;
    }
    Ok(())
}

/// `dst[n][c][p] = src[n·P + p][c]`, then bias and ReLU.
#[allow(clippy::too_many_arguments)]
fn from_rows(
    gemm: &Gemm,
    src: &[f32],
    ch: usize,
    plane: usize,
    dst: &mut [f32],
    bias: Option<&[f32]>,
    relu: bool,
) -> Result<()> {
    let mut lanes: Vec<&[f32]> = Vec::with_capacity(plane);
    for (rows, img) in src
        .chunks_exact(plane * ch)
        .zip(dst.chunks_exact_mut(ch * plane))
    {
        lanes.clear();
        lanes.extend(rows.chunks_exact(ch));
        gemm.transpose_lanes(img, plane, &lanes, ch, 1)
            .map_err(gemm_err)?;
        if bias.is_some() || relu {
            for (c, p) in img.chunks_exact_mut(plane).enumerate() {
                let add = bias.map_or(0.0, |b| b[c]);
                for v in p {
                    let s = *v + add;
                    *v = if relu && s < 0.0 { 0.0 } else { s };
                }
            }
        }
    }
    Ok(())
}

/// The A operand of one tap: rows `rows[..]` of the row-major `data` (`ld` apart), `cols`
/// wide, packed by core-blas's lane transposes.
struct RowsA<'a> {
    gemm: &'a Gemm,
    data: &'a [f32],
    ld: usize,
    cols: usize,
    rows: &'a [u32],
}

impl PackA for RowsA<'_> {
    fn rows(&self) -> usize {
        self.rows.len()
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        let mut lanes: Vec<&[f32]> = Vec::with_capacity(mr);
        for (q, panel) in dst.chunks_mut(kc * mr).take(mc.div_ceil(mr)).enumerate() {
            let r0 = ic + q * mr;
            let nl = mr.min(ic + mc - r0);
            lanes.clear();
            lanes.extend(
                self.rows[r0..r0 + nl]
                    .iter()
                    .map(|&s| &self.data[s as usize * self.ld + pc..][..kc]),
            );
            if self.gemm.transpose_lanes(panel, mr, &lanes, kc, 1).is_err() {
                for (l, lane) in lanes.iter().enumerate() {
                    for (p, &v) in lane.iter().enumerate() {
                        panel[p * mr + l] = v;
                    }
                }
            }
            if nl < mr {
                for p in 0..kc {
                    panel[p * mr + nl..(p + 1) * mr].fill(0.0);
                }
            }
        }
    }
}

/// C's rows scattered into the rows `rows[..]` of a row-major `ld`-wide output (`C := beta·C
/// + A·B` there).
struct RowStore<'a> {
    ptr: *mut f32,
    len: usize,
    ld: usize,
    cols: usize,
    rows: &'a [u32],
    beta: f32,
    /// The product on the calling thread only (its block runs beside others).
    serial: bool,
}

// SAFETY: the tiles of one product are disjoint and `rows` lists distinct rows (a tap joins an
// output position at most once), so concurrent `store_tile` calls and windows write disjoint
// elements; the output's `&mut` borrow outlives the product.
unsafe impl Sync for RowStore<'_> {}

impl Store for RowStore<'_> {
    fn rows(&self) -> usize {
        self.rows.len()
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn concurrent(&self) -> bool {
        !self.serial
    }
    fn store_tile(&self, t: &Tile<'_>) {
        for r in 0..t.rows() {
            let at = self.rows[t.i() + r] as usize * self.ld + t.j();
            debug_assert!(at + t.cols() <= self.len);
            // SAFETY: row `rows[i + r]` of the output, columns `j .. j + cols` (inside it,
            // `ld >= cols`), written by this tile only (see the `Sync` impl).
            let out = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), t.cols()) };
            if t.first() && self.beta == 0.0 {
                out.copy_from_slice(t.row(r));
            } else {
                out.iter_mut().zip(t.row(r)).for_each(|(o, &v)| *o += v);
            }
        }
    }
    #[inline]
    fn window(&self, i: usize, j: usize, rows: usize, cols: usize) -> Option<Window<'_>> {
        let (a, b) = (self.rows[i] as usize, self.rows[i + rows - 1] as usize);
        // Increasing rows: consecutive exactly when the span is `rows`.
        (b - a + 1 == rows).then(|| {
            debug_assert!((a + rows - 1) * self.ld + j + cols <= self.len);
            // SAFETY: rows `a .. a + rows` of the output, columns `j .. j + cols`, written by
            // this tile only (see the `Sync` impl).
            unsafe { Window::new(self.ptr.add(a * self.ld + j), self.ld, 1.0, self.beta) }
        })
    }
}

/// A tap's B (a row-major matrix) packed up front by its own packer, block by block: not
/// handed to the driver as row-major storage, whose panels for a store other than the dense
/// one are then copied row by row through a call into the C library's memmove per 32-48
/// values (6.1% of the samples of 512@7²'s forward, perf call graph, quiet 22:17 UTC), where
/// the matrix's own packer copies fixed-size rows eight lines at a time. Landed with the
/// wider transposes of [`transposed_by_tap`] (−2% together); the same packer in the driver's
/// copies measured level on its own (`probe_passes`, quiet 22:37:39 UTC: the copies wait on
/// the freshly written B, not on the calls), so this wrapper is a special case of the
/// driver's path: if the driver's copies change, drop it.
struct UpFront<'a>(MatRef<'a>, Option<&'a [f32]>);

impl PackB for UpFront<'_> {
    fn rows(&self) -> usize {
        PackB::rows(&self.0)
    }
    fn cols(&self) -> usize {
        PackB::cols(&self.0)
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        self.0.pack_b(pc, kc, jc, nc, nr, dst)
    }
    fn prefetch_b(&self, pc: usize, kc: usize, jc: usize, nc: usize) {
        self.0.prefetch_b(pc, kc, jc, nc)
    }
    /// The backward-data block's B of one tap is already one packed `BLOCK_COLS`-wide
    /// micro-panel over the whole depth ([`Weights::block`]): read in place when the kernel's
    /// panels are that wide.
    fn packed_b(
        &self,
        pc: usize,
        _kc: usize,
        jc: usize,
        _nc: usize,
        nr: usize,
    ) -> Option<(&[f32], usize)> {
        let panel = self.1?;
        (nr == BLOCK_COLS && jc == 0).then(|| (&panel[pc * nr..], panel.len()))
    }
}

/// The deepest tap product run in one pass over its depth (`n_in`: C forward, K backward-data)
/// instead of the driver's passes of the table's KC (two passes of 256 at depth 512): each pass
/// loads and stores the product's C rows (the position-major output, read and written by all
/// nine taps), which one pass halves; the B micro-panel (`512 × NR`) then streams from L2.
/// `probe_passes`, 1 thread, 512@7², min of 15, 8 alternations, two passes / one pass: quiet
/// 01:22 UTC forward medians 16.50 / 16.29 ms (pair ratios' median 0.976), backward-data
/// 16.20 / 15.99 (0.986, 8 of 8 pairs faster); 01:20 (noisier) 0.960 and 0.971; perf: the
/// driver's own share (the tile-buffer adds of C) 4.5% → 2.6%.
const ONE_PASS_MAX: usize = 512;

/// The taps' B operands, a block of columns at a time: the forward's `W_t` (C × K) or
/// backward-data's `W_tᵀ` (K × C), read from w (K × C × R).
#[derive(Clone, Copy)]
struct Weights<'a> {
    w: &'a [f32],
    k: usize,
    c: usize,
    r: usize,
    backward: bool,
}

impl Weights<'_> {
    /// Rows of every tap's B.
    fn depth(&self) -> usize {
        if self.backward { self.k } else { self.c }
    }
    /// Columns `j0 .. j0 + nb` of every tap's B into `buf`: forward `buf[(p·R + t)·nb + j]` =
    /// `B_t[p][j0 + j]` = `w[j0 + j][p][t]` (the block's kernels are `nb` consecutive rows of
    /// w, transposed by [`transposed_by_tap`]); backward-data `buf[(t·K + p)·BLOCK_COLS + j]`
    /// = `w[p][j0 + j][t]` (each row of w de-interleaved over the block's channels straight
    /// into the taps' packed micro-panels, [`UpFront::packed_b`]: no per-product copy of B).
    fn block(&self, gemm: &Gemm, j0: usize, nb: usize, buf: &mut Vec<f32>) -> Result<()> {
        let (k, c, r) = (self.k, self.c, self.r);
        if self.backward {
            // Tap-major rows `BLOCK_COLS` wide: `buf[(t·K + p)·BLOCK_COLS + j]`, the columns
            // past `nb` zero, so that each tap's B is one packed micro-panel.
            let ld = k * BLOCK_COLS;
            buf.resize(r * ld, 0.0);
            let run = |kk: usize| (kk * c + j0) * r..(kk * c + j0 + nb) * r;
            for kk in 0..k {
                if kk + PREFETCH_ROWS < k {
                    prefetch_run(self.w, run(kk + PREFETCH_ROWS));
                }
                gemm.deinterleave(&mut buf[kk * BLOCK_COLS..], ld, &self.w[run(kk)], r, nb)
                    .map_err(gemm_err)?;
                if nb < BLOCK_COLS {
                    for t in 0..r {
                        buf[t * ld + kk * BLOCK_COLS..][nb..BLOCK_COLS].fill(0.0);
                    }
                }
            }
            Ok(())
        } else {
            transposed_by_tap(gemm, &self.w[j0 * c * r..][..nb * c * r], nb, c, r, buf)
        }
    }
    /// Tap `t`'s B over the block's `nb` columns, from [`Weights::block`]'s `buf`, and
    /// (backward-data) the same as one packed `BLOCK_COLS`-wide micro-panel.
    fn tap<'b>(&self, buf: &'b [f32], t: usize, nb: usize) -> Result<UpFront<'b>> {
        if self.backward {
            let panel = &buf[t * self.k * BLOCK_COLS..][..self.k * BLOCK_COLS];
            let m = MatRef::row_major("w", panel, self.k, nb, BLOCK_COLS).map_err(gemm_err)?;
            Ok(UpFront(m, Some(panel)))
        } else {
            let m = MatRef::row_major("w", &buf[t * nb..], self.depth(), nb, self.r * nb)
                .map_err(gemm_err)?;
            Ok(UpFront(m, None))
        }
    }
}

/// Rows of w ahead of the one being de-interleaved whose block piece ([`Weights::block`],
/// backward-data) is prefetched: each row's piece (`nb · R` floats, 1.7 KiB at 48 channels
/// and 9 taps) lies 18 KiB after the previous row's (512 channels), so the hardware
/// prefetcher starts cold on every row and each piece waits on memory's latency when w is not
/// cached (as after the previous call's traffic).
const PREFETCH_ROWS: usize = 4;

/// Hints the cache lines of `w[range]` toward L2.
fn prefetch_run(w: &[f32], range: std::ops::Range<usize>) {
    if range.is_empty() {
        return;
    }
    for i in range.clone().step_by(16) {
        core_blas::pack::prefetch_l2(w, i);
    }
    // The last line, when the run starts off a line boundary.
    core_blas::pack::prefetch_l2(w, range.end - 1);
}

/// Columns of the taps' B per block ([`products`]): the block's B of every tap (`48 · depth ·
/// R` floats, 864 KiB at depth 512 and 9 taps) is made from w and serves the nine products
/// while it is in L2, instead of all of w transposed to memory up front and each tap's B
/// packed back from there (17% of 512@7²'s forward samples, perf call graph, quiet 01:37
/// UTC). One AVX-512 panel (NR 48). `probe_passes`, 1 thread, 512@7², min of 15, quiet
/// 01:40:22 UTC, 5 alternations, main (all of w first) / blocks of 48 / 96 / 144 / 512
/// columns, forward medians 16.58 / 15.57 / 16.36 / 16.34 / 16.72 ms (48 faster in 5 of 5);
/// quiet 01:40:41, main / 48 / 96: forward 18.14 / 15.66 / 16.83 (a noisy window),
/// backward-data 16.93 / 16.28 / 17.94.
const BLOCK_COLS: usize = 48;

/// One tap's A packed once for every block of columns, read in place by the driver
/// ([`PackA::packed_a`]); `pack_a` (another panel height) packs from the rows.
struct CachedA<'a> {
    rows: RowsA<'a>,
    mr: usize,
    data: &'a [f32],
}

impl PackA for CachedA<'_> {
    fn rows(&self) -> usize {
        self.rows.rows()
    }
    fn cols(&self) -> usize {
        self.rows.cols
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        self.rows.pack_a(ic, mc, pc, kc, mr, dst)
    }
    fn packed_a(
        &self,
        ic: usize,
        _mc: usize,
        pc: usize,
        _kc: usize,
        mr: usize,
    ) -> Option<(&[f32], usize)> {
        let cols = self.rows.cols;
        (mr == self.mr && ic.is_multiple_of(mr))
            .then(|| (&self.data[(ic / mr * cols + pc) * mr..], cols * mr))
    }
}

/// `out` (rows × `n_out`, row-major) = Σ over taps of the gathered rows of `src` (`n_in`
/// wide) times the tap's B (`n_in × n_out`, [`Weights`]), on the pairs `pairs`. `rows` is the
/// number of output rows. Every tap's A is packed once (into `abuf`), then per block of
/// [`BLOCK_COLS`] columns the block's B of every tap is made from w (into `wbuf`) and the nine
/// products run on it.
#[allow(clippy::too_many_arguments)]
fn products(
    gemm: &Gemm,
    src: &[f32],
    n_in: usize,
    weights: &Weights<'_>,
    n_out: usize,
    pairs: &[(&[u32], &[u32])],
    rows: usize,
    out: &mut Vec<f32>,
    serial: bool,
    (abuf, wbuf): (&mut Vec<f32>, &mut Vec<f32>),
) -> Result<()> {
    out.resize(rows * n_out, 0.0);
    let mut starts = Vec::with_capacity(pairs.len() + 1);
    pack_taps(gemm, src, n_in, pairs, abuf, &mut starts);
    let taps = TapsA::new(gemm, src, n_in, abuf, &starts, pairs, rows);
    if taps.full.is_none() {
        out.fill(0.0);
    }
    let deep = crate::ops::one_pass(gemm, n_in, ONE_PASS_MAX).map_err(gemm_err)?;
    for j0 in (0..n_out).step_by(BLOCK_COLS) {
        let nb = BLOCK_COLS.min(n_out - j0);
        weights.block(gemm, j0, nb, wbuf)?;
        taps.products(&deep, weights, wbuf, nb, &mut out[j0..], n_out, serial)?;
    }
    Ok(())
}

/// Packs every tap's A (the rows `from` of `src`, `n_in` wide, of each of `pairs`) into
/// `abuf`, panel by panel over the whole depth, tap `t` at `starts[t]..starts[t + 1]`.
fn pack_taps(
    gemm: &Gemm,
    src: &[f32],
    n_in: usize,
    pairs: &[(&[u32], &[u32])],
    abuf: &mut Vec<f32>,
    starts: &mut Vec<usize>,
) {
    let mr = gemm.tile().0;
    starts.clear();
    starts.push(0);
    for (_, from) in pairs {
        starts.push(starts.last().copied().unwrap_or(0) + from.len().div_ceil(mr) * mr * n_in);
    }
    abuf.resize(*starts.last().unwrap_or(&0), 0.0);
    for (t, (_, from)) in pairs.iter().enumerate() {
        if !from.is_empty() {
            let rows = RowsA {
                gemm,
                data: src,
                ld: n_in,
                cols: n_in,
                rows: from,
            };
            rows.pack_a(
                0,
                from.len(),
                0,
                n_in,
                mr,
                &mut abuf[starts[t]..starts[t + 1]],
            );
        }
    }
}

/// One block of images' side of the tap products: its position-major input copy `src`
/// (`n_in` wide), every tap's A packed by [`pack_taps`] and the taps' pairs.
struct TapsA<'a> {
    gemm: &'a Gemm,
    src: &'a [f32],
    n_in: usize,
    a: &'a [f32],
    starts: &'a [usize],
    pairs: &'a [(&'a [u32], &'a [u32])],
    /// A tap that joins every one of the block's output rows: it writes first, the others
    /// add (without one, the caller zeroes the output first).
    full: Option<usize>,
}

impl<'a> TapsA<'a> {
    /// The block's taps (`rows` output rows).
    fn new(
        gemm: &'a Gemm,
        src: &'a [f32],
        n_in: usize,
        a: &'a [f32],
        starts: &'a [usize],
        pairs: &'a [(&'a [u32], &'a [u32])],
        rows: usize,
    ) -> Self {
        TapsA {
            gemm,
            src,
            n_in,
            a,
            starts,
            pairs,
            full: pairs.iter().position(|(to, _)| to.len() == rows),
        }
    }

    /// The taps' products on one block of `nb` columns, whose B of every tap
    /// [`Weights::block`] made in `wbuf`: output row `o` (`out[o · ld ..][.. nb]`) gets the
    /// sum over the taps joining it.
    #[allow(clippy::too_many_arguments)]
    fn products(
        &self,
        deep: &Gemm,
        weights: &Weights<'_>,
        wbuf: &[f32],
        nb: usize,
        out: &mut [f32],
        ld: usize,
        serial: bool,
    ) -> Result<()> {
        let mr = self.gemm.tile().0;
        let order = self
            .full
            .into_iter()
            .chain((0..self.pairs.len()).filter(|&t| Some(t) != self.full));
        for t in order {
            let (to, from) = self.pairs[t];
            if to.is_empty() {
                continue;
            }
            let a = CachedA {
                rows: RowsA {
                    gemm: self.gemm,
                    data: self.src,
                    ld: self.n_in,
                    cols: self.n_in,
                    rows: from,
                },
                mr,
                data: &self.a[self.starts[t]..self.starts[t + 1]],
            };
            let mut store = RowStore {
                ptr: out.as_mut_ptr(),
                len: out.len(),
                ld,
                cols: nb,
                rows: to,
                beta: if Some(t) == self.full { 0.0 } else { 1.0 },
                serial,
            };
            deep.gemm_with(&a, &weights.tap(wbuf, t, nb)?, &mut store)
                .map_err(gemm_err)?;
        }
        Ok(())
    }
}

/// Images per block: the larger position-major copy at most [`BLOCK_FLOATS`] (at least one).
fn block_images(g: &ConvGeometry) -> usize {
    let per =
        g.input_spatial_len().max(g.output_spatial_len()) * g.in_channels().max(g.out_channels());
    (BLOCK_FLOATS / per.max(1)).clamp(1, g.batch().max(1))
}

/// y = conv(x, w) (+ bias) (then ReLU) tap by tap ([`applies`]; inputs validated by the
/// caller).
pub(crate) fn forward(
    g: &ConvGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
) -> Result<()> {
    forward_in_blocks(g, x, w, bias, relu, y, block_images(g))
}

/// [`forward`] in blocks of `nb` images.
fn forward_in_blocks(
    g: &ConvGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
    nb: usize,
) -> Result<()> {
    let (c, k, r) = (g.in_channels(), g.out_channels(), g.kernel_len());
    let (ilen, olen) = (g.input_spatial_len(), g.output_spatial_len());
    let weights = Weights {
        w,
        k,
        c,
        r,
        backward: false,
    };
    blocks(g, x, (c, ilen), y, (k, olen), &weights, (bias, relu), nb)
}

/// dx = backward-data(dy, w) tap by tap ([`applies`]; inputs validated by the caller).
pub(crate) fn backward_data(g: &ConvGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
    backward_data_in_blocks(g, dy, w, dx, block_images(g))
}

/// [`backward_data`] in blocks of `nb` images.
fn backward_data_in_blocks(
    g: &ConvGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    nb: usize,
) -> Result<()> {
    let (c, k, r) = (g.in_channels(), g.out_channels(), g.kernel_len());
    let (ilen, olen) = (g.input_spatial_len(), g.output_spatial_len());
    let weights = Weights {
        w,
        k,
        c,
        r,
        backward: true,
    };
    blocks(g, dy, (k, olen), dx, (c, ilen), &weights, (None, false), nb)
}

/// The products of every block of (at most) `nb` images of `input` (`ch` channels of
/// `plane` values per image) into `output`, then bias and ReLU. With several threads and
/// several blocks (at least one per thread), [`side_by_side`], each product on one thread;
/// with one block, the products use every thread.
#[allow(clippy::too_many_arguments)]
fn blocks(
    g: &ConvGeometry,
    input: &[f32],
    (n_in, in_plane): (usize, usize),
    output: &mut [f32],
    (n_out, out_plane): (usize, usize),
    weights: &Weights<'_>,
    (bias, relu): (Option<&[f32]>, bool),
    nb: usize,
) -> Result<()> {
    let gemm = Gemm::global().map_err(gemm_err)?;
    let batch = g.batch();
    let threads = rayon::current_num_threads().max(1);
    let nb = nb.min(batch.div_ceil(threads)).max(1);
    let parallel = threads > 1 && batch > nb;
    let one = |full: &[(Vec<u32>, Vec<u32>)], inp: &[f32], out: &mut [f32]| -> Result<()> {
        let count = inp.len() / (n_in * in_plane);
        let pr = block_pairs(full, count * out_plane);
        let mut bufs = BUFFERS.with_borrow_mut(std::mem::take);
        let result = (|| {
            to_rows(gemm, inp, count, n_in, in_plane, &mut bufs.src)?;
            let rows = count * out_plane;
            products(
                gemm,
                &bufs.src,
                n_in,
                weights,
                n_out,
                &pr,
                rows,
                &mut bufs.dst,
                false,
                (&mut bufs.a, &mut bufs.w),
            )?;
            from_rows(gemm, &bufs.dst, n_out, out_plane, out, bias, relu)
        })();
        BUFFERS.with_borrow_mut(|kept| *kept = bufs);
        result
    };
    let (ib, ob) = (nb * n_in * in_plane, nb * n_out * out_plane);
    if parallel {
        side_by_side(
            gemm,
            &g.dims3(),
            input,
            (n_in, in_plane),
            output,
            (n_out, out_plane),
            weights,
            (bias, relu),
            nb,
        )
    } else {
        // The pairs of a full block; a shorter last block's are their first images' (pairs
        // are image-major within a tap).
        let full = pairs(&g.dims3(), nb, weights.backward);
        input
            .chunks(ib)
            .zip(output.chunks_mut(ob))
            .try_for_each(|(inp, out)| one(&full, inp, out))
    }
}

/// The pairs of a block whose output has `rows` rows: a full block's pairs `full` cut at those
/// rows (pairs are image-major within a tap, so a shorter block's are its first images').
fn block_pairs(full: &[(Vec<u32>, Vec<u32>)], rows: usize) -> Vec<(&[u32], &[u32])> {
    let end = rows as u32;
    full.iter()
        .map(|(to, from)| {
            let m = to.partition_point(|&v| v < end);
            (&to[..m], &from[..m])
        })
        .collect()
}

/// One block of images' copies for [`side_by_side`]: its taps' pairs ([`pairs`]), its
/// position-major input, its taps' A ([`pack_taps`]) and where each tap's starts.
#[derive(Default)]
struct SideBlock {
    pairs: Vec<(Vec<u32>, Vec<u32>)>,
    src: Vec<f32>,
    a: Vec<f32>,
    starts: Vec<usize>,
}

thread_local! {
    /// The blocks of images of the [`side_by_side`] call this thread makes.
    static SIDE: RefCell<Vec<SideBlock>> = const { RefCell::new(Vec::new()) };
}

/// [`blocks`] on several threads, one block of `nb` images each (the last maybe shorter): first
/// each block's pairs, input copy and taps' A are made side by side (the pairs inside the
/// parallel step, not before it: a serial step before the fork lets the other worker fall
/// asleep, see [`crate::shares`]); then each thread takes an even share of the output's full
/// [`BLOCK_COLS`]-wide column blocks, makes each such block of B from w once and runs the taps'
/// products of every block of images on it, and runs the columns left over (a partial block,
/// or full ones that do not share out evenly) on its own block of images only; then it writes
/// its columns of the output (channels, bias and ReLU). So w is read and de-interleaved (or
/// transposed) about once per call instead of once per thread: each thread making all of it
/// took 9.3% of 512@7²'s backward-data samples at 2 threads against 6.3% at 1 (perf, session
/// 35).
#[allow(clippy::too_many_arguments)]
fn side_by_side(
    gemm: &Gemm,
    d: &Dims3,
    input: &[f32],
    (n_in, in_plane): (usize, usize),
    output: &mut [f32],
    (n_out, out_plane): (usize, usize),
    weights: &Weights<'_>,
    (bias, relu): (Option<&[f32]>, bool),
    nb: usize,
) -> Result<()> {
    let batch = input.len() / (n_in * in_plane).max(1);
    let parts = batch.div_ceil(nb.max(1));
    let count = |b: usize| nb.min(batch - b * nb);
    let mut side = SIDE.with_borrow_mut(std::mem::take);
    side.resize_with(parts.max(side.len()), SideBlock::default);
    let result = (|| {
        // Both steps through `share_out`: the threads leave each step together, so the second
        // step's fork, and the next call's, find the other worker awake.
        let jobs: Vec<(&mut SideBlock, &[f32])> = side[..parts]
            .iter_mut()
            .zip(input.chunks(nb * n_in * in_plane))
            .collect();
        share_out(jobs, |b, (sb, inp)| -> Result<()> {
            sb.pairs = pairs(d, count(b), weights.backward);
            let pr = block_pairs(&sb.pairs, count(b) * out_plane);
            to_rows(
                gemm,
                inp,
                inp.len() / (n_in * in_plane),
                n_in,
                in_plane,
                &mut sb.src,
            )?;
            pack_taps(gemm, &sb.src, n_in, &pr, &mut sb.a, &mut sb.starts);
            Ok(())
        })?;
        let side = &side[..parts];
        let prs: Vec<Vec<(&[u32], &[u32])>> = side
            .iter()
            .enumerate()
            .map(|(b, sb)| block_pairs(&sb.pairs, count(b) * out_plane))
            .collect();
        let per = n_out / BLOCK_COLS / parts;
        let (wc, shared) = (per * BLOCK_COLS, per * BLOCK_COLS * parts);
        let rest = n_out - shared;
        // Each thread's pieces of the output: (image, first channel, its planes).
        let mut outs: Vec<Vec<(usize, usize, &mut [f32])>> =
            (0..parts).map(|_| Vec::new()).collect();
        for (n, img) in output.chunks_exact_mut(n_out * out_plane).enumerate() {
            let (mut left, tail) = img.split_at_mut(shared * out_plane);
            for (t, pieces) in outs.iter_mut().enumerate() {
                let (mine, more) = left.split_at_mut(wc * out_plane);
                if !mine.is_empty() {
                    pieces.push((n, t * wc, mine));
                }
                left = more;
            }
            if !tail.is_empty() {
                outs[n / nb].push((n, shared, tail));
            }
        }
        let deep = crate::ops::one_pass(gemm, n_in, ONE_PASS_MAX).map_err(gemm_err)?;
        share_out(outs, |own, pieces| -> Result<()> {
            let taps: Vec<TapsA<'_>> = side
                .iter()
                .zip(&prs)
                .enumerate()
                .map(|(b, (sb, pr))| {
                    TapsA::new(
                        gemm,
                        &sb.src,
                        n_in,
                        &sb.a,
                        &sb.starts,
                        pr,
                        count(b) * out_plane,
                    )
                })
                .collect();
            let mut bufs = BUFFERS.with_borrow_mut(std::mem::take);
            let result = (|| {
                // This thread's columns of every image's rows, then the columns left over
                // of its own images' rows.
                let all_rows = batch * out_plane;
                let own_rows = count(own) * out_plane;
                bufs.dst.resize(all_rows * wc + own_rows * rest, 0.0);
                let (sh, rm) = bufs.dst.split_at_mut(all_rows * wc);
                for (b, t) in taps.iter().enumerate() {
                    if t.full.is_none() {
                        sh[b * nb * out_plane * wc..][..count(b) * out_plane * wc].fill(0.0);
                    }
                }
                if taps[own].full.is_none() {
                    rm.fill(0.0);
                }
                for q in 0..per {
                    weights.block(gemm, own * wc + q * BLOCK_COLS, BLOCK_COLS, &mut bufs.w)?;
                    for (b, t) in taps.iter().enumerate() {
                        let out = &mut sh[b * nb * out_plane * wc + q * BLOCK_COLS..];
                        t.products(&deep, weights, &bufs.w, BLOCK_COLS, out, wc, true)?;
                    }
                }
                for j0 in (shared..n_out).step_by(BLOCK_COLS) {
                    let cols = BLOCK_COLS.min(n_out - j0);
                    weights.block(gemm, j0, cols, &mut bufs.w)?;
                    let out = &mut rm[j0 - shared..];
                    taps[own].products(&deep, weights, &bufs.w, cols, out, rest, true)?;
                }
                for (n, c0, planes) in pieces {
                    let (rows, ch) = if c0 < shared {
                        (&sh[n * out_plane * wc..][..out_plane * wc], wc)
                    } else {
                        (
                            &rm[(n - own * nb) * out_plane * rest..][..out_plane * rest],
                            rest,
                        )
                    };
                    from_rows(
                        gemm,
                        rows,
                        ch,
                        out_plane,
                        planes,
                        bias.map(|b| &b[c0..]),
                        relu,
                    )?;
                }
                Ok(())
            })();
            BUFFERS.with_borrow_mut(|kept| *kept = bufs);
            result
        })
    })();
    SIDE.with_borrow_mut(|kept| *kept = side);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Tolerance, uniform};
    use crate::{BackwardDataAlgo, ForwardAlgo, Workspace, reference};

    /// Odd sizes, strides, padding per side, dilation, 1-D / 2-D / 3-D, depths run in one pass,
    /// blocks of 1, 2 and 4 images (a short last block), on 1, 2 and 3 threads; forward
    /// (without and with bias + ReLU) and backward-data against the reference, run directly
    /// (also on layers [`applies`] would not take).
    #[test]
    fn tap_products_match_the_reference() {
        let geoms = [
            ConvGeometry::new(3, 32, 40, &[7, 7], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(5, 21, 19, &[5, 6], &[3, 3])
                .unwrap()
                .with_padding_per_side(&[1, 2], &[0, 1])
                .unwrap(),
            ConvGeometry::new(5, 7, 9, &[6, 5], &[3, 2])
                .unwrap()
                .with_stride(&[2, 1])
                .unwrap()
                .with_dilation(&[1, 2])
                .unwrap()
                .with_padding(&[2])
                .unwrap(),
            ConvGeometry::new(2, 5, 6, &[3, 4, 5], &[3, 3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(3, 4, 3, &[11], &[5])
                .unwrap()
                .with_stride(&[3])
                .unwrap()
                .with_padding(&[2])
                .unwrap(),
            // Depths past the table's KC, run in one pass (`one_pass`): C 400 forward, K 416
            // backward-data.
            ConvGeometry::new(1, 400, 416, &[3, 3], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            // No tap joins every output position (dilation 2 on a 3-wide plane).
            ConvGeometry::new(2, 3, 5, &[3, 3], &[3, 3])
                .unwrap()
                .with_padding(&[2])
                .unwrap()
                .with_dilation(&[2])
                .unwrap(),
            // Output columns past two and three threads' `BLOCK_COLS`: on several threads
            // [`side_by_side`] shares full column blocks over every block of images and runs
            // the rest (full and partial blocks) on each thread's own images; 150 and 100
            // channels.
            ConvGeometry::new(5, 100, 150, &[4, 5], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(3, 40, 100, &[3, 3], &[3, 3])
                .unwrap()
                .with_padding(&[2])
                .unwrap()
                .with_dilation(&[2])
                .unwrap(),
        ];
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| check_tap_products(&geoms));
        }
    }

    fn check_tap_products(geoms: &[ConvGeometry]) {
        let threads = rayon::current_num_threads();
        for g in geoms {
            let x = uniform(1, g.x_len());
            let w = uniform(2, g.w_len());
            let dy = uniform(3, g.y_len());
            let bias = uniform(4, g.out_channels());
            for nb in [1, 2, 4] {
                for (b, relu) in [(None, false), (Some(&bias[..]), true)] {
                    let mut want = vec![0.0; g.y_len()];
                    reference::forward(g, &x, &w, b, &mut want).unwrap();
                    if relu {
                        want.iter_mut().for_each(|v| *v = v.max(0.0));
                    }
                    let mut y = vec![f32::NAN; g.y_len()];
                    forward_in_blocks(g, &x, &w, b, relu, &mut y, nb).unwrap();
                    Tolerance::for_f32_sum(g.in_channels() * g.kernel_len())
                        .check("y", &y, &want)
                        .unwrap_or_else(|e| panic!("{g:?} nb {nb} {threads} threads: {e}"));
                }
                let mut want = vec![0.0; g.x_len()];
                reference::backward_data(g, &dy, &w, &mut want).unwrap();
                let mut dx = vec![f32::NAN; g.x_len()];
                backward_data_in_blocks(g, &dy, &w, &mut dx, nb).unwrap();
                Tolerance::for_f32_sum(g.out_channels() * g.kernel_len())
                    .check("dx", &dx, &want)
                    .unwrap_or_else(|e| panic!("{g:?} nb {nb} {threads} threads: {e}"));
            }
        }
    }

    /// [`CachedA`] hands over the same panels [`RowsA`] packs, for any block the driver asks
    /// (offsets inside the whole-depth panels), and packs through [`RowsA`] for another panel
    /// height.
    #[test]
    fn cached_a_matches_the_packed_rows() {
        let gemm = Gemm::global().unwrap();
        let mr = gemm.tile().0;
        let (n, cols) = (40, 37);
        let src = uniform(9, n * cols);
        let from: Vec<u32> = (0..n as u32).rev().step_by(2).chain([3, 5, 7]).collect();
        let rows = RowsA {
            gemm,
            data: &src,
            ld: cols,
            cols,
            rows: &from,
        };
        let m = from.len();
        let mut data = vec![f32::NAN; m.div_ceil(mr) * mr * cols];
        rows.pack_a(0, m, 0, cols, mr, &mut data);
        let cached = CachedA {
            rows: RowsA { ..rows },
            mr,
            data: &data,
        };
        for (ic, mc, pc, kc) in [(0, m, 0, cols), (mr, m - mr, 5, 20), (0, mr, 30, 7)] {
            let (panels, stride) = cached.packed_a(ic, mc, pc, kc, mr).unwrap();
            let mut want = vec![f32::NAN; mc.div_ceil(mr) * mr * kc];
            rows.pack_a(ic, mc, pc, kc, mr, &mut want);
            for (q, panel) in want.chunks_exact(kc * mr).enumerate() {
                assert_eq!(
                    &panels[q * stride..][..kc * mr],
                    panel,
                    "block {ic} {pc} panel {q}"
                );
            }
        }
        assert!(cached.packed_a(1, 2, 0, cols, mr).is_none());
        assert!(cached.packed_a(0, m, 0, cols, mr + 1).is_none());
        let mut a = vec![f32::NAN; m.div_ceil(mr + 1) * (mr + 1) * cols];
        let mut b = a.clone();
        cached.pack_a(0, m, 0, cols, mr + 1, &mut a);
        rows.pack_a(0, m, 0, cols, mr + 1, &mut b);
        assert_eq!(a, b);
    }

    /// The public passes take this path where [`applies`] says so (a 512@7²-like layer: 18%
    /// of the pairs in the padding), and not elsewhere.
    #[test]
    fn public_passes_take_the_tap_products() {
        let g = ConvGeometry::new(2, 256, 264, &[7, 7], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        assert!(applies(&g));
        let x = uniform(5, g.x_len());
        let w = uniform(6, g.w_len());
        let dy = uniform(7, g.y_len());
        let mut ws = Workspace::new(false);
        let mut want = vec![0.0; g.y_len()];
        reference::forward(&g, &x, &w, None, &mut want).unwrap();
        let mut y = vec![f32::NAN; g.y_len()];
        crate::forward(
            &g,
            &x,
            &w,
            None,
            false,
            &mut y,
            ForwardAlgo::Convgemm,
            &mut ws,
        )
        .unwrap();
        Tolerance::for_f32_sum(256 * 9)
            .check("y", &y, &want)
            .unwrap();
        let mut want = vec![0.0; g.x_len()];
        reference::backward_data(&g, &dy, &w, &mut want).unwrap();
        for algo in [
            BackwardDataAlgo::Deconvgemm,
            BackwardDataAlgo::FlippedConvgemm,
        ] {
            let mut dx = vec![f32::NAN; g.x_len()];
            crate::backward_data(&g, &dy, &w, &mut dx, algo, &mut ws).unwrap();
            Tolerance::for_f32_sum(264 * 9)
                .check("dx", &dx, &want)
                .unwrap();
        }
        let pad1 = |n, c: usize, s: usize| {
            ConvGeometry::new(n, c, c, &[s, s], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap()
        };
        // Large planes, few channels, little padding.
        for g in [pad1(2, 256, 56), pad1(2, 128, 7), pad1(2, 256, 14)] {
            assert!(!applies(&g), "{g:?}");
        }
        assert!(applies(&pad1(8, 256, 7)));
    }
}
