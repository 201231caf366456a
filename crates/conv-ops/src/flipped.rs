//! Backward-data as a forward convgemm: with stride 1, dx is the convolution of dy with the
//! kernel flipped in every spatial dimension and with input and output channels swapped, over
//! padding `dil·(k − 1) − pad` (the transposed convolution). The GEMM then has the long inner
//! dimension K/G·R of a forward pass and stores a dense, non-overlapping C, so it runs at
//! convgemm speed, where deconvgemm's col2im scatter of a (C/G·R) × (N·O) product costs as much
//! as the product itself on layers with few output channels.
//!
//! Workspace: none beyond the forward algorithm's: the GEMM's A operand, the flipped kernel, is
//! packed straight from w ([`FlippedA`]).

use core_blas::PackA;

use crate::algo::{ForwardAlgo, Workspace};
use crate::error::{ConvError, Result};
use crate::geometry::ConvGeometry;
use crate::ops::ForwardA;

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
    let (cg, kg) = (g.in_channels_per_group(), g.out_channels_per_group());
    let result = (0..g.groups()).try_for_each(|grp| {
        let a = FlippedA {
            w,
            grp,
            cg,
            kg,
            taps: g.kernel_len(),
            group: g.kernel_len(),
        };
        crate::ops::forward_group(&gt, grp, &a, dy, None, false, dx, algo, ws)
    });
    ws.release();
    result
}

/// The flipped, channel-transposed kernel of group `grp` as the GEMM's A operand of the
/// transposed geometry: row `c` (the forward layer's input channel of the group, an output
/// channel here) and column `k·R + t` (its output channel, tap) hold the forward weight
/// w\[grp·K/G + k\]\[c\]\[R − 1 − t\] (reversing the flat tap index flips every spatial
/// dimension at once), packed straight from w: no flipped copy.
///
/// With `group` < R (the row classes' order, [`ForwardA::tap_groups`]), the columns are in
/// groups of `group` consecutive taps, group-major: column `(q·K/G + k)·group + u` holds tap
/// `t = q·group + u` of output channel `k`.
#[derive(Clone, Copy)]
struct FlippedA<'a> {
    /// The forward layer's weights, K × C/G × R.
    w: &'a [f32],
    grp: usize,
    /// The forward layer's C/G and K/G, and R.
    cg: usize,
    kg: usize,
    taps: usize,
    /// Taps per column group (R: one group, the plain order `k·R + t`).
    group: usize,
}

impl ForwardA for FlippedA<'_> {
    fn tap_groups(&self, gw: usize) -> Option<Self> {
        (gw > 0 && self.taps.is_multiple_of(gw)).then_some(Self { group: gw, ..*self })
    }
}

impl FlippedA<'_> {
    /// [`PackA::pack_a`] in the group-major order (`group` < R), rows past `mc` already
    /// zeroed: w is walked in memory order (output channel k, then its rows of the block,
    /// `mc` runs of R values), each micro-panel's group `q` of k written as one run of
    /// `group` columns.
    fn pack_grouped(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        let (r, gw, kg) = (self.taps, self.group, self.kg);
        // Runs j = q·kg + k of gw columns each.
        let (j0, j1) = (pc / gw, (pc + kc).div_ceil(gw));
        let (q0, q1) = (j0 / kg, (j1 - 1) / kg + 1);
        let (ka, kb) = if q1 - q0 == 1 {
            (j0 % kg, (j1 - 1) % kg + 1)
        } else {
            (0, kg)
        };
        for k in ka..kb {
            let src = &self.w[((self.grp * kg + k) * self.cg + ic) * r..][..mc * r];
            for q in q0..q1 {
                let j = q * kg + k;
                if j < j0 || j >= j1 {
                    continue;
                }
                let u0 = if j == j0 { pc - j * gw } else { 0 };
                let u1 = gw.min(pc + kc - j * gw);
                let col0 = j * gw + u0 - pc;
                // Column u0 + v holds row value r − 1 − (q·gw + u0 + v) = top − v.
                let top = r - 1 - q * gw - u0;
                for (qq, rows) in src.chunks(mr * r).enumerate() {
                    let panel = &mut dst[qq * kc * mr + col0 * mr..][..(u1 - u0) * mr];
                    // Whole runs of 3 taps (3×3 kernels) on whole micro-panels of AVX-512's
                    // MR (8) and AVX2's (6): a fixed copy the compiler unrolls.
                    if (u1 - u0, rows.len()) == (gw, mr * r) {
                        match (r, gw, mr) {
                            (9, 3, 8) => {
                                flip_run::<9, 3, 8>(rows, top, panel);
                                continue;
                            }
                            (9, 3, 6) => {
                                flip_run::<9, 3, 6>(rows, top, panel);
                                continue;
                            }
                            _ => {}
                        }
                    }
                    for (i, row) in rows.chunks_exact(r).enumerate() {
                        for (col, &v) in panel.chunks_exact_mut(mr).zip(row[..=top].iter().rev()) {
                            col[i] = v;
                        }
                    }
                }
            }
        }
    }
}

