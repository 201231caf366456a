//! `gemm_packed_batched` against the naive reference for every kernel family the host has (or the
//! one `CORE_BLAS_ISA` forces): m and n around the register tile (1, MR ± 1, NR ± 1, fastconv's
//! 32 × 80), k = 1 to beyond a few hundred, batches of 0-3 products with padded strides, operand
//! padding full of NaN (must never reach C), C's gaps and tail untouched, a shared A (stride 0),
//! the packing helpers against their formulas, and the argument errors.

mod common;

use common::{GEMM_TOL, Strided, assert_close, random, reference};
use core_blas::{Error, Gemm};

const SENTINEL: f32 = -7.25;

/// `count` row-major m × k matrices (`src`, stride m·k) packed into A panels `stride_a` apart,
/// everything else (padding, gaps) NaN.
fn pack_a(g: &Gemm, src: &[f32], m: usize, k: usize, count: usize, stride_a: usize) -> Vec<f32> {
    let len = if count == 0 {
        0
    } else {
        (count - 1) * stride_a + g.packed_a_len(m, k)
    };
    let mut out = vec![f32::NAN; len];
    for p in 0..count {
        for i in 0..m {
            for t in 0..k {
                out[p * stride_a + g.packed_a_index(k, i, t)] = src[p * m * k + i * k + t];
            }
        }
    }
    out
}

/// The same for B (row-major k × n) into NR panels.
fn pack_b(g: &Gemm, src: &[f32], k: usize, n: usize, count: usize, stride_b: usize) -> Vec<f32> {
    let len = if count == 0 {
        0
    } else {
        (count - 1) * stride_b + g.packed_b_len(k, n)
    };
    let mut out = vec![f32::NAN; len];
    for p in 0..count {
        for t in 0..k {
            for j in 0..n {
                out[p * stride_b + g.packed_b_index(k, t, j)] = src[p * k * n + t * n + j];
            }
        }
    }
    out
}

/// Runs one batch and checks every product against the reference and every other value of C
/// against the sentinel.
#[allow(clippy::too_many_arguments)]
fn check(g: &Gemm, m: usize, n: usize, k: usize, count: usize, shared_a: bool, beta: f32) {
    let (mr, nr) = g.tile();
    let seed = (m * 1_000_000 + n * 1000 + k) as u64;
    let a_src = random(count.max(1) * m * k, seed);
    let b_src = random(count.max(1) * k * n, seed + 1);
    let stride_a = if shared_a {
        0
    } else {
        g.packed_a_len(m, k) + 3
    };
    let stride_b = g.packed_b_len(k, n) + 5;
    let a_count = if shared_a { count.min(1) } else { count };
    let a = pack_a(g, &a_src, m, k, a_count, stride_a);
    let b = pack_b(g, &b_src, k, n, count, stride_b);
    let ldc = n + 3;
    let stride_c = m * ldc + 7;
    let c_len = count * stride_c + 4;
    let mut c = vec![SENTINEL; c_len];
    // C's windows: NaN for beta = 0 (must not be read), random values otherwise.
    let c_init = random(c_len, seed + 2);
    for p in 0..count {
        for i in 0..m {
            for j in 0..n {
                let x = p * stride_c + i * ldc + j;
                c[x] = if beta == 0.0 { f32::NAN } else { c_init[x] };
            }
        }
    }
    let c0 = c.clone();
    g.gemm_packed_batched(
        m, n, k, &a, stride_a, &b, stride_b, beta, &mut c, ldc, stride_c, count,
    )
    .unwrap();
    let what = format!(
        "{:?} {mr}x{nr} m={m} n={n} k={k} count={count} shared_a={shared_a} beta={beta}",
        g.isa()
    );
    for p in 0..count {
        let ap = if shared_a { 0 } else { p * m * k };
        let expect = reference(
            m,
            n,
            k,
            1.0,
            Strided {
                data: &a_src[ap..],
                rs: k,
                cs: 1,
            },
            Strided {
                data: &b_src[p * k * n..],
                rs: n,
                cs: 1,
            },
            beta,
            Strided {
                data: &c0[p * stride_c..],
                rs: ldc,
                cs: 1,
            },
            GEMM_TOL,
        );
        assert_close(
            &format!("{what} product {p}"),
            Strided {
                data: &c[p * stride_c..],
                rs: ldc,
                cs: 1,
            },
            m,
            n,
            &expect,
        );
    }
    for (idx, &v) in c.iter().enumerate() {
        let (p, r) = (idx / stride_c, idx % stride_c);
        let inside = p < count && r / ldc < m && r % ldc < n;
        if !inside {
            assert_eq!(
                v.to_bits(),
                SENTINEL.to_bits(),
                "{what}: c[{idx}] overwritten"
            );
        }
    }
}

