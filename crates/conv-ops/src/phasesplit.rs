//! The forward convgemm of a strided 2-D layer on x split into its stride phases.
//!
//! With stride s along a dimension, input coordinate `i = s·o + r − p` (output o, tap r,
//! padding p) is phase `a = i mod s`, index `i div s = o + q` of that phase, where `r − p =
//! s·q + a`: every tap reads one phase at a fixed offset `q` from the output coordinate, with
//! stride 1. So a block of images is copied once into its phases, channel by channel (`s_h·s_w`
//! phase planes of `⌈H/s_h⌉ × ⌈W/s_w⌉` values, the phase index as an outer spatial dimension),
//! and the layer becomes a stride-1 3-D convolution over that copy whose kernel spans every
//! phase (depth `s_h·s_w`, `q` ranges along the other two): the strided layer's taps are some
//! of its taps ([`Im2colB::with_tap_map`]; 9 of 16 for 3×3 stride 2), in the layer's own order,
//! so A is the layer's weights as they are. B is then packed from stride-1 lines as long as the
//! output line (single-piece chunks, inside the AVX-512 kernel's first tile where it can)
//! instead of strided, two-piece rows with a prefetch of each block (ResNet-50's 128@56²
//! stride 2: the packer 11% and its prefetch 4% of the samples, session 27).
//!
//! On the AVX-512 family, stride 2 along the lines skips the copy ([`reads_x`]): the first
//! tile of each B panel packs it straight from x's stride-2 lines (core-blas's step-2 fused
//! tile, per 16 values one or two pieces and a `vpermt2ps`, the next panel's lines
//! prefetched), so x is read inside the product instead of in a pass of its own, where its
//! memory read was ~0.5 ms of the 17.5 of ResNet-50's 128@56² (session 31). Paired probe,
//! 1 thread, quiet 13:16:19 UTC, main / this, 4 alternations: pair medians 0.945 / 0.952,
//! 0.947 / 0.955, 0.949 / 0.952, 0.941 / 0.953, pass medians 17.63 / 17.52, 17.60 / 17.48,
//! 17.61 / 17.57, 17.80 / 17.65 ms; ResNet-18's 64@56² (quiet 13:22:38 UTC) 8.89 / 8.70, 8.93 /
//! 8.69, 8.89 / 8.77 ms.
//!
//! Taken by [`crate::ForwardAlgo::Convgemm`] on the layers of [`applies`]. The copy is
//! bounded (about [`BLOCK_FLOATS`] values, at least one image), kept per thread across calls
//! and independent of the batch; A is packed once per call.

use std::cell::RefCell;

use core_blas::{Bias, DenseStore, MatMut, MatRef};
use rayon::prelude::*;

use crate::Result;
use crate::convgemm::Im2colB;
use crate::error::gemm_err;
use crate::geometry::ConvGeometry;
use crate::layout::{Epilogue, OneThread, Prepacked, forward_panels};

/// Values of one block of images' phase copy (2 MiB), at least one image: the block's
/// product reads it right after it is written, from L2 where it fits. ResNet-50's 128@56²
/// stride 2 (1.6 MB an image), `probe_passes`, 1 thread, quiet 00:57:59 UTC, blocks of 1 / 2
/// / 8 images: 17.93 / 18.18 / 19.05, 18.13 / 18.15 / 19.52, 18.00 / 18.27 / 18.98 ms (main:
/// 18.73, 18.63, 19.93). One image is then stored straight into y (a dense K × O matrix).
/// (Test builds: a few thousand, so that the tests' small layers run several blocks.)
const BLOCK_FLOATS: usize = if cfg!(test) { 4096 } else { 1 << 19 };

