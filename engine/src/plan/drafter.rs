//! One drafter rank's memory, term by term as today's code allocates it.
//!
//! File:line references are to the code at the commit that wrote this module. Sizes are in
//! bytes; `e` is the activation (and parameter) element size of the device
//! ([`ActivationPrecision`]), `Q = B·N·bs` the draft positions, `S` the context length, `H`
//! the hidden size, `A = Hq·D`, `K = Hkv·D`, `I` the intermediate size, `V` the vocabulary.
use super::shape::{ActivationPrecision, StepShape};
use super::Consumer;
use crate::collective::bucket::ALLREDUCE_BUCKET_ELEMENTS;
use crate::model::attention::chunk_schedule::{choose_chunks, ContextChunk};
use crate::model::attention::{chunk_costs, LayerRule, DEFAULT_CHUNK_SCORE_ELEMENTS};
use crate::model::drafter::{DrafterConfig, DrafterHead, DsparkConfig, LayerType, MarkovHeadType};

/// What a drafter rank holds: `resident` exists between steps (parameters, optimizer state,
/// tables, buffers, queued items), `step` is what one step allocates at its peak (what the
/// benchmark's memory pass measures as live step memory on CPU).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DrafterMemory {
    pub resident: Vec<Consumer>,
    /// The consumers alive at the step's peak.
    pub step: Vec<Consumer>,
    /// Which phase of the step peaks: `"loss"`, `"backward"` or `"optimizer"`.
    pub peak_phase: &'static str,
    /// Fused attention calls per layer, per layer (the chunk schedule of its rule).
    pub chunks_per_layer: Vec<usize>,
}

impl DrafterMemory {
    pub fn resident_bytes(&self) -> f64 {
        self.resident.iter().map(|c| c.bytes).sum()
    }

    pub fn step_bytes(&self) -> f64 {
        self.step.iter().map(|c| c.bytes).sum()
    }

    pub fn peak_bytes(&self) -> f64 {
        self.resident_bytes() + self.step_bytes()
    }
}

/// Where the rank runs and what surrounds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankContext {
    pub precision: ActivationPrecision,
    /// Drafter ranks in the group (> 1: an fp32 all-reduce bucket exists).
    pub ranks: usize,
    /// The frozen embedding and LM head are the target's own tensors (one device for both
    /// roles, same dtype): the replica's `to_device().to_kind()` copies nothing.
    pub tables_shared_with_target: bool,
    /// Hidden-state items that can wait in this rank's queue, and the bytes of one.
    pub queued_items: usize,
    pub item_bytes: f64,
    /// `training.activation_checkpointing`: the layers before the last keep only their inputs
    /// and are recomputed in the backward (`drafter/model.rs::Drafter::forward_backward`).
    pub activation_checkpointing: bool,
}

impl RankContext {
    /// One drafter rank alone: no all-reduce bucket, no queue, no activation checkpointing.
    /// What the memory checks, the presets and the measured steps plan for.
    pub fn alone(precision: ActivationPrecision, tables_shared_with_target: bool) -> Self {
        Self {
            precision,
            ranks: 1,
            tables_shared_with_target,
            queued_items: 0,
            item_bytes: 0.0,
            activation_checkpointing: false,
        }
    }
}

/// Trainable parameters of the drafter (`drafter/model.rs::Drafter::new`, `layer.rs::new`),
/// a Domino or DSpark head's included.
pub fn drafter_params(d: &DrafterConfig) -> f64 {
    let (h, a, k, i) = dims(d);
    let per_layer = h * a + 2.0 * h * k + a * h + 3.0 * h * i + 2.0 * h + 2.0 * d.head_dim as f64;
    d.feature_size() as f64 * h
        + 2.0 * h
        + d.layer_types.len() as f64 * per_layer
        + domino_params(d)
        + dspark_params(d)
        + dflash2_params(d)
}

/// DFlash2's parameters (`drafter/dflash2.rs`): per layer two convolutions, each a
/// `base_kernel` `[2, taps, H]` and a `kernel_projection` `[2·taps·G, H]` (`G = H / group`);
/// the selector's codebooks `[V, r]` each and `hidden_projection` `[r, H]`. 0 without the head.
pub fn dflash2_params(d: &DrafterConfig) -> f64 {
    let Some(c) = d.head.dflash2() else {
        return 0.0;
    };
    let (h, v, r) = (
        d.hidden_size as f64,
        d.vocab_size as f64,
        c.selector_rank as f64,
    );
    let taps = c.conv_kernel_size as f64;
    let groups = c.conv_groups(d.hidden_size) as f64;
    let conv = 2.0 * taps * h + 2.0 * taps * groups * h;
    d.layer_types.len() as f64 * 2.0 * conv + 2.0 * v * r + r * h
}