#[test]
fn packed_batched_matches_reference() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.tile();
        let ms = [1, 2, mr - 1, mr, mr + 1, 2 * mr + 3, 32];
        let ns = [1, 7, nr - 1, nr, nr + 1, 37, 80];
        for &m in &ms {
            for &n in &ns {
                for k in [1, 2, 5, 32] {
                    check(&g, m, n, k, 2, false, 0.0);
                }
                check(&g, m, n, 3, 2, false, 1.0);
                check(&g, m, n, 4, 1, false, -0.5);
            }
        }
        for k in [0, 1, 3, 4, 9, 80, 257] {
            for count in [0, 1, 3] {
                check(&g, 32, 80, k, count, false, 0.0);
                check(&g, mr + 1, nr - 1, k, count, true, 0.0);
                check(&g, mr - 1, nr + 1, k, count, false, 1.0);
            }
        }
        // fastconv's shapes: 81 products of 32 × 32 · 32 × 80, and thin ones.
        check(&g, 32, 80, 32, 81, false, 0.0);
        check(&g, 32, 80, 32, 36, false, 1.0);
        check(&g, 6, 200, 16, 9, false, 0.0);
        check(&g, 1, 1, 1, 5, false, 0.0);
    }
}

/// The free function uses the process-wide family (`CORE_BLAS_ISA` or the best available).
#[test]
fn free_function_uses_global_family() {
    let g = Gemm::global().unwrap();
    let (m, n, k) = (7, 19, 11);
    let a_src = random(m * k, 5);
    let b_src = random(k * n, 6);
    let a = pack_a(g, &a_src, m, k, 1, 0);
    let b = pack_b(g, &b_src, k, n, 1, 0);
    let mut c = vec![f32::NAN; m * n];
    core_blas::gemm_packed_batched(m, n, k, &a, 0, &b, 0, 0.0, &mut c, n, m * n, 1).unwrap();
    let mut want = vec![f32::NAN; m * n];
    core_blas::sgemm(
        false, false, m, n, k, 1.0, &a_src, k, &b_src, n, 0.0, &mut want, n,
    )
    .unwrap();
    for (x, y) in c.iter().zip(&want) {
        assert!((x - y).abs() <= 1e-5, "{x} vs {y}");
    }
}

#[test]
fn packing_helpers_follow_the_layout() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.tile();
        assert_eq!(g.packed_a_len(0, 5), 0);
        assert_eq!(g.packed_a_len(1, 5), mr * 5);
        assert_eq!(g.packed_a_len(mr + 1, 3), 2 * mr * 3);
        assert_eq!(g.packed_b_len(4, nr), nr * 4);
        assert_eq!(g.packed_b_len(4, nr + 1), 2 * nr * 4);
        let (m, n, k) = (2 * mr + 1, 2 * nr + 1, 7);
        // Every element has its own slot inside the packed length.
        let mut seen = vec![false; g.packed_a_len(m, k)];
        for i in 0..m {
            for t in 0..k {
                let x = g.packed_a_index(k, i, t);
                assert_eq!(x, (i / mr) * k * mr + t * mr + i % mr);
                assert!(!std::mem::replace(&mut seen[x], true), "A slot {x} twice");
            }
        }
        let mut seen = vec![false; g.packed_b_len(k, n)];
        for t in 0..k {
            for j in 0..n {
                let x = g.packed_b_index(k, t, j);
                assert_eq!(x, (j / nr) * k * nr + t * nr + j % nr);
                assert!(!std::mem::replace(&mut seen[x], true), "B slot {x} twice");
            }
        }
    }
}

