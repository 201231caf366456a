//! Transformed kernels packed once for core-blas: `U_ξᵀ` (K × C) of every ξ in the `MR`-tall
//! micro-panels the micro-kernel reads, so the per-block GEMMs of the transformed domain copy
//! contiguous panels instead of re-gathering U from its (α^N, C, K) layout for every block of tiles.
//!
//! Packed layout per ξ: `ceil(K / MR)` panels of `C · MR` values; panel `q`, column `p` holds
//! `U[ξ][p][q·MR + i]` for `i < MR` (zero past K). A block `(ic, mc, pc, kc)` requested by the
//! driver is then, per panel, the contiguous run `[p = pc .. pc + kc)` of that panel.

use core_blas::{AlignedVec, PackA};

use crate::ntransform::LaneTransform;
use rayon::prelude::*;

/// A value [`PackedKernels::repack`] rounds to f32.
#[cfg(test)]
pub(crate) trait ToF32 {
    /// The value rounded to the nearest f32.
    fn to_f32(self) -> f32;
}

#[cfg(test)]
impl ToF32 for f32 {
    fn to_f32(self) -> f32 {
        self
    }
}

#[cfg(test)]
impl ToF32 for f64 {
    fn to_f32(self) -> f32 {
        self as f32
    }
}

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

    /// No matrices: storage that a later packing sizes and fills.
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

    /// Sizes the panels for `count` matrices `rows × cols` in `mr`-tall panels (the layout the
    /// test-only `PackedKernels::new` packs) without filling them. Reuses the storage.
    fn reset(&mut self, count: usize, rows: usize, cols: usize, mr: usize) {
        let mr = mr.max(1);
        let per = rows.div_ceil(mr) * mr * cols;
        self.data.resize(count * per, 0.0);
        (self.mr, self.rows, self.cols, self.count) = (mr, rows, cols, count);
    }

    /// The kernel transform of the `rows × cols` kernels of `src` into `mr`-tall panels, one
    /// matrix `U_ξᵀ` per point ξ of `lt`: per panel, `L` kernels at a time (lanes: `L`
    /// consecutive values of the panel, whole columns of it or parts) are read from the weights, transformed in f64 ([`LaneTransform::apply`]) and
    /// stored rounded to f32 straight into their place in every matrix, in one pass; rows past
    /// the last are zero. The panels are split among the threads of rayon's pool; every kernel
    /// is transformed by the same operations whatever the split, so the result does not depend
    /// on the threads, and it is the batched transform's ([`TileTransforms::kernel_transform`])
    /// packed, to the bit.
    ///
    /// Three passes before (the weights' layout into the transform's order, the batched f64
    /// transform, the repacking of its f64 output) were ~57 % of ResNet-50's 512@7² forward when
    /// the kernels changed every call (perf, lead, 09:40 UTC session 23).
    ///
    /// [`TileTransforms::kernel_transform`]: crate::ntransform::TileTransforms::kernel_transform
    pub(crate) fn transform_from(
        &mut self,
        lt: &LaneTransform<'_>,
        src: KernelSource<'_>,
        (rows, cols): (usize, usize),
        mr: usize,
    ) {
        let count = lt.points();
        self.reset(count, rows, cols, mr);
        let per = self.per_matrix();
        if per == 0 {
            return;
        }
        let mr = self.mr;
        debug_assert!(src.w.len() >= rows * cols * lt.taps());
        // Every panel's slice of every matrix: [panel][ξ].
        let panels = rows.div_ceil(mr);
        let mut parts: Vec<Vec<&mut [f32]>> =
            (0..panels).map(|_| Vec::with_capacity(count)).collect();
        for m in self.data[..count * per].chunks_exact_mut(per) {
            for (q, panel) in m.chunks_exact_mut(mr * cols).enumerate() {
                parts[q].push(panel);
            }
        }
        // Lanes: whole columns of the panel (16 values) when the height divides 16, 12 when it
        // divides 12, else one value at a time.
        let job = |(q, outs): (usize, &mut Vec<&mut [f32]>)| {
            if 16 % mr == 0 {
                fill_panel::<16>(lt, src, (rows, cols), mr, q, outs);
            } else if 12 % mr == 0 {
                fill_panel::<12>(lt, src, (rows, cols), mr, q, outs);
            } else {
                fill_panel::<1>(lt, src, (rows, cols), mr, q, outs);
            }
        };
        if rayon::current_num_threads() > 1 && panels > 1 {
            parts.par_iter_mut().enumerate().for_each(job);
        } else {
            parts.iter_mut().enumerate().for_each(job);
        }
    }

    /// Values per packed matrix: `ceil(rows / MR)` panels of `cols · MR`.
    fn per_matrix(&self) -> usize {
        self.rows.div_ceil(self.mr) * self.mr * self.cols
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

/// Where the kernels of [`PackedKernels::transform_from`] are: kernel (row, col) of the
/// `rows × cols` matrices is `w[row · row_stride + col · col_stride ..][..taps]`, its taps in
/// row-major order, or reversed with `flip` (every spatial index mirrored).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KernelSource<'a> {
    /// The weights.
    pub(crate) w: &'a [f32],
    /// Distance between the kernels of consecutive rows.
    pub(crate) row_stride: usize,
    /// Distance between the kernels of consecutive columns.
    pub(crate) col_stride: usize,
    /// Taps reversed.
    pub(crate) flip: bool,
}

