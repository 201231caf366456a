//! Tuning probe (not a benchmark): the offset-A tile ([`Gemm::offset_a_tile`]) with 1..=MR
//! pixels per call, on a ResNet-50-like 3×3 layer read in place, one thread, thread CPU time,
//! the pixel counts alternating, best of 7 rounds; beside the family's GEMM micro-kernel
//! figure for scale:
//! `cargo run --release -p core-blas --example offset_a_tile -- [CHANNELS] [SIZE] [BATCH] [PIXELS..]`
//! (default 256 channels at 14×14 padded to 16×16, batch 2, pixel counts 4, 6, 8, 10, 12 up to
//! the family's). Every output channel block of the family's width, every pixel tile in order,
//! whole C·9 steps per call, := (no store). Two tilings per pixel count: `cross` (tiles of m
//! pixels crossing lines and images: mostly arbitrary bases) and `line` (each output line split
//! evenly into tiles of at most m pixels: runs).

use core_blas::{Gemm, OffsetATile, Offsets};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let ch = args.first().copied().unwrap_or(256);
    let hw = args.get(1).copied().unwrap_or(14);
    let batch = args.get(2).copied().unwrap_or(2);
    let g = Gemm::global()?;
    let (mr, nr) = g.offset_a_shape();
    let counts: Vec<usize> = if args.len() > 3 {
        args[3..].to_vec()
    } else {
        [4, 6, 8, 10, 12].into_iter().filter(|&m| m <= mr).collect()
    };
    let wp = hw + 2;
    let plane = wp * wp;
    let x: Vec<f32> = (0..batch * ch * plane)
        .map(|i| (i % 17) as f32 * 0.01)
        .collect();
    let offs: Vec<usize> = (0..ch * 9)
        .map(|s| (s / 9) * plane + (s % 9 / 3) * wp + s % 3)
        .collect();
    let steps = offs.len();
    let list = Offsets::new(offs);
    let kblocks = ch.div_ceil(nr);
    let wt: Vec<f32> = (0..kblocks * steps * nr)
        .map(|i| (i % 13) as f32 * 0.01 - 0.05)
        .collect();
    let olen = hw * hw;
    let pixels = batch * olen;
    let base: Vec<usize> = (0..pixels)
        .map(|p| (p / olen) * ch * plane + (p % olen / hw) * wp + p % hw)
        .collect();
    let mut acc: OffsetATile = Default::default();
    let mut sink = 0.0f32;
    // Per pixel count: the tiles of both tilings, as ranges of `base`.
    let tilings: Vec<[Vec<std::ops::Range<usize>>; 2]> = counts
        .iter()
        .map(|&m| {
            let cross = (0..pixels)
                .step_by(m)
                .map(|p| p..(p + m).min(pixels))
                .collect();
            let per_line = hw.div_ceil(m);
            let line = (0..pixels)
                .step_by(hw)
                .flat_map(|l| {
                    (0..per_line).map(move |t| l + t * hw / per_line..l + (t + 1) * hw / per_line)
                })
                .collect();
            [cross, line]
        })
        .collect();
    let mut best = vec![[f64::MAX; 2]; counts.len()];
    for _ in 0..7 {
        for (b, tiles) in best.iter_mut().zip(&tilings) {
            for (b, tiles) in b.iter_mut().zip(tiles) {
                let t = cpu_time::ThreadTime::now();
                for kb in 0..kblocks {
                    let wk = &wt[kb * steps * nr..][..steps * nr];
                    for tile in tiles {
                        let tb = &base[tile.clone()];
                        g.offset_a_tile(wk, &list, 0..steps, &x, tb, &mut acc, false)?;
                        sink += acc[0][0];
                    }
                }
                *b = b.min(t.elapsed().as_secs_f64());
            }
        }
    }
    let flops = 2.0 * (pixels * kblocks * nr * steps) as f64;
    println!(
        "{} offset-A {mr}x{nr}: {ch}@{hw}^2 batch {batch}, {steps} steps per call",
        g.isa()
    );
    for (b, &m) in best.iter().zip(&counts) {
        for (b, name) in b.iter().zip(["cross", "line"]) {
            println!(
                "  {m:2} pixels x {nr} channels, {name:5}: {:8.3} ms  {:6.1} GFLOP/s",
                b * 1e3,
                flops / b / 1e9
            );
        }
    }
    println!("(checksum {sink})");
    Ok(())
}
