//! The offline evaluation's tests: block acceptance, D-PACE's sum, the Domino correction, the
//! tree oracle's subsample and the metrics line's tree figures.
use super::*;

fn one_block(valid: Vec<bool>, hits: &[bool]) -> (Totals, usize) {
    let bs = valid.len();
    let anchors = AnchorBatch::from_rows(&[vec![0]], 1);
    let labels = BlockLabels {
        targets: vec![0; bs],
        weights: valid.iter().map(|v| f32::from(u8::from(*v))).collect(),
        valid,
    };
    let valid_flat: Vec<usize> = (0..bs).filter(|&f| labels.valid[f]).collect();
    assert_eq!(valid_flat.len(), hits.len());
    let in_top: Vec<bool> = hits
        .iter()
        .flat_map(|&h| [h, true, true, true, true])
        .collect();
    let scores = PositionScores {
        ce: vec![1.0; hits.len()],
        in_top,
        base_top1: Vec::new(),
    };
    let mut totals = Totals::new(bs, TOPK_RECALL_KS.len());
    let chunk = ChunkLabels {
        anchors: &anchors,
        labels: &labels,
        first_row: 0,
    };
    accumulate(&mut totals, &chunk, bs, &valid_flat, &scores, 0.5);
    (totals, bs)
}

#[test]
fn the_dpace_sum_weights_each_valid_slot_by_its_blocks_acceptance_weight() {
    // Slots 1..3 valid with CE = ln 2 (q = 1/2), α = 1/2: s = 0.75 and
    // w = (1.734375, 0.984375, 0.421875), so Σ CE·w = ln 2 · 3.140625. The invalid slot 2
    // of the second case is a no-op in the product: w = (0.75 + 0.5625, 0.5625).
    let ln2 = std::f64::consts::LN_2;
    let run = |valid: Vec<bool>| {
        let n = valid.iter().filter(|&&v| v).count();
        let (mut t, bs) = (Totals::new(valid.len(), TOPK_RECALL_KS.len()), valid.len());
        let labels = BlockLabels {
            targets: vec![0; bs],
            weights: vec![1.0; bs],
            valid: valid.clone(),
        };
        let valid_flat: Vec<usize> = (0..bs).filter(|&f| valid[f]).collect();
        let scores = PositionScores {
            ce: vec![ln2 as f32; n],
            in_top: vec![true; n * TOPK_RECALL_KS.len()],
            base_top1: Vec::new(),
        };
        let anchors = AnchorBatch::from_rows(&[vec![0]], 1);
        let chunk = ChunkLabels {
            anchors: &anchors,
            labels: &labels,
            first_row: 0,
        };
        accumulate(&mut t, &chunk, bs, &valid_flat, &scores, 0.5);
        t.dpace_rows[0].numerator
    };
    let full = run(vec![false, true, true, true]);
    assert!((full - ln2 * 3.140625).abs() < 1e-6, "{full}");
    let gap = run(vec![false, true, false, true]);
    assert!((gap - ln2 * (1.3125 + 0.5625)).abs() < 1e-6, "{gap}");
}

