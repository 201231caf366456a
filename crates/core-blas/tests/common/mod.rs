//! Shared helpers of the integration tests: a naive reference GEMM, random data, tolerances.
#![allow(dead_code)]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Random values in [-1, 1).
pub fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// An element accessor over a strided slice.
#[derive(Clone, Copy)]
pub struct Strided<'a> {
    /// The storage.
    pub data: &'a [f32],
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

impl Strided<'_> {
    /// Element (i, j).
    pub fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.rs + j * self.cs]
    }
}

/// Error bound for one element of `alpha·A·B + beta·C0` computed in f32: the classical
/// dot-product bound `γ_k ≈ k·u` on the sum of absolute products (with `u = 2⁻²⁴`, doubled for
/// the alpha/beta combination and the FMA ordering), plus a tiny absolute floor.
#[derive(Clone, Copy, Debug)]
pub struct Tolerance {
    /// Relative bound per accumulated term (times k + 3).
    pub rel_per_term: f32,
    /// Absolute floor.
    pub abs: f32,
}

/// The tolerance of every GEMM test.
pub const GEMM_TOL: Tolerance = Tolerance {
    rel_per_term: 2.0 * f32::EPSILON,
    abs: 1e-6,
};

/// Naive reference in f64: returns (value, bound) per element of the m×n result.
#[allow(clippy::too_many_arguments)]
pub fn reference(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: Strided<'_>,
    b: Strided<'_>,
    beta: f32,
    c0: Strided<'_>,
    tol: Tolerance,
) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut sabs) = (0.0f64, 0.0f64);
            for p in 0..k {
                let t = a.at(i, p) as f64 * b.at(p, j) as f64;
                s += t;
                sabs += t.abs();
            }
            let c = if beta == 0.0 {
                0.0
            } else {
                beta as f64 * c0.at(i, j) as f64
            };
            let v = alpha as f64 * s + c;
            let bound =
                (k as f64 + 3.0) * tol.rel_per_term as f64 * (alpha.abs() as f64 * sabs + c.abs())
                    + tol.abs as f64;
            out.push((v, bound));
        }
    }
    out
}

/// Compare `c` (strided) with the reference, panicking with the first bad element.
pub fn assert_close(what: &str, c: Strided<'_>, m: usize, n: usize, expect: &[(f64, f64)]) {
    for i in 0..m {
        for j in 0..n {
            let (v, bound) = expect[i * n + j];
            let got = c.at(i, j) as f64;
            assert!(
                (got - v).abs() <= bound,
                "{what}: C[{i},{j}] = {got}, expected {v} ± {bound}"
            );
        }
    }
}

/// The kernel families a test covers: the one `CORE_BLAS_ISA` forces (panicking loudly if the
/// host lacks it, so a forced run can never silently test another family), else every family
/// the host supports.
pub fn families() -> Vec<core_blas::Isa> {
    match std::env::var("CORE_BLAS_ISA") {
        Ok(name) if !name.trim().is_empty() => {
            let isa = core_blas::Isa::from_name(&name).expect("CORE_BLAS_ISA names a family");
            assert!(
                isa.is_available(),
                "CORE_BLAS_ISA={name}: this host cannot run that family"
            );
            vec![isa]
        }
        _ => core_blas::Isa::available(),
    }
}

/// `len` small integers `(i · mul) mod modulo − modulo / 2`: sums of their products are exact in
/// f32 in any order for the tests' sizes.
pub fn ints(len: usize, mul: usize, modulo: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * mul) % modulo) as f32 - (modulo / 2) as f32)
        .collect()
}
