//! The `plan` case: the memory and FLOP model of `dflash_engine::plan` against measurement.
//!
//! For each step config it builds the case (the same files as the `step` case) and, on CPU,
//! each in a child process of its own:
//! - runs the engine's memory pass ([`StepPass::Memory`]) and compares the live step memory
//!   it measures with the model's prediction of the step's consumers
//!   ([`DrafterMemory::step_bytes`]) at the case's own anchors, keep flags and loss weights;
//! - runs one step with its kernels' FLOPs counted op by op ([`StepPass::Flops`],
//!   [`crate::flop_counter`]) and compares them with the model's executed FLOPs
//!   (`plan::flops::drafter_step_executed_flops`: every key each fused attention call is
//!   handed, and the recomputed layers). The model FLOPs MFU divides (useful work only) are
//!   reported beside them, and their ratio is the share of executed work that was useful.
use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

use super::case::CaseTensors;
use super::error::BenchError;
use super::harness::{Harness, StepPass};
use super::presets::step_preset;
use crate::flop_counter::CountedFlops;
use dflash_engine::plan::drafter::RankContext;
use dflash_engine::plan::flops::{
    corrected_positions, drafter_step_executed_flops, head_positions, teacher_positions,
    ExecutedFlops, StepWork,
};
use dflash_engine::plan::{drafter_memory, ActivationPrecision, StepShape};

/// The configs the case runs when `--configs` names none: the CPU step configs, `small` with
/// a Domino head, and one with the real drafter's structure (1024 anchors of 32 over 3072
/// tokens, 4 sliding + 1 full layer, GQA 4:1 with head_dim 128), hidden size and vocabulary
/// scaled down.
pub const PLAN_CONFIGS: &[&str] = &["tiny", "small", "small-domino", "medium", "real-structure"];

/// How far the predicted live step memory may be from the memory pass's, relative to the
/// measurement: the bound every config's error has stayed within since the model was first
/// held to the pass (docs/BENCHMARKS.md, "Memory plan: predicted vs measured").
pub const LIVE_STEP_MEMORY_TOLERANCE: f64 = 0.15;

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
    /// Model FLOPs of one step (forward + backward, useful work only: what MFU divides),
    /// `plan/flops.rs::drafter_step_flops`.
    pub step_flops: f64,
    /// The model's executed FLOPs of the step (`plan/flops.rs::drafter_step_executed_flops`).
    pub predicted_executed_flops: Option<ExecutedFlops>,
    /// The FLOPs the step's kernels executed, counted op by op.
    pub counted_flops: Option<CountedFlops>,
    /// (predicted − counted) / counted, over all executed FLOPs.
    pub flops_rel_error: Option<f64>,
    /// Model FLOPs / counted executed FLOPs: the share of the kernels' work that was useful.
    pub useful_fraction: Option<f64>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanCheck {
    pub rows: Vec<PlanRow>,
    /// The largest |rel_error| over the rows that measured.
    pub max_rel_error: Option<f64>,
    /// The largest |flops_rel_error| over the rows that counted.
    pub max_flops_rel_error: Option<f64>,
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
    let weights: Vec<f32> = Vec::try_from(t.get("weights")?.flatten(0, -1).to_kind(Kind::Float))?;
    let corrected = corrected_positions(&preset.drafter, &weights);
    let head = head_positions(&preset.drafter, &weights);
    let executed = drafter_step_executed_flops(
        &StepWork {
            drafter: &preset.drafter,
            batch: meta.batch as i64,
            seq_len: meta.seq_len as i64,
            anchors: &anchors,
            keep: &keep,
            weighted_positions: meta.weighted_positions,
            corrected_positions: corrected,
            head_positions: head,
            teacher_positions: teacher_positions(&preset.drafter, meta.weighted_positions),
            vocab_size: preset.drafter.vocab_size,
        },
        activation_checkpointing,
    );
    let shape = StepShape {
        batch: meta.batch as i64,
        seq_len: meta.seq_len as i64,
        anchors,
        keep,
        weighted_positions: meta.weighted_positions,
        corrected_positions: corrected,
        head_positions: head,
        loss_chunk_positions: meta.loss_chunk_positions,
        tree_budget: 0,
    };
    // The memory pass runs one process on CPU in f32: its parameters are their own masters,
    // and the tables are the case's tensors, loaded before the steps (not step memory).
    let rank = RankContext {
        activation_checkpointing,
        ..RankContext::alone(ActivationPrecision::Fp32Cpu, true)
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
        predicted_executed_flops: Some(executed),
        counted_flops: None,
        flops_rel_error: None,
        useful_fraction: None,
        error: None,
    })
}

