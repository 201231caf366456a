//! Checkpoints of channel-parallel models: the ranks of a grid row hold blocks of the split
//! convolutions' tensors ([`crate::channel_parallel`]); [`save_channel_parallel`] gathers the
//! whole tensors and writes the checkpoint one process would write, so a run resumes on any
//! grid, or on one process. Resuming loads that file into the whole model before it is split
//! (`nn::checkpoint::load`), then [`split_momentum`] cuts the optimizer's momentum buffers the
//! way the model was cut.

use std::path::Path;

use nn::checkpoint::{Snapshot, TrainState, save_snapshot};
use nn::{Sequential, Sgd, Tensor};

use crate::comm::Communicator;
use crate::error::{DistError, Result};
use crate::layers::ChannelPlan;
use crate::runtime::World;

impl ChannelPlan {
    /// The axis along which a channel-parallel model holds a block of parameter or buffer
    /// `name` (a dotted name of the whole model): 1 for the weight of a stationary-x
    /// convolution (split by input channels), 0 for a stationary-y convolution's weight (by
    /// filters), for the bias of either (by output channels) and for a split batch norm's
    /// weight, bias and running statistics; `None` for a tensor every rank holds whole.
    pub fn split_axis(&self, name: &str) -> Option<usize> {
        let (layer, param) = name.rsplit_once('.')?;
        let listed = |v: &[String]| v.iter().any(|l| l == layer);
        match param {
            "weight" | "bias" | "running_mean" | "running_var" if listed(&self.batch_norm) => {
                Some(0)
            }
            "weight" if listed(&self.channel) => Some(1),
            "weight" if listed(&self.filter) => Some(0),
            "bias" if listed(&self.channel) || listed(&self.filter) => Some(0),
            _ => None,
        }
    }
}

/// `(outer, dim, inner)` of `shape` around `axis`.
fn around(shape: &[usize], axis: usize) -> Result<(usize, usize, usize)> {
    if axis >= shape.len() {
        return Err(DistError::Training(format!(
            "axis {axis} of a tensor of shape {shape:?}"
        )));
    }
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    Ok((outer, shape[axis], inner))
}

/// The whole tensor of which every rank of `row` holds block `rank` along `axis` (equal
/// blocks, in rank order); collective over `row`.
fn gather_whole(row: &World, local: &[f32], shape: &[usize], axis: usize) -> Result<Tensor> {
    let (outer, dim, inner) = around(shape, axis)?;
    let parts = row.size();
    let mut blocks = vec![0.0f32; local.len() * parts];
    row.allgather(local, &mut blocks)?;
    let mut whole = vec![0.0f32; blocks.len()];
    let run = dim * inner;
    for (b, block) in blocks.chunks_exact(local.len().max(1)).enumerate() {
        for o in 0..outer {
            whole[(o * parts + b) * run..][..run].copy_from_slice(&block[o * run..][..run]);
        }
    }
    let mut whole_shape = shape.to_vec();
    whole_shape[axis] = dim * parts;
    Ok(Tensor::new(&whole_shape, whole)?)
}

/// Block `part` of `parts` along `axis` of `data` (whole shape `shape`).
fn block_of(
    data: &[f32],
    shape: &[usize],
    axis: usize,
    parts: usize,
    part: usize,
) -> Result<Vec<f32>> {
    let (outer, dim, inner) = around(shape, axis)?;
    if parts == 0
        || part >= parts
        || !dim.is_multiple_of(parts)
        || data.len() != outer * dim * inner
    {
        return Err(DistError::Training(format!(
            "block {part} of {parts} along axis {axis} of {} values of shape {shape:?}",
            data.len()
        )));
    }
    let run = dim / parts * inner;
    Ok((0..outer)
        .flat_map(|o| &data[(o * parts + part) * run..][..run])
        .copied()
        .collect())
}