#[test]
fn packed_batched_rejects_bad_arguments() {
    let g = Gemm::global().unwrap();
    let (m, n, k) = (7, 20, 5);
    let (al, bl) = (g.packed_a_len(m, k), g.packed_b_len(k, n));
    let a = vec![1.0f32; 2 * al];
    let b = vec![1.0f32; 2 * bl];
    let mut c = vec![0.0f32; 2 * m * n];
    // ldc < n.
    assert!(matches!(
        g.gemm_packed_batched(m, n, k, &a, al, &b, bl, 0.0, &mut c, n - 1, m * n, 2),
        Err(Error::LeadingDimension { arg: "ldc", .. })
    ));
    // A too short for the second product.
    assert!(matches!(
        g.gemm_packed_batched(
            m,
            n,
            k,
            &a[..2 * al - 1],
            al,
            &b,
            bl,
            0.0,
            &mut c,
            n,
            m * n,
            2
        ),
        Err(Error::SliceTooShort { arg: "a", .. })
    ));
    // B too short.
    assert!(matches!(
        g.gemm_packed_batched(m, n, k, &a, al, &b[..bl - 1], 0, 0.0, &mut c, n, m * n, 1),
        Err(Error::SliceTooShort { arg: "b", .. })
    ));
    // C too short.
    assert!(matches!(
        g.gemm_packed_batched(
            m,
            n,
            k,
            &a,
            al,
            &b,
            bl,
            0.0,
            &mut c[..2 * m * n - 1],
            n,
            m * n,
            2
        ),
        Err(Error::SliceTooShort { arg: "c", .. })
    ));
    // Overlapping outputs.
    assert!(matches!(
        g.gemm_packed_batched(m, n, k, &a, al, &b, bl, 0.0, &mut c, n, m * n - 1, 2),
        Err(Error::Stride {
            arg: "stride_c",
            ..
        })
    ));
    // Overflow.
    assert!(matches!(
        g.gemm_packed_batched(m, n, k, &a, usize::MAX, &b, bl, 0.0, &mut c, n, m * n, 2),
        Err(Error::Stride { arg: "a", .. })
    ));
    // Nothing to do: no error, nothing written, even with empty slices.
    let mut empty: [f32; 0] = [];
    g.gemm_packed_batched(m, n, k, &[], 0, &[], 0, 0.0, &mut empty, n, 0, 0)
        .unwrap();
    g.gemm_packed_batched(0, n, k, &[], 0, &[], 0, 0.0, &mut empty, n, 0, 3)
        .unwrap();
    // k = 0: zeros (beta = 0) or C scaled, operands never read.
    let mut c = vec![f32::NAN; m * n];
    g.gemm_packed_batched(m, n, 0, &[], 5, &[], 5, 0.0, &mut c, n, m * n, 1)
        .unwrap();
    assert!(c.iter().all(|&x| x == 0.0));
    let mut c = vec![3.0f32; m * n];
    g.gemm_packed_batched(m, n, 0, &[], 5, &[], 5, 0.5, &mut c, n, m * n, 1)
        .unwrap();
    assert!(c.iter().all(|&x| x == 1.5));
}

