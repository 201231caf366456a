//! x86_64 families: AVX2+FMA on 256-bit registers and AVX-512F on 512-bit registers.
//!
//! On Zen 4 both reach the same FMA peak (two 256-bit FMA pipes; AVX-512 is double-pumped), so the
//! AVX-512 family wins only through its 32 registers (a larger register tile, fewer loads per FMA).
//! On the Xeon of session 11 (Cascade Lake, two 512-bit FMA units) the AVX-512 peak is 1.8-1.9×
//! the AVX2 one (`examples/peak.rs`, 14:30 UTC: 131-141 vs 73-77 GFLOP/s on one core).

use core::arch::x86_64::*;

use super::small::{Plan, small_a_body};
use super::{Kernel, Simd, ukr, ukr_rowa};

/// 256-bit vectors (AVX + FMA).
#[derive(Clone, Copy)]
pub(crate) struct V256;

impl Simd for V256 {
    type V = __m256;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        // SAFETY: only called from functions compiled with `avx`.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        // SAFETY: as above.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: `avx` present; the caller guarantees 8 readable values.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn bcast(p: *const f32) -> Self::V {
        // SAFETY: `avx` present; the caller guarantees one readable value.
        unsafe { _mm256_broadcast_ss(&*p) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: only called from functions compiled with `fma`.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: `avx` present.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: `avx` present; the caller guarantees 8 writable values.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        // SAFETY: prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: `avx` present.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: `avx` present.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load_n(p: *const f32, n: usize) -> Self::V {
        // SAFETY: `avx` present; masked-off lanes are not accessed (no fault), the caller
        // guarantees the first `n` values are readable.
        unsafe { _mm256_maskload_ps(p, lane_mask(n)) }
    }
    #[inline(always)]
    unsafe fn hsum4(v: [Self::V; 4]) -> [f32; 4] {
        // SAFETY: `avx` present. Two rounds of horizontal adds leave, per 128-bit half, the
        // four half-sums in order; adding the halves gives the four totals.
        unsafe {
            let h01 = _mm256_hadd_ps(v[0], v[1]);
            let h23 = _mm256_hadd_ps(v[2], v[3]);
            let h = _mm256_hadd_ps(h01, h23);
            let s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            let mut out = [0.0f32; 4];
            _mm_storeu_ps(out.as_mut_ptr(), s);
            out
        }
    }
    // store_n: the trait's buffered default (a vector store to the stack and a copy of n
    // values); vmaskmovps stores are slow on Zen 4 (SmallA, 8 × 8, n = 37: 134 vs 146 ns/call).
}

/// The mask selecting the first `n` (<= 8) of 8 lanes.
#[inline(always)]
unsafe fn lane_mask(n: usize) -> __m256i {
    // SAFETY: only called from functions compiled with `avx`.
    unsafe {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx)
    }
}

/// 512-bit vectors (AVX-512F).
#[derive(Clone, Copy)]
pub(crate) struct V512;

impl Simd for V512 {
    type V = __m512;
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        // SAFETY: only called from functions compiled with `avx512f`.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        // SAFETY: as above.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: `avx512f` present; the caller guarantees 16 readable values.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn bcast(p: *const f32) -> Self::V {
        // SAFETY: `avx512f` present; the caller guarantees one readable value.
        unsafe { _mm512_set1_ps(*p) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // SAFETY: `avx512f` present.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: `avx512f` present.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: `avx512f` present; the caller guarantees 16 writable values.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn prefetch(p: *const f32) {
        // SAFETY: prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: `avx512f` present.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V {
        // SAFETY: `avx512f` present.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load_n(p: *const f32, n: usize) -> Self::V {
        // SAFETY: `avx512f` present; masked-off lanes are not accessed (fault suppression), the
        // caller guarantees the first `n` (<= 16) values are readable.
        unsafe { _mm512_maskz_loadu_ps(mask16(n), p) }
    }
    #[inline(always)]
    unsafe fn store_n(p: *mut f32, v: Self::V, n: usize) {
        // SAFETY: `avx512f` present; masked-off lanes are not written (fault suppression), the
        // caller guarantees the first `n` (<= 16) values are writable.
        unsafe { _mm512_mask_storeu_ps(p, mask16(n), v) }
    }
}

/// The AVX-512 mask of the first `n` (<= 16) of 16 lanes.
#[inline(always)]
fn mask16(n: usize) -> __mmask16 {
    debug_assert!(n <= 16);
    ((1u32 << n) - 1) as __mmask16
}

/// AVX2 register tile: rows × vectors of 8.
const AVX2_MR: usize = 6;
const AVX2_NV: usize = 2;

/// Panels of `avx2-f32-6x16` in a group ([`Kernel::PACK_GROUP`]): 3, the 48 columns (3 cache
/// lines per source row) of the AVX-512 family's panels, so the source rows are prefetched
/// (TLB, bursts) a third as often as with one 16-wide panel. Until session 37 the group's first
/// tile also packed all 3 panels ([`AVX2_PACK_PANELS`]). gemm_ratio 1
/// thread `CORE_BLAS_ISA=avx2`, quiet 00:59:47 UTC (session 20), B packed up front / one panel
/// / 2 / 3 per first tile: 64×50176×576 77.5, 77.3, 77.5 / 76.8, 76.4, 76.8 / 78.8, 78.9, 78.4 /
/// 79.2, 80.6, 80.4% of the peak; 256×3136×2304 83.8, 85.3, 85.6 / 86.8, 86.7, 86.5 / 88.1, 88.9,
/// 89.1 / 88.8, 88.6, 88.0%.
const AVX2_PACK_GROUP: usize = 3;

/// Panels of a group that `avx2-f32-6x16`'s first tiles pack ([`Kernel::PACK_PANELS`]): 1,
/// each full panel's first tile packs its own (2 loads and 2 stores a step), while the group
/// keeps prefetching the next 48 columns' rows. The 3-panel packing tile moves 6 lines a step
/// into L1 (3 source lines, 3 packed lines written), ~2 cycles each from L2 on Zen 4, against
/// the 6 cycles of its FMAs: alone (`pk_probe2`, branch s37-blas-4x24, quiet 04:52:22 UTC) 1 /
/// 2 / 3 panels a packing tile 1.00-1.09 / 1.40-1.52 / 2.06-2.20 × a normal tile.
/// `CORE_BLAS_ISA=avx2` in process (`probe_ab`, quiet 05:09 and 05:10 UTC), 64×50176×576 3 /
/// 1 panels: `Vec` 84.8/85.6, 84.0/84.8, 85.0/85.5, 84.6/84.1, 85.0/85.8%, 2 MiB pages
/// 86.2/87.2, 86.5/86.6, 86.9/86.7, 86.9/87.6, 87.3/88.1%; 256×3136×2304 89.7/90.2,
/// 92.1/92.5%; 2048³ 93.4/93.1%. Across binaries (`gemm_ratio`, 3 / 1, quiet 05:30:13 UTC):
/// 64×50176×576 `Vec` 84.7/85.9, 83.8/85.3, 84.5/86.4, 84.4/84.9%, 2 MiB pages 72.3/85.4,
/// 86.8/88.9, 87.0/87.9, 86.7/87.4%; 256×3136×2304 `Vec` 89.7/89.8, 88.8/89.6, 87.9/90.0,
/// 88.9/89.3%, 2 MiB pages 92.5/92.5, 89.3/89.8%; 2048³ 93.2/91.4, 88.5/91.2%.
const AVX2_PACK_PANELS: usize = 1;

