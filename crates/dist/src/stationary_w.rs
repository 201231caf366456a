//! The stationary-w convolution of "Channel and Filter Parallelism for Large-Scale CNN Training"
//! (section 3.4): input channels and filters both split, over a `pc × pf` grid of the ranks of a
//! channel communicator ([`ChannelGrid`]).
//!
//! Stationary-x ([`crate::ChannelParallelConv`]) and stationary-y
//! ([`crate::FilterParallelConv`]) are its `P × 1` and `1 × P` cases; with both grid sides
//! above 1 each rank holds a `K/pf × C/pc` block of the weights, a quarter of them on a 2 × 2
//! grid where stationary-x and -y hold a half, and convolves `C/pc` channels into `K/pf`
//! filters, so the local products shrink in both dimensions.

use std::rc::Rc;

use nn::{Conv, ConvAlgo, ConvConfig, Layer, Parameter, Tensor};
use rand::rngs::SmallRng;

use crate::channel_conv::{
    add_bias, allgather_channels, bias_grad, check_dy, check_full, reduce_scatter_channels,
};
use crate::comm::Communicator;
use crate::error::{DistError, Result};
use crate::layers::{CommHandle, Registration, register, to_nn};
use crate::runtime::World;

/// A `pc × pf` grid over the ranks of a channel communicator (a [`crate::ProcessorGrid`] row):
/// rank `r` sits at `(c, f) = (r / pf, r % pf)`, with a communicator for its grid row (same
/// `c`, ordered by `f`) and one for its column (same `f`, ordered by `c`): the two groups the
/// stationary-w convolution's allgathers and reduce-scatters run over.
pub struct ChannelGrid<C: Communicator> {
    shape: (usize, usize),
    coords: (usize, usize),
    row: C,
    col: C,
    transposed: C,
}

impl<C: Communicator> ChannelGrid<C> {
    /// Arranges the ranks of `comm` as `pc × pf` (collective over `comm`).
    ///
    /// Errors: [`DistError::Training`] when `pc · pf` is not `comm.size()`.
    pub fn new(comm: &C, pc: usize, pf: usize) -> Result<Self> {
        if pc.checked_mul(pf) != Some(comm.size()) || pc == 0 {
            return Err(DistError::Training(format!(
                "a {pc} × {pf} channel grid needs {} ranks, the communicator has {}",
                pc.saturating_mul(pf),
                comm.size()
            )));
        }
        let r = comm.rank();
        let coords = (r / pf, r % pf);
        let u = |v: usize| {
            u32::try_from(v).map_err(|_| DistError::ValueOutOfRange {
                arg: "channel grid coordinate",
                value: v as u64,
            })
        };
        let missing = || DistError::Training("split returned no communicator".into());
        let row = comm
            .split_by_color(Some(u(coords.0)?), u(coords.1)?)?
            .ok_or_else(missing)?;
        let col = comm
            .split_by_color(Some(u(coords.1)?), u(coords.0)?)?
            .ok_or_else(missing)?;
        let transposed = comm
            .split_by_color(Some(0), u(coords.1 * pc + coords.0)?)?
            .ok_or_else(missing)?;
        Ok(ChannelGrid {
            shape: (pc, pf),
            coords,
            row,
            col,
            transposed,
        })
    }

    /// `(pc, pf)`.
    pub fn shape(&self) -> (usize, usize) {
        self.shape
    }

    /// This rank's `(c, f)`.
    pub fn coords(&self) -> (usize, usize) {
        self.coords
    }

    /// The ranks of this rank's grid row: same input-channel block `c`, every filter block.
    pub fn row(&self) -> &C {
        &self.row
    }

    /// The ranks of this rank's grid column: same filter block `f`, every input-channel block.
    pub fn col(&self) -> &C {
        &self.col
    }

    /// Every rank of the grid, ordered by `f · pc + c`: rank `f · pc + c` of it is this rank.
    pub fn transposed(&self) -> &C {
        &self.transposed
    }

