//! [`ProcessorGrid`]: the ranks of a communicator arranged as `samples × channels`, with the
//! sub-communicators that the hybrid sample/channel-parallel algorithms of "Channel and Filter
//! Parallelism for Large-Scale CNN Training" communicate over.

use crate::comm::Communicator;
use crate::error::{DistError, Result};

/// A `samples × channels` grid over the ranks of a communicator, rank `r` at
/// `(r / channels, r % channels)`.
///
/// - [`channel_comm`](ProcessorGrid::channel_comm): the ranks of this rank's grid row (same
///   samples, every channel block), ordered by channel block: the reduce-scatters and
///   allgathers of channel/filter parallelism run here.
/// - [`sample_comm`](ProcessorGrid::sample_comm): the ranks of this rank's grid column (same
///   channel block, every sample block), ordered by sample block: the segmented allreduce of
///   the weight gradients runs here, over only the ranks that hold the same weights.
pub struct ProcessorGrid<C: Communicator> {
    shape: (usize, usize),
    coords: (usize, usize),
    channel_comm: C,
    sample_comm: C,
}

impl<C: Communicator> ProcessorGrid<C> {
    /// Arranges the ranks of `comm` as `samples × channels` (collective).
    ///
    /// Errors: [`DistError::Training`] when `samples · channels` is not `comm.size()`.
    pub fn new(comm: &C, samples: usize, channels: usize) -> Result<Self> {
        if samples.checked_mul(channels) != Some(comm.size()) {
            return Err(DistError::Training(format!(
                "a {samples} × {channels} processor grid needs {} ranks, the communicator has {}",
                samples.saturating_mul(channels),
                comm.size()
            )));
        }
        let rank = comm.rank();
        let coords = (rank / channels, rank % channels);
        let color = |v: usize| {
            u32::try_from(v).map_err(|_| DistError::ValueOutOfRange {
                arg: "grid coordinate",
                value: v as u64,
            })
        };
        let missing = || DistError::Training("split returned no communicator".into());
        let channel_comm = comm
            .split_by_color(Some(color(coords.0)?), color(coords.1)?)?
            .ok_or_else(missing)?;
        let sample_comm = comm
            .split_by_color(Some(color(coords.1)?), color(coords.0)?)?
            .ok_or_else(missing)?;
        Ok(ProcessorGrid {
            shape: (samples, channels),
            coords,
            channel_comm,
            sample_comm,
        })
    }

    /// `(samples, channels)`.
    pub fn shape(&self) -> (usize, usize) {
        self.shape
    }

    /// This rank's `(sample block, channel block)`.
    pub fn coords(&self) -> (usize, usize) {
        self.coords
    }

    /// The ranks of this rank's row: same samples, every channel block.
    pub fn channel_comm(&self) -> &C {
        &self.channel_comm
    }

    /// The ranks of this rank's column: same channel block, every sample block.
    pub fn sample_comm(&self) -> &C {
        &self.sample_comm
    }

    /// `(channel_comm, sample_comm)`, taking the grid apart (e.g. to [`crate::register`] the
    /// channel communicator for a channel-parallel model).
    pub fn into_comms(self) -> (C, C) {
        (self.channel_comm, self.sample_comm)
    }
}
