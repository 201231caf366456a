//! Interpolation point selection: candidate point sets, the search that minimises measured f32
//! error, and the table of chosen sets with their documented error bounds.
//!
//! The error of F(m, r) in f32 grows quickly with α = m + r − 1 and depends strongly on the points
//! (Vandermonde conditioning). Candidates are the small rationals 0, ±1, ±2, ±1/2, ±3, ±1/3, ±4,
//! ±1/4, ±3/2, ±2/3, ±3/4, ±4/3 plus the point at infinity; [`candidate_sets`] builds the sets that
//! are symmetric (pairs ±p, optionally 0, and at most one unpaired point) and [`search`] ranks them
//! by measured error. The search is run offline by `cargo run --release -p fastconv --example
//! point_search`, whose output is [`TABLE`]; tests only re-measure the chosen sets against their
//! bounds, which is quick.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::accuracy::{ErrorStats, measure_error};
use crate::error::{FastconvError, Result};
use crate::ntransform::DimForms;
use crate::rational::Point;
use crate::synthesis::{WinogradTransform, lock};

/// Magnitudes `(num, den)` whose ± pairs are candidate points, in order of preference.
pub const CANDIDATE_MAGNITUDES: [(i64, i64); 11] = [
    (1, 1),
    (2, 1),
    (1, 2),
    (3, 1),
    (1, 3),
    (4, 1),
    (1, 4),
    (3, 2),
    (2, 3),
    (3, 4),
    (4, 3),
];

/// Trials of the measurements behind [`TABLE`] and the tests (1-D and 2-D, one tile per trial).
pub const TABLE_TRIALS: usize = 1000;
/// Seed of the measurements behind [`TABLE`] and the tests.
pub const TABLE_SEED: u64 = 0x5EED_F00D;

/// One row of the error table: the chosen points of F(m, r) and the measured f32 error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TableEntry {
    /// Output tile size.
    pub m: usize,
    /// Kernel size.
    pub r: usize,
    /// The α − 1 finite points as `(num, den)`; the point at infinity is implied (last).
    pub finite_points: &'static [(i64, i64)],
    /// Measured max over [`TABLE_TRIALS`] tiles of `max|y − y_ref| / max|y_ref|`, 1-D.
    pub err_1d: f64,
    /// The same for the 2-D algorithm F(m×m, r×r).
    pub err_2d: f64,
}

impl TableEntry {
    /// The interpolation points, infinity last.
    pub fn points(&self) -> Vec<Point> {
        to_points(self.finite_points)
    }

    /// Synthesizes the transform of this entry.
    pub fn transform(&self) -> Result<WinogradTransform> {
        WinogradTransform::synthesize(self.m, self.r, &self.points())
    }

    /// The bound the tests enforce: the tabulated 2-D error with 50 % headroom for changes of
    /// floating-point evaluation order (the measurement itself is deterministic).
    pub fn bound_2d(&self) -> f64 {
        1.5 * self.err_2d
    }

    /// Bound for the 1-D error, as [`TableEntry::bound_2d`].
    pub fn bound_1d(&self) -> f64 {
        1.5 * self.err_1d
    }
}

fn to_points(finite: &[(i64, i64)]) -> Vec<Point> {
    let mut p: Vec<Point> = finite
        .iter()
        .map(|&(n, d)| Point::ratio(n, d).unwrap_or(Point::Infinity))
        .collect();
    p.push(Point::Infinity);
    p
}

/// Chosen points of F(m, r) from [`TABLE`]; `Err(NoPointSet)` when F(m, r) is not tabulated
/// (then pass points to [`WinogradTransform::synthesize`] directly).
pub fn tabulated(m: usize, r: usize) -> Result<&'static TableEntry> {
    if m == 0 {
        return Err(FastconvError::Zero { arg: "m" });
    }
    if r == 0 {
        return Err(FastconvError::Zero { arg: "r" });
    }
    TABLE
        .iter()
        .find(|e| e.m == m && e.r == r)
        .ok_or(FastconvError::NoPointSet { m, r })
}

