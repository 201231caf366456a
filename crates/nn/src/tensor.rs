//! [`Tensor`]: a row-major (C order) f32 array with a shape, and the recycling of its buffers.
//!
//! A training step allocates every activation and gradient afresh and frees them before the
//! next step. Large freed blocks go back to the kernel (glibc's mmap and trim thresholds), so
//! the next step page-faults and zeroes them again: 5-12% of a ResNet-20 step. Instead, a
//! dropped tensor's buffer of at least [`RECYCLE_MIN`] values waits in a per-thread free list
//! keyed by length for the next [`Tensor::zeros`] or clone of that length. Bounds: of each
//! length no more buffers wait than the list's requests of that length once had in use at the
//! same time (tensors built from other buffers, e.g. by `dist`'s collectives, do not make their
//! lengths hoard), and within the footprint bound below. Nothing else changes: a recycled
//! buffer is zeroed (or overwritten by the clone's values) like a new one.
//!
//! Lengths a workload stops asking for do not hold memory for long. The list counts training
//! steps (each optimizer update, [`crate::Sgd::step`], ends one on its thread): a length no
//! request asked for in the last [`STALE_STEPS`] steps is stale, and at the end of a step the
//! waiting buffers of stale lengths are freed, so that lengths of the past (an evaluation's
//! batch, the last partial batch of an epoch) do not hold memory.
//!
//! Waiting buffers never take the list's footprint (bytes in use plus bytes waiting) more than
//! [`1 / FOOTPRINT_SLACK`](FOOTPRINT_SLACK) above the most bytes ever in use at once: a request
//! no waiting buffer fits frees as many waiting bytes as that needs, of stale lengths first,
//! then of the lengths asked for longest ago (a training step asks in the forward's order and
//! again in the backward's reverse order, so those are the ones the next step needs last).
//! Only as many as needed: each length of a step
//! recurs in the next, and freeing one length's waiting buffers for a request of another makes
//! that length miss later in the step and free a third's, a cycle that page-faults every step
//! (5-9% of a ResNet-20 step when every miss freed as many bytes as it asked for). So a model
//! whose lengths' most buffers at once add up to little more than its peak (ResNet-20: 6%)
//! stops allocating after its first step, and one where they add up to much more (VGG-16: 14%)
//! stays near its peak and pays some page faults.
//!
//! That bound is the only one on the bytes waiting: between steps up to a step's peak waits, the
//! memory the next step takes again. (A fixed 512 MiB cap on top of it made every model whose
//! step peaks above it free the rest at the end of each step and page-fault it in again in the
//! next: ResNet-50 at batch 8 and C3D at batch 2 spent 9% of a 1-thread step zeroing pages.) A
//! process done training frees what waits on a thread with [`release_buffers`].
//!
//! The buffers the list hands out afresh, when they reach core-blas's huge-page size
//! ([`AlignedVec::huge_pages`], 2 MiB on Linux; `CORE_BLAS_HUGEPAGES=0` turns it off), are
//! [`AlignedVec`]s: their own 2 MiB-aligned mappings advised to transparent huge pages, so that
//! the convolutions' packing and the element-wise passes over a step's activations walk one TLB
//! entry per 2 MiB instead of 512. Reused from step to step, they pay their page faults once.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};

use core_blas::AlignedVec;

use crate::error::{NnError, Result};

/// Buffers shorter than this (64 KiB) are left to the allocator, whose own free lists are cheap.
pub const RECYCLE_MIN: usize = 1 << 14;
/// The footprint of the recycling may exceed the most bytes ever in use at once by this
/// fraction's inverse: 16, i.e. 6.25% (module documentation).
pub const FOOTPRINT_SLACK: usize = 16;
/// A length no request asked for in this many steps is stale (module documentation): two, so
/// that an epoch's last partial batch and the evaluation after it do not free the lengths the
/// next epoch's first step asks for.
pub const STALE_STEPS: u64 = 2;

/// A tensor's values: the allocator's `Vec` (what [`Tensor::new`] takes), or core-blas's
/// [`AlignedVec`] for the large buffers the recycling hands out (module documentation).
#[derive(Debug)]
enum Storage {
    Heap(Vec<f32>),
    Huge(AlignedVec),
}

impl Default for Storage {
    fn default() -> Self {
        Storage::Heap(Vec::new())
    }
}

impl Deref for Storage {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            Storage::Heap(v) => v,
            Storage::Huge(v) => v,
        }
    }
}

impl DerefMut for Storage {
    fn deref_mut(&mut self) -> &mut [f32] {
        match self {
            Storage::Heap(v) => v,
            Storage::Huge(v) => v,
        }
    }
}

