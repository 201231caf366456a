//! Cook-Toom / CRT synthesis of the Winograd transforms Aᵀ, G, Bᵀ of F(m, r) in exact arithmetic.
//!
//! F(m, r) computes `m` outputs of the correlation `y_i = Σ_k d_{i+k} g_k` of an `r`-tap kernel `g`
//! with an input tile `d` of `α = m + r − 1` values as
//!
//! ```text
//! y = Aᵀ [ (G g) ⊙ (Bᵀ d) ]        Aᵀ: m×α,  G: α×r,  Bᵀ: α×α
//! ```
//!
//! # Construction (Algorithm 1 of Budden et al., Theorem 1)
//!
//! The correlation is the transpose of the linear convolution `s(x) = g(x) h(x)` of an `r`-tap and
//! an `m`-tap polynomial, `s` of degree `α − 1`. That product is computed modulo
//! `M(x) = Π_j (x − a_j)` over `α − 1` finite points plus the point at infinity (or over `α` finite
//! points): the residues `g mod (x − a_j) = g(a_j)` are evaluations (Vandermonde rows; the point at
//! infinity evaluates the leading coefficient), the residue products are scalar products, and the CRT
//! reconstruction is Lagrange interpolation, `s(x) = Σ_j s(a_j) L_j(x) [+ s_∞ M(x)]`. Writing
//! `V_n` for the α×n evaluation matrix and `W` for the interpolation matrix (column `j` holds the
//! coefficients of the CRT reconstruction polynomial of point `j`), `s = W [(V_r g) ⊙ (V_m h)]`, and
//! transposing the bilinear algorithm gives the correlation:
//!
//! ```text
//! Aᵀ = V_mᵀ,   G = D⁻¹ V_r,   Bᵀ = D Wᵀ
//! ```
//!
//! # Normalization convention (wincnn's)
//!
//! Any diagonal `D` leaves the algorithm exact. We follow Lavin's wincnn (`FractionsInG`): for a
//! finite point `a_j`, `D_j = f_j = Π_{k≠j} (a_j − a_k)` over the other finite points, so that the
//! rows of Bᵀ are the integer-friendly coefficients of `Π_{k≠j} (x − a_k)` and the fractions land in
//! G (applied once per weight update); `D_∞ = 1`; and, as in wincnn, the first row's sign is flipped
//! when `f_0 < 0`. With this convention F(2,3), F(4,3), F(6,3) from the usual points reproduce the
//! published matrices exactly (see the golden tests).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use num_rational::BigRational;
use num_traits::{One, Zero};

use crate::error::{FastconvError, Result};
use crate::rational::{Point, Poly, is_negative, to_f64};

/// A dense row-major matrix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DenseMatrix<T> {
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// `rows * cols` entries, row-major.
    pub data: Vec<T>,
}

impl<T> DenseMatrix<T> {
    /// Entry `(i, j)`; `debug_assert!`s the bounds (callers index within `rows`, `cols`).
    pub fn at(&self, i: usize, j: usize) -> &T {
        debug_assert!(i < self.rows && j < self.cols);
        &self.data[i * self.cols + j]
    }

    /// Builds a matrix from a function of `(row, column)`.
    pub fn from_fn(rows: usize, cols: usize, mut f: impl FnMut(usize, usize) -> T) -> Self {
        let mut data = Vec::with_capacity(rows * cols);
        for i in 0..rows {
            for j in 0..cols {
                data.push(f(i, j));
            }
        }
        DenseMatrix { rows, cols, data }
    }

    /// Applies `f` to every entry.
    pub fn map<U>(&self, f: impl FnMut(&T) -> U) -> DenseMatrix<U> {
        DenseMatrix {
            rows: self.rows,
            cols: self.cols,
            data: self.data.iter().map(f).collect(),
        }
    }
}

impl DenseMatrix<BigRational> {
    /// Rounds every entry to `f64`.
    pub fn to_f64(&self) -> DenseMatrix<f64> {
        self.map(to_f64)
    }

