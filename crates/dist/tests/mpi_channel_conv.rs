//! Multi-rank test of the channel-parallel (stationary-x), filter-parallel (stationary-y) and
//! stationary-w convolutions: under `mpirun -np N` (`cargo xtask test` runs N = 1, 2, 4), for
//! every `samples × channels` processor grid of N ranks and for 2D, strided and 3D layers, each
//! rank runs its block of the layer (its samples, its channel block) and checks that y, dx, and
//! the weight and bias gradients (summed over its grid column: the segmented allreduce) equal
//! the matching blocks of the whole layer run on one process. Stationary-w runs on every
//! `pc × pf` split of the channel blocks, as a chain of two layers (the second on the
//! transposed grid, as a model chains them). One PASS line per rank; the first failed check
//! aborts the job.

use dist::{
    ChannelGrid, ChannelParallelConv, Communicator, FilterParallelConv, ProcessorGrid,
    Result as DistResult, Runtime, StationaryWConv, World,
};
use nn::{Conv, ConvAlgo, ConvConfig, Layer, Tensor};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn random(shape: &[usize], seed: u64) -> Tensor {
    let rng = &mut SmallRng::seed_from_u64(seed);
    let n = shape.iter().product();
    Tensor::new(
        shape,
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
    )
    .unwrap()
}

/// Block `[s0..s1) × [c0..c1)` of the first two axes of `t`.
fn block(t: &Tensor, s: std::ops::Range<usize>, c: std::ops::Range<usize>) -> Vec<f32> {
    let shape = t.shape();
    let inner: usize = shape[2..].iter().product();
    let mut out = Vec::new();
    for i in s {
        for j in c.clone() {
            out.extend_from_slice(&t.data()[(i * shape[1] + j) * inner..][..inner]);
        }
    }
    out
}

fn close(what: &str, got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        ));
    }
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    if worst > 2e-5 * scale {
        return Err(format!("{what}: differs by {worst} (scale {scale})"));
    }
    Ok(())
}

/// The two algorithms behind one interface, for the test.
enum Part {
    X(ChannelParallelConv),
    Y(FilterParallelConv),
}

impl Part {
    fn forward(&mut self, comm: &World, x: Tensor, train: bool) -> DistResult<Tensor> {
        match self {
            Part::X(p) => p.forward(comm, x, train),
            Part::Y(p) => p.forward(comm, x, train),
        }
    }

    fn backward(&mut self, comm: &World, dy: Tensor) -> DistResult<Option<Tensor>> {
        match self {
            Part::X(p) => p.backward(comm, dy, true),
            Part::Y(p) => p.backward(comm, dy, true),
        }
    }

    fn params_mut(&mut self) -> Vec<(String, &mut nn::Parameter)> {
        match self {
            Part::X(p) => p.params_mut(),
            Part::Y(p) => p.params_mut(),
        }
    }
}

fn run(
    world: &World,
    samples: usize,
    channels: usize,
    cfg: &ConvConfig,
    input: &[usize],
    stationary_y: bool,
) -> Result<usize, String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let grid = ProcessorGrid::new(world, samples, channels).map_err(|x| e(&x))?;
    let (s, c) = grid.coords();
    let algo = ConvAlgo::Convgemm;
    let full_rng = &mut SmallRng::seed_from_u64(7);
    let mut full = Conv::new(cfg.clone(), algo, full_rng).map_err(|x| e(&x))?;
    let mut part = if stationary_y {
        Part::Y(
            FilterParallelConv::from_conv(&full, cfg.clone(), algo, channels, c)
                .map_err(|x| e(&x))?,
        )
    } else {
        Part::X(
            ChannelParallelConv::from_conv(&full, cfg.clone(), algo, channels, c)
                .map_err(|x| e(&x))?,
        )
    };

    // The whole layer on one process.
    let x = random(input, 11);
    let y = full.forward(x.clone(), true).map_err(|x| e(&x))?;
    let dy = random(y.shape(), 12);
    let dx = full
        .backward(dy.clone(), true)
        .map_err(|x| e(&x))?
        .ok_or("no dx")?;

    // This rank's block.
    let (n, ci, k) = (input[0], cfg.in_channels, cfg.out_channels);
    let (ns, cl, kl) = (n / samples, ci / channels, k / channels);
    let rows = s * ns..(s + 1) * ns;
    let mut xshape = input.to_vec();
    xshape[0] = ns;
    xshape[1] = cl;
    let xl = Tensor::new(&xshape, block(&x, rows.clone(), c * cl..(c + 1) * cl)).unwrap();
    let comm = grid.channel_comm();
    let yl = part.forward(comm, xl, true).map_err(|x| e(&x))?;
    close(
        "y",
        yl.data(),
        &block(&y, rows.clone(), c * kl..(c + 1) * kl),
    )?;
    let mut dyshape = y.shape().to_vec();
    dyshape[0] = ns;
    dyshape[1] = kl;
    let dyl = Tensor::new(&dyshape, block(&dy, rows.clone(), c * kl..(c + 1) * kl)).unwrap();
    let dxl = part
        .backward(comm, dyl)
        .map_err(|x| e(&x))?
        .ok_or("no dx")?;
    close("dx", dxl.data(), &block(&dx, rows, c * cl..(c + 1) * cl))?;

    // Gradients: sum over the grid column (same weights, other samples), then compare.
    let want = full.params();
    let mut got = part.params_mut();
    let wgrad = got[0].1.grad.data_mut();
    grid.sample_comm().allreduce_sum(wgrad).map_err(|x| e(&x))?;
    // Stationary-x holds every filter's weights for its input channels, stationary-y its
    // filters' weights for every input channel.
    let wblock = if stationary_y {
        block(&want[0].1.grad, c * kl..(c + 1) * kl, 0..ci)
    } else {
        block(&want[0].1.grad, 0..k, c * cl..(c + 1) * cl)
    };
    close("dw", wgrad, &wblock)?;
    let bgrad = got[1].1.grad.data_mut();
    grid.sample_comm().allreduce_sum(bgrad).map_err(|x| e(&x))?;
    close("db", bgrad, &want[1].1.grad.data()[c * kl..(c + 1) * kl])?;
    // Misuse is an error, not a hang: a block run on a communicator of the wrong size.
    if samples > 1 && part.forward(world, random(&xshape, 3), false).is_ok() {
        return Err("a block run on the world communicator must fail".into());
    }
    Ok(5)
}

