//! Which tokens are supervised: the assistant spans of the rendered conversation (spec §3,
//! SF `GeneralParser`/`ThinkingParser`), found in the text and mapped to tokens by offsets.
use std::ops::Range;

use super::error::DataError;

/// The markers of an assistant turn in the rendered text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanRule {
    /// Text that opens an assistant turn; supervision starts right after it.
    pub assistant_header: String,
    /// Skipped (left unsupervised) when it directly follows the header; the serving-time
    /// generation prompt supplies it, so the model never predicts it.
    pub think_opener: Option<String>,
    /// Closes the turn; supervised, inclusive. A turn without one runs to the end of the text.
    pub end_of_turn: String,
    /// Text whose tokens are never supervised even inside a span (SF `ignore_token`).
    pub ignore: Vec<String>,
}

/// Names accepted by [`SpanRule::by_name`].
pub const SPAN_RULE_NAMES: &[&str] = &["qwen3.5", "qwen3.5-every-turn", "qwen", "qwen3-instruct"];

impl SpanRule {
    /// SF `qwen3.5`: header `<|im_start|>assistant\n<think>\n`, end `<|im_end|>\n`. As in SF,
    /// an assistant turn rendered without a think block (the Qwen3.5/3.6 templates drop it from
    /// turns before the last user message) does not match and stays unsupervised.
    pub fn qwen3_5() -> Self {
        SpanRule {
            assistant_header: "<|im_start|>assistant\n<think>\n".into(),
            think_opener: None,
            end_of_turn: "<|im_end|>\n".into(),
            ignore: Vec::new(),
        }
    }

    /// Like [`qwen3_5`](Self::qwen3_5), but every assistant turn is supervised; a `<think>\n`
    /// right after the header is skipped where present.
    pub fn qwen3_5_every_turn() -> Self {
        SpanRule {
            assistant_header: "<|im_start|>assistant\n".into(),
            think_opener: Some("<think>\n".into()),
            ..Self::qwen3_5()
        }
    }

    /// SF `qwen` (also its `qwen3-thinking`): header `<|im_start|>assistant\n`.
    pub fn qwen() -> Self {
        SpanRule {
            assistant_header: "<|im_start|>assistant\n".into(),
            ..Self::qwen3_5()
        }
    }

    /// SF `qwen3-instruct`: like `qwen`, but the empty think block is never supervised.
    pub fn qwen3_instruct() -> Self {
        SpanRule {
            ignore: vec!["<think>\n\n</think>\n\n".into()],
            ..Self::qwen()
        }
    }

    pub fn by_name(name: &str) -> Result<Self, DataError> {
        match name {
            "qwen3.5" => Ok(Self::qwen3_5()),
            "qwen3.5-every-turn" => Ok(Self::qwen3_5_every_turn()),
            "qwen" => Ok(Self::qwen()),
            "qwen3-instruct" => Ok(Self::qwen3_instruct()),
            other => Err(DataError::BadOption {
                key: "data.span_rule",
                expected: "one of qwen3.5, qwen3.5-every-turn, qwen, qwen3-instruct",
                found: format!("{other:?}"),
            }),
        }
    }

    pub fn validate(&self) -> Result<(), DataError> {
        if self.assistant_header.is_empty() || self.end_of_turn.is_empty() {
            return Err(DataError::BadOption {
                key: "data.span_rule",
                expected: "a non-empty assistant header and end-of-turn marker",
                found: format!("{self:?}"),
            });
        }
        Ok(())
    }
}

/// Byte ranges of `text` to supervise, ascending and disjoint: for each assistant header, from
/// right after it (and after a think opener, if the rule has one) through the end-of-turn
/// marker inclusive.
pub fn supervised_ranges(text: &str, rule: &SpanRule) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut pos = 0;
    while let Some(found) = text[pos..].find(&rule.assistant_header) {
        let mut start = pos + found + rule.assistant_header.len();
        if let Some(opener) = &rule.think_opener {
            if text[start..].starts_with(opener.as_str()) {
                start += opener.len();
            }
        }
        let end = text[start..]
            .find(&rule.end_of_turn)
            .map_or(text.len(), |i| start + i + rule.end_of_turn.len());
        if start < end {
            ranges.push(start..end);
        }
        pos = end.max(start);
    }
    ranges
}

