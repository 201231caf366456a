//! [`Residual`] blocks (ResNet's basic and bottleneck blocks) and [`GlobalAvgPool`].

use rand::rngs::SmallRng;

use crate::error::{NnError, Result};
use crate::layer::{Layer, Parameter, RngState, prefixed};
use crate::layers::{BatchNorm, Conv, ConvAlgo, ConvConfig, Relu};
use crate::model::Sequential;
use crate::tensor::Tensor;

/// `relu(body(x) + shortcut(x))`, where the shortcut is the identity or a projection (ResNet's
/// 1×1 convolution + batch norm, "option B"). The body's layers are named at the block's level
/// (`conv1.weight`), the shortcut's under its own name (`downsample.0.weight`), as in PyTorch.
///
/// The constructors build the blocks of the models `nn` offers: [`Residual::basic_block`] (the
/// anchors' CIFAR block), [`Residual::torchvision_basic`] and [`Residual::bottleneck`]
/// (torchvision's ResNet-18/34 and ResNet-50 blocks).
pub struct Residual {
    body: Sequential,
    shortcut: Option<(String, Sequential)>,
    out: Relu,
    desc: String,
}

/// The anchors' CIFAR ResNet block (`anchors/conv/train_bench.py`).
pub type BasicBlock = Residual;

/// `3×3` convolution, no bias, padding 1.
fn conv3x3(cin: usize, cout: usize, stride: usize) -> ConvConfig {
    ConvConfig::conv2d(cin, cout, 3)
        .stride(stride)
        .padding(1)
        .no_bias()
}

/// `1×1` convolution, no bias.
fn conv1x1(cin: usize, cout: usize, stride: usize) -> ConvConfig {
    ConvConfig::conv2d(cin, cout, 1).stride(stride).no_bias()
}

/// The projection shortcut `in_channels → out_channels` with `stride`, when one is needed.
fn projection(
    in_channels: usize,
    out_channels: usize,
    stride: usize,
    algo: ConvAlgo,
    rng: &mut SmallRng,
) -> Result<Option<Sequential>> {
    if stride == 1 && in_channels == out_channels {
        return Ok(None);
    }
    let conv = Conv::new(conv1x1(in_channels, out_channels, stride), algo, rng)?;
    Ok(Some(
        Sequential::block()
            .push(conv)?
            .push(BatchNorm::new(out_channels)?)?,
    ))
}

/// The body of a basic block, `bn2(conv2(relu(bn1(conv1(x)))))` with 3×3 convolutions (the
/// first with `stride`), under `names` (conv, norm, relu, conv, norm).
fn basic_body(
    names: [&str; 5],
    in_channels: usize,
    out_channels: usize,
    stride: usize,
    algo: ConvAlgo,
    rng: &mut SmallRng,
) -> Result<Sequential> {
    let [c1, b1, r1, c2, b2] = names;
    Sequential::block()
        .push_named(
            c1,
            Conv::new(conv3x3(in_channels, out_channels, stride), algo, rng)?,
        )?
        .push_named(b1, BatchNorm::new(out_channels)?)?
        .push_named(r1, Relu::new())?
        .push_named(
            c2,
            Conv::new(conv3x3(out_channels, out_channels, 1), algo, rng)?,
        )?
        .push_named(b2, BatchNorm::new(out_channels)?)
}

impl Residual {
    /// `relu(body(x) + shortcut(x))`; `shortcut` is `(name, layers)` or `None` for the identity.
    /// `body` and the shortcut must map an input to outputs of the same shape (checked when run).
    pub fn new(body: Sequential, shortcut: Option<(&str, Sequential)>) -> Self {
        let desc = match &shortcut {
            Some((name, s)) => format!("Residual({} + {name}: {})", body.describe(), s.describe()),
            None => format!("Residual({} + identity)", body.describe()),
        };
        Residual {
            body,
            shortcut: shortcut.map(|(n, s)| (n.to_string(), s)),
            out: Relu::new(),
            desc,
        }
    }

