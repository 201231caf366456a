//! Level-1 kernels for element-wise layers: reductions (sum, squared deviations, shifted sums,
//! dot) returning f64, over one slice or over strided [`Planes`] (one channel of a batch in one
//! call), batch normalisation's forward and backward, ReLU with a bit mask, an in-place sum, and
//! max pooling's two steps (a tap's compare-and-select with its index, a stride-2 row's split).
//!
//! A [`Vector`] is a table of function pointers for one kernel family, built once
//! ([`Vector::global`] follows `CORE_BLAS_ISA` like the GEMM; [`Vector::new`] picks a family).
//! Fetch it once per layer call and call its methods per plane or chunk: a call costs one
//! indirect jump and its length checks, so 64-value slices are worth a call. The free functions
//! ([`sum`], [`add`], ...) look the process-wide table up on every call (a few instructions more).
//!
//! Families: `avx2` (AVX2; `avx512` hosts run the same 256-bit bodies: these loops are bound by
//! loads and stores, not by register width) and the portable `scalar` family. Any length, no
//! alignment requirement. The AVX2 element-wise bodies run their main loop from the first 32-byte
//! boundary of the written slice and cover the rest with whole vectors overlapping it (the first
//! and last 8 values, computed before anything is stored); below 8 values they run the portable
//! loop. The reductions finish with masked loads.
//!
//! **Every family returns the same bits.** The element-wise kernels round as the plain scalar
//! loops do (multiply then add, no fused multiply-add: `(x − m) · s` then `· g + b`), so they give
//! the bits of `x.iter_mut().for_each(|v| …)` written with the same operations. The reductions use
//! one summation order in every family, defined below, so `CORE_BLAS_ISA` never changes a result.
//!
//! **Reduction order and error.** Terms `t_i` (`x_i`, `(x_i − m)²`, `a_i · b_i`, each rounded to
//! f32) are accumulated in 32 f32 lanes, term `i` into lane `i mod 32`; after every 1024 terms
//! (32 per lane), and at the end, each lane is converted to f64 and added into its f64 lane
//! accumulator, and the f32 lanes restart from 0. The 32 f64 lanes are then added in a fixed
//! tree (see `combine`). An f32 lane thus sums at most 32 terms: its rounding error is at most
//! about `31 · 2⁻²⁴ · Σ|t|` of those terms (≈ 1.8e-6 relative for same-signed terms), the f64 part
//! adds nothing measurable. A NaN or infinite term makes the result NaN or infinite as in a plain
//! loop (∞ − ∞ gives NaN).
//!
//! **ReLU masks are bits**: value `i`'s bit is bit `i % 8` of `mask[i / 8]` (least significant
//! first); `mask` needs [`mask_bytes`]`(len)` bytes. A chunk of a larger tensor starting at value
//! `o` (a multiple of 8) uses `&mut mask[o / 8..]`. [`Vector::relu_train`] writes the unused high
//! bits of the last byte as 0. NaN follows `f32::max`: `relu(NaN) = 0` with a 0 bit (as nn's scalar
//! loop); backward keeps `d` where the bit is set (NaN included) and writes `+0.0` elsewhere.

use std::sync::OnceLock;

use crate::isa::Family;
use crate::{Error, Gemm, Isa};

/// Bytes of a ReLU bit mask over `len` values: `ceil(len / 8)`.
pub const fn mask_bytes(len: usize) -> usize {
    len.div_ceil(8)
}

/// f32 lanes of the reductions' accumulators.
pub(crate) const RED_LANES: usize = 32;
/// Terms per flush of the f32 lanes into the f64 lanes (32 per lane).
pub(crate) const RED_BLOCK: usize = 1024;

/// `(x, len, stride, count, k)` of [`Vector::shifted_sums_planes`]: `(count − 1) · stride + len
/// <= x.len()` when `count > 0`.
pub(crate) type ShiftedPlanesFn = unsafe fn(&[f32], usize, usize, usize, f32) -> (f64, f64);
/// `(a, b, len, stride, count)` of [`Vector::sum_dot_planes`]: both slices hold the planes.
pub(crate) type SumDotPlanesFn = unsafe fn(&[f32], &[f32], usize, usize, usize) -> (f64, f64);

