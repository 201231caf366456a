//! A transposing copy for packers: `dst[t * ld + l] = src[l][t * stride]`, i.e. the rows of a
//! packed micro-panel written whole from lanes that run along the panel's k direction (conv-ops'
//! transposed im2col B and channel-major A sources). Crates above core-blas may not use
//! intrinsics; this is the vectorised building block for them.

use crate::isa::Family;
use crate::{Error, Gemm};

impl Gemm {
    /// `dst[t * ld + l] = src[l][t * stride]` for every lane `l < src.len()` and `t < len`: the
    /// `len × src.len()` transpose of `src.len()` lanes, written as `len` rows `ld` apart (only
    /// the first `src.len()` values of each destination row are written).
    ///
    /// With `stride == 1` and AVX2 available, lanes are transposed in 8 × 8 register blocks
    /// (groups of 8 lanes, the last group masked, so 6 (MR) and 16 (NR) lanes are both fast);
    /// other strides and the `len % 8` tail are scalar.
    ///
    /// Errors name the argument: `stride` = 0 with `len > 1`, `ld < src.len()` with `len > 1`
    /// (rows would overlap), a lane shorter than `(len − 1) · stride + 1`, `dst` shorter than
    /// `(len − 1) · ld + src.len()`.
    pub fn transpose_lanes(
        &self,
        dst: &mut [f32],
        ld: usize,
        src: &[&[f32]],
        len: usize,
        stride: usize,
    ) -> Result<(), Error> {
        let nl = src.len();
        if len == 0 || nl == 0 {
            return Ok(());
        }
        if len > 1 && stride == 0 {
            return Err(Error::Stride {
                arg: "stride",
                reason: "must be positive when len > 1".into(),
            });
        }
        if len > 1 && ld < nl {
            return Err(Error::LeadingDimension {
                arg: "ld",
                value: ld,
                min: nl,
            });
        }
        let overflow = |arg| Error::Stride {
            arg,
            reason: "size overflows usize".into(),
        };
        let lane_need = (len - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(1))
            .ok_or_else(|| overflow("stride"))?;
        if let Some(lane) = src.iter().find(|l| l.len() < lane_need) {
            return Err(Error::SliceTooShort {
                arg: "src",
                len: lane.len(),
                needed: lane_need,
            });
        }
        let dst_need = (len - 1)
            .checked_mul(ld)
            .and_then(|x| x.checked_add(nl))
            .ok_or_else(|| overflow("ld"))?;
        if dst.len() < dst_need {
            return Err(Error::SliceTooShort {
                arg: "dst",
                len: dst.len(),
                needed: dst_need,
            });
        }
        match self.family {
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(_) | Family::Avx512(_) if stride == 1 => {
                // SAFETY: avx2+fma (an Avx2/Avx512 kernel is held); lanes, `ld` and `dst` checked
                // above (every lane has `len` values, `dst` has `dst_need`).
                unsafe { transpose_avx2(dst, ld, src, len) };
            }
            _ => {
                for t in 0..len {
                    for (l, lane) in src.iter().enumerate() {
                        dst[t * ld + l] = lane[t * stride];
                    }
                }
            }
        }
        Ok(())
    }
}

impl Gemm {
    /// `dst[i · ld + q] = src[q · m + i]` for every `i < m`, `q < n`: `n` groups of `m`
    /// consecutive values (an interleaved line, e.g. `m` phases of a strided gather) written as
    /// `m` rows ("phases") of `n` values, `ld` apart; other values of `dst` are untouched.
    /// `m = 1` is a copy.
    ///
    /// With AVX2 available and `n >= 8`, blocks of 8 groups × 8 phases go through one 8 × 8
    /// register transpose (8 loads, 24 shuffles, one whole store per row; the `n % 8` tail as a
    /// block overlapping the previous one); the portable family and `n < 8` copy value by value.
    /// The values are copied exactly (bit for bit, NaN included).
    ///
    /// Errors: [`Error::ShapeMismatch`] on `m` (0); [`Error::LeadingDimension`] on `ld` (below
    /// `n` when `m > 1`: rows would overlap); [`Error::SliceTooShort`] on `src` (fewer than
    /// `n · m` values) or `dst` (fewer than `(m − 1) · ld + n`).
    pub fn deinterleave(
        &self,
        dst: &mut [f32],
        ld: usize,
        src: &[f32],
        m: usize,
        n: usize,
    ) -> Result<(), Error> {
        if m == 0 {
            return Err(Error::ShapeMismatch {
                arg: "m",
                expected: "at least 1 phase".into(),
                got: "0".into(),
            });
        }
        if n == 0 {
            return Ok(());
        }
        if m > 1 && ld < n {
            return Err(Error::LeadingDimension {
                arg: "ld",
                value: ld,
                min: n,
            });
        }
        let src_need = n.saturating_mul(m);
        if src.len() < src_need {
            return Err(Error::SliceTooShort {
                arg: "src",
                len: src.len(),
                needed: src_need,
            });
        }
        let dst_need = (m - 1)
            .checked_mul(ld)
            .and_then(|x| x.checked_add(n))
            .unwrap_or(usize::MAX);
        if dst.len() < dst_need {
            return Err(Error::SliceTooShort {
                arg: "dst",
                len: dst.len(),
                needed: dst_need,
            });
        }
        if m == 1 {
            dst[..n].copy_from_slice(&src[..n]);
            return Ok(());
        }
        match self.family {
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(_) | Family::Avx512(_) if n >= 8 => {
                // SAFETY: avx2+fma (an Avx2/Avx512 kernel is held); m >= 2, n >= 8; src holds
                // n·m values and dst (m − 1)·ld + n with ld >= n (checked above); `dst` is a
                // `&mut` distinct from the shared `src`.
                unsafe {
                    crate::kernel::x86::deinterleave_avx2(
                        dst.as_mut_ptr(),
                        ld,
                        src.as_ptr(),
                        src.len(),
                        m,
                        n,
                    )
                };
            }
            _ => {
                for (q, group) in src[..n * m].chunks_exact(m).enumerate() {
                    for (i, &v) in group.iter().enumerate() {
                        dst[i * ld + q] = v;
                    }
                }
            }
        }
        Ok(())
    }
}

