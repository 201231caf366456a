//! Correctness of every kernel family the host supports against a naive reference: edge shapes,
//! transposes, alpha/beta (beta = 0 over NaN), strided views, k = 0, threads, batched products,
//! errors; and the BLIS projection check for large products.

mod common;

use common::{GEMM_TOL, Strided, assert_close, random, reference};
use core_blas::{BlockSizes, Error, Gemm, Isa, MatMut, MatRef};

/// One context per family under test (see `common::families`), plus one with tiny blocks so that the KC, MC and NC
/// loops all take several trips even on small shapes.
fn contexts() -> Vec<Gemm> {
    let mut out = Vec::new();
    for isa in common::families() {
        let g = Gemm::new(isa).unwrap();
        let (mr, nr) = g.tile();
        out.push(g);
        out.push(
            g.with_block_sizes(BlockSizes {
                mc: 2 * mr,
                kc: 7,
                nc: 2 * nr,
            })
            .unwrap(),
        );
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn check_sgemm(
    g: &Gemm,
    ta: bool,
    tb: bool,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    seed: u64,
) {
    let (lda, ldb, ldc) = (
        if ta { m } else { k } + 3,
        if tb { k } else { n } + 1,
        n + 2,
    );
    let a = random(lda * if ta { k } else { m }.max(1), seed);
    let b = random(ldb * if tb { n } else { k }.max(1), seed + 1);
    let mut c = if beta == 0.0 {
        vec![f32::NAN; ldc * m.max(1)]
    } else {
        random(ldc * m.max(1), seed + 2)
    };
    let c0 = c.clone();
    let av = if ta {
        Strided {
            data: &a,
            rs: 1,
            cs: lda,
        }
    } else {
        Strided {
            data: &a,
            rs: lda,
            cs: 1,
        }
    };
    let bv = if tb {
        Strided {
            data: &b,
            rs: 1,
            cs: ldb,
        }
    } else {
        Strided {
            data: &b,
            rs: ldb,
            cs: 1,
        }
    };
    let expect = reference(
        m,
        n,
        k,
        alpha,
        av,
        bv,
        beta,
        Strided {
            data: &c0,
            rs: ldc,
            cs: 1,
        },
        GEMM_TOL,
    );
    g.sgemm(ta, tb, m, n, k, alpha, &a, lda, &b, ldb, beta, &mut c, ldc)
        .unwrap();
    let what = format!(
        "{} {m}x{n}x{k} ta={ta} tb={tb} alpha={alpha} beta={beta} {:?}",
        g.kernel_name(),
        g.block_sizes()
    );
    assert_close(
        &what,
        Strided {
            data: &c,
            rs: ldc,
            cs: 1,
        },
        m,
        n,
        &expect,
    );
    // Padding between rows of C is untouched.
    for i in 0..m {
        for j in n..ldc {
            let idx = i * ldc + j;
            if idx < c.len() {
                assert!(
                    c[idx].to_bits() == c0[idx].to_bits(),
                    "{what}: padding C[{i},{j}] changed"
                );
            }
        }
    }
}

#[test]
fn every_family_edge_shapes() {
    for g in contexts() {
        let (mr, nr) = g.tile();
        let kc = g.block_sizes().kc;
        let ms = [1, 2, mr - 1, mr, mr + 1, 2 * mr + 3, 13, 37];
        let ns = [1, nr - 1, nr, nr + 1, 2 * nr + 5, 17, 41];
        let ks = [0, 1, 2, 7, 31, kc - 1, kc, kc + 1];
        let mut seed = 0;
        for &m in &ms {
            for &n in &ns {
                for &k in &ks {
                    seed += 3;
                    let (ta, tb) = ((seed / 3) % 2 == 1, (seed / 6) % 2 == 1);
                    check_sgemm(&g, ta, tb, m, n, k, 1.0, 0.0, seed);
                }
            }
        }
    }
}

/// Every edge-tile height (m mod MR = 1 .. MR − 1, served by the families' edge kernels) and
/// width, with alpha and beta (0 over NaN, 1, other), row- and column-major A, strided C rows.
#[test]
fn every_edge_tile_height() {
    for g in contexts() {
        let (mr, nr) = g.tile();
        let mut seed = 7000;
        for m in 1..=2 * mr + 1 {
            for &n in &[1, nr - 1, nr, 2 * nr + 3] {
                for &k in &[1, 4, 5, 33] {
                    for &(alpha, beta) in &[(1.0, 0.0), (-0.75, 1.0), (1.5, 0.5)] {
                        seed += 3;
                        check_sgemm(&g, seed % 2 == 0, false, m, n, k, alpha, beta, seed);
                    }
                }
            }
        }
    }
}

/// Whatever `CORE_BLAS_ISA` says, a plain `cargo test` covers every family the host supports.
#[test]
fn every_host_family_explicitly() {
    for isa in Isa::available() {
        let g = Gemm::new(isa).unwrap();
        assert_eq!(g.kernel_name(), isa.kernel_name().unwrap());
        let (mr, nr) = g.tile();
        let kc = g.block_sizes().kc;
        let mut seed = 5000;
        for &(m, n, k) in &[
            (mr + 1, nr - 1, kc + 1),
            (mr - 1, nr + 1, kc - 1),
            (1, 1, 1),
            (97, 89, 83),
            (200, 3, 7),
        ] {
            for (ta, tb) in [(false, false), (true, true)] {
                seed += 1;
                check_sgemm(&g, ta, tb, m, n, k, 1.0, 0.0, seed);
                check_sgemm(&g, tb, ta, m, n, k, -2.0, 0.5, seed + 100);
            }
        }
    }
}

#[test]
fn every_family_transposes_alpha_beta() {
    for g in contexts() {
        let mut seed = 1000;
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for (alpha, beta) in [
                (1.0, 0.0),
                (1.0, 1.0),
                (-0.5, 2.0),
                (2.5, 0.0),
                (0.0, 0.5),
                (0.0, 0.0),
                (1.0, -1.0),
            ] {
                for &(m, n, k) in &[
                    (29, 53, 41),
                    (64, 3, 100),
                    (3, 97, 5),
                    (101, 67, 300),
                    (1, 1, 1),
                ] {
                    seed += 7;
                    check_sgemm(&g, ta, tb, m, n, k, alpha, beta, seed);
                }
            }
        }
    }
}

#[test]
fn zero_sizes() {
    for g in contexts() {
        for (m, n, k) in [(0, 5, 3), (4, 0, 3), (0, 0, 0), (3, 4, 0)] {
            check_sgemm(&g, false, false, m, n, k, 1.0, 0.5, 7);
            check_sgemm(&g, true, true, m, n, k, 1.0, 0.0, 8);
        }
    }
}

#[test]
fn tall_skinny_and_primes() {
    for g in contexts() {
        for &(m, n, k) in &[
            (1013, 3, 17),
            (2, 997, 31),
            (5, 7, 1031),
            (257, 1, 263),
            (1, 509, 1),
        ] {
            check_sgemm(&g, false, false, m, n, k, 1.0, 0.0, (m * n + k) as u64);
            check_sgemm(&g, true, false, m, n, k, 0.75, 1.0, (m + n * k) as u64);
        }
    }
}

/// One A block (m <= MC) and several B blocks along n and k: A is packed once for all of k and
/// reused for every column block. Default block sizes (k = 600: three passes, n = 2500: several
/// column blocks) and tiny forced ones, both transposes of A, beta 0 and 1.
#[test]
fn one_a_block_reused_across_column_blocks() {
    for g in contexts() {
        check_sgemm(&g, false, false, 13, 2500, 600, 1.0, 0.0, 71);
        check_sgemm(&g, true, false, 13, 2500, 600, 0.75, 1.0, 72);
        let small = g
            .with_block_sizes(BlockSizes {
                mc: 24,
                kc: 16,
                nc: 32,
            })
            .unwrap();
        for &(m, n, k) in &[(20, 150, 50), (1, 97, 33), (24, 64, 16), (7, 33, 47)] {
            check_sgemm(&small, false, false, m, n, k, 1.0, 0.0, (m + n + k) as u64);
            check_sgemm(&small, true, true, m, n, k, -0.5, 1.0, (m * n + k) as u64);
        }
    }
}

/// Arbitrary strides on all three views, including column-major C and non-unit strides on both
/// dimensions.
#[test]
fn strided_views() {
    for g in contexts() {
        for &(m, n, k) in &[(19, 35, 23), (40, 9, 70), (8, 64, 1)] {
            for (ars, acs, brs, bcs, crs, ccs) in [
                (k + 1, 1, n, 1, 1, m + 2),             // column-major C
                (1, m + 4, 1, k, n * 2 + 1, 2),         // A, B column-major, C with gaps
                (2 * k + 3, 2, 3, 3 * k + 1, 3 * n, 3), // everything strided
            ] {
                let a = random((m - 1) * ars + (k - 1) * acs + 1, 11);
                let b = random((k - 1) * brs + (n - 1) * bcs + 1, 12);
                let clen = (m - 1) * crs + (n - 1) * ccs + 1;
                let mut c = random(clen, 13);
                let c0 = c.clone();
                let (alpha, beta) = (0.5, -1.5);
                let expect = reference(
                    m,
                    n,
                    k,
                    alpha,
                    Strided {
                        data: &a,
                        rs: ars,
                        cs: acs,
                    },
                    Strided {
                        data: &b,
                        rs: brs,
                        cs: bcs,
                    },
                    beta,
                    Strided {
                        data: &c0,
                        rs: crs,
                        cs: ccs,
                    },
                    GEMM_TOL,
                );
                let av = MatRef::new("a", &a, m, k, ars, acs).unwrap();
                let bv = MatRef::new("b", &b, k, n, brs, bcs).unwrap();
                let cv = MatMut::new("c", &mut c, m, n, crs, ccs).unwrap();
                g.gemm(alpha, av, bv, beta, cv).unwrap();
                let what = format!("{} strided {m}x{n}x{k}", g.kernel_name());
                assert_close(
                    &what,
                    Strided {
                        data: &c,
                        rs: crs,
                        cs: ccs,
                    },
                    m,
                    n,
                    &expect,
                );
            }
        }
    }
}

/// Multi-threaded products (a 2- and 3-thread pool) against the reference: the thread grid must
/// cover C exactly once for every split.
#[test]
fn threads_cover_c_exactly_once() {
    for threads in [2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            for g in contexts() {
                for &(m, n, k) in &[
                    (150, 170, 100),
                    (13, 2001, 90),
                    (1999, 9, 130),
                    (257, 263, 64),
                ] {
                    check_sgemm(&g, false, false, m, n, k, 1.0, 0.0, 77);
                    check_sgemm(&g, true, true, m, n, k, -1.0, 0.5, 78);
                }
            }
        });
    }
}

