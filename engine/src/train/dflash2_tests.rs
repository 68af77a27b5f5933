use std::collections::HashMap;

use tch::nn::VarStore;

use super::*;
use crate::model::drafter::Dflash2Config;
use crate::train::block_objective::{block_objective_backward, BlockObjectiveBatch};
use dflash_shared::config::DpaceNormalization;

const B: i64 = 3;
const BS: i64 = 4;
const N: i64 = 2;
const Q: i64 = N * BS;
const H: i64 = 6;
const V: i64 = 9;
const K: i64 = 3;
const R: i64 = 2;

fn head(multiplier: f64, cap: Option<f64>) -> Dflash2Config {
    Dflash2Config {
        conv_kernel_size: 2,
        conv_group_size: 2,
        selector_rank: R,
        selector_top_k: K,
        output_multiplier: multiplier,
        final_logit_softcapping: cap,
    }
}

/// A selector in f64 with every parameter drawn (B too, so the transition is live).
fn selector(cfg: &Dflash2Config, seed: i64) -> (VarStore, CandidateSelector) {
    let _rng = crate::device::global_rng::seeded(seed);
    let mut vs = VarStore::new(Device::Cpu);
    let selector = CandidateSelector::new(&vs.root(), cfg, H, V, 0.5);
    vs.set_kind(Kind::Double);
    tch::no_grad(|| {
        for (_, mut var) in vs.variables() {
            var.copy_(&Tensor::randn(var.size(), (Kind::Double, Device::Cpu)));
        }
    });
    (vs, selector)
}

struct Case {
    out: Tensor,
    lm_head: Tensor,
    targets: Tensor,
    weights: Tensor,
}

/// Three rows of two blocks: row 0's first block has a loss-mask hole at slot 2 (slot 3 still
/// supervised); row 1's second block runs past the sequence end (slots 2 and 3 unsupervised);
/// row 2 has no valid anchor at all. Slot 0 (the anchor) is never supervised.
fn case(seed: i64) -> Case {
    let _rng = crate::device::global_rng::seeded(seed);
    let opts = (Kind::Double, Device::Cpu);
    let gamma = 4.0;
    let mut w = vec![0.0f64; (B * Q) as usize];
    for row in 0..2 {
        for block in 0..N {
            for k in 1..BS {
                let hole = row == 0 && block == 0 && k == 2;
                let past_end = row == 1 && block == 1 && k >= 2;
                if !(hole || past_end) {
                    // Rounded to f32, as the loss reads weights.
                    w[(row * Q + block * BS + k) as usize] =
                        f64::from((-((k - 1) as f64) / gamma).exp() as f32);
                }
            }
        }
    }
    Case {
        out: (Tensor::randn([B, Q, H], opts) * 2.0).set_requires_grad(true),
        lm_head: Tensor::randn([V, H], opts),
        targets: Tensor::randint(V, [B, Q], (Kind::Int64, Device::Cpu)),
        weights: Tensor::from_slice(&w).view([B, Q]),
    }
}

fn run(
    c: &Case,
    s: &CandidateSelector,
    objective: LossObjective,
    alpha: f64,
    stop_gradient: bool,
    chunk: i64,
) -> LossSums {
    let batch = Dflash2Batch {
        selector: s,
        lm_head: &c.lm_head,
        targets: &c.targets,
        weights: &c.weights,
        block_size: BS,
        selector_alpha: alpha,
        stop_gradient,
    };
    dflash2_backward(&c.out, &batch, objective, 1.0, chunk)
}

fn grads(vs: &VarStore, c: &Case) -> HashMap<String, Tensor> {
    let mut g: HashMap<String, Tensor> = vs
        .variables()
        .into_iter()
        .map(|(n, t)| (n, t.grad().copy()))
        .collect();
    g.insert("out".into(), c.out.grad().copy());
    g
}

