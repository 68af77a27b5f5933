//! Model-level unit tests on random tiny targets (parity with transformers lives in
//! `daemon/tests/target_parity.rs`).
use super::*;

fn small_qwen3_5() -> TargetConfig {
    let TargetConfig::Qwen3_5(mut c) = TargetConfig::tiny_default() else {
        unreachable!()
    };
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.vocab_size = 64;
    c.head_dim = 16;
    c.linear_key_head_dim = 8;
    c.linear_value_head_dim = 8;
    c.num_hidden_layers = 4;
    c.layer_types.truncate(4);
    TargetConfig::Qwen3_5(c)
}

fn small_qwen3(tied: bool) -> TargetConfig {
    TargetConfig::Qwen3(Qwen3Config {
        vocab_size: 64,
        hidden_size: 32,
        intermediate_size: 48,
        num_hidden_layers: 3,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        attention_bias: true,
        tie_word_embeddings: tied,
        max_position_embeddings: 128,
    })
}

fn ids(batch: i64, seq: i64, vocab: i64) -> Tensor {
    Tensor::arange(batch * seq, (Kind::Int64, Device::Cpu))
        .view([batch, seq])
        .remainder(vocab)
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    if a.numel() == 0 {
        return 0.0;
    }
    (a - b).abs().max().double_value(&[])
}

#[test]
fn features_shape_order_and_truncation() {
    let model = TargetModel::random(small_qwen3_5(), Device::Cpu, Kind::Float, 1);
    let input = ids(2, 70, 64);
    let f = model.features(&input, &[3, 0, 2]).unwrap();
    assert_eq!(f.size(), vec![2, 70, 96]);
    let single = |l: usize| model.features(&input, &[l]).unwrap();
    assert!(f.narrow(-1, 0, 32).equal(&single(3)));
    assert!(f.narrow(-1, 32, 32).equal(&single(0)));
    assert!(f.narrow(-1, 64, 32).equal(&single(2)));
    // each layer changes the residual stream
    assert!(max_diff(&single(0), &single(2)) > 1e-3);
}

/// The last hidden state comes from the same pass as the taps: bit for bit the final-normed
/// state `features` gives for the last layer's id, with the taps bit for bit those asked alone.
#[test]
fn the_last_hidden_state_comes_with_the_taps_and_changes_nothing_in_them() {
    for cfg in [small_qwen3_5(), small_qwen3(false)] {
        let model = TargetModel::random(cfg, Device::Cpu, Kind::Float, 11);
        let last = model.config().num_layers() - 1;
        let input = ids(2, 40, 64);
        let taps = [1, 0];
        let alone = model.features(&input, &taps).unwrap();
        let both = model
            .hidden_states(
                &input,
                &FeatureRequest {
                    layer_ids: taps.to_vec(),
                    last_hidden: true,
                },
            )
            .unwrap();
        assert!(both.features.equal(&alone));
        let last_hidden = both.last_hidden.expect("asked for");
        assert_eq!(last_hidden.size(), vec![2, 40, 32]);
        assert!(last_hidden.equal(&model.features(&input, &[last]).unwrap()));
        // It is what the LM head reads: its logits are a decoding forward's, up to rounding.
        let mut cache = model.new_cache();
        let step = model.forward_cached(&input, &mut cache, &[]).unwrap();
        let logits = last_hidden.linear::<Tensor>(model.lm_head(), None);
        assert!(max_diff(&logits, &step.logits) < 1e-4);
        let taps_only = model
            .hidden_states(&input, &FeatureRequest::taps(&taps))
            .unwrap();
        assert!(taps_only.last_hidden.is_none());
        assert!(taps_only.features.equal(&alone));
    }
}

#[test]
fn the_last_hidden_state_needs_every_layer_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let model = TargetModel::random(small_qwen3(true), Device::Cpu, Kind::Float, 12);
    model.save_hf(dir.path()).unwrap();
    let partial = TargetModel::load_with(
        dir.path(),
        LoadOptions {
            device: Device::Cpu,
            dtype: None,
            max_layers: Some(2),
        },
    )
    .unwrap();
    let request = FeatureRequest {
        layer_ids: vec![1],
        last_hidden: true,
    };
    assert_eq!(request.layers_read(3), vec![1, 2]);
    let err = partial
        .hidden_states(&ids(1, 5, 64), &request)
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer id 2"), "{err}");
}

#[test]
fn features_are_causal() {
    let model = TargetModel::random(small_qwen3_5(), Device::Cpu, Kind::Float, 2);
    let a = ids(1, 80, 64);
    let b = a.copy();
    let _ = b.narrow(1, 50, 30).fill_(5);
    let fa = model.features(&a, &[3]).unwrap();
    let fb = model.features(&b, &[3]).unwrap();
    assert!(max_diff(&fa.narrow(1, 0, 50), &fb.narrow(1, 0, 50)) < 1e-6);
    assert!(max_diff(&fa.narrow(1, 50, 30), &fb.narrow(1, 50, 30)) > 1e-4);
}

