//! Measured f32 accuracy of an F(m, r) algorithm against an f64 direct correlation.
//!
//! The metric is the one the project's accuracy goal is stated in: for each random trial, the
//! maximum absolute error of the f32 fast algorithm over the output tile divided by the maximum
//! magnitude of the exact (f64) output, `max|y − y_ref| / max|y_ref|`; a measurement reports the
//! maximum and the mean of that ratio over the trials. Inputs and kernels are uniform in [−1, 1].

use crate::error::{FastconvError, Result};
use crate::ntransform::TileTransforms;
use crate::synthesis::WinogradTransform;

/// A small deterministic generator (SplitMix64) for reproducible measurements without pulling a
/// random-number crate into the library.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Seeds the generator.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [−1, 1), already representable in f32 (24 random bits).
    pub fn uniform_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
    }
}

/// Direct N-d valid correlation in f64: `y[i] = Σ_k d[i + k] g[k]` with `d` of shape `d_dims`,
/// `g` of shape `g_dims` (same rank), `y` of shape `d_dims − g_dims + 1`. The independent reference
/// of every accuracy figure.
pub fn correlate_nd_f64(
    d: &[f64],
    d_dims: &[usize],
    g: &[f64],
    g_dims: &[usize],
) -> Result<Vec<f64>> {
    if d_dims.len() != g_dims.len() {
        return Err(FastconvError::Rank {
            arg: "g_dims",
            got: g_dims.len(),
            expected: d_dims.len(),
        });
    }
    if d_dims.contains(&0) {
        return Err(FastconvError::Zero { arg: "d_dims" });
    }
    if g_dims.contains(&0) {
        return Err(FastconvError::Zero { arg: "g_dims" });
    }
    for (n, (&dn, &gn)) in d_dims.iter().zip(g_dims).enumerate() {
        if gn > dn {
            return Err(FastconvError::Shape {
                arg: "g_dims",
                detail: format!("kernel size {gn} exceeds input size {dn} in dimension {n}"),
            });
        }
    }
    let nd: usize = d_dims.iter().product();
    let ng: usize = g_dims.iter().product();
    if d.len() != nd {
        return Err(FastconvError::BufferLength {
            arg: "d",
            got: d.len(),
            expected: nd,
        });
    }
    if g.len() != ng {
        return Err(FastconvError::BufferLength {
            arg: "g",
            got: g.len(),
            expected: ng,
        });
    }
    let y_dims: Vec<usize> = d_dims.iter().zip(g_dims).map(|(d, g)| d - g + 1).collect();
    let rank = d_dims.len();
    // Row-major strides of d.
    let mut d_stride = vec![1usize; rank];
    for n in (0..rank.saturating_sub(1)).rev() {
        d_stride[n] = d_stride[n + 1] * d_dims[n + 1];
    }
    let unravel = |mut flat: usize, dims: &[usize], idx: &mut [usize]| {
        for n in (0..dims.len()).rev() {
            idx[n] = flat % dims[n];
            flat /= dims[n];
        }
    };
    let ny: usize = y_dims.iter().product();
    let mut y = vec![0.0; ny];
    let (mut yi, mut ki) = (vec![0; rank], vec![0; rank]);
    for (flat_y, yv) in y.iter_mut().enumerate() {
        unravel(flat_y, &y_dims, &mut yi);
        let mut acc = 0.0;
        for (flat_k, &gv) in g.iter().enumerate() {
            unravel(flat_k, g_dims, &mut ki);
            let off: usize = (0..rank).map(|n| (yi[n] + ki[n]) * d_stride[n]).sum();
            acc += d[off] * gv;
        }
        *yv = acc;
    }
    Ok(y)
}

/// Result of an accuracy measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorStats {
    /// Maximum over trials of `max|y − y_ref| / max|y_ref|`.
    pub max_rel: f64,
    /// Mean over trials of the same ratio.
    pub mean_rel: f64,
    /// Number of trials.
    pub trials: usize,
}

/// Measures the f32 error of the N-d fast algorithm built from `per_dim` (one 1-D transform per
/// dimension, executed exactly as [`TileTransforms::correlate_tile`] does) against
/// [`correlate_nd_f64`] on `trials` random tiles drawn from `seed`.
pub fn measure_error(
    per_dim: &[WinogradTransform],
    trials: usize,
    seed: u64,
) -> Result<ErrorStats> {
    if trials == 0 {
        return Err(FastconvError::Zero { arg: "trials" });
    }
    let tt = TileTransforms::new(per_dim)?;
    let d_dims = tt.in_tile();
    let g_dims = tt.kernel().to_vec();
    let nd: usize = d_dims.iter().product();
    let ng: usize = g_dims.iter().product();
    let mut rng = SplitMix64::new(seed);
    let (mut max_rel, mut sum_rel) = (0.0f64, 0.0f64);
    for _ in 0..trials {
        let d: Vec<f32> = (0..nd).map(|_| rng.uniform_f32()).collect();
        let g: Vec<f32> = (0..ng).map(|_| rng.uniform_f32()).collect();
        let y = tt.correlate_tile(&d, &g)?;
        let d64: Vec<f64> = d.iter().map(|&v| f64::from(v)).collect();
        let g64: Vec<f64> = g.iter().map(|&v| f64::from(v)).collect();
        let y_ref = correlate_nd_f64(&d64, &d_dims, &g64, &g_dims)?;
        let scale = y_ref.iter().fold(0.0f64, |a, v| a.max(v.abs()));
        let err = y
            .iter()
            .zip(&y_ref)
            .fold(0.0f64, |a, (&v, r)| a.max((f64::from(v) - r).abs()));
        let rel = if scale > 0.0 { err / scale } else { err };
        max_rel = max_rel.max(rel);
        sum_rel += rel;
    }
    Ok(ErrorStats {
        max_rel,
        mean_rel: sum_rel / trials as f64,
        trials,
    })
}
