//! Analytic FLOP counts of one drafter training step and of one target forward, for
//! throughput as a fraction of a peak (`dflash-bench` and `dflashd plan` count with these).
//!
//! Conventions (the usual ones for MFU): a multiply-add is 2 FLOPs; only matmuls count
//! (norms, RoPE, softmax and the optimizer's elementwise work are left out); attention counts
//! the *useful* work, i.e. only the (query, key) pairs the visibility rule allows, whatever an
//! implementation computes and throws away. Backward is 2x forward for trainable matmuls
//! (input and weight gradients), 1x for the frozen LM head (input gradient only) and for `fc`
//! (its input, the target features, needs no gradient). A Domino head adds its GRU over each
//! block's tokens (the input projection's backward is its weight gradient only: the GRU reads
//! frozen embeddings; the hidden projection's first step has no state gradient: it starts
//! from the constant zero) and `embed_proj` over the corrected positions ([`DominoTerms`]).
//! A DSpark head adds its Markov head's latents over every slot (the gated variant's gate, the
//! RNN's joint projection; the vanilla one is a lookup), `W₂` over the weighted positions and
//! its confidence head there, each with its input and weight gradients ([`DsparkTerms`]).
//! A DFlash2 head runs the LM head over every slot of each block holding a weighted position
//! ([`head_positions`]) and adds its convolutions' kernel projections over every draft
//! position, its selector's `hidden_projection` and candidate scoring over the head positions,
//! each with its input and weight gradients, and the metrics walk's, forward only
//! ([`Dflash2Terms`]).
//! A head that distils the target's own distribution adds the teacher's logits: the frozen
//! LM head over the target's last hidden state at every weighted position, forward only
//! ([`teacher_head_flops`]); and its target pass runs every layer, to the last
//! (`FeatureRequest::layers_read`).
//!
//! Two counts of one step: [`drafter_step_flops`] is that *model* count, what MFU divides;
//! [`drafter_step_executed_flops`] is what the engine's kernels run for it: every key of
//! every fused attention call (the chunk schedule's context ranges, masked keys included) and the
//! layers recomputed under activation checkpointing. The second is the one a counter of
//! executed kernels can check (`dflash-bench --cases plan`), and model / executed is how much
//! of the device's work was useful.
use super::drafter::{chunk_schedule, confidence_input_width, layer_rule};
use crate::model::attention::visibility::LayerRule;
use crate::model::drafter::{DrafterConfig, MarkovHeadType};
use crate::model::target::{param_specs, TargetConfig};

/// Visible (query, key) pairs of one drafter layer over a batch of blocks: context keys plus
/// own-block keys, exactly as the rule in `attention::visibility` counts them.
pub fn visible_pairs(
    rule: LayerRule,
    anchors: &[i64],
    keep: &[bool],
    block_size: i64,
    context_len: i64,
) -> u64 {
    let mut pairs = 0u64;
    for (&anchor, &kept) in anchors.iter().zip(keep) {
        for off in 0..block_size {
            let context = if kept {
                let hi = anchor.min(context_len);
                let lo = match rule {
                    LayerRule::Full => 0,
                    LayerRule::Sliding { window } => (anchor + off - (window - 1)).max(0),
                };
                (hi - lo).max(0)
            } else {
                0
            };
            let own = match rule {
                LayerRule::Full => block_size,
                LayerRule::Sliding { .. } => off + 1,
            };
            pairs += (context + own) as u64;
        }
    }
    pairs
}

/// What one step processes.
#[derive(Debug, Clone)]
pub struct StepWork<'a> {
    pub drafter: &'a DrafterConfig,
    pub batch: i64,
    pub seq_len: i64,
    /// Row-major `[batch, blocks]`.
    pub anchors: &'a [i64],
    pub keep: &'a [bool],
    /// Positions with a positive loss weight.
    pub weighted_positions: i64,
    /// Positions the LM head runs over: the weighted ones, or for DFlash2 every slot of each
    /// block holding one ([`head_positions`]).
    pub head_positions: i64,
    /// Of those, the ones a Domino head corrects (their slot ≥ `1 + pure_draft_prefix_len`,
    /// [`corrected_positions`]): what `embed_proj` runs over. 0 without a Domino head.
    pub corrected_positions: i64,
    /// Positions whose teacher distribution the frozen LM head computes from the target's
    /// last hidden state ([`teacher_positions`]). 0 unless the head distils the target.
    pub teacher_positions: i64,
    pub vocab_size: i64,
}