/// The kernels of one family, as plain function pointers (the unsafe ones require the family's
/// CPU features; a table is only handed out when the CPU has them).
#[derive(Clone, Copy)]
pub(crate) struct Fns {
    pub(crate) sum: unsafe fn(&[f32]) -> f64,
    pub(crate) sum_sq_dev: unsafe fn(&[f32], f32) -> f64,
    pub(crate) shifted_sums: unsafe fn(&[f32], f32) -> (f64, f64),
    /// `a`, `b` of one length.
    pub(crate) dot: unsafe fn(&[f32], &[f32]) -> f64,
    /// `a`, `b` of one length.
    pub(crate) sum_dot: unsafe fn(&[f32], &[f32]) -> (f64, f64),
    pub(crate) shifted_sums_planes: ShiftedPlanesFn,
    pub(crate) sum_dot_planes: SumDotPlanesFn,
    /// `x`, `xhat` of one length.
    pub(crate) bn_train: unsafe fn(&mut [f32], &mut [f32], f32, f32, f32, f32),
    pub(crate) scale_shift: unsafe fn(&mut [f32], f32, f32),
    /// `d`, `h` of one length.
    pub(crate) bn_backward: unsafe fn(&mut [f32], &[f32], f32, f32, f32),
    /// `mask.len() >= mask_bytes(x.len())`.
    pub(crate) relu_train: unsafe fn(&mut [f32], &mut [u8]),
    pub(crate) relu: unsafe fn(&mut [f32]),
    /// `mask.len() >= mask_bytes(d.len())`.
    pub(crate) relu_backward: unsafe fn(&mut [f32], &[u8]),
    /// `a`, `b` of one length.
    pub(crate) add: unsafe fn(&mut [f32], &[f32]),
    /// `best`, `tap`, `v` of one length.
    pub(crate) max_update: unsafe fn(&mut [f32], &mut [u32], &[f32], u32),
    /// `even.len() == x.len().div_ceil(2)`, `odd.len() == x.len() / 2`.
    pub(crate) deinterleave2: unsafe fn(&[f32], &mut [f32], &mut [f32]),
}

/// The level-1 kernels of one family. See the [module documentation](self) for the contract
/// (summation order, rounding, masks, NaN).
#[derive(Clone, Copy)]
pub struct Vector {
    isa: Isa,
    f: Fns,
}

impl std::fmt::Debug for Vector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vector").field("isa", &self.isa).finish()
    }
}

static SCALAR: Vector = Vector {
    isa: Isa::Scalar,
    f: PORTABLE,
};
#[cfg(target_arch = "x86_64")]
static AVX2: Vector = Vector {
    isa: Isa::Avx2,
    f: crate::kernel::vector::AVX2,
};
#[cfg(target_arch = "x86_64")]
static AVX512: Vector = Vector {
    isa: Isa::Avx512,
    f: crate::kernel::vector::AVX2,
};

fn same_len(arg: &'static str, want: usize, got: usize) -> Result<(), Error> {
    if want == got {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            arg,
            expected: format!("{want} values (the length of the first slice)"),
            got: format!("{got} values"),
        })
    }
}

fn mask_len(len: usize, mask: usize) -> Result<(), Error> {
    let needed = mask_bytes(len);
    if mask >= needed {
        Ok(())
    } else {
        Err(Error::SliceTooShort {
            arg: "mask",
            len: mask,
            needed,
        })
    }
}

/// Equal-length planes at a fixed stride in one slice: plane `j` is `x[j · stride..][..len]`
/// for `j < count`. One channel of an `N × C × spatial` tensor is `len` = the spatial size,
/// `stride` = `C · len`, `count` = `N`, in the slice starting at the channel's first value.
/// Planes may overlap (`stride < len`); they are only read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planes {
    /// Values per plane.
    pub len: usize,
    /// Values from the start of one plane to the start of the next.
    pub stride: usize,
    /// Number of planes.
    pub count: usize,
}

impl Planes {
    /// Values a slice needs to hold the planes: `(count − 1) · stride + len` (0 without
    /// planes); `None` if that overflows.
    pub fn span(&self) -> Option<usize> {
        match self.count {
            0 => Some(0),
            n => (n - 1).checked_mul(self.stride)?.checked_add(self.len),
        }
    }

