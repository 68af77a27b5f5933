//! Hugging Face checkpoint I/O for targets: which tensors a config needs, what they are called in
//! each layout, loading them shard by shard, and writing a model back in the HF layout.
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use super::config::{CheckpointLayout, TargetConfig};
use super::hf_config::read_hf_config;
use super::params::{Init, ParamSpec, Params, INIT_STD};
use super::{qwen3, qwen3_5};
use crate::model::error::ModelError;
use crate::model::weights::{
    write_bytes_atomic, write_safetensors_atomic, CheckpointIndex, TensorRequest, INDEX_FILE,
    SINGLE_FILE,
};

pub const LM_HEAD: &str = "lm_head.weight";
pub const EMBED_TOKENS: &str = "embed_tokens.weight";
pub const FINAL_NORM: &str = "norm.weight";
/// Shards written by `save_hf` stay below this size (HF-style `model-0000i-of-0000n`).
pub const DEFAULT_MAX_SHARD_BYTES: usize = 4 << 30;

/// How to load a checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub device: Device,
    /// `None` keeps the checkpoint's dtype (that of `embed_tokens`).
    pub dtype: Option<Kind>,
    /// Load only decoder layers `0..n` (feature extraction never needs layers past its last tap).
    pub max_layers: Option<usize>,
}

/// Everything in the model except decoder layers `layers..`.
pub fn param_specs(config: &TargetConfig, layers: usize) -> Vec<ParamSpec> {
    let (vocab, hidden) = (config.vocab_size(), config.hidden_size());
    let mut specs = vec![ParamSpec::new(
        EMBED_TOKENS,
        &[vocab, hidden],
        Init::Normal(INIT_STD),
    )];
    for layer in 0..layers {
        match config {
            TargetConfig::Qwen3_5(c) => qwen3_5::layer_specs(c, layer, &mut specs),
            TargetConfig::Qwen3(c) => qwen3::layer_specs(c, layer, &mut specs),
        }
    }
    let norm_init = match config {
        TargetConfig::Qwen3_5(_) => Init::ZeroCenteredNorm,
        TargetConfig::Qwen3(_) => Init::UnitNorm,
    };
    specs.push(ParamSpec::new(FINAL_NORM, &[hidden], norm_init));
    if !config.tie_word_embeddings() {
        specs.push(ParamSpec::new(
            LM_HEAD,
            &[vocab, hidden],
            Init::Normal(INIT_STD),
        ));
    }
    specs
}

/// The checkpoint name of a relative parameter name.
pub fn checkpoint_name(layout: CheckpointLayout, relative: &str) -> String {
    if relative == LM_HEAD {
        relative.to_string()
    } else {
        format!("{}{relative}", layout.body_prefix())
    }
}

pub struct Loaded {
    pub config: TargetConfig,
    pub layout: CheckpointLayout,
    pub raw_config: Value,
    pub params: Params,
    pub specs: Vec<ParamSpec>,
    pub kind: Kind,
    pub layers: usize,
}

pub fn load(dir: &Path, options: LoadOptions) -> Result<Loaded, ModelError> {
    let (config, layout, raw_config) = read_hf_config(dir)?;
    let index = CheckpointIndex::open(dir)?;
    let layers = options
        .max_layers
        .map_or(config.num_layers(), |n| n.min(config.num_layers()));
    let specs = param_specs(&config, layers);
    let kind = match options.dtype {
        Some(kind) => kind,
        None => index.stored_kind(&checkpoint_name(layout, EMBED_TOKENS))?,
    };
    let requests: Vec<TensorRequest> = specs
        .iter()
        .map(|s| TensorRequest {
            name: checkpoint_name(layout, &s.name),
            shape: s.shape.clone(),
        })
        .collect();
    let mut by_checkpoint_name = index.load(&requests, options.device, kind)?;
    let tensors: HashMap<String, Tensor> = specs
        .iter()
        .filter_map(|s| {
            by_checkpoint_name
                .remove(&checkpoint_name(layout, &s.name))
                .map(|t| (s.name.clone(), t))
        })
        .collect();
    Ok(Loaded {
        config,
        layout,
        raw_config,
        params: Params::new(tensors),
        specs,
        kind,
        layers,
    })
}

