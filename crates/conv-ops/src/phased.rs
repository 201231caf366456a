//! Backward-data of a strided layer as one stride-1 convolution per output *phase*: with
//! stride s along a dimension, the input positions i with the same (i + pad) mod s (the phase a)
//! receive gradient only from the kernel taps r ≡ a (mod s), r = a + s·t, and from output o =
//! m − t where i = s·m + a − pad. So the phase's dx is the stride-1 convolution of dy with the
//! sub-kernel w\[a + s·(T − 1 − u)\] (taps reversed, T of them, input and output channels
//! swapped), over dy padded by `T − 1 − m_lo` before. The phases' products cover every tap
//! exactly once (no product of padding beyond the forward's own), each writes its own dx
//! elements (no col2im add, no zero fill of dx), and each runs as a forward convgemm (im2col of
//! dy fused into B packing, inside the first tile of each panel where the kernel can) whose C
//! panels are copied into dx with the phase's stride (stride 2: two phases' panel rows
//! interleaved into one dx line by core-blas's [`ConvPack::interleave_rows`], or the four
//! phases of 2-D stride 2 into an even and an odd dx line at once by
//! [`ConvPack::interleave_lines`]: whole 64-byte lines, written around the cache when dx is
//! large).
//!
//! Taken by [`crate::BackwardDataAlgo::Deconvgemm`] on strided layers ([`applies`]): no
//! groups, no dilation, every kernel extent at least its stride (every phase has a tap).
//! Workspace: the phases' sub-kernels (K/G·C/G·R floats in all, per call) and one C panel per
//! thread; nothing grows with the batch.

use core_blas::{ConvPack, DenseStore, MatMut, PackA, PackB};

use crate::Result;
use crate::convgemm::Im2colB;
use crate::error::gemm_err;
use crate::geometry::{ConvGeometry, MAX_RANK};
use crate::layout::{Columns, OneThread, Prepacked, with_panel, with_prepacked};

/// Whether [`backward_data`] takes `g`: a stride above 1, one group, dilation 1, every kernel
/// extent at least its stride, and every phase's transposed padding non-negative.
pub(crate) fn applies(g: &ConvGeometry) -> bool {
    g.stride().iter().any(|&s| s > 1)
        && g.groups() == 1
        && g.dilation().iter().all(|&d| d == 1)
        && (0..g.rank()).all(|d| g.kernel()[d] >= g.stride()[d])
        && phases(g).is_some_and(|ph| {
            ph.iter()
                .all(|p| p[..g.rank()].iter().any(|d| d.count == 0) || phase_geometry(g, p).is_ok())
        })
}

/// The stride-1 convolution whose output is phase `ph` of dx: dy as input (K channels), C
/// output channels, the phase's taps, its padding.
fn phase_geometry(g: &ConvGeometry, ph: &[Dim; MAX_RANK]) -> Result<ConvGeometry> {
    let rank = g.rank();
    let taps: Vec<usize> = ph[..rank].iter().map(|d| d.taps).collect();
    let before: Vec<usize> = ph[..rank].iter().map(|d| d.before).collect();
    let after: Vec<usize> = ph[..rank].iter().map(|d| d.after).collect();
    ConvGeometry::from_parts(
        g.batch(),
        g.out_channels(),
        g.in_channels(),
        g.output(),
        &taps,
        &[1],
        &[1],
        &before,
        &after,
        1,
    )
}

/// One dimension of one phase.
#[derive(Clone, Copy, Debug)]
struct Dim {
    /// Taps of the sub-kernel (`a + s·t`, `t < taps`).
    taps: usize,
    /// The phase's first tap.
    a: usize,
    /// dx positions of the phase: `first + s·m'` for `m' < count`.
    first: usize,
    count: usize,
    /// The sub-convolution's padding of dy.
    before: usize,
    after: usize,
}

