//! An activation tensor N×Ch×(spatial) seen as the matrix Ch × (N·O) that every convolution GEMM
//! uses: row = channel, column = (image, position). It is not a strided matrix when N > 1 (the
//! channel stride is O, the image stride Ch·O), so it gets its own packers and store.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use core_blas::store::{Direct, Window};
use core_blas::{ConvPanel, DenseStore, PackA, PackB, Store, Tile};

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
            if j0 % self.plane + w <= self.plane {
                // The micro-panel inside one image: row p's columns are one contiguous run,
                // `plane` values after row p − 1's (no per-row index arithmetic).
                let base = self.offset(pc, j0);
                let src = &self.data[base..][..(kc - 1) * self.plane + w];
                for (p, out) in panel.chunks_exact_mut(nr).enumerate() {
                    let src = &src[p * self.plane..][..w];
                    // SAFETY: `out` holds `nr >= w` values and `src` `w`; a packing buffer
                    // never overlaps the tensor.
                    unsafe { copy_run(out.as_mut_ptr(), src.as_ptr(), w, 1) };
                    out[w..].fill(0.0);
                }
                continue;
            }
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
        let gemm = core_blas::Gemm::global().ok();
        let mut rows: [&[f32]; MAX_MR] = [&[]; MAX_MR];
        for (i0, h, panel) in micro_panels(dst, kc, mr, ic, mc) {
            // Rows i0.. over columns pc..pc+kc, in runs inside one image: each run is a
            // transpose of `h` contiguous row pieces into the panel's columns.
            let mut p = 0;
            while p < kc {
                let j = pc + p;
                let len = (kc - p).min(self.plane - j % self.plane);
                for (x, row) in rows.iter_mut().enumerate().take(h) {
                    *row = &self.data[self.offset(i0 + x, j)..][..len];
                }
                let out = &mut panel[p * mr..];
                let fast = h <= MAX_MR
                    && gemm.is_some_and(|g| g.transpose_lanes(out, mr, &rows[..h], len, 1).is_ok());
                if !fast {
                    for x in 0..h {
                        let src = &self.data[self.offset(i0 + x, j)..][..len];
                        for (t, &v) in src.iter().enumerate() {
                            out[t * mr + x] = v;
                        }
                    }
                }
                p += len;
            }
            if h < mr {
                for col in panel.chunks_exact_mut(mr) {
                    col[h..].fill(0.0);
                }
            }
        }
    }
}

/// The tallest A micro-panel [`ChannelMajor::pack_a`] transposes through core-blas (taller
/// ones are copied value by value).
const MAX_MR: usize = 32;

/// What to do with a finished C block in [`ChannelMajorStore`] and [`forward_panels`]:
/// `y = alpha·C + beta·y (+ bias[channel]) (then ReLU)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Epilogue<'a> {
    pub(crate) alpha: f32,
    pub(crate) beta: f32,
    pub(crate) bias: Option<&'a [f32]>,
    pub(crate) relu: bool,
}

impl<'a> Epilogue<'a> {
    /// This epilogue on a window of channel-major y for a tile whose rows are channels
    /// `ch .. ch + rows` (row bias `bias[ch ..]`), one plane apart from `p`: what the
    /// micro-kernel stores straight from registers ([`ChannelMajorStore`], [`SplitStore`]).
    ///
    /// # Safety
    /// As [`Window::new`] for `p` with row stride `plane`.
    #[inline]
    unsafe fn window(&self, p: *mut f32, plane: usize, ch: usize, rows: usize) -> Window<'a> {
        // SAFETY: the caller's.
        let mut win = unsafe { Window::new(p, plane, self.alpha, self.beta) };
        if let Some(b) = self.bias {
            win = win.with_row_bias(&b[ch..ch + rows]);
        }
        if self.relu {
            win = win.with_relu();
        }
        win
    }

    /// `dst = alpha·src + beta·dst + add`, then ReLU (beta = 0 never reads dst; NaN stays
    /// NaN, as in [`ChannelMajorStore`]).
    #[inline]
    fn apply(&self, dst: &mut [f32], src: &[f32], add: f32) {
        let (alpha, beta) = (self.alpha, self.beta);
        let relu = |v: f32| if v < 0.0 { 0.0 } else { v };
        match (beta == 0.0, self.relu) {
            (true, false) => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &v)| *d = alpha * v + add),
            (true, true) => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &v)| *d = relu(alpha * v + add)),
            (false, false) => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &v)| *d = alpha * v + beta * *d + add),
            (false, true) => dst
                .iter_mut()
                .zip(src)
                .for_each(|(d, &v)| *d = relu(alpha * v + beta * *d + add)),
        }
    }
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
    /// Tiles inside one image are a dense block of y (rows one plane apart): stored by the
    /// micro-kernel straight from registers.
    #[inline]
    fn window(&self, i: usize, j: usize, rows: usize, cols: usize) -> Option<Window<'_>> {
        let o = j % self.plane;
        if o + cols > self.plane || i + rows > self.rows {
            return None;
        }
        let ch = self.c0 + i;
        let off = ((j / self.plane) * self.channels + ch) * self.plane + o;
        if rows == 0 || off + (rows - 1) * self.plane + cols > self.len {
            return None;
        }
        // SAFETY: element (r, c) of the tile, r < rows, c < cols, is y[off + r·plane + c]: in
        // bounds (checked above), and the channel-major map is injective, so no other tile of
        // the product maps there (the driver asks once per tile and pass); the `&'a mut` borrow
        // of y keeps everybody else out (see the `Sync` impl).
        Some(unsafe { self.epi.window(self.ptr.add(off), self.plane, ch, rows) })
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