    /// The block with its body and shortcut replaced by `f(None, body)` and
    /// `f(Some(name), shortcut)`, keeping its description and the shortcut's name: for model
    /// transforms that rewrite the layers inside a block (`dist`'s synchronised batch norm and
    /// spatial parallelism). The first error of `f` is returned.
    pub fn try_map<E>(
        self,
        mut f: impl FnMut(Option<&str>, Sequential) -> std::result::Result<Sequential, E>,
    ) -> std::result::Result<Self, E> {
        let body = f(None, self.body)?;
        let shortcut = match self.shortcut {
            Some((name, s)) => {
                let s = f(Some(&name), s)?;
                Some((name, s))
            }
            None => None,
        };
        Ok(Residual {
            body,
            shortcut,
            out: Relu::new(),
            desc: self.desc,
        })
    }

    /// The main path.
    pub fn body(&self) -> &Sequential {
        &self.body
    }

    /// The shortcut's name and layers; `None` for the identity.
    pub fn shortcut(&self) -> Option<(&str, &Sequential)> {
        self.shortcut.as_ref().map(|(n, s)| (n.as_str(), s))
    }

    /// The anchors' CIFAR block: `relu(b2(c2(relu(b1(c1(x))))) + short(x))` with 3×3
    /// convolutions (the first with `stride`), no convolution bias, and a 1×1 convolution +
    /// batch norm as the shortcut when the stride or the channel count changes. Parameter names
    /// are the anchors' (`c1`, `b1`, `c2`, `b2`, `short.0`, `short.1`). Weights are drawn from
    /// `rng` in the order shortcut, `c1`, `c2`.
    pub fn basic_block(
        in_channels: usize,
        out_channels: usize,
        stride: usize,
        algo: ConvAlgo,
        rng: &mut SmallRng,
    ) -> Result<Self> {
        let short = projection(in_channels, out_channels, stride, algo, rng)?;
        let names = ["c1", "b1", "r1", "c2", "b2"];
        let body = basic_body(names, in_channels, out_channels, stride, algo, rng)?;
        let mut block = Residual::new(body, short.map(|s| ("short", s)));
        block.desc = format!("BasicBlock({in_channels}→{out_channels}, stride {stride})");
        Ok(block)
    }

    /// torchvision's `BasicBlock` (ResNet-18/34): the same computation as
    /// [`basic_block`](Residual::basic_block) with torchvision's names (`conv1`, `bn1`, `conv2`,
    /// `bn2`, `downsample.0`, `downsample.1`).
    pub fn torchvision_basic(
        in_channels: usize,
        out_channels: usize,
        stride: usize,
        algo: ConvAlgo,
        rng: &mut SmallRng,
    ) -> Result<Self> {
        let names = ["conv1", "bn1", "relu", "conv2", "bn2"];
        let body = basic_body(names, in_channels, out_channels, stride, algo, rng)?;
        let short = projection(in_channels, out_channels, stride, algo, rng)?;
        let mut block = Residual::new(body, short.map(|s| ("downsample", s)));
        block.desc = format!("BasicBlock({in_channels}→{out_channels}, stride {stride})");
        Ok(block)
    }

