use super::*;
use crate::model::attention::visibility::{context_visible, own_block_visible};
use crate::model::drafter::{LayerType, MarkovHeadType};

fn brute_force(rule: LayerRule, anchors: &[i64], keep: &[bool], bs: i64, s: i64) -> u64 {
    let mut n = 0;
    for (&a, &k) in anchors.iter().zip(keep) {
        for off in 0..bs {
            n += (0..s)
                .filter(|&j| context_visible(rule, a, k, off, j))
                .count() as u64;
            n += (0..bs).filter(|&j| own_block_visible(rule, off, j)).count() as u64;
        }
    }
    n
}

#[test]
fn visible_pairs_match_the_visibility_rule_key_by_key() {
    let anchors = [0, 1, 5, 9, 17, 30, 31];
    let keep = [true, true, false, true, true, true, true];
    for rule in [
        LayerRule::Full,
        LayerRule::Sliding { window: 1 },
        LayerRule::Sliding { window: 6 },
    ] {
        assert_eq!(
            visible_pairs(rule, &anchors, &keep, 4, 32),
            brute_force(rule, &anchors, &keep, 4, 32),
            "{rule:?}"
        );
    }
}

fn one_layer_drafter() -> DrafterConfig {
    DrafterConfig {
        hidden_size: 4,
        intermediate_size: 8,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 2,
        rms_norm_eps: 1e-6,
        rope_theta: 1e4,
        layer_types: vec![LayerType::Full],
        sliding_window: None,
        block_size: 2,
        mask_token_id: 0,
        target_layer_ids: vec![0, 1],
        target_hidden_size: 4,
        vocab_size: 10,
        max_position_embeddings: 64,
        num_target_layers: Some(4),
        initializer_range: 0.02,
        head: Default::default(),
    }
}

/// One row of 6 tokens, blocks at anchors 2 and 4, 2 weighted positions (slot 1 of each).
fn two_blocks_in_six_tokens(d: &DrafterConfig) -> StepWork<'_> {
    StepWork {
        drafter: d,
        batch: 1,
        seq_len: 6,
        anchors: &[2, 4],
        keep: &[true, true],
        weighted_positions: 2,
        corrected_positions: corrected_positions(d, &[0.0, 1.0, 0.0, 1.0]),
        head_positions: head_positions(d, &[0.0, 1.0, 0.0, 1.0]),
        teacher_positions: 0,
        vocab_size: 10,
    }
}

#[test]
fn step_flops_by_hand_for_a_one_layer_drafter() {
    let d = one_layer_drafter();
    // One row of 6 tokens, blocks at anchors 2 and 4: Q = 4 queries.
    let w = two_blocks_in_six_tokens(&d);
    let fc = 2.0 * 6.0 * 8.0 * 4.0;
    let proj = 2.0 * 4.0 * 4.0 * 4.0
        + 4.0 * 10.0 * 4.0 * 2.0
        + 2.0 * 4.0 * 4.0 * 4.0
        + 6.0 * 4.0 * 4.0 * 8.0;
    let pairs = 2.0 * (2.0 + 2.0) + 2.0 * (4.0 + 2.0); // per query: context + own block
    let attn = 4.0 * 2.0 * 2.0 * pairs;
    let head = 2.0 * 2.0 * 4.0 * 10.0;
    let f = drafter_step_flops(&w);
    assert_eq!(f.forward, fc + proj + attn + head);
    assert_eq!(f.backward, fc + 2.0 * proj + 2.0 * attn + head);
}

