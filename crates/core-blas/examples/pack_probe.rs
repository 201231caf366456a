//! Tuning probe (not a benchmark): what does packing a dense row-major B block cost, and why?
//! `pack_probe K N KC NC [--huge]`: packs `KC × NC` blocks of a `K × N` row-major B in the
//! driver's order (jc outer, pc inner) into one buffer, in several modes, and prints the median
//! nanoseconds per block and GB/s of the source read:
//! - `hot`: the same block again and again (source and destination cache-resident);
//! - `stream`: every block once, nothing prefetched (source from memory);
//! - `pf-burst W`: each block's lines prefetched (`PackB::prefetch_b`) in one burst, then W µs of
//!   register-only work (the micro-kernels' time), then the pack; the burst is timed separately;
//! - `pf-spread W`: the prefetches spread over the W µs in 72 slices (the driver's way).
use std::time::Instant;

use core_blas::{AlignedVec, MatRef, PackB};

fn spin_ns(ns: u64) {
    let t = Instant::now();
    let mut x = 1.0f32;
    while (t.elapsed().as_nanos() as u64) < ns {
        for _ in 0..64 {
            x = std::hint::black_box(x * 1.000_000_1 + 1e-7);
        }
    }
    std::hint::black_box(x);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let huge = raw.iter().any(|a| a == "--huge");
    let args: Vec<usize> = raw.iter().filter_map(|a| a.parse().ok()).collect();
    let (k, n, kc, nc) = match args.as_slice() {
        [k, n, kc, nc, ..] => (*k, *n, *kc, *nc),
        _ => (576, 50176, 288, 432),
    };
    let work_us = args.get(4).copied().unwrap_or(140) as u64;
    let nr = 48;
    let src: Vec<f32> = (0..k * n).map(|i| (i % 17) as f32).collect();
    let al;
    let data: &[f32] = if huge {
        al = AlignedVec::from(&src[..]);
        &al
    } else {
        &src
    };
    let b = MatRef::row_major("b", data, k, n, n)?;
    let mut dst = AlignedVec::zeroed(nc.div_ceil(nr) * nr * kc);
    let bytes = (kc * nc * 4) as f64;
    let blocks: Vec<(usize, usize)> = (0..n / nc)
        .flat_map(|j| (0..k / kc).map(move |p| (p * kc, j * nc)))
        .collect();
    let report = |name: &str, v: Vec<f64>| {
        let m = median(v);
        println!(
            "{name:>10}: {:8.0} ns/block ({:.1} GB/s of source)",
            m,
            bytes / m
        );
    };
    // hot
    let mut v = vec![];
    for _ in 0..200 {
        let t = Instant::now();
        b.pack_b(0, kc, 0, nc, nr, &mut dst);
        v.push(t.elapsed().as_nanos() as f64);
    }
    report("hot", v);
    for round in 0..2 {
        let mut v = vec![];
        for &(pc, jc) in &blocks {
            let t = Instant::now();
            b.pack_b(pc, kc, jc, nc, nr, &mut dst);
            v.push(t.elapsed().as_nanos() as f64);
        }
        report(&format!("stream{round}"), v);
        let (mut v, mut pfv) = (vec![], vec![]);
        for &(pc, jc) in &blocks {
            let t = Instant::now();
            b.prefetch_b(pc, kc, jc, nc);
            pfv.push(t.elapsed().as_nanos() as f64);
            spin_ns(work_us * 1000);
            let t = Instant::now();
            b.pack_b(pc, kc, jc, nc, nr, &mut dst);
            v.push(t.elapsed().as_nanos() as f64);
        }
        report(&format!("pf-burst{round}"), v);
        report(&format!("  (burst){round}"), pfv);
        let mut v = vec![];
        let slices = 72;
        for &(pc, jc) in &blocks {
            for s in 0..slices {
                let (r0, r1) = (kc * s / slices, kc * (s + 1) / slices);
                b.prefetch_b(pc + r0, r1 - r0, jc, nc);
                spin_ns(work_us * 1000 / slices as u64);
            }
            let t = Instant::now();
            b.pack_b(pc, kc, jc, nc, nr, &mut dst);
            v.push(t.elapsed().as_nanos() as f64);
        }
        report(&format!("pf-spread{round}"), v);
    }
    Ok(())
}
