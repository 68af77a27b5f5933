use super::*;
use crate::model::attention::BlockSparsePlan;
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
            let engine = BlockSparsePlan::new(
                rule,
                &a,
                &k,
                d.block_size,
                seq,
                d.num_attention_heads,
                DEFAULT_CHUNK_SCORE_ELEMENTS,
                (Kind::Float, Device::Cpu),
            );
            assert_eq!(
                chunk_plan(&d, (s.batch, s.seq_len), &s.anchors, &s.keep, rule).len(),
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
    let mut d = crate::train::embedded::tiny_dflash_drafter_config(&TargetConfig::tiny_default());
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

#[test]
fn a_domino_head_adds_its_state_activations_and_a_second_vocabulary_wide_loss_term() {
    use crate::model::drafter::{DominoConfig, DrafterHead};
    let plain = real_drafter();
    let mut domino = plain.clone();
    domino.head = DrafterHead::Domino(DominoConfig {
        emb_dim: 256,
        gru_hidden_dim: 1024,
        pure_draft_prefix_len: 0,
    });
    // embed_proj's output layer at Qwen3.6-27B, [248320, 256], is 63.6M of the head's 84M
    let head = domino_params(&domino);
    assert_eq!(plain.vocab_size, 248_320);
    let output_layer = 248_320.0 * 256.0;
    assert!((84.0e6..84.1e6).contains(&head), "{head}");
    assert!(output_layer / head > 0.75, "{head}");
    let rank = RankContext {
        precision: ActivationPrecision::Bf16Cuda,
        ranks: 1,
        tables_shared_with_target: false,
        queued_items: 0,
        item_bytes: 0.0,
        activation_checkpointing: false,
    };
    let s = StepShape::typical(&plain, 1, 3072, 1024, 0.85, 2048);
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
    // the loss chunk: c positions of 248320 logits, twice over, and the delta
    let c = (s.weighted_positions as f64).min(s.loss_chunk_positions as f64);
    let extra = bytes(&b, "loss chunk") - bytes(&a, "loss chunk");
    assert_eq!(
        extra,
        c * plain.vocab_size as f64 * (2.0 + 4.0 + 4.0 + 12.0)
    );
}
