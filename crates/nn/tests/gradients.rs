//! Every layer's gradients against central finite differences of a random linear functional
//! L = Σ r ⊙ layer(x): directional derivatives along random directions, for the input and for
//! every parameter, on odd sizes, strides, padding, 1D/2D/3D and every convolution algorithm.

use nn::{
    AdaptiveAvgPool, BasicBlock, BatchNorm, Conv, ConvAlgo, ConvConfig, Dropout, Flatten,
    GlobalAvgPool, Layer, Linear, MaxPool, Relu, Sequential, Tensor, cross_entropy,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn random(shape: &[usize], rng: &mut SmallRng) -> Tensor {
    let n = shape.iter().product();
    Tensor::new(
        shape,
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
    )
    .unwrap()
}

/// Distinct values at least 0.05 apart and at least 0.025 from 0, so a perturbation of ±0.01
/// never changes which input of a pooling window wins nor the sign a ReLU sees.
fn separated(shape: &[usize], rng: &mut SmallRng) -> Tensor {
    use rand::seq::SliceRandom;
    let n: usize = shape.iter().product();
    let mut v: Vec<f32> = (0..n)
        .map(|i| (i as f32 - n as f32 / 2.0 + 0.5) * 0.05)
        .collect();
    v.shuffle(rng);
    Tensor::new(shape, v).unwrap()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// L(x) = ⟨r, layer(x)⟩ in training mode (batch norm normalises with the batch's statistics,
/// the function backward differentiates).
fn functional(layer: &mut dyn Layer, x: &Tensor, r: &Tensor) -> f64 {
    let y = layer.forward(x.clone(), true).unwrap();
    dot(y.data(), r.data())
}

fn close(what: &str, numeric: f64, analytic: f64, scale: f64) {
    let tol = 2e-3 * scale + 1e-3 * analytic.abs();
    assert!(
        (numeric - analytic).abs() <= tol,
        "{what}: finite difference {numeric} vs backward {analytic} (tolerance {tol})"
    );
}

/// Checks input and parameter gradients of `layer` at `x`.
fn check(layer: &mut dyn Layer, x: Tensor, seed: u64) {
    let rng = &mut SmallRng::seed_from_u64(seed);
    let name = layer.describe();
    let y = layer.forward(x.clone(), true).unwrap();
    let r = random(y.shape(), rng);
    let dx = layer
        .backward(r.clone(), true)
        .unwrap()
        .expect("dx requested");
    assert_eq!(dx.shape(), x.shape(), "{name}: dx shape");
    let grads: Vec<Tensor> = layer.params().iter().map(|(_, p)| p.grad.clone()).collect();
    let eps = 1e-2f32;
    for trial in 0..3 {
        // Input.
        let d = random(x.shape(), rng);
        let plus = Tensor::new(
            x.shape(),
            x.data()
                .iter()
                .zip(d.data())
                .map(|(a, b)| a + eps * b)
                .collect(),
        )
        .unwrap();
        let minus = Tensor::new(
            x.shape(),
            x.data()
                .iter()
                .zip(d.data())
                .map(|(a, b)| a - eps * b)
                .collect(),
        )
        .unwrap();
        let numeric =
            (functional(layer, &plus, &r) - functional(layer, &minus, &r)) / (2.0 * eps as f64);
        let scale = (dot(dx.data(), dx.data()) * dot(d.data(), d.data())).sqrt();
        close(
            &format!("{name} dx, direction {trial}"),
            numeric,
            dot(dx.data(), d.data()),
            scale,
        );
        // Parameters.
        for (pi, g) in grads.iter().enumerate() {
            let d = random(g.shape(), rng);
            let at = |sign: f32, layer: &mut dyn Layer| {
                let mut params = layer.params_mut();
                let p = &mut params[pi].1.value;
                p.data_mut()
                    .iter_mut()
                    .zip(d.data())
                    .for_each(|(v, dv)| *v += sign * eps * dv);
            };
            at(1.0, layer);
            let lp = functional(layer, &x, &r);
            at(-2.0, layer);
            let lm = functional(layer, &x, &r);
            at(1.0, layer);
            let numeric = (lp - lm) / (2.0 * eps as f64);
            let scale = (dot(g.data(), g.data()) * dot(d.data(), d.data())).sqrt();
            close(
                &format!("{name} param {pi}, direction {trial}"),
                numeric,
                dot(g.data(), d.data()),
                scale,
            );
        }
    }
}

#[test]
fn conv_gradients_every_algorithm_and_rank() {
    let rng = &mut SmallRng::seed_from_u64(1);
    let cases: Vec<(ConvConfig, Vec<usize>)> = vec![
        (ConvConfig::conv2d(3, 4, 3).padding(1), vec![2, 3, 7, 6]),
        (
            ConvConfig::conv2d(2, 5, 3).stride(2).padding(2),
            vec![3, 2, 9, 8],
        ),
        (ConvConfig::conv2d(2, 3, 2).no_bias(), vec![1, 2, 5, 5]),
        (ConvConfig::conv2d(16, 16, 3).padding(1), vec![2, 16, 6, 5]),
        (ConvConfig::conv2d(3, 4, 5), vec![2, 3, 9, 8]),
        (ConvConfig::conv3d(2, 3, 3).padding(1), vec![2, 2, 4, 5, 3]),
        (
            ConvConfig {
                rank: 1,
                ..ConvConfig::conv2d(3, 2, 4).padding(1)
            },
            vec![2, 3, 11],
        ),
    ];
    for (i, (cfg, shape)) in cases.into_iter().enumerate() {
        for algo in [
            ConvAlgo::Im2col,
            ConvAlgo::Convgemm,
            ConvAlgo::Winograd,
            ConvAlgo::Auto,
        ] {
            let mut conv = Conv::new(cfg.clone(), algo, rng).unwrap();
            check(&mut conv, random(&shape, rng), 100 + i as u64);
        }
    }
}

#[test]
fn auto_measures_only_where_there_is_a_choice() {
    let rng = &mut SmallRng::seed_from_u64(8);
    let run = |cfg: ConvConfig, algo: ConvAlgo, shape: &[usize], rng: &mut SmallRng| {
        let mut conv = Conv::new(cfg, algo, rng).unwrap();
        assert_eq!(
            conv.algorithm_in_use(),
            None,
            "nothing chosen before the first forward"
        );
        conv.forward(random(shape, rng), false).unwrap();
        conv.algorithm_in_use().unwrap()
    };
    let s2 = ConvConfig::conv2d(16, 16, 3).stride(2);
    assert_eq!(
        run(s2.clone(), ConvAlgo::Auto, &[2, 16, 9, 9], rng),
        ConvAlgo::Convgemm
    );
    assert_eq!(
        run(s2, ConvAlgo::Winograd, &[2, 16, 9, 9], rng),
        ConvAlgo::Convgemm,
        "fallback"
    );
    let pointwise = ConvConfig::conv2d(16, 16, 1);
    assert_eq!(
        run(pointwise, ConvAlgo::Auto, &[2, 16, 9, 9], rng),
        ConvAlgo::Convgemm
    );
    // conv-ops' lean preset per geometry: for few channels (at most 64) the direct convolution
    // forward, its flipped form for the data gradient and the direct weight gradient (small
    // images); otherwise the transposed convgemm weight gradient and the flipped convgemm for
    // "same" convolutions, deconvgemm for shrinking ones (where the flipped form would compute
    // on a zero border) and strided ones; `Auto` times the candidates that apply.
    let preset = |cfg: ConvConfig, algo: ConvAlgo, shape: &[usize], rng: &mut SmallRng| {
        let mut conv = Conv::new(cfg, algo, rng).unwrap();
        assert_eq!(conv.preset_in_use(), None);
        conv.forward(random(shape, rng), false).unwrap();
        conv.preset_in_use()
    };
    let data_algo = |cfg: ConvConfig, algo: ConvAlgo, shape: &[usize], rng: &mut SmallRng| {
        preset(cfg, algo, shape, rng).map(|p| p.backward_data)
    };
    let valid5 = ConvConfig::conv2d(6, 16, 5);
    let same3 = ConvConfig::conv2d(16, 16, 3).padding(1);
    use conv_ops::BackwardDataAlgo::{Deconvgemm, FlippedConvgemm, FlippedDirect};
    use conv_ops::{BackwardFilterAlgo, ForwardAlgo};
    let shape = &[2, 16, 9, 9];
    assert_eq!(
        data_algo(valid5.clone(), ConvAlgo::Convgemm, &[2, 6, 14, 14], rng),
        Some(FlippedDirect)
    );
    let few = preset(same3.clone(), ConvAlgo::Convgemm, shape, rng).unwrap();
    assert_eq!(
        (few.forward, few.backward_data, few.backward_filter),
        (
            ForwardAlgo::Direct,
            FlippedDirect,
            BackwardFilterAlgo::Direct
        )
    );
    let wide_valid = ConvConfig::conv2d(96, 96, 5);
    let wide_same = ConvConfig::conv2d(96, 96, 3).padding(1);
    let wide = preset(wide_valid, ConvAlgo::Convgemm, &[1, 96, 9, 9], rng).unwrap();
    assert_eq!(
        (wide.forward, wide.backward_data, wide.backward_filter),
        (
            ForwardAlgo::Convgemm,
            Deconvgemm,
            BackwardFilterAlgo::ConvgemmTrans
        )
    );
    assert_eq!(
        data_algo(wide_same, ConvAlgo::Convgemm, &[1, 96, 9, 9], rng),
        Some(FlippedConvgemm)
    );
    let strided = ConvConfig::conv2d(16, 16, 3).stride(2).padding(1);
    assert_eq!(
        data_algo(strided, ConvAlgo::Auto, shape, rng),
        Some(Deconvgemm)
    );
    assert_eq!(data_algo(same3, ConvAlgo::Winograd, shape, rng), None);
    let auto = data_algo(valid5, ConvAlgo::Auto, &[2, 6, 14, 14], rng);
    assert!(
        matches!(
            auto,
            Some(Deconvgemm | FlippedConvgemm | FlippedDirect) | None
        ),
        "{auto:?}"
    );
    let c3 = ConvConfig::conv2d(16, 16, 3).padding(1);
    assert_eq!(
        run(c3.clone(), ConvAlgo::Winograd, &[2, 16, 9, 9], rng),
        ConvAlgo::Winograd
    );
    assert_eq!(
        run(c3.clone(), ConvAlgo::Im2col, &[2, 16, 9, 9], rng),
        ConvAlgo::Im2col
    );
    let measured = run(c3.clone(), ConvAlgo::Auto, &[2, 16, 9, 9], rng);
    assert!(
        matches!(measured, ConvAlgo::Convgemm | ConvAlgo::Winograd),
        "{measured:?}"
    );
    // A new batch size of a measured spatial size keeps the measured choice (no new timing).
    let mut conv = Conv::new(c3, ConvAlgo::Auto, rng).unwrap();
    conv.forward(random(&[3, 16, 9, 9], rng), true).unwrap();
    let first = conv.algorithm_in_use().unwrap();
    for n in [1, 5, 2] {
        conv.forward(random(&[n, 16, 9, 9], rng), false).unwrap();
        assert_eq!(conv.algorithm_in_use(), Some(first), "batch {n}");
    }
}

#[test]
fn conv_algorithms_agree_with_each_other() {
    let rng = &mut SmallRng::seed_from_u64(2);
    let cfg = ConvConfig::conv2d(4, 6, 3).padding(1);
    let x = random(&[2, 4, 9, 7], rng);
    let mut outputs = Vec::new();
    for algo in [ConvAlgo::Im2col, ConvAlgo::Convgemm, ConvAlgo::Winograd] {
        // Same seed: same weights.
        let mut conv = Conv::new(cfg.clone(), algo, &mut SmallRng::seed_from_u64(9)).unwrap();
        outputs.push(conv.forward(x.clone(), false).unwrap());
    }
    for o in &outputs[1..] {
        for (a, b) in o.data().iter().zip(outputs[0].data()) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
}

#[test]
fn pooling_relu_linear_flatten_gradients() {
    let rng = &mut SmallRng::seed_from_u64(3);
    check(
        &mut MaxPool::new(2, 2).unwrap(),
        separated(&[2, 3, 7, 6], rng),
        1,
    );
    check(
        &mut MaxPool::with_stride(2, 3, 2).unwrap(),
        separated(&[1, 2, 9, 8], rng),
        2,
    );
    check(
        &mut MaxPool::new(1, 3).unwrap(),
        separated(&[2, 2, 10], rng),
        3,
    );
    check(
        &mut MaxPool::new(3, 2).unwrap(),
        separated(&[1, 2, 5, 4, 6], rng),
        4,
    );
    check(&mut Relu::new(), separated(&[3, 4, 5], rng), 5);
    check(
        &mut Linear::new(7, 5, rng).unwrap(),
        random(&[3, 7], rng),
        6,
    );
    check(
        &mut Linear::new(1, 1, rng).unwrap(),
        random(&[1, 1], rng),
        7,
    );
    check(&mut Flatten::new(), random(&[2, 3, 2, 2], rng), 8);
}

#[test]
fn max_pool_values_against_a_naive_loop() {
    let rng = &mut SmallRng::seed_from_u64(4);
    let x = random(&[2, 3, 7, 9], rng);
    // (kernel, stride): the generic path and the 2×2 fast path, odd sizes (floor mode).
    for (k, s) in [(3, 2), (2, 2), (2, 1)] {
        let y = MaxPool::with_stride(2, k, s)
            .unwrap()
            .forward(x.clone(), false)
            .unwrap();
        let (oh_n, ow_n) = ((7 - k) / s + 1, (9 - k) / s + 1);
        assert_eq!(y.shape(), [2, 3, oh_n, ow_n]);
        for p in 0..6 {
            for oh in 0..oh_n {
                for ow in 0..ow_n {
                    let mut m = f32::NEG_INFINITY;
                    for kh in 0..k {
                        for kw in 0..k {
                            m = m.max(x.data()[p * 63 + (oh * s + kh) * 9 + ow * s + kw]);
                        }
                    }
                    assert_eq!(y.data()[(p * oh_n + oh) * ow_n + ow], m, "k {k} s {s}");
                }
            }
        }
    }
    // A NaN in a window propagates (PyTorch's behaviour), in both paths.
    for k in [2, 3] {
        let mut xn = x.clone();
        xn.data_mut()[1] = f32::NAN;
        let y = MaxPool::with_stride(2, k, 2)
            .unwrap()
            .forward(xn, false)
            .unwrap();
        assert!(y.data()[0].is_nan() && !y.data()[2].is_nan(), "k {k}");
    }
}

/// Output sizes of a pooling by the definition (floor mode).
fn pooled(sp: &[usize], k: &[usize], s: &[usize], p: &[usize]) -> Vec<usize> {
    (0..k.len())
        .map(|d| (sp[d] + 2 * p[d] - k[d]) / s[d] + 1)
        .collect()
}

/// For every output `oi` of every plane `pl` of a pooling of `x`, its window's inputs in
/// row-major order (padded positions skipped): `f(pl, oi, flat input index within the plane)`.
fn each_window_input(
    x: &Tensor,
    k: &[usize],
    s: &[usize],
    p: &[usize],
    mut f: impl FnMut(usize, usize, usize),
) {
    let r = k.len();
    let sp = &x.shape()[2..];
    let o = pooled(sp, k, s, p);
    let planes = x.shape()[0] * x.shape()[1];
    for pl in 0..planes {
        for oi in 0..o.iter().product::<usize>() {
            // Output coordinates, then every kernel offset.
            let oc: Vec<usize> = (0..r)
                .map(|d| oi / o[d + 1..].iter().product::<usize>() % o[d])
                .collect();
            for ki in 0..k.iter().product::<usize>() {
                let kc: Vec<usize> = (0..r)
                    .map(|d| ki / k[d + 1..].iter().product::<usize>() % k[d])
                    .collect();
                let pos: Option<Vec<usize>> = (0..r)
                    .map(|d| {
                        let v = (oc[d] * s[d] + kc[d]) as isize - p[d] as isize;
                        (v >= 0 && (v as usize) < sp[d]).then_some(v as usize)
                    })
                    .collect();
                if let Some(pos) = pos {
                    f(pl, oi, pos.iter().zip(sp).fold(0, |a, (&c, &n)| a * n + c));
                }
            }
        }
    }
}

/// Max pooling by the definition, for any kernel, stride and padding in 1-3 dimensions.
fn naive_max_pool(x: &Tensor, k: &[usize], s: &[usize], p: &[usize]) -> Tensor {
    let o = pooled(&x.shape()[2..], k, s, p);
    let (ilen, olen) = (
        x.shape()[2..].iter().product::<usize>(),
        o.iter().product::<usize>(),
    );
    let mut y = vec![f32::NEG_INFINITY; x.shape()[0] * x.shape()[1] * olen];
    each_window_input(x, k, s, p, |pl, oi, at| {
        let y = &mut y[pl * olen + oi];
        *y = y.max(x.data()[pl * ilen + at]);
    });
    let mut shape = x.shape()[..2].to_vec();
    shape.extend(o);
    Tensor::new(&shape, y).unwrap()
}

/// Where max pooling's backward sends each output's gradient, by the definition: the first
/// input of the window in row-major order that holds its maximum, a NaN beating any number.
fn naive_max_pool_dx(x: &Tensor, dy: &Tensor, k: &[usize], s: &[usize], p: &[usize]) -> Vec<f32> {
    let ilen = x.shape()[2..].iter().product::<usize>();
    let olen = dy.shape()[2..].iter().product::<usize>();
    // The winner (value, input index) of each output, in the window's row-major order.
    let mut best: Vec<Option<(f32, usize)>> = vec![None; dy.len()];
    each_window_input(x, k, s, p, |pl, oi, at| {
        let v = x.data()[pl * ilen + at];
        let b = &mut best[pl * olen + oi];
        if b.is_none_or(|(w, _)| v > w || (v.is_nan() && !w.is_nan())) {
            *b = Some((v, at));
        }
    });
    // Scattered in output order, as the layer sums overlapping windows.
    let mut dx = vec![0.0; x.len()];
    for (i, b) in best.iter().enumerate() {
        let (_, at) = b.expect("windows are never empty");
        dx[i / olen * ilen + at] += dy.data()[i];
    }
    dx
}

/// Ties and NaNs route the gradient to the first winner in row-major order (PyTorch's choice),
/// on every path of the forward: the 2×2 fast path, strides 1-3 (one or several phases of a
/// strided row), clipped windows at both ends, 1-3 dimensions, rows long enough for core-blas's
/// vector bodies.
#[test]
fn max_pool_ties_and_nans_route_the_gradient_to_the_first_winner() {
    let rng = &mut SmallRng::seed_from_u64(21);
    type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], &'a [usize]);
    let cases: [Case; 11] = [
        (&[3, 3], &[2, 2], &[1, 1], &[1, 2, 7, 53]),
        (&[2, 2], &[2, 2], &[0, 0], &[1, 2, 6, 37]),
        (&[3], &[1], &[1], &[2, 2, 37]),
        (&[3, 3], &[2, 2], &[1, 1], &[2, 3, 11, 13]),
        (&[2, 2], &[2, 2], &[0, 0], &[1, 2, 6, 8]),
        (&[3, 3], &[1, 1], &[1, 1], &[1, 2, 7, 9]),
        (&[3, 3], &[3, 3], &[1, 1], &[1, 2, 10, 17]),
        (&[5], &[2], &[2], &[2, 2, 19]),
        (&[2, 3], &[2, 3], &[0, 1], &[1, 2, 6, 14]),
        (&[1, 2, 2], &[1, 2, 2], &[0, 0, 0], &[1, 2, 3, 6, 7]),
        (&[3, 3, 3], &[2, 2, 2], &[1, 1, 1], &[1, 2, 5, 7, 9]),
    ];
    for (i, (k, s, p, shape)) in cases.into_iter().enumerate() {
        // Three values only: most windows hold ties; a few NaNs.
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| match rng.random_range(0..40) {
                0 => f32::NAN,
                v => (v % 3) as f32,
            })
            .collect();
        let x = Tensor::new(shape, data).unwrap();
        let mut pool = MaxPool::nd(k, s, p).unwrap();
        let y = pool.forward(x.clone(), true).unwrap();
        let dy = random(y.shape(), rng);
        let dx = pool.backward(dy.clone(), true).unwrap().unwrap();
        assert_eq!(
            dx.data(),
            naive_max_pool_dx(&x, &dy, k, s, p).as_slice(),
            "case {i}: {}",
            pool.describe()
        );
    }
}

#[test]
fn padded_and_anisotropic_max_pool_against_the_definition() {
    let rng = &mut SmallRng::seed_from_u64(14);
    // ResNet's stem pool, C3D's first pool and last pool, 1D, odd sizes.
    // (kernel, stride, padding, input shape)
    type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], &'a [usize]);
    // The last two have windows clipped at both ends of a row; the first three have rows long
    // enough for core-blas's vector bodies (at least 8 inner outputs and pairs of a row).
    let cases: [Case; 10] = [
        (&[3, 3], &[2, 2], &[1, 1], &[1, 2, 5, 67]),
        (&[1, 2, 2], &[1, 2, 2], &[0, 0, 0], &[1, 2, 3, 5, 40]),
        (&[3], &[1], &[1], &[2, 2, 45]),
        (&[3, 3], &[2, 2], &[1, 1], &[2, 3, 9, 8]),
        (&[1, 2, 2], &[1, 2, 2], &[0, 0, 0], &[1, 2, 5, 6, 7]),
        (&[2, 2, 2], &[2, 2, 2], &[0, 1, 1], &[1, 3, 4, 5, 3]),
        (&[3], &[1], &[1], &[2, 2, 7]),
        (&[3, 2], &[2, 1], &[1, 0], &[1, 2, 6, 5]),
        (&[3, 3], &[2, 2], &[1, 1], &[1, 2, 8, 9]),
        (&[5], &[3], &[2], &[2, 3, 11]),
    ];
    for (i, (k, s, p, shape)) in cases.into_iter().enumerate() {
        let x = random(shape, rng);
        let mut pool = MaxPool::nd(k, s, p).unwrap();
        let y = pool.forward(x.clone(), false).unwrap();
        assert_eq!(
            y,
            naive_max_pool(&x, k, s, p),
            "case {i}: {}",
            pool.describe()
        );
        check(
            &mut MaxPool::nd(k, s, p).unwrap(),
            separated(shape, rng),
            20 + i as u64,
        );
    }
    // Padding beyond half the kernel, mismatched lengths, zero stride.
    assert!(MaxPool::nd(&[3, 3], &[2, 2], &[2, 1]).is_err());
    assert!(MaxPool::nd(&[3, 3], &[2], &[1, 1]).is_err());
    assert!(MaxPool::nd(&[3], &[0], &[0]).is_err());
    assert!(MaxPool::nd(&[2; 4], &[2; 4], &[0; 4]).is_err());
}

