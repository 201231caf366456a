//! The full-tile micro-kernel of `avx512-f32-12x32` with its k-loop in inline assembly, after
//! BLIS's `bli_sgemm_skx_asm_32x12_l2` (mirrored: our B micro-panel is its 32-wide vector side,
//! our A micro-panel its 12-wide broadcast side). The edge tiles keep the intrinsics body
//! ([`super::ukr`]).
//!
//! Per k step: two 512-bit loads of the B row, then for each of the 12 rows of A two FMAs with
//! the row's value broadcast, in one of two forms:
//! - `vbroadcastss` into a register, then two register FMAs: 1 load, 3 fused µops;
//! - two FMAs with an embedded broadcast from memory (`vfmadd231ps zmm, zmm, dword ptr
//!   [..]{1to16}`): 2 loads, 2 fused µops.
//!
//! All-register broadcasts (what LLVM emits for the intrinsics body) issue 38 fused µops per 24
//! FMAs; all-embedded ones 26 µops but 26 loads (over the 2 loads per cycle of 12 FMA cycles).
//! This guest sustains only ~2.2 fused µops per cycle for us (the host's hyperthread sibling
//! shares the front end; `peak`'s FMA loop needs 2.1), so the mix matters: every third row
//! (rows 2, 5, 8, 11) takes the embedded form, 18 loads and 34 fused µops per step, chosen with
//! `examples/ukr_ab.rs` (session 12, PERFORMANCE.md ## core-blas). The 24 accumulators stay in
//! zmm8-zmm31 across the loop; the loop is unrolled by 4 steps. C is prefetched 32 steps before
//! the end of the loop (as BLIS does), not at its start, where the 384 steps of streamed panels
//! that follow evict it from L1 again.

use core::arch::asm;
use core::arch::x86_64::*;

use super::x86::V512;

/// Row `r` of step `u` with a register broadcast: 1 load, 2 FMAs (3 fused µops).
macro_rules! row_bc {
    ($u:literal, $r:literal, $c0:literal, $c1:literal, $b0:literal, $b1:literal) => {
        concat!(
            "vbroadcastss zmm2, dword ptr [{a} + ",
            $u,
            "*48 + ",
            $r,
            "*4]\n",
            "vfmadd231ps zmm",
            $c0,
            ", zmm",
            $b0,
            ", zmm2\n",
            "vfmadd231ps zmm",
            $c1,
            ", zmm",
            $b1,
            ", zmm2\n",
        )
    };
}

/// Row `r` of step `u` with embedded broadcasts: 2 FMAs with a memory operand (2 loads, 2 fused
/// µops).
macro_rules! row_eb {
    ($u:literal, $r:literal, $c0:literal, $c1:literal, $b0:literal, $b1:literal) => {
        concat!(
            "vfmadd231ps zmm",
            $c0,
            ", zmm",
            $b0,
            ", dword ptr [{a} + ",
            $u,
            "*48 + ",
            $r,
            "*4]{{1to16}}\n",
            "vfmadd231ps zmm",
            $c1,
            ", zmm",
            $b1,
            ", dword ptr [{a} + ",
            $u,
            "*48 + ",
            $r,
            "*4]{{1to16}}\n",
        )
    };
}

/// One k step `u` of a round: the B row into zmm`b0` / zmm`b1`, then row `r` of A in form `k_r`
/// ([`row_bc`] or [`row_eb`]) into accumulators zmm(8 + 2r), zmm(9 + 2r).
macro_rules! step {
    ($u:literal, $b0:literal, $b1:literal, [$k0:ident, $k1:ident, $k2:ident, $k3:ident, $k4:ident, $k5:ident, $k6:ident, $k7:ident, $k8:ident, $k9:ident, $k10:ident, $k11:ident]) => {
        concat!(
            "vmovups zmm",
            $b0,
            ", zmmword ptr [{b} + ",
            $u,
            "*128]\n",
            "vmovups zmm",
            $b1,
            ", zmmword ptr [{b} + ",
            $u,
            "*128 + 64]\n",
            $k0!($u, 0, 8, 9, $b0, $b1),
            $k1!($u, 1, 10, 11, $b0, $b1),
            $k2!($u, 2, 12, 13, $b0, $b1),
            $k3!($u, 3, 14, 15, $b0, $b1),
            $k4!($u, 4, 16, 17, $b0, $b1),
            $k5!($u, 5, 18, 19, $b0, $b1),
            $k6!($u, 6, 20, 21, $b0, $b1),
            $k7!($u, 7, 22, 23, $b0, $b1),
            $k8!($u, 8, 24, 25, $b0, $b1),
            $k9!($u, 9, 26, 27, $b0, $b1),
            $k10!($u, 10, 28, 29, $b0, $b1),
            $k11!($u, 11, 30, 31, $b0, $b1),
        )
    };
}

