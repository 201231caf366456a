//! Batched products of small operands that the caller already holds in the micro-kernel's panel
//! layout: no packing, no driver loops, no threads — just the micro-kernel over the tiles of each
//! product. For operands that live in L1/L2 (fastconv's batch-1 Winograd: 81 products of
//! 32 × 32 · 32 × 80), where the general driver's per-product set-up and copies dominate.
//!
//! Layout (the same as the driver's packed blocks, [`crate::pack`], over the whole `k`):
//! - A (`m × k`): `ceil(m / MR)` panels of `k · MR` values, panel `q` at `q · k · MR`; column `t`
//!   of a panel holds `MR` consecutive values `A[q·MR + 0..MR, t]`.
//! - B (`k × n`): `ceil(n / NR)` panels of `k · NR` values, panel `q` at `q · k · NR`; row `t` of a
//!   panel holds `NR` consecutive values `B[t, q·NR + 0..NR]`.
//!
//! [`Gemm::packed_a_index`] / [`Gemm::packed_b_index`] give the position of an element and
//! [`Gemm::packed_a_len`] / [`Gemm::packed_b_len`] the length of one packed operand, for the
//! active family's `MR × NR` ([`Gemm::tile`]).

use crate::isa::Family;
use crate::kernel::Kernel;
use crate::{Error, Gemm};

/// Which operand of [`Gemm::gemm_packed_batched`] [`Gemm::pack_rows`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackedOperand {
    /// A (`m × k`): the rows are A's rows; panels `MR` wide.
    A,
    /// B (`k × n`): the rows are B's columns (rows of Bᵀ); panels `NR` wide.
    B,
}

impl Gemm {
    /// Write `p` rows of `k` values (row `i` = `rows[i · ld ..][.. k]`) into the panel layout of
    /// one operand of [`Gemm::gemm_packed_batched`] (module [`crate::packed`]): as A, row `i` is
    /// A's row `i` (`dst[packed_a_index(k, i, t)] = row_i[t]`, `m = p`); as B, row `i` is B's
    /// column `i` (`dst[packed_b_index(k, t, i)] = row_i[t]`, `n = p`, i.e. the rows of Bᵀ).
    /// This is a transpose (each row becomes a lane of its panel), done in 8 × 8 register blocks
    /// on AVX2 (as [`Gemm::transpose_lanes`]); the lanes past `p` of the last panel are zeroed.
    ///
    /// Errors: [`Error::LeadingDimension`] on `ld` (`< k` with `p > 1`), [`Error::SliceTooShort`]
    /// on `rows` (`< (p − 1) · ld + k`) or `dst` (`<` [`Gemm::packed_a_len`]`(p, k)` or
    /// [`Gemm::packed_b_len`]`(k, p)`).
    pub fn pack_rows(
        &self,
        operand: PackedOperand,
        p: usize,
        k: usize,
        rows: &[f32],
        ld: usize,
        dst: &mut [f32],
    ) -> Result<(), Error> {
        let (mr, nr) = self.tile();
        let w = match operand {
            PackedOperand::A => mr,
            PackedOperand::B => nr,
        };
        if p == 0 || k == 0 {
            return Ok(());
        }
        if p > 1 && ld < k {
            return Err(Error::LeadingDimension {
                arg: "ld",
                value: ld,
                min: k,
            });
        }
        let overflow = || Error::Stride {
            arg: "ld",
            reason: "size overflows usize".into(),
        };
        let rows_need = (p - 1)
            .checked_mul(ld)
            .and_then(|x| x.checked_add(k))
            .ok_or_else(overflow)?;
        if rows.len() < rows_need {
            return Err(Error::SliceTooShort {
                arg: "rows",
                len: rows.len(),
                needed: rows_need,
            });
        }
        let panels = p.div_ceil(w);
        let dst_need = panels
            .checked_mul(w)
            .and_then(|x| x.checked_mul(k))
            .ok_or_else(overflow)?;
        if dst.len() < dst_need {
            return Err(Error::SliceTooShort {
                arg: "dst",
                len: dst.len(),
                needed: dst_need,
            });
        }
        const MAX_W: usize = 64;
        debug_assert!(w <= MAX_W);
        let mut lanes: [&[f32]; MAX_W] = [&[]; MAX_W];
        for q in 0..panels {
            let nl = w.min(p - q * w);
            for (l, lane) in lanes.iter_mut().enumerate().take(w) {
                // A partial last panel repeats its first row in the missing lanes, so that the
                // panel is transposed whole (full-width row stores); those lanes are zeroed below.
                let i = q * w + if l < nl { l } else { 0 };
                *lane = &rows[i * ld..][..k];
            }
            let panel = &mut dst[q * w * k..][..w * k];
            self.transpose_lanes(panel, w, &lanes[..w], k, 1)?;
            if nl < w {
                for row in panel.chunks_exact_mut(w) {
                    row[nl..].fill(0.0);
                }
            }
        }
        Ok(())
    }

