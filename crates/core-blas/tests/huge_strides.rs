//! Huge but legal strides: a view with one row (or one column) may carry any stride in that
//! direction (`MatRef::row_major` checks `ld` only when rows > 1), so every stride and offset
//! computation of the driver, the packers and the kernels must avoid scaling such a stride
//! (bytes, look-ahead rows) where it is never used. Run in the test profile (overflow checks
//! on) as the official CI does. Each case: every family, products large enough for several
//! A blocks, several panels and two threads, against the naive reference; beta = 0 over NaN and
//! beta = 0.5.
mod common;

use common::{GEMM_TOL, Strided, assert_close, families, random, reference};
use core_blas::{Gemm, MatMut, MatRef};

const HUGE: usize = usize::MAX;

/// The layout of one operand: row-major with its leading dimension, or the transpose of a
/// row-major view (column-major storage).
#[derive(Clone, Copy, Debug)]
enum Lay {
    Row(usize),
    Col(usize),
}

impl Lay {
    /// Storage length and strides (rs, cs) of a `rows × cols` matrix; a huge stride only where
    /// its direction has one element.
    fn of(self, rows: usize, cols: usize) -> (usize, usize, usize) {
        match self {
            Lay::Row(ld) => {
                let len = if rows == 1 {
                    cols
                } else {
                    (rows - 1) * ld + cols
                };
                (len, ld, 1)
            }
            Lay::Col(ld) => {
                let len = if cols == 1 {
                    rows
                } else {
                    (cols - 1) * ld + rows
                };
                (len, 1, ld)
            }
        }
    }
}

fn view<'a>(data: &'a [f32], rows: usize, cols: usize, lay: Lay) -> MatRef<'a> {
    match lay {
        Lay::Row(ld) => MatRef::row_major("x", data, rows, cols, ld).unwrap(),
        Lay::Col(ld) => MatRef::row_major("x", data, cols, rows, ld).unwrap().t(),
    }
}

fn view_mut<'a>(data: &'a mut [f32], rows: usize, cols: usize, lay: Lay) -> MatMut<'a> {
    match lay {
        Lay::Row(ld) => MatMut::row_major("c", data, rows, cols, ld).unwrap(),
        Lay::Col(ld) => MatMut::row_major("c", data, cols, rows, ld).unwrap().t(),
    }
}

fn check(m: usize, n: usize, k: usize, la: Lay, lb: Lay, lc: Lay) {
    let (alen, ars, acs) = la.of(m, k);
    let (blen, brs, bcs) = lb.of(k, n);
    let (clen, crs, ccs) = lc.of(m, n);
    let a = random(alen, 1);
    let b = random(blen, 2);
    let c0 = random(clen, 3);
    for isa in families() {
        let g = Gemm::new(isa).unwrap();
        for beta in [0.0f32, 0.5] {
            let mut c = if beta == 0.0 {
                vec![f32::NAN; clen]
            } else {
                c0.clone()
            };
            g.gemm(
                1.5,
                view(&a, m, k, la),
                view(&b, k, n, lb),
                beta,
                view_mut(&mut c, m, n, lc),
            )
            .unwrap();
            let expect = reference(
                m,
                n,
                k,
                1.5,
                Strided {
                    data: &a,
                    rs: ars,
                    cs: acs,
                },
                Strided {
                    data: &b,
                    rs: brs,
                    cs: bcs,
                },
                beta,
                Strided {
                    data: &c0,
                    rs: crs,
                    cs: ccs,
                },
                GEMM_TOL,
            );
            let what = format!("{isa:?} {m}x{n}x{k} a {la:?} b {lb:?} c {lc:?} beta {beta}");
            let got = Strided {
                data: &c,
                rs: crs,
                cs: ccs,
            };
            assert_close(&what, got, m, n, &expect);
        }
    }
}

/// k = 1: B's row stride and a column-major A's column stride may be anything. m past several
/// A blocks (the side head of several-A-block products), n past several panels.
#[test]
fn k_one_huge_b_and_a_strides() {
    let (m, n) = (1100, 1300);
    check(m, n, 1, Lay::Row(1), Lay::Row(HUGE), Lay::Row(n + 16));
    check(m, n, 1, Lay::Col(HUGE), Lay::Row(HUGE), Lay::Row(n));
    check(m, n, 1, Lay::Col(HUGE), Lay::Col(3), Lay::Row(n + 4));
}

/// m = 1: A's row stride and C's row stride may be anything.
#[test]
fn m_one_huge_a_and_c_strides() {
    let (n, k) = (3000, 700);
    check(1, n, k, Lay::Row(HUGE), Lay::Row(n + 16), Lay::Row(HUGE));
    check(1, n, k, Lay::Row(HUGE), Lay::Col(k + 5), Lay::Row(HUGE));
}

/// n = 1: a column-major B's and a column-major C's column strides may be anything.
#[test]
fn n_one_huge_b_and_c_strides() {
    let (m, k) = (2500, 900);
    check(m, 1, k, Lay::Row(k), Lay::Col(HUGE), Lay::Col(HUGE));
    check(m, 1, k, Lay::Col(m + 1), Lay::Col(HUGE), Lay::Row(1));
}

/// The cblas entry with every leading dimension huge where the shape allows it.
#[test]
fn sgemm_huge_leading_dimensions() {
    for isa in families() {
        let g = Gemm::new(isa).unwrap();
        // k = 1, no transposes: A is m × 1 (lda >= 1), B is 1 × n (ldb any).
        let (m, n) = (900, 2100);
        let a = random(m, 4);
        let b = random(n, 5);
        let mut c = vec![f32::NAN; m * n];
        g.sgemm(false, false, m, n, 1, 1.0, &a, 1, &b, HUGE, 0.0, &mut c, n)
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                assert_eq!(c[i * n + j], a[i] * b[j], "{isa:?} ({i},{j})");
            }
        }
        // k = 1 with transa: A stored 1 × m (lda any).
        let mut c2 = vec![f32::NAN; m * n];
        g.sgemm(
            true, false, m, n, 1, 1.0, &a, HUGE, &b, HUGE, 0.0, &mut c2, n,
        )
        .unwrap();
        assert_eq!(c, c2, "{isa:?} transa");
        // m = 1: A 1 × k (lda any), C 1 × n (ldc any); transb: B stored n × k.
        let (n, k) = (2100, 1000);
        let a = random(k, 6);
        let b = random(n * k, 7);
        let mut c = vec![f32::NAN; n];
        g.sgemm(
            false, true, 1, n, k, 1.0, &a, HUGE, &b, k, 0.0, &mut c, HUGE,
        )
        .unwrap();
        for (j, &x) in c.iter().enumerate() {
            let want: f64 = (0..k).map(|p| a[p] as f64 * b[j * k + p] as f64).sum();
            assert!((x as f64 - want).abs() < 1e-3, "{isa:?} m = 1, col {j}");
        }
    }
}
