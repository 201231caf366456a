//! # dist: distributed CNN training
//!
//! Communicators, processor grids, tensor distributions, segmented collectives and distributed
//! layers and trainers. MPI sits behind the cargo feature `mpi`; without it a single-process
//! communicator runs every distributed code path unchanged.
//!
//! Layering: `core-blas` ← `conv-ops` ← `fastconv` ← `nn` ← **`dist`**.
