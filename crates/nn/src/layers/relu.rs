//! [`Relu`]: `y = max(x, 0)`.

use core_blas::vector::{Vector, mask_bytes};

use crate::error::{NnError, Result};
use crate::layer::Layer;
use crate::tensor::Tensor;

/// The rectified linear unit. Keeps one bit per value for backward.
#[derive(Debug, Default)]
pub struct Relu {
    /// The shape of the forward input backward has not consumed yet.
    saved: Option<Vec<usize>>,
    /// `x > 0` per value of that input, one bit each (bit `i % 8` of byte `i / 8`). Kept after
    /// backward, so the next step's forward fills the same allocation instead of faulting in
    /// fresh pages.
    mask: Vec<u8>,
}

impl Relu {
    /// A ReLU layer.
    pub fn new() -> Self {
        Relu::default()
    }
}

impl Layer for Relu {
    fn describe(&self) -> String {
        "ReLU".into()
    }

    fn forward(&mut self, mut x: Tensor, train: bool) -> Result<Tensor> {
        let v = Vector::global()?;
        if train {
            self.mask.clear();
            self.mask.resize(mask_bytes(x.len()), 0);
            crate::par::runs_bits_mut(
                x.data_mut(),
                &mut self.mask,
                |x, m| Ok(v.relu_train(x, m)?),
            )?;
            self.saved = Some(x.shape().to_vec());
        } else {
            crate::par::runs(x.data_mut(), |x| {
                v.relu(x);
                Ok(())
            })?;
        }
        Ok(x)
    }

    fn backward(&mut self, mut dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let shape = self.saved.take().ok_or_else(|| NnError::NoForward {
            layer: self.describe(),
        })?;
        if dy.shape() != shape.as_slice() {
            return Err(NnError::shape(
                "ReLU",
                "dy",
                dy.shape(),
                format!("{shape:?}"),
            ));
        }
        if !need_dx {
            return Ok(None);
        }
        let v = Vector::global()?;
        crate::par::runs_bits(dy.data_mut(), &self.mask, |d, m| Ok(v.relu_backward(d, m)?))?;
        Ok(Some(dy))
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        Ok(input.to_vec())
    }
}
