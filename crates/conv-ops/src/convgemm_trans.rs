//! Transposed convgemm (`cgt`): the weight gradient dW = dY · im2col(x)ᵀ with im2col(x)ᵀ packed
//! straight from x (the convgemm paper's Fig. 10), so no workspace grows with the batch.
//!
//! Row `p` of B = im2col(x)ᵀ is (image, output position), column `j` is (channel, kernel tap).
//! The rows of a packed block are cut into runs once per call and a (tap × run) segment table
//! is built (see `source.rs`); each panel lane (one channel and tap) is then a few strided copies
//! of input runs into the lane, with zeros where a run overhangs the padding.

use std::cell::RefCell;

use core_blas::PackB;

use crate::geometry::ConvGeometry;
use crate::source::{Run, Seg, Source, micro_panels};

/// im2col(x)ᵀ of one group as a virtual `(N·O) × (C/G·R)` matrix that packs itself.
#[derive(Clone, Copy, Debug)]
pub struct Im2colTB<'a> {
    src: Source<'a>,
    rows: usize,
    cols: usize,
}

#[derive(Default)]
struct Scratch {
    runs: Vec<Run>,
    segs: Vec<Seg>,
}

thread_local! {
    /// Runs and segments of the block being packed: no allocation in steady state.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl<'a> Im2colTB<'a> {
    /// im2col(x)ᵀ of group `grp` (validated by the caller: `x.len() == g.x_len()`).
    pub fn new(g: &ConvGeometry, grp: usize, x: &'a [f32]) -> Self {
        Im2colTB {
            src: Source::new(g, grp, x),
            rows: g.batch() * g.output_spatial_len(),
            cols: g.in_channels_per_group() * g.kernel_len(),
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
        let src = &self.src;
        let stride = src.d.stride[2];
        SCRATCH.with_borrow_mut(|s| {
            let Scratch { runs, segs } = s;
            src.runs(pc, kc, runs);
            src.segments(runs, segs);
            let count = runs.len();
            for (j0, w, panel) in micro_panels(dst, kc, nr, jc, nc) {
                debug_assert!({
                    let planes: Vec<usize> =
                        (j0..j0 + w).map(|j| src.plane(j / src.rlen)).collect();
                    src.segments_in_bounds(runs, segs, &planes)
                });
                debug_assert!(panel.len() >= kc * nr);
                for lane in 0..nr {
                    let base = panel.as_mut_ptr();
                    if lane >= w {
                        for p in 0..kc {
                            panel[p * nr + lane] = 0.0;
                        }
                        continue;
                    }
                    let col = j0 + lane;
                    let (plane, tap) = (src.plane(col / src.rlen), col % src.rlen);
                    for (run, seg) in runs.iter().zip(&segs[tap * count..][..count]) {
                        // SAFETY: rows `run.start + t < kc` (runs tile `0..kc`) and `lane < nr`
                        // keep writes inside the `kc·nr` panel; `lo <= hi <= run.len`; the
                        // source `plane + at + t·stride`, `t < hi − lo`, lies in x (`segments`
                        // clips every run to the input; checked in debug builds).
                        unsafe {
                            let d = base.add(run.start * nr + lane);
                            for t in 0..seg.lo {
                                *d.add(t * nr) = 0.0;
                            }
                            let from = src.x.as_ptr().add(plane + seg.at);
                            for t in 0..seg.hi - seg.lo {
                                *d.add((seg.lo + t) * nr) = *from.add(t * stride);
                            }
                            for t in seg.hi..run.len {
                                *d.add(t * nr) = 0.0;
                            }
                        }
                    }
                }
            }
        });
    }
}
