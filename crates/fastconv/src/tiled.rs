//! Tiled execution of a multi-channel N-d correlation by the fast algorithm (eq. 5, Algorithm 2).
//!
//! Four stages per block of tiles, as in NNPACK and the paper:
//! 1. input transform: gather `T_b` input tiles of every channel into D (α^N × C × T_b, zero
//!    outside the padded input) and apply Bᵀ along every spatial mode (V = D ×ₙ Bₙᵀ);
//! 2. for every transformed coordinate ξ ∈ α^N one GEMM `M_ξ = U_ξᵀ · V_ξ`, (K × C)·(C × T_b): all
//!    α^N of them as one `core_blas` batched call, with `U_ξᵀ` read from panels packed once per
//!    weight version ([`crate::packed`]), so a block packs only its V;
//! 3. output transform Y = M ×ₙ Aₙᵀ (m^N × K × T_b);
//! 4. scatter the in-range outputs into y.
//!
//! The kernel transform U (α^N × C × K) is computed once (see [`crate::plan`]). Blocks of tiles are
//! sized to stay in cache and run on rayon's pool, a wave of blocks at a time.

use rayon::prelude::*;

use core_blas::{DenseStore, Gemm, MatMut, MatRef};

use crate::error::Result;
use crate::ntransform::{TileTransforms, multi_mode_product_unchecked};
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