thread_local! {
    /// The C panel of this thread (deconvgemm, forward convgemm on small planes), reused
    /// across calls: it grows to the largest panel used.
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Frees this thread's C panel and [`Prepacked`] buffer ([`crate::release_workspaces`]) and
/// returns their bytes; one in use counts 0.
pub(crate) fn release_thread() -> usize {
    use crate::{take_thread_buffer, vec_bytes};
    take_thread_buffer(&PANEL, vec_bytes) + take_thread_buffer(&PREPACKED, vec_bytes)
}

/// Runs `f` on this thread's C panel of at least `len` values (contents unspecified).
pub(crate) fn with_panel<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    PANEL.with_borrow_mut(|panel| {
        if panel.len() < len {
            panel.resize(len, 0.0);
        }
        f(&mut panel[..len])
    })
}

/// A store that keeps its product on the calling thread: used where the caller already runs
/// blocks in parallel, each with its own output.
pub(crate) struct OneThread<S>(pub(crate) S);

impl<S: Store> Store for OneThread<S> {
    fn rows(&self) -> usize {
        self.0.rows()
    }
    fn cols(&self) -> usize {
        self.0.cols()
    }
    fn store_tile(&self, tile: &Tile<'_>) {
        self.0.store_tile(tile)
    }
    fn concurrent(&self) -> bool {
        false
    }
    fn whole_k(&self) -> bool {
        self.0.whole_k()
    }
    fn direct(&mut self) -> Option<Direct<'_>> {
        self.0.direct()
    }
    #[inline]
    fn window(&self, i: usize, j: usize, rows: usize, cols: usize) -> Option<Window<'_>> {
        self.0.window(i, j, rows, cols)
    }
    fn windows_everywhere(&self) -> bool {
        self.0.windows_everywhere()
    }
}

/// Columns `j0..j0 + cols` of a B source, as a B source of its own.
pub(crate) struct Columns<'a, B> {
    pub(crate) b: &'a B,
    pub(crate) j0: usize,
    pub(crate) cols: usize,
}

impl<B: PackB> PackB for Columns<'_, B> {
    fn rows(&self) -> usize {
        self.b.rows()
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        self.b.pack_b(pc, kc, self.j0 + jc, nc, nr, dst)
    }
    fn prefetch_b(&self, pc: usize, kc: usize, jc: usize, nc: usize) {
        self.b.prefetch_b(pc, kc, self.j0 + jc, nc)
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
        if j + nr > self.cols {
            return None;
        }
        self.b.conv_panel(pc, kc, self.j0 + j, nr, out)
    }
}

/// Forward convgemm over a whole batch of small output planes: C = A · B (A: K/G × rows of B,
/// B: columns = image · O of all images) one block of columns at a time (spanning images, a
/// multiple of NR wide) into this thread's C panel with the dense store (the kernel writes
/// from registers and accumulates the k-passes in the panel), then copied into y channel by
/// channel with the epilogue. Blocks run in parallel (they write disjoint elements of y).
///
/// `y` is N × `channels` × `plane`; C's rows are channels `c0..c0 + a.rows()`. `serial`: all
/// on the calling thread (the caller runs such calls in parallel).
pub(crate) fn forward_panels<A: PackA, B: PackB>(
    a: &A,
    b: &B,
    y: &mut [f32],
    (channels, plane, c0): (usize, usize, usize),
    epi: Epilogue<'_>,
    serial: bool,
) -> Result<(), core_blas::Error> {
    use rayon::prelude::*;
    let (rows, n) = (a.rows(), b.cols());
    if rows == 0 || n == 0 {
        return Ok(());
    }
    let nr = core_blas::Gemm::global()?.tile().1;
    let threads = if serial {
        1
    } else {
        rayon::current_num_threads().max(1)
    };
    // About 128 Ki floats per panel (512 KiB: half the L2 it is updated in across the
    // k-passes; 64 Ki repacked A too often when K/G is 512), at least 4·NR columns; as many
    // blocks as a multiple of the thread count.
    let target = (PANEL_FLOATS / rows).max(4 * nr);
    let blocks = n.div_ceil(target).div_ceil(threads) * threads;
    let cols_max = n.div_ceil(blocks).div_ceil(nr) * nr;
    let blocks = n.div_ceil(cols_max);
    let out = YPtr {
        ptr: y.as_mut_ptr(),
        len: y.len(),
    };
    // Several blocks: A packed once for all of them (each block's product would pack all of
    // it again), unless the source hands over its own panels.
    let mr = core_blas::Gemm::global()?.tile().0;
    let k = a.cols();
    let prepack = blocks > 1 && k > 0 && a.packed_a(0, rows, 0, k, mr).is_none();
    let mut buf = if prepack {
        PREPACKED.with_borrow_mut(std::mem::take)
    } else {
        Vec::new()
    };
    let pre = prepack.then(|| Prepacked::pack(a, mr, threads, &mut buf));
    let run = |blk: usize| -> Result<(), core_blas::Error> {
        let j0 = blk * cols_max;
        let cols = cols_max.min(n - j0);
        with_panel(rows * cols, |panel| {
            let c = core_blas::MatMut::row_major("panel", panel, rows, cols, cols)?;
            let mut store = OneThread(DenseStore::new(c, 1.0, 0.0));
            let bc = Columns { b, j0, cols };
            match &pre {
                Some(p) => core_blas::gemm_with(p, &bc, &mut store)?,
                None => core_blas::gemm_with(a, &bc, &mut store)?,
            }
            for (r, src) in panel.chunks_exact(cols).enumerate() {
                let ch = c0 + r;
                let add = epi.bias.map_or(0.0, |b| b[ch]);
                let mut t = 0;
                while t < cols {
                    let j = j0 + t;
                    let len = (cols - t).min(plane - j % plane);
                    let off = ((j / plane) * channels + ch) * plane + j % plane;
                    // SAFETY: `off .. off + len` is one run of channel `ch` of image `j / plane`
                    // inside y (C's columns lie in the batch, its rows in the channels), and only
                    // this block writes these columns (see `YPtr`).
                    let dst = unsafe { out.slice(off, len) };
                    epi.apply(dst, &src[t..t + len], add);
                    t += len;
                }
            }
            Ok(())
        })
    };
    let result = if threads == 1 || blocks == 1 {
        (0..blocks).try_for_each(run)
    } else {
        (0..blocks).into_par_iter().try_for_each(run)
    };
    if prepack {
        PREPACKED.with_borrow_mut(|kept| *kept = buf);
    }
    result
}

