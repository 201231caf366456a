//! # dist: distributed CNN training
//!
//! Communicators, processor grids, tensor distributions, segmented collectives and distributed
//! layers and trainers. MPI sits behind the cargo feature `mpi`; without it a single-process
//! communicator runs every distributed code path unchanged.
//!
//! Layering: `core-blas` ← `conv-ops` ← `fastconv` ← `nn` ← **`dist`**.
//!
//! ## Communicators
//!
//! [`Runtime::init`] sets up the communication layer once per process (MPI with the `mpi`
//! feature) and [`Runtime::world`] returns the communicator of all processes. Collectives are
//! methods of the [`Communicator`] trait: [`Communicator::allreduce_sum`] (in place, f32),
//! [`Communicator::allreduce_mean`], [`Communicator::broadcast`], [`Communicator::barrier`], and
//! [`Communicator::split_by_color`] for sub-communicators (rows and columns of a processor grid),
//! which get the same collectives.
//!
//! ```
//! use dist::{Communicator, Runtime};
//!
//! let runtime = Runtime::init()?;
//! let world = runtime.world();
//! let mut grad = vec![1.0f32; 8];
//! world.allreduce_sum(&mut grad)?;
//! assert_eq!(grad[0], world.size() as f32);
//! # Ok::<(), dist::DistError>(())
//! ```
//!
//! ## Data parallelism
//!
//! [`DataParallel`] runs synchronous SGD over the ranks of a communicator: each rank trains on its
//! shard of every mini-batch and the gradients are averaged before every step, so the replicas
//! take the step one process would take on the whole batch (checked under `mpirun` by
//! `tests/mpi_data_parallel.rs`). The averaging overlaps backpropagation: gradients are cut into
//! chunks ([`DataParallel::with_chunk`]) whose non-blocking allreduces
//! ([`Communicator::allreduce_sum_overlapped`]) start as soon as backpropagation has produced
//! them, last layers first. On one process it is plain training:
//!
//! ```
//! use dist::{DataParallel, Runtime};
//! use nn::{ConvAlgo, Dataset, Sgd, build};
//!
//! let runtime = Runtime::init()?;
//! let world = runtime.world();
//! let mut model = build("lenet", ConvAlgo::Convgemm, 0)?;
//! let mut opt = Sgd::new(0.05, 0.9, 5e-4)?;
//! let data = Dataset::synthetic(8, &[1, 28, 28], 10, 0)?;
//! let (x, labels) = data.batches(8, None)?.next().expect("one batch");
//! let mut dp = DataParallel::new(&world);
//! dp.broadcast_model(&mut model)?; // every replica starts from rank 0's weights
//! let loss = dp.step(&mut model, &mut opt, &x, &labels)?;
//! assert!(loss.is_finite());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A batch norm normalises with its batch's statistics, so replicas that each see a shard would
//! not take the single process's step. [`sync_batch_norm`] makes every batch norm of a model a
//! [`SyncBatchNorm`], whose per-channel sums are summed over the ranks (PyTorch's
//! `SyncBatchNorm`); a rank whose shard is empty (a batch smaller than the rank count) still
//! runs the model on zero samples and joins the sums. `tests/mpi_data_parallel.rs` checks a
//! residual model with batch norm against one process:
//!
//! ```
//! use dist::{Runtime, register, sync_batch_norm};
//! use nn::{ConvAlgo, build};
//!
//! let runtime = Runtime::init()?;
//! let registration = register(runtime.world()); // the ranks that share the batch
//! let model = sync_batch_norm(build("resnet20", ConvAlgo::Convgemm, 0)?, registration.handle())?;
//! assert!(model.summary().contains("SyncBatchNorm(16)"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Channel and filter parallelism
//!
//! A [`ProcessorGrid`] arranges the ranks as `samples × channels`, with a communicator per row
//! (the channel blocks of the same samples) and per column (the sample blocks of the same
//! channels). [`ChannelParallelConv`] is the stationary-x convolution of "Channel and Filter
//! Parallelism for Large-Scale CNN Training": input channels, weights and output channels split
//! over a row, a reduce-scatter after the local forward, an allgather of `dy` before the local
//! backward, and the weight gradients summed over the column only (a segmented allreduce).
//! [`FilterParallelConv`] is the stationary-y convolution: filters split over a row, an
//! allgather of `x` before the local forward, a reduce-scatter of `dx` after the local
//! backward-data. Either takes its input split by channels and leaves its output split by
//! channels, so they chain. [`StationaryWConv`] is the paper's stationary-w convolution, of
//! which both are special cases: a [`ChannelGrid`] arranges a row's ranks as `pc × pf`, and each
//! rank holds a `K/pf × C/pc` block of the weights (an allgather of `x` over its grid row before
//! the local forward, a reduce-scatter over its column after it; the reverse in backward).
//! `tests/mpi_channel_conv.rs` checks all three on every grid of 1, 2 and 4 ranks against the
//! whole layer (stationary-w on every `pc × pf` split, as a chain of two layers).
//!
//! In a model they are [`nn::Layer`]s through [`Bound`]: a layer must be `Send` and an MPI
//! communicator is not, so the communicator is [`register`]ed with the running thread and the
//! layer keeps a [`CommHandle`] to it. [`channel_parallel`] rewrites a model (LeNet, VGG, C3D,
//! the ResNets) that way: the runs of convolutions whose channels divide, with the channel-wise
//! layers between them and the residual blocks made of those, are split (stationary-x and
//! stationary-y alternating, batch norms on their block of channels, a [`ChannelScatter`]
//! before and a [`ChannelGather`] after), the rest runs whole on every rank. With [`DataParallel`] over the grid's sample communicator this
//! is the paper's hybrid; `tests/mpi_channel_model.rs` trains such a model on every grid of 1, 2
//! and 4 ranks and checks it takes the single-process steps (`train --parallel channel` or
//! `--parallel 2x2` runs it). [`save_channel_parallel`] gathers the blocks into the checkpoint
//! of the whole model, so a run resumes on any grid or one process ([`split_momentum`] cuts the
//! resumed optimizer state to the blocks). [`stationary_w_parallel`] splits the same runs with
//! every convolution stationary-w over a `pc × pf` [`GridRegistration`] of the row (each rank
//! holding a `K/pf × C/pc` block of every split weight); the same test trains it on every split
//! of the row, checkpoint and resume included:
//!
//! ```
//! use dist::{Communicator, ProcessorGrid, Runtime, channel_parallel, register};
//! use nn::{ConvAlgo, build};
//!
//! let runtime = Runtime::init()?;
//! let world = runtime.world();
//! let grid = ProcessorGrid::new(&world, 1, world.size())?;
//! let part = grid.coords().1;
//! let (channel_comm, _sample_comm) = grid.into_comms();
//! let registration = register(channel_comm);
//! let model = build("vgg16", ConvAlgo::Convgemm, 0)?;
//! let (model, plan) = channel_parallel(model, registration.handle(), world.size(), part)?;
//! assert_eq!(plan.channel.len() + plan.filter.len() + plan.whole.len(), 13);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