    /// torchvision's `Bottleneck` (ResNet-50, "v1.5": the stride on the 3×3 convolution):
    /// 1×1 `in_channels → width`, 3×3 `width → width` with `stride`, 1×1 `width → 4·width`,
    /// each followed by batch norm (ReLU between), and a projection shortcut when the stride or
    /// the channel count changes. Names: `conv1..3`, `bn1..3`, `downsample.0/1`.
    pub fn bottleneck(
        in_channels: usize,
        width: usize,
        stride: usize,
        algo: ConvAlgo,
        rng: &mut SmallRng,
    ) -> Result<Self> {
        let out_channels = 4 * width;
        let body = Sequential::block()
            .push_named(
                "conv1",
                Conv::new(conv1x1(in_channels, width, 1), algo, rng)?,
            )?
            .push_named("bn1", BatchNorm::new(width)?)?
            .push_named("relu1", Relu::new())?
            .push_named(
                "conv2",
                Conv::new(conv3x3(width, width, stride), algo, rng)?,
            )?
            .push_named("bn2", BatchNorm::new(width)?)?
            .push_named("relu2", Relu::new())?
            .push_named(
                "conv3",
                Conv::new(conv1x1(width, out_channels, 1), algo, rng)?,
            )?
            .push_named("bn3", BatchNorm::new(out_channels)?)?;
        let short = projection(in_channels, out_channels, stride, algo, rng)?;
        let mut block = Residual::new(body, short.map(|s| ("downsample", s)));
        block.desc = format!("Bottleneck({in_channels}→{width}→{out_channels}, stride {stride})");
        Ok(block)
    }
}

/// `a += b`, element by element (`a` and `b` of one shape).
fn add_into(a: &mut Tensor, b: &Tensor) -> Result<()> {
    let v = core_blas::vector::Vector::global()?;
    crate::par::runs_ref(a.data_mut(), b.data(), |a, b| Ok(v.add(a, b)?))
}

impl Layer for Residual {
    /// The block's name and, once `Auto` has measured, what it chose for each convolution of
    /// the body (and the shortcut): `BasicBlock(16→32, stride 2; auto→winograd, auto→convgemm;
    /// shortcut auto→convgemm)`.
    fn describe(&self) -> String {
        let labels = |s: &Sequential| -> Vec<String> {
            s.layers()
                .iter()
                .filter_map(|l| l.downcast_ref::<Conv>().map(Conv::algo_label))
                .collect()
        };
        let body = labels(&self.body);
        let shortcut = self
            .shortcut
            .as_ref()
            .map(|(_, s)| labels(s))
            .unwrap_or_default();
        if !body.iter().chain(&shortcut).any(|l| l.contains('→')) {
            return self.desc.clone();
        }
        let mut d = self.desc.trim_end_matches(')').to_string();
        d.push_str(&format!("; {}", body.join(", ")));
        if !shortcut.is_empty() {
            d.push_str(&format!("; shortcut {}", shortcut.join(", ")));
        }
        d + ")"
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        let skip = match &mut self.shortcut {
            Some((_, s)) => s.forward(x.clone(), train)?,
            None => x.clone(),
        };
        let h = self.body.forward(x, train)?;
        if h.shape() != skip.shape() {
            return Err(NnError::shape(
                self.describe(),
                "x",
                skip.shape(),
                format!("a shortcut of shape {:?}", h.shape()),
            ));
        }
        self.out.forward_sum(h, &skip, train)
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        // The gradient reaches both paths: the ReLU's backward writes it twice in one pass
        // (once when the identity's copy is not needed).
        if self.shortcut.is_none() && !need_dx {
            let d = self
                .out
                .backward(dy, true)?
                .ok_or_else(|| NnError::NoForward {
                    layer: self.desc.clone(),
                })?;
            Layer::backward(&mut self.body, d, false)?;
            return Ok(None);
        }
        let (d, d2) = self.out.backward_fork(dy)?;
        let skip = match &mut self.shortcut {
            Some((_, s)) => Layer::backward(s, d2, need_dx)?,
            None => Some(d2),
        };
        let main = Layer::backward(&mut self.body, d, need_dx)?;
        Ok(match (main, skip) {
            (Some(mut a), Some(b)) => {
                add_into(&mut a, &b)?;
                Some(a)
            }
            _ => None,
        })
    }

