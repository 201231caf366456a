//! Tuning probe (ignored tests, run by hand): the AVX2 micro-kernel in the shapes of the real
//! loops, with the packing left out, to locate the loss between the isolated kernel (panels in L1)
//! and the five loops. Each case prints its rate as % of the FMA peak measured right after it:
//! `cargo test --release -p core-blas --lib probe -- --ignored --nocapture`.

use std::time::Duration;

use super::x86::V256;
use super::{Kernel, ukr};
use crate::kernel::x86::Avx2;

/// A micro-kernel entry point (the signature of [`Kernel::run`] without `self`).
type Ukr = unsafe fn(usize, f32, *const f32, *const f32, f32, *mut f32, usize, usize, usize, usize);

/// The AVX2 6×16 body computing all 6 rows whatever `m` (no edge kernels: the kernel before
/// they were added).
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_six_rows(
    k: usize,
    alpha: f32,
    a: *const f32,
    b: *const f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    m: usize,
    n: usize,
) {
    // SAFETY: compiled with avx2+fma; the memory contract is the caller's.
    unsafe { ukr::<V256, 6, 2, 6, 16>(k, alpha, a, b, beta, c, rs_c, cs_c, m, n) }
}

fn cpu_secs() -> f64 {
    cpu_time::ThreadTime::now().as_duration().as_secs_f64()
}

/// Tiles of the jr/ir loops over a packed `mc × kc` A block and `kc × nc` B block. `a_panels`
/// limits the distinct A micro-panels (1: the same panel every time, from L1); `c_ld == 0` writes
/// every tile into one local tile (C from L1).
#[allow(clippy::too_many_arguments)]
fn macro_loop(
    kern: Ukr,
    kc: usize,
    mc: usize,
    nc: usize,
    a: &[f32],
    a_panels: usize,
    b: &[f32],
    c: &mut [f32],
    c_ld: usize,
    passes: usize,
) -> f64 {
    let (mr, nr) = (Avx2::MR, Avx2::NR);
    let mut tile = [0.0f32; 96];
    let t = cpu_secs();
    for pass in 0..passes {
        let mut jr = 0;
        while jr < nc {
            let bp = b[jr * kc..].as_ptr();
            let mut ir = 0;
            while ir < mc {
                let ap = a[(ir / mr % a_panels) * mr * kc..].as_ptr();
                let beta = if pass == 0 { 0.0 } else { 1.0 };
                // SAFETY: `ap`, `bp` start packed micro-panels of kc·MR / kc·NR values inside
                // `a` / `b`; the C window is inside `c` (mc × c_ld) or the local tile.
                unsafe {
                    if c_ld == 0 {
                        kern(kc, 1.0, ap, bp, beta, tile.as_mut_ptr(), nr, 1, mr, nr);
                    } else {
                        let cp = c.as_mut_ptr().add(ir * c_ld + jr);
                        kern(kc, 1.0, ap, bp, beta, cp, c_ld, 1, mr, nr);
                    }
                }
                ir += mr;
            }
            jr += nr;
        }
    }
    std::hint::black_box(&mut tile);
    let secs = cpu_secs() - t;
    (2 * mc * nc * kc * passes) as f64 / secs / 1e9
}

#[test]
#[ignore = "tuning probe: prints timings, asserts nothing"]
fn probe_macro_kernel() {
    let Some(kern) = Avx2::new() else { return };
    let peak =
        || crate::peak::fma_peak_gflops(crate::Isa::Avx2, 1, Duration::from_millis(30)).unwrap();
    let (kc, mc, nc) = (256, 510, 2048);
    let c_ld: usize = std::env::var("PROBE_LDC")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2048);
    let a: Vec<f32> = (0..mc * kc).map(|i| (i % 7) as f32 * 1e-3).collect();
    let b: Vec<f32> = (0..nc * kc).map(|i| (i % 5) as f32 * 1e-3).collect();
    let mut c = vec![0.0f32; mc * c_ld.max(nc)];
    let variant: usize = std::env::var("PROBE_PF")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX);
    let kerns = VARIANTS;
    let cases: [(&str, usize, usize); 3] = [
        ("A block, B block, C 1 tile", mc / 6, 0),
        ("A 1 panel, B block, C matrix", 1, c_ld),
        ("A block, B block, C matrix", mc / 6, c_ld),
    ];
    let _ = kern;
    for round in 0..2 {
        for &(name, ap, ld) in &cases {
            for (ki, &(kname, kf)) in kerns.iter().enumerate() {
                if variant != usize::MAX && ki != variant && ki != 0 {
                    continue;
                }
                let mut best = 0.0f64;
                for _ in 0..3 {
                    let r = macro_loop(kf, kc, mc, nc, &a, ap, &b, &mut c, ld, 8);
                    best = best.max(r / peak());
                }
                println!(
                    "round {round} {name} ldc={ld} [{kname}]: {:.1}%",
                    100.0 * best
                );
            }
        }
    }
}