/// One class of output rows of [`forward_classes`]: `b`'s columns are the output positions
/// `wlo..wlo + wlen` of every image, its rows A's columns `k0..k0 + b.rows()` (in the order
/// of [`forward_classes`]'s prepacked A).
pub(crate) struct RowClass<B> {
    pub(crate) b: B,
    pub(crate) k0: usize,
    pub(crate) wlo: usize,
    pub(crate) wlen: usize,
    /// Rows of one tap group of `b` (channels × taps of a group): `b` packs its panels fused
    /// only in K blocks inside one group ([`group_aligned`]).
    pub(crate) group_rows: usize,
}

/// `gemm` with KC lowered, when needed, so that the driver's passes over a product of depth
/// `k` (and `rows` rows) each lie inside one tap group of `group_rows` rows: the fused packing
/// (`Im2colB::conv_panel`) describes only blocks inside one group, and a block across two
/// groups is packed up front instead. The driver splits k into equal passes of at most KC
/// (or KC + KC/8 when that saves one of two or three); a pass as deep as a whole group, or
/// an equal part of it, never crosses one. KC is left as it is when its passes already align,
/// when a part of a group would be under half of KC, or when the driver would deepen the
/// passes itself (`rows` above MC). The 2 MiB L2 of Intel's Emerald Rapids derives KC 512:
/// ResNet-50 128@28²'s middle class (1152 deep, groups of 384) then ran two passes of 576 and
/// 256@14²'s (2304, groups of 768) five of 461, none fused; KC 384 (the Zen machines') runs
/// passes of 384 on both.
pub(crate) fn group_aligned(
    gemm: &core_blas::Gemm,
    rows: usize,
    k: usize,
    group_rows: usize,
) -> Result<core_blas::Gemm, core_blas::Error> {
    let bs = gemm.block_sizes();
    let pass = |kc: usize| core_blas::BlockSizes { kc, ..bs }.pass_depth(k);
    let aligned = |depth: usize| group_rows.is_multiple_of(depth);
    if group_rows == 0 || k <= group_rows || rows > bs.mc || aligned(pass(bs.kc)) {
        return Ok(*gemm);
    }
    let fit = (1..=group_rows)
        .filter(|d| group_rows.is_multiple_of(*d))
        .map(|d| group_rows / d)
        .find(|&kc| kc <= bs.kc);
    match fit {
        Some(kc) if 2 * kc >= bs.kc && aligned(pass(kc)) => {
            gemm.with_block_sizes(core_blas::BlockSizes { kc, ..bs })
        }
        _ => Ok(*gemm),
    }
}

/// Columns `k0..k0 + k` of an A source, as an A source of its own.
pub(crate) struct KRange<'a, A> {
    pub(crate) a: &'a A,
    pub(crate) k0: usize,
    pub(crate) k: usize,
}

impl<A: PackA> PackA for KRange<'_, A> {
    fn rows(&self) -> usize {
        self.a.rows()
    }
    fn cols(&self) -> usize {
        self.k
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        self.a.pack_a(ic, mc, self.k0 + pc, kc, mr, dst)
    }
    fn packed_a(
        &self,
        ic: usize,
        mc: usize,
        pc: usize,
        kc: usize,
        mr: usize,
    ) -> Option<(&[f32], usize)> {
        self.a.packed_a(ic, mc, self.k0 + pc, kc, mr)
    }
}