/// The transform of F(m, r) from the tabulated points. F(m, 1) (no kernel overlap, α = m) and
/// F(1, r) (a dot product) are not in the table; they use the first points of the usual sequence
/// 0, ±1, ±1/2, ±2, … plus infinity, which is exact enough for such small α ≤ 8.
/// A copy of [`shared_transform_for`]'s process-wide transform.
pub fn transform_for(m: usize, r: usize) -> Result<WinogradTransform> {
    shared_transform_for(m, r).map(|t| (*t).clone())
}

/// [`transform_for`] without the copy: the process-wide transform of F(m, r)
/// ([`WinogradTransform::shared`]), synthesized and proved once per process.
pub fn shared_transform_for(m: usize, r: usize) -> Result<Arc<WinogradTransform>> {
    Ok(shared_for(m, r)?.0)
}

/// The floating-point forms of [`shared_transform_for`]'s transform, shared process-wide.
pub(crate) fn forms_for(m: usize, r: usize) -> Result<Arc<DimForms>> {
    Ok(shared_for(m, r)?.1)
}

/// The exact transform of F(m, r) and its forms, memoised by `(m, r)` alone (the points follow
/// from them): a plan's or the cost model's look-up is one small hash, without building and
/// hashing the points or the matrices (0.3-0.5 ms per plan through the keyed caches alone).
fn shared_for(m: usize, r: usize) -> Result<(Arc<WinogradTransform>, Arc<DimForms>)> {
    type Memo = HashMap<(usize, usize), (Arc<WinogradTransform>, Arc<DimForms>)>;
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    let memo = MEMO.get_or_init(Mutex::default);
    if let Some(e) = lock(memo).get(&(m, r)) {
        return Ok(e.clone());
    }
    // Not under this lock: the caches below have their own.
    let t = WinogradTransform::shared(m, r, &points_for(m, r)?)?;
    let e = (Arc::clone(&t), DimForms::shared(&t));
    lock(memo).insert((m, r), e.clone());
    Ok(e)
}

/// The points [`transform_for`] uses for F(m, r).
fn points_for(m: usize, r: usize) -> Result<Vec<Point>> {
    if m == 0 {
        return Err(FastconvError::Zero { arg: "m" });
    }
    if r == 0 {
        return Err(FastconvError::Zero { arg: "r" });
    }
    if let Ok(e) = tabulated(m, r) {
        return Ok(e.points());
    }
    let alpha = m + r - 1;
    let mut seq: Vec<(i64, i64)> = vec![(0, 1)];
    for &(n, d) in &CANDIDATE_MAGNITUDES {
        seq.push((n, d));
        seq.push((-n, d));
    }
    if alpha - 1 > seq.len() {
        return Err(FastconvError::NoPointSet { m, r });
    }
    Ok(to_points(&seq[..alpha - 1]))
}

/// The candidate sets of `n_finite` finite points (the point at infinity is added by the caller):
/// symmetric sets made of ± pairs from [`CANDIDATE_MAGNITUDES`], with or without 0, completed by
/// at most one unpaired point so that the count is exact.
pub fn candidate_sets(n_finite: usize) -> Vec<Vec<(i64, i64)>> {
    let pool = &CANDIDATE_MAGNITUDES;
    let mut out = Vec::new();
    for with_zero in [true, false] {
        let rest = n_finite.saturating_sub(usize::from(with_zero));
        if with_zero && n_finite == 0 {
            continue;
        }
        let pairs = rest / 2;
        let single = rest % 2 == 1;
        if pairs > pool.len() {
            continue;
        }
        for combo in combinations(pool.len(), pairs) {
            let mut base: Vec<(i64, i64)> = Vec::with_capacity(n_finite);
            if with_zero {
                base.push((0, 1));
            }
            for &i in &combo {
                let (n, d) = pool[i];
                base.push((n, d));
                base.push((-n, d));
            }
            if single {
                for (i, &(n, d)) in pool.iter().enumerate() {
                    if combo.contains(&i) {
                        continue;
                    }
                    for s in [n, -n] {
                        let mut set = base.clone();
                        set.push((s, d));
                        out.push(set);
                    }
                }
            } else {
                out.push(base);
            }
        }
    }
    if n_finite == 0 {
        out.push(Vec::new());
    }
    out
}

