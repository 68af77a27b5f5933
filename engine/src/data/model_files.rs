//! Reading a model's tokenizer and chat template from disk (the I/O edge of the chat path).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use super::error::DataError;
use super::template::ChatTemplate;

/// The special-token keys of `tokenizer_config.json` that HF hands to every template render.
const TEMPLATE_TOKEN_KEYS: &[&str] = &["bos_token", "eos_token", "unk_token", "pad_token"];

/// Loads `tokenizer.json` with any padding/truncation it carries switched off: truncation is
/// ours to do (after the loss mask is computed) and padding belongs to batching.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, DataError> {
    require_file(path, "tokenizer")?;
    let mut tokenizer = Tokenizer::from_file(path).map_err(|e| DataError::UnreadableTokenizer {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    tokenizer.with_padding(None);
    tokenizer
        .with_truncation(None)
        .map_err(|e| DataError::UnreadableTokenizer {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    Ok(tokenizer)
}

/// The chat template of a model directory: `chat_template.jinja` when present (newer HF
/// exports), else the `chat_template` key of `tokenizer_config.json`. `template_file`
/// overrides the source: a `.json` is read as a tokenizer config, anything else as Jinja.
/// Special tokens come from `tokenizer_config.json` when the directory has one.
pub fn load_chat_template(
    model_dir: &Path,
    template_file: Option<&Path>,
) -> Result<ChatTemplate, DataError> {
    let config_path = model_dir.join("tokenizer_config.json");
    let config = if config_path.is_file() {
        Some(read_json(&config_path, "tokenizer config")?)
    } else {
        None
    };
    let jinja_path = model_dir.join("chat_template.jinja");
    let (source, origin) = match template_file {
        Some(path) if path.extension().is_some_and(|e| e == "json") => {
            let json = read_json(path, "tokenizer config")?;
            (template_from_config(&json, path)?, path.to_path_buf())
        }
        Some(path) => (read_text(path, "chat template")?, path.to_path_buf()),
        None if jinja_path.is_file() => (read_text(&jinja_path, "chat template")?, jinja_path),
        None => match &config {
            Some(json) => (
                template_from_config(json, &config_path)?,
                config_path.clone(),
            ),
            None => {
                return Err(DataError::MissingChatTemplate {
                    model_dir: model_dir.to_path_buf(),
                })
            }
        },
    };
    let tokens = config.as_ref().map(special_tokens).unwrap_or_default();
    Ok(ChatTemplate::compile(source, origin)?.with_special_tokens(tokens))
}

/// `chat_template` is a string, or a list of `{"name", "template"}` of which HF uses "default".
fn template_from_config(json: &serde_json::Value, path: &Path) -> Result<String, DataError> {
    let bad = |reason: String| DataError::BadTemplate {
        path: path.to_path_buf(),
        reason,
    };
    match json.get("chat_template") {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Array(named)) => {
            let default = named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"));
            default
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_string)
                .ok_or_else(|| {
                    bad("`chat_template` is a list without a template named \"default\"".into())
                })
        }
        Some(other) => Err(bad(format!(
            "`chat_template` is {other}; expected a string"
        ))),
        None => Err(DataError::MissingChatTemplate {
            model_dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
        }),
    }
}

/// `"bos_token": "<s>"` or `"bos_token": {"content": "<s>", ...}`; null and absent are skipped.
fn special_tokens(config: &serde_json::Value) -> BTreeMap<String, String> {
    TEMPLATE_TOKEN_KEYS
        .iter()
        .filter_map(|key| {
            let value = config.get(*key)?;
            let text = value
                .as_str()
                .or_else(|| value.get("content").and_then(|c| c.as_str()))?;
            Some((key.to_string(), text.to_string()))
        })
        .collect()
}

fn require_file(path: &Path, what: &'static str) -> Result<(), DataError> {
    if path.is_file() {
        Ok(())
    } else {
        Err(DataError::MissingFile {
            what,
            path: path.to_path_buf(),
        })
    }
}

fn read_text(path: &Path, what: &'static str) -> Result<String, DataError> {
    require_file(path, what)?;
    std::fs::read_to_string(path).map_err(|source| DataError::Io {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn read_json(path: &Path, what: &'static str) -> Result<serde_json::Value, DataError> {
    serde_json::from_str(&read_text(path, what)?).map_err(|e| DataError::BadConfigFile {
        path: PathBuf::from(path),
        reason: format!("not valid JSON ({e})"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_tokens_accept_strings_and_added_token_objects() {
        let config = serde_json::json!({
            "bos_token": null,
            "eos_token": {"content": "<|im_end|>", "lstrip": false},
            "pad_token": "<|endoftext|>",
            "chat_template": "x"
        });
        let tokens = special_tokens(&config);
        assert_eq!(
            tokens.get("eos_token").map(String::as_str),
            Some("<|im_end|>")
        );
        assert_eq!(
            tokens.get("pad_token").map(String::as_str),
            Some("<|endoftext|>")
        );
        assert!(!tokens.contains_key("bos_token"));
    }

    #[test]
    fn named_template_lists_use_default() {
        let p = Path::new("m/tokenizer_config.json");
        let json = serde_json::json!({"chat_template": [
            {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]});
        assert_eq!(template_from_config(&json, p).unwrap(), "D");
        let json = serde_json::json!({"chat_template": [{"name": "tool_use", "template": "T"}]});
        assert!(template_from_config(&json, p)
            .unwrap_err()
            .to_string()
            .contains("\"default\""));
        let err = template_from_config(&serde_json::json!({}), p).unwrap_err();
        assert!(matches!(err, DataError::MissingChatTemplate { .. }));
    }
}
