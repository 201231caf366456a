//! core-blas SGEMM against matrixmultiply, with the FMA peak measured in the same run.
//!
//! Cases: square 64 to 2048 (4096 too unless `--quick`) and the convolution shapes as im2col
//! GEMMs (ResNet-50, VGG and C3D 3×3 layers) and the small-m products of CIFAR-sized CNNs
//! (ResNet-20, LeNet-5), on 1 and 2 threads (rayon pools built here); and,
//! on 1 thread, one convolution shape stored into a dense C against a channel-major C (conv-ops'
//! output layout) through the generic tile store and through `Store::window`; and, on 1 thread,
//! fastconv's batch-1 Winograd batch (81 products of 32 × 32 · 32 × 80) through
//! `gemm_packed_batched` (operands pre-packed) against `sgemm_batched`. Criterion's throughput
//! is declared in FLOPs (`Throughput::Elements(2·m·n·k)`, group names end in `@flop`), so its
//! "elem/s" read as FLOP/s. The bench also measures the FMA peak of the active kernel family on 1
//! and 2 threads and prints, per case, a summary line with its own median GFLOP/s and % of that
//! peak (also appended as records for `cargo xtask bench`).
//!
//! `GEMM_BIND=1`: the 1- and 2-thread pools' workers are bound to CPUs
//! ([`core_blas::bind_workers`]), to compare bound and unbound pools' records.
//!
//! matrixmultiply decides its thread count once per process from `MATMUL_NUM_THREADS`, so it is
//! measured only in the group whose thread count equals that variable (default 1 here: run the
//! bench twice, with `MATMUL_NUM_THREADS=1` and `=2`, to get both reference rows).

use std::hint::black_box;
use std::time::{Duration, Instant};

use benches::{emit_record, env_flag, flop_group, thread_pools_bound};
use core_blas::{DenseStore, MatMut, MatRef, Store, Tile, Window};
use criterion::{BenchmarkId, Criterion, Throughput};

/// C (m × batch·plane) written channel-major, element (i, j) at `((j / plane)·m + i)·plane +
/// j % plane` (beta = 0), like conv-ops' channel-major store: through `store_tile` only, or with
/// [`Store::window`] for the tiles inside one plane.
struct ChannelMajor {
    ptr: *mut f32,
    m: usize,
    plane: usize,
    batch: usize,
    windows: bool,
}

// SAFETY: distinct tiles map to distinct elements (injective map) and the driver delivers each
// tile of a pass once; the buffer is borrowed mutably for the product by the caller.
unsafe impl Sync for ChannelMajor {}
// SAFETY: only a view of a buffer that outlives the store.
unsafe impl Send for ChannelMajor {}

impl Store for ChannelMajor {
    fn rows(&self) -> usize {
        self.m
    }
    fn cols(&self) -> usize {
        self.batch * self.plane
    }
    fn store_tile(&self, t: &Tile<'_>) {
        for r in 0..t.rows() {
            let src = t.row(r);
            let mut c = 0;
            while c < t.cols() {
                let j = t.j() + c;
                let len = (t.cols() - c).min(self.plane - j % self.plane);
                let off = ((j / self.plane) * self.m + t.i() + r) * self.plane + j % self.plane;
                for (x, &v) in src[c..c + len].iter().enumerate() {
                    // SAFETY: inside the m·batch·plane buffer, this tile's alone (see Sync).
                    unsafe {
                        let d = self.ptr.add(off + x);
                        *d = if t.first() { v } else { *d + v };
                    }
                }
                c += len;
            }
        }
    }
    fn window(&self, i: usize, j: usize, _rows: usize, cols: usize) -> Option<Window<'_>> {
        if !self.windows || j % self.plane + cols > self.plane {
            return None;
        }
        let off = ((j / self.plane) * self.m + i) * self.plane + j % self.plane;
        // SAFETY: rows i.. and columns j..j+cols of one plane lie inside the buffer and belong to
        // this tile only (injective map).
        Some(unsafe { Window::new(self.ptr.add(off), self.plane, 1.0, 0.0) })
    }
}