    /// `Ok` if a slice of `got` values named `arg` holds the planes.
    fn fit(&self, arg: &'static str, got: usize) -> Result<(), Error> {
        let needed = self.span().ok_or_else(|| Error::Stride {
            arg,
            reason: format!("{self:?} spans more than usize::MAX values"),
        })?;
        if got >= needed {
            Ok(())
        } else {
            Err(Error::SliceTooShort {
                arg,
                len: got,
                needed,
            })
        }
    }
}

impl Vector {
    /// The table of `isa`; errors if the CPU lacks the family.
    pub fn new(isa: Isa) -> Result<&'static Vector, Error> {
        Ok(match Family::require(isa)? {
            Family::Scalar(_) => &SCALAR,
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(_) => &AVX2,
            #[cfg(target_arch = "x86_64")]
            Family::Avx512(_) => &AVX512,
        })
    }

    /// The process-wide table: the family of [`Gemm::global`] (`CORE_BLAS_ISA` or the best
    /// available), looked up once.
    pub fn global() -> Result<&'static Vector, Error> {
        static GLOBAL: OnceLock<Result<&'static Vector, Error>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| Vector::new(Gemm::global()?.isa()))
            .clone()
    }

    /// The family of this table.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// `Σ x` (order and error: module documentation).
    #[inline]
    pub fn sum(&self, x: &[f32]) -> f64 {
        // SAFETY: the table is only handed out for a family the CPU has.
        unsafe { (self.f.sum)(x) }
    }

    /// `Σ (x − m)²`, each term rounded in f32 as `(x − m) · (x − m)` (the variance's numerator).
    #[inline]
    pub fn sum_sq_dev(&self, x: &[f32], m: f32) -> f64 {
        // SAFETY: as in `sum`.
        unsafe { (self.f.sum_sq_dev)(x, m) }
    }

    /// `(Σ (x − k), Σ (x − k)²)` in one pass, each term rounded in f32 as `d = x − k`, `d · d`;
    /// the second equals [`sum_sq_dev`](Vector::sum_sq_dev)`(x, k)` bit for bit. With a shift `k`
    /// near the mean (the running mean, or the first plane's), `mean = k + S1 / n` and
    /// `Σ (x − mean)² = S2 − S1² / n` give batch statistics in one read of `x` instead of two
    /// (the shifted-data formula: accurate while `|S1| / n` is small against the spread).
    #[inline]
    pub fn shifted_sums(&self, x: &[f32], k: f32) -> (f64, f64) {
        // SAFETY: as in `sum`.
        unsafe { (self.f.shifted_sums)(x, k) }
    }

    /// `Σ a · b`. Errors if the lengths differ.
    #[inline]
    pub fn dot(&self, a: &[f32], b: &[f32]) -> Result<f64, Error> {
        same_len("b", a.len(), b.len())?;
        // SAFETY: as in `sum`; lengths checked.
        Ok(unsafe { (self.f.dot)(a, b) })
    }

    /// `(Σ a, Σ a · b)` in one pass (batch norm backward's `Σ dy`, `Σ dy · x̂`), each sum equal
    /// to [`sum`](Vector::sum) / [`dot`](Vector::dot). Errors if the lengths differ.
    #[inline]
    pub fn sum_dot(&self, a: &[f32], b: &[f32]) -> Result<(f64, f64), Error> {
        same_len("b", a.len(), b.len())?;
        // SAFETY: as in `sum`; lengths checked.
        Ok(unsafe { (self.f.sum_dot)(a, b) })
    }

    /// [`shifted_sums`](Vector::shifted_sums) over several planes of `x` (one channel's planes of
    /// a batch) in one call: `(Σ (x − k), Σ (x − k)²)` over every value of every plane. Each
    /// plane's terms go into the 32 f32 lanes from lane 0, and the lanes are flushed into f64
    /// after every 32 chunks (a chunk: 32 terms of a plane or its last partial chunk), so the
    /// error bound of the module documentation holds and, when `planes.len` is a multiple of 32,
    /// the result equals `shifted_sums` of the planes laid end to end, bit for bit. One call per
    /// channel instead of one per plane: on 8 × 8 planes the per-call reduction tree cost more
    /// than the values. Errors if `x` is too short for the planes.
    #[inline]
    pub fn shifted_sums_planes(
        &self,
        x: &[f32],
        planes: Planes,
        k: f32,
    ) -> Result<(f64, f64), Error> {
        planes.fit("x", x.len())?;
        let Planes { len, stride, count } = planes;
        // SAFETY: as in `sum`; the planes are in range (checked).
        Ok(unsafe { (self.f.shifted_sums_planes)(x, len, stride, count, k) })
    }

    /// [`sum_dot`](Vector::sum_dot) over the same planes of `a` and `b` in one call (batch norm
    /// backward's per-channel `Σ dy`, `Σ dy · x̂`), in the order of
    /// [`shifted_sums_planes`](Vector::shifted_sums_planes). Errors if `a` or `b` is too short
    /// for the planes.
    #[inline]
    pub fn sum_dot_planes(
        &self,
        a: &[f32],
        b: &[f32],
        planes: Planes,
    ) -> Result<(f64, f64), Error> {
        planes.fit("a", a.len())?;
        planes.fit("b", b.len())?;
        let Planes { len, stride, count } = planes;
        // SAFETY: as in `sum`; the planes are in range of both slices (checked).
        Ok(unsafe { (self.f.sum_dot_planes)(a, b, len, stride, count) })
    }

    /// Batch-norm forward in training: `xhat[i] = (x[i] − m) · s`, then `x[i] = xhat[i] · g + b`
    /// (multiply then add). Errors if the lengths differ.
    #[inline]
    pub fn bn_train(
        &self,
        x: &mut [f32],
        xhat: &mut [f32],
        m: f32,
        s: f32,
        g: f32,
        b: f32,
    ) -> Result<(), Error> {
        same_len("xhat", x.len(), xhat.len())?;
        // SAFETY: as in `sum`; lengths checked.
        unsafe { (self.f.bn_train)(x, xhat, m, s, g, b) };
        Ok(())
    }

    /// `x[i] = x[i] · a + b` (multiply then add): batch norm in evaluation, any affine map.
    #[inline]
    pub fn scale_shift(&self, x: &mut [f32], a: f32, b: f32) {
        // SAFETY: as in `sum`.
        unsafe { (self.f.scale_shift)(x, a, b) }
    }

    /// Batch-norm backward (data): `d[i] = k · ((d[i] − md) − h[i] · mdx)` with `h` = x̂.
    /// Errors if the lengths differ.
    #[inline]
    pub fn bn_backward(
        &self,
        d: &mut [f32],
        h: &[f32],
        k: f32,
        md: f32,
        mdx: f32,
    ) -> Result<(), Error> {
        same_len("h", d.len(), h.len())?;
        // SAFETY: as in `sum`; lengths checked.
        unsafe { (self.f.bn_backward)(d, h, k, md, mdx) };
        Ok(())
    }

    /// ReLU in training: bit `i` of `mask` = `x[i] > 0`, then `x[i] = max(x[i], 0)` (`f32::max`).
    /// Writes the first [`mask_bytes`]`(x.len())` bytes of `mask` (unused high bits 0); errors if
    /// `mask` is shorter.
    #[inline]
    pub fn relu_train(&self, x: &mut [f32], mask: &mut [u8]) -> Result<(), Error> {
        mask_len(x.len(), mask.len())?;
        // SAFETY: as in `sum`; mask length checked.
        unsafe { (self.f.relu_train)(x, mask) };
        Ok(())
    }

    /// ReLU: `x[i] = max(x[i], 0)` (`f32::max`: NaN becomes 0).
    #[inline]
    pub fn relu(&self, x: &mut [f32]) {
        // SAFETY: as in `sum`.
        unsafe { (self.f.relu)(x) }
    }

    /// ReLU backward: `d[i]` kept where bit `i` of `mask` is set, `+0.0` elsewhere. Errors if
    /// `mask` has fewer than [`mask_bytes`]`(d.len())` bytes.
    #[inline]
    pub fn relu_backward(&self, d: &mut [f32], mask: &[u8]) -> Result<(), Error> {
        mask_len(d.len(), mask.len())?;
        // SAFETY: as in `sum`; mask length checked.
        unsafe { (self.f.relu_backward)(d, mask) };
        Ok(())
    }

    /// `a[i] += b[i]`. Errors if the lengths differ.
    #[inline]
    pub fn add(&self, a: &mut [f32], b: &[f32]) -> Result<(), Error> {
        same_len("b", a.len(), b.len())?;
        // SAFETY: as in `sum`; lengths checked.
        unsafe { (self.f.add)(a, b) };
        Ok(())
    }

    /// One tap of a row of max-pooling windows: where `v[i]` wins over `best[i]` (is larger,
    /// or is NaN while `best[i]` is not: NaN propagates, as in PyTorch; ties keep the first),
    /// `best[i] = v[i]` and `tap[i] = t`. Errors if `tap` or `v` is not as long as `best`.
    #[inline]
    pub fn max_update(
        &self,
        best: &mut [f32],
        tap: &mut [u32],
        v: &[f32],
        t: u32,
    ) -> Result<(), Error> {
        same_len("tap", best.len(), tap.len())?;
        same_len("v", best.len(), v.len())?;
        // SAFETY: as in `sum`; lengths checked.
        unsafe { (self.f.max_update)(best, tap, v, t) };
        Ok(())
    }

    /// The two phases of `x`: `even[i] = x[2i]`, `odd[i] = x[2i + 1]` (a strided window row
    /// split once, so that each tap reads a contiguous run). Errors unless `even` holds
    /// `ceil(x.len() / 2)` values and `odd` `floor(x.len() / 2)`.
    #[inline]
    pub fn deinterleave2(&self, x: &[f32], even: &mut [f32], odd: &mut [f32]) -> Result<(), Error> {
        let half = |arg, want: usize, got: usize| {
            if want == got {
                Ok(())
            } else {
                Err(Error::ShapeMismatch {
                    arg,
                    expected: format!("{want} values (half of x's {})", x.len()),
                    got: format!("{got} values"),
                })
            }
        };
        half("even", x.len().div_ceil(2), even.len())?;
        half("odd", x.len() / 2, odd.len())?;
        // SAFETY: as in `sum`; lengths checked.
        unsafe { (self.f.deinterleave2)(x, even, odd) };
        Ok(())
    }
}