/// Whether a new buffer of `len` values takes huge-page storage: from core-blas's threshold
/// on, for a length the recycling keeps.
fn huge(len: usize) -> bool {
    AlignedVec::huge_pages()
        .is_some_and(|min| len >= RECYCLE_MIN && len.saturating_mul(size_of::<f32>()) >= min)
}

/// A new buffer of `len` zeros ([`huge`] or the allocator's).
fn fresh(len: usize) -> Storage {
    #[cfg(test)]
    tests::FRESH.with(|c| c.set(c.get() + 1));
    if huge(len) {
        Storage::Huge(AlignedVec::zeroed(len))
    } else {
        Storage::Heap(vec![0.0; len])
    }
}

/// What the requests of one length did.
#[derive(Default, Clone, Copy)]
struct Demand {
    /// Buffers handed out and not yet dropped.
    live: usize,
    /// The most ever `live` at once.
    peak: usize,
    /// The step of the last request.
    step: u64,
    /// The list's request count at the last request.
    tick: u64,
}

#[derive(Default)]
struct Recycler {
    free: HashMap<usize, Vec<Storage>>,
    bytes: usize,
    demand: HashMap<usize, Demand>,
    /// Bytes handed out by requests and not yet dropped.
    live_bytes: usize,
    /// The most `live_bytes` ever.
    peak_bytes: usize,
    /// Requests so far.
    ticks: u64,
    /// Steps ended on this thread ([`step_done`]).
    step: u64,
}

impl Recycler {
    /// Whether no request asked for `len` in the last [`STALE_STEPS`] steps.
    fn stale(&self, len: usize) -> bool {
        self.demand
            .get(&len)
            .is_none_or(|d| d.step + STALE_STEPS <= self.step)
    }

    /// Frees waiting buffers worth at least `bytes` bytes: of stale lengths first, then of the
    /// lengths asked for longest ago.
    fn free_waiting(&mut self, bytes: usize) {
        let mut lens: Vec<(bool, u64, usize)> = self
            .free
            .keys()
            .map(|&l| (!self.stale(l), self.demand.get(&l).map_or(0, |d| d.tick), l))
            .collect();
        lens.sort_unstable();
        let mut freed = 0;
        for (_, _, l) in lens {
            let list = self.free.get_mut(&l).expect("a key of the map");
            while freed < bytes && !list.is_empty() {
                drop(list.pop());
                freed += l * size_of::<f32>();
                self.bytes -= l * size_of::<f32>();
            }
        }
        self.free.retain(|_, list| !list.is_empty());
    }

    /// Frees the waiting buffers of stale lengths.
    fn free_stale(&mut self) {
        let stale: Vec<usize> = self
            .free
            .keys()
            .copied()
            .filter(|&l| self.stale(l))
            .collect();
        for l in stale {
            let list = self.free.remove(&l).expect("a key of the map");
            self.bytes -= list.len() * l * size_of::<f32>();
        }
    }
}

thread_local! {
    static RECYCLER: RefCell<Recycler> = RefCell::new(Recycler::default());
}

/// A waiting buffer of exactly `len` values (its old contents), or `None` after freeing the
/// waiting buffers the footprint bound needs (module documentation).
fn reuse(len: usize) -> Option<Storage> {
    if len < RECYCLE_MIN {
        return None;
    }
    RECYCLER
        .try_with(|r| {
            let mut r = r.borrow_mut();
            let (step, tick) = (r.step, r.ticks);
            r.ticks += 1;
            let d = r.demand.entry(len).or_default();
            d.live += 1;
            d.peak = d.peak.max(d.live);
            d.step = step;
            d.tick = tick;
            r.live_bytes += len * size_of::<f32>();
            r.peak_bytes = r.peak_bytes.max(r.live_bytes);
            if let Some(v) = r.free.get_mut(&len).and_then(Vec::pop) {
                r.bytes -= len * size_of::<f32>();
                return Some(v);
            }
            let bound = r.peak_bytes + r.peak_bytes / FOOTPRINT_SLACK;
            let over = (r.live_bytes + r.bytes).saturating_sub(bound);
            if over > 0 {
                r.free_waiting(over);
            }
            None
        })
        .ok()
        .flatten()
}

/// Frees every buffer waiting for reuse on the calling thread (the module documentation) and
/// returns the bytes freed: for a process done training that keeps running, which otherwise
/// keeps up to a training step's peak waiting for the next step. Later requests allocate afresh.
pub fn release_buffers() -> usize {
    RECYCLER
        .try_with(|r| {
            let mut r = r.borrow_mut();
            r.free.clear();
            std::mem::take(&mut r.bytes)
        })
        .unwrap_or(0)
}

