//! The Reindex transform (the convgemm paper's Fig. 8, 9), generalised to 1-3 dimensions,
//! dilation and groups.
//!
//! Reindex rearranges the input of one group into a tensor I′ such that
//! im2col(x)ᵀ = im2col′(I′) for a convolution whose kernel and stride are the output size O:
//! I′ has "batch" C/G (the channels), "channels" N (the images) and, per dimension d, spatial
//! size R_d·O_d with `I′[c][n][a·O + b] = x[n][c][b·s + a·dil − pad]` (zero in the padding).
//! The weight gradient dW = dY·im2col(x)ᵀ is then a plain convgemm with dY as the filter, and
//! its C = (K/G) × (C/G·R) is dw itself, in PyTorch's layout.

use rayon::prelude::*;

use crate::algo::Workspace;
use crate::error::Result;
use crate::geometry::ConvGeometry;

/// Writes Reindex(x) of group `grp` into the workspace; returns the geometry of the convgemm
/// that consumes it and the buffer.
pub(crate) fn reindex<'w>(
    g: &ConvGeometry,
    grp: usize,
    x: &[f32],
    ws: &'w mut Workspace,
) -> Result<(ConvGeometry, &'w [f32])> {
    let d = g.dims3();
    let rank = g.rank();
    let lead = 3 - rank;
    let big: Vec<usize> = (lead..3).map(|i| d.kernel[i] * d.output[i]).collect();
    let gr = ConvGeometry::new(
        g.in_channels_per_group(),
        g.batch(),
        g.out_channels_per_group(),
        &big,
        g.output(),
    )?
    .with_stride(g.output())?;
    let cg = g.in_channels_per_group();
    let ilen = g.input_spatial_len();
    let plane = gr.input_spatial_len();
    let buf = ws.take(gr.x_len());
    let b3 = [
        d.kernel[0] * d.output[0],
        d.kernel[1] * d.output[1],
        d.kernel[2] * d.output[2],
    ];
    buf.par_chunks_mut(plane)
        .enumerate()
        .for_each(|(idx, out)| {
            // Plane `idx` of I′ is (channel c, image n).
            let (c, n) = (idx / g.batch(), idx % g.batch());
            let src = &x[(n * g.in_channels() + grp * cg + c) * ilen..][..ilen];
            let mut t = 0;
            for u0 in 0..b3[0] {
                let i0 = d.input_coord(0, u0 % d.output[0], u0 / d.output[0]);
                for u1 in 0..b3[1] {
                    let i1 = d.input_coord(1, u1 % d.output[1], u1 / d.output[1]);
                    let inside =
                        i0 >= 0 && i0 < d.input[0] as isize && i1 >= 0 && i1 < d.input[1] as isize;
                    for u2 in 0..b3[2] {
                        let i2 = d.input_coord(2, u2 % d.output[2], u2 / d.output[2]);
                        out[t] = if inside && i2 >= 0 && i2 < d.input[2] as isize {
                            src[(i0 as usize * d.input[1] + i1 as usize) * d.input[2] + i2 as usize]
                        } else {
                            0.0
                        };
                        t += 1;
                    }
                }
            }
        });
    Ok((gr, buf))
}
