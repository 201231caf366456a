//! The full-tile micro-kernel of `avx512-f32-8x48` with its k-loop in inline assembly (the
//! layout of BLIS's `bli_sgemm_skx_asm_32x12_l2`, mirrored: our B micro-panel is the vector
//! side, our A micro-panel the broadcast side, but 48 × 8 instead of its 32 × 12). The edge
//! tiles keep the intrinsics body ([`super::ukr`]).
//!
//! Per k step: three 512-bit loads of the B row, then for each of the 8 rows of A three FMAs
//! with the row's value broadcast, in one of two forms:
//! - `vbroadcastss` into a register, then three register FMAs: 1 load, 4 fused µops;
//! - three FMAs with an embedded broadcast from memory (`vfmadd231ps zmm, zmm, dword ptr
//!   [..]{1to16}`): 3 loads, 3 fused µops.
//!
//! This guest sustains only ~2.2 fused µops per cycle for us (the host's hyperthread sibling
//! shares the front end; `peak`'s FMA loop needs 2.1) and, measured, little more than ~1.2 loads
//! per cycle beside it, so both µops and loads per FMA count (session 12: on the 12 × 32 tile of
//! sessions 11-12, all-register 38 µops / 14 loads per 24 FMAs ran at 65-70% of the peak,
//! all-embedded 26 / 26 at 51-58%, every third row embedded 34 / 18 at 77%). Three B vectors per
//! step cut the broadcasts to 8 per 24 FMAs: rows 2, 5 and 7 embedded give 32 fused µops and 17
//! loads per step (variant 0, the default), rows 1, 3, 5, 7 31 and 19 (variant 2 of
//! [`UKR_VARIANT`]). Session 13 (PERFORMANCE.md ## core-blas), standalone loops on streamed
//! panels, quiet 20:37 UTC, medians of 15 at KC 384 / 128: 12 × 32 as in session 12 73.8 /
//! 77.6% of the peak, 8 × 48 rows 2, 5, 7 79.8 / 79.3%, rows 1, 3, 5, 7 73.7 / 82.0%; 6 × 64
//! (4 B loads per step, 6 rows) 65-76%. The 24 accumulators stay in zmm8-zmm31 across the loop;
//! the loop is unrolled by 4 steps. C is prefetched 32 steps before the end of the loop (as BLIS
//! does), not at its start, where the 384 steps of streamed panels that follow evict it from L1
//! again.

use core::arch::asm;
use core::arch::x86_64::*;

use super::x86::V512;

/// Row `r` of step `u` with a register broadcast: 1 load, 3 FMAs (4 fused µops).
macro_rules! row_bc {
    ($u:literal, $r:literal, $c0:literal, $c1:literal, $c2:literal, $b0:literal, $b1:literal, $b2:literal) => {
        concat!(
            "vbroadcastss zmm2, dword ptr [{a} + ",
            $u,
            "*32 + ",
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
            "vfmadd231ps zmm",
            $c2,
            ", zmm",
            $b2,
            ", zmm2\n",
        )
    };
}

/// Row `r` of step `u` with embedded broadcasts: 3 FMAs with a memory operand (3 loads, 3 fused
/// µops).
macro_rules! row_eb {
    ($u:literal, $r:literal, $c0:literal, $c1:literal, $c2:literal, $b0:literal, $b1:literal, $b2:literal) => {
        concat!(
            "vfmadd231ps zmm",
            $c0,
            ", zmm",
            $b0,
            ", dword ptr [{a} + ",
            $u,
            "*32 + ",
            $r,
            "*4]{{1to16}}\n",
            "vfmadd231ps zmm",
            $c1,
            ", zmm",
            $b1,
            ", dword ptr [{a} + ",
            $u,
            "*32 + ",
            $r,
            "*4]{{1to16}}\n",
            "vfmadd231ps zmm",
            $c2,
            ", zmm",
            $b2,
            ", dword ptr [{a} + ",
            $u,
            "*32 + ",
            $r,
            "*4]{{1to16}}\n",
        )
    };
}

/// One k step `u` of a round: the B row into zmm`b0..b2`, then row `r` of A in form `k_r`
/// ([`row_bc`] or [`row_eb`]) into accumulators zmm(8 + 3r) ..= zmm(10 + 3r).
macro_rules! step {
    ($u:literal, $b0:literal, $b1:literal, $b2:literal, [$k0:ident, $k1:ident, $k2:ident, $k3:ident, $k4:ident, $k5:ident, $k6:ident, $k7:ident]) => {
        concat!(
            "vmovups zmm",
            $b0,
            ", zmmword ptr [{b} + ",
            $u,
            "*192]\n",
            "vmovups zmm",
            $b1,
            ", zmmword ptr [{b} + ",
            $u,
            "*192 + 64]\n",
            "vmovups zmm",
            $b2,
            ", zmmword ptr [{b} + ",
            $u,
            "*192 + 128]\n",
            $k0!($u, 0, 8, 9, 10, $b0, $b1, $b2),
            $k1!($u, 1, 11, 12, 13, $b0, $b1, $b2),
            $k2!($u, 2, 14, 15, 16, $b0, $b1, $b2),
            $k3!($u, 3, 17, 18, 19, $b0, $b1, $b2),
            $k4!($u, 4, 20, 21, 22, $b0, $b1, $b2),
            $k5!($u, 5, 23, 24, 25, $b0, $b1, $b2),
            $k6!($u, 6, 26, 27, 28, $b0, $b1, $b2),
            $k7!($u, 7, 29, 30, 31, $b0, $b1, $b2),
        )
    };
}

