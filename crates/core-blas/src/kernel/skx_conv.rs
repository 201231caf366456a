//! The fused conv-B first tile of `avx512-f32-8x48` (conv-ops' code in core-blas, kept apart
//! from [`super::skx`]): [`super::skx::avx512_ukr_asm`]'s k-loop whose B row is read from an
//! im2col-like source through three masked loads per row ([`ConvRows`](super::convpack::ConvRows): a byte offset and
//! three 16-lane masks per row of one period of rows, the source pointer one channel plane
//! further per period) and stored to the packed panel as it goes, so that the rest of the
//! panel's tiles read it packed. The loads, masks and stores of a row fill issue slots its 24
//! FMAs leave free, instead of a separate packing pass (`convpack::avx512_rows`) over the
//! block. Rows 2, 5, 7 of A take embedded broadcasts as in the plain kernel's variant 0.
//!
//! Each row also prefetches one line into L2 (`prefetcht1`) at its offset + its
//! [`ConvRow::pf`]: a line of the window the same row of the panel after next reads, the three
//! taps of a kernel row one line each ([`super::convpack`]'s `PF_AHEAD`). Without a prefetch
//! the tile waits on its loads (perf, session 22: half of its samples on the masked loads on
//! VGG's 224² planes, a quarter on ResNet-50's 56²). Sessions 22-38 prefetched the window's
//! first line alone (into L1); in the Zen 5 host's slow phases 64@56²'s forward at 1 thread
//! then ran 9.3 ms against 7.5 with the three lines (session 39: 54% of the tile's samples on
//! its masked loads). Into L2, not L1: between this tile and the next panel's, the panel's
//! other tiles stream A and the packed panel, more than L1 holds (docs/PERFORMANCE.md,
//! conv-ops, sessions 22 and 39: the distances and line counts tried).

use core::arch::asm;
use core::arch::x86_64::*;

use super::convpack::{ConvRow, ConvRow2};
use super::x86::V512;

/// Row `r` of A with a register broadcast: 1 load, 3 FMAs.
macro_rules! cbc {
    ($r:literal, $c0:literal, $c1:literal, $c2:literal) => {
        concat!(
            "vbroadcastss zmm2, dword ptr [{a} + ",
            $r,
            "*4]\n",
            "vfmadd231ps zmm",
            $c0,
            ", zmm0, zmm2\n",
            "vfmadd231ps zmm",
            $c1,
            ", zmm1, zmm2\n",
            "vfmadd231ps zmm",
            $c2,
            ", zmm3, zmm2\n",
        )
    };
}

/// Row `r` of A with embedded broadcasts: 3 FMAs with a memory operand.
macro_rules! ceb {
    ($r:literal, $c0:literal, $c1:literal, $c2:literal) => {
        concat!(
            "vfmadd231ps zmm",
            $c0,
            ", zmm0, dword ptr [{a} + ",
            $r,
            "*4]{{1to16}}\n",
            "vfmadd231ps zmm",
            $c1,
            ", zmm1, dword ptr [{a} + ",
            $r,
            "*4]{{1to16}}\n",
            "vfmadd231ps zmm",
            $c2,
            ", zmm3, dword ptr [{a} + ",
            $r,
            "*4]{{1to16}}\n",
        )
    };
}

/// One row of the fused loop: its offset and masks from `{t}`, the three masked loads from
/// `{s} + off` into zmm0, zmm1, zmm3, their stores to the packed panel `{b}`, the 8 rows of A.
macro_rules! conv_row {
    () => {
        concat!(
            "mov {o}, qword ptr [{t}]\n",
            "kmovw k1, word ptr [{t} + 8]\n",
            "kmovw k2, word ptr [{t} + 10]\n",
            "kmovw k3, word ptr [{t} + 12]\n",
            "vmovups zmm0 {{k1}}{{z}}, zmmword ptr [{s} + {o}]\n",
            "vmovups zmm1 {{k2}}{{z}}, zmmword ptr [{s} + {o} + 64]\n",
            "vmovups zmm3 {{k3}}{{z}}, zmmword ptr [{s} + {o} + 128]\n",
            "vmovups zmmword ptr [{b}], zmm0\n",
            "vmovups zmmword ptr [{b} + 64], zmm1\n",
            "vmovups zmmword ptr [{b} + 128], zmm3\n",
            cbc!(0, 8, 9, 10),
            cbc!(1, 11, 12, 13),
            ceb!(2, 14, 15, 16),
            cbc!(3, 17, 18, 19),
            cbc!(4, 20, 21, 22),
            ceb!(5, 23, 24, 25),
            cbc!(6, 26, 27, 28),
            ceb!(7, 29, 30, 31),
        )
    };
}

