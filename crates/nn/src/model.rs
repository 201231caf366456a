//! [`Sequential`] models and the named architectures the `train` example offers.

use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};

use crate::error::{NnError, Result};
use crate::layer::{GradReady, Layer, Parameter, RngState, prefixed};
use crate::layers::{
    AdaptiveAvgPool, BasicBlock, BatchNorm, Conv, ConvAlgo, ConvConfig, Dropout, Flatten,
    GlobalAvgPool, Linear, MaxPool, Relu, Residual,
};
use crate::tensor::Tensor;

/// Layers applied in order, each with a name. Parameter names follow PyTorch's module paths:
/// `push` names a layer by its index, like `nn.Sequential` (`"3.weight"`), and `push_named` by a
/// field name, like a custom `nn.Module` (`"conv1.weight"`, `"layer1.0.bn2.running_mean"` when
/// models nest), so checkpoints line up with a PyTorch model of the same definition.
///
/// A `Sequential` is itself a [`Layer`], so blocks nest (torchvision's `layer1`, `features`).
/// A top-level model declares its sample shape ([`Sequential::new`]) and every `push` is checked
/// against it; a nested block ([`Sequential::block`]) takes whatever shape its layers accept.
pub struct Sequential {
    layers: Vec<Box<dyn Layer>>,
    names: Vec<String>,
    input_shape: Option<Vec<usize>>,
    /// Per layer: training-forward and backward time and calls, while profiling.
    profile: Option<Vec<Timing>>,
}

/// One layer's accumulated time while profiling.
#[derive(Debug, Clone, Copy, Default)]
struct Timing {
    forward: Duration,
    backward: Duration,
    forward_calls: usize,
    backward_calls: usize,
}

/// The time a profiled [`Sequential`] spent in one of its layers
/// ([`Sequential::set_profiling`]): wall-clock time of its training forwards and its backwards,
/// nested layers included (a residual block counts as one layer of its model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerProfile {
    /// The layer's name in the model (`"3"`, `"layer1"`).
    pub name: String,
    /// Its [`Layer::describe`].
    pub layer: String,
    /// Total time in training forwards (`train = true`; evaluation is not timed).
    pub forward: Duration,
    /// Total time in backwards.
    pub backward: Duration,
    /// Training forwards timed.
    pub forward_calls: usize,
    /// Backwards timed.
    pub backward_calls: usize,
}

impl Sequential {
    /// A model taking samples of `input_shape` (no batch axis), e.g. `[1, 28, 28]`.
    pub fn new(input_shape: &[usize]) -> Self {
        Sequential {
            layers: Vec::new(),
            names: Vec::new(),
            input_shape: Some(input_shape.to_vec()),
            profile: None,
        }
    }

    /// A block to nest inside a model: no declared input shape, so `push` checks nothing until
    /// the block is pushed into a model (whose `push` runs the block's `output_shape`).
    pub fn block() -> Self {
        Sequential {
            layers: Vec::new(),
            names: Vec::new(),
            input_shape: None,
            profile: None,
        }
    }

    /// Appends a layer named by its index, checking that it accepts the current output shape.
    pub fn push(self, layer: impl Layer + 'static) -> Result<Self> {
        let name = self.layers.len().to_string();
        self.push_as(name, Box::new(layer))
    }

    /// Appends a layer under `name` (a PyTorch attribute name: letters, digits and `_`, unique
    /// in this model), checking that it accepts the current output shape.
    pub fn push_named(self, name: &str, layer: impl Layer + 'static) -> Result<Self> {
        self.push_boxed(name, Box::new(layer))
    }

