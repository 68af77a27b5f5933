//! Warm start (`drafter.init_from`): a fresh run's trainable drafter weights read from an
//! existing drafter directory instead of drawn at random. The directory is what `dflashd
//! export` writes and what SpecForge saves, one layout (`drafter_io.rs`): `config.json` and
//! `model.safetensors`, or the shards `model.safetensors.index.json` lists, with a DFlash head,
//! a Domino one (`DominoDraftModel`) or DSpark's (`DSparkDraftModel`). A DSpark run may also
//! start from a DFlash drafter: the backbone loads and the DSpark heads keep the run's own
//! initialisation ([`DrafterSource::leaves_fresh`]).
//!
//! Everything is checked before a weight is copied, and every problem found is reported at
//! once: the directory's drafter config against the run's ([`DrafterSource::misfits`]: head,
//! widths, layers, block size, taps, mask token, the target's vocabulary and width), the
//! tensors' headers against the run's parameters (missing, extra, shape, dtype), then the
//! values (finite). Only the drafter's own parameters load. A file that also carries the
//! target's frozen tables ([`SHARED_WITH_TARGET`]) keeps the target's: the drafter reads the
//! target's embedding and LM head in training and in serving. A stored RoPE `inv_freq` buffer
//! is recomputed from `rope_theta`, as every load does.
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::drafter_io::CONFIG_FILE;
use super::error::TrainError;
use crate::model::drafter::{DominoConfig, DrafterConfig, DrafterHead, DsparkConfig, LayerType};
use crate::model::weights::{CheckpointIndex, StoredTensor};

/// Tensors a drafter file may carry that are the target's own: the frozen embedding and LM
/// head the drafter shares with its target. They are never loaded from `init_from`.
pub const SHARED_WITH_TARGET: [&str; 2] = ["embed_tokens.weight", "lm_head.weight"];

/// Where DSpark's heads keep their parameters (`model/drafter/dspark.rs`, SpecForge's names):
/// what a DSpark run started from a DFlash drafter leaves as it drew them.
const DSPARK_HEAD_PREFIXES: [&str; 2] = ["markov_head.", "confidence_head."];

/// A buffer some writers store (PyTorch's persistent `inv_freq`): derived from `rope_theta`,
/// not learned, so it is not loaded.
const DERIVED_BUFFER_SUFFIX: &str = "rotary_emb.inv_freq";

/// A drafter directory, read as far as its config and its tensors' headers.
#[derive(Debug)]
pub struct DrafterSource {
    dir: PathBuf,
    config: DrafterConfig,
    pub(crate) index: CheckpointIndex,
    stored: BTreeMap<String, StoredTensor>,
}

/// One difference between the run's drafter and the directory's: the run config key to
/// change, both values as the config writes them, and what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Misfit {
    /// A `[drafter]` key, or `target.model` where the drafter was trained for another target.
    pub key: &'static str,
    pub run: String,
    pub drafter: String,
    pub fix: String,
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: the run has {}, the drafter has {}; {}",
            self.key, self.run, self.drafter, self.fix
        )
    }
}

/// A weights file a warm start read, by its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightFileDigest {
    pub file: PathBuf,
    pub bytes: u64,
    /// Lower-case hex.
    pub sha256: String,
}

/// What a warm start loaded: the record a run keeps of where its weights came from.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmStart {
    pub dir: PathBuf,
    /// The run's head: `"dflash"`, `"domino"` or `"dspark"`.
    pub head: &'static str,
    pub files: Vec<WeightFileDigest>,
    /// Parameters initialised from the files (every trainable parameter of the drafter but
    /// those in `fresh`).
    pub tensors: usize,
    /// The run's parameters the directory has none of by design, kept as the run drew them:
    /// the DSpark heads of a DSpark run started from a DFlash drafter.
    pub fresh: Vec<String>,
    /// Tensors of the files left unloaded: the target's own tables, derived buffers.
    pub not_loaded: Vec<String>,
}

