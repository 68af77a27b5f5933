use super::*;
use crate::model::drafter::DominoConfig;
use crate::train::dpace::dpace_block_weights;
use crate::train::tree_objective::tests::dense_tree_loss;
use crate::train::tree_objective::{TreeLoss, TreeObjective};
use dflash_shared::config::DpaceNormalization;
use tch::nn::VarStore;

const BS: i64 = 4;
const B: i64 = 2;
const N: i64 = 2;
const H: i64 = 8;
const V: i64 = 11;

/// A tiny Domino setup in f64: drafter output `x·proj` (x the leaf), label embeddings, the
/// LM head, targets and weights with unsupervised slots (slot 0 always).
struct Setup {
    vs: VarStore,
    head: DominoHead,
    x: Tensor,
    proj: Tensor,
    embeddings: Tensor,
    lm_head: Tensor,
    targets: Tensor,
    weights: Tensor,
}

fn setup(seed: i64, weights: &[f64]) -> Setup {
    let _rng = crate::device::global_rng::seeded(seed);
    let mut vs = VarStore::new(Device::Cpu);
    let cfg = DominoConfig {
        emb_dim: 5,
        gru_hidden_dim: 6,
        pure_draft_prefix_len: 1,
    };
    // A larger init than the real one, so the correction moves the logits visibly.
    let head = DominoHead::new(&vs.root(), &cfg, H, V, 0.5);
    vs.set_kind(Kind::Double);
    let opts = (Kind::Double, Device::Cpu);
    Setup {
        vs,
        head,
        x: Tensor::randn([B, N * BS, H], opts).set_requires_grad(true),
        proj: Tensor::randn([H, H], opts),
        embeddings: Tensor::randn([B, N * BS, H], opts),
        lm_head: Tensor::randn([V, H], opts),
        targets: Tensor::randint(V, [B, N * BS], (Kind::Int64, Device::Cpu)),
        weights: Tensor::from_slice(weights).view([B, N * BS]),
    }
}

const DFLASH_WEIGHTS: [f64; 16] = [
    0.0, 1.0, 0.8, 0.6, 0.0, 1.0, 0.0, 0.6, // block 1: slot 2 unsupervised
    0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.8, 0.6, // block 2 of row 1 trains nothing
];
const DPACE_MASK: [f64; 16] = [
    0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, //
    0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0,
];
/// Row 1 has no supervised slot at all (every anchor padding).
const DPACE_MASK_ROW_WITHOUT_ANCHOR: [f64; 16] = [
    0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, //
    0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
];

impl Setup {
    fn batch<'a>(&'a self, weights: &'a Tensor) -> DominoBatch<'a> {
        DominoBatch {
            head: &self.head,
            lm_head: &self.lm_head,
            label_embeddings: &self.embeddings,
            targets: &self.targets,
            weights,
            block_size: BS,
        }
    }

    fn out(&self) -> Tensor {
        self.x.matmul(&self.proj)
    }

