//! Quick GEMM timing for tuning: `cargo run --release -p core-blas --example gemm_probe -- M N K [threads]`.
//! Prints the median GFLOP/s of `sgemm` over a few repetitions and the measured FMA peak of the
//! active family (block sizes from `CORE_BLAS_MC/KC/NC`, family from `CORE_BLAS_ISA`).

use std::time::{Duration, Instant};

/// Nanoseconds this thread has spent on a CPU (Linux schedstat), to tune on a loaded machine.
fn cpu_ns() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(f64::NAN)
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
    let threads = args.get(3).copied().unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let g = core_blas::Gemm::global()?;
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
        .collect();
    let mut c = vec![0.0f32; m * n];
    let flops = 2.0 * (m * n * k) as f64;
    let reps = ((5e10 / flops) as usize).clamp(3, 200);
    let mut times = Vec::new();
    pool.install(|| -> Result<(), core_blas::Error> {
        g.sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)?;
        for _ in 0..reps {
            let t = Instant::now();
            g.sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)?;
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(())
    })?;
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    // On-CPU rate of this thread (meaningful with 1 thread only).
    let cpu_gf = pool.install(|| -> Result<f64, core_blas::Error> {
        let t0 = cpu_ns();
        for _ in 0..reps {
            g.sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)?;
        }
        Ok(flops * reps as f64 / (cpu_ns() - t0))
    })?;
    let t0 = cpu_ns();
    for _ in 0..reps {
        // SAFETY: the pointers and strides describe the m×k, k×n and m×n row-major buffers above.
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
        };
    }
    let mm_cpu_gf = flops * reps as f64 / (cpu_ns() - t0);
    let mut mm_times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        // SAFETY: the pointers and strides describe the m×k, k×n and m×n row-major buffers above.
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
        };
        mm_times.push(t.elapsed().as_secs_f64());
    }
    mm_times.sort_by(f64::total_cmp);
    let mm = flops / mm_times[mm_times.len() / 2] / 1e9;
    let peak = core_blas::peak::fma_peak_gflops(g.isa(), threads, Duration::from_millis(300))?;
    let gf = flops / med / 1e9;
    let ukr = core_blas::peak::micro_kernel_gflops(
        g.isa(),
        g.block_sizes().kc,
        Duration::from_millis(300),
    )?;
    println!(
        "micro-kernel alone (kc = {}): {ukr:.1} GFLOP/s",
        g.block_sizes().kc
    );
    let best = flops / times[0] / 1e9;
    let mm_best = flops / mm_times[0] / 1e9;
    println!(
        "{} {:?} {m}x{n}x{k} t={threads}: {gf:.1} GFLOP/s (median of {reps}), matrixmultiply {mm:.1}, peak {peak:.1}, {:.1}% (mm {:.1}%); best-of: {best:.1} vs mm {mm_best:.1}; on-cpu {cpu_gf:.1} vs mm {mm_cpu_gf:.1}",
        g.kernel_name(),
        g.block_sizes(),
        100.0 * gf / peak,
        100.0 * mm / peak
    );
    Ok(())
}