/// The Domino head's parameters (`drafter/domino.rs::DominoHead::new`): the GRU's
/// `weight_ih_l0` `[3G, H]` and `weight_hh_l0` `[3G, G]`, `embed_proj.0` `[E, H + G]` and
/// `embed_proj.2` `[V, E]`; 0 without the head.
pub fn domino_params(d: &DrafterConfig) -> f64 {
    let Some(m) = d.head.domino() else {
        return 0.0;
    };
    let (h, g, e) = (
        d.hidden_size as f64,
        m.gru_hidden_dim as f64,
        m.emb_dim as f64,
    );
    3.0 * g * h + 3.0 * g * g + e * (h + g) + d.vocab_size as f64 * e
}

/// DSpark's heads' parameters (`drafter/dspark.rs::DsparkHead::new`): the Markov head's
/// `markov_w1` and `markov_w2`, `[V, r]` each, with the gated variant's `gate_proj` `[r, H + r]`
/// and its bias `[r]`, or the RNN's `joint_proj` `[3r, 2r + H]` and its bias `[3r]`; the
/// confidence head's `proj` `[1, H]` (`[1, H + r]` when it reads the Markov embedding too) and
/// its bias `[1]`. 0 without the head.
pub fn dspark_params(d: &DrafterConfig) -> f64 {
    let Some(c) = d.head.dspark() else {
        return 0.0;
    };
    let (h, r, v) = (
        d.hidden_size as f64,
        c.markov_rank as f64,
        d.vocab_size as f64,
    );
    let markov = if c.has_markov_head() {
        2.0 * v * r
            + match c.markov_head_type {
                MarkovHeadType::Vanilla => 0.0,
                MarkovHeadType::Gated => r * (h + r) + r,
                MarkovHeadType::Rnn => 3.0 * r * (2.0 * r + h) + 3.0 * r,
            }
    } else {
        0.0
    };
    let confidence = if c.confidence_head {
        confidence_input_width(d, c) + 1.0
    } else {
        0.0
    };
    markov + confidence
}

/// The confidence head's input width: `H`, or `H + r` when it reads `[h ; W₁[prev]]`.
pub(crate) fn confidence_input_width(d: &DrafterConfig, c: &DsparkConfig) -> f64 {
    let h = d.hidden_size as f64;
    if c.confidence_head_with_markov {
        h + c.markov_rank as f64
    } else {
        h
    }
}

/// What a Domino head adds to a step's activations outside the loss chunks
/// (`train/replica.rs`, `drafter/domino.rs::slot_states`), for `q` draft positions: the
/// teacher-forced label embeddings `[Q, H]`; the GRU over `bs − 1` tokens of each block, its
/// input copy `[., H]` (kept for the input projection's weight gradient) and, per step, the
/// hidden projection `[., 3G]` and the gates, candidate, `h − n` and state the next step
/// reads, `[., G]` each, all kept for backward (the input projection `[., 3G]` is not: the
/// additions that read it save nothing); and the slot-shaped states `[Q, G]` with their
/// detached leaf's gradient (the leaf shares the states' storage). Held to the memory pass by
/// `bench/tests/live_memory.rs` (`small-domino`).
fn domino_activations(d: &DrafterConfig, q: f64, e: f64) -> Option<Consumer> {
    let m = d.head.domino()?;
    let (h, g, bs) = (
        d.hidden_size as f64,
        m.gru_hidden_dim as f64,
        d.block_size as f64,
    );
    let read = q * (bs - 1.0) / bs;
    let gru = read * (h + 3.0 * g + 5.0 * g) * e;
    Some(Consumer::new(
        "Domino label embeddings and GRU states",
        q * h * e + gru + 2.0 * q * g * e,
    ))
}

/// What a DSpark head adds to a step's activations outside the loss chunks
/// (`train/replica.rs::dspark_inputs`, `train/dspark.rs::markov_latents`), for `q` draft
/// positions: the target's last hidden state gathered per slot `[Q, H_target]`; the previous
/// tokens (i64), weights (f32) and validity (bool) DSpark's loss reads; and, with a Markov head,
/// the teacher-forced latents of every slot with what their variant keeps for backward, and
/// the latents' detached leaf's gradient `[Q, r]` (the leaf shares the latents' storage).
/// Vanilla keeps the latents `W₁[prev]` `[Q, r]` alone; gated keeps the embedding, the gate's
/// input `[Q, H + r]`, the gate and the latents; the RNN keeps per slot its input
/// `[., 2r + H]`, the keep gate, the candidate, `s − candidate` and the latent (`[., r]`
/// each), and the latents stacked once more.
fn dspark_activations(d: &DrafterConfig, q: f64, e: f64) -> Option<Consumer> {
    let c = d.head.dspark()?;
    let (h, r) = (d.hidden_size as f64, c.markov_rank as f64);
    let teacher = q * d.target_hidden_size as f64 * e;
    let inputs = q * (8.0 + 4.0 + 1.0);
    let markov = if c.has_markov_head() {
        let kept = match c.markov_head_type {
            MarkovHeadType::Vanilla => r,
            MarkovHeadType::Gated => h + 4.0 * r,
            MarkovHeadType::Rnn => h + 7.0 * r,
        };
        q * (kept + r) * e
    } else {
        0.0
    };
    Some(Consumer::new(
        "DSpark teacher states and Markov latents",
        teacher + inputs + markov,
    ))
}

