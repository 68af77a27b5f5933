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
    let _rng = crate::device::global_rng::seeded(1);
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
    let rank = RankContext::alone(ActivationPrecision::Bf16Cuda, false);
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
    let rank = RankContext::alone(ActivationPrecision::Bf16Cuda, false);
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

#[test]
fn the_plan_counts_a_dflash2_heads_parameters_as_the_model_holds_them() {
    let _rng = crate::device::global_rng::seeded(2);
    use crate::model::drafter::{Dflash2Config, Drafter};
    use crate::model::target::TargetConfig;
    let plain = crate::embedded::tiny_dflash_drafter_config(&TargetConfig::tiny_default());
    let count = |d: &DrafterConfig| {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let _drafter = Drafter::new(&vs.root(), d);
        vs.variables()
            .values()
            .map(|t| t.numel() as f64)
            .sum::<f64>()
    };
    assert_eq!(dflash2_params(&plain), 0.0);
    let (h, v, layers) = (
        plain.hidden_size as f64,
        plain.vocab_size as f64,
        plain.layer_types.len() as f64,
    );
    for (taps, group, rank) in [(2, 4, 5), (3, 8, 2)] {
        let head = Dflash2Config {
            conv_kernel_size: taps,
            conv_group_size: group,
            selector_rank: rank,
            selector_top_k: 4,
            output_multiplier: 1.0,
            final_logit_softcapping: Some(30.0),
        };
        let d = DrafterConfig {
            head: DrafterHead::Dflash2(head),
            ..plain.clone()
        };
        d.validate("test").unwrap();
        // By hand: per layer two convolutions, each base_kernel [2, taps, H] and
        // kernel_projection [2·taps·G, H]; the codebooks [V, r] and hidden_projection [r, H].
        let (taps, groups, r) = (taps as f64, (plain.hidden_size / group) as f64, rank as f64);
        let conv = 2.0 * taps * h + 2.0 * taps * groups * h;
        let by_hand = layers * 2.0 * conv + 2.0 * v * r + r * h;
        assert_eq!(dflash2_params(&d), by_hand, "{head:?}");
        assert_eq!(drafter_params(&d), count(&d), "{head:?}");
        assert_eq!(drafter_params(&d) - drafter_params(&plain), by_hand);
    }
}

fn dspark(
    markov_rank: i64,
    kind: MarkovHeadType,
    confidence: bool,
    with_markov: bool,
) -> DsparkConfig {
    DsparkConfig {
        markov_rank,
        markov_head_type: kind,
        confidence_head: confidence,
        confidence_head_with_markov: with_markov,
    }
}

#[test]
fn the_plan_counts_a_dspark_heads_parameters_as_the_model_holds_them() {
    let _rng = crate::device::global_rng::seeded(3);
    use crate::model::drafter::Drafter;
    use crate::model::target::TargetConfig;
    let plain = crate::embedded::tiny_dflash_drafter_config(&TargetConfig::tiny_default());
    let count = |d: &DrafterConfig| {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let _drafter = Drafter::new(&vs.root(), d);
        vs.variables()
            .values()
            .map(|t| t.numel() as f64)
            .sum::<f64>()
    };
    assert_eq!(dspark_params(&plain), 0.0);
    let (h, v, r) = (plain.hidden_size as f64, plain.vocab_size as f64, 5.0);
    // By hand, per variant: W₁ and W₂ [V, r]; the gate [r, H + r] + [r]; the RNN's joint
    // projection [3r, 2r + H] + [3r]; the confidence head [1, H (+ r)] + [1].
    let w = 2.0 * v * r;
    let cases = [
        (dspark(5, MarkovHeadType::Vanilla, false, false), w),
        (dspark(5, MarkovHeadType::Vanilla, true, false), w + h + 1.0),
        (
            dspark(5, MarkovHeadType::Vanilla, true, true),
            w + h + r + 1.0,
        ),
        (
            dspark(5, MarkovHeadType::Gated, true, true),
            w + r * (h + r) + r + h + r + 1.0,
        ),
        (
            dspark(5, MarkovHeadType::Rnn, false, false),
            w + 3.0 * r * (2.0 * r + h) + 3.0 * r,
        ),
        (dspark(0, MarkovHeadType::Rnn, true, false), h + 1.0),
        (dspark(0, MarkovHeadType::Vanilla, false, false), 0.0),
    ];
    for (head, by_hand) in cases {
        let d = DrafterConfig {
            head: DrafterHead::Dspark(head),
            ..plain.clone()
        };
        d.validate("test").unwrap();
        assert_eq!(dspark_params(&d), by_hand, "{head:?}");
        assert_eq!(drafter_params(&d), count(&d), "{head:?}");
        assert_eq!(drafter_params(&d) - drafter_params(&plain), by_hand);
    }
}

