//! [`MaxPool`]: max pooling in 1, 2 or 3 spatial dimensions.

use core_blas::vector::Vector;
use rayon::prelude::*;

use crate::error::{NnError, Result};
use crate::layer::Layer;
use crate::tensor::Tensor;

/// Max pooling over `kernel` windows moved by `stride`, with implicit `-∞` padding (floor mode:
/// PyTorch's `MaxPoolNd(kernel, stride, padding)`). Keeps the index of each maximum for backward.
#[derive(Debug)]
pub struct MaxPool {
    rank: usize,
    /// Kernel, stride and padding right-aligned into 3 dimensions (leading 1, 1, 0).
    kernel: [usize; 3],
    stride: [usize; 3],
    padding: [usize; 3],
    saved: Option<(Vec<usize>, Vec<u32>)>,
    /// The index buffer of the last backward, lent to the next forward.
    spare_arg: Vec<u32>,
}

impl MaxPool {
    /// Pooling over `kernel`-wide windows in `rank` spatial dimensions with stride `kernel`.
    pub fn new(rank: usize, kernel: usize) -> Result<Self> {
        Self::with_stride(rank, kernel, kernel)
    }

    /// The same with an explicit stride.
    pub fn with_stride(rank: usize, kernel: usize, stride: usize) -> Result<Self> {
        if !(1..=3).contains(&rank) {
            return Err(NnError::config("rank", format!("{rank} (1, 2 or 3)")));
        }
        Self::nd(&vec![kernel; rank], &vec![stride; rank], &vec![0; rank])
    }

    /// Pooling with a kernel, stride and padding per spatial dimension (1 to 3 of them), e.g.
    /// ResNet's stem `nd(&[3, 3], &[2, 2], &[1, 1])` or C3D's `nd(&[1, 2, 2], &[1, 2, 2], &[0; 3])`.
    /// Padding may be at most half the kernel (PyTorch's rule), so every window sees the input.
    pub fn nd(kernel: &[usize], stride: &[usize], padding: &[usize]) -> Result<Self> {
        let rank = kernel.len();
        if !(1..=3).contains(&rank) {
            return Err(NnError::config(
                "kernel",
                format!("{rank} dimensions (1, 2 or 3)"),
            ));
        }
        if stride.len() != rank || padding.len() != rank {
            return Err(NnError::config(
                "stride",
                format!(
                    "kernel, stride and padding need one value per dimension (got {rank}, {}, {})",
                    stride.len(),
                    padding.len()
                ),
            ));
        }
        if kernel.contains(&0) || stride.contains(&0) {
            return Err(NnError::config(
                "kernel",
                "kernel and stride must be positive",
            ));
        }
        if kernel.iter().zip(padding).any(|(&k, &p)| 2 * p > k) {
            return Err(NnError::config(
                "padding",
                format!("{padding:?} exceeds half the kernel {kernel:?}"),
            ));
        }
        let align = |v: &[usize], fill: usize| {
            let mut a = [fill; 3];
            a[3 - rank..].copy_from_slice(v);
            a
        };
        Ok(MaxPool {
            rank,
            kernel: align(kernel, 1),
            stride: align(stride, 1),
            padding: align(padding, 0),
            saved: None,
            spare_arg: Vec::new(),
        })
    }

    /// Number of spatial dimensions.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Kernel size per spatial dimension.
    pub fn kernel(&self) -> &[usize] {
        &self.kernel[3 - self.rank..]
    }

    /// Stride per spatial dimension.
    pub fn stride(&self) -> &[usize] {
        &self.stride[3 - self.rank..]
    }

    /// Padding (on both sides) per spatial dimension.
    pub fn padding(&self) -> &[usize] {
        &self.padding[3 - self.rank..]
    }

