//! The layers: convolution, pooling, activation, flatten, fully connected.

mod conv;
mod flatten;
mod linear;
mod pool;
mod relu;

pub use conv::{Conv, ConvAlgo, ConvConfig};
pub use flatten::Flatten;
pub use linear::Linear;
pub use pool::MaxPool;
pub use relu::Relu;
