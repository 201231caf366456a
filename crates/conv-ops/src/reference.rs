//! Naive direct convolution: the test oracle for every algorithm in this crate and in `fastconv`.
//!
//! Straight loops over the definition, accumulated in f64, written for clarity and independence
//! from the fast paths (no im2col, no GEMM, no shared index tables). Backward-data and
//! backward-filter are written as the scatter/accumulate of the forward definition, so the
//! three passes are adjoint by construction and independently of any fast algorithm.

use crate::error::Result;
use crate::geometry::ConvGeometry;

/// Walks every (n, group, k, c, output position, kernel tap) whose input coordinate lies inside
/// the input, calling `f(x_index, w_index, y_index)` with flat indices into x, w and y.
fn for_each_tap(g: &ConvGeometry, mut f: impl FnMut(usize, usize, usize)) {
    let d = g.dims3();
    let (cg, kg) = (g.in_channels_per_group(), g.out_channels_per_group());
    let (ilen, olen, rlen) = (
        g.input_spatial_len(),
        g.output_spatial_len(),
        g.kernel_len(),
    );
    for n in 0..g.batch() {
        for grp in 0..g.groups() {
            for kk in 0..kg {
                let k = grp * kg + kk;
                for cc in 0..cg {
                    let c = grp * cg + cc;
                    let x_base = (n * g.in_channels() + c) * ilen;
                    let w_base = (k * cg + cc) * rlen;
                    let y_base = (n * g.out_channels() + k) * olen;
                    for o0 in 0..d.output[0] {
                        for o1 in 0..d.output[1] {
                            for o2 in 0..d.output[2] {
                                let yi = y_base + (o0 * d.output[1] + o1) * d.output[2] + o2;
                                for r0 in 0..d.kernel[0] {
                                    let i0 = d.input_coord(0, o0, r0);
                                    if i0 < 0 || i0 >= d.input[0] as isize {
                                        continue;
                                    }
                                    for r1 in 0..d.kernel[1] {
                                        let i1 = d.input_coord(1, o1, r1);
                                        if i1 < 0 || i1 >= d.input[1] as isize {
                                            continue;
                                        }
                                        for r2 in 0..d.kernel[2] {
                                            let i2 = d.input_coord(2, o2, r2);
                                            if i2 < 0 || i2 >= d.input[2] as isize {
                                                continue;
                                            }
                                            let xi = x_base
                                                + ((i0 as usize * d.input[1] + i1 as usize)
                                                    * d.input[2]
                                                    + i2 as usize);
                                            let wi =
                                                w_base + (r0 * d.kernel[1] + r1) * d.kernel[2] + r2;
                                            f(xi, wi, yi);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn to_f32(acc: &[f64], out: &mut [f32]) {
    for (o, a) in out.iter_mut().zip(acc) {
        *o = *a as f32;
    }
}

/// y = conv(x, w) (+ bias per output channel when given).
pub fn forward(
    g: &ConvGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
) -> Result<()> {
    g.check_len("x", x.len(), g.x_len())?;
    g.check_len("w", w.len(), g.w_len())?;
    g.check_len("y", y.len(), g.y_len())?;
    if let Some(b) = bias {
        g.check_len("bias", b.len(), g.out_channels())?;
    }
    let mut acc = vec![0f64; y.len()];
    if let Some(b) = bias {
        let olen = g.output_spatial_len();
        for (i, a) in acc.iter_mut().enumerate() {
            *a = b[(i / olen) % g.out_channels()] as f64;
        }
    }
    for_each_tap(g, |xi, wi, yi| acc[yi] += x[xi] as f64 * w[wi] as f64);
    to_f32(&acc, y);
    Ok(())
}

/// dx = ∂⟨y, dy⟩/∂x for y = conv(x, w): the adjoint of [`forward`] in x.
pub fn backward_data(g: &ConvGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
    g.check_len("dy", dy.len(), g.y_len())?;
    g.check_len("w", w.len(), g.w_len())?;
    g.check_len("dx", dx.len(), g.x_len())?;
    let mut acc = vec![0f64; dx.len()];
    for_each_tap(g, |xi, wi, yi| acc[xi] += dy[yi] as f64 * w[wi] as f64);
    to_f32(&acc, dx);
    Ok(())
}

/// dw = ∂⟨y, dy⟩/∂w for y = conv(x, w): the adjoint of [`forward`] in w.
pub fn backward_filter(g: &ConvGeometry, x: &[f32], dy: &[f32], dw: &mut [f32]) -> Result<()> {
    g.check_len("x", x.len(), g.x_len())?;
    g.check_len("dy", dy.len(), g.y_len())?;
    g.check_len("dw", dw.len(), g.w_len())?;
    let mut acc = vec![0f64; dw.len()];
    for_each_tap(g, |xi, wi, yi| acc[wi] += dy[yi] as f64 * x[xi] as f64);
    to_f32(&acc, dw);
    Ok(())
}

/// db\[k\] = Σ over batch and output positions of dy\[n\]\[k\]\[..\].
pub fn bias_grad(g: &ConvGeometry, dy: &[f32], db: &mut [f32]) -> Result<()> {
    g.check_len("dy", dy.len(), g.y_len())?;
    g.check_len("db", db.len(), g.out_channels())?;
    let olen = g.output_spatial_len();
    let mut acc = vec![0f64; db.len()];
    for (i, chunk) in dy.chunks(olen).enumerate() {
        acc[i % g.out_channels()] += chunk.iter().map(|&v| v as f64).sum::<f64>();
    }
    to_f32(&acc, db);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1-D example small enough to check by hand.
    #[test]
    fn hand_checked_1d() {
        // x = [1 2 3 4], w = [1 0 -1], padding 1, stride 2: outputs at i = -1 and 1.
        let g = ConvGeometry::new(1, 1, 1, &[4], &[3])
            .unwrap()
            .with_padding(&[1])
            .unwrap()
            .with_stride(&[2])
            .unwrap();
        let mut y = [0.0; 2];
        forward(&g, &[1., 2., 3., 4.], &[1., 0., -1.], Some(&[0.5]), &mut y).unwrap();
        // y0 = 0*1 + 1*0 + 2*(-1) + 0.5; y1 = 2*1 + 3*0 + 4*(-1) + 0.5
        assert_eq!(y, [-1.5, -1.5]);
        let mut dx = [0.0; 4];
        backward_data(&g, &[1., 10.], &[1., 0., -1.], &mut dx).unwrap();
        assert_eq!(dx, [0., 9., 0., -10.]);
        let mut dw = [0.0; 3];
        backward_filter(&g, &[1., 2., 3., 4.], &[1., 10.], &mut dw).unwrap();
        assert_eq!(dw, [20., 31., 42.]);
    }

    #[test]
    fn grouped_2d_hand_checked() {
        // Two groups of one channel each, 1×1 kernels: y_k = w_k · x_k.
        let g = ConvGeometry::new(1, 2, 2, &[1, 2], &[1, 1])
            .unwrap()
            .with_groups(2)
            .unwrap();
        let mut y = [0.0; 4];
        forward(&g, &[1., 2., 3., 4.], &[10., 100.], None, &mut y).unwrap();
        assert_eq!(y, [10., 20., 300., 400.]);
    }

    #[test]
    fn wrong_buffer_is_named() {
        let g = ConvGeometry::new(1, 1, 1, &[4], &[3]).unwrap();
        let err = forward(&g, &[0.; 3], &[0.; 3], None, &mut [0.; 2]).unwrap_err();
        assert_eq!(
            err,
            crate::ConvError::BufferLength {
                name: "x",
                got: 3,
                expected: 4
            }
        );
    }
}
