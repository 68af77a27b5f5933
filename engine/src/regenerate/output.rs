//! Resuming `dflashd regenerate` from its own output: the scan of what an earlier run wrote,
//! and the record of the settings that change results (the `<out>.regenerate.json` sidecar),
//! compared before any line is added.
use std::io::BufRead;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::rows::SOURCE_LINE_KEY;
use crate::data::parse_chat_line;

/// What an earlier run left in the output file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputScan {
    /// Complete rows (newline-terminated lines, every one a valid chat row).
    pub rows: u64,
    /// `source_line` of the last complete row: the run resumes after this input line.
    pub last_source_line: Option<u64>,
    /// Bytes of the complete rows; the file is cut back to this.
    pub kept_bytes: u64,
    /// Bytes after the last newline: a row an interrupted run did not finish writing.
    pub torn_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error(
        "line {line} {reason}; regenerate writes only whole chat rows, so the file was changed \
         by something else. Move it away (or choose another --out) and run again"
    )]
    Damaged { line: u64, reason: String },
    #[error("cannot read it: {0}")]
    Io(std::io::Error),
}

/// By hand rather than `#[from]`, which would also make the I/O error the `source()` of a
/// message that already prints it.
impl From<std::io::Error> for ScanError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// Reads an output file. Every complete line must be a chat row training accepts, with a
/// `source_line` above the one before it (rows are written in input order); an unterminated
/// tail is a torn write, to be cut away (its input line is regenerated).
pub fn scan_output(mut reader: impl BufRead) -> Result<OutputScan, ScanError> {
    let mut scan = OutputScan::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line)?;
        if read == 0 {
            return Ok(scan);
        }
        if line.last() != Some(&b'\n') {
            scan.torn_bytes = read as u64;
            return Ok(scan);
        }
        let number = scan.rows + 1;
        let damaged = |reason: String| ScanError::Damaged {
            line: number,
            reason,
        };
        let text =
            std::str::from_utf8(&line[..read - 1]).map_err(|_| damaged("is not UTF-8".into()))?;
        let source = source_line(text).map_err(damaged)?;
        if let Some(last) = scan.last_source_line.filter(|&last| source <= last) {
            return Err(damaged(format!(
                "comes from input line {source}, not after the line before it ({last})"
            )));
        }
        parse_chat_line(text, None).map_err(|e| damaged(format!("is not a chat row: {e}")))?;
        scan.rows += 1;
        scan.last_source_line = Some(source);
        scan.kept_bytes += read as u64;
    }
}

fn source_line(text: &str) -> Result<u64, String> {
    let row: Value = serde_json::from_str(text).map_err(|e| format!("is not JSON ({e})"))?;
    row.get(SOURCE_LINE_KEY)
        .and_then(Value::as_u64)
        .filter(|&n| n >= 1)
        .ok_or_else(|| format!("has no `{SOURCE_LINE_KEY}` (a line number ≥ 1)"))
}

/// Version of the sidecar's layout.
pub const RECORD_FORMAT: u32 = 1;

/// Everything that changes what a run writes; a resume must match it field for field. The
/// batch size and thread counts are not here: they do not change results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegenerateRecord {
    pub format: u32,
    /// The target directory, absolute.
    pub target: String,
    /// SHA-256 over the target's `config.json`, `tokenizer.json` and its weight files' names
    /// and sizes (the weights are not read: they can be tens of GB). On disk under its first
    /// name.
    #[serde(rename = "target_fingerprint")]
    pub target_digest: String,
    /// The input file, absolute.
    pub data: String,
    /// The file the chat template came from and the SHA-256 of its text.
    pub chat_template: String,
    pub chat_template_sha256: String,
    pub enable_thinking: Option<bool>,
    pub max_new_tokens: usize,
    /// 0 is greedy.
    pub temperature: f64,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub seed: u64,
    pub stop_tokens: Vec<i64>,
    pub device: String,
    pub dtype: String,
}

