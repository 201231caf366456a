//! Process-wide set-up: [`Runtime`] initialises the communication layer once and hands out the
//! [`World`] communicator.

use crate::comm::{ChunkPoster, Communicator};
use crate::error::Result;
use crate::single::SingleProcess;

#[cfg(feature = "mpi")]
use crate::mpi_comm::{MpiCommunicator, MpiEnvironment};

/// The communication layer of this process. Create it once, at the start of `main`, and keep it
/// alive until the end: with the `mpi` feature, dropping the runtime and every communicator
/// obtained from it finalises MPI (`MPI_Finalize`), which `mpirun` requires before exit.
///
/// Without the `mpi` feature the runtime is a single process and [`Runtime::world`] is a
/// communicator of size 1, so every distributed code path runs unchanged.
#[derive(Debug)]
pub struct Runtime {
    #[cfg(feature = "mpi")]
    env: std::sync::Arc<MpiEnvironment>,
}

impl Runtime {
    /// Initialises the communication layer.
    ///
    /// With the `mpi` feature this calls `MPI_Init_thread` (funneled threading); a program started
    /// without `mpirun` becomes an MPI singleton of size 1.
    ///
    /// Errors: [`crate::DistError::AlreadyInitialized`] when MPI was already initialised in this
    /// process (a second `Runtime::init`).
    pub fn init() -> Result<Self> {
        #[cfg(feature = "mpi")]
        {
            Ok(Self {
                env: MpiEnvironment::init()?,
            })
        }
        #[cfg(not(feature = "mpi"))]
        {
            Ok(Self {})
        }
    }

    /// `true` when this runtime talks to a real MPI library (feature `mpi`).
    pub fn is_mpi(&self) -> bool {
        cfg!(feature = "mpi")
    }

    /// The communicator of all processes of the job.
    pub fn world(&self) -> World {
        #[cfg(feature = "mpi")]
        {
            World::Mpi(MpiCommunicator::world(std::sync::Arc::clone(&self.env)))
        }
        #[cfg(not(feature = "mpi"))]
        {
            World::Single(SingleProcess)
        }
    }
}

/// A communicator chosen at run time: the single process, or MPI when the feature is on.
///
/// Sub-communicators from [`Communicator::split_by_color`] are again `World`s, so code written
/// against `World` (or generically against [`Communicator`]) works at any level of a grid.
#[derive(Debug)]
pub enum World {
    /// One process, no MPI.
    Single(SingleProcess),
    /// An MPI communicator.
    #[cfg(feature = "mpi")]
    Mpi(MpiCommunicator),
}

impl World {
    /// Ends the whole job with exit status `code`: `MPI_Abort` under MPI (so no rank waits forever
    /// in a collective), `std::process::exit` for a single process.
    pub fn abort(&self, code: i32) -> ! {
        match self {
            World::Single(_) => std::process::exit(code),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.abort(code),
        }
    }
}

impl Communicator for World {
    fn rank(&self) -> usize {
        match self {
            World::Single(c) => c.rank(),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.rank(),
        }
    }

    fn size(&self) -> usize {
        match self {
            World::Single(c) => c.size(),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.size(),
        }
    }

    fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        match self {
            World::Single(c) => c.allreduce_sum(buf),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.allreduce_sum(buf),
        }
    }

    fn allreduce_sum_overlapped(
        &self,
        buf: &mut [f32],
        chunks: &[usize],
        work: &mut dyn FnMut(&mut dyn ChunkPoster) -> Result<()>,
    ) -> Result<()> {
        match self {
            World::Single(c) => c.allreduce_sum_overlapped(buf, chunks, work),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.allreduce_sum_overlapped(buf, chunks, work),
        }
    }

    fn allgather(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        match self {
            World::Single(c) => c.allgather(send, recv),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.allgather(send, recv),
        }
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        match self {
            World::Single(c) => c.reduce_scatter_sum(send, recv),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.reduce_scatter_sum(send, recv),
        }
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        match self {
            World::Single(c) => c.broadcast(buf, root),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.broadcast(buf, root),
        }
    }

    fn exchange(&self, sends: &[(usize, &[f32])], recvs: &mut [(usize, &mut [f32])]) -> Result<()> {
        match self {
            World::Single(c) => c.exchange(sends, recvs),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.exchange(sends, recvs),
        }
    }

    fn barrier(&self) -> Result<()> {
        match self {
            World::Single(c) => c.barrier(),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => c.barrier(),
        }
    }

    fn split_by_color(&self, color: Option<u32>, key: u32) -> Result<Option<Self>> {
        match self {
            World::Single(c) => Ok(c.split_by_color(color, key)?.map(World::Single)),
            #[cfg(feature = "mpi")]
            World::Mpi(c) => Ok(c.split_by_color(color, key)?.map(World::Mpi)),
        }
    }
}

#[cfg(all(test, not(feature = "mpi")))]
mod tests {
    use super::*;

    #[test]
    fn world_without_mpi_is_single_process() {
        let rt = Runtime::init().unwrap();
        assert!(!rt.is_mpi());
        let w = rt.world();
        assert_eq!((w.rank(), w.size()), (0, 1));
        let mut v = vec![1.5f32, -2.0, 3.25];
        w.allreduce_sum(&mut v).unwrap();
        assert_eq!(v, [1.5, -2.0, 3.25]);
        w.broadcast(&mut v, 0).unwrap();
        assert!(w.broadcast(&mut v, 2).is_err());
        w.barrier().unwrap();
        let sub = w.split_by_color(Some(1), 0).unwrap().unwrap();
        assert_eq!(sub.size(), 1);
        assert!(w.split_by_color(None, 0).unwrap().is_none());
    }
}