/// Bytes of a loss chunk's vocabulary-wide tensors per position (`train/loss.rs::weighted_ce`
/// and `weighted_ce_backward`): the logits (e), their fp32 copy off fp32, the saved
/// log-softmax, the nll gradient and the log-softmax gradient; and, with a Domino head
/// (`train/domino.rs::chunked_terms`), what it adds per position and per corrected position.
/// The one backward runs one cross-entropy's branch, then the other's: the first's
/// log-softmax is released once its backward has run, but its gradient waits for the
/// second's, both summing into the base logits. So per position it adds the corrected logits
/// (fp32, the base logits with the delta added at the corrected rows) and that waiting
/// gradient, 8 bytes; the second branch's log-softmax and two gradients take the places of
/// DFlash's. Per corrected position it adds the logit delta `embed_proj` writes (e) and its
/// fp32 copy off fp32.
///
/// A DSpark head's chunk (`train/dspark.rs::chunk_terms`) peaks in its telemetry, before its
/// backward: alive then are the base logits and the corrected ones (fp32; one tensor without a
/// Markov head), the cross-entropy's log-softmax, the teacher's distribution, `q`, the
/// `q − p` the L1's `abs` keeps, and the base logits' softmax, `p` difference and its `abs`;
/// nine fp32 tensors, eight without a Markov head. Its bf16 matmul outputs are cast and
/// released earlier, and its backward holds fewer.
struct LossChunkVocabBytes {
    per_position: f64,
    per_corrected_position: f64,
}

fn loss_chunk_vocab_bytes(d: &DrafterConfig, e: f64) -> LossChunkVocabBytes {
    let fp32_copy = if e == 4.0 { 0.0 } else { 4.0 };
    let dflash = e + fp32_copy + 12.0;
    match d.head {
        DrafterHead::Dflash => LossChunkVocabBytes {
            per_position: dflash,
            per_corrected_position: 0.0,
        },
        DrafterHead::Domino(_) => LossChunkVocabBytes {
            per_position: dflash + 4.0 + 4.0,
            per_corrected_position: e + fp32_copy,
        },
        DrafterHead::Dspark(c) => LossChunkVocabBytes {
            per_position: if c.has_markov_head() { 36.0 } else { 32.0 },
            per_corrected_position: 0.0,
        },
        // `train/dflash2.rs`: a chunk runs the head over every slot of its blocks, slot 0 and
        // unsupervised slots included (bs/(bs−1) of its weighted positions when its blocks are
        // whole). Its peak is the log-softmax's backward: alive then are the fp32 unary scores
        // the chunk holds, their log-softmax, the nll gradient, the log-softmax's gradient, and
        // the dense `[c, V]` gradient the unary top-K's backward wrote (the selector's nodes
        // are younger, so they run first); with a soft cap, also the tanh its backward keeps.
        // Five fp32 tensors, six with a soft cap, at any activation precision: the LM head's
        // logits, their fp32 copy, the multiplier's product and the cap's quotient save nothing
        // for backward and are freed once the unary scores are formed. Held to the loss's live
        // memory by `bench/tests/live_memory.rs` (fp32; bf16 on CPU holds the same five). A
        // step that does not train the selector through the unary scores (α_eff = 0, or
        // `selector_stop_gradient`) holds one fewer; the plan counts the step that does.
        DrafterHead::Dflash2(c) => {
            let bs = d.block_size as f64;
            let slots = bs / (bs - 1.0).max(1.0);
            let cap = if c.final_logit_softcapping.is_some() {
                4.0
            } else {
                0.0
            };
            LossChunkVocabBytes {
                per_position: slots * (20.0 + cap),
                per_corrected_position: 0.0,
            }
        }
    }
}

/// What a DFlash2 selector adds to a loss chunk of `c` weighted positions besides its
/// vocabulary-wide tensors: per slot of the chunk's blocks, the candidates' successor rows
/// `[K, r]` and their gradient, and the codebooks' dense gradients `[V, r]` each: the
/// selector's backward writes them before the log-softmax's backward, where the chunk peaks,
/// so every chunk's peak holds them, the first's included. 0 without the head.
fn dflash2_chunk_bytes(d: &DrafterConfig, c: f64, e: f64) -> f64 {
    let Some(head) = d.head.dflash2() else {
        return 0.0;
    };
    let bs = d.block_size as f64;
    let slots = c * bs / (bs - 1.0).max(1.0);
    let (k, r, v) = (
        head.selector_top_k as f64,
        head.selector_rank as f64,
        d.vocab_size as f64,
    );
    2.0 * slots * k * r * e + 2.0 * v * r * e
}

