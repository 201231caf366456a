//! Spatial parallelism (Dryden et al., "Improving Strong-Scaling of CNN Training by Exploiting
//! Finer-Grained Parallelism", 2019; the `[∘, *, ∘, ∘]` distributions of "Channel and Filter
//! Parallelism for Large-Scale CNN Training", section 2): the first spatial axis of every
//! activation (height in 2D, depth in 3D, the only one in 1D) is split in balanced blocks over
//! the ranks of a communicator; a convolution or max-pool first fetches the rows of its window
//! that neighbouring ranks hold (the halo exchange), computes its own block of output rows, and
//! in backward returns the halo's gradient to the ranks that own those rows. Weights are
//! replicated; their gradients are summed over the communicator.
//!
//! Every rank holds `rows(len, parts, part)` of an axis of length `len`: the balanced block
//! distribution, blocks differing by at most one row.

use std::ops::Range;

use nn::{
    BatchNorm, Conv, ConvConfig, Layer, MaxPool, Parameter, Relu, Residual, Sequential, Tensor,
};

use crate::channel_conv::check_comm;
use crate::comm::Communicator;
use crate::error::{DistError, Result};
use crate::layers::{Bound, CommHandle, DistLayer, check_block};
use crate::runtime::World;
use crate::sync_bn::SyncBatchNorm;

/// The rows of an axis of length `len` that block `part` of `parts` holds (balanced: the
/// blocks differ by at most one row).
pub fn rows(len: usize, parts: usize, part: usize) -> Range<usize> {
    part * len / parts..(part + 1) * len / parts
}

/// A window along the split axis: kernel, stride and zero (or −∞) padding on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    kernel: usize,
    stride: usize,
    padding: usize,
}

/// Who needs which input rows of one windowed layer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Halo {
    parts: usize,
    part: usize,
    in_len: usize,
    out_len: usize,
    window: Window,
}

impl Halo {
    fn new(in_len: usize, window: Window, parts: usize, part: usize) -> Result<Self> {
        check_block(parts, part)?;
        let Window {
            kernel,
            stride,
            padding,
        } = window;
        if kernel == 0 || stride == 0 || in_len + 2 * padding < kernel {
            return Err(DistError::Training(format!(
                "a window of {kernel} (stride {stride}, padding {padding}) does not fit an axis \
                 of {in_len}"
            )));
        }
        let out_len = (in_len + 2 * padding - kernel) / stride + 1;
        if in_len < parts || out_len < parts {
            return Err(DistError::Training(format!(
                "an axis of {in_len} → {out_len} rows cannot be split in {parts} non-empty blocks"
            )));
        }
        Ok(Halo {
            parts,
            part,
            in_len,
            out_len,
            window,
        })
    }

    /// The input rows (global, padding rows outside `0..in_len` included) block `q`'s output
    /// rows read.
    fn needs(&self, q: usize) -> Range<isize> {
        let out = rows(self.out_len, self.parts, q);
        let Window {
            kernel,
            stride,
            padding,
        } = self.window;
        let start = (out.start * stride) as isize - padding as isize;
        let end = ((out.end - 1) * stride + kernel) as isize - padding as isize;
        start..end
    }

    fn owns(&self, q: usize) -> Range<usize> {
        rows(self.in_len, self.parts, q)
    }

    /// `(peer, rows)`: the rows this rank receives in forward (and returns gradients for).
    fn incoming(&self) -> Vec<(usize, Range<usize>)> {
        let need = self.needs(self.part);
        (0..self.parts)
            .filter(|&q| q != self.part)
            .map(|q| (q, overlap(&need, &self.owns(q))))
            .filter(|(_, r)| !r.is_empty())
            .collect()
    }

    /// `(peer, rows)`: the rows this rank sends in forward (and gets gradients back for).
    fn outgoing(&self) -> Vec<(usize, Range<usize>)> {
        let own = self.owns(self.part);
        (0..self.parts)
            .filter(|&q| q != self.part)
            .map(|q| (q, overlap(&self.needs(q), &own)))
            .filter(|(_, r)| !r.is_empty())
            .collect()
    }
}

/// `a ∩ b` as rows of `b`'s axis.
fn overlap(a: &Range<isize>, b: &Range<usize>) -> Range<usize> {
    let start = a.start.max(b.start as isize).max(0) as usize;
    let end = (a.end.max(0) as usize).min(b.end);
    start..end.max(start)
}

