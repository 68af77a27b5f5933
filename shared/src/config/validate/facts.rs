//! `[data]`, and the checks that need what only disk can tell: the data's sample count, the
//! target's shape, whether named files exist.
use super::in_range;
use crate::config::error::ConfigIssue;
use crate::config::sections::{DataFormat, EMBEDDED_DATA, EMBEDDED_PROMPTS};
use crate::config::Config;

/// What can only be judged once the data's sample count is known: the held-out count and the
/// batch size against it. `start` checks this after loading the data; `config validate` with
/// an upper bound of the count (the file's lines), so what it refuses `start` refuses too.
pub(crate) fn against_dataset(c: &Config, n_samples: usize) -> Vec<ConfigIssue> {
    let mut v = Vec::new();
    let d = &c.data;
    let held_out = d.held_out_count(n_samples);
    let held_out_key = if d.held_out_samples.is_some() {
        "data.held_out_samples"
    } else {
        "data.held_out_fraction"
    };
    if held_out >= n_samples {
        v.push(
            ConfigIssue::invalid(
                held_out_key,
                format!("fewer held-out samples than the {n_samples} samples of the data"),
                format!("{} held out", d.held_out_samples.unwrap_or(held_out)),
            )
            .with_hint("that leaves no sample to train on; hold out fewer"),
        );
        return v;
    }
    let train = n_samples - held_out;
    let batch = c.training.batch_size;
    if batch > train {
        v.push(
            ConfigIssue::invalid(
                "training.batch_size",
                format!("at most the {train} training samples ({n_samples} in the data, {held_out} held out)"),
                batch,
            )
            .with_hint(
                "every step would take the whole dataset, a handful of steps in all; pick a \
                 batch size well below the training sample count",
            ),
        );
    }
    v
}

/// The online evaluation's prompts must be of the target's vocabulary: the embedded prompts
/// only with the embedded target ([`embedded_prompts_on_another_target`]), and a prompt file
/// never with it (its token ids, or its chat turns, are of some other model's tokenizer; the
/// embedded target ships none). Judged where the target is (`config validate`, and `start`
/// before the first step), not when a config is parsed.
pub(crate) fn online_prompts_for_another_target(c: &Config) -> Option<ConfigIssue> {
    embedded_prompts_on_another_target(c).or_else(|| prompt_file_on_the_embedded_target(c))
}

fn prompt_file_on_the_embedded_target(c: &Config) -> Option<ConfigIssue> {
    let t = &c.training;
    let file = t
        .online_eval_prompts
        .as_deref()
        .filter(|p| *p != EMBEDDED_PROMPTS)?;
    (t.online_eval_interval() > 0 && c.target.is_embedded()).then(|| {
        ConfigIssue::invalid(
            "training.online_eval_prompts",
            format!("\"{EMBEDDED_PROMPTS}\" with the embedded target"),
            format!("\"{file}\""),
        )
        .with_hint(
            "a prompt file with the embedded target: use \"embedded\" (its held-out prompts), \
             or set training.online_eval_every = 0",
        )
    })
}

/// The embedded prompts are token ids of the embedded target's vocabulary: meaningless for
/// any other target. A copy of the embedded default pointed at a Hugging Face model is refused
/// for its model first, if that is what is wrong with it.
fn embedded_prompts_on_another_target(c: &Config) -> Option<ConfigIssue> {
    let t = &c.training;
    let embedded_prompts = t.online_eval_prompts.as_deref() == Some(EMBEDDED_PROMPTS);
    (embedded_prompts && t.online_eval_interval() > 0 && !c.target.is_embedded()).then(|| {
        ConfigIssue::invalid(
            "training.online_eval_prompts",
            "a JSONL prompt file for this target",
            format!("\"{EMBEDDED_PROMPTS}\""),
        )
        .with_hint(
            "the embedded prompts are token ids of the embedded target's vocabulary; name a \
             JSONL file of prompts (`input_ids` or chat `conversations`) for target.model, or \
             set training.online_eval_every = 0",
        )
    })
}

pub(super) fn data(c: &Config, v: &mut Vec<ConfigIssue>) {
    let d = &c.data;
    if d.train_file.trim().is_empty() {
        v.push(ConfigIssue::invalid(
            "data.train_file",
            "a JSONL path or \"embedded\"",
            "an empty string",
        ));
    }
    in_range(
        v,
        "data.held_out_fraction",
        d.held_out_fraction,
        0.0,
        0.5,
        "a fraction in [0, 0.5]",
    );
    // `start` refuses chat data on the embedded target whatever `data.tokenizer` says: chat
    // data is read with the target directory's tokenizer and template, and "embedded" names
    // no directory. The same target as files (tokenizer and chat template included) is one.
    let chat_file = d.format == DataFormat::Chat && d.train_file != EMBEDDED_DATA;
    if chat_file && c.target.is_embedded() {
        v.push(
            ConfigIssue::invalid(
                "data.format",
                "\"pretokenized\" with the embedded target",
                "\"chat\"",
            )
            .with_hint(
                "chat data is read with the target directory's tokenizer and chat template, and \
                 \"embedded\" names no directory: set target.model to the embedded target's \
                 files (assets/tiny/target in the repository, or RUN/target of any run on it), \
                 or use pre-tokenized data",
            ),
        );
    }
}

