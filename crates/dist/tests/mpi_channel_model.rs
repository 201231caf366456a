//! Multi-rank test of a channel-parallel model in training: under `mpirun -np N` (`cargo xtask
//! test` runs N = 1, 2, 4), for every `samples × channels` processor grid of N ranks, a small CNN
//! made channel parallel by `dist::channel_parallel` (over the grid row) and trained with
//! `DataParallel` (over the grid column) takes the same steps as the whole model trained on one
//! process: equal losses at every step (the last batch of one sample leaves ranks without
//! samples) and equal logits afterwards. Then the split model is
//! checkpointed (`dist::save_channel_parallel`: the whole tensors gathered from the row's
//! blocks): the file equals the single-process model and momentum, and a split model resumed
//! from it takes the single process's next step. One PASS line per rank; the first failed
//! check aborts the job.

use dist::{
    ChannelPlan, Communicator, DataParallel, ProcessorGrid, Runtime, World, channel_parallel,
    register, save_channel_parallel, split_momentum,
};
use nn::checkpoint::{self, TrainState};
use nn::{
    Conv, ConvAlgo, ConvConfig, Flatten, Linear, MaxPool, Relu, Sequential, Sgd, Tensor, local_step,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;

mod common;
use common::close;

/// The model's sample shape.
const SAMPLE: [usize; 3] = [3, 10, 9];

fn batch(n: usize, seed: u64) -> (Tensor, Vec<usize>) {
    common::batch(n, &SAMPLE, seed)
}

/// 3×10×9 samples, 5 classes: a whole stem (3 channels), a split run of three convolutions with
/// a max-pool inside (8 → 8 → 16 → 8 channels: stationary x, y, x), the classifier whole.
fn model(algo: ConvAlgo, seed: u64) -> nn::Result<Sequential> {
    let rng = &mut SmallRng::seed_from_u64(seed);
    Sequential::new(&[3, 10, 9])
        .push(Conv::new(
            ConvConfig::conv2d(3, 8, 3).padding(1),
            algo,
            rng,
        )?)?
        .push(Relu::new())?
        .push(Conv::new(
            ConvConfig::conv2d(8, 8, 3).padding(1),
            algo,
            rng,
        )?)?
        .push(Relu::new())?
        .push(MaxPool::new(2, 2)?)?
        .push(Conv::new(
            ConvConfig::conv2d(8, 16, 3).padding(1),
            algo,
            rng,
        )?)?
        .push(Relu::new())?
        .push(Conv::new(ConvConfig::conv2d(16, 8, 3), algo, rng)?)?
        .push(Relu::new())?
        .push(Flatten::new())?
        .push(Linear::new(8 * 3 * 2, 5, rng)?)
}

/// Trains both models for a few steps on grid `samples × channels`; the number of checks.
fn run(world: &World, samples: usize, channels: usize) -> Result<usize, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let algo = ConvAlgo::Convgemm;
    let grid = ProcessorGrid::new(world, samples, channels).map_err(|x| e(&x))?;
    let part = grid.coords().1;
    let (channel_comm, sample_comm) = grid.into_comms();
    let reg = register(channel_comm);
    let (mut split, plan) = channel_parallel(
        model(algo, 7).map_err(|x| e(&x))?,
        reg.handle(),
        channels,
        part,
    )
    .map_err(|x| e(&x))?;
    let want_plan = if channels == 1 {
        ChannelPlan {
            whole: ["0", "2", "5", "7"].map(String::from).to_vec(),
            ..ChannelPlan::default()
        }
    } else {
        ChannelPlan {
            channel: vec!["2".into(), "7".into()],
            filter: vec!["5".into()],
            whole: vec!["0".into()],
        }
    };
    if plan != want_plan {
        return Err(format!("plan {plan:?}, expected {want_plan:?}"));
    }
    let mut whole = model(algo, 7).map_err(|x| e(&x))?;
    let mut opt_split = Sgd::new(0.3, 0.9, 5e-4).map_err(|x| e(&x))?;
    let mut opt_whole = opt_split.clone();
    let mut dp = DataParallel::new(&sample_comm);
    let mut checks = 0;
    // The last batch of one sample leaves the ranks of every sample block but the first
    // without samples: they still run the channel blocks' collectives.
    for (step, n) in [12, 12, 12, 1].into_iter().enumerate() {
        let (x, labels) = batch(n, 100 + step as u64);
        let got = dp
            .step(&mut split, &mut opt_split, &x, &labels)
            .map_err(|x| e(&x))?;
        let want = local_step(&mut whole, &mut opt_whole, x, &labels)
            .map_err(|x| e(&x))?
            .loss;
        close(&format!("loss of step {step}"), &[got], &[want])?;
        checks += 1;
    }
    let (x, _) = batch(5, 999);
    let got = split.forward(x.clone(), false).map_err(|x| e(&x))?;
    let want = whole.forward(x, false).map_err(|x| e(&x))?;
    close("logits after training", got.data(), want.data())?;
    checks += 1;

    // A checkpoint of the split model is the whole model's (rank 0 writes, every row gathers).
    let mut id = [std::process::id() as f32];
    world.broadcast(&mut id, 0).map_err(|x| e(&x))?;
    let path = std::env::temp_dir().join(format!(
        "mpi-channel-ckpt-{}-{samples}x{channels}.safetensors",
        id[0] as u64
    ));
    let state = TrainState { epoch: 0, step: 4 };
    let row = reg.comm();
    save_channel_parallel(
        &path,
        &split,
        &opt_split,
        state,
        &plan,
        &row,
        world.rank() == 0,
    )
    .map_err(|x| e(&x))?;
    world.barrier().map_err(|x| e(&x))?;
    let mut resumed = model(algo, 99).map_err(|x| e(&x))?;
    let mut opt_resumed = Sgd::new(0.3, 0.9, 5e-4).map_err(|x| e(&x))?;
    let loaded = checkpoint::load(&path, &mut resumed, &mut opt_resumed).map_err(|x| e(&x))?;
    world.barrier().map_err(|x| e(&x))?;
    if world.rank() == 0 {
        std::fs::remove_file(&path).map_err(|x| e(&x))?;
    }
    if loaded != state {
        return Err(format!("checkpoint state {loaded:?}, expected {state:?}"));
    }
    for ((name, p), (_, q)) in resumed.params().iter().zip(whole.params()) {
        close(
            &format!("checkpointed {name}"),
            p.value.data(),
            q.value.data(),
        )?;
        checks += 1;
    }
    let (got, want) = (opt_resumed.buffers(), opt_whole.buffers());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        close(&format!("checkpointed momentum {i}"), g, w)?;
        checks += 1;
    }
    // Resumed and split again, it takes the single process's next step.
    let (mut split, plan) =
        channel_parallel(resumed, reg.handle(), channels, part).map_err(|x| e(&x))?;
    split_momentum(&mut opt_resumed, &split, &plan, channels, part).map_err(|x| e(&x))?;
    let (x, labels) = batch(12, 200);
    let got = dp
        .step(&mut split, &mut opt_resumed, &x, &labels)
        .map_err(|x| e(&x))?;
    let want = local_step(&mut whole, &mut opt_whole, x, &labels)
        .map_err(|x| e(&x))?
        .loss;
    close("loss of the step after resuming", &[got], &[want])?;
    let (x, _) = batch(5, 998);
    let got = split.forward(x.clone(), false).map_err(|x| e(&x))?;
    let want = whole.forward(x, false).map_err(|x| e(&x))?;
    close("logits after resuming", got.data(), want.data())?;
    Ok(checks + 2)
}

fn main() {
    let runtime = match Runtime::init() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mpi_channel_model: FAIL: cannot initialise MPI: {e}");
            std::process::exit(1);
        }
    };
    let world = runtime.world();
    let size = world.size();
    let mut checks = 0;
    for channels in (1..=size).filter(|c| size % c == 0) {
        match run(&world, size / channels, channels) {
            Ok(n) => checks += n,
            Err(what) => {
                eprintln!(
                    "mpi_channel_model: rank {}/{size}: FAIL: grid {}×{channels}: {what}",
                    world.rank(),
                    size / channels,
                );
                world.abort(1);
            }
        }
    }
    println!(
        "mpi_channel_model: rank {}/{size}: PASS ({checks} checks)",
        world.rank()
    );
}
