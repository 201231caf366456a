//! AVX2 bodies of [`crate::vector`]: 8-lane loops unrolled by four vectors, a last partial vector
//! through masked loads and stores, and the reductions in the order the module documents (32 f32
//! lanes as four vectors, flushed into eight f64x4 vectors every 1024 terms, then a fixed tree).
//! The `avx512` family uses these bodies too.

use core::arch::x86_64::*;

use crate::vector::{Fns, RED_BLOCK, RED_LANES};

pub(crate) const AVX2: Fns = Fns {
    sum,
    sum_sq_dev,
    shifted_sums,
    dot,
    sum_dot,
    shifted_sums_planes,
    sum_dot_planes,
    bn_train,
    scale_shift,
    bn_backward,
    relu_train,
    relu,
    relu_backward,
    add,
    max_update,
    deinterleave2,
};

/// `MASKS[8 − r..][..8]` as i32 lanes: the first `r` all-ones, the rest zero.
static MASKS: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

/// The lane mask of the first `r` lanes (`1 <= r <= 8`).
#[inline(always)]
unsafe fn lanes(r: usize) -> __m256i {
    debug_assert!((1..=8).contains(&r));
    // SAFETY: `8 − r + 8 <= 16` values of `MASKS`.
    unsafe { _mm256_loadu_si256(MASKS.as_ptr().add(8 - r).cast()) }
}

/// The terms of `K` sums, 8 at a time.
trait Terms<const K: usize> {
    /// Terms `i..i + 8` (all in range).
    unsafe fn at(&self, i: usize) -> [__m256; K];
    /// Terms `i..i + r`, `r < 8` (the others +0.0); `m = lanes(r)`.
    unsafe fn part(&self, i: usize, m: __m256i) -> [__m256; K];
}

/// The reduction of the module documentation over `n` terms: one plane of `n`.
#[inline(always)]
unsafe fn reduce<const K: usize, T: Terms<K> + Copy>(t: &T, n: usize) -> [f64; K] {
    // SAFETY: the caller's range and features.
    unsafe { reduce_planes(|_| *t, n, 1) }
}

/// The reduction of the module documentation over `count` planes of `len` terms, plane `j`'s
/// terms from `plane(j)`: each plane's term `i` into f32 lane `i mod 32` (a plane starts at lane
/// 0), the f32 lanes flushed into the f64 lanes after every 32 chunks (a chunk: 32 terms of a
/// plane, or its last partial chunk) and at the end.
#[inline(always)]
unsafe fn reduce_planes<const K: usize, T: Terms<K>>(
    plane: impl Fn(usize) -> T,
    len: usize,
    count: usize,
) -> [f64; K] {
    // SAFETY: (whole body) the caller runs with avx2; `plane(j)` reads only terms `< len`.
    unsafe {
        let mut d = [[_mm256_setzero_pd(); 8]; K];
        // Chunks left before the next flush.
        let mut room = RED_BLOCK / RED_LANES;
        let mut a = [[_mm256_setzero_ps(); 4]; K];
        for j in 0..count {
            let t = plane(j);
            let mut i = 0;
            while i < len {
                // The terms up to the next flush, or the plane's end: whole chunks, then the
                // plane's partial last chunk.
                let end = len.min(i + room * RED_LANES);
                while i + RED_LANES <= end {
                    for v in 0..4 {
                        let x = t.at(i + 8 * v);
                        for k in 0..K {
                            a[k][v] = _mm256_add_ps(a[k][v], x[k]);
                        }
                    }
                    i += RED_LANES;
                    room -= 1;
                }
                if i < end {
                    for v in 0..4 {
                        let at = i + 8 * v;
                        let x = if at + 8 <= end {
                            t.at(at)
                        } else if at < end {
                            t.part(at, lanes(end - at))
                        } else {
                            [_mm256_setzero_ps(); K]
                        };
                        for k in 0..K {
                            a[k][v] = _mm256_add_ps(a[k][v], x[k]);
                        }
                    }
                    i = end;
                    room -= 1;
                }
                if room == 0 {
                    flush(&a, &mut d);
                    a = [[_mm256_setzero_ps(); 4]; K];
                    room = RED_BLOCK / RED_LANES;
                }
            }
        }
        if room < RED_BLOCK / RED_LANES {
            flush(&a, &mut d);
        }
        let mut out = [0f64; K];
        for k in 0..K {
            let q = &d[k];
            let e = _mm256_add_pd(
                _mm256_add_pd(_mm256_add_pd(q[0], q[1]), _mm256_add_pd(q[2], q[3])),
                _mm256_add_pd(_mm256_add_pd(q[4], q[5]), _mm256_add_pd(q[6], q[7])),
            );
            // (e0 + e2, e1 + e3), then their sum.
            let h = _mm_add_pd(_mm256_castpd256_pd128(e), _mm256_extractf128_pd::<1>(e));
            out[k] = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
        }
        out
    }
}

