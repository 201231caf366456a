//! The communicator abstraction: who am I, how many are we, and the collectives.
//!
//! Collectives are methods of the [`Communicator`] trait, so every communicator (the world, a
//! sub-communicator from [`Communicator::split_by_color`], the single-process one) has them, the
//! way rsmpi attaches its collectives to every communicator.

use crate::error::{DistError, Result};

/// Largest element count one MPI call accepts (MPI counts are C `int`).
pub const MAX_COUNT: usize = i32::MAX as usize;

/// A group of processes that can run collectives together.
///
/// Every method is collective unless said otherwise: all ranks of the communicator must call it,
/// in the same order, with matching arguments (same lengths, same root), or the program hangs.
pub trait Communicator {
    /// This process's rank in `0..size()`. Local, not collective.
    fn rank(&self) -> usize;

    /// Number of processes in the communicator. Local, not collective.
    fn size(&self) -> usize;

    /// In-place sum over all ranks: afterwards `buf[i]` holds the sum of every rank's `buf[i]`.
    ///
    /// Errors: [`DistError::CountTooLarge`] when `buf` exceeds [`MAX_COUNT`] elements.
    fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()>;

    /// Gathers every rank's `send` into `recv` in rank order: afterwards `recv[r·n..(r+1)·n]`
    /// holds rank `r`'s `send` (`n = send.len()`, the same on every rank).
    ///
    /// Errors: [`DistError::Training`] when `recv.len() != size() · send.len()`;
    /// [`DistError::CountTooLarge`].
    fn allgather(&self, send: &[f32], recv: &mut [f32]) -> Result<()>;

    /// Sums `send` over all ranks and scatters the sum in blocks: afterwards this rank's `recv`
    /// holds block `rank()` (`recv.len()` values) of the element-wise sum. Cheaper than an
    /// allreduce followed by a discard (the paper's fused reduction and redistribution).
    ///
    /// Errors: [`DistError::Training`] when `send.len() != size() · recv.len()`;
    /// [`DistError::CountTooLarge`].
    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<()>;

    /// Copies `buf` of rank `root` into `buf` of every rank.
    ///
    /// Errors: [`DistError::RankOutOfRange`] for `root >= size()`, [`DistError::CountTooLarge`].
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()>;

    /// Blocks until every rank of the communicator has called it.
    fn barrier(&self) -> Result<()>;

    /// Splits the communicator: ranks passing the same `Some(color)` form one new communicator,
    /// ordered by `key` (ties by rank in `self`); ranks passing `None` get `Ok(None)`.
    ///
    /// Errors: [`DistError::ValueOutOfRange`] when `color` or `key` exceeds `i32::MAX`.
    fn split_by_color(&self, color: Option<u32>, key: u32) -> Result<Option<Self>>
    where
        Self: Sized;

    /// In-place sum over all ranks of `buf`, cut into consecutive chunks of the lengths
    /// `chunks`, each chunk's sum started as soon as it is ready: `work` runs with a
    /// [`ChunkPoster`] whose [`post`](ChunkPoster::post) fills one chunk and starts its
    /// (non-blocking) reduction, so communication overlaps whatever `work` computes next (the
    /// gradient chunks of the paper "Parallel CNN training by overlapping computation and
    /// communication"). Chunks `work` leaves unposted are summed afterwards with `buf`'s contents,
    /// in index order. On return every chunk holds its sum.
    ///
    /// Every rank must post the same chunks in the same order (MPI orders collectives by call).
    /// The default, used by [`crate::SingleProcess`], reduces each chunk when it is posted.
    ///
    /// Errors: [`DistError::Training`] when the chunk lengths do not add up to `buf.len()` or a
    /// chunk is posted twice or does not exist; [`DistError::CountTooLarge`] for a chunk over
    /// [`MAX_COUNT`]; the first error of `work`.
    fn allreduce_sum_overlapped(
        &self,
        buf: &mut [f32],
        chunks: &[usize],
        work: &mut dyn FnMut(&mut dyn ChunkPoster) -> Result<()>,
    ) -> Result<()> {
        let mut parts = split_chunks(buf, chunks)?;
        let mut poster = BlockingPoster {
            comm: |b: &mut [f32]| self.allreduce_sum(b),
            parts: &mut parts,
        };
        let result = work(&mut poster);
        for i in 0..poster.parts.len() {
            if poster.parts[i].is_some() {
                poster.post(i, &mut |_| {})?;
            }
        }
        result
    }

    /// Point-to-point exchange, the halo exchange of spatial parallelism: sends each
    /// `(rank, data)` of `sends` to `rank` and fills each `(rank, buf)` of `recvs` with a message
    /// from `rank`, every transfer started at once (non-blocking) and all finished on return.
    /// Not collective: only the ranks named take part. Messages between two ranks match in the
    /// order they are listed, so both sides must list them in the same order, and a receive
    /// buffer must have the length of the message it gets.
    ///
    /// Errors: [`DistError::RankOutOfRange`] for a rank not in the communicator,
    /// [`DistError::CountTooLarge`], [`DistError::Training`] when a message's length differs
    /// from its receive buffer's (checked on the receiving side).
    fn exchange(&self, sends: &[(usize, &[f32])], recvs: &mut [(usize, &mut [f32])]) -> Result<()>;

