//! `dflashd export --checkpoint DIR --out DIR` (or `--best --run-dir R`): the drafter of a
//! training checkpoint in the published Hugging Face layout (`config.json` + `model.safetensors`,
//! spec §1.3 keys), in the form SGLang, vLLM and the DFlash authors' loader take unchanged,
//! followed by what each engine needs to be told to serve it; or, with `--format speculators`,
//! in vLLM speculators' own format (`export_speculators.rs`).
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use dflash_engine::model::drafter::{
    Dflash2Config, DominoConfig, DrafterConfig, DsparkConfig, LayerType,
};
use dflash_engine::train::drafter_io::write_hf;
use dflash_engine::train::resume::{
    read_checkpoint_drafter, recorded_best, resolve_checkpoint, RecordedBest,
};
use dflash_engine::train::sglang::{
    confidence_note, write_sglang, SGLANG_DSPARK_ARCHITECTURE, SGLANG_VERSION,
};
use dflash_shared::best_checkpoint::NoBestCheckpoint;
use tch::Kind;

use super::export_speculators;
use dflash_shared::run_dir::CHECKPOINTS_DIR_NAME;

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// A checkpoint directory (`step-…`), a checkpoints directory or a run directory (its newest
    /// checkpoint is used).
    #[arg(long, required_unless_present = "best", conflicts_with = "best")]
    pub checkpoint: Option<PathBuf>,
    /// Export the run's best checkpoint (the highest online DDTree τ at the serving budget)
    /// instead of a named one; needs `--run-dir`.
    #[arg(long, requires = "run_dir")]
    pub best: bool,
    /// The run directory whose best checkpoint `--best` exports.
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Output directory (created; existing files of the same names are replaced).
    #[arg(long)]
    pub out: PathBuf,
    /// Weight dtype: `bf16` (the default: what published drafters ship and what the bf16
    /// target runs in; SGLang's `--dtype auto` would run an f32 export in fp16) or `f32`
    /// (lossless, the training masters).
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// The target's number of layers, for a drafter whose config does not record it (every
    /// drafter trained by dflashd does).
    #[arg(long)]
    pub num_target_layers: Option<usize>,
    /// The layout: `hf` (the published DFlash layout SGLang, vLLM's `dflash` method and z-lab's
    /// loader read; SpecForge's for Domino, DSpark and DFlash2), `speculators` (vLLM
    /// speculators' own format, for DFlash, DSpark and DFlash2) or `sglang` (a DSpark drafter
    /// with its head's keys where SGLang's `Qwen3DSparkModel` reads them).
    #[arg(long, value_enum, default_value = "hf")]
    pub format: ExportFormat,
    /// For `--format speculators`: the drafter's target, a Hugging Face directory, which
    /// speculators loads the embeddings, LM head and final norm from. Default: the run's
    /// `target/` when the checkpoint lies in a run dir that has one.
    #[arg(long)]
    pub target: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    Hf,
    Speculators,
    Sglang,
}

pub fn run(args: ExportArgs) -> Result<()> {
    let dtype = match args.dtype.as_str() {
        "f32" | "float32" => Kind::Float,
        "bf16" | "bfloat16" => Kind::BFloat16,
        other => bail!("--dtype: expected `bf16` or `f32`, found `{other}`"),
    };
    let dir = match (&args.checkpoint, &args.run_dir) {
        (Some(checkpoint), _) => resolve_checkpoint(checkpoint)?,
        (None, Some(run_dir)) => best_checkpoint(run_dir)?,
        (None, None) => bail!("name a checkpoint (--checkpoint DIR) or --best --run-dir R"),
    };
    let (mut config, weights) = read_checkpoint_drafter(&dir)?;
    if let Some(n) = args.num_target_layers {
        if let Some(recorded) = config.num_target_layers.filter(|&r| r != n) {
            bail!("--num-target-layers {n}: the checkpoint records {recorded}; leave the flag out");
        }
        config.num_target_layers = Some(n);
    }
    let hints = match args.format {
        ExportFormat::Hf | ExportFormat::Sglang if args.target.is_some() => {
            bail!("--target is read by --format speculators only; leave it out")
        }
        ExportFormat::Hf => {
            write_hf(&args.out, &config, &weights, dtype)?;
            serving_hints(&config, &args.out)
        }
        ExportFormat::Sglang => {
            write_sglang(&args.out, &config, &weights, dtype)?;
            sglang_hints(&config, &args.out)
        }
        ExportFormat::Speculators => export_speculators::export(
            &dir,
            args.target.as_deref(),
            &args.out,
            &config,
            &weights,
            dtype,
        )?,
    };
    println!(
        "exported {} ({} tensors, {}) to {}",
        dir.display(),
        weights.len(),
        if dtype == Kind::BFloat16 {
            "bf16"
        } else {
            "f32"
        },
        args.out.display()
    );
    print!("{hints}");
    Ok(())
}

