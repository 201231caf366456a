//! Winograd forward (and backward passes) against conv-ops' im2col+GEMM and convgemm on the same
//! layers in the same run, so the ratio is meaningful on a noisy shared machine.
//!
//! `cargo bench -p fastconv --bench winograd`; `WINO_LAYERS=vgg_c64_56,...` to pick layers.

use std::hint::black_box;
use std::time::Duration;

use conv_ops::{ConvGeometry, ForwardAlgo, Workspace, forward, testing::uniform};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fastconv::WinogradPlan;

/// name, N, C, K, input, kernel, pad.
type Layer = (
    &'static str,
    usize,
    usize,
    usize,
    &'static [usize],
    &'static [usize],
    usize,
);
const LAYERS: &[Layer] = &[
    ("vgg_c64_56", 8, 64, 64, &[56, 56], &[3, 3], 1),
    ("r50_c128_28", 8, 128, 128, &[28, 28], &[3, 3], 1),
    ("r50_c256_14", 8, 256, 256, &[14, 14], &[3, 3], 1),
    // The paper's Fig. 4 benchmark layer (4×4 kernels, 32 channels, 224×224), batch 1.
    ("budden_4x4_c32_224", 1, 32, 32, &[224, 224], &[4, 4], 0),
    ("c3d_c64_8x28x28", 1, 64, 64, &[8, 28, 28], &[3, 3, 3], 1),
];

fn bench(c: &mut Criterion) {
    let pick = std::env::var("WINO_LAYERS").ok();
    for l in LAYERS {
        if pick
            .as_ref()
            .is_some_and(|p| !p.split(',').any(|n| n == l.0))
        {
            continue;
        }
        let g = ConvGeometry::new(l.1, l.2, l.3, l.4, l.5)
            .and_then(|g| g.with_padding(&[l.6]))
            .expect("benchmark geometry");
        let x = uniform(1, g.x_len());
        let w = uniform(2, g.w_len());
        let dy = uniform(3, g.y_len());
        let mut y = vec![0.0f32; g.y_len()];
        let mut grp = c.benchmark_group(format!("winograd/{}", l.0));
        grp.throughput(Throughput::Elements(g.flops()));
        grp.sample_size(10)
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1));
        let mut ws = Workspace::new(true);
        grp.bench_function("fwd/im2col+gemm", |b| {
            b.iter(|| {
                forward(
                    &g,
                    &x,
                    &w,
                    None,
                    false,
                    &mut y,
                    ForwardAlgo::Im2colGemm,
                    &mut ws,
                )
                .unwrap()
            })
        });
        grp.bench_function("fwd/convgemm", |b| {
            b.iter(|| {
                forward(
                    &g,
                    &x,
                    &w,
                    None,
                    false,
                    &mut y,
                    ForwardAlgo::Convgemm,
                    &mut ws,
                )
                .unwrap()
            })
        });
        let mut plan = WinogradPlan::new(&g, None).expect("plan");
        let tile = plan
            .tile()
            .iter()
            .map(|m| m.to_string())
            .collect::<Vec<_>>()
            .join("x");
        grp.bench_function(format!("fwd/winograd-auto-m{tile}"), |b| {
            b.iter(|| plan.forward(black_box(&x), &w, &mut y).unwrap())
        });
        if l.5.iter().all(|&r| r == 3) {
            for m in [2usize, 4, 6] {
                let mut p = WinogradPlan::new(&g, Some(&[m])).expect("plan");
                grp.bench_function(format!("fwd/winograd-F({m},3)"), |b| {
                    b.iter(|| p.forward(black_box(&x), &w, &mut y).unwrap())
                });
            }
        }
        let mut dx = vec![0.0f32; g.x_len()];
        grp.bench_function(format!("bwd-data/winograd-auto-m{tile}"), |b| {
            b.iter(|| plan.backward_data(black_box(&dy), &w, &mut dx).unwrap())
        });
        let mut dw = vec![0.0f32; g.w_len()];
        grp.bench_function(format!("bwd-filter/winograd-auto-m{tile}"), |b| {
            b.iter(|| plan.backward_filter(black_box(&x), &dy, &mut dw).unwrap())
        });
        grp.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
