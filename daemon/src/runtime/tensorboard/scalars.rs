//! Which TensorBoard scalars one `metrics.jsonl` line becomes.
//!
//! The list is derived from the serialized line itself, a walk of its JSON, and not kept by
//! hand: a field added to `StepMetrics` (or to what it holds) appears in TensorBoard with no
//! edit here. The rules:
//! - the top-level `step` is the event's step and `ts_ms` its wall time; neither is a scalar;
//! - every other number is a scalar, tagged by its path with `/`: `loss`, `times/total_ms`;
//! - an array's elements are named by their index, followed, for an object, by its string
//!   fields (they say what the element is): `workers/0.cpu.both/tokens_per_s`,
//!   `acceptance/3` for an array of numbers;
//! - strings, booleans and nulls are no scalars. A NaN serializes as `null`, as does an
//!   unknown optional figure, and the two cannot be told apart here; neither is written.
use serde_json::{Map, Value};

/// The key of the step in a metrics line; the event's step.
pub const STEP_KEY: &str = "step";
/// The key of the line's Unix time in milliseconds; the event's wall time.
pub const WALL_TIME_MS_KEY: &str = "ts_ms";

#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub tag: String,
    /// TensorBoard's `simple_value` is a float32.
    pub value: f32,
}

/// One event's worth: the step, the wall time in seconds and the scalars.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalarLine {
    pub step: i64,
    pub wall_time: f64,
    pub scalars: Vec<Scalar>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScalarLineError {
    #[error("a metrics line is a JSON object, this one is not")]
    NotAnObject,
    #[error("the metrics line has no integer `{STEP_KEY}`")]
    NoStep,
}

/// The scalars of one serialized metrics line.
pub fn scalar_line(line: &Value) -> Result<ScalarLine, ScalarLineError> {
    let fields = line.as_object().ok_or(ScalarLineError::NotAnObject)?;
    let step = fields
        .get(STEP_KEY)
        .and_then(Value::as_i64)
        .ok_or(ScalarLineError::NoStep)?;
    // A line without a time still has its figures; TensorBoard then shows it at 1970.
    let wall_time = fields
        .get(WALL_TIME_MS_KEY)
        .and_then(Value::as_f64)
        .map_or(0.0, |ms| ms / 1000.0);
    let mut scalars = Vec::new();
    for (key, value) in fields {
        if key != STEP_KEY && key != WALL_TIME_MS_KEY {
            walk(key, value, &mut scalars);
        }
    }
    Ok(ScalarLine {
        step,
        wall_time,
        scalars,
    })
}