/// Adds the f32 lanes `a` into the f64 lanes `d` (lane `8v + l` of `a[k]`: f64 lane of vector
/// `2v + l / 4`, position `l mod 4`).
#[inline(always)]
unsafe fn flush<const K: usize>(a: &[[__m256; 4]; K], d: &mut [[__m256d; 8]; K]) {
    // SAFETY: (whole body) the caller runs with avx2.
    unsafe {
        for k in 0..K {
            for v in 0..4 {
                let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(a[k][v]));
                let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(a[k][v]));
                d[k][2 * v] = _mm256_add_pd(d[k][2 * v], lo);
                d[k][2 * v + 1] = _mm256_add_pd(d[k][2 * v + 1], hi);
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Plain(*const f32);
impl Terms<1> for Plain {
    #[inline(always)]
    unsafe fn at(&self, i: usize) -> [__m256; 1] {
        // SAFETY: the caller's range and features.
        unsafe { [_mm256_loadu_ps(self.0.add(i))] }
    }
    #[inline(always)]
    unsafe fn part(&self, i: usize, m: __m256i) -> [__m256; 1] {
        // SAFETY: masked-off lanes are not read.
        unsafe { [_mm256_maskload_ps(self.0.add(i), m)] }
    }
}

#[derive(Clone, Copy)]
struct SqDev(*const f32, __m256);
impl Terms<1> for SqDev {
    #[inline(always)]
    unsafe fn at(&self, i: usize) -> [__m256; 1] {
        // SAFETY: the caller's range and features.
        unsafe {
            let d = _mm256_sub_ps(_mm256_loadu_ps(self.0.add(i)), self.1);
            [_mm256_mul_ps(d, d)]
        }
    }
    #[inline(always)]
    unsafe fn part(&self, i: usize, m: __m256i) -> [__m256; 1] {
        // SAFETY: masked-off lanes are not read; their terms are zeroed.
        unsafe {
            let d = _mm256_sub_ps(_mm256_maskload_ps(self.0.add(i), m), self.1);
            [_mm256_and_ps(_mm256_mul_ps(d, d), _mm256_castsi256_ps(m))]
        }
    }
}

#[derive(Clone, Copy)]
struct Shifted(*const f32, __m256);
impl Terms<2> for Shifted {
    #[inline(always)]
    unsafe fn at(&self, i: usize) -> [__m256; 2] {
        // SAFETY: the caller's range and features.
        unsafe {
            let d = _mm256_sub_ps(_mm256_loadu_ps(self.0.add(i)), self.1);
            [d, _mm256_mul_ps(d, d)]
        }
    }
    #[inline(always)]
    unsafe fn part(&self, i: usize, m: __m256i) -> [__m256; 2] {
        // SAFETY: masked-off lanes are not read; their terms are zeroed.
        unsafe {
            let d = _mm256_sub_ps(_mm256_maskload_ps(self.0.add(i), m), self.1);
            let d = _mm256_and_ps(d, _mm256_castsi256_ps(m));
            [d, _mm256_mul_ps(d, d)]
        }
    }
}

#[derive(Clone, Copy)]
struct Dot(*const f32, *const f32);
impl Terms<1> for Dot {
    #[inline(always)]
    unsafe fn at(&self, i: usize) -> [__m256; 1] {
        // SAFETY: the caller's range and features.
        unsafe {
            [_mm256_mul_ps(
                _mm256_loadu_ps(self.0.add(i)),
                _mm256_loadu_ps(self.1.add(i)),
            )]
        }
    }
    #[inline(always)]
    unsafe fn part(&self, i: usize, m: __m256i) -> [__m256; 1] {
        // SAFETY: masked-off lanes are not read (0 · 0 there).
        unsafe {
            [_mm256_mul_ps(
                _mm256_maskload_ps(self.0.add(i), m),
                _mm256_maskload_ps(self.1.add(i), m),
            )]
        }
    }
}

#[derive(Clone, Copy)]
struct SumDot(*const f32, *const f32);
impl Terms<2> for SumDot {
    #[inline(always)]
    unsafe fn at(&self, i: usize) -> [__m256; 2] {
        // SAFETY: the caller's range and features.
        unsafe {
            let a = _mm256_loadu_ps(self.0.add(i));
            [a, _mm256_mul_ps(a, _mm256_loadu_ps(self.1.add(i)))]
        }
    }
    #[inline(always)]
    unsafe fn part(&self, i: usize, m: __m256i) -> [__m256; 2] {
        // SAFETY: masked-off lanes are not read (0 and 0 · 0 there).
        unsafe {
            let a = _mm256_maskload_ps(self.0.add(i), m);
            [a, _mm256_mul_ps(a, _mm256_maskload_ps(self.1.add(i), m))]
        }
    }
}

/// # Safety
/// AVX2 (and FMA, as every family table entry) present.
#[target_feature(enable = "avx2,fma")]
unsafe fn sum(x: &[f32]) -> f64 {
    // SAFETY: the terms read `x[..len]`.
    unsafe { reduce(&Plain(x.as_ptr()), x.len())[0] }
}

/// # Safety
/// As [`sum`].
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_sq_dev(x: &[f32], m: f32) -> f64 {
    // SAFETY: the terms read `x[..len]`.
    unsafe { reduce(&SqDev(x.as_ptr(), _mm256_set1_ps(m)), x.len())[0] }
}

/// # Safety
/// As [`sum`].
#[target_feature(enable = "avx2,fma")]
unsafe fn shifted_sums(x: &[f32], k: f32) -> (f64, f64) {
    // SAFETY: one plane, `x[..len]`.
    unsafe { shifted_sums_planes(x, x.len(), 0, 1, k) }
}

/// # Safety
/// As [`sum`]; `b.len() >= a.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot(a: &[f32], b: &[f32]) -> f64 {
    debug_assert!(b.len() >= a.len());
    // SAFETY: the terms read `a[..len]`, `b[..len]`.
    unsafe { reduce(&Dot(a.as_ptr(), b.as_ptr()), a.len())[0] }
}

/// # Safety
/// As [`dot`].
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_dot(a: &[f32], b: &[f32]) -> (f64, f64) {
    debug_assert!(b.len() >= a.len());
    // SAFETY: one plane, `a[..len]` and `b[..len]`.
    unsafe { sum_dot_planes(a, b, a.len(), 0, 1) }
}

/// # Safety
/// As [`sum`]; `(count − 1) · stride + len <= x.len()` when `count > 0`.
#[target_feature(enable = "avx2,fma")]
unsafe fn shifted_sums_planes(
    x: &[f32],
    len: usize,
    stride: usize,
    count: usize,
    k: f32,
) -> (f64, f64) {
    let (p, k) = (x.as_ptr(), _mm256_set1_ps(k));
    // SAFETY: plane `j` reads `x[j · stride..][..len]`, in range by the caller's bound.
    let [s, q] = unsafe { reduce_planes(|j| Shifted(p.add(j * stride), k), len, count) };
    (s, q)
}

/// # Safety
/// As [`sum`]; `(count − 1) · stride + len` values readable in `a` and `b` when `count > 0`.
#[target_feature(enable = "avx2,fma")]
unsafe fn sum_dot_planes(
    a: &[f32],
    b: &[f32],
    len: usize,
    stride: usize,
    count: usize,
) -> (f64, f64) {
    let (p, q) = (a.as_ptr(), b.as_ptr());
    // SAFETY: plane `j` reads `a[j · stride..][..len]` and `b[..]` alike, in range by the
    // caller's bound.
    let [s, sx] =
        unsafe { reduce_planes(|j| SumDot(p.add(j * stride), q.add(j * stride)), len, count) };
    (s, sx)
}

/// The values before `p` reaches a 32-byte boundary (0..8). The main loops start there, so that
/// their stores (and the loads of operands at the same offset, as tensors from one allocator
/// are) do not straddle cache lines: 16 bytes past a boundary, where large blocks from malloc
/// start, cost bn_train 2.2x at 1024 values.
#[inline(always)]
fn lead(p: *const f32) -> usize {
    (32 - (p as usize) % 32) % 32 / 4
}

/// The element-wise loop over `n >= 8` values: `calc(i)` computes the vector of results of
/// values `i..i + 8` from the inputs (no stores), `put(i, r)` stores it. The first vector
/// (`0..8`) and the last (`n − 8..n`) are computed before anything is stored, the main loop
/// covers `lead..` in whole vectors (four per step when possible), and the first and last vectors
/// are stored after it: they overlap values the main loop wrote, with the same results (every
/// result depends only on its own index's inputs). No masked or partial vector anywhere
/// (`vmaskmovps` stores are slow on Zen 4: a 64-value call with a masked head and tail took 2x
/// the scalar loop's time).
#[inline(always)]
unsafe fn each8<R: Copy>(
    n: usize,
    lead: usize,
    mut calc: impl FnMut(usize) -> R,
    mut put: impl FnMut(usize, R),
) {
    debug_assert!(n >= 8 && lead < 8);
    let (first, last) = (calc(0), calc(n - 8));
    let mut i = lead;
    while i + 32 <= n {
        for v in 0..4 {
            let r = calc(i + 8 * v);
            put(i + 8 * v, r);
        }
        i += 32;
    }
    while i + 8 <= n {
        let r = calc(i);
        put(i, r);
        i += 8;
    }
    put(0, first);
    put(n - 8, last);
}

#[inline(always)]
unsafe fn ld(p: *const f32) -> __m256 {
    // SAFETY: the caller guarantees 8 readable values.
    unsafe { _mm256_loadu_ps(p) }
}

#[inline(always)]
unsafe fn st(p: *mut f32, v: __m256) {
    // SAFETY: the caller guarantees 8 writable values.
    unsafe { _mm256_storeu_ps(p, v) }
}

/// # Safety
/// As [`sum`]; `xhat.len() >= x.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn bn_train(x: &mut [f32], xhat: &mut [f32], m: f32, s: f32, g: f32, b: f32) {
    debug_assert!(xhat.len() >= x.len());
    if x.len() < 8 {
        return crate::vector::p_bn_train(x, xhat, m, s, g, b);
    }
    let (xp, hp) = (x.as_mut_ptr(), xhat.as_mut_ptr());
    let (m, s, g, b) = (
        _mm256_set1_ps(m),
        _mm256_set1_ps(s),
        _mm256_set1_ps(g),
        _mm256_set1_ps(b),
    );
    // SAFETY: `each8` visits vectors inside `0..len` of both slices.
    unsafe {
        each8(
            x.len(),
            lead(xp),
            |i| {
                let h = _mm256_mul_ps(_mm256_sub_ps(ld(xp.add(i)), m), s);
                (h, _mm256_add_ps(_mm256_mul_ps(h, g), b))
            },
            |i, (h, y)| {
                st(hp.add(i), h);
                st(xp.add(i), y);
            },
        )
    }
}