/// A tensor `N × C × rows × inner` seen as `outer` planes of `rows` rows of `inner` values.
#[derive(Debug, Clone, Copy)]
struct Planes {
    outer: usize,
    rows: usize,
    inner: usize,
}

impl Planes {
    fn of(what: &str, shape: &[usize]) -> Result<Self> {
        if shape.len() < 3 {
            return Err(DistError::Training(format!(
                "{what} has shape {shape:?}, expected N × C × spatial (1 to 3 dimensions)"
            )));
        }
        Ok(Planes {
            outer: shape[0] * shape[1],
            rows: shape[2],
            inner: shape[3..].iter().product(),
        })
    }

    /// Rows `r` (local indices) of every plane, packed.
    fn take(&self, data: &[f32], r: Range<usize>) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.outer * r.len() * self.inner);
        for plane in data.chunks_exact(self.rows * self.inner) {
            out.extend_from_slice(&plane[r.start * self.inner..r.end * self.inner]);
        }
        out
    }

    /// Writes (or adds, with `add`) `packed` (`outer × n × inner`) into rows `at..at + n`.
    fn put(&self, data: &mut [f32], at: usize, packed: &[f32], add: bool) {
        let n = packed.len() / (self.outer * self.inner).max(1);
        let src = Planes { rows: n, ..*self };
        copy_rows((src, packed, 0), (*self, data, at), n, add);
    }
}

/// Copies (or adds, with `add`) rows `from..from + n` of every plane of `src` (laid out as
/// `sp`) into rows `to..to + n` of the same plane of `dst` (laid out as `dp`), with no
/// intermediate buffer. Both layouts have the same planes and row length.
fn copy_rows(
    (sp, src, from): (Planes, &[f32], usize),
    (dp, dst, to): (Planes, &mut [f32], usize),
    n: usize,
    add: bool,
) {
    let len = n * sp.inner;
    if len == 0 {
        return;
    }
    for (s, d) in src
        .chunks_exact(sp.rows * sp.inner)
        .zip(dst.chunks_exact_mut(dp.rows * dp.inner))
    {
        let (s, d) = (&s[from * sp.inner..][..len], &mut d[to * dp.inner..][..len]);
        if add {
            d.iter_mut().zip(s).for_each(|(d, s)| *d += s);
        } else {
            d.copy_from_slice(s);
        }
    }
}

/// Which layer a [`SpatialParallel`] runs, for its description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Conv,
    MaxPool,
}

/// A convolution or max-pool over a tensor whose first spatial axis is split in blocks over the
/// ranks of a communicator (spatial parallelism).
///
/// Forward: the rank receives the rows of its window that other ranks hold (a halo of
/// `kernel − stride` rows or so from each neighbour; nothing for a 2×2 pool on even blocks),
/// assembles its slab (the padding rows at the ends of the axis are zeros for a convolution,
/// −∞ for a max-pool), and runs the layer on it with no padding along the split axis, which
/// gives exactly its block of output rows. Backward: the slab's gradient, whose halo rows are
/// sent back and added to the owners' `dx`; the parameters' gradients are summed over the
/// communicator (each rank's covers its output rows only). Parameters are replicated: every rank
/// holds the whole layer, under the layer's own names, so a checkpoint of any rank is the whole
/// model's.
pub struct SpatialParallel {
    local: Box<dyn Layer>,
    kind: Kind,
    halo: Halo,
    /// The layer's description as a whole.
    whole: String,
    /// `x`'s shape, known from the forward.
    saved: Option<Vec<usize>>,
}

impl SpatialParallel {
    /// Block `part` of `parts` of the convolution `conv`, for inputs whose first spatial axis
    /// has `in_len` rows: a copy of `conv` (weights, bias, algorithm) without padding along that
    /// axis.
    ///
    /// Errors: [`DistError::Training`] when `part >= parts` or either the input or the output
    /// axis has fewer rows than `parts`; [`DistError::Nn`] when the configuration is invalid.
    pub fn conv(conv: &Conv, in_len: usize, parts: usize, part: usize) -> Result<Self> {
        let cfg = conv.config();
        let per_dim = |v: &[usize]| {
            if v.len() == 1 {
                vec![v[0]; cfg.rank]
            } else {
                v.to_vec()
            }
        };
        let (kernel, stride, mut padding) = (
            per_dim(&cfg.kernel),
            per_dim(&cfg.stride),
            per_dim(&cfg.padding),
        );
        let window = Window {
            kernel: kernel[0],
            stride: stride[0],
            padding: padding[0],
        };
        let halo = Halo::new(in_len, window, parts, part)?;
        padding[0] = 0;
        let local_cfg = ConvConfig {
            padding,
            ..cfg.clone()
        };
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(0);
        let mut local = Conv::new(local_cfg, conv.algorithm(), &mut rng)?;
        for ((_, dst), (_, src)) in local.params_mut().into_iter().zip(conv.params()) {
            dst.value = src.value.clone();
        }
        Ok(SpatialParallel {
            local: Box::new(local),
            kind: Kind::Conv,
            halo,
            whole: conv.describe(),
            saved: None,
        })
    }

