//! What `config validate` learns by running `start`'s own setup code on the files the config
//! names, none of which loads a weight: the online prompt file and the target's stop tokens
//! (`setup::read_online_prompts`), chat data's tokenizer and chat template
//! (`setup::chat_encoder`), the data as training reads it (`setup::load_samples`) and the
//! memory plan (`setup::memory_plan_verdict`). Each refusal becomes a [`SetupRefusal`] of the
//! key `start` names, with `start`'s own reason, so validate lists it among the config's other
//! problems and refuses what `start` would refuse.
use std::path::Path;

use dflash_engine::model::target::TargetConfig;
use dflash_shared::config::{
    Config, ConfigFacts, DataFormat, SetupCheck, SetupRefusal, EMBEDDED_DATA,
};

use crate::runtime::memory_plan::{self, Devices};
use crate::runtime::setup::{self, MemoryPlanPolicy, MemoryPlanVerdict, SetupError, SetupInputs};

/// The config and what `config validate` already resolved of it.
pub(super) struct SetupFiles<'a> {
    pub config: &'a Config,
    pub config_path: &'a Path,
    pub run_dir: &'a Path,
    /// The target's directory; `None` for the embedded target.
    pub target_dir: Option<&'a Path>,
    /// The target's shapes from its `config.json`; `None` when it could not be read (`start`
    /// refuses such a target itself).
    pub target: Option<&'a TargetConfig>,
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
    // Without the target's config.json its directory is not here (a login node, another
    // machine's path): what is read from it is left to `start`, as the note on it says.
    let Some(target) = files.target else {
        notes.push(
            "the online prompt file, chat data's tokenizer and chat template, and the memory \
             plan are checked at start: the target's config.json was not read"
                .into(),
        );
        return;
    };
    // A missing prompt file is already a fact of its own (`missing_online_prompts`).
    if facts.missing_online_prompts.is_none() {
        online_prompts(&inputs, files.target_dir, target, facts);
    }
    // The data cannot be read without them, so neither can the memory plan's row length.
    if chat_files_read(&inputs, facts) {
        data_and_memory_plan(&inputs, target, facts, notes);
    }
}

/// `training.online_eval_prompts` read, parsed and tokenized for the target, and the target's
/// stop tokens read, as `start` reads them before the first step.
fn online_prompts(
    inputs: &SetupInputs<'_>,
    target_dir: Option<&Path>,
    target: &TargetConfig,
    facts: &mut ConfigFacts,
) {
    let Err(e) = setup::read_online_prompts(inputs, target_dir, target.vocab_size()) else {
        return;
    };
    // `start` names the stop tokens by the target's key: the file to fix is the target's.
    let check = match &e {
        SetupError::Path { key, .. } if *key == "target.model" => SetupCheck::StopTokens,
        _ => SetupCheck::OnlinePrompts,
    };
    facts
        .setup_refusals
        .extend(refusal(check, "training.online_eval_prompts", e));
}

/// Chat data's tokenizer and chat template, loaded as `start` loads them; `false` when the
/// data cannot be read for want of them.
fn chat_files_read(inputs: &SetupInputs<'_>, facts: &mut ConfigFacts) -> bool {
    let cfg = inputs.config;
    if cfg.data.format != DataFormat::Chat || cfg.data.train_file == EMBEDDED_DATA {
        return true;
    }
    if cfg.target.is_embedded() {
        // Refused already, by `data.format`: "embedded" names no directory to read them from.
        return false;
    }
    match setup::chat_encoder(inputs) {
        Ok(_) => true,
        Err(e) => {
            facts
                .setup_refusals
                .extend(refusal(SetupCheck::ChatFiles, "data.format", e));
            false
        }
    }
}

/// The data read as training reads it (its sample count replaces the line count), then the
/// memory plan at its p95 row length against the devices' memory, where that memory is known
/// without a GPU: `--gpu-memory-gib`, the host's for a CPU topology, else NVML.
fn data_and_memory_plan(
    inputs: &SetupInputs<'_>,
    target: &TargetConfig,
    facts: &mut ConfigFacts,
    notes: &mut Vec<String>,
) {
    let cfg = inputs.config;
    let devices = Devices::of(cfg, None);
    let memory = match memory_plan::device_memory(&devices, inputs.memory_plan.stated_gib) {
        Ok(memory) => memory,
        Err(why) => {
            // No figure is made up: without one the data is not read for the plan either.
            notes.push(format!(
                "the memory plan is not checked here: {why} (to `config validate` as to \
                 `start`); start checks it against the memory it finds and refuses a run \
                 predicted not to fit"
            ));
            return;
        }
    };
    let vocab = usize::try_from(target.vocab_size()).unwrap_or(0);
    let (samples, _, source) = match setup::load_samples(inputs, vocab) {
        Ok(loaded) => loaded,
        Err(e) => {
            facts
                .setup_refusals
                .extend(refusal(SetupCheck::Data, "data.train_file", e));
            return;
        }
    };
    facts.train_lines = Some(samples.len());
    match setup::memory_plan_verdict(cfg, devices, Ok(memory), target, &samples, &source) {
        MemoryPlanVerdict::Fits => {}
        MemoryPlanVerdict::NotChecked(why) => {
            notes.push(format!("the memory plan is not checked here: {why}"))
        }
        MemoryPlanVerdict::DoesNotFit(why) => facts.setup_refusals.push(SetupRefusal {
            check: SetupCheck::MemoryPlan,
            key: "topology".into(),
            why,
        }),
    }
}

/// `start`'s refusal as the key it names and its reason; `None` for a refusal of the config
/// alone, which validate's own checks report already.
fn refusal(check: SetupCheck, default_key: &str, e: SetupError) -> Option<SetupRefusal> {
    let (key, why) = match e {
        SetupError::AgainstData(_) => return None,
        SetupError::Path { key, detail, .. } => (key.to_string(), detail),
        SetupError::ConfigPath(e) => (e.key.to_string(), e.detail),
        other => (default_key.to_string(), other.to_string()),
    };
    Some(SetupRefusal { check, key, why })
}
