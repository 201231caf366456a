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
use mpi::request::{LocalScope, Request};
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::{
    Communicator as _, CommunicatorCollectives as _, Destination as _, Equivalence as _, Root as _,
    Source as _,
};

use crate::comm::{
    ChunkPoster, Communicator, check_blocks, check_count, check_exchange, check_rank,
    check_split_value, split_chunks, take_chunk,
};
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

    /// Each posted chunk starts an `MPI_Iallreduce` from a copy of `buf` into `buf`; posting
    /// also tests the earlier requests, which lets MPI progress them while `work` computes
    /// (Open MPI progresses non-blocking collectives inside MPI calls). All requests are waited
    /// for before returning.
    fn allreduce_sum_overlapped(
        &self,
        buf: &mut [f32],
        chunks: &[usize],
        work: &mut dyn FnMut(&mut dyn ChunkPoster) -> Result<()>,
    ) -> Result<()> {
        let mut send = buf.to_vec();
        let mut sends = split_chunks(&mut send, chunks)?;
        let mut recvs = split_chunks(buf, chunks)?;
        mpi::request::scope(|scope| {
            let mut poster = MpiPoster {
                comm: &self.comm,
                scope,
                sends: &mut sends,
                recvs: &mut recvs,
                pending: Vec::new(),
            };
            let result = work(&mut poster);
            // Unposted chunks go out with their current contents, so no rank waits forever.
            let mut rest = Ok(());
            for i in 0..poster.sends.len() {
                if poster.sends[i].is_some() && rest.is_ok() {
                    rest = poster.post(i, &mut |_| {});
                }
            }
            for request in poster.pending.drain(..) {
                request.wait();
            }
            result.and(rest)
        })
    }

    fn allgather(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check_blocks("allgather", recv.len(), send.len(), self.size())?;
        self.comm.all_gather_into(send, recv);
        Ok(())
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check_blocks("reduce_scatter_sum", send.len(), recv.len(), self.size())?;
        self.comm
            .reduce_scatter_block_into(send, recv, SystemOperation::sum());
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        check_rank("root", root, self.size())?;
        check_count("buf", buf.len())?;
        // `root < size <= i32::MAX`, checked above.
        self.comm.process_at_rank(root as i32).broadcast_into(buf);
        Ok(())
    }

    /// `MPI_Irecv` for every receive, then `MPI_Isend` for every send, then waits for all;
    /// each receive's status is checked against its buffer's length.
    fn exchange(&self, sends: &[(usize, &[f32])], recvs: &mut [(usize, &mut [f32])]) -> Result<()> {
        check_exchange(sends, recvs, self.size())?;
        let expected: Vec<usize> = recvs.iter().map(|(_, b)| b.len()).collect();
        let counts = mpi::request::scope(|scope| {
            // Ranks were checked against the size, which is an MPI int.
            let incoming: Vec<_> = recvs
                .iter_mut()
                .map(|(rank, buf)| {
                    self.comm
                        .process_at_rank(*rank as i32)
                        .immediate_receive_into(scope, &mut **buf)
                })
                .collect();
            let outgoing: Vec<_> = sends
                .iter()
                .map(|(rank, data)| {
                    self.comm
                        .process_at_rank(*rank as i32)
                        .immediate_send(scope, *data)
                })
                .collect();
            let counts: Vec<i32> = incoming
                .into_iter()
                .map(|r| r.wait().count(f32::equivalent_datatype()))
                .collect();
            for r in outgoing {
                r.wait();
            }
            counts
        });
        for (got, want) in counts.into_iter().zip(expected) {
            if got as usize != want {
                return Err(DistError::Training(format!(
                    "exchange: a message of {got} values for a receive buffer of {want}"
                )));
            }
        }
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

/// Posts chunks as `MPI_Iallreduce` requests inside one request scope.
struct MpiPoster<'s, 'b> {
    comm: &'s SimpleCommunicator,
    scope: &'s LocalScope<'b>,
    sends: &'s mut Vec<Option<&'b mut [f32]>>,
    recvs: &'s mut Vec<Option<&'b mut [f32]>>,
    pending: Vec<Request<'b, [f32], &'s LocalScope<'b>>>,
}

impl ChunkPoster for MpiPoster<'_, '_> {
    fn post(&mut self, index: usize, fill: &mut dyn FnMut(&mut [f32])) -> Result<()> {
        let send = take_chunk(self.sends, index)?;
        let recv = take_chunk(self.recvs, index)?;
        fill(send);
        let send: &[f32] = send;
        let request =
            self.comm
                .immediate_all_reduce_into(self.scope, send, recv, SystemOperation::sum());
        self.pending.push(request);
        // Drive the earlier requests: test each, keep the unfinished.
        let mut still = Vec::with_capacity(self.pending.len());
        for r in self.pending.drain(..) {
            if let Err(r) = r.test() {
                still.push(r);
            }
        }
        self.pending = still;
        Ok(())
    }
}
