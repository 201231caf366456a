//! Backward-filter by F(r, m′): the roles of kernel and output swapped.
//!
//! `dw[k,c,i] = Σ_n Σ_o x[n,c,o+i−p] dy[n,k,o]` is, for every chunk of `m′` outputs `o`, a
//! correlation of an `α = r + m′ − 1` input segment with an `m′`-tap "kernel" (the chunk of `dy`)
//! that yields all `r` taps: F(r, m′). The transform is linear, so the products of all tiles and
//! images are summed in the transformed domain — per ξ one GEMM `M_ξ += U′_ξ · V_ξᵀ`,
//! (K × T_b)·(T_b × C), accumulated over tile blocks — and one output transform per (k, c) at the
//! end. Blocks run on rayon's pool: with small accumulators each thread accumulates its own M,
//! summed at the end; with large ones (C3D's 512 × 512 3×3×3 layers: 216 MiB each, ResNet-50's
//! 256@14² and 512@7²) the threads share every block: two transform its two sides, then all
//! share its products, ξ by ξ, into one M.

use conv_ops::ConvGeometry;
use core_blas::AlignedVec;
use rayon::prelude::*;

use crate::error::Result;
use crate::ntransform::{RowsDest, TileTransforms, transform_from_rows, transform_into_rows};
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
    tmp: AlignedVec,
    out: AlignedVec,
}

impl FilterWorkspace {
    /// Bytes of storage held (capacities, the per-thread states' included).
    pub(crate) fn bytes(&self) -> usize {
        let states: usize = self.states.iter().map(ThreadState::bytes).sum();
        states
            + size_of::<ThreadState>() * self.states.capacity()
            + 4 * (self.scratch.capacity() + self.tmp.capacity() + self.out.capacity())
    }
}

impl ThreadState {
    fn bytes(&self) -> usize {
        let b = &self.bufs;
        4 * (self.acc.capacity()
            + b.d.capacity()
            + b.v.capacity()
            + b.scratch.capacity()
            + b.tmp.capacity()
            + b.u.capacity()
            + b.ex.capacity()
            + b.pt.capacity())
            + size_of::<Segment>() * b.segs.capacity()
            + size_of::<usize>() * b.ends.capacity()
    }
}

/// Accumulator bytes per thread above which the threads of backward-filter share one
/// accumulator ([`backward_filter`]'s `shared_acc_above`).
pub(crate) const SHARED_ACC_BYTES: usize = 16 << 20;

/// Largest α^N whose per-thread backward-filter products are packed per ξ (`pack_rows` +
/// `gemm_packed_batched`) rather than run through `sgemm_batched`'s driver. Larger ones (3-D
/// tiles, α^N 216-486, in blocks of 48 tiles) keep the driver: C3D's 64→128 layer (batch 2,
/// 4×7×7, α^N = 486) measured 3-15 % slower packed (`wino_probe blocks c3d_128`, 1 thread, CPU
/// time, alternating processes, quiet 02:08:55 UTC session 20: 71.0 / 73.2, 71.7 / 82.5,
/// 73.0 / 82.4 ms), C3D's 64→64 (α^N = 216) level to faster.
const PACKED_MAX_ALPHA_N: usize = 100;

/// Values per slice of the output transform's input (α^N rows × the slice's columns).
const OUT_CHUNK_FLOATS: usize = 1 << 16;

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
    /// One ξ's U′ and V in the GEMM's panel layouts (A and B), for `gemm_packed_batched`.
    pa: AlignedVec,
    pb: AlignedVec,
}

