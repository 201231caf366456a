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
//! A source that already holds its matrix in this layout can skip the copy:
//! [`PackA::packed_a`] and [`PackB::packed_b`] hand the driver their micro-panels in place.
//!
//! Both traits require `Sync`: several threads pack disjoint blocks of the same source at once.

use std::cell::Cell;

use crate::{ConvPanel, MatRef};

/// A source for the right operand B (`k × n`) that packs itself.
pub trait PackB: Sync {
    /// Rows of B (the inner dimension `k`).
    fn rows(&self) -> usize;
    /// Columns of B (`n`).
    fn cols(&self) -> usize;
    /// Pack the `kc × nc` block at `(pc, jc)` into `nr`-wide micro-panels (layout in the module
    /// doc). `dst.len() >= nc.div_ceil(nr) * nr * kc`; the block lies inside the matrix.
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]);
    /// Hint: the `kc × nc` block at `(pc, jc)` will be packed soon. The driver calls it in small
    /// slices while the micro-kernels work on the previous block, so that a source streamed from
    /// memory overlaps its reads with computation. The default does nothing.
    #[inline]
    fn prefetch_b(&self, pc: usize, kc: usize, jc: usize, nc: usize) {
        let _ = (pc, kc, jc, nc);
    }
    /// The matrix as dense row-major storage `(data, ld)`, element `(p, j)` at `data[p · ld + j]`,
    /// when it is one; the default is `None`. The driver then packs a block's full `nr`-wide
    /// micro-panels inside the micro-kernels (the first tile of each panel reads the rows from
    /// `data` and writes the packed panel as it goes, overlapping the copy with its FMAs) and
    /// calls [`PackB::pack_b`] only for the last, partial panel and the full panels past the
    /// last whole group of panels the kernel family packs in one tile (3 for AVX2). A source
    /// whose packed values are not its storage read row by row (im2col, a transform) must keep
    /// the default.
    #[inline]
    fn row_major(&self) -> Option<(&[f32], usize)> {
        None
    }
    /// Whether [`PackB::conv_panel`] may describe full `nr`-wide panels (the driver then
    /// leaves those panels to the micro-kernels that can pack them, and asks per panel); the
    /// default is `false`, at no cost for other sources.
    #[inline]
    fn conv_fusable(&self, nr: usize) -> bool {
        let _ = nr;
        false
    }
    /// The full `nr`-wide micro-panel at `(pc, j)` (`kc` rows) as the repeating rows of an
    /// im2col matrix read from one source slice ([`ConvPanel`]: per tap `nr / 16` masked
    /// chunks, and where the first row's channel plane starts): fills `out` and returns the
    /// slice, or `None` (the default) when the panel is not of that form, which the driver
    /// then packs with [`PackB::pack_b`]. The values described must be those `pack_b` would
    /// write; the driver packs with `pack_b` any panel whose chunks its kernel cannot read
    /// (not step-1 single pieces) or whose offsets leave the slice.
    ///
    /// The driver reads the returned slice only in the panel's first tile, on the calling
    /// thread, right after this call: in between it calls at most [`PackB::prefetch_b`] on
    /// this source, never [`PackB::pack_b`] or `conv_panel`. A source may therefore return a
    /// slice of per-thread storage that only its `pack_b` or `conv_panel` rewrite (conv-ops's
    /// blocked backward-filter does).
    #[inline]
    fn conv_panel(
        &self,
        pc: usize,
        kc: usize,
        j: usize,
        nr: usize,
        out: &mut ConvPanel,
    ) -> Option<&[f32]> {
        let _ = (pc, kc, j, nr, out);
        None
    }
    /// The `kc × nc` block at `(pc, jc)` already packed, read in place instead of copied (the
    /// B side of [`PackA::packed_a`]): a source that holds its matrix in `nr`-wide panels
    /// returns `Some((panels, stride))` where micro-panel `q` (`0..ceil(nc / nr)`) is
    /// `panels[q * stride ..][.. kc * nr]` in the layout of [`PackB::pack_b`] (row `p` = `nr`
    /// values of columns `jc + q·nr ..`, columns past `n` zero). The driver asks only when it
    /// would pack the block up front (not for blocks the micro-kernels pack,
    /// [`PackB::row_major`] and [`PackB::conv_panel`]), checks the slice is long enough
    /// (`(ceil(nc / nr) − 1) · stride + kc · nr`) and otherwise calls `pack_b`. The default
    /// returns `None`: always pack.
    #[inline]
    fn packed_b(
        &self,
        pc: usize,
        kc: usize,
        jc: usize,
        nc: usize,
        nr: usize,
    ) -> Option<(&[f32], usize)> {
        let _ = (pc, kc, jc, nc, nr);
        None
    }
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
    /// The `mc × kc` block at `(ic, pc)` already packed, read in place instead of copied: a
    /// source that keeps its matrix packed once (fastconv's transformed kernels) returns
    /// `Some((panels, stride))` where micro-panel `q` (`0..ceil(mc / mr)`) is
    /// `panels[q * stride ..][.. kc * mr]` in the layout of [`PackA::pack_a`] (column `p` = `mr`
    /// values of rows `ic + q·mr ..`, rows past `m` zero). The driver checks the slice is long
    /// enough (`(ceil(mc / mr) − 1) · stride + kc · mr`) and otherwise calls `pack_a`. The
    /// default returns `None`: always pack.
    #[inline]
    fn packed_a(
        &self,
        ic: usize,
        mc: usize,
        pc: usize,
        kc: usize,
        mr: usize,
    ) -> Option<(&[f32], usize)> {
        let _ = (ic, mc, pc, kc, mr);
        None
    }
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
    #[inline]
    fn row_major(&self) -> Option<(&[f32], usize)> {
        (self.cs == 1).then_some((self.data, self.rs))
    }
    /// Every cache line of the block's rows (row-major B only), `prefetcht2`: on Zen 4 (L2 1 MiB,
    /// session 18) the packing of a B block streamed from L3 or memory waits on its reads unless
    /// they were started while the micro-kernels worked on the previous block. The driver asks
    /// only for blocks that fit L2 beside the A block when it packs B up front, and for the next
    /// panel when the first tiles pack it (AVX-512 and AVX2, [`PackB::row_major`]). gemm_ratio 1
    /// thread, 8 × 48, alternating, quiet 19:04 and 19:07 UTC, none / `prefetcht1` / `prefetcht0` / `prefetcht2` / `nta`:
    /// 64×50176×576 74.3 / 78.9 / 74.7 / 79.8 / 74.4, 72.9 / 78.1 / 73.8 / 79.9 / 73.5% of the
    /// peak; 64×4096×576 73.1 / 79.5 / 74.1 / 79.8 / 73.5, 74.0 / 72.4 / 73.4 / 78.2 / 71.0%;
    /// none / `prefetcht2` 73.5 / 79.6, 73.2 / 78.5% (19:07). On the Cascade Lake guest of
    /// sessions 11-13 `prefetcht1` of every line stalled the core (64×50176×576 34.9-37.8 →
    /// 38.2-43.8% of the peak without it, quiet 21:45 UTC, session 13).
    #[inline]
    fn prefetch_b(&self, pc: usize, kc: usize, jc: usize, nc: usize) {
        if nc == 0 || self.cs != 1 {
            return;
        }
        for p in pc..pc + kc {
            let row = p * self.rs + jc;
            for j in (0..nc).step_by(16) {
                prefetch::<HINT_T2>(self.data, row + j);
            }
            // The row's last line when it starts off a line boundary.
            prefetch::<HINT_T2>(self.data, row + nc - 1);
        }
    }
}

