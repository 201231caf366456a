//! Train a CNN: the framework's main job.
//!
//! `cargo run --release -p examples --bin train` trains LeNet-5 on the handwritten digits the
//! repository ships (served at LeNet's 28×28 input), single process, and prints one line per
//! epoch. With `--json` the last line of stdout is one JSON object: `samples_per_sec` (steady
//! state, warm-up steps excluded), `median_samples_per_sec` (the median step's rate, robust on a
//! shared machine), `train_loss`, `test_accuracy`, `peak_rss_bytes`, `steps`,
//! `epochs`, `world_size`, `threads`, `bind` and `worker_cpus` (each pool worker's allowed CPUs,
//! null where unreadable; `--bind` gives each its own).
//!
//! ```text
//! cargo run --release -p examples --bin train -- --epochs 10 --conv-algo convgemm \
//!     --checkpoint lenet.safetensors
//! cargo run --release -p examples --bin train -- --dataset synthetic --steps 50 --json
//! cargo build --release -p examples --features mpi --bin train
//! mpirun -np 2 target/release/train --parallel data --epochs 5
//! mpirun -np 2 target/release/train --parallel channel --model vgg16 --dataset synthetic --steps 4
//! mpirun -np 2 target/release/train --parallel spatial --model c3d --dataset synthetic --steps 4
//! mpirun -np 4 target/release/train --parallel channel --channel-grid 2x2 --model vgg16 \
//!     --dataset synthetic --steps 4
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use dist::{
    Communicator, DataParallel, GridRegistration, ProcessorGrid, Runtime, channel_parallel,
    register, save_channel_parallel, spatial_parallel, split_momentum, stationary_w_parallel,
    sync_batch_norm,
};
use examples::peak_rss_bytes;
use nn::tuning::Loaded;
use nn::{
    Augment, ConvAlgo, Dataset, EpochReport, LrSchedule, ModelOptions, Sequential, Sgd,
    TrainConfig, TrainState, build, build_with, checkpoint, fit_with, local_step,
};

/// The data sets this binary can load.
const DATASETS: &[&str] = &[
    "digits",
    "mnist",
    "fashion-mnist",
    "cifar10",
    "volumes",
    "synthetic",
];

/// Generated samples to hold (`volumes`, `synthetic`): enough for `steps` batches (20 by default,
/// 1000 at most) but at most 256 MiB, and at least one batch; `fit` cycles over them.
fn synthetic_len(sample: &[usize], batch: usize, steps: Option<usize>) -> usize {
    let bytes = 4 * sample.iter().product::<usize>().max(1);
    let want = batch * steps.unwrap_or(20).clamp(1, 1000);
    want.min((256 << 20) / bytes).max(batch)
}