/// Writes the checkpoint of the whole model of which `model` is this rank's channel-parallel
/// part ([`crate::channel_parallel`] with `plan`) over the grid row `row`: collective over
/// `row` (every rank of it calls); the rank passing `write` writes `path` (one rank of the
/// grid, e.g. the world's rank 0). The file equals the single-process checkpoint of the same
/// training, so `nn::checkpoint::load` reads it into the whole model.
///
/// Errors: [`DistError::Training`] when a split parameter's shape does not divide as the plan
/// says; communication and file errors.
pub fn save_channel_parallel(
    path: &Path,
    model: &Sequential,
    opt: &Sgd,
    state: TrainState,
    plan: &ChannelPlan,
    row: &World,
    write: bool,
) -> Result<()> {
    let local = Snapshot::of(model, opt, state);
    // The whole value and momentum of every split parameter (whole ones are borrowed as is).
    let mut gathered: Vec<Option<(Tensor, Option<Tensor>)>> = Vec::new();
    for ((name, value), momentum) in local.params.iter().zip(&local.momentum) {
        let Some(axis) = plan.split_axis(name) else {
            gathered.push(None);
            continue;
        };
        let whole = gather_whole(row, value.data(), value.shape(), axis)?;
        // Every rank has taken the same number of steps, so all or none have momentum.
        let m = if momentum.is_empty() {
            None
        } else {
            Some(gather_whole(row, momentum, value.shape(), axis)?)
        };
        gathered.push(Some((whole, m)));
    }
    // The whole running statistics of the split batch norms.
    let mut buffers: Vec<Option<Tensor>> = Vec::new();
    for (name, value) in &local.buffers {
        buffers.push(match plan.split_axis(name) {
            Some(axis) => Some(gather_whole(row, value.data(), value.shape(), axis)?),
            None => None,
        });
    }
    if !write {
        return Ok(());
    }
    let mut snap = local.clone();
    for (i, g) in gathered.iter().enumerate() {
        if let Some((whole, m)) = g {
            snap.params[i].1 = whole;
            snap.momentum[i] = m.as_ref().map_or(&[][..], |t| t.data());
        }
    }
    for (i, whole) in buffers.iter().enumerate() {
        if let Some(whole) = whole {
            snap.buffers[i].1 = whole;
        }
    }
    Ok(save_snapshot(path, &snap)?)
}

/// After a whole model's checkpoint was loaded into the whole model and optimizer and the
/// model was split into `model` (block `part` of `parts`, `plan`), cuts `opt`'s momentum
/// buffers of the split parameters to this rank's blocks. Buffers not yet created (no step
/// taken) stay empty.
///
/// Errors: [`DistError::Training`] when the buffers do not match the model's parameters.
pub fn split_momentum(
    opt: &mut Sgd,
    model: &Sequential,
    plan: &ChannelPlan,
    parts: usize,
    part: usize,
) -> Result<()> {
    let params = model.params();
    let mut buffers = opt.buffers().to_vec();
    if buffers.is_empty() {
        return Ok(());
    }
    if buffers.len() != params.len() {
        return Err(DistError::Training(format!(
            "{} momentum buffers for {} parameters",
            buffers.len(),
            params.len()
        )));
    }
    for ((name, p), buf) in params.iter().zip(&mut buffers) {
        let Some(axis) = plan.split_axis(name) else {
            continue;
        };
        if buf.is_empty() || buf.len() == p.value.len() {
            // Not created yet, or already this rank's block.
            continue;
        }
        let mut whole_shape = p.value.shape().to_vec();
        whole_shape[axis] *= parts;
        *buf = block_of(buf, &whole_shape, axis, parts, part)?;
    }
    opt.set_buffers(buffers);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SingleProcess;

    #[test]
    fn split_axes_follow_the_plan() {
        let plan = ChannelPlan {
            channel: vec!["2".into()],
            filter: vec!["features.5".into()],
            batch_norm: vec!["3.b1".into()],
            whole: vec!["0".into()],
        };
        assert_eq!(plan.split_axis("2.weight"), Some(1));
        assert_eq!(plan.split_axis("2.bias"), Some(0));
        assert_eq!(plan.split_axis("features.5.weight"), Some(0));
        assert_eq!(plan.split_axis("features.5.bias"), Some(0));
        assert_eq!(plan.split_axis("0.weight"), None);
        assert_eq!(plan.split_axis("12.weight"), None);
        assert_eq!(plan.split_axis("2"), None);
        for t in ["weight", "bias", "running_mean", "running_var"] {
            assert_eq!(plan.split_axis(&format!("3.b1.{t}")), Some(0));
            assert_eq!(plan.split_axis(&format!("3.b2.{t}")), None);
        }
    }

    #[test]
    fn blocks_and_their_gathering_invert() {
        // 2 × 6 × 2: blocks of 2 along axis 1 are values [o][2b..2b+2][..].
        let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let shape = [2, 6, 2];
        let b1 = block_of(&data, &shape, 1, 3, 1).unwrap();
        assert_eq!(b1, [4., 5., 6., 7., 16., 17., 18., 19.]);
        let b0 = block_of(&data, &shape, 0, 2, 1).unwrap();
        assert_eq!(b0, (12..24).map(|v| v as f32).collect::<Vec<_>>());
        assert!(
            block_of(&data, &shape, 1, 4, 0).is_err(),
            "6 rows in 4 blocks"
        );
        assert!(block_of(&data, &shape, 3, 2, 0).is_err(), "no axis 3");
        // One rank: the block is the whole.
        let world = World::Single(SingleProcess);
        let t = gather_whole(&world, &data, &shape, 1).unwrap();
        assert_eq!((t.shape(), t.data()), (&shape[..], &data[..]));
    }
}
