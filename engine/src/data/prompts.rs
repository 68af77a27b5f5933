//! Prompt files for generation (`dflashd eval --online`): JSONL, one prompt a line, either
//! token ids or a chat row.
//!
//! - `{"input_ids": [...]}`: the prompt as it stands. A pre-tokenized training row (with a
//!   `loss_mask`) gives the tokens before its last supervised span, the answer it trains on,
//!   as a chat row gives the turns before its closing answer.
//! - `{"conversations": [...]}` (or `messages`): the row without its closing assistant answer,
//!   rendered with the chat template and the generation prompt
//!   ([`ChatEncoder::encode_prompt_line`]).
//!
//! A bad line is an error naming `file:line`, never skipped: a prompt set is a measurement and
//! a silently smaller one would measure something else.
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::encoder::ChatEncoder;
use super::error::DataError;
use super::sample::BadLine;

/// How many bad lines an error lists before it only counts the rest.
const LISTED_BAD_LINES: usize = 5;

/// One prompt line, parsed but not yet tokenized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptRow {
    Tokens(Vec<i64>),
    /// The raw line, rendered and tokenized by [`ChatEncoder::encode_prompt_line`].
    Chat(String),
}

/// A prompt ready to decode, with the line it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// 1-based, as an editor shows it.
    pub line: u64,
    pub input_ids: Vec<i64>,
}

/// Parses one non-blank line. `Err` is why the line is bad.
pub fn parse_prompt_row(line: &str) -> Result<PromptRow, String> {
    let shape = "expected {\"input_ids\": [int, ...]} or {\"conversations\": [{\"role\", \"content\"}, ...]}";
    let value: Value = serde_json::from_str(line.trim_start_matches('\u{feff}'))
        .map_err(|e| format!("not JSON ({e}); {shape}"))?;
    let Some(object) = value.as_object() else {
        return Err(format!("not a JSON object; {shape}"));
    };
    match (object.get("input_ids"), object.get("conversations").or(object.get("messages"))) {
        (Some(_), Some(_)) => Err(
            "has both `input_ids` and `conversations`; give one, so it is clear which is the prompt"
                .to_string(),
        ),
        (Some(ids), None) => token_prompt(ids, object.get("loss_mask")).map(PromptRow::Tokens),
        (None, Some(_)) => Ok(PromptRow::Chat(line.to_string())),
        (None, None) => Err(format!("has neither `input_ids` nor `conversations`; {shape}")),
    }
}

fn token_prompt(ids: &Value, loss_mask: Option<&Value>) -> Result<Vec<i64>, String> {
    let ints = |v: &Value, key: &str| -> Result<Vec<i64>, String> {
        let items = v
            .as_array()
            .ok_or_else(|| format!("`{key}` is {v}; expected a list of integers"))?;
        items
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_i64()
                    .ok_or_else(|| format!("{key}[{i}] is {x}; expected an integer"))
            })
            .collect()
    };
    let mut ids = ints(ids, "input_ids")?;
    if let Some(mask) = loss_mask {
        let mask = ints(mask, "loss_mask")?;
        if mask.len() != ids.len() {
            return Err(format!(
                "input_ids has {} tokens but loss_mask has {}; they must be the same length",
                ids.len(),
                mask.len()
            ));
        }
        ids.truncate(last_supervised_span_start(&mask));
    }
    if ids.is_empty() {
        return Err(match loss_mask {
            Some(_) => "no token before the supervised answer: the prompt would be empty".into(),
            None => "input_ids is empty".into(),
        });
    }
    Ok(ids)
}

/// Where the last run of non-zero mask values starts (the length when there is none).
fn last_supervised_span_start(mask: &[i64]) -> usize {
    let Some(last) = mask.iter().rposition(|&m| m != 0) else {
        return mask.len();
    };
    mask[..last]
        .iter()
        .rposition(|&m| m == 0)
        .map_or(0, |zero| zero + 1)
}

/// The parsed lines of a prompt file and the lines that did not parse; [`tokenize_prompts`]
/// refuses the file with all of its bad lines together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptRows {
    /// `(line, row)`, in file order.
    pub rows: Vec<(u64, PromptRow)>,
    pub bad: Vec<BadLine>,
}