/// `(name, m, n, k)`.
type Shape = (&'static str, usize, usize, usize);

/// The convolution shapes as im2col GEMMs (m = filters, n = batch·output pixels, k = channels ·
/// kernel volume): ResNet-50 3×3 layers at batch 8 (64@56², 128@28², 256@14², 512@7²), VGG's
/// 64@224² at batch 1, C3D's 3×3×3 64@8×56² at batch 1, and the 256×3136×2304 and
/// 512×784×4608.
const CONV_SHAPES: [Shape; 7] = [
    ("conv-64x50176x576", 64, 50176, 576),
    ("conv-64x25088x1728", 64, 25088, 1728),
    ("conv-128x6272x1152", 128, 6272, 1152),
    ("conv-256x1568x2304", 256, 1568, 2304),
    ("conv-512x392x4608", 512, 392, 4608),
    ("conv-256x3136x2304", 256, 3136, 2304),
    ("conv-512x784x4608", 512, 784, 4608),
];

/// The small products of CIFAR-sized CNNs (few output channels): ResNet-20's 3×3 layers
/// 16@32² at batch 8, 32@16² at batch 32 and 64@8² at batch 128, LeNet-5's 5×5 convolutions
/// 1→6 @28² and 6→16 @10² at batch 32.
const SMALL_SHAPES: [Shape; 5] = [
    ("small-16x8192x144", 16, 8192, 144),
    ("small-32x8192x288", 32, 8192, 288),
    ("small-64x8192x576", 64, 8192, 576),
    ("small-6x25088x25", 6, 25088, 25),
    ("small-16x3200x150", 16, 3200, 150),
];

/// The store comparison: ResNet-50 128@28² at batch 8 written channel-major (N×C×H×W), as
/// conv-ops' forward does: `(name, m, batch, plane, k)`.
const STORE_SHAPE: (&str, usize, usize, usize, usize) = ("128x6272x1152", 128, 8, 784, 1152);

/// The batched comparison: fastconv's F(6,4) Winograd products at batch 1, `(name, m, n, k, count)`.
const PACKED_SHAPE: (&str, usize, usize, usize, usize) = ("81x32x80x32", 32, 80, 32, 81);

/// The criterion filter (first positional argument), applied to the summary timings too.
fn filter() -> Option<String> {
    std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-') && a != "gemm")
}

fn quick() -> bool {
    std::env::args().any(|a| a == "--quick")
}

fn shapes() -> Vec<Shape> {
    let mut out: Vec<Shape> = vec![
        ("sq-64", 64, 64, 64),
        ("sq-128", 128, 128, 128),
        ("sq-256", 256, 256, 256),
        ("sq-512", 512, 512, 512),
        ("sq-1024", 1024, 1024, 1024),
        ("sq-2048", 2048, 2048, 2048),
    ];
    if !quick() {
        out.push(("sq-4096", 4096, 4096, 4096));
    }
    out.extend(CONV_SHAPES);
    out.extend(SMALL_SHAPES);
    out
}

fn data(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + seed) % 17) as f32 * 0.0625 - 0.5)
        .collect()
}

fn ours(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    core_blas::sgemm(false, false, m, n, k, 1.0, a, k, b, n, 0.0, c, n).expect("valid sgemm");
}

fn reference(m: usize, n: usize, k: usize, a: &[f32], b: &[f32], c: &mut [f32]) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: the asserted lengths cover the row-major m×k, k×n and m×n matrices.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

