//! `release_workspaces` gives back the per-thread buffers a pass grew, and the pass run again
//! grows them anew with the same result.

use std::fmt::Debug;

use conv_ops::{
    BackwardDataAlgo, BackwardFilterAlgo, ConvGeometry, ForwardAlgo, Workspace, backward_data,
    backward_filter, forward, release_workspaces,
};

/// `n` small integer values (exact in f32 sums), a different pattern per `seed`.
fn pattern(n: usize, seed: usize) -> Vec<f32> {
    let (mul, modulus) = [(7, 11), (3, 5)][seed];
    (0..n)
        .map(|i| ((i * mul) % modulus) as f32 - (modulus / 2) as f32)
        .collect()
}

/// On a pool of one thread: `run` grows some per-thread buffer, `release_workspaces` gives it
/// back (and nothing on a second call), and `run` again grows it anew with the same result.
fn check_release<T: PartialEq + Debug + Send>(
    persistent: bool,
    run: impl Fn(&mut Workspace) -> T + Sync,
) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| {
        let mut ws = Workspace::new(persistent);
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

#[test]
fn released_buffers_regrow_with_the_same_result() {
    // 16 channels, 3×3: the direct forms apply; deconvgemm keeps a C panel per thread.
    let g =
        ConvGeometry::from_parts(2, 16, 16, &[13, 11], &[3, 3], &[1], &[1], &[1], &[1], 1).unwrap();
    let (x, w) = (pattern(g.x_len(), 0), pattern(g.w_len(), 1));
    check_release(false, |ws| {
        let mut y = vec![f32::NAN; g.y_len()];
        forward(&g, &x, &w, None, false, &mut y, ForwardAlgo::Direct, ws).unwrap();
        let mut dx = vec![f32::NAN; g.x_len()];
        backward_data(&g, &y, &w, &mut dx, BackwardDataAlgo::Deconvgemm, ws).unwrap();
        (y, dx)
    });
}

/// The blocked backward-filter's whole copy of a 3-D input (a per-thread buffer) too.
#[test]
fn released_whole_copy_regrows_with_the_same_result() {
    // 16 channels, 3×3×3, output lines of 20: the blocked packer over the whole copy.
    let g = ConvGeometry::from_parts(1, 16, 8, &[3, 4, 20], &[3, 3, 3], &[1], &[1], &[1], &[1], 1)
        .unwrap();
    let (x, dy) = (pattern(g.x_len(), 0), pattern(g.y_len(), 1));
    check_release(false, |ws| {
        let mut dw = vec![f32::NAN; g.w_len()];
        backward_filter(&g, &x, &dy, &mut dw, BackwardFilterAlgo::ConvgemmTrans, ws).unwrap();
        dw
    });
}

/// The per-image forward's slab weights (large 3-D planes whose outer kernel planes partly
/// read padding; a per-thread buffer) too.
#[test]
fn released_slab_weights_regrow_with_the_same_result() {
    // 3 × 32 × 32 output positions per image (per-image products), 3×3×3 with padding 1.
    let g = ConvGeometry::from_parts(1, 8, 8, &[3, 32, 32], &[3, 3, 3], &[1], &[1], &[1], &[1], 1)
        .unwrap();
    let (x, w) = (pattern(g.x_len(), 0), pattern(g.w_len(), 1));
    check_release(true, |ws| {
        let mut y = vec![f32::NAN; g.y_len()];
        forward(&g, &x, &w, None, false, &mut y, ForwardAlgo::Convgemm, ws).unwrap();
        y
    });
}
