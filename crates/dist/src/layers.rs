//! Distributed layers as [`nn::Layer`]s, and the model transform that makes a model channel
//! parallel.
//!
//! A layer is `Send` (a model may move between threads) and an MPI communicator is not: it
//! belongs to the thread that uses it (MPI's funneled threading). So a distributed layer does not
//! own its communicator. The communicator is [`register`]ed with the current thread, which keeps
//! it until the returned [`Registration`] drops, and the layer holds a [`CommHandle`], a `Send`
//! name for it that resolves only on that thread. Used anywhere else, or after the registration
//! is gone, the layer fails with [`DistError::CommHandle`] instead of calling MPI from the wrong
//! thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{self, ThreadId};

use nn::{
    BatchNorm, Conv, GlobalAvgPool, Layer, MaxPool, NnError, Parameter, Relu, Residual, Sequential,
    Tensor,
};

use crate::channel_conv::{ChannelParallelConv, FilterParallelConv, allgather_channels, dims};
use crate::comm::Communicator;
use crate::error::{DistError, Result};
use crate::runtime::World;
use crate::stationary_w::{BoundW, GridHandles, StationaryWConv};

thread_local! {
    static REGISTRY: RefCell<HashMap<usize, Rc<World>>> = RefCell::new(HashMap::new());
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// Keeps a communicator registered with the current thread; dropping it unregisters (and drops)
/// the communicator, so MPI can finalise when the [`crate::Runtime`] goes. Not `Send`.
pub struct Registration {
    handle: CommHandle,
    _thread_bound: PhantomData<*const ()>,
}

/// Registers `comm` with the current thread for the distributed layers built from
/// [`Registration::handle`].
pub fn register(comm: World) -> Registration {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    REGISTRY.with(|r| r.borrow_mut().insert(id, Rc::new(comm)));
    Registration {
        handle: CommHandle {
            id,
            thread: thread::current().id(),
        },
        _thread_bound: PhantomData,
    }
}

impl Registration {
    /// The handle distributed layers keep.
    pub fn handle(&self) -> CommHandle {
        self.handle
    }

    /// The registered communicator.
    pub fn comm(&self) -> Rc<World> {
        self.handle
            .get()
            .expect("a registration's communicator stays registered on its thread")
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        REGISTRY.with(|r| r.borrow_mut().remove(&self.handle.id));
    }
}

/// A `Send` name for a communicator registered with one thread ([`register`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommHandle {
    id: usize,
    thread: ThreadId,
}

impl CommHandle {
    /// The communicator, on the thread that registered it while the registration lives.
    ///
    /// Errors: [`DistError::CommHandle`] on another thread or after the registration dropped.
    pub fn get(&self) -> Result<Rc<World>> {
        if thread::current().id() != self.thread {
            return Err(DistError::CommHandle(format!(
                "communicator registered on {:?} used on {:?}: run a distributed model on the \
                 thread that registered its communicator",
                self.thread,
                thread::current().id()
            )));
        }
        REGISTRY
            .with(|r| r.borrow().get(&self.id).cloned())
            .ok_or_else(|| {
                DistError::CommHandle(
                    "the communicator's registration was dropped before its layers".into(),
                )
            })
    }
}

/// A distributed operator: forward and backward are collective over a communicator. [`Bound`]
/// makes one an [`nn::Layer`].
pub trait DistLayer: Send + 'static {
    /// A short description, e.g. `ChannelParallel(Conv2d(64→64, …), block 1 of 2)`.
    fn describe(&self) -> String;
    /// [`nn::Layer::forward`], collective over `comm`.
    fn forward(&mut self, comm: &World, x: Tensor, train: bool) -> Result<Tensor>;
    /// [`nn::Layer::backward`], collective over `comm`.
    fn backward(&mut self, comm: &World, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>>;
    /// The parameters this rank holds, with PyTorch's names.
    fn params(&self) -> Vec<(String, &Parameter)>;
    /// The same, mutable.
    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)>;
    /// This rank's output sample shape for this rank's input sample shape (no batch axis).
    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>>;
    /// Non-trained state (batch norm's running statistics), with PyTorch's names.
    fn buffers(&self) -> Vec<(String, &Tensor)> {
        Vec::new()
    }
    /// The same, mutable.
    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }
}

