//! Data sets: the `digits` set the repository ships, MNIST, Fashion-MNIST and CIFAR-10 read from
//! their distribution files, generated 3D `volumes`, synthetic data, splitting, resizing,
//! shuffled mini-batches and their augmentation (random crops and flips).

mod augment;
mod files;
mod volumes;

pub use augment::Augment;
pub use volumes::VOLUME_CLASSES;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

use crate::error::{NnError, Result};
use crate::tensor::Tensor;

/// The `digits` CSV (see `crates/nn/data/README.md`), embedded so the main command needs no path.
const DIGITS_CSV: &str = include_str!("../../data/digits.csv");

/// A labelled classification data set held in memory: `len` samples of `sample_shape`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    sample_shape: Vec<usize>,
    inputs: Vec<f32>,
    labels: Vec<usize>,
    classes: usize,
}

impl Dataset {
    /// A data set from flat inputs (`labels.len()` samples of `sample_shape`, row-major) and
    /// labels below `classes`.
    pub fn new(
        sample_shape: &[usize],
        inputs: Vec<f32>,
        labels: Vec<usize>,
        classes: usize,
    ) -> Result<Self> {
        let per = sample_shape.iter().product::<usize>();
        if per == 0 || inputs.len() != per * labels.len() {
            return Err(NnError::DataLen {
                shape: [&[labels.len()], sample_shape].concat(),
                got: inputs.len(),
                expected: per * labels.len(),
            });
        }
        if let Some((index, &label)) = labels.iter().enumerate().find(|(_, l)| **l >= classes) {
            return Err(NnError::Label {
                index,
                label,
                classes,
            });
        }
        Ok(Dataset {
            sample_shape: sample_shape.to_vec(),
            inputs,
            labels,
            classes,
        })
    }

    /// The 1,797 8×8 handwritten digits shipped with the repository (UCI optdigits test set),
    /// pixels scaled from 0..16 to 0..1, shape 1×8×8, ten classes.
    pub fn digits() -> Result<Self> {
        Self::from_csv("digits.csv (embedded)", DIGITS_CSV, &[1, 8, 8], 16.0, 10)
    }

