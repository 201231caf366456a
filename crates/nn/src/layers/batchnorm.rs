//! [`BatchNorm`]: batch normalisation over the batch and spatial axes, per channel.

use rayon::prelude::*;

use crate::error::{NnError, Result};
use crate::layer::{Layer, Parameter};
use crate::tensor::Tensor;

/// Σ f(a[i], b[i]) over a plane in 8 f32 lanes (vectorisable; a plane's partial sums stay short),
/// returned in f64 for the sum over planes.
fn lanes(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f64 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += f(x[l], y[l]);
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(&x, &y)| f(x, y) as f64).sum();
    acc.iter().map(|&v| v as f64).sum::<f64>() + tail
}

/// The per-channel statistics hook of [`BatchNorm::forward_reduced`] and
/// [`BatchNorm::backward_reduced`]: replaces the buffer by its element-wise sum over the
/// processes that hold parts of the batch.
pub type StatsReduce<'a> = dyn FnMut(&mut [f64]) -> Result<()> + 'a;

/// What backward needs: the normalised input and 1/σ per channel.
#[derive(Debug)]
struct Saved {
    shape: Vec<usize>,
    xhat: Vec<f32>,
    inv_std: Vec<f32>,
}

/// PyTorch's `BatchNorm{1,2,3}d(channels)` (eps 1e-5, momentum 0.1, affine): in training, each
/// channel is normalised with the batch's mean and biased variance over `N × spatial`, then
/// scaled by `weight` and shifted by `bias`, and the running statistics move towards the batch's
/// (unbiased variance); in evaluation the running statistics normalise.
#[derive(Debug)]
pub struct BatchNorm {
    channels: usize,
    eps: f32,
    momentum: f32,
    weight: Parameter,
    bias: Parameter,
    running_mean: Tensor,
    running_var: Tensor,
    saved: Option<Saved>,
}

impl BatchNorm {
    /// A layer over `channels` channels: weight 1, bias 0, running mean 0, running variance 1.
    pub fn new(channels: usize) -> Result<Self> {
        if channels == 0 {
            return Err(NnError::config("channels", "0 (must be positive)"));
        }
        Ok(BatchNorm {
            channels,
            eps: 1e-5,
            momentum: 0.1,
            weight: Parameter::new(Tensor::new(&[channels], vec![1.0; channels])?),
            bias: Parameter::new(Tensor::zeros(&[channels])),
            running_mean: Tensor::zeros(&[channels]),
            running_var: Tensor::new(&[channels], vec![1.0; channels])?,
            saved: None,
        })
    }

    /// (N, per-channel plane length) of `x`, or a shape error.
    fn dims(&self, shape: &[usize]) -> Result<(usize, usize)> {
        if shape.len() < 2 || shape[1] != self.channels {
            let want = format!("N × {} × spatial", self.channels);
            return Err(NnError::shape(self.describe(), "x", shape, want));
        }
        Ok((shape[0], shape[2..].iter().product()))
    }