#[test]
fn executed_flops_by_hand_for_one_chunk_and_a_recomputed_layer() {
    let d = one_layer_drafter();
    // One row of 6 tokens, blocks at anchors 2 and 4: the planner keeps both in one call
    // over context keys 0..4 (the union of their ranges), widened to the key quantum
    // (8·bs = 16) and so to the whole context, 0..6, plus their 4 own rows.
    let w = two_blocks_in_six_tokens(&d);
    let model = drafter_step_flops(&w);
    let executed = drafter_step_executed_flops(&w, false);
    let attention = 4.0 * 2.0 * 4.0 * (6.0 + 4.0) * 2.0; // 4·Hq·rows·keys·D
    assert_eq!(executed.attention_forward, attention);
    assert_eq!(executed.attention_backward, 2.0 * attention);
    // Matmuls are the model's, all of them executed.
    let useful_attention = 3.0 * 4.0 * 2.0 * 2.0 * (2.0 * 4.0 + 2.0 * 6.0);
    assert_eq!(executed.matmul, model.total() - useful_attention);
    // One layer: nothing before the last, so checkpointing recomputes nothing.
    assert_eq!(drafter_step_executed_flops(&w, true), executed);

    // Two layers: checkpointing runs the first layer's forward once more.
    let two = DrafterConfig {
        layer_types: vec![LayerType::Full, LayerType::Full],
        num_hidden_layers: 2,
        ..d.clone()
    };
    let w = StepWork { drafter: &two, ..w };
    let (plain, recomputed) = (
        drafter_step_executed_flops(&w, false),
        drafter_step_executed_flops(&w, true),
    );
    let layer = matmul_terms(&w).layer_projections;
    assert_eq!(recomputed.matmul - plain.matmul, layer);
    assert_eq!(
        recomputed.attention_forward - plain.attention_forward,
        attention
    );
    assert_eq!(recomputed.attention_backward, plain.attention_backward);
    // Nothing weighted: a forward only.
    let idle = drafter_step_executed_flops(
        &StepWork {
            weighted_positions: 0,
            ..w
        },
        true,
    );
    assert_eq!(idle.attention_backward, 0.0);
    assert_eq!(idle.attention_forward, plain.attention_forward);
}

fn with_domino(d: &DrafterConfig, emb_dim: i64, gru_hidden_dim: i64, prefix: i64) -> DrafterConfig {
    use crate::model::drafter::{DominoConfig, DrafterHead};
    DrafterConfig {
        head: DrafterHead::Domino(DominoConfig {
            emb_dim,
            gru_hidden_dim,
            pure_draft_prefix_len: prefix,
        }),
        ..d.clone()
    }
}

#[test]
fn a_domino_head_adds_its_gru_and_projection_by_hand() {
    let plain = one_layer_drafter();
    let d = with_domino(&plain, 5, 3, 0);
    // Q = 4 positions in 2 blocks of 2: the GRU reads 1 token per block (2 rows); both
    // weighted positions are corrected. H = 4, G = 3, E = 5, V = 10.
    let gru_input = 2.0 * 2.0 * 4.0 * 9.0;
    let gru_hidden = 2.0 * 2.0 * 3.0 * 9.0;
    let projection = 2.0 * 2.0 * (7.0 * 5.0 + 5.0 * 10.0);
    let (with, without) = (
        drafter_step_flops(&two_blocks_in_six_tokens(&d)),
        drafter_step_flops(&two_blocks_in_six_tokens(&plain)),
    );
    assert_eq!(
        with.forward - without.forward,
        gru_input + gru_hidden + projection
    );
    // The one GRU step starts from h₀ = 0, which takes no gradient: the hidden projection's
    // backward is its weight gradient alone, as the input projection's (frozen embeddings).
    assert_eq!(
        with.backward - without.backward,
        gru_input + gru_hidden + 2.0 * projection
    );
    let executed =
        |c: &DrafterConfig| drafter_step_executed_flops(&two_blocks_in_six_tokens(c), false).matmul;
    assert_eq!(
        executed(&d) - executed(&plain),
        with.total() - without.total()
    );
    // a pure-draft prefix of the one drafted slot leaves nothing to correct
    let prefixed = with_domino(&plain, 5, 3, 1);
    let w = two_blocks_in_six_tokens(&prefixed);
    assert_eq!(w.corrected_positions, 0);
    let prefixed = drafter_step_flops(&w);
    assert_eq!(prefixed.forward - without.forward, gru_input + gru_hidden);
}

#[test]
fn the_gru_backpropagates_into_every_state_but_the_first() {
    // Blocks of 4: the GRU steps 3 times per block, and only the states after steps 1 and 2
    // take a gradient through the hidden projection (h₀ = 0 is a constant).
    let plain = DrafterConfig {
        block_size: 4,
        ..one_layer_drafter()
    };
    let d = with_domino(&plain, 5, 3, 1);
    let w = StepWork {
        drafter: &d,
        batch: 1,
        seq_len: 12,
        anchors: &[2, 6],
        keep: &[true, true],
        weighted_positions: 6,
        // Slots 1..=3 of both blocks weighted, slot 1 in the pure-draft prefix.
        corrected_positions: corrected_positions(&d, &[0., 1., 1., 1., 0., 1., 1., 1.]),
        head_positions: 6,
        teacher_positions: 0,
        vocab_size: 10,
    };
    assert_eq!(w.corrected_positions, 4);
    let t = domino_terms(&w).unwrap();
    let step = 2.0 * 2.0 * 3.0 * 9.0; // 2 blocks, [., G] × [G, 3G]
    assert_eq!(t.gru_hidden, 3.0 * step);
    assert_eq!(t.gru_hidden_first_step, step);
    assert_eq!(t.gru_input, 2.0 * 6.0 * 4.0 * 9.0);
    assert_eq!(t.projection, 2.0 * 4.0 * (7.0 * 5.0 + 5.0 * 10.0));
    assert_eq!(
        t.backward(),
        t.gru_input + (3.0 + 2.0) * step + 2.0 * t.projection
    );
}