/// What `config validate` can learn from disk without loading weights; `None` where it could
/// not be learnt (the check is then left to `start`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigFacts {
    /// Non-blank lines of `data.train_file`, an upper bound of its sample count; or the
    /// sample count itself where `config validate` read the data as training reads it.
    pub train_lines: Option<usize>,
    /// `telemetry.python` as resolved, when it names no file.
    pub missing_python: Option<String>,
    /// `training.online_eval_prompts` as resolved, when online evaluation is on and it names
    /// no file.
    pub missing_online_prompts: Option<String>,
    /// The target's depth and vocabulary, from its `config.json` (or the embedded target).
    pub target: Option<TargetShape>,
    /// `drafter.init_from`, when it names no drafter directory `start` could read: why.
    pub init_from_unreadable: Option<String>,
    /// Where `drafter.init_from`'s drafter differs from the configured drafter and target:
    /// the check `start` makes before it loads a weight.
    pub init_from_misfits: Vec<InitFromMisfit>,
    /// What `start`'s own readers refused in the files the config names (the online prompt
    /// file, the target's stop tokens, chat data's tokenizer and template, the data) and what
    /// its memory plan refused, each run by `config validate` without loading a weight.
    pub setup_refusals: Vec<SetupRefusal>,
}

/// One refusal of `start`'s, met by `config validate` running the same code on the same files:
/// the key whose file or value is refused, and `start`'s reason, which says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupRefusal {
    pub check: SetupCheck,
    pub key: String,
    pub why: String,
}

/// Which of `start`'s checks refused, for what the key was expected to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupCheck {
    /// `training.online_eval_prompts`, read, parsed and tokenized for the target.
    OnlinePrompts,
    /// The target's `eos_token_id`, where the online evaluation stops generating.
    StopTokens,
    /// The tokenizer and chat template chat data is read with.
    ChatFiles,
    /// `data.train_file`, read as training reads it.
    Data,
    /// The memory plan against the devices' memory.
    MemoryPlan,
}

impl SetupCheck {
    fn expected(self) -> &'static str {
        match self {
            Self::OnlinePrompts => {
                "a prompt file start can read for this target (`input_ids` rows within its \
                 vocabulary, or chat rows and the target's tokenizer.json and chat template)"
            }
            Self::StopTokens => {
                "a target whose `eos_token_id` start can read (generation_config.json, else \
                 config.json)"
            }
            Self::ChatFiles => "a tokenizer.json and a chat template to read chat data with",
            Self::Data => "data start can train on",
            Self::MemoryPlan => {
                "devices with the memory this run needs (the memory plan start checks before \
                 it builds the drafter)"
            }
        }
    }

    fn issue(refusal: &SetupRefusal) -> ConfigIssue {
        // A multi-line reason (the memory plan's, one line per device and remedy) stays
        // readable inside validate's list of problems.
        let why = refusal.why.replace('\n', "\n    ");
        ConfigIssue::invalid(refusal.key.clone(), refusal.check.expected(), why)
    }
}

/// One difference between `drafter.init_from`'s drafter and the run's, as the engine's check
/// (`train/warm_start.rs`) names it: the run config key, both values, what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitFromMisfit {
    pub key: String,
    pub run: String,
    pub drafter: String,
    pub fix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetShape {
    pub num_layers: usize,
    pub vocab_size: u64,
    pub hidden_size: u64,
}

