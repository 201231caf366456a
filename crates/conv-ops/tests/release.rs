//! `release_workspaces` gives back the per-thread buffers a pass grew, and the pass run again
//! grows them anew with the same result.

use conv_ops::{
    BackwardDataAlgo, BackwardFilterAlgo, ConvGeometry, ForwardAlgo, Workspace, backward_data,
    backward_filter, forward, release_workspaces,
};

#[test]
fn released_buffers_regrow_with_the_same_result() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        // 16 channels, 3×3: the direct forms apply; deconvgemm keeps a C panel per thread.
        let g = ConvGeometry::from_parts(2, 16, 16, &[13, 11], &[3, 3], &[1], &[1], &[1], &[1], 1)
            .unwrap();
        let x: Vec<f32> = (0..g.x_len())
            .map(|i| ((i * 7) % 11) as f32 - 5.0)
            .collect();
        let w: Vec<f32> = (0..g.w_len()).map(|i| ((i * 3) % 5) as f32 - 2.0).collect();
        let mut ws = Workspace::new(false);
        let run = |ws: &mut Workspace| {
            let mut y = vec![f32::NAN; g.y_len()];
            forward(&g, &x, &w, None, false, &mut y, ForwardAlgo::Direct, ws).unwrap();
            let mut dx = vec![f32::NAN; g.x_len()];
            backward_data(&g, &y, &w, &mut dx, BackwardDataAlgo::Deconvgemm, ws).unwrap();
            (y, dx)
        };
        let first = run(&mut ws);
        assert!(
            release_workspaces() > 0,
            "the passes grew no per-thread buffer"
        );
        assert_eq!(release_workspaces(), 0);
        assert_eq!(run(&mut ws), first);
        assert!(release_workspaces() > 0);
    });
}

/// The blocked backward-filter's whole copy of a 3-D input (a per-thread buffer) too.
#[test]
fn released_whole_copy_regrows_with_the_same_result() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        // 16 channels, 3×3×3, output lines of 20: the blocked packer over the whole copy.
        let g =
            ConvGeometry::from_parts(1, 16, 8, &[3, 4, 20], &[3, 3, 3], &[1], &[1], &[1], &[1], 1)
                .unwrap();
        let x: Vec<f32> = (0..g.x_len())
            .map(|i| ((i * 7) % 11) as f32 - 5.0)
            .collect();
        let dy: Vec<f32> = (0..g.y_len()).map(|i| ((i * 3) % 5) as f32 - 2.0).collect();
        let mut ws = Workspace::new(false);
        let run = |ws: &mut Workspace| {
            let mut dw = vec![f32::NAN; g.w_len()];
            backward_filter(&g, &x, &dy, &mut dw, BackwardFilterAlgo::ConvgemmTrans, ws).unwrap();
            dw
        };
        release_workspaces();
        let first = run(&mut ws);
        assert!(
            release_workspaces() > 0,
            "the pass grew no per-thread buffer"
        );
        assert_eq!(release_workspaces(), 0);
        assert_eq!(run(&mut ws), first);
        assert!(release_workspaces() > 0);
    });
}

/// The per-image forward's slab weights (large 3-D planes whose outer kernel planes partly
/// read padding; a per-thread buffer) too.
#[test]
fn released_slab_weights_regrow_with_the_same_result() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        // 3 × 32 × 32 output positions per image (per-image products), 3×3×3 with padding 1.
        let g =
            ConvGeometry::from_parts(1, 8, 8, &[3, 32, 32], &[3, 3, 3], &[1], &[1], &[1], &[1], 1)
                .unwrap();
        let x: Vec<f32> = (0..g.x_len())
            .map(|i| ((i * 7) % 11) as f32 - 5.0)
            .collect();
        let w: Vec<f32> = (0..g.w_len()).map(|i| ((i * 3) % 5) as f32 - 2.0).collect();
        let mut ws = Workspace::new(true);
        let run = |ws: &mut Workspace| {
            let mut y = vec![f32::NAN; g.y_len()];
            forward(&g, &x, &w, None, false, &mut y, ForwardAlgo::Convgemm, ws).unwrap();
            y
        };
        release_workspaces();
        let first = run(&mut ws);
        assert!(
            release_workspaces() > 0,
            "the pass grew no per-thread buffer"
        );
        assert_eq!(release_workspaces(), 0);
        assert_eq!(run(&mut ws), first);
        assert!(release_workspaces() > 0);
    });
}
