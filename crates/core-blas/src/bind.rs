//! Binding a rayon pool's workers to CPUs (OpenBLAS binds its threads to cores; MKL's
//! `KMP_AFFINITY`, OpenMP's `OMP_PROC_BIND`): opt-in, for a process that has its CPUs to itself.
//!
//! Why: on the project's 2-vCPU guest a worker woken from sleep for a parallel product is often
//! queued on the vCPU of the worker that woke it while the other vCPU idles, and starts 1-5 ms
//! late, until a scheduler tick moves it (session 36, `wake_probe` on s36-blas-migrate: in every
//! 2-thread product whose second part started more than 2 ms late both parts had started on the
//! same CPU). A worker bound to its own CPU is woken there.

use rayon::ThreadPoolBuilder;

use crate::Error;

/// The CPUs the calling thread may run on (its affinity mask), in increasing order.
pub fn allowed_cpus() -> Result<Vec<usize>, Error> {
    match core_affinity::get_core_ids() {
        Some(ids) if !ids.is_empty() => Ok(ids.into_iter().map(|c| c.id).collect()),
        _ => Err(Error::Affinity {
            reason: "the calling thread's CPU affinity mask cannot be read on this platform",
        }),
    }
}

/// `builder` with a start handler that binds worker `i` of the pool to the `i`-th CPU (modulo their
/// number) of the calling thread's affinity mask ([`allowed_cpus`], read now), so that each worker
/// is always woken on its own CPU.
///
/// Use it for a pool that owns the process's CPUs: one worker per allowed CPU, nothing else
/// computing beside it. Do not use it when several processes or pools share the CPUs (two bound
/// pools would put their worker 0s on the same CPU), or when the pool has more workers than CPUs
/// (workers `i` and `i + n` share a CPU). Binding is best effort: a worker whose affinity cannot be
/// set runs unbound. The handler replaces any start handler set on `builder` before; one set after
/// replaces it. The calling thread itself is not bound.
///
/// ```
/// let pool = core_blas::bind_workers(rayon::ThreadPoolBuilder::new().num_threads(2))?.build()
///     .expect("pool");
/// # Ok::<(), core_blas::Error>(())
/// ```
pub fn bind_workers<S>(builder: ThreadPoolBuilder<S>) -> Result<ThreadPoolBuilder<S>, Error> {
    let cpus = allowed_cpus()?;
    Ok(builder.start_handler(move |i| {
        // Best effort (documented): an unbound worker is still correct.
        let _ = core_affinity::set_for_current(core_affinity::CoreId {
            id: cpus[i % cpus.len()],
        });
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_bound_to_successive_allowed_cpus() {
        let cpus = allowed_cpus().expect("affinity readable on the test hosts");
        let threads = cpus.len() + 1;
        let pool = bind_workers(ThreadPoolBuilder::new().num_threads(threads))
            .expect("bind")
            .build()
            .expect("pool");
        let masks = pool.broadcast(|ctx| (ctx.index(), allowed_cpus().expect("mask")));
        for (i, mask) in masks {
            assert_eq!(mask, vec![cpus[i % cpus.len()]], "worker {i}");
        }
        // The calling thread keeps its mask.
        assert_eq!(allowed_cpus().expect("mask"), cpus);
    }

    #[test]
    fn products_on_a_bound_pool_match_the_reference() {
        let pool = bind_workers(ThreadPoolBuilder::new().num_threads(2))
            .expect("bind")
            .build()
            .expect("pool");
        // Large enough to run on both workers (PAR_MIN_MNK), odd sizes for the edges.
        for &(m, n, k) in &[(67, 301, 129), (130, 257, 95)] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 7) % 13) as f32 * 0.25 - 1.5)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5) % 11) as f32 * 0.25 - 1.25)
                .collect();
            let mut c = vec![f32::NAN; m * n];
            pool.install(|| {
                crate::sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)
                    .expect("sgemm")
            });
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                        .sum();
                    // Products of quarter-steps summed in f32: exact below 2^24.
                    assert_eq!(f64::from(c[i * n + j]), want, "c[{i}][{j}] of {m}x{n}x{k}");
                }
            }
        }
    }
}
