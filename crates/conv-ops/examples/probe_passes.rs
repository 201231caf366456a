//! Probe: thread CPU time of every pass of one layer on one thread (min over rounds, the
//! passes interleaved round by round), for quick A/B runs between two builds.
//!
//! `cargo run --release -p conv-ops --example probe_passes -- [--back-to-back | --paired]
//! [--threads T [--bind]] N C K SIZE KERNEL STRIDE PAD [ROUNDS [FILTER]]` with SIZE / KERNEL like `32x32`
//! / `1x1`; FILTER (a comma list) keeps the passes whose name contains one of its parts. Prints
//! ms per pass and GFLOP/s.
//!
//! `--back-to-back` times each pass on its own the way the PyTorch anchors time theirs
//! (`conv_layers.py --min-time 0 --min-iters ROUNDS`, whose `bench` runs 2 warm-up calls, then
//! ROUNDS timed calls one after another, wall clock): the same, and prints the min and the median
//! of the ROUNDS calls, so that both sides of the lean table get the same number of timed calls,
//! the same clock and the same statistic. On 1×1 strided layers it also times the pointwise passes on
//! the input subsampled beforehand (what the passes cost without their gather / scatter).
//!
//! `--paired` times the forward convgemm and backward-data deconvgemm against their GEMM-only
//! bounds (the conv bench's `gemm-bound` and `bwd-data/gemm-bound`: the same M, N, K on dense
//! operands built beforehand, all 64-byte aligned) call by call: bound, pass, bound, pass, ..
//! (2 warm-up pairs, then ROUNDS timed pairs, thread CPU time), and prints both medians and
//! the median (and range) of the pairs' ratios bound / pass, so that both sides of the
//! "pass >= 95% of its bound" goal see the same minutes of a noisy host. FILTER `fwd` or
//! `bwd-data` keeps one of the two. Read the ratio with both medians: two builds of the pass
//! can also move the bound (session 31: a build whose phase copy was a 2 MiB huge-page buffer
//! ran the untouched bound 0.9-5.4% slower in the same process, 6 of 6 alternations, which
//! alone raised its ratio).
//!
//! `--threads T` (with `--paired`) runs both sides on a pool of T threads and times them by the
//! wall clock (as the conv bench's `/tN` benches do: the same pool for the bound and the pass),
//! and also prints both sides' upper quartiles (where a late or slow worker shows). With
//! `--back-to-back` it runs the passes on a pool of T threads (wall clock already): the
//! deconvgemm 2-thread speedup goal, call by call. Every
//! `--paired` run prints both sides' means too (a criterion sample is the mean of its calls).
//!
//! `--scale` (with `--threads T`) times each pass on a pool of one thread against a pool of T
//! threads call by call: a 1-thread call, a T-thread call, the order swapped every round (2
//! warm-up pairs, then ROUNDS timed pairs, wall clock), and prints both medians and the median
//! and quartiles of the pairs' speed-ups t1 / tT, so that both sides of the "deconvgemm at 2
//! threads ≥ 1.8×" goal see the same minutes of a host whose cores' rate moves minute to
//! minute (separate runs of t1 and t2 read 1.37-2.09× on one layer, session 40).
//!
//! `--bind` (with `--threads T`) builds the pool through [`core_blas::bind_workers`]: worker i
//! bound to the i-th CPU of the process's affinity mask, so that the guest scheduler cannot queue
//! a woken worker on its waker's vCPU (the bound rows beside the default, unbound ones).

use conv_ops::{
    BackwardDataAlgo as D, BackwardFilterAlgo as F, ConvGeometry, ForwardAlgo, Pass, Workspace,
    backward_data, backward_filter, forward, testing::uniform,
};
use core_blas::{AlignedVec, MatMut, MatRef};

/// CPU time of the calling thread in seconds (`CLOCK_THREAD_CPUTIME_ID`); NaN where there is none.
fn cpu() -> f64 {
    cpu_time::ThreadTime::try_now().map_or(f64::NAN, |t| t.as_duration().as_secs_f64())
}