/// [`Vector::sum`] with the process-wide family.
pub fn sum(x: &[f32]) -> Result<f64, Error> {
    Ok(Vector::global()?.sum(x))
}

/// [`Vector::sum_sq_dev`] with the process-wide family.
pub fn sum_sq_dev(x: &[f32], m: f32) -> Result<f64, Error> {
    Ok(Vector::global()?.sum_sq_dev(x, m))
}

/// [`Vector::shifted_sums`] with the process-wide family.
pub fn shifted_sums(x: &[f32], k: f32) -> Result<(f64, f64), Error> {
    Ok(Vector::global()?.shifted_sums(x, k))
}

/// [`Vector::dot`] with the process-wide family.
pub fn dot(a: &[f32], b: &[f32]) -> Result<f64, Error> {
    Vector::global()?.dot(a, b)
}

/// [`Vector::sum_dot`] with the process-wide family.
pub fn sum_dot(a: &[f32], b: &[f32]) -> Result<(f64, f64), Error> {
    Vector::global()?.sum_dot(a, b)
}

/// [`Vector::shifted_sums_planes`] with the process-wide family.
pub fn shifted_sums_planes(x: &[f32], planes: Planes, k: f32) -> Result<(f64, f64), Error> {
    Vector::global()?.shifted_sums_planes(x, planes, k)
}

