//! The drafter's head as a `config.json` names it: the architecture and
//! `dflash_config.projector_type`, and each head's own keys with the defaults of the code that
//! wrote them.
use serde_json::{json, Value};

use super::Reader;
use crate::model::drafter::config::{
    Dflash2Config, DominoConfig, DrafterError, DrafterHead, DsparkConfig, MarkovHeadType,
};

impl Reader<'_> {
    /// Whether `architectures` lists `name`.
    pub(super) fn names_architecture(&self, name: &str) -> bool {
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
    pub(super) fn head(&self) -> Result<DrafterHead, DrafterError> {
        if self.names_architecture("DFlash2DraftModel") {
            if let Some((key, v)) = self.dflash_value("projector_type") {
                return Err(self.unsupported(
                    &key,
                    v,
                    "DFlash2DraftModel has no projector: its selector reads the LM head's logits",
                ));
            }
            return self.dflash2_head();
        }
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

    /// DFlash2's convolution and selector (SpecForge's `DFlash2DraftModel`: the four sizes are
    /// required, as its `_build_decoder_layer` and `_init_draft_head` raise without them; the
    /// multiplier defaults to 1 and the cap to none, as its `transform_unary_logits`).
    fn dflash2_head(&self) -> Result<DrafterHead, DrafterError> {
        let required = |key: &str| -> Result<i64, DrafterError> {
            match self.dflash_value(key) {
                Some((found, v)) => self.as_int(&found, v),
                None => Err(self.missing(
                    &format!("dflash_config.{key}"),
                    "a DFlash2 drafter needs conv_kernel_size, conv_group_size, selector_rank \
                     and selector_top_k",
                )),
            }
        };
        let output_multiplier = match self.dflash_value("output_multiplier") {
            Some((key, v)) => self.as_float(&key, v)?,
            None => 1.0,
        };
        let final_logit_softcapping = match self.dflash_value("final_logit_softcapping") {
            Some((_, Value::Null)) | None => None,
            Some((key, v)) => Some(self.as_float(&key, v)?),
        };
        Ok(DrafterHead::Dflash2(Dflash2Config {
            conv_kernel_size: required("conv_kernel_size")?,
            conv_group_size: required("conv_group_size")?,
            selector_rank: required("selector_rank")?,
            selector_top_k: required("selector_top_k")?,
            output_multiplier,
            final_logit_softcapping,
        }))
    }
}
