//! Is the FMA throughput of this machine steady? Times many short FMA-peak trials (one ~5 ms
//! trial each, 1 thread) and prints their distribution; then the same for the micro-kernel alone
//! (`micro_kernel_gflops`, ~5 ms each): `cargo run --release -p core-blas --example peak_series
//! [trials]`. A bimodal spread means another thread shares the core's FMA units at times (a
//! hyperthread sibling on the host), which a best-of peak hides and a long GEMM averages over.

use std::time::Duration;

use core_blas::Isa;
use core_blas::peak::{fma_peak_gflops, micro_kernel_gflops};

fn summary(name: &str, mut v: Vec<f64>) {
    v.sort_by(f64::total_cmp);
    let q = |f: f64| v[((v.len() - 1) as f64 * f) as usize];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "{name}: min {:.1} p10 {:.1} p25 {:.1} median {:.1} p75 {:.1} p90 {:.1} max {:.1} mean {:.1} GFLOP/s",
        q(0.0),
        q(0.1),
        q(0.25),
        q(0.5),
        q(0.75),
        q(0.9),
        q(1.0),
        mean
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let trials: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100);
    for isa in [Isa::Avx2, Isa::Avx512] {
        if !isa.is_available() {
            continue;
        }
        let peaks: Vec<f64> = (0..trials)
            .map(|_| fma_peak_gflops(isa, 1, Duration::ZERO))
            .collect::<Result<_, _>>()?;
        summary(&format!("{} peak", isa.name()), peaks);
        let ukr: Vec<f64> = (0..trials)
            .map(|_| micro_kernel_gflops(isa, 192, Duration::ZERO))
            .collect::<Result<_, _>>()?;
        summary(&format!("{} ukr kc 192", isa.name()), ukr);
    }
    Ok(())
}