/// Every non-blank line of `path`, parsed. A file without any non-blank line is an error.
pub fn read_prompt_rows(path: &Path) -> Result<PromptRows, DataError> {
    if !path.is_file() {
        return Err(DataError::MissingFile {
            what: "prompt file",
            path: path.to_path_buf(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|source| DataError::Io {
        what: "prompt file",
        path: path.to_path_buf(),
        cause: source,
    })?;
    let (mut rows, mut bad) = (Vec::new(), Vec::new());
    for (index, line) in text.lines().enumerate() {
        let number = index as u64 + 1;
        if line.trim().is_empty() {
            continue;
        }
        match parse_prompt_row(line) {
            Ok(row) => rows.push((number, row)),
            Err(reason) => bad.push(bad_line(path, number, reason)),
        }
    }
    if rows.is_empty() && bad.is_empty() {
        return Err(DataError::NoPrompts {
            path: path.to_path_buf(),
        });
    }
    Ok(PromptRows { rows, bad })
}

/// Token ids of every row: chat rows through `encoder` (required when there is one), ids
/// checked against `vocab_size`. Any bad line, from reading or from here, refuses the file:
/// all of them in one error, in line order.
pub fn tokenize_prompts(
    path: &Path,
    rows: PromptRows,
    encoder: Option<&ChatEncoder>,
    vocab_size: i64,
) -> Result<Vec<Prompt>, DataError> {
    let PromptRows { rows, mut bad } = rows;
    let mut prompts = Vec::with_capacity(rows.len());
    for (line, row) in rows {
        let ids = match row {
            PromptRow::Tokens(ids) => Ok(ids),
            PromptRow::Chat(text) => match encoder {
                Some(e) => e.encode_prompt_line(&text),
                None => Err("a chat row, and no chat encoder was given to render it".into()),
            },
        };
        match ids.and_then(|ids| in_vocab(ids, vocab_size)) {
            Ok(input_ids) if input_ids.is_empty() => bad.push(bad_line(
                path,
                line,
                "renders to no token; the prompt is empty".into(),
            )),
            Ok(input_ids) => prompts.push(Prompt { line, input_ids }),
            Err(reason) => bad.push(bad_line(path, line, reason)),
        }
    }
    bad.sort_by_key(|b| b.line);
    check(path, bad)?;
    Ok(prompts)
}

fn in_vocab(ids: Vec<i64>, vocab_size: i64) -> Result<Vec<i64>, String> {
    match ids
        .iter()
        .enumerate()
        .find(|(_, &t)| t < 0 || t >= vocab_size)
    {
        Some((i, t)) => Err(format!(
            "token {i} of the prompt is {t}; expected 0..{vocab_size} (the target's vocab_size)"
        )),
        None => Ok(ids),
    }
}

fn bad_line(path: &Path, line: u64, reason: String) -> BadLine {
    BadLine {
        file: PathBuf::from(path),
        line,
        reason,
    }
}

fn check(path: &Path, bad: Vec<BadLine>) -> Result<(), DataError> {
    if bad.is_empty() {
        return Ok(());
    }
    let mut listed: Vec<String> = bad
        .iter()
        .take(LISTED_BAD_LINES)
        .map(ToString::to_string)
        .collect();
    if bad.len() > LISTED_BAD_LINES {
        listed.push(format!("and {} more", bad.len() - LISTED_BAD_LINES));
    }
    Err(DataError::BadPrompts {
        path: path.to_path_buf(),
        count: bad.len(),
        lines: listed.join("; "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_rows_and_chat_rows_are_told_apart() {
        assert_eq!(
            parse_prompt_row(r#"{"input_ids": [3, 1, 4]}"#),
            Ok(PromptRow::Tokens(vec![3, 1, 4]))
        );
        let chat = r#"{"conversations": [{"role": "user", "content": "hi"}]}"#;
        assert_eq!(parse_prompt_row(chat), Ok(PromptRow::Chat(chat.into())));
        let messages = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        assert!(matches!(parse_prompt_row(messages), Ok(PromptRow::Chat(_))));
    }

    #[test]
    fn a_training_row_gives_the_tokens_before_its_last_answer() {
        let row = r#"{"input_ids": [1, 2, 3, 4, 5, 6, 7], "loss_mask": [0, 1, 1, 0, 0, 1, 1]}"#;
        assert_eq!(
            parse_prompt_row(row),
            Ok(PromptRow::Tokens(vec![1, 2, 3, 4, 5]))
        );
        let unsupervised = r#"{"input_ids": [1, 2], "loss_mask": [0, 0]}"#;
        assert_eq!(
            parse_prompt_row(unsupervised),
            Ok(PromptRow::Tokens(vec![1, 2]))
        );
        let all_answer = r#"{"input_ids": [1, 2], "loss_mask": [1, 1]}"#;
        assert!(parse_prompt_row(all_answer)
            .unwrap_err()
            .contains("no token before the supervised answer"));
        assert_eq!(last_supervised_span_start(&[1, 1, 0, 1]), 3);
        assert_eq!(last_supervised_span_start(&[]), 0);
    }

    #[test]
    fn bad_rows_say_what_is_expected() {
        for (line, says) in [
            ("{not json", "not JSON"),
            ("[1, 2]", "not a JSON object"),
            (
                r#"{"text": "hi"}"#,
                "neither `input_ids` nor `conversations`",
            ),
            (r#"{"input_ids": []}"#, "input_ids is empty"),
            (r#"{"input_ids": [1, "a"]}"#, "input_ids[1] is \"a\""),
            (r#"{"input_ids": 5}"#, "expected a list of integers"),
            (
                r#"{"input_ids": [1, 2], "loss_mask": [0]}"#,
                "the same length",
            ),
            (
                r#"{"input_ids": [1], "conversations": []}"#,
                "both `input_ids` and `conversations`",
            ),
        ] {
            let err = parse_prompt_row(line).unwrap_err();
            assert!(err.contains(says), "{line}: {err}");
        }
    }

    #[test]
    fn a_file_with_bad_lines_is_refused_naming_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.jsonl");
        let mut lines = vec![r#"{"input_ids": [1]}"#.to_string(), String::new()];
        lines.extend((0..7).map(|_| "oops".to_string()));
        std::fs::write(&path, lines.join("\n")).unwrap();
        let rows = read_prompt_rows(&path).unwrap();
        assert_eq!(rows.rows.len(), 1);
        let err = tokenize_prompts(&path, rows, None, 10)
            .unwrap_err()
            .to_string();
        assert!(err.contains("7 bad prompt lines"), "{err}");
        assert!(err.contains("p.jsonl:3: not JSON"), "{err}");
        assert!(
            err.contains("p.jsonl:7:") && !err.contains("p.jsonl:8:"),
            "{err}"
        );
        assert!(err.contains("and 2 more"), "{err}");

        std::fs::write(&path, "\n  \n").unwrap();
        let err = read_prompt_rows(&path).unwrap_err().to_string();
        assert!(err.contains("no prompt"), "{err}");
        let err = read_prompt_rows(&dir.path().join("absent.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("absent.jsonl") && err.contains("does not exist"),
            "{err}"
        );
    }

    #[test]
    fn tokenizing_checks_the_vocabulary_and_needs_an_encoder_for_chat() {
        let path = Path::new("p.jsonl");
        let rows = PromptRows {
            rows: vec![
                (1, PromptRow::Tokens(vec![1, 2])),
                (4, PromptRow::Tokens(vec![1, 99])),
                (6, PromptRow::Chat(r#"{"conversations": []}"#.into())),
            ],
            bad: vec![bad_line(path, 5, "not JSON".into())],
        };
        let err = tokenize_prompts(path, rows, None, 50)
            .unwrap_err()
            .to_string();
        assert!(err.contains("3 bad prompt lines"), "{err}");
        // every bad line in line order, from reading and from tokenizing alike
        let at = |s: &str| err.find(s).unwrap_or_else(|| panic!("{s} not in {err}"));
        assert!(
            at("p.jsonl:4: token 1 of the prompt is 99; expected 0..50")
                < at("p.jsonl:5: not JSON")
        );
        assert!(at("p.jsonl:5:") < at("p.jsonl:6: a chat row"));
        let one = PromptRows {
            rows: vec![(2, PromptRow::Tokens(vec![7]))],
            bad: vec![],
        };
        let ok = tokenize_prompts(path, one, None, 50).unwrap();
        assert_eq!(
            ok,
            vec![Prompt {
                line: 2,
                input_ids: vec![7]
            }]
        );
    }
}