/// Ends a training step on this thread: the waiting buffers of lengths that became stale are
/// freed (module documentation). [`crate::Sgd::step`] calls it.
pub(crate) fn step_done() {
    let _ = RECYCLER.try_with(|r| {
        let mut r = r.borrow_mut();
        r.step += 1;
        r.free_stale();
    });
}

/// A buffer of `len` zeros: a recycled one of that length if one waits, else a new one (see
/// [`reuse`]).
fn zeroed(len: usize) -> Storage {
    match reuse(len) {
        Some(mut v) => {
            crate::par::zero(&mut v);
            v
        }
        None => fresh(len),
    }
}

/// A buffer of `len` values for a caller that overwrites every one of them: a recycled buffer
/// as its last user left it if one waits (no zeroing pass), else a new zeroed one.
fn scratch(len: usize) -> Storage {
    reuse(len).unwrap_or_else(|| fresh(len))
}

/// A copy of `src` in a recycled buffer of its length if one waits, else in a new one (a recycled
/// buffer is filled in runs across threads).
fn copied(src: &[f32]) -> Storage {
    match reuse(src.len()) {
        Some(mut v) => {
            crate::par::copy(&mut v, src);
            v
        }
        None if huge(src.len()) => Storage::Huge(AlignedVec::from(src)),
        None => Storage::Heap(src.to_vec()),
    }
}

/// Keeps `v` for a later [`zeroed`] or copy of its length, within the bounds (the module's
/// doc); otherwise frees it.
fn recycle(v: Storage) {
    let len = v.len();
    // A `Vec` with spare capacity (from `Tensor::new`) would hand a later request more memory
    // than it asked for: freed instead.
    if len < RECYCLE_MIN || matches!(&v, Storage::Heap(h) if h.capacity() != len) {
        return;
    }
    // During thread teardown the list may be gone: then the buffer is simply freed.
    let _ = RECYCLER.try_with(|r| {
        let mut r = r.borrow_mut();
        let Some(d) = r.demand.get_mut(&len) else {
            // No request ever asked for this length.
            return;
        };
        let bytes = len * size_of::<f32>();
        let (was_live, peak) = (d.live > 0, d.peak);
        d.live = d.live.saturating_sub(1);
        if was_live {
            r.live_bytes -= bytes;
        }
        let Recycler {
            free, bytes: total, ..
        } = &mut *r;
        let list = free.entry(len).or_default();
        if list.len() < peak {
            list.push(v);
            *total += bytes;
        }
    });
}

/// A dense, row-major f32 tensor. Activations are `N × C × spatial…` (PyTorch's NCHW / NCDHW),
/// weights `K × C × kernel…`.
#[derive(Debug)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Storage,
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape && self.data() == other.data()
    }
}

/// `Ok` when `len` values fill `shape`, else the error naming both.
fn fits(shape: &[usize], len: usize) -> Result<()> {
    let expected = shape.iter().product::<usize>();
    if len != expected {
        return Err(NnError::DataLen {
            shape: shape.to_vec(),
            got: len,
            expected,
        });
    }
    Ok(())
}

