//! Transformed kernels packed once for core-blas: `U_ξᵀ` (K × C) of every ξ in the `MR`-tall
//! micro-panels the micro-kernel reads, so the per-block GEMMs of the transformed domain copy
//! contiguous panels instead of re-gathering U from its (α^N, C, K) layout for every block of tiles.
//!
//! Packed layout per ξ: `ceil(K / MR)` panels of `C · MR` values; panel `q`, column `p` holds
//! `U[ξ][p][q·MR + i]` for `i < MR` (zero past K). A block `(ic, mc, pc, kc)` requested by the
//! driver is then, per panel, the contiguous run `[p = pc .. pc + kc)` of that panel.

use core_blas::{AlignedVec, PackA};
use rayon::prelude::*;

/// A value [`PackedKernels::repack`] rounds to f32.
pub(crate) trait ToF32 {
    /// The value rounded to the nearest f32.
    fn to_f32(self) -> f32;
}

impl ToF32 for f32 {
    fn to_f32(self) -> f32 {
        self
    }
}

impl ToF32 for f64 {
    fn to_f32(self) -> f32 {
        self as f32
    }
}

/// Panels per block of [`PackedKernels::repack_cols`]'s fixed-height copies.
const PANEL_BLOCK: usize = 8;

/// `U_ξᵀ` for all ξ, packed into `mr`-tall micro-panels over the whole inner dimension.
#[derive(Debug, Clone)]
pub(crate) struct PackedKernels {
    mr: usize,
    rows: usize,
    cols: usize,
    count: usize,
    data: AlignedVec,
}

impl PackedKernels {
    /// Packs `u` of layout (`count`, `cols`, `rows`) — `count` matrices stored column-major
    /// `rows × cols` — into `mr`-tall panels.
    #[cfg(test)]
    pub(crate) fn new(u: &[f32], count: usize, rows: usize, cols: usize, mr: usize) -> Self {
        let mut pk = PackedKernels::empty();
        pk.repack(u, count, rows, cols, mr);
        pk
    }

    /// No matrices (storage for [`PackedKernels::repack`]).
    pub(crate) fn empty() -> Self {
        PackedKernels {
            mr: 1,
            rows: 0,
            cols: 0,
            count: 0,
            data: AlignedVec::new(),
        }
    }

    /// The panels' storage in f32 values (its capacity), for accounting.
    pub(crate) fn capacity(&self) -> usize {
        self.data.capacity()
    }

    /// [`PackedKernels::new`] in place, from f32 or f64 values (rounded to f32), reusing the
    /// panels' storage.
    #[cfg(test)]
    pub(crate) fn repack<T: Copy + ToF32>(
        &mut self,
        u: &[T],
        count: usize,
        rows: usize,
        cols: usize,
        mr: usize,
    ) {
        debug_assert_eq!(u.len(), count * rows * cols);
        let mr = mr.max(1);
        let panels = rows.div_ceil(mr);
        let per = panels * mr * cols;
        self.data.resize(count * per, 0.0);
        for xi in 0..count {
            let src = &u[xi * rows * cols..][..rows * cols];
            let dst = &mut self.data[xi * per..][..per];
            for (q, panel) in dst.chunks_exact_mut(mr * cols).enumerate() {
                let r0 = q * mr;
                let w = mr.min(rows - r0);
                for (p, out) in panel.chunks_exact_mut(mr).enumerate() {
                    for (o, v) in out[..w].iter_mut().zip(&src[p * rows + r0..][..w]) {
                        *o = v.to_f32();
                    }
                    // Rows past the last matrix row: zero.
                    out[w..].fill(0.0);
                }
            }
        }
        (self.mr, self.rows, self.cols, self.count) = (mr, rows, cols, count);
    }

    /// Sizes the panels for `count` matrices `rows × cols` (see [`PackedKernels::new`]) without
    /// filling them; [`PackedKernels::repack_cols`] then fills every column. Reuses the storage.
    pub(crate) fn reset(&mut self, count: usize, rows: usize, cols: usize, mr: usize) {
        let mr = mr.max(1);
        let per = rows.div_ceil(mr) * mr * cols;
        self.data.resize(count * per, 0.0);
        (self.mr, self.rows, self.cols, self.count) = (mr, rows, cols, count);
    }

