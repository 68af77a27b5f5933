//! Issue 21: a run starts from an existing drafter (`drafter.init_from`,
//! `train/warm_start.rs`). A Domino drafter in SpecForge's layout initialises a trainer: its
//! step-0 weights are the file's, bit for bit in f32, on every drafter rank, and it trains on
//! from there. A DSpark run starts from a DFlash drafter's backbone with its own DSpark heads,
//! or from a DSpark drafter of its heads. A head, a width or a tensor that does not fit the
//! run's drafter is refused by name, and the trainer is left as it was.
use std::path::Path;

use dflash_engine::embedded;
use dflash_engine::files::hash::sha256_file;
use dflash_engine::model::drafter::{
    DominoConfig, Drafter, DrafterConfig, DrafterHead, DsparkConfig, MarkovHeadType,
};
use dflash_engine::train::drafter_io::{named_parameters, write_hf};
use dflash_engine::train::warm_start::DrafterSource;
use dflash_engine::train::{CollectLines, RunOptions, Trainer};
use tch::{nn::VarStore, Device, Kind, Tensor};

use crate::support::drafter::randomize;
use crate::support::topology::{config, copies, cpu_topology, tiny_samples, trainer};

/// The run's drafter: the embedded default's (a Domino head, emb 64, GRU 128, prefix 1).
fn run_drafter() -> DrafterConfig {
    embedded::tiny_drafter_config(&embedded::tiny_target_config())
}

/// Writes a drafter of `cfg` with random weights (norms away from 1) into `dir` as SpecForge
/// saves one: `model.safetensors` in f32 and a `config.json` naming SpecForge's recipe
/// architecture, `DFlashDraftModel` with `dflash_config.projector_type = "domino"`. `edit`
/// changes the tensors before they are written. Returns them as written.
fn write_specforge_drafter(
    dir: &Path,
    cfg: &DrafterConfig,
    seed: i64,
    edit: impl FnOnce(&mut Vec<(String, Tensor)>),
) -> Vec<(String, Tensor)> {
    let _rng = crate::support::drafter::seeded(seed);
    let vs = VarStore::new(Device::Cpu);
    let _drafter = Drafter::new(&vs.root(), cfg);
    randomize(&vs, 0.05);
    let mut weights = copies(named_parameters(&vs));
    edit(&mut weights);
    write_hf(dir, cfg, &weights, Kind::Float).unwrap();
    if cfg.head.domino().is_some() {
        let path = dir.join("config.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        json["architectures"] = serde_json::json!(["DFlashDraftModel"]);
        assert_eq!(json["dflash_config"]["projector_type"], "domino");
        std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    }
    weights
}

type Weights = Vec<(String, Tensor)>;

fn assert_same(a: &[(String, Tensor)], b: &[(String, Tensor)], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        assert_eq!(na, nb, "{what}");
        assert_eq!(ta.kind(), Kind::Float, "{what}: {na}");
        assert!(ta.equal(tb), "{what}: {na} differs");
    }
}

#[test]
fn a_specforge_domino_drafter_initialises_every_rank_bit_exactly_and_trains_on() {
    let dir = tempfile::tempdir().unwrap();
    let written = write_specforge_drafter(dir.path(), &run_drafter(), 21, |_| {});
    let source = DrafterSource::open(dir.path()).unwrap();
    assert!(source.misfits(&run_drafter()).is_empty());

    // Two drafter ranks on threads: rank 1 must start from the same weights as rank 0.
    let mut t: Trainer = trainer(config(4, 1), cpu_topology(1, 2));
    let seeded = copies(t.master_weights());
    let record = t.init_drafter_from(&source).unwrap();
    assert_eq!(record.head, "domino");
    assert_eq!(record.tensors, written.len());
    assert!(record.not_loaded.is_empty(), "{:?}", record.not_loaded);
    let file = dir.path().join("model.safetensors");
    assert_eq!(record.files.len(), 1);
    assert_eq!(record.files[0].file, file);
    assert_eq!(record.files[0].sha256, sha256_file(&file).unwrap().sha256);
    assert!(record.summary().contains(&record.files[0].sha256));

    let ranks = t.replica_weights().unwrap();
    assert_eq!(ranks.len(), 2);
    for (rank, weights) in ranks.iter().enumerate() {
        assert_same(weights, &written, &format!("rank {rank}'s step-0 masters"));
    }
    // On the CPU the parameters the forward reads are the fp32 masters themselves.
    assert_same(
        &named_parameters(t.var_store()),
        &written,
        "the forward's parameters",
    );
    assert!(
        seeded
            .iter()
            .zip(&written)
            .any(|((_, a), (_, b))| !a.equal(b)),
        "the file's weights are not the seeded init"
    );

    // It trains on from the file's weights, every rank alike.
    let options = RunOptions {
        max_steps: Some(1),
        checkpoint_root: None,
    };
    t.run(&options, &mut CollectLines::default()).unwrap();
    let after = t.replica_weights().unwrap();
    assert_same(&after[1], &after[0], "rank 1 after a step");
    assert!(
        after[0]
            .iter()
            .zip(&written)
            .any(|((_, a), (_, b))| !a.equal(b)),
        "a step changes the weights"
    );

    // A trainer that has stepped continues from its own weights: no second initialisation.
    let err = t.init_drafter_from(&source).unwrap_err().to_string();
    assert!(err.contains("before its first step"), "{err}");
}

