//! DSpark: the DFlash drafter with a Markov logit bias and a confidence head, as SpecForge's
//! `DSparkDraftModel` (`specforge/modeling/draft/dspark.py`, a6b6b023) defines them.
//!
//! DSpark's slot `k` of the block at anchor `a` drafts the token at `a + k + 1` (next-token
//! labels, `train/labels.rs`), and sees the token before it, `prev_k` (the token at `a + k`:
//! the anchor for slot 0). The **Markov head** adds a low-rank bias from that previous token
//! to the LM head's logits, `logits_k = lm_head(h_k) + W₂ · u_k`, where `W₁` (`[V, r]`, an
//! embedding table) embeds `prev_k` and `u_k` (`[r]`, the "latent") depends on the variant:
//!
//! ```text
//! vanilla   u_k = W₁[prev_k]                                             (dspark.py:48-60)
//! gated     u_k = σ(G · [h_k ; W₁[prev_k]] + g) ⊙ W₁[prev_k]             (dspark.py:126-144)
//! rnn       [γ_k, c_k, o_k] = J · [s_k ; W₁[prev_k] ; h_k] + j,   s_0 = 0 at each block start
//!           s_{k+1} = σ(γ_k) ⊙ s_k + (1 − σ(γ_k)) ⊙ tanh(c_k)
//!           u_k = tanh(o_k)                                               (dspark.py:156-209)
//! ```
//!
//! (the RNN's output reads the state *before* the step's update). The **confidence head**
//! predicts, per slot, the logit of the probability that the target accepts the slot's draft:
//! `c_k = P · h_k + p`, or `P · [h_k ; W₁[prev_k]] + p` with `confidence_head_with_markov`
//! (`AcceptRatePredictor`, dspark.py:24-32, `predict_confidence`, dspark.py:385-401).
//!
//! Parameters are named as SpecForge's state dict (`markov_head.markov_w1.weight`,
//! `markov_head.markov_w2.weight`, `markov_head.gate_proj.*`, `markov_head.joint_proj.*`,
//! `confidence_head.proj.*`), so a VarStore saves and loads the HF keys.
//!
//! Initialisation is transformers' `PreTrainedModel._init_weights` (transformers 5.8.1, which
//! SpecForge pins), applied by `post_init` (dflash.py:375-377) after `_init_draft_head` built
//! these heads: every `nn.Linear` weight `N(0, initializer_range)` with a zero bias, the
//! `nn.Embedding` `markov_w1` `N(0, initializer_range)` (it has no padding row). dspark.py
//! re-initialises nothing.
use tch::{nn, Kind, Tensor};

use super::config::{DsparkConfig, MarkovHeadType};

/// `nn.Linear(in, out)` with its bias: weight `[out, in]` drawn `N(0, σ)`, bias zeros.
struct BiasedLinear {
    weight: Tensor,
    bias: Tensor,
}

impl BiasedLinear {
    fn new(vs: &nn::Path, out_features: i64, in_features: i64, stdev: f64) -> Self {
        Self {
            weight: vs.var(
                "weight",
                &[out_features, in_features],
                nn::Init::Randn { mean: 0.0, stdev },
            ),
            bias: vs.zeros("bias", &[out_features]),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        x.linear(&self.weight, Some(&self.bias))
    }

    fn numel(&self) -> i64 {
        (self.weight.numel() + self.bias.numel()) as i64
    }
}

/// `t` in f32, or left in f64 (the tests' precision): the precision DSpark's logits and
/// confidences are formed in.
pub(crate) fn at_least_f32(t: &Tensor) -> Tensor {
    if t.kind() == Kind::Double {
        t.shallow_clone()
    } else {
        t.to_kind(Kind::Float)
    }
}

/// The Markov head: `W₁`, `W₂` and the variant's gate or recurrence (module doc).
pub struct MarkovHead {
    kind: MarkovHeadType,
    rank: i64,
    /// `markov_w1.weight`, `[V, r]`: the previous token's embedding table.
    w1: Tensor,
    /// `markov_w2.weight`, `[V, r]`: `Linear(r, V)` without bias.
    w2: Tensor,
    /// Gated: `gate_proj`, `[r, H + r]`, reading `[h ; W₁[prev]]`.
    gate_proj: Option<BiasedLinear>,
    /// RNN: `joint_proj`, `[3r, 2r + H]`, reading `[s ; W₁[prev] ; h]`, rows γ, c, o.
    joint_proj: Option<BiasedLinear>,
}

impl MarkovHead {
    fn new(
        vs: &nn::Path,
        kind: MarkovHeadType,
        rank: i64,
        hidden_size: i64,
        vocab_size: i64,
        stdev: f64,
    ) -> Self {
        let init = nn::Init::Randn { mean: 0.0, stdev };
        let w1 = (vs / "markov_w1").var("weight", &[vocab_size, rank], init);
        let w2 = (vs / "markov_w2").var("weight", &[vocab_size, rank], init);
        let gate_proj = (kind == MarkovHeadType::Gated)
            .then(|| BiasedLinear::new(&(vs / "gate_proj"), rank, hidden_size + rank, stdev));
        let joint_proj = (kind == MarkovHeadType::Rnn).then(|| {
            BiasedLinear::new(
                &(vs / "joint_proj"),
                3 * rank,
                2 * rank + hidden_size,
                stdev,
            )
        });
        Self {
            kind,
            rank,
            w1,
            w2,
            gate_proj,
            joint_proj,
        }
    }

