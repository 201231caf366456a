//! # core-blas: the GEMM everything fast stands on
//!
//! A BLIS-style single-precision matrix multiply: the five loops (jc, pc, ic, jr, ir), packing into
//! reusable aligned buffers, register-blocked micro-kernels per instruction set selected once at run
//! time, and rayon threads over the jc and ic loops.
//!
//! Layering: `core-blas` is the bottom crate. It knows matrices, nothing of convolution; its packing
//! and store steps are the extension points that `conv-ops` and `fastconv` plug into.