/// `out[v·MR + i] = rows[i·R + top − v]` for `v < GW`, `i < MR` (one run of GW columns of a
/// micro-panel, taps reversed from `top`).
#[inline(always)]
fn flip_run<const R: usize, const GW: usize, const MR: usize>(
    rows: &[f32],
    top: usize,
    out: &mut [f32],
) {
    assert!(top < R && top + 1 >= GW);
    let (rows, out) = (&rows[..R * MR], &mut out[..GW * MR]);
    for v in 0..GW {
        for i in 0..MR {
            out[v * MR + i] = rows[i * R + top - v];
        }
    }
}

impl PackA for FlippedA<'_> {
    fn rows(&self) -> usize {
        self.cg
    }
    fn cols(&self) -> usize {
        self.kg * self.taps
    }
    fn pack_a(&self, ic: usize, mc: usize, pc: usize, kc: usize, mr: usize, dst: &mut [f32]) {
        let r = self.taps;
        let panels = mc.div_ceil(mr);
        if panels == 0 || kc == 0 {
            return;
        }
        // Rows past mc in the last micro-panel are zero.
        let tail = mc - (panels - 1) * mr;
        if tail < mr {
            for col in dst[(panels - 1) * kc * mr..][..kc * mr].chunks_exact_mut(mr) {
                col[tail..].fill(0.0);
            }
        }
        if self.group < r {
            self.pack_grouped(ic, mc, pc, kc, mr, dst);
            return;
        }
        // Walk w in memory order (the block's rows of one output channel k are mc consecutive
        // runs of R values: one stream the hardware prefetcher follows) and scatter into the
        // micro-panels, which stay in cache; column p = k·R + t of row c = w[k][c][R − 1 − t].
        let (k0, k1) = (pc / r, (pc + kc).div_ceil(r));
        for k in k0..k1 {
            let t0 = if k == k0 { pc % r } else { 0 };
            let t1 = r.min(pc + kc - k * r);
            let src = &self.w[((self.grp * self.kg + k) * self.cg + ic) * r..][..mc * r];
            let col0 = k * r + t0 - pc;
            for (q, rows) in src.chunks(mr * r).enumerate() {
                let panel = &mut dst[q * kc * mr + col0 * mr..][..(t1 - t0) * mr];
                // Whole micro-panels of every tap of 3×3 and 3×3×3 kernels on AVX2's MR (6) and
                // AVX-512's (8, 12): a fixed permutation the compiler unrolls.
                if (t0, t1, rows.len()) == (0, r, mr * r) {
                    match (r, mr) {
                        (9, 6) => {
                            flip_block::<9, 6>(rows, panel);
                            continue;
                        }
                        (27, 6) => {
                            flip_block::<27, 6>(rows, panel);
                            continue;
                        }
                        (9, 8) => {
                            flip_block::<9, 8>(rows, panel);
                            continue;
                        }
                        (27, 8) => {
                            flip_block::<27, 8>(rows, panel);
                            continue;
                        }
                        (9, 12) => {
                            flip_block::<9, 12>(rows, panel);
                            continue;
                        }
                        (27, 12) => {
                            flip_block::<27, 12>(rows, panel);
                            continue;
                        }
                        _ => {}
                    }
                }
                for (i, row) in rows.chunks_exact(r).enumerate() {
                    for (col, &v) in panel.chunks_exact_mut(mr).zip(row[..r - t0].iter().rev()) {
                        col[i] = v;
                    }
                }
            }
        }
    }
}