/// Where the fused loop finds a [`ConvRow`]'s fields: `off` at byte 0, the masks at 8, 10 and
/// 12, `pf` at 14, 16 bytes a row.
const _: () = {
    assert!(core::mem::offset_of!(ConvRow, off) == 0);
    assert!(core::mem::offset_of!(ConvRow, m) == 8);
    assert!(core::mem::offset_of!(ConvRow, pf) == 14);
    assert!(size_of::<ConvRow>() == 16);
};

/// `$n >= 1` rows of the fused loop on the accumulators `$c` (zmm8-zmm31), each followed by its
/// prefetch (`{s}` + its offset + its `pf`, into L2): `$t` the current [`ConvRow`], `$cnt` the
/// rows left in its period (`>= 1`), `$s` the period's source pointer, all three carried
/// across calls; `$tab` / `$per` the period's first row and length, `$stp` its source step in
/// bytes; `$a` and `$b` advance by 8 and 48 values a row.
macro_rules! conv_loop {
    ($n:expr, $a:expr, $b:expr, $s:expr, $t:expr, $cnt:expr, $tab:expr, $per:expr, $stp:expr, $c:expr) => {
        asm!(
            ".p2align 5",
            "2:",
            conv_row!(),
            "movzx {q:e}, word ptr [{t} + 14]",
            "add {q}, {o}",
            "prefetcht1 [{s} + {q}]",
            "add {t}, 16",
            "add {a}, 32",
            "add {b}, 192",
            "dec {cnt}",
            "jnz 3f",
            "mov {t}, {tab}",
            "mov {cnt}, {per}",
            "add {s}, {stp}",
            "3:",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) $n => _,
            a = inout(reg) $a,
            b = inout(reg) $b,
            s = inout(reg) $s,
            t = inout(reg) $t,
            cnt = inout(reg) $cnt,
            tab = in(reg) $tab,
            per = in(reg) $per,
            stp = in(reg) $stp,
            o = out(reg) _,
            q = out(reg) _,
            inout("zmm8") $c[0],
            inout("zmm9") $c[1],
            inout("zmm10") $c[2],
            inout("zmm11") $c[3],
            inout("zmm12") $c[4],
            inout("zmm13") $c[5],
            inout("zmm14") $c[6],
            inout("zmm15") $c[7],
            inout("zmm16") $c[8],
            inout("zmm17") $c[9],
            inout("zmm18") $c[10],
            inout("zmm19") $c[11],
            inout("zmm20") $c[12],
            inout("zmm21") $c[13],
            inout("zmm22") $c[14],
            inout("zmm23") $c[15],
            inout("zmm24") $c[16],
            inout("zmm25") $c[17],
            inout("zmm26") $c[18],
            inout("zmm27") $c[19],
            inout("zmm28") $c[20],
            inout("zmm29") $c[21],
            inout("zmm30") $c[22],
            inout("zmm31") $c[23],
            out("zmm0") _,
            out("zmm1") _,
            out("zmm2") _,
            out("zmm3") _,
            out("k1") _,
            out("k2") _,
            out("k3") _,
            options(nostack),
        )
    };
}

