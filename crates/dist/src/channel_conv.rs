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
    /// This block's output shape (`dy`'s), known from the forward.
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
            out_shape: None,
        })
    }

    /// `y`'s block of output channels (`N × K/parts × spatial`) from this rank's block of input
    /// channels `x` (`N × C/parts × spatial`). Collective over `comm`. With `train`, keeps what
    /// backward needs.
    pub fn forward(&mut self, comm: &impl Communicator, x: Tensor, train: bool) -> Result<Tensor> {
        check_comm(comm, self.parts, self.part)?;
        let partial = self.conv.forward(x, train)?;
        let mut y = reduce_scatter_channels(comm, &partial)?;
        add_bias(&mut y, self.bias.as_ref());
        if train {
            self.out_shape = Some(y.shape().to_vec());
        }
        Ok(y)
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
        check_dy(&dy, &take_saved(&mut self.out_shape)?)?;
        bias_grad(self.bias.as_mut(), &dy);
        Ok(self
            .conv
            .backward(allgather_channels(comm, &dy)?, need_dx)?)
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

/// Adds `bias[ch]` to every plane of channel `ch` of `y` (`N × K × spatial`, `bias`: `K`): a
/// block's bias after the reduce-scatter that left it its block of output channels.
pub(crate) fn add_bias(y: &mut Tensor, bias: Option<&Parameter>) {
    let Some(b) = bias else { return };
    let (per, plane) = (b.value.len(), y.shape()[2..].iter().product::<usize>());
    for (ch, chunk) in y.data_mut().chunks_exact_mut(plane.max(1)).enumerate() {
        let v = b.value.data()[ch % per];
        chunk.iter_mut().for_each(|y| *y += v);
    }
}

/// Overwrites `bias`'s gradient (`K`) with the sums of `dy` (`N × K × spatial`) over samples
/// and positions, per channel.
pub(crate) fn bias_grad(bias: Option<&mut Parameter>, dy: &Tensor) {
    let Some(b) = bias else { return };
    let plane = dy.shape()[2..].iter().product::<usize>();
    let g = b.grad.data_mut();
    let per = g.len();
    g.fill(0.0);
    for (ch, chunk) in dy.data().chunks_exact(plane.max(1)).enumerate() {
        g[ch % per] += chunk.iter().sum::<f32>();
    }
}

/// Checks that `dy` has the shape of the block's output the forward left, `expected`.
pub(crate) fn check_dy(dy: &Tensor, expected: &[usize]) -> Result<()> {
    if dy.shape() != expected {
        return Err(DistError::Training(format!(
            "dy has shape {:?}, this block's output is {expected:?}",
            dy.shape()
        )));
    }
    Ok(())
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

/// `t`'s shape as `(N, channels, spatial positions)`, or the error naming `what` when it has no
/// channel dimension.
pub(crate) fn dims(what: &str, shape: &[usize]) -> Result<(usize, usize, usize)> {
    if shape.len() < 2 {
        return Err(DistError::Training(format!(
            "{what} has shape {shape:?}, expected N × C × spatial"
        )));
    }
    Ok((shape[0], shape[1], shape[2..].iter().product()))
}

/// The sum over the ranks of `comm` of `t` (`N × K × spatial`), left as this rank's block of
/// `K / comm.size()` channels (`N × K/size × spatial`): the reduce-scatter that completes a
/// convolution's partial sums over channel or filter blocks.
pub(crate) fn reduce_scatter_channels(comm: &impl Communicator, t: &Tensor) -> Result<Tensor> {
    let (n, k, plane) = dims("a reduce-scatter's input", t.shape())?;
    let p = comm.size();
    if !k.is_multiple_of(p) {
        return Err(DistError::Training(format!(
            "a reduce-scatter of {k} channels over {p} ranks"
        )));
    }
    let send = to_blocks(t.data(), n, k, plane, p);
    let mut recv = vec![0.0f32; n * (k / p) * plane];
    comm.reduce_scatter_sum(&send, &mut recv)?;
    let mut shape = t.shape().to_vec();
    shape[1] = k / p;
    Ok(Tensor::new(&shape, recv)?)
}

/// Every rank of `comm`'s block of channels (`t`: `N × K/size × spatial`, rank `r` holding
/// block `r`) assembled into `N × K × spatial`: the allgather before a convolution that needs
/// every channel or filter block.
pub(crate) fn allgather_channels(comm: &impl Communicator, t: &Tensor) -> Result<Tensor> {
    let (n, kl, plane) = dims("an allgather's input", t.shape())?;
    let p = comm.size();
    let mut gathered = vec![0.0f32; t.len() * p];
    comm.allgather(t.data(), &mut gathered)?;
    let mut shape = t.shape().to_vec();
    shape[1] = kl * p;
    Ok(Tensor::new(
        &shape,
        from_blocks(&gathered, n, kl * p, plane, p),
    )?)
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
        let full = allgather_channels(comm, &x)?;
        if train {
            self.in_shape = Some(full.shape().to_vec());
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
        take_saved(&mut self.in_shape)?;
        let Some(dx) = self.conv.backward(dy, need_dx)? else {
            return Ok(None);
        };
        Ok(Some(reduce_scatter_channels(comm, &dx)?))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::single::SingleProcess;

    /// One block of each form is the whole layer, and `dy` must have the shape the forward left:
    /// another shape of the same length, or a backward without a forward, is an error.
    #[test]
    fn one_block_is_the_whole_layer_and_dy_is_checked() {
        let cfg = ConvConfig::conv2d(3, 4, 3).padding(1);
        let rng = &mut <SmallRng as rand::SeedableRng>::seed_from_u64(1);
        let mut full = Conv::new(cfg.clone(), ConvAlgo::Convgemm, rng).unwrap();
        let a = ConvAlgo::Convgemm;
        let mut ch = ChannelParallelConv::from_conv(&full, cfg.clone(), a, 1, 0).unwrap();
        let mut fi = FilterParallelConv::from_conv(&full, cfg, a, 1, 0).unwrap();
        let x = Tensor::new(
            &[2, 3, 5, 4],
            (0..120).map(|v| (v % 7) as f32 - 3.0).collect(),
        )
        .unwrap();
        let s = SingleProcess;
        let y = full.forward(x.clone(), true).unwrap();
        let dy = Tensor::new(y.shape(), (0..y.len()).map(|v| (v % 5) as f32).collect()).unwrap();
        let dx = full.backward(dy.clone(), true).unwrap().unwrap();
        assert!(ch.backward(&s, dy.clone(), true).is_err());
        assert_eq!(ch.forward(&s, x.clone(), true).unwrap(), y);
        let wrong = Tensor::new(&[2, 4, 4, 5], dy.data().to_vec()).unwrap();
        let err = ch.backward(&s, wrong, true).unwrap_err().to_string();
        assert!(
            err.contains("[2, 4, 4, 5]") && err.contains("[2, 4, 5, 4]"),
            "{err}"
        );
        ch.forward(&s, x.clone(), true).unwrap();
        assert_eq!(ch.backward(&s, dy.clone(), true).unwrap().unwrap(), dx);
        assert_eq!(fi.forward(&s, x, true).unwrap(), y);
        assert_eq!(fi.backward(&s, dy, true).unwrap().unwrap(), dx);
        for layer in [ch.params(), fi.params()] {
            for ((_, a), (_, b)) in layer.iter().zip(full.params()) {
                assert_eq!(a.grad, b.grad);
            }
        }
    }
}
