//! # fastconv: N-dimensional Winograd convolution with synthesized transforms
//!
//! The transforms Aᵀ, G, Bᵀ of F(m, r) are synthesized in exact rational arithmetic from a set of
//! interpolation points (Cook-Toom / Chinese remainder theorem), applied along every mode of an
//! N-dimensional tile, and the products of the transformed domain run as batched GEMMs.
//!
//! Layering: `core-blas` ← `conv-ops` ← **`fastconv`** ← `nn` ← `dist`.
//!
//! ```
//! use fastconv::{Point, WinogradPlan, WinogradTransform};
//! use conv_ops::ConvGeometry;
//!
//! // F(2, 3) from the points 0, 1, −1, ∞ (Lavin's), proved exactly on construction.
//! let pts = [Point::int(0), Point::int(1), Point::int(-1), Point::Infinity];
//! let t = WinogradTransform::synthesize(2, 3, &pts)?;
//! assert_eq!(t.bt().to_f32().data[..4], [1.0, 0.0, -1.0, 0.0]);
//!
//! // A 3×3 layer, tile chosen by the cost model; all three training passes.
//! let g = ConvGeometry::new(2, 8, 16, &[12, 12], &[3, 3])?.with_padding(&[1])?;
//! let mut plan = WinogradPlan::new(&g, None)?;
//! let (x, w) = (vec![0.5f32; g.x_len()], vec![0.25f32; g.w_len()]);
//! let mut y = vec![0.0f32; g.y_len()];
//! plan.forward(&x, &w, &mut y)?;
//! let mut dx = vec![0.0f32; g.x_len()];
//! plan.backward_data(&y, &w, &mut dx)?;
//! let mut dw = vec![0.0f32; g.w_len()];
//! plan.backward_filter(&x, &y, &mut dw)?;
//! // Interior outputs: 8 channels × 9 taps × 0.5 × 0.25.
//! assert!((y[13 + 12] - 9.0).abs() < 1e-4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
mod packed;
pub mod plan;
pub mod points;
pub mod rational;
pub mod synthesis;
mod tiled;

pub use accuracy::{ErrorStats, correlate_nd_f64, measure_error};
pub use cost::{CostModel, choose_tile};
pub use error::{FastconvError, Result};
pub use ntransform::{SparseTransform, TileTransforms, mode_n_product, multi_mode_product};
pub use plan::{WinogradPlan, release_workspaces, workspace_bytes};
pub use rational::Point;
pub use synthesis::{DenseMatrix, WinogradTransform};
pub use tiled::GemmPath;
