//! Reading and writing the published DFlash drafter `config.json` (spec §1.2, §8.6): the Qwen3
//! fields plus `block_size`, `layer_types` and `dflash_config {mask_token_id,
//! target_layer_ids}`, with RoPE either as `rope_theta` or as transformers 5
//! `rope_parameters`.
//!
//! The reference loader (ZL `_draft_value`) looks a DFlash key up in `dflash_config` first and
//! then at the top level; reading does the same. Keys that would silently change the model
//! (YaRN RoPE, attention bias, a non-SiLU MLP, an `is_causal` that changes a layer, logit scaling) are
//! rejected with an error instead of being ignored.
//!
//! A Domino drafter (SpecForge's `DominoDraftModel`) is the same layout with
//! `architectures: ["DominoDraftModel"]` and `dflash_config.projector_type = "domino"`,
//! `emb_dim`, `gru_hidden_dim`, `pure_draft_prefix_len`, `shift_label`. SpecForge's recipe
//! config names `DFlashDraftModel` with `projector_type = "domino"`; either reads as Domino.
//! A DSpark drafter (`DSparkDraftModel`) is the layout with `projector_type = "dspark"`,
//! `markov_rank`, `markov_head_type`, `enable_confidence_head`, `confidence_head_with_markov`
//! and `attention_mode` in `dflash_config`; SGLang's normalised copy (`Qwen3DSparkModel`, the
//! keys at the top level) reads the same. A DFlash2 drafter (`DFlash2DraftModel`) carries
//! `conv_kernel_size`, `conv_group_size`, `selector_rank`, `selector_top_k` and optionally
//! `output_multiplier` and `final_logit_softcapping` in `dflash_config`.
//!
//! `heads.rs` reads the head, `writer.rs` writes the layout back.
use std::path::Path;

use serde_json::{json, Map, Value};

use super::config::{DrafterConfig, DrafterError, LayerType};

/// Qwen3Config defaults for keys that published drafter configs sometimes omit.
const QWEN3_DEFAULT_MAX_POSITION_EMBEDDINGS: i64 = 32768;
const QWEN3_DEFAULT_MAX_WINDOW_LAYERS: usize = 28;
const QWEN3_DEFAULT_INITIALIZER_RANGE: f64 = 0.02;
const QWEN3_DEFAULT_RMS_NORM_EPS: f64 = 1e-6;
/// ZL's default when a config carries no `block_size`.
const DFLASH_DEFAULT_BLOCK_SIZE: i64 = 16;

struct Reader<'a> {
    path: String,
    root: &'a Map<String, Value>,
}

fn describe(value: &Value) -> String {
    let text = value.to_string();
    if text.len() > 80 {
        format!("{}…", &text[..80])
    } else {
        text
    }
}

impl<'a> Reader<'a> {
    fn missing(&self, key: &str, hint: &str) -> DrafterError {
        DrafterError::MissingField {
            path: self.path.clone(),
            key: key.into(),
            hint: hint.into(),
        }
    }

    fn invalid(&self, key: &str, expected: &str, found: &Value) -> DrafterError {
        DrafterError::InvalidField {
            path: self.path.clone(),
            key: key.into(),
            expected: expected.into(),
            found: describe(found),
        }
    }

    fn unsupported(&self, key: &str, found: &Value, why: &str) -> DrafterError {
        DrafterError::Unsupported {
            path: self.path.clone(),
            key: key.into(),
            found: describe(found),
            why: why.into(),
        }
    }

