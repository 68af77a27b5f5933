//! Domino (arXiv 2605.29707): the DFlash drafter with a GRU logit correction, as SpecForge's
//! `DominoDraftModel` (`specforge/modeling/draft/domino.py`) and `OnlineDominoModel` define it.
//!
//! DFlash predicts every slot of a block in parallel, each blind to what the slots before it
//! will be. Domino adds a small causal path: a one-layer, bias-free GRU reads the embeddings of
//! the block's tokens in order, and for slot `k` its state after the tokens before `k`
//! (`h_{k−1}`, having read the anchor and the labels of slots `1..k−1`) is concatenated with
//! the drafter's output `z_k` and projected to a full-vocabulary logit delta:
//!
//! ```text
//! logits_k = lm_head(z_k)                                               k < s
//! logits_k = lm_head(z_k) + W₂ · silu(W₁ · [z_k ; h_{k−1}])            k ≥ s
//! ```
//!
//! with `s = 1 + pure_draft_prefix_len` (slot 0 is the anchor and is never predicted; the
//! slots of the pure-draft prefix keep the base logits). In training the GRU reads the true
//! tokens (teacher forcing, the labels of slots `0..bs−2`, slot 0's label being the anchor);
//! in decoding, the tokens accepted or drafted so far.
//!
//! The GRU is PyTorch's `nn.GRU(bias=False)`, gate order r, z, n (`weight_ih_l0` is
//! `[W_ir; W_iz; W_in]`, `weight_hh_l0` is `[W_hr; W_hz; W_hn]`), from `h₀ = 0`:
//!
//! ```text
//! r = σ(W_ir x + W_hr h)
//! z = σ(W_iz x + W_hz h)
//! n = tanh(W_in x + r ⊙ (W_hn h))
//! h' = (1 − z) ⊙ n + z ⊙ h
//! ```
//!
//! Written out with tensor ops, so the same cell steps one token at a time when decoding.
//! SpecForge names the parameters `prefix_gru.weight_ih_l0`, `prefix_gru.weight_hh_l0`,
//! `embed_proj.0.weight` (`W₁`, `[emb_dim, hidden + gru_hidden]`) and `embed_proj.2.weight`
//! (`W₂`, `[vocab, emb_dim]`); so do these.
//!
//! SpecForge's `shift_label = true` (slot `k` predicts `anchor + k + 1`) is not implemented:
//! dflashd's blocks train slot `k` on `anchor + k` (`train/labels.rs`), SpecForge's
//! `shift_label = false`, which its Qwen3.6-27B recipe uses.
use tch::{nn, Kind, Tensor};

use super::config::DominoConfig;
use super::layer::Linear;

/// Domino's trainable parameters: the prefix GRU and `embed_proj`.
pub struct DominoHead {
    config: DominoConfig,
    /// `prefix_gru.weight_ih_l0`, `[3·G, H]`, rows r, z, n.
    pub(crate) weight_ih: Tensor,
    /// `prefix_gru.weight_hh_l0`, `[3·G, G]`, rows r, z, n.
    pub(crate) weight_hh: Tensor,
    /// `embed_proj.0`: `[E, H + G]`.
    proj_in: Linear,
    /// `embed_proj.2`: `[V, E]`.
    proj_out: Linear,
}

impl DominoHead {
    /// Parameters under `vs` named as SpecForge's. Initialised as SpecForge's model is: the
    /// GRU as PyTorch's `nn.GRU`, `U(−1/√G, 1/√G)` (transformers' Qwen3 init leaves a GRU
    /// alone), `embed_proj`'s linears `N(0, initializer_range)` like the drafter's others.
    pub fn new(
        vs: &nn::Path,
        config: &DominoConfig,
        hidden_size: i64,
        vocab_size: i64,
        initializer_range: f64,
    ) -> Self {
        let g = config.gru_hidden_dim;
        let bound = 1.0 / (g as f64).sqrt();
        let uniform = nn::Init::Uniform {
            lo: -bound,
            up: bound,
        };
        let gru = vs / "prefix_gru";
        let weight_ih = gru.var("weight_ih_l0", &[3 * g, hidden_size], uniform);
        let weight_hh = gru.var("weight_hh_l0", &[3 * g, g], uniform);
        let proj = vs / "embed_proj";
        Self {
            config: *config,
            weight_ih,
            weight_hh,
            proj_in: Linear::new(
                &(&proj / "0"),
                config.emb_dim,
                hidden_size + g,
                initializer_range,
            ),
            proj_out: Linear::new(
                &(&proj / "2"),
                vocab_size,
                config.emb_dim,
                initializer_range,
            ),
        }
    }

    pub fn config(&self) -> &DominoConfig {
        &self.config
    }

