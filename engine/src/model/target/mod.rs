//! The frozen target models (Qwen3.5 / Qwen3.6 hybrid, Qwen3 dense): HF checkpoint loading and
//! feature extraction (the residual stream after chosen decoder layers, HF `hidden_states[L+1]`).
mod attention;
mod cache;
mod config;
mod decoder;
pub mod delta_rule;
mod gated_deltanet;
mod hf_config;
mod hf_io;
mod mlp;
mod norm;
mod params;
mod qwen3;
mod qwen3_5;
mod self_attention;
mod tree;

use std::path::Path;

use serde_json::Value;
use tch::{Device, Kind, Tensor};

pub use cache::TargetCache;
pub use config::{
    CheckpointLayout, Qwen3Config, Qwen3_5LayerKind, Qwen3_5TextConfig, TargetConfig,
};
pub use hf_io::{param_specs, LoadOptions, DEFAULT_MAX_SHARD_BYTES};
pub use params::ParamSpec;
pub use tree::TreeShape;

use self::decoder::{DecoderLayer, LayerContext, NewTokens, NormStyle};
use self::hf_io::{SaveRequest, EMBED_TOKENS, FINAL_NORM, LM_HEAD};
use self::params::Params;
use crate::model::error::ModelError;
use crate::model::layers::Rotary;

/// What a [`TargetModel`] is assembled from: its config and its parameters, named as in the
/// checkpoint, for decoder layers `0..layers`.
struct ModelParts<'a> {
    config: TargetConfig,
    layout: CheckpointLayout,
    /// The config.json the model was loaded from, if any.
    raw_config: Option<Value>,
    params: Params,
    specs: &'a [ParamSpec],
    layers: usize,
}

pub struct TargetModel {
    config: TargetConfig,
    layout: CheckpointLayout,
    raw_config: Option<Value>,
    embed_tokens: Tensor,
    final_norm: Tensor,
    lm_head: Tensor,
    layers: Vec<DecoderLayer>,
    rotary: Rotary,
    norm_style: NormStyle,
    /// Relative name → tensor (shallow clones of the module tensors), for `save_hf`.
    named: Vec<(String, Tensor)>,
    device: Device,
    kind: Kind,
}

impl TargetModel {
    /// Loads a HF checkpoint directory on `device`, in the checkpoint's dtype or `dtype`.
    pub fn load(dir: &Path, device: Device, dtype: Option<Kind>) -> Result<Self, ModelError> {
        Self::load_with(
            dir,
            LoadOptions {
                device,
                dtype,
                max_layers: None,
            },
        )
    }

    pub fn load_with(dir: &Path, options: LoadOptions) -> Result<Self, ModelError> {
        if let Some(kind) = options.dtype {
            check_float_kind(kind)?;
        }
        let loaded = hf_io::load(dir, options)?;
        let parts = ModelParts {
            config: loaded.config,
            layout: loaded.layout,
            raw_config: Some(loaded.raw_config),
            params: loaded.params,
            specs: &loaded.specs,
            layers: loaded.layers,
        };
        Self::assemble(parts, options.device, loaded.kind)
    }

    /// A freshly initialised model (HF-like init; norms slightly perturbed), deterministic in `seed`.
    /// Panics on an inconsistent hand-built config (configs read from files are validated on parse).
    pub fn random(cfg: TargetConfig, device: Device, dtype: Kind, seed: i64) -> Self {
        if let Err(what) = cfg.validate() {
            panic!("TargetModel::random: invalid hand-built config: {what}");
        }
        let layers = cfg.num_layers();
        let specs = param_specs(&cfg, layers);
        let params = Params::random(&specs, device, dtype, seed);
        let layout = CheckpointLayout::default_for(&cfg);
        // Every spec was just generated, so assembling cannot miss a tensor.
        let parts = ModelParts {
            config: cfg,
            layout,
            raw_config: None,
            params,
            specs: &specs,
            layers,
        };
        Self::assemble(parts, device, dtype)
            .unwrap_or_else(|e| unreachable!("random parameters cover every spec: {e}"))
    }

