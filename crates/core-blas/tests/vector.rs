//! `core_blas::vector` against naive references, for every kernel family the host has (or the one
//! `CORE_BLAS_ISA` forces): lengths 0..70 and around the 8 / 32 / 1024 blocks, slices off a
//! 64-byte boundary with sentinels after them, NaN / ±inf / −0.0 inputs, the bit mask's layout,
//! and every argument error. Reductions are checked against an f64 sum within the documented
//! bound and for bit equality with the portable family (one summation order in every family);
//! element-wise kernels (max pooling's tap update and stride-2 split included) bit for bit
//! against the scalar loops written with the same operations.

mod common;

use common::random;
use core_blas::vector::{self, Planes, Vector, mask_bytes};
use core_blas::{Error, Isa};

const SENTINEL: f32 = -7.25;

fn lengths() -> Vec<usize> {
    let mut v: Vec<usize> = (0..70).collect();
    v.extend([
        95, 96, 97, 127, 128, 129, 1000, 1023, 1024, 1025, 1055, 1056, 2047, 2048, 2049, 3136,
        5000, 32768, 32773,
    ]);
    v
}

/// Random values in [-2, 2) with specials sprinkled in when `specials`.
fn data(len: usize, seed: u64, specials: bool) -> Vec<f32> {
    let mut x: Vec<f32> = random(len, seed).iter().map(|v| 2.0 * v).collect();
    if specials && len > 0 {
        let picks = [
            (0.0f32, 7usize),
            (-0.0, 11),
            (f32::NAN, 13),
            (f32::INFINITY, 17),
            (f32::NEG_INFINITY, 19),
        ];
        for (v, step) in picks {
            let at = (seed as usize * step + step) % len;
            x[at] = v;
        }
    }
    x
}

/// Equal bits, or both NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn same64(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// A reduction result against the f64 sum of its f32 terms: NaN / infinities as the plain sum,
/// finite results within the documented bound (32-term f32 lanes).
fn check_sum(got: f64, terms: &[f32], what: &str) {
    let want: f64 = terms.iter().map(|&t| t as f64).sum();
    if !want.is_finite() || terms.iter().any(|t| !t.is_finite()) {
        assert!(
            same64(got, want) || (got.is_nan() && want.is_nan()),
            "{what}: got {got}, want {want}"
        );
        return;
    }
    let mag: f64 = terms.iter().map(|&t| (t as f64).abs()).sum();
    let tol = 32.0 * f32::EPSILON as f64 * mag + 1e-30;
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got}, want {want} (tolerance {tol})"
    );
}

/// A slice of `len` values at `off` floats into a sentinel-padded buffer.
fn padded(x: &[f32], off: usize) -> Vec<f32> {
    let mut buf = vec![SENTINEL; off + x.len() + 9];
    buf[off..off + x.len()].copy_from_slice(x);
    buf
}

fn untouched(buf: &[f32], off: usize, len: usize, what: &str) {
    for (i, &v) in buf.iter().enumerate() {
        if i < off || i >= off + len {
            assert_eq!(
                v.to_bits(),
                SENTINEL.to_bits(),
                "{what}: wrote outside at {i}"
            );
        }
    }
}

fn families() -> Vec<&'static Vector> {
    common::families()
        .into_iter()
        .map(|isa| Vector::new(isa).unwrap())
        .collect()
}

