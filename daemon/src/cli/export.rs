//! `dflashd export --checkpoint DIR --out DIR`: the drafter of a training checkpoint in the
//! published Hugging Face layout (`config.json` + `model.safetensors`, spec §1.3 keys).
use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use dflash_engine::train::drafter_io::write_hf;
use dflash_engine::train::resume::{read_checkpoint_drafter, resolve_checkpoint};
use tch::Kind;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// A checkpoint directory (`step-…`), a checkpoints directory or a run directory (its newest
    /// checkpoint is used).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Output directory (created; existing files of the same names are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// Weight dtype: `f32` (lossless, the default) or `bf16` (what published drafters ship).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
}

pub fn run(args: ExportArgs) -> Result<()> {
    let dtype = match args.dtype.as_str() {
        "f32" | "float32" => Kind::Float,
        "bf16" | "bfloat16" => Kind::BFloat16,
        other => bail!("--dtype: expected `f32` or `bf16`, found `{other}`"),
    };
    let dir = resolve_checkpoint(&args.checkpoint)?;
    let (config, weights) = read_checkpoint_drafter(&dir)?;
    write_hf(&args.out, &config, &weights, dtype)?;
    println!(
        "exported {} ({} tensors) to {}",
        dir.display(),
        weights.len(),
        args.out.display()
    );
    Ok(())
}
