//! Parsing Hugging Face `config.json` into a [`TargetConfig`]: HF's defaults for absent keys,
//! transformers 5's `rope_parameters` and the older top-level RoPE keys, and errors that name the
//! file and the dotted key with what was expected and found.
use std::path::Path;

use serde_json::{json, Map, Value};

use super::config::{
    CheckpointLayout, Qwen3Config, Qwen3_5LayerKind, Qwen3_5TextConfig, TargetConfig,
};
use crate::model::error::ModelError;

const SUPPORTED: &str =
    "Qwen3_5ForConditionalGeneration (qwen3_5), Qwen3_5ForCausalLM (qwen3_5_text), \
                         Qwen3ForCausalLM (qwen3)";

impl TargetConfig {
    /// The `config.json` of a Hugging Face checkpoint directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, ModelError> {
        Ok(read_hf_config(dir)?.0)
    }

    /// A `config.json` file by its own path (the checkpoint's directory need not exist).
    pub fn from_hf_config_file(path: &Path) -> Result<Self, ModelError> {
        Ok(read_hf_config_file(path)?.0)
    }
}

/// Reads `dir/config.json`: the config, the checkpoint layout, and the raw JSON (kept so that a
/// loaded model is saved back with its original config).
pub fn read_hf_config(dir: &Path) -> Result<(TargetConfig, CheckpointLayout, Value), ModelError> {
    read_hf_config_file(&dir.join("config.json"))
}

/// Reads one `config.json` file wherever it lies (`dflashd plan --target-config`).
pub fn read_hf_config_file(
    path: &Path,
) -> Result<(TargetConfig, CheckpointLayout, Value), ModelError> {
    let path = path.to_path_buf();
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let json: Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.clone(),
        cause: source,
    })?;
    let (config, layout) = parse_hf_config(&path, &json)?;
    Ok((config, layout, json))
}