    /// The model of `parts` on `device`, its parameters in `kind`.
    fn assemble(parts: ModelParts<'_>, device: Device, kind: Kind) -> Result<Self, ModelError> {
        let ModelParts {
            config,
            layout,
            raw_config,
            mut params,
            specs,
            layers,
        } = parts;
        let named = specs
            .iter()
            .map(|spec| Ok((spec.name.clone(), params.get(&spec.name)?.shallow_clone())))
            .collect::<Result<Vec<_>, ModelError>>()?;
        let embed_tokens = params.take(EMBED_TOKENS)?;
        let final_norm = params.take(FINAL_NORM)?;
        let lm_head = match params.take_opt(LM_HEAD) {
            Some(head) => head,
            None => embed_tokens.shallow_clone(),
        };
        let mut built = Vec::with_capacity(layers);
        for layer in 0..layers {
            built.push(match &config {
                TargetConfig::Qwen3_5(c) => qwen3_5::build_layer(c, layer, &mut params)?,
                TargetConfig::Qwen3(c) => qwen3::build_layer(c, layer, &mut params)?,
            });
        }
        let (rotary, norm_style) = match &config {
            TargetConfig::Qwen3_5(c) => (
                Rotary::new(c.rotary_dim(), c.rope_theta, device),
                NormStyle::ZeroCentered,
            ),
            TargetConfig::Qwen3(c) => (
                Rotary::new(c.head_dim, c.rope_theta, device),
                NormStyle::Plain,
            ),
        };
        Ok(Self {
            config,
            layout,
            raw_config,
            embed_tokens,
            final_norm,
            lm_head,
            layers: built,
            rotary,
            norm_style,
            named,
            device,
            kind,
        })
    }

    /// The same model on `device` (one target replica per worker thread): weights shared
    /// with this model when `device` is its device (they are read-only), copied otherwise.
    pub fn replicate(&self, device: Device) -> Result<Self, ModelError> {
        let layers = self.layers.len();
        let specs = param_specs(&self.config, layers);
        let tensors = self
            .named
            .iter()
            .map(|(name, t)| {
                let t = if device == self.device {
                    t.shallow_clone()
                } else {
                    t.to_device(device)
                };
                (name.clone(), t)
            })
            .collect();
        let parts = ModelParts {
            config: self.config.clone(),
            layout: self.layout,
            raw_config: self.raw_config.clone(),
            params: Params::new(tensors),
            specs: &specs,
            layers,
        };
        Self::assemble(parts, device, self.kind)
    }

    /// Writes `config.json` and `model.safetensors` in the HF layout (Qwen3.5 as
    /// `Qwen3_5ForConditionalGeneration` unless it was loaded from another layout).
    pub fn save_hf(&self, dir: &Path) -> Result<(), ModelError> {
        self.save_hf_sharded(dir, DEFAULT_MAX_SHARD_BYTES)
    }

    /// As [`Self::save_hf`], splitting the weights into shards of at most `max_shard_bytes`.
    pub fn save_hf_sharded(&self, dir: &Path, max_shard_bytes: usize) -> Result<(), ModelError> {
        if self.layers.len() != self.config.num_layers() {
            return Err(ModelError::UnsupportedConfig {
                path: dir.to_path_buf(),
                what: format!(
                    "saving a model loaded with only {} of its {} layers",
                    self.layers.len(),
                    self.config.num_layers()
                ),
            });
        }
        hf_io::save(
            dir,
            &SaveRequest {
                config: &self.config,
                layout: self.layout,
                raw_config: self.raw_config.as_ref(),
                kind: self.kind,
                named: &self.named,
                max_shard_bytes,
            },
        )
    }

    pub fn config(&self) -> &TargetConfig {
        &self.config
    }

    pub fn layout(&self) -> CheckpointLayout {
        self.layout
    }

