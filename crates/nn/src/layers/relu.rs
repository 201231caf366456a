//! [`Relu`]: `y = max(x, 0)`.

use crate::error::{NnError, Result};
use crate::layer::Layer;
use crate::tensor::Tensor;

/// The rectified linear unit. Keeps one bit per value (as bytes) for backward.
#[derive(Debug, Default)]
pub struct Relu {
    /// The shape of the forward input backward has not consumed yet.
    saved: Option<Vec<usize>>,
    /// `x > 0` per value of that input. Kept after backward, so the next step's forward
    /// fills the same allocation instead of faulting in fresh pages.
    mask: Vec<bool>,
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
        if train {
            self.mask.clear();
            self.mask.resize(x.len(), false);
            crate::par::zip_mut(x.data_mut(), &mut self.mask, |v, keep| {
                *keep = *v > 0.0;
                *v = v.max(0.0);
            });
            self.saved = Some(x.shape().to_vec());
        } else {
            crate::par::map_mut(x.data_mut(), |v| *v = v.max(0.0));
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
        // A select, not a branch: vectorises.
        crate::par::zip_ref(dy.data_mut(), &self.mask, |d, &keep| {
            *d = if keep { *d } else { 0.0 };
        });
        Ok(Some(dy))
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        Ok(input.to_vec())
    }
}
