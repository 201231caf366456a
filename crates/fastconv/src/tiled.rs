//! Tiled execution of a multi-channel N-d correlation by the fast algorithm (eq. 5, Algorithm 2).
//!
//! Four stages per block of tiles, as in NNPACK and the paper:
//! 1. input transform, a group of channels at a time ([`channel_group`]): gather the group's
//!    `T_b` input tiles (zero outside the padded input) into a cache-sized D and apply Bᵀ along
//!    every spatial mode; the last mode's product writes the group's rows of V (α^N × C × T_b)
//!    in place, cut into the 16-wide micro-panels of core-blas's B operand ([`GemmPath::Panels`]).
//!    In 2 or more dimensions the gather reads only the m phases of each tile along the last
//!    dimension and the modes before the last run on those ([`Phased`]);
//! 2. for every transformed coordinate ξ ∈ α^N one GEMM `M_ξ = U_ξᵀ · V_ξ`, (K × C)·(C × T_b): all
//!    α^N of them as one `core_blas::Gemm::gemm_packed_batched` call on the calling thread, with
//!    `U_ξᵀ` read from panels packed once per weight version ([`crate::packed`]) and V read in
//!    place: nothing is packed per block;
//! 3. output transform Y = M ×ₙ Aₙᵀ, again a group of channels at a time (the last mode reads
//!    the group's rows of M in place);
//! 4. scatter of the group's in-range outputs into y.
//!
//! The block-sized tensors V and M are each written once and read once. The kernel transform U
//! (α^N × C × K) is computed once (see [`crate::plan`]). Blocks of tiles are sized to stay in
//! cache and run on rayon's pool: a range of blocks per thread (idle threads steal from the
//! others' ranges), a wave of blocks at a time, or, when the threads' shares of the tiles are
//! below a block, every block shared by the threads (input channels split for the input side,
//! output channels for the products and the output side).

use std::cell::RefCell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use core_blas::{AlignedVec, DenseStore, Gemm, MatMut, MatRef};

use crate::error::Result;
use crate::ntransform::{
    Buffer, RowsDest, SparseTransform, TileTransforms, last_mode_rows,
    multi_mode_product_unchecked, strided_product, transform_from_rows, transform_into_rows,
};
use crate::packed::{PackedKernels, PackedMatrix};

/// A stride-1 multi-channel correlation `y[n,k,o] = Σ_c Σ_i x[n,c,o+i−p] w[k,c,i]` with a signed
/// offset `p` per dimension (negative = cropping, used by backward-data) and explicit output size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Correlation {
    pub batch: usize,
    pub in_channels: usize,
    pub out_channels: usize,
    pub input: Vec<usize>,
    pub output: Vec<usize>,
    pub pad_before: Vec<isize>,
}

/// Row-major strides of a shape.
pub(crate) fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for n in (0..dims.len().saturating_sub(1)).rev() {
        s[n] = s[n + 1] * dims[n + 1];
    }
    s
}

/// Unravels a flat row-major index.
pub(crate) fn unravel(mut flat: usize, dims: &[usize], idx: &mut [usize]) {
    for n in (0..dims.len()).rev() {
        idx[n] = flat % dims[n];
        flat /= dims[n];
    }
}

/// Tiles per dimension: ⌈output / m⌉.
pub(crate) fn tiles_per_dim(output: &[usize], m: &[usize]) -> Vec<usize> {
    output.iter().zip(m).map(|(o, m)| o.div_ceil(*m)).collect()
}

/// How the transformed-domain products `M_ξ = U_ξᵀ V_ξ` of forward and backward-data run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmPath {
    /// The input transform writes V straight into core-blas's NR-wide micro-panels
    /// (ξ, ⌈T_b / NR⌉ panels, C, NR) and the α^N products read both operands in place
    /// (`core_blas::Gemm::gemm_packed_batched`). Measured against `Driver` (thread CPU time, min
    /// of 4 interleaved rounds, 23:09 UTC): the paper's 4×4 layer forward 0.96×, backward-data
    /// 0.99×, 64@56² forward 0.98×.
    #[default]
    Panels,
    /// V row-major (ξ, C, T_b), the products through core-blas's blocked driver (which packs V).
    Driver,
}