/// `pack_rows` against the index helpers on every family: A and B, row counts around the panel
/// widths, k around the 8 × 8 blocks, padded rows (ld > k), zeroed pad lanes, and an end-to-end
/// product through `gemm_packed_batched`.
#[test]
fn pack_rows_matches_the_panel_layout() {
    use core_blas::PackedOperand;
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.tile();
        for p in [1usize, 2, 5, 6, 7, 8, 9, 15, 16, 17, 33] {
            for k in [1usize, 3, 7, 8, 9, 16, 37] {
                for extra in [0usize, 5] {
                    let ld = k + extra;
                    let rows = random((p - 1) * ld + k, (p * 100 + k) as u64);
                    for op in [PackedOperand::A, PackedOperand::B] {
                        let (len, w) = match op {
                            PackedOperand::A => (g.packed_a_len(p, k), mr),
                            PackedOperand::B => (g.packed_b_len(k, p), nr),
                        };
                        let mut dst = vec![f32::NAN; len + 3];
                        g.pack_rows(op, p, k, &rows, ld, &mut dst).unwrap();
                        for i in 0..p.div_ceil(w) * w {
                            for t in 0..k {
                                let at = match op {
                                    PackedOperand::A => g.packed_a_index(k, i, t),
                                    PackedOperand::B => g.packed_b_index(k, t, i),
                                };
                                let want = if i < p { rows[i * ld + t] } else { 0.0 };
                                assert_eq!(
                                    dst[at].to_bits(),
                                    want.to_bits(),
                                    "{isa} {op:?} p {p} k {k} ld {ld}: row {i}, t {t}"
                                );
                            }
                        }
                        assert!(dst[len..].iter().all(|v| v.is_nan()), "wrote past the end");
                    }
                }
            }
        }
        // End to end: C = A · B with A and Bᵀ given as rows.
        let (m, n, k) = (13, 21, 19);
        let a = random(m * k, 1);
        let bt = random(n * k, 2);
        let mut ap = vec![0.0; g.packed_a_len(m, k)];
        let mut bp = vec![0.0; g.packed_b_len(k, n)];
        g.pack_rows(PackedOperand::A, m, k, &a, k, &mut ap).unwrap();
        g.pack_rows(PackedOperand::B, n, k, &bt, k, &mut bp)
            .unwrap();
        let mut c = vec![f32::NAN; m * n];
        g.gemm_packed_batched(m, n, k, &ap, 0, &bp, 0, 0.0, &mut c, n, 0, 1)
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|t| a[i * k + t] as f64 * bt[j * k + t] as f64)
                    .sum();
                assert!(
                    (c[i * n + j] as f64 - want).abs() < 1e-4,
                    "{isa} C[{i},{j}]"
                );
            }
        }
        // Errors.
        let rows = vec![0.0; 40];
        let mut dst = vec![0.0; g.packed_a_len(4, 10)];
        assert!(matches!(
            g.pack_rows(PackedOperand::A, 4, 10, &rows, 9, &mut dst),
            Err(Error::LeadingDimension { arg: "ld", .. })
        ));
        assert!(matches!(
            g.pack_rows(PackedOperand::A, 5, 10, &rows, 10, &mut dst),
            Err(Error::SliceTooShort { arg: "rows", .. })
        ));
        assert!(matches!(
            g.pack_rows(
                PackedOperand::A,
                4,
                10,
                &rows,
                10,
                &mut dst[..g.packed_a_len(4, 10) - 1]
            ),
            Err(Error::SliceTooShort { arg: "dst", .. })
        ));
        g.pack_rows(PackedOperand::B, 0, 10, &[], 0, &mut [])
            .unwrap();
    }
}

/// `count` row-major m × k matrices (`src`, stride m·k) laid out with leading dimension `lda`,
/// products `stride_a` apart; the gaps between rows and products NaN (must never be read).
fn rowa(src: &[f32], m: usize, k: usize, lda: usize, count: usize, stride_a: usize) -> Vec<f32> {
    let len = if count == 0 || m == 0 {
        0
    } else {
        (count - 1) * stride_a + (m - 1) * lda + k
    };
    let mut out = vec![f32::NAN; len];
    for p in 0..count {
        for i in 0..m {
            out[p * stride_a + i * lda..][..k].copy_from_slice(&src[p * m * k + i * k..][..k]);
        }
    }
    out
}

