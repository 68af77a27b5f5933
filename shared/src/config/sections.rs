//! The run, model and training sections of the run config.
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::device::Device;
use super::dflash2::Dflash2Section;
use super::dspark::{DsparkSection, MarkovHeadType};
use super::tree_objective::TreeSection;

/// `[run]`: what the run is called and where it lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Letters, digits, `.`, `_`, `-`. Operators type it to confirm destructive actions.
    pub name: String,
    /// Checkpoints, journal and recordings. Unset: dflashd picks `<XDG data dir>/runs/<name>`,
    /// or `--run-dir` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_dir: Option<String>,
    /// Seeds initialisation, anchor sampling and the per-epoch data shuffle.
    #[serde(default)]
    pub seed: u64,
}

/// The value of `target.model` that selects the built-in tiny target.
pub const EMBEDDED: &str = "embedded";

/// `[target]`: the frozen model whose hidden states condition the drafter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSection {
    /// A Hugging Face checkpoint directory, or `"embedded"` for the built-in tiny target.
    pub model: String,
    /// Weights are loaded and run in this dtype.
    #[serde(default = "default_target_dtype")]
    pub dtype: Dtype,
}

impl TargetSection {
    pub fn is_embedded(&self) -> bool {
        self.model == EMBEDDED
    }
}

fn default_target_dtype() -> Dtype {
    Dtype::Bf16
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bf16,
    F16,
    F32,
}

/// Attention kind of one drafter layer (the names of the published drafter `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    FullAttention,
    SlidingAttention,
}

/// `[drafter]`: the drafter architecture (spec §1.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrafterSection {
    pub num_layers: usize,
    /// Must equal the target's hidden size (the drafter reuses its embedding and LM head).
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub mask_token_id: u32,
    /// Target layers whose residual-stream outputs are concatenated (the `hidden_states[L+1]`
    /// convention), in this order.
    pub target_layer_ids: Vec<usize>,
    /// One per layer; unset means every layer is `full_attention`.
    #[serde(default)]
    pub layer_types: Vec<LayerType>,
    /// Window of `sliding_attention` layers, in tokens; required when any layer slides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    /// The drafter's output head: `"dflash"` (the target's LM head on the drafter's output)
    /// `"domino"` (Domino, arXiv 2605.29707: plus a GRU logit correction over the block's
    /// previous tokens, SpecForge's `DominoDraftModel`), `"dspark"` (SpecForge's
    /// `DSparkDraftModel`: slot k drafts the token after anchor + k, a Markov head biases its
    /// logits by the previous token, a confidence head predicts its acceptance, and the loss
    /// distils the target's own distribution) or `"dflash2"` (SpecForge's `DFlash2DraftModel`:
    /// a grouped dynamic convolution around every attention and MLP, and a candidate selector
    /// that rescores the unary top-K by the previous token). Locked for a run: it decides the
    /// drafter's weights.
    #[serde(default)]
    pub head: DrafterHead,
    /// Domino: width of `embed_proj`'s middle layer (SpecForge `dflash_config.emb_dim`;
    /// 256 in its Qwen3.6-27B recipe). Required with `head = "domino"`, refused otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emb_dim: Option<usize>,
    /// Domino: hidden size of the prefix GRU (SpecForge `dflash_config.gru_hidden_dim`; 1024
    /// in its Qwen3.6-27B recipe). Required with `head = "domino"`, refused otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gru_hidden_dim: Option<usize>,
    /// Domino: draft slots after the anchor that keep the base logits, uncorrected (SpecForge
    /// `dflash_config.pure_draft_prefix_len`, default 0; 1 in its Qwen3.6-27B recipe).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pure_draft_prefix_len: Option<usize>,
    /// Domino: SpecForge's `dflash_config.shift_label` (default false). `true` moves every
    /// label one token later (slot `k` predicts `anchor + k + 1`), which dflashd's block
    /// labels do not implement, so validation refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shift_label: Option<bool>,
    /// DSpark: rank of the Markov head's bigram table (`markov_w1` `[V, r]`, `markov_w2`
    /// `[V, r]`); 0 drafts without one (SpecForge `dflash_config.markov_rank`). Unset with
    /// `head = "dspark"`: 256, SpecForge's checked-in DSpark configs. Refused with another head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markov_rank: Option<usize>,
    /// DSpark: how the previous token biases a slot's logits, `"vanilla"`, `"gated"` or
    /// `"rnn"` (SpecForge `dflash_config.markov_head_type`). Unset: `"vanilla"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markov_head_type: Option<MarkovHeadType>,
    /// DSpark: a confidence head predicts each slot's acceptance probability (SpecForge
    /// `dflash_config.enable_confidence_head`). Unset: true, as SpecForge's DSpark configs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_confidence_head: Option<bool>,
    /// DSpark: the confidence head also reads the previous token's Markov embedding
    /// (SpecForge `dflash_config.confidence_head_with_markov`; needs a Markov head). Unset:
    /// true when there is a Markov head, as SpecForge's DSpark configs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence_head_with_markov: Option<bool>,
    /// DFlash2: taps of the grouped dynamic convolution around every attention and MLP, in
    /// 1..=block_size (SpecForge `dflash_config.conv_kernel_size`). Unset with
    /// `head = "dflash2"`: 2. Refused with another head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_kernel_size: Option<usize>,
    /// DFlash2: channels that share one dynamic kernel coefficient; divides hidden_size
    /// (SpecForge `dflash_config.conv_group_size`). Unset: 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_group_size: Option<usize>,
    /// DFlash2: rank of the candidate selector's codebooks (SpecForge
    /// `dflash_config.selector_rank`). Unset: 256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector_rank: Option<usize>,
    /// DFlash2: the unary top-K candidates the selector rescores at each slot (SpecForge
    /// `dflash_config.selector_top_k`), at most the vocabulary. Unset: 16.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector_top_k: Option<usize>,
    /// DFlash2: the unary logits are the LM head's times this (SpecForge
    /// `dflash_config.output_multiplier`), positive. Unset: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_multiplier: Option<f64>,
    /// DFlash2: then soft-capped to `s·tanh(U/s)` (SpecForge
    /// `dflash_config.final_logit_softcapping`), positive. Unset: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_logit_softcapping: Option<f64>,
    /// A drafter directory a fresh run starts from (a warm start) instead of random weights:
    /// `config.json` and `model.safetensors` (or its shards) as `dflashd export` writes them or
    /// SpecForge saves them, with a DFlash or a Domino head. Its config must match this
    /// section and the target; its trainable weights load before the first step, and the
    /// target's embedding and LM head stay the target's. A path (`~` and `${VAR}` expand;
    /// relative to the config file). Locked for a run: a resume continues from its checkpoint
    /// and never reads it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<String>,
}

