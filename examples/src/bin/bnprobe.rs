//! Batch norm's training passes on ResNet-20's three activation shapes (batch 64): the fastest of
//! 300 forward and 300 backward calls of `nn::BatchNorm`, in microseconds, the input copied
//! outside the timed region. The probe behind docs/PERFORMANCE.md's batch-norm figures; run it
//! beside another build, alternating, to compare.
//!
//! `RAYON_NUM_THREADS=1 cargo run --release -p examples --bin bnprobe`

use std::time::Instant;

use nn::{BatchNorm, Layer, Tensor};

fn main() -> Result<(), nn::NnError> {
    let shapes: [[usize; 4]; 3] = [[64, 16, 32, 32], [64, 32, 16, 16], [64, 64, 8, 8]];
    for s in shapes {
        let len: usize = s.iter().product();
        let x: Vec<f32> = (0..len)
            .map(|i| ((i * 7919 % 1000) as f32) / 500.0 - 1.0)
            .collect();
        let mut bn = BatchNorm::new(s[1])?;
        let (mut fwd, mut bwd) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..300 {
            let xt = Tensor::new(&s, x.clone())?;
            let t0 = Instant::now();
            let y = bn.forward(xt, true)?;
            let t1 = Instant::now();
            let dx = bn.backward(y, true)?;
            let t2 = Instant::now();
            std::hint::black_box(dx);
            fwd = fwd.min((t1 - t0).as_secs_f64());
            bwd = bwd.min((t2 - t1).as_secs_f64());
        }
        println!("{s:?} fwd {:.1} us  bwd {:.1} us", fwd * 1e6, bwd * 1e6);
    }
    Ok(())
}