#[test]
fn cross_entropy_gradient_and_value() {
    let rng = &mut SmallRng::seed_from_u64(5);
    let logits = random(&[4, 5], rng);
    let labels = [0, 4, 2, 2];
    let (loss, grad) = cross_entropy(&logits, &labels).unwrap();
    // Value against the textbook formula.
    let mut want = 0f64;
    for (i, row) in logits.data().chunks(5).enumerate() {
        let s: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
        want += s.ln() - row[labels[i]] as f64;
    }
    assert!((loss as f64 - want / 4.0).abs() < 1e-6);
    // Gradient by central differences, every coordinate.
    for j in 0..logits.len() {
        let mut p = logits.clone();
        p.data_mut()[j] += 1e-2;
        let mut m = logits.clone();
        m.data_mut()[j] -= 1e-2;
        let num = (cross_entropy(&p, &labels).unwrap().0 - cross_entropy(&m, &labels).unwrap().0)
            as f64
            / 2e-2;
        assert!(
            (num - grad.data()[j] as f64).abs() < 2e-4,
            "coordinate {j}: {num} vs {}",
            grad.data()[j]
        );
    }
    assert!(
        cross_entropy(&logits, &[0, 1, 2, 5]).is_err(),
        "label 5 of 5 classes"
    );
    assert!(
        cross_entropy(&logits, &[0, 1]).is_err(),
        "2 labels for 4 rows"
    );
}