/// A [`DistLayer`] bound to a registered communicator: an [`nn::Layer`] that can sit in a
/// [`Sequential`] beside ordinary layers.
pub struct Bound<L: DistLayer> {
    layer: L,
    comm: CommHandle,
}

impl<L: DistLayer> Bound<L> {
    /// `layer` running its collectives over the communicator of `comm`.
    pub fn new(layer: L, comm: CommHandle) -> Self {
        Bound { layer, comm }
    }

    /// The distributed operator.
    pub fn inner(&self) -> &L {
        &self.layer
    }

    fn run<T>(&mut self, f: impl FnOnce(&mut L, &World) -> Result<T>) -> nn::Result<T> {
        let describe = || self.layer.describe();
        let comm = self.comm.get().map_err(|e| to_nn(describe(), e))?;
        f(&mut self.layer, &comm).map_err(|e| to_nn(self.layer.describe(), e))
    }
}

/// A `dist` error as the `nn` error of layer `layer` (an `nn` error passes through unchanged).
pub(crate) fn to_nn(layer: String, e: DistError) -> NnError {
    match e {
        DistError::Nn(e) => e,
        e => NnError::Layer {
            layer,
            source: Box::new(e),
        },
    }
}

impl<L: DistLayer> Layer for Bound<L> {
    fn describe(&self) -> String {
        self.layer.describe()
    }

    fn forward(&mut self, x: Tensor, train: bool) -> nn::Result<Tensor> {
        self.run(|l, c| l.forward(c, x, train))
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> nn::Result<Option<Tensor>> {
        self.run(|l, c| l.backward(c, dy, need_dx))
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        self.layer.params()
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        self.layer.params_mut()
    }

    fn buffers(&self) -> Vec<(String, &Tensor)> {
        self.layer.buffers()
    }

    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.layer.buffers_mut()
    }

    fn output_shape(&self, input: &[usize]) -> nn::Result<Vec<usize>> {
        self.layer
            .output_shape(input)
            .map_err(|e| to_nn(self.layer.describe(), e))
    }
}

/// From a tensor every rank holds whole (`N × C × spatial`) to this rank's block of channels
/// (`N × C/parts × spatial`): local in forward; backward allgathers the blocks of `dy` into
/// the whole `dx`, which every rank then holds.
#[derive(Debug, Clone)]
pub struct ChannelScatter {
    parts: usize,
    part: usize,
}

/// From this rank's block of channels to the whole tensor on every rank: forward allgathers;
/// backward keeps this rank's block of `dy` (every rank holds the same whole `dy`).
#[derive(Debug, Clone)]
pub struct ChannelGather {
    parts: usize,
    part: usize,
}

impl ChannelScatter {
    /// Block `part` of `parts`.
    ///
    /// Errors: [`DistError::Training`] when `part >= parts`.
    pub fn new(parts: usize, part: usize) -> Result<Self> {
        check_block(parts, part)?;
        Ok(ChannelScatter { parts, part })
    }
}

impl ChannelGather {
    /// Block `part` of `parts`.
    ///
    /// Errors: [`DistError::Training`] when `part >= parts`.
    pub fn new(parts: usize, part: usize) -> Result<Self> {
        check_block(parts, part)?;
        Ok(ChannelGather { parts, part })
    }
}

pub(crate) fn check_block(parts: usize, part: usize) -> Result<()> {
    if part >= parts {
        return Err(DistError::Training(format!(
            "block {part} of {parts} does not exist"
        )));
    }
    Ok(())
}

/// Channel block `part` of `parts` of `t` (`N × C × plane`).
fn block_of(t: &Tensor, parts: usize, part: usize, what: &str) -> Result<Tensor> {
    let (n, c, plane) = dims(what, t.shape())?;
    if !c.is_multiple_of(parts) {
        return Err(DistError::Training(format!(
            "{what} has {c} channels, not divisible in {parts} blocks"
        )));
    }
    let cl = c / parts;
    let mut out = Vec::with_capacity(n * cl * plane);
    for i in 0..n {
        out.extend_from_slice(&t.data()[(i * c + part * cl) * plane..][..cl * plane]);
    }
    let mut shape = t.shape().to_vec();
    shape[1] = cl;
    Ok(Tensor::new(&shape, out)?)
}

