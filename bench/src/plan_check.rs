//! The `plan` case: the memory model of `dflash_engine::plan` against the memory pass.
//!
//! For each step config it builds the case (the same files as the `step` case), runs the
//! engine's memory pass on CPU (a child process; [`StepPass::Memory`]) and compares the live
//! step memory it measures with the model's prediction of the step's consumers
//! ([`DrafterMemory::step_bytes`]) at the case's own anchors, keep flags and loss weights.
//! FLOPs are the analytic count of `plan/flops.rs` at the same shape, reported beside it: no
//! FLOP counter exists here to measure them against, so they carry no error column.
use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

use super::case::CaseTensors;
use super::error::BenchError;
use super::harness::{Harness, StepPass};
use super::presets::step_preset;
use dflash_engine::plan::drafter::RankContext;
use dflash_engine::plan::{drafter_memory, ActivationPrecision, StepShape};

/// The configs the case runs when `--configs` names none: the CPU step configs and one with
/// the real drafter's structure (1024 anchors of 32 over 3072 tokens, 4 sliding + 1 full
/// layer, GQA 4:1 with head_dim 128), hidden size and vocabulary scaled down.
pub const PLAN_CONFIGS: &[&str] = &["tiny", "small", "medium", "real-structure"];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanRow {
    pub config: String,
    pub batch: usize,
    pub seq_len: usize,
    pub anchors_per_row: usize,
    pub block_size: i64,
    /// Whether the step recomputed its layers in the backward (`--activation-checkpointing`).
    pub activation_checkpointing: bool,
    /// The model's live step memory (the step's consumers at its peak phase), MiB.
    pub predicted_step_mb: f64,
    pub predicted_peak_phase: String,
    /// The memory pass's live step memory (peak RSS growth over a step), MiB.
    pub measured_step_mb: Option<f64>,
    /// (predicted − measured) / measured.
    pub rel_error: Option<f64>,
    /// The model's consumers of the step, MiB, largest first.
    pub predicted_consumers: Vec<(String, f64)>,
    /// Analytic FLOPs of one step (forward + backward), `plan/flops.rs`.
    pub step_flops: f64,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanCheck {
    pub rows: Vec<PlanRow>,
    /// The largest |rel_error| over the rows that measured.
    pub max_rel_error: Option<f64>,
}

const MIB: f64 = 1024.0 * 1024.0;

/// The model's prediction for the case in `dir` of `config`, without the measurement, for a
/// step that recomputes its layers or not (`activation_checkpointing`).
pub fn predict(
    config: &str,
    dir: &std::path::Path,
    activation_checkpointing: bool,
) -> Result<PlanRow, BenchError> {
    let preset = step_preset(config)?;
    let meta = super::case::read_meta(dir)?;
    let t = CaseTensors::read(dir, Device::Cpu, Kind::Float)?;
    let anchors: Vec<i64> = Vec::try_from(t.get("anchors")?.flatten(0, -1))?;
    let keep: Vec<bool> = Vec::try_from(t.get("keep")?.flatten(0, -1).to_kind(Kind::Bool))?;
    let shape = StepShape {
        batch: meta.batch as i64,
        seq_len: meta.seq_len as i64,
        anchors,
        keep,
        weighted_positions: meta.weighted_positions,
        loss_chunk_positions: meta.loss_chunk_positions,
    };
    // The memory pass runs one process on CPU in f32: its parameters are their own masters,
    // and the tables are the case's tensors, loaded before the steps (not step memory).
    let rank = RankContext {
        precision: ActivationPrecision::Fp32Cpu,
        ranks: 1,
        tables_shared_with_target: true,
        queued_items: 0,
        item_bytes: 0.0,
        activation_checkpointing,
    };
    let memory = drafter_memory(&preset.drafter, &shape, rank);
    let mut consumers: Vec<(String, f64)> = memory
        .step
        .iter()
        .map(|c| (c.name.clone(), c.bytes / MIB))
        .collect();
    consumers.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(PlanRow {
        config: config.into(),
        batch: meta.batch,
        seq_len: meta.seq_len,
        anchors_per_row: meta.num_blocks,
        block_size: meta.block_size,
        activation_checkpointing,
        predicted_step_mb: memory.step_bytes() / MIB,
        predicted_peak_phase: memory.peak_phase.into(),
        measured_step_mb: None,
        rel_error: None,
        predicted_consumers: consumers,
        step_flops: meta.forward_flops + meta.backward_flops,
        error: None,
    })
}

/// Relative error of a prediction against a measurement.
pub fn rel_error(predicted: f64, measured: f64) -> Option<f64> {
    (measured > 0.0).then(|| (predicted - measured) / measured)
}

/// The largest |rel_error| of the rows.
pub fn max_rel_error(rows: &[PlanRow]) -> Option<f64> {
    rows.iter()
        .filter_map(|r| r.rel_error)
        .map(f64::abs)
        .reduce(f64::max)
}

/// Runs the case for `configs` (the harness's memory steps; CPU only).
pub fn run(harness: &Harness, configs: &[String]) -> PlanCheck {
    let mut rows = Vec::new();
    for config in configs {
        eprintln!("[bench]   plan `{config}`: prepare, memory pass, prediction");
        let row = (|| -> Result<PlanRow, BenchError> {
            let (dir, _) = harness.prepare_step(config)?;
            let measured = harness.engine_step(&dir, StepPass::Memory);
            let mut row = predict(config, &dir, harness.activation_checkpointing)?;
            row.measured_step_mb = measured.live_step_mb;
            row.rel_error = measured
                .live_step_mb
                .and_then(|m| rel_error(row.predicted_step_mb, m));
            row.error = measured.error;
            Ok(row)
        })()
        .unwrap_or_else(|e| PlanRow {
            config: config.clone(),
            error: Some(e.to_string()),
            ..PlanRow::default()
        });
        rows.push(row);
    }
    PlanCheck {
        max_rel_error: max_rel_error(&rows),
        rows,
    }
}

impl PlanCheck {
    /// The Markdown table of `results.md`.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| config | B×S, anchors×bs | predicted live step MiB (phase) | measured MiB | rel. error | step TFLOP (analytic) |\n|---|---|---|---|---|---|\n",
        );
        for r in &self.rows {
            let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("n/a".into(), f);
            out.push_str(&format!(
                "| {} | {}×{}, {}×{} | {:.1} ({}) | {} | {} | {:.3} |\n",
                r.config,
                r.batch,
                r.seq_len,
                r.anchors_per_row,
                r.block_size,
                r.predicted_step_mb,
                r.predicted_peak_phase,
                opt(r.measured_step_mb, &|m| format!("{m:.1}")),
                opt(r.rel_error, &|e| format!("{:+.1} %", e * 100.0)),
                r.step_flops / 1e12,
            ));
        }
        out.push_str(&format!(
            "\nmax |rel. error|: {}\n",
            self.max_rel_error
                .map_or("n/a".into(), |e| format!("{:.1} %", e * 100.0))
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_is_relative_to_the_measurement_and_the_max_is_absolute() {
        assert_eq!(rel_error(110.0, 100.0), Some(0.1));
        assert_eq!(rel_error(1.0, 0.0), None);
        let row = |e| PlanRow {
            rel_error: e,
            ..PlanRow::default()
        };
        let rows = [row(Some(0.1)), row(Some(-0.3)), row(None)];
        assert_eq!(max_rel_error(&rows), Some(0.3));
        assert_eq!(max_rel_error(&[row(None)]), None);
    }

    #[test]
    fn the_real_structure_config_has_the_real_drafters_shape() {
        let p = step_preset("real-structure").unwrap();
        let d = &p.drafter;
        assert_eq!((p.seq_len, p.num_anchors, d.block_size), (3072, 1024, 32));
        assert_eq!(d.num_attention_heads / d.num_key_value_heads, 4);
        assert_eq!(d.head_dim, 128);
        assert_eq!(d.sliding_window, Some(2048));
        use dflash_engine::model::drafter::LayerType::{Full, Sliding};
        assert_eq!(d.layer_types, [Sliding, Sliding, Sliding, Sliding, Full]);
    }
}
