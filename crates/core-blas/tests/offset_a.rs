//! The offset-A kernels ([`Gemm::offset_a_tile`], [`Gemm::offset_a_store`]) against a naive f64
//! reference, for every kernel family the host has (each at its own [`Gemm::offset_a_shape`]:
//! 6 × 16 on scalar / avx2, 12 × 32 on avx512): every pixel count, step counts from 0 to
//! hundreds over sub-ranges of the list, random and repeated bases including the largest valid
//! one, := and +=, untouched rows, the transposed store with per-pixel destinations (Set with and
//! without bias over a NaN-filled y, Add, ReLU, every channel count, NaN in unused channels), and
//! the argument errors.

mod common;

use common::random;
use core_blas::{
    Error, Gemm, OFFSET_A_MR as MR, OFFSET_A_NR as NR, OffsetAStore, OffsetATile, Offsets,
};

/// The bound of `n + 2` roundings on a sum whose terms have absolute sum `sabs`.
fn bound(n: usize, sabs: f64) -> f64 {
    (n as f64 + 2.0) * f32::EPSILON as f64 * sabs + 1e-30
}

/// Offsets of a 3×3 stencil over a 11-wide plane, channels 150 apart, with odd extras (repeated
/// and non-monotonic).
fn stencil(n: usize) -> Vec<usize> {
    (0..n)
        .map(|s| (s / 9) * 150 + (s % 9 / 3) * 11 + s % 3 + (s * 5) % 7)
        .collect()
}

/// `(Σ, Σ|terms|)` of pixel `base`, channel `c` over the steps' offsets (Wᵀ panels of `nr`
/// values per step), in f64.
fn naive(wt: &[f32], nr: usize, offs: &[usize], x: &[f32], base: usize, c: usize) -> (f64, f64) {
    let (mut s, mut sabs) = (0.0f64, 0.0f64);
    for (t, &o) in offs.iter().enumerate() {
        let p = x[base + o] as f64 * wt[t * nr + c] as f64;
        s += p;
        sabs += p.abs();
    }
    (s, sabs)
}

/// Bases for `m` pixels, all at most `last`: odd ones, a repeat, and `last` (the largest valid
/// one in the callers) at the end.
fn bases(m: usize, last: usize, seed: usize) -> Vec<usize> {
    (0..m)
        .map(|i| {
            if i + 1 == m {
                last
            } else if i == 2 {
                (seed * 13 + 1) % (last + 1) // pixel 0's base again
            } else {
                (seed * 13 + i * 29 + 1) % (last + 1)
            }
        })
        .collect()
}

#[test]
fn offset_a_shape_is_the_familys() {
    for isa in common::families() {
        let shape = Gemm::new(isa).unwrap().offset_a_shape();
        let want = if isa == core_blas::Isa::Avx512 {
            (12, 32)
        } else {
            (6, 16)
        };
        assert_eq!(shape, want, "{isa}");
        assert!(shape.0 <= MR && shape.1 <= NR);
    }
}

