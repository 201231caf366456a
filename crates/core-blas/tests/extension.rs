//! The extension points: a virtual B that packs itself, a virtual A, custom stores (scatter with
//! k-passes, whole-k, serial), the fused bias/ReLU epilogue, generic batched products; and property
//! tests of `sgemm` against the naive reference.

mod common;

use std::sync::Mutex;

use common::{GEMM_TOL, Strided, assert_close, random, reference};
use core_blas::{
    Bias, BlockSizes, DenseStore, Gemm, MatMut, MatRef, PackA, PackB, Store, Tile, Window,
};
use proptest::prelude::*;

fn contexts() -> Vec<Gemm> {
    let mut out = Vec::new();
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.tile();
        out.push(g);
        out.push(
            g.with_block_sizes(BlockSizes {
                mc: mr,
                kc: 5,
                nc: nr,
            })
            .unwrap(),
        );
    }
    out
}

/// B[p, j] = f(p, j) computed on the fly: a matrix that exists nowhere in memory (the shape of
/// convgemm's im2col source).
struct FormulaB {
    k: usize,
    n: usize,
}

fn fb(p: usize, j: usize) -> f32 {
    ((p * 31 + j * 17) % 23) as f32 * 0.125 - 1.0
}

impl PackB for FormulaB {
    fn rows(&self) -> usize {
        self.k
    }
    fn cols(&self) -> usize {
        self.n
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        for q in 0..nc.div_ceil(nr) {
            for p in 0..kc {
                for x in 0..nr {
                    let j = q * nr + x;
                    dst[q * kc * nr + p * nr + x] = if j < nc { fb(pc + p, jc + j) } else { 0.0 };
                }
            }
        }
    }
}

/// A[i, p] = g(i, p), packed on the fly.
struct FormulaA {
    m: usize,
    k: usize,
}

fn fa(i: usize, p: usize) -> f32 {
    ((i * 13 + p * 7) % 19) as f32 * 0.1 - 0.9
}

impl PackA for FormulaA {
    fn rows(&self) -> usize {
        self.m
    }
    fn cols(&self) -> usize {
        self.k
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        for q in 0..mc.div_ceil(mr) {
            for p in 0..kc {
                for x in 0..mr {
                    let i = q * mr + x;
                    dst[q * kc * mr + p * mr + x] = if i < mc { fa(ic + i, pc + p) } else { 0.0 };
                }
            }
        }
    }
}

/// Scatter-add into a transposed output through a lock: a linear store that adds every k-pass.
/// It records how often each element was first-touched to check the k-pass flags.
struct TransposeAdd {
    m: usize,
    n: usize,
    out: Mutex<Vec<f32>>,
    firsts: Mutex<Vec<u32>>,
    lasts: Mutex<Vec<u32>>,
    concurrent: bool,
    whole_k: bool,
}

impl TransposeAdd {
    fn new(m: usize, n: usize, concurrent: bool, whole_k: bool) -> Self {
        Self {
            m,
            n,
            out: Mutex::new(vec![0.0; m * n]),
            firsts: Mutex::new(vec![0; m * n]),
            lasts: Mutex::new(vec![0; m * n]),
            concurrent,
            whole_k,
        }
    }
}

impl Store for TransposeAdd {
    fn rows(&self) -> usize {
        self.m
    }
    fn cols(&self) -> usize {
        self.n
    }
    fn store_tile(&self, t: &Tile<'_>) {
        let mut out = self.out.lock().unwrap();
        let mut firsts = self.firsts.lock().unwrap();
        let mut lasts = self.lasts.lock().unwrap();
        for r in 0..t.rows() {
            for c in 0..t.cols() {
                let (i, j) = (t.i() + r, t.j() + c);
                out[j * self.m + i] += t.get(r, c);
                firsts[j * self.m + i] += t.first() as u32;
                lasts[j * self.m + i] += t.last() as u32;
            }
            assert_eq!(t.row(r).len(), t.cols());
        }
    }
    fn concurrent(&self) -> bool {
        self.concurrent
    }
    fn whole_k(&self) -> bool {
        self.whole_k
    }
}

fn formula_reference(m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let a: Vec<f32> = (0..m * k).map(|x| fa(x / k, x % k)).collect();
    let b: Vec<f32> = (0..k * n).map(|x| fb(x / n, x % n)).collect();
    (a, b)
}

