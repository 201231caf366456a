//! 1×1 kernels with a stride (ResNet's downsampling shortcuts): im2col(x) is x subsampled on
//! the stride's grid, and col2im the scatter of a dense matrix back onto that grid (every other
//! element of dx is zero). The fused packers handle this as a general convolution and pay for
//! it (strided gathers inside the packing of every B block, a col2im scatter that walks dx
//! twice: 2-3× the pointwise product's time on ResNet-20's shortcuts); here a block of images
//! is subsampled once into a dense per-thread buffer and every pass becomes the pointwise
//! product on it:
//! - forward: y = W · xs (the GEMM stores into y directly for one image, else into this
//!   thread's C panel and then into y with the epilogue);
//! - backward-data: dxs = Wᵀ · dy into the C panel, then dx written once, line by line: the
//!   grid lines get the panel's values at the stride and zeros between them, the other lines
//!   zeros;
//! - backward-filter: dw = Σ over blocks of dy · xsᵀ (a dense transposed B), accumulated.
//!
//! The buffers are bounded (about [`BLOCK_FLOATS`] values each, at least one image's
//! group), kept per thread across calls, and independent of the batch; blocks of images run
//! in parallel (single-threaded products writing disjoint images; the weight gradient sums
//! one partial per extra thread), or one block at a time with the product split across the
//! threads when the batch has fewer blocks than threads.

use std::cell::RefCell;

use core_blas::{DenseStore, MatMut, MatRef};
use rayon::prelude::*;

use crate::Result;
use crate::error::gemm_err;
use crate::geometry::ConvGeometry;
use crate::layout::{ChannelMajor, ChannelMajorStore, Epilogue, OneThread, with_panel};
use crate::ops::is_pointwise;
use crate::source::copy_run;

/// Values of one block's subsampled input (or its C panel), about 256 KiB: the block's
/// operands and result stay in L2 between the gather, the product and the store; but at least
/// [`MIN_COLS`] columns (as many images as that takes, up to the batch), so that the products
/// stay wide and deep (ResNet-50's 1024 → 2048 shortcut has 49 outputs per image).
const BLOCK_FLOATS: usize = 64 * 1024;

/// The fewest columns (image · output position) of a block, batch permitting.
const MIN_COLS: usize = 512;

/// True for a 1×1 kernel with no padding and a stride above 1 in some dimension: the layers
/// this module runs (stride 1 is [`is_pointwise`]'s dense case).
pub(crate) fn applies(g: &ConvGeometry) -> bool {
    g.kernel_len() == 1
        && !is_pointwise(g)
        && g.pad_before().iter().chain(g.pad_after()).all(|&p| p == 0)
}

thread_local! {
    /// This thread's subsampled input block, reused across calls.
    static XS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Frees this thread's subsample buffer ([`crate::release_workspaces`]) and returns its bytes;
/// 0 when in use.
pub(crate) fn release_thread() -> usize {
    crate::take_thread_buffer(&XS, crate::vec_bytes)
}

/// Runs `f` on this thread's subsample buffer of at least `len` values (contents unspecified).
fn with_xs<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    XS.with_borrow_mut(|xs| {
        if xs.len() < len {
            xs.resize(len, 0.0);
        }
        f(&mut xs[..len])
    })
}

/// How the batch is cut: `blocks` blocks of at most `per_block` images, `parts` of them at a
/// time in parallel (`parts == 1`: one block at a time, each product on every thread).
#[derive(Clone, Copy, Debug)]
struct Blocks {
    per_block: usize,
    blocks: usize,
    parallel: bool,
}

impl Blocks {
    fn new(g: &ConvGeometry) -> Blocks {
        let batch = g.batch();
        let widest = g.in_channels_per_group().max(g.out_channels_per_group());
        let per_image = widest * g.output_spatial_len();
        let mut per_block = (BLOCK_FLOATS / per_image.max(1))
            .max(MIN_COLS.div_ceil(g.output_spatial_len().max(1)))
            .clamp(1, batch.max(1));
        let threads = rayon::current_num_threads().max(1);
        let parallel = threads > 1 && batch >= threads;
        if parallel {
            // A multiple of the thread count of blocks, so that every thread gets as many.
            let blocks = batch.div_ceil(per_block).div_ceil(threads) * threads;
            per_block = batch.div_ceil(blocks);
        }
        Blocks {
            per_block,
            blocks: batch.div_ceil(per_block),
            parallel,
        }
    }

