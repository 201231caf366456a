//! [`Conv`]: convolution in 1, 2 or 3 spatial dimensions, with the algorithm of each pass chosen
//! per layer ([`ConvAlgo`]).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::str::FromStr;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Instant;

use conv_ops::{
    BackwardDataAlgo, BackwardFilterAlgo, ConvGeometry, ForwardAlgo, Preset, Workspace,
};
use fastconv::WinogradPlan;
use rand::rngs::SmallRng;

use crate::error::{NnError, Result};
use crate::layer::{Layer, Parameter};
use crate::tensor::Tensor;

/// The convolution algorithm a layer uses (the `--conv-algo` of the `train` example).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvAlgo {
    /// Winograd where it applies and a one-time measurement finds it at least 10% faster over
    /// the three passes, convgemm elsewhere (see [`Conv::algorithm_in_use`]); with convgemm, the
    /// same measurement picks each pass's algorithm among the memory-lean ones that apply
    /// (forward: convgemm or direct; data gradient: flipped-kernel direct, flipped-kernel
    /// convgemm or deconvgemm; weight gradient: transposed convgemm or direct), starting from
    /// conv-ops' rule ([`conv_ops::Preset::lean_for`]), which another form replaces only when
    /// at least 10% faster. The choice depends on timing (each candidate's fastest of at least
    /// three runs), so on a busy machine two runs may still round differently: pick an
    /// algorithm explicitly, or load the choices with [`crate::tuning::load`], for bitwise
    /// reproducible training.
    #[default]
    Auto,
    /// The convgemm paper's `base`: explicit im2col / col2im buffers.
    Im2col,
    /// No im2col buffer: convgemm forward, transposed convgemm for the weight gradient, and for
    /// the data gradient the flipped-kernel convgemm where the output is as large as the input
    /// (stride 1, "same" padding), deconvgemm otherwise.
    Convgemm,
    /// Winograd F(m, r) (`fastconv`) where the geometry allows it (stride 1, no dilation, one
    /// group); layers it cannot run use `Convgemm`.
    Winograd,
}

impl fmt::Display for ConvAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConvAlgo::Auto => "auto",
            ConvAlgo::Im2col => "im2col",
            ConvAlgo::Convgemm => "convgemm",
            ConvAlgo::Winograd => "winograd",
        })
    }
}

impl FromStr for ConvAlgo {
    type Err = NnError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(ConvAlgo::Auto),
            "im2col" => Ok(ConvAlgo::Im2col),
            "convgemm" => Ok(ConvAlgo::Convgemm),
            "winograd" => Ok(ConvAlgo::Winograd),
            _ => Err(NnError::config(
                "conv_algo",
                format!("`{s}` (expected auto, im2col, convgemm or winograd)"),
            )),
        }
    }
}

/// `Auto`'s cache entry for one geometry and thread count.
struct Cached {
    choice: Choice,
    /// How often layers reused the choice.
    hits: usize,
    /// Each candidate's fastest measured run, in seconds, in the order they ran (empty for a
    /// choice loaded from a tuning file).
    times: Vec<(Pass, f64)>,
}

/// `Auto`'s measured choices, per geometry and thread count.
type Measured = HashMap<(ConvGeometry, usize), Cached>;
static MEASURED: LazyLock<Mutex<Measured>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The locked cache of `Auto`'s choices (a panic elsewhere while it was held leaves valid data).
fn measured() -> MutexGuard<'static, Measured> {
    MEASURED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Timed rounds at least in `Auto`'s measurement: each candidate still running counts its
/// fastest run, and one run is not a measurement on a shared machine (on a busy 2-core VM, one
/// round per large layer made VGG-16 take Winograd for a different layer in each of three
/// runs).
const MEASURE_MIN_ROUNDS: usize = 3;

/// Timed rounds at most in `Auto`'s measurement.
const MEASURE_MAX_ROUNDS: usize = 9;

/// Seconds of timed runs after which `Auto`'s measurement of a geometry stops, once it has
/// [`MEASURE_MIN_ROUNDS`] rounds and its choice held over the last round.
const MEASURE_BUDGET: f64 = 0.3;

/// A candidate whose fastest run is this many times its pass's leader's (Winograd: the three
/// leaders' sum) after the first round stops being measured ...
const MEASURE_DROP_FIRST: f64 = 1.5;

/// ... and this many times after later rounds.
const MEASURE_DROP: f64 = 1.25;

/// How much faster than conv-ops' own choice for a pass another algorithm must measure for
/// `Auto` to take it. Near-ties are common (ResNet-20's 16→32 stride-2 weight gradient: the
/// direct and transposed convgemm forms 1-9% apart in five of six runs on a busy VM, 24% in the
/// sixth), and a small margin let them follow the noise, so two runs of one program trained
/// with different bits; 10% keeps conv-ops' choice for most of them and costs at most 10% of
/// that pass.
const MEASURE_MARGIN: f64 = 0.10;

/// Images at most in `Auto`'s measurement.
const MEASURE_IMAGES: usize = 64;

/// Hyper-parameters of a [`Conv`] layer; per-dimension fields hold one value for all
/// dimensions or one per spatial dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvConfig {
    /// Input channels.
    pub in_channels: usize,
    /// Output channels (kernels).
    pub out_channels: usize,
    /// Kernel size.
    pub kernel: Vec<usize>,
    /// Stride (default 1).
    pub stride: Vec<usize>,
    /// Zero padding on both sides (default 0).
    pub padding: Vec<usize>,
    /// Spatial rank: 1, 2 or 3.
    pub rank: usize,
    /// Whether the layer adds a bias (default true).
    pub bias: bool,
}

