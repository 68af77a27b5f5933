//! The benchmark configurations, by name. Pure data: the same name always means the same
//! shapes, seeds and data, so runs on different days (and the engine vs the reference) compare.
use dflash_engine::embedded::{tiny_dflash_drafter_config, tiny_target_config, tiny_train_config};
use dflash_engine::model::drafter::{DrafterConfig, LayerType};
use dflash_engine::model::target::{Qwen3_5LayerKind, Qwen3_5TextConfig, TargetConfig};

use super::error::BenchError;

/// Where a drafter-step case gets its tokens from.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenSource {
    /// The first `batch` samples of the embedded tiny dataset (what `dflashd start` trains on).
    TinyDataset,
    /// Seeded uniform tokens; the first `prompt_len` positions of each row are unsupervised.
    Random { prompt_len: usize },
}

/// Where the target features (and the frozen embedding / LM head) come from.
#[derive(Debug, Clone, PartialEq)]
pub enum FeatureSource {
    /// A randomly initialised target of this config, run forward on the batch.
    Target(TargetConfig),
    /// Seeded normal features and `N(0, 0.02)` tables, for configs whose target would be too
    /// large to build just to benchmark the drafter (the GPU config).
    Random { vocab_size: i64 },
}

/// One drafter training-step configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPreset {
    pub name: &'static str,
    pub drafter: DrafterConfig,
    pub features: FeatureSource,
    pub tokens: TokenSource,
    pub batch: usize,
    /// Row length for random tokens (the tiny dataset brings its own lengths).
    pub seq_len: usize,
    pub num_anchors: usize,
    pub loss_chunk_positions: i64,
    /// Constant learning rate of the timed steps.
    pub lr: f64,
    pub seed: u64,
    /// Case files (drafter weights, features, tables) are written in bf16 instead of f32, to
    /// keep the GPU case's files small; compute there is bf16 anyway.
    pub bf16_files: bool,
}

impl StepPreset {
    pub fn vocab_size(&self) -> i64 {
        match &self.features {
            FeatureSource::Target(t) => t.vocab_size(),
            FeatureSource::Random { vocab_size } => *vocab_size,
        }
    }
}

pub const STEP_PRESETS: &[&str] = &[
    "tiny",
    "small",
    "small-domino",
    "medium",
    "gpu-large",
    "real-structure",
];
pub const CPU_STEP_PRESETS: &[&str] = &["tiny", "small", "medium"];

fn qwen3_5_target(
    hidden: i64,
    layers: usize,
    vocab: i64,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
) -> TargetConfig {
    TargetConfig::Qwen3_5(Qwen3_5TextConfig {
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: 3 * hidden,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        linear_conv_kernel_dim: 4,
        linear_key_head_dim: head_dim,
        linear_value_head_dim: head_dim,
        linear_num_key_heads: kv_heads * 2,
        linear_num_value_heads: kv_heads * 4,
        layer_types: Qwen3_5LayerKind::hybrid_stack(
            layers,
            Qwen3_5LayerKind::DEFAULT_FULL_ATTENTION_INTERVAL,
        ),
        rms_norm_eps: 1e-6,
        rope_theta: 10_000_000.0,
        partial_rotary_factor: 0.25,
        attention_bias: false,
        tie_word_embeddings: false,
        max_position_embeddings: 8192,
    })
}

struct DrafterShape {
    hidden: i64,
    layers: Vec<LayerType>,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    block_size: i64,
    window: Option<i64>,
}

fn drafter(shape: DrafterShape, target_layers: usize, taps: usize, vocab: i64) -> DrafterConfig {
    DrafterConfig {
        hidden_size: shape.hidden,
        intermediate_size: 3 * shape.hidden,
        num_hidden_layers: shape.layers.len(),
        num_attention_heads: shape.heads,
        num_key_value_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        rms_norm_eps: 1e-6,
        rope_theta: 10_000_000.0,
        layer_types: shape.layers,
        sliding_window: shape.window,
        block_size: shape.block_size,
        mask_token_id: vocab - 1,
        target_layer_ids: DrafterConfig::build_target_layer_ids(target_layers, taps),
        target_hidden_size: shape.hidden,
        vocab_size: vocab,
        max_position_embeddings: 8192,
        num_target_layers: Some(target_layers),
        initializer_range: 0.02,
        head: Default::default(),
    }
}

