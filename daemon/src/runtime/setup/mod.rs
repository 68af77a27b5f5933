//! From a validated run config to a ready [`Trainer`]: device, target, data, drafter, resume.
//!
//! `target.model = "embedded"` and `data.train_file = "embedded"` select the built-in tiny
//! target (saved to `<run_dir>/target` on first use) and the dataset compiled into the binary;
//! anything else is a path, `~` expanded, relative paths taken from the config file's
//! directory. Every failure names the file or key and what was wrong.
use std::path::{Path, PathBuf};

use dflash_shared::config::{self, Config, DataFormat as CfgFormat};
use tch::Device;
use thiserror::Error;

use super::launch_nodes::NodeJob;
use crate::run::paths::{resolve_path, ConfigPathError};
use dflash_engine::data::{
    load, load_chat_template, load_stop_tokens, load_tokenizer, read_prompt_rows, tokenize_prompts,
    ChatEncoder, ChatOptions, DataError, DataFormat, LoadOptions, LoadReport, PromptRow, Sample,
};
use dflash_engine::device::{self, compute_kind};
use dflash_engine::embedded;
use dflash_engine::model::error::ModelError;
use dflash_engine::model::target::TargetModel;
use dflash_engine::train::online_prompts::OnlinePrompts;
use dflash_engine::train::topology::TopologySpec;
use dflash_engine::train::unlocked::UnlockedKeys;
use dflash_engine::train::warm_start::WarmStart;
use dflash_engine::train::TrainError;
use dflash_engine::train::{Trainer, TrainerSpec};

use dflash_shared::run_dir::DATA_REPORT_FILE_NAME;

#[derive(Debug, Error)]
pub enum SetupError {
    #[error("device {name}: {detail}")]
    Device { name: String, detail: String },
    #[error("{key} = {value:?}: {detail}")]
    Path {
        key: &'static str,
        value: String,
        detail: String,
    },
    #[error(transparent)]
    ConfigPath(#[from] ConfigPathError),
    #[error(
        "loading the target model {path} (target.model): {cause}. target.model must name a \
         Hugging Face model directory (config.json, tokenizer.json, *.safetensors), or \
         \"embedded\" for the built-in tiny model"
    )]
    Target {
        path: PathBuf,
        cause: Box<ModelError>,
    },
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("{0}. Fix the config and start again (nothing was trained)")]
    AgainstData(dflash_shared::config::ConfigError),
    #[error("data.train_file {path}: no usable sample ({summary})")]
    NoSamples { path: String, summary: String },
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The memory plan predicts a device over capacity (the text is the whole refusal).
    #[error("{0}")]
    MemoryPlan(String),
    #[error("writing {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// By hand rather than `#[from]`, which would also make the config error the `source()` of a
/// message that already prints it (an error chain would print it twice).
impl From<dflash_shared::config::ConfigError> for SetupError {
    fn from(e: dflash_shared::config::ConfigError) -> Self {
        Self::AgainstData(e)
    }
}

/// What the daemon needs besides the config.
#[derive(Debug, Clone)]
pub struct SetupInputs<'a> {
    pub config: &'a Config,
    /// The config file, for relative paths; `None` for the embedded default.
    pub config_path: Option<&'a Path>,
    pub run_dir: &'a Path,
    /// `--device`, overriding the topology's first drafter device.
    pub device_override: Option<config::Device>,
    /// Locked keys (dotted paths) an operator's unlock lets differ from the checkpoint.
    pub unlocked_keys: Vec<String>,
    /// The checkpoint to resume from, as the start's checkpoint gate chose it (for a node of a
    /// job, the step every node agreed on). `None` begins the run at step 0: only then does
    /// `drafter.init_from` load.
    pub resume: Option<PathBuf>,
    pub memory_plan: MemoryPlanPolicy,
    /// `--cpu-peak-flops` (`DFLASH_CPU_PEAK_FLOPS`): the CPU's MFU peak, FLOP/s, given instead
    /// of timed at start (journaled as given, not measured).
    pub cpu_peak_flops: Option<f64>,
}