/// The forward convgemm over a whole batch of small output planes as several products, one
/// per class of output rows (see [`RowClass`]), each over its own K range of one A: `a`'s
/// columns, `(channel, tap)` with `taps` taps per channel (`ch` channels), are packed once in
/// the order (tap group, channel, tap of the group), groups of `gw` consecutive taps, so that
/// a class whose rows read only some groups (the first and last output rows of a padded
/// kernel) is a contiguous K range. Each product runs block of columns by block as in
/// [`forward_panels`], but through a [`SplitStore`]: the tiles inside one image's window are
/// stored into y from registers, only those that cross images go through the C panel (the
/// panel copy was 1.5% of 128@28²'s forward); the blocks of all classes are cut into one
/// share per thread by their work ([`class_shares`]), and a thread done with its share takes
/// blocks from the back of the others' (a late or slow worker).
pub(crate) fn forward_classes<A: PackA, B: PackB + Sync>(
    a: &A,
    (ch, taps, gw): (usize, usize, usize),
    classes: &[RowClass<B>],
    y: &mut [f32],
    (channels, plane, c0): (usize, usize, usize),
    epi: Epilogue<'_>,
) -> Result<(), core_blas::Error> {
    use rayon::prelude::*;
    let rows = a.rows();
    let k = a.cols();
    if rows == 0 || k == 0 || classes.is_empty() {
        return Ok(());
    }
    debug_assert_eq!(k, ch * taps);
    let gemm = core_blas::Gemm::global()?;
    let (mr, nr) = gemm.tile();
    let threads = rayon::current_num_threads().max(1);
    let target = (PANEL_FLOATS / rows).max(4 * nr);
    let sizes: Vec<(usize, usize)> = classes.iter().map(|c| (c.b.cols(), c.b.rows())).collect();
    let shares = class_shares(&sizes, threads, target, nr);
    let mut buf = PREPACKED.with_borrow_mut(std::mem::take);
    let pre = Prepacked::pack_ordered(a, mr, threads, &mut buf, (ch, taps, gw));
    let out = YPtr {
        ptr: y.as_mut_ptr(),
        len: y.len(),
    };
    let gemms = classes
        .iter()
        .map(|c| group_aligned(gemm, rows, c.b.rows(), c.group_rows))
        .collect::<Result<Vec<_>, _>>()?;
    let run = |&(ci, j0, cols): &(usize, usize, usize)| -> Result<(), core_blas::Error> {
        let cl = &classes[ci];
        let ak = KRange {
            a: &pre,
            k0: cl.k0,
            k: cl.b.rows(),
        };
        with_panel(rows * cols, |panel| {
            let mut store = SplitStore {
                out,
                panel: panel.as_mut_ptr(),
                rows,
                cols,
                j0,
                window: (cl.wlo, cl.wlen),
                dims: (channels, plane, c0),
                epi,
                spilled: (0..cols).map(|_| AtomicBool::new(false)).collect(),
                _panel: std::marker::PhantomData,
            };
            gemms[ci].gemm_with(&ak, &Columns { b: &cl.b, j0, cols }, &mut store)?;
            store.copy_spilled();
            Ok(())
        })
    };
    let result = if shares.len() == 1 {
        shares[0].iter().try_for_each(run)
    } else {
        let taken: Vec<AtomicU64> = shares.iter().map(|_| AtomicU64::new(0)).collect();
        (0..shares.len()).into_par_iter().try_for_each(|own| {
            // This thread's share from the front, then the others' from their backs.
            while let Some(i) = take(&taken[own], shares[own].len(), false) {
                run(&shares[own][i])?;
            }
            for other in (1..shares.len()).map(|d| (own + d) % shares.len()) {
                while let Some(i) = take(&taken[other], shares[other].len(), true) {
                    run(&shares[other][i])?;
                }
            }
            Ok(())
        })
    };
    PREPACKED.with_borrow_mut(|kept| *kept = buf);
    result
}

/// The blocks `(class, first column, columns)` of [`forward_classes`] in `threads` shares, one
/// per thread (empty ones left out), for classes of `(columns, depth)` `sizes`: the classes'
/// columns in order, cut where the work (columns times the class's depth) before the cut is
/// `t / threads` of the total (at multiples of `nr` of a class's columns), each share's part of a class in blocks of at most about `target` columns (as in
/// [`forward_panels`]), a share's blocks largest first. The classes of a padded layer mirror
/// each other (first and last rows), so two threads each get one narrow class and half of the
/// middle one: the same work whatever a narrow class's column costs. The greedy split by
/// columns times depth it replaces gave 128@28²'s thread with both narrow classes 3% more time
/// than the other (per-block trace); `probe_passes --paired --threads 2`, 20 pairs, 6
/// alternations in both orders, quiet 23:52 UTC: 128@28² forward 8.79 → 8.51 ms (6 of 6
/// faster; bound / pass 0.964 → 1.002), other rows level.
fn class_shares(
    sizes: &[(usize, usize)],
    threads: usize,
    target: usize,
    nr: usize,
) -> Vec<Vec<(usize, usize, usize)>> {
    let threads = threads.max(1);
    let total: usize = sizes.iter().map(|&(n, depth)| n * depth.max(1)).sum();
    let mut shares = vec![Vec::new(); threads];
    let mut before = 0;
    for (ci, &(n, depth)) in sizes.iter().enumerate() {
        let depth = depth.max(1);
        // Column `j` of this class starts share `t` where `before + j · depth` reaches
        // `t · total / threads`.
        let cut = |t: usize| -> usize {
            let at = (t * total / threads).saturating_sub(before);
            ((at + depth * nr / 2) / (depth * nr) * nr).min(n)
        };
        for (t, share) in shares.iter_mut().enumerate() {
            let (lo, hi) = (cut(t), if t + 1 == threads { n } else { cut(t + 1) });
            if lo >= hi {
                continue;
            }
            let len = hi - lo;
            let cols_max = len.div_ceil(len.div_ceil(target)).div_ceil(nr) * nr;
            let mut j0 = lo;
            while j0 < hi {
                let cols = cols_max.min(hi - j0);
                share.push((ci, j0, cols));
                j0 += cols;
            }
        }
        before += n * depth;
    }
    for share in &mut shares {
        share.sort_by_key(|&(ci, _, cols)| std::cmp::Reverse(cols * sizes[ci].1));
    }
    shares.retain(|s| !s.is_empty());
    shares
}

