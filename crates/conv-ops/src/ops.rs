//! The three passes of a convolution layer, each with its choice of algorithm.

use core_blas::{Bias, DenseStore, MatMut, MatRef};
use rayon::prelude::*;

use crate::algo::{BackwardDataAlgo, BackwardFilterAlgo, ForwardAlgo, Workspace};
use crate::convgemm::Im2colB;
use crate::convgemm_trans::Im2colTB;
use crate::error::{Result, gemm_err};
use crate::geometry::ConvGeometry;
use crate::im2col::{col2im_add, im2col, im2col_shape};
use crate::layout::{
    ChannelMajor, ChannelMajorStore, Columns, Epilogue, OneThread, RowClass, forward_classes,
    forward_panels,
};
use crate::shares::share_out;

/// The weights of group `grp` as a (K/G) × (C/G·R) row-major matrix.
fn weights<'a>(g: &ConvGeometry, grp: usize, w: &'a [f32]) -> Result<MatRef<'a>> {
    let (kg, cols) = (
        g.out_channels_per_group(),
        g.in_channels_per_group() * g.kernel_len(),
    );
    MatRef::row_major("w", &w[grp * kg * cols..][..kg * cols], kg, cols, cols).map_err(gemm_err)
}

/// dy (or y) of group `grp` as the (K/G) × (N·O) matrix of the GEMMs.
fn out_channels<'a>(g: &ConvGeometry, grp: usize, dy: &'a [f32]) -> ChannelMajor<'a> {
    let kg = g.out_channels_per_group();
    ChannelMajor {
        data: dy,
        channels: g.out_channels(),
        plane: g.output_spatial_len(),
        c0: grp * kg,
        rows: kg,
        n0: 0,
        batch: g.batch(),
    }
}

/// A 1×1 kernel with stride 1 and no padding reads x itself: B is the input of images
/// `n0..n0 + count`, group `grp`, as a channels × (images·O) matrix, no im2col indexing at all.
fn pointwise_b<'a>(
    g: &ConvGeometry,
    grp: usize,
    x: &'a [f32],
    n0: usize,
    count: usize,
) -> ChannelMajor<'a> {
    let cg = g.in_channels_per_group();
    ChannelMajor {
        data: x,
        channels: g.in_channels(),
        plane: g.input_spatial_len(),
        c0: grp * cg,
        rows: cg,
        n0,
        batch: count,
    }
}

/// Output planes at least this large run the forward convgemm image by image with a dense store;
/// smaller ones over the whole batch, C panel by C panel (a per-image GEMM would be too
/// narrow), see [`forward_panels`].
const PER_IMAGE_MIN_PLANE: usize = 1024;

/// The deepest per-image forward product (K = C/G·R, or a slab's share of it) run in one pass
/// over its depth instead of the driver's passes of the table's KC (576 = 2 × 288): each pass
/// loads and stores the image's C (K/G × O, 64 × 50176 on VGG's 64@224²: memory-sized), which
/// one pass halves; the B micro-panel (`576 × NR`, 108 KiB) then streams from L2.
/// `probe_passes`, 1 thread, `CORE_BLAS_KC=576` (every product) against the table's KC, quiet
/// 01:58 UTC, min of 5: VGG 64@224² forward 37.23 / 36.84, 37.41 / 36.44, 37.89 / 35.97,
/// 37.20 / 36.53 ms, flipped backward-data 36.90 / 35.37, 36.79 / 36.52, 37.97 / 36.54;
/// ResNet-50 64@56² forward 18.13 / 16.78, 17.98 / 17.25, 18.13 / 17.74, 17.81 / 17.29.
/// Deeper products gain as well (the B micro-panel, `depth × NR`, 332 KiB at 1728 × 48, still
/// streams from L2): Zen 4 (AVX-512), `probe_passes ... 5`, 1 thread, `CORE_BLAS_KC` (every
/// product) against the table's KC, medians of 4 alternations, quiet 09:45:18 UTC: C3D 64@8×56²
/// (slabs of depth 1152 and 1728) forward 47.21 / 46.07 (864) / 45.89 (1152) / 45.59 (1728) ms,
/// flipped backward-data 47.14 / 45.97 / 45.78 / 45.67; VGG 128@112² (1152), 3 alternations,
/// quiet 09:46:12: forward 32.87 / 32.54, flipped 32.89 / 32.47; VGG 256@56² (2304): forward
/// 32.98 / 32.45, flipped 32.78 / 32.55.
const ONE_PASS_MAX: usize = 2304;

/// `gemm` with KC raised to `depth` when that runs a product of that depth in one pass and
/// `depth` is at most `max` (each caller's measured limit: [`ONE_PASS_MAX`] here, tapsum's
/// own for the tap products); `gemm` as it is otherwise.
pub(crate) fn one_pass(
    gemm: &core_blas::Gemm,
    depth: usize,
    max: usize,
) -> std::result::Result<core_blas::Gemm, core_blas::Error> {
    let bs = gemm.block_sizes();
    if depth > bs.kc && depth <= max {
        gemm.with_block_sizes(core_blas::BlockSizes { kc: depth, ..bs })
    } else {
        Ok(*gemm)
    }
}

/// Output planes of at least this many micro-tile widths (or a multiple of one) run the
/// whole-batch forward as one product stored through the channel-major map, whose tiles inside
/// one image the micro-kernel stores from registers; smaller planes, whose tiles straddle
/// images too often (those go through the tile buffer on every k-pass), through C panels.
/// Measured (criterion, 1 and 2 threads, two rounds, 09:33-09:39 UTC): ResNet-50's stride-2
/// 128@56² (784 outputs per plane) 0.98× the panels' time at 1 thread, 0.87× at 2; 256@14²
/// (196 = 12.25 tiles) 1.07× (probe: 0.97-1.05×), so it keeps the panels, as 512@7² (49,
/// probe 1.03×) does; ResNet-20's 32@16² (256 = 16 tiles, none straddles) probe 0.97×.
const WINDOW_MIN_TILES: usize = 32;