impl ConvConfig {
    /// A 2D convolution `in_channels → out_channels` with a `kernel × kernel` kernel, stride 1,
    /// no padding, with bias.
    pub fn conv2d(in_channels: usize, out_channels: usize, kernel: usize) -> Self {
        ConvConfig {
            in_channels,
            out_channels,
            kernel: vec![kernel],
            stride: vec![1],
            padding: vec![0],
            rank: 2,
            bias: true,
        }
    }

    /// The same in 3 spatial dimensions.
    pub fn conv3d(in_channels: usize, out_channels: usize, kernel: usize) -> Self {
        ConvConfig {
            rank: 3,
            ..Self::conv2d(in_channels, out_channels, kernel)
        }
    }

    /// Sets the stride.
    pub fn stride(mut self, stride: usize) -> Self {
        self.stride = vec![stride];
        self
    }

    /// Sets the padding.
    pub fn padding(mut self, padding: usize) -> Self {
        self.padding = vec![padding];
        self
    }

    /// Removes the bias.
    pub fn no_bias(mut self) -> Self {
        self.bias = false;
        self
    }

    fn per_dim(&self, v: &[usize]) -> Vec<usize> {
        if v.len() == 1 {
            vec![v[0]; self.rank]
        } else {
            v.to_vec()
        }
    }
}

/// `first` (conv-ops' choice), then the other algorithms of `all` in their order.
fn candidates<A: Copy + PartialEq>(first: A, all: &[A]) -> Vec<A> {
    let mut v = vec![first];
    v.extend(all.iter().copied().filter(|&a| a != first));
    v
}

/// The algorithm `Auto` takes for a pass and its time: `algos` in order (conv-ops' choice
/// first), each replacing the one taken so far only when at least [`MEASURE_MARGIN`] faster,
/// so that near-ties keep the earlier candidate instead of following the measurement's noise
/// from run to run (VGG-16's 3→64 data gradient: the flipped direct form and deconvgemm
/// within 1-3% of each other, both far ahead of the default).
fn fastest<A: Copy>(algos: &[A], time: impl Fn(A) -> f64) -> (f64, A) {
    let first = (time(algos[0]), algos[0]);
    algos[1..]
        .iter()
        .map(|&a| (time(a), a))
        .fold(first, |taken, c| {
            if c.0 < (1.0 - MEASURE_MARGIN) * taken.0 {
                c
            } else {
                taken
            }
        })
}

/// How much faster than the fused algorithms' three passes together Winograd must measure for
/// `Auto` to take it: it holds more memory (its transformed kernels during the call).
const WINOGRAD_MARGIN: f64 = 0.10;

/// `Auto`'s candidates for one geometry while it measures them: each candidate's fastest run so
/// far and whether it is still being run.
struct Race {
    passes: Vec<Pass>,
    /// Fastest run of each pass, in seconds (infinite before its first timed run).
    best: Vec<f64>,
    /// Whether each pass still runs in the next round.
    running: Vec<bool>,
    /// The candidates of each pass, conv-ops' choice first (see [`fastest`]).
    forward: Vec<ForwardAlgo>,
    data: Vec<BackwardDataAlgo>,
    filter: Vec<BackwardFilterAlgo>,
}

impl Race {
    fn new(
        passes: Vec<Pass>,
        forward: Vec<ForwardAlgo>,
        data: Vec<BackwardDataAlgo>,
        filter: Vec<BackwardFilterAlgo>,
    ) -> Self {
        let n = passes.len();
        Race {
            passes,
            best: vec![f64::INFINITY; n],
            running: vec![true; n],
            forward,
            data,
            filter,
        }
    }

    /// The fastest run of `p` (infinite when `p` is not a candidate).
    fn time(&self, p: Pass) -> f64 {
        self.passes
            .iter()
            .zip(&self.best)
            .find(|&(&q, _)| q == p)
            .map_or(f64::INFINITY, |(_, &t)| t)
    }

    /// The choice the runs so far make: each pass's algorithm by [`fastest`], and Winograd when
    /// it is [`WINOGRAD_MARGIN`] faster than those three together.
    fn decide(&self) -> (ConvAlgo, ForwardAlgo, BackwardDataAlgo, BackwardFilterAlgo) {
        let (t_forward, forward) = fastest(&self.forward, |a| self.time(Pass::Forward(a)));
        let (t_data, data) = fastest(&self.data, |a| self.time(Pass::Data(a)));
        let (t_filter, filter) = fastest(&self.filter, |a| self.time(Pass::Filter(a)));
        let t_conv = t_forward + t_data + t_filter;
        let algo = if self.time(Pass::Winograd) < (1.0 - WINOGRAD_MARGIN) * t_conv {
            ConvAlgo::Winograd
        } else {
            ConvAlgo::Convgemm
        };
        (algo, forward, data, filter)
    }

    /// Stops running every candidate whose fastest run is more than `factor` times its pass's
    /// fastest (Winograd: than the three passes' fastest together). Returns whether the race is
    /// settled: one candidate left per pass, and Winograd either stopped or `factor` times
    /// faster than the three passes.
    fn drop_slow(&mut self, factor: f64) -> bool {
        let lead = |race: &Race, of: fn(&Pass) -> bool| {
            race.passes
                .iter()
                .zip(&race.best)
                .filter(|(p, _)| of(p))
                .map(|(_, &t)| t)
                .fold(f64::INFINITY, f64::min)
        };
        let groups: [fn(&Pass) -> bool; 3] = [
            |p| matches!(p, Pass::Forward(_)),
            |p| matches!(p, Pass::Data(_)),
            |p| matches!(p, Pass::Filter(_)),
        ];
        let leads = groups.map(|of| lead(self, of));
        let t_conv: f64 = leads.iter().sum();
        let mut settled = true;
        for (of, &lead) in groups.iter().zip(&leads) {
            for i in 0..self.passes.len() {
                if of(&self.passes[i]) && self.best[i] > factor * lead {
                    self.running[i] = false;
                }
            }
            let left = (0..self.passes.len())
                .filter(|&i| of(&self.passes[i]) && self.running[i])
                .count();
            settled &= left <= 1;
        }
        if let Some(i) = self.passes.iter().position(|&p| p == Pass::Winograd) {
            if self.best[i] > factor * t_conv {
                self.running[i] = false;
            }
            settled &= !self.running[i] || t_conv > factor * self.best[i];
        }
        settled
    }
}

