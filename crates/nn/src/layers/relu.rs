//! [`Relu`]: `y = max(x, 0)`.

use core_blas::vector::{Vector, mask_bytes};

use crate::error::{NnError, Result};
use crate::layer::Layer;
use crate::tensor::Tensor;

/// The rectified linear unit. Keeps one bit per value for backward.
#[derive(Debug, Default)]
pub struct Relu {
    /// The shape of the forward input backward has not consumed yet.
    saved: Option<Vec<usize>>,
    /// `x > 0` per value of that input, one bit each (bit `i % 8` of byte `i / 8`). Kept after
    /// backward, so the next step's forward fills the same allocation instead of faulting in
    /// fresh pages.
    mask: Vec<u8>,
}

impl Relu {
    /// A ReLU layer.
    pub fn new() -> Self {
        Relu::default()
    }
}

/// Values per step of the fused passes below (16 KiB of f32, a multiple of 8 so that each
/// step starts on a mask byte): each operand's step stays in L1 between the two kernels.
const FUSED_STEP: usize = 4096;

impl Relu {
    /// `relu(h + skip)` as this layer's forward of `h + skip`, in one pass over memory: per
    /// step of [`FUSED_STEP`] values the sum, then the ReLU (and its mask) while the step is
    /// in L1. `h` and `skip` have one shape (the caller checks). The residual blocks' output.
    pub(crate) fn forward_sum(
        &mut self,
        mut h: Tensor,
        skip: &Tensor,
        train: bool,
    ) -> Result<Tensor> {
        let v = Vector::global()?;
        if h.len() != skip.len() {
            return Err(NnError::shape(
                "ReLU",
                "skip",
                skip.shape(),
                format!("{:?}", h.shape()),
            ));
        }
        if train {
            self.mask.clear();
            self.mask.resize(mask_bytes(h.len()), 0);
            crate::par::runs_ref_bits_mut(h.data_mut(), skip.data(), &mut self.mask, |x, s, m| {
                for ((x, s), m) in x
                    .chunks_mut(FUSED_STEP)
                    .zip(s.chunks(FUSED_STEP))
                    .zip(m.chunks_mut(FUSED_STEP / 8))
                {
                    v.add(x, s)?;
                    v.relu_train(x, m)?;
                }
                Ok(())
            })?;
            self.saved = Some(h.shape().to_vec());
        } else {
            crate::par::runs_ref(h.data_mut(), skip.data(), |x, s| {
                for (x, s) in x.chunks_mut(FUSED_STEP).zip(s.chunks(FUSED_STEP)) {
                    v.add(x, s)?;
                    v.relu(x);
                }
                Ok(())
            })?;
        }
        Ok(h)
    }

    /// This layer's backward, returning the gradient twice (for a residual block's two paths)
    /// in one pass over memory: per step of [`FUSED_STEP`] values the ReLU's backward, then
    /// the copy while the step is in L1.
    pub(crate) fn backward_fork(&mut self, mut dy: Tensor) -> Result<(Tensor, Tensor)> {
        let shape = self.saved.take().ok_or_else(|| NnError::no_forward(self))?;
        NnError::expect_shape(|| self.describe(), "dy", dy.shape(), &shape)?;
        let v = Vector::global()?;
        let mut copy = Tensor::scratch(&shape);
        crate::par::runs_mut_bits(dy.data_mut(), copy.data_mut(), &self.mask, |d, c, m| {
            for ((d, c), m) in d
                .chunks_mut(FUSED_STEP)
                .zip(c.chunks_mut(FUSED_STEP))
                .zip(m.chunks(FUSED_STEP / 8))
            {
                v.relu_backward(d, m)?;
                c.copy_from_slice(d);
            }
            Ok(())
        })?;
        Ok((dy, copy))
    }
}

impl Layer for Relu {
    fn describe(&self) -> String {
        "ReLU".into()
    }

    fn forward(&mut self, mut x: Tensor, train: bool) -> Result<Tensor> {
        let v = Vector::global()?;
        if train {
            self.mask.clear();
            self.mask.resize(mask_bytes(x.len()), 0);
            crate::par::runs_bits_mut(
                x.data_mut(),
                &mut self.mask,
                |x, m| Ok(v.relu_train(x, m)?),
            )?;
            self.saved = Some(x.shape().to_vec());
        } else {
            crate::par::runs(x.data_mut(), |x| {
                v.relu(x);
                Ok(())
            })?;
        }
        Ok(x)
    }

    fn backward(&mut self, mut dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let shape = self.saved.take().ok_or_else(|| NnError::no_forward(self))?;
        NnError::expect_shape(|| self.describe(), "dy", dy.shape(), &shape)?;
        if !need_dx {
            return Ok(None);
        }
        let v = Vector::global()?;
        crate::par::runs_bits(dy.data_mut(), &self.mask, |d, m| Ok(v.relu_backward(d, m)?))?;
        Ok(Some(dy))
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        Ok(input.to_vec())
    }
}