/// Takes the next block of a share of `len` blocks whose state is `taken` (blocks taken from
/// the front in the low 32 bits, from the back in the high 32): from the back if `back`.
/// Every block is taken exactly once; `None` once none is left.
fn take(taken: &AtomicU64, len: usize, back: bool) -> Option<usize> {
    let mut s = taken.load(Ordering::Relaxed);
    loop {
        let (front, from_back) = ((s & 0xffff_ffff) as usize, (s >> 32) as usize);
        if front + from_back >= len {
            return None;
        }
        let next = if back { s + (1 << 32) } else { s + 1 };
        match taken.compare_exchange_weak(s, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(if back { len - 1 - from_back } else { front }),
            Err(now) => s = now,
        }
    }
}

/// The store of one column block of [`forward_classes`]: a tile inside one image's window of y
/// is written by the micro-kernel straight into y, with the epilogue ([`Store::window`]); a
/// tile that crosses from one image to the next goes into the block's C panel (`rows × cols`,
/// row-major), whose columns [`SplitStore::copy_spilled`] copies into y after the product.
struct SplitStore<'a> {
    out: YPtr,
    panel: *mut f32,
    rows: usize,
    cols: usize,
    /// The block's first column of the class.
    j0: usize,
    /// The class's output positions `wlo..wlo + wlen` of each image.
    window: (usize, usize),
    /// y's channels and plane, C's first channel.
    dims: (usize, usize, usize),
    epi: Epilogue<'a>,
    /// The columns of the block written into the panel.
    spilled: Vec<AtomicBool>,
    _panel: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: tiles write disjoint elements of y (the class's windows and the channel-major map are
// injective) or of the panel (this block's own, borrowed for the store's lifetime); the flags are
// atomics.
unsafe impl Sync for SplitStore<'_> {}

impl SplitStore<'_> {
    /// Copies the panel's spilled columns into y with the epilogue.
    fn copy_spilled(&self) {
        let (channels, plane, c0) = self.dims;
        let (wlo, wlen) = self.window;
        let cols = self.cols;
        // SAFETY: the panel holds `rows · cols` values, and the product that wrote it is done.
        let panel = unsafe { std::slice::from_raw_parts(self.panel, self.rows * cols) };
        let mut t = 0;
        while t < cols {
            if !self.spilled[t].load(Ordering::Relaxed) {
                t += 1;
                continue;
            }
            let mut e = t + 1;
            while e < cols && self.spilled[e].load(Ordering::Relaxed) {
                e += 1;
            }
            for (r, src) in panel.chunks_exact(cols).enumerate() {
                let chn = c0 + r;
                let add = self.epi.bias.map_or(0.0, |b| b[chn]);
                let mut c = t;
                while c < e {
                    let j = self.j0 + c;
                    let (img, pos) = (j / wlen, wlo + j % wlen);
                    let len = (e - c).min(wlo + wlen - pos);
                    let off = (img * channels + chn) * plane + pos;
                    // SAFETY: `off .. off + len` is one run of channel `chn` of image `img`
                    // inside y, written by this block only (see `YPtr`).
                    let dst = unsafe { self.out.slice(off, len) };
                    self.epi.apply(dst, &src[c..c + len], add);
                    c += len;
                }
            }
            t = e;
        }
    }
}

impl Store for SplitStore<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn store_tile(&self, tile: &Tile<'_>) {
        // Tiles without a window (none: `window` answers every tile) go into the panel.
        for r in 0..tile.rows() {
            let at = (tile.i() + r) * self.cols + tile.j();
            debug_assert!(at + tile.cols() <= self.rows * self.cols);
            // SAFETY: row `i + r`, columns `j .. j + cols` of the panel: inside it, this
            // tile's alone.
            let dst = unsafe { std::slice::from_raw_parts_mut(self.panel.add(at), tile.cols()) };
            for (d, &v) in dst.iter_mut().zip(tile.row(r)) {
                *d = if tile.first() { v } else { *d + v };
            }
        }
        for f in &self.spilled[tile.j()..tile.j() + tile.cols()] {
            f.store(true, Ordering::Relaxed);
        }
    }
    fn concurrent(&self) -> bool {
        false
    }
    fn windows_everywhere(&self) -> bool {
        true
    }
    #[inline]
    fn window(&self, i: usize, j: usize, rows: usize, cols: usize) -> Option<Window<'_>> {
        if rows == 0 || i + rows > self.rows || j + cols > self.cols {
            return None;
        }
        let (wlo, wlen) = self.window;
        let jj = self.j0 + j;
        if jj % wlen + cols > wlen {
            if !self.spilled[j].load(Ordering::Relaxed) {
                for f in &self.spilled[j..j + cols] {
                    f.store(true, Ordering::Relaxed);
                }
            }
            // SAFETY: element (r, c) of the tile is panel[(i + r)·cols + j + c], inside the
            // panel (checked above), and no other tile maps there; the panel is this block's.
            return Some(unsafe {
                Window::new(self.panel.add(i * self.cols + j), self.cols, 1.0, 0.0)
            });
        }
        let (channels, plane, c0) = self.dims;
        let ch = c0 + i;
        let off = ((jj / wlen) * channels + ch) * plane + wlo + jj % wlen;
        if off + (rows - 1) * plane + cols > self.out.len {
            return None;
        }
        // SAFETY: element (r, c) of the tile is y[off + r·plane + c]: channel ch + r of image
        // jj / wlen at position wlo + jj % wlen + c, inside the class's window (checked above)
        // and y (checked above); the channel-major map is injective and the classes' windows
        // disjoint, so no other tile of any block maps there (see `YPtr`).
        Some(unsafe { self.epi.window(self.out.ptr.add(off), plane, ch, rows) })
    }
}