/// The clock of `Auto`'s measurement, in seconds. Inside a rayon pool of one thread it is that
/// thread's CPU time: every pass then runs on it, and the time it spends descheduled or stolen
/// by a hypervisor is not in it, so a busy machine's pauses cannot make a slower algorithm
/// look faster (nor can the process's other threads, as its CPU time would let them). On the
/// wall clock, on a busy shared VM, `Auto` took Winograd for ResNet-20's 3→16 stem convolution
/// in one of seven runs, where it trains 5× slower than the direct convolution. On more
/// threads, or called from outside the pool (the passes then run on its worker), it is the
/// wall clock: the CPU time of several threads would not show how well a pass uses them.
enum MeasureClock {
    Cpu,
    Wall(Instant),
}

impl MeasureClock {
    fn new() -> Self {
        if rayon::current_num_threads() == 1
            && rayon::current_thread_index().is_some()
            && cpu_time::ThreadTime::try_now().is_ok()
        {
            MeasureClock::Cpu
        } else {
            MeasureClock::Wall(Instant::now())
        }
    }

    /// Seconds since an arbitrary start, on this clock.
    fn now(&self) -> f64 {
        match self {
            MeasureClock::Cpu => {
                cpu_time::ThreadTime::try_now().map_or(f64::NAN, |t| t.as_duration().as_secs_f64())
            }
            MeasureClock::Wall(start) => start.elapsed().as_secs_f64(),
        }
    }
}

/// A candidate pass in `Auto`'s measurement ([`Conv::measure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    Forward(ForwardAlgo),
    Data(BackwardDataAlgo),
    Filter(BackwardFilterAlgo),
    /// Winograd's forward, data and weight gradients.
    Winograd,
}

/// What a layer runs for one input size: the algorithm family and, for the conv-ops families,
/// the algorithm of each pass.
#[derive(Debug, Clone, Copy)]
struct Choice {
    algo: ConvAlgo,
    preset: Preset,
}

/// The per-batch-size state: geometry, Winograd plan, conv-ops workspace.
struct Planned {
    geom: ConvGeometry,
    algo: ConvAlgo,
    winograd: Option<WinogradPlan>,
    preset: Preset,
    ws: Workspace,
}

/// A convolution layer: `y = conv(x, weight) + bias`, x `N × C × spatial`, weight
/// `K × C × kernel` (PyTorch's layout and parameter names).
pub struct Conv {
    cfg: ConvConfig,
    algo: ConvAlgo,
    weight: Parameter,
    bias: Option<Parameter>,
    planned: Option<Planned>,
    /// `Auto`'s measured choice per spatial input size, so a smaller last batch or the
    /// evaluation batch replans without measuring again.
    measured: Vec<(Vec<usize>, Choice)>,
    saved_x: Option<Tensor>,
}

impl Conv {
    /// A layer initialised as PyTorch does (uniform in ±1/√fan_in), with algorithm `algo`.
    pub fn new(cfg: ConvConfig, algo: ConvAlgo, rng: &mut SmallRng) -> Result<Self> {
        if !(1..=3).contains(&cfg.rank) {
            return Err(NnError::config("rank", format!("{} (1, 2 or 3)", cfg.rank)));
        }
        for (arg, v) in [
            ("kernel", &cfg.kernel),
            ("stride", &cfg.stride),
            ("padding", &cfg.padding),
        ] {
            if v.len() != 1 && v.len() != cfg.rank {
                return Err(NnError::config(
                    arg,
                    format!("{} entries for {} spatial dimensions", v.len(), cfg.rank),
                ));
            }
        }
        // Validate everything once on a one-image geometry whose input is just large enough.
        let kernel = cfg.per_dim(&cfg.kernel);
        ConvGeometry::from_parts(
            1,
            cfg.in_channels,
            cfg.out_channels,
            &kernel,
            &kernel,
            &cfg.per_dim(&cfg.stride),
            &[1],
            &cfg.per_dim(&cfg.padding),
            &cfg.per_dim(&cfg.padding),
            1,
        )?;
        let fan_in = cfg.in_channels * kernel.iter().product::<usize>();
        let mut wshape = vec![cfg.out_channels, cfg.in_channels];
        wshape.extend(&kernel);
        let weight = Parameter::uniform_fan_in(&wshape, fan_in, rng);
        let bias = cfg
            .bias
            .then(|| Parameter::uniform_fan_in(&[cfg.out_channels], fan_in, rng));
        Ok(Conv {
            cfg,
            algo,
            weight,
            bias,
            planned: None,
            measured: Vec::new(),
            saved_x: None,
        })
    }

    /// The choice made without measuring: the user's algorithm, with `Winograd` falling back to
    /// `Convgemm` where `fastconv` refuses the geometry (stride, dilation, groups); `None` for
    /// `Auto` when a measurement must tell, i.e. when Winograd applies or some pass has more
    /// than one memory-lean algorithm (a kernel of more than one tap, or the flipped-kernel
    /// data gradient; [`Conv::algorithm_in_use`]).
    fn static_choice(&self, geom: &ConvGeometry) -> Option<Choice> {
        let winograd_ok = winograd_applies(geom);
        let algo = match self.algo {
            ConvAlgo::Winograd if winograd_ok => ConvAlgo::Winograd,
            ConvAlgo::Winograd | ConvAlgo::Convgemm => ConvAlgo::Convgemm,
            ConvAlgo::Auto if winograd_ok || flipped_applies(geom) || geom.kernel_len() > 1 => {
                return None;
            }
            ConvAlgo::Auto => ConvAlgo::Convgemm,
            ConvAlgo::Im2col => ConvAlgo::Im2col,
        };
        let preset = match algo {
            ConvAlgo::Im2col => Preset::BASE,
            _ => convgemm_preset(geom),
        };
        Some(Choice { algo, preset })
    }