    pub fn device(&self) -> Device {
        self.device
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Decoder layers held (fewer than the config's when loaded with `max_layers`).
    pub fn loaded_layers(&self) -> usize {
        self.layers.len()
    }

    /// `[V,H]`, frozen.
    pub fn embed_tokens(&self) -> &Tensor {
        &self.embed_tokens
    }

    /// `[V,H]`, frozen (the embedding table itself when `tie_word_embeddings`).
    pub fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// Final RMSNorm weight (applied before `lm_head`; not part of the features).
    pub fn final_norm(&self) -> &Tensor {
        &self.final_norm
    }

    /// input_ids `[B,S]` int64 → `[B,S,len(layer_ids)*hidden]`; no grad; layer id L = residual
    /// stream after decoder layer L (HF `hidden_states[L+1]`), concatenated in the given order.
    /// Layers past `max(layer_ids)` are not run. Exactly as HF, the id of the LAST decoder layer
    /// yields the final-normed state (HF's `hidden_states[-1]` is `last_hidden_state`); DFlash's
    /// default taps never include it. There is no attention mask: rows are unpadded sequences
    /// starting at position 0 (right padding is harmless, everything is causal; left padding is not).
    pub fn features(&self, input_ids: &Tensor, layer_ids: &[usize]) -> Result<Tensor, ModelError> {
        Ok(self
            .hidden_states(input_ids, &FeatureRequest::taps(layer_ids))?
            .features)
    }

    /// As [`Self::features`] for `request.layer_ids`, and with `request.last_hidden` also the
    /// final-normed output of the last decoder layer `[B,S,hidden]` (what the target's LM head
    /// reads), from the same pass: the layers run once, up to the last one when it is asked
    /// for. The features are bit for bit what [`Self::features`] returns for the taps alone.
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        request: &FeatureRequest,
    ) -> Result<TargetHidden, ModelError> {
        let layer_ids = request.layer_ids.as_slice();
        if layer_ids.is_empty() {
            return Err(ModelError::BadInput {
                what: "no layer ids requested".into(),
            });
        }
        let read = request.layers_read(self.config.num_layers());
        let last = read.iter().copied().max().unwrap_or(0);
        if last >= self.layers.len() {
            return Err(ModelError::LayerOutOfRange {
                layer: last,
                available: self.layers.len(),
            });
        }
        let ids = self.validate_ids(input_ids)?;
        Ok(tch::no_grad(|| {
            let seq = ids.size()[1];
            let (cos, sin) = attention::prefill_cos_sin(&self.rotary, seq, self.device);
            let ctx = LayerContext {
                norm: self.norm_style,
                eps: self.config.rms_norm_eps(),
                cos: &cos,
                sin: &sin,
            };
            let mut taps: Vec<Option<Tensor>> = layer_ids.iter().map(|_| None).collect();
            let mut last_hidden = None;
            let final_layer = self.config.num_layers() - 1;
            let mut h = Tensor::embedding(&self.embed_tokens, &ids, -1, false, false);
            for (index, layer) in self.layers[..=last].iter().enumerate() {
                h = layer.forward(&h, &ctx);
                // transformers replaces hidden_states[-1] by the final-normed last_hidden_state
                // (`capture_outputs(tie_last_hidden_states=True)`); DFlash taps follow HF.
                let tap = if index == final_layer {
                    self.norm_style.apply(&h, &self.final_norm, ctx.eps)
                } else {
                    h.shallow_clone()
                };
                for (slot, _) in layer_ids.iter().enumerate().filter(|(_, &l)| l == index) {
                    taps[slot] = Some(tap.shallow_clone());
                }
                if request.last_hidden && index == final_layer {
                    last_hidden = Some(tap);
                }
            }
            let taps: Vec<Tensor> = taps.into_iter().flatten().collect();
            TargetHidden {
                features: Tensor::cat(&taps, -1),
                last_hidden,
            }
        }))
    }

    /// An empty decoding cache for [`Self::forward_cached`].
    pub fn new_cache(&self) -> TargetCache {
        TargetCache::new(self.layers.iter().map(|l| l.new_cache()).collect())
    }

    /// Incremental forward: `input_ids` `[B,T]` are the tokens at positions
    /// `cache.len()..cache.len()+T` of sequences whose earlier tokens `cache` holds; appends them
    /// to `cache` (crop it afterwards to keep only an accepted prefix). Returns their logits
    /// `[B,T,V]` (fp32) and, per token, the tap features of `tap_layers` exactly as
    /// [`Self::features`] gives them (`[B,T,len·hidden]`; width 0 for no taps). Needs every
    /// decoder layer loaded. The same numbers as a full forward over the whole sequence up to
    /// rounding (the cached attention reads a mask, the delta rule starts from a state).
    pub fn forward_cached(
        &self,
        input_ids: &Tensor,
        cache: &mut TargetCache,
        tap_layers: &[usize],
    ) -> Result<CachedStep, ModelError> {
        self.forward_incremental(input_ids, cache, tap_layers, None)
    }

    /// As [`Self::forward_cached`] for new tokens that form a tree after the cached sequence
    /// (DDTree verification, batch 1): token `i` sits at position `cache.len() + depth(i)` and
    /// sees the cache, its ancestors and itself; Gated DeltaNet layers advance each token's
    /// state from its parent's. Every token's logits and taps are what a chain forward over its
    /// root-to-token path would give (up to rounding). Afterwards the cache holds the whole
    /// tree and refuses another forward until [`TargetCache::keep_path`] keeps one path.
    pub fn forward_tree(
        &self,
        input_ids: &Tensor,
        tree: &TreeShape,
        cache: &mut TargetCache,
        tap_layers: &[usize],
    ) -> Result<CachedStep, ModelError> {
        let size = input_ids.size();
        if size.len() != 2 || size[0] != 1 || size[1] != tree.len() as i64 {
            return Err(ModelError::BadInput {
                what: format!(
                    "a tree forward takes input ids [1, {}] (one sequence, one id per tree token), found {size:?}",
                    tree.len()
                ),
            });
        }
        self.forward_incremental(input_ids, cache, tap_layers, Some(tree))
    }

    fn forward_incremental(
        &self,
        input_ids: &Tensor,
        cache: &mut TargetCache,
        tap_layers: &[usize],
        tree: Option<&TreeShape>,
    ) -> Result<CachedStep, ModelError> {
        let num_layers = self.config.num_layers();
        if self.layers.len() != num_layers {
            return Err(ModelError::BadInput {
                what: format!(
                    "decoding needs all {num_layers} decoder layers; this model was loaded with {}",
                    self.layers.len()
                ),
            });
        }
        if let Some(&bad) = tap_layers.iter().find(|&&l| l >= num_layers) {
            return Err(ModelError::LayerOutOfRange {
                layer: bad,
                available: num_layers,
            });
        }
        cache.check_resolved()?;
        let ids = self.validate_ids(input_ids)?;
        // A tree that is a chain runs as one: same kernels, same numbers.
        let tree = tree.filter(|t| !t.is_chain());
        Ok(tch::no_grad(|| {
            let (batch, new) = (ids.size()[0], ids.size()[1]);
            let past = cache.len();
            let (positions, visible) = match tree {
                None => (
                    Tensor::arange_start(past, past + new, (Kind::Int64, self.device)),
                    attention::causal_offset_mask(past, new, self.device),
                ),
                Some(t) => (
                    t.positions(past, self.device),
                    t.visibility(past, self.device),
                ),
            };
            let (cos, sin) = self.rotary.cos_sin(&positions);
            let ctx = LayerContext {
                norm: self.norm_style,
                eps: self.config.rms_norm_eps(),
                cos: &cos,
                sin: &sin,
            };
            let new_tokens = NewTokens {
                visible: &visible,
                tree,
            };
            let mut taps: Vec<Option<Tensor>> = tap_layers.iter().map(|_| None).collect();
            let mut h = Tensor::embedding(&self.embed_tokens, &ids, -1, false, false);
            for (index, (layer, layer_cache)) in
                self.layers.iter().zip(cache.layers.iter_mut()).enumerate()
            {
                h = layer.forward_cached(&h, &ctx, layer_cache, &new_tokens);
                for (slot, _) in tap_layers.iter().enumerate().filter(|(_, &l)| l == index) {
                    taps[slot] = Some(if index == num_layers - 1 {
                        self.norm_style.apply(&h, &self.final_norm, ctx.eps)
                    } else {
                        h.shallow_clone()
                    });
                }
            }
            cache.appended(new, tree.cloned());
            let normed = self.norm_style.apply(&h, &self.final_norm, ctx.eps);
            let logits = normed
                .linear::<Tensor>(&self.lm_head, None)
                .to_kind(Kind::Float);
            let taps: Vec<Tensor> = taps.into_iter().flatten().collect();
            let taps = if taps.is_empty() {
                Tensor::zeros([batch, new, 0], (self.kind, self.device))
            } else {
                Tensor::cat(&taps, -1)
            };
            CachedStep { logits, taps }
        }))
    }

    /// Checks `[B,S]`, integer, every id in `0..vocab_size`; returns int64 ids on the model device.
    fn validate_ids(&self, input_ids: &Tensor) -> Result<Tensor, ModelError> {
        let size = input_ids.size();
        if size.len() != 2 || size[0] == 0 || size[1] == 0 {
            return Err(ModelError::BadInput {
                what: format!("expected shape [batch, seq] with both > 0, found {size:?}"),
            });
        }
        let kind = input_ids.kind();
        if !matches!(
            kind,
            Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8
        ) {
            return Err(ModelError::BadInput {
                what: format!("expected integer token ids (int64), found {kind:?}"),
            });
        }
        let ids = input_ids.to_kind(Kind::Int64);
        let vocab = self.config.vocab_size();
        let bad = ids.lt(0).logical_or(&ids.ge(vocab));
        if bad.any().int64_value(&[]) != 0 {
            let first = bad.nonzero().get(0);
            let position: Vec<i64> = Vec::<i64>::try_from(&first).map_err(ModelError::Torch)?;
            let token = ids.int64_value(&position);
            return Err(ModelError::TokenOutOfRange {
                token,
                position,
                vocab_size: vocab,
            });
        }
        Ok(ids.to_device(self.device))
    }
}

/// What a feature pass asks of the target: the tap layers, whose states are concatenated as
/// the drafter's features, and whether the final-normed last hidden state comes with them (a
/// drafter head that distils the target's own distribution needs it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeatureRequest {
    pub layer_ids: Vec<usize>,
    pub last_hidden: bool,
}