/// All `k`-subsets of `0..n`, in lexicographic order.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur = Vec::with_capacity(k);
    fn rec(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            if n - i < k - cur.len() {
                break;
            }
            cur.push(i);
            rec(i + 1, n, k, cur, out);
            cur.pop();
        }
    }
    rec(0, n, k, &mut cur, &mut out);
    out
}

/// Result of [`search`]: the chosen finite points and their measured errors.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchResult {
    /// The chosen finite points (infinity implied, last).
    pub finite_points: Vec<(i64, i64)>,
    /// 1-D error of the chosen set at ([`TABLE_TRIALS`], [`TABLE_SEED`]).
    pub err_1d: ErrorStats,
    /// 2-D error of the chosen set at ([`TABLE_TRIALS`], [`TABLE_SEED`]).
    pub err_2d: ErrorStats,
    /// Number of candidate sets evaluated.
    pub candidates: usize,
}

/// Searches [`candidate_sets`] for F(m, r): every candidate is ranked by its mean 1-D error over
/// `screen_trials` tiles, the best `finalists` are re-measured in 2-D and the smallest maximum 2-D
/// error over [`TABLE_TRIALS`] tiles wins. Costly for α ≥ 10 (thousands of candidates): run it
/// offline (the `point_search` example), not in tests of large F.
pub fn search(m: usize, r: usize, screen_trials: usize, finalists: usize) -> Result<SearchResult> {
    if m == 0 {
        return Err(FastconvError::Zero { arg: "m" });
    }
    if r == 0 {
        return Err(FastconvError::Zero { arg: "r" });
    }
    if screen_trials == 0 {
        return Err(FastconvError::Zero {
            arg: "screen_trials",
        });
    }
    if finalists == 0 {
        return Err(FastconvError::Zero { arg: "finalists" });
    }
    use rayon::prelude::*;
    let alpha = m + r - 1;
    let sets = candidate_sets(alpha - 1);
    let candidates = sets.len();
    let mut screened: Vec<(f64, Vec<(i64, i64)>)> = sets
        .into_par_iter()
        .filter_map(|set| {
            let t = WinogradTransform::synthesize_unverified(m, r, &to_points(&set)).ok()?;
            let e = measure_error(&[t], screen_trials, TABLE_SEED ^ 1).ok()?;
            Some((e.mean_rel, set))
        })
        .collect();
    screened.sort_by(|a, b| a.0.total_cmp(&b.0));
    screened.truncate(finalists);
    let mut best: Option<SearchResult> = None;
    for (_, set) in screened {
        let t = WinogradTransform::synthesize(m, r, &to_points(&set))?;
        let e2 = measure_error(&[t.clone(), t.clone()], TABLE_TRIALS, TABLE_SEED)?;
        if best.as_ref().is_none_or(|b| e2.max_rel < b.err_2d.max_rel) {
            let e1 = measure_error(&[t], TABLE_TRIALS, TABLE_SEED)?;
            best = Some(SearchResult {
                finite_points: set,
                err_1d: e1,
                err_2d: e2,
                candidates,
            });
        }
    }
    best.ok_or(FastconvError::NoPointSet { m, r })
}