    /// Images of block `b`.
    fn images(&self, g: &ConvGeometry, b: usize) -> (usize, usize) {
        let n0 = b * self.per_block;
        (n0, (n0 + self.per_block).min(g.batch()))
    }
}

/// Copies group `grp`'s channels of images `n0..n1` of x, subsampled on the stride's grid, into
/// `xs` laid out channel × image × output position (a dense (C/G) × (images·O) matrix).
fn gather(g: &ConvGeometry, grp: usize, x: &[f32], (n0, n1): (usize, usize), xs: &mut [f32]) {
    let d = g.dims3();
    let (cg, ilen, olen) = (
        g.in_channels_per_group(),
        g.input_spatial_len(),
        g.output_spatial_len(),
    );
    let nb = n1 - n0;
    let (w, s2) = (d.output[2], d.stride[2]);
    for c in 0..cg {
        for n in n0..n1 {
            let plane = &x[(n * g.in_channels() + grp * cg + c) * ilen..][..ilen];
            let out = &mut xs[(c * nb + n - n0) * olen..][..olen];
            let mut lines = out.chunks_exact_mut(w);
            for o0 in 0..d.output[0] {
                for o1 in 0..d.output[1] {
                    let line = lines.next().expect("O / w lines");
                    let at = (o0 * d.stride[0] * d.input[1] + o1 * d.stride[1]) * d.input[2];
                    let src = &plane[at..][..(w - 1) * s2 + 1];
                    // SAFETY: `line` holds `w` values; `src` holds `(w − 1)·s2 + 1`, so every
                    // read at `t·s2`, `t < w`, is inside it; x and the buffer never overlap.
                    unsafe { copy_run(line.as_mut_ptr(), src.as_ptr(), w, s2) };
                }
            }
        }
    }
}

/// Writes images `n0..n1`, group `grp`'s channels, of dx from `panel` (channel × image × output
/// position, as [`gather`] lays out): the grid positions get the panel's values, every other
/// position zero. Each line of dx is written once.
fn scatter(g: &ConvGeometry, grp: usize, panel: &[f32], (n0, n1): (usize, usize), dx: DxPtr) {
    let d = g.dims3();
    let (cg, ilen, olen) = (
        g.in_channels_per_group(),
        g.input_spatial_len(),
        g.output_spatial_len(),
    );
    let nb = n1 - n0;
    let (w, s2, width) = (d.output[2], d.stride[2], d.input[2]);
    for c in 0..cg {
        for n in n0..n1 {
            let at = (n * g.in_channels() + grp * cg + c) * ilen;
            // SAFETY: `at .. at + ilen` is one plane of dx (image n < N, channel < C); only
            // this block writes image n's planes of this group (see `DxPtr`).
            let plane = unsafe { dx.slice(at, ilen) };
            let src = &panel[(c * nb + n - n0) * olen..][..olen];
            let mut lines = plane.chunks_exact_mut(width);
            for i0 in 0..d.input[0] {
                // The output row of input row i0, if it is on the grid.
                let o0 = (i0 % d.stride[0] == 0 && i0 / d.stride[0] < d.output[0])
                    .then_some(i0 / d.stride[0]);
                let (mut phase, mut o1) = (0, 0);
                for _ in 0..d.input[1] {
                    let line = lines.next().expect("I / width lines");
                    match o0 {
                        Some(o0) if phase == 0 && o1 < d.output[1] => {
                            spread(line, &src[(o0 * d.output[1] + o1) * w..][..w], s2)
                        }
                        _ => zero(line),
                    }
                    phase += 1;
                    if phase == d.stride[1] {
                        (phase, o1) = (0, o1 + 1);
                    }
                }
            }
        }
    }
}