/// `drafter.head`: what turns the drafter's hidden states into logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DrafterHead {
    /// The target's frozen LM head on the drafter's output (DFlash).
    #[default]
    Dflash,
    /// The LM head plus Domino's GRU logit correction on the slots after the pure-draft prefix.
    Domino,
    /// DSpark: next-token slots, a Markov bias and a confidence head, trained by distillation.
    Dspark,
    /// DFlash2: a grouped dynamic convolution in every layer, and a selector that rescores the
    /// unary top-K candidates by the previous token.
    Dflash2,
}

impl DrafterHead {
    /// The value as the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            DrafterHead::Dflash => "dflash",
            DrafterHead::Domino => "domino",
            DrafterHead::Dspark => "dspark",
            DrafterHead::Dflash2 => "dflash2",
        }
    }
}

/// `training.lambda_base_start` when unset: SpecForge's default (`DominoTrainStrategy`).
pub const DEFAULT_LAMBDA_BASE_START: f64 = 1.0;
/// `training.lambda_base_decay_ratio` when unset: SpecForge's default.
pub const DEFAULT_LAMBDA_BASE_DECAY_RATIO: f64 = 0.5;

fn default_rope_theta() -> f64 {
    1_000_000.0
}

fn default_rms_norm_eps() -> f64 {
    1e-6
}

/// Training precision. BF16 is the only one: the published DFlash drafters were trained with
/// BF16 parameters and activations on FP32 master weights, and FP8 is refused on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    Bf16,
}

impl Serialize for Precision {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("bf16")
    }
}

