//! Micro-kernels: the only code that knows an instruction set.
//!
//! A kernel family is a zero-sized type implementing [`Kernel`]; constructing it (`new`) returns
//! `None` when the CPU lacks its features, so holding a value proves the ISA is present. All
//! families share one `#[inline(always)]` body, [`ukr`], written against the tiny [`Simd`]
//! vocabulary (load, broadcast, FMA, store) and wrapped per ISA in a `#[target_feature]` function,
//! so the driver is monomorphized per kernel with no dynamic dispatch inside the loops.
//!
//! Micro-kernel contract (after BLIS `docs/KernelsHowTo.md`), for `m <= MR`, `n <= NR`:
//! `C[0..m, 0..n] := alpha · Ap · Bp + beta · C[0..m, 0..n]`, where `Ap` is a packed micro-panel of
//! `k` columns of `MR` values and `Bp` a packed micro-panel of `k` rows of `NR` values. `C` has
//! arbitrary strides `rs_c`, `cs_c`. When `beta == 0`, `C` is never read, so NaN or
//! uninitialised-looking garbage in the output cannot leak into the result.

pub(crate) mod convpack;
pub(crate) mod offset;
pub(crate) mod portable;
#[cfg(all(test, target_arch = "x86_64"))]
mod probe;
#[cfg(target_arch = "x86_64")]
pub(crate) mod skx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod skx_conv;
#[cfg(target_arch = "x86_64")]
pub(crate) mod skx_offset;
pub(crate) mod small;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vector;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// The SIMD vocabulary a micro-kernel body is written in. Implementations are thin wrappers around
/// intrinsics; they are only sound to call inside a function compiled with the matching target
/// features (the callers are `#[target_feature]` wrappers).
pub(crate) trait Simd: Copy {
    /// One vector register of `LANES` f32 values, laid out contiguously in memory.
    type V: Copy;
    /// Lanes per vector.
    const LANES: usize;
    /// All-zero vector.
    unsafe fn zero() -> Self::V;
    /// Every lane = `x`.
    unsafe fn splat(x: f32) -> Self::V;
    /// Unaligned load of `LANES` values.
    unsafe fn load(p: *const f32) -> Self::V;
    /// Broadcast of one value read from memory.
    unsafe fn bcast(p: *const f32) -> Self::V;
    /// `a * b + c`.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a * b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// Unaligned store of `LANES` values.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// Hint that the cache line at `p` is needed soon (no-op by default).
    #[inline(always)]
    unsafe fn prefetch(_p: *const f32) {}
    /// `a + b` (by default an FMA with 1, which is exact).
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: the caller's target features.
        unsafe { Self::fma(a, Self::splat(1.0), b) }
    }
    /// `a − b` (by default an FMA with −1, which is exact).
    #[inline(always)]
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: the caller's target features.
        unsafe { Self::fma(b, Self::splat(-1.0), a) }
    }
    /// Load of the first `n < LANES` values, the other lanes zero (by default through a buffer).
    #[inline(always)]
    unsafe fn load_n(p: *const f32, n: usize) -> Self::V {
        debug_assert!(n <= Self::LANES && Self::LANES <= 16);
        let mut buf = [0.0f32; 16];
        // SAFETY: the caller guarantees `n` readable values; `buf` holds LANES <= 16.
        unsafe {
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            Self::load(buf.as_ptr())
        }
    }
    /// The lane sums of four vectors, `[Σ v[0], Σ v[1], Σ v[2], Σ v[3]]` (by default through a
    /// buffer, lanes added in order).
    #[inline(always)]
    unsafe fn hsum4(v: [Self::V; 4]) -> [f32; 4] {
        debug_assert!(Self::LANES <= 16);
        let mut buf = [0.0f32; 16];
        let mut out = [0.0f32; 4];
        for (o, x) in out.iter_mut().zip(v) {
            // SAFETY: `buf` holds LANES <= 16 values.
            unsafe { Self::store(buf.as_mut_ptr(), x) };
            *o = buf[..Self::LANES].iter().sum();
        }
        out
    }
    /// Store of the first `n < LANES` lanes only (by default through a buffer).
    #[inline(always)]
    unsafe fn store_n(p: *mut f32, v: Self::V, n: usize) {
        debug_assert!(n <= Self::LANES && Self::LANES <= 16);
        let mut buf = [0.0f32; 16];
        // SAFETY: the caller guarantees `n` writable values; `buf` holds LANES <= 16.
        unsafe {
            Self::store(buf.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(buf.as_ptr(), p, n);
        }
    }
}

