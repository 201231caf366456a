//! The FMA peak of every family the CPU has on 1 and 2 threads, and its micro-kernel alone
//! (packed panels in L1/L2, `micro_kernel_gflops`) at several depths KC, as % of the 1-thread
//! peak: `cargo run --release -p core-blas --example peak [rounds]`. Each round measures every
//! family once (~100 ms per figure), so the families are compared minute by minute.

use std::time::Duration;

use core_blas::Isa;
use core_blas::peak::{fma_peak_gflops, micro_kernel_gflops};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    let dur = Duration::from_millis(100);
    for round in 0..rounds {
        for isa in Isa::available() {
            let p1 = fma_peak_gflops(isa, 1, dur)?;
            let p2 = fma_peak_gflops(isa, 2, dur)?;
            let mut line = format!(
                "round {round} {:6} peak t1 {p1:.1} t2 {p2:.1}; ukr",
                isa.name()
            );
            for kc in [64, 128, 192, 256, 384] {
                let uk = micro_kernel_gflops(isa, kc, dur)?;
                line += &format!(" kc{kc} {:.1}%", 100.0 * uk / p1);
            }
            println!("{line}");
        }
    }
    Ok(())
}
