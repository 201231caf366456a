//! Channel and filter parallel convolution, "Channel and Filter Parallelism for Large-Scale CNN
//! Training" (sections 3.2, 3.3): [`ChannelParallelConv`] (stationary-x) and
//! [`FilterParallelConv`] (stationary-y) over the ranks of a channel communicator.

use nn::{Conv, ConvAlgo, ConvConfig, Layer, Parameter, Tensor};
use rand::rngs::SmallRng;

use crate::comm::Communicator;
use crate::error::{DistError, Result};

/// A convolution whose input channels, weights (by input channel) and output channels are
/// split in `parts` equal blocks over the ranks of a channel communicator (a
/// [`crate::ProcessorGrid`] row); block `part` lives on the rank of that index.
///
/// Forward: each rank convolves its channel block of `x` with its slice of the weights,
/// producing a partial sum for every output channel; a reduce-scatter completes the sums and
/// leaves each rank its block of output channels (the next layer's input distribution), to
/// which it adds its block of the bias. Backward: an allgather assembles every output channel
/// of `dy`; backward-data and backward-filter are then local (`dx` for the rank's input
/// channels, `dw` for its weight slice). Over a sample-parallel grid the weight gradients are
/// summed over [`crate::ProcessorGrid::sample_comm`] only: the segmented allreduce.
pub struct ChannelParallelConv {
    conv: Conv,
    bias: Option<Parameter>,
    parts: usize,
    part: usize,
    out_channels: usize,
    /// `dy`'s gathered shape, known from the forward.
    out_shape: Option<Vec<usize>>,
}

impl ChannelParallelConv {
    /// Block `part` of `parts` of the convolution `cfg`, with PyTorch's initialisation of the
    /// whole layer drawn from `rng` (pass the same seed on every rank, so the blocks form one
    /// layer).
    ///
    /// Errors: [`DistError::Training`] when `parts` does not divide the input and output
    /// channels or `part >= parts`; [`DistError::Nn`] for an invalid configuration.
    pub fn new(
        cfg: ConvConfig,
        algo: ConvAlgo,
        rng: &mut SmallRng,
        parts: usize,
        part: usize,
    ) -> Result<Self> {
        let full = Conv::new(cfg.clone(), algo, rng)?;
        Self::from_conv(&full, cfg, algo, parts, part)
    }

    /// Block `part` of `parts` of an existing layer `full` built from `cfg`: its weight slice
    /// `[:, part·C/parts .. (part+1)·C/parts]` and bias block `[part·K/parts ..]`.
    pub fn from_conv(
        full: &Conv,
        cfg: ConvConfig,
        algo: ConvAlgo,
        parts: usize,
        part: usize,
    ) -> Result<Self> {
        let (c, k) = (cfg.in_channels, cfg.out_channels);
        check_parts(c, k, parts, part)?;
        check_full(full, &cfg)?;
        let (cl, kl) = (c / parts, k / parts);
        let params = full.params();
        let weight = &params[0].1.value;
        let taps = weight.len() / (k * c);
        let mut local_cfg = cfg.clone();
        local_cfg.in_channels = cl;
        local_cfg.bias = false;
        let mut rng = <SmallRng as rand::SeedableRng>::seed_from_u64(0);
        let mut conv = Conv::new(local_cfg, algo, &mut rng)?;
        {
            let mut local = conv.params_mut();
            let w = local[0].1.value.data_mut();
            for o in 0..k {
                let src = &weight.data()[(o * c + part * cl) * taps..][..cl * taps];
                w[o * cl * taps..][..cl * taps].copy_from_slice(src);
            }
        }
        let bias = if cfg.bias {
            let b = &params[1].1.value.data()[part * kl..(part + 1) * kl];
            Some(Parameter::new(Tensor::new(&[kl], b.to_vec())?))
        } else {
            None
        };
        Ok(ChannelParallelConv {
            conv,
            bias,
            parts,
            part,
            out_channels: k,
            out_shape: None,
        })
    }