    /// In-place mean over all ranks: [`Communicator::allreduce_sum`] then a scale by
    /// `1 / size()`, what data-parallel gradient averaging needs.
    fn allreduce_mean(&self, buf: &mut [f32]) -> Result<()> {
        self.allreduce_sum(buf)?;
        let size = self.size();
        if size > 1 {
            let scale = 1.0 / size as f32;
            buf.iter_mut().for_each(|x| *x *= scale);
        }
        Ok(())
    }

    /// `true` on rank 0, the rank that prints and writes files by convention. Local.
    fn is_root(&self) -> bool {
        self.rank() == 0
    }
}

/// Checks a buffer length against [`MAX_COUNT`].
pub(crate) fn check_count(arg: &'static str, len: usize) -> Result<()> {
    if len > MAX_COUNT {
        return Err(DistError::CountTooLarge {
            arg,
            len,
            max: MAX_COUNT,
        });
    }
    Ok(())
}

/// Checks that `rank` is a rank of a communicator of `size` processes.
pub(crate) fn check_rank(arg: &'static str, rank: usize, size: usize) -> Result<()> {
    if rank >= size {
        return Err(DistError::RankOutOfRange { arg, rank, size });
    }
    Ok(())
}

/// Checks that a split colour or key fits a non-negative C `int`.
/// Validates the ranks and counts of an [`Communicator::exchange`].
pub(crate) fn check_exchange(
    sends: &[(usize, &[f32])],
    recvs: &[(usize, &mut [f32])],
    size: usize,
) -> Result<()> {
    for (rank, data) in sends {
        check_rank("sends", *rank, size)?;
        check_count("sends", data.len())?;
    }
    for (rank, buf) in recvs {
        check_rank("recvs", *rank, size)?;
        check_count("recvs", buf.len())?;
    }
    Ok(())
}

pub(crate) fn check_split_value(arg: &'static str, value: u32) -> Result<()> {
    if value > i32::MAX as u32 {
        return Err(DistError::ValueOutOfRange {
            arg,
            value: u64::from(value),
        });
    }
    Ok(())
}

/// Starts the reduction of one chunk inside [`Communicator::allreduce_sum_overlapped`].
pub trait ChunkPoster {
    /// Writes chunk `index` through `fill` (which sees the chunk's current contents) and starts
    /// its sum over all ranks. Collective: every rank posts the same chunks in the same order.
    ///
    /// Errors: [`DistError::Training`] for an unknown or already posted chunk.
    fn post(&mut self, index: usize, fill: &mut dyn FnMut(&mut [f32])) -> Result<()>;
}

/// `buf` cut into `chunks`, each `Some` until posted.
pub(crate) fn split_chunks<'b>(
    buf: &'b mut [f32],
    chunks: &[usize],
) -> Result<Vec<Option<&'b mut [f32]>>> {
    let total: usize = chunks.iter().sum();
    if total != buf.len() {
        return Err(DistError::Training(format!(
            "chunks of {total} values in total for a buffer of {}",
            buf.len()
        )));
    }
    let mut parts = Vec::with_capacity(chunks.len());
    let mut rest = buf;
    for &n in chunks {
        check_count("chunks", n)?;
        let (head, tail) = rest.split_at_mut(n);
        parts.push(Some(head));
        rest = tail;
    }
    Ok(parts)
}

/// Takes chunk `index` out of `parts`, or says why it cannot.
pub(crate) fn take_chunk<'b>(
    parts: &mut [Option<&'b mut [f32]>],
    index: usize,
) -> Result<&'b mut [f32]> {
    let n = parts.len();
    parts
        .get_mut(index)
        .ok_or_else(|| DistError::Training(format!("chunk {index} of {n} does not exist")))?
        .take()
        .ok_or_else(|| DistError::Training(format!("chunk {index} was posted twice")))
}

/// The default poster: each chunk is reduced (blocking) when posted.
struct BlockingPoster<'p, 'b, F> {
    comm: F,
    parts: &'p mut Vec<Option<&'b mut [f32]>>,
}

impl<F: FnMut(&mut [f32]) -> Result<()>> ChunkPoster for BlockingPoster<'_, '_, F> {
    fn post(&mut self, index: usize, fill: &mut dyn FnMut(&mut [f32])) -> Result<()> {
        let chunk = take_chunk(self.parts, index)?;
        fill(chunk);
        (self.comm)(chunk)
    }
}

/// Checks that `total` is `size` blocks of `block` values (the buffers of allgather and
/// reduce-scatter).
pub(crate) fn check_blocks(op: &str, total: usize, block: usize, size: usize) -> Result<()> {
    check_count("buffer", total)?;
    if block.checked_mul(size) != Some(total) {
        return Err(DistError::Training(format!(
            "{op}: {total} values are not {size} blocks of {block}"
        )));
    }
    Ok(())
}