#[test]
fn offset_a_tile_matches_naive_for_every_pixel_count() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.offset_a_shape();
        for n in [0usize, 1, 2, 3, 5, 9, 27, 64, 301] {
            let all = stencil(n + 4);
            let offs = Offsets::new(all.clone());
            let x = random(offs.max() + 131, 21 + n as u64);
            // Steps 3..n+3 of the list (a sub-range, as for input-channel blocking).
            let steps = 3..n + 3;
            let o = &all[steps.clone()];
            let wt = random(n * nr, 5 + n as u64);
            let last = x.len() - 1 - offs.max();
            for m in 1..=mr {
                // Scattered bases, one repeated base, runs (bases[i] = bases[0] + i: the run
                // kernel) up to the largest valid base.
                let run = |b0: usize| (b0..b0 + m).collect::<Vec<usize>>();
                let cases = [
                    bases(m, last, m),
                    vec![0; m],
                    bases(m, m * 3, m + 9),
                    run(last + 1 - m),
                    run(7),
                ];
                for (seed, b) in cases.into_iter().enumerate() {
                    for accumulate in [false, true] {
                        let mut acc: OffsetATile = [[-3.5; NR]; MR];
                        acc[0][5] = 0.25;
                        acc[mr - 1][nr - 1] = 1e3;
                        let before = acc;
                        g.offset_a_tile(&wt, &offs, steps.clone(), &x, &b, &mut acc, accumulate)
                            .unwrap();
                        for i in 0..MR {
                            for c in 0..NR {
                                let got = acc[i][c];
                                let what = format!(
                                    "{isa} n {n} m {m} bases#{seed} acc {accumulate}: acc[{i}][{c}] = {got}"
                                );
                                if i >= m || c >= nr {
                                    assert_eq!(
                                        got.to_bits(),
                                        before[i][c].to_bits(),
                                        "{what} written"
                                    );
                                    continue;
                                }
                                let (mut s, mut sabs) = naive(&wt, nr, o, &x, b[i], c);
                                if accumulate {
                                    s += before[i][c] as f64;
                                    sabs += (before[i][c] as f64).abs();
                                }
                                let e = bound(n, sabs);
                                assert!((got as f64 - s).abs() <= e, "{what}, expected {s} ± {e}");
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn offset_a_store_matches_naive_with_every_mode() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.offset_a_shape();
        // ldy at least the most pixels of a tile (12): the destinations of one channel, `gap`
        // apart, must not reach the next channel's plane.
        for (n, ldy) in [(0usize, 13usize), (1, 12), (9, 49), (40, 13), (288, 196)] {
            let all = stencil(n + 2);
            let offs = Offsets::new(all.clone());
            let x = random(offs.max() + 61, 40 + n as u64);
            let steps = 1..n + 1;
            let o = &all[steps.clone()];
            let bias = random(nr, 77);
            let counts = [1usize, 2, 7, 8, 9, 15, 16, 17, 24, 31, 32];
            for channels in counts.into_iter().filter(|&c| c <= nr) {
                // Channels past `channels` hold NaN in wt: they must never reach y.
                let mut wt = random(n * nr, 9 + channels as u64);
                for s in 0..n {
                    for c in channels..nr {
                        wt[s * nr + c] = f32::NAN;
                    }
                }
                let gap = (ldy / mr).max(1);
                let ylen = (channels - 1) * ldy + gap * mr + 5;
                let last = x.len() - 1 - offs.max();
                for m in 1..=mr {
                    // Odd channel counts on a run of bases (the run kernel), even ones scattered.
                    let b = if channels % 2 == 1 {
                        (last + 1 - m..=last).collect()
                    } else {
                        bases(m, last, m + channels)
                    };
                    // Distinct destinations (pixels `gap` apart within one plane of ldy),
                    // descending, the first at the largest valid one.
                    let dst: Vec<usize> = (0..m)
                        .map(|i| ylen - 1 - (channels - 1) * ldy - gap * i)
                        .collect();
                    for mode in 0..3 {
                        for relu in [false, true] {
                            let y0 = if mode == 2 {
                                random(ylen, 3 + m as u64)
                            } else {
                                vec![f32::NAN; ylen]
                            };
                            let mut y = y0.clone();
                            let store = match mode {
                                0 => OffsetAStore::Set { bias: None },
                                1 => OffsetAStore::Set {
                                    bias: Some(&bias[..channels]),
                                },
                                _ => OffsetAStore::Add,
                            };
                            g.offset_a_store(
                                &wt,
                                &offs,
                                steps.clone(),
                                &x,
                                &b,
                                &mut y,
                                &dst,
                                ldy,
                                channels,
                                store,
                                relu,
                            )
                            .unwrap();
                            let mut written = vec![false; ylen];
                            for i in 0..m {
                                for c in 0..channels {
                                    let at = dst[i] + c * ldy;
                                    written[at] = true;
                                    let (mut s, mut sabs) = naive(&wt, nr, o, &x, b[i], c);
                                    let extra = match mode {
                                        0 => 0.0,
                                        1 => bias[c] as f64,
                                        _ => y0[at] as f64,
                                    };
                                    s += extra;
                                    sabs += extra.abs();
                                    if relu {
                                        s = s.max(0.0);
                                    }
                                    let got = y[at];
                                    let e = bound(n + 1, sabs);
                                    assert!(
                                        (got as f64 - s).abs() <= e,
                                        "{isa} n {n} ch {channels} m {m} mode {mode} relu {relu}: y[{i}][{c}] = {got}, expected {s} ± {e}"
                                    );
                                }
                            }
                            for (k, (&a, &b)) in y.iter().zip(&y0).enumerate() {
                                if !written[k] {
                                    assert_eq!(a.to_bits(), b.to_bits(), "{isa}: y[{k}] written");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn offset_a_free_functions_use_the_process_family() {
    let shape = core_blas::offset_a_shape().unwrap();
    assert_eq!(shape, Gemm::global().unwrap().offset_a_shape());
    let nr = shape.1;
    let offs = Offsets::new(vec![0, 5, 1, 9, 3]);
    let wt = random(5 * nr, 5);
    let x = random(40, 6);
    let b = [3usize, 20, 30, 0];
    let mut acc: OffsetATile = [[0.0; NR]; MR];
    core_blas::offset_a_tile(&wt, &offs, 1..5, &x, &b, &mut acc, false).unwrap();
    let mut y = vec![0.0f32; nr * 4];
    let dst = [0usize, 1, 2, 3];
    core_blas::offset_a_store(
        &wt,
        &offs,
        1..5,
        &x,
        &b,
        &mut y,
        &dst,
        4,
        nr,
        OffsetAStore::Add,
        false,
    )
    .unwrap();
    for (i, &bi) in b.iter().enumerate() {
        for c in 0..nr {
            let (s, sabs) = naive(&wt, nr, &[5, 1, 9, 3], &x, bi, c);
            let e = bound(4, sabs);
            assert!((acc[i][c] as f64 - s).abs() <= e, "acc[{i}][{c}]");
            assert!((y[c * 4 + i] as f64 - s).abs() <= e, "y[{i}][{c}]");
        }
    }
}

fn expect_shape(r: Result<(), Error>, arg: &str) {
    match r {
        Err(Error::ShapeMismatch { arg: got, .. }) => assert_eq!(got, arg),
        other => panic!("expected a shape error on {arg}, got {other:?}"),
    }
}

fn expect_short(r: Result<(), Error>, arg: &str, needed: usize) {
    match r {
        Err(Error::SliceTooShort {
            arg: got,
            needed: n,
            ..
        }) => {
            assert_eq!((got, n), (arg, needed))
        }
        other => panic!("expected a short {arg} (needed {needed}), got {other:?}"),
    }
}

#[test]
fn offset_a_rejects_bad_arguments() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.offset_a_shape();
        let offs = Offsets::new(vec![0, 4, 2]);
        let wt = vec![1.0; 3 * nr];
        let x = vec![1.0; 30];
        let mut acc: OffsetATile = [[0.0; NR]; MR];
        {
            let mut t = |wt: &[f32], steps, b: &[usize]| {
                g.offset_a_tile(wt, &offs, steps, &x, b, &mut acc, false)
            };
            expect_shape(t(&wt, 0..3, &[]), "bases");
            expect_shape(t(&wt, 0..3, &vec![0; mr + 1]), "bases");
            expect_shape(t(&wt, 1..4, &[0]), "steps");
            #[allow(clippy::reversed_empty_ranges)]
            expect_shape(t(&wt, 2..1, &[0]), "steps");
            expect_short(t(&wt[..3 * nr - 1], 0..3, &[0]), "wt", 3 * nr);
            // A sub-range needs only its own wt values.
            t(&wt[..nr], 1..2, &[0]).unwrap();
            // base + max + 1 = 31 > 30: one value past the end.
            expect_short(t(&wt, 0..3, &[0, 26]), "x", 31);
            assert!(matches!(
                t(&wt, 0..3, &[usize::MAX - 3]),
                Err(Error::SliceTooShort { arg: "x", .. })
            ));
            // The largest valid base is accepted; an empty step range gives zeros.
            t(&wt, 0..3, &[0, 25]).unwrap();
            t(&[], 3..3, &[25]).unwrap();
        }
        assert_eq!(acc[0], [0.0; NR]);
        assert_eq!(acc[1][..nr], vec![3.0; nr][..]);
        assert!(acc[1][nr..].iter().all(|&v| v == 0.0));
        let mut y = vec![0.0f32; 50];
        let set = OffsetAStore::Set { bias: None };
        let s = |y: &mut [f32], dst: &[usize], ldy, ch, store| {
            g.offset_a_store(&wt, &offs, 0..3, &x, &[1, 2], y, dst, ldy, ch, store, false)
        };
        expect_shape(s(&mut y, &[0, 1], 10, 0, set), "channels");
        expect_shape(s(&mut y, &[0, 1], 10, nr + 1, set), "channels");
        expect_shape(s(&mut y, &[0], 10, 2, set), "dst");
        expect_shape(s(&mut y, &[0, 1, 2], 10, 2, set), "dst");
        // dst 41 + 1·10 = 51 > 50 - 1: y one short.
        expect_short(s(&mut y, &[0, 40], 10, 2, set), "y", 51);
        assert!(matches!(
            s(&mut y, &[0, 1], usize::MAX / 2, 4, set),
            Err(Error::SliceTooShort { arg: "y", .. })
        ));
        let bias = [1.0f32; 3];
        expect_short(
            s(
                &mut y,
                &[0, 1],
                10,
                4,
                OffsetAStore::Set { bias: Some(&bias) },
            ),
            "bias",
            4,
        );
        // The largest valid destination; Add leaves the rest of y alone.
        s(
            &mut y,
            &[0, 39],
            10,
            2,
            OffsetAStore::Set { bias: Some(&bias) },
        )
        .unwrap();
        assert_eq!((y[0], y[10], y[39], y[49]), (4.0, 4.0, 4.0, 4.0));
        s(&mut y, &[0, 39], 10, 2, OffsetAStore::Add).unwrap();
        assert_eq!((y[0], y[49], y[1]), (7.0, 7.0, 0.0));
    }
}