/// Chunk `$q` of a step-2 row ([`ConvRow2`]) into `$d`: its four masks by one 64-bit load into
/// `{p}` and shifts (three loads a row instead of twelve `kmovw` from memory: pass medians
/// 13 of 15 alternations faster, ~0.5%, quiet 16:05-16:10 UTC), its
/// pieces' offsets from `{t}`, the window's low half (piece 1 zero-masked, piece 2 merged)
/// into `$d` and its high half into `$h`, their even lanes by one `vpermt2ps` (index zmm4),
/// stored to the packed panel.
macro_rules! conv_chunk2 {
    ($q:literal, $d:literal, $h:literal) => {
        concat!(
            "mov {p}, qword ptr [{t} + 48 + 8*",
            $q,
            "]\n",
            "mov {o}, qword ptr [{t} + 16*",
            $q,
            "]\n",
            "prefetcht0 [{s2} + {o}]\n",
            "prefetcht0 [{s2} + {o} + 64]\n",
            "cmp {p:e}, -1\n",
            "jne 5",
            $q,
            "f\n",
            "vmovups zmm",
            $d,
            ", zmmword ptr [{s} + {o}]\n",
            "vmovups zmm",
            $h,
            ", zmmword ptr [{s} + {o} + 64]\n",
            "shr {p}, 32\n",
            "jz 4",
            $q,
            "f\n",
            "jmp 6",
            $q,
            "f\n",
            "5",
            $q,
            ":\n",
            "kmovw k1, {p:e}\n",
            "shr {p}, 16\n",
            "kmovw k3, {p:e}\n",
            "vmovups zmm",
            $d,
            " {{k1}}{{z}}, zmmword ptr [{s} + {o}]\n",
            "vmovups zmm",
            $h,
            " {{k3}}{{z}}, zmmword ptr [{s} + {o} + 64]\n",
            "shr {p}, 16\n",
            "jz 4",
            $q,
            "f\n",
            "6",
            $q,
            ":\n",
            "kmovw k2, {p:e}\n",
            "shr {p}, 16\n",
            "kmovw k4, {p:e}\n",
            "mov {p}, qword ptr [{t} + 16*",
            $q,
            " + 8]\n",
            "vmovups zmm",
            $d,
            " {{k2}}, zmmword ptr [{s} + {p}]\n",
            "vmovups zmm",
            $h,
            " {{k4}}, zmmword ptr [{s} + {p} + 64]\n",
            "4",
            $q,
            ":\n",
            "vpermt2ps zmm",
            $d,
            ", zmm4, zmm",
            $h,
            "\n",
            "vmovups zmmword ptr [{b} + 64*",
            $q,
            "], zmm",
            $d,
            "\n",
        )
    };
}

/// [`conv_loop`] for step-2 rows ([`ConvRow2`], 80 bytes): the
/// row's two prefetch lines, its three chunks by [`conv_chunk2`], then the 8 rows of A.
/// Each chunk also hints its piece-1 window's two lines [`PF0_PERIODS`] periods ahead (`{s2}`:
/// a later channel plane, the row of the same tap) into L1 with `prefetcht0`: on Zen 5
/// (whose 512-bit FMAs halve the tile's k-loop time) knock-outs put ~2 points of the stride-2
/// forward's gap to its bound in the window loads missing L1 (session 38). A/B paired
/// stride-2 probe, 60 pairs, without / with (one period ahead), quiet 09:40:31 UTC: t1 pair
/// medians 0.926/0.928, 0.923/0.925, 0.916/0.931, 0.917/0.929, 0.916/0.927, 0.908/0.924 (pass 6
/// of 6 faster); t2 0.934/0.937, 0.930/0.938; 09:45:06: 0.918/0.921, 0.923/0.925, 0.920/0.924,
/// 0.921/0.921.
macro_rules! conv_loop2 {
    ($n:expr, $a:expr, $b:expr, $s:expr, $s2:expr, $t:expr, $cnt:expr, $tab:expr, $per:expr, $stp:expr, $idx:expr, $c:expr) => {
        asm!(
            ".p2align 5",
            "2:",
            "mov {o}, qword ptr [{t} + 72]",
            "prefetcht1 [{s} + {o}]",
            "prefetcht1 [{s} + {o} + 64]",
            "prefetcht1 [{s} + {o} + 128]",
            conv_chunk2!(0, 0, 5),
            conv_chunk2!(1, 1, 6),
            conv_chunk2!(2, 3, 7),
            cbc!(0, 8, 9, 10),
            cbc!(1, 11, 12, 13),
            ceb!(2, 14, 15, 16),
            cbc!(3, 17, 18, 19),
            cbc!(4, 20, 21, 22),
            ceb!(5, 23, 24, 25),
            cbc!(6, 26, 27, 28),
            ceb!(7, 29, 30, 31),
            "add {t}, 80",
            "add {a}, 32",
            "add {b}, 192",
            "dec {cnt}",
            "jnz 3f",
            "mov {t}, {tab}",
            "mov {cnt}, {per}",
            "add {s}, {stp}",
            "add {s2}, {stp}",
            "3:",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) $n => _,
            a = inout(reg) $a,
            b = inout(reg) $b,
            s = inout(reg) $s,
            s2 = inout(reg) $s2,
            t = inout(reg) $t,
            cnt = inout(reg) $cnt,
            tab = in(reg) $tab,
            per = in(reg) $per,
            stp = in(reg) $stp,
            o = out(reg) _,
            p = out(reg) _,
            in("zmm4") $idx,
            inout("zmm8") $c[0],
            inout("zmm9") $c[1],
            inout("zmm10") $c[2],
            inout("zmm11") $c[3],
            inout("zmm12") $c[4],
            inout("zmm13") $c[5],
            inout("zmm14") $c[6],
            inout("zmm15") $c[7],
            inout("zmm16") $c[8],
            inout("zmm17") $c[9],
            inout("zmm18") $c[10],
            inout("zmm19") $c[11],
            inout("zmm20") $c[12],
            inout("zmm21") $c[13],
            inout("zmm22") $c[14],
            inout("zmm23") $c[15],
            inout("zmm24") $c[16],
            inout("zmm25") $c[17],
            inout("zmm26") $c[18],
            inout("zmm27") $c[19],
            inout("zmm28") $c[20],
            inout("zmm29") $c[21],
            inout("zmm30") $c[22],
            inout("zmm31") $c[23],
            out("zmm0") _,
            out("zmm1") _,
            out("zmm2") _,
            out("zmm3") _,
            out("zmm5") _,
            out("zmm6") _,
            out("zmm7") _,
            out("k1") _,
            out("k2") _,
            out("k3") _,
            out("k4") _,
            options(nostack),
        )
    };
}