    pub fn kind(&self) -> MarkovHeadType {
        self.kind
    }

    /// `r`, the latent's width.
    pub fn rank(&self) -> i64 {
        self.rank
    }

    /// `W₁[prev]`: `[…, r]` for token ids `[…]`.
    pub fn prev_embeddings(&self, prev: &Tensor) -> Tensor {
        Tensor::embedding(&self.w1, &prev.to_kind(Kind::Int64), -1, false, false)
    }

    /// The bias `W₂ · u` of latents `u` (`[…, r]`): `[…, V]`, in the parameters' dtype.
    pub fn project(&self, latent: &Tensor) -> Tensor {
        latent.linear::<Tensor>(&self.w2, None)
    }

    /// The vanilla and gated latents of any positions at once (`prev` `[…]`, `hidden`
    /// `[…, H]`): each reads only its own slot, so a loss can form them at the rows it needs.
    /// `None` for the RNN, whose latent also reads the block's earlier slots
    /// ([`Self::block_latents`], [`Self::step`]).
    pub fn position_latents(&self, prev: &Tensor, hidden: &Tensor) -> Option<Tensor> {
        let embedded = self.prev_embeddings(prev);
        match (self.kind, &self.gate_proj) {
            (MarkovHeadType::Vanilla, _) => Some(embedded),
            (MarkovHeadType::Gated, Some(gate_proj)) => {
                let gate_input = Tensor::cat(&[hidden, &embedded.to_kind(hidden.kind())], -1);
                let gate = gate_proj.forward(&gate_input).sigmoid();
                Some(gate.to_kind(embedded.kind()) * embedded)
            }
            _ => None,
        }
    }

    /// The state a block starts from: zeros, `[n, r]`, in `like`'s dtype and device.
    pub fn initial_state(&self, n: i64, like: &Tensor) -> Tensor {
        Tensor::zeros([n, self.rank], (like.kind(), like.device()))
    }

    /// One slot of every variant, teacher-forced or decoding: from the previous tokens
    /// `prev` (`[N]`), the slot's hidden states `hidden` (`[N, H]`) and the state `state`
    /// (`[N, r]`, [`Self::initial_state`] at slot 0), the latent `u` (`[N, r]`) and the
    /// state the next slot reads. The vanilla and gated heads pass the state through.
    pub fn step_latent(&self, prev: &Tensor, hidden: &Tensor, state: &Tensor) -> (Tensor, Tensor) {
        let Some(joint_proj) = &self.joint_proj else {
            let latent = self
                .position_latents(prev, hidden)
                .expect("a head without joint_proj is vanilla or gated");
            return (latent, state.shallow_clone());
        };
        let embedded = self.prev_embeddings(prev);
        let input = Tensor::cat(&[state, &embedded, hidden], -1);
        let parts = joint_proj.forward(&input).chunk(3, -1);
        let keep = parts[0].sigmoid();
        let candidate = parts[1].tanh();
        // s' = σ(γ)⊙s + (1 − σ(γ))⊙tanh(c), written as tanh(c) + σ(γ)⊙(s − tanh(c)).
        let next = &candidate + &keep * (state - &candidate);
        (parts[2].tanh(), next)
    }

    /// [`Self::step_latent`] projected: the slot's bias `[N, V]` and the next state. What a
    /// decoder calls slot after slot, feeding back the token it drafted.
    pub fn step(&self, prev: &Tensor, hidden: &Tensor, state: &Tensor) -> (Tensor, Tensor) {
        let (latent, next) = self.step_latent(prev, hidden, state);
        (self.project(&latent), next)
    }

