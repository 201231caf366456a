//! Helpers shared by the multi-rank model tests (`mpi_channel_model`, `mpi_spatial_model`,
//! `mpi_data_parallel`).

use nn::{
    BatchNorm, Conv, ConvAlgo, ConvConfig, Flatten, GlobalAvgPool, Linear, Relu, Residual,
    Sequential, Tensor,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// `n` samples of shape `sample`, uniform in [−1, 1), and their labels among 5 classes, drawn
/// from `seed` (the same on every rank).
pub fn batch(n: usize, sample: &[usize], seed: u64) -> (Tensor, Vec<usize>) {
    let rng = &mut SmallRng::seed_from_u64(seed);
    let len: usize = sample.iter().product();
    let x = (0..n * len)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let labels = (0..n).map(|_| rng.random_range(0..5)).collect();
    let mut shape = vec![n];
    shape.extend_from_slice(sample);
    (Tensor::new(&shape, x).unwrap(), labels)
}

/// `Ok` when `got` equals `want` to 2·10⁻⁵ of `want`'s largest magnitude.
pub fn close(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    if got.len() != want.len() || worst > 2e-5 * scale {
        return Err(format!(
            "{what}: differs by {worst} (scale {scale}, {} vs {} values)",
            got.len(),
            want.len()
        ));
    }
    Ok(())
}

/// 3×11×10 samples: a stem with batch norm, then a nested stage of two residual blocks (the
/// second with stride 2 and a 1×1 projection shortcut: 11 → 6 rows), global pooling and the
/// classifier, the shape of torchvision's ResNets.
#[allow(dead_code)] // not every test crate uses it
pub fn resnet(algo: ConvAlgo, seed: u64) -> nn::Result<Sequential> {
    let rng = &mut SmallRng::seed_from_u64(seed);
    let stage = Sequential::block()
        .push(Residual::basic_block(8, 8, 1, algo, rng)?)?
        .push(Residual::basic_block(8, 12, 2, algo, rng)?)?;
    Sequential::new(&[3, 11, 10])
        .push(Conv::new(
            ConvConfig::conv2d(3, 8, 3).padding(1).no_bias(),
            algo,
            rng,
        )?)?
        .push(BatchNorm::new(8)?)?
        .push(Relu::new())?
        .push_named("layer1", stage)?
        .push(GlobalAvgPool::new())?
        .push(Flatten::new())?
        .push(Linear::new(12, 5, rng)?)
}