/// Relative error of a prediction against a measurement.
pub fn rel_error(predicted: f64, measured: f64) -> Option<f64> {
    (measured > 0.0).then(|| (predicted - measured) / measured)
}

/// The largest |rel_error| of the rows.
pub fn max_rel_error(rows: &[PlanRow]) -> Option<f64> {
    largest_magnitude(rows.iter().map(|r| r.rel_error))
}

/// The largest |flops_rel_error| of the rows.
pub fn max_flops_rel_error(rows: &[PlanRow]) -> Option<f64> {
    largest_magnitude(rows.iter().map(|r| r.flops_rel_error))
}

fn largest_magnitude(errors: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    errors.flatten().map(f64::abs).reduce(f64::max)
}

impl PlanRow {
    /// Takes a FLOP pass's count: the error of the executed prediction, the useful share.
    pub fn absorb_counted(&mut self, counted: CountedFlops) {
        let total = counted.total();
        self.flops_rel_error = self
            .predicted_executed_flops
            .and_then(|p| rel_error(p.total(), total));
        self.useful_fraction = (total > 0.0).then(|| self.step_flops / total);
        self.counted_flops = Some(counted);
    }
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
            let counted = harness.engine_step(&dir, StepPass::Flops);
            if let Some(c) = counted.counted_flops {
                row.absorb_counted(c);
            }
            let errors: Vec<String> = [measured.error, counted.error]
                .into_iter()
                .flatten()
                .collect();
            row.error = (!errors.is_empty()).then(|| errors.join("; "));
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
        max_flops_rel_error: max_flops_rel_error(&rows),
        rows,
    }
}