pub fn torch_dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        _ => "float32",
    }
}

/// What `save` needs from a model.
pub struct SaveRequest<'a> {
    pub config: &'a TargetConfig,
    pub layout: CheckpointLayout,
    /// The config.json the model was loaded from, if any (kept verbatim apart from the dtype).
    pub raw_config: Option<&'a Value>,
    pub kind: Kind,
    /// Relative names → tensors.
    pub named: &'a [(String, Tensor)],
    pub max_shard_bytes: usize,
}

/// Writes `config.json` and the weights (one `model.safetensors`, or shards plus
/// `model.safetensors.index.json` past `max_shard_bytes`). Every file is written atomically and
/// the index, which makes shards visible to loaders, is written after them.
pub fn save(dir: &Path, req: &SaveRequest<'_>) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let dtype = torch_dtype_name(req.kind);
    let config_json = match req.raw_config {
        Some(raw) => with_dtype(raw.clone(), dtype),
        None => req.config.to_hf_json(req.layout, dtype),
    };
    let text = serde_json::to_string_pretty(&config_json).map_err(|source| ModelError::Json {
        path: dir.join("config.json"),
        cause: source,
    })?;
    write_bytes_atomic(&dir.join("config.json"), format!("{text}\n").as_bytes())?;

    let named: Vec<(String, &Tensor)> = req
        .named
        .iter()
        .map(|(name, t)| (checkpoint_name(req.layout, name), t))
        .collect();
    let shards = split_into_shards(&named, req.max_shard_bytes);
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    if shards.len() <= 1 {
        write_safetensors_atomic(&dir.join(SINGLE_FILE), &named, metadata)?;
        // a stale index would make loaders ignore the file just written
        remove_if_present(&dir.join(INDEX_FILE))?;
        return Ok(());
    }
    let count = shards.len();
    let mut weight_map = BTreeMap::new();
    let mut total_size = 0usize;
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{count:05}.safetensors", i + 1);
        let tensors: Vec<(String, &Tensor)> = shard
            .iter()
            .map(|&j| (named[j].0.clone(), named[j].1))
            .collect();
        for (name, t) in &tensors {
            weight_map.insert(name.clone(), file.clone());
            total_size += byte_size(t);
        }
        write_safetensors_atomic(&dir.join(&file), &tensors, metadata.clone())?;
    }
    let index = json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
    let text = serde_json::to_string_pretty(&index).map_err(|source| ModelError::Json {
        path: dir.join(INDEX_FILE),
        cause: source,
    })?;
    write_bytes_atomic(&dir.join(INDEX_FILE), format!("{text}\n").as_bytes())?;
    remove_if_present(&dir.join(SINGLE_FILE))
}

fn remove_if_present(path: &Path) -> Result<(), ModelError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ModelError::io(path, e)),
        _ => Ok(()),
    }
}

fn byte_size(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

/// Greedy split in parameter order; a tensor larger than the limit gets a shard of its own.
fn split_into_shards(named: &[(String, &Tensor)], max_bytes: usize) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut current = 0usize;
    for (i, (_, t)) in named.iter().enumerate() {
        let size = byte_size(t);
        match shards.last_mut() {
            Some(last) if current + size <= max_bytes => {
                last.push(i);
                current += size;
            }
            _ => {
                shards.push(vec![i]);
                current = size;
            }
        }
    }
    shards
}

fn with_dtype(mut raw: Value, dtype: &str) -> Value {
    if let Some(map) = raw.as_object_mut() {
        map.remove("torch_dtype");
        map.insert("dtype".into(), json!(dtype));
        if let Some(Value::Object(text)) = map.get_mut("text_config") {
            text.remove("torch_dtype");
            text.insert("dtype".into(), json!(dtype));
        }
    }
    raw
}
