//! [`ChannelParallelConv`]: the stationary-x convolution of "Channel and Filter Parallelism for
//! Large-Scale CNN Training" (section 3.2) over the ranks of a channel communicator.

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
        if parts == 0 || part >= parts || c % parts != 0 || k % parts != 0 {
            return Err(DistError::Training(format!(
                "block {part} of {parts}: the block count must divide {c} input and {k} output channels"
            )));
        }
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

    fn check_comm(&self, comm: &impl Communicator) -> Result<()> {
        if comm.size() != self.parts || comm.rank() != self.part {
            return Err(DistError::Training(format!(
                "block {} of {} run on rank {} of {}",
                self.part,
                self.parts,
                comm.rank(),
                comm.size()
            )));
        }
        Ok(())
    }

    /// `y`'s block of output channels (`N × K/parts × spatial`) from this rank's block of input
    /// channels `x` (`N × C/parts × spatial`). Collective over `comm`. With `train`, keeps what
    /// backward needs.
    pub fn forward(&mut self, comm: &impl Communicator, x: Tensor, train: bool) -> Result<Tensor> {
        self.check_comm(comm)?;
        let y = self.conv.forward(x, train)?;
        let shape = y.shape().to_vec();
        let (n, k, p) = (shape[0], self.out_channels, self.parts);
        let plane: usize = shape[2..].iter().product();
        let kl = k / p;
        // Block b of the send buffer: output channels b·kl.. of every sample, contiguous.
        let mut send = vec![0.0f32; y.len()];
        for b in 0..p {
            for i in 0..n {
                let src = &y.data()[(i * k + b * kl) * plane..][..kl * plane];
                send[(b * n + i) * kl * plane..][..kl * plane].copy_from_slice(src);
            }
        }
        let mut recv = vec![0.0f32; n * kl * plane];
        comm.reduce_scatter_sum(&send, &mut recv)?;
        if let Some(b) = &self.bias {
            for (ch, chunk) in recv.chunks_exact_mut(plane).enumerate() {
                let v = b.value.data()[ch % kl];
                chunk.iter_mut().for_each(|y| *y += v);
            }
        }
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
        self.check_comm(comm)?;
        let shape = self
            .out_shape
            .take()
            .ok_or_else(|| DistError::Training("backward without a training forward".into()))?;
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
        if let Some(b) = &mut self.bias {
            let g = b.grad.data_mut();
            g.fill(0.0);
            for (ch, chunk) in dy.data().chunks_exact(plane).enumerate() {
                g[ch % kl] += chunk.iter().sum::<f32>();
            }
        }
        let mut gathered = vec![0.0f32; n * k * plane];
        comm.allgather(dy.data(), &mut gathered)?;
        let mut full = vec![0.0f32; n * k * plane];
        for b in 0..p {
            for i in 0..n {
                let src = &gathered[(b * n + i) * kl * plane..][..kl * plane];
                full[(i * k + b * kl) * plane..][..kl * plane].copy_from_slice(src);
            }
        }
        Ok(self.conv.backward(Tensor::new(&shape, full)?, need_dx)?)
    }

    /// The weight slice (`K × C/parts × kernel`) and the bias block (`K/parts`), with PyTorch's
    /// names.
    pub fn params(&self) -> Vec<(String, &Parameter)> {
        let mut v = self.conv.params();
        if let Some(b) = &self.bias {
            v.push(("bias".into(), b));
        }
        v
    }

    /// The same, mutable.
    pub fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        let mut v = self.conv.params_mut();
        if let Some(b) = &mut self.bias {
            v.push(("bias".into(), b));
        }
        v
    }
}
