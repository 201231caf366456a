//! Multi-rank test of a channel-parallel model in training: under `mpirun -np N` (`cargo xtask
//! test` runs N = 1, 2, 4), for every `samples × channels` processor grid of N ranks, a small CNN
//! made channel parallel by `dist::channel_parallel` (over the grid row) and trained with
//! `DataParallel` (over the grid column) takes the same steps as the whole model trained on one
//! process, for a plain CNN and for a ResNet whose residual blocks and batch norms run on
//! channel blocks (batch norm synchronised over the sample blocks): equal losses at every step (the last batch of one sample leaves ranks without
//! samples) and equal logits afterwards. Then the split model is
//! checkpointed (`dist::save_channel_parallel`: the whole tensors gathered from the row's
//! blocks): the file equals the single-process model, running statistics and momentum, and a
//! split model resumed
//! from it takes the single process's next step. The same runs again with every convolution
//! stationary-w (`dist::stationary_w_parallel`) on every `pc × pf` split of the row. One PASS
//! line per rank; the first failed check aborts the job.

use dist::{
    ChannelPlan, Communicator, DataParallel, GridRegistration, ProcessorGrid, Runtime, World,
    channel_parallel, register, save_channel_parallel, split_momentum, stationary_w_parallel,
    sync_batch_norm,
};
use nn::checkpoint::{self, TrainState};
use nn::{
    Conv, ConvAlgo, ConvConfig, Flatten, Linear, MaxPool, Relu, Sequential, Sgd, Tensor, local_step,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;

mod common;
use common::close;

/// A batch for `kind`'s model.
fn batch(kind: Kind, n: usize, seed: u64) -> (Tensor, Vec<usize>) {
    let sample: &[usize] = match kind {
        Kind::Plain => &[3, 10, 9],
        Kind::Residual => &[3, 11, 10],
    };
    common::batch(n, sample, seed)
}

/// The two models under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Convolutions, ReLUs and a max-pool.
    Plain,
    /// A ResNet (`common::resnet`): a stage of residual blocks, one with a projection shortcut.
    Residual,
}

fn model(kind: Kind, algo: ConvAlgo, seed: u64) -> nn::Result<Sequential> {
    match kind {
        Kind::Plain => plain(algo, seed),
        Kind::Residual => common::resnet(algo, seed),
    }
}

/// The plan `channel_parallel` must make of `kind`'s model on `channels` blocks.
fn want_plan(kind: Kind, channels: usize) -> ChannelPlan {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match (kind, channels) {
        (Kind::Plain, 1) => ChannelPlan {
            whole: names(&["0", "2", "5", "7"]),
            ..ChannelPlan::default()
        },
        (Kind::Plain, _) => ChannelPlan {
            channel: names(&["2", "7"]),
            filter: names(&["5"]),
            whole: names(&["0"]),
            ..ChannelPlan::default()
        },
        (Kind::Residual, 1) => ChannelPlan {
            whole: names(&[
                "0",
                "layer1.0.c1",
                "layer1.0.c2",
                "layer1.1.c1",
                "layer1.1.c2",
                "layer1.1.short.0",
            ]),
            ..ChannelPlan::default()
        },
        // The stage (a nested sequence of two blocks) runs on channel blocks. Block 1's
        // shortcut starts its own alternation; its body goes on from block 0's.
        (Kind::Residual, _) => ChannelPlan {
            channel: names(&["layer1.0.c1", "layer1.1.c1", "layer1.1.short.0"]),
            filter: names(&["layer1.0.c2", "layer1.1.c2"]),
            batch_norm: names(&[
                "layer1.0.b1",
                "layer1.0.b2",
                "layer1.1.b1",
                "layer1.1.b2",
                "layer1.1.short.1",
            ]),
            whole: names(&["0"]),
            ..ChannelPlan::default()
        },
    }
}