/// Rows of a row-major source to prefetch toward L2 (`prefetcht2`): `rows` rows of `width`
/// values, row `r` at `ptr + r · ld` (every cache line the row touches). Prefetches never fault,
/// so the pointer is only an address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowPrefetch {
    pub(crate) ptr: *const f32,
    pub(crate) ld: usize,
    pub(crate) rows: usize,
    pub(crate) width: usize,
}

impl RowPrefetch {
    /// Issue every prefetch now.
    #[inline]
    pub(crate) fn issue(self) {
        #[cfg(target_arch = "x86_64")]
        for r in 0..self.rows {
            let row = self.ptr.wrapping_add(r * self.ld);
            for j in (0..self.width).step_by(16).chain([self.width.max(1) - 1]) {
                // SAFETY: prefetch has no architectural effect and never faults; SSE is in the
                // x86_64 baseline.
                unsafe {
                    core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T2 }>(
                        row.wrapping_add(j).cast(),
                    )
                };
            }
        }
    }
}

/// Rows of a row-major source for a tile to copy into a packed panel while it runs
/// ([`Kernel::run_copying`]): `rows` rows of the kernel's `NR` values, row `r` read at
/// `src + r · ld` and written to `dst + r · NR`; `ahead` / `far`: how many rows ahead of the
/// row it copies the kernel prefetches the source into L1 / toward L2.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowCopy {
    pub(crate) src: *const f32,
    pub(crate) ld: usize,
    pub(crate) dst: *mut f32,
    pub(crate) rows: usize,
    pub(crate) ahead: usize,
    pub(crate) far: usize,
}

impl RowCopy {
    /// Copy every row now (`nr` values each).
    ///
    /// # Safety
    /// `rows` rows of `nr` readable values at `src + r · ld`, `rows · nr` writable values at
    /// `dst` that do not overlap them.
    #[inline]
    pub(crate) unsafe fn copy(self, nr: usize) {
        for r in 0..self.rows {
            // SAFETY: the caller's contract.
            unsafe {
                std::ptr::copy_nonoverlapping(self.src.add(r * self.ld), self.dst.add(r * nr), nr)
            };
        }
    }
}

