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

pub mod error;
pub mod rational;
pub mod synthesis;

pub use error::{FastconvError, Result};
pub use rational::Point;
pub use synthesis::{DenseMatrix, WinogradTransform};
