//! Train a CNN: the framework's main job.
//!
//! `cargo run --release -p examples --bin train` trains LeNet-5 on the handwritten digits the
//! repository ships (served at LeNet's 28×28 input), single process, and prints one line per
//! epoch. With `--json` the last line of stdout is one JSON object: `samples_per_sec` (steady
//! state, warm-up steps excluded), `train_loss`, `test_accuracy`, `peak_rss_bytes`, `steps`,
//! `epochs`, `world_size`, `threads`.
//!
//! ```text
//! cargo run --release -p examples --bin train -- --epochs 10 --conv-algo convgemm \
//!     --checkpoint lenet.safetensors
//! cargo run --release -p examples --bin train -- --dataset synthetic --steps 50 --json
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use examples::peak_rss_bytes;
use nn::{ConvAlgo, Dataset, Sgd, TrainConfig, TrainState, build, checkpoint, fit};

/// The data sets this binary can load.
const DATASETS: &[&str] = &["digits", "synthetic"];

/// Train a convolutional network on this machine.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Model to train: lenet (LeNet-5, 1×28×28 inputs), resnet20 or vgg16 (3×32×32 inputs).
    #[arg(long, default_value = "lenet")]
    model: String,
    /// Data set: `digits` (shipped with the repository; 20% held out as the test split) or
    /// `synthetic` (random inputs of the model's shape, for throughput).
    #[arg(long, default_value = "digits")]
    dataset: String,
    /// Epochs to train.
    #[arg(long, default_value_t = 10)]
    epochs: usize,
    /// Stop after this many optimizer steps.
    #[arg(long)]
    steps: Option<usize>,
    /// Samples per mini-batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Learning rate (SGD, momentum 0.9, weight decay 5e-4).
    #[arg(long, default_value_t = 0.05)]
    lr: f32,
    /// Threads (rayon pool size); default: all cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Convolution algorithm: auto, im2col, convgemm or winograd.
    #[arg(long, default_value = "auto")]
    conv_algo: ConvAlgo,
    /// Save a checkpoint (safetensors) here after every epoch.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Resume from this checkpoint (model, optimizer state and position).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Seed of weights, split and shuffles.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print a JSON summary as the last line of stdout.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(t) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build_global()?;
    }
    let threads = rayon::current_num_threads();
    let mut model = build(&args.model, args.conv_algo, args.seed)?;
    let input = model.input_shape().to_vec();
    let (train, test) = match args.dataset.as_str() {
        "digits" => {
            let d = Dataset::digits()?;
            let d = match input.as_slice() {
                [1, h, w] => d.resized(*h, *w)?,
                _ => {
                    return Err(format!(
                        "model `{}` takes {input:?} inputs; digits are 1×8×8",
                        args.model
                    )
                    .into());
                }
            };
            let (train, test) = d.split(0.2, args.seed)?;
            (train, Some(test))
        }
        "synthetic" => {
            let classes = *model.output_shape()?.first().ok_or("model has no output")?;
            let n = args.batch_size * args.steps.unwrap_or(20).clamp(1, 1000);
            (Dataset::synthetic(n, &input, classes, args.seed)?, None)
        }
        other => {
            return Err(format!(
                "unknown dataset `{other}` (available: {})",
                DATASETS.join(", ")
            )
            .into());
        }
    };
    let mut opt = Sgd::new(args.lr, 0.9, 5e-4)?;
    let mut state = TrainState::default();
    if let Some(path) = &args.resume {
        state = checkpoint::load(path, &mut model, &mut opt)?;
        println!(
            "resumed from {} at epoch {}, step {}",
            path.display(),
            state.epoch,
            state.step
        );
    }
    println!(
        "{} ({} parameters) on {} ({} train / {} test samples), {threads} thread(s), kernels {}",
        args.model,
        model.num_params(),
        args.dataset,
        train.len(),
        test.as_ref().map_or(0, |t| t.len()),
        core_blas::isa()?,
    );
    let cfg = TrainConfig {
        epochs: args.epochs,
        max_steps: args.steps,
        batch_size: args.batch_size,
        seed: args.seed,
        ..TrainConfig::default()
    };
    let total = state.epoch + args.epochs;
    let (report, _) = fit(
        &mut model,
        &mut opt,
        &train,
        test.as_ref(),
        &cfg,
        state,
        |e, m, o, s| {
            let test = e.test.map_or(String::new(), |(l, a)| {
                format!("  test loss {l:.4}  test acc {:.1}%", 100.0 * a)
            });
            println!(
                "epoch {:>3}/{total}  step {:>6}  loss {:.4}  train acc {:.1}%{test}  {:.2} s",
                e.epoch,
                e.step,
                e.train_loss,
                100.0 * e.train_accuracy,
                e.seconds
            );
            if let Some(path) = &args.checkpoint {
                checkpoint::save(path, m, o, s)?;
            }
            Ok(())
        },
    )?;
    println!(
        "done: {} epochs, {} steps, {:.0} samples/s, final train loss {:.4}{}",
        report.epochs,
        report.steps,
        report.samples_per_sec,
        report.train_loss,
        report.test_accuracy.map_or(String::new(), |a| format!(
            ", test accuracy {:.1}%",
            100.0 * a
        )),
    );
    print!(
        "model as run (`auto` shows what it measured and chose):\n{}",
        model.summary()
    );
    if args.json {
        let summary = serde_json::json!({
            "model": args.model,
            "dataset": args.dataset,
            "samples_per_sec": report.samples_per_sec,
            "train_loss": report.train_loss,
            "test_accuracy": report.test_accuracy,
            "peak_rss_bytes": peak_rss_bytes(),
            "steps": report.steps,
            "epochs": report.epochs,
            "world_size": 1,
            "threads": threads,
            "batch_size": args.batch_size,
            "conv_algo": args.conv_algo.to_string(),
        });
        println!("{summary}");
    }
    Ok(())
}