#[test]
fn batch_rows_are_independent() {
    let model = TargetModel::random(small_qwen3_5(), Device::Cpu, Kind::Float, 3);
    let input = ids(2, 40, 64);
    let both = model.features(&input, &[1, 2]).unwrap();
    let row1 = model.features(&input.narrow(0, 1, 1), &[1, 2]).unwrap();
    assert!(max_diff(&both.narrow(0, 1, 1), &row1) < 1e-5);
}

#[test]
fn save_then_load_round_trips_single_and_sharded() {
    for (config, shard_bytes) in [
        (small_qwen3_5(), DEFAULT_MAX_SHARD_BYTES),
        (small_qwen3_5(), 8 * 1024),
        (small_qwen3(false), 8 * 1024),
        (small_qwen3(true), DEFAULT_MAX_SHARD_BYTES),
    ] {
        let model = TargetModel::random(config.clone(), Device::Cpu, Kind::Float, 4);
        let dir = tempfile::tempdir().unwrap();
        model.save_hf_sharded(dir.path(), shard_bytes).unwrap();
        let sharded = dir.path().join("model.safetensors.index.json").exists();
        assert_eq!(sharded, shard_bytes < DEFAULT_MAX_SHARD_BYTES);
        let loaded = TargetModel::load(dir.path(), Device::Cpu, None).unwrap();
        assert_eq!(loaded.config(), &config);
        let input = ids(1, 20, 64);
        let layers: Vec<usize> = (0..config.num_layers()).collect();
        assert!(model
            .features(&input, &layers)
            .unwrap()
            .equal(&loaded.features(&input, &layers).unwrap()));
        assert!(loaded.lm_head().equal(model.lm_head()));
        if config.tie_word_embeddings() {
            assert!(loaded.lm_head().equal(loaded.embed_tokens()));
        }
        // re-saving the loaded model keeps its config and loads again
        let again = tempfile::tempdir().unwrap();
        loaded.save_hf(again.path()).unwrap();
        assert_eq!(TargetConfig::from_hf_dir(again.path()).unwrap(), config);
    }
}

#[test]
fn load_with_max_layers_gives_the_same_early_features() {
    let model = TargetModel::random(small_qwen3_5(), Device::Cpu, Kind::Float, 5);
    let dir = tempfile::tempdir().unwrap();
    model.save_hf(dir.path()).unwrap();
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: None,
        max_layers: Some(2),
    };
    let partial = TargetModel::load_with(dir.path(), options).unwrap();
    assert_eq!(partial.loaded_layers(), 2);
    let input = ids(1, 30, 64);
    assert!(partial
        .features(&input, &[1])
        .unwrap()
        .equal(&model.features(&input, &[1]).unwrap()));
    let err = partial.features(&input, &[2]).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::LayerOutOfRange {
                layer: 2,
                available: 2
            }
        ),
        "{err}"
    );
    assert!(partial
        .save_hf(tempfile::tempdir().unwrap().path())
        .is_err());
}

#[test]
fn bf16_load_runs_in_bf16_close_to_f32() {
    let model = TargetModel::random(small_qwen3_5(), Device::Cpu, Kind::Float, 6);
    let dir = tempfile::tempdir().unwrap();
    model.save_hf(dir.path()).unwrap();
    let bf16 = TargetModel::load(dir.path(), Device::Cpu, Some(Kind::BFloat16)).unwrap();
    let input = ids(1, 70, 64);
    let a = model.features(&input, &[3]).unwrap();
    let b = bf16.features(&input, &[3]).unwrap();
    assert_eq!(b.kind(), Kind::BFloat16);
    let rel = max_diff(&a, &b.to_kind(Kind::Float)) / a.abs().max().double_value(&[]);
    assert!(rel < 0.05, "bf16 relative deviation {rel}");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let model = TargetModel::random(small_qwen3(false), Device::Cpu, Kind::Float, 7);
    let input = ids(2, 10, 64);
    let _ = input.get(1).get(7).fill_(64);
    let err = model.features(&input, &[0]).unwrap_err().to_string();
    assert!(
        err.contains("token id 64") && err.contains("[1, 7]") && err.contains("vocab_size 64"),
        "{err}"
    );
    let _ = input.get(1).get(7).fill_(-1);
    assert!(model
        .features(&input, &[0])
        .unwrap_err()
        .to_string()
        .contains("token id -1"));

    let err = model
        .features(&ids(1, 5, 64), &[3])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layer id 3") && err.contains("3 decoder layers"),
        "{err}"
    );
    assert!(model.features(&ids(1, 5, 64), &[]).is_err());
    let flat = Tensor::arange(5, (Kind::Int64, Device::Cpu));
    assert!(model
        .features(&flat, &[0])
        .unwrap_err()
        .to_string()
        .contains("[batch, seq]"));
    let floats = Tensor::zeros([1, 5], (Kind::Float, Device::Cpu));
    assert!(model
        .features(&floats, &[0])
        .unwrap_err()
        .to_string()
        .contains("integer"));
}

