//! Reading a model's tokenizer, chat template and stop tokens from disk (the I/O edge of the
//! chat path and of generation).
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

/// The file HF `generate` takes its stop tokens from first.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";
/// The model config, where `generate` looks for `eos_token_id` when the generation config
/// has none (older exports carry it only there).
pub const MODEL_CONFIG_FILE: &str = "config.json";

/// The tokens generation stops after, and where they came from (reports say which).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopTokens {
    pub ids: Vec<i64>,
    pub source: StopTokenSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopTokenSource {
    /// `eos_token_id` of this file: the model's `generation_config.json`, or its `config.json`
    /// when the generation config is absent or names none.
    File(PathBuf),
    /// Neither file of this model directory names an `eos_token_id` (absent, null, or no such
    /// file): generation runs to its length limit.
    NotNamed(PathBuf),
}

impl StopTokens {
    /// One line for a report, e.g. `[2, 7] from m/generation_config.json (eos_token_id)`.
    pub fn describe(&self) -> String {
        match &self.source {
            StopTokenSource::File(path) => {
                format!("{:?} from {} (eos_token_id)", self.ids, path.display())
            }
            StopTokenSource::NotNamed(dir) => format!(
                "none: {} names no eos_token_id ({GENERATION_CONFIG_FILE}, {MODEL_CONFIG_FILE}); \
                 generation runs to max_new_tokens",
                dir.display()
            ),
        }
    }
}

/// The stop tokens of a model directory, as transformers' `generate` reads them: `eos_token_id`
/// (an id or a list of ids) of its `generation_config.json`, else of its `config.json`. The
/// one reader of this rule: `eval --online`, `regenerate` and the in-training online
/// evaluation all stop where the target's own `generate` would. No file or no key gives none,
/// said in [`StopTokens::source`]; a file that is not JSON or a key of another shape is an
/// error naming the file.
pub fn load_stop_tokens(model_dir: &Path) -> Result<StopTokens, DataError> {
    for name in [GENERATION_CONFIG_FILE, MODEL_CONFIG_FILE] {
        let path = model_dir.join(name);
        if !path.is_file() {
            continue;
        }
        let what = if name == GENERATION_CONFIG_FILE {
            "generation config"
        } else {
            "model config"
        };
        let json = read_json(&path, what)?;
        match eos_token_ids(&json) {
            Ok(Some(ids)) => {
                return Ok(StopTokens {
                    ids,
                    source: StopTokenSource::File(path),
                })
            }
            Ok(None) => continue,
            Err(reason) => return Err(DataError::BadConfigFile { path, reason }),
        }
    }
    Ok(StopTokens {
        ids: Vec::new(),
        source: StopTokenSource::NotNamed(model_dir.to_path_buf()),
    })
}

/// `eos_token_id`: absent or null → `None`; an id or a list of ids (duplicates dropped, order
/// kept) → `Some`; anything else → why not.
fn eos_token_ids(json: &serde_json::Value) -> Result<Option<Vec<i64>>, String> {
    let id = |v: &serde_json::Value| {
        v.as_i64().filter(|&i| i >= 0).ok_or_else(|| {
            format!("`eos_token_id` holds {v}; expected a non-negative token id or a list of them")
        })
    };
    match json.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(items)) => {
            let mut ids = Vec::with_capacity(items.len());
            for item in items {
                let i = id(item)?;
                if !ids.contains(&i) {
                    ids.push(i);
                }
            }
            Ok(Some(ids))
        }
        Some(single) => Ok(Some(vec![id(single)?])),
    }
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
        cause: source,
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
    #[test]
    fn eos_token_id_is_an_id_or_a_list_and_absent_means_none() {
        let ids = |j: serde_json::Value| eos_token_ids(&j);
        assert_eq!(
            ids(serde_json::json!({"eos_token_id": 7})),
            Ok(Some(vec![7]))
        );
        assert_eq!(
            ids(serde_json::json!({"eos_token_id": [151645, 151643, 151645]})),
            Ok(Some(vec![151645, 151643]))
        );
        assert_eq!(ids(serde_json::json!({"eos_token_id": null})), Ok(None));
        assert_eq!(ids(serde_json::json!({"use_cache": true})), Ok(None));
        for bad in [
            serde_json::json!({"eos_token_id": "</s>"}),
            serde_json::json!({"eos_token_id": -1}),
            serde_json::json!({"eos_token_id": [1, 2.5]}),
        ] {
            let err = ids(bad).unwrap_err();
            assert!(err.contains("expected a non-negative token id"), "{err}");
        }
    }

    #[test]
    fn stop_tokens_say_where_they_come_from() {
        let dir = tempfile::tempdir().unwrap();
        let none = load_stop_tokens(dir.path()).unwrap();
        assert!(none.ids.is_empty());
        assert_eq!(
            none.source,
            StopTokenSource::NotNamed(dir.path().to_path_buf())
        );
        assert!(
            none.describe().contains("no eos_token_id"),
            "{}",
            none.describe()
        );

        let file = dir.path().join(GENERATION_CONFIG_FILE);
        std::fs::write(&file, r#"{"use_cache": true}"#).unwrap();
        let no_key = load_stop_tokens(dir.path()).unwrap();
        assert!(no_key.ids.is_empty());
        assert!(no_key.describe().contains("no eos_token_id"));

        std::fs::write(&file, r#"{"eos_token_id": [3, 4]}"#).unwrap();
        let found = load_stop_tokens(dir.path()).unwrap();
        assert_eq!(found.ids, vec![3, 4]);
        assert_eq!(found.source, StopTokenSource::File(file.clone()));

        std::fs::write(&file, "{not json").unwrap();
        let err = load_stop_tokens(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("generation_config.json") && err.contains("not valid JSON"),
            "{err}"
        );
    }

    #[test]
    fn an_eos_token_only_in_config_json_stops_generation() {
        // Older exports name `eos_token_id` in `config.json` alone; `generate` stops there.
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join(MODEL_CONFIG_FILE);
        std::fs::write(&config, r#"{"eos_token_id": 7, "vocab_size": 10}"#).unwrap();
        let only_config = load_stop_tokens(dir.path()).unwrap();
        assert_eq!(only_config.ids, vec![7]);
        assert_eq!(only_config.source, StopTokenSource::File(config.clone()));
        assert!(only_config.describe().contains("config.json"));

        // A generation config without the key defers to config.json too ...
        let generation = dir.path().join(GENERATION_CONFIG_FILE);
        std::fs::write(&generation, r#"{"eos_token_id": null}"#).unwrap();
        assert_eq!(load_stop_tokens(dir.path()).unwrap(), only_config);
        // ... and one that names tokens wins.
        std::fs::write(&generation, r#"{"eos_token_id": [248044, 248046]}"#).unwrap();
        let generation_first = load_stop_tokens(dir.path()).unwrap();
        assert_eq!(generation_first.ids, vec![248044, 248046]);
        assert_eq!(generation_first.source, StopTokenSource::File(generation));

        // A bad key in the fallback is an error naming that file.
        std::fs::remove_file(dir.path().join(GENERATION_CONFIG_FILE)).unwrap();
        std::fs::write(&config, r#"{"eos_token_id": [1, -1]}"#).unwrap();
        let err = load_stop_tokens(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("config.json") && err.contains("expected a non-negative token id"),
            "{err}"
        );
    }
}