fn walk(tag: &str, value: &Value, out: &mut Vec<Scalar>) {
    match value {
        Value::Number(n) => {
            if let Some(v) = n.as_f64() {
                out.push(Scalar {
                    tag: tag.to_string(),
                    value: v as f32,
                });
            }
        }
        Value::Object(fields) => {
            for (key, v) in fields {
                walk(&format!("{tag}/{key}"), v, out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(&format!("{tag}/{}", element_name(i, item)), item, out);
            }
        }
        Value::String(_) | Value::Bool(_) | Value::Null => {}
    }
}

/// `3`, or for an object `3.cuda:3.target`: the index keeps the names unique, the string
/// fields make them readable.
fn element_name(index: usize, item: &Value) -> String {
    let labels = item.as_object().map(string_fields).unwrap_or_default();
    std::iter::once(index.to_string())
        .chain(labels)
        .collect::<Vec<_>>()
        .join(".")
}

fn string_fields(fields: &Map<String, Value>) -> Vec<String> {
    fields
        .values()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::metrics::{DeviceRole, StepMetrics, StepTimes, WorkerThroughput};

    fn tags(line: &ScalarLine) -> Vec<(&str, f32)> {
        line.scalars
            .iter()
            .map(|s| (s.tag.as_str(), s.value))
            .collect()
    }

    #[test]
    fn every_number_of_a_step_line_is_a_scalar_and_step_and_time_are_the_events() {
        let m = StepMetrics {
            ts_ms: 1_764_600_000_250,
            step: 12,
            epoch: 1,
            loss: 2.5,
            accuracy: 0.25,
            tau: Some(3.5),
            tau_tree: None,
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_s: 1500.0,
            draft_positions_per_s: 24_000.0,
            mfu: Some(0.4),
            workers: vec![
                WorkerThroughput {
                    device: "cuda:0".into(),
                    role: DeviceRole::Target,
                    tokens_per_s: 900.0,
                    mfu: None,
                },
                WorkerThroughput {
                    device: "cuda:1".into(),
                    role: DeviceRole::Drafter,
                    tokens_per_s: 600.0,
                    mfu: Some(0.5),
                },
            ],
            times: StepTimes {
                total_ms: 40.0,
                ..StepTimes::default()
            },
            online: None,
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        };
        let line = scalar_line(&serde_json::to_value(&m).unwrap()).unwrap();
        assert_eq!((line.step, line.wall_time), (12, 1_764_600_000.25));
        let got = tags(&line);
        for want in [
            ("epoch", 1.0),
            ("loss", 2.5),
            ("accuracy", 0.25),
            ("tau", 3.5),
            ("lr", 1e-3),
            ("grad_norm", 0.5),
            ("tokens_per_s", 1500.0),
            ("workers/0.cuda:0.target/tokens_per_s", 900.0),
            ("workers/1.cuda:1.drafter/tokens_per_s", 600.0),
            ("workers/1.cuda:1.drafter/mfu", 0.5),
            ("draft_positions_per_s", 24_000.0),
            ("mfu", 0.4),
            ("times/total_ms", 40.0),
            ("times/data_wait_ms", 0.0),
        ] {
            assert!(got.contains(&want), "{want:?} missing from {got:?}");
        }
        // 9 top-level figures, 2 workers' tokens/s and one MFU (the other is unknown, so
        // absent), 7 times; no `step` or `ts_ms` scalar.
        assert_eq!(got.len(), 9 + 3 + 7, "{got:?}");
    }

    #[test]
    fn an_evaluations_tree_and_online_figures_become_scalars_under_the_metrics_line_names() {
        let m = StepMetrics {
            ts_ms: 1_000,
            step: 50,
            epoch: 1,
            loss: 2.5,
            accuracy: 0.25,
            tau: Some(3.5),
            tau_tree: Some(dflash_shared::metrics::TreeOracleTau {
                serve_budget: 32,
                by_budget: [(8, 3.75), (32, 4.25)].into_iter().collect(),
            }),
            lr: 1e-3,
            grad_norm: 0.5,
            tokens_per_s: 1500.0,
            draft_positions_per_s: 24_000.0,
            mfu: None,
            workers: vec![],
            times: StepTimes::default(),
            online: Some(dflash_shared::metrics::OnlineAcceptance {
                tau_chain: 2.5,
                tau_ddtree: [(8, 2.75), (32, 3.0)].into_iter().collect(),
                serve_tree_budget: Some(32),
                offline_tau: Some(3.5),
                base: None,
                prompts: 8,
                seconds: 1.5,
            }),
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        };
        let line = scalar_line(&serde_json::to_value(&m).unwrap()).unwrap();
        let got = tags(&line);
        for want in [
            ("online_tau_chain", 2.5),
            ("online_tau_ddtree_8", 2.75),
            ("online_tau_ddtree_32", 3.0),
            ("online_eval_offline_tau", 3.5),
            ("online_eval_prompts", 8.0),
            ("online_eval_s", 1.5),
            ("online_serve_tree_budget", 32.0),
            ("tau", 3.5),
            ("tau_tree_oracle_8", 3.75),
            ("tau_tree_oracle_32", 4.25),
            ("serve_tree_budget", 32.0),
        ] {
            assert!(got.contains(&want), "{want:?} missing from {got:?}");
        }
    }

    #[test]
    fn fields_nobody_listed_appear_by_their_path() {
        // What a newer StepMetrics may carry: a new number, an array of numbers, a nested
        // object; and what is not a figure: a null, a string, a boolean.
        let line = serde_json::json!({
            "step": 3, "ts_ms": 1000, "mfu": 0.41,
            "acceptance": [0.9, 0.7],
            "memory": {"peak_gib": 12.5},
            "unknown": null, "note": "x", "flag": true
        });
        let line = scalar_line(&line).unwrap();
        // Sorted: serde_json keeps the keys sorted or in insertion order, by a feature flag.
        let mut got = tags(&line);
        got.sort_by(|a, b| a.0.cmp(b.0));
        assert_eq!(
            got,
            [
                ("acceptance/0", 0.9),
                ("acceptance/1", 0.7),
                ("memory/peak_gib", 12.5),
                ("mfu", 0.41)
            ]
        );
        assert_eq!(line.wall_time, 1.0);
    }

    #[test]
    fn a_line_without_a_step_is_refused() {
        assert_eq!(
            scalar_line(&serde_json::json!({"loss": 1.0})),
            Err(ScalarLineError::NoStep)
        );
        assert_eq!(
            scalar_line(&serde_json::json!([1])),
            Err(ScalarLineError::NotAnObject)
        );
    }
}
