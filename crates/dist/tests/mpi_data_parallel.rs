//! Multi-rank test of data-parallel training: under `mpirun -np N` (`cargo xtask test` runs
//! N = 1, 2, 4), every rank trains LeNet-5 data-parallel for a few steps and checks (1) that all
//! replicas hold bit-identical parameters and (2) that they equal, to rounding, a single-process
//! run on whole mini-batches that every rank computes itself. It does so for three chunkings of
//! the overlapped gradient exchange: one chunk per parameter tensor (posted during
//! backpropagation), 20,000-value chunks, and one chunk after backpropagation. Then a residual
//! model with batch norm, its batch norms synchronised over the ranks (`dist::sync_batch_norm`),
//! takes the single process's steps too, the last batch leaving a rank without samples on 4
//! ranks. One PASS line per rank; the first failed check aborts the job.

use dist::{CommHandle, Communicator, DataParallel, Runtime, World, register, sync_batch_norm};
use nn::{ConvAlgo, Dataset, Sequential, Sgd, build, cross_entropy, local_step};

mod common;
use common::{batch, close, resnet};

const BATCH: usize = 12;
const STEPS: usize = 3;

fn fail(world: &World, what: String) -> ! {
    eprintln!(
        "mpi_data_parallel: rank {}/{}: FAIL: {what}",
        world.rank(),
        world.size()
    );
    world.abort(1)
}

fn flat(model: &Sequential) -> Vec<f32> {
    model
        .params()
        .iter()
        .flat_map(|(_, p)| p.value.data().to_vec())
        .collect()
}

fn run(world: &World, chunk: usize) -> Result<usize, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    // Ranks start from different seeds: broadcast_model must make them equal.
    let mut model = build("lenet", ConvAlgo::Convgemm, world.rank() as u64).map_err(|x| e(&x))?;
    let mut reference = build("lenet", ConvAlgo::Convgemm, 0).map_err(|x| e(&x))?;
    let (mut opt, mut ropt) = (
        Sgd::new(0.05, 0.9, 5e-4).map_err(|x| e(&x))?,
        Sgd::new(0.05, 0.9, 5e-4).map_err(|x| e(&x))?,
    );
    // A last batch of 3 samples: on 4 ranks one rank has none and posts every chunk without
    // backpropagating, in the same order as the others.
    let data = Dataset::synthetic(BATCH * STEPS + 3, &[1, 28, 28], 10, 7).map_err(|x| e(&x))?;
    let mut dp = DataParallel::new(world).with_chunk(chunk);
    dp.broadcast_model(&mut model).map_err(|x| e(&x))?;
    let mut checks = 0;
    for (step, (x, labels)) in data.batches(BATCH, None).map_err(|x| e(&x))?.enumerate() {
        let got = dp
            .step_result(&mut model, &mut opt, &x, &labels)
            .map_err(|x| e(&x))?;
        let loss = got.loss;
        let logits = reference.forward(x, true).map_err(|x| e(&x))?;
        let right = nn::correct(&logits, &labels);
        if got.correct != Some(right) {
            return Err(format!(
                "step {step}: {:?} right over the ranks, {right} on one process",
                got.correct
            ));
        }
        let (rloss, dl) = cross_entropy(&logits, &labels).map_err(|x| e(&x))?;
        reference.backward(dl).map_err(|x| e(&x))?;
        ropt.step(reference.params_mut().into_iter().map(|(_, p)| p))
            .map_err(|x| e(&x))?;
        if (loss - rloss).abs() > 1e-5 * rloss.abs().max(1.0) {
            return Err(format!(
                "step {step}: data-parallel loss {loss}, single-process {rloss}"
            ));
        }
        checks += 1;
    }
    // (1) Replicas are identical: compare with rank 0's parameters.
    let mine = flat(&model);
    let mut root = mine.clone();
    world.broadcast(&mut root, 0).map_err(|x| e(&x))?;
    if let Some(i) = (0..mine.len()).find(|&i| mine[i].to_bits() != root[i].to_bits()) {
        return Err(format!(
            "parameter {i}: {} on this rank, {} on rank 0",
            mine[i], root[i]
        ));
    }
    checks += 1;
    // (2) Equal to single-process training up to summation order.
    let want = flat(&reference);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = mine
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    if worst > 1e-5 * scale {
        return Err(format!(
            "parameters differ from the single-process run by {worst} (scale {scale})"
        ));
    }
    Ok(checks + 1)
}

/// Batch norm synchronised over `everyone` (the world, registered): losses, parameters, running
/// statistics and evaluation logits equal one process's, with batches of 12, 12, 7 and 3
/// samples (on 4 ranks the last leaves rank 3 without samples; it still joins the batch norms'
/// sums).
fn run_batch_norm(world: &World, everyone: CommHandle) -> Result<usize, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let algo = ConvAlgo::Convgemm;
    let seed = world.rank() as u64;
    let mut model =
        sync_batch_norm(resnet(algo, seed).map_err(|x| e(&x))?, everyone).map_err(|x| e(&x))?;
    let mut whole = resnet(algo, 0).map_err(|x| e(&x))?;
    let sample = whole.input_shape().to_vec();
    let mut opt = Sgd::new(0.2, 0.9, 5e-4).map_err(|x| e(&x))?;
    let mut opt_whole = opt.clone();
    let mut dp = DataParallel::new(world);
    dp.broadcast_model(&mut model).map_err(|x| e(&x))?;
    let mut checks = 0;
    for (step, n) in [12, 12, 7, 3].into_iter().enumerate() {
        let (x, labels) = batch(n, &sample, 40 + step as u64);
        let got = dp
            .step(&mut model, &mut opt, &x, &labels)
            .map_err(|x| e(&x))?;
        let want = local_step(&mut whole, &mut opt_whole, x, &labels)
            .map_err(|x| e(&x))?
            .loss;
        close(
            &format!("loss of step {step} ({n} samples)"),
            &[got],
            &[want],
        )?;
        checks += 1;
    }
    for ((name, p), (_, q)) in model.params().iter().zip(whole.params()) {
        close(&format!("parameter {name}"), p.value.data(), q.value.data())?;
        checks += 1;
    }
    for ((name, b), (_, c)) in model.buffers().iter().zip(whole.buffers()) {
        close(&format!("buffer {name}"), b.data(), c.data())?;
        checks += 1;
    }
    let (x, _) = batch(5, &sample, 999);
    let got = model.forward(x.clone(), false).map_err(|x| e(&x))?;
    let want = whole.forward(x, false).map_err(|x| e(&x))?;
    close("logits after training", got.data(), want.data())?;
    Ok(checks + 1)
}

fn main() {
    let runtime = match Runtime::init() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mpi_data_parallel: FAIL: cannot initialise MPI: {e}");
            std::process::exit(1);
        }
    };
    let world = runtime.world();
    let mut checks = 0;
    for chunk in [1, 20_000, usize::MAX] {
        match run(&world, chunk) {
            Ok(n) => checks += n,
            Err(what) => fail(&world, format!("chunks of {chunk}: {what}")),
        }
    }
    let everyone = register(runtime.world());
    match run_batch_norm(&world, everyone.handle()) {
        Ok(n) => checks += n,
        Err(what) => fail(&world, format!("synchronised batch norm: {what}")),
    }
    println!(
        "mpi_data_parallel: rank {}/{}: PASS ({checks} checks)",
        world.rank(),
        world.size()
    );
}
