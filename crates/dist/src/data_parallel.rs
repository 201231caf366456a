//! [`DataParallel`]: synchronous data-parallel SGD. Every rank holds a replica of the model,
//! computes the gradients of its shard of each mini-batch, and the gradients are averaged over
//! all ranks before every optimizer step, so all replicas take the same step as one process
//! training on the whole mini-batch.
//!
//! [`DataParallel::step`] overlaps the gradient exchange with backpropagation, as "Parallel CNN
//! training by overlapping computation and communication" does: the parameters are laid out in
//! backpropagation order (last layer first) and cut into chunks of at least
//! [`DataParallel::with_chunk`] values; a chunk's non-blocking allreduce is posted as soon as
//! backpropagation has produced all of its gradients, while the earlier layers still compute.

use std::collections::HashMap;
use std::ops::Range;

use nn::{Sequential, Sgd, StepResult, Tensor, correct, cross_entropy, local_step};

use crate::comm::Communicator;
use crate::error::{DistError, Result};

/// Default chunk: 256 Ki values (1 MiB of f32), large enough for the network's bandwidth and
/// small enough that the last layers' gradients leave early.
pub const DEFAULT_CHUNK: usize = 1 << 18;

/// Data parallelism over the ranks of a communicator.
pub struct DataParallel<'c, C: Communicator> {
    comm: &'c C,
    flat: Vec<f32>,
    stage: Vec<f32>,
    chunk: usize,
}

/// Where each parameter's gradient sits in the exchanged buffer, and the chunks.
struct Layout {
    /// Parameter name → its index in `model.params()` order.
    at: HashMap<String, usize>,
    /// (offset, length) of each parameter's gradient in the buffer, by index.
    span: Vec<(usize, usize)>,
    /// Chunk lengths, in buffer order.
    chunks: Vec<usize>,
    /// Chunk of each parameter (by `model.params()` index).
    chunk_of: Vec<usize>,
    /// Parameters per chunk.
    members: Vec<usize>,
    /// Start of each chunk in the buffer.
    starts: Vec<usize>,
}

impl Layout {
    /// Parameters in reverse order (backpropagation's), cut into chunks of at least `chunk`.
    fn of(model: &Sequential, chunk: usize) -> Layout {
        let params = model.params();
        let n = params.len();
        let (mut at, mut chunks, mut starts) = (HashMap::new(), Vec::new(), Vec::new());
        let (mut chunk_of, mut members, mut span) = (vec![0; n], Vec::new(), vec![(0, 0); n]);
        let (mut offset, mut open) = (0, 0);
        for (i, (name, p)) in params.iter().enumerate().rev() {
            if open == 0 {
                starts.push(offset);
                chunks.push(0);
                members.push(0);
            }
            let len = p.grad.len();
            at.insert(name.clone(), i);
            span[i] = (offset, len);
            chunk_of[i] = chunks.len() - 1;
            *chunks.last_mut().expect("opened above") += len;
            *members.last_mut().expect("opened above") += 1;
            offset += len;
            open += len;
            if open >= chunk.max(1) {
                open = 0;
            }
        }
        Layout {
            at,
            span,
            chunks,
            chunk_of,
            members,
            starts,
        }
    }
}

impl<'c, C: Communicator> DataParallel<'c, C> {
    /// Data parallelism over `comm` (usually the world), chunks of [`DEFAULT_CHUNK`] values.
    pub fn new(comm: &'c C) -> Self {
        DataParallel {
            comm,
            flat: Vec::new(),
            stage: Vec::new(),
            chunk: DEFAULT_CHUNK,
        }
    }

    /// Gradient chunks of at least `values` values (the last one may be smaller); `usize::MAX`
    /// sends everything as one chunk after backpropagation (no overlap), 1 one chunk per
    /// parameter tensor.
    pub fn with_chunk(mut self, values: usize) -> Self {
        self.chunk = values.max(1);
        self
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
        Ok(self.step_result(model, opt, x, labels)?.loss)
    }