    /// The layer's hyper-parameters.
    pub fn config(&self) -> &ConvConfig {
        &self.cfg
    }

    /// The algorithm the layer was built with (`Auto` stays `Auto`; see
    /// [`algorithm_in_use`](Conv::algorithm_in_use)).
    pub fn algorithm(&self) -> ConvAlgo {
        self.algo
    }

    /// The algorithm the layer runs for its current input shape (after the first forward), e.g.
    /// what `Auto` measured.
    pub fn algorithm_in_use(&self) -> Option<ConvAlgo> {
        self.planned.as_ref().map(|p| p.algo)
    }

    /// The algorithm as the user chose it, with what `Auto` resolved to: `convgemm`,
    /// `auto→winograd`.
    pub(crate) fn algo_label(&self) -> String {
        match self.algorithm_in_use() {
            Some(used) if used != self.algo => format!("{}→{used}", self.algo),
            _ => self.algo.to_string(),
        }
    }

    /// The conv-ops algorithm of each pass for the current input shape (after the first
    /// forward); `None` before it and while Winograd runs the layer.
    pub fn preset_in_use(&self) -> Option<Preset> {
        self.planned
            .as_ref()
            .filter(|p| p.winograd.is_none())
            .map(|p| p.preset)
    }

    /// `Auto`'s choice for `geom`: measured once per process for each geometry (and rayon
    /// thread count), so the layers of a network that share a geometry (ResNet's repeated
    /// blocks) share one measurement and make the same choice, as PyTorch's cuDNN benchmark
    /// mode caches by convolution parameters.
    fn shared_measurement(&self, geom: &ConvGeometry, x: &[f32]) -> Result<Choice> {
        let key = (*geom, rayon::current_num_threads());
        if let Some(e) = measured().get_mut(&key) {
            e.hits += 1;
            return Ok(e.choice);
        }
        let (choice, times) = self.measure(geom, x)?;
        let mut m = measured();
        Ok(m.entry(key)
            .or_insert(Cached {
                choice,
                hits: 0,
                times,
            })
            .choice)
    }

    /// `Auto`'s one-time measurement on the first (up to) [`MEASURE_IMAGES`] images of `x`.
    /// Every candidate pass runs once to allocate; then rounds that run every candidate still
    /// in the [`Race`] once, in turn, are timed (on [`MeasureClock`]), and each candidate counts
    /// its fastest run: taking turns, the candidates share a busy machine's slow moments, and
    /// the minimum resists its interruptions. After each round the candidates far behind their
    /// pass's leader stop running ([`MEASURE_DROP_FIRST`], [`MEASURE_DROP`]); the measurement
    /// ends after at least [`MEASURE_MIN_ROUNDS`] rounds, once the choice held over the last
    /// round and either one candidate is left per pass or [`MEASURE_BUDGET`] seconds are spent,
    /// or after [`MEASURE_MAX_ROUNDS`]. The weights change between runs, so the flipped forms
    /// and Winograd pay their kernel transforms, as they do every training step. Each pass
    /// takes the fastest of its fused algorithms ([`fastest`]); Winograd is taken when it is
    /// [`WINOGRAD_MARGIN`] faster over the three passes than those: it holds more memory (its
    /// transformed kernels during the call).
    ///
    /// Returns the choice and each candidate's fastest run (seconds).
    fn measure(&self, geom: &ConvGeometry, x: &[f32]) -> Result<(Choice, Vec<(Pass, f64)>)> {
        let g = geom.with_batch(geom.batch().min(MEASURE_IMAGES))?;
        let x = &x[..g.x_len()];
        let w = self.weight.value.data();
        let mut w2 = w.to_vec();
        w2[0] += 1.0;
        let (mut y, mut dx, mut dw) = (
            vec![0.0; g.y_len()],
            vec![0.0; g.x_len()],
            vec![0.0; g.w_len()],
        );
        let mut preset = convgemm_preset(&g);
        let mut ws = Workspace::new(true);
        let mut wino = if winograd_applies(&g) {
            let mut plan = WinogradPlan::new(&g, None)?;
            // As in training: the weights change every call, nothing to keep.
            plan.set_keep_kernels(false);
            Some(plan)
        } else {
            None
        };
        // The candidates of each pass: conv-ops' choice for this geometry first, then the other
        // fused algorithms that apply (the direct forms only for kernels of more than one tap:
        // a 1×1 kernel has too few multiply-adds per input value to pay for their padded
        // copy); and Winograd's three passes together.
        let taps = g.kernel_len() > 1;
        let forward_algos = candidates(
            preset.forward,
            &[ForwardAlgo::Convgemm, ForwardAlgo::Direct][..1 + usize::from(taps)],
        );
        let data_algos = candidates(
            preset.backward_data,
            if flipped_applies(&g) {
                &[
                    BackwardDataAlgo::FlippedDirect,
                    BackwardDataAlgo::FlippedConvgemm,
                    BackwardDataAlgo::Deconvgemm,
                ][usize::from(!taps)..]
            } else {
                &[BackwardDataAlgo::Deconvgemm]
            },
        );
        let filter_algos = candidates(
            preset.backward_filter,
            &[
                BackwardFilterAlgo::ConvgemmTrans,
                BackwardFilterAlgo::Direct,
            ][..1 + usize::from(taps)],
        );
        let mut passes: Vec<Pass> = forward_algos.iter().map(|&a| Pass::Forward(a)).collect();
        passes.extend(data_algos.iter().map(|&a| Pass::Data(a)));
        passes.extend(filter_algos.iter().map(|&a| Pass::Filter(a)));
        if wino.is_some() {
            passes.push(Pass::Winograd);
        }
        let clock = MeasureClock::new();
        let mut run = |pass: Pass, w: &[f32]| -> Result<f64> {
            let t = clock.now();
            match pass {
                Pass::Forward(algo) => {
                    conv_ops::forward(&g, x, w, None, false, &mut y, algo, &mut ws)?;
                }
                Pass::Data(algo) => conv_ops::backward_data(&g, &y, w, &mut dx, algo, &mut ws)?,
                Pass::Filter(algo) => {
                    conv_ops::backward_filter(&g, x, &y, &mut dw, algo, &mut ws)?;
                }
                Pass::Winograd => {
                    if let Some(plan) = wino.as_mut() {
                        plan.forward(x, w, &mut y)?;
                        plan.backward_data(&y, w, &mut dx)?;
                        plan.backward_filter(x, &y, &mut dw)?;
                    }
                }
            }
            Ok(clock.now() - t)
        };
        for &pass in &passes {
            run(pass, w)?;
        }
        let mut race = Race::new(passes, forward_algos, data_algos, filter_algos);
        let mut spent = 0.0;
        let mut last = None;
        for round in 0..MEASURE_MAX_ROUNDS {
            let w = if round % 2 == 0 { &w2 } else { w };
            for i in 0..race.passes.len() {
                if race.running[i] {
                    let t = run(race.passes[i], w)?;
                    race.best[i] = race.best[i].min(t);
                    spent += t;
                }
            }
            let now = race.decide();
            let held = last == Some(now);
            last = Some(now);
            let settled = race.drop_slow(if round == 0 {
                MEASURE_DROP_FIRST
            } else {
                MEASURE_DROP
            });
            if round + 1 >= MEASURE_MIN_ROUNDS && held && (settled || spent > MEASURE_BUDGET) {
                break;
            }
        }
        let (algo, forward, data, filter) = race.decide();
        preset.forward = forward;
        preset.backward_data = data;
        preset.backward_filter = filter;
        // The candidates grew the per-thread buffers of every algorithm they tried to this
        // layer's size; the layer takes one, and the run must not keep the others' (C3D,
        // batch 2: Winograd's on the 512→512 3×3×3 layers 235 MiB; the direct convolution's
        // padded copies and core-blas's packing buffers +164 MiB of peak memory against the
        // same choices loaded from a `--tune-cache` file, session 21). What the layer's own
        // passes need, they grow again.
        fastconv::release_workspaces();
        conv_ops::release_workspaces();
        core_blas::pack::release_workspaces();
        Ok((
            Choice { algo, preset },
            race.passes.into_iter().zip(race.best).collect(),
        ))
    }

