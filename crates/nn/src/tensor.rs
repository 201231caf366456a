//! [`Tensor`]: a row-major (C order) f32 array with a shape.

use crate::error::{NnError, Result};

/// A dense, row-major f32 tensor. Activations are `N × C × spatial…` (PyTorch's NCHW / NCDHW),
/// weights `K × C × kernel…`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Tensor {
    /// A tensor of `shape` over `data`; errors when the lengths disagree.
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        let expected = shape.iter().product::<usize>();
        if data.len() != expected {
            return Err(NnError::DataLen {
                shape: shape.to_vec(),
                got: data.len(),
                expected,
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        Tensor {
            shape: shape.to_vec(),
            data: vec![0.0; shape.iter().product()],
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The values, row-major, mutable.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The values, consuming the tensor.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor holds no value.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The same values under another shape with the same number of values.
    pub fn reshape(self, shape: &[usize]) -> Result<Self> {
        Tensor::new(shape, self.data)
    }
}
