//! The config each tournament run trains with: the embedded default (`configs/tiny-cpu.toml`)
//! with only what the tournament varies changed, so every contender trains the same drafter
//! backbone on the same data from the same seed.
use serde::{Deserialize, Serialize};
use toml::{Table, Value};

use super::summary::Contender;
use dflash_shared::config::{Config, TreeLoss, EMBEDDED_DEFAULT_TOML};

/// Domino's widths at the embedded drafter's scale (hidden 128, vocabulary 512). SpecForge's
/// Qwen3.6-27B recipe uses `emb_dim` 256 and `gru_hidden_dim` 1024 at hidden 5120; here the GRU
/// is the hidden size and `embed_proj`'s middle half of it.
pub const DOMINO_EMB_DIM: i64 = 64;
pub const DOMINO_GRU_HIDDEN_DIM: i64 = 128;
/// SpecForge's Qwen3.6-27B recipe value: the slot after the anchor keeps the base logits.
pub const DOMINO_PURE_DRAFT_PREFIX_LEN: i64 = 1;
/// D-PACE's α: SpecForge's and the paper's default.
pub const DPACE_ALPHA: f64 = 0.5;
/// DSpark's Markov rank at the embedded drafter's scale: a quarter of SpecForge's 256 (its
/// configs' hidden sizes are tens of times this drafter's), as `configs/tiny-cpu-dspark.toml`.
pub const DSPARK_MARKOV_RANK: i64 = 64;
/// DFlash2's selector rank at this scale, likewise a quarter of SpecForge's 256; its top-K,
/// taps and group size are SpecForge's documented ones (16, 2, 16), as
/// `configs/tiny-cpu-dflash2.toml`.
pub const DFLASH2_SELECTOR_RANK: i64 = 64;

/// What one run varies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecipe {
    pub contender: Contender,
    pub seed: u64,
    /// `training.epochs`: the schedule (warmup, learning-rate decay, Domino's λ) spans these.
    pub epochs: u32,
    /// `data.train_file` and `data.format` when not the embedded set: regenerated chat data
    /// (with `target.model`, the directory holding the tokenizer it was rendered with).
    pub data: Option<RegeneratedData>,
    /// `training.tree.loss` of the tree contenders.
    #[serde(default)]
    pub tree_loss: TreeLoss,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegeneratedData {
    pub target_dir: String,
    pub train_file: String,
    pub prompts_file: String,
}

fn section<'a>(root: &'a mut Table, name: &str) -> &'a mut Table {
    root.entry(name)
        .or_insert_with(|| Value::Table(Table::new()))
        .as_table_mut()
        .expect("every section of the embedded default is a table")
}

/// DFlash's own head (the target's LM head alone): the embedded default's drafter head is
/// Domino, whose keys the config refuses beside any other head, so they go with it.
fn dflash_head(root: &mut Table) {
    let drafter = section(root, "drafter");
    drafter.insert("head".into(), Value::String("dflash".into()));
    for key in [
        "emb_dim",
        "gru_hidden_dim",
        "pure_draft_prefix_len",
        "shift_label",
    ] {
        drafter.remove(key);
    }
}

/// `[training.tree]` of a tree contender: the recipe's loss, the serving budget's default.
fn tree_table(recipe: &RunRecipe) -> Value {
    let mut tree = Table::new();
    tree.insert(
        "loss".into(),
        Value::String(recipe.tree_loss.as_str().into()),
    );
    Value::Table(tree)
}

