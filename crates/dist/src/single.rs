//! The single-process communicator: size 1, every collective is the identity.

use crate::comm::{
    Communicator, check_blocks, check_count, check_exchange, check_rank, check_split_value,
};
use crate::error::{DistError, Result};

/// A communicator with exactly one process, rank 0.
///
/// Used when `dist` is built without the `mpi` feature, or when a program runs without a
/// launcher. Collectives validate their arguments exactly as the MPI communicator does, so a call
/// that would fail under `mpirun` fails here too, and otherwise leave the data unchanged (the sum
/// or broadcast over one rank is the rank's own data).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SingleProcess;

impl SingleProcess {
    /// The single-process communicator.
    pub fn new() -> Self {
        Self
    }
}

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn allreduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        check_count("buf", buf.len())
    }

    fn allgather(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check_blocks("allgather", recv.len(), send.len(), 1)?;
        recv.copy_from_slice(send);
        Ok(())
    }

    fn reduce_scatter_sum(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check_blocks("reduce_scatter_sum", send.len(), recv.len(), 1)?;
        recv.copy_from_slice(send);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        check_rank("root", root, 1)?;
        check_count("buf", buf.len())
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }

    /// Every message goes to this rank: the `k`-th send fills the `k`-th receive.
    fn exchange(&self, sends: &[(usize, &[f32])], recvs: &mut [(usize, &mut [f32])]) -> Result<()> {
        check_exchange(sends, recvs, 1)?;
        if sends.len() != recvs.len() {
            return Err(DistError::Training(format!(
                "exchange on one rank: {} messages sent to itself, {} receives",
                sends.len(),
                recvs.len()
            )));
        }
        for ((_, data), (_, buf)) in sends.iter().zip(recvs.iter_mut()) {
            if data.len() != buf.len() {
                return Err(DistError::Training(format!(
                    "exchange: a message of {} values for a receive buffer of {}",
                    data.len(),
                    buf.len()
                )));
            }
            buf.copy_from_slice(data);
        }
        Ok(())
    }

    fn split_by_color(&self, color: Option<u32>, key: u32) -> Result<Option<Self>> {
        check_split_value("key", key)?;
        match color {
            Some(c) => {
                check_split_value("color", c)?;
                Ok(Some(SingleProcess))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DistError;

    #[test]
    fn rank_and_size() {
        let c = SingleProcess::new();
        assert_eq!((c.rank(), c.size()), (0, 1));
        assert!(c.is_root());
    }

    #[test]
    fn allreduce_of_one_rank_is_identity() {
        let c = SingleProcess;
        for len in [0usize, 1, 7, 1000] {
            let orig: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut buf = orig.clone();
            c.allreduce_sum(&mut buf).unwrap();
            assert_eq!(buf, orig);
            c.allreduce_mean(&mut buf).unwrap();
            assert_eq!(buf, orig);
        }
    }

    #[test]
    fn broadcast_validates_root() {
        let c = SingleProcess;
        let mut buf = vec![1.0f32, 2.0];
        c.broadcast(&mut buf, 0).unwrap();
        assert_eq!(buf, [1.0, 2.0]);
        assert!(matches!(
            c.broadcast(&mut buf, 1),
            Err(DistError::RankOutOfRange {
                arg: "root",
                rank: 1,
                size: 1
            })
        ));
        c.barrier().unwrap();
    }

    #[test]
    fn split_by_color() {
        let c = SingleProcess;
        assert_eq!(c.split_by_color(Some(3), 0).unwrap(), Some(SingleProcess));
        assert_eq!(c.split_by_color(None, 0).unwrap(), None);
        let sub = c.split_by_color(Some(0), 5).unwrap().unwrap();
        assert_eq!(sub.size(), 1);
        assert!(matches!(
            c.split_by_color(Some(u32::MAX), 0),
            Err(DistError::ValueOutOfRange { arg: "color", .. })
        ));
        assert!(matches!(
            c.split_by_color(Some(0), u32::MAX),
            Err(DistError::ValueOutOfRange { arg: "key", .. })
        ));
    }

    #[test]
    fn allgather_and_reduce_scatter_of_one_rank_copy() {
        let c = SingleProcess;
        let mut out = [0.0; 3];
        c.allgather(&[1.0, 2.0, 3.0], &mut out).unwrap();
        assert_eq!(out, [1.0, 2.0, 3.0]);
        c.reduce_scatter_sum(&[4.0, 5.0, 6.0], &mut out).unwrap();
        assert_eq!(out, [4.0, 5.0, 6.0]);
        assert!(matches!(
            c.allgather(&[1.0], &mut out),
            Err(DistError::Training(_))
        ));
        assert!(c.reduce_scatter_sum(&[1.0; 4], &mut out).is_err());
        // The grid of one rank, and a grid that does not fit.
        let g = crate::ProcessorGrid::new(&c, 1, 1).unwrap();
        assert_eq!((g.shape(), g.coords()), ((1, 1), (0, 0)));
        assert!(crate::ProcessorGrid::new(&c, 2, 1).is_err());
        // A block of a layer that does not match its configuration is an error, not a panic.
        use nn::{Conv, ConvAlgo, ConvConfig};
        use rand::SeedableRng;
        let rng = &mut rand::rngs::SmallRng::seed_from_u64(0);
        let cfg = ConvConfig::conv2d(4, 6, 3);
        let full = Conv::new(cfg.clone(), ConvAlgo::Convgemm, rng).unwrap();
        let other = ConvConfig::conv2d(8, 6, 3);
        assert!(
            crate::ChannelParallelConv::from_conv(&full, other.clone(), ConvAlgo::Convgemm, 2, 0)
                .is_err()
        );
        assert!(
            crate::FilterParallelConv::from_conv(&full, other, ConvAlgo::Convgemm, 2, 0).is_err()
        );
        assert!(
            crate::FilterParallelConv::from_conv(
                &full,
                cfg.clone().no_bias(),
                ConvAlgo::Convgemm,
                2,
                0
            )
            .is_err()
        );
        assert!(
            crate::ChannelParallelConv::from_conv(&full, cfg.clone(), ConvAlgo::Convgemm, 4, 0)
                .is_err(),
            "4 does not divide 6"
        );
        assert!(crate::FilterParallelConv::from_conv(&full, cfg, ConvAlgo::Convgemm, 2, 1).is_ok());
    }

    #[test]
    fn count_limit_is_checked() {
        assert!(check_count("buf", MAX_COUNT).is_ok());
        assert!(matches!(
            check_count("buf", MAX_COUNT + 1),
            Err(DistError::CountTooLarge {
                arg: "buf",
                len,
                max: MAX_COUNT
            }) if len == MAX_COUNT + 1
        ));
    }

    use crate::comm::MAX_COUNT;
}