/// The signature of the fused tiles ([`avx512_ukr_conv_asm`], [`avx512_ukr_conv2_asm`]) over
/// rows `R` ([`super::convpack::ConvRowForm::AVX512_TILE`]).
pub(crate) type FusedTile<R> = unsafe fn(
    usize,
    f32,
    *const f32,
    *const f32,
    *const R,
    usize,
    isize,
    *mut f32,
    f32,
    *mut f32,
    usize,
    usize,
    usize,
    usize,
);

/// How many periods of rows (channel planes) ahead the step-2 tile hints its windows into L1
/// ([`conv_loop2`]). Session 39 (Zen 5), paired stride-2 probe, 60 pairs, the distance read
/// from the environment in one binary, 1 / 4 periods, quiet 11:55:28 UTC: t1 pass medians
/// 7.795/7.734, 7.785/7.760, 7.825/7.875, 7.843/7.813, 7.852/7.787, 7.782/7.756 ms (5 of 6
/// faster), pair medians 0.918-0.925 / 0.920-0.929; t2 pair medians 0.939/0.947, 0.937/0.939,
/// 0.937/0.946, 0.937/0.949; quiet 11:52:55: t1 pass 7.769/7.693, 7.700/7.629, 7.735/7.681.
/// 2, 3 and 6 periods read level with 1 (quiet 11:51:31, 11:52:47, 11:55:40).
const PF0_PERIODS: isize = 4;

/// The rows run after the C tile is prefetched (as the plain kernel's 8 rounds of 4 steps).
const C_PREFETCH_ROWS: usize = 32;

/// The full `8 × 48` tile of `avx512-f32-8x48` whose B micro-panel is an im2col-like source
/// ([`super::Kernel::run_packing_conv`]): row `p` (`p < k`) is `rows[p % period]` read at `src
/// + (p / period) · step` bytes (three masked 16-lane loads at the row's offset, + 64, + 128
/// bytes), stored to `bdst + 48 · p` and multiplied with A's row `p` in the registers.
///
/// # Safety
/// As [`super::Kernel::run`] with `m = 8`, `n <= 48` and `b` replaced by: `period >= 1`
/// entries at `rows`; every lane a row's masks select readable at its offset (masked-off
/// lanes are never read); `k · 48` writable values at `bdst` that overlap neither the
/// source, A nor C; the CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn avx512_ukr_conv_asm(
    k: usize,
    alpha: f32,
    a: *const f32,
    src: *const f32,
    rows: *const ConvRow,
    period: usize,
    step: isize,
    bdst: *mut f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    m: usize,
    n: usize,
) {
    debug_assert!(m == 8 && n <= 48 && period >= 1);
    // SAFETY: avx512f per the caller. The asm reads `k` rows of A (8 values each), the
    // `period` entries at `rows` and, per row, the lanes its masks select at the caller's
    // checked offsets (masked-off lanes do not fault); it writes `k · 48` values at `bdst`
    // (the caller's exclusive buffer), only the registers it declares, and touches no stack;
    // prefetches never fault; the C window is the caller's.
    unsafe {
        let mut c24 = [_mm512_setzero_ps(); 24];
        let (mut ap, mut bp, mut sp, mut tp, mut cnt) = (a, bdst, src, rows, period);
        let tail = k.min(C_PREFETCH_ROWS);
        let head = k - tail;
        if head > 0 {
            conv_loop!(head, ap, bp, sp, tp, cnt, rows, period, step, c24);
        }
        super::skx::prefetch_c(c, rs_c, cs_c, m, n);
        if tail > 0 {
            conv_loop!(tail, ap, bp, sp, tp, cnt, rows, period, step, c24);
        }
        let _ = (ap, bp, sp, tp, cnt);
        let acc: [[__m512; 3]; 8] = core::mem::transmute(c24);
        super::store_acc::<V512, 8, 3>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
    }
}