    /// Spatial input dims right-aligned into 3 (leading 1s) and the output dims, or an error.
    fn dims(&self, spatial: &[usize], shape: &[usize]) -> Result<([usize; 3], [usize; 3])> {
        if spatial.len() != self.rank {
            return Err(NnError::shape(
                self.describe(),
                "x",
                shape,
                format!("N × C × {} spatial dimensions", self.rank),
            ));
        }
        let (mut i3, mut o3) = ([1; 3], [1; 3]);
        for (d, &s) in spatial.iter().enumerate() {
            let d = 3 - self.rank + d;
            let (k, st, p) = (self.kernel[d], self.stride[d], self.padding[d]);
            if s + 2 * p < k {
                return Err(NnError::shape(
                    self.describe(),
                    "x",
                    shape,
                    format!(
                        "padded spatial sizes ≥ kernel {:?}",
                        &self.kernel[3 - self.rank..]
                    ),
                ));
            }
            i3[d] = s;
            o3[d] = (s + 2 * p - k) / st + 1;
        }
        Ok((i3, o3))
    }
}

impl Layer for MaxPool {
    fn describe(&self) -> String {
        let r = 3 - self.rank;
        let show = |v: &[usize]| match v {
            [a, rest @ ..] if rest.iter().all(|b| b == a) => a.to_string(),
            _ => format!("{v:?}"),
        };
        let mut d = format!(
            "MaxPool{}d(kernel {}, stride {}",
            self.rank,
            show(&self.kernel[r..]),
            show(&self.stride[r..])
        );
        if self.padding.iter().any(|&p| p > 0) {
            d.push_str(&format!(", padding {}", show(&self.padding[r..])));
        }
        d + ")"
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        if shape.len() != self.rank + 2 {
            return Err(NnError::shape(
                self.describe(),
                "x",
                &shape,
                format!("N × C × {} spatial dimensions", self.rank),
            ));
        }
        let (i3, o3) = self.dims(&shape[2..], &shape)?;
        let (ilen, olen) = (i3.iter().product::<usize>(), o3.iter().product::<usize>());
        let planes = shape[0] * shape[1];
        if ilen > u32::MAX as usize {
            return Err(NnError::shape(
                self.describe(),
                "x",
                &shape,
                "planes of at most 2³² values",
            ));
        }
        let mut yshape = shape[..2].to_vec();
        yshape.extend(&o3[3 - self.rank..]);
        // Every output is written below: no zeroing pass.
        let mut y = Tensor::scratch(&yshape);
        // The previous step's index buffer, when it has the length (no page faults per step).
        let mut arg = std::mem::take(&mut self.spare_arg);
        arg.resize(planes * olen, 0);
        let (k3, s3, p3) = (self.kernel, self.stride, self.padding);
        // 2×2 windows with stride 2 over the last two dimensions (VGG's pools, C3D's first).
        let pairs = k3 == [1, 2, 2] && s3 == [1, 2, 2] && p3 == [0; 3];
        let windows = Windows {
            input: i3,
            output: o3,
            kernel: k3,
            stride: s3,
            padding: p3,
        };
        let kern = Vector::global()?;
        y.data_mut()
            .par_chunks_mut(olen)
            .zip(arg.par_chunks_mut(olen))
            .enumerate()
            // The 2×2 path's phase buffers, one set per rayon job (not per plane: VGG's last
            // pools have 16 Ki planes of 4-64 values).
            .try_for_each_init(Vec::new, |phases, (p, (yp, ap))| -> Result<()> {
                let xp = &x.data()[p * ilen..][..ilen];
                if pairs {
                    // The common 2×2 window with stride 2, without the generic index arithmetic,
                    // slice by slice along a third dimension.
                    let (islice, oslice) = (i3[1] * i3[2], o3[1] * o3[2]);
                    for d in 0..o3[0] {
                        let (xs, ys) = (&xp[d * islice..], &mut yp[d * oslice..][..oslice]);
                        let at = &mut ap[d * oslice..][..oslice];
                        let plane = (d * islice, i3[2], (o3[1], o3[2]));
                        pool_2x2(kern, xs, plane, ys, at, phases)?;
                    }
                    Ok(())
                } else {
                    windows.pool_plane(kern, xp, yp, ap)
                }
            })?;
        if train {
            self.saved = Some((shape, arg));
        }
        Ok(y)
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let (shape, arg) = self.saved.take().ok_or_else(|| NnError::no_forward(self))?;
        if dy.len() != arg.len() {
            return Err(NnError::shape(
                self.describe(),
                "dy",
                dy.shape(),
                format!("{} values", arg.len()),
            ));
        }
        if !need_dx {
            return Ok(None);
        }
        let planes = shape[0] * shape[1];
        let ilen = shape[2..].iter().product::<usize>();
        let olen = arg.len() / planes.max(1);
        // Zeroed plane by plane just before its scatter (in cache, on every thread), not in one
        // pass over the whole tensor first.
        let mut dx = Tensor::scratch(&shape);
        dx.data_mut()
            .par_chunks_mut(ilen)
            .enumerate()
            .for_each(|(p, dxp)| {
                dxp.fill(0.0);
                for (o, &i) in arg[p * olen..][..olen].iter().enumerate() {
                    dxp[i as usize] += dy.data()[p * olen + o];
                }
            });
        self.spare_arg = arg;
        Ok(Some(dx))
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        if input.len() != self.rank + 1 {
            return Err(NnError::shape(
                self.describe(),
                "input",
                input,
                format!("C × {} spatial dimensions", self.rank),
            ));
        }
        let (_, o3) = self.dims(&input[1..], input)?;
        let mut out = vec![input[0]];
        out.extend(&o3[3 - self.rank..]);
        Ok(out)
    }
}

