//! Tuning probe (not a benchmark): does C's row stride matter? Alternates the same product with
//! `ldc = n` and `ldc = n + PAD` (default 16) every repetition, 1 thread, on the thread CPU clock,
//! each as % of the FMA peak measured right after it:
//! `cargo run --release -p core-blas --example gemm_ldc -- M N K REPS [PAD]`.
use std::time::Duration;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let [m, n, k, reps, ..] = args[..] else {
        return Err("usage: gemm_ldc M N K REPS [PAD]".into());
    };
    let pad = args.get(4).copied().unwrap_or(16);
    let g = core_blas::Gemm::global()?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
        .collect();
    let lds = [n, n + pad];
    let mut cs: Vec<Vec<f32>> = lds.iter().map(|&ld| vec![0.0f32; m * ld]).collect();
    let flops = 2.0 * (m * n * k) as f64;
    let mut ratio = vec![vec![]; lds.len()];
    for r in 0..=reps {
        for (vi, &ldc) in lds.iter().enumerate() {
            let c = &mut cs[vi];
            let secs = pool.install(|| {
                let t = cpu_time::ThreadTime::now();
                g.sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, c, ldc)?;
                Ok::<_, core_blas::Error>(t.elapsed().as_secs_f64())
            })?;
            let peak = core_blas::peak::fma_peak_gflops(g.isa(), 1, Duration::from_millis(30))?;
            if r > 0 {
                ratio[vi].push(flops / secs / 1e9 / peak);
            }
        }
    }
    for (vi, ldc) in lds.iter().enumerate() {
        println!(
            "{m}x{n}x{k} ldc={ldc}: {:.1}% of peak (median of {reps})",
            100.0 * median(ratio[vi].clone())
        );
    }
    Ok(())
}