/// The reference of `C = A·B` (alpha 1, beta 0) for the formula operands, with its error bounds.
fn formula_expect(m: usize, n: usize, k: usize) -> Vec<(f64, f64)> {
    let (ad, bd) = formula_reference(m, n, k);
    let (a, b) = (
        Strided {
            data: &ad,
            rs: k,
            cs: 1,
        },
        Strided {
            data: &bd,
            rs: n,
            cs: 1,
        },
    );
    let c = Strided {
        data: &[],
        rs: 0,
        cs: 0,
    };
    reference(m, n, k, 1.0, a, b, 0.0, c, GEMM_TOL)
}

/// `f(i, p)` for `i < outer`, `p < k`, packed once over the whole k in `w`-wide panels (the
/// packed layout of both operands: panel `q`, step `p`, lane `x` at `(q·k + p)·w + x`, lanes
/// past `outer` zero); one value short when `short`.
fn whole_k_panels(
    outer: usize,
    k: usize,
    w: usize,
    short: bool,
    f: impl Fn(usize, usize) -> f32,
) -> Vec<f32> {
    let panels = outer.div_ceil(w);
    let mut data = vec![0.0; panels * k * w];
    for q in 0..panels {
        for p in 0..k {
            for x in 0..w {
                let i = q * w + x;
                if i < outer {
                    data[(q * k + p) * w + x] = f(i, p);
                }
            }
        }
    }
    if short {
        data.truncate(data.len().saturating_sub(1));
    }
    data
}

#[test]
fn virtual_sources_and_scatter_store() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for g in contexts() {
        for &(m, n, k) in &[
            (37, 53, 29),
            (130, 150, 120),
            (1, 1, 0),
            (9, 300, 1000),
            // Edge tiles of every height below MR (the edge kernels) through the tile buffer.
            (16, 40, 33),
            (5, 17, 64),
            (2, 33, 7),
        ] {
            for (concurrent, whole_k) in [(true, false), (false, false), (true, true)] {
                let mut store = TransposeAdd::new(m, n, concurrent, whole_k);
                let (a, b) = (FormulaA { m, k }, FormulaB { k, n });
                pool.install(|| g.gemm_with(&a, &b, &mut store)).unwrap();
                let expect = formula_expect(m, n, k);
                let out = store.out.into_inner().unwrap();
                let what = format!(
                    "{} virtual {m}x{n}x{k} conc={concurrent} whole_k={whole_k}",
                    g.kernel_name()
                );
                assert_close(
                    &what,
                    Strided {
                        data: &out,
                        rs: 1,
                        cs: m,
                    },
                    m,
                    n,
                    &expect,
                );
                // Every element sees exactly one first and one last pass.
                assert!(
                    store.firsts.into_inner().unwrap().iter().all(|&x| x == 1),
                    "{what}: first flags"
                );
                assert!(
                    store.lasts.into_inner().unwrap().iter().all(|&x| x == 1),
                    "{what}: last flags"
                );
            }
        }
    }
}

#[test]
fn bias_and_relu_epilogue() {
    for g in contexts() {
        for &(m, n, k) in &[(23, 41, 19), (70, 90, 300)] {
            let a = random(m * k, 5);
            let b = random(k * n, 6);
            let row_bias = random(m, 7);
            let col_bias = random(n, 8);
            for per_row in [true, false] {
                for relu in [false, true] {
                    let mut c = random(m * n, 9);
                    let c0 = c.clone();
                    let (alpha, beta) = (1.5, 0.5);
                    let cv = MatMut::row_major("c", &mut c, m, n, n).unwrap();
                    let bias = if per_row {
                        Bias::PerRow(&row_bias)
                    } else {
                        Bias::PerCol(&col_bias)
                    };
                    let mut store = DenseStore::new(cv, alpha, beta).with_bias(bias).unwrap();
                    if relu {
                        store = store.with_relu();
                    }
                    let av = MatRef::row_major("a", &a, m, k, k).unwrap();
                    let bv = MatRef::row_major("b", &b, k, n, n).unwrap();
                    g.gemm_with(&av, &bv, &mut store).unwrap();
                    let expect = reference(
                        m,
                        n,
                        k,
                        alpha,
                        Strided {
                            data: &a,
                            rs: k,
                            cs: 1,
                        },
                        Strided {
                            data: &b,
                            rs: n,
                            cs: 1,
                        },
                        beta,
                        Strided {
                            data: &c0,
                            rs: n,
                            cs: 1,
                        },
                        GEMM_TOL,
                    );
                    for i in 0..m {
                        for j in 0..n {
                            let (v, bound) = expect[i * n + j];
                            let mut v = v + if per_row { row_bias[i] } else { col_bias[j] } as f64;
                            if relu {
                                v = v.max(0.0);
                            }
                            let got = c[i * n + j] as f64;
                            assert!(
                                (got - v).abs() <= bound + 1e-6,
                                "{} bias C[{i},{j}] {got} vs {v}",
                                g.kernel_name()
                            );
                        }
                    }
                }
            }
        }
    }
    // A short bias is an error naming it.
    let mut c = vec![0.0; 6];
    let cv = MatMut::row_major("c", &mut c, 2, 3, 3).unwrap();
    let e = DenseStore::new(cv, 1.0, 0.0)
        .with_bias(Bias::PerCol(&[1.0, 2.0]))
        .unwrap_err();
    assert!(matches!(
        e,
        core_blas::Error::SliceTooShort { arg: "bias", .. }
    ));
}