    /// The geometry for input shape `shape` (`N × C × spatial`).
    fn geometry(&self, shape: &[usize]) -> Result<ConvGeometry> {
        let cfg = &self.cfg;
        if shape.len() != cfg.rank + 2 || shape[1] != cfg.in_channels {
            return Err(NnError::shape(
                self.describe(),
                "x",
                shape,
                format!("N × {} × {} spatial dimensions", cfg.in_channels, cfg.rank),
            ));
        }
        let pad = cfg.per_dim(&cfg.padding);
        Ok(ConvGeometry::from_parts(
            shape[0],
            cfg.in_channels,
            cfg.out_channels,
            &shape[2..],
            &cfg.per_dim(&cfg.kernel),
            &cfg.per_dim(&cfg.stride),
            &[1],
            &pad,
            &pad,
            1,
        )?)
    }

    /// Makes the plan match the input `x`, rebuilding it only when its shape changes (`Auto`
    /// measures the first time it sees a spatial size).
    fn ensure_plan(&mut self, x: &Tensor) -> Result<()> {
        let shape = x.shape();
        // Validates the shape (rank, channels) before anything indexes it.
        let geom = self.geometry(shape)?;
        let current = self
            .planned
            .as_ref()
            .is_some_and(|p| p.geom.batch() == shape[0] && p.geom.input() == &shape[2..]);
        if !current {
            self.planned = None;
            let choice = match self.static_choice(&geom) {
                Some(c) => c,
                None => match self.measured.iter().find(|(d, _)| d == &shape[2..]) {
                    Some(&(_, c)) => c,
                    None => {
                        let c = self.shared_measurement(&geom, x.data())?;
                        self.measured.push((shape[2..].to_vec(), c));
                        c
                    }
                },
            };
            let winograd = match choice.algo {
                ConvAlgo::Winograd => Some(WinogradPlan::new(&geom, None)?),
                _ => None,
            };
            // `+pm`: the base algorithm's buffers are kept across steps, like a framework's
            // caching allocator would.
            self.planned = Some(Planned {
                geom,
                algo: choice.algo,
                winograd,
                preset: choice.preset,
                ws: Workspace::new(true),
            });
        }
        Ok(())
    }
}

/// Whether `Auto` may take `algo` with data-gradient algorithm `data` for `geom` (what
/// [`crate::tuning::load`] checks a file's choices against): convgemm, or Winograd where it
/// applies; a data-gradient algorithm that runs the geometry.
pub(crate) fn check_choice(
    geom: &ConvGeometry,
    algo: ConvAlgo,
    data: BackwardDataAlgo,
) -> std::result::Result<(), String> {
    match algo {
        ConvAlgo::Convgemm => {}
        ConvAlgo::Winograd if winograd_applies(geom) => {}
        ConvAlgo::Winograd => {
            return Err("winograd does not apply to this geometry (stride, dilation, groups or a 1-tap kernel)".into());
        }
        other => return Err(format!("`auto` never chooses {other}")),
    }
    match data {
        BackwardDataAlgo::FlippedConvgemm | BackwardDataAlgo::FlippedDirect
            if !flipped_applies(geom) =>
        {
            Err(format!(
                "{data:?} needs stride 1, no dilation and padding below the kernel size"
            ))
        }
        _ => Ok(()),
    }
}