    /// `y`'s block of output channels (`N × K/parts × spatial`) from this rank's block of input
    /// channels `x` (`N × C/parts × spatial`). Collective over `comm`. With `train`, keeps what
    /// backward needs.
    pub fn forward(&mut self, comm: &impl Communicator, x: Tensor, train: bool) -> Result<Tensor> {
        check_comm(comm, self.parts, self.part)?;
        let y = self.conv.forward(x, train)?;
        let shape = y.shape().to_vec();
        let (n, k, p) = (shape[0], self.out_channels, self.parts);
        let plane: usize = shape[2..].iter().product();
        let kl = k / p;
        let mut recv = reduce_scatter_channels(comm, y.data(), n, k, plane)?;
        add_bias(&mut recv, self.bias.as_ref(), kl, plane);
        let mut local = shape.clone();
        local[1] = kl;
        if train {
            self.out_shape = Some(shape);
        }
        Ok(Tensor::new(&local, recv)?)
    }

    /// From this rank's block of `dy` (`N × K/parts × spatial'`): the gradients of the weight
    /// slice and bias block (overwritten), and `dx` for this rank's input channels when
    /// `need_dx`. Collective over `comm`.
    pub fn backward(
        &mut self,
        comm: &impl Communicator,
        dy: Tensor,
        need_dx: bool,
    ) -> Result<Option<Tensor>> {
        check_comm(comm, self.parts, self.part)?;
        let shape = take_saved(&mut self.out_shape)?;
        let (n, k, p) = (shape[0], self.out_channels, self.parts);
        let plane: usize = shape[2..].iter().product();
        let kl = k / p;
        if dy.len() != n * kl * plane {
            return Err(DistError::Training(format!(
                "dy has shape {:?}, this block's output is {n} × {kl} × {:?}",
                dy.shape(),
                &shape[2..]
            )));
        }
        bias_grad(self.bias.as_mut(), dy.data(), kl, plane);
        let full = allgather_channels(comm, dy.data(), n, k, plane)?;
        Ok(self.conv.backward(Tensor::new(&shape, full)?, need_dx)?)
    }

    /// `(parts, part)`: this is block `part` of `parts`.
    pub fn block(&self) -> (usize, usize) {
        (self.parts, self.part)
    }

    /// The local convolution: this rank's input channels to every output channel, no bias.
    pub fn local(&self) -> &Conv {
        &self.conv
    }

    /// The weight slice (`K × C/parts × kernel`) and the bias block (`K/parts`), with PyTorch's
    /// names.
    pub fn params(&self) -> Vec<(String, &Parameter)> {
        let mut v = self.conv.params();
        v.extend(self.bias.as_ref().map(|b| ("bias".into(), b)));
        v
    }

    /// The same, mutable.
    pub fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        let mut v = self.conv.params_mut();
        v.extend(self.bias.as_mut().map(|b| ("bias".into(), b)));
        v
    }
}

/// Adds `bias[ch % per]` to every plane `ch` of `y` (`N × per × plane`): a block's bias after
/// the reduce-scatter that left it `per` output channels.
pub(crate) fn add_bias(y: &mut [f32], bias: Option<&Parameter>, per: usize, plane: usize) {
    let Some(b) = bias else { return };
    for (ch, chunk) in y.chunks_exact_mut(plane.max(1)).enumerate() {
        let v = b.value.data()[ch % per];
        chunk.iter_mut().for_each(|y| *y += v);
    }
}

/// Overwrites `bias`'s gradient with the sums of `dy` (`N × per × plane`) over samples and
/// positions, per channel.
pub(crate) fn bias_grad(bias: Option<&mut Parameter>, dy: &[f32], per: usize, plane: usize) {
    let Some(b) = bias else { return };
    let g = b.grad.data_mut();
    g.fill(0.0);
    for (ch, chunk) in dy.chunks_exact(plane.max(1)).enumerate() {
        g[ch % per] += chunk.iter().sum::<f32>();
    }
}

/// `N × K × plane` (row-major) as `parts` blocks, block `b` holding channels
/// `b·K/parts..(b+1)·K/parts` of every sample: the layout of reduce-scatter's input.
pub(crate) fn to_blocks(t: &[f32], n: usize, k: usize, plane: usize, parts: usize) -> Vec<f32> {
    let kl = k / parts;
    let mut out = vec![0.0f32; t.len()];
    for b in 0..parts {
        for i in 0..n {
            let src = &t[(i * k + b * kl) * plane..][..kl * plane];
            out[(b * n + i) * kl * plane..][..kl * plane].copy_from_slice(src);
        }
    }
    out
}

