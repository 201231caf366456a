//! `Y := A · X` for a tiny dense A (at most [`SMALL_MAX`] × [`SMALL_MAX`]) and long rows: a skinny
//! product with A in registers and no packing, vectorised with the process-wide kernel family.
//! Used by fastconv for the Winograd transforms (Bᵀ, Aᵀ, G along one mode of a tensor).

use crate::isa::Family;
use crate::kernel::small::{Plan, small_a_body};
use crate::{Error, Gemm};

/// Largest number of rows (`p`) and columns (`q`) of A in [`Gemm::small_a_rows`].
pub const SMALL_MAX: usize = crate::kernel::small::SMALL_MAX;

fn check_a(a: &[f32], p: usize, q: usize) -> Result<(), Error> {
    if p > SMALL_MAX || q > SMALL_MAX {
        return Err(Error::ShapeMismatch {
            arg: "a",
            expected: format!("at most {SMALL_MAX}×{SMALL_MAX}"),
            got: format!("{p}×{q}"),
        });
    }
    if a.len() < p * q {
        return Err(Error::SliceTooShort {
            arg: "a",
            len: a.len(),
            needed: p * q,
        });
    }
    Ok(())
}

impl Gemm {
    /// `Y (p × n) := A (p × q) · X (q × n)`: A dense row-major (`a[j * q + i]`, `p, q <=`
    /// [`SMALL_MAX`]), X given as `q` row slices of at least `n` values, Y as `p` row slices of
    /// exactly `n` values each (`n` = the length of Y's rows; any addresses, no packing). Exact
    /// zeros of A are skipped, so `0 · inf` or `0 · NaN` in X contributes nothing; with `q = 0`, Y
    /// is zeroed. Errors name the argument: A too large or too short, X or Y with the wrong number
    /// of rows, rows of Y of different lengths, a row of X shorter than `n`.
    pub fn small_a_rows(
        &self,
        a: &[f32],
        p: usize,
        q: usize,
        x: &[&[f32]],
        y: &mut [&mut [f32]],
    ) -> Result<(), Error> {
        check_a(a, p, q)?;
        for (arg, rows, want) in [("x", x.len(), q), ("y", y.len(), p)] {
            if rows != want {
                return Err(Error::ShapeMismatch {
                    arg,
                    expected: format!("{want} rows"),
                    got: format!("{rows} rows"),
                });
            }
        }
        let n = y.first().map_or(0, |r| r.len());
        if let Some(r) = y.iter().find(|r| r.len() != n) {
            return Err(Error::ShapeMismatch {
                arg: "y",
                expected: format!("rows of {n} values (the first row)"),
                got: format!("a row of {}", r.len()),
            });
        }
        if let Some(r) = x.iter().find(|r| r.len() < n) {
            return Err(Error::SliceTooShort {
                arg: "x",
                len: r.len(),
                needed: n,
            });
        }
        let mut xs = [std::ptr::null::<f32>(); SMALL_MAX];
        let mut ys = [std::ptr::null_mut::<f32>(); SMALL_MAX];
        for (dst, r) in xs.iter_mut().zip(x) {
            *dst = r.as_ptr();
        }
        for (dst, r) in ys.iter_mut().zip(y.iter_mut()) {
            *dst = r.as_mut_ptr();
        }
        // SAFETY: the q X rows hold at least n values and the p Y rows exactly n (checked above);
        // the Y rows are distinct `&mut` slices, so they overlap neither each other nor X.
        unsafe { self.small_a_raw(&Plan::new(a, p, q, false), &xs[..q], &ys[..p], n) };
        Ok(())
    }

    /// [`Gemm::small_a_rows`] on strided rows: X row `i` is `x[i * ldx ..][.. n]`, Y row `j` is
    /// `y[j * ldy ..][.. n]`. Errors if a leading dimension is below `n` (with more than one row)
    /// or a slice is too short.
    #[allow(clippy::too_many_arguments)]
    pub fn small_a_strided(
        &self,
        a: &[f32],
        p: usize,
        q: usize,
        n: usize,
        x: &[f32],
        ldx: usize,
        y: &mut [f32],
        ldy: usize,
    ) -> Result<(), Error> {
        check_a(a, p, q)?;
        self.small_a_apply(&SmallA::unpaired(a, p, q)?, n, x, ldx, y, ldy)
    }

    /// [`Gemm::small_a_strided`] with A prepared once ([`SmallA`]): no per-call setup beyond the
    /// slice checks. Same contract and errors as `small_a_strided`.
    pub fn small_a_apply(
        &self,
        a: &SmallA,
        n: usize,
        x: &[f32],
        ldx: usize,
        y: &mut [f32],
        ldy: usize,
    ) -> Result<(), Error> {
        let (p, q) = (a.plan.p, a.plan.q);
        for (arg, ld_arg, len, rows, ld) in
            [("x", "ldx", x.len(), q, ldx), ("y", "ldy", y.len(), p, ldy)]
        {
            if rows > 1 && ld < n {
                return Err(Error::LeadingDimension {
                    arg: ld_arg,
                    value: ld,
                    min: n,
                });
            }
            let needed = if rows == 0 || n == 0 {
                0
            } else {
                (rows - 1)
                    .checked_mul(ld)
                    .and_then(|s| s.checked_add(n))
                    .ok_or_else(|| Error::Stride {
                        arg,
                        reason: "size overflows usize".into(),
                    })?
            };
            if len < needed {
                return Err(Error::SliceTooShort { arg, len, needed });
            }
        }
        if n == 0 {
            return Ok(());
        }
        let mut xs = [std::ptr::null::<f32>(); SMALL_MAX];
        let mut ys = [std::ptr::null_mut::<f32>(); SMALL_MAX];
        for (i, dst) in xs.iter_mut().enumerate().take(q) {
            *dst = x[i * ldx..].as_ptr();
        }
        let yp = y.as_mut_ptr();
        for (j, dst) in ys.iter_mut().enumerate().take(p) {
            // Inside `y`: j * ldy + n <= needed <= y.len() (checked above).
            *dst = yp.wrapping_add(j * ldy);
        }
        // SAFETY: each X row has n readable values and each Y row n writable values inside the
        // slices (lengths checked above); Y rows are ldy >= n apart so they do not overlap, and
        // `y` is a `&mut` distinct from `x`.
        unsafe { self.small_a_raw(&a.plan, &xs[..q], &ys[..p], n) };
        Ok(())
    }