    /// [`Layer::forward`] for a batch split over processes by rows (spatial parallelism): in
    /// training, `reduce` receives per-channel partial statistics of this process's part and
    /// must replace them by their sum over the processes holding the other parts (once for the
    /// sums and counts, once for the squared deviations from the mean), so each part is
    /// normalised with the whole batch's mean and variance. With an identity `reduce` this is
    /// [`Layer::forward`].
    ///
    /// Errors: as [`Layer::forward`], and the first error of `reduce`.
    pub fn forward_reduced(
        &mut self,
        mut x: Tensor,
        train: bool,
        reduce: &mut StatsReduce,
    ) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        let (n, plane) = self.dims(&shape)?;
        let c = self.channels;
        let local = n * plane;
        let (mean, var, count): (Vec<f64>, Vec<f64>, usize) = if train {
            let data = x.data();
            let planes = |ch: usize| (0..n).map(move |i| &data[(i * c + ch) * plane..][..plane]);
            // Σ x per channel, and the number of values, summed over the parts.
            let mut sums: Vec<f64> = (0..c)
                .into_par_iter()
                .map(|ch| planes(ch).map(|p| lanes(p, p, |v, _| v)).sum())
                .collect();
            sums.push(local as f64);
            reduce(&mut sums)?;
            let count = sums.pop().unwrap_or(0.0).round() as usize;
            if count < 2 {
                let detail = "training needs more than one value per channel (PyTorch refuses too)";
                return Err(NnError::shape(self.describe(), "x", &shape, detail));
            }
            let mean: Vec<f64> = sums.iter().map(|s| s / count as f64).collect();
            // Σ (x − mean)² per channel (two passes, as one process computes it).
            let mut ss: Vec<f64> = (0..c)
                .into_par_iter()
                .map(|ch| {
                    let m = mean[ch] as f32;
                    planes(ch)
                        .map(|p| lanes(p, p, |v, _| (v - m) * (v - m)))
                        .sum()
                })
                .collect();
            reduce(&mut ss)?;
            let var = ss.iter().map(|s| s / count as f64).collect();
            (mean, var, count)
        } else {
            let m = self.running_mean.data().iter().map(|&v| v as f64).collect();
            let v = self.running_var.data().iter().map(|&v| v as f64).collect();
            (m, v, local)
        };
        let inv_std: Vec<f32> = var
            .iter()
            .map(|&v| (1.0 / (v + self.eps as f64).sqrt()) as f32)
            .collect();
        let (gamma, beta) = (self.weight.value.data(), self.bias.value.data());
        let mut xhat = if train {
            crate::tensor::zeroed(x.len())
        } else {
            Vec::new()
        };
        {
            let data = x.data_mut();
            for i in 0..n {
                for ch in 0..c {
                    let at = (i * c + ch) * plane;
                    let (m, s) = (mean[ch] as f32, inv_std[ch]);
                    let (g, b) = (gamma[ch], beta[ch]);
                    let p = &mut data[at..at + plane];
                    if train {
                        for (h, v) in xhat[at..at + plane].iter_mut().zip(p.iter_mut()) {
                            *h = (*v - m) * s;
                            *v = *h * g + b;
                        }
                    } else {
                        p.iter_mut().for_each(|v| *v = (*v - m) * s * g + b);
                    }
                }
            }
        }
        if train {
            let unbias = count as f64 / (count - 1) as f64;
            let mom = self.momentum as f64;
            for ch in 0..c {
                let rm = &mut self.running_mean.data_mut()[ch];
                *rm = ((1.0 - mom) * *rm as f64 + mom * mean[ch]) as f32;
                let rv = &mut self.running_var.data_mut()[ch];
                *rv = ((1.0 - mom) * *rv as f64 + mom * var[ch] * unbias) as f32;
            }
            self.saved = Some(Saved {
                shape,
                xhat,
                inv_std,
            });
        }
        Ok(x)
    }

    /// [`Layer::backward`] for a batch split over processes by rows: `reduce` must replace the
    /// per-channel sums of `dy` and `dy·x̂` (and this part's value count) by their sums over the
    /// parts, so the parameter gradients are the whole batch's on every process and `dx` is
    /// this part's rows of the whole batch's. Pair it with
    /// [`forward_reduced`](BatchNorm::forward_reduced).
    ///
    /// Errors: as [`Layer::backward`], and the first error of `reduce`.
    pub fn backward_reduced(
        &mut self,
        mut dy: Tensor,
        need_dx: bool,
        reduce: &mut StatsReduce,
    ) -> Result<Option<Tensor>> {
        let Saved {
            shape,
            xhat,
            inv_std,
        } = self.saved.take().ok_or_else(|| NnError::NoForward {
            layer: self.describe(),
        })?;
        if dy.shape() != shape.as_slice() {
            return Err(NnError::shape(
                self.describe(),
                "dy",
                dy.shape(),
                format!("{shape:?}"),
            ));
        }
        let (n, plane) = self.dims(&shape)?;
        let c = self.channels;
        // Per channel: Σ dy and Σ dy·x̂, then the value count, summed over the parts.
        let mut flat: Vec<f64> = (0..c)
            .into_par_iter()
            .map(|ch| {
                let (mut s, mut sx) = (0f64, 0f64);
                for i in 0..n {
                    let at = (i * c + ch) * plane;
                    let (d, h) = (&dy.data()[at..at + plane], &xhat[at..at + plane]);
                    s += lanes(d, d, |v, _| v);
                    sx += lanes(d, h, |a, b| a * b);
                }
                [s, sx]
            })
            .flatten_iter()
            .collect();
        flat.push((n * plane) as f64);
        reduce(&mut flat)?;
        let count = flat.pop().unwrap_or(0.0);
        let sums: Vec<(f64, f64)> = flat.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        for (ch, &(s, sx)) in sums.iter().enumerate() {
            self.bias.grad.data_mut()[ch] = s as f32;
            self.weight.grad.data_mut()[ch] = sx as f32;
        }
        if !need_dx {
            return Ok(None);
        }
        // dx = γ/σ · (dy − mean(dy) − x̂ · mean(dy·x̂)).
        let gamma = self.weight.value.data();
        let data = dy.data_mut();
        for i in 0..n {
            for ch in 0..c {
                let at = (i * c + ch) * plane;
                let k = gamma[ch] * inv_std[ch];
                let (md, mdx) = ((sums[ch].0 / count) as f32, (sums[ch].1 / count) as f32);
                for (d, &h) in data[at..at + plane].iter_mut().zip(&xhat[at..at + plane]) {
                    *d = k * (*d - md - h * mdx);
                }
            }
        }
        Ok(Some(dy))
    }
}

impl Layer for BatchNorm {
    fn describe(&self) -> String {
        format!("BatchNorm({})", self.channels)
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        self.forward_reduced(x, train, &mut |_| Ok(()))
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        self.backward_reduced(dy, need_dx, &mut |_| Ok(()))
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

    fn buffers(&self) -> Vec<(String, &Tensor)> {
        vec![
            ("running_mean".into(), &self.running_mean),
            ("running_var".into(), &self.running_var),
        ]
    }

    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![
            ("running_mean".into(), &mut self.running_mean),
            ("running_var".into(), &mut self.running_var),
        ]
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        if input.first() != Some(&self.channels) {
            let want = format!("{} × spatial", self.channels);
            return Err(NnError::shape(self.describe(), "input", input, want));
        }
        Ok(input.to_vec())
    }
}