/// [`Vector::sum_dot_planes`] with the process-wide family.
pub fn sum_dot_planes(a: &[f32], b: &[f32], planes: Planes) -> Result<(f64, f64), Error> {
    Vector::global()?.sum_dot_planes(a, b, planes)
}

/// [`Vector::bn_train`] with the process-wide family.
pub fn bn_train(
    x: &mut [f32],
    xhat: &mut [f32],
    m: f32,
    s: f32,
    g: f32,
    b: f32,
) -> Result<(), Error> {
    Vector::global()?.bn_train(x, xhat, m, s, g, b)
}

/// [`Vector::scale_shift`] with the process-wide family.
pub fn scale_shift(x: &mut [f32], a: f32, b: f32) -> Result<(), Error> {
    Vector::global()?.scale_shift(x, a, b);
    Ok(())
}

/// [`Vector::bn_backward`] with the process-wide family.
pub fn bn_backward(d: &mut [f32], h: &[f32], k: f32, md: f32, mdx: f32) -> Result<(), Error> {
    Vector::global()?.bn_backward(d, h, k, md, mdx)
}

/// [`Vector::relu_train`] with the process-wide family.
pub fn relu_train(x: &mut [f32], mask: &mut [u8]) -> Result<(), Error> {
    Vector::global()?.relu_train(x, mask)
}

