//! # conv-ops: convolution for training without the im2col workspace
//!
//! Forward, backward-data and backward-filter convolution in 1, 2 and 3 spatial dimensions, as
//! explicit im2col + GEMM (the baseline), convgemm (im2col fused into the packing of B),
//! deconvgemm (col2im fused into the store of C) and Reindex + convgemm for the weight gradient.
//!
//! Layering: `core-blas` ← **`conv-ops`** ← `fastconv` ← `nn` ← `dist`. Works on slices plus a
//! [`ConvGeometry`]-style descriptor, never on `nn::Tensor`.