/// Runs the correlation with transformed kernels `u` (α^N matrices `U_ξᵀ`, K × C, packed). Shapes
/// are validated by the caller (`debug_assert!`ed here).
///
/// Per block of tiles, the input side runs a few channels at a time in L1/L2-sized buffers:
/// gather the channels' tiles, apply Bᵀ along every mode but the last, and the last mode's
/// product writes straight into the block's V (ξ, C, T_b). After the GEMMs, the output side
/// likewise reads a few channels of M (ξ, K, T_b) with the last mode's Aᵀ, finishes the other
/// modes locally and scatters the channels' outputs into y. The block-sized tensors (V and M)
/// are each written once and read once; no block-sized intermediate exists.
pub(crate) fn correlate(
    job: &Correlation,
    tt: &TileTransforms,
    u: &PackedKernels,
    x: &[f32],
    y: &mut [f32],
    block_tiles: usize,
    path: GemmPath,
) -> Result<()> {
    let alpha = tt.in_tile();
    let m = tt.out_tile().to_vec();
    let (c_in, k_out) = (job.in_channels, job.out_channels);
    let a_n: usize = alpha.iter().product();
    let in_len: usize = job.input.iter().product();
    let out_len: usize = job.output.iter().product();
    let gemm = Gemm::global()?;
    let (mr, nr) = gemm.tile();
    // V in panels needs U in the kernel's panels (always: the plan packs U for this kernel).
    let path = if u.mr() == mr { path } else { GemmPath::Driver };
    let a_src: Vec<PackedMatrix<'_>> = (0..a_n).map(|xi| u.matrix(xi)).collect();
    debug_assert_eq!(x.len(), job.batch * c_in * in_len);
    debug_assert_eq!(y.len(), job.batch * k_out * out_len);
    debug_assert_eq!(tt.rank(), job.input.len());
    let (bt, at) = (tt.bt(), tt.at());

    let tpd = tiles_per_dim(&job.output, &m);
    let tiles_per_image: usize = tpd.iter().product();
    let total = job.batch * tiles_per_image;
    let block = block_tiles.clamp(1, total.max(1));
    let n_blocks = total.div_ceil(block);
    let threads = rayon::current_num_threads().max(1);
    let og = OutGeom {
        output: &job.output,
        out_strides: strides(&job.output),
        m: &m,
        tpd: &tpd,
        tiles_per_image,
        out_len,
        k_total: k_out,
    };
    let group = |channels: usize, tb: usize| channel_group(channels, a_n, tb);
    let phased = Phased::new(&alpha, &m);
    // Where the input side writes the rows of channels c0.. in V.
    // (Blocks of `tb` tiles, `tbp` per channel of V, `cv` channels in V.)
    let group_dest = |c0: usize, tb: usize, tbp: usize, cv: usize| match path {
        // V rows (ξ, channels c0..c0 + cn, all tiles) are contiguous: c0·tb .. (c0 + cn)·tb.
        GemmPath::Driver => RowsDest::Rows { at: c0 * tb },
        // Channel c0 + c, tile t of a V row at (t / NR)·C·NR + (c0 + c)·NR + t mod NR.
        GemmPath::Panels => RowsDest::Panels {
            at: c0 * nr,
            seg: tbp,
            len: tbp,
            nr,
            panel_stride: cv * nr,
        },
    };

    // The input side of tiles t0..t1, channels `chans` of x, into `v` as the V of a
    // `chans.len()`-channel problem (ξ, C′, T_b) (in panels: (ξ, panels, C′, NR)); returns the
    // tiles per channel of V (`tb` padded to whole NR-wide panels in the panel layout).
    let input_side = |local: &mut Local,
                      segs: &mut Vec<Segment>,
                      runs: &mut Vec<usize>,
                      v: &mut AlignedVec,
                      t0: usize,
                      t1: usize,
                      chans: std::ops::Range<usize>|
     -> usize {
        let tb = t1 - t0;
        let cv = chans.len();
        // Tiles per channel in D and V: the block, padded to whole NR-wide panels for V in the
        // GEMM's panel layout.
        let tbp = match path {
            GemmPath::Panels => tb.div_ceil(nr) * nr,
            GemmPath::Driver => tb,
        };
        v.resize(a_n * cv * tbp, 0.0);
        let cg = group(cv, tb);
        // The channels' planes from x's start (the plane stride stays c_in).
        let xs = &x[chans.start * in_len..];
        if let Some(ph) = &phased {
            let inp = PhasedSource {
                src: xs,
                dims: &job.input,
                channels: c_in,
                count: cv,
                pad: &job.pad_before,
                alpha: &alpha,
                step: &m,
                tpd: &tpd,
                mats: &bt,
            };
            let Local {
                d,
                scratch,
                tmp,
                ex,
                pt,
                ..
            } = local;
            let bufs = PhasedBufs {
                d,
                scratch,
                tmp,
                ex,
                pt,
                segs,
                ends: runs,
            };
            input_side_phased(ph, &inp, t0, tb, tbp, cg, bufs, v, cv * tbp, |c0| {
                group_dest(c0, tb, tbp, cv)
            });
        } else {
            gather_segments(
                &job.input,
                &alpha,
                &m,
                &job.pad_before,
                &tpd,
                t0,
                tb,
                (0, 0),
                segs,
            );
            let mut dims = alpha.clone();
            dims.push(0);
            let mut c0 = 0;
            while c0 < cv {
                let cn = cg.min(cv - c0);
                // No clearing: the gather writes every entry but the padding lanes of a last
                // partial panel (tb < tbp), whose values only meet B's padding columns, which never
                // reach M.
                local.d.resize(a_n * cn * tbp, 0.0);
                gather_apply(
                    segs,
                    xs,
                    in_len,
                    c_in,
                    c0..c0 + cn,
                    m[m.len() - 1],
                    tbp,
                    (0, 0, 0),
                    &mut local.d,
                );
                *dims.last_mut().unwrap_or(&mut 0) = cn * tbp;
                let dest = group_dest(c0, tb, tbp, cv);
                transform_into_rows(
                    &local.d,
                    &dims,
                    &bt,
                    &mut local.scratch,
                    &mut local.tmp,
                    v,
                    cv * tbp,
                    dest,
                );
                c0 += cn;
            }
        }
        tbp
    };

    // One block: tiles t0..t1 → M_ξ = U_ξᵀ V_ξ in `bufs.mm`, laid out (α^N, K, T_b).
    let run_block = |bufs: &mut Buffers, t0: usize, t1: usize| -> Result<()> {
        let tb = t1 - t0;
        let Buffers {
            v,
            mm,
            local,
            segs,
            runs,
        } = bufs;
        let tbp = input_side(local, segs, runs, v, t0, t1, 0..c_in);
        if path == GemmPath::Panels {
            // M_ξ (K × T_b) = U_ξᵀ (K × C) · V_ξ (C × T_b) for all ξ, both operands read in
            // place (U packed once, V written in panels above). beta = 0: M is never read.
            mm.resize(a_n * k_out * tb, 0.0);
            let (ua, stride_a) = u.panels();
            gemm.gemm_packed_batched(
                k_out,
                tb,
                c_in,
                ua,
                stride_a,
                v,
                c_in * tbp,
                0.0,
                mm,
                tb,
                k_out * tb,
                a_n,
            )?;
            return Ok(());
        }
        // M_ξ (K × T_b) = U_ξᵀ (K × C) · V_ξ (C × T_b), for all ξ. beta = 0: C is written, never
        // read, so the buffer needs no clearing.
        mm.resize(a_n * k_out * tb, 0.0);
        let b: Vec<MatRef<'_>> = v
            .chunks_exact(c_in * tb)
            .take(a_n)
            .map(|vx| MatRef::row_major("v", vx, c_in, tb, tb))
            .collect::<std::result::Result<_, _>>()?;
        let mut stores: Vec<DenseStore<'_>> = mm
            .chunks_exact_mut(k_out * tb)
            .take(a_n)
            .map(|mx| {
                MatMut::row_major("m", mx, k_out, tb, tb).map(|c| DenseStore::new(c, 1.0, 0.0))
            })
            .collect::<std::result::Result<_, _>>()?;
        gemm.gemm_batched_with(&a_src, &b, &mut stores)?;
        Ok(())
    };

    // Output transform and scatter of channels `ks`, tiles `ta..tz` of the block `t0..t1` whose M
    // is `mm`, into `ys` (the output planes (image, channel) from plane `plane0` on). Either one
    // channel or the whole block's tiles, so the channels' rows of M are contiguous.
    #[allow(clippy::too_many_arguments)]
    let finish = |local: &mut Local,
                  ys: &mut [f32],
                  plane0: usize,
                  mm: &[f32],
                  t0: usize,
                  t1: usize,
                  (ta, tz): (usize, usize),
                  ks: std::ops::Range<usize>| {
        let tb = t1 - t0;
        let s = tz - ta;
        debug_assert!(ks.len() == 1 || s == tb);
        let Local {
            scratch, tmp, out, ..
        } = local;
        let len = transform_from_rows(
            &mm[ks.start * tb + (ta - t0)..],
            k_out * tb,
            &alpha,
            ks.len() * s,
            &at,
            scratch,
            tmp,
            out,
        );
        scatter_tiles(&og, ys, plane0, &out[..len], s, ta, s, ks);
    };
    // All channels of a block, a group at a time.
    let finish_all = |bufs: &mut Buffers, ys: &mut [f32], plane0: usize, t0: usize, t1: usize| {
        // The output side's groups rounded up to a power of two: measured (thread CPU time, min
        // of 3 interleaved, 19:23 UTC) the paper layer's forward 12.8 -> 11.4 ms with 8 channels
        // instead of 5 (16: no gain), 128@28² 11.1 -> 10.9, 64@56² and C3D unchanged.
        let kg = group(k_out, t1 - t0).next_power_of_two().min(k_out);
        let Buffers { mm, local, .. } = bufs;
        let mut k0 = 0;
        while k0 < k_out {
            let kn = kg.min(k_out - k0);
            // The next group's output lines, toward L2 while this group is transformed: its
            // scatter then writes lines already there instead of waiting on each from L3 or
            // memory. Measured (thread CPU time, alternating processes, quiet 21:51 UTC session
            // 19): the paper layers' forward 6.97 -> 6.64 and 6.35 -> 6.15 ms (medians of 5);
            // the same for the next group's rows of M (already in cache) was level or worse.
            if k0 + kn < k_out {
                prefetch_tiles(
                    &og,
                    ys,
                    plane0,
                    t0,
                    t1 - t0,
                    k0 + kn..(k0 + 2 * kn).min(k_out),
                );
            }
            finish(local, ys, plane0, mm, t0, t1, (t0, t1), k0..k0 + kn);
            k0 += kn;
        }
    };

    // Few tiles for the threads (each thread's share below the default block: ResNet-50's 256@14²
    // and 512@7² at batch 8, 24 and 16 tiles per thread): split by images, every thread would
    // stream all of U for a part-empty NR-wide panel of tiles, its input and output transforms
    // running on the padded panel as well. Instead the threads share each default-sized block:
    // each transforms its share of the input channels into its own V, the shares are merged
    // into one V (ξ split among the threads), then each thread runs the products of its share
    // of the output channels K (its rows of U only: U is read once in all) and their output
    // transform and scatter. M and the outputs are the same bits as one thread's.
    let default_block = crate::plan::default_block_tiles(a_n, c_in, k_out);
    if threads > 1 && path == GemmPath::Panels && total.div_ceil(threads) < default_block {
        // The block the plan would give one thread (unless it was set: then as set).
        let kblock = if block == total.div_ceil(threads) {
            default_block.clamp(1, total.max(1))
        } else {
            block
        };
        // Thread h: output channels k_at(h)..k_at(h + 1) (whole MR-tall panels of U), input
        // channels c_at(h)..c_at(h + 1).
        let k_panels = k_out.div_ceil(mr);
        let k_at = |h: usize| (h * k_panels / threads * mr).min(k_out);
        let c_at = |h: usize| h * c_in / threads;
        let mut sets: Vec<Pooled> = (0..threads).map(|_| Pooled::take()).collect();
        let mut shared = Pooled::take();
        let (ua, stride_a) = u.panels();
        let img_len = k_out * out_len;
        let mut t0 = 0;
        while t0 < total {
            let t1 = (t0 + kblock).min(total);
            let tb = t1 - t0;
            let tbp = tb.div_ceil(nr) * nr;
            let panels = tbp / nr;
            // 1. Each thread's input channels into its own V (ξ, panels, C_h, NR).
            sets.par_iter_mut().enumerate().for_each(|(h, set)| {
                let Buffers {
                    v,
                    local,
                    segs,
                    runs,
                    ..
                } = &mut set.0;
                input_side(local, segs, runs, v, t0, t1, c_at(h)..c_at(h + 1));
            });
            // 2. Merged into one V (ξ, panels, C, NR), the ξ split among the threads.
            let per_xi = c_in * tbp;
            let vs = &mut shared.0.v;
            vs.resize(a_n * per_xi, 0.0);
            let xi_per = a_n.div_ceil(threads);
            let parts = &sets;
            vs[..a_n * per_xi]
                .par_chunks_mut(xi_per * per_xi)
                .enumerate()
                .for_each(|(i, dst)| {
                    for (xl, dxi) in dst.chunks_exact_mut(per_xi).enumerate() {
                        let xi = i * xi_per + xl;
                        for (p, dp) in dxi.chunks_exact_mut(c_in * nr).enumerate() {
                            for (h, part) in parts.iter().enumerate() {
                                let (c0, c1) = (c_at(h), c_at(h + 1));
                                let ch = c1 - c0;
                                dp[c0 * nr..c1 * nr].copy_from_slice(
                                    &part.0.v[(xi * panels + p) * ch * nr..][..ch * nr],
                                );
                            }
                        }
                    }
                });
            // 3. Each thread's output channels: the products (its rows of U), the output
            // transform and the scatter into its planes of the block's images.
            let (n0, n1) = (t0 / tiles_per_image, (t1 - 1) / tiles_per_image + 1);
            let mut outs: Vec<Vec<(usize, &mut [f32])>> =
                (0..threads).map(|_| Vec::new()).collect();
            for (i, img) in y[n0 * img_len..n1 * img_len]
                .chunks_mut(img_len)
                .enumerate()
            {
                let mut rest = img;
                for (h, list) in outs.iter_mut().enumerate() {
                    let (a, b) = rest.split_at_mut((k_at(h + 1) - k_at(h)) * out_len);
                    list.push((n0 + i, a));
                    rest = b;
                }
            }
            let v = &shared.0.v;
            sets.par_iter_mut()
                .zip(outs.par_iter_mut())
                .enumerate()
                .try_for_each(|(h, (set, ys))| -> Result<()> {
                    let (k0, k1) = (k_at(h), k_at(h + 1));
                    let kn = k1 - k0;
                    if kn == 0 {
                        return Ok(());
                    }
                    let Buffers { mm, local, .. } = &mut set.0;
                    mm.resize(a_n * kn * tb, 0.0);
                    gemm.gemm_packed_batched(
                        kn,
                        tb,
                        c_in,
                        &ua[k0 * c_in..],
                        stride_a,
                        v,
                        per_xi,
                        0.0,
                        mm,
                        tb,
                        kn * tb,
                        a_n,
                    )?;
                    let kg = group(k_out, tb).next_power_of_two().min(kn);
                    let Local {
                        scratch, tmp, out, ..
                    } = local;
                    let mut g0 = 0;
                    while g0 < kn {
                        let gn = kg.min(kn - g0);
                        let len = transform_from_rows(
                            &mm[g0 * tb..],
                            kn * tb,
                            &alpha,
                            gn * tb,
                            &at,
                            scratch,
                            tmp,
                            out,
                        );
                        for (n, ys) in ys.iter_mut() {
                            let (ta, tz) = (
                                t0.max(*n * tiles_per_image),
                                t1.min((*n + 1) * tiles_per_image),
                            );
                            scatter_tiles(
                                &og,
                                ys,
                                *n * k_out + k0,
                                &out[ta - t0..len],
                                tb,
                                ta,
                                tz - ta,
                                k0 + g0..k0 + g0 + gn,
                            );
                        }
                        g0 += gn;
                    }
                    Ok(())
                })?;
            t0 = t1;
        }
        return Ok(());
    }

    // Batches that split evenly over the threads (or are large): each thread runs a contiguous
    // range of the blocks (across images, so small planes of a few tiles per image still make
    // blocks of `block` tiles: blocks cut at every image made VGG-16's 512@4² forward, 1 tile per
    // image at batch 64, 6× slower on 2 threads than on 1), with no waves or barriers in between
    // and its buffers allocated once; a thread whose range is done takes blocks from the back of
    // the range with the most blocks left ([`BlockRanges::take`]). Each image's output planes sit
    // behind a lock, held only while a channel group's tiles are scattered into them (two
    // threads meet in an image only where a range ends). Measured (wino_probe chain: the paper
    // benchmark's three b20 layers at 2 threads, per-task timings, quiet 19:30-19:41 UTC session
    // 26): with whole images per thread the threads' CPU times for the same work differed by
    // 1-7 % (and a thread was now and then descheduled for a few ms), the layer waiting for the
    // slower one (its end 2.3 ms after the other's on average; 0.25 ms with the stealing). Main
    // / stealing, medians of 10 calls, alternating (quiet 19:47:32): 189.0 / 172.4, 199.0 /
    // 181.9, 184.6 / 178.8 ms; paper1_b20 forward minima 58.7 / 58.7, 60.7 / 57.3, backward-data
    // 61.4 / 59.4, 62.2 / 59.2.
    if threads > 1
        && (job.batch.is_multiple_of(threads) || job.batch >= 4 * threads)
        && let Some(ranges) = BlockRanges::new(n_blocks, threads)
    {
        let img_len = k_out * out_len;
        let images: Vec<Mutex<&mut [f32]>> = y.chunks_mut(img_len).map(Mutex::new).collect();
        let (at, ranges, images) = (&at, &ranges, &images);
        return (0..threads)
            .into_par_iter()
            .try_for_each(|task| -> Result<()> {
                let mut pooled = Pooled::take();
                let bufs = &mut pooled.0;
                while let Some(b) = ranges.take(task) {
                    let (t0, t1) = (b * block, ((b + 1) * block).min(total));
                    let tb = t1 - t0;
                    run_block(bufs, t0, t1)?;
                    // As `finish_all`, each image's part of the group scattered under its lock.
                    let (n0, n1) = (t0 / tiles_per_image, (t1 - 1) / tiles_per_image + 1);
                    let part = |n: usize| {
                        let ta = t0.max(n * tiles_per_image);
                        (ta, t1.min((n + 1) * tiles_per_image) - ta)
                    };
                    let lock = |n: usize| images[n].lock().unwrap_or_else(|e| e.into_inner());
                    let kg = group(k_out, tb).next_power_of_two().min(k_out);
                    let Buffers { mm, local, .. } = bufs;
                    let Local {
                        scratch, tmp, out, ..
                    } = local;
                    let mut k0 = 0;
                    while k0 < k_out {
                        let kn = kg.min(k_out - k0);
                        if k0 + kn < k_out {
                            let next = k0 + kn..(k0 + 2 * kn).min(k_out);
                            for n in n0..n1 {
                                let (ta, s) = part(n);
                                prefetch_tiles(&og, &lock(n), n * k_out, ta, s, next.clone());
                            }
                        }
                        let len = transform_from_rows(
                            &mm[k0 * tb..],
                            k_out * tb,
                            &alpha,
                            kn * tb,
                            at,
                            scratch,
                            tmp,
                            out,
                        );
                        for n in n0..n1 {
                            let (ta, s) = part(n);
                            let yb = &out[ta - t0..len];
                            scatter_tiles(&og, &mut lock(n), n * k_out, yb, tb, ta, s, k0..k0 + kn);
                        }
                        k0 += kn;
                    }
                }
                Ok(())
            });
    }

    // Waves of one block per thread; buffers live across waves (no page faults per block).
    let mut pooled: Vec<Pooled> = (0..threads.min(n_blocks)).map(|_| Pooled::take()).collect();
    let bufs: &mut [Pooled] = &mut pooled;
    let mut b = 0;
    while b < n_blocks {
        let wave_end = (b + threads).min(n_blocks);
        let ranges: Vec<(usize, usize)> = (b..wave_end)
            .map(|i| (i * block, ((i + 1) * block).min(total)))
            .collect();
        if ranges.len() == 1 {
            let (t0, t1) = ranges[0];
            run_block(&mut bufs[0].0, t0, t1)?;
            finish_all(&mut bufs[0].0, y, 0, t0, t1);
        } else {
            bufs[..ranges.len()]
                .par_iter_mut()
                .zip(ranges.par_iter())
                .try_for_each(|(buf, &(t0, t1))| run_block(&mut buf.0, t0, t1))?;
            // The wave's output planes (image, channel) in parallel: each plane takes the tiles
            // of its image from every block of the wave.
            let (first, end) = (ranges[0].0, ranges[ranges.len() - 1].1);
            let (n0, n1) = (first / tiles_per_image, (end - 1) / tiles_per_image + 1);
            let bufs = &*bufs;
            let ranges = &ranges;
            y[n0 * k_out * out_len..n1 * k_out * out_len]
                .par_chunks_mut(out_len)
                .enumerate()
                .for_each_init(Local::default, |local, (i, plane)| {
                    let p = n0 * k_out + i;
                    let (n, k) = (p / k_out, p % k_out);
                    let (img0, img1) = (n * tiles_per_image, (n + 1) * tiles_per_image);
                    for (&(t0, t1), buf) in ranges.iter().zip(bufs) {
                        let (ta, tz) = (t0.max(img0), t1.min(img1));
                        if ta < tz {
                            finish(local, plane, p, &buf.0.mm, t0, t1, (ta, tz), k..k + 1);
                        }
                    }
                });
        }
        b = wave_end;
    }
    Ok(())
}