/// Median seconds of `f` over enough repetitions for about `budget`.
fn median_secs(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    f();
    let one = t.elapsed().as_secs_f64().max(1e-7);
    let reps = ((budget.as_secs_f64() / one) as usize).clamp(3, 101);
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn record(case: &str, metric: &str, value: f64, unit: &str) {
    if let Err(e) = emit_record("gemm", case, metric, value, unit) {
        eprintln!("gemm bench: record {case} {metric}: {e}");
    }
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    let kernel = core_blas::isa().expect("CORE_BLAS_ISA names an available family");
    let isa = core_blas::Gemm::global().expect("global context").isa();
    let mm_threads: usize = std::env::var("MATMUL_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let quick = quick();
    let peak_time = Duration::from_millis(if quick { 300 } else { 1000 });
    let summary_budget = Duration::from_millis(if quick { 300 } else { 1500 });
    let mut summary = Vec::new();

    for (threads, pool) in thread_pools_bound(env_flag("GEMM_BIND")) {
        let peak = core_blas::peak::fma_peak_gflops(isa, threads, peak_time).expect("peak");
        record(&format!("fma-peak-t{threads}"), "gflops", peak, "GFLOP/s");
        let mut group = criterion.benchmark_group(flop_group(&format!("gemm-t{threads}")));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(200));
        for (name, m, n, k) in shapes() {
            let flops = 2.0 * (m * n * k) as f64;
            group.throughput(Throughput::Elements(flops as u64));
            group.measurement_time(Duration::from_secs_f64(
                (flops / 5e10 * 10.0).clamp(if quick { 0.5 } else { 2.0 }, 30.0),
            ));
            let id = format!("gemm-t{threads}@flop/{kernel}/{name}");
            if filter().is_some_and(|f| !id.contains(&f)) {
                continue;
            }
            let a = data(m * k, 1);
            let b = data(k * n, 2);
            let mut c = vec![0.0f32; m * n];
            group.bench_function(BenchmarkId::new(kernel, name), |bch| {
                pool.install(|| bch.iter(|| ours(m, n, k, black_box(&a), black_box(&b), &mut c)))
            });
            let with_mm = threads == mm_threads;
            if with_mm {
                group.bench_function(BenchmarkId::new("matrixmultiply", name), |bch| {
                    bch.iter(|| reference(m, n, k, black_box(&a), black_box(&b), &mut c))
                });
            }
            // Our own medians, side by side, for the % of peak table.
            let ours_gf = flops
                / pool.install(|| median_secs(summary_budget, || ours(m, n, k, &a, &b, &mut c)))
                / 1e9;
            let mm_gf = with_mm.then(|| {
                flops / median_secs(summary_budget, || reference(m, n, k, &a, &b, &mut c)) / 1e9
            });
            record(&format!("{name}-t{threads}"), "gflops", ours_gf, "GFLOP/s");
            record(
                &format!("{name}-t{threads}"),
                "pct_of_peak",
                100.0 * ours_gf / peak,
                "%",
            );
            if let Some(mm) = mm_gf {
                record(
                    &format!("{name}-t{threads}-matrixmultiply"),
                    "gflops",
                    mm,
                    "GFLOP/s",
                );
            }
            summary.push((name.to_string(), threads, ours_gf, mm_gf, peak));
        }
        group.finish();
    }

    // The store comparison, 1 thread: the same product into a dense C and into a channel-major
    // C through `store_tile` or `Store::window`.
    {
        let (name, m, batch, plane, k) = STORE_SHAPE;
        let n = batch * plane;
        let flops = 2.0 * (m * n * k) as f64;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        let peak = core_blas::peak::fma_peak_gflops(isa, 1, peak_time).expect("peak");
        let a = data(m * k, 1);
        let b = data(k * n, 2);
        let mut c = vec![0.0f32; m * n];
        let mut group = criterion.benchmark_group(flop_group("gemm-store-t1"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(200))
            .throughput(Throughput::Elements(flops as u64))
            .measurement_time(Duration::from_secs_f64(if quick { 0.5 } else { 2.0 }));
        let av = MatRef::row_major("a", &a, m, k, k).expect("a");
        let bv = MatRef::row_major("b", &b, k, n, n).expect("b");
        for variant in ["dense", "tiles", "window"] {
            let id = format!("gemm-store-t1@flop/{variant}/{name}");
            if filter().is_some_and(|f| !id.contains(&f)) {
                continue;
            }
            let run = |c: &mut [f32]| {
                if variant == "dense" {
                    let cv = MatMut::row_major("c", c, m, n, n).expect("c");
                    core_blas::gemm_with(&av, &bv, &mut DenseStore::new(cv, 1.0, 0.0))
                } else {
                    let mut st = ChannelMajor {
                        ptr: c.as_mut_ptr(),
                        m,
                        plane,
                        batch,
                        windows: variant == "window",
                    };
                    core_blas::gemm_with(&av, &bv, &mut st)
                }
                .expect("gemm_with")
            };
            group.bench_function(BenchmarkId::new(variant, name), |bch| {
                pool.install(|| bch.iter(|| run(&mut c)))
            });
            let gf = flops / pool.install(|| median_secs(summary_budget, || run(&mut c))) / 1e9;
            let case = format!("store-{variant}-{name}-t1");
            record(&case, "gflops", gf, "GFLOP/s");
            record(&case, "pct_of_peak", 100.0 * gf / peak, "%");
            summary.push((format!("store-{variant} {name}"), 1, gf, None, peak));
        }
        group.finish();
    }

    // fastconv's batch-1 Winograd products (F(6,4): 81 products of 32 × 32 · 32 × 80), 1 thread:
    // `gemm_packed_batched` on operands already in panel layout against `sgemm_batched` on
    // row-major operands (the driver packs them).
    {
        let (name, m, n, k, count) = PACKED_SHAPE;
        let g = core_blas::Gemm::global().expect("global context");
        let flops = 2.0 * (m * n * k * count) as f64;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .expect("pool");
        let peak = core_blas::peak::fma_peak_gflops(isa, 1, peak_time).expect("peak");
        let a = data(count * m * k, 1);
        let b = data(count * k * n, 2);
        let (al, bl) = (g.packed_a_len(m, k), g.packed_b_len(k, n));
        let mut ap = vec![0.0f32; count * al];
        let mut bp = vec![0.0f32; count * bl];
        for p in 0..count {
            for i in 0..m {
                for t in 0..k {
                    ap[p * al + g.packed_a_index(k, i, t)] = a[p * m * k + i * k + t];
                }
            }
            for t in 0..k {
                for j in 0..n {
                    bp[p * bl + g.packed_b_index(k, t, j)] = b[p * k * n + t * n + j];
                }
            }
        }
        let mut c = vec![0.0f32; count * m * n];
        let mut group = criterion.benchmark_group(flop_group("gemm-batched-t1"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(200))
            .throughput(Throughput::Elements(flops as u64))
            .measurement_time(Duration::from_secs_f64(if quick { 0.5 } else { 2.0 }));
        for variant in ["packed", "sgemm_batched"] {
            let id = format!("gemm-batched-t1@flop/{variant}/{name}");
            if filter().is_some_and(|f| !id.contains(&f)) {
                continue;
            }
            let run = |c: &mut [f32]| {
                if variant == "packed" {
                    g.gemm_packed_batched(m, n, k, &ap, al, &bp, bl, 0.0, c, n, m * n, count)
                } else {
                    g.sgemm_batched(
                        false,
                        false,
                        m,
                        n,
                        k,
                        1.0,
                        &a,
                        k,
                        m * k,
                        &b,
                        n,
                        k * n,
                        0.0,
                        c,
                        n,
                        m * n,
                        count,
                    )
                }
                .expect("batched gemm")
            };
            group.bench_function(BenchmarkId::new(variant, name), |bch| {
                pool.install(|| bch.iter(|| run(&mut c)))
            });
            let gf = flops / pool.install(|| median_secs(summary_budget, || run(&mut c))) / 1e9;
            let case = format!("batched-{variant}-{name}-t1");
            record(&case, "gflops", gf, "GFLOP/s");
            record(&case, "pct_of_peak", 100.0 * gf / peak, "%");
            summary.push((format!("batched-{variant} {name}"), 1, gf, None, peak));
        }
        group.finish();
    }

    println!("\ncore-blas {kernel}; load: {}", uptime());
    println!(
        "| shape | threads | core-blas GFLOP/s | % of FMA peak | matrixmultiply GFLOP/s | % of peak | FMA peak |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (name, threads, ours_gf, mm_gf, peak) in summary {
        let (mm, mm_pct) = match mm_gf {
            Some(v) => (format!("{v:.1}"), format!("{:.0}%", 100.0 * v / peak)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "| {name} | {threads} | {ours_gf:.1} | {:.0}% | {mm} | {mm_pct} | {peak:.1} |",
            100.0 * ours_gf / peak
        );
    }
    criterion.final_summary();
}

/// The load average, to judge how noisy the run was.
fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