impl Tensor {
    /// A tensor of `shape` over `data`; errors when the lengths disagree.
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        fits(shape, data.len())?;
        Ok(Tensor {
            shape: shape.to_vec(),
            data: Storage::Heap(data),
        })
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        Tensor {
            shape: shape.to_vec(),
            data: zeroed(shape.iter().product()),
        }
    }

    /// A tensor of `shape` whose values the caller overwrites before reading ([`scratch`]).
    pub(crate) fn scratch(shape: &[usize]) -> Self {
        Tensor {
            shape: shape.to_vec(),
            data: scratch(shape.iter().product()),
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

    /// The values, consuming the tensor (a copy when the buffer is a huge-page one the
    /// recycling handed out: module documentation).
    pub fn into_data(mut self) -> Vec<f32> {
        match std::mem::take(&mut self.data) {
            Storage::Heap(v) => v,
            Storage::Huge(v) => {
                let out = v.to_vec();
                recycle(Storage::Huge(v));
                out
            }
        }
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
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self> {
        fits(shape, self.len())?;
        self.shape = shape.to_vec();
        Ok(self)
    }
}

impl Clone for Tensor {
    /// A copy whose buffer is a recycled one when one of its length waits.
    fn clone(&self) -> Self {
        Tensor {
            shape: self.shape.clone(),
            data: copied(&self.data),
        }
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

    thread_local! {
        /// New buffers made on this thread ([`fresh`]).
        pub(super) static FRESH: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

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
        // A length nothing waits for, past the footprint bound (n values were the most in use
        // at once), frees the waiting buffers before allocating.
        let other = Tensor::zeros(&[n + 1]);
        assert!(other.data().iter().all(|&v| v == 0.0));
        assert_eq!(waiting_bytes(), 0);
        // Small buffers and into_data's are not kept.
        drop(Tensor::zeros(&[RECYCLE_MIN - 1]));
        let v = other.into_data();
        assert_eq!((v.len(), waiting_bytes()), (n + 1, 0));
        assert!(Tensor::zeros(&[4]).reshape(&[5]).is_err());
    }

    #[test]
    fn released_buffers_are_freed_and_later_requests_allocate() {
        let n = RECYCLE_MIN + 7;
        let (a, b) = (Tensor::zeros(&[n]), Tensor::zeros(&[n]));
        drop((a, b));
        assert_eq!(waiting_bytes(), 2 * n * 4);
        assert_eq!(release_buffers(), 2 * n * 4);
        assert_eq!((waiting_bytes(), release_buffers()), (0, 0));
        let before = FRESH.with(std::cell::Cell::get);
        let c = Tensor::zeros(&[n]);
        assert_eq!(
            FRESH.with(std::cell::Cell::get),
            before + 1,
            "nothing waited"
        );
        assert!(c.data().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn every_dropped_buffer_of_a_length_waits_and_clones_reuse_them() {
        let n = RECYCLE_MIN + 5;
        let mut ts: Vec<Tensor> = (0..5).map(|_| Tensor::zeros(&[n])).collect();
        for (i, t) in ts.iter_mut().enumerate() {
            t.data_mut().fill(i as f32 + 1.0);
        }
        let ptrs: Vec<*const f32> = ts.iter().map(|t| t.data().as_ptr()).collect();
        let src = ts.pop().expect("five");
        drop(ts);
        assert_eq!(waiting_bytes(), 4 * n * 4, "all four wait, not only two");
        // A clone takes a waiting buffer and holds the source's values, not the old ones.
        let c = src.clone();
        assert!(ptrs[..4].contains(&c.data().as_ptr()));
        assert_eq!(c, src);
        assert_eq!(waiting_bytes(), 3 * n * 4);
        // Zeros take the others, zeroed.
        let zs: Vec<Tensor> = (0..3).map(|_| Tensor::zeros(&[n])).collect();
        assert!(zs.iter().all(|z| z.data().iter().all(|&v| v == 0.0)));
        assert!(zs.iter().all(|z| ptrs[..4].contains(&z.data().as_ptr())));
        assert_eq!(waiting_bytes(), 0);
        // A clone with nothing waiting allocates.
        let fresh = c.clone();
        assert_eq!(fresh, src);
        assert!(!ptrs.contains(&fresh.data().as_ptr()));
    }

    #[test]
    fn large_buffers_take_huge_page_storage_and_are_recycled_like_the_others() {
        // One value past 2 MiB: huge-page storage unless core-blas's switch is off.
        let n = (2 << 20) / 4 + 1;
        let expect_huge = AlignedVec::huge_pages().is_some_and(|min| n * 4 >= min);
        let mut t = Tensor::zeros(&[n]);
        assert_eq!(matches!(t.data, Storage::Huge(_)), expect_huge);
        assert!(t.data().iter().all(|&v| v == 0.0));
        t.data_mut()
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = i as f32);
        let c = t.clone();
        assert_eq!(c, t);
        let (ptr, cptr) = (t.data().as_ptr(), c.data().as_ptr());
        // A reshape keeps the buffer; into_data copies the values out of huge-page storage and
        // recycles it (a `Vec` it hands over).
        let t = t.reshape(&[1, n]).unwrap();
        assert_eq!((t.shape(), t.data().as_ptr()), (&[1, n][..], ptr));
        let v = t.into_data();
        assert_eq!((v.len(), v[n - 1]), (n, (n - 1) as f32));
        assert_eq!(v.as_ptr() != ptr, expect_huge);
        drop(c);
        let again = Tensor::zeros(&[n]);
        assert!(again.data().iter().all(|&v| v == 0.0));
        assert_eq!(matches!(again.data, Storage::Huge(_)), expect_huge);
        // A waiting buffer came back: the tensor's (huge) or the clone's.
        let at = again.data().as_ptr();
        assert!(at == cptr || (expect_huge && at == ptr));
        drop(again);
        assert_eq!(waiting_bytes(), if expect_huge { 2 } else { 1 } * n * 4);
        // A tensor built from a Vec keeps it, whatever its size.
        let own = Tensor::new(&[n], vec![1.0; n]).unwrap();
        assert!(matches!(own.data, Storage::Heap(_)));
    }

    #[test]
    fn stale_lengths_are_freed_at_a_step_end() {
        let (n, m) = (RECYCLE_MIN + 17, RECYCLE_MIN + 19);
        // Step 0 holds both at once, so both may wait.
        drop((Tensor::zeros(&[n]), Tensor::zeros(&[m])));
        assert_eq!(waiting_bytes(), (n + m) * 4);
        step_done();
        // Step 1 asks for n only: m, last asked in step 0, is stale after step 1.
        let t = Tensor::zeros(&[n]);
        assert_eq!(waiting_bytes(), m * 4);
        drop(t);
        step_done();
        assert_eq!(waiting_bytes(), n * 4, "m's buffer freed, n's waits");
        // n, last asked in step 1, goes after step 2.
        step_done();
        assert_eq!(waiting_bytes(), 0);
        // Freed buffers are simply allocated again, zeroed.
        let t = Tensor::zeros(&[m]);
        assert!(t.data().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_miss_frees_only_what_the_footprint_bound_needs_longest_asked_first() {
        let (a, b) = (RECYCLE_MIN * 16, RECYCLE_MIN * 20);
        // Peak a + b; then a is asked before b, so a was asked longest ago.
        drop((Tensor::zeros(&[a]), Tensor::zeros(&[b])));
        drop(Tensor::zeros(&[a]));
        drop(Tensor::zeros(&[b]));
        assert_eq!(waiting_bytes(), (a + b) * 4);
        // A small new length fits in the slack: nothing is freed.
        let small = Tensor::zeros(&[RECYCLE_MIN]);
        assert_eq!(waiting_bytes(), (a + b) * 4);
        drop(small);
        // A length of a's size does not: a's buffer goes, b's waits.
        let c = Tensor::zeros(&[a + 1]);
        assert_eq!(waiting_bytes(), (b + RECYCLE_MIN) * 4);
        drop(c);
    }

    /// A step like a network's: the previous step's tensors of a length are still held while
    /// the next ones are made (layers hold their inputs), so one length's peak only shows in
    /// the second step. Freeing a waiting buffer on every miss would page-fault in every step;
    /// from the third step on, every request is served by a waiting buffer.
    #[test]
    fn a_repeated_step_reaches_a_steady_state_without_new_buffers() {
        let lens = [RECYCLE_MIN + 1, RECYCLE_MIN + 2, RECYCLE_MIN * 16];
        let mut held: Vec<Tensor> = Vec::new();
        for step in 0..6 {
            let before = FRESH.with(|c| c.get());
            let mut made = Vec::new();
            for (i, &l) in lens.iter().enumerate() {
                for _ in 0..=i {
                    made.push(Tensor::zeros(&[l]));
                }
                // The previous step's tensors of this length go only now.
                held.retain(|t| t.shape()[0] != l);
            }
            held = made;
            step_done();
            let new = FRESH.with(|c| c.get()) - before;
            if step >= 2 {
                assert_eq!(new, 0, "step {step} allocated {new} new buffers");
            }
        }
    }

    #[test]
    fn buffers_from_elsewhere_wait_only_up_to_the_requests_demand() {
        // A length no request asked for: dropped buffers are freed, however many.
        let odd = RECYCLE_MIN + 11;
        for _ in 0..3 {
            drop(Tensor::new(&[odd], vec![1.0; odd]).unwrap());
        }
        assert_eq!(waiting_bytes(), 0);
        // Requests had at most two of this length in use at once: of five foreign buffers
        // dropped, two wait.
        let n = RECYCLE_MIN + 13;
        let (a, b) = (Tensor::zeros(&[n]), Tensor::zeros(&[n]));
        drop((a, b));
        assert_eq!(waiting_bytes(), 2 * n * 4);
        let _ = (Tensor::zeros(&[n]), Tensor::zeros(&[n]));
        assert_eq!(waiting_bytes(), 2 * n * 4, "the two came back");
        let foreign: Vec<Tensor> = (0..5)
            .map(|_| Tensor::new(&[n], vec![2.0; n]).unwrap())
            .collect();
        drop(foreign);
        assert_eq!(waiting_bytes(), 2 * n * 4);
        let _ = (Tensor::zeros(&[n]), Tensor::zeros(&[n]));
        assert_eq!(waiting_bytes(), 2 * n * 4);
    }
}
