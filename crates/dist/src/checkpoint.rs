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

/// How a channel-parallel model holds one tensor over the `P` ranks of a grid row: cut in
/// `blocks[0] × blocks[1]` equal blocks along its first two axes (a missing second axis counts
/// as 1), rank `q` holding block `index[q]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSplit {
    /// Blocks along axes 0 and 1.
    pub blocks: [usize; 2],
    /// The block of each rank of the row, in rank order.
    pub index: Vec<[usize; 2]>,
}

impl ChannelPlan {
    /// How the ranks of a `parts`-rank grid row hold parameter or buffer `name` (a dotted name
    /// of the whole model), `None` for a tensor every rank holds whole:
    /// - a stationary-x convolution's weight by input channels (axis 1), a stationary-y one's by
    ///   filters (axis 0), their biases and a split batch norm's tensors by channels, rank `q`
    ///   holding block `q`, or `f · pc + c` in [`ChannelPlan::transposed`] layers;
    /// - a stationary-w convolution's weight in `pf × pc` blocks (filters × channels), rank
    ///   `q = c · pf + f` holding `(f, c)`, and its bias block `f · pc + c`; on the transposed
    ///   grid `pc × pf` blocks, `(c, f)`, and bias block `q`.
    ///
    /// Errors: [`DistError::Training`] when the plan's grid does not have `parts` ranks.
    pub fn split(&self, name: &str, parts: usize) -> Result<Option<TensorSplit>> {
        let (pc, pf) = self.grid.unwrap_or((parts, 1));
        if pc * pf != parts {
            return Err(DistError::Training(format!(
                "a plan for a {pc} × {pf} grid used on {parts} ranks"
            )));
        }
        let Some((layer, param)) = name.rsplit_once('.') else {
            return Ok(None);
        };
        let listed = |v: &[String]| v.iter().any(|l| l == layer);
        let transposed = listed(&self.transposed);
        let coords = |q: usize| (q / pf, q % pf);
        // The channel block rank q holds in the layer's distribution.
        let block = |q: usize| {
            let (c, f) = coords(q);
            if transposed { f * pc + c } else { q }
        };
        let by = |axis: usize, ix: &dyn Fn(usize) -> usize| {
            let mut blocks = [1, 1];
            blocks[axis] = parts;
            Some(TensorSplit {
                blocks,
                index: (0..parts)
                    .map(|q| {
                        let mut i = [0, 0];
                        i[axis] = ix(q);
                        i
                    })
                    .collect(),
            })
        };
        Ok(match param {
            "weight" | "bias" | "running_mean" | "running_var" if listed(&self.batch_norm) => {
                by(0, &block)
            }
            "weight" if listed(&self.channel) => by(1, &block),
            "weight" if listed(&self.filter) => by(0, &block),
            "bias" if listed(&self.channel) || listed(&self.filter) => by(0, &block),
            "weight" if listed(&self.stationary_w) => Some(TensorSplit {
                blocks: if transposed { [pc, pf] } else { [pf, pc] },
                index: (0..parts)
                    .map(|q| {
                        let (c, f) = coords(q);
                        if transposed { [c, f] } else { [f, c] }
                    })
                    .collect(),
            }),
            "bias" if listed(&self.stationary_w) => by(0, &|q| {
                let (c, f) = coords(q);
                if transposed { q } else { f * pc + c }
            }),
            _ => None,
        })
    }
}

/// `(d0, d1, inner)` of `shape`: its first two axes (a missing second counts as 1) and the
/// product of the rest.
fn axes(shape: &[usize]) -> Result<(usize, usize, usize)> {
    match shape {
        [] => Err(DistError::Training("a split tensor without axes".into())),
        [d0] => Ok((*d0, 1, 1)),
        [d0, d1, rest @ ..] => Ok((*d0, *d1, rest.iter().product())),
    }
}

/// The offset in a `(d0, d1, inner)` tensor of row `a` of axis 0 and row `b` of axis 1.
fn at(d1: usize, inner: usize, a: usize, b: usize) -> usize {
    (a * d1 + b) * inner
}