/// `$n >= 1` rounds of 4 k steps on the accumulators `$c` (zmm8-zmm31), rows in the forms
/// `$rows`, advancing `$a` by 4 · 12 and `$b` by 4 · 32 values per round.
macro_rules! kloop {
    ($n:expr, $a:expr, $b:expr, $c:expr, $rows:tt) => {
        asm!(
            ".p2align 5",
            "2:",
            step!(0, 0, 1, $rows),
            step!(1, 4, 5, $rows),
            step!(2, 0, 1, $rows),
            step!(3, 4, 5, $rows),
            "add {a}, 192",
            "add {b}, 512",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) $n => _,
            a = inout(reg) $a,
            b = inout(reg) $b,
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
            out("zmm4") _,
            out("zmm5") _,
            options(nostack, readonly),
        )
    };
}

/// The rounds of 4 steps run after the C tile is prefetched (32 steps, ~400 cycles at peak).
const C_PREFETCH_ROUNDS: usize = 8;

/// The full `12 × 32` tile of `avx512-f32-12x32`: `C[0..12, 0..n] := alpha · Ap · Bp + beta · C`
/// ([`super::Kernel::run`]'s contract with `m = 12`), the k-loop in assembly, the `k % 4` last
/// steps and the store in the intrinsics of [`super::ukr`].
///
/// # Safety
/// As [`super::Kernel::run`] with `m = 12`, `n <= 32`: `k · 12` values behind `a`, `k · 32`
/// behind `b` (no alignment needed); the CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn avx512_ukr_asm(
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
    debug_assert!(m == 12 && n <= 32);
    // SAFETY: avx512f per the caller. The asm reads 4 · rounds <= k steps of the panels (12 and
    // 32 values per step, unaligned loads), writes only the registers it declares and touches
    // no stack; prefetches never fault; the C window is the caller's.
    unsafe {
        let mut c24 = [_mm512_setzero_ps(); 24];
        let (mut ap, mut bp) = (a, b);
        let rounds = k / 4;
        let tail = rounds.min(C_PREFETCH_ROUNDS);
        let head = rounds - tail;
        if head > 0 {
            kloop!(
                head,
                ap,
                bp,
                c24,
                [
                    row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc,
                    row_bc, row_eb
                ]
            );
        }
        if cs_c == 1 {
            super::prefetch_tile::<V512>(c, rs_c, m, n);
        }
        if tail > 0 {
            kloop!(
                tail,
                ap,
                bp,
                c24,
                [
                    row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc,
                    row_bc, row_eb
                ]
            );
        }
        // Row r of the tile is accumulators 2r and 2r + 1: the layout of `[[__m512; 2]; 12]`.
        let mut acc: [[__m512; 2]; 12] = core::mem::transmute(c24);
        for _ in 0..k % 4 {
            super::step::<V512, 12, 2>(&mut acc, ap, bp);
            ap = ap.add(12);
            bp = bp.add(32);
        }
        super::store_acc::<V512, 12, 2>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
    }
}

/// Probes only ([`crate::__set_ukr_variant`]): 1 runs the full tiles on the intrinsics body
/// instead of [`avx512_ukr_asm`].
pub(crate) static UKR_VARIANT: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel against a naive product (small integers: exact in any order): full and narrow
    /// tiles (n = 17..32), depths around the 4-step unroll and the C-prefetch split, alpha /
    /// beta cases (beta = 0 over NaN), unit and non-unit column strides of C, panels off any
    /// 64-byte boundary.
    #[test]
    fn asm_tile_matches_naive() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        for k in [
            0usize, 1, 3, 4, 5, 7, 8, 31, 32, 33, 35, 36, 37, 40, 64, 385,
        ] {
            let a: Vec<f32> = (0..k * 12 + 1)
                .map(|i| ((i * 7) % 19) as f32 - 9.0)
                .collect();
            let b: Vec<f32> = (0..k * 32 + 1)
                .map(|i| ((i * 5) % 17) as f32 - 8.0)
                .collect();
            let (ap, bp) = (&a[1..], &b[1..]);
            for n in [17usize, 31, 32] {
                for (alpha, beta) in [(1.0f32, 0.0f32), (2.0, 0.0), (1.0, 1.0), (0.5, -1.5)] {
                    for cs in [1usize, 2] {
                        let rs = 40 * cs;
                        let c0: Vec<f32> = (0..12 * rs).map(|i| (i % 11) as f32).collect();
                        let mut c = if beta == 0.0 {
                            vec![f32::NAN; 12 * rs]
                        } else {
                            c0.clone()
                        };
                        // SAFETY: avx512f checked above; k steps of 12 / 32 values behind ap /
                        // bp; the 12 × n window with strides (rs, cs) lies inside `c`.
                        unsafe {
                            avx512_ukr_asm(
                                k,
                                alpha,
                                ap.as_ptr(),
                                bp.as_ptr(),
                                beta,
                                c.as_mut_ptr(),
                                rs,
                                cs,
                                12,
                                n,
                            )
                        };
                        for i in 0..12 {
                            for j in 0..n {
                                let dot: f64 = (0..k)
                                    .map(|t| ap[t * 12 + i] as f64 * bp[t * 32 + j] as f64)
                                    .sum();
                                let mut want = alpha as f64 * dot;
                                if beta != 0.0 {
                                    want += beta as f64 * c0[i * rs + j * cs] as f64;
                                }
                                assert_eq!(
                                    c[i * rs + j * cs] as f64,
                                    want,
                                    "k {k} n {n} alpha {alpha} beta {beta} cs {cs} at ({i}, {j})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
