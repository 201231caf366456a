//! [`BasicBlock`] (ResNet's two-convolution residual block) and [`GlobalAvgPool`].

use rand::rngs::SmallRng;

use crate::error::{NnError, Result};
use crate::layer::{Layer, Parameter};
use crate::layers::{BatchNorm, Conv, ConvAlgo, ConvConfig, Relu};
use crate::tensor::Tensor;

/// `relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))` with 3×3 convolutions (the first with
/// `stride`), no convolution bias, and a 1×1 convolution + batch norm as the shortcut when the
/// stride or the channel count changes (ResNet "option B"). Parameter names follow the anchors'
/// PyTorch `Block` (`c1`, `b1`, `c2`, `b2`, `short.0`, `short.1`).
pub struct BasicBlock {
    c1: Conv,
    b1: BatchNorm,
    r1: Relu,
    c2: Conv,
    b2: BatchNorm,
    short: Option<(Conv, BatchNorm)>,
    out: Relu,
    desc: String,
}

const PARAMS: [&str; 9] = [
    "c1.weight",
    "b1.weight",
    "b1.bias",
    "c2.weight",
    "b2.weight",
    "b2.bias",
    "short.0.weight",
    "short.1.weight",
    "short.1.bias",
];
const BUFFERS: [&str; 6] = [
    "b1.running_mean",
    "b1.running_var",
    "b2.running_mean",
    "b2.running_var",
    "short.1.running_mean",
    "short.1.running_var",
];

impl BasicBlock {
    /// A block `in_channels → out_channels` whose first convolution has `stride`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        stride: usize,
        algo: ConvAlgo,
        rng: &mut SmallRng,
    ) -> Result<Self> {
        let conv3 = |cin, s| {
            ConvConfig::conv2d(cin, out_channels, 3)
                .stride(s)
                .padding(1)
                .no_bias()
        };
        let short = if stride != 1 || in_channels != out_channels {
            let cfg = ConvConfig::conv2d(in_channels, out_channels, 1)
                .stride(stride)
                .no_bias();
            Some((Conv::new(cfg, algo, rng)?, BatchNorm::new(out_channels)?))
        } else {
            None
        };
        Ok(BasicBlock {
            c1: Conv::new(conv3(in_channels, stride), algo, rng)?,
            b1: BatchNorm::new(out_channels)?,
            r1: Relu::new(),
            c2: Conv::new(conv3(out_channels, 1), algo, rng)?,
            b2: BatchNorm::new(out_channels)?,
            short,
            out: Relu::new(),
            desc: format!("BasicBlock({in_channels}→{out_channels}, stride {stride})"),
        })
    }

    fn parts(&self) -> Vec<&dyn Layer> {
        let mut v: Vec<&dyn Layer> = vec![&self.c1, &self.b1, &self.c2, &self.b2];
        if let Some((c, b)) = &self.short {
            v.push(c);
            v.push(b);
        }
        v
    }
}

impl Layer for BasicBlock {
    fn describe(&self) -> String {
        self.desc.clone()
    }

    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor> {
        let skip = match &mut self.short {
            Some((c, b)) => {
                let s = c.forward(x.clone(), train)?;
                b.forward(s, train)?
            }
            None => x.clone(),
        };
        let h = self.c1.forward(x, train)?;
        let h = self.r1.forward(self.b1.forward(h, train)?, train)?;
        let mut h = self.b2.forward(self.c2.forward(h, train)?, train)?;
        if h.shape() != skip.shape() {
            return Err(NnError::shape(
                self.describe(),
                "x",
                skip.shape(),
                format!("a shortcut of shape {:?}", h.shape()),
            ));
        }
        h.data_mut()
            .iter_mut()
            .zip(skip.data())
            .for_each(|(a, b)| *a += b);
        self.out.forward(h, train)
    }

    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>> {
        let d = self.out.backward(dy, true)?.expect("requested");
        let layer = self.describe();
        let missing = || NnError::NoForward {
            layer: layer.clone(),
        };
        let d2 = self.b2.backward(d.clone(), true)?.ok_or_else(missing)?;
        let d2 = self.c2.backward(d2, true)?.ok_or_else(missing)?;
        let d1 = self.r1.backward(d2, true)?.ok_or_else(missing)?;
        let d1 = self.b1.backward(d1, true)?.ok_or_else(missing)?;
        let main = self.c1.backward(d1, need_dx)?;
        let skip = match &mut self.short {
            Some((c, b)) => {
                let ds = b.backward(d, true)?.ok_or_else(missing)?;
                c.backward(ds, need_dx)?
            }
            None => need_dx.then_some(d),
        };
        Ok(match (main, skip) {
            (Some(mut a), Some(b)) => {
                a.data_mut()
                    .iter_mut()
                    .zip(b.data())
                    .for_each(|(x, y)| *x += y);
                Some(a)
            }
            _ => None,
        })
    }

    fn params(&self) -> Vec<(&'static str, &Parameter)> {
        let ps = self
            .parts()
            .into_iter()
            .flat_map(|l| l.params().into_iter().map(|(_, p)| p))
            .collect::<Vec<_>>();
        PARAMS.into_iter().zip(ps).collect()
    }

    fn params_mut(&mut self) -> Vec<(&'static str, &mut Parameter)> {
        // Field by field, in the order of `parts`, so the borrows stay disjoint.
        let mut v: Vec<&mut Parameter> = Vec::new();
        v.extend(self.c1.params_mut().into_iter().map(|(_, p)| p));
        v.extend(self.b1.params_mut().into_iter().map(|(_, p)| p));
        v.extend(self.c2.params_mut().into_iter().map(|(_, p)| p));
        v.extend(self.b2.params_mut().into_iter().map(|(_, p)| p));
        if let Some((c, b)) = &mut self.short {
            v.extend(c.params_mut().into_iter().map(|(_, p)| p));
            v.extend(b.params_mut().into_iter().map(|(_, p)| p));
        }
        PARAMS.into_iter().zip(v).collect()
    }

    fn buffers(&self) -> Vec<(&'static str, &Tensor)> {
        let bs = self
            .parts()
            .into_iter()
            .flat_map(|l| l.buffers().into_iter().map(|(_, b)| b))
            .collect::<Vec<_>>();
        BUFFERS.into_iter().zip(bs).collect()
    }

    fn buffers_mut(&mut self) -> Vec<(&'static str, &mut Tensor)> {
        let mut v: Vec<&mut Tensor> = Vec::new();
        v.extend(self.b1.buffers_mut().into_iter().map(|(_, b)| b));
        v.extend(self.b2.buffers_mut().into_iter().map(|(_, b)| b));
        if let Some((_, b)) = &mut self.short {
            v.extend(b.buffers_mut().into_iter().map(|(_, b)| b));
        }
        BUFFERS.into_iter().zip(v).collect()
    }

    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>> {
        let s = self.c1.output_shape(input)?;
        self.c2.output_shape(&s)
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
        let shape = self.shape.take().ok_or_else(|| NnError::NoForward {
            layer: self.describe(),
        })?;
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
