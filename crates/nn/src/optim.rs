//! [`Sgd`]: stochastic gradient descent with momentum and weight decay.

use crate::error::{NnError, Result};
use crate::layer::Parameter;

/// SGD as PyTorch's `torch.optim.SGD` computes it: `g = grad + weight_decay · p`,
/// `v = momentum · v + g` (v = g on the first step), `p -= lr · v`. The momentum buffers are the
/// optimizer's explicit state, one per parameter in the model's order, saved in checkpoints.
#[derive(Debug, Clone)]
pub struct Sgd {
    /// Learning rate.
    pub lr: f32,
    /// Momentum (0 disables it).
    pub momentum: f32,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
    buffers: Vec<Vec<f32>>,
}

impl Sgd {
    /// An optimizer; errors on a non-finite or negative value.
    pub fn new(lr: f32, momentum: f32, weight_decay: f32) -> Result<Self> {
        for (arg, v) in [
            ("lr", lr),
            ("momentum", momentum),
            ("weight_decay", weight_decay),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(NnError::config(
                    arg,
                    format!("{v} (must be finite and ≥ 0)"),
                ));
            }
        }
        Ok(Sgd {
            lr,
            momentum,
            weight_decay,
            buffers: Vec::new(),
        })
    }

    /// One update of every parameter from its gradient.
    pub fn step<'a>(&mut self, params: impl IntoIterator<Item = &'a mut Parameter>) -> Result<()> {
        for (i, p) in params.into_iter().enumerate() {
            if self.buffers.len() <= i {
                self.buffers.push(Vec::new());
            }
            let buf = &mut self.buffers[i];
            let first = buf.is_empty();
            if first && self.momentum != 0.0 {
                buf.resize(p.value.len(), 0.0);
            } else if self.momentum != 0.0 && buf.len() != p.value.len() {
                return Err(NnError::config(
                    "params",
                    format!(
                        "parameter {i} has {} values, its momentum buffer {}",
                        p.value.len(),
                        buf.len()
                    ),
                ));
            }
            let (wd, mom, lr) = (self.weight_decay, self.momentum, self.lr);
            let Parameter { value, grad } = p;
            for (j, (w, &g)) in value.data_mut().iter_mut().zip(grad.data()).enumerate() {
                let mut d = g + wd * *w;
                if mom != 0.0 {
                    d = if first { d } else { mom * buf[j] + d };
                    buf[j] = d;
                }
                *w -= lr * d;
            }
        }
        Ok(())
    }

    /// The momentum buffers (empty before the first step), for checkpoints.
    pub fn buffers(&self) -> &[Vec<f32>] {
        &self.buffers
    }

    /// Restores the momentum buffers from a checkpoint.
    pub fn set_buffers(&mut self, buffers: Vec<Vec<f32>>) {
        self.buffers = buffers;
    }
}
