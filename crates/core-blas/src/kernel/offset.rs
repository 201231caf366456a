//! The offset-list kernels, written once on the [`Simd`] vocabulary and instantiated per kernel
//! family (contract in [`crate::offset`]):
//! - [`tile_body`]: `M × V` accumulators of 8 lanes; per step `V` vector loads of x at
//!   `src[v] + offset`, `M` broadcasts of the packed w values, `M · V` FMAs;
//! - [`dot_body`]: `M × J` dot products; per run `M` vector loads of dy (kept), per column one x
//!   vector and `M` FMAs; the lanes reduced four columns at a time at the end;
//! - [`a_tile_body`]: `M × 2` accumulators of `S::LANES` lanes (AVX2: the GEMM micro-kernel's
//!   6 × 16 shape; AVX-512: M × 32 on 512-bit vectors, see [`ATileFamily`]); per step 2 vector
//!   loads of the packed Wᵀ panel, `M` broadcasts of x at `xs[i] + offset` (embedded broadcasts
//!   of the FMAs on AVX-512), `2 · M` FMAs.

use super::Simd;
use crate::offset::{
    DOT_MR, DOT_NC, DotTile, OFFSET_A_MR, OFFSET_A_NR, OFFSET_LANES, OFFSET_MR, OFFSET_NV,
    OffsetATile, OffsetTile,
};

/// A family's offset-A tile: the vectors its [`a_tile_body`] runs on (two per step: `2 ·
/// S::LANES` output channels) and its pixels per tile. The offset tile and the dot tile stay
/// 8 lanes wide on every family (their contract); only the offset-A tile widens with the ISA.
pub(crate) trait ATileFamily {
    /// The vectors of the family's offset-A tile.
    type S: Simd;
    /// Pixels per tile (x values broadcast per step; `≤` [`OFFSET_A_MR`]) when the tile's
    /// pixels are a run (`xs[i] = xs[0] + i`: one base register, the broadcasts at fixed
    /// displacements from it).
    const MR: usize;
    /// Pixels per tile at arbitrary bases (one base register per pixel: beyond the free
    /// general-purpose registers the pointers spill); wider tiles are split.
    const GENERAL_MR: usize = 6;
    /// Output channels per tile: two vectors (`≤` [`OFFSET_A_NR`]).
    const NR: usize = 2 * <Self::S as Simd>::LANES;
}

impl ATileFamily for super::portable::Scalar {
    type S = super::portable::Lanes8;
    const MR: usize = 6;
}

#[cfg(target_arch = "x86_64")]
impl ATileFamily for super::x86::Avx2 {
    /// 6 × 16: 12 accumulators, 2 Wᵀ vectors and a broadcast of the 16 ymm registers.
    type S = super::x86::V256;
    const MR: usize = 6;
}

#[cfg(target_arch = "x86_64")]
impl ATileFamily for super::x86::Avx512 {
    /// 12 × 32 on zmm: 24 accumulators, 2 Wᵀ vectors, the x values as embedded broadcasts. At
    /// arbitrary bases 6 pixels (12 base pointers spill: 12 × 32 ran at 28-42 GFLOP/s against
    /// 52-68 for 6-10 pixels, `examples/offset_a_tile.rs`, quiet 17:27 UTC session 12).
    type S = super::x86::V512;
    const MR: usize = 12;
}

/// A family's instantiations of [`tile_body`] and [`dot_body`] (its `#[target_feature]`
/// wrappers).
pub(crate) trait OffsetKernel: Copy {
    /// [`tile_body`] for `M` rows and `V` runs, compiled with the family's features.
    ///
    /// # Safety
    /// As [`tile_body`]; holding `self` proves the family's features.
    unsafe fn tile<const M: usize, const V: usize>(
        self,
        offs: &[usize],
        w: *const f32,
        src: &[*const f32; OFFSET_NV],
        acc: &mut OffsetTile,
        accumulate: bool,
    );

    /// [`dot_body`] for `M` rows and `J` columns, compiled with the family's features.
    ///
    /// # Safety
    /// As [`dot_body`]; holding `self` proves the family's features.
    #[allow(clippy::too_many_arguments)]
    unsafe fn dot<const M: usize, const J: usize>(
        self,
        runs: &[usize],
        dy: *const f32,
        ldd: usize,
        cols: &[*const f32; DOT_NC],
        acc: &mut DotTile,
        accumulate: bool,
    );