/// Train a convolutional network on this machine.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Model to train: lenet (LeNet-5, 1×28×28 inputs), resnet20 or vgg16 (3×32×32), vgg-a,
    /// resnet18, resnet34, resnet50 (torchvision's, 3×224×224; the ResNets take any input of at
    /// least 32×32, e.g. CIFAR-10's), c3d (3×16×112×112 clips). The classifier is sized to the
    /// data set's classes.
    #[arg(long, default_value = "lenet")]
    model: String,
    /// Data set: `digits` (shipped with the repository; 20% held out as the test split),
    /// `mnist`, `fashion-mnist` or `cifar10` (their distribution files in --data-dir, with their
    /// own test splits), `volumes` (generated 3D shapes at a 3D model's input size, 20% held
    /// out) or `synthetic` (random inputs of the model's shape, for throughput).
    #[arg(long, default_value = "digits")]
    dataset: String,
    /// Directory holding the files of `mnist`, `fashion-mnist` (`train-images-idx3-ubyte[.gz]`,
    /// `train-labels-idx1-ubyte[.gz]`, `t10k-…`) or `cifar10` (`data_batch_1.bin`…`test_batch.bin`,
    /// directly or in `cifar-10-batches-bin/`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
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
    /// Learning-rate schedule: `cosine` (linear warm-up over --lr-warmup steps, then cosine
    /// annealing to 0 at the run's last step: its epochs, or --steps); `step` (times --lr-gamma
    /// at each of the --lr-milestones epochs); `constant`. A resumed run continues it.
    #[arg(long, default_value = "cosine", value_parser = ["constant", "cosine", "step"])]
    lr_schedule: String,
    /// Warm-up steps of the cosine schedule; default: half an epoch, at most a tenth of the run.
    #[arg(long)]
    lr_warmup: Option<usize>,
    /// Epochs (counted from 0) at which the step schedule multiplies the rate by --lr-gamma.
    #[arg(long, value_delimiter = ',')]
    lr_milestones: Vec<usize>,
    /// Factor of the step schedule.
    #[arg(long, default_value_t = 0.1)]
    lr_gamma: f32,
    /// Threads (rayon pool size); default: all cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Bind worker i of the pool to the i-th CPU of the process's affinity mask
    /// (`core_blas::bind_workers`, as `OMP_PROC_BIND=close` does); default: unbound, the
    /// scheduler places the workers. Give each process its own CPUs (mpirun's `--bind-to core`,
    /// taskset) before binding, or two processes share the first CPUs.
    #[arg(long)]
    bind: bool,
    /// Convolution algorithm: auto, im2col, convgemm or winograd.
    #[arg(long, default_value = "auto")]
    conv_algo: ConvAlgo,
    /// Save a checkpoint (safetensors) here after every epoch.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Resume from this checkpoint (model, optimizer state and position).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Seed of weights, split, shuffles and augmentation.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Augment the training samples with a random crop after zero padding by this many pixels
    /// on every side (torchvision's `RandomCrop(size, padding)`; CIFAR-10's recipe uses 4).
    /// The draws depend on the seed, the epoch and the sample, so a resumed run repeats them
    #[arg(long, default_value_t = 0, value_name = "PAD")]
    random_crop: usize,
    /// Augment the training samples with a horizontal flip (of the last axis) with
    /// probability ½, after the crop
    #[arg(long)]
    random_flip: bool,
    /// Keep `auto`'s measured choices in this file: loaded before training when it exists
    /// (the layers it covers skip the measurement and make the same choices, so a resumed run
    /// repeats the interrupted one's arithmetic), written after the first step and at the end.
    /// A file written for other GEMM kernels (another CPU) is ignored and rewritten.
    #[arg(long, value_name = "FILE")]
    tune_cache: Option<PathBuf>,
    /// Print a JSON summary as the last line of stdout.
    #[arg(long)]
    json: bool,
    /// Distributed layout when launched by mpirun (build with `--features mpi`):
    /// `data` = data-parallel synchronous SGD over all ranks (each trains on its shard of every
    /// batch); `channel` = channel/filter parallelism over all ranks (the convolutions whose
    /// channels divide by the rank count are split by channels, every rank sees every sample);
    /// `spatial` = spatial parallelism over all ranks (the convolutions and max-pools whose
    /// first spatial axis has at least as many rows as ranks run on blocks of rows, with halo
    /// exchanges; every rank sees every sample and holds every weight);
    /// `SxC` (e.g. `2x2`) = a grid of S sample blocks × C channel blocks, `SxCs` (e.g. `2x2s`)
    /// the same with C blocks of rows. Rank 0 prints and writes checkpoints (not with channel
    /// blocks, whose weights are split). Without MPI the world is this one process.
    #[arg(long)]
    parallel: Option<String>,
    /// With C channel blocks (`--parallel channel` or `SxC`): run every split convolution with
    /// the stationary-w algorithm on a `PCxPF` grid of the C blocks (PC · PF = C; each rank
    /// holds a K/PF × C/PC block of every split weight) instead of alternating stationary-x
    /// and stationary-y.
    #[arg(long, value_name = "PCxPF")]
    channel_grid: Option<String>,
    /// With several sample blocks, normalise each batch norm with its own shard's statistics
    /// (PyTorch DDP's default: no collectives inside the model, but the replicas no longer take
    /// the steps one process takes on the whole batch). By default the statistics are summed
    /// over the ranks holding the batch (a synchronised batch norm).
    #[arg(long)]
    local_batch_norm: bool,
    /// Time every layer (a residual block, and each layer inside it) in the training steps
    /// after the first and print a table of forward and backward milliseconds per step at the
    /// end (rank 0's layers under mpirun).
    #[arg(long)]
    profile: bool,
}