    /// Dispatch to the family's small-A body.
    ///
    /// # Safety
    /// As [`small_a_body`].
    unsafe fn small_a_raw(&self, nz: &Plan, xs: &[*const f32], ys: &[*mut f32], n: usize) {
        match self.family {
            // SAFETY: the portable body needs no target feature; memory per the caller.
            Family::Scalar(_) => unsafe {
                small_a_body::<crate::kernel::portable::Lanes8>(nz, xs, ys, n)
            },
            // SAFETY: holding an Avx2 kernel proves avx2+fma; memory per the caller.
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(_) => unsafe { crate::kernel::x86::small_a_avx2(nz, xs, ys, n) },
            // SAFETY: holding an Avx512 kernel proves avx512f+avx2+fma; memory per the caller.
            #[cfg(target_arch = "x86_64")]
            Family::Avx512(_) => unsafe { crate::kernel::x86::small_a_avx512(nz, xs, ys, n) },
        }
    }
}

/// A tiny A (`p, q <=` [`SMALL_MAX`]) prepared once for repeated products `Y := A · X`
/// ([`SmallA::apply_strided`], [`Gemm::small_a_apply`]): its exact zeros dropped and its rows
/// grouped in twos. Two rows with the same nonzero columns and coefficients of equal magnitude
/// (the ±x rows of Winograd matrices) are computed together as `s ± d` (half the multiply-adds);
/// other rows go two at a time. When A has ± *column* pairs instead (Winograd's Aᵀ: columns `k`,
/// `l` with `a[i][l] = (−1)^i · a[i][k]`, all nonzero) and that needs fewer multiply-adds, and
/// `2 <= p <= 8`, the product runs column-paired: per pair `x_k + x_l` feeds the even rows and
/// `x_k − x_l` the odd ones, all rows accumulated at once ([`SmallA::column_paired`]). Paired
/// rows or columns are rounded in that order, which may differ in the last bits from summing the
/// row directly ([`SmallA::unpaired`] keeps the direct order; [`small_a_rows`] and
/// [`small_a_strided`] use it).
#[derive(Clone, Debug)]
pub struct SmallA {
    plan: Plan,
}

impl SmallA {
    /// Prepare the row-major `p × q` matrix `a` (`a[j * q + i]`). Errors if `p` or `q` exceeds
    /// [`SMALL_MAX`] or `a` holds fewer than `p · q` values.
    pub fn new(a: &[f32], p: usize, q: usize) -> Result<Self, Error> {
        check_a(a, p, q)?;
        Ok(Self {
            plan: Plan::new(a, p, q, true),
        })
    }

    /// As [`SmallA::new`] without the ± row pairs: every row of Y is the sum of its terms in
    /// column order (the rounding of [`small_a_strided`], which uses this form), rows two at a
    /// time.
    pub fn unpaired(a: &[f32], p: usize, q: usize) -> Result<Self, Error> {
        check_a(a, p, q)?;
        Ok(Self {
            plan: Plan::new(a, p, q, false),
        })
    }

    /// Rows of A (`p`, the rows of Y).
    pub fn rows(&self) -> usize {
        self.plan.p
    }

    /// Columns of A (`q`, the rows of X).
    pub fn cols(&self) -> usize {
        self.plan.q
    }

    /// Whether the product runs in the column-paired form (see [`SmallA::new`]).
    pub fn column_paired(&self) -> bool {
        self.plan.cols.is_some()
    }

    /// `Y := A · X` with the process-wide kernel family: X row `i` is `x[i * ldx ..][.. n]`, Y
    /// row `j` is `y[j * ldy ..][.. n]` (overwritten). Errors as [`Gemm::small_a_strided`].
    pub fn apply_strided(
        &self,
        n: usize,
        x: &[f32],
        ldx: usize,
        y: &mut [f32],
        ldy: usize,
    ) -> Result<(), Error> {
        Gemm::global()?.small_a_apply(self, n, x, ldx, y, ldy)
    }
}

/// [`Gemm::small_a_rows`] with the process-wide kernel family.
pub fn small_a_rows(
    a: &[f32],
    p: usize,
    q: usize,
    x: &[&[f32]],
    y: &mut [&mut [f32]],
) -> Result<(), Error> {
    Gemm::global()?.small_a_rows(a, p, q, x, y)
}

/// [`Gemm::small_a_strided`] with the process-wide kernel family.
#[allow(clippy::too_many_arguments)]
pub fn small_a_strided(
    a: &[f32],
    p: usize,
    q: usize,
    n: usize,
    x: &[f32],
    ldx: usize,
    y: &mut [f32],
    ldy: usize,
) -> Result<(), Error> {
    Gemm::global()?.small_a_strided(a, p, q, n, x, ldx, y, ldy)
}
