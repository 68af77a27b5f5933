//! Regenerating chat data with the target (`dflashd regenerate`), the parts that are neither
//! I/O nor tensors: which assistant turns of a row are regenerated, the prompt each one sees,
//! how a generated text goes back into the row and per-turn seeds (the stop tokens are
//! [`crate::data::load_stop_tokens`]'s, as for every generation).
//!
//! The rule, as DFlash recipes regenerate: **every assistant turn, in order**. Each turn's
//! prompt is the conversation before it, later turns seeing the earlier ones as regenerated,
//! rendered with the chat template and its generation prompt. System, user and tool turns are
//! kept verbatim. A turn that called tools in the input (`tool_calls`) is regenerated too, its
//! `tool_calls` dropped (the target's own text, tool-call markup included, becomes its content),
//! and it ends the row: the tool answers and the turns after them answered the original calls,
//! not the target's, so they are cut.
use minijinja::Value as TemplateValue;
use serde_json::{Map, Value};

use crate::data::{parse_chat_line, ChatOptions, ChatTemplate, Conversation, RenderArgs};

/// The key each output row carries: the 1-based line number of its input row.
pub const SOURCE_LINE_KEY: &str = "source_line";

/// Text of a think block; a generation prompt ending in the opener has the target think first.
const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// One input row on its way to being regenerated.
#[derive(Debug, Clone)]
pub struct RegenRow {
    row: Map<String, Value>,
    /// `conversations`, or the `messages` spelling the loader also accepts.
    key: &'static str,
    /// Message indices of the assistant turns to regenerate, in order.
    turns: Vec<usize>,
    /// Messages kept in the output: `..keep` (shorter than the row after a tool-calling turn).
    keep: usize,
}

/// What the target said in one turn, split the way a reasoning parser splits it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The think block's text, when the target thought.
    pub reasoning: Option<String>,
    pub content: String,
}

impl RegenRow {
    /// Parses one data line. `Err` is why it cannot be regenerated (the reasons training gives
    /// for a bad chat row).
    pub fn parse(line: &str) -> Result<Self, String> {
        // The training loader's checks first, so a row is refused here exactly when training
        // would refuse it (and with the same words).
        parse_chat_line(line, None)?;
        let row: Map<String, Value> = serde_json::from_str(line)
            .map_err(|e| format!("not a JSON object ({e}); expected a chat row"))?;
        let key = if row.contains_key("conversations") {
            "conversations"
        } else {
            "messages"
        };
        let messages = row
            .get(key)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("`{key}` is not a list"))?;
        let mut turns = Vec::new();
        let mut keep = messages.len();
        for (index, message) in messages.iter().enumerate() {
            if !message.is_object() {
                return Err(format!("message {index} is not a JSON object"));
            }
            if is_assistant(message) {
                turns.push(index);
                if calls_tools(message) {
                    keep = index + 1;
                    break;
                }
            }
        }
        if turns.is_empty() {
            return Err("no assistant message, so nothing to regenerate".to_string());
        }
        Ok(RegenRow {
            row,
            key,
            turns,
            keep,
        })
    }

    /// How many assistant turns are regenerated (at least one: training refuses rows without).
    pub fn turns(&self) -> usize {
        self.turns.len()
    }

    /// The conversation before assistant turn `turn` (0-based among the regenerated turns),
    /// with the turns before it as regenerated so far; tools kept.
    pub fn prompt(&self, turn: usize) -> Result<Conversation, String> {
        let end = self.turns[turn];
        let text = serde_json::to_string(&self.row).map_err(|e| e.to_string())?;
        let full = parse_chat_line(&text, None)?;
        let messages: Vec<TemplateValue> = full
            .messages
            .try_iter()
            .map_err(|e| e.to_string())?
            .take(end)
            .collect();
        Ok(Conversation {
            messages: TemplateValue::from(messages),
            tools: full.tools,
        })
    }

    /// Puts the target's reply into assistant turn `turn`: its content (in the spelling the row
    /// uses, `content` or ShareGPT's `value`), its reasoning as `reasoning_content` (any
    /// earlier one removed), and no `tool_calls`.
    pub fn set_reply(&mut self, turn: usize, reply: Reply) {
        let index = self.turns[turn];
        let message = self
            .row
            .get_mut(self.key)
            .and_then(Value::as_array_mut)
            .and_then(|m| m.get_mut(index))
            .and_then(Value::as_object_mut)
            .expect("parse checked that every message is an object");
        let content_key = if !message.contains_key("content") && message.contains_key("value") {
            "value"
        } else {
            "content"
        };
        message.insert(content_key.into(), Value::String(reply.content));
        message.remove("reasoning_content");
        message.remove("tool_calls");
        if let Some(reasoning) = reply.reasoning {
            message.insert("reasoning_content".into(), Value::String(reasoning));
        }
    }

    /// The output line (no newline): the row with its regenerated turns, cut after a
    /// tool-calling turn, and `source_line` naming the input line it came from.
    pub fn into_line(mut self, source_line: u64) -> String {
        if let Some(messages) = self.row.get_mut(self.key).and_then(Value::as_array_mut) {
            messages.truncate(self.keep);
        }
        self.row
            .insert(SOURCE_LINE_KEY.into(), Value::from(source_line));
        serde_json::to_string(&self.row).expect("a JSON map always serializes")
    }
}