    /// [`a_tile_body`] for `M` pixels at any bases, compiled with the family's features.
    ///
    /// # Safety
    /// As [`a_tile_body`]; holding `self` proves the family's features.
    unsafe fn a_tile<const M: usize>(
        self,
        offs: &[usize],
        wt: *const f32,
        xs: &[*const f32; OFFSET_A_MR],
        acc: &mut OffsetATile,
        accumulate: bool,
    );

    /// [`a_tile_body`] for a run of `M` pixels from `xs[0]` (`RUN`), compiled with the
    /// family's features.
    ///
    /// # Safety
    /// As [`a_tile_body`] with `RUN`; holding `self` proves the family's features.
    unsafe fn a_run<const M: usize>(
        self,
        offs: &[usize],
        wt: *const f32,
        xs: &[*const f32; OFFSET_A_MR],
        acc: &mut OffsetATile,
        accumulate: bool,
    );
}

/// With `L = S::LANES` and `NR = 2 · L`: `acc[i][v·L + l] (:= or +=) Σ_s x[xs[i] + offs[s]] ·
/// wt[s·NR + v·L + l]` for `i < M`, `v < 2`, `l < L`, steps in order (one FMA per step and lane;
/// the portable family multiplies then adds); `acc[i][NR..]` and rows `i >= M` untouched.
/// With `RUN` the pixels are a run, pixel `i` at `xs[0] + i` (the other `xs` not read): the
/// same sums in the same order, on one base pointer.
///
/// # Safety
/// `2 · S::LANES <= OFFSET_A_NR` and the caller is compiled with `S`'s features; `wt` holds
/// `offs.len() · NR` readable values; for every `i < M` and every offset `o` of `offs`, `xs[i] +
/// o` (`RUN`: `xs[0] + i + o`) is readable.
#[inline(always)]
pub(crate) unsafe fn a_tile_body<S: Simd, const M: usize, const RUN: bool>(
    offs: &[usize],
    wt: *const f32,
    xs: &[*const f32; OFFSET_A_MR],
    acc: &mut OffsetATile,
    accumulate: bool,
) {
    debug_assert!(2 * S::LANES <= OFFSET_A_NR && M <= OFFSET_A_MR);
    let lanes = S::LANES;
    // SAFETY: the caller's contract covers every load (2 · LANES wt values and one x value per
    // pixel and step) and the target features; acc[i] is OFFSET_A_NR >= 2 · LANES f32 values.
    unsafe {
        let mut c = [[S::zero(); 2]; M];
        if accumulate {
            for i in 0..M {
                c[i][0] = S::load(acc[i].as_ptr());
                c[i][1] = S::load(acc[i].as_ptr().add(lanes));
            }
        }
        // A run: every pixel at a constant displacement from xs[0] (inside x by the contract).
        let ps: [*const f32; M] =
            std::array::from_fn(|i| if RUN { xs[0].wrapping_add(i) } else { xs[i] });
        let mut wp = wt;
        for &off in offs {
            let b0 = S::load(wp);
            let b1 = S::load(wp.add(lanes));
            for i in 0..M {
                let a = S::bcast(ps[i].add(off));
                c[i][0] = S::fma(a, b0, c[i][0]);
                c[i][1] = S::fma(a, b1, c[i][1]);
            }
            // The last advance points one past the steps' values, never dereferenced.
            wp = wp.wrapping_add(2 * lanes);
        }
        for i in 0..M {
            S::store(acc[i].as_mut_ptr(), c[i][0]);
            S::store(acc[i].as_mut_ptr().add(lanes), c[i][1]);
        }
    }
}