/// # Safety
/// As [`sum`].
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_shift(x: &mut [f32], a: f32, b: f32) {
    if x.len() < 8 {
        return crate::vector::p_scale_shift(x, a, b);
    }
    let xp = x.as_mut_ptr();
    let (a, b) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
    // SAFETY: `each8` visits vectors inside `0..len`.
    unsafe {
        each8(
            x.len(),
            lead(xp),
            |i| _mm256_add_ps(_mm256_mul_ps(ld(xp.add(i)), a), b),
            |i, y| st(xp.add(i), y),
        )
    }
}

/// # Safety
/// As [`sum`]; `h.len() >= d.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn bn_backward(d: &mut [f32], h: &[f32], k: f32, md: f32, mdx: f32) {
    debug_assert!(h.len() >= d.len());
    if d.len() < 8 {
        return crate::vector::p_bn_backward(d, h, k, md, mdx);
    }
    let (dp, hp) = (d.as_mut_ptr(), h.as_ptr());
    let (kk, md, mdx) = (_mm256_set1_ps(k), _mm256_set1_ps(md), _mm256_set1_ps(mdx));
    // SAFETY: `each8` visits vectors inside `0..len` of both slices.
    unsafe {
        each8(
            d.len(),
            lead(dp),
            |i| {
                let t = _mm256_sub_ps(
                    _mm256_sub_ps(ld(dp.add(i)), md),
                    _mm256_mul_ps(ld(hp.add(i)), mdx),
                );
                _mm256_mul_ps(kk, t)
            },
            |i, y| st(dp.add(i), y),
        )
    }
}

