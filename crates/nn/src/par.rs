//! Element-wise loops over large tensors, split across rayon's threads (the layers' own loops:
//! ReLU, batch norm's normalisation, the residual sum). Each task hands a run of values to one
//! of `core_blas::vector`'s kernels. Below [`PAR_MIN`] values, or on one thread, they run on the
//! calling thread in one piece (or plane by plane).

use rayon::prelude::*;

use crate::error::Result;

/// Values per parallel task (128 KiB of f32); smaller tensors are not split. A multiple of 8,
/// so a task's values start on a byte of a one-bit-per-value mask.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// Whether a loop over `len` values is worth splitting.
fn split(len: usize) -> bool {
    len >= 2 * PAR_MIN && rayon::current_num_threads() > 1
}

/// `f(run)` over consecutive runs of `a` that together cover it once.
pub(crate) fn runs(a: &mut [f32], f: impl Fn(&mut [f32]) -> Result<()> + Sync) -> Result<()> {
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN).try_for_each(&f)
    } else {
        f(a)
    }
}

/// `f(run_a, run_b)` over matching runs of `a` and `b` (one length).
pub(crate) fn runs_ref(
    a: &mut [f32],
    b: &[f32],
    f: impl Fn(&mut [f32], &[f32]) -> Result<()> + Sync,
) -> Result<()> {
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN)
            .zip(b.par_chunks(PAR_MIN))
            .try_for_each(|(a, b)| f(a, b))
    } else {
        f(a, b)
    }
}

/// `f(run, bits)` over runs of `a` with the bytes of a one-bit-per-value mask `bits` that
/// cover them (bit `i % 8` of byte `i / 8` for value `i` of the run).
pub(crate) fn runs_bits_mut(
    a: &mut [f32],
    bits: &mut [u8],
    f: impl Fn(&mut [f32], &mut [u8]) -> Result<()> + Sync,
) -> Result<()> {
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN)
            .zip(bits.par_chunks_mut(PAR_MIN / 8))
            .try_for_each(|(a, b)| f(a, b))
    } else {
        f(a, bits)
    }
}

/// The same with the mask read only.
pub(crate) fn runs_bits(
    a: &mut [f32],
    bits: &[u8],
    f: impl Fn(&mut [f32], &[u8]) -> Result<()> + Sync,
) -> Result<()> {
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN)
            .zip(bits.par_chunks(PAR_MIN / 8))
            .try_for_each(|(a, b)| f(a, b))
    } else {
        f(a, bits)
    }
}

/// `f(run_a, run_b, bits)` over matching runs of `a` and `b` (one length) with the bytes of
/// a one-bit-per-value mask `bits` that cover them (as [`runs_bits_mut`]).
pub(crate) fn runs_ref_bits_mut(
    a: &mut [f32],
    b: &[f32],
    bits: &mut [u8],
    f: impl Fn(&mut [f32], &[f32], &mut [u8]) -> Result<()> + Sync,
) -> Result<()> {
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN)
            .zip(b.par_chunks(PAR_MIN))
            .zip(bits.par_chunks_mut(PAR_MIN / 8))
            .try_for_each(|((a, b), m)| f(a, b, m))
    } else {
        f(a, b, bits)
    }
}

/// `f(run_a, run_b, bits)` over matching runs of `a` and `b` (one length, both written) with
/// the mask bytes that cover them, read only.
pub(crate) fn runs_mut_bits(
    a: &mut [f32],
    b: &mut [f32],
    bits: &[u8],
    f: impl Fn(&mut [f32], &mut [f32], &[u8]) -> Result<()> + Sync,
) -> Result<()> {
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN)
            .zip(b.par_chunks_mut(PAR_MIN))
            .zip(bits.par_chunks(PAR_MIN / 8))
            .try_for_each(|((a, b), m)| f(a, b, m))
    } else {
        f(a, b, bits)
    }
}

/// `dst = src` (one length), in runs across threads.
pub(crate) fn copy(dst: &mut [f32], src: &[f32]) {
    if split(dst.len()) {
        dst.par_chunks_mut(PAR_MIN)
            .zip(src.par_chunks(PAR_MIN))
            .for_each(|(d, s)| d.copy_from_slice(s));
    } else {
        dst.copy_from_slice(src);
    }
}

/// Every value of `a` set to zero, in runs across threads.
pub(crate) fn zero(a: &mut [f32]) {
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN).for_each(|r| r.fill(0.0));
    } else {
        a.fill(0.0);
    }
}

/// `f(p, &mut a_p, &mut b_p)` for every plane `p` of `plane` values of `a` and `b` (one
/// length, a multiple of `plane`), planes in order on one thread or in groups across threads.
pub(crate) fn planes_mut(
    a: &mut [f32],
    b: &mut [f32],
    plane: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) -> Result<()> + Sync,
) -> Result<()> {
    if plane == 0 {
        return Ok(());
    }
    if split(a.len()) {
        a.par_chunks_mut(plane)
            .zip(b.par_chunks_mut(plane))
            .enumerate()
            .with_min_len(PAR_MIN.div_ceil(plane))
            .try_for_each(|(p, (a, b))| f(p, a, b))
    } else {
        a.chunks_mut(plane)
            .zip(b.chunks_mut(plane))
            .enumerate()
            .try_for_each(|(p, (a, b))| f(p, a, b))
    }
}