    /// `(row, col, transposed)`, taking the grid apart (e.g. to [`crate::register`] them).
    pub fn into_comms(self) -> (C, C, C) {
        (self.row, self.col, self.transposed)
    }
}

/// Block `(c, f)` of a convolution on a `pc × pf` [`ChannelGrid`]: the stationary-w algorithm.
///
/// Distributions (`P = pc · pf`; blocks of equal size, numbered from 0):
/// - `x` and `dx`: this rank holds input-channel block `c · pf + f` of `P`;
/// - the weights: filters block `f` of `pf` × input channels block `c` of `pc`
///   (`K/pf × C/pc × kernel`);
/// - `y` and `dy`: output-channel block `f · pc + c` of `P`, with its bias.
///
/// Forward: (1) an allgather over the row assembles input-channel block `c` of `pc`; (2) the
/// local convolution gives the partial sums, over those channels, of filter block `f`; (3) a
/// reduce-scatter over the column completes the sums and leaves output block `f · pc + c`, to
/// which the rank adds its bias block. Backward: (4) an allgather of `dy` over the column
/// assembles filter block `f`; (5) the local backward-data gives `dx`'s partial sums over those
/// filters for input block `c`; (6) a reduce-scatter over the row completes them and leaves
/// block `c · pf + f`; (7) backward-filter is local, and over a sample-parallel grid the weight
/// gradients are summed over the ranks holding the same block (8, the segmented allreduce,
/// the caller's).
///
/// The output's block numbering is the input's on the transposed grid: a following stationary-w
/// convolution built for the `pf × pc` grid at `(f, c)` takes it as is (the paper's "its w can be
/// transposed to account for this"), and leaves block `c · pf + f` again.
pub struct StationaryWConv {
    conv: Conv,
    bias: Option<Parameter>,
    shape: (usize, usize),
    coords: (usize, usize),
    in_channels: usize,
    /// The local convolution's output shape (`N × K/pf × spatial'`), known from the forward.
    partial_shape: Option<Vec<usize>>,
}

impl StationaryWConv {
    /// Block `coords = (c, f)` of the `shape = (pc, pf)` grid of the layer `full` built from
    /// `cfg` (pass the same `full` on every rank, e.g. built from one seed).
    ///
    /// Errors: [`DistError::Training`] when `pc · pf` does not divide the input and output
    /// channels, a coordinate is off the grid, or `full` is not the layer `cfg` describes;
    /// [`DistError::Nn`] for an invalid configuration.
    pub fn from_conv(
        full: &Conv,
        cfg: ConvConfig,
        algo: ConvAlgo,
        shape: (usize, usize),
        coords: (usize, usize),
    ) -> Result<Self> {
        let (pc, pf) = shape;
        let (c, k) = (cfg.in_channels, cfg.out_channels);
        let p = pc.saturating_mul(pf);
        if p == 0
            || coords.0 >= pc
            || coords.1 >= pf
            || !c.is_multiple_of(p)
            || !k.is_multiple_of(p)
        {
            return Err(DistError::Training(format!(
                "block {coords:?} of a {pc} × {pf} grid: the grid must hold the block and its \
                 size {p} must divide {c} input and {k} output channels"
            )));
        }
        check_full(full, &cfg)?;
        let (cl, kl) = (c / pc, k / pf);
        let params = full.params();
        let weight = params[0].1.value.data();
        let taps = weight.len() / (k * c);
        let mut local_cfg = cfg.clone();
        local_cfg.in_channels = cl;
        local_cfg.out_channels = kl;
        local_cfg.bias = false;
        let mut rng = <SmallRng as rand::SeedableRng>::seed_from_u64(0);
        let mut conv = Conv::new(local_cfg, algo, &mut rng)?;
        {
            let mut local = conv.params_mut();
            let w = local[0].1.value.data_mut();
            for o in 0..kl {
                let src = &weight[((coords.1 * kl + o) * c + coords.0 * cl) * taps..];
                w[o * cl * taps..][..cl * taps].copy_from_slice(&src[..cl * taps]);
            }
        }
        let bias = if cfg.bias {
            let per = k / p;
            let at = (coords.1 * pc + coords.0) * per;
            let b = &params[1].1.value.data()[at..at + per];
            Some(Parameter::new(Tensor::new(&[per], b.to_vec())?))
        } else {
            None
        };
        Ok(StationaryWConv {
            conv,
            bias,
            shape,
            coords,
            in_channels: c,
            partial_shape: None,
        })
    }