/// A normal `avx2-f32-6x16` tile hands its share of the fused panel prefetch to
/// [`avx2_ukr_asm_pf`] from one row on ([`Kernel::SPREAD_MIN_ROWS`]; 8-9 rows a tile on
/// 64×50176×576, 26 before the next block), which spreads it over its k-loop instead of a burst
/// before the tile. On the Zen 4 guest of sessions 18-37 this lost 3-5 points on `Vec` operands
/// (session 32: a prefetch that missed the TLB inside the k-loop stalled it); on session 38's
/// Zen 5 (family 26 model 2), `CORE_BLAS_ISA=avx2 gemm_ratio M N K 1 11`, bursts / spread,
/// alternating in both orders, quiet 09:04:43 UTC: 64×50176×576 `Vec` 87.5/90.5, 88.4/91.0,
/// 88.4/91.6, 88.5/88.2%, 2 MiB pages 88.8/89.9, 89.0/91.8, 88.7/90.5, 88.7/91.4%;
/// 256×3136×2304 (09:06:59) `Vec` 95.8/95.7, 95.2/95.9%, 2 MiB pages 96.0/96.9, 96.2/96.4%;
/// 2048³ 95.4/95.4, 95.8/95.9%.
const AVX2_SPREAD_MIN_ROWS: usize = 1;

/// `avx2-f32-6x16`: 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2(());

#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_ukr(
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
    // SAFETY: compiled with avx2+fma; the memory contract is the caller's.
    unsafe { ukr::<V256, AVX2_MR, AVX2_NV, AVX2_MR, 16>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n) }
}

/// The edge kernels of `avx2-f32-6x16`: the first `R < 6` rows of a 6-row A micro-panel, so an
/// edge tile of `m <= R` rows does only the FMAs of its rows (with `R = 4`, 8 accumulators still
/// cover the FMA latency; `m = 16` runs tiles of 6 + 6 + 4 rows instead of 3 × 6).
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_edge<const R: usize>(
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
    // SAFETY: compiled with avx2+fma; `m <= R` and the memory contract are the caller's.
    unsafe { ukr::<V256, R, AVX2_NV, AVX2_MR, 16>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n) }
}

/// The narrow edge kernels of `avx2-f32-6x16`: the first `R <= 6` rows and the first 8 columns
/// of the 6 × 16 panels, for tiles of at most 8 columns (a partial last B panel: half the FMAs
/// of the full-width kernel, which computes all 16 columns).
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_narrow<const R: usize>(
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
    // SAFETY: compiled with avx2+fma; `m <= R`, `n <= 8` and the memory contract are the caller's.
    unsafe { ukr::<V256, R, 1, AVX2_MR, 16>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n) }
}

/// The in-place-A kernels of `avx2-f32-6x16` ([`ukr_rowa`]): `R` rows (the tile's `m`), 16
/// columns, or 8 with `NV = 1` (tiles of at most 8 columns); `TS = 1` row-major A, `TS = 6` a
/// packed micro-panel.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_rowa<const R: usize, const NV: usize, const TS: usize, const BPF: bool>(
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
    // SAFETY: compiled with avx2+fma; `m == R`, `n <= NV * 8` and memory are the caller's.
    unsafe { ukr_rowa::<V256, R, NV, 16, TS, BPF>(k, a, lda, b, beta, c, ldc, m, n) }
}

/// Row `r` of step `u` of the `avx2-f32-6x16` asm k-loop: broadcast into ymm`x`, two FMAs into
/// accumulators ymm`c0`, ymm`c1` with the B row in ymm0, ymm1 (1 load, 3 fused µops).
macro_rules! hsw_row {
    ($u:literal, $r:literal, $c0:literal, $c1:literal, $x:literal) => {
        concat!(
            "vbroadcastss ymm",
            $x,
            ", dword ptr [{a} + ",
            $u,
            "*24 + ",
            $r,
            "*4]\n",
            "vfmadd231ps ymm",
            $c0,
            ", ymm0, ymm",
            $x,
            "\n",
            "vfmadd231ps ymm",
            $c1,
            ", ymm1, ymm",
            $x,
            "\n",
        )
    };
}

/// Step `u` of a round: the B row (2 loads) into ymm0, ymm1, then the 6 rows of A
/// ([`hsw_row`], broadcasts alternating between ymm2 and ymm3) into ymm4-ymm15.
macro_rules! hsw_step {
    ($u:literal) => {
        concat!(
            "vmovups ymm0, ymmword ptr [{b} + ",
            $u,
            "*64]\n",
            "vmovups ymm1, ymmword ptr [{b} + ",
            $u,
            "*64 + 32]\n",
            hsw_row!($u, 0, 4, 5, 2),
            hsw_row!($u, 1, 6, 7, 3),
            hsw_row!($u, 2, 8, 9, 2),
            hsw_row!($u, 3, 10, 11, 3),
            hsw_row!($u, 4, 12, 13, 2),
            hsw_row!($u, 5, 14, 15, 3),
        )
    };
}

/// The full `6 × 16` tile of `avx2-f32-6x16` with its k-loop in assembly: per round of 4 steps
/// 8 B loads, 24 broadcasts, 48 FMAs, one `prefetcht0` of B 16 steps ahead and 3 loop µops
/// (84 fused µops per 48 FMAs; the compiled body of [`ukr_rowa`] spends 89: two register copies
/// and five loop µops, its 12 accumulators, 2 B vectors and the broadcast leave one of the 16 ymm
/// registers free). The `k % 4` last steps and the store are the intrinsics of [`super::step`] /
/// [`super::store_acc`]; C is prefetched at the start, as [`ukr_rowa`] does.
///
/// # Safety
/// As [`Kernel::run`] with `m = 6`, `n <= 16`; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_ukr_asm(
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
    debug_assert!(m == AVX2_MR && n <= 16);
    // SAFETY: avx2+fma per the caller. The asm reads 4 · rounds <= k steps of the panels (6 and
    // 16 values per step, unaligned loads), writes only the registers it declares, touches no
    // stack; prefetches never fault; the C window is the caller's.
    unsafe {
        super::prefetch_tile::<V256>(c, rs_c, m, n);
        let mut c12 = [_mm256_setzero_ps(); 12];
        let (mut ap, mut bp) = (a, b);
        let rounds = k / 4;
        if rounds > 0 {
            core::arch::asm!(
                ".p2align 5",
                "2:",
                hsw_step!(0),
                hsw_step!(1),
                hsw_step!(2),
                hsw_step!(3),
                "prefetcht0 byte ptr [{b} + 1024]",
                "add {a}, 96",
                "add {b}, 256",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) rounds => _,
                a = inout(reg) ap,
                b = inout(reg) bp,
                inout("ymm4") c12[0],
                inout("ymm5") c12[1],
                inout("ymm6") c12[2],
                inout("ymm7") c12[3],
                inout("ymm8") c12[4],
                inout("ymm9") c12[5],
                inout("ymm10") c12[6],
                inout("ymm11") c12[7],
                inout("ymm12") c12[8],
                inout("ymm13") c12[9],
                inout("ymm14") c12[10],
                inout("ymm15") c12[11],
                out("ymm0") _,
                out("ymm1") _,
                out("ymm2") _,
                out("ymm3") _,
                options(nostack, readonly),
            );
        }
        // Row r of the tile is accumulators 2r, 2r + 1: the layout of `[[__m256; 2]; 6]`.
        let mut acc: [[__m256; 2]; 6] = core::mem::transmute(c12);
        for _ in 0..k % 4 {
            super::step::<V256, 6, 2>(&mut acc, ap, bp);
            ap = ap.add(6);
            bp = bp.add(16);
        }
        super::store_acc::<V256, 6, 2>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
    }
}

