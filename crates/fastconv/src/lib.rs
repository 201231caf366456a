//! # fastconv: N-dimensional Winograd convolution with synthesized transforms
//!
//! The transforms Aᵀ, G, Bᵀ of F(m, r) are synthesized in exact rational arithmetic from a set of
//! interpolation points (Cook-Toom / Chinese remainder theorem), applied along every mode of an
//! N-dimensional tile, and the products of the transformed domain run as batched GEMMs.
//!
//! Layering: `core-blas` ← `conv-ops` ← **`fastconv`** ← `nn` ← `dist`.
//!
//! Modules:
//! - [`rational`]: exact rationals, interpolation [`Point`]s, polynomials over ℚ.
//! - [`synthesis`]: [`WinogradTransform::synthesize`] (Cook-Toom / CRT) and its exact self-proof.
//! - [`ntransform`]: sparse mode-n products and the N-d tile transforms ([`TileTransforms`]).
//! - [`points`]: candidate interpolation points, the error-minimising search, the error table.
//! - [`plan`]: [`WinogradPlan`], forward / backward-data / backward-filter for a `ConvGeometry`.
//! - [`cost`]: tile choice by a cost model.
//! - [`accuracy`]: f32 error of a transform against an f64 direct correlation.

pub mod accuracy;
pub mod cost;
pub mod error;
mod filter_grad;
pub mod ntransform;
pub mod plan;
pub mod points;
pub mod rational;
pub mod synthesis;
mod tiled;

pub use accuracy::{ErrorStats, correlate_nd_f64, measure_error};
pub use cost::{CostModel, choose_tile};
pub use error::{FastconvError, Result};
pub use ntransform::{SparseTransform, TileTransforms, mode_n_product, multi_mode_product};
pub use plan::WinogradPlan;
pub use rational::Point;
pub use synthesis::{DenseMatrix, WinogradTransform};
