//! Probe: thread CPU time of one training forward and one backward of nn's memory-bound layers
//! (batch norm, max-pool, ReLU) on ResNet-50's shapes, on one thread, min over rounds; for A/B
//! runs between two builds (the numbers of one run only compare with each other).
//!
//! `cargo run --release -p nn --example probe_layers -- [ROUNDS [FILTER]]`; FILTER keeps the
//! cases whose name contains it. Prints ms per pass and GB/s of the tensor read once.

use nn::{BatchNorm, Layer, MaxPool, Relu, Tensor};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// CPU time of the calling thread in seconds.
fn cpu() -> f64 {
    cpu_time::ThreadTime::try_now().map_or(f64::NAN, |t| t.as_duration().as_secs_f64())
}

/// A deterministic tensor of `shape` with values spread around a non-zero mean.
fn tensor(shape: &[usize], seed: usize) -> Result<Tensor, Error> {
    let len = shape.iter().product::<usize>();
    let data = (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 1009) as f32 / 1009.0 - 0.4)
        .collect();
    Ok(Tensor::new(shape, data)?)
}

/// A case: name, layer, input shape.
type Case = (String, Box<dyn Layer>, Vec<usize>);

/// The cases: ResNet-50's shapes at batch 8.
fn cases() -> Result<Vec<Case>, Error> {
    let mut v: Vec<Case> = Vec::new();
    for (c, s) in [(64, 112), (256, 56), (512, 28), (1024, 14), (2048, 7)] {
        let shape = vec![8, c, s, s];
        v.push((format!("bn {c}@{s}²"), Box::new(BatchNorm::new(c)?), shape));
    }
    let stem = vec![8, 64, 112, 112];
    let pool = MaxPool::nd(&[3, 3], &[2, 2], &[1, 1])?;
    v.push((
        "maxpool 3x3 s2 64@112²".into(),
        Box::new(pool),
        stem.clone(),
    ));
    v.push(("relu 64@112²".into(), Box::new(Relu::new()), stem));
    Ok(v)
}

fn main() -> Result<(), Error> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    pool.install(run)
}

fn run() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds: usize = args.first().map_or(Ok(7), |s| s.parse())?;
    let filter = args.get(1).cloned().unwrap_or_default();
    println!(
        "{:<26} {:>9} {:>9} {:>8}",
        "case", "fwd ms", "bwd ms", "fwd GB/s"
    );
    for (name, mut layer, shape) in cases()? {
        if !name.contains(&filter) {
            continue;
        }
        let x = tensor(&shape, 1)?;
        let yshape = layer.output_shape(&shape[1..])?;
        let mut dshape = vec![shape[0]];
        dshape.extend(yshape);
        let dy = tensor(&dshape, 2)?;
        let (mut fwd, mut bwd) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..rounds {
            let (xc, dyc) = (x.clone(), dy.clone());
            let t = cpu();
            let y = layer.forward(xc, true)?;
            let t1 = cpu();
            let dx = layer.backward(dyc, true)?;
            let t2 = cpu();
            (fwd, bwd) = (fwd.min(t1 - t), bwd.min(t2 - t1));
            drop((y, dx));
        }
        let gbs = (x.len() * 4) as f64 / fwd / 1e9;
        println!(
            "{name:<26} {:>9.3} {:>9.3} {gbs:>8.2}",
            fwd * 1e3,
            bwd * 1e3
        );
    }
    Ok(())
}