#[test]
fn dtype_names_parse() {
    assert_eq!(parse_dtype("bf16").unwrap(), Kind::BFloat16);
    assert_eq!(parse_dtype("f32").unwrap(), Kind::Float);
    assert!(parse_dtype("int8")
        .unwrap_err()
        .to_string()
        .contains("int8"));
}

#[test]
fn hand_built_configs_are_validated_per_family() {
    assert_eq!(small_qwen3(false).validate(), Ok(()));
    assert_eq!(small_qwen3_5().validate(), Ok(()));

    let TargetConfig::Qwen3(mut c) = small_qwen3(false) else {
        unreachable!()
    };
    c.num_key_value_heads = 3;
    assert_eq!(
        TargetConfig::Qwen3(c.clone()).validate(),
        Err("num_attention_heads (4) must be a multiple of num_key_value_heads (3)".into())
    );
    c.num_key_value_heads = 2;
    c.head_dim = 7;
    assert_eq!(
        TargetConfig::Qwen3(c).validate(),
        Err("head_dim 7 must be even".into())
    );

    let TargetConfig::Qwen3_5(mut c) = small_qwen3_5() else {
        unreachable!()
    };
    c.vocab_size = 0;
    assert_eq!(
        TargetConfig::Qwen3_5(c.clone()).validate(),
        Err("vocab_size must be > 0, is 0".into())
    );
    c.vocab_size = 64;
    c.linear_num_key_heads = 0;
    assert_eq!(
        TargetConfig::Qwen3_5(c).validate(),
        Err("linear_num_key_heads must be > 0, is 0".into())
    );
}

/// Logits and taps of every position of `ids` `[1,S]` from one forward over the whole sequence.
fn whole_sequence(model: &TargetModel, ids: &Tensor, taps: &[usize]) -> CachedStep {
    model
        .forward_cached(ids, &mut model.new_cache(), taps)
        .unwrap()
}

#[test]
fn cached_decoding_with_rollbacks_equals_the_whole_sequence_forward() {
    // Tolerance: the same f32 math with the cache read through a mask and the delta rule
    // restarted from a state (chunked or recurrent), so rounding only.
    const TOL: f64 = 1e-4;
    for config in [small_qwen3_5(), small_qwen3(false)] {
        let model = TargetModel::random(config.clone(), Device::Cpu, Kind::Float, 8);
        let taps = [1usize, 0];
        let truth_ids = ids(1, 100, 64).remainder(61).g_mul_scalar(7).remainder(64);
        let truth = whole_sequence(&model, &truth_ids, &taps);
        assert!(truth
            .taps
            .equal(&model.features(&truth_ids, &taps).unwrap()));

        let mut cache = model.new_cache();
        let prefill = model
            .forward_cached(&truth_ids.narrow(1, 0, 70), &mut cache, &taps)
            .unwrap();
        assert!(max_diff(&prefill.logits, &truth.logits.narrow(1, 0, 70)) < TOL);
        // Rounds of 5 tokens of which `keep` continue the sequence and the rest are junk that a
        // rejection rolls back; 0 and 5 kept are the edges; one single-token step.
        let mut len = 70;
        for keep in [2i64, 0, 5, 1, 3, 0, 4] {
            let junk = Tensor::full([1, 5 - keep], 63, (Kind::Int64, Device::Cpu));
            let block = Tensor::cat(&[truth_ids.narrow(1, len, keep), junk], 1);
            let step = model.forward_cached(&block, &mut cache, &taps).unwrap();
            assert_eq!(step.logits.size(), vec![1, 5, 64]);
            let want = truth.logits.narrow(1, len, keep);
            let diff = max_diff(&step.logits.narrow(1, 0, keep), &want);
            assert!(diff < TOL, "{config:?} round keep {keep} at {len}: {diff}");
            let tap_diff = max_diff(
                &step.taps.narrow(1, 0, keep),
                &truth.taps.narrow(1, len, keep),
            );
            assert!(tap_diff < TOL, "taps {tap_diff}");
            cache.crop(len + keep).unwrap();
            len += keep;
            assert_eq!(cache.len(), len);
        }
        // decode token by token past the rounds: the recurrent single-token path
        for _ in 0..3 {
            let step = model
                .forward_cached(&truth_ids.narrow(1, len, 1), &mut cache, &taps)
                .unwrap();
            let diff = max_diff(&step.logits, &truth.logits.narrow(1, len, 1));
            assert!(diff < TOL, "single token at {len}: {diff}");
            len += 1;
        }
        let err = cache.crop(len - 2).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{}..={len}", len - 1)),
            "the refusal names the window: {err}"
        );
        assert_eq!(cache.len(), len, "a refused crop changes nothing");
    }
}