/// The BLIS projection check for large products: `C·t` against `(beta·C0 + alpha·A·B)·t` for a
/// random vector t, O(n²) work. The bound is the dot-product error bound on |A|·|B|·|t|.
#[test]
fn projection_check_large() {
    let (m, n, k) = (523, 611, 777);
    let a = random(m * k, 21);
    let b = random(k * n, 22);
    let t = random(n, 23);
    let c0 = random(m * n, 24);
    let (alpha, beta) = (0.7, 0.3);
    // B·t and |B|·|t| in f64.
    let mut bt = vec![0.0f64; k];
    let mut bt_abs = vec![0.0f64; k];
    for p in 0..k {
        for j in 0..n {
            bt[p] += b[p * n + j] as f64 * t[j] as f64;
            bt_abs[p] += (b[p * n + j] as f64 * t[j] as f64).abs();
        }
    }
    for g in contexts() {
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut c = c0.clone();
            pool.install(|| g.sgemm(false, false, m, n, k, alpha, &a, k, &b, n, beta, &mut c, n))
                .unwrap();
            for i in 0..m {
                let (mut want, mut scale) = (0.0f64, 0.0f64);
                for p in 0..k {
                    want += alpha as f64 * a[i * k + p] as f64 * bt[p];
                    scale += (alpha as f64 * a[i * k + p] as f64).abs() * bt_abs[p];
                }
                for j in 0..n {
                    want += beta as f64 * c0[i * n + j] as f64 * t[j] as f64;
                    scale += (beta as f64 * c0[i * n + j] as f64 * t[j] as f64).abs();
                }
                let got: f64 = (0..n).map(|j| c[i * n + j] as f64 * t[j] as f64).sum();
                let bound = (k as f64 + 3.0) * 2.0 * f32::EPSILON as f64 * scale + 1e-6;
                assert!(
                    (got - want).abs() <= bound,
                    "{} t={threads}: row {i}: {got} vs {want} ± {bound}",
                    g.kernel_name()
                );
            }
        }
    }
}