    /// [`push_named`](Sequential::push_named) for a layer already boxed, e.g. one taken from
    /// [`into_layers`](Sequential::into_layers).
    pub fn push_boxed(self, name: &str, layer: Box<dyn Layer>) -> Result<Self> {
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(NnError::config(
                "name",
                format!("`{name}` is not a module name (letters, digits, `_`)"),
            ));
        }
        self.push_as(name.to_string(), layer)
    }

    /// The layers with their names, in order, taking the model apart (to rebuild it with some
    /// layers replaced, e.g. by distributed ones).
    pub fn into_layers(self) -> Vec<(String, Box<dyn Layer>)> {
        self.names.into_iter().zip(self.layers).collect()
    }

    fn push_as(mut self, name: String, layer: Box<dyn Layer>) -> Result<Self> {
        if self.names.contains(&name) {
            return Err(NnError::config(
                "name",
                format!("`{name}` is already a layer of this model"),
            ));
        }
        if self.input_shape.is_some() {
            let shape = self.output_shape()?;
            layer.output_shape(&shape)?;
        }
        self.layers.push(layer);
        self.names.push(name);
        Ok(self)
    }

    /// The shape of one input sample (empty for a [`block`](Sequential::block)).
    pub fn input_shape(&self) -> &[usize] {
        self.input_shape.as_deref().unwrap_or(&[])
    }

    /// The shape of one output sample; an error for a block, which has no declared input.
    pub fn output_shape(&self) -> Result<Vec<usize>> {
        let input = self
            .input_shape
            .clone()
            .ok_or_else(|| NnError::config("input_shape", "a block declares no input shape"))?;
        self.shape_after(input)
    }

    fn shape_after(&self, input: Vec<usize>) -> Result<Vec<usize>> {
        self.layers
            .iter()
            .try_fold(input, |s, l| l.output_shape(&s))
    }

    /// The layers.
    pub fn layers(&self) -> &[Box<dyn Layer>] {
        &self.layers
    }

    /// The layers' names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Runs every layer on `x` (`N × input_shape`); with `train`, layers keep what backward needs.
    pub fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        if let Some(input) = &self.input_shape
            && (x.shape().len() != input.len() + 1 || x.shape()[1..] != input[..])
        {
            let want = format!("N × {input:?}");
            return Err(NnError::shape("Sequential", "x", x.shape(), want));
        }
        match self.profile.as_mut().filter(|_| train) {
            None => self
                .layers
                .iter_mut()
                .try_fold(x, |x, l| l.forward(x, train)),
            Some(times) => {
                times.resize(self.layers.len(), Timing::default());
                self.layers
                    .iter_mut()
                    .zip(times.iter_mut())
                    .try_fold(x, |x, (l, t)| {
                        let start = Instant::now();
                        let y = l.forward(x, train);
                        t.forward += start.elapsed();
                        t.forward_calls += 1;
                        y
                    })
            }
        }
    }

    /// Starts (`on`, from zero) or stops timing each layer's training forwards and backwards,
    /// and those of the layers nested in it (a residual block's, a nested sequence's). Costs
    /// two clock reads per layer and pass while on.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(|| vec![Timing::default(); self.layers.len()]);
        for l in &mut self.layers {
            l.set_profiling(on);
        }
    }

    /// The time spent in each layer since [`set_profiling`](Sequential::set_profiling) turned
    /// profiling on, in layer order, each followed by the layers nested in it (dotted names,
    /// `"3.c1"`, as the parameters'); empty while it is off.
    pub fn profile(&self) -> Vec<LayerProfile> {
        let Some(times) = &self.profile else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, (l, name)) in self.layers.iter().zip(&self.names).enumerate() {
            let t = times.get(i).copied().unwrap_or_default();
            out.push(LayerProfile {
                name: name.clone(),
                layer: l.describe(),
                forward: t.forward,
                backward: t.backward,
                forward_calls: t.forward_calls,
                backward_calls: t.backward_calls,
            });
            out.extend(l.profile().into_iter().map(|p| LayerProfile {
                name: format!("{name}.{}", p.name),
                ..p
            }));
        }
        out
    }

    /// Back-propagates `dy` (the gradient of the loss with respect to the output) through every
    /// layer, writing every parameter's gradient. The input gradient is not computed.
    pub fn backward(&mut self, dy: Tensor) -> Result<()> {
        self.backward_layers(dy, false, None).map(|_| ())
    }

    /// Back-propagates `dy` like [`Sequential::backward`], calling `ready(name, parameter)` for
    /// every parameter as soon as its gradient is final (last layers first; nested blocks report
    /// child by child), with its full PyTorch name.
    pub fn backward_notify(&mut self, dy: Tensor, ready: &mut GradReady) -> Result<()> {
        self.backward_layers(dy, false, Some(ready)).map(|_| ())
    }

    fn backward_layers(
        &mut self,
        dy: Tensor,
        need_dx: bool,
        mut ready: Option<&mut GradReady>,
    ) -> Result<Option<Tensor>> {
        let mut d = dy;
        if let Some(times) = &mut self.profile {
            times.resize(self.layers.len(), Timing::default());
        }
        for (i, (layer, name)) in self.layers.iter_mut().zip(&self.names).enumerate().rev() {
            let need = i > 0 || need_dx;
            let start = Instant::now();
            let dx = match ready.as_deref_mut() {
                Some(ready) => {
                    layer.backward_notify(d, need, &mut |n, p| ready(&format!("{name}.{n}"), p))?
                }
                None => layer.backward(d, need)?,
            };
            if let Some(t) = self.profile.as_mut().and_then(|t| t.get_mut(i)) {
                t.backward += start.elapsed();
                t.backward_calls += 1;
            }
            match dx {
                Some(dx) if need => d = dx,
                _ if !need => return Ok(None),
                _ => {
                    return Err(NnError::NoForward {
                        layer: layer.describe(),
                    });
                }
            }
        }
        Ok(Some(d))
    }

    /// Every parameter with its PyTorch name, in a fixed order.
    pub fn params(&self) -> Vec<(String, &Parameter)> {
        self.layers
            .iter()
            .zip(&self.names)
            .flat_map(|(l, name)| prefixed(name, l.params()))
            .collect()
    }

    /// The same, mutable.
    pub fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        self.layers
            .iter_mut()
            .zip(&self.names)
            .flat_map(|(l, name)| prefixed(name, l.params_mut()))
            .collect()
    }

    /// Every non-trainable state tensor (batch norm's running statistics) with its PyTorch name.
    pub fn buffers(&self) -> Vec<(String, &Tensor)> {
        self.layers
            .iter()
            .zip(&self.names)
            .flat_map(|(l, name)| prefixed(name, l.buffers()))
            .collect()
    }

    /// The same, mutable.
    pub fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.layers
            .iter_mut()
            .zip(&self.names)
            .flat_map(|(l, name)| prefixed(name, l.buffers_mut()))
            .collect()
    }

    /// The state of every random generator (dropout's), with dotted names.
    pub fn rng_states(&self) -> Vec<(String, RngState)> {
        self.layers
            .iter()
            .zip(&self.names)
            .flat_map(|(l, name)| prefixed(name, l.rng_states()))
            .collect()
    }

    /// The same, mutable.
    pub fn rng_states_mut(&mut self) -> Vec<(String, &mut RngState)> {
        self.layers
            .iter_mut()
            .zip(&self.names)
            .flat_map(|(l, name)| prefixed(name, l.rng_states_mut()))
            .collect()
    }

    /// Number of trainable values.
    pub fn num_params(&self) -> usize {
        self.params().iter().map(|(_, p)| p.value.len()).sum()
    }

    /// One line per layer.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let mut shape = self.input_shape().to_vec();
        s.push_str(&format!("input {shape:?}\n"));
        for (l, name) in self.layers.iter().zip(&self.names) {
            shape = l.output_shape(&shape).unwrap_or_default();
            s.push_str(&format!("{name:>8} {:<50} → {shape:?}\n", l.describe()));
        }
        s
    }
}