/// Contiguous ranges of blocks, one per thread, that a thread whose range is done steals from:
/// each range `lo..hi` packed in one atomic as `lo << 32 | hi`.
struct BlockRanges(Vec<AtomicU64>);

impl BlockRanges {
    /// `n` blocks split evenly into `threads` ranges; `None` beyond 2³² − 1 blocks.
    fn new(n: usize, threads: usize) -> Option<BlockRanges> {
        u32::try_from(n).ok()?;
        Some(BlockRanges(
            (0..threads)
                .map(|t| {
                    let (lo, hi) = (t * n / threads, (t + 1) * n / threads);
                    AtomicU64::new(((lo as u64) << 32) | hi as u64)
                })
                .collect(),
        ))
    }

    /// The next block for task `t`: the front of its own range, else the back of the range with
    /// the most blocks left; `None` once every range is empty. Every block is returned once.
    fn take(&self, t: usize) -> Option<usize> {
        let pop = |r: &AtomicU64, front: bool| -> Option<usize> {
            let mut v = r.load(Ordering::Relaxed);
            loop {
                let (lo, hi) = (v >> 32, v & 0xffff_ffff);
                if lo >= hi {
                    return None;
                }
                let (nv, b) = if front {
                    (((lo + 1) << 32) | hi, lo)
                } else {
                    ((lo << 32) | (hi - 1), hi - 1)
                };
                match r.compare_exchange_weak(v, nv, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => return usize::try_from(b).ok(),
                    Err(x) => v = x,
                }
            }
        };
        if let Some(b) = self.0.get(t).and_then(|r| pop(r, true)) {
            return Some(b);
        }
        loop {
            let (best, left) = self
                .0
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let v = r.load(Ordering::Acquire);
                    (i, (v & 0xffff_ffff).saturating_sub(v >> 32))
                })
                .max_by_key(|&(_, left)| left)?;
            if left == 0 {
                return None;
            }
            if let Some(b) = pop(&self.0[best], false) {
                return Some(b);
            }
        }
    }
}

/// Channels per group of the per-channel-group transforms, for tiles of `a_n` values and blocks
/// of `tb` tiles: a group's tiles within about 128 KiB (`GROUP_FLOATS`), but rows of at least
/// `GROUP_MIN_ROW` values for the transform products (each product call has a fixed cost).
/// Measured (thread CPU time, min of 3 interleaved runs, 18:10 UTC): 4-11 channels (paper layer
/// 5, 64@56² 11) beat 1-2 by 10-20 % and beat 22 or all of them by 5-15 %; C3D (α^N = 216,
/// 48 tiles) wants 6 rather than 3.
pub(crate) fn channel_group(channels: usize, a_n: usize, tb: usize) -> usize {
    let by_size = GROUP_FLOATS / (a_n * tb).max(1);
    let by_row = GROUP_MIN_ROW.div_ceil(tb.max(1));
    by_size.max(by_row).clamp(1, channels.max(1))
}

/// See [`channel_group`].
const GROUP_FLOATS: usize = 32768;
/// See [`channel_group`].
const GROUP_MIN_ROW: usize = 256;

/// Per-thread buffers of one block: V (ξ, C, T_b), M (ξ, K, T_b) and the per-channel buffers.
#[derive(Debug, Default)]
struct Buffers {
    v: AlignedVec,
    mm: AlignedVec,
    local: Local,
    segs: Vec<Segment>,
    runs: Vec<usize>,
}

