//! Backward-filter by F(r, m′): the roles of kernel and output swapped.
//!
//! `dw[k,c,i] = Σ_n Σ_o x[n,c,o+i−p] dy[n,k,o]` is, for every chunk of `m′` outputs `o`, a
//! correlation of an `α = r + m′ − 1` input segment with an `m′`-tap "kernel" (the chunk of `dy`)
//! that yields all `r` taps: F(r, m′). The transform is linear, so the products of all tiles and
//! images are summed in the transformed domain — per ξ one GEMM `M_ξ += U′_ξ · V_ξᵀ`,
//! (K × T_b)·(T_b × C), accumulated over tile blocks — and one output transform per (k, c) at the
//! end. Blocks run on rayon's pool, each thread accumulating its own M, summed at the end.

use conv_ops::ConvGeometry;
use core_blas::AlignedVec;
use rayon::prelude::*;

use crate::error::Result;
use crate::ntransform::{
    RowsDest, TileTransforms, multi_mode_product_unchecked, transform_into_rows,
};
use crate::tiled::{
    Phased, PhasedBufs, PhasedSource, Segment, channel_group, gather_apply, gather_segments,
    input_side_phased, tiles_per_dim,
};

/// Buffers of backward-filter kept by the plan across calls: per thread the accumulator M
/// (α^N × K × C, tens of MiB for 512 channels) and the block buffers, plus the output transform's.
/// Reusing them saves the page faults and zeroing of fresh allocations on every call.
#[derive(Debug, Clone, Default)]
pub(crate) struct FilterWorkspace {
    states: Vec<ThreadState>,
    scratch: AlignedVec,
    out: AlignedVec,
}

/// One thread's accumulator and block buffers (gathered tiles, V, mode-product scratch, U′).
#[derive(Debug, Clone, Default)]
struct ThreadState {
    acc: AlignedVec,
    bufs: BlockBufs,
}

/// One block's buffers: a channel group's gathered tiles, mode-product scratch and
/// intermediate, V, U′, and the gather's segments.
#[derive(Debug, Clone, Default)]
struct BlockBufs {
    d: AlignedVec,
    v: AlignedVec,
    scratch: AlignedVec,
    tmp: AlignedVec,
    u: AlignedVec,
    segs: Vec<Segment>,
    /// The phased gather's buffers (see `tiled::Phased`).
    ex: AlignedVec,
    pt: AlignedVec,
    ends: Vec<usize>,
}