impl Layer for Sequential {
    fn describe(&self) -> String {
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        format!("Sequential({})", names.join(", "))
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        Sequential::forward(self, x, train)
    }

    fn set_profiling(&mut self, on: bool) {
        Sequential::set_profiling(self, on);
    }

    fn profile(&self) -> Vec<LayerProfile> {
        Sequential::profile(self)
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        self.backward_layers(dy, need_dx, None)
    }

    fn backward_notify(
        &mut self,
        dy: Tensor,
        need_dx: bool,
        ready: &mut GradReady,
    ) -> Result<Option<Tensor>> {
        self.backward_layers(dy, need_dx, Some(ready))
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        Sequential::params(self)
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        Sequential::params_mut(self)
    }

    fn buffers(&self) -> Vec<(String, &Tensor)> {
        Sequential::buffers(self)
    }

    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Sequential::buffers_mut(self)
    }

    fn rng_states(&self) -> Vec<(String, RngState)> {
        Sequential::rng_states(self)
    }

    fn rng_states_mut(&mut self) -> Vec<(String, &mut RngState)> {
        Sequential::rng_states_mut(self)
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        if let Some(own) = &self.input_shape
            && own[..] != input[..]
        {
            return Err(NnError::shape(
                "Sequential",
                "input",
                input,
                format!("{own:?}"),
            ));
        }
        self.shape_after(input.to_vec())
    }
}

/// The models `build` knows.
pub const MODELS: &[&str] = &[
    "lenet", "resnet20", "vgg16", "vgg-a", "resnet18", "resnet34", "resnet50", "c3d",
];