/// How `start` treats the memory plan.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemoryPlanPolicy {
    /// `--gpu-memory-gib`: each device's memory, instead of NVML or the host's.
    pub stated_gib: Option<f64>,
    /// `--ignore-memory-plan`: start even when predicted not to fit (journaled).
    pub ignore: bool,
}

/// A node of a multi-node job: what [`prepare`] builds the trainer as one node of.
pub struct NodeOfJob<'a> {
    pub job: &'a NodeJob,
    /// Where the node's threads journal: the checkpoint witness the nodes' agreement after
    /// every checkpoint, the heartbeat judge a silent peer.
    pub journal: Box<dyn Fn(dflash_shared::events::Severity, String) + Send>,
}

pub struct Prepared {
    pub trainer: Trainer,
    /// Drafter rank 0's device (the only device when the topology runs inline).
    pub device: Device,
    /// The data file as the config names it ("embedded:…" for the built-in set).
    pub data_source: String,
    pub report: LoadReport,
    /// The checkpoint the trainer resumed from.
    pub resumed_from: Option<PathBuf>,
    /// Devices of the topology this build does not drive (one sentence), if any.
    pub topology_note: Option<String>,
    /// What the memory plan said, when it is worth a journal line (an override, no figure).
    pub memory_plan_note: Option<String>,
    /// Where each device's MFU peak comes from (measured, a datasheet, or none).
    pub peak_notes: Vec<String>,
    /// The work a token costs on this data, for the healthy record's like-with-like figure.
    pub throughput_basis: Option<dflash_shared::health::healthy_record::ThroughputBasis>,
    /// What `drafter.init_from` loaded (a fresh start with the key set), for the journal and
    /// the banner.
    pub warm_start: Option<WarmStart>,
}

mod checks;

pub use checks::{check, run_checks, CheckSink, CheckStep, Checked};

/// Builds the trainer `inputs` describe ([`check`], then [`build`]).
pub fn prepare(
    inputs: &SetupInputs<'_>,
    node: Option<NodeOfJob<'_>>,
) -> Result<Prepared, SetupError> {
    let checked = check(inputs)?;
    build(inputs, node, checked)
}

/// Loads the target's weights and builds the trainer of a [`check`]ed run: its data report
/// written, the warm start loaded or the checkpoint restored.
pub fn build(
    inputs: &SetupInputs<'_>,
    node: Option<NodeOfJob<'_>>,
    checked: Checked,
) -> Result<Prepared, SetupError> {
    let cfg = inputs.config;
    let Checked {
        topology,
        topology_note,
        target_dir,
        target_config,
        drafter_cfg,
        warm_start_source,
        samples,
        report,
        data_source,
        memory_plan_note,
        throughput_basis,
        train_cfg,
        online_prompts,
    } = checked;
    let device = topology.drafter_devices[0];
    let target_device = topology.target_devices[0];
    let target = match &target_dir {
        None => embedded::tiny_target(Some(inputs.run_dir), target_device)?,
        Some(dir) => TargetModel::load(dir, target_device, Some(compute_kind(target_device)))
            .map_err(|source| SetupError::Target {
                path: dir.clone(),
                cause: Box::new(source),
            })?,
    };
    debug_assert_eq!(target.config(), &target_config);
    let report_path = inputs.run_dir.join(DATA_REPORT_FILE_NAME);
    let bytes = serde_json::to_vec_pretty(&report.to_json(&data_source));
    bytes
        .map_err(std::io::Error::other)
        .and_then(|b| dflash_engine::files::atomic_write::write_atomic(&report_path, &b))
        .map_err(|source| SetupError::Io {
            path: report_path,
            cause: source,
        })?;
    let (device_peaks, peak_notes) = crate::runtime::device_peaks::for_devices(
        &topology.devices(),
        device::compute_kind,
        inputs.cpu_peak_flops,
    );
    // The straggler bar is this node's (`[detectors]` is node-local): the health feed's
    // detector counts the steps of the view it names stragglers in.
    let job = match node {
        Some(node) => Some(node.job.membership(
            &topology.drafter_devices,
            train_cfg.training.grad_accum,
            cfg.detectors.straggler.behind_frac,
            node.journal,
        )?),
        None => None,
    };
    let mut trainer = Trainer::build(TrainerSpec {
        device_peaks,
        online_prompts,
        job,
        ..TrainerSpec::new(target, drafter_cfg, samples, train_cfg, topology)
    })?;
    let warm_start = match &warm_start_source {
        Some(source) => Some(trainer.init_drafter_from(source)?),
        None => None,
    };
    let unlocked = UnlockedKeys::from_keys(&inputs.unlocked_keys);
    if let Some(dir) = &inputs.resume {
        trainer.restore_checkpoint_unlocked(dir, &unlocked)?;
    }
    Ok(Prepared {
        trainer,
        device,
        data_source,
        report,
        resumed_from: inputs.resume.clone(),
        topology_note,
        memory_plan_note,
        peak_notes,
        throughput_basis,
        warm_start,
    })
}