#[test]
fn batched_matches_a_loop_of_products() {
    for g in contexts() {
        for &(m, n, k, batch) in &[
            (16, 64, 32, 36),
            (5, 7, 3, 3),
            (64, 196, 64, 16),
            (0, 3, 3, 2),
        ] {
            let (lda, ldb, ldc) = (k, n, n);
            let (sa, sb, sc) = (m * k + 5, k * n + 1, m * n + 3);
            let a = random(sa * batch, 31);
            let b = random(sb * batch, 32);
            let mut c = vec![f32::NAN; sc * batch];
            g.sgemm_batched(
                false, false, m, n, k, 1.0, &a, lda, sa, &b, ldb, sb, 0.0, &mut c, ldc, sc, batch,
            )
            .unwrap();
            for p in 0..batch {
                let expect = reference(
                    m,
                    n,
                    k,
                    1.0,
                    Strided {
                        data: &a[p * sa..],
                        rs: lda,
                        cs: 1,
                    },
                    Strided {
                        data: &b[p * sb..],
                        rs: ldb,
                        cs: 1,
                    },
                    0.0,
                    Strided {
                        data: &c[p * sc..],
                        rs: ldc,
                        cs: 1,
                    },
                    GEMM_TOL,
                );
                assert_close(
                    &format!("{} batch {p}", g.kernel_name()),
                    Strided {
                        data: &c[p * sc..],
                        rs: ldc,
                        cs: 1,
                    },
                    m,
                    n,
                    &expect,
                );
            }
        }
    }
}