    /// One GRU step from state `h` (`[N, G]`) given the input projection `gi = W_ih x`
    /// (`[N, 3·G]`), PyTorch's equations.
    fn step_projected(&self, gi: &Tensor, h: &Tensor) -> Tensor {
        let gh = h.matmul(&self.weight_hh.tr());
        let gi = gi.chunk(3, -1);
        let gh = gh.chunk(3, -1);
        let reset = (&gi[0] + &gh[0]).sigmoid();
        let update = (&gi[1] + &gh[1]).sigmoid();
        let candidate = (&gi[2] + reset * &gh[2]).tanh();
        // h' = (1 − z)·n + z·h, written as n + z·(h − n).
        &candidate + update * (h - &candidate)
    }

    /// One GRU step: the state after reading `x` (`[N, H]`) from state `h` (`[N, G]`).
    pub fn gru_step(&self, x: &Tensor, h: &Tensor) -> Tensor {
        self.step_projected(&x.matmul(&self.weight_ih.tr()), h)
    }

    /// The GRU over `inputs` (`[N, T, H]`) from `h₀ = 0`: every state, `[N, T, G]`, state
    /// `t` having read inputs `0..=t`. The input projection runs once for all steps.
    pub fn gru(&self, inputs: &Tensor) -> Tensor {
        let size = inputs.size();
        let (n, steps) = (size[0], size[1]);
        let projected = inputs.matmul(&self.weight_ih.tr());
        let mut h = Tensor::zeros(
            [n, self.config.gru_hidden_dim],
            (inputs.kind(), inputs.device()),
        );
        let mut states = Vec::with_capacity(steps as usize);
        for t in 0..steps {
            h = self.step_projected(&projected.select(1, t), &h);
            states.push(h.shallow_clone());
        }
        Tensor::stack(&states, 1)
    }

    /// The GRU state each slot's correction reads, laid out like the slots: `[B, N·bs, G]`,
    /// slot `k ≥ 1` of a block holding the state after the block's tokens `0..k−1`, slot 0
    /// zeros (it is never corrected). `token_embeddings` `[B, N·bs, H]` are the embeddings of
    /// each block's tokens in order (teacher-forced: the slots' labels, slot 0's being the
    /// anchor); a block's last token is never read.
    pub fn slot_states(&self, token_embeddings: &Tensor, block_size: i64) -> Tensor {
        let size = token_embeddings.size();
        let (b, q, hidden) = (size[0], size[1], size[2]);
        let blocks = q / block_size;
        let read = token_embeddings
            .view([b * blocks, block_size, hidden])
            .narrow(1, 0, block_size - 1);
        let states = self.gru(&read);
        let first = Tensor::zeros(
            [b * blocks, 1, self.config.gru_hidden_dim],
            (states.kind(), states.device()),
        );
        Tensor::cat(&[first, states], 1).view([b, q, self.config.gru_hidden_dim])
    }

    /// The logit correction `W₂ · silu(W₁ · [z ; h])` for drafter outputs `z` (`[…, H]`) and
    /// their slots' GRU states `h` (`[…, G]`): `[…, V]`.
    pub fn correction(&self, z: &Tensor, h: &Tensor) -> Tensor {
        let features = Tensor::cat(&[z, &h.to_kind(z.kind())], -1);
        self.proj_out
            .forward(&self.proj_in.forward(&features).silu())
    }

    /// Whether slot `k` of a block is corrected.
    pub fn corrects_slot(&self, k: i64) -> bool {
        k >= self.config.suffix_start()
    }

    /// Parameter elements of the head.
    pub fn numel(&self) -> i64 {
        [
            &self.weight_ih,
            &self.weight_hh,
            &self.proj_in.weight,
            &self.proj_out.weight,
        ]
        .iter()
        .map(|t| t.numel() as i64)
        .sum()
    }

    /// Corrected logits of every slot: the base logits `lm_head(z)` plus the correction at the
    /// slots from [`DominoConfig::suffix_start`] on. `z` `[B, N·bs, H]`, `states` from
    /// [`Self::slot_states`]; returns `[B, N·bs, V]` in f32. Dense: for tests and small
    /// evaluations (training chunks it, `train/domino.rs`).
    pub fn dense_logits(
        &self,
        z: &Tensor,
        states: &Tensor,
        lm_head: &Tensor,
        block_size: i64,
    ) -> Tensor {
        let base = z.matmul(&lm_head.tr()).to_kind(Kind::Float);
        let correction = self.correction(z, states).to_kind(Kind::Float);
        let slot = Tensor::arange(z.size()[1], (Kind::Int64, z.device())).remainder(block_size);
        let corrected = slot
            .ge(self.config.suffix_start())
            .to_kind(Kind::Float)
            .view([1, -1, 1]);
        base + correction * corrected
    }
}

#[cfg(test)]
#[path = "domino_tests.rs"]
mod tests;