    /// Length of one `m × k` A in `MR`-tall panels: `ceil(m / MR) · MR · k` (see [`crate::packed`]).
    pub fn packed_a_len(&self, m: usize, k: usize) -> usize {
        let (mr, _) = self.tile();
        m.div_ceil(mr) * mr * k
    }

    /// Length of one `k × n` B in `NR`-wide panels: `ceil(n / NR) · NR · k`.
    pub fn packed_b_len(&self, k: usize, n: usize) -> usize {
        let (_, nr) = self.tile();
        n.div_ceil(nr) * nr * k
    }

    /// Position of `A[i, t]` in an `m × k` A packed in `MR`-tall panels (any `m > i`):
    /// `(i / MR) · k · MR + t · MR + i % MR`.
    pub fn packed_a_index(&self, k: usize, i: usize, t: usize) -> usize {
        let (mr, _) = self.tile();
        (i / mr) * k * mr + t * mr + i % mr
    }

    /// Position of `B[t, j]` in a `k × n` B packed in `NR`-wide panels (any `n > j`):
    /// `(j / NR) · k · NR + t · NR + j % NR`.
    pub fn packed_b_index(&self, k: usize, t: usize, j: usize) -> usize {
        let (_, nr) = self.tile();
        (j / nr) * k * nr + t * nr + j % nr
    }