/// How every refusal of the online evaluation's inputs ends: the way out that needs no file.
const WITHOUT_ONLINE_EVAL: &str =
    "or set training.online_eval_every = 0 to train without online evaluation";

/// The online evaluation's prompt file (resolved) and its prompts with the target's stop
/// tokens, as `start` reads them before the first step; `(None, None)` when there is no
/// online evaluation. `config validate` runs this same reader with the vocabulary of the
/// target's `config.json` (no weight loaded), so it refuses every prompt file and stop token
/// `start` refuses, in the same words.
fn read_online_prompts(
    inputs: &SetupInputs<'_>,
    target_dir: Option<&Path>,
    vocab: i64,
) -> Result<(Option<String>, Option<OnlinePrompts>), SetupError> {
    inputs.config.check_online_prompts()?;
    let path = online_eval_prompts(inputs)?;
    let prompts = load_online_prompts(inputs.config, path.as_deref(), target_dir, vocab)?;
    Ok((path, prompts))
}

/// `training.online_eval_prompts` as the engine reads it: `"embedded"` as it is, a file
/// resolved like `data.train_file` (relative to the config) and refused at start when it is
/// not there, rather than at the first online evaluation. Off (`online_eval_every = 0`), the
/// key is passed on unread.
fn online_eval_prompts(inputs: &SetupInputs) -> Result<Option<String>, SetupError> {
    const KEY: &str = "training.online_eval_prompts";
    let training = &inputs.config.training;
    let prompts = training.online_eval_prompts.clone();
    let Some(value) = prompts.as_deref() else {
        return Ok(None);
    };
    if training.online_eval_interval() == 0 || value == config::EMBEDDED_PROMPTS {
        return Ok(prompts);
    }
    let path = resolve_path(KEY, value, inputs.config_path, inputs.run_dir)?;
    if !path.is_file() {
        return Err(SetupError::Path {
            key: KEY,
            value: value.into(),
            detail: format!(
                "{} is not a file; name a JSONL file of prompts (`input_ids` or chat \
                 `conversations`), {WITHOUT_ONLINE_EVAL}",
                path.display()
            ),
        });
    }
    Ok(Some(path.display().to_string()))
}