fn zero_grads(vs: &VarStore, c: &Case) {
    for (_, mut t) in vs.variables() {
        let mut grad = t.grad();
        if grad.defined() {
            let _ = grad.zero_();
        }
        let _ = t.requires_grad_(true);
    }
    let mut grad = c.out.grad();
    if grad.defined() {
        let _ = grad.zero_();
    }
}

fn assert_close(a: &Tensor, b: &Tensor, what: &str) {
    let diff = (a - b).abs().max().double_value(&[]);
    let scale = b.abs().max().double_value(&[]).max(1.0);
    assert!(
        diff <= 1e-9 * scale,
        "{what}: differs by {diff} (scale {scale})"
    );
}

/// The objective written out over every position at once, its gradient by autograd:
/// `U = cap(X·Wᵀ·m)`, `CE_base = lse(U) − U[gold]`; per position the top-K of `U`, the
/// predecessor `targets[p − 1]`, `S = U_top + (A[prev] ⊙ W_h·x)·B[cand]ᵀ`, and where the gold
/// is a candidate `CE_sel = lse(S) − S[gold's place]`. Returns the numerator
/// `Σ w·CE_base + α·Σ w·[covered]·CE_sel` and the covered flags.
fn written_out(
    c: &Case,
    s: &CandidateSelector,
    cfg: &Dflash2Config,
    alpha: f64,
) -> (Tensor, Vec<bool>) {
    let x = c.out.reshape([-1, H]);
    let mut u = x.matmul(&c.lm_head.tr()) * cfg.output_multiplier;
    if let Some(cap) = cfg.final_logit_softcapping {
        u = (u / cap).tanh() * cap;
    }
    let gold = c.targets.reshape([-1]);
    let w = c.weights.reshape([-1]);
    let lse = u.logsumexp([1], false);
    let ce_base = &lse - u.gather(1, &gold.unsqueeze(1), false).squeeze_dim(1);
    let mut numerator = (&ce_base * &w).sum(Kind::Double);
    let projected = x.matmul(&s.hidden_projection.tr());
    let mut covered = Vec::new();
    for p in 0..B * Q {
        let (top, cand) = u.get(p).topk(K, 0, true, true);
        let g = gold.int64_value(&[p]);
        let place = (0..K).find(|&k| cand.int64_value(&[k]) == g);
        covered.push(place.is_some());
        let Some(place) = place else { continue };
        let prev = gold.int64_value(&[(p - 1).max(0)]);
        let context = s.predecessor_codebook.get(prev) * projected.get(p);
        let transition = s.successor_codebook.index_select(0, &cand).matmul(&context);
        let scores = top + transition;
        let ce_sel = scores.logsumexp([0], false) - scores.get(place);
        numerator += ce_sel * w.get(p) * alpha;
    }
    (numerator, covered)
}

#[test]
fn the_loss_and_its_gradients_are_the_written_out_formula() {
    for (cfg, alpha) in [(head(1.0, None), 1.0), (head(0.7, Some(3.0)), 0.4)] {
        let (vs, s) = selector(&cfg, 1);
        let c = case(2);
        let sums = run(&c, &s, LossObjective::Dflash, alpha, false, 1000);
        let got = grads(&vs, &c);
        zero_grads(&vs, &c);
        let (numerator, covered) = written_out(&c, &s, &cfg, alpha);
        let weight = c.weights.sum(Kind::Double).double_value(&[]);
        numerator.backward();
        let want = grads(&vs, &c);
        assert!((sums.weighted_ce - numerator.double_value(&[])).abs() < 1e-9);
        assert!((sums.weight - weight).abs() < 1e-12 && (sums.normaliser - weight).abs() < 1e-12);
        for (name, g) in &want {
            assert_close(&got[name], g, name);
        }
        // The case has supervised slots whose gold is outside the top-K, and covered ones.
        let w: Vec<f64> = Vec::try_from(c.weights.reshape([-1])).unwrap();
        let supervised = w.iter().filter(|&&x| x > 0.0).count();
        let hit = w
            .iter()
            .zip(&covered)
            .filter(|(&x, &c)| x > 0.0 && c)
            .count();
        assert!(0 < hit && hit < supervised, "{hit} of {supervised} covered");
        assert_eq!(sums.dflash2.supervised as usize, supervised);
        assert_eq!(sums.dflash2.covered as usize, hit);
        assert_eq!(sums.counted as usize, supervised);
    }
}