/// Every phase (row-major over the dimensions' phases) as its per-dimension description, or
/// `None` when one has a negative padding (outside [`applies`]).
fn phases(g: &ConvGeometry) -> Option<Vec<[Dim; MAX_RANK]>> {
    let rank = g.rank();
    let mut per_dim: Vec<Vec<Dim>> = Vec::with_capacity(rank);
    for d in 0..rank {
        let (s, k, p) = (g.stride()[d], g.kernel()[d], g.pad_before()[d] as isize);
        let (len, out) = (g.input()[d] as isize, g.output()[d] as isize);
        let mut dims = Vec::with_capacity(s);
        for a in 0..s {
            let taps = (k - a).div_ceil(s);
            let ai = a as isize;
            let si = s as isize;
            // m with 0 <= s·m + a − p < len.
            let m_lo = (p - ai + si - 1).div_euclid(si);
            let m_hi = (len - 1 + p - ai).div_euclid(si);
            let count = m_hi - m_lo + 1;
            if count <= 0 {
                // No dx position in this phase (tiny inputs): nothing to compute.
                dims.push(Dim {
                    taps,
                    a,
                    first: 0,
                    count: 0,
                    before: 0,
                    after: 0,
                });
                continue;
            }
            let before = taps as isize - 1 - m_lo;
            // dy positions read: m' + m_lo − (taps − 1) + u for m' < count, u < taps.
            let after = (count - 1 + m_lo) - (out - 1);
            if before < 0 || after < 0 {
                return None;
            }
            dims.push(Dim {
                taps,
                a,
                first: (si * m_lo + ai - p) as usize,
                count: count as usize,
                before: before as usize,
                after: after as usize,
            });
        }
        per_dim.push(dims);
    }
    let total: usize = per_dim.iter().map(Vec::len).product();
    let empty = Dim {
        taps: 1,
        a: 0,
        first: 0,
        count: 1,
        before: 0,
        after: 0,
    };
    Some(
        (0..total)
            .map(|mut q| {
                let mut ph = [empty; MAX_RANK];
                for d in (0..rank).rev() {
                    let s = per_dim[d].len();
                    ph[d] = per_dim[d][q % s];
                    q /= s;
                }
                ph
            })
            .collect(),
    )
}