#[test]
fn a_drafter_that_does_not_fit_is_refused_by_name_and_nothing_loads() {
    let root = tempfile::tempdir().unwrap();
    let run = run_drafter();
    let Some(&domino) = run.head.domino() else {
        panic!("the embedded default's head is Domino");
    };
    let mut t = trainer(config(4, 1), cpu_topology(1, 1));
    let before = copies(t.master_weights());
    let mut refusal = |name: &str, cfg: &DrafterConfig, edit: &dyn Fn(&mut Weights)| {
        let dir = root.path().join(name);
        write_specforge_drafter(&dir, cfg, 5, |w| edit(w));
        let source = DrafterSource::open(&dir).unwrap();
        let err = t.init_drafter_from(&source).unwrap_err().to_string();
        assert!(err.starts_with("drafter.init_from "), "{err}");
        err
    };

    let dflash = DrafterConfig {
        head: DrafterHead::Dflash,
        ..run.clone()
    };
    let err = refusal("dflash", &dflash, &|_| {});
    assert!(
        err.contains("drafter.head: the run has \"domino\", the drafter has \"dflash\"")
            && err.contains("set drafter.head = \"dflash\""),
        "{err}"
    );

    let wider = DrafterConfig {
        head: DrafterHead::Domino(DominoConfig {
            gru_hidden_dim: domino.gru_hidden_dim / 2,
            ..domino
        }),
        ..run.clone()
    };
    let err = refusal("narrow-gru", &wider, &|_| {});
    assert!(
        err.contains(&format!(
            "drafter.gru_hidden_dim: the run has {}, the drafter has {}",
            domino.gru_hidden_dim,
            domino.gru_hidden_dim / 2
        )),
        "{err}"
    );

    // The config fits, the tensors do not: one missing, one stray. The target's embedding
    // in the file is no problem: it is not loaded (the run keeps the target's).
    let err = refusal("tensors", &run, &|w| {
        w.retain(|(n, _)| n != "embed_proj.2.weight");
        w.push((
            "embed_tokens.weight".into(),
            Tensor::zeros([512, 128], (Kind::Float, Device::Cpu)),
        ));
        w.push((
            "prefix_gru.bias_ih_l0".into(),
            Tensor::zeros([384], (Kind::Float, Device::Cpu)),
        ));
    });
    assert!(err.contains("2 problems"), "{err}");
    assert!(
        err.contains("`embed_proj.2.weight`") && err.contains("is missing"),
        "{err}"
    );
    assert!(
        err.contains("`prefix_gru.bias_ih_l0`") && err.contains("not a parameter"),
        "{err}"
    );
    assert!(!err.contains("embed_tokens"), "{err}");

    let err = refusal("nan", &run, &|w| {
        let _ = w[0].1.get(0).fill_(f64::NAN);
    });
    assert!(
        err.contains(&format!("`{}` holds NaN", "embed_proj.0.weight")),
        "{err}"
    );

    assert_same(
        &t.master_weights(),
        &before,
        "the refused trainer's weights",
    );
}

#[test]
fn the_targets_own_tables_in_a_drafter_file_are_left_to_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_drafter();
    let written = write_specforge_drafter(dir.path(), &run, 9, |w| {
        w.push((
            "lm_head.weight".into(),
            Tensor::ones([512, 128], (Kind::Float, Device::Cpu)),
        ));
    });
    let mut t = trainer(config(4, 1), cpu_topology(1, 1));
    let record = t
        .init_drafter_from(&DrafterSource::open(dir.path()).unwrap())
        .unwrap();
    assert_eq!(record.not_loaded, ["lm_head.weight"]);
    let drafter_only: Vec<(String, Tensor)> = written
        .into_iter()
        .filter(|(n, _)| n != "lm_head.weight")
        .collect();
    assert_same(&t.master_weights(), &drafter_only, "step-0 masters");
    assert!(record
        .summary()
        .contains("not loaded (the target's own, or derived): lm_head.weight"));
}