/// [`OffsetKernel::a_tile`] (`RUN`: [`OffsetKernel::a_run`]) for `m` (1..=[`OFFSET_A_MR`])
/// pixels, one monomorphized tile each.
///
/// # Safety
/// As [`a_tile_body`] for `M = m` (in range, checked by the caller).
#[inline(always)]
pub(crate) unsafe fn a_tile_any<K: OffsetKernel, const RUN: bool>(
    k: K,
    m: usize,
    offs: &[usize],
    wt: *const f32,
    xs: &[*const f32; OFFSET_A_MR],
    acc: &mut OffsetATile,
    accumulate: bool,
) {
    macro_rules! tile {
        ($m:literal) => {
            if RUN {
                k.a_run::<$m>(offs, wt, xs, acc, accumulate)
            } else {
                k.a_tile::<$m>(offs, wt, xs, acc, accumulate)
            }
        };
    }
    // SAFETY: the caller's contract, for this M <= OFFSET_A_MR.
    unsafe {
        match m {
            1 => tile!(1),
            2 => tile!(2),
            3 => tile!(3),
            4 => tile!(4),
            5 => tile!(5),
            6 => tile!(6),
            // Only the families with more pixels per tile get here (the caller checks m
            // against the family's MR), so the narrower ones never run these spilling tiles.
            7 => tile!(7),
            8 => tile!(8),
            9 => tile!(9),
            10 => tile!(10),
            11 => tile!(11),
            12 => tile!(12),
            _ => debug_assert!(false, "pixels out of range"),
        }
    }
}

/// `acc[m][v] (:= or +=) Σ_s w[s·MR + m] · x[src[v] + offs[s] .. + 8]` for `m < M`, `v < V`,
/// steps in order (one FMA per step and lane; the portable family multiplies then adds).
///
/// # Safety
/// `S::LANES == 8` and the caller is compiled with `S`'s features; `w` holds `offs.len() · MR`
/// readable values; for every `v < V` and every offset `o` of `offs`, `src[v] + o .. + 8` is
/// readable.
#[inline(always)]
pub(crate) unsafe fn tile_body<S: Simd, const M: usize, const V: usize>(
    offs: &[usize],
    w: *const f32,
    src: &[*const f32; OFFSET_NV],
    acc: &mut OffsetTile,
    accumulate: bool,
) {
    debug_assert!(S::LANES == OFFSET_LANES && M <= OFFSET_MR && V <= OFFSET_NV);
    // SAFETY: the caller's contract, for the 8-lane tile's shape.
    unsafe {
        lanes_body::<S, OFFSET_LANES, OFFSET_NV, OFFSET_MR, M, V>(offs, w, src, acc, accumulate)
    }
}

/// The offset tile's body for any vector width: `acc[m][v] (:= or +=) Σ_s w[s·MRW + m] ·
/// x[src[v] + offs[s] .. + L]` for `m < M`, `v < V`, steps in order, on a tile of `MRW` rows ×
/// `NV` runs of `L` lanes (the 8-lane [`tile_body`]; the AVX-512 family's 16-lane wide tile,
/// `kernel::skx_offset`).
///
/// # Safety
/// `S::LANES == L`, `M <= MRW`, `V <= NV`, and the caller is compiled with `S`'s features; `w`
/// holds `offs.len() · MRW` readable values; for every `v < V` and every offset `o` of `offs`,
/// `src[v] + o .. + L` is readable.
#[inline(always)]
pub(crate) unsafe fn lanes_body<
    S: Simd,
    const L: usize,
    const NV: usize,
    const MRW: usize,
    const M: usize,
    const V: usize,
>(
    offs: &[usize],
    w: *const f32,
    src: &[*const f32; NV],
    acc: &mut [[[f32; L]; NV]; MRW],
    accumulate: bool,
) {
    debug_assert!(S::LANES == L && M <= MRW && V <= NV);
    // SAFETY: the caller's contract covers every load (the w values of each step, L values of x
    // per run and step) and the target features; acc[m][v] is L f32 values.
    unsafe {
        let mut c = [[S::zero(); V]; M];
        if accumulate {
            for m in 0..M {
                for v in 0..V {
                    c[m][v] = S::load(acc[m][v].as_ptr());
                }
            }
        }
        let bs: [*const f32; V] = std::array::from_fn(|v| src[v]);
        let mut wp = w;
        for &off in offs {
            let mut b = [S::zero(); V];
            for v in 0..V {
                b[v] = S::load(bs[v].add(off));
            }
            for m in 0..M {
                let a = S::bcast(wp.add(m));
                for v in 0..V {
                    c[m][v] = S::fma(a, b[v], c[m][v]);
                }
            }
            // The last advance points one past the steps' values, never dereferenced.
            wp = wp.wrapping_add(MRW);
        }
        for m in 0..M {
            for v in 0..V {
                S::store(acc[m][v].as_mut_ptr(), c[m][v]);
            }
        }
    }
}