/// [`avx2_ukr_asm`] that also prefetches `pf` ([`Kernel::run_prefetching`]): one source row
/// (`prefetcht2` of its lines `0, 64, 128` bytes and its last byte, as [`super::RowPrefetch::issue`])
/// at the head of rounds 1, 1 + per, … of the k-loop (`per = ceil(rounds / rows)`), the rows
/// left over (`rows > rounds`) after it; no k-loop rounds or no rows: the burst, then
/// [`avx2_ukr_asm`].
///
/// # Safety
/// As [`avx2_ukr_asm`]; `1 <= pf.width <= 48` (a row is at most 4 cache lines).
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_ukr_asm_pf(
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
    pf: super::RowPrefetch,
) {
    debug_assert!(m == AVX2_MR && n <= 16 && (1..=48).contains(&pf.width));
    let rounds = k / 4;
    if rounds == 0 || pf.rows == 0 {
        pf.issue();
        // SAFETY: the caller's contract is `avx2_ukr_asm`'s.
        unsafe { avx2_ukr_asm(k, alpha, a, b, beta, c, rs_c, cs_c, m, n) };
        return;
    }
    // SAFETY: avx2+fma per the caller. The asm reads 4 · rounds <= k steps of the panels (6 and
    // 16 values per step, unaligned loads), writes only the registers it declares, touches no
    // stack; prefetches never fault (any address); the C window is the caller's.
    unsafe {
        super::prefetch_tile::<V256>(c, rs_c, m, n);
        let mut c12 = [_mm256_setzero_ps(); 12];
        let (mut ap, mut bp) = (a, b);
        let per = rounds.div_ceil(pf.rows);
        // Rounds 1, 1 + per, … <= rounds prefetch one row each.
        let done = rounds.div_ceil(per);
        // Byte offsets: the row stride, the row's last byte (wrapping: only an address).
        let (l, e) = (pf.ld.wrapping_mul(4), pf.width * 4 - 1);
        core::arch::asm!(
            "mov {q}, 1",
            ".p2align 5",
            "2:",
            "dec {q}",
            "jnz 3f",
            "prefetcht2 byte ptr [{p}]",
            "prefetcht2 byte ptr [{p} + 64]",
            "prefetcht2 byte ptr [{p} + 128]",
            "prefetcht2 byte ptr [{p} + {e}]",
            "add {p}, {l}",
            "mov {q}, {per}",
            "3:",
            hsw_step!(0),
            hsw_step!(1),
            hsw_step!(2),
            hsw_step!(3),
            "prefetcht0 byte ptr [{b} + 1024]",
            "add {a}, 96",
            "add {b}, 256",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) rounds => _,
            a = inout(reg) ap,
            b = inout(reg) bp,
            p = inout(reg) pf.ptr => _,
            q = out(reg) _,
            l = in(reg) l,
            e = in(reg) e,
            per = in(reg) per,
            inout("ymm4") c12[0],
            inout("ymm5") c12[1],
            inout("ymm6") c12[2],
            inout("ymm7") c12[3],
            inout("ymm8") c12[4],
            inout("ymm9") c12[5],
            inout("ymm10") c12[6],
            inout("ymm11") c12[7],
            inout("ymm12") c12[8],
            inout("ymm13") c12[9],
            inout("ymm14") c12[10],
            inout("ymm15") c12[11],
            out("ymm0") _,
            out("ymm1") _,
            out("ymm2") _,
            out("ymm3") _,
            options(nostack, readonly),
        );
        if pf.rows > done {
            super::RowPrefetch {
                ptr: pf.ptr.wrapping_add(done * pf.ld),
                rows: pf.rows - done,
                ..pf
            }
            .issue();
        }
        let mut acc: [[__m256; 2]; 6] = core::mem::transmute(c12);
        for _ in 0..k % 4 {
            super::step::<V256, 6, 2>(&mut acc, ap, bp);
            ap = ap.add(6);
            bp = bp.add(16);
        }
        super::store_acc::<V256, 6, 2>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
    }
}

/// Step `u` of a packing round ([`avx2_ukr_asm_pk`]): the B row read from source row `u` of the
/// round (`$src`: `{s}`, `{s} + {l}`, `{s} + {l}*2`, `{s} + {l3}`, `{l}` the source's row stride
/// in bytes) into ymm0, ymm1 and stored to the packed panel at `{b} + u · 64`, then the 6 rows
/// of A as in [`hsw_step`].
macro_rules! hsw_step_pk {
    ($u:literal, $src:literal) => {
        concat!(
            "vmovups ymm0, ymmword ptr [",
            $src,
            "]\n",
            "vmovups ymm1, ymmword ptr [",
            $src,
            " + 32]\n",
            "vmovups ymmword ptr [{b} + ",
            $u,
            "*64], ymm0\n",
            "vmovups ymmword ptr [{b} + ",
            $u,
            "*64 + 32], ymm1\n",
            hsw_row!($u, 0, 4, 5, 2),
            hsw_row!($u, 1, 6, 7, 3),
            hsw_row!($u, 2, 8, 9, 2),
            hsw_row!($u, 3, 10, 11, 3),
            hsw_row!($u, 4, 12, 13, 2),
            hsw_row!($u, 5, 14, 15, 3),
        )
    };
}

/// The copy of row `u` of a round to a further panel of a packing group: the 16 values at
/// `$src + $off` bytes through ymm2, ymm3 (the broadcast registers, free until the step's rows)
/// to `{b} + $dst + u · 64` (`$dst`: `{p}` or `{p}*2`, the packed panels' stride in bytes).
macro_rules! hsw_copy {
    ($u:literal, $src:literal, $off:literal, $dst:literal) => {
        concat!(
            "vmovups ymm2, ymmword ptr [",
            $src,
            " + ",
            $off,
            "]\n",
            "vmovups ymm3, ymmword ptr [",
            $src,
            " + ",
            $off,
            " + 32]\n",
            "vmovups ymmword ptr [{b} + ",
            $dst,
            " + ",
            $u,
            "*64], ymm2\n",
            "vmovups ymmword ptr [{b} + ",
            $dst,
            " + ",
            $u,
            "*64 + 32], ymm3\n",
        )
    };
}