/// Block `b` of `parts` equal blocks of `len` values.
fn nth(len: usize, parts: usize, b: usize) -> std::ops::Range<usize> {
    let l = len / parts;
    b * l..(b + 1) * l
}

/// Stationary-w on the `pc × pf` split of a grid row of `pc · pf` channel blocks: layer `cfg`
/// on the grid, then `next` (input channels = `cfg`'s output channels) on the transposed
/// `pf × pc` grid, against the two whole layers. Checks y of both, dx, and both layers' weight
/// and bias gradients.
fn run_w(
    world: &World,
    samples: usize,
    (pc, pf): (usize, usize),
    cfg: &ConvConfig,
    next: &ConvConfig,
    input: &[usize],
) -> Result<usize, String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let grid = ProcessorGrid::new(world, samples, pc * pf).map_err(|x| e(&x))?;
    let s = grid.coords().0;
    let cg = ChannelGrid::new(grid.channel_comm(), pc, pf).map_err(|x| e(&x))?;
    let (c, f) = cg.coords();
    let p = pc * pf;
    let algo = ConvAlgo::Convgemm;
    let rng = &mut SmallRng::seed_from_u64(7);
    let mut full_a = Conv::new(cfg.clone(), algo, rng).map_err(|x| e(&x))?;
    let mut full_b = Conv::new(next.clone(), algo, rng).map_err(|x| e(&x))?;
    let mut a = StationaryWConv::from_conv(&full_a, cfg.clone(), algo, (pc, pf), (c, f))
        .map_err(|x| e(&x))?;
    let mut b = StationaryWConv::from_conv(&full_b, next.clone(), algo, (pf, pc), (f, c))
        .map_err(|x| e(&x))?;
    if (
        a.input_block(),
        a.output_block(),
        b.input_block(),
        b.output_block(),
    ) != (c * pf + f, f * pc + c, f * pc + c, c * pf + f)
    {
        return Err("block numbering".into());
    }

    // The two whole layers on one process.
    let x = random(input, 11);
    let ya = full_a.forward(x.clone(), true).map_err(|x| e(&x))?;
    let yb = full_b.forward(ya.clone(), true).map_err(|x| e(&x))?;
    let dy = random(yb.shape(), 12);
    let dya = full_b
        .backward(dy.clone(), true)
        .map_err(|x| e(&x))?
        .ok_or("no dx")?;
    let dx = full_a
        .backward(dya, true)
        .map_err(|x| e(&x))?
        .ok_or("no dx")?;

    // This rank's blocks.
    let ns = input[0] / samples;
    let rows = s * ns..(s + 1) * ns;
    let (ci, k, k2) = (cfg.in_channels, cfg.out_channels, next.out_channels);
    let mut xshape = input.to_vec();
    xshape[0] = ns;
    xshape[1] = ci / p;
    let xb = c * pf + f;
    let xl = Tensor::new(&xshape, block(&x, rows.clone(), nth(ci, p, xb))).unwrap();
    let (row, col) = (cg.row(), cg.col());
    let yal = a.forward(row, col, xl, true).map_err(|x| e(&x))?;
    close(
        "y of the first layer",
        yal.data(),
        &block(&ya, rows.clone(), nth(k, p, f * pc + c)),
    )?;
    // The second layer's grid is the transpose: its row is the first's column.
    let ybl = b.forward(col, row, yal, true).map_err(|x| e(&x))?;
    close(
        "y of the second layer",
        ybl.data(),
        &block(&yb, rows.clone(), nth(k2, p, xb)),
    )?;
    let mut dyshape = ybl.shape().to_vec();
    dyshape[0] = ns;
    let dyl = Tensor::new(&dyshape, block(&dy, rows.clone(), nth(k2, p, xb))).unwrap();
    let dyal = b
        .backward(col, row, dyl, true)
        .map_err(|x| e(&x))?
        .ok_or("no dx")?;
    let dxl = a
        .backward(row, col, dyal, true)
        .map_err(|x| e(&x))?
        .ok_or("no dx")?;
    close("dx", dxl.data(), &block(&dx, rows, nth(ci, p, xb)))?;

    // Gradients, summed over the grid column (same weight block, other samples).
    for (name, part, whole, (wc, wf), (gc, gf)) in [
        ("first", &mut a, &full_a, (c, f), (pc, pf)),
        ("second", &mut b, &full_b, (f, c), (pf, pc)),
    ] {
        let want = whole.params();
        let (kk, cc) = (want[0].1.value.shape()[0], want[0].1.value.shape()[1]);
        let mut got = part.params_mut();
        let wgrad = got[0].1.grad.data_mut();
        grid.sample_comm().allreduce_sum(wgrad).map_err(|x| e(&x))?;
        let wblock = block(&want[0].1.grad, nth(kk, gf, wf), nth(cc, gc, wc));
        close(&format!("dw of the {name} layer"), wgrad, &wblock)?;
        let bgrad = got[1].1.grad.data_mut();
        grid.sample_comm().allreduce_sum(bgrad).map_err(|x| e(&x))?;
        let bb = nth(kk, gc * gf, wf * gc + wc);
        close(
            &format!("db of the {name} layer"),
            bgrad,
            &want[1].1.grad.data()[bb],
        )?;
    }
    // Misuse is an error, not a hang: the grid's row and column swapped on a non-square grid.
    if pc != pf && a.forward(col, row, random(&xshape, 3), false).is_ok() {
        return Err("a block run with its row and column swapped must fail".into());
    }
    Ok(9)
}