/// [`Vector::relu`] with the process-wide family.
pub fn relu(x: &mut [f32]) -> Result<(), Error> {
    Vector::global()?.relu(x);
    Ok(())
}

/// [`Vector::relu_backward`] with the process-wide family.
pub fn relu_backward(d: &mut [f32], mask: &[u8]) -> Result<(), Error> {
    Vector::global()?.relu_backward(d, mask)
}

/// [`Vector::add`] with the process-wide family.
pub fn add(a: &mut [f32], b: &[f32]) -> Result<(), Error> {
    Vector::global()?.add(a, b)
}

/// [`Vector::max_update`] with the process-wide family.
pub fn max_update(best: &mut [f32], tap: &mut [u32], v: &[f32], t: u32) -> Result<(), Error> {
    Vector::global()?.max_update(best, tap, v, t)
}

/// [`Vector::deinterleave2`] with the process-wide family.
pub fn deinterleave2(x: &[f32], even: &mut [f32], odd: &mut [f32]) -> Result<(), Error> {
    Vector::global()?.deinterleave2(x, even, odd)
}

// ---------------------------------------------------------------------------------------------
// The portable family: plain loops the compiler vectorises for the target baseline, in the
// summation order the SIMD families use.

/// The fixed tree over the 32 f64 lanes, `d[l]` = lane `l`: four groups `e[j]` over the lanes
/// `4q + j` (q = 0..8) as `((q0 + q1) + (q2 + q3)) + ((q4 + q5) + (q6 + q7))`, then
/// `(e0 + e2) + (e1 + e3)` (the AVX2 family's f64x4 vectors and its 128-bit halves).
pub(crate) fn combine(d: &[f64; RED_LANES]) -> f64 {
    let q = |i: usize, j: usize| d[4 * i + j];
    let e: [f64; 4] = std::array::from_fn(|j| {
        ((q(0, j) + q(1, j)) + (q(2, j) + q(3, j))) + ((q(4, j) + q(5, j)) + (q(6, j) + q(7, j)))
    });
    (e[0] + e[2]) + (e[1] + e[3])
}

/// The portable reduction of `K` sums over `n` terms: `chunk(i, len, acc)` adds terms
/// `i..i + len` (`len <= 32`; 32 except in the last chunk) of each sum into lanes `0..len` of
/// `acc`. The SIMD families add +0.0 to the lanes a last partial chunk does not reach; skipping
/// that here gives the same result (a lane's −0.0 becoming +0.0 is absorbed by its f64
/// accumulator, which starts at +0.0 and so is never −0.0).
#[inline(always)]
fn reduce<const K: usize>(
    n: usize,
    chunk: impl Fn(usize, usize, &mut [[f32; RED_LANES]; K]),
) -> [f64; K] {
    reduce_planes(n, 1, |_, i, len, acc| chunk(i, len, acc))
}

/// [`reduce`] over `count` planes of `len` terms, `chunk(j, i, len, acc)` adding terms
/// `i..i + len` of plane `j`: each plane from lane 0, the f32 lanes flushed into the f64 lanes
/// after every 32 chunks and at the end (the order of [`Vector::shifted_sums_planes`]).
#[inline(always)]
fn reduce_planes<const K: usize>(
    len: usize,
    count: usize,
    chunk: impl Fn(usize, usize, usize, &mut [[f32; RED_LANES]; K]),
) -> [f64; K] {
    let mut d = [[0f64; RED_LANES]; K];
    let mut a = [[0f32; RED_LANES]; K];
    let mut chunks = 0;
    let flush = |a: &mut [[f32; RED_LANES]; K], d: &mut [[f64; RED_LANES]; K]| {
        for k in 0..K {
            for l in 0..RED_LANES {
                d[k][l] += a[k][l] as f64;
                a[k][l] = 0.0;
            }
        }
    };
    for j in 0..count {
        let mut i = 0;
        while i < len {
            let n = RED_LANES.min(len - i);
            chunk(j, i, n, &mut a);
            i += n;
            chunks += 1;
            if chunks == RED_BLOCK / RED_LANES {
                flush(&mut a, &mut d);
                chunks = 0;
            }
        }
    }
    if chunks > 0 {
        flush(&mut a, &mut d);
    }
    std::array::from_fn(|k| combine(&d[k]))
}

