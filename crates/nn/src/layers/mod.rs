//! The layers: convolution, batch norm, pooling, activation, dropout, residual blocks, flatten,
//! fully connected.

mod batchnorm;
pub(crate) mod conv;
mod dropout;
mod flatten;
mod linear;
mod pool;
mod relu;
mod residual;

pub use batchnorm::{BatchNorm, BnGrads, StatsReduce};
pub use conv::{Conv, ConvAlgo, ConvConfig};
pub use dropout::Dropout;
pub use flatten::Flatten;
pub use linear::Linear;
pub use pool::{AdaptiveAvgPool, MaxPool};
pub use relu::Relu;
pub use residual::{BasicBlock, GlobalAvgPool, Residual};
