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
                let dp = dst.as_mut_ptr();
                for (g, group) in src.chunks(8).enumerate() {
                    let mut lanes = [std::ptr::null::<f32>(); 8];
                    for (p, lane) in lanes.iter_mut().zip(group) {
                        *p = lane.as_ptr();
                    }
                    // SAFETY: holding an Avx2/Avx512 kernel proves avx2+fma; each lane of the
                    // group has `len` values (checked: lane_need = len); destination row t of
                    // this group is `dst[t * ld + 8g ..][.. group.len()]`, inside `dst` (checked
                    // above), and `dst` is a `&mut` distinct from the shared lanes.
                    unsafe {
                        crate::kernel::x86::transpose8_avx2(
                            dp.add(8 * g),
                            ld,
                            &lanes,
                            group.len(),
                            len,
                        )
                    };
                }
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