/// Runs the correlation with transformed kernels `u` (α^N matrices `U_ξᵀ`, K × C, packed). Shapes
/// are validated by the caller (`debug_assert!`ed here).
pub(crate) fn correlate(
    job: &Correlation,
    tt: &TileTransforms,
    u: &PackedKernels,
    x: &[f32],
    y: &mut [f32],
    block_tiles: usize,
) -> Result<()> {
    let rank = job.input.len();
    let alpha = tt.in_tile();
    let m = tt.out_tile().to_vec();
    let (c_in, k_out) = (job.in_channels, job.out_channels);
    let a_n: usize = alpha.iter().product();
    let m_n: usize = m.iter().product();
    let in_len: usize = job.input.iter().product();
    let out_len: usize = job.output.iter().product();
    let gemm = Gemm::global()?;
    let a_src: Vec<PackedMatrix<'_>> = (0..a_n).map(|xi| u.matrix(xi)).collect();
    debug_assert_eq!(x.len(), job.batch * c_in * in_len);
    debug_assert_eq!(y.len(), job.batch * k_out * out_len);
    debug_assert_eq!(tt.rank(), rank);

    let tpd = tiles_per_dim(&job.output, &m);
    let tiles_per_image: usize = tpd.iter().product();
    let total = job.batch * tiles_per_image;
    let block = block_tiles.clamp(1, total.max(1));
    let n_blocks = total.div_ceil(block);
    let threads = rayon::current_num_threads().max(1);

    let out_strides = strides(&job.output);

    // One block: tiles t0..t1 → their outputs in `bufs.y`, laid out (m^N, K, T_b).
    let run_block = |bufs: &mut Buffers, t0: usize, t1: usize| -> Result<()> {
        let tb = t1 - t0;
        let Buffers {
            d,
            v,
            scratch,
            mm,
            y: yb,
        } = bufs;
        // No clearing: the gather writes every entry.
        d.resize(a_n * c_in * tb, 0.0);
        gather_tiles(
            x,
            &job.input,
            c_in,
            &alpha,
            &m,
            &job.pad_before,
            &tpd,
            t0,
            tb,
            d,
        );
        // Stage 1: V = D ×ₙ Bₙᵀ over the spatial modes; trailing (C, T_b) untouched.
        let mut dims = alpha.clone();
        dims.push(c_in * tb);
        multi_mode_product_unchecked(d, &dims, &tt.bt(), scratch, v);
        // Stage 2: M_ξ (K × T_b) = U_ξᵀ (K × C) · V_ξ (C × T_b), for all ξ. beta = 0: C is
        // written, never read, so the buffer needs no clearing.
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
        // Stage 3: Y = M ×ₙ Aₙᵀ.
        let mut dims = alpha.clone();
        dims.push(k_out * tb);
        multi_mode_product_unchecked(mm, &dims, &tt.at(), scratch, yb);
        debug_assert_eq!(yb.len(), m_n * k_out * tb);
        Ok(())
    };

    // Stage 4: scatter a block's outputs (only the in-range part of edge tiles), in runs of tiles
    // along the last dimension as in `gather_tiles`: contiguous reads of the block's rows, writes
    // with stride m into the same few output lines.
    //
    // `ys` holds the output planes (image, channel) from plane `plane0` on; only tiles `ta..tz`
    // of the block `t0..t1` and channels `ks` are written, so planes can be filled in parallel.
    #[allow(clippy::too_many_arguments)]
    let scatter = |ys: &mut [f32],
                   plane0: usize,
                   t0: usize,
                   t1: usize,
                   yb: &[f32],
                   ta: usize,
                   tz: usize,
                   ks: std::ops::Range<usize>| {
        let tb = t1 - t0;
        let last = rank - 1;
        let prefix_n: usize = m[..last].iter().product();
        let m_last = m[last];
        let out_last = job.output[last];
        let mut tidx = vec![0; rank];
        let mut wi = vec![0; last];
        let mut t = ta;
        while t < tz {
            let j = t - t0;
            let n = t / tiles_per_image;
            unravel(t % tiles_per_image, &tpd, &mut tidx);
            let run = (tpd[last] - tidx[last]).min(tz - t);
            let o0 = tidx[last] * m_last;
            'rows: for pf in 0..prefix_n {
                unravel(pf, &m[..last], &mut wi);
                let mut off = 0;
                for dd in 0..last {
                    let o = tidx[dd] * m[dd] + wi[dd];
                    if o >= job.output[dd] {
                        continue 'rows;
                    }
                    off += o * out_strides[dd];
                }
                for i in 0..m_last {
                    // Run tile jj writes output column o0 + jj·m + i, in range for jj < cnt.
                    let first = o0 + i;
                    if first >= out_last {
                        continue;
                    }
                    let cnt = (out_last - first).div_ceil(m_last).min(run);
                    for k in ks.clone() {
                        let plane = n * k_out + k - plane0;
                        let row = &mut ys[plane * out_len + off..][..out_last];
                        let src = &yb[((pf * m_last + i) * k_out + k) * tb + j..][..cnt];
                        for (o, &v) in row[first..].iter_mut().step_by(m_last).zip(src) {
                            *o = v;
                        }
                    }
                }
            }
            t += run;
        }
    };

    // Batches that split evenly over the threads (or are large): whole images per task, each
    // task writing only its images' output planes, with no waves or barriers in between. One
    // task per thread (`with_min_len`), so each thread allocates its buffers once.
    if threads > 1 && (job.batch.is_multiple_of(threads) || job.batch >= 4 * threads) {
        let img_len = k_out * out_len;
        return y
            .par_chunks_mut(img_len)
            .enumerate()
            .with_min_len(job.batch.div_ceil(threads))
            .try_for_each_init(Buffers::default, |bufs, (n, yn)| -> Result<()> {
                let (img0, img1) = (n * tiles_per_image, (n + 1) * tiles_per_image);
                let mut t0 = img0;
                while t0 < img1 {
                    let t1 = (t0 + block).min(img1);
                    run_block(bufs, t0, t1)?;
                    scatter(yn, n * k_out, t0, t1, &bufs.y, t0, t1, 0..k_out);
                    t0 = t1;
                }
                Ok(())
            });
    }

    // Waves of one block per thread; buffers live across waves (no page faults per block).
    let mut bufs: Vec<Buffers> = (0..threads.min(n_blocks))
        .map(|_| Buffers::default())
        .collect();
    let mut b = 0;
    while b < n_blocks {
        let wave_end = (b + threads).min(n_blocks);
        let ranges: Vec<(usize, usize)> = (b..wave_end)
            .map(|i| (i * block, ((i + 1) * block).min(total)))
            .collect();
        if ranges.len() == 1 {
            run_block(&mut bufs[0], ranges[0].0, ranges[0].1)?;
        } else {
            bufs[..ranges.len()]
                .par_iter_mut()
                .zip(ranges.par_iter())
                .try_for_each(|(buf, &(t0, t1))| run_block(buf, t0, t1))?;
        }
        if ranges.len() == 1 {
            let (t0, t1) = ranges[0];
            scatter(y, 0, t0, t1, &bufs[0].y, t0, t1, 0..k_out);
        } else {
            // The wave's output planes (image, channel) in parallel: each plane takes the tiles
            // of its image from every block of the wave.
            let (first, end) = (ranges[0].0, ranges[ranges.len() - 1].1);
            let (n0, n1) = (first / tiles_per_image, (end - 1) / tiles_per_image + 1);
            let bufs = &bufs;
            let ranges = &ranges;
            y[n0 * k_out * out_len..n1 * k_out * out_len]
                .par_chunks_mut(out_len)
                .enumerate()
                .for_each(|(i, plane)| {
                    let p = n0 * k_out + i;
                    let (n, k) = (p / k_out, p % k_out);
                    let (img0, img1) = (n * tiles_per_image, (n + 1) * tiles_per_image);
                    for (&(t0, t1), buf) in ranges.iter().zip(bufs) {
                        let (ta, tz) = (t0.max(img0), t1.min(img1));
                        if ta < tz {
                            scatter(plane, p, t0, t1, &buf.y, ta, tz, k..k + 1);
                        }
                    }
                });
        }
        b = wave_end;
    }
    Ok(())
}