/// `f(p, &mut a_p, &b_p)` for every plane `p` of `plane` values of `a` and `b` (one length, a
/// multiple of `plane`).
pub(crate) fn planes_ref(
    a: &mut [f32],
    b: &[f32],
    plane: usize,
    f: impl Fn(usize, &mut [f32], &[f32]) -> Result<()> + Sync,
) -> Result<()> {
    if plane == 0 {
        return Ok(());
    }
    if split(a.len()) {
        a.par_chunks_mut(plane)
            .zip(b.par_chunks(plane))
            .enumerate()
            .with_min_len(PAR_MIN.div_ceil(plane))
            .try_for_each(|(p, (a, b))| f(p, a, b))
    } else {
        a.chunks_mut(plane)
            .zip(b.chunks(plane))
            .enumerate()
            .try_for_each(|(p, (a, b))| f(p, a, b))
    }
}

/// `f(p, &mut a_p)` for every plane `p` of `plane` values of `a` (a multiple of `plane` long).
pub(crate) fn planes(
    a: &mut [f32],
    plane: usize,
    f: impl Fn(usize, &mut [f32]) -> Result<()> + Sync,
) -> Result<()> {
    if plane == 0 {
        return Ok(());
    }
    if split(a.len()) {
        a.par_chunks_mut(plane)
            .enumerate()
            .with_min_len(PAR_MIN.div_ceil(plane))
            .try_for_each(|(p, a)| f(p, a))
    } else {
        a.chunks_mut(plane)
            .enumerate()
            .try_for_each(|(p, a)| f(p, a))
    }
}

/// `f(p, a_p)` for every plane `p` of `plane` values of `a` (a multiple of `plane` long), read
/// front to back in runs of whole planes across threads; the results in plane order, or the
/// first error.
pub(crate) fn map_planes<R: Send>(
    a: &[f32],
    plane: usize,
    f: impl Fn(usize, &[f32]) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    if plane == 0 {
        return Ok(Vec::new());
    }
    if split(a.len()) {
        a.par_chunks(plane)
            .enumerate()
            .with_min_len(PAR_MIN.div_ceil(plane))
            .map(|(p, a)| f(p, a))
            .collect()
    } else {
        a.chunks(plane).enumerate().map(|(p, a)| f(p, a)).collect()
    }
}