    /// [`DataParallel::step`], also counting the samples of the whole mini-batch classified
    /// right (summed over the ranks with the loss, in the same allreduce).
    pub fn step_result(
        &mut self,
        model: &mut Sequential,
        opt: &mut Sgd,
        x: &Tensor,
        labels: &[usize],
    ) -> Result<StepResult> {
        let n = labels.len();
        if n == 0 {
            return Err(DistError::Training("an empty mini-batch".into()));
        }
        if x.shape().first() != Some(&n) {
            return Err(DistError::Training(format!(
                "{n} labels for inputs of shape {:?}",
                x.shape()
            )));
        }
        if self.comm.size() == 1 {
            // Nothing to average: plain training, without the exchange buffers (two more copies
            // of every gradient), e.g. over the sample column of a 1 × P channel or spatial grid.
            self.flat = Vec::new();
            self.stage = Vec::new();
            return Ok(local_step(model, opt, x.clone(), labels)?);
        }
        let rows = self.shard(n);
        let local = rows.len();
        // The loss and the number of right answers, summed over the ranks at the end.
        let mut loss = [0.0f32, 0.0];
        let layout = Layout::of(model, self.chunk);
        let total: usize = layout.chunks.iter().sum();
        self.flat.clear();
        self.flat.resize(total, 0.0);
        self.stage.clear();
        self.stage.resize(total, 0.0);
        // Every rank runs the model, a rank without samples (batch < ranks) on an empty shard:
        // layers with collectives inside (a synchronised batch norm, channel or spatial blocks)
        // need every rank of their communicator.
        let per = x.len() / n;
        let mut shape = x.shape().to_vec();
        shape[0] = local;
        let xs = Tensor::new(&shape, x.data()[rows.start * per..rows.end * per].to_vec())?;
        let logits = model.forward(xs, true)?;
        // The gradient of the whole batch's mean loss with respect to this shard's logits: the
        // shard's mean-loss gradient scaled by local / n, so every rank backpropagates on the
        // same scale (a synchronised batch norm sums `dy` across ranks) and the sum of the
        // ranks' parameter gradients is the whole batch's.
        let scale = local as f32 / n as f32;
        let mut dl = Some(if local > 0 {
            let (l, mut d) = cross_entropy(&logits, &labels[rows.clone()])?;
            loss[0] = l * scale;
            loss[1] = correct(&logits, &labels[rows]) as f32;
            d.data_mut().iter_mut().for_each(|g| *g *= scale);
            d
        } else {
            Tensor::zeros(logits.shape())
        });
        // Backpropagate, posting each chunk's sum as soon as its last gradient is final and every
        // earlier chunk is posted: chunks go out in index order on every rank (MPI matches
        // non-blocking collectives by posting order, and a block reports its parameters together,
        // which can complete a later chunk first).
        let mut left = layout.members.clone();
        let mut next = 0;
        let stage = &mut self.stage;
        let mut work = |poster: &mut dyn crate::comm::ChunkPoster| -> Result<()> {
            let Some(dl) = dl.take() else {
                return Ok(());
            };
            let mut failed: Option<DistError> = None;
            model.backward_notify(dl, &mut |name, p| {
                if failed.is_some() {
                    return;
                }
                let Some(&i) = layout.at.get(name) else {
                    failed = Some(DistError::Training(format!(
                        "backpropagation reported `{name}`, which is not a parameter of the model"
                    )));
                    return;
                };
                let (offset, len) = layout.span[i];
                stage[offset..offset + len].copy_from_slice(p.grad.data());
                let c = layout.chunk_of[i];
                let Some(l) = left[c].checked_sub(1) else {
                    failed = Some(DistError::Training(format!(
                        "backpropagation reported `{name}` twice"
                    )));
                    return;
                };
                left[c] = l;
                while next < left.len() && left[next] == 0 {
                    let range = layout.starts[next]..layout.starts[next] + layout.chunks[next];
                    let src = &stage[range];
                    if let Err(e) = poster.post(next, &mut |dst| dst.copy_from_slice(src)) {
                        failed = Some(e);
                        return;
                    }
                    next += 1;
                }
            })?;
            failed.map_or(Ok(()), Err)
        };
        self.comm
            .allreduce_sum_overlapped(&mut self.flat, &layout.chunks, &mut work)?;
        for (i, (_, p)) in model.params_mut().into_iter().enumerate() {
            let (offset, len) = layout.span[i];
            p.grad
                .data_mut()
                .copy_from_slice(&self.flat[offset..offset + len]);
        }
        opt.step(model.params_mut().into_iter().map(|(_, p)| p))?;
        self.comm.allreduce_sum(&mut loss)?;
        Ok(StepResult {
            loss: loss[0],
            // A count below 2^24, exact in f32.
            correct: Some(loss[1].round() as usize),
        })
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
