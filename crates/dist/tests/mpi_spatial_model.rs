//! Multi-rank test of spatial parallelism in training: under `mpirun -np N` (`cargo xtask test`
//! runs N = 1, 2, 4), for every `samples × blocks` processor grid of N ranks, a 2D and a 3D CNN
//! made spatially parallel by `dist::spatial_parallel` (rows of the first spatial axis split over
//! the grid row, halo exchanges between blocks) and trained with `DataParallel` (over the grid
//! column) take the same steps as the whole model trained on one process: equal losses at every
//! step, equal parameters and logits afterwards. Odd sizes, strides, padding, a padded max-pool,
//! unequal blocks and a last batch of one sample (empty shards) are on purpose. A third model
//! has batch norm and residual blocks (nested in a stage, one with a projection shortcut); with
//! several sample blocks its batch norms are synchronised over the whole grid
//! (`dist::sync_batch_norm`), so it too takes the single process's steps.
//! One PASS line per rank; the first failed check aborts.

use dist::{
    CommHandle, Communicator, DataParallel, ProcessorGrid, Runtime, SpatialPlan, World, register,
    spatial_parallel, sync_batch_norm,
};
use nn::{Conv, ConvAlgo, ConvConfig, Flatten, Linear, MaxPool, Relu, Sequential, Sgd, local_step};
use rand::SeedableRng;
use rand::rngs::SmallRng;

mod common;
use common::{batch, close, resnet};

/// 3×13×11 samples, 5 classes: 13 rows → 13 (3×3, pad 1) → 7 (5×5, stride 2, pad 2) → 4
/// (max-pool 3, stride 2, pad 1) → 2 (3×3, no padding), then the classifier (width 11 → 1).
fn model2d(algo: ConvAlgo, seed: u64) -> nn::Result<Sequential> {
    let rng = &mut SmallRng::seed_from_u64(seed);
    Sequential::new(&[3, 13, 11])
        .push(Conv::new(
            ConvConfig::conv2d(3, 6, 3).padding(1),
            algo,
            rng,
        )?)?
        .push(Relu::new())?
        .push(Conv::new(
            ConvConfig::conv2d(6, 8, 5).stride(2).padding(2),
            algo,
            rng,
        )?)?
        // No ReLU before this pool: its padding rows must lose to negative values.
        .push(MaxPool::nd(&[3, 3], &[2, 2], &[1, 1])?)?
        .push(Conv::new(ConvConfig::conv2d(8, 8, 3), algo, rng)?)?
        .push(Relu::new())?
        .push(Flatten::new())?
        .push(Linear::new(8 * 2, 5, rng)?)
}

/// 2×9×6×5 volumes: 9 rows → 9 (3×3×3, pad 1) → 4 (max-pool 2) → 4 (3×3×3, pad 1).
fn model3d(algo: ConvAlgo, seed: u64) -> nn::Result<Sequential> {
    let rng = &mut SmallRng::seed_from_u64(seed);
    Sequential::new(&[2, 9, 6, 5])
        .push(Conv::new(
            ConvConfig::conv3d(2, 4, 3).padding(1),
            algo,
            rng,
        )?)?
        .push(Relu::new())?
        .push(MaxPool::new(3, 2)?)?
        .push(Conv::new(
            ConvConfig::conv3d(4, 4, 3).padding(1),
            algo,
            rng,
        )?)?
        .push(Relu::new())?
        .push(Flatten::new())?
        .push(Linear::new(4 * 4 * 3 * 2, 5, rng)?)
}

type Build = fn(ConvAlgo, u64) -> nn::Result<Sequential>;

