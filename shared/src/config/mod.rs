//! The TOML run config: schema, defaults, validation and locked keys.
//!
//! [`Config::from_toml_str`] parses, fills derived defaults and validates; every error names
//! the key path and line, what was expected and what was found, and suggests the right key for
//! an unknown one. [`Config::to_toml_string`] prints the effective config (`config show`).
pub mod bytesize;
pub mod daemon_sections;
pub mod device;
pub mod dflash2;
pub mod dspark;
mod error;
pub mod keys;
mod locate;
pub mod locked;
pub mod paths;
pub mod recipe;
pub mod sections;
pub mod tree_objective;
mod validate;

pub use validate::{ConfigFacts, InitFromMisfit, SetupCheck, SetupRefusal, TargetShape};

use serde::{Deserialize, Serialize};

pub use bytesize::ByteSize;
pub use daemon_sections::{
    parse_metrics_listen, CacheDirConfig, ControlSection, DetectorsSection, MetricsSection,
    NodesSection, QueueSection, TelemetrySection, TensorboardSection, DEFAULT_HEARTBEAT_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS, HEARTBEAT_TIMEOUT_RANGE_S, MAX_CONNECTIONS_RANGE,
    METRICS_LISTEN_EXPECTED,
};
pub use device::{Device, DeviceParseError};
pub use error::{ConfigError, ConfigIssue, Problem};
pub use locked::{
    is_locked_key, locked_key_changes, unlock_refusal, LockedKeyChange, LOCKED_KEYS,
    UNLOCKABLE_KEYS,
};
pub use paths::{expand_path, PathContext, PathTemplateError};
pub use sections::{
    paper_loss_decay_gamma, AttentionBackend, DataFormat, DataSection, DpaceNormalization,
    DrafterHead, DrafterSection, Dtype, LabelMask, LayerType, Objective, Precision, RunSection,
    TargetSection, TopologySection, TrainingSection, DEFAULT_DPACE_ALPHA,
    DEFAULT_LAMBDA_BASE_DECAY_RATIO, DEFAULT_LAMBDA_BASE_START, DEFAULT_ONLINE_EVAL_EVERY,
    DEFAULT_SERVE_TREE_BUDGET, DEFAULT_TREE_BUDGETS, EMBEDDED, EMBEDDED_DATA, EMBEDDED_PROMPTS,
};

pub use dflash2::{
    Dflash2Section, DEFAULT_CONV_GROUP_SIZE, DEFAULT_CONV_KERNEL_SIZE, DEFAULT_SELECTOR_LOSS_ALPHA,
    DEFAULT_SELECTOR_RANK, DEFAULT_SELECTOR_TOP_K,
};
pub use dspark::{DsparkSection, MarkovHeadType, DEFAULT_MARKOV_RANK};
pub use tree_objective::{TreeLoss, TreeSection, DEFAULT_TREE_TEMPERATURE};

use error::{closest, translate_serde_message, Translated};
use locate::SourceMap;

/// The built-in tiny CPU configuration `dflashd start` uses without `--config`.
pub const EMBEDDED_DEFAULT_TOML: &str = include_str!("../../../configs/tiny-cpu.toml");
/// How errors in [`EMBEDDED_DEFAULT_TOML`] name their origin.
pub const EMBEDDED_ORIGIN: &str = "<embedded default>";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub run: RunSection,
    pub target: TargetSection,
    pub drafter: DrafterSection,
    #[serde(default)]
    pub training: TrainingSection,
    pub data: DataSection,
    pub topology: TopologySection,
    #[serde(default)]
    pub queue: QueueSection,
    #[serde(default)]
    pub telemetry: TelemetrySection,
    #[serde(default)]
    pub control: ControlSection,
    #[serde(default)]
    pub detectors: DetectorsSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub tensorboard: TensorboardSection,
    /// Absent from every config written before issue 23's heartbeat: the default then.
    #[serde(default)]
    pub nodes: NodesSection,
}

