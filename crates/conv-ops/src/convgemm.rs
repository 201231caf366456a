//! convgemm: the forward convolution as a GEMM whose B operand, im2col(x), is never built.
//!
//! The convgemm paper's Fig. 6: when the GEMM packs the `kc × nc` block of B at `(pc, jc)` into
//! NR-wide micro-panels, [`Im2colB`] reads the values straight from the input tensor. Row `p` of
//! B is (channel, kernel tap), column `j` is (image, output position); for a fixed row, columns
//! that share (image, outer output coordinates) read a run of the input's innermost dimension,
//! contiguous when the stride is 1, so packing is mostly copies with zero fill at the borders.

use std::cell::RefCell;

use core_blas::PackB;

use crate::geometry::{ConvGeometry, Dims3};
use crate::im2col::split3;

/// im2col(x) of one group as a virtual `(C/G·R) × (N·O)` matrix that packs itself.
#[derive(Clone, Copy, Debug)]
pub struct Im2colB<'a> {
    x: &'a [f32],
    d: Dims3,
    /// Offset of the group's first channel plane inside one image.
    group_off: usize,
    /// Elements of one input image (C·I).
    image: usize,
    ilen: usize,
    rlen: usize,
    olen: usize,
    rows: usize,
    cols: usize,
}

/// A run of consecutive B columns that share (image, o0, o1): `len` output positions along the
/// innermost dimension starting at `o2`.
#[derive(Clone, Copy, Default)]
struct Run {
    start: usize,
    len: usize,
    n: usize,
    o0: usize,
    o1: usize,
    o2: usize,
}

/// Copies `n` values from `src` (every `stride`-th) to `dst`: the short runs of narrow images
/// in fixed 8-value chunks the compiler turns into vector moves (a call into the C library's
/// memcpy costs more than a 7-16 value copy), the tail as one overlapping chunk.
///
/// # Safety
/// `dst` must be valid for `n` writes and `src` for reads at `t·stride`, `t < n`; they must
/// not overlap.
#[inline(always)]
unsafe fn copy_run(dst: *mut f32, src: *const f32, n: usize, stride: usize) {
    // SAFETY: offsets stay below `n` (writes) and `(n − 1)·stride + 1` (reads): the caller's
    // contract.
    unsafe {
        if stride != 1 {
            for t in 0..n {
                *dst.add(t) = *src.add(t * stride);
            }
        } else if n >= 8 {
            let mut i = 0;
            while i + 8 <= n {
                dst.add(i)
                    .cast::<[f32; 8]>()
                    .write_unaligned(src.add(i).cast::<[f32; 8]>().read_unaligned());
                i += 8;
            }
            if i < n {
                dst.add(n - 8)
                    .cast::<[f32; 8]>()
                    .write_unaligned(src.add(n - 8).cast::<[f32; 8]>().read_unaligned());
            }
        } else if n >= 4 {
            dst.cast::<[f32; 4]>()
                .write_unaligned(src.cast::<[f32; 4]>().read_unaligned());
            dst.add(n - 4)
                .cast::<[f32; 4]>()
                .write_unaligned(src.add(n - 4).cast::<[f32; 4]>().read_unaligned());
        } else {
            for t in 0..n {
                *dst.add(t) = *src.add(t);
            }
        }
    }
}

/// Most columns handled per batch of runs (any NR is processed in chunks of this many).
const MAX_RUN_COLS: usize = 64;

impl<'a> Im2colB<'a> {
    /// The im2col matrix of group `grp` of `x` (validated by the caller: `x.len() == g.x_len()`).
    pub fn new(g: &ConvGeometry, grp: usize, x: &'a [f32]) -> Self {
        debug_assert_eq!(x.len(), g.x_len());
        debug_assert!(grp < g.groups());
        let ilen = g.input_spatial_len();
        Im2colB {
            x,
            d: g.dims3(),
            group_off: grp * g.in_channels_per_group() * ilen,
            image: g.in_channels() * ilen,
            ilen,
            rlen: g.kernel_len(),
            olen: g.output_spatial_len(),
            rows: g.in_channels_per_group() * g.kernel_len(),
            cols: g.batch() * g.output_spatial_len(),
        }
    }

    /// Splits columns `j0..j0+w` into runs along the innermost output dimension.
    fn runs(&self, j0: usize, w: usize, runs: &mut [Run; MAX_RUN_COLS]) -> usize {
        let out = &self.d.output;
        let (mut n, o) = (j0 / self.olen, j0 % self.olen);
        let (mut o0, mut o1, mut o2) = (o / (out[1] * out[2]), (o / out[2]) % out[1], o % out[2]);
        let (mut t, mut count) = (0, 0);
        while t < w {
            let len = (w - t).min(out[2] - o2);
            runs[count] = Run {
                start: t,
                len,
                n,
                o0,
                o1,
                o2,
            };
            count += 1;
            t += len;
            // Advance the odometer past this run.
            o2 = 0;
            o1 += 1;
            if o1 == out[1] {
                o1 = 0;
                o0 += 1;
                if o0 == out[0] {
                    o0 = 0;
                    n += 1;
                }
            }
        }
        count
    }

    /// The decomposition of B row `row`: its channel plane and kernel tap.
    fn row(&self, row: usize) -> Row {
        Row {
            plane: self.group_off + (row / self.rlen) * self.ilen,
            tap: row % self.rlen,
        }
    }

