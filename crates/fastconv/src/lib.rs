//! # fastconv: N-dimensional Winograd convolution with synthesized transforms
//!
//! The transforms Aᵀ, G, Bᵀ of F(m, r) are synthesized in exact rational arithmetic from a set of
//! interpolation points (Cook-Toom / Chinese remainder theorem), applied along every mode of an
//! N-dimensional tile, and the products of the transformed domain run as batched GEMMs.
//!
//! Layering: `core-blas` ← `conv-ops` ← **`fastconv`** ← `nn` ← `dist`.