    /// `count` independent products `C_p (m × n) := A_p (m × k) · B_p (k × n) + beta · C_p` of operands
    /// already in panel layout (module doc of [`crate::packed`]), on the calling thread: no
    /// packing, no blocking, no threads, no allocation. `A_p` starts at `a[p · stride_a ..]`,
    /// `B_p` at `b[p · stride_b ..]` (each [`Gemm::packed_a_len`] / [`Gemm::packed_b_len`]
    /// long; strides may be 0 to share an operand), `C_p` is row-major at `c[p · stride_c ..]`
    /// with leading dimension `ldc`.
    ///
    /// `beta == 0` overwrites C without reading it (NaN in C is harmless); any other beta
    /// combines (`beta = 1`: accumulate). The padding of the last panels (rows `>= m` of A,
    /// columns `>= n` of B) must be present but its values never reach C (NaN is harmless).
    /// `k = 0` only scales C by beta (zeros for beta = 0). Meant for operands resident in L1/L2 (`k` up to a few hundred);
    /// large products belong to [`Gemm::sgemm_batched`], whose blocking keeps them in cache.
    ///
    /// Errors name the argument: `ldc < n`, `a`, `b` or `c` too short for the batch, `stride_c`
    /// smaller than one C (outputs would overlap), sizes overflowing `usize`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_packed_batched(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        stride_a: usize,
        b: &[f32],
        stride_b: usize,
        beta: f32,
        c: &mut [f32],
        ldc: usize,
        stride_c: usize,
        count: usize,
    ) -> Result<(), Error> {
        if ldc < n.max(1) {
            return Err(Error::LeadingDimension {
                arg: "ldc",
                value: ldc,
                min: n.max(1),
            });
        }
        if count == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        let overflow = |arg| Error::Stride {
            arg,
            reason: "size overflows usize".into(),
        };
        let (mr, nr) = self.tile();
        let a_one = m
            .div_ceil(mr)
            .checked_mul(mr)
            .and_then(|x| x.checked_mul(k))
            .ok_or_else(|| overflow("a"))?;
        let b_one = n
            .div_ceil(nr)
            .checked_mul(nr)
            .and_then(|x| x.checked_mul(k))
            .ok_or_else(|| overflow("b"))?;
        let c_one = (m - 1)
            .checked_mul(ldc)
            .and_then(|x| x.checked_add(n))
            .ok_or_else(|| overflow("c"))?;
        if count > 1 && stride_c < c_one {
            return Err(Error::Stride {
                arg: "stride_c",
                reason: format!(
                    "{stride_c} is less than the {c_one} elements of one C: outputs overlap"
                ),
            });
        }
        for (arg, len, one, stride) in [
            ("a", a.len(), a_one, stride_a),
            ("b", b.len(), b_one, stride_b),
            ("c", c.len(), c_one, stride_c),
        ] {
            let needed = if one == 0 {
                0
            } else {
                (count - 1)
                    .checked_mul(stride)
                    .and_then(|x| x.checked_add(one))
                    .ok_or_else(|| overflow(arg))?
            };
            if len < needed {
                return Err(Error::SliceTooShort { arg, len, needed });
            }
        }
        if k == 0 {
            // An empty inner dimension: C := beta · C (no operand is read; `a`/`b` may be empty).
            for q in 0..count {
                for i in 0..m {
                    for x in &mut c[q * stride_c + i * ldc..][..n] {
                        *x = if beta == 0.0 { 0.0 } else { beta * *x };
                    }
                }
            }
            return Ok(());
        }
        let args = Args {
            m,
            n,
            k,
            a: a.as_ptr(),
            stride_a,
            b: b.as_ptr(),
            stride_b,
            beta,
            c: c.as_mut_ptr(),
            ldc,
            stride_c,
            count,
        };
        // SAFETY: lengths checked above: every product's A and B panels (`a_one` / `b_one`
        // values from `p · stride`) and C window (`c_one` values from `p · stride_c`, the
        // windows disjoint) lie inside the slices, which `c`'s `&mut` borrow keeps exclusive.
        unsafe {
            match self.family {
                Family::Scalar(kern) => run(kern, &args),
                #[cfg(target_arch = "x86_64")]
                Family::Avx2(kern) => run(kern, &args),
                #[cfg(target_arch = "x86_64")]
                Family::Avx512(kern) => run(kern, &args),
            }
        }
        Ok(())
    }
}