/// Every rank's channel block of `t` (`N × C/parts × plane`) assembled into `N × C × plane`.
fn gather_blocks(comm: &World, t: &Tensor, parts: usize) -> Result<Tensor> {
    if comm.size() != parts {
        return Err(DistError::Training(format!(
            "a gather of {parts} channel blocks run on {} ranks",
            comm.size()
        )));
    }
    allgather_channels(comm, t)
}

impl DistLayer for ChannelScatter {
    fn describe(&self) -> String {
        format!("ChannelScatter(block {} of {})", self.part + 1, self.parts)
    }

    fn forward(&mut self, _comm: &World, x: Tensor, _train: bool) -> Result<Tensor> {
        block_of(&x, self.parts, self.part, "x")
    }

    fn backward(&mut self, comm: &World, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        // Collective whether or not this rank needs dx: every rank must take part.
        let dx = gather_blocks(comm, &dy, self.parts)?;
        Ok(need_dx.then_some(dx))
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        Vec::new()
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        Vec::new()
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        match input.first() {
            Some(&c) if c.is_multiple_of(self.parts) => {
                let mut out = input.to_vec();
                out[0] = c / self.parts;
                Ok(out)
            }
            _ => Err(DistError::Training(format!(
                "ChannelScatter: input {input:?} has no channel count divisible by {}",
                self.parts
            ))),
        }
    }
}

impl DistLayer for ChannelGather {
    fn describe(&self) -> String {
        format!("ChannelGather(block {} of {})", self.part + 1, self.parts)
    }

    fn forward(&mut self, comm: &World, x: Tensor, _train: bool) -> Result<Tensor> {
        gather_blocks(comm, &x, self.parts)
    }

    fn backward(&mut self, _comm: &World, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        need_dx
            .then(|| block_of(&dy, self.parts, self.part, "dy"))
            .transpose()
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        Vec::new()
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        Vec::new()
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        let mut out = input.to_vec();
        match out.first_mut() {
            Some(c) => {
                *c *= self.parts;
                Ok(out)
            }
            None => Err(DistError::Training(
                "ChannelGather: an input sample has no channel axis".into(),
            )),
        }
    }
}

impl DistLayer for ChannelParallelConv {
    fn describe(&self) -> String {
        let (parts, part) = self.block();
        format!(
            "ChannelParallel({}, block {} of {parts})",
            self.local().describe(),
            part + 1
        )
    }

    fn forward(&mut self, comm: &World, x: Tensor, train: bool) -> Result<Tensor> {
        ChannelParallelConv::forward(self, comm, x, train)
    }

    fn backward(&mut self, comm: &World, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        ChannelParallelConv::backward(self, comm, dy, need_dx)
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        ChannelParallelConv::params(self)
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        ChannelParallelConv::params_mut(self)
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        // The local convolution maps the input block to every output channel; the
        // reduce-scatter leaves this rank its block of them.
        let mut out = self.local().output_shape(input)?;
        out[0] /= self.block().0;
        Ok(out)
    }
}

impl DistLayer for FilterParallelConv {
    fn describe(&self) -> String {
        let (parts, part) = self.block();
        format!(
            "FilterParallel({}, block {} of {parts})",
            self.local().describe(),
            part + 1
        )
    }

    fn forward(&mut self, comm: &World, x: Tensor, train: bool) -> Result<Tensor> {
        FilterParallelConv::forward(self, comm, x, train)
    }

    fn backward(&mut self, comm: &World, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        FilterParallelConv::backward(self, comm, dy, need_dx)
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        FilterParallelConv::params(self)
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        FilterParallelConv::params_mut(self)
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        // The allgather brings every input channel; the local convolution makes this rank's
        // block of filters.
        let mut whole = input.to_vec();
        if let Some(c) = whole.first_mut() {
            *c *= self.block().0;
        }
        Ok(self.local().output_shape(&whole)?)
    }
}

