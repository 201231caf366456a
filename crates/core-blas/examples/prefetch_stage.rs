//! Diagnostic (not a benchmark): does a software prefetch stage a B block in L2 before it is
//! packed? `cargo run --release -p core-blas --example prefetch_stage -- [KC] [NC] [N] [K]`.
//!
//! B is a row-major `K × N` matrix far larger than the caches (default 576 × 50176, the B of
//! 64×50176×576). For 30 blocks of `KC × NC` (default 192 × 672, the driver's blocks on that
//! shape), the block's lines are prefetched with `core_blas::pack::prefetch_l2` (`prefetcht1`)
//! spread over about 100 µs of register-only work, then the block is copied row by row and the
//! copy is timed on the thread's CPU clock. Modes: no prefetch; lines in column order (the
//! driver's slices: one line per row, row after row) in bursts of one slice or one by one; in
//! row order (a row's lines together) likewise; the block copied once just before (the
//! L2-resident reference). If the prefetch staged the block, its copy would cost what the
//! reference costs.

fn cpu_ns() -> f64 {
    cpu_time::ThreadTime::try_now().map_or(f64::NAN, |t| t.as_duration().as_nanos() as f64)
}

/// About `iters` dependent multiply-adds of register-only work (no memory traffic).
fn spin(iters: usize, x: f32) -> f32 {
    let mut x = x;
    for _ in 0..iters {
        x = std::hint::black_box(x * 0.999_999 + 1e-7);
    }
    x
}

const MODES: [&str; 6] = [
    "no prefetch",
    "column order, bursts",
    "column order, one by one",
    "row order, bursts",
    "row order, one by one",
    "copied just before (L2 reference)",
];

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let kc = args.first().copied().unwrap_or(192);
    let nc = args.get(1).copied().unwrap_or(672) / 16 * 16;
    let n = args.get(2).copied().unwrap_or(50176);
    let k = args.get(3).copied().unwrap_or(576);
    assert!(
        kc > 0 && nc >= 16 && kc <= k && nc <= n,
        "need 0 < KC <= K, 16 <= NC <= N"
    );
    let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32).collect();
    let mut dst = vec![0.0f32; kc * nc];
    let (blocks_per_band, bands) = (n / nc, k / kc);
    let lines_row = nc / 16;
    let total_lines = kc * lines_row;
    let slices = lines_row;
    let per_slice = total_lines / slices;
    let mut sink = 0.0f32;
    let copy = |base: usize, dst: &mut [f32]| {
        for p in 0..kc {
            dst[p * nc..][..nc].copy_from_slice(&b[base + p * n..][..nc]);
        }
    };
    for round in 0..3 {
        for (mode, name) in MODES.iter().enumerate() {
            let (mut t_copy, mut lines) = (0.0, 0usize);
            let off = (round * MODES.len() + mode) * 7 % blocks_per_band;
            for bi in 0..blocks_per_band.min(30) {
                let base = (bi % bands) * kc * n + (bi + off) % blocks_per_band * nc;
                for s in 0..slices {
                    if mode == 0 || mode == 5 {
                        sink = spin(2000, sink);
                        continue;
                    }
                    let one_by_one = mode == 2 || mode == 4;
                    for q in 0..per_slice {
                        let idx = s * per_slice + q;
                        let (p, l) = if mode <= 2 {
                            (idx % kc, idx / kc)
                        } else {
                            (idx / lines_row, idx % lines_row)
                        };
                        core_blas::pack::prefetch_l2(&b, base + p * n + l * 16);
                        if one_by_one {
                            sink = spin(2000 / per_slice, sink);
                        }
                    }
                    if !one_by_one {
                        sink = spin(2000, sink);
                    }
                }
                if mode == 5 {
                    copy(base, &mut dst);
                }
                let t = cpu_ns();
                copy(base, &mut dst);
                t_copy += cpu_ns() - t;
                lines += kc * nc / 16;
                sink += dst[lines % dst.len()];
            }
            println!(
                "round {round}: {name}: copy {:.2} ns per line ({:.1} GB/s)",
                t_copy / lines as f64,
                lines as f64 * 64.0 / t_copy
            );
        }
    }
    println!("(checksum {sink})");
}
