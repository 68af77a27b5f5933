//! TensorBoard reads back what `dflashd` writes (issue 14, part 2): a short real run on the CPU
//! default and its resume, read with the PyPI `tensorboard` package's own reader (the uv
//! venv's `dev` group), every scalar compared with `metrics.jsonl` of the same run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::binary::{write_config, Daemon};

/// Dumps what TensorBoard finds in a directory: each file's events as its loader reads them
/// (the reader checks both CRCs of every record and stops at a bad one), and every scalar as
/// `EventAccumulator` serves it to the dashboard.
const READER: &str = r#"
import json, os, sys
from tensorboard.backend.event_processing import event_accumulator, event_file_loader
d = sys.argv[1]
out = {"files": [], "scalars": {}}
for name in sorted(os.listdir(d)):
    events = list(event_file_loader.LegacyEventFileLoader(os.path.join(d, name)).Load())
    out["files"].append({
        "name": name,
        "events": len(events),
        "first_file_version": events[0].file_version if events else None,
    })
acc = event_accumulator.EventAccumulator(d, size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
for tag in acc.Tags()["scalars"]:
    out["scalars"][tag] = [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)]
json.dump(out, sys.stdout)
"#;

fn python() -> PathBuf {
    crate::support::binary::project_python(
        "run `make provision` (uv sync installs the dev group with tensorboard)",
    )
}

fn read_with_tensorboard(dir: &Path) -> serde_json::Value {
    let out = Command::new(python())
        .args(["-c", READER])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the tensorboard reader failed (is the dev group installed? `make provision`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// (tag, step) → the values (and wall times) TensorBoard has for it.
type Points = BTreeMap<(String, i64), Vec<(f64, f64)>>;

/// What `metrics.jsonl` says TensorBoard must show, by the tag rule of
/// `daemon/src/runtime/tensorboard/scalars.rs`: every number but the top-level `step` and
/// `ts_ms`, tagged by its path, array elements by index and their string fields.
fn expected(metrics: &str) -> Points {
    fn walk(tag: &str, v: &serde_json::Value, out: &mut Vec<(String, f64)>) {
        match v {
            serde_json::Value::Number(n) => out.push((tag.into(), n.as_f64().unwrap())),
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    walk(&format!("{tag}/{k}"), v, out);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let mut name = i.to_string();
                    for s in item.as_object().into_iter().flat_map(|m| m.values()) {
                        if let Some(s) = s.as_str() {
                            name = format!("{name}.{s}");
                        }
                    }
                    walk(&format!("{tag}/{name}"), item, out);
                }
            }
            _ => {}
        }
    }
    let mut points = Points::new();
    for line in metrics.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let step = v["step"].as_i64().unwrap();
        let wall = v["ts_ms"].as_f64().unwrap() / 1000.0;
        let mut scalars = Vec::new();
        for (k, field) in v.as_object().unwrap() {
            if k != "step" && k != "ts_ms" {
                walk(k, field, &mut scalars);
            }
        }
        for (tag, value) in scalars {
            points.entry((tag, step)).or_default().push((value, wall));
        }
    }
    points
}

fn found(read: &serde_json::Value) -> Points {
    let mut points = Points::new();
    for (tag, series) in read["scalars"].as_object().unwrap() {
        for p in series.as_array().unwrap() {
            let (step, value, wall) = (
                p[0].as_i64().unwrap(),
                p[1].as_f64().unwrap(),
                p[2].as_f64().unwrap(),
            );
            points
                .entry((tag.clone(), step))
                .or_default()
                .push((value, wall));
        }
    }
    points
}

/// Every expected point is there with its value as a float32 holds it, and nothing else is.
fn compare(expected: &Points, found: &Points) -> Vec<String> {
    let mut wrong = Vec::new();
    for (key, want) in expected {
        let Some(got) = found.get(key) else {
            wrong.push(format!("{key:?}: missing (metrics.jsonl has {want:?})"));
            continue;
        };
        if got.len() != want.len() {
            wrong.push(format!(
                "{key:?}: {} points, metrics.jsonl has {}",
                got.len(),
                want.len()
            ));
            continue;
        }
        for ((g, gw), (w, ww)) in got.iter().zip(want) {
            // Rounding to float32 moves a value by at most half an ulp.
            let tolerance = f64::from(f32::EPSILON) * w.abs();
            if (g - w).abs() > tolerance {
                wrong.push(format!("{key:?}: {g} in TensorBoard, {w} in metrics.jsonl"));
            }
            if (gw - ww).abs() > 1e-6 {
                wrong.push(format!(
                    "{key:?}: wall time {gw}, metrics.jsonl's ts_ms says {ww}"
                ));
            }
        }
    }
    for key in found.keys().filter(|k| !expected.contains_key(*k)) {
        wrong.push(format!("{key:?}: in TensorBoard but not in metrics.jsonl"));
    }
    wrong
}