/// The chosen point sets and their measured errors (max over [`TABLE_TRIALS`] random tiles of
/// `max|y − y_ref| / max|y_ref|`, f32 algorithm vs f64 direct correlation, seed [`TABLE_SEED`]) for
/// m in 2..=8, r in 2..=7 with α ≤ 12. Points generated by the `point_search` example, errors
/// re-measured with the executed arithmetic (core-blas's FMA kernel on rows of ≥ 8 values, Aᵀ in
/// its column-paired form; `examples/err_table` re-measures them); reproduced in
/// `docs/ALGORITHMS.md`.
pub const TABLE: &[TableEntry] = &[
    TableEntry {
        m: 2,
        r: 2,
        finite_points: &[(0, 1), (1, 1)],
        err_1d: 6.372e-7,
        err_2d: 5.161e-7,
    },
    TableEntry {
        m: 3,
        r: 2,
        finite_points: &[(0, 1), (1, 1), (-1, 1)],
        err_1d: 1.441e-7,
        err_2d: 4.319e-7,
    },
    TableEntry {
        m: 4,
        r: 2,
        finite_points: &[(1, 3), (-1, 3), (4, 3), (-4, 3)],
        err_1d: 6.075e-7,
        err_2d: 1.139e-6,
    },
    TableEntry {
        m: 5,
        r: 2,
        finite_points: &[(0, 1), (3, 4), (-3, 4), (4, 3), (-4, 3)],
        err_1d: 7.170e-7,
        err_2d: 2.007e-6,
    },
    TableEntry {
        m: 6,
        r: 2,
        finite_points: &[(1, 1), (-1, 1), (1, 4), (-1, 4), (3, 2), (-3, 2)],
        err_1d: 1.004e-6,
        err_2d: 5.721e-6,
    },
    TableEntry {
        m: 7,
        r: 2,
        finite_points: &[(0, 1), (1, 1), (-1, 1), (2, 1), (-2, 1), (2, 3), (-2, 3)],
        err_1d: 2.028e-6,
        err_2d: 1.898e-5,
    },
    TableEntry {
        m: 8,
        r: 2,
        finite_points: &[
            (1, 1),
            (-1, 1),
            (2, 1),
            (-2, 1),
            (1, 3),
            (-1, 3),
            (3, 4),
            (-3, 4),
        ],
        err_1d: 3.040e-6,
        err_2d: 3.350e-5,
    },
    TableEntry {
        m: 2,
        r: 3,
        finite_points: &[(0, 1), (1, 1), (-1, 1)],
        err_1d: 1.538e-6,
        err_2d: 6.431e-7,
    },
    TableEntry {
        m: 3,
        r: 3,
        finite_points: &[(1, 4), (-1, 4), (3, 2), (-3, 2)],
        err_1d: 9.446e-7,
        err_2d: 1.502e-6,
    },
    TableEntry {
        m: 4,
        r: 3,
        finite_points: &[(0, 1), (3, 4), (-3, 4), (4, 3), (-4, 3)],
        err_1d: 1.592e-6,
        err_2d: 1.819e-6,
    },
    TableEntry {
        m: 5,
        r: 3,
        finite_points: &[(1, 3), (-1, 3), (3, 2), (-3, 2), (3, 4), (-3, 4)],
        err_1d: 1.468e-6,
        err_2d: 3.559e-6,
    },
    TableEntry {
        m: 6,
        r: 3,
        finite_points: &[(0, 1), (1, 1), (-1, 1), (2, 1), (-2, 1), (1, 2), (-1, 2)],
        err_1d: 1.857e-6,
        err_2d: 1.029e-5,
    },
    TableEntry {
        m: 7,
        r: 3,
        finite_points: &[
            (1, 1),
            (-1, 1),
            (2, 1),
            (-2, 1),
            (1, 4),
            (-1, 4),
            (3, 4),
            (-3, 4),
        ],
        err_1d: 3.558e-6,
        err_2d: 2.195e-5,
    },
    TableEntry {
        m: 8,
        r: 3,
        finite_points: &[
            (1, 1),
            (-1, 1),
            (1, 4),
            (-1, 4),
            (2, 3),
            (-2, 3),
            (4, 3),
            (-4, 3),
            (4, 1),
        ],
        err_1d: 7.790e-6,
        err_2d: 9.679e-5,
    },
    TableEntry {
        m: 2,
        r: 4,
        finite_points: &[(1, 4), (-1, 4), (3, 2), (-3, 2)],
        err_1d: 7.364e-6,
        err_2d: 1.510e-6,
    },
    TableEntry {
        m: 3,
        r: 4,
        finite_points: &[(0, 1), (2, 3), (-2, 3), (4, 3), (-4, 3)],
        err_1d: 1.477e-6,
        err_2d: 1.678e-6,
    },
    TableEntry {
        m: 4,
        r: 4,
        finite_points: &[(1, 1), (-1, 1), (2, 1), (-2, 1), (1, 4), (-1, 4)],
        err_1d: 2.306e-6,
        err_2d: 5.626e-6,
    },
    TableEntry {
        m: 5,
        r: 4,
        finite_points: &[(1, 3), (-1, 3), (3, 4), (-3, 4), (4, 3), (-4, 3), (-4, 1)],
        err_1d: 2.613e-6,
        err_2d: 1.473e-5,
    },
    TableEntry {
        m: 6,
        r: 4,
        finite_points: &[
            (1, 1),
            (-1, 1),
            (2, 1),
            (-2, 1),
            (1, 4),
            (-1, 4),
            (3, 4),
            (-3, 4),
        ],
        err_1d: 7.064e-6,
        err_2d: 2.758e-5,
    },
    TableEntry {
        m: 7,
        r: 4,
        finite_points: &[
            (1, 1),
            (-1, 1),
            (1, 4),
            (-1, 4),
            (3, 2),
            (-3, 2),
            (2, 3),
            (-2, 3),
            (4, 1),
        ],
        err_1d: 7.398e-6,
        err_2d: 9.819e-5,
    },
    TableEntry {
        m: 8,
        r: 4,
        finite_points: &[
            (0, 1),
            (1, 1),
            (-1, 1),
            (2, 1),
            (-2, 1),
            (1, 3),
            (-1, 3),
            (3, 4),
            (-3, 4),
            (-4, 1),
        ],
        err_1d: 1.306e-5,
        err_2d: 2.884e-4,
    },
    TableEntry {
        m: 2,
        r: 5,
        finite_points: &[(0, 1), (3, 2), (-3, 2), (3, 4), (-3, 4)],
        err_1d: 4.468e-6,
        err_2d: 3.109e-6,
    },
    TableEntry {
        m: 3,
        r: 5,
        finite_points: &[(2, 1), (-2, 1), (1, 4), (-1, 4), (3, 4), (-3, 4)],
        err_1d: 6.628e-6,
        err_2d: 4.449e-6,
    },
    TableEntry {
        m: 4,
        r: 5,
        finite_points: &[(0, 1), (1, 1), (-1, 1), (1, 2), (-1, 2), (3, 2), (-3, 2)],
        err_1d: 4.275e-6,
        err_2d: 1.247e-5,
    },
    TableEntry {
        m: 5,
        r: 5,
        finite_points: &[
            (1, 1),
            (-1, 1),
            (2, 1),
            (-2, 1),
            (1, 4),
            (-1, 4),
            (2, 3),
            (-2, 3),
        ],
        err_1d: 4.340e-6,
        err_2d: 2.230e-5,
    },
    TableEntry {
        m: 6,
        r: 5,
        finite_points: &[
            (0, 1),
            (2, 1),
            (-2, 1),
            (1, 2),
            (-1, 2),
            (3, 4),
            (-3, 4),
            (4, 3),
            (-4, 3),
        ],
        err_1d: 5.385e-6,
        err_2d: 8.269e-5,
    },
    TableEntry {
        m: 7,
        r: 5,
        finite_points: &[
            (0, 1),
            (1, 1),
            (-1, 1),
            (1, 3),
            (-1, 3),
            (3, 4),
            (-3, 4),
            (4, 3),
            (-4, 3),
            (-4, 1),
        ],
        err_1d: 1.798e-5,
        err_2d: 5.096e-4,
    },
    TableEntry {
        m: 8,
        r: 5,
        finite_points: &[
            (0, 1),
            (1, 1),
            (-1, 1),
            (3, 1),
            (-3, 1),
            (1, 3),
            (-1, 3),
            (2, 3),
            (-2, 3),
            (4, 3),
            (-4, 3),
        ],
        err_1d: 1.535e-5,
        err_2d: 3.995e-4,
    },
    TableEntry {
        m: 2,
        r: 6,
        finite_points: &[(1, 3), (-1, 3), (3, 2), (-3, 2), (3, 4), (-3, 4)],
        err_1d: 8.038e-6,
        err_2d: 7.828e-6,
    },
    TableEntry {
        m: 3,
        r: 6,
        finite_points: &[(1, 4), (-1, 4), (2, 3), (-2, 3), (4, 3), (-4, 3), (-4, 1)],
        err_1d: 7.517e-6,
        err_2d: 1.506e-5,
    },
    TableEntry {
        m: 4,
        r: 6,
        finite_points: &[
            (1, 1),
            (-1, 1),
            (2, 1),
            (-2, 1),
            (1, 4),
            (-1, 4),
            (3, 4),
            (-3, 4),
        ],
        err_1d: 5.343e-6,
        err_2d: 1.986e-5,
    },
    TableEntry {
        m: 5,
        r: 6,
        finite_points: &[
            (0, 1),
            (2, 1),
            (-2, 1),
            (1, 2),
            (-1, 2),
            (3, 4),
            (-3, 4),
            (4, 3),
            (-4, 3),
        ],
        err_1d: 6.466e-6,
        err_2d: 5.528e-5,
    },
    TableEntry {
        m: 6,
        r: 6,
        finite_points: &[
            (1, 1),
            (-1, 1),
            (1, 2),
            (-1, 2),
            (3, 1),
            (-3, 1),
            (1, 4),
            (-1, 4),
            (4, 3),
            (-4, 3),
        ],
        err_1d: 1.279e-5,
        err_2d: 1.956e-4,
    },
    TableEntry {
        m: 7,
        r: 6,
        finite_points: &[
            (0, 1),
            (1, 1),
            (-1, 1),
            (3, 1),
            (-3, 1),
            (1, 3),
            (-1, 3),
            (2, 3),
            (-2, 3),
            (4, 3),
            (-4, 3),
        ],
        err_1d: 1.548e-5,
        err_2d: 4.239e-4,
    },
    TableEntry {
        m: 2,
        r: 7,
        finite_points: &[(0, 1), (1, 1), (-1, 1), (2, 1), (-2, 1), (1, 2), (-1, 2)],
        err_1d: 1.635e-5,
        err_2d: 2.142e-5,
    },
    TableEntry {
        m: 3,
        r: 7,
        finite_points: &[
            (1, 1),
            (-1, 1),
            (2, 1),
            (-2, 1),
            (1, 4),
            (-1, 4),
            (2, 3),
            (-2, 3),
        ],
        err_1d: 6.803e-6,
        err_2d: 2.085e-5,
    },
    TableEntry {
        m: 4,
        r: 7,
        finite_points: &[
            (0, 1),
            (2, 1),
            (-2, 1),
            (1, 2),
            (-1, 2),
            (3, 4),
            (-3, 4),
            (4, 3),
            (-4, 3),
        ],
        err_1d: 9.360e-6,
        err_2d: 5.083e-5,
    },
    TableEntry {
        m: 5,
        r: 7,
        finite_points: &[
            (0, 1),
            (1, 1),
            (-1, 1),
            (1, 3),
            (-1, 3),
            (3, 2),
            (-3, 2),
            (3, 4),
            (-3, 4),
            (-4, 1),
        ],
        err_1d: 1.306e-5,
        err_2d: 2.059e-4,
    },
    TableEntry {
        m: 6,
        r: 7,
        finite_points: &[
            (0, 1),
            (1, 1),
            (-1, 1),
            (3, 1),
            (-3, 1),
            (1, 3),
            (-1, 3),
            (3, 2),
            (-3, 2),
            (2, 3),
            (-2, 3),
        ],
        err_1d: 2.060e-5,
        err_2d: 5.702e-4,
    },
];
