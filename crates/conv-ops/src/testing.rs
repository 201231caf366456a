//! Helpers for testing convolution algorithms against the [`reference`](crate::reference):
//! a tolerance type and seeded test data. Public so that `fastconv` and `nn` test the same way.

/// An error bound `|got − want| ≤ abs + rel · scale`, where `scale` is the largest magnitude of
/// the reference result (errors of a sum of products grow with its largest terms, not with each
/// element, so a per-element relative bound would reject correct results near zero).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Relative part, multiplied by `max |want|`.
    pub rel: f64,
    /// Absolute part.
    pub abs: f64,
}

impl Tolerance {
    /// A bound for f32 sums of `terms` products of values in [−1, 1], accumulated in any order:
    /// the worst case grows like `terms · ε` but random rounding grows like `√terms · ε`; we allow
    /// `8·√terms·ε` relative to the largest result plus a small absolute floor.
    pub fn for_f32_sum(terms: usize) -> Self {
        let eps = f32::EPSILON as f64;
        Tolerance {
            rel: 8.0 * (terms.max(1) as f64).sqrt() * eps,
            abs: 1e-6,
        }
    }

    /// Checks `got` against `want`; on failure the message names the first offending element.
    pub fn check(&self, what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
        if got.len() != want.len() {
            return Err(format!("{what}: length {} != {}", got.len(), want.len()));
        }
        let scale = want.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
        let bound = self.abs + self.rel * scale;
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let err = (g as f64 - w as f64).abs();
            // NaN fails too: `err <= bound` is false for it.
            if err.is_nan() || err > bound {
                return Err(format!(
                    "{what}[{i}]: got {g}, want {w}, |error| {err:.3e} > bound {bound:.3e} \
                     (rel {:.1e} · max|want| {scale:.3e} + abs {:.1e})",
                    self.rel, self.abs
                ));
            }
        }
        Ok(())
    }
}

/// The largest error of `got` relative to `max |want|` (the measure used in error tables).
pub fn max_rel_error(got: &[f32], want: &[f64]) -> f64 {
    let scale = want
        .iter()
        .fold(0f64, |m, &v| m.max(v.abs()))
        .max(f64::MIN_POSITIVE);
    got.iter()
        .zip(want)
        .fold(0f64, |m, (&g, &w)| m.max((g as f64 - w).abs()))
        / scale
}

/// `len` values uniform in [−1, 1) from a seeded SplitMix64 stream: reproducible test data
/// without a dependency.
pub fn uniform(seed: u64, len: usize) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Checks the forward algorithm `algo` on `g`, with a bias and the fused ReLU, against the
/// [`reference`](crate::reference) on rayon pools of 1 to `max_threads` threads: seeded data
/// ([`uniform`] seeds 1, 2, 3 for x, w and the bias), y filled with NaN first (so unwritten
/// outputs fail), and [`Tolerance::for_f32_sum`] over one output's terms. The error names the
/// geometry and the thread count.
pub fn check_forward_bias_relu(
    g: &crate::ConvGeometry,
    algo: crate::ForwardAlgo,
    max_threads: usize,
) -> Result<(), String> {
    let (x, w) = (uniform(1, g.x_len()), uniform(2, g.w_len()));
    let bias = uniform(3, g.out_channels());
    let mut want = vec![0f32; g.y_len()];
    crate::reference::forward(g, &x, &w, Some(&bias), &mut want).map_err(|e| e.to_string())?;
    want.iter_mut().for_each(|v| *v = v.max(0.0));
    for threads in 1..=max_threads {
        let what = format!("{g:?} {algo:?} {threads} threads");
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| format!("{what}: {e}"))?;
        let mut y = vec![f32::NAN; g.y_len()];
        pool.install(|| {
            let ws = &mut crate::Workspace::new(false);
            crate::forward(g, &x, &w, Some(&bias), true, &mut y, algo, ws)
        })
        .map_err(|e| format!("{what}: {e}"))?;
        Tolerance::for_f32_sum(g.in_channels_per_group() * g.kernel_len())
            .check(&what, &y, &want)?;
    }
    Ok(())
}

/// ⟨a, b⟩ accumulated in f64.
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_range_and_seeded() {
        let a = uniform(7, 1000);
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
        assert_eq!(a, uniform(7, 1000));
        assert_ne!(a, uniform(8, 1000));
        let mean = a.iter().sum::<f32>() / 1000.0;
        assert!(mean.abs() < 0.1, "mean {mean}");
    }

    #[test]
    fn tolerance_rejects_and_names() {
        let t = Tolerance {
            rel: 1e-3,
            abs: 0.0,
        };
        assert!(t.check("y", &[1.0, 2.0], &[1.0, 2.001]).is_ok());
        let e = t.check("y", &[1.0, 2.1], &[1.0, 2.0]).unwrap_err();
        assert!(e.starts_with("y[1]"), "{e}");
        assert!(t.check("y", &[f32::NAN], &[1.0]).is_err());
    }
}