/// What a DSpark head adds to a loss chunk of `c` positions besides its vocabulary-wide
/// tensors (`train/dspark.rs::chunked_terms`, `chunk_terms`): the chunk's teacher states
/// `[c, H_target]`; with a Markov head, its latents `[c, r]` (kept by `W₂` for its weight
/// gradient) and their gradient, and `W₂`'s gradient `[V, r]`, which the first chunk's
/// backward writes and every later chunk's peak holds; with a confidence head reading the
/// Markov embedding, its input `[c, H + r]` and `W₁`'s gradient `[V, r]` (the first chunk's
/// backward writes it too). 0 without a DSpark head.
fn dspark_chunk_bytes(d: &DrafterConfig, c: f64, e: f64) -> f64 {
    let Some(head) = d.head.dspark() else {
        return 0.0;
    };
    let (r, v) = (head.markov_rank as f64, d.vocab_size as f64);
    let teacher = c * d.target_hidden_size as f64 * e;
    let markov = if head.has_markov_head() {
        2.0 * c * r * e + v * r * e
    } else {
        0.0
    };
    let confidence = if head.confidence_head && head.confidence_head_with_markov {
        c * confidence_input_width(d, head) * e + v * r * e
    } else {
        0.0
    };
    teacher + markov + confidence
}

/// What the tree objective adds to a loss chunk of `c` positions
/// (`train/tree_objective.rs::tree_chunk_weights`): per position its top `min(B, V)` logits
/// (f32) and their indices (i64), those values as log-probabilities (f32) and in f64 on their
/// way to the host; a Domino head does it for the corrected and the base logits, one after the
/// other. No further vocabulary-wide tensor: the labels' log-probabilities come from the
/// cross-entropy the chunk already holds.
fn tree_chunk_bytes(d: &DrafterConfig, s: &StepShape, c: f64) -> f64 {
    let k = s.tree_budget.min(d.vocab_size).max(0) as f64;
    c * k * (4.0 + 8.0 + 4.0 + 8.0)
}

fn layer_params(d: &DrafterConfig) -> f64 {
    let (h, a, k, i) = dims(d);
    h * a + 2.0 * h * k + a * h + 3.0 * h * i + 2.0 * h + 2.0 * d.head_dim as f64
}

fn dims(d: &DrafterConfig) -> (f64, f64, f64, f64) {
    (
        d.hidden_size as f64,
        (d.num_attention_heads * d.head_dim) as f64,
        (d.num_key_value_heads * d.head_dim) as f64,
        d.intermediate_size as f64,
    )
}

pub(crate) fn layer_rule(d: &DrafterConfig, t: LayerType) -> LayerRule {
    match t {
        LayerType::Full => LayerRule::Full,
        LayerType::Sliding => LayerRule::Sliding {
            window: d.sliding_window.unwrap_or(i64::MAX / 4),
        },
    }
}

/// The chunks `attention/block_sparse.rs::ChunkSchedule::new` schedules for `rule` (the default
/// budget, `chunk_schedule.rs::DEFAULT_CHUNK_SCORE_ELEMENTS`) over `batch` rows of `seq_len` context tokens and their
/// row-major `[batch, width]` anchors and validity.
pub(crate) fn chunk_schedule(
    d: &DrafterConfig,
    (batch, seq_len): (i64, i64),
    anchors: &[i64],
    keep: &[bool],
    rule: LayerRule,
) -> Vec<ContextChunk> {
    let costs = chunk_costs(
        d.block_size,
        batch,
        d.num_attention_heads,
        DEFAULT_CHUNK_SCORE_ELEMENTS,
    );
    let width = anchors.len() / batch.max(1) as usize;
    choose_chunks(rule, anchors, keep, (batch as usize, width), seq_len, costs).chunks
}

/// Bytes RMSNorm saves for backward over `rows × width` (`layers/norm.rs::rms_norm`): fp32
/// runs libtorch's `rms_norm`, which keeps its input and one fp32 rstd per row; bf16 runs
/// `lean_normalized_fp32`, which keeps its bf16 input (not an fp32 copy of it), the rstd and
/// the bf16 x̂.
fn norm_saved(p: ActivationPrecision, rows: f64, width: f64) -> f64 {
    match p {
        ActivationPrecision::Fp32Cpu => rows * width * 4.0 + rows * 4.0,
        ActivationPrecision::Bf16Cuda => rows * width * (2.0 + 2.0) + rows * 4.0,
    }
}

