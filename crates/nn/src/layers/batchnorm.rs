//! [`BatchNorm`]: batch normalisation over the batch and spatial axes, per channel.

use core_blas::vector::{Planes, Vector};
use rayon::prelude::*;

use crate::error::{NnError, Result};
use crate::layer::{Layer, Parameter};
use crate::tensor::Tensor;

/// The per-channel statistics hook of [`BatchNorm::forward_reduced`] and
/// [`BatchNorm::backward_reduced`]: replaces the buffer by its element-wise sum over the
/// processes that hold parts of the batch.
pub type StatsReduce<'a> = dyn FnMut(&mut [f64]) -> Result<()> + 'a;

/// Which per-channel sums become the parameter gradients in [`BatchNorm::backward_reduced`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BnGrads {
    /// The sums over all parts: every process gets the whole layer's gradients (spatial
    /// parallelism, where the processes hold rows of the same samples).
    Reduced,
    /// This part's own sums: a data-parallel trainer sums the gradients over the processes
    /// itself, as it does every other layer's.
    Local,
}

/// One channel's planes of an `n × c × plane` tensor, in the slice from the channel's first
/// value: `n` planes of `plane` values, `c · plane` apart.
fn channel_planes(n: usize, c: usize, plane: usize) -> Planes {
    Planes {
        len: plane,
        stride: c * plane,
        count: n,
    }
}

/// The plane length from which a single process sums batch statistics plane by plane in memory
/// order rather than channel by channel ([`BatchNorm`]'s `Layer` passes): below it the per-plane
/// calls cost more than the strided reads save (bnprobe, session 24: 14×14 planes 10-30% slower,
/// 28×28 backward 1.3x faster, 32×32 planes of 64 samples forward 1.9x faster).
const PLANE_ORDER_MIN: usize = 512;

/// What backward needs: the normalised input and 1/σ per channel.
#[derive(Debug)]
struct Saved {
    shape: Vec<usize>,
    /// A tensor (of `shape`), so that its buffer is recycled when backward is done with it.
    xhat: Tensor,
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

    /// Moves the running statistics towards the batch's by `momentum`: `mean_var` gives each
    /// channel's batch mean and biased variance over `count` values; the running variance takes
    /// the unbiased one (`count / (count - 1)`), as PyTorch's does.
    fn update_running(&mut self, count: usize, mean_var: impl Iterator<Item = (f64, f64)>) {
        let unbias = count as f64 / (count - 1) as f64;
        let mom = f64::from(self.momentum);
        let rms = self.running_mean.data_mut().iter_mut();
        let rvs = self.running_var.data_mut().iter_mut();
        for ((rm, rv), (mean, var)) in rms.zip(rvs).zip(mean_var) {
            *rm = ((1.0 - mom) * f64::from(*rm) + mom * mean) as f32;
            *rv = ((1.0 - mom) * f64::from(*rv) + mom * var * unbias) as f32;
        }
    }

