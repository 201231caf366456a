//! Data, optimizer, checkpoints and the training loop, end to end.

use nn::{
    ConvAlgo, Dataset, Parameter, Sgd, Tensor, TrainConfig, TrainState, build, checkpoint,
    evaluate, fit,
};

#[test]
fn digits_are_shipped_whole() {
    let d = Dataset::digits().unwrap();
    assert_eq!(d.len(), 1797);
    assert_eq!(d.sample_shape(), [1, 8, 8]);
    let mut counts = [0usize; 10];
    d.labels().iter().for_each(|&l| counts[l] += 1);
    assert!(
        counts.iter().all(|&c| (170..=190).contains(&c)),
        "{counts:?}"
    );
    let (train, test) = d.split(0.2, 1).unwrap();
    assert_eq!((train.len(), test.len()), (1438, 359));
}

#[test]
fn csv_errors_name_the_line() {
    let err = Dataset::from_csv("t.csv", "1,2,0\n1,x,0\n", &[2], 1.0, 2)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("t.csv") && err.contains("line 2") && err.contains("`x`"),
        "{err}"
    );
    let err = Dataset::from_csv("t.csv", "1,2,7\n", &[2], 1.0, 2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("label 7"), "{err}");
    assert!(
        Dataset::from_csv("t.csv", "1,2\n", &[2], 1.0, 2).is_err(),
        "missing label"
    );
}

#[test]
fn bilinear_resize_matches_pytorch() {
    // torch.nn.functional.interpolate(x, size=(3, 4), mode="bilinear", align_corners=False)
    // for x = [[0, 1], [2, 3]] gives these values.
    let d = Dataset::new(&[1, 2, 2], vec![0.0, 1.0, 2.0, 3.0], vec![0], 1).unwrap();
    let r = d.resized(3, 4).unwrap();
    let (x, _) = r.batches(1, None).unwrap().next().unwrap();
    let want = [
        0.0, 0.25, 0.75, 1.0, //
        1.0, 1.25, 1.75, 2.0, //
        2.0, 2.25, 2.75, 3.0,
    ];
    for (a, b) in x.data().iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{:?}", x.data());
    }
}

#[test]
fn batches_cover_every_sample_once() {
    let d = Dataset::synthetic(10, &[2], 3, 0).unwrap();
    let sizes: Vec<usize> = d
        .batches(4, Some(7))
        .unwrap()
        .map(|(x, l)| {
            assert_eq!(x.shape()[0], l.len());
            l.len()
        })
        .collect();
    assert_eq!(sizes, [4, 4, 2]);
    let mut firsts: Vec<u32> = d
        .batches(3, Some(7))
        .unwrap()
        .flat_map(|(x, _)| {
            x.data()
                .chunks(2)
                .map(|c| c[0].to_bits())
                .collect::<Vec<_>>()
        })
        .collect();
    firsts.sort();
    let mut all: Vec<u32> = d
        .batches(10, None)
        .unwrap()
        .next()
        .unwrap()
        .0
        .data()
        .chunks(2)
        .map(|c| c[0].to_bits())
        .collect();
    all.sort();
    assert_eq!(firsts, all);
    assert!(d.batches(0, None).is_err());
}

#[test]
fn sgd_matches_pytorch_update_rule() {
    let mut p = Parameter::new(Tensor::new(&[2], vec![1.0, -2.0]).unwrap());
    let mut opt = Sgd::new(0.1, 0.9, 0.01).unwrap();
    p.grad = Tensor::new(&[2], vec![0.5, 0.25]).unwrap();
    opt.step([&mut p]).unwrap();
    // d = g + wd·p; v = d; p -= lr·v.
    let d0 = [0.5 + 0.01 * 1.0, 0.25 + 0.01 * -2.0];
    let p1 = [1.0 - 0.1 * d0[0], -2.0 - 0.1 * d0[1]];
    assert_eq!(p.value.data(), [p1[0] as f32, p1[1] as f32]);
    opt.step([&mut p]).unwrap();
    let d1 = [
        0.9 * d0[0] + 0.5 + 0.01 * p1[0],
        0.9 * d0[1] + 0.25 + 0.01 * p1[1],
    ];
    let p2 = [p1[0] - 0.1 * d1[0], p1[1] - 0.1 * d1[1]];
    for (a, b) in p.value.data().iter().zip(p2) {
        assert!((*a as f64 - b).abs() < 1e-6);
    }
    assert!(Sgd::new(f32::NAN, 0.9, 0.0).is_err());
}