/// A micro-kernel family: register tile `MR × NR`, a name, and one unsafe entry point.
pub(crate) trait Kernel: Copy + Send + Sync + 'static {
    /// Rows of the register tile (the broadcast side, packed A micro-panels are `MR` wide).
    const MR: usize;
    /// Columns of the register tile (the vector side, packed B micro-panels are `NR` wide).
    const NR: usize;
    /// `{family}-f32-{MR}x{NR}`.
    const NAME: &'static str;
    /// Whether [`Kernel::run_packing_b`] packs inside the k-loop (the driver then lets the first
    /// tile of each panel pack a row-major B); `false`: its default copy-then-run, which is
    /// slower than packing the block up front, so the driver keeps the block packing.
    const PACKS_B: bool = false;
    /// Full panels of a row-major B handled as one group (`>= 1`): the driver prefetches the
    /// next group's source rows over the group's tiles (every line of a row of `PACK_GROUP · NR`
    /// values: fewer source rows visited per column for a narrow `NR`), packs one A block's
    /// groups over one another, and packs the columns past the last whole group with
    /// [`crate::PackB::pack_b`]. Which tiles pack: [`Kernel::PACK_PANELS`].
    const PACK_GROUP: usize = 1;
    /// How many consecutive `NR`-wide panels [`Kernel::run_packing_b`] packs: `PACK_GROUP` (the
    /// first tile of each group packs all its panels) or 1 (the first tile of each full panel
    /// of a group packs its own panel).
    const PACK_PANELS: usize = Self::PACK_GROUP;
    /// Whether products with several A blocks and several passes run passes 4/3 deeper than
    /// the table's KC, with A blocks as much shorter (the driver's `serial`). Measured a gain
    /// on the AVX-512 family (2048³ +1-3 points on Zen 4, session 20); the AVX2 family was level
    /// to worse (2048³ 88.1/78.0, 81.4/81.8, 84.6/80.0, 75.6/76.5, 73.8/76.8, 83.6/78.9,
    /// 76.9/76.4%, quiet 02:00-02:01), so it keeps the table.
    const DEEPER_PASSES: bool = false;
    /// A normal tile's share of the fused panel prefetch (rows of a row-major B) goes to
    /// [`Kernel::run_prefetching`] from this many rows on; shorter shares are issued in one burst
    /// right before the tile. The default is the driver's `SPREAD_MIN_ROWS` (12, measured on
    /// the AVX-512 family); a family whose `run_prefetching` spreads the rows over its k-loop
    /// may lower it.
    const SPREAD_MIN_ROWS: usize = crate::driver::SPREAD_MIN_ROWS;
    /// Whether [`Kernel::run_packing_b`] and [`Kernel::run_prefetching`] act on their `stream`
    /// argument (the driver asks only such families to stream C).
    const STREAMS_C: bool = false;

    /// The kernel if the running CPU supports it.
    fn new() -> Option<Self>;

    /// `C[0..m, 0..n] := alpha · Ap · Bp + beta · C`; `C` is not read when `beta == 0`.
    ///
    /// # Safety
    /// `a` points to `k * MR` readable f32, `b` to `k * NR`; `m <= MR`, `n <= NR`; for every
    /// `i < m, j < n`, `c + i * rs_c + j * cs_c` is valid for reads and writes and not accessed by
    /// anyone else during the call.
    unsafe fn run(
        self,
        k: usize,
        alpha: f32,
        a: *const f32,
        b: *const f32,
        beta: f32,
        c: *mut f32,
        rs_c: usize,
        cs_c: usize,
        m: usize,
        n: usize,
    );

    /// [`Kernel::run`] on a full-width tile (`n == NR`) whose B micro-panel is not packed yet: row
    /// `p` of the panel is the `NR` values at `bsrc + p · ldb` (a row-major B read in place), and
    /// the kernel also writes the packed panel (`k · NR` values) to `bdst` for the tiles after it,
    /// and likewise the next `PACK_PANELS − 1` panels (panel `g`: row `p` at
    /// `bsrc + p · ldb + g · NR`, packed to `bdst + g · k · NR`), whose FMAs it does not do.
    /// The default copies the panel, then runs [`Kernel::run`] on the copy; the AVX-512 and AVX2
    /// families pack inside their k-loops, so the copy's loads and stores overlap the FMAs.
    ///
    /// With `stream` (asked only of a family with [`Kernel::STREAMS_C`]), a full tile written
    /// with `beta == 0` may go to C by non-temporal stores (its lines are not read for
    /// ownership and not left in cache); the caller fences (`sfence`) before anyone else reads
    /// C.
    ///
    /// # Safety
    /// As [`Kernel::run`] with `n == NR`, and for `b`: `k` rows of `PACK_PANELS · NR` readable
    /// values at `bsrc + p · ldb`, and `PACK_PANELS · k · NR` writable values at `bdst`
    /// overlapping neither the source, `a` nor the C window.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    unsafe fn run_packing_b(
        self,
        k: usize,
        alpha: f32,
        a: *const f32,
        bsrc: *const f32,
        ldb: usize,
        bdst: *mut f32,
        beta: f32,
        c: *mut f32,
        rs_c: usize,
        cs_c: usize,
        m: usize,
        _stream: bool,
    ) {
        // SAFETY: the caller's contract is `copy_then_run`'s.
        unsafe { copy_then_run(self, k, alpha, a, bsrc, ldb, bdst, beta, c, rs_c, cs_c, m) }
    }

    /// [`Kernel::run`] that also prefetches `pf` (rows of a row-major B source toward L2). The
    /// default issues the prefetches up front, then runs; the AVX-512 and AVX2 families spread
    /// them over their k-loops (one row every few rounds), so that a long list does not arrive
    /// as one burst of misses that stalls the tile's own loads.
    ///
    /// `stream` as in [`Kernel::run_packing_b`].
    ///
    /// # Safety
    /// As [`Kernel::run`] (prefetches never fault: `pf` may point anywhere).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    unsafe fn run_prefetching(
        self,
        k: usize,
        alpha: f32,
        a: *const f32,
        b: *const f32,
        beta: f32,
        c: *mut f32,
        rs_c: usize,
        cs_c: usize,
        m: usize,
        n: usize,
        pf: RowPrefetch,
        _stream: bool,
    ) {
        pf.issue();
        // SAFETY: the caller's contract is `run`'s.
        unsafe { self.run(k, alpha, a, b, beta, c, rs_c, cs_c, m, n) }
    }

    /// Whether [`Kernel::run_copying`] copies inside the k-loop (the driver then lets the tiles
    /// of one panel copy the next panel's source rows, when it judges that faster than the
    /// next panel's first tile packing them).
    const COPIES_AHEAD: bool = false;

    /// [`Kernel::run`] that also copies `cp` (rows of a row-major B source into a packed panel
    /// that no tile reads during this call). The default copies the rows up front, then runs;
    /// the AVX-512 family spreads the copies over its k-loop (one row every few rounds), each
    /// after prefetches of the rows `cp.ahead` (into L1) and `cp.far` (toward L2) rows further.
    ///
    /// `stream` as in [`Kernel::run_packing_b`].
    ///
    /// # Safety
    /// As [`Kernel::run`]; `cp.rows` rows of `NR` readable values at `cp.src + r · cp.ld`, and
    /// `cp.rows · NR` writable values at `cp.dst` overlapping neither those, `a`, `b` nor the C
    /// window.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    unsafe fn run_copying(
        self,
        k: usize,
        alpha: f32,
        a: *const f32,
        b: *const f32,
        beta: f32,
        c: *mut f32,
        rs_c: usize,
        cs_c: usize,
        m: usize,
        n: usize,
        cp: RowCopy,
        _stream: bool,
    ) {
        // SAFETY: the caller's contract is `copy`'s and `run`'s.
        unsafe {
            cp.copy(Self::NR);
            self.run(k, alpha, a, b, beta, c, rs_c, cs_c, m, n)
        }
    }

    /// Whether [`Kernel::run_packing_conv`] packs inside the k-loop (the driver then lets the
    /// first tile of each full panel pack a [`crate::PackB::conv_panel`] B); `false`: the
    /// driver packs such a B up front as any other.
    const PACKS_CONV: bool = false;

    /// [`Kernel::run`] on a full-width tile (`n == NR`, `NR` 48 or less, a multiple of 16)
    /// whose B micro-panel is an im2col-like source resolved by [`convpack::ConvRows`]: row `p`
    /// (`p < k`) is `rows[p % period]` read at `src + (p / period) · step` bytes, chunk `q` of
    /// it the lanes [`convpack::ConvRowForm::lane`] reads there (a [`convpack::ConvRow`]: the
    /// lanes of mask `m[q]` at the row's byte offset + 64·q; a [`convpack::ConvRow2`]: per
    /// chunk two pieces, each reading every other value; other lanes zero); the kernel also
    /// writes the packed panel (`k · NR` values) to `bdst`. The default packs the panel, then
    /// runs [`Kernel::run`].
    ///
    /// # Safety
    /// As [`Kernel::run`] with `n == NR`; `period >= 1` entries at `rows`; every lane a mask
    /// selects is readable at its piece's offset; `bdst` holds `k · NR` writable values
    /// overlapping neither the source, `a` nor the C window.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    unsafe fn run_packing_conv<R: convpack::ConvRowForm>(
        self,
        k: usize,
        alpha: f32,
        a: *const f32,
        src: *const f32,
        rows: *const R,
        period: usize,
        step: isize,
        bdst: *mut f32,
        beta: f32,
        c: *mut f32,
        rs_c: usize,
        cs_c: usize,
        m: usize,
    ) {
        // SAFETY: the caller's contract is `conv_then_run`'s.
        unsafe {
            conv_then_run(
                self, k, alpha, a, src, rows, period, step, bdst, beta, c, rs_c, cs_c, m,
            )
        }
    }

    /// [`Kernel::run`] for short products (`k` up to a few hundred, operands in L1/L2) on a packed
    /// A micro-panel, alpha = 1, C row-major (row stride `ldc`): the kernel of
    /// [`Kernel::run_rowa`] reading the panel (`lda = 1`, step `MR`).
    ///
    /// # Safety
    /// As [`Kernel::run`] with `rs_c = ldc`, `cs_c = 1`, `1 <= m`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_short(
        self,
        k: usize,
        a: *const f32,
        b: *const f32,
        beta: f32,
        c: *mut f32,
        ldc: usize,
        m: usize,
        n: usize,
    );

    /// `C[0..m, 0..n] := A · Bp + beta · C` with A row-major and read in place (row `r` at
    /// `a + r · lda`, `k` values), `Bp` a packed B micro-panel, C row-major (row stride `ldc`);
    /// `C` is not read when `beta == 0`.
    ///
    /// # Safety
    /// `1 <= m <= MR`, `n <= NR`; rows `r < m` of A hold `k` readable values; `k * NR` values
    /// behind `b`; an exclusive `m × n` window of C at `c`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_rowa(
        self,
        k: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        beta: f32,
        c: *mut f32,
        ldc: usize,
        m: usize,
        n: usize,
    );
}

