//! Semantic checks after the types parsed. Every rule names its key, the expectation and what
//! was found; all failures are collected so one run of `config validate` shows them all.
//!
//! One file per part of the config: the drafter's shape (`model`), the training signal and
//! schedule (`training`), the DFlash2 head (`dflash2`), the data and what can be learnt from
//! disk (`facts`), the daemon's own sections (`runtime`) and the detectors (`detectors`).
use std::collections::BTreeSet;

use super::error::ConfigIssue;
use super::Config;

mod detectors;
mod dflash2;
mod facts;
mod model;
mod runtime;
mod training;

pub(crate) use facts::{against_dataset, against_facts, online_prompts_for_another_target};
pub use facts::{ConfigFacts, InitFromMisfit, SetupCheck, SetupRefusal, TargetShape};

const MAX_RUN_NAME: usize = 64;

pub(crate) fn validate(c: &Config) -> Vec<ConfigIssue> {
    let mut v = Vec::new();
    run(c, &mut v);
    model::drafter(c, &mut v);
    dflash2::dflash2_head(c, &mut v);
    training::training(c, &mut v);
    training::online_eval(c, &mut v);
    facts::data(c, &mut v);
    runtime::topology(c, &mut v);
    runtime::runtime(c, &mut v);
    detectors::detectors(c, &mut v);
    runtime::tensorboard(c, &mut v);
    runtime::metrics(c, &mut v);
    runtime::nodes(c, &mut v);
    v
}

pub(super) fn positive(v: &mut Vec<ConfigIssue>, key: &str, value: usize) {
    if value == 0 {
        v.push(ConfigIssue::invalid(key, "a positive integer", value));
    }
}

pub(super) fn in_range(
    v: &mut Vec<ConfigIssue>,
    key: &str,
    value: f64,
    lo: f64,
    hi: f64,
    expected: &str,
) {
    if !(value.is_finite() && value >= lo && value <= hi) {
        v.push(ConfigIssue::invalid(key, expected, value));
    }
}

fn run(c: &Config, v: &mut Vec<ConfigIssue>) {
    let name = &c.run.name;
    let ok = !name.is_empty()
        && name.len() <= MAX_RUN_NAME
        && name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "._-".contains(ch));
    if !ok {
        v.push(
            ConfigIssue::invalid(
                "run.name",
                format!("1–{MAX_RUN_NAME} letters, digits, '.', '_' or '-'"),
                format!("\"{name}\""),
            )
            .with_hint("operators type the run name to confirm destructive actions"),
        );
    }
}

/// Legal but worth saying out loud at start and in `config validate`.
pub(crate) fn warnings(c: &Config) -> Vec<String> {
    let mut w = Vec::new();
    if c.training.epochs != 6 {
        w.push(format!(
            "training.epochs = {}: the DFlash recipe trains 6 full epochs",
            c.training.epochs
        ));
    }
    if let Some(steps) = c.training.max_steps {
        w.push(format!(
            "training.max_steps = {steps}: training stops there even if epochs remain"
        ));
    }
    let drafters: BTreeSet<_> = c
        .topology
        .drafter_devices
        .iter()
        .filter(|d| d.is_cuda())
        .collect();
    for d in c
        .topology
        .target_devices
        .iter()
        .filter(|d| drafters.contains(d))
    {
        w.push(format!("{d} is in both topology.target_devices and topology.drafter_devices: two workers share its memory"));
    }
    w
}