/// `acc[l] += f(x[l])` over one chunk: whole 32-value chunks through fixed-size arrays (so the
/// compiler vectorises them), a partial one value by value.
#[inline(always)]
fn lanes1(x: &[f32], acc: &mut [f32; RED_LANES], f: impl Fn(f32) -> f32) {
    if let Ok(x) = <&[f32; RED_LANES]>::try_from(x) {
        for l in 0..RED_LANES {
            acc[l] += f(x[l]);
        }
    } else {
        for (a, &v) in acc.iter_mut().zip(x) {
            *a += f(v);
        }
    }
}

const PORTABLE: Fns = Fns {
    sum: p_sum,
    sum_sq_dev: p_sum_sq_dev,
    shifted_sums: p_shifted_sums,
    dot: p_dot,
    sum_dot: p_sum_dot,
    shifted_sums_planes: p_shifted_sums_planes,
    sum_dot_planes: p_sum_dot_planes,
    bn_train: p_bn_train,
    scale_shift: p_scale_shift,
    bn_backward: p_bn_backward,
    relu_train: p_relu_train,
    relu: p_relu,
    relu_backward: p_relu_backward,
    add: p_add,
    max_update: p_max_update,
    deinterleave2: p_deinterleave2,
};

fn p_sum(x: &[f32]) -> f64 {
    reduce(x.len(), |i, len, [a]| lanes1(&x[i..i + len], a, |v| v))[0]
}

fn p_sum_sq_dev(x: &[f32], m: f32) -> f64 {
    reduce(x.len(), |i, len, [a]| {
        lanes1(&x[i..i + len], a, |v| (v - m) * (v - m))
    })[0]
}

fn p_shifted_sums(x: &[f32], k: f32) -> (f64, f64) {
    p_shifted_sums_planes(x, x.len(), 0, 1, k)
}

/// `(Σ a, Σ a · b)` lanes over one chunk, as [`lanes1`].
#[inline(always)]
fn lanes2(a: &[f32], b: &[f32], s: &mut [f32; RED_LANES], sx: &mut [f32; RED_LANES]) {
    if let (Ok(a), Ok(b)) = (
        <&[f32; RED_LANES]>::try_from(a),
        <&[f32; RED_LANES]>::try_from(b),
    ) {
        for l in 0..RED_LANES {
            s[l] += a[l];
            sx[l] += a[l] * b[l];
        }
    } else {
        for l in 0..a.len().min(b.len()) {
            s[l] += a[l];
            sx[l] += a[l] * b[l];
        }
    }
}

fn p_dot(a: &[f32], b: &[f32]) -> f64 {
    let b = &b[..a.len()];
    reduce(a.len(), |i, len, [acc]| {
        let (x, y) = (&a[i..i + len], &b[i..i + len]);
        if let (Ok(x), Ok(y)) = (
            <&[f32; RED_LANES]>::try_from(x),
            <&[f32; RED_LANES]>::try_from(y),
        ) {
            for l in 0..RED_LANES {
                acc[l] += x[l] * y[l];
            }
        } else {
            for l in 0..len {
                acc[l] += x[l] * y[l];
            }
        }
    })[0]
}

fn p_sum_dot(a: &[f32], b: &[f32]) -> (f64, f64) {
    p_sum_dot_planes(a, b, a.len(), 0, 1)
}

fn p_shifted_sums_planes(x: &[f32], len: usize, stride: usize, count: usize, k: f32) -> (f64, f64) {
    let [s, q] = reduce_planes(len, count, |j, i, n, [s, q]| {
        let x = &x[j * stride + i..][..n];
        if let Ok(x) = <&[f32; RED_LANES]>::try_from(x) {
            for l in 0..RED_LANES {
                let d = x[l] - k;
                s[l] += d;
                q[l] += d * d;
            }
        } else {
            for (l, &v) in x.iter().enumerate() {
                let d = v - k;
                s[l] += d;
                q[l] += d * d;
            }
        }
    });
    (s, q)
}

fn p_sum_dot_planes(a: &[f32], b: &[f32], len: usize, stride: usize, count: usize) -> (f64, f64) {
    let [s, sx] = reduce_planes(len, count, |j, i, n, [s, sx]| {
        let at = j * stride + i;
        lanes2(&a[at..at + n], &b[at..at + n], s, sx)
    });
    (s, sx)
}