/// The forward convgemm over the whole batch of small output planes (`dims`: y's channels,
/// plane, first channel of the group): see [`WINDOW_MIN_TILES`] and [`forward_panels`].
fn forward_batch<A: core_blas::PackA, B: core_blas::PackB>(
    a: &A,
    b: &B,
    y: &mut [f32],
    (channels, plane, c0): (usize, usize, usize),
    epi: Epilogue<'_>,
) -> std::result::Result<(), core_blas::Error> {
    let nr = core_blas::Gemm::global()?.tile().1;
    if plane % nr == 0 || plane >= WINDOW_MIN_TILES * nr {
        let mut store = ChannelMajorStore::new(y, channels, plane, c0, a.rows(), epi);
        core_blas::gemm_with(a, b, &mut store)
    } else {
        forward_panels(a, b, y, (channels, plane, c0), epi, false)
    }
}

/// The forward convgemm of a pointwise layer with large planes on several threads: the images
/// shared out ([`share_out`]: each thread claims the next image when it ends one), each image's
/// product (K/G × O, C/G deep: B = x\[n\] of the group, packed and prefetched as a dense matrix)
/// on the thread that claimed it, stored straight into y. One fork per call, where a product per
/// image split over the threads forked once per image (8 times on ResNet-50's batch of 8), each
/// product too small (64 × 3136 × 256: 51 M multiply-adds) for core-blas's crew, so its second
/// part, woken unbound, could start late. The callers take it when the images divide evenly
/// among the threads. ResNet-50 1×1 256→64 @56² (batch 8), Intel Emerald Rapids, 2 threads,
/// `probe_passes --paired --threads 2 ... 30 fwd` (bound / pass pair medians), A B B A
/// rounds: quiet 17:29:05 and 17:47 UTC (one binary, the two forms by a switch), split products
/// 0.984, 0.962, 0.978, 0.924, 1.024, 1.010, 1.009, 0.960, 0.977, 0.996 (median 0.981), images
/// shared out 1.009, 0.990, 1.022, 0.995, 0.999, 1.021, 1.058, 1.050, 1.060, 1.025 (1.022);
/// quiet 18:07:02 (main against this build) 1.001, 0.983, 0.968, 0.982, 0.934, 1.007 (0.983)
/// against 1.017, 0.993, 0.987, 1.014, 0.982, 0.975 (0.990), 5 of 6 rounds higher.
fn pointwise_images<A: ForwardA>(
    g: &ConvGeometry,
    grp: usize,
    a: &A,
    x: &[f32],
    (bias, relu): (Option<&[f32]>, bool),
    y: &mut [f32],
) -> Result<()> {
    let (kg, cg, olen) = (
        g.out_channels_per_group(),
        g.in_channels_per_group(),
        g.output_spatial_len(),
    );
    let images = y.chunks_mut(g.out_channels() * olen).collect();
    share_out(images, |n, yi: &mut [f32]| {
        let yn = &mut yi[grp * kg * olen..][..kg * olen];
        let c = MatMut::row_major("y", yn, kg, olen, olen).map_err(gemm_err)?;
        let mut dense = DenseStore::new(c, 1.0, 0.0);
        if let Some(b) = bias {
            dense = dense
                .with_bias(Bias::PerRow(&b[grp * kg..][..kg]))
                .map_err(gemm_err)?;
        }
        if relu {
            dense = dense.with_relu();
        }
        let xn = &x[(n * g.in_channels() + grp * cg) * olen..][..cg * olen];
        let b = MatRef::row_major("x", xn, cg, olen, olen).map_err(gemm_err)?;
        core_blas::gemm_with(a, &b, &mut OneThread(dense)).map_err(gemm_err)
    })
}

/// True for a 1×1 kernel with stride 1 and no padding: im2col(x) is x itself.
pub(crate) fn is_pointwise(g: &ConvGeometry) -> bool {
    g.kernel_len() == 1
        && g.stride().iter().all(|&s| s == 1)
        && g.pad_before().iter().chain(g.pad_after()).all(|&p| p == 0)
}

/// y = conv(x, w) (+ bias\[k\]) (then ReLU when `relu`), by `algo`.
///
/// Layouts: x N×C×spatial, w K×(C/G)×kernel, y N×K×output spatial, bias K (see
/// [`ConvGeometry`]). `ws` holds the buffer of the `base` algorithm.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    g: &ConvGeometry,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
    algo: ForwardAlgo,
    ws: &mut Workspace,
) -> Result<()> {
    g.check_len("x", x.len(), g.x_len())?;
    g.check_len("w", w.len(), g.w_len())?;
    g.check_len("y", y.len(), g.y_len())?;
    if let Some(b) = bias {
        g.check_len("bias", b.len(), g.out_channels())?;
    }
    let epi = Epilogue {
        alpha: 1.0,
        beta: 0.0,
        bias,
        relu,
    };
    if algo == ForwardAlgo::Direct {
        return crate::direct::forward(g, x, crate::direct::Weights::Plain(w), bias, relu, y);
    }
    if algo == ForwardAlgo::Convgemm && crate::tapwise::applies(g) {
        // Tiny planes: only the pairs of positions a tap joins (no padding products).
        return crate::tapwise::forward(g, x, w, bias, relu, y);
    }
    if algo == ForwardAlgo::Convgemm && crate::tapsum::applies(g) {
        // Many channels on small planes: one product per tap over the pairs it joins.
        return crate::tapsum::forward(g, x, w, bias, relu, y);
    }
    if algo == ForwardAlgo::Convgemm && crate::subsample::applies(g) {
        // 1×1 strided: the pointwise product on a subsampled block of images.
        return crate::subsample::forward(g, x, w, epi, y);
    }
    if algo == ForwardAlgo::Convgemm && crate::phasesplit::applies(g) {
        // Strided 2-D: the stride-1 convgemm over x split into its phases.
        return crate::phasesplit::forward(g, x, w, epi, y);
    }
    let result = (0..g.groups()).try_for_each(|grp| {
        let a = weights(g, grp, w)?;
        forward_group(g, grp, &a, x, bias, relu, y, algo, ws)
    });
    ws.release();
    result
}

/// One slab of output positions along the outermost spatial dimension of a per-image forward
/// convgemm (see [`outer_slabs`]): the columns (output positions of one image) and the taps of
/// the outermost kernel dimension that read inside the input there.
struct Slab {
    cols: std::ops::Range<usize>,
    r: std::ops::Range<usize>,
}