/// The sum over the ranks of `comm` of `t` (`N × K × plane`), left as this rank's block of
/// `K / comm.size()` channels (`N × K/size × plane`): the reduce-scatter that completes a
/// convolution's partial sums over channel or filter blocks.
pub(crate) fn reduce_scatter_channels(
    comm: &impl Communicator,
    t: &[f32],
    n: usize,
    k: usize,
    plane: usize,
) -> Result<Vec<f32>> {
    let p = comm.size();
    let send = to_blocks(t, n, k, plane, p);
    let mut recv = vec![0.0f32; n * (k / p) * plane];
    comm.reduce_scatter_sum(&send, &mut recv)?;
    Ok(recv)
}

/// Every rank of `comm`'s block of channels (`t`: `N × K/size × plane`, rank `r` holding
/// block `r`) assembled into `N × K × plane`: the allgather before a convolution that needs
/// every channel or filter block.
pub(crate) fn allgather_channels(
    comm: &impl Communicator,
    t: &[f32],
    n: usize,
    k: usize,
    plane: usize,
) -> Result<Vec<f32>> {
    let mut gathered = vec![0.0f32; t.len() * comm.size()];
    comm.allgather(t, &mut gathered)?;
    Ok(from_blocks(&gathered, n, k, plane, comm.size()))
}

/// The inverse of [`to_blocks`]: allgather's output back to `N × K × plane`.
pub(crate) fn from_blocks(
    blocks: &[f32],
    n: usize,
    k: usize,
    plane: usize,
    parts: usize,
) -> Vec<f32> {
    let kl = k / parts;
    let mut out = vec![0.0f32; blocks.len()];
    for b in 0..parts {
        for i in 0..n {
            let src = &blocks[(b * n + i) * kl * plane..][..kl * plane];
            out[(i * k + b * kl) * plane..][..kl * plane].copy_from_slice(src);
        }
    }
    out
}

/// The shape a training forward saved for backward, or the error of a backward without one.
fn take_saved(saved: &mut Option<Vec<usize>>) -> Result<Vec<usize>> {
    saved
        .take()
        .ok_or_else(|| DistError::Training("backward without a training forward".into()))
}

/// Checks that `comm` is the `parts`-rank communicator whose rank `part` runs this block.
pub(crate) fn check_comm(comm: &impl Communicator, parts: usize, part: usize) -> Result<()> {
    if comm.size() != parts || comm.rank() != part {
        return Err(DistError::Training(format!(
            "block {part} of {parts} run on rank {} of {}",
            comm.rank(),
            comm.size()
        )));
    }
    Ok(())
}

/// Checks that `full` is the layer `cfg` describes: weight `K × C × kernel`, a bias exactly when
/// `cfg` has one.
pub(crate) fn check_full(full: &Conv, cfg: &ConvConfig) -> Result<()> {
    let params = full.params();
    let shape = params[0].1.value.shape();
    let (k, c) = (cfg.out_channels, cfg.in_channels);
    if shape.len() < 3 || shape[0] != k || shape[1] != c || (params.len() == 2) != cfg.bias {
        return Err(DistError::Training(format!(
            "the layer's weight is {shape:?} with{} bias, the configuration says {k} × {c} × kernel{}",
            if params.len() == 2 { "" } else { "out" },
            if cfg.bias {
                " with bias"
            } else {
                " without bias"
            }
        )));
    }
    Ok(())
}

/// Checks that `parts` divides both channel counts and that `part` is one of them.
fn check_parts(c: usize, k: usize, parts: usize, part: usize) -> Result<()> {
    if parts == 0 || part >= parts || !c.is_multiple_of(parts) || !k.is_multiple_of(parts) {
        return Err(DistError::Training(format!(
            "block {part} of {parts}: the block count must divide {c} input and {k} output channels"
        )));
    }
    Ok(())
}

/// A convolution whose output channels (filters) and weights (by filter) are split in `parts`
/// equal blocks over the ranks of a channel communicator, the input arriving split by channels
/// as [`ChannelParallelConv`] leaves its output: the stationary-y algorithm.
///
/// Forward: an allgather assembles every input channel, then each rank convolves with its
/// filters and adds its bias block, which leaves it its block of output channels. Backward:
/// the local backward-data gives every input channel's partial sum over this rank's filters; a
/// reduce-scatter completes the sums and leaves each rank its input-channel block of `dx`.
/// Backward-filter is local (the whole input is kept from the forward, the memory cost the
/// paper notes); over a sample-parallel grid the gradients are summed over
/// [`crate::ProcessorGrid::sample_comm`].
pub struct FilterParallelConv {
    conv: Conv,
    parts: usize,
    part: usize,
    in_channels: usize,
    /// The gathered input's shape, known from the forward.
    in_shape: Option<Vec<usize>>,
}

