//! [`Tensor`]: a row-major (C order) f32 array with a shape, and the recycling of its buffers.
//!
//! A training step allocates every activation and gradient afresh and frees them before the
//! next step. Large freed blocks go back to the kernel (glibc's mmap and trim thresholds), so
//! the next step page-faults and zeroes them again: 5-12% of a ResNet-20 step. Instead, a
//! dropped tensor's buffer of at least [`RECYCLE_MIN`] values waits in a per-thread free list
//! keyed by length (bounded per length and in bytes) for the next [`Tensor::zeros`] of that
//! length; a request no waiting buffer fits first frees as many bytes of waiting buffers, so
//! the list does not raise the peak. Nothing else changes: a recycled buffer is zeroed like a
//! new one.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::error::{NnError, Result};

/// Buffers shorter than this (64 KiB) are left to the allocator, whose own free lists are cheap.
pub const RECYCLE_MIN: usize = 1 << 14;
/// At most this many bytes wait for reuse on one thread.
const RECYCLE_CAP_BYTES: usize = 512 << 20;
/// At most this many buffers of one length wait.
const RECYCLE_PER_LEN: usize = 2;

#[derive(Default)]
struct Recycler {
    free: HashMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

thread_local! {
    static RECYCLER: RefCell<Recycler> = RefCell::new(Recycler::default());
}

/// A buffer of `len` zeros: a recycled one of that length if one waits, else a new one. A new
/// one first frees waiting buffers of other lengths worth as many bytes, so the list holds
/// memory the process would hold anyway instead of adding to its peak.
pub(crate) fn zeroed(len: usize) -> Vec<f32> {
    if len >= RECYCLE_MIN {
        let reused = RECYCLER
            .try_with(|r| {
                let mut r = r.borrow_mut();
                if let Some(v) = r.free.get_mut(&len).and_then(Vec::pop) {
                    r.bytes -= len * size_of::<f32>();
                    return Some(v);
                }
                let mut freed = 0;
                let Recycler { free, bytes } = &mut *r;
                for list in free.values_mut() {
                    while freed < len && !list.is_empty() {
                        let v = list.pop().expect("not empty");
                        freed += v.len();
                        *bytes -= v.len() * size_of::<f32>();
                    }
                }
                None
            })
            .ok()
            .flatten();
        if let Some(mut v) = reused {
            v.fill(0.0);
            return v;
        }
    }
    vec![0.0; len]
}

/// Keeps `v` for a later [`zeroed`] of its length, within the bounds; otherwise frees it.
fn recycle(v: Vec<f32>) {
    let len = v.len();
    if len < RECYCLE_MIN || v.capacity() != len {
        return;
    }
    // During thread teardown the list may be gone: then the buffer is simply freed.
    let _ = RECYCLER.try_with(|r| {
        let mut r = r.borrow_mut();
        let bytes = len * size_of::<f32>();
        if r.bytes + bytes > RECYCLE_CAP_BYTES {
            return;
        }
        let list = r.free.entry(len).or_default();
        if list.len() < RECYCLE_PER_LEN {
            list.push(v);
            r.bytes += bytes;
        }
    });
}

/// A dense, row-major f32 tensor. Activations are `N × C × spatial…` (PyTorch's NCHW / NCDHW),
/// weights `K × C × kernel…`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

impl Tensor {
    /// A tensor of `shape` over `data`; errors when the lengths disagree.
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        let expected = shape.iter().product::<usize>();
        if data.len() != expected {
            return Err(NnError::DataLen {
                shape: shape.to_vec(),
                got: data.len(),
                expected,
            });
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        Tensor {
            shape: shape.to_vec(),
            data: zeroed(shape.iter().product()),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The values, row-major, mutable.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// The values, consuming the tensor.
    pub fn into_data(mut self) -> Vec<f32> {
        std::mem::take(&mut self.data)
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor holds no value.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The same values under another shape with the same number of values.
    pub fn reshape(self, shape: &[usize]) -> Result<Self> {
        Tensor::new(shape, self.into_data())
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        recycle(std::mem::take(&mut self.data));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting_bytes() -> usize {
        RECYCLER.with(|r| r.borrow().bytes)
    }

    #[test]
    fn a_recycled_buffer_comes_back_zeroed_and_only_for_its_length() {
        let n = RECYCLE_MIN + 3;
        let mut t = Tensor::zeros(&[n]);
        t.data_mut().fill(7.0);
        let ptr = t.data().as_ptr();
        drop(t);
        assert_eq!(waiting_bytes(), n * 4);
        let mut again = Tensor::zeros(&[n]);
        assert_eq!(again.data().as_ptr(), ptr, "the dropped buffer is reused");
        assert!(again.data().iter().all(|&v| v == 0.0));
        assert_eq!(waiting_bytes(), 0);
        again.data_mut().fill(3.0);
        drop(again);
        // A length nothing waits for frees the waiting buffers before allocating.
        let other = Tensor::zeros(&[n + 1]);
        assert!(other.data().iter().all(|&v| v == 0.0));
        assert_eq!(waiting_bytes(), 0);
        // Small buffers and into_data's are not kept.
        drop(Tensor::zeros(&[RECYCLE_MIN - 1]));
        let v = other.into_data();
        assert_eq!((v.len(), waiting_bytes()), (n + 1, 0));
        assert!(Tensor::zeros(&[4]).reshape(&[5]).is_err());
    }
}
