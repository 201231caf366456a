//! [`Flatten`]: `N × …` to `N × (product of the rest)`.

use crate::error::{NnError, Result};
use crate::layer::Layer;
use crate::tensor::Tensor;

/// Flattens every axis after the batch axis (PyTorch's `nn.Flatten()`).
#[derive(Debug, Default)]
pub struct Flatten {
    shape: Option<Vec<usize>>,
}

impl Flatten {
    /// A flatten layer.
    pub fn new() -> Self {
        Flatten::default()
    }
}

impl Layer for Flatten {
    fn describe(&self) -> String {
        "Flatten".into()
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        if shape.is_empty() {
            return Err(NnError::shape("Flatten", "x", &shape, "at least 1 axis"));
        }
        if train {
            self.shape = Some(shape.clone());
        }
        let rest = shape[1..].iter().product();
        x.reshape(&[shape[0], rest])
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let shape = self.shape.take().ok_or_else(|| NnError::no_forward(self))?;
        if !need_dx {
            return Ok(None);
        }
        if dy.len() != shape.iter().product::<usize>() {
            return Err(NnError::shape(
                "Flatten",
                "dy",
                dy.shape(),
                format!("{} values", shape.iter().product::<usize>()),
            ));
        }
        Ok(Some(dy.reshape(&shape)?))
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        Ok(vec![input.iter().product()])
    }
}
