//! N-dimensional transforms as mode-n products (eq. 3-4 of Budden et al.) with sparse matrices.
//!
//! The fast algorithm for an N-d tile applies the 1-D transform of each dimension along its mode:
//!
//! ```text
//! S = [ (G ×₁ G₁ ×₂ … ×_N G_N) ⊙ (D ×₁ B₁ᵀ ×₂ … ×_N B_Nᵀ) ] ×₁ A₁ᵀ ×₂ … ×_N A_Nᵀ
//! ```
//!
//! Each dimension may use a different F(m_n, r_n). The transform matrices are sparse (Table 1 of
//! the paper), so [`SparseTransform`] keeps, per row, only the exact nonzeros of the rational
//! matrix, and [`mode_n_product`] traverses the matrix in the outermost loops (as the paper does)
//! with a contiguous innermost loop over the trailing modes, which the compiler vectorizes. A
//! trailing batch mode (many tiles) therefore makes every product a run of long AXPYs.

use std::collections::HashMap;
use std::ops::AddAssign;
use std::sync::{Arc, Mutex, OnceLock};

use num_rational::BigRational;
use num_traits::{Float, NumCast, Zero};

use crate::error::{FastconvError, Result};
use crate::rational::to_f64;
use crate::synthesis::{DenseMatrix, WinogradTransform, lock};

/// Floating-point element type of the transforms (`f32` for execution, `f64` for references and
/// the kernel transform).
pub trait Real: Float + AddAssign + Send + Sync + std::fmt::Debug + 'static {
    /// `Y (p × n) := A (p × q) · X (q × n)` on rows `ldx` and `ldy` apart, through a vectorised
    /// kernel of `core-blas` when the type has one; `false` means "not done, use the generic
    /// loops" (f64, or a matrix beyond the kernel's size).
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn small_product(
        _a: &[Self],
        _p: usize,
        _q: usize,
        _n: usize,
        _x: &[Self],
        _ldx: usize,
        _y: &mut [Self],
        _ldy: usize,
    ) -> bool {
        false
    }

    /// A transform matrix prepared once for repeated products (`core_blas::SmallA` for f32).
    #[doc(hidden)]
    type Prepared: Clone + std::fmt::Debug + Send + Sync;

    /// Prepares the dense row-major `p × q` matrix `a`, or `None` (no vectorised kernel, or a
    /// matrix beyond its size).
    #[doc(hidden)]
    fn prepare(_a: &[Self], _p: usize, _q: usize) -> Option<Self::Prepared> {
        None
    }

    /// [`Real::small_product`] with a prepared matrix; `false` means "not done".
    #[doc(hidden)]
    fn prepared_product(
        _a: &Self::Prepared,
        _n: usize,
        _x: &[Self],
        _ldx: usize,
        _y: &mut [Self],
        _ldy: usize,
    ) -> bool {
        false
    }
}

impl Real for f32 {
    /// `core_blas::small_a_strided`: FMA on the widest vectors of the CPU (AVX2 here), which no
    /// crate above core-blas may compile for itself.
    fn small_product(
        a: &[f32],
        p: usize,
        q: usize,
        n: usize,
        x: &[f32],
        ldx: usize,
        y: &mut [f32],
        ldy: usize,
    ) -> bool {
        core_blas::small_a_strided(a, p, q, n, x, ldx, y, ldy).is_ok()
    }

    type Prepared = core_blas::SmallA;

    fn prepare(a: &[f32], p: usize, q: usize) -> Option<core_blas::SmallA> {
        core_blas::SmallA::new(a, p, q).ok()
    }

    /// `core_blas::SmallA::apply_strided`: the nonzeros laid out once, ± row pairs as `s ± d`.
    fn prepared_product(
        a: &core_blas::SmallA,
        n: usize,
        x: &[f32],
        ldx: usize,
        y: &mut [f32],
        ldy: usize,
    ) -> bool {
        a.apply_strided(n, x, ldx, y, ldy).is_ok()
    }
}

impl Real for f64 {
    type Prepared = ();
}

/// A prepared matrix riding along a [`SparseTransform`]: derived from its dense copy, so it takes
/// no part in comparisons.
#[derive(Debug, Clone)]
struct Prepared<P>(Option<P>);

impl<P> PartialEq for Prepared<P> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// A transform matrix stored as per-row lists of its nonzero entries (zeros skipped exactly, as
/// decided on the exact rationals, never by a float threshold).
#[derive(Debug, Clone, PartialEq)]
pub struct SparseTransform<T: Real> {
    rows: usize,
    cols: usize,
    /// Row `i`'s entries are `entries[row_start[i]..row_start[i + 1]]`.
    row_start: Vec<usize>,
    /// `(column, value)` pairs.
    entries: Vec<(usize, T)>,
    /// The rows as applied by the generic loops: pairs of rows equal up to the signs of their
    /// entries share their products (see [`RowGroup`]).
    groups: Vec<RowGroup<T>>,
    /// Dense row-major copy, for [`Real::small_product`].
    dense: Vec<T>,
    /// The dense copy prepared for [`Real::prepared_product`].
    prepared: Prepared<T::Prepared>,
}

/// One or two rows of a transform, applied together. For a pair (`a`, `b`) whose entries have
/// the same columns and magnitudes (`b[j] = ±a[j]`, the rows of the points `+p` and `−p`), with
/// `same` the columns where the signs agree and `flip` those where they differ:
/// `row_a · x = s + d` and `row_b · x = s − d`, `s = Σ_same a[j] x[j]`, `d = Σ_flip a[j] x[j]`:
/// half the multiply-adds of two separate rows. A single row is `a` with `b = None`, all its
/// entries in `same`.
#[derive(Debug, Clone, PartialEq)]
struct RowGroup<T> {
    a: usize,
    b: Option<usize>,
    same: Vec<(usize, T)>,
    flip: Vec<(usize, T)>,
}