    /// Teacher-forced latents of whole blocks: `prev` `[Nb, bs]` (the token before each slot),
    /// `hidden` `[Nb, bs, H]`; returns `[Nb, bs, r]`. The RNN starts each block from zeros
    /// and steps its slots in order (`apply_block_logits`, dspark.py:181-209).
    pub fn block_latents(&self, prev: &Tensor, hidden: &Tensor) -> Tensor {
        if let Some(latents) = self.position_latents(prev, hidden) {
            return latents;
        }
        let slots = prev.size()[1];
        let mut state = self.initial_state(prev.size()[0], hidden);
        let mut latents = Vec::with_capacity(slots as usize);
        for k in 0..slots {
            let (latent, next) = self.step_latent(&prev.select(1, k), &hidden.select(1, k), &state);
            latents.push(latent);
            state = next;
        }
        Tensor::stack(&latents, 1)
    }

    /// Teacher-forced bias of whole blocks, `W₂ · u`: `[Nb, bs, V]` (see
    /// [`Self::block_latents`]).
    pub fn block_bias(&self, prev: &Tensor, hidden: &Tensor) -> Tensor {
        self.project(&self.block_latents(prev, hidden))
    }

    fn numel(&self) -> i64 {
        let own = (self.w1.numel() + self.w2.numel()) as i64;
        own + self.gate_proj.as_ref().map_or(0, BiasedLinear::numel)
            + self.joint_proj.as_ref().map_or(0, BiasedLinear::numel)
    }
}

/// DSpark's heads beside the drafter's backbone: an optional Markov head and an optional
/// confidence head (`confidence_head.proj`, `[1, H]` or `[1, H + r]`).
pub struct DsparkHead {
    config: DsparkConfig,
    markov: Option<MarkovHead>,
    confidence: Option<BiasedLinear>,
}

impl DsparkHead {
    /// Parameters under `vs` named as SpecForge's, initialised as transformers' `post_init`
    /// leaves them (module doc). `config` must be valid (`DrafterConfig::validate`: a
    /// confidence head reads the Markov embedding only when there is a Markov head).
    pub fn new(
        vs: &nn::Path,
        config: &DsparkConfig,
        hidden_size: i64,
        vocab_size: i64,
        initializer_range: f64,
    ) -> Self {
        let markov = config.has_markov_head().then(|| {
            MarkovHead::new(
                &(vs / "markov_head"),
                config.markov_head_type,
                config.markov_rank,
                hidden_size,
                vocab_size,
                initializer_range,
            )
        });
        let confidence_input = if config.confidence_head_with_markov {
            hidden_size + config.markov_rank
        } else {
            hidden_size
        };
        let confidence = config.confidence_head.then(|| {
            BiasedLinear::new(
                &(vs / "confidence_head" / "proj"),
                1,
                confidence_input,
                initializer_range,
            )
        });
        Self {
            config: *config,
            markov,
            confidence,
        }
    }

    pub fn config(&self) -> &DsparkConfig {
        &self.config
    }

    /// The Markov head, when `markov_rank > 0`.
    pub fn markov(&self) -> Option<&MarkovHead> {
        self.markov.as_ref()
    }

    pub fn has_confidence_head(&self) -> bool {
        self.confidence.is_some()
    }

    /// The confidence head's logit per slot, `c = P · h + p` or, with
    /// `confidence_head_with_markov`, `P · [h ; W₁[prev]] + p` (the embedding in `h`'s
    /// dtype), squeezed and in f32 (f64 kept): `[…]` for `hidden` `[…, H]` and `prev` `[…]`.
    /// `None` without a confidence head. `h` is read as given: SpecForge's loss does not
    /// detach it (dflash_family_model.py:883-886), so the confidence loss trains the backbone.
    pub fn confidence_logit(&self, hidden: &Tensor, prev: &Tensor) -> Option<Tensor> {
        let proj = self.confidence.as_ref()?;
        let input = match (&self.markov, self.config.confidence_head_with_markov) {
            (Some(markov), true) => {
                let embedded = markov.prev_embeddings(prev).to_kind(hidden.kind());
                Tensor::cat(&[hidden, &embedded], -1)
            }
            _ => hidden.shallow_clone(),
        };
        Some(at_least_f32(&proj.forward(&input).squeeze_dim(-1)))
    }

    /// Parameter elements of both heads.
    pub fn numel(&self) -> i64 {
        self.markov.as_ref().map_or(0, MarkovHead::numel)
            + self.confidence.as_ref().map_or(0, BiasedLinear::numel)
    }
}

#[cfg(test)]
#[path = "dspark_tests.rs"]
mod tests;
