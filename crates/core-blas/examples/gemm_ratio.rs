//! Paired GEMM-to-peak ratios for tuning on a VM whose clock drifts:
//! `cargo run --release -p core-blas --example gemm_ratio -- M N K [threads] [reps]`.
//!
//! Each repetition times one `sgemm` (1 thread: CPU time of the calling thread from
//! `CLOCK_THREAD_CPUTIME_ID`, so preemption by other processes does not count; more threads:
//! wall time) and right after it the FMA peak of the same family and thread count over ~40 ms. The
//! printed figure is the median over repetitions of `GEMM rate / peak of that moment`, which
//! follows clock changes between repetitions. `MATMUL_NUM_THREADS` decides matrixmultiply's
//! threads; it is measured the same way when `--mm` is given.
//!
//! `--scale` (with threads T > 1): each repetition times the product on one thread and right
//! after it on T threads (both wall time), and prints the median of the paired speed-ups
//! `t(1) / t(T)`, which minute-to-minute drift of the machine affects far less than two separate
//! runs do, and the median of the T-thread rate over the T-thread FMA peak measured right after
//! each pair (the alternative 2-thread goal, ≥ 90%). With `BACK=1` the T-thread product
//! runs once more right before each timed one, so the pool's workers are awake (back-to-back
//! products) instead of woken from sleep (their vCPU idle) as in the default pairs.
//!
//! `--aligned`: A, B and C are `AlignedVec`s (64-byte aligned; from 2 MiB on, huge-page storage
//! unless `CORE_BLAS_HUGEPAGES=0`) instead of `Vec`s. The last line printed is the process's
//! `AnonHugePages` (Linux), i.e. how much of its memory the kernel gave 2 MiB pages.
//!
//! `--bind`: the T-thread pool's workers are bound to the CPUs ([`core_blas::bind_workers`]);
//! `--scale`'s 1-thread pool stays unbound.
//!
//! Probes: `--huge=AC` (any subset of A, B, C): only those operands are `AlignedVec`s, the rest
//! `Vec`s (which operand's 4 KiB pages cost what); `VOFF=n` (0-15): the `Vec` operands start n
//! floats past a 64-byte boundary (glibc's large `Vec`s start 16 bytes past a page: n = 4);
//! `SHOWADDR=1` prints where the operands start; `UKRV=v`: `core_blas::__set_ukr_variant(v)`.

use std::time::{Duration, Instant};