/// dx as a raw pointer shared by the column blocks of one phase, which write disjoint elements.
#[derive(Clone, Copy)]
struct Dx {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the blocks holding a `Dx` at once write the dx elements of disjoint columns (image,
// phase position) of one set of phases; the `&mut dx` borrow of `backward_data` outlives them.
unsafe impl Sync for Dx {}

/// Floats of one C panel (C/G rows × a block of columns), as the forward's C panels.
const PANEL_FLOATS: usize = 128 * 1024;

/// dx of at least this many bytes is written with non-temporal stores where whole 64-byte
/// lines are written at once ([`ConvPack::interleave_lines`]).
const STREAM_BYTES: usize = 4 << 20;

/// dx = backward-data(dy, w) phase by phase (inputs validated by the caller; `applies(g)`).
pub(crate) fn backward_data(g: &ConvGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
    let phases = phases(g).ok_or_else(|| crate::error::ConvError::Unsupported {
        algo: "deconvgemm (phased)",
        reason: "a phase's padding would be negative".into(),
    })?;
    let rank = g.rank();
    let c = g.in_channels();
    let nr = core_blas::Gemm::global().map_err(gemm_err)?.tile().1;
    let threads = rayon::current_num_threads().max(1);
    let in_plane = g.input_spatial_len();
    // Input strides of dx's dimensions.
    let mut istride = [0usize; MAX_RANK];
    let mut acc = 1;
    for d in (0..rank).rev() {
        istride[d] = acc;
        acc *= g.input()[d];
    }
    let out = Dx {
        ptr: dx.as_mut_ptr(),
        len: dx.len(),
    };
    let sl = g.stride()[rank - 1];
    // The phases in sets whose C panels are computed side by side and written into dx
    // together. Stride 2 along the innermost dimension with every phase of the same shape:
    // all phases at once (2-D stride 2: the two phases of an even dx line and the two of the
    // odd line after it fill both lines, 2·2·len values, whole cache lines written once),
    // unless that makes the panel's column blocks narrower than 4·NR (many channels: A is
    // packed once per block; 256@28² stride 2 ran 20.3 ms so against 19.2-19.7 in pairs).
    // Otherwise groups of the innermost dimension's `sl` phases (the enumeration's innermost)
    // when they have the same positions per line, so that every dx line is written in one
    // pass (phase by phase, each pass would write every other value of the same lines).
    let all = sl == 2
        && PANEL_FLOATS / (c * phases.len()) >= 4 * nr
        && phases
            .iter()
            .all(|ph| (0..rank).all(|d| ph[d].count > 0 && ph[d].count == phases[0][d].count));
    let groups: Vec<&[[Dim; MAX_RANK]]> = if all {
        vec![&phases[..]]
    } else {
        phases.chunks(sl).collect()
    };
    let cp = ConvPack::global().map_err(gemm_err)?;
    // dx too large to stay in cache until it is read: its whole lines written around it.
    let stream = size_of_val(dx) >= STREAM_BYTES;
    for group in groups {
        let live: Vec<&[Dim; MAX_RANK]> = group
            .iter()
            .filter(|ph| ph[..rank].iter().all(|d| d.count > 0))
            .collect();
        let together = live.len() == group.len()
            && live
                .iter()
                .all(|ph| ph[rank - 1].count == live[0][rank - 1].count);
        let sets: Vec<Vec<&[Dim; MAX_RANK]>> = if together {
            vec![live]
        } else {
            live.into_iter().map(|ph| vec![ph]).collect()
        };
        for set in sets {
            let mut a = Vec::with_capacity(set.len());
            let mut gps = Vec::with_capacity(set.len());
            for ph in &set {
                let gp = phase_geometry(g, ph)?;
                debug_assert!((0..rank).all(|d| gp.output()[d] == ph[d].count));
                a.push(SubKernel::new(g, ph, gp.kernel_len(), w));
                gps.push(gp);
            }
            // Several column blocks: each phase's A packed once for all of them (each block's
            // products would pack all of it again).
            let n_all = gps[0].batch() * gps[0].output_spatial_len();
            let mr = core_blas::Gemm::global().map_err(gemm_err)?.tile().0;
            let prepack = n_all > PANEL_FLOATS / (c * set.len());
            with_prepacked(|buf| {
                let pre: Vec<Prepacked<'_>> = if prepack {
                    Prepacked::pack_all(&a, mr, threads, buf)
                } else {
                    Vec::new()
                };
                // Stride-1 convolutions of dy: their full panels are packed inside the GEMM's
                // first tiles where the kernel can.
                let b: Vec<Im2colB<'_>> = gps
                    .iter()
                    .map(|gp| Im2colB::new(gp, 0, dy).with_fused_packing())
                    .collect();
                let ph0 = set[0];
                let n = b[0].cols();
                let mplane = gps[0].output_spatial_len();
                let m = set.len();
                let target = (PANEL_FLOATS / (c * m)).max(4 * nr);
                let blocks = n.div_ceil(target).div_ceil(threads) * threads;
                let last = ph0[rank - 1];
                // All four phases of 2-D stride 2: blocks of whole dx line pairs where they fit.
                let line = (m == 4 && rank == 2 && sl == 2).then_some(last.count);
                let cols_max = block_columns(n, blocks, nr, line, threads);
                let blocks = n.div_ceil(cols_max);
                // Per phase of the set: its first position along the innermost dimension and the
                // dx offset of its outer position relative to the first phase's (the set's
                // phases share their positions: same counts).
                let firsts: Vec<usize> = set.iter().map(|ph| ph[rank - 1].first).collect();
                let shifts: Vec<isize> = set
                    .iter()
                    .map(|ph| {
                        (0..rank - 1)
                            .map(|d| {
                                (ph[d].first as isize - ph0[d].first as isize) * istride[d] as isize
                            })
                            .sum()
                    })
                    .collect();
                // Stride 2 along the line: the set is pairs of phases side by side (the phases
                // 2p and 2p + 1 fill one dx line; their first positions differ by one).
                let pairs = sl == 2
                    && m.is_multiple_of(2)
                    && (0..m / 2).all(|p| {
                        firsts[2 * p].abs_diff(firsts[2 * p + 1]) == 1
                            && shifts[2 * p] == shifts[2 * p + 1]
                    });
                let run = |blk: usize| -> Result<()> {
                    // The whole `Dx` (Sync), not its pointer field alone.
                    let dxs = out;
                    let j0 = blk * cols_max;
                    let cols = cols_max.min(n - j0);
                    with_panel(m * c * cols, |panel| {
                        for (i, (b, p)) in
                            b.iter().zip(panel.chunks_exact_mut(c * cols)).enumerate()
                        {
                            let cm =
                                MatMut::row_major("panel", p, c, cols, cols).map_err(gemm_err)?;
                            let mut store = OneThread(DenseStore::new(cm, 1.0, 0.0));
                            let bc = Columns { b, j0, cols };
                            match pre.get(i) {
                                Some(pa) => core_blas::gemm_with(pa, &bc, &mut store),
                                None => core_blas::gemm_with(&a[i], &bc, &mut store),
                            }
                            .map_err(gemm_err)?;
                        }
                        // Runs along the innermost dimension: one dx line of the phases each.
                        let mut t = 0;
                        while t < cols {
                            let j = j0 + t;
                            let (img, pos) = (j / mplane, j % mplane);
                            let ml = pos % last.count;
                            let len = (cols - t).min(last.count - ml);
                            // dx offset of (img, channel 0, the first phase's outer position,
                            // line position sl·ml).
                            let mut rem = pos / last.count;
                            let mut off = img * c * in_plane + sl * ml * istride[rank - 1];
                            for d in (0..rank - 1).rev() {
                                let q = rem % ph0[d].count;
                                rem /= ph0[d].count;
                                off += (ph0[d].first + g.stride()[d] * q) * istride[d];
                            }
                            // dx offset of phase i's first value of channel 0 in this run.
                            let at = |i: usize| off.wrapping_add_signed(shifts[i]) + firsts[i];
                            if pairs {
                                // Per pair: its (lo, hi) phases and where its values of
                                // channel 0 start in dx.
                                let pair = |p: usize| {
                                    let (lo, hi) = if firsts[2 * p] < firsts[2 * p + 1] {
                                        (2 * p, 2 * p + 1)
                                    } else {
                                        (2 * p + 1, 2 * p)
                                    };
                                    (lo, hi, at(lo))
                                };
                                let src = |i: usize| panel.as_ptr().wrapping_add(i * c * cols + t);
                                let (a, b) = (pair(0), pair(m / 2 - 1));
                                // Two pairs filling two consecutive dx lines whole (runs of
                                // whole lines): both lines of a channel in one pass.
                                let lines =
                                    m == 4 && (a.2 + 2 * len == b.2 || b.2 + 2 * len == a.2);
                                if lines {
                                    let (e, o) = if a.2 < b.2 { (a, b) } else { (b, a) };
                                    assert!(e.2 + (c - 1) * in_plane + 4 * len <= dxs.len);
                                    assert!((m * c - 1) * cols + t + len <= panel.len());
                                    // SAFETY: row cc < c writes the 4·len dx elements of
                                    // channel cc from `e.2 + cc·in_plane`: the four phases'
                                    // values at this run's positions on the two lines, inside
                                    // dx (checked above), written only by this block (see
                                    // `Dx`); it reads `len` values of each phase's panel row
                                    // cc from column t (inside the panel, checked above; the
                                    // panel is not dx).
                                    unsafe {
                                        cp.interleave_lines(
                                            dxs.ptr.add(e.2),
                                            in_plane,
                                            [src(e.0), src(e.1), src(o.0), src(o.1)],
                                            cols,
                                            c,
                                            len,
                                            stream,
                                        )
                                    };
                                } else {
                                    for p in 0..m / 2 {
                                        let (lo, hi, d0) = pair(p);
                                        assert!(d0 + (c - 1) * in_plane + 2 * len <= dxs.len);
                                        assert!(
                                            (hi.max(lo) * c + c - 1) * cols + t + len
                                                <= panel.len()
                                        );
                                        // SAFETY: row cc < c writes the 2·len dx elements of
                                        // channel cc from `d0 + cc·in_plane`: the two phases'
                                        // values at this run's positions, inside dx (checked
                                        // above), written only by this block (see `Dx`); it
                                        // reads `len` values of each phase's panel row cc from
                                        // column t (inside the panel, checked above; the panel
                                        // is not dx).
                                        unsafe {
                                            cp.interleave_rows(
                                                dxs.ptr.add(d0),
                                                in_plane,
                                                src(lo),
                                                src(hi),
                                                cols,
                                                c,
                                                len,
                                            )
                                        };
                                    }
                                }
                            } else {
                                for (i, phase) in panel.chunks_exact(c * cols).enumerate() {
                                    let d0 = at(i);
                                    assert!(d0 + (c - 1) * in_plane + sl * (len - 1) < dxs.len);
                                    for (cc, row) in phase.chunks_exact(cols).enumerate() {
                                        for (q, &v) in row[t..t + len].iter().enumerate() {
                                            // SAFETY: `d0 + cc·in_plane + sl·q` is dx's element of
                                            // channel cc at phase i's position (img, pos + q):
                                            // inside dx (checked above), and only this block
                                            // writes its columns (see `Dx`).
                                            unsafe {
                                                *dxs.ptr.add(d0 + cc * in_plane + sl * q) = v
                                            };
                                        }
                                    }
                                }
                            }
                            t += len;
                        }
                        Ok(())
                    })
                };
                // The threads leave together (see `crate::shares`; one thread or one block:
                // in order on this thread).
                crate::shares::share_out(vec![(); blocks], |blk, ()| run(blk))
            })?;
        }
    }
    Ok(())
}

/// Columns of one column block of [`backward_data`]'s products: `n` columns in about `blocks`
/// blocks of whole NR-panels. With `line` (the four phases of 2-D stride 2, written into dx
/// two lines at a time), when that is not a whole number of lines, the largest multiple of
/// both NR and the line below it (or the smallest, if that is at most 1.5 times as wide),
/// provided the busiest thread does no more columns with it: every run of a block then covers
/// whole lines ([`ConvPack::interleave_lines`] for every run, none cut by a block's end).
/// ResNet-50's 128@56² stride 2: 288 → 336 columns (12 lines of 28, 7 panels of 48), 22 → 19
/// blocks: criterion `bwd-data/deconvgemm/t1` 17.71 / 17.52 and 17.95 / 17.73 ms (quiet
/// 07:26:30 UTC); at 2 threads 19 blocks leave one thread a block more (9.24 / 9.30, 9.20 /
/// 9.51 ms), so it keeps 288 there.
fn block_columns(n: usize, blocks: usize, nr: usize, line: Option<usize>, threads: usize) -> usize {
    let cols = n.div_ceil(blocks).div_ceil(nr) * nr;
    let Some(line) = line.filter(|&l| l > 0 && !cols.is_multiple_of(l)) else {
        return cols;
    };
    let (mut x, mut y) = (nr, line);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    let both = nr / x * line;
    let whole = (cols / both).max(1) * both;
    // Columns of the busiest thread with blocks of `c` columns.
    let busiest = |c: usize| (n.div_ceil(c).div_ceil(threads) * c).min(n);
    if 2 * whole <= 3 * cols && busiest(whole) <= busiest(cols) {
        whole
    } else {
        cols
    }
}

/// The sub-kernel of phase `ph` as the A operand of its convolution, C × (K · T), read from
/// w as it is: row c, column kk·T + u = w\[kk\]\[c\]\[tap(u)\], tap(u) = a + s·(T − 1 − u)
/// per dimension. Packed straight from w (each micro-panel's rows of one kk are `mr · R`
/// consecutive values of w), with no transposed copy.
struct SubKernel<'a> {
    w: &'a [f32],
    c: usize,
    k: usize,
    /// The layer's kernel size (R: w's values per output/input channel pair).
    r: usize,
    /// tap(u) for u < T.
    taps: Vec<usize>,
}