/// One drafter rank's memory at step shape `s`.
pub fn drafter_memory(d: &DrafterConfig, s: &StepShape, rank: RankContext) -> DrafterMemory {
    let p = rank.precision;
    let e = p.bytes();
    let (h, _, _, i) = dims(d);
    let (b, seq) = (s.batch as f64, s.seq_len as f64);
    let q = s.draft_positions(d.block_size) as f64;
    let bs = d.block_size as f64;
    let group = (d.num_attention_heads / d.num_key_value_heads.max(1)) as f64;
    let params = drafter_params(d);

    let resident = resident_memory(d, rank, params);

    // Attention per rule: the chunk schedule (context key ranges widened to the key quantum), its
    // masks (shared by the layers of a rule, `ChunkSchedule::new`; off CPU their rows are
    // repeated per query head of a group, `GroupedHeads::Folded`, replacing the unrepeated
    // ones) and the K/V copies each layer's calls save (the per-chunk `cat` of the context
    // range and the chunk's own block keys; never repeated per query head).
    let rules: Vec<LayerRule> = d.layer_types.iter().map(|&t| layer_rule(d, t)).collect();
    let schedules = chunk_schedules_per_rule(d, s, &rules);
    let schedule_of = |r: LayerRule| {
        &schedules
            .iter()
            .find(|(x, _)| *x == r)
            .expect("scheduled")
            .1
    };
    let chunk_keys = |c: &ContextChunk| chunk_rows_and_keys(bs, c);
    // Off CPU the group is folded into the kernel's rows (block_sparse.rs `GroupedHeads`).
    let folded = !p.native_gqa() && group > 1.0;
    let mask_fold = if folded { group } else { 1.0 };
    let masks: f64 = schedules
        .iter()
        .flat_map(|(_, chunks)| chunks.iter())
        .map(|c| chunk_rows_and_keys(bs, c))
        .map(|(rows, keys)| b * rows * keys * e * mask_fold)
        .sum();

    let mut step = shared_by_all_layers(d, s, p, masks);
    // What stays from the forward while an earlier layer runs again (with checkpointing): not
    // the last layer's activations or the output, which its backward freed.
    let shared = step.clone();

    let (saved, kv_copies, per_layer) =
        saved_per_layer(d, s, p, &rules, schedule_of, chunk_keys, folded);
    // Backward of one layer's MLP (`DecoderLayer::forward_with_context`): the gradient flowing in and out [Q, H]
    // twice, the gradients of silu·up and of up [Q, I], and that layer's parameter gradients.
    let mlp_backward = 2.0 * q * h * e + 2.0 * q * i * e + layer_params(d) * e;
    // With checkpointing (drafter/model.rs::Drafter::forward_backward) the context's gradient
    // collects on a leaf `[B, S, H]` from the last layer's backward on.
    let context_grad = b * seq * h * e;
    // The phase after the loss when layer `n` (before the last) runs again: the inputs of the
    // layers before it (its own is in its saved activations), its activations and K/V copies,
    // the gradient of its output and the product that backpropagates it (`backpropagate`),
    // the context's gradient, the parameter gradients of the layers from it on, and its MLP's
    // backward.
    let recompute_phase = rank
        .activation_checkpointing
        .then(|| {
            let phase = RecomputePhase {
                context_grad,
                mlp_backward,
            };
            phase.peak(d, (q, h, e), &saved, &kv_copies)
        })
        .flatten();
    step.extend(saved_for_backward(
        rank.activation_checkpointing,
        q * h * e,
        &saved,
        &kv_copies,
    ));
    step.push(Consumer::new(
        "final norm and drafter output",
        norm_saved(p, q, h) + q * h * e,
    ));
    step.extend(domino_activations(d, q, e));
    step.extend(dspark_activations(d, q, e));

    let (step_peak_extra, peak_phase) =
        loss_or_backward_peak(d, s, rank, mlp_backward, context_grad);
    let forward_saved: f64 = step.iter().map(|c| c.bytes).sum();
    let shared_bytes: f64 = shared.iter().map(|c| c.bytes).sum();
    if let Some((n, bytes)) = recompute_phase {
        if shared_bytes + bytes > forward_saved + step_peak_extra.bytes
            && shared_bytes + bytes > optimizer_phase_bytes(d, params, e)
        {
            let step = recompute_consumers(shared, n, bytes, q * h * e, &saved, &kv_copies);
            return DrafterMemory {
                resident,
                step,
                peak_phase: "recompute",
                chunks_per_layer: per_layer,
            };
        }
    }
    let optimizer_phase = optimizer_phase_bytes(d, params, e);
    if optimizer_phase > forward_saved + step_peak_extra.bytes {
        let gradients = params * e;
        let step = vec![
            Consumer::new("gradients", gradients),
            Consumer::new("optimizer temporaries", optimizer_phase - gradients),
        ];
        return DrafterMemory {
            resident,
            step,
            peak_phase: "optimizer",
            chunks_per_layer: per_layer,
        };
    }
    step.push(step_peak_extra);
    DrafterMemory {
        resident,
        step,
        peak_phase,
        chunks_per_layer: per_layer,
    }
}