    /// Every gradient the loss reaches, flattened: the drafter input's and the head's four.
    fn grads(&self) -> Vec<(String, Tensor)> {
        let mut list = vec![("x".to_string(), self.x.grad().copy())];
        let mut vars: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, var) in vars {
            let g = var.grad();
            list.push((
                name,
                if g.defined() {
                    g.copy()
                } else {
                    var.zeros_like()
                },
            ));
        }
        list
    }

    fn zero_grads(&self) {
        let vars = self.vs.trainable_variables();
        for t in std::iter::once(&self.x).chain(vars.iter()) {
            let mut g = t.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// D-PACE's weights of both terms from their own cross-entropies, each sequence's times
    /// its normalisation's factor, and the divisor, written out per sequence: `A` its blocks
    /// with a supervised slot, `T` its supervised slots.
    fn dense_dpace_weights(
        &self,
        ce_final: &Tensor,
        ce_base: &Tensor,
        (alpha, normalization): (f64, DpaceNormalization),
        lambda: f64,
    ) -> (Tensor, Tensor, Tensor) {
        let m: Vec<bool> = Vec::<f64>::try_from(self.weights.view([-1]))
            .unwrap()
            .iter()
            .map(|&v| v > 0.0)
            .collect();
        let weigh = |ce: &Tensor| {
            let q = Vec::<f64>::try_from(ce.detach().neg().exp()).unwrap();
            let mut all = Vec::new();
            for (qb, mb) in q.chunks(BS as usize).zip(m.chunks(BS as usize)) {
                all.extend(dpace_block_weights(qb, mb, alpha));
            }
            all
        };
        let (w_final, w_base) = (weigh(ce_final), weigh(ce_base));
        let slots = (N * BS) as usize;
        let anchors: Vec<f64> = m
            .chunks(slots)
            .map(|row| {
                row.chunks(BS as usize)
                    .filter(|b| b.contains(&true))
                    .count() as f64
            })
            .collect();
        let tokens: Vec<f64> = m
            .chunks(slots)
            .map(|row| row.iter().filter(|&&v| v).count() as f64)
            .collect();
        let rows = B as f64;
        let (factor, divisor): (Vec<f64>, f64) = match normalization {
            DpaceNormalization::Sequences => (vec![1.0; B as usize], rows),
            DpaceNormalization::WeightSum => (
                vec![1.0; B as usize],
                (1.0 - lambda) * w_final.iter().sum::<f64>() + lambda * w_base.iter().sum::<f64>(),
            ),
            DpaceNormalization::AnchorsPerSequence => (
                anchors
                    .iter()
                    .map(|&a| if a > 0.0 { 1.0 / a } else { 0.0 })
                    .collect(),
                anchors.iter().filter(|&&a| a > 0.0).count() as f64,
            ),
            DpaceNormalization::TokensPerSequence => {
                (tokens.iter().map(|&t| 1.0 / (t + 1e-5)).collect(), rows)
            }
        };
        let per_slot: Vec<f64> = (0..m.len()).map(|i| factor[i / slots]).collect();
        let scaled = |w: Vec<f64>| Tensor::from_slice(&w) * Tensor::from_slice(&per_slot);
        (scaled(w_final), scaled(w_base), Tensor::from(divisor))
    }

    /// The written-out formula, dense and in f64: every slot's base logits and, from slot
    /// `1 + pure_draft_prefix_len` on, the correction added; their cross-entropies, the
    /// objective's weights, `(1−λ)·final + λ·base` over the divisor; and the divisor.
    fn dense_loss(&self, objective: LossObjective, lambda: f64) -> (Tensor, f64) {
        let z = self.out();
        let states = self.head.slot_states(&self.embeddings, BS);
        let base = z.matmul(&self.lm_head.tr()).view([-1, V]);
        let slot_corrected: Vec<f64> = (0..B * N * BS)
            .map(|q| f64::from(u8::from(q % BS >= 2)))
            .collect();
        let corrected = &base
            + self.head.correction(&z, &states).view([-1, V])
                * Tensor::from_slice(&slot_corrected).view([-1, 1]);
        let t = self.targets.view([-1]);
        let ce = |l: &Tensor| l.cross_entropy_loss::<Tensor>(&t, None, Reduction::None, -100, 0.0);
        let (ce_final, ce_base) = (ce(&corrected), ce(&base));
        let w = self.weights.view([-1]);
        let (w_final, w_base, divisor) = match objective {
            LossObjective::Dflash => (w.shallow_clone(), w.shallow_clone(), w.sum(Kind::Double)),
            LossObjective::Dpace {
                alpha,
                normalization,
            } => self.dense_dpace_weights(&ce_final, &ce_base, (alpha, normalization), lambda),
            LossObjective::Tree(tree) => {
                let targets = Vec::<i64>::try_from(&t).unwrap();
                let mask: Vec<bool> = Vec::<f64>::try_from(&w)
                    .unwrap()
                    .iter()
                    .map(|&v| v > 0.0)
                    .collect();
                let loss =
                    |logits: &Tensor| dense_tree_loss(logits, &targets, &mask, BS as usize, &tree);
                let blend = loss(&corrected) * (1.0 - lambda) + loss(&base) * lambda;
                return (blend / B as f64, B as f64);
            }
        };
        let final_loss = (&ce_final * &w_final).sum(Kind::Double);
        let base_loss = (&ce_base * &w_base).sum(Kind::Double);
        let divided = (final_loss * (1.0 - lambda) + base_loss * lambda) / &divisor;
        (divided, divisor.double_value(&[]))
    }
}

fn assert_close(chunked: &[(String, Tensor)], dense: &[(String, Tensor)]) {
    for ((name, a), (_, b)) in chunked.iter().zip(dense) {
        let scale = b.abs().max().double_value(&[]).max(1e-6);
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(diff <= 1e-5 * scale, "{name}: {diff} against scale {scale}");
        assert!(scale > 1e-6, "{name} must get a gradient");
    }
}

/// The chunked backward of the numerator (denominator 1, as `RankState::step` runs it), its
/// gradients divided by the normaliser it reports, against the dense formula's.
fn check_against_the_dense_formula(objective: LossObjective, weights: &[f64], lambda: f64) {
    let s = setup(11, weights);
    let w = s.weights.shallow_clone();
    // Chunks of 3 positions: whole blocks, several chunks, the leaves' path.
    let sums = domino_ce_backward(&s.out(), &s.batch(&w), objective, lambda, 1.0, 3);
    let chunked: Vec<(String, Tensor)> = s
        .grads()
        .into_iter()
        .map(|(name, g)| (name, g / sums.normaliser))
        .collect();
    s.zero_grads();
    let (dense, divisor) = s.dense_loss(objective, lambda);
    dense.backward();
    let expected = dense.double_value(&[]);
    // D-PACE's weights are computed in f32 in the chunks: their sum agrees to f32 rounding.
    assert!(
        (sums.normaliser - divisor).abs() < 1e-6 * divisor,
        "{objective:?}: normaliser {} vs {divisor}",
        sums.normaliser
    );
    assert!(
        (sums.loss() - expected).abs() < 1e-5 * expected.abs().max(1.0),
        "{objective:?}: {} vs {expected}",
        sums.loss()
    );
    // Each chunk's blend is one f32 sum: the blend of the totals agrees to f32 rounding.
    let blend = (1.0 - lambda) * sums.final_ce + lambda * sums.base_ce;
    assert!((blend - sums.weighted_ce).abs() < 1e-6 * blend.abs().max(1.0));
    assert_close(&chunked, &s.grads());
}

#[test]
fn the_dflash_curriculum_gradient_is_the_dense_formulas() {
    check_against_the_dense_formula(LossObjective::Dflash, &DFLASH_WEIGHTS, 0.3);
}

#[test]
fn the_dpace_curriculum_gradient_is_the_dense_formulas() {
    let dpace = LossObjective::Dpace {
        alpha: 0.5,
        normalization: DpaceNormalization::Sequences,
    };
    check_against_the_dense_formula(dpace, &DPACE_MASK, 0.7);
}

#[test]
fn every_dpace_normalization_of_the_curriculum_is_the_dense_formulas() {
    for normalization in DpaceNormalization::ALL {
        let dpace = LossObjective::Dpace {
            alpha: 0.5,
            normalization,
        };
        for mask in [&DPACE_MASK, &DPACE_MASK_ROW_WITHOUT_ANCHOR] {
            for lambda in [0.0, 0.7] {
                check_against_the_dense_formula(dpace, mask, lambda);
            }
        }
    }
}

#[test]
fn the_tree_objectives_curriculum_gradient_is_the_dense_formulas() {
    for loss in [TreeLoss::Margin, TreeLoss::Expected] {
        // A budget and scale at which the deepest slot, the one whose GRU state has read two
        // tokens (the only one `weight_hh` reaches), still has its parent in the tree.
        let tree = TreeObjective {
            budget: 40,
            temperature: 3.0,
            loss,
        };
        check_against_the_dense_formula(LossObjective::Tree(tree), &DPACE_MASK, 0.4);
    }
}

#[test]
fn the_gru_gradient_agrees_with_finite_differences() {
    let s = setup(4, &DFLASH_WEIGHTS);
    let w = s.weights.shallow_clone();
    let denominator = w.sum(Kind::Double).double_value(&[]);
    let _ = domino_ce_backward(
        &s.out(),
        &s.batch(&w),
        LossObjective::Dflash,
        0.25,
        denominator,
        5,
    );
    let var = |name: &str| s.vs.variables()[name].shallow_clone();
    for (name, index) in [
        ("prefix_gru.weight_hh_l0", [3, 2]),
        ("prefix_gru.weight_ih_l0", [14, 5]),
        ("embed_proj.0.weight", [2, 9]),
    ] {
        let param = var(name);
        let analytic = param.grad().double_value(&index);
        let eps = 1e-5;
        let at = |delta: f64| {
            tch::no_grad(|| {
                let mut entry = param.get(index[0]).get(index[1]);
                let _ = entry.g_add_scalar_(delta);
            });
            let loss =
                tch::no_grad(|| s.dense_loss(LossObjective::Dflash, 0.25).0).double_value(&[]);
            tch::no_grad(|| {
                let mut entry = param.get(index[0]).get(index[1]);
                let _ = entry.g_add_scalar_(-delta);
            });
            loss
        };
        let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
        assert!(
            (analytic - numeric).abs() < 1e-3 * numeric.abs().max(1e-2),
            "{name}{index:?}: autograd {analytic}, finite differences {numeric}"
        );
    }
}

#[test]
fn at_lambda_one_only_the_base_loss_trains_and_the_head_gets_nothing() {
    let s = setup(2, &DFLASH_WEIGHTS);
    let w = s.weights.shallow_clone();
    let _ = domino_ce_backward(&s.out(), &s.batch(&w), LossObjective::Dflash, 1.0, 1.0, 64);
    for (name, g) in s.grads() {
        let size = g.abs().sum(Kind::Double).double_value(&[]);
        if name == "x" {
            assert!(size > 0.0, "the backbone trains on the base loss");
        } else {
            assert_eq!(size, 0.0, "{name}");
        }
    }
}

#[test]
fn the_evaluation_sums_are_the_training_sums_at_lambda_zero() {
    let s = setup(8, &DFLASH_WEIGHTS);
    let w = s.weights.shallow_clone();
    let trained = domino_ce_backward(&s.out(), &s.batch(&w), LossObjective::Dflash, 0.0, 1.0, 3);
    let evaluated = domino_ce(&s.out(), &s.batch(&w), LossObjective::Dflash, 1000);
    assert!((trained.weighted_ce - evaluated.weighted_ce).abs() < 1e-4);
    assert!((trained.base_ce - evaluated.base_ce).abs() < 1e-4);
    assert_eq!(
        (
            trained.accepted,
            trained.base_accepted,
            trained.accept_blocks
        ),
        (
            evaluated.accepted,
            evaluated.base_accepted,
            evaluated.accept_blocks
        )
    );
    assert_eq!(
        trained.accept_blocks, 3.0,
        "the block without a weight is not counted"
    );
}

#[test]
fn acceptance_counts_the_leading_supervised_hits_as_specforge_does() {
    let t = |v: &[bool]| Tensor::from_slice(v).view([-1, 4]);
    let supervised = t(&[
        false, true, true, true, // a full block
        false, true, false, true, // an unsupervised slot is skipped, not a miss
        false, false, false, false, // nothing supervised: not a block that counts
    ]);
    let hit = t(&[
        false, true, false, true, // 1 accepted, then a miss
        false, true, false, true, // 2 accepted
        true, true, true, true,
    ]);
    assert_eq!(accepted_counts(&hit, &supervised), (2.0 + 3.0, 2.0));
}

#[test]
fn lambda_falls_linearly_to_zero_as_specforges_schedule() {
    // SpecForge's own cases (`test_lambda_base_decays_over_total_steps`).
    assert_eq!(lambda_base(0, 10, 1.0, 0.5), 1.0);
    assert_eq!(lambda_base(5, 10, 1.0, 0.5), 0.0);
    assert_eq!(lambda_base(10, 10, 1.0, 0.5), 0.0);
    assert_eq!(
        lambda_base(3, 0, 1.0, 0.5),
        0.0,
        "no schedule: the final loss alone"
    );
    assert!((lambda_base(2, 10, 1.0, 0.5) - 0.6).abs() < 1e-12);
    assert!((lambda_base(2, 10, 0.5, 0.5) - 0.3).abs() < 1e-12);
    // ⌊7·0.5⌋ = 3 decay steps; a zero ratio still decays over one step.
    assert!((lambda_base(1, 7, 1.0, 0.5) - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(lambda_base(0, 10, 1.0, 0.0), 1.0);
    assert_eq!(lambda_base(1, 10, 1.0, 0.0), 0.0);
}
