//! Checkpoints: the model's parameters, the optimizer's state and the training position in one
//! safetensors file, written atomically.
//!
//! Tensor names are PyTorch's (`0.weight`, `3.bias`, `1.running_mean`, …), so
//! `safetensors.torch.load_file` gives a `state_dict` for the same `nn.Sequential` definition
//! (loaded with `strict=False`: batch norm's `num_batches_tracked` counters are not kept);
//! momentum buffers are stored as `optimizer.momentum.<name>`. The training position (`epoch`,
//! `step`) and the random generators' states (`rng.<name>` = `"<seed> <draws>"`, dropout's) are
//! metadata. The file is written next to its destination, flushed to disk,
//! then renamed over it: an interrupted or failed save leaves the previous checkpoint intact.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{NnError, Result};
use crate::layer::RngState;
use crate::model::Sequential;
use crate::optim::Sgd;
use crate::tensor::Tensor;

/// Where training stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TrainState {
    /// Epochs completed.
    pub epoch: usize,
    /// Optimizer steps taken.
    pub step: usize,
}

const MOMENTUM: &str = "optimizer.momentum.";
const RNG: &str = "rng.";

fn le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn ckpt_err(path: &Path, detail: impl Into<String>) -> NnError {
    NnError::Checkpoint {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> NnError + '_ {
    move |source| NnError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a checkpoint holds, borrowed: parameters and buffers by name, one momentum buffer per
/// parameter (in the same order; empty before the optimizer's first step), the random
/// generators' states and the training position. [`save`] takes it from a model; a
/// distributed trainer whose ranks hold slices assembles the whole tensors and writes them
/// with [`save_snapshot`].
#[derive(Debug, Clone)]
pub struct Snapshot<'a> {
    /// Parameter values, by name.
    pub params: Vec<(String, &'a Tensor)>,
    /// Non-trained state (batch norm's running statistics), by name.
    pub buffers: Vec<(String, &'a Tensor)>,
    /// Momentum of each parameter, aligned with `params` (empty: none yet).
    pub momentum: Vec<&'a [f32]>,
    /// Random generators' states, by name.
    pub rngs: Vec<(String, RngState)>,
    /// Where training stands.
    pub state: TrainState,
}

impl<'a> Snapshot<'a> {
    /// The snapshot of `model`, `opt` and `state`.
    pub fn of(model: &'a Sequential, opt: &'a Sgd, state: TrainState) -> Self {
        let params: Vec<(String, &Tensor)> = model
            .params()
            .into_iter()
            .map(|(n, p)| (n, &p.value))
            .collect();
        let momentum = (0..params.len())
            .map(|i| opt.buffers().get(i).map_or(&[][..], |b| b.as_slice()))
            .collect();
        Snapshot {
            params,
            buffers: model.buffers(),
            momentum,
            rngs: model.rng_states(),
            state,
        }
    }
}

/// Saves `model`, `opt`'s momentum buffers and `state` to `path` (atomically: temporary file,
/// fsync, rename).
pub fn save(path: &Path, model: &Sequential, opt: &Sgd, state: TrainState) -> Result<()> {
    save_snapshot(path, &Snapshot::of(model, opt, state))
}

/// Saves `snap` to `path` as [`save`] does.
///
/// Errors: [`NnError::Checkpoint`] when the momentum list does not match the parameters or a
/// momentum buffer has another length than its parameter; [`NnError::Io`] for the file.
pub fn save_snapshot(path: &Path, snap: &Snapshot) -> Result<()> {
    if snap.momentum.len() != snap.params.len() {
        let detail = format!(
            "{} momentum buffers for {} parameters",
            snap.momentum.len(),
            snap.params.len()
        );
        return Err(ckpt_err(path, detail));
    }
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = snap
        .params
        .iter()
        .map(|(name, v)| (name.clone(), v.shape().to_vec(), le_bytes(v.data())))
        .collect();
    for (name, b) in &snap.buffers {
        owned.push((name.clone(), b.shape().to_vec(), le_bytes(b.data())));
    }
    for ((name, v), buf) in snap.params.iter().zip(&snap.momentum) {
        if buf.is_empty() {
            continue;
        }
        if buf.len() != v.len() {
            let detail = format!(
                "momentum of `{name}` has {} values, not {}",
                buf.len(),
                v.len()
            );
            return Err(ckpt_err(path, detail));
        }
        owned.push((
            format!("{MOMENTUM}{name}"),
            v.shape().to_vec(),
            le_bytes(buf),
        ));
    }
    let views = owned
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| ckpt_err(path, format!("tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let state = snap.state;
    let mut meta = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("epoch".to_string(), state.epoch.to_string()),
        ("step".to_string(), state.step.to_string()),
    ]);
    for (name, r) in &snap.rngs {
        meta.insert(format!("{RNG}{name}"), format!("{} {}", r.seed, r.draws));
    }
    let bytes =
        safetensors::serialize(views, Some(meta)).map_err(|e| ckpt_err(path, e.to_string()))?;

    write_atomic(path, &bytes)
}

/// Writes `bytes` to `path` so that an interrupted or failed write leaves the previous file
/// intact: into a temporary file in the same directory, fsync, rename over `path`, fsync the
/// directory. The temporary file is removed on failure.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |e| NnError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a file path",
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        // Make the rename itself durable.
        fs::File::open(&dir)?.sync_all()
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io(e)
    })
}