/// Whether `v` replaces the current maximum `best`: larger, or a NaN over a number (NaN
/// propagates, as in PyTorch); ties keep the first.
#[inline(always)]
fn wins(v: f32, best: f32) -> bool {
    v > best || v.is_nan() && !best.is_nan()
}

/// `phases[p][u] = x[p + step·u]` for the phases `p < phases.len()` of a run `x` read with a
/// stride of `step` (2: core-blas's vectorised split, one pass over pairs).
fn deinterleave(kern: &Vector, x: &[f32], step: usize, phases: &mut [Vec<f32>]) -> Result<()> {
    for (p, ph) in phases.iter_mut().enumerate() {
        ph.resize(x.len().saturating_sub(p).div_ceil(step), 0.0);
    }
    if let ([even, odd], 2) = (&mut *phases, step) {
        kern.deinterleave2(x, even, odd)?;
    } else {
        for (p, ph) in phases.iter_mut().enumerate() {
            for (v, &xv) in ph.iter_mut().zip(x.iter().skip(p).step_by(step)) {
                *v = xv;
            }
        }
    }
    Ok(())
}

/// The windows of a pooling over one plane, dimensions right-aligned into 3.
struct Windows {
    input: [usize; 3],
    output: [usize; 3],
    kernel: [usize; 3],
    stride: [usize; 3],
    padding: [usize; 3],
}

impl Windows {
    /// Input positions `lo..hi` (clipped to the input) of output `o` along dimension `d`.
    fn range(&self, d: usize, o: usize) -> (usize, usize) {
        let start = (o * self.stride[d]) as isize - self.padding[d] as isize;
        let lo = start.max(0) as usize;
        let hi = ((start + self.kernel[d] as isize) as usize).min(self.input[d]);
        (lo, hi)
    }