/// `out[t·MR + i] = rows[i·R + R − 1 − t]` for `t < R`, `i < MR` (MR rows of R taps into R
/// columns of MR values, taps reversed).
#[inline(always)]
fn flip_block<const R: usize, const MR: usize>(rows: &[f32], out: &mut [f32]) {
    let (rows, out) = (&rows[..R * MR], &mut out[..R * MR]);
    for t in 0..R {
        for i in 0..MR {
            out[t * MR + i] = rows[i * R + R - 1 - t];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `FlippedA::pack_a` against the flipped matrix built entry by entry, for blocks that start
    /// and end inside a kernel's taps, partial micro-panels, several groups, and the unrolled
    /// 3×3 / 3×3×3 paths (MR 6, 8, 12) beside other MRs and tap counts; in the plain order
    /// and in groups of taps (the row classes' order: 3×3 and 3×3×3 kernels in groups of 3
    /// and 9, blocks that cross a group's boundary).
    #[test]
    fn flipped_a_packs_the_flipped_kernel() {
        let cases = [
            (1, 7, 20, 9, 9),
            (1, 7, 20, 9, 3),
            (2, 5, 13, 27, 27),
            (2, 5, 13, 27, 9),
            (1, 4, 17, 27, 3),
            (3, 4, 9, 4, 4),
            (3, 4, 9, 4, 2),
            (1, 3, 6, 1, 1),
        ];
        for (groups, kg, cg, taps, gw) in cases {
            let w: Vec<f32> = (0..groups * kg * cg * taps).map(|v| v as f32).collect();
            for grp in 0..groups {
                let plain = FlippedA {
                    w: &w,
                    grp,
                    cg,
                    kg,
                    taps,
                    group: taps,
                };
                let a = plain.tap_groups(gw).expect("gw divides the taps");
                let (rows, cols) = (a.rows(), a.cols());
                // Column p: run j = q·kg + k of gw columns, tap q·gw + u of k.
                let want = |c: usize, p: usize| {
                    let (j, u) = (p / gw, p % gw);
                    let (k, t) = (j % kg, (j / kg) * gw + u);
                    w[((grp * kg + k) * cg + c) * taps + taps - 1 - t]
                };
                for mr in [4, 6, 8, 12] {
                    for (ic, mc) in [
                        (0, rows),
                        (1, rows - 1),
                        (rows / 2, rows - rows / 2),
                        (0, 5),
                    ] {
                        for (pc, kc) in [
                            (0, cols),
                            (taps / 2, cols - taps / 2),
                            (taps, 1),
                            (3, 2),
                            (kg * gw - 1, 2 * gw + 3),
                            (gw + 1, kg * gw),
                        ] {
                            if kc == 0 || pc + kc > cols || mc == 0 || ic + mc > rows {
                                continue;
                            }
                            let panels = mc.div_ceil(mr);
                            let mut dst = vec![f32::NAN; panels * mr * kc];
                            a.pack_a(ic, mc, pc, kc, mr, &mut dst);
                            for q in 0..panels {
                                for j in 0..kc {
                                    for i in 0..mr {
                                        let got = dst[q * kc * mr + j * mr + i];
                                        let c = ic + q * mr + i;
                                        let w = if c < ic + mc { want(c, pc + j) } else { 0.0 };
                                        assert_eq!(
                                            got, w,
                                            "grp {grp} taps {taps} mr {mr} ic {ic} mc {mc} pc {pc} kc {kc}: \
                                             panel {q} col {j} row {i}"
                                        );
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