fn main() {
    let runtime = match Runtime::init() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mpi_channel_conv: FAIL: cannot initialise MPI: {e}");
            std::process::exit(1);
        }
    };
    let world = runtime.world();
    let size = world.size();
    // 12 samples: every grid's local batch (12, 6, 3) differs from its channel blocks (1, 2, 4),
    // so a transposed block layout cannot pass unnoticed.
    let layers = [
        (ConvConfig::conv2d(8, 12, 3).padding(1), vec![12, 8, 9, 7]),
        (
            ConvConfig::conv2d(4, 8, 3).stride(2).padding(1),
            vec![12, 4, 11, 10],
        ),
        (ConvConfig::conv3d(4, 4, 3).padding(1), vec![12, 4, 5, 6, 4]),
    ];
    let mut checks = 0;
    for channels in (1..=size).filter(|c| size % c == 0) {
        for ((cfg, input), y) in layers.iter().flat_map(|l| [(l, false), (l, true)]) {
            match run(&world, size / channels, channels, cfg, input, y) {
                Ok(n) => checks += n,
                Err(what) => {
                    eprintln!(
                        "mpi_channel_conv: rank {}/{size}: FAIL: grid {}×{channels}, stationary-{}, {cfg:?}: {what}",
                        world.rank(),
                        size / channels,
                        if y { "y" } else { "x" }
                    );
                    world.abort(1);
                }
            }
        }
    }
    // Stationary-w: every pc × pf split of every grid's channel blocks, each layer followed by
    // a 3-wide convolution back on the transposed grid.
    for channels in (1..=size).filter(|c| size % c == 0) {
        for pc in (1..=channels).filter(|p| channels % p == 0) {
            let pf = channels / pc;
            for (cfg, input) in &layers {
                let mut next = cfg.clone();
                (next.in_channels, next.out_channels) = (cfg.out_channels, cfg.in_channels);
                next = next.stride(1).padding(1);
                next.kernel = vec![3];
                match run_w(&world, size / channels, (pc, pf), cfg, &next, input) {
                    Ok(n) => checks += n,
                    Err(what) => {
                        eprintln!(
                            "mpi_channel_conv: rank {}/{size}: FAIL: grid {}×{channels}, stationary-w {pc}×{pf}, {cfg:?}: {what}",
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
        "mpi_channel_conv: rank {}/{size}: PASS ({checks} checks)",
        world.rank()
    );
}
