//! WinogradPlan against conv-ops' naive f64-accumulating reference: forward, backward-data,
//! backward-filter on random 1-D, 2-D and 3-D geometries with odd sizes, asymmetric padding and
//! per-dimension tiles; plus the adjoint identities and the refusals.

use conv_ops::ConvGeometry;
use conv_ops::reference;
use conv_ops::testing::{dot, max_rel_error, uniform};
use fastconv::{CostModel, FastconvError, GemmPath, WinogradPlan, choose_tile};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Winograd's error relative to max|y| grows with α and with the number of summed products.
/// Every tile used here has α ≤ 8, whose tabulated 2-D error is ≤ 2e-5 for one channel; channel
/// sums of ≤ 6·4³ terms add the usual √terms·ε. 2e-4 is above both by a margin and far below the
/// O(1) error of any indexing mistake.
const TOL: f64 = 2e-4;

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

fn random_case(rng: &mut SmallRng) -> (ConvGeometry, Vec<usize>, Vec<usize>) {
    loop {
        let rank = rng.random_range(1..=3);
        let max_in = [0, 19, 11, 7][rank];
        let input: Vec<usize> = (0..rank).map(|_| rng.random_range(1..=max_in)).collect();
        let kernel: Vec<usize> = (0..rank).map(|_| rng.random_range(1..=4)).collect();
        let pb: Vec<usize> = kernel.iter().map(|&r| rng.random_range(0..=r)).collect();
        let pa: Vec<usize> = kernel.iter().map(|&r| rng.random_range(0..=r)).collect();
        let (n, c, k) = (
            rng.random_range(1..=2),
            rng.random_range(1..=6),
            rng.random_range(1..=5),
        );
        let Ok(g) = ConvGeometry::new(n, c, k, &input, &kernel)
            .and_then(|g| g.with_padding_per_side(&pb, &pa))
        else {
            continue;
        };
        // m ≤ 6 with α = m + r − 1 ≤ 8.
        let tile: Vec<usize> = kernel
            .iter()
            .map(|&r| rng.random_range(1..=(9 - r).min(6)))
            .collect();
        let ftile: Vec<usize> = kernel
            .iter()
            .map(|&r| rng.random_range(1..=(9 - r).min(6)))
            .collect();
        return (g, tile, ftile);
    }
}

#[test]
fn three_passes_match_reference_on_random_geometries() {
    let mut rng = SmallRng::seed_from_u64(2024);
    for case in 0..60 {
        let (g, tile, ftile) = random_case(&mut rng);
        let mut plan = WinogradPlan::with_filter_tile(&g, &tile, &ftile).unwrap();
        let x = uniform(case, g.x_len());
        let w = uniform(case + 1000, g.w_len());
        let dy = uniform(case + 2000, g.y_len());
        let ctx = format!("case {case}: {g:?} tile {tile:?} filter tile {ftile:?}");

        let mut y = vec![f32::NAN; g.y_len()];
        plan.forward(&x, &w, &mut y).unwrap();
        let mut y_ref = vec![0.0; g.y_len()];
        reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
        let e = max_rel_error(&y, &f64s(&y_ref));
        assert!(e <= TOL, "forward {e:.2e} {ctx}");

        let mut dx = vec![f32::NAN; g.x_len()];
        plan.backward_data(&dy, &w, &mut dx).unwrap();
        let mut dx_ref = vec![0.0; g.x_len()];
        reference::backward_data(&g, &dy, &w, &mut dx_ref).unwrap();
        let e = max_rel_error(&dx, &f64s(&dx_ref));
        assert!(e <= TOL, "backward-data {e:.2e} {ctx}");

        let mut dw = vec![f32::NAN; g.w_len()];
        plan.backward_filter(&x, &dy, &mut dw).unwrap();
        let mut dw_ref = vec![0.0; g.w_len()];
        reference::backward_filter(&g, &x, &dy, &mut dw_ref).unwrap();
        let e = max_rel_error(&dw, &f64s(&dw_ref));
        assert!(e <= TOL, "backward-filter {e:.2e} {ctx}");

        // ⟨conv(x, w), dy⟩ = ⟨x, backward_data(dy, w)⟩ = ⟨w, backward_filter(x, dy)⟩.
        let (a, b, c) = (dot(&y, &dy), dot(&x, &dx), dot(&w, &dw));
        let scale = a.abs().max(1.0) * 1e-3;
        assert!(
            (a - b).abs() <= scale && (a - c).abs() <= scale,
            "adjoint {a} {b} {c} {ctx}"
        );
    }
}