/// The weighted positions a Domino head corrects, from the loss weights (row-major
/// `[B, N·bs]`, `train/labels.rs`): those with a positive weight at a slot from
/// [`DominoConfig::suffix_start`](crate::model::drafter::DominoConfig::suffix_start) on, the
/// rows `train/domino.rs::chunked_terms` hands `embed_proj`. 0 without a Domino head.
pub fn corrected_positions(d: &DrafterConfig, weights: &[f32]) -> i64 {
    let Some(m) = d.head.domino() else {
        return 0;
    };
    let bs = d.block_size.max(1) as usize;
    let first = m.suffix_start().max(0) as usize;
    weights
        .iter()
        .enumerate()
        .filter(|&(i, &w)| w > 0.0 && i % bs >= first)
        .count() as i64
}

/// The positions the LM head runs over, from the loss weights (row-major `[B, N·bs]`, as
/// [`corrected_positions`] reads them): those with a positive weight, or with a DFlash2 head
/// every slot of each block holding one (`train/dflash2.rs::chunk_blocks` projects whole
/// blocks, slot 0 and unsupervised slots included, for the selector and its greedy walk).
pub fn head_positions(d: &DrafterConfig, weights: &[f32]) -> i64 {
    if d.head.dflash2().is_none() {
        return weights.iter().filter(|&&w| w > 0.0).count() as i64;
    }
    let bs = d.block_size.max(1) as usize;
    let blocks = weights
        .chunks(bs)
        .filter(|block| block.iter().any(|&w| w > 0.0))
        .count();
    (blocks * bs) as i64
}

/// The positions whose teacher distribution a step computes: every weighted position when
/// the head distils the target's own distribution
/// ([`DrafterHead::needs_target_last_hidden`](crate::model::drafter::DrafterHead::needs_target_last_hidden)),
/// none otherwise.
pub fn teacher_positions(d: &DrafterConfig, weighted_positions: i64) -> i64 {
    if d.head.needs_target_last_hidden() {
        weighted_positions
    } else {
        0
    }
}

/// FLOPs of the teacher's logits: the target's frozen LM head `[V, H]` over its last hidden
/// state at `positions` positions, counted as the drafter's own LM head is (2 per
/// multiply-add). Forward only: the teacher takes no gradient.
pub fn teacher_head_flops(positions: i64, hidden: i64, vocab: i64) -> f64 {
    2.0 * positions as f64 * hidden as f64 * vocab as f64
}

/// Forward and backward FLOPs of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepFlops {
    pub forward: f64,
    pub backward: f64,
}

impl StepFlops {
    pub fn total(&self) -> f64 {
        self.forward + self.backward
    }
}

/// The forward matmuls of one step: `fc` over the context, one layer's projections (the same
/// for every layer), the LM head over the head positions ([`StepWork::head_positions`]), and the teacher's LM head
/// (forward only, [`teacher_head_flops`]).
struct MatmulTerms {
    fc: f64,
    layer_projections: f64,
    head: f64,
    teacher: f64,
}

fn matmul_terms(w: &StepWork<'_>) -> MatmulTerms {
    let d = w.drafter;
    let (b, s) = (w.batch as f64, w.seq_len as f64);
    let q = draft_positions(w);
    let h = d.hidden_size as f64;
    let (hq, hkv, hd) = (
        d.num_attention_heads as f64,
        d.num_key_value_heads as f64,
        d.head_dim as f64,
    );
    let inter = d.intermediate_size as f64;
    MatmulTerms {
        fc: 2.0 * b * s * d.feature_size() as f64 * h,
        layer_projections: 2.0 * q * h * hq * hd        // q_proj
            + 2.0 * 2.0 * (b * s + q) * h * hkv * hd    // k_proj, v_proj over context and block
            + 2.0 * q * hq * hd * h                     // o_proj
            + 3.0 * 2.0 * q * h * inter, // gate, up, down
        head: 2.0 * w.head_positions as f64 * h * w.vocab_size as f64,
        teacher: teacher_head_flops(w.teacher_positions, d.target_hidden_size, w.vocab_size),
    }
}

