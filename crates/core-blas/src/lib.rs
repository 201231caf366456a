//! # core-blas: the GEMM everything fast stands on
//!
//! A BLIS-style single-precision matrix multiply: the five loops (jc, pc, ic, jr, ir), packing into
//! reusable 64-byte aligned buffers, register-blocked micro-kernels per instruction set selected
//! once at run time, and rayon threads over the jc and ic loops.
//!
//! Layering: `core-blas` is the bottom crate. It knows matrices, nothing of convolution; its packing
//! and store steps are the extension points that `conv-ops` and `fastconv` plug into.
//!
//! ## Entry points
//! - [`sgemm`]: the cblas row-major contract, `C := alpha · op(A) · op(B) + beta · C`.
//! - [`gemm()`]: the same on strided views ([`MatRef`], [`MatMut`]: any row and column stride).
//! - [`gemm_with`]: A and B from any [`PackA`] / [`PackB`] source, C through any [`Store`].
//! - [`sgemm_batched`], [`Gemm::gemm_batched_with`]: many independent products of one shape
//!   (Winograd's α^N products) under one parallel schedule.
//! - [`gemm_packed_batched`]: many small products whose operands the caller already holds in the
//!   micro-kernel's panel layout ([`mod@packed`]): no packing, no driver, on the calling thread;
//!   [`pack_rows`] writes rows into that layout (8 × 8 register transposes);
//!   [`gemm_rowa_batched`] reads A row-major in place instead.
//! - [`small_a_rows`], [`small_a_strided`]: `Y := A · X` for a tiny A (at most 16 × 16) and long
//!   rows of X and Y, vectorised, no packing (the Winograd transforms of fastconv); [`SmallA`]
//!   prepares such an A once for many products.
//! - [`gather_pieces`]: a vectorised gather of short strided pieces (stride 2: a deinterleave)
//!   into a packed block, for custom packers.
//! - [`transpose_lanes`]: a vectorised transposing copy (lanes along k into packed panel rows)
//!   for custom packers in crates that may not use intrinsics; [`deinterleave`]: groups of `m`
//!   interleaved values split into `m` rows (8 × 8 register transposes; fastconv's gathers).
//! - [`offset_tile`], [`offset_dot_tile`]: register tiles whose operand is read in place at a
//!   per-step offset from each run's base (no packing): the direct-convolution kernels, for
//!   crates that may not use intrinsics ([`mod@offset`]); [`offset_a_tile`] /
//!   [`offset_a_store`]: the same with the in-place operand broadcast per pixel (any pixel
//!   bases) against a packed Wᵀ panel of 16 channels.
//! - [`AlignedVec`]: a growable f32 buffer on a 64-byte boundary (vector loads never straddle
//!   two cache lines on rows a multiple of 16 floats apart), for operands of the kernels above.
//! - [`mod@vector`]: level-1 kernels for element-wise layers (sums and dots in f64, batch norm,
//!   ReLU with a bit mask, in-place add), one table of function pointers per family ([`Vector`]).
//! - [`isa()`]: the kernel in use; [`Gemm`] builds a context for a chosen family ([`Isa`]) or block
//!   sizes ([`BlockSizes`]); [`peak::fma_peak_gflops`] measures the FMA roofline.
//!
//! ## Kernel families
//! `scalar` (portable, every target; it serves aarch64: no NEON family is built because no aarch64
//! target could be installed to test one), `avx2` (AVX2 + FMA) and `avx512` (AVX-512F). The best
//! available is chosen once; `CORE_BLAS_ISA=scalar|avx2|avx512|neon` forces one and every entry
//! point returns [`Error::IsaUnavailable`] if the CPU lacks it. Kernels are named
//! `{family}-f32-{MR}x{NR}`. All variables are listed in [`mod@isa`]'s documentation.
//!
//! ## Extension-point contract
//! - **B source** ([`PackB`]): asked to pack the `kc × nc` block at `(pc, jc)` into `NR`-wide
//!   micro-panels (row `p` of a panel = `NR` consecutive values of row `pc + p`, zero-padded). This is
//!   where convgemm reads im2col(x) straight from a tensor. **A source** ([`PackA`]): the same for
//!   `mc × kc` blocks at `(ic, pc)` in `MR`-tall micro-panels; an A source that keeps its matrix
//!   packed once hands its panels over in place ([`PackA::packed_a`], no copy). Layouts: [`mod@pack`].
//! - **Store** ([`Store`]): receives each `MR × NR` micro-tile of the product with its `(i, j)`
//!   coordinates and k-pass flags ([`Tile`]); it may scatter through an index map (col2im for
//!   deconvgemm), add a bias, apply ReLU. [`DenseStore`] (alpha/beta, [`Bias`], ReLU) is the
//!   default and writes from registers straight into C; a custom store whose tiles land in dense
//!   blocks (channel-major planes) gets the same path per tile through [`Store::window`]. Concurrency and k-pass rules: [`mod@store`].
//! - Sources and stores are generic parameters: the driver is monomorphized per kernel family and
//!   per source/store type, so the dense defaults cost nothing for being generic.
//!
//! ## Threads
//! rayon's current pool (`RAYON_NUM_THREADS`). Products below about 2·10⁶ multiply-adds, and every
//! product in a 1-thread pool, run on the calling thread without any rayon dispatch. A process
//! that has its CPUs to itself can bind its pool's workers to them ([`bind_workers`]), so that a
//! worker woken for a product is woken on its own CPU.
//!
//! ## Example
//! ```
//! use core_blas::{Bias, DenseStore, MatMut, MatRef};
//!
//! // C (2×2) = A (2×3) · B (3×2), row-major.
//! let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let mut c = [f32::NAN; 4]; // beta = 0 never reads C
//! core_blas::sgemm(false, false, 2, 2, 3, 1.0, &a, 3, &b, 2, 0.0, &mut c, 2)?;
//! assert_eq!(c, [4.0, 5.0, 10.0, 11.0]);
//!
//! // The same through the generic entry point, with a per-row bias and ReLU fused into the store.
//! let bias = [-10.0, 0.0];
//! let mut c2 = [0.0; 4];
//! let mut store = DenseStore::new(MatMut::row_major("c", &mut c2, 2, 2, 2)?, 1.0, 0.0)
//!     .with_bias(Bias::PerRow(&bias))?
//!     .with_relu();
//! let a = MatRef::row_major("a", &a, 2, 3, 3)?;
//! let b = MatRef::row_major("b", &b, 3, 2, 2)?;
//! core_blas::gemm_with(&a, &b, &mut store)?;
//! assert_eq!(c2, [0.0, 0.0, 10.0, 11.0]);
//! println!("kernel: {}", core_blas::isa()?);
//! # Ok::<(), core_blas::Error>(())
//! ```