impl<'de> Deserialize<'de> for Precision {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let lower = text.to_ascii_lowercase();
        if lower == "bf16" || lower == "bfloat16" {
            return Ok(Precision::Bf16);
        }
        let fp8 = lower.contains("fp8")
            || lower.contains("float8")
            || lower.starts_with("e4m3")
            || lower.starts_with("e5m2");
        let hint = if fp8 {
            "; FP8 training is refused: DFlash drafters are trained in BF16 on FP32 master weights, \
             and FP8 changes the numerics the published drafters and acceptance figures rest on"
        } else {
            ""
        };
        Err(serde::de::Error::custom(format!(
            "expected \"bf16\", found \"{text}\"{hint}"
        )))
    }
}

/// `[training]`: optimisation (spec §2.8). Defaults are the paper/SpecForge values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainingSection {
    pub precision: Precision,
    pub epochs: u32,
    /// `false` only, the value old configs carry: the recipe trains 6 full epochs and has no
    /// early stopping, so validation refuses `true` rather than ignore it.
    pub early_stopping: bool,
    /// Optional cap on the schedule's optimizer steps: it ends at this step or after
    /// `epochs`, whichever comes first (SpecForge caps its Qwen3.6-27B recipe at 10000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// Anchors (draft blocks) sampled per sequence.
    pub num_anchors: usize,
    pub lr: f64,
    pub warmup_ratio: f64,
    pub grad_clip: f64,
    pub weight_decay: f64,
    pub adam_beta1: f64,
    pub adam_beta2: f64,
    pub adam_eps: f64,
    /// What the drafter minimises: `"dflash"` (the γ-decayed cross-entropy), `"dpace"` or
    /// `"tree"`. Locked for a run: the losses differ in what they reward and in their scale.
    pub objective: Objective,
    /// D-PACE's smoothing α of the drafter's confidence, `s_k = (1−α)·q_k + α`, in [0, 1]
    /// (SpecForge's `dpace_alpha`). Read only when `objective = "dpace"`; locked all the same.
    pub dpace_alpha: f64,
    /// What D-PACE's summed `Σ CE·m·w` is divided by: `"sequences"` (the default),
    /// `"weight_sum"`, `"anchors_per_sequence"` or `"tokens_per_sequence"`
    /// ([`DpaceNormalization`] says which framework each matches). Read only when
    /// `objective = "dpace"`; locked all the same: it sets the gradient's scale and how
    /// sequences and blocks weigh against each other. Left out of a written config at its
    /// default, so a config without it records as it did before the key existed.
    #[serde(skip_serializing_if = "DpaceNormalization::is_default")]
    pub dpace_normalization: DpaceNormalization,
    /// The tree objective's knobs (`[training.tree]`). Read only when `objective = "tree"`;
    /// locked all the same.
    #[serde(skip_serializing_if = "TreeSection::is_default")]
    pub tree: TreeSection,
    /// DSpark's loss weights (`[training.dspark]`). Read only with `drafter.head = "dspark"`;
    /// locked all the same.
    #[serde(skip_serializing_if = "DsparkSection::is_default")]
    pub dspark: DsparkSection,
    /// DFlash2's selector loss and its schedule (`[training.dflash2]`). Read only with
    /// `drafter.head = "dflash2"`; locked all the same.
    #[serde(skip_serializing_if = "Dflash2Section::is_default")]
    pub dflash2: Dflash2Section,
    /// Domino's base-anchored curriculum, `loss = (1−λ)·final + λ·base`: λ at step 0
    /// (SpecForge's `lambda_base_start`, default 1), in [0, 1]. Read only with
    /// `drafter.head = "domino"`; locked all the same.
    pub lambda_base_start: f64,
    /// The fraction of the run's steps over which λ falls linearly to 0, and stays there
    /// (SpecForge's `lambda_base_decay_ratio`, default 0.5), in [0, 1].
    pub lambda_base_decay_ratio: f64,
    /// γ of the per-position weight exp(-(k-1)/γ). Unset: the paper's value for the block size
    /// (7 for 16, 5 for 10, 4 for 8); other block sizes must set it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_decay_gamma: Option<f64>,
    /// Sequences per drafter device per optimizer step.
    pub batch_size: usize,
    /// Sequences are truncated to this many tokens.
    pub max_length: usize,
    /// Training rows are right-padded to a multiple of this many tokens (masked, harmless):
    /// at most `max_length / seq_len_multiple` distinct lengths, so device memory stays flat
    /// and kernel plans are reused. 1 pads each batch to its longest row only.
    pub seq_len_multiple: usize,
    /// Evaluate τ on the held-out split every this many optimizer steps.
    pub eval_every: u64,
    /// Online evaluation (chain and DDTree speculative decoding against the target, on one
    /// device, between steps) every this many optimizer steps and after the last; 0 turns it
    /// off. It never runs before the first step (the offline evaluation gives that baseline).
    /// Unset: [`DEFAULT_ONLINE_EVAL_EVERY`] where there are prompts (`online_eval_prompts`), off
    /// where there are none. Not locked: it changes what is measured, never what is trained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub online_eval_every: Option<u64>,
    /// A JSONL prompt file (`input_ids`, or a chat `conversations` list whose prompt is
    /// everything before the last assistant turn), or `"embedded"` for the held-out prompts
    /// shipped with the embedded target. Unset: `"embedded"` on the embedded target; on any
    /// other target online evaluation is off until a file is named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub online_eval_prompts: Option<String>,
    /// Decode at most this many prompts of the file (the first ones).
    pub online_eval_max_prompts: usize,
    /// Tokens generated per prompt at most (stop tokens end a prompt sooner).
    pub online_eval_max_new_tokens: usize,
    /// DDTree node budgets, each run beside the chain; empty: chain only. The offline
    /// evaluation scores its DDTree oracle τ at the same budgets.
    pub online_eval_tree_budgets: Vec<usize>,
    /// The DDTree node budget the drafter is served with: the headline tree figure of every
    /// evaluation (offline oracle τ and online DDTree τ). One of `online_eval_tree_budgets`
    /// when that list is not empty. Not locked: it changes what is measured only.
    pub serve_tree_budget: usize,
    pub checkpoint_every: u64,
    /// Checkpoints kept besides `latest`; older ones are deleted.
    pub keep_checkpoints: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// How an unsupervised label inside a block masks the slots after it.
    pub label_mask: LabelMask,
    /// Evaluate only the first this many held-out samples (0: all of them).
    pub eval_max_samples: usize,
    /// The in-training evaluation scores its DDTree oracle τ on one held-out block in this
    /// many, the same fixed subset at every evaluation (1: every block, as `dflashd eval`
    /// always does). For a run whose evaluation costs more than its steps, as the embedded
    /// default's on a CPU (docs/training.md#tree-metrics-offline).
    pub eval_tree_block_subsample: usize,
    /// Weighted positions per LM-head + cross-entropy chunk (bounds logits memory).
    pub loss_chunk_positions: usize,
    /// Anchors per row in one evaluation forward.
    pub eval_anchors_per_forward: usize,
    /// Drafter attention implementation; `dense_mask` exists as a test oracle.
    pub attention: AttentionBackend,
    /// Recompute each drafter layer but the last in the backward instead of keeping its
    /// activations from the forward: the activations saved for backward shrink from every
    /// layer's to about one layer's (plus each layer's input), for one more forward of the
    /// layers before the last. Gradients are unchanged (float rounding aside in `fc` and
    /// `hidden_norm`). Off by default: the embedded tiny drafter needs no memory saving and
    /// would pay the recompute; real-shape configs turn it on.
    pub activation_checkpointing: bool,
}