/// A Domino head's forward matmuls (`drafter/domino.rs`, `train/domino.rs`): the GRU over
/// `bs − 1` tokens of every block (`slot_states`, padding blocks included), input projection
/// `[., H] × [H, 3G]` and hidden projection `[., G] × [G, 3G]` per step, and `embed_proj`
/// (`[H + G] → E → V`) over the corrected positions ([`StepWork::corrected_positions`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DominoTerms {
    pub gru_input: f64,
    pub gru_hidden: f64,
    /// Of `gru_hidden`, the first step's: its state is the constant `h₀ = 0`, which needs no
    /// gradient, so its backward is the weight gradient alone.
    pub gru_hidden_first_step: f64,
    pub projection: f64,
}

impl DominoTerms {
    pub fn forward(&self) -> f64 {
        self.gru_input + self.gru_hidden + self.projection
    }

    /// The input projection's weight gradient (the GRU reads frozen embeddings); the hidden
    /// projection's weight gradient at every step and its state gradient at every step but
    /// the first; both gradients of `embed_proj` (its input is the drafter's output and the
    /// GRU's states, both trained).
    pub fn backward(&self) -> f64 {
        self.gru_input + 2.0 * self.gru_hidden - self.gru_hidden_first_step + 2.0 * self.projection
    }
}

pub fn domino_terms(w: &StepWork<'_>) -> Option<DominoTerms> {
    let d = w.drafter;
    let m = d.head.domino()?;
    let (h, g, e) = (
        d.hidden_size as f64,
        m.gru_hidden_dim as f64,
        m.emb_dim as f64,
    );
    let bs = d.block_size as f64;
    let blocks = draft_positions(w) / bs;
    let read = blocks * (bs - 1.0);
    let corrected = w.corrected_positions as f64;
    let gru_step = |rows: f64| 2.0 * rows * g * 3.0 * g;
    Some(DominoTerms {
        gru_input: 2.0 * read * h * 3.0 * g,
        gru_hidden: gru_step(read),
        gru_hidden_first_step: if bs > 1.0 { gru_step(blocks) } else { 0.0 },
        projection: 2.0 * corrected * ((h + g) * e + e * w.vocab_size as f64),
    })
}

/// A DSpark head's forward matmuls (`drafter/dspark.rs`, `train/dspark.rs`): the Markov
/// latents of every slot (`markov_latents`, padding blocks included): the gated variant's
/// `gate_proj` `[., H + r] × [H + r, r]`, the RNN's `joint_proj` `[., 2r + H] × [2r + H, 3r]`
/// per slot, nothing for the vanilla one (a lookup of `W₁`); `W₂` (`[r] → [V]`) over the
/// weighted positions; and the confidence head (`[H] → 1`, `[H + r] → 1` reading the Markov
/// embedding) there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DsparkTerms {
    pub markov_latents: f64,
    pub projection: f64,
    pub confidence: f64,
}

impl DsparkTerms {
    pub fn forward(&self) -> f64 {
        self.markov_latents + self.projection + self.confidence
    }

    /// Every matmul's input and weight gradients: the latents read the drafter's output and
    /// `W₁`'s rows (both trained; the RNN's `[s ; W₁[prev] ; h]` is one matmul, so its input
    /// gradient spans the state even at slot 0, where it is the constant zero), `W₂` reads the
    /// latents through a leaf that takes a gradient, the confidence head reads the drafter's
    /// output.
    pub fn backward(&self) -> f64 {
        2.0 * self.forward()
    }
}