/// The plan `stationary_w_parallel` must make of `kind`'s model on a `pc × pf` grid.
fn want_plan_w(kind: Kind, grid: (usize, usize)) -> ChannelPlan {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    if grid == (1, 1) {
        return ChannelPlan {
            grid: Some(grid),
            ..want_plan(kind, 1)
        };
    }
    match kind {
        // Every split convolution flips the distribution: 2 runs in it, 5 in the flipped one,
        // 7 in it again; the gather follows.
        Kind::Plain => ChannelPlan {
            stationary_w: names(&["2", "5", "7"]),
            transposed: names(&["5"]),
            whole: names(&["0"]),
            grid: Some(grid),
            ..ChannelPlan::default()
        },
        // Each body flips twice; block 1's projection shortcut (one convolution) keeps the
        // distribution with a stationary-x convolution.
        Kind::Residual => ChannelPlan {
            channel: names(&["layer1.1.short.0"]),
            stationary_w: names(&["layer1.0.c1", "layer1.0.c2", "layer1.1.c1", "layer1.1.c2"]),
            batch_norm: names(&[
                "layer1.0.b1",
                "layer1.0.b2",
                "layer1.1.b1",
                "layer1.1.b2",
                "layer1.1.short.1",
            ]),
            transposed: names(&["layer1.0.b1", "layer1.0.c2", "layer1.1.b1", "layer1.1.c2"]),
            whole: names(&["0"]),
            grid: Some(grid),
            ..ChannelPlan::default()
        },
    }
}

