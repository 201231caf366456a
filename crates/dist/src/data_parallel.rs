//! [`DataParallel`]: synchronous data-parallel SGD. Every rank holds a replica of the model,
//! computes the gradients of its shard of each mini-batch, and the gradients are averaged over
//! all ranks before every optimizer step, so all replicas take the same step as one process
//! training on the whole mini-batch.
//!
//! Gradients travel as one allreduce over all parameters concatenated (a single bucket), posted
//! after backpropagation: the overlap of communication with backpropagation is not done yet.

use std::ops::Range;

use nn::{Sequential, Sgd, Tensor, cross_entropy};

use crate::comm::Communicator;
use crate::error::{DistError, Result};

/// Data parallelism over the ranks of a communicator.
pub struct DataParallel<'c, C: Communicator> {
    comm: &'c C,
    flat: Vec<f32>,
}

impl<'c, C: Communicator> DataParallel<'c, C> {
    /// Data parallelism over `comm` (usually the world).
    pub fn new(comm: &'c C) -> Self {
        DataParallel {
            comm,
            flat: Vec::new(),
        }
    }

    /// The rows of a mini-batch of `batch` samples this rank trains on: contiguous, sizes
    /// differing by at most one between ranks (possibly empty when `batch < size`).
    pub fn shard(&self, batch: usize) -> Range<usize> {
        let (r, p) = (self.comm.rank(), self.comm.size());
        batch * r / p..batch * (r + 1) / p
    }

    /// Copies rank 0's parameters and buffers into every replica (collective), so all replicas
    /// start equal whatever their seeds.
    pub fn broadcast_model(&mut self, model: &mut Sequential) -> Result<()> {
        let mut flat: Vec<f32> = Vec::new();
        for (_, p) in model.params() {
            flat.extend_from_slice(p.value.data());
        }
        for (_, b) in model.buffers() {
            flat.extend_from_slice(b.data());
        }
        self.comm.broadcast(&mut flat, 0)?;
        let mut at = 0;
        for (_, p) in model.params_mut() {
            let n = p.value.len();
            p.value.data_mut().copy_from_slice(&flat[at..at + n]);
            at += n;
        }
        for (_, b) in model.buffers_mut() {
            let n = b.len();
            b.data_mut().copy_from_slice(&flat[at..at + n]);
            at += n;
        }
        Ok(())
    }

    /// Turns every parameter's gradient, a mean over this rank's `local` samples, into the mean
    /// over all ranks' `global` samples (collective): scale by `local / global`, sum over ranks.
    pub fn average_gradients(
        &mut self,
        model: &mut Sequential,
        local: usize,
        global: usize,
    ) -> Result<()> {
        if global == 0 || local > global {
            return Err(DistError::Training(format!(
                "{local} local of {global} global samples"
            )));
        }
        let scale = local as f32 / global as f32;
        self.flat.clear();
        for (_, p) in model.params() {
            self.flat.extend(p.grad.data().iter().map(|g| g * scale));
        }
        self.comm.allreduce_sum(&mut self.flat)?;
        let mut at = 0;
        for (_, p) in model.params_mut() {
            let n = p.grad.len();
            p.grad.data_mut().copy_from_slice(&self.flat[at..at + n]);
            at += n;
        }
        Ok(())
    }

    /// One synchronous step on the mini-batch `x` (`N × sample`), `labels` (N), identical on
    /// every rank: forward and backward on this rank's [`DataParallel::shard`], gradient
    /// averaging, then `opt`'s step. Returns the loss of the whole mini-batch (collective).
    pub fn step(
        &mut self,
        model: &mut Sequential,
        opt: &mut Sgd,
        x: &Tensor,
        labels: &[usize],
    ) -> Result<f32> {
        let n = labels.len();
        if x.shape().first() != Some(&n) {
            return Err(DistError::Training(format!(
                "{n} labels for inputs of shape {:?}",
                x.shape()
            )));
        }
        let rows = self.shard(n);
        let local = rows.len();
        let mut loss = [0.0f32];
        if local > 0 {
            let per = x.len() / n;
            let mut shape = x.shape().to_vec();
            shape[0] = local;
            let xs = Tensor::new(&shape, x.data()[rows.start * per..rows.end * per].to_vec())?;
            let logits = model.forward(xs, true)?;
            let (l, dl) = cross_entropy(&logits, &labels[rows])?;
            model.backward(dl)?;
            loss[0] = l * local as f32 / n as f32;
        } else {
            for (_, p) in model.params_mut() {
                p.grad.data_mut().fill(0.0);
            }
        }
        self.average_gradients(model, local, n)?;
        opt.step(model.params_mut().into_iter().map(|(_, p)| p))?;
        self.comm.allreduce_sum(&mut loss)?;
        Ok(loss[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SingleProcess;
    use nn::{ConvAlgo, Dataset, build};

    #[test]
    fn one_rank_is_plain_training_bit_for_bit() {
        let comm = SingleProcess;
        let data = Dataset::synthetic(16, &[1, 28, 28], 10, 1).unwrap();
        let (x, labels) = data.batches(16, None).unwrap().next().unwrap();
        let mut a = build("lenet", ConvAlgo::Convgemm, 0).unwrap();
        let mut b = build("lenet", ConvAlgo::Convgemm, 0).unwrap();
        let (mut oa, mut ob) = (
            Sgd::new(0.05, 0.9, 5e-4).unwrap(),
            Sgd::new(0.05, 0.9, 5e-4).unwrap(),
        );
        let mut dp = DataParallel::new(&comm);
        dp.broadcast_model(&mut a).unwrap();
        for _ in 0..3 {
            let la = dp.step(&mut a, &mut oa, &x, &labels).unwrap();
            let logits = b.forward(x.clone(), true).unwrap();
            let (lb, dl) = cross_entropy(&logits, &labels).unwrap();
            b.backward(dl).unwrap();
            ob.step(b.params_mut().into_iter().map(|(_, p)| p)).unwrap();
            assert_eq!(la, lb);
        }
        for ((n, p), (_, q)) in a.params().iter().zip(b.params()) {
            assert_eq!(p.value, q.value, "{n}");
        }
        assert_eq!(dp.shard(16), 0..16);
        assert!(
            dp.step(&mut a, &mut oa, &x, &labels[..3]).is_err(),
            "labels and inputs disagree"
        );
    }
}
