//! Storing C: the third extension point.
//!
//! After the micro-kernel has computed a register tile `AB = A[i.., pc..pc+kc] · B[pc..pc+kc, j..]`
//! (an `rows × cols` tile, at most `MR × NR`) the driver hands it to a [`Store`] together with its
//! coordinates `(i, j)` in C and which k-pass it is. The store decides what "C" is: a dense matrix
//! with alpha/beta, bias and ReLU ([`DenseStore`], the default), or a scatter through an index map
//! such as col2im (deconvgemm, the convgemm paper's Fig. 7), supplied by `conv-ops`.
//!
//! Contract:
//! - The k dimension is split into passes of at most KC; a tile `(i, j)` is delivered once per pass,
//!   with [`Tile::first`] on the first pass and [`Tile::last`] on the last (both for a single pass,
//!   including `k == 0`, where the product is all zeros). The values are the partial product of that
//!   pass only, without alpha. A linear store (scatter-add) simply adds every pass; a store that
//!   needs the finished product returns `true` from [`Store::whole_k`] and then gets one pass.
//! - Tiles of one pass are disjoint and cover C exactly once. With [`Store::concurrent`] = `true`
//!   (the default) `store_tile` is called from several threads at once for different tiles; a
//!   store whose index map sends two tiles to the same memory (col2im) must either synchronise
//!   itself or return `false`, which runs that product on one thread.
//! - The dense default writes straight from registers to C (no tile buffer); this fast path is
//!   [`Store::direct`] and is available only to core-blas's own stores. A custom store whose
//!   output is dense tile by tile (a strided block per tile) gets the same register-to-memory
//!   path through [`Store::window`].

use std::marker::PhantomData;

use crate::{Error, MatMut};

/// One finished (for this k-pass) micro-tile of `A·B`, without alpha.
#[derive(Debug)]
pub struct Tile<'t> {
    pub(crate) i: usize,
    pub(crate) j: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) data: &'t [f32],
    pub(crate) ld: usize,
    pub(crate) first: bool,
    pub(crate) last: bool,
}

impl Tile<'_> {
    /// Row of C where the tile starts.
    pub fn i(&self) -> usize {
        self.i
    }
    /// Column of C where the tile starts.
    pub fn j(&self) -> usize {
        self.j
    }
    /// Rows in this tile (`<= MR`).
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Columns in this tile (`<= NR`).
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Value `(r, c)` of the tile, i.e. the (partial) product at `C[i + r, j + c]`.
    #[inline]
    pub fn get(&self, r: usize, c: usize) -> f32 {
        debug_assert!(r < self.rows && c < self.cols);
        self.data[r * self.ld + c]
    }
    /// Row `r` of the tile (`cols` values).
    #[inline]
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.ld..r * self.ld + self.cols]
    }
    /// True on the first k-pass: the store should overwrite (or scale by beta) rather than add.
    pub fn first(&self) -> bool {
        self.first
    }
    /// True on the last k-pass: the product for this tile is complete after this call.
    pub fn last(&self) -> bool {
        self.last
    }
}

/// Where finished micro-tiles go. See the module documentation for the contract.
pub trait Store: Sync {
    /// Rows of C (`m`).
    fn rows(&self) -> usize;
    /// Columns of C (`n`).
    fn cols(&self) -> usize;
    /// Receive one tile (called once per tile and k-pass, possibly from several threads).
    fn store_tile(&self, tile: &Tile<'_>);
    /// May `store_tile` run concurrently for different tiles? Default `true`.
    fn concurrent(&self) -> bool {
        true
    }
    /// Does the store need each tile exactly once, with the whole k-sum? Default `false`. When
    /// `true`, KC is raised to `k` for this product (slower when `k` exceeds the cache-sized KC).
    fn whole_k(&self) -> bool {
        false
    }
    /// The micro-kernel writes straight into a dense C. Only core-blas's stores can produce a
    /// [`Direct`] (it has no public constructor and is not `Clone`); a wrapper around a
    /// [`DenseStore`] may forward its `direct`. Called once per product, before any tile.
    fn direct(&mut self) -> Option<Direct<'_>> {
        None
    }
    /// The dense fast path for one tile of a custom store: if the `rows × cols` tile at `(i, j)`
    /// of C is a dense block of the store's output (rows `rs` apart, columns contiguous), return
    /// it as a [`Window`]; the micro-kernel then combines into it straight from registers (alpha,
    /// beta on the first pass, accumulation on later passes, the window's row bias and ReLU after
    /// the last pass: the [`DenseStore`] semantics) and `store_tile` is not called for that tile
    /// and pass. Asked once per tile and k-pass; it should answer the same for every pass of a
    /// tile. Default `None`: every tile goes through `store_tile`. A store whose output is dense
    /// only piecewise (channel-major planes of a convolution) returns windows for the tiles that
    /// do not cross a piece boundary.
    #[inline]
    fn window(&self, i: usize, j: usize, rows: usize, cols: usize) -> Option<Window<'_>> {
        let _ = (i, j, rows, cols);
        None
    }
    /// Does [`Store::window`] answer `Some` for every tile of the product? Default `false`.
    /// When `true`, an im2col-like B ([`crate::PackB::conv_panel`]) is packed inside the first
    /// tile of each panel, as for the dense store (that first tile writes into its window; a
    /// panel whose first tile has no window is packed up front all the same).
    fn windows_everywhere(&self) -> bool {
        false
    }
}