impl Config {
    /// Parses, fills derived defaults and validates. `origin` names the file in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let map = SourceMap::parse(text).map_err(|e| syntax_error(text, &e, origin))?;
        let mut config: Config = toml::from_str(text).map_err(|e| ConfigError {
            origin: origin.into(),
            issues: vec![deserialize_issue(&map, &e)],
        })?;
        config.fill_derived_defaults();
        let mut issues = validate::validate(&config);
        if issues.is_empty() {
            return Ok(config);
        }
        for issue in &mut issues {
            issue.line = map.line_of_path(&issue.key);
        }
        Err(ConfigError {
            origin: origin.into(),
            issues,
        })
    }

    /// The embedded tiny CPU default. It is validated by the test suite.
    pub fn embedded_default() -> Self {
        Self::from_toml_str(EMBEDDED_DEFAULT_TOML, EMBEDDED_ORIGIN).unwrap_or_else(|e| {
            panic!("the embedded default config is invalid (a build defect): {e}")
        })
    }

    /// Validates a config built or changed in code (line numbers are unknown here).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let issues = validate::validate(self);
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError {
                origin: "<config>".into(),
                issues,
            })
        }
    }

    /// Checks the held-out count and the batch size against a dataset of `n_samples`
    /// ([`validate::against_dataset`]); the error names the TOML key.
    pub fn check_against_dataset(&self, n_samples: usize) -> Result<(), ConfigError> {
        let issues = validate::against_dataset(self, n_samples);
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError {
                origin: "<config>".into(),
                issues,
            })
        }
    }

    /// `config validate`'s checks against what it read from disk ([`ConfigFacts`]), with the
    /// lines of `text` (the file this config was parsed from) on each issue.
    pub fn check_facts(
        &self,
        facts: &ConfigFacts,
        text: &str,
        origin: &str,
    ) -> Result<(), ConfigError> {
        let mut issues = validate::against_facts(self, facts);
        if issues.is_empty() {
            return Ok(());
        }
        if let Ok(map) = SourceMap::parse(text) {
            for issue in &mut issues {
                issue.line = map.line_of_path(&issue.key);
            }
        }
        Err(ConfigError {
            origin: origin.into(),
            issues,
        })
    }

    /// What `start` checks of the online evaluation once it knows the target is the one the
    /// config names: the embedded prompts only with the embedded target, and a prompt file
    /// never with it (`config validate` checks it too).
    pub fn check_online_prompts(&self) -> Result<(), ConfigError> {
        match validate::online_prompts_for_another_target(self) {
            None => Ok(()),
            Some(issue) => Err(ConfigError {
                origin: "<config>".into(),
                issues: vec![issue],
            }),
        }
    }

    /// Non-fatal remarks for the start log and `config validate`.
    pub fn warnings(&self) -> Vec<String> {
        validate::warnings(self)
    }

    /// The effective config, every default filled in; parses back to an equal `Config`.
    pub fn to_toml_string(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print this config: {e}\n"))
    }

    /// γ of the per-position loss weights, after defaults (validation guarantees one).
    pub fn loss_decay_gamma(&self) -> f64 {
        self.training
            .loss_decay_gamma
            .or_else(|| paper_loss_decay_gamma(self.drafter.block_size))
            .unwrap_or(7.0)
    }

    fn fill_derived_defaults(&mut self) {
        if self.drafter.layer_types.is_empty() {
            self.drafter.layer_types = vec![LayerType::FullAttention; self.drafter.num_layers];
        }
        if self.training.loss_decay_gamma.is_none() {
            self.training.loss_decay_gamma = paper_loss_decay_gamma(self.drafter.block_size);
        }
        let t = &mut self.training;
        if t.online_eval_prompts.is_none() && self.target.is_embedded() {
            t.online_eval_prompts = Some(EMBEDDED_PROMPTS.into());
        }
        if t.online_eval_every.is_none() && t.online_eval_prompts.is_some() {
            t.online_eval_every = Some(DEFAULT_ONLINE_EVAL_EVERY);
        }
    }

    /// Every key path a config can have, for suggestions: the key table's leaves and the
    /// sections above them.
    fn known_keys() -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for row in keys::KEYS {
            let mut at = 0;
            while let Some(dot) = row.key[at..].find('.') {
                at += dot;
                keys.push(row.key[..at].to_string());
                at += 1;
            }
            keys.push(row.key.to_string());
        }
        keys.sort();
        keys.dedup();
        keys
    }
}