/// How [`channel_parallel`] distributed a model: the layers it replaced (dotted names, as in
/// the model's parameter names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelPlan {
    /// Names of the convolutions run channel parallel (stationary-x).
    pub channel: Vec<String>,
    /// Names of the convolutions run filter parallel (stationary-y).
    pub filter: Vec<String>,
    /// Names of the batch norms run on channel blocks (each rank normalises its block of
    /// channels; the statistics of a channel are all on one rank, so no collective).
    pub batch_norm: Vec<String>,
    /// Names of the convolutions left whole (their channel counts do not divide in blocks, or
    /// they sit in a residual block that cannot run on blocks).
    pub whole: Vec<String>,
    /// Names of the stationary-w convolutions ([`crate::stationary_w_parallel`]).
    pub stationary_w: Vec<String>,
    /// Names of the split layers that take their input in the transposed distribution a
    /// stationary-w convolution leaves (rank `c · pf + f` holding block `f · pc + c`): the
    /// stationary-w convolutions among them run on the transposed `pf × pc` grid, the others
    /// (batch norms, stationary-x convolutions) hold block `f · pc + c` of their channels.
    pub transposed: Vec<String>,
    /// `(pc, pf)` of a stationary-w plan; `None` for [`channel_parallel`]'s.
    pub grid: Option<(usize, usize)>,
}

/// `model` as block `part` of `parts` of a channel parallel model over the communicator of
/// `comm` (a [`crate::ProcessorGrid`] row), every rank of it passing the same model (same seed)
/// and, in training, the same samples.
///
/// Runs of top-level layers that can work on channel blocks are split: convolutions whose input
/// and output channels divide in `parts` blocks, the channel-wise layers between them (ReLU,
/// max-pool, batch norm, global average pooling), and residual blocks and nested sequences made
/// only of those (the ResNets' stages). A [`ChannelScatter`] goes before the run and a
/// [`ChannelGather`] after it. Convolutions alternate between [`ChannelParallelConv`]
/// (stationary-x) and [`FilterParallelConv`] (stationary-y) as "Channel and Filter Parallelism
/// for Large-Scale CNN Training" pairs them (either takes and leaves channel blocks; a residual
/// block's shortcut starts its own alternation); batch norms keep their block of channels'
/// parameters and running statistics. Every other layer (the first convolution of 1 or 3
/// channels and what follows it before the run, the classifier) runs whole and identically on
/// every rank. Parameter names are kept, each rank holding its slice of a split layer's tensors.
///
/// With [`nn::ConvAlgo::Auto`] every rank times its own choice, so the copies of a whole layer
/// may round differently on different ranks and drift apart at rounding level; build the model
/// with an explicit algorithm for identical copies (the test does).
///
/// Errors: [`DistError::Training`] when `part >= parts` or `model` is a block without an input
/// shape; [`DistError::Nn`] when the rebuilt model does not accept the shapes.
pub fn channel_parallel(
    model: Sequential,
    comm: CommHandle,
    parts: usize,
    part: usize,
) -> Result<(Sequential, ChannelPlan)> {
    check_block(parts, part)?;
    let input = model.input_shape().to_vec();
    if input.is_empty() {
        return Err(DistError::Training(
            "channel_parallel takes a model with an input shape, not a block".into(),
        ));
    }
    let splitter = ChannelSplitter {
        comm,
        parts,
        part,
        plan: ChannelPlan::default(),
        stationary_x: true,
        w: None,
    };
    splitter.run(model, input)
}

/// `model` as this rank's part of a stationary-w model (section 3.4 of "Channel and Filter
/// Parallelism for Large-Scale CNN Training") over the `pc × pf` grid of `grid`
/// ([`crate::GridRegistration`] over a [`crate::ProcessorGrid`] row), every rank passing the
/// same model (same seed) and, in training, the same samples.
///
/// The same runs as [`channel_parallel`] are split, on `pc · pf` channel blocks, but every
/// convolution is a [`StationaryWConv`]: each rank holds a `K/pf × C/pc` block of its weights.
/// A stationary-w convolution leaves the transposed distribution (rank `c · pf + f` holding
/// block `f · pc + c`); the next one runs on the transposed grid and restores it, and the batch
/// norms and the final gather follow the distribution they find. Where a residual block's body
/// and shortcut would disagree (a body of two convolutions, a shortcut of one), the shortcut's
/// first convolution is a stationary-x convolution over the whole row, which keeps the
/// distribution. On a `P × 1` or `1 × P` grid the model computes what [`channel_parallel`]'s
/// does with every convolution stationary-x or stationary-y.
///
/// Errors: as [`channel_parallel`]; [`DistError::Training`] for a residual block whose
/// distributions cannot agree (odd and even convolution counts with no convolution at the top
/// of either branch).
pub fn stationary_w_parallel(
    model: Sequential,
    grid: GridHandles,
) -> Result<(Sequential, ChannelPlan)> {
    let (pc, pf) = grid.shape;
    let (c, f) = grid.coords;
    let parts = pc * pf;
    let part = c * pf + f;
    check_block(parts, part)?;
    let input = model.input_shape().to_vec();
    if input.is_empty() {
        return Err(DistError::Training(
            "stationary_w_parallel takes a model with an input shape, not a block".into(),
        ));
    }
    let splitter = ChannelSplitter {
        comm: grid.full,
        parts,
        part,
        plan: ChannelPlan {
            grid: Some(grid.shape),
            ..ChannelPlan::default()
        },
        stationary_x: true,
        w: Some(WState {
            grid,
            transposed: false,
            keep: None,
        }),
    };
    splitter.run(model, input)
}