/// The whole tensor of which every rank of `row` holds a block as `split` says (block shape
/// `shape`); collective over `row`.
fn gather_whole(
    row: &World,
    local: &[f32],
    shape: &[usize],
    split: &TensorSplit,
) -> Result<Tensor> {
    let (l0, l1, inner) = axes(shape)?;
    let parts = row.size();
    if split.index.len() != parts || local.len() != l0 * l1 * inner {
        return Err(DistError::Training(format!(
            "a block of {} values of shape {shape:?} split over {} ranks, the row has {parts}",
            local.len(),
            split.index.len()
        )));
    }
    let mut blocks = vec![0.0f32; local.len() * parts];
    row.allgather(local, &mut blocks)?;
    let (d0, d1) = (l0 * split.blocks[0], l1 * split.blocks[1]);
    let mut whole = vec![0.0f32; blocks.len()];
    for (q, block) in blocks.chunks_exact(local.len().max(1)).enumerate() {
        let [i0, i1] = split.index[q];
        for a in 0..l0 {
            for b in 0..l1 {
                whole[at(d1, inner, i0 * l0 + a, i1 * l1 + b)..][..inner]
                    .copy_from_slice(&block[at(l1, inner, a, b)..][..inner]);
            }
        }
    }
    let mut whole_shape = shape.to_vec();
    whole_shape[0] = d0;
    if let Some(d) = whole_shape.get_mut(1) {
        *d = d1;
    }
    Ok(Tensor::new(&whole_shape, whole)?)
}