#[test]
fn generic_batched_products() {
    for g in contexts() {
        let (m, n, k, batch) = (33, 47, 21, 5);
        let a: Vec<Vec<f32>> = (0..batch).map(|p| random(m * k, 40 + p as u64)).collect();
        let b: Vec<Vec<f32>> = (0..batch).map(|p| random(k * n, 50 + p as u64)).collect();
        let mut c: Vec<Vec<f32>> = (0..batch).map(|_| vec![f32::NAN; m * n]).collect();
        let av: Vec<MatRef<'_>> = a
            .iter()
            .map(|x| MatRef::row_major("a", x, m, k, k).unwrap())
            .collect();
        let bv: Vec<MatRef<'_>> = b
            .iter()
            .map(|x| MatRef::row_major("b", x, k, n, n).unwrap())
            .collect();
        let mut stores: Vec<DenseStore<'_>> = c
            .iter_mut()
            .map(|x| DenseStore::new(MatMut::row_major("c", x, m, n, n).unwrap(), 1.0, 0.0))
            .collect();
        g.gemm_batched_with(&av, &bv, &mut stores).unwrap();
        drop(stores);
        for p in 0..batch {
            let expect = reference(
                m,
                n,
                k,
                1.0,
                Strided {
                    data: &a[p],
                    rs: k,
                    cs: 1,
                },
                Strided {
                    data: &b[p],
                    rs: n,
                    cs: 1,
                },
                0.0,
                Strided {
                    data: &[],
                    rs: 0,
                    cs: 0,
                },
                GEMM_TOL,
            );
            assert_close(
                &format!("{} generic batch {p}", g.kernel_name()),
                Strided {
                    data: &c[p],
                    rs: n,
                    cs: 1,
                },
                m,
                n,
                &expect,
            );
        }
        // Mismatched batch lengths are an error.
        let mut one: Vec<DenseStore<'_>> = Vec::new();
        assert!(g.gemm_batched_with(&av, &bv[..1], &mut one).is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random shapes, transposes, leading dimensions, alpha/beta and families against the naive
    /// reference.
    #[test]
    fn sgemm_matches_naive(
        m in 0usize..70, n in 0usize..70, k in 0usize..90,
        ta in any::<bool>(), tb in any::<bool>(),
        pad in (0usize..4, 0usize..4, 0usize..4),
        alpha in prop::sample::select(vec![1.0f32, -1.0, 0.5, 0.0, 3.0]),
        beta in prop::sample::select(vec![0.0f32, 1.0, -0.5, 2.0]),
        family in 0usize..8,
        seed in 0u64..1000,
    ) {
        let ctx = contexts();
        let g = ctx[family % ctx.len()];
        let lda = if ta { m } else { k }.max(1) + pad.0;
        let ldb = if tb { k } else { n }.max(1) + pad.1;
        let ldc = n.max(1) + pad.2;
        let a = random(lda * if ta { k } else { m }, seed);
        let b = random(ldb * if tb { n } else { k }, seed + 1);
        let mut c = if beta == 0.0 { vec![f32::NAN; ldc * m] } else { random(ldc * m, seed + 2) };
        let c0 = c.clone();
        let av = if ta { Strided { data: &a, rs: 1, cs: lda } } else { Strided { data: &a, rs: lda, cs: 1 } };
        let bv = if tb { Strided { data: &b, rs: 1, cs: ldb } } else { Strided { data: &b, rs: ldb, cs: 1 } };
        let expect = reference(m, n, k, alpha, av, bv, beta, Strided { data: &c0, rs: ldc, cs: 1 }, GEMM_TOL);
        g.sgemm(ta, tb, m, n, k, alpha, &a, lda, &b, ldb, beta, &mut c, ldc).unwrap();
        for i in 0..m {
            for j in 0..n {
                let (v, bound) = expect[i * n + j];
                let got = c[i * ldc + j] as f64;
                prop_assert!((got - v).abs() <= bound, "{} C[{},{}] = {} vs {} ± {}", g.kernel_name(), i, j, got, v, bound);
            }
        }
    }
}

/// A = FormulaA kept packed once over the whole k in `mr`-tall panels (fastconv's layout), handed
/// to the driver in place through `packed_a`. `short` truncates the data so the driver must fall
/// back to `pack_a`; `pack_calls` counts the fallbacks.
struct PrePackedA {
    m: usize,
    k: usize,
    mr: usize,
    data: Vec<f32>,
    short: bool,
    pack_calls: std::sync::atomic::AtomicUsize,
}

impl PrePackedA {
    fn new(m: usize, k: usize, mr: usize, short: bool) -> Self {
        Self {
            m,
            k,
            mr,
            data: whole_k_panels(m, k, mr, short, fa),
            short,
            pack_calls: Default::default(),
        }
    }
}

impl PackA for PrePackedA {
    fn rows(&self) -> usize {
        self.m
    }
    fn cols(&self) -> usize {
        self.k
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        self.pack_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        FormulaA {
            m: self.m,
            k: self.k,
        }
        .pack_a(ic, mc, pc, kc, mr, dst)
    }
    fn packed_a(
        &self,
        ic: usize,
        _mc: usize,
        pc: usize,
        _kc: usize,
        mr: usize,
    ) -> Option<(&[f32], usize)> {
        (mr == self.mr && ic.is_multiple_of(mr))
            .then(|| (&self.data[(ic / mr * self.k + pc) * mr..], self.k * mr))
    }
}

#[test]
fn prepacked_a_is_read_in_place() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for g in contexts() {
        let (mr, _) = g.tile();
        for &(m, n, k) in &[(37, 53, 29), (130, 150, 120), (1, 1, 1), (9, 300, 1000)] {
            // (packing mr, truncated data): in place, wrong panel height, too short.
            for (pmr, short) in [(mr, false), (mr + 1, false), (mr, true)] {
                let a = PrePackedA::new(m, k, pmr, short);
                let mut c = vec![f32::NAN; m * n];
                let mut store =
                    DenseStore::new(MatMut::row_major("c", &mut c, m, n, n).unwrap(), 1.0, 0.0);
                pool.install(|| g.gemm_with(&a, &FormulaB { k, n }, &mut store))
                    .unwrap();
                let expect = formula_expect(m, n, k);
                let what = format!(
                    "{} prepacked {m}x{n}x{k} mr={pmr} short={short}",
                    g.kernel_name()
                );
                assert_close(
                    &what,
                    Strided {
                        data: &c,
                        rs: n,
                        cs: 1,
                    },
                    m,
                    n,
                    &expect,
                );
                let packs = a.pack_calls.load(std::sync::atomic::Ordering::Relaxed);
                if pmr == mr && !a.short {
                    assert_eq!(packs, 0, "{what}: the packed panels were copied");
                } else {
                    assert!(packs > 0, "{what}: unusable panels were read in place");
                }
            }
        }
    }
}

/// B held in `nr`-wide panels over the whole k (the layout of `Gemm::packed_b_index`), handed to
/// the driver in place when its panel width is the kernel's; counts the blocks it had to pack.
struct PrePackedB {
    k: usize,
    n: usize,
    nr: usize,
    data: Vec<f32>,
    short: bool,
    pack_calls: std::sync::atomic::AtomicUsize,
}

impl PrePackedB {
    fn new(k: usize, n: usize, nr: usize, short: bool) -> Self {
        Self {
            k,
            n,
            nr,
            data: whole_k_panels(n, k, nr, short, |j, p| fb(p, j)),
            short,
            pack_calls: Default::default(),
        }
    }
}

impl PackB for PrePackedB {
    fn rows(&self) -> usize {
        self.k
    }
    fn cols(&self) -> usize {
        self.n
    }
    fn pack_b(&self, pc: usize, kc: usize, jc: usize, nc: usize, nr: usize, dst: &mut [f32]) {
        self.pack_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        FormulaB {
            k: self.k,
            n: self.n,
        }
        .pack_b(pc, kc, jc, nc, nr, dst)
    }
    fn packed_b(
        &self,
        pc: usize,
        _kc: usize,
        jc: usize,
        _nc: usize,
        nr: usize,
    ) -> Option<(&[f32], usize)> {
        (nr == self.nr && jc.is_multiple_of(nr))
            .then(|| (&self.data[(jc / nr * self.k + pc) * nr..], self.k * nr))
    }
}

#[test]
fn prepacked_b_is_read_in_place() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for g in contexts() {
        let (_, nr) = g.tile();
        for &(m, n, k) in &[(37, 53, 29), (130, 150, 120), (1, 1, 1), (300, 97, 1000)] {
            // (packing nr, truncated data): in place, wrong panel width, too short.
            for (pnr, short) in [(nr, false), (nr + 1, false), (nr, true)] {
                // Through the dense store and through a scatter store (tile buffer).
                for scatter in [false, true] {
                    let b = PrePackedB::new(k, n, pnr, short);
                    let a = FormulaA { m, k };
                    let (out, rs, cs) = if scatter {
                        let mut store = TransposeAdd::new(m, n, true, false);
                        pool.install(|| g.gemm_with(&a, &b, &mut store)).unwrap();
                        (store.out.into_inner().unwrap(), 1, m)
                    } else {
                        let mut c = vec![f32::NAN; m * n];
                        let mut store = DenseStore::new(
                            MatMut::row_major("c", &mut c, m, n, n).unwrap(),
                            1.0,
                            0.0,
                        );
                        pool.install(|| g.gemm_with(&a, &b, &mut store)).unwrap();
                        (c, n, 1)
                    };
                    let expect = formula_expect(m, n, k);
                    let what = format!(
                        "{} prepacked B {m}x{n}x{k} nr={pnr} short={short} scatter={scatter}",
                        g.kernel_name()
                    );
                    assert_close(&what, Strided { data: &out, rs, cs }, m, n, &expect);
                    let packs = b.pack_calls.load(std::sync::atomic::Ordering::Relaxed);
                    if pnr == nr && !b.short {
                        assert_eq!(packs, 0, "{what}: the packed panels were copied");
                    } else {
                        assert!(packs > 0, "{what}: unusable panels were read in place");
                    }
                }
            }
        }
    }
}