pub fn dspark_terms(w: &StepWork<'_>) -> Option<DsparkTerms> {
    let d = w.drafter;
    let c = d.head.dspark()?;
    let (h, r) = (d.hidden_size as f64, c.markov_rank as f64);
    let q = draft_positions(w);
    let weighted = w.weighted_positions as f64;
    let markov = c.has_markov_head();
    let markov_latents = match c.markov_head_type {
        _ if !markov => 0.0,
        MarkovHeadType::Vanilla => 0.0,
        MarkovHeadType::Gated => 2.0 * q * (h + r) * r,
        MarkovHeadType::Rnn => 2.0 * q * (2.0 * r + h) * 3.0 * r,
    };
    let projection = if markov {
        2.0 * weighted * r * w.vocab_size as f64
    } else {
        0.0
    };
    let confidence = if c.confidence_head {
        2.0 * weighted * confidence_input_width(d, c)
    } else {
        0.0
    };
    Some(DsparkTerms {
        markov_latents,
        projection,
        confidence,
    })
}

/// A DFlash2 head's forward matmuls (`drafter/dflash2.rs`, `train/dflash2.rs`):
///
/// - per layer, both convolutions' `kernel_projection` (`[., H] × [H, 2·taps·G]`) over every
///   draft position (`GroupedConv::prepare`, padding blocks included); the convolution itself
///   (`convolve`: per tap a product and a sum with shifted inputs) is elementwise;
/// - the selector's teacher-forced scores over every head position
///   ([`StepWork::head_positions`], `selector_term`): `hidden_projection` (`[., H] × [H, r]`)
///   and the candidates' transition `B[cand] [K, r] · context [r]` (a batched matmul); the
///   codebook rows are gathers and `A[prev] ⊙ W_h·h` is elementwise, so neither counts;
/// - the greedy walk that measures serving (`measure`, `CandidateSelector::greedy_path`, under
///   no_grad): one more `score` per slot ≥ 1 of each head block, the same two matmuls.
///
/// Counted for a step that trains the selector (`α_eff > 0`, no
/// `training.dflash2.selector_stop_gradient`). At `α_eff = 0` the selector's scores run under
/// no_grad (forward only); with the stop-gradient its `hidden_projection` reads a detached
/// state (its weight gradient only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dflash2Terms {
    /// One layer's two kernel projections (every layer has the same).
    pub layer_conv_projections: f64,
    pub layers: f64,
    pub hidden_projection: f64,
    pub candidate_scores: f64,
    /// The walk's `hidden_projection` and scoring, forward only.
    pub walk: f64,
}

impl Dflash2Terms {
    pub fn forward(&self) -> f64 {
        self.trained() + self.walk
    }

    /// Every trained matmul's input and weight gradients: the kernel projections read a normed
    /// layer input and `hidden_projection` the drafter's output (both in the graph), and the
    /// transition's operands are rows of the two trained codebooks (`A[prev]` scaling the
    /// context). The walk takes none.
    pub fn backward(&self) -> f64 {
        2.0 * self.trained()
    }

    fn trained(&self) -> f64 {
        self.layers * self.layer_conv_projections + self.hidden_projection + self.candidate_scores
    }
}

pub fn dflash2_terms(w: &StepWork<'_>) -> Option<Dflash2Terms> {
    let d = w.drafter;
    let c = d.head.dflash2()?;
    let (h, r, k) = (
        d.hidden_size as f64,
        c.selector_rank as f64,
        c.selector_top_k as f64,
    );
    let q = draft_positions(w);
    let taps = c.conv_kernel_size as f64;
    let groups = c.conv_groups(d.hidden_size) as f64;
    let head = w.head_positions as f64;
    let bs = d.block_size.max(1) as f64;
    // Slots 1..bs of every head block: `greedy_path` walks the block after its anchor.
    let walked = head / bs * (bs - 1.0);
    let score = |rows: f64| (2.0 * rows * h * r, 2.0 * rows * k * r);
    let (hidden_projection, candidate_scores) = score(head);
    let (walk_projection, walk_scores) = score(walked);
    Some(Dflash2Terms {
        layer_conv_projections: 2.0 * 2.0 * q * h * 2.0 * taps * groups,
        layers: d.layer_types.len() as f64,
        hidden_projection,
        candidate_scores,
        walk: walk_projection + walk_scores,
    })
}

