//! Tuning probe (not a benchmark): how much of a GEMM is packing? Times `gemm_with` on M N K with
//! dense sources and with sources whose packing does nothing (the buffers keep whatever they held),
//! alternating, on the CPU clock of the calling thread (1 thread), as % of the FMA peak measured
//! right after each product.
use std::time::Duration;

use core_blas::{DenseStore, MatMut, MatRef, PackA, PackB};

struct NoPackA(usize, usize);
impl PackA for NoPackA {
    fn rows(&self) -> usize {
        self.0
    }
    fn cols(&self) -> usize {
        self.1
    }
    fn pack_a(&self, _: usize, _: usize, _: usize, _: usize, _: usize, _: &mut [f32]) {}
}
struct NoPackB(usize, usize);
impl PackB for NoPackB {
    fn rows(&self) -> usize {
        self.0
    }
    fn cols(&self) -> usize {
        self.1
    }
    fn pack_b(&self, _: usize, _: usize, _: usize, _: usize, _: usize, _: &mut [f32]) {}
}

/// CPU time of the calling thread in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`, exact: reading
/// `/proc/thread-self/schedstat` instead lags by up to a scheduler tick, several ms); NaN where
/// the platform has no thread CPU clock (use the wall-clock figures).
fn cpu_ns() -> f64 {
    cpu_time::ThreadTime::try_now().map_or(f64::NAN, |t| t.as_duration().as_nanos() as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (m, n, k) = match args.as_slice() {
        [m, n, k, ..] => (*m, *n, *k),
        _ => (2048, 2048, 2048),
    };
    let reps = args.get(3).copied().unwrap_or(7);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let g = core_blas::Gemm::global()?;
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 * 0.1).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 * 0.1).collect();
    let mut c = vec![0.0f32; m * n];
    let flops = 2.0 * (m * n * k) as f64;
    let mut res: [Vec<f64>; 4] = Default::default();
    pool.install(|| -> Result<(), core_blas::Error> {
        for _ in 0..reps {
            for (v, out) in res.iter_mut().enumerate() {
                let av = MatRef::row_major("a", &a, m, k, k)?;
                let bv = MatRef::row_major("b", &b, k, n, n)?;
                let mut st = DenseStore::new(MatMut::row_major("c", &mut c, m, n, n)?, 1.0, 0.0);
                let t = cpu_ns();
                match v {
                    0 => g.gemm_with(&av, &bv, &mut st)?,
                    1 => g.gemm_with(&NoPackA(m, k), &bv, &mut st)?,
                    2 => g.gemm_with(&av, &NoPackB(k, n), &mut st)?,
                    _ => g.gemm_with(&NoPackA(m, k), &NoPackB(k, n), &mut st)?,
                }
                let s = (cpu_ns() - t) * 1e-9;
                let p = core_blas::peak::fma_peak_gflops(g.isa(), 1, Duration::from_millis(30))?;
                out.push(flops / s / 1e9 / p);
            }
        }
        Ok(())
    })?;
    for (name, mut v) in ["dense", "no-pack-A", "no-pack-B", "no-pack"]
        .into_iter()
        .zip(res)
    {
        v.sort_by(f64::total_cmp);
        println!(
            "{m}x{n}x{k} {name}: {:.1}% of peak (median), min {:.1} max {:.1}",
            100.0 * v[v.len() / 2],
            100.0 * v[0],
            100.0 * v[v.len() - 1]
        );
    }
    Ok(())
}