/// The same over matching planes of `a` and `b` (one length).
pub(crate) fn map_planes2<R: Send>(
    a: &[f32],
    b: &[f32],
    plane: usize,
    f: impl Fn(usize, &[f32], &[f32]) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    if plane == 0 {
        return Ok(Vec::new());
    }
    if split(a.len()) {
        a.par_chunks(plane)
            .zip(b.par_chunks(plane))
            .enumerate()
            .with_min_len(PAR_MIN.div_ceil(plane))
            .map(|(p, (a, b))| f(p, a, b))
            .collect()
    } else {
        a.chunks(plane)
            .zip(b.chunks(plane))
            .enumerate()
            .map(|(p, (a, b))| f(p, a, b))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NnError;

    /// The split and unsplit paths visit every value once, with its own partner, mask byte and
    /// plane, and pass errors on.
    #[test]
    fn every_value_once_split_or_not() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for threads in [1, 2] {
            let on = |f: &mut (dyn FnMut() -> Result<()> + Send)| {
                if threads == 2 { pool.install(f) } else { f() }
            };
            for len in [0, 5, 2 * PAR_MIN - 1, 3 * PAR_MIN + 17] {
                let mut a: Vec<f32> = (0..len).map(|i| i as f32).collect();
                on(&mut || {
                    runs(&mut a, |r| {
                        r.iter_mut().for_each(|x| *x *= 2.0);
                        Ok(())
                    })
                })
                .unwrap();
                assert!(a.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
                let c = vec![4.0f32; len];
                on(&mut || {
                    runs_ref(&mut a, &c, |x, y| {
                        assert_eq!(x.len(), y.len());
                        x.iter_mut().zip(y).for_each(|(x, y)| *x -= y);
                        Ok(())
                    })
                })
                .unwrap();
                assert!(
                    a.iter()
                        .enumerate()
                        .all(|(i, &v)| v == 2.0 * i as f32 - 4.0)
                );
                // Each run sees the mask bytes of its own values: byte j of a run covers values
                // 8j.. of it, so write there the whole tensor's byte index of value 8j.
                let mut bits = vec![0u8; len.div_ceil(8)];
                let mut idx: Vec<f32> = (0..len).map(|i| i as f32).collect();
                on(&mut || {
                    runs_bits_mut(&mut idx, &mut bits, |x, b| {
                        assert!(b.len() >= x.len().div_ceil(8));
                        for (j, b) in b.iter_mut().enumerate().take(x.len().div_ceil(8)) {
                            *b = ((x[8 * j] as usize / 8) % 251) as u8;
                        }
                        Ok(())
                    })
                })
                .unwrap();
                assert!(bits.iter().enumerate().all(|(j, &b)| b as usize == j % 251));
                on(&mut || {
                    runs_bits(&mut idx, &bits, |x, b| {
                        for (j, &b) in b.iter().enumerate().take(x.len().div_ceil(8)) {
                            assert_eq!(b as usize, (x[8 * j] as usize / 8) % 251);
                        }
                        Ok(())
                    })
                })
                .unwrap();
                // The three-operand runs see matching runs and their own mask bytes.
                let mut sum: Vec<f32> = (0..len).map(|i| i as f32).collect();
                let mut bits2 = vec![0u8; len.div_ceil(8)];
                on(&mut || {
                    runs_ref_bits_mut(&mut sum, &idx, &mut bits2, |x, y, b| {
                        assert_eq!(x.len(), y.len());
                        for (j, b) in b.iter_mut().enumerate().take(x.len().div_ceil(8)) {
                            *b = ((y[8 * j] as usize / 8) % 251) as u8;
                        }
                        x.iter_mut().zip(y).for_each(|(x, y)| *x += y);
                        Ok(())
                    })
                })
                .unwrap();
                assert_eq!(bits2, bits);
                assert!(sum.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
                let mut out = vec![0.0f32; len];
                on(&mut || {
                    runs_mut_bits(&mut sum, &mut out, &bits, |x, o, b| {
                        for (j, &b) in b.iter().enumerate().take(x.len().div_ceil(8)) {
                            assert_eq!(b as usize, (x[8 * j] as usize / 16) % 251);
                        }
                        o.copy_from_slice(x);
                        x.iter_mut().for_each(|v| *v = -*v);
                        Ok(())
                    })
                })
                .unwrap();
                assert!(out.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
                assert!(sum.iter().enumerate().all(|(i, &v)| v == -2.0 * i as f32));
                let mut copied = vec![1.0f32; len];
                on(&mut || {
                    copy(&mut copied, &out);
                    Ok(())
                })
                .unwrap();
                assert_eq!(copied, out);
                on(&mut || {
                    zero(&mut copied);
                    Ok(())
                })
                .unwrap();
                assert!(copied.iter().all(|&v| v == 0.0));
                let failed = on(&mut || {
                    runs(&mut a, |_| {
                        Err(NnError::NoForward {
                            layer: "test".into(),
                        })
                    })
                });
                assert!(failed.is_err());
                for plane in [1, 7, 64] {
                    let n = len / plane * plane;
                    let (mut p, mut q) = (vec![0.0f32; n], vec![0.0f32; n]);
                    on(&mut || {
                        planes_mut(&mut p, &mut q, plane, |k, x, y| {
                            x.fill(k as f32);
                            y.iter_mut().for_each(|v| *v += 1.0);
                            Ok(())
                        })
                    })
                    .unwrap();
                    assert!(p.iter().enumerate().all(|(i, &v)| v == (i / plane) as f32));
                    assert!(q.iter().all(|&v| v == 1.0));
                    on(&mut || {
                        planes_ref(&mut p, &q, plane, |k, x, y| {
                            x.iter_mut().zip(y).for_each(|(x, y)| *x += y + k as f32);
                            Ok(())
                        })
                    })
                    .unwrap();
                    assert!(
                        p.iter()
                            .enumerate()
                            .all(|(i, &v)| v == 2.0 * (i / plane) as f32 + 1.0)
                    );
                    on(&mut || {
                        planes(&mut q, plane, |k, x| {
                            x.iter_mut().for_each(|v| *v += k as f32);
                            Ok(())
                        })
                    })
                    .unwrap();
                    assert!(
                        q.iter()
                            .enumerate()
                            .all(|(i, &v)| v == 1.0 + (i / plane) as f32)
                    );
                    // Every plane once, with its own partner, results in plane order.
                    let got = on(&mut || {
                        let sums = map_planes(&q, plane, |k, x| Ok((k, x.iter().sum::<f32>())))?;
                        let pairs = map_planes2(&p, &q, plane, |k, x, y| {
                            Ok((k, x.len() == y.len() && x[0] == 2.0 * y[0] - 1.0))
                        })?;
                        assert_eq!(sums.len(), n / plane);
                        assert_eq!(pairs.len(), n / plane);
                        for (k, &(j, s)) in sums.iter().enumerate() {
                            assert_eq!((j, s), (k, plane as f32 * (1.0 + k as f32)));
                        }
                        assert!(pairs.iter().enumerate().all(|(k, &(j, ok))| j == k && ok));
                        Ok(())
                    });
                    got.unwrap();
                }
            }
        }
    }
}
