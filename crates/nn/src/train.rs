//! The training loop: shuffled mini-batches, forward, cross-entropy, backward, SGD step, and an
//! evaluation on the test split after every epoch.

use std::time::{Duration, Instant};

use crate::checkpoint::TrainState;
use crate::data::{Augment, Dataset};
use crate::error::{NnError, Result};
use crate::loss::{correct, cross_entropy};
use crate::model::Sequential;
use crate::optim::{LrSchedule, Sgd};
use crate::tensor::Tensor;

/// How long to train.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainConfig {
    /// Epochs to run (counted from the state's epoch).
    pub epochs: usize,
    /// Stop after this many optimizer steps in this run, even mid-epoch.
    pub max_steps: Option<usize>,
    /// Samples per mini-batch.
    pub batch_size: usize,
    /// Seed of the per-epoch shuffles (epoch e uses `seed + e`).
    pub seed: u64,
    /// Steps excluded from the throughput (plans, caches and buffers are built in the first).
    pub warmup_steps: usize,
    /// The learning rate over the run, a factor on the optimizer's rate as passed in (which is
    /// restored when the run ends).
    pub schedule: LrSchedule,
    /// Random crops and flips of the training samples, drawn per epoch from `seed` (none by
    /// default; never applied to the test split).
    pub augment: Augment,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 1,
            max_steps: None,
            batch_size: 64,
            seed: 0,
            warmup_steps: 2,
            schedule: LrSchedule::constant(),
            augment: Augment::default(),
        }
    }
}

/// What one epoch did.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochReport {
    /// 1-based epoch number (including epochs of a resumed run).
    pub epoch: usize,
    /// Optimizer steps so far (including a resumed run's).
    pub step: usize,
    /// Mean training loss over the epoch's batches.
    pub train_loss: f64,
    /// Training accuracy over the epoch (on the weights as they were at each batch); NaN when the
    /// step does not report it.
    pub train_accuracy: f64,
    /// Loss and accuracy on the test split, if there is one.
    pub test: Option<(f64, f64)>,
    /// Wall time of the epoch (training and evaluation).
    pub seconds: f64,
}

/// What a whole run did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// Epochs completed in total (including a resumed run's).
    pub epochs: usize,
    /// Optimizer steps in total (including a resumed run's).
    pub steps: usize,
    /// Mean training loss of the last epoch (or of the steps run, when stopped by `max_steps`).
    pub train_loss: f64,
    /// Test accuracy of the final model (after the last epoch, or where `max_steps` stopped
    /// training), if there is a test split.
    pub test_accuracy: Option<f64>,
    /// Training samples per second after the warm-up steps (all steps if there were no more).
    pub samples_per_sec: f64,
    /// Samples per second of the median step after the warm-up steps (all steps if there were
    /// no more): robust against the outliers a shared machine adds to the mean above.
    pub median_samples_per_sec: f64,
}

/// The median of `v` (the mean of the middle two for an even length); 0 for an empty `v`.
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let h = v.len() / 2;
    if v.len() % 2 == 1 {
        v[h]
    } else {
        (v[h - 1] + v[h]) / 2.0
    }
}

/// Mean loss and accuracy of `model` on `data`, in evaluation mode.
pub fn evaluate(model: &mut Sequential, data: &Dataset, batch_size: usize) -> Result<(f64, f64)> {
    let (mut loss, mut right) = (0f64, 0usize);
    for (x, labels) in data.batches(batch_size, None)? {
        let logits = model.forward(x, false)?;
        let (l, _) = cross_entropy(&logits, &labels)?;
        loss += l as f64 * labels.len() as f64;
        right += correct(&logits, &labels);
    }
    let n = data.len().max(1) as f64;
    Ok((loss / n, right as f64 / n))
}

/// What one optimizer step on a mini-batch reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepResult {
    /// The mini-batch's mean loss.
    pub loss: f32,
    /// Samples of the mini-batch classified right, when the step knows.
    pub correct: Option<usize>,
}

/// One step on one process: forward, cross-entropy, backward, `opt`'s update.
pub fn local_step(
    model: &mut Sequential,
    opt: &mut Sgd,
    x: Tensor,
    labels: &[usize],
) -> Result<StepResult> {
    let logits = model.forward(x, true)?;
    let (loss, dlogits) = cross_entropy(&logits, labels)?;
    let right = correct(&logits, labels);
    model.backward(dlogits)?;
    opt.step(model.params_mut().into_iter().map(|(_, p)| p))?;
    Ok(StepResult {
        loss,
        correct: Some(right),
    })
}

/// Trains `model` on `train` from `state` with [`local_step`], calling `on_epoch` after every
/// epoch; returns the report and the new state (for a checkpoint).
pub fn fit(
    model: &mut Sequential,
    opt: &mut Sgd,
    train: &Dataset,
    test: Option<&Dataset>,
    cfg: &TrainConfig,
    state: TrainState,
    on_epoch: impl FnMut(&EpochReport, &Sequential, &Sgd, TrainState) -> Result<()>,
) -> Result<(TrainReport, TrainState)> {
    fit_with(model, opt, train, test, cfg, state, local_step, on_epoch)
}