/// C (m × batch·plane) stored channel-major: element (i, j) at `((j / plane) · m + i) · plane +
/// j % plane` (a convolution's N×C×H×W output), with alpha, beta, a per-row bias and ReLU. Tiles
/// inside one plane are dense blocks (row stride `plane`) and go through `window`; tiles that
/// cross a plane boundary go through `store_tile`, which counts them.
struct ChannelMajor {
    ptr: *mut f32,
    m: usize,
    plane: usize,
    batch: usize,
    alpha: f32,
    beta: f32,
    bias: Vec<f32>,
    windows: bool,
    slow_tiles: std::sync::atomic::AtomicUsize,
}

// SAFETY: distinct tiles map to distinct elements (the map is injective), the driver delivers
// each tile of a pass once, and the buffer is borrowed mutably by the test for the product.
unsafe impl Sync for ChannelMajor {}
// SAFETY: the raw pointer is only a view of the test's buffer, which outlives the store.
unsafe impl Send for ChannelMajor {}

impl Store for ChannelMajor {
    fn rows(&self) -> usize {
        self.m
    }
    fn cols(&self) -> usize {
        self.batch * self.plane
    }
    fn store_tile(&self, t: &Tile<'_>) {
        self.slow_tiles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for r in 0..t.rows() {
            for c in 0..t.cols() {
                let (i, j) = (t.i() + r, t.j() + c);
                let off = ((j / self.plane) * self.m + i) * self.plane + j % self.plane;
                // SAFETY: inside the buffer (i < m, j < batch·plane), this tile's alone.
                let d = unsafe { &mut *self.ptr.add(off) };
                let prev = if !t.first() {
                    *d
                } else if self.beta == 0.0 {
                    0.0
                } else {
                    self.beta * *d
                };
                let mut x = prev + self.alpha * t.get(r, c);
                if t.last() {
                    x = (x + self.bias[i]).max(0.0);
                }
                *d = x;
            }
        }
    }
    fn window(&self, i: usize, j: usize, _rows: usize, cols: usize) -> Option<Window<'_>> {
        if !self.windows || j % self.plane + cols > self.plane {
            return None;
        }
        let off = ((j / self.plane) * self.m + i) * self.plane + j % self.plane;
        // SAFETY: rows i.., columns j..j+cols of one plane: `off + r·plane + c` stays inside the
        // buffer and belongs to this tile only (injective map, one delivery per tile and pass).
        let w = unsafe { Window::new(self.ptr.add(off), self.plane, self.alpha, self.beta) };
        Some(w.with_row_bias(&self.bias[i..]).with_relu())
    }
}

