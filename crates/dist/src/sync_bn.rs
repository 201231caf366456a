//! [`SyncBatchNorm`]: batch normalisation whose training statistics span the ranks of a
//! communicator, and [`sync_batch_norm`], the model transform that puts it in place of every
//! batch norm.
//!
//! With data parallelism each replica sees a shard of the mini-batch; a plain batch norm would
//! normalise with the shard's mean and variance, so the replicas would not take the step one
//! process takes on the whole batch (PyTorch's `DistributedDataParallel` does that by default;
//! its `SyncBatchNorm` does what this module does). Here the per-channel sums of the forward
//! pass (Σx and the value count, then Σ(x − mean)²) and of the backward pass (Σdy, Σdy·x̂) are
//! summed over the communicator, so every shard is normalised with the whole batch's
//! statistics and its `dx` is its share of the whole batch's. The parameter gradients are the
//! shard's own sums, which the data-parallel trainer sums with every other gradient; under
//! spatial parallelism (rows of the same samples on the ranks of a grid row) they are summed
//! over that row first, as the split convolutions' weight gradients are.

use nn::{BatchNorm, BnGrads, Layer, Parameter, Residual, Sequential, Tensor};

use crate::comm::Communicator;
use crate::error::{DistError, Result};
use crate::layers::{CommHandle, to_nn};
use crate::runtime::World;

/// Batch normalisation with its statistics summed over the ranks of `stats` (see the module
/// documentation). Evaluation uses the running statistics, which are the same on every rank
/// because they are updated from the summed statistics.
pub struct SyncBatchNorm {
    bn: BatchNorm,
    stats: CommHandle,
    /// Where the parameter gradients are summed: `None` = not here (this rank's own sums; the
    /// data-parallel trainer sums them); `Some(h)` = over `h` (a spatial grid row).
    grads: Option<CommHandle>,
}

impl SyncBatchNorm {
    /// `bn` (its parameters and running statistics move in) with statistics summed over the
    /// communicator of `stats` and the parameter gradients left to the trainer: the layer of
    /// a data-parallel replica.
    pub fn new(bn: BatchNorm, stats: CommHandle) -> Self {
        SyncBatchNorm {
            bn,
            stats,
            grads: None,
        }
    }

    /// `bn` split by rows over the ranks of a grid row `row` (spatial parallelism): statistics
    /// and parameter gradients summed over the row.
    pub fn spatial(bn: BatchNorm, row: CommHandle) -> Self {
        SyncBatchNorm {
            bn,
            stats: row,
            grads: Some(row),
        }
    }

    /// The communicator the statistics are summed over.
    pub fn stats_comm(&self) -> CommHandle {
        self.stats
    }

    /// The same layer with its statistics summed over `stats` instead (the parameter
    /// gradients stay where they were summed).
    pub fn with_stats(self, stats: CommHandle) -> Self {
        SyncBatchNorm { stats, ..self }
    }

    /// The batch norm inside.
    pub fn inner(&self) -> &BatchNorm {
        &self.bn
    }

    fn comm(&self, h: CommHandle) -> nn::Result<std::rc::Rc<World>> {
        h.get().map_err(|e| to_nn(self.describe(), e))
    }
}

/// Sums `buf` over `comm` in f32 (the partial sums are f64; their f32 rounding is far below
/// the statistics' own rounding).
fn sum_over(comm: &World, buf: &mut [f64]) -> nn::Result<()> {
    let mut v: Vec<f32> = buf.iter().map(|&x| x as f32).collect();
    comm.allreduce_sum(&mut v)
        .map_err(|e| to_nn("SyncBatchNorm".into(), e))?;
    buf.iter_mut().zip(v).for_each(|(b, x)| *b = x as f64);
    Ok(())
}

impl Layer for SyncBatchNorm {
    fn describe(&self) -> String {
        format!("Sync{}", self.bn.describe())
    }