/// The packing k-loop of [`avx2_ukr_asm_pk`] for groups of `$g` panels (1, 2 or 3).
macro_rules! hsw_kloop_pk {
    ($g:tt, $n:expr, $a:expr, $b:expr, $s:expr, $l:expr, $p:expr, $c:expr) => {
        core::arch::asm!(
            ".p2align 5",
            "2:",
            hsw_copies!($g, 0, "{s}"),
            hsw_step_pk!(0, "{s}"),
            hsw_copies!($g, 1, "{s} + {l}"),
            hsw_step_pk!(1, "{s} + {l}"),
            hsw_copies!($g, 2, "{s} + {l}*2"),
            hsw_step_pk!(2, "{s} + {l}*2"),
            hsw_copies!($g, 3, "{s} + {l3}"),
            hsw_step_pk!(3, "{s} + {l3}"),
            "lea {s}, [{s} + {l}*4]",
            "add {a}, 96",
            "add {b}, 256",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) $n => _,
            a = inout(reg) $a,
            b = inout(reg) $b,
            s = inout(reg) $s,
            l = in(reg) $l,
            l3 = in(reg) 3 * $l,
            p = in(reg) $p,
            inout("ymm4") $c[0],
            inout("ymm5") $c[1],
            inout("ymm6") $c[2],
            inout("ymm7") $c[3],
            inout("ymm8") $c[4],
            inout("ymm9") $c[5],
            inout("ymm10") $c[6],
            inout("ymm11") $c[7],
            inout("ymm12") $c[8],
            inout("ymm13") $c[9],
            inout("ymm14") $c[10],
            inout("ymm15") $c[11],
            out("ymm0") _,
            out("ymm1") _,
            out("ymm2") _,
            out("ymm3") _,
            options(nostack),
        )
    };
}

/// The copies of step `u` to the group's panels after the first.
macro_rules! hsw_copies {
    (1, $u:literal, $src:literal) => {
        // No copies (a comment naming the stride keeps the operand used).
        "# {p}\n"
    };
    (2, $u:literal, $src:literal) => {
        hsw_copy!($u, $src, "64", "{p}")
    };
    (3, $u:literal, $src:literal) => {
        concat!(
            hsw_copy!($u, $src, "64", "{p}"),
            hsw_copy!($u, $src, "128", "{p}*2")
        )
    };
}

/// [`avx2_ukr_asm`] on a full `6 × 16` tile whose B micro-panel is read from a row-major source
/// and packed as it goes ([`Kernel::run_packing_b`]), with the next `G − 1` panels of its
/// group: row `p` of panel `g < G` is the 16 values at `bsrc + p · ldb + 16 · g`, written to
/// `bdst + (g · k + p) · 16`; the FMAs use panel 0. The layout of `skx::avx512_ukr_asm_pk` on
/// 256-bit registers: 2 · G loads and stores more per step (the copies of the further panels go
/// through the broadcast registers ymm2, ymm3 before the step's rows need them), no B prefetch
/// (the driver prefetches the next group's source rows).
///
/// # Safety
/// As [`avx2_ukr_asm`] with `m = 6`, `n <= 16`, `1 <= G <= 3`, but `b` replaced by: `k` rows of
/// `16 · G` readable values at `bsrc + p · ldb` and `G · k · 16` writable values at `bdst` that
/// overlap neither the source, A nor C; the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_ukr_asm_pk<const G: usize>(
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
    n: usize,
) {
    const {
        assert!(
            1 <= G && G <= 3,
            "hsw_kloop_pk has forms for groups of 1, 2 and 3 panels"
        )
    };
    debug_assert!(m == AVX2_MR && n <= 16);
    // SAFETY: avx2+fma per the caller. The asm reads 4 · rounds <= k steps of A (6 values) and
    // of the source (16 · G values, one row per step), writes the same steps of the G packed
    // panels (16 values each, the caller's exclusive buffer), only the registers it declares,
    // and touches no stack; the C window is the caller's.
    unsafe {
        super::prefetch_tile::<V256>(c, rs_c, m, n);
        let mut c12 = [_mm256_setzero_ps(); 12];
        let (mut ap, mut bp, mut sp) = (a, bdst, bsrc);
        // The asm steps the source by 4 rows a round (only when rounds > 0, when 4 · ldb is
        // within the caller's rows); wrapping, as a stride with k < 4 may be any value.
        let lb = ldb.wrapping_mul(4);
        let rounds = k / 4;
        // The byte stride of the packed panels (the group's panel g at bdst + g · k · 16).
        let pb = (k * 64) as isize;
        if rounds > 0 {
            match G {
                3 => hsw_kloop_pk!(3, rounds, ap, bp, sp, lb, pb, c12),
                2 => hsw_kloop_pk!(2, rounds, ap, bp, sp, lb, pb, c12),
                _ => hsw_kloop_pk!(1, rounds, ap, bp, sp, lb, pb, c12),
            }
        }
        let mut acc: [[__m256; 2]; 6] = core::mem::transmute(c12);
        for _ in 0..k % 4 {
            for g in 0..G {
                let d = bp.add(g * k * 16);
                _mm256_storeu_ps(d, _mm256_loadu_ps(sp.add(16 * g)));
                _mm256_storeu_ps(d.add(8), _mm256_loadu_ps(sp.add(16 * g + 8)));
            }
            super::step::<V256, 6, 2>(&mut acc, ap, bp);
            ap = ap.add(6);
            bp = bp.add(16);
            // Past the last row this leaves the source's storage: wrapping, never dereferenced.
            sp = sp.wrapping_add(ldb);
        }
        super::store_acc::<V256, 6, 2>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
    }
}

impl Kernel for Avx2 {
    const MR: usize = AVX2_MR;
    const NR: usize = AVX2_NV * 8;
    const NAME: &'static str = "avx2-f32-6x16";
    const PACKS_B: bool = true;
    const PACK_GROUP: usize = AVX2_PACK_GROUP;
    const PACK_PANELS: usize = AVX2_PACK_PANELS;
    const SPREAD_MIN_ROWS: usize = AVX2_SPREAD_MIN_ROWS;