/// Row-major dense matrix from per-row nonzeros.
fn densify<T: Real>(
    rows: usize,
    cols: usize,
    row_start: &[usize],
    entries: &[(usize, T)],
) -> Vec<T> {
    let mut d = vec![T::zero(); rows * cols];
    for i in 0..rows {
        for &(j, v) in &entries[row_start[i]..row_start[i + 1]] {
            d[i * cols + j] = v;
        }
    }
    d
}

/// Pairs the rows of a sparse matrix whose entries agree up to sign (same columns, equal
/// magnitudes, compared exactly in `T`; the symmetric rounding of ±q makes this exact for
/// transforms rounded from rationals). Each row is in exactly one group.
fn group_rows<T: Real>(
    rows: usize,
    row_start: &[usize],
    entries: &[(usize, T)],
) -> Vec<RowGroup<T>> {
    let row = |i: usize| &entries[row_start[i]..row_start[i + 1]];
    let mut taken = vec![false; rows];
    let mut groups = Vec::with_capacity(rows);
    for a in 0..rows {
        if taken[a] {
            continue;
        }
        taken[a] = true;
        let ra = row(a);
        let partner = (a + 1..rows).find(|&b| {
            !taken[b]
                && !ra.is_empty()
                && row(b).len() == ra.len()
                && row(b)
                    .iter()
                    .zip(ra)
                    .all(|(&(jb, vb), &(ja, va))| jb == ja && vb.abs() == va.abs())
        });
        let (mut same, mut flip) = (Vec::new(), Vec::new());
        match partner {
            Some(b) => {
                taken[b] = true;
                for (&(j, va), &(_, vb)) in ra.iter().zip(row(b)) {
                    if va == vb {
                        same.push((j, va));
                    } else {
                        flip.push((j, va));
                    }
                }
            }
            None => same.extend_from_slice(ra),
        }
        groups.push(RowGroup {
            a,
            b: partner,
            same,
            flip,
        });
    }
    groups
}

impl<T: Real> SparseTransform<T> {
    /// From an exact rational matrix: exact zeros are dropped, the rest rounded to `T`.
    pub fn from_rational(m: &DenseMatrix<BigRational>) -> Self {
        let mut row_start = Vec::with_capacity(m.rows + 1);
        let mut entries = Vec::new();
        row_start.push(0);
        for i in 0..m.rows {
            for j in 0..m.cols {
                let q = m.at(i, j);
                if !q.is_zero() {
                    // A rounded f64 always converts to f32/f64.
                    let v = <T as NumCast>::from(to_f64(q)).unwrap_or_else(T::nan);
                    entries.push((j, v));
                }
            }
            row_start.push(entries.len());
        }
        SparseTransform {
            rows: m.rows,
            cols: m.cols,
            groups: group_rows(m.rows, &row_start, &entries),
            dense: densify(m.rows, m.cols, &row_start, &entries),
            prepared: Prepared(None),
            row_start,
            entries,
        }
        .prepare()
    }

    /// From a dense floating-point matrix, dropping entries that are exactly zero.
    pub fn from_dense(m: &DenseMatrix<T>) -> Result<Self> {
        if m.data.len() != m.rows * m.cols {
            return Err(FastconvError::BufferLength {
                arg: "m.data",
                got: m.data.len(),
                expected: m.rows * m.cols,
            });
        }
        let mut row_start = vec![0];
        let mut entries = Vec::new();
        for i in 0..m.rows {
            for j in 0..m.cols {
                let v = *m.at(i, j);
                if v != T::zero() {
                    entries.push((j, v));
                }
            }
            row_start.push(entries.len());
        }
        Ok(SparseTransform {
            rows: m.rows,
            cols: m.cols,
            groups: group_rows(m.rows, &row_start, &entries),
            dense: densify(m.rows, m.cols, &row_start, &entries),
            prepared: Prepared(None),
            row_start,
            entries,
        }
        .prepare())
    }

    /// Fills in the prepared form of the dense copy.
    fn prepare(mut self) -> Self {
        self.prepared = Prepared(T::prepare(&self.dense, self.rows, self.cols));
        self
    }

    /// `Y := self · X` on strided rows through a vectorised kernel, if the type has one: the
    /// prepared matrix, else the one-shot small product; `false` means "not done".
    fn fast_product(&self, n: usize, x: &[T], ldx: usize, y: &mut [T], ldy: usize) -> bool {
        match &self.prepared.0 {
            Some(p) => T::prepared_product(p, n, x, ldx, y, ldy),
            None => T::small_product(&self.dense, self.rows, self.cols, n, x, ldx, y, ldy),
        }
    }

    /// Number of rows (the mode size after the product).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (the mode size before the product).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Number of stored nonzeros.
    pub fn nonzeros(&self) -> usize {
        self.entries.len()
    }

    /// Multiply-adds per column of a mode product as applied: the nonzeros, with each pair of
    /// rows equal up to sign counted once (plus its final add and subtract).
    pub fn applied_ops(&self) -> usize {
        self.groups
            .iter()
            .map(|g| g.same.len() + g.flip.len() + if g.b.is_some() { 2 } else { 0 })
            .sum()
    }