#[test]
fn only_weighted_slots_from_the_suffix_start_on_are_corrected() {
    let plain = DrafterConfig {
        block_size: 4,
        ..one_layer_drafter()
    };
    let weights = [0.0, 0.9, 0.8, 0.0, 0.0, 0.9, 0.8, 0.7];
    assert_eq!(corrected_positions(&plain, &weights), 0);
    assert_eq!(
        corrected_positions(&with_domino(&plain, 5, 3, 0), &weights),
        5
    );
    assert_eq!(
        corrected_positions(&with_domino(&plain, 5, 3, 1), &weights),
        3
    );
    assert_eq!(
        corrected_positions(&with_domino(&plain, 5, 3, 2), &weights),
        1
    );
}

#[test]
fn executed_attention_covers_at_least_the_useful_pairs() {
    let mut d = one_layer_drafter();
    d.layer_types = vec![LayerType::Sliding, LayerType::Full];
    d.num_hidden_layers = 2;
    d.sliding_window = Some(5);
    d.block_size = 4;
    let anchors: Vec<i64> = (0..24).map(|i| (i * 7) % 90).collect();
    let keep: Vec<bool> = (0..24).map(|i| i % 5 != 3).collect();
    let w = StepWork {
        drafter: &d,
        batch: 2,
        seq_len: 96,
        anchors: &anchors,
        keep: &keep,
        weighted_positions: 0,
        corrected_positions: 0,
        head_positions: 0,
        teacher_positions: 0,
        vocab_size: 10,
    };
    let useful = drafter_step_flops(&w).forward
        - matmul_terms(&w).fc
        - 2.0 * matmul_terms(&w).layer_projections;
    let executed = drafter_step_executed_flops(&w, false).attention_forward;
    assert!(
        executed >= useful && useful > 0.0,
        "executed {executed} < useful {useful}"
    );
}

#[test]
fn no_current_head_distils_the_target() {
    let plain = one_layer_drafter();
    for d in [plain.clone(), with_domino(&plain, 5, 3, 0)] {
        assert!(!d.head.needs_target_last_hidden());
        assert!(!d.feature_request().last_hidden);
        assert_eq!(teacher_positions(&d, 7), 0);
        assert_eq!(two_blocks_in_six_tokens(&d).teacher_positions, 0);
    }
}

#[test]
fn the_teacher_head_is_a_forward_lm_head_over_the_targets_width_by_hand() {
    // A drafter narrower than its target: the teacher reads the target's width, not its own.
    let d = DrafterConfig {
        target_hidden_size: 6,
        ..one_layer_drafter()
    };
    let plain = two_blocks_in_six_tokens(&d);
    let distilled = StepWork {
        teacher_positions: plain.weighted_positions,
        ..plain.clone()
    };
    // 2 weighted positions × [V = 10, H = 6].
    let teacher = 2.0 * 2.0 * 6.0 * 10.0;
    assert_eq!(teacher_head_flops(2, 6, 10), teacher);
    let (with, without) = (drafter_step_flops(&distilled), drafter_step_flops(&plain));
    assert_eq!(with.forward - without.forward, teacher);
    assert_eq!(with.backward, without.backward);
    for checkpointing in [false, true] {
        let (with, without) = (
            drafter_step_executed_flops(&distilled, checkpointing),
            drafter_step_executed_flops(&plain, checkpointing),
        );
        assert_eq!(with.matmul - without.matmul, teacher);
        assert_eq!(with.attention_forward, without.attention_forward);
        assert_eq!(with.attention_backward, without.attention_backward);
    }
}

#[test]
fn reading_the_last_hidden_state_costs_the_whole_target_forward() {
    use crate::model::target::FeatureRequest;
    let t = TargetConfig::tiny_default();
    let n = t.num_layers();
    let taps = FeatureRequest::taps(&[0, 1]);
    let with_last = FeatureRequest {
        last_hidden: true,
        ..taps.clone()
    };
    assert_eq!(with_last.layers_read(n), vec![0, 1, n - 1]);
    assert_eq!(taps.layers_read(n), vec![0, 1]);
    let all: Vec<usize> = (0..n).collect();
    let full = target_forward_flops(&t, &all, 2, 16);
    assert_eq!(
        target_forward_flops(&t, &with_last.layers_read(n), 2, 16),
        full
    );
    assert!(target_forward_flops(&t, &taps.layers_read(n), 2, 16) < full);
}

