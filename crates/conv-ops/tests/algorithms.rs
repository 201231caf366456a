//! Every algorithm of every pass against the naive reference on random geometries, the adjoint
//! identities, and `workspace_bytes` against what the workspace really allocated.

mod common;

use conv_ops::testing::{Tolerance, dot, uniform};
use conv_ops::{
    BackwardDataAlgo, BackwardFilterAlgo, ConvGeometry, ForwardAlgo, Pass, Preset, Workspace,
    backward_data, backward_filter, bias_grad, forward, reference, workspace_bytes,
};
use proptest::prelude::*;

const FORWARD: [ForwardAlgo; 3] = [
    ForwardAlgo::Im2colGemm,
    ForwardAlgo::Convgemm,
    ForwardAlgo::Direct,
];
const BACKWARD_DATA: [BackwardDataAlgo; 4] = [
    BackwardDataAlgo::GemmCol2im,
    BackwardDataAlgo::Deconvgemm,
    BackwardDataAlgo::FlippedConvgemm,
    BackwardDataAlgo::FlippedDirect,
];
const BACKWARD_FILTER: [BackwardFilterAlgo; 4] = [
    BackwardFilterAlgo::Im2colGemmT,
    BackwardFilterAlgo::ReindexConvgemm,
    BackwardFilterAlgo::ConvgemmTrans,
    BackwardFilterAlgo::Direct,
];

/// Sums of products of values in [−1, 1]: the error grows with the number of terms.
fn tol(terms: usize) -> Tolerance {
    Tolerance::for_f32_sum(terms)
}

fn check_all(g: &ConvGeometry, seed: u64) -> Result<(), String> {
    let x = uniform(seed, g.x_len());
    let w = uniform(seed ^ 0x11, g.w_len());
    let dy = uniform(seed ^ 0x22, g.y_len());
    let bias = uniform(seed ^ 0x33, g.out_channels());
    let fwd_terms = g.in_channels_per_group() * g.kernel_len();
    // Each dx element sums at most K/G · R products; each dw element N · O.
    let bwd_data_terms = g.out_channels_per_group() * g.kernel_len();
    let bwd_filter_terms = g.batch() * g.output_spatial_len();

    let mut y_ref = vec![0f32; g.y_len()];
    reference::forward(g, &x, &w, Some(&bias), &mut y_ref).unwrap();
    let mut dx_ref = vec![0f32; g.x_len()];
    reference::backward_data(g, &dy, &w, &mut dx_ref).unwrap();
    let mut dw_ref = vec![0f32; g.w_len()];
    reference::backward_filter(g, &x, &dy, &mut dw_ref).unwrap();

    for algo in FORWARD {
        let mut ws = Workspace::new(false);
        let mut y = vec![f32::NAN; g.y_len()];
        forward(g, &x, &w, Some(&bias), false, &mut y, algo, &mut ws).map_err(|e| e.to_string())?;
        tol(fwd_terms).check(&format!("{algo:?} y"), &y, &y_ref)?;
        check_workspace(g, Pass::Forward(algo), &ws)?;
        // Fused ReLU equals ReLU of the result.
        forward(g, &x, &w, Some(&bias), true, &mut y, algo, &mut ws).map_err(|e| e.to_string())?;
        let relu_ref: Vec<f32> = y_ref.iter().map(|v| v.max(0.0)).collect();
        tol(fwd_terms).check(&format!("{algo:?} relu(y)"), &y, &relu_ref)?;
    }
    for algo in BACKWARD_DATA {
        let mut ws = Workspace::new(false);
        let mut dx = vec![f32::NAN; g.x_len()];
        let flipped = matches!(
            algo,
            BackwardDataAlgo::FlippedConvgemm | BackwardDataAlgo::FlippedDirect
        );
        let supported = !flipped || conv_ops::transposed_geometry(g).is_ok();
        match backward_data(g, &dy, &w, &mut dx, algo, &mut ws) {
            Ok(()) if supported => {}
            // Geometries it cannot take must be refused by name, never computed wrongly.
            Err(conv_ops::ConvError::Unsupported { .. }) if !supported => continue,
            other => return Err(format!("{algo:?}: supported = {supported}, got {other:?}")),
        }
        tol(bwd_data_terms).check(&format!("{algo:?} dx"), &dx, &dx_ref)?;
        check_workspace(g, Pass::BackwardData(algo), &ws)?;
    }
    for algo in BACKWARD_FILTER {
        let mut ws = Workspace::new(false);
        let mut dw = vec![f32::NAN; g.w_len()];
        backward_filter(g, &x, &dy, &mut dw, algo, &mut ws).map_err(|e| e.to_string())?;
        tol(bwd_filter_terms).check(&format!("{algo:?} dw"), &dw, &dw_ref)?;
        check_workspace(g, Pass::BackwardFilter(algo), &ws)?;
    }
    let mut db = vec![0f32; g.out_channels()];
    let mut db_ref = vec![0f32; g.out_channels()];
    bias_grad(g, &dy, &mut db).unwrap();
    reference::bias_grad(g, &dy, &mut db_ref).unwrap();
    tol(bwd_filter_terms).check("db", &db, &db_ref)?;
    Ok(())
}