    /// Block `part` of `parts` of the max-pool `pool`, for inputs whose first spatial axis has
    /// `in_len` rows.
    ///
    /// Errors: as [`SpatialParallel::conv`].
    pub fn max_pool(pool: &MaxPool, in_len: usize, parts: usize, part: usize) -> Result<Self> {
        let window = Window {
            kernel: pool.kernel()[0],
            stride: pool.stride()[0],
            padding: pool.padding()[0],
        };
        let halo = Halo::new(in_len, window, parts, part)?;
        let mut padding = pool.padding().to_vec();
        padding[0] = 0;
        let local = MaxPool::nd(pool.kernel(), pool.stride(), &padding)?;
        Ok(SpatialParallel {
            local: Box::new(local),
            kind: Kind::MaxPool,
            halo,
            whole: pool.describe(),
            saved: None,
        })
    }

    /// `(parts, part)`.
    pub fn block(&self) -> (usize, usize) {
        (self.halo.parts, self.halo.part)
    }

    /// The rows of the split axis this rank holds of the input and of the output.
    pub fn rows(&self) -> (Range<usize>, Range<usize>) {
        let (p, q) = self.block();
        (rows(self.halo.in_len, p, q), rows(self.halo.out_len, p, q))
    }

    /// The layer this rank runs on its slab.
    pub fn local(&self) -> &dyn Layer {
        self.local.as_ref()
    }

    fn fill(&self) -> f32 {
        match self.kind {
            Kind::Conv => 0.0,
            Kind::MaxPool => f32::NEG_INFINITY,
        }
    }

    /// The shape of this rank's slab for its block `x` of shape `shape`.
    fn slab_shape(&self, shape: &[usize]) -> Result<Vec<usize>> {
        let own = self.halo.owns(self.halo.part);
        if shape.len() < 3 || shape[2] != own.len() {
            return Err(DistError::Training(format!(
                "{}: x has shape {shape:?}, this block holds rows {own:?} of {} along the first \
                 spatial axis",
                self.describe(),
                self.halo.in_len
            )));
        }
        let need = self.halo.needs(self.halo.part);
        let mut slab = shape.to_vec();
        slab[2] = need.len();
        Ok(slab)
    }
}

impl DistLayer for SpatialParallel {
    fn describe(&self) -> String {
        let (parts, part) = self.block();
        format!(
            "SpatialParallel({}, output rows {:?} of {}, block {} of {parts})",
            self.whole,
            self.rows().1,
            self.halo.out_len,
            part + 1
        )
    }

    fn forward(&mut self, comm: &World, x: Tensor, train: bool) -> Result<Tensor> {
        check_comm(comm, self.halo.parts, self.halo.part)?;
        let shape = x.shape().to_vec();
        let slab_shape = self.slab_shape(&shape)?;
        let own = self.halo.owns(self.halo.part);
        let need = self.halo.needs(self.halo.part);
        let xp = Planes::of("x", &shape)?;
        let sends: Vec<(usize, Vec<f32>)> = self
            .halo
            .outgoing()
            .into_iter()
            .map(|(q, r)| (q, xp.take(x.data(), r.start - own.start..r.end - own.start)))
            .collect();
        let incoming = self.halo.incoming();
        let mut recv: Vec<(usize, Vec<f32>)> = incoming
            .iter()
            .map(|(q, r)| (*q, vec![0.0; xp.outer * r.len() * xp.inner]))
            .collect();
        exchange(comm, &sends, &mut recv)?;
        if incoming.is_empty() && need.start == own.start as isize && need.end == own.end as isize {
            // No halo and no padding rows (e.g. a 2×2 pool on even blocks): x is the slab.
            let y = self.local.forward(x, train)?;
            if train {
                self.saved = Some(shape);
            }
            return Ok(y);
        }
        let sp = Planes::of("the slab", &slab_shape)?;
        let mut slab = vec![self.fill(); sp.outer * sp.rows * sp.inner];
        let at = |row: usize| (row as isize - need.start) as usize;
        let mine = overlap(&need, &own);
        copy_rows(
            (xp, x.data(), mine.start - own.start),
            (sp, &mut slab, at(mine.start)),
            mine.len(),
            false,
        );
        drop(x);
        for ((_, r), (_, data)) in incoming.iter().zip(&recv) {
            sp.put(&mut slab, at(r.start), data, false);
        }
        let y = self.local.forward(Tensor::new(&slab_shape, slab)?, train)?;
        if train {
            self.saved = Some(shape);
        }
        Ok(y)
    }

