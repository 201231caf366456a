//! fastconv: Winograd (`WinogradPlan`) beside conv-ops' convgemm / deconvgemm / transposed
//! convgemm on the same layers, same run, at 1 and 2 threads, so the ratios mean something on a
//! noisy shared machine.
//!
//! Cases (the fastconv issue's targets):
//! - `paper_4x4_c32_224_b{1,20,200}`: the Winograd paper's benchmark (Budden et al., Fig. 4): three
//!   stacked 4×4 convolutions 32→32 on 224×224 inputs, no padding; `fwd` (three forwards) and
//!   `train` (three forwards, then backward-filter and backward-data of every layer; the weights
//!   change every step, as in training, so the kernel transforms are recomputed). Extra records:
//!   `images_per_s` and `megavoxels_per_s` (input voxels, 224², per second, the paper's unit),
//!   from the median of the measured samples. Batch 200 (~10 GiB of activations and gradients,
//!   seconds per call) runs only when `WINO_CASES` names it.
//! - `r50_3x3_c{64,128,256,512}_*`: ResNet-50's 3×3 stride-1 layers at batch 8, every pass;
//! - `c3d_64_8x56x56_b1`: C3D's 3×3×3 64→64 layer on 8×56×56, batch 1, every pass.
//!
//! `cargo bench -p benches --bench winograd`; `WINO_CASES=r50_3x3_c128_28,...` picks cases. Under
//! `--quick` the batch-20 paper cases run at 2 threads only, and conv-ops only at batch 1.

use std::hint::black_box;
use std::time::{Duration, Instant};

use benches::{emit_record, flop_group, thread_pools};
use conv_ops::{
    BackwardDataAlgo, BackwardFilterAlgo, ConvGeometry, ForwardAlgo, Workspace, backward_data,
    backward_filter, forward, testing::uniform,
};
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
    ("r50_3x3_c64_56", 8, 64, 64, &[56, 56], &[3, 3], 1),
    ("r50_3x3_c128_28", 8, 128, 128, &[28, 28], &[3, 3], 1),
    ("r50_3x3_c256_14", 8, 256, 256, &[14, 14], &[3, 3], 1),
    ("r50_3x3_c512_7", 8, 512, 512, &[7, 7], &[3, 3], 1),
    ("c3d_64_8x56x56_b1", 1, 64, 64, &[8, 56, 56], &[3, 3, 3], 1),
];

fn geometry(
    n: usize,
    c: usize,
    k: usize,
    input: &[usize],
    kernel: &[usize],
    pad: usize,
) -> ConvGeometry {
    ConvGeometry::new(n, c, k, input, kernel)
        .and_then(|g| g.with_padding(&[pad]))
        .expect("benchmark geometry")
}

/// Whether the case runs: every case when `WINO_CASES` is unset, else the cases it names.
fn wanted(name: &str) -> bool {
    std::env::var("WINO_CASES").is_err() || named(name)
}

/// Whether `WINO_CASES` names the case explicitly (for cases too large for a default run).
fn named(name: &str) -> bool {
    std::env::var("WINO_CASES").is_ok_and(|w| w.split(',').any(|n| n == name))
}

fn quick() -> bool {
    std::env::args().any(|a| a == "--quick")
}