impl FeatureRequest {
    /// The tap layers' features alone.
    pub fn taps(layer_ids: &[usize]) -> Self {
        Self {
            layer_ids: layer_ids.to_vec(),
            last_hidden: false,
        }
    }

    /// The decoder layers whose outputs the pass reads from a target of `num_layers` layers:
    /// the taps, then the last layer when the last hidden state is asked for. The pass runs
    /// every layer up to the highest of them, so this is what its cost and its memory follow.
    pub fn layers_read(&self, num_layers: usize) -> Vec<usize> {
        let mut layers = self.layer_ids.clone();
        if self.last_hidden {
            layers.push(num_layers.saturating_sub(1));
        }
        layers
    }
}

/// What one [`TargetModel::hidden_states`] pass gives.
#[derive(Debug)]
pub struct TargetHidden {
    /// `[B,S,len(layer_ids)·hidden]`, the tap layers' states in the requested order.
    pub features: Tensor,
    /// `[B,S,hidden]`, the last decoder layer's final-normed output, when it was asked for.
    pub last_hidden: Option<Tensor>,
}

impl TargetHidden {
    /// Both tensors on `device` (the same tensors where they already are).
    pub fn to_device(&self, device: Device) -> Self {
        Self {
            features: self.features.to_device(device),
            last_hidden: self.last_hidden.as_ref().map(|t| t.to_device(device)),
        }
    }
}

/// What one [`TargetModel::forward_cached`] gives per new token.
pub struct CachedStep {
    /// `[B,T,V]`, fp32.
    pub logits: Tensor,
    /// `[B,T,len(tap_layers)·hidden]`, the drafter's context features of these tokens.
    pub taps: Tensor,
}

/// Float dtypes a target can run in.
pub fn check_float_kind(kind: Kind) -> Result<(), ModelError> {
    match kind {
        Kind::Float | Kind::BFloat16 | Kind::Half => Ok(()),
        other => Err(ModelError::UnsupportedDtype {
            found: format!("{other:?}"),
        }),
    }
}

/// `f32` / `bf16` / `f16` (and the torch spellings) → `Kind`.
pub fn parse_dtype(name: &str) -> Result<Kind, ModelError> {
    match name.to_ascii_lowercase().as_str() {
        "f32" | "fp32" | "float32" | "float" => Ok(Kind::Float),
        "bf16" | "bfloat16" => Ok(Kind::BFloat16),
        "f16" | "fp16" | "float16" | "half" => Ok(Kind::Half),
        _ => Err(ModelError::UnsupportedDtype {
            found: name.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests;