    /// Maximum and index of its first occurrence for every window of one plane `x` (NaN wins,
    /// as in [`wins`]), each window scanned in row-major order. Per output row the window's
    /// input rows are listed once. Outputs whose windows lie inside the row are updated tap by
    /// tap across the whole row, so consecutive updates are independent (one output at a time,
    /// each compare-and-select waits for the previous one: 2.7× slower on ResNet's stem pool);
    /// the few outputs at the row's ends, whose windows are clipped, go one at a time.
    fn pool_plane(&self, kern: &Vector, x: &[f32], y: &mut [f32], arg: &mut [u32]) -> Result<()> {
        let [_, ih, iw] = self.input;
        let [od, oh, ow] = self.output;
        let (k2, s2, p2) = (self.kernel[2], self.stride[2], self.padding[2]);
        // Outputs first_in..end_in have all k2 taps inside the row.
        let first_in = p2.div_ceil(s2).min(ow);
        let end_in = if iw + p2 >= k2 {
            ((iw + p2 - k2) / s2 + 1).min(ow)
        } else {
            0
        }
        .max(first_in);
        let mut rows = Vec::with_capacity(self.kernel[0] * self.kernel[1]);
        // The phases of a window row's run (strided pools), and each tap's first input index.
        let mut phases = vec![Vec::new(); s2.min(k2)];
        let mut offsets = Vec::with_capacity(rows.capacity() * k2);
        let mut o = 0;
        for o0 in 0..od {
            let (lo0, hi0) = self.range(0, o0);
            for o1 in 0..oh {
                let (lo1, hi1) = self.range(1, o1);
                rows.clear();
                for i0 in lo0..hi0 {
                    rows.extend((lo1..hi1).map(|i1| (i0 * ih + i1) * iw));
                }
                let (yr, ar) = (&mut y[o..o + ow], &mut arg[o..o + ow]);
                // Clipped windows at both ends, one output at a time.
                for o2 in (0..first_in).chain(end_in..ow) {
                    let (lo2, hi2) = self.range(2, o2);
                    // Windows are never empty (padding ≤ half the kernel): start at the first.
                    let (mut best, mut at) = (x[rows[0] + lo2], rows[0] + lo2);
                    for &r in &rows {
                        for (i, &v) in (r + lo2..).zip(&x[r + lo2..r + hi2]) {
                            if wins(v, best) {
                                (best, at) = (v, i);
                            }
                        }
                    }
                    (yr[o2], ar[o2]) = (best, at as u32);
                }
                // The inner outputs, tap by tap in the same order as above: each window row's
                // run is split once into its `s2` phases (tap j of output q is phase j mod s2 at
                // q + j / s2), the winning tap per output is kept, then turned into an index.
                let n = end_in - first_in;
                if n > 0 {
                    let (yi, ai) = (&mut yr[first_in..end_in], &mut ar[first_in..end_in]);
                    let base = first_in * s2 - p2;
                    let span = (n - 1) * s2 + k2;
                    for (ri, &r) in rows.iter().enumerate() {
                        let run = &x[r + base..r + base + span];
                        if s2 > 1 {
                            deinterleave(kern, run, s2, &mut phases)?;
                        }
                        for j in 0..k2 {
                            let taps = if s2 == 1 {
                                &run[j..j + n]
                            } else {
                                &phases[j % s2][j / s2..j / s2 + n]
                            };
                            let t = ri * k2 + j;
                            if t == 0 {
                                yi.copy_from_slice(taps);
                                ai.fill(0);
                            } else {
                                // Vectorised (core-blas): the tap number is the same for the
                                // whole row, so no per-output index arithmetic is needed here.
                                kern.max_update(yi, ai, taps, t as u32)?;
                            }
                        }
                    }
                    offsets.clear();
                    offsets.extend(
                        rows.iter()
                            .flat_map(|&r| (0..k2).map(move |j| r + base + j)),
                    );
                    for (q, a) in ai.iter_mut().enumerate() {
                        *a = (offsets[*a as usize] + q * s2) as u32;
                    }
                }
                o += ow;
            }
        }
        Ok(())
    }
}

/// The shortest row of 2×2 windows [`pool_2x2`] runs through core-blas's vector kernels: their
/// vector bodies start at 8 values, and shorter rows cost more in calls than they save (VGG-16 at
/// 32², 2 threads, quiet 12:23:47 UTC: rows of 16 and 8 outputs 1.5x faster through the
/// kernels, rows of 4, 2 and 1 output 1.4-3.4x slower).
const VECTOR_ROW: usize = 8;

