//! A one-pass product that writes a C larger than L2 (on Intel's AVX-512 family: full tiles
//! streamed to C by non-temporal stores, source rows 4 KiB apart: no panel-ahead prefetch)
//! against a naive product, on 1 and 2 threads, with C's rows on and off cache lines, over NaN
//! (beta = 0 must not read C).

fn check(n: usize, c_off: usize, threads: usize) {
    let (m, k) = (16, 20);
    let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let mut c = vec![f32::NAN; m * n + c_off];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    pool.install(|| {
        core_blas::sgemm(
            false,
            false,
            m,
            n,
            k,
            1.0,
            &a,
            k,
            &b,
            n,
            0.0,
            &mut c[c_off..],
            n,
        )
    })
    .expect("valid sgemm");
    for i in 0..m {
        for j in 0..n {
            // Small integers: exact in any order of summation.
            let want: f32 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            assert_eq!(
                c[c_off + i * n + j],
                want,
                "n {n} off {c_off} t {threads} at ({i}, {j})"
            );
        }
    }
}

#[test]
fn one_pass_product_larger_than_l2_matches_naive() {
    // 16 × 40960 floats: 2.6 MB of C, rows 160 KiB apart.
    for threads in [1, 2] {
        for c_off in [0, 1] {
            check(40960, c_off, threads);
        }
    }
}
