//! Weighted cross-entropy through the frozen LM head, in chunks (spec §2.7, §8.2).
//!
//! Full logits (`positions × vocab`) are the largest tensor of a step: 8192 × 248320 is 8 GB in
//! fp32. The drafter output is cut from the graph (`detach().requires_grad_()`), and the head +
//! CE run chunk by chunk, each chunk backpropagated at once so only one chunk's logits live at a
//! time. The accumulated gradient on the detached output then flows into the drafter with a
//! single backward. Only positions with a non-zero weight are projected at all.
use tch::{Kind, Reduction, Tensor};

pub use super::dflash2_sums::Dflash2Sums;

/// Sums over the weighted positions of one micro-batch (not yet divided by anything).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossSums {
    /// Σ w · CE.
    pub weighted_ce: f64,
    /// Σ w.
    pub weight: f64,
    /// What the objective divides `weighted_ce` by once every micro-batch of the optimizer step
    /// is summed: Σ w for DFlash (a weighted mean), what `training.dpace_normalization` names
    /// for D-PACE (`train/dpace.rs`), the number of sequences for the tree objective. Additive,
    /// so summing it over micro-batches and ranks gives the global divisor.
    pub normaliser: f64,
    /// Positions with w > 0 whose argmax equals the label.
    pub correct: u64,
    /// Positions with w > 0.
    pub counted: u64,
    /// Domino only (`train/domino.rs`), else 0: the objective's numerator on the corrected
    /// logits and on the base logits; `weighted_ce` is their curriculum blend.
    pub final_ce: f64,
    pub base_ce: f64,
    /// Domino only: Σ over blocks with a supervised slot of 1 + its accepted prefix, from the
    /// corrected and from the base logits, and the number of those blocks.
    pub accepted: f64,
    pub base_accepted: f64,
    pub accept_blocks: f64,
    /// DSpark only (`train/dspark.rs`), else zeros: its terms and telemetry. `weighted_ce` is
    /// then DSpark's weighted numerator, `weight` and `normaliser` Σw, `correct` and
    /// `counted` the corrected logits' hits over the supervised slots.
    pub dspark: DsparkSums,
    /// DFlash2 only (`train/dflash2.rs`), else zeros: its base and selector terms and its
    /// acceptance telemetry. `weighted_ce` is then the whole numerator (base + α_eff·selector),
    /// `correct` the unary argmax's hits.
    pub dflash2: Dflash2Sums,
}

/// DSpark's additive sums over one micro-batch's supervised slots (`m_k = 1`, weight `w_k`):
/// SpecForge's `ratio_metrics` numerators (`dflash_family_model.py:1031-1054`), and the same
/// acceptance from the LM head's logits alone, so a Markov head that changes nothing shows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DsparkSums {
    /// Σ w·CE of the Markov-corrected logits.
    pub ce: f64,
    /// Σ w·L1, `L1 = Σ_v |q − p|` between the drafter's and the target's distributions.
    pub l1: f64,
    /// Σ w·BCE of the confidence logit against `a = clamp(1 − L1/2, 0, 1)`.
    pub confidence: f64,
    /// Σ w·|σ(c) − a|.
    pub confidence_abs_error: f64,
    /// Σ σ(c) over the supervised slots.
    pub confidence_probability: f64,
    /// Σ a over the supervised slots.
    pub accept_probability: f64,
    /// Supervised slots whose corrected argmax is the target's argmax.
    pub teacher_agreement: f64,
    /// Σ max_v p over the supervised slots.
    pub teacher_top1: f64,
    /// Σ max_v q over the supervised slots.
    pub draft_top1: f64,
    /// Σ over blocks with a supervised slot of `1 + Σ_k Π_{i≤k} a_i·m_i` (corrected logits).
    pub tau: f64,
    /// The same from the base logits `lm_head(h)`.
    pub base_tau: f64,
    /// Blocks with a supervised slot.
    pub tau_blocks: f64,
    /// Supervised slots whose base argmax is the label.
    pub base_correct: f64,
    /// Σ over the same blocks of `1 + Σ_k Π_{i≤k} [argmax_i = label_i]·m_i`: the greedy chain
    /// a decoder accepts, teacher-forced (every head's τ), from the corrected logits and the
    /// base ones.
    pub greedy_tau: f64,
    pub base_greedy_tau: f64,
}

impl DsparkSums {
    /// How many numbers [`Self::to_array`] writes.
    pub const LEN: usize = 15;