/// The best checkpoint of the run in `run_dir`, named on stdout; an error saying what to do
/// when the run has none.
fn best_checkpoint(run_dir: &Path) -> Result<PathBuf> {
    match recorded_best(&run_dir.join(CHECKPOINTS_DIR_NAME))? {
        RecordedBest::Kept { best, dir } => {
            println!(
                "best checkpoint: step {}, tree τ@{} {:.2}",
                best.step, best.budget, best.tau_tree
            );
            Ok(dir)
        }
        RecordedBest::None { newest_step, why } => {
            bail!(no_best_message(run_dir, newest_step, why))
        }
        RecordedBest::NoCheckpoint => bail!(
            "{} has no checkpoint yet, so no best one: `dflashd start --run-dir {}` trains and \
             saves them",
            run_dir.display(),
            run_dir.display()
        ),
    }
}

/// Why `--best` has nothing to export, and the two ways on: the newest checkpoint now, or a run
/// that judges its checkpoints.
fn no_best_message(run_dir: &Path, newest_step: u64, why: NoBestCheckpoint) -> String {
    let dir = run_dir.display();
    let remedy = match why {
        NoBestCheckpoint::OnlineEvalOff => {
            "; to have one, set training.online_eval_every (it may change on a resume) and resume"
        }
        NoBestCheckpoint::NoTreeBudget => {
            "; to have one, give training.online_eval_tree_budgets the serving budget \
             (training.serve_tree_budget) and resume"
        }
        NoBestCheckpoint::NotYet { .. } => "; or train on until that evaluation",
    };
    format!(
        "{dir} has no best checkpoint: {}. Its newest checkpoint is step {newest_step}: \
         `dflashd export --checkpoint {dir} --out OUT` exports it{remedy}",
        why.words()
    )
}

/// What each serving engine must be told to serve this drafter: the draft width it takes as a
/// flag, how vLLM recognises the method, and the runner vLLM needs for mixed layer types.
pub fn serving_hints(cfg: &DrafterConfig, out: &Path) -> String {
    if let Some(dspark) = cfg.head.dspark() {
        return dspark_hints(dspark, cfg.block_size, out);
    }
    let block = cfg.block_size;
    let mixed =
        cfg.layer_types.contains(&LayerType::Sliding) && cfg.layer_types.contains(&LayerType::Full);
    let named_dflash = out
        .file_name()
        .is_some_and(|n| n.to_string_lossy().to_lowercase().contains("dflash"));
    let mut text = format!(
        "serve it:\n  SGLang: --speculative-algorithm DFLASH --speculative-draft-model-path {dir} \
         --speculative-num-draft-tokens {block}\n  vLLM:   --speculative-config \
         '{{\"method\": \"dflash\", \"model\": \"{dir}\", \"num_speculative_tokens\": {draft}}}'\n",
        dir = out.display(),
        draft = block - 1,
    );
    if !named_dflash {
        text.push_str(
            "          (keep \"method\": \"dflash\": vLLM only infers it from a path that contains \"dflash\")\n",
        );
    }
    if mixed {
        text.push_str(
            "          the drafter mixes sliding and full attention layers: vLLM needs its V2 model \
             runner (VLLM_USE_V2_MODEL_RUNNER=1)\n",
        );
    }
    if let Some(domino) = cfg.head.domino() {
        text.push_str(&domino_hints(domino));
    }
    if let Some(dflash2) = cfg.head.dflash2() {
        text.push_str(&dflash2_hints(dflash2));
    }
    text
}

