//! The portable family: plain Rust on 8-lane arrays that the compiler vectorizes for whatever the
//! target's baseline offers (SSE2 on x86_64, NEON on aarch64). It serves every target, and aarch64
//! in particular: there is no hand-written NEON family (no aarch64 target could be installed to
//! test one).

use super::{Kernel, Simd, ukr, ukr_rowa};

/// Eight f32 lanes in plain arrays.
#[derive(Clone, Copy)]
pub(crate) struct Lanes8;

impl Simd for Lanes8 {
    type V = [f32; 8];
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees 8 readable values at `p`.
        unsafe { p.cast::<[f32; 8]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn bcast(p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees one readable value at `p`.
        unsafe { [*p; 8] }
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        // Separate multiply and add: `mul_add` without hardware FMA is a libm call.
        std::array::from_fn(|l| a[l] * b[l] + c[l])
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] * b[l])
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        // SAFETY: the caller guarantees 8 writable values at `p`.
        unsafe { p.cast::<[f32; 8]>().write_unaligned(v) }
    }
}

/// `scalar-f32-4x16`: the portable reference family.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scalar;

impl Kernel for Scalar {
    const MR: usize = 4;
    const NR: usize = 16;
    const NAME: &'static str = "scalar-f32-4x16";

    fn new() -> Option<Self> {
        Some(Self)
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
        // SAFETY: forwarded contract of `Kernel::run`; `Lanes8` needs no target feature.
        unsafe { ukr::<Lanes8, 4, 2, 4, 16>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n) }
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
        // SAFETY: forwarded contract of `Kernel::run_short` (each arm's `MR` equals `m`; the
        // panel is 4 wide); `Lanes8` needs no target feature.
        unsafe {
            match m {
                1 => ukr_rowa::<Lanes8, 1, 2, 16, 4, false>(k, a, 1, b, beta, c, ldc, m, n),
                2 => ukr_rowa::<Lanes8, 2, 2, 16, 4, false>(k, a, 1, b, beta, c, ldc, m, n),
                3 => ukr_rowa::<Lanes8, 3, 2, 16, 4, false>(k, a, 1, b, beta, c, ldc, m, n),
                _ => ukr_rowa::<Lanes8, 4, 2, 16, 4, false>(k, a, 1, b, beta, c, ldc, m, n),
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
        // SAFETY: forwarded contract of `Kernel::run_rowa` (each arm's `MR` equals `m`);
        // `Lanes8` needs no target feature.
        unsafe {
            match m {
                1 => ukr_rowa::<Lanes8, 1, 2, 16, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                2 => ukr_rowa::<Lanes8, 2, 2, 16, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                3 => ukr_rowa::<Lanes8, 3, 2, 16, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
                _ => ukr_rowa::<Lanes8, 4, 2, 16, 1, false>(k, a, lda, b, beta, c, ldc, m, n),
            }
        }
    }
}

super::offset::offset_kernel!(
    Scalar,
    Lanes8,
    scalar_offset_tile,
    scalar_offset_dot,
    scalar_offset_a_tile
);