/// The training loop with the step supplied: `dist`'s data-parallel step plugs in here, so the
/// loop (shuffles, epochs, `max_steps`, warm-up, evaluation, reports) exists once.
pub fn fit_with<E: From<NnError>>(
    model: &mut Sequential,
    opt: &mut Sgd,
    train: &Dataset,
    test: Option<&Dataset>,
    cfg: &TrainConfig,
    mut state: TrainState,
    mut step: impl FnMut(&mut Sequential, &mut Sgd, Tensor, &[usize]) -> Result<StepResult, E>,
    mut on_epoch: impl FnMut(&EpochReport, &Sequential, &Sgd, TrainState) -> Result<(), E>,
) -> Result<(TrainReport, TrainState), E> {
    if train.is_empty() {
        return Err(NnError::config("train", "the training set is empty").into());
    }
    if cfg.batch_size == 0 {
        return Err(NnError::config("batch_size", "0 (must be positive)").into());
    }
    let (mut steps_run, mut timed, mut timed_samples, mut all, mut all_samples) =
        (0usize, Duration::ZERO, 0usize, Duration::ZERO, 0usize);
    // Per-step rates (samples / s), of the timed steps and of all steps.
    let (mut timed_rates, mut all_rates) = (Vec::new(), Vec::new());
    let mut last_loss = f64::NAN;
    let base_lr = opt.lr;
    let mut test_accuracy = None;
    let mut evaluated_at = None;
    'epochs: for _ in 0..cfg.epochs {
        let start = Instant::now();
        let (mut loss_sum, mut seen, mut right, mut known) = (0f64, 0usize, 0usize, true);
        let mut stopped = false;
        let seed = cfg.seed.wrapping_add(state.epoch as u64);
        for (x, labels) in train
            .batches(cfg.batch_size, Some(seed))?
            .augmented(cfg.augment, seed)?
        {
            if cfg.max_steps.is_some_and(|m| steps_run >= m) {
                stopped = true;
                break;
            }
            let t = Instant::now();
            opt.lr = base_lr * cfg.schedule.factor(state.step, state.epoch);
            let result = step(model, opt, x, &labels);
            opt.lr = base_lr;
            let StepResult { loss, correct } = result?;
            if !loss.is_finite() {
                return Err(NnError::NonFinite {
                    loss,
                    step: state.step,
                }
                .into());
            }
            right += correct.unwrap_or(0);
            known &= correct.is_some();
            let dt = t.elapsed();
            all += dt;
            all_samples += labels.len();
            let rate = labels.len() as f64 / dt.as_secs_f64().max(f64::MIN_POSITIVE);
            all_rates.push(rate);
            if steps_run >= cfg.warmup_steps {
                timed += dt;
                timed_samples += labels.len();
                timed_rates.push(rate);
            }
            steps_run += 1;
            state.step += 1;
            loss_sum += loss as f64 * labels.len() as f64;
            seen += labels.len();
        }
        if seen > 0 {
            last_loss = loss_sum / seen as f64;
        }
        if stopped {
            break 'epochs;
        }
        state.epoch += 1;
        let test_result = test
            .map(|t| evaluate(model, t, cfg.batch_size.max(256)))
            .transpose()?;
        test_accuracy = test_result.map(|(_, a)| a);
        evaluated_at = Some(state.step);
        let report = EpochReport {
            epoch: state.epoch,
            step: state.step,
            train_loss: last_loss,
            train_accuracy: if known {
                right as f64 / seen.max(1) as f64
            } else {
                f64::NAN
            },
            test: test_result,
            seconds: start.elapsed().as_secs_f64(),
        };
        on_epoch(&report, model, opt, state)?;
    }
    // Stopped by `max_steps` inside an epoch: the report's accuracy is the final model's.
    if let Some(t) = test
        && evaluated_at != Some(state.step)
    {
        test_accuracy = Some(evaluate(model, t, cfg.batch_size.max(256))?.1);
    }
    let samples_per_sec = if timed_samples > 0 {
        timed_samples as f64 / timed.as_secs_f64()
    } else {
        all_samples as f64 / all.as_secs_f64().max(f64::MIN_POSITIVE)
    };
    let median_samples_per_sec = median(if timed_rates.is_empty() {
        &mut all_rates
    } else {
        &mut timed_rates
    });
    let report = TrainReport {
        epochs: state.epoch,
        steps: state.step,
        train_loss: last_loss,
        test_accuracy,
        samples_per_sec,
        median_samples_per_sec,
    };
    Ok((report, state))
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&mut []), 0.0);
        assert_eq!(median(&mut [3.0]), 3.0);
        assert_eq!(median(&mut [5.0, 1.0, 100.0]), 5.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