    /// Columns `p0 .. p0 + n` of every matrix from `u` of layout (`count`, `n`, `rows`) — the
    /// columns' slice of [`PackedKernels::repack`]'s source — rounded to f32; rows past the last
    /// matrix row are zeroed. After [`PackedKernels::reset`], repacking every column once gives
    /// exactly what [`PackedKernels::repack`] gives.
    pub(crate) fn repack_cols<T: Copy + ToF32>(&mut self, u: &[T], p0: usize, n: usize) {
        let (rows, count) = (self.rows, self.count);
        debug_assert!(p0 + n <= self.cols);
        debug_assert_eq!(u.len(), count * n * rows);
        let per = self.per_matrix();
        if per == 0 {
            return;
        }
        let shape = self.shape();
        for (xi, dst) in self.data[..count * per].chunks_exact_mut(per).enumerate() {
            shape.repack_matrix(dst, &u[xi * n * rows..][..n * rows], p0, n);
        }
    }

    /// [`PackedKernels::repack_cols`] of several pieces `(u, p0, n)` at once, the `count`
    /// matrices split among the threads of rayon's pool (each matrix written by one thread).
    pub(crate) fn repack_pieces<T: Copy + ToF32 + Sync>(
        &mut self,
        pieces: &[(&[T], usize, usize)],
    ) {
        let (rows, count) = (self.rows, self.count);
        for &(u, p0, n) in pieces {
            debug_assert!(p0 + n <= self.cols);
            debug_assert_eq!(u.len(), count * n * rows);
        }
        let per = self.per_matrix();
        if per == 0 {
            return;
        }
        let shape = self.shape();
        self.data[..count * per]
            .par_chunks_exact_mut(per)
            .enumerate()
            .for_each(|(xi, dst)| {
                for &(u, p0, n) in pieces {
                    shape.repack_matrix(dst, &u[xi * n * rows..][..n * rows], p0, n);
                }
            });
    }

    /// Values per packed matrix: `ceil(rows / MR)` panels of `cols · MR`.
    fn per_matrix(&self) -> usize {
        self.rows.div_ceil(self.mr) * self.mr * self.cols
    }

    /// The matrices' shape, for the per-matrix copies.
    fn shape(&self) -> Shape {
        Shape {
            mr: self.mr,
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// Panel height.
    pub(crate) fn mr(&self) -> usize {
        self.mr
    }

    /// All matrices' panels and the distance between consecutive matrices (the A operand of
    /// `core_blas::Gemm::gemm_packed_batched`).
    pub(crate) fn panels(&self) -> (&[f32], usize) {
        (
            &self.data,
            self.rows.div_ceil(self.mr) * self.mr * self.cols,
        )
    }

    /// The packed `U_ξᵀ` of one ξ as a core-blas A source.
    pub(crate) fn matrix(&self, xi: usize) -> PackedMatrix<'_> {
        debug_assert!(xi < self.count);
        let per = self.rows.div_ceil(self.mr) * self.mr * self.cols;
        PackedMatrix {
            mr: self.mr,
            rows: self.rows,
            cols: self.cols,
            data: &self.data[xi * per..][..per],
        }
    }
}

/// One packed `rows × cols` matrix (see [`PackedKernels`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PackedMatrix<'a> {
    mr: usize,
    rows: usize,
    cols: usize,
    data: &'a [f32],
}

impl PackedMatrix<'_> {
    /// Element `(i, p)`.
    #[inline]
    fn at(&self, i: usize, p: usize) -> f32 {
        self.data[((i / self.mr) * self.cols + p) * self.mr + i % self.mr]
    }
}

/// The shape of one packed matrix: panel height, rows, columns.
#[derive(Debug, Clone, Copy)]
struct Shape {
    mr: usize,
    rows: usize,
    cols: usize,
}

