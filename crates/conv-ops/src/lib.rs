//! # conv-ops: convolution for training without the im2col workspace
//!
//! Forward, backward-data and backward-filter convolution in 1, 2 and 3 spatial dimensions, as
//! explicit im2col + GEMM (the baseline), convgemm (im2col fused into the packing of B),
//! deconvgemm (col2im fused into the store of C) and Reindex + convgemm for the weight gradient
//! (Barrachina et al., "Convolution operators for CNN training via BLIS GEMM").
//!
//! Layering: `core-blas` ← **`conv-ops`** ← `fastconv` ← `nn` ← `dist`. Works on slices plus a
//! [`ConvGeometry`], never on `nn::Tensor`, so it can be used alone.
//!
//! ```
//! use conv_ops::{ConvGeometry, reference};
//! let g = ConvGeometry::new(1, 1, 1, &[4], &[3])?.with_padding(&[1])?;
//! let mut y = vec![0.0; g.y_len()];
//! reference::forward(&g, &[1., 2., 3., 4.], &[1., 1., 1.], None, &mut y)?;
//! assert_eq!(y, [3., 6., 9., 7.]);
//! # Ok::<(), conv_ops::ConvError>(())
//! ```

mod algo;
mod convgemm;
mod convgemm_trans;
mod deconvgemm;
mod error;
mod geometry;
pub mod im2col;
mod layout;
mod ops;
pub mod reference;
mod reindex;
mod source;
pub mod testing;

pub use algo::{
    BackwardDataAlgo, BackwardFilterAlgo, ForwardAlgo, Pass, Preset, Workspace, workspace_bytes,
};
pub use convgemm::Im2colB;
pub use convgemm_trans::Im2colTB;
pub use error::{ConvError, Result};
pub use geometry::{ConvGeometry, Dims3, MAX_RANK};
pub use ops::{backward_data, backward_filter, bias_grad, forward};
