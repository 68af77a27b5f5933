//! The embedded dataset as chat rows: each pre-tokenized conversation of the tiny language
//! written back as `{"conversations": [{"role", "content"}, ...]}` in the tiny target's own
//! words, so the chat paths (`dflashd regenerate`, `data.format = "chat"`) run on the embedded
//! default. The tiny target's chat template and tokenizer (`assets/tiny/make_tiny_tokenizer.py`)
//! turn such a row back into the same ids and loss mask; `tests/engine/embedded_chat.rs` holds
//! every line of the dataset to that.
use serde_json::{json, Value};
use tokenizers::Tokenizer;

/// The tiny language's structural tokens (`assets/tiny/make_tiny_dataset.py`).
const BOS: i64 = 1;
const END_OF_TURN: i64 = 2;
const USER_HEADER: i64 = 3;
const ASSISTANT_HEADER: i64 = 4;

/// The chat row of one conversation of the tiny language (BOS, then turns of a header, words
/// and the end-of-turn token). A trailing assistant header with nothing after it is a
/// generation prompt: it is left out, as the template's `add_generation_prompt` renders it.
/// `Err` names the position that breaks the layout.
pub fn tiny_chat_line(ids: &[i64], tokenizer: &Tokenizer) -> Result<String, String> {
    if ids.first() != Some(&BOS) {
        return Err("a conversation starts with BOS (id 1)".into());
    }
    let mut turns = Vec::new();
    let mut at = 1;
    while at < ids.len() {
        let role = match ids[at] {
            USER_HEADER => "user",
            ASSISTANT_HEADER if at + 1 == ids.len() => break,
            ASSISTANT_HEADER => "assistant",
            other => return Err(format!("position {at}: id {other} where a turn header is")),
        };
        let start = at + 1;
        let len = ids[start..]
            .iter()
            .position(|&t| t == END_OF_TURN)
            .ok_or_else(|| format!("position {at}: a {role} turn without its end-of-turn"))?;
        let words = ids[start..start + len]
            .iter()
            .map(|&t| u32::try_from(t).map_err(|_| format!("id {t} is not a token")))
            .collect::<Result<Vec<u32>, String>>()?;
        let content = tokenizer
            .decode(&words, false)
            .map_err(|e| format!("position {start}: {e}"))?;
        turns.push(json!({ "role": role, "content": content }));
        at = start + len + 1;
    }
    Ok(json!({ "conversations": Value::Array(turns) }).to_string())
}
