//! [`Sequential`] models and the named architectures the `train` example offers.

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::error::{NnError, Result};
use crate::layer::{Layer, Parameter};
use crate::layers::{
    BasicBlock, BatchNorm, Conv, ConvAlgo, ConvConfig, Flatten, GlobalAvgPool, Linear, MaxPool,
    Relu,
};
use crate::tensor::Tensor;

/// Layers applied in order. Parameter names follow PyTorch's `nn.Sequential`
/// (`"{index}.weight"`), so checkpoints line up with a PyTorch model of the same definition.
pub struct Sequential {
    layers: Vec<Box<dyn Layer>>,
    input_shape: Vec<usize>,
}

impl Sequential {
    /// A model taking samples of `input_shape` (no batch axis), e.g. `[1, 28, 28]`.
    pub fn new(input_shape: &[usize]) -> Self {
        Sequential {
            layers: Vec::new(),
            input_shape: input_shape.to_vec(),
        }
    }

    /// Appends a layer, checking that it accepts the current output shape.
    pub fn push(mut self, layer: impl Layer + 'static) -> Result<Self> {
        let shape = self.output_shape()?;
        layer.output_shape(&shape)?;
        self.layers.push(Box::new(layer));
        Ok(self)
    }

    /// The shape of one input sample.
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    /// The shape of one output sample.
    pub fn output_shape(&self) -> Result<Vec<usize>> {
        self.layers
            .iter()
            .try_fold(self.input_shape.clone(), |s, l| l.output_shape(&s))
    }

    /// The layers.
    pub fn layers(&self) -> &[Box<dyn Layer>] {
        &self.layers
    }

    /// Runs every layer on `x` (`N × input_shape`); with `train`, layers keep what backward needs.
    pub fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        if x.shape().len() != self.input_shape.len() + 1 || x.shape()[1..] != self.input_shape[..] {
            let want = format!("N × {:?}", self.input_shape);
            return Err(NnError::shape("Sequential", "x", x.shape(), want));
        }
        self.layers
            .iter_mut()
            .try_fold(x, |x, l| l.forward(x, train))
    }

    /// Back-propagates `dy` (the gradient of the loss with respect to the output) through every
    /// layer, writing every parameter's gradient. The input gradient is not computed.
    pub fn backward(&mut self, dy: Tensor) -> Result<()> {
        let mut d = Some(dy);
        for (i, layer) in self.layers.iter_mut().enumerate().rev() {
            let dy = d.take().expect("every layer but the first returns dx");
            d = layer.backward(dy, i > 0)?;
        }
        Ok(())
    }

    /// Every parameter with its PyTorch name, in a fixed order.
    pub fn params(&self) -> Vec<(String, &Parameter)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                l.params()
                    .into_iter()
                    .map(move |(n, p)| (format!("{i}.{n}"), p))
            })
            .collect()
    }

    /// The same, mutable.
    pub fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        self.layers
            .iter_mut()
            .enumerate()
            .flat_map(|(i, l)| {
                l.params_mut()
                    .into_iter()
                    .map(move |(n, p)| (format!("{i}.{n}"), p))
            })
            .collect()
    }

    /// Every non-trainable state tensor (batch norm's running statistics) with its PyTorch name.
    pub fn buffers(&self) -> Vec<(String, &Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| {
                l.buffers()
                    .into_iter()
                    .map(move |(n, b)| (format!("{i}.{n}"), b))
            })
            .collect()
    }

    /// The same, mutable.
    pub fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        self.layers
            .iter_mut()
            .enumerate()
            .flat_map(|(i, l)| {
                l.buffers_mut()
                    .into_iter()
                    .map(move |(n, b)| (format!("{i}.{n}"), b))
            })
            .collect()
    }

    /// Number of trainable values.
    pub fn num_params(&self) -> usize {
        self.params().iter().map(|(_, p)| p.value.len()).sum()
    }

    /// One line per layer.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let mut shape = self.input_shape.clone();
        s.push_str(&format!("input {shape:?}\n"));
        for (i, l) in self.layers.iter().enumerate() {
            shape = l.output_shape(&shape).unwrap_or_default();
            s.push_str(&format!("{i:>3} {:<50} → {shape:?}\n", l.describe()));
        }
        s
    }
}

/// The models `build` knows.
pub const MODELS: &[&str] = &["lenet", "resnet20", "vgg16"];

/// Builds model `name` with weights drawn from `seed` and convolutions run by `algo`.
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
pub fn build(name: &str, algo: ConvAlgo, seed: u64) -> Result<Sequential> {
    let rng = &mut SmallRng::seed_from_u64(seed);
    match name {
        "lenet" => Sequential::new(&[1, 28, 28])
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
            .push(Linear::new(84, 10, rng)?),
        "resnet20" => {
            let stem = ConvConfig::conv2d(3, 16, 3).padding(1).no_bias();
            let mut model = Sequential::new(&[3, 32, 32])
                .push(Conv::new(stem, algo, rng)?)?
                .push(BatchNorm::new(16)?)?
                .push(Relu::new())?;
            let mut cin = 16;
            for (cout, stride) in [(16, 1), (32, 2), (64, 2)] {
                for i in 0..3 {
                    let s = if i == 0 { stride } else { 1 };
                    model = model.push(BasicBlock::new(cin, cout, s, algo, rng)?)?;
                    cin = cout;
                }
            }
            model
                .push(GlobalAvgPool::new())?
                .push(Flatten::new())?
                .push(Linear::new(64, 10, rng)?)
        }
        "vgg16" => {
            let mut model = Sequential::new(&[3, 32, 32]);
            let mut cin = 3;
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
                .push(Linear::new(512, 10, rng)?)
        }
        _ => Err(NnError::config(
            "model",
            format!(
                "`{name}` is not built yet (available: {})",
                MODELS.join(", ")
            ),
        )),
    }
}
