//! Generator of `tests/fixtures/data/model/tokenizer.json`: a tiny byte-level BPE with a
//! Qwen-style pre-tokenizer and Qwen's chat special tokens, trained on
//! `tests/fixtures/data/tokenizer_corpus.txt`.
//!
//! The test checks that the committed fixture is exactly what this generator produces.
//! Regenerate after changing the corpus or the settings with:
//! `DFLASH_REGEN_FIXTURES=1 cargo test --release -p dflashd --test data_fixture_tokenizer`
use std::path::PathBuf;
use std::str::FromStr;

use tokenizers::models::bpe::BpeTrainerBuilder;
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// The GPT-4-style split Qwen2/Qwen3 tokenizers use (single digits, lookahead on spaces,
/// which needs fancy-regex).
const QWEN_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const VOCAB_SIZE: usize = 600;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/data")
}

fn generate() -> String {
    let byte_level = serde_json::json!({
        "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false
    });
    let skeleton = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": false},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": {}, "merges": []},
    });
    let mut tokenizer = Tokenizer::from_str(&skeleton.to_string()).expect("skeleton parses");
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(VOCAB_SIZE)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let corpus = std::fs::read_to_string(fixture_dir().join("tokenizer_corpus.txt")).unwrap();
    tokenizer
        .train(&mut trainer, std::iter::once(corpus.as_str()))
        .expect("training on the corpus");
    // As in Qwen3: the chat markers are special tokens; the think tags are added tokens that
    // are not special (they survive `skip_special_tokens`).
    tokenizer.add_special_tokens(&[
        AddedToken::from("<|endoftext|>", true),
        AddedToken::from("<|im_start|>", true),
        AddedToken::from("<|im_end|>", true),
    ]);
    tokenizer.add_tokens(&[
        AddedToken::from("<think>", false),
        AddedToken::from("</think>", false),
        AddedToken::from("<tool_call>", false),
        AddedToken::from("</tool_call>", false),
    ]);
    tokenizer.to_string(true).expect("serializes") + "\n"
}

#[test]
fn committed_tokenizer_fixture_matches_its_generator() {
    let path = fixture_dir().join("model/tokenizer.json");
    let generated = generate();
    assert_eq!(generated, generate(), "training must be deterministic");
    if std::env::var_os("DFLASH_REGEN_FIXTURES").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale; regenerate with DFLASH_REGEN_FIXTURES=1 (see this file's header)",
        path.display()
    );
}

#[test]
fn fixture_tokenizer_has_qwen_style_specials_and_round_trips() {
    let tokenizer = Tokenizer::from_str(&generate()).unwrap();
    for token in ["<|im_start|>", "<|im_end|>", "<think>", "</think>"] {
        let id = tokenizer
            .token_to_id(token)
            .unwrap_or_else(|| panic!("{token} missing"));
        let bpe_size = tokenizer.get_vocab_size(false);
        assert!(
            id as usize >= bpe_size,
            "{token} ({id}) should follow the {bpe_size} BPE ids"
        );
    }
    let text = "<|im_start|>assistant\n<think>\nCafé 🙂 日本\n</think>\n\nx = 42<|im_end|>\n";
    let encoding = tokenizer.encode(text, false).unwrap();
    let ids = encoding.get_ids();
    assert_eq!(ids[0], tokenizer.token_to_id("<|im_start|>").unwrap());
    assert!(
        ids.len() < text.len(),
        "merges should make tokens longer than a byte"
    );
    assert_eq!(tokenizer.decode(ids, false).unwrap(), text);
}