/// `small` with a Domino head (the embedded default's widths, emb 64 and GRU 128, and the
/// recipes' pure-draft prefix of 1 slot): the case that holds the plan's Domino terms to the
/// kernels counted and the memory measured. Its features and tables are drawn at random
/// instead of run through `small`'s target: a step's FLOPs and memory depend on the shapes
/// alone, and the case prepares in a second instead of several. The Python reference
/// implements DFlash's head only, so this case has no reference run.
fn small_domino() -> Result<StepPreset, BenchError> {
    use dflash_engine::model::drafter::{DominoConfig, DrafterHead};
    let mut preset = step_preset("small")?;
    preset.name = "small-domino";
    preset.features = FeatureSource::Random {
        vocab_size: preset.vocab_size(),
    };
    preset.drafter.head = DrafterHead::Domino(DominoConfig {
        emb_dim: 64,
        gru_hidden_dim: 128,
        pure_draft_prefix_len: 1,
    });
    Ok(preset)
}

/// The GPU check's second parity shape: a preset whose sliding layer runs several attention
/// chunks (the tiny one runs one).
pub const PARITY_MULTI_CHUNK: &str = "small";

/// The drafter-step preset called `name`.
pub fn step_preset(name: &str) -> Result<StepPreset, BenchError> {
    let preset = match name {
        "tiny" => tiny_step_preset(),
        "small" => small_step_preset(),
        "medium" => medium_step_preset(),
        "gpu-large" => gpu_large_step_preset(),
        "real-structure" => real_structure_step_preset(),
        "small-domino" => small_domino()?,
        other => {
            return Err(BenchError::Unknown {
                what: "step config",
                found: other.into(),
                expected: STEP_PRESETS.join(", "),
            })
        }
    };
    Ok(preset)
}

/// The embedded default `dflashd start` trains, with DFlash's head: the one head the
/// Python reference implements, so the engine and the reference run the same step
/// (the bench's step trains whichever head its drafter has).
fn tiny_step_preset() -> StepPreset {
    let target = tiny_target_config();
    let train = tiny_train_config();
    StepPreset {
        name: "tiny",
        drafter: tiny_dflash_drafter_config(&target),
        features: FeatureSource::Target(target),
        tokens: TokenSource::TinyDataset,
        batch: train.training.batch_size,
        seq_len: train.training.max_length,
        num_anchors: train.training.num_anchors,
        loss_chunk_positions: train.training.loss_chunk_positions as i64,
        lr: train.training.lr,
        seed: 1,
        bf16_files: false,
    }
}

fn small_step_preset() -> StepPreset {
    use LayerType::{Full, Sliding};
    let (vocab, target_layers) = (4096, 8);
    let shape = DrafterShape {
        hidden: 256,
        layers: vec![Sliding, Full],
        heads: 8,
        kv_heads: 2,
        head_dim: 32,
        block_size: 16,
        window: Some(256),
    };
    StepPreset {
        name: "small",
        drafter: drafter(shape, target_layers, 2, vocab),
        features: FeatureSource::Target(qwen3_5_target(256, target_layers, vocab, 4, 2, 64)),
        tokens: TokenSource::Random { prompt_len: 64 },
        batch: 2,
        seq_len: 512,
        num_anchors: 32,
        loss_chunk_positions: 2048,
        lr: 6e-4,
        seed: 2,
        bf16_files: false,
    }
}

fn medium_step_preset() -> StepPreset {
    use LayerType::{Full, Sliding};
    let (vocab, target_layers) = (16384, 8);
    let shape = DrafterShape {
        hidden: 512,
        layers: vec![Sliding, Full, Full],
        heads: 8,
        kv_heads: 4,
        head_dim: 64,
        block_size: 16,
        window: Some(512),
    };
    StepPreset {
        name: "medium",
        drafter: drafter(shape, target_layers, 3, vocab),
        features: FeatureSource::Target(qwen3_5_target(512, target_layers, vocab, 8, 2, 64)),
        tokens: TokenSource::Random { prompt_len: 128 },
        batch: 1,
        seq_len: 1024,
        num_anchors: 64,
        loss_chunk_positions: 2048,
        lr: 6e-4,
        seed: 3,
        bf16_files: false,
    }
}