impl WarmStart {
    /// One line: the directory, each weights file's SHA-256, and what stayed the target's.
    pub fn summary(&self) -> String {
        let files: Vec<String> = self
            .files
            .iter()
            .map(|f| {
                let name = f.file.file_name().map_or_else(
                    || f.file.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                );
                format!("{name} sha256 {} ({} bytes)", f.sha256, f.bytes)
            })
            .collect();
        let mut text = format!(
            "drafter initialised from {} (drafter.init_from; {} head, {} tensors): {}",
            self.dir.display(),
            self.head,
            self.tensors,
            files.join(", ")
        );
        if !self.not_loaded.is_empty() {
            text.push_str(&format!(
                "; not loaded (the target's own, or derived): {}",
                self.not_loaded.join(", ")
            ));
        }
        if !self.fresh.is_empty() {
            text.push_str(&format!(
                "; freshly initialised (the drafter has no DSpark heads): {}",
                self.fresh.join(", ")
            ));
        }
        text
    }
}

pub(crate) fn refused(dir: &Path, problems: Vec<String>) -> TrainError {
    TrainError::InitFrom {
        dir: dir.to_path_buf(),
        problems,
    }
}

pub(crate) fn head_name(head: &DrafterHead) -> &'static str {
    match head {
        DrafterHead::Dflash => "dflash",
        DrafterHead::Domino(_) => "domino",
        DrafterHead::Dspark(_) => "dspark",
        DrafterHead::Dflash2(_) => "dflash2",
    }
}

fn layer_types_toml(types: &[LayerType]) -> String {
    let names: Vec<String> = types
        .iter()
        .map(|t| format!("\"{}\"", t.hf_name()))
        .collect();
    format!("[{}]", names.join(", "))
}