#[test]
fn chunking_changes_nothing_and_splitting_the_batch_sums_to_the_whole() {
    let cfg = head(0.7, Some(3.0));
    let (vs, s) = selector(&cfg, 3);
    let c = case(4);
    let whole = run(&c, &s, LossObjective::Dflash, 1.0, false, 1000);
    let want = grads(&vs, &c);
    zero_grads(&vs, &c);
    // One weighted position per chunk rounds up to one block per chunk.
    let chunked = run(&c, &s, LossObjective::Dflash, 1.0, false, 1);
    for (a, b) in whole.to_array().iter().zip(chunked.to_array()) {
        assert!((a - b).abs() < 1e-9, "{a} against {b}");
    }
    for (name, g) in grads(&vs, &c) {
        assert_close(&g, &want[&name], &name);
    }
    zero_grads(&vs, &c);
    // Rows [0] and [1, 2] as two micro-batches: the sums add up to the whole batch's.
    let mut parts = LossSums::default();
    for (start, len) in [(0, 1), (1, 2)] {
        let part = Case {
            out: c.out.narrow(0, start, len),
            lm_head: c.lm_head.shallow_clone(),
            targets: c.targets.narrow(0, start, len),
            weights: c.weights.narrow(0, start, len),
        };
        parts.add(&run(&part, &s, LossObjective::Dflash, 1.0, false, 1000));
    }
    for (a, b) in whole.to_array().iter().zip(parts.to_array()) {
        assert!((a - b).abs() < 1e-9, "{a} against {b}");
    }
    for (name, g) in grads(&vs, &c) {
        assert_close(&g, &want[&name], &name);
    }
}

#[test]
fn without_the_selector_term_it_is_the_block_objective_on_the_unary_scores() {
    // Multiplier 1 and no cap: U is the LM head's logits, so at α = 0 DFlash2 under D-PACE is
    // D-PACE (each normalisation), value and gradient.
    let cfg = head(1.0, None);
    let (vs, s) = selector(&cfg, 5);
    for normalization in [
        DpaceNormalization::Sequences,
        DpaceNormalization::AnchorsPerSequence,
    ] {
        let objective = LossObjective::Dpace {
            alpha: 0.5,
            normalization,
        };
        let base = case(6);
        let mask = base.weights.gt(0.0).to_kind(Kind::Double);
        let ours_case = Case {
            weights: mask.shallow_clone(),
            ..base
        };
        let ours = run(&ours_case, &s, objective, 0.0, false, 2);
        // The same tensors (same seed), another leaf.
        let reference_case = case(6);
        let batch = BlockObjectiveBatch {
            lm_head: &reference_case.lm_head,
            targets: &reference_case.targets,
            mask: &mask,
            block_size: BS,
        };
        let reference = block_objective_backward(&reference_case.out, &batch, objective, 1.0, 2);
        // The block objective's head runs in f32, ours in the drafter's f64.
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
        assert!(near(ours.weighted_ce, reference.weighted_ce));
        assert!(near(ours.normaliser, reference.normaliser));
        assert!(near(ours.weight, reference.weight));
        let (got, want) = (ours_case.out.grad(), reference_case.out.grad());
        let diff = (&got - &want).abs().max().double_value(&[]);
        assert!(
            diff <= 1e-5 * want.abs().max().double_value(&[]).max(1.0),
            "{diff}"
        );
        // α = 0 trains no selector parameter.
        for (name, t) in vs.variables() {
            assert!(!t.grad().defined(), "{name}");
        }
    }
}