#[test]
fn reductions_match_f64_sums_and_the_portable_order() {
    let portable = Vector::new(Isa::Scalar).unwrap();
    for v in families() {
        for len in lengths() {
            for specials in [false, true] {
                let seed = (len * 2 + specials as usize) as u64;
                let a = data(len, seed, specials);
                let b = data(len, seed + 1000, false);
                for off in [0usize, 1, 3] {
                    let (pa, pb) = (padded(&a, off), padded(&b, off));
                    let (sa, sb) = (&pa[off..off + len], &pb[off..off + len]);
                    let what = |f: &str| format!("{} {f} len {len} off {off}", v.isa());
                    let s = v.sum(sa);
                    check_sum(s, sa, &what("sum"));
                    assert!(same64(s, portable.sum(sa)), "{}", what("sum order"));
                    let m = 0.375f32;
                    let sq: Vec<f32> = sa.iter().map(|&x| (x - m) * (x - m)).collect();
                    let q = v.sum_sq_dev(sa, m);
                    check_sum(q, &sq, &what("sum_sq_dev"));
                    assert!(
                        same64(q, portable.sum_sq_dev(sa, m)),
                        "{}",
                        what("sq order")
                    );
                    let dev: Vec<f32> = sa.iter().map(|&x| x - m).collect();
                    let (s1, s2) = v.shifted_sums(sa, m);
                    check_sum(s1, &dev, &what("shifted_sums S1"));
                    assert!(same64(s2, q), "{}", what("shifted_sums S2 = sum_sq_dev"));
                    let (p1, p2) = portable.shifted_sums(sa, m);
                    assert!(
                        same64(s1, p1) && same64(s2, p2),
                        "{}",
                        what("shifted order")
                    );
                    let ab: Vec<f32> = sa.iter().zip(sb).map(|(x, y)| x * y).collect();
                    let d = v.dot(sa, sb).unwrap();
                    check_sum(d, &ab, &what("dot"));
                    assert!(
                        same64(d, portable.dot(sa, sb).unwrap()),
                        "{}",
                        what("dot order")
                    );
                    let (s2, d2) = v.sum_dot(sa, sb).unwrap();
                    assert!(same64(s2, s) && same64(d2, d), "{}", what("sum_dot"));
                }
            }
        }
    }
}

#[test]
fn reductions_of_known_values() {
    for v in families() {
        // 3000 ones: exact in every lane; 0.1 * 4096 within the bound; cancellation.
        assert_eq!(v.sum(&vec![1.0; 3000]), 3000.0);
        let x: Vec<f32> = (0..4096)
            .map(|i| if i % 2 == 0 { 1e7 } else { -1e7 })
            .collect();
        assert_eq!(v.sum(&x), 0.0);
        assert_eq!(v.sum_sq_dev(&[1.0, 3.0, 5.0], 3.0), 8.0);
        assert_eq!(v.dot(&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]).unwrap(), 32.0);
        assert!(v.sum(&[1.0, f32::INFINITY, f32::NEG_INFINITY]).is_nan());
        assert_eq!(v.sum(&[1.0, f32::INFINITY]), f64::INFINITY);
        assert!(v.sum_sq_dev(&[1.0, f32::NAN], 0.0).is_nan());
        assert_eq!(v.sum(&[]), 0.0);
        // Shifted statistics: mean 3 and Σ(x − mean)² = 8 from a shift of 2.
        let (s1, s2) = v.shifted_sums(&[1.0, 3.0, 5.0], 2.0);
        assert_eq!((s1, s2), (3.0, 11.0));
        assert_eq!(s2 - s1 * s1 / 3.0, 8.0);
    }
}

/// The planes' values laid end to end.
fn gather(x: &[f32], p: Planes) -> Vec<f32> {
    (0..p.count)
        .flat_map(|j| x[j * p.stride..][..p.len].iter().copied())
        .collect()
}

/// The plane reductions against f64 sums of their terms, bit for bit against the portable
/// family, against one call per plane's input when there is one plane, and against the
/// end-to-end concatenation when the plane length is a multiple of 32 (batch norm's channels:
/// 8 × 8 planes 64 apart in NCHW, odd spatial sizes, overlapping and touching planes).
#[test]
fn plane_reductions_match_f64_sums_and_the_portable_order() {
    let portable = Vector::new(Isa::Scalar).unwrap();
    let mut cases = Vec::new();
    for len in [
        0usize, 1, 4, 7, 8, 9, 31, 32, 33, 49, 64, 95, 196, 1024, 1056,
    ] {
        for count in [0usize, 1, 2, 3, 17, 33, 64] {
            for extra in [0usize, 1, 5, 64] {
                cases.push(Planes {
                    len,
                    stride: len + extra,
                    count,
                });
            }
        }
    }
    cases.push(Planes {
        len: 40,
        stride: 24,
        count: 9,
    });
    cases.push(Planes {
        len: 64,
        stride: 64 * 16,
        count: 64,
    });
    for v in families() {
        for (n, &p) in cases.iter().enumerate() {
            let total = p.span().unwrap();
            for specials in [false, true] {
                let seed = (n * 2 + specials as usize) as u64;
                let a = data(total + 3, seed, specials);
                let b = data(total + 3, seed + 77, false);
                for off in [0usize, 3] {
                    let (sa, sb) = (&a[off..off + total], &b[off..off + total]);
                    let what = |f: &str| format!("{} {f} {p:?} off {off}", v.isa());
                    let (ga, gb) = (gather(sa, p), gather(sb, p));
                    let k = 0.375f32;
                    let (s1, s2) = v.shifted_sums_planes(sa, p, k).unwrap();
                    let dev: Vec<f32> = ga.iter().map(|&x| x - k).collect();
                    let sq: Vec<f32> = dev.iter().map(|&d| d * d).collect();
                    check_sum(s1, &dev, &what("shifted S1"));
                    check_sum(s2, &sq, &what("shifted S2"));
                    let (p1, p2) = portable.shifted_sums_planes(sa, p, k).unwrap();
                    assert!(
                        same64(s1, p1) && same64(s2, p2),
                        "{}",
                        what("shifted order")
                    );
                    let (s, sx) = v.sum_dot_planes(sa, sb, p).unwrap();
                    let ab: Vec<f32> = ga.iter().zip(&gb).map(|(x, y)| x * y).collect();
                    check_sum(s, &ga, &what("sum_dot_planes S"));
                    check_sum(sx, &ab, &what("sum_dot_planes S·x"));
                    let (q, qx) = portable.sum_dot_planes(sa, sb, p).unwrap();
                    assert!(same64(s, q) && same64(sx, qx), "{}", what("sum_dot order"));
                    if p.count == 1 || p.len % 32 == 0 {
                        let (c1, c2) = v.shifted_sums(&ga, k);
                        assert!(
                            same64(s1, c1) && same64(s2, c2),
                            "{}",
                            what("= shifted_sums")
                        );
                        let (c, cx) = v.sum_dot(&ga, &gb).unwrap();
                        assert!(same64(s, c) && same64(sx, cx), "{}", what("= sum_dot"));
                    }
                }
            }
        }
    }
}

