//! Synthesis: golden matrices (wincnn / Lavin), exact self-proof, validation errors.

use fastconv::rational::ratio;
use fastconv::{DenseMatrix, FastconvError, Point, WinogradTransform};
use num_rational::BigRational;

fn q(n: i64, d: i64) -> BigRational {
    ratio(n, d).unwrap()
}

/// Matrix of rationals from (num, den) pairs.
fn mat(rows: usize, cols: usize, entries: &[(i64, i64)]) -> DenseMatrix<BigRational> {
    assert_eq!(entries.len(), rows * cols);
    DenseMatrix {
        rows,
        cols,
        data: entries.iter().map(|&(n, d)| q(n, d)).collect(),
    }
}

fn ints(rows: usize, cols: usize, entries: &[i64]) -> DenseMatrix<BigRational> {
    let e: Vec<(i64, i64)> = entries.iter().map(|&n| (n, 1)).collect();
    mat(rows, cols, &e)
}

fn pts(finite: &[(i64, i64)]) -> Vec<Point> {
    let mut p: Vec<Point> = finite
        .iter()
        .map(|&(n, d)| Point::ratio(n, d).unwrap())
        .collect();
    p.push(Point::Infinity);
    p
}

/// F(2,3) from 0, 1, −1, ∞: wincnn's output (Lavin's paper negates the last column of Aᵀ and the
/// last row of Bᵀ, an equivalent scaling).
#[test]
fn golden_f2_3_wincnn() {
    let t = WinogradTransform::synthesize(2, 3, &pts(&[(0, 1), (1, 1), (-1, 1)])).unwrap();
    assert_eq!(t.at(), &ints(2, 4, &[1, 1, 1, 0, 0, 1, -1, 1]));
    assert_eq!(
        t.g(),
        &mat(
            4,
            3,
            &[
                (1, 1),
                (0, 1),
                (0, 1),
                (1, 2),
                (1, 2),
                (1, 2),
                (1, 2),
                (-1, 2),
                (1, 2),
                (0, 1),
                (0, 1),
                (1, 1)
            ]
        )
    );
    assert_eq!(
        t.bt(),
        &ints(4, 4, &[1, 0, -1, 0, 0, 1, 1, 0, 0, -1, 1, 0, 0, -1, 0, 1])
    );
}

/// F(2,3) as printed by Lavin & Gray (2016): equal to ours up to diagonal scaling.
#[test]
fn golden_f2_3_lavin_equivalent() {
    let lavin = WinogradTransform::from_matrices(
        2,
        3,
        ints(2, 4, &[1, 1, 1, 0, 0, 1, -1, -1]),
        mat(
            4,
            3,
            &[
                (1, 1),
                (0, 1),
                (0, 1),
                (1, 2),
                (1, 2),
                (1, 2),
                (1, 2),
                (-1, 2),
                (1, 2),
                (0, 1),
                (0, 1),
                (1, 1),
            ],
        ),
        ints(4, 4, &[1, 0, -1, 0, 0, 1, 1, 0, 0, -1, 1, 0, 0, 1, 0, -1]),
    )
    .unwrap();
    let ours = WinogradTransform::synthesize(2, 3, &pts(&[(0, 1), (1, 1), (-1, 1)])).unwrap();
    assert!(ours.equivalent_to(&lavin));
    assert!(lavin.equivalent_to(&ours));
    assert_ne!(
        ours.at(),
        lavin.at(),
        "the two conventions differ in sign, equivalence is the test"
    );
}

/// F(4,3) from 0, ±1, ±2, ∞ (wincnn = Lavin & Gray's F(4×4, 3×3) matrices).
#[test]
fn golden_f4_3() {
    let t = WinogradTransform::synthesize(4, 3, &pts(&[(0, 1), (1, 1), (-1, 1), (2, 1), (-2, 1)]))
        .unwrap();
    assert_eq!(
        t.at(),
        &ints(
            4,
            6,
            &[
                1, 1, 1, 1, 1, 0, 0, 1, -1, 2, -2, 0, 0, 1, 1, 4, 4, 0, 0, 1, -1, 8, -8, 1
            ]
        )
    );
    assert_eq!(
        t.g(),
        &mat(
            6,
            3,
            &[
                (1, 4),
                (0, 1),
                (0, 1),
                (-1, 6),
                (-1, 6),
                (-1, 6),
                (-1, 6),
                (1, 6),
                (-1, 6),
                (1, 24),
                (1, 12),
                (1, 6),
                (1, 24),
                (-1, 12),
                (1, 6),
                (0, 1),
                (0, 1),
                (1, 1),
            ]
        )
    );
    assert_eq!(
        t.bt(),
        &ints(
            6,
            6,
            &[
                4, 0, -5, 0, 1, 0, 0, -4, -4, 1, 1, 0, 0, 4, -4, -1, 1, 0, 0, -2, -1, 2, 1, 0, 0,
                2, -1, -2, 1, 0, 0, 4, 0, -5, 0, 1,
            ]
        )
    );
}