pub(crate) fn p_bn_train(x: &mut [f32], xhat: &mut [f32], m: f32, s: f32, g: f32, b: f32) {
    for (h, v) in xhat.iter_mut().zip(x.iter_mut()) {
        *h = (*v - m) * s;
        *v = *h * g + b;
    }
}

pub(crate) fn p_scale_shift(x: &mut [f32], a: f32, b: f32) {
    x.iter_mut().for_each(|v| *v = *v * a + b);
}

pub(crate) fn p_bn_backward(d: &mut [f32], h: &[f32], k: f32, md: f32, mdx: f32) {
    for (d, &h) in d.iter_mut().zip(h) {
        *d = k * ((*d - md) - h * mdx);
    }
}

pub(crate) fn p_relu_train(x: &mut [f32], mask: &mut [u8]) {
    let mut chunks = x.chunks_exact_mut(8);
    let mut bytes = mask.iter_mut();
    for (xs, m) in (&mut chunks).zip(&mut bytes) {
        let xs: &mut [f32; 8] = xs.try_into().expect("8 values");
        let mut bits = 0u8;
        for l in 0..8 {
            bits |= ((xs[l] > 0.0) as u8) << l;
            xs[l] = xs[l].max(0.0);
        }
        *m = bits;
    }
    let rest = chunks.into_remainder();
    if let (false, Some(m)) = (rest.is_empty(), bytes.next()) {
        let mut bits = 0u8;
        for (l, v) in rest.iter_mut().enumerate() {
            bits |= ((*v > 0.0) as u8) << l;
            *v = v.max(0.0);
        }
        *m = bits;
    }
}

pub(crate) fn p_relu(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = v.max(0.0));
}

/// Per mask byte, the lane masks of its 8 bits (all ones where set): 8 KiB, so that the
/// portable backward ReLU is a vectorisable AND per value instead of a bit test.
static KEEP: [[u32; 8]; 256] = {
    let mut t = [[0u32; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let mut l = 0;
        while l < 8 {
            if b >> l & 1 != 0 {
                t[b][l] = u32::MAX;
            }
            l += 1;
        }
        b += 1;
    }
    t
};

pub(crate) fn p_relu_backward(d: &mut [f32], mask: &[u8]) {
    let full = d.len() / 8;
    let mut chunks = d.chunks_exact_mut(8);
    for (ds, &m) in (&mut chunks).zip(mask) {
        let ds: &mut [f32; 8] = ds.try_into().expect("8 values");
        let keep = &KEEP[m as usize];
        for l in 0..8 {
            // All ones where the bit is set (the value kept, NaN included), else +0.0.
            ds[l] = f32::from_bits(ds[l].to_bits() & keep[l]);
        }
    }
    let rest = chunks.into_remainder();
    if let Some(&m) = mask.get(full) {
        for (l, v) in rest.iter_mut().enumerate() {
            *v = if m >> l & 1 != 0 { *v } else { 0.0 };
        }
    }
}

pub(crate) fn p_add(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
}

/// The portable [`Vector::max_update`], written with bit masks instead of branches so that it
/// compiles to vector compares and blends (maxima of activations are unpredictable: branches
/// mispredict).
pub(crate) fn p_max_update(best: &mut [f32], tap: &mut [u32], v: &[f32], t: u32) {
    for ((b, a), &v) in best.iter_mut().zip(tap.iter_mut()).zip(v) {
        #[allow(clippy::eq_op)]
        let w = (v > *b) | ((v != v) & (*b == *b));
        let m = (w as u32).wrapping_neg();
        *b = f32::from_bits((b.to_bits() & !m) | (v.to_bits() & m));
        *a = (*a & !m) | (t & m);
    }
}

/// The portable [`Vector::deinterleave2`]: whole pairs by slices of known length, then the odd
/// value left.
pub(crate) fn p_deinterleave2(x: &[f32], even: &mut [f32], odd: &mut [f32]) {
    for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(x.chunks_exact(2)) {
        (*e, *o) = (pair[0], pair[1]);
    }
    if x.len() % 2 == 1 {
        even[x.len() / 2] = x[x.len() - 1];
    }
}