#[test]
fn lenet_learns_the_digits() {
    let (train, test) = Dataset::digits()
        .unwrap()
        .resized(28, 28)
        .unwrap()
        .split(0.2, 0)
        .unwrap();
    let mut model = build("lenet", ConvAlgo::Auto, 0).unwrap();
    let (_, before) = evaluate(&mut model, &test, 256).unwrap();
    let mut opt = Sgd::new(0.05, 0.9, 5e-4).unwrap();
    let cfg = TrainConfig {
        epochs: 6,
        batch_size: 32,
        ..Default::default()
    };
    let mut epochs = 0;
    let (report, state) = fit(
        &mut model,
        &mut opt,
        &train,
        Some(&test),
        &cfg,
        TrainState::default(),
        |_, _, _, _| {
            epochs += 1;
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(epochs, 6);
    assert_eq!(
        state,
        TrainState {
            epoch: 6,
            step: 6 * train.len().div_ceil(32)
        }
    );
    let acc = report.test_accuracy.unwrap();
    assert!(before < 0.3, "untrained accuracy {before}");
    assert!(acc > 0.9, "test accuracy after 6 epochs: {acc}");
}

#[test]
fn checkpoint_round_trip_and_resume() {
    let dir = std::env::temp_dir().join(format!("nn-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lenet.safetensors");
    let data = Dataset::synthetic(64, &[1, 28, 28], 10, 3).unwrap();
    let cfg = TrainConfig {
        epochs: 1,
        batch_size: 16,
        ..Default::default()
    };

    // Two epochs straight through...
    let mut straight = build("lenet", ConvAlgo::Convgemm, 1).unwrap();
    let mut opt = Sgd::new(0.01, 0.9, 5e-4).unwrap();
    let two = TrainConfig {
        epochs: 2,
        ..cfg.clone()
    };
    fit(
        &mut straight,
        &mut opt,
        &data,
        None,
        &two,
        TrainState::default(),
        |_, _, _, _| Ok(()),
    )
    .unwrap();

    // ...equal one epoch, a checkpoint, a fresh model and optimizer resumed from it, one more.
    let mut first = build("lenet", ConvAlgo::Convgemm, 1).unwrap();
    let mut opt1 = Sgd::new(0.01, 0.9, 5e-4).unwrap();
    let (_, state) = fit(
        &mut first,
        &mut opt1,
        &data,
        None,
        &cfg,
        TrainState::default(),
        |_, m, o, s| checkpoint::save(&path, m, o, s),
    )
    .unwrap();
    let mut resumed = build("lenet", ConvAlgo::Convgemm, 99).unwrap();
    let mut opt2 = Sgd::new(0.01, 0.9, 5e-4).unwrap();
    let loaded = checkpoint::load(&path, &mut resumed, &mut opt2).unwrap();
    assert_eq!(loaded, state);
    fit(
        &mut resumed,
        &mut opt2,
        &data,
        None,
        &cfg,
        loaded,
        |_, _, _, _| Ok(()),
    )
    .unwrap();
    for ((n, a), (_, b)) in straight.params().iter().zip(resumed.params()) {
        assert_eq!(a.value, b.value, "{n} differs after resume");
    }
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");

    // A corrupt file is an error naming the file, and the model is left untouched.
    let before = resumed
        .params()
        .iter()
        .map(|(_, p)| p.value.clone())
        .collect::<Vec<_>>();
    std::fs::write(&path, b"not a checkpoint").unwrap();
    let err = checkpoint::load(&path, &mut resumed, &mut opt2)
        .unwrap_err()
        .to_string();
    assert!(err.contains("lenet.safetensors"), "{err}");
    let after = resumed
        .params()
        .iter()
        .map(|(_, p)| p.value.clone())
        .collect::<Vec<_>>();
    assert_eq!(before, after);
    // A failed save (directory missing) is an error and writes nothing.
    let missing = dir.join("no/such/dir/x.safetensors");
    assert!(checkpoint::save(&missing, &resumed, &opt2, loaded).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn models_have_pytorchs_parameter_counts_and_names() {
    // Counted from the anchors' PyTorch definitions (sum of p.numel()).
    let lenet = build("lenet", ConvAlgo::Auto, 0).unwrap();
    assert_eq!(lenet.num_params(), 61_706);
    assert_eq!(lenet.output_shape().unwrap(), [10]);
    let resnet = build("resnet20", ConvAlgo::Auto, 0).unwrap();
    assert_eq!(resnet.num_params(), 272_474);
    assert_eq!(resnet.output_shape().unwrap(), [10]);
    let names: Vec<String> = resnet.params().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.contains(&"3.c1.weight".to_string()) && names.contains(&"6.short.1.bias".to_string()),
        "{names:?}"
    );
    let stats: Vec<String> = resnet.buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        stats.len(),
        2 * (1 + 9 * 2 + 2),
        "running mean and var of 21 batch norms"
    );
    assert_eq!(stats[0], "1.running_mean");
    let vgg = build("vgg16", ConvAlgo::Auto, 0).unwrap();
    assert_eq!(vgg.num_params(), 15_245_130);
    assert_eq!(vgg.output_shape().unwrap(), [10]);
    let names: Vec<String> = vgg.params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.first().unwrap(), "0.weight");
    // 13 convs + 13 ReLUs + 5 pools (0-30), Flatten 31, Linear 32, ReLU 33, Linear 34, ReLU 35.
    assert_eq!(names.last().unwrap(), "36.bias");
    let err = build("resnet50", ConvAlgo::Auto, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("lenet, resnet20, vgg16"), "{err}");
}

#[test]
fn resnet20_checkpoint_keeps_batch_norm_statistics() {
    let dir = std::env::temp_dir().join(format!("nn-resnet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("r20.safetensors");
    let data = Dataset::synthetic(16, &[3, 32, 32], 10, 4).unwrap();
    // An explicit algorithm: Auto's measured choice may differ between the two models, and with
    // it the rounding.
    let mut model = build("resnet20", ConvAlgo::Convgemm, 2).unwrap();
    let mut opt = Sgd::new(0.01, 0.9, 5e-4).unwrap();
    let cfg = TrainConfig {
        epochs: 1,
        batch_size: 8,
        ..Default::default()
    };
    let (report, state) = fit(
        &mut model,
        &mut opt,
        &data,
        None,
        &cfg,
        TrainState::default(),
        |_, _, _, _| Ok(()),
    )
    .unwrap();
    assert!(report.train_loss.is_finite());
    checkpoint::save(&path, &model, &opt, state).unwrap();
    let mut other = build("resnet20", ConvAlgo::Convgemm, 3).unwrap();
    checkpoint::load(&path, &mut other, &mut Sgd::new(0.01, 0.9, 5e-4).unwrap()).unwrap();
    for ((n, a), (_, b)) in model.buffers().iter().zip(other.buffers()) {
        assert_eq!(*a, b, "{n}");
    }
    // Same weights and statistics: same evaluation output.
    let (x, _) = data.batches(16, None).unwrap().next().unwrap();
    assert_eq!(
        model.forward(x.clone(), false).unwrap(),
        other.forward(x, false).unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