    /// Rounds every entry to `f32` (via `f64`; the transforms' entries are short rationals whose
    /// double rounding is harmless).
    pub fn to_f32(&self) -> DenseMatrix<f32> {
        self.map(|q| to_f64(q) as f32)
    }

    /// Number of exact zeros.
    pub fn zeros(&self) -> usize {
        self.data.iter().filter(|q| q.is_zero()).count()
    }
}

/// The exact transforms of F(m, r) for one set of interpolation points.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WinogradTransform {
    m: usize,
    r: usize,
    points: Vec<Point>,
    at: DenseMatrix<BigRational>,
    g: DenseMatrix<BigRational>,
    bt: DenseMatrix<BigRational>,
}

impl WinogradTransform {
    /// Synthesizes Aᵀ, G, Bᵀ of F(m, r) from `α = m + r − 1` distinct interpolation points
    /// (at most one of them the point at infinity; conventionally `α − 1` finite points plus
    /// infinity), then proves the result exactly with [`WinogradTransform::verify`].
    ///
    /// Errors: `m` or `r` zero, a point count other than `α`, a repeated point (two infinities
    /// count as repeated).
    pub fn synthesize(m: usize, r: usize, points: &[Point]) -> Result<Self> {
        let t = Self::synthesize_unverified(m, r, points)?;
        t.verify()?;
        Ok(t)
    }

    /// [`WinogradTransform::synthesize`] through a process-wide cache keyed by `(m, r, points)`:
    /// the first call synthesizes and proves the transform, later calls with the same arguments
    /// return the same `Arc` (the exact synthesis and its proof took 40-85 ms of every plan's
    /// creation, cost model included, and `nn` creates a plan per layer). Errors are not cached.
    pub fn shared(m: usize, r: usize, points: &[Point]) -> Result<Arc<Self>> {
        type Cache = HashMap<(usize, usize, Vec<Point>), Arc<WinogradTransform>>;
        static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
        let key = (m, r, points.to_vec());
        // Held while synthesizing, so concurrent plans never synthesize the same F(m, r) twice.
        let mut cache = lock(CACHE.get_or_init(Mutex::default));
        if let Some(t) = cache.get(&key) {
            return Ok(Arc::clone(t));
        }
        let t = Arc::new(Self::synthesize(m, r, points)?);
        cache.insert(key, Arc::clone(&t));
        Ok(t)
    }

