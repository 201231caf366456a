//! An activation tensor N×Ch×(spatial) seen as the matrix Ch × (N·O) that every convolution GEMM
//! uses: row = channel, column = (image, position). It is not a strided matrix when N > 1 (the
//! channel stride is O, the image stride Ch·O), so it gets its own packers and store.

use core_blas::{PackA, PackB, Store, Tile};

use crate::source::{copy_run, micro_panels};

/// Read-only view of channels `c0..c0+rows` of an N×`channels`×`plane` tensor, as a
/// `rows × (N·plane)` matrix.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChannelMajor<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) channels: usize,
    pub(crate) plane: usize,
    pub(crate) c0: usize,
    pub(crate) rows: usize,
    /// First image of the view and number of images (columns `n0·plane..(n0+batch)·plane`).
    pub(crate) n0: usize,
    pub(crate) batch: usize,
}

impl ChannelMajor<'_> {
    /// Offset of element (row, column) in `data`.
    #[inline(always)]
    fn offset(&self, row: usize, col: usize) -> usize {
        let (n, o) = (self.n0 + col / self.plane, col % self.plane);
        (n * self.channels + self.c0 + row) * self.plane + o
    }
}

impl PackB for ChannelMajor<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.batch * self.plane
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        for (j0, w, panel) in micro_panels(dst, kc, nr, jc, nc) {
            for (p, out) in panel.chunks_exact_mut(nr).enumerate() {
                // Runs of columns inside one image are contiguous in memory.
                let mut t = 0;
                while t < w {
                    let j = j0 + t;
                    let len = (w - t).min(self.plane - j % self.plane);
                    let src = &self.data[self.offset(pc + p, j)..][..len];
                    let dst = &mut out[t..t + len];
                    // SAFETY: `dst` and `src` are slices of `len` values each (bounds checked
                    // when they were taken), and a packing buffer never overlaps the tensor.
                    unsafe { copy_run(dst.as_mut_ptr(), src.as_ptr(), len, 1) };
                    t += len;
                }
                out[w..].fill(0.0);
            }
        }
    }
}

impl PackA for ChannelMajor<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.batch * self.plane
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        for (i0, h, panel) in micro_panels(dst, kc, mr, ic, mc) {
            for x in 0..h {
                // Row i0 + x over columns pc..pc+kc, in runs inside one image.
                let mut p = 0;
                while p < kc {
                    let j = pc + p;
                    let len = (kc - p).min(self.plane - j % self.plane);
                    let src = &self.data[self.offset(i0 + x, j)..][..len];
                    for (t, &v) in src.iter().enumerate() {
                        panel[(p + t) * mr + x] = v;
                    }
                    p += len;
                }
            }
            if h < mr {
                for col in panel.chunks_exact_mut(mr) {
                    col[h..].fill(0.0);
                }
            }
        }
    }
}

/// What to do with a finished C block in [`ChannelMajorStore`]:
/// `y = alpha·C + beta·y (+ bias[channel]) (then ReLU)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Epilogue<'a> {
    pub(crate) alpha: f32,
    pub(crate) beta: f32,
    pub(crate) bias: Option<&'a [f32]>,
    pub(crate) relu: bool,
}

/// Writes C = (channels `c0..c0+rows`) × (N·plane) tiles into an N×`channels`×`plane` tensor.
///
/// The map from C to the tensor is injective, so tiles never overlap and the store is
/// concurrent.
pub(crate) struct ChannelMajorStore<'a> {
    ptr: *mut f32,
    len: usize,
    channels: usize,
    plane: usize,
    c0: usize,
    rows: usize,
    batch: usize,
    epi: Epilogue<'a>,
    _y: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: the store only writes through `ptr` at offsets that distinct tiles never share (the map
// (row, col) → offset is injective and the driver delivers each tile of a pass once), and the
// `&'a mut` borrow it was built from guarantees nobody else touches the buffer meanwhile.
unsafe impl Sync for ChannelMajorStore<'_> {}

impl<'a> ChannelMajorStore<'a> {
    pub(crate) fn new(
        y: &'a mut [f32],
        channels: usize,
        plane: usize,
        c0: usize,
        rows: usize,
        epi: Epilogue<'a>,
    ) -> Self {
        let batch = y.len() / (channels * plane);
        debug_assert_eq!(batch * channels * plane, y.len());
        debug_assert!(c0 + rows <= channels);
        ChannelMajorStore {
            ptr: y.as_mut_ptr(),
            len: y.len(),
            channels,
            plane,
            c0,
            rows,
            batch,
            epi,
            _y: std::marker::PhantomData,
        }
    }
}

impl Store for ChannelMajorStore<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.batch * self.plane
    }
    fn store_tile(&self, tile: &Tile<'_>) {
        let Epilogue {
            alpha,
            beta,
            bias,
            relu,
        } = self.epi;
        for r in 0..tile.rows() {
            let ch = self.c0 + tile.i() + r;
            let add = match (tile.last(), bias) {
                (true, Some(b)) => b[ch],
                _ => 0.0,
            };
            let src = tile.row(r);
            let mut t = 0;
            while t < tile.cols() {
                let j = tile.j() + t;
                let len = (tile.cols() - t).min(self.plane - j % self.plane);
                let off = ((j / self.plane) * self.channels + ch) * self.plane + j % self.plane;
                debug_assert!(off + len <= self.len);
                // SAFETY: `off + len <= len` of the buffer (the tile lies inside C and the map is
                // in bounds), and this tile's elements are written by this call only (see the
                // `Sync` impl).
                let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) };
                let vals = &src[t..t + len];
                for (d, &v) in dst.iter_mut().zip(vals) {
                    let prev = if !tile.first() {
                        *d
                    } else if beta == 0.0 {
                        0.0
                    } else {
                        beta * *d
                    };
                    let mut out = prev + alpha * v + add;
                    if relu && tile.last() && out < 0.0 {
                        out = 0.0;
                    }
                    *d = out;
                }
                t += len;
            }
        }
    }
}