/// A dense window of a store's output for one micro-tile (see [`Store::window`]): element
/// `(r, c)` of the tile at `ptr + r · rs + c`, with how to combine into it.
#[derive(Clone, Copy, Debug)]
pub struct Window<'a> {
    pub(crate) raw: DirectRaw,
    pub(crate) bias_len: usize,
    _p: PhantomData<&'a [f32]>,
}

impl<'a> Window<'a> {
    /// A window at `ptr` with row stride `rs` for `C := alpha · A·B + beta · C` (C not read when
    /// `beta == 0`).
    ///
    /// # Safety
    /// For the tile `(i, j, rows, cols)` it is returned for, every `ptr.add(r * rs + c)` with
    /// `r < rows`, `c < cols` must be valid for reads and writes for the whole product and
    /// touched by nobody else meanwhile (no other tile of the product maps there, no other code
    /// accesses it), exactly as if the store's `store_tile` wrote those elements.
    pub unsafe fn new(ptr: *mut f32, rs: usize, alpha: f32, beta: f32) -> Self {
        Window {
            raw: DirectRaw {
                ptr,
                rs,
                cs: 1,
                alpha,
                beta,
                bias: BiasRaw::None,
                relu: false,
            },
            bias_len: usize::MAX,
            _p: PhantomData,
        }
    }

    /// Add `bias[r]` to row `r` of the tile after the last pass (before ReLU). If `bias` is
    /// shorter than the tile's rows the driver does not use the window (the tile goes through
    /// `store_tile`).
    pub fn with_row_bias(mut self, bias: &'a [f32]) -> Self {
        self.raw.bias = BiasRaw::PerRow(bias.as_ptr());
        self.bias_len = bias.len();
        self
    }

    /// Apply `max(x, 0)` after the last pass.
    pub fn with_relu(mut self) -> Self {
        self.raw.relu = true;
        self
    }
}

/// A bias added to every element of C after the product (before ReLU).
#[derive(Clone, Copy, Debug)]
pub enum Bias<'a> {
    /// `C[i, j] += bias[i]` (one value per row: per output channel in a convolution).
    PerRow(&'a [f32]),
    /// `C[i, j] += bias[j]` (one value per column: per feature in a fully connected layer).
    PerCol(&'a [f32]),
}

/// The dense fast path: an exclusive handle on a dense C and how to combine into it. It borrows
/// the store it came from mutably, so at most one product writes through it at a time.
#[derive(Debug)]
pub struct Direct<'a> {
    pub(crate) raw: DirectRaw,
    _c: PhantomData<&'a mut [f32]>,
}

/// The fields of [`Direct`], copied into the driver's threads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DirectRaw {
    pub(crate) ptr: *mut f32,
    pub(crate) rs: usize,
    pub(crate) cs: usize,
    pub(crate) alpha: f32,
    pub(crate) beta: f32,
    pub(crate) bias: BiasRaw,
    pub(crate) relu: bool,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum BiasRaw {
    None,
    PerRow(*const f32),
    PerCol(*const f32),
}

// SAFETY: a `DirectRaw` is only created from a `Direct`, which holds the exclusive borrow of C;
// the driver's threads write through it to disjoint tiles only, and the bias is only read.
unsafe impl Send for DirectRaw {}
// SAFETY: as above.
unsafe impl Sync for DirectRaw {}

