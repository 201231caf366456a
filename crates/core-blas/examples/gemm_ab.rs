//! Tuning probe (not a benchmark): in-process A/B of block sizes on one product, alternating the
//! variants every repetition so that the VM's minute-to-minute drift hits them all alike:
//! `AB="MC=252;KC=576,NC=256;" cargo run --release -p core-blas --example gemm_ab -- M N K REPS [THREADS]`.
//!
//! `AB` lists variants separated by `;`, each a comma-separated list of `MC=`, `KC=`, `NC=`
//! overrides of the process-wide block sizes (an empty variant is the default). Each product is
//! timed on the calling thread's CPU clock (1 thread) or the wall clock (more), and divided by
//! the FMA peak measured right after it; the median over repetitions is printed per variant.

use std::time::{Duration, Instant};

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
        return Err("usage: gemm_ab M N K REPS [THREADS] (variants in AB)".into());
    };
    let threads = args.get(4).copied().unwrap_or(1);
    let ab = std::env::var("AB").unwrap_or_default();
    let g = core_blas::Gemm::global()?;
    let mut variants = vec![];
    for v in ab.split(';') {
        let mut bs = g.block_sizes();
        for kv in v.split(',').filter(|s| !s.trim().is_empty()) {
            let (key, val) = kv.split_once('=').ok_or("variant items are KEY=VALUE")?;
            let slot = match key.trim() {
                "MC" => &mut bs.mc,
                "KC" => &mut bs.kc,
                "NC" => &mut bs.nc,
                other => return Err(format!("unknown key {other} (MC, KC, NC)").into()),
            };
            *slot = val.trim().parse()?;
        }
        variants.push((v, core_blas::Gemm::new(g.isa())?.with_block_sizes(bs)?));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
        .collect();
    let mut c = vec![0.0f32; m * n];
    let flops = 2.0 * (m * n * k) as f64;
    let mut ratio = vec![vec![]; variants.len()];
    let mut rate = vec![vec![]; variants.len()];
    for r in 0..=reps {
        for (vi, (_, gv)) in variants.iter().enumerate() {
            let secs = pool.install(|| {
                let wall = Instant::now();
                let cpu = cpu_time::ThreadTime::try_now().ok();
                gv.sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)?;
                Ok::<_, core_blas::Error>(match cpu {
                    Some(t) if threads == 1 => t.elapsed().as_secs_f64(),
                    _ => wall.elapsed().as_secs_f64(),
                })
            })?;
            let peak =
                core_blas::peak::fma_peak_gflops(g.isa(), threads, Duration::from_millis(30))?;
            // The first round warms the buffers and the pages of C.
            if r > 0 {
                ratio[vi].push(flops / secs / 1e9 / peak);
                rate[vi].push(flops / secs / 1e9);
            }
        }
    }
    for (vi, (name, _)) in variants.iter().enumerate() {
        println!(
            "{m}x{n}x{k} t={threads} [{name}]: {:.1}% of peak ({:.1} GFLOP/s), median of {reps}",
            100.0 * median(ratio[vi].clone()),
            median(rate[vi].clone())
        );
    }
    Ok(())
}