    pub fn add(&mut self, other: &DsparkSums) {
        let mut sum = self.to_array();
        for (a, b) in sum.iter_mut().zip(other.to_array()) {
            *a += b;
        }
        *self = Self::from_array(sum);
    }

    pub fn to_array(&self) -> [f64; Self::LEN] {
        [
            self.ce,
            self.l1,
            self.confidence,
            self.confidence_abs_error,
            self.confidence_probability,
            self.accept_probability,
            self.teacher_agreement,
            self.teacher_top1,
            self.draft_top1,
            self.tau,
            self.base_tau,
            self.tau_blocks,
            self.base_correct,
            self.greedy_tau,
            self.base_greedy_tau,
        ]
    }

    pub fn from_array(a: [f64; Self::LEN]) -> Self {
        Self {
            ce: a[0],
            l1: a[1],
            confidence: a[2],
            confidence_abs_error: a[3],
            confidence_probability: a[4],
            accept_probability: a[5],
            teacher_agreement: a[6],
            teacher_top1: a[7],
            draft_top1: a[8],
            tau: a[9],
            base_tau: a[10],
            tau_blocks: a[11],
            base_correct: a[12],
            greedy_tau: a[13],
            base_greedy_tau: a[14],
        }
    }
}

/// DSpark's logged ratios ([`LossSums::dspark_metrics`]), named as SpecForge logs them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DsparkMetrics {
    /// `acc`: corrected argmax = label, over the supervised slots.
    pub acc: f64,
    /// The base logits' accuracy over the same slots.
    pub base_acc: f64,
    /// `ce_loss`, `l1_loss`, `confidence_loss`, `confidence_abs_error`: over Σw.
    pub ce_loss: f64,
    pub l1_loss: f64,
    pub confidence_loss: f64,
    pub confidence_abs_error: f64,
    /// Mean σ(c) and mean `a` over the supervised slots: the head's calibration at a glance.
    pub confidence_mean: f64,
    pub accept_probability_mean: f64,
    /// `teacher_agreement`, `teacher_top1_prob`, `draft_top1_prob`: over the supervised slots.
    pub teacher_agreement: f64,
    pub teacher_top1_prob: f64,
    pub draft_top1_prob: f64,
    /// `tau_probabilistic`: mean expected accepted length per block, corrected logits.
    pub tau_probabilistic: f64,
    /// The same from the base logits.
    pub base_tau_probabilistic: f64,
    /// The teacher-forced greedy chain τ per block (comparable with online chain τ), corrected
    /// and base logits.
    pub greedy_tau: f64,
    pub base_greedy_tau: f64,
}

impl LossSums {
    pub fn add(&mut self, other: &LossSums) {
        self.weighted_ce += other.weighted_ce;
        self.weight += other.weight;
        self.normaliser += other.normaliser;
        self.correct += other.correct;
        self.counted += other.counted;
        self.final_ce += other.final_ce;
        self.base_ce += other.base_ce;
        self.accepted += other.accepted;
        self.base_accepted += other.base_accepted;
        self.accept_blocks += other.accept_blocks;
        self.dspark.add(&other.dspark);
        self.dflash2.add(&other.dflash2);
    }

    /// How many numbers [`Self::to_array`] writes.
    pub const LEN: usize = 10 + DsparkSums::LEN + Dflash2Sums::LEN;

    /// The additive sums as one list (for summing across ranks) and back.
    pub fn to_array(&self) -> [f64; Self::LEN] {
        let own = [
            self.weighted_ce,
            self.weight,
            self.normaliser,
            self.correct as f64,
            self.counted as f64,
            self.final_ce,
            self.base_ce,
            self.accepted,
            self.base_accepted,
            self.accept_blocks,
        ];
        let mut out = [0.0; Self::LEN];
        let values = own
            .into_iter()
            .chain(self.dspark.to_array())
            .chain(self.dflash2.to_array());
        for (slot, value) in out.iter_mut().zip(values) {
            *slot = value;
        }
        out
    }

    pub fn from_array(a: [f64; Self::LEN]) -> Self {
        let mut dspark = [0.0; DsparkSums::LEN];
        dspark.copy_from_slice(&a[10..10 + DsparkSums::LEN]);
        let mut dflash2 = [0.0; Dflash2Sums::LEN];
        dflash2.copy_from_slice(&a[10 + DsparkSums::LEN..]);
        Self {
            weighted_ce: a[0],
            weight: a[1],
            normaliser: a[2],
            correct: a[3] as u64,
            counted: a[4] as u64,
            final_ce: a[5],
            base_ce: a[6],
            accepted: a[7],
            base_accepted: a[8],
            accept_blocks: a[9],
            dspark: DsparkSums::from_array(dspark),
            dflash2: Dflash2Sums::from_array(dflash2),
        }
    }

