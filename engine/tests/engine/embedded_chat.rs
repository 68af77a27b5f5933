//! The tiny target is a complete chat model: its chat template and tokenizer
//! (`assets/tiny/make_tiny_tokenizer.py`) spell the embedded dataset exactly, so chat data,
//! chat prompts and `dflashd regenerate` on the embedded default see the same ids and loss
//! masks as the pre-tokenized path.
use dflash_engine::data::{ChatEncoder, ChatOptions};
use dflash_engine::decode::{generate_target_only, Sampling, Settings};
use dflash_engine::embedded;
use dflash_engine::embedded::tiny_chat::tiny_chat_line;
use dflash_engine::model::target::TargetModel;
use dflash_engine::regenerate::{regenerate_row, Job, Outcome};
use tch::{Device, Kind};

fn tiny_target_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    embedded::write_tiny_target(dir.path()).unwrap();
    dir
}

/// SpecForge's qwen3.5 settings, as training and `regenerate` use them.
fn encoder(dir: &std::path::Path) -> ChatEncoder {
    ChatEncoder::from_model_dir(dir, None, ChatOptions::default()).unwrap()
}

#[test]
fn every_conversation_of_the_embedded_data_renders_and_tokenizes_back_to_its_ids_and_mask() {
    let dir = tiny_target_dir();
    let encoder = encoder(dir.path());
    let cfg = embedded::tiny_target_config();
    let (samples, _) = embedded::tiny_samples(
        cfg.vocab_size(),
        embedded::tiny_train_config().training.max_length,
    )
    .unwrap();
    for (i, sample) in samples.iter().enumerate() {
        let line = tiny_chat_line(&sample.input_ids, encoder.tokenizer()).unwrap();
        let encoded = encoder.encode_line(&line).unwrap().sample;
        assert_eq!(
            encoded.input_ids,
            sample.input_ids,
            "line {}: {line}",
            i + 1
        );
        assert_eq!(
            encoded.loss_mask,
            sample.loss_mask,
            "line {}: {line}",
            i + 1
        );
    }
}

#[test]
fn every_held_out_prompt_is_its_chat_rows_generation_prompt() {
    let dir = tiny_target_dir();
    let encoder = encoder(dir.path());
    for prompt in embedded::tiny_heldout_prompts() {
        let line = tiny_chat_line(&prompt, encoder.tokenizer()).unwrap();
        assert!(!line.contains("assistant\"}]"), "{line}");
        assert_eq!(encoder.encode_prompt_line(&line).unwrap(), prompt, "{line}");
    }
}

#[test]
fn a_broken_layout_is_refused_naming_where() {
    let dir = tiny_target_dir();
    let tokenizer = encoder(dir.path()).tokenizer().clone();
    let no_bos = tiny_chat_line(&[3, 6, 2], &tokenizer).unwrap_err();
    assert!(no_bos.contains("BOS"), "{no_bos}");
    let open_turn = tiny_chat_line(&[1, 3, 6, 16], &tokenizer).unwrap_err();
    assert!(open_turn.contains("without its end-of-turn"), "{open_turn}");
    let no_header = tiny_chat_line(&[1, 16, 2], &tokenizer).unwrap_err();
    assert!(no_header.contains("position 1"), "{no_header}");
}

/// `regenerate` on the embedded data: each reply is the target's own greedy generation, and
/// the regenerated row encodes back to the prompt's ids followed by exactly those tokens (the
/// text round trip loses nothing, the end-of-turn token included).
#[test]
fn a_regenerated_row_holds_exactly_the_targets_greedy_reply() {
    let dir = tiny_target_dir();
    let encoder = encoder(dir.path());
    let target = TargetModel::load(dir.path(), Device::Cpu, Some(Kind::Float)).unwrap();
    let settings = Settings {
        max_new_tokens: 40,
        stop_tokens: vec![embedded::TINY_END_OF_TURN],
        sampling: Sampling::Greedy,
        seed: 0,
    };
    let cfg = embedded::tiny_target_config();
    let (samples, _) = embedded::tiny_samples(
        cfg.vocab_size(),
        embedded::tiny_train_config().training.max_length,
    )
    .unwrap();
    // Single-turn conversations: the whole reply follows one prompt.
    let single: Vec<_> = samples
        .iter()
        .filter(|s| s.input_ids.iter().filter(|&&t| t == 4).count() == 1)
        .take(4)
        .collect();
    assert_eq!(single.len(), 4);
    for (index, sample) in single.into_iter().enumerate() {
        let line = tiny_chat_line(&sample.input_ids, encoder.tokenizer()).unwrap();
        let job = Job {
            index: index as u64,
            text: line,
        };
        let Outcome::Row {
            line: regenerated, ..
        } = regenerate_row(&target, &encoder, &job, &settings).unwrap()
        else {
            panic!("row {index} skipped");
        };
        let header = sample.input_ids.iter().position(|&t| t == 4).unwrap();
        let prompt = &sample.input_ids[..=header];
        let reply = generate_target_only(&target, prompt, &settings)
            .unwrap()
            .output_ids;
        assert_eq!(reply.last(), Some(&embedded::TINY_END_OF_TURN));
        let encoded = encoder.encode_line(&regenerated).unwrap().sample;
        let expected: Vec<i64> = prompt.iter().chain(&reply).copied().collect();
        assert_eq!(encoded.input_ids, expected, "{regenerated}");
        assert_eq!(
            encoded.loss_mask.iter().filter(|&&m| m == 1).count(),
            reply.len(),
            "the reply and its end-of-turn are supervised: {regenerated}"
        );
    }
}
