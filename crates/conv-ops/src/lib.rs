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
//! A training step of one layer with the memory-lean preset `cgt+dg` (convgemm forward,
//! deconvgemm backward-data, transposed convgemm backward-filter: no workspace that grows with
//! the batch), checked against the naive reference:
//!
//! ```
//! use conv_ops::{ConvGeometry, Preset, Workspace, reference, testing::Tolerance};
//!
//! // 2 images, 3 → 4 channels, 9×9, 3×3 kernel, padding 1.
//! let g = ConvGeometry::new(2, 3, 4, &[9, 9], &[3, 3])?.with_padding(&[1])?;
//! let (x, w) = (vec![0.5; g.x_len()], vec![0.25; g.w_len()]);
//! let bias = vec![0.1; g.out_channels()];
//! let preset: Preset = "cgt+dg".parse()?;
//! let mut ws = Workspace::for_preset(&preset);
//!
//! let mut y = vec![0.0; g.y_len()];
//! conv_ops::forward(&g, &x, &w, Some(&bias), true, &mut y, preset.forward, &mut ws)?;
//! let dy = vec![1.0; g.y_len()];
//! let mut dx = vec![0.0; g.x_len()];
//! conv_ops::backward_data(&g, &dy, &w, &mut dx, preset.backward_data, &mut ws)?;
//! let mut dw = vec![0.0; g.w_len()];
//! conv_ops::backward_filter(&g, &x, &dy, &mut dw, preset.backward_filter, &mut ws)?;
//! assert_eq!(ws.peak_bytes(), 0);
//!
//! let mut want = vec![0.0; g.y_len()];
//! reference::forward(&g, &x, &w, Some(&bias), &mut want)?;
//! // The fused ReLU is a no-op here: every output is positive.
//! Tolerance::for_f32_sum(27).check("y", &y, &want).expect("matches the reference");
//! # Ok::<(), conv_ops::ConvError>(())
//! ```

mod algo;
mod bf_blocked;
mod convgemm;
mod convgemm_trans;
mod deconvgemm;
mod direct;
mod error;
mod flipped;
mod geometry;
pub mod im2col;
mod layout;
mod ops;
mod phased;
mod phasesplit;
pub mod reference;
mod reindex;
mod shares;
mod source;
mod subsample;
mod tapsum;
mod tapwise;
pub mod testing;

pub use algo::{
    BackwardDataAlgo, BackwardFilterAlgo, ForwardAlgo, Pass, Preset, Workspace, direct_applies,
    workspace_bytes,
};
pub use convgemm::{Im2colB, PANEL_TABLE_BYTES};
pub use convgemm_trans::Im2colTB;
pub use error::{ConvError, Result};
pub use flipped::transposed_geometry;
pub use geometry::{ConvGeometry, Dims3, MAX_RANK};
pub use ops::{backward_data, backward_filter, bias_grad, forward};

/// Frees conv-ops' per-thread buffers (the panel tables of [`Im2colB`] ([`panel_table_bytes`]),
/// the chunk table and runs of [`Im2colTB`] (the transposed convgemm's B),
/// the direct convolution's padded copies and packed weights, the C panels of deconvgemm and the small-plane forward, the tap-by-tap forms'
/// copies, the subsampled inputs, the stride-phase copies of strided inputs, the blocked
/// backward-filter's position-major copies of 3-D inputs, the per-image forward's slab weights)
/// on the calling thread and on every thread of the current
/// rayon pool; returns the bytes freed. They grow to the largest layer a thread has run and
/// stay at that size, so that the next call allocates nothing. For a caller that ran large
/// layers or algorithms once and will not again (`nn`'s `auto` algorithm choice tries every
/// candidate on every layer): the next call grows them again to what it needs; results do not
/// change. A buffer in use by a pass running at the time (on another thread) is left as it is.
/// The packing buffers of the GEMMs are core-blas's ([`core_blas::pack::release_workspaces`]).
pub fn release_workspaces() -> usize {
    let release = || {
        bf_blocked::release_thread()
            + convgemm::release_thread()
            + convgemm_trans::release_thread()
            + direct::release_thread()
            + layout::release_thread()
            + ops::release_thread()
            + phasesplit::release_thread()
            + subsample::release_thread()
            + tapsum::release_thread()
            + tapwise::release_thread()
    };
    let pool: usize = rayon::broadcast(|_| release()).into_iter().sum();
    if rayon::current_thread_index().is_some() {
        pool
    } else {
        pool + release()
    }
}

/// Bytes held right now by the tables of the panels [`Im2colB`] packs (where each full panel's
/// columns read x, cached per panel position so that every image and every block of rows
/// reuses them) on the calling thread and on every thread of the current rayon pool (the
/// calling thread once if it is one of them). Per thread they take at most
/// [`PANEL_TABLE_BYTES`] (all views together, whatever the batch and the layer), plus the runs
/// of the one block of B a prefetch hint covers (strided layers; at most one run per column of
/// a block of B); tables in use by a pass running at the time count 0. [`release_workspaces`]
/// frees them with conv-ops' other per-thread buffers.
pub fn panel_table_bytes() -> usize {
    let pool: usize = rayon::broadcast(|_| convgemm::thread_table_bytes())
        .into_iter()
        .sum();
    if rayon::current_thread_index().is_some() {
        pool
    } else {
        pool + convgemm::thread_table_bytes()
    }
}

/// Takes this thread's buffer out of `key` and returns its bytes (`bytes` of it), or 0 when a
/// call on this thread is using it: each module's part of [`release_workspaces`].
fn take_thread_buffer<T: Default>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<T>>,
    bytes: impl FnOnce(T) -> usize,
) -> usize {
    key.with(|c| {
        c.try_borrow_mut()
            .map_or(0, |mut v| bytes(std::mem::take(&mut *v)))
    })
}

/// Bytes of a vector's capacity.
fn bytes_of<T>(v: &Vec<T>) -> usize {
    v.capacity() * size_of::<T>()
}

/// Bytes of a buffer of f32 values (its capacity).
fn vec_bytes(v: Vec<f32>) -> usize {
    4 * v.capacity()
}