/// One large GPU (H200 class): a Qwen3-8B-sized DFlash drafter (hidden 4096, 5 layers,
/// 32/8 heads of 128) at the spec's training shape (4096 tokens, 512 anchors, block 16).
/// The vocabulary is cut to 64K so the case files stay small; the LM head is then a
/// smaller share of the step than with a 152K-248K vocabulary.
fn gpu_large_step_preset() -> StepPreset {
    use LayerType::Full;
    let vocab = 65536;
    let shape = DrafterShape {
        hidden: 4096,
        layers: vec![Full; 5],
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        block_size: 16,
        window: None,
    };
    StepPreset {
        name: "gpu-large",
        drafter: drafter(shape, 36, 5, vocab),
        features: FeatureSource::Random { vocab_size: vocab },
        tokens: TokenSource::Random { prompt_len: 256 },
        batch: 1,
        seq_len: 4096,
        num_anchors: 512,
        loss_chunk_positions: 2048,
        lr: 6e-4,
        seed: 4,
        bf16_files: true,
    }
}

/// The real drafter's structure (configs/qwen3.6-27b-8gpu.toml: 1024 anchors of 32 over
/// 3072 tokens, 4 sliding layers of window 2048 + 1 full, GQA 4:1, head_dim 128) with
/// hidden 256, 4/1 heads and a 8K vocabulary, so a CPU step fits a few GB and minutes
/// (the `plan` case's memory check at the real anchor layout).
fn real_structure_step_preset() -> StepPreset {
    use LayerType::{Full, Sliding};
    let vocab = 8192;
    let shape = DrafterShape {
        hidden: 256,
        layers: vec![Sliding, Sliding, Sliding, Sliding, Full],
        heads: 4,
        kv_heads: 1,
        head_dim: 128,
        block_size: 32,
        window: Some(2048),
    };
    StepPreset {
        name: "real-structure",
        drafter: drafter(shape, 8, 5, vocab),
        features: FeatureSource::Random { vocab_size: vocab },
        tokens: TokenSource::Random { prompt_len: 460 },
        batch: 1,
        seq_len: 3072,
        num_anchors: 1024,
        loss_chunk_positions: 2048,
        lr: 6e-4,
        seed: 5,
        bf16_files: false,
    }
}

/// The attention case (spec §2.5 at the training shape, heads and dims scaled down).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionPreset {
    pub anchors: usize,
    pub block_size: i64,
    pub context_len: usize,
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    /// `None`: a full-attention layer; `Some(w)`: a sliding layer of window `w`.
    pub window: Option<i64>,
    pub seed: u64,
}

impl AttentionPreset {
    pub fn at(anchors: usize) -> Self {
        Self {
            anchors,
            block_size: 32,
            context_len: 2048,
            heads: 1,
            kv_heads: 1,
            head_dim: 32,
            window: None,
            seed: 5,
        }
    }

    pub fn queries(&self) -> i64 {
        self.anchors as i64 * self.block_size
    }

    /// Elements of the dense `[B·Hq, Q, S+Q]` score grid.
    pub fn dense_grid_elements(&self) -> i64 {
        self.heads * self.queries() * (self.context_len as i64 + self.queries())
    }

    /// An estimate of the dense-mask path's peak bytes (forward + backward), with margin:
    /// 8 bytes per grid element, above what both dense paths were measured to grow by
    /// (docs/BENCHMARKS.md#dense-mask-memory-per-grid-element).
    pub fn dense_bytes_estimate(&self) -> u64 {
        self.dense_grid_elements() as u64 * 8
    }
}

/// Anchor counts of the attention ladder: the training shape (1024) and smaller ones, so the
/// dense mask's growth is measured where it still fits.
pub const ATTENTION_LADDER: &[usize] = &[128, 256, 512, 1024];

/// The target feature-pass case: a Qwen3.5 hybrid (Gated DeltaNet + gated attention).
#[derive(Debug, Clone, PartialEq)]
pub struct TargetPreset {
    pub target: TargetConfig,
    pub batch: usize,
    pub seq_len: usize,
    pub layer_ids: Vec<usize>,
    pub seed: u64,
}

