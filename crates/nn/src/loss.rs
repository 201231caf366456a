//! Softmax cross-entropy, the classification loss.

use crate::error::{NnError, Result};
use crate::tensor::Tensor;

/// The mean softmax cross-entropy of `logits` (`N × classes`) against `labels` (N class
/// indices), and its gradient with respect to the logits (PyTorch's `CrossEntropyLoss` with
/// mean reduction). Computed with the max subtracted, in f64 per sample.
pub fn cross_entropy(logits: &Tensor, labels: &[usize]) -> Result<(f32, Tensor)> {
    let shape = logits.shape();
    if shape.len() != 2 || shape[0] != labels.len() || shape[0] == 0 || shape[1] == 0 {
        let want = format!("[{}, classes ≥ 1] (one row per label)", labels.len());
        return Err(NnError::shape("cross_entropy", "logits", shape, want));
    }
    let (n, k) = (shape[0], shape[1]);
    let mut grad = vec![0.0f32; n * k];
    let mut total = 0f64;
    for (i, (row, g)) in logits
        .data()
        .chunks_exact(k)
        .zip(grad.chunks_exact_mut(k))
        .enumerate()
    {
        let label = labels[i];
        if label >= k {
            return Err(NnError::Label {
                index: i,
                label,
                classes: k,
            });
        }
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
        total += sum.ln() + max - row[label] as f64;
        for (j, (gj, &v)) in g.iter_mut().zip(row).enumerate() {
            let p = (v as f64 - max).exp() / sum;
            *gj = ((p - if j == label { 1.0 } else { 0.0 }) / n as f64) as f32;
        }
    }
    Ok(((total / n as f64) as f32, Tensor::new(&[n, k], grad)?))
}

/// How many rows of `logits` have their largest value at the label (ties: the first maximum).
pub fn correct(logits: &Tensor, labels: &[usize]) -> usize {
    let k = logits.shape().get(1).copied().unwrap_or(1).max(1);
    logits
        .data()
        .chunks_exact(k)
        .zip(labels)
        .filter(|(row, l)| {
            let best = row
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (j, &v)| if v > b.1 { (j, v) } else { b },
                );
            best.0 == **l
        })
        .count()
}