    fn forward(&mut self, x: Tensor, train: bool) -> nn::Result<Tensor> {
        if !train {
            return self.bn.forward(x, false);
        }
        let comm = self.comm(self.stats)?;
        self.bn
            .forward_reduced(x, true, &mut |b| sum_over(&comm, b))
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> nn::Result<Option<Tensor>> {
        let comm = self.comm(self.stats)?;
        let reduce = &mut |b: &mut [f64]| sum_over(&comm, b);
        match self.grads {
            // The statistics' communicator is the gradients': one reduction serves both.
            Some(g) if g == self.stats => {
                self.bn
                    .backward_reduced(dy, need_dx, reduce, BnGrads::Reduced)
            }
            None => self
                .bn
                .backward_reduced(dy, need_dx, reduce, BnGrads::Local),
            Some(g) => {
                let dx = self
                    .bn
                    .backward_reduced(dy, need_dx, reduce, BnGrads::Local)?;
                let row = self.comm(g)?;
                let mut flat: Vec<f32> = Vec::new();
                for (_, p) in self.bn.params() {
                    flat.extend_from_slice(p.grad.data());
                }
                row.allreduce_sum(&mut flat)
                    .map_err(|e| to_nn(self.describe(), e))?;
                let mut at = 0;
                for (_, p) in self.bn.params_mut() {
                    let n = p.grad.len();
                    p.grad.data_mut().copy_from_slice(&flat[at..at + n]);
                    at += n;
                }
                Ok(dx)
            }
        }
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        self.bn.params()
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        self.bn.params_mut()
    }

    fn buffers(&self) -> Vec<(String, &Tensor)> {
        self.bn.buffers()
    }

    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.bn.buffers_mut()
    }

    fn output_shape(&self, input: &[usize]) -> nn::Result<Vec<usize>> {
        self.bn.output_shape(input)
    }
}

/// `model` with the statistics of every batch norm summed over the communicator of `comm`:
/// each plain [`BatchNorm`] becomes a [`SyncBatchNorm`] (parameter gradients left to the
/// data-parallel trainer), and each [`SyncBatchNorm`] already there (a spatially split one)
/// sums its statistics over `comm` instead of its grid row. Residual blocks and nested
/// sequences are rewritten inside; every other layer, and every name, stays.
///
/// Which communicator: the ranks that hold different parts of the same batch norm input.
/// With [`crate::DataParallel`] over a grid's sample communicator, that communicator when the
/// grid's rows replicate the batch norms (data or channel parallelism), the whole grid when
/// the rows split them by rows (spatial parallelism). Every rank must rewrite its model the
/// same way, since the sums are collective.
///
/// Errors: [`DistError::Training`] when `model` cannot be rebuilt (a layer rejects its shape).
pub fn sync_batch_norm(model: Sequential, comm: CommHandle) -> Result<Sequential> {
    let mut out = if model.input_shape().is_empty() {
        Sequential::block()
    } else {
        Sequential::new(model.input_shape())
    };
    for (name, layer) in model.into_layers() {
        out = out.push_boxed(&name, sync_layer(layer, comm)?)?;
    }
    Ok(out)
}

fn sync_layer(layer: Box<dyn Layer>, comm: CommHandle) -> Result<Box<dyn Layer>> {
    let rewritten = layer.downcast_ref::<BatchNorm>().is_some()
        || layer.downcast_ref::<SyncBatchNorm>().is_some()
        || layer.downcast_ref::<Sequential>().is_some()
        || layer.downcast_ref::<Residual>().is_some();
    if !rewritten {
        return Ok(layer);
    }
    let any: Box<dyn std::any::Any> = layer.into_any();
    let any = match any.downcast::<BatchNorm>() {
        Ok(bn) => return Ok(Box::new(SyncBatchNorm::new(*bn, comm))),
        Err(other) => other,
    };
    let any = match any.downcast::<SyncBatchNorm>() {
        Ok(bn) => return Ok(Box::new(bn.with_stats(comm))),
        Err(other) => other,
    };
    let any = match any.downcast::<Sequential>() {
        Ok(seq) => return Ok(Box::new(sync_batch_norm(*seq, comm)?)),
        Err(other) => other,
    };
    match any.downcast::<Residual>() {
        Ok(block) => Ok(Box::new(block.try_map(|_, s| sync_batch_norm(s, comm))?)),
        Err(_) => Err(DistError::Training(
            "sync_batch_norm: a layer changed type while being rewritten".into(),
        )),
    }
}