impl<'a> SubKernel<'a> {
    fn new(g: &ConvGeometry, ph: &[Dim; MAX_RANK], tl: usize, w: &'a [f32]) -> Self {
        let rank = g.rank();
        let taps = (0..tl)
            .map(|u| {
                let (mut rem, mut tap, mut mul) = (u, 0, 1);
                for d in (0..rank).rev() {
                    let (td, ud) = (ph[d].taps, rem % ph[d].taps);
                    rem /= ph[d].taps;
                    tap += (ph[d].a + g.stride()[d] * (td - 1 - ud)) * mul;
                    mul *= g.kernel()[d];
                }
                tap
            })
            .collect();
        SubKernel {
            w,
            c: g.in_channels(),
            k: g.out_channels(),
            r: g.kernel_len(),
            taps,
        }
    }
}

impl PackA for SubKernel<'_> {
    fn rows(&self) -> usize {
        self.c
    }
    fn cols(&self) -> usize {
        self.k * self.taps.len()
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        let tl = self.taps.len();
        for (q, panel) in dst[..mc.div_ceil(mr) * mr * kc]
            .chunks_exact_mut(mr * kc)
            .enumerate()
        {
            let i0 = ic + q * mr;
            let live = mr.min(ic + mc - i0);
            for (p, col) in panel.chunks_exact_mut(mr).enumerate() {
                let (kk, u) = ((pc + p) / tl, (pc + p) % tl);
                let from = (kk * self.c + i0) * self.r + self.taps[u];
                for (i, v) in col.iter_mut().enumerate() {
                    *v = if i < live {
                        self.w[from + i * self.r]
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Tolerance, uniform};
    use crate::{BackwardDataAlgo, Workspace, reference};
    use core_blas::MatRef;

    /// The sub-kernel as the explicit C × (K · T) matrix (w transposed per phase).
    fn explicit(g: &ConvGeometry, ph: &[Dim; MAX_RANK], tl: usize, w: &[f32]) -> Vec<f32> {
        let (rank, c, k, r) = (g.rank(), g.in_channels(), g.out_channels(), g.kernel_len());
        let mut wt = vec![0f32; c * k * tl];
        for u in 0..tl {
            let (mut rem, mut tap, mut mul) = (u, 0, 1);
            for d in (0..rank).rev() {
                let (td, ud) = (ph[d].taps, rem % ph[d].taps);
                rem /= ph[d].taps;
                tap += (ph[d].a + g.stride()[d] * (td - 1 - ud)) * mul;
                mul *= g.kernel()[d];
            }
            for cc in 0..c {
                for kk in 0..k {
                    wt[(cc * k + kk) * tl + u] = w[(kk * c + cc) * r + tap];
                }
            }
        }
        wt
    }

    /// `ConvGeometry::new(n, c, k, input, kernel)` with `stride` and `padding`.
    fn strided(
        n: usize,
        c: usize,
        k: usize,
        input: &[usize],
        kernel: &[usize],
        stride: &[usize],
        padding: &[usize],
    ) -> ConvGeometry {
        ConvGeometry::new(n, c, k, input, kernel)
            .unwrap()
            .with_stride(stride)
            .unwrap()
            .with_padding(padding)
            .unwrap()
    }
    /// [`SubKernel`] packs every block (whole and partial micro-panels, column offsets, tile
    /// heights 6 and 8) as the packing of its explicit matrix does, for every phase of strided
    /// 1-3-D layers.
    #[test]
    fn sub_kernel_packs_as_its_matrix() {
        let geoms = [
            strided(1, 19, 5, &[9, 9], &[3, 3], &[2], &[1]),
            strided(1, 13, 6, &[11, 10], &[4, 5], &[3, 2], &[1, 2]),
            strided(1, 9, 3, &[5, 6, 7], &[3, 3, 3], &[2], &[1]),
        ];
        for g in &geoms {
            let w = uniform(5, g.w_len());
            for ph in phases(g).unwrap() {
                let tl = phase_geometry(g, &ph).unwrap().kernel_len();
                let wt = explicit(g, &ph, tl, &w);
                let (c, kt) = (g.in_channels(), g.out_channels() * tl);
                let m = MatRef::row_major("w", &wt, c, kt, kt).unwrap();
                let s = SubKernel::new(g, &ph, tl, &w);
                assert_eq!((s.rows(), s.cols()), (c, kt));
                for mr in [6, 8] {
                    for (ic, mc) in [(0, c), (0, mr), (mr, c - mr), (c - 3, 3)] {
                        for (pc, kc) in [(0, kt), (1, kt - 1), (kt / 2, kt - kt / 2)] {
                            let len = mc.div_ceil(mr) * mr * kc;
                            let (mut got, mut want) = (vec![f32::NAN; len], vec![f32::NAN; len]);
                            s.pack_a(ic, mc, pc, kc, mr, &mut got);
                            m.pack_a(ic, mc, pc, kc, mr, &mut want);
                            assert_eq!(
                                got, want,
                                "{g:?}, {ph:?}, mr {mr} ({ic}, {mc}, {pc}, {kc})"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Layers of several column blocks (the phases' sub-kernels packed once for all of them):
    /// all phases at once (even sizes; both dx lines of a channel at once, runs of 24 and 28
    /// values, the latter with dx over [`STREAM_BYTES`]: streaming stores, blocks of whole
    /// lines on 1 thread and cut lines on 2, [`block_columns`]) and phase by phase (odd sizes,
    /// 3-D), on 1 and 2 threads, against the reference.
    #[test]
    fn block_columns_are_whole_lines_where_no_thread_gets_more() {
        // ResNet-50 128@56² stride 2 (6272 columns, 28-value lines, 22 planned blocks): 12
        // lines (7 panels of 48) on 1 thread; 2 threads keep 288 (19 blocks would leave one
        // thread 10 of them); no line given, or lines that divide the blocks: as planned.
        assert_eq!(block_columns(6272, 22, 48, Some(28), 1), 336);
        assert_eq!(block_columns(6272, 22, 48, Some(28), 2), 288);
        assert_eq!(block_columns(6272, 22, 48, None, 1), 288);
        assert_eq!(block_columns(6272, 22, 48, Some(24), 1), 288);
        // The test layer below (112 channels, 3 × 28²): 288 → 336 on 1 thread, 240 kept on 2.
        assert_eq!(block_columns(2352, 9, 48, Some(28), 1), 336);
        assert_eq!(block_columns(2352, 10, 48, Some(28), 2), 240);
        // Whole lines only up to 1.5 times the planned width: 7-value lines with 96 planned.
        assert_eq!(block_columns(4000, 42, 48, Some(7), 1), 96);
    }

    #[test]
    fn several_column_blocks_match_the_reference() {
        let geoms = [
            strided(2, 64, 16, &[48, 48], &[3, 3], &[2], &[1]),
            strided(3, 112, 8, &[56, 56], &[3, 3], &[2], &[1]),
            strided(3, 40, 12, &[75, 61], &[3, 3], &[2], &[1]),
            strided(2, 24, 8, &[10, 24, 24], &[3, 3, 3], &[2], &[1]),
        ];
        assert!(geoms[1].x_len() * 4 >= STREAM_BYTES);
        for g in &geoms {
            assert!(applies(g), "{g:?}");
            let (dy, w) = (uniform(11, g.y_len()), uniform(12, g.w_len()));
            let mut want = vec![0f32; g.x_len()];
            reference::backward_data(g, &dy, &w, &mut want).unwrap();
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut dx = vec![f32::NAN; g.x_len()];
                pool.install(|| {
                    crate::backward_data(
                        g,
                        &dy,
                        &w,
                        &mut dx,
                        BackwardDataAlgo::Deconvgemm,
                        &mut Workspace::new(false),
                    )
                })
                .unwrap();
                Tolerance::for_f32_sum(g.out_channels() * g.kernel_len())
                    .check(&format!("{threads} threads, {g:?}"), &dx, &want)
                    .unwrap();
            }
        }
    }
}