/// `gemm_rowa_batched` against the reference; C's other values against the sentinel.
fn check_rowa(g: &Gemm, m: usize, n: usize, k: usize, count: usize, lda: usize, beta: f32) {
    let (mr, nr) = g.tile();
    let seed = (m * 1_000_003 + n * 1009 + k * 7 + lda) as u64;
    let a_src = random(count.max(1) * m * k, seed);
    let b_src = random(count.max(1) * k * n, seed + 1);
    let stride_a = m * lda + 2;
    let stride_b = g.packed_b_len(k, n) + 5;
    let a = rowa(&a_src, m, k, lda, count, stride_a);
    let b = pack_b(g, &b_src, k, n, count, stride_b);
    let ldc = n + 3;
    let stride_c = m * ldc + 7;
    let c_len = count * stride_c + 4;
    let mut c = vec![SENTINEL; c_len];
    let c_init = random(c_len, seed + 2);
    for p in 0..count {
        for i in 0..m {
            for j in 0..n {
                let x = p * stride_c + i * ldc + j;
                c[x] = if beta == 0.0 { f32::NAN } else { c_init[x] };
            }
        }
    }
    let c0 = c.clone();
    g.gemm_rowa_batched(
        m, n, k, &a, lda, stride_a, &b, stride_b, beta, &mut c, ldc, stride_c, count,
    )
    .unwrap();
    let what = format!(
        "rowa {:?} {mr}x{nr} m={m} n={n} k={k} lda={lda} count={count} beta={beta}",
        g.isa()
    );
    for p in 0..count {
        let expect = reference(
            m,
            n,
            k,
            1.0,
            Strided {
                data: &a_src[p * m * k..],
                rs: k,
                cs: 1,
            },
            Strided {
                data: &b_src[p * k * n..],
                rs: n,
                cs: 1,
            },
            beta,
            Strided {
                data: &c0[p * stride_c..],
                rs: ldc,
                cs: 1,
            },
            GEMM_TOL,
        );
        assert_close(
            &format!("{what} product {p}"),
            Strided {
                data: &c[p * stride_c..],
                rs: ldc,
                cs: 1,
            },
            m,
            n,
            &expect,
        );
    }
    for (idx, &v) in c.iter().enumerate() {
        let (p, r) = (idx / stride_c, idx % stride_c);
        let inside = p < count && r / ldc < m && r % ldc < n;
        if !inside {
            assert_eq!(
                v.to_bits(),
                SENTINEL.to_bits(),
                "{what}: c[{idx}] overwritten"
            );
        }
    }
}

/// Row-major A read in place: every family, m around MR (every edge row count), n around NR and
/// 8 (narrow tiles), k around the 4-step unroll, padded rows (lda > k, NaN in the gaps), beta 0
/// over NaN / 1 / other, and fastconv's channels-last shapes.
#[test]
fn rowa_batched_matches_reference() {
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.tile();
        let ms = [1, 2, 3, mr - 1, mr, mr + 1, 2 * mr + 3, 32];
        let ns = [1, 7, 8, 9, nr - 1, nr, nr + 1, 37];
        for &m in &ms {
            for &n in &ns {
                for k in [1, 2, 5, 32] {
                    check_rowa(&g, m, n, k, 2, k, 0.0);
                }
                check_rowa(&g, m, n, 3, 2, 8, 1.0);
                check_rowa(&g, m, n, 4, 1, 5, -0.5);
            }
        }
        for k in [0, 1, 3, 4, 9, 80, 257] {
            for count in [0, 1, 3] {
                check_rowa(&g, 24, 32, k, count, k + 16, 0.0);
                check_rowa(&g, mr + 1, nr - 1, k, count, k + 1, 1.0);
            }
        }
        check_rowa(&g, 96, 32, 32, 81, 32, 0.0);
        check_rowa(&g, 48, 64, 64, 36, 64, 1.0);
        check_rowa(&g, 1, 1, 1, 5, 1, 0.0);
    }
}

