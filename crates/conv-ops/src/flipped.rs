//! Backward-data as a forward convgemm: with stride 1, dx is the convolution of dy with the
//! kernel flipped in every spatial dimension and with input and output channels swapped, over
//! padding `dil·(k − 1) − pad` (the transposed convolution). The GEMM then has the long inner
//! dimension K/G·R of a forward pass and stores a dense, non-overlapping C, so it runs at
//! convgemm speed, where deconvgemm's col2im scatter of a (C/G·R) × (N·O) product costs as much
//! as the product itself on layers with few output channels.
//!
//! Workspace: the flipped weights, `w_len()` floats (independent of the batch).

use crate::algo::{ForwardAlgo, Workspace};
use crate::error::{ConvError, Result};
use crate::geometry::ConvGeometry;

/// The geometry whose forward pass is the backward-data pass of `g`: batch N, K input channels,
/// C output channels, input = g's output, same kernel and dilation, padding `dil·(k−1) − pad`.
///
/// Errors (`Unsupported`) when a stride is not 1 or a padding exceeds `dil·(k−1)` (the
/// transposed padding would be negative).
pub fn transposed_geometry(g: &ConvGeometry) -> Result<ConvGeometry> {
    let unsupported = |reason: String| ConvError::Unsupported {
        algo: "flipped convgemm / flipped direct",
        reason,
    };
    if g.stride().iter().any(|&s| s != 1) {
        return Err(unsupported(format!("stride {:?} (needs 1)", g.stride())));
    }
    let rank = g.rank();
    let (mut before, mut after) = (vec![0; rank], vec![0; rank]);
    for d in 0..rank {
        let extent = g.dilation()[d] * (g.kernel()[d] - 1);
        let (pb, pa) = (g.pad_before()[d], g.pad_after()[d]);
        if pb > extent || pa > extent {
            return Err(unsupported(format!(
                "dimension {d}: padding ({pb}, {pa}) exceeds dilation·(kernel − 1) = {extent}"
            )));
        }
        before[d] = extent - pb;
        after[d] = extent - pa;
    }
    ConvGeometry::from_parts(
        g.batch(),
        g.out_channels(),
        g.in_channels(),
        g.output(),
        g.kernel(),
        &[1],
        g.dilation(),
        &before,
        &after,
        g.groups(),
    )
}

/// dx = backward-data(dy, w) as the forward `algo` (convgemm or direct) on the flipped kernel
/// (inputs validated by the caller).
pub(crate) fn backward_data(
    g: &ConvGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    algo: ForwardAlgo,
    ws: &mut Workspace,
) -> Result<()> {
    let gt = transposed_geometry(g)?;
    if algo == ForwardAlgo::Direct {
        // The direct convolution packs the flipped weights from w itself: no flipped copy.
        return crate::direct::forward(
            &gt,
            dy,
            crate::direct::Weights::Flipped(w),
            None,
            false,
            dx,
        );
    }
    let (cg, kg, rlen) = (
        g.in_channels_per_group(),
        g.out_channels_per_group(),
        g.kernel_len(),
    );
    // w[k][c][r] (k in group grp) → wt[c][k][R−1−r]: reversing the flat tap index flips every
    // spatial dimension at once.
    let wt = ws.take(g.w_len());
    for grp in 0..g.groups() {
        for kk in 0..kg {
            for cc in 0..cg {
                let src = &w[((grp * kg + kk) * cg + cc) * rlen..][..rlen];
                let dst = &mut wt[((grp * cg + cc) * kg + kk) * rlen..][..rlen];
                for (d, &s) in dst.iter_mut().zip(src.iter().rev()) {
                    *d = s;
                }
            }
        }
    }
    crate::ops::forward(
        &gt,
        dy,
        wt,
        None,
        false,
        dx,
        algo,
        &mut Workspace::new(false),
    )
}
