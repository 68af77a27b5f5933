//! The drafter in the layout published for DFlash drafters: `config.json` (Qwen3 fields plus
//! `block_size`, `layer_types`, `dflash_config`) and `model.safetensors` with the spec §1.3 keys.
//! `dflashd export` writes it; `dflashd eval --drafter` and serving engines read it.
use crate::files::atomic_write::write_atomic;
use crate::model::weights::write_safetensors_atomic;
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::{nn::VarStore, Device, Kind, Tensor};

use super::error::TrainError;
use crate::model::drafter::{Drafter, DrafterConfig};

pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// The `dtype` a config names for weights of `kind`.
pub(crate) fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        _ => "float32",
    }
}

/// Writes `config.json` and `model.safetensors` into `dir` (created if needed), weights cast
/// to `dtype` ([`write_layout`]), the config being [`hf_json`]'s.
pub fn write_hf(
    dir: &Path,
    cfg: &DrafterConfig,
    weights: &[(String, Tensor)],
    dtype: Kind,
) -> Result<(), TrainError> {
    write_layout(dir, &hf_json(cfg, dtype)?, weights, dtype)
}

/// The published layout's `config.json` for weights of `dtype`; it always names
/// `num_target_layers`, which SGLang range-checks the tap layers against, and refuses a
/// drafter that does not know it.
pub fn hf_json(cfg: &DrafterConfig, dtype: Kind) -> Result<Value, TrainError> {
    if cfg.num_target_layers.is_none() {
        return Err(TrainError::Config {
            key: "num_target_layers".into(),
            detail: "is not known for this drafter; serving engines need it (SGLang checks the \
                     target layer ids against it). Give it with `dflashd export \
                     --num-target-layers N` (the target's number of layers)"
                .into(),
        });
    }
    let mut config = cfg.to_hf_json();
    if let Value::Object(map) = &mut config {
        map.insert(
            "torch_dtype".into(),
            Value::String(dtype_name(dtype).into()),
        );
        map.insert("dtype".into(), Value::String(dtype_name(dtype).into()));
    }
    Ok(config)
}

/// Writes `config` as `config.json` and `weights`, cast to `dtype`, as `model.safetensors`
/// into `dir` (created if needed), each under a temporary name renamed into place; the
/// safetensors header carries `{"format": "pt"}`, which older transformers require.
pub(crate) fn write_layout(
    dir: &Path,
    config: &Value,
    weights: &[(String, Tensor)],
    dtype: Kind,
) -> Result<(), TrainError> {
    fs::create_dir_all(dir).map_err(TrainError::io(dir))?;
    let weights_path = dir.join(WEIGHTS_FILE);
    let tensors: Vec<(String, Tensor)> = weights
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.detach()
                    .to_device(Device::Cpu)
                    .to_kind(dtype)
                    .contiguous(),
            )
        })
        .collect();
    let views: Vec<(String, &Tensor)> = tensors.iter().map(|(n, t)| (n.clone(), t)).collect();
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_atomic(&weights_path, &views, metadata)?;
    let config_path = dir.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(config).map_err(|e| TrainError::DrafterWeights {
        path: config_path.clone(),
        detail: format!("cannot serialize config: {e}"),
    })?;
    write_atomic(&config_path, (text + "\n").as_bytes()).map_err(TrainError::io(&config_path))
}

/// All tensors of a drafter checkpoint directory: `model.safetensors`, or the shards listed by
/// `model.safetensors.index.json`. Returns each tensor with the file it came from.
fn read_weights(dir: &Path) -> Result<HashMap<String, (Tensor, PathBuf)>, TrainError> {
    let single = dir.join(WEIGHTS_FILE);
    let index = dir.join(WEIGHTS_INDEX_FILE);
    let files: Vec<PathBuf> = if single.is_file() {
        vec![single]
    } else if index.is_file() {
        let text = fs::read_to_string(&index).map_err(TrainError::io(&index))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| TrainError::DrafterWeights {
            path: index.clone(),
            detail: format!("invalid JSON: {e}"),
        })?;
        let Some(map) = json.get("weight_map").and_then(Value::as_object) else {
            return Err(TrainError::DrafterWeights {
                path: index,
                detail: "missing object `weight_map`".into(),
            });
        };
        let mut shards: Vec<PathBuf> = map
            .values()
            .filter_map(Value::as_str)
            .map(|s| dir.join(s))
            .collect();
        shards.sort();
        shards.dedup();
        shards
    } else {
        return Err(TrainError::DrafterWeights {
            path: dir.to_path_buf(),
            detail: format!("no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE} in the drafter directory"),
        });
    };
    let mut out = HashMap::new();
    for file in files {
        let tensors = Tensor::read_safetensors(&file).map_err(|e| TrainError::DrafterWeights {
            path: file.clone(),
            detail: e.to_string(),
        })?;
        for (name, t) in tensors {
            out.insert(name, (t, file.clone()));
        }
    }
    Ok(out)
}

/// Copies named weights into a drafter's VarStore: every parameter must be present with its
/// exact shape. Tensors that are not parameters (e.g. a stored `rotary_emb.inv_freq`) are ignored.
pub fn assign_weights(
    vs: &VarStore,
    weights: &HashMap<String, (Tensor, PathBuf)>,
    source: &Path,
) -> Result<(), TrainError> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, var) in &vars {
        let Some((t, file)) = weights.get(name) else {
            return Err(TrainError::DrafterWeights {
                path: source.to_path_buf(),
                detail: format!("tensor `{name}` is missing"),
            });
        };
        if t.size() != var.size() {
            return Err(TrainError::DrafterWeights {
                path: file.clone(),
                detail: format!(
                    "tensor `{name}` has shape {:?}, expected {:?}",
                    t.size(),
                    var.size()
                ),
            });
        }
        if !matches!(
            t.kind(),
            Kind::Float | Kind::BFloat16 | Kind::Half | Kind::Double
        ) {
            return Err(TrainError::DrafterWeights {
                path: file.clone(),
                detail: format!(
                    "tensor `{name}` has dtype {:?}, expected a float type",
                    t.kind()
                ),
            });
        }
    }
    tch::no_grad(|| {
        for (name, var) in &vars {
            let mut var = var.shallow_clone();
            var.copy_(&weights[name].0.to_device(var.device()).to_kind(var.kind()));
        }
    });
    Ok(())
}

