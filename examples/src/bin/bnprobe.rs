//! Batch norm's training passes on ResNet-20's three activation shapes (batch 64), or with `R50=1`
//! on three of ResNet-50's (batch 8): the fastest and the median of 300 forward and 300 backward
//! calls of `nn::BatchNorm`, in microseconds, on a thread of a rayon pool of `RAYON_NUM_THREADS`
//! threads (as `train` runs), the input copied into a recycled tensor outside the timed region.
//! `SPLIT=1` writes that copy image by image across the pool's threads (as a convolution leaves its
//! output); `FLUSH=1` then writes 64 MiB, so the passes read their tensors from memory as in
//! training. The probe behind docs/PERFORMANCE.md's batch-norm figures; run it beside another build,
//! alternating, to compare.
//!
//! `RAYON_NUM_THREADS=1 cargo run --release -p examples --bin bnprobe`
//! `R50=1 SPLIT=1 FLUSH=1 RAYON_NUM_THREADS=2 cargo run --release -p examples --bin bnprobe`

use std::time::Instant;

use nn::{BatchNorm, Layer, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // On a pool thread, as `train` runs: parallel loops are not injected from outside.
    let pool = rayon::ThreadPoolBuilder::new().build()?;
    Ok(pool.install(probe)?)
}

fn probe() -> Result<(), nn::NnError> {
    let r20: [[usize; 4]; 3] = [[64, 16, 32, 32], [64, 32, 16, 16], [64, 64, 8, 8]];
    let r50: [[usize; 4]; 3] = [[8, 256, 14, 14], [8, 1024, 14, 14], [8, 512, 28, 28]];
    let shapes = if std::env::var("R50").is_ok_and(|v| v == "1") {
        r50
    } else {
        r20
    };
    for s in shapes {
        let len: usize = s.iter().product();
        let x: Vec<f32> = (0..len)
            .map(|i| ((i * 7919 % 1000) as f32) / 500.0 - 1.0)
            .collect();
        let mut bn = BatchNorm::new(s[1])?;
        let (mut fwd, mut bwd) = (Vec::new(), Vec::new());
        // FLUSH=1: 64 MiB written between the copy and the timed calls, so the tensors come from
        // memory as in training (where a layer's activations have left the caches).
        let mut flush = if std::env::var("FLUSH").is_ok_and(|v| v == "1") {
            vec![0u8; 64 << 20]
        } else {
            Vec::new()
        };
        for it in 0..300 {
            // A recycled buffer (as in training), not a fresh allocation that faults its pages in.
            let mut xt = Tensor::zeros(&s);
            if std::env::var("SPLIT").is_ok_and(|v| v == "1") {
                // Written image by image across the pool's threads, as a convolution leaves it.
                use rayon::prelude::*;
                let img = len / s[0];
                xt.data_mut()
                    .par_chunks_mut(img)
                    .zip(x.par_chunks(img))
                    .for_each(|(d, s)| d.copy_from_slice(s));
            } else {
                xt.data_mut().copy_from_slice(&x);
            }
            flush
                .iter_mut()
                .step_by(64)
                .for_each(|b| *b = b.wrapping_add(it as u8));
            let t0 = Instant::now();
            let y = bn.forward(xt, true)?;
            let t1 = Instant::now();
            let dx = bn.backward(y, true)?;
            let t2 = Instant::now();
            std::hint::black_box(dx);
            fwd.push((t1 - t0).as_secs_f64());
            bwd.push((t2 - t1).as_secs_f64());
        }
        fwd.sort_by(f64::total_cmp);
        bwd.sort_by(f64::total_cmp);
        let (f, b) = (fwd[0] * 1e6, bwd[0] * 1e6);
        let (fm, bm) = (fwd[fwd.len() / 2] * 1e6, bwd[bwd.len() / 2] * 1e6);
        println!("{s:?} fwd {f:.1} us  bwd {b:.1} us  (medians {fm:.1} / {bm:.1})");
    }
    Ok(())
}