/// Every choice in the process's `Auto` cache: geometry, rayon thread count, algorithm and the
/// conv-ops preset (each pass's algorithm) it runs with convgemm.
pub(crate) fn measured_choices() -> Vec<(ConvGeometry, usize, ConvAlgo, Preset)> {
    let m = measured();
    m.iter()
        .map(|(&(geom, threads), e)| (geom, threads, e.choice.algo, e.choice.preset))
        .collect()
}

/// The timings behind `Auto`'s choice for `(geom, threads)`: each candidate pass and its
/// fastest run in seconds (empty when the choice was loaded, or never made).
pub(crate) fn measured_times(geom: &ConvGeometry, threads: usize) -> Vec<(Pass, f64)> {
    measured()
        .get(&(*geom, threads))
        .map(|e| e.times.clone())
        .unwrap_or_default()
}

/// Adds a choice to the process's `Auto` cache as if measured (checked by [`check_choice`]),
/// with `preset`'s algorithms (its workspaces persistent, as `Auto`'s are); `false` when the
/// process already has one for that geometry and thread count (it is kept).
pub(crate) fn record_choice(
    geom: ConvGeometry,
    threads: usize,
    algo: ConvAlgo,
    preset: Preset,
) -> bool {
    let preset = Preset {
        persistent: true,
        ..preset
    };
    match measured().entry((geom, threads)) {
        Entry::Vacant(e) => {
            e.insert(Cached {
                choice: Choice { algo, preset },
                hits: 0,
                times: Vec::new(),
            });
            true
        }
        Entry::Occupied(_) => false,
    }
}

/// How often layers found the cached choice for `(geom, threads)`.
#[cfg(test)]
pub(crate) fn hits(geom: &ConvGeometry, threads: usize) -> Option<usize> {
    let m = measured();
    m.get(&(*geom, threads)).map(|e| e.hits)
}

/// Whether `fastconv` runs this geometry (stride 1, no dilation, one group) with a kernel larger
/// than 1 (a 1×1 kernel gains nothing from Winograd).
fn winograd_applies(geom: &ConvGeometry) -> bool {
    fastconv::plan::check_supported(geom).is_ok() && geom.kernel().iter().any(|&r| r > 1)
}

/// Whether the data gradient can run as the flipped-kernel convgemm (stride 1, no dilation,
/// padding at most `k − 1`).
fn flipped_applies(geom: &ConvGeometry) -> bool {
    conv_ops::transposed_geometry(geom).is_ok()
}

/// The memory-lean conv-ops algorithms without measuring ([`Preset::lean_for`], with persistent
/// workspaces): the direct convolution forward for few-channel layers, convgemm otherwise; the
/// direct weight gradient for few-channel layers on small images, the transposed convgemm
/// otherwise; for the data gradient the flipped direct
/// convolution where it applies, else the flipped-kernel convgemm for "same" convolutions and
/// deconvgemm otherwise. A shrinking ("valid") convolution's flipped convgemm pads dy by
/// `k − 1 − p` and spends its work on those zeros: on LeNet's 6→16 5×5 layer (14² → 10²) it is
/// 3.8× slower than deconvgemm.
pub(crate) fn convgemm_preset(geom: &ConvGeometry) -> Preset {
    Preset {
        persistent: true,
        ..Preset::lean_for(geom)
    }
}