    /// [`WinogradTransform::synthesize`] without the exact self-proof: for screening thousands
    /// of candidate point sets in [`crate::points::search`], whose chosen set is then synthesized
    /// and proved with [`WinogradTransform::synthesize`].
    pub(crate) fn synthesize_unverified(m: usize, r: usize, points: &[Point]) -> Result<Self> {
        if m == 0 {
            return Err(FastconvError::Zero { arg: "m" });
        }
        if r == 0 {
            return Err(FastconvError::Zero { arg: "r" });
        }
        let alpha = m + r - 1;
        if points.len() != alpha {
            return Err(FastconvError::PointCount {
                m,
                r,
                expected: alpha,
                got: points.len(),
            });
        }
        for (i, p) in points.iter().enumerate() {
            if points[..i].contains(p) {
                return Err(FastconvError::DuplicatePoint {
                    point: p.to_string(),
                });
            }
        }
        let finite: Vec<&BigRational> = points
            .iter()
            .filter_map(|p| match p {
                Point::Finite(a) => Some(a),
                Point::Infinity => None,
            })
            .collect();

        // Evaluation (residue) row of point j for an n-tap polynomial.
        let eval_row = |p: &Point, n: usize| -> Vec<BigRational> {
            match p {
                Point::Finite(a) => {
                    let mut row = Vec::with_capacity(n);
                    let mut pow = BigRational::one();
                    for _ in 0..n {
                        row.push(pow.clone());
                        pow *= a;
                    }
                    row
                }
                Point::Infinity => (0..n)
                    .map(|k| {
                        if k + 1 == n {
                            BigRational::one()
                        } else {
                            BigRational::zero()
                        }
                    })
                    .collect(),
            }
        };

        // Per point: the scaling D_j and the row D_j · (CRT reconstruction polynomial of j).
        let mut scale = Vec::with_capacity(alpha);
        let mut bt_rows = Vec::with_capacity(alpha);
        for (j, p) in points.iter().enumerate() {
            match p {
                Point::Finite(a) => {
                    let others: Vec<&BigRational> =
                        finite.iter().copied().filter(|b| *b != a).collect();
                    // f_j = Π_{k≠j} (a_j − a_k); L_j(x) = Π_{k≠j} (x − a_k) / f_j.
                    let f = others
                        .iter()
                        .fold(BigRational::one(), |acc, b| acc * (a - *b));
                    let sign_flip = j == 0 && is_negative(&f);
                    let d = if sign_flip { -f } else { f };
                    let mut row = Poly::from_roots(others.iter().copied());
                    if sign_flip {
                        row = row.scale(&-BigRational::one());
                    }
                    scale.push(d);
                    bt_rows.push(row.coeffs_padded(alpha));
                }
                Point::Infinity => {
                    // s_∞ · M(x), M(x) = Π_k (x − a_k) over all finite points; D_∞ = 1.
                    scale.push(BigRational::one());
                    bt_rows.push(Poly::from_roots(finite.iter().copied()).coeffs_padded(alpha));
                }
            }
        }

        let vm: Vec<Vec<BigRational>> = points.iter().map(|p| eval_row(p, m)).collect();
        let vr: Vec<Vec<BigRational>> = points.iter().map(|p| eval_row(p, r)).collect();
        let at = DenseMatrix::from_fn(m, alpha, |i, j| vm[j][i].clone());
        let g = DenseMatrix::from_fn(alpha, r, |j, k| &vr[j][k] / &scale[j]);
        let bt = DenseMatrix::from_fn(alpha, alpha, |j, k| bt_rows[j][k].clone());
        let t = WinogradTransform {
            m,
            r,
            points: points.to_vec(),
            at,
            g,
            bt,
        };
        Ok(t)
    }

