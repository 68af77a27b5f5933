//! Writing the published layout back (`dflashd export`).
use serde_json::{json, Value};

use crate::model::drafter::config::{DrafterConfig, LayerType};

impl DrafterConfig {
    /// The published DFlash layout (architectures `DFlashDraftModel`, model_type `qwen3`,
    /// `dflash_config`, ...; a Domino drafter `DominoDraftModel`, a DSpark drafter
    /// `DSparkDraftModel`, a DFlash2 drafter `DFlash2DraftModel`, each with its `dflash_config`
    /// keys as SpecForge writes them). No `auto_map`: it would point transformers'
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
        if let Some(d) = self.head.dflash2() {
            map.insert("architectures".into(), json!(["DFlash2DraftModel"]));
            let dflash = map
                .get_mut("dflash_config")
                .and_then(Value::as_object_mut)
                .expect("literal object");
            dflash.insert("block_size".into(), json!(self.block_size));
            dflash.insert("conv_kernel_size".into(), json!(d.conv_kernel_size));
            dflash.insert("conv_group_size".into(), json!(d.conv_group_size));
            dflash.insert("selector_rank".into(), json!(d.selector_rank));
            dflash.insert("selector_top_k".into(), json!(d.selector_top_k));
            dflash.insert("output_multiplier".into(), json!(d.output_multiplier));
            if let Some(cap) = d.final_logit_softcapping {
                dflash.insert("final_logit_softcapping".into(), json!(cap));
            }
        }
        if self.target_hidden_size != self.hidden_size {
            // Not read by serving engines (they assume fc input = n·hidden_size); kept so our
            // own loader can rebuild such a drafter.
            map.insert("target_hidden_size".into(), json!(self.target_hidden_size));
        }
        out
    }
}