/// The embedded default's drafter with a DSpark head: a gated Markov head of `markov_rank`,
/// the confidence head reading its embedding.
fn dspark_drafter(markov_rank: i64) -> DrafterConfig {
    DrafterConfig {
        head: DrafterHead::Dspark(DsparkConfig {
            markov_rank,
            markov_head_type: MarkovHeadType::Gated,
            confidence_head: true,
            confidence_head_with_markov: true,
        }),
        ..run_drafter()
    }
}

fn dspark_trainer(drafters: usize) -> Trainer {
    tch::set_num_threads(1);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    Trainer::with_topology(
        target,
        dspark_drafter(16),
        tiny_samples(),
        config(4, 1),
        cpu_topology(1, drafters),
    )
    .unwrap()
}

fn is_dspark_head(name: &str) -> bool {
    name.starts_with("markov_head.") || name.starts_with("confidence_head.")
}

#[test]
fn a_dspark_run_starts_from_a_dflash_drafters_backbone_with_fresh_dspark_heads() {
    let dir = tempfile::tempdir().unwrap();
    let dflash = DrafterConfig {
        head: DrafterHead::Dflash,
        ..dspark_drafter(16)
    };
    let written = write_specforge_drafter(dir.path(), &dflash, 35, |_| {});
    let source = DrafterSource::open(dir.path()).unwrap();
    assert!(source.misfits(&dspark_drafter(16)).is_empty());

    let mut t = dspark_trainer(2);
    let seeded = copies(t.master_weights());
    let record = t.init_drafter_from(&source).unwrap();
    assert_eq!(record.head, "dspark");
    assert_eq!(record.tensors, written.len());
    let heads: Vec<String> = seeded
        .iter()
        .map(|(n, _)| n.clone())
        .filter(|n| is_dspark_head(n))
        .collect();
    // Both heads of a gated Markov head with a confidence head: W₁, W₂, the gate and its
    // bias, the confidence projection and its bias.
    assert_eq!(heads.len(), 6, "{heads:?}");
    assert_eq!(record.fresh, heads);
    assert_eq!(record.tensors + record.fresh.len(), seeded.len());
    assert!(
        record
            .summary()
            .contains("freshly initialised (the drafter has no DSpark heads): confidence_head."),
        "{}",
        record.summary()
    );
    // The backbone is the file's, bit for bit; the heads are the run's own draw; every rank
    // holds the same.
    let expected: Vec<(String, Tensor)> = seeded
        .iter()
        .map(
            |(name, seeded)| match written.iter().find(|(n, _)| n == name) {
                Some((_, file)) => (name.clone(), file.shallow_clone()),
                None => {
                    assert!(is_dspark_head(name), "{name} is neither loaded nor a head");
                    (name.clone(), seeded.shallow_clone())
                }
            },
        )
        .collect();
    for (rank, weights) in t.replica_weights().unwrap().iter().enumerate() {
        assert_same(weights, &expected, &format!("rank {rank}'s step-0 masters"));
    }
    // It trains on, heads included.
    let options = RunOptions {
        max_steps: Some(1),
        checkpoint_root: None,
    };
    t.run(&options, &mut CollectLines::default()).unwrap();
    let after = t.replica_weights().unwrap();
    assert_same(&after[1], &after[0], "rank 1 after a step");
    let moved = |name: &str| {
        let find = |w: &[(String, Tensor)]| w.iter().find(|(n, _)| n == name).unwrap().1.copy();
        !find(&after[0]).equal(&find(&expected))
    };
    assert!(moved("markov_head.markov_w2.weight") && moved("fc.weight"));
}

#[test]
fn a_dspark_drafter_loads_whole_into_a_run_of_its_heads_and_is_refused_by_another() {
    let root = tempfile::tempdir().unwrap();
    let same = root.path().join("same");
    let written = write_specforge_drafter(&same, &dspark_drafter(16), 36, |_| {});
    let mut t = dspark_trainer(1);
    let record = t
        .init_drafter_from(&DrafterSource::open(&same).unwrap())
        .unwrap();
    assert!(record.fresh.is_empty(), "{:?}", record.fresh);
    assert_eq!(record.tensors, written.len());
    assert!(written.iter().any(|(n, _)| is_dspark_head(n)));
    assert_same(&t.master_weights(), &written, "step-0 masters");

    // Another rank: refused by the key, with the value to set, and nothing loads.
    let other = root.path().join("rank-8");
    write_specforge_drafter(&other, &dspark_drafter(8), 37, |_| {});
    let mut t = dspark_trainer(1);
    let before = copies(t.master_weights());
    let err = t
        .init_drafter_from(&DrafterSource::open(&other).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("drafter.init_from ")
            && err.contains("drafter.markov_rank: the run has 16, the drafter has 8; set drafter.markov_rank = 8"),
        "{err}"
    );
    assert_same(
        &t.master_weights(),
        &before,
        "the refused trainer's weights",
    );
}