/// F(6,3) from 0, ±1, ±2, ±1/2, ∞: wincnn's output for these points.
#[test]
fn golden_f6_3() {
    let t = WinogradTransform::synthesize(
        6,
        3,
        &pts(&[(0, 1), (1, 1), (-1, 1), (2, 1), (-2, 1), (1, 2), (-1, 2)]),
    )
    .unwrap();
    assert_eq!(
        t.at(),
        &mat(
            6,
            8,
            &[
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (1, 1),
                (0, 1),
                (0, 1),
                (1, 1),
                (-1, 1),
                (2, 1),
                (-2, 1),
                (1, 2),
                (-1, 2),
                (0, 1),
                (0, 1),
                (1, 1),
                (1, 1),
                (4, 1),
                (4, 1),
                (1, 4),
                (1, 4),
                (0, 1),
                (0, 1),
                (1, 1),
                (-1, 1),
                (8, 1),
                (-8, 1),
                (1, 8),
                (-1, 8),
                (0, 1),
                (0, 1),
                (1, 1),
                (1, 1),
                (16, 1),
                (16, 1),
                (1, 16),
                (1, 16),
                (0, 1),
                (0, 1),
                (1, 1),
                (-1, 1),
                (32, 1),
                (-32, 1),
                (1, 32),
                (-1, 32),
                (1, 1),
            ]
        )
    );
    assert_eq!(
        t.g(),
        &mat(
            8,
            3,
            &[
                (1, 1),
                (0, 1),
                (0, 1),
                (-2, 9),
                (-2, 9),
                (-2, 9),
                (-2, 9),
                (2, 9),
                (-2, 9),
                (1, 90),
                (1, 45),
                (2, 45),
                (1, 90),
                (-1, 45),
                (2, 45),
                (32, 45),
                (16, 45),
                (8, 45),
                (32, 45),
                (-16, 45),
                (8, 45),
                (0, 1),
                (0, 1),
                (1, 1),
            ]
        )
    );
    assert_eq!(
        t.bt(),
        &mat(
            8,
            8,
            &[
                (1, 1),
                (0, 1),
                (-21, 4),
                (0, 1),
                (21, 4),
                (0, 1),
                (-1, 1),
                (0, 1),
                (0, 1),
                (1, 1),
                (1, 1),
                (-17, 4),
                (-17, 4),
                (1, 1),
                (1, 1),
                (0, 1),
                (0, 1),
                (-1, 1),
                (1, 1),
                (17, 4),
                (-17, 4),
                (-1, 1),
                (1, 1),
                (0, 1),
                (0, 1),
                (1, 2),
                (1, 4),
                (-5, 2),
                (-5, 4),
                (2, 1),
                (1, 1),
                (0, 1),
                (0, 1),
                (-1, 2),
                (1, 4),
                (5, 2),
                (-5, 4),
                (-2, 1),
                (1, 1),
                (0, 1),
                (0, 1),
                (2, 1),
                (4, 1),
                (-5, 2),
                (-5, 1),
                (1, 2),
                (1, 1),
                (0, 1),
                (0, 1),
                (-2, 1),
                (4, 1),
                (5, 2),
                (-5, 1),
                (-1, 2),
                (1, 1),
                (0, 1),
                (0, 1),
                (-1, 1),
                (0, 1),
                (21, 4),
                (0, 1),
                (-21, 4),
                (0, 1),
                (1, 1),
            ]
        )
    );
}

