//! Training data: SpecForge-style chat JSONL (rendered with the model's chat template and
//! tokenized with its `tokenizer.json`, loss mask on the assistant spans) and pre-tokenized
//! JSONL; a deterministic per-epoch order and a held-out evaluation split.
//!
//! Entry points: [`ChatEncoder::from_model_dir`] (chat data only), [`load`], [`holdout_split`],
//! [`epoch_order`]; [`regenerate`] and [`regenerate_output`] are the pure parts of
//! `dflashd regenerate` (the driver is [`crate::regenerate`]).
mod chat;
mod dataset;
mod encoder;
mod error;
mod mask;
mod model_files;
mod order;
mod pretokenized;
mod pyjson;
pub mod regenerate;
pub mod regenerate_output;
mod sample;
mod template;

pub use chat::{parse_line as parse_chat_line, Conversation};
pub use dataset::{load, DataFormat, LoadOptions};
pub use encoder::{ChatEncoder, ChatOptions, EncodedChat};
pub use error::DataError;
pub use mask::{SpanRule, SPAN_RULE_NAMES};
pub use model_files::{load_chat_template, load_tokenizer};
pub use order::{epoch_order, holdout_split, HoldoutSplit};
pub use pretokenized::parse_line as parse_pretokenized_line;
pub use sample::{has_consecutive_supervised, BadLine, LoadReport, Sample};
pub use template::{ChatTemplate, RenderArgs};
