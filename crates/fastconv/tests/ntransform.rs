//! N-d transforms: sparse mode-n products against a naive dense product, and whole N-d tiles
//! against the f64 direct correlation.

use fastconv::{
    DenseMatrix, FastconvError, Point, SparseTransform, TileTransforms, WinogradTransform,
    correlate_nd_f64, mode_n_product, multi_mode_product,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Naive dense mode-n product by explicit multi-index arithmetic (independent of the library's
/// outer/inner decomposition).
fn naive_mode_n(x: &[f64], dims: &[usize], mode: usize, u: &DenseMatrix<f64>) -> Vec<f64> {
    let mut out_dims = dims.to_vec();
    out_dims[mode] = u.rows;
    let n_out: usize = out_dims.iter().product();
    let mut y = vec![0.0; n_out];
    let flat =
        |idx: &[usize], shape: &[usize]| idx.iter().zip(shape).fold(0, |acc, (i, s)| acc * s + i);
    for (f, yv) in y.iter_mut().enumerate() {
        let mut idx = vec![0; dims.len()];
        let mut rem = f;
        for n in (0..dims.len()).rev() {
            idx[n] = rem % out_dims[n];
            rem /= out_dims[n];
        }
        let j = idx[mode];
        for c in 0..dims[mode] {
            idx[mode] = c;
            *yv += u.data[j * u.cols + c] * x[flat(&idx, dims)];
        }
    }
    y
}

fn random_sparse(rng: &mut SmallRng, rows: usize, cols: usize) -> DenseMatrix<f64> {
    DenseMatrix::from_fn(rows, cols, |_, _| {
        if rng.random_bool(0.4) {
            0.0
        } else {
            rng.random_range(-2.0..2.0)
        }
    })
}

#[test]
fn mode_n_product_matches_naive_dense() {
    let mut rng = SmallRng::seed_from_u64(7);
    for _ in 0..200 {
        let rank = rng.random_range(1..=4);
        let dims: Vec<usize> = (0..rank).map(|_| rng.random_range(1..=7)).collect();
        let mode = rng.random_range(0..rank);
        let rows = rng.random_range(1..=9);
        let u = random_sparse(&mut rng, rows, dims[mode]);
        let x: Vec<f64> = (0..dims.iter().product())
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let sparse = SparseTransform::from_dense(&u).unwrap();
        assert_eq!(
            sparse.nonzeros(),
            u.data.iter().filter(|v| **v != 0.0).count()
        );
        assert_eq!(sparse.to_dense(), u);
        let expect = naive_mode_n(&x, &dims, mode, &u);
        let mut y = vec![f64::NAN; expect.len()]; // NaN must be overwritten, never read.
        mode_n_product(&x, &dims, mode, &sparse, &mut y).unwrap();
        for (a, b) in y.iter().zip(&expect) {
            assert!(
                (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                "{dims:?} mode {mode}: {a} vs {b}"
            );
        }
    }
}

/// Rows equal up to the signs of their entries (the ±p rows of a Winograd transform) are
/// applied as pairs sharing their products: same result as the naive product, fewer operations.
/// Covers pairs with mixed signs, identical rows, negated rows, zero rows, and inner sizes with
/// whole chunks and ragged tails.
#[test]
fn paired_rows_match_naive_dense() {
    let mut rng = SmallRng::seed_from_u64(17);
    for case in 0..200 {
        let rank = rng.random_range(1..=3);
        let mut dims: Vec<usize> = (0..rank).map(|_| rng.random_range(1..=9)).collect();
        let mode = rng.random_range(0..rank);
        dims[mode] = rng.random_range(2..=9);
        let rows = rng.random_range(2..=10);
        let mut u = random_sparse(&mut rng, rows, dims[mode]);
        // Rows 1, 3, 5, … copy the row before with random sign flips (sometimes none, sometimes
        // all); every fifth matrix has a zero row.
        let mut pairs = 0;
        for r in (1..rows).step_by(2) {
            if rng.random_bool(0.8) {
                let mode_flip = rng.random_range(0..3);
                for c in 0..u.cols {
                    let v = u.data[(r - 1) * u.cols + c];
                    let flip = match mode_flip {
                        0 => rng.random_bool(0.5),
                        1 => false,
                        _ => true,
                    };
                    u.data[r * u.cols + c] = if flip { -v } else { v };
                }
                pairs += usize::from(
                    u.data[r * u.cols..(r + 1) * u.cols]
                        .iter()
                        .any(|v| *v != 0.0),
                );
            }
        }
        if case % 5 == 0 {
            let z = rng.random_range(0..rows);
            u.data[z * u.cols..(z + 1) * u.cols].fill(0.0);
        }
        let sparse = SparseTransform::from_dense(&u).unwrap();
        assert_eq!(sparse.to_dense(), u);
        if pairs > 0 && case % 5 != 0 {
            assert!(
                sparse.applied_ops() < sparse.nonzeros() + 2 * pairs,
                "case {case}: {} ops, {} nonzeros, {pairs} pairs",
                sparse.applied_ops(),
                sparse.nonzeros()
            );
        }
        let x: Vec<f64> = (0..dims.iter().product())
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let expect = naive_mode_n(&x, &dims, mode, &u);
        let mut y = vec![f64::NAN; expect.len()];
        mode_n_product(&x, &dims, mode, &sparse, &mut y).unwrap();
        for (a, b) in y.iter().zip(&expect) {
            assert!(
                (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                "case {case} {dims:?} mode {mode}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn multi_mode_product_matches_chained_naive() {
    let mut rng = SmallRng::seed_from_u64(11);
    // Buffers reused across products of other shapes, sometimes refilled with NaN of another
    // length: only a prefix of each is written (they grow, never shrink, inside the product),
    // so stale values must never reach the result, and `out` ends at the result's length.
    let (mut scratch, mut out): (Vec<f64>, Vec<f64>) = (Vec::new(), Vec::new());
    for _ in 0..50 {
        if rng.random_range(0..3) == 0 {
            scratch = vec![f64::NAN; rng.random_range(0..3000)];
            out = vec![f64::NAN; rng.random_range(0..3000)];
        }
        let rank = rng.random_range(1..=4);
        let dims: Vec<usize> = (0..rank).map(|_| rng.random_range(1..=6)).collect();
        let k = rng.random_range(1..=rank);
        let mats: Vec<DenseMatrix<f64>> = (0..k)
            .map(|n| {
                let rows = rng.random_range(1..=7);
                random_sparse(&mut rng, rows, dims[n])
            })
            .collect();
        let x: Vec<f64> = (0..dims.iter().product())
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let mut expect = x.clone();
        let mut shape = dims.clone();
        for (n, u) in mats.iter().enumerate() {
            expect = naive_mode_n(&expect, &shape, n, u);
            shape[n] = u.rows;
        }
        let sparse: Vec<SparseTransform<f64>> = mats
            .iter()
            .map(|u| SparseTransform::from_dense(u).unwrap())
            .collect();
        let refs: Vec<&SparseTransform<f64>> = sparse.iter().collect();
        let got_shape = multi_mode_product(&x, &dims, &refs, &mut scratch, &mut out).unwrap();
        assert_eq!(got_shape, shape);
        assert_eq!(out.len(), expect.len());
        for (a, b) in out.iter().zip(&expect) {
            assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()));
        }
    }
}

fn points(m: usize, r: usize) -> Vec<Point> {
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
    ];
    let mut p: Vec<Point> = seq[..m + r - 2]
        .iter()
        .map(|&(n, d)| Point::ratio(n, d).unwrap())
        .collect();
    p.push(Point::Infinity);
    p
}

/// One N-d tile through Bᵀ, G, ⊙, Aᵀ in f32 against the f64 direct correlation: 1D, 2D, 3D, with
/// per-dimension F(m, r) that differ (non-square tiles and kernels). Tolerance: every F used here has
/// α ≤ 8 with measured relative error below 1e-5 of max|y| (see the accuracy table); 1e-4 leaves
/// headroom while still catching any wrong index or transform (errors of order 1).
#[test]
fn tile_matches_direct_correlation_1d_2d_3d() {
    let cases: Vec<Vec<(usize, usize)>> = vec![
        vec![(2, 3)],
        vec![(4, 3)],
        vec![(3, 5)],
        vec![(6, 3)],
        vec![(1, 1)],
        vec![(2, 3), (4, 3)],
        vec![(4, 3), (2, 2)],
        vec![(3, 1), (1, 4)],
        vec![(2, 3), (3, 2), (4, 3)],
        vec![(2, 2), (2, 3), (1, 3)],
        vec![(2, 3), (2, 3), (2, 3), (2, 2)],
    ];
    let mut rng = SmallRng::seed_from_u64(3);
    for fs in cases {
        let per_dim: Vec<WinogradTransform> = fs
            .iter()
            .map(|&(m, r)| WinogradTransform::synthesize(m, r, &points(m, r)).unwrap())
            .collect();
        let tt = TileTransforms::new(&per_dim).unwrap();
        let d_dims = tt.in_tile();
        let g_dims = tt.kernel().to_vec();
        for _ in 0..10 {
            let d: Vec<f32> = (0..d_dims.iter().product())
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let g: Vec<f32> = (0..g_dims.iter().product())
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let y = tt.correlate_tile(&d, &g).unwrap();
            let d64: Vec<f64> = d.iter().map(|&v| v as f64).collect();
            let g64: Vec<f64> = g.iter().map(|&v| v as f64).collect();
            let y_ref = correlate_nd_f64(&d64, &d_dims, &g64, &g_dims).unwrap();
            assert_eq!(y.len(), y_ref.len());
            let scale = y_ref.iter().fold(0.0f64, |a, v| a.max(v.abs()));
            for (a, b) in y.iter().zip(&y_ref) {
                assert!(
                    ((*a as f64) - b).abs() <= 1e-4 * scale,
                    "{fs:?}: {a} vs {b}"
                );
            }
        }
    }
}

/// A batch of tiles as a trailing mode gives the same result as the tiles one by one, up to the
/// rounding of FMA (the vectorised columns of the batch) against a separate multiply and add (the
/// scalar tail that a single tile takes): a few ulps of the largest value.
#[test]
fn batched_input_transform_equals_per_tile() {
    let t = WinogradTransform::synthesize(4, 3, &points(4, 3)).unwrap();
    let tt = TileTransforms::new(&[t.clone(), t]).unwrap();
    let batch = 5;
    let mut rng = SmallRng::seed_from_u64(5);
    let tiles: Vec<Vec<f32>> = (0..batch)
        .map(|_| (0..36).map(|_| rng.random_range(-1.0..1.0)).collect())
        .collect();
    // Interleave: (6, 6, batch).
    let mut d = vec![0.0f32; 36 * batch];
    for (b, tile) in tiles.iter().enumerate() {
        for (i, &v) in tile.iter().enumerate() {
            d[i * batch + b] = v;
        }
    }
    let (mut scratch, mut v) = (Vec::new(), Vec::new());
    tt.input_transform(&d, batch, &mut scratch, &mut v).unwrap();
    for (b, tile) in tiles.iter().enumerate() {
        let mut one = Vec::new();
        tt.input_transform(tile, 1, &mut scratch, &mut one).unwrap();
        let scale = one.iter().fold(1.0f32, |a, x| a.max(x.abs()));
        for i in 0..36 {
            let (got, want) = (v[i * batch + b], one[i]);
            assert!((got - want).abs() <= 1e-6 * scale, "{i}: {got} vs {want}");
        }
    }
}

#[test]
fn errors_name_the_argument() {
    let u = SparseTransform::from_dense(&DenseMatrix {
        rows: 2,
        cols: 3,
        data: vec![1.0f32; 6],
    })
    .unwrap();
    let x = vec![0.0f32; 12];
    let mut y = vec![0.0f32; 8];
    assert!(matches!(
        mode_n_product(&x, &[4, 3], 2, &u, &mut y),
        Err(FastconvError::Shape { arg: "mode", .. })
    ));
    assert!(matches!(
        mode_n_product(&x, &[3, 4], 1, &u, &mut y),
        Err(FastconvError::Shape { arg: "u", .. })
    ));
    assert!(matches!(
        mode_n_product(&x[..11], &[4, 3], 1, &u, &mut y),
        Err(FastconvError::BufferLength { arg: "x", .. })
    ));
    assert!(matches!(
        mode_n_product(&x, &[4, 3], 1, &u, &mut y[..7]),
        Err(FastconvError::BufferLength { arg: "y", .. })
    ));
    assert!(matches!(
        mode_n_product(&x, &[0, 3], 1, &u, &mut y),
        Err(FastconvError::Zero { arg: "dims" })
    ));
    assert!(matches!(
        SparseTransform::from_dense(&DenseMatrix {
            rows: 2,
            cols: 3,
            data: vec![1.0f32; 5]
        }),
        Err(FastconvError::BufferLength { arg: "m.data", .. })
    ));
    assert!(matches!(
        TileTransforms::new(&[]),
        Err(FastconvError::Rank { arg: "per_dim", .. })
    ));
    let tt = TileTransforms::new(&[WinogradTransform::synthesize(2, 3, &points(2, 3)).unwrap()])
        .unwrap();
    assert!(matches!(
        tt.correlate_tile(&[0.0; 3], &[0.0; 3]),
        Err(FastconvError::BufferLength { arg: "d", .. })
    ));
    assert!(matches!(
        tt.correlate_tile(&[0.0; 4], &[0.0; 2]),
        Err(FastconvError::BufferLength { arg: "g", .. })
    ));
    assert!(matches!(
        correlate_nd_f64(&[0.0; 4], &[4], &[0.0; 5], &[5]),
        Err(FastconvError::Shape { arg: "g_dims", .. })
    ));
}

/// Every transform the crate synthesizes (Aᵀ, Bᵀ, G of F(m, r), m, r ≤ 8), prepared for the
/// f32 kernels as the plans use them (`core_blas::SmallA::new`: ± row or column pairs), against
/// the dense form (`SmallA::unpaired`, every row summed in column order) and an f64 product:
/// both within a few roundings of the sum of absolute terms, for the process's kernel family
/// (run the suite under `CORE_BLAS_ISA=avx2` and `=scalar` for the others).
#[test]
fn prepared_transforms_match_the_dense_form() {
    let mut rng = SmallRng::seed_from_u64(23);
    let mut column_paired = 0;
    for m in 1..=8 {
        for r in 1..=8 {
            let Ok(t) = fastconv::points::transform_for(m, r) else {
                continue;
            };
            for (name, d) in [
                ("at", t.at().to_f32()),
                ("bt", t.bt().to_f32()),
                ("g", t.g().to_f32()),
            ] {
                let (p, q) = (d.rows, d.cols);
                if p > core_blas::SMALL_MAX || q > core_blas::SMALL_MAX {
                    continue;
                }
                let paired = core_blas::SmallA::new(&d.data, p, q).unwrap();
                let dense = core_blas::SmallA::unpaired(&d.data, p, q).unwrap();
                if name == "at" && paired.column_paired() {
                    column_paired += 1;
                }
                for n in [1, 16, 33, 70, 131] {
                    let x: Vec<f32> = (0..q * n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                    let mut y1 = vec![f32::NAN; p * n];
                    let mut y2 = vec![f32::NAN; p * n];
                    paired.apply_strided(n, &x, n, &mut y1, n).unwrap();
                    dense.apply_strided(n, &x, n, &mut y2, n).unwrap();
                    for j in 0..p {
                        for c in 0..n {
                            let (mut s, mut sabs) = (0.0f64, 0.0f64);
                            for i in 0..q {
                                let v = d.data[j * q + i] as f64 * x[i * n + c] as f64;
                                s += v;
                                sabs += v.abs();
                            }
                            let bound = (q as f64 + 2.0) * f32::EPSILON as f64 * sabs + 1e-30;
                            for (form, y) in [("paired", &y1), ("dense", &y2)] {
                                let got = y[j * n + c] as f64;
                                assert!(
                                    (got - s).abs() <= bound,
                                    "F({m},{r}) {name} {form} n={n}: Y[{j},{c}] = {got}, expected {s} ± {bound}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    // Every Aᵀ of F(m ≥ 2, r ≥ 2) has ± column pairs; the count guards against the form silently
    // not being used.
    assert!(column_paired >= 50, "only {column_paired} Aᵀ column-paired");
}