/// `max(v, 0)` as `f32::max` (NaN → 0): `vmaxps` returns its second operand when either is NaN.
#[inline(always)]
unsafe fn relu8(v: __m256) -> __m256 {
    // SAFETY: the caller runs with avx.
    unsafe { _mm256_max_ps(v, _mm256_setzero_ps()) }
}

/// `x > 0` per lane as 8 bits.
#[inline(always)]
unsafe fn pos_bits(v: __m256) -> u32 {
    // SAFETY: the caller runs with avx.
    unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(v, _mm256_setzero_ps())) as u32 }
}

/// # Safety
/// As [`sum`]; `mask.len() >= ceil(x.len() / 8)`.
#[target_feature(enable = "avx2,fma")]
unsafe fn relu_train(x: &mut [f32], mask: &mut [u8]) {
    let n = x.len();
    debug_assert!(mask.len() >= n.div_ceil(8));
    if n < 8 {
        return crate::vector::p_relu_train(x, mask);
    }
    let (xp, mp) = (x.as_mut_ptr(), mask.as_mut_ptr());
    // As `each8`, with the bits going out through a little bit stream: `acc` holds `nacc < 32`
    // pending bits of the values from byte `at` on. The first vector gives the bits of the
    // values before the main loop, the last those after it.
    // SAFETY: (whole body) vectors inside `0..n`; whole u32 words are written only once their
    // 32 values are done (so bytes below `ceil(n / 8)`), the rest by the flush at the end.
    unsafe {
        let lead = lead(xp);
        let (first, last) = (ld(xp), ld(xp.add(n - 8)));
        let (mut acc, mut nacc, mut at) = (
            (pos_bits(first) & ((1 << lead) - 1)) as u64,
            lead as u32,
            0usize,
        );
        let mut i = lead;
        while i + 32 <= n {
            let mut bits = 0u32;
            for v in 0..4 {
                let y = ld(xp.add(i + 8 * v));
                bits |= pos_bits(y) << (8 * v);
                st(xp.add(i + 8 * v), relu8(y));
            }
            acc |= (bits as u64) << nacc;
            mp.add(at)
                .cast::<u32>()
                .write_unaligned((acc as u32).to_le());
            at += 4;
            acc >>= 32;
            i += 32;
        }
        while i + 8 <= n {
            let y = ld(xp.add(i));
            acc |= (pos_bits(y) as u64) << nacc;
            nacc += 8;
            st(xp.add(i), relu8(y));
            if nacc >= 32 {
                mp.add(at)
                    .cast::<u32>()
                    .write_unaligned((acc as u32).to_le());
                at += 4;
                acc >>= 32;
                nacc -= 32;
            }
            i += 8;
        }
        // The `r = n − i` values after the main loop are the last `r` lanes of `last`.
        let r = (n - i) as u32;
        if r > 0 {
            acc |= ((pos_bits(last) >> (8 - r)) as u64) << nacc;
            nacc += r;
        }
        st(xp, relu8(first));
        st(xp.add(n - 8), relu8(last));
        for b in 0..nacc.div_ceil(8) as usize {
            *mp.add(at + b) = (acc >> (8 * b)) as u8;
        }
    }
}

