//! `dflashd start --detach` with a missing model, a missing data file or a config that does not
//! load: the caller's terminal gets the daemon's error (the file, the key and what to do), the
//! command exits non-zero, and the run's journal keeps the refusal.

use std::path::Path;

use crate::support::binary::{journal, run, write_config};
use dflash_shared::events::EventKind;

fn start_detached(root: &Path, config: &Path) -> (i32, String, String) {
    let (run_dir, socket, config) = (
        root.join("run").display().to_string(),
        root.join("s/d.sock").display().to_string(),
        config.display().to_string(),
    );
    run(
        root,
        &[
            "start",
            "--detach",
            "--threads",
            "1",
            "--max-steps",
            "1",
            "--config",
            &config,
            "--run-dir",
            &run_dir,
            "--socket",
            &socket,
        ],
    )
}

fn last_stop_reason(root: &Path) -> String {
    journal(&root.join("run"))
        .into_iter()
        .rev()
        .find_map(|e| match e.kind {
            EventKind::RunStopped { reason, .. } => Some(reason),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no RunStopped in the journal"))
}

#[test]
fn setup_errors_reach_the_callers_terminal_and_the_journal() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let missing_model = root.join("no-such-model");
    let missing_data = root.join("no-such-data.jsonl");
    let (model_cfg, data_cfg, bad_cfg) = (
        root.join("model.toml"),
        root.join("data.toml"),
        root.join("bad.toml"),
    );
    write_config(&model_cfg, |c| {
        c.target.model = missing_model.display().to_string();
    });
    write_config(&data_cfg, |c| {
        c.data.train_file = missing_data.display().to_string();
    });
    let text = std::fs::read_to_string(&model_cfg)
        .unwrap()
        .replace("num_anchors = 16", "num_anchors = \"many\"");
    assert!(text.contains("\"many\""), "the edit applies");
    std::fs::write(&bad_cfg, text).unwrap();

    let cases = [
        (
            &model_cfg,
            vec![
                missing_model.display().to_string(),
                "target.model".into(),
                "Hugging Face model directory".into(),
            ],
        ),
        (
            &data_cfg,
            vec![
                missing_data.display().to_string(),
                "data.train_file".into(),
                "JSONL".into(),
            ],
        ),
        (
            &bad_cfg,
            vec![
                "bad.toml".into(),
                "training.num_anchors".into(),
                "dflashd config validate".into(),
            ],
        ),
    ];
    for (config, needles) in cases {
        let (code, stdout, stderr) = start_detached(root, config);
        assert_ne!(code, 0, "{}: {stdout}\n{stderr}", config.display());
        for needle in &needles {
            assert!(
                stderr.contains(needle.as_str()),
                "{needle:?} missing from the terminal:\n{stderr}"
            );
        }
        let reason = last_stop_reason(root);
        assert!(
            reason.contains(needles[0].as_str()) && reason.contains(needles[1].as_str()),
            "the journal keeps it: {reason}"
        );
        assert!(
            !root.join("run/fingerprint.json").exists(),
            "a start that trained nothing records no environment to compare the next one with"
        );
    }
}

#[test]
fn a_batch_larger_than_the_data_is_refused_naming_the_toml_key() {
    // Issue 15, defect 4: this trained at a handful of steps, each over the whole dataset.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let config = root.join("big-batch.toml");
    write_config(&config, |c| c.training.batch_size = 100_000);
    let (code, out, err) = start_detached(root, &config);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("training.batch_size"), "{err}");
    assert!(err.contains("training samples"), "{err}");
    assert!(!crate::support::binary::checkpoint_steps(&root.join("run"))
        .iter()
        .any(|_| true));
}

#[test]
fn a_telemetry_python_that_names_no_file_is_refused_as_validate_refuses_it() {
    // Issue 15, defect 4: `start` used to drop it silently and fingerprint without it.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let config = root.join("no-python.toml");
    write_config(&config, |c| {
        c.telemetry.python = Some("/nonexistent/python3".into())
    });
    let (code, out, err) = start_detached(root, &config);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("telemetry.python") && err.contains("/nonexistent/python3"),
        "{err}"
    );
    assert!(
        crate::support::binary::checkpoint_steps(&root.join("run")).is_empty(),
        "nothing trained"
    );
}

#[test]
fn a_data_line_over_max_line_bytes_is_journaled_with_its_line_and_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let data = root.join("train.jsonl");
    let row = |i: usize| {
        let ids: Vec<String> = (0..24)
            .map(|t| ((i * 7 + t) % 40 + 1).to_string())
            .collect();
        let mask: Vec<&str> = (0..24).map(|t| if t < 4 { "0" } else { "1" }).collect();
        format!(
            r#"{{"input_ids":[{}],"loss_mask":[{}]}}"#,
            ids.join(","),
            mask.join(",")
        )
    };
    let long = format!(
        r#"{{"input_ids":[{}],"loss_mask":[{}]}}"#,
        vec!["5"; 2000].join(","),
        vec!["1"; 2000].join(",")
    );
    let mut text = String::new();
    for i in 0..200 {
        text.push_str(&if i == 2 { long.clone() } else { row(i) });
        text.push('\n');
    }
    std::fs::write(&data, text).unwrap();
    let config = root.join("long-line.toml");
    write_config(&config, |c| {
        c.data.train_file = data.display().to_string();
        c.data.format = dflash_shared::config::DataFormat::Pretokenized;
        c.data.max_line_bytes = dflash_shared::config::ByteSize(1024);
    });
    assert!(long.len() > 1024);
    let (code, stdout, stderr) = start_detached(root, &config);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let bad: Vec<(u64, String)> = journal(&root.join("run"))
        .into_iter()
        .filter_map(|e| match e.kind {
            EventKind::BadDataLine { line, reason, .. } => Some((line, reason)),
            _ => None,
        })
        .collect();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].0, 3);
    assert!(
        bad[0].1.contains("over data.max_line_bytes = 1024"),
        "{}",
        bad[0].1
    );
}