/// Several tile blocks, several threads' worth of blocks, and the kernel cache invalidated when
/// the weights change.
#[test]
fn blocking_and_kernel_cache() {
    let g = ConvGeometry::new(3, 4, 5, &[13, 10], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let mut plan = WinogradPlan::new(&g, Some(&[4, 2])).unwrap();
    plan.set_block_tiles(7).unwrap();
    let x = uniform(1, g.x_len());
    let mut w = uniform(2, g.w_len());
    let mut y_ref = vec![0.0; g.y_len()];
    let mut y = vec![0.0; g.y_len()];
    let dy = uniform(3, g.y_len());
    let (mut dx, mut dx_ref) = (vec![0.0; g.x_len()], vec![0.0; g.x_len()]);
    for round in 0..3 {
        plan.forward(&x, &w, &mut y).unwrap();
        reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
        let e = max_rel_error(&y, &f64s(&y_ref));
        assert!(e <= TOL, "round {round}: {e:.2e}");
        // Backward-data's transform (the flipped kernel) shares the plan's buffers with the
        // forward's: both must follow the weights.
        plan.backward_data(&dy, &w, &mut dx).unwrap();
        reference::backward_data(&g, &dy, &w, &mut dx_ref).unwrap();
        let e = max_rel_error(&dx, &f64s(&dx_ref));
        assert!(e <= TOL, "round {round}, backward-data: {e:.2e}");
        w[round * 5] += 0.5; // weights change: the cached transform must be recomputed
    }
    let (mut dw, mut dw_ref) = (vec![0.0; g.w_len()], vec![0.0; g.w_len()]);
    plan.backward_filter(&x, &dy, &mut dw).unwrap();
    reference::backward_filter(&g, &x, &dy, &mut dw_ref).unwrap();
    assert!(max_rel_error(&dw, &f64s(&dw_ref)) <= TOL);
}

/// The accuracy goals of the project on a layer-sized 2-D problem: F(4,3) within 1e-5 and F(6,3)
/// within 1e-4 of max|y| against the f64-accumulated reference (64 channels).
#[test]
fn accuracy_goals_f4_f6() {
    let g = ConvGeometry::new(1, 64, 8, &[24, 24], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let x = uniform(11, g.x_len());
    let w = uniform(12, g.w_len());
    let mut y_ref = vec![0.0; g.y_len()];
    reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
    for (m, goal) in [(4usize, 1e-5), (6, 1e-4)] {
        let mut plan = WinogradPlan::new(&g, Some(&[m])).unwrap();
        let mut y = vec![0.0; g.y_len()];
        plan.forward(&x, &w, &mut y).unwrap();
        let e = max_rel_error(&y, &f64s(&y_ref));
        assert!(e <= goal, "F({m},3): {e:.2e} > {goal:.0e}");
    }
}

#[test]
fn unsupported_and_bad_arguments() {
    let g = ConvGeometry::new(1, 2, 2, &[8, 8], &[3, 3]).unwrap();
    let strided = g.with_stride(&[2]).unwrap();
    assert!(matches!(
        WinogradPlan::new(&strided, None),
        Err(FastconvError::Unsupported { arg: "stride", .. })
    ));
    let dilated = g.with_dilation(&[2]).unwrap();
    assert!(matches!(
        WinogradPlan::new(&dilated, None),
        Err(FastconvError::Unsupported {
            arg: "dilation",
            ..
        })
    ));
    let grouped = g.with_groups(2).unwrap();
    assert!(matches!(
        WinogradPlan::new(&grouped, None),
        Err(FastconvError::Unsupported { arg: "groups", .. })
    ));
    assert!(matches!(
        WinogradPlan::new(&g, Some(&[2, 2, 2])),
        Err(FastconvError::Rank { arg: "tile", .. })
    ));
    assert!(matches!(
        WinogradPlan::new(&g, Some(&[0])),
        Err(FastconvError::Zero { arg: "tile" })
    ));
    let mut plan = WinogradPlan::new(&g, Some(&[2])).unwrap();
    let mut y = vec![0.0; g.y_len()];
    assert!(matches!(
        plan.forward(&[0.0; 3], &vec![0.0; g.w_len()], &mut y),
        Err(FastconvError::BufferLength { arg: "x", .. })
    ));
    assert!(matches!(
        plan.set_block_tiles(0),
        Err(FastconvError::Zero { arg: "tiles" })
    ));
}

#[test]
fn cost_model_choices() {
    let model = CostModel::default();
    // A VGG-like 3×3 layer: a real Winograd tile (m ≥ 2) in both dimensions.
    let g = ConvGeometry::new(8, 128, 128, &[56, 56], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let t = choose_tile(&g, &model).unwrap();
    assert!(t.iter().all(|&m| (2..=8).contains(&m)), "{t:?}");
    // The paper's 32-channel 4×4 layer: F(6, 4) (α = 9, within the default budget; its ± row
    // pairs make it the cheapest), and every tile within a 2e-5 budget is smaller.
    let paper = ConvGeometry::new(1, 32, 32, &[224, 224], &[4, 4]).unwrap();
    assert_eq!(choose_tile(&paper, &model).unwrap(), vec![6, 6]);
    // Its second layer (218² out: 37 tiles of 6 or 73 of 3 per row): 6×6 as well (3×6 and
    // 6×3 measured 4-17 % slower).
    let paper2 = ConvGeometry::new(1, 32, 32, &[221, 221], &[4, 4]).unwrap();
    assert_eq!(choose_tile(&paper2, &model).unwrap(), vec![6, 6]);
    // ResNet-50's 3×3 layers (batch 8): tiles that differ per dimension, the larger m along
    // the outer dimension (session 22, three passes, CPU time, alternating in one process:
    // 7×4 on 128@28² 10-12 % faster than 4×4, 7×5 on 256@14² 10-14 % faster than 7×7, 7×2 on
    // 512@7² 12 % faster than 4×4; session 23: 7×4 on 64@56², 11 % faster than 4×4 in
    // session 22's grid, once the model counts the phased gathers' phantom tiles).
    for (c, hw, tile) in [
        (64, 56, [7, 4]),
        (128, 28, [7, 4]),
        (256, 14, [7, 5]),
        (512, 7, [7, 2]),
    ] {
        let g = ConvGeometry::new(8, c, c, &[hw, hw], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        assert_eq!(choose_tile(&g, &model).unwrap(), tile.to_vec(), "{c}@{hw}²");
    }
    // C3D's 64→64 layer at batch 1: 4×7×4 (session 22: 2 % faster than 4×4×4 over the three
    // passes, 4×4×7 7 % slower).
    let c3d = ConvGeometry::new(1, 64, 64, &[8, 56, 56], &[3, 3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    assert_eq!(choose_tile(&c3d, &model).unwrap(), vec![4, 7, 4]);
    let tight = CostModel {
        max_error: 2e-5,
        ..model
    };
    let tp = choose_tile(&paper, &tight).unwrap();
    assert!(tp.iter().all(|&m| m < 6), "{tp:?}");
    // 1×1 kernels: nothing to gain, m = 1.
    let g1 = ConvGeometry::new(8, 64, 64, &[14, 14], &[1, 1]).unwrap();
    assert_eq!(choose_tile(&g1, &model).unwrap(), vec![1, 1]);
    // A tighter accuracy budget never picks a larger tile.
    let strict = CostModel {
        max_error: 3e-6,
        ..model
    };
    let ts = choose_tile(&g, &strict).unwrap();
    assert!(ts.iter().zip(&t).all(|(a, b)| a <= b), "{ts:?} vs {t:?}");
    // 3-D: a plan from the model runs.
    let g3 = ConvGeometry::new(1, 4, 4, &[6, 9, 7], &[3, 3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let mut plan = WinogradPlan::new(&g3, None).unwrap();
    let (x, w) = (uniform(5, g3.x_len()), uniform(6, g3.w_len()));
    let (mut y, mut y_ref) = (vec![0.0; g3.y_len()], vec![0.0; g3.y_len()]);
    plan.forward(&x, &w, &mut y).unwrap();
    reference::forward(&g3, &x, &w, None, &mut y_ref).unwrap();
    assert!(
        max_rel_error(&y, &f64s(&y_ref)) <= TOL,
        "tile {:?}",
        plan.tile()
    );
}

/// Thread pools of 1 to 3 threads on batches that take the image-parallel path (batch a multiple
/// of the threads) and the wave path (batch 1, or not a multiple and small): same results as the
/// reference, forward and backward-data (which share the tiled executor) and backward-filter.
/// Planes of many tiles (blocks within an image) and of 2-4 tiles (blocks of 5 tiles straddling
/// images, in a thread's range of images and across the ranges' ends).
#[test]
fn thread_counts_and_batch_splits() {
    let mut rng = SmallRng::seed_from_u64(99);
    let cases = [(1, 3), (2, 1), (2, 4), (3, 4), (3, 6), (2, 9)];
    for ((threads, batch), small) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
        let dims = if small {
            [rng.random_range(3..=5), 3]
        } else {
            [rng.random_range(9..=17), 13]
        };
        let g = ConvGeometry::new(batch, 3, 4, &dims, &[3, 2])
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let (x, w, dy) = (
            uniform(1, g.x_len()),
            uniform(2, g.w_len()),
            uniform(3, g.y_len()),
        );
        let mut plan = WinogradPlan::new(&g, Some(&[3, 2])).unwrap();
        plan.set_block_tiles(5).unwrap();
        let (mut y, mut dx, mut dw) = (
            vec![f32::NAN; g.y_len()],
            vec![f32::NAN; g.x_len()],
            vec![f32::NAN; g.w_len()],
        );
        pool.install(|| {
            plan.forward(&x, &w, &mut y).unwrap();
            plan.backward_data(&dy, &w, &mut dx).unwrap();
            plan.backward_filter(&x, &dy, &mut dw).unwrap();
        });
        let ctx = format!("{threads} threads, batch {batch}, input {dims:?}");
        let mut y_ref = vec![0.0; g.y_len()];
        reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
        assert!(max_rel_error(&y, &f64s(&y_ref)) <= TOL, "forward {ctx}");
        let mut dx_ref = vec![0.0; g.x_len()];
        reference::backward_data(&g, &dy, &w, &mut dx_ref).unwrap();
        assert!(
            max_rel_error(&dx, &f64s(&dx_ref)) <= TOL,
            "backward-data {ctx}"
        );
        let mut dw_ref = vec![0.0; g.w_len()];
        reference::backward_filter(&g, &x, &dy, &mut dw_ref).unwrap();
        assert!(
            max_rel_error(&dw, &f64s(&dw_ref)) <= TOL,
            "backward-filter {ctx}"
        );
    }
}

/// Layers with few tiles for the threads (each thread's share below the default block) run
/// with the threads splitting the output channels of each block instead of the images: on 2
/// and 3 threads, 1-D, 2-D and 3-D, channels that do not split evenly (and fewer output
/// channels than a micro-panel's rows, so a thread gets none), the default block and a set one;
/// forward and backward-data give the same bits as on one thread, and match the reference.
#[test]
fn few_tiles_split_output_channels() {
    // (batch, C, K, input, kernel, tile)
    type Case = (
        usize,
        usize,
        usize,
        &'static [usize],
        &'static [usize],
        &'static [usize],
    );
    let cases: [Case; 5] = [
        (2, 37, 21, &[11, 9], &[3, 3], &[4, 3]),
        (3, 5, 3, &[7, 6], &[3, 2], &[3, 2]),
        (1, 19, 40, &[23], &[3], &[4]),
        (2, 9, 13, &[5, 6, 5], &[3, 3, 3], &[2, 3, 2]),
        (4, 64, 24, &[6, 6], &[3, 3], &[4, 4]),
    ];
    for (case, &(batch, c, k, input, kernel, tile)) in cases.iter().enumerate() {
        let g = ConvGeometry::new(batch, c, k, input, kernel)
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        let (x, w, dy) = (
            uniform(case as u64, g.x_len()),
            uniform(case as u64 + 10, g.w_len()),
            uniform(case as u64 + 20, g.y_len()),
        );
        let mut y_ref = vec![0.0; g.y_len()];
        reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
        let mut dx_ref = vec![0.0; g.x_len()];
        reference::backward_data(&g, &dy, &w, &mut dx_ref).unwrap();
        for block in [None, Some(7)] {
            let mut first: Option<(Vec<u32>, Vec<u32>)> = None;
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut plan = WinogradPlan::new(&g, Some(tile)).unwrap();
                if let Some(b) = block {
                    plan.set_block_tiles(b).unwrap();
                }
                let (mut y, mut dx) = (vec![f32::NAN; g.y_len()], vec![f32::NAN; g.x_len()]);
                pool.install(|| {
                    plan.forward(&x, &w, &mut y).unwrap();
                    plan.backward_data(&dy, &w, &mut dx).unwrap();
                });
                let ctx = format!("case {case} {g:?} block {block:?} threads {threads}");
                assert!(max_rel_error(&y, &f64s(&y_ref)) <= TOL, "forward {ctx}");
                assert!(
                    max_rel_error(&dx, &f64s(&dx_ref)) <= TOL,
                    "backward-data {ctx}"
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                match &first {
                    None => first = Some((bits(&y), bits(&dx))),
                    Some((fy, fdx)) => {
                        assert!(*fy == bits(&y), "forward bits {ctx}");
                        assert!(*fdx == bits(&dx), "backward-data bits {ctx}");
                    }
                }
            }
        }
    }
}

/// Block buffers are kept per thread between calls and shared by all plans: a large plan, a
/// small one (shorter buffers holding the large one's values), and the large one again, each
/// against the reference on NaN-filled outputs.
#[test]
fn reused_buffers_across_plans() {
    let big = ConvGeometry::new(2, 6, 5, &[23, 19], &[4, 4])
        .unwrap()
        .with_padding(&[2])
        .unwrap();
    let small = ConvGeometry::new(1, 2, 3, &[7, 9], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let mut plans = [
        WinogradPlan::new(&big, Some(&[6, 5])).unwrap(),
        WinogradPlan::new(&small, Some(&[2, 4])).unwrap(),
    ];
    for (round, i) in [0usize, 1, 0, 1].into_iter().enumerate() {
        let g = *plans[i].geometry();
        let (x, w, dy) = (
            uniform(round as u64, g.x_len()),
            uniform(round as u64 + 10, g.w_len()),
            uniform(round as u64 + 20, g.y_len()),
        );
        let (mut y, mut dx) = (vec![f32::NAN; g.y_len()], vec![f32::NAN; g.x_len()]);
        plans[i].forward(&x, &w, &mut y).unwrap();
        plans[i].backward_data(&dy, &w, &mut dx).unwrap();
        let (mut y_ref, mut dx_ref) = (vec![0.0; g.y_len()], vec![0.0; g.x_len()]);
        reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
        reference::backward_data(&g, &dy, &w, &mut dx_ref).unwrap();
        assert!(
            max_rel_error(&y, &f64s(&y_ref)) <= TOL,
            "forward, round {round}"
        );
        assert!(
            max_rel_error(&dx, &f64s(&dx_ref)) <= TOL,
            "backward-data, round {round}"
        );
    }
}

/// `set_keep_kernels`: a plan that keeps its transformed kernels and one that transforms them
/// into the thread's shared buffer give bit-identical results in all three passes, both follow
/// a weight change, the setting switches back and forth (freeing what was kept), and the shared
/// buffers serve plans of different sizes in turn (larger and smaller layers interleaved, on 1
/// and 2 threads).
#[test]
fn kept_and_shared_kernels_agree() {
    let geoms = [
        ConvGeometry::new(2, 6, 5, &[23, 19], &[4, 4])
            .unwrap()
            .with_padding(&[2])
            .unwrap(),
        ConvGeometry::new(1, 3, 7, &[9, 8, 7], &[3, 2, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(1, 2, 3, &[7, 9], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
    ];
    let mut kept: Vec<WinogradPlan> = geoms
        .iter()
        .map(|g| WinogradPlan::new(g, None).unwrap())
        .collect();
    let mut shared = kept.clone();
    for p in &mut shared {
        assert!(p.keeps_kernels());
        p.set_keep_kernels(false);
        assert!(!p.keeps_kernels());
    }
    let mut ws: Vec<Vec<f32>> = geoms
        .iter()
        .enumerate()
        .map(|(i, g)| uniform(40 + i as u64, g.w_len()))
        .collect();
    let pool2 = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    // Plan order with big and small layers interleaved; every third round changes the weights.
    for (round, i) in [0usize, 2, 1, 0, 0, 1, 2, 2, 0, 1].into_iter().enumerate() {
        let g = geoms[i];
        if round % 3 == 2 {
            ws[i][round % g.w_len()] += 0.25;
        }
        // The shared plan of layer 1 switches its setting every round it runs.
        if i == 1 {
            let keep = !shared[1].keeps_kernels();
            shared[1].set_keep_kernels(keep);
        }
        let w = &ws[i];
        let x = uniform(round as u64, g.x_len());
        let dy = uniform(round as u64 + 100, g.y_len());
        let out = |p: &mut WinogradPlan| {
            let mut y = vec![f32::NAN; g.y_len()];
            let mut dx = vec![f32::NAN; g.x_len()];
            let mut dw = vec![f32::NAN; g.w_len()];
            p.forward(&x, w, &mut y).unwrap();
            p.backward_data(&dy, w, &mut dx).unwrap();
            p.backward_filter(&x, &dy, &mut dw).unwrap();
            (y, dx, dw)
        };
        let a = out(&mut kept[i]);
        let b = if round % 2 == 0 {
            out(&mut shared[i])
        } else {
            pool2.install(|| out(&mut shared[i]))
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.0), bits(&b.0), "forward, round {round}");
        assert_eq!(bits(&a.1), bits(&b.1), "backward-data, round {round}");
        assert_eq!(bits(&a.2), bits(&b.2), "backward-filter, round {round}");
        let mut y_ref = vec![0.0; g.y_len()];
        let mut dx_ref = vec![0.0; g.x_len()];
        let mut dw_ref = vec![0.0; g.w_len()];
        reference::forward(&g, &x, w, None, &mut y_ref).unwrap();
        reference::backward_data(&g, &dy, w, &mut dx_ref).unwrap();
        reference::backward_filter(&g, &x, &dy, &mut dw_ref).unwrap();
        assert!(
            max_rel_error(&b.0, &f64s(&y_ref)) <= TOL,
            "forward, round {round}"
        );
        assert!(
            max_rel_error(&b.1, &f64s(&dx_ref)) <= TOL,
            "backward-data, round {round}"
        );
        assert!(
            max_rel_error(&b.2, &f64s(&dw_ref)) <= TOL,
            "backward-filter, round {round}"
        );
        // What each plan holds between calls: a kept plan at least its transformed kernels
        // (α^N ≥ r^N values per weight, twice) and its weight copies; a shared one nothing.
        assert!(kept[i].kept_bytes() >= 4 * 4 * g.w_len(), "round {round}");
        let held = shared[i].kept_bytes();
        if shared[i].keeps_kernels() {
            assert!(held >= 4 * 4 * g.w_len(), "round {round}");
        } else {
            assert_eq!(held, 0, "round {round}");
        }
    }
    // Switching off frees what was kept.
    kept[0].set_keep_kernels(false);
    assert_eq!(kept[0].kept_bytes(), 0);
}

/// `release_workspaces`: after a large layer the per-thread workspaces hold at least its shared
/// transformed kernels; the release frees exactly what `workspace_bytes` counted (a private pool
/// of 2 threads, nothing else running in it), leaves 0, and the passes after it (the same layer
/// and a smaller one) give the same bits as before and match the reference; a smaller layer
/// then grows them to less than the large one held. Called outside any pool it frees at least
/// the calling thread's shared kernels.
#[test]
fn release_workspaces_frees_and_passes_stay_correct() {
    let big = ConvGeometry::new(2, 24, 32, &[21, 19], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let small = ConvGeometry::new(1, 3, 4, &[9, 8], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let run = |g: &ConvGeometry, seed: u64| {
        let mut plan = WinogradPlan::new(g, None).unwrap();
        plan.set_keep_kernels(false);
        let (x, w, dy) = (
            uniform(seed, g.x_len()),
            uniform(seed + 1, g.w_len()),
            uniform(seed + 2, g.y_len()),
        );
        let mut y = vec![f32::NAN; g.y_len()];
        let mut dx = vec![f32::NAN; g.x_len()];
        let mut dw = vec![f32::NAN; g.w_len()];
        plan.forward(&x, &w, &mut y).unwrap();
        plan.backward_data(&dy, &w, &mut dx).unwrap();
        plan.backward_filter(&x, &dy, &mut dw).unwrap();
        let mut y_ref = vec![0.0; g.y_len()];
        let mut dx_ref = vec![0.0; g.x_len()];
        let mut dw_ref = vec![0.0; g.w_len()];
        reference::forward(g, &x, &w, None, &mut y_ref).unwrap();
        reference::backward_data(g, &dy, &w, &mut dx_ref).unwrap();
        reference::backward_filter(g, &x, &dy, &mut dw_ref).unwrap();
        assert!(max_rel_error(&y, &f64s(&y_ref)) <= TOL, "forward {g:?}");
        assert!(
            max_rel_error(&dx, &f64s(&dx_ref)) <= TOL,
            "backward-data {g:?}"
        );
        assert!(
            max_rel_error(&dw, &f64s(&dw_ref)) <= TOL,
            "backward-filter {g:?}"
        );
        [y, dx, dw].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>())
    };
    // The shared transformed kernels alone: α² ≥ 3² values per weight.
    let big_u = 4 * 9 * big.w_len();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    pool.install(|| {
        let before = run(&big, 1);
        let held = fastconv::workspace_bytes();
        assert!(held >= big_u, "held {held} < {big_u}");
        assert_eq!(fastconv::release_workspaces(), held);
        assert_eq!(fastconv::workspace_bytes(), 0);
        assert_eq!(fastconv::release_workspaces(), 0);
        assert_eq!(run(&big, 1), before, "the same layer after the release");
        assert!(fastconv::release_workspaces() >= big_u);
        let small_bits = run(&small, 5);
        let small_held = fastconv::workspace_bytes();
        assert!(
            small_held > 0 && small_held < held,
            "small layer {small_held}, big {held}"
        );
        fastconv::release_workspaces();
        assert_eq!(
            run(&small, 5),
            small_bits,
            "the small layer after the release"
        );
    });
    // Outside any pool: the calling thread's shared kernels are among what is freed (the
    // global pool's threads may be growing theirs for other tests meanwhile).
    run(&big, 1);
    assert!(fastconv::release_workspaces() >= big_u);
}

/// More kernels (C·K) than one piece of the kernel transform (1024, at least 16 columns): the
/// transform runs in pieces of whole columns, 21 + 19 of 40 input channels for the forward (4
/// pieces of 72), 25 + 23 of 48 output channels for backward-data; with 1-D and 3-D tiles too.
/// On pools of 2 and 3 threads the pieces run in parallel rounds (2 + 2 and 3 + 1 pieces of 72):
/// the results are the 1-thread results to the bit.
#[test]
fn kernel_transform_in_pieces() {
    for (input, kernel, c) in [
        (&[7usize, 6][..], &[3usize, 3][..], 40),
        (&[7, 6][..], &[3, 3][..], 72),
        (&[19][..], &[4][..], 40),
        (&[4, 5, 3][..], &[2, 3, 2][..], 40),
    ] {
        let g = ConvGeometry::new(2, c, 48, input, kernel)
            .unwrap()
            .with_padding(&[1])
            .unwrap();
        let (x, w, dy) = (
            uniform(1, g.x_len()),
            uniform(2, g.w_len()),
            uniform(3, g.y_len()),
        );
        let (mut y_ref, mut dx_ref) = (vec![0.0; g.y_len()], vec![0.0; g.x_len()]);
        reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
        reference::backward_data(&g, &dy, &w, &mut dx_ref).unwrap();
        let mut serial: Option<(Vec<f32>, Vec<f32>)> = None;
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for keep in [true, false] {
                let mut plan = WinogradPlan::new(&g, None).unwrap();
                plan.set_keep_kernels(keep);
                let (mut y, mut dx) = (vec![f32::NAN; g.y_len()], vec![f32::NAN; g.x_len()]);
                pool.install(|| {
                    plan.forward(&x, &w, &mut y).unwrap();
                    plan.backward_data(&dy, &w, &mut dx).unwrap();
                });
                let ctx = format!("{input:?} C {c} keep {keep} {threads} threads");
                let e = max_rel_error(&y, &f64s(&y_ref));
                assert!(e <= TOL, "{ctx}: forward {e:.2e}");
                let e = max_rel_error(&dx, &f64s(&dx_ref));
                assert!(e <= TOL, "{ctx}: backward-data {e:.2e}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                match &serial {
                    None => serial = Some((y, dx)),
                    Some((y1, dx1)) => {
                        assert_eq!(bits(&y), bits(y1), "{ctx}: forward vs 1 thread");
                        assert_eq!(bits(&dx), bits(dx1), "{ctx}: backward-data vs 1 thread");
                    }
                }
            }
        }
    }
}

/// Both GEMM paths of forward and backward-data (V in core-blas's NR panels read in place, and
/// V row-major through the blocked driver) against the reference, with blocks that end inside
/// a panel (5, 37 tiles), span several panels (48) and the default, and enough channels that
/// the input side runs in several channel groups (each group's rows landing in every panel).
#[test]
fn gemm_paths_match_reference() {
    let g = ConvGeometry::new(2, 40, 19, &[29, 31], &[3, 3])
        .unwrap()
        .with_padding_per_side(&[1, 0], &[2, 1])
        .unwrap();
    let (x, w, dy) = (
        uniform(5, g.x_len()),
        uniform(6, g.w_len()),
        uniform(7, g.y_len()),
    );
    let mut y_ref = vec![0.0; g.y_len()];
    reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
    let mut dx_ref = vec![0.0; g.x_len()];
    reference::backward_data(&g, &dy, &w, &mut dx_ref).unwrap();
    for path in [GemmPath::Panels, GemmPath::Driver] {
        for block in [None, Some(5), Some(37), Some(48)] {
            let mut plan = WinogradPlan::new(&g, Some(&[6, 5])).unwrap();
            plan.set_gemm_path(path);
            if let Some(b) = block {
                plan.set_block_tiles(b).unwrap();
            }
            let (mut y, mut dx) = (vec![f32::NAN; g.y_len()], vec![f32::NAN; g.x_len()]);
            plan.forward(&x, &w, &mut y).unwrap();
            plan.backward_data(&dy, &w, &mut dx).unwrap();
            let ctx = format!("{path:?}, block {block:?}");
            let e = max_rel_error(&y, &f64s(&y_ref));
            assert!(e <= TOL, "forward {e:.2e} {ctx}");
            let e = max_rel_error(&dx, &f64s(&dx_ref));
            assert!(e <= TOL, "backward-data {e:.2e} {ctx}");
        }
    }
}

/// The input side by phases of the last dimension (forward, backward-data, and backward-filter's
/// x side) against the reference on 2-D and 3-D geometries with enough channels for several
/// channel groups, blocks that start and end inside runs of tiles (and runs of one tile),
/// phantom tiles inside and outside the input (1-3 per run: α up to 4·m), padding and cropping.
#[test]
fn phased_input_side_matches_reference() {
    let mut rng = SmallRng::seed_from_u64(88);
    for case in 0..24u64 {
        let rank = 2 + (case as usize % 2);
        let kernel: Vec<usize> = (0..rank).map(|_| rng.random_range(2..=4)).collect();
        let input: Vec<usize> = (0..rank)
            .map(|d| {
                if d == rank - 1 && case % 5 == 0 {
                    // A few outputs along the last dimension: runs of one tile.
                    kernel[d] + rng.random_range(0..=1)
                } else {
                    rng.random_range(5..=[0, 0, 23, 9][rank])
                }
            })
            .collect();
        let pb: Vec<usize> = kernel.iter().map(|&r| rng.random_range(0..r)).collect();
        let pa: Vec<usize> = kernel.iter().map(|&r| rng.random_range(0..r)).collect();
        let (c, k) = (rng.random_range(18..=40), rng.random_range(3..=20));
        let g = ConvGeometry::new(2, c, k, &input, &kernel)
            .unwrap()
            .with_padding_per_side(&pb, &pa)
            .unwrap();
        // m ≥ 1 with α = m + r − 1 ≤ 8 (m = 1, 2 give 3 and 2 phantom tiles for r = 4).
        let tile: Vec<usize> = kernel
            .iter()
            .map(|&r| rng.random_range(1..=(9 - r).min(6)))
            .collect();
        let ftile: Vec<usize> = kernel
            .iter()
            .map(|&r| rng.random_range(1..=(9 - r).min(6)))
            .collect();
        let mut plan = WinogradPlan::with_filter_tile(&g, &tile, &ftile).unwrap();
        let block = [3, 7, 16, 29][case as usize % 4];
        plan.set_block_tiles(block).unwrap();
        let (x, w, dy) = (
            uniform(case + 300, g.x_len()),
            uniform(case + 400, g.w_len()),
            uniform(case + 500, g.y_len()),
        );
        let mut y_ref = vec![0.0; g.y_len()];
        reference::forward(&g, &x, &w, None, &mut y_ref).unwrap();
        let mut dx_ref = vec![0.0; g.x_len()];
        reference::backward_data(&g, &dy, &w, &mut dx_ref).unwrap();
        let mut dw_ref = vec![0.0; g.w_len()];
        reference::backward_filter(&g, &x, &dy, &mut dw_ref).unwrap();
        let (mut y, mut dx, mut dw) = (
            vec![f32::NAN; g.y_len()],
            vec![f32::NAN; g.x_len()],
            vec![f32::NAN; g.w_len()],
        );
        plan.forward(&x, &w, &mut y).unwrap();
        plan.backward_data(&dy, &w, &mut dx).unwrap();
        plan.backward_filter(&x, &dy, &mut dw).unwrap();
        let ctx = format!("case {case}: {g:?} tile {tile:?} filter tile {ftile:?} block {block}");
        for (name, got, want) in [
            ("forward", &y, &y_ref),
            ("backward-data", &dx, &dx_ref),
            ("backward-filter", &dw, &dw_ref),
        ] {
            let e = max_rel_error(got, &f64s(want));
            assert!(e <= TOL, "{name} {e:.2e} {ctx}");
        }
    }
}
