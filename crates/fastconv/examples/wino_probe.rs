//! Probes for tuning on a new machine (session 11): the cost model's tile under panel widths 16
//! and 32, an A/B of block sizes and tiles per pass (wall time, alternating rounds, the rayon
//! pool's threads: set `RAYON_NUM_THREADS=1` for one thread), and the accuracy figures of the
//! project's goals.
//!
//! `cargo run --release -p fastconv --example wino_probe -- tiles`
//! `... -- blocks LAYER ROUNDS VARIANT...` (LAYER: any of `tiles`' layers, `MORE=1`'s too), a variant `BLOCK` or `BLOCK:TILE` (`0` = the default
//! block, e.g. `0 96 0:4x4`); `REPS` calls per timing (3), `FWD_ONLY=1` skips the backward passes,
//! `KEEP=0` transforms the kernels on every call (as in training), `CPU=1` times on the thread's CPU clock instead of the wall clock (this guest's steal is not
//! in it; at one thread every pass runs on the calling thread).
//! `... -- plans [ROUNDS]`: plan-creation time per layer (first and second plan, `choose_tile`).
//! `... -- chain [ROUNDS]`: the paper benchmark's forward, its three layers chained as in the
//! bench, batch `B` (20), ms per call (the pool's threads as above).
//! `... -- acc`: F(4,3) and F(6,3) in 2-D against an f64 direct sum (the layer of
//! `tests/plan.rs`'s `accuracy_goals_f4_f6`).

use std::hint::black_box;
use std::time::Instant;

/// A start time and the milliseconds since it: the wall clock, or with `CPU=1` the calling
/// thread's CPU clock.
#[derive(Clone, Copy)]
enum Clock {
    Wall(Instant),
    Cpu(cpu_time::ThreadTime),
}

impl Clock {
    fn now() -> Clock {
        if std::env::var("CPU").is_ok_and(|v| v == "1") {
            Clock::Cpu(cpu_time::ThreadTime::now())
        } else {
            Clock::Wall(Instant::now())
        }
    }

    fn ms(self) -> f64 {
        match self {
            Clock::Wall(t) => t.elapsed().as_secs_f64() * 1e3,
            Clock::Cpu(t) => t.elapsed().as_secs_f64() * 1e3,
        }
    }
}

use conv_ops::{ConvGeometry, testing::uniform};
use fastconv::{CostModel, WinogradPlan, choose_tile};

/// A probe layer: batch `n`, `c` → `k` channels, input `i`, kernel `r`, padding `p` on every side.
fn g(n: usize, c: usize, k: usize, i: &[usize], r: &[usize], p: usize) -> ConvGeometry {
    ConvGeometry::new(n, c, k, i, r)
        .and_then(|g| g.with_padding(&[p]))
        .unwrap()
}

fn layers() -> Vec<(&'static str, ConvGeometry)> {
    vec![
        ("paper1_b1", g(1, 32, 32, &[224, 224], &[4, 4], 0)),
        ("paper2_b1", g(1, 32, 32, &[221, 221], &[4, 4], 0)),
        ("paper3_b1", g(1, 32, 32, &[218, 218], &[4, 4], 0)),
        // The paper layer's planes are 49 × 4 KiB apart; 225² and 223² are not (same tile grid).
        ("paper1_225_b1", g(1, 32, 32, &[225, 225], &[4, 4], 0)),
        ("paper1_223_b1", g(1, 32, 32, &[223, 223], &[4, 4], 0)),
        ("paper1_b20", g(20, 32, 32, &[224, 224], &[4, 4], 0)),
        ("r50_64", g(8, 64, 64, &[56, 56], &[3, 3], 1)),
        ("r50_128", g(8, 128, 128, &[28, 28], &[3, 3], 1)),
        ("r50_256", g(8, 256, 256, &[14, 14], &[3, 3], 1)),
        ("r50_512", g(8, 512, 512, &[7, 7], &[3, 3], 1)),
        ("c3d", g(1, 64, 64, &[8, 56, 56], &[3, 3, 3], 1)),
    ]
}