/// 2×2 windows with stride 2 over one plane `(base, w, (oh, ow))` of width `w`: `oh × ow` outputs
/// and their argmax, counted from `base` (the plane's offset in its volume). Per output row, the
/// two input rows are split into their even and odd columns (`phases`, resized here), then the
/// taps (top-left, top-right, bottom-left, bottom-right: the row-major order, so ties keep the
/// first as in [`wins`]) are compared across the row with core-blas's vector kernels.
fn pool_2x2(
    kern: &Vector,
    x: &[f32],
    (base, w, (oh, ow)): (usize, usize, (usize, usize)),
    y: &mut [f32],
    arg: &mut [u32],
    phases: &mut Vec<f32>,
) -> Result<()> {
    if ow < VECTOR_ROW {
        pool_2x2_short(x, (base, w, (oh, ow)), y, arg);
        return Ok(());
    }
    phases.resize(4 * ow, 0.0);
    let (te, rest) = phases.split_at_mut(ow);
    let (to, rest) = rest.split_at_mut(ow);
    let (be, bo) = rest.split_at_mut(ow);
    for r in 0..oh {
        let (top, bottom) = (2 * r * w, (2 * r + 1) * w);
        kern.deinterleave2(&x[top..top + 2 * ow], te, to)?;
        kern.deinterleave2(&x[bottom..bottom + 2 * ow], be, bo)?;
        let (yr, ar) = (&mut y[r * ow..][..ow], &mut arg[r * ow..][..ow]);
        yr.copy_from_slice(te);
        ar.fill(0);
        for (t, v) in [(1, &*to), (2, &*be), (3, &*bo)] {
            kern.max_update(yr, ar, v, t)?;
        }
        // Tap t of output c: column 2c + t % 2 of the top (t < 2) or bottom row.
        for (c, a) in ar.iter_mut().enumerate() {
            let t = *a as usize;
            *a = (base + top + 2 * c + (t & 1) + (t >> 1) * w) as u32;
        }
    }
    Ok(())
}

/// [`pool_2x2`] on rows of fewer than [`VECTOR_ROW`] outputs: window by window.
fn pool_2x2_short(
    x: &[f32],
    (base, w, (oh, ow)): (usize, usize, (usize, usize)),
    y: &mut [f32],
    arg: &mut [u32],
) {
    for r in 0..oh {
        let (top, bottom) = (2 * r * w, (2 * r + 1) * w);
        let (t, b) = (&x[top..top + 2 * ow], &x[bottom..bottom + 2 * ow]);
        let (yr, ar) = (&mut y[r * ow..][..ow], &mut arg[r * ow..][..ow]);
        for c in 0..ow {
            let (mut best, mut at) = (t[2 * c], top + 2 * c);
            for (v, i) in [
                (t[2 * c + 1], top + 2 * c + 1),
                (b[2 * c], bottom + 2 * c),
                (b[2 * c + 1], bottom + 2 * c + 1),
            ] {
                if wins(v, best) {
                    best = v;
                    at = i;
                }
            }
            yr[c] = best;
            ar[c] = (base + at) as u32;
        }
    }
}

/// Average pooling to a fixed output size, PyTorch's `AdaptiveAvgPool{1,2,3}d`: along a spatial
/// dimension of input size `n` and output size `m`, output `i` averages inputs
/// `⌊i·n/m⌋ .. ⌈(i+1)·n/m⌉` (windows overlap when `m` does not divide `n`); over several
/// dimensions, the product of those ranges. torchvision's VGG ends its features with one to 7×7.
#[derive(Debug, Clone)]
pub struct AdaptiveAvgPool {
    output: Vec<usize>,
    /// The input shape, kept from a training forward.
    saved: Option<Vec<usize>>,
}

/// The windows `[start, end)` of one dimension.
fn adaptive_windows(n: usize, m: usize) -> Vec<(usize, usize)> {
    (0..m)
        .map(|i| (i * n / m, ((i + 1) * n).div_ceil(m)))
        .collect()
}

impl AdaptiveAvgPool {
    /// Pooling to the spatial size `output` (1 to 3 dimensions, each at least 1).
    ///
    /// Errors: [`NnError::Config`] for an empty or longer `output` or a zero size.
    pub fn new(output: &[usize]) -> Result<Self> {
        if !(1..=3).contains(&output.len()) || output.contains(&0) {
            return Err(NnError::config(
                "output",
                format!("{output:?} (1 to 3 sizes, each at least 1)"),
            ));
        }
        Ok(AdaptiveAvgPool {
            output: output.to_vec(),
            saved: None,
        })
    }