    /// DSpark's ratios from the (summed) sums; zeros where a denominator is.
    pub fn dspark_metrics(&self) -> DsparkMetrics {
        let d = &self.dspark;
        let slots = self.counted as f64;
        DsparkMetrics {
            acc: ratio(self.correct as f64, slots),
            base_acc: ratio(d.base_correct, slots),
            ce_loss: ratio(d.ce, self.weight),
            l1_loss: ratio(d.l1, self.weight),
            confidence_loss: ratio(d.confidence, self.weight),
            confidence_abs_error: ratio(d.confidence_abs_error, self.weight),
            confidence_mean: ratio(d.confidence_probability, slots),
            accept_probability_mean: ratio(d.accept_probability, slots),
            teacher_agreement: ratio(d.teacher_agreement, slots),
            teacher_top1_prob: ratio(d.teacher_top1, slots),
            draft_top1_prob: ratio(d.draft_top1, slots),
            tau_probabilistic: ratio(d.tau, d.tau_blocks),
            base_tau_probabilistic: ratio(d.base_tau, d.tau_blocks),
            greedy_tau: ratio(d.greedy_tau, d.tau_blocks),
            base_greedy_tau: ratio(d.base_greedy_tau, d.tau_blocks),
        }
    }

    /// Domino's corrected-logit loss (`final_ce / normaliser`).
    pub fn final_loss(&self) -> f64 {
        ratio(self.final_ce, self.normaliser)
    }

    /// Domino's base-logit loss (`base_ce / normaliser`).
    pub fn base_loss(&self) -> f64 {
        ratio(self.base_ce, self.normaliser)
    }

    /// SpecForge's `accept_len`: mean over blocks of 1 + the accepted prefix (corrected logits).
    pub fn accept_len(&self) -> f64 {
        ratio(self.accepted, self.accept_blocks)
    }

    /// SpecForge's `base_accept_len`: the same from the base logits.
    pub fn base_accept_len(&self) -> f64 {
        ratio(self.base_accepted, self.accept_blocks)
    }

    /// Σ w·CE / normaliser: the objective's loss (0 when nothing was weighted).
    pub fn loss(&self) -> f64 {
        if self.normaliser > 0.0 {
            self.weighted_ce / self.normaliser
        } else {
            0.0
        }
    }

    pub fn accuracy(&self) -> f64 {
        if self.counted > 0 {
            self.correct as f64 / self.counted as f64
        } else {
            0.0
        }
    }
}

fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else {
        0.0
    }
}

/// Flat indices of positions with a positive weight, and those weights, on the weights' device.
pub(crate) fn weighted_positions(weights: &Tensor) -> (Tensor, Tensor) {
    let flat = weights.reshape([-1]);
    let idx = flat.gt(0.0).nonzero().reshape([-1]);
    let w = flat.index_select(0, &idx).to_kind(Kind::Float);
    (idx, w)
}