#[test]
fn a_dspark_head_adds_its_parameters_teacher_states_latents_and_distillation_tensors() {
    // The 27B drafter with SpecForge's DSpark configs' heads: rank 256, vanilla, a confidence
    // head reading the Markov embedding.
    let plain = real_drafter();
    let head = dspark(256, MarkovHeadType::Vanilla, true, true);
    let d = DrafterConfig {
        head: DrafterHead::Dspark(head),
        ..plain.clone()
    };
    let (h, v, r) = (5120.0, 248_320.0, 256.0);
    let params = dspark_params(&d);
    assert_eq!(params, 2.0 * v * r + (h + r) + 1.0);
    assert_eq!(params, 127_145_217.0);
    let rank = RankContext::alone(ActivationPrecision::Bf16Cuda, false);
    // One step shape for both, DSpark's (slot 0 weighted too).
    let s = StepShape::typical(&d, 1, 3072, 1024, 0.85, 2048);
    let (a, b) = (
        drafter_memory(&plain, &s, rank),
        drafter_memory(&d, &s, rank),
    );
    // bf16 parameters, fp32 masters, two fp32 Adam moments
    assert_eq!(
        b.resident_bytes() - a.resident_bytes(),
        params * (2.0 + 4.0 + 8.0)
    );
    let bytes = |m: &DrafterMemory, name: &str| {
        m.step
            .iter()
            .filter(|c| c.name.starts_with(name))
            .map(|c| c.bytes)
            .sum::<f64>()
    };
    // Outside the loss: the teacher's states per slot (bf16), the previous tokens, weights
    // and validity, the latents W₁[prev] and their leaf's gradient.
    let q = s.draft_positions(d.block_size) as f64;
    assert_eq!(bytes(&a, "DSpark"), 0.0);
    assert_eq!(
        bytes(&b, "DSpark"),
        q * h * 2.0 + q * 13.0 + 2.0 * q * r * 2.0
    );
    assert_eq!((a.peak_phase, b.peak_phase), ("loss", "loss"));
    // The loss chunk of c positions: DSpark's nine fp32 [c, V] tensors in place of DFlash's
    // bf16 logits, their fp32 copy and three fp32 tensors; the chunk's teacher states, its
    // latents and their gradient, the confidence head's input [c, H + r] (bf16), and the
    // gradients [V, r] of W₂ and of W₁ (which the confidence head reads) that the first
    // chunk's backward writes and the later chunks' peaks hold.
    let c = (s.weighted_positions as f64).min(s.loss_chunk_positions as f64);
    assert!(s.weighted_positions > s.loss_chunk_positions);
    let extra = bytes(&b, "loss chunk") - bytes(&a, "loss chunk");
    let expected = c * v * (36.0 - (2.0 + 4.0 + 12.0))
        + c * h * 2.0
        + 2.0 * c * r * 2.0
        + 2.0 * v * r * 2.0
        + c * (h + r) * 2.0;
    assert!(
        (extra - expected).abs() < 1e-9 * expected,
        "{extra} vs {expected}"
    );
    // Without a Markov head the corrected logits are the base ones: one fp32 [c, V] fewer,
    // no latents, no W₂.
    let bare = DrafterConfig {
        head: DrafterHead::Dspark(dspark(0, MarkovHeadType::Vanilla, true, false)),
        ..plain.clone()
    };
    let m = drafter_memory(&bare, &s, rank);
    assert_eq!(bytes(&m, "DSpark"), q * h * 2.0 + q * 13.0);
    let extra = bytes(&m, "loss chunk") - bytes(&a, "loss chunk");
    let expected = c * v * (32.0 - 18.0) + c * h * 2.0;
    assert!(
        (extra - expected).abs() < 1e-9 * expected,
        "{extra} vs {expected}"
    );
}

#[test]
fn the_markov_variants_keep_what_their_backward_reads() {
    let plain = real_drafter();
    let rank = RankContext::alone(ActivationPrecision::Fp32Cpu, true);
    let memory = |kind| {
        let d = DrafterConfig {
            head: DrafterHead::Dspark(dspark(64, kind, false, false)),
            ..plain.clone()
        };
        let s = StepShape::typical(&d, 1, 1024, 64, 0.85, 2048);
        let q = s.draft_positions(d.block_size) as f64;
        let m = drafter_memory(&d, &s, rank);
        let latents = m
            .step
            .iter()
            .find(|c| c.name.starts_with("DSpark"))
            .unwrap()
            .bytes;
        (latents, q)
    };
    let (h, r) = (5120.0, 64.0);
    let (vanilla, q) = memory(MarkovHeadType::Vanilla);
    let (gated, _) = memory(MarkovHeadType::Gated);
    let (rnn, _) = memory(MarkovHeadType::Rnn);
    // Gated: the embedding, the gate's input [H + r] and the gate besides the latents; the
    // RNN: per slot its input [2r + H], keep, candidate and s − candidate, and the latents
    // stacked once more (fp32).
    assert_eq!(gated - vanilla, q * (h + 3.0 * r) * 4.0);
    assert_eq!(rnn - vanilla, q * (h + 6.0 * r) * 4.0);
}