/// `acc[i][j] (:= or +=) Σ_r Σ_l dy[i·ldd + r·8 + l] · cols[j][runs[r] + l]` for `i < M`,
/// `j < J`: per row and column, 8 lane sums accumulated over the runs in order, then the lanes
/// added (pairwise).
///
/// # Safety
/// `S::LANES == 8` and the caller is compiled with `S`'s features; `dy + i·ldd + r·8 .. + 8` is
/// readable for `i < M`, `r < runs.len()`; `cols[j] + runs[r] .. + 8` is readable for `j < J`.
#[inline(always)]
pub(crate) unsafe fn dot_body<S: Simd, const M: usize, const J: usize>(
    runs: &[usize],
    dy: *const f32,
    ldd: usize,
    cols: &[*const f32; DOT_NC],
    acc: &mut DotTile,
    accumulate: bool,
) {
    debug_assert!(S::LANES == OFFSET_LANES && M <= DOT_MR && J <= DOT_NC);
    // SAFETY: the caller's contract covers every load and the target features.
    unsafe {
        let mut c = [[S::zero(); J]; M];
        let xs: [*const f32; J] = std::array::from_fn(|j| cols[j]);
        let mut d = dy;
        for &base in runs {
            let mut dv = [S::zero(); M];
            for i in 0..M {
                dv[i] = S::load(d.add(i * ldd));
            }
            for j in 0..J {
                let xv = S::load(xs[j].add(base));
                for i in 0..M {
                    c[i][j] = S::fma(dv[i], xv, c[i][j]);
                }
            }
            // The last advance points past the runs' values, never dereferenced.
            d = d.wrapping_add(OFFSET_LANES);
        }
        for i in 0..M {
            let v: [S::V; 4] = std::array::from_fn(|j| if j < J { c[i][j] } else { S::zero() });
            let s = S::hsum4(v);
            for j in 0..J {
                acc[i][j] = if accumulate { acc[i][j] + s[j] } else { s[j] };
            }
        }
    }
}

/// [`OffsetKernel::tile`] for `m` (1..=MR) rows and `runs` (1..=`offset_tile_vectors(m)`), one
/// monomorphized tile per pair.
///
/// # Safety
/// As [`tile_body`] for `V = runs`; `m` and `runs` in range (checked by the caller).
#[inline(always)]
pub(crate) unsafe fn tile_any<K: OffsetKernel>(
    k: K,
    m: usize,
    runs: usize,
    offs: &[usize],
    w: *const f32,
    src: &[*const f32; OFFSET_NV],
    acc: &mut OffsetTile,
    accumulate: bool,
) {
    macro_rules! runs {
        ($m:literal: $($v:literal)*) => {
            match runs {
                // SAFETY: the caller's contract, for this M <= MR and V <= the runs of M.
                $($v => unsafe { k.tile::<$m, $v>(offs, w, src, acc, accumulate) },)*
                _ => debug_assert!(false, "runs out of range"),
            }
        };
    }
    match m {
        1 => runs!(1: 1 2 3 4 5 6),
        2 => runs!(2: 1 2 3 4),
        3 => runs!(3: 1 2 3),
        4 => runs!(4: 1 2),
        5 => runs!(5: 1 2),
        6 => runs!(6: 1 2),
        _ => debug_assert!(false, "rows out of range"),
    }
}

/// [`OffsetKernel::dot`] for `m` (1..=DOT_MR) rows and `ncols` (1..=DOT_NC) columns.
///
/// # Safety
/// As [`dot_body`] for `M = m`, `J = ncols` (both in range, checked by the caller).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_any<K: OffsetKernel>(
    k: K,
    m: usize,
    ncols: usize,
    runs: &[usize],
    dy: *const f32,
    ldd: usize,
    cols: &[*const f32; DOT_NC],
    acc: &mut DotTile,
    accumulate: bool,
) {
    macro_rules! cols {
        ($m:literal: $($j:literal)*) => {
            match ncols {
                // SAFETY: the caller's contract, for this M <= DOT_MR and J <= DOT_NC.
                $($j => unsafe { k.dot::<$m, $j>(runs, dy, ldd, cols, acc, accumulate) },)*
                _ => debug_assert!(false, "columns out of range"),
            }
        };
    }
    match m {
        1 => cols!(1: 1 2 3 4),
        2 => cols!(2: 1 2 3 4),
        3 => cols!(3: 1 2 3 4),
        _ => debug_assert!(false, "rows out of range"),
    }
}

