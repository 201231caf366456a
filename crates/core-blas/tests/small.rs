//! `small_a_rows` / `small_a_strided` against a naive f64 reference, for every kernel family the
//! host has: all shapes up to 16 × 16 (sparse A included), column counts around the vector and
//! chunk widths, strided rows with untouched gaps, and the argument errors.

mod common;

use common::random;
use core_blas::{Error, Gemm, SMALL_MAX, SmallA};

/// A p × q with about a third of its entries exactly zero (the transforms are sparse).
fn sparse_a(p: usize, q: usize, seed: u64) -> Vec<f32> {
    random(p * q, seed)
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            if (i * 7 + seed as usize).is_multiple_of(3) {
                0.0
            } else {
                v
            }
        })
        .collect()
}

/// Check y (p rows of n at stride ldy) against A·X in f64 with a bound of q+1 roundings of the
/// sum of absolute terms.
#[allow(clippy::too_many_arguments)]
fn check(
    what: &str,
    a: &[f32],
    p: usize,
    q: usize,
    n: usize,
    x: &[f32],
    ldx: usize,
    y: &[f32],
    ldy: usize,
) {
    for j in 0..p {
        for c in 0..n {
            let (mut s, mut sabs) = (0.0f64, 0.0f64);
            for i in 0..q {
                let t = a[j * q + i] as f64 * x[i * ldx + c] as f64;
                s += t;
                sabs += t.abs();
            }
            let bound = (q as f64 + 1.0) * f32::EPSILON as f64 * sabs + 1e-30;
            let got = y[j * ldy + c] as f64;
            assert!(
                (got - s).abs() <= bound,
                "{what}: Y[{j},{c}] = {got}, expected {s} ± {bound}"
            );
        }
    }
}

#[test]
fn small_a_matches_naive_on_every_shape() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let mut seed = 1;
        for p in 0..=SMALL_MAX {
            for q in 0..=SMALL_MAX {
                for n in [0, 1, 7, 8, 9, 31, 32, 33, 63, 100, 257] {
                    seed += 1;
                    let what = format!("{} {p}x{q} n={n}", g.kernel_name());
                    let a = sparse_a(p, q, seed);
                    // Strided: rows n + 3 apart; the gaps of Y must stay untouched.
                    let (ldx, ldy) = (n + 3, n + 5);
                    let x = random(q * ldx, seed + 1000);
                    let mut y = vec![f32::NAN; p * ldy];
                    g.small_a_strided(&a, p, q, n, &x, ldx, &mut y, ldy)
                        .unwrap();
                    check(&what, &a, p, q, n, &x, ldx, &y, ldy);
                    for j in 0..p {
                        assert!(
                            y[j * ldy + n..(j + 1) * ldy].iter().all(|v| v.is_nan()),
                            "{what}: strided write outside row {j}"
                        );
                    }
                    // Row slices.
                    let xr: Vec<&[f32]> = x.chunks(ldx).take(q).map(|r| &r[..n]).collect();
                    let mut yd = vec![f32::NAN; p * n.max(1)];
                    let mut yr: Vec<&mut [f32]> = yd
                        .chunks_mut(n.max(1))
                        .take(p)
                        .map(|r| &mut r[..n])
                        .collect();
                    g.small_a_rows(&a, p, q, &xr, &mut yr).unwrap();
                    check(&format!("{what} rows"), &a, p, q, n, &x, ldx, &yd, n.max(1));
                }
            }
        }
    }
}

#[test]
fn small_a_skips_exact_zeros() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        // Row 0 uses only X row 1; X row 0 is NaN everywhere and must not leak into it.
        let a = [0.0, 2.0, 1.0, 1.0];
        let n = 37;
        let x: Vec<f32> = [vec![f32::NAN; n], vec![3.0; n]].concat();
        let mut y = vec![0.0; 2 * n];
        g.small_a_strided(&a, 2, 2, n, &x, n, &mut y, n).unwrap();
        assert!(
            y[..n].iter().all(|&v| v == 6.0),
            "{isa}: zero coefficient read X"
        );
        assert!(
            y[n..].iter().all(|v| v.is_nan()),
            "{isa}: nonzero coefficient skipped"
        );
    }
}