#[test]
fn plane_reductions_reject_short_slices() {
    for v in families() {
        let x = vec![1.0f32; 100];
        let p = Planes {
            len: 10,
            stride: 30,
            count: 4,
        };
        assert_eq!(p.span(), Some(100));
        assert_eq!(v.shifted_sums_planes(&x, p, 0.0).unwrap(), (40.0, 40.0));
        assert_eq!(v.sum_dot_planes(&x, &x, p).unwrap(), (40.0, 40.0));
        let short = &x[..99];
        let err = Error::SliceTooShort {
            arg: "x",
            len: 99,
            needed: 100,
        };
        assert_eq!(v.shifted_sums_planes(short, p, 0.0), Err(err));
        assert!(matches!(
            v.sum_dot_planes(&x, short, p),
            Err(Error::SliceTooShort {
                arg: "b",
                len: 99,
                needed: 100
            })
        ));
        assert!(matches!(
            v.sum_dot_planes(short, &x, p),
            Err(Error::SliceTooShort { arg: "a", .. })
        ));
        let huge = Planes {
            len: 1,
            stride: usize::MAX,
            count: 3,
        };
        assert!(matches!(
            v.shifted_sums_planes(&x, huge, 0.0),
            Err(Error::Stride { arg: "x", .. })
        ));
        let none = Planes {
            len: 5,
            stride: 5,
            count: 0,
        };
        assert_eq!(v.shifted_sums_planes(&[], none, 1.0).unwrap(), (0.0, 0.0));
        let free = vector::shifted_sums_planes(&x, p, 0.0).unwrap();
        assert_eq!(free, (40.0, 40.0));
        assert_eq!(vector::sum_dot_planes(&x, &x, p).unwrap(), (40.0, 40.0));
    }
}