/// Taps of the per-image forward that only multiply padding, as a fraction of all, from which
/// [`outer_slabs`] splits the product.
const MIN_PADDING_SHARE: f64 = 0.02;

/// The output of one image cut into slabs along the outermost spatial dimension, consecutive
/// output coordinates whose kernel taps there reach the same range of valid input coordinates
/// (for a 3×3×3 kernel with padding 1: the first depth slice (taps 1-2), the interior (all),
/// the last (taps 0-1)); the taps of the outermost dimension are the outermost of the flat tap
/// index, so a slab's valid taps are one contiguous range of rows of im2col, and its product
/// skips the rest, which only multiply padding. `None` when the skipped taps are fewer than
/// [`MIN_PADDING_SHARE`] of all (ResNet-50's 56² planes: 1.2%; C3D's 8×56²: 8.3%), or the
/// layer has groups (the weights of the slab's taps are copied per call).
fn outer_slabs(g: &ConvGeometry) -> Option<Vec<Slab>> {
    if g.groups() != 1 || g.kernel()[0] == 1 {
        return None;
    }
    let (o0, k0) = (g.output()[0], g.kernel()[0]);
    let inner = g.output_spatial_len() / o0;
    let (s, dil, pad, len) = (
        g.stride()[0] as isize,
        g.dilation()[0] as isize,
        g.pad_before()[0] as isize,
        g.input()[0] as isize,
    );
    let valid = |o: usize| {
        let ok = |r: usize| (0..len).contains(&(o as isize * s + r as isize * dil - pad));
        let lo = (0..k0).find(|&r| ok(r)).unwrap_or(k0);
        let hi = (lo..k0).find(|&r| !ok(r)).unwrap_or(k0);
        lo..hi
    };
    let mut slabs: Vec<Slab> = Vec::new();
    let mut skipped = 0;
    for o in 0..o0 {
        let r = valid(o);
        skipped += k0 - r.len();
        match slabs.last_mut() {
            Some(last) if last.r == r => last.cols.end += inner,
            _ => slabs.push(Slab {
                cols: o * inner..(o + 1) * inner,
                r,
            }),
        }
    }
    // An empty range (every tap in the padding: an output of bias alone) is left to the plain
    // product, and so are slabs narrower than a few C panels (their products would run on
    // the kernel's edges).
    if slabs
        .iter()
        .any(|sl| sl.r.is_empty() || sl.cols.len() < MIN_SLAB_COLS)
        || (skipped as f64) < MIN_PADDING_SHARE * (o0 * k0) as f64
    {
        return None;
    }
    Some(slabs)
}

/// Output positions of the narrowest slab [`outer_slabs`] takes.
const MIN_SLAB_COLS: usize = 256;

