//! Measured FMA peak: how many f32 flop/s the running CPU sustains with nothing but independent
//! fused multiply-adds in registers, per kernel family, on 1 or n threads. Benchmarks quote GEMM
//! rates as a fraction of this figure measured in the same run.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::kernel::Simd;
use crate::kernel::portable::Lanes8;
#[cfg(target_arch = "x86_64")]
use crate::kernel::x86::{V256, V512};
use crate::{Error, Isa};

/// `iters` rounds of `N` independent FMA chains; returns a value that depends on all of them.
#[inline(always)]
unsafe fn chains<S: Simd, const N: usize>(iters: u64, x: f32, y: f32) -> f32 {
    // SAFETY: the caller is compiled with `S`'s target features; the only memory touched is the
    // local array `out`, `S::LANES` values per vector.
    unsafe {
        let (a, b) = (S::splat(x), S::splat(y));
        let mut acc = [S::splat(1.0); N];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = S::fma(*v, a, b);
            }
        }
        let mut out = [0.0f32; 16];
        let mut sum = 0.0;
        for v in acc {
            S::store(out.as_mut_ptr(), v);
            sum += out[0];
        }
        sum
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn chains_avx512(iters: u64, x: f32, y: f32) -> f32 {
    // SAFETY: compiled with avx512f. 16 chains cover latency 4 × 2 pipes with room to spare.
    unsafe { chains::<V512, 16>(iters, x, y) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn chains_avx2(iters: u64, x: f32, y: f32) -> f32 {
    // SAFETY: compiled with avx2+fma; 12 chains + 2 constants fit the 16 ymm registers.
    unsafe { chains::<V256, 12>(iters, x, y) }
}

/// Flops per iteration and the loop of a family.
type PeakLoop = (u64, fn(u64) -> f32);

fn loop_for(isa: Isa) -> Result<PeakLoop, Error> {
    if !isa.is_available() {
        return Err(Error::IsaUnavailable {
            requested: isa.name(),
            available: Isa::available()
                .iter()
                .map(|i| i.name())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: availability of avx512f checked above.
        Isa::Avx512 => (16 * 16 * 2, |n| unsafe {
            chains_avx512(n, black_box(0.999), black_box(1e-3))
        }),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: availability of avx2+fma checked above.
        Isa::Avx2 => (12 * 8 * 2, |n| unsafe {
            chains_avx2(n, black_box(0.999), black_box(1e-3))
        }),
        // SAFETY: `Lanes8` needs no target feature.
        _ => (8 * 8 * 2, |n| unsafe {
            chains::<Lanes8, 8>(n, black_box(0.999), black_box(1e-3))
        }),
    })
}

/// Measured peak in GFLOP/s of `threads` threads each running FMA chains of family `isa` for about
/// `duration` (best of several short trials). One thread runs on the calling thread; more are plain
/// OS threads that meet at a barrier and each time their own loop, so neither a thread's start nor
/// its join is inside a trial.
pub fn fma_peak_gflops(isa: Isa, threads: usize, duration: Duration) -> Result<f64, Error> {
    let (flops_per_iter, f) = loop_for(isa)?;
    let threads = threads.max(1);
    // Calibrate the iteration count of one ~5 ms trial on this thread.
    let mut iters = 1u64 << 12;
    loop {
        let t = Instant::now();
        black_box(f(iters));
        if t.elapsed() >= Duration::from_millis(5) || iters >= 1 << 40 {
            break;
        }
        iters *= 2;
    }
    let start = Instant::now();
    let mut best = 0.0f64;
    while best == 0.0 || start.elapsed() < duration {
        let secs = if threads == 1 {
            let t = Instant::now();
            black_box(f(iters));
            t.elapsed().as_secs_f64()
        } else {
            // From the first thread's start to the last one's end: threads that ran one after the
            // other on one CPU read as such.
            let barrier = std::sync::Barrier::new(threads);
            let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        s.spawn(|| {
                            barrier.wait();
                            let t = Instant::now();
                            black_box(f(iters));
                            (t, Instant::now())
                        })
                    })
                    .collect();
                handles.into_iter().filter_map(|h| h.join().ok()).collect()
            });
            match (
                spans.iter().map(|s| s.0).min(),
                spans.iter().map(|s| s.1).max(),
            ) {
                (Some(first), Some(last)) if spans.len() == threads => (last - first).as_secs_f64(),
                _ => f64::INFINITY,
            }
        };
        best = best.max((flops_per_iter * iters * threads as u64) as f64 / secs / 1e9);
    }
    Ok(best)
}

/// Measured rate in GFLOP/s of one family's micro-kernel alone on one thread: `MR × NR` tiles
/// with depth `kc` from packed micro-panels that stay in L1, C in a local tile (beta = 1). The
/// ceiling the five loops can approach; compare with [`fma_peak_gflops`] of the same run.
pub fn micro_kernel_gflops(isa: Isa, kc: usize, duration: Duration) -> Result<f64, Error> {
    use crate::isa::Family;
    let family = Family::require(isa)?;
    match family {
        Family::Scalar(k) => Ok(time_kernel(k, kc, duration)),
        #[cfg(target_arch = "x86_64")]
        Family::Avx2(k) => Ok(time_kernel(k, kc, duration)),
        #[cfg(target_arch = "x86_64")]
        Family::Avx512(k) => Ok(time_kernel(k, kc, duration)),
    }
}

fn time_kernel<K: crate::kernel::Kernel>(kern: K, kc: usize, duration: Duration) -> f64 {
    let kc = kc.max(1);
    // 64-byte aligned panels, as the driver's packing buffers (a 512-bit load from a 16-byte
    // aligned Vec splits cache lines: 75% of them on average, each costing two loads).
    let mut a = crate::AlignedVec::zeroed(K::MR * kc);
    let mut b = crate::AlignedVec::zeroed(K::NR * kc);
    for (i, x) in a.iter_mut().enumerate() {
        *x = (i % 7) as f32 * 1e-3;
    }
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i % 5) as f32 * 1e-3;
    }
    let mut c = crate::AlignedVec::zeroed(K::MR * K::NR);
    let calls = 256;
    let start = Instant::now();
    let mut best = 0.0f64;
    while best == 0.0 || start.elapsed() < duration {
        let t = Instant::now();
        for _ in 0..calls {
            // SAFETY: `a` holds kc·MR and `b` kc·NR values; `c` is an exclusive MR × NR tile
            // with row stride NR.
            unsafe {
                kern.run(
                    kc,
                    1.0,
                    a.as_ptr(),
                    b.as_ptr(),
                    1.0,
                    c.as_mut_ptr(),
                    K::NR,
                    1,
                    K::MR,
                    K::NR,
                )
            };
        }
        black_box(&mut c);
        let secs = t.elapsed().as_secs_f64();
        best = best.max((2 * K::MR * K::NR * kc * calls) as f64 / secs / 1e9);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peak_is_finite_and_positive_on_one_and_two_threads() {
        for threads in [1, 2] {
            let p = fma_peak_gflops(Isa::Scalar, threads, Duration::ZERO).unwrap();
            assert!(p.is_finite() && p > 0.0, "{threads} threads: {p}");
        }
    }
}
