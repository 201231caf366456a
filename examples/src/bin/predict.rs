//! Run a trained model: logits for a batch of inputs, from a checkpoint.
//!
//! `predict --model resnet18 --checkpoint r18.safetensors --input x.safetensors --output y.safetensors`
//! reads the f32 tensor `x` (`N × sample shape`) from `--input`, builds the model for that sample
//! shape (and `--classes`), loads the parameters and batch-norm statistics of the checkpoint
//! (ours, or a PyTorch `state_dict` saved with `safetensors.torch.save_file` and metadata
//! `epoch`/`step`, since the names are PyTorch's), runs it in evaluation mode and writes the
//! tensor `logits` (`N × classes`) to `--output` (a temporary file renamed into place).
//! `scripts/torchvision_check.py` uses it to compare our models with torchvision's.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use nn::{ConvAlgo, ModelOptions, Sgd, Tensor, build_with, checkpoint};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

/// Run a model from a checkpoint on a batch of inputs.
#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    /// Model name (as for `train`).
    #[arg(long)]
    model: String,
    /// Checkpoint with the model's parameters and batch-norm statistics.
    #[arg(long)]
    checkpoint: PathBuf,
    /// safetensors file holding the f32 tensor `x`, `N × sample shape`.
    #[arg(long)]
    input: PathBuf,
    /// Where to write the tensor `logits`.
    #[arg(long)]
    output: PathBuf,
    /// Classes of the classifier (default: the model's own).
    #[arg(long)]
    classes: Option<usize>,
    /// Convolution algorithm.
    #[arg(long, default_value = "auto")]
    conv_algo: ConvAlgo,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let bytes = std::fs::read(&args.input).map_err(|e| format!("{}: {e}", args.input.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| format!("{}: not a safetensors file: {e}", args.input.display()))?;
    let t = st
        .tensor("x")
        .map_err(|_| format!("{}: no tensor `x`", args.input.display()))?;
    if t.dtype() != Dtype::F32 || t.shape().len() < 2 {
        return Err(format!(
            "{}: `x` is {:?} {:?}, expected F32 N × sample shape",
            args.input.display(),
            t.dtype(),
            t.shape()
        )
        .into());
    }
    let data: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let x = Tensor::new(t.shape(), data)?;
    let opts = ModelOptions {
        classes: args.classes,
        input: Some(t.shape()[1..].to_vec()),
    };
    let mut model = build_with(&args.model, &opts, args.conv_algo, 0)?;
    let mut opt = Sgd::new(0.0, 0.0, 0.0)?;
    checkpoint::load(&args.checkpoint, &mut model, &mut opt)?;
    let y = model.forward(x, false)?;
    let out: Vec<u8> = y.data().iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = TensorView::new(Dtype::F32, y.shape().to_vec(), &out)?;
    let tmp = args.output.with_extension("tmp");
    safetensors::serialize_to_file([("logits", view)], None, &tmp)?;
    std::fs::rename(&tmp, &args.output).map_err(|e| format!("{}: {e}", args.output.display()))?;
    Ok(())
}