impl DirectRaw {
    /// Whether an epilogue (bias, ReLU) must run over a tile on the last pass.
    #[inline]
    pub(crate) fn has_epilogue(&self) -> bool {
        self.relu || !matches!(self.bias, BiasRaw::None)
    }

    /// Apply bias then ReLU to `C[i..i+m, j..j+n]`.
    ///
    /// # Safety
    /// The window is inside C, exclusively owned by the caller, and the bias covers `i + m` rows
    /// (`PerRow`) or `j + n` columns (`PerCol`).
    pub(crate) unsafe fn epilogue(&self, i: usize, j: usize, m: usize, n: usize) {
        for r in 0..m {
            for c in 0..n {
                // SAFETY: inside the window the caller owns; bias bounds checked at construction.
                unsafe {
                    let p = self.ptr.add((i + r) * self.rs + (j + c) * self.cs);
                    let mut x = *p;
                    match self.bias {
                        BiasRaw::None => {}
                        BiasRaw::PerRow(b) => x += *b.add(i + r),
                        BiasRaw::PerCol(b) => x += *b.add(j + c),
                    }
                    if self.relu {
                        x = x.max(0.0);
                    }
                    *p = x;
                }
            }
        }
    }
}

/// The default store: `C := alpha · A·B + beta · C`, then optionally `+ bias` and `ReLU`, into a
/// dense strided C. `beta == 0` never reads C.
#[derive(Debug)]
pub struct DenseStore<'a> {
    direct: DirectRaw,
    rows: usize,
    cols: usize,
    _c: PhantomData<&'a mut [f32]>,
}

impl<'a> DenseStore<'a> {
    /// Store into `c` with `C := alpha · A·B + beta · C`.
    pub fn new(c: MatMut<'a>, alpha: f32, beta: f32) -> Self {
        let MatMut {
            data,
            rows,
            cols,
            rs,
            cs,
        } = c;
        Self {
            direct: DirectRaw {
                ptr: data.as_mut_ptr(),
                rs,
                cs,
                alpha,
                beta,
                bias: BiasRaw::None,
                relu: false,
            },
            rows,
            cols,
            _c: PhantomData,
        }
    }

    /// Add a bias after the product. Errors if it is shorter than the rows (`PerRow`) or columns
    /// (`PerCol`) of C.
    pub fn with_bias(mut self, bias: Bias<'a>) -> Result<Self, Error> {
        let (len, need) = match bias {
            Bias::PerRow(b) => (b.len(), self.rows),
            Bias::PerCol(b) => (b.len(), self.cols),
        };
        if len < need {
            return Err(Error::SliceTooShort {
                arg: "bias",
                len,
                needed: need,
            });
        }
        self.direct.bias = match bias {
            Bias::PerRow(b) => BiasRaw::PerRow(b.as_ptr()),
            Bias::PerCol(b) => BiasRaw::PerCol(b.as_ptr()),
        };
        Ok(self)
    }

    /// Apply `max(x, 0)` after the product and the bias.
    pub fn with_relu(mut self) -> Self {
        self.direct.relu = true;
        self
    }
}

impl Store for DenseStore<'_> {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn store_tile(&self, t: &Tile<'_>) {
        // Tiles only come from the driver (no public constructor); bounds are still re-checked.
        if t.i + t.rows > self.rows || t.j + t.cols > self.cols {
            return;
        }
        let d = &self.direct;
        let beta = if t.first { d.beta } else { 1.0 };
        for r in 0..t.rows {
            for c in 0..t.cols {
                let x = d.alpha * t.get(r, c);
                // SAFETY: `(t.i + r, t.j + c)` is inside C (checked above); tiles are disjoint.
                unsafe {
                    let p = d.ptr.add((t.i + r) * d.rs + (t.j + c) * d.cs);
                    *p = if beta == 0.0 { x } else { x + beta * *p };
                }
            }
        }
        if t.last && d.has_epilogue() {
            // SAFETY: same window, bias bounds checked in `with_bias`.
            unsafe { d.epilogue(t.i, t.j, t.rows, t.cols) };
        }
    }
    fn direct(&mut self) -> Option<Direct<'_>> {
        Some(Direct {
            raw: self.direct,
            _c: PhantomData,
        })
    }
}