impl Buffers {
    /// Bytes of storage held (capacities).
    fn bytes(&self) -> usize {
        let l = &self.local;
        4 * (self.v.capacity()
            + self.mm.capacity()
            + l.d.capacity()
            + l.scratch.capacity()
            + l.tmp.capacity()
            + l.out.capacity()
            + l.ex.capacity()
            + l.pt.capacity())
            + size_of::<Segment>() * self.segs.capacity()
            + size_of::<usize>() * self.runs.capacity()
    }
}

/// The input side by phases of the last dimension (forward and backward-data, 2 or more
/// dimensions): along the last dimension a tile of α values at step m overlaps the next tiles,
/// input position w = q·m + r of tile j being position r of tile j + q. So the gather reads only
/// the m phases r < m of each tile (plus `extra` = ⌈α/m⌉ − 1 phantom tiles after each run of
/// neighbours), the modes before the last run on those (m instead of α rows along the last
/// dimension: F(6, 4) 6 of 9), and the α rows of the last mode are then copied, per run, from the
/// transformed phases shifted by q tiles (contiguous copies), instead of being gathered by
/// strided reads of the source. Measured against the plain gather (thread CPU time, min of 4
/// interleaved rounds, one binary, 06:06 UTC session 8): the paper's 4×4 layer forward 0.977×,
/// backward-data 0.957×, backward-filter 0.960×; 64@56² forward 0.973×, backward-filter 0.988×;
/// C3D forward 0.973×, backward-filter 1.00×.
#[derive(Debug, Clone)]
pub(crate) struct Phased {
    /// The gather's tile: α along every dimension but the last, m along it.
    tile: Vec<usize>,
    /// Phantom tiles per run.
    extra: usize,
    /// Whether [`input_side_phased`] takes the fused 2-D form ([`fused_rows_2d`]); `None`: by
    /// [`fused_applies`].
    pub(crate) fused: Option<bool>,
}

impl Phased {
    /// `None` where phases gain nothing: one dimension (no mode runs before the last), or α = m
    /// along the last one (no overlap).
    pub(crate) fn new(alpha: &[usize], m: &[usize]) -> Option<Phased> {
        let last = alpha.len().checked_sub(1)?;
        if last == 0 || alpha[last] <= m[last] {
            return None;
        }
        let mut tile = alpha.to_vec();
        tile[last] = m[last];
        Some(Phased {
            tile,
            extra: alpha[last].div_ceil(m[last]) - 1,
            fused: None,
        })
    }
}

/// What [`input_side_phased`] reads: channels of `src` (images × `channels` × `dims`), tiles of
/// `alpha` at `step` (`tpd` per dimension, `pad` before), transformed by `mats` (one per mode).
pub(crate) struct PhasedSource<'a> {
    pub src: &'a [f32],
    pub dims: &'a [usize],
    /// Channels per image of `src` (the plane stride).
    pub channels: usize,
    /// Channels transformed: `0..count` from `src`'s start.
    pub count: usize,
    pub pad: &'a [isize],
    pub alpha: &'a [usize],
    pub step: &'a [usize],
    pub tpd: &'a [usize],
    pub mats: &'a [&'a SparseTransform<f32>],
}

/// The buffers of [`input_side_phased`].
pub(crate) struct PhasedBufs<'a> {
    pub d: &'a mut AlignedVec,
    pub scratch: &'a mut AlignedVec,
    pub tmp: &'a mut AlignedVec,
    pub ex: &'a mut AlignedVec,
    pub pt: &'a mut AlignedVec,
    pub segs: &'a mut Vec<Segment>,
    pub ends: &'a mut Vec<usize>,
}

/// The input side of one block through phases ([`Phased`]): every channel group's rows of the
/// transformed tiles, as the gather + [`transform_into_rows`] path writes them into `v` (rows
/// `ldv` apart, group `c0..` at `dest(c0)`; each channel's tiles `tbp` ≥ `tb` apart, the lanes
/// `tb..tbp` unspecified).
///
/// Per group: the phases of the block's tiles (α^(N−1)·m rows × channels × tbp), then those of
/// the phantom tiles after each run, are gathered; the modes before the last run on them, the
/// last of them writing rows r < m straight into `ex`, laid out as the last mode reads it ((ξ′,
/// α, channels, tbp), ξ′ over the transformed modes before the last); rows w = q·m + r ≥ m are
/// row r shifted by q tiles, the last q tiles of each run taken from the transformed phantoms;
/// then the last mode writes the destination from `ex`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn input_side_phased(
    ph: &Phased,
    inp: &PhasedSource<'_>,
    t0: usize,
    tb: usize,
    tbp: usize,
    cg: usize,
    bufs: PhasedBufs<'_>,
    v: &mut [f32],
    ldv: usize,
    dest: impl Fn(usize) -> RowsDest,
) {
    let PhasedBufs {
        d,
        scratch,
        tmp,
        ex,
        pt,
        segs,
        ends,
    } = bufs;
    let (alpha, m, tpd) = (inp.alpha, inp.step, inp.tpd);
    let last = alpha.len() - 1;
    let (s, a_last, extra) = (m[last], alpha[last], ph.extra);
    let (c_in, count) = (inp.channels, inp.count);
    let in_len: usize = inp.dims.iter().product();
    let (prefix, b_last) = inp.mats.split_at(last);
    let b_last = b_last[0];
    let (before, lastp) = prefix.split_at(last - 1);
    let lastp = lastp[0];
    let a_p = alpha[last - 1];
    // ξ′: rows over the modes before the last, after their transforms (α^(N−1)).
    let outer: usize = alpha[..last].iter().product();
    let fused = ph.fused.unwrap_or_else(|| fused_applies(inp));
    let n_ph = if fused {
        0
    } else {
        block_runs(tpd, t0, tb, ends);
        gather_segments(
            inp.dims,
            &ph.tile,
            m,
            inp.pad,
            tpd,
            t0,
            tb,
            (extra, 0),
            segs,
        )
    };
    let tile_n: usize = ph.tile.iter().product();
    // For each shift q = 1..=extra, the tiles j whose tile j + q lies past their run's end, and
    // the phantom that stands for it: `fixes[fix_at[q − 1]..fix_at[q]]`.
    let (mut fixes, mut fix_at) = (Vec::new(), vec![0]);
    for q in 1..=extra {
        let mut start = 0;
        for (k, &end) in ends.iter().enumerate() {
            for j in end.saturating_sub(q).max(start)..end {
                fixes.push((j, k * extra + j + q - end));
            }
            start = end;
        }
        fix_at.push(fixes.len());
    }
    let mut dims = Vec::with_capacity(last + 1);
    let mut c0 = 0;
    while c0 < count {
        let cn = cg.min(count - c0);
        if fused {
            // The rows before the last mode straight from the source (see `fused_rows_2d`).
            let ex_row = cn * tbp;
            ex.resize(outer * a_last * ex_row, 0.0);
            let to = dest(c0);
            // Into V's panels: `ex` in panel order, the last mode straight into each panel.
            let panel = match to {
                RowsDest::Panels { seg, len, nr, .. }
                    if seg == tbp && len == tbp && nr > 0 && tbp.is_multiple_of(nr) =>
                {
                    Some(nr)
                }
                _ => None,
            };
            fused_rows_2d(inp, lastp, t0, tb, tbp, c0..c0 + cn, panel, d, scratch, ex);
            if let (
                Some(nr),
                RowsDest::Panels {
                    at, panel_stride, ..
                },
            ) = (panel, to)
            {
                // Panel p of `ex`'s rows (cn · nr values) is the group's piece of V's panel p:
                // the product writes it in place, no copies.
                let rows = b_last.rows();
                for o in 0..outer {
                    for p in 0..tbp / nr {
                        strided_product(
                            b_last,
                            cn * nr,
                            &ex[o * a_last * ex_row + p * cn * nr..],
                            ex_row,
                            &mut v[at + o * rows * ldv + p * panel_stride..],
                            ldv,
                        );
                    }
                }
                c0 += cn;
                continue;
            }
            if let RowsDest::Panels { .. } = to {
                scratch.grow_to(b_last.rows() * ex_row);
            }
            for o in 0..outer {
                last_mode_rows(
                    b_last,
                    o,
                    &ex[o * a_last * ex_row..],
                    ex_row,
                    scratch,
                    v,
                    ldv,
                    dest(c0),
                );
            }
            c0 += cn;
            continue;
        }
        // The tiles' phases (rows × channels × tbp), then the phantoms' (rows × channels ×
        // n_ph). Every column but the padding lanes tb..tbp is written (they only meet B's
        // padding columns, which never reach M): no clearing.
        let main = tile_n * cn * tbp;
        d.resize(main + tile_n * cn * n_ph, 0.0);
        gather_apply(
            segs,
            inp.src,
            in_len,
            c_in,
            c0..c0 + cn,
            s,
            tbp,
            (extra, main, n_ph),
            d,
        );
        let (d, dph) = d.split_at(main);
        // The phantoms through every mode but the last: (ξ′, s, channels, n_ph) in `pt`.
        dims.clear();
        dims.extend_from_slice(&alpha[..last]);
        dims.push(s * cn * n_ph);
        let pt_len = multi_mode_product_unchecked(dph, &dims, prefix, scratch, pt);
        let pt = &pt[..pt_len];
        // The tiles: every mode before the last; the last of them writes rows r < s of each ξ′
        // of `ex`.
        let inner = s * cn * tbp;
        let ex_row = cn * tbp;
        ex.resize(outer * a_last * ex_row, 0.0);
        let src: &[f32] = if before.is_empty() {
            d
        } else {
            dims.clear();
            dims.extend_from_slice(&alpha[..last - 1]);
            dims.push(a_p * inner);
            let len = multi_mode_product_unchecked(d, &dims, before, scratch, tmp);
            &tmp[..len]
        };
        for o2 in 0..outer / a_p {
            strided_product(
                lastp,
                inner,
                &src[o2 * a_p * inner..],
                inner,
                &mut ex[o2 * a_p * a_last * ex_row..],
                a_last * ex_row,
            );
        }
        // Rows w ≥ s: row r = w mod s shifted by q = w / s tiles within each run.
        for o in 0..outer {
            let blk = &mut ex[o * a_last * ex_row..][..a_last * ex_row];
            for w in s..a_last {
                let (q, r) = (w / s, w % s);
                let (lo, hi) = blk.split_at_mut(w * ex_row);
                let fix = &fixes[fix_at[q - 1]..fix_at[q]];
                for c in 0..cn {
                    let src = &lo[r * ex_row + c * tbp..][..tbp];
                    let dst = &mut hi[c * tbp..][..tb];
                    let phs = &pt[((o * s + r) * cn + c) * n_ph..][..n_ph];
                    let qq = q.min(tb);
                    dst[..tb - qq].copy_from_slice(&src[qq..tb]);
                    for &(j, p) in fix {
                        dst[j] = phs[p];
                    }
                }
            }
        }
        // The last mode.
        if let RowsDest::Panels { .. } = dest(c0) {
            scratch.grow_to(b_last.rows() * ex_row);
        }
        for o in 0..outer {
            last_mode_rows(
                b_last,
                o,
                &ex[o * a_last * ex_row..],
                ex_row,
                scratch,
                v,
                ldv,
                dest(c0),
            );
        }
        c0 += cn;
    }
}