impl ChannelSplitter {
    /// The walk over the top-level layers of `model` (input shape `input`).
    fn run(mut self, model: Sequential, input: Vec<usize>) -> Result<(Sequential, ChannelPlan)> {
        let (parts, part) = (self.parts, self.part);
        let comm = self.comm;
        let splitter = &mut self;
        let mut out = Sequential::new(&input);
        let mut split = false;
        for (name, layer) in model.into_layers() {
            let starts = splitter.starts_run(layer.as_ref());
            let channel_wise = channel_wise(layer.as_ref());
            if starts && !split {
                out = out.push_boxed(
                    &format!("{name}_scatter"),
                    Box::new(Bound::new(ChannelScatter::new(parts, part)?, comm)),
                )?;
                split = true;
                splitter.stationary_x = true;
                if let Some(w) = &mut splitter.w {
                    w.transposed = false;
                }
            }
            if split && (starts || channel_wise) {
                out = out.push_boxed(&name, splitter.split(&name, layer)?)?;
                continue;
            }
            if split {
                out = out.push_boxed(&format!("{name}_gather"), splitter.gather()?)?;
                split = false;
            }
            convs(&name, layer.as_ref(), &mut splitter.plan.whole);
            out = out.push_boxed(&name, layer)?;
        }
        if split {
            out = out.push_boxed("gather", splitter.gather()?)?;
        }
        Ok((out, self.plan))
    }
}

/// Layers that act on each channel alone, so they run unchanged (or, batch norm, on its block
/// of parameters) on channel blocks.
fn channel_wise(layer: &dyn Layer) -> bool {
    layer.downcast_ref::<Relu>().is_some()
        || layer.downcast_ref::<MaxPool>().is_some()
        || layer.downcast_ref::<BatchNorm>().is_some()
        || layer.downcast_ref::<GlobalAvgPool>().is_some()
}

/// The dotted names of the convolutions in `layer` (itself, or inside blocks).
fn convs(path: &str, layer: &dyn Layer, out: &mut Vec<String>) {
    if layer.downcast_ref::<Conv>().is_some() {
        out.push(path.to_string());
    } else if let Some(seq) = layer.downcast_ref::<Sequential>() {
        for (name, l) in seq.names().iter().zip(seq.layers()) {
            convs(&format!("{path}.{name}"), l.as_ref(), out);
        }
    } else if let Some(block) = layer.downcast_ref::<Residual>() {
        convs(path, block.body(), out);
        if let Some((name, s)) = block.shortcut() {
            convs(&format!("{path}.{name}"), s, out);
        }
    }
}

/// The number of times a stationary-w model's distribution flips along `layer`'s main path:
/// its convolutions, a residual block's body's.
fn flips(layer: &dyn Layer) -> usize {
    if layer.downcast_ref::<Conv>().is_some() {
        1
    } else if let Some(seq) = layer.downcast_ref::<Sequential>() {
        seq.layers().iter().map(|l| flips(l.as_ref())).sum()
    } else if let Some(block) = layer.downcast_ref::<Residual>() {
        flips(block.body())
    } else {
        0
    }
}