/// Hint that `data[idx]` will be read soon: brings its cache line toward L2 (`prefetcht1` on
/// x86_64; a no-op elsewhere and when `idx` is out of bounds). For [`PackB::prefetch_b`]
/// implementations in crates that may not use intrinsics.
#[inline(always)]
pub fn prefetch_l2(data: &[f32], idx: usize) {
    prefetch::<HINT_T1>(data, idx)
}

/// `_mm_prefetch`'s hints `_MM_HINT_T1` and `_MM_HINT_T2` (nameable off x86_64 too).
const HINT_T1: i32 = 2;
const HINT_T2: i32 = 1;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(
    HINT_T1 == core::arch::x86_64::_MM_HINT_T1 && HINT_T2 == core::arch::x86_64::_MM_HINT_T2
);

/// `_mm_prefetch` with `HINT` of the cache line holding `data[idx]` (no-op off x86_64 or out of
/// bounds).
#[inline(always)]
fn prefetch<const HINT: i32>(data: &[f32], idx: usize) {
    #[cfg(target_arch = "x86_64")]
    if idx < data.len() {
        // SAFETY: `idx` is in bounds; prefetch has no architectural effect and needs only SSE,
        // which every x86_64 CPU has.
        unsafe { core::arch::x86_64::_mm_prefetch::<HINT>(data.as_ptr().add(idx).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, idx);
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
    if sx == 1 {
        // The x values of one p are contiguous in the source (row-major B, column-major A): walk
        // the source line by line so reads stream sequentially (one hardware-prefetch stream), and
        // scatter each line's r-chunks to the panels (the destination block is cache-resident).
        // The common panel widths get a fixed-size copy the compiler turns into vector moves.
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx") {
            // SAFETY: AVX is present (checked just above).
            unsafe {
                match r {
                    4 => pack_lines_avx::<4>(data, sp, x0, w, p0, kc, dst),
                    6 => pack_lines_avx::<6>(data, sp, x0, w, p0, kc, dst),
                    8 => pack_lines_avx::<8>(data, sp, x0, w, p0, kc, dst),
                    12 => pack_lines_avx::<12>(data, sp, x0, w, p0, kc, dst),
                    16 => pack_lines_avx::<16>(data, sp, x0, w, p0, kc, dst),
                    24 => pack_lines_avx::<24>(data, sp, x0, w, p0, kc, dst),
                    32 => pack_lines_avx::<32>(data, sp, x0, w, p0, kc, dst),
                    48 => pack_lines_avx::<48>(data, sp, x0, w, p0, kc, dst),
                    _ => pack_lines_any(data, sp, x0, w, p0, kc, r, dst),
                }
            }
            return;
        }
        match r {
            4 => pack_lines::<4>(data, sp, x0, w, p0, kc, dst),
            6 => pack_lines::<6>(data, sp, x0, w, p0, kc, dst),
            8 => pack_lines::<8>(data, sp, x0, w, p0, kc, dst),
            12 => pack_lines::<12>(data, sp, x0, w, p0, kc, dst),
            16 => pack_lines::<16>(data, sp, x0, w, p0, kc, dst),
            24 => pack_lines::<24>(data, sp, x0, w, p0, kc, dst),
            32 => pack_lines::<32>(data, sp, x0, w, p0, kc, dst),
            48 => pack_lines::<48>(data, sp, x0, w, p0, kc, dst),
            _ => pack_lines_any(data, sp, x0, w, p0, kc, r, dst),
        }
        return;
    }
    for (q, panel) in dst.chunks_exact_mut(r * kc).take(panels).enumerate() {
        let xq = x0 + q * r;
        let wq = r.min(x0 + w - xq);
        if sp == 1 && wq == r && gather_runs(data, sx, xq, p0, kc, r, panel) {
            // Full panel of contiguous runs (row-major A): done by the fixed-width gather.
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

/// A full panel of `r` contiguous runs (x = xq..xq+r, each `kc` long from `p0`) for the common
/// widths; returns `false` for other widths (the caller then uses the generic loop).
#[inline]
fn gather_runs(
    data: &[f32],
    sx: usize,
    xq: usize,
    p0: usize,
    kc: usize,
    r: usize,
    panel: &mut [f32],
) -> bool {
    match r {
        4 => gather::<4>(data, sx, xq, p0, kc, panel),
        6 => gather::<6>(data, sx, xq, p0, kc, panel),
        8 => gather::<8>(data, sx, xq, p0, kc, panel),
        12 => gather::<12>(data, sx, xq, p0, kc, panel),
        16 => gather::<16>(data, sx, xq, p0, kc, panel),
        // 24, 32 and 48: the AVX-512 family's NR (48 since session 13, 32 before) and narrow
        // widths (a transposed B of fastconv's backward-filter went through the scalar loop
        // below: 5 % of the paper layer's passes).
        24 => gather::<24>(data, sx, xq, p0, kc, panel),
        32 => gather::<32>(data, sx, xq, p0, kc, panel),
        48 => gather::<48>(data, sx, xq, p0, kc, panel),
        _ => return false,
    }
    true
}

/// Interleave `R` runs of length `kc`: `panel[p * R + x] = run_x[p]`, one contiguous `R`-wide
/// output row per p (bounds checks hoisted by slicing the runs once).
#[inline(always)]
fn gather<const R: usize>(
    data: &[f32],
    sx: usize,
    xq: usize,
    p0: usize,
    kc: usize,
    panel: &mut [f32],
) {
    let runs: [&[f32]; R] = std::array::from_fn(|x| &data[(xq + x) * sx + p0..][..kc]);
    #[cfg(all(test, target_arch = "x86_64"))]
    let vector = !SCALAR_GATHER.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(all(not(test), target_arch = "x86_64"))]
    let vector = true;
    #[cfg(target_arch = "x86_64")]
    if vector
        && (R.is_multiple_of(8) || R == 12)
        && kc > 0
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        // SAFETY: avx2+fma checked just above; every run holds `kc` values (sliced above), the
        // panel `kc · R` = (kc − 1) · R + R values, and the panel (`&mut`) overlaps no run.
        unsafe { crate::transpose::transpose_avx2(&mut panel[..kc * R], R, &runs, kc) };
        return;
    }
    for (p, out) in panel[..kc * R].chunks_exact_mut(R).enumerate() {
        for x in 0..R {
            out[x] = runs[x][p];
        }
    }
}

/// The tuning probe's switch back to the scalar gather (test builds only).
#[cfg(test)]
pub(crate) static SCALAR_GATHER: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// [`pack_panels`] for a unit x-stride and any panel width, line by line.
#[allow(clippy::too_many_arguments)]
fn pack_lines_any(
    data: &[f32],
    sp: usize,
    x0: usize,
    w: usize,
    p0: usize,
    kc: usize,
    r: usize,
    dst: &mut [f32],
) {
    for p in 0..kc {
        let line = &data[(p0 + p) * sp + x0..][..w];
        for (q, chunk) in line.chunks(r).enumerate() {
            let out = &mut dst[q * r * kc + p * r..][..r];
            out[..chunk.len()].copy_from_slice(chunk);
            out[chunk.len()..].fill(0.0);
        }
    }
}

/// [`pack_lines`] compiled with AVX: the `R`-wide row copies become 256-bit moves (the crate is
/// otherwise built for baseline x86-64, where they are 128-bit: twice the loads and stores).
///
/// # Safety
/// The CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn pack_lines_avx<const R: usize>(
    data: &[f32],
    sp: usize,
    x0: usize,
    w: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
) {
    pack_lines::<R>(data, sp, x0, w, p0, kc, dst)
}

/// Source lines [`pack_lines`] reads at once.
const LINE_GROUP: usize = 8;

/// [`pack_panels`] for a unit x-stride and a panel width known at compile time.
///
/// The source is read [`LINE_GROUP`] lines at a time: for each panel, the group's `R`-wide rows
/// (contiguous in the panel) are written together, the lines being read as parallel sequential
/// streams. Line by line, each source line would scatter its chunks one per panel, `kc · R`
/// values apart: with `kc · R · 4` a multiple of 4 KiB those all fall in one L1 set and every
/// store misses (measured: 64×50176×576 +4-6 points of peak, 256×3136×2304 +6).
#[inline(always)]
fn pack_lines<const R: usize>(
    data: &[f32],
    sp: usize,
    x0: usize,
    w: usize,
    p0: usize,
    kc: usize,
    dst: &mut [f32],
) {
    const G: usize = LINE_GROUP;
    let full = w / R;
    let grouped = kc / G * G;
    for pg in (0..grouped).step_by(G) {
        let lines: [&[f32]; G] = std::array::from_fn(|i| &data[(p0 + pg + i) * sp + x0..][..w]);
        for q in 0..full {
            let out = &mut dst[q * R * kc + pg * R..][..G * R];
            for (i, line) in lines.iter().enumerate() {
                let o: &mut [f32; R] = (&mut out[i * R..][..R])
                    .try_into()
                    .unwrap_or_else(|_| unreachable!());
                let src: &[f32; R] = (&line[q * R..][..R])
                    .try_into()
                    .unwrap_or_else(|_| unreachable!());
                *o = *src;
            }
        }
    }
    // The lines after the last whole group, one at a time.
    for p in grouped..kc {
        let line = &data[(p0 + p) * sp + x0..][..w];
        for q in 0..full {
            let o: &mut [f32; R] = (&mut dst[q * R * kc + p * R..][..R])
                .try_into()
                .unwrap_or_else(|_| unreachable!());
            let src: &[f32; R] = (&line[q * R..][..R])
                .try_into()
                .unwrap_or_else(|_| unreachable!());
            *o = *src;
        }
    }
    // The last, zero-padded panel when w is not a multiple of R.
    let tail = w % R;
    if tail > 0 {
        for p in 0..kc {
            let line = &data[(p0 + p) * sp + x0 + full * R..][..tail];
            let out = &mut dst[full * R * kc + p * R..][..R];
            out[..tail].copy_from_slice(line);
            out[tail..].fill(0.0);
        }
    }
}

/// Per-thread packing buffers: `Ac` (A block, L2-sized) and `Bc` (B block, L3-sized), and the
/// fused im2col packing's resolved panels (kept across products: the panels of a batch's
/// images repeat but for their bases).
#[derive(Default)]
pub(crate) struct Workspace {
    pub(crate) a: crate::AlignedVec,
    pub(crate) b: crate::AlignedVec,
    pub(crate) conv: crate::kernel::convpack::ConvRows,
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

/// Frees the packing buffers of the calling thread and of every thread of the current rayon
/// pool; returns the bytes freed. They grow to the largest blocks a thread has packed and stay
/// at that size, so that the next product allocates nothing; a caller that ran large products
/// once (`nn`'s `auto` algorithm choice tries every candidate on every layer, sizes the run may
/// never use again) can give them back. Buffers in use by a product running at the time (on
/// another thread of the pool) are left as they are. The next product grows them again;
/// results do not change.
pub fn release_workspaces() -> usize {
    let release = || {
        WORKSPACE
            .take()
            .map_or(0, |ws| 4 * (ws.a.capacity() + ws.b.capacity()))
    };
    let pool: usize = rayon::broadcast(|_| release()).into_iter().sum();
    if rayon::current_thread_index().is_some() {
        pool
    } else {
        pool + release()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `release_workspaces` frees what a product grew on this thread, and the next product
    /// grows the buffers again with the same result.
    #[test]
    fn released_workspaces_regrow() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        pool.install(|| {
            let (m, n, k) = (200, 300, 260);
            let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
            let run = || {
                let mut c = vec![f32::NAN; m * n];
                crate::sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n).unwrap();
                c
            };
            let first = run();
            assert!(release_workspaces() > 0);
            assert_eq!(release_workspaces(), 0);
            assert_eq!(run(), first);
            assert!(release_workspaces() > 0);
        });
    }

    /// `pack_panels` on a unit p-stride (a transposed view: x runs are contiguous over p, as B = Vᵀ
    /// of fastconv's backward-filter), for every panel width of `gather_runs` (24 and 32 included)
    /// and a width without a fixed arm, full and partial panels, the vector and the scalar gather,
    /// against the layout definition (NaN-filled destination: every value is written).
    #[test]
    fn transposed_panels_match_the_layout() {
        let (sx, xs) = (203usize, 75usize);
        let data: Vec<f32> = (0..sx * xs).map(|i| i as f32 * 0.25 - 11.0).collect();
        for scalar in [false, true] {
            SCALAR_GATHER.store(scalar, std::sync::atomic::Ordering::Relaxed);
            for r in [4usize, 6, 8, 12, 16, 24, 32, 48, 20] {
                for (x0, w, p0, kc) in [
                    (0usize, 64usize, 0usize, 37usize),
                    (3, 70, 5, 9),
                    (1, 24, 2, 1),
                ] {
                    let panels = w.div_ceil(r);
                    let mut want = vec![0.0f32; panels * r * kc];
                    for q in 0..panels {
                        for p in 0..kc {
                            for x in 0..r {
                                let col = q * r + x;
                                want[q * r * kc + p * r + x] = if col < w {
                                    data[(x0 + col) * sx + p0 + p]
                                } else {
                                    0.0
                                };
                            }
                        }
                    }
                    let mut got = vec![f32::NAN; want.len()];
                    pack_panels(&data, sx, 1, x0, w, p0, kc, r, &mut got);
                    assert_eq!(
                        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "r={r} x0={x0} w={w} p0={p0} kc={kc} scalar={scalar}"
                    );
                }
            }
        }
        SCALAR_GATHER.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// `pack_lines` (baseline codegen) and `pack_lines_avx` against the layout definition.
    #[test]
    fn line_packers_match_the_layout() {
        let (sp, rows) = (101, 40);
        let data: Vec<f32> = (0..sp * rows).map(|i| i as f32 * 0.5 - 7.0).collect();
        for (x0, w, p0, kc) in [
            (0usize, 16usize, 0usize, 8usize),
            (3, 37, 2, 19),
            (5, 90, 1, 7),
            (0, 101, 0, 39),
        ] {
            for r in [6usize, 16] {
                let panels = w.div_ceil(r);
                let mut want = vec![0.0f32; panels * r * kc];
                for q in 0..panels {
                    for p in 0..kc {
                        for x in 0..r {
                            let col = q * r + x;
                            want[q * r * kc + p * r + x] = if col < w {
                                data[(p0 + p) * sp + x0 + col]
                            } else {
                                0.0
                            };
                        }
                    }
                }
                let mut got = vec![f32::NAN; want.len()];
                match r {
                    6 => pack_lines::<6>(&data, sp, x0, w, p0, kc, &mut got),
                    _ => pack_lines::<16>(&data, sp, x0, w, p0, kc, &mut got),
                }
                assert_eq!(got, want, "baseline r={r} w={w} kc={kc}");
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx") {
                    let mut got = vec![f32::NAN; want.len()];
                    // SAFETY: AVX is present (checked just above).
                    unsafe {
                        match r {
                            6 => pack_lines_avx::<6>(&data, sp, x0, w, p0, kc, &mut got),
                            _ => pack_lines_avx::<16>(&data, sp, x0, w, p0, kc, &mut got),
                        }
                    }
                    assert_eq!(got, want, "avx r={r} w={w} kc={kc}");
                }
            }
        }
    }
}