/// How `recorded` (a sidecar's JSON) differs from `current`, one `key: recorded → now` per
/// field; empty when a resume may go on.
pub fn differences(recorded: &Value, current: &RegenerateRecord) -> Vec<String> {
    let current = serde_json::to_value(current).expect("a record always serializes");
    let (Some(old), Some(new)) = (recorded.as_object(), current.as_object()) else {
        return vec![format!("the record is not a JSON object: {recorded}")];
    };
    let shown =
        |v: Option<&Value>| v.map_or_else(|| "(not recorded)".to_string(), Value::to_string);
    let mut keys: Vec<&String> = new.keys().chain(old.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| format!("{k}: {} → {}", shown(old.get(k)), shown(new.get(k))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(source: u64) -> String {
        format!(
            r#"{{"conversations":[{{"role":"user","content":"q"}},{{"role":"assistant","content":"a"}}],"source_line":{source}}}"#
        )
    }

    #[test]
    fn complete_rows_are_kept_and_a_torn_tail_is_measured() {
        let whole = format!("{}\n{}\n", row(1), row(4));
        let scan = scan_output(whole.as_bytes()).unwrap();
        assert_eq!(
            scan,
            OutputScan {
                rows: 2,
                last_source_line: Some(4),
                kept_bytes: whole.len() as u64,
                torn_bytes: 0,
            }
        );
        let torn = format!("{whole}{}", &row(5)[..20]);
        let scan = scan_output(torn.as_bytes()).unwrap();
        assert_eq!(
            (scan.rows, scan.kept_bytes, scan.torn_bytes),
            (2, whole.len() as u64, 20)
        );
        // even a tail that happens to be a whole row lacks its newline, so it was not finished
        let unterminated = format!("{}\n{}", row(1), row(2));
        let scan = scan_output(unterminated.as_bytes()).unwrap();
        assert_eq!((scan.rows, scan.last_source_line), (1, Some(1)));
        assert_eq!(scan_output(&b""[..]).unwrap(), OutputScan::default());
    }

    #[test]
    fn damaged_complete_lines_are_refused_with_their_number() {
        let cases = [
            (format!("{}\nnot json\n", row(1)), 2, "is not JSON"),
            (
                format!("{}\n{}\n", row(3), row(2)),
                2,
                "not after the line before it",
            ),
            (
                "{\"conversations\":[]}\n".to_string(),
                1,
                "has no `source_line`",
            ),
            (
                "{\"conversations\":[],\"source_line\":1}\n".to_string(),
                1,
                "is not a chat row",
            ),
            (format!("{}\n\n", row(1)), 2, "is not JSON"),
        ];
        for (text, line, reason) in cases {
            let err = scan_output(text.as_bytes()).unwrap_err();
            let ScanError::Damaged { line: at, .. } = &err else {
                panic!("{err}")
            };
            assert_eq!(*at, line, "{text}");
            let message = err.to_string();
            assert!(
                message.contains(reason) && message.contains("Move it away"),
                "{message}"
            );
        }
    }

    fn record() -> RegenerateRecord {
        RegenerateRecord {
            format: RECORD_FORMAT,
            target: "/m".into(),
            target_digest: "ab".into(),
            data: "/d.jsonl".into(),
            chat_template: "/m/tokenizer_config.json".into(),
            chat_template_sha256: "cd".into(),
            enable_thinking: Some(true),
            max_new_tokens: 64,
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
            stop_tokens: vec![2],
            device: "cpu".into(),
            dtype: "f32".into(),
        }
    }

    #[test]
    fn a_record_matches_itself_and_names_each_changed_field() {
        let recorded = serde_json::to_value(record()).unwrap();
        assert!(differences(&recorded, &record()).is_empty());
        let mut now = record();
        now.seed = 3;
        now.temperature = 0.7;
        assert_eq!(
            differences(&recorded, &now),
            ["seed: 0 → 3", "temperature: 0.0 → 0.7"]
        );
        let mut old = recorded.clone();
        old.as_object_mut().unwrap().remove("top_p");
        old.as_object_mut()
            .unwrap()
            .insert("extra".into(), 1.into());
        assert_eq!(
            differences(&old, &record()),
            ["extra: 1 → (not recorded)", "top_p: (not recorded) → null"]
        );
        assert_eq!(differences(&Value::from(1), &record()).len(), 1);
    }

    #[test]
    fn the_target_digest_keeps_its_recorded_key() {
        let recorded = serde_json::to_value(record()).unwrap();
        assert_eq!(recorded["target_fingerprint"], "ab");
        assert!(recorded.get("target_digest").is_none());
    }
}