/// The dotted name of the first convolution among the top-level layers of `seq` (at `path`).
fn first_conv(path: &str, seq: &Sequential) -> Option<String> {
    seq.names()
        .iter()
        .zip(seq.layers())
        .find(|(_, l)| l.downcast_ref::<Conv>().is_some())
        .map(|(n, _)| format!("{path}.{n}"))
}

/// A stationary-w walk's state.
struct WState {
    grid: GridHandles,
    /// Whether the activations are in the transposed distribution (rank `c · pf + f` holding
    /// block `f · pc + c`).
    transposed: bool,
    /// The convolution that must keep the distribution (a stationary-x one), where a residual
    /// block's branches would otherwise disagree.
    keep: Option<String>,
}

impl WState {
    /// The channel block this rank holds in the current distribution.
    fn block(&self) -> usize {
        let ((pc, pf), (c, f)) = (self.grid.shape, self.grid.coords);
        if self.transposed {
            f * pc + c
        } else {
            c * pf + f
        }
    }

    /// The grid row ordered by the current distribution's blocks.
    fn comm(&self) -> CommHandle {
        if self.transposed {
            self.grid.transposed
        } else {
            self.grid.full
        }
    }
}

/// [`channel_parallel`]'s and [`stationary_w_parallel`]'s walk: what it replaced, and which
/// kind the next convolution takes.
struct ChannelSplitter {
    comm: CommHandle,
    parts: usize,
    part: usize,
    plan: ChannelPlan,
    stationary_x: bool,
    /// A stationary-w walk's state; `None` for stationary-x and -y alternating.
    w: Option<WState>,
}

impl ChannelSplitter {
    /// The gather that ends a split run, from the current distribution.
    fn gather(&self) -> Result<Box<dyn Layer>> {
        let (comm, part) = match &self.w {
            Some(w) => (w.comm(), w.block()),
            None => (self.comm, self.part),
        };
        Ok(Box::new(Bound::new(
            ChannelGather::new(self.parts, part)?,
            comm,
        )))
    }

    /// The channel block this rank holds in the current distribution, and the row's
    /// communicator ordered by those blocks.
    fn current(&self) -> (usize, CommHandle) {
        match &self.w {
            Some(w) => (w.block(), w.comm()),
            None => (self.part, self.comm),
        }
    }

    /// Records `path` among the layers that run in the transposed distribution, if the walk
    /// is in it.
    fn note_transposed(&mut self, path: &str) {
        if self.w.as_ref().is_some_and(|w| w.transposed) {
            self.plan.transposed.push(path.to_string());
        }
    }

    /// Convolution `conv` at `path` in a stationary-w walk.
    fn split_w(&mut self, path: &str, conv: &Conv) -> Result<Box<dyn Layer>> {
        let (cfg, algo) = (conv.config().clone(), conv.algorithm());
        let (block, comm) = self.current();
        self.note_transposed(path);
        let Some(w) = &mut self.w else {
            return Err(DistError::Training(format!(
                "{path}: not a stationary-w walk"
            )));
        };
        if w.keep.as_deref() == Some(path) {
            w.keep = None;
            self.plan.channel.push(path.to_string());
            let l = ChannelParallelConv::from_conv(conv, cfg, algo, self.parts, block)?;
            return Ok(Box::new(Bound::new(l, comm)));
        }
        let ((pc, pf), (c, f)) = (w.grid.shape, w.grid.coords);
        let g = w.grid;
        let (shape, coords, row, col) = if w.transposed {
            ((pf, pc), (f, c), g.col, g.row)
        } else {
            ((pc, pf), (c, f), g.row, g.col)
        };
        w.transposed = !w.transposed;
        self.plan.stationary_w.push(path.to_string());
        let l = StationaryWConv::from_conv(conv, cfg, algo, shape, coords)?;
        Ok(Box::new(BoundW::new(l, row, col)))
    }

    fn conv_divides(&self, conv: &Conv) -> bool {
        let c = conv.config();
        let parts = self.parts;
        parts > 1 && c.in_channels.is_multiple_of(parts) && c.out_channels.is_multiple_of(parts)
    }