/// After the first training step (warm-up: allocations, `auto`'s measurements), turns on the
/// per-layer profile when `profile` and writes `auto`'s choices to `tune_cache` (when given).
fn after_first_step(
    profile: bool,
    tune_cache: Option<&Path>,
) -> impl FnMut(&mut Sequential) -> nn::Result<()> {
    let mut steps = 0usize;
    move |m: &mut Sequential| {
        steps += 1;
        if steps == 1 {
            if profile {
                m.set_profiling(true);
            }
            if let Some(path) = tune_cache {
                nn::tuning::save(path)?;
            }
        }
        Ok(())
    }
}

/// The per-layer profile of `model` as a table: milliseconds per step in forward and backward,
/// and each layer's share of the total (the top-level layers' sum; nested layers are indented
/// under the block that contains them).
fn profile_table(model: &Sequential) -> String {
    let p = model.profile();
    // Top-level layers, then the ones nested in them (dotted names), indented.
    let depth = |name: &str| name.matches('.').count();
    let steps = p.iter().map(|l| l.forward_calls).max().unwrap_or(0).max(1) as f64;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3 / steps;
    let top = || p.iter().filter(|l| depth(&l.name) == 0);
    let total: f64 = top().map(|l| ms(l.forward) + ms(l.backward)).sum();
    let mut out = format!(
        "profile over {steps} steps after the first (ms per step):\n{:<10} {:>9} {:>9} {:>6}  layer\n",
        "name", "forward", "backward", "share"
    );
    for l in &p {
        let (f, b) = (ms(l.forward), ms(l.backward));
        let mut desc = l.layer.clone();
        if desc.chars().count() > 60 {
            desc = desc.chars().take(57).chain("...".chars()).collect();
        }
        let name = format!("{}{}", "  ".repeat(depth(&l.name)), l.name);
        out.push_str(&format!(
            "{name:<10} {f:>9.2} {b:>9.2} {:>5.1}%  {desc}\n",
            100.0 * (f + b) / total.max(f64::MIN_POSITIVE)
        ));
    }
    let (f, b): (f64, f64) = top()
        .map(|l| (ms(l.forward), ms(l.backward)))
        .fold((0.0, 0.0), |(a, c), (x, y)| (a + x, c + y));
    out.push_str(&format!("{:<10} {f:>9.2} {b:>9.2} 100.0%\n", "total"));
    out
}

/// The schedule `args` ask for, over a run of `samples` training samples per epoch resumed at
/// `state`: the cosine ends at the last step of the run's epochs, or of its --steps.
fn lr_schedule(args: &Args, samples: usize, state: TrainState) -> Result<LrSchedule, String> {
    let schedule = match args.lr_schedule.as_str() {
        "cosine" => {
            let per_epoch = samples.div_ceil(args.batch_size.max(1));
            let end = (state.epoch + args.epochs) * per_epoch;
            let end = args.steps.map_or(end, |s| end.min(state.step + s));
            let warmup = args.lr_warmup.unwrap_or((per_epoch / 2).min(end / 10));
            LrSchedule::cosine(warmup, end)
        }
        "step" => LrSchedule::multi_step(args.lr_milestones.clone(), args.lr_gamma),
        _ => Ok(LrSchedule::constant()),
    };
    schedule.map_err(|e| format!("--lr-schedule {}: {e}", args.lr_schedule))
}

/// The grid row's communicator registered alone, or with the stationary-w grid over it.
enum RowRegistration {
    Row(dist::Registration),
    Grid(GridRegistration),
}

impl RowRegistration {
    /// The handle of the row in rank order.
    fn handle(&self) -> dist::CommHandle {
        match self {
            RowRegistration::Row(r) => r.handle(),
            RowRegistration::Grid(g) => g.handles().full,
        }
    }