    /// Multiply-adds per column of the column-paired form that core-blas's `SmallA` runs for
    /// matrices with ± *column* pairs (Winograd's Aᵀ: columns `k`, `l` with `a[i][l] =
    /// (−1)^i · a[i][k]`, every `a[i][k]` nonzero; 2 to 8 rows): `rows` per pair plus the
    /// other columns' nonzeros, when that is below [`SparseTransform::applied_ops`] (as
    /// `SmallA::new` chooses); else `applied_ops`. The pairs' sums and differences (adds, on the
    /// add pipes) are not counted.
    pub fn executed_ops(&self) -> usize {
        let grouped = self.applied_ops();
        let (p, q) = (self.rows, self.cols);
        if !(2..=8).contains(&p) {
            return grouped;
        }
        let d = self.to_dense();
        let at = |i: usize, k: usize| *d.at(i, k);
        let full = |k: usize| (0..p).all(|i| at(i, k) != T::zero());
        let mirrors = |k: usize, l: usize| {
            (0..p).all(|i| at(i, l) == if i % 2 == 0 { at(i, k) } else { -at(i, k) })
        };
        let mut used = vec![false; q];
        let (mut pairs, mut ops) = (0, 0);
        for k in 0..q {
            if used[k] {
                continue;
            }
            used[k] = true;
            let partner = full(k)
                .then(|| (k + 1..q).find(|&l| !used[l] && mirrors(k, l)))
                .flatten();
            if let Some(l) = partner {
                used[l] = true;
                pairs += 1;
                ops += p;
            } else {
                ops += (0..p).filter(|&i| at(i, k) != T::zero()).count();
            }
        }
        if pairs > 0 && ops < grouped {
            ops
        } else {
            grouped
        }
    }

    /// The nonzeros of row `i` as `(column, value)`.
    pub fn row(&self, i: usize) -> &[(usize, T)] {
        debug_assert!(i < self.rows);
        &self.entries[self.row_start[i]..self.row_start[i + 1]]
    }

    /// Back to a dense matrix (for tests and inspection).
    pub fn to_dense(&self) -> DenseMatrix<T> {
        let mut d = DenseMatrix {
            rows: self.rows,
            cols: self.cols,
            data: vec![T::zero(); self.rows * self.cols],
        };
        for i in 0..self.rows {
            for &(j, v) in self.row(i) {
                d.data[i * self.cols + j] = v;
            }
        }
        d
    }
}

/// The shape after a mode-`mode` product with a matrix of `rows` rows.
fn replaced(dims: &[usize], mode: usize, rows: usize) -> Vec<usize> {
    let mut out = dims.to_vec();
    out[mode] = rows;
    out
}

/// `Y = X ×_mode U` for a row-major tensor `x` of shape `dims` (eq. 3): `Y` has shape `dims` with
/// `dims[mode]` replaced by `U.rows()`, and `Y[.., j, ..] = Σ_c U[j, c] X[.., c, ..]` over the
/// nonzeros of `U` only.
///
/// Errors name the argument: `mode` out of range, `dims` containing 0, `U.cols() != dims[mode]`,
/// or `x`/`y` of the wrong length.
pub fn mode_n_product<T: Real>(
    x: &[T],
    dims: &[usize],
    mode: usize,
    u: &SparseTransform<T>,
    y: &mut [T],
) -> Result<()> {
    if mode >= dims.len() {
        return Err(FastconvError::Shape {
            arg: "mode",
            detail: format!("mode {mode} of a tensor with {} modes", dims.len()),
        });
    }
    if dims.contains(&0) {
        return Err(FastconvError::Zero { arg: "dims" });
    }
    if u.cols() != dims[mode] {
        return Err(FastconvError::Shape {
            arg: "u",
            detail: format!(
                "{} columns but mode {mode} has size {}",
                u.cols(),
                dims[mode]
            ),
        });
    }
    let n: usize = dims.iter().product();
    if x.len() != n {
        return Err(FastconvError::BufferLength {
            arg: "x",
            got: x.len(),
            expected: n,
        });
    }
    let n_out: usize = replaced(dims, mode, u.rows()).iter().product();
    if y.len() != n_out {
        return Err(FastconvError::BufferLength {
            arg: "y",
            got: y.len(),
            expected: n_out,
        });
    }
    mode_n_product_unchecked(x, dims, mode, u, y);
    Ok(())
}

/// [`mode_n_product`] without validation: shapes are `debug_assert!`ed.
pub(crate) fn mode_n_product_unchecked<T: Real>(
    x: &[T],
    dims: &[usize],
    mode: usize,
    u: &SparseTransform<T>,
    y: &mut [T],
) {
    let outer: usize = dims[..mode].iter().product();
    let n_in = dims[mode];
    let inner: usize = dims[mode + 1..].iter().product();
    let n_out = u.rows();
    debug_assert_eq!(u.cols(), n_in);
    debug_assert_eq!(x.len(), outer * n_in * inner);
    debug_assert_eq!(y.len(), outer * n_out * inner);
    // Chunk-major: every output row of a chunk of columns is computed while the chunk's input
    // rows (n_in × CHUNK values) sit in L1, so the input is read once from L2/L3 instead of
    // once per output row that uses it.
    let full = inner / CHUNK * CHUNK;
    for o in 0..outer {
        let xs = &x[o * n_in * inner..(o + 1) * n_in * inner];
        let ys = &mut y[o * n_out * inner..(o + 1) * n_out * inner];
        if u.fast_product(inner, xs, inner, ys, inner) {
            continue;
        }
        for base in (0..full).step_by(CHUNK) {
            for g in &u.groups {
                match g.b {
                    None => single_chunk(&g.same, xs, inner, base, &mut ys[g.a * inner..]),
                    Some(b) => {
                        // Rows a < b (pairs are formed with the later row).
                        let (lo, hi) = ys.split_at_mut(b * inner);
                        for h in [base, base + CHUNK / 2] {
                            paired_chunk(g, xs, inner, h, &mut lo[g.a * inner..], hi);
                        }
                    }
                }
            }
        }
        for i in full..inner {
            for g in &u.groups {
                let dot = |entries: &[(usize, T)]| {
                    let mut acc = T::zero();
                    for &(c, uc) in entries {
                        acc += uc * xs[c * inner + i];
                    }
                    acc
                };
                let (sv, dv) = (dot(&g.same), dot(&g.flip));
                ys[g.a * inner + i] = sv + dv;
                if let Some(b) = g.b {
                    ys[b * inner + i] = sv - dv;
                }
            }
        }
    }
}