impl Gemm {
    /// [`Gemm::gemm_packed_batched`] with each `A_p` **row-major, read in place** instead of
    /// packed: `A_p[i, t] = a[p · stride_a + i · lda + t]` (`m × k`, rows `lda >= k` apart).
    /// `B_p` in `NR`-wide panels at `b[p · stride_b ..]` ([`Gemm::packed_b_len`] values), `C_p`
    /// row-major at `c[p · stride_c ..]` with leading dimension `ldc`; `beta == 0` never reads C.
    /// On the calling thread, no packing, no allocation: each micro-tile broadcasts its `MR` A
    /// values per step from the `MR` rows (as many loads as from a packed panel).
    ///
    /// For operands resident in L1/L2 with `k` up to a few hundred (fastconv's channels-last
    /// products `V_ξᵀ · U_ξ`: m = tiles, n = K, k = C). Rows of A on 64-byte lines
    /// ([`crate::AlignedVec`], `lda` a multiple of 16) avoid split loads.
    ///
    /// Errors name the argument: `lda < k` (with `m > 1`), `ldc < n`, `a`, `b` or `c` too short
    /// for the batch, `stride_c` smaller than one C (outputs would overlap), sizes overflowing
    /// `usize`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_rowa_batched(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: &[f32],
        lda: usize,
        stride_a: usize,
        b: &[f32],
        stride_b: usize,
        beta: f32,
        c: &mut [f32],
        ldc: usize,
        stride_c: usize,
        count: usize,
    ) -> Result<(), Error> {
        if m > 1 && lda < k {
            return Err(Error::LeadingDimension {
                arg: "lda",
                value: lda,
                min: k,
            });
        }
        if ldc < n.max(1) {
            return Err(Error::LeadingDimension {
                arg: "ldc",
                value: ldc,
                min: n.max(1),
            });
        }
        if count == 0 || m == 0 || n == 0 {
            return Ok(());
        }
        let overflow = |arg| Error::Stride {
            arg,
            reason: "size overflows usize".into(),
        };
        let (_, nr) = self.tile();
        let a_one = if k == 0 {
            0
        } else {
            (m - 1)
                .checked_mul(lda)
                .and_then(|x| x.checked_add(k))
                .ok_or_else(|| overflow("a"))?
        };
        let b_one = n
            .div_ceil(nr)
            .checked_mul(nr)
            .and_then(|x| x.checked_mul(k))
            .ok_or_else(|| overflow("b"))?;
        let c_one = (m - 1)
            .checked_mul(ldc)
            .and_then(|x| x.checked_add(n))
            .ok_or_else(|| overflow("c"))?;
        if count > 1 && stride_c < c_one {
            return Err(Error::Stride {
                arg: "stride_c",
                reason: format!(
                    "{stride_c} is less than the {c_one} elements of one C: outputs overlap"
                ),
            });
        }
        for (arg, len, one, stride) in [
            ("a", a.len(), a_one, stride_a),
            ("b", b.len(), b_one, stride_b),
            ("c", c.len(), c_one, stride_c),
        ] {
            let needed = if one == 0 {
                0
            } else {
                (count - 1)
                    .checked_mul(stride)
                    .and_then(|x| x.checked_add(one))
                    .ok_or_else(|| overflow(arg))?
            };
            if len < needed {
                return Err(Error::SliceTooShort { arg, len, needed });
            }
        }
        if k == 0 {
            // An empty inner dimension: C := beta · C (no operand is read; `a`/`b` may be empty).
            for q in 0..count {
                for i in 0..m {
                    for x in &mut c[q * stride_c + i * ldc..][..n] {
                        *x = if beta == 0.0 { 0.0 } else { beta * *x };
                    }
                }
            }
            return Ok(());
        }
        let args = Args {
            m,
            n,
            k,
            a: a.as_ptr(),
            stride_a,
            b: b.as_ptr(),
            stride_b,
            beta,
            c: c.as_mut_ptr(),
            ldc,
            stride_c,
            count,
        };
        // SAFETY: lengths checked above: every product's A rows (`a_one` values from
        // `p · stride_a`, rows `lda` apart), B panels (`b_one` values from `p · stride_b`) and C
        // window (`c_one` values from `p · stride_c`, the windows disjoint) lie inside the
        // slices, which `c`'s `&mut` borrow keeps exclusive.
        unsafe {
            match self.family {
                Family::Scalar(kern) => run_rowa(kern, &args, lda),
                #[cfg(target_arch = "x86_64")]
                Family::Avx2(kern) => run_rowa(kern, &args, lda),
                #[cfg(target_arch = "x86_64")]
                Family::Avx512(kern) => run_rowa(kern, &args, lda),
            }
        }
        Ok(())
    }
}

/// [`Gemm::gemm_rowa_batched`] with the process-wide kernel family.
#[allow(clippy::too_many_arguments)]
pub fn gemm_rowa_batched(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    stride_a: usize,
    b: &[f32],
    stride_b: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    stride_c: usize,
    count: usize,
) -> Result<(), Error> {
    Gemm::global()?.gemm_rowa_batched(
        m, n, k, a, lda, stride_a, b, stride_b, beta, c, ldc, stride_c, count,
    )
}