/// `line[t·s] = src[t]`, every other element of `line` zero, in one pass over `line` (which
/// holds at least `(src.len() − 1)·s + 1` values; `src` is not empty).
#[inline]
fn spread(line: &mut [f32], src: &[f32], s: usize) {
    let w = src.len();
    if s == 2 {
        // (value, 0) pairs (the compiler interleaves with a zero vector), the last value, zeros.
        let (head, tail) = line.split_at_mut(2 * (w - 1));
        for (d, &v) in head.chunks_exact_mut(2).zip(&src[..w - 1]) {
            d[0] = v;
            d[1] = 0.0;
        }
        tail[0] = src[w - 1];
        zero(&mut tail[1..]);
        return;
    }
    zero(line);
    for (d, &v) in line.iter_mut().step_by(s).zip(src) {
        *d = v;
    }
}

/// `line.fill(0.0)` as inline vector stores (a short line would otherwise cost a memset call).
#[inline]
fn zero(line: &mut [f32]) {
    let mut chunks = line.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&[0.0; 8]);
    }
    for v in chunks.into_remainder() {
        *v = 0.0;
    }
}

/// dx (or y) as a raw pointer shared by the blocks, which write disjoint images.
#[derive(Clone, Copy)]
struct DxPtr {
    ptr: *mut f32,
    len: usize,
}