/// What is known of serving a DFlash2 drafter: SpecForge serves it as SGLang's `DFLASH`
/// algorithm, whose `DFlash2DraftModel` reads the same names (`docs/concepts/DFlash2.md`);
/// z-lab's `DFlash2DraftModel` (PyPI `dflash` 0.1.0) loads it, which `make soak` runs
/// (`daemon/tests/daemon/loaders.rs`); SGLang's loader is not run here.
fn dflash2_hints(dflash2: &Dflash2Config) -> String {
    format!(
        "          DFlash2 (architectures [\"DFlash2DraftModel\"]: conv_kernel_size {}, \
         conv_group_size {}, selector_rank {}, selector_top_k {}, output_multiplier {}{}): \
         SpecForge serves it with SGLang's DFLASH algorithm, whose DFlash2DraftModel reads these \
         keys and the candidate_selector.* and layers.*.{{attention,mlp}}_conv.* tensors \
         (SpecForge's names, written as they are); vLLM's dflash method does not read them. \
         z-lab's DFlash2DraftModel (PyPI dflash 0.1.0) loads this layout and computes our \
         logits and selector path (`make soak`); SGLang's loader is not run here. vLLM \
         speculators reads DFlash2 in its own format: dflashd export --format speculators.\n",
        dflash2.conv_kernel_size,
        dflash2.conv_group_size,
        dflash2.selector_rank,
        dflash2.selector_top_k,
        dflash2.output_multiplier,
        dflash2
            .final_logit_softcapping
            .map(|c| format!(", final_logit_softcapping {c}"))
            .unwrap_or_default(),
    )
}

/// What is known of serving a Domino drafter, with its sources: an engine that loads it as a
/// plain DFlash drafter would draft without the correction it was trained for.
fn domino_hints(domino: &DominoConfig) -> String {
    format!(
        "  Domino: written as architectures [\"DominoDraftModel\"], dflash_config.projector_type \
         \"domino\", emb_dim {}, gru_hidden_dim {}, pure_draft_prefix_len {}, shift_label false \
         (SpecForge's layout). It must be served with its GRU correction (each drafted token fed \
         back into the GRU), or it drafts as the plain DFlash backbone.\n  \
         SGLang: Domino rollout in the DFlash V2 worker merged in sgl-project/sglang#36899 \
         (2026-08-28; CUDA, TP=1, greedy, bf16, checked on a block-16 Qwen3-8B checkpoint); \
         the first release that ships it, and whether it accepts the DominoDraftModel \
         architecture name: not verified.\n  \
         vLLM: no merged Domino support found (RFC vllm-project/vllm#46707 open, \
         vllm-project/vllm#47627 closed): not verified; do not expect the correction there.\n",
        domino.emb_dim, domino.gru_hidden_dim, domino.pure_draft_prefix_len
    )
}

/// What is known of serving a DSpark drafter. SpecForge's layout keeps the heads' keys in
/// `dflash_config`; SGLang's and vLLM's DSpark loaders read them at the top level under their
/// own architecture name, the copy SpecForge's `scripts/gates/normalize_dflash_export.py`
/// makes, which this export does not write yet.
fn dspark_hints(dspark: &DsparkConfig, block: i64, out: &Path) -> String {
    format!(
        "serve it: written in SpecForge's DSpark layout (architectures [\"DSparkDraftModel\"], \
         dflash_config.projector_type \"dspark\", markov_rank {}, markov_head_type \"{}\", \
         enable_confidence_head {}, confidence_head_with_markov {}) in {dir}: SpecForge's keys \
         for key, not loaded by SpecForge here.\n  Each of its {block} slots drafts the token after its position (slot 0 the \
         token after the anchor), the Markov head reading the token drafted before it.\n  \
         SGLang builds a DSpark drafter's heads from keys at the top level: dflashd export \
         --format sglang writes that form. vLLM speculators' own DSpark format: dflashd export \
         --format speculators (loaded by speculators' DSparkDraftModel in `make soak`).\n",
        dspark.markov_rank,
        dspark.markov_head_type.as_str(),
        dspark.confidence_head,
        dspark.confidence_head_with_markov,
        dir = out.display(),
    )
}