impl Shape {
    /// Columns `p0 .. p0 + n` of one packed matrix `dst` from `src` (the columns one after the
    /// other, `rows` values each), rounded to f32, zero past the last row.
    fn repack_matrix<T: Copy + ToF32>(self, dst: &mut [f32], src: &[T], p0: usize, n: usize) {
        let (mr, rows, cols) = (self.mr, self.rows, self.cols);
        // The panels' rows as fixed-size copies for the usual heights: the run-time-length
        // copy of 6 values per (panel, column) was a third of a weight update's time on
        // ResNet-50's 512 × 512 3×3 layer (perf, 12:50 UTC session 10).
        match mr {
            4 => self.repack_matrix_fixed::<T, 4>(dst, src, p0, n),
            6 => self.repack_matrix_fixed::<T, 6>(dst, src, p0, n),
            8 => self.repack_matrix_fixed::<T, 8>(dst, src, p0, n),
            // 12: the 12 × 32 AVX-512 tile core-blas is building (session 11).
            12 => self.repack_matrix_fixed::<T, 12>(dst, src, p0, n),
            16 => self.repack_matrix_fixed::<T, 16>(dst, src, p0, n),
            _ => {
                for (q, panel) in dst.chunks_exact_mut(mr * cols).enumerate() {
                    let r0 = q * mr;
                    let w = mr.min(rows - r0);
                    for (p, out) in panel[p0 * mr..][..n * mr].chunks_exact_mut(mr).enumerate() {
                        for (o, v) in out[..w].iter_mut().zip(&src[p * rows + r0..][..w]) {
                            *o = v.to_f32();
                        }
                        out[w..].fill(0.0);
                    }
                }
            }
        }
    }

    /// [`Shape::repack_matrix`] with the panel height `MR` known at compile time: whole panels
    /// by fixed-size copies, the last, partial one (rows not a multiple of `MR`) value by value
    /// with its zero padding.
    fn repack_matrix_fixed<T: Copy + ToF32, const MR: usize>(
        self,
        dst: &mut [f32],
        src: &[T],
        p0: usize,
        n: usize,
    ) {
        let (rows, cols) = (self.rows, self.cols);
        let full = rows / MR;
        // Whole panels, `PANEL_BLOCK` at a time, column by column: each column's source rows
        // are read as one short run and the block's panels written side by side (panel by
        // panel, the source columns lie `rows` values apart, in one L1 set for 512 rows).
        for qb in (0..full).step_by(PANEL_BLOCK) {
            let qe = (qb + PANEL_BLOCK).min(full);
            for (p, col) in src.chunks_exact(rows).enumerate() {
                for q in qb..qe {
                    let at = q * MR * cols + (p0 + p) * MR;
                    let out: &mut [f32; MR] =
                        (&mut dst[at..at + MR]).try_into().expect("MR values");
                    let v: &[T; MR] = col[q * MR..q * MR + MR].try_into().expect("MR values");
                    for i in 0..MR {
                        out[i] = v[i].to_f32();
                    }
                }
            }
        }
        // The last, partial panel: value by value, zero past the last row.
        if full * MR < rows {
            let (r0, w) = (full * MR, rows - full * MR);
            let panel = &mut dst[full * MR * cols..][..MR * cols];
            let outs = panel[p0 * MR..][..n * MR].chunks_exact_mut(MR);
            for (out, col) in outs.zip(src.chunks_exact(rows)) {
                for (o, v) in out[..w].iter_mut().zip(&col[r0..]) {
                    *o = v.to_f32();
                }
                out[w..].fill(0.0);
            }
        }
    }
}