thread_local! {
    /// The buffer of [`Prepacked`] on this thread, kept across calls (taken out during a call,
    /// so that a nested call on the same thread packs into a buffer of its own).
    static PREPACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// An A source packed once for all of k: micro-panel `q` (rows `q·mr ..`, zero past the
/// last row) holds all `k` columns, `data[q·k·mr ..][.. k·mr]`, so every `(ic, pc)` block
/// is read in place ([`PackA::packed_a`]). [`forward_panels`] multiplies the same A by
/// several column blocks of B, and packed it again for each (ResNet-50's 256@14², 1 thread:
/// four blocks of a 256 × 2304 A). `probe_passes`, 1 thread, quiet 00:35:38 UTC, 3
/// alternations, ms, per block / once: 256@14² forward 17.70 / 17.36, 17.76 / 17.33, 17.65 /
/// 17.35, flipped backward-data 18.20 / 17.52, 18.34 / 17.45, 18.12 / 17.41; 128@28² forward
/// 17.86 / 17.51, 17.68 / 17.53, 18.18 / 17.70; 512@7² flipped 20.89 / 19.27, 20.36 / 18.94,
/// 20.36 / 19.24, forward level (its A, 9 MiB, is then read from L3 by the kernel).
pub(crate) struct Prepacked<'a> {
    rows: usize,
    cols: usize,
    mr: usize,
    data: &'a [f32],
}

impl<'a> Prepacked<'a> {
    /// Packs all of `a` into `buf` (resized), micro-panels shared out over `threads`.
    pub(crate) fn pack<A: PackA>(a: &A, mr: usize, threads: usize, buf: &'a mut Vec<f32>) -> Self {
        let (rows, cols) = (a.rows(), a.cols());
        let data = sized(buf, rows.div_ceil(mr) * mr * cols);
        Self::fill(rows, cols, mr, threads, data, |ic, dst| {
            // `pack_a` writes panel `q` of a block at `q·kc·mr`: the part's panels in a row.
            a.pack_a(ic, (dst.len() / cols).min(rows - ic), 0, cols, mr, dst);
        })
    }

    /// [`Prepacked::pack`] of several sources into one buffer, back to back.
    pub(crate) fn pack_all<A: PackA>(
        a: &[A],
        mr: usize,
        threads: usize,
        buf: &'a mut Vec<f32>,
    ) -> Vec<Self> {
        let lens: Vec<usize> = a
            .iter()
            .map(|a| a.rows().div_ceil(mr) * mr * a.cols())
            .collect();
        let mut rest = sized(buf, lens.iter().sum());
        let mut out = Vec::with_capacity(a.len());
        for (a, &len) in a.iter().zip(&lens) {
            let (data, tail) = rest.split_at_mut(len);
            rest = tail;
            let (rows, cols) = (a.rows(), a.cols());
            out.push(Self::fill(rows, cols, mr, threads, data, |ic, dst| {
                a.pack_a(ic, (dst.len() / cols).min(rows - ic), 0, cols, mr, dst);
            }));
        }
        out
    }

    /// [`Prepacked::pack`] with A's columns reordered: column `c·taps + q·gw + t` (channel
    /// `c` of `ch`, tap `q·gw + t`) becomes column `(q·ch + c)·gw + t` (groups of `gw`
    /// consecutive taps, group-major). Each micro-panel is packed in A's own order into a
    /// buffer of one micro-panel, then copied group by group (`gw · mr` values a copy). One
    /// group of all taps (`gw == taps`) is A's own order: [`Prepacked::pack`].
    fn pack_ordered<A: PackA>(
        a: &A,
        mr: usize,
        threads: usize,
        buf: &'a mut Vec<f32>,
        (ch, taps, gw): (usize, usize, usize),
    ) -> Self {
        let (rows, cols) = (a.rows(), a.cols());
        debug_assert!(cols == ch * taps && taps.is_multiple_of(gw));
        if gw == taps {
            return Self::pack(a, mr, threads, buf);
        }
        let data = sized(buf, rows.div_ceil(mr) * mr * cols);
        Self::fill(rows, cols, mr, threads, data, |ic0, dst| {
            let mut tmp = vec![0f32; cols * mr];
            for (q, panel) in dst.chunks_exact_mut(cols * mr).enumerate() {
                let ic = ic0 + q * mr;
                a.pack_a(ic, mr.min(rows - ic), 0, cols, mr, &mut tmp);
                let run = gw * mr;
                for g in 0..taps / gw {
                    for c in 0..ch {
                        let from = &tmp[(c * taps + g * gw) * mr..][..run];
                        let to = &mut panel[(g * ch + c) * run..][..run];
                        // SAFETY: `from` and `to` hold `run` values each (bounds checked when
                        // they were taken) and do not overlap (`tmp` is this part's own).
                        unsafe { copy_run(to.as_mut_ptr(), from.as_ptr(), run, 1) };
                    }
                }
            }
        })
    }