#[test]
fn whole_model_gradient() {
    // A small step (1e-4): the max-pool and ReLU kinks of a whole model are closer together
    // than in the single-layer checks (f32 rounding of the loss then costs ~5e-4 here).
    let rng = &mut SmallRng::seed_from_u64(6);
    let model = Sequential::new(&[2, 8, 8])
        .push(
            Conv::new(
                ConvConfig::conv2d(2, 4, 3).padding(1),
                ConvAlgo::Convgemm,
                rng,
            )
            .unwrap(),
        )
        .unwrap()
        .push(Relu::new())
        .unwrap()
        .push(MaxPool::new(2, 2).unwrap())
        .unwrap()
        .push(Flatten::new())
        .unwrap()
        .push(Linear::new(64, 3, rng).unwrap())
        .unwrap();
    let mut model = model;
    let x = random(&[3, 2, 8, 8], rng);
    let labels = [0, 2, 1];
    let loss_at = |m: &mut Sequential| {
        cross_entropy(&m.forward(x.clone(), false).unwrap(), &labels)
            .unwrap()
            .0 as f64
    };
    let logits = model.forward(x.clone(), true).unwrap();
    let (_, dl) = cross_entropy(&logits, &labels).unwrap();
    model.backward(dl).unwrap();
    let grads: Vec<Tensor> = model.params().iter().map(|(_, p)| p.grad.clone()).collect();
    assert_eq!(
        model
            .params()
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["0.weight", "0.bias", "4.weight", "4.bias"]
    );
    for (pi, g) in grads.iter().enumerate() {
        let d = random(g.shape(), rng);
        let shift = |m: &mut Sequential, s: f32| {
            let mut ps = m.params_mut();
            ps[pi]
                .1
                .value
                .data_mut()
                .iter_mut()
                .zip(d.data())
                .for_each(|(v, dv)| *v += s * 1e-4 * dv);
        };
        shift(&mut model, 1.0);
        let lp = loss_at(&mut model);
        shift(&mut model, -2.0);
        let lm = loss_at(&mut model);
        shift(&mut model, 1.0);
        let num = (lp - lm) / 2e-4;
        let ana = dot(g.data(), d.data());
        assert!(
            (num - ana).abs() <= 1e-3 + 2e-2 * ana.abs(),
            "param {pi}: {num} vs {ana}"
        );
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let rng = &mut SmallRng::seed_from_u64(7);
    let mut conv = Conv::new(ConvConfig::conv2d(3, 4, 3), ConvAlgo::Auto, rng).unwrap();
    let err = conv
        .forward(random(&[1, 2, 5, 5], rng), true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("x") && err.contains("[1, 2, 5, 5]"), "{err}");
    assert!(
        conv.forward(random(&[1, 3, 2, 2], rng), true).is_err(),
        "input smaller than the kernel"
    );
    assert!(Conv::new(ConvConfig::conv2d(3, 4, 0), ConvAlgo::Auto, rng).is_err());
    // After a successful forward (a plan exists), a wrong rank is still an error, not a panic.
    conv.forward(random(&[1, 3, 5, 5], rng), true).unwrap();
    assert!(conv.forward(random(&[3], rng), true).is_err());
    assert!(conv.forward(random(&[1, 3, 5], rng), true).is_err());
    let mut lin = Linear::new(4, 2, rng).unwrap();
    assert!(lin.forward(random(&[2, 5], rng), true).is_err());
    assert!(
        lin.backward(random(&[2, 2], rng), true).is_err(),
        "backward before forward"
    );
    assert!(MaxPool::new(4, 2).is_err());
    assert!(
        MaxPool::new(2, 4)
            .unwrap()
            .forward(random(&[1, 1, 3, 3], rng), false)
            .is_err()
    );
    assert!(Tensor::new(&[2, 3], vec![0.0; 5]).is_err());
}

#[test]
fn batch_norm_and_residual_gradients() {
    let rng = &mut SmallRng::seed_from_u64(10);
    check(
        &mut BatchNorm::new(3).unwrap(),
        random(&[4, 3, 5, 3], rng),
        1,
    );
    check(
        &mut BatchNorm::new(2).unwrap(),
        random(&[3, 2, 2, 3, 2], rng),
        2,
    );
    check(&mut BatchNorm::new(5).unwrap(), random(&[6, 5], rng), 3);
    check(&mut GlobalAvgPool::new(), random(&[2, 3, 4, 5], rng), 4);
}

/// A residual block is differentiable only between the kinks of its ReLUs, which batch norm puts
/// right where its outputs cluster (around 0), so finite differences of the whole block are
/// unreliable. Its backward must instead equal the chain rule over its parts, each of which is
/// checked by finite differences above: the same layers built from the same seed, run by hand.
///
/// The large identity case (138 320 values: several of the fused ReLU's steps and, on two
/// threads, several parallel runs, none a whole number of steps) runs on one and two threads;
/// its backward without dx must leave the same parameter gradients.
#[test]
fn residual_block_is_the_chain_of_its_parts() {
    let cases = [
        (1, 4, 4, 1, [3, 4, 5, 6]),
        (1, 3, 5, 2, [3, 3, 7, 6]),
        (1, 4, 4, 1, [2, 4, 91, 190]),
        (2, 4, 4, 1, [2, 4, 91, 190]),
        (2, 3, 5, 2, [3, 3, 7, 6]),
    ];
    for (threads, cin, cout, stride, shape) in cases {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| residual_chain(cin, cout, stride, shape));
    }
}