fn syntax_error(text: &str, e: &toml::de::Error, origin: &str) -> ConfigError {
    let map_offsets = |offset: usize| {
        let offset = offset.min(text.len());
        let line = text[..offset].matches('\n').count() + 1;
        let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
        (line, text[line_start..offset].chars().count() + 1)
    };
    let (mut line, mut column) = e.span().map_or((1, 1), |s| map_offsets(s.start));
    let mut message = e.message().trim().replace('\n', "; ");
    // An array left open (a missing `]` or `,`) is noticed only at the next line's first
    // token: name the line where the array opens, and say where the parser stopped.
    if let Some(open) = e
        .span()
        .and_then(|s| locate::unclosed_array_at(text, s.start))
    {
        let (open_line, open_column) = map_offsets(open);
        if open_line < line {
            message = format!(
                "{message} (in the array opened here, read up to line {line}, column \
                 {column}: a `,` or the closing `]` is missing)"
            );
            (line, column) = (open_line, open_column);
        }
    }
    ConfigError {
        origin: origin.into(),
        issues: vec![ConfigIssue {
            key: String::new(),
            line: Some(line),
            problem: Problem::Syntax { column, message },
        }],
    }
}

fn deserialize_issue(map: &SourceMap<'_>, e: &toml::de::Error) -> ConfigIssue {
    let (path, line) = e.span().map(|s| map.path_at(&s)).unwrap_or_default();
    match translate_serde_message(e.message()) {
        Translated::UnknownKey { key, allowed } => {
            let suggestion = closest(&key, allowed.iter().map(String::as_str))
                .map(|s| format!("`{s}`"))
                .or_else(|| elsewhere(&key));
            ConfigIssue {
                key: path,
                line,
                problem: Problem::UnknownKey { suggestion },
            }
        }
        Translated::Missing { key } => {
            let full = if path.is_empty() {
                key
            } else {
                format!("{path}.{key}")
            };
            let expected = expected_for_missing(&full);
            ConfigIssue {
                key: full,
                line,
                problem: Problem::Missing { expected },
            }
        }
        Translated::Invalid {
            expected,
            found,
            hint,
        } => ConfigIssue {
            key: path,
            line,
            problem: Problem::Invalid {
                expected,
                found,
                hint,
            },
        },
    }
}

/// A key that exists, under the same name, in another section: "`training.num_anchors`".
fn elsewhere(key: &str) -> Option<String> {
    let found = Config::known_keys()
        .into_iter()
        .find(|k| k.rsplit('.').next() == Some(key))?;
    Some(match found.rsplit_once('.') {
        Some((section, _)) => format!("`{found}` (it belongs in [{section}])"),
        None => format!("the top-level [{found}] table"),
    })
}

fn expected_for_missing(key: &str) -> String {
    let known = match key {
        "run" | "target" | "drafter" | "data" | "topology" => return format!("a [{key}] table"),
        "run.name" => "a run name (letters, digits, '.', '_', '-')",
        "target.model" => "a Hugging Face checkpoint directory or \"embedded\"",
        "drafter.mask_token_id" => "the target tokenizer's mask token id",
        "drafter.target_layer_ids" => "a list of target layer ids, e.g. [1, 16, 31, 46, 61]",
        "data.train_file" => "a JSONL file path or \"embedded\"",
        "topology.target_devices" | "topology.drafter_devices" => {
            "a list of devices, e.g. [\"cuda:0\"] or [\"cpu\"]"
        }
        "telemetry.caches.name" | "telemetry.caches.path" => "a string",
        k if k.starts_with("drafter.") => "a positive integer",
        _ => "a value",
    };
    known.to_string()
}