    fn new() -> Option<Self> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")).then_some(Self(()))
    }

    #[inline]
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
    ) {
        #[cfg(test)]
        {
            let v = super::probe::VARIANT.load(std::sync::atomic::Ordering::Relaxed);
            if v != 0 {
                // SAFETY: as below.
                unsafe { super::probe::run_variant(v, k, alpha, a, b, beta, c, rs_c, cs_c, m, n) };
                return;
            }
        }
        // SAFETY: holding `Avx2` proves avx2+fma (only `new` constructs it); memory per contract
        // (each edge kernel reads the first `R >= m` rows of the 6-row panel; the narrow ones
        // also only the first 8 of the 16 columns of each B panel row, for `n <= 8`).
        unsafe {
            // Full-height tiles wider than 8: the asm k-loop (variant 1 of the probe switch
            // keeps the compiled bodies below). `UKRS=1,0 CORE_BLAS_ISA=avx2 ukr_ab`, quiet
            // 00:37 / 00:49 / 01:00 UTC (session 14): 2048³ 52.1 / 59.6 / 57.3 / 52.0 → 65.7 /
            // 58.3 / 52.8 / 57.8% of the peak, 256×3136×2304 51.4 / 54.1 / 53.9 → 59.2 / 56.8 /
            // 54.1%, 64×50176×576 35.7 / 55.0 / 43.1 → 36.9 / 55.0 / 45.8%.
            if m == AVX2_MR
                && n > 8
                && super::skx::UKR_VARIANT.load(std::sync::atomic::Ordering::Relaxed) != 1
            {
                avx2_ukr_asm(k, alpha, a, b, beta, c, rs_c, cs_c, m, n);
                return;
            }
            if m == AVX2_MR && n == 16 && cs_c == 1 && alpha == 1.0 {
                // Full tiles with unit column stride and alpha = 1 (dense C, windows): the
                // exact-row kernel on the panel, B prefetched as in `ukr`. gemm_ratio, 1 thread,
                // 04:26-04:31 UTC: K = 64 shapes +3-6 points in 3 of 4 rounds (576×12544×64
                // 78-83 → 84-88%, 576×50176×64 73-81 → 83-85%; one round the other way);
                // 2048³, 256×3136×2304, 64×50176×576, 128×6272×1152 unchanged.
                avx2_rowa::<AVX2_MR, AVX2_NV, AVX2_MR, true>(k, a, 1, b, beta, c, rs_c, m, n);
                return;
            }
            if n <= 8 {
                match m {
                    1 => avx2_narrow::<1>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                    2 => avx2_narrow::<2>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                    3 => avx2_narrow::<3>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                    4 => avx2_narrow::<4>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                    5 => avx2_narrow::<5>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                    _ => avx2_narrow::<6>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                }
                return;
            }
            match m {
                1 => avx2_edge::<1>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                2 => avx2_edge::<2>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                3 => avx2_edge::<3>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                4 => avx2_edge::<4>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                5 => avx2_edge::<5>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
                _ => avx2_ukr(k, alpha, a, b, beta, c, rs_c, cs_c, m, n),
            }
        }
    }

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
        pf: super::RowPrefetch,
        _stream: bool,
    ) {
        // SAFETY: holding `Avx2` proves avx2+fma; memory per `run`'s contract (the full tile
        // as in `run`); prefetches never fault.
        unsafe {
            if m == AVX2_MR
                && n > 8
                && (1..=48).contains(&pf.width)
                && super::skx::UKR_VARIANT.load(std::sync::atomic::Ordering::Relaxed) != 1
            {
                avx2_ukr_asm_pf(k, alpha, a, b, beta, c, rs_c, cs_c, m, n, pf);
            } else {
                pf.issue();
                self.run(k, alpha, a, b, beta, c, rs_c, cs_c, m, n);
            }
        }
    }

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
        // SAFETY: holding `Avx2` proves avx2+fma; memory per contract (the full tile reads k
        // source rows of `PACK_PANELS · 16` values and writes `PACK_PANELS · k · 16` packed
        // values).
        unsafe {
            if m == AVX2_MR
                && super::skx::UKR_VARIANT.load(std::sync::atomic::Ordering::Relaxed) != 1
            {
                avx2_ukr_asm_pk::<AVX2_PACK_PANELS>(
                    k, alpha, a, bsrc, ldb, bdst, beta, c, rs_c, cs_c, m, 16,
                );
            } else {
                super::copy_then_run(self, k, alpha, a, bsrc, ldb, bdst, beta, c, rs_c, cs_c, m);
            }
        }
    }

    #[inline]
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
    ) {
        // SAFETY: holding `Avx2` proves avx2+fma; each arm's `R` equals `m` (1 <= m <= 6 by
        // contract) and reads the first `R` rows of the 6-wide panel; the narrow arms the first 8
        // of the 16 columns of each B row (n <= 8).
        unsafe {
            if n <= 8 {
                match m {
                    1 => avx2_rowa::<1, 1, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                    2 => avx2_rowa::<2, 1, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                    3 => avx2_rowa::<3, 1, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                    4 => avx2_rowa::<4, 1, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                    5 => avx2_rowa::<5, 1, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                    _ => avx2_rowa::<6, 1, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                }
                return;
            }
            match m {
                1 => avx2_rowa::<1, 2, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                2 => avx2_rowa::<2, 2, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                3 => avx2_rowa::<3, 2, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                4 => avx2_rowa::<4, 2, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                5 => avx2_rowa::<5, 2, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
                _ => avx2_rowa::<6, 2, 6, false>(k, a, 1, b, beta, c, ldc, m, n),
            }
        }
    }

    #[inline]
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
    ) {
        // SAFETY: holding `Avx2` proves avx2+fma; each arm's `R` equals `m` (1 <= m <= 6 by
        // contract); the narrow arms read the first 8 of the 16 columns of each B row (n <= 8).
        unsafe {
            if n <= 8 {
                match m {
                    1 => avx2_rowa::<1, 1, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                    2 => avx2_rowa::<2, 1, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                    3 => avx2_rowa::<3, 1, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                    4 => avx2_rowa::<4, 1, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                    5 => avx2_rowa::<5, 1, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                    _ => avx2_rowa::<6, 1, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                }
                return;
            }
            match m {
                1 => avx2_rowa::<1, 2, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                2 => avx2_rowa::<2, 2, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                3 => avx2_rowa::<3, 2, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                4 => avx2_rowa::<4, 2, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                5 => avx2_rowa::<5, 2, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                _ => avx2_rowa::<6, 2, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
            }
        }
    }
}

/// AVX-512 register tile: rows × vectors of 16.
const AVX512_MR: usize = 8;
const AVX512_NV: usize = 3;
/// Width of the AVX-512 B micro-panels.
const AVX512_NR: usize = AVX512_NV * 16;

/// `avx512-f32-8x48`: 24 accumulators in zmm registers, 3 B vectors, 1 broadcast. Session 13
/// (PERFORMANCE.md ## core-blas): this guest's front end caps the loop by its µops and loads per
/// FMA, and 8 × 48 with rows 2, 5, 7 as embedded broadcasts issues 32 fused µops (17 loads) per
/// 24 FMAs against 34 (18) on the 12 × 32 tile of sessions 11-12 (BLIS's SKX shape). gemm_ratio
/// 1 thread against the 12 × 32 binary, quiet 21:09-21:11 UTC, three alternating rounds: 2048³
/// 52.2-59.4 → 63.3-64.0% of the peak, 256×3136×2304 49.1-50.4 → 52.6-53.2%, 64×50176×576
/// 33.8-35.0 → 36.6-41.0%. The full tiles run the k-loop in assembly ([`super::skx`]); the edge
/// tiles use [`ukr`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512(());

#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn avx512_ukr(
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
    // SAFETY: compiled with avx512f; the memory contract is the caller's.
    unsafe {
        ukr::<V512, AVX512_MR, AVX512_NV, AVX512_MR, AVX512_NR>(
            k, alpha, a, b, beta, c, rs_c, cs_c, m, n,
        )
    }
}

/// The edge kernels of `avx512-f32-8x48`: the first `R` rows and `NV` vectors of the 8 × 48
/// panels, for tiles of `m <= R` rows and `n <= 16 · NV` columns (only their FMAs).
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn avx512_edge<const R: usize, const NV: usize>(
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
    // SAFETY: compiled with avx512f; `m <= R`, `n <= 16 · NV` and memory are the caller's.
    unsafe { ukr::<V512, R, NV, AVX512_MR, AVX512_NR>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n) }
}

/// The row-major-A kernels of `avx512-f32-8x48` ([`ukr_rowa`]): `R` rows (the tile's `m`), `NV`
/// vectors (tiles of at most `16 · NV` columns).
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx512_rowa<const R: usize, const NV: usize, const TS: usize>(
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
    // SAFETY: compiled with avx512f; `m == R`, `n <= 16 · NV` and memory are the caller's.
    unsafe { ukr_rowa::<V512, R, NV, AVX512_NR, TS, false>(k, a, lda, b, beta, c, ldc, m, n) }
}