fn residual_chain(cin: usize, cout: usize, stride: usize, shape: [usize; 4]) {
    {
        let algo = ConvAlgo::Convgemm;
        let mut block =
            BasicBlock::basic_block(cin, cout, stride, algo, &mut SmallRng::seed_from_u64(5))
                .unwrap();
        // BasicBlock::basic_block draws the shortcut's weights first, then c1's, then c2's.
        let rng = &mut SmallRng::seed_from_u64(5);
        let projected = stride != 1 || cin != cout;
        let mut short = projected.then(|| {
            let cfg = ConvConfig::conv2d(cin, cout, 1).stride(stride).no_bias();
            (
                Conv::new(cfg, algo, rng).unwrap(),
                BatchNorm::new(cout).unwrap(),
            )
        });
        let conv3 = |c, s| {
            ConvConfig::conv2d(c, cout, 3)
                .stride(s)
                .padding(1)
                .no_bias()
        };
        let mut c1 = Conv::new(conv3(cin, stride), algo, rng).unwrap();
        let mut c2 = Conv::new(conv3(cout, 1), algo, rng).unwrap();
        let (mut b1, mut b2) = (BatchNorm::new(cout).unwrap(), BatchNorm::new(cout).unwrap());
        let (mut r1, mut out) = (Relu::new(), Relu::new());

        let rng = &mut SmallRng::seed_from_u64(6);
        let x = random(&shape, rng);
        let y = block.forward(x.clone(), true).unwrap();
        let skip = match &mut short {
            Some((c, b)) => b
                .forward(c.forward(x.clone(), true).unwrap(), true)
                .unwrap(),
            None => x.clone(),
        };
        let h = c1.forward(x.clone(), true).unwrap();
        let h = r1.forward(b1.forward(h, true).unwrap(), true).unwrap();
        let mut h = b2.forward(c2.forward(h, true).unwrap(), true).unwrap();
        h.data_mut()
            .iter_mut()
            .zip(skip.data())
            .for_each(|(a, b)| *a += b);
        assert_eq!(y, out.forward(h, true).unwrap(), "forward");

        let r = random(y.shape(), rng);
        let dx = block.backward(r.clone(), true).unwrap().unwrap();
        let d = out.backward(r, true).unwrap().unwrap();
        let g = b2.backward(d.clone(), true).unwrap().unwrap();
        let g = r1
            .backward(c2.backward(g, true).unwrap().unwrap(), true)
            .unwrap()
            .unwrap();
        let mut want = c1
            .backward(b1.backward(g, true).unwrap().unwrap(), true)
            .unwrap()
            .unwrap();
        let ds = match &mut short {
            Some((c, b)) => c
                .backward(b.backward(d, true).unwrap().unwrap(), true)
                .unwrap()
                .unwrap(),
            None => d,
        };
        want.data_mut()
            .iter_mut()
            .zip(ds.data())
            .for_each(|(a, b)| *a += b);
        assert_eq!(dx, want, "dx");
        let mut parts: Vec<&dyn Layer> = vec![&c1, &b1, &c2, &b2];
        if let Some((c, b)) = &short {
            parts.extend([c as &dyn Layer, b as &dyn Layer]);
        }
        let grads: Vec<&Tensor> = parts
            .iter()
            .flat_map(|l| l.params().into_iter().map(|(_, p)| &p.grad))
            .collect();
        let block_grads: Vec<&Tensor> = block.params().into_iter().map(|(_, p)| &p.grad).collect();
        assert_eq!(block_grads, grads, "parameter gradients");

        // The same block without dx (the identity's gradient copy is skipped).
        let mut again =
            BasicBlock::basic_block(cin, cout, stride, algo, &mut SmallRng::seed_from_u64(5))
                .unwrap();
        again.forward(x, true).unwrap();
        let rng = &mut SmallRng::seed_from_u64(6);
        let _ = random(&shape, rng);
        let r = random(y.shape(), rng);
        assert!(again.backward(r, false).unwrap().is_none());
        let again_grads: Vec<&Tensor> = again.params().into_iter().map(|(_, p)| &p.grad).collect();
        assert_eq!(again_grads, block_grads, "parameter gradients without dx");
    }
}

