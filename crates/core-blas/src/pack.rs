//! Packing: the sources of A and B, an extension point.
//!
//! The driver never reads A or B directly. For each `kc × nc` block of B at `(pc, jc)` it asks the
//! B source to pack it into `NR`-wide micro-panels, and for each `mc × kc` block of A at `(ic, pc)`
//! it asks the A source to pack it into `MR`-tall micro-panels. A dense strided matrix
//! ([`MatRef`]) is just the default source; `conv-ops` supplies sources that read im2col(x)
//! straight from a tensor (convgemm, the convgemm paper's Fig. 6).
//!
//! Layout contract (what the micro-kernel reads):
//! - B block → `ceil(nc / nr)` micro-panels, panel `q` at `dst[q * kc * nr ..]`; inside a panel,
//!   row `p` (0..kc) holds `nr` consecutive values `B[pc + p, jc + q*nr + 0..nr]`, columns past
//!   `nc` zero-filled.
//! - A block → `ceil(mc / mr)` micro-panels, panel `q` at `dst[q * kc * mr ..]`; inside a panel,
//!   column `p` (0..kc) holds `mr` consecutive values `A[ic + q*mr + 0..mr, pc + p]`, rows past `mc`
//!   zero-filled.
//!
//! Both traits require `Sync`: several threads pack disjoint blocks of the same source at once.

use std::cell::Cell;

use crate::MatRef;

/// A source for the right operand B (`k × n`) that packs itself.
pub trait PackB: Sync {
    /// Rows of B (the inner dimension `k`).
    fn rows(&self) -> usize;
    /// Columns of B (`n`).
    fn cols(&self) -> usize;
    /// Pack the `kc × nc` block at `(pc, jc)` into `nr`-wide micro-panels (layout in the module
    /// doc). `dst.len() >= nc.div_ceil(nr) * nr * kc`; the block lies inside the matrix.
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]);
}

/// A source for the left operand A (`m × k`) that packs itself.
pub trait PackA: Sync {
    /// Rows of A (`m`).
    fn rows(&self) -> usize;
    /// Columns of A (the inner dimension `k`).
    fn cols(&self) -> usize;
    /// Pack the `mc × kc` block at `(ic, pc)` into `mr`-tall micro-panels (layout in the module
    /// doc). `dst.len() >= mc.div_ceil(mr) * mr * kc`; the block lies inside the matrix.
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]);
}

impl PackB for MatRef<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    #[inline]
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        // B[p, j] as A'[j, p] with A' = Bᵀ: the same panel layout with the roles of the strides swapped.
        pack_panels(self.data, self.cs, self.rs, jc, nc, pc, kc, nr, dst);
    }
}

impl PackA for MatRef<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    #[inline]
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        pack_panels(self.data, self.rs, self.cs, ic, mc, pc, kc, mr, dst);
    }
}

/// Pack `X[x0..x0+w, p0..p0+kc]` (element `(x, p)` at `data[x * sx + p * sp]`) into panels of
/// `r` values of x per p, zero-padding x beyond `w`.
#[allow(clippy::too_many_arguments)]
fn pack_panels(
    data: &[f32],
    sx: usize,
    sp: usize,
    x0: usize,
    w: usize,
    p0: usize,
    kc: usize,
    r: usize,
    dst: &mut [f32],
) {
    if kc == 0 || w == 0 {
        return;
    }
    let panels = w.div_ceil(r);
    debug_assert!(dst.len() >= panels * r * kc);
    for (q, panel) in dst.chunks_exact_mut(r * kc).take(panels).enumerate() {
        let xq = x0 + q * r;
        let wq = r.min(x0 + w - xq);
        if sx == 1 {
            // The r values of one p are contiguous in the source: straight copies.
            for (p, out) in panel.chunks_exact_mut(r).enumerate() {
                let start = xq + (p0 + p) * sp;
                out[..wq].copy_from_slice(&data[start..start + wq]);
                out[wq..].fill(0.0);
            }
        } else if sp == 1 {
            // Each x is a contiguous run over p: read runs, write with stride r.
            for x in 0..wq {
                let run = &data[(xq + x) * sx + p0..][..kc];
                for (p, &v) in run.iter().enumerate() {
                    panel[p * r + x] = v;
                }
            }
            if wq < r {
                for out in panel.chunks_exact_mut(r) {
                    out[wq..].fill(0.0);
                }
            }
        } else {
            for (p, out) in panel.chunks_exact_mut(r).enumerate() {
                for x in 0..wq {
                    out[x] = data[(xq + x) * sx + (p0 + p) * sp];
                }
                out[wq..].fill(0.0);
            }
        }
    }
}

/// One 64-byte cache line of f32, so that a `Vec<Line>` is 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A growable, 64-byte aligned f32 buffer that is reused across calls.
#[derive(Default)]
pub(crate) struct AlignedBuf {
    lines: Vec<Line>,
}

impl AlignedBuf {
    /// The first `len` values, growing the buffer if needed (contents unspecified).
    pub(crate) fn get(&mut self, len: usize) -> &mut [f32] {
        let need = len.div_ceil(16);
        if self.lines.len() < need {
            self.lines.resize(need, Line([0.0; 16]));
        }
        // SAFETY: `Line` is `repr(C)` around `[f32; 16]` with no padding (size 64 = 16 × 4), so
        // the `lines.len() * 16 >= len` f32 values are initialised, aligned and exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), len) }
    }
}

/// Per-thread packing buffers: `Ac` (A block, L2-sized) and `Bc` (B block, L3-sized).
#[derive(Default)]
pub(crate) struct Workspace {
    pub(crate) a: AlignedBuf,
    pub(crate) b: AlignedBuf,
}

thread_local! {
    static WORKSPACE: Cell<Option<Box<Workspace>>> = const { Cell::new(None) };
}

/// Run `f` with this thread's packing buffers. They are taken out of the thread-local for the call
/// and put back afterwards, so a re-entrant call (a store that itself runs a GEMM) gets fresh
/// buffers instead of a borrow conflict; in steady state nothing is allocated.
pub(crate) fn with_workspace<R>(f: impl FnOnce(&mut Workspace) -> R) -> R {
    let mut ws = WORKSPACE.take().unwrap_or_default();
    let r = f(&mut ws);
    WORKSPACE.set(Some(ws));
    r
}