/// Kernel variant used by `Avx2::run` in test builds (0: the production kernel).
pub(crate) static VARIANT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The variants `VARIANT` selects.
const VARIANTS: [(&str, Ukr); 2] = [
    ("production", avx2_six_rows),
    ("6 rows for every edge", avx2_six_rows),
];

/// # Safety
/// As [`Kernel::run`] for `Avx2`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn run_variant(
    v: usize,
    k: usize,
    alpha: f32,
    a: *const f32,
    b: *const f32,
    beta: f32,
    c: *mut f32,
    rs_c: usize,
    cs_c: usize,
    m: usize,
    n: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { (VARIANTS[v].1)(k, alpha, a, b, beta, c, rs_c, cs_c, m, n) }
}

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// In-process A/B of kernel variants inside the real GEMM (1 thread, thread CPU clock), the
/// variants alternating every repetition: `PROBE_SHAPE=M,N,K PROBE_VARIANTS=0,1 PROBE_MODES=0,1,2
/// PROBE_REPS=9` (kernel variants: [`VARIANTS`]; driver modes: `driver::tune::MODE`).
#[test]
#[ignore = "tuning probe: prints timings, asserts nothing"]
fn probe_gemm_ab() {
    use std::sync::atomic::Ordering;
    if Avx2::new().is_none() {
        return;
    }
    let shape = env_list("PROBE_SHAPE", "2048,2048,2048");
    let (m, n, k) = (shape[0], shape[1], shape[2]);
    let kvars = env_list("PROBE_VARIANTS", "0");
    let modes = env_list("PROBE_MODES", "0");
    let mut variants = vec![];
    for &kv in &kvars {
        for &md in &modes {
            variants.push((kv, md));
        }
    }
    use crate::driver::tune;
    let reps = env_list("PROBE_REPS", "9")[0];
    let mut g = crate::Gemm::new(crate::Isa::Avx2).unwrap();
    let mut bs = g.block_sizes();
    if let Some(&nc) = env_list("PROBE_NC", "").first() {
        bs.nc = nc;
    }
    if let Some(&kc) = env_list("PROBE_KC", "").first() {
        bs.kc = kc;
    }
    g = g.with_block_sizes(bs).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
        .collect();
    let mut c = vec![0.0f32; m * n];
    let flops = 2.0 * (m * n * k) as f64;
    let mut ratio = vec![vec![]; variants.len()];
    for r in 0..=reps {
        for (vi, &(v, md)) in variants.iter().enumerate() {
            VARIANT.store(v, Ordering::Relaxed);
            let secs = tune::with_mode(md, || {
                pool.install(|| {
                    let t = cpu_secs();
                    g.sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)
                        .unwrap();
                    cpu_secs() - t
                })
            });
            VARIANT.store(0, Ordering::Relaxed);
            let p = crate::peak::fma_peak_gflops(crate::Isa::Avx2, 1, Duration::from_millis(30))
                .unwrap();
            if r > 0 {
                ratio[vi].push(flops / secs / 1e9 / p);
            }
        }
    }
    // Every variant must give the same bits as the first one.
    let mut first: Option<Vec<f32>> = None;
    for &(v, md) in &variants {
        VARIANT.store(v, Ordering::Relaxed);
        c.fill(f32::NAN);
        tune::with_mode(md, || {
            pool.install(|| {
                g.sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n)
                    .unwrap()
            })
        });
        VARIANT.store(0, Ordering::Relaxed);
        match &first {
            None => first = Some(c.clone()),
            Some(f) => {
                let same = f.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits());
                println!("variant {v} mode {md}: same bits as the first: {same}");
            }
        }
    }
    for (vi, &(v, md)) in variants.iter().enumerate() {
        let mut x = ratio[vi].clone();
        x.sort_by(f64::total_cmp);
        println!(
            "{m}x{n}x{k} [{} mode={md}]: median {:.1}%, min {:.1}%, max {:.1}%",
            VARIANTS[v].0,
            100.0 * x[x.len() / 2],
            100.0 * x[0],
            100.0 * x[x.len() - 1]
        );
    }
}

