use super::*;
use crate::model::attention::{ChunkSchedule, ScheduledBlocks};
use crate::plan::run::tests::real_drafter;
use tch::{Device, Kind, Tensor};

#[test]
fn the_model_plans_the_chunks_the_engine_runs() {
    let d = real_drafter();
    for (seq, anchors) in [(3072, 1024), (1024, 64), (300, 200)] {
        let s = StepShape::typical(&d, 2, seq, anchors, 0.85, 2048);
        let (b, n) = (s.batch, s.width());
        let a = Tensor::from_slice(&s.anchors).view([b, n]);
        let k = Tensor::from_slice(&s.keep).view([b, n]);
        for t in [LayerType::Sliding, LayerType::Full] {
            let rule = layer_rule(&d, t);
            let blocks = ScheduledBlocks {
                rule,
                anchors: &a,
                keep: &k,
                block_size: d.block_size,
                context_len: seq,
                heads: d.num_attention_heads,
            };
            let engine = ChunkSchedule::new(
                &blocks,
                DEFAULT_CHUNK_SCORE_ELEMENTS,
                (Kind::Float, Device::Cpu),
            );
            assert_eq!(
                chunk_schedule(&d, (s.batch, s.seq_len), &s.anchors, &s.keep, rule).len(),
                engine.num_chunks(),
                "S {seq}, {anchors} anchors, {rule:?}"
            );
        }
    }
}

#[test]
fn the_plan_counts_a_domino_heads_parameters_as_the_model_holds_them() {
    use crate::model::drafter::{DominoConfig, Drafter, DrafterHead};
    use crate::model::target::TargetConfig;
    // From DFlash's head (the embedded default's is Domino) to a Domino head.
    let mut d = crate::embedded::tiny_dflash_drafter_config(&TargetConfig::tiny_default());
    let count = |d: &DrafterConfig| {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let _drafter = Drafter::new(&vs.root(), d);
        vs.variables()
            .values()
            .map(|t| t.numel() as f64)
            .sum::<f64>()
    };
    assert_eq!(drafter_params(&d), count(&d));
    assert_eq!(domino_params(&d), 0.0);
    d.head = DrafterHead::Domino(DominoConfig {
        emb_dim: 24,
        gru_hidden_dim: 12,
        pure_draft_prefix_len: 1,
    });
    assert_eq!(drafter_params(&d), count(&d));
    assert!(domino_params(&d) > 0.0);
}

/// The drafter `configs/qwen3.6-27b-8gpu.toml` trains, over the Qwen3.6-27B target.
fn shipped_27b_drafter() -> DrafterConfig {
    use crate::model::target::TargetConfig;
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/qwen3.6-27b-8gpu.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let config =
        dflash_shared::config::Config::from_toml_str(&text, "qwen3.6-27b-8gpu.toml").unwrap();
    let target = TargetConfig::Qwen3_5(crate::plan::reference::qwen36_27b_text());
    crate::train::run_config::drafter_config(&config.drafter, &target)
}