#[test]
fn each_dpace_normalization_divides_the_rows_sums_as_written() {
    // Three rows, CE = ln 2 at every supervised slot, α = 1/2, blocks of 4. Row 0: a full
    // block (w = 1.734375, 0.984375, 0.421875) in the first anchor chunk and, in the second,
    // a block with a hole at slot 2 (w = 1.3125, 0.5625) and a block past the end (no
    // supervised slot). Row 1: blocks with no supervised slot only. Row 2: a full block.
    let ln2 = std::f64::consts::LN_2;
    let (full, hole, none) = (
        vec![false, true, true, true],
        vec![false, true, false, true],
        vec![false; 4],
    );
    let mut totals = Totals::new(4, TOPK_RECALL_KS.len());
    let mut add = |blocks: Vec<Vec<bool>>, rows: usize, first_row: usize| {
        let valid: Vec<bool> = blocks.concat();
        let n = valid.iter().filter(|&&v| v).count();
        let labels = BlockLabels {
            targets: vec![0; valid.len()],
            weights: vec![1.0; valid.len()],
            valid: valid.clone(),
        };
        let valid_flat: Vec<usize> = (0..valid.len()).filter(|&f| valid[f]).collect();
        let scores = PositionScores {
            ce: vec![ln2 as f32; n],
            in_top: vec![true; n * TOPK_RECALL_KS.len()],
            base_top1: Vec::new(),
        };
        let width = blocks.len() / rows;
        let anchors = AnchorBatch::from_rows(&vec![vec![0; width]; rows], width);
        let chunk = ChunkLabels {
            anchors: &anchors,
            labels: &labels,
            first_row,
        };
        accumulate(&mut totals, &chunk, 4, &valid_flat, &scores, 0.5);
    };
    // As `score_group` hands them over: the group of rows 0 and 1 in two anchor chunks, then
    // the group of row 2 alone.
    add(vec![full.clone(), none.clone()], 2, 0);
    add(vec![hole, none.clone(), none.clone(), none], 2, 0);
    add(vec![full], 1, 2);
    let (w_full, w_hole) = (3.140625, 1.875);
    let row0 = ln2 * (w_full + w_hole);
    let row2 = ln2 * w_full;
    assert_eq!(totals.dpace_rows[0].anchors, 2);
    assert_eq!(totals.dpace_rows[0].tokens, 5);
    assert_eq!(totals.dpace_rows[1], DpaceRow::default());
    assert_eq!(
        (totals.dpace_rows[2].anchors, totals.dpace_rows[2].tokens),
        (1, 3)
    );
    let eps = crate::train::dpace::TOKENS_PER_SEQUENCE_EPSILON;
    for (normalization, want) in [
        (DpaceNormalization::Sequences, (row0 + row2) / 3.0),
        (
            DpaceNormalization::WeightSum,
            (row0 + row2) / (2.0 * w_full + w_hole),
        ),
        (
            DpaceNormalization::AnchorsPerSequence,
            (row0 / 2.0 + row2 / 1.0) / 2.0,
        ),
        (
            DpaceNormalization::TokensPerSequence,
            (row0 / (5.0 + eps) + row2 / (3.0 + eps)) / 3.0,
        ),
    ] {
        let got = dpace_loss(&totals.dpace_rows, 3, normalization);
        assert!(
            (got - want).abs() < 1e-6 * want,
            "{normalization:?}: {got} vs {want}"
        );
    }
    assert_eq!(
        dpace_loss(&[], 0, DpaceNormalization::AnchorsPerSequence),
        0.0
    );
}

#[test]
fn acceptance_stops_at_the_first_miss() {
    // slots 1..4 valid; hits: yes, yes, no, yes -> accepted 2, τ 3.
    let (t, _) = one_block(
        vec![false, true, true, true, true],
        &[true, true, false, true],
    );
    assert_eq!(t.blocks, 1);
    assert_eq!(t.accepted_plus_one, 3.0);
    assert_eq!(t.accepted_at, vec![0, 1, 1, 0, 0]);
    assert_eq!(t.valid_at, vec![0, 1, 1, 1, 1]);
    assert_eq!(t.hits_at[0], vec![0, 1, 1, 0, 1]);
    assert_eq!(t.top1, 3);
}

#[test]
fn invalid_slots_neither_count_nor_break_the_chain() {
    // slot 2 is unsupervised (e.g. a user token inside the block): treated as correct.
    let (t, _) = one_block(vec![false, true, false, true], &[true, true]);
    assert_eq!(t.accepted_plus_one, 3.0);
    assert_eq!(t.valid_at, vec![0, 1, 0, 1]);
}

#[test]
fn a_domino_drafter_is_scored_on_its_corrected_logits() {
    use crate::model::drafter::DominoConfig;
    let _rng = crate::device::global_rng::seeded(6);
    let (bs, h, v) = (4i64, 8i64, 11i64);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let cfg = DominoConfig {
        emb_dim: 5,
        gru_hidden_dim: 6,
        pure_draft_prefix_len: 1,
    };
    let head = DominoHead::new(&vs.root(), &cfg, h, v, 0.5);
    let opts = (Kind::Float, tch::Device::Cpu);
    let out = Tensor::randn([1, 2 * bs, h], opts);
    let lm_head = Tensor::randn([v, h], opts);
    let states = head.slot_states(&Tensor::randn([1, 2 * bs, h], opts), bs);
    let targets = Tensor::randint(v, [2 * bs], (Kind::Int64, tch::Device::Cpu));
    let idx = Tensor::from_slice(&[1i64, 2, 3, 5, 6, 7]);
    let correction = Correction {
        head: &head,
        states: states.shallow_clone(),
        block_size: bs,
    };
    let scores =
        tch::no_grad(|| score_positions(&out, &lm_head, &targets, &idx, 4, 4, Some(&correction)));
    let dense = tch::no_grad(|| head.dense_logits(&out, &states, &lm_head, bs))
        .view([-1, v])
        .index_select(0, &idx);
    let expected = dense
        .cross_entropy_loss::<Tensor>(
            &targets.index_select(0, &idx),
            None,
            tch::Reduction::None,
            -100,
            0.0,
        )
        .to_kind(Kind::Float);
    let got = Tensor::from_slice(&scores.ce);
    assert!(
        got.allclose(&expected, 1e-5, 1e-5, false),
        "{got:?} vs {expected:?}"
    );
    let base = tch::no_grad(|| score_positions(&out, &lm_head, &targets, &idx, 4, 4, None));
    assert_eq!(base.ce[0], scores.ce[0], "slot 1 is the pure-draft prefix");
    assert!(
        base.ce[1..] != scores.ce[1..],
        "the later slots are corrected"
    );
}

