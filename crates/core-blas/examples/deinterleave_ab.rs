//! `Gemm::deinterleave` against the scalar per-phase loop it replaces (`out[q] = src[q · m + i]`,
//! one phase at a time), on L1-resident lines: ns per value, thread CPU time, best of 9 rounds,
//! the two alternating. `cargo run --release -p core-blas --example deinterleave_ab -- [m:n ...]`
//! (default 6:37 6:5 6:8 4:37 8:37 2:37 7:37).

use std::hint::black_box;

fn cpu_ns() -> f64 {
    cpu_time::ThreadTime::now().as_duration().as_nanos() as f64
}

/// The per-phase strided loop (what a caller without the kernel writes).
#[inline(never)]
fn scalar(dst: &mut [f32], ld: usize, src: &[f32], m: usize, n: usize) {
    for i in 0..m {
        let row = &mut dst[i * ld..][..n];
        for (q, o) in row.iter_mut().enumerate() {
            *o = src[q * m + i];
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let shapes: Vec<(usize, usize)> = if args.is_empty() {
        vec![(6, 37), (6, 5), (6, 8), (4, 37), (8, 37), (2, 37), (7, 37)]
    } else {
        args.iter()
            .filter_map(|a| {
                let (m, n) = a.split_once(':')?;
                Some((m.parse().ok()?, n.parse().ok()?))
            })
            .collect()
    };
    let g = core_blas::Gemm::global()?;
    for (m, n) in shapes {
        let ld = n.div_ceil(16) * 16;
        let lines = 64;
        let src: Vec<f32> = (0..lines * n * m).map(|i| i as f32).collect();
        let mut dst = vec![0.0f32; m * ld];
        let calls = (2_000_000 / (n * m)).max(100);
        let (mut best_k, mut best_s) = (f64::MAX, f64::MAX);
        for _ in 0..9 {
            let t = cpu_ns();
            for c in 0..calls {
                let s = &src[(c % lines) * n * m..][..n * m];
                g.deinterleave(&mut dst, ld, s, m, n)?;
                black_box(&mut dst);
            }
            best_k = best_k.min(cpu_ns() - t);
            let t = cpu_ns();
            for c in 0..calls {
                let s = &src[(c % lines) * n * m..][..n * m];
                scalar(&mut dst, ld, s, m, n);
                black_box(&mut dst);
            }
            best_s = best_s.min(cpu_ns() - t);
        }
        let vals = (calls * n * m) as f64;
        println!(
            "{} m {m} n {n}: kernel {:.3} ns/value ({:.1} ns/call), scalar {:.3} ns/value: {:.2}x",
            g.isa(),
            best_k / vals,
            best_k / calls as f64,
            best_s / vals,
            best_s / best_k
        );
    }
    Ok(())
}
