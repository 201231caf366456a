//! # nn: tensors, layers, models and the training loop
//!
//! Owns [`Tensor`], the [`Layer`] trait, [`Sequential`] models (nestable, with PyTorch's
//! parameter names), the cross-entropy loss, the [`Sgd`] optimizer, data sets (the `digits` set
//! ships inside the crate; MNIST, Fashion-MNIST and CIFAR-10 are read from their distribution
//! files; 3D `volumes` are generated; random crops and flips augment the training samples,
//! [`Augment`]), checkpoints and the training loop, and chooses the
//! convolution algorithm of each layer ([`ConvAlgo`]): Winograd (`fastconv`) where it applies and
//! pays, convgemm (`conv-ops`, no im2col workspace) elsewhere.
//!
//! [`build`] and [`build_with`] make the models of [`MODELS`]: LeNet-5, the CIFAR ResNet-20 and
//! VGG-16 of the benchmarks, torchvision's VGG-A (`vgg11`) and ResNet-18/34/50, and C3D, with
//! PyTorch's parameter names, so a PyTorch `state_dict` saved as safetensors loads into them
//! (`examples/src/bin/predict.rs`, `scripts/torchvision_check.py`).
//!
//! Layering: `core-blas` ← `conv-ops` ← `fastconv` ← **`nn`** ← `dist`.
//!
//! Conventions: row-major f32 tensors, activations `N × C × spatial` (1-3 spatial dimensions),
//! weights `K × C × kernel`, parameter names and initialisation as in PyTorch, so checkpoints
//! (safetensors) are exchangeable with PyTorch models of the same definition.
//!
//! ```
//! use nn::{ConvAlgo, Dataset, Sgd, TrainConfig, TrainState, build, fit};
//!
//! # fn main() -> nn::Result<()> {
//! // LeNet-5 on the shipped digits, served at LeNet's 28×28 input size.
//! let (train, test) = Dataset::digits()?.resized(28, 28)?.split(0.2, 0)?;
//! let mut model = build("lenet", ConvAlgo::Auto, 0)?;
//! let mut opt = Sgd::new(0.05, 0.9, 5e-4)?;
//! let cfg = TrainConfig { epochs: 1, max_steps: Some(5), batch_size: 32, ..Default::default() };
//! let (report, _) = fit(&mut model, &mut opt, &train, Some(&test), &cfg, TrainState::default(),
//!     |_, _, _, _| Ok(()))?;
//! assert_eq!(report.steps, 5);
//! assert!(report.train_loss.is_finite());
//! # Ok(())
//! # }
//! ```

pub mod checkpoint;
pub mod data;
mod error;
pub mod layer;
pub mod layers;
pub mod loss;
pub mod model;
pub mod optim;
mod par;
mod tensor;
pub mod train;
pub mod tuning;

pub use checkpoint::TrainState;
/// The conv-ops algorithm of each pass, as [`Conv::preset_in_use`] reports it.
pub use conv_ops::{BackwardDataAlgo, BackwardFilterAlgo, ForwardAlgo, Preset};
pub use data::{Augment, Dataset};
pub use error::{NnError, Result};
pub use layer::{AsAny, GradReady, Layer, Parameter, RngState};
pub use layers::{
    AdaptiveAvgPool, BasicBlock, BatchNorm, BnGrads, Conv, ConvAlgo, ConvConfig, Dropout, Flatten,
    GlobalAvgPool, Linear, MaxPool, Relu, Residual, StatsReduce,
};
pub use loss::{correct, cross_entropy};
pub use model::{LayerProfile, MODELS, ModelOptions, Sequential, build, build_with};
pub use optim::{LrSchedule, Sgd};
pub use tensor::{Tensor, release_buffers};
pub use train::{
    EpochReport, StepResult, TrainConfig, TrainReport, evaluate, fit, fit_with, local_step,
};
