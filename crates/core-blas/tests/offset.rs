//! The offset-list kernels against a naive f64 reference, for every kernel family the host has:
//! every row × run (or column) count, step and column sub-ranges, := and +=, odd and repeated
//! offsets, bases at the very end of x, untouched accumulators outside the tile, and the
//! argument errors.

mod common;

use common::random;
use core_blas::{
    DOT_MR, DOT_NC, DotTile, Error, Gemm, OFFSET_LANES as LANES, OFFSET_MR as MR, OFFSET_NV,
    OffsetTile, Offsets, offset_tile_vectors,
};

/// `(s, Σ|terms|)` in f64 → the bound of `terms + 2` roundings (the accumulated value counts as
/// one more term).
fn bound(n: usize, sabs: f64) -> f64 {
    (n as f64 + 2.0) * f32::EPSILON as f64 * sabs + 1e-30
}

/// Offsets of a 3×3 stencil over a 13-wide plane, channels 200 apart, plus odd extras (repeated
/// and non-monotonic).
fn stencil(n: usize) -> Vec<usize> {
    (0..n)
        .map(|s| (s / 9) * 200 + (s % 9 / 3) * 13 + s % 3 + (s * 7) % 5)
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn check_tile(
    what: &str,
    m: usize,
    w: &[f32],
    offs: &[usize],
    x: &[f32],
    src: &[usize],
    acc: &OffsetTile,
    before: &OffsetTile,
    accumulate: bool,
) {
    for i in 0..MR {
        for v in 0..OFFSET_NV {
            for l in 0..LANES {
                let got = acc[i][v][l];
                if i >= m || v >= src.len() {
                    assert!(
                        got.to_bits() == before[i][v][l].to_bits(),
                        "{what}: acc[{i}][{v}][{l}] = {got} was written (outside the tile)"
                    );
                    continue;
                }
                let init = if accumulate {
                    before[i][v][l] as f64
                } else {
                    0.0
                };
                let (mut s, mut sabs) = (init, init.abs());
                for (t, &o) in offs.iter().enumerate() {
                    let p = w[t * MR + i] as f64 * x[src[v] + o + l] as f64;
                    s += p;
                    sabs += p.abs();
                }
                let b = bound(offs.len(), sabs);
                assert!(
                    (got as f64 - s).abs() <= b,
                    "{what}: acc[{i}][{v}][{l}] = {got}, expected {s} ± {b}"
                );
            }
        }
    }
}

#[test]
fn offset_tile_matches_naive_for_every_rows_and_runs() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        for n in [0usize, 1, 3, 4, 5, 9, 27, 64] {
            let all = stencil(n + 3);
            let offs = Offsets::new(all.clone());
            let x = random(offs.max() + LANES + 97, 11 + n as u64);
            // Steps 2..n+2 of the list (a sub-range, as for input-channel blocking).
            let steps = 2..n + 2;
            for m in 1..=MR {
                // The unused rows of w hold NaN: they must never reach the tile.
                let mut w = random(n * MR, 3 + m as u64);
                for s in 0..n {
                    for i in m..MR {
                        w[s * MR + i] = f32::NAN;
                    }
                }
                for runs in 1..=offset_tile_vectors(m) {
                    // Bases odd, the last one at the largest valid position.
                    let src: Vec<usize> = (0..runs)
                        .map(|v| {
                            if v + 1 == runs {
                                x.len() - offs.max() - LANES
                            } else {
                                (v * 17 + 3) % 90
                            }
                        })
                        .collect();
                    for accumulate in [false, true] {
                        let mut acc: OffsetTile = [[[-7.25; LANES]; OFFSET_NV]; MR];
                        acc[0][0][3] = 0.5;
                        let before = acc;
                        g.offset_tile(m, &w, &offs, steps.clone(), &x, &src, &mut acc, accumulate)
                            .unwrap();
                        let what = format!("{isa} n {n} m {m} runs {runs} acc {accumulate}");
                        let o = &all[steps.clone()];
                        check_tile(&what, m, &w, o, &x, &src, &acc, &before, accumulate);
                    }
                }
            }
        }
    }
}