/// The online evaluation's prompts and stop tokens (`None` when online evaluation is off):
/// the embedded held-out set, which ends at the tiny target's end of turn, or the prompt file
/// at `prompts` (`input_ids` rows, or chat rows rendered with the target directory's tokenizer
/// and chat template) with the stop tokens of the target's `generation_config.json`.
fn load_online_prompts(
    cfg: &Config,
    prompts: Option<&str>,
    target_dir: Option<&Path>,
    vocab: i64,
) -> Result<Option<OnlinePrompts>, SetupError> {
    const KEY: &str = "training.online_eval_prompts";
    let Some(value) = prompts else {
        return Ok(None);
    };
    if cfg.training.online_eval_interval() == 0 {
        return Ok(None);
    }
    let refused = |detail: String| SetupError::Path {
        key: KEY,
        value: value.into(),
        detail,
    };
    if value == config::EMBEDDED_PROMPTS {
        return Ok(Some(OnlinePrompts {
            prompts: embedded::tiny_heldout_prompts(),
            stop_tokens: vec![embedded::TINY_END_OF_TURN],
        }));
    }
    let Some(target_dir) = target_dir else {
        return Err(refused(
            "a prompt file with the embedded target: use \"embedded\" (its held-out prompts)"
                .into(),
        ));
    };
    let path = Path::new(value);
    let rows =
        read_prompt_rows(path).map_err(|e| refused(format!("{e}; {WITHOUT_ONLINE_EVAL}")))?;
    let has_chat = rows
        .rows
        .iter()
        .any(|(_, row)| matches!(row, PromptRow::Chat(_)));
    let encoder = if has_chat {
        Some(
            ChatEncoder::from_model_dir(target_dir, None, ChatOptions::default()).map_err(|e| {
                refused(format!(
                    "chat prompts are rendered with the target's tokenizer.json and chat \
                     template: {e}; give the target directory both, give input_ids prompts, \
                     {WITHOUT_ONLINE_EVAL}"
                ))
            })?,
        )
    } else {
        None
    };
    let prompts = tokenize_prompts(path, rows, encoder.as_ref(), vocab)
        .map_err(|e| refused(format!("{e}; {WITHOUT_ONLINE_EVAL}")))?;
    // Named by the target's key: the file to fix is the target's, not the prompts.
    let stop = load_stop_tokens(target_dir).map_err(|e| SetupError::Path {
        key: "target.model",
        value: cfg.target.model.clone(),
        detail: format!(
            "the online evaluation (training.online_eval_prompts) stops at the target's \
             `eos_token_id`, which start cannot read: {e}; fix `eos_token_id` there (a token id \
             or a list of them, as transformers reads it), {WITHOUT_ONLINE_EVAL}"
        ),
    })?;
    Ok(Some(OnlinePrompts {
        prompts: prompts.into_iter().map(|p| p.input_ids).collect(),
        stop_tokens: stop.ids,
    }))
}

/// The config's data as training reads it (chat rows with the tokenizer and template it
/// names), for `dflashd plan`'s row lengths.
pub fn read_training_data(
    inputs: &SetupInputs<'_>,
    vocab: usize,
) -> Result<(Vec<Sample>, LoadReport, String), SetupError> {
    let encoder = chat_encoder_of_data(inputs)?;
    load_samples(inputs, vocab, encoder.as_ref())
}

/// The encoder chat data is read with; `None` for pre-tokenized data and the embedded set.
fn chat_encoder_of_data(inputs: &SetupInputs<'_>) -> Result<Option<ChatEncoder>, SetupError> {
    let data = &inputs.config.data;
    if data.train_file == config::EMBEDDED_DATA || data.format == CfgFormat::Pretokenized {
        return Ok(None);
    }
    chat_encoder(inputs).map(Some)
}

/// The samples of the config's data (`data.train_file`), as training reads them, chat rows
/// with `encoder`.
fn load_samples(
    inputs: &SetupInputs<'_>,
    vocab: usize,
    encoder: Option<&ChatEncoder>,
) -> Result<(Vec<Sample>, LoadReport, String), SetupError> {
    let cfg = inputs.config;
    let max_len = cfg.training.max_length;
    if cfg.data.train_file == config::EMBEDDED_DATA {
        let (samples, report) = embedded::tiny_samples(vocab as i64, max_len)?;
        return Ok((samples, report, embedded::TINY_DATASET_NAME.to_string()));
    }
    let path = resolve_path(
        "data.train_file",
        &cfg.data.train_file,
        inputs.config_path,
        inputs.run_dir,
    )?;
    let options = LoadOptions {
        max_length: max_len,
        vocab_size: Some(vocab),
        threads: 0,
        max_line_bytes: cfg.data.max_line_bytes.bytes(),
    };
    let format = match encoder {
        Some(e) => DataFormat::Chat(e),
        None => DataFormat::Pretokenized,
    };
    let (samples, report) = load(&path, format, &options)?;
    let source = path.display().to_string();
    if samples.is_empty() {
        return Err(SetupError::NoSamples {
            path: source,
            summary: report.summary(),
        });
    }
    Ok((samples, report, source))
}