/// Dispatch on the tile's `m` (1 ..= 8) to a `$f::<R, ...>` instance, `R = m`.
macro_rules! by_rows {
    ($m:expr, $f:ident :: <_ $(, $p:tt)*> ($($arg:expr),*)) => {
        match $m {
            1 => $f::<1 $(, $p)*>($($arg),*),
            2 => $f::<2 $(, $p)*>($($arg),*),
            3 => $f::<3 $(, $p)*>($($arg),*),
            4 => $f::<4 $(, $p)*>($($arg),*),
            5 => $f::<5 $(, $p)*>($($arg),*),
            6 => $f::<6 $(, $p)*>($($arg),*),
            7 => $f::<7 $(, $p)*>($($arg),*),
            _ => $f::<8 $(, $p)*>($($arg),*),
        }
    };
}

/// Dispatch on the tile's `m` (1 ..= 8) and its vectors (`n` up to 16, 32 or 48) to a
/// `$f::<R, NV, TS>` instance.
macro_rules! by_rows_vectors {
    ($m:expr, $n:expr, $f:ident :: <_, _, $ts:tt> ($($arg:expr),*)) => {
        if $n <= 16 {
            by_rows!($m, $f::<_, 1, $ts>($($arg),*))
        } else if $n <= 32 {
            by_rows!($m, $f::<_, 2, $ts>($($arg),*))
        } else {
            by_rows!($m, $f::<_, 3, $ts>($($arg),*))
        }
    };
}

impl Kernel for Avx512 {
    const MR: usize = AVX512_MR;
    const NR: usize = AVX512_NR;
    const NAME: &'static str = "avx512-f32-8x48";
    const PACKS_B: bool = true;
    const DEEPER_PASSES: bool = true;
    const STREAMS_C: bool = true;

    fn new() -> Option<Self> {
        (is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma"))
        .then_some(Self(()))
    }

    #[inline]
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
    ) {
        // SAFETY: holding `Avx512` proves avx512f+avx2+fma; memory per contract (each edge
        // kernel reads the first `R >= m` rows and `NV` vectors of the 8 × 48 panels).
        unsafe {
            if m == AVX512_MR && n > 32 {
                let v = super::skx::UKR_VARIANT.load(std::sync::atomic::Ordering::Relaxed);
                if v == 1 {
                    avx512_ukr(k, alpha, a, b, beta, c, rs_c, cs_c, m, n);
                } else {
                    super::skx::avx512_ukr_asm(v, k, alpha, a, b, beta, c, rs_c, cs_c, m, n);
                }
            } else if n > 32 {
                by_rows!(
                    m,
                    avx512_edge::<_, 3>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n)
                );
            } else if n > 16 {
                by_rows!(
                    m,
                    avx512_edge::<_, 2>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n)
                );
            } else {
                by_rows!(
                    m,
                    avx512_edge::<_, 1>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n)
                );
            }
        }
    }

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
        pf: super::RowPrefetch,
        stream: bool,
    ) {
        // SAFETY: holding `Avx512` proves avx512f+avx2+fma; memory per `run`'s contract (the
        // full tile as in `run`); prefetches never fault.
        unsafe {
            if m == AVX512_MR
                && n > 32
                && (1..=AVX512_NR).contains(&pf.width)
                && super::skx::UKR_VARIANT.load(std::sync::atomic::Ordering::Relaxed) == 0
            {
                super::skx::avx512_ukr_asm_pf(
                    k, alpha, a, b, beta, c, rs_c, cs_c, m, n, pf, stream,
                );
            } else {
                pf.issue();
                self.run(k, alpha, a, b, beta, c, rs_c, cs_c, m, n);
            }
        }
    }

    const COPIES_AHEAD: bool = true;

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
        cp: super::RowCopy,
        stream: bool,
    ) {
        // SAFETY: holding `Avx512` proves avx512f+avx2+fma; memory per `run_copying`'s contract
        // (the full tile as in `run`, the copy's rows of 48 values).
        unsafe {
            if m == AVX512_MR
                && n > 32
                && super::skx::UKR_VARIANT.load(std::sync::atomic::Ordering::Relaxed) == 0
            {
                super::skx::avx512_ukr_asm_cp(
                    k, alpha, a, b, beta, c, rs_c, cs_c, m, n, cp, stream,
                );
            } else {
                cp.copy(AVX512_NR);
                self.run(k, alpha, a, b, beta, c, rs_c, cs_c, m, n);
            }
        }
    }

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
        stream: bool,
    ) {
        // SAFETY: holding `Avx512` proves avx512f+avx2+fma; memory per contract (the full tile
        // reads k source rows of 48 values and writes k · 48 packed values).
        unsafe {
            if m == AVX512_MR
                && super::skx::UKR_VARIANT.load(std::sync::atomic::Ordering::Relaxed) != 1
            {
                super::skx::avx512_ukr_asm_pk(
                    crate::isa::intel(),
                    k,
                    alpha,
                    a,
                    bsrc,
                    ldb,
                    bdst,
                    beta,
                    c,
                    rs_c,
                    cs_c,
                    m,
                    AVX512_NR,
                    stream,
                );
            } else {
                super::copy_then_run(self, k, alpha, a, bsrc, ldb, bdst, beta, c, rs_c, cs_c, m);
            }
        }
    }

    const PACKS_CONV: bool = true;

    #[inline]
    unsafe fn run_packing_conv<R: super::convpack::ConvRowForm>(
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
        // SAFETY: holding `Avx512` proves avx512f+avx2+fma; memory per the trait's contract
        // (the full tile reads k rows of 3 chunks and writes k · 48 packed values).
        unsafe {
            if m == AVX512_MR {
                R::AVX512_TILE(
                    k, alpha, a, src, rows, period, step, bdst, beta, c, rs_c, cs_c, m, AVX512_NR,
                );
            } else {
                super::conv_then_run(
                    self, k, alpha, a, src, rows, period, step, bdst, beta, c, rs_c, cs_c, m,
                );
            }
        }
    }

    #[inline]
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
    ) {
        // SAFETY: holding `Avx512` proves avx512f+avx2+fma; each arm's `R` equals `m`
        // (1 <= m <= 8 by contract) and reads the first `R` rows of the 8-wide panel and the
        // first `NV` vectors (`16 · NV >= n`) of each 48-wide B row.
        unsafe { by_rows_vectors!(m, n, avx512_rowa::<_, _, 8>(k, a, 1, b, beta, c, ldc, m, n)) }
    }

    #[inline]
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
    ) {
        // SAFETY: holding `Avx512` proves avx512f+avx2+fma; each arm's `R` equals `m`
        // (1 <= m <= 8 by contract) and reads the first `NV` vectors (`16 · NV >= n`) of each
        // 48-wide B row; memory per contract.
        unsafe {
            by_rows_vectors!(
                m,
                n,
                avx512_rowa::<_, _, 1>(k, a, lda, b, beta, c, ldc, m, n)
            )
        }
    }
}