#[test]
fn offset_dot_tile_matches_naive_for_every_rows_and_columns() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        for nruns in [0usize, 1, 2, 3, 8, 17] {
            // Runs at odd, non-monotonic positions.
            let runs = Offsets::new((0..nruns).map(|r| (r * 37 + 5) % 301).collect());
            let all = stencil(DOT_NC + 7);
            let offs = Offsets::new(all.clone());
            let x = random(runs.max() + offs.max() + LANES + 5, 21 + nruns as u64);
            let ldd = nruns * LANES + 3;
            let dy = random(DOT_MR * ldd, 4 + nruns as u64);
            for m in 1..=DOT_MR {
                for ncols in 1..=DOT_NC {
                    for start in [0, 5] {
                        let cols = start..start + ncols;
                        for accumulate in [false, true] {
                            let mut acc: DotTile = [[-3.5; DOT_NC]; DOT_MR];
                            acc[0][0] = 0.25;
                            let before = acc;
                            g.offset_dot_tile(
                                m,
                                &dy,
                                ldd,
                                &runs,
                                &offs,
                                cols.clone(),
                                &x,
                                &mut acc,
                                accumulate,
                            )
                            .unwrap();
                            let what =
                                format!("{isa} runs {nruns} m {m} cols {cols:?} acc {accumulate}");
                            for i in 0..DOT_MR {
                                for j in 0..DOT_NC {
                                    let got = acc[i][j];
                                    if i >= m || j >= ncols {
                                        assert!(
                                            got.to_bits() == before[i][j].to_bits(),
                                            "{what}: acc[{i}][{j}] written (outside the tile)"
                                        );
                                        continue;
                                    }
                                    let init = if accumulate { before[i][j] as f64 } else { 0.0 };
                                    let (mut s, mut sabs) = (init, init.abs());
                                    for (r, &base) in runs.as_slice().iter().enumerate() {
                                        for l in 0..LANES {
                                            let p = dy[i * ldd + r * LANES + l] as f64
                                                * x[base + all[start + j] + l] as f64;
                                            s += p;
                                            sabs += p.abs();
                                        }
                                    }
                                    let b = bound(nruns * LANES, sabs);
                                    assert!(
                                        (got as f64 - s).abs() <= b,
                                        "{what}: acc[{i}][{j}] = {got}, expected {s} ± {b}"
                                    );
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
fn offset_free_functions_use_the_process_family() {
    let offs = Offsets::new(vec![0, 5, 1, 9]);
    let w = random(4 * MR, 5);
    let x = random(40, 6);
    let mut acc: OffsetTile = [[[0.0; LANES]; OFFSET_NV]; MR];
    let before = acc;
    core_blas::offset_tile(MR, &w, &offs, 0..4, &x, &[3, 20], &mut acc, false).unwrap();
    check_tile(
        "global",
        MR,
        &w,
        &[0, 5, 1, 9],
        &x,
        &[3, 20],
        &acc,
        &before,
        false,
    );
    let mut d: DotTile = [[0.0; DOT_NC]; DOT_MR];
    let runs = Offsets::new(vec![2]);
    core_blas::offset_dot_tile(1, &x[..8], 8, &runs, &offs, 1..2, &x, &mut d, false).unwrap();
    let want: f32 = (0..8).map(|l| x[l] * x[2 + 5 + l]).sum();
    assert!((d[0][0] - want).abs() <= 1e-5, "{} vs {want}", d[0][0]);
}

fn expect_shape(r: Result<(), Error>, arg: &str) {
    match r {
        Err(Error::ShapeMismatch { arg: got, .. }) => assert_eq!(got, arg),
        other => panic!("expected a shape error on {arg}, got {other:?}"),
    }
}

#[test]
fn offset_tile_rejects_bad_arguments() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let offs = Offsets::new(vec![0, 4, 2]);
        assert_eq!((offs.max(), offs.len()), (4, 3));
        let w = vec![1.0; 3 * MR];
        let x = vec![1.0; 30];
        let mut acc: OffsetTile = [[[0.0; LANES]; OFFSET_NV]; MR];
        let mut t = |m, w: &[f32], steps, src: &[usize]| {
            g.offset_tile(m, w, &offs, steps, &x, src, &mut acc, false)
        };
        expect_shape(t(0, &w, 0..3, &[0]), "m");
        expect_shape(t(MR + 1, &w, 0..3, &[0]), "m");
        expect_shape(t(1, &w, 0..3, &[]), "src");
        expect_shape(t(1, &w, 0..3, &[0; 7]), "src");
        expect_shape(t(4, &w, 0..3, &[0; 3]), "src");
        expect_shape(t(4, &w, 1..4, &[0]), "steps");
        #[allow(clippy::reversed_empty_ranges)]
        expect_shape(t(4, &w, 2..1, &[0]), "steps");
        match t(2, &w[..3 * MR - 1], 0..3, &[0]) {
            Err(Error::SliceTooShort {
                arg: "w", needed, ..
            }) => assert_eq!(needed, 3 * MR),
            other => panic!("{isa}: expected a short w, got {other:?}"),
        }
        // A sub-range needs only its own w values.
        t(2, &w[..MR], 1..2, &[0]).unwrap();
        // base + max + 8 = 31 > 30: one value past the end.
        match t(2, &w, 0..3, &[0, 19]) {
            Err(Error::SliceTooShort {
                arg: "x",
                needed,
                len,
            }) => {
                assert_eq!((needed, len), (31, 30))
            }
            other => panic!("{isa}: expected a short x, got {other:?}"),
        }
        assert!(matches!(
            t(2, &w, 0..3, &[usize::MAX - 3]),
            Err(Error::SliceTooShort { arg: "x", .. })
        ));
        // The largest valid base is accepted, and an empty step range gives zeros.
        t(2, &w, 0..3, &[0, 18]).unwrap();
        t(1, &[], 3..3, &[18]).unwrap();
        assert_eq!(acc[0][0], [0.0; LANES]);
        assert_eq!(acc[1][1], [3.0; LANES]);
    }
}

#[test]
fn offset_dot_tile_rejects_bad_arguments() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let runs = Offsets::new(vec![0, 3]);
        let offs = Offsets::new(vec![0, 1, 2, 3, 4, 6]);
        let x = vec![1.0; 17];
        let dy = vec![1.0; 3 * 16];
        let mut acc: DotTile = [[0.0; DOT_NC]; DOT_MR];
        let mut t = |m, dy: &[f32], ldd, cols, x: &[f32]| {
            g.offset_dot_tile(m, dy, ldd, &runs, &offs, cols, x, &mut acc, false)
        };
        expect_shape(t(0, &dy, 16, 0..1, &x), "m");
        expect_shape(t(DOT_MR + 1, &dy, 16, 0..1, &x), "m");
        expect_shape(t(1, &dy, 16, 0..0, &x), "cols");
        expect_shape(t(1, &dy, 16, 0..5, &x), "cols");
        expect_shape(t(1, &dy, 16, 4..7, &x), "cols");
        assert!(matches!(
            t(2, &dy, 15, 0..1, &x),
            Err(Error::LeadingDimension {
                arg: "ldd",
                min: 16,
                ..
            })
        ));
        match t(3, &dy[..47], 16, 0..1, &x) {
            Err(Error::SliceTooShort {
                arg: "dy", needed, ..
            }) => assert_eq!(needed, 48),
            other => panic!("{isa}: expected a short dy, got {other:?}"),
        }
        // runs.max + offs.max + 8 = 3 + 6 + 8 = 17.
        match t(1, &dy, 16, 0..1, &x[..16]) {
            Err(Error::SliceTooShort {
                arg: "x",
                needed,
                len,
            }) => {
                assert_eq!((needed, len), (17, 16))
            }
            other => panic!("{isa}: expected a short x, got {other:?}"),
        }
        // One row needs no leading dimension.
        t(1, &dy[..16], 0, 0..1, &x).unwrap();
        t(3, &dy, 16, 2..6, &x).unwrap();
        assert_eq!(acc[2][3], 16.0);
    }
}

/// `offset_dot_rows` against the naive sums for every family: every row count, column counts
/// around multiples of DOT_NC, runs 0-17, padded output rows (untouched gaps and other values),
/// the sums added to what `out` held; and the argument errors.
#[test]
fn offset_dot_rows_matches_naive_and_checks_arguments() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        for nruns in [0usize, 1, 3, 17] {
            let runs = Offsets::new((0..nruns).map(|r| (r * 37 + 5) % 301).collect());
            for ncols in [1usize, 3, 4, 5, 8, 13] {
                let all = stencil(ncols);
                let offs = Offsets::new(all.clone());
                let x = random(runs.max() + offs.max() + LANES + 3, 7 + ncols as u64);
                let ldd = nruns * LANES + 1;
                let dy = random(DOT_MR * ldd, 9 + nruns as u64);
                for m in 1..=DOT_MR {
                    let ldo = ncols + 2;
                    let init = random(DOT_MR * ldo + 1, 11);
                    let mut out = init.clone();
                    g.offset_dot_rows(m, &dy, ldd, &runs, &offs, &x, &mut out, ldo)
                        .unwrap();
                    let what = format!("{isa} runs {nruns} cols {ncols} m {m}");
                    for (idx, &got) in out.iter().enumerate() {
                        let (i, j) = (idx / ldo, idx % ldo);
                        if i >= m || j >= ncols {
                            assert_eq!(got.to_bits(), init[idx].to_bits(), "{what}: out[{idx}]");
                            continue;
                        }
                        let (mut s, mut sabs) = (init[idx] as f64, init[idx].abs() as f64);
                        for (r, &base) in runs.as_slice().iter().enumerate() {
                            for l in 0..LANES {
                                let p = dy[i * ldd + r * LANES + l] as f64
                                    * x[base + all[j] + l] as f64;
                                s += p;
                                sabs += p.abs();
                            }
                        }
                        let b = bound(nruns * LANES + 1, sabs);
                        assert!(
                            (got as f64 - s).abs() <= b,
                            "{what}: out[{i}][{j}] = {got}, expected {s} ± {b}"
                        );
                    }
                }
            }
        }
        // Errors.
        let runs = Offsets::new(vec![0, 3]);
        let offs = Offsets::new(vec![0, 1, 2, 3, 4, 6]);
        let x = vec![1.0; 17];
        let dy = vec![1.0; 3 * 16];
        let mut out = vec![0.0; 3 * 6];
        expect_shape(
            g.offset_dot_rows(0, &dy, 16, &runs, &offs, &x, &mut out, 6),
            "m",
        );
        expect_shape(
            g.offset_dot_rows(DOT_MR + 1, &dy, 16, &runs, &offs, &x, &mut out, 6),
            "m",
        );
        assert!(matches!(
            g.offset_dot_rows(2, &dy, 16, &runs, &offs, &x, &mut out, 5),
            Err(Error::LeadingDimension { arg: "ldo", .. })
        ));
        assert!(matches!(
            g.offset_dot_rows(3, &dy, 16, &runs, &offs, &x, &mut out[..17], 6),
            Err(Error::SliceTooShort { arg: "out", .. })
        ));
        assert!(matches!(
            g.offset_dot_rows(2, &dy, 15, &runs, &offs, &x, &mut out, 6),
            Err(Error::LeadingDimension { arg: "ldd", .. })
        ));
        assert!(matches!(
            g.offset_dot_rows(3, &dy[..47], 16, &runs, &offs, &x, &mut out, 6),
            Err(Error::SliceTooShort { arg: "dy", .. })
        ));
        assert!(matches!(
            g.offset_dot_rows(1, &dy, 16, &runs, &offs, &x[..16], &mut out, 6),
            Err(Error::SliceTooShort { arg: "x", .. })
        ));
        // One row needs no leading dimension; each out value gains 16 ones.
        g.offset_dot_rows(1, &dy[..16], 0, &runs, &offs, &x, &mut out[..6], 0)
            .unwrap();
        assert!(out[..6].iter().all(|&v| v == 16.0));
        let mut out2 = vec![1.0; 6];
        core_blas::offset_dot_rows(1, &dy[..16], 0, &runs, &offs, &x, &mut out2, 0).unwrap();
        assert!(out2.iter().all(|&v| v == 17.0));
    }
}

/// The wide offset tile (16 lanes, up to 8 rows: the `avx512` family) against the naive f64
/// reference: every rows × runs count, step sub-ranges, := and +=, NaN in w's unused rows,
/// bases at the very end of x, untouched accumulators outside the tile; other families refuse
/// it with [`Error::IsaUnavailable`].
#[test]
fn offset_wide_tile_matches_naive_for_every_rows_and_runs() {
    use core_blas::{WIDE_LANES as WL, WIDE_MR as WM, WIDE_NV as WV, WideTile, wide_tile_vectors};
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        if g.offset_lanes() != WL {
            assert_eq!(g.offset_lanes(), LANES, "{isa}");
            let offs = Offsets::new(vec![0, 3]);
            let mut acc: WideTile = [[[0.0; WL]; WV]; WM];
            let r = g.offset_wide_tile(
                1,
                &[0.0; 2 * WM],
                &offs,
                0..2,
                &[0.0; 40],
                &[0],
                &mut acc,
                false,
            );
            assert!(
                matches!(r, Err(Error::IsaUnavailable { .. })),
                "{isa}: {r:?}"
            );
            continue;
        }
        for n in [0usize, 1, 3, 9, 27, 64] {
            let all = stencil(n + 3);
            let offs = Offsets::new(all.clone());
            let x = random(offs.max() + WL + 97, 31 + n as u64);
            let steps = 2..n + 2;
            for m in 1..=WM {
                let mut w = random(n * WM, 7 + m as u64);
                for s in 0..n {
                    for i in m..WM {
                        w[s * WM + i] = f32::NAN;
                    }
                }
                for runs in 1..=wide_tile_vectors(m) {
                    let src: Vec<usize> = (0..runs)
                        .map(|v| {
                            if v + 1 == runs {
                                x.len() - offs.max() - WL
                            } else {
                                (v * 17 + 3) % 90
                            }
                        })
                        .collect();
                    for accumulate in [false, true] {
                        let mut acc: WideTile = [[[-7.25; WL]; WV]; WM];
                        acc[0][0][11] = 0.5;
                        let before = acc;
                        g.offset_wide_tile(
                            m,
                            &w,
                            &offs,
                            steps.clone(),
                            &x,
                            &src,
                            &mut acc,
                            accumulate,
                        )
                        .unwrap();
                        let what = format!("{isa} n {n} m {m} runs {runs} acc {accumulate}");
                        let o = &all[steps.clone()];
                        for i in 0..WM {
                            for v in 0..WV {
                                for l in 0..WL {
                                    let got = acc[i][v][l];
                                    if i >= m || v >= runs {
                                        assert!(
                                            got.to_bits() == before[i][v][l].to_bits(),
                                            "{what}: acc[{i}][{v}][{l}] = {got} written"
                                        );
                                        continue;
                                    }
                                    let init = if accumulate {
                                        before[i][v][l] as f64
                                    } else {
                                        0.0
                                    };
                                    let (mut s, mut sabs) = (init, init.abs());
                                    for (t, &off) in o.iter().enumerate() {
                                        let p = w[t * WM + i] as f64 * x[src[v] + off + l] as f64;
                                        s += p;
                                        sabs += p.abs();
                                    }
                                    let b = bound(o.len(), sabs);
                                    assert!(
                                        (got as f64 - s).abs() <= b,
                                        "{what}: acc[{i}][{v}][{l}] = {got}, expected {s} ± {b}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        // The argument errors.
        let offs = Offsets::new(vec![0, 4, 2]);
        let w = vec![1.0; 3 * WM];
        let x = vec![1.0; 40];
        let mut acc: WideTile = [[[0.0; WL]; WV]; WM];
        let mut t = |m, w: &[f32], steps, src: &[usize]| {
            g.offset_wide_tile(m, w, &offs, steps, &x, src, &mut acc, false)
        };
        expect_shape(t(0, &w, 0..3, &[0]), "m");
        expect_shape(t(WM + 1, &w, 0..3, &[0]), "m");
        expect_shape(t(1, &w, 0..3, &[]), "src");
        expect_shape(t(6, &w, 0..3, &[0; 5]), "src");
        expect_shape(t(7, &w, 0..3, &[0; 4]), "src");
        expect_shape(t(4, &w, 1..4, &[0]), "steps");
        assert!(matches!(
            t(2, &w[..3 * WM - 1], 0..3, &[0]),
            Err(Error::SliceTooShort { arg: "w", .. })
        ));
        // base + max + 16 = 41 > 40: one value past the end; 20 is the largest valid base.
        match t(2, &w, 0..3, &[0, 21]) {
            Err(Error::SliceTooShort {
                arg: "x",
                needed,
                len,
            }) => assert_eq!((needed, len), (41, 40)),
            other => panic!("{isa}: expected a short x, got {other:?}"),
        }
        t(8, &w, 0..3, &[0, 20, 7]).unwrap();
        assert_eq!(acc[7][2], [3.0; WL]);
        assert_eq!(acc[0][3], [0.0; WL]);
    }
}
