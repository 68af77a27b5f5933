//! The part of a run config that every node of a job must share, as dotted keys.
//!
//! The nodes train one model: the target, the drafter, the training recipe, the data and the
//! run's seed and name must be the same everywhere. What only runs this node's daemon may
//! differ: where its run lives (`run.run_dir`), its own GPUs (`[topology]`, whose drafter
//! count the agreement check compares on its own), its queue, its socket and operators
//! (`[control]`), its telemetry, detectors, metrics listener and TensorBoard directory.
use std::collections::BTreeMap;

use crate::config::keys::in_job;
use crate::config::Config;

/// Every leaf of the job's part of `config`: dotted key → the value as TOML writes it (an
/// array is one leaf), the keys one node owns (`config/keys.rs`: `job = false`) left out;
/// unset options are absent.
pub fn job_config(config: &Config) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    // A `Config` always serializes (it came from TOML); an empty map would only make every
    // node agree on nothing, and the digest beside it still differs.
    if let Ok(toml::Value::Table(root)) = toml::Value::try_from(config) {
        for (section, value) in root {
            flatten(&section, &value, &mut out);
        }
    }
    out.retain(|key, _| in_job(key));
    out
}

/// The canonical text of [`job_config`]: `key = value` lines in key order. Nodes hash this
/// (SHA-256, in the daemon) for the config digest they compare.
pub fn job_config_text(config: &Config) -> String {
    job_config(config)
        .iter()
        .map(|(k, v)| format!("{k} = {v}\n"))
        .collect()
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(table) => {
            for (key, v) in table {
                flatten(&format!("{prefix}.{key}"), v, out);
            }
        }
        leaf => {
            out.insert(prefix.to_string(), leaf.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_keys_hold_the_recipe_and_leave_the_nodes_own_settings_out() {
        let config = Config::embedded_default();
        let keys = job_config(&config);
        assert_eq!(keys["training.objective"], "\"dflash\"");
        assert!(keys.contains_key("drafter.block_size") && keys.contains_key("run.seed"));
        assert!(keys
            .keys()
            .all(|k| !k.starts_with("topology.") && !k.starts_with("control.")));
        let mut local = config.clone();
        local.run.run_dir = Some("/scratch/node1/run".into());
        local.control.socket = Some("/tmp/other.sock".into());
        local.metrics.listen = Some("9400".into());
        assert_eq!(job_config_text(&local), job_config_text(&config));
        let mut recipe = config.clone();
        recipe.training.lr *= 2.0;
        assert_ne!(job_config_text(&recipe), job_config_text(&config));
        assert!(job_config_text(&config).contains("\ntraining.lr = "));
    }
}