/// `training.objective`: the loss a run trains with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// DFlash's cross-entropy, each slot weighted `exp(-(k-1)/γ)`, divided by the sum of the
    /// weights (a weighted mean per draft position).
    #[default]
    Dflash,
    /// D-PACE (arXiv 2605.18810, SpecForge `loss_type = "dpace"`): each slot's cross-entropy
    /// weighted by the detached acceptance-gradient weight of its block, summed, divided as
    /// `training.dpace_normalization` says (by default by the number of sequences).
    Dpace,
    /// Trained for the DDTree it is served with (`engine/src/train/tree_objective.rs`): each
    /// gold prefix's path score against the budget-B best-first frontier, summed per block,
    /// divided by the number of sequences.
    Tree,
}

impl Objective {
    /// The value as the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Objective::Dflash => "dflash",
            Objective::Dpace => "dpace",
            Objective::Tree => "tree",
        }
    }
}

/// `training.dpace_normalization`: what D-PACE's numerator `Σ CE·m·w` (summed over every block
/// of the optimizer batch) is divided by. Each choice is a numerator and a normaliser that add
/// up over micro-batches and drafter ranks before the one division, so any topology trains what
/// one device does on the same global batch. "Supervised" slots are those with `m = 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpaceNormalization {
    /// The number of sequences, those without a supervised slot included: SpecForge at
    /// `a6b6b023` (the division by the batch size its PR #578 tests).
    #[default]
    Sequences,
    /// The sum of the D-PACE weights `Σ m·w`: SpecForge after DFlash2 and before PR #848
    /// (`loss_den = loss_weights.sum()`).
    WeightSum,
    /// Each sequence's sum divided by its anchors with at least one supervised slot, then the
    /// mean over the sequences that have such an anchor: SpecForge PR #848.
    AnchorsPerSequence,
    /// Each sequence's sum divided by its supervised slots (+1e-5), then the mean over all
    /// sequences: vLLM speculators' per-row token mean.
    TokensPerSequence,
}

