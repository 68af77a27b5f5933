//! The engine's reading of a validated run config (`dflash_shared::config::Config`): the
//! training hyper-parameters and the drafter architecture. The embedded default is the same
//! path applied to `configs/tiny-cpu.toml`, so its numbers live in one place.
use dflash_shared::config::{
    Config, DrafterHead as CfgHead, DrafterSection, LayerType as CfgLayerType,
    DEFAULT_CONV_GROUP_SIZE, DEFAULT_CONV_KERNEL_SIZE, DEFAULT_MARKOV_RANK, DEFAULT_SELECTOR_RANK,
    DEFAULT_SELECTOR_TOP_K,
};

use super::config::TrainConfig;
use crate::model::drafter::{
    Dflash2Config, DominoConfig, DrafterConfig, DrafterHead, DsparkConfig, LayerType,
};
use crate::model::target::TargetConfig;

/// `[training]`, `[run].seed`, γ and the held-out count of `[data]` for `n_samples` samples.
pub fn train_config(cfg: &Config, n_samples: usize) -> TrainConfig {
    TrainConfig {
        training: cfg.training.clone(),
        seed: cfg.run.seed,
        held_out: cfg.data.held_out_count(n_samples),
        gamma: Some(cfg.loss_decay_gamma()),
    }
}

/// `[drafter]` completed with what the target decides (feature width, vocabulary, depth).
pub fn drafter_config(d: &DrafterSection, target: &TargetConfig) -> DrafterConfig {
    DrafterConfig {
        hidden_size: d.hidden_size as i64,
        intermediate_size: d.intermediate_size as i64,
        num_hidden_layers: d.num_layers,
        num_attention_heads: d.num_attention_heads as i64,
        num_key_value_heads: d.num_key_value_heads as i64,
        head_dim: d.head_dim as i64,
        rms_norm_eps: d.rms_norm_eps,
        rope_theta: d.rope_theta,
        layer_types: d
            .layer_types
            .iter()
            .map(|t| match t {
                CfgLayerType::FullAttention => LayerType::Full,
                CfgLayerType::SlidingAttention => LayerType::Sliding,
            })
            .collect(),
        sliding_window: d.sliding_window.map(|w| w as i64),
        block_size: d.block_size as i64,
        mask_token_id: i64::from(d.mask_token_id),
        target_layer_ids: d.target_layer_ids.clone(),
        target_hidden_size: target.hidden_size(),
        vocab_size: target.vocab_size(),
        // The drafter serves beside the target: it never sees positions the target cannot.
        max_position_embeddings: target.max_position_embeddings(),
        num_target_layers: Some(target.num_layers()),
        initializer_range: 0.02,
        head: drafter_head(d),
    }
}