/// 3×10×9 samples, 5 classes: a whole stem (3 channels), a split run of three convolutions with
/// a max-pool inside (8 → 8 → 16 → 8 channels: stationary x, y, x), the classifier whole.
fn plain(algo: ConvAlgo, seed: u64) -> nn::Result<Sequential> {
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

/// A channel-parallel registration: the row alone, or a stationary-w grid over it.
enum Reg {
    Alternate(dist::Registration),
    W(GridRegistration),
}

impl Reg {
    fn split(
        &self,
        model: Sequential,
        channels: usize,
        part: usize,
    ) -> dist::Result<(Sequential, ChannelPlan)> {
        match self {
            Reg::Alternate(r) => channel_parallel(model, r.handle(), channels, part),
            Reg::W(g) => stationary_w_parallel(model, g.handles()),
        }
    }

    fn comm(&self) -> std::rc::Rc<World> {
        match self {
            Reg::Alternate(r) => r.comm(),
            Reg::W(g) => g.comm(),
        }
    }
}

/// Trains `kind`'s model for a few steps on grid `samples × channels`, split by
/// `channel_parallel` or, with `w = Some((pc, pf))`, by `stationary_w_parallel` on that split of
/// the row; the number of checks.
fn run(
    world: &World,
    kind: Kind,
    samples: usize,
    channels: usize,
    w: Option<(usize, usize)>,
) -> Result<usize, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let algo = ConvAlgo::Convgemm;
    let grid = ProcessorGrid::new(world, samples, channels).map_err(|x| e(&x))?;
    let part = grid.coords().1;
    let (channel_comm, sample_comm) = grid.into_comms();
    let reg = match w {
        None => Reg::Alternate(register(channel_comm)),
        Some((pc, pf)) => Reg::W(GridRegistration::new(channel_comm, pc, pf).map_err(|x| e(&x))?),
    };
    let (split, plan) = reg
        .split(model(kind, algo, 7).map_err(|x| e(&x))?, channels, part)
        .map_err(|x| e(&x))?;
    let want = match w {
        None => want_plan(kind, channels),
        Some(g) => want_plan_w(kind, g),
    };
    if plan != want {
        return Err(format!("plan {plan:?}, expected {want:?}"));
    }
    // Batch norm's statistics are summed over the sample blocks (ranks of one channel block).
    let samples_reg = register(sample_comm);
    let sample_comm = samples_reg.comm();
    let mut split = if samples > 1 {
        sync_batch_norm(split, samples_reg.handle()).map_err(|x| e(&x))?
    } else {
        split
    };
    let mut whole = model(kind, algo, 7).map_err(|x| e(&x))?;
    let mut opt_split = Sgd::new(0.3, 0.9, 5e-4).map_err(|x| e(&x))?;
    let mut opt_whole = opt_split.clone();
    let mut dp = DataParallel::new(&*sample_comm);
    let mut checks = 0;
    // The last batch of one sample leaves the ranks of every sample block but the first
    // without samples: they still run the channel blocks' collectives.
    for (step, n) in [12, 12, 12, 1].into_iter().enumerate() {
        let (x, labels) = batch(kind, n, 100 + step as u64);
        let got = dp
            .step(&mut split, &mut opt_split, &x, &labels)
            .map_err(|x| e(&x))?;
        let want = local_step(&mut whole, &mut opt_whole, x, &labels)
            .map_err(|x| e(&x))?
            .loss;
        close(&format!("loss of step {step}"), &[got], &[want])?;
        checks += 1;
    }
    let (x, _) = batch(kind, 5, 999);
    let got = split.forward(x.clone(), false).map_err(|x| e(&x))?;
    let want = whole.forward(x, false).map_err(|x| e(&x))?;
    close("logits after training", got.data(), want.data())?;
    checks += 1;

    // A checkpoint of the split model is the whole model's (rank 0 writes, every row gathers).
    let mut id = [std::process::id() as f32];
    world.broadcast(&mut id, 0).map_err(|x| e(&x))?;
    let path = std::env::temp_dir().join(format!(
        "mpi-channel-ckpt-{}-{kind:?}-{samples}x{channels}.safetensors",
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
    let mut resumed = model(kind, algo, 99).map_err(|x| e(&x))?;
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
    for ((name, p), (_, q)) in resumed.buffers().iter().zip(whole.buffers()) {
        close(&format!("checkpointed {name}"), p.data(), q.data())?;
        checks += 1;
    }
    let (got, want) = (opt_resumed.buffers(), opt_whole.buffers());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        close(&format!("checkpointed momentum {i}"), g, w)?;
        checks += 1;
    }
    // Resumed and split again, it takes the single process's next step.
    let (split, plan) = reg.split(resumed, channels, part).map_err(|x| e(&x))?;
    split_momentum(&mut opt_resumed, &split, &plan, channels, part).map_err(|x| e(&x))?;
    let mut split = if samples > 1 {
        sync_batch_norm(split, samples_reg.handle()).map_err(|x| e(&x))?
    } else {
        split
    };
    let (x, labels) = batch(kind, 12, 200);
    let got = dp
        .step(&mut split, &mut opt_resumed, &x, &labels)
        .map_err(|x| e(&x))?;
    let want = local_step(&mut whole, &mut opt_whole, x, &labels)
        .map_err(|x| e(&x))?
        .loss;
    close("loss of the step after resuming", &[got], &[want])?;
    let (x, _) = batch(kind, 5, 998);
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
    for kind in [Kind::Plain, Kind::Residual] {
        for channels in (1..=size).filter(|c| size % c == 0) {
            let splits = (1..=channels)
                .filter(|pc| channels % pc == 0)
                .map(|pc| Some((pc, channels / pc)));
            for w in std::iter::once(None).chain(splits) {
                match run(&world, kind, size / channels, channels, w) {
                    Ok(n) => checks += n,
                    Err(what) => {
                        eprintln!(
                            "mpi_channel_model: rank {}/{size}: FAIL: {kind:?}, grid {}×{channels}, stationary-w {w:?}: {what}",
                            world.rank(),
                            size / channels,
                        );
                        world.abort(1);
                    }
                }
            }
        }
    }
    println!(
        "mpi_channel_model: rank {}/{size}: PASS ({checks} checks)",
        world.rank()
    );
}