    /// The row in rank order.
    fn comm(&self) -> std::rc::Rc<dist::World> {
        match self {
            RowRegistration::Row(r) => r.comm(),
            RowRegistration::Grid(g) => g.comm(),
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Everything, MPI included, runs on one thread of the pool: a parallel loop started from a
    // pool thread is not injected from outside and waited for across threads (with one thread
    // that round trip cost LeNet 1-2% of its step time).
    let builder = rayon::ThreadPoolBuilder::new().num_threads(args.threads.unwrap_or(0));
    let builder = if args.bind {
        core_blas::bind_workers(builder).map_err(|e| format!("--bind: {e}"))
    } else {
        Ok(builder)
    };
    let result = builder
        .and_then(|b| b.build().map_err(|e| e.to_string()))
        .and_then(|pool| pool.install(|| run(&args).map_err(|e| e.to_string())));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let threads = rayon::current_num_threads();
    // Each worker's CPUs (its affinity mask), so a run says whether and where its pool was bound
    // (JSON null where the mask cannot be read; an unbound run does not need it).
    let worker_cpus = rayon::broadcast(|_| core_blas::allowed_cpus().ok())
        .into_iter()
        .collect::<Option<Vec<_>>>();
    let runtime = Runtime::init()?;
    let world = runtime.world();
    let (root, ranks) = (world.is_root(), world.size());
    // Launched by mpirun with several ranks, but built without MPI: every rank would train alone.
    let launched = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
        .unwrap_or(1);
    if launched > 1 && ranks == 1 {
        return Err(format!(
            "launched as one of {launched} MPI ranks, but this binary has no MPI: \
             build it with `--features mpi`"
        )
        .into());
    }
    // The processor grid, samples × blocks, and whether the blocks split channels or rows.
    let (grid_shape, spatial) = match (args.parallel.as_deref(), ranks) {
        (None, 1) => (None, false),
        (None, n) => return Err(format!("launched on {n} ranks: pass --parallel data").into()),
        (Some("data"), n) => (Some((n, 1)), false),
        (Some("channel"), n) => (Some((1, n)), false),
        (Some("spatial"), n) => (Some((1, n)), true),
        (Some(other), n) => {
            let (layout, spatial) = match other.strip_suffix('s') {
                Some(l) => (l, true),
                None => (other, false),
            };
            let grid = layout
                .split_once('x')
                .and_then(|(s, c)| Some((s.parse::<usize>().ok()?, c.parse::<usize>().ok()?)));
            match grid {
                Some((s, c)) if s * c == n => (Some((s, c)), spatial),
                Some((s, c)) => {
                    return Err(format!(
                        "--parallel {other}: a {s}×{c} grid needs {} ranks, launched on {n}",
                        s * c
                    )
                    .into());
                }
                None => {
                    return Err(format!(
                        "unknown --parallel `{other}` (available: data, channel, spatial, SxC, SxCs)"
                    )
                    .into());
                }
            }
        }
    };
    let channel_grid = match args.channel_grid.as_deref() {
        None => None,
        Some(g) => {
            let channels = grid_shape.filter(|_| !spatial).map_or(1, |(_, c)| c);
            let parsed = g
                .split_once('x')
                .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
            match parsed {
                Some((pc, pf)) if pc * pf == channels && channels > 1 => Some((pc, pf)),
                Some((pc, pf)) => {
                    return Err(format!(
                        "--channel-grid {g}: a {pc}×{pf} grid needs {} channel blocks, the layout \
                         has {channels} (use --parallel channel or SxC over {} ranks)",
                        pc * pf,
                        pc * pf
                    )
                    .into());
                }
                None => {
                    return Err(format!("--channel-grid `{g}`: expected PCxPF, e.g. 2x2").into());
                }
            }
        }
    };
    // Rank 0 talks; the other ranks train silently.
    macro_rules! say {
        ($($t:tt)*) => { if root { println!($($t)*); } };
    }
    // The model's own sample shape and classes decide how `digits`, `volumes` and `synthetic`
    // are served; the file data sets have theirs, and the model is rebuilt to match them.
    let mut model = build(&args.model, args.conv_algo, args.seed)?;
    let input = model.input_shape().to_vec();
    let classes = *model.output_shape()?.first().ok_or("model has no output")?;
    let data_dir = || {
        args.data_dir.as_deref().ok_or_else(|| {
            format!(
                "--dataset {} reads its files from --data-dir (see --help)",
                args.dataset
            )
        })
    };
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
        "mnist" | "fashion-mnist" => {
            let (train, test) = Dataset::mnist(data_dir()?)?;
            (train, Some(test))
        }
        "cifar10" => {
            let (train, test) = Dataset::cifar10(data_dir()?)?;
            (train, Some(test))
        }
        "volumes" => {
            if input.len() != 4 {
                return Err(format!(
                    "model `{}` takes {input:?} inputs; volumes need a 3D model (C × D × H × W, e.g. c3d)",
                    args.model
                )
                .into());
            }
            let n = synthetic_len(&input, args.batch_size, None);
            let (train, test) = Dataset::volumes(n, &input, args.seed)?.split(0.2, args.seed)?;
            (train, Some(test))
        }
        "synthetic" => {
            let n = synthetic_len(&input, args.batch_size, args.steps);
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
    if train.sample_shape() != input.as_slice() || train.classes() != classes {
        let opts = ModelOptions {
            classes: Some(train.classes()),
            input: Some(train.sample_shape().to_vec()),
        };
        model = build_with(&args.model, &opts, args.conv_algo, args.seed).map_err(|e| {
            format!(
                "model `{}` on {} samples of {:?} with {} classes: {e}",
                args.model,
                args.dataset,
                train.sample_shape(),
                train.classes()
            )
        })?;
    }
    let mut opt = Sgd::new(args.lr, 0.9, 5e-4)?;
    let mut state = TrainState::default();
    if let Some(path) = &args.resume {
        state = checkpoint::load(path, &mut model, &mut opt)?;
        say!(
            "resumed from {} at epoch {}, step {}",
            path.display(),
            state.epoch,
            state.step
        );
    }
    say!(
        "{} ({} parameters) on {} ({} train / {} test samples), {ranks} rank(s) × {threads} thread(s), kernels {}",
        args.model,
        model.num_params(),
        args.dataset,
        train.len(),
        test.as_ref().map_or(0, |t| t.len()),
        core_blas::isa()?,
    );
    if let Some(path) = args.tune_cache.as_deref().filter(|p| p.exists()) {
        match nn::tuning::load(path)? {
            Loaded::Choices(n) => say!("auto: {n} measured choices loaded from {}", path.display()),
            Loaded::Stale { file, here } => say!(
                "auto: {} was measured with kernels {file}, this run has {here}: measuring again",
                path.display()
            ),
        }
    }
    // Only rank 0 writes the tuning file (every rank may read it).
    let tune_cache = args.tune_cache.as_deref().filter(|_| root);
    let cfg = TrainConfig {
        epochs: args.epochs,
        max_steps: args.steps,
        batch_size: args.batch_size,
        seed: args.seed,
        schedule: lr_schedule(args, train.len(), state)?,
        augment: Augment {
            crop_padding: args.random_crop,
            hflip: args.random_flip,
        },
        ..TrainConfig::default()
    };
    let total = state.epoch + args.epochs;
    let report_epoch = |e: &EpochReport| {
        let test = e.test.map_or(String::new(), |(l, a)| {
            format!("  test loss {l:.4}  test acc {:.1}%", 100.0 * a)
        });
        let train_acc = if e.train_accuracy.is_nan() {
            String::new()
        } else {
            format!("  train acc {:.1}%", 100.0 * e.train_accuracy)
        };
        say!(
            "epoch {:>3}/{total}  step {:>6}  loss {:.4}{train_acc}{test}  {:.2} s",
            e.epoch,
            e.step,
            e.train_loss,
            e.seconds
        );
    };
    let (report, _) = if let Some((samples, channels)) = grid_shape {
        let grid = ProcessorGrid::new(&world, samples, channels)?;
        let part = grid.coords().1;
        let (channel_comm, sample_comm) = grid.into_comms();
        // The row alone, or the stationary-w grid over it (which registers the row too).
        let registration = match channel_grid {
            Some((pc, pf)) => RowRegistration::Grid(GridRegistration::new(channel_comm, pc, pf)?),
            None => RowRegistration::Row(register(channel_comm)),
        };
        let row_handle = registration.handle();
        let mut channel_plan = None;
        if channels > 1 && spatial {
            let (split, plan) = spatial_parallel(model, row_handle, channels, part)?;
            model = split;
            say!(
                "{samples}×{channels} grid: rows split {:?}, whole {:?}",
                plan.split,
                plan.whole
            );
        } else if channels > 1 {
            let (split, plan) = match &registration {
                RowRegistration::Grid(g) => stationary_w_parallel(model, g.handles())?,
                RowRegistration::Row(_) => channel_parallel(model, row_handle, channels, part)?,
            };
            model = split;
            if args.resume.is_some() {
                // The checkpoint was loaded whole; the momentum follows the model's blocks.
                split_momentum(&mut opt, &model, &plan, channels, part)?;
            }
            if let Some((pc, pf)) = plan.grid {
                say!(
                    "{samples}×{channels} grid, channel blocks as {pc}×{pf}: stationary-w {:?}, \
                     stationary-x {:?}, batch norm on blocks {:?}, whole {:?}",
                    plan.stationary_w,
                    plan.channel,
                    plan.batch_norm,
                    plan.whole
                );
            } else {
                say!(
                    "{samples}×{channels} grid: channel parallel {:?}, filter parallel {:?}, \
                     batch norm on blocks {:?}, whole {:?}",
                    plan.channel,
                    plan.filter,
                    plan.batch_norm,
                    plan.whole
                );
            }
            channel_plan = Some(plan);
        }
        let samples_reg = register(sample_comm);
        let sample_comm = samples_reg.comm();
        // Batch norm's statistics span the ranks that hold parts of its input: the sample blocks
        // (their rows replicate it) or, with blocks of rows, the whole grid.
        let world_reg = (spatial && channels > 1).then(|| register(runtime.world()));
        if samples > 1 && !args.local_batch_norm {
            let stats = world_reg.as_ref().unwrap_or(&samples_reg).handle();
            model = sync_batch_norm(model, stats)?;
        }
        let mut dp = DataParallel::new(&*sample_comm);
        dp.broadcast_model(&mut model)?;
        let mut after_step = after_first_step(args.profile, tune_cache);
        fit_with(
            &mut model,
            &mut opt,
            &train,
            test.as_ref(),
            &cfg,
            state,
            |m, o, x, l| {
                let r = dp.step_result(m, o, &x, l)?;
                after_step(m)?;
                Ok(r)
            },
            |e, m, o, s| {
                report_epoch(e);
                match (&args.checkpoint, &channel_plan) {
                    // Every rank of a row gathers its blocks; rank 0 writes the whole model.
                    (Some(path), Some(plan)) => {
                        let row = registration.comm();
                        save_channel_parallel(path, m, o, s, plan, &row, root)
                    }
                    (Some(path), None) if root => Ok(checkpoint::save(path, m, o, s)?),
                    _ => Ok(()),
                }
            },
        )?
    } else {
        let mut after_step = after_first_step(args.profile, tune_cache);
        fit_with(
            &mut model,
            &mut opt,
            &train,
            test.as_ref(),
            &cfg,
            state,
            |m, o, x, l| {
                let r = local_step(m, o, x, l)?;
                after_step(m)?;
                Ok(r)
            },
            |e, m, o, s| {
                report_epoch(e);
                match &args.checkpoint {
                    Some(path) if root => checkpoint::save(path, m, o, s),
                    _ => Ok(()),
                }
            },
        )?
    };
    say!(
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
    if let Some(path) = tune_cache {
        // Again at the end: choices made after the first step included.
        nn::tuning::save(path)?;
    }
    if root {
        print!(
            "model as run (`auto` shows what it measured and chose):\n{}",
            model.summary()
        );
        if args.profile {
            print!("{}", profile_table(&model));
        }
    }
    if args.json && root {
        let summary = serde_json::json!({
            "model": args.model,
            "dataset": args.dataset,
            "samples_per_sec": report.samples_per_sec,
            "median_samples_per_sec": report.median_samples_per_sec,
            "train_loss": report.train_loss,
            "test_accuracy": report.test_accuracy,
            "peak_rss_bytes": peak_rss_bytes(),
            "steps": report.steps,
            "epochs": report.epochs,
            "world_size": ranks,
            "threads": threads,
            "bind": args.bind,
            "worker_cpus": worker_cpus,
            "batch_size": args.batch_size,
            "conv_algo": args.conv_algo.to_string(),
        });
        println!("{summary}");
    }
    Ok(())
}