/// The encoder chat data is read with: the tokenizer of `data.tokenizer`, else the target
/// directory's `tokenizer.json`, and the chat template of `data.chat_template`, else the target
/// directory's. A missing or broken file is refused naming the key that chose it.
/// `config validate` builds the same encoder (no weight loaded), so it refuses the same files.
fn chat_encoder(inputs: &SetupInputs<'_>) -> Result<ChatEncoder, SetupError> {
    let cfg = inputs.config;
    let (config_path, run_dir) = (inputs.config_path, inputs.run_dir);
    if cfg.target.is_embedded() {
        return Err(SetupError::Path {
            key: "data.format",
            value: "chat".into(),
            detail: "chat data is read with the target directory's tokenizer and chat template, \
                     and \"embedded\" names no directory: set target.model to the embedded \
                     target's files (assets/tiny/target in the repository, or RUN/target of any \
                     run on it), or use pre-tokenized data"
                .into(),
        });
    }
    let model_dir = resolve_path("target.model", &cfg.target.model, config_path, run_dir)?;
    let template_file = cfg
        .data
        .chat_template
        .as_deref()
        .map(|t| resolve_path("data.chat_template", t, config_path, run_dir))
        .transpose()?;
    let target_model = ("target.model", cfg.target.model.as_str());
    let (tokenizer_key, tokenizer_path) = match cfg.data.tokenizer.as_deref() {
        None => (target_model, model_dir.join("tokenizer.json")),
        Some(t) => (
            ("data.tokenizer", t),
            resolve_path("data.tokenizer", t, config_path, run_dir)?,
        ),
    };
    let template_key = match cfg.data.chat_template.as_deref() {
        None => target_model,
        Some(t) => ("data.chat_template", t),
    };
    let tokenizer =
        load_tokenizer(&tokenizer_path).map_err(|e| chat_file_refused(tokenizer_key, e))?;
    let template = load_chat_template(&model_dir, template_file.as_deref())
        .map_err(|e| chat_file_refused(template_key, e))?;
    Ok(ChatEncoder::new(
        tokenizer,
        tokenizer_path,
        template,
        ChatOptions::default(),
    )?)
}