/// # Safety
/// As [`sum`].
#[target_feature(enable = "avx2,fma")]
unsafe fn relu(x: &mut [f32]) {
    if x.len() < 8 {
        return crate::vector::p_relu(x);
    }
    let xp = x.as_mut_ptr();
    // SAFETY: `each8` visits vectors inside `0..len`.
    unsafe {
        each8(
            x.len(),
            lead(xp),
            |i| relu8(ld(xp.add(i))),
            |i, y| st(xp.add(i), y),
        )
    }
}

/// `v` where `keep`'s lanes are all ones, +0.0 elsewhere, through an opaque `vandps`: written as
/// an intrinsic, LLVM turns `store(load(p) & keep, p)` into a masked store of zeros
/// (`vpmaskmovd`), ~3x slower on Zen 4.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn keep8(v: __m256, keep: __m256i) -> __m256 {
    let mut v = v;
    // SAFETY: a register-only AVX instruction (the caller runs with avx).
    unsafe {
        std::arch::asm!(
            "vandps {v}, {v}, {k}",
            v = inout(ymm_reg) v,
            k = in(ymm_reg) keep,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    v
}

/// # Safety
/// As [`sum`]; `mask.len() >= ceil(d.len() / 8)`.
#[target_feature(enable = "avx2,fma")]
unsafe fn relu_backward(d: &mut [f32], mask: &[u8]) {
    let n = d.len();
    debug_assert!(mask.len() >= n.div_ceil(8));
    if n < 8 {
        return crate::vector::p_relu_backward(d, mask);
    }
    let (dp, mp) = (d.as_mut_ptr(), mask.as_ptr());
    // Lane l of `bit[v]` selects bit 8v + l of a 32-bit word.
    let bit: [__m256i; 4] = std::array::from_fn(|v| {
        let b = 1i32.wrapping_shl(8 * v as u32);
        _mm256_setr_epi32(b, b << 1, b << 2, b << 3, b << 4, b << 5, b << 6, b << 7)
    });
    let nbytes = n.div_ceil(8);
    // The bits of values `i..i + 8` (any `i <= n − 8`: bytes `i / 8` and, when `i % 8 > 0`,
    // `i / 8 + 1 <= (n − 1) / 8`).
    let bits8 = |i: usize| -> u32 {
        // SAFETY: both bytes are below `nbytes` (above).
        unsafe {
            let lo = *mp.add(i / 8) as u32;
            let hi = if !i.is_multiple_of(8) {
                *mp.add(i / 8 + 1) as u32
            } else {
                0
            };
            (lo | hi << 8) >> (i % 8)
        }
    };
    let sel = |y: __m256, b: u32, v: usize| {
        let keep = _mm256_cmpeq_epi32(
            _mm256_and_si256(_mm256_set1_epi32(b as i32), bit[v]),
            bit[v],
        );
        // SAFETY: register-only (avx).
        unsafe { keep8(y, keep) }
    };
    // SAFETY: (whole body) vectors inside `0..n`; mask bytes below `nbytes`: the main loop's
    // 32 values `i..i + 32` span bytes `i / 8 ..= (i + 31) / 8`, the fifth (`i / 8 + 4`) only
    // read when `i % 8 > 0`.
    unsafe {
        let lead = lead(dp);
        let first = sel(ld(dp), bits8(0), 0);
        let last = sel(ld(dp.add(n - 8)), bits8(n - 8), 0);
        let mut i = lead;
        while i + 32 <= n {
            let w = mp.add(i / 8).cast::<u32>().read_unaligned().to_le() as u64;
            let w5 = if lead > 0 {
                (*mp.add(i / 8 + 4) as u64) << 32
            } else {
                0
            };
            let bits = ((w | w5) >> lead) as u32;
            for v in 0..4 {
                st(dp.add(i + 8 * v), sel(ld(dp.add(i + 8 * v)), bits, v));
            }
            i += 32;
        }
        while i + 8 <= n {
            st(dp.add(i), sel(ld(dp.add(i)), bits8(i), 0));
            i += 8;
        }
        debug_assert!(nbytes >= 1);
        st(dp, first);
        st(dp.add(n - 8), last);
    }
}

/// # Safety
/// As [`sum`]; `b.len() >= a.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn add(a: &mut [f32], b: &[f32]) {
    debug_assert!(b.len() >= a.len());
    if a.len() < 8 {
        return crate::vector::p_add(a, b);
    }
    let (ap, bp) = (a.as_mut_ptr(), b.as_ptr());
    // SAFETY: `each8` visits vectors inside `0..len` of both slices.
    unsafe {
        each8(
            a.len(),
            lead(ap),
            |i| _mm256_add_ps(ld(ap.add(i)), ld(bp.add(i))),
            |i, y| st(ap.add(i), y),
        )
    }
}

