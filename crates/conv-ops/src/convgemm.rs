//! convgemm: the forward convolution as a GEMM whose B operand, im2col(x), is never built.
//!
//! The convgemm paper's Fig. 6: when the GEMM packs the `kc × nc` block of B at `(pc, jc)` into
//! NR-wide micro-panels, [`Im2colB`] reads the values straight from the input tensor. Row `p` of
//! B is (channel, kernel tap), column `j` is (image, output position). Each panel's columns are
//! cut into runs along the innermost output dimension and a (tap × run) segment table is built
//! once per panel (see `source.rs`); every row of the block then is a few copies of input runs
//! with zero fill where they overhang the padding.

use std::cell::RefCell;

use core_blas::PackB;

use crate::geometry::ConvGeometry;
use crate::source::{Run, Seg, Source, copy_run, micro_panels};

/// im2col(x) of one group as a virtual `(C/G·R) × (N·O)` matrix that packs itself.
#[derive(Clone, Copy, Debug)]
pub struct Im2colB<'a> {
    src: Source<'a>,
    rows: usize,
    cols: usize,
    /// First column (image · O) of the view: a view of images `n0..` starts at `n0 · O`.
    col0: usize,
}

/// Scratch reused across calls on one thread: no allocation in steady state.
#[derive(Default)]
struct Scratch {
    /// Per row of the block: (channel plane offset, tap).
    rows: Vec<(usize, usize)>,
    runs: Vec<Run>,
    segs: Vec<Seg>,
    planes: Vec<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl<'a> Im2colB<'a> {
    /// The im2col matrix of group `grp` of `x` (validated by the caller: `x.len() == g.x_len()`).
    pub fn new(g: &ConvGeometry, grp: usize, x: &'a [f32]) -> Self {
        Self::images(g, grp, x, 0, g.batch())
    }

    /// The columns of images `n0..n0 + count` only (validated by the caller:
    /// `n0 + count <= g.batch()`).
    pub fn images(g: &ConvGeometry, grp: usize, x: &'a [f32], n0: usize, count: usize) -> Self {
        debug_assert!(n0 + count <= g.batch());
        Im2colB {
            src: Source::new(g, grp, x),
            rows: g.in_channels_per_group() * g.kernel_len(),
            cols: count * g.output_spatial_len(),
            col0: n0 * g.output_spatial_len(),
        }
    }
}

impl PackB for Im2colB<'_> {
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
            let Scratch {
                rows,
                runs,
                segs,
                planes,
            } = s;
            rows.clear();
            rows.extend((pc..pc + kc).map(|p| (src.plane(p / src.rlen), p % src.rlen)));
            if cfg!(debug_assertions) {
                planes.clear();
                planes.extend(rows.iter().map(|r| r.0));
            }
            for (j0, w, panel) in micro_panels(dst, kc, nr, jc, nc) {
                src.runs(self.col0 + j0, w, runs);
                src.segments(runs, segs);
                debug_assert!(src.segments_in_bounds(runs, segs, planes));
                let count = runs.len();
                for (&(plane, tap), out) in rows.iter().zip(panel.chunks_exact_mut(nr)) {
                    let segs = &segs[tap * count..][..count];
                    for (run, seg) in runs.iter().zip(segs) {
                        // SAFETY: runs tile `0..w` and `w <= nr = out.len()`; `lo <= hi <=
                        // run.len`; the source `plane + at + t·stride`, `t < hi − lo`, lies in
                        // x (`segments` clips every run to the input; checked in debug builds).
                        unsafe {
                            let d = out.as_mut_ptr().add(run.start);
                            for t in 0..seg.lo {
                                *d.add(t) = 0.0;
                            }
                            let from = src.x.as_ptr().add(plane + seg.at);
                            copy_run(d.add(seg.lo), from, seg.hi - seg.lo, stride);
                            for t in seg.hi..run.len {
                                *d.add(t) = 0.0;
                            }
                        }
                    }
                    out[w..].fill(0.0);
                }
            }
        });
    }
}