/// The step's tensors shared by all layers (`Drafter::prepare` and `Drafter::context`, and the
/// labels and weights `DrafterReplica::forward_backward` builds), with `masks` the
/// attention masks' bytes.
fn shared_by_all_layers(
    d: &DrafterConfig,
    s: &StepShape,
    p: ActivationPrecision,
    masks: f64,
) -> Vec<Consumer> {
    let e = p.bytes();
    let h = d.hidden_size as f64;
    let (b, seq) = (s.batch as f64, s.seq_len as f64);
    let q = s.draft_positions(d.block_size) as f64;
    vec![
        Consumer::new("block embeddings", q * h * e),
        Consumer::new(
            "fc output and context (hidden_norm)",
            norm_saved(p, b * seq, h) + b * seq * h * e,
        ),
        Consumer::new(
            "RoPE tables (fp32)",
            2.0 * (seq + q) * d.head_dim as f64 * 4.0 + q * 8.0,
        ),
        Consumer::new("attention masks", masks),
        Consumer::new("labels, weights, ids", q * (8.0 + 4.0 + 8.0)),
    ]
}

/// A chunk's query rows (its blocks × `block_size`) and the keys they attend: the context
/// range and the chunk's own block keys.
fn chunk_rows_and_keys(block_size: f64, c: &ContextChunk) -> (f64, f64) {
    let rows = (c.end - c.start) as f64 * block_size;
    (rows, c.keys.map_or(0.0, |(lo, hi)| (hi - lo) as f64) + rows)
}

/// One chunk schedule per distinct attention rule among `rules` (layers of one rule share it).
fn chunk_schedules_per_rule(
    d: &DrafterConfig,
    s: &StepShape,
    rules: &[LayerRule],
) -> Vec<(LayerRule, Vec<ContextChunk>)> {
    let mut schedules: Vec<(LayerRule, Vec<ContextChunk>)> = Vec::new();
    for &r in rules {
        if !schedules.iter().any(|(x, _)| *x == r) {
            let chunks = chunk_schedule(d, (s.batch, s.seq_len), &s.anchors, &s.keep, r);
            schedules.push((r, chunks));
        }
    }
    schedules
}

/// What the forward leaves saved for the backward: with activation checkpointing, the inputs of
/// the layers before the last (layer 0's are the block embeddings, the last layer's are in its
/// saved activations) and the last layer's activations and K/V copies; without, every layer's.
/// `layer_input` is one layer's input `[Q, H]` in bytes.
fn saved_for_backward(
    checkpointing: bool,
    layer_input: f64,
    saved: &[f64],
    kv_copies: &[f64],
) -> Vec<Consumer> {
    let layers = saved.len();
    let last = layers - 1;
    if checkpointing {
        vec![
            Consumer::new(
                format!(
                    "layer inputs kept for recomputation ({} layers)",
                    layers.saturating_sub(2)
                ),
                layers.saturating_sub(2) as f64 * layer_input,
            ),
            Consumer::new(
                "activations saved for backward (the last layer, without K/V copies)",
                saved[last],
            ),
            Consumer::new(
                "attention K/V copies saved for backward (the last layer)",
                kv_copies[last],
            ),
        ]
    } else {
        vec![
            Consumer::new(
                "activations saved for backward (all layers, without K/V copies)",
                saved.iter().sum::<f64>(),
            ),
            Consumer::new(
                "attention K/V copies saved for backward",
                kv_copies.iter().sum::<f64>(),
            ),
        ]
    }
}

/// The step's consumers while layer `n` runs again under checkpointing: what all layers
/// share, the inputs of the layers before it, its recomputed activations and K/V copies, and
/// the rest of the phase's `bytes` (gradients in flight, parameter gradients so far).
fn recompute_consumers(
    shared: Vec<Consumer>,
    n: usize,
    bytes: f64,
    layer_input: f64,
    saved: &[f64],
    kv_copies: &[f64],
) -> Vec<Consumer> {
    let inputs = n.saturating_sub(1) as f64 * layer_input;
    let mut step = shared;
    step.push(Consumer::new(
        format!(
            "layer inputs kept for recomputation ({} layers)",
            n.saturating_sub(1)
        ),
        inputs,
    ));
    step.push(Consumer::new(
        format!("activations of layer {n}, recomputed (without K/V copies)"),
        saved[n],
    ));
    step.push(Consumer::new(
        format!("attention K/V copies of layer {n}, recomputed"),
        kv_copies[n],
    ));
    step.push(Consumer::new(
        format!("backward of layer {n} (gradients in flight, parameter gradients so far)"),
        bytes - inputs - saved[n] - kv_copies[n],
    ));
    step
}

/// What the backward holds beside the layer being recomputed.
struct RecomputePhase {
    context_grad: f64,
    mlp_backward: f64,
}