/// `asm!` on the 8 × 48 tile's registers, shared by `kloop!` and `kloop_pk!`: the templates
/// and named operands in brackets, then the 24 accumulators `$c` (zmm8-zmm31, in and out), the
/// B rows and broadcasts zmm0-zmm6 as scratch, and the options.
macro_rules! tile_asm {
    ([$($body:tt)*], $c:expr, $opts:ident $o:tt) => {
        asm!(
            $($body)*
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
            out("zmm4") _,
            out("zmm5") _,
            out("zmm6") _,
            $opts $o,
        )
    };
}

/// `$n >= 1` rounds of 4 k steps on the accumulators `$c` (zmm8-zmm31), rows in the forms
/// `$rows`, advancing `$a` by 4 · 8 and `$b` by 4 · 48 values per round.
macro_rules! kloop {
    ($n:expr, $a:expr, $b:expr, $c:expr, $rows:tt) => {
        tile_asm!([
            ".p2align 5",
            "2:",
            step!(0, 0, 1, 3, $rows),
            step!(1, 4, 5, 6, $rows),
            step!(2, 0, 1, 3, $rows),
            step!(3, 4, 5, 6, $rows),
            "add {a}, 128",
            "add {b}, 768",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) $n => _,
            a = inout(reg) $a,
            b = inout(reg) $b,
        ],
        $c,
        options(nostack, readonly))
    };
}

/// One k step `u` of a packing round (`kloop_pk!`): the B row read from the source row `u`
/// of the round (`{s}`, `{s} + {l}`, `{s} + 2·{l}`, `{s} + {l3}`: `{l}` is the source's row
/// stride in bytes, `{l3}` three of them) into zmm`b0..b2` and stored to the packed panel at
/// `{b} + u · 192`, then the rows of A as in [`step`].
macro_rules! step_pk {
    ($u:literal, $src:literal, $b0:literal, $b1:literal, $b2:literal, [$k0:ident, $k1:ident, $k2:ident, $k3:ident, $k4:ident, $k5:ident, $k6:ident, $k7:ident]) => {
        concat!(
            "vmovups zmm",
            $b0,
            ", zmmword ptr [",
            $src,
            "]\n",
            "vmovups zmm",
            $b1,
            ", zmmword ptr [",
            $src,
            " + 64]\n",
            "vmovups zmm",
            $b2,
            ", zmmword ptr [",
            $src,
            " + 128]\n",
            "vmovups zmmword ptr [{b} + ",
            $u,
            "*192], zmm",
            $b0,
            "\n",
            "vmovups zmmword ptr [{b} + ",
            $u,
            "*192 + 64], zmm",
            $b1,
            "\n",
            "vmovups zmmword ptr [{b} + ",
            $u,
            "*192 + 128], zmm",
            $b2,
            "\n",
            $k0!($u, 0, 8, 9, 10, $b0, $b1, $b2),
            $k1!($u, 1, 11, 12, 13, $b0, $b1, $b2),
            $k2!($u, 2, 14, 15, 16, $b0, $b1, $b2),
            $k3!($u, 3, 17, 18, 19, $b0, $b1, $b2),
            $k4!($u, 4, 20, 21, 22, $b0, $b1, $b2),
            $k5!($u, 5, 23, 24, 25, $b0, $b1, $b2),
            $k6!($u, 6, 26, 27, 28, $b0, $b1, $b2),
            $k7!($u, 7, 29, 30, 31, $b0, $b1, $b2),
        )
    };
}

