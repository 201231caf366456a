//! [`Linear`]: `y = x · weightᵀ + bias`.

use rand::rngs::SmallRng;

use crate::error::{NnError, Result};
use crate::layer::{Layer, Parameter};
use crate::tensor::Tensor;

/// A fully connected layer: x `N × in`, weight `out × in`, bias `out` (PyTorch's layout and
/// names). The three products run on `core_blas::sgemm`.
#[derive(Debug)]
pub struct Linear {
    inputs: usize,
    outputs: usize,
    weight: Parameter,
    bias: Parameter,
    saved_x: Option<Tensor>,
}

impl Linear {
    /// A layer `inputs → outputs`, initialised as PyTorch does (uniform in ±1/√inputs).
    pub fn new(inputs: usize, outputs: usize, rng: &mut SmallRng) -> Result<Self> {
        if inputs == 0 || outputs == 0 {
            return Err(NnError::config(
                "features",
                format!("{inputs} → {outputs}: both must be positive"),
            ));
        }
        Ok(Linear {
            inputs,
            outputs,
            weight: Parameter::uniform_fan_in(&[outputs, inputs], inputs, rng),
            bias: Parameter::uniform_fan_in(&[outputs], inputs, rng),
            saved_x: None,
        })
    }
}

impl Layer for Linear {
    fn describe(&self) -> String {
        format!("Linear({}→{})", self.inputs, self.outputs)
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        if x.shape().len() != 2 || x.shape()[1] != self.inputs {
            return Err(NnError::shape(
                self.describe(),
                "x",
                x.shape(),
                format!("N × {}", self.inputs),
            ));
        }
        let n = x.shape()[0];
        let (i, o) = (self.inputs, self.outputs);
        // Start from the bias in every row, then y += x · Wᵀ.
        let mut y: Vec<f32> = (0..n)
            .flat_map(|_| self.bias.value.data().iter().copied())
            .collect();
        core_blas::sgemm(
            false,
            true,
            n,
            o,
            i,
            1.0,
            x.data(),
            i,
            self.weight.value.data(),
            i,
            1.0,
            &mut y,
            o,
        )?;
        self.saved_x = train.then_some(x);
        Tensor::new(&[n, o], y)
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let x = self
            .saved_x
            .take()
            .ok_or_else(|| NnError::no_forward(self))?;
        let n = x.shape()[0];
        let (i, o) = (self.inputs, self.outputs);
        NnError::expect_shape(|| self.describe(), "dy", dy.shape(), &[n, o])?;
        // dW = dyᵀ · x (o × i), db = column sums of dy, dx = dy · W (n × i).
        core_blas::sgemm(
            true,
            false,
            o,
            i,
            n,
            1.0,
            dy.data(),
            o,
            x.data(),
            i,
            0.0,
            self.weight.grad.data_mut(),
            i,
        )?;
        let db = self.bias.grad.data_mut();
        db.fill(0.0);
        for row in dy.data().chunks_exact(o) {
            db.iter_mut().zip(row).for_each(|(d, &v)| *d += v);
        }
        if !need_dx {
            return Ok(None);
        }
        let mut dx = Tensor::zeros(&[n, i]);
        core_blas::sgemm(
            false,
            false,
            n,
            i,
            o,
            1.0,
            dy.data(),
            o,
            self.weight.value.data(),
            i,
            0.0,
            dx.data_mut(),
            i,
        )?;
        Ok(Some(dx))
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        vec![("weight".into(), &self.weight), ("bias".into(), &self.bias)]
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        vec![
            ("weight".into(), &mut self.weight),
            ("bias".into(), &mut self.bias),
        ]
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        if input.iter().product::<usize>() != self.inputs || input.len() != 1 {
            return Err(NnError::shape(
                self.describe(),
                "input",
                input,
                format!("[{}]", self.inputs),
            ));
        }
        Ok(vec![self.outputs])
    }
}
