//! `dflashd features`: target hidden states at tap layers for one token sequence, written as a
//! safetensors file with a tensor `hidden_states` of shape `[T, len(layers)*hidden]`.
use super::parse_device;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tch::{Device, Tensor};

use dflash_engine::model::target::{parse_dtype, LoadOptions, TargetModel};
use dflash_engine::model::weights::write_safetensors_atomic;

#[derive(Debug, clap::Args)]
pub struct FeaturesArgs {
    /// Hugging Face checkpoint directory (config.json + safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// File of token ids separated by commas and/or whitespace.
    #[arg(long = "input-ids")]
    pub input_ids: PathBuf,
    /// Tap layer ids, comma-separated (layer L = output of decoder layer L, HF hidden_states[L+1]).
    #[arg(long, value_delimiter = ',', required = true, num_args = 1..)]
    pub layers: Vec<usize>,
    /// Output safetensors file.
    #[arg(long)]
    pub out: PathBuf,
    /// Compute dtype: f32 or bf16 (default: the checkpoint's).
    #[arg(long)]
    pub dtype: Option<String>,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Replace OUT if it exists (it is never overwritten otherwise).
    #[arg(long)]
    pub force: bool,
}

pub fn run(args: FeaturesArgs) -> Result<()> {
    if args.out.exists() && !args.force {
        bail!(
            "{}: already exists; pass --force to replace it",
            args.out.display()
        );
    }
    let device = parse_device(&args.device)?;
    let dtype = args.dtype.as_deref().map(parse_dtype).transpose()?;
    let text = std::fs::read_to_string(&args.input_ids)
        .with_context(|| format!("reading token ids from {}", args.input_ids.display()))?;
    let ids = parse_token_ids(&text).with_context(|| format!("{}", args.input_ids.display()))?;
    let Some(&last) = args.layers.iter().max() else {
        bail!("--layers: at least one layer id is required");
    };

    let started = Instant::now();
    let options = LoadOptions {
        device,
        dtype,
        // feature extraction never runs past its last tap, so it never needs later layers
        max_layers: Some(last + 1),
    };
    let model = TargetModel::load_with(&args.model, options)?;
    let loaded = started.elapsed();

    let started = Instant::now();
    let input = Tensor::from_slice(&ids).view([1, ids.len() as i64]);
    let features = model.features(&input, &args.layers)?.squeeze_dim(0);
    let host = features.to_device(Device::Cpu);
    let computed = started.elapsed();

    let metadata = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("model".to_string(), args.model.display().to_string()),
        ("layers".to_string(), join(&args.layers)),
        (
            "hidden_size".to_string(),
            model.config().hidden_size().to_string(),
        ),
    ]);
    write_safetensors_atomic(&args.out, &[("hidden_states".to_string(), &host)], metadata)?;
    println!(
        "{}: hidden_states {:?} {} (layers {}) — load {:.2}s, forward {:.2}s on {}",
        args.out.display(),
        host.size(),
        kind_name(host.kind()),
        join(&args.layers),
        loaded.as_secs_f64(),
        computed.as_secs_f64(),
        args.device,
    );
    Ok(())
}

fn join(layers: &[usize]) -> String {
    layers
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

use dflash_engine::device::kind_name;

/// Token ids separated by commas and/or whitespace (an optional `[ ]` around them is allowed, so a
/// JSON list works too).
pub fn parse_token_ids(text: &str) -> Result<Vec<i64>> {
    let trimmed = text.trim();
    let inner = trimmed
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(trimmed);
    let mut ids = Vec::new();
    for (index, token) in inner
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .enumerate()
    {
        match token.parse::<i64>() {
            Ok(id) => ids.push(id),
            Err(_) => bail!("token #{index} is {token:?}: expected an integer token id"),
        }
    }
    if ids.is_empty() {
        bail!("no token ids found: expected integers separated by commas or whitespace");
    }
    Ok(ids)
}

/// Reads the `hidden_states` tensor back (for tests and tooling).
pub fn read_hidden_states(path: &Path) -> Result<Tensor> {
    Tensor::read_safetensors(path)?
        .into_iter()
        .find(|(name, _)| name == "hidden_states")
        .map(|(_, t)| t)
        .with_context(|| format!("{}: no tensor `hidden_states`", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_accept_commas_whitespace_and_brackets() {
        assert_eq!(
            parse_token_ids("1, 2,3\n4\t5 ").unwrap(),
            vec![1, 2, 3, 4, 5]
        );
        assert_eq!(parse_token_ids("[7, 8]").unwrap(), vec![7, 8]);
        assert_eq!(parse_token_ids("-1").unwrap(), vec![-1]);
    }

    #[test]
    fn bad_token_files_are_named_errors() {
        let err = parse_token_ids("1, 2, x3").unwrap_err().to_string();
        assert!(err.contains("token #2") && err.contains("x3"), "{err}");
        assert!(parse_token_ids(" \n ,")
            .unwrap_err()
            .to_string()
            .contains("no token ids"));
    }
}
