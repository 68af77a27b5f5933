//! DFlash2's two additions to the DFlash backbone (SpecForge `DFlash2DraftModel`,
//! `specforge/modeling/draft/dflash2.py` at 0dcf8859; z-lab's and SGLang's loaders read the
//! same names):
//!
//! - a grouped dynamic convolution around every attention and MLP ([`GroupedConv`]): inside
//!   each block, causal, `out_t = Σ_tap (base[tap] + Δ_t[tap, group]) ⊙ x_{t−tap}`, its
//!   per-position coefficients `Δ` projected from the sublayer's input. The base kernel starts
//!   as the identity and the projection at zero, so a fresh layer is DFlash's;
//! - a candidate selector ([`CandidateSelector`]): the LM head's logits, scaled and soft-capped
//!   ([`unary_logits`]), give each slot's top-K candidates and their unary scores `U`, and the
//!   selector adds a low-rank transition from the previous token,
//!   `S(c) = U(c) + ⟨A[prev] ⊙ W_h·h, B[c]⟩`. `B` starts at zero, so a fresh selector ranks the
//!   candidates as the LM head does.
use tch::{nn, Tensor};

use super::config::Dflash2Config;
use super::dspark::at_least_f32;

/// One grouped dynamic convolution (`layers.{i}.attention_conv` or `.mlp_conv`):
/// `base_kernel` `[2, taps, H]` (side 0 convolves the sublayer's input, side 1 its output) and
/// `kernel_projection` `[2·taps·G, H]`, `G = H / group_size` groups of channels.
pub struct GroupedConv {
    pub(crate) base_kernel: Tensor,
    /// `[2·taps·G, H]` (bias-free).
    pub(crate) kernel_projection: Tensor,
    taps: i64,
    groups: i64,
    group_size: i64,
    block_size: i64,
}

/// The output side's coefficients, computed from the sublayer's input by
/// [`GroupedConv::prepare`] and applied by [`GroupedConv::finish`]: `[B, Q, taps, G]`.
pub struct OutputKernel(Tensor);

impl GroupedConv {
    /// `vs` is `layers.{i}.attention_conv` (or `mlp_conv`).
    pub fn new(vs: &nn::Path, cfg: &Dflash2Config, hidden_size: i64, block_size: i64) -> Self {
        let taps = cfg.conv_kernel_size;
        let groups = cfg.conv_groups(hidden_size);
        let base_kernel = vs.zeros("base_kernel", &[2, taps, hidden_size]);
        tch::no_grad(|| {
            let _ = base_kernel.narrow(1, 0, 1).fill_(1.0);
        });
        let kernel_projection =
            (vs / "kernel_projection").zeros("weight", &[2 * taps * groups, hidden_size]);
        Self {
            base_kernel,
            kernel_projection,
            taps,
            groups,
            group_size: cfg.conv_group_size,
            block_size,
        }
    }

    /// `x` `[B, Q, H]` (whole blocks) convolved with the input side, and the output side's
    /// coefficients, both projected from `x`.
    pub fn prepare(&self, x: &Tensor) -> (Tensor, OutputKernel) {
        let size = x.size();
        let coefficients = x.linear::<Tensor>(&self.kernel_projection, None).view([
            size[0],
            size[1],
            2,
            self.taps,
            self.groups,
        ]);
        let input_side = self.convolve(x, &coefficients.select(2, 0), 0);
        (input_side, OutputKernel(coefficients.select(2, 1)))
    }

    /// The sublayer's output `y` `[B, Q, H]` convolved with the output side.
    pub fn finish(&self, y: &Tensor, kernel: &OutputKernel) -> Tensor {
        self.convolve(y, &kernel.0, 1)
    }

    /// `out_t = Σ_tap (base[side, tap] + Δ_t[tap, group]) ⊙ x_{t−tap}`, zero before each
    /// block's first slot.
    fn convolve(&self, x: &Tensor, delta: &Tensor, side: i64) -> Tensor {
        let size = x.size();
        let (b, q, h) = (size[0], size[1], size[2]);
        let bs = self.block_size;
        assert!(
            q % bs == 0,
            "DFlash2 convolution: {q} positions are not whole blocks of {bs}"
        );
        let n = q / bs;
        let blocks = x.view([b, n, bs, self.groups, self.group_size]);
        let dynamic = delta.reshape([b, n, bs, self.taps, self.groups, 1]);
        let base =
            self.base_kernel
                .get(side)
                .view([1, 1, 1, self.taps, self.groups, self.group_size]);
        let coefficients = base + dynamic;
        let mut out = coefficients.select(3, 0) * &blocks;
        for tap in 1..self.taps {
            let shifted = blocks
                .narrow(2, 0, bs - tap)
                .constant_pad_nd([0, 0, 0, 0, tap, 0]);
            out += coefficients.select(3, tap) * shifted;
        }
        out.view([b, q, h])
    }
}