/// Rank `q`'s block of `data` (whole shape `shape`) as `split` says.
fn block_of(data: &[f32], shape: &[usize], split: &TensorSplit, q: usize) -> Result<Vec<f32>> {
    let (d0, d1, inner) = axes(shape)?;
    let [b0, b1] = split.blocks;
    let bad = || {
        DistError::Training(format!(
            "rank {q}'s block of {b0} × {b1} of {} values of shape {shape:?}",
            data.len()
        ))
    };
    let &[i0, i1] = split.index.get(q).ok_or_else(bad)?;
    if b0 == 0
        || b1 == 0
        || i0 >= b0
        || i1 >= b1
        || !d0.is_multiple_of(b0)
        || !d1.is_multiple_of(b1)
        || data.len() != d0 * d1 * inner
    {
        return Err(bad());
    }
    let (l0, l1) = (d0 / b0, d1 / b1);
    let mut out = Vec::with_capacity(l0 * l1 * inner);
    for a in 0..l0 {
        for b in 0..l1 {
            out.extend_from_slice(&data[at(d1, inner, i0 * l0 + a, i1 * l1 + b)..][..inner]);
        }
    }
    Ok(out)
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
        let Some(split) = plan.split(name, row.size())? else {
            gathered.push(None);
            continue;
        };
        let whole = gather_whole(row, value.data(), value.shape(), &split)?;
        // Every rank has taken the same number of steps, so all or none have momentum.
        let m = if momentum.is_empty() {
            None
        } else {
            Some(gather_whole(row, momentum, value.shape(), &split)?)
        };
        gathered.push(Some((whole, m)));
    }
    // The whole running statistics of the split batch norms.
    let mut buffers: Vec<Option<Tensor>> = Vec::new();
    for (name, value) in &local.buffers {
        buffers.push(match plan.split(name, row.size())? {
            Some(split) => Some(gather_whole(row, value.data(), value.shape(), &split)?),
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
/// model was split into `model` (by rank `part` of a grid row of `parts` ranks, `plan`), cuts `opt`'s momentum
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
        let Some(split) = plan.split(name, parts)? else {
            continue;
        };
        if buf.is_empty() || buf.len() == p.value.len() {
            // Not created yet, or already this rank's block.
            continue;
        }
        let mut whole_shape = p.value.shape().to_vec();
        whole_shape[0] *= split.blocks[0];
        if let Some(d) = whole_shape.get_mut(1) {
            *d *= split.blocks[1];
        }
        *buf = block_of(buf, &whole_shape, &split, part)?;
    }
    opt.set_buffers(buffers);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SingleProcess;

    #[test]
    fn splits_follow_the_plan() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let plan = ChannelPlan {
            channel: names(&["2"]),
            filter: names(&["features.5"]),
            batch_norm: names(&["3.b1"]),
            whole: names(&["0"]),
            ..ChannelPlan::default()
        };
        let axis = |name: &str| {
            plan.split(name, 2).unwrap().map(|s| {
                assert_eq!(s.index.len(), 2);
                usize::from(s.blocks == [1, 2])
            })
        };
        assert_eq!(axis("2.weight"), Some(1));
        assert_eq!(axis("2.bias"), Some(0));
        assert_eq!(axis("features.5.weight"), Some(0));
        assert_eq!(axis("features.5.bias"), Some(0));
        assert_eq!(axis("0.weight"), None);
        assert_eq!(axis("12.weight"), None);
        assert_eq!(axis("2"), None);
        for t in ["weight", "bias", "running_mean", "running_var"] {
            assert_eq!(axis(&format!("3.b1.{t}")), Some(0));
            assert_eq!(axis(&format!("3.b2.{t}")), None);
        }
        // A 2 × 3 stationary-w grid: rank q = 3c + f.
        let plan = ChannelPlan {
            stationary_w: names(&["a", "b"]),
            batch_norm: names(&["n"]),
            transposed: names(&["b", "n"]),
            grid: Some((2, 3)),
            ..ChannelPlan::default()
        };
        assert!(plan.split("a.weight", 4).is_err(), "6 ranks in the grid");
        let a = plan.split("a.weight", 6).unwrap().unwrap();
        assert_eq!(a.blocks, [3, 2]);
        assert_eq!(a.index[4], [1, 1]); // q = 4: (c, f) = (1, 1)
        assert_eq!(a.index[2], [2, 0]); // (0, 2)
        let ab = plan.split("a.bias", 6).unwrap().unwrap();
        assert_eq!(ab.index[2], [4, 0]); // f·pc + c = 2·2 + 0
        let b = plan.split("b.weight", 6).unwrap().unwrap();
        assert_eq!((b.blocks, b.index[2]), ([2, 3], [0, 2]));
        assert_eq!(plan.split("b.bias", 6).unwrap().unwrap().index[2], [2, 0]);
        assert_eq!(plan.split("n.weight", 6).unwrap().unwrap().index[2], [4, 0]);
    }

    #[test]
    fn blocks_and_their_gathering_invert() {
        // 2 × 6 × 2: blocks of 2 along axis 1 are values [o][2b..2b+2][..].
        let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let shape = [2, 6, 2];
        let along = |axis: usize, parts: usize| {
            let mut blocks = [1, 1];
            blocks[axis] = parts;
            TensorSplit {
                blocks,
                index: (0..parts)
                    .map(|q| if axis == 0 { [q, 0] } else { [0, q] })
                    .collect(),
            }
        };
        let b1 = block_of(&data, &shape, &along(1, 3), 1).unwrap();
        assert_eq!(b1, [4., 5., 6., 7., 16., 17., 18., 19.]);
        let b0 = block_of(&data, &shape, &along(0, 2), 1).unwrap();
        assert_eq!(b0, (12..24).map(|v| v as f32).collect::<Vec<_>>());
        assert!(
            block_of(&data, &shape, &along(1, 4), 0).is_err(),
            "6 rows in 4 blocks"
        );
        // A 2 × 3 grid of blocks: block (1, 2) is row 1, columns 4..6.
        let grid = TensorSplit {
            blocks: [2, 3],
            index: vec![[1, 2]],
        };
        assert_eq!(
            block_of(&data, &shape, &grid, 0).unwrap(),
            [20., 21., 22., 23.]
        );
        assert!(block_of(&data, &shape, &grid, 1).is_err(), "no rank 1");
        // One rank: the block is the whole.
        let world = World::Single(SingleProcess);
        let t = gather_whole(&world, &data, &shape, &along(1, 1)).unwrap();
        assert_eq!((t.shape(), t.data()), (&shape[..], &data[..]));
    }
}