/// The small-A row product on 256-bit vectors ([`super::small`]).
///
/// # Safety
/// The CPU has AVX2 and FMA (the caller holds an `Avx2` or `Avx512` kernel value); memory as in
/// [`small_a_body`].
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn small_a_avx2(plan: &Plan, xs: &[*const f32], ys: &[*mut f32], n: usize) {
    // SAFETY: compiled with avx2+fma; the memory contract is the caller's.
    unsafe { small_a_body::<V256>(plan, xs, ys, n) }
}

/// The small-A row product on 512-bit vectors ([`super::small`]), with masked tails.
///
/// # Safety
/// The CPU has AVX-512F (the caller holds an `Avx512` kernel value); memory as in
/// [`small_a_body`].
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn small_a_avx512(plan: &Plan, xs: &[*const f32], ys: &[*mut f32], n: usize) {
    // SAFETY: compiled with avx512f; the memory contract is the caller's.
    unsafe { small_a_body::<V512>(plan, xs, ys, n) }
}

/// Transpose of up to 8 lanes on 256-bit registers: `dst[t * ld + l] = lanes[l][t]` for
/// `l < nl`, `t < len` (unit stride along each lane). Blocks of 8 × 8 are transposed in registers
/// (8 loads, 24 shuffles, 8 stores); with `nl < 8` the missing lanes repeat lane 0 and the stores
/// of rows `t >= spill_rows` are masked to `nl` values. Rows `t < spill_rows` are stored whole
/// (8 values; masked stores are slow on Zen): the caller vouches that the `8 − nl` values past
/// the row are writable and rewritten later (rows `ld = nl` apart written in increasing order).
/// The `len % 8` tail is scalar.
///
/// # Safety
/// The CPU has AVX2 (the caller holds an `Avx2` or `Avx512` kernel value); `1 <= nl <= 8`;
/// `lanes[l]` for `l < nl` points to `len` readable f32; `dst + t * ld + l` is writable for every
/// `t < len`, `l < nl` (and `l < 8` when `t < spill_rows`), and overlaps no lane.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn transpose8_avx2(
    dst: *mut f32,
    ld: usize,
    lanes: &[*const f32; 8],
    nl: usize,
    len: usize,
    spill_rows: usize,
) {
    debug_assert!((1..=8).contains(&nl));
    // SAFETY: avx2 per the caller; every load reads `t + 8 <= len` values of a lane the caller
    // vouches for (missing lanes alias lane 0); every store is masked to the `nl` columns of a
    // destination row `t + i < len`, or whole for a row `t + i < spill_rows` (caller's contract).
    unsafe {
        let src: [*const f32; 8] =
            std::array::from_fn(|l| if l < nl { lanes[l] } else { lanes[0] });
        let mask = lane_mask(nl);
        let mut t = 0;
        while t + 8 <= len {
            let r: [__m256; 8] = std::array::from_fn(|l| _mm256_loadu_ps(src[l].add(t)));
            let o = transpose8x8(r);
            for (i, v) in o.into_iter().enumerate() {
                let d = dst.add((t + i) * ld);
                if nl == 8 || t + i < spill_rows {
                    _mm256_storeu_ps(d, v);
                } else {
                    _mm256_maskstore_ps(d, mask, v);
                }
            }
            t += 8;
        }
        for t in t..len {
            for l in 0..nl {
                *dst.add(t * ld + l) = *src[l].add(t);
            }
        }
    }
}

/// The 8 × 8 transpose of eight vectors: `o[i][g] = r[g][i]`.
#[inline(always)]
pub(crate) unsafe fn transpose8x8(r: [__m256; 8]) -> [__m256; 8] {
    // SAFETY: only inlined into functions compiled with `avx`.
    unsafe {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(s0, s4),
            _mm256_permute2f128_ps::<0x20>(s1, s5),
            _mm256_permute2f128_ps::<0x20>(s2, s6),
            _mm256_permute2f128_ps::<0x20>(s3, s7),
            _mm256_permute2f128_ps::<0x31>(s0, s4),
            _mm256_permute2f128_ps::<0x31>(s1, s5),
            _mm256_permute2f128_ps::<0x31>(s2, s6),
            _mm256_permute2f128_ps::<0x31>(s3, s7),
        ]
    }
}

/// The AVX2 body of [`crate::Gemm::deinterleave`]: `dst[i · ld + q] = src[q · m + i]` for
/// `i < m`, `q < n`. Blocks of 8 groups × up to 8 phases: 8 unaligned loads of 8 values (a
/// group's phases and the next group's first ones; a load that would pass `src_len` is masked),
/// one 8 × 8 register transpose, one whole 8-value store per phase row. The `n % 8` tail is a
/// last block overlapping the previous one (it rewrites the same values).
///
/// # Safety
/// The CPU has AVX2 (the caller holds an `Avx2` or `Avx512` kernel value); `m >= 1`, `n >= 8`;
/// `src_len >= n · m` values readable at `src`; `dst + i · ld + q` writable for `i < m`,
/// `q < n`, with `ld >= n`; `dst` overlaps no value of `src`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn deinterleave_avx2(
    dst: *mut f32,
    ld: usize,
    src: *const f32,
    src_len: usize,
    m: usize,
    n: usize,
) {
    debug_assert!(m >= 1 && n >= 8 && src_len >= n * m && ld >= n);
    // SAFETY: avx2 per the caller. Loads start at `(q + g) · m + i0 < n · m <= src_len` and read
    // 8 values when they end inside `src_len`, else only the `src_len − start` values inside
    // (masked); stores write row `i0 + i < m`, columns `q .. q + 8 <= n` (q <= n − 8).
    unsafe {
        let mut i0 = 0;
        while i0 < m {
            let rows = (m - i0).min(8);
            let mut q = 0;
            loop {
                let base = q * m + i0;
                let r: [__m256; 8] = if base + 7 * m + 8 <= src_len {
                    std::array::from_fn(|g| _mm256_loadu_ps(src.add(base + g * m)))
                } else {
                    std::array::from_fn(|g| {
                        let at = base + g * m;
                        if at + 8 <= src_len {
                            _mm256_loadu_ps(src.add(at))
                        } else {
                            _mm256_maskload_ps(src.add(at), lane_mask(src_len - at))
                        }
                    })
                };
                let o = transpose8x8(r);
                for (i, v) in o.into_iter().enumerate().take(rows) {
                    _mm256_storeu_ps(dst.add((i0 + i) * ld + q), v);
                }
                if q + 8 >= n {
                    break;
                }
                q = (q + 8).min(n - 8);
            }
            i0 += 8;
        }
    }
}