    /// Whether `layer` can run on channel blocks.
    fn block_wise(&self, layer: &dyn Layer) -> bool {
        if let Some(conv) = layer.downcast_ref::<Conv>() {
            return self.conv_divides(conv);
        }
        if channel_wise(layer) {
            return true;
        }
        let all = |s: &Sequential| s.layers().iter().all(|l| self.block_wise(l.as_ref()));
        if let Some(seq) = layer.downcast_ref::<Sequential>() {
            return all(seq);
        }
        if let Some(block) = layer.downcast_ref::<Residual>() {
            return all(block.body()) && block.shortcut().is_none_or(|(_, s)| all(s));
        }
        false
    }

    /// Whether a split run starts (or goes on) at `layer`: it runs on blocks and holds a
    /// convolution to split.
    fn starts_run(&self, layer: &dyn Layer) -> bool {
        let mut found = Vec::new();
        convs("", layer, &mut found);
        !found.is_empty() && self.block_wise(layer)
    }

    /// `layer` (for which [`ChannelSplitter::block_wise`] holds) on this rank's channel block;
    /// `path` is its dotted name.
    fn split(&mut self, path: &str, layer: Box<dyn Layer>) -> Result<Box<dyn Layer>> {
        let (comm, parts, part) = (self.comm, self.parts, self.part);
        if let Some(conv) = layer.downcast_ref::<Conv>()
            && self.w.is_some()
        {
            return self.split_w(path, conv);
        }
        if let Some(conv) = layer.downcast_ref::<Conv>() {
            let (cfg, algo) = (conv.config().clone(), conv.algorithm());
            let boxed: Box<dyn Layer> = if self.stationary_x {
                self.plan.channel.push(path.to_string());
                let l = ChannelParallelConv::from_conv(conv, cfg, algo, parts, part)?;
                Box::new(Bound::new(l, comm))
            } else {
                self.plan.filter.push(path.to_string());
                let l = FilterParallelConv::from_conv(conv, cfg, algo, parts, part)?;
                Box::new(Bound::new(l, comm))
            };
            self.stationary_x = !self.stationary_x;
            return Ok(boxed);
        }
        if let Some(bn) = layer.downcast_ref::<BatchNorm>() {
            self.plan.batch_norm.push(path.to_string());
            self.note_transposed(path);
            let (block, _) = self.current();
            return Ok(Box::new(batch_norm_block(bn, parts, block)?));
        }
        if channel_wise(layer.as_ref()) {
            return Ok(layer);
        }
        let any: Box<dyn std::any::Any> = layer.into_any();
        let any = match any.downcast::<Sequential>() {
            Ok(seq) => return Ok(Box::new(self.split_seq(path, *seq)?)),
            Err(other) => other,
        };
        let any = match any.downcast::<Residual>() {
            Ok(block) if self.w.is_some() => {
                return Ok(Box::new(self.split_residual_w(path, *block)?));
            }
            other => other,
        };
        match any {
            Ok(block) => Ok(Box::new(block.try_map(|name, s| match name {
                None => self.split_seq(path, s),
                Some(n) => {
                    // The shortcut starts its own alternation; the body's goes on after it.
                    let after_body = std::mem::replace(&mut self.stationary_x, true);
                    let s = self.split_seq(&format!("{path}.{n}"), s);
                    self.stationary_x = after_body;
                    s
                }
            })?)),
            Err(_) => Err(DistError::Training(format!(
                "{path}: no channel-block form for this layer"
            ))),
        }
    }

    /// Residual block `block` at `path` in a stationary-w walk: body and shortcut must leave
    /// the distribution they find the same way, so where their convolution counts differ in
    /// parity, the first convolution at the top of the shortcut (else of the body) keeps it.
    fn split_residual_w(&mut self, path: &str, block: Residual) -> Result<Residual> {
        let body_flips = flips(block.body());
        let short = block.shortcut().map(|(n, s)| (n.to_string(), flips(s), s));
        let keep = match &short {
            Some((_, s_flips, _)) if (s_flips + body_flips).is_multiple_of(2) => None,
            None if body_flips.is_multiple_of(2) => None,
            Some((n, _, s)) if first_conv(&format!("{path}.{n}"), s).is_some() => {
                first_conv(&format!("{path}.{n}"), s).map(|p| (true, p))
            }
            _ => match first_conv(path, block.body()) {
                Some(p) => Some((false, p)),
                None => {
                    return Err(DistError::Training(format!(
                        "{path}: the body and the shortcut leave different distributions and \
                         neither starts with a convolution to keep it"
                    )));
                }
            },
        };
        let start = self.w.as_ref().is_some_and(|w| w.transposed);
        let mut body_end = start;
        block.try_map(|name, s| {
            let on_shortcut = name.is_some();
            if let Some(w) = &mut self.w {
                if on_shortcut {
                    body_end = w.transposed;
                    w.transposed = start;
                }
                w.keep = keep
                    .as_ref()
                    .filter(|(short, _)| *short == on_shortcut)
                    .map(|(_, p)| p.clone());
            }
            let out = match name {
                None => self.split_seq(path, s)?,
                Some(n) => self.split_seq(&format!("{path}.{n}"), s)?,
            };
            if on_shortcut && self.w.as_ref().is_some_and(|w| w.transposed != body_end) {
                return Err(DistError::Training(format!(
                    "{path}: the shortcut leaves another distribution than the body"
                )));
            }
            Ok(out)
        })
    }

