//! Reading and writing the published DFlash drafter `config.json` (spec §1.2, §8.6): the Qwen3
//! fields plus `block_size`, `layer_types` and `dflash_config {mask_token_id,
//! target_layer_ids}`, with RoPE either as `rope_theta` or as transformers 5
//! `rope_parameters`.
//!
//! The reference loader (ZL `_draft_value`) looks a DFlash key up in `dflash_config` first and
//! then at the top level; reading does the same. Keys that would silently change the model
//! (YaRN RoPE, attention bias, a non-SiLU MLP, `is_causal` overrides, logit scaling) are
//! rejected with an error instead of being ignored.
//!
//! A Domino drafter (SpecForge's `DominoDraftModel`) is the same layout with
//! `architectures: ["DominoDraftModel"]` and `dflash_config.projector_type = "domino"`,
//! `emb_dim`, `gru_hidden_dim`, `pure_draft_prefix_len`, `shift_label`. SpecForge's recipe
//! config names `DFlashDraftModel` with `projector_type = "domino"`; either reads as Domino.
//! A DSpark drafter (`DSparkDraftModel`) is the layout with `projector_type = "dspark"`,
//! `markov_rank`, `markov_head_type`, `enable_confidence_head`, `confidence_head_with_markov`
//! and `attention_mode` in `dflash_config`; SGLang's normalised copy (`Qwen3DSparkModel`, the
//! keys at the top level) reads the same.
use std::path::Path;

use serde_json::{json, Map, Value};

