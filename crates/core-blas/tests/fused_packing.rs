//! The fused B packing (a row-major B packed inside the first tile of each panel, AVX-512 and
//! AVX2) at its edges: k = 0, a `PackB` whose `row_major` hands over less than the matrix, B
//! views at an offset with a tight end and ld > n, overlapping rows, k = 1 with a huge row
//! stride. Every family runs them (scalar packs up front).
mod common;

use common::ints;
use core_blas::{DenseStore, MatMut, MatRef, PackB};

/// `A · B` through `core_blas::gemm` (beta = 0 over a C full of NaN), C row-major.
fn product(a: MatRef<'_>, b: MatRef<'_>) -> Vec<f32> {
    let (m, n) = (a.rows(), b.cols());
    let mut c = vec![f32::NAN; m * n];
    core_blas::gemm(
        1.0,
        a,
        b,
        0.0,
        MatMut::row_major("c", &mut c, m, n, n).unwrap(),
    )
    .unwrap();
    c
}

/// k = 0 with at least two full 48-wide panels and an empty B: must just scale C.
#[test]
fn k_zero_two_panels_empty_b() {
    let (m, n) = (8usize, 96usize);
    let mut c = vec![2.0f32; m * n];
    core_blas::sgemm(false, false, m, n, 0, 1.0, &[], 1, &[], n, 0.5, &mut c, n).unwrap();
    assert!(c.iter().all(|&x| x == 1.0));
}

/// k = 0 through gemm on views, one panel only (first panel: jr = 0).
#[test]
fn k_zero_one_panel_empty_b() {
    let (m, n) = (8usize, 48usize);
    let mut c = vec![2.0f32; m * n];
    core_blas::sgemm(false, false, m, n, 0, 1.0, &[], 1, &[], n, 0.5, &mut c, n).unwrap();
    assert!(c.iter().all(|&x| x == 1.0));
}

/// A safe `PackB` whose `row_major` returns only its first row: the driver must not read past it
/// (it packs through `pack_b` instead, whose matrix is all ones).
struct Liar {
    v: Vec<f32>,
    k: usize,
    n: usize,
}
impl PackB for Liar {
    fn rows(&self) -> usize {
        self.k
    }
    fn cols(&self) -> usize {
        self.n
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        // The true matrix is all ones.
        let _ = (pc, jc);
        dst[..nc.div_ceil(nr) * nr * kc].fill(1.0);
        let _ = nc;
    }
    fn row_major(&self) -> Option<(&[f32], usize)> {
        Some((&self.v[..self.n], self.n))
    }
}

#[test]
fn lying_row_major_is_not_trusted() {
    let (m, n, k) = (8usize, 96usize, 16usize);
    let mut v = vec![7.0f32; k * n];
    v[0] = 1.0;
    let b = Liar { v, k, n };
    let a = vec![1.0f32; m * k];
    let av = MatRef::row_major("a", &a, m, k, k).unwrap();
    let mut c = vec![0.0f32; m * n];
    {
        let cv = MatMut::row_major("c", &mut c, m, n, n).unwrap();
        let mut store = DenseStore::new(cv, 1.0, 0.0);
        core_blas::gemm_with(&av, &b, &mut store).unwrap();
    }
    let outside: usize = c.iter().filter(|&&x| x != k as f32).count();
    assert_eq!(
        outside,
        0,
        "values read outside the slice row_major returned: {:?}",
        &c[..4]
    );
}