impl RecomputePhase {
    /// The layer (before the last) whose recomputation holds the most, and how much, with
    /// `(q, h, e)` the draft positions, hidden size and activation bytes.
    fn peak(
        &self,
        d: &DrafterConfig,
        (q, h, e): (f64, f64, f64),
        saved: &[f64],
        kv_copies: &[f64],
    ) -> Option<(usize, f64)> {
        let last = saved.len().checked_sub(1)?;
        (0..last)
            .map(|n| {
                let bytes = n.saturating_sub(1) as f64 * q * h * e
                    + saved[n]
                    + kv_copies[n]
                    + 2.0 * q * h * e
                    + self.context_grad
                    + (last - n) as f64 * layer_params(d) * e
                    + self.mlp_backward;
                (n, bytes)
            })
            .max_by(|x, y| x.1.total_cmp(&y.1))
    }
}

/// The larger of the two phases after the forward: the loss over one chunk of weighted
/// positions, or the last layer's backward with its gradients in flight.
fn loss_or_backward_peak(
    d: &DrafterConfig,
    s: &StepShape,
    rank: RankContext,
    mlp_backward: f64,
    context_grad: f64,
) -> (Consumer, &'static str) {
    let e = rank.precision.bytes();
    let h = d.hidden_size as f64;
    let vocab = d.vocab_size as f64;
    let q = s.draft_positions(d.block_size) as f64;
    // Loss (`train/loss.rs::weighted_ce`): chunks of `c` weighted positions through the head.
    let weighted = s.weighted_positions as f64;
    let c = weighted.min(s.loss_chunk_positions.max(1) as f64);
    // More than one chunk backpropagates into a detached copy of the drafter's output; a
    // Domino or DSpark head's loss always does (`train/domino.rs::domino_ce_backward`,
    // `train/dspark.rs::dspark_backward`).
    let detached = weighted > s.loss_chunk_positions as f64 || d.head != DrafterHead::Dflash;
    // Of them, the ones a Domino head corrects, at the step's share.
    let corrected = if weighted > 0.0 {
        c * s.corrected_positions as f64 / weighted
    } else {
        0.0
    };
    // The vocabulary-wide tensors of `c` positions; h and its gradient [c, H]; indices and
    // weights.
    let vocab_bytes = loss_chunk_vocab_bytes(d, e);
    let loss_chunk = vocab
        * (c * vocab_bytes.per_position + corrected * vocab_bytes.per_corrected_position)
        + 2.0 * c * h * e
        + weighted * 20.0
        + tree_chunk_bytes(d, s, c)
        + dspark_chunk_bytes(d, c, e)
        + dflash2_chunk_bytes(d, c, e);
    let out_grad = if detached { q * h * e } else { 0.0 };
    let loss_phase = loss_chunk + out_grad + if detached { q * h * e } else { 0.0 };
    // Backward of the last layer's MLP. With one loss chunk the head's logits are still alive
    // then.
    let backward_phase = out_grad
        + mlp_backward
        + if rank.activation_checkpointing {
            context_grad
        } else {
            0.0
        }
        + if detached {
            0.0
        } else {
            // the head's logits still alive
            c * vocab * e
        };
    let mut step_peak_extra =
        Consumer::new("loss chunk (logits, log-softmax, gradients)", loss_phase);
    let mut peak_phase = "loss";
    if backward_phase > loss_phase {
        step_peak_extra = Consumer::new(
            "backward of the last layer (gradients in flight)",
            backward_phase,
        );
        peak_phase = "backward";
    }
    (step_peak_extra, peak_phase)
}

/// What a drafter rank holds for the whole run: weights, masters and moments, the frozen
/// tables when they are not the target's, the all-reduce bucket and the queued items.
fn resident_memory(d: &DrafterConfig, rank: RankContext, params: f64) -> Vec<Consumer> {
    let p = rank.precision;
    let e = p.bytes();
    let vocab = d.vocab_size as f64;
    let mut resident = vec![Consumer::new("parameters", params * e)];
    if !p.params_are_masters() {
        resident.push(Consumer::new("fp32 master weights", params * 4.0));
    }
    resident.push(Consumer::new("Adam moments (fp32)", 2.0 * params * 4.0));
    if !rank.tables_shared_with_target {
        // `Replica::build`: the target's embedding and LM head on this device.
        let table = vocab * d.target_hidden_size as f64 * e;
        resident.push(Consumer::new("frozen embedding copy", table));
        resident.push(Consumer::new("frozen LM head copy", table));
    }
    if rank.ranks > 1 {
        // topology/rank.rs::step, allreduce.rs::sum_in_buckets: one fp32 bucket, the sums
        // written back into the gradients.
        resident.push(Consumer::new(
            "all-reduce bucket (fp32)",
            params.min(ALLREDUCE_BUCKET_ELEMENTS as f64) * 4.0,
        ));
    }
    if rank.queued_items > 0 {
        resident.push(Consumer::new(
            format!("queued hidden-state items ({})", rank.queued_items),
            rank.queued_items as f64 * rank.item_bytes,
        ));
    }
    resident
}