/// Panel values per matrix staged by [`fill_panel`] before they are copied out. 128: the stage
/// of all α^N matrices (36-63 rows of 128 values plus [`STAGE_PAD`], 21-36 KiB) stays near L1
/// and on the heap; at 512 values (74-129 KiB, r50_256's above glibc's 128 KiB mmap threshold:
/// mapped and faulted in per panel) the ResNet-50 256@14² kernel transform was ~8 % slower at
/// 2 threads (session 25).
const STAGE: usize = 128;
/// Values between the staged rows past [`STAGE`]: one 64-byte line, so the rows of the matrices
/// do not all fall into the same few L1 sets (512 values apart = 2 KiB: two of its 64 sets).
const STAGE_PAD: usize = 16;

/// Panel `q` of every matrix (`outs[ξ]`, `mr · cols` values each) of
/// [`PackedKernels::transform_from`], `L` consecutive values of the panel at a time (`L` a
/// multiple or a divisor of `mr`: whole columns, or whole parts of one).
fn fill_panel<const L: usize>(
    lt: &LaneTransform<'_>,
    src: KernelSource<'_>,
    (rows, cols): (usize, usize),
    mr: usize,
    q: usize,
    outs: &mut [&mut [f32]],
) {
    let taps = lt.taps();
    let len = mr * cols;
    let mut g = vec![[0.0f64; L]; taps];
    let mut kern32 = vec![[0.0f32; L]; taps];
    let (mut a, mut b) = lt.buffers::<L>();
    // The values of `STAGE` panel values of every matrix are staged here, then copied out
    // matrix by matrix: stored straight into the matrices, the transform wrote α^N streams at
    // once (63 for F(7,3) × F(5,3)) and half its time went into those stores.
    let span = STAGE.next_multiple_of(L);
    let pitch = span + STAGE_PAD;
    let mut stage = vec![0.0f32; outs.len() * pitch];
    for s0 in (0..len).step_by(span) {
        let s1 = (s0 + span).min(len);
        for at in (s0..s1).step_by(L) {
            // Panel value at + l is column (at + l) / mr, row q · mr + (at + l) % mr; lanes past
            // the last row are zero, past the panel's end (the last columns of L > mr) not stored.
            let valid = L.min(len - at);
            let mut any = false;
            for l in 0..L {
                let (col, i) = ((at + l) / mr, (at + l) % mr);
                let row = q * mr + i;
                if l >= valid || row >= rows {
                    for kt in kern32.iter_mut() {
                        kt[l] = 0.0;
                    }
                    continue;
                }
                any = true;
                let kern = &src.w[row * src.row_stride + col * src.col_stride..][..taps];
                if src.flip {
                    for (kt, &v) in kern32.iter_mut().zip(kern.iter().rev()) {
                        kt[l] = v;
                    }
                } else {
                    for (kt, &v) in kern32.iter_mut().zip(kern) {
                        kt[l] = v;
                    }
                }
            }
            if !any {
                for out in stage.chunks_exact_mut(pitch) {
                    out[at - s0..at - s0 + valid].fill(0.0);
                }
                continue;
            }
            for (gt, kt) in g.iter_mut().zip(&kern32) {
                *gt = std::array::from_fn(|l| f64::from(kt[l]));
            }
            let u = lt.apply(&g, &mut a, &mut b);
            let zero_from = (rows - q * mr).min(mr);
            for (out, ux) in stage.chunks_exact_mut(pitch).zip(u) {
                let v: [f32; L] = std::array::from_fn(|l| ux[l] as f32);
                if valid == L && zero_from == mr {
                    let o: &mut [f32; L] = (&mut out[at - s0..at - s0 + L])
                        .try_into()
                        .expect("L values");
                    *o = v;
                } else {
                    for (l, o) in out[at - s0..at - s0 + valid].iter_mut().enumerate() {
                        *o = if (at + l) % mr < zero_from { v[l] } else { 0.0 };
                    }
                }
            }
        }
        for (out, st) in outs.iter_mut().zip(stage.chunks_exact(pitch)) {
            out[s0..s1].copy_from_slice(&st[..s1 - s0]);
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
    use crate::ntransform::TileTransforms;
    use crate::points::forms_for;
    use core_blas::{DenseStore, MatMut, MatRef};

    /// The fused transform gives the batched transform's values packed, to the bit: for 1-D,
    /// 2-D and 3-D tiles, kernels read in order (the forward's weights) and flipped from the
    /// transposed matrices (backward-data's), panel heights with lanes of 16, 12 and 1,
    /// rows that end inside a panel, panels longer than the stage (19 × 40), on 1 and 3
    /// threads, over storage that held other (larger, NaN) matrices before.
    #[test]
    fn transform_from_matches_batched_transform() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .expect("pool");
        let bits = |k: &PackedKernels| k.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for (m, r) in [
            (vec![4], vec![3]),
            (vec![4, 2], vec![3, 3]),
            (vec![2, 3, 2], vec![2, 3, 2]),
        ] {
            let forms = m.iter().zip(&r).map(|(&m, &r)| forms_for(m, r));
            let tt =
                TileTransforms::from_forms(forms.collect::<crate::Result<_>>().expect("forms"));
            let lt = tt.lane_transform();
            let (taps, points) = (lt.taps(), lt.points());
            for (rows, cols) in [(11, 5), (37, 3), (1, 1), (19, 40)] {
                let n = rows * cols;
                let w: Vec<f32> = (0..n * taps)
                    .map(|i| ((i * 53 % 29) as f32 - 14.0) / 3.0)
                    .collect();
                for flip in [false, true] {
                    let src = if flip {
                        KernelSource {
                            w: &w,
                            row_stride: taps,
                            col_stride: rows * taps,
                            flip,
                        }
                    } else {
                        KernelSource {
                            w: &w,
                            row_stride: cols * taps,
                            col_stride: taps,
                            flip,
                        }
                    };
                    // The batched transform's input: (taps, cols, rows), kernel col · rows + row.
                    let mut g = vec![0.0f32; taps * n];
                    for (col, row, t) in (0..cols).flat_map(|c| {
                        (0..rows).flat_map(move |r| (0..taps).map(move |t| (c, r, t)))
                    }) {
                        let tap = if flip { taps - 1 - t } else { t };
                        g[t * n + col * rows + row] =
                            w[row * src.row_stride + col * src.col_stride + tap];
                    }
                    let u = tt.kernel_transform(&g, n).expect("transform");
                    for mr in [1, 3, 4, 5, 6, 8, 12, 16] {
                        let want = PackedKernels::new(&u, points, rows, cols, mr);
                        let stale =
                            || PackedKernels::new(&vec![f32::NAN; 4 * 40 * 12], 4, 40, 12, 3);
                        let ctx = format!("{r:?} {rows}x{cols} flip {flip} mr {mr}");
                        let mut got = stale();
                        got.transform_from(&lt, src, (rows, cols), mr);
                        assert_eq!(bits(&got), bits(&want), "{ctx}");
                        let mut got = stale();
                        pool.install(|| got.transform_from(&lt, src, (rows, cols), mr));
                        assert_eq!(bits(&got), bits(&want), "{ctx} 3 threads");
                    }
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