/// More layers for `tiles` (`MORE=1`): ResNet-20 (b64), VGG-16 (b8), C3D-like 3-D layers.
fn more_layers() -> Vec<(&'static str, ConvGeometry)> {
    vec![
        ("r20_16", g(64, 16, 16, &[32, 32], &[3, 3], 1)),
        ("r20_32", g(64, 32, 32, &[16, 16], &[3, 3], 1)),
        ("r20_64", g(64, 64, 64, &[8, 8], &[3, 3], 1)),
        ("vgg_3", g(8, 3, 64, &[224, 224], &[3, 3], 1)),
        ("vgg_64", g(8, 64, 64, &[224, 224], &[3, 3], 1)),
        ("vgg_128", g(8, 128, 128, &[112, 112], &[3, 3], 1)),
        ("vgg_256", g(8, 256, 256, &[56, 56], &[3, 3], 1)),
        ("vgg_512a", g(8, 512, 512, &[28, 28], &[3, 3], 1)),
        ("vgg_512b", g(8, 512, 512, &[14, 14], &[3, 3], 1)),
        // CIFAR-size VGG-16's last layers (32² input): 512@4², batch 64.
        ("vgg_512c", g(64, 512, 512, &[4, 4], &[3, 3], 1)),
        ("c3d_3", g(2, 3, 64, &[16, 112, 112], &[3, 3, 3], 1)),
        ("c3d_128", g(2, 64, 128, &[8, 56, 56], &[3, 3, 3], 1)),
        ("c3d_256", g(2, 128, 256, &[4, 28, 28], &[3, 3, 3], 1)),
        ("c3d_512", g(2, 256, 512, &[4, 14, 14], &[3, 3, 3], 1)),
        ("c3d_512s", g(2, 512, 512, &[4, 7, 7], &[3, 3, 3], 1)),
        ("c3d_b8", g(8, 64, 64, &[8, 56, 56], &[3, 3, 3], 1)),
    ]
}

