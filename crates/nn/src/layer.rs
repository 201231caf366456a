//! The [`Layer`] trait and trainable [`Parameter`]s.

use std::any::Any;

use rand::Rng;
use rand::rngs::SmallRng;

use crate::error::Result;
use crate::tensor::Tensor;

/// A trainable tensor and its gradient (same shape).
#[derive(Debug, Clone, PartialEq)]
pub struct Parameter {
    /// The current value.
    pub value: Tensor,
    /// The gradient of the loss with respect to `value`, written by the last `backward`.
    pub grad: Tensor,
}

impl Parameter {
    /// A parameter holding `value`, with a zero gradient.
    pub fn new(value: Tensor) -> Self {
        let grad = Tensor::zeros(value.shape());
        Parameter { value, grad }
    }

    /// PyTorch's default initialisation of `Conv*d` and `Linear` weights and biases: uniform in
    /// `±1/√fan_in` (kaiming-uniform with `a = √5` for weights reduces to the same bound).
    pub fn uniform_fan_in(shape: &[usize], fan_in: usize, rng: &mut SmallRng) -> Self {
        let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
        let n = shape.iter().product();
        let data = (0..n).map(|_| rng.random_range(-bound..bound)).collect();
        Parameter::new(Tensor::new(shape, data).expect("length is the product of the shape"))
    }
}

/// One layer of a model: forward, backward, and its parameters.
///
/// `items` with their names prefixed by `name.`: the PyTorch path of a child's parameters.
pub(crate) fn prefixed<'n, T: 'n>(
    name: &'n str,
    items: Vec<(String, T)>,
) -> impl Iterator<Item = (String, T)> + 'n {
    items
        .into_iter()
        .map(move |(n, x)| (format!("{name}.{n}"), x))
}

/// The state of a layer's random generator: the seed it was built with and how many draws
/// (dropout masks) it has made. The next draw depends on nothing else, so a checkpoint that
/// keeps it resumes the masks an uninterrupted run would draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RngState {
    /// The generator's seed.
    pub seed: u64,
    /// Draws made so far.
    pub draws: u64,
}

/// The callback of [`Layer::backward_notify`]: a parameter's name and the parameter, once its
/// gradient is final.
pub type GradReady<'a> = dyn FnMut(&str, &Parameter) + 'a;

/// Access to a layer's concrete type, implemented for every type: it lets a model transform
/// (e.g. `dist`'s channel parallelism) find the convolutions of a model through
/// [`downcast_ref`](trait.Layer.html#method.downcast_ref).
pub trait AsAny: Any {
    /// `self` as [`Any`].
    fn as_any(&self) -> &dyn Any;
    /// A boxed `self` as a boxed [`Any`], to take a layer of a known type out of a model.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Any> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Ownership carries the memory contract: `forward` takes its input by value, and a layer keeps
/// only what its backward needs (a convolution keeps `x`, a ReLU a mask), so nothing is copied.
/// In evaluation mode (`train == false`) no state is kept.
pub trait Layer: AsAny + Send {
    /// A short description, e.g. `Conv2d(1→6, 5×5, pad 2)`.
    fn describe(&self) -> String;

    /// `y = f(x)`. With `train`, keeps what `backward` needs.
    fn forward(&mut self, x: Tensor, train: bool) -> Result<Tensor>;

    /// From `dy = ∂loss/∂y`, writes the gradients of the parameters (overwriting them) and returns
    /// `∂loss/∂x` when `need_dx` (the first layer of a model does not need it).
    fn backward(&mut self, dy: Tensor, need_dx: bool) -> Result<Option<Tensor>>;

    /// [`backward`](Layer::backward), reporting every parameter to `ready` once its gradient is
    /// final, with its name relative to this layer. A container reports each child's
    /// parameters as soon as that child is done, so a caller can ship the last layers'
    /// gradients while the first layers still back-propagate (data parallelism overlapping
    /// communication with computation). The default reports all parameters at the end.
    fn backward_notify(
        &mut self,
        dy: Tensor,
        need_dx: bool,
        ready: &mut GradReady,
    ) -> Result<Option<Tensor>> {
        let dx = self.backward(dy, need_dx)?;
        for (name, p) in self.params() {
            ready(&name, p);
        }
        Ok(dx)
    }

    /// The parameters with their PyTorch names (`weight`, `bias`), in a fixed order.
    fn params(&self) -> Vec<(String, &Parameter)> {
        Vec::new()
    }

    /// The same, mutable.
    fn params_mut(&mut self) -> Vec<(String, &mut Parameter)> {
        Vec::new()
    }

    /// Non-trainable state saved in checkpoints (batch norm's running statistics), with PyTorch's
    /// names, in a fixed order.
    fn buffers(&self) -> Vec<(String, &Tensor)> {
        Vec::new()
    }

    /// The same, mutable.
    fn buffers_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        Vec::new()
    }

    /// The state of the layer's random generators (dropout's), with names relative to this
    /// layer, in a fixed order; checkpoints keep it.
    fn rng_states(&self) -> Vec<(String, RngState)> {
        Vec::new()
    }

    /// The same, mutable.
    fn rng_states_mut(&mut self) -> Vec<(String, &mut RngState)> {
        Vec::new()
    }

    /// The shape of one output sample for one input sample of shape `input` (no batch axis).
    fn output_shape(&self, input: &[usize]) -> Result<Vec<usize>>;

    /// Starts (`on`, from zero) or stops timing the layers nested in this one
    /// ([`crate::Sequential::set_profiling`]). The default, for a layer with none, does nothing.
    fn set_profiling(&mut self, _on: bool) {}

    /// The time spent in the layers nested in this one while profiling, with names relative to
    /// this layer ([`crate::Sequential::profile`]); empty by default.
    fn profile(&self) -> Vec<crate::model::LayerProfile> {
        Vec::new()
    }
}

impl dyn Layer {
    /// The layer as its concrete type `T`, if it is one: `layer.downcast_ref::<Conv>()`.
    pub fn downcast_ref<T: Layer>(&self) -> Option<&T> {
        self.as_any().downcast_ref()
    }
}