/// CPU time of the calling thread in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`, exact: reading
/// `/proc/thread-self/schedstat` instead lags by up to a scheduler tick, several ms); NaN where
/// the platform has no thread CPU clock (use the wall-clock figures).
fn cpu_ns() -> f64 {
    cpu_time::ThreadTime::try_now().map_or(f64::NAN, |t| t.as_duration().as_nanos() as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let with_mm = raw.iter().any(|a| a == "--mm");
    let scale = raw.iter().any(|a| a == "--scale");
    let aligned = raw.iter().any(|a| a == "--aligned");
    let args: Vec<usize> = raw.iter().filter_map(|a| a.parse().ok()).collect();
    let (m, n, k) = match args.as_slice() {
        [m, n, k, ..] => (*m, *n, *k),
        _ => (2048, 2048, 2048),
    };
    let threads = args.get(3).copied().unwrap_or(1);
    let flops = 2.0 * (m * n * k) as f64;
    let reps = args
        .get(4)
        .copied()
        .unwrap_or(((4e10 / flops) as usize).clamp(5, 101));
    let bind = raw.iter().any(|a| a == "--bind");
    let builder = rayon::ThreadPoolBuilder::new().num_threads(threads);
    let pool = if bind {
        core_blas::bind_workers(builder)?.build()?
    } else {
        builder.build()?
    };
    let g = core_blas::Gemm::global()?;
    // `UKRV=v`: the kernels' probe variant (`core_blas::__set_ukr_variant`).
    if let Some(v) = std::env::var("UKRV").ok().and_then(|v| v.parse().ok()) {
        core_blas::__set_ukr_variant(v);
    }
    let a_v: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
        .collect();
    let b_v: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
        .collect();
    // `--huge=ABC` (any subset of the letters): only those operands are `AlignedVec`s, the
    // others `Vec`s, to tell which operand's 4 KiB pages cost what; `--aligned` is `--huge=ABC`.
    let huge = raw
        .iter()
        .find_map(|a| a.strip_prefix("--huge="))
        .map(str::to_ascii_uppercase)
        .unwrap_or_else(|| if aligned { "ABC".into() } else { String::new() });
    // `VOFF=n` (0-15): the `Vec` operands start n floats past a 64-byte boundary (a subslice of
    // a longer `Vec`) instead of where the allocator put them (glibc: 16 bytes past a page).
    let voff: Option<usize> = std::env::var("VOFF").ok().and_then(|v| v.parse().ok());
    let shift = |v: &[f32]| -> usize {
        voff.map_or(0, |o| {
            let at = (v.as_ptr() as usize / 4) % 16;
            (o + 16 - at) % 16
        })
    };
    let pad = |v: Vec<f32>| -> Vec<f32> {
        let mut w = v;
        w.extend(std::iter::repeat_n(0.0, 16));
        w
    };
    let (a_v, b_v) = (pad(a_v), pad(b_v));
    let (a_s, b_s) = (shift(&a_v), shift(&b_v));
    let (a_v, b_v) = (&a_v[a_s..a_s + m * k], &b_v[b_s..b_s + k * n]);
    let (a_al, b_al, mut c_al, mut c_v);
    let a: &[f32] = if huge.contains('A') {
        a_al = core_blas::AlignedVec::from(a_v);
        &a_al
    } else {
        a_v
    };
    let b: &[f32] = if huge.contains('B') {
        b_al = core_blas::AlignedVec::from(b_v);
        &b_al
    } else {
        b_v
    };
    let c: &mut [f32] = if huge.contains('C') {
        c_al = core_blas::AlignedVec::zeroed(m * n);
        &mut c_al
    } else {
        c_v = vec![0.0f32; m * n + 16];
        let at = (c_v.as_ptr() as usize / 4) % 16;
        let s = voff.map_or(0, |o| (o + 16 - at) % 16);
        &mut c_v[s..s + m * n]
    };
    if std::env::var_os("SHOWADDR").is_some() {
        for (name, p) in [("A", a.as_ptr()), ("B", b.as_ptr()), ("C", c.as_ptr())] {
            eprintln!(
                "{name} at {:#x} (mod 4096: {})",
                p as usize,
                p as usize % 4096
            );
        }
    }
    let peak = || core_blas::peak::fma_peak_gflops(g.isa(), threads, Duration::from_millis(40));
    let clock = |f: &mut dyn FnMut()| {
        if threads == 1 {
            let t = cpu_ns();
            f();
            (cpu_ns() - t) * 1e-9
        } else {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        }
    };
    // Runs and clocks on a thread of the pool (the calling thread when the pool has one thread,
    // as far as the CPU clock is concerned: the product stays on the pool thread that runs it).
    let ours = |c: &mut [f32]| {
        pool.install(|| {
            clock(&mut || {
                g.sgemm(false, false, m, n, k, 1.0, a, k, b, n, 0.0, c, n)
                    .expect("valid sgemm")
            })
        })
    };
    let mm = |c: &mut [f32]| {
        // SAFETY: the pointers and strides describe the m×k, k×n and m×n row-major buffers.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        }
    };
    if scale {
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
        let wall = |p: &rayon::ThreadPool, c: &mut [f32]| {
            p.install(|| {
                let t = Instant::now();
                g.sgemm(false, false, m, n, k, 1.0, a, k, b, n, 0.0, c, n)
                    .expect("valid sgemm");
                t.elapsed().as_secs_f64()
            })
        };
        wall(&one, c);
        wall(&pool, c);
        let (mut ups, mut g1, mut gt, mut of_peak) = (vec![], vec![], vec![], vec![]);
        // `BACK=1`: the T-thread product runs once more right before the timed one, so the
        // pool's workers are awake (as in back-to-back products) instead of asleep since the
        // last pair.
        let back = std::env::var_os("BACK").is_some();
        for _ in 0..reps {
            let t1 = wall(&one, c);
            if back {
                wall(&pool, c);
            }
            let tt = wall(&pool, c);
            // The other 2-thread criterion: the T-thread rate against the T-thread FMA
            // peak measured right after it (both drop together when the host gives the vCPUs
            // less than two cores).
            let p = peak()?;
            ups.push(t1 / tt);
            g1.push(flops / t1 / 1e9);
            gt.push(flops / tt / 1e9);
            of_peak.push(flops / tt / 1e9 / p);
        }
        let mut sorted = ups.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "{} {m}x{n}x{k} scale 1 -> {threads} threads: {:.3}x (median of {reps} pairs, quartiles {:.3}-{:.3}), {:.1} -> {:.1} GFLOP/s, {:.1}% of the {threads}-thread peak",
            g.kernel_name(),
            median(ups),
            sorted[reps / 4],
            sorted[3 * reps / 4],
            median(g1),
            median(gt),
            100.0 * median(of_peak),
        );
        huge_report();
        return Ok(());
    }
    ours(c);
    if with_mm {
        mm(c);
    }
    let (mut r_ours, mut r_mm, mut g_ours, mut peaks) = (vec![], vec![], vec![], vec![]);
    for _ in 0..reps {
        let t = ours(c);
        let p = peak()?;
        g_ours.push(flops / t / 1e9);
        r_ours.push(flops / t / 1e9 / p);
        peaks.push(p);
        if with_mm {
            let t = clock(&mut || mm(c));
            let p = peak()?;
            r_mm.push(flops / t / 1e9 / p);
        }
    }
    let mm_txt = if with_mm {
        format!(", matrixmultiply {:.1}%", 100.0 * median(r_mm))
    } else {
        String::new()
    };
    println!(
        "{} {m}x{n}x{k} t={threads}: {:.1}% of peak (median of {reps} paired), {:.1} GFLOP/s, peak {:.1}{mm_txt}",
        g.kernel_name(),
        100.0 * median(r_ours),
        median(g_ours),
        median(peaks),
    );
    huge_report();
    Ok(())
}

/// The process's `AnonHugePages` and whether `AlignedVec` takes huge pages.
fn huge_report() {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
    let anon = rollup
        .lines()
        .find(|l| l.starts_with("AnonHugePages:"))
        .unwrap_or("AnonHugePages: n/a");
    println!(
        "huge pages {}: {}",
        match core_blas::AlignedVec::huge_pages() {
            Some(min) => format!("on from {} KiB", min / 1024),
            None => "off".into(),
        },
        anon.split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    );
}