/// [`avx512_ukr_conv_asm`] for step-2 rows: row `p` (`p < k`) is `rows[p % period]`
/// ([`ConvRow2`]: per chunk two pieces read every other value) at `src + (p / period) · step`
/// bytes, stored to `bdst + 48 · p` and multiplied with A's row `p` in the registers.
///
/// # Safety
/// As [`avx512_ukr_conv_asm`], with `period >= 1` [`ConvRow2`] entries at `rows` and every
/// lane their masks select readable at its piece's offset.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn avx512_ukr_conv2_asm(
    k: usize,
    alpha: f32,
    a: *const f32,
    src: *const f32,
    rows: *const ConvRow2,
    period: usize,
    step: isize,
    bdst: *mut f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    m: usize,
    n: usize,
) {
    debug_assert!(m == 8 && n <= 48 && period >= 1);
    // SAFETY: avx512f per the caller. The asm reads `k` rows of A (8 values each), the
    // `period` entries at `rows` and, per row, the lanes its masks select at the caller's
    // checked offsets (masked-off lanes do not fault); it writes `k · 48` values at `bdst`
    // (the caller's exclusive buffer), only the registers it declares, and touches no stack;
    // prefetches never fault; the C window is the caller's.
    unsafe {
        let idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let idx = _mm512_castsi512_ps(idx);
        let mut c24 = [_mm512_setzero_ps(); 24];
        let (mut ap, mut bp, mut sp, mut tp, mut cnt) = (a, bdst, src, rows, period);
        // The source `PF0_PERIODS` periods on (its windows prefetched that far ahead;
        // prefetches never fault).
        let mut s2 = src.wrapping_byte_offset(step.wrapping_mul(PF0_PERIODS));
        let tail = k.min(C_PREFETCH_ROWS);
        let head = k - tail;
        if head > 0 {
            conv_loop2!(head, ap, bp, sp, s2, tp, cnt, rows, period, step, idx, c24);
        }
        super::skx::prefetch_c(c, rs_c, cs_c, m, n);
        if tail > 0 {
            conv_loop2!(tail, ap, bp, sp, s2, tp, cnt, rows, period, step, idx, c24);
        }
        let _ = (ap, bp, sp, s2, tp, cnt);
        let acc: [[__m512; 3]; 8] = core::mem::transmute(c24);
        super::store_acc::<V512, 8, 3>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
    }
}

#[cfg(test)]
mod tests {
    use super::super::Kernel;
    use super::super::convpack::{ConvRow, ConvRow2, ConvRowForm};
    use super::super::x86::Avx512;

