//! Tuning probe (not a benchmark): `SmallA::apply_strided` on fastconv's Winograd matrices (the
//! f32 values fastconv's `points::transform_for` produced at 23:05 UTC), X and Y hot in cache, one
//! thread, best of 5 rounds on the thread's CPU clock:
//! `cargo run --release -p core-blas --example small_a`.

const BT_64: [f32; 81] = [
    0.140625,
    0.140625,
    -2.5351563,
    -2.5351563,
    4.625,
    4.625,
    -1.0,
    -1.0,
    0.0,
    0.140625,
    -0.140625,
    -2.5351563,
    2.5351563,
    4.625,
    -4.625,
    -1.0,
    1.0,
    0.0,
    -0.0703125,
    -0.03515625,
    1.3203125,
    0.66015625,
    -3.25,
    -1.625,
    2.0,
    1.0,
    0.0,
    0.0703125,
    -0.03515625,
    -1.3203125,
    0.66015625,
    3.25,
    -1.625,
    -2.0,
    1.0,
    0.0,
    -0.5625,
    -2.25,
    1.703125,
    6.8125,
    -1.390625,
    -5.5625,
    0.25,
    1.0,
    0.0,
    0.5625,
    -2.25,
    -1.703125,
    6.8125,
    1.390625,
    -5.5625,
    -0.25,
    1.0,
    0.0,
    -0.1875,
    -0.25,
    3.234375,
    4.3125,
    -3.796875,
    -5.0625,
    0.75,
    1.0,
    0.0,
    0.1875,
    -0.25,
    -3.234375,
    4.3125,
    3.796875,
    -5.0625,
    -0.75,
    1.0,
    0.0,
    0.140625,
    0.0,
    -2.6757813,
    0.0,
    7.1601563,
    0.0,
    -5.625,
    0.0,
    1.0,
];
const AT_64: [f32; 54] = [
    1.0,
    1.0,
    1.0,
    1.0,
    1.0,
    1.0,
    1.0,
    1.0,
    0.0,
    1.0,
    -1.0,
    2.0,
    -2.0,
    0.25,
    -0.25,
    0.75,
    -0.75,
    0.0,
    1.0,
    1.0,
    4.0,
    4.0,
    0.0625,
    0.0625,
    0.5625,
    0.5625,
    0.0,
    1.0,
    -1.0,
    8.0,
    -8.0,
    0.015625,
    -0.015625,
    0.421875,
    -0.421875,
    0.0,
    1.0,
    1.0,
    16.0,
    16.0,
    0.00390625,
    0.00390625,
    0.31640625,
    0.31640625,
    0.0,
    1.0,
    -1.0,
    32.0,
    -32.0,
    0.0009765625,
    -0.0009765625,
    0.23730469,
    -0.23730469,
    1.0,
];
const BT_43: [f32; 36] = [
    1.0, 0.0, -2.3402777, 0.0, 1.0, 0.0, 0.0, -1.3333334, -1.7777778, 0.75, 1.0, 0.0, 0.0,
    1.3333334, -1.7777778, -0.75, 1.0, 0.0, 0.0, -0.75, -0.5625, 1.3333334, 1.0, 0.0, 0.0, 0.75,
    -0.5625, -1.3333334, 1.0, 0.0, 0.0, 1.0, 0.0, -2.3402777, 0.0, 1.0,
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mats: [(&str, &[f32], usize, usize); 3] = [
        ("F(6,4) Bt 9x9", &BT_64, 9, 9),
        ("F(6,4) At 6x9", &AT_64, 6, 9),
        ("F(4,3) Bt 6x6", &BT_43, 6, 6),
    ];
    // SMALL_A_ONLY="<matrix index> <n> <seconds>": loop one case (for perf).
    if let Ok(spec) = std::env::var("SMALL_A_ONLY") {
        let v: Vec<f64> = spec
            .split_whitespace()
            .map(|s| s.parse().unwrap_or(0.0))
            .collect();
        let (name, a, p, q) = mats[v[0] as usize];
        let n = v[1] as usize;
        let sa = core_blas::SmallA::new(a, p, q)?;
        // SMALL_A_MISALIGN=k: X and Y start k floats past a 64-byte boundary.
        let mis: usize = std::env::var("SMALL_A_MISALIGN")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut xb = vec![0.0f32; q * n + 32];
        let mut yb = vec![0.0f32; p * n + 32];
        let xo = (16 - (xb.as_ptr() as usize / 4) % 16) % 16 + mis;
        let yo = (16 - (yb.as_ptr() as usize / 4) % 16) % 16 + mis;
        for (i, v) in xb[xo..xo + q * n].iter_mut().enumerate() {
            *v = (i % 13) as f32 * 0.1 - 0.6;
        }
        let x = &xb[xo..xo + q * n];
        let y = &mut yb[yo..yo + p * n];
        let t = cpu_time::ThreadTime::now();
        let mut calls = 0u64;
        while t.elapsed().as_secs_f64() < v[2] {
            for _ in 0..1000 {
                sa.apply_strided(n, x, n, y, n)?;
            }
            calls += 1000;
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / calls as f64;
        println!(
            "{name} n {n}: {ns:.1} ns/call, {:.3} ns/output",
            ns / (p * n) as f64
        );
        return Ok(());
    }
    for (name, a, p, q) in mats {
        for form in ["new", "unpaired"] {
            let sa = if form == "new" {
                core_blas::SmallA::new(a, p, q)?
            } else {
                core_blas::SmallA::unpaired(a, p, q)?
            };
            let name = format!(
                "{name} {form}{}",
                if sa.column_paired() {
                    " (column-paired)"
                } else {
                    ""
                }
            );
            for n in [37usize, 80, 400, 3600] {
                let ld = n;
                let x: Vec<f32> = (0..q * ld).map(|i| (i % 13) as f32 * 0.1 - 0.6).collect();
                let mut y = vec![0.0f32; p * ld];
                let calls = (4_000_000 / (n * p)).max(100);
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t = cpu_time::ThreadTime::now();
                    for _ in 0..calls {
                        sa.apply_strided(n, &x, ld, &mut y, ld)?;
                    }
                    best = best.min(t.elapsed().as_secs_f64() * 1e9 / calls as f64);
                }
                println!(
                    "{name} n {n:5}: {best:8.1} ns/call, {:.3} ns/output",
                    best / (p * n) as f64
                );
            }
        }
    }
    Ok(())
}