impl FilterParallelConv {
    /// Block `part` of `parts` of the layer `full` built from `cfg`: its filters
    /// `[part·K/parts .. (part+1)·K/parts]` with their bias.
    ///
    /// Errors: [`DistError::Training`] when `parts` does not divide the input and output
    /// channels or `part >= parts`; [`DistError::Nn`] for an invalid configuration.
    pub fn from_conv(
        full: &Conv,
        cfg: ConvConfig,
        algo: ConvAlgo,
        parts: usize,
        part: usize,
    ) -> Result<Self> {
        let (c, k) = (cfg.in_channels, cfg.out_channels);
        check_parts(c, k, parts, part)?;
        check_full(full, &cfg)?;
        let kl = k / parts;
        let params = full.params();
        let weight = &params[0].1.value;
        let per_filter = weight.len() / k;
        let mut local_cfg = cfg.clone();
        local_cfg.out_channels = kl;
        let mut rng = <SmallRng as rand::SeedableRng>::seed_from_u64(0);
        let mut conv = Conv::new(local_cfg, algo, &mut rng)?;
        {
            let mut local = conv.params_mut();
            local[0]
                .1
                .value
                .data_mut()
                .copy_from_slice(&weight.data()[part * kl * per_filter..][..kl * per_filter]);
            if cfg.bias {
                local[1]
                    .1
                    .value
                    .data_mut()
                    .copy_from_slice(&params[1].1.value.data()[part * kl..(part + 1) * kl]);
            }
        }
        Ok(FilterParallelConv {
            conv,
            parts,
            part,
            in_channels: c,
            in_shape: None,
        })
    }

    /// This rank's block of output channels (`N × K/parts × spatial'`) from its block of input
    /// channels `x` (`N × C/parts × spatial`). Collective over `comm`.
    pub fn forward(&mut self, comm: &impl Communicator, x: Tensor, train: bool) -> Result<Tensor> {
        check_comm(comm, self.parts, self.part)?;
        let (c, p) = (self.in_channels, self.parts);
        let shape = x.shape().to_vec();
        if shape.len() < 3 || shape[1] * p != c {
            return Err(DistError::Training(format!(
                "x has shape {shape:?}, this block takes N × {} × spatial",
                c / p
            )));
        }
        let (n, plane) = (shape[0], shape[2..].iter().product::<usize>());
        let mut full_shape = shape.clone();
        full_shape[1] = c;
        let full = Tensor::new(
            &full_shape,
            allgather_channels(comm, x.data(), n, c, plane)?,
        )?;
        if train {
            self.in_shape = Some(full_shape);
        }
        Ok(self.conv.forward(full, train)?)
    }

    /// From this rank's block of `dy` (`N × K/parts × spatial'`): the gradients of its filters
    /// and bias (overwritten), and `dx` for its block of input channels when `need_dx`.
    /// Collective over `comm` (every rank must pass the same `need_dx`).
    pub fn backward(
        &mut self,
        comm: &impl Communicator,
        dy: Tensor,
        need_dx: bool,
    ) -> Result<Option<Tensor>> {
        check_comm(comm, self.parts, self.part)?;
        let shape = take_saved(&mut self.in_shape)?;
        let Some(dx) = self.conv.backward(dy, need_dx)? else {
            return Ok(None);
        };
        let (n, c, p) = (shape[0], self.in_channels, self.parts);
        let plane: usize = shape[2..].iter().product();
        let recv = reduce_scatter_channels(comm, dx.data(), n, c, plane)?;
        let mut local = shape;
        local[1] = c / p;
        Ok(Some(Tensor::new(&local, recv)?))
    }

    /// `(parts, part)`: this is block `part` of `parts`.
    pub fn block(&self) -> (usize, usize) {
        (self.parts, self.part)
    }

    /// The local convolution: every input channel to this rank's filters, with their bias.
    pub fn local(&self) -> &Conv {
        &self.conv
    }

    /// This rank's filters (`K/parts × C × kernel`) and their bias, with PyTorch's names.
    pub fn params(&self) -> Vec<(String, &Parameter)> {
        self.conv.params()
    }

    /// The same, mutable.
    pub fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        self.conv.params_mut()
    }
}