#[test]
fn window_store_matches_tile_store() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for g in contexts() {
        for &(m, plane, batch, k) in &[
            (37, 49, 3, 29),
            (64, 196, 2, 300),
            (5, 16, 4, 1),
            (5, 32, 3, 2),
        ] {
            let n = plane * batch;
            for (alpha, beta) in [(1.0, 0.0), (0.5, -2.0)] {
                let c0 = random(m * n, 77);
                let bias = random(m, 78);
                let mut outs = Vec::new();
                for windows in [false, true] {
                    // NaN where beta = 0 must not leak in.
                    let mut buf = if beta == 0.0 {
                        vec![f32::NAN; m * n]
                    } else {
                        c0.clone()
                    };
                    let mut st = ChannelMajor {
                        ptr: buf.as_mut_ptr(),
                        m,
                        plane,
                        batch,
                        alpha,
                        beta,
                        bias: bias.clone(),
                        windows,
                        slow_tiles: Default::default(),
                    };
                    pool.install(|| g.gemm_with(&FormulaA { m, k }, &FormulaB { k, n }, &mut st))
                        .unwrap();
                    let slow = st.slow_tiles.load(std::sync::atomic::Ordering::Relaxed);
                    outs.push((buf, slow));
                }
                let what = format!(
                    "{} channel-major {m}x{n}x{k} ab=({alpha},{beta})",
                    g.kernel_name()
                );
                // The window path must actually be taken (fewer tiles through store_tile)
                // whenever some micro-tile lies inside one plane (tiles start at multiples of NR).
                let nr = g.tile().1;
                let fits = (0..n)
                    .step_by(nr)
                    .any(|j| j % plane + nr.min(n - j) <= plane);
                if fits {
                    assert!(outs[1].1 < outs[0].1, "{what}: windows unused");
                } else {
                    assert_eq!(outs[1].1, outs[0].1, "{what}: a window across planes");
                }
                // Both against the reference in (i, j) order.
                let (ad, bd) = formula_reference(m, n, k);
                let cm: Vec<f32> = (0..m * n)
                    .map(|x| {
                        let (i, j) = (x / n, x % n);
                        c0[((j / plane) * m + i) * plane + j % plane]
                    })
                    .collect();
                let expect: Vec<(f64, f64)> = reference(
                    m,
                    n,
                    k,
                    alpha,
                    Strided {
                        data: &ad,
                        rs: k,
                        cs: 1,
                    },
                    Strided {
                        data: &bd,
                        rs: n,
                        cs: 1,
                    },
                    beta,
                    Strided {
                        data: &cm,
                        rs: n,
                        cs: 1,
                    },
                    GEMM_TOL,
                )
                .into_iter()
                .enumerate()
                .map(|(x, (v, b))| ((v + bias[x / n] as f64).max(0.0), b + 1e-6))
                .collect();
                for (buf, _) in &outs {
                    let rowmajor: Vec<f32> = (0..m * n)
                        .map(|x| {
                            let (i, j) = (x / n, x % n);
                            buf[((j / plane) * m + i) * plane + j % plane]
                        })
                        .collect();
                    assert_close(
                        &what,
                        Strided {
                            data: &rowmajor,
                            rs: n,
                            cs: 1,
                        },
                        m,
                        n,
                        &expect,
                    );
                }
            }
        }
    }
}

#[test]
fn prefetch_hint_never_faults() {
    let v = vec![1.0f32; 100];
    // In bounds, at the end, past the end, on an empty slice: a hint, never a panic or a fault.
    for idx in [0, 50, 99, 100, usize::MAX] {
        core_blas::pack::prefetch_l2(&v, idx);
        core_blas::pack::prefetch_l2(&[], idx);
    }
    assert_eq!(v.iter().sum::<f32>(), 100.0);
}