/// The shared micro-kernel body: `MR` rows × `NV` vectors of `S::LANES` columns, reading A
/// micro-panels of `AS >= MR` values per step (`AS > MR`: the first `MR` rows of a wider panel,
/// the edge kernels of a family) and B micro-panels of `BS >= NV · LANES` values per step
/// (`BS` larger: the first columns of a wider panel, the narrow edge kernels).
///
/// # Safety
/// As [`Kernel::run`] with `NR = NV * S::LANES`, `k * AS` values behind `a` and `k * BS` behind
/// `b`, and the caller is compiled with `S`'s features.
#[inline(always)]
pub(crate) unsafe fn ukr<
    S: Simd,
    const MR: usize,
    const NV: usize,
    const AS: usize,
    const BS: usize,
>(
    k: usize,
    alpha: f32,
    a: *const f32,
    b: *const f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    m: usize,
    n: usize,
) {
    let nr = NV * S::LANES;
    debug_assert!(m <= MR && n <= nr && AS >= MR && BS >= nr);
    // SAFETY: the caller guarantees the target features of `S`, `k * AS` values behind `a`,
    // `k * BS` values behind `b`, and an exclusive `m × n` window of C at (rs_c, cs_c).
    unsafe {
        let mut acc = [[S::zero(); NV]; MR];
        if cs_c == 1 {
            prefetch_tile::<S>(c, rs_c, m, n);
        }
        let (mut a, mut b) = (a, b);
        steps4::<S, MR, NV, AS, BS>(&mut acc, &mut a, &mut b, k / 4);
        for _ in 0..k % 4 {
            step::<S, MR, NV>(&mut acc, a, b);
            a = a.add(AS);
            b = b.add(BS);
        }

        store_acc::<S, MR, NV>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
    }
}