#[test]
fn tensorboard_reads_every_metrics_value_of_a_run_and_its_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // An evaluation every 4 steps, so a short run has τ lines besides the step-0 evaluation.
    let config = root.join("tb.toml");
    write_config(&config, |c| c.training.eval_every = 4);
    let config = config.display().to_string();
    let mut first = Daemon::spawn(root, &["--config", &config, "--max-steps", "5"]);
    assert!(first.wait_exit().success(), "{}", first.stderr());
    let mut resumed = Daemon::spawn(root, &["--config", &config, "--max-steps", "4"]);
    assert!(resumed.wait_exit().success(), "{}", resumed.stderr());

    let tb = first.run_dir.join("tensorboard");
    let read = read_with_tensorboard(&tb);
    let metrics = std::fs::read_to_string(first.run_dir.join("metrics.jsonl")).unwrap();
    // One file per start, each opened by the file-version record, with one event per line.
    let files = read["files"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{read:#}");
    for f in files {
        assert!(
            f["name"]
                .as_str()
                .unwrap()
                .starts_with("events.out.tfevents."),
            "{f}"
        );
        assert_eq!(f["first_file_version"], "brain.Event:2", "{f}");
    }
    let events: u64 = files
        .iter()
        .map(|f| f["events"].as_u64().unwrap().saturating_sub(1))
        .sum();
    assert_eq!(events, metrics.lines().count() as u64, "{read:#}");

    let want = expected(&metrics);
    let got = found(&read);
    let wrong = compare(&want, &got);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The contract's names, and the lines it had to cover: the step-0 evaluation, the τ of
    // steps 4 and 8 with the tree oracle's beside it at the embedded default's budgets (8 and
    // the serving 32), and the resumed steps 6..9.
    for (tag, step) in [
        ("loss", 0),
        ("tau", 0),
        ("tau", 4),
        ("tau", 8),
        ("tau_tree_oracle_32", 0),
        ("tau_tree_oracle_8", 4),
        ("tau_tree_oracle_32", 8),
        ("serve_tree_budget", 8),
        ("lr", 9),
        ("times/total_ms", 6),
        ("workers/0.cpu.both/tokens_per_s", 2),
    ] {
        assert!(
            got.contains_key(&(tag.to_string(), step)),
            "no {tag} at step {step}: {:?}",
            got.keys().collect::<Vec<_>>()
        );
    }
}

#[test]
fn the_event_files_go_where_tensorboard_dir_says_and_nowhere_when_disabled() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let elsewhere = root.join("elsewhere/tb");
    let config = root.join("dir.toml");
    write_config(&config, |c| {
        c.tensorboard.dir = elsewhere.display().to_string()
    });
    let run_a = root.join("a");
    let mut a = Daemon::spawn_in(
        root,
        &run_a,
        &[
            "--config",
            &config.display().to_string(),
            "--max-steps",
            "1",
        ],
    );
    assert!(a.wait_exit().success(), "{}", a.stderr());
    assert!(!run_a.join("tensorboard").exists());
    let read = read_with_tensorboard(&elsewhere);
    assert_eq!(read["files"].as_array().unwrap().len(), 1, "{read:#}");
    assert!(
        read["scalars"]["loss"]
            .as_array()
            .is_some_and(|s| s.len() == 2),
        "{read:#}"
    );

    let off = root.join("off.toml");
    write_config(&off, |c| c.tensorboard.enabled = false);
    let run_b = root.join("b");
    let mut b = Daemon::spawn_in(
        root,
        &run_b,
        &["--config", &off.display().to_string(), "--max-steps", "1"],
    );
    assert!(b.wait_exit().success(), "{}", b.stderr());
    assert!(run_b.join("metrics.jsonl").exists());
    assert!(!run_b.join("tensorboard").exists());
}
