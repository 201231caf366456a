//! Transposed convgemm (`cgt`): the weight gradient dW = dY · im2col(x)ᵀ with im2col(x)ᵀ packed
//! straight from x (the convgemm paper's Fig. 10), so no workspace grows with the batch.
//!
//! Row `p` of B = im2col(x)ᵀ is (image, output position), column `j` is (channel, kernel tap).
//! For one column and a run of rows along the innermost output dimension the reads walk one
//! input line with the stride, and the writes go to one lane of consecutive panel rows.

use std::cell::RefCell;

use core_blas::PackB;

use crate::geometry::{ConvGeometry, Dims3};
use crate::im2col::split3;

/// im2col(x)ᵀ of one group as a virtual `(N·O) × (C/G·R)` matrix that packs itself.
#[derive(Clone, Copy, Debug)]
pub struct Im2colTB<'a> {
    x: &'a [f32],
    d: Dims3,
    group_off: usize,
    image: usize,
    ilen: usize,
    rlen: usize,
    olen: usize,
    rows: usize,
    cols: usize,
}

/// Rows `start..start+len` of a packed block share (image, o0, o1); `o2` is the first position.
#[derive(Clone, Copy)]
struct Run {
    start: usize,
    len: usize,
    n: usize,
    o0: usize,
    o1: usize,
    o2: usize,
}

thread_local! {
    /// Row runs of the block being packed, reused across calls (no allocation in steady state).
    static RUNS: RefCell<Vec<Run>> = const { RefCell::new(Vec::new()) };
}

impl<'a> Im2colTB<'a> {
    /// im2col(x)ᵀ of group `grp` (validated by the caller: `x.len() == g.x_len()`).
    pub fn new(g: &ConvGeometry, grp: usize, x: &'a [f32]) -> Self {
        debug_assert_eq!(x.len(), g.x_len());
        let ilen = g.input_spatial_len();
        Im2colTB {
            x,
            d: g.dims3(),
            group_off: grp * g.in_channels_per_group() * ilen,
            image: g.in_channels() * ilen,
            ilen,
            rlen: g.kernel_len(),
            olen: g.output_spatial_len(),
            rows: g.batch() * g.output_spatial_len(),
            cols: g.in_channels_per_group() * g.kernel_len(),
        }
    }

    fn runs(&self, p0: usize, kc: usize, runs: &mut Vec<Run>) {
        runs.clear();
        let out = &self.d.output;
        let (mut n, o) = (p0 / self.olen, p0 % self.olen);
        let (mut o0, mut o1, mut o2) = (o / (out[1] * out[2]), (o / out[2]) % out[1], o % out[2]);
        let mut t = 0;
        while t < kc {
            let len = (kc - t).min(out[2] - o2);
            runs.push(Run {
                start: t,
                len,
                n,
                o0,
                o1,
                o2,
            });
            t += len;
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
    }
}

impl PackB for Im2colTB<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        RUNS.with_borrow_mut(|runs| {
            self.runs(pc, kc, runs);
            let d = &self.d;
            let (s, wid) = (d.stride[2] as isize, d.input[2] as isize);
            for (q, panel) in dst
                .chunks_exact_mut(kc * nr)
                .take(nc.div_ceil(nr))
                .enumerate()
            {
                let j0 = jc + q * nr;
                let w = nr.min(jc + nc - j0);
                for lane in 0..nr {
                    if lane >= w {
                        for p in 0..kc {
                            panel[p * nr + lane] = 0.0;
                        }
                        continue;
                    }
                    let col = j0 + lane;
                    let (c, r) = (col / self.rlen, col % self.rlen);
                    let rk = split3(r, &d.kernel);
                    for run in runs.iter() {
                        let i0 = d.input_coord(0, run.o0, rk[0]);
                        let i1 = d.input_coord(1, run.o1, rk[1]);
                        let rows = run.start..run.start + run.len;
                        if i0 < 0
                            || i0 >= d.input[0] as isize
                            || i1 < 0
                            || i1 >= d.input[1] as isize
                        {
                            for p in rows {
                                panel[p * nr + lane] = 0.0;
                            }
                            continue;
                        }
                        let line = self.group_off
                            + run.n * self.image
                            + c * self.ilen
                            + (i0 as usize * d.input[1] + i1 as usize) * d.input[2];
                        let line = &self.x[line..line + d.input[2]];
                        let first = d.input_coord(2, run.o2, rk[2]);
                        for (t, p) in rows.enumerate() {
                            let i2 = first + t as isize * s;
                            panel[p * nr + lane] = if i2 >= 0 && i2 < wid {
                                line[i2 as usize]
                            } else {
                                0.0
                            };
                        }
                    }
                }
            }
        });
    }
}