/// Every (m, r) up to α = 12 synthesizes from the first α − 1 points of the usual sequence and
/// proves itself (synthesize runs the exact check; we re-run it and also check the all-finite
/// variant).
#[test]
fn every_small_f_m_r_proves_itself() {
    let seq = [
        (0, 1),
        (1, 1),
        (-1, 1),
        (2, 1),
        (-2, 1),
        (1, 2),
        (-1, 2),
        (3, 1),
        (-3, 1),
        (1, 3),
        (-1, 3),
        (4, 1),
        (-4, 1),
    ];
    for m in 1..=8 {
        for r in 1..=7 {
            let alpha = m + r - 1;
            if alpha > 12 {
                continue;
            }
            let with_inf = pts(&seq[..alpha - 1]);
            let t = WinogradTransform::synthesize(m, r, &with_inf).unwrap();
            t.verify().unwrap();
            assert_eq!((t.at().rows, t.at().cols), (m, alpha));
            assert_eq!((t.g().rows, t.g().cols), (alpha, r));
            assert_eq!((t.bt().rows, t.bt().cols), (alpha, alpha));
            let all_finite: Vec<Point> = seq[..alpha]
                .iter()
                .map(|&(n, d)| Point::ratio(n, d).unwrap())
                .collect();
            WinogradTransform::synthesize(m, r, &all_finite)
                .unwrap()
                .verify()
                .unwrap();
        }
    }
}

/// The point at infinity may sit anywhere in the list.
#[test]
fn infinity_anywhere() {
    let p = vec![
        Point::Infinity,
        Point::int(0),
        Point::int(1),
        Point::int(-1),
    ];
    WinogradTransform::synthesize(2, 3, &p).unwrap();
}

/// The check can fail: a corrupted entry is rejected.
#[test]
fn verify_rejects_corruption() {
    let t = WinogradTransform::synthesize(4, 3, &pts(&[(0, 1), (1, 1), (-1, 1), (2, 1), (-2, 1)]))
        .unwrap();
    let mut bt = t.bt().clone();
    bt.data[7] += q(1, 1000);
    let err =
        WinogradTransform::from_matrices(4, 3, t.at().clone(), t.g().clone(), bt).unwrap_err();
    assert!(
        matches!(err, FastconvError::Verification { m: 4, r: 3, .. }),
        "{err}"
    );
    // Wrong shapes are named.
    let err = WinogradTransform::from_matrices(4, 3, t.g().clone(), t.g().clone(), t.bt().clone())
        .unwrap_err();
    assert!(
        matches!(err, FastconvError::Shape { arg: "at", .. }),
        "{err}"
    );
}

#[test]
fn validation_errors() {
    let p3 = pts(&[(0, 1), (1, 1), (-1, 1)]);
    assert_eq!(
        WinogradTransform::synthesize(0, 3, &p3).unwrap_err(),
        FastconvError::Zero { arg: "m" }
    );
    assert_eq!(
        WinogradTransform::synthesize(2, 0, &p3).unwrap_err(),
        FastconvError::Zero { arg: "r" }
    );
    assert!(matches!(
        WinogradTransform::synthesize(3, 3, &p3).unwrap_err(),
        FastconvError::PointCount {
            m: 3,
            r: 3,
            expected: 5,
            got: 4
        }
    ));
    let dup = vec![
        Point::int(0),
        Point::int(1),
        Point::ratio(2, 2).unwrap(),
        Point::Infinity,
    ];
    assert!(matches!(
        WinogradTransform::synthesize(2, 3, &dup).unwrap_err(),
        FastconvError::DuplicatePoint { .. }
    ));
    let two_inf = vec![
        Point::int(0),
        Point::int(1),
        Point::Infinity,
        Point::Infinity,
    ];
    assert!(matches!(
        WinogradTransform::synthesize(2, 3, &two_inf).unwrap_err(),
        FastconvError::DuplicatePoint { .. }
    ));
    assert!(matches!(
        Point::ratio(1, 0).unwrap_err(),
        FastconvError::ZeroDenominator { num: 1, den: 0 }
    ));
}

/// Exported f64 matrices compute the correlation on random data (an independent check through
/// floating point, against the direct sum).
#[test]
fn f64_export_computes_correlation() {
    let t = WinogradTransform::synthesize(
        6,
        3,
        &pts(&[(0, 1), (1, 1), (-1, 1), (2, 1), (-2, 1), (1, 2), (-1, 2)]),
    )
    .unwrap();
    let (at, g, bt) = (t.at().to_f64(), t.g().to_f64(), t.bt().to_f64());
    let d: Vec<f64> = (0..8).map(|i| ((i * 37 % 11) as f64 - 5.0) / 3.0).collect();
    let k = [0.3, -1.2, 0.7];
    let mv = |a: &DenseMatrix<f64>, x: &[f64]| -> Vec<f64> {
        (0..a.rows)
            .map(|i| (0..a.cols).map(|j| a.data[i * a.cols + j] * x[j]).sum())
            .collect()
    };
    let u = mv(&g, &k);
    let v = mv(&bt, &d);
    let prod: Vec<f64> = u.iter().zip(&v).map(|(a, b)| a * b).collect();
    let y = mv(&at, &prod);
    for i in 0..6 {
        let direct: f64 = (0..3).map(|j| d[i + j] * k[j]).sum();
        assert!(
            (y[i] - direct).abs() < 1e-12,
            "y[{i}] = {} vs {direct}",
            y[i]
        );
    }
}

