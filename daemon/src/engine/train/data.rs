//! Pre-tokenized JSONL: one object per line with `input_ids` (token ids) and `loss_mask`
//! (1 on supervised response tokens, 0 elsewhere).
//!
//! A bad line never stops a run and is never dropped silently: it is skipped, counted, and kept
//! in the [`DataReport`] with its 1-based line number and the reason. Blank lines are not data
//! and are ignored.
use std::fmt;
use std::io::BufRead;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::anchors::valid_anchor_positions;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read data file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("data file {path} has no usable sample ({report})")]
    Empty { path: String, report: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub input_ids: Vec<i64>,
    pub loss_mask: Vec<u8>,
    /// 1-based line in the source file.
    pub line: usize,
}

impl Sample {
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadLine {
    pub line: usize,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataReport {
    pub source: String,
    /// Non-blank lines read.
    pub lines: usize,
    pub samples: usize,
    pub truncated: usize,
    pub bad: Vec<BadLine>,
}

impl fmt::Display for DataReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} lines, {} samples",
            self.source, self.lines, self.samples
        )?;
        if self.truncated > 0 {
            write!(f, ", {} truncated", self.truncated)?;
        }
        write!(f, ", {} bad lines skipped", self.bad.len())
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct DataOptions {
    /// Token ids must be in `[0, vocab_size)` when set.
    pub vocab_size: Option<i64>,
    /// Longer samples are truncated to this many tokens.
    pub max_len: Option<usize>,
}

#[derive(Deserialize)]
struct TypedLine {
    input_ids: Vec<i64>,
    loss_mask: Vec<u8>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 40 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(40).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        s
    }
}

fn int_array<'a>(
    obj: &'a serde_json::Map<String, Value>,
    key: &str,
) -> Result<&'a Vec<Value>, String> {
    match obj.get(key) {
        None => Err(format!("missing key `{key}`")),
        Some(Value::Array(a)) => Ok(a),
        Some(other) => Err(format!(
            "`{key}` must be an array, found {}",
            type_name(other)
        )),
    }
}

/// The slow path: explains exactly what is wrong with a line the typed parse rejected.
fn diagnose(line: &str) -> String {
    let value: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => return format!("invalid JSON: {e}"),
    };
    let Value::Object(obj) = &value else {
        return format!(
            "expected a JSON object with `input_ids` and `loss_mask`, found {}",
            type_name(&value)
        );
    };
    for key in ["input_ids", "loss_mask"] {
        let arr = match int_array(obj, key) {
            Ok(a) => a,
            Err(e) => return e,
        };
        for (i, v) in arr.iter().enumerate() {
            let ok = match key {
                "input_ids" => v.as_i64().is_some(),
                _ => matches!(v.as_u64(), Some(0 | 1)),
            };
            if !ok {
                let expected = if key == "input_ids" {
                    "an integer token id"
                } else {
                    "0 or 1"
                };
                return format!("`{key}[{i}]` is {}, expected {expected}", short(v));
            }
        }
    }
    "unreadable sample".to_string()
}

fn validate(
    mut t: TypedLine,
    line: usize,
    opts: &DataOptions,
    truncated: &mut bool,
) -> Result<Sample, String> {
    if t.input_ids.is_empty() {
        return Err("`input_ids` is empty".into());
    }
    if t.input_ids.len() != t.loss_mask.len() {
        return Err(format!(
            "`loss_mask` has {} entries but `input_ids` has {}; they must be the same length",
            t.loss_mask.len(),
            t.input_ids.len()
        ));
    }
    if let Some(i) = t.loss_mask.iter().position(|m| *m > 1) {
        return Err(format!(
            "`loss_mask[{i}]` is {}, expected 0 or 1",
            t.loss_mask[i]
        ));
    }
    if let Some(vocab) = opts.vocab_size {
        if let Some(i) = t.input_ids.iter().position(|id| *id < 0 || *id >= vocab) {
            return Err(format!(
                "`input_ids[{i}]` = {} is outside the vocabulary [0, {vocab})",
                t.input_ids[i]
            ));
        }
    } else if let Some(i) = t.input_ids.iter().position(|id| *id < 0) {
        return Err(format!("`input_ids[{i}]` = {} is negative", t.input_ids[i]));
    }
    if let Some(max) = opts.max_len {
        if t.input_ids.len() > max {
            t.input_ids.truncate(max);
            t.loss_mask.truncate(max);
            *truncated = true;
        }
    }
    if valid_anchor_positions(&t.loss_mask).is_empty() {
        let after = if *truncated { " after truncation" } else { "" };
        return Err(format!(
            "no two consecutive supervised tokens (loss_mask 1){after}: the sample has nothing to train or evaluate"
        ));
    }
    Ok(Sample {
        input_ids: t.input_ids,
        loss_mask: t.loss_mask,
        line,
    })
}

/// Parses JSONL from `reader`. Only an I/O failure is an error; bad lines go into the report.
pub fn parse_jsonl<R: BufRead>(
    reader: R,
    source: &str,
    opts: &DataOptions,
) -> Result<(Vec<Sample>, DataReport), DataError> {
    let mut report = DataReport {
        source: source.to_string(),
        ..Default::default()
    };
    let mut samples = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line_no = i + 1;
        let text = line.map_err(|source_err| DataError::Io {
            path: source.to_string(),
            source: source_err,
        })?;
        if text.trim().is_empty() {
            continue;
        }
        report.lines += 1;
        let parsed = serde_json::from_str::<TypedLine>(&text).map_err(|_| diagnose(&text));
        let mut truncated = false;
        match parsed.and_then(|t| validate(t, line_no, opts, &mut truncated)) {
            Ok(sample) => {
                report.truncated += usize::from(truncated);
                samples.push(sample);
            }
            Err(reason) => report.bad.push(BadLine {
                line: line_no,
                reason,
            }),
        }
    }
    report.samples = samples.len();
    Ok((samples, report))
}