    /// Builds a transform from given exact matrices (for example published ones) and proves it
    /// with [`WinogradTransform::verify`]. `points` is informational and may be empty.
    pub fn from_matrices(
        m: usize,
        r: usize,
        at: DenseMatrix<BigRational>,
        g: DenseMatrix<BigRational>,
        bt: DenseMatrix<BigRational>,
    ) -> Result<Self> {
        if m == 0 {
            return Err(FastconvError::Zero { arg: "m" });
        }
        if r == 0 {
            return Err(FastconvError::Zero { arg: "r" });
        }
        let alpha = m + r - 1;
        let check =
            |arg: &'static str, mat: &DenseMatrix<BigRational>, rows: usize, cols: usize| {
                if mat.rows != rows || mat.cols != cols || mat.data.len() != rows * cols {
                    return Err(FastconvError::Shape {
                        arg,
                        detail: format!(
                            "expected {rows}x{cols}, got {}x{} with {} entries",
                            mat.rows,
                            mat.cols,
                            mat.data.len()
                        ),
                    });
                }
                Ok(())
            };
        check("at", &at, m, alpha)?;
        check("g", &g, alpha, r)?;
        check("bt", &bt, alpha, alpha)?;
        let t = WinogradTransform {
            m,
            r,
            points: Vec::new(),
            at,
            g,
            bt,
        };
        t.verify()?;
        Ok(t)
    }

    /// Proves exactly, in rationals, that `Aᵀ[(G g) ⊙ (Bᵀ d)]` is the correlation
    /// `y_i = Σ_k d_{i+k} g_k` for every `g`, `d`: the algorithm is bilinear, so it suffices that
    /// every basis pair `g = e_k`, `d = e_j` yields `y_i = [j = i + k]`, i.e.
    /// `Σ_t Aᵀ[i,t] G[t,k] Bᵀ[t,j] = δ(j, i + k)` for all `i < m`, `k < r`, `j < α`.
    pub fn verify(&self) -> Result<()> {
        let alpha = self.alpha();
        for i in 0..self.m {
            for k in 0..self.r {
                for j in 0..alpha {
                    let mut sum = BigRational::zero();
                    for t in 0..alpha {
                        let a = self.at.at(i, t);
                        let g = self.g.at(t, k);
                        if a.is_zero() || g.is_zero() {
                            continue;
                        }
                        sum += a * g * self.bt.at(t, j);
                    }
                    let expected = if j == i + k {
                        BigRational::one()
                    } else {
                        BigRational::zero()
                    };
                    if sum != expected {
                        return Err(FastconvError::Verification {
                            m: self.m,
                            r: self.r,
                            detail: format!(
                                "output {i}, kernel tap {k}, input {j}: got {sum}, expected {expected}"
                            ),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Output tile size `m`.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Kernel size `r`.
    pub fn r(&self) -> usize {
        self.r
    }

    /// Input tile size `α = m + r − 1`.
    pub fn alpha(&self) -> usize {
        self.m + self.r - 1
    }

    /// The interpolation points (empty when built by [`WinogradTransform::from_matrices`]).
    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// The exact inverse (output) transform Aᵀ, m×α.
    pub fn at(&self) -> &DenseMatrix<BigRational> {
        &self.at
    }

    /// The exact kernel transform G, α×r.
    pub fn g(&self) -> &DenseMatrix<BigRational> {
        &self.g
    }

    /// The exact data (input) transform Bᵀ, α×α.
    pub fn bt(&self) -> &DenseMatrix<BigRational> {
        &self.bt
    }

    /// Whether `other` is the same algorithm up to the diagonal scalings that may move between the
    /// three matrices: for every transformed-domain index `t` there are nonzero rationals `a_t`,
    /// `c_t` with `Aᵀ'[:, t] = a_t Aᵀ[:, t]`, `Bᵀ'[t] = c_t Bᵀ[t]` and `G'[t] = G[t] / (a_t c_t)`.
    /// (Rows are compared in the same order.)
    pub fn equivalent_to(&self, other: &WinogradTransform) -> bool {
        if self.m != other.m || self.r != other.r {
            return false;
        }
        let alpha = self.alpha();
        // The factor mapping `ours` onto `theirs`, from the first nonzero of ours; `None` if the
        // zero patterns differ or a factor would be zero.
        let factor = |ours: &[&BigRational], theirs: &[&BigRational]| -> Option<BigRational> {
            let j0 = ours.iter().position(|q| !q.is_zero())?;
            let c = theirs[j0] / ours[j0];
            if c.is_zero() {
                return None;
            }
            ours.iter()
                .zip(theirs)
                .all(|(o, t)| *t == &(&c * *o))
                .then_some(c)
        };
        (0..alpha).all(|t| {
            let a_ours: Vec<&BigRational> = (0..self.m).map(|i| self.at.at(i, t)).collect();
            let a_theirs: Vec<&BigRational> = (0..self.m).map(|i| other.at.at(i, t)).collect();
            let b_ours: Vec<&BigRational> = (0..alpha).map(|j| self.bt.at(t, j)).collect();
            let b_theirs: Vec<&BigRational> = (0..alpha).map(|j| other.bt.at(t, j)).collect();
            let (Some(a), Some(c)) = (factor(&a_ours, &a_theirs), factor(&b_ours, &b_theirs))
            else {
                return false;
            };
            let ac = a * c;
            (0..self.r).all(|k| &(other.g.at(t, k) * &ac) == self.g.at(t, k))
        })
    }
}

/// Locks a process-wide cache; a panic elsewhere while it was held (poisoning) leaves only whole
/// entries behind (each is inserted complete), so the map is still valid.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