/// # Safety
/// As [`sum`]; `tap` and `v` hold at least `best.len()` values.
#[target_feature(enable = "avx2,fma")]
unsafe fn max_update(best: &mut [f32], tap: &mut [u32], v: &[f32], t: u32) {
    let n = best.len();
    debug_assert!(tap.len() >= n && v.len() >= n);
    if n < 8 {
        return crate::vector::p_max_update(best, tap, v, t);
    }
    let (bp, ap, vp) = (best.as_mut_ptr(), tap.as_mut_ptr(), v.as_ptr());
    let tv = _mm256_castsi256_ps(_mm256_set1_epi32(t as i32));
    // v > b, or v NaN where b is not: the scalar loop's `wins`.
    let upd = |i: usize| {
        // SAFETY: `i + 8 <= n`: 8 values of each slice.
        unsafe {
            let (b, x) = (ld(bp.add(i)), ld(vp.add(i)));
            let a = ld(ap.add(i).cast());
            let gt = _mm256_cmp_ps::<_CMP_GT_OQ>(x, b);
            let nan = _mm256_and_ps(
                _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x),
                _mm256_cmp_ps::<_CMP_ORD_Q>(b, b),
            );
            let w = _mm256_or_ps(gt, nan);
            (_mm256_blendv_ps(b, x, w), _mm256_blendv_ps(a, tv, w))
        }
    };
    let put = |i: usize, (b, a): (__m256, __m256)| {
        // SAFETY: as in `upd`.
        unsafe {
            st(bp.add(i), b);
            st(ap.add(i).cast(), a);
        }
    };
    // Vectors at 0, 8, 16, .. from the slice's start (not from an aligned boundary as `each8`),
    // and a last one overlapping them when `n % 8 != 0`, computed before anything is stored:
    // the pool calls this kernel several times over the same row, and each call's loads then
    // line up with the previous call's stores but for the last vector (ResNet-50's stem pool
    // 5.04-5.23 -> 4.87-4.91 ms a step against `each8`, quiet 12:40:41 UTC).
    let last = upd(n - 8);
    let mut i = 0;
    while i + 8 <= n {
        put(i, upd(i));
        i += 8;
    }
    if i < n {
        put(n - 8, last);
    }
}