/// The `impl OffsetKernel` of a family: `#[target_feature]` wrappers around the shared bodies
/// (`$simd` must have 8 lanes: the offset and dot tiles; the offset-A tile runs on the
/// family's [`ATileFamily::S`]).
macro_rules! offset_kernel {
    ($family:ty, $simd:ty, $tile:ident, $dot:ident, $atile:ident $(, $features:literal)?) => {
        $(#[target_feature(enable = $features)])?
        unsafe fn $tile<const M: usize, const V: usize>(
            offs: &[usize],
            w: *const f32,
            src: &[*const f32; $crate::offset::OFFSET_NV],
            acc: &mut $crate::offset::OffsetTile,
            accumulate: bool,
        ) {
            // SAFETY: compiled with the family's features; memory per the caller.
            unsafe {
                $crate::kernel::offset::tile_body::<$simd, M, V>(offs, w, src, acc, accumulate)
            }
        }

        $(#[target_feature(enable = $features)])?
        unsafe fn $dot<const M: usize, const J: usize>(
            runs: &[usize],
            dy: *const f32,
            ldd: usize,
            cols: &[*const f32; $crate::offset::DOT_NC],
            acc: &mut $crate::offset::DotTile,
            accumulate: bool,
        ) {
            // SAFETY: compiled with the family's features; memory per the caller.
            unsafe {
                $crate::kernel::offset::dot_body::<$simd, M, J>(runs, dy, ldd, cols, acc, accumulate)
            }
        }

        $(#[target_feature(enable = $features)])?
        unsafe fn $atile<const M: usize, const RUN: bool>(
            offs: &[usize],
            wt: *const f32,
            xs: &[*const f32; $crate::offset::OFFSET_A_MR],
            acc: &mut $crate::offset::OffsetATile,
            accumulate: bool,
        ) {
            // SAFETY: compiled with the family's features (those of its a-tile vectors);
            // memory per the caller.
            unsafe {
                $crate::kernel::offset::a_tile_body::<
                    <$family as $crate::kernel::offset::ATileFamily>::S,
                    M,
                    RUN,
                >(offs, wt, xs, acc, accumulate)
            }
        }

        impl $crate::kernel::offset::OffsetKernel for $family {
            #[inline]
            unsafe fn tile<const M: usize, const V: usize>(
                self,
                offs: &[usize],
                w: *const f32,
                src: &[*const f32; $crate::offset::OFFSET_NV],
                acc: &mut $crate::offset::OffsetTile,
                accumulate: bool,
            ) {
                // SAFETY: holding the family value proves its features; memory per the caller.
                unsafe { $tile::<M, V>(offs, w, src, acc, accumulate) }
            }

            #[inline]
            unsafe fn dot<const M: usize, const J: usize>(
                self,
                runs: &[usize],
                dy: *const f32,
                ldd: usize,
                cols: &[*const f32; $crate::offset::DOT_NC],
                acc: &mut $crate::offset::DotTile,
                accumulate: bool,
            ) {
                // SAFETY: holding the family value proves its features; memory per the caller.
                unsafe { $dot::<M, J>(runs, dy, ldd, cols, acc, accumulate) }
            }

            #[inline]
            unsafe fn a_tile<const M: usize>(
                self,
                offs: &[usize],
                wt: *const f32,
                xs: &[*const f32; $crate::offset::OFFSET_A_MR],
                acc: &mut $crate::offset::OffsetATile,
                accumulate: bool,
            ) {
                // SAFETY: holding the family value proves its features; memory per the caller.
                unsafe { $atile::<M, false>(offs, wt, xs, acc, accumulate) }
            }

            #[inline]
            unsafe fn a_run<const M: usize>(
                self,
                offs: &[usize],
                wt: *const f32,
                xs: &[*const f32; $crate::offset::OFFSET_A_MR],
                acc: &mut $crate::offset::OffsetATile,
                accumulate: bool,
            ) {
                // SAFETY: holding the family value proves its features; memory per the caller.
                unsafe { $atile::<M, true>(offs, wt, xs, acc, accumulate) }
            }
        }
    };
}
pub(crate) use offset_kernel;