    /// Fills `data` (the micro-panels of a `rows` × `cols` A) in parts of whole micro-panels
    /// shared out over `threads`: `part(ic, dst)` writes the panels of rows `ic ..` into `dst`
    /// (`cols · mr` values a panel).
    fn fill(
        rows: usize,
        cols: usize,
        mr: usize,
        threads: usize,
        data: &'a mut [f32],
        part: impl Fn(usize, &mut [f32]) + Sync,
    ) -> Self {
        use rayon::prelude::*;
        let panels = rows.div_ceil(mr);
        debug_assert_eq!(data.len(), panels * mr * cols);
        let per = panels.div_ceil(threads.max(1)).max(1);
        let run = |(i, dst): (usize, &mut [f32])| part(i * per * mr, dst);
        if threads > 1 {
            data.par_chunks_mut(per * mr * cols)
                .enumerate()
                .for_each(run);
        } else {
            data.chunks_mut(per * mr * cols).enumerate().for_each(run);
        }
        let data: &'a [f32] = data;
        Prepacked {
            rows,
            cols,
            mr,
            data,
        }
    }
}

/// `buf[..len]`, `buf` grown to at least `len` first.
fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    &mut buf[..len]
}

/// Runs `f` with this thread's [`Prepacked`] buffer (taken out during the call, so that a
/// nested call packs into a buffer of its own; kept for the next call).
pub(crate) fn with_prepacked<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    let mut buf = PREPACKED.with_borrow_mut(std::mem::take);
    let r = f(&mut buf);
    PREPACKED.with_borrow_mut(|kept| *kept = buf);
    r
}

impl PackA for Prepacked<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        // Only when the driver's tile differs from the packing's (it takes `packed_a`
        // otherwise): element by element.
        for q in 0..mc.div_ceil(mr) {
            for p in 0..kc {
                for r in 0..mr {
                    let i = ic + q * mr + r;
                    dst[(q * kc + p) * mr + r] = if i < ic + mc {
                        self.data[((i / self.mr) * self.cols + pc + p) * self.mr + i % self.mr]
                    } else {
                        0.0
                    };
                }
            }
        }
    }
    fn packed_a(
        &self,
        ic: usize,
        _mc: usize,
        pc: usize,
        _kc: usize,
        mr: usize,
    ) -> Option<(&[f32], usize)> {
        (mr == self.mr && ic.is_multiple_of(mr)).then(|| {
            (
                &self.data[((ic / mr) * self.cols + pc) * mr..],
                self.cols * mr,
            )
        })
    }
}

/// Floats of one forward C panel (see [`forward_panels`]).
const PANEL_FLOATS: usize = 128 * 1024;

/// y as a raw pointer shared by the blocks of [`forward_panels`], which write disjoint columns.
#[derive(Clone, Copy)]
struct YPtr {
    ptr: *mut f32,
    len: usize,
}