impl Layer for Conv {
    fn describe(&self) -> String {
        let c = &self.cfg;
        let dims = |v: &[usize]| {
            c.per_dim(v)
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join("×")
        };
        format!(
            "Conv{}d({}→{}, kernel {}, stride {}, pad {}, {})",
            c.rank,
            c.in_channels,
            c.out_channels,
            dims(&c.kernel),
            dims(&c.stride),
            dims(&c.padding),
            self.algo_label()
        )
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        if x.shape().first() == Some(&0) {
            // An empty batch (in data parallelism a rank without samples still runs the model
            // to join its layers' collectives): an empty output, nothing to compute.
            let mut yshape = vec![0];
            yshape.extend(self.output_shape(&x.shape()[1..])?);
            self.saved_x = train.then_some(x);
            return Ok(Tensor::zeros(&yshape));
        }
        self.ensure_plan(&x)?;
        let Conv {
            weight,
            bias,
            planned,
            saved_x,
            ..
        } = self;
        let p = planned.as_mut().expect("ensure_plan sets it");
        let g = p.geom;
        let (w, b) = (weight.value.data(), bias.as_ref().map(|b| b.value.data()));
        let mut yshape = vec![g.batch(), g.out_channels()];
        yshape.extend(g.output());
        // Both conv-ops' and Winograd's forward overwrite every value of y: no zeroing pass.
        let mut y = Tensor::scratch(&yshape);
        match p.winograd.as_mut() {
            Some(plan) => {
                // Training changes the weights every step, so transformed kernels kept for the
                // next call would never be used: while training, every Winograd layer transforms
                // into one buffer shared by all (ResNet-34 at 224², batch 8: 2.70 → 0.87 GB peak);
                // evaluation keeps them, as the weights stay.
                plan.set_keep_kernels(!train);
                plan.forward(x.data(), w, y.data_mut())?;
                if let Some(b) = b {
                    add_bias(y.data_mut(), b, g.output_spatial_len());
                }
            }
            None => conv_ops::forward(
                &g,
                x.data(),
                w,
                b,
                false,
                y.data_mut(),
                p.preset.forward,
                &mut p.ws,
            )?,
        }
        *saved_x = train.then_some(x);
        Ok(y)
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let x = self
            .saved_x
            .take()
            .ok_or_else(|| NnError::no_forward(self))?;
        if x.shape().first() == Some(&0) {
            // An empty batch contributes nothing: zero gradients, an empty dx.
            let mut want = vec![0];
            want.extend(self.output_shape(&x.shape()[1..])?);
            NnError::expect_shape(|| self.describe(), "dy", dy.shape(), &want)?;
            for (_, p) in self.params_mut() {
                p.grad.data_mut().fill(0.0);
            }
            return Ok(need_dx.then(|| Tensor::zeros(x.shape())));
        }
        self.ensure_plan(&x)?;
        let describe = self.describe();
        let Conv {
            weight,
            bias,
            planned,
            ..
        } = self;
        let p = planned.as_mut().expect("ensure_plan sets it");
        let g = p.geom;
        let mut want = vec![g.batch(), g.out_channels()];
        want.extend(g.output());
        NnError::expect_shape(|| describe, "dy", dy.shape(), &want)?;
        let w = weight.value.data();
        if let Some(b) = bias.as_mut() {
            conv_ops::bias_grad(&g, dy.data(), b.grad.data_mut())?;
        }
        let dw = weight.grad.data_mut();
        // Both conv-ops' and Winograd's backward-data overwrite every value of dx.
        let mut dx = need_dx.then(|| Tensor::scratch(x.shape()));
        match p.winograd.as_mut() {
            Some(plan) => {
                plan.backward_filter(x.data(), dy.data(), dw)?;
                if let Some(dx) = dx.as_mut() {
                    plan.backward_data(dy.data(), w, dx.data_mut())?;
                }
            }
            None => {
                conv_ops::backward_filter(
                    &g,
                    x.data(),
                    dy.data(),
                    dw,
                    p.preset.backward_filter,
                    &mut p.ws,
                )?;
                if let Some(dx) = dx.as_mut() {
                    conv_ops::backward_data(
                        &g,
                        dy.data(),
                        w,
                        dx.data_mut(),
                        p.preset.backward_data,
                        &mut p.ws,
                    )?;
                }
            }
        }
        Ok(dx)
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        let mut v = vec![("weight".into(), &self.weight)];
        if let Some(b) = &self.bias {
            v.push(("bias".into(), b));
        }
        v
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        let mut v = vec![("weight".into(), &mut self.weight)];
        if let Some(b) = &mut self.bias {
            v.push(("bias".into(), b));
        }
        v
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        let mut shape = vec![1];
        shape.extend(input);
        let g = self.geometry(&shape)?;
        let mut out = vec![g.out_channels()];
        out.extend(g.output());
        Ok(out)
    }
}