/// Source planes of at least this many values take the fused 2-D input side
/// ([`fused_rows_2d`]). Measured (wino_probe blocks, forward, CPU ms, minima, base / fused,
/// alternating processes, quiet 14:08-14:17 UTC session 24): the paper layers (224², 6×6) 6.15 /
/// 5.65, 5.93 / 5.52, 5.68 / 5.06 (batch 20: 121.2-123.4 / 113.6-117.3), VGG 128@112² (7×7)
/// 78.0-86.1 / 73.7-75.0, 64@224² (7×4) 113.7-120.0 / 112.6-113.4; on planes that stay in cache
/// it loses: ResNet-50 64@56² (7×4, 3136 values) 7.65-7.83 / 7.87-7.95, 512@7² (7×2) 8.73-8.99 /
/// 9.17-10.24, 128@28² and 256@14² level.
const FUSED_MIN_PLANE: usize = 8192;

/// Whether the 2-D input side reads the source by [`fused_rows_2d`]: two dimensions, large
/// planes ([`FUSED_MIN_PLANE`]) and m ≥ 3 along the last one.
fn fused_applies(inp: &PhasedSource<'_>) -> bool {
    inp.dims.len() == 2 && inp.dims.iter().product::<usize>() >= FUSED_MIN_PLANE && inp.step[1] >= 3
}

/// The 2-D input side's rows before the last mode, fused with the gather: per run of a block's
/// tiles along the last dimension and channel, mode 0 (`b0`, α₀ × α₀) runs straight on the
/// source rows (contiguous vector reads, `z` = α₀ × the run's α₁ + (run − 1)·m₁ columns; columns
/// outside the source are zero, rows outside it are staged), then each transformed row of `z` is
/// de-interleaved by `core_blas::Gemm::deinterleave` into its m₁ phases, the tiles' columns
/// w < m₁ of `ex` ((α₀, α₁, channels, tbp)); column w ≥ m₁ is column w − m₁ shifted by one tile.
/// No phantom tiles and no strided reads of the source: the gather's source reads waited on the
/// lines (session 18: a vectorised gather alone was level), the product's contiguous ones, with
/// the source band of the (run, channel) [`FUSED_PREFETCH`] items on prefetched toward L2, do not
/// (measured at [`FUSED_MIN_PLANE`]; without the prefetch the fused form was 7-10 % slower than
/// the gather).
///
/// With `panel = Some(nr)` the columns of `ex`'s rows are in panel order instead, (⌈tbp / nr⌉
/// panels, channels, nr): each panel's cn · nr values are then the group's piece of the
/// (panels, C, NR) micro-panels of V, which the last mode writes in place (no copies through
/// scratch). The runs are cut where they cross a panel. Measured (wino_probe blocks, forward,
/// thread CPU ms, minima, alternating processes, quiet 19:31:12 and 19:36:05 UTC session 26): the
/// paper layers 5.64-5.83 → 5.44-5.61, 5.68-6.00 → 5.47-5.63, 5.46-5.54 → 5.21-5.39 (one
/// binary, 9 of 9 pairs faster); main / new 6.01 / 5.71, 5.86 / 5.69, 5.71 / 5.69, 5.76 / 5.62,
/// 5.55 / 5.74, 5.69 / 5.56, 5.19 / 5.26, 5.14 / 4.97, 5.10 / 5.00 (7 of 9).
#[allow(clippy::too_many_arguments)]
fn fused_rows_2d(
    inp: &PhasedSource<'_>,
    b0: &SparseTransform<f32>,
    t0: usize,
    tb: usize,
    tbp: usize,
    chans: std::ops::Range<usize>,
    panel: Option<usize>,
    stage: &mut AlignedVec,
    z: &mut AlignedVec,
    ex: &mut [f32],
) {
    let (h, w) = (inp.dims[0], inp.dims[1]);
    let (a0, a1) = (inp.alpha[0], inp.alpha[1]);
    let (m0, m1) = (inp.step[0], inp.step[1]);
    let (tp0, tp1) = (inp.tpd[0], inp.tpd[1]);
    let per_image = tp0 * tp1;
    let cn = chans.len();
    let ex_row = cn * tbp;
    let max_zw = (tp1.min(tb) - 1) * m1 + a1;
    let ldz = max_zw.next_multiple_of(16);
    z.grow_to(a0 * ldz);
    // The block's runs: (first block tile, tiles, image, tile row, first tile column).
    let mut runs = Vec::new();
    let mut j = 0;
    while j < tb {
        let t = t0 + j;
        let img = t / per_image;
        let (ty, tx) = ((t % per_image) / tp1, t % tp1);
        let run = (tp1 - tx).min(tb - j);
        runs.push((j, run, img, ty, tx));
        j += run;
    }
    let pfd = FUSED_PREFETCH;
    let gemm = Gemm::global().ok();
    // The source rows and columns a (run, channel) reads: (plane offset, rows, columns).
    let band = |k: usize, c: usize| {
        let (_, run, img, ty, tx) = runs[k];
        let zw = (run - 1) * m1 + a1;
        let row0 = (ty * m0) as isize - inp.pad[0];
        let col0 = (tx * m1) as isize - inp.pad[1];
        let lo = (-col0).clamp(0, zw as isize) as usize;
        let hi = (w as isize - col0).clamp(lo as isize, zw as isize) as usize;
        let r_lo = row0.clamp(0, h as isize) as usize;
        let r_hi = (row0 + a0 as isize).clamp(0, h as isize) as usize;
        let plane = (img * inp.channels + c) * h * w;
        (plane, row0, col0, zw, lo, hi, r_lo, r_hi)
    };
    let items = runs.len() * cn;
    for it in 0..items {
        let (k, cl) = (it / cn, it % cn);
        let c = chans.start + cl;
        {
            // The band `pfd` items on (next channel of the run, the next run, or the next
            // group's first channels), toward L2.
            let nx = it + pfd;
            let (nk, nc) = if nx < items {
                (nx / cn, chans.start + nx % cn)
            } else {
                (0, chans.end + (nx - items))
            };
            if nc < inp.count {
                let (plane, _, col0, _, lo, hi, r_lo, r_hi) = band(nk, nc);
                if lo < hi {
                    for r in r_lo..r_hi {
                        let at = plane + r * w + (col0 + lo as isize) as usize;
                        for i in (0..hi - lo).step_by(16) {
                            core_blas::pack::prefetch_l2(inp.src, at + i);
                        }
                        core_blas::pack::prefetch_l2(inp.src, at + hi - lo - 1);
                    }
                }
            }
        }
        let (j, run, ..) = runs[k];
        let (plane, row0, col0, zw, lo, hi, _, _) = band(k, c);
        {
            // Columns outside the source transform to zero (mode 0 acts column by column): only
            // the in-range columns lo..hi of z are computed; rows outside it are staged.
            if lo > 0 || hi < zw {
                for o in 0..a0 {
                    z[o * ldz..][..lo].fill(0.0);
                    z[o * ldz + hi..][..zw - hi].fill(0.0);
                }
            }
            if lo < hi {
                let c_at = (col0 + lo as isize) as usize;
                if row0 >= 0 && row0 as usize + a0 <= h {
                    let at = plane + row0 as usize * w + c_at;
                    strided_product(b0, hi - lo, &inp.src[at..], w, &mut z[lo..], ldz);
                } else {
                    let sw = hi - lo;
                    stage.grow_to(a0 * sw);
                    for i in 0..a0 {
                        let dst = &mut stage[i * sw..][..sw];
                        let r = row0 + i as isize;
                        if r < 0 || r as usize >= h {
                            dst.fill(0.0);
                        } else {
                            dst.copy_from_slice(&inp.src[plane + r as usize * w + c_at..][..sw]);
                        }
                    }
                    strided_product(b0, sw, stage, sw, &mut z[lo..], ldz);
                }
            }
            for o in 0..a0 {
                let zr = &z[o * ldz..];
                // The run in pieces that stay in one panel (panel order), or whole.
                let mut ja = j;
                while ja < j + run {
                    let (jb, pos) = match panel {
                        Some(nr) => (
                            ((ja / nr + 1) * nr).min(j + run),
                            (ja / nr) * cn * nr + cl * nr + ja % nr,
                        ),
                        None => (j + run, cl * tbp + ja),
                    };
                    let n = jb - ja;
                    let zo = (ja - j) * m1;
                    let base = o * a1 * ex_row + pos;
                    let done = gemm.is_some_and(|g| {
                        g.deinterleave(&mut ex[base..], ex_row, &zr[zo..][..n * m1], m1, n)
                            .is_ok()
                    });
                    if !done {
                        for wi in 0..m1 {
                            let dst = &mut ex[base + wi * ex_row..][..n];
                            strided_read(dst, &zr[zo + wi..], m1);
                        }
                    }
                    // Row w ≥ m₁: row w − m₁ shifted by one tile, the piece's last tile from z.
                    for wi in m1..a1 {
                        let (lo_rows, hi_rows) = ex.split_at_mut(base + wi * ex_row);
                        let prev = &lo_rows[base + (wi - m1) * ex_row..][..n];
                        let dst = &mut hi_rows[..n];
                        dst[..n - 1].copy_from_slice(&prev[1..]);
                        dst[n - 1] = zr[zo + (n - 1) * m1 + wi];
                    }
                    ja = jb;
                }
            }
        }
    }
}

