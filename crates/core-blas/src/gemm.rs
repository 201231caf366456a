//! The public entry points: a [`Gemm`] context (kernel family + block sizes) and its products.

use rayon::prelude::*;

use crate::blocking::{BlockSizes, CacheSizes, Exact, derive};
use crate::driver;
use crate::isa::Family;
use crate::pack::{PackA, PackB};
use crate::store::{DenseStore, Store};
use crate::view::span;
use crate::{Error, Isa, MatMut, MatRef};

/// A kernel family with its block sizes: everything a product needs besides its operands.
/// [`Gemm::global`] is the process-wide one the free functions use; build others to force a
/// family (tests loop over [`Isa::available`]) or to try block sizes.
#[derive(Clone, Copy, Debug)]
pub struct Gemm {
    pub(crate) family: Family,
    isa: Isa,
    blocks: BlockSizes,
    exact: Exact,
}

impl Gemm {
    /// The context for `isa` with block sizes derived from this CPU's caches. Errors if the CPU
    /// lacks the family.
    pub fn new(isa: Isa) -> Result<Self, Error> {
        let family = Family::require(isa)?;
        let (mr, nr) = family.tile();
        Ok(Self {
            family,
            isa,
            blocks: derive(isa, mr, nr, CacheSizes::detect()),
            exact: Exact::default(),
        })
    }