/// The stride-2 body of [`crate::Gemm::gather_pieces`]: per piece, 8 values per step from two
/// 8-wide loads (`vshufps` picks the even values of each 128-bit half, `vpermpd` orders the
/// halves), the last step of a piece of 8 or more overlapping the previous one; a piece shorter
/// than 8, or one whose last load would pass the end of `src`, is copied one value at a time.
///
/// # Safety
/// The CPU has AVX2 (the caller holds an `Avx2` or `Avx512` kernel value); every piece has
/// `row · ld + col + len <= dst.len()`, `col + len <= ld` and `at + 2 · (len − 1) < src.len()`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gather2_avx2(
    dst: &mut [f32],
    ld: usize,
    src: &[f32],
    pieces: &[crate::gather::Piece],
) {
    let (dp, sp) = (dst.as_mut_ptr(), src.as_ptr());
    for p in pieces {
        let (row, col, len, at) = (p.row as usize, p.col as usize, p.len as usize, p.at);
        // SAFETY: the caller's bounds: outputs `row · ld + col + t` (t < len) lie in `dst`; the
        // vector path reads `at + 2t .. at + 2t + 16` for t <= len − 8, which ends at
        // `at + 2 · len` <= `src.len()` (checked), and the scalar path reads `at + 2t`.
        unsafe {
            let out = dp.add(row * ld + col);
            if len >= 8 && at + 2 * len <= src.len() {
                let step = |t: usize| {
                    let a = _mm256_loadu_ps(sp.add(at + 2 * t));
                    let b = _mm256_loadu_ps(sp.add(at + 2 * t + 8));
                    let s = _mm256_shuffle_ps::<0x88>(a, b);
                    let r = _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(s)));
                    _mm256_storeu_ps(out.add(t), r);
                };
                let mut t = 0;
                while t + 8 <= len {
                    step(t);
                    t += 8;
                }
                if t < len {
                    step(len - 8);
                }
            } else {
                for t in 0..len {
                    *out.add(t) = *sp.add(at + 2 * t);
                }
            }
        }
    }
}

// The offset-list kernels ([`crate::offset`]): `offset_tile` / `offset_dot` on 256-bit vectors in
// both families (the AVX-512 one compiled with AVX-512F; that contract is 8 lanes wide); the
// offset-A tile picks its vector width per family inside `kernel/offset.rs`.
super::offset::offset_kernel!(
    Avx2,
    V256,
    avx2_offset_tile,
    avx2_offset_dot,
    avx2_offset_a_tile,
    "avx2,fma"
);
super::offset::offset_kernel!(
    Avx512,
    V256,
    avx512_offset_tile,
    avx512_offset_dot,
    avx512_offset_a_tile,
    "avx512f,avx2,fma"
);

#[cfg(test)]
mod tests {
    use super::*;

    /// [`avx2_ukr_asm_pf`] against the naive product: the prefetches change nothing (no rows,
    /// fewer rows than the k-loop's rounds, more, widths 1 and 48), depths around the 4-step
    /// unroll, alpha / beta cases (beta = 0 over NaN), unit and non-unit column strides of C.
    #[test]
    fn avx2_asm_prefetching_tile_matches_naive() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        let src = vec![1.0f32; 64 * 1000];
        for k in [0usize, 1, 3, 4, 5, 33, 36, 37, 64, 290] {
            for (rows, width, n) in [
                (0usize, 48usize, 16usize),
                (3, 48, 16),
                (9, 48, 16),
                (40, 1, 15),
                (500, 48, 9),
            ] {
                let pf = crate::kernel::RowPrefetch {
                    ptr: src.as_ptr(),
                    ld: 61,
                    rows,
                    width,
                };
                super::super::assert_tile_matches_naive(
                    (6, 16),
                    k,
                    n,
                    20,
                    &format!("rows {rows} width {width} "),
                    |ap, bp, alpha, beta, c, rs, cs| {
                        // SAFETY: avx2+fma checked above; k steps of 6 / 16 values behind ap /
                        // bp; the 6 × n window with strides (rs, cs) lies inside `c`; width <= 48.
                        unsafe {
                            avx2_ukr_asm_pf(
                                k,
                                alpha,
                                ap.as_ptr(),
                                bp.as_ptr(),
                                beta,
                                c.as_mut_ptr(),
                                rs,
                                cs,
                                6,
                                n,
                                pf,
                            )
                        };
                    },
                );
            }
        }
    }

    /// [`avx2_ukr_asm_pk`] (groups of 1, 2, 3 panels) against the naive product, reading B from a
    /// row-major source with row stride 53 (off any 32-byte boundary), and its packed panels
    /// against the source rows: depths around the 4-step unroll, alpha / beta cases (beta = 0
    /// over NaN), unit and non-unit column strides of C.
    #[test]
    fn avx2_asm_packing_tile_matches_naive() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        fn check<const G: usize>(k: usize) {
            let ldb = 53;
            super::super::assert_tile_matches_naive(
                (6, 16),
                k,
                16,
                20,
                &format!("packing group {G} "),
                |ap, bp, alpha, beta, c, rs, cs| {
                    // The first panel is the test's B; the others other small integers.
                    let extra = |g: usize, p: usize, j: usize| ((g * 31 + p * 7 + j) % 13) as f32;
                    let mut src = vec![f32::NAN; k * ldb + 1];
                    for p in 0..k {
                        src[1 + p * ldb..][..16].copy_from_slice(&bp[p * 16..][..16]);
                        for g in 1..G {
                            for j in 0..16 {
                                src[1 + p * ldb + 16 * g + j] = extra(g, p, j);
                            }
                        }
                    }
                    let mut dst = vec![f32::NAN; G * k * 16];
                    // SAFETY: avx2+fma checked above; k steps of 6 values behind ap, k source
                    // rows of 16 · G values (row stride ldb >= 48) behind src[1..], G · k · 16
                    // values in dst (its own allocation); the 6 × 16 window with strides
                    // (rs, cs) lies inside `c`.
                    unsafe {
                        avx2_ukr_asm_pk::<G>(
                            k,
                            alpha,
                            ap.as_ptr(),
                            src[1..].as_ptr(),
                            ldb,
                            dst.as_mut_ptr(),
                            beta,
                            c.as_mut_ptr(),
                            rs,
                            cs,
                            6,
                            16,
                        )
                    };
                    assert_eq!(dst[..k * 16], bp[..k * 16], "packed panel 0, k {k}");
                    for g in 1..G {
                        for p in 0..k {
                            for j in 0..16 {
                                assert_eq!(dst[(g * k + p) * 16 + j], extra(g, p, j), "panel {g}");
                            }
                        }
                    }
                },
            );
        }
        for k in [0usize, 1, 3, 4, 5, 7, 8, 9, 33, 64, 385] {
            check::<1>(k);
            check::<2>(k);
            check::<3>(k);
        }
    }

    /// [`avx2_ukr_asm`] against a naive product (small integers: exact in any order): depths
    /// around the 4-step unroll, n = 9..16, alpha / beta cases (beta = 0 over NaN), unit and
    /// non-unit column strides of C, panels off any 32-byte boundary.
    #[test]
    fn avx2_asm_tile_matches_naive() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        for k in [0usize, 1, 3, 4, 5, 7, 8, 9, 33, 64, 385] {
            for n in [9usize, 13, 16] {
                super::super::assert_tile_matches_naive(
                    (6, 16),
                    k,
                    n,
                    20,
                    "",
                    |ap, bp, alpha, beta, c, rs, cs| {
                        // SAFETY: avx2+fma checked above; k steps of 6 / 16 values behind ap /
                        // bp; the 6 × n window with strides (rs, cs) lies inside `c`.
                        unsafe {
                            avx2_ukr_asm(
                                k,
                                alpha,
                                ap.as_ptr(),
                                bp.as_ptr(),
                                beta,
                                c.as_mut_ptr(),
                                rs,
                                cs,
                                6,
                                n,
                            )
                        };
                    },
                );
            }
        }
    }
}
