//! `dflashd eval --json` prints exactly one JSON object with τ, loss, per-position acceptance and
//! recall@k; bad data lines are reported on stderr with their line numbers and skipped.
use std::process::Command;

use dflashd::engine::train::embedded::TINY_DATASET;

#[test]
fn eval_json_shape_and_bad_line_reporting() {
    let run = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_dflashd");
    let o = Command::new(bin)
        .args(["start", "--threads", "1", "--max-steps", "3", "--run-dir"])
        .arg(run.path())
        // The daemon's socket and logs stay in the test's temp dir.
        .env("XDG_RUNTIME_DIR", run.path())
        .env("XDG_STATE_HOME", run.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let drafter = run.path().join("drafter");
    let o = Command::new(bin)
        .arg("export")
        .arg("--checkpoint")
        .arg(run.path())
        .arg("--out")
        .arg(&drafter)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // 10 good samples with two bad lines among them (lines 4 and 8).
    let mut lines: Vec<String> = TINY_DATASET.lines().take(10).map(str::to_string).collect();
    lines.insert(3, r#"{"input_ids":[1,2,3],"loss_mask":[0,1]}"#.to_string());
    lines.insert(
        7,
        r#"{"input_ids":[1,2,9999],"loss_mask":[1,1,1]}"#.to_string(),
    );
    let data = run.path().join("eval.jsonl");
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();

    let o = Command::new(bin)
        .args(["eval", "--json", "--threads", "1", "--target"])
        .arg(run.path().join("target"))
        .arg("--drafter")
        .arg(&drafter)
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("eval.jsonl:4: input_ids has 3 tokens but loss_mask has 2"),
        "{stderr}"
    );
    assert!(
        stderr.contains("eval.jsonl:8: input_ids[2] is 9999; expected 0..512"),
        "{stderr}"
    );

    let stdout = String::from_utf8(o.stdout).unwrap();
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "expected one JSON line, got {stdout:?}"
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let tau = v["tau"].as_f64().unwrap();
    assert!((1.0..=8.0).contains(&tau), "{tau}");
    assert!(v["loss"].as_f64().unwrap().is_finite());
    let acceptance = v["per_position_acceptance"].as_array().unwrap();
    assert_eq!(acceptance.len(), 7, "block size 8 has 7 draft slots");
    // Acceptance of slot k needs every earlier slot accepted: non-increasing.
    let acc: Vec<f64> = acceptance.iter().map(|x| x.as_f64().unwrap()).collect();
    assert!(acc.windows(2).all(|w| w[1] <= w[0] + 1e-12), "{acc:?}");
    let recall = v["recall_at_k"].as_object().unwrap();
    let keys: Vec<&str> = recall.keys().map(String::as_str).collect();
    assert_eq!(keys, vec!["1", "2", "4", "8"]);
    for slot in 0..7 {
        let r: Vec<f64> = ["1", "2", "4", "8"]
            .iter()
            .map(|k| recall[*k][slot].as_f64().unwrap())
            .collect();
        assert!(
            r.windows(2).all(|w| w[0] <= w[1]) && r.iter().all(|x| (0.0..=1.0).contains(x)),
            "slot {slot}: {r:?}"
        );
    }
    // recall@1 at slot 1 is the same event as acceptance at slot 1.
    assert!((recall["1"][0].as_f64().unwrap() - acc[0]).abs() < 1e-12);
    assert_eq!(v["samples"], 10);
    let bad: Vec<u64> = v["data"]["bad_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["line"].as_u64().unwrap())
        .collect();
    assert_eq!(bad, vec![4, 8]);
    assert_eq!(v["data"]["samples"], 10);
}

#[test]
fn eval_with_a_missing_drafter_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d.jsonl");
    std::fs::write(&data, TINY_DATASET.lines().next().unwrap()).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_dflashd"))
        .args(["eval", "--target"])
        .arg(dir.path().join("no-target"))
        .arg("--drafter")
        .arg(dir.path().join("no-drafter"))
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("no-target"), "{stderr}");
}
