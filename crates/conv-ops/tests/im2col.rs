//! im2col and col2im against the reference: im2col + a naive matrix product is the forward
//! convolution, and col2im is the adjoint of im2col.

mod common;

use conv_ops::testing::{Tolerance, dot, uniform};
use conv_ops::{ConvGeometry, im2col, reference};
use proptest::prelude::*;

fn forward_via_im2col(g: &ConvGeometry, x: &[f32], w: &[f32]) -> Vec<f32> {
    let (rows, cols) = im2col::im2col_shape(g);
    let (kg, olen) = (g.out_channels_per_group(), g.output_spatial_len());
    let mut col = vec![f32::NAN; rows * cols];
    let mut y = vec![0f32; g.y_len()];
    for grp in 0..g.groups() {
        im2col::im2col(g, grp, x, &mut col).unwrap();
        for kk in 0..kg {
            let k = grp * kg + kk;
            for j in 0..cols {
                let s: f64 = (0..rows)
                    .map(|p| w[k * rows + p] as f64 * col[p * cols + j] as f64)
                    .sum();
                let (n, o) = (j / olen, j % olen);
                y[(n * g.out_channels() + k) * olen + o] = s as f32;
            }
        }
    }
    y
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn im2col_gemm_is_the_forward_convolution(g in common::geometry(3), seed in any::<u64>()) {
        let x = uniform(seed, g.x_len());
        let w = uniform(seed ^ 1, g.w_len());
        let mut want = vec![0f32; g.y_len()];
        reference::forward(&g, &x, &w, None, &mut want).unwrap();
        let got = forward_via_im2col(&g, &x, &w);
        let terms = g.in_channels_per_group() * g.kernel_len();
        Tolerance::for_f32_sum(terms).check("y", &got, &want).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn col2im_is_the_adjoint_of_im2col(g in common::geometry(3), seed in any::<u64>()) {
        let (rows, cols) = im2col::im2col_shape(&g);
        let x = uniform(seed, g.x_len());
        let c = uniform(seed ^ 2, rows * cols);
        for grp in 0..g.groups() {
            let mut col = vec![0f32; rows * cols];
            im2col::im2col(&g, grp, &x, &mut col).unwrap();
            let mut dx = vec![0f32; g.x_len()];
            im2col::col2im_add(&g, grp, &c, &mut dx).unwrap();
            let (lhs, rhs) = (dot(&col, &c), dot(&x, &dx));
            prop_assert!((lhs - rhs).abs() <= 1e-4 * (1.0 + lhs.abs()), "{lhs} vs {rhs}");
        }
    }
}

#[test]
fn large_geometry_uses_the_parallel_path() {
    // 2·8·(20·20) columns · 8·9 rows > 2^15: exercises the rayon branch.
    let g = ConvGeometry::new(2, 8, 4, &[20, 20], &[3, 3])
        .unwrap()
        .with_padding(&[1])
        .unwrap();
    let x = uniform(3, g.x_len());
    let w = uniform(4, g.w_len());
    let mut want = vec![0f32; g.y_len()];
    reference::forward(&g, &x, &w, None, &mut want).unwrap();
    Tolerance::for_f32_sum(72)
        .check("y", &forward_via_im2col(&g, &x, &w), &want)
        .unwrap();
}