#[test]
fn batch_norm_statistics_like_pytorch() {
    let mut bn = BatchNorm::new(2).unwrap();
    // Channel 0: 1, 2, 3, 4 (mean 2.5, biased var 1.25, unbiased 5/3); channel 1: all 7.
    let x = Tensor::new(&[2, 2, 2], vec![1.0, 2.0, 7.0, 7.0, 3.0, 4.0, 7.0, 7.0]).unwrap();
    let y = bn.forward(x.clone(), true).unwrap();
    let s = 1.0 / (1.25f32 + 1e-5).sqrt();
    let want = [-1.5 * s, -0.5 * s, 0.0, 0.0, 0.5 * s, 1.5 * s, 0.0, 0.0];
    for (a, b) in y.data().iter().zip(want) {
        assert!((a - b).abs() < 1e-5, "{:?}", y.data());
    }
    let stats: Vec<Vec<f32>> = bn
        .buffers()
        .iter()
        .map(|(_, t)| t.data().to_vec())
        .collect();
    assert!(
        (stats[0][0] - 0.25).abs() < 1e-6 && (stats[0][1] - 0.7).abs() < 1e-6,
        "{stats:?}"
    );
    assert!(
        (stats[1][0] - (0.9 + 0.1 * 5.0 / 3.0)).abs() < 1e-6 && (stats[1][1] - 0.9).abs() < 1e-6,
        "{stats:?}"
    );
    // Evaluation normalises with the running statistics.
    let e = bn.forward(x, false).unwrap();
    let want0 = (1.0 - 0.25) / (stats[1][0] + 1e-5).sqrt();
    assert!((e.data()[0] - want0).abs() < 1e-5);
    assert!(
        bn.forward(Tensor::zeros(&[1, 2, 1]), true).is_err(),
        "one value per channel"
    );
}

