//! Tuning probe (not a benchmark): `core_blas::vector` against nn's scalar loops (copied from
//! `crates/nn` as of session 7: batch norm's 8-lane `lanes` reduction and its plane loops, ReLU
//! with a `bool` mask, the residual sum), one thread, thread CPU time, the two alternating,
//! best of 9 rounds of ~4 M values each, at 64, 1024, 32768 and 1 M values per call, the
//! smaller sizes called plane by plane over a 32768-value tensor (as nn does):
//! `cargo run --release -p core-blas --example vector_ab -- [LEN...]`.
//! Prints ns per value for the scalar loop and the kernel, and their ratio (scalar / kernel);
//! `shifted_sums` is timed against nn's two statistics passes (Σx, then Σ(x − m)²).

use std::hint::black_box;

use core_blas::vector::{Vector, mask_bytes};

/// nn's `lanes` (batchnorm.rs): Σ f(a, b) over 8 f32 lanes, the tail in f64.
fn lanes(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f64 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += f(x[l], y[l]);
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(&x, &y)| f(x, y) as f64).sum();
    acc.iter().map(|&v| v as f64).sum::<f64>() + tail
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut lens: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if lens.is_empty() {
        lens = vec![64, 1024, 32768, 1 << 20];
    }
    let v = Vector::global()?;
    println!("family {}", v.isa());
    println!(
        "{:>14} {:>8} {:>10} {:>10} {:>7}",
        "op", "len", "scalar ns", "kernel ns", "ratio"
    );
    for &n in &lens {
        // nn calls the kernels per plane (or per 32 K chunk) over a larger tensor: each round
        // walks a tensor of `total` values plane by plane.
        let total = n.max(32768);
        let planes = total / n;
        let reps = ((4usize << 20) / total).max(3);
        let x0: Vec<f32> = (0..total)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.002 - 1.0)
            .collect();
        let y0: Vec<f32> = (0..total)
            .map(|i| ((i * 104729) % 997) as f32 * 0.002 - 1.0)
            .collect();
        // Buffers `OFF` floats past a 64-byte boundary (default 4: where malloc's large blocks
        // start), like the tensors nn passes.
        let off: usize = std::env::var("OFF")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4);
        let mut bufs: Vec<core_blas::AlignedVec> = (0..3)
            .map(|_| {
                let mut a = core_blas::AlignedVec::new();
                a.resize(total + off, 0.0);
                a
            })
            .collect();
        let [bx, by, bh] = &mut bufs[..] else {
            unreachable!()
        };
        by[off..].copy_from_slice(&y0);
        let (x, y, h) = (&mut bx[off..], &by[off..], &mut bh[off..]);
        let mut bmask = vec![false; total];
        let mut bits = vec![0u8; mask_bytes(total)];
        // Contracting affine maps (s·g = 0.5, k = 0.5) keep repeated in-place calls finite.
        let (m, s, g, b) = (0.1f32, 1.25f32, 0.4f32, 0.2f32);
        let ops = [
            "sum",
            "sum_sq_dev",
            "sum_dot",
            "bn_train",
            "scale_shift",
            "bn_backward",
            "relu_train",
            "relu",
            "relu_backward",
            "add",
            "shifted_sums",
        ];
        for (oi, op) in ops.into_iter().enumerate() {
            let mut best = [f64::MAX; 2];
            for _round in 0..9 {
                for (k, bst) in best.iter_mut().enumerate() {
                    x.copy_from_slice(&x0);
                    let t0 = cpu_time::ThreadTime::now();
                    for _ in 0..reps {
                        for p in 0..planes {
                            let r = p * n..(p + 1) * n;
                            let x = black_box(&mut x[r.clone()]);
                            let (y, h) = (black_box(&y[r.clone()]), black_box(&mut h[r.clone()]));
                            let bm = black_box(&mut bmask[r.clone()]);
                            let bt = black_box(&mut bits[p * n / 8..]);
                            match (oi, k) {
                                (0, 0) => {
                                    black_box(lanes(x, x, |v, _| v));
                                }
                                (0, _) => {
                                    black_box(v.sum(x));
                                }
                                (1, 0) => {
                                    black_box(lanes(x, x, |v, _| (v - m) * (v - m)));
                                }
                                (1, _) => {
                                    black_box(v.sum_sq_dev(x, m));
                                }
                                (2, 0) => {
                                    black_box(lanes(x, x, |v, _| v));
                                    black_box(lanes(x, y, |a, b| a * b));
                                }
                                (2, _) => {
                                    black_box(v.sum_dot(x, y).unwrap());
                                }
                                (3, 0) => {
                                    for (h, v) in h.iter_mut().zip(x.iter_mut()) {
                                        *h = (*v - m) * s;
                                        *v = *h * g + b;
                                    }
                                }
                                (3, _) => v.bn_train(x, h, m, s, g, b).unwrap(),
                                (4, 0) => {
                                    x.iter_mut().for_each(|v| *v = (*v - m) * s * g + b);
                                }
                                (4, _) => v.scale_shift(x, s * g, b - m * s * g),
                                (5, 0) => {
                                    for (d, &h) in x.iter_mut().zip(y.iter()) {
                                        *d = 0.5 * (*d - 0.01 - h * 0.02);
                                    }
                                }
                                (5, _) => {
                                    v.bn_backward(x, y, 0.5, 0.01, 0.02).unwrap();
                                }
                                (6, 0) => {
                                    x.iter_mut().zip(bm.iter_mut()).for_each(|(v, keep)| {
                                        *keep = *v > 0.0;
                                        *v = v.max(0.0);
                                    });
                                }
                                (6, _) => v.relu_train(x, bt).unwrap(),
                                (7, 0) => x.iter_mut().for_each(|v| *v = v.max(0.0)),
                                (7, _) => v.relu(x),
                                (8, 0) => {
                                    x.iter_mut().zip(bm.iter()).for_each(|(d, &keep)| {
                                        *d = if keep { *d } else { 0.0 };
                                    });
                                }
                                (8, _) => v.relu_backward(x, bt).unwrap(),
                                (9, 0) => {
                                    x.iter_mut().zip(y.iter()).for_each(|(x, y)| *x += y);
                                }
                                (9, _) => v.add(x, y).unwrap(),
                                (10, 0) => {
                                    // nn's two passes: Σx, then Σ(x − m)².
                                    black_box(lanes(x, x, |v, _| v));
                                    black_box(lanes(x, x, |v, _| (v - m) * (v - m)));
                                }
                                (10, _) => {
                                    black_box(v.shifted_sums(x, m));
                                }
                                _ => unreachable!(),
                            }
                        }
                    }
                    *bst = bst.min(t0.elapsed().as_secs_f64());
                }
            }
            let per = |t: f64| t * 1e9 / (reps * planes * n) as f64;
            println!(
                "{op:>14} {n:>8} {:>10.4} {:>10.4} {:>7.2}",
                per(best[0]),
                per(best[1]),
                best[0] / best[1]
            );
        }
    }
    Ok(())
}