/// The micro-kernel for short products on an A read in place: `A[r, t] = a[r · lda + t · TS]`
/// (a row-major A: `TS = 1`; a packed micro-panel of width `W`: `lda = 1`, `TS = W`); each
/// step broadcasts the `MR` values of column `t`. `C[0..m, 0..n] := A · Bp + beta · C` with unit
/// column stride (row stride `ldc`), alpha = 1. Instantiated with `MR = m` exactly (only the
/// rows of the tile are read). Measured 03:27 UTC on 81 × 96×32×32 batches: 93-95% of peak
/// against 82-84% for [`ukr`] on the same packed operands. `BPF`: prefetch B 16 steps ahead (as
/// [`ukr`] does), for the driver's full tiles.
///
/// # Safety
/// `m == MR`, `n <= NV · LANES <= BS`; `a + r · lda + t · TS` readable for `r < MR`, `t < k`;
/// `k · BS` values behind `b`; an exclusive `m × n` window of C at `c` (row stride `ldc`); the
/// caller is compiled with `S`'s features.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn ukr_rowa<
    S: Simd,
    const MR: usize,
    const NV: usize,
    const BS: usize,
    const TS: usize,
    const BPF: bool,
>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    beta: f32,
    c: *mut f32,
    ldc: usize,
    m: usize,
    n: usize,
) {
    debug_assert!(m == MR && n <= NV * S::LANES && BS >= NV * S::LANES);
    // SAFETY: the caller guarantees the target features, the MR rows of k values of A, k · BS
    // values of B and the exclusive C window.
    unsafe {
        let mut acc = [[S::zero(); NV]; MR];
        prefetch_tile::<S>(c, ldc, m, n);
        let rows: [*const f32; MR] = std::array::from_fn(|r| a.add(r * lda));
        let mut b = b;
        let mut t = 0;
        while t + 4 <= k {
            for u in 0..4 {
                step_rows::<S, MR, NV>(&mut acc, &rows, (t + u) * TS, b.add(u * BS));
            }
            if BPF {
                // B 16 steps ahead (the driver's panels stream from L2; never faults).
                S::prefetch(b.wrapping_add(16 * BS));
            }
            b = b.add(4 * BS);
            t += 4;
        }
        while t < k {
            step_rows::<S, MR, NV>(&mut acc, &rows, t * TS, b);
            b = b.add(BS);
            t += 1;
        }
        store_acc::<S, MR, NV>(&acc, 1.0, beta, c, ldc, 1, m, n);
    }
}

