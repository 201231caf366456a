//! `transpose_lanes` against the definition `dst[t * ld + l] = src[l][t * stride]`, for every
//! kernel family the host has: lane counts around the 8-lane register blocks (1..=20, including
//! MR = 6 and NR = 16), lengths around multiples of 8, strides 1-3, padded destination rows whose
//! gaps and tail must stay untouched, and the argument errors.

mod common;

use common::random;
use core_blas::{Error, Gemm};

const SENTINEL: f32 = -7.25;

#[test]
fn transpose_matches_definition() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        for nl in 1..=20usize {
            for len in [0usize, 1, 2, 7, 8, 9, 15, 16, 17, 31, 40] {
                for stride in 1..=3usize {
                    for pad in [0usize, 3] {
                        let ld = nl + pad;
                        let lane_len = if len == 0 { 0 } else { (len - 1) * stride + 1 };
                        let data =
                            random(nl * (lane_len + 5), (nl * 1000 + len * 10 + stride) as u64);
                        let lanes: Vec<&[f32]> = (0..nl)
                            .map(|l| &data[l * (lane_len + 5)..][..lane_len])
                            .collect();
                        let dst_len = len * ld + 4;
                        let mut dst = vec![SENTINEL; dst_len];
                        g.transpose_lanes(&mut dst, ld, &lanes, len, stride)
                            .unwrap();
                        for (i, &v) in dst.iter().enumerate() {
                            let (t, l) = (i / ld, i % ld);
                            let want = if t < len && l < nl {
                                lanes[l][t * stride]
                            } else {
                                SENTINEL
                            };
                            assert_eq!(
                                v.to_bits(),
                                want.to_bits(),
                                "{isa:?} nl={nl} len={len} stride={stride} ld={ld}: dst[{i}] (t={t}, l={l})"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn transpose_rejects_bad_arguments() {
    let g = Gemm::global().unwrap();
    let a = [1.0f32; 10];
    let short = [1.0f32; 3];
    let mut dst = [0.0f32; 40];
    // A lane too short for len = 4 at stride 1.
    assert!(matches!(
        g.transpose_lanes(&mut dst, 2, &[&a, &short], 4, 1),
        Err(Error::SliceTooShort { arg: "src", .. })
    ));
    // Rows that would overlap.
    assert!(matches!(
        g.transpose_lanes(&mut dst, 1, &[&a, &a], 4, 1),
        Err(Error::LeadingDimension { arg: "ld", .. })
    ));
    // Destination too short: (4 - 1) * 16 + 2 = 50 > 40.
    assert!(matches!(
        g.transpose_lanes(&mut dst, 16, &[&a, &a], 4, 1),
        Err(Error::SliceTooShort { arg: "dst", .. })
    ));
    assert!(matches!(
        g.transpose_lanes(&mut dst, 2, &[&a, &a], 4, 0),
        Err(Error::Stride { arg: "stride", .. })
    ));
    // Nothing to do is fine, whatever the other arguments.
    g.transpose_lanes(&mut [], 0, &[], 5, 1).unwrap();
    g.transpose_lanes(&mut [], 0, &[&a], 0, 1).unwrap();
    // len = 1 needs only nl values, whatever ld.
    let mut one = [0.0f32; 2];
    core_blas::transpose_lanes(&mut one, 0, &[&a[3..], &a[5..]], 1, 1).unwrap();
    assert_eq!(one, [1.0, 1.0]);
}

/// `deinterleave` against `dst[i · ld + q] = src[q · m + i]`: every phase count 1..=17 (around
/// the 8-row register blocks), group counts around multiples of 8, rows padded or not, `src`
/// exactly `n · m` long (the last loads must stay inside it) or longer, NaN payloads copied bit
/// for bit, every other value of `dst` untouched.
#[test]
fn deinterleave_matches_definition() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        for m in 1..=17usize {
            for n in [0usize, 1, 5, 7, 8, 9, 15, 16, 17, 23, 37, 64, 65] {
                for (pad, extra) in [(0usize, 0usize), (3, 0), (16, 5)] {
                    let ld = n + pad;
                    let mut src = random(n * m + extra, (m * 100 + n + pad) as u64);
                    if n * m > 3 {
                        src[3] = f32::from_bits(0x7fc0_1234); // a NaN with a payload
                    }
                    let dst_len = m * ld + 6;
                    let mut dst = vec![SENTINEL; dst_len];
                    g.deinterleave(&mut dst, ld, &src, m, n).unwrap();
                    let mut want = vec![SENTINEL; dst_len];
                    for q in 0..n {
                        for i in 0..m {
                            want[i * ld + q] = src[q * m + i];
                        }
                    }
                    for (k, (a, b)) in dst.iter().zip(&want).enumerate() {
                        assert_eq!(
                            a.to_bits(),
                            b.to_bits(),
                            "{isa} m {m} n {n} ld {ld}: dst[{k}] = {a}, expected {b}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn deinterleave_rejects_bad_arguments() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let src = vec![1.0f32; 60];
        let mut dst = vec![0.0f32; 100];
        match g.deinterleave(&mut dst, 10, &src, 0, 5) {
            Err(Error::ShapeMismatch { arg: "m", .. }) => {}
            other => panic!("{isa}: expected an error on m, got {other:?}"),
        }
        match g.deinterleave(&mut dst, 9, &src, 6, 10) {
            Err(Error::LeadingDimension { arg: "ld", min, .. }) => assert_eq!(min, 10),
            other => panic!("{isa}: expected an error on ld, got {other:?}"),
        }
        match g.deinterleave(&mut dst, 11, &src, 6, 11) {
            Err(Error::SliceTooShort {
                arg: "src", needed, ..
            }) => assert_eq!(needed, 66),
            other => panic!("{isa}: expected a short src, got {other:?}"),
        }
        match g.deinterleave(&mut dst[..59], 10, &src, 6, 10) {
            Err(Error::SliceTooShort {
                arg: "dst", needed, ..
            }) => assert_eq!(needed, 60),
            other => panic!("{isa}: expected a short dst, got {other:?}"),
        }
        assert!(matches!(
            g.deinterleave(&mut dst, usize::MAX, &src, 6, 10),
            Err(Error::SliceTooShort { arg: "dst", .. })
        ));
        // The exact sizes pass; n = 0 does nothing; m = 1 copies (any ld).
        g.deinterleave(&mut dst[..60], 10, &src, 6, 10).unwrap();
        g.deinterleave(&mut dst, 0, &[], 6, 0).unwrap();
        g.deinterleave(&mut dst[..5], 0, &src, 1, 5).unwrap();
        core_blas::deinterleave(&mut dst[..60], 10, &src, 6, 10).unwrap();
    }
}
