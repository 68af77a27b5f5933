//! Pre-tokenized JSONL: one `{"input_ids": [...], "loss_mask": [...]}` object per line
//! (the speculators/SPEC row format; extra keys are ignored).
use serde::Deserialize;

use super::sample::Sample;

#[derive(Deserialize)]
struct Row {
    input_ids: Vec<i64>,
    loss_mask: Vec<i64>,
}

/// Parses and validates one line. `Err` is the reason the line is bad, phrased for a human.
pub fn parse_line(line: &str, vocab_size: Option<usize>) -> Result<Sample, String> {
    let row: Row = serde_json::from_str(line).map_err(|e| {
        format!("not a pre-tokenized row ({e}); expected {{\"input_ids\": [int], \"loss_mask\": [0|1]}}")
    })?;
    if row.input_ids.len() != row.loss_mask.len() {
        return Err(format!(
            "input_ids has {} tokens but loss_mask has {}; they must be the same length",
            row.input_ids.len(),
            row.loss_mask.len()
        ));
    }
    if row.input_ids.is_empty() {
        return Err("input_ids is empty".to_string());
    }
    if let Some((pos, value)) = row
        .loss_mask
        .iter()
        .enumerate()
        .find(|(_, &m)| m != 0 && m != 1)
    {
        return Err(format!("loss_mask[{pos}] is {value}; expected 0 or 1"));
    }
    let limit = vocab_size.map_or(i64::MAX, |v| i64::try_from(v).unwrap_or(i64::MAX));
    if let Some((pos, id)) = row
        .input_ids
        .iter()
        .enumerate()
        .find(|(_, &id)| id < 0 || id >= limit)
    {
        let range = match vocab_size {
            Some(v) => format!("0..{v} (the model's vocab_size)"),
            None => "a non-negative id".to_string(),
        };
        return Err(format!("input_ids[{pos}] is {id}; expected {range}"));
    }
    Ok(Sample {
        input_ids: row.input_ids,
        // Every value was checked to be 0 or 1 above.
        loss_mask: row.loss_mask.into_iter().map(|m| m as u8).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_valid_row_and_ignores_extra_keys() {
        let s = parse_line(
            r#"{"id":"a","input_ids":[5,6,7],"loss_mask":[0,1,1]}"#,
            Some(8),
        )
        .unwrap();
        assert_eq!(s.input_ids, vec![5, 6, 7]);
        assert_eq!(s.loss_mask, vec![0, 1, 1]);
    }

    #[test]
    fn rejects_each_kind_of_malformed_row_with_a_reason() {
        let cases = [
            (r#"{"input_ids":[1,2],"loss_mask":[1]}"#, "same length"),
            (
                r#"{"input_ids":[1,2],"loss_mask":[1,2]}"#,
                "loss_mask[1] is 2",
            ),
            (
                r#"{"input_ids":[1,9],"loss_mask":[1,1]}"#,
                "input_ids[1] is 9; expected 0..8",
            ),
            (
                r#"{"input_ids":[-1,2],"loss_mask":[1,1]}"#,
                "input_ids[0] is -1",
            ),
            (r#"{"input_ids":[],"loss_mask":[]}"#, "empty"),
            (
                r#"{"input_ids":[1.5],"loss_mask":[1]}"#,
                "not a pre-tokenized row",
            ),
            (r#"{"loss_mask":[1]}"#, "missing field `input_ids`"),
            ("{not json", "not a pre-tokenized row"),
        ];
        for (line, expected) in cases {
            let err = parse_line(line, Some(8)).unwrap_err();
            assert!(err.contains(expected), "{line}: {err}");
        }
    }

    #[test]
    fn without_a_vocab_size_only_negative_ids_are_rejected() {
        assert!(parse_line(r#"{"input_ids":[1000000],"loss_mask":[1]}"#, None).is_ok());
        assert!(parse_line(r#"{"input_ids":[-3],"loss_mask":[1]}"#, None).is_err());
    }
}
