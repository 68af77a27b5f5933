//! The recipe of a run: its config as canonical JSON without the keys that may change between
//! runs of the same recipe ([`in_recipe`]). The healthy record of a recipe is kept under its
//! digest (`health/healthy_record.rs`), so two runs that cost the same per step share one.
use super::keys::{in_recipe, KEYS};

/// The recipe's canonical text: the config as JSON without the sections and keys that may
/// change between runs of the same recipe without changing what a step costs (names, paths of
/// the run, schedule length, evaluation and checkpoint cadence, monitoring, the control plane).
pub fn recipe_text(config: &serde_json::Value) -> String {
    canonical(&recipe_part(config, "").unwrap_or(serde_json::Value::Null))
}

/// `value` at the dotted `path` without the leaves outside the recipe ([`in_recipe`]); an
/// object whose every leaf was left out goes too (`None`), and so does an empty section none
/// of whose keys is in the recipe.
fn recipe_part(value: &serde_json::Value, path: &str) -> Option<serde_json::Value> {
    match value {
        serde_json::Value::Object(map) if map.is_empty() => {
            let below = format!("{path}.");
            KEYS.iter()
                .any(|k| k.recipe && k.key.starts_with(&below))
                .then(|| value.clone())
        }
        serde_json::Value::Object(map) if !map.is_empty() => {
            let kept: serde_json::Map<String, serde_json::Value> = map
                .iter()
                .filter_map(|(k, v)| {
                    let child = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    recipe_part(v, &child).map(|v| (k.clone(), v))
                })
                .collect();
            (!kept.is_empty()).then_some(serde_json::Value::Object(kept))
        }
        leaf => in_recipe(path).then(|| leaf.clone()),
    }
}

/// JSON with every object's keys sorted, whatever order the map keeps them in (serde_json's
/// `preserve_order` may be enabled by another crate of the build).
fn canonical(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| {
                    format!(
                        "{}:{}",
                        serde_json::Value::from(k.as_str()),
                        canonical(&map[k])
                    )
                })
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        serde_json::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recipe_ignores_what_may_change_between_runs_and_keeps_what_a_step_costs() {
        let a = serde_json::json!({
            "run": {"name": "a", "seed": 1},
            "training": {"num_anchors": 512, "epochs": 6, "eval_every": 100, "batch_size": 4},
            "drafter": {"block_size": 16},
            "detectors": {"throughput": {"warmup_s": 10.0}},
        });
        let b = serde_json::json!({
            "drafter": {"block_size": 16},
            "training": {"batch_size": 4, "eval_every": 7, "num_anchors": 512, "epochs": 30},
            "run": {"name": "b", "seed": 9},
        });
        assert_eq!(recipe_text(&a), recipe_text(&b));
        let mut c = b.clone();
        c["training"]["batch_size"] = serde_json::json!(8);
        assert_ne!(recipe_text(&b), recipe_text(&c));
    }
}