/// Output positions per image from which, and below which, [`applies`] takes a layer:
/// ResNet's 28² outputs of 56² inputs. Larger planes run image by image (not measured with
/// the split); on 14² and 7² outputs (ResNet-50's 256@28² and 512@14² stride 2, batch 8) the
/// one-image blocks' products are narrow and the split was level or slower (`probe_passes`,
/// quiet 01:12:48 UTC: 19.78 / 19.29, 18.70 / 19.66 and 20.37 / 19.91, 18.94 / 21.07 ms).
/// (Test builds: any plane, so that the tests reach the split on small layers.)
const MIN_PLANE: usize = if cfg!(test) { 1 } else { 512 };

/// See [`MIN_PLANE`] (the forward's per-image threshold).
const MAX_PLANE: usize = 1024;

/// Input channels from which [`applies`] takes a layer (the copy is a pass over x; on few
/// channels the product it serves is short).
const MIN_CHANNELS: usize = 64;

/// The split along one spatial dimension.
#[derive(Clone, Copy, Debug)]
struct Dim {
    s: usize,
    /// Length of a phase (`⌈len / s⌉`).
    hp: usize,
    /// Offsets `q` from `qmin` on, `kq` of them: the stride-1 kernel's extent.
    qmin: isize,
    kq: usize,
    /// The stride-1 layer's padding before and after.
    before: usize,
    after: usize,
}

impl Dim {
    /// Dimension `d` of `g`, `None` when the stride-1 layer would need a negative padding after.
    fn new(g: &ConvGeometry, d: usize) -> Option<Dim> {
        let (s, k, p) = (g.stride()[d], g.kernel()[d], g.pad_before()[d] as isize);
        let (len, out) = (g.input()[d], g.output()[d]);
        let si = s as isize;
        let qmin = (-p).div_euclid(si);
        let qmax = (k as isize - 1 - p).div_euclid(si);
        let hp = len.div_ceil(s);
        let after = out as isize + qmax - hp as isize;
        (after >= 0).then_some(Dim {
            s,
            hp,
            qmin,
            kq: (qmax - qmin + 1) as usize,
            before: (-qmin) as usize,
            after: after as usize,
        })
    }

    /// Phase and stride-1 tap of the layer's tap `r`.
    fn tap(&self, r: usize, p: usize) -> (usize, usize) {
        let v = r as isize - p as isize;
        let si = self.s as isize;
        (
            v.rem_euclid(si) as usize,
            (v.div_euclid(si) - self.qmin) as usize,
        )
    }
}

/// Whether [`forward`] takes `g`: 2-D, a stride above 1, no groups or dilation, a kernel
/// larger than 1×1, at least [`MIN_CHANNELS`] input channels, [`MIN_PLANE`] to
/// [`MAX_PLANE`] output positions per image, and a split whose stride-1 padding is
/// non-negative.
pub(crate) fn applies(g: &ConvGeometry) -> bool {
    g.rank() == 2
        && g.stride().iter().any(|&s| s > 1)
        && g.groups() == 1
        && g.dilation().iter().all(|&d| d == 1)
        && g.kernel_len() > 1
        && g.in_channels() >= MIN_CHANNELS
        && (MIN_PLANE..MAX_PLANE).contains(&g.output_spatial_len())
        && (0..2).all(|d| Dim::new(g, d).is_some())
}