/// What [`build_with`] may change in a model: the number of classes and the sample shape. `None`
/// keeps the model's own (see [`build`]); a shape the model cannot take is an error naming the
/// layer that refuses it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelOptions {
    /// Outputs of the classifier.
    pub classes: Option<usize>,
    /// The shape of one sample (no batch axis), e.g. `[3, 32, 32]` for a ResNet-18 on CIFAR-10.
    pub input: Option<Vec<usize>>,
}

/// Builds model `name` with its own classes and sample shape; see [`build_with`].
pub fn build(name: &str, algo: ConvAlgo, seed: u64) -> Result<Sequential> {
    build_with(name, &ModelOptions::default(), algo, seed)
}

/// Builds model `name` with weights drawn from `seed`, convolutions run by `algo`, and the
/// classes and sample shape of `opts` where given (defaults below).
///
/// `lenet`: LeNet-5 on 1×28×28 inputs, exactly the definition PyTorch is measured with
/// (`anchors/conv/train_bench.py`): conv 5×5 (1→6, pad 2), ReLU, max-pool 2, conv 5×5 (6→16),
/// ReLU, max-pool 2, flatten, 400→120, ReLU, 120→84, ReLU, 84→10.
///
/// `resnet20`: the CIFAR ResNet-20 of He et al. (2016) on 3×32×32 inputs as the anchors define
/// it: conv 3×3 (3→16, no bias), batch norm, ReLU, three stages of three [`BasicBlock`]s (16, 32,
/// 64 channels; stride 2 entering the last two; 1×1 convolution + batch norm shortcuts where the
/// shape changes), global average pooling, flatten, 64→10.
///
/// `vgg16`: VGG-16 (configuration D) on 3×32×32 inputs as the anchors define it: thirteen 3×3
/// convolutions (pad 1) with ReLU in five stages of 64, 128, 256, 512, 512 channels, each ended by
/// a 2×2 max-pool, then flatten, 512→512, ReLU, 512→512, ReLU, 512→10 (no batch norm, no dropout).
///
/// `resnet18`, `resnet34`, `resnet50`: torchvision's ResNets (`torchvision.models.resnet*`, ResNet-50
/// with the stride on its 3×3 convolutions, "v1.5") with torchvision's parameter names, on
/// 3×224×224 inputs and 1000 classes: conv 7×7 stride 2, batch norm, ReLU, max-pool 3×3 stride 2
/// pad 1, four stages of basic (18, 34: 2-2-2-2 and 3-4-6-3 blocks) or bottleneck (50: 3-4-6-3)
/// blocks, global average pooling, fully connected. Any input of at least 32×32 works.
///
/// `vgg-a`: torchvision's `vgg11` (configuration A: eight 3×3 convolutions, five max-pools,
/// adaptive average pooling to 7×7) with its classifier 25088→4096→4096→classes, ReLU and
/// dropout 0.5, on 3×224×224 inputs and 1000 classes; any input of at least 32×32 works.
///
/// `c3d`: C3D (Tran et al., 2015) on 3×16×112×112 clips and the 487 classes of Sports-1M: eight
/// 3×3×3 convolutions (pad 1) with ReLU (`conv1`, `conv2`, `conv3a/b`, `conv4a/b`, `conv5a/b`:
/// 64, 128, 256, 256, 512, 512, 512, 512 channels), max-pools 1×2×2 then 2×2×2 (the last padded
/// 0×1×1), `fc6` 8192→4096, `fc7` 4096→4096 (ReLU, dropout 0.5) and `fc8` 4096→classes.
pub fn build_with(
    name: &str,
    opts: &ModelOptions,
    algo: ConvAlgo,
    seed: u64,
) -> Result<Sequential> {
    let rng = &mut SmallRng::seed_from_u64(seed);
    let input = |default: &[usize]| opts.input.clone().unwrap_or_else(|| default.to_vec());
    let classes = |default: usize| opts.classes.unwrap_or(default);
    if opts.classes == Some(0) {
        return Err(NnError::config(
            "classes",
            "a classifier needs at least one class",
        ));
    }
    match name {
        "lenet" => Sequential::new(&input(&[1, 28, 28]))
            .push(Conv::new(
                ConvConfig::conv2d(1, 6, 5).padding(2),
                algo,
                rng,
            )?)?
            .push(Relu::new())?
            .push(MaxPool::new(2, 2)?)?
            .push(Conv::new(ConvConfig::conv2d(6, 16, 5), algo, rng)?)?
            .push(Relu::new())?
            .push(MaxPool::new(2, 2)?)?
            .push(Flatten::new())?
            .push(Linear::new(400, 120, rng)?)?
            .push(Relu::new())?
            .push(Linear::new(120, 84, rng)?)?
            .push(Relu::new())?
            .push(Linear::new(84, classes(10), rng)?),
        "resnet20" => {
            let shape = input(&[3, 32, 32]);
            let stem = ConvConfig::conv2d(in_channels(&shape)?, 16, 3)
                .padding(1)
                .no_bias();
            let mut model = Sequential::new(&shape)
                .push(Conv::new(stem, algo, rng)?)?
                .push(BatchNorm::new(16)?)?
                .push(Relu::new())?;
            let mut cin = 16;
            for (cout, stride) in [(16, 1), (32, 2), (64, 2)] {
                for i in 0..3 {
                    let s = if i == 0 { stride } else { 1 };
                    model = model.push(BasicBlock::basic_block(cin, cout, s, algo, rng)?)?;
                    cin = cout;
                }
            }
            model
                .push(GlobalAvgPool::new())?
                .push(Flatten::new())?
                .push(Linear::new(64, classes(10), rng)?)
        }
        "vgg16" => {
            let shape = input(&[3, 32, 32]);
            let mut model = Sequential::new(&shape);
            let mut cin = in_channels(&shape)?;
            for stage in [
                &[64, 64][..],
                &[128, 128],
                &[256, 256, 256],
                &[512, 512, 512],
                &[512, 512, 512],
            ] {
                for &cout in stage {
                    let conv = ConvConfig::conv2d(cin, cout, 3).padding(1);
                    model = model.push(Conv::new(conv, algo, rng)?)?.push(Relu::new())?;
                    cin = cout;
                }
                model = model.push(MaxPool::new(2, 2)?)?;
            }
            model
                .push(Flatten::new())?
                .push(Linear::new(512, 512, rng)?)?
                .push(Relu::new())?
                .push(Linear::new(512, 512, rng)?)?
                .push(Relu::new())?
                .push(Linear::new(512, classes(10), rng)?)
        }
        "vgg-a" => vgg_a(&input(&[3, 224, 224]), classes(1000), algo, rng),
        "resnet18" => torchvision_resnet(
            &input(&[3, 224, 224]),
            classes(1000),
            [2, 2, 2, 2],
            false,
            algo,
            rng,
        ),
        "resnet34" => torchvision_resnet(
            &input(&[3, 224, 224]),
            classes(1000),
            [3, 4, 6, 3],
            false,
            algo,
            rng,
        ),
        "resnet50" => torchvision_resnet(
            &input(&[3, 224, 224]),
            classes(1000),
            [3, 4, 6, 3],
            true,
            algo,
            rng,
        ),
        "c3d" => c3d(&input(&[3, 16, 112, 112]), classes(487), algo, rng),
        _ => Err(NnError::config(
            "model",
            format!("`{name}` is not a model (available: {})", MODELS.join(", ")),
        )),
    }
}