/// Per layer: the activations it saves for backward (without K/V copies), the K/V copies
/// its attention calls save, and its number of attention chunks.
fn saved_per_layer<'a>(
    d: &DrafterConfig,
    s: &StepShape,
    p: ActivationPrecision,
    rules: &[LayerRule],
    schedule_of: impl Fn(LayerRule) -> &'a Vec<ContextChunk>,
    chunk_keys: impl Fn(&ContextChunk) -> (f64, f64),
    folded: bool,
) -> (Vec<f64>, Vec<f64>, Vec<usize>) {
    let e = p.bytes();
    let (h, a, k, i) = dims(d);
    let (b, seq) = (s.batch as f64, s.seq_len as f64);
    let q = s.draft_positions(d.block_size) as f64;
    // Saved for backward, per layer (`DecoderLayer::forward_with_context`).
    let mut saved = Vec::new();
    let mut kv_copies = Vec::new();
    let mut per_layer = Vec::new();
    for (n, &rule) in rules.iter().enumerate() {
        let chunks = schedule_of(rule);
        let keys: f64 = chunks.iter().map(|c| chunk_keys(c).1).sum();
        let kv = 2.0 * b * keys * k * e;
        // input_layernorm keeps its input: the block embeddings for layer 0 in fp32 (already
        // counted), the previous layer's output otherwise.
        let input_norm = match (p, n) {
            (ActivationPrecision::Fp32Cpu, 0) => q * 4.0,
            _ => norm_saved(p, q, h),
        };
        // The chunks' outputs joined (kept by o_proj); folded, even one chunk's output is a
        // copy (its rows are put back into query heads), and q's folded copy is what the
        // kernel keeps.
        let concatenated = if chunks.len() > 1 || folded {
            q * a * e
        } else {
            0.0
        };
        let folded_q = if folded { q * a * e } else { 0.0 };
        let bf16_rope_casts = match p {
            ActivationPrecision::Fp32Cpu => 0.0,
            // `rope.rs::apply_rotary`: cos and sin cast to bf16 per call (q, block k, context k).
            ActivationPrecision::Bf16Cuda => 2.0 * (2.0 * q + seq) * d.head_dim as f64 * 2.0,
        };
        let layer = input_norm
            + q * h * e // x, kept by q/k/v_proj
            + norm_saved(p, q, a) // q_proj output, kept by q_norm
            + q * a * e // roped q, kept by attention
            + norm_saved(p, b * seq, k) // context k_proj output, kept by k_norm
            + norm_saved(p, q, k) // block k_proj output
            + q * a * e + b * d.num_attention_heads as f64 * q * 4.0 // attention out + lse
            + concatenated // the chunks' outputs joined, kept by o_proj
            + folded_q
            + norm_saved(p, q, h) // residual, kept by post_attention_layernorm
            + q * h * e // normed MLP input, kept by gate/up_proj
            + 4.0 * q * i * e // gate, silu(gate), up, silu·up
            + bf16_rope_casts;
        saved.push(layer);
        kv_copies.push(kv);
        per_layer.push(chunks.len());
    }
    (saved, kv_copies, per_layer)
}

/// The optimizer's phase (`AdamW::apply` in train/optim.rs): every gradient, plus per parameter a fp32
/// copy off fp32, `g·(1-β2)` and the denominator.
fn optimizer_phase_bytes(d: &DrafterConfig, params: f64, e: f64) -> f64 {
    params * e + largest_param(d) * 4.0 * if e == 4.0 { 2.0 } else { 3.0 }
}

fn largest_param(d: &DrafterConfig) -> f64 {
    let (h, a, _, i) = dims(d);
    let domino = d.head.domino().map_or(0.0, |m| {
        let g = m.gru_hidden_dim as f64;
        (d.vocab_size as f64 * m.emb_dim as f64).max(3.0 * g * h)
    });
    let dspark = d.head.dspark().map_or(0.0, |c| {
        let r = c.markov_rank as f64;
        let variant = match c.markov_head_type {
            MarkovHeadType::Vanilla => 0.0,
            MarkovHeadType::Gated => r * (h + r),
            MarkovHeadType::Rnn => 3.0 * r * (2.0 * r + h),
        };
        (d.vocab_size as f64 * r).max(variant)
    });
    let dflash2 = d
        .head
        .dflash2()
        .map_or(0.0, |c| d.vocab_size as f64 * c.selector_rank as f64);
    [
        d.feature_size() as f64 * h,
        h * a,
        h * i,
        domino,
        dspark,
        dflash2,
    ]
    .into_iter()
    .fold(0.0, f64::max)
}

#[cfg(test)]
#[path = "drafter_tests.rs"]
mod tests;