#[test]
fn dropout_scales_survivors_and_routes_gradients_through_them() {
    let rng = &mut SmallRng::seed_from_u64(15);
    let x = separated(&[4, 50, 50], rng);
    let mut d = Dropout::new(0.3, 7).unwrap();
    assert_eq!(
        d.forward(x.clone(), false).unwrap(),
        x,
        "evaluation: identity"
    );
    let y = d.forward(x.clone(), true).unwrap();
    let scale = 1.0 / 0.7f32;
    let mut dropped = 0;
    for (a, b) in y.data().iter().zip(x.data()) {
        if *a == 0.0 {
            dropped += 1;
        } else {
            assert!(
                (a - b * scale).abs() <= 1e-6 * b.abs().max(1.0),
                "{a} vs {b}"
            );
        }
    }
    let frac = dropped as f64 / x.len() as f64;
    assert!((0.27..0.33).contains(&frac), "dropped {frac}");
    // ∂y/∂x is the same mask and scale.
    let dy = random(y.shape(), rng);
    let dx = d.backward(dy.clone(), true).unwrap().unwrap();
    for ((g, up), out) in dx.data().iter().zip(dy.data()).zip(y.data()) {
        let want = if *out == 0.0 { 0.0 } else { up * scale };
        assert_eq!(*g, want);
    }
    assert!(d.backward(dy, true).is_err(), "backward twice");
    assert!(Dropout::new(1.0, 0).is_err() && Dropout::new(-0.1, 0).is_err());
}

