//! # nn: tensors, layers, models and the training loop
//!
//! Owns `Tensor`, the layer trait, models, losses, optimizers, data sets, checkpoints and the
//! training loop, and chooses the convolution algorithm for each layer.
//!
//! Layering: `core-blas` ← `conv-ops` ← `fastconv` ← **`nn`** ← `dist`.