#[test]
fn small_a_rejects_bad_arguments() {
    let g = Gemm::global().unwrap();
    let x = vec![1.0f32; 64];
    let mut y = vec![0.0f32; 64];
    let a = vec![1.0f32; 17 * 17];
    let arg = |e: Error| match e {
        Error::ShapeMismatch { arg, .. }
        | Error::SliceTooShort { arg, .. }
        | Error::LeadingDimension { arg, .. }
        | Error::Stride { arg, .. } => arg,
        other => panic!("unexpected error {other}"),
    };
    // A too large, A too short.
    assert_eq!(
        arg(g
            .small_a_strided(&a, 17, 2, 4, &x, 4, &mut y, 4)
            .unwrap_err()),
        "a"
    );
    assert_eq!(
        arg(g
            .small_a_strided(&a[..3], 2, 2, 4, &x, 4, &mut y, 4)
            .unwrap_err()),
        "a"
    );
    // Leading dimensions below n, slices too short.
    assert_eq!(
        arg(g
            .small_a_strided(&a, 2, 2, 8, &x, 4, &mut y, 8)
            .unwrap_err()),
        "ldx"
    );
    assert_eq!(
        arg(g
            .small_a_strided(&a, 2, 2, 8, &x, 8, &mut y, 4)
            .unwrap_err()),
        "ldy"
    );
    assert_eq!(
        arg(g
            .small_a_strided(&a, 2, 2, 40, &x, 40, &mut y, 40)
            .unwrap_err()),
        "x"
    );
    assert_eq!(
        arg(g
            .small_a_strided(&a, 2, 1, 40, &x, 40, &mut y, 40)
            .unwrap_err()),
        "y"
    );
    // Row slices: wrong row counts, ragged Y, short X row.
    let (x4, x3) = (&x[..4], &x[..3]);
    let (mut y1, mut y2) = (vec![0.0f32; 4], vec![0.0f32; 4]);
    let e = g
        .small_a_rows(&a, 2, 2, &[x4], &mut [&mut y1, &mut y2])
        .unwrap_err();
    assert_eq!(arg(e), "x");
    let e = g
        .small_a_rows(&a, 2, 2, &[x4, x4], &mut [&mut y1])
        .unwrap_err();
    assert_eq!(arg(e), "y");
    let e = g
        .small_a_rows(&a, 2, 2, &[x4, x4], &mut [&mut y1, &mut y2[..3]])
        .unwrap_err();
    assert_eq!(arg(e), "y");
    let e = g
        .small_a_rows(&a, 2, 2, &[x4, x3], &mut [&mut y1, &mut y2])
        .unwrap_err();
    assert_eq!(arg(e), "x");
}

/// A p × q with ± row pairs: every other row repeats an earlier row's nonzero pattern and
/// magnitudes with some signs flipped (or none, or all), as the ±x rows of Winograd matrices.
fn paired_a(p: usize, q: usize, seed: u64) -> Vec<f32> {
    let mut a = sparse_a(p, q, seed);
    let flips = random(p * q, seed + 77);
    for j in (1..p).step_by(2) {
        let src = (j - 1) / 2 * 2;
        for i in 0..q {
            let v = a[src * q + i];
            let mode = j % 3; // 0: random flips, 1: all equal, 2: all flipped
            a[j * q + i] = match mode {
                0 if flips[j * q + i] < 0.0 => -v,
                2 => -v,
                _ => v,
            };
        }
    }
    a
}