/// Trains `build`'s model split and whole on grid `samples × blocks`; the number of checks.
/// `everyone` is the whole world, registered (the batch norms' statistics span it).
fn run(
    world: &World,
    everyone: CommHandle,
    build: Build,
    samples: usize,
    blocks: usize,
    want_plan: &SpatialPlan,
) -> Result<usize, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let algo = ConvAlgo::Convgemm;
    let grid = ProcessorGrid::new(world, samples, blocks).map_err(|x| e(&x))?;
    let part = grid.coords().1;
    let (row_comm, sample_comm) = grid.into_comms();
    let reg = register(row_comm);
    let (mut split, plan) = spatial_parallel(
        build(algo, 7).map_err(|x| e(&x))?,
        reg.handle(),
        blocks,
        part,
    )
    .map_err(|x| e(&x))?;
    if &plan != want_plan {
        return Err(format!("plan {plan:?}, expected {want_plan:?}"));
    }
    if samples > 1 {
        split = sync_batch_norm(split, everyone).map_err(|x| e(&x))?;
    }
    let mut whole = build(algo, 7).map_err(|x| e(&x))?;
    let sample = whole.input_shape().to_vec();
    let mut opt_split = Sgd::new(0.2, 0.9, 5e-4).map_err(|x| e(&x))?;
    let mut opt_whole = opt_split.clone();
    let mut dp = DataParallel::new(&sample_comm);
    let mut checks = 0;
    // The last batch of one sample leaves the ranks of every sample block but the first
    // without samples: they still run the split layers' exchanges and the batch norms' sums.
    for (step, n) in [12, 12, 12, 1].into_iter().enumerate() {
        let (x, labels) = batch(n, &sample, 100 + step as u64);
        let got = dp
            .step(&mut split, &mut opt_split, &x, &labels)
            .map_err(|x| e(&x))?;
        let want = local_step(&mut whole, &mut opt_whole, x, &labels)
            .map_err(|x| e(&x))?
            .loss;
        close(&format!("loss of step {step}"), &[got], &[want])?;
        checks += 1;
    }
    // Parameters are whole on every rank, under the whole model's names.
    let (got, want) = (split.params(), whole.params());
    if got.len() != want.len() {
        return Err(format!("{} parameters, expected {}", got.len(), want.len()));
    }
    for ((gn, g), (wn, w)) in got.iter().zip(&want) {
        if gn != wn {
            return Err(format!("parameter {gn}, expected {wn}"));
        }
        close(&format!("parameter {gn}"), g.value.data(), w.value.data())?;
        checks += 1;
    }
    let (x, _) = batch(5, &sample, 999);
    let got = split.forward(x.clone(), false).map_err(|x| e(&x))?;
    let want = whole.forward(x, false).map_err(|x| e(&x))?;
    close("logits after training", got.data(), want.data())?;
    Ok(checks + 1)
}

fn plan(split: &[&str], whole: &[&str]) -> SpatialPlan {
    SpatialPlan {
        split: split.iter().map(|s| s.to_string()).collect(),
        whole: whole.iter().map(|s| s.to_string()).collect(),
    }
}

fn main() {
    let runtime = match Runtime::init() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mpi_spatial_model: FAIL: cannot initialise MPI: {e}");
            std::process::exit(1);
        }
    };
    let world = runtime.world();
    let everyone = register(runtime.world());
    let size = world.size();
    let mut checks = 0;
    for blocks in (1..=size).filter(|c| size % c == 0) {
        // 2D: with 4 blocks the last convolution (4 → 2 rows) runs whole after a gather.
        let plan2d = match blocks {
            1 => plan(&[], &["0", "2", "3", "4"]),
            2 | 3 => plan(&["0", "2", "3", "4"], &[]),
            _ => plan(&["0", "2", "3"], &["4"]),
        };
        let plan3d = match blocks {
            1 => plan(&[], &["0", "2", "3"]),
            _ => plan(&["0", "2", "3"], &[]),
        };
        let convs = [
            "0",
            "layer1.0.c1",
            "layer1.0.c2",
            "layer1.1.c1",
            "layer1.1.c2",
            "layer1.1.short.0",
        ];
        let plan_res = match blocks {
            1 => plan(&[], &convs),
            _ => plan(&convs, &[]),
        };
        let models = [
            ("2D", model2d as Build, plan2d),
            ("3D", model3d as Build, plan3d),
            ("residual", resnet as Build, plan_res),
        ];
        for (what, build, want) in models {
            match run(
                &world,
                everyone.handle(),
                build,
                size / blocks,
                blocks,
                &want,
            ) {
                Ok(n) => checks += n,
                Err(msg) => {
                    eprintln!(
                        "mpi_spatial_model: rank {}/{size}: FAIL: {what}, grid {}×{blocks}: {msg}",
                        world.rank(),
                        size / blocks,
                    );
                    world.abort(1);
                }
            }
        }
    }
    println!(
        "mpi_spatial_model: rank {}/{size}: PASS ({checks} checks)",
        world.rank()
    );
}
