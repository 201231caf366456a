//! The `train` binary end to end: its JSON contract, checkpoint and resume, and clear errors.

use std::process::Command;

fn train(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_train"))
        .args(args)
        .output()
        .expect("run train")
}

#[test]
fn json_summary_is_the_last_line() {
    let out = train(&[
        "--steps",
        "4",
        "--batch-size",
        "16",
        "--json",
        "--threads",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    for key in [
        "samples_per_sec",
        "median_samples_per_sec",
        "train_loss",
        "test_accuracy",
        "peak_rss_bytes",
        "steps",
        "epochs",
        "world_size",
        "threads",
    ] {
        assert!(v.get(key).is_some(), "`{key}` missing from {last}");
    }
    assert_eq!(v["steps"], 4);
    assert_eq!(v["epochs"], 0, "stopped mid-epoch");
    assert_eq!(v["world_size"], 1);
    assert_eq!(v["threads"], 1);
    assert!(v["samples_per_sec"].as_f64().unwrap() > 0.0);
    assert!(v["median_samples_per_sec"].as_f64().unwrap() > 0.0);
    assert!(v["train_loss"].as_f64().unwrap().is_finite());
    let acc = v["test_accuracy"]
        .as_f64()
        .expect("digits have a test split");
    assert!((0.0..=1.0).contains(&acc), "{acc}");
}

/// The JSON line's `worker_cpus`: each pool worker's allowed CPUs.
fn worker_cpus(v: &serde_json::Value) -> Vec<Vec<u64>> {
    v["worker_cpus"]
        .as_array()
        .expect("worker_cpus")
        .iter()
        .map(|w| {
            w.as_array()
                .expect("a worker's CPUs")
                .iter()
                .map(|c| c.as_u64().expect("a CPU"))
                .collect()
        })
        .collect()
}

#[test]
fn bind_gives_each_worker_its_own_cpu_and_trains_the_same() {
    let run = |bind: bool| {
        let mut args = vec![
            "--steps",
            "3",
            "--batch-size",
            "16",
            "--json",
            "--threads",
            "2",
            "--conv-algo",
            "convgemm",
        ];
        if bind {
            args.push("--bind");
        }
        let out = train(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(v["bind"], bind);
        v
    };
    let (free, bound) = (run(false), run(true));
    let (free_cpus, bound_cpus) = (worker_cpus(&free), worker_cpus(&bound));
    assert_eq!(free_cpus.len(), 2);
    assert_eq!(bound_cpus.len(), 2);
    // Unbound workers keep the process's mask; bound ones get one CPU each, taken in order from
    // it (the same CPU twice only when the process may use a single CPU).
    let mask = &free_cpus[0];
    assert!(free_cpus.iter().all(|w| w == mask), "{free_cpus:?}");
    let mut want: Vec<Vec<u64>> = mask.iter().take(2).map(|&c| vec![c]).collect();
    if want.len() == 1 {
        want.push(want[0].clone());
    }
    let mut got = bound_cpus.clone();
    got.sort();
    assert_eq!(got, want, "bound workers' CPUs");
    // Binding moves threads, not arithmetic: the same losses.
    assert_eq!(free["train_loss"], bound["train_loss"]);
}

#[test]
fn checkpoint_then_resume_continues_counting() {
    let dir = std::env::temp_dir().join(format!("train-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("lenet.safetensors");
    let ckpt = ckpt.to_str().unwrap();
    let common = [
        "--dataset",
        "synthetic",
        "--steps",
        "100",
        "--batch-size",
        "8",
        "--epochs",
        "1",
        "--json",
    ];
    let first = train(&[&common[..], &["--checkpoint", ckpt]].concat());
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = train(&[&common[..], &["--resume", ckpt]].concat());
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let stdout = String::from_utf8(second.stdout).unwrap();
    assert!(stdout.contains("resumed from"), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(v["epochs"], 2);
    let steps = v["steps"].as_u64().unwrap();
    assert_eq!(steps, 200, "two epochs of 100 steps");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_arguments_are_clear_errors() {
    for (args, needle) in [
        (&["--dataset", "imagenet"][..], "unknown dataset `imagenet`"),
        (&["--dataset", "mnist"][..], "--data-dir"),
        (
            &["--dataset", "cifar10", "--data-dir", "/nonexistent"][..],
            "/nonexistent/data_batch_1.bin: not found",
        ),
        (&["--dataset", "volumes"][..], "volumes need a 3D model"),
        (
            &["--model", "resnet101"][..],
            "`resnet101` is not a model (available: lenet, resnet20, vgg16, vgg-a",
        ),
        (&["--conv-algo", "fft"][..], "fft"),
        (&["--batch-size", "0", "--steps", "1"][..], "batch_size"),
        (
            &["--resume", "/nonexistent/x.safetensors"][..],
            "/nonexistent/x.safetensors",
        ),
        (
            &["--parallel", "model"][..],
            "unknown --parallel `model` (available: data, channel, spatial, SxC, SxCs)",
        ),
        (
            &["--parallel", "2x2"][..],
            "a 2×2 grid needs 4 ranks, launched on 1",
        ),
        (
            &["--parallel", "1x2s"][..],
            "a 1×2 grid needs 2 ranks, launched on 1",
        ),
        (
            &["--parallel", "channel", "--channel-grid", "2x2"][..],
            "a 2×2 grid needs 4 channel blocks, the layout has 1",
        ),
        (
            &["--channel-grid", "2by2"][..],
            "--channel-grid `2by2`: expected PCxPF",
        ),
        (
            &["--steps", "4", "--lr-warmup", "4"][..],
            "cosine over 4 steps with 4 warm-up steps",
        ),
        (
            &["--lr-schedule", "step", "--lr-gamma", "0"][..],
            "`lr gamma`: 0 (must be finite and > 0)",
        ),
        (
            &["--lr-schedule", "linear"][..],
            "possible values: constant, cosine, step",
        ),
        (
            &["--random-crop", "28", "--steps", "1"][..],
            "whose height and width exceed the crop padding (28)",
        ),
    ] {
        let out = train(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn every_layout_on_one_process_trains() {
    // Without mpirun the world is this process: the distributed paths run unchanged (one block).
    for layout in ["data", "channel", "spatial"] {
        let out = train(&["--parallel", layout, "--epochs", "1", "--json"]);
        assert!(
            out.status.success(),
            "{layout}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        // The epoch line reports the training accuracy summed over the ranks.
        assert!(stdout.contains("train acc"), "{layout}: {stdout}");
        let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(v["world_size"], 1, "{layout}");
        assert_eq!(v["epochs"], 1, "{layout}");
    }
}

#[test]
#[cfg(not(feature = "mpi"))]
fn several_mpi_ranks_without_mpi_is_an_error() {
    // What mpirun sets for each rank; a binary without the mpi feature must not train alone.
    let out = Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--steps", "1"])
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--features mpi"),
        "{err}"
    );
}

#[test]
fn cifar10_files_train_a_torchvision_resnet() {
    // Two CIFAR-10 binary files of random records; ResNet-18 is rebuilt for 3×32×32 and 10 classes.
    let dir = std::env::temp_dir().join(format!("train-cli-cifar-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let record = |i: usize| {
        let mut r = vec![(i % 10) as u8];
        r.extend((0..3072).map(|p| ((p * 7 + i * 13) % 256) as u8));
        r
    };
    for (f, n) in [
        ("data_batch_1.bin", 8),
        ("data_batch_2.bin", 8),
        ("data_batch_3.bin", 8),
        ("data_batch_4.bin", 8),
        ("data_batch_5.bin", 8),
        ("test_batch.bin", 4),
    ] {
        let bytes: Vec<u8> = (0..n).flat_map(record).collect();
        std::fs::write(dir.join(f), bytes).unwrap();
    }
    let out = train(&[
        "--model",
        "resnet18",
        "--dataset",
        "cifar10",
        "--data-dir",
        dir.to_str().unwrap(),
        "--batch-size",
        "8",
        "--epochs",
        "1",
        "--lr",
        "0.01",
        "--conv-algo",
        "convgemm",
        // CIFAR-10's augmentation recipe.
        "--random-crop",
        "4",
        "--random-flip",
        "--json",
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("40 train / 4 test samples"), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(v["steps"], 5, "one epoch of 40 samples in batches of 8");
    assert!(v["train_loss"].as_f64().unwrap().is_finite());
    assert!(v["test_accuracy"].as_f64().is_some());
}

#[test]
fn predict_runs_a_checkpoint_and_names_bad_input() {
    use safetensors::{Dtype, SafeTensors, tensor::TensorView};
    let dir = std::env::temp_dir().join(format!("predict-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = |f: &str| dir.join(f).to_str().unwrap().to_string();
    let out = train(&[
        "--dataset",
        "synthetic",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--epochs",
        "1",
        "--checkpoint",
        &p("lenet.safetensors"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let x: Vec<u8> = (0..3 * 28 * 28)
        .flat_map(|i| ((i % 17) as f32 / 17.0).to_le_bytes())
        .collect();
    let view = TensorView::new(Dtype::F32, vec![3, 1, 28, 28], &x).unwrap();
    safetensors::serialize_to_file(
        [("x", view)],
        None,
        std::path::Path::new(&p("x.safetensors")),
    )
    .unwrap();
    let predict = |input: &str| {
        Command::new(env!("CARGO_BIN_EXE_predict"))
            .args(["--model", "lenet", "--checkpoint", &p("lenet.safetensors")])
            .args(["--input", input, "--output", &p("y.safetensors")])
            .output()
            .unwrap()
    };
    let run = predict(&p("x.safetensors"));
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let bytes = std::fs::read(p("y.safetensors")).unwrap();
    let y = SafeTensors::deserialize(&bytes).unwrap();
    let logits = y.tensor("logits").unwrap();
    assert_eq!(logits.shape(), [3, 10]);
    assert!(
        logits
            .data()
            .chunks_exact(4)
            .all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
    );
    // A file without `x`, and a missing file, are errors naming the file.
    let bad = predict(&p("lenet.safetensors"));
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no tensor `x`"));
    let missing = predict(&p("nope.safetensors"));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nope.safetensors"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--profile` prints one row per top-level layer, timed over the steps after the first.
#[test]
fn profile_prints_a_row_per_layer() {
    let out = train(&["--steps", "3", "--batch-size", "8", "--profile"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let table = stdout
        .split("profile over 2 steps after the first")
        .nth(1)
        .unwrap_or_else(|| panic!("no profile of 2 steps: {stdout}"));
    let rows: Vec<&str> = table.lines().skip(2).collect();
    // LeNet-5's layers, then the total.
    assert!(
        rows[0].starts_with("0 ") && rows[0].contains("Conv2d"),
        "{table}"
    );
    let total = rows.last().unwrap();
    assert!(
        total.starts_with("total") && total.ends_with("100.0%"),
        "{table}"
    );
    assert!(rows.len() > 8, "{table}");
}

/// `--tune-cache`: the first run writes `auto`'s choices; a run interrupted after one epoch and
/// resumed, both loading them, takes the same choices and ends bit for bit where the
/// uninterrupted run ended. Another machine's file is replaced; a malformed one is an error.
#[test]
fn tune_cache_makes_a_resumed_auto_run_repeat_the_whole_run() {
    let dir = std::env::temp_dir().join(format!("train-cli-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cache, ckpt) = (dir.join("tune.txt"), dir.join("lenet.safetensors"));
    let (cache_s, ckpt_s) = (cache.to_str().unwrap(), ckpt.to_str().unwrap());
    let common = [
        "--model",
        "lenet",
        "--batch-size",
        "64",
        "--threads",
        "1",
        // The cosine schedule ends with each run's epochs: the interrupted run's first half
        // would anneal to 0 within its one epoch.
        "--lr-schedule",
        "constant",
        "--json",
        "--tune-cache",
        cache_s,
    ];
    let run = |extra: &[&str]| {
        let out = train(&[&common[..], extra].concat());
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            out.status.success(),
            "{extra:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        (stdout, v)
    };
    let (_, whole) = run(&["--epochs", "2"]);
    let text = std::fs::read_to_string(&cache).unwrap();
    let choices = text.lines().filter(|l| l.contains(" algo=")).count();
    assert!(choices >= 1, "LeNet's 5×5 layers are measured: {text}");
    let (first, _) = run(&["--epochs", "1", "--checkpoint", ckpt_s]);
    // The first run's choices are this process's: it measured none of them.
    assert!(
        first.contains(&format!(
            "auto: {choices} measured choices loaded from {cache_s}"
        )),
        "{first}"
    );
    let (second, resumed) = run(&["--epochs", "1", "--resume", ckpt_s]);
    assert!(second.contains("resumed from"), "{second}");
    for key in ["train_loss", "test_accuracy"] {
        assert_eq!(resumed[key], whole[key], "{key}: {second}");
    }
    // Written for other kernels: ignored, measured again, rewritten with ours.
    let kernels = text
        .lines()
        .nth(1)
        .unwrap()
        .split("kernels=")
        .nth(1)
        .unwrap()
        .to_string();
    std::fs::write(&cache, text.replace(&kernels, "neon-f32-8x12")).unwrap();
    let (stale, _) = run(&["--epochs", "1", "--steps", "2"]);
    assert!(
        stale.contains("was measured with kernels neon-f32-8x12, this run has"),
        "{stale}"
    );
    assert!(std::fs::read_to_string(&cache).unwrap().contains(&kernels));
    // Malformed: a clear error naming the file and line.
    std::fs::write(&cache, "# nn auto-tuning choices\nformat=1 kernels\n").unwrap();
    let out = train(&[&common[..], &["--steps", "1"]].concat());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("tuning file {cache_s}, line 2:")),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