/// `y[n][k][..] += b[k]`.
fn add_bias(y: &mut [f32], b: &[f32], plane: usize) {
    for (i, chunk) in y.chunks_exact_mut(plane).enumerate() {
        let v = b[i % b.len()];
        chunk.iter_mut().for_each(|y| *y += v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// A race over two forward, three data and two filter candidates plus Winograd, with the
    /// given fastest runs (ms) in that order.
    fn race(times: [f64; 8]) -> Race {
        let forward = vec![ForwardAlgo::Convgemm, ForwardAlgo::Direct];
        let data = vec![
            BackwardDataAlgo::FlippedConvgemm,
            BackwardDataAlgo::FlippedDirect,
            BackwardDataAlgo::Deconvgemm,
        ];
        let filter = vec![
            BackwardFilterAlgo::ConvgemmTrans,
            BackwardFilterAlgo::Direct,
        ];
        let mut passes: Vec<Pass> = forward.iter().map(|&a| Pass::Forward(a)).collect();
        passes.extend(data.iter().map(|&a| Pass::Data(a)));
        passes.extend(filter.iter().map(|&a| Pass::Filter(a)));
        passes.push(Pass::Winograd);
        let mut r = Race::new(passes, forward, data, filter);
        r.best = times.to_vec();
        r
    }

    /// Another algorithm replaces conv-ops' choice (each pass's first), or a later candidate
    /// the one taken so far, only when more than `MEASURE_MARGIN` faster, and Winograd only
    /// when `WINOGRAD_MARGIN` faster than the three chosen passes together.
    #[test]
    fn the_race_keeps_the_default_on_near_ties() {
        let near = 1.0 - MEASURE_MARGIN / 2.0;
        let far = 1.0 - MEASURE_MARGIN * 1.5;
        let r = race([
            10.0,
            10.0 * near,
            10.0,
            10.0 * far,
            20.0,
            10.0,
            10.0 * near,
            100.0,
        ]);
        assert_eq!(
            r.decide(),
            (
                ConvAlgo::Convgemm,
                ForwardAlgo::Convgemm,
                BackwardDataAlgo::FlippedDirect,
                BackwardFilterAlgo::ConvgemmTrans
            )
        );
        // Deconvgemm, slightly faster than the flipped direct form that beat the default,
        // does not replace it; far faster, it does.
        let mut r = race([10.0, 10.0, 10.0, 10.0 * far, 0.0, 10.0, 10.0, 100.0]);
        r.best[4] = 10.0 * far * near;
        assert_eq!(r.decide().2, BackwardDataAlgo::FlippedDirect);
        r.best[4] = 10.0 * far * far;
        assert_eq!(r.decide().2, BackwardDataAlgo::Deconvgemm);
        // The chosen passes take 10 + 10·far + 10 ms.
        let t_conv = 20.0 + 10.0 * far;
        let mut r = race([10.0, 11.0, 10.0, 10.0 * far, 20.0, 10.0, 12.0, 0.0]);
        r.best[7] = (1.0 - WINOGRAD_MARGIN / 2.0) * t_conv;
        assert_eq!(r.decide().0, ConvAlgo::Convgemm);
        r.best[7] = (1.0 - WINOGRAD_MARGIN * 1.5) * t_conv;
        assert_eq!(r.decide().0, ConvAlgo::Winograd);
    }

    /// Candidates far behind their pass's leader (Winograd: the three leaders' sum) stop
    /// running, the default included; the race is settled when one candidate is left per pass
    /// and Winograd is out or far ahead.
    #[test]
    fn the_race_drops_slow_candidates_and_settles() {
        let mut r = race([10.0, 14.0, 10.0, 10.5, 20.0, 30.0, 10.0, 50.0]);
        assert!(!r.drop_slow(1.5));
        // Forward direct (1.4×) and data flipped-direct stay; deconvgemm (2×), the default
        // filter (3×) and Winograd (50 > 1.5 × 30) stop.
        assert_eq!(
            r.running,
            [true, true, true, true, false, false, true, false]
        );
        assert!(!r.drop_slow(1.25));
        assert_eq!(
            r.running,
            [true, false, true, true, false, false, true, false]
        );
        r.best[3] = 13.0;
        assert!(r.drop_slow(1.25));
        assert_eq!(
            r.running,
            [true, false, true, false, false, false, true, false]
        );
        // A fast Winograd keeps running until it is far ahead of the fused passes.
        let mut r = race([10.0, 20.0, 10.0, 20.0, 20.0, 10.0, 20.0, 25.0]);
        assert!(!r.drop_slow(1.25));
        assert!(r.running[7]);
        r.best[7] = 20.0;
        assert!(r.drop_slow(1.25));
        assert!(r.running[7]);
        assert_eq!(r.decide().0, ConvAlgo::Winograd);
    }

    /// On one rayon thread `Auto`'s clock leaves out the time the process does not run (a
    /// sleep stands for a busy machine's pauses) and counts the time it computes; on two
    /// threads it is the wall clock, pauses included.
    #[test]
    fn the_measurement_clock_skips_pauses_on_one_thread() {
        let pause = std::time::Duration::from_millis(80);
        let spin = |d: std::time::Duration| {
            let t = Instant::now();
            let mut x = 0u64;
            while t.elapsed() < d {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        };
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let (slept, spun) = one.install(|| {
            let clock = MeasureClock::new();
            assert!(matches!(clock, MeasureClock::Cpu));
            let t0 = clock.now();
            std::thread::sleep(pause);
            let t1 = clock.now();
            spin(pause);
            (t1 - t0, clock.now() - t1)
        });
        assert!(slept < 0.02, "a pause of 80 ms counted {slept} s");
        assert!(spun > 0.01, "80 ms of work counted {spun} s");
        let two = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let slept = two.install(|| {
            let clock = MeasureClock::new();
            let t0 = clock.now();
            std::thread::sleep(pause);
            clock.now() - t0
        });
        assert!(
            slept >= 0.079,
            "two threads: a pause of 80 ms counted {slept} s"
        );
    }

    /// An empty batch (a data-parallel rank without samples) runs: an empty output of the
    /// right shape, zero parameter gradients (not the previous step's), an empty `dx`; a wrong
    /// shape is still an error.
    #[test]
    fn an_empty_batch_gives_empty_outputs_and_zero_gradients() {
        let rng = &mut SmallRng::seed_from_u64(5);
        let cfg = ConvConfig::conv2d(3, 4, 3).stride(2).padding(1);
        let mut conv = Conv::new(cfg, ConvAlgo::Convgemm, rng).unwrap();
        let x = Tensor::new(&[2, 3, 7, 6], vec![0.25; 2 * 3 * 7 * 6]).unwrap();
        let y = conv.forward(x, true).unwrap();
        conv.backward(Tensor::new(y.shape(), vec![1.0; y.len()]).unwrap(), true)
            .unwrap();
        assert!(
            conv.params()
                .iter()
                .all(|(_, p)| p.grad.data().iter().any(|&g| g != 0.0))
        );
        let y = conv.forward(Tensor::zeros(&[0, 3, 7, 6]), true).unwrap();
        assert_eq!(y.shape(), &[0, 4, 4, 3]);
        assert!(conv.backward(Tensor::zeros(&[0, 4, 4, 4]), true).is_err());
        conv.forward(Tensor::zeros(&[0, 3, 7, 6]), true).unwrap();
        let dx = conv.backward(Tensor::zeros(&[0, 4, 4, 3]), true).unwrap();
        assert_eq!(dx.unwrap().shape(), &[0, 3, 7, 6]);
        assert!(
            conv.params()
                .iter()
                .all(|(_, p)| p.grad.data().iter().all(|&g| g == 0.0))
        );
        assert!(
            conv.forward(Tensor::zeros(&[0, 2, 7, 6]), true).is_err(),
            "channels"
        );
    }

    /// Two `Auto` layers of one geometry share one measurement: the second reuses the first's
    /// choice instead of timing again.
    #[test]
    fn auto_measures_a_geometry_once_per_process() {
        let rng = &mut SmallRng::seed_from_u64(3);
        // A geometry no other test uses (7 → 11 channels at 13×9), so the count is this test's.
        let cfg = ConvConfig::conv2d(7, 11, 3).padding(1);
        let x = Tensor::new(&[2, 7, 13, 9], vec![0.5; 2 * 7 * 13 * 9]).unwrap();
        let mut a = Conv::new(cfg.clone(), ConvAlgo::Auto, rng).unwrap();
        let mut b = Conv::new(cfg, ConvAlgo::Auto, rng).unwrap();
        a.forward(x.clone(), false).unwrap();
        b.forward(x, false).unwrap();
        assert_eq!(a.algorithm_in_use(), b.algorithm_in_use());
        let geom = a.geometry(&[2, 7, 13, 9]).unwrap();
        let m = MEASURED.lock().unwrap();
        let hits = m[&(geom, rayon::current_num_threads())].hits;
        assert_eq!(hits, 1, "the second layer reused the measurement");
    }
}