#[test]
fn prepared_small_a_matches_naive_with_row_pairs() {
    // Winograd F(4, 3) Bᵀ: rows 1/2 and 3/4 are ± pairs.
    #[rustfmt::skip]
    let bt: [f32; 36] = [
        4.0, 0.0, -5.0, 0.0, 1.0, 0.0,
        0.0, -4.0, -4.0, 1.0, 1.0, 0.0,
        0.0, 4.0, -4.0, -1.0, 1.0, 0.0,
        0.0, -2.0, -1.0, 2.0, 1.0, 0.0,
        0.0, 2.0, -1.0, -2.0, 1.0, 0.0,
        0.0, 4.0, 0.0, -5.0, 0.0, 1.0,
    ];
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let mut seed = 5000;
        let mut cases: Vec<(Vec<f32>, usize, usize)> = vec![(bt.to_vec(), 6, 6)];
        for p in [1, 2, 3, 4, 5, 8, 9, 16] {
            for q in [1, 3, 6, 9, 16] {
                seed += 1;
                cases.push((paired_a(p, q, seed), p, q));
            }
        }
        for (a, p, q) in &cases {
            let (p, q) = (*p, *q);
            let prepared = SmallA::new(a, p, q).unwrap();
            assert_eq!((prepared.rows(), prepared.cols()), (p, q));
            for n in [1, 5, 8, 13, 32, 37, 48, 80, 96, 101, 128, 203] {
                seed += 1;
                let what = format!("{} prepared {p}x{q} n={n}", g.kernel_name());
                let (ldx, ldy) = (n + 2, n + 3);
                let x = random(q * ldx, seed);
                let mut y = vec![f32::NAN; p * ldy];
                g.small_a_apply(&prepared, n, &x, ldx, &mut y, ldy).unwrap();
                check(&what, a, p, q, n, &x, ldx, &y, ldy);
                for j in 0..p {
                    assert!(
                        y[j * ldy + n..(j + 1) * ldy].iter().all(|v| v.is_nan()),
                        "{what}: write outside row {j}"
                    );
                }
                // The unpaired form matches naive too, and the one-shot entry point agrees with
                // it exactly (same plan, same order).
                let unpaired = SmallA::unpaired(a, p, q).unwrap();
                let mut y1 = vec![f32::NAN; p * ldy];
                g.small_a_apply(&unpaired, n, &x, ldx, &mut y1, ldy)
                    .unwrap();
                check(&format!("{what} unpaired"), a, p, q, n, &x, ldx, &y1, ldy);
                let mut y2 = vec![f32::NAN; p * ldy];
                g.small_a_strided(a, p, q, n, &x, ldx, &mut y2, ldy)
                    .unwrap();
                assert!(
                    y1.iter().zip(&y2).all(|(u, v)| u.to_bits() == v.to_bits()),
                    "{what}: small_a_strided differs from the unpaired prepared product"
                );
            }
        }
    }
}

#[test]
fn prepared_small_a_errors_and_zero_skips() {
    assert!(matches!(
        SmallA::new(&[1.0; 4], 17, 1),
        Err(Error::ShapeMismatch { arg: "a", .. })
    ));
    assert!(matches!(
        SmallA::new(&[1.0; 3], 2, 2),
        Err(Error::SliceTooShort { arg: "a", .. })
    ));
    // A ± pair whose zero column meets NaN in X: the pair must not read it.
    let a = [0.0, 1.0, 2.0, 0.0, -1.0, 2.0];
    let s = SmallA::new(&a, 2, 3).unwrap();
    let n = 19;
    let x: Vec<f32> = [vec![f32::NAN; n], vec![1.0; n], vec![3.0; n]].concat();
    let mut y = vec![0.0; 2 * n];
    s.apply_strided(n, &x, n, &mut y, n).unwrap();
    assert!(y[..n].iter().all(|&v| v == 7.0), "row 0: {:?}", &y[..n]);
    assert!(y[n..].iter().all(|&v| v == 5.0), "row 1: {:?}", &y[n..]);
    let mut short = vec![0.0; 2 * n - 1];
    assert!(matches!(
        s.apply_strided(n, &x, n, &mut short, n),
        Err(Error::SliceTooShort { arg: "y", .. })
    ));
}