    /// The segment of every (tap, run) pair of one panel: which part of the run reads the input
    /// and where. It depends on the tap and not on the channel, so the rows of a block (channels
    /// × taps) share it.
    fn segments(&self, runs: &[Run], segs: &mut Vec<Seg>) {
        let d = &self.d;
        let (s, wid) = (d.stride[2] as isize, d.input[2] as isize);
        segs.clear();
        for tap in 0..self.rlen {
            let rk = split3(tap, &d.kernel);
            let off = |i: usize| (rk[i] * d.dilation[i]) as isize - d.pad[i] as isize;
            let (off0, off1, off2) = (off(0), off(1), off(2));
            for run in runs {
                let i0 = (run.o0 * d.stride[0]) as isize + off0;
                let i1 = (run.o1 * d.stride[1]) as isize + off1;
                if i0 < 0 || i0 >= d.input[0] as isize || i1 < 0 || i1 >= d.input[1] as isize {
                    segs.push(Seg {
                        lo: 0,
                        hi: 0,
                        at: 0,
                    });
                    continue;
                }
                let first = (run.o2 * d.stride[2]) as isize + off2;
                // Positions t of the run with 0 <= first + t·s < wid.
                let lo = if first >= 0 { 0 } else { (-first + s - 1) / s };
                let hi = if first >= wid {
                    0
                } else {
                    (wid - first + s - 1) / s
                };
                let (lo, hi) = (lo.min(run.len as isize), hi.clamp(0, run.len as isize));
                let hi = hi.max(lo);
                let line =
                    run.n * self.image + (i0 as usize * d.input[1] + i1 as usize) * d.input[2];
                segs.push(Seg {
                    lo: lo as usize,
                    hi: hi as usize,
                    at: line + (first + lo * s).max(0) as usize,
                });
            }
        }
    }

    fn pack_panels(&self, rows: &[Row], jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        let kc = rows.len();
        let stride = self.d.stride[2];
        let mut runs = [Run::default(); MAX_RUN_COLS];
        SEGS.with_borrow_mut(|segs| {
            for (q, panel) in dst
                .chunks_exact_mut(kc * nr)
                .take(nc.div_ceil(nr))
                .enumerate()
            {
                let j0 = jc + q * nr;
                let w = nr.min(jc + nc - j0);
                let mut done = 0;
                while done < w {
                    let chunk = (w - done).min(MAX_RUN_COLS);
                    let count = self.runs(j0 + done, chunk, &mut runs);
                    let runs = &runs[..count];
                    self.segments(runs, segs);
                    // Every segment lies inside x for any channel plane of the group and
                    // inside the panel row (built from the validated geometry above).
                    debug_assert!(segs.iter().zip(runs.iter().cycle()).all(|(g, r)| {
                        g.hi <= r.len
                            && rows.iter().all(|row| {
                                g.hi == g.lo
                                    || row.plane + g.at + (g.hi - g.lo - 1) * stride < self.x.len()
                            })
                    }));
                    for (row, out) in rows.iter().zip(panel.chunks_exact_mut(nr)) {
                        let out = &mut out[done..done + chunk];
                        let segs = &segs[row.tap * count..][..count];
                        for (run, seg) in runs.iter().zip(segs) {
                            // SAFETY: `run.start + run.len <= chunk = out.len()` (runs tile the
                            // chunk), `seg.lo <= seg.hi <= run.len`, and the source range
                            // `plane + at + t·stride` for `t < hi − lo` lies inside x (asserted
                            // in debug builds above; it follows from the geometry's bounds).
                            unsafe {
                                let dst = out.as_mut_ptr().add(run.start);
                                for t in 0..seg.lo {
                                    *dst.add(t) = 0.0;
                                }
                                let src = self.x.as_ptr().add(row.plane + seg.at);
                                copy_run(dst.add(seg.lo), src, seg.hi - seg.lo, stride);
                                for t in seg.hi..run.len {
                                    *dst.add(t) = 0.0;
                                }
                            }
                        }
                    }
                    done += chunk;
                }
                if w < nr {
                    for out in panel.chunks_exact_mut(nr) {
                        out[w..].fill(0.0);
                    }
                }
            }
        });
    }
}

/// One row of B = (channel, kernel tap): the channel plane's offset in x (without the image)
/// and the tap's index.
#[derive(Clone, Copy)]
struct Row {
    plane: usize,
    tap: usize,
}

/// Where one run of one tap reads: positions `lo..hi` of the run come from the input starting
/// at `plane + at` (with the stride); the rest of the run is padding.
#[derive(Clone, Copy)]
struct Seg {
    lo: usize,
    hi: usize,
    at: usize,
}

thread_local! {
    /// The rows of the block being packed, reused across calls (no allocation in steady state).
    static ROWS: RefCell<Vec<Row>> = const { RefCell::new(Vec::new()) };
    /// The (tap, run) segments of the panel being packed, reused likewise.
    static SEGS: RefCell<Vec<Seg>> = const { RefCell::new(Vec::new()) };
}

impl PackB for Im2colB<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        ROWS.with_borrow_mut(|rows| {
            rows.clear();
            rows.extend((pc..pc + kc).map(|row| self.row(row)));
            self.pack_panels(rows, jc, nc, nr, dst);
        });
    }
}