/// Computes `Σ w·CE / denominator` over all positions of `drafter_out` and backpropagates it
/// into the drafter's parameters, chunk by chunk.
///
/// - `drafter_out`: `[B, Q, H]`, the drafter's final-normed output, part of the autograd graph.
/// - `lm_head`: `[V, H]`, frozen (no gradient is ever taken for it).
/// - `targets`: `[B, Q]` int64; `weights`: `[B, Q]` (zero where a slot is not trained).
/// - `denominator`: Σ w over the whole optimizer batch (all micro-batches, all ranks), so
///   gradient accumulation yields the gradient of the global weighted mean.
/// - `chunk_positions`: how many weighted positions go through the head at once.
pub fn weighted_ce_backward(
    drafter_out: &Tensor,
    lm_head: &Tensor,
    targets: &Tensor,
    weights: &Tensor,
    denominator: f64,
    chunk_positions: i64,
) -> LossSums {
    let hidden = drafter_out.size().last().copied().unwrap_or(0);
    let (idx, w) = weighted_positions(weights);
    let tgt = targets.reshape([-1]).index_select(0, &idx);
    let total = idx.size()[0];
    let chunk = chunk_positions.max(1);
    // With one chunk nothing needs cutting: the head backpropagates straight into the drafter,
    // sparing a second pass over the graph (per-op overhead dominates small steps).
    let detached = (total > chunk).then(|| drafter_out.detach().set_requires_grad(true));
    let flat = detached
        .as_ref()
        .unwrap_or(drafter_out)
        .reshape([-1, hidden]);
    let mut sums = LossSums::default();
    let mut start = 0;
    while start < total {
        let len = chunk.min(total - start);
        let rows = idx.narrow(0, start, len);
        let h = flat.index_select(0, &rows);
        let logits = h.matmul(&lm_head.tr()).to_kind(Kind::Float);
        let ce = logits.cross_entropy_loss::<Tensor>(
            &tgt.narrow(0, start, len),
            None,
            Reduction::None,
            -100,
            0.0,
        );
        let wc = w.narrow(0, start, len);
        let numerator = (&ce * &wc).sum(Kind::Float);
        (&numerator / denominator).backward();
        let correct = tch::no_grad(|| {
            logits
                .argmax(-1, false)
                .eq_tensor(&tgt.narrow(0, start, len))
                .sum(Kind::Int64)
        });
        sums.weighted_ce += numerator.double_value(&[]);
        sums.weight += wc.sum(Kind::Double).double_value(&[]);
        sums.normaliser = sums.weight;
        sums.correct += correct.int64_value(&[]) as u64;
        sums.counted += len as u64;
        start += len;
    }
    if let Some(grad) = detached.map(|d| d.grad()).filter(Tensor::defined) {
        // d/d(out) of Σ(out · g) is exactly g: hands the accumulated gradient to the drafter.
        (drafter_out * grad.detach()).sum(Kind::Float).backward();
    }
    sums
}

