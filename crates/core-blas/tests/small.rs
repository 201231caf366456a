//! `small_a_rows` / `small_a_strided` against a naive f64 reference, for every kernel family the
//! host has: all shapes up to 16 × 16 (sparse A included), column counts around the vector and
//! chunk widths, strided rows with untouched gaps, and the argument errors.

mod common;

use common::random;
use core_blas::{Error, Gemm, SMALL_MAX};

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
