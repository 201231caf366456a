//! [`AlignedVec`]: a growable f32 buffer whose first value sits on a 64-byte boundary (one cache
//! line), the storage of core-blas's packing buffers and, for crates above it that may not write
//! `unsafe`, of operands that the vectorised kernels read row by row.
//!
//! Why it matters: a 256-bit load that straddles two cache lines costs two loads. With rows a
//! multiple of 16 floats apart and the buffer on a line boundary, every vector of every row is on
//! one line (measured on `SmallA::apply_strided`, 02:51 UTC: 15-25% faster than the same rows 16
//! bytes past a line, which is where a large `Vec<f32>` from the system allocator usually starts).

use std::fmt;
use std::ops::{Deref, DerefMut};

/// One 64-byte cache line of f32, so that a `Vec<Line>` is 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A growable f32 buffer aligned to 64 bytes, used like a `Vec<f32>` (`resize`, then as a slice
/// through `Deref`). Shrinking keeps the storage, so a buffer reused across calls allocates only
/// while it grows.
///
/// ```
/// let mut v = core_blas::AlignedVec::new();
/// v.resize(100, 1.5);
/// assert_eq!(v.len(), 100);
/// assert_eq!(v.as_ptr() as usize % 64, 0);
/// v[3] = 2.0;
/// assert_eq!(v.iter().sum::<f32>(), 99.0 * 1.5 + 2.0);
/// ```
#[derive(Clone, Default)]
pub struct AlignedVec {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedVec {
    /// An empty buffer (no allocation).
    pub fn new() -> Self {
        Self::default()
    }

    /// `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        let mut v = Self::new();
        v.resize(len, 0.0);
        v
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Values the buffer holds without reallocating.
    pub fn capacity(&self) -> usize {
        self.lines.len() * 16
    }

    /// As `Vec::resize`: grows to `len` values, the new ones set to `value`, or truncates to `len`
    /// (keeping the storage). The first value stays on a 64-byte boundary.
    pub fn resize(&mut self, len: usize, value: f32) {
        let old = self.len;
        self.grow(len);
        self.len = len;
        if len > old {
            self.as_mut_slice()[old..].fill(value);
        }
    }

    /// The first `len` values after growing the storage to hold them, without setting the new
    /// ones (they hold whatever the storage held: zeros or earlier contents); the length becomes
    /// `len`. For packing buffers that are fully overwritten.
    pub(crate) fn get(&mut self, len: usize) -> &mut [f32] {
        self.grow(len);
        self.len = len;
        self.as_mut_slice()
    }

    /// Storage for at least `len` values (new lines zeroed).
    fn grow(&mut self, len: usize) {
        let need = len.div_ceil(16);
        if self.lines.len() < need {
            self.lines.resize(need, Line([0.0; 16]));
        }
    }

    /// The values as a slice.
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` around `[f32; 16]` with no padding (size 64 = 16 × 4), so the
        // `lines.len() * 16 >= len` f32 values are initialised and aligned; shared borrow of self.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }

    /// The values as a mutable slice.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

impl Deref for AlignedVec {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        self.as_slice()
    }
}

impl DerefMut for AlignedVec {
    fn deref_mut(&mut self) -> &mut [f32] {
        self.as_mut_slice()
    }
}

impl fmt::Debug for AlignedVec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for AlignedVec {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl From<&[f32]> for AlignedVec {
    fn from(values: &[f32]) -> Self {
        let mut v = Self::new();
        v.get(values.len()).copy_from_slice(values);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_keeps_values_alignment_and_storage() {
        let mut v = AlignedVec::new();
        assert!(v.is_empty());
        assert_eq!(v.capacity(), 0);
        v.resize(37, 2.0);
        assert_eq!(v.len(), 37);
        assert!(v.iter().all(|&x| x == 2.0));
        assert_eq!(v.as_ptr() as usize % 64, 0);
        for (i, x) in v.iter_mut().enumerate() {
            *x = i as f32;
        }
        // Growing keeps the old values and sets only the new ones.
        v.resize(1000, -1.0);
        assert_eq!(v.as_ptr() as usize % 64, 0);
        assert!((0..37).all(|i| v[i] == i as f32));
        assert!(v[37..].iter().all(|&x| x == -1.0));
        let cap = v.capacity();
        assert!(cap >= 1000);
        // Truncating keeps the storage; growing again refills with the new value.
        v.resize(10, 0.0);
        assert_eq!(v.len(), 10);
        assert_eq!(v.capacity(), cap);
        v.resize(20, 7.0);
        assert!((0..10).all(|i| v[i] == i as f32));
        assert!(v[10..].iter().all(|&x| x == 7.0));
        assert_eq!(AlignedVec::zeroed(5).as_slice(), &[0.0; 5]);
        let c = AlignedVec::from(&[1.0f32, 2.0, 3.0][..]);
        assert_eq!(c.clone(), c);
        assert_eq!(format!("{c:?}"), "[1.0, 2.0, 3.0]");
    }
}