/// [`Gemm::deinterleave`] with the process-wide kernel family.
pub fn deinterleave(
    dst: &mut [f32],
    ld: usize,
    src: &[f32],
    m: usize,
    n: usize,
) -> Result<(), Error> {
    Gemm::global()?.deinterleave(dst, ld, src, m, n)
}

/// [`Gemm::transpose_lanes`] with the process-wide kernel family.
pub fn transpose_lanes(
    dst: &mut [f32],
    ld: usize,
    src: &[&[f32]],
    len: usize,
    stride: usize,
) -> Result<(), Error> {
    Gemm::global()?.transpose_lanes(dst, ld, src, len, stride)
}

/// The AVX2 body of [`Gemm::transpose_lanes`] (stride 1): lanes in groups of 8, each through
/// 8 × 8 register transposes; the partial group first, with whole-row stores where they stay
/// inside the `(len − 1) · ld + lanes` values of `dst` and `ld == lanes`.
///
/// # Safety
/// The CPU has AVX2 and FMA; `1 <= src.len()`, `len >= 1`, every lane holds `len` values,
/// `ld >= src.len()` (or `len == 1`), `dst.len() >= (len − 1) · ld + src.len()`, and `dst`
/// overlaps no lane.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn transpose_avx2(dst: &mut [f32], ld: usize, src: &[&[f32]], len: usize) {
    let nl = src.len();
    let dst_need = (len - 1) * ld + nl;
    debug_assert!(dst.len() >= dst_need && src.iter().all(|l| l.len() >= len));
    let dp = dst.as_mut_ptr();
    // With rows packed back to back (ld = lanes), a partial group's rows may be stored
    // whole (8 values) when that stays inside `dst`: the excess lands in the next
    // rows, which later stores rewrite; the partial (last) group goes first so the
    // full groups rewrite what it spilled into their columns.
    let groups = nl.div_ceil(8);
    let last = groups - 1;
    let order = std::iter::once(last).chain(0..last);
    for g in order {
        let group = &src[8 * g..(8 * g + 8).min(nl)];
        #[cfg(test)]
        let spill = !NO_SPILL.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(test))]
        let spill = true;
        let spill_rows = if spill && ld == nl && group.len() < 8 {
            // Rows whose whole 8-value store ends inside `dst`.
            let end = dst_need;
            if end >= 8 * g + 8 {
                ((end - 8 * g - 8) / ld + 1).min(len)
            } else {
                0
            }
        } else {
            0
        };
        let mut lanes = [std::ptr::null::<f32>(); 8];
        for (p, lane) in lanes.iter_mut().zip(group) {
            *p = lane.as_ptr();
        }
        // SAFETY: avx2+fma per the caller; each lane of the group has `len` values;
        // destination row t of this group is `dst[t * ld + 8g ..][.. group.len()]`, inside
        // `dst_need`, and `dst` is a `&mut` distinct from the shared lanes. Whole-row
        // stores (t < spill_rows) end inside `dst_need` and, with ld = nl, write
        // only into later rows, which later stores of this call (increasing t) or
        // of the full groups (run after this partial one) rewrite.
        unsafe {
            crate::kernel::x86::transpose8_avx2(
                dp.add(8 * g),
                ld,
                &lanes,
                group.len(),
                len,
                spill_rows,
            )
        };
    }
}

/// The tuning probe's switch to masked stores only (test builds only).
#[cfg(test)]
pub(crate) static NO_SPILL: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
