//! nn: one training step (forward, cross-entropy, backward, SGD) of the `train` example's models
//! (lenet, resnet20, vgg16)
//! on a fixed synthetic batch, at 1 and 2 threads; throughput in samples per second. PyTorch's
//! figures for the same models come from `../shared/anchors/conv/train_bench.py` (see the nn
//! section of docs/PERFORMANCE.md).
//!
//! `cargo bench -p benches --bench train`, `TRAIN_MODELS=lenet` to pick.

use std::time::Duration;

use benches::thread_pools;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nn::{ConvAlgo, Dataset, Sgd, build, cross_entropy};

/// model, batch, algorithms measured.
const CASES: &[(&str, usize, &[ConvAlgo])] = &[
    ("lenet", 64, &[ConvAlgo::Auto, ConvAlgo::Convgemm]),
    ("resnet20", 64, &[ConvAlgo::Auto, ConvAlgo::Convgemm]),
    ("vgg16", 64, &[ConvAlgo::Auto, ConvAlgo::Convgemm]),
];

fn train_step(c: &mut Criterion) {
    let pick = std::env::var("TRAIN_MODELS").ok();
    let mut group = c.benchmark_group("train-step");
    group.sample_size(10).warm_up_time(Duration::from_secs(2));
    for &(name, batch, algos) in CASES {
        if pick
            .as_ref()
            .is_some_and(|p| !p.split(',').any(|m| m == name))
        {
            continue;
        }
        for (threads, pool) in thread_pools() {
            for &algo in algos {
                let mut model = build(name, algo, 0).expect("model");
                let classes = model.output_shape().expect("shape")[0];
                let data =
                    Dataset::synthetic(batch, model.input_shape(), classes, 0).expect("data");
                let (x, labels) = data
                    .batches(batch, None)
                    .expect("batch")
                    .next()
                    .expect("batch");
                let mut opt = Sgd::new(0.01, 0.9, 5e-4).expect("sgd");
                group.throughput(Throughput::Elements(batch as u64));
                group.bench_function(format!("{name}/b{batch}/{algo}/t{threads}"), |b| {
                    pool.install(|| {
                        b.iter(|| {
                            let logits = model.forward(x.clone(), true).expect("forward");
                            let (_, dl) = cross_entropy(&logits, &labels).expect("loss");
                            model.backward(dl).expect("backward");
                            let params = model.params_mut().into_iter().map(|(_, p)| p);
                            opt.step(params).expect("step");
                        })
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, train_step);
criterion_main!(benches);