fn check_workspace(g: &ConvGeometry, pass: Pass, ws: &Workspace) -> Result<(), String> {
    let want = workspace_bytes(g, pass);
    if ws.peak_bytes() != want {
        return Err(format!(
            "{pass:?}: allocated {} bytes, workspace_bytes says {want}",
            ws.peak_bytes()
        ));
    }
    if ws.allocated_bytes() != 0 {
        return Err(format!(
            "{pass:?}: a non-persistent workspace kept {} bytes",
            ws.allocated_bytes()
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn every_algorithm_matches_the_reference(g in common::geometry(3), seed in any::<u64>()) {
        check_all(&g, seed).map_err(|e| TestCaseError::fail(format!("{g:?}: {e}")))?;
    }

    /// ⟨conv(x, w), y⟩ = ⟨x, backward_data(y, w)⟩ = ⟨w, backward_filter(x, y)⟩ with the fused
    /// (memory-lean) algorithms.
    #[test]
    fn adjoint_identities(g in common::geometry(3), seed in any::<u64>()) {
        let x = uniform(seed, g.x_len());
        let w = uniform(seed ^ 1, g.w_len());
        let y = uniform(seed ^ 2, g.y_len());
        let mut ws = Workspace::new(false);
        let mut cx = vec![0f32; g.y_len()];
        forward(&g, &x, &w, None, false, &mut cx, ForwardAlgo::Convgemm, &mut ws).unwrap();
        let mut dx = vec![0f32; g.x_len()];
        backward_data(&g, &y, &w, &mut dx, BackwardDataAlgo::Deconvgemm, &mut ws).unwrap();
        let mut dw = vec![0f32; g.w_len()];
        backward_filter(&g, &x, &y, &mut dw, BackwardFilterAlgo::ConvgemmTrans, &mut ws).unwrap();
        let mut dwd = vec![f32::NAN; g.w_len()];
        backward_filter(&g, &x, &y, &mut dwd, BackwardFilterAlgo::Direct, &mut ws).unwrap();
        let (a, b, c) = (dot(&cx, &y), dot(&x, &dx), dot(&w, &dw));
        let d = dot(&w, &dwd);
        let scale = 1.0 + a.abs().max(b.abs()).max(c.abs()).max(d.abs());
        prop_assert!((a - b).abs() <= 1e-4 * scale, "<conv(x,w),y> {a} vs <x,dx> {b}");
        prop_assert!((a - c).abs() <= 1e-4 * scale, "<conv(x,w),y> {a} vs <w,dw> {c}");
        prop_assert!((a - d).abs() <= 1e-4 * scale, "<conv(x,w),y> {a} vs <w,dw direct> {d}");
    }
}

/// Layers large enough to take the multi-threaded and multi-block paths of the GEMM (KC and
/// NC splits, several rayon tasks in deconvgemm), including a 3-D one and a strided one.
#[test]
fn realistic_layers() {
    let layers = [
        ConvGeometry::new(2, 32, 48, &[15, 17], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(3, 20, 24, &[13, 11], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(2, 8, 16, &[6, 7, 9], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(1, 40, 40, &[9, 9], &[5, 5])
            .unwrap()
            .with_padding(&[2])
            .unwrap()
            .with_groups(4)
            .unwrap(),
        ConvGeometry::new(4, 300, 70, &[4, 4], &[1, 1]).unwrap(),
        // Output planes of at least 1024 positions: the forward runs image by image with a
        // dense store (bias and ReLU in the kernel's store), here with two groups.
        ConvGeometry::new(2, 4, 6, &[34, 33], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap(),
        // Small planes, many columns: the forward runs C panel by C panel (several blocks
        // spanning images, the last one shorter), bias and ReLU in the copy to y.
        ConvGeometry::new(5, 8, 48, &[31, 30], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        // Pointwise on a large plane: image by image, B = x itself.
        ConvGeometry::new(2, 6, 4, &[1030], &[1])
            .unwrap()
            .with_groups(2)
            .unwrap(),
        // Pointwise (B = x itself) with groups, in 1-D.
        ConvGeometry::new(3, 12, 8, &[37], &[1])
            .unwrap()
            .with_groups(4)
            .unwrap(),
        // A tiny plane (pair by pair on position-major copies, tapwise): its per-thread copies
        // are outside the workspace.
        ConvGeometry::from_parts(5, 24, 20, &[2, 2], &[3, 3], &[1], &[1], &[1], &[1], 1).unwrap(),
        // A plane whose panel tables (27 taps × 1-2 runs × 2592 panel positions of 32, 5184 of
        // 16) outgrow convgemm's table cache: it starts over mid-call.
        ConvGeometry::new(1, 2, 3, &[16, 72, 72], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        // Large planes whose outermost taps partly read padding: the forward (and the flipped
        // backward-data) runs one product per output slab over its valid taps (3-D, a dilated
        // and padded-per-side depth, and 2-D with long lines).
        ConvGeometry::new(2, 5, 7, &[4, 16, 16], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(1, 6, 9, &[5, 16, 20], &[3, 3, 3])
            .unwrap()
            .with_dilation(&[2, 1, 1])
            .unwrap()
            .with_padding_per_side(&[2, 1, 0], &[1, 1, 2])
            .unwrap(),
        ConvGeometry::new(2, 3, 10, &[4, 300], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        // Large planes with 8 and more output channels per group: the AVX-512 kernel's first
        // tile of each full panel packs it from x (core-blas's fused conv B; dilated, grouped,
        // and 3-D through the output slabs' tap views).
        ConvGeometry::new(2, 7, 19, &[35, 37], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(1, 5, 17, &[40, 41], &[3, 3])
            .unwrap()
            .with_dilation(&[2])
            .unwrap()
            .with_padding(&[2])
            .unwrap(),
        ConvGeometry::new(2, 6, 18, &[33, 34], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap(),
        ConvGeometry::new(1, 4, 12, &[5, 20, 24], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
    ];
    for g in &layers {
        check_all(g, 42).unwrap_or_else(|e| panic!("{g:?}: {e}"));
    }
}

#[test]
fn persistent_workspace_keeps_its_buffer() {
    let g = ConvGeometry::new(2, 4, 4, &[8, 8], &[3, 3]).unwrap();
    let p: Preset = "base+pm".parse().unwrap();
    let mut ws = Workspace::for_preset(&p);
    let (x, w) = (uniform(1, g.x_len()), uniform(2, g.w_len()));
    let mut y = vec![0f32; g.y_len()];
    forward(&g, &x, &w, None, false, &mut y, p.forward, &mut ws).unwrap();
    assert_eq!(
        ws.allocated_bytes(),
        workspace_bytes(&g, Pass::Forward(p.forward))
    );
    assert_eq!(workspace_bytes(&g, Pass::Forward(ForwardAlgo::Convgemm)), 0);
}

#[test]
fn presets_parse_and_print() {
    for name in ["base", "rdx", "cgt", "cgt+dg", "base+pm", "cgt+dg+pm"] {
        let p: Preset = name.parse().unwrap();
        assert_eq!(p.to_string(), name);
    }
    assert!("fast".parse::<Preset>().is_err());
}

#[test]
fn bad_buffers_are_named() {
    let g = ConvGeometry::new(1, 2, 2, &[5, 5], &[3, 3]).unwrap();
    let mut ws = Workspace::new(false);
    let err = forward(
        &g,
        &[0.0; 50],
        &[0.0; 35],
        None,
        false,
        &mut [0.0; 18],
        ForwardAlgo::Convgemm,
        &mut ws,
    )
    .unwrap_err();
    assert!(err.to_string().contains("`w`"), "{err}");
    let err = backward_filter(
        &g,
        &[0.0; 50],
        &[0.0; 17],
        &mut [0.0; 36],
        BackwardFilterAlgo::ConvgemmTrans,
        &mut ws,
    )
    .unwrap_err();
    assert!(err.to_string().contains("`dy`"), "{err}");
}

/// The bias gradient on planes longer than its 16 partial sums (with a tail), on 1 and 2 threads
/// (the large one splits its channels across threads), against the reference.
#[test]
fn bias_grad_on_long_planes() {
    let geoms = [
        ConvGeometry::new(3, 2, 5, &[9, 11], &[3, 3]).unwrap(),
        ConvGeometry::new(4, 3, 8, &[50, 47], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
    ];
    for g in &geoms {
        let dy = uniform(7, g.y_len());
        let mut want = vec![0f32; g.out_channels()];
        reference::bias_grad(g, &dy, &mut want).unwrap();
        for threads in 1..=2 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut db = vec![f32::NAN; g.out_channels()];
            pool.install(|| bias_grad(g, &dy, &mut db)).unwrap();
            tol(g.batch() * g.output_spatial_len())
                .check(&format!("{g:?} {threads} threads"), &db, &want)
                .unwrap();
        }
    }
}

/// The direct convolution's three schedules (one thread; images split across threads; one image
/// with its output-channel blocks split across threads) on strided, dilated, grouped and 3-D
/// layers with partial pixel runs (output lines not a multiple of 8) and channel counts not a
/// multiple of the 6-channel register tile.
#[test]
fn direct_under_every_schedule() {
    let layers = [
        ConvGeometry::new(5, 7, 13, &[11, 19], &[3, 3])
            .unwrap()
            .with_padding_per_side(&[1, 2], &[0, 1])
            .unwrap(),
        ConvGeometry::new(1, 16, 32, &[17, 16], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(3, 6, 9, &[5, 9, 10], &[3, 2, 3])
            .unwrap()
            .with_stride(&[1, 2, 3])
            .unwrap()
            .with_dilation(&[1, 2, 1])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(3)
            .unwrap(),
        ConvGeometry::new(2, 8, 8, &[8, 8], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(8)
            .unwrap(),
        ConvGeometry::new(4, 5, 7, &[29], &[5])
            .unwrap()
            .with_stride(&[3])
            .unwrap()
            .with_dilation(&[2])
            .unwrap()
            .with_padding(&[4])
            .unwrap(),
        // Lines of 48+ padded values: padded to a multiple of 8 in the polyphase copy (3-D,
        // and at stride 2 on the phase lines: 103 → 52 → 56).
        ConvGeometry::new(2, 5, 7, &[3, 4, 53], &[2, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(2, 3, 8, &[5, 101], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding_per_side(&[1, 0], &[0, 2])
            .unwrap(),
    ];
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (i, g) in layers.iter().enumerate() {
            let x = uniform(7 + i as u64, g.x_len());
            let w = uniform(17 + i as u64, g.w_len());
            let bias = uniform(27 + i as u64, g.out_channels());
            let mut want = vec![0f32; g.y_len()];
            reference::forward(g, &x, &w, Some(&bias), &mut want).unwrap();
            let mut y = vec![f32::NAN; g.y_len()];
            pool.install(|| {
                forward(
                    g,
                    &x,
                    &w,
                    Some(&bias),
                    false,
                    &mut y,
                    ForwardAlgo::Direct,
                    &mut Workspace::new(false),
                )
            })
            .unwrap();
            tol(g.in_channels_per_group() * g.kernel_len())
                .check(&format!("{threads} threads, {g:?}"), &y, &want)
                .unwrap();
            // The same plans serve the direct backward-filter and the flipped backward-data.
            let dy = uniform(37 + i as u64, g.y_len());
            let mut dw_ref = vec![0f32; g.w_len()];
            reference::backward_filter(g, &x, &dy, &mut dw_ref).unwrap();
            let mut dw = vec![f32::NAN; g.w_len()];
            let mut ws = Workspace::new(false);
            pool.install(|| {
                backward_filter(g, &x, &dy, &mut dw, BackwardFilterAlgo::Direct, &mut ws)
            })
            .unwrap();
            tol(g.batch() * g.output_spatial_len())
                .check(&format!("dw, {threads} threads, {g:?}"), &dw, &dw_ref)
                .unwrap();
            if conv_ops::transposed_geometry(g).is_ok() {
                let mut dx_ref = vec![0f32; g.x_len()];
                reference::backward_data(g, &dy, &w, &mut dx_ref).unwrap();
                let mut dx = vec![f32::NAN; g.x_len()];
                pool.install(|| {
                    backward_data(
                        g,
                        &dy,
                        &w,
                        &mut dx,
                        BackwardDataAlgo::FlippedDirect,
                        &mut ws,
                    )
                })
                .unwrap();
                tol(g.out_channels_per_group() * g.kernel_len())
                    .check(&format!("dx, {threads} threads, {g:?}"), &dx, &dx_ref)
                    .unwrap();
            }
        }
    }
}

/// The direct convolution on images whose padded copy exceeds half of L2 (its input channels
/// run in two blocks, the second adding into y; bias with the first, ReLU after the last), with
/// partial pixel runs, one and three threads (one image per thread, and one image's channel
/// blocks across threads), against the reference.
#[test]
fn direct_with_input_channel_blocks() {
    let layers = [
        ConvGeometry::new(2, 17, 13, &[103, 117], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(1, 9, 7, &[11, 60, 61], &[3, 1, 3])
            .unwrap()
            .with_padding_per_side(&[1, 0, 2], &[0, 0, 1])
            .unwrap(),
    ];
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (i, g) in layers.iter().enumerate() {
            let x = uniform(70 + i as u64, g.x_len());
            let w = uniform(71 + i as u64, g.w_len());
            let bias = uniform(72 + i as u64, g.out_channels());
            let mut want = vec![0f32; g.y_len()];
            reference::forward(g, &x, &w, Some(&bias), &mut want).unwrap();
            for relu in [false, true] {
                let want: Vec<f32> = want
                    .iter()
                    .map(|&v| if relu { v.max(0.0) } else { v })
                    .collect();
                let mut y = vec![f32::NAN; g.y_len()];
                pool.install(|| {
                    forward(
                        g,
                        &x,
                        &w,
                        Some(&bias),
                        relu,
                        &mut y,
                        ForwardAlgo::Direct,
                        &mut Workspace::new(false),
                    )
                })
                .unwrap();
                tol(g.in_channels_per_group() * g.kernel_len())
                    .check(&format!("{threads} threads, relu {relu}, {g:?}"), &y, &want)
                    .unwrap();
            }
        }
    }
}

/// The direct backward-filter over many images (several blocks of images, more than one
/// 128-run chunk per call sequence, images split across 1, 2 and 3 threads with partial sums),
/// with partial pixel runs, stride, dilation, groups and 3-D, against the reference.
/// The direct forward and flipped-direct backward-data on geometries whose plans use flat runs
/// (output lines laid out at the phase planes' line pitch, the lanes past a line's end
/// dropped; `direct::tests::flat_plans` checks that these do): runs that start past a line's
/// end, that hold the end of one line and the start of the next, lines shorter than a run,
/// shared padding between lines (stride 1), a strided last dimension, dilation, asymmetric
/// padding, a 1×1 kernel with padding (the output line as long as the pitch), 3-D, groups,
/// bias and ReLU, 1-3 threads (images across threads, or the channel blocks of each band).
#[test]
fn direct_flat_runs() {
    let layers = [
        // LeNet's c2: 10 outputs per 14-value line.
        ConvGeometry::new(3, 6, 16, &[14, 14], &[5, 5]).unwrap(),
        // ResNet-50's 128@28² shape at 12 channels: 28 outputs per 29-value line.
        ConvGeometry::new(2, 12, 13, &[28, 28], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(2, 5, 7, &[13, 23], &[3, 3])
            .unwrap()
            .with_stride(&[1, 2])
            .unwrap()
            .with_padding_per_side(&[1, 2], &[2, 1])
            .unwrap(),
        ConvGeometry::new(1, 4, 9, &[12, 21], &[3, 3])
            .unwrap()
            .with_dilation(&[2])
            .unwrap()
            .with_padding_per_side(&[2, 1], &[0, 2])
            .unwrap(),
        ConvGeometry::new(2, 6, 10, &[9, 10], &[1, 1])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(2, 6, 8, &[3, 6, 12], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap(),
    ];
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (i, g) in layers.iter().enumerate() {
            let seed = 300 + 10 * i as u64;
            let (x, w, dy) = (
                uniform(seed, g.x_len()),
                uniform(seed + 1, g.w_len()),
                uniform(seed + 2, g.y_len()),
            );
            let bias = uniform(seed + 3, g.out_channels());
            let mut want = vec![0f32; g.y_len()];
            reference::forward(g, &x, &w, Some(&bias), &mut want).unwrap();
            for relu in [false, true] {
                let want: Vec<f32> = want
                    .iter()
                    .map(|&v| if relu { v.max(0.0) } else { v })
                    .collect();
                let mut y = vec![f32::NAN; g.y_len()];
                pool.install(|| {
                    forward(
                        g,
                        &x,
                        &w,
                        Some(&bias),
                        relu,
                        &mut y,
                        ForwardAlgo::Direct,
                        &mut Workspace::new(false),
                    )
                })
                .unwrap();
                tol(g.in_channels_per_group() * g.kernel_len())
                    .check(&format!("{threads} threads, relu {relu}, {g:?}"), &y, &want)
                    .unwrap();
            }
            if conv_ops::transposed_geometry(g).is_ok() {
                let mut want = vec![0f32; g.x_len()];
                reference::backward_data(g, &dy, &w, &mut want).unwrap();
                let mut dx = vec![f32::NAN; g.x_len()];
                pool.install(|| {
                    backward_data(
                        g,
                        &dy,
                        &w,
                        &mut dx,
                        BackwardDataAlgo::FlippedDirect,
                        &mut Workspace::new(false),
                    )
                })
                .unwrap();
                tol(g.out_channels_per_group() * g.kernel_len())
                    .check(&format!("dx, {threads} threads, {g:?}"), &dx, &want)
                    .unwrap();
            }
        }
    }
}

#[test]
fn direct_backward_filter_blocks_and_threads() {
    let layers = [
        ConvGeometry::new(37, 5, 7, &[13, 18], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(23, 6, 4, &[17, 16], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding_per_side(&[1, 0], &[1, 2])
            .unwrap()
            .with_groups(2)
            .unwrap(),
        ConvGeometry::new(9, 4, 5, &[4, 9, 11], &[2, 3, 3])
            .unwrap()
            .with_dilation(&[1, 2, 1])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(130, 64, 64, &[8, 8], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        // dy read in place (160 whole runs per image: a 128-run call and a 32-run one), groups.
        ConvGeometry::new(5, 6, 4, &[32, 40], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap(),
    ];
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (i, g) in layers.iter().enumerate() {
            let x = uniform(90 + i as u64, g.x_len());
            let dy = uniform(91 + i as u64, g.y_len());
            let mut want = vec![0f32; g.w_len()];
            reference::backward_filter(g, &x, &dy, &mut want).unwrap();
            let mut dw = vec![f32::NAN; g.w_len()];
            pool.install(|| {
                backward_filter(
                    g,
                    &x,
                    &dy,
                    &mut dw,
                    BackwardFilterAlgo::Direct,
                    &mut Workspace::new(false),
                )
            })
            .unwrap();
            tol(g.batch() * g.output_spatial_len())
                .check(&format!("{threads} threads, {g:?}"), &dw, &want)
                .unwrap();
        }
    }
}

/// `Preset::lean_for` picks the direct convolution for small-kernel, few-channel layers and the
/// GEMM forms elsewhere; whatever it picks computes every pass correctly and allocates no
/// workspace.
#[test]
fn lean_preset_per_geometry() {
    // With GEMM tiles wider than 16 channels (AVX-512's NR 32), the direct forms only for at
    // most 16 input and 32 output channels per group.
    let wide_gemm = core_blas::Gemm::global().unwrap().tile().1 > 2 * core_blas::OFFSET_LANES;
    let rn20 = ConvGeometry::new(4, 32, 32, &[16, 16], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let p = Preset::lean_for(&rn20);
    if wide_gemm {
        assert_eq!(p.forward, ForwardAlgo::Convgemm);
        assert_eq!(p.backward_data, BackwardDataAlgo::FlippedConvgemm);
        assert_eq!(p.backward_filter, BackwardFilterAlgo::ConvgemmTrans);
    } else {
        assert_eq!(p.forward, ForwardAlgo::Direct);
        assert_eq!(p.backward_data, BackwardDataAlgo::FlippedDirect);
        assert_eq!(p.backward_filter, BackwardFilterAlgo::Direct);
    }
    let s2 = ConvGeometry::new(2, 16, 32, &[17, 16], &[3, 3])
        .unwrap()
        .with_stride(&[2])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let p = Preset::lean_for(&s2);
    assert_eq!(p.forward, ForwardAlgo::Direct);
    assert_eq!(p.backward_data, BackwardDataAlgo::Deconvgemm);
    assert_eq!(p.backward_filter, BackwardFilterAlgo::Direct);
    // 64 channels of 112² (a 3.3 MB padded copy per image): the transposed convgemm.
    let big = ConvGeometry::new(1, 64, 64, &[112, 112], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    assert_eq!(
        Preset::lean_for(&big).backward_filter,
        BackwardFilterAlgo::ConvgemmTrans
    );
    let proj = ConvGeometry::new(2, 16, 32, &[16, 16], &[1, 1])
        .unwrap()
        .with_stride(&[2])
        .unwrap();
    assert_eq!(Preset::lean_for(&proj).forward, ForwardAlgo::Convgemm);
    assert_eq!(
        Preset::lean_for(&proj).backward_filter,
        BackwardFilterAlgo::ConvgemmTrans
    );
    let wide = ConvGeometry::new(1, 128, 128, &[7, 7], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let p = Preset::lean_for(&wide);
    assert_eq!(p.forward, ForwardAlgo::Convgemm);
    assert_eq!(p.backward_data, BackwardDataAlgo::FlippedConvgemm);
    let valid = ConvGeometry::new(3, 6, 16, &[14, 14], &[5, 5]).unwrap();
    assert_eq!(
        Preset::lean_for(&valid).backward_data,
        BackwardDataAlgo::FlippedDirect
    );
    // 128 channels on 20-wide lines (flat runs: 53 per plane against 60): direct forward and
    // backward-data, the transposed convgemm for the weights; 256 channels or 12-wide lines:
    // the GEMM forms.
    let flat = ConvGeometry::new(1, 128, 128, &[20, 20], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let p = Preset::lean_for(&flat);
    if wide_gemm {
        assert_eq!(p.forward, ForwardAlgo::Convgemm);
        assert_eq!(p.backward_data, BackwardDataAlgo::FlippedConvgemm);
    } else {
        assert_eq!(p.forward, ForwardAlgo::Direct);
        assert_eq!(p.backward_data, BackwardDataAlgo::FlippedDirect);
    }
    assert_eq!(p.backward_filter, BackwardFilterAlgo::ConvgemmTrans);
    let p = Preset::lean_for(
        &ConvGeometry::new(1, 256, 256, &[12, 12], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
    );
    assert_eq!(p.forward, ForwardAlgo::Convgemm);
    assert_eq!(p.backward_data, BackwardDataAlgo::FlippedConvgemm);
    let p = Preset::lean_for(
        &ConvGeometry::new(1, 128, 128, &[12, 12], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
    );
    assert_eq!(p.forward, ForwardAlgo::Convgemm);
    // ResNet-50 at batch 8: 128@28² direct (pixel tiles inside; with the wide GEMM tile the
    // forward only), 256@14² and 512@7² the GEMM forms.
    let r50 = |c: usize, hw: usize| {
        Preset::lean_for(
            &ConvGeometry::new(8, c, c, &[hw, hw], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
        )
    };
    let p = r50(128, 28);
    if wide_gemm {
        assert_eq!(p.forward, ForwardAlgo::Direct);
        assert_eq!(p.backward_data, BackwardDataAlgo::FlippedConvgemm);
    } else {
        assert_eq!(p.forward, ForwardAlgo::Direct);
        assert_eq!(p.backward_data, BackwardDataAlgo::FlippedDirect);
    }
    assert_eq!(p.backward_filter, BackwardFilterAlgo::ConvgemmTrans);
    for p in [r50(256, 14), r50(512, 7)] {
        assert_eq!(p.forward, ForwardAlgo::Convgemm);
        assert_eq!(p.backward_data, BackwardDataAlgo::FlippedConvgemm);
    }

    for (i, g) in [rn20, s2, proj, wide, valid, flat].iter().enumerate() {
        let p = Preset::lean_for(g);
        let seed = 100 + i as u64;
        let (x, w, dy) = (
            uniform(seed, g.x_len()),
            uniform(seed ^ 1, g.w_len()),
            uniform(seed ^ 2, g.y_len()),
        );
        let mut ws = Workspace::for_preset(&p);
        let (mut y, mut y_ref) = (vec![0f32; g.y_len()], vec![0f32; g.y_len()]);
        forward(g, &x, &w, None, false, &mut y, p.forward, &mut ws).unwrap();
        reference::forward(g, &x, &w, None, &mut y_ref).unwrap();
        tol(g.in_channels_per_group() * g.kernel_len())
            .check("y", &y, &y_ref)
            .unwrap();
        let (mut dx, mut dx_ref) = (vec![0f32; g.x_len()], vec![0f32; g.x_len()]);
        backward_data(g, &dy, &w, &mut dx, p.backward_data, &mut ws).unwrap();
        reference::backward_data(g, &dy, &w, &mut dx_ref).unwrap();
        tol(g.out_channels_per_group() * g.kernel_len())
            .check("dx", &dx, &dx_ref)
            .unwrap();
        let (mut dw, mut dw_ref) = (vec![0f32; g.w_len()], vec![0f32; g.w_len()]);
        backward_filter(g, &x, &dy, &mut dw, p.backward_filter, &mut ws).unwrap();
        reference::backward_filter(g, &x, &dy, &mut dw_ref).unwrap();
        tol(g.batch() * g.output_spatial_len())
            .check("dw", &dw, &dw_ref)
            .unwrap();
        assert_eq!(ws.peak_bytes(), 0);
    }
}

/// Checks `got` against `want` where `want` may hold NaN and ±inf: every non-finite element
/// must be the same non-finite value (NaN where NaN, +inf where +inf), every finite one finite
/// and within `tol` (measured over the finite elements).
fn check_non_finite(tol: Tolerance, what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let same = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            g.is_finite()
        };
        if !same {
            return Err(format!("{what}[{i}]: got {g}, want {w}"));
        }
    }
    let keep = |v: &[f32]| -> Vec<f32> {
        v.iter()
            .zip(want)
            .map(|(&v, w)| if w.is_finite() { v } else { 0.0 })
            .collect()
    };
    tol.check(what, &keep(got), &keep(want))
}

/// A NaN or infinity in x (forward, backward-filter) or dy (backward-data) reaches exactly the
/// outputs the definition says, no others, under every algorithm: the fast paths' padded lanes
/// (partial pixel runs, panel tails, zero padding) must never multiply a non-finite value that
/// the sum does not contain. The values sit at line starts and ends, channel ends and the last
/// element, where a partial run or a padded lane reads past what it needs.
#[test]
fn non_finite_values_reach_only_their_outputs() {
    let layers = [
        // LeNet's c2 shape: 10-wide output lines (a whole run and a 2-wide partial one).
        ConvGeometry::new(3, 6, 16, &[14, 14], &[5, 5]).unwrap(),
        ConvGeometry::new(2, 5, 7, &[11, 13], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(3, 4, 6, &[9, 17], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding_per_side(&[1, 0], &[0, 2])
            .unwrap(),
        ConvGeometry::new(2, 4, 4, &[3, 6, 7], &[2, 3, 3])
            .unwrap()
            .with_dilation(&[1, 1, 2])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap(),
        ConvGeometry::new(4, 3, 5, &[29], &[3]).unwrap(),
    ];
    // Puts NaN / ±inf at the start and end of input lines and channels and at the very end.
    fn poison(v: &mut [f32], line: usize, plane: usize, salt: usize) {
        let len = v.len();
        let spots = [
            line - 1,
            line,
            2 * line - 1,
            plane - 1,
            plane + line - 1,
            len / 2 + salt,
            len - 1,
        ];
        let vals = [f32::INFINITY, f32::NAN, f32::NEG_INFINITY];
        for (i, &s) in spots.iter().enumerate() {
            v[s.min(len - 1)] = vals[(i + salt) % 3];
        }
    }
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (i, g) in layers.iter().enumerate() {
            let d = g.dims3();
            let seed = 200 + i as u64;
            let (mut x, w, mut dy) = (
                uniform(seed, g.x_len()),
                uniform(seed ^ 1, g.w_len()),
                uniform(seed ^ 2, g.y_len()),
            );
            poison(&mut x, d.input[2], g.input_spatial_len(), i);
            poison(&mut dy, d.output[2], g.output_spatial_len(), i + 1);
            let what = |a: &dyn std::fmt::Debug| format!("{threads} threads, {a:?}, {g:?}");

            let mut y_ref = vec![0f32; g.y_len()];
            reference::forward(g, &x, &w, None, &mut y_ref).unwrap();
            for algo in FORWARD {
                let mut y = vec![0f32; g.y_len()];
                pool.install(|| {
                    forward(
                        g,
                        &x,
                        &w,
                        None,
                        false,
                        &mut y,
                        algo,
                        &mut Workspace::new(false),
                    )
                })
                .unwrap();
                let t = tol(g.in_channels_per_group() * g.kernel_len());
                check_non_finite(t, &what(&algo), &y, &y_ref).unwrap();
            }
            let mut dx_ref = vec![0f32; g.x_len()];
            reference::backward_data(g, &dy, &w, &mut dx_ref).unwrap();
            for algo in BACKWARD_DATA {
                let mut dx = vec![0f32; g.x_len()];
                let done = pool.install(|| {
                    backward_data(g, &dy, &w, &mut dx, algo, &mut Workspace::new(false))
                });
                if let Err(conv_ops::ConvError::Unsupported { .. }) = done {
                    continue;
                }
                done.unwrap();
                let t = tol(g.out_channels_per_group() * g.kernel_len());
                check_non_finite(t, &what(&algo), &dx, &dx_ref).unwrap();
            }
            // dy finite here: a non-finite dy value at an output whose tap reads zero padding is
            // left out of the reference's sum, but every form that multiplies the padding's
            // zeros (im2col, the padded copies) makes it 0 · inf = NaN there.
            let dy = uniform(seed ^ 2, g.y_len());
            let mut dw_ref = vec![0f32; g.w_len()];
            reference::backward_filter(g, &x, &dy, &mut dw_ref).unwrap();
            for algo in BACKWARD_FILTER {
                let mut dw = vec![0f32; g.w_len()];
                pool.install(|| {
                    backward_filter(g, &x, &dy, &mut dw, algo, &mut Workspace::new(false))
                })
                .unwrap();
                let t = tol(g.batch() * g.output_spatial_len());
                check_non_finite(t, &what(&algo), &dw, &dw_ref).unwrap();
            }
        }
    }
}

/// deconvgemm when the images do not divide among the threads (batch 1, odd batches): two
/// rounds over blocks of output lines on 1-2-D layers, the channel split otherwise (3-D, or
/// blocks too short for the kernel's reach), on 2-4 threads against the reference.
#[test]
fn deconvgemm_line_rounds() {
    let layers = [
        ConvGeometry::new(1, 7, 5, &[20, 9], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        // Reach 4 along the lines: coloured with 2 threads (blocks of 4-5 lines), not with 4.
        ConvGeometry::new(1, 4, 6, &[21, 8], &[3, 2])
            .unwrap()
            .with_dilation(&[2, 1])
            .unwrap(),
        ConvGeometry::new(3, 5, 4, &[17, 11], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding_per_side(&[2, 1], &[0, 1])
            .unwrap(),
        ConvGeometry::new(1, 6, 4, &[40], &[5])
            .unwrap()
            .with_padding(&[2])
            .unwrap(),
        ConvGeometry::new(1, 4, 4, &[6, 9, 7], &[3, 3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap(),
    ];
    for threads in [2, 3, 4] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (i, g) in layers.iter().enumerate() {
            let (dy, w) = (uniform(300 + i as u64, g.y_len()), uniform(301, g.w_len()));
            let mut want = vec![0f32; g.x_len()];
            reference::backward_data(g, &dy, &w, &mut want).unwrap();
            for _ in 0..3 {
                let mut dx = vec![f32::NAN; g.x_len()];
                pool.install(|| {
                    backward_data(
                        g,
                        &dy,
                        &w,
                        &mut dx,
                        BackwardDataAlgo::Deconvgemm,
                        &mut Workspace::new(false),
                    )
                })
                .unwrap();
                tol(g.out_channels_per_group() * g.kernel_len())
                    .check(&format!("{threads} threads, {g:?}"), &dx, &want)
                    .unwrap();
            }
        }
    }
}

/// The direct forward and flipped-direct backward-data through the public API on layers of 128+
/// output channels (pixel tiles: a partial last panel of 16 channels, 6-pixel tiles across lines
/// and images, groups) and on their transposed geometries, under 1-3 threads, against the
/// reference.
#[test]
fn direct_pixel_tiles() {
    let layers = [
        ConvGeometry::new(3, 20, 130, &[9, 11], &[3, 3])
            .unwrap()
            .with_padding(&[1])
            .unwrap(),
        ConvGeometry::new(2, 136, 131, &[6, 7], &[3, 3])
            .unwrap()
            .with_padding_per_side(&[1, 0], &[2, 1])
            .unwrap(),
        ConvGeometry::new(5, 8, 258, &[5, 5], &[3, 3])
            .unwrap()
            .with_stride(&[2])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_groups(2)
            .unwrap(),
    ];
    for threads in 1..=3 {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for (i, g) in layers.iter().enumerate() {
            let seed = 300 + i as u64;
            let (x, w, dy) = (
                uniform(seed, g.x_len()),
                uniform(seed ^ 1, g.w_len()),
                uniform(seed ^ 2, g.y_len()),
            );
            let bias = uniform(seed ^ 3, g.out_channels());
            let mut ws = Workspace::new(false);
            let (mut y, mut y_ref) = (vec![f32::NAN; g.y_len()], vec![0f32; g.y_len()]);
            pool.install(|| {
                forward(
                    g,
                    &x,
                    &w,
                    Some(&bias),
                    true,
                    &mut y,
                    ForwardAlgo::Direct,
                    &mut ws,
                )
            })
            .unwrap();
            reference::forward(g, &x, &w, Some(&bias), &mut y_ref).unwrap();
            y_ref.iter_mut().for_each(|v| *v = v.max(0.0));
            tol(g.in_channels_per_group() * g.kernel_len())
                .check(&format!("y, {threads} threads, {g:?}"), &y, &y_ref)
                .unwrap();
            if conv_ops::transposed_geometry(g).is_ok() {
                let (mut dx, mut dx_ref) = (vec![f32::NAN; g.x_len()], vec![0f32; g.x_len()]);
                pool.install(|| {
                    backward_data(
                        g,
                        &dy,
                        &w,
                        &mut dx,
                        BackwardDataAlgo::FlippedDirect,
                        &mut ws,
                    )
                })
                .unwrap();
                reference::backward_data(g, &dy, &w, &mut dx_ref).unwrap();
                tol(g.out_channels_per_group() * g.kernel_len())
                    .check(&format!("dx, {threads} threads, {g:?}"), &dx, &dx_ref)
                    .unwrap();
            }
        }
    }
}