fn dims(s: &str) -> Result<Vec<usize>, std::num::ParseIntError> {
    s.split('x').map(str::parse).collect()
}

type Error = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let threads = match args.iter().position(|s| s == "--threads") {
        Some(i) => args.get(i + 1).ok_or("--threads T")?.parse()?,
        None => 1,
    };
    let bind = args.iter().any(|s| s == "--bind");
    if bind && !args.iter().any(|s| s == "--threads") {
        return Err("--bind takes --threads T".into());
    }
    // One worker thread, everything run on it: its CPU time is the whole pass (`--threads`:
    // T workers, wall clock; `--bind`: worker i bound to the i-th allowed CPU).
    let pool = pool_of(threads, bind)?;
    pool.install(|| run(threads, bind))
}

/// A pool of `threads` workers (`bind`: bound through [`core_blas::bind_workers`]).
fn pool_of(threads: usize, bind: bool) -> Result<rayon::ThreadPool, Error> {
    let builder = rayon::ThreadPoolBuilder::new().num_threads(threads);
    let builder = if bind {
        core_blas::bind_workers(builder)?
    } else {
        builder
    };
    Ok(builder.build()?)
}

/// The layer's tensors, and the subsampled input of a 1×1 strided layer: `AlignedVec`s (64-byte
/// aligned; 2 MiB-aligned huge-page storage from 2 MiB), as nn's tensors and PyTorch's CPU
/// allocator give them, not `Vec`s 16 bytes past a cache line.
struct Data {
    g: ConvGeometry,
    x: AlignedVec,
    w: AlignedVec,
    dy: AlignedVec,
    y: AlignedVec,
    dx: AlignedVec,
    dw: AlignedVec,
    pointwise: Option<(ConvGeometry, AlignedVec, AlignedVec)>,
}

/// Runs `pass` on the layer (`on_pointwise`: on the subsampled input's pointwise layer).
fn call(d: &mut Data, pass: Pass, on_pointwise: bool, ws: &mut Workspace) -> Result<(), Error> {
    let Data {
        g,
        x,
        w,
        dy,
        y,
        dx,
        dw,
        pointwise,
    } = d;
    let (g, x, dx) = match (on_pointwise, pointwise) {
        (true, Some((g1, xs, dxs))) => (&*g1, &*xs, dxs),
        _ => (&*g, &*x, dx),
    };
    match pass {
        Pass::Forward(a) => forward(g, x, w, None, false, y, a, ws)?,
        Pass::BackwardData(a) => backward_data(g, dy, w, dx, a, ws)?,
        Pass::BackwardFilter(a) => backward_filter(g, x, dy, dw, a, ws)?,
    }
    Ok(())
}