/// Packing alone: the B of `PROBE_SHAPE` (k × n, row-major) packed block by block (kc = k split
/// like the driver, nc = `PROBE_NC`), GB/s of source read; and a plain sequential read of it.
#[test]
#[ignore = "tuning probe: prints timings, asserts nothing"]
fn probe_pack_b() {
    use crate::pack::PackB;
    let shape = env_list("PROBE_SHAPE", "16,8192,144");
    let (n, k) = (shape[1], shape[2]);
    let nc = env_list("PROBE_NC", "896")[0];
    let kc = k.div_ceil(k.div_ceil(256));
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
        .collect();
    let src = crate::MatRef::row_major("b", &b, k, n, n).unwrap();
    let mut dst = vec![0.0f32; nc.div_ceil(16) * 16 * kc];
    for round in 0..3 {
        let t = cpu_secs();
        for _ in 0..5 {
            let mut jc = 0;
            while jc < n {
                let w = nc.min(n - jc);
                let mut pc = 0;
                while pc < k {
                    let kk = kc.min(k - pc);
                    src.pack_b(pc, kk, jc, w, 16, &mut dst);
                    pc += kk;
                }
                jc += w;
            }
        }
        let pack = cpu_secs() - t;
        let t = cpu_secs();
        let mut acc = 0.0f32;
        for _ in 0..5 {
            for line in b.chunks_exact(16) {
                acc += line[0];
            }
        }
        std::hint::black_box(acc);
        let read = cpu_secs() - t;
        let bytes = 5.0 * (k * n * 4) as f64;
        println!(
            "round {round}: {n}x{k} pack {:.1} GB/s ({:.3} ms per B), line-touch read {:.1} GB/s",
            bytes / pack / 1e9,
            pack / 5.0 * 1e3,
            bytes / read / 1e9
        );
    }
}

/// Gathering packers (row-major A into MR panels, a transposed B into NR panels): the 8 × 8
/// register transposes against the scalar gather, alternating, ns per packed value.
#[test]
#[ignore = "tuning probe: prints timings, asserts nothing"]
fn probe_pack_gather() {
    use crate::pack::{PackA, PackB, SCALAR_GATHER};
    use std::sync::atomic::Ordering;
    for &(m, k) in &[(32usize, 80usize), (66, 192), (414, 256)] {
        let a: Vec<f32> = (0..m * k).map(|i| i as f32).collect();
        let am = crate::MatRef::row_major("a", &a, m, k, k).unwrap();
        // B (k × m) stored transposed: element (p, j) at a[j * k + p].
        let bt = crate::MatRef::row_major("b", &a, m, k, k).unwrap().t();
        let mut dst = vec![0.0f32; m.div_ceil(6) * 6 * k + m.div_ceil(16) * 16 * k];
        let mut best = [f64::MAX; 4];
        for _ in 0..5 {
            for (vi, scalar) in [(0, false), (1, true)] {
                SCALAR_GATHER.store(scalar, Ordering::Relaxed);
                let reps = 2000 * 2048 / (m * k);
                let t = cpu_secs();
                for _ in 0..reps {
                    am.pack_a(0, m, 0, k, 6, &mut dst);
                }
                best[vi] = best[vi].min((cpu_secs() - t) / (reps * m * k) as f64 * 1e9);
                let t = cpu_secs();
                for _ in 0..reps {
                    bt.pack_b(0, k, 0, m, 16, &mut dst);
                }
                best[2 + vi] = best[2 + vi].min((cpu_secs() - t) / (reps * m * k) as f64 * 1e9);
            }
        }
        SCALAR_GATHER.store(false, Ordering::Relaxed);
        println!(
            "A {m}x{k} row-major -> MR=6: transpose {:.3} ns/value, scalar {:.3}; B^T -> NR=16: transpose {:.3}, scalar {:.3}",
            best[0], best[1], best[2], best[3]
        );
    }
}