/// The selector (`candidate_selector.*`): `predecessor_codebook` `A` `[V, r]`,
/// `successor_codebook` `B` `[V, r]` (raw tensors, SpecForge's and SGLang's names) and
/// `hidden_projection` `W_h` `[r, H]`.
pub struct CandidateSelector {
    pub(crate) predecessor_codebook: Tensor,
    pub(crate) successor_codebook: Tensor,
    /// `[r, H]` (bias-free).
    pub(crate) hidden_projection: Tensor,
    config: Dflash2Config,
}

impl CandidateSelector {
    /// Under `vs / "candidate_selector"`; `A` and `W_h` drawn from `N(0, σ)`, `B` zero.
    pub fn new(vs: &nn::Path, cfg: &Dflash2Config, hidden: i64, vocab: i64, std: f64) -> Self {
        let vs = vs / "candidate_selector";
        let r = cfg.selector_rank;
        let init = nn::Init::Randn {
            mean: 0.0,
            stdev: std,
        };
        Self {
            predecessor_codebook: vs.var("predecessor_codebook", &[vocab, r], init),
            successor_codebook: vs.zeros("successor_codebook", &[vocab, r]),
            hidden_projection: (&vs / "hidden_projection").var("weight", &[r, hidden], init),
            config: *cfg,
        }
    }

    pub fn top_k(&self) -> i64 {
        self.config.selector_top_k
    }

    /// The unary scores of the LM head's `logits` (`[..., V]`, any float kind) in fp32 or wider
    /// ([`unary_logits`] with this drafter's multiplier and cap).
    pub fn unary(&self, logits: &Tensor) -> Tensor {
        unary_logits(logits, &self.config)
    }

    /// The unary top-K of `unary` `[..., V]`: scores and candidate ids, each `[..., K]`, best
    /// first.
    pub fn candidates(&self, unary: &Tensor) -> (Tensor, Tensor) {
        unary.topk(self.top_k(), -1, true, true)
    }

    /// `S(c) = U(c) + ⟨A[prev] ⊙ W_h·h, B[c]⟩` for each candidate: `candidate_ids` and
    /// `unary` `[..., K]`, `hidden` `[..., H]`, `predecessor_ids` `[...]`. fp32 (or wider).
    pub fn score(
        &self,
        candidate_ids: &Tensor,
        unary: &Tensor,
        hidden: &Tensor,
        predecessor_ids: &Tensor,
    ) -> Tensor {
        let lead = predecessor_ids.size();
        let r = self.config.selector_rank;
        let predecessor = self
            .predecessor_codebook
            .index_select(0, &predecessor_ids.reshape([-1]))
            .view([-1, r]);
        let successor = self
            .successor_codebook
            .index_select(0, &candidate_ids.reshape([-1]))
            .view([-1, self.top_k(), r]);
        let context = predecessor
            * hidden
                .to_kind(self.hidden_projection.kind())
                .linear::<Tensor>(&self.hidden_projection, None)
                .view([-1, r]);
        let transition = successor.matmul(&context.unsqueeze(-1)).squeeze_dim(-1);
        let mut shape = lead;
        shape.push(self.top_k());
        at_least_f32(unary) + at_least_f32(&transition.view(shape.as_slice()))
    }

    /// The greedy walk a serving engine takes through one block's candidates: slot by slot,
    /// the best-scoring candidate given the previous pick (the anchor token first).
    /// `candidate_ids`, `unary` `[B, L, K]`, `hidden` `[B, L, H]`, `anchor_ids` `[B]` →
    /// `[B, L]`.
    pub fn greedy_path(
        &self,
        candidate_ids: &Tensor,
        unary: &Tensor,
        hidden: &Tensor,
        anchor_ids: &Tensor,
    ) -> Tensor {
        let slots = candidate_ids.size()[1];
        let mut previous = anchor_ids.shallow_clone();
        let mut path = Vec::with_capacity(slots as usize);
        for slot in 0..slots {
            let ids = candidate_ids.select(1, slot);
            let scores = self.score(
                &ids,
                &unary.select(1, slot),
                &hidden.select(1, slot),
                &previous,
            );
            previous = ids
                .gather(1, &scores.argmax(-1, true), false)
                .squeeze_dim(1);
            path.push(previous.shallow_clone());
        }
        Tensor::stack(&path, 1)
    }
}

/// The unary scores of DFlash2 (SpecForge `transform_unary_logits`): the LM head's logits in
/// fp32 (f64 stays f64) times `output_multiplier`, then `s·tanh(U/s)` where
/// `final_logit_softcapping` is `s`.
pub fn unary_logits(logits: &Tensor, cfg: &Dflash2Config) -> Tensor {
    let scaled = at_least_f32(logits) * cfg.output_multiplier;
    match cfg.final_logit_softcapping {
        Some(cap) => (scaled / cap).tanh() * cap,
        None => scaled,
    }
}

#[cfg(test)]
#[path = "dflash2_tests.rs"]
mod tests;