    fn backward(&mut self, comm: &World, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        check_comm(comm, self.halo.parts, self.halo.part)?;
        let shape = self.saved.take().ok_or_else(|| {
            DistError::Training(format!("{}: backward before forward", self.describe()))
        })?;
        let dslab = self.local.backward(dy, need_dx)?;
        // The parameters' gradients cover this rank's output rows: sum them over the blocks.
        let mut params = self.local.params_mut();
        if !params.is_empty() {
            let mut flat: Vec<f32> = params
                .iter()
                .flat_map(|(_, p)| p.grad.data().iter().copied())
                .collect();
            comm.allreduce_sum(&mut flat)?;
            let mut at = 0;
            for (_, p) in params.iter_mut() {
                let g = p.grad.data_mut();
                g.copy_from_slice(&flat[at..at + g.len()]);
                at += g.len();
            }
        }
        // need_dx is the same on every rank (it is the layer's place in the model), so skipping
        // the exchange without it keeps the ranks in step.
        let Some(dslab) = dslab else {
            return Ok(None);
        };
        let own = self.halo.owns(self.halo.part);
        let need = self.halo.needs(self.halo.part);
        let incoming = self.halo.incoming();
        let outgoing = self.halo.outgoing();
        if incoming.is_empty()
            && outgoing.is_empty()
            && need.start == own.start as isize
            && need.end == own.end as isize
        {
            return Ok(Some(dslab));
        }
        let sp = Planes::of("the slab's gradient", dslab.shape())?;
        let at = |row: usize| (row as isize - need.start) as usize;
        let sends: Vec<(usize, Vec<f32>)> = incoming
            .into_iter()
            .map(|(q, r)| (q, sp.take(dslab.data(), at(r.start)..at(r.end))))
            .collect();
        let xp = Planes::of("dx", &shape)?;
        let mut recv: Vec<(usize, Vec<f32>)> = outgoing
            .iter()
            .map(|(q, r)| (*q, vec![0.0; xp.outer * r.len() * xp.inner]))
            .collect();
        exchange(comm, &sends, &mut recv)?;
        drop(sends);
        let mut dx = Tensor::zeros(&shape);
        let mine = overlap(&need, &own);
        copy_rows(
            (sp, dslab.data(), at(mine.start)),
            (xp, dx.data_mut(), mine.start - own.start),
            mine.len(),
            false,
        );
        drop(dslab);
        for ((_, r), (_, data)) in outgoing.iter().zip(&recv) {
            xp.put(dx.data_mut(), r.start - own.start, data, true);
        }
        Ok(Some(dx))
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        self.local.params()
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        self.local.params_mut()
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        // `input` is a sample (no batch axis): the split axis is its second entry.
        let mut batch = vec![1];
        batch.extend_from_slice(input);
        let slab = self.slab_shape(&batch)?;
        Ok(self.local.output_shape(&slab[1..])?)
    }
}

/// [`Communicator::exchange`] of owned buffers.
fn exchange(
    comm: &World,
    sends: &[(usize, Vec<f32>)],
    recv: &mut [(usize, Vec<f32>)],
) -> Result<()> {
    let sends: Vec<(usize, &[f32])> = sends.iter().map(|(q, d)| (*q, d.as_slice())).collect();
    let mut recvs: Vec<(usize, &mut [f32])> = recv
        .iter_mut()
        .map(|(q, d)| (*q, d.as_mut_slice()))
        .collect();
    comm.exchange(&sends, &mut recvs)
}

/// From a tensor every rank holds whole to this rank's block of rows of the first spatial axis
/// (of length `len`): local in forward; backward gathers the blocks of `dy` into the whole `dx`
/// on every rank.
#[derive(Debug, Clone)]
pub struct SpatialScatter {
    len: usize,
    parts: usize,
    part: usize,
}