/// `B · N · bs`, padding blocks included (they run through every projection).
fn draft_positions(w: &StepWork<'_>) -> f64 {
    let blocks = (w.anchors.len() as i64 / w.batch.max(1)) as f64;
    w.batch as f64 * blocks * w.drafter.block_size as f64
}

pub fn drafter_step_flops(w: &StepWork<'_>) -> StepFlops {
    let d = w.drafter;
    let (hq, hd) = (d.num_attention_heads as f64, d.head_dim as f64);
    let m = matmul_terms(w);
    let layers_fwd = d.layer_types.len() as f64 * m.layer_projections;
    let attention_fwd: f64 = d
        .layer_types
        .iter()
        .map(|&t| {
            let pairs = visible_pairs(layer_rule(d, t), w.anchors, w.keep, d.block_size, w.seq_len);
            4.0 * hd * hq * pairs as f64 // q·k and p·v
        })
        .sum();
    let (domino, dspark, dflash2) = (domino_terms(w), dspark_terms(w), dflash2_terms(w));
    StepFlops {
        forward: m.fc
            + layers_fwd
            + attention_fwd
            + m.head
            + m.teacher
            + domino.map_or(0.0, |t| t.forward())
            + dspark.map_or(0.0, |t| t.forward())
            + dflash2.map_or(0.0, |t| t.forward()),
        backward: m.fc
            + 2.0 * layers_fwd
            + 2.0 * attention_fwd
            + m.head
            + domino.map_or(0.0, |t| t.backward())
            + dspark.map_or(0.0, |t| t.backward())
            + dflash2.map_or(0.0, |t| t.backward()),
    }
}

/// FLOPs the engine's kernels execute in one drafter step, in the categories a counter of
/// executed kernels sees (`dflash-bench`'s `flop_counter`): matmuls, and fused attention
/// forward and backward.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExecutedFlops {
    pub matmul: f64,
    pub attention_forward: f64,
    pub attention_backward: f64,
}

impl ExecutedFlops {
    pub fn total(&self) -> f64 {
        self.matmul + self.attention_forward + self.attention_backward
    }
}

/// What one step runs (`drafter/model.rs::Drafter::forward_backward`, `train/loss.rs`): the
/// matmuls of [`drafter_step_flops`]; attention over every key each fused call is handed (per
/// chunk of the schedule `ChunkSchedule::new` makes, `rows × (context range + rows)` for every
/// query head, forward q·k and p·v, backward twice that); and with `activation_checkpointing`
/// one more forward of every layer before the last (a DFlash2 layer's kernel projections
/// with it). A step with no weighted position runs
/// the forward only (nothing to backpropagate, nothing recomputed).
pub fn drafter_step_executed_flops(
    w: &StepWork<'_>,
    activation_checkpointing: bool,
) -> ExecutedFlops {
    let d = w.drafter;
    let (hq, hd, bs) = (
        d.num_attention_heads as f64,
        d.head_dim as f64,
        d.block_size as f64,
    );
    let m = matmul_terms(w);
    let layers = d.layer_types.len();
    let attention: Vec<f64> = d
        .layer_types
        .iter()
        .map(|&t| {
            let chunks =
                chunk_schedule(d, (w.batch, w.seq_len), w.anchors, w.keep, layer_rule(d, t));
            chunks
                .iter()
                .map(|c| {
                    let rows = (c.end - c.start) as f64 * bs;
                    let context = c.keys.map_or(0, |(lo, hi)| hi - lo) as f64;
                    4.0 * w.batch as f64 * hq * rows * (context + rows) * hd
                })
                .sum()
        })
        .collect();
    let forward_attention: f64 = attention.iter().sum();
    let (domino, dspark, dflash2) = (domino_terms(w), dspark_terms(w), dflash2_terms(w));
    let forward_matmul = m.fc
        + layers as f64 * m.layer_projections
        + m.head
        + m.teacher
        + domino.map_or(0.0, |t| t.forward())
        + dspark.map_or(0.0, |t| t.forward())
        + dflash2.map_or(0.0, |t| t.forward());
    if w.weighted_positions == 0 {
        return ExecutedFlops {
            matmul: forward_matmul,
            attention_forward: forward_attention,
            attention_backward: 0.0,
        };
    }
    let recomputed = if activation_checkpointing {
        layers.saturating_sub(1)
    } else {
        0
    };
    ExecutedFlops {
        matmul: forward_matmul
            + m.fc
            + 2.0 * layers as f64 * m.layer_projections
            + m.head
            + domino.map_or(0.0, |t| t.backward())
            + dspark.map_or(0.0, |t| t.backward())
            + dflash2.map_or(0.0, |t| t.backward())
            + recomputed as f64 * m.layer_projections
            + recomputed as f64 * dflash2.map_or(0.0, |t| t.layer_conv_projections),
        attention_forward: forward_attention + attention[..recomputed].iter().sum::<f64>(),
        attention_backward: 2.0 * forward_attention,
    }
}

