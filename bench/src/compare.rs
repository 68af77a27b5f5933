//! Engine vs reference: the loss check that decides whether a comparison counts, ratios and
//! throughput. Pure functions over the runs' JSON.
use serde::{Deserialize, Serialize};

use super::case::StepMeta;
use super::matmul::MatmulPeak;
use super::stats::{ratio, rel_diff};
use super::step::StepRun;

/// Relative tolerance on the loss of the first step (same weights, same batch) for fp32.
pub const F32_LOSS_TOLERANCE: f64 = 1e-4;
/// The same for bf16 compute, where two correct implementations round differently.
pub const BF16_LOSS_TOLERANCE: f64 = 2e-2;

pub fn loss_tolerance(dtype: &str) -> f64 {
    if dtype == "f32" {
        F32_LOSS_TOLERANCE
    } else {
        BF16_LOSS_TOLERANCE
    }
}

/// Whether two runs computed the same thing: same first loss (before any update) within
/// `tolerance`, and (for the reference) the same labels and weights as the engine's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossCheck {
    pub engine_loss: Option<f64>,
    pub reference_loss: Option<f64>,
    pub rel_diff: Option<f64>,
    pub tolerance: f64,
    /// Largest relative loss difference over all steps (after updates the two optimizers'
    /// rounding differs, so this is informative, not a criterion).
    pub trajectory_max_rel_diff: Option<f64>,
    pub valid: bool,
    /// Why the comparison is void (`None` when valid).
    pub void_reason: Option<String>,
}

pub fn check_losses(engine: &StepRun, reference: &StepRun, tolerance: f64) -> LossCheck {
    let (e, r) = (engine.first_loss(), reference.first_loss());
    let rel = match (e, r) {
        (Some(e), Some(r)) => rel_diff(e, r),
        _ => None,
    };
    let trajectory = engine
        .losses
        .iter()
        .zip(&reference.losses)
        .filter_map(|(a, b)| rel_diff((*a)?, (*b)?))
        .reduce(f64::max);
    let reason = if let Some(err) = &engine.error {
        Some(format!("engine failed: {err}"))
    } else if let Some(err) = &reference.error {
        Some(format!("reference failed: {err}"))
    } else if reference.block_ids_match == Some(false) || reference.targets_match == Some(false) {
        Some("the reference derives different block inputs or labels from the batch".into())
    } else if reference.weights_max_abs_diff.is_some_and(|d| d > 1e-6) {
        Some(format!(
            "the reference derives different loss weights (max diff {:.2e})",
            reference.weights_max_abs_diff.unwrap_or(0.0)
        ))
    } else {
        match rel {
            None => Some("a first-step loss is missing or not finite".into()),
            Some(d) if d > tolerance => Some(format!(
                "first-step losses differ by {d:.2e} (relative), more than {tolerance:.0e}"
            )),
            Some(_) => None,
        }
    };
    LossCheck {
        engine_loss: e,
        reference_loss: r,
        rel_diff: rel,
        tolerance,
        trajectory_max_rel_diff: trajectory,
        valid: reason.is_none(),
        void_reason: reason,
    }
}

/// One drafter-step configuration, engine vs reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepComparison {
    pub config: String,
    pub meta: StepMeta,
    pub engine: StepRun,
    pub reference: StepRun,
    pub check: LossCheck,
    /// engine / reference median step time (< 1: the engine is faster).
    pub ratio: Option<f64>,
    /// engine / reference median process CPU time per step (less sensitive to other load).
    pub cpu_ratio: Option<f64>,
    /// engine / reference whole-process peak RSS, the growth during warmup and timed steps
    /// (includes one-time library initialisation and what the allocator keeps), and a step's
    /// live memory (the like-for-like measure of what a step needs).
    pub peak_rss_ratio: Option<f64>,
    pub step_growth_ratio: Option<f64>,
    pub live_step_ratio: Option<f64>,
    pub engine_tokens_per_s: Option<f64>,
    pub reference_tokens_per_s: Option<f64>,
    /// Analytic step FLOPs / median engine step time.
    pub engine_gflops: Option<f64>,
    pub reference_gflops: Option<f64>,
    /// `engine_gflops` / the matmul peak measured in the same run.
    pub engine_fraction_of_matmul_peak: Option<f64>,
    pub reference_fraction_of_matmul_peak: Option<f64>,
}

fn per_s(count: f64, ms: Option<f64>) -> Option<f64> {
    ms.filter(|ms| *ms > 0.0).map(|ms| count / (ms * 1e-3))
}