    /// Checks that `row` and `col` are this block's grid row and column.
    fn check_comms(&self, row: &impl Communicator, col: &impl Communicator) -> Result<()> {
        let ((pc, pf), (c, f)) = (self.shape, self.coords);
        if row.size() != pf || row.rank() != f || col.size() != pc || col.rank() != c {
            return Err(DistError::Training(format!(
                "block ({c}, {f}) of a {pc} × {pf} grid run with a row of {} ranks (rank {}) and \
                 a column of {} (rank {}); expected {pf} (rank {f}) and {pc} (rank {c})",
                row.size(),
                row.rank(),
                col.size(),
                col.rank()
            )));
        }
        Ok(())
    }

    /// This rank's block `f · pc + c` of the output channels (`N × K/P × spatial'`) from its
    /// block `c · pf + f` of the input channels `x` (`N × C/P × spatial`). Collective over the
    /// grid's `row` and `col` ([`ChannelGrid`]). With `train`, keeps what backward needs.
    pub fn forward(
        &mut self,
        row: &impl Communicator,
        col: &impl Communicator,
        x: Tensor,
        train: bool,
    ) -> Result<Tensor> {
        self.check_comms(row, col)?;
        let (pc, pf) = self.shape;
        let p = pc * pf;
        let shape = x.shape().to_vec();
        if shape.len() < 3 || shape[1] * p != self.in_channels {
            return Err(DistError::Training(format!(
                "x has shape {shape:?}, this block takes N × {} × spatial",
                self.in_channels / p
            )));
        }
        // (1) Input-channel block c of pc from the row's pf sub-blocks.
        let xc = allgather_channels(row, &x)?;
        // (2) Partial sums of filter block f over those channels.
        let t1 = self.conv.forward(xc, train)?;
        // (3) The sums over the column's channel blocks, scattered by output sub-block.
        let mut y = reduce_scatter_channels(col, &t1)?;
        add_bias(&mut y, self.bias.as_ref());
        if train {
            self.partial_shape = Some(t1.shape().to_vec());
        }
        Ok(y)
    }

    /// From this rank's block `f · pc + c` of `dy` (`N × K/P × spatial'`): the gradients of its
    /// weight block and bias block (overwritten), and its block `c · pf + f` of `dx` when
    /// `need_dx`. Collective over `row` and `col` (every rank passes the same `need_dx`).
    pub fn backward(
        &mut self,
        row: &impl Communicator,
        col: &impl Communicator,
        dy: Tensor,
        need_dx: bool,
    ) -> Result<Option<Tensor>> {
        self.check_comms(row, col)?;
        let partial = self
            .partial_shape
            .take()
            .ok_or_else(|| DistError::Training("backward without a training forward".into()))?;
        let mut expected = partial;
        expected[1] /= self.shape.0;
        check_dy(&dy, &expected)?;
        bias_grad(self.bias.as_mut(), &dy);
        // (4) Filter block f of dy from the column's pc sub-blocks.
        let dyf = allgather_channels(col, &dy)?;
        // (5) and (7): dx's partial sums over filter block f; this block's dw.
        let Some(dx) = self.conv.backward(dyf, need_dx)? else {
            return Ok(None);
        };
        // (6) The sums over the row's filter blocks, scattered by input sub-block.
        Ok(Some(reduce_scatter_channels(row, &dx)?))
    }

    /// `((pc, pf), (c, f))`: this is block `(c, f)` of a `pc × pf` grid.
    pub fn block(&self) -> ((usize, usize), (usize, usize)) {
        (self.shape, self.coords)
    }