mod aligned;
mod bind;
mod blocking;
mod crew;
mod driver;
mod error;
mod gather;
mod gemm;
pub mod isa;
mod kernel;
pub mod offset;
pub mod pack;
pub mod packed;
pub mod peak;
mod small;
pub mod store;
mod transpose;
pub mod vector;
mod view;

pub use aligned::AlignedVec;
pub use bind::{allowed_cpus, bind_workers};
pub use blocking::{BlockSizes, CacheSizes};
pub use error::Error;
pub use gather::{Piece, gather_pieces};
pub use gemm::Gemm;
pub use isa::{Isa, isa};
pub use kernel::convpack::{CHUNK_LANES, Chunk, ConvPack, ConvPanel};
pub use offset::{
    DOT_MR, DOT_NC, DotTile, OFFSET_A_MR, OFFSET_A_NR, OFFSET_LANES, OFFSET_MR, OFFSET_NV,
    OffsetAStore, OffsetATile, OffsetTile, Offsets, WIDE_LANES, WIDE_MR, WIDE_NV, WideTile,
    offset_a_shape, offset_a_store, offset_a_tile, offset_dot_rows, offset_dot_tile, offset_tile,
    offset_tile_vectors, offset_wide_tile, wide_tile_vectors,
};
pub use pack::{PackA, PackB};
pub use packed::{PackedOperand, gemm_packed_batched, gemm_rowa_batched, pack_rows};
pub use small::{SMALL_MAX, SmallA, small_a_rows, small_a_strided};
pub use store::{Bias, DenseStore, Store, Tile, Window};
pub use transpose::{deinterleave, transpose_lanes};
pub use vector::Vector;
pub use view::{MatMut, MatRef};

/// Probes only (`examples/ukr_ab.rs`): the full tiles of `avx512-f32-8x48` run on the assembly
/// k-loop (0, the default; 2: other rows as embedded broadcasts) or on the intrinsics body (1).
#[doc(hidden)]
#[cfg(target_arch = "x86_64")]
pub fn __set_ukr_variant(v: u8) {
    kernel::skx::UKR_VARIANT.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// Probes only: the driver's copies ahead (0 the default, 1 none, `2 + near + 256 · far`: the
/// rows ahead prefetched into L1 and toward L2).
#[doc(hidden)]
pub fn __set_copy_probe(v: usize) {
    driver::tune::COPY_PROBE.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// Probes only: 1 turns the driver's streamed C off.
#[doc(hidden)]
pub fn __set_stream_probe(v: usize) {
    driver::tune::STREAM_PROBE.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// cblas row-major `sgemm` with the process-wide kernel: `C := alpha · op(A) · op(B) + beta · C`,
/// `op(A)` `m × k`, `op(B)` `k × n`. See [`Gemm::sgemm`].
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    transa: bool,
    transb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) -> Result<(), Error> {
    Gemm::global()?.sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
}

/// `C := alpha · A · B + beta · C` on strided views with the process-wide kernel. See [`Gemm::gemm`].
pub fn gemm(
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: MatMut<'_>,
) -> Result<(), Error> {
    Gemm::global()?.gemm(alpha, a, b, beta, c)
}

/// The generic product through the extension points with the process-wide kernel. See
/// [`Gemm::gemm_with`].
pub fn gemm_with<A: PackA, B: PackB, S: Store>(a: &A, b: &B, store: &mut S) -> Result<(), Error> {
    Gemm::global()?.gemm_with(a, b, store)
}

/// Strided batched `sgemm` with the process-wide kernel. See [`Gemm::sgemm_batched`].
#[allow(clippy::too_many_arguments)]
pub fn sgemm_batched(
    transa: bool,
    transb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    stride_a: usize,
    b: &[f32],
    ldb: usize,
    stride_b: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    stride_c: usize,
    batch: usize,
) -> Result<(), Error> {
    Gemm::global()?.sgemm_batched(
        transa, transb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c,
        batch,
    )
}
