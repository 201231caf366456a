//! A/B of the avx512 full-tile kernels inside one process, interleaved per repetition:
//! `UKRS=0,1 cargo run --release -p core-blas --example ukr_ab -- M N K [reps]` prints, per
//! variant, the median of (GEMM rate on the thread's CPU clock) / (FMA peak measured right after
//! it), 1 thread. Variant 0: the assembly k-loop (`kernel/skx.rs`, the default); 1: the
//! intrinsics body (under `CORE_BLAS_ISA=avx2`: 0 the assembly k-loop of `avx2_ukr_asm`, 1 the
//! compiled bodies); 2: the assembly k-loop with rows 1, 3, 5, 7 as embedded broadcasts; +32: the
//! same with the block sizes `BS32=mc,kc,nc`. `M = 0`: the micro-kernel alone
//! (`micro_kernel_gflops`, panels in L1/L2, one short trial against one ~5 ms peak trial per
//! repetition) at depth `K` instead of a GEMM.

use std::time::Duration;

use core_blas::Isa;

fn cpu_ns() -> f64 {
    cpu_time::ThreadTime::try_now().map_or(f64::NAN, |t| t.as_duration().as_nanos() as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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
    let ukrs: Vec<u8> = std::env::var("UKRS")
        .unwrap_or_else(|_| "1,0".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let flops = 2.0 * (m * n * k) as f64;
    let reps = args
        .get(3)
        .copied()
        .unwrap_or(((2e10 / flops.max(1.0)) as usize).clamp(5, 41));
    let g0 = core_blas::Gemm::global()?;
    let g32 = match std::env::var("BS32") {
        Ok(s) => {
            let v: Vec<usize> = s.split(',').filter_map(|x| x.parse().ok()).collect();
            let bs = core_blas::BlockSizes {
                mc: v[0],
                kc: v[1],
                nc: v[2],
            };
            core_blas::Gemm::new(g0.isa())?.with_block_sizes(bs)?
        }
        Err(_) => *g0,
    };
    let gemm_of = |v: u8| if v & 32 != 0 { &g32 } else { g0 };
    let g = g0;
    let isa = g.isa();
    let peak = |d: u64| core_blas::peak::fma_peak_gflops(isa, 1, Duration::from_millis(d));
    let mut ratios = vec![vec![]; ukrs.len()];
    let mut rates = vec![vec![]; ukrs.len()];
    if m == 0 {
        for _ in 0..reps {
            for (i, &v) in ukrs.iter().enumerate() {
                core_blas::__set_ukr_variant(v & 31);
                let r = core_blas::peak::micro_kernel_gflops(isa, k, Duration::ZERO)?;
                let p = core_blas::peak::fma_peak_gflops(Isa::Avx512, 1, Duration::ZERO)?;
                ratios[i].push(r / p);
                rates[i].push(r);
            }
        }
    } else {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
            .collect();
        let mut c = vec![0.0f32; m * n];
        // `ALIGNED=1`: A, B, C as `AlignedVec`s (2 MiB pages) instead of `Vec`s.
        let (a_al, b_al, mut c_al);
        let (a, b, c): (&[f32], &[f32], &mut [f32]) = if std::env::var_os("ALIGNED").is_some() {
            a_al = core_blas::AlignedVec::from(&a[..]);
            b_al = core_blas::AlignedVec::from(&b[..]);
            c_al = core_blas::AlignedVec::from(&c[..]);
            (&a_al, &b_al, &mut c_al)
        } else {
            (&a, &b, &mut c)
        };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
        let run = |g: &core_blas::Gemm, c: &mut [f32]| {
            pool.install(|| {
                let t = cpu_ns();
                g.sgemm(false, false, m, n, k, 1.0, a, k, b, n, 0.0, c, n)
                    .expect("valid sgemm");
                (cpu_ns() - t) * 1e-9
            })
        };
        for &v in &ukrs {
            core_blas::__set_ukr_variant(v & 31);
            run(gemm_of(v), c);
        }
        for _ in 0..reps {
            for (i, &v) in ukrs.iter().enumerate() {
                core_blas::__set_ukr_variant(v & 31);
                let t = run(gemm_of(v), c);
                let p = peak(30)?;
                ratios[i].push(flops / t / 1e9 / p);
                rates[i].push(flops / t / 1e9);
            }
        }
    }
    let what = if m == 0 {
        format!("ukr kc {k}")
    } else {
        format!("{m}x{n}x{k}")
    };
    for (i, &v) in ukrs.iter().enumerate() {
        let mut s = ratios[i].clone();
        s.sort_by(f64::total_cmp);
        println!(
            "{what} ukr {v}: {:.1}% of peak (median of {reps}, quartiles {:.1}-{:.1}), {:.1} GFLOP/s",
            100.0 * median(ratios[i].clone()),
            100.0 * s[reps / 4],
            100.0 * s[3 * reps / 4],
            median(rates[i].clone()),
        );
    }
    Ok(())
}