pub fn compare_step(
    meta: StepMeta,
    engine: StepRun,
    reference: StepRun,
    peak: Option<&MatmulPeak>,
) -> StepComparison {
    let check = check_losses(&engine, &reference, loss_tolerance(&engine.dtype));
    let flops = meta.forward_flops
        + if engine.forward_only {
            0.0
        } else {
            meta.backward_flops
        };
    let gflops = |run: &StepRun| per_s(flops, run.median_step_ms).map(|f| f / 1e9);
    let (eg, rg) = (gflops(&engine), gflops(&reference));
    let peak = peak.and_then(|p| p.gflops);
    StepComparison {
        config: meta.config.clone(),
        ratio: ratio(engine.median_step_ms, reference.median_step_ms),
        cpu_ratio: ratio(engine.median_cpu_ms, reference.median_cpu_ms),
        peak_rss_ratio: ratio(engine.peak_rss_mb, reference.peak_rss_mb),
        step_growth_ratio: ratio(engine.step_growth_mb(), reference.step_growth_mb()),
        live_step_ratio: ratio(engine.live_step_mb, reference.live_step_mb),
        engine_tokens_per_s: per_s(meta.tokens as f64, engine.median_step_ms),
        reference_tokens_per_s: per_s(meta.tokens as f64, reference.median_step_ms),
        engine_gflops: eg,
        reference_gflops: rg,
        engine_fraction_of_matmul_peak: ratio(eg, peak),
        reference_fraction_of_matmul_peak: ratio(rg, peak),
        meta,
        engine,
        reference,
        check,
    }
}

/// Merges repeated runs of one implementation (rounds alternate engine and reference to
/// spread the machine's noise over both): step times pooled, peaks maximal, losses and the
/// rest from the first round.
pub fn merge_rounds(runs: Vec<StepRun>) -> Option<StepRun> {
    let mut runs = runs.into_iter();
    let mut merged = runs.next()?;
    for r in runs {
        merged.step_ms.extend(r.step_ms);
        merged.cpu_ms.extend(r.cpu_ms);
        for (slot, v) in [
            (&mut merged.peak_rss_mb, r.peak_rss_mb),
            (&mut merged.step_peak_rss_mb, r.step_peak_rss_mb),
            (&mut merged.load_peak_rss_mb, r.load_peak_rss_mb),
            (&mut merged.cuda_max_allocated_mb, r.cuda_max_allocated_mb),
            (&mut merged.cuda_reserved_mb, r.cuda_reserved_mb),
        ] {
            *slot = [*slot, v].into_iter().flatten().reduce(f64::max);
        }
        merged.cuda_alloc_retries = [merged.cuda_alloc_retries, r.cuda_alloc_retries]
            .into_iter()
            .flatten()
            .reduce(u64::max);
        merged.baseline_rss_mb = [merged.baseline_rss_mb, r.baseline_rss_mb]
            .into_iter()
            .flatten()
            .reduce(f64::min);
        if merged.error.is_none() {
            merged.error = r.error;
        }
    }
    merged.median_step_ms = super::stats::median(&merged.step_ms);
    merged.median_cpu_ms = super::stats::median(&merged.cpu_ms);
    Some(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(losses: &[f64], ms: &[f64]) -> StepRun {
        StepRun {
            dtype: "f32".into(),
            losses: losses.iter().map(|l| Some(*l)).collect(),
            median_step_ms: super::super::stats::median(ms),
            step_ms: ms.to_vec(),
            ..StepRun::default()
        }
    }

    #[test]
    fn equal_first_losses_make_a_valid_comparison() {
        let c = check_losses(
            &run(&[6.0, 5.0], &[1.0]),
            &run(&[6.0003, 5.1], &[1.0]),
            1e-4,
        );
        assert!(c.valid, "{c:?}");
        assert!(c.trajectory_max_rel_diff.unwrap() > 0.01);
    }

    #[test]
    fn a_loss_mismatch_voids_the_comparison_and_says_by_how_much() {
        let c = check_losses(&run(&[6.0], &[1.0]), &run(&[6.1], &[1.0]), 1e-4);
        assert!(!c.valid);
        assert!(c.void_reason.unwrap().contains("differ by 1.64e-2"));
    }

    #[test]
    fn failures_and_label_mismatches_void_the_comparison() {
        let mut r = run(&[6.0], &[1.0]);
        r.error = Some("ImportError: torch".into());
        assert!(check_losses(&run(&[6.0], &[1.0]), &r, 1e-4)
            .void_reason
            .unwrap()
            .contains("ImportError"));
        let mut r = run(&[6.0], &[1.0]);
        r.targets_match = Some(false);
        assert!(!check_losses(&run(&[6.0], &[1.0]), &r, 1e-4).valid);
        let missing = check_losses(&run(&[], &[1.0]), &run(&[6.0], &[1.0]), 1e-4);
        assert!(missing.void_reason.unwrap().contains("missing"));
    }

    #[test]
    fn rounds_pool_times_and_keep_the_largest_peak() {
        let mut a = run(&[6.0], &[10.0, 12.0]);
        a.peak_rss_mb = Some(100.0);
        let mut b = run(&[6.0], &[11.0, 30.0]);
        b.peak_rss_mb = Some(120.0);
        let m = merge_rounds(vec![a, b]).unwrap();
        assert_eq!(m.step_ms.len(), 4);
        assert_eq!(m.median_step_ms, Some(11.5));
        assert_eq!(m.peak_rss_mb, Some(120.0));
        assert!(merge_rounds(Vec::new()).is_none());
    }
}