/// The channel count of a sample shape `C × spatial`.
fn in_channels(shape: &[usize]) -> Result<usize> {
    match shape {
        [c, _, ..] => Ok(*c),
        _ => Err(NnError::config(
            "input",
            format!("{shape:?} is not C × spatial"),
        )),
    }
}

/// torchvision's ResNet with `blocks` per stage, basic or bottleneck blocks.
fn torchvision_resnet(
    input: &[usize],
    classes: usize,
    blocks: [usize; 4],
    bottleneck: bool,
    algo: ConvAlgo,
    rng: &mut SmallRng,
) -> Result<Sequential> {
    let stem = ConvConfig::conv2d(in_channels(input)?, 64, 7)
        .stride(2)
        .padding(3)
        .no_bias();
    let mut model = Sequential::new(input)
        .push_named("conv1", Conv::new(stem, algo, rng)?)?
        .push_named("bn1", BatchNorm::new(64)?)?
        .push_named("relu", Relu::new())?
        .push_named("maxpool", MaxPool::nd(&[3, 3], &[2, 2], &[1, 1])?)?;
    let expansion = if bottleneck { 4 } else { 1 };
    let mut cin = 64;
    for (stage, (&n, width)) in blocks.iter().zip([64, 128, 256, 512]).enumerate() {
        let mut layer = Sequential::block();
        for i in 0..n {
            let stride = if i == 0 && stage > 0 { 2 } else { 1 };
            layer = layer.push(if bottleneck {
                Residual::bottleneck(cin, width, stride, algo, rng)?
            } else {
                Residual::torchvision_basic(cin, width, stride, algo, rng)?
            })?;
            cin = width * expansion;
        }
        model = model.push_named(&format!("layer{}", stage + 1), layer)?;
    }
    model
        .push_named("avgpool", GlobalAvgPool::new())?
        .push_named("flatten", Flatten::new())?
        .push_named("fc", Linear::new(512 * expansion, classes, rng)?)
}