fn with_dspark(
    d: &DrafterConfig,
    markov_rank: i64,
    kind: MarkovHeadType,
    confidence_head_with_markov: bool,
) -> DrafterConfig {
    use crate::model::drafter::{DrafterHead, DsparkConfig};
    DrafterConfig {
        head: DrafterHead::Dspark(DsparkConfig {
            markov_rank,
            markov_head_type: kind,
            confidence_head: true,
            confidence_head_with_markov,
        }),
        ..d.clone()
    }
}

#[test]
fn a_dspark_head_adds_its_markov_and_confidence_heads_and_the_teacher_by_hand() {
    let plain = one_layer_drafter();
    // DSpark's slot k predicts a + k + 1: in a row of 6 tokens the block at anchor 2 trains
    // both slots (labels 3, 4), the one at 4 slot 0 only (label 5): 3 weighted positions.
    fn work(d: &DrafterConfig, distils: bool) -> StepWork<'_> {
        StepWork {
            weighted_positions: 3,
            corrected_positions: 0,
            head_positions: 3,
            teacher_positions: if distils { teacher_positions(d, 3) } else { 0 },
            ..two_blocks_in_six_tokens(d)
        }
    }
    let without = drafter_step_flops(&work(&plain, false));
    let executed = |w: &StepWork<'_>| drafter_step_executed_flops(w, false).matmul;
    // H = 4, V = 10, r = 3, Q = 4 slots (the latents), 3 weighted (W₂ and the confidence head).
    let teacher = 2.0 * 3.0 * 4.0 * 10.0;
    let projection = 2.0 * 3.0 * 3.0 * 10.0;
    let cases = [
        // Vanilla: W₁ is a lookup; the confidence head reads h alone.
        (
            with_dspark(&plain, 3, MarkovHeadType::Vanilla, false),
            0.0,
            projection,
            2.0 * 3.0 * 4.0,
        ),
        // Gated: gate_proj [H + r] → r over every slot; the confidence head reads [h ; W₁].
        (
            with_dspark(&plain, 3, MarkovHeadType::Gated, true),
            2.0 * 4.0 * 7.0 * 3.0,
            projection,
            2.0 * 3.0 * 7.0,
        ),
        // RNN: joint_proj [2r + H] → 3r over every slot.
        (
            with_dspark(&plain, 3, MarkovHeadType::Rnn, true),
            2.0 * 4.0 * 10.0 * 9.0,
            projection,
            2.0 * 3.0 * 7.0,
        ),
        // No Markov head: the confidence head alone.
        (
            with_dspark(&plain, 0, MarkovHeadType::Rnn, false),
            0.0,
            0.0,
            2.0 * 3.0 * 4.0,
        ),
    ];
    for (d, latents, projection, confidence) in cases {
        let w = work(&d, true);
        assert_eq!(w.teacher_positions, 3);
        let t = dspark_terms(&w).unwrap();
        assert_eq!(
            (t.markov_latents, t.projection, t.confidence),
            (latents, projection, confidence),
            "{:?}",
            d.head
        );
        let with = drafter_step_flops(&w);
        let head = latents + projection + confidence;
        assert_eq!(
            with.forward - without.forward,
            head + teacher,
            "{:?}",
            d.head
        );
        // Input and weight gradients of every matmul; none for the teacher.
        assert_eq!(with.backward - without.backward, 2.0 * head, "{:?}", d.head);
        assert_eq!(
            executed(&w) - executed(&work(&plain, false)),
            with.total() - without.total()
        );
    }
    assert!(dspark_terms(&work(&plain, false)).is_none());
}

fn with_dflash2(d: &DrafterConfig) -> DrafterConfig {
    use crate::model::drafter::{Dflash2Config, DrafterHead};
    DrafterConfig {
        head: DrafterHead::Dflash2(Dflash2Config {
            conv_kernel_size: 2,
            conv_group_size: 2,
            selector_rank: 3,
            selector_top_k: 2,
            output_multiplier: 1.0,
            final_logit_softcapping: None,
        }),
        ..d.clone()
    }
}