    /// What the last training forward saved, taken (so a second backward is an error), after
    /// checking that `dy` has the forward output's shape.
    fn take_saved(&mut self, dy: &Tensor) -> Result<Saved> {
        let saved = self.saved.take().ok_or_else(|| NnError::no_forward(self))?;
        NnError::expect_shape(|| self.describe(), "dy", dy.shape(), &saved.shape)?;
        Ok(saved)
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
        let v = Vector::global()?;
        let (mean, var, count): (Vec<f64>, Vec<f64>, usize) = if train {
            let data = x.data();
            let planes = channel_planes(n, c, plane);
            // One read of x per channel: Σ (x − k) and Σ (x − k)² around k, the mean of the
            // channel's first plane (read twice, the second time from cache), all N planes in one
            // call. With k near the mean, M2 = Σ (x − k)² − (Σ (x − k))² / n in f64 keeps f32
            // accuracy where Σx² − (Σx)²/n would cancel (a mean far from 0 against the spread).
            let shifted: Vec<[f64; 3]> = (0..c)
                .into_par_iter()
                .map(|ch| {
                    // Empty when the batch is (n = 0: no planes to read).
                    let at = data.get(ch * plane..).unwrap_or_default();
                    let k = match (n, plane) {
                        (0, _) | (_, 0) => 0.0,
                        _ => (v.sum(&at[..plane]) / plane as f64) as f32,
                    };
                    let (s1, s2) = v.shifted_sums_planes(at, planes, k)?;
                    Ok([f64::from(k), s1, s2])
                })
                .collect::<Result<_>>()?;
            // Σ x per channel, and the number of values, summed over the parts.
            let mut sums: Vec<f64> = shifted
                .iter()
                .map(|&[k, s1, _]| k * local as f64 + s1)
                .collect();
            sums.push(local as f64);
            reduce(&mut sums)?;
            let count = sums.pop().unwrap_or(0.0).round() as usize;
            if count < 2 {
                let detail = "training needs more than one value per channel (PyTorch refuses too)";
                return Err(NnError::shape(self.describe(), "x", &shape, detail));
            }
            let mean: Vec<f64> = sums.iter().map(|s| s / count as f64).collect();
            // Σ (x − mean)² per channel: this part's M2 around its own mean, plus its values'
            // share of the distance between its mean and the whole batch's (Chan et al.'s
            // pairwise combination), summed over the parts.
            let mut ss: Vec<f64> = shifted
                .iter()
                .zip(&mean)
                .map(|(&[k, s1, s2], &m)| {
                    if local == 0 {
                        return 0.0;
                    }
                    let nl = local as f64;
                    let d = k + s1 / nl - m;
                    (s2 - s1 * s1 / nl).max(0.0) + nl * d * d
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
        // bn_train writes every value of x̂.
        let mut xhat = if train {
            Tensor::scratch(&shape)
        } else {
            Tensor::zeros(&[0])
        };
        // Plane k of the N × C planes belongs to channel k mod C.
        let affine = |k: usize| {
            let ch = k % c;
            (mean[ch] as f32, inv_std[ch], gamma[ch], beta[ch])
        };
        if train {
            crate::par::planes_mut(x.data_mut(), xhat.data_mut(), plane, |k, p, h| {
                let (m, s, g, b) = affine(k);
                Ok(v.bn_train(p, h, m, s, g, b)?)
            })?;
        } else {
            // y = x·a + b with a = γ/σ and b = β − μ·a (one multiply-add per value).
            crate::par::planes(x.data_mut(), plane, |k, p| {
                let (m, s, g, b) = affine(k);
                let a = s * g;
                v.scale_shift(p, a, b - m * a);
                Ok(())
            })?;
        }
        if train {
            self.update_running(count, mean.iter().copied().zip(var.iter().copied()));
            self.saved = Some(Saved {
                xhat,
                shape,
                inv_std,
            });
        }
        Ok(x)
    }

    /// [`Layer::backward`] for a batch split over processes (by rows or by samples): `reduce`
    /// must replace the per-channel sums of `dy` and `dy·x̂` (and this part's value count) by
    /// their sums over the parts, so `dx` is this part's share of the whole batch's. The
    /// parameter gradients are the reduced sums (the whole batch's on every process) or this
    /// part's own, as `grads` says. Pair it with [`forward_reduced`](BatchNorm::forward_reduced).
    ///
    /// Errors: as [`Layer::backward`], and the first error of `reduce`.
    pub fn backward_reduced(
        &mut self,
        mut dy: Tensor,
        need_dx: bool,
        reduce: &mut StatsReduce,
        grads: BnGrads,
    ) -> Result<Option<Tensor>> {
        let Saved {
            shape,
            xhat,
            inv_std,
        } = self.take_saved(&dy)?;
        let (n, plane) = self.dims(&shape)?;
        let c = self.channels;
        let xhat = xhat.data();
        // Per channel: Σ dy and Σ dy·x̂, then the value count, summed over the parts.
        let v = Vector::global()?;
        let planes = channel_planes(n, c, plane);
        let sums: Vec<[f64; 2]> = (0..c)
            .into_par_iter()
            .map(|ch| {
                let at = ch * plane;
                let (d, h) = (dy.data().get(at..), xhat.get(at..));
                let (d, h) = (d.unwrap_or_default(), h.unwrap_or_default());
                let (s, sx) = v.sum_dot_planes(d, h, planes)?;
                Ok([s, sx])
            })
            .collect::<Result<_>>()?;
        let mut flat: Vec<f64> = sums.into_iter().flatten().collect();
        let write = |bn: &mut BatchNorm, flat: &[f64]| {
            for (ch, p) in flat.chunks_exact(2).take(c).enumerate() {
                bn.bias.grad.data_mut()[ch] = p[0] as f32;
                bn.weight.grad.data_mut()[ch] = p[1] as f32;
            }
        };
        if grads == BnGrads::Local {
            write(self, &flat);
        }
        flat.push((n * plane) as f64);
        reduce(&mut flat)?;
        let count = flat.pop().unwrap_or(0.0);
        if grads == BnGrads::Reduced {
            write(self, &flat);
        }
        let sums: Vec<(f64, f64)> = flat.chunks_exact(2).map(|p| (p[0], p[1])).collect();
        if !need_dx {
            return Ok(None);
        }
        // dx = γ/σ · (dy − mean(dy) − x̂ · mean(dy·x̂)).
        let gamma = self.weight.value.data();
        crate::par::planes_ref(dy.data_mut(), xhat, plane, |p, d, h| {
            let ch = p % c;
            let k = gamma[ch] * inv_std[ch];
            let (md, mdx) = ((sums[ch].0 / count) as f32, (sums[ch].1 / count) as f32);
            Ok(v.bn_backward(d, h, k, md, mdx)?)
        })?;
        Ok(Some(dy))
    }

    /// Training forward of a whole batch in one process: the same arithmetic as
    /// [`forward_reduced`] with one part, except that the statistics are summed plane by plane
    /// over `x` in memory order (then per channel over the samples) instead of channel by
    /// channel, whose `N` short planes `C · plane` apart starve the prefetchers.
    ///
    /// [`forward_reduced`]: BatchNorm::forward_reduced
    fn forward_train_local(&mut self, mut x: Tensor) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        let (n, plane) = self.dims(&shape)?;
        let c = self.channels;
        let count = n * plane;
        if count < 2 {
            let detail = "training needs more than one value per channel (PyTorch refuses too)";
            return Err(NnError::shape(self.describe(), "x", &shape, detail));
        }
        let v = Vector::global()?;
        let data = x.data();
        // Σ (x − k) and Σ (x − k)² around k, the mean of the channel's first plane (as in
        // forward_reduced), per plane, then per channel.
        let ks = crate::par::map_planes(&data[..c * plane], plane, |_, p| {
            Ok((v.sum(p) / plane as f64) as f32)
        })?;
        let per_plane =
            crate::par::map_planes(data, plane, |k, p| Ok(v.shifted_sums(p, ks[k % c])))?;
        let nl = count as f64;
        let stats: Vec<(f64, f64)> = (0..c)
            .map(|ch| {
                let (s1, s2) = per_plane[ch..]
                    .iter()
                    .step_by(c)
                    .fold((0.0, 0.0), |(a, b), &(p, q)| (a + p, b + q));
                let var = (s2 - s1 * s1 / nl).max(0.0) / nl;
                (f64::from(ks[ch]) + s1 / nl, var)
            })
            .collect();
        let inv_std: Vec<f32> = stats
            .iter()
            .map(|&(_, var)| (1.0 / (var + f64::from(self.eps)).sqrt()) as f32)
            .collect();
        let (gamma, beta) = (self.weight.value.data(), self.bias.value.data());
        // bn_train writes every value of x̂.
        let mut xhat = Tensor::scratch(&shape);
        crate::par::planes_mut(x.data_mut(), xhat.data_mut(), plane, |k, p, h| {
            let ch = k % c;
            let m = stats[ch].0 as f32;
            Ok(v.bn_train(p, h, m, inv_std[ch], gamma[ch], beta[ch])?)
        })?;
        self.update_running(count, stats.iter().copied());
        self.saved = Some(Saved {
            xhat,
            shape,
            inv_std,
        });
        Ok(x)
    }

    /// Backward of a whole batch in one process (after [`Layer::forward`] or a one-part
    /// [`forward_reduced`](BatchNorm::forward_reduced)): as [`backward_reduced`] with one part,
    /// the sums taken plane by plane in memory order, as in forward.
    ///
    /// [`backward_reduced`]: BatchNorm::backward_reduced
    fn backward_local(&mut self, mut dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let Saved {
            shape,
            xhat,
            inv_std,
        } = self.take_saved(&dy)?;
        let (n, plane) = self.dims(&shape)?;
        let c = self.channels;
        let v = Vector::global()?;
        // Σ dy and Σ dy·x̂ per plane, then per channel.
        let per_plane =
            crate::par::map_planes2(
                dy.data(),
                xhat.data(),
                plane,
                |_, d, h| Ok(v.sum_dot(d, h)?),
            )?;
        let sums: Vec<(f64, f64)> = (0..c)
            .map(|ch| {
                per_plane
                    .get(ch..)
                    .unwrap_or_default()
                    .iter()
                    .step_by(c)
                    .fold((0.0, 0.0), |(a, b), &(p, q)| (a + p, b + q))
            })
            .collect();
        for (ch, &(s, sx)) in sums.iter().enumerate() {
            self.bias.grad.data_mut()[ch] = s as f32;
            self.weight.grad.data_mut()[ch] = sx as f32;
        }
        if !need_dx {
            return Ok(None);
        }
        // dx = γ/σ · (dy − mean(dy) − x̂ · mean(dy·x̂)).
        let count = (n * plane) as f64;
        let gamma = self.weight.value.data();
        crate::par::planes_ref(dy.data_mut(), xhat.data(), plane, |p, d, h| {
            let ch = p % c;
            let k = gamma[ch] * inv_std[ch];
            let (md, mdx) = ((sums[ch].0 / count) as f32, (sums[ch].1 / count) as f32);
            Ok(v.bn_backward(d, h, k, md, mdx)?)
        })?;
        Ok(Some(dy))
    }
}

impl Layer for BatchNorm {
    fn describe(&self) -> String {
        format!("BatchNorm({})", self.channels)
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        let plane: usize = x.shape().get(2..).map_or(0, |s| s.iter().product());
        if train && plane >= PLANE_ORDER_MIN {
            self.forward_train_local(x)
        } else {
            self.forward_reduced(x, train, &mut |_| Ok(()))
        }
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let plane: usize = dy.shape().get(2..).map_or(0, |s| s.iter().product());
        if plane >= PLANE_ORDER_MIN {
            self.backward_local(dy, need_dx)
        } else {
            self.backward_reduced(dy, need_dx, &mut |_| Ok(()), BnGrads::Reduced)
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Barrier, Mutex};

    /// A two-part sum for `forward_reduced` / `backward_reduced`, part `me` of two threads.
    struct Pair {
        slots: Mutex<[Vec<f64>; 2]>,
        barrier: Barrier,
    }

    impl Pair {
        fn sum(&self, me: usize, buf: &mut [f64]) {
            self.slots.lock().unwrap()[me] = buf.to_vec();
            self.barrier.wait();
            {
                let slots = self.slots.lock().unwrap();
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = slots[0][i] + slots[1][i];
                }
            }
            self.barrier.wait();
        }
    }

    fn close(what: &str, got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{what}[{i}]: {a} vs {b}"
            );
        }
    }