/// The products of a row-major-A batch: per product, row tiles outermost (each tile's `MR` rows
/// of A read once from wherever they live, then reused from L1 for every B panel; measured
/// 03:04 UTC against B panels outermost: 36 × 96×32×64 1.05-1.10× faster relative to
/// `gemm_packed_batched` in the same run, 81 × 96×32×32 unchanged).
///
/// # Safety
/// `x.m, x.n, x.k, x.count >= 1`; for every `p < count`, rows `i < m` of `k` values at
/// `a + p · stride_a + i · lda`, `ceil(n / NR) · NR · k` values behind `b + p · stride_b`, and an
/// exclusive `m × n` row-major window (row stride `ldc >= n`) at `c + p · stride_c`, disjoint
/// across `p`.
unsafe fn run_rowa<K: Kernel>(kern: K, x: &Args, lda: usize) {
    let (mr, nr) = (K::MR, K::NR);
    let (m, n, k) = (x.m, x.n, x.k);
    for p in 0..x.count {
        // SAFETY: the caller's contract: rows `iq · MR ..` (`mm` of them) of A, panel `jq` of B
        // (`k · NR` values at `jq · k · NR`) and the `mm × nn` tile at row `iq · MR`, column
        // `jq · NR` of this product's C window are all in bounds.
        unsafe {
            let ap = x.a.add(p * x.stride_a);
            let bp = x.b.add(p * x.stride_b);
            let cp = x.c.add(p * x.stride_c);
            let mut i0 = 0;
            while i0 < m {
                let mm = mr.min(m - i0);
                let mut jq = 0;
                while jq * nr < n {
                    let nn = nr.min(n - jq * nr);
                    let bq = bp.add(jq * k * nr);
                    let cq = cp.add(i0 * x.ldc + jq * nr);
                    kern.run_rowa(k, ap.add(i0 * lda), lda, bq, x.beta, cq, x.ldc, mm, nn);
                    jq += 1;
                }
                i0 += mm;
            }
        }
    }
}

/// [`Gemm::gemm_packed_batched`] with the process-wide kernel family.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_batched(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    stride_a: usize,
    b: &[f32],
    stride_b: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    stride_c: usize,
    count: usize,
) -> Result<(), Error> {
    Gemm::global()?.gemm_packed_batched(
        m, n, k, a, stride_a, b, stride_b, beta, c, ldc, stride_c, count,
    )
}

/// The validated arguments of one batch, as raw pointers.
struct Args {
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    stride_a: usize,
    b: *const f32,
    stride_b: usize,
    beta: f32,
    c: *mut f32,
    ldc: usize,
    stride_c: usize,
    count: usize,
}

/// The products of a batch: per product, B panels outermost (one `k × NR` panel stays in L1 while
/// the A panels pass over it), one short-product kernel call per tile ([`Kernel::run_short`]:
/// 03:36 UTC, 81 × 32×37×32 61-62% → 72-73% of peak, 81 × 96×32×32 70-79% → 80-90%, ratios to
/// `gemm_rowa_batched` in the same runs 0.84-0.94 → 0.95-1.08; the row order made no
/// difference).
///
/// # Safety
/// `x.m, x.n, x.k, x.count >= 1`; for every `p < count`, `ceil(m / MR) · MR · k` values behind
/// `a + p · stride_a`, `ceil(n / NR) · NR · k` behind `b + p · stride_b`, and an exclusive
/// `m × n` row-major window (row stride `ldc >= n`) at `c + p · stride_c`, disjoint across `p`.
unsafe fn run<K: Kernel>(kern: K, x: &Args) {
    let (mr, nr) = (K::MR, K::NR);
    let (m, n, k) = (x.m, x.n, x.k);
    for p in 0..x.count {
        // SAFETY: the caller's contract: panel `iq` of A (`k · MR` values at `iq · k · MR`),
        // panel `jq` of B (`k · NR` values at `jq · k · NR`) and the `mm × nn` tile at row
        // `iq · MR`, column `jq · NR` of this product's C window are all in bounds; the
        // kernel reads only the first `mm` rows of an A panel's column and stores `mm × nn`.
        unsafe {
            let ap = x.a.add(p * x.stride_a);
            let bp = x.b.add(p * x.stride_b);
            let cp = x.c.add(p * x.stride_c);
            let mut jq = 0;
            while jq * nr < n {
                let nn = nr.min(n - jq * nr);
                let bq = bp.add(jq * k * nr);
                let mut iq = 0;
                while iq * mr < m {
                    let mm = mr.min(m - iq * mr);
                    let cq = cp.add(iq * mr * x.ldc + jq * nr);
                    kern.run_short(k, ap.add(iq * k * mr), bq, x.beta, cq, x.ldc, mm, nn);
                    iq += 1;
                }
                jq += 1;
            }
        }
    }
}

/// [`Gemm::pack_rows`] with the process-wide kernel family.
pub fn pack_rows(
    operand: PackedOperand,
    p: usize,
    k: usize,
    rows: &[f32],
    ld: usize,
    dst: &mut [f32],
) -> Result<(), Error> {
    Gemm::global()?.pack_rows(operand, p, k, rows, ld, dst)
}