/// A p × q Winograd-like Aᵀ with ± column pairs: columns `2t, 2t + 1` hold `x^i` and `(−x)^i`
/// (times a random scale) for rows i, then optionally the point 0 (`e_0`) and ∞ (`e_{p−1}`), and
/// with `extra` a dense random column; columns shuffled by a rotation.
fn column_paired_a(
    p: usize,
    pairs: usize,
    zero: bool,
    inf: bool,
    extra: bool,
    seed: u64,
) -> (Vec<f32>, usize) {
    let pts = random(pairs, seed);
    let scales = random(pairs, seed + 1);
    let mut cols: Vec<Vec<f32>> = Vec::new();
    for t in 0..pairs {
        let x = 0.25 + pts[t].abs() * 2.0;
        let sc = 0.5 + scales[t].abs();
        cols.push((0..p).map(|i| sc * x.powi(i as i32)).collect());
        cols.push((0..p).map(|i| sc * (-x).powi(i as i32)).collect());
    }
    if zero {
        cols.push((0..p).map(|i| if i == 0 { 1.0 } else { 0.0 }).collect());
    }
    if inf {
        cols.push((0..p).map(|i| if i == p - 1 { 1.0 } else { 0.0 }).collect());
    }
    if extra {
        cols.push(random(p, seed + 2));
    }
    let q = cols.len();
    let rot = seed as usize % q;
    let mut a = vec![0.0f32; p * q];
    for (k, col) in cols.iter().enumerate() {
        let kk = (k + rot) % q;
        for i in 0..p {
            a[i * q + kk] = col[i];
        }
    }
    (a, q)
}

#[test]
fn prepared_small_a_matches_naive_with_column_pairs() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let mut seed = 9000;
        for p in 1..=9 {
            for pairs in 1..=7 {
                for (zero, inf, extra) in [
                    (false, false, false),
                    (false, true, false),
                    (true, true, false),
                    (true, true, true),
                ] {
                    seed += 1;
                    let (a, q) = column_paired_a(p, pairs, zero, inf, extra, seed);
                    if q > SMALL_MAX {
                        continue;
                    }
                    let prepared = SmallA::new(&a, p, q).unwrap();
                    assert_eq!(
                        prepared.column_paired(),
                        (2..=8).contains(&p),
                        "{p}x{q}, {pairs} pairs"
                    );
                    for n in [1, 5, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 100, 203] {
                        seed += 1;
                        let what = format!(
                            "{} column-paired {p}x{q} ({pairs} pairs) n={n}",
                            g.kernel_name()
                        );
                        let (ldx, ldy) = (n + 2, n + 3);
                        let x = random(q * ldx, seed);
                        let mut y = vec![f32::NAN; p * ldy];
                        g.small_a_apply(&prepared, n, &x, ldx, &mut y, ldy).unwrap();
                        check(&what, &a, p, q, n, &x, ldx, &y, ldy);
                        for j in 0..p {
                            assert!(
                                y[j * ldy + n..(j + 1) * ldy].iter().all(|v| v.is_nan()),
                                "{what}: write outside row {j}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn column_paired_small_a_skips_exact_zeros() {
    // Aᵀ of F(2, 3) (points 0, 1, −1, ∞): X rows of the point 0 and ∞ are NaN where their
    // coefficient is zero, and must reach only the row that uses them.
    let a = [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, -1.0, 1.0];
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let s = SmallA::new(&a, 2, 4).unwrap();
        assert!(s.column_paired());
        for n in [3, 16, 37, 64] {
            let x: Vec<f32> =
                [vec![2.0; n], vec![3.0; n], vec![5.0; n], vec![f32::NAN; n]].concat();
            let mut y = vec![0.0; 2 * n];
            g.small_a_apply(&s, n, &x, n, &mut y, n).unwrap();
            assert!(
                y[..n].iter().all(|&v| v == 10.0),
                "{isa} row 0: {:?}",
                &y[..n]
            );
            assert!(
                y[n..].iter().all(|v| v.is_nan()),
                "{isa} row 1: {:?}",
                &y[n..]
            );
            let x: Vec<f32> =
                [vec![f32::NAN; n], vec![3.0; n], vec![5.0; n], vec![7.0; n]].concat();
            g.small_a_apply(&s, n, &x, n, &mut y, n).unwrap();
            assert!(
                y[..n].iter().all(|v| v.is_nan()),
                "{isa} row 0: {:?}",
                &y[..n]
            );
            assert!(
                y[n..].iter().all(|&v| v == 5.0),
                "{isa} row 1: {:?}",
                &y[n..]
            );
        }
    }
}