#[test]
fn elementwise_kernels_match_the_scalar_loops_bit_for_bit() {
    let (m, s, g, b) = (0.3f32, 1.7f32, -0.8f32, 0.25f32);
    let (k, md, mdx) = (0.9f32, 0.05f32, -0.35f32);
    for v in families() {
        for len in lengths() {
            for off in 0..8usize {
                let seed = (len * 7 + off) as u64;
                let x = data(len, seed, true);
                let y = data(len, seed + 1, true);
                let what = |f: &str| format!("{} {f} len {len} off {off}", v.isa());

                // bn_train
                let (mut px, mut ph) = (padded(&x, off), padded(&vec![0.0; len], off));
                v.bn_train(&mut px[off..off + len], &mut ph[off..off + len], m, s, g, b)
                    .unwrap();
                untouched(&px, off, len, &what("bn_train x"));
                untouched(&ph, off, len, &what("bn_train xhat"));
                for i in 0..len {
                    let h = (x[i] - m) * s;
                    let o = h * g + b;
                    assert!(same(ph[off + i], h), "{} at {i}", what("xhat"));
                    assert!(same(px[off + i], o), "{} at {i}", what("bn_train"));
                }

                // scale_shift
                let mut px = padded(&x, off);
                v.scale_shift(&mut px[off..off + len], s, b);
                untouched(&px, off, len, &what("scale_shift"));
                for i in 0..len {
                    assert!(
                        same(px[off + i], x[i] * s + b),
                        "{} at {i}",
                        what("scale_shift")
                    );
                }

                // bn_backward
                let mut pd = padded(&x, off);
                let ph = padded(&y, off);
                v.bn_backward(&mut pd[off..off + len], &ph[off..off + len], k, md, mdx)
                    .unwrap();
                untouched(&pd, off, len, &what("bn_backward"));
                for i in 0..len {
                    let want = k * ((x[i] - md) - y[i] * mdx);
                    assert!(same(pd[off + i], want), "{} at {i}", what("bn_backward"));
                }

                // relu_train, relu, relu_backward
                let mut px = padded(&x, off);
                let nb = mask_bytes(len);
                let mut mask = vec![0xA5u8; nb + 3];
                v.relu_train(&mut px[off..off + len], &mut mask).unwrap();
                untouched(&px, off, len, &what("relu_train"));
                for i in 0..len {
                    assert!(
                        same(px[off + i], x[i].max(0.0)),
                        "{} at {i}",
                        what("relu_train")
                    );
                    let bit = mask[i / 8] >> (i % 8) & 1;
                    assert_eq!(
                        bit,
                        (x[i] > 0.0) as u8,
                        "{} mask at {i}",
                        what("relu_train")
                    );
                }
                if len % 8 != 0 {
                    assert_eq!(mask[nb - 1] >> (len % 8), 0, "{}", what("mask high bits"));
                }
                assert_eq!(&mask[nb..], &[0xA5; 3], "{}", what("mask past its bytes"));
                let mut py = padded(&x, off);
                v.relu(&mut py[off..off + len]);
                untouched(&py, off, len, &what("relu"));
                for i in 0..len {
                    assert!(same(py[off + i], x[i].max(0.0)), "{} at {i}", what("relu"));
                }
                // Backward with an independent random mask (high bits set too).
                let rmask: Vec<u8> = (0..nb).map(|j| (j * 37 + len * 11 + 0x81) as u8).collect();
                let mut pd = padded(&y, off);
                v.relu_backward(&mut pd[off..off + len], &rmask).unwrap();
                untouched(&pd, off, len, &what("relu_backward"));
                for i in 0..len {
                    let keep = rmask[i / 8] >> (i % 8) & 1 != 0;
                    let want = if keep { y[i] } else { 0.0 };
                    assert!(same(pd[off + i], want), "{} at {i}", what("relu_backward"));
                }

                // add
                let mut pa = padded(&x, off);
                let pb = padded(&y, off);
                v.add(&mut pa[off..off + len], &pb[off..off + len]).unwrap();
                untouched(&pa, off, len, &what("add"));
                for i in 0..len {
                    assert!(same(pa[off + i], x[i] + y[i]), "{} at {i}", what("add"));
                }

                // max_update: `best` x against `v` y (NaNs, infinities, −0.0 on both sides),
                // taps from an earlier update; then ties (v = best) keep the first.
                let (mut pb, pv) = (padded(&x, off), padded(&y, off));
                let taps: Vec<u32> = (0..len).map(|i| (i * 7 % 5) as u32).collect();
                let mut pt = vec![u32::MAX; off + len + 9];
                pt[off..off + len].copy_from_slice(&taps);
                v.max_update(
                    &mut pb[off..off + len],
                    &mut pt[off..off + len],
                    &pv[off..off + len],
                    9,
                )
                .unwrap();
                untouched(&pb, off, len, &what("max_update best"));
                assert!(
                    pt[..off]
                        .iter()
                        .chain(&pt[off + len..])
                        .all(|&t| t == u32::MAX)
                );
                for i in 0..len {
                    let wins = y[i] > x[i] || y[i].is_nan() && !x[i].is_nan();
                    let (b, t) = if wins { (y[i], 9) } else { (x[i], taps[i]) };
                    assert!(same(pb[off + i], b), "{} at {i}", what("max_update"));
                    assert_eq!(pt[off + i], t, "{} tap at {i}", what("max_update"));
                }
                let mut tie = pb.clone();
                v.max_update(
                    &mut tie[off..off + len],
                    &mut pt[off..off + len],
                    &pb[off..off + len],
                    10,
                )
                .unwrap();
                assert!(
                    pt[off..off + len].iter().all(|&t| t != 10),
                    "{}",
                    what("max_update tie")
                );

                // deinterleave2
                let (ne, no) = (len.div_ceil(2), len / 2);
                let (mut pe, mut po) = (padded(&vec![0.0; ne], off), padded(&vec![0.0; no], off));
                v.deinterleave2(&x, &mut pe[off..off + ne], &mut po[off..off + no])
                    .unwrap();
                untouched(&pe, off, ne, &what("deinterleave2 even"));
                untouched(&po, off, no, &what("deinterleave2 odd"));
                for i in 0..len {
                    let got = if i % 2 == 0 {
                        pe[off + i / 2]
                    } else {
                        po[off + i / 2]
                    };
                    assert!(same(got, x[i]), "{} at {i}", what("deinterleave2"));
                }
            }
        }
    }
}

