//! `dflashd config validate FILE` and `dflashd config show [FILE]`.
//!
//! `validate` exits 0 for a valid file (printing any non-fatal remarks) and 1 with every
//! problem listed, each naming the key path, its line, what was expected and what was found.
//! Beyond the file itself it checks what `start` would refuse that can be known without
//! loading weights ([`read_facts`]): the data's size (the embedded data's included: it is
//! compiled in) against the held-out count and the batch size, `telemetry.python`, and the tap
//! layers and mask token against the target's `config.json`, and `drafter.init_from`'s
//! drafter against the configured one (the check `start` makes before loading its weights).
//! `config_setup.rs` runs `start`'s own setup code on the rest: the online prompt file, the
//! target's stop tokens, chat data's tokenizer and template, the data, and the memory plan
//! wherever the devices' memory is known without a GPU.
//! `show` prints the effective config, every default filled in; it parses back to the same
//! config, so it is a complete starting point for a new run.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use dflash_engine::embedded;
use dflash_engine::model::target::TargetConfig;
use dflash_engine::train::warm_start::DrafterSource;
use dflash_engine::train::{run_config, TrainError};
use dflash_shared::config::{
    Config, ConfigFacts, InitFromMisfit, TargetShape, EMBEDDED_DATA, EMBEDDED_ORIGIN,
    EMBEDDED_PROMPTS,
};

use super::config_setup::{self, SetupFiles};
use crate::run::paths::{resolve, resolve_path, PathInputs};

#[derive(Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Check a run config; exit 1 with every problem named by key and line.
    Validate {
        file: PathBuf,
        /// Memory of each device, GiB, as `start --gpu-memory-gib` states it: the memory plan
        /// is checked against it. Default: NVML's figure for the topology's GPUs, the host's
        /// memory on a CPU topology; with neither, the plan is left to `start`.
        #[arg(long, value_name = "GIB")]
        gpu_memory_gib: Option<f64>,
    },
    /// Print the effective config (every default filled in). No FILE: the embedded default.
    Show { file: Option<PathBuf> },
}

/// Reads and validates a config file; the error lists every problem.
pub fn load_config(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    Ok(Config::from_toml_str(&text, &path.display().to_string())?)
}

/// Reads what `start` would check after loading: the train file's non-blank lines (an upper
/// bound of its samples; for the embedded data, its sample count), whether `telemetry.python`
/// exists, and the target's depth and vocabulary from its `config.json` (the embedded
/// target's own shape); then runs `start`'s own setup checks ([`config_setup::check`]). What
/// cannot be read is left to `start`, and a note says so (a path `start` cannot resolve is
/// refused there too).
fn read_facts(
    config: &Config,
    config_path: &Path,
    gpu_memory_gib: Option<f64>,
) -> (ConfigFacts, Vec<String>) {
    let mut notes = Vec::new();
    let default_run_dir = PathInputs::from_environment()
        .map(|inputs| resolve(&inputs).default_run_dir)
        .unwrap_or_else(|_| PathBuf::from("."));
    let run_dir = config
        .run
        .run_dir
        .as_deref()
        .and_then(|d| resolve_path("run.run_dir", d, Some(config_path), &default_run_dir).ok())
        .unwrap_or(default_run_dir);
    let resolve_key =
        |key: &'static str, value: &str| resolve_path(key, value, Some(config_path), &run_dir);
    let mut facts = ConfigFacts::default();
    if config.data.train_file == EMBEDDED_DATA {
        facts.train_lines = Some(embedded::tiny_sample_count());
    } else {
        match resolve_key("data.train_file", &config.data.train_file)
            .map_err(|e| e.to_string())
            .and_then(|p| count_non_blank_lines(&p).map_err(|e| format!("{}: {e}", p.display())))
        {
            Ok(n) => facts.train_lines = Some(n),
            Err(e) => notes.push(format!(
                "data.train_file not read ({e}); its size is checked at start"
            )),
        }
    }
    if let Some(python) = &config.telemetry.python {
        match resolve_key("telemetry.python", python) {
            Ok(p) if !p.is_file() => facts.missing_python = Some(p.display().to_string()),
            Ok(_) => {}
            Err(e) => facts.missing_python = Some(e.to_string()),
        }
    }
    let online = &config.training;
    if let Some(prompts) = online
        .online_eval_prompts
        .as_deref()
        .filter(|p| online.online_eval_interval() > 0 && *p != EMBEDDED_PROMPTS)
    {
        match resolve_key("training.online_eval_prompts", prompts) {
            Ok(p) if !p.is_file() => facts.missing_online_prompts = Some(p.display().to_string()),
            Ok(_) => {}
            Err(e) => facts.missing_online_prompts = Some(e.to_string()),
        }
    }
    let target_dir = (!config.target.is_embedded())
        .then(|| resolve_key("target.model", &config.target.model).map_err(|e| e.to_string()));
    let target = match &target_dir {
        None => Ok(TargetConfig::tiny_default()),
        Some(dir) => dir
            .clone()
            .and_then(|dir| TargetConfig::from_hf_dir(&dir).map_err(|e| e.to_string())),
    };
    if let Some(init_from) = &config.drafter.init_from {
        let dir = resolve_key("drafter.init_from", init_from).map_err(|e| e.to_string());
        check_init_from(config, dir, target.as_ref().ok(), &mut facts, &mut notes);
    }
    let files = SetupFiles {
        config,
        config_path,
        run_dir: &run_dir,
        gpu_memory_gib,
    };
    config_setup::check(&files, &mut facts, &mut notes);
    match target {
        Ok(t) => {
            facts.target = Some(TargetShape {
                num_layers: t.num_layers(),
                vocab_size: u64::try_from(t.vocab_size()).unwrap_or(0),
                hidden_size: u64::try_from(t.hidden_size()).unwrap_or(0),
            })
        }
        Err(e) => notes.push(format!(
            "the target's config.json was not read ({e}); drafter.target_layer_ids and \
             drafter.mask_token_id are checked against it at start"
        )),
    }
    (facts, notes)
}