/// Reads a JSONL file; fails only when it cannot be read or holds no usable sample at all.
pub fn load_jsonl(path: &Path, opts: &DataOptions) -> Result<(Vec<Sample>, DataReport), DataError> {
    let source = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| DataError::Io {
        path: source.clone(),
        source: e,
    })?;
    let (samples, report) = parse_jsonl(std::io::BufReader::new(file), &source, opts)?;
    if samples.is_empty() {
        let detail = match report.bad.first() {
            Some(b) => format!("{report}; first bad line {}: {}", b.line, b.reason),
            None => report.to_string(),
        };
        return Err(DataError::Empty {
            path: source,
            report: detail,
        });
    }
    Ok((samples, report))
}

/// SHA-256 over the parsed samples (ids and masks), so a resumed run can tell whether its data
/// changed underneath it, whatever file or format it came from.
pub fn fingerprint(samples: &[Sample]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for s in samples {
        h.update((s.input_ids.len() as u64).to_le_bytes());
        for id in &s.input_ids {
            h.update(id.to_le_bytes());
        }
        h.update(&s.loss_mask);
    }
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, opts: DataOptions) -> (Vec<Sample>, DataReport) {
        parse_jsonl(text.as_bytes(), "mem.jsonl", &opts).unwrap()
    }

    #[test]
    fn good_lines_parse_and_blank_lines_are_ignored() {
        let text = "{\"input_ids\":[1,2,3],\"loss_mask\":[0,1,1],\"id\":\"x\"}\n\n{\"input_ids\":[4,5],\"loss_mask\":[1,1]}\n";
        let (s, r) = parse(text, DataOptions::default());
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].line, s[1].line), (1, 3));
        assert_eq!(s[0].loss_mask, vec![0, 1, 1]);
        assert_eq!((r.lines, r.samples, r.bad.len()), (2, 2, 0));
    }

    #[test]
    fn every_bad_line_is_reported_with_its_line_number_and_reason() {
        let lines = [
            r#"{"input_ids":[1,2,3],"loss_mask":[0,1,1]}"#,
            r#"{"input_ids":[1,2,3],"loss_mask":[0,1]}"#,
            r#"not json"#,
            r#"{"input_ids":[1,"a"],"loss_mask":[1,1]}"#,
            r#"{"loss_mask":[1,1]}"#,
            r#"{"input_ids":[1,2],"loss_mask":[1,2]}"#,
            r#"{"input_ids":[1,999],"loss_mask":[1,1]}"#,
            r#"{"input_ids":[1,2,3],"loss_mask":[1,0,1]}"#,
            r#"[1,2]"#,
            r#"{"input_ids":[],"loss_mask":[]}"#,
            r#"{"input_ids":[1,2,3,4],"loss_mask":[0,0,1,1]}"#,
        ];
        let (s, r) = parse(
            &lines.join("\n"),
            DataOptions {
                vocab_size: Some(100),
                max_len: Some(3),
            },
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].line, 1);
        let got: Vec<(usize, &str)> = r.bad.iter().map(|b| (b.line, b.reason.as_str())).collect();
        let expect: [(usize, &str); 10] = [
            (2, "`loss_mask` has 2 entries but `input_ids` has 3"),
            (3, "invalid JSON"),
            (4, "`input_ids[1]` is \"a\", expected an integer token id"),
            (5, "missing key `input_ids`"),
            (6, "`loss_mask[1]` is 2, expected 0 or 1"),
            (7, "`input_ids[1]` = 999 is outside the vocabulary [0, 100)"),
            (8, "no two consecutive supervised tokens"),
            (9, "expected a JSON object"),
            (10, "`input_ids` is empty"),
            (11, "after truncation"),
        ];
        assert_eq!(got.len(), expect.len(), "{got:?}");
        for ((line, reason), (eline, epart)) in got.iter().zip(expect) {
            assert_eq!(*line, eline);
            assert!(
                reason.contains(epart),
                "line {line}: {reason:?} lacks {epart:?}"
            );
        }
        assert_eq!((r.lines, r.samples), (11, 1));
        assert!(r.to_string().contains("10 bad lines skipped"));
    }

    #[test]
    fn fingerprint_changes_with_any_token_or_mask_bit() {
        let a = vec![Sample {
            input_ids: vec![1, 2],
            loss_mask: vec![1, 1],
            line: 1,
        }];
        let mut b = a.clone();
        b[0].loss_mask[0] = 0;
        let mut c = a.clone();
        c[0].input_ids[1] = 3;
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }

    #[test]
    fn long_samples_are_truncated_and_counted() {
        let (s, r) = parse(
            r#"{"input_ids":[1,2,3,4,5],"loss_mask":[1,1,1,1,1]}"#,
            DataOptions {
                vocab_size: None,
                max_len: Some(4),
            },
        );
        assert_eq!(s[0].len(), 4);
        assert_eq!(r.truncated, 1);
    }

    #[test]
    fn a_file_without_samples_is_an_error_naming_the_first_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        std::fs::write(&path, "{\"input_ids\":[1],\"loss_mask\":[1]}\n").unwrap();
        let err = load_jsonl(&path, &DataOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("d.jsonl") && err.contains("line 1"), "{err}");
        let missing = load_jsonl(&dir.path().join("nope.jsonl"), &DataOptions::default())
            .unwrap_err()
            .to_string();
        assert!(missing.contains("nope.jsonl"), "{missing}");
    }
}