/// Per-thread work buffers of one block: gathered tiles D, V = D ×ₙ Bₙᵀ, mode-product scratch,
/// M, and the block's outputs.
#[derive(Debug, Default)]
struct Buffers {
    d: Vec<f32>,
    v: Vec<f32>,
    scratch: Vec<f32>,
    mm: Vec<f32>,
    y: Vec<f32>,
}

/// Gathers `tb` tiles (global tile indices `t0..t0 + tb`) of `channels` channels from `src`
/// (images × channels × `src_dims`) into `dst` (`tile_dims` × channels × tb), writing every entry:
/// entries outside `src` (padding) are set to zero, so `dst` needs no clearing (a memset of the
/// whole block per call saved). Tile `t` of image `n` starts at
/// `tidx · step − pad` per dimension, `tpd` tiles per dimension.
///
/// The tiles of a block are taken in runs that share the image and every tile index but the
/// last (neighbours along the last dimension); for each destination row (tile position, channel)
/// the run is one contiguous write along the tile index, reading the source row with stride
/// `step`. (Writing tile by tile instead touches a new cache line of `dst` for every element.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather_tiles(
    src: &[f32],
    src_dims: &[usize],
    channels: usize,
    tile_dims: &[usize],
    step: &[usize],
    pad: &[isize],
    tpd: &[usize],
    t0: usize,
    tb: usize,
    dst: &mut [f32],
) {
    let rank = src_dims.len();
    let last = rank - 1;
    let src_len: usize = src_dims.iter().product();
    let src_strides = strides(src_dims);
    let tile_n: usize = tile_dims.iter().product();
    let prefix_n: usize = tile_dims[..last].iter().product();
    let per_image: usize = tpd.iter().product();
    let a_last = tile_dims[last];
    let width = src_dims[last] as isize;
    let s_last = step[last] as isize;
    debug_assert_eq!(dst.len(), tile_n * channels * tb);
    let (mut tidx, mut xi) = (vec![0; rank], vec![0; last]);
    let mut j = 0;
    while j < tb {
        let t = t0 + j;
        let n = t / per_image;
        unravel(t % per_image, tpd, &mut tidx);
        let run = (tpd[last] - tidx[last]).min(tb - j);
        let q0 = tidx[last] as isize;
        'rows: for pf in 0..prefix_n {
            unravel(pf, &tile_dims[..last], &mut xi);
            let mut off = 0usize;
            for d in 0..last {
                let coord = (tidx[d] * step[d] + xi[d]) as isize - pad[d];
                if coord < 0 || coord as usize >= src_dims[d] {
                    // A padding row of the tiles: zero for every position and channel.
                    for i in 0..a_last {
                        for c in 0..channels {
                            let d0 = ((pf * a_last + i) * channels + c) * tb + j;
                            dst[d0..d0 + run].fill(0.0);
                        }
                    }
                    continue 'rows;
                }
                off += coord as usize * src_strides[d];
            }
            for i in 0..a_last {
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
                let (lo, hi) = (lo.min(run), hi.min(run));
                if lo >= hi {
                    for c in 0..channels {
                        let d0 = ((pf * a_last + i) * channels + c) * tb + j;
                        dst[d0..d0 + run].fill(0.0);
                    }
                    continue;
                }
                let first = (base + lo as isize * s_last) as usize;
                for c in 0..channels {
                    let row = &src[(n * channels + c) * src_len + off..][..src_dims[last]];
                    let d0 = ((pf * a_last + i) * channels + c) * tb + j;
                    dst[d0..d0 + lo].fill(0.0);
                    dst[d0 + hi..d0 + run].fill(0.0);
                    let out = &mut dst[d0 + lo..d0 + hi];
                    for (o, &v) in out.iter_mut().zip(row[first..].iter().step_by(step[last])) {
                        *o = v;
                    }
                }
            }
        }
        j += run;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

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
            let mut got = vec![f32::NAN; tile_n * channels * tb];
            gather_tiles(
                &src, &dims, channels, &tile, &step, &pad, &tpd, t0, tb, &mut got,
            );
            let src_strides = strides(&dims);
            let (mut tidx, mut pos) = (vec![0; rank], vec![0; rank]);
            for j in 0..tb {
                let t = t0 + j;
                unravel(t % per_image, &tpd, &mut tidx);
                for p in 0..tile_n {
                    unravel(p, &tile, &mut pos);
                    for c in 0..channels {
                        let mut off = Some(0usize);
                        for d in 0..rank {
                            let coord = (tidx[d] * step[d] + pos[d]) as isize - pad[d];
                            if coord < 0 || coord as usize >= dims[d] {
                                off = None;
                                break;
                            }
                            off = off.map(|o| o + coord as usize * src_strides[d]);
                        }
                        let want = off
                            .map_or(0.0, |o| src[((t / per_image) * channels + c) * src_len + o]);
                        let g = got[(p * channels + c) * tb + j];
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