/// The same loss without gradients (evaluation / validation), chunked the same way.
pub fn weighted_ce(
    drafter_out: &Tensor,
    lm_head: &Tensor,
    targets: &Tensor,
    weights: &Tensor,
    chunk_positions: i64,
) -> LossSums {
    tch::no_grad(|| {
        let hidden = drafter_out.size().last().copied().unwrap_or(0);
        let flat = drafter_out.reshape([-1, hidden]);
        let (idx, w) = weighted_positions(weights);
        let tgt = targets.reshape([-1]).index_select(0, &idx);
        let total = idx.size()[0];
        let chunk = chunk_positions.max(1);
        let mut sums = LossSums::default();
        let mut start = 0;
        while start < total {
            let len = chunk.min(total - start);
            let logits = flat
                .index_select(0, &idx.narrow(0, start, len))
                .matmul(&lm_head.tr())
                .to_kind(Kind::Float);
            let t = tgt.narrow(0, start, len);
            let ce = logits.cross_entropy_loss::<Tensor>(&t, None, Reduction::None, -100, 0.0);
            let wc = w.narrow(0, start, len);
            sums.weighted_ce += (&ce * &wc).sum(Kind::Double).double_value(&[]);
            sums.weight += wc.sum(Kind::Double).double_value(&[]);
            sums.normaliser = sums.weight;
            sums.correct += logits
                .argmax(-1, false)
                .eq_tensor(&t)
                .sum(Kind::Int64)
                .int64_value(&[]) as u64;
            sums.counted += len as u64;
            start += len;
        }
        sums
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn setup() -> (Tensor, Tensor, Tensor, Tensor, Tensor) {
        let _rng = crate::device::global_rng::seeded(0);
        let opts = (Kind::Float, Device::Cpu);
        let w_in = Tensor::randn([2, 5, 8], opts).set_requires_grad(true);
        let proj = Tensor::randn([8, 8], opts);
        let head = Tensor::randn([11, 8], opts);
        let targets = Tensor::randint(11, [2, 5], (Kind::Int64, Device::Cpu));
        let weights = Tensor::from_slice(&[0.0f32, 1.0, 0.5, 0.0, 0.25, 0.0, 1.0, 1.0, 0.3, 0.0])
            .view([2, 5]);
        (w_in, proj, head, targets, weights)
    }

    fn dense_loss(out: &Tensor, head: &Tensor, targets: &Tensor, weights: &Tensor) -> Tensor {
        let logits = out.matmul(&head.tr()).view([-1, 11]);
        let ce = logits.cross_entropy_loss::<Tensor>(
            &targets.view([-1]),
            None,
            Reduction::None,
            -100,
            0.0,
        );
        (ce * weights.view([-1])).sum(Kind::Float) / weights.sum(Kind::Float)
    }

    #[test]
    fn chunked_gradient_equals_the_dense_weighted_mean_gradient() {
        let (x, proj, head, targets, weights) = setup();
        let denom = weights.sum(Kind::Double).double_value(&[]);

        let out = x.matmul(&proj);
        let sums = weighted_ce_backward(&out, &head, &targets, &weights, denom, 2);
        let chunked_grad = x.grad().copy();
        let _ = x.grad().zero_();

        let reference = dense_loss(&x.matmul(&proj), &head, &targets, &weights);
        reference.backward();
        assert!((sums.loss() - reference.double_value(&[])).abs() < 1e-5);
        assert!(chunked_grad.allclose(&x.grad(), 1e-5, 1e-6, false));
        assert_eq!(sums.counted, 6);
        assert!((sums.weight - denom).abs() < 1e-6);
    }

    #[test]
    fn one_chunk_backpropagates_directly_with_the_same_gradient() {
        let (x, proj, head, targets, weights) = setup();
        let denom = weights.sum(Kind::Double).double_value(&[]);
        let many = weighted_ce_backward(&x.matmul(&proj), &head, &targets, &weights, denom, 2);
        let chunked_grad = x.grad().copy();
        let _ = x.grad().zero_();
        let one = weighted_ce_backward(&x.matmul(&proj), &head, &targets, &weights, denom, 1000);
        // Relative: the inputs come from the global generator, which tests running in
        // parallel also draw from, so the loss's size (and its f32 rounding) varies run to run.
        assert!(
            (many.loss() - one.loss()).abs() < 1e-6 * one.loss().abs().max(1.0),
            "{} vs {}",
            many.loss(),
            one.loss()
        );
        assert_eq!((many.correct, many.counted), (one.correct, one.counted));
        assert!(chunked_grad.allclose(&x.grad(), 1e-6, 1e-7, false));
        assert!(x.grad().abs().sum(Kind::Float).double_value(&[]) > 0.0);
    }

    #[test]
    fn chunk_size_does_not_change_the_result() {
        let (x, proj, head, targets, weights) = setup();
        let out = x.matmul(&proj);
        let a = weighted_ce(&out, &head, &targets, &weights, 1);
        let b = weighted_ce(&out, &head, &targets, &weights, 1000);
        assert!((a.loss() - b.loss()).abs() < 1e-6);
        assert_eq!(a.correct, b.correct);
    }

    #[test]
    fn the_head_gets_no_gradient_and_zero_weights_contribute_nothing() {
        let (x, proj, head, targets, _) = setup();
        let head = head.set_requires_grad(false);
        let zero = Tensor::zeros([2, 5], (Kind::Float, Device::Cpu));
        let sums = weighted_ce_backward(&x.matmul(&proj), &head, &targets, &zero, 1.0, 4);
        assert_eq!(sums, LossSums::default());
        assert!(!x.grad().defined() || x.grad().abs().sum(Kind::Float).double_value(&[]) == 0.0);
        assert!(!head.grad().defined());
    }

    #[test]
    fn the_array_round_trip_carries_every_sum_dsparks_and_dflash2s_included() {
        let mut values = [0.0; LossSums::LEN];
        for (i, v) in values.iter_mut().enumerate() {
            *v = (i + 1) as f64;
        }
        let sums = LossSums::from_array(values);
        assert_eq!(sums.to_array(), values);
        assert_eq!(sums.dspark.base_greedy_tau, (10 + DsparkSums::LEN) as f64);
        assert_eq!(sums.dflash2.blocks, LossSums::LEN as f64);
        let mut doubled = sums;
        doubled.add(&sums);
        let twice: Vec<f64> = values.iter().map(|v| 2.0 * v).collect();
        assert_eq!(doubled.to_array().to_vec(), twice);
        // DFlash leaves DSpark's sums at zero, and its ratios with them.
        assert_eq!(
            LossSums::default().dspark_metrics(),
            DsparkMetrics::default()
        );
    }

    #[test]
    fn accuracy_counts_argmax_hits() {
        // Head = identity over 3 classes: the argmax is the largest input coordinate.
        let head = Tensor::eye(3, (Kind::Float, Device::Cpu));
        let out = Tensor::from_slice(&[5.0f32, 0.0, 0.0, 0.0, 5.0, 0.0]).view([1, 2, 3]);
        let targets = Tensor::from_slice(&[0i64, 2]).view([1, 2]);
        let weights = Tensor::from_slice(&[1.0f32, 1.0]).view([1, 2]);
        let s = weighted_ce(&out, &head, &targets, &weights, 8);
        assert_eq!((s.correct, s.counted), (1, 2));
        assert_eq!(s.accuracy(), 0.5);
    }
}
