//! Strided matrix views: a slice plus rows, columns, row stride and column stride.
//!
//! Element `(i, j)` lives at `data[i * rs + j * cs]`. Row-major storage with leading dimension `ld`
//! is `rs = ld, cs = 1`; column-major is `rs = 1, cs = ld`; a transpose swaps both pairs.

use crate::Error;

/// Smallest slice length holding a `rows × cols` matrix with strides `rs`, `cs`, or `None` on overflow.
pub(crate) fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> Option<usize> {
    if rows == 0 || cols == 0 {
        return Some(0);
    }
    (rows - 1)
        .checked_mul(rs)?
        .checked_add((cols - 1).checked_mul(cs)?)?
        .checked_add(1)
}

fn check_span(
    arg: &'static str,
    len: usize,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
) -> Result<(), Error> {
    let needed = span(rows, cols, rs, cs).ok_or_else(|| Error::Stride {
        arg,
        reason: format!("{rows}×{cols} with strides ({rs}, {cs}) overflows usize"),
    })?;
    if len < needed {
        return Err(Error::SliceTooShort { arg, len, needed });
    }
    Ok(())
}

/// A read-only strided view of an `f32` matrix.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

impl<'a> MatRef<'a> {
    /// A `rows × cols` view with row stride `rs` and column stride `cs` (in elements).
    /// Errors if `data` is too short for the shape and strides (`arg` names it in the error).
    pub fn new(
        arg: &'static str,
        data: &'a [f32],
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
    ) -> Result<Self, Error> {
        check_span(arg, data.len(), rows, cols, rs, cs)?;
        Ok(Self {
            data,
            rows,
            cols,
            rs,
            cs,
        })
    }

    /// A row-major `rows × cols` view with leading dimension `ld >= cols`.
    pub fn row_major(
        arg: &'static str,
        data: &'a [f32],
        rows: usize,
        cols: usize,
        ld: usize,
    ) -> Result<Self, Error> {
        if rows > 1 && ld < cols {
            return Err(Error::LeadingDimension {
                arg,
                value: ld,
                min: cols,
            });
        }
        Self::new(arg, data, rows, cols, ld, 1)
    }

    /// The transposed view (no data moves).
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row stride in elements.
    pub fn row_stride(&self) -> usize {
        self.rs
    }

    /// Column stride in elements.
    pub fn col_stride(&self) -> usize {
        self.cs
    }

    /// Element `(i, j)`, or `None` outside the matrix.
    pub fn get(&self, i: usize, j: usize) -> Option<f32> {
        (i < self.rows && j < self.cols).then(|| self.data[i * self.rs + j * self.cs])
    }
}

/// A mutable strided view of an `f32` matrix. Its strides never map two elements to one address
/// (checked at construction), so disjoint blocks can be written from different threads.
#[derive(Debug)]
pub struct MatMut<'a> {
    pub(crate) data: &'a mut [f32],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

impl<'a> MatMut<'a> {
    /// A `rows × cols` mutable view with strides `rs`, `cs`. Errors if `data` is too short or if the
    /// strides alias (two elements at one address).
    pub fn new(
        arg: &'static str,
        data: &'a mut [f32],
        rows: usize,
        cols: usize,
        rs: usize,
        cs: usize,
    ) -> Result<Self, Error> {
        check_span(arg, data.len(), rows, cols, rs, cs)?;
        if rows > 1 && cols > 1 {
            // Sort the two (extent, stride) pairs by stride: the inner one must be non-zero and the
            // outer one must step over a whole inner line.
            let ((n_in, s_in), (_, s_out)) = if rs <= cs {
                ((rows, rs), (cols, cs))
            } else {
                ((cols, cs), (rows, rs))
            };
            if s_in == 0 || s_out < s_in * n_in {
                return Err(Error::Stride {
                    arg,
                    reason: format!("strides ({rs}, {cs}) alias elements of a {rows}×{cols} view"),
                });
            }
        } else if (rows > 1 && rs == 0) || (cols > 1 && cs == 0) {
            return Err(Error::Stride {
                arg,
                reason: "zero stride on a dimension > 1".into(),
            });
        }
        Ok(Self {
            data,
            rows,
            cols,
            rs,
            cs,
        })
    }

    /// A row-major `rows × cols` mutable view with leading dimension `ld >= cols`.
    pub fn row_major(
        arg: &'static str,
        data: &'a mut [f32],
        rows: usize,
        cols: usize,
        ld: usize,
    ) -> Result<Self, Error> {
        if rows > 1 && ld < cols {
            return Err(Error::LeadingDimension {
                arg,
                value: ld,
                min: cols,
            });
        }
        Self::new(arg, data, rows, cols, ld, 1)
    }

    /// The transposed view (no data moves).
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// A shorter-lived mutable view of the same matrix.
    pub fn rb_mut(&mut self) -> MatMut<'_> {
        MatMut {
            data: self.data,
            rows: self.rows,
            cols: self.cols,
            rs: self.rs,
            cs: self.cs,
        }
    }

    /// A read-only view of the same matrix.
    pub fn as_ref(&self) -> MatRef<'_> {
        MatRef {
            data: self.data,
            rows: self.rows,
            cols: self.cols,
            rs: self.rs,
            cs: self.cs,
        }
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row stride in elements.
    pub fn row_stride(&self) -> usize {
        self.rs
    }

    /// Column stride in elements.
    pub fn col_stride(&self) -> usize {
        self.cs
    }

    /// Element `(i, j)`, or `None` outside the matrix.
    pub fn get(&self, i: usize, j: usize) -> Option<f32> {
        (i < self.rows && j < self.cols).then(|| self.data[i * self.rs + j * self.cs])
    }

    /// Mutable element `(i, j)`, or `None` outside the matrix.
    pub fn get_mut(&mut self, i: usize, j: usize) -> Option<&mut f32> {
        (i < self.rows && j < self.cols).then(|| &mut self.data[i * self.rs + j * self.cs])
    }
}
