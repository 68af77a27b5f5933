//! Incremental decoding of the targets against transformers' own cached generation: the
//! `decode.safetensors` fixtures that `scripts/make_fixtures.py` writes beside the parity
//! checkpoints (Qwen3.5 with both layer kinds, Qwen3 dense). A 70-token prompt (two delta-rule
//! chunks), 24 greedy tokens one at a time, then 7 verification rounds of 5-token blocks with a
//! rollback after each (0 to 4 drafts accepted).
//!
//! Tolerance: logits within 1e-3 of transformers' (f32 on CPU, logits of std ~1–3). Ours and
//! theirs run the same fp32 ops but not always in the same grouping (our cached attention reads
//! a mask where a single-token query needs none, our rollback re-advances the delta-rule state
//! token by token where transformers re-runs the chunked form over the committed prefix), so
//! the figures differ by rounding only; greedy tokens must be identical.
use std::path::{Path, PathBuf};

use dflash_engine::model::target::TargetModel;
use tch::{Device, Kind, Tensor};

const LOGIT_TOLERANCE: f64 = 1e-3;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/target")
        .join(name)
}

fn tensor(dir: &Path, name: &str) -> Tensor {
    Tensor::read_safetensors(dir.join("decode.safetensors"))
        .expect("decode.safetensors (make it with scripts/make_fixtures.py --decode-only)")
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("decode.safetensors lacks {name}"))
}

fn ids(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// Greedy decoding one token per forward, as `generate(do_sample=False)` runs it.
fn greedy_decoding_matches(name: &str) {
    let dir = fixture(name);
    let model = TargetModel::load(&dir, Device::Cpu, None).unwrap();
    let prompt = tensor(&dir, "decode_prompt").unsqueeze(0);
    let want_ids = ids(&tensor(&dir, "greedy_ids"));
    let want_logits = tensor(&dir, "greedy_logits");

    let mut cache = model.new_cache();
    let prefill = model.forward_cached(&prompt, &mut cache, &[]).unwrap();
    let mut logits = prefill.logits.select(1, prompt.size()[1] - 1);
    let mut got_ids = Vec::new();
    let mut worst = 0.0f64;
    for step in 0..want_ids.len() {
        worst = worst.max(max_diff(
            &logits.squeeze_dim(0),
            &want_logits.get(step as i64),
        ));
        let next = logits.argmax(-1, false).int64_value(&[0]);
        got_ids.push(next);
        let input = Tensor::from_slice(&[next]).view([1, 1]);
        logits = model
            .forward_cached(&input, &mut cache, &[])
            .unwrap()
            .logits
            .select(1, 0);
    }
    assert_eq!(
        got_ids, want_ids,
        "{name}: greedy tokens differ from transformers'"
    );
    assert!(
        worst < LOGIT_TOLERANCE,
        "{name}: greedy logits differ by {worst}"
    );
}

/// Verification rounds with rollbacks: each block's logits and its accepted prefix.
fn verification_rounds_match(name: &str) {
    let dir = fixture(name);
    let model = TargetModel::load(&dir, Device::Cpu, None).unwrap();
    let prompt = tensor(&dir, "decode_prompt").unsqueeze(0);
    let blocks = tensor(&dir, "round_blocks");
    let round_logits = tensor(&dir, "round_logits");
    let accepted = ids(&tensor(&dir, "round_accepted"));

    let mut cache = model.new_cache();
    model.forward_cached(&prompt, &mut cache, &[]).unwrap();
    for (round, &want_accepted) in accepted.iter().enumerate() {
        let block = blocks.get(round as i64);
        let logits = model
            .forward_cached(&block.unsqueeze(0), &mut cache, &[])
            .unwrap()
            .logits
            .squeeze_dim(0);
        let diff = max_diff(&logits, &round_logits.get(round as i64));
        assert!(
            diff < LOGIT_TOLERANCE,
            "{name} round {round}: logits differ by {diff}"
        );
        // leading drafts equal to the target's argmax at the position before them
        let argmax = ids(&logits.argmax(-1, false));
        let block = ids(&block);
        let got = (1..block.len())
            .take_while(|&i| argmax[i - 1] == block[i])
            .count() as i64;
        assert_eq!(got, want_accepted, "{name} round {round}: accepted drafts");
        let keep = cache.len() - block.len() as i64 + got + 1;
        cache.crop(keep).unwrap();
    }
}

#[test]
fn qwen3_5_greedy_decoding_matches_transformers_generate() {
    greedy_decoding_matches("qwen3_5");
}

#[test]
fn qwen3_greedy_decoding_matches_transformers_generate() {
    greedy_decoding_matches("qwen3");
}

#[test]
fn qwen3_5_verification_rounds_with_rollbacks_match_transformers() {
    verification_rounds_match("qwen3_5");
}

#[test]
fn qwen3_verification_rounds_with_rollbacks_match_transformers() {
    verification_rounds_match("qwen3");
}

#[test]
fn bf16_cache_holds_bf16_taps_and_a_crop_then_rerun_gives_the_same_logits() {
    // bf16 is the product default: the cache must hold bf16 keys/values and an fp32 delta-rule
    // state without a dtype error, and a crop followed by a re-run of the cropped tokens must
    // give their logits again (within bf16 rounding).
    let dir = fixture("qwen3_5");
    let model = TargetModel::load(&dir, Device::Cpu, Some(Kind::BFloat16)).unwrap();
    let prompt = tensor(&dir, "decode_prompt").unsqueeze(0);
    let mut cache = model.new_cache();
    model.forward_cached(&prompt, &mut cache, &[1]).unwrap();
    let block = tensor(&dir, "round_blocks").get(0).unsqueeze(0);
    let step = model.forward_cached(&block, &mut cache, &[1]).unwrap();
    cache.crop(cache.len() - 2).unwrap();
    assert_eq!(step.taps.kind(), Kind::BFloat16);
    let again = model
        .forward_cached(&block.narrow(1, 3, 2), &mut cache, &[1])
        .unwrap();
    let rel = max_diff(&again.logits, &step.logits.narrow(1, 3, 2))
        / step.logits.abs().max().double_value(&[]);
    assert!(rel < 0.05, "bf16 re-run after a crop deviates by {rel}");
}
