//! Training-time data augmentation: the random crop after zero padding and the random
//! horizontal flip with which image classifiers are trained (torchvision's
//! `RandomCrop(size, padding)` and `RandomHorizontalFlip()`, the CIFAR-10 recipe of the ResNet
//! paper), for 2D (`C × H × W`) and 3D (`C × D × H × W`) samples.
//!
//! Each sample's crop offsets and flip are drawn from a seed, the epoch and the sample's index
//! in its data set, not from a running generator: a batch's augmentation does not depend on the
//! batch size, the order of the batches or the process that builds it, so data-parallel ranks
//! agree and a run resumed from a checkpoint repeats what an uninterrupted one would have done.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::{NnError, Result};

/// Which random transformations to apply to every training sample (the default: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Augment {
    /// Pad the last two axes (height and width) by this many zeros on every side, then crop a
    /// window of the original size at a random position (0: no crop).
    pub crop_padding: usize,
    /// Mirror the last axis (width) with probability ½, after the crop.
    pub hflip: bool,
}

impl Augment {
    /// No transformation at all.
    pub fn is_identity(&self) -> bool {
        self.crop_padding == 0 && !self.hflip
    }

    /// Checks that samples of `sample_shape` can be augmented: images (`C × H × W`) or volumes
    /// (`C × D × H × W`) whose height and width exceed the crop padding.
    pub fn check(&self, sample_shape: &[usize]) -> Result<()> {
        if self.is_identity() {
            return Ok(());
        }
        let detail = || {
            format!(
                "augmentation needs C × H × W or C × D × H × W samples whose height and width \
                 exceed the crop padding ({})",
                self.crop_padding
            )
        };
        match sample_shape {
            [.., h, w] if (3..=4).contains(&sample_shape.len()) => {
                if self.crop_padding >= *h.min(w) {
                    return Err(NnError::shape("augment", "sample", sample_shape, detail()));
                }
                Ok(())
            }
            _ => Err(NnError::shape("augment", "sample", sample_shape, detail())),
        }
    }

    /// The crop offsets (row, column, each in `0..=2·crop_padding`) and flip drawn for sample
    /// `index` under `seed` (which the training loop derives from its seed and the epoch).
    pub fn draw(&self, seed: u64, index: usize) -> (usize, usize, bool) {
        let rng = &mut SmallRng::seed_from_u64(mix(mix(seed ^ SALT) ^ index as u64));
        let span = 2 * self.crop_padding;
        let dy = rng.random_range(0..=span);
        let dx = rng.random_range(0..=span);
        let flip = self.hflip && rng.random_bool(0.5);
        (dy, dx, flip)
    }

