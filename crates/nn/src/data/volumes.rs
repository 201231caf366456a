//! `volumes`: generated 3D shapes, a volumetric classification task that needs no download.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Dataset;
use crate::error::{NnError, Result};

/// The classes of [`Dataset::volumes`], in label order.
pub const VOLUME_CLASSES: [&str; 4] = ["ball", "box", "rod", "shell"];

impl Dataset {
    /// `len` volumes of `sample_shape` = `C × D × H × W`, each holding one solid of a random
    /// size and position (in coordinates normalised to [-1, 1] per axis) over uniform noise:
    /// label 0 a ball, 1 an axis-aligned box, 2 a rod (a cylinder along the depth axis), 3 a
    /// hollow spherical shell ([`VOLUME_CLASSES`]). Voxels inside are 1 times a per-channel
    /// intensity in 0.5..1, plus noise in ±0.2. Labels cycle 0, 1, 2, 3 (balanced; `split` and
    /// `batches` shuffle); sizes, positions and noise are drawn from `seed`.
    pub fn volumes(len: usize, sample_shape: &[usize], seed: u64) -> Result<Dataset> {
        let &[c, d, h, w] = sample_shape else {
            return Err(NnError::shape(
                "volumes",
                "sample_shape",
                sample_shape,
                "C × D × H × W",
            ));
        };
        if c == 0 || d < 4 || h < 4 || w < 4 {
            return Err(NnError::shape(
                "volumes",
                "sample_shape",
                sample_shape,
                "at least one channel and 4 voxels per axis",
            ));
        }
        let rng = &mut SmallRng::seed_from_u64(seed);
        let per = c * d * h * w;
        let mut inputs = Vec::with_capacity(len * per);
        let mut labels = Vec::with_capacity(len);
        let coord = |i: usize, n: usize| 2.0 * (i as f32 + 0.5) / n as f32 - 1.0;
        for i in 0..len {
            let label = i % VOLUME_CLASSES.len();
            let centre: [f32; 3] = std::array::from_fn(|_| rng.random_range(-0.3f32..0.3));
            let r = rng.random_range(0.35f32..0.6);
            let inside = |p: [f32; 3]| {
                let q = [p[0] - centre[0], p[1] - centre[1], p[2] - centre[2]];
                let dist2 = q[0] * q[0] + q[1] * q[1] + q[2] * q[2];
                match label {
                    0 => dist2 <= r * r,
                    1 => q.iter().all(|v| v.abs() <= 0.8 * r),
                    2 => q[1] * q[1] + q[2] * q[2] <= 0.25 * r * r && q[0].abs() <= 1.5 * r,
                    _ => dist2 <= r * r && dist2 >= 0.49 * r * r,
                }
            };
            for _ in 0..c {
                let intensity = rng.random_range(0.5f32..1.0);
                for z in 0..d {
                    for y in 0..h {
                        for x in 0..w {
                            let p = [coord(z, d), coord(y, h), coord(x, w)];
                            let v = if inside(p) { intensity } else { 0.0 };
                            inputs.push(v + rng.random_range(-0.2f32..0.2));
                        }
                    }
                }
            }
            labels.push(label);
        }
        Dataset::new(sample_shape, inputs, labels, VOLUME_CLASSES.len())
    }
}