/// One rank-1 update of the register tile from A's rows read in place: `A[r, t] = rows[r][t]`.
///
/// # Safety
/// `rows[r]` holds more than `t` values for every `r`; `b` holds `NV · LANES` values.
#[inline(always)]
unsafe fn step_rows<S: Simd, const MR: usize, const NV: usize>(
    acc: &mut [[S::V; NV]; MR],
    rows: &[*const f32; MR],
    t: usize,
    b: *const f32,
) {
    // SAFETY: the caller's contract.
    unsafe {
        let mut bv = [S::zero(); NV];
        for v in 0..NV {
            bv[v] = S::load(b.add(v * S::LANES));
        }
        for r in 0..MR {
            let av = S::bcast(rows[r].add(t));
            for v in 0..NV {
                acc[r][v] = S::fma(av, bv[v], acc[r][v]);
            }
        }
    }
}

/// Write the register tile: `C[0..m, 0..n] := alpha · acc + beta · C` (C not read when
/// `beta == 0`), through whole-vector stores when the tile is full and rows are contiguous.
///
/// # Safety
/// An exclusive `m × n` window of C at `c` with strides `rs_c`, `cs_c`; `m <= MR`,
/// `n <= NV · LANES`; the caller is compiled with `S`'s features.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn store_acc<S: Simd, const MR: usize, const NV: usize>(
    acc: &[[S::V; NV]; MR],
    alpha: f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    m: usize,
    n: usize,
) {
    let nr = NV * S::LANES;
    // SAFETY: the caller's contract: every address written or read is inside the m × n window.
    unsafe {
        let va = S::splat(alpha);
        if m == MR && n == nr && cs_c == 1 {
            if beta == 0.0 && alpha == 1.0 {
                // The common case (and the only one of short-k batches, where 12 multiplies
                // would cost several percent of a tile): the accumulators as they are.
                for r in 0..MR {
                    for v in 0..NV {
                        S::store(c.add(r * rs_c + v * S::LANES), acc[r][v]);
                    }
                }
            } else if beta == 0.0 {
                for r in 0..MR {
                    for v in 0..NV {
                        S::store(c.add(r * rs_c + v * S::LANES), S::mul(acc[r][v], va));
                    }
                }
            } else if beta == 1.0 && alpha == 1.0 {
                for r in 0..MR {
                    for v in 0..NV {
                        let cp = c.add(r * rs_c + v * S::LANES);
                        S::store(cp, S::add(acc[r][v], S::load(cp)));
                    }
                }
            } else if beta == 1.0 {
                for r in 0..MR {
                    for v in 0..NV {
                        let cp = c.add(r * rs_c + v * S::LANES);
                        S::store(cp, S::fma(acc[r][v], va, S::load(cp)));
                    }
                }
            } else {
                let vb = S::splat(beta);
                for r in 0..MR {
                    for v in 0..NV {
                        let cp = c.add(r * rs_c + v * S::LANES);
                        S::store(cp, S::fma(acc[r][v], va, S::mul(S::load(cp), vb)));
                    }
                }
            }
        } else if cs_c == 1 {
            // Edge tile with contiguous rows: whole vectors where the tile is wide enough, the
            // partial vector (n not a multiple of LANES) lane by lane.
            let vb = S::splat(beta);
            for r in 0..m {
                for v in 0..NV {
                    let j0 = v * S::LANES;
                    if j0 >= n {
                        break;
                    }
                    let cp = c.add(r * rs_c + j0);
                    if j0 + S::LANES <= n {
                        let x = if beta == 0.0 {
                            S::mul(acc[r][v], va)
                        } else {
                            S::fma(acc[r][v], va, S::mul(S::load(cp), vb))
                        };
                        S::store(cp, x);
                    } else {
                        let lanes: [S::V; 1] = [acc[r][v]];
                        let t = (&raw const lanes).cast::<f32>();
                        for l in 0..n - j0 {
                            let x = alpha * *t.add(l);
                            let p = cp.add(l);
                            *p = if beta == 0.0 { x } else { x + beta * *p };
                        }
                    }
                }
            }
        } else {
            // Non-unit column stride: spill the accumulators, then store element-wise.
            let tile: [[S::V; NV]; MR] = *acc;
            let t = (&raw const tile).cast::<f32>();
            for r in 0..m {
                for j in 0..n {
                    let x = alpha * *t.add(r * nr + j);
                    let cp = c.add(r * rs_c + j * cs_c);
                    *cp = if beta == 0.0 { x } else { x + beta * *cp };
                }
            }
        }
    }
}