#[test]
fn evaluating_a_domino_drafter_applies_its_correction_and_a_zero_one_changes_nothing() {
    use crate::embedded;
    use crate::model::drafter::{DominoConfig, DrafterHead};
    let device = tch::Device::Cpu;
    let target = embedded::tiny_target(None, device).unwrap();
    let dflash_cfg = embedded::tiny_dflash_drafter_config(target.config());
    let mut domino_cfg = dflash_cfg.clone();
    domino_cfg.head = DrafterHead::Domino(DominoConfig {
        emb_dim: 8,
        gru_hidden_dim: 8,
        pure_draft_prefix_len: 0,
    });
    let _rng = crate::device::global_rng::seeded(2);
    let domino_vs = tch::nn::VarStore::new(device);
    let domino = Drafter::new(&domino_vs.root(), &domino_cfg);
    let mut dflash_vs = tch::nn::VarStore::new(device);
    let dflash = Drafter::new(&dflash_vs.root(), &dflash_cfg);
    dflash_vs.copy(&domino_vs).unwrap();
    let samples = first_tiny_samples(&target, 3);
    let held: Vec<&Sample> = samples.iter().collect();
    let opts = tiny_eval_options(4);
    let base = evaluate(&target, &dflash, &held, &opts).unwrap();
    assert_eq!(
        base.base_tau, None,
        "a DFlash drafter has no base τ of its own"
    );
    let corrected = evaluate(&target, &domino, &held, &opts).unwrap();
    assert_ne!(base.loss, corrected.loss, "the correction is applied");
    assert_eq!(
        corrected.base_tau,
        Some(base.tau),
        "its base τ is the backbone's alone"
    );
    tch::no_grad(|| {
        let _ = domino_vs.variables()["embed_proj.2.weight"]
            .shallow_clone()
            .zero_();
    });
    let zeroed = evaluate(&target, &domino, &held, &opts).unwrap();
    assert_eq!(zeroed.base_tau, Some(zeroed.tau));
    assert_eq!(
        EvalReport {
            base_tau: None,
            ..zeroed
        },
        base,
        "a zero correction scores as the DFlash drafter"
    );
}