    /// The process-wide context (`CORE_BLAS_ISA`, `CORE_BLAS_MC/KC/NC`), built once.
    pub fn global() -> Result<&'static Gemm, Error> {
        crate::isa::global()
    }

    /// The same family with other block sizes (validated), which the driver adapts to each
    /// product as it does the derived ones: with several A blocks a kernel may run passes 4/3
    /// deeper and A blocks as much shorter, k and m are split into equal blocks of at most KC and
    /// MC (passes up to KC/8 deeper when that saves one of two or three), and a single A block
    /// caps the B block's width by its L2 budget.
    pub fn with_block_sizes(self, blocks: BlockSizes) -> Result<Self, Error> {
        Ok(Self {
            blocks: blocks.validate()?,
            exact: Exact::default(),
            ..self
        })
    }

    /// The same family running exactly the block sizes given (validated): passes of `kc` over
    /// k (the last one shorter), A blocks of `mc` rows and B blocks of `nc` columns (rounded up to
    /// the tile's MR and NR; the last ones shorter), none of the adaptations of
    /// [`with_block_sizes`](Gemm::with_block_sizes). What the `CORE_BLAS_MC/KC/NC` variables set
    /// runs this way. A product whose store needs the whole k in one pass still runs one pass.
    pub fn with_exact_block_sizes(self, blocks: BlockSizes) -> Result<Self, Error> {
        Ok(Self {
            blocks: blocks.validate()?,
            exact: Exact::ALL,
            ..self
        })
    }

    /// Which of the block sizes run exactly (set by `with_exact_block_sizes` or the variables).
    pub(crate) fn with_exact(self, exact: Exact) -> Self {
        Self { exact, ..self }
    }

    /// Which of the block sizes run exactly.
    #[cfg(test)]
    pub(crate) fn exact(&self) -> Exact {
        self.exact
    }

    /// The kernel family.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The kernel name, `{family}-f32-{MR}x{NR}`.
    pub fn kernel_name(&self) -> &'static str {
        self.family.name()
    }

    /// The register tile `(MR, NR)`.
    pub fn tile(&self) -> (usize, usize) {
        self.family.tile()
    }

    /// The block sizes in use.
    pub fn block_sizes(&self) -> BlockSizes {
        self.blocks
    }

    /// Monomorphized dispatch to the driver for this family.
    fn run<A: PackA, B: PackB, S: Store>(&self, a: &A, b: &B, store: &mut S, max_threads: usize) {
        match self.family {
            Family::Scalar(k) => driver::gemm(k, self.blocks, self.exact, a, b, store, max_threads),
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(k) => driver::gemm(k, self.blocks, self.exact, a, b, store, max_threads),
            #[cfg(target_arch = "x86_64")]
            Family::Avx512(k) => driver::gemm(k, self.blocks, self.exact, a, b, store, max_threads),
        }
    }

    /// `C := alpha · A · B + beta · C` on strided views. `beta == 0` never reads C; `alpha == 0`
    /// never reads A or B.
    pub fn gemm(
        &self,
        alpha: f32,
        a: MatRef<'_>,
        b: MatRef<'_>,
        beta: f32,
        c: MatMut<'_>,
    ) -> Result<(), Error> {
        check_product(&a, &b, c.rows, c.cols)?;
        self.gemm_unchecked(alpha, a, b, beta, c, usize::MAX);
        Ok(())
    }

    fn gemm_unchecked(
        &self,
        alpha: f32,
        a: MatRef<'_>,
        b: MatRef<'_>,
        beta: f32,
        c: MatMut<'_>,
        max_threads: usize,
    ) {
        if c.rows == 0 || c.cols == 0 {
            return;
        }
        if alpha == 0.0 {
            scale(c, beta);
            return;
        }
        // The micro-kernel stores rows of C with vector stores; a column-major C is computed as
        // Cᵀ = Bᵀ · Aᵀ instead.
        if c.cs != 1 && c.rs == 1 && c.cols > 1 {
            self.gemm_unchecked(alpha, b.t(), a.t(), beta, c.t(), max_threads);
            return;
        }
        let mut store = DenseStore::new(c, alpha, beta);
        self.run(&a, &b, &mut store, max_threads);
    }

    /// The generic product: A and B from any packing sources, C through any store (the extension
    /// points, see [`crate::pack`] and [`crate::store`]). Shapes must agree: `a` is `m × k`, `b` is
    /// `k × n`, `store` is `m × n`.
    pub fn gemm_with<A: PackA, B: PackB, S: Store>(
        &self,
        a: &A,
        b: &B,
        store: &mut S,
    ) -> Result<(), Error> {
        check_sources(a, b, store)?;
        self.run(a, b, store, usize::MAX);
        Ok(())
    }

    /// The cblas row-major `sgemm`: `C := alpha · op(A) · op(B) + beta · C` with `op(A)` `m × k`,
    /// `op(B)` `k × n`, C `m × n`. A is stored `m × k` (`k × m` if `transa`) with leading dimension
    /// `lda`; likewise B and C. Leading dimensions must be at least `max(1, row length)`.
    #[allow(clippy::too_many_arguments)]
    pub fn sgemm(
        &self,
        transa: bool,
        transb: bool,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        beta: f32,
        c: &mut [f32],
        ldc: usize,
    ) -> Result<(), Error> {
        let a = operand("a", "lda", a, transa, m, k, lda, 0, 1)?;
        let b = operand("b", "ldb", b, transb, k, n, ldb, 0, 1)?;
        let c = output(c, m, n, ldc, 0, 1)?;
        self.gemm_unchecked(alpha, a, b, beta, c, usize::MAX);
        Ok(())
    }

    /// Strided batched `sgemm`: `batch` independent products of the same shape, product `p`
    /// reading A at `a[p · stride_a ..]`, B at `b[p · stride_b ..]` and writing C at
    /// `c[p · stride_c ..]`, each as in [`Gemm::sgemm`]. The C matrices must not overlap
    /// (`stride_c` at least the span of one C). One parallel schedule covers the batch: with at
    /// least as many products as threads each thread runs whole products; otherwise products run
    /// one after the other, each on all threads.
    #[allow(clippy::too_many_arguments)]
    pub fn sgemm_batched(
        &self,
        transa: bool,
        transb: bool,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &[f32],
        lda: usize,
        stride_a: usize,
        b: &[f32],
        ldb: usize,
        stride_b: usize,
        beta: f32,
        c: &mut [f32],
        ldc: usize,
        stride_c: usize,
        batch: usize,
    ) -> Result<(), Error> {
        if batch == 0 {
            return Ok(());
        }
        // Validate the whole batch up front (the last product reaches furthest).
        operand("a", "lda", a, transa, m, k, lda, stride_a, batch)?;
        operand("b", "ldb", b, transb, k, n, ldb, stride_b, batch)?;
        output(c, m, n, ldc, stride_c, batch)?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        let c_span = span(m, n, ldc, 1).unwrap_or(usize::MAX);
        if batch > 1 && stride_c < c_span {
            return Err(Error::Stride {
                arg: "stride_c",
                reason: format!(
                    "{stride_c} is less than the {c_span} elements of one C: outputs overlap"
                ),
            });
        }
        let item = |p: usize, cp: &mut [f32], threads: usize| {
            // Validated above for every p: these views cannot fail.
            let ap = operand("a", "lda", &a[p * stride_a..], transa, m, k, lda, 0, 1);
            let bp = operand("b", "ldb", &b[p * stride_b..], transb, k, n, ldb, 0, 1);
            let cv = output(cp, m, n, ldc, 0, 1);
            if let (Ok(ap), Ok(bp), Ok(cv)) = (ap, bp, cv) {
                self.gemm_unchecked(alpha, ap, bp, beta, cv, threads);
            }
        };
        let chunk = if batch == 1 { c.len().max(1) } else { stride_c };
        let total = m
            .saturating_mul(n)
            .saturating_mul(k.max(1))
            .saturating_mul(batch);
        let pool = if total >= driver::PAR_MIN_MNK {
            rayon::current_num_threads()
        } else {
            1
        };
        if pool > 1 && batch >= pool {
            c.par_chunks_mut(chunk)
                .take(batch)
                .enumerate()
                .for_each(|(p, cp)| item(p, cp, 1));
        } else {
            for (p, cp) in c.chunks_mut(chunk).take(batch).enumerate() {
                item(p, cp, usize::MAX);
            }
        }
        Ok(())
    }

    /// Batched generic products: product `p` is `a[p] · b[p]` into `stores[p]`, scheduled like
    /// [`Gemm::sgemm_batched`]. The three slices must have the same length.
    pub fn gemm_batched_with<A: PackA, B: PackB, S: Store + Send>(
        &self,
        a: &[A],
        b: &[B],
        stores: &mut [S],
    ) -> Result<(), Error> {
        let batch = stores.len();
        for (arg, len) in [("a", a.len()), ("b", b.len())] {
            if len != batch {
                return Err(Error::ShapeMismatch {
                    arg,
                    expected: format!("{batch} products (stores.len())"),
                    got: format!("{len}"),
                });
            }
        }
        let mut total = 0usize;
        for p in 0..batch {
            check_sources(&a[p], &b[p], &stores[p])?;
            total = total.saturating_add(
                a[p].rows()
                    .saturating_mul(b[p].cols())
                    .saturating_mul(a[p].cols().max(1)),
            );
        }
        let pool = if total >= driver::PAR_MIN_MNK {
            rayon::current_num_threads()
        } else {
            1
        };
        if pool > 1 && batch >= pool {
            stores
                .par_iter_mut()
                .enumerate()
                .for_each(|(p, s)| self.run(&a[p], &b[p], s, 1));
        } else {
            for (p, s) in stores.iter_mut().enumerate() {
                self.run(&a[p], &b[p], s, usize::MAX);
            }
        }
        Ok(())
    }
}