#[test]
fn stop_gradient_keeps_the_selector_term_out_of_the_backbone() {
    let cfg = head(0.7, Some(3.0));
    let (vs, s) = selector(&cfg, 7);
    let c = case(8);
    run(&c, &s, LossObjective::Dflash, 1.0, true, 1000);
    let stopped = grads(&vs, &c);
    zero_grads(&vs, &c);
    run(&c, &s, LossObjective::Dflash, 0.0, false, 1000);
    // The output's gradient is the base term's alone; the selector still trains.
    assert_close(&stopped["out"], &c.out.grad(), "d/dout");
    let b = &stopped["candidate_selector.successor_codebook"];
    assert!(b.abs().sum(Kind::Double).double_value(&[]) > 0.0);
}

#[test]
fn the_acceptance_sums_are_the_written_out_chains() {
    let cfg = head(0.7, Some(3.0));
    let (_vs, s) = selector(&cfg, 9);
    let c = case(10);
    let sums = tch::no_grad(|| run(&c, &s, LossObjective::Dflash, 1.0, false, 1000));
    let x = c.out.reshape([-1, H]).detach();
    let u = s.unary(&x.matmul(&c.lm_head.tr()));
    let (top, cand) = s.candidates(&u);
    let gold: Vec<i64> = Vec::try_from(c.targets.reshape([-1])).unwrap();
    let w: Vec<f64> = Vec::try_from(c.weights.reshape([-1])).unwrap();
    let (mut oracle, mut serving, mut unary, mut blocks, mut serving_hits) =
        (0.0, 0.0, 0.0, 0.0, 0.0);
    for block in 0..B * N {
        let first = (block * BS) as usize;
        if !(1..BS as usize).any(|k| w[first + k] > 0.0) {
            continue;
        }
        blocks += 1.0;
        let (mut previous, mut walk_alive, mut oracle_alive, mut unary_alive) =
            (gold[first], true, true, true);
        let (mut o, mut sv, mut un) = (1.0, 1.0, 1.0);
        for k in 1..BS as usize {
            let p = first + k;
            let candidates: Vec<i64> = Vec::try_from(cand.get(p as i64)).unwrap();
            let scores = s.score(
                &cand.get(p as i64).unsqueeze(0),
                &top.get(p as i64).unsqueeze(0),
                &x.get(p as i64).unsqueeze(0),
                &Tensor::from_slice(&[previous]),
            );
            let pick = candidates[scores.argmax(-1, false).int64_value(&[0]) as usize];
            previous = pick;
            let supervised = w[p] > 0.0;
            if supervised && pick == gold[p] {
                serving_hits += 1.0;
            }
            walk_alive &= supervised && pick == gold[p];
            oracle_alive &= supervised && candidates.contains(&gold[p]);
            unary_alive &=
                supervised && u.get(p as i64).argmax(0, false).int64_value(&[]) == gold[p];
            o += f64::from(u8::from(oracle_alive));
            sv += f64::from(u8::from(walk_alive));
            un += f64::from(u8::from(unary_alive));
        }
        oracle += o;
        serving += sv;
        unary += un;
    }
    let d = sums.dflash2;
    assert_eq!(d.blocks, blocks);
    assert_eq!(d.blocks, 4.0, "rows 0 and 1 have two each, row 2 none");
    assert_eq!(
        (d.oracle_accepted, d.serving_accepted, d.unary_accepted),
        (oracle, serving, unary)
    );
    assert_eq!(d.serving_correct, serving_hits);
    let m = d.metrics(sums.normaliser);
    assert!((m.oracle_accepted_length - oracle / blocks).abs() < 1e-12);
    assert!(m.unary_topk_recall > 0.0 && m.unary_topk_recall < 1.0);
}
