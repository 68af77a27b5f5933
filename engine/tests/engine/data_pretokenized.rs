//! Pre-tokenized JSONL loading, and the order/split helpers applied to loaded samples.
use std::collections::BTreeSet;
use std::path::PathBuf;

use dflash_engine::data::{epoch_order, holdout_split, load, DataFormat, LoadOptions};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/data/pretokenized.jsonl")
}

fn options(max_length: usize) -> LoadOptions {
    LoadOptions {
        max_length,
        // The fixture tokenizer's size: ids 0..470.
        vocab_size: Some(470),
        threads: 1,
        max_line_bytes: 1 << 20,
    }
}

#[test]
fn validates_rows_and_reports_every_rejected_line() {
    let (samples, report) = load(&fixture(), DataFormat::Pretokenized, &options(4096)).unwrap();
    assert_eq!(samples.len(), 3);
    assert_eq!(
        samples[0].input_ids,
        vec![464, 292, 263, 198, 54, 298, 465, 198]
    );
    assert_eq!(samples[1].loss_mask, vec![0, 0, 1, 1, 1, 0]);
    let bad: Vec<(u64, &str)> = report
        .bad_lines
        .iter()
        .map(|b| (b.line, b.reason.as_str()))
        .collect();
    assert_eq!(
        bad.iter().map(|b| b.0).collect::<Vec<_>>(),
        vec![2, 3, 5, 8]
    );
    assert!(
        bad[0].1.contains("3 tokens but loss_mask has 2"),
        "{}",
        bad[0].1
    );
    assert!(bad[1].1.contains("loss_mask[2] is 2"), "{}", bad[1].1);
    assert!(
        bad[2].1.contains("input_ids[1] is 470; expected 0..470"),
        "{}",
        bad[2].1
    );
    assert!(bad[3].1.contains("not a pre-tokenized row"), "{}", bad[3].1);
    assert_eq!(report.skipped_too_short, vec![6]);
    assert_eq!(
        (report.lines, report.blank_lines, report.truncated),
        (9, 1, 0)
    );
    assert!(report.is_balanced());
}

#[test]
fn truncation_applies_to_pretokenized_rows() {
    let (samples, report) = load(&fixture(), DataFormat::Pretokenized, &options(5)).unwrap();
    // ok-1 (8 tokens) cut to 5 keeps one supervised token, so no anchor pair: skipped, and not
    // counted as truncated (that count is of kept samples). ok-2 (6) is cut, ok-3 (4) is not.
    assert_eq!(report.skipped_too_short, vec![1, 6]);
    assert_eq!(report.truncated, 1);
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[0].input_ids, vec![10, 11, 12, 13, 14]);
    assert_eq!(samples[0].loss_mask, vec![0, 0, 1, 1, 1]);
    assert_eq!(samples[1].input_ids, vec![20, 21, 22, 23]);
    assert!(report.is_balanced());
}

#[test]
fn split_and_epoch_order_over_loaded_samples_are_disjoint_and_reproducible() {
    let n = 1000;
    let split = holdout_split(n, 1234, 0.05).unwrap();
    assert_eq!(split.eval.len(), 50);
    let train: BTreeSet<usize> = split.train.iter().copied().collect();
    let eval: BTreeSet<usize> = split.eval.iter().copied().collect();
    assert!(train.is_disjoint(&eval));
    assert_eq!(train.len() + eval.len(), n);
    for epoch in 0..6 {
        let order = epoch_order(split.train.len(), 1234, epoch);
        let visited: BTreeSet<usize> = order.iter().map(|&i| split.train[i]).collect();
        assert_eq!(
            visited, train,
            "epoch {epoch} visits every training sample once"
        );
        assert_eq!(order, epoch_order(split.train.len(), 1234, epoch));
    }
    assert_ne!(epoch_order(950, 1234, 0), epoch_order(950, 1234, 1));
}

#[test]
fn a_line_over_max_line_bytes_is_a_bad_line_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.jsonl");
    let row = r#"{"input_ids":[1,2,3,4],"loss_mask":[0,1,1,1]}"#;
    let long = format!(
        r#"{{"input_ids":[{}],"loss_mask":[{}]}}"#,
        vec!["7"; 600].join(","),
        vec!["1"; 600].join(",")
    );
    std::fs::write(&path, format!("{row}\n{long}\n{row}\n")).unwrap();
    let limit = 1000;
    assert!(long.len() > limit && row.len() < limit);
    let (samples, report) = load(
        &path,
        DataFormat::Pretokenized,
        &LoadOptions {
            max_line_bytes: limit as u64,
            ..options(4096)
        },
    )
    .unwrap();
    assert_eq!(samples.len(), 2);
    assert_eq!(report.bad_lines.len(), 1);
    let bad = &report.bad_lines[0];
    assert_eq!(bad.line, 2);
    assert!(
        bad.reason.contains("data.max_line_bytes = 1000")
            && bad.reason.contains(&format!("{} bytes", long.len())),
        "{}",
        bad.reason
    );
    // The same line under the default limit is a sample: the limit is what refused it.
    let (samples, _) = load(&path, DataFormat::Pretokenized, &options(4096)).unwrap();
    assert_eq!(samples.len(), 3);
    // A zero limit is a bad option, named by its key.
    let err = load(
        &path,
        DataFormat::Pretokenized,
        &LoadOptions {
            max_line_bytes: 0,
            ..options(4096)
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("data.max_line_bytes"), "{err}");
}