#[test]
fn adaptive_avg_pool_against_the_definition_and_by_finite_differences() {
    let rng = &mut SmallRng::seed_from_u64(21);
    // (input shape, output size): dividing, overlapping (5 → 3), growing (3 → 5), 1D and 3D.
    let cases: [(&[usize], &[usize]); 5] = [
        (&[2, 3, 8, 6], &[4, 3]),
        (&[1, 2, 5, 7], &[3, 3]),
        (&[2, 1, 3, 4], &[5, 2]),
        (&[2, 3, 9], &[4]),
        (&[1, 2, 5, 4, 3], &[2, 3, 2]),
    ];
    for (i, (shape, out)) in cases.into_iter().enumerate() {
        let x = random(shape, rng);
        let mut pool = AdaptiveAvgPool::new(out).unwrap();
        let y = pool.forward(x.clone(), false).unwrap();
        let want = naive_adaptive_avg(&x, out);
        assert_eq!(y.shape(), want.shape(), "case {i}");
        for (a, b) in y.data().iter().zip(want.data()) {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "case {i}: {a} vs {b}"
            );
        }
        check(&mut pool, x, 300 + i as u64);
    }
    assert!(AdaptiveAvgPool::new(&[]).is_err());
    assert!(AdaptiveAvgPool::new(&[7, 0]).is_err());
    let mut pool = AdaptiveAvgPool::new(&[2, 2]).unwrap();
    assert!(pool.forward(random(&[1, 2, 4], rng), false).is_err());
}