thread_local! {
    /// The slabs' weight copies ([`slab_weights`]) of the calls on this thread: grows to the
    /// largest and stays, so that a call allocates (and page-faults) nothing.
    static SLAB_WEIGHTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Frees this thread's slab weight copies ([`crate::release_workspaces`]) and returns their
/// bytes; one in use counts 0.
pub(crate) fn release_thread() -> usize {
    crate::take_thread_buffer(&SLAB_WEIGHTS, crate::vec_bytes)
}

/// Per slab, `None` when it takes every tap (the product reads A itself), or the range of
/// `buf` holding A's columns of its taps, `W[k][c][tap0..tap0 + taps]` as a dense K/G ×
/// C/G·taps matrix (copied once per call and group: weights-sized, not growing with the
/// batch). `buf` is the caller's kept buffer (`SLAB_WEIGHTS`): per-call vectors of these
/// sizes (442 KB and two of 295 KB on C3D's 64@8×56²) were mapped and faulted in anew on every
/// call (221 page faults a call).
fn slab_weights<A: core_blas::PackA>(
    g: &ConvGeometry,
    a: &A,
    slabs: &[Slab],
    buf: &mut Vec<f32>,
) -> Vec<Option<std::ops::Range<usize>>> {
    let (kg, cols, rlen) = (a.rows(), a.cols(), g.kernel_len());
    let inner = rlen / g.kernel()[0];
    let part = |s: &Slab| s.r.len() * inner;
    let copies: usize = slabs
        .iter()
        .filter(|s| part(s) < rlen)
        .map(|s| kg * cols / rlen * part(s))
        .sum();
    buf.clear();
    buf.resize(kg * cols + copies, 0.0);
    // A as a dense row-major matrix (micro-panels one row tall), then the slabs' columns.
    let (wd, rest) = buf.split_at_mut(kg * cols);
    a.pack_a(0, kg, 0, cols, 1, wd);
    let mut at = kg * cols;
    slabs
        .iter()
        .map(|s| {
            let (tap0, taps) = (s.r.start * inner, part(s));
            (taps < rlen).then(|| {
                let start = at;
                for row in wd.chunks_exact(rlen) {
                    rest[at - kg * cols..][..taps].copy_from_slice(&row[tap0..tap0 + taps]);
                    at += taps;
                }
                start..at
            })
        })
        .collect()
}

/// One class of output rows of a 2-D layer (see [`row_classes`]): consecutive output rows
/// whose kernel rows reading inside the input are the same range `dy`.
struct RowRange {
    rows: std::ops::Range<usize>,
    dy: std::ops::Range<usize>,
}

/// Kernel rows of the whole-batch forward that only multiply padding, as a fraction of all,
/// from which [`row_classes`] splits the product. `probe_passes`, 1 thread, 3 alternations,
/// ms, one product / classes: 256@14² (4.8%, quiet 21:51:01 UTC) forward 17.19 / 16.54,
/// 17.19 / 16.56, 17.15 / 16.49, flipped backward-data 17.24 / 16.78, 17.17 / 16.67, 17.46 /
/// 16.61; 128@28² (2.4%, quiet 22:06:08) forward 17.26 / 16.93, 17.12 / 16.90, 17.02 /
/// 16.76, flipped 17.03 / 16.94, 16.93 / 16.73, 17.03 / 16.72.
const MIN_ROW_PADDING_SHARE: f64 = 0.02;

/// Input and output channels (per group, both) from which [`row_classes`] splits the
/// product: on fewer, the classes' shallower products (a kernel row's K is C/G · 3) cost
/// more than the padding products they skip. `probe_passes`, 1 thread, quiet 22:02:32 UTC,
/// 3 alternations, ms, one product / classes: ResNet-20's 32@16² (batch 128, 4.2% skipped)
/// forward 7.26 / 7.44, 6.52 / 7.42, 7.47 / 8.58; 64@8² (8.3%) 7.10 / 7.25, 6.65 / 7.55,
/// 7.04 / 7.55.
const MIN_ROW_CHANNELS: usize = 128;

/// Columns (images · output positions) of the narrowest class from which [`row_classes`]
/// splits the product, and the largest A (floats) it splits it for: the first and last rows'
/// products read all of their A for their few columns. `probe_passes`, 1 thread, 3
/// alternations, ms, one product / classes (quiet 22:45:20 and 22:46:35 UTC): 256@14² batch 1
/// (14 columns) forward 2.33 / 2.44, 2.55 / 2.74, 2.54 / 2.75, flipped backward-data 2.38 /
/// 2.62, 2.48 / 2.70, 2.62 / 2.76; batch 4 (56) forward 8.98 / 8.86, 8.62 / 8.85, 9.17 /
/// 9.13 (level); batch 8 (112): the gain in [`MIN_ROW_PADDING_SHARE`]; 128@28² batch 1 (28)
/// 2.16 / 2.19, 2.13 / 2.18, 2.15 / 2.40; 512@14² batch 2 (28 columns, A 2.4 Mi floats) 18.40 /
/// 18.48, 18.28 / 18.59, flipped 19.03 / 19.67, 18.86 / 19.61; batch 8 (112) 69.98 / 71.68,
/// 70.74 / 71.59, flipped 69.68 / 72.56, 71.33 / 68.90. (Test builds take any width, so that
/// the tests reach the classes on small layers.)
const MIN_CLASS_COLS: usize = if cfg!(test) { 1 } else { 112 };

/// See [`MIN_CLASS_COLS`]: 1 Mi floats (4 MiB; ResNet-50's 256@14² has 0.56 Mi).
const MAX_CLASS_A: usize = 1 << 20;

/// The output rows of a stride-1 2-D layer on small planes cut into classes by the kernel
/// rows that reach the input (3×3, padding 1: the first row (kernel rows 1-2), the middle
/// rows (all), the last row (0-1)), for [`forward_classes`]: each class is one product over
/// the batch's output positions of its rows and the K range of its kernel rows, so the first
/// and last rows skip the products of the vertical padding. `None` unless the skipped kernel
/// rows are at least [`MIN_ROW_PADDING_SHARE`] of all (ResNet-50's 256@14²: 4.8%, 128@28²:
/// 2.4%), when a row reads only padding, on fewer than [`MIN_ROW_CHANNELS`] channels, on a
/// class narrower than [`MIN_CLASS_COLS`] or an A larger than [`MAX_CLASS_A`].
fn row_classes(g: &ConvGeometry) -> Option<Vec<RowRange>> {
    let d = g.dims3();
    if g.in_channels_per_group().min(g.out_channels_per_group()) < MIN_ROW_CHANNELS
        || d.input[0] != 1
        || d.kernel[0] != 1
        || d.stride.iter().any(|&s| s != 1)
        || d.kernel[1] < 2
    {
        return None;
    }
    let (oh, kh) = (d.output[1], d.kernel[1]);
    let ok = |o: usize, r: usize| (0..d.input[1] as isize).contains(&d.input_coord(1, o, r));
    let mut classes: Vec<RowRange> = Vec::new();
    let mut skipped = 0;
    for o in 0..oh {
        let lo = (0..kh).find(|&r| ok(o, r)).unwrap_or(kh);
        let hi = (lo..kh).find(|&r| !ok(o, r)).unwrap_or(kh);
        if lo == hi || (hi..kh).any(|r| ok(o, r)) {
            return None;
        }
        skipped += kh - (hi - lo);
        match classes.last_mut() {
            Some(last) if last.dy == (lo..hi) => last.rows.end += 1,
            _ => classes.push(RowRange {
                rows: o..o + 1,
                dy: lo..hi,
            }),
        }
    }
    let a_len = g.out_channels_per_group() * g.in_channels_per_group() * g.kernel_len();
    let narrowest = classes.iter().map(|c| c.rows.len()).min().unwrap_or(0);
    if classes.len() < 2
        || (skipped as f64) < MIN_ROW_PADDING_SHARE * (oh * kh) as f64
        || g.batch() * narrowest * d.output[2] < MIN_CLASS_COLS
        || a_len > MAX_CLASS_A
    {
        return None;
    }
    Some(classes)
}

/// An A source of [`forward_group`]: the forward layer's weights, or the flipped ones of
/// [`crate::flipped`].
pub(crate) trait ForwardA: core_blas::PackA + Sized {
    /// The same matrix with its columns in [`forward_classes`]' order (tap group, channel, tap
    /// of the group; `gw` consecutive taps a group), when the source packs that order itself
    /// (then the classes' A is packed in one pass, without a reordering copy).
    fn tap_groups(&self, _gw: usize) -> Option<Self> {
        None
    }
}

impl ForwardA for MatRef<'_> {}

/// The forward pass of group `grp` by a GEMM `algo` (convgemm or im2col + GEMM) whose A (the
/// group's K/G × C/G·R weights) is `a`: the geometry's own weights, or the flipped ones of
/// [`crate::flipped`] packed straight from w.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_group<A: ForwardA>(
    g: &ConvGeometry,
    grp: usize,
    a: &A,
    x: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
    algo: ForwardAlgo,
    ws: &mut Workspace,
) -> Result<()> {
    let (kg, olen) = (g.out_channels_per_group(), g.output_spatial_len());
    let epi = Epilogue {
        alpha: 1.0,
        beta: 0.0,
        bias,
        relu,
    };
    // Large images whose outermost taps partly read padding: a product per output slab.
    let slabs = (algo == ForwardAlgo::Convgemm && olen >= PER_IMAGE_MIN_PLANE && !is_pointwise(g))
        .then(|| outer_slabs(g))
        .flatten();
    if algo == ForwardAlgo::Convgemm && olen >= PER_IMAGE_MIN_PLANE && is_pointwise(g) {
        let threads = rayon::current_num_threads().max(1);
        if threads > 1 && g.batch().is_multiple_of(threads) {
            return pointwise_images(g, grp, a, x, (bias, relu), y);
        }
    }
    // The whole batch's C (K/G × N·O) written into y through the channel-major map.
    let batch_store = |y| ChannelMajorStore::new(y, g.out_channels(), olen, grp * kg, kg, epi);
    match algo {
        // Large images: one GEMM per image, whose C (K/G × O of y[n]) is a dense
        // matrix, so the kernel stores straight from registers (no tile buffer).
        ForwardAlgo::Convgemm if olen >= PER_IMAGE_MIN_PLANE && slabs.is_some() => {
            let slabs = slabs.as_deref().unwrap_or_default();
            let mut buf = SLAB_WEIGHTS.with_borrow_mut(std::mem::take);
            let weights = slab_weights(g, a, slabs, &mut buf);
            let result = (0..g.batch()).try_for_each(|n| {
                let yn = &mut y[(n * g.out_channels() + grp * kg) * olen..][..kg * olen];
                let b = Im2colB::images(g, grp, x, n, 1).with_fused_packing();
                slabs.iter().zip(&weights).try_for_each(|(s, wt)| {
                    let inner = g.kernel_len() / g.kernel()[0];
                    let (tap0, taps) = (s.r.start * inner, s.r.len() * inner);
                    let (j0, cn) = (s.cols.start, s.cols.len());
                    let c = MatMut::row_major("y", &mut yn[j0..], kg, cn, olen)?;
                    let mut dense = DenseStore::new(c, 1.0, 0.0);
                    if let Some(b) = bias {
                        dense = dense.with_bias(Bias::PerRow(&b[grp * kg..][..kg]))?;
                    }
                    if relu {
                        dense = dense.with_relu();
                    }
                    let cols_b = Columns {
                        b: &b.with_taps(tap0, taps),
                        j0,
                        cols: cn,
                    };
                    let depth = a.cols() * taps / g.kernel_len();
                    let deep = one_pass(core_blas::Gemm::global()?, depth, ONE_PASS_MAX)?;
                    match wt {
                        None => deep.gemm_with(a, &cols_b, &mut dense),
                        Some(range) => {
                            let wt = &buf[range.clone()];
                            let ct = wt.len() / kg;
                            let at = MatRef::row_major("w", wt, kg, ct, ct)?;
                            deep.gemm_with(&at, &cols_b, &mut dense)
                        }
                    }
                })
            });
            SLAB_WEIGHTS.with_borrow_mut(|kept| *kept = buf);
            result
        }
        ForwardAlgo::Convgemm if olen >= PER_IMAGE_MIN_PLANE => (0..g.batch()).try_for_each(|n| {
            let yn = &mut y[(n * g.out_channels() + grp * kg) * olen..][..kg * olen];
            let c = MatMut::row_major("y", yn, kg, olen, olen)?;
            let mut dense = DenseStore::new(c, 1.0, 0.0);
            if let Some(b) = bias {
                dense = dense.with_bias(Bias::PerRow(&b[grp * kg..][..kg]))?;
            }
            if relu {
                dense = dense.with_relu();
            }
            if is_pointwise(g) {
                // B = x[n] of the group: a dense (C/G) × O matrix, packed (and
                // prefetched) as one.
                let cg = g.in_channels_per_group();
                let xn = &x[(n * g.in_channels() + grp * cg) * olen..][..cg * olen];
                let b = MatRef::row_major("x", xn, cg, olen, olen)?;
                core_blas::gemm_with(a, &b, &mut dense)
            } else {
                one_pass(core_blas::Gemm::global()?, a.cols(), ONE_PASS_MAX)?.gemm_with(
                    a,
                    &Im2colB::images(g, grp, x, n, 1).with_fused_packing(),
                    &mut dense,
                )
            }
        }),
        // Small planes: one product over the whole batch, C panel by C panel.
        ForwardAlgo::Convgemm if is_pointwise(g) => {
            let b = pointwise_b(g, grp, x, 0, g.batch());
            forward_batch(a, &b, y, (g.out_channels(), olen, grp * kg), epi)
        }
        ForwardAlgo::Convgemm => match row_classes(g) {
            Some(rc) => {
                let (cg, kw, ow) = (
                    g.in_channels_per_group(),
                    g.dims3().kernel[2],
                    g.dims3().output[2],
                );
                let classes: Vec<_> = rc
                    .iter()
                    .map(|c| RowClass {
                        b: Im2colB::new(g, grp, x)
                            .with_fused_packing()
                            .with_tap_groups(c.dy.start * kw, c.dy.len(), kw)
                            .with_window(c.rows.start * ow, c.rows.len() * ow),
                        k0: c.dy.start * cg * kw,
                        wlo: c.rows.start * ow,
                        wlen: c.rows.len() * ow,
                        group_rows: cg * kw,
                    })
                    .collect();
                let (taps, dims) = (g.kernel_len(), (g.out_channels(), olen, grp * kg));
                match a.tap_groups(kw) {
                    // Already in the classes' order: one group of all taps (no reordering).
                    Some(grouped) => {
                        forward_classes(&grouped, (cg, taps, taps), &classes, y, dims, epi)
                    }
                    None => forward_classes(a, (cg, taps, kw), &classes, y, dims, epi),
                }
            }
            None => {
                let b = Im2colB::new(g, grp, x).with_fused_packing();
                forward_batch(a, &b, y, (g.out_channels(), olen, grp * kg), epi)
            }
        },
        ForwardAlgo::Direct => unreachable!("returned above"),
        ForwardAlgo::Im2colGemm => {
            let (rows, cols) = im2col_shape(g);
            let col = ws.take(rows * cols);
            im2col(g, grp, x, col)?;
            let b = MatRef::row_major("col", col, rows, cols, cols).map_err(gemm_err)?;
            core_blas::gemm_with(a, &b, &mut batch_store(y))
        }
    }
    .map_err(gemm_err)
}

