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
pub(crate) fn check_split_value(arg: &'static str, value: u32) -> Result<()> {
    if value > i32::MAX as u32 {
        return Err(DistError::ValueOutOfRange {
            arg,
            value: u64::from(value),
        });
    }
    Ok(())
}