/// Prefetch the `m` rows of `n` values of a C tile (unit column stride).
///
/// # Safety
/// The caller is compiled with `S`'s features (prefetch itself never faults).
#[inline(always)]
pub(crate) unsafe fn prefetch_tile<S: Simd>(c: *mut f32, rs_c: usize, m: usize, n: usize) {
    for r in 0..m {
        // SAFETY: prefetch has no architectural effect; `wrapping_add` computes the addresses.
        unsafe {
            S::prefetch(c.wrapping_add(r * rs_c));
            S::prefetch(c.wrapping_add(r * rs_c + n - 1));
        }
    }
}

/// `count` rounds of 4 rank-1 updates, advancing the panel pointers.
///
/// # Safety
/// `*a` / `*b` hold `4 · count` more steps of the packed micro-panels (`AS` / `BS` values per
/// step); `S`'s features.
#[inline(always)]
unsafe fn steps4<S: Simd, const MR: usize, const NV: usize, const AS: usize, const BS: usize>(
    acc: &mut [[S::V; NV]; MR],
    a: &mut *const f32,
    b: &mut *const f32,
    count: usize,
) {
    let nr = BS;
    let (mut ap, mut bp) = (*a, *b);
    // SAFETY: the caller's contract covers the 4 · count steps read here; prefetch never faults.
    unsafe {
        for _ in 0..count {
            step::<S, MR, NV>(acc, ap, bp);
            step::<S, MR, NV>(acc, ap.add(AS), bp.add(nr));
            step::<S, MR, NV>(acc, ap.add(2 * AS), bp.add(2 * nr));
            step::<S, MR, NV>(acc, ap.add(3 * AS), bp.add(3 * nr));
            S::prefetch(bp.wrapping_add(16 * nr));
            ap = ap.add(4 * AS);
            bp = bp.add(4 * nr);
        }
    }
    *a = ap;
    *b = bp;
}

/// One rank-1 update of the register tile.
#[inline(always)]
pub(crate) unsafe fn step<S: Simd, const MR: usize, const NV: usize>(
    acc: &mut [[S::V; NV]; MR],
    a: *const f32,
    b: *const f32,
) {
    // SAFETY: `a` holds MR values and `b` holds NV * LANES values (caller's contract).
    unsafe {
        let mut bv = [S::zero(); NV];
        for v in 0..NV {
            bv[v] = S::load(b.add(v * S::LANES));
        }
        for r in 0..MR {
            let av = S::bcast(a.add(r));
            for v in 0..NV {
                acc[r][v] = S::fma(av, bv[v], acc[r][v]);
            }
        }
    }
}