    /// Transforms `sample` (one sample of `sample_shape`, checked by [`Augment::check`]) in
    /// place as drawn for sample `index` under `seed`; `plane` is scratch space for one
    /// `H × W` plane, grown as needed.
    pub fn apply(
        &self,
        sample: &mut [f32],
        sample_shape: &[usize],
        seed: u64,
        index: usize,
        plane: &mut Vec<f32>,
    ) -> Result<()> {
        self.check(sample_shape)?;
        if sample.len() != sample_shape.iter().product::<usize>() {
            return Err(NnError::DataLen {
                shape: sample_shape.to_vec(),
                got: sample.len(),
                expected: sample_shape.iter().product(),
            });
        }
        if self.is_identity() {
            return Ok(());
        }
        let (dy, dx, flip) = self.draw(seed, index);
        let p = self.crop_padding;
        if dy == p && dx == p && !flip {
            return Ok(());
        }
        let (h, w) = (
            sample_shape[sample_shape.len() - 2],
            sample_shape[sample_shape.len() - 1],
        );
        // Output (y, x) reads the input at (y + dy − p, x' + dx − p), x' = x or its mirror.
        let src_row = |y: usize| (y + dy).checked_sub(p).filter(|&r| r < h);
        let src_col = |x: usize| {
            let x = if flip { w - 1 - x } else { x };
            (x + dx).checked_sub(p).filter(|&c| c < w)
        };
        for out in sample.chunks_exact_mut(h * w) {
            plane.clear();
            plane.extend_from_slice(out);
            for (y, row) in out.chunks_exact_mut(w).enumerate() {
                match src_row(y) {
                    None => row.fill(0.0),
                    Some(r) => {
                        let src = &plane[r * w..][..w];
                        for (x, v) in row.iter_mut().enumerate() {
                            *v = src_col(x).map_or(0.0, |c| src[c]);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Separates the augmentation's draws from the shuffle's, which use the same seed.
const SALT: u64 = 0x6175_676d_656e_7421;

/// SplitMix64's finaliser: a bijection of u64 whose outputs for nearby inputs are unrelated.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, written out: zero-pad every plane by `p`, take the window at (dy, dx),
    /// then mirror it if `flip`.
    fn naive(x: &[f32], shape: &[usize], p: usize, dy: usize, dx: usize, flip: bool) -> Vec<f32> {
        let (h, w) = (shape[shape.len() - 2], shape[shape.len() - 1]);
        let (ph, pw) = (h + 2 * p, w + 2 * p);
        let mut out = Vec::with_capacity(x.len());
        for plane in x.chunks_exact(h * w) {
            let mut padded = vec![0.0; ph * pw];
            for y in 0..h {
                for c in 0..w {
                    padded[(y + p) * pw + c + p] = plane[y * w + c];
                }
            }
            for y in 0..h {
                let crop: Vec<f32> = (0..w).map(|c| padded[(y + dy) * pw + c + dx]).collect();
                if flip {
                    out.extend(crop.iter().rev());
                } else {
                    out.extend(crop);
                }
            }
        }
        out
    }

    #[test]
    fn every_sample_is_the_definitions_crop_and_flip_of_its_draw() {
        let mut scratch = Vec::new();
        for (shape, p) in [
            (vec![3, 5, 7], 2),
            (vec![2, 3, 4, 6], 1),
            (vec![1, 8, 8], 4),
            (vec![2, 9, 2], 1),
        ] {
            let n: usize = shape.iter().product();
            let x: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
            for aug in [
                Augment {
                    crop_padding: p,
                    hflip: true,
                },
                Augment {
                    crop_padding: p,
                    hflip: false,
                },
                Augment {
                    crop_padding: 0,
                    hflip: true,
                },
            ] {
                for index in 0..40 {
                    let mut s = x.clone();
                    aug.apply(&mut s, &shape, 17, index, &mut scratch).unwrap();
                    let (dy, dx, flip) = aug.draw(17, index);
                    assert!(dy <= 2 * aug.crop_padding && dx <= 2 * aug.crop_padding);
                    assert!(aug.hflip || !flip);
                    let want = naive(&x, &shape, aug.crop_padding, dy, dx, flip);
                    assert_eq!(s, want, "{shape:?} {aug:?} sample {index}");
                }
            }
        }
    }

    #[test]
    fn draws_cover_every_offset_and_both_flips_and_depend_on_seed_and_index() {
        let aug = Augment {
            crop_padding: 2,
            hflip: true,
        };
        let draws: Vec<_> = (0..400).map(|i| aug.draw(5, i)).collect();
        for d in 0..=4 {
            assert!(draws.iter().any(|&(dy, _, _)| dy == d), "row offset {d}");
            assert!(draws.iter().any(|&(_, dx, _)| dx == d), "column offset {d}");
        }
        let flips = draws.iter().filter(|d| d.2).count();
        assert!((150..250).contains(&flips), "{flips} flips of 400");
        let other: Vec<_> = (0..400).map(|i| aug.draw(6, i)).collect();
        assert_ne!(draws, other, "another seed draws otherwise");
        assert_eq!(draws, (0..400).map(|i| aug.draw(5, i)).collect::<Vec<_>>());
    }

    #[test]
    fn identity_and_bad_shapes() {
        let mut s = vec![1.0, 2.0, 3.0, 4.0];
        let none = Augment::default();
        assert!(none.is_identity());
        none.apply(&mut s, &[1, 2, 2], 0, 0, &mut Vec::new())
            .unwrap();
        assert_eq!(s, [1.0, 2.0, 3.0, 4.0]);
        let crop = Augment {
            crop_padding: 2,
            hflip: false,
        };
        // Padding not below the height, a flat sample, a length that is not the shape's.
        assert!(crop.check(&[1, 2, 2]).is_err());
        assert!(crop.check(&[16]).is_err());
        assert!(crop.check(&[1, 1, 1, 5, 5, 5]).is_err());
        assert!(
            crop.apply(&mut s, &[1, 3, 3], 0, 0, &mut Vec::new())
                .is_err()
        );
        assert!(none.check(&[16]).is_ok(), "no augmentation fits any shape");
    }
}