pub struct LoadedDrafter {
    pub config: DrafterConfig,
    pub vs: VarStore,
    pub drafter: Drafter,
}

/// Loads a drafter for inference (parameters frozen) on `device` in `kind`.
pub fn load_hf(dir: &Path, device: Device, kind: Kind) -> Result<LoadedDrafter, TrainError> {
    let config = DrafterConfig::from_hf_json(&dir.join(CONFIG_FILE))?;
    let mut vs = VarStore::new(device);
    // Construction draws a random init (then overwritten): under the generator's lock, so it
    // cannot land between another thread's seed and its draws.
    let drafter = {
        let _draws = crate::device::global_rng::lock();
        Drafter::new(&vs.root(), &config)
    };
    let weights = read_weights(dir)?;
    assign_weights(&vs, &weights, dir)?;
    if kind != Kind::Float {
        vs.set_kind(kind);
    }
    vs.freeze();
    Ok(LoadedDrafter {
        config,
        vs,
        drafter,
    })
}

/// The parameters of a VarStore, sorted by name (the HF keys).
pub fn named_parameters(vs: &VarStore) -> Vec<(String, Tensor)> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::tiny_drafter_config;
    use crate::model::drafter::{DominoConfig, DrafterHead};
    use crate::model::target::TargetConfig;

    fn domino_config() -> DrafterConfig {
        let mut cfg = tiny_drafter_config(&TargetConfig::tiny_default());
        cfg.head = DrafterHead::Domino(DominoConfig {
            emb_dim: 16,
            gru_hidden_dim: 24,
            pure_draft_prefix_len: 1,
        });
        cfg
    }

    fn files_tensors(dir: &Path) -> Vec<(String, Tensor)> {
        let mut list = Tensor::read_safetensors(dir.join(WEIGHTS_FILE)).unwrap();
        list.sort_by(|a, b| a.0.cmp(&b.0));
        list
    }

    #[test]
    fn a_domino_drafter_in_specforges_layout_loads_and_exports_back_bit_exact_in_f32() {
        let cfg = domino_config();
        let _rng = crate::device::global_rng::seeded(21);
        let vs = VarStore::new(Device::Cpu);
        let _drafter = Drafter::new(&vs.root(), &cfg);
        let root = tempfile::tempdir().unwrap();
        let (first, second) = (root.path().join("first"), root.path().join("second"));
        write_hf(&first, &cfg, &named_parameters(&vs), Kind::Float).unwrap();

        // SpecForge's names and PyTorch's GRU shapes: `[3·G, H]`, `[3·G, G]`.
        let written = files_tensors(&first);
        let shape = |name: &str| {
            written
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.size())
                .unwrap_or_else(|| panic!("{name} is not in the file"))
        };
        let h = cfg.hidden_size;
        assert_eq!(shape("prefix_gru.weight_ih_l0"), [72, h]);
        assert_eq!(shape("prefix_gru.weight_hh_l0"), [72, 24]);
        assert_eq!(shape("embed_proj.0.weight"), [16, h + 24]);
        assert_eq!(shape("embed_proj.2.weight"), [cfg.vocab_size, 16]);
        let json: Value =
            serde_json::from_str(&fs::read_to_string(first.join(CONFIG_FILE)).unwrap()).unwrap();
        assert_eq!(
            json["architectures"],
            serde_json::json!(["DominoDraftModel"])
        );
        assert_eq!(json["dflash_config"]["projector_type"], "domino");

        let loaded = load_hf(&first, Device::Cpu, Kind::Float).unwrap();
        assert_eq!(loaded.config, cfg);
        assert!(loaded.drafter.domino().is_some());
        write_hf(
            &second,
            &loaded.config,
            &named_parameters(&loaded.vs),
            Kind::Float,
        )
        .unwrap();
        let again = files_tensors(&second);
        assert_eq!(written.len(), again.len());
        for ((na, a), (nb, b)) in written.iter().zip(&again) {
            assert_eq!(na, nb);
            assert!(a.equal(b), "{na} changed in the round trip");
        }
        assert_eq!(
            fs::read(first.join(CONFIG_FILE)).unwrap(),
            fs::read(second.join(CONFIG_FILE)).unwrap()
        );
    }

    #[test]
    fn a_domino_config_without_the_heads_weights_is_refused_by_name() {
        let _rng = crate::device::global_rng::lock();
        let dflash = crate::embedded::tiny_dflash_drafter_config(&TargetConfig::tiny_default());
        let vs = VarStore::new(Device::Cpu);
        let _drafter = Drafter::new(&vs.root(), &dflash);
        let dir = tempfile::tempdir().unwrap();
        write_hf(dir.path(), &dflash, &named_parameters(&vs), Kind::Float).unwrap();
        let config = domino_config().to_hf_json();
        fs::write(
            dir.path().join(CONFIG_FILE),
            serde_json::to_string(&config).unwrap(),
        )
        .unwrap();
        let err = load_hf(dir.path(), Device::Cpu, Kind::Float)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("embed_proj.0.weight") && err.contains("missing"),
            "{err}"
        );
    }
}