/// Prefetch distance of [`fused_rows_2d`], in (run, channel) items. Measured (paper layers b1
/// forward, quiet 14:02:20 UTC session 24, minima): 1 and 3 level (17.06-17.26 ms for the three
/// layers), none 18.6-19.2.
const FUSED_PREFETCH: usize = 2;

thread_local! {
    /// Block buffers kept by each thread between calls (see [`Pooled`]).
    static POOL: RefCell<Vec<Buffers>> = const { RefCell::new(Vec::new()) };
}

/// Bytes held by the calling thread's pool of block buffers ([`Pooled`]); 0 while it is in use
/// by a pass on this thread.
pub(crate) fn pool_bytes() -> usize {
    POOL.try_with(|p| {
        p.try_borrow()
            .map_or(0, |p| p.iter().map(Buffers::bytes).sum())
    })
    .unwrap_or(0)
}

/// Frees the calling thread's pool of block buffers ([`Pooled`]); returns the bytes freed.
/// Buffers lent out to a running pass come back to the pool when it ends.
pub(crate) fn release_pool() -> usize {
    POOL.try_with(|p| {
        p.try_borrow_mut().map_or(0, |mut p| {
            let bytes = p.iter().map(Buffers::bytes).sum();
            *p = Vec::new();
            bytes
        })
    })
    .unwrap_or(0)
}

/// Most block-buffer sets a thread keeps (one per concurrent block it has lent out: the waves
/// of the calling thread take one per pool thread).
const POOL_KEEP: usize = 8;

/// A thread's block buffers, taken from its pool and returned on drop: V and M (about 2 MiB at
/// the default block size) are reused by the next call on this thread, in any plan, instead of
/// being allocated, page-faulted and zeroed on every call. Measured (thread CPU time, min of 4-6
/// interleaved rounds, both arms on the same core-blas, 21:45 UTC): the paper's 4×4 layer forward
/// −8 %, backward-data −9 %; 64@56² neutral.
#[derive(Debug)]
struct Pooled(Buffers);

impl Pooled {
    fn take() -> Self {
        Pooled(
            POOL.try_with(|p| p.borrow_mut().pop())
                .ok()
                .flatten()
                .unwrap_or_default(),
        )
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let b = std::mem::take(&mut self.0);
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < POOL_KEEP {
                p.push(b);
            }
        });
    }
}

/// Buffers of the per-channel-group transforms: gathered tiles, mode-product scratch and
/// intermediate, transformed outputs.
#[derive(Debug, Default)]
struct Local {
    d: AlignedVec,
    scratch: AlignedVec,
    tmp: AlignedVec,
    out: AlignedVec,
    /// The last mode's input by phases ([`Phased`]).
    ex: AlignedVec,
    /// The phantom tiles' phases through the modes before the last ([`Phased`]).
    pt: AlignedVec,
}

/// The output side's geometry, for [`scatter_tiles`].
struct OutGeom<'a> {
    output: &'a [usize],
    out_strides: Vec<usize>,
    m: &'a [usize],
    tpd: &'a [usize],
    tiles_per_image: usize,
    out_len: usize,
    /// Channels per image of the output.
    k_total: usize,
}

/// One output line of a run of tiles (see [`OutGeom::for_each_line`]).
#[derive(Clone, Copy)]
struct Line {
    /// The run's image.
    n: usize,
    /// The run's first tile, relative to the first tile visited.
    j: usize,
    /// Tiles in the run (neighbours along the last dimension).
    run: usize,
    /// Flat index of the line's position in the tile over the dimensions before the last.
    pf: usize,
    /// Offset of the line within an output plane.
    off: usize,
    /// First output column of the run.
    o0: usize,
}

impl OutGeom<'_> {
    /// Calls `f` for every in-range output line that tiles `ta..ta + s` write: the tiles in runs
    /// sharing the image and every tile index but the last (as in [`gather_segments`]), each run's
    /// lines (positions over the dimensions before the last that fall inside the output).
    fn for_each_line(&self, ta: usize, s: usize, mut f: impl FnMut(Line)) {
        let m = self.m;
        let last = m.len() - 1;
        let prefix_n: usize = m[..last].iter().product();
        let mut tidx = vec![0; m.len()];
        let mut wi = vec![0; last];
        let tz = ta + s;
        let mut t = ta;
        while t < tz {
            let n = t / self.tiles_per_image;
            unravel(t % self.tiles_per_image, self.tpd, &mut tidx);
            let run = (self.tpd[last] - tidx[last]).min(tz - t);
            let o0 = tidx[last] * m[last];
            'rows: for pf in 0..prefix_n {
                unravel(pf, &m[..last], &mut wi);
                let mut off = 0;
                for dd in 0..last {
                    let o = tidx[dd] * m[dd] + wi[dd];
                    if o >= self.output[dd] {
                        continue 'rows;
                    }
                    off += o * self.out_strides[dd];
                }
                f(Line {
                    n,
                    j: t - ta,
                    run,
                    pf,
                    off,
                    o0,
                });
            }
            t += run;
        }
    }
}

/// Scatters the outputs of tiles `ta..ta + s` and channels `ks`, `yb` laid out
/// (m^N, ks.len(), cols) with tile `ta` in column 0 (`cols` ≥ `s`), into `ys`: the output planes (image, channel) from plane `plane0` on. Only
/// the in-range part of edge tiles is written, in runs of tiles along the last dimension as in
/// [`gather_segments`]: contiguous reads of `yb`'s rows, writes with stride m into the same few
/// output lines.
fn scatter_tiles(
    og: &OutGeom<'_>,
    ys: &mut [f32],
    plane0: usize,
    yb: &[f32],
    cols: usize,
    ta: usize,
    s: usize,
    ks: std::ops::Range<usize>,
) {
    debug_assert!(cols >= s);
    let m_last = og.m[og.m.len() - 1];
    let out_last = og.output[og.m.len() - 1];
    let kn = ks.len();
    let row_stride = kn * cols;
    og.for_each_line(
        ta,
        s,
        |Line {
             n,
             j,
             run,
             pf,
             off,
             o0,
         }| {
            // Tiles 0..full of the run have all m columns in range: written tile by tile as
            // contiguous runs of m values interleaving the m rows of `yb` (one pass over the output
            // line instead of m strided ones); the rest column by column.
            let full = ((out_last - o0.min(out_last)) / m_last).min(run);
            for (kl, k) in ks.clone().enumerate() {
                let plane = n * og.k_total + k - plane0;
                let row = &mut ys[plane * og.out_len + off..][..out_last];
                let src = &yb[(pf * m_last * kn + kl) * cols + j..];
                interleave_rows(&mut row[o0..], src, row_stride, full, m_last);
                if full == run {
                    continue;
                }
                // The run's tiles past `full` (in a whole tile row, only its last, partial tile):
                // column by column.
                let end = out_last.min(o0 + run * m_last);
                if run - full == 1 {
                    let col0 = o0 + full * m_last;
                    for (i, v) in row[col0.min(end)..end].iter_mut().enumerate() {
                        *v = src[i * row_stride + full];
                    }
                    continue;
                }
                for i in 0..m_last {
                    // Run tile jj writes output column o0 + jj·m + i, in range for jj < cnt.
                    let first = o0 + full * m_last + i;
                    if first >= out_last {
                        continue;
                    }
                    let cnt = (out_last - first).div_ceil(m_last).min(run - full);
                    strided_write(
                        &mut row[first..],
                        &src[i * row_stride + full..][..cnt],
                        m_last,
                    );
                }
            }
        },
    );
}

/// Brings toward L2 (a prefetch, no write) the output lines that [`scatter_tiles`] writes for
/// tiles `ta..ta + s` and channels `ks`: the same lines ([`OutGeom::for_each_line`]).
fn prefetch_tiles(
    og: &OutGeom<'_>,
    ys: &[f32],
    plane0: usize,
    ta: usize,
    s: usize,
    ks: std::ops::Range<usize>,
) {
    let m_last = og.m[og.m.len() - 1];
    let out_last = og.output[og.m.len() - 1];
    og.for_each_line(
        ta,
        s,
        |Line {
             n, run, off, o0, ..
         }| {
            let end = out_last.min(o0 + run * m_last);
            if o0 >= end {
                return;
            }
            for k in ks.clone() {
                // Out-of-range indices are ignored by `prefetch_l2`.
                let at = (n * og.k_total + k - plane0) * og.out_len + off;
                for i in (o0..end).step_by(16) {
                    core_blas::pack::prefetch_l2(ys, at + i);
                }
                core_blas::pack::prefetch_l2(ys, at + end - 1);
            }
        },
    );
}

/// One contiguous destination run of a gather: for each channel, `dst` row `row` (tile position)
/// at tile columns `j .. j + run` takes the source values `src[img, channel][off + q · step]`,
/// `q < hi − lo`, at columns `j + lo .. j + hi`, and zeros elsewhere (padding). With phantom
/// tiles (see [`gather_segments`]) the sequence goes on past the run (`hi` may exceed `run`) into
/// the columns `ph ..` of the same row.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    img: usize,
    off: usize,
    row: usize,
    j: usize,
    lo: usize,
    hi: usize,
    run: usize,
    ph: usize,
}