/// torchvision's `vgg11`: `features` (configuration A) and `classifier`, names by index.
fn vgg_a(
    input: &[usize],
    classes: usize,
    algo: ConvAlgo,
    rng: &mut SmallRng,
) -> Result<Sequential> {
    let mut features = Sequential::block();
    let mut cin = in_channels(input)?;
    for v in [64, 0, 128, 0, 256, 256, 0, 512, 512, 0, 512, 512, 0] {
        features = if v == 0 {
            features.push(MaxPool::new(2, 2)?)?
        } else {
            let conv = ConvConfig::conv2d(cin, v, 3).padding(1);
            cin = v;
            features
                .push(Conv::new(conv, algo, rng)?)?
                .push(Relu::new())?
        };
    }
    let seed = rng.next_u64();
    let classifier = Sequential::block()
        .push(Linear::new(512 * 7 * 7, 4096, rng)?)?
        .push(Relu::new())?
        .push(Dropout::new(0.5, seed)?)?
        .push(Linear::new(4096, 4096, rng)?)?
        .push(Relu::new())?
        .push(Dropout::new(0.5, seed + 1)?)?
        .push(Linear::new(4096, classes, rng)?)?;
    Sequential::new(input)
        .push_named("features", features)?
        .push_named("avgpool", AdaptiveAvgPool::new(&[7, 7])?)?
        .push_named("flatten", Flatten::new())?
        .push_named("classifier", classifier)
}

/// C3D (Tran et al., 2015) with the names of its common PyTorch port.
fn c3d(input: &[usize], classes: usize, algo: ConvAlgo, rng: &mut SmallRng) -> Result<Sequential> {
    let mut model = Sequential::new(input);
    let mut cin = in_channels(input)?;
    // (convolutions with their widths, the pool after them, its kernel = stride, its padding)
    type Stage<'a> = (&'a [(&'a str, usize)], &'a str, [usize; 3], [usize; 3]);
    let stages: [Stage; 5] = [
        (&[("conv1", 64)], "pool1", [1, 2, 2], [0, 0, 0]),
        (&[("conv2", 128)], "pool2", [2, 2, 2], [0, 0, 0]),
        (
            &[("conv3a", 256), ("conv3b", 256)],
            "pool3",
            [2, 2, 2],
            [0, 0, 0],
        ),
        (
            &[("conv4a", 512), ("conv4b", 512)],
            "pool4",
            [2, 2, 2],
            [0, 0, 0],
        ),
        (
            &[("conv5a", 512), ("conv5b", 512)],
            "pool5",
            [2, 2, 2],
            [0, 1, 1],
        ),
    ];
    for (convs, pool, k, pad) in stages {
        for &(name, cout) in convs {
            let conv = ConvConfig::conv3d(cin, cout, 3).padding(1);
            model = model
                .push_named(name, Conv::new(conv, algo, rng)?)?
                .push_named(&format!("relu_{name}"), Relu::new())?;
            cin = cout;
        }
        model = model.push_named(pool, MaxPool::nd(&k, &k, &pad)?)?;
    }
    let seed = rng.next_u64();
    model
        .push_named("flatten", Flatten::new())?
        .push_named("fc6", Linear::new(8192, 4096, rng)?)?
        .push_named("relu6", Relu::new())?
        .push_named("dropout6", Dropout::new(0.5, seed)?)?
        .push_named("fc7", Linear::new(4096, 4096, rng)?)?
        .push_named("relu7", Relu::new())?
        .push_named("dropout7", Dropout::new(0.5, seed + 1)?)?
        .push_named("fc8", Linear::new(4096, classes, rng)?)
}