/// What serving the SGLang form needs, and what was not checked.
fn sglang_hints(cfg: &DrafterConfig, out: &Path) -> String {
    let note = confidence_note(cfg).map_or(String::new(), |note| format!("note: {note}\n"));
    format!(
        "written in the form SGLang {SGLANG_VERSION}'s DSpark model reads (architectures \
         [\"{SGLANG_DSPARK_ARCHITECTURE}\"], the head's keys at the top level as well as in \
         dflash_config, sample_from_anchor true); dflashd reads it back as the same drafter.\n\
         {note}serve it:\n  SGLang: --speculative-algorithm DSPARK \
         --speculative-draft-model-path {dir} --speculative-num-draft-tokens {tokens}\n",
        dir = out.display(),
        tokens = cfg.block_size + 1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_engine::embedded;
    use tch::Device;

    #[test]
    fn no_best_names_why_and_what_to_run_instead() {
        let run = Path::new("/r/run");
        let off = no_best_message(run, 120, NoBestCheckpoint::OnlineEvalOff);
        for wanted in [
            "/r/run has no best checkpoint: online evaluation is off",
            "newest checkpoint is step 120",
            "dflashd export --checkpoint /r/run --out OUT",
            "set training.online_eval_every",
        ] {
            assert!(off.contains(wanted), "{wanted:?} missing from {off}");
        }
        let early = no_best_message(run, 20, NoBestCheckpoint::NotYet { first_at_step: 50 });
        assert!(early.contains("due at step 50"), "{early}");
        assert!(
            early.ends_with("or train on until that evaluation"),
            "{early}"
        );
    }

    #[test]
    fn hints_give_each_engine_its_draft_width_and_the_v2_runner_for_mixed_layers() {
        let target = embedded::tiny_target(None, Device::Cpu).unwrap();
        // DFlash's head: the embedded default's Domino head adds its own lines (next test).
        let mut cfg = embedded::tiny_dflash_drafter_config(target.config());
        cfg.layer_types = vec![LayerType::Sliding, LayerType::Full];
        let text = serving_hints(&cfg, Path::new("/x/tiny-dflash"));
        let block = cfg.block_size;
        assert!(
            text.contains(&format!("--speculative-num-draft-tokens {block}")),
            "{text}"
        );
        assert!(
            text.contains(&format!("\"num_speculative_tokens\": {}", block - 1)),
            "{text}"
        );
        assert!(text.contains("VLLM_USE_V2_MODEL_RUNNER=1"), "{text}");
        assert!(!text.contains("only infers it"), "{text}");

        cfg.layer_types = vec![LayerType::Full, LayerType::Full];
        let text = serving_hints(&cfg, Path::new("/x/export"));
        assert!(!text.contains("V2 model runner"), "{text}");
        assert!(text.contains("only infers it"), "{text}");
        assert!(!text.contains("Domino"), "{text}");
    }

    #[test]
    fn a_domino_export_names_its_architecture_keys_and_what_is_verified_of_serving_it() {
        use dflash_engine::model::drafter::DrafterHead;
        let target = embedded::tiny_target(None, Device::Cpu).unwrap();
        let mut cfg = embedded::tiny_drafter_config(target.config());
        cfg.head = DrafterHead::Domino(DominoConfig {
            emb_dim: 24,
            gru_hidden_dim: 12,
            pure_draft_prefix_len: 1,
        });
        let text = serving_hints(&cfg, Path::new("/x/domino-dflash"));
        for wanted in [
            "[\"DominoDraftModel\"]",
            "emb_dim 24, gru_hidden_dim 12, pure_draft_prefix_len 1",
            "sgl-project/sglang#36899",
            "not verified",
        ] {
            assert!(text.contains(wanted), "{wanted:?} missing from {text}");
        }
    }

    #[test]
    fn a_dflash2_export_names_its_architecture_keys_and_which_loaders_ran() {
        use dflash_engine::model::drafter::DrafterHead;
        let target = embedded::tiny_target(None, Device::Cpu).unwrap();
        let mut cfg = embedded::tiny_drafter_config(target.config());
        cfg.head = DrafterHead::Dflash2(Dflash2Config {
            conv_kernel_size: 2,
            conv_group_size: 16,
            selector_rank: 64,
            selector_top_k: 16,
            output_multiplier: 1.0,
            final_logit_softcapping: Some(30.0),
        });
        let text = serving_hints(&cfg, Path::new("/x/dflash2"));
        for wanted in [
            "--speculative-algorithm DFLASH",
            "[\"DFlash2DraftModel\"]",
            "conv_kernel_size 2, conv_group_size 16, selector_rank 64, selector_top_k 16",
            "final_logit_softcapping 30",
            "z-lab's DFlash2DraftModel (PyPI dflash 0.1.0) loads this layout",
            "SGLang's loader is not run here",
            "--format speculators",
        ] {
            assert!(text.contains(wanted), "{wanted:?} missing from {text}");
        }
    }
}