impl DpaceNormalization {
    /// Every value, in the order the docs list them.
    pub const ALL: [DpaceNormalization; 4] = [
        DpaceNormalization::Sequences,
        DpaceNormalization::WeightSum,
        DpaceNormalization::AnchorsPerSequence,
        DpaceNormalization::TokensPerSequence,
    ];

    /// The value as the config writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            DpaceNormalization::Sequences => "sequences",
            DpaceNormalization::WeightSum => "weight_sum",
            DpaceNormalization::AnchorsPerSequence => "anchors_per_sequence",
            DpaceNormalization::TokensPerSequence => "tokens_per_sequence",
        }
    }

    /// The value the config spells `text`, if any.
    pub fn from_name(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|n| n.as_str() == text)
    }

    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// `training.dpace_alpha` when unset: SpecForge's and the D-PACE paper's default.
pub const DEFAULT_DPACE_ALPHA: f64 = 0.5;

/// `training.online_eval_tree_budgets` when unset: DDTree's τ keeps rising with the budget
/// while its speedup peaks in between, so the evaluation spans both sides of the serving one.
pub const DEFAULT_TREE_BUDGETS: [usize; 4] = [8, 16, 32, 64];

/// `training.serve_tree_budget` when unset.
pub const DEFAULT_SERVE_TREE_BUDGET: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelMask {
    /// SpecForge: each slot is masked by its own label's loss mask only.
    #[default]
    Independent,
    /// Stop at the first unsupervised label (safer for multi-turn data).
    Cumulative,
}

/// How the drafter's block attention is computed: the one enum for it, from the config
/// (`training.attention`) through the engine's kernels to `dflashd eval --attention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionBackend {
    #[default]
    BlockSparse,
    DenseMask,
}

impl Default for TrainingSection {
    fn default() -> Self {
        Self {
            precision: Precision::Bf16,
            epochs: 6,
            early_stopping: false,
            max_steps: None,
            num_anchors: 512,
            lr: 6e-4,
            warmup_ratio: 0.04,
            grad_clip: 1.0,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_eps: 1e-8,
            objective: Objective::Dflash,
            dpace_alpha: DEFAULT_DPACE_ALPHA,
            dpace_normalization: DpaceNormalization::Sequences,
            tree: TreeSection::default(),
            dspark: DsparkSection::default(),
            dflash2: Dflash2Section::default(),
            lambda_base_start: DEFAULT_LAMBDA_BASE_START,
            lambda_base_decay_ratio: DEFAULT_LAMBDA_BASE_DECAY_RATIO,
            loss_decay_gamma: None,
            batch_size: 1,
            max_length: 3072,
            seq_len_multiple: 64,
            eval_every: 500,
            online_eval_every: None,
            online_eval_prompts: None,
            online_eval_max_prompts: 16,
            online_eval_max_new_tokens: 128,
            online_eval_tree_budgets: DEFAULT_TREE_BUDGETS.to_vec(),
            serve_tree_budget: DEFAULT_SERVE_TREE_BUDGET,
            checkpoint_every: 500,
            keep_checkpoints: 3,
            grad_accum: 1,
            label_mask: LabelMask::Independent,
            eval_max_samples: 0,
            eval_tree_block_subsample: 1,
            loss_chunk_positions: 2048,
            eval_anchors_per_forward: 256,
            attention: AttentionBackend::BlockSparse,
            activation_checkpointing: false,
        }
    }
}

