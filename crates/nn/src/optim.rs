//! [`Sgd`]: stochastic gradient descent with momentum and weight decay, and [`LrSchedule`]: the
//! learning rate over a run.

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

    /// One update of every parameter from its gradient. It also ends a training step for the
    /// recycling of tensor buffers ([`crate::Tensor`]'s module documentation): lengths no step
    /// asked for lately stop holding memory.
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
        crate::tensor::step_done();
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

/// How the learning rate moves over a run: a factor on the optimizer's base rate, a function of
/// the training position (global step and epoch), so a resumed run continues the schedule where
/// the checkpoint left it. [`crate::fit_with`] applies it before every step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LrSchedule(Kind);

// `gamma` is validated finite, so equality is an equivalence.
impl Eq for LrSchedule {}

#[derive(Debug, Clone, PartialEq, Default)]
enum Kind {
    #[default]
    Constant,
    Cosine {
        warmup: usize,
        total: usize,
    },
    MultiStep {
        milestones: Vec<usize>,
        gamma: f32,
    },
}

impl LrSchedule {
    /// The base rate throughout (PyTorch without a scheduler).
    pub fn constant() -> Self {
        LrSchedule(Kind::Constant)
    }

    /// A linear warm-up over the first `warmup` steps (step s runs at (s + 1) / warmup of the
    /// base rate), then cosine annealing to 0 at step `total` (PyTorch's `LinearLR` then
    /// `CosineAnnealingLR` with `eta_min` 0); 0 after `total`.
    ///
    /// Errors: [`NnError::Config`] when `total` is 0 or `warmup` is not below `total`.
    pub fn cosine(warmup: usize, total: usize) -> Result<Self> {
        if total == 0 || warmup >= total {
            return Err(NnError::config(
                "lr schedule",
                format!(
                    "cosine over {total} steps with {warmup} warm-up steps (need warm-up < total, total > 0)"
                ),
            ));
        }
        Ok(LrSchedule(Kind::Cosine { warmup, total }))
    }

    /// The base rate times `gamma` for every milestone epoch reached (PyTorch's `MultiStepLR`:
    /// in epoch e, gamma to the number of milestones ≤ e, epochs counted from 0).
    ///
    /// Errors: [`NnError::Config`] when `gamma` is not finite and positive.
    pub fn multi_step(mut milestones: Vec<usize>, gamma: f32) -> Result<Self> {
        if !gamma.is_finite() || gamma <= 0.0 {
            return Err(NnError::config(
                "lr gamma",
                format!("{gamma} (must be finite and > 0)"),
            ));
        }
        milestones.sort_unstable();
        Ok(LrSchedule(Kind::MultiStep { milestones, gamma }))
    }

    /// The factor on the base rate for the step with global index `step` (0-based) in epoch
    /// `epoch` (0-based).
    pub fn factor(&self, step: usize, epoch: usize) -> f32 {
        match &self.0 {
            Kind::Constant => 1.0,
            Kind::Cosine { warmup, total } => {
                if step < *warmup {
                    (step + 1) as f32 / *warmup as f32
                } else if step >= *total {
                    0.0
                } else {
                    let p = (step - warmup) as f64 / (total - warmup) as f64;
                    (0.5 * (1.0 + (std::f64::consts::PI * p).cos())) as f32
                }
            }
            Kind::MultiStep { milestones, gamma } => {
                let reached = milestones.iter().filter(|&&m| m <= epoch).count();
                gamma.powi(reached as i32)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_follow_their_definitions() {
        let c = LrSchedule::constant();
        assert_eq!((c.factor(0, 0), c.factor(10_000, 90)), (1.0, 1.0));
        let cos = LrSchedule::cosine(4, 14).unwrap();
        let f: Vec<f32> = (0..16).map(|s| cos.factor(s, 0)).collect();
        assert_eq!(&f[..4], &[0.25, 0.5, 0.75, 1.0]);
        assert!(
            (f[9] - 0.5).abs() < 1e-6,
            "half-way through the cosine: {}",
            f[9]
        );
        assert!(f[4..14].windows(2).all(|w| w[1] < w[0]), "{f:?}");
        assert_eq!((f[14], f[15]), (0.0, 0.0));
        assert!(LrSchedule::cosine(0, 0).is_err());
        assert!(LrSchedule::cosine(5, 5).is_err());
        assert_eq!(LrSchedule::cosine(0, 3).unwrap().factor(0, 0), 1.0);
        let m = LrSchedule::multi_step(vec![6, 3], 0.1).unwrap();
        let f: Vec<f32> = [0, 2, 3, 5, 6, 9].iter().map(|&e| m.factor(0, e)).collect();
        let want = [1.0, 1.0, 0.1, 0.1, 0.1f32 * 0.1, 0.1f32 * 0.1];
        assert!(
            f.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-7),
            "{f:?}"
        );
        assert!(LrSchedule::multi_step(vec![1], 0.0).is_err());
        assert!(LrSchedule::multi_step(vec![1], f32::NAN).is_err());
    }
}