/// From this rank's block of rows to the whole tensor on every rank: forward gathers; backward
/// keeps this rank's rows of `dy` (every rank holds the same whole `dy`).
#[derive(Debug, Clone)]
pub struct SpatialGather {
    len: usize,
    parts: usize,
    part: usize,
}

impl SpatialScatter {
    /// Block `part` of `parts` of an axis of `len` rows.
    ///
    /// Errors: [`DistError::Training`] when `part >= parts` or `len < parts`.
    pub fn new(len: usize, parts: usize, part: usize) -> Result<Self> {
        check_split(len, parts, part)?;
        Ok(SpatialScatter { len, parts, part })
    }
}

impl SpatialGather {
    /// Block `part` of `parts` of an axis of `len` rows.
    ///
    /// Errors: [`DistError::Training`] when `part >= parts` or `len < parts`.
    pub fn new(len: usize, parts: usize, part: usize) -> Result<Self> {
        check_split(len, parts, part)?;
        Ok(SpatialGather { len, parts, part })
    }
}

fn check_split(len: usize, parts: usize, part: usize) -> Result<()> {
    check_block(parts, part)?;
    if len < parts {
        return Err(DistError::Training(format!(
            "an axis of {len} rows cannot be split in {parts} non-empty blocks"
        )));
    }
    Ok(())
}

/// Rows `rows(len, parts, part)` of the whole `t`.
fn rows_of(t: &Tensor, len: usize, parts: usize, part: usize, what: &str) -> Result<Tensor> {
    let p = Planes::of(what, t.shape())?;
    if p.rows != len {
        return Err(DistError::Training(format!(
            "{what} has shape {:?}, expected {len} rows along the first spatial axis",
            t.shape()
        )));
    }
    let r = rows(len, parts, part);
    let mut shape = t.shape().to_vec();
    shape[2] = r.len();
    Ok(Tensor::new(&shape, p.take(t.data(), r))?)
}

/// Every rank's block of rows of `t` assembled into the whole tensor (`len` rows). Blocks are
/// padded to the largest for one allgather.
fn gather_rows(comm: &World, t: &Tensor, len: usize, parts: usize, part: usize) -> Result<Tensor> {
    check_comm(comm, parts, part)?;
    let p = Planes::of("the block", t.shape())?;
    let mine = rows(len, parts, part);
    if p.rows != mine.len() {
        return Err(DistError::Training(format!(
            "the block has shape {:?}, expected rows {mine:?} of {len}",
            t.shape()
        )));
    }
    let max = len.div_ceil(parts);
    let block = p.outer * max * p.inner;
    let mut send = vec![0.0f32; block];
    let padded = Planes { rows: max, ..p };
    copy_rows((p, t.data(), 0), (padded, &mut send, 0), p.rows, false);
    let mut all = vec![0.0f32; block * parts];
    comm.allgather(&send, &mut all)?;
    let mut shape = t.shape().to_vec();
    shape[2] = len;
    let whole = Planes { rows: len, ..p };
    let mut out = Tensor::zeros(&shape);
    // An empty batch (a rank without samples) has empty blocks: nothing to place.
    for (q, b) in all.chunks_exact(block.max(1)).enumerate() {
        let r = rows(len, parts, q);
        copy_rows(
            (padded, b, 0),
            (whole, out.data_mut(), r.start),
            r.len(),
            false,
        );
    }
    Ok(out)
}

fn split_shape(
    input: &[usize],
    len: usize,
    parts: usize,
    part: usize,
    to_block: bool,
) -> Result<Vec<usize>> {
    let from = if to_block {
        len
    } else {
        rows(len, parts, part).len()
    };
    match input.get(1) {
        Some(&r) if r == from => {
            let mut out = input.to_vec();
            out[1] = if to_block {
                rows(len, parts, part).len()
            } else {
                len
            };
            Ok(out)
        }
        _ => Err(DistError::Training(format!(
            "input sample {input:?}: expected {from} rows along the first spatial axis"
        ))),
    }
}

impl DistLayer for SpatialScatter {
    fn describe(&self) -> String {
        format!(
            "SpatialScatter(rows {:?} of {}, block {} of {})",
            rows(self.len, self.parts, self.part),
            self.len,
            self.part + 1,
            self.parts
        )
    }