/// The segments of a gather of `tb` tiles (global tile indices `t0..t0 + tb`) from sources of
/// shape `src_dims`: computed once per block and applied to every channel group
/// ([`gather_apply`]), so the index arithmetic is not repeated per channel. Tile `t` of image `n`
/// starts at `tidx · step − pad` per dimension, `tpd` tiles per dimension.
///
/// The tiles of a block are taken in runs that share the image and every tile index but the
/// last (neighbours along the last dimension); for each destination row (tile position, channel)
/// the run is one contiguous write along the tile index, reading the source row with stride
/// `step`. (Writing tile by tile instead touches a new cache line of `dst` for every element.)
///
/// With `extra > 0` each run is followed by `extra` "phantom" tiles, the next tiles along the last
/// dimension (zero where they leave the source), written at columns `ph_at + k · extra ..` for
/// run `k` (see [`block_runs`]). Returns the columns written per row: `ph_at + extra · runs`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_segments(
    src_dims: &[usize],
    tile_dims: &[usize],
    step: &[usize],
    pad: &[isize],
    tpd: &[usize],
    t0: usize,
    tb: usize,
    (extra, ph_at): (usize, usize),
    segs: &mut Vec<Segment>,
) -> usize {
    segs.clear();
    let rank = src_dims.len();
    let last = rank - 1;
    let src_strides = strides(src_dims);
    let prefix_n: usize = tile_dims[..last].iter().product();
    let per_image: usize = tpd.iter().product();
    let a_last = tile_dims[last];
    let width = src_dims[last] as isize;
    let s_last = step[last] as isize;
    let (mut tidx, mut xi) = (vec![0; rank], vec![0; last]);
    let (mut j, mut segs_runs) = (0, 0);
    while j < tb {
        let t = t0 + j;
        let img = t / per_image;
        unravel(t % per_image, tpd, &mut tidx);
        let run = (tpd[last] - tidx[last]).min(tb - j);
        let q0 = tidx[last] as isize;
        let ph = ph_at + segs_runs * extra;
        for pf in 0..prefix_n {
            unravel(pf, &tile_dims[..last], &mut xi);
            let mut off = Some(0usize);
            for d in 0..last {
                let coord = (tidx[d] * step[d] + xi[d]) as isize - pad[d];
                if coord < 0 || coord as usize >= src_dims[d] {
                    // A padding row of the tiles: zero for every position and channel.
                    off = None;
                    break;
                }
                off = off.map(|o| o + coord as usize * src_strides[d]);
            }
            for i in 0..a_last {
                let row = pf * a_last + i;
                let Some(off) = off else {
                    segs.push(Segment {
                        img,
                        off: 0,
                        row,
                        j,
                        lo: 0,
                        hi: 0,
                        run,
                        ph,
                    });
                    continue;
                };
                // Source column of run tile jj: base + jj · step; in range for jj in [lo, hi).
                let base = q0 * s_last - pad[last] + i as isize;
                let lo = if base >= 0 {
                    0
                } else {
                    ((-base + s_last - 1) / s_last) as usize
                };
                let hi = if base >= width {
                    0
                } else {
                    ((width - base + s_last - 1) / s_last) as usize
                };
                let (lo, hi) = (lo.min(run + extra), hi.min(run + extra));
                let (lo, hi, first) = if lo >= hi {
                    (0, 0, 0)
                } else {
                    (lo, hi, (base + lo as isize * s_last) as usize)
                };
                segs.push(Segment {
                    img,
                    off: off + first,
                    row,
                    j,
                    lo,
                    hi,
                    run,
                    ph,
                });
            }
        }
        j += run;
        segs_runs += 1;
    }
    ph_at + extra * segs_runs
}

/// The runs of the block `t0 .. t0 + tb` (neighbours along the last dimension) in the order of
/// [`gather_segments`]: the block tile after each run's last one.
pub(crate) fn block_runs(tpd: &[usize], t0: usize, tb: usize, ends: &mut Vec<usize>) {
    ends.clear();
    let last = tpd.len() - 1;
    let mut j = 0;
    while j < tb {
        // The last tile index of tile t0 + j (the image and the other indices do not matter).
        let within = (t0 + j) % tpd[last];
        j += (tpd[last] - within).min(tb - j);
        ends.push(j);
    }
}