/// Fused path with B a view at an offset inside a larger buffer, ld > n, tight allocation
/// (the view ends at the end of the Vec), several panels, k % 4 != 0, against a naive product.
#[test]
fn fused_offset_view_tight_end() {
    for &(m, n, k, ld, off) in &[
        (16usize, 144usize, 37usize, 150usize, 3usize),
        (9, 96, 1, 97, 5),
        (8, 200, 6, 201, 1),
    ] {
        let len = off + (k - 1) * ld + n;
        let buf: Vec<f32> = ints(len, 5, 11);
        let a: Vec<f32> = ints(m * k, 7, 13);
        let bv = MatRef::row_major("b", &buf[off..], k, n, ld).unwrap();
        let av = MatRef::row_major("a", &a, m, k, k).unwrap();
        let c = product(av, bv);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|p| a[i * k + p] * buf[off + p * ld + j]).sum();
                assert_eq!(c[i * n + j], want, "{m}x{n}x{k} ({i},{j})");
            }
        }
    }
}

/// Overlapping rows (rs < n, a sliding-window view) and rs = 0 (broadcast row), both cs = 1.
#[test]
fn fused_overlapping_rows() {
    let (m, n, k) = (8usize, 96usize, 10usize);
    let a: Vec<f32> = ints(m * k, 7, 13);
    for rs in [0usize, 1, 3] {
        let len = (k - 1) * rs + n;
        let buf: Vec<f32> = ints(len, 5, 11);
        let bv = MatRef::new("b", &buf, k, n, rs, 1).unwrap();
        let av = MatRef::row_major("a", &a, m, k, k).unwrap();
        let c = product(av, bv);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|p| a[i * k + p] * buf[p * rs + j]).sum();
                assert_eq!(c[i * n + j], want, "rs {rs} ({i},{j})");
            }
        }
    }
}

/// k = 1 with a huge row stride (valid: one row, `MatRef::row_major` checks ld only when rows > 1).
#[test]
fn k_one_huge_ld() {
    let (m, n) = (8usize, 96usize);
    let b: Vec<f32> = (0..n).map(|j| (j % 7) as f32).collect();
    let a = vec![2.0f32; m];
    let bv = MatRef::row_major("b", &b, 1, n, usize::MAX).unwrap();
    let av = MatRef::row_major("a", &a, m, 1, 1).unwrap();
    let c = product(av, bv);
    for i in 0..m {
        for j in 0..n {
            assert_eq!(c[i * n + j], 2.0 * b[j]);
        }
    }
}

/// A store that is not the dense one (each tile through `store_tile`, C written transposed), so
/// the driver copies a row-major B's panels before their tiles instead of packing them inside
/// the first tile: against the naive product, on 1 and 2 threads, with several full panels, a
/// partial one, several A blocks and k passes.
struct Transposed {
    m: usize,
    n: usize,
    out: std::sync::Mutex<Vec<f32>>,
}

impl core_blas::Store for Transposed {
    fn rows(&self) -> usize {
        self.m
    }
    fn cols(&self) -> usize {
        self.n
    }
    fn store_tile(&self, t: &core_blas::Tile<'_>) {
        let mut out = self.out.lock().unwrap();
        for r in 0..t.rows() {
            for c in 0..t.cols() {
                out[(t.j() + c) * self.m + t.i() + r] += t.get(r, c);
            }
        }
    }
}

#[test]
fn fused_source_through_a_custom_store() {
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for &(m, n, k) in &[(20usize, 150usize, 37usize), (400, 100, 700), (8, 96, 3)] {
            let a: Vec<f32> = ints(m * k, 7, 13);
            let b: Vec<f32> = ints(k * n, 5, 11);
            let av = MatRef::row_major("a", &a, m, k, k).unwrap();
            let bv = MatRef::row_major("b", &b, k, n, n).unwrap();
            let mut store = Transposed {
                m,
                n,
                out: std::sync::Mutex::new(vec![0.0; m * n]),
            };
            pool.install(|| core_blas::gemm_with(&av, &bv, &mut store))
                .unwrap();
            let out = store.out.into_inner().unwrap();
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                    let got = out[j * m + i];
                    assert!(
                        (got - want).abs() <= 1e-3 * want.abs().max(1.0),
                        "{threads} threads {m}x{n}x{k} ({i},{j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