/// `drafter.head` with its Domino widths (the config validation has checked they are set;
/// a missing width becomes 0, which `DrafterConfig::validate` refuses).
fn drafter_head(d: &DrafterSection) -> DrafterHead {
    match d.head {
        CfgHead::Dflash => DrafterHead::Dflash,
        CfgHead::Domino => DrafterHead::Domino(DominoConfig {
            emb_dim: d.emb_dim.unwrap_or(0) as i64,
            gru_hidden_dim: d.gru_hidden_dim.unwrap_or(0) as i64,
            pure_draft_prefix_len: d.pure_draft_prefix_len.unwrap_or(0) as i64,
        }),
        CfgHead::Dspark => {
            let markov_rank = d.markov_rank.unwrap_or(DEFAULT_MARKOV_RANK) as i64;
            DrafterHead::Dspark(DsparkConfig {
                markov_rank,
                markov_head_type: d.markov_head_type.unwrap_or_default(),
                confidence_head: d.enable_confidence_head.unwrap_or(true),
                confidence_head_with_markov: d
                    .confidence_head_with_markov
                    .unwrap_or(markov_rank > 0 && d.enable_confidence_head != Some(false)),
            })
        }
        CfgHead::Dflash2 => DrafterHead::Dflash2(Dflash2Config {
            conv_kernel_size: d.conv_kernel_size.unwrap_or(DEFAULT_CONV_KERNEL_SIZE) as i64,
            conv_group_size: d.conv_group_size.unwrap_or(DEFAULT_CONV_GROUP_SIZE) as i64,
            selector_rank: d.selector_rank.unwrap_or(DEFAULT_SELECTOR_RANK) as i64,
            selector_top_k: d.selector_top_k.unwrap_or(DEFAULT_SELECTOR_TOP_K) as i64,
            output_multiplier: d.output_multiplier.unwrap_or(1.0),
            final_logit_softcapping: d.final_logit_softcapping,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_config_maps_onto_valid_engine_configs() {
        let cfg = Config::embedded_default();
        let train = train_config(&cfg, 900);
        assert_eq!(train.held_out, 48);
        assert_eq!(train.gamma, Some(4.0));
        assert_eq!(train.adamw().max_grad_norm, Some(1.0));
        assert_eq!(train.online_eval_every(), 50);
        assert_eq!(
            train.training.online_eval_prompts.as_deref(),
            Some("embedded")
        );
        assert_eq!(
            train.loss_objective(),
            crate::train::block_objective::LossObjective::Dflash,
            "the embedded default trains DFlash"
        );
        let drafter = drafter_config(&cfg.drafter, &TargetConfig::tiny_default());
        drafter.validate("embedded").unwrap();
        assert_eq!(
            drafter.layer_types,
            vec![LayerType::Sliding, LayerType::Full]
        );
        assert_eq!(drafter.feature_size(), 2 * 128);
    }

    #[test]
    fn a_domino_head_and_its_curriculum_map_onto_the_engine() {
        let mut cfg = Config::embedded_default();
        cfg.drafter.head = CfgHead::Domino;
        cfg.drafter.emb_dim = Some(16);
        cfg.drafter.gru_hidden_dim = Some(24);
        cfg.drafter.pure_draft_prefix_len = Some(1);
        cfg.training.lambda_base_start = 0.75;
        cfg.training.lambda_base_decay_ratio = 0.25;
        let drafter = drafter_config(&cfg.drafter, &TargetConfig::tiny_default());
        drafter.validate("domino").unwrap();
        assert_eq!(
            drafter.head,
            DrafterHead::Domino(DominoConfig {
                emb_dim: 16,
                gru_hidden_dim: 24,
                pure_draft_prefix_len: 1
            })
        );
        let train = train_config(&cfg, 900);
        assert_eq!(
            (
                train.training.lambda_base_start,
                train.training.lambda_base_decay_ratio
            ),
            (0.75, 0.25)
        );
    }

    #[test]
    fn a_dspark_head_takes_specforges_configured_defaults() {
        let mut cfg = Config::embedded_default();
        cfg.drafter.head = CfgHead::Dspark;
        cfg.drafter.emb_dim = None;
        cfg.drafter.gru_hidden_dim = None;
        cfg.drafter.pure_draft_prefix_len = None;
        let drafter = drafter_config(&cfg.drafter, &TargetConfig::tiny_default());
        drafter.validate("dspark").unwrap();
        assert_eq!(
            drafter.head,
            DrafterHead::Dspark(DsparkConfig {
                markov_rank: 256,
                markov_head_type: dflash_shared::config::MarkovHeadType::Vanilla,
                confidence_head: true,
                confidence_head_with_markov: true,
            })
        );
        // Without a Markov head the confidence head reads the hidden state alone.
        cfg.drafter.markov_rank = Some(0);
        let drafter = drafter_config(&cfg.drafter, &TargetConfig::tiny_default());
        drafter.validate("dspark without a Markov head").unwrap();
        let d = drafter.head.dspark().unwrap();
        assert!(!d.has_markov_head() && d.confidence_head && !d.confidence_head_with_markov);
    }

    #[test]
    fn paper_defaults_carry_over() {
        let mut cfg = Config::embedded_default();
        cfg.training = Default::default();
        cfg.drafter.block_size = 16;
        cfg.training.loss_decay_gamma = None;
        let train = train_config(&cfg, 100);
        assert_eq!(
            (
                train.training.lr,
                train.training.warmup_ratio,
                train.training.epochs,
                train.training.num_anchors
            ),
            (6e-4, 0.04, 6, 512)
        );
        assert_eq!(train.gamma, Some(7.0));
        assert_eq!(train.adamw(), crate::train::optim::AdamWConfig::default());
    }

    #[test]
    fn the_objective_its_alpha_and_its_normalization_carry_over() {
        let mut cfg = Config::embedded_default();
        cfg.training.objective = dflash_shared::config::Objective::Dpace;
        cfg.training.dpace_alpha = 0.25;
        cfg.training.dpace_normalization =
            dflash_shared::config::DpaceNormalization::TokensPerSequence;
        assert_eq!(
            train_config(&cfg, 100).loss_objective(),
            crate::train::block_objective::LossObjective::Dpace {
                alpha: 0.25,
                normalization: dflash_shared::config::DpaceNormalization::TokensPerSequence
            }
        );
    }

    #[test]
    fn the_tree_objectives_keys_carry_over_and_the_budget_defaults_to_the_serving_one() {
        use crate::train::tree_objective::{TreeLoss, TreeObjective};
        let mut cfg = Config::embedded_default();
        cfg.training.objective = dflash_shared::config::Objective::Tree;
        let tree = |cfg: &Config| match train_config(cfg, 100).loss_objective() {
            crate::train::block_objective::LossObjective::Tree(t) => t,
            other => panic!("{other:?}"),
        };
        assert_eq!(tree(&cfg), TreeObjective::default());
        assert_eq!(tree(&cfg).budget, 32);
        cfg.training.serve_tree_budget = 16;
        assert_eq!(
            tree(&cfg).budget,
            16,
            "unset, it follows the serving budget"
        );
        cfg.training.tree.budget = Some(8);
        cfg.training.tree.temperature = 0.5;
        cfg.training.tree.loss = TreeLoss::Expected;
        assert_eq!(
            tree(&cfg),
            TreeObjective {
                budget: 8,
                temperature: 0.5,
                loss: TreeLoss::Expected
            }
        );
    }
}