//!
//! ## Spatial parallelism
//!
//! [`spatial_parallel`] splits the first spatial axis of the activations (height in 2D, depth
//! in 3D) in blocks of rows over a grid row: each [`SpatialParallel`] convolution or max-pool
//! fetches the rows of its window that other ranks hold (a halo exchange over
//! [`Communicator::exchange`]), computes its block of output rows, returns the halo's gradient
//! to the owners in backward, and sums the weight gradients over the row. Weights stay whole on
//! every rank (a checkpoint of rank 0 is the whole model); the activations of the split layers,
//! the bulk of the memory of a high-resolution or volumetric CNN, are divided.
//! `tests/mpi_spatial_model.rs` trains a 2D and a 3D CNN this way on every grid of 1, 2 and 4
//! ranks against one process (`train --parallel spatial` or `--parallel 2x2s` runs it):
//!
//! ```
//! use dist::{ProcessorGrid, Runtime, register, spatial_parallel};
//! use nn::{ConvAlgo, build};
//!
//! let runtime = Runtime::init()?;
//! let world = runtime.world();
//! let grid = ProcessorGrid::new(&world, 1, 1)?;
//! let (row, _samples) = grid.into_comms();
//! let registration = register(row);
//! let model = build("c3d", ConvAlgo::Convgemm, 0)?;
//! let (model, plan) = spatial_parallel(model, registration.handle(), 1, 0)?;
//! assert!(plan.split.is_empty()); // one block: nothing to split
//! # let _ = model;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod channel_conv;
mod checkpoint;
mod comm;
mod data_parallel;
mod error;
mod grid;
mod layers;
#[cfg(feature = "mpi")]
mod mpi_comm;
mod runtime;
mod single;
mod spatial;
mod stationary_w;
mod sync_bn;

pub use channel_conv::{ChannelParallelConv, FilterParallelConv};
pub use checkpoint::{TensorSplit, save_channel_parallel, split_momentum};
pub use comm::{ChunkPoster, Communicator, MAX_COUNT};
pub use data_parallel::{DEFAULT_CHUNK, DataParallel};
pub use error::{DistError, Result};
pub use grid::ProcessorGrid;
pub use layers::{
    Bound, ChannelGather, ChannelPlan, ChannelScatter, CommHandle, DistLayer, Registration,
    channel_parallel, register, stationary_w_parallel,
};
#[cfg(feature = "mpi")]
pub use mpi_comm::{MpiCommunicator, MpiEnvironment, REQUESTED_THREADING};
pub use runtime::{Runtime, World};
pub use single::SingleProcess;
pub use spatial::{
    SpatialGather, SpatialParallel, SpatialPlan, SpatialScatter, rows, spatial_parallel,
};
pub use stationary_w::{BoundW, ChannelGrid, GridHandles, GridRegistration, StationaryWConv};
pub use sync_bn::{SyncBatchNorm, sync_batch_norm};