    fn forward(&mut self, _comm: &World, x: Tensor, _train: bool) -> Result<Tensor> {
        rows_of(&x, self.len, self.parts, self.part, "x")
    }

    fn backward(&mut self, comm: &World, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        // need_dx is the same on every rank, so all or none take part in the gather.
        if !need_dx {
            return Ok(None);
        }
        Ok(Some(gather_rows(
            comm, &dy, self.len, self.parts, self.part,
        )?))
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        Vec::new()
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        Vec::new()
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        split_shape(input, self.len, self.parts, self.part, true)
    }
}

impl DistLayer for SpatialGather {
    fn describe(&self) -> String {
        format!(
            "SpatialGather(rows {:?} of {}, block {} of {})",
            rows(self.len, self.parts, self.part),
            self.len,
            self.part + 1,
            self.parts
        )
    }

    fn forward(&mut self, comm: &World, x: Tensor, _train: bool) -> Result<Tensor> {
        gather_rows(comm, &x, self.len, self.parts, self.part)
    }

    fn backward(&mut self, _comm: &World, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        need_dx
            .then(|| rows_of(&dy, self.len, self.parts, self.part, "dy"))
            .transpose()
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        Vec::new()
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        Vec::new()
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        split_shape(input, self.len, self.parts, self.part, false)
    }
}

/// How [`spatial_parallel`] distributed a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpatialPlan {
    /// Names (dotted paths) of the convolutions and max-pools run on blocks of rows.
    pub split: Vec<String>,
    /// Names of the convolutions and max-pools left whole (an axis shorter than the rank
    /// count, or inside a layer that needs the whole tensor).
    pub whole: Vec<String>,
}

/// What the transform needs to know: the blocks, and the communicator the split layers use.
struct Splitter {
    comm: CommHandle,
    parts: usize,
    part: usize,
}

impl Splitter {
    /// Whether `layer` can run on blocks of rows of an input of whole sample shape `shape`
    /// (`C × rows × …`): convolutions and max-pools whose input and output have at least
    /// `parts` rows, batch norm and ReLU, and residual blocks and nested [`Sequential`]s made
    /// only of those.
    fn can_split(&self, layer: &dyn Layer, shape: &[usize]) -> bool {
        let rows_ok = |s: &[usize]| s.len() >= 2 && s[1] >= self.parts;
        if !rows_ok(shape) {
            return false;
        }
        if layer.downcast_ref::<Conv>().is_some() || layer.downcast_ref::<MaxPool>().is_some() {
            return layer.output_shape(shape).is_ok_and(|o| rows_ok(&o));
        }
        if layer.downcast_ref::<BatchNorm>().is_some() || layer.downcast_ref::<Relu>().is_some() {
            return true;
        }
        let chain = |s: &Sequential| {
            let mut shape = shape.to_vec();
            s.layers().iter().all(|l| {
                let ok = self.can_split(l.as_ref(), &shape);
                shape = l.output_shape(&shape).unwrap_or_default();
                ok
            })
        };
        if let Some(seq) = layer.downcast_ref::<Sequential>() {
            return chain(seq);
        }
        if let Some(block) = layer.downcast_ref::<Residual>() {
            return chain(block.body()) && block.shortcut().is_none_or(|(_, s)| chain(s));
        }
        false
    }

    /// `layer` (for which [`Splitter::can_split`] holds) as its block-of-rows form; `path` is
    /// its dotted name, for the plan.
    fn split(
        &self,
        path: &str,
        layer: Box<dyn Layer>,
        shape: &[usize],
        plan: &mut SpatialPlan,
    ) -> Result<Box<dyn Layer>> {
        let (comm, parts, part) = (self.comm, self.parts, self.part);
        if let Some(conv) = layer.downcast_ref::<Conv>() {
            plan.split.push(path.to_string());
            let l = SpatialParallel::conv(conv, shape[1], parts, part)?;
            return Ok(Box::new(Bound::new(l, comm)));
        }
        if let Some(pool) = layer.downcast_ref::<MaxPool>() {
            plan.split.push(path.to_string());
            let l = SpatialParallel::max_pool(pool, shape[1], parts, part)?;
            return Ok(Box::new(Bound::new(l, comm)));
        }
        if layer.downcast_ref::<Relu>().is_some() {
            return Ok(layer);
        }
        let any: Box<dyn std::any::Any> = layer.into_any();
        let any = match any.downcast::<BatchNorm>() {
            Ok(bn) => return Ok(Box::new(SyncBatchNorm::spatial(*bn, comm))),
            Err(other) => other,
        };
        let any = match any.downcast::<Sequential>() {
            Ok(seq) => return Ok(Box::new(self.split_seq(path, *seq, shape, plan)?)),
            Err(other) => other,
        };
        match any.downcast::<Residual>() {
            Ok(block) => Ok(Box::new(block.try_map(|name, s| {
                let p = name.map_or_else(|| path.to_string(), |n| join(path, n));
                self.split_seq(&p, s, shape, plan)
            })?)),
            Err(_) => Err(DistError::Training(format!(
                "{path}: no block-of-rows form for this layer"
            ))),
        }
    }

