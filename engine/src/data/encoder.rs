//! Chat row → training sample: render with the model's chat template, tokenize the whole text
//! once with the model's tokenizer, and mask the tokens inside the assistant spans.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use minijinja::Value;
use tokenizers::Tokenizer;

use super::chat::{self, Conversation};
use super::error::DataError;
use super::mask::{ignored_ranges, supervised_ranges, token_mask, SpanRule};
use super::model_files::{load_chat_template, load_tokenizer};
use super::sample::Sample;
use super::template::{ChatTemplate, RenderArgs};

/// How chat rows are rendered and masked.
#[derive(Debug, Clone)]
pub struct ChatOptions {
    pub span_rule: SpanRule,
    /// Put first when a row has no system message (SF's per-template system prompt).
    pub system_prompt: Option<String>,
    /// Passed to the template as `enable_thinking` (SF sets it for thinking templates).
    pub enable_thinking: Option<bool>,
}

impl Default for ChatOptions {
    /// SF's `qwen3.5` template settings.
    fn default() -> Self {
        ChatOptions {
            span_rule: SpanRule::qwen3_5(),
            system_prompt: None,
            enable_thinking: Some(true),
        }
    }
}

/// A tokenized row before length policy: the caller truncates and checks supervision.
#[derive(Debug, Clone)]
pub struct EncodedChat {
    pub text: String,
    pub sample: Sample,
}

#[derive(Debug)]
pub struct ChatEncoder {
    tokenizer: Tokenizer,
    tokenizer_path: PathBuf,
    template: ChatTemplate,
    options: ChatOptions,
}

impl ChatEncoder {
    pub fn new(
        tokenizer: Tokenizer,
        tokenizer_path: PathBuf,
        template: ChatTemplate,
        options: ChatOptions,
    ) -> Result<Self, DataError> {
        options.span_rule.validate()?;
        Ok(ChatEncoder {
            tokenizer,
            tokenizer_path,
            template,
            options,
        })
    }

    /// `tokenizer.json` and the chat template from a model directory (see
    /// [`load_chat_template`] for where the template is looked up and how to override it).
    pub fn from_model_dir(
        model_dir: &Path,
        template_file: Option<&Path>,
        options: ChatOptions,
    ) -> Result<Self, DataError> {
        let tokenizer_path = model_dir.join("tokenizer.json");
        let tokenizer = load_tokenizer(&tokenizer_path)?;
        let template = load_chat_template(model_dir, template_file)?;
        Self::new(tokenizer, tokenizer_path, template, options)
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn options(&self) -> &ChatOptions {
        &self.options
    }

    /// Parses, renders, tokenizes and masks one JSONL line. `Err` is why the line is bad.
    pub fn encode_line(&self, line: &str) -> Result<EncodedChat, String> {
        let conversation = chat::parse_line(line, self.options.system_prompt.as_deref())?;
        self.encode(&conversation)
    }

    pub fn encode(&self, conversation: &Conversation) -> Result<EncodedChat, String> {
        let text = self.render(conversation)?;
        let sample = self.tokenize_and_mask(&text)?;
        Ok(EncodedChat { text, sample })
    }

    /// The text the model sees, as `apply_chat_template(..., tokenize=False,
    /// add_generation_prompt=False)` would produce it.
    pub fn render(&self, conversation: &Conversation) -> Result<String, String> {
        self.render_with(conversation, false)
    }

    /// A generation prompt from one JSONL chat line ([`chat::parse_prompt_line`]: the row
    /// without its closing assistant answer), rendered with `add_generation_prompt=True` and
    /// tokenized like training text. `Err` is why the line is bad.
    pub fn encode_prompt_line(&self, line: &str) -> Result<Vec<i64>, String> {
        let conversation = chat::parse_prompt_line(line, self.options.system_prompt.as_deref())?;
        let text = self.render_with(&conversation, true)?;
        Ok(self.tokenize_and_mask(&text)?.input_ids)
    }

    fn render_with(
        &self,
        conversation: &Conversation,
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let mut extra = BTreeMap::new();
        if let Some(thinking) = self.options.enable_thinking {
            extra.insert("enable_thinking".to_string(), Value::from(thinking));
        }
        let args = RenderArgs {
            tools: conversation.tools.clone(),
            add_generation_prompt,
            extra,
        };
        self.template
            .render(&conversation.messages, &args)
            .map_err(|e| {
                format!(
                    "chat template {} failed: {e}",
                    self.template.origin().display()
                )
            })
    }

    /// Tokenizes the whole text once (no added BOS/EOS, as SF) and marks each token whose
    /// byte span lies inside an assistant span.
    pub fn tokenize_and_mask(&self, text: &str) -> Result<Sample, String> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| format!("tokenizer {} failed: {e}", self.tokenizer_path.display()))?;
        // A text without an assistant span gets an all-zero mask; `load` then counts the row
        // as unsupervised, as SF's `has_consecutive_supervised_tokens` filter does.
        let rule = &self.options.span_rule;
        let spans = supervised_ranges(text, rule);
        let loss_mask = token_mask(encoding.get_offsets(), &spans, &ignored_ranges(text, rule));
        let input_ids = encoding.get_ids().iter().map(|&id| i64::from(id)).collect();
        Ok(Sample {
            input_ids,
            loss_mask,
        })
    }
}
