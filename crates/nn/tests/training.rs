//! Data, optimizer, checkpoints and the training loop, end to end.

use rand::SeedableRng;

use nn::{
    Augment, ConvAlgo, Dataset, EpochReport, LrSchedule, ModelOptions, Parameter, Sequential, Sgd,
    Tensor, TrainConfig, TrainState, build, build_with, checkpoint, evaluate, fit, local_step,
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

/// Each sample's crop and flip depend on the seed and its index, not on the batch it lands in;
/// labels stay with their samples; the test split and unaugmented batches are untouched.
#[test]
fn augmented_batches_transform_each_sample_the_same_whatever_the_batch_size() {
    let data = Dataset::synthetic(23, &[2, 6, 5], 4, 8).unwrap();
    let aug = Augment {
        crop_padding: 2,
        hflip: true,
    };
    let per = 2 * 6 * 5;
    let samples = |batch: usize, aug: Option<Augment>| {
        let mut out = Vec::new();
        let batches = data.batches(batch, Some(4)).unwrap();
        let batches = match aug {
            Some(a) => batches.augmented(a, 4).unwrap(),
            None => batches,
        };
        for (x, labels) in batches {
            for (s, l) in x.data().chunks_exact(per).zip(labels) {
                out.push((s.to_vec(), l));
            }
        }
        out
    };
    let plain = samples(23, None);
    let a16 = samples(16, Some(aug));
    let a5 = samples(5, Some(aug));
    assert_eq!(a16, a5);
    assert_eq!(
        a16.iter().map(|s| s.1).collect::<Vec<_>>(),
        plain.iter().map(|s| s.1).collect::<Vec<_>>()
    );
    let changed = a16.iter().zip(&plain).filter(|(a, p)| a.0 != p.0).count();
    assert!(changed > 15, "{changed} of 23 samples transformed");
    // Another seed draws other transformations.
    let other: Vec<_> = data
        .batches(23, Some(4))
        .unwrap()
        .augmented(aug, 5)
        .unwrap()
        .flat_map(|(x, _)| x.data().to_vec())
        .collect();
    assert_ne!(
        other,
        a16.iter().flat_map(|s| s.0.clone()).collect::<Vec<_>>()
    );
    // Samples that cannot be cropped by that much are an error, not a panic.
    let tiny = Dataset::synthetic(3, &[1, 2, 2], 2, 0).unwrap();
    assert!(tiny.batches(2, None).unwrap().augmented(aug, 0).is_err());
}

#[test]
fn checkpoint_round_trip_and_resume() {
    let dir = std::env::temp_dir().join(format!("nn-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lenet.safetensors");
    let data = Dataset::synthetic(64, &[1, 28, 28], 10, 3).unwrap();
    // A schedule that depends on the step: the resumed run must continue it, not restart it.
    // With augmentation, whose draws the resumed run must repeat too.
    let cfg = TrainConfig {
        epochs: 1,
        batch_size: 16,
        schedule: LrSchedule::cosine(2, 8).unwrap(),
        augment: Augment {
            crop_padding: 3,
            hflip: true,
        },
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

/// `fit` with a schedule takes the steps of a loop that sets each step's rate by hand, ends with
/// the optimizer's rate as it was passed in, and differs from a constant rate.
#[test]
fn the_schedule_sets_each_steps_rate() {
    let data = Dataset::synthetic(48, &[1, 28, 28], 10, 5).unwrap();
    let schedule = LrSchedule::multi_step(vec![1], 0.1).unwrap();
    let cfg = TrainConfig {
        epochs: 2,
        batch_size: 16,
        seed: 3,
        schedule: LrSchedule::cosine(2, 5).unwrap(),
        ..Default::default()
    };
    let cases = [
        cfg.clone(),
        TrainConfig {
            schedule,
            ..cfg.clone()
        },
    ];
    let mut finals = Vec::new();
    for cfg in cases {
        let mut fitted = build("lenet", ConvAlgo::Convgemm, 4).unwrap();
        let mut opt = Sgd::new(0.05, 0.9, 5e-4).unwrap();
        fit(
            &mut fitted,
            &mut opt,
            &data,
            None,
            &cfg,
            TrainState::default(),
            |_, _, _, _| Ok(()),
        )
        .unwrap();
        assert_eq!(opt.lr, 0.05, "the base rate is restored");
        let mut manual = build("lenet", ConvAlgo::Convgemm, 4).unwrap();
        let mut opt = Sgd::new(0.05, 0.9, 5e-4).unwrap();
        let mut step = 0;
        for epoch in 0..2 {
            for (x, labels) in data.batches(16, Some(3 + epoch as u64)).unwrap() {
                opt.lr = 0.05 * cfg.schedule.factor(step, epoch);
                local_step(&mut manual, &mut opt, x, &labels).unwrap();
                step += 1;
            }
        }
        for ((n, a), (_, b)) in fitted.params().iter().zip(manual.params()) {
            assert_eq!(a.value, b.value, "{n}");
        }
        finals.push(fitted);
    }
    let mut constant = build("lenet", ConvAlgo::Convgemm, 4).unwrap();
    let mut opt = Sgd::new(0.05, 0.9, 5e-4).unwrap();
    let cfg = TrainConfig {
        schedule: LrSchedule::constant(),
        ..cfg
    };
    fit(
        &mut constant,
        &mut opt,
        &data,
        None,
        &cfg,
        TrainState::default(),
        |_, _, _, _| Ok(()),
    )
    .unwrap();
    for f in &finals {
        assert_ne!(f.params()[0].1.value, constant.params()[0].1.value);
    }
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
    let err = build("resnet101", ConvAlgo::Auto, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("lenet, resnet20, vgg16, vgg-a"), "{err}");
}

/// torchvision's parameter counts (`sum(p.numel() for p in m.parameters())` of
/// `torchvision.models.resnet18/34/50()` and `vgg11()`, 1000 classes) and names, and C3D's
/// count by its definition (Tran et al. 2015, 487 classes).
#[test]
fn large_models_have_torchvisions_counts_and_names() {
    let cases = [
        ("resnet18", 11_689_512, vec![1000]),
        ("resnet34", 21_797_672, vec![1000]),
        ("resnet50", 25_557_032, vec![1000]),
        ("vgg-a", 132_863_336, vec![1000]),
        ("c3d", 79_991_015, vec![487]),
    ];
    for (name, count, out) in cases {
        let m = build(name, ConvAlgo::Convgemm, 0).unwrap();
        assert_eq!(m.num_params(), count, "{name}");
        assert_eq!(m.output_shape().unwrap(), out, "{name}");
    }
    let r18 = build("resnet18", ConvAlgo::Convgemm, 0).unwrap();
    let names: Vec<String> = r18.params().into_iter().map(|(n, _)| n).collect();
    for want in [
        "conv1.weight",
        "bn1.bias",
        "layer1.0.conv1.weight",
        "layer1.1.bn2.weight",
        "layer2.0.downsample.0.weight",
        "layer4.1.conv2.weight",
        "fc.bias",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    assert_eq!(
        names.len(),
        62,
        "torchvision's resnet18 has 62 parameter tensors"
    );
    let stats: Vec<String> = r18.buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(stats[0], "bn1.running_mean");
    assert!(stats.contains(&"layer3.0.downsample.1.running_var".to_string()));
    let r50 = build("resnet50", ConvAlgo::Convgemm, 0).unwrap();
    let names: Vec<String> = r50.params().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"layer1.0.downsample.0.weight".to_string()));
    assert!(names.contains(&"layer4.2.conv3.weight".to_string()));
    assert_eq!(
        names.len(),
        161,
        "torchvision's resnet50 has 161 parameter tensors"
    );
    let vgg = build("vgg-a", ConvAlgo::Convgemm, 0).unwrap();
    let names: Vec<String> = vgg.params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[0], "features.0.weight");
    assert!(names.contains(&"features.18.weight".to_string()));
    assert_eq!(names.last().unwrap(), "classifier.6.bias");
    let c3d = build("c3d", ConvAlgo::Convgemm, 0).unwrap();
    let names: Vec<String> = c3d.params().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[0], "conv1.weight");
    assert!(names.contains(&"conv5b.bias".to_string()));
    assert_eq!(names.last().unwrap(), "fc8.bias");
}

#[test]
fn model_options_change_classes_and_input() {
    // A ResNet-18 on CIFAR-sized inputs with 10 classes trains: the loss falls on a fixed batch.
    let opts = ModelOptions {
        classes: Some(10),
        input: Some(vec![3, 32, 32]),
    };
    for name in ["resnet18", "resnet50"] {
        let mut model = build_with(name, &opts, ConvAlgo::Convgemm, 1).unwrap();
        assert_eq!(model.output_shape().unwrap(), [10]);
        let data = Dataset::synthetic(4, &[3, 32, 32], 10, 2).unwrap();
        let mut opt = Sgd::new(0.01, 0.9, 0.0).unwrap();
        let mut losses = Vec::new();
        for _ in 0..4 {
            let (x, labels) = data.batches(4, None).unwrap().next().unwrap();
            let r = local_step(&mut model, &mut opt, x, &labels).unwrap();
            losses.push(r.loss);
        }
        assert!(losses[3] < losses[0], "{name}: {losses:?}");
    }
    // Inputs a model cannot take are errors naming the layer, not panics.
    let small = ModelOptions {
        classes: None,
        input: Some(vec![3, 32, 32]),
    };
    // vgg-a's adaptive average pooling brings any input of at least 32×32 to its 7×7 classifier.
    let vgg = build_with("vgg-a", &small, ConvAlgo::Convgemm, 0).unwrap();
    assert_eq!(vgg.output_shape().unwrap(), [1000]);
    let tiny = ModelOptions {
        classes: None,
        input: Some(vec![3, 16, 16]),
    };
    let err = build_with("vgg-a", &tiny, ConvAlgo::Convgemm, 0)
        .err()
        .unwrap();
    assert!(!err.to_string().is_empty());
    let err = build_with("c3d", &small, ConvAlgo::Convgemm, 0)
        .err()
        .unwrap();
    assert!(!err.to_string().is_empty());
    let none = ModelOptions {
        classes: Some(0),
        input: None,
    };
    assert!(build_with("lenet", &none, ConvAlgo::Convgemm, 0).is_err());
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

/// A temporary directory removed at the end of the test.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("nn-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn idx_bytes(dims: &[u32], payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, 8, dims.len() as u8];
    dims.iter().for_each(|d| b.extend(d.to_be_bytes()));
    b.extend(payload);
    b
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn mnist_files_plain_and_gzip() {
    let dir = TempDir::new("mnist");
    // 3 train images of 2×3 and 2 test images; train files gzipped, test files plain.
    let train_px: Vec<u8> = (0..18).map(|i| (i * 14) as u8).collect();
    std::fs::write(
        dir.0.join("train-images-idx3-ubyte.gz"),
        gzip(&idx_bytes(&[3, 2, 3], &train_px)),
    )
    .unwrap();
    std::fs::write(
        dir.0.join("train-labels-idx1-ubyte.gz"),
        gzip(&idx_bytes(&[3], &[7, 0, 9])),
    )
    .unwrap();
    std::fs::write(
        dir.0.join("t10k-images-idx3-ubyte"),
        idx_bytes(&[2, 2, 3], &[255; 12]),
    )
    .unwrap();
    std::fs::write(
        dir.0.join("t10k-labels-idx1-ubyte"),
        idx_bytes(&[2], &[1, 2]),
    )
    .unwrap();
    let (train, test) = Dataset::mnist(&dir.0).unwrap();
    assert_eq!((train.len(), test.len()), (3, 2));
    assert_eq!(train.sample_shape(), [1, 2, 3]);
    assert_eq!(train.labels(), [7, 0, 9]);
    let (x, _) = train.batches(3, None).unwrap().next().unwrap();
    assert_eq!(x.data()[1], 14.0 / 255.0);
    assert_eq!(x.data()[17], 238.0 / 255.0);

    // Errors name the file: a bad label, a truncated payload, a wrong magic, a missing file.
    std::fs::write(
        dir.0.join("t10k-labels-idx1-ubyte"),
        idx_bytes(&[2], &[1, 12]),
    )
    .unwrap();
    let e = Dataset::mnist(&dir.0).unwrap_err().to_string();
    assert!(e.contains("t10k-labels") && e.contains("label 12"), "{e}");
    std::fs::write(
        dir.0.join("t10k-labels-idx1-ubyte"),
        idx_bytes(&[3], &[1, 2]),
    )
    .unwrap();
    let e = Dataset::mnist(&dir.0).unwrap_err().to_string();
    assert!(
        e.contains("t10k-labels") && e.contains("need 11 bytes"),
        "{e}"
    );
    std::fs::write(
        dir.0.join("t10k-labels-idx1-ubyte"),
        idx_bytes(&[2, 1], &[1, 2]),
    )
    .unwrap();
    let e = Dataset::mnist(&dir.0).unwrap_err().to_string();
    assert!(e.contains("magic"), "{e}");
    std::fs::remove_file(dir.0.join("t10k-labels-idx1-ubyte")).unwrap();
    let e = Dataset::mnist(&dir.0).unwrap_err().to_string();
    assert!(
        e.contains("t10k-labels-idx1-ubyte") && e.contains("not found"),
        "{e}"
    );
    std::fs::write(dir.0.join("t10k-labels-idx1-ubyte.gz"), b"not gzip").unwrap();
    let e = Dataset::mnist(&dir.0).unwrap_err().to_string();
    assert!(e.contains("gzip"), "{e}");
}

#[test]
fn cifar10_binary_records() {
    let dir = TempDir::new("cifar");
    let sub = dir.0.join("cifar-10-batches-bin");
    std::fs::create_dir_all(&sub).unwrap();
    let record = |label: u8, v: u8| [&[label][..], &[v; 3072][..]].concat();
    for i in 1..=5u8 {
        let f = [record(i, i), record(0, 255)].concat();
        std::fs::write(sub.join(format!("data_batch_{i}.bin")), f).unwrap();
    }
    std::fs::write(sub.join("test_batch.bin"), record(9, 51)).unwrap();
    let (train, test) = Dataset::cifar10(&dir.0).unwrap();
    assert_eq!((train.len(), test.len()), (10, 1));
    assert_eq!(train.sample_shape(), [3, 32, 32]);
    assert_eq!(train.labels()[..4], [1, 0, 2, 0]);
    let (x, y) = test.batches(1, None).unwrap().next().unwrap();
    assert_eq!((x.data()[3071], y[0]), (0.2, 9));
    // A truncated file and an out-of-range label are errors naming the file.
    std::fs::write(sub.join("test_batch.bin"), &record(9, 51)[..3000]).unwrap();
    let e = Dataset::cifar10(&dir.0).unwrap_err().to_string();
    assert!(e.contains("test_batch.bin") && e.contains("records"), "{e}");
    std::fs::write(sub.join("test_batch.bin"), record(10, 51)).unwrap();
    let e = Dataset::cifar10(&dir.0).unwrap_err().to_string();
    assert!(e.contains("label 10"), "{e}");
    std::fs::remove_file(sub.join("data_batch_3.bin")).unwrap();
    let e = Dataset::cifar10(&dir.0).unwrap_err().to_string();
    assert!(e.contains("data_batch_3.bin"), "{e}");
}

#[test]
fn volumes_are_learnable_by_a_3d_cnn() {
    use nn::{Conv, ConvConfig, Flatten, Linear, MaxPool, Relu, Sequential};
    use rand::SeedableRng;
    let shape = [1, 12, 12, 12];
    let data = Dataset::volumes(400, &shape, 3).unwrap();
    assert_eq!(
        data,
        Dataset::volumes(400, &shape, 3).unwrap(),
        "deterministic"
    );
    let mut counts = [0; 4];
    data.labels().iter().for_each(|&l| counts[l] += 1);
    assert_eq!(counts, [100; 4]);
    assert!(Dataset::volumes(4, &[1, 12, 12], 0).is_err());
    let (train, test) = data.split(0.25, 0).unwrap();
    let rng = &mut rand::rngs::SmallRng::seed_from_u64(0);
    let mut model = Sequential::new(&shape)
        .push(
            Conv::new(
                ConvConfig::conv3d(1, 8, 3).padding(1),
                ConvAlgo::Convgemm,
                rng,
            )
            .unwrap(),
        )
        .unwrap()
        .push(Relu::new())
        .unwrap()
        .push(MaxPool::new(3, 2).unwrap())
        .unwrap()
        .push(
            Conv::new(
                ConvConfig::conv3d(8, 8, 3).padding(1),
                ConvAlgo::Convgemm,
                rng,
            )
            .unwrap(),
        )
        .unwrap()
        .push(Relu::new())
        .unwrap()
        .push(MaxPool::new(3, 2).unwrap())
        .unwrap()
        .push(Flatten::new())
        .unwrap()
        .push(Linear::new(8 * 27, 4, rng).unwrap())
        .unwrap();
    let mut opt = Sgd::new(0.05, 0.9, 0.0).unwrap();
    let cfg = TrainConfig {
        epochs: 8,
        batch_size: 20,
        ..Default::default()
    };
    let (report, _) = fit(
        &mut model,
        &mut opt,
        &train,
        Some(&test),
        &cfg,
        TrainState::default(),
        |_, _, _, _| Ok(()),
    )
    .unwrap();
    let acc = report.test_accuracy.unwrap();
    assert!(acc > 0.7, "test accuracy {acc} (chance 0.25)");
}

#[test]
fn backward_notify_reports_every_parameter_once_last_layers_first() {
    let opts = ModelOptions {
        classes: Some(10),
        input: Some(vec![3, 32, 32]),
    };
    let data = Dataset::synthetic(2, &[3, 32, 32], 10, 5).unwrap();
    let (x, labels) = data.batches(2, None).unwrap().next().unwrap();
    let mut a = build_with("resnet18", &opts, ConvAlgo::Convgemm, 3).unwrap();
    let mut b = build_with("resnet18", &opts, ConvAlgo::Convgemm, 3).unwrap();
    let (_, dl) = nn::cross_entropy(&a.forward(x.clone(), true).unwrap(), &labels).unwrap();
    a.backward(dl.clone()).unwrap();
    let _ = b.forward(x, true).unwrap();
    let mut seen: Vec<(String, Tensor)> = Vec::new();
    b.backward_notify(dl, &mut |name, p| {
        seen.push((name.to_string(), p.grad.clone()))
    })
    .unwrap();
    let want: Vec<(String, Tensor)> = a
        .params()
        .into_iter()
        .map(|(n, p)| (n, p.grad.clone()))
        .collect();
    assert_eq!(seen.len(), want.len(), "each parameter once");
    assert_eq!(seen[0].0, "fc.weight", "the classifier first");
    assert_eq!(
        seen.last().unwrap().0,
        "conv1.weight",
        "the first convolution last"
    );
    // The same names and (final) gradients as a plain backward.
    let mut sorted = seen.clone();
    sorted.sort_by(|x, y| x.0.cmp(&y.0));
    let mut want_sorted = want;
    want_sorted.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(sorted, want_sorted);
}

/// A model with dropout resumed from a checkpoint draws the masks an uninterrupted run draws:
/// the checkpoint keeps the generator's seed and draw count (the resumed model is built with
/// another seed on purpose).
#[test]
fn resuming_keeps_the_dropout_masks() {
    let dir = std::env::temp_dir().join(format!("nn-ckpt-dropout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.safetensors");
    let model = |seed: u64| {
        let rng = &mut rand::rngs::SmallRng::seed_from_u64(seed);
        Sequential::new(&[1, 8, 8])
            .push(nn::Flatten::new())
            .unwrap()
            .push(nn::Linear::new(64, 32, rng).unwrap())
            .unwrap()
            .push(nn::Relu::new())
            .unwrap()
            .push(nn::Dropout::new(0.5, seed).unwrap())
            .unwrap()
            .push(nn::Linear::new(32, 10, rng).unwrap())
            .unwrap()
    };
    let data = Dataset::synthetic(48, &[1, 8, 8], 10, 5).unwrap();
    let cfg = TrainConfig {
        epochs: 1,
        batch_size: 16,
        ..Default::default()
    };
    let two = TrainConfig {
        epochs: 2,
        ..cfg.clone()
    };
    let quiet = |_: &EpochReport, _: &Sequential, _: &Sgd, _: TrainState| Ok(());
    let mut straight = model(1);
    let mut opt = Sgd::new(0.05, 0.9, 5e-4).unwrap();
    fit(
        &mut straight,
        &mut opt,
        &data,
        None,
        &two,
        TrainState::default(),
        quiet,
    )
    .unwrap();

    let mut first = model(1);
    let mut opt1 = Sgd::new(0.05, 0.9, 5e-4).unwrap();
    let save =
        |_: &EpochReport, m: &Sequential, o: &Sgd, s: TrainState| checkpoint::save(&path, m, o, s);
    fit(
        &mut first,
        &mut opt1,
        &data,
        None,
        &cfg,
        TrainState::default(),
        save,
    )
    .unwrap();
    assert_eq!(first.rng_states()[0].1.draws, 3, "one mask per step");
    let mut resumed = model(2);
    let mut opt2 = Sgd::new(0.05, 0.9, 5e-4).unwrap();
    let state = checkpoint::load(&path, &mut resumed, &mut opt2).unwrap();
    assert_eq!(resumed.rng_states(), first.rng_states());
    fit(&mut resumed, &mut opt2, &data, None, &cfg, state, quiet).unwrap();
    for ((n, a), (_, b)) in straight.params().iter().zip(resumed.params()) {
        assert_eq!(a.value, b.value, "{n} differs after resume");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Profiling times every top-level layer's training forwards and backwards (not evaluation),
/// restarts from zero when turned on, and reports nothing when off.
#[test]
fn profiling_times_each_layer_of_training_steps() {
    let mut model = build("lenet", ConvAlgo::Convgemm, 0).unwrap();
    let mut opt = Sgd::new(0.01, 0.9, 0.0).unwrap();
    let d = Dataset::digits().unwrap().resized(28, 28).unwrap();
    let (x, labels) = d.batches(8, None).unwrap().next().unwrap();
    assert!(model.profile().is_empty());
    local_step(&mut model, &mut opt, x.clone(), &labels).unwrap();
    model.set_profiling(true);
    for _ in 0..2 {
        local_step(&mut model, &mut opt, x.clone(), &labels).unwrap();
    }
    model.forward(x.clone(), false).unwrap();
    let p = model.profile();
    assert_eq!(p.len(), model.layers().len());
    assert_eq!(p[0].name, "0");
    assert!(p[0].layer.starts_with("Conv2d"), "{}", p[0].layer);
    assert!(
        p.iter()
            .all(|l| l.forward_calls == 2 && l.backward_calls == 2),
        "{p:?}"
    );
    let conv = p[0].forward + p[0].backward;
    assert!(conv > std::time::Duration::ZERO, "{p:?}");
    model.set_profiling(true);
    assert!(model.profile().iter().all(|l| l.forward_calls == 0));
    model.set_profiling(false);
    local_step(&mut model, &mut opt, x, &labels).unwrap();
    assert!(model.profile().is_empty());

    // A residual block's layers follow it, with the dotted names of their parameters.
    let mut model = build("resnet20", ConvAlgo::Convgemm, 0).unwrap();
    let mut opt = Sgd::new(0.01, 0.9, 0.0).unwrap();
    let x = Tensor::new(&[2, 3, 32, 32], vec![0.5; 2 * 3 * 32 * 32]).unwrap();
    model.set_profiling(true);
    local_step(&mut model, &mut opt, x, &[1, 2]).unwrap();
    let p = model.profile();
    let names: Vec<&str> = p.iter().map(|l| l.name.as_str()).collect();
    let at = names.iter().position(|&n| n == "6").unwrap();
    assert_eq!(
        names[at..at + 8],
        [
            "6",
            "6.c1",
            "6.b1",
            "6.r1",
            "6.c2",
            "6.b2",
            "6.short.0",
            "6.short.1"
        ],
        "{names:?}"
    );
    assert!(
        p.iter()
            .all(|l| l.forward_calls == 1 && l.backward_calls == 1)
    );
}