#[test]
fn errors_name_the_argument() {
    let g = Gemm::new(Isa::Scalar).unwrap();
    let a = vec![0.0; 12];
    let b = vec![0.0; 12];
    let mut c = vec![0.0; 12];
    let e = g
        .sgemm(false, false, 3, 4, 4, 1.0, &a, 3, &b, 4, 0.0, &mut c, 4)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LeadingDimension {
                arg: "lda",
                value: 3,
                min: 4
            }
        ),
        "{e}"
    );
    let e = g
        .sgemm(false, false, 3, 4, 4, 1.0, &a, 4, &b, 4, 0.0, &mut c, 4)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::SliceTooShort {
                arg: "b",
                len: 12,
                needed: 16
            }
        ),
        "{e}"
    );
    let e = g
        .sgemm(false, true, 3, 4, 3, 1.0, &a, 3, &b, 2, 0.0, &mut c, 4)
        .unwrap_err();
    assert!(
        matches!(e, Error::LeadingDimension { arg: "ldb", .. }),
        "{e}"
    );
    let e = g
        .sgemm(false, false, 4, 4, 3, 1.0, &a, 3, &b, 4, 0.0, &mut c, 4)
        .unwrap_err();
    assert!(matches!(e, Error::SliceTooShort { arg: "c", .. }), "{e}");
    let e = g
        .sgemm(false, false, 3, 4, 3, 1.0, &a, 3, &b, 4, 0.0, &mut c, 3)
        .unwrap_err();
    assert!(
        matches!(e, Error::LeadingDimension { arg: "ldc", .. }),
        "{e}"
    );
    // Aliasing strides on an output view.
    let e = MatMut::new("c", &mut c, 3, 3, 1, 1).unwrap_err();
    assert!(matches!(e, Error::Stride { arg: "c", .. }), "{e}");
    // Inner dimensions disagree.
    let av = MatRef::row_major("a", &a, 3, 4, 4).unwrap();
    let bv = MatRef::row_major("b", &b, 3, 4, 4).unwrap();
    let cv = MatMut::row_major("c", &mut c, 3, 4, 4).unwrap();
    let e = g.gemm(1.0, av, bv, 0.0, cv).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { arg: "b", .. }), "{e}");
    // Overlapping batched outputs.
    let e = g
        .sgemm_batched(
            false, false, 2, 2, 2, 1.0, &a, 2, 4, &b, 2, 4, 0.0, &mut c, 2, 3, 3,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Stride {
                arg: "stride_c",
                ..
            }
        ),
        "{e}"
    );
    // Block sizes.
    assert!(matches!(
        g.with_block_sizes(BlockSizes {
            mc: 0,
            kc: 1,
            nc: 1
        }),
        Err(Error::BlockSize { arg: "mc", .. })
    ));
    assert!(matches!(
        Isa::from_name("sse9"),
        Err(Error::UnknownIsa { .. })
    ));
}

#[test]
fn neon_is_never_available_here() {
    // No NEON family is built; forcing it must fail loudly, never fall back silently.
    assert!(!Isa::Neon.is_available());
    assert!(matches!(
        Gemm::new(Isa::Neon),
        Err(Error::IsaUnavailable {
            requested: "neon",
            ..
        })
    ));
}

/// The free functions run whatever `CORE_BLAS_ISA` selects (xtask re-runs the suite per family).
#[test]
fn global_follows_core_blas_isa() {
    match std::env::var("CORE_BLAS_ISA") {
        Ok(name) if !name.trim().is_empty() => {
            let isa = Isa::from_name(&name).unwrap();
            if isa.is_available() {
                assert_eq!(core_blas::isa().unwrap(), isa.kernel_name().unwrap());
            } else {
                assert!(matches!(
                    core_blas::isa(),
                    Err(Error::IsaUnavailable { .. })
                ));
                return;
            }
        }
        _ => assert_eq!(
            core_blas::isa().unwrap(),
            Isa::available().last().unwrap().kernel_name().unwrap()
        ),
    }
    let (m, n, k) = (37, 45, 29);
    let a = random(m * k, 1);
    let b = random(k * n, 2);
    let mut c = vec![f32::NAN; m * n];
    core_blas::sgemm(false, false, m, n, k, 1.0, &a, k, &b, n, 0.0, &mut c, n).unwrap();
    let expect = reference(
        m,
        n,
        k,
        1.0,
        Strided {
            data: &a,
            rs: k,
            cs: 1,
        },
        Strided {
            data: &b,
            rs: n,
            cs: 1,
        },
        0.0,
        Strided {
            data: &c,
            rs: n,
            cs: 1,
        },
        GEMM_TOL,
    );
    assert_close(
        "global",
        Strided {
            data: &c,
            rs: n,
            cs: 1,
        },
        m,
        n,
        &expect,
    );
}