/// `kloop!` whose B rows come from a row-major source `$s` (row stride `$l` bytes) and are
/// written to the packed panel `$b` as they are used: the first tile of a micro-panel packs it
/// while its FMAs run (the loads and stores fill issue slots the FMAs leave free) instead of a
/// separate packing pass over the block. Rows 2, 5, 7 embedded (variant 0).
macro_rules! kloop_pk {
    ($n:expr, $a:expr, $b:expr, $s:expr, $l:expr, $c:expr) => {
        tile_asm!([
            ".p2align 5",
            "2:",
            step_pk!(0, "{s}", 0, 1, 3, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            step_pk!(1, "{s} + {l}", 4, 5, 6, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            step_pk!(2, "{s} + {l}*2", 0, 1, 3, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            step_pk!(3, "{s} + {l3}", 4, 5, 6, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            "lea {s}, [{s} + {l}*4]",
            "add {a}, 128",
            "add {b}, 768",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) $n => _,
            a = inout(reg) $a,
            b = inout(reg) $b,
            s = inout(reg) $s,
            l = in(reg) $l,
            l3 = in(reg) 3 * $l,
        ],
        $c,
        options(nostack))
    };
}

/// `prefetcht0` of the 48-value source row at `$at`: its bytes at `+0`, `+64`, `+128` and
/// `+188` (the row's 3 or 4 lines).
macro_rules! pf_row {
    ($at:literal) => {
        concat!(
            "prefetcht0 byte ptr [",
            $at,
            "]\n",
            "prefetcht0 byte ptr [",
            $at,
            " + 64]\n",
            "prefetcht0 byte ptr [",
            $at,
            " + 128]\n",
            "prefetcht0 byte ptr [",
            $at,
            " + 188]\n",
        )
    };
}

/// `kloop_pk!` that also prefetches (`prefetcht0`) the source row [`PK_L1_ROWS`] rows ahead of
/// each row it packs (`{t}`, advanced as `{s}`; `pf_row!`).
macro_rules! kloop_pk_l1 {
    ($n:expr, $a:expr, $b:expr, $s:expr, $l:expr, $t:expr, $c:expr) => {
        tile_asm!([
            ".p2align 5",
            "2:",
            pf_row!("{t}"),
            step_pk!(0, "{s}", 0, 1, 3, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            pf_row!("{t} + {l}"),
            step_pk!(1, "{s} + {l}", 4, 5, 6, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            pf_row!("{t} + {l}*2"),
            step_pk!(2, "{s} + {l}*2", 0, 1, 3, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            pf_row!("{t} + {l3}"),
            step_pk!(3, "{s} + {l3}", 4, 5, 6, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            "lea {s}, [{s} + {l}*4]",
            "lea {t}, [{t} + {l}*4]",
            "add {a}, 128",
            "add {b}, 768",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) $n => _,
            a = inout(reg) $a,
            b = inout(reg) $b,
            s = inout(reg) $s,
            t = inout(reg) $t,
            l = in(reg) $l,
            l3 = in(reg) 3 * $l,
        ],
        $c,
        options(nostack))
    };
}

/// How many rows ahead of the row it packs [`avx512_ukr_asm_pk`] prefetches its source into L1
/// when asked to (Intel, [`crate::isa::intel`]). The panel's source rows lie in different
/// pages (4 KiB apart or more), so no hardware prefetcher brings them into L1 and each row's
/// loads waited on L2 or beyond. Session 40 (PERFORMANCE.md), Emerald Rapids, `ukr_ab 64 50176
/// 576` in process, variants interleaved per repetition, medians of 11, without / with: 16 rows
/// 43.6 / 50.3, 52.3 / 60.2% of the peak (quiet 14:47:52, 14:51:14); 8 rows 42.2 / 48.4, 24
/// rows 49.6 / 55.0, 32 rows 47.5 / 54.4%; 2048³ 80.9 / 79.5%, 256×3136×2304 74.8 / 75.3%.
const PK_L1_ROWS: usize = 16;

/// `kloop!` (row forms of variant 0) that also prefetches (`prefetcht2`) the rows of a
/// row-major source, one row every `{per}` rounds from the first round on: its bytes at `{p}`,
/// `+64`, `+128` and `+{e}` (its last byte, so a row off a line boundary is covered), then
/// `{p} += {l}` (the row stride in bytes).
macro_rules! kloop_pf {
    ($n:expr, $a:expr, $b:expr, $c:expr, $p:expr, $l:expr, $e:expr, $per:expr) => {
        tile_asm!([
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
            step!(0, 0, 1, 3, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            step!(1, 4, 5, 6, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            step!(2, 0, 1, 3, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            step!(3, 4, 5, 6, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            "add {a}, 128",
            "add {b}, 768",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) $n => _,
            a = inout(reg) $a,
            b = inout(reg) $b,
            p = inout(reg) $p => _,
            q = out(reg) _,
            l = in(reg) $l,
            e = in(reg) $e,
            per = in(reg) $per,
        ],
        $c,
        options(nostack, readonly))
    };
}

/// `kloop!` (row forms of variant 0) that also copies rows of a row-major source into a packed
/// panel: one row every `{per}` rounds from the first round on, its 48 values from `{p}` (three
/// 512-bit loads into zmm0, zmm1, zmm3, which the round's first step loads again) to `{d}`,
/// after a `prefetcht0` of the row `{pd}` bytes further (`+0`, `+64`, `+128`, `+188`), then
/// `{p} += {l}`, `{d} += 192`.
macro_rules! kloop_cp {
    ($n:expr, $a:expr, $b:expr, $c:expr, $p:expr, $d:expr, $l:expr, $pd:expr, $pf:expr, $per:expr) => {
        tile_asm!([
            "mov {q}, 1",
            ".p2align 5",
            "2:",
            "dec {q}",
            "jnz 3f",
            "prefetcht0 byte ptr [{p} + {pd}]",
            "prefetcht0 byte ptr [{p} + {pd} + 64]",
            "prefetcht0 byte ptr [{p} + {pd} + 128]",
            "prefetcht0 byte ptr [{p} + {pd} + 188]",
            "prefetcht2 byte ptr [{p} + {pf}]",
            "prefetcht2 byte ptr [{p} + {pf} + 64]",
            "prefetcht2 byte ptr [{p} + {pf} + 128]",
            "prefetcht2 byte ptr [{p} + {pf} + 188]",
            "vmovups zmm0, zmmword ptr [{p}]",
            "vmovups zmm1, zmmword ptr [{p} + 64]",
            "vmovups zmm3, zmmword ptr [{p} + 128]",
            "vmovups zmmword ptr [{d}], zmm0",
            "vmovups zmmword ptr [{d} + 64], zmm1",
            "vmovups zmmword ptr [{d} + 128], zmm3",
            "add {p}, {l}",
            "add {d}, 192",
            "mov {q}, {per}",
            "3:",
            step!(0, 0, 1, 3, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            step!(1, 4, 5, 6, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            step!(2, 0, 1, 3, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            step!(3, 4, 5, 6, [row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb]),
            "add {a}, 128",
            "add {b}, 768",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) $n => _,
            a = inout(reg) $a,
            b = inout(reg) $b,
            p = inout(reg) $p,
            d = inout(reg) $d,
            q = out(reg) _,
            l = in(reg) $l,
            pd = in(reg) $pd,
            pf = in(reg) $pf,
            per = in(reg) $per,
        ],
        $c,
        options(nostack))
    };
}

/// Prefetches (`prefetcht0`) the `m × n` C tile at `c` (row stride `rs_c`) before the last
/// rounds of a k-loop, when its rows are contiguous (`cs_c == 1`): each row's 3 cache lines (4
/// when it straddles a 64-byte boundary). The tiles of this family and of `skx_conv` call it.
#[inline(always)]
pub(crate) fn prefetch_c(c: *mut f32, rs_c: usize, cs_c: usize, m: usize, n: usize) {
    if cs_c == 1 {
        for r in 0..m {
            let row = c.wrapping_add(r * rs_c);
            for j in [0, 16, 32, n.max(1) - 1] {
                // SAFETY: prefetch has no architectural effect and never faults (any address);
                // SSE is in the x86_64 baseline.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(j).cast()) };
            }
        }
    }
}

/// Whether a tile asked to stream C ([`super::Kernel::run_prefetching`]'s `stream`) writes it
/// with non-temporal stores: a full `8 × 48` tile written, not updated (`beta == 0`), whose
/// rows start on cache lines (`vmovntps` needs 64-byte alignment), so each row is three whole
/// lines and no line is read for ownership.
#[inline(always)]
fn streams(
    stream: bool,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    m: usize,
    n: usize,
) -> bool {
    stream
        && beta == 0.0
        && m == 8
        && n == 48
        && cs_c == 1
        && (c as usize).is_multiple_of(64)
        && rs_c.is_multiple_of(16)
}

/// `C[0..8, 0..48] := alpha · acc` with non-temporal stores (`vmovntps`): the lines go to
/// memory through the write-combining buffers without being read first. The driver fences
/// (`sfence`) before the product returns.
///
/// # Safety
/// [`streams`] holds for `c`, `rs_c`; the window is the caller's; the CPU has AVX-512F.
#[inline(always)]
unsafe fn store_stream(acc: &[[__m512; 3]; 8], alpha: f32, c: *mut f32, rs_c: usize) {
    // SAFETY: per the caller: 8 rows of 48 values at c + r · rs_c, each 64-byte aligned.
    unsafe {
        let va = _mm512_set1_ps(alpha);
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                let x = if alpha == 1.0 {
                    x
                } else {
                    _mm512_mul_ps(x, va)
                };
                _mm512_stream_ps(c.add(r * rs_c + 16 * v), x);
            }
        }
    }
}

/// The rounds of 4 steps run after the C tile is prefetched when C is only written (`beta ==
/// 0`): 32 steps.
const C_PREFETCH_ROUNDS: usize = 8;

/// The same when C is read (`beta != 0`, every pass of k after the first): 96 steps, ~1150
/// cycles at Zen 5's full-rate 512-bit FMA (~270 ns at the ~4.2 GHz its peak implies), against
/// the ~380 of 32 steps, which on Zen 5 is less than a C line's trip from DRAM (2048³'s C, 16
/// MiB, does not stay in L3 beside the B block); the update's loads of C then stalled the
/// tile's store (perf: ~4% of the kernel's samples on the store's `vaddps`/`vmovups`). With
/// `beta == 0` the longer lead was level or worse (64×50176×576, `Vec` / 2 MiB pages, at 24
/// rounds -0.6 / -0.8 points, at 48 -3.7 / -3.6), so it keeps 32 steps.
/// Session 38 (PERFORMANCE.md), Zen 5, `ukr_ab` in process (rounds interleaved per repetition,
/// medians of 11), quiet 08:43:21 (one count for both cases) and 08:46:47 (this split):
/// 2048³ 8 / 16 / 24 rounds `Vec` 91.8 / 93.1 / 93.4%, 2 MiB pages 92.9 / 94.4 / 95.2%; split
/// 24 / 8: `Vec` 90.0 → 92.7%, 2 MiB pages 93.5 → 95.4%; 256×3136×2304 (C in L3) 94.1 → 93.7,
/// 94.9 → 94.5% (within its quartiles); 64×50176×576 (one pass, `beta == 0`) unchanged. Across
/// binaries, `gemm_ratio M N K 1 9`, main / this in ABBA order twice, quiet 08:53:21: 2048³
/// `Vec` 90.6/92.8, 92.1/93.5, 92.4/93.7, 92.5/94.0%, 2 MiB pages 92.5/95.7, 93.9/95.2,
/// 92.7/95.1, 92.8/95.6%; 256×3136×2304 and 64×50176×576 level (`Vec` 93.2/92.8, 90.7/90.1,
/// 92.0/93.1, 92.4/92.0%; 2 MiB pages 93.2/93.7, 93.9/93.3, 93.4/93.6, 93.4/93.2%).
const C_PREFETCH_ROUNDS_UPDATE: usize = 24;

/// The rounds of a k-loop run after the C prefetch: [`C_PREFETCH_ROUNDS_UPDATE`] when the tile
/// reads C (`beta != 0`), else [`C_PREFETCH_ROUNDS`]; at most `rounds`.
#[inline(always)]
fn c_prefetch_tail(rounds: usize, beta: f32) -> usize {
    rounds.min(if beta == 0.0 {
        C_PREFETCH_ROUNDS
    } else {
        C_PREFETCH_ROUNDS_UPDATE
    })
}

/// The k-loop's rounds in the row forms of variant `v` (0: rows 2, 5, 7 embedded; 2: rows 1, 3,
/// 5, 7).
macro_rules! kloop_variant {
    ($v:expr, $n:expr, $a:expr, $b:expr, $c:expr) => {
        if $v == 2 {
            kloop!(
                $n,
                $a,
                $b,
                $c,
                [
                    row_bc, row_eb, row_bc, row_eb, row_bc, row_eb, row_bc, row_eb
                ]
            );
        } else {
            kloop!(
                $n,
                $a,
                $b,
                $c,
                [
                    row_bc, row_bc, row_eb, row_bc, row_bc, row_eb, row_bc, row_eb
                ]
            );
        }
    };
}

/// The full `8 × 48` tile of `avx512-f32-8x48`: `C[0..8, 0..n] := alpha · Ap · Bp + beta · C`
/// ([`super::Kernel::run`]'s contract with `m = 8`), the k-loop in assembly in the row forms of
/// variant `v` ([`UKR_VARIANT`]: 2 rows 1, 3, 5, 7 embedded, else rows 2, 5, 7; the caller
/// passes it, so a test picks its variant per call without touching the global), the `k % 4`
/// last steps and the store in the intrinsics of [`super::ukr`].
///
/// # Safety
/// As [`super::Kernel::run`] with `m = 8`, `n <= 48`: `k · 8` values behind `a`, `k · 48`
/// behind `b` (no alignment needed); the CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn avx512_ukr_asm(
    v: u8,
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
    debug_assert!(m == 8 && n <= 48);
    // SAFETY: avx512f per the caller. The asm reads 4 · rounds <= k steps of the panels (8 and
    // 48 values per step, unaligned loads), writes only the registers it declares and touches
    // no stack; prefetches never fault; the C window is the caller's.
    unsafe {
        let mut c24 = [_mm512_setzero_ps(); 24];
        let (mut ap, mut bp) = (a, b);
        let rounds = k / 4;
        let tail = c_prefetch_tail(rounds, beta);
        let head = rounds - tail;
        if head > 0 {
            kloop_variant!(v, head, ap, bp, c24);
        }
        prefetch_c(c, rs_c, cs_c, m, n);
        if tail > 0 {
            kloop_variant!(v, tail, ap, bp, c24);
        }
        // Row r of the tile is accumulators 3r ..= 3r + 2: the layout of `[[__m512; 3]; 8]`.
        let mut acc: [[__m512; 3]; 8] = core::mem::transmute(c24);
        for _ in 0..k % 4 {
            super::step::<V512, 8, 3>(&mut acc, ap, bp);
            ap = ap.add(8);
            bp = bp.add(48);
        }
        super::store_acc::<V512, 8, 3>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
    }
}

/// [`avx512_ukr_asm`] (row forms of variant 0) that also prefetches `pf`
/// ([`super::Kernel::run_prefetching`]): one source row every `ceil(head / rows)` rounds of the
/// k-loop's rounds before the C prefetch (`head`), the rows left over (`rows > head`) up front.
///
/// # Safety
/// As [`avx512_ukr_asm`]; `1 <= pf.width <= 48` (a row is at most 4 cache lines).
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn avx512_ukr_asm_pf(
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
    debug_assert!(m == 8 && n <= 48 && (1..=48).contains(&pf.width));
    // SAFETY: avx512f per the caller. The asm reads 4 · rounds <= k steps of the panels (8 and
    // 48 values per step, unaligned loads), writes only the registers it declares and touches
    // no stack; prefetches never fault (any address); the C window is the caller's.
    unsafe {
        let mut c24 = [_mm512_setzero_ps(); 24];
        let (mut ap, mut bp) = (a, b);
        let rounds = k / 4;
        let tail = c_prefetch_tail(rounds, beta);
        let head = rounds - tail;
        let mut done = 0;
        if head > 0 && pf.rows > 0 {
            let per = head.div_ceil(pf.rows);
            // Rounds 1, 1 + per, … <= head prefetch one row each.
            done = head.div_ceil(per);
            kloop_pf!(head, ap, bp, c24, pf.ptr, pf.ld * 4, pf.width * 4 - 1, per);
        } else if head > 0 {
            kloop_variant!(0, head, ap, bp, c24);
        }
        if pf.rows > done {
            super::RowPrefetch {
                ptr: pf.ptr.wrapping_add(done * pf.ld),
                rows: pf.rows - done,
                ..pf
            }
            .issue();
        }
        let nt = streams(stream, beta, c, rs_c, cs_c, m, n);
        if !nt {
            prefetch_c(c, rs_c, cs_c, m, n);
        }
        if tail > 0 {
            kloop_variant!(0, tail, ap, bp, c24);
        }
        let mut acc: [[__m512; 3]; 8] = core::mem::transmute(c24);
        for _ in 0..k % 4 {
            super::step::<V512, 8, 3>(&mut acc, ap, bp);
            ap = ap.add(8);
            bp = bp.add(48);
        }
        if nt {
            store_stream(&acc, alpha, c, rs_c);
        } else {
            super::store_acc::<V512, 8, 3>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
        }
    }
}

/// [`avx512_ukr_asm`] (row forms of variant 0) that also copies `cp`'s rows
/// ([`super::Kernel::run_copying`]): one source row every `ceil(head / rows)` rounds of the
/// k-loop's rounds before the C prefetch (`head`), each after a `prefetcht0` of the row
/// `cp.ahead` rows further (the first `cp.ahead` rows are prefetched up front); the rows left
/// over are copied right after those rounds.
///
/// # Safety
/// As [`avx512_ukr_asm`]; `cp.rows` source rows of 48 readable values at `cp.src + r · cp.ld`
/// and `cp.rows · 48` writable values at `cp.dst`, overlapping neither the source, `a`, `b`
/// nor the C window.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn avx512_ukr_asm_cp(
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
    debug_assert!(m == 8 && n <= 48);
    // SAFETY: avx512f per the caller. The asm reads 4 · rounds <= k steps of the panels (8 and
    // 48 values per step, unaligned loads) and at most `cp.rows` source rows (one per copy,
    // `ceil(head / per) <= rows` copies), writes as many rows of the copy's destination (the
    // caller's exclusive buffer), only the registers it declares, and touches no stack;
    // prefetches never fault (any address); the C window is the caller's.
    unsafe {
        let mut c24 = [_mm512_setzero_ps(); 24];
        let (mut ap, mut bp) = (a, b);
        let (mut sp, mut dp) = (cp.src, cp.dst);
        for r in 0..cp.far.min(cp.rows) {
            let row = sp.wrapping_add(r * cp.ld);
            for j in [0, 16, 32, 47] {
                _mm_prefetch::<_MM_HINT_T2>(row.wrapping_add(j).cast());
            }
        }
        for r in 0..cp.ahead.min(cp.rows) {
            let row = sp.wrapping_add(r * cp.ld);
            for j in [0, 16, 32, 47] {
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(j).cast());
            }
        }
        let rounds = k / 4;
        let tail = c_prefetch_tail(rounds, beta);
        let head = rounds - tail;
        let mut done = 0;
        if head > 0 && cp.rows > 0 {
            let per = head.div_ceil(cp.rows);
            // Rounds 1, 1 + per, … <= head copy one row each: ceil(head / per) <= rows.
            done = head.div_ceil(per);
            let l = cp.ld.wrapping_mul(4);
            let pd = cp.ahead.wrapping_mul(l);
            let pf = cp.far.wrapping_mul(l);
            kloop_cp!(head, ap, bp, c24, sp, dp, l, pd, pf, per);
        } else if head > 0 {
            kloop_variant!(0, head, ap, bp, c24);
        }
        for _ in done..cp.rows {
            for v in 0..3 {
                _mm512_storeu_ps(dp.add(16 * v), _mm512_loadu_ps(sp.add(16 * v)));
            }
            // Past the last row this leaves the source's storage: wrapping, never dereferenced.
            sp = sp.wrapping_add(cp.ld);
            dp = dp.add(48);
        }
        let nt = streams(stream, beta, c, rs_c, cs_c, m, n);
        if !nt {
            prefetch_c(c, rs_c, cs_c, m, n);
        }
        if tail > 0 {
            kloop_variant!(0, tail, ap, bp, c24);
        }
        let mut acc: [[__m512; 3]; 8] = core::mem::transmute(c24);
        for _ in 0..k % 4 {
            super::step::<V512, 8, 3>(&mut acc, ap, bp);
            ap = ap.add(8);
            bp = bp.add(48);
        }
        if nt {
            store_stream(&acc, alpha, c, rs_c);
        } else {
            super::store_acc::<V512, 8, 3>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
        }
    }
}

/// [`avx512_ukr_asm`] on a full `8 × 48` tile whose B micro-panel is read from a row-major
/// source and packed as it goes ([`super::Kernel::run_packing_b`]): row `p` of the panel is the
/// 48 values at `bsrc + p · ldb`, and is written to `bdst + p · 48`.
///
/// With `l1_ahead`, the k-loop also prefetches each source row [`PK_L1_ROWS`] rows ahead into L1
/// (`prefetcht0`; the rows past the panel's last one are hints only, never read).
///
/// # Safety
/// As [`avx512_ukr_asm`] with `m = 8`, `n <= 48`, but `b` replaced by: `k` rows of 48 readable
/// values at `bsrc + p · ldb` and `k · 48` writable values at `bdst` that overlap neither the
/// source, A nor C.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn avx512_ukr_asm_pk(
    l1_ahead: bool,
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
    stream: bool,
) {
    debug_assert!(m == 8 && n <= 48);
    // SAFETY: avx512f per the caller. The asm reads 4 · rounds <= k steps of A (8 values) and
    // of the source (48 values, one row per step), writes the same steps of the packed panel
    // (48 values each, the caller's exclusive buffer), only the registers it declares, and
    // touches no stack; prefetches never fault; the C window is the caller's.
    unsafe {
        let mut c24 = [_mm512_setzero_ps(); 24];
        let (mut ap, mut bp, mut sp) = (a, bdst.cast_const(), bsrc);
        // The asm steps the source by 4 rows a round (only when rounds > 0, when 4 · ldb is
        // within the caller's rows); wrapping, as a stride with k < 4 may be any value.
        let lb = ldb.wrapping_mul(4);
        let rounds = k / 4;
        let tail = c_prefetch_tail(rounds, beta);
        let head = rounds - tail;
        // The prefetch pointer: wrapping, as it runs PK_L1_ROWS rows past the panel's last row.
        let mut tp = bsrc.wrapping_add(PK_L1_ROWS.wrapping_mul(ldb));
        if head > 0 {
            if l1_ahead {
                kloop_pk_l1!(head, ap, bp, sp, lb, tp, c24);
            } else {
                kloop_pk!(head, ap, bp, sp, lb, c24);
            }
        }
        let nt = streams(stream, beta, c, rs_c, cs_c, m, n);
        if !nt {
            prefetch_c(c, rs_c, cs_c, m, n);
        }
        if tail > 0 {
            if l1_ahead {
                kloop_pk_l1!(tail, ap, bp, sp, lb, tp, c24);
            } else {
                kloop_pk!(tail, ap, bp, sp, lb, c24);
            }
        }
        let _ = tp;
        let mut acc: [[__m512; 3]; 8] = core::mem::transmute(c24);
        for _ in 0..k % 4 {
            let bw = bp.cast_mut();
            for v in 0..3 {
                _mm512_storeu_ps(bw.add(16 * v), _mm512_loadu_ps(sp.add(16 * v)));
            }
            super::step::<V512, 8, 3>(&mut acc, ap, bp);
            ap = ap.add(8);
            bp = bp.add(48);
            // Past the last row this leaves the source's storage: wrapping, never dereferenced.
            sp = sp.wrapping_add(ldb);
        }
        if nt {
            store_stream(&acc, alpha, c, rs_c);
        } else {
            super::store_acc::<V512, 8, 3>(&acc, alpha, beta, c, rs_c, cs_c, m, n);
        }
    }
}

/// Probes only ([`crate::__set_ukr_variant`]): 0 (default) the assembly k-loop with rows 2, 5, 7
/// embedded, 1 the intrinsics body instead of [`avx512_ukr_asm`] (and for `avx2-f32-6x16` the
/// compiled bodies instead of its assembly k-loop), 2 the assembly k-loop with rows 1, 3, 5, 7
/// embedded.
pub(crate) static UKR_VARIANT: core::sync::atomic::AtomicU8 = core::sync::atomic::AtomicU8::new(0);

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel against a naive product (small integers: exact in any order), each row-form
    /// variant passed per call (the global [`UKR_VARIANT`] stays untouched, so the tests
    /// running beside this one keep the default kernel): full and narrow tiles (n = 17..32),
    /// depths around the 4-step unroll and both C-prefetch splits (32 and 96 steps), alpha /
    /// beta cases (beta = 0 over NaN), unit and non-unit column strides of C, panels off any
    /// 64-byte boundary.
    #[test]
    fn asm_tile_matches_naive() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        for k in [
            0usize, 1, 3, 4, 5, 7, 8, 31, 32, 33, 35, 36, 37, 40, 64, 95, 96, 97, 99, 100, 385,
        ] {
            for (n, v) in [
                (1usize, 0u8),
                (16, 2),
                (17, 0),
                (33, 2),
                (47, 0),
                (48, 0),
                (48, 2),
            ] {
                let label = format!("v {v} ");
                super::super::assert_tile_matches_naive(
                    (8, 48),
                    k,
                    n,
                    50,
                    &label,
                    |ap, bp, alpha, beta, c, rs, cs| {
                        // SAFETY: avx512f checked above; k steps of 8 / 48 values behind ap /
                        // bp; the 8 × n window with strides (rs, cs) lies inside `c`.
                        unsafe {
                            avx512_ukr_asm(
                                v,
                                k,
                                alpha,
                                ap.as_ptr(),
                                bp.as_ptr(),
                                beta,
                                c.as_mut_ptr(),
                                rs,
                                cs,
                                8,
                                n,
                            )
                        };
                    },
                );
            }
        }
    }

    /// The prefetching kernel against the naive product: the prefetches change nothing
    /// (no rows, fewer rows than the k-loop's rounds, more, widths 1 and 48), depths around the
    /// unroll and the C-prefetch split.
    #[test]
    fn asm_prefetching_tile_matches_naive() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let src = vec![1.0f32; 64 * 1000];
        for k in [0usize, 1, 4, 5, 33, 36, 37, 64, 96, 97, 100, 385] {
            for (rows, width, n) in [
                (0usize, 48usize, 48usize),
                (3, 48, 48),
                (40, 1, 47),
                (500, 48, 33),
            ] {
                let pf = crate::kernel::RowPrefetch {
                    ptr: src.as_ptr(),
                    ld: 61,
                    rows,
                    width,
                };
                super::super::assert_tile_matches_naive(
                    (8, 48),
                    k,
                    n,
                    50,
                    &format!("rows {rows} width {width} "),
                    |ap, bp, alpha, beta, c, rs, cs| {
                        // SAFETY: avx512f checked above; k steps of 8 / 48 values behind ap /
                        // bp; the 8 × n window with strides (rs, cs) lies inside `c`; width <= 48.
                        unsafe {
                            avx512_ukr_asm_pf(
                                k,
                                alpha,
                                ap.as_ptr(),
                                bp.as_ptr(),
                                beta,
                                c.as_mut_ptr(),
                                rs,
                                cs,
                                8,
                                n,
                                pf,
                                false,
                            )
                        };
                    },
                );
            }
        }
    }

    /// The packing kernel against the naive product, reading B from a row-major source with
    /// row stride 53 (off any 64-byte boundary), and its packed panel against the source rows:
    /// depths around the 4-step unroll and both C-prefetch splits (32 and 96 steps), alpha /
    /// beta cases (beta = 0 over NaN), unit and non-unit column strides of C.
    #[test]
    fn asm_packing_tile_matches_naive() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let ldb = 53;
        for (k, l1_ahead) in [
            0usize, 1, 3, 4, 5, 31, 32, 33, 36, 37, 64, 95, 96, 97, 100, 385,
        ]
        .into_iter()
        .flat_map(|k| [(k, false), (k, true)])
        {
            super::super::assert_tile_matches_naive(
                (8, 48),
                k,
                48,
                50,
                &format!("packing l1_ahead {l1_ahead} "),
                |ap, bp, alpha, beta, c, rs, cs| {
                    let mut src = vec![f32::NAN; k * ldb + 1];
                    for p in 0..k {
                        src[1 + p * ldb..][..48].copy_from_slice(&bp[p * 48..][..48]);
                    }
                    let mut dst = vec![f32::NAN; k * 48];
                    // SAFETY: avx512f checked above; k steps of 8 values behind ap, k source
                    // rows of 48 values (row stride ldb) behind src[1..], k · 48 values in dst
                    // (its own allocation); the 8 × 48 window with strides (rs, cs) lies inside
                    // `c`.
                    unsafe {
                        avx512_ukr_asm_pk(
                            l1_ahead,
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
                            8,
                            48,
                            false,
                        )
                    };
                    assert_eq!(
                        dst,
                        bp[..k * 48],
                        "packed panel, k {k}, l1_ahead {l1_ahead}"
                    );
                },
            );
        }
    }

    /// The copying kernel against the naive product, and its copied rows against the source
    /// (row stride 61, off any 64-byte boundary): no rows, fewer rows than the k-loop's rounds
    /// before the C prefetch, more (the rest copied after them), depths around the unroll and
    /// the C-prefetch split, prefetch distances 0 and past the rows.
    #[test]
    fn asm_copying_tile_matches_naive() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let ld = 61;
        for k in [0usize, 1, 4, 5, 33, 36, 37, 64, 96, 97, 100, 385] {
            for (rows, ahead, far) in [
                (0usize, 4usize, 0usize),
                (3, 0, 0),
                (40, 4, 16),
                (97, 2, 32),
            ] {
                let src: Vec<f32> = (0..rows * ld + 48).map(|i| (i % 23) as f32).collect();
                super::super::assert_tile_matches_naive(
                    (8, 48),
                    k,
                    48,
                    50,
                    &format!("copying rows {rows} ahead {ahead} far {far} "),
                    |ap, bp, alpha, beta, c, rs, cs| {
                        let mut dst = vec![f32::NAN; rows * 48];
                        let cp = crate::kernel::RowCopy {
                            src: src[1..].as_ptr(),
                            ld,
                            dst: dst.as_mut_ptr(),
                            rows,
                            ahead,
                            far,
                        };
                        // SAFETY: avx512f checked above; k steps of 8 / 48 values behind ap /
                        // bp; the 8 × 48 window with strides (rs, cs) lies inside `c`; `rows`
                        // rows of 48 values (stride ld) in src[1..], rows · 48 values in dst.
                        unsafe {
                            avx512_ukr_asm_cp(
                                k,
                                alpha,
                                ap.as_ptr(),
                                bp.as_ptr(),
                                beta,
                                c.as_mut_ptr(),
                                rs,
                                cs,
                                8,
                                48,
                                cp,
                                false,
                            )
                        };
                        for r in 0..rows {
                            assert_eq!(
                                dst[r * 48..][..48],
                                src[1 + r * ld..][..48],
                                "copied row {r} of {rows}, k {k}"
                            );
                        }
                    },
                );
            }
        }
    }

    /// Streamed C (`stream`): the prefetching and packing tiles write the same values as
    /// without it, bit for bit, into a 64-byte-aligned C (rows 64 values apart: the
    /// non-temporal path) and one value past it (the fallback), over NaN (beta = 0) with alpha
    /// 1 and 2, and leave the values around the window untouched; beta = 1 (never streamed)
    /// reads C.
    #[test]
    fn streamed_tiles_match_stored() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let (k, rs, ldb) = (37usize, 64usize, 53usize);
        let a: Vec<f32> = (0..k * 8).map(|i| ((i * 7) % 19) as f32 - 9.0).collect();
        let src: Vec<f32> = (0..k * ldb).map(|i| ((i * 5) % 17) as f32 - 8.0).collect();
        let mut packed = vec![0.0f32; k * 48];
        for p in 0..k {
            packed[p * 48..][..48].copy_from_slice(&src[p * ldb..][..48]);
        }
        let pf = crate::kernel::RowPrefetch {
            ptr: src.as_ptr(),
            ld: ldb,
            rows: 5,
            width: 48,
        };
        for (alpha, beta) in [(1.0f32, 0.0f32), (2.0, 0.0), (1.0, 1.0)] {
            for off in [0usize, 1] {
                for packing in [false, true] {
                    let mut outs = vec![];
                    for stream in [false, true] {
                        let mut c = crate::AlignedVec::zeroed(8 * rs + 16);
                        c.iter_mut().enumerate().for_each(|(i, x)| {
                            *x = if beta == 0.0 {
                                f32::NAN
                            } else {
                                (i % 11) as f32
                            }
                        });
                        let cp = c[off..].as_mut_ptr();
                        let mut dst = vec![0.0f32; k * 48];
                        // SAFETY: avx512f checked above; k steps of 8 values behind `a`, of 48
                        // behind `packed`, k source rows of 48 values (row stride ldb) in
                        // `src`, k · 48 values in `dst`; the 8 × 48 window at `cp` (rows rs
                        // apart) lies inside `c`.
                        unsafe {
                            if packing {
                                avx512_ukr_asm_pk(
                                    true,
                                    k,
                                    alpha,
                                    a.as_ptr(),
                                    src.as_ptr(),
                                    ldb,
                                    dst.as_mut_ptr(),
                                    beta,
                                    cp,
                                    rs,
                                    1,
                                    8,
                                    48,
                                    stream,
                                );
                            } else {
                                avx512_ukr_asm_pf(
                                    k,
                                    alpha,
                                    a.as_ptr(),
                                    packed.as_ptr(),
                                    beta,
                                    cp,
                                    rs,
                                    1,
                                    8,
                                    48,
                                    pf,
                                    stream,
                                );
                            }
                            _mm_sfence();
                        }
                        outs.push(c.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
                    }
                    assert_eq!(
                        outs[0], outs[1],
                        "alpha {alpha} beta {beta} off {off} packing {packing}"
                    );
                    assert!(
                        outs[0][off..]
                            .chunks(rs)
                            .take(8)
                            .all(|r| r[..48].iter().all(|&x| !f32::from_bits(x).is_nan())),
                        "the window is written"
                    );
                }
            }
        }
    }
}
