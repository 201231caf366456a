//! [`Dropout`]: zeroes values at random while training, scaling the others by `1 / (1 - p)`.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::{NnError, Result};
use crate::layer::{Layer, RngState};
use crate::tensor::Tensor;

/// Inverted dropout, as PyTorch's `nn.Dropout(p)`: in training each value is zeroed with
/// probability `p` and the survivors are scaled by `1 / (1 - p)`; in evaluation it is the
/// identity. Mask `t` (the `t`-th training forward) is drawn from a generator seeded by the
/// layer's seed and `t`, so a run is reproducible and a checkpoint that keeps the
/// [`RngState`] resumes the masks an uninterrupted run draws. Keeps the mask (one byte per
/// value) for backward.
#[derive(Debug)]
pub struct Dropout {
    p: f32,
    state: RngState,
    mask: Option<(Vec<usize>, Vec<bool>)>,
}

impl Dropout {
    /// Dropout with probability `p` in `[0, 1)`, masks drawn from `seed`.
    pub fn new(p: f32, seed: u64) -> Result<Self> {
        if !(0.0..1.0).contains(&p) {
            return Err(NnError::config("p", format!("{p} is not in [0, 1)")));
        }
        Ok(Dropout {
            p,
            state: RngState { seed, draws: 0 },
            mask: None,
        })
    }
}

impl Layer for Dropout {
    fn describe(&self) -> String {
        format!("Dropout(p {})", self.p)
    }

    fn forward(&mut self, mut x: Tensor, train: bool) -> Result<Tensor> {
        if !train || self.p == 0.0 {
            if train {
                self.mask = Some((x.shape().to_vec(), vec![true; x.len()]));
            }
            return Ok(x);
        }
        let scale = 1.0 / (1.0 - self.p);
        // The draw count times the 64-bit golden ratio, into the seed expansion: distinct
        // streams per draw.
        let RngState { seed, draws } = self.state;
        let rng = &mut SmallRng::seed_from_u64(seed ^ draws.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        self.state.draws = draws.wrapping_add(1);
        let mask: Vec<bool> = (0..x.len())
            .map(|_| rng.random::<f32>() >= self.p)
            .collect();
        for (v, &keep) in x.data_mut().iter_mut().zip(&mask) {
            *v = if keep { *v * scale } else { 0.0 };
        }
        self.mask = Some((x.shape().to_vec(), mask));
        Ok(x)
    }

    fn backward(&mut self, mut dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let (shape, mask) = self.mask.take().ok_or_else(|| NnError::no_forward(self))?;
        NnError::expect_shape(|| self.describe(), "dy", dy.shape(), &shape)?;
        if !need_dx {
            return Ok(None);
        }
        let scale = 1.0 / (1.0 - self.p);
        for (d, &keep) in dy.data_mut().iter_mut().zip(&mask) {
            *d = if keep { *d * scale } else { 0.0 };
        }
        Ok(Some(dy))
    }

    fn rng_states(&self) -> Vec<(String, RngState)> {
        vec![("rng".into(), self.state)]
    }

    fn rng_states_mut(&mut self) -> Vec<(String, &mut RngState)> {
        vec![("rng".into(), &mut self.state)]
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        Ok(input.to_vec())
    }
}