fn tile_name(p: &WinogradPlan) -> String {
    p.tile()
        .iter()
        .map(|m| m.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

/// Every pass of one layer: Winograd and the conv-ops algorithm of the same pass.
fn bench_layers(c: &mut Criterion, pools: &[(usize, rayon::ThreadPool)]) {
    for &(name, n, ci, k, input, kernel, pad) in LAYERS {
        if !wanted(name) {
            continue;
        }
        let g = geometry(n, ci, k, input, kernel, pad);
        let (x, w, dy) = (
            uniform(1, g.x_len()),
            uniform(2, g.w_len()),
            uniform(3, g.y_len()),
        );
        let (mut y, mut dx, mut dw) = (
            vec![0f32; g.y_len()],
            vec![0f32; g.x_len()],
            vec![0f32; g.w_len()],
        );
        let mut plan = WinogradPlan::new(&g, None).expect("plan");
        let tile = tile_name(&plan);
        let mut group = c.benchmark_group(flop_group(&format!("winograd/{name}")));
        group.throughput(Throughput::Elements(g.flops()));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(2));
        for (t, pool) in pools {
            let mut ws = Workspace::new(false);
            group.bench_function(format!("fwd/winograd-m{tile}/t{t}"), |b| {
                pool.install(|| b.iter(|| plan.forward(black_box(&x), &w, &mut y).expect("fwd")))
            });
            group.bench_function(format!("fwd/convgemm/t{t}"), |b| {
                pool.install(|| {
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
                        .expect("fwd")
                    })
                })
            });
            group.bench_function(format!("bwd-data/winograd-m{tile}/t{t}"), |b| {
                pool.install(|| {
                    b.iter(|| {
                        plan.backward_data(black_box(&dy), &w, &mut dx)
                            .expect("bwd-data")
                    })
                })
            });
            group.bench_function(format!("bwd-data/deconvgemm/t{t}"), |b| {
                pool.install(|| {
                    b.iter(|| {
                        backward_data(&g, &dy, &w, &mut dx, BackwardDataAlgo::Deconvgemm, &mut ws)
                            .expect("bwd-data")
                    })
                })
            });
            group.bench_function(format!("bwd-filter/winograd-m{tile}/t{t}"), |b| {
                pool.install(|| {
                    b.iter(|| {
                        plan.backward_filter(black_box(&x), &dy, &mut dw)
                            .expect("bwd-filter")
                    })
                })
            });
            group.bench_function(format!("bwd-filter/convgemm-trans/t{t}"), |b| {
                pool.install(|| {
                    b.iter(|| {
                        backward_filter(
                            &g,
                            &x,
                            &dy,
                            &mut dw,
                            BackwardFilterAlgo::ConvgemmTrans,
                            &mut ws,
                        )
                        .expect("bwd-filter")
                    })
                })
            });
        }
        group.finish();
        black_box((&y, &dx, &dw));
    }
}

/// One algorithm for the paper's three-layer network.
enum Engine {
    Winograd(Vec<WinogradPlan>),
    ConvOps(Workspace),
}

/// The paper's network: three 4×4 layers 32→32, 224 → 221 → 218 → 215, no padding.
struct Net {
    geoms: Vec<ConvGeometry>,
    w: Vec<Vec<f32>>,
    /// Activations: acts[0] = input, acts[i + 1] = output of layer i.
    acts: Vec<Vec<f32>>,
    /// Gradients w.r.t. acts[i] (grads[3] = the loss gradient, fixed).
    grads: Vec<Vec<f32>>,
    dw: Vec<Vec<f32>>,
    step: u32,
}

impl Net {
    /// The three layers' geometries (cheap: no buffers).
    fn geometries(batch: usize) -> Vec<ConvGeometry> {
        [224usize, 221, 218]
            .iter()
            .map(|&s| geometry(batch, 32, 32, &[s, s], &[4, 4], 0))
            .collect()
    }

    fn new(batch: usize) -> Net {
        let geoms = Net::geometries(batch);
        let mut acts = vec![uniform(10, geoms[0].x_len())];
        acts.extend(geoms.iter().map(|g| vec![0f32; g.y_len()]));
        let mut grads: Vec<Vec<f32>> = geoms.iter().map(|g| vec![0f32; g.x_len()]).collect();
        grads.push(uniform(11, geoms[2].y_len()));
        Net {
            w: geoms
                .iter()
                .enumerate()
                .map(|(i, g)| uniform(20 + i as u64, g.w_len()))
                .collect(),
            dw: geoms.iter().map(|g| vec![0f32; g.w_len()]).collect(),
            geoms,
            acts,
            grads,
            step: 0,
        }
    }

    fn forward(&mut self, e: &mut Engine) {
        for i in 0..3 {
            let (head, tail) = self.acts.split_at_mut(i + 1);
            let (x, y) = (&head[i], &mut tail[0]);
            match e {
                Engine::Winograd(p) => p[i].forward(x, &self.w[i], y).expect("fwd"),
                Engine::ConvOps(ws) => forward(
                    &self.geoms[i],
                    x,
                    &self.w[i],
                    None,
                    false,
                    y,
                    ForwardAlgo::Convgemm,
                    ws,
                )
                .expect("fwd"),
            }
        }
    }