/// dx = the gradient of ⟨conv(x, w), dy⟩ with respect to x, by `algo` (dx is overwritten).
pub fn backward_data(
    g: &ConvGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    algo: BackwardDataAlgo,
    ws: &mut Workspace,
) -> Result<()> {
    g.check_len("dy", dy.len(), g.y_len())?;
    g.check_len("w", w.len(), g.w_len())?;
    g.check_len("dx", dx.len(), g.x_len())?;
    let result = match algo {
        // Tiny planes: only the pairs of positions a tap joins (the flipped form keeps its
        // stride-1 domain: outside it, it is an error).
        BackwardDataAlgo::Deconvgemm if crate::tapwise::applies(g) => {
            crate::tapwise::backward_data(g, dy, w, dx)
        }
        BackwardDataAlgo::FlippedConvgemm
            if crate::tapwise::applies(g) && crate::flipped::transposed_geometry(g).is_ok() =>
        {
            crate::tapwise::backward_data(g, dy, w, dx)
        }
        // Many channels on small planes: one product per tap over the pairs it joins.
        BackwardDataAlgo::Deconvgemm | BackwardDataAlgo::FlippedConvgemm
            if crate::tapsum::applies(g) && crate::flipped::transposed_geometry(g).is_ok() =>
        {
            crate::tapsum::backward_data(g, dy, w, dx)
        }
        BackwardDataAlgo::Deconvgemm if crate::subsample::applies(g) => {
            crate::subsample::backward_data(g, dy, w, dx)
        }
        // Strided layers: one stride-1 convgemm per phase of dx, no col2im.
        BackwardDataAlgo::Deconvgemm if crate::phased::applies(g) => {
            crate::phased::backward_data(g, dy, w, dx)
        }
        BackwardDataAlgo::Deconvgemm => crate::deconvgemm::backward_data(g, dy, w, dx),
        BackwardDataAlgo::FlippedConvgemm => {
            crate::flipped::backward_data(g, dy, w, dx, ForwardAlgo::Convgemm, ws)
        }
        BackwardDataAlgo::FlippedDirect => {
            crate::flipped::backward_data(g, dy, w, dx, ForwardAlgo::Direct, ws)
        }
        BackwardDataAlgo::GemmCol2im => (|| {
            dx.fill(0.0);
            let (rows, cols) = im2col_shape(g);
            let col = ws.take(rows * cols);
            for grp in 0..g.groups() {
                let a = weights(g, grp, w)?.t();
                let c = MatMut::row_major("col", col, rows, cols, cols).map_err(gemm_err)?;
                let mut store = DenseStore::new(c, 1.0, 0.0);
                core_blas::gemm_with(&a, &out_channels(g, grp, dy), &mut store)
                    .map_err(gemm_err)?;
                col2im_add(g, grp, col, dx)?;
            }
            Ok(())
        })(),
    };
    ws.release();
    result
}