fn run(threads: usize, bind: bool) -> Result<(), Error> {
    let mut a: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = a.iter().position(|s| s == "--threads") {
        a.drain(i..(i + 2).min(a.len()));
    }
    if threads > 1
        && !a
            .iter()
            .any(|s| s == "--paired" || s == "--back-to-back" || s == "--scale")
    {
        return Err("--threads takes --paired, --back-to-back or --scale".into());
    }
    let back_to_back = a.iter().any(|s| s == "--back-to-back");
    let paired = a.iter().any(|s| s == "--paired");
    let scale = a.iter().any(|s| s == "--scale");
    if scale && threads < 2 {
        return Err("--scale takes --threads T with T >= 2".into());
    }
    a.retain(|s| s != "--back-to-back" && s != "--paired" && s != "--scale" && s != "--bind");
    if a.len() < 7 {
        return Err(
            "usage: [--back-to-back | --paired | --scale] [--threads T [--bind]] N C K SIZE KERNEL STRIDE PAD [ROUNDS [FILTER]]"
                .into(),
        );
    }
    let n: usize = a[0].parse()?;
    let (c, k): (usize, usize) = (a[1].parse()?, a[2].parse()?);
    // At once (not by the builder): a kernel wider than the plane fits only with the padding.
    let pad = [a[6].parse()?];
    let g = ConvGeometry::from_parts(
        n,
        c,
        k,
        &dims(&a[3])?,
        &dims(&a[4])?,
        &[a[5].parse()?],
        &[1],
        &pad,
        &pad,
        1,
    )?;
    let rounds: usize = a.get(7).map_or(Ok(9), |s| s.parse())?;
    let aligned = |v: Vec<f32>| AlignedVec::from(v.as_slice());
    let x = aligned(uniform(1, g.x_len()));
    // 1×1 strided layers: the same layer as a pointwise one on x subsampled beforehand.
    let pointwise = if g.kernel_len() == 1 && g.stride().iter().any(|&s| s > 1) {
        let g1 = ConvGeometry::new(n, c, k, g.output(), &vec![1; g.rank()])?;
        let d = g.dims3();
        let (ilen, olen) = (g.input_spatial_len(), g.output_spatial_len());
        let mut xs = AlignedVec::zeroed(g1.x_len());
        for plane in 0..n * c {
            for o in 0..olen {
                let (o0, o1, o2) = (
                    o / (d.output[1] * d.output[2]),
                    (o / d.output[2]) % d.output[1],
                    o % d.output[2],
                );
                let i = (o0 * d.stride[0] * d.input[1] + o1 * d.stride[1]) * d.input[2]
                    + o2 * d.stride[2];
                xs[plane * olen + o] = x[plane * ilen + i];
            }
        }
        let dxs = AlignedVec::zeroed(g1.x_len());
        Some((g1, xs, dxs))
    } else {
        None
    };
    let mut data = Data {
        x,
        w: aligned(uniform(2, g.w_len())),
        dy: aligned(uniform(3, g.y_len())),
        y: AlignedVec::zeroed(g.y_len()),
        dx: AlignedVec::zeroed(g.x_len()),
        dw: AlignedVec::zeroed(g.w_len()),
        pointwise,
        g,
    };
    let mut passes: Vec<(&str, Pass, bool)> = vec![
        ("fwd/convgemm", Pass::Forward(ForwardAlgo::Convgemm), false),
        (
            "fwd/im2col+gemm",
            Pass::Forward(ForwardAlgo::Im2colGemm),
            false,
        ),
        ("fwd/direct", Pass::Forward(ForwardAlgo::Direct), false),
        (
            "bwd-data/deconvgemm",
            Pass::BackwardData(D::Deconvgemm),
            false,
        ),
        (
            "bwd-data/flipped-convgemm",
            Pass::BackwardData(D::FlippedConvgemm),
            false,
        ),
        (
            "bwd-data/flipped-direct",
            Pass::BackwardData(D::FlippedDirect),
            false,
        ),
        (
            "bwd-data/gemm+col2im",
            Pass::BackwardData(D::GemmCol2im),
            false,
        ),
        (
            "bwd-filter/convgemm-trans",
            Pass::BackwardFilter(F::ConvgemmTrans),
            false,
        ),
        (
            "bwd-filter/im2col+gemmT",
            Pass::BackwardFilter(F::Im2colGemmT),
            false,
        ),
    ];
    if data.pointwise.is_some() {
        passes.extend([
            (
                "pointwise fwd (no gather)",
                Pass::Forward(ForwardAlgo::Convgemm),
                true,
            ),
            (
                "pointwise bwd-data (no scatter)",
                Pass::BackwardData(D::Deconvgemm),
                true,
            ),
            (
                "pointwise bwd-filter (no gather)",
                Pass::BackwardFilter(F::ConvgemmTrans),
                true,
            ),
        ]);
    }
    passes.push(("bwd-filter/direct", Pass::BackwardFilter(F::Direct), false));
    if let Some(f) = a.get(8) {
        passes.retain(|(name, _, _)| f.split(',').any(|part| name.contains(part)));
    }
    // The flipped passes take stride-1 layers only.
    if conv_ops::transposed_geometry(&data.g).is_err() {
        passes.retain(|(_, pass, _)| {
            !matches!(
                pass,
                Pass::BackwardData(D::FlippedConvgemm | D::FlippedDirect)
            )
        });
    }
    let mut ws = Workspace::new(true);
    let flops = data.g.flops() as f64;
    if scale {
        return run_scale(&mut data, &passes, rounds, threads, bind, &mut ws);
    }
    if paired {
        let filter = a.get(8).map(String::as_str);
        return run_paired(&mut data, rounds, filter, threads, &mut ws);
    }
    if back_to_back {
        // The anchors' `bench`: 2 warm-up calls, then `rounds` timed calls, wall clock.
        for &(name, pass, pw) in &passes {
            for _ in 0..2 {
                call(&mut data, pass, pw, &mut ws)?;
            }
            let mut times = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t = std::time::Instant::now();
                call(&mut data, pass, pw, &mut ws)?;
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let n = times.len();
            let (min, med) = match n {
                0 => (f64::NAN, f64::NAN),
                _ if n % 2 == 1 => (times[0], times[n / 2]),
                _ => (times[0], 0.5 * (times[n / 2 - 1] + times[n / 2])),
            };
            println!(
                "{name:34} {:8.3} ms {:6.1} GFLOP/s  median {:8.3} ms  n {n}",
                min * 1e3,
                flops / min * 1e-9,
                med * 1e3
            );
        }
        return Ok(());
    }
    let mut best = vec![f64::INFINITY; passes.len()];
    for _ in 0..rounds {
        for (i, &(_, pass, pw)) in passes.iter().enumerate() {
            let t = cpu();
            call(&mut data, pass, pw, &mut ws)?;
            best[i] = best[i].min(cpu() - t);
        }
    }
    for ((name, _, _), t) in passes.iter().zip(&best) {
        println!(
            "{name:34} {:8.3} ms {:6.1} GFLOP/s",
            t * 1e3,
            flops / t * 1e-9
        );
    }
    Ok(())
}