/// A tokenizer or chat template chat data cannot be read with, named by the key that chose
/// the file (`(key, value)`), with every way out.
fn chat_file_refused((key, value): (&'static str, &str), cause: DataError) -> SetupError {
    SetupError::Path {
        key,
        value: value.into(),
        detail: format!(
            "{cause}; chat data (data.format = \"chat\") is read with a tokenizer.json and a \
             chat template: give target.model's directory both, point data.tokenizer and \
             data.chat_template at them, or use pre-tokenized data"
        ),
    }
}

/// Where the run trains, by role: "cpu" when one device runs both roles inline, else
/// "2 target workers (cuda:0, cuda:1) + 1 drafter worker (cuda:2)".
pub fn describe_topology(topology: &TopologySpec) -> String {
    if topology.is_inline() {
        return device::name(topology.drafter_devices[0]);
    }
    let role = |word: &str, devices: &[Device]| {
        let names: Vec<String> = devices.iter().map(|&d| device::name(d)).collect();
        let plural = if devices.len() == 1 { "" } else { "s" };
        format!(
            "{} {word} worker{plural} ({})",
            devices.len(),
            names.join(", ")
        )
    };
    format!(
        "{} + {}",
        role("target", &topology.target_devices),
        role("drafter", &topology.drafter_devices)
    )
}

#[cfg(test)]
mod tests {
    use super::checks::training_device;
    use super::*;

    /// A start's inputs for `cfg` with nothing given on the command line.
    fn inputs_of(cfg: &Config) -> SetupInputs<'_> {
        SetupInputs {
            config: cfg,
            config_path: None,
            run_dir: Path::new("/r"),
            device_override: None,
            unlocked_keys: Vec::new(),
            memory_plan: MemoryPlanPolicy::default(),
            cpu_peak_flops: None,
            resume: None,
        }
    }

    /// Issue 22 part 7: a message that carries its cause does not also return it as `source()`,
    /// or `dflashd`'s `{e:#}` (anyhow's chain) prints the cause twice.
    #[test]
    fn setup_errors_print_their_cause_once_through_anyhow() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("config.json");
        let io = || std::fs::read(&missing).unwrap_err();
        let os_error = io().to_string();
        let target = SetupError::Target {
            path: dir.path().to_path_buf(),
            cause: Box::new(ModelError::Io {
                path: missing.clone(),
                cause: io(),
            }),
        };
        let write = SetupError::Io {
            path: missing.clone(),
            cause: io(),
        };
        let config_error = Config::embedded_default()
            .check_against_dataset(0)
            .unwrap_err();
        let issue = config_error.issues[0].to_string();
        let against: SetupError = config_error.into();
        for (err, cause) in [(target, &os_error), (write, &os_error), (against, &issue)] {
            let shown = format!("{:#}", anyhow::Error::from(err));
            assert_eq!(shown.matches(cause.as_str()).count(), 1, "{shown}");
        }
    }

    #[test]
    fn relative_paths_follow_the_config_file_and_templates_expand() {
        let run = Path::new("/runs/a");
        let cfg = Path::new("/etc/dflash/run.toml");
        assert_eq!(
            resolve_path("k", "data/train.jsonl", Some(cfg), run).unwrap(),
            PathBuf::from("/etc/dflash/data/train.jsonl")
        );
        assert_eq!(
            resolve_path("k", "/abs/x", Some(cfg), run).unwrap(),
            PathBuf::from("/abs/x")
        );
        assert_eq!(
            resolve_path("k", "{run_dir}/t", None, run).unwrap(),
            PathBuf::from("/runs/a/t")
        );
        assert_eq!(
            resolve_path("k", "x", None, run).unwrap(),
            PathBuf::from("./x")
        );
        let err = resolve_path("data.train_file", "${DFLASH_SURELY_UNSET_VAR}/x", None, run)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("data.train_file = "), "{err}");
    }

    #[test]
    fn the_topology_is_described_by_role() {
        assert_eq!(describe_topology(&TopologySpec::single(Device::Cpu)), "cpu");
        let mut spec = TopologySpec::single(Device::Cpu);
        spec.target_devices = vec![Device::Cuda(0), Device::Cuda(1)];
        spec.drafter_devices = vec![Device::Cuda(2)];
        assert_eq!(
            describe_topology(&spec),
            "2 target workers (cuda:0, cuda:1) + 1 drafter worker (cuda:2)"
        );
    }

    #[test]
    fn an_online_prompt_file_is_resolved_like_the_data_and_refused_at_start_when_missing() {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("run.toml");
        std::fs::write(
            dir.path().join("prompts.jsonl"),
            "{\"input_ids\": [1, 2]}\n",
        )
        .unwrap();
        let resolved = |prompts: &str, every: Option<u64>| {
            let mut cfg = Config::embedded_default();
            cfg.training.online_eval_prompts = Some(prompts.into());
            cfg.training.online_eval_every = every;
            online_eval_prompts(&SetupInputs {
                config_path: Some(&config_path),
                ..inputs_of(&cfg)
            })
        };
        assert_eq!(
            resolved("embedded", None).unwrap().as_deref(),
            Some("embedded")
        );
        assert_eq!(
            resolved("prompts.jsonl", None).unwrap(),
            Some(dir.path().join("prompts.jsonl").display().to_string())
        );
        let err = resolved("missing.jsonl", None).unwrap_err().to_string();
        assert!(
            err.starts_with("training.online_eval_prompts = \"missing.jsonl\": ")
                && err.contains("is not a file")
                && err.contains("online_eval_every = 0"),
            "{err}"
        );
        assert!(resolved("missing.jsonl", Some(0)).is_ok(), "off: not read");
    }

    #[test]
    fn unused_topology_devices_are_named() {
        let mut cfg = Config::embedded_default();
        assert_eq!(
            training_device(&inputs_of(&cfg)),
            (config::Device::Cpu, None)
        );
        cfg.topology.target_devices = vec![config::Device::Cuda(0), config::Device::Cuda(1)];
        cfg.topology.drafter_devices = vec![config::Device::Cuda(2)];
        let (chosen, note) = training_device(&inputs_of(&cfg));
        assert_eq!(chosen, config::Device::Cuda(2));
        let note = note.unwrap();
        assert!(
            note.contains("3 device(s)") && note.contains("cuda:0, cuda:1"),
            "{note}"
        );
    }
}
