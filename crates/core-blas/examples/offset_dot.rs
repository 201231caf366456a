//! Tuning probe (not a benchmark): `offset_dot_rows` against the same rows through
//! `offset_dot_tile` calls plus the caller's add (conv-ops' direct backward-filter before it), one
//! thread, thread CPU time, the two alternating, best of 9 rounds:
//! `cargo run --release -p core-blas --example offset_dot -- [RUNS] [COLS]` (default: 8 runs of
//! 8 pixels, 64 channels × 9 taps on an 8×8 image padded to 10×10).

use core_blas::{DOT_MR, DOT_NC, DotTile, Gemm, Offsets};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let nruns = args.first().copied().unwrap_or(8);
    let channels = args.get(1).copied().unwrap_or(64);
    let (plane, w) = (100usize, 10usize);
    let offs: Vec<usize> = (0..channels * 9)
        .map(|s| (s / 9) * plane + (s % 9 / 3) * w + s % 3)
        .collect();
    let ncols = offs.len();
    let offs = Offsets::new(offs);
    let runs = Offsets::new((0..nruns).map(|r| (r % 8) * w).collect());
    let x: Vec<f32> = (0..channels * plane + 64)
        .map(|i| (i % 17) as f32 * 0.1)
        .collect();
    let ldd = nruns * 8;
    let dy: Vec<f32> = (0..DOT_MR * ldd).map(|i| (i % 7) as f32 * 0.1).collect();
    let g = Gemm::global()?;
    let mut out = vec![0.0f32; DOT_MR * ncols];
    let calls = 2000;
    let mut best = [f64::MAX; 2];
    for _ in 0..9 {
        for (v, b) in best.iter_mut().enumerate() {
            let t = cpu_time::ThreadTime::now();
            for _ in 0..calls {
                if v == 0 {
                    let mut acc: DotTile = Default::default();
                    for j0 in (0..ncols).step_by(DOT_NC) {
                        let j1 = (j0 + DOT_NC).min(ncols);
                        g.offset_dot_tile(
                            DOT_MR,
                            &dy,
                            ldd,
                            &runs,
                            &offs,
                            j0..j1,
                            &x,
                            &mut acc,
                            false,
                        )?;
                        for (i, a) in acc.iter().enumerate() {
                            for (o, &v) in out[i * ncols + j0..][..j1 - j0].iter_mut().zip(a) {
                                *o += v;
                            }
                        }
                    }
                } else {
                    g.offset_dot_rows(DOT_MR, &dy, ldd, &runs, &offs, &x, &mut out, ncols)?;
                }
            }
            *b = b.min(t.elapsed().as_secs_f64() * 1e9 / calls as f64);
        }
    }
    let flops = 2.0 * (DOT_MR * ncols * nruns * 8) as f64;
    println!(
        "{nruns} runs x {ncols} cols: tiles + add {:.0} ns ({:.1} GFLOP/s), offset_dot_rows {:.0} ns ({:.1} GFLOP/s): {:.3}x",
        best[0],
        flops / best[0],
        best[1],
        flops / best[1],
        best[0] / best[1]
    );
    std::hint::black_box(&out);
    Ok(())
}