#[test]
fn the_lm_head_runs_over_whole_blocks_only_with_a_dflash2_head() {
    let plain = DrafterConfig {
        block_size: 4,
        ..one_layer_drafter()
    };
    // Blocks 0 and 2 hold weighted slots (3 in all), blocks 1 and 3 none.
    let weights = [
        0., 0.9, 0.8, 0., 0., 0., 0., 0., 0., 0.7, 0., 0., 0., 0., 0., 0.,
    ];
    assert_eq!(head_positions(&plain, &weights), 3);
    assert_eq!(head_positions(&with_dflash2(&plain), &weights), 8);
    assert_eq!(head_positions(&with_dflash2(&plain), &[0.0; 8]), 0);
}

#[test]
fn a_dflash2_head_adds_its_convolutions_selector_and_walk_by_hand() {
    let plain = DrafterConfig {
        block_size: 4,
        layer_types: vec![LayerType::Full, LayerType::Full],
        num_hidden_layers: 2,
        ..one_layer_drafter()
    };
    let d = with_dflash2(&plain);
    // 4 blocks of 4 (the last a padding block): Q = 16 draft positions; weighted slots 1 and 2
    // of block 0 and slot 1 of block 2, so the head runs over blocks 0 and 2, 8 slots.
    let weights = [
        0., 0.9, 0.8, 0., 0., 0., 0., 0., 0., 0.7, 0., 0., 0., 0., 0., 0.,
    ];
    let work = |d| StepWork {
        drafter: d,
        batch: 1,
        seq_len: 16,
        anchors: &[2, 6, 9, 0],
        keep: &[true, true, true, false],
        weighted_positions: 3,
        corrected_positions: 0,
        head_positions: head_positions(d, &weights),
        teacher_positions: 0,
        vocab_size: 10,
    };
    let (w, base) = (work(&d), work(&plain));
    // H = 4, taps = 2, G = 4 / 2 = 2, r = 3, K = 2, V = 10.
    // Per layer two kernel projections [16, 4] × [4, 2·2·2].
    let conv = 2.0 * (2.0 * 16.0 * 4.0 * 8.0);
    // The selector over the 8 head slots: W_h [8, 4] × [4, 3]; B[cand] [2, 3] · context [3].
    let (projection, scores) = (2.0 * 8.0 * 4.0 * 3.0, 2.0 * 8.0 * 2.0 * 3.0);
    // The walk: slots 1..=3 of the 2 head blocks, 6 rows of each, forward only.
    let walk = 2.0 * 6.0 * 4.0 * 3.0 + 2.0 * 6.0 * 2.0 * 3.0;
    let t = dflash2_terms(&w).unwrap();
    assert_eq!(
        (t.layer_conv_projections, t.layers, t.hidden_projection),
        (conv, 2.0, projection)
    );
    assert_eq!((t.candidate_scores, t.walk), (scores, walk));
    // The LM head over 8 slots instead of the 3 weighted ones; its backward is the input
    // gradient alone.
    let head = 2.0 * (8.0 - 3.0) * 4.0 * 10.0;
    let (with, without) = (drafter_step_flops(&w), drafter_step_flops(&base));
    let trained = 2.0 * conv + projection + scores;
    assert_eq!(with.forward - without.forward, head + trained + walk);
    assert_eq!(with.backward - without.backward, head + 2.0 * trained);
    // The executed count runs the same matmuls, and checkpointing recomputes the first
    // layer's kernel projections with its other projections.
    let executed = |w: &StepWork<'_>, ckpt| drafter_step_executed_flops(w, ckpt).matmul;
    assert_eq!(
        executed(&w, false) - executed(&base, false),
        with.total() - without.total()
    );
    assert_eq!(
        executed(&w, true) - executed(&base, true),
        with.total() - without.total() + conv
    );
    assert!(dflash2_terms(&base).is_none());
}

#[test]
fn the_typical_step_runs_a_dflash2_head_over_whole_blocks() {
    use crate::plan::StepShape;
    let plain = DrafterConfig {
        block_size: 4,
        ..one_layer_drafter()
    };
    // 8 anchors over the last 31 valid positions of 64 tokens: every block holds a weighted
    // slot (the last, at 61, slots 1 and 2 only), so DFlash2's head runs over all 4 of each.
    let typical = |d: &DrafterConfig| StepShape::typical(d, 2, 64, 8, 0.5, 1024);
    let (base, d2) = (typical(&plain), typical(&with_dflash2(&plain)));
    assert_eq!(base.head_positions, base.weighted_positions);
    assert_eq!(d2.weighted_positions, base.weighted_positions);
    assert_eq!(d2.head_positions, 2 * 8 * 4);
    assert!(d2.weighted_positions < d2.head_positions);
}