    /// The input-channel block this rank takes and gives back as `dx`: `c · pf + f` of `pc · pf`.
    pub fn input_block(&self) -> usize {
        self.coords.0 * self.shape.1 + self.coords.1
    }

    /// The output-channel block this rank leaves: `f · pc + c` of `pc · pf`.
    pub fn output_block(&self) -> usize {
        self.coords.1 * self.shape.0 + self.coords.0
    }

    /// The local convolution: input channels block `c` to filters block `f`, no bias.
    pub fn local(&self) -> &Conv {
        &self.conv
    }

    /// The weight block (`K/pf × C/pc × kernel`) and the bias block (`K/(pc·pf)`), with
    /// PyTorch's names.
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

/// The communicators of a [`ChannelGrid`] over a grid row, with the row itself, [`register`]ed
/// with the current thread for the layers of [`crate::stationary_w_parallel`]. Not `Send`;
/// dropping it unregisters them.
pub struct GridRegistration {
    full: Registration,
    transposed: Registration,
    row: Registration,
    col: Registration,
    shape: (usize, usize),
    coords: (usize, usize),
}

impl GridRegistration {
    /// Arranges the ranks of the grid row `comm` as `pc × pf` ([`ChannelGrid::new`],
    /// collective) and registers the four communicators.
    ///
    /// Errors: as [`ChannelGrid::new`].
    pub fn new(comm: World, pc: usize, pf: usize) -> Result<Self> {
        let grid = ChannelGrid::new(&comm, pc, pf)?;
        let (shape, coords) = (grid.shape(), grid.coords());
        let (row, col, transposed) = grid.into_comms();
        Ok(GridRegistration {
            full: register(comm),
            transposed: register(transposed),
            row: register(row),
            col: register(col),
            shape,
            coords,
        })
    }

    /// The handles the distributed layers keep.
    pub fn handles(&self) -> GridHandles {
        GridHandles {
            full: self.full.handle(),
            transposed: self.transposed.handle(),
            row: self.row.handle(),
            col: self.col.handle(),
            shape: self.shape,
            coords: self.coords,
        }
    }

    /// The grid row's communicator in rank order (the one [`crate::save_channel_parallel`]
    /// gathers over).
    pub fn comm(&self) -> Rc<World> {
        self.full.comm()
    }
}

/// `Send` handles of a [`GridRegistration`]'s communicators, with the grid's shape and this
/// rank's coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridHandles {
    /// The grid row in rank order (`c · pf + f`).
    pub full: CommHandle,
    /// The grid row ordered by `f · pc + c`.
    pub transposed: CommHandle,
    /// This rank's grid row (same `c`).
    pub row: CommHandle,
    /// This rank's grid column (same `f`).
    pub col: CommHandle,
    /// `(pc, pf)`.
    pub shape: (usize, usize),
    /// This rank's `(c, f)`.
    pub coords: (usize, usize),
}

/// A [`StationaryWConv`] bound to registered row and column communicators: an [`nn::Layer`].
pub struct BoundW {
    layer: StationaryWConv,
    row: CommHandle,
    col: CommHandle,
}

impl BoundW {
    /// `layer` running over the communicators of `row` and `col` (its grid row and column).
    pub fn new(layer: StationaryWConv, row: CommHandle, col: CommHandle) -> Self {
        BoundW { layer, row, col }
    }

    /// The distributed operator.
    pub fn inner(&self) -> &StationaryWConv {
        &self.layer
    }

    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut StationaryWConv, &World, &World) -> Result<T>,
    ) -> nn::Result<T> {
        let comms = self.row.get().and_then(|r| Ok((r, self.col.get()?)));
        let (row, col) = comms.map_err(|e| to_nn(self.describe(), e))?;
        f(&mut self.layer, &row, &col).map_err(|e| to_nn(self.describe(), e))
    }
}

