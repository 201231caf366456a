//! The small-A row product `Y (p × n) := A (p × q) · X (q × n)` for tiny dense A (`p, q <=
//! SMALL_MAX`), X and Y given as row pointers: a skinny GEMM whose A lives in registers, with no
//! packing (Winograd's transforms Bᵀ, Aᵀ, G applied along one mode of a tensor).
//!
//! The body is written once against [`Simd`] and wrapped per ISA like the micro-kernels. Columns
//! are walked in chunks of `CHUNK` vectors, outermost, so the `q` row pieces of X a chunk reads
//! stay in L1 while the `p` output rows are accumulated in registers, each stored once. Exact zero
//! coefficients are skipped (the transforms are sparse); a skipped term contributes nothing even
//! when the X value is infinite or NaN.

use super::Simd;

/// Largest `p` and `q`.
pub(crate) const SMALL_MAX: usize = 16;

/// Vectors per column chunk (4 accumulators per output row).
const CHUNK: usize = 4;

/// The nonzero coefficients of each output row: `(count, X row index, value)`.
pub(crate) struct Nonzeros {
    count: [usize; SMALL_MAX],
    idx: [[usize; SMALL_MAX]; SMALL_MAX],
    val: [[f32; SMALL_MAX]; SMALL_MAX],
}

impl Nonzeros {
    /// From a row-major `p × q` A (`a.len() >= p * q`, `p, q <= SMALL_MAX`, checked by the caller).
    pub(crate) fn new(a: &[f32], p: usize, q: usize) -> Self {
        let mut nz = Nonzeros {
            count: [0; SMALL_MAX],
            idx: [[0; SMALL_MAX]; SMALL_MAX],
            val: [[0.0; SMALL_MAX]; SMALL_MAX],
        };
        for j in 0..p {
            for (i, &v) in a[j * q..(j + 1) * q].iter().enumerate() {
                if v != 0.0 {
                    let c = nz.count[j];
                    nz.idx[j][c] = i;
                    nz.val[j][c] = v;
                    nz.count[j] = c + 1;
                }
            }
        }
        nz
    }
}

/// `y[j][c] = Σ_t val[j][t] · x[idx[j][t]][c]` for `j < ys.len()`, `c < n`.
///
/// # Safety
/// Every `xs[i]` (for `i` an index in `nz`) points to `n` readable f32, every `ys[j]` to `n`
/// writable f32 that no `xs` row overlaps; the caller is compiled with `S`'s target features.
#[inline(always)]
pub(crate) unsafe fn small_a_body<S: Simd>(
    nz: &Nonzeros,
    xs: &[*const f32],
    ys: &[*mut f32],
    n: usize,
) {
    let step = CHUNK * S::LANES;
    // SAFETY: every access below is at a column `< n` of a row the caller vouches for.
    unsafe {
        let mut c = 0;
        while c + step <= n {
            for (j, &y) in ys.iter().enumerate() {
                let mut acc = [S::zero(); CHUNK];
                for t in 0..nz.count[j] {
                    let va = S::splat(nz.val[j][t]);
                    let xp = xs[nz.idx[j][t]].add(c);
                    for (v, acc) in acc.iter_mut().enumerate() {
                        *acc = S::fma(va, S::load(xp.add(v * S::LANES)), *acc);
                    }
                }
                for (v, acc) in acc.iter().enumerate() {
                    S::store(y.add(c + v * S::LANES), *acc);
                }
            }
            c += step;
        }
        while c + S::LANES <= n {
            for (j, &y) in ys.iter().enumerate() {
                let mut acc = S::zero();
                for t in 0..nz.count[j] {
                    let xp = xs[nz.idx[j][t]].add(c);
                    acc = S::fma(S::splat(nz.val[j][t]), S::load(xp), acc);
                }
                S::store(y.add(c), acc);
            }
            c += S::LANES;
        }
        for c in c..n {
            for (j, &y) in ys.iter().enumerate() {
                let mut s = 0.0f32;
                for t in 0..nz.count[j] {
                    s += nz.val[j][t] * *xs[nz.idx[j][t]].add(c);
                }
                *y.add(c) = s;
            }
        }
    }
}