#[test]
fn rowa_batched_rejects_bad_arguments() {
    let g = Gemm::global().unwrap();
    let (m, n, k) = (7, 20, 5);
    let lda = k;
    let (al, bl) = ((m - 1) * lda + k, g.packed_b_len(k, n));
    let a = vec![1.0f32; al + m * lda];
    let b = vec![1.0f32; 2 * bl];
    let mut c = vec![0.0f32; 2 * m * n];
    let sa = m * lda;
    assert!(matches!(
        g.gemm_rowa_batched(m, n, k, &a, k - 1, sa, &b, bl, 0.0, &mut c, n, m * n, 2),
        Err(Error::LeadingDimension { arg: "lda", .. })
    ));
    assert!(matches!(
        g.gemm_rowa_batched(m, n, k, &a, lda, sa, &b, bl, 0.0, &mut c, n - 1, m * n, 2),
        Err(Error::LeadingDimension { arg: "ldc", .. })
    ));
    assert!(matches!(
        g.gemm_rowa_batched(
            m,
            n,
            k,
            &a[..sa + al - 1],
            lda,
            sa,
            &b,
            bl,
            0.0,
            &mut c,
            n,
            m * n,
            2
        ),
        Err(Error::SliceTooShort { arg: "a", .. })
    ));
    assert!(matches!(
        g.gemm_rowa_batched(
            m,
            n,
            k,
            &a,
            lda,
            sa,
            &b[..bl - 1],
            0,
            0.0,
            &mut c,
            n,
            m * n,
            1
        ),
        Err(Error::SliceTooShort { arg: "b", .. })
    ));
    assert!(matches!(
        g.gemm_rowa_batched(
            m,
            n,
            k,
            &a,
            lda,
            sa,
            &b,
            bl,
            0.0,
            &mut c[..2 * m * n - 1],
            n,
            m * n,
            2
        ),
        Err(Error::SliceTooShort { arg: "c", .. })
    ));
    assert!(matches!(
        g.gemm_rowa_batched(m, n, k, &a, lda, sa, &b, bl, 0.0, &mut c, n, m * n - 1, 2),
        Err(Error::Stride {
            arg: "stride_c",
            ..
        })
    ));
    assert!(matches!(
        g.gemm_rowa_batched(
            m,
            n,
            k,
            &a,
            lda,
            usize::MAX,
            &b,
            bl,
            0.0,
            &mut c,
            n,
            m * n,
            2
        ),
        Err(Error::Stride { arg: "a", .. })
    ));
    // One row: lda is irrelevant.
    let mut c1 = vec![f32::NAN; n];
    g.gemm_rowa_batched(1, n, k, &a[..k], 0, 0, &b, 0, 0.0, &mut c1, n, n, 1)
        .unwrap();
    assert!(c1.iter().all(|&x| x == k as f32));
    let mut empty: [f32; 0] = [];
    g.gemm_rowa_batched(m, n, k, &[], lda, 0, &[], 0, 0.0, &mut empty, n, 0, 0)
        .unwrap();
    let mut c = vec![f32::NAN; m * n];
    g.gemm_rowa_batched(m, n, 0, &[], lda, 5, &[], 5, 0.0, &mut c, n, m * n, 1)
        .unwrap();
    assert!(c.iter().all(|&x| x == 0.0));
    // The free function uses the process-wide family.
    let mut c2 = vec![f32::NAN; m * n];
    core_blas::gemm_rowa_batched(m, n, k, &a, lda, sa, &b, bl, 0.0, &mut c2, n, m * n, 1).unwrap();
    assert!(c2.iter().all(|&x| x == k as f32));
}