thread_local! {
    /// This thread's phase copy of a block of images, reused across calls.
    static XQ: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The packed A of a call on this thread (taken out during the call), reused across calls.
    static APACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Frees this thread's buffers ([`crate::release_workspaces`]) and returns their bytes; 0
/// when in use.
pub(crate) fn release_thread() -> usize {
    crate::take_thread_buffer(&XQ, crate::vec_bytes)
        + crate::take_thread_buffer(&APACK, crate::vec_bytes)
}

/// The stride-1 layer over the phase copy of `nb` images of `g` and the tap map.
fn split_geometry(g: &ConvGeometry, dims: &[Dim; 2], nb: usize) -> Result<ConvGeometry> {
    let ph = dims[0].s * dims[1].s;
    ConvGeometry::from_parts(
        nb,
        g.in_channels(),
        g.out_channels(),
        &[ph, dims[0].hp, dims[1].hp],
        &[ph, dims[0].kq, dims[1].kq],
        &[1],
        &[1],
        &[0, dims[0].before, dims[1].before],
        &[0, dims[0].after, dims[1].after],
        1,
    )
}

/// Copies the images of `x` (whole images, `g`'s channels) into their phases, `dst` one
/// image after the other, each channel's `s_h·s_w` planes of `hp_h × hp_w` (phase `a_h·s_w +
/// a_w`); positions past the input (when a length is not a multiple of its stride) are zero.
/// Stride 2 along even rows: core-blas's [`core_blas::ConvPack::deinterleave_lines`] splits
/// each input row into its two phase lines (two rows at once, read in order, with stride 2 down
/// the columns too: ResNet's 56² inputs, where it took the copy from 5.4% to 3.9% of the
/// samples); otherwise every phase line is one strided piece of an input row
/// ([`core_blas::Gemm::gather_pieces`]).
fn fill(g: &ConvGeometry, dims: &[Dim; 2], x: &[f32], dst: &mut [f32], threads: usize) {
    use core_blas::Piece;
    let (h, w) = (g.input()[0], g.input()[1]);
    let [dh, dw] = *dims;
    let chan = dh.s * dw.s * dh.hp * dw.hp;
    let ragged = h % dh.s != 0 || w % dw.s != 0;
    let gemm = core_blas::Gemm::global().ok();
    // Stride 2 along even lines: each input line's two phase lines by one deinterleave; with
    // stride 2 down the columns too, an even and the odd input line after it at once (x read
    // in order, every cache line whole), else the lines of each row phase (`iy mod s_h`).
    let split = (dw.s == 2 && w % 2 == 0)
        .then(|| core_blas::ConvPack::global().ok())
        .flatten();
    let plane = dh.hp * dw.hp;
    // Otherwise the pieces of one channel: input row `iy`, phase `ax` along it.
    let piece_rows = if split.is_some() { 0 } else { h };
    let pieces: Vec<Piece> = (0..piece_rows)
        .flat_map(|iy| (0..dw.s.min(w)).map(move |ax| (iy, ax)))
        .map(|(iy, ax)| Piece {
            row: (((iy % dh.s) * dw.s + ax) * dh.hp + iy / dh.s) as u32,
            col: 0,
            at: iy * w + ax,
            len: (w - ax).div_ceil(dw.s) as u32,
        })
        .collect();
    let one = |(xc, dc): (&[f32], &mut [f32])| {
        if ragged {
            dc.fill(0.0);
        }
        if let Some(cp) = split {
            debug_assert!(xc.len() == h * w && dc.len() == chan && dw.hp == w / 2);
            let d = dc.as_mut_ptr();
            let src = xc.as_ptr();
            if dh.s == 2 {
                let ph: [*mut f32; 4] = std::array::from_fn(|i| d.wrapping_add(i * plane));
                // SAFETY: line pairs `2r, 2r + 1 < h` (r < h / 2): reads `2r·w .. 2r·w + 2w`
                // inside `xc`; writes `r·hp_w .. r·hp_w + w/2` of the four phase planes of
                // `dc` (r < hp_h), which are disjoint and do not overlap `xc`. An odd h's last
                // line: the planes 0 and 1, line h / 2 < hp_h.
                unsafe {
                    cp.deinterleave_lines(&ph, dw.hp, src, 2 * w, h / 2, w / 2);
                    if h % 2 == 1 {
                        let last = h / 2;
                        cp.deinterleave_lines(
                            &[ph[0].add(last * dw.hp), ph[1].add(last * dw.hp)],
                            dw.hp,
                            src.add(2 * last * w),
                            w,
                            1,
                            w / 2,
                        );
                    }
                }
            } else {
                for ah in 0..dh.s.min(h) {
                    let rows = (h - ah).div_ceil(dh.s);
                    let lo = d.wrapping_add(2 * ah * plane);
                    // SAFETY: lines `iy = ah + r·s_h < h` of the channel: reads `iy·w .. iy·w +
                    // w` inside `xc` (h·w values); writes `r·hp_w .. r·hp_w + w/2` (r < hp_h)
                    // of the phase planes `2·ah` and `2·ah + 1` (of `s_h·2` in `dc`), which are
                    // disjoint and do not overlap `xc`.
                    unsafe {
                        cp.deinterleave_lines(
                            &[lo, lo.add(plane)],
                            dw.hp,
                            src.add(ah * w),
                            dh.s * w,
                            rows,
                            w / 2,
                        )
                    };
                }
            }
            return;
        }
        let fast = gemm.is_some_and(|gm| gm.gather_pieces(dc, dw.hp, xc, &pieces, dw.s).is_ok());
        if !fast {
            for p in &pieces {
                let d = &mut dc[p.row as usize * dw.hp..][..p.len as usize];
                for (t, v) in d.iter_mut().enumerate() {
                    *v = xc[p.at + t * dw.s];
                }
            }
        }
    };
    if threads > 1 {
        // Channels in a few tasks per thread.
        let per = (x.len() / (h * w)).div_ceil(4 * threads).max(1);
        x.par_chunks(per * h * w)
            .zip(dst.par_chunks_mut(per * chan))
            .for_each(|(xb, db)| {
                xb.chunks_exact(h * w)
                    .zip(db.chunks_exact_mut(chan))
                    .for_each(one)
            });
    } else {
        x.chunks_exact(h * w)
            .zip(dst.chunks_exact_mut(chan))
            .for_each(one);
    }
}

/// Whether [`forward`] skips the phase copy and packs B straight from x: stride 2 along the
/// lines, on the AVX-512 family, whose first tile of each panel packs it from one- or
/// two-piece stride-2 chunks (core-blas's fused conv tile), reading x inside the product where
/// the FMAs hide it, instead of in a pass of its own. One image a product.
fn reads_x(g: &ConvGeometry) -> bool {
    g.stride()[1] == 2
        && core_blas::Gemm::global().is_ok_and(|gm| gm.isa() == core_blas::Isa::Avx512)
}

/// y = conv(x, w) (+ bias) (then ReLU) for a layer of [`applies`]: per block of images, the
/// phase copy, then the stride-1 convgemm over it with the tap map (A packed once). With more
/// blocks than threads, each thread takes whole blocks (its copy in its own L2, no product
/// split across threads); else the blocks one after the other, each copy and product split.
pub(crate) fn forward(
    g: &ConvGeometry,
    x: &[f32],
    w: &[f32],
    epi: Epilogue<'_>,
    y: &mut [f32],
) -> Result<()> {
    let (Some(d0), Some(d1)) = (Dim::new(g, 0), Dim::new(g, 1)) else {
        unreachable!("the caller checked applies");
    };
    let dims = [d0, d1];
    let (k, cr, olen) = (
        g.out_channels(),
        g.in_channels() * g.kernel_len(),
        g.output_spatial_len(),
    );
    let (kh, kw) = (g.kernel()[0], g.kernel()[1]);
    let (ph, pw) = (g.pad_before()[0], g.pad_before()[1]);
    // The layer's taps, row-major, as taps of the stride-1 layer: (phase, q_h, q_w).
    let map: Vec<usize> = (0..kh * kw)
        .map(|t| {
            let ((ah, th), (aw, tw)) = (d0.tap(t / kw, ph), d1.tap(t % kw, pw));
            ((ah * d1.s + aw) * d0.kq + th) * d1.kq + tw
        })
        .collect();
    let image = g.in_channels() * d0.s * d1.s * d0.hp * d1.hp;
    let nb = (BLOCK_FLOATS / image).clamp(1, g.batch());
    let threads = rayon::current_num_threads().max(1);
    let mr = core_blas::Gemm::global().map_err(gemm_err)?.tile().0;
    let a = MatRef::row_major("w", w, k, cr, cr).map_err(gemm_err)?;
    let xi = g.in_channels() * g.input_spatial_len();
    let yi = k * olen;
    // The product of `cnt` images' B into their y on `threads`.
    let product = |pre: &Prepacked<'_>, b: &Im2colB<'_>, yb: &mut [f32], cnt: usize, threads| {
        if cnt > 1 {
            return forward_panels(pre, b, yb, (k, olen, 0), epi, threads == 1).map_err(gemm_err);
        }
        // One image: its y is a dense K × O matrix, stored from the kernel's registers.
        let c = MatMut::row_major("y", yb, k, olen, olen).map_err(gemm_err)?;
        let mut dense = DenseStore::new(c, epi.alpha, epi.beta);
        if let Some(bias) = epi.bias {
            dense = dense.with_bias(Bias::PerRow(bias)).map_err(gemm_err)?;
        }
        if epi.relu {
            dense = dense.with_relu();
        }
        if threads == 1 {
            core_blas::gemm_with(pre, b, &mut OneThread(dense))
        } else {
            core_blas::gemm_with(pre, b, &mut dense)
        }
        .map_err(gemm_err)
    };
    let direct = reads_x(g);
    let gm = core_blas::Gemm::global().map_err(gemm_err)?;
    let (kc, nr) = (gm.block_sizes().kc, gm.tile().1);
    let nb = if direct { 1 } else { nb };
    // The column blocks the driver runs a one-image product in on one thread, when A is one
    // block (core-blas's `serial`: k in 1-3 passes, the 2-3 pass rule; one A block keeps its
    // B block in L2, NC capped at MC·KC / kc_max columns), for the fused view's hints.
    let block_width = {
        let bs = gm.block_sizes();
        let kc0 = bs.kc.max(1);
        let passes = match cr.div_ceil(kc0).max(1) {
            p @ 2..=3 => cr.div_ceil(kc0 + kc0 / 8).min(p),
            p => p,
        };
        let kc_max = cr.div_ceil(passes).max(1);
        let nc = bs.nc.div_ceil(nr) * nr;
        let l2 = (bs.mc * kc0.max(kc_max) / kc_max / nr).max(1) * nr;
        (k <= bs.mc).then_some(nc.min(l2))
    };
    let blocks = g.batch().div_ceil(nb);
    // One block (x and y of its images): its copy and product on `threads`.
    let run = |pre: &Prepacked<'_>, xb: &[f32], yb: &mut [f32], threads: usize| {
        let cnt = xb.len() / xi;
        if direct {
            // No copy: the kernel's first tiles pack B from x's stride-2 lines.
            let g1 = (*g).with_batch(cnt)?;
            let mut b = Im2colB::new(&g1, 0, xb).with_strided_fusion();
            if let Some(width) = block_width.filter(|_| threads == 1) {
                b = b.with_block_hints(width, nr);
            }
            // The first panel of the first KC block (nothing before it prefetched it).
            b.prefetch_columns(0, kc.min(cr), 0, nr.min(olen));
            return product(pre, &b, yb, cnt, threads);
        }
        let sg = split_geometry(g, &dims, cnt)?;
        XQ.with_borrow_mut(|xq| {
            if xq.len() < cnt * image {
                xq.resize(cnt * image, 0.0);
            }
            let xq = &mut xq[..cnt * image];
            fill(g, &dims, xb, xq, threads);
            let b = Im2colB::new(&sg, 0, xq)
                .with_fused_packing()
                .with_tap_map(&map);
            product(pre, &b, yb, cnt, threads)
        })
    };
    let mut abuf = APACK.with_borrow_mut(std::mem::take);
    let pre = Prepacked::pack(&a, mr, threads, &mut abuf);
    let result = if threads > 1 && blocks >= threads {
        // Whole blocks per thread: each thread's copy in its own caches, no split products.
        x.par_chunks(nb * xi)
            .zip(y.par_chunks_mut(nb * yi))
            .try_for_each(|(xb, yb)| run(&pre, xb, yb, 1))
    } else {
        x.chunks(nb * xi)
            .zip(y.chunks_mut(nb * yi))
            .try_for_each(|(xb, yb)| run(&pre, xb, yb, threads))
    };
    APACK.with_borrow_mut(|kept| *kept = abuf);
    result
}