/// `dw` (K×C×kernel, overwritten) from `x` and `dy` with the F(r, m′) transforms `tt`
/// (`tt.out_tile()` = kernel, `tt.kernel()` = m′). Shapes validated by the caller.
///
/// With several threads, an accumulator (α^N × K × C) of more than `shared_acc_above` bytes is
/// not kept per thread: blocks of `shared_block` tiles are each transformed by two threads (V
/// and U′ side by side), then every block's α^N products run across the threads (whole products
/// per thread) into one accumulator, in block order. Smaller ones are one per thread, each over a
/// contiguous range of blocks of `block_tiles`, summed at the end.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_filter(
    g: &ConvGeometry,
    tt: &TileTransforms,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    block_tiles: usize,
    shared_block: usize,
    shared_acc_above: usize,
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
    let acc_len = a_n * k_out * c_in;
    let pool_threads = rayon::current_num_threads().max(1);
    // One accumulator shared by the threads (see below), whose blocks the threads share.
    let shared = pool_threads > 1 && 4 * acc_len > shared_acc_above;
    let block = if shared { shared_block } else { block_tiles }.clamp(1, total.max(1));
    let n_blocks = total.div_ceil(block);
    let pad: Vec<isize> = g.pad_before().iter().map(|&p| p as isize).collect();
    let zero_pad = vec![0isize; rank];
    let phased = Phased::new(&alpha, &mp);
    if n_blocks == 0 {
        dw.fill(0.0);
        return Ok(());
    }

    let block_len = |b: usize| ((b + 1) * block).min(total) - b * block;
    // V (side 0) or U′ (side 1) of tiles t0..t0 + tb into `bufs.v` or `bufs.u`.
    let transform_side = |bufs: &mut BlockBufs, t0: usize, tb: usize, side: usize| {
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
            ..
        } = bufs;
        // V = D ×ₙ Bₙᵀ and U′ = E ×ₙ Gₙ (in f32: the chunks of dy change every call), a group
        // of channels at a time: gather the group's tiles, transform, and the last mode's product
        // writes the group's rows of V (ξ, C, T_b) or U′ (ξ, K, T_b) in place (see `tiled`).
        {
            let (src, src_dims, tile, pad, channels, mats, dst) = if side == 0 {
                (x, g.input(), &alpha, &pad, c_in, tt.bt(), &mut *v)
            } else {
                (dy, g.output(), &mp, &zero_pad, k_out, tt.g32(), &mut *u)
            };
            if let Some(ph) = phased.as_ref().filter(|_| side == 0) {
                // x by phases of the last dimension (see `tiled::Phased`).
                dst.resize(a_n * channels * tb, 0.0);
                let inp = PhasedSource {
                    src,
                    dims: src_dims,
                    channels,
                    count: channels,
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
                return;
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
    };
    // V and U′ of block b into `bufs.v` and `bufs.u`.
    let transform_block = |bufs: &mut BlockBufs, b: usize| {
        let (t0, tb) = (b * block, block_len(b));
        transform_side(bufs, t0, tb, 0);
        transform_side(bufs, t0, tb, 1);
    };
    // M_ξ (K × C) += U′_ξ (K × T_b) · V_ξᵀ (T_b × C) for block b (U′ in `u`, V in `v`); `first`
    // overwrites `acc` (beta = 0), so the accumulator is never cleared.
    let accumulate = |u: &[f32], v: &[f32], acc: &mut AlignedVec, b: usize, first: bool| {
        let tb = block_len(b);
        acc.resize(acc_len, 0.0);
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
            acc,
            c_in,
            k_out * c_in,
            a_n,
        )
    };

    // `accumulate` with the operands packed here, one ξ at a time (L1/L2-sized), through
    // `pack_rows` (8 × 8 register transposes, the pad lanes of a partial panel zeroed) and
    // `gemm_packed_batched`: the driver packs a transposed V whose C is below the AVX-512 NR
    // (the paper layer's 32 of 48 columns: a partial panel) with a scalar loop and a 16-value
    // memset per tile (26 % of the paper layer's backward-filter in perf, quiet 01:20 UTC session
    // 20). Measured (wino_probe blocks, 1 thread, CPU time, the driver / this in alternating
    // processes, quiet 01:35:20, medians): paper layers 1 and 3 backward-filter 9.68 / 8.60,
    // 9.75 / 8.35, 11.62 / 8.30 and 9.43 / 8.65, 9.56 / 7.82, 9.85 / 8.10 ms; ResNet-50's
    // 64@56², 128@28², 512@7² and C3D level to 2-13 % faster. Used by the per-thread
    // accumulators with α^N ≤ `PACKED_MAX_ALPHA_N`; the shared one keeps the driver, which
    // spreads the α^N products over the threads.
    let accumulate_packed =
        |bufs: &mut BlockBufs, acc: &mut AlignedVec, b: usize, first: bool| -> Result<()> {
            let tb = block_len(b);
            acc.resize(acc_len, 0.0);
            let gemm = core_blas::Gemm::global()?;
            let (la, lb) = (gemm.packed_a_len(k_out, tb), gemm.packed_b_len(tb, c_in));
            bufs.pa.resize(la, 0.0);
            bufs.pb.resize(lb, 0.0);
            let beta = if first { 0.0 } else { 1.0 };
            for xi in 0..a_n {
                gemm.pack_rows(
                    core_blas::PackedOperand::A,
                    k_out,
                    tb,
                    &bufs.u[xi * k_out * tb..][..k_out * tb],
                    tb,
                    &mut bufs.pa,
                )?;
                gemm.pack_rows(
                    core_blas::PackedOperand::B,
                    c_in,
                    tb,
                    &bufs.v[xi * c_in * tb..][..c_in * tb],
                    tb,
                    &mut bufs.pb,
                )?;
                gemm.gemm_packed_batched(
                    k_out,
                    c_in,
                    tb,
                    &bufs.pa,
                    0,
                    &bufs.pb,
                    0,
                    beta,
                    &mut acc[xi * k_out * c_in..][..k_out * c_in],
                    c_in,
                    k_out * c_in,
                    1,
                )?;
            }
            Ok(())
        };
    let threads = pool_threads.clamp(1, if shared { pool_threads } else { n_blocks });
    ws.states
        .resize_with(threads.max(ws.states.len()), ThreadState::default);
    let states = &mut ws.states[..threads];
    if shared {
        // One accumulator for all threads, each block shared by them: two threads transform its
        // two sides (V from x, U′ from dy) side by side, then its α^N products run over the
        // threads (core-blas gives each thread whole products, i.e. its own ξ), adding into the
        // one accumulator in block order. The blocks are the size one thread would use (the
        // caller's `shared_block`): blocks cut to a share per thread (waves of one block per
        // thread) ran the products on half-length inner dimensions and read and wrote the
        // accumulator once per share.
        let (first, rest) = states.split_at_mut(1);
        for st in rest.iter_mut() {
            // A per-thread accumulator of an earlier call is not needed here.
            st.acc = AlignedVec::new();
        }
        let (s0, s1) = (&mut first[0], &mut rest[0]);
        for b in 0..n_blocks {
            let (t0, tb) = (b * block, block_len(b));
            rayon::join(
                || transform_side(&mut s0.bufs, t0, tb, 0),
                || transform_side(&mut s1.bufs, t0, tb, 1),
            );
            accumulate(&s1.bufs.u, &s0.bufs.v, &mut s0.acc, b, b == 0)?;
        }
    } else {
        // Contiguous ranges of blocks, one per thread, each into its own accumulator.
        let range = |t: usize| (t * n_blocks / threads, (t + 1) * n_blocks / threads);
        let run_range = |st: &mut ThreadState, t: usize| -> Result<()> {
            let (b0, b1) = range(t);
            for b in b0..b1 {
                transform_block(&mut st.bufs, b);
                if a_n <= PACKED_MAX_ALPHA_N {
                    accumulate_packed(&mut st.bufs, &mut st.acc, b, b == b0)?;
                } else {
                    let ThreadState { bufs, acc } = st;
                    accumulate(&bufs.u, &bufs.v, acc, b, b == b0)?;
                }
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
    }
    let acc = &states[0].acc;
    // The output transform, (α^N, K·C) → (r^N, K·C), a slice of the K·C columns at a time
    // (rows of `acc` read in place, the last mode first) so its buffers stay cache-sized
    // instead of growing to a multiple of the accumulator; then to K×C×taps.
    let kc_len = k_out * c_in;
    let cols = (OUT_CHUNK_FLOATS / a_n).clamp(16, kc_len.max(16));
    let at = tt.at();
    let mut c0 = 0;
    while c0 < kc_len {
        let cn = cols.min(kc_len - c0);
        let len = transform_from_rows(
            &acc[c0..],
            kc_len,
            &alpha,
            cn,
            &at,
            &mut ws.scratch,
            &mut ws.tmp,
            &mut ws.out,
        );
        let out = &ws.out[..len];
        debug_assert_eq!(len, taps * cn);
        for (j, dk) in dw[c0 * taps..(c0 + cn) * taps]
            .chunks_exact_mut(taps)
            .enumerate()
        {
            for (t, d) in dk.iter_mut().enumerate() {
                *d = out[t * cn + j];
            }
        }
        c0 += cn;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::points::transform_for;
    use conv_ops::reference;
    use conv_ops::testing::{max_rel_error, uniform};
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// Both accumulator schemes (one per thread, one shared: threshold `usize::MAX` and 0) on
    /// 1-3 threads, on random 1-D, 2-D and 3-D geometries with padding and blocks of 1-7 tiles
    /// (so waves end with fewer blocks than threads, and some threads get no block), against
    /// the reference, on NaN-filled outputs; the shared scheme gives the same bits on any
    /// number of threads (each ξ adds the blocks in order). One workspace for all cases, so
    /// buffers of a larger case are reused by smaller ones.
    #[test]
    fn shared_and_per_thread_accumulators_match_reference() {
        let mut rng = SmallRng::seed_from_u64(10);
        let mut ws = FilterWorkspace::default();
        for case in 0..24 {
            let rank = rng.random_range(1..=3);
            let max_in = [0, 23, 11, 7][rank];
            let input: Vec<usize> = (0..rank).map(|_| rng.random_range(3..=max_in)).collect();
            let kernel: Vec<usize> = (0..rank).map(|_| rng.random_range(2..=3)).collect();
            let pad: Vec<usize> = kernel.iter().map(|&r| rng.random_range(0..r)).collect();
            let (n, c, k) = (
                rng.random_range(1..=2),
                rng.random_range(1..=7),
                rng.random_range(1..=6),
            );
            let g = ConvGeometry::new(n, c, k, &input, &kernel)
                .and_then(|g| g.with_padding_per_side(&pad, &pad))
                .unwrap();
            let mp: Vec<usize> = kernel
                .iter()
                .map(|&r| rng.random_range(1..=(8 - r).min(4)))
                .collect();
            let ts: Vec<_> = kernel
                .iter()
                .zip(&mp)
                .map(|(&r, &m)| transform_for(r, m).unwrap())
                .collect();
            let tt = TileTransforms::new(&ts).unwrap();
            let (x, dy) = (uniform(case, g.x_len()), uniform(case + 50, g.y_len()));
            let mut want = vec![0.0; g.w_len()];
            reference::backward_filter(&g, &x, &dy, &mut want).unwrap();
            let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            let block = rng.random_range(1..=7);
            let mut shared_bits: Option<Vec<u32>> = None;
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                for shared_above in [usize::MAX, 0] {
                    let mut dw = vec![f32::NAN; g.w_len()];
                    pool.install(|| {
                        backward_filter(
                            &g,
                            &tt,
                            &x,
                            &dy,
                            &mut dw,
                            block,
                            block,
                            shared_above,
                            &mut ws,
                        )
                    })
                    .unwrap();
                    let err = max_rel_error(&dw, &want);
                    assert!(
                        err <= 2e-4,
                        "case {case} {g:?} m' {mp:?} block {block} threads {threads} \
                         shared_above {shared_above}: error {err}"
                    );
                    if shared_above == 0 {
                        let bits: Vec<u32> = dw.iter().map(|v| v.to_bits()).collect();
                        match &shared_bits {
                            None => shared_bits = Some(bits),
                            Some(b) => assert!(*b == bits, "case {case}: {threads} threads"),
                        }
                    }
                }
            }
        }
    }
}