    /// A present, non-null top-level value.
    fn top(&self, key: &str) -> Option<&'a Value> {
        self.root.get(key).filter(|v| !v.is_null())
    }

    fn dflash(&self) -> Option<&'a Map<String, Value>> {
        self.root.get("dflash_config").and_then(Value::as_object)
    }

    /// A DFlash key: `dflash_config.<key>` first, then top level. Returns the key as found.
    fn dflash_value(&self, key: &str) -> Option<(String, &'a Value)> {
        if let Some(v) = self
            .dflash()
            .and_then(|d| d.get(key))
            .filter(|v| !v.is_null())
        {
            return Some((format!("dflash_config.{key}"), v));
        }
        self.top(key).map(|v| (key.to_string(), v))
    }

    fn as_int(&self, key: &str, value: &Value) -> Result<i64, DrafterError> {
        value
            .as_i64()
            .ok_or_else(|| self.invalid(key, "an integer", value))
    }

    fn as_count(&self, key: &str, value: &Value) -> Result<usize, DrafterError> {
        value
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| self.invalid(key, "a non-negative integer", value))
    }

    fn as_float(&self, key: &str, value: &Value) -> Result<f64, DrafterError> {
        value
            .as_f64()
            .ok_or_else(|| self.invalid(key, "a number", value))
    }

    fn int(&self, key: &str) -> Result<i64, DrafterError> {
        let value = self
            .top(key)
            .ok_or_else(|| self.missing(key, "required Qwen3 field"))?;
        self.as_int(key, value)
    }

    fn int_or(&self, key: &str, default: i64) -> Result<i64, DrafterError> {
        self.top(key).map_or(Ok(default), |v| self.as_int(key, v))
    }

    fn float_or(&self, key: &str, default: f64) -> Result<f64, DrafterError> {
        self.top(key).map_or(Ok(default), |v| self.as_float(key, v))
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, DrafterError> {
        self.top(key).map_or(Ok(default), |v| {
            v.as_bool()
                .ok_or_else(|| self.invalid(key, "true or false", v))
        })
    }

    /// `rope_theta`, or `rope_parameters.rope_theta` (transformers 5; also accepted per layer
    /// type when all types agree), or `rope_scaling.rope_theta`. Only the default RoPE type.
    fn rope_theta(&self) -> Result<f64, DrafterError> {
        let mut theta = None;
        for key in ["rope_parameters", "rope_scaling"] {
            let Some(params) = self.top(key) else {
                continue;
            };
            let object = params
                .as_object()
                .ok_or_else(|| self.invalid(key, "an object", params))?;
            let per_type = ["full_attention", "sliding_attention"];
            let groups: Vec<(String, &Map<String, Value>)> =
                if per_type.iter().any(|t| object.contains_key(*t)) {
                    let mut groups = Vec::new();
                    for t in per_type {
                        if let Some(group) = object.get(t) {
                            let key = format!("{key}.{t}");
                            let group = group
                                .as_object()
                                .ok_or_else(|| self.invalid(&key, "an object", group))?;
                            groups.push((key, group));
                        }
                    }
                    groups
                } else {
                    vec![(key.to_string(), object)]
                };
            for (key, group) in groups {
                let kind = group.get("rope_type").or_else(|| group.get("type"));
                if let Some(kind) = kind.filter(|k| k.as_str() != Some("default")) {
                    return Err(self.unsupported(
                        &format!("{key}.rope_type"),
                        kind,
                        "only the default rotary embedding is implemented (no YaRN/linear/dynamic scaling)",
                    ));
                }
                if let Some(value) = group.get("rope_theta").filter(|v| !v.is_null()) {
                    let key = format!("{key}.rope_theta");
                    let value = self.as_float(&key, value)?;
                    if theta.is_some_and(|t| t != value) {
                        return Err(self.unsupported(
                            &key,
                            &json!(value),
                            "differs from another rope_theta in the config",
                        ));
                    }
                    theta = Some(value);
                }
            }
        }
        if let Some(value) = self.top("rope_theta") {
            let value = self.as_float("rope_theta", value)?;
            if theta.is_some_and(|t| t != value) {
                return Err(self.unsupported(
                    "rope_theta",
                    &json!(value),
                    "differs from rope_parameters.rope_theta",
                ));
            }
            theta = Some(value);
        }
        theta.ok_or_else(|| {
            self.missing(
                "rope_theta",
                "give `rope_theta` or `rope_parameters.rope_theta`",
            )
        })
    }

    fn layer_types(
        &self,
        num_layers: usize,
        sliding_window: Option<i64>,
    ) -> Result<Vec<LayerType>, DrafterError> {
        let Some(value) = self.top("layer_types") else {
            // Qwen3Config's derivation when the list is absent.
            let first_sliding =
                self.int_or("max_window_layers", QWEN3_DEFAULT_MAX_WINDOW_LAYERS as i64)?;
            let sliding_on = self.bool_or("use_sliding_window", false)? && sliding_window.is_some();
            return Ok((0..num_layers)
                .map(|i| {
                    if sliding_on && i as i64 >= first_sliding {
                        LayerType::Sliding
                    } else {
                        LayerType::Full
                    }
                })
                .collect());
        };
        let list = value
            .as_array()
            .ok_or_else(|| self.invalid("layer_types", "a list of layer type names", value))?;
        list.iter()
            .enumerate()
            .map(|(i, entry)| {
                entry
                    .as_str()
                    .and_then(LayerType::from_hf_name)
                    .ok_or_else(|| {
                        self.invalid(
                            &format!("layer_types[{i}]"),
                            "\"full_attention\" or \"sliding_attention\"",
                            entry,
                        )
                    })
            })
            .collect()
    }

    /// `is_causal`, which z-lab's loader reads as a value for every layer (absent: causal on
    /// sliding layers, bidirectional on full ones, as ours). A value is accepted where it says
    /// what the layer types already do (false: every layer full; true: every layer sliding),
    /// refused where it would change a layer.
    fn check_is_causal(&self) -> Result<(), DrafterError> {
        let Some((key, v)) = self.dflash_value("is_causal") else {
            return Ok(());
        };
        let causal = v
            .as_bool()
            .ok_or_else(|| self.invalid(&key, "true or false", v))?;
        let num_layers = self
            .top("num_hidden_layers")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let sliding_window = self.top("sliding_window").and_then(Value::as_i64);
        let types = self.layer_types(num_layers as usize, sliding_window)?;
        let changed = types.iter().any(|t| (*t == LayerType::Sliding) != causal);
        if changed {
            return Err(self.unsupported(
                &key,
                v,
                "in-block causality follows the layer type (causal on sliding, bidirectional on \
                 full layers); this value would change a layer of this config",
            ));
        }
        Ok(())
    }

    fn reject_behaviour_changes(&self) -> Result<(), DrafterError> {
        if let Some(v) = self.top("attention_bias") {
            if v.as_bool() != Some(false) {
                return Err(self.unsupported(
                    "attention_bias",
                    v,
                    "the drafter's projections have no bias",
                ));
            }
        }
        if let Some(v) = self.top("hidden_act") {
            if v.as_str() != Some("silu") {
                return Err(self.unsupported("hidden_act", v, "the drafter MLP is SwiGLU (silu)"));
            }
        }
        self.check_is_causal()?;
        if let Some((key, v)) = self.dflash_value("input_embedding_scale") {
            if v.as_f64() != Some(1.0) {
                return Err(self.unsupported(&key, v, "embedding scaling is not implemented"));
            }
        }
        // DFlash2's unary transform is its head's own (`heads.rs`).
        if self.names_architecture("DFlash2DraftModel") {
            return Ok(());
        }
        if let Some((key, v)) = self.dflash_value("output_multiplier") {
            if v.as_f64() != Some(1.0) {
                return Err(self.unsupported(
                    &key,
                    v,
                    "logit scaling is DFlash2's (architectures: [\"DFlash2DraftModel\"])",
                ));
            }
        }
        if let Some((key, v)) = self.dflash_value("final_logit_softcapping") {
            if v.as_f64().is_some_and(|c| c > 0.0) {
                return Err(self.unsupported(
                    &key,
                    v,
                    "logit soft-capping is DFlash2's (architectures: [\"DFlash2DraftModel\"])",
                ));
            }
        }
        Ok(())
    }

    fn config(&self) -> Result<DrafterConfig, DrafterError> {
        self.reject_behaviour_changes()?;
        let hidden_size = self.int("hidden_size")?;
        let num_attention_heads = self.int("num_attention_heads")?;
        let num_hidden_layers = {
            let v = self
                .top("num_hidden_layers")
                .ok_or_else(|| self.missing("num_hidden_layers", "required Qwen3 field"))?;
            self.as_count("num_hidden_layers", v)?
        };
        let head_dim = match self.top("head_dim") {
            Some(v) => self.as_int("head_dim", v)?,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };
        let sliding_window = self
            .top("sliding_window")
            .map(|v| self.as_int("sliding_window", v))
            .transpose()?;
        let layer_types = self.layer_types(num_hidden_layers, sliding_window)?;
        if layer_types.contains(&LayerType::Sliding) && !self.bool_or("use_sliding_window", true)? {
            return Err(self.unsupported(
                "use_sliding_window",
                &json!(false),
                "layer_types has sliding layers, but transformers drops sliding_window when this is false",
            ));
        }
        let num_target_layers = self
            .top("num_target_layers")
            .map(|v| self.as_count("num_target_layers", v))
            .transpose()?;
        let target_layer_ids = match self.dflash_value("target_layer_ids") {
            Some((key, value)) => {
                let list = value
                    .as_array()
                    .ok_or_else(|| self.invalid(&key, "a list of layer ids", value))?;
                list.iter()
                    .enumerate()
                    .map(|(i, id)| self.as_count(&format!("{key}[{i}]"), id))
                    .collect::<Result<Vec<_>, _>>()?
            }
            None => match num_target_layers {
                Some(n) => DrafterConfig::build_target_layer_ids(n, num_hidden_layers),
                None => return Err(self.missing(
                    "dflash_config.target_layer_ids",
                    "give the target layer ids, or `num_target_layers` to use the default spacing",
                )),
            },
        };
        let mask_token_id = match self.dflash_value("mask_token_id") {
            Some((key, value)) => self.as_int(&key, value)?,
            None => {
                return Err(self.missing(
                    "dflash_config.mask_token_id",
                    "the drafter needs the id of the target embedding row used as MASK",
                ))
            }
        };
        let block_size = match self.dflash_value("block_size") {
            Some((key, value)) => self.as_int(&key, value)?,
            None => DFLASH_DEFAULT_BLOCK_SIZE,
        };
        let config = DrafterConfig {
            hidden_size,
            intermediate_size: self.int("intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: self.int_or("num_key_value_heads", num_attention_heads)?,
            head_dim,
            rms_norm_eps: self.float_or("rms_norm_eps", QWEN3_DEFAULT_RMS_NORM_EPS)?,
            rope_theta: self.rope_theta()?,
            layer_types,
            sliding_window,
            block_size,
            mask_token_id,
            target_layer_ids,
            target_hidden_size: self.int_or("target_hidden_size", hidden_size)?,
            vocab_size: self.int("vocab_size")?,
            max_position_embeddings: self.int_or(
                "max_position_embeddings",
                QWEN3_DEFAULT_MAX_POSITION_EMBEDDINGS,
            )?,
            num_target_layers,
            initializer_range: self
                .float_or("initializer_range", QWEN3_DEFAULT_INITIALIZER_RANGE)?,
            head: self.head()?,
        };
        config.validate(&self.path)?;
        Ok(config)
    }
}

impl DrafterConfig {
    /// Reads a drafter `config.json` (published DFlash layout).
    pub fn from_hf_json(path: &Path) -> Result<Self, DrafterError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| DrafterError::Io {
            path: shown.clone(),
            cause: source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|source| DrafterError::Json {
            path: shown.clone(),
            cause: source,
        })?;
        Self::from_hf_value(&value, &shown)
    }

    /// Same as [`Self::from_hf_json`] for an already parsed document; `source` names it in errors.
    pub fn from_hf_value(value: &Value, source: &str) -> Result<Self, DrafterError> {
        let root = value
            .as_object()
            .ok_or_else(|| DrafterError::InvalidField {
                path: source.to_string(),
                key: "(document)".into(),
                expected: "a JSON object".into(),
                found: describe(value),
            })?;
        Reader {
            path: source.to_string(),
            root,
        }
        .config()
    }
}

mod heads;
#[cfg(test)]
mod tests;
mod writer;