/// A fresh DFlash2 drafter (identity convolutions, a selector whose successor codebook is
/// zero, multiplier 1, no cap) is its DFlash backbone: its serving walk is the unary argmax, so
/// its τ, base τ and base loss are the DFlash scorer's on the same blocks (every valid position
/// an anchor, the same labels). A live selector moves its figures and leaves the base ones.
#[test]
fn evaluating_a_dflash2_drafter_scores_its_selector_and_a_fresh_one_scores_as_dflash() {
    use crate::embedded;
    use crate::model::drafter::{Dflash2Config, DrafterHead};
    let device = tch::Device::Cpu;
    let target = embedded::tiny_target(None, device).unwrap();
    let dflash_cfg = embedded::tiny_dflash_drafter_config(target.config());
    let mut dflash2_cfg = dflash_cfg.clone();
    dflash2_cfg.head = DrafterHead::Dflash2(Dflash2Config {
        conv_kernel_size: 2,
        conv_group_size: 16,
        selector_rank: 8,
        selector_top_k: 4,
        output_multiplier: 1.0,
        final_logit_softcapping: None,
    });
    let _rng = crate::device::global_rng::seeded(3);
    let dflash2_vs = tch::nn::VarStore::new(device);
    let dflash2 = Drafter::new(&dflash2_vs.root(), &dflash2_cfg);
    let mut dflash_vs = tch::nn::VarStore::new(device);
    let dflash = Drafter::new(&dflash_vs.root(), &dflash_cfg);
    dflash_vs.copy(&dflash2_vs).unwrap();
    let samples = first_tiny_samples(&target, 3);
    let held: Vec<&Sample> = samples.iter().collect();
    let opts = tiny_eval_options(4);
    let plain = evaluate(&target, &dflash, &held, &opts).unwrap();
    let fresh = evaluate(&target, &dflash2, &held, &opts).unwrap();
    let d = fresh
        .dflash2
        .expect("a DFlash2 drafter reports its figures");
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b.abs().max(1.0);
    assert!(
        close(fresh.tau, plain.tau),
        "{} vs {}",
        fresh.tau,
        plain.tau
    );
    assert_eq!(fresh.base_tau, Some(fresh.tau));
    // The loss sums per chunk in f32 where the DFlash scorer sums per position in f64.
    assert!(
        (d.base_loss - plain.loss).abs() < 1e-6 * plain.loss,
        "{} vs {}",
        d.base_loss,
        plain.loss
    );
    assert!(close(fresh.accuracy, plain.accuracy));
    assert_eq!(
        (fresh.blocks, fresh.positions),
        (plain.blocks, plain.positions)
    );
    assert!(d.unary_topk_recall > 0.0 && d.unary_topk_recall <= 1.0);
    assert!(d.oracle_accepted_length >= fresh.tau);
    // α = 1: the loss carries the selector's term on top of the base one.
    assert!(d.loss > d.base_loss && d.selector_alpha == 1.0);
    // A live selector rescores the candidates (its loss moves; an untrained backbone accepts
    // nothing either way, so τ stays 1); the unary figures stay.
    tch::no_grad(|| {
        let mut b = dflash2_vs.variables()["candidate_selector.successor_codebook"].shallow_clone();
        b.copy_(&(tch::Tensor::randn(b.size(), (Kind::Float, device)) * 3.0));
    });
    let live = evaluate(&target, &dflash2, &held, &opts).unwrap();
    let l = live.dflash2.unwrap();
    assert_eq!(live.base_tau, fresh.base_tau);
    assert!(close(l.base_loss, d.base_loss) && close(l.unary_topk_recall, d.unary_topk_recall));
    assert_ne!(l.selector_loss, d.selector_loss);
}

/// The embedded data's first `n` samples, for the tests that evaluate on the tiny target.
fn first_tiny_samples(target: &TargetModel, n: usize) -> Vec<Sample> {
    let train = crate::embedded::tiny_train_config();
    let (mut samples, _) =
        crate::embedded::tiny_samples(target.config().vocab_size(), train.training.max_length)
            .unwrap();
    samples.truncate(n);
    samples
}

/// Small chunks and the oracle at budgets 4 and 16, every block scored, headed by `serve`.
fn tiny_eval_options(serve: usize) -> EvalOptions {
    EvalOptions {
        anchors_per_forward: 64,
        rows_per_forward: 2,
        gamma: 4.0,
        rule: LabelMaskRule::Independent,
        chunk_positions: 256,
        backend: AttentionBackend::BlockSparse,
        dpace_alpha: 0.5,
        dpace_normalization: DpaceNormalization::Sequences,
        tree_budgets: vec![4, 16],
        serve_tree_budget: Some(serve),
        tree_block_subsample: 1,
        dspark: Default::default(),
        selector_alpha: 1.0,
    }
}