/// The distinct `(rows, keys)` shapes of the fused attention calls one step of `w` hands its
/// kernel (the same chunk schedules [`drafter_step_executed_flops`] counts): per layer rule and per
/// chunk, `rows = blocks · block_size` query rows over `keys = context range + rows`. What
/// `model::attention::shape_log` records at the kernel, seen from the planner: the
/// shape-bound tests hold it to `max_distinct_chunk_shapes` over many steps without running
/// them.
pub fn attention_call_shapes(w: &StepWork<'_>) -> std::collections::BTreeSet<(i64, i64)> {
    let d = w.drafter;
    let mut rules: Vec<LayerRule> = Vec::new();
    for &t in &d.layer_types {
        let rule = layer_rule(d, t);
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }
    rules
        .into_iter()
        .flat_map(|rule| chunk_schedule(d, (w.batch, w.seq_len), w.anchors, w.keep, rule))
        .map(|c| {
            let rows = (c.end - c.start) as i64 * d.block_size;
            (rows, c.keys.map_or(0, |(lo, hi)| hi - lo) + rows)
        })
        .collect()
}

/// Forward FLOPs of the target's feature pass over `batch × seq_len` tokens: the matmuls of
/// the layers it runs (`model/target/mod.rs::hidden_states` stops after the last layer it
/// reads, so layers `0..=max(taps)`; `taps` are the layers read,
/// `FeatureRequest::layers_read`, the last one included when the last hidden state is asked
/// for), 2 per weight per token, plus causal attention on its
/// full-attention layers (q·k and p·v over the `(S+1)/2` keys a token sees on average). The
/// Gated DeltaNet chunk recurrence (under 1 % at Qwen3.6-27B's shape) and the depthwise conv
/// are left out, as norms and elementwise work are.
pub fn target_forward_flops(t: &TargetConfig, taps: &[usize], batch: i64, seq_len: i64) -> f64 {
    let layers = taps.iter().max().map_or(0, |&m| m + 1).min(t.num_layers());
    let prefix = |name: &str| name.starts_with("layers.");
    let matmul_weights: f64 = param_specs(t, layers)
        .iter()
        .filter(|p| prefix(&p.name) && p.shape.len() == 2)
        .map(|p| p.shape.iter().product::<i64>() as f64)
        .sum();
    let (full_layers, heads, head_dim) = match t {
        TargetConfig::Qwen3(c) => (layers, c.num_attention_heads, c.head_dim),
        TargetConfig::Qwen3_5(c) => (
            c.layer_types[..layers]
                .iter()
                .filter(|k| **k == crate::model::target::Qwen3_5LayerKind::FullAttention)
                .count(),
            c.num_attention_heads,
            c.head_dim,
        ),
    };
    let tokens = (batch * seq_len) as f64;
    let attention =
        full_layers as f64 * 4.0 * (heads * head_dim) as f64 * (seq_len as f64 + 1.0) / 2.0;
    tokens * (2.0 * matmul_weights + attention)
}

/// FLOPs of one `[n, n] x [n, n]` matmul.
pub fn square_matmul_flops(n: i64) -> f64 {
    2.0 * (n as f64).powi(3)
}

#[cfg(test)]
#[path = "flops_tests.rs"]
mod tests;