/// The run's config as TOML text, checked by the same parser `dflashd start` uses.
pub fn run_config_toml(recipe: &RunRecipe) -> Result<String, String> {
    let mut root: Table = EMBEDDED_DEFAULT_TOML
        .parse()
        .map_err(|e| format!("the embedded default does not parse: {e}"))?;
    let run = section(&mut root, "run");
    run.insert(
        "name".into(),
        Value::String(format!(
            "objectives-{}-seed{}",
            recipe.contender.name(),
            recipe.seed
        )),
    );
    run.insert("seed".into(), Value::Integer(recipe.seed as i64));
    let training = section(&mut root, "training");
    training.insert("epochs".into(), Value::Integer(i64::from(recipe.epochs)));
    // The tournament decodes online once, after training, on every held-out prompt; the
    // in-training evaluation would only slow the step times it reports.
    training.insert("online_eval_every".into(), Value::Integer(0));
    // One checkpoint, the final one (saved when the run ends): the one evaluated.
    training.insert("checkpoint_every".into(), Value::Integer(1_000_000));
    let objective = match recipe.contender {
        Contender::Dpace => "dpace",
        Contender::Tree | Contender::DominoTree | Contender::Dflash2Tree => "tree",
        Contender::Dflash | Contender::Domino | Contender::Dspark | Contender::Dflash2 => "dflash",
    };
    training.insert("objective".into(), Value::String(objective.into()));
    match objective {
        "dpace" => {
            training.insert("dpace_alpha".into(), Value::Float(DPACE_ALPHA));
        }
        "tree" => {
            training.insert("tree".into(), tree_table(recipe));
        }
        _ => {}
    }
    match recipe.contender {
        Contender::Dflash | Contender::Dpace | Contender::Tree => dflash_head(&mut root),
        Contender::Dspark => {
            dflash_head(&mut root);
            let drafter = section(&mut root, "drafter");
            drafter.insert("head".into(), Value::String("dspark".into()));
            drafter.insert("markov_rank".into(), Value::Integer(DSPARK_MARKOV_RANK));
        }
        Contender::Dflash2 | Contender::Dflash2Tree => {
            dflash_head(&mut root);
            let drafter = section(&mut root, "drafter");
            drafter.insert("head".into(), Value::String("dflash2".into()));
            drafter.insert(
                "selector_rank".into(),
                Value::Integer(DFLASH2_SELECTOR_RANK),
            );
        }
        Contender::Domino | Contender::DominoTree => {
            let drafter = section(&mut root, "drafter");
            drafter.insert("head".into(), Value::String("domino".into()));
            drafter.insert("emb_dim".into(), Value::Integer(DOMINO_EMB_DIM));
            drafter.insert(
                "gru_hidden_dim".into(),
                Value::Integer(DOMINO_GRU_HIDDEN_DIM),
            );
            drafter.insert(
                "pure_draft_prefix_len".into(),
                Value::Integer(DOMINO_PURE_DRAFT_PREFIX_LEN),
            );
        }
    }
    if let Some(data) = &recipe.data {
        section(&mut root, "target").insert("model".into(), Value::String(data.target_dir.clone()));
        let d = section(&mut root, "data");
        d.insert("train_file".into(), Value::String(data.train_file.clone()));
        d.insert("format".into(), Value::String("chat".into()));
        section(&mut root, "training").insert(
            "online_eval_prompts".into(),
            Value::String(data.prompts_file.clone()),
        );
    }
    let text = toml::to_string(&root).map_err(|e| format!("cannot write the config: {e}"))?;
    Config::from_toml_str(&text, "objectives run config")
        .map_err(|e| format!("the tournament's run config is refused: {e}"))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::config::{DrafterHead, Objective};

    fn parsed(contender: Contender) -> Config {
        let recipe = RunRecipe {
            contender,
            seed: 7,
            epochs: 2,
            data: None,
            tree_loss: TreeLoss::Expected,
        };
        Config::from_toml_str(&run_config_toml(&recipe).unwrap(), "test").unwrap()
    }

    #[test]
    fn each_contender_changes_only_its_objective_or_head_of_the_embedded_default() {
        let base = Config::embedded_default();
        for c in Contender::ALL {
            let cfg = parsed(c);
            assert_eq!(cfg.run.seed, 7);
            assert_eq!(cfg.training.epochs, 2);
            assert_eq!(cfg.training.online_eval_every, Some(0));
            assert_eq!(cfg.drafter.hidden_size, base.drafter.hidden_size);
            assert_eq!(cfg.drafter.num_layers, base.drafter.num_layers);
            assert_eq!(cfg.training.num_anchors, base.training.num_anchors);
            assert_eq!(cfg.training.lr, base.training.lr);
        }
        assert_eq!(
            parsed(Contender::Dflash).training.objective,
            Objective::Dflash
        );
        assert_eq!(
            parsed(Contender::Dpace).training.objective,
            Objective::Dpace
        );
        let domino = parsed(Contender::Domino);
        assert_eq!(domino.training.objective, Objective::Dflash);
        assert_eq!(domino.drafter.head, DrafterHead::Domino);
        assert_eq!(domino.drafter.gru_hidden_dim, Some(128));
        assert_eq!(parsed(Contender::Dpace).drafter.head, DrafterHead::Dflash);
        for (c, head) in [
            (Contender::Tree, DrafterHead::Dflash),
            (Contender::DominoTree, DrafterHead::Domino),
            (Contender::Dflash2Tree, DrafterHead::Dflash2),
        ] {
            let cfg = parsed(c);
            assert_eq!(cfg.training.objective, Objective::Tree, "{c:?}");
            assert_eq!(cfg.training.tree.loss, TreeLoss::Expected, "{c:?}");
            assert_eq!(cfg.training.tree.budget, None, "{c:?}: the serving budget");
            assert_eq!(cfg.drafter.head, head, "{c:?}");
        }
        // The embedded default's head is Domino; the DFlash and D-PACE contenders train
        // DFlash's head with no Domino key left, and the Domino contender is the default's
        // own head with the widths the tournament measured.
        assert_eq!(base.drafter.head, DrafterHead::Domino);
        let dspark = parsed(Contender::Dspark).drafter;
        assert_eq!(dspark.head, DrafterHead::Dspark);
        assert_eq!(dspark.markov_rank, Some(DSPARK_MARKOV_RANK as usize));
        assert_eq!(
            parsed(Contender::Dflash2).training.objective,
            Objective::Dflash
        );
        for c in [Contender::Dflash2, Contender::Dflash2Tree] {
            let dflash2 = parsed(c).drafter;
            assert_eq!(dflash2.head, DrafterHead::Dflash2);
            assert_eq!(dflash2.selector_rank, Some(DFLASH2_SELECTOR_RANK as usize));
        }
        for c in [
            Contender::Dflash,
            Contender::Dpace,
            Contender::Dspark,
            Contender::Dflash2,
            Contender::Dflash2Tree,
        ] {
            let d = parsed(c).drafter;
            assert_eq!(
                (d.emb_dim, d.gru_hidden_dim, d.pure_draft_prefix_len),
                (None, None, None)
            );
        }
        assert_eq!(
            (
                domino.drafter.emb_dim,
                domino.drafter.gru_hidden_dim,
                domino.drafter.pure_draft_prefix_len
            ),
            (
                base.drafter.emb_dim,
                base.drafter.gru_hidden_dim,
                base.drafter.pure_draft_prefix_len
            )
        );
    }

    #[test]
    fn a_run_on_regenerated_data_reads_it_as_chat_through_the_targets_directory() {
        let recipe = RunRecipe {
            contender: Contender::Domino,
            seed: 3,
            epochs: 1,
            tree_loss: TreeLoss::Margin,
            data: Some(RegeneratedData {
                target_dir: "/data/tiny/target".into(),
                train_file: "/data/tiny/regenerated.jsonl".into(),
                prompts_file: "/data/tiny/prompts.jsonl".into(),
            }),
        };
        let cfg = Config::from_toml_str(&run_config_toml(&recipe).unwrap(), "test").unwrap();
        assert_eq!(cfg.target.model, "/data/tiny/target");
        assert_eq!(cfg.data.train_file, "/data/tiny/regenerated.jsonl");
        assert_eq!(cfg.data.format, dflash_shared::config::DataFormat::Chat);
        assert_eq!(
            cfg.training.online_eval_prompts.as_deref(),
            Some("/data/tiny/prompts.jsonl")
        );
        // Everything else is the embedded default's, as on the embedded set.
        let base = Config::embedded_default();
        assert_eq!(cfg.training.lr, base.training.lr);
        assert_eq!(cfg.training.batch_size, base.training.batch_size);
    }
}