#[cfg(test)]
mod tests {
    use crate::testing::check_forward_bias_relu;
    use crate::{ConvGeometry, ForwardAlgo};

    /// Strided layers the split takes (even and odd sizes, strides 2 and 3, 3×3, 5×3, 4×4
    /// and 1×3 kernels, paddings 0-2, blocks of one and of several images, a batch of one) on
    /// 1 and 2 threads, with bias and ReLU, against the reference. The copy's paths: even
    /// widths with stride 2 by line pairs (14², and 13 × 14 with a last odd line), by row
    /// phases (stride 3 × 2, 1 × 2), odd widths by the gather (15 × 13).
    #[test]
    fn phase_split_matches_the_reference() {
        let geoms = [
            ConvGeometry::new(3, 64, 24, &[14, 14], &[3, 3])
                .unwrap()
                .with_stride(&[2])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 64, 20, &[15, 13], &[5, 3])
                .unwrap()
                .with_stride(&[2])
                .unwrap()
                .with_padding(&[2, 1])
                .unwrap(),
            ConvGeometry::new(2, 64, 9, &[17, 16], &[4, 4])
                .unwrap()
                .with_stride(&[3, 2])
                .unwrap(),
            ConvGeometry::new(1, 64, 16, &[12, 12], &[3, 3])
                .unwrap()
                .with_stride(&[2])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 64, 8, &[13, 14], &[3, 3])
                .unwrap()
                .with_stride(&[2])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(5, 70, 8, &[6, 8], &[1, 3])
                .unwrap()
                .with_stride(&[1, 2])
                .unwrap()
                .with_padding(&[0, 1])
                .unwrap(),
        ];
        for g in &geoms {
            assert!(super::applies(g), "{g:?}");
            check_forward_bias_relu(g, ForwardAlgo::Convgemm, 2).unwrap();
        }
    }

    /// Layers large enough for many full 48-wide panels whose chunks cross output lines (the
    /// AVX-512 path reads x straight: core-blas's step-2 fused first tile, its packing fallback
    /// on panels that do not resolve, and the default two-step form on tiles of fewer than 8
    /// rows): odd and even sizes and widths, paddings 0-2, 3×3 and 5×5 kernels, batches 1-5,
    /// 1 and 2 threads, against the reference; and a stride-3 width, which keeps the phase
    /// copy on every ISA.
    #[test]
    fn strided_lines_match_the_reference() {
        let geom = |n, c, k, hw: [usize; 2], kk: [usize; 2], s: [usize; 2], p: [usize; 2]| {
            ConvGeometry::new(n, c, k, &hw, &kk)
                .unwrap()
                .with_stride(&s)
                .unwrap()
                .with_padding(&p)
                .unwrap()
        };
        let geoms = [
            geom(3, 64, 16, [30, 30], [3, 3], [2, 2], [1, 1]),
            geom(5, 64, 12, [29, 31], [3, 3], [2, 2], [0, 0]),
            geom(1, 64, 8, [33, 32], [5, 5], [2, 2], [2, 2]),
            geom(2, 72, 20, [27, 45], [3, 3], [1, 2], [1, 1]),
            geom(2, 64, 8, [26, 38], [3, 4], [2, 3], [1, 1]),
        ];
        for g in &geoms {
            assert!(super::applies(g), "{g:?}");
            let avx512 = core_blas::Gemm::global().unwrap().isa() == core_blas::Isa::Avx512;
            assert_eq!(super::reads_x(g), avx512 && g.stride()[1] == 2, "{g:?}");
            check_forward_bias_relu(g, ForwardAlgo::Convgemm, 2).unwrap();
        }
    }
}