/// Columns `base .. base + CHUNK` of one output row (`yrow` starts at the row):
/// `Σ_{(c, u)} u · x[c]`, accumulated in registers and stored once.
#[inline(always)]
fn single_chunk<T: Real>(
    entries: &[(usize, T)],
    xs: &[T],
    inner: usize,
    base: usize,
    yrow: &mut [T],
) {
    let mut acc = [T::zero(); CHUNK];
    for &(c, uc) in entries {
        let xc: &[T; CHUNK] = (&xs[c * inner + base..][..CHUNK])
            .try_into()
            .unwrap_or_else(|_| unreachable!());
        for (a, &xv) in acc.iter_mut().zip(xc) {
            *a += uc * xv;
        }
    }
    yrow[base..base + CHUNK].copy_from_slice(&acc);
}

/// Columns `base .. base + CHUNK / 2` of a pair of output rows, `a = s + d` and `b = s − d`
/// (see [`RowGroup`]); `ya` starts at row a, `yb` at row b.
#[inline(always)]
fn paired_chunk<T: Real>(
    g: &RowGroup<T>,
    xs: &[T],
    inner: usize,
    base: usize,
    ya: &mut [T],
    yb: &mut [T],
) {
    const H: usize = CHUNK / 2;
    let sum = |entries: &[(usize, T)]| {
        let mut acc = [T::zero(); H];
        for &(c, uc) in entries {
            let xc: &[T; H] = (&xs[c * inner + base..][..H])
                .try_into()
                .unwrap_or_else(|_| unreachable!());
            for (a, &xv) in acc.iter_mut().zip(xc) {
                *a += uc * xv;
            }
        }
        acc
    };
    let (s, d) = (sum(&g.same), sum(&g.flip));
    let ya: &mut [T; H] = (&mut ya[base..base + H])
        .try_into()
        .unwrap_or_else(|_| unreachable!());
    let yb: &mut [T; H] = (&mut yb[base..base + H])
        .try_into()
        .unwrap_or_else(|_| unreachable!());
    for i in 0..H {
        ya[i] = s[i] + d[i];
        yb[i] = s[i] - d[i];
    }
}

/// Elements of an output row accumulated in registers at a time by [`mode_n_product_unchecked`]
/// (four AVX2 vectors of f32).
const CHUNK: usize = 32;

/// `Y := U · X` on strided rows: X row `i` is `x[i * ldx..][..n]` (`i < U.cols()`), Y row `j` is
/// `y[j * ldy..][..n]` (`j < U.rows()`), overwritten. The vectorised kernel of `core-blas` when
/// the type has one, else loops over the nonzeros.
pub(crate) fn strided_product<T: Real>(
    u: &SparseTransform<T>,
    n: usize,
    x: &[T],
    ldx: usize,
    y: &mut [T],
    ldy: usize,
) {
    if u.fast_product(n, x, ldx, y, ldy) {
        return;
    }
    for j in 0..u.rows {
        let yr = &mut y[j * ldy..][..n];
        yr.fill(T::zero());
        for &(c, v) in u.row(j) {
            for (o, &xv) in yr.iter_mut().zip(&x[c * ldx..][..n]) {
                *o += v * xv;
            }
        }
    }
}

/// A growable buffer of the mode products: `Vec<T>`, or core-blas's 64-byte aligned
/// [`core_blas::AlignedVec`] for `f32` (SmallA runs 15-25 % faster on rows that start on a cache
/// line: blas's probe, 02:51 UTC, session 7).
pub(crate) trait Buffer<T>: std::ops::DerefMut<Target = [T]> {
    /// Grows (new values zero) or truncates to `len` values, keeping the storage.
    fn resize_to(&mut self, len: usize);

    /// Grows to at least `len` values (new values zero), never shrinks: a buffer reused for
    /// products of different sizes (the ping-pong of [`multi_mode_product_unchecked`]) is
    /// zero-filled only when it reaches a new largest size, not every time it grows back.
    fn grow_to(&mut self, len: usize) {
        if self.len() < len {
            self.resize_to(len);
        }
    }
}

impl<T: Real> Buffer<T> for Vec<T> {
    fn resize_to(&mut self, len: usize) {
        self.resize(len, T::zero());
    }
}

impl Buffer<f32> for core_blas::AlignedVec {
    fn resize_to(&mut self, len: usize) {
        self.resize(len, 0.0);
    }
}

/// `X ×₁ U₁ … ×_N U_N` for `x` of shape `dims` = (α_1, …, α_N, inner) with N = `mats.len()`,
/// written by rows: row `r` (the flat index over the N transformed modes) of the result goes to
/// `y[r * ldy..][..inner]`. The first N − 1 modes run on `x` into `tmp` (with `scratch`), the last
/// one writes straight into `y`, so a block of channels can land in its place in a larger
/// (ξ, channels, tiles) tensor.
///
/// With [`RowsDest::Panels`] the rows are instead cut into pieces of `nr` values laid out as a
/// GEMM's B micro-panels (see there); the last mode's product then runs into `scratch` a group
/// of rows at a time and is copied from L1 into place.
#[allow(clippy::too_many_arguments)]
pub(crate) fn transform_into_rows<T: Real, B: Buffer<T>>(
    x: &[T],
    dims: &[usize],
    mats: &[&SparseTransform<T>],
    scratch: &mut B,
    tmp: &mut B,
    y: &mut [T],
    ldy: usize,
    dest: RowsDest,
) {
    let nm = mats.len();
    debug_assert_eq!(dims.len(), nm + 1);
    let Some((last, first)) = mats.split_last() else {
        return;
    };
    let inner = dims[nm];
    let src: &[T] = if first.is_empty() {
        x
    } else {
        let len = multi_mode_product_unchecked(x, dims, first, scratch, tmp);
        &tmp[..len]
    };
    let outer: usize = first.iter().map(|u| u.rows()).product();
    let a_last = dims[nm - 1];
    if let RowsDest::Panels { .. } = dest {
        scratch.grow_to(last.rows() * inner);
    }
    for o in 0..outer {
        last_mode_rows(
            last,
            o,
            &src[o * a_last * inner..],
            inner,
            scratch,
            y,
            ldy,
            dest,
        );
    }
}