impl PackA for PackedMatrix<'_> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    /// Our panels read in place when the driver's panel height is ours and its block starts on a
    /// panel (always, with core-blas's kernels): no copy of U per block.
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

    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        let panels = mc.div_ceil(mr);
        if mr == self.mr && ic.is_multiple_of(mr) {
            // The driver's panels are ours: one contiguous copy per panel (rows past the
            // matrix are already zero in the packed data).
            for q in 0..panels {
                let src = &self.data[((ic / mr + q) * self.cols + pc) * mr..][..kc * mr];
                dst[q * kc * mr..][..kc * mr].copy_from_slice(src);
            }
            return;
        }
        // Any other panel geometry: element by element (correct, not fast; not used by the
        // kernels of core-blas, whose blocks start at multiples of MR).
        for q in 0..panels {
            for p in 0..kc {
                for i in 0..mr {
                    let row = ic + q * mr + i;
                    dst[q * kc * mr + p * mr + i] = if row < ic + mc {
                        self.at(row, pc + p)
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
    use core_blas::{DenseStore, MatMut, MatRef};

    /// Repacking column ranges of any sizes after `reset`, one by one or several at once on a
    /// pool, gives exactly `repack`'s panels, also over storage that held other (larger, NaN)
    /// matrices before.
    #[test]
    fn repack_cols_matches_repack() {
        // 11 rows: partial panels only for MR 12 and 16; 37: whole panels of every height.
        for (mr, rows) in [1, 3, 4, 6, 8, 12, 16]
            .into_iter()
            .flat_map(|mr| [(mr, 11), (mr, 37)])
        {
            repack_cols_case(mr, rows);
        }
    }

    /// Matrices with no rows or no columns: nothing to write, no panic (one piece or several).
    #[test]
    fn repack_of_empty_matrices() {
        for (rows, cols) in [(0, 5), (4, 0)] {
            let mut pk = PackedKernels::empty();
            pk.reset(3, rows, cols, 8);
            let empty: [f64; 0] = [];
            pk.repack_cols(&empty, 0, 0);
            pk.repack_pieces(&[(&empty[..], 0, 0), (&empty[..], 0, 0)]);
            assert!(pk.data.is_empty());
        }
    }

    fn repack_cols_case(mr: usize, rows: usize) {
        let (count, cols) = (3, 9);
        let u: Vec<f64> = (0..count * rows * cols)
            .map(|i| ((i * 53 % 29) as f64 - 14.0) / 3.0)
            .collect();
        {
            let mut want = PackedKernels::empty();
            want.repack(&u, count, rows, cols, mr);
            let bits = |k: &PackedKernels| k.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            // On 3 threads: `repack_pieces` splits the matrices among them.
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(3)
                .build()
                .expect("pool");
            for widths in [vec![9], vec![1; 9], vec![2, 3, 4], vec![4, 5]] {
                // The columns' slices of u: (count, n, rows) each.
                let mut p0 = 0;
                let mut chunks = Vec::new();
                for n in widths {
                    let chunk: Vec<f64> = (0..count)
                        .flat_map(|xi| u[(xi * cols + p0) * rows..][..n * rows].to_vec())
                        .collect();
                    chunks.push((chunk, p0, n));
                    p0 += n;
                }
                assert_eq!(p0, cols);
                let stale = || PackedKernels::new(&vec![f32::NAN; 4 * 20 * 12], 4, 20, 12, 3);
                let mut got = stale();
                got.reset(count, rows, cols, mr);
                for (chunk, p0, n) in &chunks {
                    got.repack_cols(chunk, *p0, *n);
                }
                assert_eq!(bits(&got), bits(&want), "mr {mr} rows {rows}");
                // All pieces at once, and in two rounds.
                let pieces: Vec<(&[f64], usize, usize)> = chunks
                    .iter()
                    .map(|(c, p0, n)| (c.as_slice(), *p0, *n))
                    .collect();
                for round in [pieces.len(), pieces.len().div_ceil(2)] {
                    let mut got = stale();
                    got.reset(count, rows, cols, mr);
                    pool.install(|| {
                        for part in pieces.chunks(round) {
                            got.repack_pieces(part);
                        }
                    });
                    assert_eq!(bits(&got), bits(&want), "mr {mr} rows {rows} pieces");
                }
            }
        }
    }

    /// The packed source gives the same product as the dense column-major view, for panel
    /// heights that match the kernel's and that do not (the fallback path), with ragged edges.
    #[test]
    fn packed_product_matches_dense() {
        let (count, rows, cols, n) = (2, 13, 7, 5);
        let u: Vec<f32> = (0..count * rows * cols)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let b: Vec<f32> = (0..cols * n).map(|i| (i % 5) as f32 - 2.0).collect();
        let bm = MatRef::row_major("b", &b, cols, n, n).expect("b");
        let (mr, _) = core_blas::Gemm::global().expect("gemm").tile();
        for pack_mr in [mr, 4] {
            let pk = PackedKernels::new(&u, count, rows, cols, pack_mr);
            for xi in 0..count {
                let mut want = vec![0.0f32; rows * n];
                let a = MatRef::new("a", &u[xi * rows * cols..], rows, cols, 1, rows).expect("a");
                core_blas::gemm(
                    1.0,
                    a,
                    bm,
                    0.0,
                    MatMut::row_major("c", &mut want, rows, n, n).expect("c"),
                )
                .expect("gemm");
                let mut got = vec![f32::NAN; rows * n];
                let mut st = DenseStore::new(
                    MatMut::row_major("c", &mut got, rows, n, n).expect("c"),
                    1.0,
                    0.0,
                );
                core_blas::gemm_with(&pk.matrix(xi), &bm, &mut st).expect("gemm_with");
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
                }
            }
        }
    }
}
