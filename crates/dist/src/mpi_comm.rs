//! The MPI communicator (feature `mpi`): rsmpi over the system's MPI library.
//!
//! MPI is initialised once per process by [`crate::Runtime::init`], which keeps rsmpi's
//! `Universe` in a reference-counted [`MpiEnvironment`]. Every [`MpiCommunicator`] holds a clone of
//! that `Arc`, so `MPI_Finalize` runs exactly once, when the runtime and the last communicator
//! have been dropped, after every communicator has been freed. (Open MPI's `mpirun` fails a job
//! whose processes exit without `MPI_Finalize`; a `OnceLock` static would never be dropped.)

use std::cell::RefCell;
use std::sync::Arc;

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};

use crate::comm::{Communicator, check_count, check_rank, check_split_value};
use crate::error::{DistError, Result};

/// Threading level requested from MPI: only the thread that initialised MPI calls it (rayon
/// workers compute, the main thread communicates).
pub const REQUESTED_THREADING: mpi::Threading = mpi::Threading::Funneled;

/// The initialised MPI library. Dropping the last handle calls `MPI_Finalize`.
pub struct MpiEnvironment {
    _universe: Universe,
    threading: mpi::Threading,
}

impl std::fmt::Debug for MpiEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiEnvironment")
            .field("threading", &self.threading)
            .finish()
    }
}

impl MpiEnvironment {
    /// Initialises MPI with [`REQUESTED_THREADING`].
    ///
    /// Errors: [`DistError::AlreadyInitialized`] when MPI was initialised before in this process.
    pub(crate) fn init() -> Result<Arc<Self>> {
        let (universe, threading) = mpi::initialize_with_threading(REQUESTED_THREADING)
            .ok_or(DistError::AlreadyInitialized)?;
        Ok(Arc::new(Self {
            _universe: universe,
            threading,
        }))
    }

    /// The threading level the MPI library actually provides.
    pub fn threading(&self) -> mpi::Threading {
        self.threading
    }
}

/// A communicator backed by an MPI communicator (the world or a split of it).
///
/// In-place collectives copy the input to a scratch buffer kept by the communicator and call
/// `MPI_Allreduce` out of place: rsmpi has no safe in-place form, and the copy is cheap next to
/// the network transfer.
pub struct MpiCommunicator {
    // Field order matters: the communicator is freed before the environment handle is released.
    comm: SimpleCommunicator,
    scratch: RefCell<Vec<f32>>,
    env: Arc<MpiEnvironment>,
}

impl std::fmt::Debug for MpiCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiCommunicator")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl MpiCommunicator {
    /// The world communicator of an initialised environment.
    pub(crate) fn world(env: Arc<MpiEnvironment>) -> Self {
        Self {
            comm: SimpleCommunicator::world(),
            scratch: RefCell::new(Vec::new()),
            env,
        }
    }

    /// The MPI environment this communicator keeps alive.
    pub fn environment(&self) -> &Arc<MpiEnvironment> {
        &self.env
    }

    /// The underlying rsmpi communicator, for operations `dist` does not wrap yet.
    pub fn raw(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// Terminates every process of the communicator with `code` (`MPI_Abort`). Use it on a failed
    /// check so the other ranks do not wait forever in a collective.
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        // MPI ranks are non-negative by definition.
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        check_count("buf", buf.len())?;
        let mut scratch = self.scratch.borrow_mut();
        scratch.clear();
        scratch.extend_from_slice(buf);
        self.comm
            .all_reduce_into(&scratch[..], buf, SystemOperation::sum());
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        check_rank("root", root, self.size())?;
        check_count("buf", buf.len())?;
        // `root < size <= i32::MAX`, checked above.
        self.comm.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.comm.barrier();
        Ok(())
    }

    fn split_by_color(&self, color: Option<u32>, key: u32) -> Result<Option<Self>> {
        check_split_value("key", key)?;
        let color = match color {
            Some(c) => {
                check_split_value("color", c)?;
                Color::with_value(c as i32)
            }
            None => Color::undefined(),
        };
        Ok(self
            .comm
            .split_by_color_with_key(color, key as i32)
            .map(|comm| Self {
                comm,
                scratch: RefCell::new(Vec::new()),
                env: Arc::clone(&self.env),
            }))
    }
}