fn is_assistant(message: &Value) -> bool {
    let role = message.get("role").or_else(|| message.get("from"));
    matches!(role.and_then(Value::as_str), Some("assistant" | "gpt"))
}

/// Whether a message carries tool calls the way templates see them: a non-empty list, or a
/// string holding one (data often stores the list as JSON text).
fn calls_tools(message: &Value) -> bool {
    match message.get("tool_calls") {
        None | Some(Value::Null) => false,
        Some(Value::Array(calls)) => !calls.is_empty(),
        Some(Value::String(text)) => !matches!(text.trim(), "" | "[]"),
        Some(_) => true,
    }
}

/// The text the target continues for a prompt: the template rendered with its generation
/// prompt and the template variables training renders with (`enable_thinking`).
pub fn render_prompt(
    template: &ChatTemplate,
    options: &ChatOptions,
    prompt: &Conversation,
) -> Result<String, String> {
    let mut extra = std::collections::BTreeMap::new();
    if let Some(thinking) = options.enable_thinking {
        extra.insert("enable_thinking".to_string(), TemplateValue::from(thinking));
    }
    let args = RenderArgs {
        tools: prompt.tools.clone(),
        add_generation_prompt: true,
        extra,
    };
    template.render(&prompt.messages, &args).map_err(|e| {
        format!(
            "chat template {} failed on the prompt: {e}",
            template.origin().display()
        )
    })
}

/// Splits generated text into reasoning and content, as the Qwen3 reasoning parser of the
/// recipes does: text before `</think>` is the reasoning (a leading `<think>` dropped), the
/// rest the content. When the prompt itself opened the think block and the target never
/// closed it (it ran out of tokens thinking), everything is reasoning. Without a think block
/// the text is all content.
pub fn split_reasoning(prompt: &str, generated: &str) -> Reply {
    let opened = prompt.trim_end().ends_with(THINK_OPEN);
    match generated.split_once(THINK_CLOSE) {
        Some((thought, rest)) => {
            let thought = thought.trim_start();
            let thought = thought.strip_prefix(THINK_OPEN).unwrap_or(thought);
            Reply {
                reasoning: Some(thought.trim_matches('\n').to_string()),
                content: rest.trim_start_matches('\n').to_string(),
            }
        }
        None if opened => Reply {
            reasoning: Some(generated.trim_matches('\n').to_string()),
            content: String::new(),
        },
        None => Reply {
            reasoning: None,
            content: generated.to_string(),
        },
    }
}

/// The seed of one turn's draws: the conversation's seed is `seed + line_index` (0-based input
/// line), so results depend on neither the batch size nor where a run was resumed; turns of
/// one conversation get distinct, decorrelated seeds from it.
pub fn turn_seed(seed: u64, line_index: u64, turn: usize) -> u64 {
    splitmix64(splitmix64(seed.wrapping_add(line_index)) ^ turn as u64)
}

/// SplitMix64's output function: a bijection that spreads nearby inputs far apart.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
#[path = "rows_tests.rs"]
mod tests;