impl Layer for BoundW {
    fn describe(&self) -> String {
        let ((pc, pf), (c, f)) = self.layer.block();
        format!(
            "StationaryW({}, block ({c}, {f}) of {pc} × {pf})",
            self.layer.local().describe()
        )
    }

    fn forward(&mut self, x: Tensor, train: bool) -> nn::Result<Tensor> {
        self.run(|l, row, col| l.forward(row, col, x, train))
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> nn::Result<Option<Tensor>> {
        self.run(|l, row, col| l.backward(row, col, dy, need_dx))
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        self.layer.params()
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        self.layer.params_mut()
    }

    fn output_shape(&self, input: &[usize]) -> nn::Result<Vec<usize>> {
        // The row's allgather multiplies the channels by pf, the local convolution makes K/pf
        // filters, the column's reduce-scatter leaves K/(pc·pf) of them.
        let ((pc, pf), _) = self.layer.block();
        let mut gathered = input.to_vec();
        if let Some(c) = gathered.first_mut() {
            *c *= pf;
        }
        let mut out = self.layer.local().output_shape(&gathered)?;
        if let Some(k) = out.first_mut() {
            *k /= pc;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::single::SingleProcess;

    /// On a 1 × 1 grid the block is the whole layer.
    #[test]
    fn one_block_is_the_whole_layer() {
        let cfg = ConvConfig::conv2d(3, 4, 3).padding(1);
        let rng = &mut <SmallRng as rand::SeedableRng>::seed_from_u64(1);
        let mut full = Conv::new(cfg.clone(), ConvAlgo::Convgemm, rng).unwrap();
        let mut w =
            StationaryWConv::from_conv(&full, cfg, ConvAlgo::Convgemm, (1, 1), (0, 0)).unwrap();
        let x = Tensor::new(
            &[2, 3, 5, 4],
            (0..120).map(|v| (v % 7) as f32 - 3.0).collect(),
        )
        .unwrap();
        let s = SingleProcess;
        let y = w.forward(&s, &s, x.clone(), true).unwrap();
        assert_eq!(y, full.forward(x, true).unwrap());
        let dy = Tensor::new(y.shape(), (0..y.len()).map(|v| (v % 5) as f32).collect()).unwrap();
        let dx = w.backward(&s, &s, dy.clone(), true).unwrap().unwrap();
        assert_eq!(dx, full.backward(dy, true).unwrap().unwrap());
        for ((_, a), (_, b)) in w.params().iter().zip(full.params()) {
            assert_eq!(a.grad, b.grad);
        }
    }

    #[test]
    fn bad_blocks_and_grids_are_errors() {
        let cfg = ConvConfig::conv2d(4, 6, 3);
        let rng = &mut <SmallRng as rand::SeedableRng>::seed_from_u64(1);
        let full = Conv::new(cfg.clone(), ConvAlgo::Convgemm, rng).unwrap();
        let a = ConvAlgo::Convgemm;
        // 4 does not divide 6 output channels; (2, 0) is off a 2 × 1 grid.
        assert!(StationaryWConv::from_conv(&full, cfg.clone(), a, (2, 2), (0, 0)).is_err());
        assert!(StationaryWConv::from_conv(&full, cfg.clone(), a, (2, 1), (2, 0)).is_err());
        assert!(StationaryWConv::from_conv(&full, cfg.clone(), a, (0, 1), (0, 0)).is_err());
        let mut w = StationaryWConv::from_conv(&full, cfg, a, (2, 1), (0, 0)).unwrap();
        // A single process is not the column of a 2 × 1 grid.
        let s = SingleProcess;
        let x = Tensor::new(&[1, 2, 4, 4], vec![0.0; 32]).unwrap();
        assert!(w.forward(&s, &s, x, false).is_err());
        assert!(ChannelGrid::new(&s, 2, 1).is_err());
        let g = ChannelGrid::new(&s, 1, 1).unwrap();
        assert_eq!((g.shape(), g.coords()), ((1, 1), (0, 0)));
    }
}