/// The in-training subsample scores the oracle at the blocks the hash picks, exactly as
/// the every-block oracle scores them, and leaves every chain figure alone.
#[test]
fn a_subsampled_oracle_is_the_full_oracle_at_the_blocks_it_picks() {
    use crate::embedded;
    let device = tch::Device::Cpu;
    let target = embedded::tiny_target(None, device).unwrap();
    let cfg = embedded::tiny_dflash_drafter_config(target.config());
    let _rng = crate::device::global_rng::seeded(5);
    let vs = tch::nn::VarStore::new(device);
    let drafter = Drafter::new(&vs.root(), &cfg);
    let samples = first_tiny_samples(&target, 3);
    let held: Vec<&Sample> = samples.iter().collect();
    let every = tiny_eval_options(16);
    let mut outcomes: Vec<(usize, i64, Vec<usize>)> = Vec::new();
    let full = evaluate_with(&target, &drafter, &held, &every, &mut |b| {
        outcomes.push((b.row, b.anchor, b.tree_accepted.to_vec()))
    })
    .unwrap();
    assert_eq!(full.tree_blocks, full.blocks);
    let one_in = 3;
    let mut subsampled_seen = 0u64;
    let subsampled = evaluate_with(
        &target,
        &drafter,
        &held,
        &EvalOptions {
            tree_block_subsample: one_in,
            dspark: Default::default(),
            ..every.clone()
        },
        &mut |b| {
            assert!(in_tree_subsample(b.row, b.anchor, one_in));
            subsampled_seen += 1;
        },
    )
    .unwrap();
    let kept: Vec<&Vec<usize>> = outcomes
        .iter()
        .filter(|(row, anchor, _)| in_tree_subsample(*row, *anchor, one_in))
        .map(|(_, _, accepted)| accepted)
        .collect();
    assert!(!kept.is_empty() && kept.len() < outcomes.len());
    assert_eq!(subsampled.tree_blocks, kept.len() as u64);
    assert_eq!(subsampled_seen, kept.len() as u64);
    assert_eq!(subsampled.tree_block_subsample, one_in);
    for (i, budget) in [4usize, 16].iter().enumerate() {
        let mean = kept.iter().map(|a| (a[i] + 1) as f64).sum::<f64>() / kept.len() as f64;
        let got = subsampled.tau_tree_oracle[budget];
        assert!(
            (got - mean).abs() < 1e-12,
            "budget {budget}: {got} vs {mean}"
        );
    }
    assert_eq!(
        EvalReport {
            tau_tree_oracle: full.tau_tree_oracle.clone(),
            tau_tree_serve: full.tau_tree_serve,
            tree_blocks: full.tree_blocks,
            tree_block_subsample: 1,
            dspark: Default::default(),
            ..subsampled
        },
        full,
        "the chain figures are every block's"
    );
}

#[test]
fn the_metrics_lines_tree_figures_are_every_scored_budget_with_the_serving_one() {
    let report = |tree: serde_json::Value, serve: serde_json::Value| -> EvalReport {
        serde_json::from_value(serde_json::json!({
            "tau": 2.5, "loss": 1.0, "accuracy": 0.5, "per_position_acceptance": [],
            "topk_recall": {}, "tau_tree_oracle": tree, "serve_tree_budget": serve,
            "block_size": 4, "samples": 1, "blocks": 1, "positions": 3,
        }))
        .unwrap()
    };
    let scored = report(serde_json::json!({"8": 3.0, "32": 3.5}), 32.into());
    let tree = scored.tree_oracle_tau().expect("trees were scored");
    assert_eq!(tree.serve_budget, 32);
    assert_eq!(tree.by_budget, BTreeMap::from([(8, 3.0), (32, 3.5)]));
    assert_eq!(tree.at_serve_budget(), Some((32, 3.5)));
    let unscored = report(serde_json::json!({}), 32.into());
    assert_eq!(unscored.tree_oracle_tau(), None, "no tree, no tree figures");
    let unknown_budget = report(serde_json::json!({"8": 3.0}), serde_json::Value::Null);
    assert_eq!(unknown_budget.tree_oracle_tau(), None);
}

#[test]
fn a_first_miss_gives_tau_one() {
    let (t, _) = one_block(vec![false, true, true], &[false, true]);
    assert_eq!(t.accepted_plus_one, 1.0);
    assert_eq!(t.hits_at[0], vec![0, 0, 1]);
}

/// A forward group's states go to the drafter's device and dtype once: the features alone
/// for today's heads, the last hidden state beside them (one more placement) when asked.
#[test]
fn a_forward_groups_last_hidden_state_is_placed_beside_its_features_when_asked() {
    use crate::model::target::{FeatureRequest, TargetConfig};
    let target = TargetModel::random(TargetConfig::tiny_default(), Device::Cpu, Kind::Float, 3);
    let last = target.config().num_layers() - 1;
    let ids = Tensor::arange(24, (Kind::Int64, Device::Cpu)).view([2, 12]);
    let taps = FeatureRequest::taps(&[1, 3]);
    let eval = (Device::Cpu, Kind::Float);
    let before = crate::device::placements_on_this_thread();
    let alone = placed_states(&target, &ids, &taps, eval).unwrap();
    assert_eq!(crate::device::placements_on_this_thread() - before, 1);
    assert!(alone.last_hidden.is_none());
    assert!(alone
        .features
        .equal(&target.features(&ids, &[1, 3]).unwrap()));

    let request = FeatureRequest {
        last_hidden: true,
        ..taps
    };
    let before = crate::device::placements_on_this_thread();
    let both = placed_states(&target, &ids, &request, eval).unwrap();
    assert_eq!(crate::device::placements_on_this_thread() - before, 2);
    assert!(both.features.equal(&alone.features));
    let last_hidden = both.last_hidden.as_ref().expect("asked for");
    assert!(last_hidden.equal(&target.features(&ids, &[last]).unwrap()));
}