pub fn parse_hf_config(
    path: &Path,
    json: &Value,
) -> Result<(TargetConfig, CheckpointLayout), ModelError> {
    let root = Fields::new(path, "", json)?;
    let model_type = root.opt_str("model_type")?.unwrap_or_default();
    let architectures: Vec<String> = match json.get("architectures") {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let has_arch = |name: &str| architectures.iter().any(|a| a == name);

    if model_type == "qwen3_5" || has_arch("Qwen3_5ForConditionalGeneration") {
        let text = json
            .get("text_config")
            .ok_or_else(|| ModelError::ConfigValue {
                path: path.to_path_buf(),
                key: "text_config".into(),
                expected: "the nested text config of Qwen3_5ForConditionalGeneration".into(),
                found: "nothing".into(),
            })?;
        let mut cfg = parse_qwen3_5_text(&Fields::new(path, "text_config.", text)?)?;
        // The multimodal wrapper decides tying: HF ties lm_head to the text embeddings from here.
        if let Some(tie) = root.opt_bool("tie_word_embeddings")? {
            cfg.tie_word_embeddings = tie;
        }
        return Ok((
            TargetConfig::Qwen3_5(cfg),
            CheckpointLayout::Qwen3_5Multimodal,
        ));
    }
    if model_type == "qwen3_5_text" || has_arch("Qwen3_5ForCausalLM") {
        let cfg = parse_qwen3_5_text(&root)?;
        return Ok((TargetConfig::Qwen3_5(cfg), CheckpointLayout::Qwen3_5Text));
    }
    if model_type == "qwen3" || has_arch("Qwen3ForCausalLM") {
        return Ok((
            TargetConfig::Qwen3(parse_qwen3(&root)?),
            CheckpointLayout::Qwen3CausalLm,
        ));
    }
    Err(ModelError::UnknownArchitecture {
        path: path.to_path_buf(),
        found: format!("model_type {model_type:?}, architectures {architectures:?}"),
        supported: SUPPORTED.into(),
    })
}

fn parse_qwen3_5_text(f: &Fields<'_>) -> Result<Qwen3_5TextConfig, ModelError> {
    f.expect_silu()?;
    let num_hidden_layers = f.positive("num_hidden_layers", Some(32))? as usize;
    let layer_types = match f.obj.get("layer_types") {
        None | Some(Value::Null) => {
            let default = Qwen3_5LayerKind::DEFAULT_FULL_ATTENTION_INTERVAL as i64;
            let interval = f.positive("full_attention_interval", Some(default))? as usize;
            Qwen3_5LayerKind::hybrid_stack(num_hidden_layers, interval)
        }
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v.as_str() {
                Some("linear_attention") => Ok(Qwen3_5LayerKind::LinearAttention),
                Some("full_attention") => Ok(Qwen3_5LayerKind::FullAttention),
                _ => Err(f.bad(
                    &format!("layer_types[{i}]"),
                    "\"linear_attention\" or \"full_attention\"",
                    v,
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => return Err(f.bad("layer_types", "a list of layer type names", other)),
    };
    if layer_types.len() != num_hidden_layers {
        return Err(f.bad(
            "layer_types",
            &format!("{num_hidden_layers} entries (num_hidden_layers)"),
            &json!(format!("{} entries", layer_types.len())),
        ));
    }
    let rope = f.rope()?;
    let cfg = Qwen3_5TextConfig {
        vocab_size: f.positive("vocab_size", Some(248_320))?,
        hidden_size: f.positive("hidden_size", Some(4096))?,
        intermediate_size: f.positive("intermediate_size", Some(12_288))?,
        num_hidden_layers,
        num_attention_heads: f.positive("num_attention_heads", Some(16))?,
        num_key_value_heads: f.positive("num_key_value_heads", Some(4))?,
        head_dim: f.positive("head_dim", Some(256))?,
        linear_conv_kernel_dim: f.positive("linear_conv_kernel_dim", Some(4))?,
        linear_key_head_dim: f.positive("linear_key_head_dim", Some(128))?,
        linear_value_head_dim: f.positive("linear_value_head_dim", Some(128))?,
        linear_num_key_heads: f.positive("linear_num_key_heads", Some(16))?,
        linear_num_value_heads: f.positive("linear_num_value_heads", Some(32))?,
        layer_types,
        rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: rope.theta,
        partial_rotary_factor: rope.partial_rotary_factor.unwrap_or(0.25),
        attention_bias: f.opt_bool("attention_bias")?.unwrap_or(false),
        tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        max_position_embeddings: f.positive("max_position_embeddings", Some(32_768))?,
    };
    f.divisible(
        "num_attention_heads",
        cfg.num_attention_heads,
        "num_key_value_heads",
        cfg.num_key_value_heads,
    )?;
    f.divisible(
        "linear_num_value_heads",
        cfg.linear_num_value_heads,
        "linear_num_key_heads",
        cfg.linear_num_key_heads,
    )?;
    let rotary = cfg.rotary_dim();
    if rotary < 2 || rotary % 2 != 0 || rotary > cfg.head_dim {
        return Err(f.bad(
            "rope_parameters.partial_rotary_factor",
            &format!(
                "a factor giving an even rotary dim in 2..={} (head_dim {})",
                cfg.head_dim, cfg.head_dim
            ),
            &json!(format!(
                "{} (rotary dim {rotary})",
                cfg.partial_rotary_factor
            )),
        ));
    }
    Ok(cfg)
}

fn parse_qwen3(f: &Fields<'_>) -> Result<Qwen3Config, ModelError> {
    f.expect_silu()?;
    if f.opt_bool("use_sliding_window")?.unwrap_or(false) {
        return Err(ModelError::UnsupportedConfig {
            path: f.path.to_path_buf(),
            what: "use_sliding_window = true (sliding-window Qwen3 targets are not implemented)"
                .into(),
        });
    }
    if let Some(Value::Array(types)) = f.obj.get("layer_types") {
        if let Some((i, v)) = types
            .iter()
            .enumerate()
            .find(|(_, v)| v.as_str() != Some("full_attention"))
        {
            return Err(f.bad(&format!("layer_types[{i}]"), "\"full_attention\"", v));
        }
    }
    let rope = f.rope()?;
    if let Some(p) = rope.partial_rotary_factor {
        if p != 1.0 {
            return Err(f.bad("partial_rotary_factor", "1.0 for Qwen3", &json!(p)));
        }
    }
    let num_attention_heads = f.positive("num_attention_heads", Some(32))?;
    let hidden_size = f.positive("hidden_size", Some(4096))?;
    let cfg = Qwen3Config {
        vocab_size: f.positive("vocab_size", Some(151_936))?,
        hidden_size,
        intermediate_size: f.positive("intermediate_size", Some(22_016))?,
        num_hidden_layers: f.positive("num_hidden_layers", Some(32))? as usize,
        num_attention_heads,
        num_key_value_heads: f.positive("num_key_value_heads", Some(num_attention_heads))?,
        head_dim: f.positive("head_dim", Some(128))?,
        rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: rope.theta,
        attention_bias: f.opt_bool("attention_bias")?.unwrap_or(false),
        tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        max_position_embeddings: f.positive("max_position_embeddings", Some(32_768))?,
    };
    f.divisible(
        "num_attention_heads",
        cfg.num_attention_heads,
        "num_key_value_heads",
        cfg.num_key_value_heads,
    )?;
    if cfg.head_dim % 2 != 0 {
        return Err(f.bad(
            "head_dim",
            "an even number (RoPE rotates pairs)",
            &json!(cfg.head_dim),
        ));
    }
    Ok(cfg)
}

struct Rope {
    theta: f64,
    partial_rotary_factor: Option<f64>,
}

/// Typed access to one JSON object with errors naming `path` and the dotted key.
struct Fields<'a> {
    path: &'a Path,
    prefix: String,
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn new(path: &'a Path, prefix: &str, value: &'a Value) -> Result<Self, ModelError> {
        match value.as_object() {
            Some(obj) => Ok(Self {
                path,
                prefix: prefix.to_string(),
                obj,
            }),
            None => Err(ModelError::ConfigValue {
                path: path.to_path_buf(),
                key: if prefix.is_empty() {
                    "(root)".into()
                } else {
                    prefix.trim_end_matches('.').into()
                },
                expected: "a JSON object".into(),
                found: value.to_string(),
            }),
        }
    }

    fn bad(&self, key: &str, expected: &str, found: &Value) -> ModelError {
        ModelError::ConfigValue {
            path: self.path.to_path_buf(),
            key: format!("{}{key}", self.prefix),
            expected: expected.into(),
            found: found.to_string(),
        }
    }

    fn present(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn positive(&self, key: &str, default: Option<i64>) -> Result<i64, ModelError> {
        match self.present(key) {
            None => default.ok_or_else(|| self.bad(key, "a positive integer", &Value::Null)),
            Some(v) => match v.as_i64() {
                Some(n) if n > 0 => Ok(n),
                _ => Err(self.bad(key, "a positive integer", v)),
            },
        }
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.present(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                _ => Err(self.bad(key, "a positive number", v)),
            },
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(key, "true or false", v)),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<String>, ModelError> {
        match self.present(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.bad(key, "a string", v)),
        }
    }

    fn expect_silu(&self) -> Result<(), ModelError> {
        match self.present("hidden_act") {
            None => Ok(()),
            Some(v) if v.as_str() == Some("silu") => Ok(()),
            Some(v) => Err(self.bad("hidden_act", "\"silu\"", v)),
        }
    }

    fn divisible(&self, key: &str, n: i64, by_key: &str, by: i64) -> Result<(), ModelError> {
        if n % by == 0 {
            Ok(())
        } else {
            Err(self.bad(key, &format!("a multiple of {by_key} ({by})"), &json!(n)))
        }
    }

    /// RoPE from transformers 5's `rope_parameters` or the older top-level keys.
    fn rope(&self) -> Result<Rope, ModelError> {
        let params = match self.present("rope_parameters") {
            Some(v) => Some(Fields::new(
                self.path,
                &format!("{}rope_parameters.", self.prefix),
                v,
            )?),
            None => None,
        };
        if let Some(scaling) = self.present("rope_scaling") {
            let kind = scaling.get("rope_type").or_else(|| scaling.get("type"));
            if kind.and_then(Value::as_str).is_some_and(|t| t != "default") {
                return Err(self.bad("rope_scaling", "null or rope_type \"default\"", scaling));
            }
        }
        let source = params.as_ref().unwrap_or(self);
        if let Some(kind) = source.opt_str("rope_type")? {
            if kind != "default" {
                return Err(source.bad(
                    "rope_type",
                    "\"default\" (scaled RoPE is not implemented)",
                    &json!(kind),
                ));
            }
        }
        let theta = match source.opt_f64("rope_theta")? {
            Some(t) => t,
            None => self.opt_f64("rope_theta")?.unwrap_or(10_000.0),
        };
        let partial = match source.opt_f64("partial_rotary_factor")? {
            Some(p) => Some(p),
            None => self.opt_f64("partial_rotary_factor")?,
        };
        if let Some(p) = partial {
            if p > 1.0 {
                return Err(source.bad("partial_rotary_factor", "a factor in (0, 1]", &json!(p)));
            }
        }
        Ok(Rope {
            theta,
            partial_rotary_factor: partial,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn parse(json: Value) -> Result<(TargetConfig, CheckpointLayout), ModelError> {
        parse_hf_config(&PathBuf::from("/m/config.json"), &json)
    }

    #[test]
    fn published_qwen3_5_27b_text_config_parses() {
        let json = json!({
            "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "text_config": {
                "model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64,
                "intermediate_size": 17408, "num_attention_heads": 24, "num_key_value_heads": 4,
                "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
                "linear_key_head_dim": 128, "linear_value_head_dim": 128, "full_attention_interval": 4,
                "vocab_size": 248320, "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                    "mrope_section": [11, 11, 10], "mrope_interleaved": true}
            },
            "vision_config": {"depth": 27}
        });
        let (TargetConfig::Qwen3_5(c), layout) = parse(json).unwrap() else {
            panic!("not qwen3_5")
        };
        assert_eq!(layout, CheckpointLayout::Qwen3_5Multimodal);
        assert_eq!(c.rotary_dim(), 64);
        assert_eq!(c.rope_theta, 1e7);
        let full: Vec<usize> = (0..64)
            .filter(|&i| c.layer_types[i] == Qwen3_5LayerKind::FullAttention)
            .collect();
        assert_eq!(full.len(), 16);
        assert_eq!(full[0], 3);
        assert_eq!(*full.last().unwrap(), 63);
    }

    #[test]
    fn legacy_qwen3_config_with_top_level_rope_theta() {
        let json = json!({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936, "rope_theta": 1000000, "rope_scaling": null, "tie_word_embeddings": false});
        let (TargetConfig::Qwen3(c), _) = parse(json).unwrap() else {
            panic!("not qwen3")
        };
        assert_eq!(c.rope_theta, 1e6);
        assert_eq!(c.num_key_value_heads, 8);
    }

    #[test]
    fn unknown_architecture_names_what_was_found() {
        let err = parse(json!({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ModelError::UnknownArchitecture { .. }));
        assert!(
            msg.contains("/m/config.json")
                && msg.contains("LlamaForCausalLM")
                && msg.contains("Qwen3ForCausalLM"),
            "{msg}"
        );
    }

    #[test]
    fn bad_values_name_the_nested_key() {
        let err = parse(json!({"model_type": "qwen3_5", "text_config": {"hidden_size": -3}}))
            .unwrap_err();
        assert!(err.to_string().contains("text_config.hidden_size"), "{err}");
        let err = parse(
            json!({"model_type": "qwen3_5", "text_config": {"num_hidden_layers": 2,
            "layer_types": ["linear_attention", "mamba"]}}),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("text_config.layer_types[1]")
                && err.to_string().contains("mamba"),
            "{err}"
        );
        let err = parse(
            json!({"model_type": "qwen3", "num_attention_heads": 6, "num_key_value_heads": 4}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("num_attention_heads"), "{err}");
        let err = parse(json!({"model_type": "qwen3", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}))
            .unwrap_err();
        assert!(
            err.to_string().contains("rope_parameters.rope_type"),
            "{err}"
        );
        let err = parse(json!({"model_type": "qwen3_5"})).unwrap_err();
        assert!(err.to_string().contains("text_config"), "{err}");
    }

    #[test]
    fn hf_json_round_trips_for_every_layout() {
        for (config, layout) in [
            (
                TargetConfig::tiny_default(),
                CheckpointLayout::Qwen3_5Multimodal,
            ),
            (TargetConfig::tiny_default(), CheckpointLayout::Qwen3_5Text),
        ] {
            let json = config.to_hf_json(layout, "float32");
            let (back, back_layout) = parse(json).unwrap();
            assert_eq!(back, config);
            assert_eq!(back_layout, layout);
        }
        let qwen3 = TargetConfig::Qwen3(Qwen3Config {
            vocab_size: 100,
            hidden_size: 16,
            intermediate_size: 32,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope_theta: 1e6,
            attention_bias: true,
            tie_word_embeddings: true,
            max_position_embeddings: 128,
        });
        let (back, _) =
            parse(qwen3.to_hf_json(CheckpointLayout::Qwen3CausalLm, "bfloat16")).unwrap();
        assert_eq!(back, qwen3);
    }

    #[test]
    fn tiny_default_has_both_layer_kinds() {
        let TargetConfig::Qwen3_5(c) = TargetConfig::tiny_default() else {
            panic!()
        };
        assert!(c.layer_types.contains(&Qwen3_5LayerKind::FullAttention));
        assert!(c.layer_types.contains(&Qwen3_5LayerKind::LinearAttention));
        assert_eq!(
            (c.hidden_size, c.vocab_size, c.num_hidden_layers),
            (128, 512, 6)
        );
    }
}