impl PlanCheck {
    /// The Markdown table of `results.md`.
    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| config | B×S, anchors×bs | predicted live step MiB (phase) | measured MiB | rel. error | executed GFLOP predicted | counted | rel. error | model GFLOP (MFU's) | useful share |\n|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("n/a".into(), f);
        let percent = |e: f64| format!("{:+.1} %", e * 100.0);
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {}×{}, {}×{} | {:.1} ({}) | {} | {} | {} | {} | {} | {:.1} | {} |\n",
                r.config,
                r.batch,
                r.seq_len,
                r.anchors_per_row,
                r.block_size,
                r.predicted_step_mb,
                r.predicted_peak_phase,
                opt(r.measured_step_mb, &|m| format!("{m:.1}")),
                opt(r.rel_error, &percent),
                opt(r.predicted_executed_flops.map(|f| f.total()), &|f| format!(
                    "{:.1}",
                    f / 1e9
                )),
                opt(r.counted_flops.map(|f| f.total()), &|f| format!(
                    "{:.1}",
                    f / 1e9
                )),
                opt(r.flops_rel_error, &percent),
                r.step_flops / 1e9,
                opt(r.useful_fraction, &|u| format!("{:.0} %", u * 100.0)),
            ));
        }
        let magnitude = |e: Option<f64>| e.map_or("n/a".into(), |e| format!("{:.1} %", e * 100.0));
        out.push_str(&format!(
            "\nmax |rel. error|: live step memory {}, executed FLOPs {}\n",
            magnitude(self.max_rel_error),
            magnitude(self.max_flops_rel_error),
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
    fn a_count_sets_the_flop_error_and_the_useful_share() {
        let mut row = PlanRow {
            step_flops: 60.0,
            predicted_executed_flops: Some(ExecutedFlops {
                matmul: 50.0,
                attention_forward: 20.0,
                attention_backward: 40.0,
            }),
            ..PlanRow::default()
        };
        row.absorb_counted(CountedFlops {
            matmul: 50.0,
            attention_forward: 30.0,
            attention_backward: 20.0,
            ..CountedFlops::default()
        });
        assert_eq!(row.flops_rel_error, Some(0.1));
        assert_eq!(row.useful_fraction, Some(0.6));
        assert_eq!(max_flops_rel_error(&[row.clone()]), Some(0.1));
        // A count of nothing has no error and no share.
        row.absorb_counted(CountedFlops::default());
        assert_eq!((row.flops_rel_error, row.useful_fraction), (None, None));
    }

    /// The executed-FLOP model against the kernels' own count on the case of `config`, in
    /// this process (the counter is per thread, so the other tests running beside it do not
    /// enter the count), with and without the recomputation of checkpointed layers: exact,
    /// category by category.
    fn assert_the_count_equals_the_executed_flop_model(config: &str) {
        use crate::case::prepare_step_case;
        use crate::step::{run_engine_step, StepOptions};
        use dflash_engine::model::drafter::AttentionBackend;
        let _rng = dflash_engine::device::global_rng::lock();
        let dir = tempfile::tempdir().unwrap();
        prepare_step_case(&step_preset(config).unwrap(), dir.path()).unwrap();
        for activation_checkpointing in [false, true] {
            let opts = StepOptions {
                warmup: 0,
                steps: 0,
                device: Device::Cpu,
                kind: Kind::Float,
                forward_only: false,
                memory_steps: 0,
                backend: AttentionBackend::BlockSparse,
                activation_checkpointing,
                count_flops: true,
            };
            let run = run_engine_step(dir.path(), &opts).unwrap();
            let counted = run.counted_flops.expect("a counted step");
            let mut row = predict(config, dir.path(), activation_checkpointing).unwrap();
            row.absorb_counted(counted);
            let predicted = row.predicted_executed_flops.unwrap();
            // Exact, category by category: the model counts the same kernels, and every FLOP
            // count here is an integer far below 2^53.
            assert_eq!(
                (
                    predicted.matmul,
                    predicted.attention_forward,
                    predicted.attention_backward
                ),
                (
                    counted.matmul,
                    counted.attention_forward,
                    counted.attention_backward
                ),
                "{config}, checkpointing {activation_checkpointing}: predicted {predicted:?}, counted {counted:?}"
            );
            assert_eq!(row.flops_rel_error, Some(0.0));
            // Masked keys are executed and not useful.
            assert!(row.useful_fraction.unwrap() < 1.0);
        }
    }

    /// On the `small` case: a sliding and a full layer, several chunks per layer.
    #[test]
    fn the_executed_flop_model_equals_the_count_of_the_kernels_run() {
        assert_the_count_equals_the_executed_flop_model("small");
    }

    /// On `small-domino`, `small` with a Domino head whose pure-draft prefix leaves slot 1
    /// uncorrected: the GRU's projections (forward, and backward into its weights and its
    /// states), `embed_proj` over the corrected positions only, and the base logits the
    /// curriculum computes beside the corrected ones.
    #[test]
    fn the_executed_flop_model_equals_the_count_with_a_domino_head() {
        assert_the_count_equals_the_executed_flop_model("small-domino");
    }

    /// DSpark's loss (`train/dspark.rs::dspark_backward`) for every Markov variant, with and
    /// without a Markov head, over blocks whose last slots are unsupervised: the kernels it runs
    /// (the LM head forward and its input gradient, the teacher's forward, the Markov latents
    /// over every slot, `W₂` and the confidence head over the supervised ones, each backward)
    /// equal the executed FLOP model's DSpark terms, the teacher's and the LM head's.
    #[test]
    fn the_executed_flop_model_equals_the_count_of_dsparks_loss() {
        use dflash_engine::model::drafter::{
            DrafterConfig, DrafterHead, DsparkConfig, DsparkHead, MarkovHeadType,
        };
        use dflash_engine::model::target::TargetConfig;
        use dflash_engine::plan::flops::{
            drafter_step_executed_flops, teacher_positions, StepWork,
        };
        use dflash_engine::train::dspark::{dspark_backward, DsparkBatch, DsparkLossWeights};
        use tch::{nn, Tensor};
        // Random inputs and heads, drawn from one seed.
        let _rng = dflash_engine::device::global_rng::seeded(1);
        let tiny =
            dflash_engine::embedded::tiny_dflash_drafter_config(&TargetConfig::tiny_default());
        let (v, h, bs, blocks) = (300, tiny.hidden_size, tiny.block_size, 6);
        let q = bs * blocks;
        let anchors: Vec<i64> = (0..blocks).map(|j| 10 * j).collect();
        let keep = vec![true; blocks as usize];
        // Slots 0..5 of every block supervised: 30 of 48.
        let valid: Vec<bool> = (0..q).map(|i| i % bs < 5).collect();
        let weighted = valid.iter().filter(|v| **v).count() as i64;
        let opts = (Kind::Float, Device::Cpu);
        let row = |t: Tensor| t.view([1, q]);
        let weights = row(Tensor::from_slice(&valid).to_kind(Kind::Float));
        let valid = row(Tensor::from_slice(&valid));
        let ids = || Tensor::randint(v, [1, q], (Kind::Int64, Device::Cpu));
        let (targets, prev) = (ids(), ids());
        let lm_head = Tensor::randn([v, h], opts);
        let teacher = Tensor::randn([1, q, tiny.target_hidden_size], opts);
        let plain = DrafterConfig {
            vocab_size: v,
            ..tiny.clone()
        };
        let work = |d: &DrafterConfig, teacher: i64| {
            drafter_step_executed_flops(
                &StepWork {
                    drafter: d,
                    batch: 1,
                    seq_len: 100,
                    anchors: &anchors,
                    keep: &keep,
                    weighted_positions: weighted,
                    corrected_positions: 0,
                    head_positions: weighted,
                    teacher_positions: teacher,
                    vocab_size: v,
                },
                false,
            )
            .matmul
        };
        let heads = [
            (4, MarkovHeadType::Vanilla, true),
            (4, MarkovHeadType::Gated, true),
            (4, MarkovHeadType::Rnn, false),
            (0, MarkovHeadType::Vanilla, false),
        ];
        for (markov_rank, markov_head_type, confidence_head_with_markov) in heads {
            let config = DsparkConfig {
                markov_rank,
                markov_head_type,
                confidence_head: true,
                confidence_head_with_markov,
            };
            let d = DrafterConfig {
                head: DrafterHead::Dspark(config),
                ..plain.clone()
            };
            let vs = nn::VarStore::new(Device::Cpu);
            let head = DsparkHead::new(&vs.root(), &config, h, v, 0.02);
            let batch = DsparkBatch {
                head: &head,
                lm_head: &lm_head,
                targets: &targets,
                prev_tokens: &prev,
                weights: &weights,
                valid: &valid,
                teacher_hidden: &teacher,
                block_size: bs,
                loss_weights: DsparkLossWeights::default(),
            };
            let out = Tensor::randn([1, q, h], opts).set_requires_grad(true);
            // Two chunks of whole blocks.
            let (_, counted) =
                crate::flop_counter::count_flops(|| dspark_backward(&out, &batch, 1.0, 15));
            // The LM head's forward and input gradient over the supervised slots, which the
            // model counts outside the head's own terms.
            let lm_head_flops = 2.0 * 2.0 * (weighted * h * v) as f64;
            let predicted =
                work(&d, teacher_positions(&d, weighted)) - work(&plain, 0) + lm_head_flops;
            assert_eq!(counted.matmul, predicted, "{config:?}");
            assert_eq!(counted.attention_forward + counted.attention_backward, 0.0);
        }
    }

    /// DFlash2's loss (`train/dflash2.rs::dflash2_backward`) with a trained selector, over
    /// blocks of which one holds no weighted slot (the LM head skips it) and one a single
    /// weighted slot, in three chunks: the kernels it runs (the LM head over every slot of the
    /// other five blocks and its input gradient, the selector's `hidden_projection` and
    /// candidate scoring there with both gradients, and the greedy walk's, forward only) equal
    /// the executed FLOP model's DFlash2 terms less the layers' kernel projections (the
    /// convolutions run in the drafter's forward, not in the loss), plus the LM head's.
    #[test]
    fn the_executed_flop_model_equals_the_count_of_dflash2s_loss() {
        use dflash_engine::model::drafter::{
            CandidateSelector, Dflash2Config, DrafterConfig, DrafterHead,
        };
        use dflash_engine::model::target::TargetConfig;
        use dflash_engine::plan::flops::dflash2_terms;
        use dflash_engine::train::block_objective::LossObjective;
        use dflash_engine::train::dflash2::{dflash2_backward, Dflash2Batch};
        use tch::{nn, Tensor};
        // Random inputs and selector, drawn from one seed.
        let _rng = dflash_engine::device::global_rng::seeded(2);
        let tiny =
            dflash_engine::embedded::tiny_dflash_drafter_config(&TargetConfig::tiny_default());
        let (v, h, bs, blocks) = (300, tiny.hidden_size, tiny.block_size, 6);
        let q = bs * blocks;
        let anchors: Vec<i64> = (0..blocks).map(|j| 10 * j).collect();
        let keep = vec![true; blocks as usize];
        // Slots 1..=4 of blocks 0, 1, 3 and 4, slot 1 of block 5, none of block 2.
        let weights: Vec<f32> = (0..q)
            .map(|i| {
                let (block, slot) = (i / bs, i % bs);
                let weighted = match block {
                    2 => false,
                    5 => slot == 1,
                    _ => (1..=4).contains(&slot),
                };
                if weighted {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        let weighted = weights.iter().filter(|w| **w > 0.0).count() as i64;
        let config = Dflash2Config {
            conv_kernel_size: 2,
            conv_group_size: 4,
            selector_rank: 5,
            selector_top_k: 4,
            output_multiplier: 1.0,
            final_logit_softcapping: Some(30.0),
        };
        let d = DrafterConfig {
            vocab_size: v,
            head: DrafterHead::Dflash2(config),
            ..tiny.clone()
        };
        let head = head_positions(&d, &weights);
        assert_eq!((weighted, head), (17, 5 * bs));
        let t = dflash2_terms(&StepWork {
            drafter: &d,
            batch: 1,
            seq_len: 100,
            anchors: &anchors,
            keep: &keep,
            weighted_positions: weighted,
            corrected_positions: 0,
            head_positions: head,
            teacher_positions: 0,
            vocab_size: v,
        })
        .unwrap();
        let opts = (Kind::Float, Device::Cpu);
        let vs = nn::VarStore::new(Device::Cpu);
        let selector = CandidateSelector::new(&vs.root(), &config, h, v, 0.02);
        let lm_head = Tensor::randn([v, h], opts);
        let targets = Tensor::randint(v, [1, q], (Kind::Int64, Device::Cpu));
        let weights = Tensor::from_slice(&weights).view([1, q]);
        let batch = Dflash2Batch {
            selector: &selector,
            lm_head: &lm_head,
            targets: &targets,
            weights: &weights,
            block_size: bs,
            selector_alpha: 1.0,
            stop_gradient: false,
        };
        let out = Tensor::randn([1, q, h], opts).set_requires_grad(true);
        // Chunks of at most 9 weighted positions: blocks 0–1, 3–4, then 5.
        let (_, counted) = crate::flop_counter::count_flops(|| {
            dflash2_backward(&out, &batch, LossObjective::Dflash, 1.0, 9)
        });
        let convolutions = 3.0 * t.layers * t.layer_conv_projections;
        let lm_head_flops = 2.0 * 2.0 * (head * h * v) as f64;
        let predicted = t.forward() + t.backward() - convolutions + lm_head_flops;
        assert_eq!(counted.matmul, predicted);
        assert_eq!(counted.attention_forward + counted.attention_backward, 0.0);
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
