//! Tuning probe (not a benchmark): `gemm_packed_batched` (operands pre-packed, no driver) against
//! `sgemm_batched` (row-major operands, the five-loop driver) on fastconv's Winograd batches, one
//! thread, operands hot in cache. Each sample times `REPS` batches on the thread's CPU clock; the
//! two variants alternate sample by sample and the FMA peak is measured after each pair:
//! `cargo run --release -p core-blas --example packed_batched -- [SAMPLES] [M N K COUNT]...`
//! (default shapes: fastconv's F(6,4) 81 × (32 × 32 · 32 × 80) and neighbours).
//! With `ROWA=1` the first variant is `gemm_rowa_batched` (A row-major in place, B packed)
//! instead of `sgemm_batched`; all operands are 64-byte aligned (`AlignedVec`).

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
    let samples = args.first().copied().unwrap_or(15);
    let mut shapes: Vec<[usize; 4]> = args[1.min(args.len())..]
        .chunks_exact(4)
        .map(|c| [c[0], c[1], c[2], c[3]])
        .collect();
    if shapes.is_empty() {
        shapes = vec![
            [32, 80, 32, 81],
            [32, 16, 32, 81],
            [32, 96, 32, 81],
            [32, 37, 32, 81],
            [64, 64, 64, 36],
            [6, 80, 16, 36],
            [16, 48, 16, 36],
        ];
    }
    let g = core_blas::Gemm::global()?;
    let rowa = std::env::var("ROWA").is_ok_and(|v| v == "1");
    let name0 = if rowa {
        "gemm_rowa_batched"
    } else {
        "sgemm_batched"
    };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    println!("kernel {}", g.kernel_name());
    for [m, n, k, count] in shapes {
        let a: Vec<f32> = (0..count * m * k)
            .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
            .collect();
        let b: Vec<f32> = (0..count * k * n)
            .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
            .collect();
        let (al, bl) = (g.packed_a_len(m, k), g.packed_b_len(k, n));
        let a = core_blas::AlignedVec::from(&a[..]);
        let mut ap = core_blas::AlignedVec::zeroed(count * al);
        let mut bp = core_blas::AlignedVec::zeroed(count * bl);
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
        let mut c1 = core_blas::AlignedVec::zeroed(count * m * n);
        let mut c2 = core_blas::AlignedVec::zeroed(count * m * n);
        let flops = 2.0 * (m * n * k * count) as f64;
        let reps = ((2e8 / flops) as usize).clamp(1, 1000);
        let mut rates = [vec![], vec![]];
        let mut pct = [vec![], vec![]];
        for s in 0..=samples {
            let mut secs = [0.0f64; 2];
            for (v, slot) in secs.iter_mut().enumerate() {
                *slot = pool.install(|| {
                    let t = cpu_time::ThreadTime::now();
                    for _ in 0..reps {
                        if v == 0 && rowa {
                            g.gemm_rowa_batched(
                                m,
                                n,
                                k,
                                &a,
                                k,
                                m * k,
                                &bp,
                                bl,
                                0.0,
                                &mut c1,
                                n,
                                m * n,
                                count,
                            )?;
                        } else if v == 0 {
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
                                &mut c1,
                                n,
                                m * n,
                                count,
                            )?;
                        } else {
                            g.gemm_packed_batched(
                                m,
                                n,
                                k,
                                &ap,
                                al,
                                &bp,
                                bl,
                                0.0,
                                &mut c2,
                                n,
                                m * n,
                                count,
                            )?;
                        }
                    }
                    Ok::<_, core_blas::Error>(t.elapsed().as_secs_f64() / reps as f64)
                })?;
            }
            let peak = core_blas::peak::fma_peak_gflops(g.isa(), 1, Duration::from_millis(30))?;
            if s > 0 {
                for v in 0..2 {
                    let gf = flops / secs[v] / 1e9;
                    rates[v].push(gf);
                    pct[v].push(100.0 * gf / peak);
                }
            }
        }
        let err = c1
            .iter()
            .zip(c2.iter())
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        let (r0, r1) = (median(rates[0].clone()), median(rates[1].clone()));
        println!(
            "{count} x {m}x{n}x{k}: {name0} {r0:.1} GFLOP/s ({:.1}% of peak, {:.1} us/batch), \
             gemm_packed_batched {r1:.1} GFLOP/s ({:.1}%, {:.1} us/batch): {:.2}x; max |diff| {err:.1e}; \
             median of {samples} x {reps} batches",
            median(pct[0].clone()),
            flops / r0 / 1e3,
            median(pct[1].clone()),
            flops / r1 / 1e3,
            r1 / r0,
        );
    }
    Ok(())
}