/// A tensor processed in chunks at multiples of 8 gives the mask of one whole call.
#[test]
fn relu_mask_chunks_compose() {
    for v in families() {
        let x = data(1000, 5, true);
        let (mut whole, mut parts) = (x.clone(), x.clone());
        let mut m1 = vec![0u8; mask_bytes(1000)];
        let mut m2 = vec![0u8; mask_bytes(1000)];
        v.relu_train(&mut whole, &mut m1).unwrap();
        for o in (0..1000).step_by(136) {
            let end = (o + 136).min(1000);
            v.relu_train(&mut parts[o..end], &mut m2[o / 8..]).unwrap();
        }
        assert_eq!(m1, m2);
        assert!(whole.iter().zip(&parts).all(|(a, b)| same(*a, *b)));
    }
}

#[test]
fn argument_errors_name_the_argument() {
    for v in families() {
        let mut x = vec![1.0f32; 10];
        let mut short = vec![0.0f32; 9];
        let shape = |r: Result<(), Error>, arg: &str| match r {
            Err(Error::ShapeMismatch { arg: a, .. }) => assert_eq!(a, arg),
            other => panic!("expected a shape error on {arg}, got {other:?}"),
        };
        assert!(matches!(
            v.dot(&x, &short),
            Err(Error::ShapeMismatch { arg: "b", .. })
        ));
        assert!(matches!(
            v.sum_dot(&x, &short),
            Err(Error::ShapeMismatch { arg: "b", .. })
        ));
        shape(v.bn_train(&mut x, &mut short, 0.0, 1.0, 1.0, 0.0), "xhat");
        shape(v.bn_backward(&mut x, &short, 1.0, 0.0, 0.0), "h");
        shape(v.add(&mut x, &short), "b");
        shape(v.add(&mut short, &x), "b");
        let mut taps = vec![0u32; 10];
        let ten = x.clone();
        shape(v.max_update(&mut x, &mut taps[..9], &ten, 1), "tap");
        shape(v.max_update(&mut x, &mut taps, &short, 1), "v");
        let mut e = vec![0.0f32; 5];
        let mut o = vec![0.0f32; 5];
        shape(v.deinterleave2(&x[..9], &mut e[..4], &mut o[..4]), "even");
        shape(v.deinterleave2(&x[..9], &mut e, &mut o), "odd");
        shape(v.deinterleave2(&x, &mut e[..5], &mut o[..4]), "odd");
        let mut m = vec![0u8; 1];
        assert_eq!(
            v.relu_train(&mut x, &mut m),
            Err(Error::SliceTooShort {
                arg: "mask",
                len: 1,
                needed: 2
            })
        );
        assert!(matches!(
            v.relu_backward(&mut x, &m),
            Err(Error::SliceTooShort { arg: "mask", .. })
        ));
        // Nothing was written by the failed calls.
        assert!(x.iter().all(|&v| v == 1.0));
        assert!(short.iter().all(|&v| v == 0.0));
    }
}

/// The free functions use the process-wide family.
#[test]
fn free_functions_follow_the_global_family() {
    let g = Vector::global().unwrap();
    assert_eq!(g.isa(), core_blas::Gemm::global().unwrap().isa());
    let x = data(77, 3, false);
    assert!(same64(vector::sum(&x).unwrap(), g.sum(&x)));
    let mut y = x.clone();
    vector::relu(&mut y).unwrap();
    assert!(y.iter().all(|&v| v >= 0.0));
}