/// The probe layer `name`, from [`layers`] or [`more_layers`].
fn layer(name: &str) -> ConvGeometry {
    layers()
        .into_iter()
        .chain(more_layers())
        .find(|(n, _)| *n == name)
        .unwrap()
        .1
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mr, nr) = core_blas::Gemm::global().unwrap().tile();
    println!("gemm tile {mr}x{nr}");
    match args.get(1).map(String::as_str) {
        Some("tiles") => {
            let mut all = layers();
            if std::env::var("MORE").is_ok_and(|v| v == "1") {
                all.extend(more_layers());
            }
            for (name, g) in all {
                let mut row = format!("{name:12}");
                for w in [16usize, 32] {
                    let m = CostModel {
                        vector_width: w,
                        ..CostModel::default()
                    };
                    row += &format!(" w{w}: {:?}", choose_tile(&g, &m).unwrap());
                }
                // `GW=0,25,100`: the tiles under other gather weights (vector width 16).
                for gw in std::env::var("GW").unwrap_or_default().split(',') {
                    let Ok(gw) = gw.parse::<f64>() else { continue };
                    let m = CostModel {
                        gather_weight: gw,
                        ..CostModel::default()
                    };
                    row += &format!(" gw{gw}: {:?}", choose_tile(&g, &m).unwrap());
                }
                println!("{row}");
            }
        }
        Some("plans") => {
            // Plan creation: each layer's `WinogradPlan::new` (tile by the cost model) twice in a
            // row, and `choose_tile` alone, in ms on the chosen clock; `ROUNDS` passes over the
            // layers (the first pass's first plans pay any process-wide one-time work).
            let rounds: usize = args.get(2).map_or(1, |s| s.parse().unwrap());
            for round in 0..rounds {
                let all = Clock::now();
                for (name, g) in layers() {
                    let s = Clock::now();
                    let p1 = WinogradPlan::new(&g, None).unwrap();
                    let t1 = s.ms();
                    let s = Clock::now();
                    let p2 = WinogradPlan::new(&g, None).unwrap();
                    let t2 = s.ms();
                    let s = Clock::now();
                    let tile = choose_tile(&g, &CostModel::default()).unwrap();
                    let tc = s.ms();
                    black_box((&p1, &p2, &tile));
                    println!(
                        "round {round} {name:14} tile {:?} new {t1:.3} ms, again {t2:.3} ms, choose_tile {tc:.3} ms",
                        p1.tile()
                    );
                }
                println!("round {round} all layers {:.3} ms", all.ms());
            }
        }
        Some("cost") => {
            // The cost model's estimate for each tile given: `cost LAYER 6x6 3x6 ...`, and its
            // choice; `TW`, `BW`, `GW`, `CW`, `VW` override the model's transform, byte, gather and
            // copy weights and vector width.
            let g = layer(&args[2]);
            let env = |k: &str, d: f64| std::env::var(k).map_or(d, |v| v.parse().unwrap());
            let d = CostModel::default();
            let model = CostModel {
                transform_weight: env("TW", d.transform_weight),
                byte_weight: env("BW", d.byte_weight),
                gather_weight: env("GW", d.gather_weight),
                copy_weight: env("CW", d.copy_weight),
                vector_width: env("VW", d.vector_width as f64) as usize,
                ..d
            };
            for t in &args[3..] {
                let m: Vec<usize> = t.split('x').map(|v| v.parse().unwrap()).collect();
                let c = fastconv::cost::tile_cost(&g, &m, &model).unwrap();
                println!("{t:8} {c:.4e}");
            }
            println!("choice {:?}", choose_tile(&g, &model).unwrap());
        }
        Some("blocks") => {
            let name = &args[2];
            let rounds: usize = args[3].parse().unwrap();
            // Each variant: BLOCK (0 = default), BLOCK:TILE (e.g. 0:4x4; `0:-`: the model's) or
            // BLOCK:TILE:FILTER_TILE (backward-filter's m′ of F(r, m′); `0:-:3x3`).
            type Spec = (usize, Option<Vec<usize>>, Option<Vec<usize>>);
            let specs: Vec<Spec> = args[4..]
                .iter()
                .map(|s| {
                    let mut it = s.split(':');
                    let b = it.next().unwrap().parse().unwrap();
                    let mut tile = || {
                        it.next()
                            .filter(|t| *t != "-")
                            .map(|t| t.split('x').map(|v| v.parse().unwrap()).collect())
                    };
                    let t = tile();
                    (b, t, tile())
                })
                .collect();
            let g = layer(name);
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
            let mut plans: Vec<WinogradPlan> = specs
                .iter()
                .map(|(b, tile, ftile)| {
                    let b = *b;
                    let mut p = WinogradPlan::new(&g, tile.as_deref()).unwrap();
                    if let Some(f) = ftile {
                        p = WinogradPlan::with_filter_tile(&g, p.tile(), f).unwrap();
                    }
                    if b > 0 {
                        p.set_block_tiles(b).unwrap();
                    }
                    // `KEEP=0`: the kernels transformed on every call, as in training.
                    if std::env::var("KEEP").is_ok_and(|v| v == "0") {
                        p.set_keep_kernels(false);
                    }
                    p
                })
                .collect();
            println!("{name}");
            let reps = std::env::var("REPS").map_or(3, |s| s.parse().unwrap());
            let only_fwd = std::env::var("FWD_ONLY").is_ok();
            // [plan][pass] samples
            let mut t = vec![vec![Vec::new(); 3]; plans.len()];
            for _ in 0..rounds {
                for (i, p) in plans.iter_mut().enumerate() {
                    p.forward(&x, &w, &mut y).unwrap();
                    let s = Clock::now();
                    for _ in 0..reps {
                        p.forward(black_box(&x), &w, &mut y).unwrap();
                    }
                    t[i][0].push(s.ms() / reps as f64);
                    if only_fwd {
                        t[i][1].push(0.0);
                        t[i][2].push(0.0);
                        continue;
                    }
                    p.backward_data(&dy, &w, &mut dx).unwrap();
                    let s = Clock::now();
                    for _ in 0..reps {
                        p.backward_data(black_box(&dy), &w, &mut dx).unwrap();
                    }
                    t[i][1].push(s.ms() / reps as f64);
                    let s = Clock::now();
                    for _ in 0..reps {
                        p.backward_filter(black_box(&x), &dy, &mut dw).unwrap();
                    }
                    t[i][2].push(s.ms() / reps as f64);
                }
            }
            for (i, (b, _, _)) in specs.iter().enumerate() {
                let mut row = format!(
                    "block {b:5} tile {:?} filter {:?}",
                    plans[i].tile(),
                    plans[i].filter_tile()
                );
                for (j, pass) in ["fwd", "bwd-data", "bwd-filter"].iter().enumerate() {
                    let v = &mut t[i][j];
                    v.sort_by(f64::total_cmp);
                    row += &format!("  {pass} min {:.3} med {:.3}", v[0], v[v.len() / 2]);
                }
                println!("{row}");
            }
            black_box((&y, &dx, &dw));
        }
        Some("chain") => {
            // The paper benchmark's forward as the bench runs it (benches/winograd.rs
            // `Net::forward`): its three layers chained, batch `B` (20), kernels kept; `ROUNDS`
            // calls, each call's ms and its layers', then the minimum and median call.
            let rounds: usize = args.get(2).map_or(10, |s| s.parse().unwrap());
            let batch: usize = std::env::var("B").map_or(20, |s| s.parse().unwrap());
            let geoms: Vec<ConvGeometry> = [224usize, 221, 218]
                .iter()
                .map(|&s| g(batch, 32, 32, &[s, s], &[4, 4], 0))
                .collect();
            let mut acts = vec![uniform(10, geoms[0].x_len())];
            acts.extend(geoms.iter().map(|g| vec![0f32; g.y_len()]));
            let w: Vec<Vec<f32>> = geoms
                .iter()
                .enumerate()
                .map(|(i, g)| uniform(20 + i as u64, g.w_len()))
                .collect();
            let mut plans: Vec<WinogradPlan> = geoms
                .iter()
                .map(|g| WinogradPlan::new(g, None).unwrap())
                .collect();
            let mut calls = Vec::new();
            for r in 0..rounds {
                let s = Clock::now();
                let mut per = [0f64; 3];
                for (i, plan) in plans.iter_mut().enumerate() {
                    let (head, tail) = acts.split_at_mut(i + 1);
                    let l = Clock::now();
                    plan.forward(&head[i], &w[i], &mut tail[0]).unwrap();
                    per[i] = l.ms();
                }
                let ms = s.ms();
                calls.push(ms);
                println!(
                    "round {r} {ms:.2} ms, layers {:.2} {:.2} {:.2}",
                    per[0], per[1], per[2]
                );
            }
            calls.sort_by(f64::total_cmp);
            println!(
                "chain b{batch}: min {:.2} med {:.2} ms",
                calls[0],
                calls[calls.len() / 2]
            );
            black_box(&acts);
        }
        Some("acc") => {
            // As tests/plan.rs accuracy_goals_f4_f6, printing the figures.
            let g = ConvGeometry::new(1, 64, 8, &[24, 24], &[3, 3])
                .and_then(|g| g.with_padding(&[1]))
                .unwrap();
            let x = uniform(11, g.x_len());
            let w = uniform(12, g.w_len());
            let mut y_ref = vec![0.0f32; g.y_len()];
            // f64 reference, direct.
            let (c, k, n) = (64usize, 8usize, 24usize);
            let mut r64 = vec![0f64; g.y_len()];
            for ko in 0..k {
                for oy in 0..n {
                    for ox in 0..n {
                        let mut acc = 0f64;
                        for ci in 0..c {
                            for i in 0..3 {
                                for j in 0..3 {
                                    let (iy, ix) = (oy + i, ox + j);
                                    if iy < 1 || ix < 1 || iy > n || ix > n {
                                        continue;
                                    }
                                    acc += x[(ci * n + iy - 1) * n + ix - 1] as f64
                                        * w[((ko * c + ci) * 3 + i) * 3 + j] as f64;
                                }
                            }
                        }
                        r64[(ko * n + oy) * n + ox] = acc;
                    }
                }
            }
            conv_ops::reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
            let scale = r64.iter().fold(0f64, |a, v| a.max(v.abs()));
            for m in [4usize, 6] {
                let mut plan = WinogradPlan::new(&g, Some(&[m])).unwrap();
                let mut y = vec![0.0; g.y_len()];
                plan.forward(&x, &w, &mut y).unwrap();
                let e = y
                    .iter()
                    .zip(&r64)
                    .fold(0f64, |a, (p, q)| a.max((*p as f64 - q).abs()))
                    / scale;
                let er = y_ref
                    .iter()
                    .zip(&r64)
                    .fold(0f64, |a, (p, q)| a.max((*p as f64 - q).abs()))
                    / scale;
                println!("F({m},3) 2-D: max err / max|y| = {e:.3e} (f32 reference: {er:.3e})");
            }
        }
        _ => eprintln!(
            "usage: wino_probe tiles | blocks LAYER ROUNDS B... | plans | cost | chain | acc"
        ),
    }
}