/// Loads a checkpoint written by [`save`] into `model` and `opt`, returning the training
/// position. Every parameter of the model must be present with its shape; nothing is changed
/// unless the whole file matches.
pub fn load(path: &Path, model: &mut Sequential, opt: &mut Sgd) -> Result<TrainState> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| ckpt_err(path, format!("not a safetensors file: {e}")))?;
    let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let t = st
            .tensor(name)
            .map_err(|_| ckpt_err(path, format!("tensor `{name}` is missing")))?;
        if t.dtype() != Dtype::F32 || t.shape() != shape {
            return Err(ckpt_err(
                path,
                format!(
                    "tensor `{name}` is {:?} {:?}, the model has F32 {shape:?}",
                    t.dtype(),
                    t.shape()
                ),
            ));
        }
        Ok(t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    };
    let mut values = Vec::new();
    let mut buffers = Vec::new();
    for (name, p) in model.params() {
        values.push(read(&name, p.value.shape())?);
        let key = format!("{MOMENTUM}{name}");
        buffers.push(if st.names().contains(&key.as_str()) {
            read(&key, p.value.shape())?
        } else {
            Vec::new()
        });
    }
    let stats = model
        .buffers()
        .into_iter()
        .map(|(name, b)| read(&name, b.shape()))
        .collect::<Result<Vec<_>>>()?;
    let (_, header) =
        SafeTensors::read_metadata(&bytes).map_err(|e| ckpt_err(path, e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let field = |k: &str| -> Result<usize> {
        meta.get(k)
            .ok_or_else(|| ckpt_err(path, format!("metadata `{k}` is missing")))?
            .parse()
            .map_err(|_| ckpt_err(path, format!("metadata `{k}` is not a count")))
    };
    let state = TrainState {
        epoch: field("epoch")?,
        step: field("step")?,
    };
    // A generator missing from the file (one written before they were kept) keeps its state.
    let mut rngs = Vec::new();
    for (name, _) in model.rng_states() {
        let Some(v) = meta.get(&format!("{RNG}{name}")) else {
            rngs.push(None);
            continue;
        };
        let parsed = v
            .split_once(' ')
            .and_then(|(s, d)| Some((s.parse().ok()?, d.parse().ok()?)));
        let Some((seed, draws)) = parsed else {
            let detail = format!("metadata `{RNG}{name}` is `{v}`, expected `<seed> <draws>`");
            return Err(ckpt_err(path, detail));
        };
        rngs.push(Some(RngState { seed, draws }));
    }
    for ((_, p), v) in model.params_mut().into_iter().zip(values) {
        p.value.data_mut().copy_from_slice(&v);
    }
    for ((_, b), v) in model.buffers_mut().into_iter().zip(stats) {
        b.data_mut().copy_from_slice(&v);
    }
    for ((_, r), v) in model.rng_states_mut().into_iter().zip(rngs) {
        if let Some(v) = v {
            *r = v;
        }
    }
    if buffers.iter().any(|b| !b.is_empty()) {
        opt.set_buffers(buffers);
    }
    Ok(state)
}