/// Applies gather segments to the channels `chans` of `src` (images × `channels` × `src_len`)
/// with source step `step` (the last dimension's) into `dst` (`rows` × `chans.len()` × `cols`),
/// writing every entry covered by the segments (all of `dst` for segments of a whole block).
/// With `phantoms = (extra, base, n)` (the `extra` of [`gather_segments`], called with `ph_at` =
/// 0), the phantom tiles of each segment go to `dst[base + (row · chans.len() + channel) · n +
/// ph ..]`: (`rows` × `chans.len()` × `n`) from `base` on.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_apply(
    segs: &[Segment],
    src: &[f32],
    src_len: usize,
    channels: usize,
    chans: std::ops::Range<usize>,
    step: usize,
    cols: usize,
    (extra, ph_base, n_ph): (usize, usize, usize),
    dst: &mut [f32],
) {
    let cn = chans.len();
    debug_assert!(chans.end <= channels);
    for s in segs {
        let (lo, hi) = (s.lo.min(s.run), s.hi.min(s.run));
        for c in 0..cn {
            let d0 = (s.row * cn + c) * cols;
            let out = &mut dst[d0 + s.j..d0 + s.j + s.run];
            let plane = (s.img * channels + chans.start + c) * src_len;
            if lo < hi {
                out[..lo].fill(0.0);
                out[hi..].fill(0.0);
                strided_read(&mut out[lo..hi], &src[plane + s.off..], step);
            } else {
                out.fill(0.0);
            }
            if extra > 0 {
                let p0 = ph_base + (s.row * cn + c) * n_ph + s.ph;
                for (e, v) in dst[p0..][..extra].iter_mut().enumerate() {
                    let q = s.run + e;
                    *v = if q >= s.lo && q < s.hi {
                        src[plane + s.off + (q - s.lo) * step]
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// Gathers `tb` tiles (global tile indices `t0..t0 + tb`) of the channels `chans` from `src`
/// (images × `channels` × `src_dims`) into `dst` (`tile_dims` × `chans.len()` × tb), writing
/// every entry: entries outside `src` (padding) are set to zero, so `dst` needs no clearing.
/// [`gather_segments`] then [`gather_apply`] (the reference form, for tests).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_tiles(
    src: &[f32],
    src_dims: &[usize],
    channels: usize,
    chans: std::ops::Range<usize>,
    tile_dims: &[usize],
    step: &[usize],
    pad: &[isize],
    tpd: &[usize],
    t0: usize,
    tb: usize,
    dst: &mut [f32],
) {
    let tile_n: usize = tile_dims.iter().product();
    debug_assert_eq!(dst.len(), tile_n * chans.len() * tb);
    let mut segs = Vec::new();
    gather_segments(
        src_dims,
        tile_dims,
        step,
        pad,
        tpd,
        t0,
        tb,
        (0, 0),
        &mut segs,
    );
    let src_len: usize = src_dims.iter().product();
    let s_last = step[src_dims.len() - 1];
    gather_apply(
        &segs,
        src,
        src_len,
        channels,
        chans,
        s_last,
        tb,
        (0, 0, 0),
        dst,
    );
}

/// `out[j] = src[j · step]` for every `j < out.len()` (`src` long enough), with the step a
/// compile-time constant for the usual tile sizes (a tight unrolled loop instead of a generic
/// stepping iterator: the gather's inner loop).
#[inline]
fn strided_read(out: &mut [f32], src: &[f32], step: usize) {
    #[inline(always)]
    fn fixed<const S: usize>(out: &mut [f32], src: &[f32]) {
        let Some((last, head)) = out.split_last_mut() else {
            return;
        };
        let n = head.len();
        for (o, ch) in head.iter_mut().zip(src[..n * S].chunks_exact(S)) {
            *o = ch[0];
        }
        *last = src[n * S];
    }
    match step {
        1 => out.copy_from_slice(&src[..out.len()]),
        2 => fixed::<2>(out, src),
        3 => fixed::<3>(out, src),
        4 => fixed::<4>(out, src),
        5 => fixed::<5>(out, src),
        6 => fixed::<6>(out, src),
        7 => fixed::<7>(out, src),
        8 => fixed::<8>(out, src),
        _ => {
            for (o, &v) in out.iter_mut().zip(src.iter().step_by(step)) {
                *o = v;
            }
        }
    }
}

/// `dst[q · m + i] = src[i · stride + q]` for `q < n`, `i < m`: `n` runs of `m` values, each
/// interleaving the `m` source rows (the scatter of whole output tiles), with `m` a
/// compile-time constant for the usual tile sizes.
#[inline]
fn interleave_rows(dst: &mut [f32], src: &[f32], stride: usize, n: usize, m: usize) {
    #[inline(always)]
    fn fixed<const M: usize>(dst: &mut [f32], src: &[f32], stride: usize, n: usize) {
        let rows: [&[f32]; M] = std::array::from_fn(|i| &src[i * stride..][..n]);
        for (q, d) in dst[..n * M].chunks_exact_mut(M).enumerate() {
            for (i, v) in d.iter_mut().enumerate() {
                *v = rows[i][q];
            }
        }
    }
    if n == 0 {
        return;
    }
    match m {
        2 => fixed::<2>(dst, src, stride, n),
        3 => fixed::<3>(dst, src, stride, n),
        4 => fixed::<4>(dst, src, stride, n),
        5 => fixed::<5>(dst, src, stride, n),
        6 => fixed::<6>(dst, src, stride, n),
        7 => fixed::<7>(dst, src, stride, n),
        8 => fixed::<8>(dst, src, stride, n),
        _ => {
            for (q, d) in dst[..n * m].chunks_exact_mut(m).enumerate() {
                for (i, v) in d.iter_mut().enumerate() {
                    *v = src[i * stride + q];
                }
            }
        }
    }
}

/// `dst[j · step] = src[j]` for every `j < src.len()` (`dst` long enough): the scatter's inner
/// loop, with the step a compile-time constant for the usual tile sizes.
#[inline]
fn strided_write(dst: &mut [f32], src: &[f32], step: usize) {
    #[inline(always)]
    fn fixed<const S: usize>(dst: &mut [f32], src: &[f32]) {
        let Some((&last, head)) = src.split_last() else {
            return;
        };
        let n = head.len();
        for (ch, &v) in dst[..n * S].chunks_exact_mut(S).zip(head) {
            ch[0] = v;
        }
        dst[n * S] = last;
    }
    match step {
        1 => dst[..src.len()].copy_from_slice(src),
        2 => fixed::<2>(dst, src),
        3 => fixed::<3>(dst, src),
        4 => fixed::<4>(dst, src),
        5 => fixed::<5>(dst, src),
        6 => fixed::<6>(dst, src),
        7 => fixed::<7>(dst, src),
        8 => fixed::<8>(dst, src),
        _ => {
            for (o, &v) in dst.iter_mut().step_by(step).zip(src) {
                *o = v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// The fused 2-D input side ([`fused_rows_2d`]) against the phased gather on random 2-D
    /// geometries: paddings and croppings, m 1-6 (below 3 too), blocks that cut runs, several
    /// images and channel groups, both destinations (rows and NR-wide panels), every tile's
    /// value within float rounding of the gather's.
    #[test]
    fn fused_input_side_matches_gather() {
        let mut rng = SmallRng::seed_from_u64(24);
        for case in 0..80 {
            let r: Vec<usize> = (0..2).map(|_| rng.random_range(2..=4)).collect();
            let m: Vec<usize> = r
                .iter()
                .map(|&r| rng.random_range(1..=(9 - r).min(6)))
                .collect();
            let tts: Vec<_> = r
                .iter()
                .zip(&m)
                .map(|(&r, &m)| crate::points::transform_for(m, r).unwrap())
                .collect();
            let tt = TileTransforms::new(&tts).unwrap();
            let alpha = tt.in_tile();
            let mut ph = Phased::new(&alpha, &m).expect("α > m along the last dimension");
            let dims: Vec<usize> = (0..2).map(|_| rng.random_range(3..=30)).collect();
            let pad: Vec<isize> = (0..2)
                .map(|_| rng.random_range(-2i64..=3) as isize)
                .collect();
            let output: Vec<usize> = dims.iter().map(|&d| rng.random_range(1..=d + 3)).collect();
            let tpd = tiles_per_dim(&output, &m);
            let (batch, channels) = (rng.random_range(1..=2), rng.random_range(1..=7));
            let src: Vec<f32> = (0..batch * channels * dims[0] * dims[1])
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let total = batch * tpd[0] * tpd[1];
            let t0 = rng.random_range(0..total);
            let tb = rng.random_range(1..=(total - t0).min(40));
            let cg = rng.random_range(1..=channels);
            let bt = tt.bt();
            let inp = PhasedSource {
                src: &src,
                dims: &dims,
                channels,
                count: channels,
                pad: &pad,
                alpha: &alpha,
                step: &m,
                tpd: &tpd,
                mats: &bt,
            };
            let a_n: usize = alpha.iter().product();
            let nr = 16;
            for panels in [false, true] {
                let tbp = if panels { tb.div_ceil(nr) * nr } else { tb };
                let ldv = channels * tbp;
                let dest = |c0: usize| {
                    if panels {
                        RowsDest::Panels {
                            at: c0 * nr,
                            seg: tbp,
                            len: tbp,
                            nr,
                            panel_stride: channels * nr,
                        }
                    } else {
                        RowsDest::Rows { at: c0 * tb }
                    }
                };
                let mut outs = Vec::new();
                for fused in [false, true] {
                    ph.fused = Some(fused);
                    let mut v = vec![f32::NAN; a_n * ldv];
                    let mut l = Local::default();
                    let (mut segs, mut ends) = (Vec::new(), Vec::new());
                    let bufs = PhasedBufs {
                        d: &mut l.d,
                        scratch: &mut l.scratch,
                        tmp: &mut l.tmp,
                        ex: &mut l.ex,
                        pt: &mut l.pt,
                        segs: &mut segs,
                        ends: &mut ends,
                    };
                    input_side_phased(&ph, &inp, t0, tb, tbp, cg, bufs, &mut v, ldv, dest);
                    outs.push(v);
                }
                let scale = outs[0].iter().fold(1f32, |a, v| a.max(v.abs()));
                for xi in 0..a_n {
                    for c in 0..channels {
                        for t in 0..tb {
                            let at = xi * ldv
                                + if panels {
                                    (t / nr) * channels * nr + c * nr + t % nr
                                } else {
                                    c * tb + t
                                };
                            let (want, got) = (outs[0][at], outs[1][at]);
                            assert!(
                                (want - got).abs() <= 1e-5 * scale,
                                "case {case}: dims {dims:?} pad {pad:?} m {m:?} r {r:?} tpd \
                                 {tpd:?} t0 {t0} tb {tb} cg {cg} panels {panels}: ξ {xi} c {c} \
                                 t {t}: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// `BlockRanges` hands out every block exactly once, to threads racing for them (each
    /// starting on its own range, then stealing), for block counts below, at and above the
    /// thread count.
    #[test]
    fn block_ranges_take_each_block_once() {
        for threads in 1..=4 {
            for n in [0usize, 1, 3, 4, 7, 64, 1000] {
                let ranges = BlockRanges::new(n, threads).expect("fits");
                let taken: Vec<Vec<usize>> = std::thread::scope(|s| {
                    let hs: Vec<_> = (0..threads)
                        .map(|t| {
                            let r = &ranges;
                            s.spawn(move || std::iter::from_fn(|| r.take(t)).collect::<Vec<_>>())
                        })
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("no panic"))
                        .collect()
                });
                let mut all: Vec<usize> = taken.concat();
                all.sort_unstable();
                assert_eq!(
                    all,
                    (0..n).collect::<Vec<_>>(),
                    "{threads} threads, {n} blocks"
                );
                // A task past the end of the ranges finds nothing.
                assert_eq!(ranges.take(threads), None);
            }
        }
    }

    /// `interleave_rows` equals the naive double loop for every tile size 1-9 (the fixed-size
    /// forms and the generic one) and run lengths 0-40, touching nothing past `n · m`.
    #[test]
    fn interleave_rows_matches_naive() {
        let mut rng = SmallRng::seed_from_u64(5);
        for m in 1..=9 {
            for n in 0..=40 {
                let stride = n + rng.random_range(0..5);
                let src: Vec<f32> = (0..m * stride)
                    .map(|_| rng.random_range(-1.0..1.0))
                    .collect();
                let mut got = vec![f32::NAN; n * m + 3];
                interleave_rows(&mut got, &src, stride, n, m);
                for q in 0..n {
                    for i in 0..m {
                        assert_eq!(
                            got[q * m + i],
                            src[i * stride + q],
                            "m {m} n {n} q {q} i {i}"
                        );
                    }
                }
                assert!(
                    got[n * m..].iter().all(|v| v.is_nan()),
                    "m {m} n {n}: wrote past the end"
                );
            }
        }
    }

    /// `gather_tiles` writes every entry of a NaN-filled buffer, equal to a naive per-element
    /// gather (zero outside the source), on random 1-D, 2-D and 3-D shapes with positive and
    /// negative padding and blocks starting and ending inside runs.
    #[test]
    fn gather_writes_every_entry() {
        let mut rng = SmallRng::seed_from_u64(3);
        for case in 0..100 {
            let rank = rng.random_range(1..=3);
            let dims: Vec<usize> = (0..rank)
                .map(|_| rng.random_range(1..=[0, 40, 15, 7][rank]))
                .collect();
            let tile: Vec<usize> = (0..rank).map(|_| rng.random_range(1..=8)).collect();
            let step: Vec<usize> = tile.iter().map(|&a| rng.random_range(1..=a)).collect();
            let pad: Vec<isize> = tile
                .iter()
                .map(|&a| rng.random_range(-1i64..=a as i64) as isize)
                .collect();
            let tpd: Vec<usize> = (0..rank).map(|_| rng.random_range(1..=6)).collect();
            let (batch, channels) = (rng.random_range(1..=2), rng.random_range(1..=4));
            let src_len: usize = dims.iter().product();
            let src: Vec<f32> = (0..batch * channels * src_len)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let per_image: usize = tpd.iter().product();
            let total = batch * per_image;
            let t0 = rng.random_range(0..total);
            let tb = rng.random_range(1..=total - t0);
            let tile_n: usize = tile.iter().product();
            let c0 = rng.random_range(0..channels);
            let c1 = rng.random_range(c0 + 1..=channels);
            let cn = c1 - c0;
            let mut got = vec![f32::NAN; tile_n * cn * tb];
            gather_tiles(
                &src,
                &dims,
                channels,
                c0..c1,
                &tile,
                &step,
                &pad,
                &tpd,
                t0,
                tb,
                &mut got,
            );
            let src_strides = strides(&dims);
            let (mut tidx, mut pos) = (vec![0; rank], vec![0; rank]);
            for j in 0..tb {
                let t = t0 + j;
                unravel(t % per_image, &tpd, &mut tidx);
                for p in 0..tile_n {
                    unravel(p, &tile, &mut pos);
                    for c in 0..cn {
                        let mut off = Some(0usize);
                        for d in 0..rank {
                            let coord = (tidx[d] * step[d] + pos[d]) as isize - pad[d];
                            if coord < 0 || coord as usize >= dims[d] {
                                off = None;
                                break;
                            }
                            off = off.map(|o| o + coord as usize * src_strides[d]);
                        }
                        let want = off.map_or(0.0, |o| {
                            src[((t / per_image) * channels + c0 + c) * src_len + o]
                        });
                        let g = got[(p * cn + c) * tb + j];
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "case {case} tile {j} pos {p} channel {c}"
                        );
                    }
                }
            }
        }
    }
}
