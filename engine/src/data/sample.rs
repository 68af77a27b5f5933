//! What a data file turns into: training samples, plus an account of every line that did not.
use std::path::PathBuf;

/// One training row: token ids and the per-token supervision mask (spec §2.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub input_ids: Vec<i64>,
    /// 1 on supervised (assistant-response) tokens, 0 elsewhere; same length as `input_ids`.
    pub loss_mask: Vec<u8>,
}

impl Sample {
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// Tokens with `loss_mask == 1`.
    pub fn supervised_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m == 1).count()
    }
}

/// A line that could not be turned into a sample, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    pub file: PathBuf,
    /// 1-based, as an editor shows it.
    pub line: u64,
    pub reason: String,
}

impl std::fmt::Display for BadLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.reason)
    }
}

/// Where every line of a data file went. Every non-blank line lands in exactly one of
/// `samples`, `bad_lines` or `skipped_too_short`, so nothing is dropped without a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Lines read, blank ones included.
    pub lines: u64,
    /// Blank (whitespace-only) lines, e.g. a trailing newline.
    pub blank_lines: u64,
    /// Lines that became a sample.
    pub samples: u64,
    /// Lines that were malformed, with their line numbers and reasons.
    pub bad_lines: Vec<BadLine>,
    /// Well-formed lines without two consecutive supervised tokens (after truncation), which
    /// give DFlash no anchor to train on (SF `has_consecutive_supervised_tokens`).
    pub skipped_too_short: Vec<u64>,
    /// Samples cut to `max_length` (they are still among `samples`).
    pub truncated: u64,
}

impl LoadReport {
    /// The accounting as JSON (`dflashd eval --json` and the run's `data_report.json`).
    pub fn to_json(&self, source: &str) -> serde_json::Value {
        serde_json::json!({
            "source": source,
            "lines": self.lines,
            "blank_lines": self.blank_lines,
            "samples": self.samples,
            "truncated": self.truncated,
            "bad_lines": self.bad_lines.iter().map(|b| serde_json::json!({"line": b.line, "reason": b.reason})).collect::<Vec<_>>(),
            "skipped_too_short": self.skipped_too_short,
        })
    }

    /// True when every line is accounted for; `load` guarantees it, tests check it.
    pub fn is_balanced(&self) -> bool {
        self.lines
            == self.blank_lines
                + self.samples
                + self.bad_lines.len() as u64
                + self.skipped_too_short.len() as u64
    }
}

/// SF requires ≥2 consecutive supervised tokens: anchors are positions `p` with
/// `mask[p] == mask[p+1] == 1` (spec §2.2), so a row without such a pair trains nothing.
pub fn has_consecutive_supervised(loss_mask: &[u8]) -> bool {
    loss_mask.windows(2).any(|w| w[0] == 1 && w[1] == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_supervised_needs_an_adjacent_pair() {
        assert!(!has_consecutive_supervised(&[]));
        assert!(!has_consecutive_supervised(&[1]));
        assert!(!has_consecutive_supervised(&[1, 0, 1, 0, 1]));
        assert!(has_consecutive_supervised(&[0, 1, 1, 0]));
    }

    #[test]
    fn report_balance_counts_every_category() {
        let mut r = LoadReport {
            lines: 5,
            blank_lines: 1,
            samples: 2,
            ..Default::default()
        };
        assert!(!r.is_balanced());
        r.skipped_too_short.push(3);
        r.bad_lines.push(BadLine {
            file: "x.jsonl".into(),
            line: 4,
            reason: "bad".into(),
        });
        assert!(r.is_balanced());
        assert_eq!(r.bad_lines[0].to_string(), "x.jsonl:4: bad");
    }
}