impl DxPtr {
    /// `dx[off .. off + len]`.
    ///
    /// # Safety
    /// The range must lie inside the buffer and no other live slice may overlap it.
    unsafe fn slice<'a>(self, off: usize, len: usize) -> &'a mut [f32] {
        assert!(off + len <= self.len, "block slice out of bounds");
        // SAFETY: in bounds (checked above); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }
}

// SAFETY: the blocks that share a `DxPtr` write disjoint images of the tensor (each block its
// own range of images), and the `&mut` borrow it was built from outlives them.
unsafe impl Sync for DxPtr {}

/// A dense store on one thread (`serial`) or split by core-blas across the threads.
fn run_gemm<A: core_blas::PackA, B: core_blas::PackB>(
    a: &A,
    b: &B,
    store: DenseStore<'_>,
    serial: bool,
) -> Result<()> {
    if serial {
        core_blas::gemm_with(a, b, &mut OneThread(store))
    } else {
        let mut store = store;
        core_blas::gemm_with(a, b, &mut store)
    }
    .map_err(gemm_err)
}

/// Runs `one(block, serial)` over every block: in parallel, each on one thread, when
/// [`Blocks::parallel`], else one after the other.
fn for_blocks(bl: Blocks, one: impl Fn(usize, bool) -> Result<()> + Sync) -> Result<()> {
    if bl.parallel {
        (0..bl.blocks)
            .into_par_iter()
            .try_for_each(|b| one(b, true))
    } else {
        (0..bl.blocks).try_for_each(|b| one(b, false))
    }
}

/// y = conv(x, w) (+ bias) (then ReLU) for a 1×1 strided layer ([`applies`]).
pub(crate) fn forward(
    g: &ConvGeometry,
    x: &[f32],
    w: &[f32],
    epi: Epilogue<'_>,
    y: &mut [f32],
) -> Result<()> {
    let (cg, kg, olen) = (
        g.in_channels_per_group(),
        g.out_channels_per_group(),
        g.output_spatial_len(),
    );
    let bl = Blocks::new(g);
    let out = DxPtr {
        ptr: y.as_mut_ptr(),
        len: y.len(),
    };
    for grp in 0..g.groups() {
        let a =
            MatRef::row_major("w", &w[grp * kg * cg..][..kg * cg], kg, cg, cg).map_err(gemm_err)?;
        let bias = epi.bias.map(|b| &b[grp * kg..][..kg]);
        for_blocks(bl, |blk, serial| {
            let (n0, n1) = bl.images(g, blk);
            let cols = (n1 - n0) * olen;
            with_xs(cg * cols, |xs| {
                gather(g, grp, x, (n0, n1), xs);
                let b = MatRef::row_major("xs", xs, cg, cols, cols).map_err(gemm_err)?;
                if n1 - n0 == 1 {
                    // One image: its group of y is a dense K/G × O matrix.
                    // SAFETY: image n0's channels of group `grp`, inside y; only this block
                    // writes image n0.
                    let yn =
                        unsafe { out.slice((n0 * g.out_channels() + grp * kg) * olen, kg * olen) };
                    let c = MatMut::row_major("y", yn, kg, olen, olen).map_err(gemm_err)?;
                    let mut store = DenseStore::new(c, 1.0, 0.0);
                    if let Some(b) = bias {
                        store = store
                            .with_bias(core_blas::Bias::PerRow(b))
                            .map_err(gemm_err)?;
                    }
                    if epi.relu {
                        store = store.with_relu();
                    }
                    return run_gemm(&a, &b, store, serial);
                }
                // Several images: one product over the block, stored into y through the
                // channel-major map (tiles inside one image straight from registers).
                // SAFETY: images n0..n1 of y; only this block writes them.
                let yb = unsafe {
                    out.slice(
                        n0 * g.out_channels() * olen,
                        (n1 - n0) * g.out_channels() * olen,
                    )
                };
                let store = ChannelMajorStore::new(yb, g.out_channels(), olen, grp * kg, kg, epi);
                if serial {
                    core_blas::gemm_with(&a, &b, &mut OneThread(store))
                } else {
                    let mut store = store;
                    core_blas::gemm_with(&a, &b, &mut store)
                }
                .map_err(gemm_err)
            })
        })?;
    }
    Ok(())
}

/// dx = backward-data(dy, w) for a 1×1 strided layer ([`applies`]); dx is overwritten.
pub(crate) fn backward_data(g: &ConvGeometry, dy: &[f32], w: &[f32], dx: &mut [f32]) -> Result<()> {
    let (cg, kg, olen) = (
        g.in_channels_per_group(),
        g.out_channels_per_group(),
        g.output_spatial_len(),
    );
    let bl = Blocks::new(g);
    let out = DxPtr {
        ptr: dx.as_mut_ptr(),
        len: dx.len(),
    };
    for grp in 0..g.groups() {
        // A = W_gᵀ, (C/G) × (K/G) (W_g is K/G × C/G row-major).
        let a =
            MatRef::new("w", &w[grp * kg * cg..][..kg * cg], cg, kg, 1, cg).map_err(gemm_err)?;
        for_blocks(bl, |blk, serial| {
            let (n0, n1) = bl.images(g, blk);
            let cols = (n1 - n0) * olen;
            let b = ChannelMajor {
                data: dy,
                channels: g.out_channels(),
                plane: olen,
                c0: grp * kg,
                rows: kg,
                n0,
                batch: n1 - n0,
            };
            with_panel(cg * cols, |panel| {
                let c = MatMut::row_major("panel", panel, cg, cols, cols).map_err(gemm_err)?;
                run_gemm(&a, &b, DenseStore::new(c, 1.0, 0.0), serial)?;
                scatter(g, grp, panel, (n0, n1), out);
                Ok(())
            })
        })?;
    }
    Ok(())
}

/// dw = backward-filter(x, dy) for a 1×1 strided layer ([`applies`]); dw is overwritten.
pub(crate) fn backward_filter(
    g: &ConvGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
) -> Result<()> {
    let (cg, kg, olen) = (
        g.in_channels_per_group(),
        g.out_channels_per_group(),
        g.output_spatial_len(),
    );
    let bl = Blocks::new(g);
    let threads = rayon::current_num_threads().max(1);
    // Parallel: thread t sums the blocks t, t + parts, ... into its own partial (part 0 into
    // dw itself), then the partials are added.
    let parts = if bl.parallel {
        threads.min(bl.blocks)
    } else {
        1
    };
    let mut partials = vec![0f32; (parts - 1) * kg * cg];
    for grp in 0..g.groups() {
        let dwg = &mut dw[grp * kg * cg..][..kg * cg];
        let part = |p: usize, acc: &mut [f32]| -> Result<()> {
            for (i, blk) in (p..bl.blocks).step_by(parts).enumerate() {
                let (n0, n1) = bl.images(g, blk);
                let cols = (n1 - n0) * olen;
                let a = ChannelMajor {
                    data: dy,
                    channels: g.out_channels(),
                    plane: olen,
                    c0: grp * kg,
                    rows: kg,
                    n0,
                    batch: n1 - n0,
                };
                with_xs(cg * cols, |xs| {
                    gather(g, grp, x, (n0, n1), xs);
                    let b = MatRef::row_major("xs", xs, cg, cols, cols)
                        .map_err(gemm_err)?
                        .t();
                    let c = MatMut::row_major("dw", &mut *acc, kg, cg, cg).map_err(gemm_err)?;
                    let beta = if i == 0 { 0.0 } else { 1.0 };
                    run_gemm(&a, &b, DenseStore::new(c, 1.0, beta), parts > 1)
                })?;
            }
            Ok(())
        };
        if parts == 1 {
            part(0, dwg)?;
        } else {
            std::iter::once(&mut *dwg)
                .chain(partials.chunks_exact_mut(kg * cg))
                .enumerate()
                .par_bridge()
                .try_for_each(|(p, acc)| part(p, acc))?;
            for extra in partials.chunks_exact(kg * cg) {
                dwg.iter_mut().zip(extra).for_each(|(d, &v)| *d += v);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use crate::testing::{Tolerance, uniform};

    /// Every pass on 1×1 strided layers (strides 2-3, odd sizes, 1-3-D, groups, batch 1-7,
    /// bias + ReLU forward) on 1, 2 and 3 threads against the reference, with buffers that hold
    /// NaN beforehand (dx and y must be fully overwritten).
    #[test]
    fn subsampled_passes_match_the_reference() {
        let geoms = [
            ConvGeometry::new(3, 5, 4, &[9, 11], &[1, 1])
                .unwrap()
                .with_stride(&[2])
                .unwrap(),
            ConvGeometry::new(7, 6, 8, &[10, 7], &[1, 1])
                .unwrap()
                .with_stride(&[3, 2])
                .unwrap()
                .with_groups(2)
                .unwrap(),
            ConvGeometry::new(2, 3, 5, &[13], &[1])
                .unwrap()
                .with_stride(&[3])
                .unwrap(),
            ConvGeometry::new(1, 4, 6, &[5, 6, 7], &[1, 1, 1])
                .unwrap()
                .with_stride(&[2, 1, 3])
                .unwrap(),
            // Wide channels: several blocks of images (BLOCK_FLOATS / (C·O) < batch).
            ConvGeometry::new(5, 130, 140, &[33, 31], &[1, 1])
                .unwrap()
                .with_stride(&[2])
                .unwrap(),
        ];
        for g in &geoms {
            assert!(applies(g), "{g:?}");
            let (x, w, dy) = (
                uniform(1, g.x_len()),
                uniform(2, g.w_len()),
                uniform(3, g.y_len()),
            );
            let bias = uniform(4, g.out_channels());
            let mut want_y = vec![0f32; g.y_len()];
            reference::forward(g, &x, &w, Some(&bias), &mut want_y).unwrap();
            want_y.iter_mut().for_each(|v| *v = v.max(0.0));
            let mut want_dx = vec![0f32; g.x_len()];
            reference::backward_data(g, &dy, &w, &mut want_dx).unwrap();
            let mut want_dw = vec![0f32; g.w_len()];
            reference::backward_filter(g, &x, &dy, &mut want_dw).unwrap();
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let what = format!("{g:?} {threads} threads");
                let epi = Epilogue {
                    alpha: 1.0,
                    beta: 0.0,
                    bias: Some(&bias),
                    relu: true,
                };
                let mut y = vec![f32::NAN; g.y_len()];
                pool.install(|| forward(g, &x, &w, epi, &mut y)).unwrap();
                Tolerance::for_f32_sum(g.in_channels_per_group())
                    .check(&format!("y {what}"), &y, &want_y)
                    .unwrap();
                let mut dx = vec![f32::NAN; g.x_len()];
                pool.install(|| backward_data(g, &dy, &w, &mut dx)).unwrap();
                Tolerance::for_f32_sum(g.out_channels_per_group())
                    .check(&format!("dx {what}"), &dx, &want_dx)
                    .unwrap();
                let mut dw = vec![f32::NAN; g.w_len()];
                pool.install(|| backward_filter(g, &x, &dy, &mut dw))
                    .unwrap();
                Tolerance::for_f32_sum(g.batch() * g.output_spatial_len())
                    .check(&format!("dw {what}"), &dw, &want_dw)
                    .unwrap();
            }
        }
    }
}