    /// Forward, then backward-filter and backward-data of every layer; the weights change a little
    /// every step (as an optimizer step would), so cached kernel transforms are recomputed.
    fn train_step(&mut self, e: &mut Engine) {
        self.step += 1;
        let nudge = if self.step.is_multiple_of(2) {
            1e-3
        } else {
            -1e-3
        };
        for w in &mut self.w {
            w[0] += nudge;
        }
        self.forward(e);
        for i in (0..3).rev() {
            let g = &self.geoms[i];
            let (head, tail) = self.grads.split_at_mut(i + 1);
            let (dx, dy) = (&mut head[i], &tail[0]);
            let x = &self.acts[i];
            match e {
                Engine::Winograd(p) => {
                    p[i].backward_filter(x, dy, &mut self.dw[i])
                        .expect("bwd-filter");
                    p[i].backward_data(dy, &self.w[i], dx).expect("bwd-data");
                }
                Engine::ConvOps(ws) => {
                    backward_filter(
                        g,
                        x,
                        dy,
                        &mut self.dw[i],
                        BackwardFilterAlgo::ConvgemmTrans,
                        ws,
                    )
                    .expect("bwd-filter");
                    backward_data(g, dy, &self.w[i], dx, BackwardDataAlgo::Deconvgemm, ws)
                        .expect("bwd-data");
                }
            }
        }
    }
}

/// Times `iters` calls of `f`, keeping the per-call time of the sample for the median.
fn timed(iters: u64, samples: &mut Vec<f64>, mut f: impl FnMut()) -> Duration {
    let t0 = Instant::now();
    for _ in 0..iters {
        f();
    }
    let d = t0.elapsed();
    samples.push(d.as_secs_f64() / iters as f64);
    d
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// The paper's benchmark: forward and training step, batch 1, 20 and (only when named) 200.
fn bench_paper(c: &mut Criterion, pools: &[(usize, rayon::ThreadPool)]) {
    for batch in [1usize, 20, 200] {
        let name = format!("paper_4x4_c32_224_b{batch}");
        if !wanted(&name) || (batch > 20 && !named(&name)) {
            continue;
        }
        // Built on first use, so a filtered run that skips these cases does not allocate them.
        let geoms = Net::geometries(batch);
        let fwd_flops: u64 = geoms.iter().map(|g| g.flops()).sum();
        let mut net: Option<Net> = None;
        let mut group = c.benchmark_group(flop_group(&format!("winograd/{name}")));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(match batch {
                1 => 2,
                20 => 5,
                _ => 30,
            }));
        for (t, pool) in pools {
            if quick() && batch > 1 && *t == 1 {
                continue;
            }
            let mut engines = vec![(
                "winograd",
                Engine::Winograd(
                    geoms
                        .iter()
                        .map(|g| WinogradPlan::new(g, None).expect("plan"))
                        .collect(),
                ),
            )];
            if batch == 1 || !quick() {
                engines.push(("conv-ops", Engine::ConvOps(Workspace::new(false))));
            }
            for (algo, mut engine) in engines {
                for pass in ["fwd", "train"] {
                    // As nn uses the plans: kernel transforms kept for inference, not while
                    // training (the weights change every step, so a kept transform never hits).
                    if let Engine::Winograd(plans) = &mut engine {
                        for p in plans {
                            p.set_keep_kernels(pass == "fwd");
                        }
                    }
                    let flops = if pass == "fwd" {
                        fwd_flops
                    } else {
                        3 * fwd_flops
                    };
                    group.throughput(Throughput::Elements(flops));
                    let case = format!("{pass}/{algo}/t{t}");
                    let mut samples = Vec::new();
                    group.bench_function(&case, |b| {
                        pool.install(|| {
                            b.iter_custom(|iters| {
                                let net = net.get_or_insert_with(|| Net::new(batch));
                                timed(iters, &mut samples, || {
                                    if pass == "fwd" {
                                        net.forward(&mut engine)
                                    } else {
                                        net.train_step(&mut engine)
                                    }
                                })
                            })
                        })
                    });
                    let secs = median(&mut samples);
                    if secs.is_finite() && secs > 0.0 {
                        let images = batch as f64 / secs;
                        let bench = format!("winograd/{name}");
                        emit_record(&bench, &case, "images_per_s", images, "images/s")
                            .expect("bench record");
                        emit_record(
                            &bench,
                            &case,
                            "megavoxels_per_s",
                            images * (224.0 * 224.0) / 1e6,
                            "Mvoxel/s",
                        )
                        .expect("bench record");
                    }
                }
            }
        }
        group.finish();
        black_box(net.as_ref().map(|n| &n.acts));
    }
}

fn bench(c: &mut Criterion) {
    let pools = thread_pools();
    bench_paper(c, &pools);
    bench_layers(c, &pools);
}

criterion_group!(benches, bench);
criterion_main!(benches);
