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

    /// The decomposition of B row `row` (channel, kernel taps) that [`Self::fill_run`] needs.
    fn row(&self, row: usize) -> Row {
        let d = &self.d;
        let (c, r) = (row / self.rlen, row % self.rlen);
        let rk = split3(r, &d.kernel);
        let off = |i: usize| (rk[i] * d.dilation[i]) as isize - d.pad[i] as isize;
        Row {
            plane: self.group_off + c * self.ilen,
            off: [off(0), off(1), off(2)],
        }
    }

    /// Fills `out[run.start..run.start+run.len]` for B row `row`.
    #[inline(always)]
    fn fill_run(&self, run: &Run, row: &Row, out: &mut [f32]) {
        let d = &self.d;
        let dst = &mut out[run.start..run.start + run.len];
        let i0 = (run.o0 * d.stride[0]) as isize + row.off[0];
        let i1 = (run.o1 * d.stride[1]) as isize + row.off[1];
        if i0 < 0 || i0 >= d.input[0] as isize || i1 < 0 || i1 >= d.input[1] as isize {
            dst.fill(0.0);
            return;
        }
        let line =
            row.plane + run.n * self.image + (i0 as usize * d.input[1] + i1 as usize) * d.input[2];
        let line = &self.x[line..line + d.input[2]];
        let first = (run.o2 * d.stride[2]) as isize + row.off[2];
        let (s, wid) = (d.stride[2] as isize, d.input[2] as isize);
        if s == 1 {
            // Contiguous: zeros where the run hangs over the padding, one copy in between.
            let lo = (-first).clamp(0, run.len as isize) as usize;
            let hi = (wid - first).clamp(lo as isize, run.len as isize) as usize;
            dst[..lo].fill(0.0);
            if lo < hi {
                let from = (first + lo as isize) as usize;
                dst[lo..hi].copy_from_slice(&line[from..from + (hi - lo)]);
            }
            dst[hi..].fill(0.0);
        } else {
            for (t, v) in dst.iter_mut().enumerate() {
                let i2 = first + t as isize * s;
                *v = if i2 >= 0 && i2 < wid {
                    line[i2 as usize]
                } else {
                    0.0
                };
            }
        }
    }

    fn pack_panels(&self, rows: &[Row], jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        let kc = rows.len();
        let mut runs = [Run::default(); MAX_RUN_COLS];
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
                for (row, out) in rows.iter().zip(panel.chunks_exact_mut(nr)) {
                    let out = &mut out[done..done + chunk];
                    for run in &runs[..count] {
                        self.fill_run(run, row, out);
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
    }
}

/// One row of B = (channel, kernel taps): the channel plane's offset in x (without the image)
/// and, per dimension, tap · dilation − padding.
#[derive(Clone, Copy)]
struct Row {
    plane: usize,
    off: [isize; 3],
}

thread_local! {
    /// The rows of the block being packed, reused across calls (no allocation in steady state).
    static ROWS: RefCell<Vec<Row>> = const { RefCell::new(Vec::new()) };
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