    /// A panel of rows `R` checked on both forms of [`super::super::Kernel::run_packing_conv`]
    /// of `avx512-f32-8x48`: its fused tile (`R::AVX512_TILE`, 8 rows of A) and the two-step
    /// fallback ([`super::super::conv_then_run`], on 8 rows and on the partial-row tiles' `m`
    /// of `1 + case % 7`), over `rows` (one period) and `src`, stepping `step` values a
    /// period, with A (k × 8) and C (an 8 × 48 window of an 8 × 50 × 9 buffer, unit or
    /// non-unit column stride; NaN where beta = 0) random and alpha / beta by `case`; the
    /// packed panel must equal `want_b` and C the naive product on its first `m` rows (the
    /// others untouched), bit for bit.
    ///
    /// # Safety
    /// avx512f is present, and every lane that `rows`' masks select at a depth below `k` lies
    /// inside `src`.
    unsafe fn check_tile<R: ConvRowForm>(
        case: usize,
        k: usize,
        want_b: &[f32],
        rnd: &mut impl FnMut(u64) -> u64,
        src: &[f32],
        rows: &[R],
        step: isize,
    ) {
        let a: Vec<f32> = (0..k * 8).map(|_| rnd(5) as f32 - 2.0).collect();
        let (alpha, beta) = [(1.0f32, 0.0f32), (2.0, 1.0), (-1.0, 3.0)][case % 3];
        let cs = if case % 4 == 3 { 9 } else { 1 };
        let rs = if cs == 1 { 50 } else { 1 };
        let c0: Vec<f32> = (0..8 * 50 * 9)
            .map(|_| {
                if beta == 0.0 {
                    f32::NAN
                } else {
                    rnd(9) as f32 - 4.0
                }
            })
            .collect();
        let kern = <Avx512 as Kernel>::new().expect("avx512f checked by the caller");
        for (fused, m) in [(true, 8), (false, 8), (false, 1 + case % 7)] {
            let mut want_c = c0.clone();
            for i in 0..m {
                for j in 0..48 {
                    let mut acc = 0f32;
                    for p in 0..k {
                        acc += a[p * 8 + i] * want_b[p * 48 + j];
                    }
                    let at = i * rs + j * cs;
                    let old = if beta == 0.0 { 0.0 } else { beta * c0[at] };
                    want_c[at] = alpha * acc + old;
                }
            }
            let mut c = c0.clone();
            let mut dst = vec![f32::NAN; k * 48];
            let (ap, sp, rp, per) = (a.as_ptr(), src.as_ptr(), rows.as_ptr(), rows.len());
            let (dp, cp) = (dst.as_mut_ptr(), c.as_mut_ptr());
            // SAFETY: the caller's contract for the CPU and the source; A holds k · 8 values,
            // `dst` k · 48, and the m × 48 window of `c` (strides rs, cs) lies inside its
            // 8 · 50 · 9.
            unsafe {
                if fused {
                    R::AVX512_TILE(
                        k,
                        alpha,
                        ap,
                        sp,
                        rp,
                        per,
                        4 * step,
                        dp,
                        beta,
                        cp,
                        rs,
                        cs,
                        m,
                        48,
                    )
                } else {
                    super::super::conv_then_run(
                        kern,
                        k,
                        alpha,
                        ap,
                        sp,
                        rp,
                        per,
                        4 * step,
                        dp,
                        beta,
                        cp,
                        rs,
                        cs,
                        m,
                    )
                }
            };
            assert_eq!(
                dst, want_b,
                "packed panel, case {case}, fused {fused}, m {m}"
            );
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&c),
                bits(&want_c),
                "C, case {case}, fused {fused}, m {m}"
            );
        }
    }

    /// The step-2 fused tile and its two-step fallback against a naive product on a panel described row by row (per
    /// chunk two random disjoint pieces reading every other value, their window masks as
    /// `ConvRows` builds them, in some chunks piece 1's window read whole with piece 2 merged
    /// over it; random offsets, periods and source steps), and its packed
    /// panel against the lanes it describes; depths around the C-prefetch split, alpha / beta
    /// cases, unit and non-unit column strides of C.
    #[test]
    fn conv2_tile_matches_naive() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let spread = |m: u16| {
            (0..8)
                .filter(|l| m >> l & 1 == 1)
                .fold(0u16, |a, l| a | 1 << (2 * l))
        };
        let len = 9000usize;
        let src: Vec<f32> = (0..len).map(|i| (i % 11) as f32 - 5.0).collect();
        for case in 0..80 {
            let k = [0usize, 1, 3, 4, 5, 17, 27, 31, 32, 33, 64, 131][case % 12];
            let period = 1 + rnd(27) as usize;
            let step = rnd(40) as isize;
            // Per row and chunk: lanes of piece 1, of piece 2, their element offsets.
            let desc: Vec<[(u16, u16, isize, isize); 3]> = (0..period)
                .map(|_| {
                    std::array::from_fn(|_| {
                        let m = if case % 5 == 0 && rnd(2) == 0 {
                            0
                        } else {
                            rnd(1 << 16) as u16
                        };
                        let cut = rnd(17) as u32;
                        let lo = if cut == 16 {
                            u16::MAX
                        } else {
                            (1u16 << cut) - 1
                        };
                        let o1 = 100 + rnd(300) as isize;
                        // Piece 1's window read whole (all lanes, no masks) in some chunks.
                        let m1 = if case % 3 == 1 && rnd(2) == 0 {
                            u16::MAX
                        } else {
                            m & lo
                        };
                        (m1, m & !lo, o1, o1 + rnd(200) as isize)
                    })
                })
                .collect();
            let rows: Vec<ConvRow2> = desc
                .iter()
                .map(|d| {
                    let mut r = ConvRow2::default();
                    for (q, &(m1, m2, o1, o2)) in d.iter().enumerate() {
                        r.off[2 * q] = 4 * o1;
                        r.off[2 * q + 1] = 4 * o2;
                        let (w1, w2) = if m1 == u16::MAX {
                            (u16::MAX, u16::MAX)
                        } else {
                            (spread(m1), spread(m1 >> 8))
                        };
                        r.m[4 * q..4 * q + 4].copy_from_slice(&[
                            w1,
                            w2,
                            spread(m2),
                            spread(m2 >> 8),
                        ]);
                    }
                    r.pf = 4 * rnd(500) as isize;
                    r
                })
                .collect();
            let mut want_b = vec![0f32; k * 48];
            for p in 0..k {
                let shift = (p / period) as isize * step;
                for (q, &(m1, m2, o1, o2)) in desc[p % period].iter().enumerate() {
                    for l in 0..16 {
                        // Piece 2 merges over piece 1.
                        let at = if m2 & (1 << l) != 0 {
                            Some(o2)
                        } else if m1 & (1 << l) != 0 {
                            Some(o1)
                        } else {
                            None
                        };
                        if let Some(o) = at {
                            want_b[p * 48 + 16 * q + l] =
                                src[(o + shift + 2 * l as isize) as usize];
                        }
                    }
                }
            }
            // SAFETY: avx512f checked above; every lane a mask selects reads
            // `o + (p / period) · step + 2l` <= 600 + 131 · 40 + 30 < 9000, inside `src`.
            unsafe { check_tile(case, k, &want_b, &mut rnd, &src, &rows, step) };
        }
    }

    /// The fused tile and its two-step fallback against a naive product on a panel described
    /// row by row (random masks,
    /// offsets, periods, source steps), and its packed panel against the lanes it describes:
    /// depths around the C-prefetch split, periods longer and shorter than k, alpha / beta
    /// cases (beta = 0 over NaN), unit and non-unit column strides of C.
    #[test]
    fn conv_tile_matches_naive() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let len = 6000usize;
        let src: Vec<f32> = (0..len).map(|i| (i % 7) as f32 - 3.0).collect();
        for case in 0..80 {
            let k = [0usize, 1, 3, 4, 5, 17, 27, 31, 32, 33, 64, 131][case % 12];
            let period = 1 + rnd(27) as usize;
            let step = rnd(40) as isize;
            let rows: Vec<ConvRow> = (0..period)
                .map(|_| {
                    let mut m = [0u16; 3];
                    for x in &mut m {
                        *x = if case % 5 == 0 && rnd(2) == 0 {
                            0
                        } else {
                            rnd(1 << 16) as u16
                        };
                    }
                    ConvRow {
                        off: 4 * (100 + rnd(200) as isize),
                        m,
                        pf: 64 * rnd(12) as u16,
                    }
                })
                .collect();
            // The panel lane by lane.
            let mut want_b = vec![0f32; k * 48];
            for p in 0..k {
                let r = rows[p % period];
                let base = r.off / 4 + (p / period) as isize * step;
                for q in 0..3 {
                    for l in 0..16 {
                        if r.m[q] & (1 << l) != 0 {
                            want_b[p * 48 + 16 * q + l] =
                                src[(base + 16 * q as isize + l as isize) as usize];
                        }
                    }
                }
            }
            // SAFETY: avx512f checked above; every lane a mask selects reads
            // `off / 4 + (p / period) · step + l` <= 300 + 131 · 40 + 48 < 6000, inside `src`.
            unsafe { check_tile(case, k, &want_b, &mut rnd, &src, &rows, step) };
        }
    }
}
