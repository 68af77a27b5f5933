//! Issue 21 end to end: a run started from a Domino drafter in SpecForge's layout
//! (`drafter.init_from`) records the SHA-256 of the weights it loaded, trains, resumes from its
//! checkpoint without reading the directory again, refuses a resume under another value, and
//! exports back to SpecForge's layout bit-exactly in f32. A drafter of another width is
//! refused by `config validate` and by `start` naming the key, before the run dir records a
//! config. (The engine's `warm_start` tests hold the step-0 weights to the file's, bit for bit.)
use std::path::Path;

use dflash_engine::embedded;
use dflash_engine::files::hash::sha256_file;
use dflash_engine::model::drafter::{DominoConfig, Drafter, DrafterConfig, DrafterHead};
use dflash_engine::train::drafter_io::{load_hf, named_parameters, write_hf};
use dflash_engine::train::resume::read_checkpoint_drafter;
use dflash_shared::events::EventKind;
use tch::{nn::VarStore, Device, Kind};

use crate::support::binary::{checkpoint_steps, journal, run, start_for_steps, write_config};

/// The embedded default's drafter (a Domino head) with weights of its own seed, written as
/// SpecForge lays a `DominoDraftModel` out (`dflashd export`'s writer): `config.json` and an
/// f32 `model.safetensors`.
fn write_domino_drafter(dir: &Path, cfg: &DrafterConfig) {
    let _rng = dflash_engine::device::global_rng::seeded(7);
    let vs = VarStore::new(Device::Cpu);
    let _drafter = Drafter::new(&vs.root(), cfg);
    write_hf(dir, cfg, &named_parameters(&vs), Kind::Float).unwrap();
}

fn run_drafter() -> DrafterConfig {
    embedded::tiny_drafter_config(&embedded::tiny_target_config())
}

/// `dflashd start` on `config` in `run_dir` for `steps` steps: (exit code, stdout, stderr).
fn start(root: &Path, config: &Path, run_dir: &Path, steps: u64) -> (i32, String, String) {
    start_for_steps(
        root,
        run_dir,
        steps,
        &["--config", config.to_str().unwrap()],
    )
}

#[test]
fn a_run_starts_from_a_specforge_domino_drafter_resumes_and_exports_back() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let drafter_dir = root.join("specforge-domino");
    write_domino_drafter(&drafter_dir, &run_drafter());
    let weights_sha = sha256_file(&drafter_dir.join("model.safetensors"))
        .unwrap()
        .sha256;
    let config = root.join("run.toml");
    // Relative to the config file, as every path of a config is.
    write_config(&config, |c| {
        c.drafter.init_from = Some("specforge-domino".into())
    });
    let run_dir = root.join("run");

    let (code, out, err) = run(root, &["config", "validate", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");

    let (code, out, err) = start(root, &config, &run_dir, 2);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "  init:     drafter initialised from {}",
            drafter_dir.display()
        )) && out.contains(&format!("model.safetensors sha256 {weights_sha}")),
        "the start prints what it loaded:\n{out}"
    );
    let recorded = journal(&run_dir).into_iter().any(|e| {
        matches!(&e.kind, EventKind::Note { message }
            if message.starts_with("drafter initialised from")
                && message.contains(&weights_sha))
    });
    assert!(recorded, "the journal records the weights' SHA-256");
    assert_eq!(checkpoint_steps(&run_dir), [2]);

    // The resume continues from its checkpoint: the directory is not read (it is gone).
    std::fs::rename(&drafter_dir, root.join("moved-away")).unwrap();
    let (code, out, err) = start(root, &config, &run_dir, 1);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("resumed at step 2") && out.contains("not read: the run resumes from"),
        "{out}"
    );
    assert_eq!(checkpoint_steps(&run_dir), [2, 3]);

    // The key is locked: another value is refused before anything trains.
    write_config(&config, |c| c.drafter.init_from = Some("moved-away".into()));
    let (code, _, err) = start(root, &config, &run_dir, 1);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("drafter.init_from: \"specforge-domino\" → \"moved-away\"")
            && err.contains("Keep drafter.init_from = \"specforge-domino\""),
        "{err}"
    );
    assert_eq!(checkpoint_steps(&run_dir), [2, 3]);

    // Exported back, f32: SpecForge's layout, the checkpoint's weights bit for bit.
    let export = root.join("export");
    let (code, _, err) = run(
        root,
        &[
            "export",
            "--checkpoint",
            run_dir.to_str().unwrap(),
            "--out",
            export.to_str().unwrap(),
            "--dtype",
            "f32",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(export.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        json["architectures"],
        serde_json::json!(["DominoDraftModel"])
    );
    let loaded = load_hf(&export, Device::Cpu, Kind::Float).unwrap();
    assert_eq!(loaded.config, run_drafter());
    let (_, trained) =
        read_checkpoint_drafter(&run_dir.join("checkpoints/step-0000000003")).unwrap();
    let exported = named_parameters(&loaded.vs);
    assert_eq!(exported.len(), trained.len());
    for ((na, a), (nb, b)) in exported.iter().zip(&trained) {
        assert_eq!(na, nb);
        assert!(a.equal(b), "{na} changed in the export");
    }
}

#[test]
fn a_drafter_of_another_width_is_refused_by_validate_and_start_naming_the_key() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let mut narrow = run_drafter();
    let Some(&domino) = narrow.head.domino() else {
        panic!("the embedded default's head is Domino");
    };
    narrow.head = DrafterHead::Domino(DominoConfig {
        emb_dim: domino.emb_dim / 2,
        ..domino
    });
    write_domino_drafter(&root.join("narrow"), &narrow);
    let config = root.join("run.toml");
    write_config(&config, |c| c.drafter.init_from = Some("narrow".into()));
    let text = std::fs::read_to_string(&config).unwrap();
    let line = 1 + text.lines().position(|l| l.starts_with("emb_dim")).unwrap();

    let (code, _, err) = run(root, &["config", "validate", config.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "drafter.emb_dim (line {line}): expected {} (the drafter of drafter.init_from), \
             found {}",
            domino.emb_dim / 2,
            domino.emb_dim
        )),
        "{err}"
    );

    let run_dir = root.join("run");
    let (code, _, err) = start(root, &config, &run_dir, 1);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "drafter.emb_dim: the run has {}, the drafter has {}; set drafter.emb_dim = {}",
            domino.emb_dim,
            domino.emb_dim / 2,
            domino.emb_dim / 2
        )),
        "{err}"
    );
    // The refused start recorded no config: a corrected init_from starts the run afresh
    // rather than meeting the lock.
    assert!(!run_dir.join("config.effective.toml").exists());
    assert!(checkpoint_steps(&run_dir).is_empty());

    let (code, _, err) = {
        write_config(&config, |c| c.drafter.init_from = Some("missing".into()));
        run(root, &["config", "validate", config.to_str().unwrap()])
    };
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("drafter.init_from (line") && err.contains("is not a directory"),
        "{err}"
    );
}
