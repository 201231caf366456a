//! The AVX-512 family's wide offset tile ([`crate::Gemm::offset_wide_tile`]): the offset tile's
//! body ([`super::offset::lanes_body`]) on 512-bit vectors, runs of 16 output pixels, up to
//! [`WIDE_MR`] rows: per step `V` vector loads of x at `src[v] + offset`, `M` broadcasts of the
//! packed w values, `M · V` FMAs into `M · V` zmm accumulators (8 × 3: 24 accumulators, 3 x
//! vectors and a broadcast of the 32 zmm registers; 6 × 4: 24 + 4 + 1).

use super::offset::lanes_body;
use super::x86::{Avx512, V512};
use crate::offset::{WIDE_LANES, WIDE_MR, WIDE_NV, WideTile};

/// [`lanes_body`] on zmm vectors for `M` rows and `V` runs.
///
/// # Safety
/// As [`lanes_body`] with `L = 16`, `MRW = WIDE_MR`, `NV = WIDE_NV`; the CPU has AVX-512F.
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn wide_tile<const M: usize, const V: usize>(
    offs: &[usize],
    w: *const f32,
    src: &[*const f32; WIDE_NV],
    acc: &mut WideTile,
    accumulate: bool,
) {
    // SAFETY: compiled with avx512f; memory per the caller.
    unsafe { lanes_body::<V512, WIDE_LANES, WIDE_NV, WIDE_MR, M, V>(offs, w, src, acc, accumulate) }
}

/// [`wide_tile`] for `m` (1..=[`WIDE_MR`]) rows and `runs` (1..=
/// [`crate::offset::wide_tile_vectors`]`(m)`), one monomorphized tile per pair.
///
/// # Safety
/// As [`lanes_body`] for `M = m`, `V = runs` (both in range, checked by the caller); holding
/// the [`Avx512`] value proves the CPU's features.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) unsafe fn wide_any(
    _k: Avx512,
    m: usize,
    runs: usize,
    offs: &[usize],
    w: *const f32,
    src: &[*const f32; WIDE_NV],
    acc: &mut WideTile,
    accumulate: bool,
) {
    macro_rules! runs {
        ($m:literal: $($v:literal)*) => {
            match runs {
                // SAFETY: the caller's contract, for this M <= WIDE_MR and V <= its runs.
                $($v => unsafe { wide_tile::<$m, $v>(offs, w, src, acc, accumulate) },)*
                _ => debug_assert!(false, "runs out of range"),
            }
        };
    }
    match m {
        1 => runs!(1: 1 2 3 4),
        2 => runs!(2: 1 2 3 4),
        3 => runs!(3: 1 2 3 4),
        4 => runs!(4: 1 2 3 4),
        5 => runs!(5: 1 2 3 4),
        6 => runs!(6: 1 2 3 4),
        7 => runs!(7: 1 2 3),
        8 => runs!(8: 1 2 3),
        _ => debug_assert!(false, "rows out of range"),
    }
}