    /// Checks `N × C × spatial` against the output rank; returns the per-dimension windows.
    fn windows(&self, what: &'static str, shape: &[usize]) -> Result<Vec<Vec<(usize, usize)>>> {
        let r = self.output.len();
        if shape.len() != r + 2 || shape[2..].contains(&0) {
            return Err(NnError::shape(
                self.describe(),
                what,
                shape,
                format!("N × C × {r} non-empty spatial dimensions"),
            ));
        }
        Ok(shape[2..]
            .iter()
            .zip(&self.output)
            .map(|(&n, &m)| adaptive_windows(n, m))
            .collect())
    }

    /// Calls `f(output index, input index)` for every input position of every output window of
    /// one plane, plus the window sizes.
    fn for_each_window(
        input: &[usize],
        windows: &[Vec<(usize, usize)>],
        mut f: impl FnMut(usize, usize, usize),
    ) {
        // Pad to 3 dimensions with a size-1 front.
        let pad = 3 - input.len();
        let dim = |d: usize| if d < pad { 1 } else { input[d - pad] };
        let win = |d: usize, i: usize| if d < pad { (0, 1) } else { windows[d - pad][i] };
        let out = |d: usize| if d < pad { 1 } else { windows[d - pad].len() };
        let mut o = 0;
        for a in 0..out(0) {
            let (a0, a1) = win(0, a);
            for b in 0..out(1) {
                let (b0, b1) = win(1, b);
                for c in 0..out(2) {
                    let (c0, c1) = win(2, c);
                    let count = (a1 - a0) * (b1 - b0) * (c1 - c0);
                    for i in a0..a1 {
                        for j in b0..b1 {
                            let row = (i * dim(1) + j) * dim(2);
                            for k in c0..c1 {
                                f(o, row + k, count);
                            }
                        }
                    }
                    o += 1;
                }
            }
        }
    }
}

impl Layer for AdaptiveAvgPool {
    fn describe(&self) -> String {
        let dims: Vec<String> = self.output.iter().map(|d| d.to_string()).collect();
        format!("AdaptiveAvgPool{}d({})", self.output.len(), dims.join("×"))
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        let windows = self.windows("x", &shape)?;
        let (plane, out_plane) = (
            shape[2..].iter().product::<usize>(),
            self.output.iter().product::<usize>(),
        );
        let mut yshape = shape[..2].to_vec();
        yshape.extend(&self.output);
        let mut y = Tensor::zeros(&yshape);
        for (xp, yp) in x
            .data()
            .chunks_exact(plane)
            .zip(y.data_mut().chunks_exact_mut(out_plane))
        {
            Self::for_each_window(&shape[2..], &windows, |o, i, count| {
                yp[o] += xp[i] / count as f32;
            });
        }
        if train {
            self.saved = Some(shape);
        }
        Ok(y)
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let shape = self.saved.take().ok_or_else(|| NnError::no_forward(self))?;
        let mut want = shape[..2].to_vec();
        want.extend(&self.output);
        NnError::expect_shape(|| self.describe(), "dy", dy.shape(), &want)?;
        if !need_dx {
            return Ok(None);
        }
        let windows = self.windows("x", &shape)?;
        let plane: usize = shape[2..].iter().product();
        let out_plane: usize = self.output.iter().product();
        let mut dx = Tensor::zeros(&shape);
        for (dxp, dyp) in dx
            .data_mut()
            .chunks_exact_mut(plane)
            .zip(dy.data().chunks_exact(out_plane))
        {
            Self::for_each_window(&shape[2..], &windows, |o, i, count| {
                dxp[i] += dyp[o] / count as f32;
            });
        }
        Ok(Some(dx))
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        let mut shape = vec![1];
        shape.extend(input);
        self.windows("input", &shape)?;
        let mut out = vec![input[0]];
        out.extend(&self.output);
        Ok(out)
    }
}