/// `dw` (K×C×kernel, overwritten) from `x` and `dy` with the F(r, m′) transforms `tt`
/// (`tt.out_tile()` = kernel, `tt.kernel()` = m′). Shapes validated by the caller.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_filter(
    g: &ConvGeometry,
    tt: &TileTransforms,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    block_tiles: usize,
    ws: &mut FilterWorkspace,
) -> Result<()> {
    let rank = g.rank();
    let (c_in, k_out) = (g.in_channels(), g.out_channels());
    let alpha = tt.in_tile();
    let a_n: usize = alpha.iter().product();
    let mp = tt.kernel().to_vec();
    let taps = g.kernel_len();
    debug_assert_eq!(tt.out_tile(), g.kernel());
    let tpd = tiles_per_dim(g.output(), &mp);
    let total = g.batch() * tpd.iter().product::<usize>();
    let block = block_tiles.clamp(1, total.max(1));
    let n_blocks = total.div_ceil(block);
    let pad: Vec<isize> = g.pad_before().iter().map(|&p| p as isize).collect();
    let zero_pad = vec![0isize; rank];
    let acc_len = a_n * k_out * c_in;
    let phased = Phased::new(&alpha, &mp);
    if n_blocks == 0 {
        dw.fill(0.0);
        return Ok(());
    }

    // Block b into the state's accumulator; the thread's first block overwrites it (beta = 0), so
    // the accumulator is never cleared.
    let run_block = |st: &mut ThreadState, b: usize, first: bool| -> Result<()> {
        let t0 = b * block;
        let tb = ((b + 1) * block).min(total) - t0;
        let BlockBufs {
            d,
            v,
            scratch,
            tmp,
            u,
            segs,
            ex,
            pt,
            ends,
        } = &mut st.bufs;
        // V = D ×ₙ Bₙᵀ and U′ = E ×ₙ Gₙ (in f32: the chunks of dy change every call), a group
        // of channels at a time: gather the group's tiles, transform, and the last mode's product
        // writes the group's rows of V (ξ, C, T_b) or U′ (ξ, K, T_b) in place (see `tiled`).
        for (side, (src, src_dims, tile, pad, channels, mats, dst)) in [
            (x, g.input(), &alpha, &pad, c_in, tt.bt(), &mut *v),
            (dy, g.output(), &mp, &zero_pad, k_out, tt.g32(), &mut *u),
        ]
        .into_iter()
        .enumerate()
        {
            if let Some(ph) = phased.as_ref().filter(|_| side == 0) {
                // x by phases of the last dimension (see `tiled::Phased`).
                dst.resize(a_n * channels * tb, 0.0);
                let inp = PhasedSource {
                    src,
                    dims: src_dims,
                    channels,
                    pad,
                    alpha: tile,
                    step: &mp,
                    tpd: &tpd,
                    mats: &mats,
                };
                let bufs = PhasedBufs {
                    d,
                    scratch,
                    tmp,
                    ex,
                    pt,
                    segs,
                    ends,
                };
                let cg = channel_group(channels, a_n, tb);
                input_side_phased(ph, &inp, t0, tb, tb, cg, bufs, dst, channels * tb, |c0| {
                    RowsDest::Rows { at: c0 * tb }
                });
                continue;
            }
            gather_segments(src_dims, tile, &mp, pad, &tpd, t0, tb, (0, 0), segs);
            let src_len: usize = src_dims.iter().product();
            let tile_n: usize = tile.iter().product();
            dst.resize(a_n * channels * tb, 0.0);
            let cg = channel_group(channels, a_n, tb);
            let mut dims = tile.clone();
            dims.push(0);
            let mut c0 = 0;
            while c0 < channels {
                let cn = cg.min(channels - c0);
                // No clearing: the gather writes every entry.
                d.resize(tile_n * cn * tb, 0.0);
                gather_apply(
                    segs,
                    src,
                    src_len,
                    channels,
                    c0..c0 + cn,
                    mp[rank - 1],
                    tb,
                    (0, 0, 0),
                    d,
                );
                dims[rank] = cn * tb;
                transform_into_rows(
                    d,
                    &dims,
                    &mats,
                    scratch,
                    tmp,
                    dst,
                    channels * tb,
                    RowsDest::Rows { at: c0 * tb },
                );
                c0 += cn;
            }
        }
        // M_ξ (K × C) += U′_ξ (K × T_b) · V_ξᵀ (T_b × C).
        st.acc.resize(acc_len, 0.0);
        core_blas::sgemm_batched(
            false,
            true,
            k_out,
            c_in,
            tb,
            1.0,
            u,
            tb,
            k_out * tb,
            v,
            tb,
            c_in * tb,
            if first { 0.0 } else { 1.0 },
            &mut st.acc,
            c_in,
            k_out * c_in,
            a_n,
        )?;
        Ok(())
    };

    // Contiguous ranges of blocks, one per thread (no more threads than blocks).
    let threads = rayon::current_num_threads().clamp(1, n_blocks);
    ws.states
        .resize_with(threads.max(ws.states.len()), ThreadState::default);
    let states = &mut ws.states[..threads];
    let range = |t: usize| (t * n_blocks / threads, (t + 1) * n_blocks / threads);
    let run_range = |st: &mut ThreadState, t: usize| -> Result<()> {
        let (b0, b1) = range(t);
        for b in b0..b1 {
            run_block(st, b, b == b0)?;
        }
        Ok(())
    };
    if threads == 1 {
        run_range(&mut states[0], 0)?;
    } else {
        states
            .par_iter_mut()
            .enumerate()
            .try_for_each(|(t, st)| run_range(st, t))?;
        let (first, rest) = states.split_at_mut(1);
        for st in rest.iter() {
            for (a, b) in first[0].acc.iter_mut().zip(st.acc.iter()) {
                *a += b;
            }
        }
    }
    let acc = &states[0].acc;
    // One output transform: (α^N, K·C) → (r^N, K·C), then to K×C×taps.
    let mut dims = alpha.clone();
    dims.push(k_out * c_in);
    multi_mode_product_unchecked(acc, &dims, &tt.at(), &mut ws.scratch, &mut ws.out);
    let out = &ws.out;
    debug_assert_eq!(out.len(), taps * k_out * c_in);
    for kc in 0..k_out * c_in {
        for t in 0..taps {
            dw[kc * taps + t] = out[t * k_out * c_in + kc];
        }
    }
    Ok(())
}