/// Median of `v` (sorted in place); NaN when empty.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// `--scale`: each pass on one thread against `threads` threads, call by call (see the module
/// docs).
fn run_scale(
    d: &mut Data,
    passes: &[(&str, Pass, bool)],
    rounds: usize,
    threads: usize,
    bind: bool,
    ws: &mut Workspace,
) -> Result<(), Error> {
    let one = pool_of(1, false)?;
    let many = pool_of(threads, bind)?;
    for &(name, pass, pw) in passes {
        let (mut t1, mut tn, mut speedup) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..rounds + 2 {
            let mut time = |pool: &rayon::ThreadPool| -> Result<f64, Error> {
                let t = std::time::Instant::now();
                pool.install(|| call(d, pass, pw, ws))?;
                Ok(t.elapsed().as_secs_f64())
            };
            let (a, b) = if i % 2 == 0 {
                let a = time(&one)?;
                (a, time(&many)?)
            } else {
                let b = time(&many)?;
                (time(&one)?, b)
            };
            if i >= 2 {
                t1.push(a);
                tn.push(b);
                speedup.push(a / b);
            }
        }
        let (m1, mn) = (median(&mut t1), median(&mut tn));
        // `median` sorted the speed-ups: their quartiles.
        let ms = median(&mut speedup);
        let q = |f: usize| {
            speedup
                .get(speedup.len() * f / 4)
                .copied()
                .unwrap_or(f64::NAN)
        };
        println!(
            "{name:34} t1 {:8.3} ms  t{threads} {:8.3} ms (medians)  t1/t{threads}: pair median {ms:.3} (quartiles {:.3}-{:.3}), of the medians {:.3}  n {}",
            m1 * 1e3,
            mn * 1e3,
            q(1),
            q(3),
            m1 / mn,
            t1.len()
        );
    }
    Ok(())
}

