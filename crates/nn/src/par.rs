//! Element-wise loops over large tensors, split across rayon's threads (the layers' own loops:
//! ReLU, batch norm's normalisation, the residual sum). Below [`PAR_MIN`] values, or on one
//! thread, they run on the calling thread as plain loops.

use rayon::prelude::*;

/// Values per parallel task (128 KiB of f32); smaller tensors are not split.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// Whether a loop over `len` values is worth splitting.
fn split(len: usize) -> bool {
    len >= 2 * PAR_MIN && rayon::current_num_threads() > 1
}

/// `f(&mut a[i])` for every `i`.
pub(crate) fn map_mut(a: &mut [f32], f: impl Fn(&mut f32) + Sync) {
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN)
            .for_each(|a| a.iter_mut().for_each(&f));
    } else {
        a.iter_mut().for_each(f);
    }
}

/// `f(&mut a[i], &mut b[i])` for every `i` (the slices have one length).
pub(crate) fn zip_mut<T: Send>(a: &mut [f32], b: &mut [T], f: impl Fn(&mut f32, &mut T) + Sync) {
    let run = |a: &mut [f32], b: &mut [T]| a.iter_mut().zip(b).for_each(|(x, y)| f(x, y));
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN)
            .zip(b.par_chunks_mut(PAR_MIN))
            .for_each(|(a, b)| run(a, b));
    } else {
        run(a, b);
    }
}

/// `f(&mut a[i], &b[i])` for every `i` (the slices have one length).
pub(crate) fn zip_ref<T: Sync>(a: &mut [f32], b: &[T], f: impl Fn(&mut f32, &T) + Sync) {
    let run = |a: &mut [f32], b: &[T]| a.iter_mut().zip(b).for_each(|(x, y)| f(x, y));
    if split(a.len()) {
        a.par_chunks_mut(PAR_MIN)
            .zip(b.par_chunks(PAR_MIN))
            .for_each(|(a, b)| run(a, b));
    } else {
        run(a, b);
    }
}

/// `f(p, &mut a_p, &mut b_p)` for every plane `p` of `plane` values of `a` and `b` (one
/// length, a multiple of `plane`), planes in order on one thread or in groups across threads.
pub(crate) fn planes_mut(
    a: &mut [f32],
    b: &mut [f32],
    plane: usize,
    f: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
) {
    if plane == 0 {
        return;
    }
    if split(a.len()) {
        a.par_chunks_mut(plane)
            .zip(b.par_chunks_mut(plane))
            .enumerate()
            .with_min_len(PAR_MIN.div_ceil(plane))
            .for_each(|(p, (a, b))| f(p, a, b));
    } else {
        a.chunks_mut(plane)
            .zip(b.chunks_mut(plane))
            .enumerate()
            .for_each(|(p, (a, b))| f(p, a, b));
    }
}

/// `f(p, &mut a_p, &b_p)` for every plane `p` of `plane` values of `a` and `b` (one length, a
/// multiple of `plane`).
pub(crate) fn planes_ref(
    a: &mut [f32],
    b: &[f32],
    plane: usize,
    f: impl Fn(usize, &mut [f32], &[f32]) + Sync,
) {
    if plane == 0 {
        return;
    }
    if split(a.len()) {
        a.par_chunks_mut(plane)
            .zip(b.par_chunks(plane))
            .enumerate()
            .with_min_len(PAR_MIN.div_ceil(plane))
            .for_each(|(p, (a, b))| f(p, a, b));
    } else {
        a.chunks_mut(plane)
            .zip(b.chunks(plane))
            .enumerate()
            .for_each(|(p, (a, b))| f(p, a, b));
    }
}

/// `f(p, &mut a_p)` for every plane `p` of `plane` values of `a` (a multiple of `plane` long).
pub(crate) fn planes(a: &mut [f32], plane: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if plane == 0 {
        return;
    }
    if split(a.len()) {
        a.par_chunks_mut(plane)
            .enumerate()
            .with_min_len(PAR_MIN.div_ceil(plane))
            .for_each(|(p, a)| f(p, a));
    } else {
        a.chunks_mut(plane).enumerate().for_each(|(p, a)| f(p, a));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split and unsplit paths visit every value once, with its own partner and plane.
    #[test]
    fn every_value_once_split_or_not() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for threads in [1, 2] {
            let on = |f: &mut (dyn FnMut() + Send)| {
                if threads == 2 { pool.install(f) } else { f() }
            };
            for len in [0, 5, 2 * PAR_MIN - 1, 3 * PAR_MIN + 17] {
                let mut a: Vec<f32> = (0..len).map(|i| i as f32).collect();
                let mut b: Vec<f32> = vec![1.0; len];
                on(&mut || {
                    zip_mut(&mut a, &mut b, |x, y| {
                        *y += *x;
                        *x *= 2.0;
                    })
                });
                assert!(a.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
                assert!(b.iter().enumerate().all(|(i, &v)| v == 1.0 + i as f32));
                on(&mut || map_mut(&mut a, |x| *x += 1.0));
                assert!(
                    a.iter()
                        .enumerate()
                        .all(|(i, &v)| v == 2.0 * i as f32 + 1.0)
                );
                let c = vec![4.0f32; len];
                on(&mut || zip_ref(&mut a, &c, |x, y| *x -= y));
                assert!(
                    a.iter()
                        .enumerate()
                        .all(|(i, &v)| v == 2.0 * i as f32 - 3.0)
                );
                for plane in [1, 7, 64] {
                    let n = len / plane * plane;
                    let (mut p, mut q) = (vec![0.0f32; n], vec![0.0f32; n]);
                    on(&mut || {
                        planes_mut(&mut p, &mut q, plane, |k, x, y| {
                            x.fill(k as f32);
                            y.iter_mut().for_each(|v| *v += 1.0);
                        })
                    });
                    assert!(p.iter().enumerate().all(|(i, &v)| v == (i / plane) as f32));
                    assert!(q.iter().all(|&v| v == 1.0));
                    on(&mut || {
                        planes_ref(&mut p, &q, plane, |k, x, y| {
                            x.iter_mut().zip(y).for_each(|(x, y)| *x += y + k as f32)
                        })
                    });
                    assert!(
                        p.iter()
                            .enumerate()
                            .all(|(i, &v)| v == 2.0 * (i / plane) as f32 + 1.0)
                    );
                    on(&mut || {
                        planes(&mut q, plane, |k, x| {
                            x.iter_mut().for_each(|v| *v += k as f32)
                        })
                    });
                    assert!(
                        q.iter()
                            .enumerate()
                            .all(|(i, &v)| v == 1.0 + (i / plane) as f32)
                    );
                }
            }
        }
    }
}