/// dw = the gradient of ⟨conv(x, w), dy⟩ with respect to w, by `algo` (dw is overwritten).
pub fn backward_filter(
    g: &ConvGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
    algo: BackwardFilterAlgo,
    ws: &mut Workspace,
) -> Result<()> {
    g.check_len("x", x.len(), g.x_len())?;
    g.check_len("dy", dy.len(), g.y_len())?;
    g.check_len("dw", dw.len(), g.w_len())?;
    let (kg, wcols) = (
        g.out_channels_per_group(),
        g.in_channels_per_group() * g.kernel_len(),
    );
    if algo == BackwardFilterAlgo::Direct {
        return crate::direct::backward_filter(g, x, dy, dw);
    }
    if algo == BackwardFilterAlgo::ConvgemmTrans && crate::tapwise::applies(g) {
        return crate::tapwise::backward_filter(g, x, dy, dw);
    }
    if algo == BackwardFilterAlgo::ConvgemmTrans && crate::subsample::applies(g) {
        return crate::subsample::backward_filter(g, x, dy, dw);
    }
    let result = (|| {
        for grp in 0..g.groups() {
            let a = out_channels(g, grp, dy);
            let dwg = &mut dw[grp * kg * wcols..][..kg * wcols];
            if algo == BackwardFilterAlgo::ConvgemmTrans && is_pointwise(g) {
                // Pointwise: im2col(x)ᵀ of image n is x[n]ᵀ, a dense matrix (core-blas packs
                // it with its row-major gather): dw_g = Σ_n dy[n] · x[n]ᵀ, one product per
                // image accumulating into dw_g.
                let (cg, olen) = (g.in_channels_per_group(), g.output_spatial_len());
                for n in 0..g.batch() {
                    let dyn_ = &dy[(n * g.out_channels() + grp * kg) * olen..][..kg * olen];
                    let xn = &x[(n * g.in_channels() + grp * cg) * olen..][..cg * olen];
                    let a = MatRef::row_major("dy", dyn_, kg, olen, olen).map_err(gemm_err)?;
                    let b = MatRef::row_major("x", xn, cg, olen, olen)
                        .map_err(gemm_err)?
                        .t();
                    let c =
                        MatMut::row_major("dw", &mut *dwg, kg, wcols, wcols).map_err(gemm_err)?;
                    let beta = if n == 0 { 0.0 } else { 1.0 };
                    core_blas::gemm(1.0, a, b, beta, c).map_err(gemm_err)?;
                }
                continue;
            }
            if algo == BackwardFilterAlgo::ConvgemmTrans && crate::bf_blocked::applies(g) {
                // Columns in channel-block order (no per-tap transpose), then back.
                let gemm = crate::bf_blocked::gemm(g, kg, wcols)?;
                if crate::bf_blocked::whole_copy(g) {
                    // 3-D kernels: x transposed once into blocks of 16 channels,
                    // position-major, by blocks of images (dW accumulated over the blocks).
                    let nb = crate::bf_blocked::whole_images(g);
                    let (xi, yi) = (
                        g.in_channels() * g.input_spatial_len(),
                        g.out_channels() * g.output_spatial_len(),
                    );
                    for n0 in (0..g.batch()).step_by(nb) {
                        let count = nb.min(g.batch() - n0);
                        let gb = g.with_batch(count)?;
                        let (xb, dyb) = (&x[n0 * xi..][..count * xi], &dy[n0 * yi..][..count * yi]);
                        let beta = if n0 == 0 { 0.0 } else { 1.0 };
                        let ab = out_channels(&gb, grp, dyb);
                        crate::bf_blocked::with_copy(&gb, grp, xb, |whole| {
                            let b = crate::bf_blocked::Im2colTBBlocked::new(&gb, grp, xb, whole);
                            crate::bf_blocked::product_by_planes(&gemm, &gb, &ab, &b, dwg, kg, beta)
                        })
                        .map_err(gemm_err)?;
                    }
                } else {
                    let c =
                        MatMut::row_major("dw", &mut *dwg, kg, wcols, wcols).map_err(gemm_err)?;
                    let mut store = DenseStore::new(c, 1.0, 0.0);
                    let b = crate::bf_blocked::Im2colTBBlocked::new(g, grp, x, None);
                    gemm.gemm_with(&a, &b, &mut store).map_err(gemm_err)?;
                }
                crate::bf_blocked::unblock(dwg, kg, g.in_channels_per_group(), g.kernel_len());
                continue;
            }
            let c = MatMut::row_major("dw", dwg, kg, wcols, wcols).map_err(gemm_err)?;
            let mut store = DenseStore::new(c, 1.0, 0.0);
            match algo {
                BackwardFilterAlgo::ConvgemmTrans => {
                    core_blas::gemm_with(&a, &Im2colTB::new(g, grp, x), &mut store)
                }
                BackwardFilterAlgo::Im2colGemmT => {
                    let (rows, cols) = im2col_shape(g);
                    let col = ws.take(rows * cols);
                    im2col(g, grp, x, col)?;
                    let b = MatRef::row_major("col", col, rows, cols, cols).map_err(gemm_err)?;
                    core_blas::gemm_with(&a, &b.t(), &mut store)
                }
                BackwardFilterAlgo::ReindexConvgemm => {
                    let (gr, xr) = crate::reindex::reindex(g, grp, x, ws)?;
                    core_blas::gemm_with(&a, &Im2colB::new(&gr, 0, xr), &mut store)
                }
                BackwardFilterAlgo::Direct => unreachable!("returned above"),
            }
            .map_err(gemm_err)?;
        }
        Ok(())
    })();
    ws.release();
    result
}