/// The checks of [`ConfigFacts`]: each is one `start` makes with the loaded target and data,
/// named here by the TOML key. A sample count is at most the line count, and the dataset rules
/// only get stricter as it shrinks, so what is refused on the lines `start` refuses too.
pub(crate) fn against_facts(c: &Config, f: &ConfigFacts) -> Vec<ConfigIssue> {
    let mut v = Vec::new();
    if let Some(lines) = f.train_lines {
        v.extend(against_dataset(c, lines));
    }
    if let Some(path) = &f.missing_python {
        v.push(
            ConfigIssue::invalid(
                "telemetry.python",
                "the path of an existing Python interpreter",
                format!("{path} (no such file)"),
            )
            .with_hint("fix the path, or remove the key to record no Python environment"),
        );
    }
    let mismatch = online_prompts_for_another_target(c);
    let mismatched = mismatch.is_some();
    v.extend(mismatch);
    // A file refused for the target is not also reported missing.
    if let Some(path) = f.missing_online_prompts.as_ref().filter(|_| !mismatched) {
        v.push(
            ConfigIssue::invalid(
                "training.online_eval_prompts",
                "an existing JSONL prompt file",
                format!("{path} (no such file)"),
            )
            .with_hint("fix the path, or set training.online_eval_every = 0"),
        );
    }
    if let Some(why) = &f.init_from_unreadable {
        v.push(
            ConfigIssue::invalid(
                "drafter.init_from",
                "a drafter directory (config.json and model.safetensors)",
                why,
            )
            .with_hint("fix the path, or remove the key to start from random weights"),
        );
    }
    for m in &f.init_from_misfits {
        v.push(
            ConfigIssue::invalid(
                m.key.clone(),
                format!("{} (the drafter of drafter.init_from)", m.drafter),
                &m.run,
            )
            .with_hint(m.fix.clone()),
        );
    }
    if let Some(t) = f.target {
        let d = &c.drafter;
        for (i, &id) in d.target_layer_ids.iter().enumerate() {
            if id >= t.num_layers {
                v.push(ConfigIssue::invalid(
                    format!("drafter.target_layer_ids[{i}]"),
                    format!(
                        "a layer of the target: 0..={}",
                        t.num_layers.saturating_sub(1)
                    ),
                    format!("{id} (the target has {} layers)", t.num_layers),
                ));
            }
        }
        if d.hidden_size as u64 != t.hidden_size {
            v.push(
                ConfigIssue::invalid(
                    "drafter.hidden_size",
                    format!("the target's hidden size, {}", t.hidden_size),
                    d.hidden_size,
                )
                .with_hint("the drafter reuses the target's embedding and LM head"),
            );
        }
        if u64::from(d.mask_token_id) >= t.vocab_size {
            v.push(
                ConfigIssue::invalid(
                    "drafter.mask_token_id",
                    format!(
                        "a token id of the target: 0..={}",
                        t.vocab_size.saturating_sub(1)
                    ),
                    format!(
                        "{} (the target's vocabulary has {})",
                        d.mask_token_id, t.vocab_size
                    ),
                )
                .with_hint("the mask token must be a row of the target's embedding"),
            );
        }
    }
    v.extend(f.setup_refusals.iter().map(SetupCheck::issue));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setup_refusal_is_an_issue_of_its_key_with_starts_reason_as_found() {
        let c = Config::embedded_default();
        let facts = ConfigFacts {
            setup_refusals: vec![
                SetupRefusal {
                    check: SetupCheck::StopTokens,
                    key: "target.model".into(),
                    why: "bad eos_token_id; fix it".into(),
                },
                SetupRefusal {
                    check: SetupCheck::MemoryPlan,
                    key: "topology".into(),
                    why: "does not fit:\n  cpu: needs 2 GiB".into(),
                },
            ],
            ..ConfigFacts::default()
        };
        let issues = against_facts(&c, &facts);
        let texts: Vec<String> = issues.iter().map(ToString::to_string).collect();
        assert_eq!(issues[0].key, "target.model");
        assert!(
            texts[0].contains("expected a target whose `eos_token_id` start can read")
                && texts[0].ends_with("found bad eos_token_id; fix it"),
            "{}",
            texts[0]
        );
        assert_eq!(issues[1].key, "topology");
        assert!(
            texts[1].ends_with("found does not fit:\n      cpu: needs 2 GiB"),
            "{}",
            texts[1]
        );
    }

    #[test]
    fn a_prompt_file_with_the_embedded_target_is_refused_as_start_refuses_it_and_not_also_missing()
    {
        let mut c = Config::embedded_default();
        assert_eq!(online_prompts_for_another_target(&c), None);
        c.training.online_eval_prompts = Some("prompts.jsonl".into());
        let issue = online_prompts_for_another_target(&c).expect("refused");
        let text = issue.to_string();
        assert!(
            text.contains("training.online_eval_prompts")
                && text.contains("a prompt file with the embedded target: use \"embedded\""),
            "{text}"
        );
        assert!(c.check_online_prompts().is_err(), "start refuses it too");
        let facts = ConfigFacts {
            missing_online_prompts: Some("prompts.jsonl".into()),
            ..ConfigFacts::default()
        };
        assert_eq!(against_facts(&c, &facts), [issue], "one issue, not two");
        // With the online evaluation off, the prompts are never read.
        c.training.online_eval_every = Some(0);
        assert_eq!(online_prompts_for_another_target(&c), None);
    }
}