/// One compared drafter key: the run config key a misfit names, and the value as the run's
/// config would spell it.
type ComparedKey = (&'static str, fn(&DrafterConfig) -> String);

/// The keys that shape the drafter's weights, in the order a refusal lists them.
const COMPUTE_SHAPE: [ComparedKey; 7] = [
    ("drafter.hidden_size", |c| c.hidden_size.to_string()),
    ("drafter.intermediate_size", |c| {
        c.intermediate_size.to_string()
    }),
    ("drafter.num_layers", |c| c.num_hidden_layers.to_string()),
    ("drafter.num_attention_heads", |c| {
        c.num_attention_heads.to_string()
    }),
    ("drafter.num_key_value_heads", |c| {
        c.num_key_value_heads.to_string()
    }),
    ("drafter.head_dim", |c| c.head_dim.to_string()),
    ("drafter.layer_types", |c| layer_types_toml(&c.layer_types)),
];

/// The keys that shape no weight but change what the weights compute: the block, the mask
/// token, the target layers tapped, and the constants of RoPE and the norms.
const COMPUTE_CONSTANTS: [ComparedKey; 5] = [
    ("drafter.block_size", |c| c.block_size.to_string()),
    ("drafter.mask_token_id", |c| c.mask_token_id.to_string()),
    ("drafter.target_layer_ids", |c| {
        format!("{:?}", c.target_layer_ids)
    }),
    ("drafter.rope_theta", |c| format!("{:?}", c.rope_theta)),
    ("drafter.rms_norm_eps", |c| format!("{:?}", c.rms_norm_eps)),
];

impl DrafterSource {
    /// Reads `dir`'s `config.json` and the headers of its weights files (no tensor data).
    pub fn open(dir: &Path) -> Result<Self, TrainError> {
        if !dir.is_dir() {
            return Err(refused(
                dir,
                vec![
                    "is not a directory: name a drafter directory (config.json and \
                     model.safetensors), such as one `dflashd export` wrote or SpecForge saved"
                        .into(),
                ],
            ));
        }
        let config = DrafterConfig::from_hf_json(&dir.join(CONFIG_FILE))
            .map_err(|e| refused(dir, vec![e.to_string()]))?;
        let index = CheckpointIndex::open(dir).map_err(|e| refused(dir, vec![e.to_string()]))?;
        let stored = index
            .stored_tensors()
            .map_err(|e| refused(dir, vec![e.to_string()]))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            index,
            stored,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The drafter config the directory holds.
    pub fn config(&self) -> &DrafterConfig {
        &self.config
    }

    /// Where the directory's drafter differs from `run` in what its weights compute: each
    /// names the run config key to change. Descriptive keys (`max_position_embeddings`, the
    /// init range) are not compared; the Domino widths only when both heads are Domino.
    pub fn misfits(&self, run: &DrafterConfig) -> Vec<Misfit> {
        let file = &self.config;
        let mut out = Vec::new();
        let mut differs = |key: &'static str, run: String, drafter: String| {
            if run != drafter {
                let fix = format!("set {key} = {drafter}, or name a drafter of the run's shape");
                out.push(Misfit {
                    key,
                    run,
                    drafter,
                    fix,
                });
            }
        };
        for (key, value) in COMPUTE_SHAPE {
            differs(key, value(run), value(file));
        }
        // The window shapes no weight, but it decides what each sliding layer attends to.
        if run.layer_types.contains(&LayerType::Sliding) {
            let window =
                |c: &DrafterConfig| c.sliding_window.map_or("(unset)".into(), |w| w.to_string());
            differs("drafter.sliding_window", window(run), window(file));
        }
        for (key, value) in COMPUTE_CONSTANTS {
            differs(key, value(run), value(file));
        }
        out.extend(head_misfits(&run.head, &file.head));
        out.extend(target_misfits(run, file));
        out
    }

    /// Whether the run's parameter `name` stays as the run drew it rather than load: a DSpark
    /// or DFlash2 run started from a DFlash drafter takes the backbone, and its DSpark heads
    /// (DFlash2's convolutions and selector), which a DFlash drafter does not have, start from
    /// their own initialisation (DFlash2's: the identity and a unary-ranking selector, so the
    /// run starts from exactly the DFlash drafter's output).
    pub fn leaves_fresh(&self, run: &DrafterConfig, name: &str) -> bool {
        match (&run.head, &self.config.head) {
            (DrafterHead::Dspark(_), DrafterHead::Dflash) => {
                DSPARK_HEAD_PREFIXES.iter().any(|p| name.starts_with(p))
            }
            // DFlash2's convolutions (`layers.{i}.{attention,mlp}_conv.*`) and selector.
            (DrafterHead::Dflash2(_), DrafterHead::Dflash) => {
                name.starts_with("candidate_selector.")
                    || name.contains(".attention_conv.")
                    || name.contains(".mlp_conv.")
            }
            _ => false,
        }
    }

    /// [`Self::misfits`] as the refusal `start` gives.
    pub fn check_config(&self, run: &DrafterConfig) -> Result<(), TrainError> {
        let misfits = self.misfits(run);
        if misfits.is_empty() {
            return Ok(());
        }
        Err(refused(
            &self.dir,
            misfits.iter().map(ToString::to_string).collect(),
        ))
    }

    /// The run's parameters (`name`, shape) against the stored tensors: the problems (missing,
    /// extra, shape, dtype), and the stored tensors that are deliberately not loaded.
    pub(crate) fn tensor_problems(
        &self,
        params: &[(String, Vec<i64>)],
    ) -> (Vec<String>, Vec<String>) {
        let mut problems = Vec::new();
        let shown = |file: &Path| file.display().to_string();
        for (name, shape) in params {
            match self.stored.get(name) {
                None => problems.push(format!(
                    "tensor `{name}` (shape {shape:?}) is missing from the drafter's weights: \
                     the run's drafter has it, so name a drafter of the same architecture"
                )),
                Some(t) if &t.shape != shape => problems.push(format!(
                    "tensor `{name}` has shape {:?} in {}, the run's drafter has {shape:?}",
                    t.shape,
                    shown(&t.file)
                )),
                Some(t) if t.kind.is_none() => problems.push(format!(
                    "tensor `{name}` is stored as {} in {}; a drafter's weights are F32, BF16 \
                     or F16: export the drafter again in one of them",
                    t.dtype,
                    shown(&t.file)
                )),
                Some(_) => {}
            }
        }
        let mut not_loaded = Vec::new();
        for (name, t) in &self.stored {
            if params.iter().any(|(p, _)| p == name) {
                continue;
            }
            if SHARED_WITH_TARGET.contains(&name.as_str()) || name.ends_with(DERIVED_BUFFER_SUFFIX)
            {
                not_loaded.push(name.clone());
            } else {
                problems.push(format!(
                    "tensor `{name}` in {} is not a parameter of the run's drafter (a drafter of \
                     another architecture?): name a drafter whose tensors are the run's",
                    shown(&t.file)
                ));
            }
        }
        (problems, not_loaded)
    }
}

/// The head kind, and the Domino widths or the DSpark heads when both heads are of that kind
/// (otherwise the kind is the one difference worth reading). A DSpark run fits a DFlash
/// drafter: its backbone loads, its heads start fresh ([`DrafterSource::leaves_fresh`]).
fn head_misfits(run: &DrafterHead, file: &DrafterHead) -> Vec<Misfit> {
    match (run, file) {
        (DrafterHead::Domino(r), DrafterHead::Domino(f)) => domino_misfits(r, f),
        (DrafterHead::Dspark(r), DrafterHead::Dspark(f)) => dspark_misfits(r, f),
        (DrafterHead::Dflash, DrafterHead::Dflash)
        | (DrafterHead::Dspark(_), DrafterHead::Dflash)
        | (DrafterHead::Dflash2(_), DrafterHead::Dflash) => Vec::new(),
        (DrafterHead::Dflash2(r), DrafterHead::Dflash2(f)) if r == f => Vec::new(),
        (DrafterHead::Dflash2(_), _) | (_, DrafterHead::Dflash2(_)) => vec![Misfit {
            key: "drafter.head",
            run: dflash2_words(run),
            drafter: dflash2_words(file),
            fix: "name a DFlash drafter (its backbone loads, DFlash2's convolutions and \
                  selector start fresh) or a DFlash2 drafter of the run's keys \
                  (drafter.conv_kernel_size, conv_group_size, selector_rank, selector_top_k, \
                  output_multiplier, final_logit_softcapping)"
                .into(),
        }],
        (DrafterHead::Domino(_), DrafterHead::Dflash) => vec![Misfit {
            key: "drafter.head",
            run: "\"domino\"".into(),
            drafter: "\"dflash\" (no Domino head: DFlashDraftModel without \
                      dflash_config.projector_type = \"domino\")"
                .into(),
            fix: "set drafter.head = \"dflash\" and remove drafter.emb_dim, \
                  drafter.gru_hidden_dim and drafter.pure_draft_prefix_len, or name a Domino \
                  drafter"
                .into(),
        }],
        (DrafterHead::Dflash, DrafterHead::Domino(f)) => vec![Misfit {
            key: "drafter.head",
            run: "\"dflash\"".into(),
            drafter: "\"domino\" (DominoDraftModel)".into(),
            fix: format!(
                "set drafter.head = \"domino\" with {}, or name a DFlash drafter",
                domino_keys(f)
            ),
        }],
        (DrafterHead::Dflash, DrafterHead::Dspark(f)) => vec![Misfit {
            key: "drafter.head",
            run: "\"dflash\"".into(),
            drafter: DSPARK_FILE_HEAD.into(),
            fix: format!(
                "set drafter.head = \"dspark\" with {}, or name a DFlash drafter",
                dspark_keys(f)
            ),
        }],
        (DrafterHead::Domino(_), DrafterHead::Dspark(f)) => vec![Misfit {
            key: "drafter.head",
            run: "\"domino\"".into(),
            drafter: DSPARK_FILE_HEAD.into(),
            fix: format!(
                "set drafter.head = \"dspark\" with {} and remove drafter.emb_dim, \
                 drafter.gru_hidden_dim and drafter.pure_draft_prefix_len, or name a Domino \
                 drafter",
                dspark_keys(f)
            ),
        }],
        (DrafterHead::Dspark(_), DrafterHead::Domino(f)) => vec![Misfit {
            key: "drafter.head",
            run: "\"dspark\"".into(),
            drafter: "\"domino\" (DominoDraftModel)".into(),
            fix: format!(
                "set drafter.head = \"domino\" with {} and remove the DSpark keys \
                 (drafter.markov_rank, drafter.markov_head_type, drafter.enable_confidence_head, \
                 drafter.confidence_head_with_markov), or name a DSpark or DFlash drafter",
                domino_keys(f)
            ),
        }],
    }
}

const DSPARK_FILE_HEAD: &str = "\"dspark\" (DSparkDraftModel)";

/// A head beside a DFlash2 one, as a refusal names it: DFlash2's keys in full.
fn dflash2_words(head: &DrafterHead) -> String {
    match head {
        DrafterHead::Dflash2(c) => format!(
            "\"dflash2\" (conv_kernel_size {}, conv_group_size {}, selector_rank {}, \
             selector_top_k {}, output_multiplier {}, final_logit_softcapping {})",
            c.conv_kernel_size,
            c.conv_group_size,
            c.selector_rank,
            c.selector_top_k,
            c.output_multiplier,
            c.final_logit_softcapping
                .map_or_else(|| "unset".to_string(), |v| v.to_string())
        ),
        other => format!("\"{}\"", head_name(other)),
    }
}

/// The Domino keys of `f` as a config sets them.
fn domino_keys(f: &DominoConfig) -> String {
    format!(
        "drafter.emb_dim = {}, drafter.gru_hidden_dim = {} and \
         drafter.pure_draft_prefix_len = {}",
        f.emb_dim, f.gru_hidden_dim, f.pure_draft_prefix_len
    )
}

/// The DSpark keys of `f` as a config sets them.
fn dspark_keys(f: &DsparkConfig) -> String {
    format!(
        "drafter.markov_rank = {}, drafter.markov_head_type = \"{}\", \
         drafter.enable_confidence_head = {} and drafter.confidence_head_with_markov = {}",
        f.markov_rank,
        f.markov_head_type.as_str(),
        f.confidence_head,
        f.confidence_head_with_markov
    )
}

/// Both heads Domino: each width or prefix that differs.
fn domino_misfits(r: &DominoConfig, f: &DominoConfig) -> Vec<Misfit> {
    let mut out = Vec::new();
    for (key, run, drafter) in [
        ("drafter.emb_dim", r.emb_dim, f.emb_dim),
        ("drafter.gru_hidden_dim", r.gru_hidden_dim, f.gru_hidden_dim),
        (
            "drafter.pure_draft_prefix_len",
            r.pure_draft_prefix_len,
            f.pure_draft_prefix_len,
        ),
    ] {
        if run != drafter {
            out.push(Misfit {
                key,
                run: run.to_string(),
                drafter: drafter.to_string(),
                fix: format!("set {key} = {drafter}, or name a Domino drafter of the run's widths"),
            });
        }
    }
    out
}

/// Both heads DSpark: each key of the Markov and confidence heads that differs. The heads'
/// weights only load into heads of their own shape and function.
fn dspark_misfits(r: &DsparkConfig, f: &DsparkConfig) -> Vec<Misfit> {
    let kind = |c: &DsparkConfig| format!("\"{}\"", c.markov_head_type.as_str());
    let mut out = Vec::new();
    for (key, run, drafter) in [
        (
            "drafter.markov_rank",
            r.markov_rank.to_string(),
            f.markov_rank.to_string(),
        ),
        ("drafter.markov_head_type", kind(r), kind(f)),
        (
            "drafter.enable_confidence_head",
            r.confidence_head.to_string(),
            f.confidence_head.to_string(),
        ),
        (
            "drafter.confidence_head_with_markov",
            r.confidence_head_with_markov.to_string(),
            f.confidence_head_with_markov.to_string(),
        ),
    ] {
        if run != drafter {
            let fix = format!(
                "set {key} = {drafter}, or name a DSpark drafter of the run's heads (or a DFlash \
                 drafter: its backbone loads and the DSpark heads start fresh)"
            );
            out.push(Misfit {
                key,
                run,
                drafter,
                fix,
            });
        }
    }
    out
}

/// What the target decides: its vocabulary, its hidden width (the `fc` input) and its depth
/// (what the tap ids mean). No `[drafter]` key changes them: only a drafter of this target fits.
fn target_misfits(run: &DrafterConfig, file: &DrafterConfig) -> Vec<Misfit> {
    let fix = "the drafter was trained for another target: name a drafter of target.model's \
               model, or set target.model to the drafter's target";
    let mut out = Vec::new();
    for (what, run, drafter) in [
        ("vocabulary", run.vocab_size, file.vocab_size),
        (
            "hidden size",
            run.target_hidden_size,
            file.target_hidden_size,
        ),
    ] {
        if run != drafter {
            out.push(Misfit {
                key: "target.model",
                run: format!("a target of {what} {run}"),
                drafter: format!("{what} {drafter}"),
                fix: fix.into(),
            });
        }
    }
    if let (Some(run), Some(drafter)) = (run.num_target_layers, file.num_target_layers) {
        if run != drafter {
            out.push(Misfit {
                key: "target.model",
                run: format!("a target of {run} layers"),
                drafter: format!("num_target_layers {drafter}"),
                fix: fix.into(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::tiny_drafter_config;
    use crate::model::drafter::MarkovHeadType;
    use crate::model::target::TargetConfig;
    use tch::Kind;

    /// A source of `config` whose weights list is empty: `misfits` and `tensor_problems` read
    /// no file, so the index only has to exist.
    fn source_with(config: DrafterConfig) -> DrafterSource {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"weight_map": {}}"#,
        )
        .unwrap();
        DrafterSource {
            dir: PathBuf::from("/drafters/x"),
            config,
            index: CheckpointIndex::open(dir.path()).unwrap(),
            stored: BTreeMap::new(),
        }
    }

    fn run_config() -> DrafterConfig {
        tiny_drafter_config(&TargetConfig::tiny_default())
    }

    #[test]
    fn each_difference_names_the_run_key_and_the_value_to_set() {
        let run = run_config();
        assert!(source_with(run.clone()).misfits(&run).is_empty());
        let mut file = run.clone();
        file.block_size = 16;
        file.target_layer_ids = vec![0, 2];
        file.layer_types = vec![LayerType::Full, LayerType::Full];
        let text: Vec<String> = source_with(file)
            .misfits(&run)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            text,
            [
                "drafter.layer_types: the run has [\"sliding_attention\", \"full_attention\"], \
                 the drafter has [\"full_attention\", \"full_attention\"]; set \
                 drafter.layer_types = [\"full_attention\", \"full_attention\"], or name a \
                 drafter of the run's shape",
                "drafter.block_size: the run has 8, the drafter has 16; set drafter.block_size \
                 = 16, or name a drafter of the run's shape",
                "drafter.target_layer_ids: the run has [1, 3], the drafter has [0, 2]; set \
                 drafter.target_layer_ids = [0, 2], or name a drafter of the run's shape",
            ]
        );
    }

    #[test]
    fn a_head_of_another_kind_or_width_and_another_target_are_named() {
        let run = run_config();
        let Some(&domino) = run.head.domino() else {
            panic!("the embedded default's head is Domino");
        };
        let mut file = run.clone();
        file.head = DrafterHead::Domino(DominoConfig {
            emb_dim: domino.emb_dim * 2,
            ..domino
        });
        file.vocab_size += 1;
        let misfits = source_with(file).misfits(&run);
        let keys: Vec<&str> = misfits.iter().map(|m| m.key).collect();
        assert_eq!(keys, ["drafter.emb_dim", "target.model"]);
        assert!(misfits[0]
            .fix
            .contains(&format!("drafter.emb_dim = {}", domino.emb_dim * 2)));

        let mut dflash = run.clone();
        dflash.head = DrafterHead::Dflash;
        let misfits = source_with(dflash).misfits(&run);
        assert_eq!(
            misfits.len(),
            1,
            "the kind alone, not each width: {misfits:?}"
        );
        assert_eq!(misfits[0].key, "drafter.head");
        assert!(
            misfits[0].fix.contains("drafter.head = \"dflash\""),
            "{}",
            misfits[0]
        );
    }

    fn dspark_run(markov_rank: i64, kind: MarkovHeadType, confidence: bool) -> DrafterConfig {
        DrafterConfig {
            head: DrafterHead::Dspark(DsparkConfig {
                markov_rank,
                markov_head_type: kind,
                confidence_head: confidence,
                confidence_head_with_markov: confidence && markov_rank > 0,
            }),
            ..run_config()
        }
    }

    #[test]
    fn a_dspark_run_fits_a_dflash_drafter_backbone_and_a_dspark_drafter_of_its_heads() {
        let run = dspark_run(16, MarkovHeadType::Gated, true);
        let dflash = source_with(DrafterConfig {
            head: DrafterHead::Dflash,
            ..run.clone()
        });
        assert!(dflash.misfits(&run).is_empty());
        // Over a DFlash drafter the DSpark heads start fresh, and nothing else does.
        for name in [
            "markov_head.markov_w1.weight",
            "markov_head.gate_proj.bias",
            "confidence_head.proj.weight",
        ] {
            assert!(dflash.leaves_fresh(&run, name), "{name}");
        }
        for name in ["fc.weight", "layers.0.mlp.up_proj.weight", "norm.weight"] {
            assert!(!dflash.leaves_fresh(&run, name), "{name}");
        }
        // A DSpark drafter of the same heads loads them all.
        let same = source_with(run.clone());
        assert!(same.misfits(&run).is_empty());
        assert!(!same.leaves_fresh(&run, "markov_head.markov_w1.weight"));
        // A DFlash run keeps every parameter to load.
        let dflash_run = DrafterConfig {
            head: DrafterHead::Dflash,
            ..run.clone()
        };
        assert!(!dflash.leaves_fresh(&dflash_run, "markov_head.markov_w1.weight"));
    }

    #[test]
    fn dspark_heads_that_differ_are_named_with_the_value_to_set() {
        let run = dspark_run(16, MarkovHeadType::Gated, true);
        let text: Vec<String> = source_with(dspark_run(8, MarkovHeadType::Rnn, false))
            .misfits(&run)
            .iter()
            .map(ToString::to_string)
            .collect();
        let tail =
            "or name a DSpark drafter of the run's heads (or a DFlash drafter: its backbone \
                    loads and the DSpark heads start fresh)";
        assert_eq!(
            text,
            [
                format!(
                    "drafter.markov_rank: the run has 16, the drafter has 8; set \
                     drafter.markov_rank = 8, {tail}"
                ),
                format!(
                    "drafter.markov_head_type: the run has \"gated\", the drafter has \"rnn\"; \
                     set drafter.markov_head_type = \"rnn\", {tail}"
                ),
                format!(
                    "drafter.enable_confidence_head: the run has true, the drafter has false; \
                     set drafter.enable_confidence_head = false, {tail}"
                ),
                format!(
                    "drafter.confidence_head_with_markov: the run has true, the drafter has \
                     false; set drafter.confidence_head_with_markov = false, {tail}"
                ),
            ]
        );
    }

    #[test]
    fn a_dspark_drafter_under_another_head_is_refused_with_its_keys() {
        let file = dspark_run(8, MarkovHeadType::Rnn, true);
        let keys = "drafter.markov_rank = 8, drafter.markov_head_type = \"rnn\", \
                    drafter.enable_confidence_head = true and \
                    drafter.confidence_head_with_markov = true";
        let dflash_run = DrafterConfig {
            head: DrafterHead::Dflash,
            ..run_config()
        };
        let domino_run = run_config();
        assert!(domino_run.head.domino().is_some());
        for (run, name) in [(&dflash_run, "dflash"), (&domino_run, "domino")] {
            let misfits = source_with(file.clone()).misfits(run);
            assert_eq!(misfits.len(), 1, "{misfits:?}");
            let text = misfits[0].to_string();
            assert!(
                text.starts_with(&format!(
                    "drafter.head: the run has \"{name}\", the drafter has \"dspark\" \
                     (DSparkDraftModel); set drafter.head = \"dspark\" with {keys}"
                )),
                "{text}"
            );
        }
        // A DSpark run over a Domino drafter: the kind, and the Domino keys to set.
        let misfits = source_with(run_config()).misfits(&file);
        assert_eq!(misfits.len(), 1, "{misfits:?}");
        assert!(
            misfits[0]
                .fix
                .starts_with("set drafter.head = \"domino\" with drafter.emb_dim = ")
                && misfits[0].fix.contains("remove the DSpark keys"),
            "{}",
            misfits[0]
        );
    }

    #[test]
    fn extra_tensors_are_refused_unless_they_are_the_targets_own_or_derived() {
        let mut source = source_with(run_config());
        let stored = |shape: &[i64], kind: Option<Kind>| StoredTensor {
            file: PathBuf::from("/drafters/x/model.safetensors"),
            shape: shape.to_vec(),
            dtype: if kind.is_some() { "F32" } else { "I64" }.into(),
            kind,
        };
        source.stored = BTreeMap::from([
            ("a".to_string(), stored(&[2, 3], Some(Kind::Float))),
            ("b".to_string(), stored(&[4], Some(Kind::Float))),
            ("c".to_string(), stored(&[1], None)),
            (
                "embed_tokens.weight".to_string(),
                stored(&[9, 2], Some(Kind::Float)),
            ),
            (
                "layers.0.self_attn.rotary_emb.inv_freq".to_string(),
                stored(&[4], Some(Kind::Float)),
            ),
            ("stray".to_string(), stored(&[1], Some(Kind::Float))),
        ]);
        let params = [
            ("a".to_string(), vec![2, 3]),
            ("b".to_string(), vec![5]),
            ("c".to_string(), vec![1]),
            ("d".to_string(), vec![7]),
        ];
        let (problems, not_loaded) = source.tensor_problems(&params);
        assert_eq!(
            not_loaded,
            [
                "embed_tokens.weight",
                "layers.0.self_attn.rotary_emb.inv_freq"
            ]
        );
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].contains("`b` has shape [4]") && problems[0].contains("[5]"));
        assert!(problems[1].contains("`c` is stored as I64"));
        assert!(problems[2].contains("`d` (shape [7]) is missing"));
        assert!(problems[3].contains("`stray`") && problems[3].contains("not a parameter"));
    }
}
