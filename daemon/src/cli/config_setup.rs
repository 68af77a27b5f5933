//! What `config validate` learns by running `start`'s own checks ([`setup::run_checks`]) on
//! the files the config names, none of which loads a weight: the devices, the target's
//! `config.json`, the warm-start drafter, chat data's tokenizer and chat template, the data as
//! training reads it, the memory plan, the online prompt file and the target's stop tokens.
//! Its sink lists each refusal as a [`SetupRefusal`] of the key `start` names, with `start`'s
//! own reason, and goes on with the checks that do not depend on it; what this machine cannot
//! check (a GPU it does not have, memory it cannot read) becomes a note left to `start`.
use std::path::Path;

use dflash_shared::config::{Config, ConfigFacts, SetupCheck, SetupRefusal};

use crate::runtime::setup::{
    self, CheckSink, CheckStep, MemoryPlanPolicy, SetupError, SetupInputs,
};

/// The config and what `config validate` already resolved of it.
pub(super) struct SetupFiles<'a> {
    pub config: &'a Config,
    pub config_path: &'a Path,
    pub run_dir: &'a Path,
    /// `--gpu-memory-gib`, as `start` takes it.
    pub gpu_memory_gib: Option<f64>,
}

/// Runs `start`'s checks, adding its refusals to `facts` and, for a check that could not run
/// here, a note saying it is left to `start`.
pub(super) fn check(files: &SetupFiles<'_>, facts: &mut ConfigFacts, notes: &mut Vec<String>) {
    let inputs = SetupInputs {
        config: files.config,
        config_path: Some(files.config_path),
        run_dir: files.run_dir,
        device_override: None,
        unlocked_keys: Vec::new(),
        // Nothing is built or restored: only the files are read.
        resume: None,
        memory_plan: MemoryPlanPolicy {
            stated_gib: files.gpu_memory_gib,
            ignore: false,
        },
        cpu_peak_flops: None,
    };
    let mut sink = ValidateSink {
        config: files.config,
        facts,
        notes,
    };
    // This sink never stops the checks: every refusal is in `facts` when they return.
    let _startable = setup::run_checks(&inputs, &mut sink);
}

/// `config validate`'s sink: every refusal listed, never a stop.
struct ValidateSink<'a> {
    config: &'a Config,
    facts: &'a mut ConfigFacts,
    notes: &'a mut Vec<String>,
}

impl CheckSink for ValidateSink<'_> {
    fn refused(&mut self, step: CheckStep, error: SetupError) -> Result<(), SetupError> {
        let check = match step {
            // The devices are the machine's, not the config's: validate may run on a login
            // node for a GPU box.
            CheckStep::Devices => {
                self.notes.push(format!(
                    "the devices are checked at start, on the machine that trains: {error}"
                ));
                return Ok(());
            }
            // Validate reports these from its own reading of the same files, key by key:
            // the target's shapes, `drafter.init_from` and the config against the data.
            CheckStep::Target => {
                self.notes.push(
                    "the online prompt file, chat data's tokenizer and chat template, the data \
                     and the memory plan are checked at start: the target's config.json was \
                     not read"
                        .into(),
                );
                return Ok(());
            }
            CheckStep::WarmStart | CheckStep::AgainstData => return Ok(()),
            // Refused already, by `data.format`: "embedded" names no directory to read them
            // from.
            CheckStep::ChatFiles if self.config.target.is_embedded() => return Ok(()),
            CheckStep::ChatFiles => SetupCheck::ChatFiles,
            CheckStep::Data => SetupCheck::Data,
            CheckStep::MemoryPlan => SetupCheck::MemoryPlan,
            // A missing prompt file is already a fact of its own (`missing_online_prompts`).
            CheckStep::OnlinePrompts if self.facts.missing_online_prompts.is_some() => {
                return Ok(())
            }
            // `start` names the stop tokens by the target's key: the file to fix is the
            // target's.
            CheckStep::OnlinePrompts => match &error {
                SetupError::Path { key, .. } if *key == "target.model" => SetupCheck::StopTokens,
                _ => SetupCheck::OnlinePrompts,
            },
        };
        self.facts.setup_refusals.extend(refusal(check, error));
        Ok(())
    }

    fn samples_read(&mut self, count: usize) {
        // The samples as training reads them replace the line count, so the config is judged
        // against the data as start judges it.
        self.facts.train_lines = Some(count);
    }

    fn not_checked(&mut self, step: CheckStep, why: String) {
        let what = match step {
            CheckStep::MemoryPlan => "the memory plan",
            _ => "a check",
        };
        self.notes.push(format!(
            "{what} is not checked here: {why} (to `config validate` as to `start`); start \
             checks it against the memory it finds and refuses a run predicted not to fit"
        ));
    }
}

/// `start`'s refusal as the key it names and its reason; `None` for a refusal of the config
/// alone, which validate's own checks report already.
fn refusal(check: SetupCheck, e: SetupError) -> Option<SetupRefusal> {
    let default_key = match check {
        SetupCheck::OnlinePrompts | SetupCheck::StopTokens => "training.online_eval_prompts",
        SetupCheck::ChatFiles => "data.format",
        SetupCheck::Data => "data.train_file",
        SetupCheck::MemoryPlan => "topology",
    };
    let (key, why) = match e {
        SetupError::AgainstData(_) => return None,
        SetupError::Path { key, detail, .. } => (key.to_string(), detail),
        SetupError::ConfigPath(e) => (e.key.to_string(), e.detail),
        SetupError::MemoryPlan(why) => ("topology".to_string(), why),
        other => (default_key.to_string(), other.to_string()),
    };
    Some(SetupRefusal { check, key, why })
}
