//! The one error type of `nn`.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong in `nn`: each variant names the offending argument, layer or file.
#[derive(Debug, Error)]
pub enum NnError {
    /// A layer defined outside this crate (e.g. a distributed layer of `dist`) failed.
    #[error("{layer}: {source}")]
    Layer {
        /// The layer's description.
        layer: String,
        /// What went wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A tensor has the wrong shape for the operation.
    #[error("{op}: `{arg}` has shape {got:?}, expected {expected}")]
    Shape {
        /// The operation or layer (`Conv2d`, `Linear`, `cross_entropy`, ...).
        op: String,
        /// The argument (`x`, `dy`, `labels`, ...).
        arg: &'static str,
        /// The shape that was given.
        got: Vec<usize>,
        /// What was expected, in words.
        expected: String,
    },
    /// A tensor's data does not match the product of its shape.
    #[error("tensor of shape {shape:?} needs {expected} values, got {got}")]
    DataLen {
        /// The shape.
        shape: Vec<usize>,
        /// Values given.
        got: usize,
        /// Values the shape needs.
        expected: usize,
    },
    /// `backward` was called on a layer that holds no forward state.
    #[error("{layer}: backward called without a preceding forward in training mode")]
    NoForward {
        /// The layer.
        layer: String,
    },
    /// A configuration value is out of range or unknown.
    #[error("invalid `{arg}`: {detail}")]
    Config {
        /// The argument (`batch_size`, `lr`, `model`, ...).
        arg: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// A class label is not below the number of classes.
    #[error("label {label} of sample {index} is out of range for {classes} classes")]
    Label {
        /// Position of the sample in the batch.
        index: usize,
        /// The label.
        label: usize,
        /// Number of classes (logits per sample).
        classes: usize,
    },
    /// The loss became NaN or infinite.
    #[error("the loss is not finite ({loss}) at step {step}: lower the learning rate")]
    NonFinite {
        /// The loss value.
        loss: f32,
        /// The optimizer step.
        step: usize,
    },
    /// A convolution (`conv-ops`) rejected its arguments.
    #[error("convolution: {0}")]
    Conv(#[from] conv_ops::ConvError),
    /// The Winograd convolution (`fastconv`) rejected its arguments.
    #[error("winograd convolution: {0}")]
    Fastconv(#[from] fastconv::FastconvError),
    /// A matrix product (`core-blas`) rejected its arguments.
    #[error("gemm: {0}")]
    Gemm(#[from] core_blas::Error),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A data file is malformed.
    #[error("data {source_name}, line {line}: {detail}")]
    Data {
        /// The file or embedded data set.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        detail: String,
    },
    /// A binary data file (MNIST's IDX, CIFAR-10's records) is missing or malformed.
    #[error("data file {path}: {detail}")]
    DataFile {
        /// The file (or the directory it was looked for in).
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// A tuning file (`auto`'s saved choices, [`crate::tuning`]) is malformed or names a choice
    /// that cannot run its geometry.
    #[error("tuning file {path}, line {line}: {detail}")]
    Tuning {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        detail: String,
    },
    /// A checkpoint is malformed or does not match the model.
    #[error("checkpoint {path}: {detail}")]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What was wrong (missing tensor, shape mismatch, ...).
        detail: String,
    },
}

/// `Result` with [`NnError`].
pub type Result<T, E = NnError> = std::result::Result<T, E>;

impl NnError {
    /// A [`NnError::Shape`] for `op`'s argument `arg`.
    pub fn shape(
        op: impl Into<String>,
        arg: &'static str,
        got: &[usize],
        expected: impl Into<String>,
    ) -> Self {
        NnError::Shape {
            op: op.into(),
            arg,
            got: got.to_vec(),
            expected: expected.into(),
        }
    }

    /// A [`NnError::NoForward`] for `layer`: its backward was called with no training forward
    /// before it (or twice after one).
    pub(crate) fn no_forward(layer: &(impl crate::layer::Layer + ?Sized)) -> Self {
        NnError::NoForward {
            layer: layer.describe(),
        }
    }

    /// `Ok` when `got` is `want`, else a [`NnError::Shape`] for `op`'s argument `arg` that
    /// expected `want`; `op` is called on the error path only (layers describe themselves there).
    pub(crate) fn expect_shape(
        op: impl FnOnce() -> String,
        arg: &'static str,
        got: &[usize],
        want: &[usize],
    ) -> Result<()> {
        if got == want {
            Ok(())
        } else {
            Err(NnError::shape(op(), arg, got, format!("{want:?}")))
        }
    }

    /// A [`NnError::Config`] for `arg`.
    pub fn config(arg: &'static str, detail: impl Into<String>) -> Self {
        NnError::Config {
            arg,
            detail: detail.into(),
        }
    }
}