    fn params(&self) -> Vec<(String, &Parameter)> {
        let mut v = self.body.params();
        if let Some((name, s)) = &self.shortcut {
            v.extend(prefixed(name, s.params()));
        }
        v
    }

    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        let mut v = self.body.params_mut();
        if let Some((name, s)) = &mut self.shortcut {
            v.extend(prefixed(name, s.params_mut()));
        }
        v
    }

    fn buffers(&self) -> Vec<(String, &Tensor)> {
        let mut v = self.body.buffers();
        if let Some((name, s)) = &self.shortcut {
            v.extend(prefixed(name, s.buffers()));
        }
        v
    }

    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = self.body.buffers_mut();
        if let Some((name, s)) = &mut self.shortcut {
            v.extend(prefixed(name, s.buffers_mut()));
        }
        v
    }

    fn set_profiling(&mut self, on: bool) {
        self.body.set_profiling(on);
        if let Some((_, s)) = &mut self.shortcut {
            s.set_profiling(on);
        }
    }

    fn profile(&self) -> Vec<crate::model::LayerProfile> {
        let mut v = self.body.profile();
        if let Some((name, s)) = &self.shortcut {
            v.extend(s.profile().into_iter().map(|p| crate::model::LayerProfile {
                name: format!("{name}.{}", p.name),
                ..p
            }));
        }
        v
    }

    fn rng_states(&self) -> Vec<(String, RngState)> {
        let mut v = self.body.rng_states();
        if let Some((name, s)) = &self.shortcut {
            v.extend(prefixed(name, s.rng_states()));
        }
        v
    }

    fn rng_states_mut(&mut self) -> Vec<(String, &mut RngState)> {
        let mut v = self.body.rng_states_mut();
        if let Some((name, s)) = &mut self.shortcut {
            v.extend(prefixed(name, s.rng_states_mut()));
        }
        v
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        let main = Layer::output_shape(&self.body, input)?;
        let skip = match &self.shortcut {
            Some((_, s)) => Layer::output_shape(s, input)?,
            None => input.to_vec(),
        };
        if main != skip {
            return Err(NnError::shape(
                self.describe(),
                "input",
                input,
                format!("a body output {main:?} equal to the shortcut's {skip:?}"),
            ));
        }
        Ok(main)
    }
}

/// Averages every channel over its spatial positions: `N × C × spatial` → `N × C × 1 × …`
/// (PyTorch's `AdaptiveAvgPool{1,2,3}d(1)`).
#[derive(Debug, Default)]
pub struct GlobalAvgPool {
    shape: Option<Vec<usize>>,
}

impl GlobalAvgPool {
    /// A global average pooling layer.
    pub fn new() -> Self {
        GlobalAvgPool::default()
    }
}

impl Layer for GlobalAvgPool {
    fn describe(&self) -> String {
        "GlobalAvgPool".into()
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        let shape = x.shape().to_vec();
        if shape.len() < 3 {
            return Err(NnError::shape(
                self.describe(),
                "x",
                &shape,
                "N × C × spatial",
            ));
        }
        let plane: usize = shape[2..].iter().product();
        let y = x
            .data()
            .chunks_exact(plane)
            .map(|p| (p.iter().map(|&v| v as f64).sum::<f64>() / plane as f64) as f32)
            .collect();
        let mut yshape = shape[..2].to_vec();
        yshape.extend(std::iter::repeat_n(1, shape.len() - 2));
        if train {
            self.shape = Some(shape);
        }
        Tensor::new(&yshape, y)
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let shape = self.shape.take().ok_or_else(|| NnError::no_forward(self))?;
        if dy.len() != shape[0] * shape[1] {
            return Err(NnError::shape(
                self.describe(),
                "dy",
                dy.shape(),
                format!("{} values", shape[0] * shape[1]),
            ));
        }
        if !need_dx {
            return Ok(None);
        }
        let plane: usize = shape[2..].iter().product();
        let dx = dy
            .data()
            .iter()
            .flat_map(|&g| std::iter::repeat_n(g / plane as f32, plane))
            .collect();
        Ok(Some(Tensor::new(&shape, dx)?))
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        if input.len() < 2 {
            return Err(NnError::shape(
                self.describe(),
                "input",
                input,
                "C × spatial",
            ));
        }
        Ok([&input[..1], &vec![1; input.len() - 1][..]].concat())
    }
}