/// `C := beta · C` (C not read when `beta == 0`).
fn scale(c: MatMut<'_>, beta: f32) {
    let MatMut {
        data,
        rows,
        cols,
        rs,
        cs,
    } = c;
    for i in 0..rows {
        for j in 0..cols {
            let x = &mut data[i * rs + j * cs];
            *x = if beta == 0.0 { 0.0 } else { beta * *x };
        }
    }
}

fn check_product(a: &MatRef<'_>, b: &MatRef<'_>, m: usize, n: usize) -> Result<(), Error> {
    if a.cols != b.rows {
        return Err(Error::ShapeMismatch {
            arg: "b",
            expected: format!("{} rows (columns of a)", a.cols),
            got: format!("{}×{}", b.rows, b.cols),
        });
    }
    if (a.rows, b.cols) != (m, n) {
        return Err(Error::ShapeMismatch {
            arg: "c",
            expected: format!("{}×{}", a.rows, b.cols),
            got: format!("{m}×{n}"),
        });
    }
    Ok(())
}

fn check_sources<A: PackA, B: PackB, S: Store>(a: &A, b: &B, s: &S) -> Result<(), Error> {
    if a.cols() != b.rows() {
        return Err(Error::ShapeMismatch {
            arg: "b",
            expected: format!("{} rows (columns of a)", a.cols()),
            got: format!("{}×{}", b.rows(), b.cols()),
        });
    }
    if (s.rows(), s.cols()) != (a.rows(), b.cols()) {
        return Err(Error::ShapeMismatch {
            arg: "store",
            expected: format!("{}×{}", a.rows(), b.cols()),
            got: format!("{}×{}", s.rows(), s.cols()),
        });
    }
    Ok(())
}

/// The view of `op(X)` (`rows × cols`) for a cblas row-major operand, validating `ld` and the
/// slice length for `batch` copies `stride` apart.
#[allow(clippy::too_many_arguments)]
fn operand<'a>(
    arg: &'static str,
    ld_arg: &'static str,
    data: &'a [f32],
    trans: bool,
    rows: usize,
    cols: usize,
    ld: usize,
    stride: usize,
    batch: usize,
) -> Result<MatRef<'a>, Error> {
    let (sr, sc) = if trans { (cols, rows) } else { (rows, cols) };
    if ld < sc.max(1) {
        return Err(Error::LeadingDimension {
            arg: ld_arg,
            value: ld,
            min: sc.max(1),
        });
    }
    let needed = span(sr, sc, ld, 1)
        .and_then(|one| {
            if one == 0 {
                Some(0)
            } else {
                (batch - 1).checked_mul(stride)?.checked_add(one)
            }
        })
        .ok_or_else(|| Error::Stride {
            arg,
            reason: "size overflows usize".into(),
        })?;
    if data.len() < needed {
        return Err(Error::SliceTooShort {
            arg,
            len: data.len(),
            needed,
        });
    }
    let v = MatRef {
        data,
        rows: sr,
        cols: sc,
        rs: ld,
        cs: 1,
    };
    Ok(if trans { v.t() } else { v })
}

fn output(
    data: &mut [f32],
    rows: usize,
    cols: usize,
    ld: usize,
    stride: usize,
    batch: usize,
) -> Result<MatMut<'_>, Error> {
    if ld < cols.max(1) {
        return Err(Error::LeadingDimension {
            arg: "ldc",
            value: ld,
            min: cols.max(1),
        });
    }
    let needed = span(rows, cols, ld, 1)
        .and_then(|one| {
            if one == 0 {
                Some(0)
            } else {
                (batch - 1).checked_mul(stride)?.checked_add(one)
            }
        })
        .ok_or_else(|| Error::Stride {
            arg: "c",
            reason: "size overflows usize".into(),
        })?;
    if data.len() < needed {
        return Err(Error::SliceTooShort {
            arg: "c",
            len: data.len(),
            needed,
        });
    }
    Ok(MatMut {
        data,
        rows,
        cols,
        rs: ld,
        cs: 1,
    })
}