/// Test support for the asm micro-kernels: runs `run(a, b, alpha, beta, c, rs_c, cs_c)` on an
/// `mr × n` tile of depth `k` (panels of `mr` and `nr` values per step, starting one value past
/// the allocation so they sit off any vector boundary) for several alpha / beta cases (beta = 0
/// over NaN) and column strides 1 and 2 of C (rows `rs_per_cs · cs` apart), and asserts each
/// value equal to the naive product (small integers: exact in any order). `label` leads each
/// failure message.
#[cfg(test)]
pub(crate) fn assert_tile_matches_naive(
    (mr, nr): (usize, usize),
    k: usize,
    n: usize,
    rs_per_cs: usize,
    label: &str,
    run: impl Fn(&[f32], &[f32], f32, f32, &mut [f32], usize, usize),
) {
    let a: Vec<f32> = (0..k * mr + 1)
        .map(|i| ((i * 7) % 19) as f32 - 9.0)
        .collect();
    let b: Vec<f32> = (0..k * nr + 1)
        .map(|i| ((i * 5) % 17) as f32 - 8.0)
        .collect();
    let (ap, bp) = (&a[1..], &b[1..]);
    for (alpha, beta) in [(1.0f32, 0.0f32), (2.0, 0.0), (1.0, 1.0), (0.5, -1.5)] {
        for cs in [1usize, 2] {
            let rs = rs_per_cs * cs;
            let c0: Vec<f32> = (0..mr * rs).map(|i| (i % 11) as f32).collect();
            let mut c = if beta == 0.0 {
                vec![f32::NAN; mr * rs]
            } else {
                c0.clone()
            };
            run(ap, bp, alpha, beta, &mut c, rs, cs);
            for i in 0..mr {
                for j in 0..n {
                    let dot: f64 = (0..k)
                        .map(|t| ap[t * mr + i] as f64 * bp[t * nr + j] as f64)
                        .sum();
                    let mut want = alpha as f64 * dot;
                    if beta != 0.0 {
                        want += beta as f64 * c0[i * rs + j * cs] as f64;
                    }
                    assert_eq!(
                        c[i * rs + j * cs] as f64,
                        want,
                        "{label}k {k} n {n} alpha {alpha} beta {beta} cs {cs} at ({i}, {j})"
                    );
                }
            }
        }
    }
}

/// [`Kernel::run_packing_conv`] done in two steps: pack the panel lane by lane
/// ([`convpack::ConvRowForm::lane`]), then [`Kernel::run`] on it. The trait's default and
/// the fallback of the partial-row tiles.
///
/// # Safety
/// As [`Kernel::run_packing_conv`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv_then_run<K: Kernel, R: convpack::ConvRowForm>(
    kern: K,
    k: usize,
    alpha: f32,
    a: *const f32,
    src: *const f32,
    rows: *const R,
    period: usize,
    step: isize,
    bdst: *mut f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    m: usize,
) {
    let nch = K::NR / convpack::CHUNK_LANES;
    // SAFETY: the caller's contract: `period` entries at `rows`, the lanes their masks select
    // readable at their pieces' offsets (`lane` reads no other), `k · NR` packed values
    // writable at `bdst`.
    unsafe {
        for p in 0..k {
            let r = *rows.add(p % period);
            let s = src
                .cast::<u8>()
                .wrapping_offset((p / period) as isize * step)
                .cast::<f32>();
            for q in 0..nch {
                let d = bdst.add(p * K::NR + q * convpack::CHUNK_LANES);
                for l in 0..convpack::CHUNK_LANES {
                    *d.add(l) = r.lane(s, q, l);
                }
            }
        }
        kern.run(k, alpha, a, bdst, beta, c, rs_c, cs_c, m, K::NR);
    }
}

/// [`Kernel::run_packing_b`] done in two steps: copy the `PACK_GROUP` panels' `k` source rows
/// (`NR` values at `bsrc + p · ldb + g · NR`) to `bdst + g · k · NR`, then [`Kernel::run`] on
/// the first. The trait's default, and the fallback of families whose packing k-loop covers
/// only some tiles.
///
/// # Safety
/// As [`Kernel::run_packing_b`].
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) unsafe fn copy_then_run<K: Kernel>(
    kern: K,
    k: usize,
    alpha: f32,
    a: *const f32,
    bsrc: *const f32,
    ldb: usize,
    bdst: *mut f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    m: usize,
) {
    // SAFETY: the caller's contract: k source rows of PACK_PANELS · NR values, PACK_PANELS ·
    // k · NR destination values that overlap nothing read here.
    unsafe {
        for g in 0..K::PACK_PANELS {
            for p in 0..k {
                std::ptr::copy_nonoverlapping(
                    bsrc.add(p * ldb + g * K::NR),
                    bdst.add((g * k + p) * K::NR),
                    K::NR,
                );
            }
        }
        kern.run(k, alpha, a, bdst, beta, c, rs_c, cs_c, m, K::NR);
    }
}
