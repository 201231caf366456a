//! A gather of many short pieces into a packed block: `dst[row · ld + col + t] = src[at + t ·
//! stride]`, the building block of packers that read a strided source (conv-ops' im2col of
//! stride-2 convolutions: every micro-panel row is a few values of one input line, every other
//! one). Crates above core-blas may not use intrinsics; this is the vectorised version for them.

use crate::isa::Family;
use crate::{Error, Gemm};

/// One piece of [`Gemm::gather_pieces`]: `len` values of the source from index `at`, `stride`
/// apart, written to row `row`, columns `col .. col + len` of the destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Piece {
    /// Destination row.
    pub row: u32,
    /// First destination column.
    pub col: u32,
    /// Source index of the first value.
    pub at: usize,
    /// Number of values.
    pub len: u32,
}

impl Gemm {
    /// For each piece: `dst[row · ld + col + t] = src[at + t · stride]` for `t < len`; every
    /// other value of `dst` is left untouched (the caller zero-fills what needs it).
    ///
    /// `stride` 2 (a deinterleave) on AVX2: 8 values per two 8-wide loads, a shuffle and a
    /// permute, the last 8 of a piece overlapping the previous ones; pieces shorter than 8,
    /// other strides and the last values of `src` are copied one by one. Stride 1 is a plain copy.
    ///
    /// Errors, checked for every piece before anything is written: `stride` = 0 with a piece
    /// longer than 1 ([`Error::Stride`]), a piece wider than its row (`col + len > ld`,
    /// [`Error::LeadingDimension`] on `ld`), a piece past the end of `dst` or of `src`
    /// ([`Error::SliceTooShort`] on `dst` / `src`).
    pub fn gather_pieces(
        &self,
        dst: &mut [f32],
        ld: usize,
        src: &[f32],
        pieces: &[Piece],
        stride: usize,
    ) -> Result<(), Error> {
        for p in pieces {
            let (row, col, len) = (p.row as usize, p.col as usize, p.len as usize);
            if len == 0 {
                continue;
            }
            if len > 1 && stride == 0 {
                return Err(Error::Stride {
                    arg: "stride",
                    reason: "must be positive when a piece has more than one value".into(),
                });
            }
            if col + len > ld {
                return Err(Error::LeadingDimension {
                    arg: "ld",
                    value: ld,
                    min: col + len,
                });
            }
            let overflow = |arg| Error::Stride {
                arg,
                reason: "a piece's index overflows usize".into(),
            };
            let dst_need = row
                .checked_mul(ld)
                .and_then(|x| x.checked_add(col + len))
                .ok_or_else(|| overflow("ld"))?;
            if dst_need > dst.len() {
                return Err(Error::SliceTooShort {
                    arg: "dst",
                    len: dst.len(),
                    needed: dst_need,
                });
            }
            let src_need = (len - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(p.at))
                .and_then(|x| x.checked_add(1))
                .ok_or_else(|| overflow("stride"))?;
            if src_need > src.len() {
                return Err(Error::SliceTooShort {
                    arg: "src",
                    len: src.len(),
                    needed: src_need,
                });
            }
        }
        match self.family {
            #[cfg(target_arch = "x86_64")]
            Family::Avx2(_) | Family::Avx512(_) if stride == 2 => {
                // SAFETY: avx2+fma (an Avx2/Avx512 kernel is held); every piece was checked
                // above to lie inside `dst` (its row, within `ld`) and `src`.
                unsafe { crate::kernel::x86::gather2_avx2(dst, ld, src, pieces) };
            }
            _ => {
                for p in pieces {
                    let (row, col, len) = (p.row as usize, p.col as usize, p.len as usize);
                    let out = &mut dst[row * ld + col..][..len];
                    if stride == 1 {
                        out.copy_from_slice(&src[p.at..][..len]);
                    } else {
                        for (t, o) in out.iter_mut().enumerate() {
                            *o = src[p.at + t * stride];
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// [`Gemm::gather_pieces`] with the process-wide kernel family.
pub fn gather_pieces(
    dst: &mut [f32],
    ld: usize,
    src: &[f32],
    pieces: &[Piece],
    stride: usize,
) -> Result<(), Error> {
    Gemm::global()?.gather_pieces(dst, ld, src, pieces, stride)
}