    /// A nested block (no input shape) with every layer on channel blocks.
    fn split_seq(&mut self, path: &str, seq: Sequential) -> Result<Sequential> {
        let mut out = Sequential::block();
        for (name, layer) in seq.into_layers() {
            let l = self.split(&format!("{path}.{name}"), layer)?;
            out = out.push_boxed(&name, l)?;
        }
        Ok(out)
    }
}

/// Block `part` of `parts` of batch norm `bn`: its channels' weight, bias and running
/// statistics.
fn batch_norm_block(bn: &BatchNorm, parts: usize, part: usize) -> Result<BatchNorm> {
    let channels = bn.params().first().map_or(0, |(_, p)| p.value.len());
    if !channels.is_multiple_of(parts) {
        return Err(DistError::Training(format!(
            "{}: {channels} channels do not split in {parts} blocks",
            bn.describe()
        )));
    }
    let c = channels / parts;
    let range = part * c..(part + 1) * c;
    let mut out = BatchNorm::new(c)?;
    for ((_, dst), (_, src)) in out.params_mut().into_iter().zip(bn.params()) {
        dst.value
            .data_mut()
            .copy_from_slice(&src.value.data()[range.clone()]);
    }
    for ((_, dst), (_, src)) in out.buffers_mut().into_iter().zip(bn.buffers()) {
        dst.data_mut().copy_from_slice(&src.data()[range.clone()]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::single::SingleProcess;

    #[test]
    fn a_handle_resolves_only_on_its_thread_and_while_registered() {
        let reg = register(World::Single(SingleProcess));
        let h = reg.handle();
        assert_eq!(h.get().unwrap().size(), 1);
        let other = thread::spawn(move || h.get().map(|_| ())).join().unwrap();
        assert!(
            matches!(other, Err(DistError::CommHandle(ref m)) if m.contains("used on")),
            "{other:?}"
        );
        drop(reg);
        assert!(matches!(h.get(), Err(DistError::CommHandle(_))));
    }

    #[test]
    fn scatter_then_gather_is_the_identity_on_one_block() {
        let reg = register(World::Single(SingleProcess));
        let t = Tensor::new(&[2, 3, 2], (0..12).map(|v| v as f32).collect()).unwrap();
        let mut s = Bound::new(ChannelScatter::new(1, 0).unwrap(), reg.handle());
        let mut g = Bound::new(ChannelGather::new(1, 0).unwrap(), reg.handle());
        let y = g
            .forward(s.forward(t.clone(), true).unwrap(), true)
            .unwrap();
        assert_eq!(y, t);
        let dx = s
            .backward(g.backward(t.clone(), true).unwrap().unwrap(), true)
            .unwrap()
            .unwrap();
        assert_eq!(dx, t);
    }

    #[test]
    fn block_of_takes_each_samples_channel_block() {
        let t = Tensor::new(&[2, 4, 1], (0..8).map(|v| v as f32).collect()).unwrap();
        let b = block_of(&t, 2, 1, "t").unwrap();
        assert_eq!(b.shape(), &[2, 2, 1]);
        assert_eq!(b.data(), &[2.0, 3.0, 6.0, 7.0]);
        assert!(block_of(&t, 3, 0, "t").is_err());
        assert!(ChannelScatter::new(2, 2).is_err());
    }
}