pub fn target_preset(quick: bool) -> TargetPreset {
    // 8 layers, full attention at 3 and 7; taps 1, 3, 6 (GDN, full, GDN). 1024 tokens are 16
    // chunks of the chunked delta rule.
    let (hidden, seq_len) = if quick { (256, 512) } else { (512, 1024) };
    TargetPreset {
        target: qwen3_5_target(hidden, 8, 8192, 8, 2, 64),
        batch: 1,
        seq_len,
        layer_ids: vec![1, 3, 6],
        seed: 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention calls per layer the engine makes at a preset's typical step (the plan's
    /// chunk scheduler, the one `ChunkSchedule` runs).
    fn chunks_per_layer(name: &str) -> Vec<usize> {
        use dflash_engine::plan::drafter::{drafter_memory, RankContext};
        use dflash_engine::plan::shape::{ActivationPrecision, StepShape};
        let p = step_preset(name).unwrap();
        let shape = StepShape::typical(
            &p.drafter,
            p.batch as i64,
            p.seq_len as i64,
            p.num_anchors as i64,
            0.85,
            p.loss_chunk_positions,
        );
        let rank = RankContext::alone(ActivationPrecision::Bf16Cuda, false);
        drafter_memory(&p.drafter, &shape, rank).chunks_per_layer
    }

    #[test]
    fn the_gpu_check_parities_cover_one_chunk_and_several() {
        assert!(
            chunks_per_layer("tiny").iter().all(|&c| c == 1),
            "{:?}",
            chunks_per_layer("tiny")
        );
        assert!(
            chunks_per_layer(PARITY_MULTI_CHUNK).iter().any(|&c| c > 1),
            "{:?}",
            chunks_per_layer(PARITY_MULTI_CHUNK)
        );
    }

    #[test]
    fn every_step_preset_is_a_valid_drafter_over_its_target() {
        for name in STEP_PRESETS {
            let p = step_preset(name).unwrap();
            p.drafter.validate(name).unwrap();
            assert!(p.drafter.mask_token_id < p.vocab_size(), "{name}");
            if let FeatureSource::Target(t) = &p.features {
                t.validate().unwrap();
                assert_eq!(t.hidden_size(), p.drafter.target_hidden_size, "{name}");
                assert!(
                    p.drafter
                        .target_layer_ids
                        .iter()
                        .all(|&l| l < t.num_layers()),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn tiny_is_the_embedded_default_with_dflashs_head() {
        use dflash_engine::embedded::tiny_drafter_config;
        use dflash_engine::model::drafter::DrafterHead;
        let p = step_preset("tiny").unwrap();
        let default = tiny_drafter_config(&tiny_target_config());
        assert_eq!(
            p.drafter,
            DrafterConfig {
                head: DrafterHead::Dflash,
                ..default
            }
        );
        assert_eq!(p.tokens, TokenSource::TinyDataset);
    }

    #[test]
    fn small_domino_is_small_with_a_domino_head() {
        use dflash_engine::model::drafter::DrafterHead;
        let (small, domino) = (
            step_preset("small").unwrap(),
            step_preset("small-domino").unwrap(),
        );
        assert!(small.drafter.head.domino().is_none());
        let head = *domino.drafter.head.domino().expect("a Domino head");
        assert_eq!(domino.vocab_size(), small.vocab_size());
        assert_eq!(
            StepPreset {
                name: "small",
                drafter: DrafterConfig {
                    head: DrafterHead::Dflash,
                    ..domino.drafter.clone()
                },
                features: small.features.clone(),
                ..domino
            },
            small
        );
        assert!(head.pure_draft_prefix_len > 0, "{head:?}");
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = step_preset("huge").unwrap_err().to_string();
        assert!(err.contains("huge") && err.contains("medium"), "{err}");
    }

    #[test]
    fn the_dense_grid_at_the_training_shape_is_what_the_spec_says() {
        let p = AttentionPreset::at(1024);
        assert_eq!(p.queries(), 32 * 1024);
        assert_eq!(p.dense_grid_elements(), 32768 * (2048 + 32768));
    }

    #[test]
    fn target_preset_taps_both_layer_kinds() {
        let p = target_preset(false);
        p.target.validate().unwrap();
        let TargetConfig::Qwen3_5(c) = &p.target else {
            panic!("a Qwen3.5 target")
        };
        let kinds: Vec<_> = p.layer_ids.iter().map(|&l| c.layer_types[l]).collect();
        assert!(kinds.contains(&Qwen3_5LayerKind::FullAttention));
        assert!(kinds.contains(&Qwen3_5LayerKind::LinearAttention));
    }
}