    /// The batch statistics keep f32 accuracy when the mean is far from 0 against the spread
    /// (one-pass sums around 0 would lose the variance to cancellation): the running statistics
    /// after one step and the output against an f64 reference, for short and long planes.
    #[test]
    fn statistics_survive_a_large_mean() {
        // Both single-process orders: channel by channel, and plane by plane.
        for plane in [37, PLANE_ORDER_MIN + 7] {
            let (n, c) = (4, 2);
            let x: Vec<f32> = (0..n * c * plane)
                .map(|i| {
                    let image = (i / (c * plane)) as f32;
                    4096.0 + 0.25 * image + ((i * 37 % 23) as f32 - 11.0) / 7.0
                })
                .collect();
            let mut bn = BatchNorm::new(c).unwrap();
            let y = bn
                .forward(Tensor::new(&[n, c, plane], x.clone()).unwrap(), true)
                .unwrap();
            let count = (n * plane) as f64;
            for ch in 0..c {
                let values: Vec<f64> = (0..n)
                    .flat_map(|i| &x[(i * c + ch) * plane..][..plane])
                    .map(|&v| f64::from(v))
                    .collect();
                let mean = values.iter().sum::<f64>() / count;
                let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / count;
                let rm = f64::from(bn.running_mean.data()[ch]);
                let rv = f64::from(bn.running_var.data()[ch]);
                let (want_rm, want_rv) = (0.1 * mean, 0.9 + 0.1 * var * count / (count - 1.0));
                assert!(
                    (rm - want_rm).abs() <= 1e-6 * want_rm,
                    "mean {rm} vs {want_rm}"
                );
                assert!(
                    (rv - want_rv).abs() <= 1e-6 * want_rv,
                    "var {rv} vs {want_rv}"
                );
                for i in 0..n {
                    for (q, &v) in values[i * plane..][..plane].iter().enumerate() {
                        let want = (v - mean) / (var + 1e-5).sqrt();
                        let got = f64::from(y.data()[(i * c + ch) * plane + q]);
                        // x's mean is kept in f32 (a step of 2.4e-4 at 4096) for the normalisation.
                        assert!((got - want).abs() <= 1e-3, "y: {got} vs {want}");
                    }
                }
            }
        }
    }