/// db\[k\] = Σ over images and output positions of dy\[n\]\[k\]\[..\] (the bias gradient).
pub fn bias_grad(g: &ConvGeometry, dy: &[f32], db: &mut [f32]) -> Result<()> {
    g.check_len("dy", dy.len(), g.y_len())?;
    g.check_len("db", db.len(), g.out_channels())?;
    let (k, olen) = (g.out_channels(), g.output_spatial_len());
    let channel = |(ch, out): (usize, &mut f32)| {
        // Each plane in LANES f32 partial sums (vectorised), those and the planes in f64.
        let mut acc = 0f64;
        for n in 0..g.batch() {
            acc += plane_sum(&dy[(n * k + ch) * olen..][..olen]);
        }
        *out = acc as f32;
    };
    if rayon::current_num_threads() > 1 && dy.len() >= PAR_BIAS_GRAD_MIN {
        db.par_iter_mut().enumerate().for_each(channel);
    } else {
        db.iter_mut().enumerate().for_each(channel);
    }
    Ok(())
}

/// Lanes of [`plane_sum`]'s partial sums.
const LANES: usize = 16;

/// dy sizes from which [`bias_grad`] splits its channels across threads.
const PAR_BIAS_GRAD_MIN: usize = 1 << 16;

/// The sum of `v`: `LANES` f32 partial sums over `v`'s chunks, then the lanes and the tail in
/// f64.
fn plane_sum(v: &[f32]) -> f64 {
    let mut lanes = [0f32; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    lanes.iter().chain(tail).map(|&x| x as f64).sum()
}

#[cfg(test)]
mod tests {
    use super::{ONE_PASS_MAX, PER_IMAGE_MIN_PLANE, row_classes};
    use crate::testing::{Tolerance, uniform};
    use crate::{BackwardDataAlgo, ConvGeometry, ForwardAlgo, Workspace, reference};

    /// The per-image forward products whose depth (C·R, or a slab's share) lies between the
    /// table's KC and [`ONE_PASS_MAX`] run in one pass (`one_pass`), with and without the outer
    /// slabs, and the flipped backward-data through them, against the reference.
    #[test]
    fn one_pass_per_image_products_match_the_reference() {
        let geoms = [
            // Padding 1: the outer rows' slabs (depths 3·C·2 and 3·C·3).
            ConvGeometry::new(2, 60, 56, &[33, 33], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            // No padding: one product per image (depth 540); flipped: padding 2.
            ConvGeometry::new(1, 60, 60, &[34, 34], &[3, 3]).unwrap(),
            // 3-D, odd planes, padding 1: depth slabs of 24·18 and 24·27 (past 576).
            ConvGeometry::new(2, 24, 20, &[4, 17, 19], &[3, 3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            // 3-D, stride 2 along H and W, padding 1: the same slabs, strided panels.
            ConvGeometry::new(1, 24, 12, &[5, 66, 63], &[3, 3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap()
                .with_stride(&[1, 2, 2])
                .unwrap(),
            // 3-D without padding: one product per image, depth 40·27 = 1080.
            ConvGeometry::new(1, 40, 16, &[3, 34, 35], &[3, 3, 3]).unwrap(),
        ];
        for g in &geoms {
            assert!(g.output_spatial_len() >= PER_IMAGE_MIN_PLANE);
            assert!(g.in_channels() * g.kernel_len() <= ONE_PASS_MAX);
            let (x, w) = (uniform(1, g.x_len()), uniform(2, g.w_len()));
            let (bias, dy) = (uniform(3, g.out_channels()), uniform(4, g.y_len()));
            let mut want = vec![0f32; g.y_len()];
            reference::forward(g, &x, &w, Some(&bias), &mut want).unwrap();
            want.iter_mut().for_each(|v| *v = v.max(0.0));
            let mut want_dx = vec![0f32; g.x_len()];
            reference::backward_data(g, &dy, &w, &mut want_dx).unwrap();
            let ws = &mut Workspace::new(false);
            let mut y = vec![f32::NAN; g.y_len()];
            crate::forward(
                g,
                &x,
                &w,
                Some(&bias),
                true,
                &mut y,
                ForwardAlgo::Convgemm,
                ws,
            )
            .unwrap();
            Tolerance::for_f32_sum(g.in_channels() * g.kernel_len())
                .check("y", &y, &want)
                .unwrap_or_else(|e| panic!("{g:?}: {e}"));
            // The flipped form takes stride 1 only.
            if g.stride().iter().all(|&s| s == 1) {
                let mut dx = vec![f32::NAN; g.x_len()];
                crate::backward_data(g, &dy, &w, &mut dx, BackwardDataAlgo::FlippedConvgemm, ws)
                    .unwrap();
                Tolerance::for_f32_sum(g.out_channels() * g.kernel_len())
                    .check("dx", &dx, &want_dx)
                    .unwrap_or_else(|e| panic!("{g:?}: {e}"));
            }
        }
    }

    /// Pointwise layers with large planes: on 2 and 4 threads (images dividing evenly) each
    /// image's product on the thread that claims it ([`super::pointwise_images`]), on 1 and 3
    /// threads a product per image over all threads; groups, bias and ReLU; y starts as NaN,
    /// so an image or group no product stores shows.
    #[test]
    fn pointwise_images_match_the_reference() {
        let geoms = [
            ConvGeometry::new(4, 24, 20, &[32, 33], &[1, 1]).unwrap(),
            ConvGeometry::new(4, 24, 20, &[33, 32], &[1, 1])
                .unwrap()
                .with_groups(2)
                .unwrap(),
        ];
        for g in &geoms {
            assert!(g.output_spatial_len() >= PER_IMAGE_MIN_PLANE);
            let (x, w) = (uniform(1, g.x_len()), uniform(2, g.w_len()));
            let bias = uniform(3, g.out_channels());
            let mut want = vec![0f32; g.y_len()];
            reference::forward(g, &x, &w, Some(&bias), &mut want).unwrap();
            want.iter_mut().for_each(|v| *v = v.max(0.0));
            for threads in 1..=4 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut y = vec![f32::NAN; g.y_len()];
                pool.install(|| {
                    let ws = &mut Workspace::new(false);
                    crate::forward(
                        g,
                        &x,
                        &w,
                        Some(&bias),
                        true,
                        &mut y,
                        ForwardAlgo::Convgemm,
                        ws,
                    )
                })
                .unwrap();
                Tolerance::for_f32_sum(g.in_channels_per_group())
                    .check(&format!("forward {g:?} {threads} threads"), &y, &want)
                    .unwrap();
            }
        }
    }

    /// The small-plane forward by row classes ([`row_classes`], one product per class over
    /// its K range of the reordered A) and the flipped backward-data through it, on 1, 2 and 3
    /// threads, with bias and ReLU, against the reference: 3×3 with padding 1, a 5×3 kernel
    /// (four border classes), per-side padding, dilation 2, groups, 140 channels (a tap
    /// group of 420 rows, so k blocks straddle groups), and middle classes wider than a tile
    /// (its tiles into y from registers or through the C panel).
    #[test]
    fn row_classes_match_the_reference() {
        let geoms = [
            ConvGeometry::new(2, 128, 128, &[7, 9], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(2, 128, 130, &[9, 8], &[5, 3])
                .unwrap()
                .with_padding_per_side(&[2, 1], &[2, 1])
                .unwrap(),
            ConvGeometry::new(3, 128, 128, &[9, 6], &[3, 3])
                .unwrap()
                .with_padding_per_side(&[1, 1], &[0, 1])
                .unwrap(),
            ConvGeometry::new(2, 128, 128, &[8, 8], &[3, 3])
                .unwrap()
                .with_dilation(&[2, 1])
                .unwrap()
                .with_padding_per_side(&[2, 1], &[2, 1])
                .unwrap(),
            ConvGeometry::new(2, 256, 256, &[6, 11], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap()
                .with_groups(2)
                .unwrap(),
            ConvGeometry::new(3, 140, 128, &[9, 13], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            // Middle classes wider than a tile (168 and 234 columns an image): tiles inside one
            // image stored into y from registers, the others through the C panel; 136 output
            // channels (a short last row of tiles), k longer than one pass.
            ConvGeometry::new(2, 128, 136, &[14, 14], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
            ConvGeometry::new(3, 128, 128, &[15, 18], &[3, 3])
                .unwrap()
                .with_padding(&[1])
                .unwrap(),
        ];
        for g in &geoms {
            assert!(row_classes(g).is_some(), "{g:?} takes the row classes");
            let gt = crate::flipped::transposed_geometry(g).unwrap();
            assert!(row_classes(&gt).is_some(), "{gt:?} takes the row classes");
            let (x, w) = (uniform(1, g.x_len()), uniform(2, g.w_len()));
            let (bias, dy) = (uniform(3, g.out_channels()), uniform(4, g.y_len()));
            let mut want = vec![0f32; g.y_len()];
            reference::forward(g, &x, &w, Some(&bias), &mut want).unwrap();
            want.iter_mut().for_each(|v| *v = v.max(0.0));
            let mut want_dx = vec![0f32; g.x_len()];
            reference::backward_data(g, &dy, &w, &mut want_dx).unwrap();
            let terms = g.in_channels_per_group() * g.kernel_len();
            let terms_dx = g.out_channels_per_group() * g.kernel_len();
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let (mut y, mut dx) = (vec![f32::NAN; g.y_len()], vec![f32::NAN; g.x_len()]);
                pool.install(|| {
                    let ws = &mut Workspace::new(false);
                    crate::forward(
                        g,
                        &x,
                        &w,
                        Some(&bias),
                        true,
                        &mut y,
                        ForwardAlgo::Convgemm,
                        ws,
                    )?;
                    crate::backward_data(g, &dy, &w, &mut dx, BackwardDataAlgo::FlippedConvgemm, ws)
                })
                .unwrap();
                Tolerance::for_f32_sum(terms)
                    .check(&format!("forward {g:?} {threads} threads"), &y, &want)
                    .unwrap();
                Tolerance::for_f32_sum(terms_dx)
                    .check(
                        &format!("backward-data {g:?} {threads} threads"),
                        &dx,
                        &want_dx,
                    )
                    .unwrap();
            }
        }
    }
}
