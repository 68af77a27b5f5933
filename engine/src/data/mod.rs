//! Training data: SpecForge-style chat JSONL (rendered with the model's chat template and
//! tokenized with its `tokenizer.json`, loss mask on the assistant spans) and pre-tokenized
//! JSONL; a deterministic per-epoch order and a held-out evaluation split.
//!
//! Entry points: [`ChatEncoder::from_model_dir`] (chat data only), [`load`], [`holdout_split`],
//! [`epoch_order`]; for generation, [`read_prompt_rows`] + [`tokenize_prompts`] (prompt files)
//! and [`load_stop_tokens`] (`generation_config.json`, else `config.json`).
mod chat;
mod dataset;
mod encoder;
mod error;
mod mask;
mod model_files;
mod order;
mod pretokenized;
mod prompts;
mod pyjson;
mod sample;
mod template;

pub use chat::{
    parse_line as parse_chat_line, parse_prompt_line as parse_chat_prompt_line, Conversation,
};
pub use dataset::{load, DataFormat, LoadOptions};
pub use encoder::{ChatEncoder, ChatOptions, EncodedChat};
pub use error::DataError;
pub use mask::{SpanRule, SPAN_RULE_NAMES};
pub use model_files::{
    load_chat_template, load_stop_tokens, load_tokenizer, StopTokenSource, StopTokens,
    GENERATION_CONFIG_FILE,
};
pub use order::{epoch_order, holdout_split, HoldoutSplit};
pub use pretokenized::parse_line as parse_pretokenized_line;
pub use prompts::{
    parse_prompt_row, read_prompt_rows, tokenize_prompts, Prompt, PromptRow, PromptRows,
};
pub use sample::{has_consecutive_supervised, BadLine, LoadReport, Sample};
pub use template::{ChatTemplate, RenderArgs};