/// `training.online_eval_every` when unset: half as often as the default offline evaluation
/// (500). An online evaluation decodes prompt by prompt, one target forward per round, so
/// each costs more than an offline one of the same prompts; at this cadence it stays a small
/// share of a run of thousands of steps, and is still frequent enough to see a gap opening
/// before the run ends.
pub const DEFAULT_ONLINE_EVAL_EVERY: u64 = 1000;

/// The value of `training.online_eval_prompts` that selects the held-out prompts shipped with
/// the embedded target.
pub const EMBEDDED_PROMPTS: &str = "embedded";

impl TrainingSection {
    /// Steps between online evaluations after defaults; 0: off (turned off, or no prompts).
    pub fn online_eval_interval(&self) -> u64 {
        match self.online_eval_prompts {
            Some(_) => self.online_eval_every.unwrap_or(DEFAULT_ONLINE_EVAL_EVERY),
            None => 0,
        }
    }
}

/// The paper's γ for a block size, where one is published.
pub fn paper_loss_decay_gamma(block_size: usize) -> Option<f64> {
    match block_size {
        16 => Some(7.0),
        10 => Some(5.0),
        8 => Some(4.0),
        _ => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// SpecForge-style `{"conversations": [{"role", "content", "reasoning_content"?}]}`.
    Chat,
    /// `{"input_ids": [...], "loss_mask": [...]}`.
    Pretokenized,
}

/// The value of `data.train_file` that selects the small dataset shipped with dflashd.
pub const EMBEDDED_DATA: &str = "embedded";

/// `[data]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// JSONL file, or `"embedded"` for the dataset shipped with dflashd.
    pub train_file: String,
    #[serde(default = "default_data_format")]
    pub format: DataFormat,
    /// `tokenizer.json` for chat data. Unset: `<target.model>/tokenizer.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// A Jinja chat template file. Unset: the template shipped with the target model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// Share of samples held out for τ evaluation (chosen deterministically from the seed).
    #[serde(default = "default_held_out_fraction")]
    pub held_out_fraction: f64,
    /// An exact number of held-out samples; when set it replaces `held_out_fraction`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out_samples: Option<usize>,
    /// The longest data line accepted (`"16 MiB"` or bytes): a longer one is a bad line,
    /// skipped without being read into memory. Bounds the loader's memory, which for a chat
    /// row is many times the row's size while it is tokenized.
    #[serde(default = "default_max_line_bytes")]
    pub max_line_bytes: super::bytesize::ByteSize,
}

/// `data.max_line_bytes` when unset: well above real chat rows, low enough that tokenizing
/// one stays within a few GB.
pub const DEFAULT_MAX_LINE_BYTES: super::bytesize::ByteSize = super::bytesize::ByteSize(16 << 20);

impl DataSection {
    /// How many of `total` samples are held out.
    pub fn held_out_count(&self, total: usize) -> usize {
        self.held_out_samples
            .unwrap_or_else(|| (self.held_out_fraction * total as f64).ceil() as usize)
            .min(total)
    }
}

fn default_data_format() -> DataFormat {
    DataFormat::Chat
}

fn default_max_line_bytes() -> super::bytesize::ByteSize {
    DEFAULT_MAX_LINE_BYTES
}

fn default_held_out_fraction() -> f64 {
    0.01
}

/// `[topology]`: one worker thread per listed device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologySection {
    /// Each holds a frozen target replica and produces hidden states.
    pub target_devices: Vec<Device>,
    /// Data-parallel drafter replicas; gradients are averaged across them every step.
    pub drafter_devices: Vec<Device>,
}