/// `--paired`: each pass against its GEMM-only bound, alternated call by call (see the module
/// docs); `filter` (`fwd` / `bwd-data`) keeps one of the two; `threads > 1`: wall clock.
fn run_paired(
    d: &mut Data,
    rounds: usize,
    filter: Option<&str>,
    threads: usize,
    ws: &mut Workspace,
) -> Result<(), Error> {
    let start = std::time::Instant::now();
    let clock = || match threads {
        1 => cpu(),
        _ => start.elapsed().as_secs_f64(),
    };
    let g = d.g;
    let (rows, cols) = conv_ops::im2col::im2col_shape(&g);
    let k = g.out_channels();
    let olen = g.output_spatial_len();
    // The conv bench's bounds: the forward's dense im2col(x) (one group), w as it is, dense C;
    // backward-data's Wᵀ (C·R × K) times dy as one dense K × (N·O) matrix, dense C.
    let mut col = AlignedVec::zeroed(rows * cols);
    conv_ops::im2col::im2col(&g, 0, &d.x, &mut col)?;
    let mut cfwd = AlignedVec::zeroed(k * cols);
    let mut wt = AlignedVec::zeroed(rows * k);
    for (i, row) in wt.chunks_exact_mut(k).enumerate() {
        for (kk, v) in row.iter_mut().enumerate() {
            *v = d.w[kk * rows + i];
        }
    }
    let mut dy_dense = AlignedVec::zeroed(k * cols);
    for (n, img) in d.dy.chunks_exact(k * olen).enumerate() {
        for (kk, plane) in img.chunks_exact(olen).enumerate() {
            dy_dense[kk * cols + n * olen..][..olen].copy_from_slice(plane);
        }
    }
    let mut cbwd = AlignedVec::zeroed(rows * cols);
    let pairs = [
        ("fwd/convgemm", Pass::Forward(ForwardAlgo::Convgemm)),
        ("bwd-data/deconvgemm", Pass::BackwardData(D::Deconvgemm)),
    ];
    for (name, pass) in pairs {
        if filter.is_some_and(|f| !f.split(',').any(|part| name.contains(part))) {
            continue;
        }
        let (mut tb, mut tp, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..rounds + 2 {
            let t = clock();
            match pass {
                Pass::Forward(_) => core_blas::gemm(
                    1.0,
                    MatRef::row_major("w", &d.w, k, rows, rows)?,
                    MatRef::row_major("col", &col, rows, cols, cols)?,
                    0.0,
                    MatMut::row_major("c", &mut cfwd, k, cols, cols)?,
                )?,
                _ => core_blas::gemm(
                    1.0,
                    MatRef::row_major("wt", &wt, rows, k, k)?,
                    MatRef::row_major("dy", &dy_dense, k, cols, cols)?,
                    0.0,
                    MatMut::row_major("c", &mut cbwd, rows, cols, cols)?,
                )?,
            }
            let b = clock() - t;
            let t = clock();
            call(d, pass, false, ws)?;
            let p = clock() - t;
            if i >= 2 {
                tb.push(b);
                tp.push(p);
                ratio.push(b / p);
            }
        }
        let (lo, hi) = ratio
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(l, h), &r| (l.min(r), h.max(r)));
        let (mb, mp) = (median(&mut tb), median(&mut tp));
        let q3 = |v: &[f64]| v.get(v.len() * 3 / 4).copied().unwrap_or(f64::NAN);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        println!(
            "{name:20} means: bound {:8.3} ms  pass {:8.3} ms  (criterion's samples are means)",
            mean(&tb) * 1e3,
            mean(&tp) * 1e3
        );
        if threads > 1 {
            // `median` sorted both: their upper quartiles.
            println!(
                "{name:20} t{threads} upper quartiles: bound {:8.3} ms  pass {:8.3} ms",
                q3(&tb) * 1e3,
                q3(&tp) * 1e3
            );
        }
        println!(
            "{name:20} bound {:8.3} ms  pass {:8.3} ms (medians)  bound/pass: pair median {:.3} (range {lo:.3}-{hi:.3}), of the medians {:.3}  n {}",
            mb * 1e3,
            mp * 1e3,
            median(&mut ratio),
            mb / mp,
            tb.len()
        );
    }
    Ok(())
}