    /// Parses lines of `pixels…, label` (integers), dividing pixels by `scale`.
    pub fn from_csv(
        source_name: &str,
        text: &str,
        sample_shape: &[usize],
        scale: f32,
        classes: usize,
    ) -> Result<Self> {
        let per = sample_shape.iter().product::<usize>();
        let (mut inputs, mut labels) = (Vec::new(), Vec::new());
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let bad = |detail: String| NnError::Data {
                source_name: source_name.into(),
                line: i + 1,
                detail,
            };
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if fields.len() != per + 1 {
                return Err(bad(format!(
                    "{} fields, expected {} pixels and a label",
                    fields.len(),
                    per
                )));
            }
            for f in &fields[..per] {
                let v: f32 = f
                    .parse()
                    .map_err(|_| bad(format!("pixel `{f}` is not a number")))?;
                inputs.push(v / scale);
            }
            let label: usize = fields[per]
                .parse()
                .map_err(|_| bad(format!("label `{}` is not a class index", fields[per])))?;
            if label >= classes {
                return Err(bad(format!("label {label} ≥ {classes} classes")));
            }
            labels.push(label);
        }
        Self::new(sample_shape, inputs, labels, classes)
    }

    /// `len` samples of standard-normal-ish noise (uniform ±√3: unit variance) with uniform
    /// random labels: for throughput runs.
    pub fn synthetic(
        len: usize,
        sample_shape: &[usize],
        classes: usize,
        seed: u64,
    ) -> Result<Self> {
        use rand::Rng;
        let rng = &mut SmallRng::seed_from_u64(seed);
        let per = sample_shape.iter().product::<usize>();
        let inputs = (0..len * per)
            .map(|_| rng.random_range(-1.732f32..1.732))
            .collect();
        let labels = (0..len)
            .map(|_| rng.random_range(0..classes.max(1)))
            .collect();
        Self::new(sample_shape, inputs, labels, classes)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there is no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The shape of one sample.
    pub fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// The labels.
    pub fn labels(&self) -> &[usize] {
        &self.labels
    }

    fn per_sample(&self) -> usize {
        self.sample_shape.iter().product()
    }

    fn subset(&self, idx: &[usize]) -> Dataset {
        let per = self.per_sample();
        let inputs = idx
            .iter()
            .flat_map(|&i| self.inputs[i * per..][..per].iter().copied())
            .collect();
        let labels = idx.iter().map(|&i| self.labels[i]).collect();
        Dataset {
            sample_shape: self.sample_shape.clone(),
            inputs,
            labels,
            classes: self.classes,
        }
    }

    /// Splits into (train, test) after a shuffle drawn from `seed`, with `test_fraction` of the
    /// samples (at least one when the fraction is positive) in the test set.
    pub fn split(&self, test_fraction: f64, seed: u64) -> Result<(Dataset, Dataset)> {
        if !(0.0..1.0).contains(&test_fraction) {
            return Err(NnError::config(
                "test_fraction",
                format!("{test_fraction} (must be in [0, 1))"),
            ));
        }
        let mut idx: Vec<usize> = (0..self.len()).collect();
        idx.shuffle(&mut SmallRng::seed_from_u64(seed));
        let mut n_test = (self.len() as f64 * test_fraction).round() as usize;
        if test_fraction > 0.0 {
            n_test = n_test.clamp(1, self.len().saturating_sub(1));
        }
        let (test, train) = idx.split_at(n_test);
        Ok((self.subset(train), self.subset(test)))
    }

    /// Every 2D sample (`C × H × W`) resized to `height × width` by bilinear interpolation with
    /// half-pixel centres (PyTorch's `interpolate(mode="bilinear", align_corners=False)`).
    pub fn resized(&self, height: usize, width: usize) -> Result<Dataset> {
        let &[c, h, w] = self.sample_shape.as_slice() else {
            return Err(NnError::shape(
                "resize",
                "samples",
                &self.sample_shape,
                "C × H × W",
            ));
        };
        if height == 0 || width == 0 {
            return Err(NnError::config(
                "size",
                format!("{height}×{width} (must be positive)"),
            ));
        }
        // Source coordinate and weights along one axis for each output index.
        let axis = |out: usize, inp: usize| -> Vec<(usize, usize, f32)> {
            (0..out)
                .map(|o| {
                    let src = ((o as f32 + 0.5) * inp as f32 / out as f32 - 0.5).max(0.0);
                    let i0 = (src.floor() as usize).min(inp - 1);
                    let i1 = (i0 + 1).min(inp - 1);
                    (i0, i1, src - i0 as f32)
                })
                .collect()
        };
        let (ys, xs) = (axis(height, h), axis(width, w));
        let mut inputs = Vec::with_capacity(self.len() * c * height * width);
        for plane in self.inputs.chunks_exact(h * w) {
            for &(y0, y1, fy) in &ys {
                for &(x0, x1, fx) in &xs {
                    let top = plane[y0 * w + x0] * (1.0 - fx) + plane[y0 * w + x1] * fx;
                    let bottom = plane[y1 * w + x0] * (1.0 - fx) + plane[y1 * w + x1] * fx;
                    inputs.push(top * (1.0 - fy) + bottom * fy);
                }
            }
        }
        Dataset::new(
            &[c, height, width],
            inputs,
            self.labels.clone(),
            self.classes,
        )
    }

    /// Mini-batches of `batch_size` (the last one smaller), in an order shuffled by `shuffle`
    /// (a seed) or in order.
    pub fn batches(&self, batch_size: usize, shuffle: Option<u64>) -> Result<Batches<'_>> {
        if batch_size == 0 {
            return Err(NnError::config("batch_size", "0 (must be positive)"));
        }
        let mut order: Vec<usize> = (0..self.len()).collect();
        if let Some(seed) = shuffle {
            order.shuffle(&mut SmallRng::seed_from_u64(seed));
        }
        Ok(Batches {
            data: self,
            order,
            batch_size,
            at: 0,
            augment: None,
        })
    }
}

/// An iterator over `(inputs N × sample_shape, labels)` mini-batches.
#[derive(Debug)]
pub struct Batches<'a> {
    data: &'a Dataset,
    order: Vec<usize>,
    batch_size: usize,
    at: usize,
    /// The transformation and the seed of its draws.
    augment: Option<(Augment, u64)>,
}

impl Batches<'_> {
    /// The same batches with every sample transformed by `augment` as drawn for its index in
    /// the data set under `seed` (see [`Augment`]).
    ///
    /// Errors: samples that `augment` cannot transform ([`Augment::check`]).
    pub fn augmented(mut self, augment: Augment, seed: u64) -> Result<Self> {
        augment.check(&self.data.sample_shape)?;
        self.augment = (!augment.is_identity()).then_some((augment, seed));
        Ok(self)
    }
}

impl Iterator for Batches<'_> {
    type Item = (Tensor, Vec<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.order.len() {
            return None;
        }
        let idx = &self.order[self.at..(self.at + self.batch_size).min(self.order.len())];
        self.at += idx.len();
        let mut sub = self.data.subset(idx);
        if let Some((aug, seed)) = self.augment {
            let per = self.data.per_sample();
            let mut plane = Vec::new();
            for (sample, &i) in sub.inputs.chunks_exact_mut(per).zip(idx) {
                aug.apply(sample, &self.data.sample_shape, seed, i, &mut plane)
                    .expect("checked by `augmented`");
            }
        }
        let shape = [&[idx.len()], self.data.sample_shape.as_slice()].concat();
        let x = Tensor::new(&shape, sub.inputs).expect("subset has the batch's length");
        Some((x, sub.labels))
    }
}