    /// A nested block (no input shape) with every layer split.
    fn split_seq(
        &self,
        path: &str,
        seq: Sequential,
        shape: &[usize],
        plan: &mut SpatialPlan,
    ) -> Result<Sequential> {
        let mut out = Sequential::block();
        let mut shape = shape.to_vec();
        for (name, layer) in seq.into_layers() {
            let next = layer.output_shape(&shape)?;
            let p = join(path, &name);
            out = out.push_boxed(&name, self.split(&p, layer, &shape, plan)?)?;
            shape = next;
        }
        Ok(out)
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// The convolutions and max-pools of `layer` (dotted names), for the plan's `whole` list.
fn windowed(path: &str, layer: &dyn Layer, out: &mut Vec<String>) {
    if layer.downcast_ref::<Conv>().is_some() || layer.downcast_ref::<MaxPool>().is_some() {
        out.push(path.to_string());
    } else if let Some(seq) = layer.downcast_ref::<Sequential>() {
        for (name, l) in seq.names().iter().zip(seq.layers()) {
            windowed(&join(path, name), l.as_ref(), out);
        }
    } else if let Some(block) = layer.downcast_ref::<Residual>() {
        windowed(path, block.body(), out);
        if let Some((name, s)) = block.shortcut() {
            windowed(&join(path, name), s, out);
        }
    }
}

/// `model` as block `part` of `parts` of a spatially parallel model over the communicator of
/// `comm` (a [`crate::ProcessorGrid`] row), every rank of it passing the same model (same seed)
/// and, in training, the same samples.
///
/// The layers that can run on blocks of rows of the first spatial axis do
/// ([`SpatialParallel`] convolutions and max-pools whose input and output have at least `parts`
/// rows, batch norm (a [`SyncBatchNorm`] over the row), ReLU, and residual blocks and nested sequences made only of
/// those, so LeNet, VGG, C3D and the ResNets' stems and stages), with a [`SpatialScatter`]
/// before each run and a [`SpatialGather`] after it. Every other layer (global and adaptive
/// pooling, the classifier) runs whole and identically on every rank. Parameters keep their
/// names and are whole on every rank. The activations of the split layers, the bulk of a CNN's
/// memory at high resolution, are divided among the ranks.
///
/// Errors: [`DistError::Training`] when `part >= parts` or `model` is a block without an input
/// shape; [`DistError::Nn`] when the rebuilt model does not accept the shapes.
pub fn spatial_parallel(
    model: Sequential,
    comm: CommHandle,
    parts: usize,
    part: usize,
) -> Result<(Sequential, SpatialPlan)> {
    check_block(parts, part)?;
    let input = model.input_shape().to_vec();
    if input.len() < 2 {
        return Err(DistError::Training(
            "spatial_parallel takes a model with an input shape C × spatial, not a block".into(),
        ));
    }
    let splitter = Splitter { comm, parts, part };
    let mut out = Sequential::new(&input);
    let mut plan = SpatialPlan::default();
    // The whole sample shape before the current layer, and whether it is split.
    let mut shape = input;
    let mut split = false;
    for (name, layer) in model.into_layers() {
        let next = layer.output_shape(&shape)?;
        let elementwise =
            layer.downcast_ref::<Relu>().is_some() || layer.downcast_ref::<BatchNorm>().is_some();
        // A run starts at a layer with a window; ReLU and batch norm only continue one.
        let splittable =
            parts > 1 && (split || !elementwise) && splitter.can_split(layer.as_ref(), &shape);
        if splittable {
            if !split {
                let scatter = SpatialScatter::new(shape[1], parts, part)?;
                out = out.push_boxed(
                    &format!("{name}_scatter"),
                    Box::new(Bound::new(scatter, comm)),
                )?;
                split = true;
            }
            out = out.push_boxed(&name, splitter.split(&name, layer, &shape, &mut plan)?)?;
        } else {
            if split {
                let gather = SpatialGather::new(shape[1], parts, part)?;
                out = out.push_boxed(
                    &format!("{name}_gather"),
                    Box::new(Bound::new(gather, comm)),
                )?;
                split = false;
            }
            windowed(&name, layer.as_ref(), &mut plan.whole);
            out = out.push_boxed(&name, layer)?;
        }
        shape = next;
    }
    if split {
        out = out.push_boxed(
            "gather",
            Box::new(Bound::new(SpatialGather::new(shape[1], parts, part)?, comm)),
        )?;
    }
    Ok((out, plan))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn halo(in_len: usize, k: usize, s: usize, p: usize, parts: usize, part: usize) -> Halo {
        let window = Window {
            kernel: k,
            stride: s,
            padding: p,
        };
        Halo::new(in_len, window, parts, part).unwrap()
    }

    #[test]
    fn blocks_cover_the_axis_in_order() {
        for len in 1..20 {
            for parts in 1..=len.min(6) {
                let mut next = 0;
                for part in 0..parts {
                    let r = rows(len, parts, part);
                    assert_eq!(r.start, next);
                    assert!(!r.is_empty() && r.len() <= len.div_ceil(parts));
                    next = r.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    /// Every input row a block's window reads is either its own, received from the one rank
    /// that owns it, or padding; and what one rank sends is what the other receives.
    #[test]
    fn halo_plans_match_and_cover_every_window() {
        for (in_len, k, s, p) in [
            (13, 3, 1, 1),
            (13, 5, 1, 0),
            (16, 3, 2, 1),
            (9, 7, 1, 3),
            (17, 3, 2, 0),
            (8, 2, 2, 0),
            (11, 1, 1, 0),
        ] {
            for parts in 1..=4 {
                let plans: Vec<Halo> = (0..parts)
                    .map(|q| halo(in_len, k, s, p, parts, q))
                    .collect();
                for (me, h) in plans.iter().enumerate() {
                    let need = h.needs(me);
                    let mut covered: Vec<usize> = h
                        .owns(me)
                        .filter(|&r| need.contains(&(r as isize)))
                        .collect();
                    for (q, r) in h.incoming() {
                        let back = plans[q].outgoing();
                        assert!(
                            back.contains(&(me, r.clone())),
                            "{me} gets {r:?} from {q}, which sends {back:?}"
                        );
                        covered.extend(r);
                    }
                    covered.sort_unstable();
                    let real: Vec<usize> =
                        (need.start.max(0) as usize..(need.end as usize).min(in_len)).collect();
                    assert_eq!(
                        covered, real,
                        "{in_len} k{k} s{s} p{p}: block {me} of {parts}"
                    );
                    // The slab gives exactly the block's output rows.
                    let out = rows(h.out_len, parts, me);
                    assert_eq!((need.len() - k) / s + 1, out.len());
                }
            }
        }
    }

    #[test]
    fn a_2x2_pool_on_even_blocks_needs_no_halo() {
        let h = halo(16, 2, 2, 0, 4, 1);
        assert!(h.incoming().is_empty() && h.outgoing().is_empty());
    }

    #[test]
    fn too_short_an_axis_is_an_error() {
        let w = Window {
            kernel: 3,
            stride: 1,
            padding: 0,
        };
        assert!(Halo::new(4, w, 3, 0).is_err()); // 2 output rows for 3 blocks
        assert!(Halo::new(2, w, 1, 0).is_err()); // the window does not fit
        assert!(Halo::new(8, w, 2, 2).is_err()); // no block 2 of 2
        assert!(SpatialScatter::new(3, 4, 0).is_err());
    }

    #[test]
    fn planes_take_and_put_rows() {
        // 2 planes of 3 rows of 2 values.
        let p = Planes {
            outer: 2,
            rows: 3,
            inner: 2,
        };
        let data: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let rows12 = p.take(&data, 1..3);
        assert_eq!(rows12, vec![2.0, 3.0, 4.0, 5.0, 8.0, 9.0, 10.0, 11.0]);
        let mut back = vec![0.0; 12];
        p.put(&mut back, 1, &rows12, false);
        p.put(&mut back, 1, &rows12, true);
        assert_eq!(&back[2..6], &[4.0, 6.0, 8.0, 10.0]);
        assert_eq!(&back[..2], &[0.0, 0.0]);
    }
}