/// `transpose_lanes` with rows back to back (ld = lanes): whole-row stores with spill against
/// masked stores, and the scalar loop; ns per value.
#[test]
#[ignore = "tuning probe: prints timings, asserts nothing"]
fn probe_transpose_spill() {
    use crate::transpose::NO_SPILL;
    use std::sync::atomic::Ordering;
    let g = crate::Gemm::new(crate::Isa::Avx2).unwrap();
    let gs = crate::Gemm::new(crate::Isa::Scalar).unwrap();
    for &(nl, len) in &[(6usize, 37usize), (6, 224), (12, 56), (16, 56)] {
        let data: Vec<f32> = (0..nl * len).map(|i| i as f32).collect();
        let lanes: Vec<&[f32]> = data.chunks_exact(len).collect();
        let mut dst = vec![0.0f32; nl * len];
        let reps = 400_000 / (nl * len) + 1;
        let mut best = [f64::MAX; 3];
        for _ in 0..7 {
            for v in 0..3 {
                NO_SPILL.store(v == 1, Ordering::Relaxed);
                let gg = if v == 2 { &gs } else { &g };
                let t = cpu_secs();
                for _ in 0..reps {
                    gg.transpose_lanes(&mut dst, nl, &lanes, len, 1).unwrap();
                    std::hint::black_box(&mut dst);
                }
                best[v] = best[v].min((cpu_secs() - t) / (reps * nl * len) as f64 * 1e9);
            }
        }
        NO_SPILL.store(false, Ordering::Relaxed);
        println!(
            "lanes {nl} len {len}: spill {:.3} ns/value, masked {:.3}, scalar {:.3}",
            best[0], best[1], best[2]
        );
    }
}

/// `gather_pieces` at stride 2 (a micro-panel of 16-value rows from every other source value):
/// the AVX2 deinterleave against the scalar family's loop, ns per value.
#[test]
#[ignore = "tuning probe: prints timings, asserts nothing"]
fn probe_gather_pieces() {
    use crate::gather::Piece;
    let g = crate::Gemm::new(crate::Isa::Avx2).unwrap();
    let gs = crate::Gemm::new(crate::Isa::Scalar).unwrap();
    let src: Vec<f32> = (0..1 << 16).map(|i| i as f32).collect();
    for &len in &[16u32, 9, 5] {
        let kc = 256usize;
        let pieces: Vec<Piece> = (0..kc)
            .map(|r| Piece {
                row: r as u32,
                col: 0,
                at: r * 224,
                len,
            })
            .collect();
        let mut dst = vec![0.0f32; kc * 16];
        let mut best = [f64::MAX; 2];
        for _ in 0..7 {
            for (v, gg) in [&g, &gs].into_iter().enumerate() {
                let t = cpu_secs();
                for _ in 0..2000 {
                    gg.gather_pieces(&mut dst, 16, &src, &pieces, 2).unwrap();
                    std::hint::black_box(&mut dst);
                }
                best[v] = best[v].min((cpu_secs() - t) / (2000 * kc * len as usize) as f64 * 1e9);
            }
        }
        println!(
            "gather stride 2, {kc} pieces of {len}: avx2 {:.3} ns/value, scalar {:.3}",
            best[0], best[1]
        );
    }
}