impl YPtr {
    /// `y[off .. off + len]`.
    ///
    /// # Safety
    /// The range must lie inside y and no other live slice may overlap it.
    unsafe fn slice<'a>(self, off: usize, len: usize) -> &'a mut [f32] {
        debug_assert!(off + len <= self.len);
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

// SAFETY: the blocks that share a `YPtr` write disjoint column ranges of C, which the
// channel-major map sends to disjoint elements of y; the `&mut y` borrow held by
// `forward_panels` outlives them.
unsafe impl Sync for YPtr {}

#[cfg(test)]
mod tests {
    use crate::testing::check_forward_bias_relu;
    use crate::{ConvGeometry, ForwardAlgo};

    /// [`super::group_aligned`]: with KC 512 (Emerald Rapids' derived blocks), ResNet-50
    /// 128@28²'s and 256@14²'s deep classes get KC 384, whose passes each lie in one tap
    /// group; products whose passes already align, single-group ones and products deeper in
    /// rows than MC keep KC 512; KC 384 keeps 384.
    #[test]
    fn group_aligned_passes_stay_inside_one_tap_group() {
        let gemm = |kc: usize| {
            core_blas::Gemm::new(core_blas::Isa::Scalar)
                .unwrap()
                .with_block_sizes(core_blas::BlockSizes {
                    mc: 512,
                    kc,
                    nc: 4080,
                })
                .unwrap()
        };
        // (KC, rows, k, group rows, the KC used)
        let cases = [
            (512, 128, 1152, 384, 384),
            (512, 256, 2304, 768, 384),
            (512, 256, 1536, 768, 384),
            (512, 128, 768, 384, 512),
            (512, 512, 4608, 1536, 512),
            (512, 512, 3072, 1536, 512),
            (512, 128, 384, 384, 512),
            (512, 640, 1152, 384, 512),
            (512, 128, 1152, 0, 512),
            (384, 128, 1152, 384, 384),
            (384, 256, 2304, 768, 384),
        ];
        for (kc, rows, k, gr, want) in cases {
            let got = super::group_aligned(&gemm(kc), rows, k, gr).unwrap();
            assert_eq!(
                got.block_sizes().kc,
                want,
                "KC {kc}, {rows} × {k}, groups of {gr}"
            );
        }
    }

    /// [`super::class_shares`]: every column of every class in exactly one block, blocks of at
    /// most `target` columns (rounded up to `nr`) starting at multiples of `nr`, each share's
    /// work within `nr` columns of the deepest class of an even split, blocks largest first;
    /// ResNet-50's 128@28² and 256@14² classes on two threads: one narrow class a thread.
    #[test]
    fn class_shares_cover_the_columns_once_and_even_out_the_work() {
        // Classes' (columns, depth), the target width, NR.
        type Case = (&'static [(usize, usize)], usize, usize);
        let cases: [Case; 6] = [
            (&[(224, 768), (5824, 1152), (224, 768)], 1024, 48),
            (&[(112, 1536), (1344, 2304), (112, 1536)], 512, 48),
            (&[(7, 5), (100, 9), (33, 3), (1, 9)], 32, 8),
            (&[(1000, 10)], 96, 16),
            (&[(0, 5), (50, 5), (3, 1)], 20, 4),
            (&[(40, 2), (8, 6)], 8, 8),
        ];
        for (sizes, target, nr) in cases {
            let total: usize = sizes.iter().map(|&(n, d)| n * d).sum();
            let deepest = sizes.iter().map(|&(_, d)| d).max().unwrap_or(0);
            for threads in 1..=4 {
                let shares = super::class_shares(sizes, threads, target, nr);
                assert!(shares.len() <= threads && shares.iter().all(|s| !s.is_empty()));
                let mut seen: Vec<Vec<u32>> = sizes.iter().map(|&(n, _)| vec![0; n]).collect();
                for share in &shares {
                    let work = |&(ci, _, cols): &(usize, usize, usize)| cols * sizes[ci].1;
                    for (ci, j0, cols) in share.iter().copied() {
                        assert!(cols > 0 && cols <= target.div_ceil(nr) * nr);
                        assert!(j0.is_multiple_of(nr), "{sizes:?} {threads}: block at {j0}");
                        seen[ci][j0..j0 + cols].iter_mut().for_each(|s| *s += 1);
                    }
                    assert!(share.windows(2).all(|p| work(&p[0]) >= work(&p[1])));
                    if shares.len() == threads {
                        let got: usize = share.iter().map(work).sum();
                        assert!(
                            got.abs_diff(total / threads) <= nr * deepest,
                            "{sizes:?} {threads} threads: {got} of {total}"
                        );
                    }
                }
                assert!(
                    seen.iter().flatten().all(|&s| s == 1),
                    "{sizes:?} {threads}"
                );
                if threads == 2 && sizes.len() == 3 && sizes[0] == sizes[2] && sizes[0].0 > 0 {
                    for share in &shares {
                        let narrow = share.iter().filter(|b| b.0 != 1).count();
                        assert_eq!(narrow, 1, "{sizes:?}: {shares:?}");
                    }
                }
            }
        }
    }

    /// [`super::take`]: blocks from the front in order, from the back in reverse order, never
    /// one twice; threads that take their own share's blocks from the front and then the
    /// others' from the back take every block exactly once.
    #[test]
    fn shares_are_taken_exactly_once() {
        use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
        let one = AtomicU64::new(0);
        let got: Vec<_> = [false, true, true, false, false, true, false]
            .map(|back| super::take(&one, 5, back))
            .into();
        assert_eq!(
            got,
            [Some(0), Some(4), Some(3), Some(1), Some(2), None, None]
        );
        for lens in [vec![1usize, 0, 7], vec![50, 3, 20, 9], vec![200, 200]] {
            for _ in 0..20 {
                let taken: Vec<AtomicU64> = lens.iter().map(|_| AtomicU64::new(0)).collect();
                let count: Vec<Vec<AtomicUsize>> = lens
                    .iter()
                    .map(|&l| (0..l).map(|_| AtomicUsize::new(0)).collect())
                    .collect();
                std::thread::scope(|sc| {
                    for own in 0..lens.len() {
                        let (taken, count, lens) = (&taken, &count, &lens);
                        sc.spawn(move || {
                            let order = (0..lens.len()).map(|d| (own + d) % lens.len());
                            for (i, s) in order.enumerate() {
                                while let Some(b) = super::take(&taken[s], lens[s], i > 0) {
                                    count[s][b].fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        });
                    }
                });
                for c in count.iter().flatten() {
                    assert_eq!(c.load(Ordering::Relaxed), 1, "{lens:?}");
                }
            }
        }
    }

    /// The whole-batch forward (C panels, and the windowed channel-major store) on 1, 2 and 3 threads (blocks per thread, a short last block), with
    /// bias and ReLU, groups and a pointwise layer, against the reference.
    #[test]
    fn forward_panels_match_the_reference() {
        let geoms = [
            ConvGeometry::new(5, 6, 40, &[23, 29], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap()
                .with_groups(2)
                .unwrap(),
            ConvGeometry::new(4, 30, 70, &[17, 19], &[1, 1]).unwrap(),
            ConvGeometry::new(3, 4, 64, &[5, 6, 7], &[2, 3, 3])
                .unwrap()
                .with_stride(&[1, 2, 1])
                .unwrap(),
            // Planes of 575 (stored through windows, with tiles straddling images through the
            // tile buffer) and of 49 (C panels), each with a k longer than one k-pass.
            ConvGeometry::new(3, 300, 20, &[25, 23], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(3, 300, 20, &[7, 7], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
        ];
        for g in &geoms {
            check_forward_bias_relu(g, ForwardAlgo::Convgemm, 3).unwrap();
        }
    }
}
