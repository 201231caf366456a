//! The driver's thread split: on pools of 2, 3 and 4 threads, odd shapes large enough to run in
//! parallel (row ranges, column blocks claimed by the threads sharing a row range, C's cache-line
//! head) cover every element of C exactly once,
//! and the results equal the 1-thread product bitwise (small integers, exact in any order), for
//! every kernel family, with the cache-derived block sizes and with small ones (many blocks).

mod common;

use std::sync::Mutex;

use common::ints;
use core_blas::{BlockSizes, Gemm, MatMut, MatRef, Store, Tile};

fn contexts() -> Vec<Gemm> {
    let mut out = Vec::new();
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.tile();
        out.push(g);
        // Blocks a few panels wide: many claims per row range.
        out.push(
            g.with_block_sizes(BlockSizes {
                mc: 3 * mr,
                kc: 40,
                nc: 5 * nr,
            })
            .unwrap(),
        );
    }
    out
}

/// Shapes of at least 2²¹ multiply-adds (the driver's threshold for threads): wide (one row
/// range, all threads claiming its column blocks), tall (row ranges), square-ish (a 2 × 2 grid
/// on 4 threads), with primes for every size.
const SHAPES: [(usize, usize, usize); 5] = [
    (37, 1031, 61),
    (7, 9973, 31),
    (131, 257, 67),
    (1201, 29, 71),
    (257, 263, 41),
];

/// Counts, per element of C, the tiles stored with `first` and with `last` (a concurrent store:
/// the driver's threads call it from their own blocks), and adds their values up.
struct Counting {
    m: usize,
    n: usize,
    state: Mutex<(Vec<f32>, Vec<u32>, Vec<u32>)>,
}

impl Store for Counting {
    fn rows(&self) -> usize {
        self.m
    }
    fn cols(&self) -> usize {
        self.n
    }
    fn store_tile(&self, t: &Tile<'_>) {
        let mut guard = self.state.lock().unwrap();
        let (sum, firsts, lasts) = &mut *guard;
        for r in 0..t.rows() {
            for c in 0..t.cols() {
                let at = (t.i() + r) * self.n + t.j() + c;
                sum[at] += t.get(r, c);
                firsts[at] += u32::from(t.first());
                lasts[at] += u32::from(t.last());
            }
        }
    }
    fn concurrent(&self) -> bool {
        true
    }
}

/// The dense product (beta = 0 over NaN, so an element no thread writes stays NaN; beta = 1 over
/// C0, so an element two threads compute gets A·B twice) on `threads` threads, C starting `off`
/// floats into its storage (a head of narrow columns up to C's first cache line when B starts
/// at the same offset).
#[allow(clippy::too_many_arguments)]
fn dense(
    g: &Gemm,
    threads: usize,
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    c0: &[f32],
    beta: f32,
    off: usize,
) -> Vec<f32> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut bs = vec![0.0f32; k * n + off];
    bs[off..].copy_from_slice(b);
    let mut cs = vec![f32::NAN; m * n + off];
    if beta != 0.0 {
        cs[off..].copy_from_slice(c0);
    }
    pool.install(|| {
        g.sgemm(
            false,
            false,
            m,
            n,
            k,
            1.0,
            a,
            k,
            &bs[off..],
            n,
            beta,
            &mut cs[off..],
            n,
        )
    })
    .unwrap();
    cs.split_off(off)
}

#[test]
fn thread_split_covers_every_element_once() {
    for g in contexts() {
        for &(m, n, k) in &SHAPES {
            let a = ints(m * k, 7, 13);
            let b = ints(k * n, 5, 11);
            let c0 = ints(m * n, 3, 9);
            let what = |t: usize| {
                format!(
                    "{} {:?} {m}x{n}x{k} {t} threads",
                    g.kernel_name(),
                    g.block_sizes()
                )
            };
            // The naive product (exact: small integers).
            let mut want = vec![0.0f32; m * n];
            for i in 0..m {
                for p in 0..k {
                    let x = a[i * k + p];
                    for j in 0..n {
                        want[i * n + j] += x * b[p * n + j];
                    }
                }
            }
            for (beta, off) in [(0.0f32, 0usize), (1.0, 0), (0.0, 4), (1.0, 12)] {
                let one = dense(&g, 1, (m, n, k), &a, &b, &c0, beta, off);
                for (i, (&x, &w)) in one.iter().zip(&want).enumerate() {
                    let w = w + if beta == 0.0 { 0.0 } else { c0[i] };
                    assert_eq!(x, w, "{} beta {beta} off {off} at {i}", what(1));
                }
                for threads in [2, 3, 4] {
                    let got = dense(&g, threads, (m, n, k), &a, &b, &c0, beta, off);
                    assert!(
                        got.iter()
                            .zip(&one)
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "{} beta {beta} off {off}: differs from 1 thread",
                        what(threads)
                    );
                }
            }
            // Through a custom store: every element's first and last pass stored exactly once.
            for threads in [1, 2, 3, 4] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut store = Counting {
                    m,
                    n,
                    state: Mutex::new((vec![0.0; m * n], vec![0; m * n], vec![0; m * n])),
                };
                let av = MatRef::row_major("a", &a, m, k, k).unwrap();
                let bv = MatRef::row_major("b", &b, k, n, n).unwrap();
                pool.install(|| g.gemm_with(&av, &bv, &mut store)).unwrap();
                let (sum, firsts, lasts) = store.state.into_inner().unwrap();
                assert!(firsts.iter().all(|&x| x == 1), "{}: firsts", what(threads));
                assert!(lasts.iter().all(|&x| x == 1), "{}: lasts", what(threads));
                assert_eq!(sum, want, "{}: values", what(threads));
            }
        }
    }
}

/// A strided C (column stride 1, row stride past n) and a column-major C (computed as the
/// transposed product) on 2 threads: the claimed blocks stay inside the view.
#[test]
fn thread_split_on_strided_views() {
    let (m, n, k) = (29usize, 2003usize, 53usize);
    let a = ints(m * k, 7, 13);
    let b = ints(k * n, 5, 11);
    let mut want = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for g in contexts() {
        let av = MatRef::row_major("a", &a, m, k, k).unwrap();
        let bv = MatRef::row_major("b", &b, k, n, n).unwrap();
        let ld = n + 5;
        let mut c = vec![f32::NAN; m * ld];
        let cv = MatMut::row_major("c", &mut c, m, n, ld).unwrap();
        pool.install(|| g.gemm(1.0, av, bv, 0.0, cv)).unwrap();
        for i in 0..m {
            assert_eq!(
                &c[i * ld..][..n],
                &want[i * n..][..n],
                "{} row {i}",
                g.kernel_name()
            );
            assert!(c[i * ld + n..][..ld - n].iter().all(|x| x.is_nan()));
        }
        let mut ct = vec![f32::NAN; m * n];
        let cv = MatMut::new("c", &mut ct, m, n, 1, m).unwrap();
        pool.install(|| g.gemm(1.0, av, bv, 0.0, cv)).unwrap();
        for i in 0..m {
            for j in 0..n {
                assert_eq!(
                    ct[j * m + i],
                    want[i * n + j],
                    "{} col-major",
                    g.kernel_name()
                );
            }
        }
    }
}