/// Byte ranges of every occurrence of the rule's ignore strings.
pub fn ignored_ranges(text: &str, rule: &SpanRule) -> Vec<Range<usize>> {
    let mut ranges: Vec<Range<usize>> = rule
        .ignore
        .iter()
        .filter(|s| !s.is_empty())
        .flat_map(|s| text.match_indices(s.as_str()).map(|(i, m)| i..i + m.len()))
        .collect();
    ranges.sort_by_key(|r| r.start);
    ranges
}

/// One mask value per token: 1 when the token's byte span lies inside a supervised range and
/// not inside an ignored one. A token straddling a range boundary (part header, part reply)
/// is left unsupervised, as SF's offset-based parser does.
pub fn token_mask(
    offsets: &[(usize, usize)],
    supervised: &[Range<usize>],
    ignored: &[Range<usize>],
) -> Vec<u8> {
    offsets
        .iter()
        .map(|&(start, end)| {
            u8::from(contains(supervised, start, end) && !contains(ignored, start, end))
        })
        .collect()
}

/// Whether some range in `ranges` (sorted by start) holds `start..end` entirely.
fn contains(ranges: &[Range<usize>], start: usize, end: usize) -> bool {
    // Ignore ranges may overlap each other, so check every range that starts early enough.
    let candidates = ranges.partition_point(|r| r.start <= start);
    ranges[..candidates].iter().rev().any(|r| end <= r.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_TURNS: &str = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n\
        <|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n";

    fn spans<'a>(text: &'a str, rule: &SpanRule) -> Vec<&'a str> {
        supervised_ranges(text, rule)
            .into_iter()
            .map(|r| &text[r])
            .collect()
    }

    #[test]
    fn qwen3_5_matches_only_turns_with_a_think_opener_like_sf() {
        assert_eq!(
            spans(TWO_TURNS, &SpanRule::qwen3_5()),
            vec!["r\n</think>\n\na<|im_end|>\n"]
        );
    }

    #[test]
    fn every_turn_rule_skips_the_opener_when_present() {
        assert_eq!(
            spans(TWO_TURNS, &SpanRule::qwen3_5_every_turn()),
            vec!["yo<|im_end|>\n", "r\n</think>\n\na<|im_end|>\n"]
        );
        assert_eq!(
            spans(TWO_TURNS, &SpanRule::qwen()),
            vec!["yo<|im_end|>\n", "<think>\nr\n</think>\n\na<|im_end|>\n"]
        );
    }

    #[test]
    fn an_unterminated_turn_runs_to_the_end() {
        let text = "<|im_start|>assistant\npartial";
        assert_eq!(spans(text, &SpanRule::qwen()), vec!["partial"]);
        assert!(spans("no header here", &SpanRule::qwen()).is_empty());
    }

    #[test]
    fn token_mask_needs_full_containment_and_honours_ignores() {
        // Supervised 3..10 and 12..14; ignored 5..8 and 20..22.
        let offsets = [(0, 3), (3, 5), (5, 8), (8, 10), (2, 4), (9, 13), (12, 14)];
        let mask = token_mask(&offsets, &[3..10, 12..14], &[5..8, 20..22]);
        assert_eq!(mask, vec![0, 1, 0, 1, 0, 0, 1]);
    }

    #[test]
    fn instruct_rule_ignores_the_empty_think_block() {
        let text = "<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>\n";
        let rule = SpanRule::qwen3_instruct();
        let ignored = ignored_ranges(text, &rule);
        assert_eq!(ignored.len(), 1);
        assert_eq!(&text[ignored[0].clone()], "<think>\n\n</think>\n\n");
    }

    #[test]
    fn rule_names_round_trip_and_unknown_names_are_rejected() {
        for name in SPAN_RULE_NAMES {
            SpanRule::by_name(name).unwrap().validate().unwrap();
        }
        let err = SpanRule::by_name("llama").unwrap_err().to_string();
        assert!(
            err.contains("data.span_rule") && err.contains("\"llama\""),
            "{err}"
        );
    }
}