/// # Safety
/// As [`sum`]; `even` holds `x.len().div_ceil(2)` values and `odd` `x.len() / 2`.
#[target_feature(enable = "avx2,fma")]
unsafe fn deinterleave2(x: &[f32], even: &mut [f32], odd: &mut [f32]) {
    let pairs = x.len() / 2;
    debug_assert!(even.len() >= x.len().div_ceil(2) && odd.len() >= pairs);
    if pairs < 8 {
        return crate::vector::p_deinterleave2(x, even, odd);
    }
    let (xp, ep, op) = (x.as_ptr(), even.as_mut_ptr(), odd.as_mut_ptr());
    // SAFETY: `each8` visits pair vectors `i..i + 8` inside `0..pairs`: they read `x[2i..2i +
    // 16]`, inside the `2 · pairs` values of whole pairs, and write `i..i + 8` of both halves.
    unsafe {
        each8(
            pairs,
            lead(ep),
            |i| {
                let (lo, hi) = (ld(xp.add(2 * i)), ld(xp.add(2 * i + 8)));
                // Per 128-bit half: [lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6], then the 64-bit
                // pieces in the order 0 2 1 3.
                let e = _mm256_shuffle_ps::<0b10_00_10_00>(lo, hi);
                let o = _mm256_shuffle_ps::<0b11_01_11_01>(lo, hi);
                let fix = |v: __m256| {
                    _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)))
                };
                (fix(e), fix(o))
            },
            |i, (e, o)| {
                st(ep.add(i), e);
                st(op.add(i), o);
            },
        );
        if x.len() % 2 == 1 {
            *ep.add(pairs) = *xp.add(x.len() - 1);
        }
    }
}