/// `drafter.init_from` as `start` checks it before it loads a weight: a drafter directory whose
/// config.json reads, whose weights files' headers read, and whose drafter is the configured
/// one on this target (`DrafterSource::misfits`, the check `start` makes). The tensors
/// themselves are checked at start, against the built drafter's parameters. A resume never
/// reads the key, but `config validate` cannot know whether the run will resume.
fn check_init_from(
    config: &Config,
    dir: Result<PathBuf, String>,
    target: Option<&TargetConfig>,
    facts: &mut ConfigFacts,
    notes: &mut Vec<String>,
) {
    let source = dir.and_then(|dir| {
        DrafterSource::open(&dir).map_err(|e| match e {
            TrainError::InitFrom { problems, .. } => {
                format!("{} ({})", dir.display(), problems.join("; "))
            }
            other => format!("{} ({other})", dir.display()),
        })
    });
    let source = match source {
        Ok(source) => source,
        Err(why) => {
            facts.init_from_unreadable = Some(why);
            return;
        }
    };
    let Some(target) = target else {
        notes.push(
            "drafter.init_from's drafter is checked against the configured drafter at start: \
             the target's config.json was not read"
                .into(),
        );
        return;
    };
    let drafter = run_config::drafter_config(&config.drafter, target);
    facts.init_from_misfits = source
        .misfits(&drafter)
        .into_iter()
        .map(|m| InitFromMisfit {
            key: m.key.into(),
            run: m.run,
            drafter: m.drafter,
            fix: m.fix,
        })
        .collect();
}

/// Non-blank lines of a file, read a line at a time (memory stays one line long).
fn count_non_blank_lines(path: &Path) -> std::io::Result<usize> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(std::fs::File::open(path)?);
    let (mut line, mut n) = (Vec::new(), 0);
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(n);
        }
        if !line.iter().all(u8::is_ascii_whitespace) {
            n += 1;
        }
    }
}

pub fn run(args: ConfigArgs) -> Result<ExitCode> {
    match args.command {
        ConfigCommand::Validate {
            file,
            gpu_memory_gib,
        } => {
            if let Some(gib) = gpu_memory_gib.filter(|g| !(g.is_finite() && *g > 0.0)) {
                anyhow::bail!("--gpu-memory-gib: expected a positive number of GiB, found {gib}");
            }
            let config = match load_config(&file) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("dflashd: {e:#}");
                    return Ok(ExitCode::FAILURE);
                }
            };
            let (facts, notes) = read_facts(&config, &file, gpu_memory_gib);
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            if let Err(e) = config.check_facts(&facts, &text, &file.display().to_string()) {
                eprintln!("dflashd: {e}");
                return Ok(ExitCode::FAILURE);
            }
            for warning in config.warnings() {
                println!("warning: {warning}");
            }
            for note in notes {
                println!("note: {note}");
            }
            println!(
                "{}: valid (run '{}', {} epochs, block size {}, target layers {:?})",
                file.display(),
                config.run.name,
                config.training.epochs,
                config.drafter.block_size,
                config.drafter.target_layer_ids
            );
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Show { file } => {
            let (config, origin) = match &file {
                Some(path) => (load_config(path)?, path.display().to_string()),
                None => (Config::embedded_default(), EMBEDDED_ORIGIN.to_string()),
            };
            println!("# effective config of {origin}, every default filled in");
            print!("{}", config.to_toml_string());
            Ok(ExitCode::SUCCESS)
        }
    }
}