#[test]
fn a_domino_head_adds_its_state_activations_and_a_second_vocabulary_wide_loss_term() {
    use crate::model::drafter::{DominoConfig, DrafterHead};
    // The shipped 27B config: SpecForge's recipe over hidden 5120 and 248320 tokens.
    let domino = shipped_27b_drafter();
    let m = *domino
        .head
        .domino()
        .expect("the 27B config trains a Domino head");
    assert_eq!(
        m,
        DominoConfig {
            emb_dim: 256,
            gru_hidden_dim: 1024,
            pure_draft_prefix_len: 1,
        }
    );
    let plain = DrafterConfig {
        head: DrafterHead::Dflash,
        ..domino.clone()
    };
    assert_eq!((plain.hidden_size, plain.vocab_size), (5120, 248_320));
    // The head, by hand: the GRU's [3G, H] and [3G, G], embed_proj.0 [E, H + G] and its
    // output layer embed_proj.2 [V, E] = 256 × 248320 = 63,569,920 of the head's 84,017,152.
    let output_layer = 256.0 * 248_320.0;
    let head = domino_params(&domino);
    assert_eq!(
        head,
        3.0 * 1024.0 * 5120.0 + 3.0 * 1024.0 * 1024.0 + 256.0 * (5120.0 + 1024.0) + output_layer
    );
    assert_eq!(head, 84_017_152.0);
    // The output layer is the part that grows with the vocabulary: E per token.
    let one_more_token = DrafterConfig {
        vocab_size: domino.vocab_size + 1,
        ..domino.clone()
    };
    assert_eq!(domino_params(&one_more_token) - head, 256.0);
    assert_eq!(drafter_params(&domino) - drafter_params(&plain), head);
    let rank = RankContext {
        precision: ActivationPrecision::Bf16Cuda,
        ranks: 1,
        tables_shared_with_target: false,
        queued_items: 0,
        item_bytes: 0.0,
        activation_checkpointing: false,
    };
    let s = StepShape::typical(&domino, 1, 3072, 1024, 0.85, 2048);
    let (a, b) = (
        drafter_memory(&plain, &s, rank),
        drafter_memory(&domino, &s, rank),
    );
    // bf16 parameters, fp32 masters, two fp32 Adam moments
    let resident = b.resident_bytes() - a.resident_bytes();
    assert_eq!(resident, head * (2.0 + 4.0 + 8.0));
    let bytes = |m: &DrafterMemory, name: &str| {
        m.step
            .iter()
            .filter(|c| c.name.starts_with(name))
            .map(|c| c.bytes)
            .sum::<f64>()
    };
    assert_eq!(bytes(&a, "Domino"), 0.0);
    assert!(bytes(&b, "Domino") > 0.0);
    assert_eq!((a.peak_phase, b.peak_phase), ("loss", "loss"));
    // The loss chunk of c positions (both heads' losses backpropagate into a detached copy of
    // the drafter's output at this shape): per corrected position (slots 2..=31 of a block:
    // all weighted slots but slot 1, so 30 of 31 where the row leaves a block whole), the
    // logit delta over the whole vocabulary (bf16, and its fp32 copy); per position, the
    // corrected logits (fp32) and the first cross-entropy's gradient waiting for the
    // second's (fp32).
    let c = (s.weighted_positions as f64).min(s.loss_chunk_positions as f64);
    assert!(s.weighted_positions > s.loss_chunk_positions);
    let kept = s.kept() as i64;
    assert_eq!(s.corrected_positions, s.weighted_positions - kept);
    let corrected = c * s.corrected_positions as f64 / s.weighted_positions as f64;
    let vocab = plain.vocab_size as f64;
    let extra = bytes(&b, "loss chunk") - bytes(&a, "loss chunk");
    let expected = corrected * vocab * (2.0 + 4.0) + c * vocab * (4.0 + 4.0);
    assert!(
        (extra - expected).abs() < 1e-9 * expected,
        "{extra} vs {expected}"
    );
}

#[test]
fn the_tree_objective_adds_only_its_top_b_per_chunk_position_at_the_27b_shape() {
    let d = crate::plan::reference::qwen36_27b_drafter();
    assert_eq!(d.vocab_size, 248_320);
    let rank = RankContext {
        precision: ActivationPrecision::Bf16Cuda,
        ranks: 1,
        tables_shared_with_target: false,
        queued_items: 0,
        item_bytes: 0.0,
        activation_checkpointing: false,
    };
    let s = StepShape::typical(&d, 1, 3072, 1024, 0.85, 2048);
    let tree = s.clone().with_tree_budget(32);
    let loss_chunk = |s: &StepShape| {
        drafter_memory(&d, s, rank)
            .step
            .iter()
            .filter(|c| c.name.starts_with("loss chunk"))
            .map(|c| c.bytes)
            .sum::<f64>()
    };
    // One chunk of c positions: its top 32 logits (f32), their indices (i64), as
    // log-probabilities (f32) and in f64 for the host; no other vocabulary-wide tensor, so the
    // chunk's fp32 logits stay the largest [positions, vocab] tensor, at c rows.
    let c = (s.weighted_positions as f64).min(s.loss_chunk_positions as f64);
    assert!(s.weighted_positions > s.loss_chunk_positions);
    assert_eq!(drafter_memory(&d, &tree, rank).peak_phase, "loss");
    let extra = loss_chunk(&tree) - loss_chunk(&s);
    assert_eq!(extra, c * 32.0 * 24.0);
    assert!(extra < 1e-3 * c * d.vocab_size as f64 * 4.0);
    // A budget past the vocabulary keeps the whole vocabulary at most; none without the tree.
    let tiny = DrafterConfig {
        vocab_size: 16,
        ..d.clone()
    };
    let wide = s.clone().with_tree_budget(1000);
    assert_eq!(tree_chunk_bytes(&tiny, &wide, 10.0), 10.0 * 16.0 * 24.0);
    assert_eq!(tree_chunk_bytes(&d, &s, 10.0), 0.0);
}