/// The offset tile unrolled by `U` steps (offsets read `U` at a time), for the A/B of
/// [`probe_offset_tile`].
#[target_feature(enable = "avx2,fma")]
unsafe fn offset_tile_unrolled<const M: usize, const V: usize, const U: usize>(
    offs: &[usize],
    w: *const f32,
    src: &[*const f32; crate::offset::OFFSET_NV],
    acc: &mut crate::offset::OffsetTile,
) {
    use super::Simd;
    use crate::offset::OFFSET_MR;
    // SAFETY: compiled with avx2+fma; memory per the caller (as `tile_body`).
    unsafe {
        let mut c = [[V256::zero(); V]; M];
        let bs: [*const f32; V] = std::array::from_fn(|v| src[v]);
        let mut wp = w;
        let mut chunks = offs.chunks_exact(U);
        for ch in &mut chunks {
            for u in 0..U {
                let off = ch[u];
                let mut b = [V256::zero(); V];
                for v in 0..V {
                    b[v] = V256::load(bs[v].add(off));
                }
                for m in 0..M {
                    let a = V256::bcast(wp.add(u * OFFSET_MR + m));
                    for v in 0..V {
                        c[m][v] = V256::fma(a, b[v], c[m][v]);
                    }
                }
            }
            wp = wp.wrapping_add(U * OFFSET_MR);
        }
        for &off in chunks.remainder() {
            let mut b = [V256::zero(); V];
            for v in 0..V {
                b[v] = V256::load(bs[v].add(off));
            }
            for m in 0..M {
                let a = V256::bcast(wp.add(m));
                for v in 0..V {
                    c[m][v] = V256::fma(a, b[v], c[m][v]);
                }
            }
            wp = wp.wrapping_add(OFFSET_MR);
        }
        for m in 0..M {
            for v in 0..V {
                V256::store(acc[m][v].as_mut_ptr(), c[m][v]);
            }
        }
    }
}

/// conv-ops' C3D 64@8×56² direct forward in the tile's terms (3×3×3 taps, 64 input channels:
/// 1728 steps per call, or `PROBE_CH` channels; 6 output channels × 2 runs of 8 pixels), over
/// 8 output rows × 4 run pairs × 11 channel blocks, each variant timed on the thread CPU clock
/// (best of `PROBE_REPS`), as % of the FMA peak measured after it. Variants
/// (`PROBE_VARIANTS`): 0 the production tile, 1/2/4 unrolled by that many steps.
#[test]
#[ignore = "tuning probe: prints timings, asserts nothing"]
fn probe_offset_tile() {
    use crate::kernel::offset::OffsetKernel;
    use crate::offset::{OFFSET_MR, OffsetTile};
    if Avx2::new().is_none() {
        return;
    }
    let kern = Avx2::new().unwrap();
    let ch = env_list("PROBE_CH", "64")[0];
    let reps = env_list("PROBE_REPS", "7")[0];
    let variants = env_list("PROBE_VARIANTS", "0,1,2,4");
    let (d, h, w) = (10usize, 58usize, 58usize);
    let plane = d * h * w;
    let xq: Vec<f32> = (0..ch * plane + 64)
        .map(|i| (i % 17) as f32 * 0.01)
        .collect();
    let offs: Vec<usize> = (0..ch * 27)
        .map(|s| {
            let (c, t) = (s / 27, s % 27);
            c * plane + (t / 9) * h * w + (t / 3 % 3) * w + t % 3
        })
        .collect();
    let steps = offs.len();
    let kblocks = 11;
    let wts: Vec<f32> = (0..kblocks * steps * OFFSET_MR)
        .map(|i| (i % 13) as f32 * 0.01)
        .collect();
    let mut acc: OffsetTile = Default::default();
    let mut sink = 0.0f32;
    let mut best = vec![f64::MAX; variants.len()];
    let mut calls = 0usize;
    for _ in 0..reps {
        for (vi, &var) in variants.iter().enumerate() {
            calls = 0;
            let t = cpu_secs();
            for y in 0..8 {
                for kb in 0..kblocks {
                    let wp = wts[kb * steps * OFFSET_MR..].as_ptr();
                    for g in 0..4 {
                        let b0 = 3 * h * w + y * w + g * 16;
                        let mut src = [std::ptr::null::<f32>(); crate::offset::OFFSET_NV];
                        src[0] = xq[b0..].as_ptr();
                        src[1] = xq[b0 + 8..].as_ptr();
                        // SAFETY: every offset + base + 8 is inside xq (plane padding), w holds
                        // steps · MR values per block.
                        unsafe {
                            match var {
                                0 => kern.tile::<6, 2>(&offs, wp, &src, &mut acc, false),
                                1 => offset_tile_unrolled::<6, 2, 1>(&offs, wp, &src, &mut acc),
                                2 => offset_tile_unrolled::<6, 2, 2>(&offs, wp, &src, &mut acc),
                                _ => offset_tile_unrolled::<6, 2, 4>(&offs, wp, &src, &mut acc),
                            }
                        }
                        sink += acc[0][0][0];
                        calls += 1;
                    }
                }
            }
            best[vi] = best[vi].min(cpu_secs() - t);
        }
    }
    let peak =
        crate::peak::fma_peak_gflops(crate::Isa::Avx2, 1, Duration::from_millis(50)).unwrap();
    let flops = 2.0 * (6 * 16 * steps * calls) as f64;
    for (vi, &var) in variants.iter().enumerate() {
        let g = flops / best[vi] / 1e9;
        println!(
            "offset tile 6x2, {steps} steps, variant {var}: {g:.1} GFLOP/s, {:.1}% of peak {peak:.1}",
            100.0 * g / peak
        );
    }
    println!("(checksum {sink})");
}