mod random_points {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any distinct rational points (with or without ∞) give a transform that computes the
        /// correlation in f64 on random data: an independent floating-point check besides the
        /// exact proof inside `synthesize`.
        #[test]
        fn arbitrary_points_compute_the_correlation(
            m in 1usize..=5,
            r in 1usize..=4,
            with_inf in any::<bool>(),
            raw in proptest::collection::vec((-6i64..=6, 1i64..=4), 16),
            data in proptest::collection::vec(-1.0f64..1.0, 12),
        ) {
            let alpha = m + r - 1;
            let mut pts: Vec<Point> = Vec::new();
            for &(n, d) in &raw {
                let p = Point::ratio(n, d).unwrap();
                if !pts.contains(&p) {
                    pts.push(p);
                }
            }
            let finite = alpha - usize::from(with_inf);
            prop_assume!(pts.len() >= finite);
            pts.truncate(finite);
            if with_inf {
                pts.push(Point::Infinity);
            }
            let t = WinogradTransform::synthesize(m, r, &pts).unwrap();
            let (at, g, bt) = (t.at().to_f64(), t.g().to_f64(), t.bt().to_f64());
            let d = &data[..alpha];
            let k = &data[alpha..alpha + r];
            let mv = |a: &DenseMatrix<f64>, x: &[f64]| -> Vec<f64> {
                (0..a.rows).map(|i| (0..a.cols).map(|j| a.data[i * a.cols + j] * x[j]).sum()).collect()
            };
            let prod: Vec<f64> = mv(&g, k).iter().zip(mv(&bt, d)).map(|(a, b)| a * b).collect();
            let y = mv(&at, &prod);
            // Scale of the rounding: the largest magnitudes in the three transforms.
            let big = |a: &DenseMatrix<f64>| a.data.iter().fold(1.0f64, |s, v| s.max(v.abs()));
            let tol = 1e-12 * big(&at) * big(&g) * big(&bt) * (alpha * alpha) as f64;
            for i in 0..m {
                let direct: f64 = (0..r).map(|j| d[i + j] * k[j]).sum();
                prop_assert!((y[i] - direct).abs() <= tol, "F({m},{r}) {pts:?}: {} vs {direct}", y[i]);
            }
        }
    }
}

/// The process-wide cache: `shared` returns the transform `synthesize` builds, the same `Arc` on
/// every later call with the same (m, r, points), another one for other points; errors are
/// returned (and not cached).
#[test]
fn shared_is_synthesize_once() {
    let p = pts(&[(0, 1), (1, 1), (-1, 1), (2, 1), (-2, 1)]);
    let a = WinogradTransform::shared(4, 3, &p).unwrap();
    assert_eq!(*a, WinogradTransform::synthesize(4, 3, &p).unwrap());
    let b = WinogradTransform::shared(4, 3, &p).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    let other = pts(&[(0, 1), (1, 1), (-1, 1), (1, 2), (-1, 2)]);
    let c = WinogradTransform::shared(4, 3, &other).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&a, &c));
    assert_eq!(*c, WinogradTransform::synthesize(4, 3, &other).unwrap());
    assert_ne!(*a, *c);
    // Same points, other (m, r): F(3, 4) has α = 6 too.
    let d = WinogradTransform::shared(3, 4, &p).unwrap();
    assert_eq!((d.m(), d.r()), (3, 4));
    for _ in 0..2 {
        assert!(matches!(
            WinogradTransform::shared(4, 3, &p[..5]),
            Err(FastconvError::PointCount { .. })
        ));
    }
}

/// `points::transform_for` / `shared_transform_for` (the plans' transforms) equal the tabulated
/// points' freshly synthesized transform for every tabulated F(m, r), and repeat calls share.
#[test]
fn shared_transform_for_matches_table() {
    for e in fastconv::points::TABLE {
        let fresh = e.transform().unwrap();
        let a = fastconv::points::shared_transform_for(e.m, e.r).unwrap();
        assert_eq!(*a, fresh, "F({}, {})", e.m, e.r);
        assert_eq!(fastconv::points::transform_for(e.m, e.r).unwrap(), fresh);
        let b = fastconv::points::shared_transform_for(e.m, e.r).unwrap();
        assert!(std::sync::Arc::ptr_eq(&a, &b));
    }
}
