//! Every config key has exactly one row in `shared/src/config/keys.rs`: the schema's keys are
//! read from the config's own deserializer, and every shipped config's leaves are checked too.
use std::collections::BTreeSet;

use dflash_shared::config::keys::KEYS;
use dflash_shared::config::{Config, EMBEDDED_DEFAULT_TOML};

const PROBE: &str = "__probe__";

/// The embedded default as a TOML value with `value` set at the dotted `path`.
fn with_value(path: &[String], value: toml::Value) -> toml::Value {
    let mut root: toml::Value = toml::from_str(EMBEDDED_DEFAULT_TOML).unwrap();
    let mut at = &mut root;
    let (last, parents) = path.split_last().unwrap();
    for p in parents {
        let table = at.as_table_mut().unwrap();
        at = table
            .entry(p.clone())
            .or_insert_with(|| toml::Value::Table(Default::default()));
        if !at.is_table() {
            *at = toml::Value::Table(Default::default());
        }
    }
    at.as_table_mut().unwrap().insert(last.clone(), value);
    root
}

/// The field names serde lists for the struct at `path` (empty: the config itself), read
/// from the "unknown field" error a probe key draws; `None` when `path` is not a struct.
fn fields_at(path: &[String]) -> Option<Vec<String>> {
    let mut probe = path.to_vec();
    probe.push(PROBE.into());
    let err = with_value(&probe, toml::Value::Integer(0))
        .try_into::<Config>()
        .expect_err("a probe key is unknown")
        .to_string();
    let list = err
        .split(&format!("unknown field `{PROBE}`, expected "))
        .nth(1)?;
    let list = list.lines().next().unwrap_or("");
    Some(
        list.split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, s)| s.to_string())
            .collect(),
    )
}

/// Every leaf key of the schema, dotted.
fn schema_keys() -> BTreeSet<String> {
    fn walk(path: Vec<String>, out: &mut BTreeSet<String>) {
        match fields_at(&path) {
            Some(fields) => {
                for f in fields {
                    let mut p = path.clone();
                    p.push(f);
                    walk(p, out);
                }
            }
            None => {
                out.insert(path.join("."));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(Vec::new(), &mut out);
    out
}

fn table_keys() -> BTreeSet<String> {
    KEYS.iter().map(|k| k.key.to_string()).collect()
}

#[test]
fn every_schema_key_has_a_row_and_every_row_a_key() {
    let (schema, table) = (schema_keys(), table_keys());
    assert!(schema.len() > 100, "the probe read the schema: {schema:?}");
    let no_row: Vec<&String> = schema.difference(&table).collect();
    let no_key: Vec<&String> = table.difference(&schema).collect();
    assert!(
        no_row.is_empty(),
        "config keys without a row in shared/src/config/keys.rs (add one: how a resume, the \
         healthy record's recipe and a multi-node job treat it): {no_row:?}"
    );
    assert!(
        no_key.is_empty(),
        "rows in shared/src/config/keys.rs that name no config key (renamed or removed?): \
         {no_key:?}"
    );
}

/// Leaves of a TOML value: a table recurses, anything else (arrays of tables too) is a leaf.
fn leaves(prefix: &str, value: &toml::Value, out: &mut BTreeSet<String>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&path, v, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

#[test]
fn every_leaf_of_every_shipped_config_has_a_row() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut configs: Vec<(String, Config)> =
        vec![("embedded default".into(), Config::embedded_default())];
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let config = Config::from_toml_str(&text, &path.display().to_string())
                .unwrap_or_else(|e| panic!("{e}"));
            configs.push((path.display().to_string(), config));
        }
    }
    assert!(configs.len() >= 4, "{} configs", configs.len());
    let table = table_keys();
    for (name, config) in configs {
        let mut found = BTreeSet::new();
        leaves("", &toml::Value::try_from(&config).unwrap(), &mut found);
        let no_row: Vec<&String> = found.difference(&table).collect();
        assert!(no_row.is_empty(), "{name}: keys without a row: {no_row:?}");
    }
}