/// PyTorch's definition, one output value at a time: the mean over
/// `floor(i·n/m) .. ceil((i+1)·n/m)` in every spatial dimension.
fn naive_adaptive_avg(x: &Tensor, out: &[usize]) -> Tensor {
    let shape = x.shape();
    let spatial = &shape[2..];
    let planes = shape[0] * shape[1];
    let in_plane: usize = spatial.iter().product();
    let out_plane: usize = out.iter().product();
    let mut y = Vec::new();
    for p in 0..planes {
        for o in 0..out_plane {
            // The output multi-index of o, last dimension fastest.
            let mut rem = o;
            let mut idx = vec![0; out.len()];
            for d in (0..out.len()).rev() {
                idx[d] = rem % out[d];
                rem /= out[d];
            }
            let (mut sum, mut count) = (0.0f64, 0usize);
            for flat in 0..in_plane {
                let mut rem = flat;
                let mut inside = true;
                for d in (0..out.len()).rev() {
                    let v = rem % spatial[d];
                    rem /= spatial[d];
                    let (n, m, i) = (spatial[d], out[d], idx[d]);
                    // floor(i·n/m) and ceil((i + 1)·n/m), found by search in exact integers.
                    let lo = (0..n).rfind(|&v| v * m <= i * n).unwrap();
                    let hi = (0..=n).find(|&v| v * m >= (i + 1) * n).unwrap();
                    inside &= lo <= v && v < hi;
                }
                if inside {
                    sum += x.data()[p * in_plane + flat] as f64;
                    count += 1;
                }
            }
            y.push((sum / count as f64) as f32);
        }
    }
    let mut yshape = shape[..2].to_vec();
    yshape.extend(out);
    Tensor::new(&yshape, y).unwrap()
}