/// [`super::offset::a_tile_body`] unrolled by `U` steps, for [`probe_offset_a`].
#[target_feature(enable = "avx2,fma")]
unsafe fn offset_a_unrolled<const U: usize>(
    offs: &[usize],
    wt: *const f32,
    xs: &[*const f32; crate::offset::OFFSET_A_MR],
    acc: &mut crate::offset::OffsetATile,
) {
    use super::Simd;
    // SAFETY: compiled with avx2+fma; memory per the caller (as `a_tile_body`).
    unsafe {
        let mut c = [[V256::zero(); 2]; 6];
        let mut wp = wt;
        let mut chunks = offs.chunks_exact(U);
        for ch in &mut chunks {
            for (u, &off) in ch.iter().enumerate() {
                let b0 = V256::load(wp.add(u * 16));
                let b1 = V256::load(wp.add(u * 16 + 8));
                for i in 0..6 {
                    let a = V256::bcast(xs[i].add(off));
                    c[i][0] = V256::fma(a, b0, c[i][0]);
                    c[i][1] = V256::fma(a, b1, c[i][1]);
                }
            }
            wp = wp.wrapping_add(U * 16);
        }
        for &off in chunks.remainder() {
            let b0 = V256::load(wp);
            let b1 = V256::load(wp.add(8));
            for i in 0..6 {
                let a = V256::bcast(xs[i].add(off));
                c[i][0] = V256::fma(a, b0, c[i][0]);
                c[i][1] = V256::fma(a, b1, c[i][1]);
            }
            wp = wp.wrapping_add(16);
        }
        for i in 0..6 {
            V256::store(acc[i].as_mut_ptr(), c[i][0]);
            V256::store(acc[i].as_mut_ptr().add(8), c[i][1]);
        }
    }
}

/// [`super::offset::a_tile_body`] with the Wᵀ values `pf` steps ahead prefetched (T0), for
/// [`probe_offset_a`].
#[target_feature(enable = "avx2,fma")]
unsafe fn offset_a_prefetch(
    offs: &[usize],
    wt: *const f32,
    xs: &[*const f32; crate::offset::OFFSET_A_MR],
    acc: &mut crate::offset::OffsetATile,
    pf: usize,
) {
    use super::Simd;
    // SAFETY: compiled with avx2+fma; memory per the caller (as `a_tile_body`); prefetches of
    // addresses past the panel do not fault.
    unsafe {
        let mut c = [[V256::zero(); 2]; 6];
        let mut wp = wt;
        for &off in offs {
            V256::prefetch(wp.wrapping_add(pf * 16));
            let b0 = V256::load(wp);
            let b1 = V256::load(wp.add(8));
            for i in 0..6 {
                let a = V256::bcast(xs[i].add(off));
                c[i][0] = V256::fma(a, b0, c[i][0]);
                c[i][1] = V256::fma(a, b1, c[i][1]);
            }
            wp = wp.wrapping_add(16);
        }
        for i in 0..6 {
            V256::store(acc[i].as_mut_ptr(), c[i][0]);
            V256::store(acc[i].as_mut_ptr().add(8), c[i][1]);
        }
    }
}