/// The last mode's product of index `o` (see [`transform_into_rows`]): `last` times the rows
/// `x[i · inner..][..inner]`, written as rows `o · last.rows() ..` of the destination. For
/// [`RowsDest::Panels`] the product goes through `scratch` (at least `last.rows() · inner`).
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn last_mode_rows<T: Real>(
    last: &SparseTransform<T>,
    o: usize,
    x: &[T],
    inner: usize,
    scratch: &mut [T],
    y: &mut [T],
    ldy: usize,
    dest: RowsDest,
) {
    let rows = last.rows();
    match dest {
        RowsDest::Rows { at } => {
            strided_product(last, inner, x, inner, &mut y[at + o * rows * ldy..], ldy);
        }
        RowsDest::Panels {
            at,
            seg,
            len,
            nr,
            panel_stride,
        } => {
            debug_assert!(len.is_multiple_of(nr) && len <= seg && inner.is_multiple_of(seg));
            // The product of one `o` (rows × inner, L1-sized) in `scratch`, then its pieces.
            strided_product(last, inner, x, inner, scratch, inner);
            for r in 0..rows {
                let yr = &mut y[at + (o * rows + r) * ldy..];
                let sr = &scratch[r * inner..][..inner];
                match nr {
                    // 32 and 48: core-blas's AVX-512 panels (12 × 32 and 8 × 48 tiles; without
                    // an arm every piece is a `memcpy` call: 11 % of the paper layer's forward
                    // on the Xeon with 32).
                    48 => copy_pieces::<T, 48>(sr, seg, len, yr, panel_stride),
                    32 => copy_pieces::<T, 32>(sr, seg, len, yr, panel_stride),
                    16 => copy_pieces::<T, 16>(sr, seg, len, yr, panel_stride),
                    8 => copy_pieces::<T, 8>(sr, seg, len, yr, panel_stride),
                    _ => {
                        for (c, sc) in sr.chunks_exact(seg).enumerate() {
                            for (p, piece) in sc[..len].chunks_exact(nr).enumerate() {
                                yr[c * nr + p * panel_stride..][..nr].copy_from_slice(piece);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The pieces of one row for [`RowsDest::Panels`] with `nr = N` known at compile time (each
/// piece a few vector moves instead of a `memcpy` call).
#[inline(always)]
fn copy_pieces<T: Real, const N: usize>(
    sr: &[T],
    seg: usize,
    len: usize,
    yr: &mut [T],
    panel_stride: usize,
) {
    for (c, sc) in sr.chunks_exact(seg).enumerate() {
        for (p, piece) in sc[..len].chunks_exact(N).enumerate() {
            let dst = &mut yr[c * N + p * panel_stride..][..N];
            // In pieces of 8 values: a whole `[T; 48]` move (192 bytes) compiled to a `memcpy`
            // call (5.7 % of the paper layer's forward, perf 03:33 UTC session 15).
            for (d, s) in dst.chunks_exact_mut(8).zip(piece.chunks_exact(8)) {
                let d: &mut [T; 8] = d
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("chunks_exact_mut(8)"));
                let s: &[T; 8] = s
                    .try_into()
                    .unwrap_or_else(|_| unreachable!("chunks_exact(8)"));
                *d = *s;
            }
        }
    }
}

/// Where [`transform_into_rows`] writes row `r` (the flat index over the transformed modes) of
/// its result, `inner` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowsDest {
    /// Contiguous at `y[at + r · ldy..]`.
    Rows {
        /// Offset of row 0.
        at: usize,
    },
    /// `inner` = segments of `seg` values (a channel's tiles), the first `len` of each cut into
    /// pieces of `nr`: piece `p` of segment `c` at `y[at + r · ldy + c · nr + p ·
    /// panel_stride..][..nr]` (the NR-wide panels of a (panels, channels, NR) B operand; `len` a
    /// multiple of `nr`; the rest of a segment is dropped).
    Panels {
        /// Offset of row 0's first piece.
        at: usize,
        /// Values per segment.
        seg: usize,
        /// Values of a segment written.
        len: usize,
        /// Values per piece.
        nr: usize,
        /// Distance between consecutive pieces of a segment.
        panel_stride: usize,
    },
}

/// The reverse of [`transform_into_rows`]: row `r` (flat over the N modes of shape `alpha`) of the
/// input is `x[r * ldx..][..inner]`; applies `mats[N − 1]` first (reading the strided rows), then
/// the other modes. The result, (p_1, …, p_N, inner) contiguous, is left in `out[..len]`, `len`
/// returned (the buffers only grow: see [`Buffer::grow_to`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn transform_from_rows<T: Real, B: Buffer<T>>(
    x: &[T],
    ldx: usize,
    alpha: &[usize],
    inner: usize,
    mats: &[&SparseTransform<T>],
    scratch: &mut B,
    tmp: &mut B,
    out: &mut B,
) -> usize {
    let nm = mats.len();
    debug_assert_eq!(alpha.len(), nm);
    let Some((last, first)) = mats.split_last() else {
        return 0;
    };
    let outer: usize = alpha[..nm - 1].iter().product();
    let (a_last, p_last) = (alpha[nm - 1], last.rows());
    let target = if first.is_empty() {
        &mut *out
    } else {
        &mut *tmp
    };
    let len = outer * p_last * inner;
    target.grow_to(len);
    for o in 0..outer {
        strided_product(
            last,
            inner,
            &x[o * a_last * ldx..],
            ldx,
            &mut target[o * p_last * inner..],
            inner,
        );
    }
    if first.is_empty() {
        return len;
    }
    let mut dims = alpha[..nm - 1].to_vec();
    dims.push(p_last * inner);
    multi_mode_product_unchecked(&tmp[..len], &dims, first, scratch, out)
}

/// Applies `mats[n]` along mode `n` for every `n < mats.len()` (trailing modes of `dims` beyond
/// `mats.len()`, such as a batch of tiles, are left alone): `X ×₁ U₁ ×₂ … ×_k U_k`. Returns the
/// result and its shape. `scratch` is reused between calls to avoid allocation.
///
/// Errors as [`mode_n_product`], plus `mats` longer than `dims`.
pub fn multi_mode_product<T: Real>(
    x: &[T],
    dims: &[usize],
    mats: &[&SparseTransform<T>],
    scratch: &mut Vec<T>,
    out: &mut Vec<T>,
) -> Result<Vec<usize>> {
    if mats.len() > dims.len() {
        return Err(FastconvError::Rank {
            arg: "mats",
            got: mats.len(),
            expected: dims.len(),
        });
    }
    if dims.contains(&0) {
        return Err(FastconvError::Zero { arg: "dims" });
    }
    let n: usize = dims.iter().product();
    if x.len() != n {
        return Err(FastconvError::BufferLength {
            arg: "x",
            got: x.len(),
            expected: n,
        });
    }
    let mut shape = dims.to_vec();
    for (mode, u) in mats.iter().enumerate() {
        if u.cols() != shape[mode] {
            return Err(FastconvError::Shape {
                arg: "mats",
                detail: format!(
                    "matrix {mode} has {} columns but mode {mode} has size {}",
                    u.cols(),
                    shape[mode]
                ),
            });
        }
        shape[mode] = u.rows();
    }
    let len = multi_mode_product_unchecked(x, dims, mats, scratch, out);
    out.truncate(len);
    Ok(shape)
}

/// [`multi_mode_product`] without validation: the result in `out[..len]`, `len` returned.
/// `out` and `scratch` only grow ([`Buffer::grow_to`]): each product writes a prefix of its
/// buffer, so buffers reused across calls are not zero-filled again (`Vec::resize` zero-filled
/// every regrowth of the ping-pong: 4-6 % of a 512@4² forward in memset, session 19).
pub(crate) fn multi_mode_product_unchecked<T: Real, B: Buffer<T>>(
    x: &[T],
    dims: &[usize],
    mats: &[&SparseTransform<T>],
    scratch: &mut B,
    out: &mut B,
) -> usize {
    let mut shape = dims.to_vec();
    let Some((first, rest)) = mats.split_first() else {
        out.grow_to(x.len());
        out[..x.len()].copy_from_slice(x);
        return x.len();
    };
    // The first product reads `x` directly; the rest ping-pong between `out` and `scratch`.
    // No clearing: `mode_n_product_unchecked` writes every output element.
    let next = replaced(&shape, 0, first.rows());
    let mut len: usize = next.iter().product();
    out.grow_to(len);
    mode_n_product_unchecked(x, &shape, 0, first, &mut out[..len]);
    shape = next;
    for (i, u) in rest.iter().enumerate() {
        let mode = i + 1;
        let next = replaced(&shape, mode, u.rows());
        let n: usize = next.iter().product();
        scratch.grow_to(n);
        mode_n_product_unchecked(&out[..len], &shape, mode, u, &mut scratch[..n]);
        std::mem::swap(out, scratch);
        shape = next;
        len = n;
    }
    len
}

/// Buffers of the batched kernel transform ([`TileTransforms::kernel_transform`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct KernelWork {
    g64: Vec<f64>,
    scratch: Vec<f64>,
    /// The transformed kernels, (α_1, …, α_N, batch).
    pub out: Vec<f64>,
}

/// The kernel transform of `L` kernels at once, one kernel per lane (the `L` rows of a
/// micro-panel of the packed transformed kernels): the mode products of
/// [`TileTransforms::kernel_transform`] in f64 with the kernels as the trailing mode, by the same
/// operations in the same order per element, so every lane gets the same bits as the batched
/// transform ([`multi_mode_product`] on f64 has no vectorised kernel: its loops over the
/// groups of rows are these loops).
#[derive(Debug, Clone)]
pub(crate) struct LaneTransform<'a> {
    /// Per mode: G of the dimension, and the tensor's (outer, n_in, inner) sizes around it.
    stages: Vec<(&'a SparseTransform<f64>, usize, usize, usize)>,
    taps: usize,
    points: usize,
    /// Largest intermediate tensor, in lanes.
    max_len: usize,
}

impl LaneTransform<'_> {
    /// Kernel taps r_1 ⋯ r_N (the input's length in lanes).
    pub(crate) fn taps(&self) -> usize {
        self.taps
    }

    /// Points α_1 ⋯ α_N (the output's length in lanes).
    pub(crate) fn points(&self) -> usize {
        self.points
    }

    /// Buffers for [`LaneTransform::apply`]: two of the largest intermediate tensor.
    pub(crate) fn buffers<const L: usize>(&self) -> (Vec<[f64; L]>, Vec<[f64; L]>) {
        (vec![[0.0; L]; self.max_len], vec![[0.0; L]; self.max_len])
    }

    /// Transforms the `L` kernels `g` (taps in row-major order, one kernel per lane) into the
    /// first [`LaneTransform::points`] entries of one of `a`, `b` (returned), which must hold
    /// [`LaneTransform::buffers`]' lengths.
    #[inline]
    pub(crate) fn apply<'b, const L: usize>(
        &self,
        g: &[[f64; L]],
        a: &'b mut [[f64; L]],
        b: &'b mut [[f64; L]],
    ) -> &'b [[f64; L]] {
        debug_assert_eq!(g.len(), self.taps);
        let (mut x, mut y) = (a, b);
        let mut first = true;
        let mut len = self.taps;
        for &(u, outer, n_in, inner) in &self.stages {
            let n = outer * u.rows() * inner;
            if first {
                lanes_mode_product(u, outer, n_in, inner, g, &mut x[..n]);
                first = false;
            } else {
                lanes_mode_product(u, outer, n_in, inner, &x[..len], &mut y[..n]);
                std::mem::swap(&mut x, &mut y);
            }
            len = n;
        }
        &x[..len]
    }
}

/// [`mode_n_product_unchecked`] on f64 with an `L`-lane trailing mode: `y` (outer, rows, inner)
/// from `x` (outer, n_in, inner), every lane by the same operations as the generic loops.
#[inline]
fn lanes_mode_product<const L: usize>(
    u: &SparseTransform<f64>,
    outer: usize,
    n_in: usize,
    inner: usize,
    x: &[[f64; L]],
    y: &mut [[f64; L]],
) {
    let n_out = u.rows();
    for o in 0..outer {
        let xs = &x[o * n_in * inner..][..n_in * inner];
        let ys = &mut y[o * n_out * inner..][..n_out * inner];
        for i in 0..inner {
            let sum = |entries: &[(usize, f64)]| {
                let mut acc = [0.0f64; L];
                for &(c, uc) in entries {
                    let xv = &xs[c * inner + i];
                    for l in 0..L {
                        acc[l] += uc * xv[l];
                    }
                }
                acc
            };
            for g in &u.groups {
                match g.b {
                    None => ys[g.a * inner + i] = sum(&g.same),
                    Some(b) => {
                        let (s, d) = (sum(&g.same), sum(&g.flip));
                        let (ya, yb) = (&mut [0.0; L], &mut [0.0; L]);
                        for l in 0..L {
                            ya[l] = s[l] + d[l];
                            yb[l] = s[l] - d[l];
                        }
                        ys[g.a * inner + i] = *ya;
                        ys[b * inner + i] = *yb;
                    }
                }
            }
        }
    }
}

/// The transforms of an N-d tile: one F(m_n, r_n) per spatial dimension, as sparse `f32` Aᵀ and
/// Bᵀ for execution and sparse `f64` G for the kernel transform (computed once per weight update,
/// in double precision, then rounded: it costs nothing per tile and removes one source of error).
#[derive(Debug, Clone)]
pub struct TileTransforms {
    m: Vec<usize>,
    r: Vec<usize>,
    dims: Vec<Arc<DimForms>>,
}

/// The floating-point forms of one dimension's F(m, r): sparse f32 Aᵀ and Bᵀ, sparse G in f64
/// (kernel transform) and f32 (backward-filter's dy chunks). Shared process-wide by every plan
/// with the same exact transform ([`DimForms::shared`]).
#[derive(Debug)]
pub(crate) struct DimForms {
    m: usize,
    r: usize,
    pub(crate) at: SparseTransform<f32>,
    pub(crate) bt: SparseTransform<f32>,
    pub(crate) g: SparseTransform<f64>,
    pub(crate) g32: SparseTransform<f32>,
}

impl DimForms {
    /// Rounds the exact matrices of `t`.
    fn new(t: &WinogradTransform) -> Self {
        DimForms {
            m: t.m(),
            r: t.r(),
            at: SparseTransform::from_rational(t.at()),
            bt: SparseTransform::from_rational(t.bt()),
            g: SparseTransform::from_rational(t.g()),
            g32: SparseTransform::from_rational(t.g()),
        }
    }

    /// The forms of `t` from a process-wide cache keyed by the exact transform (matrices and
    /// points), built on first use.
    pub(crate) fn shared(t: &WinogradTransform) -> Arc<Self> {
        static CACHE: OnceLock<Mutex<HashMap<WinogradTransform, Arc<DimForms>>>> = OnceLock::new();
        let mut cache = lock(CACHE.get_or_init(Mutex::default));
        if let Some(f) = cache.get(t) {
            return Arc::clone(f);
        }
        let f = Arc::new(DimForms::new(t));
        cache.insert(t.clone(), Arc::clone(&f));
        f
    }
}

impl TileTransforms {
    /// One transform per spatial dimension (at least one). The floating-point forms of each
    /// F(m, r) are shared with every other `TileTransforms` of the same exact transform.
    pub fn new(per_dim: &[WinogradTransform]) -> Result<Self> {
        if per_dim.is_empty() {
            return Err(FastconvError::Rank {
                arg: "per_dim",
                got: 0,
                expected: 1,
            });
        }
        Ok(Self::from_forms(
            per_dim.iter().map(DimForms::shared).collect(),
        ))
    }

    /// From the (non-empty) shared forms of every dimension.
    pub(crate) fn from_forms(dims: Vec<Arc<DimForms>>) -> Self {
        debug_assert!(!dims.is_empty());
        TileTransforms {
            m: dims.iter().map(|d| d.m).collect(),
            r: dims.iter().map(|d| d.r).collect(),
            dims,
        }
    }

    /// The shared forms of every dimension (tests: plans share them).
    #[cfg(test)]
    pub(crate) fn forms(&self) -> &[Arc<DimForms>] {
        &self.dims
    }

    /// Number of spatial dimensions N.
    pub fn rank(&self) -> usize {
        self.m.len()
    }

    /// Output tile shape (m_1, …, m_N).
    pub fn out_tile(&self) -> &[usize] {
        &self.m
    }

    /// Kernel shape (r_1, …, r_N).
    pub fn kernel(&self) -> &[usize] {
        &self.r
    }

    /// Input tile shape (α_1, …, α_N), α_n = m_n + r_n − 1.
    pub fn in_tile(&self) -> Vec<usize> {
        self.m.iter().zip(&self.r).map(|(m, r)| m + r - 1).collect()
    }

    /// The sparse f32 Bᵀ of every dimension.
    pub fn bt(&self) -> Vec<&SparseTransform<f32>> {
        self.dims.iter().map(|d| &d.bt).collect()
    }

    /// The sparse f32 Aᵀ of every dimension.
    pub fn at(&self) -> Vec<&SparseTransform<f32>> {
        self.dims.iter().map(|d| &d.at).collect()
    }

    /// Kernel transform `U = g ×₁ G₁ … ×_N G_N` of `batch` kernels stored kernel-minor, i.e. `g` of
    /// shape (r_1, …, r_N, batch) row-major, computed in f64 and rounded to f32; the result has
    /// shape (α_1, …, α_N, batch).
    pub fn kernel_transform(&self, g: &[f32], batch: usize) -> Result<Vec<f32>> {
        let mut ws = KernelWork::default();
        self.kernel_transform_f64(g, batch, &mut ws)?;
        Ok(ws.out.iter().map(|&v| v as f32).collect())
    }

    /// [`TileTransforms::kernel_transform`] into `ws.out`, in f64 (not yet rounded), reusing
    /// the workspace's buffers (no allocation once they are large enough).
    pub(crate) fn kernel_transform_f64(
        &self,
        g: &[f32],
        batch: usize,
        ws: &mut KernelWork,
    ) -> Result<()> {
        self.kernel_transform_f64_range(g, batch, 0..batch, ws)
    }

    /// [`TileTransforms::kernel_transform_f64`] of the kernels `range` of the `batch` in `g`
    /// (shape (r_1, …, r_N, batch)): `ws.out` gets shape (α_1, …, α_N, range.len()). Every
    /// kernel is transformed by the same operations whatever the range, so transforming a batch
    /// in ranges gives the same values as in one piece.
    pub(crate) fn kernel_transform_f64_range(
        &self,
        g: &[f32],
        batch: usize,
        range: std::ops::Range<usize>,
        ws: &mut KernelWork,
    ) -> Result<()> {
        if range.is_empty() {
            return Err(FastconvError::Zero { arg: "batch" });
        }
        let taps: usize = self.r.iter().product();
        if range.end > batch || g.len() != taps * batch {
            return Err(FastconvError::BufferLength {
                arg: "g",
                got: g.len(),
                expected: taps * batch,
            });
        }
        let mut dims = self.r.clone();
        dims.push(range.len());
        ws.g64.clear();
        for t in 0..taps {
            ws.g64.extend(
                g[t * batch..][range.clone()]
                    .iter()
                    .map(|&v| <f64 as From<f32>>::from(v)),
            );
        }
        let mats: Vec<&SparseTransform<f64>> = self.dims.iter().map(|d| &d.g).collect();
        multi_mode_product(&ws.g64, &dims, &mats, &mut ws.scratch, &mut ws.out)
            .map_err(|e| rename(e, "g"))?;
        Ok(())
    }

    /// The kernel transform as per-lane mode products ([`LaneTransform`]).
    pub(crate) fn lane_transform(&self) -> LaneTransform<'_> {
        let mut shape = self.r.clone();
        let mut stages = Vec::with_capacity(shape.len());
        let mut max_len = shape.iter().product::<usize>();
        for (mode, d) in self.dims.iter().enumerate() {
            let outer: usize = shape[..mode].iter().product();
            let inner: usize = shape[mode + 1..].iter().product();
            stages.push((&d.g, outer, shape[mode], inner));
            shape[mode] = d.g.rows();
            max_len = max_len.max(shape.iter().product());
        }
        LaneTransform {
            stages,
            taps: self.r.iter().product(),
            points: shape.iter().product(),
            max_len,
        }
    }

    /// The sparse f32 G of every dimension (used where the "kernel" changes every call: the
    /// output-gradient chunks of backward-filter).
    pub fn g32(&self) -> Vec<&SparseTransform<f32>> {
        self.dims.iter().map(|d| &d.g32).collect()
    }

    /// Input transform `V = d ×₁ B₁ᵀ … ×_N B_Nᵀ` of `batch` tiles, `d` of shape
    /// (α_1, …, α_N, batch); result (α_1, …, α_N, batch) in `out`.
    pub fn input_transform(
        &self,
        d: &[f32],
        batch: usize,
        scratch: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if batch == 0 {
            return Err(FastconvError::Zero { arg: "batch" });
        }
        let mut dims = self.in_tile();
        dims.push(batch);
        multi_mode_product(d, &dims, &self.bt(), scratch, out).map_err(|e| rename(e, "d"))?;
        Ok(())
    }

    /// Output transform `Y = M ×₁ A₁ᵀ … ×_N A_Nᵀ` of `batch` transformed tiles, `m` of shape
    /// (α_1, …, α_N, batch); result (m_1, …, m_N, batch) in `out`.
    pub fn output_transform(
        &self,
        m: &[f32],
        batch: usize,
        scratch: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if batch == 0 {
            return Err(FastconvError::Zero { arg: "batch" });
        }
        let mut dims = self.in_tile();
        dims.push(batch);
        multi_mode_product(m, &dims, &self.at(), scratch, out).map_err(|e| rename(e, "m"))?;
        Ok(())
    }

    /// The whole fast algorithm on one tile in f32 (kernel transform in f64): `d` of shape
    /// (α_1, …, α_N), `g` of shape (r_1, …, r_N); returns the (m_1, …, m_N) correlation outputs.
    pub fn correlate_tile(&self, d: &[f32], g: &[f32]) -> Result<Vec<f32>> {
        let u = self.kernel_transform(g, 1)?;
        let (mut scratch, mut v, mut y) = (Vec::new(), Vec::new(), Vec::new());
        self.input_transform(d, 1, &mut scratch, &mut v)?;
        for (vi, ui) in v.iter_mut().zip(&u) {
            *vi *= ui;
        }
        self.output_transform(&v, 1, &mut scratch, &mut y)?;
        Ok(y)
    }
}

/// Renames the generic `x` of a buffer error to the caller's argument name.
fn rename(e: FastconvError, arg: &'static str) -> FastconvError {
    match e {
        FastconvError::BufferLength {
            arg: "x",
            got,
            expected,
        } => FastconvError::BufferLength { arg, got, expected },
        other => other,
    }
}