    /// The single-process passes (sums plane by plane in memory order, across threads) equal
    /// the reduced passes with one part (sums channel by channel): outputs, `dx`, parameter
    /// gradients and running statistics, on one and two threads.
    #[test]
    fn local_passes_equal_the_reduced_ones() {
        let (n, c, plane) = (3, 7, 4000);
        let len = n * c * plane;
        assert!(len >= 2 * crate::par::PAR_MIN);
        let x: Vec<f32> = (0..len)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0 + (i / plane % c) as f32)
            .collect();
        let dy: Vec<f32> = (0..len)
            .map(|i| ((i * 13 % 17) as f32 - 8.0) / 5.0)
            .collect();
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let mut local = BatchNorm::new(c).unwrap();
                let mut reduced = BatchNorm::new(c).unwrap();
                let xt = || Tensor::new(&[n, c, plane], x.clone()).unwrap();
                let dyt = || Tensor::new(&[n, c, plane], dy.clone()).unwrap();
                let y1 = local.forward(xt(), true).unwrap();
                let y2 = reduced
                    .forward_reduced(xt(), true, &mut |_| Ok(()))
                    .unwrap();
                close("y", y1.data(), y2.data());
                let dx1 = local.backward(dyt(), true).unwrap().unwrap();
                let dx2 = reduced
                    .backward_reduced(dyt(), true, &mut |_| Ok(()), BnGrads::Reduced)
                    .unwrap()
                    .unwrap();
                close("dx", dx1.data(), dx2.data());
                for (k, (name, want)) in reduced.params().into_iter().enumerate() {
                    let got = local.params()[k].1.grad.data().to_vec();
                    let want = want.grad.data();
                    for (a, b) in got.iter().zip(want) {
                        assert!(
                            (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                            "{name}: {a} vs {b}"
                        );
                    }
                }
                for (k, (name, want)) in reduced.buffers().into_iter().enumerate() {
                    close(name.as_str(), local.buffers()[k].1.data(), want.data());
                }
                // Without dx, the same parameter gradients.
                let grads = |bn: &BatchNorm| -> Vec<Vec<f32>> {
                    bn.params()
                        .iter()
                        .map(|p| p.1.grad.data().to_vec())
                        .collect()
                };
                let first = grads(&local);
                local.forward(xt(), true).unwrap();
                assert!(local.backward(dyt(), false).unwrap().is_none());
                assert_eq!(grads(&local), first);
            });
        }
    }

    /// A batch split in two parts by samples (one of them possibly empty) through the reduced
    /// passes equals the whole batch: the outputs and `dx` are the parts of the whole's, the
    /// parameter gradients are the whole's (`Reduced`) or sum to it (`Local`).
    #[test]
    fn parts_with_summed_statistics_equal_the_whole_batch() {
        let (c, plane) = (3, 5);
        for (n, cut) in [(4, 2), (5, 2), (3, 0)] {
            let x: Vec<f32> = (0..n * c * plane)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
                .collect();
            let dy: Vec<f32> = (0..n * c * plane)
                .map(|i| ((i * 13 % 17) as f32 - 8.0) / 5.0)
                .collect();
            let mut whole = BatchNorm::new(c).unwrap();
            let y = whole
                .forward(Tensor::new(&[n, c, plane], x.clone()).unwrap(), true)
                .unwrap();
            let dx = whole
                .backward(Tensor::new(&[n, c, plane], dy.clone()).unwrap(), true)
                .unwrap()
                .unwrap();
            for grads in [BnGrads::Reduced, BnGrads::Local] {
                let pair = Pair {
                    slots: Mutex::new([Vec::new(), Vec::new()]),
                    barrier: Barrier::new(2),
                };
                let rows = [0..cut, cut..n];
                let parts: Vec<_> = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..2)
                        .map(|me| {
                            let (pair, r) = (&pair, rows[me].clone());
                            let (x, dy) = (&x, &dy);
                            s.spawn(move || {
                                let span = r.start * c * plane..r.end * c * plane;
                                let shape = [r.len(), c, plane];
                                let mut bn = BatchNorm::new(c).unwrap();
                                let reduce = &mut |b: &mut [f64]| {
                                    pair.sum(me, b);
                                    Ok(())
                                };
                                let xs = Tensor::new(&shape, x[span.clone()].to_vec()).unwrap();
                                let y = bn.forward_reduced(xs, true, reduce).unwrap();
                                let dys = Tensor::new(&shape, dy[span].to_vec()).unwrap();
                                let dx = bn.backward_reduced(dys, true, reduce, grads).unwrap();
                                (y, dx.unwrap(), bn)
                            })
                        })
                        .collect();
                    handles.into_iter().map(|h| h.join().unwrap()).collect()
                });
                let ys: Vec<f32> = parts.iter().flat_map(|p| p.0.data().to_vec()).collect();
                let dxs: Vec<f32> = parts.iter().flat_map(|p| p.1.data().to_vec()).collect();
                close("y", &ys, y.data());
                close("dx", &dxs, dx.data());
                for (k, (name, want)) in whole.params().into_iter().enumerate() {
                    let per: Vec<&[f32]> = parts
                        .iter()
                        .map(|p| p.2.params()[k].1.grad.data())
                        .collect();
                    let got: Vec<f32> = match grads {
                        BnGrads::Reduced => {
                            close(&format!("{name} grad, part 2"), per[1], per[0]);
                            per[0].to_vec()
                        }
                        BnGrads::Local => per[0].iter().zip(per[1]).map(|(a, b)| a + b).collect(),
                    };
                    close(
                        &format!("{name} grad ({grads:?}, n {n})"),
                        &got,
                        want.grad.data(),
                    );
                }
                for (k, (name, want)) in whole.buffers().into_iter().enumerate() {
                    close(name.as_str(), parts[0].2.buffers()[k].1.data(), want.data());
                }
            }
        }
    }
}