use super::config::{
    DominoConfig, DrafterConfig, DrafterError, DrafterHead, DsparkConfig, LayerType, MarkovHeadType,
};

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
        if let Some((key, v)) = self.dflash_value("is_causal") {
            return Err(self.unsupported(
                &key,
                v,
                "in-block causality follows the layer type (causal on sliding, bidirectional on full layers)",
            ));
        }
        for key in ["input_embedding_scale", "output_multiplier"] {
            if let Some((key, v)) = self.dflash_value(key) {
                if v.as_f64() != Some(1.0) {
                    return Err(self.unsupported(
                        &key,
                        v,
                        "embedding/logit scaling is not implemented",
                    ));
                }
            }
        }
        if let Some((key, v)) = self.dflash_value("final_logit_softcapping") {
            if v.as_f64().is_some_and(|c| c > 0.0) {
                return Err(self.unsupported(&key, v, "logit soft-capping is not implemented"));
            }
        }
        Ok(())
    }

    /// Whether `architectures` lists `name`.
    fn names_architecture(&self, name: &str) -> bool {
        self.top("architectures")
            .and_then(Value::as_array)
            .is_some_and(|list| list.iter().any(|a| a.as_str() == Some(name)))
    }

    /// The head: the projector `dflash_config.projector_type` names (`"domino"`, `"dspark"`),
    /// else the one the architecture names (SpecForge fills the projector type in from
    /// `DominoDraftModel` / `DSparkDraftModel`; SGLang's `Qwen3DSparkModel` is DSpark with its
    /// keys at the top level), else plain DFlash. An architecture and a projector that name
    /// different heads, or a projector dflashd does not implement, are refused: its weights
    /// would be ignored.
    fn head(&self) -> Result<DrafterHead, DrafterError> {
        let architecture = if self.names_architecture("DominoDraftModel") {
            Some(("DominoDraftModel", "domino"))
        } else if self.names_architecture("DSparkDraftModel") {
            Some(("DSparkDraftModel", "dspark"))
        } else if self.names_architecture("Qwen3DSparkModel") {
            Some(("Qwen3DSparkModel", "dspark"))
        } else {
            None
        };
        let projector = match self.dflash_value("projector_type") {
            None => architecture.map(|(_, projector)| projector),
            Some((key, v)) => {
                let name = v.as_str().filter(|n| matches!(*n, "domino" | "dspark"));
                match (name, architecture) {
                    (Some(name), Some((_, wanted))) if name == wanted => Some(name),
                    (Some(name), None) => Some(name),
                    (_, Some((model, wanted))) => {
                        return Err(self.unsupported(
                            &key,
                            v,
                            &format!("{model} requires projector_type \"{wanted}\""),
                        ))
                    }
                    (None, None) => {
                        return Err(self.unsupported(
                            &key,
                            v,
                            "only the DFlash head, Domino's (\"domino\") and DSpark's \
                             (\"dspark\") are implemented",
                        ))
                    }
                }
            }
        };
        match projector {
            Some("domino") => self.domino_head(),
            Some(_) => self.dspark_head(),
            None => Ok(DrafterHead::Dflash),
        }
    }

    /// Domino's widths and slots (SpecForge's `DominoDraftModel` keys).
    fn domino_head(&self) -> Result<DrafterHead, DrafterError> {
        let required = |key: &str| -> Result<i64, DrafterError> {
            match self.dflash_value(key) {
                Some((found, v)) => self.as_int(&found, v),
                None => Err(self.missing(
                    &format!("dflash_config.{key}"),
                    "a Domino drafter needs its emb_dim and gru_hidden_dim",
                )),
            }
        };
        let pure_draft_prefix_len = match self.dflash_value("pure_draft_prefix_len") {
            Some((key, v)) => self.as_int(&key, v)?,
            None => 0,
        };
        if let Some((key, v)) = self.dflash_value("shift_label") {
            match v.as_bool() {
                Some(false) => {}
                Some(true) => {
                    return Err(self.unsupported(
                        &key,
                        v,
                        "shift_label = true trains slot k on anchor + k + 1; dflashd's blocks \
                         train slot k on anchor + k (shift_label = false)",
                    ))
                }
                None => return Err(self.invalid(&key, "true or false", v)),
            }
        }
        Ok(DrafterHead::Domino(DominoConfig {
            emb_dim: required("emb_dim")?,
            gru_hidden_dim: required("gru_hidden_dim")?,
            pure_draft_prefix_len,
        }))
    }

    /// A DFlash key that must be true or false, when present.
    fn dflash_bool(&self, key: &str) -> Result<Option<bool>, DrafterError> {
        match self.dflash_value(key) {
            None => Ok(None),
            Some((found, v)) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.invalid(&found, "true or false", v)),
        }
    }

    /// DSpark's heads, with the defaults SpecForge's `DSparkDraftModel` applies to a key a
    /// file leaves out (`specforge/modeling/draft/dspark.py:254-279, 345-364`): no Markov head
    /// (`markov_rank` 0), `"vanilla"`, a confidence head when `confidence_head_alpha > 0`
    /// (`enable_confidence_head` overrides it), not reading the Markov embedding. The
    /// `attention_mode` check is SpecForge's too (`dspark.py:288-312`): `"gqa"` (its default)
    /// needs fewer key/value heads than query heads, `"mha"` as many.
    fn dspark_head(&self) -> Result<DrafterHead, DrafterError> {
        let markov_rank = match self.dflash_value("markov_rank") {
            Some((key, v)) => self.as_count(&key, v)? as i64,
            None => 0,
        };
        let markov_head_type = match self.dflash_value("markov_head_type") {
            None => MarkovHeadType::Vanilla,
            Some((key, v)) => v
                .as_str()
                .and_then(|name| MarkovHeadType::from_name(&name.to_lowercase()))
                .ok_or_else(|| self.invalid(&key, "\"vanilla\", \"gated\" or \"rnn\"", v))?,
        };
        let confidence_alpha = match self.dflash_value("confidence_head_alpha") {
            Some((key, v)) => self.as_float(&key, v)?,
            None => 0.0,
        };
        let confidence_head = self
            .dflash_bool("enable_confidence_head")?
            .unwrap_or(confidence_alpha > 0.0);
        let confidence_head_with_markov = self
            .dflash_bool("confidence_head_with_markov")?
            .unwrap_or(false);
        if confidence_head_with_markov && markov_rank == 0 {
            return Err(self.unsupported(
                "dflash_config.confidence_head_with_markov",
                &json!(true),
                "it needs a Markov head (markov_rank > 0), as in SpecForge",
            ));
        }
        if let Some((key, v)) = self.dflash_value("attention_mode") {
            let heads = self.int("num_attention_heads")?;
            let kv_heads = self.int_or("num_key_value_heads", heads)?;
            match v.as_str().map(str::to_lowercase).as_deref() {
                Some("gqa") if kv_heads < heads => {}
                Some("mha") if kv_heads == heads => {}
                Some("gqa" | "mha") => {
                    return Err(self.unsupported(
                        &key,
                        v,
                        &format!(
                            "\"gqa\" needs num_key_value_heads < num_attention_heads and \
                             \"mha\" needs them equal; this config has {kv_heads} and {heads}"
                        ),
                    ))
                }
                _ => return Err(self.invalid(&key, "\"gqa\" or \"mha\"", v)),
            }
        }
        Ok(DrafterHead::Dspark(DsparkConfig {
            markov_rank,
            markov_head_type,
            // With `enable_confidence_head` false, `confidence_head_with_markov` shapes
            // nothing (SpecForge builds no confidence head at all).
            confidence_head,
            confidence_head_with_markov: confidence_head && confidence_head_with_markov,
        }))
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

    /// The published DFlash layout (architectures `DFlashDraftModel`, model_type `qwen3`,
    /// `dflash_config`, ...; a Domino drafter `DominoDraftModel`, a DSpark drafter
    /// `DSparkDraftModel`, each with its `dflash_config` keys as SpecForge writes them). No `auto_map`: it would point transformers'
    /// `trust_remote_code` path at a `dflash.py` that is not shipped beside the weights
    /// (SGLang and vLLM select the model by `architectures` and never read it). RoPE is written both as `rope_theta` and as
    /// transformers 5 `rope_parameters`. `dtype` is left to the exporter, which knows the
    /// dtype of the safetensors it writes.
    pub fn to_hf_json(&self) -> Value {
        let has_sliding = self.layer_types.contains(&LayerType::Sliding);
        let mut out = json!({
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "block_size": self.block_size,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": self.target_layer_ids,
            },
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "layer_types": self.layer_types.iter().map(|t| t.hf_name()).collect::<Vec<_>>(),
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": null,
            "rope_theta": self.rope_theta,
            "rope_parameters": { "rope_type": "default", "rope_theta": self.rope_theta },
            "sliding_window": self.sliding_window,
            "use_sliding_window": has_sliding,
            "tie_word_embeddings": false,
            "use_cache": true,
            "vocab_size": self.vocab_size,
        });
        let map = out.as_object_mut().expect("literal object");
        if let Some(n) = self.num_target_layers {
            map.insert("num_target_layers".into(), json!(n));
        }
        if let Some(d) = self.head.domino() {
            map.insert("architectures".into(), json!(["DominoDraftModel"]));
            let dflash = map
                .get_mut("dflash_config")
                .and_then(Value::as_object_mut)
                .expect("literal object");
            dflash.insert("projector_type".into(), json!("domino"));
            dflash.insert("emb_dim".into(), json!(d.emb_dim));
            dflash.insert("gru_hidden_dim".into(), json!(d.gru_hidden_dim));
            dflash.insert(
                "pure_draft_prefix_len".into(),
                json!(d.pure_draft_prefix_len),
            );
            dflash.insert("shift_label".into(), json!(false));
        }
        if let Some(d) = self.head.dspark() {
            map.insert("architectures".into(), json!(["DSparkDraftModel"]));
            let dflash = map
                .get_mut("dflash_config")
                .and_then(Value::as_object_mut)
                .expect("literal object");
            dflash.insert("projector_type".into(), json!("dspark"));
            let attention_mode = if self.num_key_value_heads == self.num_attention_heads {
                "mha"
            } else {
                "gqa"
            };
            dflash.insert("attention_mode".into(), json!(attention_mode));
            dflash.insert("markov_rank".into(), json!(d.markov_rank));
            dflash.insert(
                "markov_head_type".into(),
                json!(d.markov_head_type.as_str()),
            );
            dflash.insert("enable_confidence_head".into(), json!(d.confidence_head));
            dflash.insert(
                "confidence_head_with_markov".into(),
                json!(d.confidence_head_with_markov),
            );
        }
        if self.target_hidden_size != self.hidden_size {
            // Not read by serving engines (they assume fc input = n·hidden_size); kept so our
            // own loader can rebuild such a drafter.
            map.insert("target_hidden_size".into(), json!(self.target_hidden_size));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Domino drafter's config as SpecForge's Qwen3.6-27B recipe writes one (its keys and
    /// values; the architecture is the recipe's `DFlashDraftModel` with a Domino projector).
    fn recipe_like() -> Value {
        json!({
            "architectures": ["DFlashDraftModel"],
            "block_size": 16,
            "dflash_config": {
                "mask_token_id": 248070,
                "target_layer_ids": [1, 16, 31, 46, 61],
                "projector_type": "domino",
                "pure_draft_prefix_len": 1,
                "emb_dim": 256,
                "gru_hidden_dim": 1024,
                "shift_label": false
            },
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 5120,
            "intermediate_size": 17408,
            "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention"],
            "num_attention_heads": 32,
            "num_hidden_layers": 5,
            "num_key_value_heads": 8,
            "num_target_layers": 64,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000000,
            "vocab_size": 248320
        })
    }

    fn domino(value: &Value) -> Result<DominoConfig, DrafterError> {
        let cfg = DrafterConfig::from_hf_value(value, "test")?;
        Ok(*cfg.head.domino().expect("a Domino head"))
    }

    #[test]
    fn specforges_domino_recipe_reads_as_domino_and_writes_back_as_domino_draft_model() {
        let value = recipe_like();
        assert_eq!(
            domino(&value).unwrap(),
            DominoConfig {
                emb_dim: 256,
                gru_hidden_dim: 1024,
                pure_draft_prefix_len: 1
            }
        );
        let cfg = DrafterConfig::from_hf_value(&value, "test").unwrap();
        let written = cfg.to_hf_json();
        assert_eq!(written["architectures"], json!(["DominoDraftModel"]));
        let d = &written["dflash_config"];
        assert_eq!(d["projector_type"], json!("domino"));
        assert_eq!(
            (&d["emb_dim"], &d["gru_hidden_dim"]),
            (&json!(256), &json!(1024))
        );
        assert_eq!(
            (&d["pure_draft_prefix_len"], &d["shift_label"]),
            (&json!(1), &json!(false))
        );
        assert_eq!(
            DrafterConfig::from_hf_value(&written, "written").unwrap(),
            cfg
        );
    }

    #[test]
    fn the_architecture_alone_names_domino_and_defaults_follow_specforge() {
        let mut value = recipe_like();
        value["architectures"] = json!(["DominoDraftModel"]);
        let d = value["dflash_config"].as_object_mut().unwrap();
        for key in ["projector_type", "pure_draft_prefix_len", "shift_label"] {
            d.remove(key);
        }
        assert_eq!(domino(&value).unwrap().pure_draft_prefix_len, 0);
    }

    #[test]
    fn a_plain_dflash_config_has_the_dflash_head_and_no_domino_keys() {
        let mut value = recipe_like();
        let d = value["dflash_config"].as_object_mut().unwrap();
        for key in [
            "projector_type",
            "pure_draft_prefix_len",
            "emb_dim",
            "gru_hidden_dim",
            "shift_label",
        ] {
            d.remove(key);
        }
        let cfg = DrafterConfig::from_hf_value(&value, "test").unwrap();
        assert_eq!(cfg.head, DrafterHead::Dflash);
        let written = cfg.to_hf_json();
        assert_eq!(written["architectures"], json!(["DFlashDraftModel"]));
        assert!(written["dflash_config"].get("projector_type").is_none());
    }

    #[test]
    fn what_dflashd_cannot_compute_is_refused_by_name() {
        let refuse = |edit: &dyn Fn(&mut Value), key: &str| {
            let mut value = recipe_like();
            edit(&mut value);
            let err = DrafterConfig::from_hf_value(&value, "test")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{err}");
        };
        refuse(
            &|v| v["dflash_config"]["shift_label"] = json!(true),
            "dflash_config.shift_label",
        );
        refuse(
            &|v| v["dflash_config"]["projector_type"] = json!("eagle3"),
            "dflash_config.projector_type",
        );
        refuse(
            &|v| {
                v["architectures"] = json!(["DominoDraftModel"]);
                v["dflash_config"]["projector_type"] = json!("dspark");
            },
            "dflash_config.projector_type",
        );
        refuse(
            &|v| {
                v["dflash_config"]
                    .as_object_mut()
                    .unwrap()
                    .remove("emb_dim");
            },
            "dflash_config.emb_dim",
        );
        refuse(
            &|v| v["dflash_config"]["pure_draft_prefix_len"] = json!(15),
            "dflash_config.pure_draft_prefix_len",
        );
    }

    /// SpecForge's `configs/qwen3-8b-dspark.json` (a6b6b023), key for key.
    fn specforge_dspark() -> Value {
        json!({
            "architectures": ["DSparkDraftModel"],
            "attention_bias": false,
            "attention_dropout": 0.0,
            "auto_map": {"AutoModel": "dspark.DSparkDraftModel"},
            "block_size": 7,
            "bos_token_id": 151643,
            "dflash_config": {
                "attention_mode": "gqa",
                "confidence_head_alpha": 1.0,
                "confidence_head_with_markov": true,
                "enable_confidence_head": true,
                "markov_head_type": "vanilla",
                "markov_rank": 256,
                "mask_token_id": 151669,
                "projector_type": "dspark",
                "target_layer_ids": [1, 9, 17, 25, 33]
            },
            "dtype": "bfloat16",
            "eos_token_id": 151645,
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 12288,
            "layer_types": ["full_attention", "full_attention", "full_attention",
                            "full_attention", "full_attention"],
            "max_position_embeddings": 40960,
            "max_window_layers": 5,
            "model_type": "qwen3",
            "num_attention_heads": 32,
            "num_hidden_layers": 5,
            "num_key_value_heads": 8,
            "num_target_layers": 36,
            "rms_norm_eps": 1e-06,
            "rope_scaling": null,
            "rope_theta": 1000000,
            "sliding_window": null,
            "tie_word_embeddings": false,
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": 151936
        })
    }

    fn dspark(value: &Value) -> Result<DsparkConfig, DrafterError> {
        let cfg = DrafterConfig::from_hf_value(value, "test")?;
        Ok(*cfg.head.dspark().expect("a DSpark head"))
    }

    #[test]
    fn specforges_dspark_config_reads_as_dspark_and_writes_back_as_dspark_draft_model() {
        let value = specforge_dspark();
        let cfg = DrafterConfig::from_hf_value(&value, "test").unwrap();
        assert_eq!(cfg.block_size, 7);
        assert_eq!(
            *cfg.head.dspark().unwrap(),
            DsparkConfig {
                markov_rank: 256,
                markov_head_type: MarkovHeadType::Vanilla,
                confidence_head: true,
                confidence_head_with_markov: true,
            }
        );
        let written = cfg.to_hf_json();
        assert_eq!(written["architectures"], json!(["DSparkDraftModel"]));
        let d = &written["dflash_config"];
        for key in [
            "attention_mode",
            "confidence_head_with_markov",
            "enable_confidence_head",
            "markov_head_type",
            "markov_rank",
            "projector_type",
        ] {
            assert_eq!(d[key], value["dflash_config"][key], "{key}");
        }
        assert_eq!(
            DrafterConfig::from_hf_value(&written, "written").unwrap(),
            cfg
        );
    }

    #[test]
    fn a_dspark_file_without_its_head_keys_takes_specforges_code_defaults() {
        let mut value = specforge_dspark();
        let d = value["dflash_config"].as_object_mut().unwrap();
        for key in [
            "attention_mode",
            "confidence_head_alpha",
            "confidence_head_with_markov",
            "enable_confidence_head",
            "markov_head_type",
            "markov_rank",
            "projector_type",
        ] {
            d.remove(key);
        }
        // `DSparkDraftModel` alone names the head; each left-out key is SpecForge's default:
        // no Markov head, and no confidence head without `confidence_head_alpha > 0`.
        let got = dspark(&value).unwrap();
        assert_eq!(
            got,
            DsparkConfig {
                markov_rank: 0,
                markov_head_type: MarkovHeadType::Vanilla,
                confidence_head: false,
                confidence_head_with_markov: false,
            }
        );
        value["dflash_config"]["confidence_head_alpha"] = json!(0.5);
        assert!(dspark(&value).unwrap().confidence_head);
    }

    #[test]
    fn sglangs_normalised_dspark_config_reads_its_keys_from_the_top_level() {
        // SpecForge's `scripts/gates/normalize_dflash_export.py` copies the head keys to the
        // top level and names SGLang's entry class.
        let mut value = specforge_dspark();
        value["architectures"] = json!(["Qwen3DSparkModel"]);
        let d = value["dflash_config"].as_object_mut().unwrap();
        let mut moved = Vec::new();
        for key in [
            "markov_rank",
            "markov_head_type",
            "enable_confidence_head",
            "confidence_head_with_markov",
            "projector_type",
        ] {
            moved.push((key, d.remove(key).unwrap()));
        }
        for (key, v) in moved {
            if key != "projector_type" {
                value[key] = v;
            }
        }
        assert_eq!(
            dspark(&value).unwrap(),
            dspark(&specforge_dspark()).unwrap()
        );
    }

    #[test]
    fn a_dspark_config_specforge_would_refuse_is_refused_by_name() {
        let refuse = |edit: &dyn Fn(&mut Value), key: &str| {
            let mut value = specforge_dspark();
            edit(&mut value);
            let err = DrafterConfig::from_hf_value(&value, "test")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{key}: {err}");
        };
        refuse(
            &|v| v["dflash_config"]["projector_type"] = json!("domino"),
            "dflash_config.projector_type",
        );
        refuse(
            &|v| v["dflash_config"]["markov_head_type"] = json!("lstm"),
            "dflash_config.markov_head_type",
        );
        refuse(
            &|v| v["dflash_config"]["markov_rank"] = json!(0),
            "dflash_config.confidence_head_with_markov",
        );
        refuse(
            &|v| v["num_key_value_heads"] = json!(32),
            "dflash_config.attention_mode",
        );
        refuse(
            &|v| v["dflash_config"]["attention_mode"] = json!("mqa"),
            "dflash_config.attention_mode",
        );
        // Equal head counts are fine once the file opts into MHA.
        let mut mha = specforge_dspark();
        mha["num_key_value_heads"] = json!(32);
        mha["dflash_config"]["attention_mode"] = json!("mha");
        let cfg = DrafterConfig::from_hf_value(&mha, "mha").unwrap();
        assert_eq!(
            cfg.to_hf_json()["dflash_config"]["attention_mode"],
            json!("mha")
        );
    }
}