/// conv-ops' planned "offset-A" direct convolution of ResNet-50's 3×3 layers (`PROBE_LAYER`
/// 256: 256 channels at 14², padded planes 16²; 512: 512 at 7², planes 9²), batch `PROBE_N`
/// (default 2), every output channel: pixels 6 at a time in order (tiles cross lines and
/// images), in bands of `PROBE_BAND` tiles (default: ~one image); per band every 16-channel block, per block every
/// tile of the band. Timed on the thread CPU clock (best of `PROBE_REPS`), as % of the FMA peak
/// measured after it. Variants (`PROBE_VARIANTS`): 0 the production tile (whole C·9 steps),
/// 1 `Gemm::offset_a_store` (Set with bias, ReLU: checks and the transposed store included),
/// 2 as 1 in chunks of `PROBE_CHUNK` input channels (chunk outermost: its wt stays in L1 over
/// the band's tiles; Set then Add, ReLU after the last), 3/4 the tile unrolled by 2/4, 5 chunks
/// outermost with one accumulator tile per tile of the band (`offset_a_tile` +=, no store),
/// 6 the tile prefetching Wᵀ `PROBE_PF` steps ahead, 7 as 5 calling the kernel directly (no
/// per-call argument checks).
#[test]
#[ignore = "tuning probe: prints timings, asserts nothing"]
fn probe_offset_a() {
    use crate::kernel::offset::OffsetKernel;
    use crate::offset::{OFFSET_A_MR, OffsetAStore, OffsetATile, Offsets};
    if Avx2::new().is_none() {
        return;
    }
    let kern = Avx2::new().unwrap();
    let g = crate::Gemm::new(crate::Isa::Avx2).unwrap();
    let layer = env_list("PROBE_LAYER", "256")[0];
    let batch = env_list("PROBE_N", "2")[0];
    let reps = env_list("PROBE_REPS", "5")[0];
    let chunk = env_list("PROBE_CHUNK", "64")[0];
    let pf = env_list("PROBE_PF", "8")[0];
    let variants = env_list("PROBE_VARIANTS", "0,1,2,3,4");
    let (ch, hw) = if layer == 512 {
        (512usize, 7usize)
    } else {
        (256, 14)
    };
    let (ko, wp) = (ch, hw + 2);
    let plane = wp * wp;
    let x: Vec<f32> = (0..batch * ch * plane)
        .map(|i| (i % 17) as f32 * 0.01)
        .collect();
    let offs: Vec<usize> = (0..ch * 9)
        .map(|s| (s / 9) * plane + (s % 9 / 3) * wp + s % 3)
        .collect();
    let steps = offs.len();
    let list = Offsets::new(offs.clone());
    let kblocks = ko / 16;
    let wt: Vec<f32> = (0..kblocks * steps * 16)
        .map(|i| (i % 13) as f32 * 0.01 - 0.05)
        .collect();
    let bias = vec![0.1f32; ko];
    let olen = hw * hw;
    let pixels = batch * olen;
    let mut y = vec![0.0f32; batch * ko * olen];
    // Bases and destinations of every pixel.
    let base: Vec<usize> = (0..pixels)
        .map(|p| (p / olen) * ch * plane + (p % olen / hw) * wp + p % hw)
        .collect();
    let dst: Vec<usize> = (0..pixels)
        .map(|p| (p / olen) * ko * olen + p % olen)
        .collect();
    let tiles: Vec<(usize, usize)> = (0..pixels)
        .step_by(OFFSET_A_MR)
        .map(|p| (p, OFFSET_A_MR.min(pixels - p)))
        .collect();
    let band = env_list("PROBE_BAND", "0")[0];
    let band = if band == 0 {
        olen.div_ceil(OFFSET_A_MR)
    } else {
        band
    };
    let mut acc: OffsetATile = Default::default();
    let mut sink = 0.0f32;
    let mut best = vec![f64::MAX; variants.len()];
    for _ in 0..reps {
        for (vi, &var) in variants.iter().enumerate() {
            let t = cpu_secs();
            for bt in tiles.chunks(band) {
                for kb in 0..kblocks {
                    let wk = &wt[kb * steps * 16..][..steps * 16];
                    if var == 7 {
                        // As 5 through the kernel itself (no per-call checks).
                        let mut accs = vec![OffsetATile::default(); bt.len()];
                        for s0 in (0..steps).step_by(chunk * 9) {
                            let s1 = steps.min(s0 + chunk * 9);
                            let w = &wk[s0 * 16..];
                            for (&(p0, m), a) in bt.iter().zip(accs.iter_mut()) {
                                let b = &base[p0..p0 + m];
                                if m < OFFSET_A_MR {
                                    g.offset_a_tile(w, &list, s0..s1, &x, b, a, s0 > 0).unwrap();
                                    continue;
                                }
                                let xs: [*const f32; OFFSET_A_MR] =
                                    std::array::from_fn(|i| x[b[i]..].as_ptr());
                                // SAFETY: every base + offset is inside x (padded planes), w
                                // holds (s1 − s0) · 16 values.
                                unsafe {
                                    kern.a_tile::<6>(&offs[s0..s1], w.as_ptr(), &xs, a, s0 > 0)
                                };
                            }
                        }
                        sink += accs[0][0][0];
                        continue;
                    }
                    if var == 5 {
                        let mut accs = vec![OffsetATile::default(); bt.len()];
                        for s0 in (0..steps).step_by(chunk * 9) {
                            let s1 = steps.min(s0 + chunk * 9);
                            let w = &wk[s0 * 16..];
                            for (&(p0, m), a) in bt.iter().zip(accs.iter_mut()) {
                                let b = &base[p0..p0 + m];
                                g.offset_a_tile(w, &list, s0..s1, &x, b, a, s0 > 0).unwrap();
                            }
                        }
                        sink += accs[0][0][0];
                        continue;
                    }
                    if var == 2 {
                        // Input-channel chunks outermost (the chunk's wt from L1 for every
                        // tile), partial sums through the store.
                        for s0 in (0..steps).step_by(chunk * 9) {
                            let s1 = steps.min(s0 + chunk * 9);
                            let store = if s0 == 0 {
                                OffsetAStore::Set {
                                    bias: Some(&bias[kb * 16..]),
                                }
                            } else {
                                OffsetAStore::Add
                            };
                            let w = &wk[s0 * 16..];
                            for &(p0, m) in bt {
                                let (b, d) = (&base[p0..p0 + m], &dst[p0..p0 + m]);
                                let yk = &mut y[kb * 16 * olen..];
                                g.offset_a_store(
                                    w,
                                    &list,
                                    s0..s1,
                                    &x,
                                    b,
                                    yk,
                                    d,
                                    olen,
                                    16,
                                    store,
                                    s1 == steps,
                                )
                                .unwrap();
                            }
                        }
                        continue;
                    }
                    for &(p0, m) in bt {
                        let b = &base[p0..p0 + m];
                        if var == 1 {
                            let d = &dst[p0..p0 + m];
                            let store = OffsetAStore::Set {
                                bias: Some(&bias[kb * 16..]),
                            };
                            let yk = &mut y[kb * 16 * olen..];
                            g.offset_a_store(
                                wk,
                                &list,
                                0..steps,
                                &x,
                                b,
                                yk,
                                d,
                                olen,
                                16,
                                store,
                                true,
                            )
                            .unwrap();
                            continue;
                        }
                        if m < OFFSET_A_MR || var == 0 {
                            g.offset_a_tile(wk, &list, 0..steps, &x, b, &mut acc, false)
                                .unwrap();
                        } else {
                            let xs: [*const f32; OFFSET_A_MR] =
                                std::array::from_fn(|i| x[b[i]..].as_ptr());
                            // SAFETY: every base + offset is inside x (padded planes), wk holds
                            // steps · 16 values.
                            unsafe {
                                if var == 3 {
                                    offset_a_unrolled::<2>(&offs, wk.as_ptr(), &xs, &mut acc);
                                } else if var == 6 {
                                    offset_a_prefetch(&offs, wk.as_ptr(), &xs, &mut acc, pf);
                                } else {
                                    offset_a_unrolled::<4>(&offs, wk.as_ptr(), &xs, &mut acc);
                                }
                            }
                        }
                        sink += acc[0][0];
                    }
                }
            }
            best[vi] = best[vi].min(cpu_secs() - t);
        }
    }
    let peak =
        crate::peak::fma_peak_gflops(crate::Isa::Avx2, 1, Duration::from_millis(50)).unwrap();
    let flops = 2.0 * (pixels * ko * steps) as f64;
    for (vi, &var) in variants.iter().enumerate() {
        let gf = flops / best[vi] / 1e9;
        println!(
            "offset-A {ch}@{hw}^2 batch {batch}, {steps} steps, variant {var}: {:.2} ms, {gf:.1} GFLOP/s, {:.1}% of peak {peak:.1}",
            best[vi] * 1e3,
            100.0 * gf / peak
        );
    }
    println!("(checksum {sink} {})", y[7]);
}
